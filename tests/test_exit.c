/* The exit engine: plain-engine identity for policy none and unreachable thresholds, the KV
 * integrity invariant (every slot written once, no unwritten slot ever read) under every
 * policy, and what each baseline KV strategy does by its definition. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "engine/forward.h"
#include "engine/generate.h"
#include "engine/exitriver.h"
#include "engine/router.h"
#include "engine/sampler.h"
#include "kernels/cpu/cpu.h"
#include "offline/exitriver_build.h"
#include "offline/router_train.h"
#include "tests/proc.h"
#include "tests/testutil.h"

#define MODEL TEST_DATA "/kjv-12l"
#define STEPS 24
#define MAXPOS 64

/* Counts K/V writes per (layer, position) by wrapping the backend's kv_write. */
static const ops_t *base_ops;
static ops_t counting_ops;
static int writes[16][MAXPOS];

static int count_kv_write(ops_ctx_t *ctx, const kv_view_t *kv, int layer, const attn_batch_t *b,
                          const void *k, const void *v)
{
    for (int i = 0; i < b->n; i++)
        if (b->pos[i] < MAXPOS)
            writes[layer][b->pos[i]]++;
    return base_ops->kv_write(ctx, kv, layer, b, k, v);
}

typedef struct fx {
    model_t *m;
    backend_t *be;
    backend_t counted; /* the same backend, kv_write counted */
    exitriver_t *river;
    const layer_weights_t *layers[16];
    char river_path[256];
} fx_t;

static fx_t F;

static void fx_setup(void)
{
    memset(&F, 0, sizeof F);
    ck_assert_msg(model_load(&F.m, MODEL) == 0, "%s", river_err_detail());
    /* An 8-bit river from layer 1: close to the backbone, so exits stay accurate. */
    snprintf(F.river_path, sizeof F.river_path, "%s/kjv-river-q8.safetensors", test_tmpdir());
    exitriver_build_opts_t o = exitriver_build_opts_default();
    o.quant.bits = 8;
    o.quant.method = QUANT_RTN;
    o.start_layer = 1;
    ck_assert_msg(exitriver_build(F.m, F.river_path, &o, NULL) == 0, "%s", river_err_detail());
    /* Quantizing reads the mapped weights on the host; the backend gets them after. */
    test_backend_open(&F.be, 2, CPU_SIMD_COUNT, F.m);
    ck_assert_msg(exitriver_load(&F.river, F.m, F.river_path) == 0, "%s", river_err_detail());
    for (int l = 0; l < F.m->cfg.n_layers; l++)
        F.layers[l] = exitriver_layer(F.river, l);
    base_ops = F.be->ops;
    counting_ops = *base_ops;
    counting_ops.kv_write = count_kv_write;
    F.counted.ops = &counting_ops;
    F.counted.ctx = F.be->ctx;
}

static void fx_teardown(void)
{
    exitriver_destroy(&F.river);
    remove(F.river_path);
    backend_destroy(&F.be);
    model_destroy(&F.m);
}

typedef struct run {
    int32_t tokens[STEPS];  /* greedy tokens */
    int32_t depth[STEPS];   /* exit depth of each */
    float *logits;          /* (STEPS, vocab) */
    int any_nan;
} run_t;

static const int32_t prompt[] = {1, 80, 1615, 108, 1344, 96, 66, 176};
#define N_PROMPT 8

/* Prompt in one chunk, then greedy decode (or teacher-forced on `feed`), on a NaN-filled
 * pool, with writes counted. */
