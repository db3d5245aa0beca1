/* The prefix cache: the same greedy ids with and without it on the three real models
 * (turns of one chat, a system prompt shared across sessions, a strict prefix of a cached
 * prompt, a prompt equal to a cached one; alone and batched), the exactness rule for
 * river-written pages, and the KV accounting under requests, cancels, evictions and
 * preemption. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/prefix_hash.h"
#include "engine/generate.h"
#include "engine/prefix_cache.h"
#include "engine/exitriver.h"
#include "kernels/cpu/cpu.h"
#include "offline/exitriver_build.h"
#include "tests/testutil.h"

#define MAX_IDS 1024
#define GEN_TOKENS 10

typedef struct out {
    int32_t ids[MAX_IDS];
    int n;
    int cached;
    gen_finish_t finish;
    int finished;
} out_t;

static void on_token(void *user, const gen_event_t *ev)
{
    out_t *o = user;
    if (ev->id >= 0 && o->n < MAX_IDS)
        o->ids[o->n++] = ev->id;
    o->cached = ev->cached_tokens;
    o->finish = ev->finish;
    if (ev->finish != GEN_RUNNING)
        o->finished = 1;
}

typedef struct prompt {
    int32_t ids[MAX_IDS];
    size_t n;
} prompt_t;

static uint64_t rng_state;

static int32_t rnd(int32_t below)
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (int32_t)((rng_state >> 33) % (uint64_t)below);
}

static void append_random(prompt_t *p, int n, int vocab)
{
    for (int i = 0; i < n && p->n < MAX_IDS; i++)
        p->ids[p->n++] = 3 + rnd(vocab - 3);
}

static void append(prompt_t *p, const int32_t *ids, size_t n)
{
    for (size_t i = 0; i < n && p->n < MAX_IDS; i++)
        p->ids[p->n++] = ids[i];
}

static gen_config_t base_config(int cache)
{
    return (gen_config_t){.max_rows = 24, .prefill_chunk = 16, .page_size = 4, .max_seqs = 4,
                          .prefix_cache = cache, .prefix_seed = 42};
}

/* Runs prompts [0, n) on g, `batch` at a time (submitted together), n outputs. */
static void run_prompts(gen_t *g, const prompt_t *p, int n, int batch, out_t *o)
{
    for (int i = 0; i < n; i += batch) {
        for (int j = i; j < n && j < i + batch; j++) {
            memset(&o[j], 0, sizeof o[j]);
            gen_request_t r = {.prompt = p[j].ids, .n_prompt = p[j].n,
                               .max_tokens = GEN_TOKENS, .ignore_eos = 1,
                               .on_token = on_token, .user = &o[j]};
            int seq;
            ck_assert_msg(gen_submit(g, &r, &seq) == 0, "%s", river_err_detail());
        }
        while (gen_active(g) > 0) {
            ck_assert_int_eq(gen_step(g), 0);
            gen_kv_acct_t a;
            ck_assert_msg(gen_check_kv(g, &a) == 0, "%s", river_err_detail());
        }
    }
}

typedef struct env {
    model_t *m;
    backend_t *be;
} env_t;

static void env_open(env_t *e, const char *path)
{
    ck_assert_msg(model_load(&e->m, test_model_path(path)) == 0, "%s", river_err_detail());
    ck_assert_int_eq(cpu_backend_new(&e->be, 2, CPU_SIMD_COUNT), 0);
}

static void env_close(env_t *e)
{
    cpu_backend_destroy(&e->be);
    model_destroy(&e->m);
}

#define N_WORK 9

/* A chat of three turns (each the last prompt, its completion and a new user turn), a
 * second session sharing the system prompt, a prompt equal to a cached one and strict
 * prefixes of cached prompts, one ending inside a page. Completions come from the
 * reference run: a turn carries what the model really answered. */
