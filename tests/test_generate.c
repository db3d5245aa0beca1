/* The generator: a sequence batched with others gives the same tokens as alone, stop
 * strings, EOS, cancel, streaming text, limits. */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "engine/generate.h"
#include "kernels/cpu/cpu.h"
#include "tests/testutil.h"

typedef struct out {
    int32_t ids[512];
    size_t n;
    char text[8192];
    size_t n_text;
    gen_finish_t finish;
    int calls_after_finish;
    int finished;
    size_t text_at[512]; /* n_text after each token */
    int index_ok;        /* every event's index was the token's position */
} out_t;

static void on_token(void *user, const gen_event_t *ev)
{
    out_t *o = user;
    int32_t id = ev->id;
    const char *text = ev->text;
    size_t len = ev->len;
    gen_finish_t finish = ev->finish;
    if (o->finished)
        o->calls_after_finish++;
    if (id >= 0 && o->n < 512)
        o->ids[o->n++] = id;
    if (o->n_text + len < sizeof o->text) {
        memcpy(o->text + o->n_text, text, len);
        o->n_text += len;
        o->text[o->n_text] = '\0';
    }
    if (id >= 0 && o->n <= 512)
        o->text_at[o->n - 1] = o->n_text;
    o->finish = finish;
    if (finish != GEN_RUNNING)
        o->finished = 1;
}

typedef struct env {
    model_t *m;
    tokenizer_t *tok;
    backend_t *be;
} env_t;

static void env_open(env_t *e, const char *dir, int threads)
{
    char tp[256];
    snprintf(tp, sizeof tp, "%s/tokenizer.json", dir);
    ck_assert_msg(model_load(&e->m, dir) == 0, "%s", river_err_detail());
    ck_assert_msg(tokenizer_load(&e->tok, tp, 0) == 0, "%s", river_err_detail());
    test_backend_open(&e->be, threads, CPU_SIMD_COUNT, e->m);
}

static void env_close(env_t *e)
{
    backend_destroy(&e->be);
    tokenizer_destroy(&e->tok);
    model_destroy(&e->m);
}

static int32_t *encode(env_t *e, const char *text, size_t *n)
{
    int32_t *ids;
    ck_assert_int_eq(tokenizer_encode(e->tok, text, strlen(text), 1, &ids, n), 0);
    return ids;
}

static const char *prompts[] = {
    "In the beginning",
    "And the LORD spake unto Moses, saying, Speak unto the children of Israel",
    "Blessed",
    "The wise man said that a fool and his money are soon parted, and",
};
#define N_PROMPTS 4

static void run_alone(env_t *e, int i, int max_tokens, out_t *o)
{
    gen_t *g;
    gen_config_t c = {.max_rows = 32, .prefill_chunk = 32, .page_size = 16, .max_seqs = 1};
    ck_assert_int_eq(gen_new(&g, e->m, e->tok, e->be, &c), 0);
    size_t n;
    int32_t *ids = encode(e, prompts[i], &n);
    gen_request_t r = {.prompt = ids, .n_prompt = n, .max_tokens = max_tokens,
                       .ignore_eos = 1, .on_token = on_token, .user = o};
    int seq;
    ck_assert_int_eq(gen_submit(g, &r, &seq), 0);
    ck_assert_int_eq(gen_run_all(g), 0);
    free(ids);
    gen_destroy(&g);
}

/* Four sequences of different lengths share batches (small prefill chunks, one joining
 * late, pages of 4 positions interleaved in the pool) and still give exactly the tokens
 * each gives alone. */