static void run_policy(const exit_config_t *ex, const int32_t *feed, run_t *out)
{
    const model_config_t *c = &F.m->cfg;
    memset(writes, 0, sizeof writes);
    forward_t *f;
    kv_pool_t *kv;
    ck_assert_int_eq(forward_new(&f, F.m, &F.counted, 64), 0);
    ck_assert_int_eq(kv_pool_new(&kv, F.be, c->n_layers, c->n_kv_heads * c->head_dim, DTYPE_F32,
                                 8, 16), 0);
    ck_assert_int_eq(kv_pool_fill(kv, NAN), 0);
    ck_assert_msg(forward_set_exit(f, ex) == 0, "%s", river_err_detail());
    kv_seq_t s;
    exit_seq_t es;
    kv_seq_init(&s);
    exit_seq_init(&es);
    ck_assert_int_eq(kv_seq_reserve(&s, kv, N_PROMPT + STEPS), 0);
    out->logits = malloc(sizeof(float) * STEPS * (size_t)c->vocab_size);
    out->any_nan = 0;
    int32_t pos[N_PROMPT], grp[N_PROMPT] = {0}, dep[N_PROMPT], last = N_PROMPT - 1;
    const int32_t *tab[N_PROMPT];
    exit_seq_t *ess[N_PROMPT];
    for (int i = 0; i < N_PROMPT; i++) {
        pos[i] = i;
        tab[i] = s.pages;
        ess[i] = &es;
    }
    fwd_batch_t b = {.n = N_PROMPT, .tokens = prompt, .pos = pos, .page_table = tab,
                     .n_logits = 1, .logit_rows = &last, .group = grp, .exit_seq = ess,
                     .depth = dep};
    ck_assert_msg(forward_step(f, kv, &b, out->logits) == 0, "%s", river_err_detail());
    out->depth[0] = dep[last];
    for (int t = 0; t < STEPS; t++) {
        float *lg = out->logits + (size_t)t * (size_t)c->vocab_size;
        for (int j = 0; j < c->vocab_size; j++)
            out->any_nan |= !isfinite(lg[j]);
        out->tokens[t] = sampler_argmax(lg, c->vocab_size);
        if (t + 1 == STEPS)
            break;
        int32_t tok = feed ? feed[t] : out->tokens[t], p = N_PROMPT + t, row = 0;
        fwd_batch_t d = {.n = 1, .tokens = &tok, .pos = &p, .page_table = tab, .n_logits = 1,
                         .logit_rows = &row, .group = grp, .exit_seq = ess, .depth = dep};
        ck_assert_msg(forward_step(f, kv, &d, out->logits + (size_t)(t + 1) * (size_t)c->vocab_size) == 0,
                      "%s", river_err_detail());
        out->depth[t + 1] = dep[0];
    }
    exit_seq_free(&es);
    kv_seq_free(&s, kv);
    kv_pool_destroy(&kv);
    forward_destroy(&f);
}

static exit_config_t config(exit_rule_t rule, exit_kv_t kv, float tau, int k)
{
    exit_config_t ex = {0};
    ex.policy.rule = rule;
    ex.policy.kv = kv;
    ex.policy.tau = tau;
    ex.policy.exit_layer = k;
    ex.river = F.layers;
    ex.river_start = exitriver_start_layer(F.river);
    return ex;
}

/* Positions 0..n-1 of every layer written exactly `want` times. */
static void assert_writes_once(const char *what, int n)
{
    for (int l = 0; l < F.m->cfg.n_layers; l++)
        for (int p = 0; p < n; p++)
            ck_assert_msg(writes[l][p] == 1, "%s: slot (layer %d, pos %d) written %d times",
                          what, l, p, writes[l][p]);
}

START_TEST(test_none_and_high_tau_equal_plain)
{
    run_t plain, none, cos_hi;
    run_policy(NULL, NULL, &plain);
    exit_config_t ex = config(EXIT_RULE_NONE, EXIT_KV_RIVER, 0, 0);
    run_policy(&ex, NULL, &none);
    ex = config(EXIT_RULE_COSINE, EXIT_KV_RIVER, 1.5f, 0);
    run_policy(&ex, NULL, &cos_hi);
    int V = F.m->cfg.vocab_size;
    for (int t = 0; t < STEPS; t++) {
        ck_assert_int_eq(none.tokens[t], plain.tokens[t]);
        ck_assert_int_eq(cos_hi.tokens[t], plain.tokens[t]);
        ck_assert_int_eq(cos_hi.depth[t], F.m->cfg.n_layers);
    }
    /* Not only the same tokens: the same numbers. */
    ck_assert_int_eq(memcmp(cos_hi.logits, plain.logits, sizeof(float) * STEPS * (size_t)V), 0);
    free(plain.logits);
    free(none.logits);
    free(cos_hi.logits);
}
END_TEST

/* The seamless exit: under every rule every slot is written exactly once and nothing
 * unwritten (NaN) is ever read. */
