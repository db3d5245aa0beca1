/* What the CUDA backend does beyond its ops (which are cases of tests/test_backend_ops.c's
 * one list): the upload slots that keep an op's host inputs on the device while their bytes
 * repeat, the error of a device that does not exist, and the stories260K goldens end to end
 * on the GPU, step by step and as CUDA graphs (the whole model, and the graph launches, are
 * no op case).
 *
 * Without the CUDA backend in the build, or without a GPU, every test prints one line
 * ("no CUDA device: CUDA parity tests skipped") and passes: CI builds this everywhere but
 * has no GPU. The GPU check is asked in each test (in Check's forked child), never in the
 * parent: a CUDA context made before fork() is unusable in the children.
 *
 * Errors are max |gpu - cpu| over max |cpu| of the output, as in tests/test_backend_ops.c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "kernels/cpu/cpu.h"
#include "tests/testutil.h"

#ifdef RIVER_CUDA
#include <jansson.h>

#include "engine/forward.h"
#include "engine/kv_pool.h"
#include "model/model.h"
#include "kernels/cuda/cuda.h"
#endif

#define SKIP_LINE "no CUDA device: CUDA parity tests skipped"

#ifndef RIVER_CUDA

START_TEST(test_skipped)
{
    TEST_SKIP(TEST_SKIP_NO_CUDA, "%s (built without the CUDA backend)", SKIP_LINE);
}
END_TEST

static Suite *cuda_ops_suite(void)
{
    Suite *s = suite_create("cuda_ops");
    TCase *tc = tcase_create("cuda");
    tcase_add_test(tc, test_skipped);
    suite_add_tcase(s, tc);
    return s;
}

#else

/* Returns from the test when there is no GPU, after the one line. */
#define NEED_GPU()                                                                           \
    do {                                                                                     \
        if (cuda_device_count() <= 0) {                                                      \
            TEST_SKIP(TEST_SKIP_NO_GPU, "%s (no GPU)", SKIP_LINE);                            \
            return;                                                                          \
        }                                                                                    \
    } while (0)

/* ---- fixtures --------------------------------------------------------------------------- */

static void fill(float *p, size_t n, float lo, float hi)
{
    for (size_t i = 0; i < n; i++)
        p[i] = test_rand(lo, hi);
}

typedef struct pair {
    backend_t *cpu, *gpu;
} pair_t;

static void pair_open(pair_t *p)
{
    /* The reference is exact f32 math: AVX-512, or the portable level (the AVX2 level
     * quantizes x to 8 bits for Q4/Q8 weights, beyond these tolerances). */
    int e = cpu_backend_new(&p->cpu, 0, cpu_simd_detect() >= CPU_SIMD_AVX512 ? CPU_SIMD_AVX512
                                                                              : CPU_SIMD_SCALAR);
    ck_assert_msg(e == 0, "cpu backend: %s", river_err_detail());
    e = cuda_backend_new(&p->gpu, 0);
    ck_assert_msg(e == 0, "cuda backend: %s", river_err_detail());
}

static void pair_close(pair_t *p)
{
    cuda_backend_destroy(&p->gpu);
    cpu_backend_destroy(&p->cpu);
}

/* A buffer on each backend holding the same n floats (host copy kept in h, if given). */
typedef struct twin {
    void *c, *g;
    size_t n;
} twin_t;

static twin_t twin_new(pair_t *p, const float *h, size_t n)
{
    twin_t t = {p->cpu->ops->buf_alloc(p->cpu->ctx, n), p->gpu->ops->buf_alloc(p->gpu->ctx, n),
                n};
    ck_assert_msg(t.c && t.g, "buffers of %zu: %s", n, river_err_detail());
    if (h) {
        ck_assert_int_eq(p->cpu->ops->from_host(p->cpu->ctx, t.c, 0, h, n), 0);
        ck_assert_int_eq(p->gpu->ops->from_host(p->gpu->ctx, t.g, 0, h, n), 0);
    }
    return t;
}

static twin_t twin_rand(pair_t *p, size_t n, float lo, float hi)
{
    float *h = malloc(n * sizeof *h);
    fill(h, n, lo, hi);
    twin_t t = twin_new(p, h, n);
    free(h);
    return t;
}

static void twin_free(pair_t *p, twin_t *t)
{
    p->cpu->ops->buf_free(p->cpu->ctx, t->c);
    p->gpu->ops->buf_free(p->gpu->ctx, t->g);
}

