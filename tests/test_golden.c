/* Token-exact parity with outside reference implementations (tests/data/<model>/golden):
 * Karpathy's run.c for stories260K and TinyStories-656K (prompt ids, every logit, every
 * layer's residual stream, every greedy token), llama.cpp for kjv-12l (greedy ids). */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "engine/forward.h"
#include "engine/generate.h"
#include "model/model.h"
#include "engine/sampler.h"
#include "text/tokenizer.h"
#include "kernels/cpu/cpu.h"
#include "tests/testutil.h"

#define LOGIT_TOL 1e-4f
/* Residual streams: 1e-4 absolute, widened to 1e-6 relative (a few ulp) where values are
 * large. TinyStories-656K's residual stream reaches ~613, where one float ulp is 6.1e-5:
 * its HF copy (rotate_half layout) sums attention in another order than the llama2.c copy
 * run.c used, and even an exact fp64 forward lands 2.6e-4 from these goldens (golden
 * README). The llama2.c copy and stories260K meet 1e-4 outright. */
#define HIDDEN_TOL 1e-4f
#define HIDDEN_REL 1e-6f
/* On a GPU the reductions run as warp trees and split-K partials, another order again; on
 * the H200, stories260K's tom_and_lily put one element of magnitude 104.6 just past
 * HIDDEN_REL. 4e-6 is about 32 ulp. */
#define HIDDEN_REL_GPU 4e-6f

typedef struct golden_case {
    const char *model;     /* model path */
    const char *tokenizer; /* tokenizer path */
    const char *golden;    /* golden directory */
    const char *slug;
    float eps;             /* RMSNorm epsilon to set (llama2.c files carry none), or 0 */
} golden_case_t;

static const golden_case_t runc_cases[] = {
    {TEST_DATA "/stories260K/stories260K.bin", TEST_DATA "/stories260K/tok512.bin",
     TEST_DATA "/stories260K/golden", "once_upon_a_time", 0},
    {TEST_DATA "/stories260K/stories260K.bin", TEST_DATA "/stories260K/tok512.bin",
     TEST_DATA "/stories260K/golden", "tom_and_lily", 0},
    {TEST_DATA "/stories260K/stories260K.bin", TEST_DATA "/stories260K/tok512.bin",
     TEST_DATA "/stories260K/golden", "the_dog", 0},
    {TEST_DATA "/tinystories-656k", TEST_DATA "/tinystories-656k/tokenizer.json",
     TEST_DATA "/tinystories-656k/golden", "once_upon_a_time", 0},
    {TEST_DATA "/tinystories-656k", TEST_DATA "/tinystories-656k/tokenizer.json",
     TEST_DATA "/tinystories-656k/golden", "tom_and_lily", 0},
    {TEST_DATA "/tinystories-656k", TEST_DATA "/tinystories-656k/tokenizer.json",
     TEST_DATA "/tinystories-656k/golden", "the_dog", 0},
    /* The converted llama2.c copy the goldens were made from: interleaved RoPE, eps 1e-6. */
    {TEST_DATA "/tinystories-656k/llama2c/tinystories656k.bin",
     TEST_DATA "/tinystories-656k/llama2c/tok2048.bin", TEST_DATA "/tinystories-656k/golden",
     "once_upon_a_time", 1e-6f},
    {TEST_DATA "/tinystories-656k/llama2c/tinystories656k.bin",
     TEST_DATA "/tinystories-656k/llama2c/tok2048.bin", TEST_DATA "/tinystories-656k/golden",
     "the_dog", 1e-6f},
};

typedef struct fixture {
    model_t *m;
    tokenizer_t *tok;
    backend_t *be;
    forward_t *fwd;
    kv_pool_t *kv;
    kv_seq_t seq;
    json_t *golden;
    float *logits;     /* (steps, vocab) golden */
    float *hidden;     /* (steps, n_layers, dim) golden */
    int steps;
} fixture_t;

static float *load_f32(const char *dir, const char *file, size_t expect)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    size_t len = 0;
    float *p = test_read_file(path, &len);
    ck_assert_msg(p != NULL, "cannot read %s", path);
    ck_assert_msg(len == expect * sizeof(float), "%s: %zu bytes, expected %zu", path, len,
                  expect * sizeof(float));
    return p;
}