START_TEST(test_river_kv_integrity)
{
    struct {
        exit_rule_t rule;
        float tau;
        int k;
    } cases[] = {{EXIT_RULE_COSINE, 0.9f, 0}, {EXIT_RULE_COSINE, 0.97f, 0},
                 {EXIT_RULE_FIXED, 0, 3},     {EXIT_RULE_FIXED, 0, 11}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        exit_config_t ex = config(cases[i].rule, EXIT_KV_RIVER, cases[i].tau, cases[i].k);
        run_t r;
        run_policy(&ex, NULL, &r);
        char what[64];
        snprintf(what, sizeof what, "%s %g/%d", exit_rule_name(cases[i].rule),
                 (double)cases[i].tau, cases[i].k);
        assert_writes_once(what, N_PROMPT + STEPS - 1);
        ck_assert_msg(!r.any_nan, "%s: NaN reached the logits", what);
        int exited = 0;
        for (int t = 0; t < STEPS; t++)
            exited += r.depth[t] < F.m->cfg.n_layers;
        ck_assert_msg(exited > 0, "%s: no token exited", what);
        if (cases[i].rule == EXIT_RULE_FIXED)
            for (int t = 0; t < STEPS; t++)
                ck_assert_int_eq(r.depth[t], cases[i].k);
        free(r.logits);
    }
}
END_TEST

/* An 8-bit river with a fixed exit stays close to the backbone (teacher-forced). */
START_TEST(test_river8_fixed_close)
{
    run_t plain, r;
    run_policy(NULL, NULL, &plain);
    exit_config_t ex = config(EXIT_RULE_FIXED, EXIT_KV_RIVER, 0, 4);
    run_policy(&ex, plain.tokens, &r);
    int match = 0;
    for (int t = 0; t < STEPS; t++)
        match += r.tokens[t] == plain.tokens[t];
    printf("8-bit river, fixed exit after 4 of 12 layers: %d/%d next tokens match\n", match,
           STEPS);
    ck_assert_int_ge(match, STEPS * 8 / 10);
    free(plain.logits);
    free(r.logits);
}
END_TEST

/* Mask: an exited token's deeper slots stay unwritten, and later tokens never read them
 * (the pool is NaN there, the logits stay finite). */
START_TEST(test_mask_skips_missing)
{
    exit_config_t ex = config(EXIT_RULE_FIXED, EXIT_KV_MASK, 0, 5);
    ex.river = NULL;
    run_t r;
    run_policy(&ex, NULL, &r);
    ck_assert(!r.any_nan);
    int L = F.m->cfg.n_layers;
    for (int p = 0; p < N_PROMPT + STEPS - 1; p++)
        for (int l = 0; l < L; l++)
            ck_assert_int_eq(writes[l][p], l < 5 ? 1 : 0);
    free(r.logits);

    /* With a similarity rule depths vary, so a deep token meets the holes of shallower
     * ones before it: they must be skipped, not read. */
    ex = config(EXIT_RULE_COSINE, EXIT_KV_MASK, 0.985f, 0);
    ex.river = NULL;
    run_policy(&ex, NULL, &r);
    ck_assert(!r.any_nan);
    int deeper_after_hole = 0;
    for (int t = 1; t < STEPS; t++)
        for (int u = 0; u < t; u++)
            deeper_after_hole |= r.depth[t] > r.depth[u];
    ck_assert_msg(deeper_after_hole, "no token went deeper than an earlier one");
    free(r.logits);
}
END_TEST

/* Propagation: every slot is written once, the skipped layers from the exit state. */
START_TEST(test_propagate_fills_kv)
{
    exit_config_t ex = config(EXIT_RULE_FIXED, EXIT_KV_PROPAGATE, 0, 5);
    ex.river = NULL;
    run_t r;
    run_policy(&ex, NULL, &r);
    ck_assert(!r.any_nan);
    assert_writes_once("propagate", N_PROMPT + STEPS - 1);
    free(r.logits);
}
END_TEST

/* Recompute: an exited token's missing layers run later with the next deep token, so in
 * the end every slot is written once, and with the backbone's own numbers. */
START_TEST(test_recompute_completes_kv)
{
    exit_config_t ex = config(EXIT_RULE_COSINE, EXIT_KV_RECOMPUTE, 0.985f, 0);
    ex.river = NULL;
    run_t r;
    run_policy(&ex, NULL, &r);
    ck_assert(!r.any_nan);
    int L = F.m->cfg.n_layers, exited = 0, last_deep = -1;
    for (int t = 0; t < STEPS - 1; t++) {
        exited += r.depth[t] < L;
        if (r.depth[t] == L)
            last_deep = t;
    }
    printf("recompute: %d of %d tokens exited early, last deep token %d\n", exited, STEPS - 1,
           last_deep);
    ck_assert_int_gt(exited, 0);
    /* Every position up to the last token that went deep has all its layers. */
    ck_assert_int_ge(last_deep, 0);
    for (int p = 0; p < N_PROMPT + last_deep; p++)
        for (int l = 0; l < L; l++)
            ck_assert_msg(writes[l][p] == 1, "slot (%d, %d) written %d times", l, p,
                          writes[l][p]);
    free(r.logits);
}
END_TEST

