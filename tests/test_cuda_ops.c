/* The CUDA backend against the CPU backend (the reference), op by op on random inputs of
 * real model shapes (Llama 3.2 1B: dim 2048, 32 heads of 64, 8 KV heads, vocab 128256),
 * then end to end on the stories260K goldens.
 *
 * Without the CUDA backend in the build, or without a GPU, every test prints one line
 * ("no CUDA device: CUDA parity tests skipped") and passes: CI builds this everywhere but
 * has no GPU. The GPU check is asked in each test (in Check's forked child), never in the
 * parent: a CUDA context made before fork() is unusable in the children.
 *
 * Tolerances: errors are max |gpu - cpu| over max |cpu| of the output (so a tolerance is a
 * fraction of the output's scale). Both backends accumulate in f32 in different orders,
 * hence 1e-4 for f32 math; the cuBLAS path for 16-bit weights rounds x to the weight's
 * type first (GemmEx needs A and B of one type), hence 2e-3 (f16) and 1e-2 (bf16). Every
 * case prints its error so a GPU run shows the margins. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "kernels/cpu/cpu.h"
#include "kernels/half.h"
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
    printf("%s (built without the CUDA backend)\n", SKIP_LINE);
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
            printf("%s\n", SKIP_LINE);                                                       \
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

/* A host weight of random values (Q4/Q8: random codes, scales, zeros) and its device copy;
 * the host arrays are freed by weight_host_free, the device ones by the backend. */
static weight_t weight_rand(dtype_t dt, int64_t rows, int64_t cols, int group)
{
    weight_t w = {.dtype = dt, .rows = rows, .cols = cols};
    size_t n = (size_t)rows * (size_t)cols;
    if (dt == DTYPE_F32) {
        float *d = malloc(n * sizeof *d);
        fill(d, n, -0.05f, 0.05f);
        w.data = d;
    } else if (dt == DTYPE_F16 || dt == DTYPE_BF16) {
        uint16_t *d = malloc(n * sizeof *d);
        for (size_t i = 0; i < n; i++) {
            float v = test_rand(-0.05f, 0.05f);
            d[i] = dt == DTYPE_F16 ? f32_to_f16(v) : f32_to_bf16(v);
        }
        w.data = d;
    } else {
        size_t bytes = (size_t)rows * dtype_row_bytes(dt, cols);
        uint8_t *d = malloc(bytes);
        for (size_t i = 0; i < bytes; i++)
            d[i] = (uint8_t)test_rand_u32();
        size_t ng = (size_t)rows * (size_t)(cols / group);
        uint16_t *s = malloc(ng * sizeof *s), *z = malloc(ng * sizeof *z);
        float qmax = dt == DTYPE_Q4 ? 15.0f : 255.0f;
        for (size_t i = 0; i < ng; i++) {
            s[i] = f32_to_f16(test_rand(0.002f, 0.01f) * (dt == DTYPE_Q4 ? 8.0f : 0.5f));
            z[i] = f32_to_f16(test_rand(0.3f * qmax, 0.7f * qmax));
        }
        w.data = d;
        w.scales = s;
        w.zeros = z;
        w.group = group;
    }
    return w;
}

static void weight_host_free(weight_t *w)
{
    free((void *)w->data);
    free((void *)w->scales);
    free((void *)w->zeros);
}

static weight_t weight_upload(pair_t *p, const weight_t *w)
{
    weight_t d = *w;
    int e = cuda_backend_upload(p->gpu, &d);
    ck_assert_msg(e == 0, "upload: %s", river_err_detail());
    return d;
}

/* ---- tests ------------------------------------------------------------------------------ */