static void build_work(const env_t *e, gen_t *ref, prompt_t *p, out_t *ref_out)
{
    int V = e->m->cfg.vocab_size;
    int bos = e->m->cfg.bos_id >= 0 ? e->m->cfg.bos_id : 1;
    rng_state = 7;
    prompt_t sys = {.n = 0};
    sys.ids[sys.n++] = bos;
    append_random(&sys, 21, V);
    /* 0: turn 1 */
    p[0] = sys;
    append_random(&p[0], 9, V);
    run_prompts(ref, &p[0], 1, 1, &ref_out[0]);
    /* 1: turn 2 = turn 1 + answer + user */
    p[1] = p[0];
    append(&p[1], ref_out[0].ids, (size_t)ref_out[0].n);
    append_random(&p[1], 7, V);
    run_prompts(ref, &p[1], 1, 1, &ref_out[1]);
    /* 2: turn 3 */
    p[2] = p[1];
    append(&p[2], ref_out[1].ids, (size_t)ref_out[1].n);
    append_random(&p[2], 5, V);
    /* 3: another session, same system prompt */
    p[3] = sys;
    append_random(&p[3], 11, V);
    /* 4: equal to turn 2 */
    p[4] = p[1];
    /* 5: a strict prefix of turn 3 ending inside a page; 6: one ending on a page */
    p[5] = p[2];
    p[5].n = p[2].n - 6;
    if (p[5].n % 4 == 0)
        p[5].n--;
    p[6] = p[2];
    p[6].n = (p[2].n - 3) / 4 * 4;
    /* 7: equal to turn 1 again; 8: the system prompt alone (a prefix of every prompt) */
    p[7] = p[0];
    p[8] = sys;
    for (int i = 0; i < N_WORK; i++)
        run_prompts(ref, &p[i], 1, 1, &ref_out[i]);
}

static void check_same(const out_t *got, const out_t *want, int n, const char *what)
{
    for (int i = 0; i < n; i++) {
        ck_assert_msg(got[i].n == want[i].n, "%s: prompt %d gave %d ids, reference %d", what,
                      i, got[i].n, want[i].n);
        for (int t = 0; t < want[i].n; t++)
            ck_assert_msg(got[i].ids[t] == want[i].ids[t],
                          "%s: prompt %d token %d: %d with the cache, %d without", what, i, t,
                          got[i].ids[t], want[i].ids[t]);
    }
}

static const char *models[] = {
    TEST_DATA "/stories260K/stories260K.bin",
    TEST_DATA "/tinystories-656k",
    TEST_DATA "/kjv-12l",
    /* Quantized backbones (tests/testutil.h): the cache keeps their K/V the same way. */
    "q8:" TEST_DATA "/kjv-12l",
    "q4:" TEST_DATA "/kjv-12l",
    "q4:" TEST_DATA "/tinystories-656k",
};

/* Greedy ids do not change with the cache, alone or batched, on each real model; the
 * prompts that repeat cached ones do reuse them. */
START_TEST(test_identical_ids)
{
    env_t e;
    env_open(&e, models[_i]);
    gen_t *ref, *g;
    gen_config_t c0 = base_config(0);
    ck_assert_int_eq(gen_new(&ref, e.m, NULL, e.be, &c0), 0);
    static prompt_t p[N_WORK];
    static out_t want[N_WORK], got[N_WORK];
    build_work(&e, ref, p, want);
    gen_destroy(&ref);

    /* Alone, in order: each turn finds the last one in the cache. */
    gen_config_t c1 = base_config(1);
    ck_assert_int_eq(gen_new(&g, e.m, NULL, e.be, &c1), 0);
    run_prompts(g, p, N_WORK, 1, got);
    check_same(got, want, N_WORK, models[_i]);
    ck_assert_int_eq(got[0].cached, 0);
    /* Turn 2 holds turn 1 and its answer: all but the last (partial) written page. */
    ck_assert_int_ge(got[1].cached, (int)(p[0].n + GEN_TOKENS - 1) / 4 * 4 - 4);
    ck_assert_int_ge(got[2].cached, (int)(p[1].n + GEN_TOKENS - 1) / 4 * 4 - 4);
    ck_assert_int_ge(got[3].cached, 20); /* the system prompt, page-aligned */
    ck_assert_int_eq(got[4].cached, (int)p[4].n - 1); /* equal: all but the last token */
    ck_assert_int_eq(got[5].cached, (int)p[5].n - 1); /* strict prefix: likewise */
    ck_assert_int_eq(got[6].cached, (int)p[6].n - 1);
    ck_assert_int_eq(got[7].cached, (int)p[7].n - 1);
    ck_assert_int_eq(got[8].cached, (int)p[8].n - 1);
    gen_stats_t st;
    gen_get_stats(g, &st);
    ck_assert_int_gt((int)st.prefix_hit_tokens, 0);
    ck_assert_int_gt(st.prefix_cache_pages, 0);
    gen_destroy(&g);

    /* Batched: the same prompts three at a time, on a fresh cache and then a warm one. */
    ck_assert_int_eq(gen_new(&g, e.m, NULL, e.be, &c1), 0);
    run_prompts(g, p, N_WORK, 3, got);
    check_same(got, want, N_WORK, "batched, cold");
    run_prompts(g, p, N_WORK, 4, got);
    check_same(got, want, N_WORK, "batched, warm");
    for (int i = 0; i < N_WORK; i++)
        ck_assert_int_eq(got[i].cached, (int)p[i].n - 1);
    gen_kv_acct_t a;
    ck_assert_msg(gen_check_kv(g, &a) == 0, "%s", river_err_detail());
    ck_assert_int_eq(a.in_use, 0);
    ck_assert_int_eq(a.free + a.cached, a.total);
    gen_destroy(&g);
    env_close(&e);
}
END_TEST

