/* The CPU backend's ops against plain reference loops written here, for every SIMD level
 * this processor has (scalar, AVX2, AVX-512) and for one and two threads. Inputs are random
 * and the shapes include odd sizes, so that vector tails, tile remainders and the split of
 * work between threads are all exercised. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/err.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/q4x8.h"
#include "kernels/half.h"
#include "tests/testutil.h"

/* Checks inside long loops: Check records every passing ck_assert (a write to its log), so
 * hot loops only call into it on failure. */
#define EXPECT(cond, ...)                                                                    \
    do {                                                                                     \
        if (!(cond))                                                                         \
            ck_abort_msg(__VA_ARGS__);                                                       \
    } while (0)
#define EXPECT_TRUE(cond) EXPECT(cond, "assertion '%s' failed", #cond)

/* ---- random data and reference conversions --------------------------------------------- */

static void fill(float *p, size_t n, float lo, float hi)
{
    for (size_t i = 0; i < n; i++)
        p[i] = test_rand(lo, hi);
}

/* Widening written independently of kernels/half.h. */
static float ref_bf16(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static float ref_f16(uint16_t h)
{
    int e = (h >> 10) & 31, m = h & 1023;
    float v = e == 0 ? ldexpf((float)m, -24) : ldexpf((float)(m + 1024), e - 25);
    return (h & 0x8000) ? -v : v;
}

/* ---- backends: loop tests run index i as level i/2 with 1 + i%2 threads ---------------- */

#define N_CONFIGS (2 * CPU_SIMD_COUNT)

typedef struct env {
    backend_t *be;
    const ops_t *o;
    ops_ctx_t *c;
    int level, threads;
} env_t;

/* Opens configuration i; 0 when this processor lacks its level (nothing to test). */
static int env_open(env_t *e, int i)
{
    e->level = i / 2;
    e->threads = 1 + i % 2;
    if (e->level > (int)cpu_simd_detect())
        return 0;
    ck_assert_int_eq(cpu_backend_new(&e->be, e->threads, (cpu_simd_t)e->level), 0);
    ck_assert_int_eq(cpu_backend_threads(e->be), e->threads);
    e->o = e->be->ops;
    e->c = e->be->ctx;
    return 1;
}

static void env_close(env_t *e)
{
    cpu_backend_destroy(&e->be);
    ck_assert_ptr_null(e->be);
}

/* A buffer holding a copy of n host floats. */
static float *dev_copy(env_t *e, const float *src, size_t n)
{
    float *b = e->o->buf_alloc(e->c, n ? n : 1);
    ck_assert_ptr_nonnull(b);
    ck_assert_int_eq(e->o->from_host(e->c, b, 0, src, n), 0);
    return b;
}

static float *host_copy(env_t *e, const float *buf, size_t n)
{
    float *h = malloc((n ? n : 1) * sizeof(float));
    ck_assert_ptr_nonnull(h);
    ck_assert_int_eq(e->o->to_host(e->c, h, buf, 0, n), 0);
    return h;
}

/* ---- test weights with their dequantised reference values ------------------------------ */

typedef struct tw {
    weight_t w;
    void *data;
    uint16_t *scales, *zeros;
    float *ref; /* rows x cols */
} tw_t;

static void tw_make(tw_t *t, dtype_t dt, int64_t rows, int64_t cols, int group)
{
    memset(t, 0, sizeof *t);
    size_t n = (size_t)(rows * cols);
    t->ref = malloc(n * sizeof(float));
    ck_assert_ptr_nonnull(t->ref);
    size_t rb = dtype_row_bytes(dt, cols);
    t->data = calloc((size_t)rows, rb);
    ck_assert_ptr_nonnull(t->data);
    t->w = (weight_t){ .dtype = dt, .rows = rows, .cols = cols, .data = t->data };
    for (int64_t r = 0; r < rows; r++) {
        uint8_t *row = (uint8_t *)t->data + r * rb;
        for (int64_t k = 0; k < cols; k++) {
            float v = test_rand(-1.0f, 1.0f);
            float *ref = &t->ref[r * cols + k];
            switch (dt) {
            case DTYPE_F32:
                ((float *)row)[k] = v;
                *ref = v;
                break;
            case DTYPE_F16:
                ((uint16_t *)row)[k] = f32_to_f16(v);
                *ref = ref_f16(((uint16_t *)row)[k]);
                break;
            case DTYPE_BF16:
                ((uint16_t *)row)[k] = f32_to_bf16(v);
                *ref = ref_bf16(((uint16_t *)row)[k]);
                break;
            case DTYPE_Q8:
                row[k] = (uint8_t)(test_rand_u32() & 0xff);
                break;
            case DTYPE_Q4: {
                unsigned q = test_rand_u32() & 0x0f;
                row[k / 2] |= (uint8_t)((k & 1) ? q << 4 : q);
                break;
            }
            default:
                ck_abort_msg("bad dtype");
            }
        }
    }
    if (dt == DTYPE_Q4 || dt == DTYPE_Q8) {
        int64_t ng = cols / group;
        float qmax = dt == DTYPE_Q4 ? 15.0f : 255.0f;
        t->scales = malloc((size_t)(rows * ng) * sizeof(uint16_t));
        t->zeros = malloc((size_t)(rows * ng) * sizeof(uint16_t));
        ck_assert(t->scales && t->zeros);
        for (int64_t i = 0; i < rows * ng; i++) {
            t->scales[i] = f32_to_f16(test_rand(0.001f, 0.05f));
            t->zeros[i] = f32_to_f16(test_rand(0.0f, qmax));
        }
        for (int64_t r = 0; r < rows; r++) {
            const uint8_t *row = (const uint8_t *)t->data + r * rb;
            for (int64_t k = 0; k < cols; k++) {
                unsigned q = dt == DTYPE_Q8 ? row[k] : (k & 1) ? row[k / 2] >> 4 : row[k / 2] & 15;
                float s = ref_f16(t->scales[r * ng + k / group]);
                float z = ref_f16(t->zeros[r * ng + k / group]);
                t->ref[r * cols + k] = ((float)q - z) * s;
            }
        }
        t->w.scales = t->scales;
        t->w.zeros = t->zeros;
        t->w.group = group;
    }
}

static void tw_free(tw_t *t)
{
    free(t->data);
    free(t->scales);
    free(t->zeros);
    free(t->ref);
}

/* ---- matmul ----------------------------------------------------------------------------- */

/* Checks y (n, rows) = x W^T against a double-precision reference: the error may be 1e-5
 * of the sum of |w x| (a relative bound that stays meaningful under cancellation). */
/* Whether a matmul at this level takes x as 8-bit blocks (the AVX2 decode path of Q4/Q8
 * groups of whole 32-column blocks, up to 16 rows; kernels_avx2.c). */
static int mm_x8(const env_t *e, const weight_t *w, int n)
{
    if (w->dtype == DTYPE_Q4X8) /* both SIMD levels, blocks of 32 */
        return e->level >= CPU_SIMD_AVX2 && n <= 16;
    return e->level == CPU_SIMD_AVX2 && (w->dtype == DTYPE_Q4 || w->dtype == DTYPE_Q8) &&
           w->group % 32 == 0 && n <= 16;
}

/* x quantized as the 8-bit path does, written here from its definition: per block of xb
 * columns (64 where the group allows, else 32) d = max|x| / 127 and
 * x8 = round-to-even(x * (127 / max|x|)); xd = d * x8. half_step gets each element's
 * bound max|x| / 254 (the caller weighs it with |w|). */
static void mm_quantize_x(const float *x, int64_t cols, int xb, float *xd, float *half_step)
{
    for (int64_t b = 0; b < cols; b += xb) {
        float amax = 0.0f;
        for (int k = 0; k < xb; k++)
            amax = fmaxf(amax, fabsf(x[b + k]));
        float id = amax > 0.0f ? 127.0f / amax : 0.0f, d = amax / 127.0f;
        for (int k = 0; k < xb; k++) {
            xd[b + k] = d * nearbyintf(x[b + k] * id);
            half_step[b + k] = amax / 254.0f;
        }
    }
}

static void check_matmul(env_t *e, const tw_t *t, int n)
{
    int64_t rows = t->w.rows, cols = t->w.cols;
    float *xh = malloc((size_t)(n * cols) * sizeof(float));
    float *xd = malloc((size_t)(n * cols) * sizeof(float));
    float *hs = malloc((size_t)(n * cols) * sizeof(float));
    ck_assert_ptr_nonnull(xh);
    ck_assert_ptr_nonnull(xd);
    ck_assert_ptr_nonnull(hs);
    fill(xh, (size_t)(n * cols), -1.0f, 1.0f);
    int x8 = mm_x8(e, &t->w, n);
    if (x8)
        for (int i = 0; i < n; i++)
            mm_quantize_x(xh + i * cols, cols,
                          t->w.dtype != DTYPE_Q4X8 && t->w.group % 64 == 0 ? 64 : 32,
                          xd + i * cols, hs + i * cols);
    float *x = dev_copy(e, xh, (size_t)(n * cols));
    float *y = e->o->buf_alloc(e->c, (size_t)(n * rows));
    ck_assert_ptr_nonnull(y);
    ck_assert_int_eq(e->o->matmul(e->c, y, x, &t->w, n), 0);
    float *yh = host_copy(e, y, (size_t)(n * rows));
    for (int i = 0; i < n; i++)
        for (int64_t r = 0; r < rows; r++) {
            double acc = 0.0, mag = 0.0, accq = 0.0, magq = 0.0, bound = 0.0;
            for (int64_t k = 0; k < cols; k++) {
                double wk = t->ref[r * cols + k];
                double p = wk * xh[i * cols + k];
                acc += p;
                mag += fabs(p);
                if (x8) {
                    accq += wk * xd[i * cols + k];
                    magq += fabs(wk * xd[i * cols + k]);
                    bound += fabs(wk) * hs[i * cols + k];
                }
            }
            double got = yh[i * rows + r];
            /* The 8-bit path: exact against x as it quantizes it (f32 rounding aside), and
             * within the stated bound of the exact result. */
            EXPECT(!x8 || fabs(got - accq) <= 1e-5 * (magq + mag) + 1e-30,
                   "matmul %s %s x8 thr %d: (%lld x %lld) n %d: y[%d][%lld] = %.9g, want %.9g",
                   cpu_simd_name((cpu_simd_t)e->level), dtype_name(t->w.dtype), e->threads,
                   (long long)rows, (long long)cols, n, i, (long long)r, got, accq);
            double tol = x8 ? bound + 1e-5 * mag : 1e-5 * mag;
            double err = fabs(got - acc);
            EXPECT(err <= tol + 1e-30, "matmul %s %s thr %d: (%lld x %lld) n %d: y[%d][%lld] = "
                   "%.9g, want %.9g (tolerance %.3g)", cpu_simd_name((cpu_simd_t)e->level),
                   dtype_name(t->w.dtype), e->threads, (long long)rows, (long long)cols, n, i,
                   (long long)r, got, acc, tol);
        }
    e->o->buf_free(e->c, x);
    e->o->buf_free(e->c, y);
    free(xh);
    free(xd);
    free(hs);
    free(yh);
}

static const int mm_ns[] = { 1, 2, 3, 4, 5, 8, 9, 16, 17, 40, 70 };

START_TEST(test_matmul_float)
{
    env_t e;
    if (!env_open(&e, _i))
        return;
    static const int64_t shapes[][2] = { { 1, 1 },   { 5, 3 },    { 17, 172 }, { 64, 64 },
                                         { 37, 384 }, { 200, 384 }, { 100, 2051 } };
    static const dtype_t dts[] = { DTYPE_F32, DTYPE_F16, DTYPE_BF16 };
    for (size_t d = 0; d < 3; d++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            tw_t t;
            tw_make(&t, dts[d], shapes[s][0], shapes[s][1], 0);
            for (size_t k = 0; k < sizeof mm_ns / sizeof mm_ns[0]; k++)
                check_matmul(&e, &t, mm_ns[k]);
            tw_free(&t);
        }
    env_close(&e);
}
END_TEST

START_TEST(test_matmul_quant)
{
    env_t e;
    if (!env_open(&e, _i))
        return;
    /* rows, cols, group: groups of 16/32/64/128 take the SIMD paths, 6 and 10 the portable
     * fallback. */
    static const int64_t shapes[][3] = { { 1, 16, 16 },   { 7, 32, 16 },  { 20, 64, 32 },
                                         { 37, 384, 64 }, { 200, 384, 128 }, { 13, 96, 48 },
                                         { 9, 60, 6 },    { 5, 30, 10 },  { 11, 640, 32 },
                                         { 5, 1024, 16 }, { 19, 288, 96 }, { 23, 352, 32 },
                                         { 3, 2304, 64 },  { 9, 160, 160 } };
    static const dtype_t dts[] = { DTYPE_Q8, DTYPE_Q4 };
    for (size_t d = 0; d < 2; d++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            tw_t t;
            tw_make(&t, dts[d], shapes[s][0], shapes[s][1], (int)shapes[s][2]);
            for (size_t k = 0; k < sizeof mm_ns / sizeof mm_ns[0]; k++)
                check_matmul(&e, &t, mm_ns[k]);
            tw_free(&t);
        }
    env_close(&e);
}
END_TEST

/* Q4X8, the CPU backend's repacked Q4 (kernels/cpu/q4x8.h): every level reads it (the
 * scalar one through its generic path, which makes it the reference of the layout), the
 * SIMD levels repack eligible weights when they are placed, and the results meet the same
 * bounds as Q4. */
START_TEST(test_matmul_q4x8)
{
    env_t e;
    if (!env_open(&e, _i))
        return;
    static const int64_t shapes[][3] = { { 8, 256, 32 },  { 37, 512, 64 }, { 13, 768, 128 },
                                         { 9, 1024, 256 }, { 5, 2048, 512 }, { 19, 256, 64 },
                                         { 1, 512, 32 } };
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        tw_t t;
        tw_make(&t, DTYPE_Q4, shapes[s][0], shapes[s][1], (int)shapes[s][2]);
        ck_assert(cpu_q4x8_eligible(&t.w));
        size_t bytes = dtype_row_bytes(DTYPE_Q4, t.w.cols) * (size_t)t.w.rows;
        uint8_t *packed = malloc(bytes);
        ck_assert_ptr_nonnull(packed);
        cpu_q4x8_repack(&t.w, packed);
        /* The layout: column k is where cpu_q4x8_byte says. */
        for (int64_t r = 0; r < t.w.rows; r++)
            for (int64_t k = 0; k < t.w.cols; k++) {
                const uint8_t *src = (const uint8_t *)t.data + r * (int64_t)(bytes / t.w.rows);
                unsigned q = (k & 1) ? src[k / 2] >> 4 : src[k / 2] & 15;
                int high;
                uint8_t b = packed[r * (int64_t)(bytes / t.w.rows) + cpu_q4x8_byte(k, &high)];
                ck_assert_uint_eq(high ? b >> 4 : b & 15, q);
            }
        tw_t p = t;
        p.w.data = packed;
        p.w.dtype = DTYPE_Q4X8;
        for (size_t k = 0; k < sizeof mm_ns / sizeof mm_ns[0]; k++)
            check_matmul(&e, &p, mm_ns[k]);
        /* Placement repacks where the level has the kernel. */
        weight_t up = t.w;
        ck_assert_int_eq(e.o->weight_upload(e.c, &up), 0);
        ck_assert_int_eq(up.dtype, e.level >= CPU_SIMD_AVX2 ? DTYPE_Q4X8 : DTYPE_Q4);
        if (up.dtype == DTYPE_Q4X8)
            ck_assert_mem_eq(up.data, packed, bytes);
        free(packed);
        tw_free(&t);
    }
    /* Not eligible: columns that are no multiple of 256, or a group of 96. */
    tw_t t;
    tw_make(&t, DTYPE_Q4, 4, 384, 64);
    ck_assert(!cpu_q4x8_eligible(&t.w));
    weight_t up = t.w;
    ck_assert_int_eq(e.o->weight_upload(e.c, &up), 0);
    ck_assert_int_eq(up.dtype, DTYPE_Q4);
    tw_free(&t);
    tw_make(&t, DTYPE_Q4, 4, 768, 96);
    ck_assert(!cpu_q4x8_eligible(&t.w));
    tw_free(&t);
    env_close(&e);
}
END_TEST