START_TEST(test_buffers)
{
    NEED_GPU();
    pair_t p;
    pair_open(&p);
    const ops_t *o = p.gpu->ops;
    size_t n = 1000;
    float *h = malloc(n * sizeof *h), *back = malloc(n * sizeof *back);
    void *b = o->buf_alloc(p.gpu->ctx, n);
    ck_assert_ptr_nonnull(b);
    ck_assert_int_eq(o->to_host(p.gpu->ctx, back, b, 0, n), 0);
    for (size_t i = 0; i < n; i++)
        ck_assert_msg(back[i] == 0.0f, "buffer not zero-filled at %zu", i);
    fill(h, n, -1, 1);
    ck_assert_int_eq(o->from_host(p.gpu->ctx, b, 10, h, n - 10), 0);
    ck_assert_int_eq(o->to_host(p.gpu->ctx, back, b, 10, n - 10), 0);
    ck_assert_int_eq(memcmp(h, back, (n - 10) * sizeof *h), 0);
    ck_assert_int_eq(o->sync(p.gpu->ctx), 0);
    o->buf_free(p.gpu->ctx, b);
    printf("cuda buffers on %s: round trip exact\n", cuda_backend_device_name(p.gpu));
    free(h);
    free(back);
    pair_close(&p);
}
END_TEST

typedef struct mm_case {
    dtype_t dt;
    int64_t rows, cols;
    int group;
    int n;
    double tol;
} mm_case_t;

static const mm_case_t mm_cases[] = {
    /* GEMV path (n <= 8) in every dtype, 1B projection shapes. */
    {DTYPE_F32, 2048, 2048, 0, 1, 1e-4},
    {DTYPE_F16, 2048, 2048, 0, 4, 1e-4},
    {DTYPE_BF16, 512, 2048, 0, 8, 1e-4},
    {DTYPE_BF16, 8192, 2048, 0, 1, 1e-4},
    {DTYPE_BF16, 2048, 8192, 0, 2, 1e-4},
    {DTYPE_Q8, 2048, 2048, 64, 1, 1e-4},
    {DTYPE_Q4, 2048, 2048, 32, 3, 1e-4},
    {DTYPE_Q4, 8192, 2048, 128, 8, 1e-4},
    /* Odd shapes and groups: the element-wise kernel. */
    {DTYPE_F32, 37, 100, 0, 5, 1e-4},
    {DTYPE_Q8, 33, 96, 12, 11, 1e-4},
    {DTYPE_Q4, 33, 96, 6, 2, 1e-4},
    /* cuBLAS path (n > 8): x rounded to the weight's 16-bit type. */
    {DTYPE_F32, 2048, 2048, 0, 64, 1e-4},
    {DTYPE_F16, 2048, 2048, 0, 9, 2e-3},
    {DTYPE_BF16, 8192, 2048, 0, 33, 1e-2},
    /* The LM head of Llama 3.2 1B. */
    {DTYPE_BF16, 128256, 2048, 0, 1, 1e-4},
    {DTYPE_BF16, 128256, 2048, 0, 16, 1e-2},
    /* Quantized batches run 8 rows per pass. */
    {DTYPE_Q4, 2048, 2048, 64, 20, 1e-4},
    /* Short and wide: split-K (K/V projection, FFN down of a decode step), with a tail
     * chunk (3000 and 4128 columns are no multiple of the split step). */
    {DTYPE_BF16, 512, 8192, 0, 1, 1e-4},
    {DTYPE_F16, 100, 3000, 0, 7, 1e-4},
    {DTYPE_F32, 64, 4104, 0, 3, 1e-4},
    {DTYPE_Q8, 256, 4096, 64, 5, 1e-4},
    /* W4A16 wide loads (16 bytes per lane), power-of-two and other groups, split-K. */
    {DTYPE_Q4, 512, 8192, 128, 3, 1e-4},
    {DTYPE_Q4, 64, 4128, 32, 2, 1e-4},
    {DTYPE_Q4, 300, 2016, 96, 9, 1e-4},
};

START_TEST(test_matmul)
{
    NEED_GPU();
    const mm_case_t *c = &mm_cases[_i];
    pair_t p;
    pair_open(&p);
    weight_t w = weight_rand(c->dt, c->rows, c->cols, c->group);
    weight_t dw = weight_upload(&p, &w);
    twin_t x = twin_rand(&p, (size_t)c->n * c->cols, -1, 1);
    twin_t y = twin_new(&p, NULL, (size_t)c->n * c->rows);
    ck_assert_int_eq(p.cpu->ops->matmul(p.cpu->ctx, y.c, x.c, &w, c->n), 0);
    int e = p.gpu->ops->matmul(p.gpu->ctx, y.g, x.g, &dw, c->n);
    ck_assert_msg(e == 0, "matmul: %s", river_err_detail());
    CHECK_ERR(&p, &y, c->tol, "matmul %s (%lld, %lld) g%d n %d", dtype_name(c->dt),
              (long long)c->rows, (long long)c->cols, c->group, c->n);
    twin_free(&p, &x);
    twin_free(&p, &y);
    weight_host_free(&w);
    pair_close(&p);
}
END_TEST