/* The exactness rule on tinystories-656k with a 4-bit river and the fixed rule (every row exits
 * at layer 1, so every slot past it is river K/V): a policy-none request after a lossy one
 * with the same prefix gets the plain backbone's ids and reuses nothing; after an exact
 * one it reuses the pages. A lossy request may reuse the exact pages. */
START_TEST(test_exact_after_lossy)
{
    env_t e;
    env_open(&e, TEST_DATA "/tinystories-656k");
    char river_path[512];
    snprintf(river_path, sizeof river_path, "%s/prefix-river-q4.safetensors", test_tmpdir());
    exitriver_build_opts_t o = exitriver_build_opts_default();
    o.quant.bits = 4;
    o.quant.method = QUANT_RTN;
    o.start_layer = 1;
    ck_assert_msg(exitriver_build(e.m, river_path, &o, NULL) == 0, "%s", river_err_detail());
    exitriver_t *river;
    ck_assert_msg(exitriver_load(&river, e.m, river_path) == 0, "%s", river_err_detail());
    const layer_weights_t *layers[64] = {0};
    for (int l = 0; l < e.m->cfg.n_layers; l++)
        layers[l] = exitriver_layer(river, l);
    exit_config_t ex = {0};
    ex.policy.rule = EXIT_RULE_FIXED;
    ex.policy.exit_layer = 1;
    ex.policy.kv = EXIT_KV_RIVER;
    ex.river = layers;
    ex.river_start = exitriver_start_layer(river);

    rng_state = 11;
    prompt_t q = {.n = 0};
    q.ids[q.n++] = e.m->cfg.bos_id >= 0 ? e.m->cfg.bos_id : 1;
    append_random(&q, 30, e.m->cfg.vocab_size);

    gen_t *ref, *g;
    gen_config_t c0 = base_config(0), c1 = base_config(1);
    out_t want, lossy_alone, got;
    ck_assert_int_eq(gen_new(&ref, e.m, NULL, e.be, &c0), 0);
    run_prompts(ref, &q, 1, 1, &want);
    ck_assert_int_eq(gen_set_exit(ref, &ex), 0);
    run_prompts(ref, &q, 1, 1, &lossy_alone);
    gen_destroy(&ref);
    /* The river must really change the ids, or the rule below proves nothing. */
    int differ = 0;
    for (int t = 0; t < want.n; t++)
        differ |= want.ids[t] != lossy_alone.ids[t];
    ck_assert_msg(differ, "the river from layer 1 gave the backbone's ids");

    ck_assert_int_eq(gen_new(&g, e.m, NULL, e.be, &c1), 0);
    ck_assert_int_eq(gen_set_exit(g, &ex), 0);
    exit_row_t off = {.off = 1};
    /* Lossy first. */
    run_prompts(g, &q, 1, 1, &got);
    check_same(&got, &lossy_alone, 1, "lossy");
    gen_stats_t st;
    gen_get_stats(g, &st);
    ck_assert_int_gt(st.prefix_cache_pages, 0);
    /* Then exact: nothing reused, the backbone's ids. */
    memset(&got, 0, sizeof got);
    gen_request_t r = {.prompt = q.ids, .n_prompt = q.n, .max_tokens = GEN_TOKENS,
                       .ignore_eos = 1, .exit = &off, .on_token = on_token, .user = &got};
    int seq;
    ck_assert_int_eq(gen_submit(g, &r, &seq), 0);
    ck_assert_int_eq(gen_run_all(g), 0);
    check_same(&got, &want, 1, "exact after lossy");
    ck_assert_int_eq(got.cached, 0);
    /* Exact again: it reuses the pages the exact request wrote. */
    memset(&got, 0, sizeof got);
    ck_assert_int_eq(gen_submit(g, &r, &seq), 0);
    ck_assert_int_eq(gen_run_all(g), 0);
    check_same(&got, &want, 1, "exact after exact");
    ck_assert_int_eq(got.cached, (int)q.n - 1);
    /* A lossy request reuses a prefix too (either kind). */
    out_t l2;
    run_prompts(g, &q, 1, 1, &l2);
    ck_assert_int_eq(l2.cached, (int)q.n - 1);
    gen_kv_acct_t a;
    ck_assert_msg(gen_check_kv(g, &a) == 0, "%s", river_err_detail());
    gen_destroy(&g);
    exitriver_destroy(&river);
    remove(river_path);
    env_close(&e);
}
END_TEST