START_TEST(test_batched_equals_alone)
{
    env_t e;
    env_open(&e, TEST_DATA "/kjv-12l", 2);
    static out_t alone[N_PROMPTS], together[N_PROMPTS];
    memset(alone, 0, sizeof alone);
    memset(together, 0, sizeof together);
    for (int i = 0; i < N_PROMPTS; i++)
        run_alone(&e, i, 24, &alone[i]);
    gen_t *g;
    gen_config_t c = {.max_rows = 12, .prefill_chunk = 5, .page_size = 4, .max_seqs = 4};
    ck_assert_int_eq(gen_new(&g, e.m, e.tok, e.be, &c), 0);
    int32_t *ids[N_PROMPTS];
    size_t n[N_PROMPTS];
    int seq;
    for (int i = 0; i < N_PROMPTS; i++) {
        ids[i] = encode(&e, prompts[i], &n[i]);
        gen_request_t r = {.prompt = ids[i], .n_prompt = n[i], .max_tokens = 24,
                           .ignore_eos = 1, .on_token = on_token, .user = &together[i]};
        if (i == N_PROMPTS - 1) /* the last one joins while the others decode */
            for (int s = 0; s < 6; s++)
                ck_assert_int_eq(gen_step(g), 0);
        ck_assert_int_eq(gen_submit(g, &r, &seq), 0);
    }
    ck_assert_int_eq(gen_run_all(g), 0);
    for (int i = 0; i < N_PROMPTS; i++) {
        ck_assert_uint_eq(together[i].n, alone[i].n);
        for (size_t t = 0; t < alone[i].n; t++)
            ck_assert_msg(together[i].ids[t] == alone[i].ids[t],
                          "prompt %d token %zu: batched %d, alone %d", i, t,
                          together[i].ids[t], alone[i].ids[t]);
        ck_assert_str_eq(together[i].text, alone[i].text);
        free(ids[i]);
    }
    ck_assert_int_eq(kv_pool_free_pages(gen_kv_pool(g)), kv_pool_total_pages(gen_kv_pool(g)));
    gen_destroy(&g);
    env_close(&e);
}
END_TEST

/* Log-probabilities of each generated token, and its top alternatives, as floats. */
typedef struct lp_out {
    int n;
    int32_t ids[16];
    float lp[16][1 + 5];
} lp_out_t;

static void on_logprob(void *user, const gen_event_t *ev)
{
    lp_out_t *o = user;
    if (ev->id < 0 || !ev->logprob || o->n >= 16)
        return;
    o->ids[o->n] = ev->id;
    o->lp[o->n][0] = ev->logprob->logprob;
    for (int k = 0; k < 5; k++)
        o->lp[o->n][1 + k] = k < ev->logprob->n_top ? ev->logprob->top_logprobs[k] : 0.0f;
    o->n++;
}

/* A prompt's results do not depend on how it is cut into chunks: prefilled whole (one
 * chunk of more rows than the decode path takes, so the prefill GEMM runs) and in chunks of
 * 4 (the decode path), the generated tokens' log-probabilities have the same bits. The
 * prefix cache and lossless mode rest on it. */
START_TEST(test_chunking_keeps_bits)
{
    env_t e;
    env_open(&e, TEST_DATA "/kjv-12l", 2);
    char text[512] = "";
    for (int i = 0; i < N_PROMPTS; i++) {
        strcat(text, prompts[i]);
        strcat(text, " ");
    }
    size_t n;
    int32_t *ids = encode(&e, text, &n);
    ck_assert_uint_gt(n, 32);
    static const int chunks[] = {64, 4};
    lp_out_t out[2];
    for (int c = 0; c < 2; c++) {
        gen_t *g;
        gen_config_t cfg = {.max_rows = 64, .prefill_chunk = chunks[c], .page_size = 16,
                            .max_seqs = 1};
        ck_assert_int_eq(gen_new(&g, e.m, e.tok, e.be, &cfg), 0);
        memset(&out[c], 0, sizeof out[c]);
        gen_request_t r = {.prompt = ids, .n_prompt = n, .max_tokens = 8, .ignore_eos = 1,
                           .logprobs = 1, .top_logprobs = 5, .on_token = on_logprob,
                           .user = &out[c]};
        int seq;
        ck_assert_int_eq(gen_submit(g, &r, &seq), 0);
        ck_assert_int_eq(gen_run_all(g), 0);
        gen_destroy(&g);
    }
    ck_assert_int_eq(out[0].n, 8);
    ck_assert_int_eq(out[1].n, 8);
    /* The CUDA backend makes no such promise: its prefill is cuBLAS and its decode its own
     * GEMV, which sum in other orders. There the tokens must agree and the
     * log-probabilities be close. */
    bool exact = strcmp(test_device(), "cuda") != 0;
    for (int t = 0; t < 8; t++) {
        ck_assert_int_eq(out[0].ids[t], out[1].ids[t]);
        for (int k = 0; k < 6; k++)
            ck_assert_msg(exact ? memcmp(&out[0].lp[t][k], &out[1].lp[t][k], sizeof(float)) == 0
                                : fabsf(out[0].lp[t][k] - out[1].lp[t][k]) <= 1e-4f,
                          "token %d, log-probability %d: %.9g prefilled whole, %.9g in "
                          "chunks of 4",
                          t, k, out[0].lp[t][k], out[1].lp[t][k]);
    }
    free(ids);
    env_close(&e);
}
END_TEST