START_TEST(test_matmul_errors)
{
    env_t e;
    if (!env_open(&e, _i))
        return;
    tw_t t;
    tw_make(&t, DTYPE_Q4, 4, 32, 16);
    float *x = e.o->buf_alloc(e.c, 64), *y = e.o->buf_alloc(e.c, 64);
    t.w.group = 5; /* odd for Q4 and not dividing cols */
    ck_assert_int_eq(e.o->matmul(e.c, y, x, &t.w, 1), RIVER_EFORMAT);
    t.w.group = 16;
    t.w.scales = NULL;
    ck_assert_int_eq(e.o->matmul(e.c, y, x, &t.w, 1), RIVER_EFORMAT);
    t.w.scales = t.scales;
    ck_assert_int_eq(e.o->matmul(e.c, y, x, &t.w, -1), RIVER_EINVAL);
    ck_assert_int_eq(e.o->matmul(e.c, y, x, &t.w, 0), 0);
    weight_t bad = t.w;
    bad.dtype = DTYPE_COUNT;
    ck_assert_int_eq(e.o->matmul(e.c, y, x, &bad, 1), RIVER_EDTYPE);
    e.o->buf_free(e.c, x);
    e.o->buf_free(e.c, y);
    tw_free(&t);
    env_close(&e);
}
END_TEST