START_TEST(test_embed)
{
    NEED_GPU();
    static const dtype_t dts[] = {DTYPE_F32, DTYPE_F16, DTYPE_BF16, DTYPE_Q8, DTYPE_Q4};
    pair_t p;
    pair_open(&p);
    int32_t tokens[5] = {0, 7, 31999, 12345, 7};
    for (size_t k = 0; k < sizeof dts / sizeof dts[0]; k++) {
        weight_t w = weight_rand(dts[k], 32000, 2048, 64);
        weight_t dw = weight_upload(&p, &w);
        twin_t out = twin_new(&p, NULL, 5 * 2048);
        ck_assert_int_eq(p.cpu->ops->embed(p.cpu->ctx, out.c, &w, tokens, 5), 0);
        ck_assert_int_eq(p.gpu->ops->embed(p.gpu->ctx, out.g, &dw, tokens, 5), 0);
        CHECK_ERR(&p, &out, 0, "embed %s", dtype_name(dts[k]));
        int32_t bad = 32000;
        ck_assert_int_eq(p.gpu->ops->embed(p.gpu->ctx, out.g, &dw, &bad, 1), RIVER_ERANGE);
        twin_free(&p, &out);
        weight_host_free(&w);
    }
    pair_close(&p);
}
END_TEST

START_TEST(test_rmsnorm_add)
{
    NEED_GPU();
    pair_t p;
    pair_open(&p);
    int n = 5, d = 2048;
    static const dtype_t dts[] = {DTYPE_F32, DTYPE_BF16, DTYPE_F16};
    for (size_t k = 0; k < 3; k++) {
        weight_t w = weight_rand(dts[k], 1, d, 0);
        weight_t dw = weight_upload(&p, &w);
        twin_t x = twin_rand(&p, (size_t)n * d, -2, 2);
        twin_t out = twin_new(&p, NULL, (size_t)n * d);
        ck_assert_int_eq(p.cpu->ops->rmsnorm(p.cpu->ctx, out.c, x.c, &w, n, d, 1e-5f), 0);
        ck_assert_int_eq(p.gpu->ops->rmsnorm(p.gpu->ctx, out.g, x.g, &dw, n, d, 1e-5f), 0);
        CHECK_ERR(&p, &out, 1e-5, "rmsnorm %s", dtype_name(dts[k]));
        /* In place. */
        ck_assert_int_eq(p.cpu->ops->rmsnorm(p.cpu->ctx, x.c, x.c, &w, n, d, 1e-5f), 0);
        ck_assert_int_eq(p.gpu->ops->rmsnorm(p.gpu->ctx, x.g, x.g, &dw, n, d, 1e-5f), 0);
        CHECK_ERR(&p, &x, 1e-5, "rmsnorm in place %s", dtype_name(dts[k]));
        /* add_bias with the same vector, then add. */
        ck_assert_int_eq(p.cpu->ops->add_bias(p.cpu->ctx, out.c, &w, n, d), 0);
        ck_assert_int_eq(p.gpu->ops->add_bias(p.gpu->ctx, out.g, &dw, n, d), 0);
        CHECK_ERR(&p, &out, 1e-5, "add_bias %s", dtype_name(dts[k]));
        ck_assert_int_eq(p.cpu->ops->add(p.cpu->ctx, out.c, x.c, (size_t)n * d), 0);
        ck_assert_int_eq(p.gpu->ops->add(p.gpu->ctx, out.g, x.g, (size_t)n * d), 0);
        CHECK_ERR(&p, &out, 1e-5, "add after %s", dtype_name(dts[k]));
        twin_free(&p, &x);
        twin_free(&p, &out);
        weight_host_free(&w);
    }
    pair_close(&p);
}
END_TEST