/* Mono-decreasing: depth never grows within the sequence, nothing unwritten is read. */
START_TEST(test_mono_decreasing)
{
    exit_config_t ex = config(EXIT_RULE_COSINE, EXIT_KV_MONO, 0.95f, 0);
    ex.river = NULL;
    run_t r;
    run_policy(&ex, NULL, &r);
    ck_assert(!r.any_nan);
    for (int t = 1; t < STEPS; t++)
        ck_assert_int_le(r.depth[t], r.depth[t - 1]);
    free(r.logits);
}
END_TEST

/* Post-hoc: every layer runs (every slot written once), the logits come from the exit
 * layer: with a fixed exit after layer 11 of 12 they differ from the full model's. */
START_TEST(test_posthoc)
{
    run_t plain, r;
    run_policy(NULL, NULL, &plain);
    exit_config_t ex = config(EXIT_RULE_FIXED, EXIT_KV_POSTHOC, 0, 11);
    ex.river = NULL;
    run_policy(&ex, plain.tokens, &r);
    assert_writes_once("posthoc", N_PROMPT + STEPS - 1);
    ck_assert(!r.any_nan);
    ck_assert_int_ne(memcmp(r.logits, plain.logits, sizeof(float) * (size_t)F.m->cfg.vocab_size), 0);
    free(plain.logits);
    free(r.logits);
}
END_TEST

typedef struct seq_out {
    int32_t ids[64];
    int32_t depth[64];
    int n;
} seq_out_t;

static void collect(void *user, const gen_event_t *ev)
{
    seq_out_t *o = user;
    if (ev->id >= 0 && o->n < 64) {
        o->depth[o->n] = ev->depth;
        o->ids[o->n++] = ev->id;
    }
}

static const int32_t prompts[3][6] = {{1, 80, 1615, 108, 1344, 96},
                                      {1, 80, 200, 300, 400, 500},
                                      {1, 80, 77, 66, 55, 44}};

/* Decodes the prompts through the generator with one exit policy, all at once (batch) or
 * each on its own. */
static int64_t last_splits; /* layers run as two groups by the last batched decode */

static void decode_prompts(const exit_config_t *ex, int together, seq_out_t *out)
{
    gen_config_t gc = {.max_rows = 16, .prefill_chunk = 16, .page_size = 8, .max_seqs = 3};
    gen_t *g = NULL;
    for (int i = 0; i < 3; i++) {
        if (!g || !together) {
            ck_assert_int_eq(gen_new(&g, F.m, NULL, F.be, &gc), 0);
            ck_assert_msg(gen_set_exit(g, ex) == 0, "%s", river_err_detail());
        }
        gen_request_t r = {.prompt = prompts[i], .n_prompt = 6, .max_tokens = 20,
                           .ignore_eos = 1, .on_token = collect, .user = &out[i]};
        int seq;
        ck_assert_int_eq(gen_submit(g, &r, &seq), 0);
        if (!together) {
            ck_assert_int_eq(gen_run_all(g), 0);
            gen_destroy(&g);
        }
    }
    if (together) {
        ck_assert_int_eq(gen_run_all(g), 0);
        fwd_stats_t st;
        forward_get_stats(gen_forward(g), &st);
        last_splits = st.splits;
        gen_destroy(&g);
    }
}

/* Row aggregation with the split forced (no cost model): each decode row decides alone,
 * the batch is compacted into a backbone group and a river group per layer and scattered
 * back, and every sequence gets exactly the tokens and exit depths it gets alone. */