/* ---- embed ------------------------------------------------------------------------------ */

START_TEST(test_embed)
{
    env_t e;
    if (!env_open(&e, _i))
        return;
    static const dtype_t dts[] = { DTYPE_F32, DTYPE_F16, DTYPE_BF16, DTYPE_Q8, DTYPE_Q4 };
    static const int64_t dims[] = { 1, 7, 64, 173 };
    for (size_t d = 0; d < 5; d++)
        for (size_t s = 0; s < 4; s++) {
            int64_t dim = dims[s];
            int group = 0;
            if (dts[d] == DTYPE_Q8 || dts[d] == DTYPE_Q4) {
                dim = s == 3 ? 96 : 16 * (int64_t)(s + 1);
                group = s == 0 ? 8 : 16;
            }
            tw_t t;
            tw_make(&t, dts[d], 50, dim, group);
            int32_t tokens[6] = { 3, 0, 49, 3, 17, 25 };
            float *out = e.o->buf_alloc(e.c, (size_t)(6 * dim));
            ck_assert_int_eq(e.o->embed(e.c, out, &t.w, tokens, 6), 0);
            float *h = host_copy(&e, out, (size_t)(6 * dim));
            for (int i = 0; i < 6; i++)
                for (int64_t k = 0; k < dim; k++)
                    EXPECT(h[i * dim + k] == t.ref[tokens[i] * dim + k],
                                  "embed %s: row %d col %lld", dtype_name(dts[d]), i,
                                  (long long)k);
            int32_t bad[2] = { 1, 50 };
            ck_assert_int_eq(e.o->embed(e.c, out, &t.w, bad, 2), RIVER_ERANGE);
            bad[1] = -1;
            ck_assert_int_eq(e.o->embed(e.c, out, &t.w, bad, 2), RIVER_ERANGE);
            free(h);
            e.o->buf_free(e.c, out);
            tw_free(&t);
        }
    env_close(&e);
}
END_TEST

/* ---- rmsnorm, add_bias, add ------------------------------------------------------------- */