static void fixture_open_simd(fixture_t *fx, const golden_case_t *gc, int threads,
                              cpu_simd_t simd)
{
    memset(fx, 0, sizeof *fx);
    int e = model_load(&fx->m, gc->model);
    ck_assert_msg(e == 0, "load %s: %s", gc->model, river_err_detail());
    if (gc->eps > 0)
        model_set_norm_eps(fx->m, gc->eps);
    e = tokenizer_load(&fx->tok, gc->tokenizer, fx->m->cfg.vocab_size);
    ck_assert_msg(e == 0, "tokenizer %s: %s", gc->tokenizer, river_err_detail());
    test_backend_open(&fx->be, threads, simd, fx->m);
    ck_assert_int_eq(forward_new(&fx->fwd, fx->m, fx->be, 64), 0);
    ck_assert_int_eq(kv_pool_new(&fx->kv, fx->be, fx->m->cfg.n_layers,
                                 fx->m->cfg.n_kv_heads * fx->m->cfg.head_dim, DTYPE_F32, 16, 8), 0);
    /* Unwritten slots hold NaN, so reading one anywhere poisons the logits. */
    ck_assert_int_eq(kv_pool_fill(fx->kv, NAN), 0);
    kv_seq_init(&fx->seq);
    char path[512];
    snprintf(path, sizeof path, "%s/%s.json", gc->golden, gc->slug);
    json_error_t je;
    fx->golden = json_load_file(path, 0, &je);
    ck_assert_msg(fx->golden != NULL, "%s: %s", path, je.text);
    fx->steps = (int)json_integer_value(json_object_get(fx->golden, "n_forward_steps"));
    ck_assert_int_eq(fx->steps, 64);
    char file[256];
    snprintf(file, sizeof file, "%s.logits.f32", gc->slug);
    fx->logits = load_f32(gc->golden, file, (size_t)fx->steps * (size_t)fx->m->cfg.vocab_size);
    snprintf(file, sizeof file, "%s.hidden.f32", gc->slug);
    fx->hidden = load_f32(gc->golden, file,
                          (size_t)fx->steps * (size_t)fx->m->cfg.n_layers * (size_t)fx->m->cfg.dim);
}

static void fixture_open(fixture_t *fx, const golden_case_t *gc, int threads)
{
    fixture_open_simd(fx, gc, threads, CPU_SIMD_COUNT);
}

static void fixture_close(fixture_t *fx)
{
    kv_seq_free(&fx->seq, fx->kv);
    kv_pool_destroy(&fx->kv);
    forward_destroy(&fx->fwd);
    backend_destroy(&fx->be);
    tokenizer_destroy(&fx->tok);
    model_destroy(&fx->m);
    json_decref(fx->golden);
    free(fx->logits);
    free(fx->hidden);
}

static void ids_from_json(json_t *arr, int32_t *out, size_t *n)
{
    *n = json_array_size(arr);
    for (size_t i = 0; i < *n; i++)
        out[i] = (int32_t)json_integer_value(json_array_get(arr, i));
}

static float max_abs_diff(const float *a, const float *b, size_t n)
{
    float m = 0;
    for (size_t i = 0; i < n; i++) {
        float d = fabsf(a[i] - b[i]);
        if (!(d <= m))
            m = d; /* NaN propagates as the maximum */
    }
    return m;
}

/* Prompt ids from our tokenizer equal run.c's. */
START_TEST(test_prompt_ids)
{
    const golden_case_t *gc = &runc_cases[_i];
    fixture_t fx;
    fixture_open(&fx, gc, 1);
    const char *prompt = json_string_value(json_object_get(fx.golden, "prompt"));
    int32_t want[256];
    size_t n_want;
    ids_from_json(json_object_get(fx.golden, "prompt_tokens"), want, &n_want);
    int32_t *ids;
    size_t n;
    ck_assert_int_eq(tokenizer_encode(fx.tok, prompt, strlen(prompt), 1, &ids, &n), 0);
    ck_assert_uint_eq(n, n_want);
    for (size_t i = 0; i < n; i++)
        ck_assert_int_eq(ids[i], want[i]);
    free(ids);
    fixture_close(&fx);
}
END_TEST

typedef struct hook_capture {
    float *hidden; /* (n_layers, dim) of the last step, row 0 */
} hook_capture_t;

static void capture_hidden(void *user, int layer, const float *h, int n, int dim)
{
    hook_capture_t *hc = user;
    memcpy(hc->hidden + (size_t)layer * (size_t)dim, h + (size_t)(n - 1) * (size_t)dim,
           sizeof(float) * (size_t)dim);
}

/* run.c's 64 forward passes, one token at a time: every logit and every layer's residual
 * stream agree, and greedy picks the golden tokens. */