START_TEST(test_row_split_equals_alone)
{
    exit_config_t ex = config(EXIT_RULE_COSINE, EXIT_KV_RIVER, 0.95f, 0);
    ex.policy.agg = EXIT_AGG_ROW;
    ex.policy.split_cost_model = 0;
    static seq_out_t alone[3], batch[3];
    memset(alone, 0, sizeof alone);
    memset(batch, 0, sizeof batch);
    decode_prompts(&ex, 0, alone);
    decode_prompts(&ex, 1, batch);
    int mixed = 0;
    for (int i = 0; i < 3; i++) {
        ck_assert_int_eq(batch[i].n, alone[i].n);
        for (int t = 0; t < alone[i].n; t++) {
            ck_assert_msg(batch[i].ids[t] == alone[i].ids[t], "seq %d token %d: %d vs %d", i,
                          t, batch[i].ids[t], alone[i].ids[t]);
            ck_assert_int_eq(batch[i].depth[t], alone[i].depth[t]);
        }
    }
    /* The case is only worth something if rows of one step took different paths. */
    for (int t = 1; t < alone[0].n; t++)
        mixed |= alone[0].depth[t] != alone[1].depth[t] || alone[0].depth[t] != alone[2].depth[t];
    ck_assert_msg(mixed, "every row exited at the same depth: no split happened");
    ck_assert_int_gt(last_splits, 0);
}
END_TEST

/* river eval's exit histogram is indexed as ExitStats.histogram: entry l counts the tokens
 * that left the backbone after l layers (L + 1 entries), so a fixed exit after 4 layers
 * puts every token in entry 4 and the mean exit layer agrees; the JSON names the SIMD level
 * (the same RIVER_SIMD as this process, if any). */
START_TEST(test_eval_histogram)
{
    char pfile[320];
    snprintf(pfile, sizeof pfile, "%s/prompts.txt", test_tmpdir());
    test_write(pfile, "In the beginning God created\nAnd the LORD spake unto Moses\n");
    char *argv[] = {(char *)test_bin("river"), "eval", "--model", MODEL, "--river",
                    F.river_path, "--prompts", pfile, "--policy", "fixed", "--exit-layer",
                    "4", "--max-tokens", "6", "--threads", "1", "--output", "json", NULL};
    char *out;
    ck_assert_int_eq(test_capture(argv, NULL, 0, &out), 0);
    json_error_t je;
    json_t *o = json_loads(out, JSON_DISABLE_EOF_CHECK, &je);
    ck_assert_msg(o, "river eval output: %.300s", out);
    int L = F.m->cfg.n_layers;
    json_t *h = json_object_get(o, "exit_histogram");
    ck_assert_int_eq((int)json_array_size(h), L + 1);
    json_int_t tokens = json_integer_value(json_object_get(o, "tokens"));
    ck_assert_int_gt((int)tokens, 0);
    for (int l = 0; l <= L; l++)
        ck_assert_msg(json_integer_value(json_array_get(h, (size_t)l)) == (l == 4 ? tokens : 0),
                      "histogram[%d] = %lld of %lld tokens", l,
                      (long long)json_integer_value(json_array_get(h, (size_t)l)),
                      (long long)tokens);
    ck_assert_double_eq_tol(json_real_value(json_object_get(o, "mean_exit_layer")), 4.0, 1e-9);
    /* river eval ran on the CPU backend, whatever device this suite runs on: its level is
     * the one a CPU backend opened here picks. */
    backend_t *cpu;
    ck_assert_int_eq(cpu_backend_new(&cpu, 1, CPU_SIMD_COUNT), 0);
    backend_info_t bi;
    backend_get_info(cpu, &bi);
    ck_assert_str_eq(json_string_value(json_object_get(o, "simd")), bi.variant);
    backend_destroy(&cpu);
    /* Short rounds repeat 3 times by default; the bytes ideal is the histogram's alone. */
    ck_assert_int_eq((int)json_integer_value(json_object_get(o, "repeat")), 3);
    double ideal = json_real_value(json_object_get(o, "ideal_speedup_bytes"));
    ck_assert_msg(ideal > 1, "ideal_speedup_bytes %g", ideal);
    ck_assert(json_real_value(json_object_get(o, "ideal_speedup_layers")) > 0);
    ck_assert_double_eq_tol(json_real_value(json_object_get(o, "realized_over_ideal")),
                            json_real_value(json_object_get(o, "speedup")) / ideal, 1e-9);
    json_decref(o);
    free(out);
    /* --repeat N times N rounds; the same histogram gives the same ideal, to the bit. */
    char *argv2[32];
    int n = 0;
    while (argv[n])
        argv2[n] = argv[n], n++;
    argv2[n++] = "--repeat";
    argv2[n++] = "2";
    argv2[n] = NULL;
    ck_assert_int_eq(test_capture(argv2, NULL, 0, &out), 0);
    o = json_loads(out, JSON_DISABLE_EOF_CHECK, &je);
    ck_assert_msg(o, "river eval output: %.300s", out);
    ck_assert_int_eq((int)json_integer_value(json_object_get(o, "repeat")), 2);
    ck_assert(json_real_value(json_object_get(o, "ideal_speedup_bytes")) == ideal);
    json_decref(o);
    free(out);
    /* A bad count is a usage error naming the option. */
    static const char *const bad[] = {"0", "65", "x", "2x"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        argv2[n - 1] = (char *)bad[i];
        ck_assert_int_eq(test_capture(argv2, NULL, 1, &out), 2);
        ck_assert_msg(strstr(out, "--repeat"), "--repeat %s: %.300s", bad[i], out);
        free(out);
    }
}
END_TEST