START_TEST(test_rmsnorm)
{
    env_t e;
    if (!env_open(&e, _i))
        return;
    static const int shapes[][2] = { { 1, 1 }, { 3, 7 }, { 5, 64 }, { 2, 1000 }, { 300, 260 } };
    for (int wdt = 0; wdt < 2; wdt++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            int n = shapes[s][0], d = shapes[s][1];
            tw_t t;
            tw_make(&t, wdt ? DTYPE_BF16 : DTYPE_F32, 1, d, 0);
            float *xh = malloc((size_t)n * d * sizeof(float));
            fill(xh, (size_t)n * d, -3.0f, 3.0f);
            float *x = dev_copy(&e, xh, (size_t)n * d);
            float *out = e.o->buf_alloc(e.c, (size_t)n * d);
            const float eps = 1e-5f;
            ck_assert_int_eq(e.o->rmsnorm(e.c, out, x, &t.w, n, d, eps), 0);
            float *h = host_copy(&e, out, (size_t)n * d);
            /* In place too: the op allows out == x. */
            ck_assert_int_eq(e.o->rmsnorm(e.c, x, x, &t.w, n, d, eps), 0);
            float *h2 = host_copy(&e, x, (size_t)n * d);
            for (int i = 0; i < n; i++) {
                float ss = 0.0f;
                for (int k = 0; k < d; k++)
                    ss += xh[i * d + k] * xh[i * d + k];
                ss /= (float)d;
                ss += eps;
                ss = 1.0f / sqrtf(ss);
                for (int k = 0; k < d; k++) {
                    float want = t.ref[k] * (ss * xh[i * d + k]);
                    EXPECT(fabsf(h[i * d + k] - want) <= 1e-5f * fabsf(want) + 1e-7f,
                                  "rmsnorm (%d, %d): [%d][%d] = %g, want %g", n, d, i, k,
                                  h[i * d + k], want);
                    EXPECT_TRUE(h2[i * d + k] == h[i * d + k]);
                }
            }
            weight_t wrong = t.w;
            wrong.cols = d + 1;
            ck_assert_int_eq(e.o->rmsnorm(e.c, out, x, &wrong, n, d, eps), RIVER_ESHAPE);
            free(xh);
            free(h);
            free(h2);
            e.o->buf_free(e.c, x);
            e.o->buf_free(e.c, out);
            tw_free(&t);
        }
    env_close(&e);
}
END_TEST

START_TEST(test_add_bias_add)
{
    env_t e;
    if (!env_open(&e, _i))
        return;
    static const int shapes[][2] = { { 1, 1 }, { 3, 17 }, { 4, 64 }, { 300, 300 } };
    for (int wdt = 0; wdt < 3; wdt++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            int n = shapes[s][0], d = shapes[s][1];
            size_t ne = (size_t)n * d;
            static const dtype_t dts[] = { DTYPE_F32, DTYPE_F16, DTYPE_BF16 };
            tw_t t;
            tw_make(&t, dts[wdt], 1, d, 0);
            float *yh = malloc(ne * sizeof(float)), *xh = malloc(ne * sizeof(float));
            fill(yh, ne, -2.0f, 2.0f);
            fill(xh, ne, -2.0f, 2.0f);
            float *y = dev_copy(&e, yh, ne), *x = dev_copy(&e, xh, ne);
            ck_assert_int_eq(e.o->add_bias(e.c, y, &t.w, n, d), 0);
            float *h = host_copy(&e, y, ne);
            for (size_t k = 0; k < ne; k++)
                EXPECT_TRUE(h[k] == yh[k] + t.ref[k % (size_t)d]);
            ck_assert_int_eq(e.o->add(e.c, y, x, ne), 0);
            float *h2 = host_copy(&e, y, ne);
            for (size_t k = 0; k < ne; k++)
                EXPECT_TRUE(h2[k] == h[k] + xh[k]);
            free(yh);
            free(xh);
            free(h);
            free(h2);
            e.o->buf_free(e.c, y);
            e.o->buf_free(e.c, x);
            tw_free(&t);
        }
    /* A long flat add goes through the pool. */
    size_t ne = 200003;
    float *ah = malloc(ne * sizeof(float)), *bh = malloc(ne * sizeof(float));
    fill(ah, ne, -1.0f, 1.0f);
    fill(bh, ne, -1.0f, 1.0f);
    float *a = dev_copy(&e, ah, ne), *b = dev_copy(&e, bh, ne);
    ck_assert_int_eq(e.o->add(e.c, a, b, ne), 0);
    float *h = host_copy(&e, a, ne);
    for (size_t k = 0; k < ne; k++)
        EXPECT_TRUE(h[k] == ah[k] + bh[k]);
    ck_assert_int_eq(e.o->add(e.c, a, b, 0), 0);
    free(ah);
    free(bh);
    free(h);
    e.o->buf_free(e.c, a);
    e.o->buf_free(e.c, b);
    env_close(&e);
}
END_TEST

/* ---- rope ------------------------------------------------------------------------------- */

START_TEST(test_rope)
{
    env_t e;
    if (!env_open(&e, _i))
        return;
    /* layout, head_dim, rot_dim, heads, rows, attn_factor */
    static const struct {
        rope_layout_t layout;
        int hd, rot, heads, n;
        float af;
    } cases[] = {
        { ROPE_INTERLEAVED, 8, 8, 8, 3, 1.0f },   { ROPE_HALF, 8, 8, 8, 3, 1.0f },
        { ROPE_INTERLEAVED, 64, 32, 3, 5, 1.0f }, { ROPE_HALF, 96, 24, 4, 2, 1.19f },
        { ROPE_HALF, 128, 128, 8, 64, 1.0f },     { ROPE_INTERLEAVED, 128, 64, 8, 64, 0.9f },
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int hd = cases[c].hd, rot = cases[c].rot, H = cases[c].heads, n = cases[c].n;
        float inv_freq[64];
        for (int f = 0; f < rot / 2; f++)
            inv_freq[f] = 1.0f / powf(10000.0f, (float)(2 * f) / (float)rot);
        rope_t rp = { .layout = cases[c].layout, .head_dim = hd, .rot_dim = rot,
                      .inv_freq = inv_freq, .attn_factor = cases[c].af };
        int32_t *pos = malloc((size_t)n * sizeof(int32_t));
        for (int i = 0; i < n; i++)
            pos[i] = i == 0 ? 0 : (int32_t)(test_rand_u32() % 9000);
        size_t ne = (size_t)n * H * hd;
        float *xh = malloc(ne * sizeof(float));
        fill(xh, ne, -1.0f, 1.0f);
        float *x = dev_copy(&e, xh, ne);
        ck_assert_int_eq(e.o->rope(e.c, x, pos, n, H, &rp), 0);
        float *h = host_copy(&e, x, ne);
        for (int i = 0; i < n; i++)
            for (int hh = 0; hh < H; hh++) {
                float want[128];
                const float *in = xh + ((size_t)i * H + hh) * hd;
                memcpy(want, in, (size_t)hd * sizeof(float));
                for (int f = 0; f < rot / 2; f++) {
                    float ang = (float)pos[i] * inv_freq[f];
                    float cs = cosf(ang) * rp.attn_factor, sn = sinf(ang) * rp.attn_factor;
                    int a = rp.layout == ROPE_INTERLEAVED ? 2 * f : f;
                    int b = rp.layout == ROPE_INTERLEAVED ? 2 * f + 1 : f + rot / 2;
                    want[a] = in[a] * cs - in[b] * sn;
                    want[b] = in[a] * sn + in[b] * cs;
                }
                for (int k = 0; k < hd; k++)
                    EXPECT(fabsf(h[((size_t)i * H + hh) * hd + k] - want[k]) <= 1e-6f,
                                  "rope case %zu row %d head %d elem %d", c, i, hh, k);
            }
        free(pos);
        free(xh);
        free(h);
        e.o->buf_free(e.c, x);
    }
    float inv_freq[4] = { 1, 1, 1, 1 };
    rope_t bad = { .layout = ROPE_HALF, .head_dim = 8, .rot_dim = 10, .inv_freq = inv_freq,
                   .attn_factor = 1.0f };
    float *x = e.o->buf_alloc(e.c, 8);
    int32_t p0 = 0;
    ck_assert_int_eq(e.o->rope(e.c, x, &p0, 1, 1, &bad), RIVER_EINVAL);
    bad.rot_dim = 3;
    ck_assert_int_eq(e.o->rope(e.c, x, &p0, 1, 1, &bad), RIVER_EINVAL);
    e.o->buf_free(e.c, x);
    env_close(&e);
}
END_TEST