/* max |gpu - cpu| / max |cpu| over the twin (NaN counts as the worst). */
static double twin_err(pair_t *p, const twin_t *t)
{
    float *a = malloc(t->n * sizeof *a), *b = malloc(t->n * sizeof *b);
    ck_assert_int_eq(p->cpu->ops->to_host(p->cpu->ctx, a, t->c, 0, t->n), 0);
    int e = p->gpu->ops->to_host(p->gpu->ctx, b, t->g, 0, t->n);
    ck_assert_msg(e == 0, "to_host: %s", river_err_detail());
    double m = 0, d = 0;
    for (size_t i = 0; i < t->n; i++) {
        m = fabs(a[i]) > m ? fabs(a[i]) : m;
        double x = fabs((double)a[i] - b[i]);
        if (!(x <= d))
            d = x;
    }
    free(a);
    free(b);
    return m > 0 ? d / m : d;
}

#define CHECK_ERR(p, t, tol, ...)                                                            \
    do {                                                                                     \
        double err_ = twin_err(p, t);                                                        \
        char what_[160];                                                                     \
        snprintf(what_, sizeof what_, __VA_ARGS__);                                          \
        printf("cuda %-44s rel err %.3g (tol %.1g)\n", what_, err_, (double)(tol));          \
        ck_assert_msg(err_ <= (tol), "%s: rel err %g above %g", what_, err_, (double)(tol)); \
    } while (0)

/* The upload slots: an op's host inputs are copied once and then reused while their bytes
 * repeat, and an array changed in place is uploaded again (never a stale copy). */
START_TEST(test_upload_slots)
{
    NEED_GPU();
    pair_t p;
    pair_open(&p);
    int n = 3, heads = 4, hd = 16;
    int32_t pos[3] = {5, 9, 700};
    float inv_freq[8];
    for (int f = 0; f < 8; f++)
        inv_freq[f] = powf(10000.0f, -2.0f * (float)f / 16.0f);
    rope_t r = {.layout = ROPE_HALF, .head_dim = hd, .rot_dim = hd, .inv_freq = inv_freq,
                .attn_factor = 1.0f};
    twin_t x = twin_rand(&p, (size_t)n * heads * hd, -1, 1);
    uint64_t u0 = cuda_backend_uploads(p.gpu);
    ck_assert_int_eq(p.gpu->ops->rope(p.gpu->ctx, x.g, pos, n, heads, &r), 0);
    ck_assert_uint_eq(cuda_backend_uploads(p.gpu) - u0, 2); /* positions, frequencies */
    ck_assert_int_eq(p.cpu->ops->rope(p.cpu->ctx, x.c, pos, n, heads, &r), 0);
    /* The same inputs again (the next layer of a step): nothing is copied. */
    ck_assert_int_eq(p.gpu->ops->rope(p.gpu->ctx, x.g, pos, n, heads, &r), 0);
    ck_assert_int_eq(p.cpu->ops->rope(p.cpu->ctx, x.c, pos, n, heads, &r), 0);
    ck_assert_uint_eq(cuda_backend_uploads(p.gpu) - u0, 2);
    /* The next step: positions advanced in the same array, frequencies unchanged. */
    for (int i = 0; i < n; i++)
        pos[i]++;
    ck_assert_int_eq(p.gpu->ops->rope(p.gpu->ctx, x.g, pos, n, heads, &r), 0);
    ck_assert_int_eq(p.cpu->ops->rope(p.cpu->ctx, x.c, pos, n, heads, &r), 0);
    ck_assert_uint_eq(cuda_backend_uploads(p.gpu) - u0, 3);
    CHECK_ERR(&p, &x, 1e-5, "rope through the upload slots");
    twin_free(&p, &x);
    pair_close(&p);
}
END_TEST

START_TEST(test_no_device_message)
{
    /* With a GPU this checks the error path of a device that does not exist. */
    NEED_GPU();
    backend_t *b = NULL;
    int e = cuda_backend_new(&b, 1000);
    ck_assert_int_eq(e, RIVER_EDEVICE);
    ck_assert_ptr_null(b);
    ck_assert_msg(strstr(river_err_detail(), "no CUDA device") != NULL, "%s",
                  river_err_detail());
}
END_TEST

/* ---- end to end: stories260K goldens on the GPU ----------------------------------------- */

#define GOLDEN_DIR TEST_DATA "/stories260K/golden"
#define GOLDEN_TOL 1e-3f