static void check_stepwise(int case_idx, int threads)
{
    const golden_case_t *gc = &runc_cases[case_idx];
    fixture_t fx;
    fixture_open(&fx, gc, threads);
    const model_config_t *c = &fx.m->cfg;
    int32_t prompt[256], gen[256];
    size_t n_prompt, n_gen;
    ids_from_json(json_object_get(fx.golden, "prompt_tokens"), prompt, &n_prompt);
    ids_from_json(json_object_get(fx.golden, "generated_tokens"), gen, &n_gen);
    ck_assert_uint_eq(n_prompt - 1 + n_gen, (size_t)fx.steps);
    float *logits = malloc(sizeof(float) * (size_t)c->vocab_size);
    hook_capture_t hc = {malloc(sizeof(float) * (size_t)c->n_layers * (size_t)c->dim)};
    forward_set_layer_hook(fx.fwd, capture_hidden, &hc);
    float worst_logit = 0, worst_hidden = 0;
    int32_t token = prompt[0];
    for (int i = 0; i < fx.steps; i++) {
        ck_assert_int_eq(kv_seq_reserve(&fx.seq, fx.kv, i + 1), 0);
        int32_t pos = i, row = 0;
        const int32_t *table = fx.seq.pages;
        fwd_batch_t b = {.n = 1, .tokens = &token, .pos = &pos, .page_table = &table,
                         .n_logits = 1, .logit_rows = &row};
        ck_assert_int_eq(forward_step(fx.fwd, fx.kv, &b, logits), 0);
        float dl = max_abs_diff(logits, fx.logits + (size_t)i * (size_t)c->vocab_size,
                                (size_t)c->vocab_size);
        ck_assert_msg(dl <= LOGIT_TOL, "%s step %d: logits differ by %g", gc->slug, i, dl);
        worst_logit = dl > worst_logit ? dl : worst_logit;
        float dh = max_abs_diff(hc.hidden,
                                fx.hidden + (size_t)i * (size_t)c->n_layers * (size_t)c->dim,
                                (size_t)c->n_layers * (size_t)c->dim);
        worst_hidden = dh > worst_hidden ? dh : worst_hidden;
        int32_t next = sampler_argmax(logits, c->vocab_size);
        if ((size_t)i + 1 < n_prompt) {
            token = prompt[i + 1];
        } else {
            ck_assert_msg(next == gen[(size_t)i + 1 - n_prompt], "%s step %d: token %d, golden %d",
                          gc->slug, i, next, gen[(size_t)i + 1 - n_prompt]);
            token = next;
        }
    }
    printf("golden %s/%s (%d threads): max |dlogit| %.3g, max |dhidden| chained %.3g\n",
           gc->golden, gc->slug, threads, worst_logit, worst_hidden);
    free(logits);
    free(hc.hidden);
    fixture_close(&fx);
}

START_TEST(test_stepwise_1thread) { check_stepwise(_i, 1); }
END_TEST

START_TEST(test_stepwise_2threads) { check_stepwise(_i, 2); }
END_TEST

/* Each layer on its own: the golden residual stream of layer l-1 goes in, layer l's comes
 * out, so an error in one layer cannot hide behind (or be blamed on) another. */
START_TEST(test_each_layer)
{
    const golden_case_t *gc = &runc_cases[_i];
    fixture_t fx;
    fixture_open_simd(&fx, gc, 1, CPU_SIMD_SCALAR);
    const model_config_t *c = &fx.m->cfg;
    size_t d = (size_t)c->dim;
    int32_t full[256];
    size_t n_full;
    ids_from_json(json_object_get(fx.golden, "full_sequence"), full, &n_full);
    float *in = malloc(sizeof(float) * d), *out = malloc(sizeof(float) * d);
    float worst = 0;
    float rel = strcmp(test_device(), "cuda") == 0 ? HIDDEN_REL_GPU : HIDDEN_REL;
    ck_assert_int_eq(kv_seq_reserve(&fx.seq, fx.kv, fx.steps), 0);
    for (int i = 0; i < fx.steps; i++) {
        const float *g = fx.hidden + (size_t)i * (size_t)c->n_layers * d;
        int32_t pos = i, tok = full[i];
        const int32_t *table = fx.seq.pages;
        fwd_batch_t b = {.n = 1, .tokens = &tok, .pos = &pos, .page_table = &table};
        for (int l = 0; l < c->n_layers; l++) {
            if (l == 0) {
                /* Layer 0 starts from the embedding row, through the backend's embed op. */
                void *buf = fx.be->ops->buf_alloc(fx.be->ctx, d);
                ck_assert_ptr_nonnull(buf);
                ck_assert_int_eq(fx.be->ops->embed(fx.be->ctx, buf, &fx.m->embed, &tok, 1), 0);
                ck_assert_int_eq(fx.be->ops->to_host(fx.be->ctx, in, buf, 0, d), 0);
                fx.be->ops->buf_free(fx.be->ctx, buf);
            } else {
                memcpy(in, g + (size_t)(l - 1) * d, sizeof(float) * d);
            }
            ck_assert_int_eq(forward_layer_host(fx.fwd, fx.kv, &b, l, in, out), 0);
            float dh = 0;
            const float *want = g + (size_t)l * d;
            for (size_t j = 0; j < d; j++) {
                float diff = fabsf(out[j] - want[j]);
                float tol = fmaxf(HIDDEN_TOL, rel * fabsf(want[j]));
                ck_assert_msg(diff <= tol, "%s step %d layer %d elem %zu: %.9g vs golden %.9g "
                              "(difference %.3g, tolerance %.3g)", gc->slug, i, l, j,
                              (double)out[j], (double)want[j], (double)diff, (double)tol);
                dh = diff > dh ? diff : dh;
            }
            ck_assert_msg(dh == dh, "%s step %d layer %d: hidden differs by %g", gc->slug,
                          i, l, dh);
            worst = dh > worst ? dh : worst;
        }
    }
    printf("golden %s/%s: max |dhidden| per layer %.3g\n", gc->golden, gc->slug, worst);
    free(in);
    free(out);
    fixture_close(&fx);
}
END_TEST