/* ---- swiglu ----------------------------------------------------------------------------- */

START_TEST(test_swiglu)
{
    env_t e;
    if (!env_open(&e, _i))
        return;
    static const int cases[][3] = { { 1, 1, 1 }, { 3, 37, 74 }, { 2, 172, 200 }, { 70, 1000, 2000 } };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int n = cases[c][0], d = cases[c][1], stride = cases[c][2];
        size_t ni = (size_t)n * stride;
        float *gh = malloc(ni * sizeof(float));
        /* Gate and up as the two halves of one fused row when stride == 2d. */
        fill(gh, ni, -12.0f, 12.0f);
        float *g = dev_copy(&e, gh, ni);
        float *out = e.o->buf_alloc(e.c, (size_t)n * d);
        const float *up = stride >= 2 * d ? g + d : g;
        ck_assert_int_eq(e.o->swiglu(e.c, out, g, up, n, d, stride), 0);
        float *h = host_copy(&e, out, (size_t)n * d);
        for (int i = 0; i < n; i++)
            for (int k = 0; k < d; k++) {
                float gv = gh[(size_t)i * stride + k];
                float uv = gh[(size_t)i * stride + k + (stride >= 2 * d ? d : 0)];
                float want = gv / (1.0f + expf(-gv)) * uv;
                EXPECT(fabsf(h[(size_t)i * d + k] - want) <= 1e-5f * fabsf(want) + 1e-7f,
                              "swiglu (%d, %d): [%d][%d] = %g, want %g", n, d, i, k,
                              h[(size_t)i * d + k], want);
            }
        free(gh);
        free(h);
        e.o->buf_free(e.c, g);
        e.o->buf_free(e.c, out);
    }
    env_close(&e);
}
END_TEST

/* ---- kv_write and attention ------------------------------------------------------------- */

typedef struct attn_case {
    int n_heads, n_kv, hd, page_size;
    int n_seqs;
    int lens[4];   /* final length of each sequence */
    int in_batch[4]; /* how many of its last positions are rows of the tested batch */
    int mask_every;  /* > 0: history positions p with p % mask_every == 1 are invalid slots */
} attn_case_t;

/* Whether slot p of sequence s is valid in a case (rows of the batch always are). */
static int slot_valid(const attn_case_t *ac, int s, int p)
{
    if (ac->mask_every <= 0 || p >= ac->lens[s] - ac->in_batch[s])
        return 1;
    return p % ac->mask_every != 1;
}