/* The streamed pieces add up to the decode of the generated ids. */
START_TEST(test_stream_text_matches_decode)
{
    env_t e;
    env_open(&e, TEST_DATA "/tinystories-656k", 1);
    out_t o = {0};
    gen_t *g;
    gen_config_t c = {.max_rows = 16, .prefill_chunk = 16, .page_size = 16, .max_seqs = 1};
    ck_assert_int_eq(gen_new(&g, e.m, e.tok, e.be, &c), 0);
    size_t n;
    int32_t *ids = encode(&e, "Once upon a time", &n);
    gen_request_t r = {.prompt = ids, .n_prompt = n, .max_tokens = 40, .ignore_eos = 1,
                       .on_token = on_token, .user = &o};
    int seq;
    ck_assert_int_eq(gen_submit(g, &r, &seq), 0);
    ck_assert_int_eq(gen_run_all(g), 0);
    ck_assert_int_eq(o.finish, GEN_FINISH_LENGTH);
    ck_assert_uint_eq(o.n, 40);
    char *text;
    size_t len;
    ck_assert_int_eq(tokenizer_decode(e.tok, o.ids, o.n, 1, &text, &len), 0);
    ck_assert_str_eq(o.text, text);
    ck_assert_int_gt((int)len, 20);
    ck_assert_int_eq(o.calls_after_finish, 0);
    free(text);
    free(ids);
    gen_destroy(&g);
    env_close(&e);
}
END_TEST

/* A stop string from the middle of the free-running text ends the completion right before
 * it, even when the string spans tokens. */
START_TEST(test_stop_string)
{
    env_t e;
    env_open(&e, TEST_DATA "/tinystories-656k", 1);
    out_t free_run = {0}, stopped = {0};
    size_t n;
    int32_t *ids = encode(&e, "Once upon a time", &n);
    for (int pass = 0; pass < 2; pass++) {
        gen_t *g;
        gen_config_t c = {.max_rows = 16, .prefill_chunk = 16, .page_size = 16, .max_seqs = 1};
        ck_assert_int_eq(gen_new(&g, e.m, e.tok, e.be, &c), 0);
        char stop[16] = {0};
        const char *stops[1] = {stop};
        if (pass == 1) {
            ck_assert_int_gt((int)free_run.n_text, 40);
            memcpy(stop, free_run.text + 30, 7);
        }
        gen_request_t r = {.prompt = ids, .n_prompt = n, .max_tokens = 60, .ignore_eos = 1,
                           .stop = stops, .n_stop = pass, .on_token = on_token,
                           .user = pass ? &stopped : &free_run};
        int seq;
        ck_assert_int_eq(gen_submit(g, &r, &seq), 0);
        ck_assert_int_eq(gen_run_all(g), 0);
        if (pass == 1) {
            const char *first = strstr(free_run.text, stop);
            ck_assert_ptr_nonnull(first);
            ck_assert_int_eq(stopped.finish, GEN_FINISH_STOP);
            ck_assert_uint_eq(stopped.n_text, (size_t)(first - free_run.text));
            ck_assert_int_eq(strncmp(stopped.text, free_run.text, stopped.n_text), 0);
            ck_assert_uint_lt(stopped.n, free_run.n);
        }
        gen_destroy(&g);
    }
    free(ids);
    env_close(&e);
}
END_TEST