/* The whole prompt in one batch gives the same logits as one token at a time. */
START_TEST(test_batched_prefill)
{
    const golden_case_t *gc = &runc_cases[_i];
    fixture_t fx;
    fixture_open(&fx, gc, 2);
    const model_config_t *c = &fx.m->cfg;
    int32_t full[256], pos[256], rows[256];
    const int32_t *tables[256];
    size_t n_full;
    ids_from_json(json_object_get(fx.golden, "full_sequence"), full, &n_full);
    int n = fx.steps;
    ck_assert_int_eq(kv_seq_reserve(&fx.seq, fx.kv, n), 0);
    for (int i = 0; i < n; i++) {
        pos[i] = i;
        rows[i] = i;
        tables[i] = fx.seq.pages;
    }
    float *logits = malloc(sizeof(float) * (size_t)n * (size_t)c->vocab_size);
    fwd_batch_t b = {.n = n, .tokens = full, .pos = pos, .page_table = tables, .n_logits = n,
                     .logit_rows = rows};
    ck_assert_int_eq(forward_step(fx.fwd, fx.kv, &b, logits), 0);
    float dl = max_abs_diff(logits, fx.logits, (size_t)n * (size_t)c->vocab_size);
    ck_assert_msg(dl <= LOGIT_TOL, "%s: batched logits differ by %g", gc->slug, dl);
    free(logits);
    fixture_close(&fx);
}
END_TEST

typedef struct collected {
    int32_t ids[512];
    size_t n;
    gen_finish_t finish;
} collected_t;

static void collect_ids(void *user, const gen_event_t *ev)
{
    collected_t *c = user;
    if (ev->id >= 0 && c->n < 512)
        c->ids[c->n++] = ev->id;
    c->finish = ev->finish;
}

/* Through the generator (chunked prefill, sampler, small KV pages): the golden tokens. */
START_TEST(test_generate_runc)
{
    const golden_case_t *gc = &runc_cases[_i];
    fixture_t fx;
    fixture_open(&fx, gc, 2);
    int32_t prompt[256], gen[256];
    size_t n_prompt, n_gen;
    ids_from_json(json_object_get(fx.golden, "prompt_tokens"), prompt, &n_prompt);
    ids_from_json(json_object_get(fx.golden, "generated_tokens"), gen, &n_gen);
    gen_t *g;
    gen_config_t cfg = {.max_rows = 8, .prefill_chunk = 3, .page_size = 4, .max_seqs = 1};
    ck_assert_int_eq(gen_new(&g, fx.m, NULL, fx.be, &cfg), 0);
    ck_assert_int_eq(kv_pool_fill(gen_kv_pool(g), NAN), 0);
    collected_t got = {0};
    gen_request_t req = {.prompt = prompt, .n_prompt = n_prompt, .max_tokens = (int)n_gen,
                         .ignore_eos = 1, .on_token = collect_ids, .user = &got};
    int seq;
    ck_assert_int_eq(gen_submit(g, &req, &seq), 0);
    ck_assert_int_eq(gen_run_all(g), 0);
    ck_assert_int_eq(got.finish, GEN_FINISH_LENGTH);
    ck_assert_uint_eq(got.n, n_gen);
    for (size_t i = 0; i < n_gen; i++)
        ck_assert_msg(got.ids[i] == gen[i], "%s token %zu: %d, golden %d", gc->slug, i,
                      got.ids[i], gen[i]);
    /* Every page went back to the pool when the sequence ended. */
    ck_assert_int_eq(kv_pool_free_pages(gen_kv_pool(g)), kv_pool_total_pages(gen_kv_pool(g)));
    gen_destroy(&g);
    fixture_close(&fx);
}
END_TEST