START_TEST(test_rope_swiglu)
{
    NEED_GPU();
    pair_t p;
    pair_open(&p);
    int n = 4, heads = 32, hd = 64;
    int32_t pos[4] = {0, 7, 1000, 5000};
    float inv_freq[32];
    for (int layout = 0; layout < 2; layout++)
        for (int rot = 32; rot <= 64; rot += 32) {
            for (int f = 0; f < rot / 2; f++)
                inv_freq[f] = powf(500000.0f, -2.0f * (float)f / (float)rot);
            rope_t r = {.layout = (rope_layout_t)layout, .head_dim = hd, .rot_dim = rot,
                        .inv_freq = inv_freq, .attn_factor = rot == 32 ? 1.2f : 1.0f};
            twin_t x = twin_rand(&p, (size_t)n * heads * hd, -1, 1);
            ck_assert_int_eq(p.cpu->ops->rope(p.cpu->ctx, x.c, pos, n, heads, &r), 0);
            ck_assert_int_eq(p.gpu->ops->rope(p.gpu->ctx, x.g, pos, n, heads, &r), 0);
            CHECK_ERR(&p, &x, 1e-5, "rope layout %d rot %d", layout, rot);
            twin_free(&p, &x);
        }
    /* swiglu over a fused gate_up row (stride 2d). */
    int d = 8192;
    twin_t gu = twin_rand(&p, (size_t)n * 2 * d, -4, 4);
    twin_t out = twin_new(&p, NULL, (size_t)n * d);
    ck_assert_int_eq(p.cpu->ops->swiglu(p.cpu->ctx, out.c, gu.c, (float *)gu.c + d, n, d,
                                         2 * d), 0);
    ck_assert_int_eq(p.gpu->ops->swiglu(p.gpu->ctx, out.g, gu.g, (float *)gu.g + d, n, d,
                                         2 * d), 0);
    CHECK_ERR(&p, &out, 1e-5, "swiglu fused");
    twin_free(&p, &gu);
    twin_free(&p, &out);
    pair_close(&p);
}
END_TEST

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

/* The paged KV of both backends, written with kv_write from the same K/V, then attention
 * for prefill rows, decode rows of two sequences, and a kv_valid mask. */