/* Requests with shared prefixes, cancels and a pool too small for all of them: after every
 * step free + cached + in use == the pool and every reference count matches the page
 * tables (gen_check_kv); the cache gives its pages back before anything is preempted; the
 * completions that ran to the end are the reference's. */
START_TEST(test_accounting)
{
    env_t e;
    env_open(&e, TEST_DATA "/tinystories-656k");
    enum { N = 12 };
    static prompt_t p[N];
    static out_t want[N], got[N];
    rng_state = 3;
    prompt_t sys = {.n = 0};
    sys.ids[sys.n++] = 1;
    append_random(&sys, 13, e.m->cfg.vocab_size);
    for (int i = 0; i < N; i++) {
        p[i] = i % 3 ? sys : (prompt_t){.ids = {1}, .n = 1};
        append_random(&p[i], 3 + i, e.m->cfg.vocab_size);
    }
    gen_t *ref, *g;
    gen_config_t c0 = base_config(0);
    ck_assert_int_eq(gen_new(&ref, e.m, NULL, e.be, &c0), 0);
    run_prompts(ref, p, N, 1, want);
    gen_destroy(&ref);

    /* 20 pages of 4: two sequences of ~30 positions fill it. */
    gen_config_t c = base_config(1);
    c.n_pages = 20;
    c.preempt = 1;
    c.max_seqs = 3;
    ck_assert_int_eq(gen_new(&g, e.m, NULL, e.be, &c), 0);
    /* Sequentially first: the cache fills the pool and must make room by eviction only. */
    run_prompts(g, p, N, 1, got);
    check_same(got, want, N, "sequential");
    gen_stats_t st;
    gen_get_stats(g, &st);
    ck_assert_int_eq((int)st.preemptions, 0);
    ck_assert_int_gt((int)st.prefix_evictions, 0);
    /* Then three at a time, cancelling one of each batch part way. */
    for (int i = 0; i < N; i += 3) {
        int seqs[3];
        for (int j = 0; j < 3; j++) {
            memset(&got[i + j], 0, sizeof got[i + j]);
            gen_request_t r = {.prompt = p[i + j].ids, .n_prompt = p[i + j].n,
                               .max_tokens = GEN_TOKENS, .ignore_eos = 1,
                               .on_token = on_token, .user = &got[i + j]};
            ck_assert_int_eq(gen_submit(g, &r, &seqs[j]), 0);
        }
        for (int step = 0; gen_active(g) > 0; step++) {
            if (step == 4 + i % 5 && !got[i + 1].finished)
                ck_assert_int_eq(gen_cancel(g, seqs[1]), 0);
            ck_assert_int_eq(gen_step(g), 0);
            gen_kv_acct_t a;
            ck_assert_msg(gen_check_kv(g, &a) == 0, "%s", river_err_detail());
            ck_assert_int_eq(a.free + a.cached + a.in_use, a.total);
        }
        for (int j = 0; j < 3; j++)
            if (got[i + j].finish == GEN_FINISH_LENGTH)
                check_same(&got[i + j], &want[i + j], 1, "batched with cancels");
            else
                ck_assert_int_eq(got[i + j].finish, GEN_FINISH_CANCEL);
    }
    gen_kv_acct_t a;
    ck_assert_msg(gen_check_kv(g, &a) == 0, "%s", river_err_detail());
    ck_assert_int_eq(a.in_use, 0);
    ck_assert_int_eq(a.free + a.cached, a.total);
    gen_destroy(&g);

    /* A page budget bounds the cache. */
    c.prefix_cache_pages = 5;
    ck_assert_int_eq(gen_new(&g, e.m, NULL, e.be, &c), 0);
    run_prompts(g, p, N, 1, got);
    check_same(got, want, N, "budget");
    gen_get_stats(g, &st);
    ck_assert_int_le(st.prefix_cache_pages, 5);
    ck_assert_int_gt(st.prefix_cache_pages, 0);
    gen_destroy(&g);
    env_close(&e);
}
END_TEST