START_TEST(test_golden_stories260k)
{
    NEED_GPU();
    model_t *m = NULL;
    backend_t *be = NULL;
    forward_t *fwd = NULL;
    kv_pool_t *kv = NULL;
    int e = model_load(&m, TEST_DATA "/stories260K/stories260K.bin");
    ck_assert_msg(e == 0, "load: %s", river_err_detail());
    /* Run 1 captures every decode step as a CUDA graph (each test runs in a child of its
     * own, so the variable ends with it). */
    if (_i)
        setenv("RIVER_CUDA_GRAPHS", "1", 1);
    else
        unsetenv("RIVER_CUDA_GRAPHS");
    ck_assert_int_eq(cuda_backend_new(&be, 0), 0);
    e = model_place(m, be);
    ck_assert_msg(e == 0, "upload: %s", river_err_detail());
    const model_config_t *c = &m->cfg;
    ck_assert_int_eq(forward_new(&fwd, m, be, 64), 0);
    ck_assert_int_eq(kv_pool_new(&kv, be, c->n_layers, c->n_kv_heads * c->head_dim, DTYPE_F32,
                                 16, 8), 0);
    /* Unwritten slots hold NaN, so reading one anywhere poisons the logits. */
    ck_assert_int_eq(kv_pool_fill(kv, NAN), 0);
    kv_seq_t seq;
    kv_seq_init(&seq);
    json_error_t je;
    json_t *golden = json_load_file(GOLDEN_DIR "/once_upon_a_time.json", 0, &je);
    ck_assert_msg(golden != NULL, "golden: %s", je.text);
    int steps = (int)json_integer_value(json_object_get(golden, "n_forward_steps"));
    size_t len = 0;
    float *want = test_read_file(GOLDEN_DIR "/once_upon_a_time.logits.f32", &len);
    ck_assert_ptr_nonnull(want);
    ck_assert_uint_eq(len, (size_t)steps * c->vocab_size * sizeof(float));
    json_t *pj = json_object_get(golden, "prompt_tokens");
    json_t *gj = json_object_get(golden, "generated_tokens");
    size_t n_prompt = json_array_size(pj);
    float *logits = malloc(sizeof *logits * (size_t)c->vocab_size);
    float worst = 0;
    int32_t token = (int32_t)json_integer_value(json_array_get(pj, 0));
    for (int i = 0; i < steps; i++) {
        ck_assert_int_eq(kv_seq_reserve(&seq, kv, i + 1), 0);
        int32_t pos = i, row = 0;
        const int32_t *table = seq.pages;
        fwd_batch_t b = {.n = 1, .tokens = &token, .pos = &pos, .page_table = &table,
                         .n_logits = 1, .logit_rows = &row};
        e = forward_step(fwd, kv, &b, logits);
        ck_assert_msg(e == 0, "step %d: %s", i, river_err_detail());
        float dl = 0;
        int best = 0;
        for (int v = 0; v < c->vocab_size; v++) {
            float d = fabsf(logits[v] - want[(size_t)i * c->vocab_size + v]);
            if (!(d <= dl))
                dl = d;
            if (logits[v] > logits[best])
                best = v;
        }
        ck_assert_msg(dl <= GOLDEN_TOL, "step %d: logits differ by %g", i, dl);
        worst = dl > worst ? dl : worst;
        if ((size_t)i + 1 < n_prompt) {
            token = (int32_t)json_integer_value(json_array_get(pj, (size_t)i + 1));
        } else {
            int32_t g = (int32_t)json_integer_value(json_array_get(gj, (size_t)i + 1 - n_prompt));
            ck_assert_msg(best == g, "step %d: token %d, golden %d", i, best, g);
            token = best;
        }
    }
    printf("cuda golden stories260K/once_upon_a_time%s: max |dlogit| %.3g (tol %g)\n",
           _i ? " (graphs)" : "", worst, (double)GOLDEN_TOL);
    uint64_t launches = cuda_backend_graph_launches(be);
    if (_i) {
        /* Steps of one shape replay one graph; a new one only where the shape changed. */
        ck_assert_msg(launches >= (uint64_t)steps / 2, "%llu graph launches in %d steps",
                      (unsigned long long)launches, steps);
        printf("cuda graphs: %llu launches in %d steps\n", (unsigned long long)launches, steps);
    } else {
        ck_assert_uint_eq(launches, 0);
    }
    free(logits);
    free(want);
    json_decref(golden);
    kv_seq_free(&seq, kv);
    kv_pool_destroy(&kv);
    forward_destroy(&fwd);
    cuda_backend_destroy(&be);
    model_destroy(&m);
}
END_TEST

static Suite *cuda_ops_suite(void)
{
    Suite *s = suite_create("cuda_ops");
    TCase *tc = tcase_create("cuda");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_upload_slots);
    tcase_add_test(tc, test_no_device_message);
    tcase_add_loop_test(tc, test_golden_stories260k, 0, 2);
    suite_add_tcase(s, tc);
    return s;
}

#endif

RIVER_TEST_MAIN(cuda_ops_suite)