START_TEST(test_kv_attention)
{
    NEED_GPU();
    pair_t p;
    pair_open(&p);
    enum { PS = 16, LAYERS = 2, NPAGES = 24, H = 32, KVH = 8, HD = 64, LEN_A = 150,
           LEN_B = 40 };
    int kv_dim = KVH * HD;
    kv_view_t vc = {.page_size = PS, .kv_dim = kv_dim, .n_pages = NPAGES,
                    .layer_stride = (int64_t)PS * kv_dim};
    vc.page_stride = LAYERS * vc.layer_stride;
    size_t kv_elems = (size_t)NPAGES * vc.page_stride;
    twin_t K = twin_new(&p, NULL, kv_elems), V = twin_new(&p, NULL, kv_elems);
    kv_view_t vg = vc;
    vc.k = K.c;
    vc.v = V.c;
    vg.k = K.g;
    vg.v = V.g;
    /* Shuffled pages: A gets 10 (150 positions), B gets 3 (40). */
    int32_t pt_a[10] = {5, 17, 2, 9, 23, 0, 11, 14, 3, 20};
    int32_t pt_b[3] = {8, 1, 19};
    const int layer = 1;
    float scale = 1.0f / sqrtf((float)HD);
    /* Prefill of A and B's K/V in one batch. */
    int n = LEN_A + LEN_B;
    int32_t *pos = malloc(sizeof *pos * (size_t)n);
    const int32_t **pts = malloc(sizeof *pts * (size_t)n);
    for (int i = 0; i < n; i++) {
        pos[i] = i < LEN_A ? i : i - LEN_A;
        pts[i] = i < LEN_A ? pt_a : pt_b;
    }
    attn_batch_t b = {.n = n, .pos = pos, .page_table = pts};
    twin_t k = twin_rand(&p, (size_t)n * kv_dim, -1, 1), v = twin_rand(&p, (size_t)n * kv_dim,
                                                                        -1, 1);
    ck_assert_int_eq(p.cpu->ops->kv_write(p.cpu->ctx, &vc, layer, &b, k.c, v.c), 0);
    ck_assert_int_eq(p.gpu->ops->kv_write(p.gpu->ctx, &vg, layer, &b, k.g, v.g), 0);
    CHECK_ERR(&p, &K, 0, "kv_write K");
    CHECK_ERR(&p, &V, 0, "kv_write V");
    /* Prefill attention over all rows; q larger than usual so the softmax is peaked. */
    twin_t q = twin_rand(&p, (size_t)n * H * HD, -3, 3);
    twin_t o = twin_new(&p, NULL, (size_t)n * H * HD);
    ck_assert_int_eq(p.cpu->ops->attention(p.cpu->ctx, o.c, q.c, &vc, layer, &b, H, KVH, HD,
                                            scale), 0);
    ck_assert_int_eq(p.gpu->ops->attention(p.gpu->ctx, o.g, q.g, &vg, layer, &b, H, KVH, HD,
                                            scale), 0);
    CHECK_ERR(&p, &o, 1e-4, "attention prefill %d rows", n);
    /* Decode: the last position of each sequence, out aliasing q. */
    int32_t dpos[2] = {LEN_A - 1, LEN_B - 1};
    const int32_t *dpt[2] = {pt_a, pt_b};
    attn_batch_t db = {.n = 2, .pos = dpos, .page_table = dpt};
    twin_t dq = twin_rand(&p, (size_t)2 * H * HD, -3, 3);
    ck_assert_int_eq(p.cpu->ops->attention(p.cpu->ctx, dq.c, dq.c, &vc, layer, &db, H, KVH,
                                            HD, scale), 0);
    ck_assert_int_eq(p.gpu->ops->attention(p.gpu->ctx, dq.g, dq.g, &vg, layer, &db, H, KVH,
                                            HD, scale), 0);
    CHECK_ERR(&p, &dq, 1e-4, "attention decode in place");
    /* kv_valid: A skips every third slot, B has every slot of this layer masked (out 0). */
    int stride = 160;
    uint8_t *va = calloc((size_t)LAYERS * stride, 1), *vb = calloc((size_t)LAYERS * stride, 1);
    for (int t = 0; t < stride; t++)
        va[layer * stride + t] = t % 3 != 1;
    const uint8_t *vmaps[2] = {va, vb};
    db.kv_valid = vmaps;
    db.kv_valid_stride = stride;
    twin_t mq = twin_rand(&p, (size_t)2 * H * HD, -3, 3);
    twin_t mo = twin_new(&p, NULL, (size_t)2 * H * HD);
    ck_assert_int_eq(p.cpu->ops->attention(p.cpu->ctx, mo.c, mq.c, &vc, layer, &db, H, KVH,
                                            HD, scale), 0);
    ck_assert_int_eq(p.gpu->ops->attention(p.gpu->ctx, mo.g, mq.g, &vg, layer, &db, H, KVH,
                                            HD, scale), 0);
    CHECK_ERR(&p, &mo, 1e-4, "attention kv_valid");
    /* A page outside the pool is refused before anything runs. */
    int32_t bad_pt[1] = {NPAGES};
    const int32_t *bpt[1] = {bad_pt};
    int32_t bpos[1] = {0};
    attn_batch_t bb = {.n = 1, .pos = bpos, .page_table = bpt};
    ck_assert_int_eq(p.gpu->ops->attention(p.gpu->ctx, mo.g, mq.g, &vg, layer, &bb, H, KVH, HD,
                                            scale), RIVER_ERANGE);
    ck_assert_int_eq(p.gpu->ops->kv_write(p.gpu->ctx, &vg, layer, &bb, k.g, v.g), RIVER_ERANGE);
    free(va);
    free(vb);
    free(pos);
    free(pts);
    twin_t *all[] = {&K, &V, &k, &v, &q, &o, &dq, &mq, &mo};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        twin_free(&p, all[i]);
    pair_close(&p);
}
END_TEST

/* Attention shapes beyond Llama 3.2 1B: head dims 96 and 128, GQA groups 1 and 8 (and 16,
 * two head chunks per KV head), contexts above 1k (split across blocks, flash-decoding)
 * and row counts that are not a multiple of 8, for decode rows at the end of long
 * sequences and for a batched prompt. */