/* An EOS id ends the sequence unless ignore_eos is set. */
START_TEST(test_eos)
{
    env_t e;
    env_open(&e, TEST_DATA "/tinystories-656k", 1);
    out_t ref = {0}, o = {0};
    size_t n;
    int32_t *ids = encode(&e, "Tom and Lily", &n);
    gen_t *g;
    gen_config_t c = {.max_rows = 16, .prefill_chunk = 16, .page_size = 16, .max_seqs = 1};
    ck_assert_int_eq(gen_new(&g, e.m, e.tok, e.be, &c), 0);
    gen_request_t r = {.prompt = ids, .n_prompt = n, .max_tokens = 10, .ignore_eos = 1,
                       .on_token = on_token, .user = &ref};
    int seq;
    ck_assert_int_eq(gen_submit(g, &r, &seq), 0);
    ck_assert_int_eq(gen_run_all(g), 0);
    /* Declare the fourth generated token an end-of-sequence id of the model. */
    int saved = e.m->cfg.eos_ids[0], saved_n = e.m->cfg.n_eos;
    e.m->cfg.eos_ids[0] = ref.ids[3];
    e.m->cfg.n_eos = 1;
    r.ignore_eos = 0;
    r.user = &o;
    ck_assert_int_eq(gen_submit(g, &r, &seq), 0);
    ck_assert_int_eq(gen_run_all(g), 0);
    ck_assert_int_eq(o.finish, GEN_FINISH_EOS);
    size_t first = 0;
    while (ref.ids[first] != ref.ids[3])
        first++;
    ck_assert_uint_eq(o.n, first + 1);
    e.m->cfg.eos_ids[0] = saved;
    e.m->cfg.n_eos = saved_n;
    free(ids);
    gen_destroy(&g);
    env_close(&e);
}
END_TEST

START_TEST(test_cancel_frees_pages)
{
    env_t e;
    env_open(&e, TEST_DATA "/kjv-12l", 1);
    gen_t *g;
    gen_config_t c = {.max_rows = 16, .prefill_chunk = 16, .page_size = 4, .max_seqs = 2};
    ck_assert_int_eq(gen_new(&g, e.m, e.tok, e.be, &c), 0);
    int total = kv_pool_total_pages(gen_kv_pool(g));
    size_t n;
    int32_t *ids = encode(&e, prompts[1], &n);
    out_t o = {0};
    gen_request_t r = {.prompt = ids, .n_prompt = n, .max_tokens = 100, .ignore_eos = 1,
                       .on_token = on_token, .user = &o};
    int seq;
    ck_assert_int_eq(gen_submit(g, &r, &seq), 0);
    for (int i = 0; i < 5; i++)
        ck_assert_int_eq(gen_step(g), 0);
    ck_assert_int_lt(kv_pool_free_pages(gen_kv_pool(g)), total);
    ck_assert_int_eq(gen_cancel(g, seq), 0);
    ck_assert_int_eq(o.finish, GEN_FINISH_CANCEL);
    ck_assert_int_eq(kv_pool_free_pages(gen_kv_pool(g)), total);
    ck_assert_int_eq(gen_active(g), 0);
    ck_assert_int_eq(gen_cancel(g, seq), RIVER_ENOTFOUND);
    free(ids);
    gen_destroy(&g);
    env_close(&e);
}
END_TEST