/* The chain riverd computes: deterministic, keyed, salted, each name covering all before
 * it, 128 bits. */
START_TEST(test_hash_chain)
{
    int32_t a[12] = {1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15};
    int32_t b[12] = {1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 16};
    prefix_name_t ha[3], hb[3], hs[3], hk[3], ht[3];
    uint64_t s1 = prefix_hash_seed("abc", NULL), s2 = prefix_hash_seed("abc", "def");
    ck_assert(s1 != s2);
    prefix_key_t k1 = {1, 2}, k2 = {1, 3};
    prefix_name_t r1 = prefix_hash_root(&k1, s1, NULL, 0);
    ck_assert_uint_eq(prefix_hash_chain(&k1, r1, a, 12, 4, ha, 3), 3);
    ck_assert_uint_eq(prefix_hash_chain(&k1, r1, b, 12, 4, hb, 3), 3);
    ck_assert_uint_eq(prefix_hash_chain(&k1, prefix_hash_root(&k1, s2, NULL, 0), a, 12, 4, hs,
                                        3), 3);
    ck_assert_uint_eq(prefix_hash_chain(&k2, prefix_hash_root(&k2, s1, NULL, 0), a, 12, 4, hk,
                                        3), 3);
    ck_assert_uint_eq(prefix_hash_chain(&k1, prefix_hash_root(&k1, s1, "tenant-b", 8), a, 12,
                                        4, ht, 3), 3);
    ck_assert(prefix_name_eq(ha[0], hb[0]) && prefix_name_eq(ha[1], hb[1]) &&
              !prefix_name_eq(ha[2], hb[2]));
    ck_assert(ha[0].lo != hs[0].lo && ha[0].hi != hs[0].hi); /* another seed */
    ck_assert(ha[0].lo != hk[0].lo && ha[0].hi != hk[0].hi); /* another key */
    ck_assert(ha[0].lo != ht[0].lo && ha[0].hi != ht[0].hi); /* another salt */
    /* The salt's length is part of the root: "a" and "a\0" differ. */
    ck_assert(!prefix_name_eq(prefix_hash_root(&k1, s1, "a", 1), prefix_hash_root(&k1, s1, "a", 2)));
    ck_assert_uint_eq(prefix_hash_chain(&k1, r1, a, 11, 4, hb, 3), 2);
    ck_assert_uint_eq(prefix_hash_chain(&k1, r1, a, 12, 4, hb, 1), 1);
    uint8_t kb[PREFIX_KEY_BYTES];
    prefix_key_t back;
    prefix_key_to_bytes(&k2, kb);
    ck_assert_int_eq(prefix_key_from_bytes(&back, kb, sizeof kb), 0);
    ck_assert(back.k0 == k2.k0 && back.k1 == k2.k1);
    ck_assert_int_eq(prefix_key_from_bytes(&back, kb, 8), RIVER_EFORMAT);
}
END_TEST

/* Names that collide whenever two pages sit at the same depth, whatever their tokens or
 * their parents: what an attacker who could compute the hash would construct. */
static prefix_name_t colliding_name(const prefix_key_t *key, prefix_name_t parent,
                                    const int32_t *ids, size_t n)
{
    (void)key, (void)ids, (void)n;
    return (prefix_name_t){parent.lo + 1, parent.hi};
}