static void run_attention_case(env_t *e, const attn_case_t *ac)
{
    const int n_layers = 2, layer = 1;
    int kv_dim = ac->n_kv * ac->hd, ps = ac->page_size;
    int G = ac->n_heads / ac->n_kv;
    int n_pages = 0;
    for (int s = 0; s < ac->n_seqs; s++)
        n_pages += (ac->lens[s] + ps - 1) / ps;
    n_pages += 3; /* pages no sequence owns: they must stay untouched */
    kv_view_t kv = { .page_stride = (int64_t)n_layers * ps * kv_dim,
                     .layer_stride = (int64_t)ps * kv_dim, .page_size = ps, .kv_dim = kv_dim,
                     .n_pages = n_pages };
    size_t pool = (size_t)n_pages * kv.page_stride;
    kv.k = e->o->buf_alloc(e->c, pool);
    kv.v = e->o->buf_alloc(e->c, pool);
    ck_assert(kv.k && kv.v);

    /* Scattered page ids: a shuffled list handed out in order. */
    int32_t *perm = malloc((size_t)n_pages * sizeof(int32_t));
    for (int p = 0; p < n_pages; p++)
        perm[p] = p;
    for (int p = n_pages - 1; p > 0; p--) {
        int q = (int)(test_rand_u32() % (uint32_t)(p + 1));
        int32_t t = perm[p];
        perm[p] = perm[q];
        perm[q] = t;
    }
    int32_t *tables[4];
    float *kref[4], *vref[4];
    int next = 0;
    for (int s = 0; s < ac->n_seqs; s++) {
        int np = (ac->lens[s] + ps - 1) / ps;
        tables[s] = malloc((size_t)np * sizeof(int32_t));
        for (int p = 0; p < np; p++)
            tables[s][p] = perm[next++];
        kref[s] = malloc((size_t)ac->lens[s] * kv_dim * sizeof(float));
        vref[s] = malloc((size_t)ac->lens[s] * kv_dim * sizeof(float));
        fill(kref[s], (size_t)ac->lens[s] * kv_dim, -1.0f, 1.0f);
        fill(vref[s], (size_t)ac->lens[s] * kv_dim, -1.0f, 1.0f);
    }

    /* The history of every sequence, written in one batch per sequence. */
    for (int s = 0; s < ac->n_seqs; s++) {
        int hist = ac->lens[s] - ac->in_batch[s];
        if (hist == 0)
            continue;
        int32_t *pos = malloc((size_t)hist * sizeof(int32_t));
        const int32_t **pt = malloc((size_t)hist * sizeof(*pt));
        for (int i = 0; i < hist; i++) {
            pos[i] = i;
            pt[i] = tables[s];
        }
        attn_batch_t hb = { .n = hist, .pos = pos, .page_table = (const int32_t *const *)pt };
        float *k = dev_copy(e, kref[s], (size_t)hist * kv_dim);
        float *v = dev_copy(e, vref[s], (size_t)hist * kv_dim);
        ck_assert_int_eq(e->o->kv_write(e->c, &kv, layer, &hb, k, v), 0);
        e->o->buf_free(e->c, k);
        e->o->buf_free(e->c, v);
        /* Invalid slots hold NaN: reading one would poison the output. */
        int n_bad = 0;
        float *nan_rows = malloc((size_t)hist * kv_dim * sizeof(float));
        for (int p = 0; p < hist; p++)
            if (!slot_valid(ac, s, p))
                pos[n_bad++] = p;
        for (size_t z = 0; z < (size_t)hist * kv_dim; z++)
            nan_rows[z] = NAN;
        if (n_bad) {
            hb.n = n_bad;
            k = dev_copy(e, nan_rows, (size_t)n_bad * kv_dim);
            ck_assert_int_eq(e->o->kv_write(e->c, &kv, layer, &hb, k, k), 0);
            e->o->buf_free(e->c, k);
        }
        free(nan_rows);
        free(pos);
        free(pt);
    }
    /* The validity maps of the sequences: (n_layers, stride) bytes each. */
    int vstride = 0;
    for (int s = 0; s < ac->n_seqs; s++)
        vstride = ac->lens[s] > vstride ? ac->lens[s] : vstride;
    uint8_t *vmaps[4];
    for (int s = 0; s < ac->n_seqs; s++) {
        vmaps[s] = calloc((size_t)n_layers * vstride, 1);
        for (int p = 0; p < ac->lens[s]; p++)
            vmaps[s][layer * vstride + p] = (uint8_t)slot_valid(ac, s, p);
    }

    /* The batch: the last in_batch[s] positions of each sequence, interleaved. */
    int n = 0;
    int row_seq[64], row_pos[64];
    for (int s = 0; s < ac->n_seqs; s++)
        for (int j = 0; j < ac->in_batch[s]; j++) {
            row_seq[n] = s;
            row_pos[n] = ac->lens[s] - ac->in_batch[s] + j;
            n++;
        }
    int32_t pos[64];
    const int32_t *pt[64];
    const uint8_t *valid[64];
    float *kb = malloc((size_t)n * kv_dim * sizeof(float));
    float *vb = malloc((size_t)n * kv_dim * sizeof(float));
    for (int i = 0; i < n; i++) {
        pos[i] = row_pos[i];
        pt[i] = tables[row_seq[i]];
        valid[i] = vmaps[row_seq[i]];
        memcpy(kb + (size_t)i * kv_dim, kref[row_seq[i]] + (size_t)row_pos[i] * kv_dim,
               (size_t)kv_dim * sizeof(float));
        memcpy(vb + (size_t)i * kv_dim, vref[row_seq[i]] + (size_t)row_pos[i] * kv_dim,
               (size_t)kv_dim * sizeof(float));
    }
    attn_batch_t b = { .n = n, .pos = pos, .page_table = pt };
    if (ac->mask_every > 0) {
        b.kv_valid = valid;
        b.kv_valid_stride = vstride;
    }
    float *k = dev_copy(e, kb, (size_t)n * kv_dim), *v = dev_copy(e, vb, (size_t)n * kv_dim);
    ck_assert_int_eq(e->o->kv_write(e->c, &kv, layer, &b, k, v), 0);

    size_t qn = (size_t)n * ac->n_heads * ac->hd;
    float *qh = malloc(qn * sizeof(float));
    fill(qh, qn, -1.0f, 1.0f);
    float *q = dev_copy(e, qh, qn);
    float *out = e->o->buf_alloc(e->c, qn);
    float scale = 1.0f / sqrtf((float)ac->hd);
    ck_assert_int_eq(e->o->attention(e->c, out, q, &kv, layer, &b, ac->n_heads, ac->n_kv,
                                     ac->hd, scale), 0);
    float *oh = host_copy(e, out, qn);
    /* In place: out may be q itself, with the same result. */
    float *qo = dev_copy(e, qh, qn);
    ck_assert_int_eq(e->o->attention(e->c, qo, qo, &kv, layer, &b, ac->n_heads, ac->n_kv,
                                     ac->hd, scale), 0);
    float *qoh = host_copy(e, qo, qn);
    ck_assert(memcmp(qoh, oh, qn * sizeof(float)) == 0);
    free(qoh);
    e->o->buf_free(e->c, qo);

    double *sc = malloc((size_t)(ac->lens[0] + 4096) * sizeof(double));
    for (int i = 0; i < n; i++) {
        int s = row_seq[i], len = row_pos[i] + 1;
        for (int h = 0; h < ac->n_heads; h++) {
            int kvh = h / G;
            const float *qv = qh + ((size_t)i * ac->n_heads + h) * ac->hd;
            double mx = -INFINITY, sum = 0.0;
            for (int t = 0; t < len; t++) {
                if (!slot_valid(ac, s, t)) {
                    sc[t] = -INFINITY;
                    continue;
                }
                double d = 0.0;
                for (int j = 0; j < ac->hd; j++)
                    d += (double)qv[j] * kref[s][(size_t)t * kv_dim + kvh * ac->hd + j];
                sc[t] = d * scale;
                mx = sc[t] > mx ? sc[t] : mx;
            }
            for (int t = 0; t < len; t++) {
                sc[t] = exp(sc[t] - mx);
                sum += sc[t];
            }
            for (int j = 0; j < ac->hd; j++) {
                double o = 0.0;
                for (int t = 0; t < len; t++)
                    if (slot_valid(ac, s, t))
                        o += sc[t] * vref[s][(size_t)t * kv_dim + kvh * ac->hd + j];
                o /= sum;
                float got = oh[((size_t)i * ac->n_heads + h) * ac->hd + j];
                EXPECT(fabs(got - o) <= 2e-5,
                              "attention %s thr %d (heads %d/%d, hd %d): row %d head %d "
                              "[%d] = %g, want %g", cpu_simd_name((cpu_simd_t)e->level),
                              e->threads, ac->n_heads, ac->n_kv, ac->hd, i, h, j, got, o);
            }
        }
    }
    /* Pages nobody owns, and layer 0 of every page, were never written. */
    float *kh = host_copy(e, kv.k, pool);
    for (int p = next; p < n_pages; p++)
        for (int64_t z = 0; z < kv.page_stride; z++)
            EXPECT_TRUE(kh[(size_t)perm[p] * kv.page_stride + z] == 0.0f);
    for (int p = 0; p < n_pages; p++)
        for (int64_t z = 0; z < kv.layer_stride; z++)
            EXPECT_TRUE(kh[(size_t)p * kv.page_stride + z] == 0.0f);

    /* A page id outside the pool is refused. */
    int32_t bad_table[1] = { n_pages };
    const int32_t *bpt[1] = { bad_table };
    int32_t bpos[1] = { 0 };
    attn_batch_t bb = { .n = 1, .pos = bpos, .page_table = bpt };
    ck_assert_int_eq(e->o->kv_write(e->c, &kv, layer, &bb, k, v), RIVER_ERANGE);
    ck_assert_int_eq(e->o->attention(e->c, out, q, &kv, layer, &bb, ac->n_heads, ac->n_kv,
                                     ac->hd, scale), RIVER_ERANGE);

    free(kh);
    free(sc);
    free(qh);
    free(oh);
    free(kb);
    free(vb);
    e->o->buf_free(e->c, q);
    e->o->buf_free(e->c, out);
    e->o->buf_free(e->c, k);
    e->o->buf_free(e->c, v);
    for (int s = 0; s < ac->n_seqs; s++) {
        free(vmaps[s]);
        free(tables[s]);
        free(kref[s]);
        free(vref[s]);
    }
    free(perm);
    e->o->buf_free(e->c, kv.k);
    e->o->buf_free(e->c, kv.v);
}