typedef struct attn_case {
    int hd, heads, kv_heads, len, n_seqs;
    int prefill; /* 1: every position of each sequence is a row; 0: its last one only */
} attn_case_t;

static const attn_case_t attn_cases[] = {
    {128, 32, 8, 1500, 3, 0},   /* GQA 4, three decode rows, 1.5k context */
    {128, 8, 8, 2048, 5, 0},    /* GQA 1 (MHA), 2k context */
    {96, 32, 4, 1100, 7, 0},    /* head_dim 96, GQA 8 */
    {64, 32, 2, 1030, 1, 0},    /* GQA 16: two head chunks per KV head */
    {128, 16, 2, 77, 3, 1},     /* batched prompt of 231 rows, GQA 8 */
    {96, 12, 12, 1025, 1, 1},   /* a 1k prompt of one sequence, GQA 1 */
};

START_TEST(test_attention_shapes)
{
    NEED_GPU();
    const attn_case_t *c = &attn_cases[_i];
    pair_t p;
    pair_open(&p);
    enum { PS = 16 };
    int kv_dim = c->kv_heads * c->hd;
    int pages_per = (c->len + PS - 1) / PS;
    int n_pages = pages_per * c->n_seqs + 3;
    kv_view_t vc = {.page_size = PS, .kv_dim = kv_dim, .n_pages = n_pages,
                    .layer_stride = (int64_t)PS * kv_dim};
    vc.page_stride = vc.layer_stride; /* one layer */
    size_t kv_elems = (size_t)n_pages * (size_t)vc.page_stride;
    twin_t K = twin_rand(&p, kv_elems, -1, 1), V = twin_rand(&p, kv_elems, -1, 1);
    kv_view_t vg = vc;
    vc.k = K.c;
    vc.v = V.c;
    vg.k = K.g;
    vg.v = V.g;
    /* Sequence s owns pages s, s + n_seqs, s + 2 n_seqs, ... (interleaved, not in order). */
    int32_t *pt = malloc(sizeof *pt * (size_t)pages_per * (size_t)c->n_seqs);
    for (int s = 0; s < c->n_seqs; s++)
        for (int j = 0; j < pages_per; j++)
            pt[s * pages_per + j] = (int32_t)(n_pages - 1 - (j * c->n_seqs + s));
    /* Sequence s has len - 13 s positions, so the rows' contexts differ. */
    int n = 0;
    for (int s = 0; s < c->n_seqs; s++)
        n += c->prefill ? c->len - 13 * s : 1;
    int32_t *pos = malloc(sizeof *pos * (size_t)n);
    const int32_t **pts = malloc(sizeof *pts * (size_t)n);
    int r = 0;
    for (int s = 0; s < c->n_seqs; s++) {
        int len = c->len - 13 * s;
        for (int t = c->prefill ? 0 : len - 1; t < len; t++) {
            pos[r] = t;
            pts[r++] = pt + s * pages_per;
        }
    }
    attn_batch_t b = {.n = n, .pos = pos, .page_table = pts};
    size_t qn = (size_t)n * (size_t)c->heads * (size_t)c->hd;
    twin_t q = twin_rand(&p, qn, -3, 3), o = twin_new(&p, NULL, qn);
    float scale = 1.0f / sqrtf((float)c->hd);
    ck_assert_int_eq(p.cpu->ops->attention(p.cpu->ctx, o.c, q.c, &vc, 0, &b, c->heads,
                                            c->kv_heads, c->hd, scale), 0);
    int e = p.gpu->ops->attention(p.gpu->ctx, o.g, q.g, &vg, 0, &b, c->heads, c->kv_heads,
                                  c->hd, scale);
    ck_assert_msg(e == 0, "attention: %s", river_err_detail());
    CHECK_ERR(&p, &o, 1e-4, "attention hd %d, %d/%d heads, len %d, %d rows", c->hd, c->heads,
              c->kv_heads, c->len, n);
    /* In place (out = q), as the engine may call it. */
    ck_assert_int_eq(p.cpu->ops->attention(p.cpu->ctx, q.c, q.c, &vc, 0, &b, c->heads,
                                            c->kv_heads, c->hd, scale), 0);
    ck_assert_int_eq(p.gpu->ops->attention(p.gpu->ctx, q.g, q.g, &vg, 0, &b, c->heads,
                                            c->kv_heads, c->hd, scale), 0);
    CHECK_ERR(&p, &q, 1e-4, "attention in place hd %d, len %d", c->hd, c->len);
    free(pos);
    free(pts);
    free(pt);
    twin_t *all[] = {&K, &V, &q, &o};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        twin_free(&p, all[i]);
    pair_close(&p);
}
END_TEST