/* Publishes ids (whole pages) as one sequence of salt `salt` and releases it. */
static void publish_seq(prefix_cache_t *pc, kv_pool_t *kv, const int32_t *ids, size_t n,
                        const char *salt)
{
    kv_seq_t seq;
    prefix_seq_t ps;
    kv_seq_init(&seq);
    prefix_seq_init(&ps, pc);
    prefix_seq_set_salt(&ps, pc, salt, strlen(salt));
    for (size_t i = 0; i < n / 4; i++) {
        int32_t page;
        ck_assert_int_eq(kv_pool_alloc_page(kv, &page), 0);
        ck_assert_int_eq(kv_seq_push(&seq, page), 0);
    }
    prefix_cache_publish(pc, &seq, &ps, ids, n);
    prefix_cache_release(pc, &seq, &ps);
    prefix_seq_free(&ps);
}

/* Tokens the cache would hand a sequence of salt `salt` starting with ids. */
static size_t lookup(prefix_cache_t *pc, const int32_t *ids, size_t n, const char *salt)
{
    kv_seq_t seq;
    prefix_seq_t ps;
    kv_seq_init(&seq);
    prefix_seq_init(&ps, pc);
    prefix_seq_set_salt(&ps, pc, salt, strlen(salt));
    size_t hit = 0;
    ck_assert_int_eq(prefix_cache_acquire(pc, &seq, &ps, ids, n, n - 1, 1, &hit), 0);
    prefix_cache_release(pc, &seq, &ps);
    prefix_seq_free(&ps);
    return hit;
}

/* A hit is verified against the whole prefix, not the parent's name: with names that
 * collide at every depth, B0 + A1 (B0 cached by one sequence, A0 A1 by another) must not
 * take A1's page, whose K/V were computed after A0; a salt keeps another partition out
 * even of its own tokens. */
START_TEST(test_collision_is_a_miss)
{
    backend_t *be;
    kv_pool_t *kv;
    prefix_cache_t *pc;
    ck_assert_int_eq(cpu_backend_new(&be, 1, CPU_SIMD_COUNT), 0);
    ck_assert_int_eq(kv_pool_new(&kv, be, 1, 4, DTYPE_F32, 4, 16), 0);
    prefix_cache_config_t cfg = {.seed = 42, .key = {7, 9}, .name_page = colliding_name};
    ck_assert_int_eq(prefix_cache_new(&pc, kv, &cfg), 0);
    const int32_t a[9] = {1, 10, 11, 12, 20, 21, 22, 23, 5};
    const int32_t b[9] = {1, 30, 31, 32, 20, 21, 22, 23, 5}; /* B0 + A1 */
    publish_seq(pc, kv, a, 8, "t1");
    publish_seq(pc, kv, b, 4, "t1");
    ck_assert_int_eq(prefix_cache_pages(pc), 3);
    ck_assert_uint_eq(lookup(pc, a, 9, "t1"), 8);     /* the control: a real hit */
    ck_assert_uint_eq(lookup(pc, b, 9, "t1"), 4);     /* B0 only: A1 follows A0 */
    ck_assert_uint_eq(lookup(pc, a, 9, "t2"), 0);     /* another tenant */
    ck_assert_uint_eq(lookup(pc, a, 9, ""), 0);
    /* A page of a parent that was evicted and whose slot was cached again is not found
     * through that slot. */
    ck_assert_int_eq(prefix_cache_evict(pc, 16), 3);
    publish_seq(pc, kv, b, 8, "t1");
    ck_assert_uint_eq(lookup(pc, b, 9, "t1"), 8);
    ck_assert_uint_eq(lookup(pc, a, 9, "t1"), 1); /* the first token, part of page B0 */
    int priv = -1;
    ck_assert_int_eq(prefix_cache_check(pc, NULL, 0, &priv), 0);
    ck_assert_int_eq(priv, 0);
    prefix_cache_destroy(&pc);
    kv_pool_destroy(&kv);
    cpu_backend_destroy(&be);
}
END_TEST

static Suite *prefix_cache_suite(void)
{
    Suite *s = suite_create("prefix_cache");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_hash_chain);
    tcase_add_test(tc, test_collision_is_a_miss);
    tcase_add_loop_test(tc, test_identical_ids, 0, (int)(sizeof models / sizeof models[0]));
    tcase_add_test(tc, test_exact_after_lossy);
    tcase_add_test(tc, test_accounting);
    suite_add_tcase(s, tc);
    return s;
}

RIVER_TEST_MAIN(prefix_cache_suite)