START_TEST(test_attention)
{
    env_t e;
    if (!env_open(&e, _i))
        return;
    static const attn_case_t cases[] = {
        /* GQA 2, three sequences, two rows of one sequence in the batch (causal within it). */
        { 4, 2, 8, 4, 3, { 1, 9, 14 }, { 1, 2, 1 }, 0 },
        /* Plain multi-head attention, odd head size, a prefill-like batch. */
        { 3, 3, 20, 4, 2, { 6, 11 }, { 6, 3 }, 0 },
        /* GQA 2 with llama-sized heads. */
        { 8, 4, 64, 16, 3, { 40, 1, 33 }, { 1, 1, 2 }, 0 },
        /* GQA 4 and a long sequence: the decode chunking path with two threads. */
        { 8, 2, 64, 16, 1, { 700 }, { 1 }, 0 },
        /* One KV head, a long and a short sequence: chunks that are empty for one row. */
        { 2, 1, 32, 8, 2, { 600, 5 }, { 1, 1 }, 0 },
        /* Validity maps (masked early exit): every third history slot is NaN and skipped. */
        { 4, 2, 8, 4, 3, { 1, 9, 14 }, { 1, 2, 1 }, 3 },
        { 8, 2, 64, 16, 2, { 700, 30 }, { 1, 2 }, 2 },
        /* Masked slots covering whole pages. */
        { 4, 4, 16, 1, 1, { 9 }, { 2 }, 2 },
        /* Prefill tiles (SIMD levels): 40 rows of one sequence after 110 positions of
         * history, so three tiles (the last partial) over three K/V blocks, GQA 4. */
        { 8, 2, 64, 16, 1, { 150 }, { 40 }, 0 },
        /* Two sequences prefilled from position 0 (one of them entirely in the batch), an
         * odd head size and page size, plus a decode row of a third. */
        { 6, 3, 20, 7, 3, { 70, 33, 12 }, { 20, 33, 1 }, 0 },
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        run_attention_case(&e, &cases[c]);
    env_close(&e);
}
END_TEST

/* ---- cosine, gather, scatter, buffers --------------------------------------------------- */

START_TEST(test_cosine_gather_scatter)
{
    env_t e;
    if (!env_open(&e, _i))
        return;
    int n = 5, d = 37;
    size_t ne = (size_t)n * d;
    float *ah = malloc(ne * sizeof(float)), *bh = malloc(ne * sizeof(float));
    fill(ah, ne, -1.0f, 1.0f);
    fill(bh, ne, -1.0f, 1.0f);
    for (int k = 0; k < d; k++)
        bh[d + k] = 2.0f * ah[d + k]; /* row 1: parallel */
    for (int k = 0; k < d; k++)
        ah[3 * d + k] = 0.0f;          /* row 3: a zero vector */
    float *a = dev_copy(&e, ah, ne), *b = dev_copy(&e, bh, ne);
    float cs[5];
    ck_assert_int_eq(e.o->cosine(e.c, cs, a, b, n, d), 0);
    for (int i = 0; i < n; i++) {
        double ab = 0, aa = 0, bb = 0;
        for (int k = 0; k < d; k++) {
            ab += (double)ah[i * d + k] * bh[i * d + k];
            aa += (double)ah[i * d + k] * ah[i * d + k];
            bb += (double)bh[i * d + k] * bh[i * d + k];
        }
        double want = aa > 0 && bb > 0 ? ab / sqrt(aa * bb) : 0.0;
        ck_assert_msg(fabs(cs[i] - want) <= 1e-5, "cosine row %d: %g, want %g", i, cs[i], want);
    }
    ck_assert(fabsf(cs[1] - 1.0f) <= 1e-6f);

    int32_t idx[3] = { 4, 0, 2 };
    float *g = e.o->buf_alloc(e.c, 3 * (size_t)d);
    ck_assert_int_eq(e.o->gather_rows(e.c, g, a, idx, 3, d), 0);
    float *gh = host_copy(&e, g, 3 * (size_t)d);
    for (int i = 0; i < 3; i++)
        ck_assert(memcmp(gh + i * d, ah + idx[i] * d, (size_t)d * sizeof(float)) == 0);
    ck_assert_int_eq(e.o->scatter_rows(e.c, b, g, idx, 3, d), 0);
    float *sh = host_copy(&e, b, ne);
    for (int i = 0; i < n; i++) {
        const float *want = (i == 4 || i == 0 || i == 2) ? ah + i * d : bh + i * d;
        ck_assert(memcmp(sh + i * d, want, (size_t)d * sizeof(float)) == 0);
    }
    int32_t neg[1] = { -1 };
    ck_assert_int_eq(e.o->gather_rows(e.c, g, a, neg, 1, d), RIVER_ERANGE);
    ck_assert_int_eq(e.o->sync(e.c), 0);
    free(ah);
    free(bh);
    free(gh);
    free(sh);
    e.o->buf_free(e.c, a);
    e.o->buf_free(e.c, b);
    e.o->buf_free(e.c, g);
    env_close(&e);
}
END_TEST

START_TEST(test_buffers)
{
    env_t e;
    if (!env_open(&e, _i))
        return;
    static const size_t sizes[] = { 1, 3, 1000, (size_t)1 << 20, 3000001 };
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        float *b = e.o->buf_alloc(e.c, sizes[s]);
        ck_assert_ptr_nonnull(b);
        ck_assert_int_eq((uintptr_t)b % 64, 0);
        for (size_t k = 0; k < sizes[s]; k++)
            EXPECT_TRUE(b[k] == 0.0f);
        float src[5] = { 1, 2, 3, 4, 5 }, dst[5];
        size_t off = sizes[s] >= 5 ? sizes[s] - 5 : 0, m = sizes[s] >= 5 ? 5 : sizes[s];
        ck_assert_int_eq(e.o->from_host(e.c, b, off, src, m), 0);
        ck_assert_int_eq(e.o->to_host(e.c, dst, b, off, m), 0);
        ck_assert(memcmp(src, dst, m * sizeof(float)) == 0);
        e.o->buf_free(e.c, b);
    }
    e.o->buf_free(e.c, NULL);
    env_close(&e);
}
END_TEST