START_TEST(test_cosine_gather_scatter)
{
    NEED_GPU();
    pair_t p;
    pair_open(&p);
    int n = 6, d = 2048;
    twin_t a = twin_rand(&p, (size_t)n * d, -1, 1), b = twin_rand(&p, (size_t)n * d, -1, 1);
    /* Row 2 of a is zero: cosine 0 on both. */
    float *zero = calloc((size_t)d, sizeof *zero);
    ck_assert_int_eq(p.cpu->ops->from_host(p.cpu->ctx, a.c, 2 * (size_t)d, zero, (size_t)d), 0);
    ck_assert_int_eq(p.gpu->ops->from_host(p.gpu->ctx, a.g, 2 * (size_t)d, zero, (size_t)d), 0);
    float cc[6], cg[6];
    ck_assert_int_eq(p.cpu->ops->cosine(p.cpu->ctx, cc, a.c, b.c, n, d), 0);
    ck_assert_int_eq(p.gpu->ops->cosine(p.gpu->ctx, cg, a.g, b.g, n, d), 0);
    for (int i = 0; i < n; i++)
        ck_assert_msg(fabsf(cc[i] - cg[i]) <= 1e-5f, "cosine row %d: %g vs %g", i, cc[i],
                      cg[i]);
    ck_assert(cg[2] == 0.0f);
    int32_t idx[3] = {5, 0, 3};
    twin_t g = twin_new(&p, NULL, (size_t)3 * d);
    ck_assert_int_eq(p.cpu->ops->gather_rows(p.cpu->ctx, g.c, a.c, idx, 3, d), 0);
    ck_assert_int_eq(p.gpu->ops->gather_rows(p.gpu->ctx, g.g, a.g, idx, 3, d), 0);
    CHECK_ERR(&p, &g, 0, "gather_rows");
    ck_assert_int_eq(p.cpu->ops->scatter_rows(p.cpu->ctx, b.c, g.c, idx, 3, d), 0);
    ck_assert_int_eq(p.gpu->ops->scatter_rows(p.gpu->ctx, b.g, g.g, idx, 3, d), 0);
    CHECK_ERR(&p, &b, 0, "scatter_rows");
    int32_t bad = -1;
    ck_assert_int_eq(p.gpu->ops->gather_rows(p.gpu->ctx, g.g, a.g, &bad, 1, d), RIVER_ERANGE);
    free(zero);
    twin_free(&p, &a);
    twin_free(&p, &b);
    twin_free(&p, &g);
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
    ck_assert_int_eq(kv_pool_new(&kv, be, c->n_layers, c->n_kv_heads * c->head_dim, 16, 8), 0);
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
    tcase_add_test(tc, test_buffers);
    tcase_add_loop_test(tc, test_matmul, 0, (int)(sizeof mm_cases / sizeof mm_cases[0]));
    tcase_add_test(tc, test_embed);
    tcase_add_test(tc, test_rmsnorm_add);
    tcase_add_test(tc, test_rope_swiglu);
    tcase_add_test(tc, test_upload_slots);
    tcase_add_test(tc, test_kv_attention);
    tcase_add_loop_test(tc, test_attention_shapes, 0,
                        (int)(sizeof attn_cases / sizeof attn_cases[0]));
    tcase_add_test(tc, test_cosine_gather_scatter);
    tcase_add_test(tc, test_no_device_message);
    tcase_add_loop_test(tc, test_golden_stories260k, 0, 2);
    suite_add_tcase(s, tc);
    return s;
}

#endif

RIVER_TEST_MAIN(cuda_ops_suite)