START_TEST(test_limits)
{
    env_t e;
    env_open(&e, TEST_DATA "/kjv-12l", 1);
    gen_t *g;
    gen_config_t c = {.max_rows = 16, .prefill_chunk = 16, .page_size = 16, .max_seqs = 1};
    ck_assert_int_eq(gen_new(&g, e.m, e.tok, e.be, &c), 0);
    int32_t big[300];
    for (int i = 0; i < 300; i++)
        big[i] = 5;
    int seq;
    gen_request_t r = {.prompt = big, .n_prompt = 300, .max_tokens = 4};
    ck_assert_int_eq(gen_submit(g, &r, &seq), RIVER_EINVAL); /* context is 256 */
    r.n_prompt = 0;
    ck_assert_int_eq(gen_submit(g, &r, &seq), RIVER_EINVAL);
    big[1] = 99999;
    r.n_prompt = 4;
    ck_assert_int_eq(gen_submit(g, &r, &seq), RIVER_ERANGE);
    big[1] = 5;
    ck_assert_int_eq(gen_submit(g, &r, &seq), 0);
    ck_assert_int_eq(gen_submit(g, &r, &seq), RIVER_EFULL);
    /* Generation stops at the end of the context. */
    ck_assert_int_eq(gen_cancel(g, seq), 0);
    out_t o = {0};
    r = (gen_request_t){.prompt = big, .n_prompt = 250, .max_tokens = 100, .ignore_eos = 1,
                        .on_token = on_token, .user = &o};
    ck_assert_int_eq(gen_submit(g, &r, &seq), 0);
    ck_assert_int_eq(gen_run_all(g), 0);
    ck_assert_int_eq(o.finish, GEN_FINISH_CONTEXT);
    ck_assert_uint_eq(250 + o.n, 256 + 1);
    gen_destroy(&g);
    env_close(&e);
}
END_TEST

/* With preemption on, a pool too small for four sequences at once makes some of them give
 * their pages back and start over; each still gives exactly the tokens and text it gives
 * alone, no event comes after the last, and every page comes back. */
START_TEST(test_preempt_equals_alone)
{
    env_t e;
    env_open(&e, TEST_DATA "/kjv-12l", 2);
    static out_t alone[N_PROMPTS], together[N_PROMPTS];
    memset(alone, 0, sizeof alone);
    memset(together, 0, sizeof together);
    for (int i = 0; i < N_PROMPTS; i++)
        run_alone(&e, i, 24, &alone[i]);
    gen_t *g;
    /* The longest prompt plus 24 tokens needs 12 pages of 4; four need about 40. */
    gen_config_t c = {.max_rows = 12, .prefill_chunk = 5, .page_size = 4, .max_seqs = 4,
                      .n_pages = 16, .preempt = 1};
    ck_assert_int_eq(gen_new(&g, e.m, e.tok, e.be, &c), 0);
    int32_t *ids[N_PROMPTS];
    size_t n[N_PROMPTS];
    int seq;
    for (int i = 0; i < N_PROMPTS; i++) {
        ids[i] = encode(&e, prompts[i], &n[i]);
        gen_request_t r = {.prompt = ids[i], .n_prompt = n[i], .max_tokens = 24,
                           .ignore_eos = 1, .on_token = on_token, .user = &together[i]};
        ck_assert_int_eq(gen_submit(g, &r, &seq), 0);
    }
    ck_assert_int_eq(gen_run_all(g), 0);
    gen_stats_t st;
    gen_get_stats(g, &st);
    ck_assert_int_gt((int)st.preemptions, 0);
    for (int i = 0; i < N_PROMPTS; i++) {
        ck_assert_int_eq(together[i].finish, GEN_FINISH_LENGTH);
        ck_assert_int_eq(together[i].calls_after_finish, 0);
        ck_assert_uint_eq(together[i].n, alone[i].n);
        for (size_t t = 0; t < alone[i].n; t++)
            ck_assert_msg(together[i].ids[t] == alone[i].ids[t],
                          "prompt %d token %zu: preempted %d, alone %d", i, t,
                          together[i].ids[t], alone[i].ids[t]);
        ck_assert_str_eq(together[i].text, alone[i].text);
        free(ids[i]);
    }
    ck_assert_int_eq(kv_pool_free_pages(gen_kv_pool(g)), kv_pool_total_pages(gen_kv_pool(g)));
    /* A sequence that alone needs more pages than the pool has still ends with an error
     * instead of waiting forever. */
    out_t o = {0};
    size_t nb;
    int32_t *big = encode(&e, prompts[1], &nb);
    gen_request_t r = {.prompt = big, .n_prompt = nb, .max_tokens = 100, .ignore_eos = 1,
                       .on_token = on_token, .user = &o};
    ck_assert_int_eq(gen_submit(g, &r, &seq), 0);
    ck_assert_int_eq(gen_run_all(g), 0);
    ck_assert_int_eq(o.finish, GEN_FINISH_ERROR);
    ck_assert_int_eq(kv_pool_free_pages(gen_kv_pool(g)), kv_pool_total_pages(gen_kv_pool(g)));
    free(big);
    gen_destroy(&g);
    env_close(&e);
}
END_TEST