START_TEST(test_levels)
{
    cpu_simd_t best = cpu_simd_detect();
    ck_assert_int_lt(best, CPU_SIMD_COUNT);
    ck_assert_str_eq(cpu_simd_name(CPU_SIMD_SCALAR), "scalar");
    ck_assert_str_eq(cpu_simd_name(CPU_SIMD_AVX2), "avx2");
    ck_assert_str_eq(cpu_simd_name(CPU_SIMD_AVX512), "avx512");
    backend_t *be = NULL;
    ck_assert_int_eq(cpu_backend_new(&be, 0, CPU_SIMD_COUNT), 0);
    ck_assert_int_ge(cpu_backend_threads(be), 1);
    ck_assert_str_eq(be->ops->name, "cpu");
    cpu_backend_destroy(&be);
    ck_assert_ptr_null(be);
    cpu_backend_destroy(&be);
    ck_assert_int_eq(cpu_backend_new(&be, -1, CPU_SIMD_COUNT), RIVER_EINVAL);
    ck_assert_ptr_null(be);
    for (int l = 0; l <= CPU_SIMD_COUNT; l++) {
        double bw = cpu_read_bandwidth_gbs(2, (size_t)32 << 20, 2, (cpu_simd_t)l);
        ck_assert_msg(bw > 0.1, "read bandwidth at level %d: %g GB/s", l, bw);
    }
    ck_assert(cpu_read_bandwidth_gbs(0, 1 << 20, 1, CPU_SIMD_COUNT) < 0);
    ck_assert(cpu_read_bandwidth_gbs(2, 1 << 20, 1, (cpu_simd_t)(CPU_SIMD_COUNT + 1)) < 0);
}
END_TEST

/* The exit code of body(value) run in a child process after setting the environment
 * variable `name` to value: the variables the backend reads once per process are tested
 * each in a fresh one. */
static int env_child(const char *name, const char *value, int (*body)(const char *value))
{
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        setenv(name, value, 1);
        _exit(body(value));
    }
    int st;
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    ck_assert(WIFEXITED(st));
    return WEXITSTATUS(st);
}

/* What a backend asking for the best level gets with RIVER_SIMD=value: the level's
 * number, or 100 + the error's distance from RIVER_EINVAL when creation fails with that
 * detail naming `value`. */
static int simd_env_body(const char *value)
{
    backend_t *be = NULL;
    int e = cpu_backend_new(&be, 1, CPU_SIMD_COUNT);
    if (e) {
        /* The message names what was asked for and what the processor has. */
        const char *d = river_err_detail();
        int named = strstr(d, value) && strstr(d, cpu_simd_name(cpu_simd_detect()));
        return named ? 100 + (RIVER_EINVAL - e) : 99;
    }
    int code = (int)cpu_backend_simd(be);
    cpu_backend_destroy(&be);
    return code;
}

static int simd_env_child(const char *value)
{
    return env_child("RIVER_SIMD", value, simd_env_body);
}

/* What placing an eligible Q4 weight gives with RIVER_Q4X8=value: 0 kept as Q4, 1
 * repacked to Q4X8, 2 refused with RIVER_EINVAL and a detail naming the value, 3 anything
 * else. */
static int q4x8_env_body(const char *value)
{
    backend_t *be = NULL;
    int code = 3;
    if (cpu_backend_new(&be, 1, CPU_SIMD_AVX2) == 0) {
        tw_t t;
        tw_make(&t, DTYPE_Q4, 8, 256, 32);
        weight_t up = t.w;
        int e = be->ops->weight_upload(be->ctx, &up);
        if (e == RIVER_EINVAL && strstr(river_err_detail(), value))
            code = 2;
        else if (e == 0)
            code = up.dtype == DTYPE_Q4X8 ? 1 : up.dtype == DTYPE_Q4 ? 0 : 3;
        cpu_backend_destroy(&be);
    }
    return code;
}

static int q4x8_env_child(const char *value)
{
    return env_child("RIVER_Q4X8", value, q4x8_env_body);
}

START_TEST(test_q4x8_env)
{
    if (cpu_simd_detect() < CPU_SIMD_AVX2)
        return; /* no level here repacks */
    ck_assert_int_eq(q4x8_env_child("0"), 0);
    ck_assert_int_eq(q4x8_env_child("1"), 1);
    ck_assert_int_eq(q4x8_env_child("yes"), 2);
    ck_assert_int_eq(q4x8_env_child("00"), 2);
}
END_TEST

START_TEST(test_simd_env)
{
    for (int l = 0; l < CPU_SIMD_COUNT; l++) {
        const char *name = cpu_simd_name((cpu_simd_t)l);
        ck_assert_int_eq(cpu_simd_parse(name), l);
        int got = simd_env_child(name);
        if (l <= (int)cpu_simd_detect())
            ck_assert_msg(got == l, "RIVER_SIMD=%s gave %d", name, got);
        else /* a level this processor lacks */
            ck_assert_msg(got == 100 + (RIVER_EINVAL - RIVER_EUNSUPPORTED),
                          "RIVER_SIMD=%s gave %d", name, got);
    }
    ck_assert_int_eq(cpu_simd_parse("avx9"), CPU_SIMD_COUNT);
    ck_assert_int_eq(cpu_simd_parse(NULL), CPU_SIMD_COUNT);
    ck_assert_int_eq(simd_env_child("avx9"), 100);
    /* An explicit level is the caller's choice and ignores the variable. */
    backend_t *be = NULL;
    ck_assert_int_eq(cpu_backend_new(&be, 1, CPU_SIMD_SCALAR), 0);
    ck_assert_int_eq(cpu_backend_simd(be), CPU_SIMD_SCALAR);
    cpu_backend_destroy(&be);
}
END_TEST

static Suite *ops_suite(void)
{
    Suite *s = suite_create("ops");
    TCase *tc = tcase_create("cpu");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_levels);
    tcase_add_test(tc, test_simd_env);
    tcase_add_test(tc, test_q4x8_env);
    tcase_add_loop_test(tc, test_buffers, 0, N_CONFIGS);
    tcase_add_loop_test(tc, test_matmul_float, 0, N_CONFIGS);
    tcase_add_loop_test(tc, test_matmul_quant, 0, N_CONFIGS);
    tcase_add_loop_test(tc, test_matmul_q4x8, 0, N_CONFIGS);
    tcase_add_loop_test(tc, test_matmul_errors, 0, N_CONFIGS);
    tcase_add_loop_test(tc, test_embed, 0, N_CONFIGS);
    tcase_add_loop_test(tc, test_rmsnorm, 0, N_CONFIGS);
    tcase_add_loop_test(tc, test_add_bias_add, 0, N_CONFIGS);
    tcase_add_loop_test(tc, test_rope, 0, N_CONFIGS);
    tcase_add_loop_test(tc, test_swiglu, 0, N_CONFIGS);
    tcase_add_loop_test(tc, test_attention, 0, N_CONFIGS);
    tcase_add_loop_test(tc, test_cosine_gather_scatter, 0, N_CONFIGS);
    suite_add_tcase(s, tc);
    return s;
}

RIVER_TEST_MAIN(ops_suite)