static int router_calls;
static int count_router_prob(ops_ctx_t *ctx, float *out, const void *x,
                             const router_weights_t *w, const int32_t *rows, int n)
{
    router_calls++;
    return base_ops->router_prob(ctx, out, x, w, rows, n);
}

/* The router rule decides through ops->router_prob on the backend once the routers are
 * placed (only the probabilities come back), and exits exactly where the host routers
 * exit: the same tokens, depths and logits for thresholds that exit some tokens and not
 * others. */
START_TEST(test_router_rule_on_backend)
{
    router_set_t *rs;
    ck_assert_int_eq(router_set_new(&rs, F.m, 2, 0.9f, 5), 0);
    counting_ops.router_prob = count_router_prob;
    int exited = 0, stayed = 0;
    for (float theta = 0.30f; theta < 0.71f; theta += 0.05f) {
        exit_config_t ex = config(EXIT_RULE_ROUTER, EXIT_KV_RIVER, 0, 0);
        ex.policy.theta = theta;
        ex.router.user = rs;
        ex.router.is_checkpoint = router_set_is_checkpoint_cb;
        ex.router.prob = router_prob_cb;
        run_t host, dev;
        router_calls = 0;
        run_policy(&ex, NULL, &host);
        ck_assert_int_eq(router_calls, 0);
        ck_assert_int_eq(router_set_place(rs, F.be), 0);
        ex.router.weights = router_set_weights_cb;
        run_policy(&ex, NULL, &dev);
        ck_assert_int_gt(router_calls, 0);
        for (int t = 0; t < STEPS; t++) {
            ck_assert_msg(host.tokens[t] == dev.tokens[t] && host.depth[t] == dev.depth[t],
                          "theta %.2f step %d: host routers token %d depth %d, op token %d "
                          "depth %d", theta, t, host.tokens[t], host.depth[t], dev.tokens[t],
                          dev.depth[t]);
            exited += host.depth[t] < F.m->cfg.n_layers;
            stayed += host.depth[t] == F.m->cfg.n_layers;
        }
        ck_assert(memcmp(host.logits, dev.logits,
                         sizeof(float) * STEPS * (size_t)F.m->cfg.vocab_size) == 0);
        free(host.logits);
        free(dev.logits);
    }
    ck_assert_msg(exited > 0 && stayed > 0, "no threshold split the tokens: %d exited, %d "
                  "stayed", exited, stayed);
    counting_ops.router_prob = base_ops->router_prob;
    router_set_destroy(&rs);
}
END_TEST

static Suite *exit_suite(void)
{
    Suite *s = suite_create("exit");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 300);
    /* The river is built once for the suite, before Check forks each test, except on CUDA:
     * a context made before fork(2) is unusable in the child, so there each test builds its
     * own. */
    if (strcmp(test_device(), "cuda") == 0)
        tcase_add_checked_fixture(tc, fx_setup, fx_teardown);
    else
        tcase_add_unchecked_fixture(tc, fx_setup, fx_teardown);
    tcase_add_test(tc, test_none_and_high_tau_equal_plain);
    tcase_add_test(tc, test_river_kv_integrity);
    tcase_add_test(tc, test_river8_fixed_close);
    tcase_add_test(tc, test_mask_skips_missing);
    tcase_add_test(tc, test_propagate_fills_kv);
    tcase_add_test(tc, test_recompute_completes_kv);
    tcase_add_test(tc, test_mono_decreasing);
    tcase_add_test(tc, test_posthoc);
    tcase_add_test(tc, test_row_split_equals_alone);
    tcase_add_test(tc, test_eval_histogram);
    tcase_add_test(tc, test_router_rule_on_backend);
    suite_add_tcase(s, tc);
    return s;
}

RIVER_TEST_MAIN(exit_suite)