static void record_index(void *user, const gen_event_t *ev)
{
    out_t *o = user;
    if (ev->id >= 0 && ev->index != (int)o->n)
        o->index_ok = 0;
    on_token(user, ev);
}

/* A completion continued from ids already delivered (a re-dispatch) gives the same later
 * tokens and the same later text as the uninterrupted run, greedy or seeded, with events
 * numbered from the first new token; the done ids count toward max_tokens. */
START_TEST(test_continue_done_ids)
{
    env_t e;
    env_open(&e, TEST_DATA "/tinystories-656k", 1);
    size_t n;
    int32_t *ids = encode(&e, "Once upon a time", &n);
    const char *stops[1] = {"zzz"}; /* never hit; exercises the hold-back path */
    for (int sampled = 0; sampled < 2; sampled++) {
        out_t full = {0}, cont = {0};
        gen_t *g;
        gen_config_t c = {.max_rows = 16, .prefill_chunk = 16, .page_size = 16, .max_seqs = 2};
        ck_assert_int_eq(gen_new(&g, e.m, e.tok, e.be, &c), 0);
        gen_request_t r = {.prompt = ids, .n_prompt = n, .max_tokens = 40, .ignore_eos = 1,
                           .stop = stops, .n_stop = 1, .on_token = on_token, .user = &full};
        if (sampled)
            r.sampling = (sampler_params_t){.temperature = 0.9f, .top_k = 40, .seed = 1234};
        int seq;
        ck_assert_int_eq(gen_submit(g, &r, &seq), 0);
        ck_assert_int_eq(gen_run_all(g), 0);
        ck_assert_uint_eq(full.n, 40);
        const size_t k = 13;
        cont.n = k; /* record_index expects indices from k on */
        cont.index_ok = 1;
        r.done = full.ids;
        r.n_done = k;
        r.on_token = record_index;
        r.user = &cont;
        ck_assert_int_eq(gen_submit(g, &r, &seq), 0);
        ck_assert_int_eq(gen_run_all(g), 0);
        ck_assert_int_eq(cont.finish, GEN_FINISH_LENGTH);
        ck_assert_int_eq(cont.index_ok, 1);
        ck_assert_uint_eq(cont.n, 40);
        for (size_t t = k; t < 40; t++)
            ck_assert_msg(cont.ids[t] == full.ids[t], "sampled %d token %zu: %d, first run %d",
                          sampled, t, cont.ids[t], full.ids[t]);
        ck_assert_str_eq(cont.text, full.text + full.text_at[k - 1]);
        /* Done ids that already reach max_tokens leave nothing to do. */
        r.n_done = 40;
        ck_assert_int_eq(gen_submit(g, &r, &seq), RIVER_EINVAL);
        gen_destroy(&g);
    }
    free(ids);
    env_close(&e);
}
END_TEST

static Suite *generate_suite(void)
{
    Suite *s = suite_create("generate");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_batched_equals_alone);
    tcase_add_test(tc, test_chunking_keeps_bits);
    tcase_add_test(tc, test_stream_text_matches_decode);
    tcase_add_test(tc, test_stop_string);
    tcase_add_test(tc, test_eos);
    tcase_add_test(tc, test_cancel_frees_pages);
    tcase_add_test(tc, test_limits);
    tcase_add_test(tc, test_preempt_equals_alone);
    tcase_add_test(tc, test_continue_done_ids);
    suite_add_tcase(s, tc);
    return s;
}

RIVER_TEST_MAIN(generate_suite)