/* kjv-12l against llama.cpp: prompt ids from tokenizer.json and the greedy continuation. */
static const char *kjv_slugs[] = {"in_the_beginning", "blessed_are_the",
                                  "and_the_lord_said_unto_moses"};

START_TEST(test_kjv_llamacpp)
{
    char path[256];
    snprintf(path, sizeof path, TEST_DATA "/kjv-12l/golden/%s.json", kjv_slugs[_i]);
    json_error_t je;
    json_t *gj = json_load_file(path, 0, &je);
    ck_assert_msg(gj != NULL, "%s: %s", path, je.text);
    model_t *m;
    tokenizer_t *tok;
    backend_t *be;
    ck_assert_msg(model_load(&m, TEST_DATA "/kjv-12l") == 0, "%s", river_err_detail());
    ck_assert_msg(tokenizer_load(&tok, TEST_DATA "/kjv-12l/tokenizer.json", 0) == 0, "%s",
                  river_err_detail());
    test_backend_open(&be, 2, CPU_SIMD_COUNT, m);
    const char *prompt = json_string_value(json_object_get(gj, "prompt"));
    int32_t want_prompt[256], want[256];
    size_t n_want_prompt, n_want;
    ids_from_json(json_object_get(gj, "prompt_ids"), want_prompt, &n_want_prompt);
    ids_from_json(json_object_get(gj, "generated_ids"), want, &n_want);
    int32_t *ids;
    size_t n;
    ck_assert_int_eq(tokenizer_encode(tok, prompt, strlen(prompt), 1, &ids, &n), 0);
    ck_assert_uint_eq(n, n_want_prompt);
    for (size_t i = 0; i < n; i++)
        ck_assert_int_eq(ids[i], want_prompt[i]);
    gen_t *g;
    gen_config_t cfg = {.max_rows = 16, .prefill_chunk = 16, .page_size = 16, .max_seqs = 1};
    ck_assert_int_eq(gen_new(&g, m, tok, be, &cfg), 0);
    collected_t got = {0};
    gen_request_t req = {.prompt = ids, .n_prompt = n, .max_tokens = (int)n_want,
                         .ignore_eos = 1, .on_token = collect_ids, .user = &got};
    int seq;
    ck_assert_int_eq(gen_submit(g, &req, &seq), 0);
    ck_assert_int_eq(gen_run_all(g), 0);
    ck_assert_uint_eq(got.n, n_want);
    /* llama.cpp records the smallest top-2 margin of the run; a margin under 1e-3 would let
     * an implementation legitimately flip that token, so only then may the ids part. */
    double margin = json_real_value(json_object_get(gj, "min_top2_logit_gap_llamacpp"));
    size_t agree = 0;
    while (agree < n_want && got.ids[agree] == want[agree])
        agree++;
    ck_assert_msg(agree == n_want || margin < 1e-3,
                  "%s: ids part at %zu of %zu (min margin %g)", kjv_slugs[_i], agree, n_want,
                  margin);
    gen_destroy(&g);
    free(ids);
    backend_destroy(&be);
    tokenizer_destroy(&tok);
    model_destroy(&m);
    json_decref(gj);
}
END_TEST

static Suite *golden_suite(void)
{
    Suite *s = suite_create("golden");
    TCase *tc = tcase_create("runc");
    tcase_set_timeout(tc, 300);
    int n = (int)(sizeof runc_cases / sizeof runc_cases[0]);
    tcase_add_loop_test(tc, test_prompt_ids, 0, n);
    tcase_add_loop_test(tc, test_stepwise_1thread, 0, n);
    tcase_add_loop_test(tc, test_stepwise_2threads, 0, n);
    tcase_add_loop_test(tc, test_each_layer, 0, n);
    tcase_add_loop_test(tc, test_batched_prefill, 0, n);
    tcase_add_loop_test(tc, test_generate_runc, 0, n);
    suite_add_tcase(s, tc);
    TCase *tk = tcase_create("llamacpp");
    tcase_set_timeout(tk, 300);
    tcase_add_loop_test(tk, test_kjv_llamacpp, 0, 3);
    suite_add_tcase(s, tk);
    return s;
}

RIVER_TEST_MAIN(golden_suite)
