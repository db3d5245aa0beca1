/* The quantizers (RTN, HQQ) and the Exit River file: round trips on random matrices, HQQ
 * against RTN on every layer matrix of the real test models, and writing, loading and
 * rejecting river files. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/err.h"
#include "model/fingerprint.h"
#include "model/model.h"
#include "offline/exitriver_build.h"
#include "offline/quant.h"
#include "kernels/cpu/quant_groups_internal.h"
#include "engine/exitriver.h"
#include "engine/spec_cost.h"
#include "model/safetensors.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu.h"
#include "kernels/half.h"
#include "tests/proc.h"
#include "tests/testutil.h"

#define KJV TEST_DATA "/kjv-12l"
#define TINY TEST_DATA "/tinystories-656k"
#define STORIES TEST_DATA "/stories260K/stories260K.bin"

/* ---- helpers ---- */

static uint64_t rng_state;

static double rng_uniform(void)
{
    rng_state = rng_state * 6364136223846793005u + 1442695040888963407u;
    return ((double)(rng_state >> 11) + 0.5) / 9007199254740992.0;
}

/* Roughly normal values (sum of uniforms), with an occasional outlier as real weights have. */
static float rng_weight(float sd)
{
    double s = 0;
    for (int i = 0; i < 4; i++)
        s += rng_uniform() - 0.5;
    double v = s * sqrt(3.0) * sd;
    if (rng_uniform() < 0.002)
        v *= 8;
    return (float)v;
}

/* A random matrix in the given dtype; *buf owns the bytes. */
static weight_t random_weight(dtype_t dt, int64_t rows, int64_t cols, float sd, void **buf)
{
    size_t n = (size_t)(rows * cols);
    void *p = malloc(n * (dt == DTYPE_F32 ? 4 : 2));
    ck_assert_ptr_nonnull(p);
    for (size_t i = 0; i < n; i++) {
        float v = rng_weight(sd);
        if (dt == DTYPE_F32)
            ((float *)p)[i] = v;
        else if (dt == DTYPE_F16)
            ((uint16_t *)p)[i] = f32_to_f16(v);
        else
            ((uint16_t *)p)[i] = f32_to_bf16(v);
    }
    *buf = p;
    return (weight_t){.dtype = dt, .rows = rows, .cols = cols, .data = p};
}

/* The code widths the quantizer writes, in order: 2, 3, 4, 8 (0 after the last). */
static int next_bits(int bits)
{
    return bits < 4 ? bits + 1 : bits == 4 ? 8 : 0;
}

static unsigned code_at(const quant_matrix_t *q, int64_t r, int64_t c)
{
    if (q->bits == 8)
        return q->codes[r * q->cols + c];
    if (q->bits < 4) {
        /* docs/FORMATS.md, from its definition: the 2-bit plane, then the 1-bit plane. */
        size_t rb = (size_t)(q->cols / 4) + (q->bits == 3 ? (size_t)(q->cols / 8) : 0);
        const uint8_t *row = q->codes + (size_t)r * rb;
        unsigned v = (row[c / 4] >> (2 * (c % 4))) & 3u;
        if (q->bits == 3)
            v |= ((row[q->cols / 4 + c / 8] >> (c % 8)) & 1u) << 2;
        return v;
    }
    uint8_t b = q->codes[(size_t)r * (size_t)((q->cols + 1) / 2) + (size_t)(c / 2)];
    return (c & 1) ? (unsigned)(b >> 4) : (unsigned)(b & 0x0f);
}

static quant_params_t params(int bits, int group, quant_method_t m)
{
    quant_params_t p = quant_params_default();
    p.bits = bits;
    p.group = group;
    p.method = m;
    return p;
}

static quant_matrix_t *quantize(const weight_t *w, const quant_params_t *p, threadpool_t *pool,
                                quant_stats_t *st)
{
    quant_matrix_t *q = NULL;
    ck_assert_int_eq(quant_matrix_new(&q, w->rows, w->cols, p->bits, p->group), 0);
    int err = quant_weight(q, w, p, pool, st);
    ck_assert_msg(err == 0, "quant_weight: %s", river_err_detail());
    return q;
}

static int same_matrix(const quant_matrix_t *a, const quant_matrix_t *b)
{
    return a->rows == b->rows && a->cols == b->cols &&
           !memcmp(a->codes, b->codes, quant_matrix_code_bytes(a)) &&
           !memcmp(a->scales, b->scales, quant_matrix_group_count(a) * 2) &&
           !memcmp(a->zeros, b->zeros, quant_matrix_group_count(a) * 2);
}

static const char *matrix_names[7] = {"wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down"};

static const weight_t *layer_matrix(const layer_weights_t *L, int i)
{
    const weight_t *ws[7] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
    return ws[i];
}

static model_t *load(const char *path)
{
    model_t *m = NULL;
    int err = model_load(&m, path);
    ck_assert_msg(err == 0, "model_load %s: %s", path, river_err_detail());
    return m;
}

/* ---- quantizers on random matrices ---- */

/* RTN: codes span the whole range in every group, every value is within half a step of its
 * dequantization, and 8-bit error is far below 4-bit error. */
START_TEST(test_rtn_round_trip)
{
    const dtype_t dts[] = {DTYPE_F32, DTYPE_F16, DTYPE_BF16};
    const int groups[] = {64, 32, 128, 48};
    rng_state = 42;
    double rel4 = 0, rel8 = 0;
    for (int d = 0; d < 3; d++)
        for (int gi = 0; gi < 4; gi++)
            for (int bits = 4; bits <= 8; bits += 4) {
                void *buf;
                int g = groups[gi];
                weight_t w = random_weight(dts[d], 24, 384, 0.02f, &buf);
                quant_params_t p = params(bits, g, QUANT_RTN);
                quant_stats_t st;
                quant_matrix_t *q = quantize(&w, &p, NULL, &st);
                unsigned qmax = (1u << bits) - 1;
                weight_t qw = quant_matrix_weight(q);
                float a[384], b[384];
                int64_t ng = w.cols / g;
                for (int64_t r = 0; r < w.rows; r++) {
                    ck_assert_int_eq(quant_row_f32(&w, r, a), 0);
                    ck_assert_int_eq(quant_row_f32(&qw, r, b), 0);
                    for (int64_t gr = 0; gr < ng; gr++) {
                        float s = f16_to_f32(q->scales[r * ng + gr]);
                        ck_assert(s > 0 && isfinite(s));
                        unsigned lo = qmax, hi = 0;
                        for (int64_t c = gr * g; c < (gr + 1) * g; c++) {
                            unsigned code = code_at(q, r, c);
                            ck_assert_uint_le(code, qmax);
                            lo = code < lo ? code : lo;
                            hi = code > hi ? code : hi;
                            ck_assert_msg(fabsf(a[c] - b[c]) <= 0.5f * s * 1.0001f + 1e-9f,
                                          "row %lld col %lld: %g vs %g, scale %g",
                                          (long long)r, (long long)c, (double)a[c],
                                          (double)b[c], (double)s);
                        }
                        ck_assert_uint_eq(lo, 0);
                        ck_assert_uint_eq(hi, qmax);
                    }
                }
                ck_assert_int_eq(st.n, w.rows * w.cols);
                ck_assert_double_eq(st.abs_err, st.rtn_abs_err);
                quant_error_t e;
                ck_assert_int_eq(quant_error(&w, &qw, 0.7, &e), 0);
                ck_assert_double_eq_tol(e.mae, quant_stats_mae(&st), 1e-6 * e.mae);
                ck_assert_double_eq_tol(e.rel_fro, quant_stats_rel_fro(&st), 1e-4 * e.rel_fro);
                if (bits == 4)
                    rel4 += e.rel_fro;
                else
                    rel8 += e.rel_fro;
                quant_matrix_destroy(&q);
                free(buf);
            }
    printf("random RTN: mean rel-fro 4-bit %.5f, 8-bit %.6f\n", rel4 / 12, rel8 / 12);
    /* 16x more levels: the error should shrink by about 16. */
    ck_assert(rel8 * 10 < rel4);
}
END_TEST

/* HQQ keeps RTN's scales, lowers the error, and its zeros stay fp16 values the codes were
 * computed from (dequantizing reproduces the statistics exactly). */
START_TEST(test_hqq_round_trip)
{
    rng_state = 7;
    for (int bits = 4; bits <= 8; bits += 4) {
        void *buf;
        weight_t w = random_weight(DTYPE_BF16, 64, 512, 0.05f, &buf);
        quant_params_t pr = params(bits, 64, QUANT_RTN), ph = params(bits, 64, QUANT_HQQ);
        quant_stats_t sr, sh;
        quant_matrix_t *qr = quantize(&w, &pr, NULL, &sr);
        quant_matrix_t *qh = quantize(&w, &ph, NULL, &sh);
        ck_assert(!memcmp(qr->scales, qh->scales, quant_matrix_group_count(qr) * 2));
        ck_assert_double_eq(sh.rtn_abs_err, sr.abs_err);
        ck_assert_double_eq(sh.rtn_sq_err, sr.sq_err);
        ck_assert(sh.abs_err < sr.abs_err);
        ck_assert(sh.iters >= sh.groups && sh.iters <= 20 * sh.groups);
        weight_t wr = quant_matrix_weight(qr), wh = quant_matrix_weight(qh);
        quant_error_t er, eh;
        ck_assert_int_eq(quant_error(&w, &wr, 0.7, &er), 0);
        ck_assert_int_eq(quant_error(&w, &wh, 0.7, &eh), 0);
        ck_assert_double_eq_tol(eh.mae, quant_stats_mae(&sh), 1e-6 * eh.mae);
        printf("random %d-bit g64: RTN mae %.4e lp %.4e | HQQ mae %.4e lp %.4e (%.1f it/group)\n",
               bits, er.mae, er.lp, eh.mae, eh.lp, (double)sh.iters / (double)sh.groups);
        ck_assert(eh.mae < er.mae);
        ck_assert(eh.lp < er.lp);
        /* Every stored code is the rounding of W * s + z with the stored fp16 scale and
         * zero: what was optimised is what was stored. */
        float row[512];
        int64_t ng = w.cols / 64;
        for (int64_t r = 0; r < w.rows; r++) {
            ck_assert_int_eq(quant_row_f32(&w, r, row), 0);
            for (int64_t c = 0; c < w.cols; c++) {
                float s = f16_to_f32(qh->scales[r * ng + c / 64]);
                float z = f16_to_f32(qh->zeros[r * ng + c / 64]);
                float t = nearbyintf(row[c] * (1.0f / s) + z);
                float want = fminf(fmaxf(t, 0.0f), (float)((1 << bits) - 1));
                ck_assert_uint_eq(code_at(qh, r, c), (unsigned)want);
            }
        }
        quant_matrix_destroy(&qr);
        quant_matrix_destroy(&qh);
        free(buf);
    }
}
END_TEST

/* The AVX-512 kernel, the portable one, and any thread count give the same bytes, at 2, 3,
 * 4 and 8 bits. */
START_TEST(test_kernels_and_threads_agree)
{
    rng_state = 99;
    threadpool_t *pool = NULL;
    ck_assert_int_eq(threadpool_new(&pool, 2), 0);
    for (int m = 0; m < QUANT_METHOD_COUNT; m++)
        for (int bits = 2; bits; bits = next_bits(bits)) {
            void *buf;
            weight_t w = random_weight(DTYPE_F32, 300, 256, 0.03f, &buf);
            quant_params_t p = params(bits, 64, (quant_method_t)m);
            quant_stats_t s1, s2, s3;
            quant_matrix_t *a = quantize(&w, &p, NULL, &s1);
            quant_matrix_t *b = quantize(&w, &p, pool, &s2);
            p.portable = 1;
            quant_matrix_t *c = quantize(&w, &p, pool, &s3);
            ck_assert(same_matrix(a, b));
            ck_assert_msg(same_matrix(a, c), "portable and %s kernels differ (%s %d-bit)",
                          cpu_simd_name(cpu_simd_detect()), quant_method_name(p.method), bits);
            ck_assert(!memcmp(&s1, &s2, sizeof s1));
            ck_assert(!memcmp(&s1, &s3, sizeof s1));
            quant_matrix_destroy(&a);
            quant_matrix_destroy(&b);
            quant_matrix_destroy(&c);
            free(buf);
        }
    threadpool_destroy(&pool);
}
END_TEST

/* The kernels of every SIMD level this processor has give the portable kernel's bytes and
 * error sums, for RTN and HQQ, 2, 3, 4 and 8 bits and group sizes 16, 48, 64 and 128, on values
 * with outliers and constant groups. */
START_TEST(test_simd_kernels_agree)
{
    rng_state = 123;
    cpu_simd_t best = cpu_simd_detect();
    static const int groups[] = {16, 48, 64, 128};
    enum { NG = 37 };
    float *w = malloc(sizeof(float) * NG * 128);
    uint8_t *q[3];
    uint16_t sc[3][NG], ze[3][NG];
    for (int k = 0; k < 3; k++)
        q[k] = malloc(NG * 128);
    ck_assert(w && q[0] && q[1] && q[2]);
    for (int gi = 0; gi < 4; gi++)
        for (int hqq = 0; hqq <= 1; hqq++)
            for (int bits = 2; bits; bits = next_bits(bits)) {
                int g = groups[gi];
                for (int k = 0; k < NG * g; k++)
                    w[k] = (float)(rng_uniform() - 0.5) * 0.05f;
                w[3] = 0.9f; /* an outlier */
                for (int k = 0; k < g; k++)
                    w[2 * g + k] = 0.25f; /* a constant group */
                quant_job_t j = {.group = g, .qmax = (1 << bits) - 1, .hqq = hqq, .iters = 20,
                                 .beta = 10.0f, .kappa = 1.01f, .expo = 0.7f - 1.0f};
                quant_stats_t st[3];
                memset(st, 0, sizeof st);
                ck_assert_int_eq(quant_groups_scalar(&j, w, NG, q[0], sc[0], ze[0], &st[0]), 0);
                for (int lv = 1; lv < 3; lv++) {
                    if (lv > (int)best)
                        continue;
                    int rc = lv == 1 ? quant_groups_avx2(&j, w, NG, q[lv], sc[lv], ze[lv], &st[lv])
                                     : quant_groups_avx512(&j, w, NG, q[lv], sc[lv], ze[lv], &st[lv]);
                    ck_assert_int_eq(rc, 0);
                    ck_assert_msg(!memcmp(q[0], q[lv], (size_t)NG * g) &&
                                  !memcmp(sc[0], sc[lv], sizeof sc[0]) &&
                                  !memcmp(ze[0], ze[lv], sizeof ze[0]) &&
                                  !memcmp(&st[0], &st[lv], sizeof st[0]),
                                  "%s kernel differs from the portable one (group %d, %s, %d-bit)",
                                  cpu_simd_name((cpu_simd_t)lv), g, hqq ? "hqq" : "rtn", bits);
                }
            }
    free(w);
    for (int k = 0; k < 3; k++)
        free(q[k]);
}
END_TEST

/* 2 and 3 bits, RTN and HQQ, groups of 16 to 64: the codes fill their range in every group
 * (RTN), every value is within half a step of its dequantization (RTN), HQQ's error is no
 * more than RTN's, the stored codes are the rounding of W * s + z with the stored scale and
 * zero, the rows pack into cols/4 (+ cols/8) bytes, the CPU backend dequantizes a stored
 * matrix to quant_row_f32's values bit for bit at every SIMD level, and the error shrinks
 * from 2 to 3 to 4 bits. */
START_TEST(test_lowbit_round_trip)
{
    static const int groups[] = {16, 32, 48, 64};
    rng_state = 2024;
    double rel[9] = {0};
    for (int gi = 0; gi < 4; gi++)
        for (int bits = 2; bits <= 4; bits++) {
            int g = groups[gi];
            void *buf;
            weight_t w = random_weight(DTYPE_BF16, 21, 192, 0.03f, &buf);
            quant_params_t pr = params(bits, g, QUANT_RTN), ph = params(bits, g, QUANT_HQQ);
            quant_stats_t sr, sh;
            quant_matrix_t *qr = quantize(&w, &pr, NULL, &sr);
            quant_matrix_t *qh = quantize(&w, &ph, NULL, &sh);
            unsigned qmax = (1u << bits) - 1;
            if (bits < 4)
                ck_assert_uint_eq(quant_matrix_code_bytes(qr),
                                  21 * (192 / 4 + (bits == 3 ? 192 / 8 : 0)));
            ck_assert(sh.abs_err <= sr.abs_err);
            ck_assert_double_eq(sh.rtn_abs_err, sr.abs_err);
            weight_t wr = quant_matrix_weight(qr), wh = quant_matrix_weight(qh);
            ck_assert_int_eq(wr.dtype, dtype_quant_of_bits(bits));
            quant_error_t er, eh;
            ck_assert_int_eq(quant_error(&w, &wr, 0.7, &er), 0);
            ck_assert_int_eq(quant_error(&w, &wh, 0.7, &eh), 0);
            ck_assert_double_eq_tol(er.mae, quant_stats_mae(&sr), 1e-6 * er.mae);
            ck_assert_double_eq_tol(eh.mae, quant_stats_mae(&sh), 1e-6 * eh.mae);
            ck_assert(eh.mae <= er.mae);
            rel[bits] += er.rel_fro;
            float a[192], b[192];
            int64_t ng = w.cols / g;
            for (int64_t r = 0; r < w.rows; r++) {
                ck_assert_int_eq(quant_row_f32(&w, r, a), 0);
                ck_assert_int_eq(quant_row_f32(&wr, r, b), 0);
                for (int64_t gr = 0; gr < ng; gr++) {
                    float s = f16_to_f32(qr->scales[r * ng + gr]);
                    unsigned lo = qmax, hi = 0;
                    for (int64_t c = gr * g; c < (gr + 1) * g; c++) {
                        unsigned code = code_at(qr, r, c);
                        ck_assert_uint_le(code, qmax);
                        lo = code < lo ? code : lo;
                        hi = code > hi ? code : hi;
                        ck_assert(fabsf(a[c] - b[c]) <= 0.5f * s * 1.0001f + 1e-9f);
                        /* HQQ's code: the rounding with its stored scale and zero. */
                        float sh16 = f16_to_f32(qh->scales[r * ng + gr]);
                        float zh16 = f16_to_f32(qh->zeros[r * ng + gr]);
                        float t = nearbyintf(a[c] * (1.0f / sh16) + zh16);
                        ck_assert_uint_eq(code_at(qh, r, c),
                                          (unsigned)fminf(fmaxf(t, 0.0f), (float)qmax));
                    }
                    ck_assert_uint_eq(lo, 0);
                    ck_assert_uint_eq(hi, qmax);
                }
            }
            /* The CPU backend's dequantization (its embed op reads whole rows) is
             * quant_row_f32's, bit for bit, at every level this processor has. */
            for (int lv = 0; lv <= (int)cpu_simd_detect(); lv++) {
                backend_t *be = NULL;
                ck_assert_int_eq(cpu_backend_new(&be, 1, (cpu_simd_t)lv), 0);
                int32_t tok[3] = {0, 20, 7};
                float *out = be->ops->buf_alloc(be->ctx, 3 * 192);
                ck_assert_ptr_nonnull(out);
                ck_assert_int_eq(be->ops->embed(be->ctx, out, &wh, tok, 3), 0);
                for (int i = 0; i < 3; i++) {
                    ck_assert_int_eq(quant_row_f32(&wh, tok[i], b), 0);
                    ck_assert_msg(!memcmp(out + i * 192, b, sizeof b),
                                  "%s: %d-bit g%d row %d dequantizes differently",
                                  cpu_simd_name((cpu_simd_t)lv), bits, g, tok[i]);
                }
                be->ops->buf_free(be->ctx, out);
                backend_destroy(&be);
            }
            quant_matrix_destroy(&qr);
            quant_matrix_destroy(&qh);
            free(buf);
        }
    printf("random RTN: mean rel-fro 2-bit %.4f, 3-bit %.4f, 4-bit %.4f\n", rel[2] / 4,
           rel[3] / 4, rel[4] / 4);
    ck_assert(rel[3] < 0.7 * rel[2]);
    ck_assert(rel[4] < 0.7 * rel[3]);
}
END_TEST

/* Odd group sizes take the portable kernel; an odd number of columns leaves the last
 * byte of each 4-bit row half used, its high nibble zero. */
START_TEST(test_odd_shapes)
{
    rng_state = 5;
    void *buf;
    weight_t w = random_weight(DTYPE_F32, 7, 45, 0.1f, &buf);
    for (int m = 0; m < QUANT_METHOD_COUNT; m++) {
        quant_params_t p = params(4, 15, (quant_method_t)m);
        quant_stats_t st;
        quant_matrix_t *q = quantize(&w, &p, NULL, &st);
        ck_assert_uint_eq(quant_matrix_code_bytes(q), 7 * 23);
        weight_t qw = quant_matrix_weight(q);
        float a[45], b[45];
        for (int64_t r = 0; r < 7; r++) {
            ck_assert_uint_eq(q->codes[r * 23 + 22] >> 4, 0);
            ck_assert_int_eq(quant_row_f32(&w, r, a), 0);
            ck_assert_int_eq(quant_row_f32(&qw, r, b), 0);
            for (int c = 0; c < 45; c++) {
                float s = f16_to_f32(q->scales[r * 3 + c / 15]);
                /* HQQ moves the zero away from RTN's, so only RTN has the half-step bound. */
                float tol = m == QUANT_RTN ? 0.5f * s * 1.0001f : 1.5f * s;
                ck_assert(fabsf(a[c] - b[c]) <= tol);
            }
        }
        ck_assert(m == QUANT_RTN || st.abs_err <= st.rtn_abs_err);
        quant_matrix_destroy(&q);
    }
    free(buf);
}
END_TEST

/* Constant and all-zero groups, one-sided groups, tiny values: exact or near-exact, never a
 * NaN or an infinite scale. */
START_TEST(test_degenerate_groups)
{
    float v[4 * 64];
    for (int i = 0; i < 64; i++) {
        v[i] = 0.0f;                              /* all zero */
        v[64 + i] = 0.25f;                        /* constant */
        v[128 + i] = 100.0f + 0.01f * (float)i;   /* far from zero, one-sided */
        v[192 + i] = 1e-9f * (float)(i - 32);     /* below fp16's subnormals */
    }
    weight_t w = {.dtype = DTYPE_F32, .rows = 4, .cols = 64, .data = v};
    for (int m = 0; m < QUANT_METHOD_COUNT; m++) {
        quant_params_t p = params(4, 64, (quant_method_t)m);
        quant_matrix_t *q = quantize(&w, &p, NULL, NULL);
        weight_t qw = quant_matrix_weight(q);
        float out[64];
        for (int r = 0; r < 4; r++) {
            ck_assert_int_eq(quant_row_f32(&qw, r, out), 0);
            float s = f16_to_f32(q->scales[r]);
            for (int i = 0; i < 64; i++) {
                ck_assert(isfinite(out[i]));
                /* Row 2's zero (about -2400) has an fp16 spacing of 2 codes, so
                 * it may be off by one code on top of the half-step rounding. */
                float tol = r == 0 ? 0.0f : r == 1 ? 0.25f * 1e-3f : r == 2 ? 1.5f * s : 1e-7f;
                ck_assert_msg(fabsf(out[i] - v[r * 64 + i]) <= tol, "row %d col %d: %g vs %g",
                              r, i, (double)out[i], (double)v[r * 64 + i]);
            }
        }
        quant_matrix_destroy(&q);
    }
}
END_TEST

START_TEST(test_bad_input)
{
    float v[2 * 64];
    for (int i = 0; i < 128; i++)
        v[i] = (float)i;
    weight_t w = {.dtype = DTYPE_F32, .rows = 2, .cols = 64, .data = v};
    quant_matrix_t *q = NULL;
    quant_params_t p = params(4, 64, QUANT_HQQ);
    ck_assert_int_eq(quant_matrix_new(&q, 2, 64, 4, 64), 0);
    /* A NaN or an infinity is named by its position. */
    v[70] = NAN;
    ck_assert_int_eq(quant_weight(q, &w, &p, NULL, NULL), RIVER_ERANGE);
    ck_assert_ptr_nonnull(strstr(river_err_detail(), "row 1, column 6"));
    v[70] = INFINITY;
    ck_assert_int_eq(quant_weight(q, &w, &p, NULL, NULL), RIVER_ERANGE);
    v[70] = 1e30f; /* a group range no fp16 scale holds */
    ck_assert_int_eq(quant_weight(q, &w, &p, NULL, NULL), RIVER_ERANGE);
    v[70] = 70;
    ck_assert_int_eq(quant_weight(q, &w, &p, NULL, NULL), 0);
    p.bits = 3; /* a width the output was not made for */
    ck_assert_int_eq(quant_weight(q, &w, &p, NULL, NULL), RIVER_EINVAL);
    p.bits = 5;
    ck_assert_int_eq(quant_params_check(&p, 64, "x"), RIVER_EINVAL);
    p = params(2, 24, QUANT_HQQ); /* 2- and 3-bit groups are runs of 16 */
    ck_assert_int_eq(quant_params_check(&p, 48, "x"), RIVER_EINVAL);
    ck_assert_ptr_nonnull(strstr(river_err_detail(), "multiple of 16"));
    quant_matrix_t *q3 = NULL;
    ck_assert_int_ne(quant_matrix_new(&q3, 2, 48, 3, 24), 0);
    ck_assert_ptr_null(q3);
    p = params(4, 48, QUANT_HQQ);
    ck_assert_int_eq(quant_weight(q, &w, &p, NULL, NULL), RIVER_ESHAPE);
    ck_assert_int_eq(quant_params_check(&p, 64, "x"), RIVER_ESHAPE);
    p = params(4, 64, QUANT_HQQ);
    p.hqq_p = 1.5f;
    ck_assert_int_eq(quant_weight(q, &w, &p, NULL, NULL), RIVER_EINVAL);
    p = params(4, 64, QUANT_HQQ);
    /* A quantized source (a quantized backbone's matrix) needs its groups; the CPU
     * backend's repacked layout is no source. */
    w.dtype = DTYPE_Q8;
    ck_assert_int_eq(quant_weight(q, &w, &p, NULL, NULL), RIVER_EFORMAT);
    w.dtype = DTYPE_Q4X8;
    ck_assert_int_eq(quant_weight(q, &w, &p, NULL, NULL), RIVER_EDTYPE);
    w.dtype = DTYPE_F32;
    w.rows = 3;
    ck_assert_int_eq(quant_weight(q, &w, &p, NULL, NULL), RIVER_ESHAPE);
    quant_matrix_destroy(&q);
    ck_assert_ptr_null(q);
    ck_assert_int_ne(quant_matrix_new(&q, 2, 64, 4, 0), 0);
    ck_assert_int_ne(quant_matrix_new(&q, 2, 64, 5, 64), 0);
    ck_assert_int_ne(quant_matrix_new(&q, 0, 64, 4, 64), 0);
    ck_assert_ptr_null(q);
    quant_method_t mm;
    ck_assert_int_eq(quant_method_parse("hqq", &mm), 0);
    ck_assert_int_eq(mm, QUANT_HQQ);
    ck_assert_int_eq(quant_method_parse("rtn", &mm), 0);
    ck_assert_int_eq(mm, QUANT_RTN);
    ck_assert_int_eq(quant_method_parse("awq", &mm), -1);
}
END_TEST

/* ---- the real models ---- */

/* The group for a matrix: 64 when it divides the columns, else the largest divisor below
 * 64 (stories260K's FFN is 172 = 4 * 43 wide). */
static int group_for(int64_t cols, int want)
{
    for (int g = want; g > 1; g--)
        if (cols % g == 0)
            return g;
    return 1;
}

/* For every layer matrix: HQQ's p = 0.7 objective and mean absolute error are both below
 * RTN's, at 4 bits. Prints per-layer averages. */
static void hqq_beats_rtn(const char *path)
{
    model_t *m = load(path);
    threadpool_t *pool = NULL;
    ck_assert_int_eq(threadpool_new(&pool, 2), 0);
    printf("%s (%d layers): 4-bit, per-layer means over the 7 matrices\n", path,
           m->cfg.n_layers);
    double tot[4] = {0};
    int odd_groups = 0;
    for (int l = 0; l < m->cfg.n_layers; l++) {
        double acc[4] = {0};
        for (int i = 0; i < 7; i++) {
            const weight_t *w = layer_matrix(&m->layers[l], i);
            int g = group_for(w->cols, 64);
            odd_groups += g != 64;
            quant_params_t pr = params(4, g, QUANT_RTN), ph = params(4, g, QUANT_HQQ);
            quant_matrix_t *qr = quantize(w, &pr, pool, NULL);
            quant_matrix_t *qh = quantize(w, &ph, pool, NULL);
            weight_t wr = quant_matrix_weight(qr), wh = quant_matrix_weight(qh);
            quant_error_t er, eh;
            ck_assert_int_eq(quant_error(w, &wr, 0.7, &er), 0);
            ck_assert_int_eq(quant_error(w, &wh, 0.7, &eh), 0);
            ck_assert_msg(eh.mae < er.mae, "%s layer %d %s: HQQ mae %g >= RTN %g", path, l,
                          matrix_names[i], eh.mae, er.mae);
            ck_assert_msg(eh.lp < er.lp, "%s layer %d %s: HQQ lp %g >= RTN %g", path, l,
                          matrix_names[i], eh.lp, er.lp);
            acc[0] += er.mae / 7;
            acc[1] += eh.mae / 7;
            acc[2] += er.lp / 7;
            acc[3] += eh.lp / 7;
            quant_matrix_destroy(&qr);
            quant_matrix_destroy(&qh);
        }
        printf("  layer %2d: mae RTN %.4e HQQ %.4e (%+.1f%%) | lp0.7 RTN %.4e HQQ %.4e "
               "(%+.1f%%)\n",
               l, acc[0], acc[1], 100 * (acc[1] / acc[0] - 1), acc[2], acc[3],
               100 * (acc[3] / acc[2] - 1));
        for (int k = 0; k < 4; k++)
            tot[k] += acc[k] / m->cfg.n_layers;
    }
    printf("  all layers: mae RTN %.4e HQQ %.4e (%+.1f%%) | lp0.7 RTN %.4e HQQ %.4e (%+.1f%%)\n",
           tot[0], tot[1], 100 * (tot[1] / tot[0] - 1), tot[2], tot[3],
           100 * (tot[3] / tot[2] - 1));
    if (odd_groups)
        printf("  note: %d matrices used a group below 64 (their columns are not a multiple "
               "of 64)\n", odd_groups);
    threadpool_destroy(&pool);
    model_destroy(&m);
}

START_TEST(test_hqq_beats_rtn_kjv)
{
    hqq_beats_rtn(KJV);
}
END_TEST

START_TEST(test_hqq_beats_rtn_tinystories)
{
    hqq_beats_rtn(TINY);
}
END_TEST

START_TEST(test_hqq_beats_rtn_stories260k)
{
    hqq_beats_rtn(STORIES);
}
END_TEST

/* 8-bit error is far below 4-bit error on every matrix of a real model. */
START_TEST(test_8bit_much_better)
{
    model_t *m = load(KJV);
    for (int l = 0; l < m->cfg.n_layers; l++)
        for (int i = 0; i < 7; i++) {
            const weight_t *w = layer_matrix(&m->layers[l], i);
            quant_params_t p4 = params(4, 64, QUANT_HQQ), p8 = params(8, 64, QUANT_HQQ);
            quant_stats_t s4, s8;
            quant_matrix_t *q4 = quantize(w, &p4, NULL, &s4);
            quant_matrix_t *q8 = quantize(w, &p8, NULL, &s8);
            ck_assert_msg(quant_stats_rel_fro(&s8) * 10 < quant_stats_rel_fro(&s4),
                          "layer %d %s: 8-bit %g, 4-bit %g", l, matrix_names[i],
                          quant_stats_rel_fro(&s8), quant_stats_rel_fro(&s4));
            ck_assert(quant_stats_mae(&s8) * 10 < quant_stats_mae(&s4));
            quant_matrix_destroy(&q4);
            quant_matrix_destroy(&q8);
        }
    model_destroy(&m);
}
END_TEST

/* ---- river files ---- */

static const char *tmp_path(const char *name)
{
    static char buf[4][512];
    static int k;
    k = (k + 1) % 4;
    /* drop() may have removed the directory since test_tmpdir() created it. */
    mkdir(test_tmpdir(), 0700);
    snprintf(buf[k], sizeof buf[k], "%s/%s", test_tmpdir(), name);
    return buf[k];
}

/* Removes a file a test wrote, and the per-process directory once it is empty. */
static void drop(const char *path)
{
    unlink(path);
    rmdir(test_tmpdir());
}

static void layer_progress(void *arg, int layer, const quant_stats_t *st, double seconds)
{
    int *calls = arg;
    (*calls)++;
    ck_assert(st->n > 0 && seconds >= 0);
    ck_assert(layer >= 1);
}

/* Builds kjv-12l's river (4-bit HQQ from layer 1), once while the file lasts. */
static const char *kjv_river(void)
{
    static char path[512];
    if (path[0] && access(path, R_OK) == 0)
        return path;
    snprintf(path, sizeof path, "%s", tmp_path("kjv-river.safetensors"));
    model_t *m = load(KJV);
    exitriver_build_opts_t o = exitriver_build_opts_default();
    int calls = 0;
    o.n_threads = 2;
    o.progress = layer_progress;
    o.progress_arg = &calls;
    quant_stats_t total;
    int err = exitriver_build(m, path, &o, &total);
    ck_assert_msg(err == 0, "exitriver_build: %s", river_err_detail());
    ck_assert_int_eq(calls, m->cfg.n_layers - 1);
    ck_assert(total.abs_err < total.rtn_abs_err);
    model_destroy(&m);
    return path;
}

START_TEST(test_river_round_trip)
{
    const char *path = kjv_river();
    model_t *m = load(KJV);
    exitriver_t *r = NULL;
    int err = exitriver_load(&r, m, path);
    ck_assert_msg(err == 0, "exitriver_load: %s", river_err_detail());
    ck_assert_int_eq(exitriver_start_layer(r), 1);
    ck_assert_int_eq(exitriver_bits(r), 4);
    ck_assert_int_eq(exitriver_group(r), 64);
    ck_assert_int_eq(exitriver_method(r), QUANT_HQQ);
    ck_assert_str_eq(exitriver_path(r), path);
    char fp[MODEL_FINGERPRINT_LEN];
    ck_assert_int_eq(model_fingerprint(m, fp), 0);
    ck_assert_str_eq(exitriver_fingerprint_of(r), fp);
    ck_assert_int_eq((int)strlen(fp), 32);
    ck_assert_ptr_null(exitriver_layer(r, 0));
    ck_assert_ptr_null(exitriver_layer(r, -1));
    ck_assert_ptr_null(exitriver_layer(r, m->cfg.n_layers));

    /* The metadata as written. */
    safetensors_t *f = NULL;
    ck_assert_int_eq(safetensors_open(&f, path), 0);
    ck_assert_str_eq(safetensors_metadata(f, "format"), "river");
    ck_assert_str_eq(safetensors_metadata(f, "fingerprint"), fp);
    ck_assert_str_eq(safetensors_metadata(f, "start_layer"), "1");
    ck_assert_str_eq(safetensors_metadata(f, "n_layers"), "12");
    ck_assert_str_eq(safetensors_metadata(f, "bits"), "4");
    ck_assert_str_eq(safetensors_metadata(f, "group"), "64");
    ck_assert_str_eq(safetensors_metadata(f, "method"), "hqq");
    /* 7 matrices of 11 layers plus the 8-bit LM head, each as codes, scales and zeros. */
    ck_assert_str_eq(safetensors_metadata(f, "head_bits"), "8");
    ck_assert_uint_eq(safetensors_count(f), 3 * 7 * 11 + 3);
    safetensors_destroy(&f);

    /* The head is the 8-bit quantization of the model's LM head, at the river's group. */
    const weight_t *rh = exitriver_head(r);
    ck_assert_ptr_nonnull(rh);
    ck_assert_int_eq(rh->dtype, DTYPE_Q8);
    ck_assert_int_eq(rh->rows, m->lm_head.rows);
    ck_assert_int_eq(rh->cols, m->lm_head.cols);
    quant_params_t hp = quant_params_default();
    hp.bits = 8;
    quant_matrix_t *hq = quantize(&m->lm_head, &hp, NULL, NULL);
    ck_assert(!memcmp(rh->data, hq->codes, quant_matrix_code_bytes(hq)));
    ck_assert(!memcmp(rh->scales, hq->scales, quant_matrix_group_count(hq) * 2));
    quant_matrix_destroy(&hq);

    /* Every matrix is what the quantizer produces on its own, and dequantizes to it. */
    quant_params_t p = quant_params_default();
    float *a = malloc(sizeof(float) * 1024), *b = malloc(sizeof(float) * 1024);
    for (int l = 1; l < m->cfg.n_layers; l++) {
        const layer_weights_t *L = exitriver_layer(r, l), *B = &m->layers[l];
        ck_assert_ptr_nonnull(L);
        ck_assert_ptr_eq(L->attn_norm.data, B->attn_norm.data);
        ck_assert_ptr_eq(L->ffn_norm.data, B->ffn_norm.data);
        ck_assert_int_eq(L->attn_norm.dtype, B->attn_norm.dtype);
        for (int i = 0; i < 7; i++) {
            const weight_t *rw = layer_matrix(L, i), *bw = layer_matrix(B, i);
            ck_assert_int_eq(rw->dtype, DTYPE_Q4);
            ck_assert_int_eq(rw->rows, bw->rows);
            ck_assert_int_eq(rw->cols, bw->cols);
            ck_assert_int_eq(rw->group, 64);
            ck_assert_uint_eq((uintptr_t)rw->scales % 2, 0);
            quant_matrix_t *q = quantize(bw, &p, NULL, NULL);
            ck_assert(!memcmp(rw->data, q->codes, quant_matrix_code_bytes(q)));
            ck_assert(!memcmp(rw->scales, q->scales, quant_matrix_group_count(q) * 2));
            ck_assert(!memcmp(rw->zeros, q->zeros, quant_matrix_group_count(q) * 2));
            weight_t qw = quant_matrix_weight(q);
            for (int64_t row = 0; row < rw->rows; row += 37) {
                ck_assert_int_eq(quant_row_f32(rw, row, a), 0);
                ck_assert_int_eq(quant_row_f32(&qw, row, b), 0);
                ck_assert(!memcmp(a, b, sizeof(float) * (size_t)rw->cols));
            }
            quant_matrix_destroy(&q);
        }
    }
    free(a);
    free(b);
    exitriver_destroy(&r);
    ck_assert_ptr_null(r);
    model_destroy(&m);
    drop(path);
}
END_TEST

START_TEST(test_river_wrong_model)
{
    const char *path = kjv_river();
    model_t *m = load(TINY);
    exitriver_t *r = NULL;
    ck_assert_int_eq(exitriver_load(&r, m, path), RIVER_EINVAL);
    ck_assert_ptr_null(r);
    const char *d = river_err_detail();
    ck_assert_msg(strstr(d, path) && strstr(d, TINY) && strstr(d, "different model"), "%s", d);
    printf("wrong model: %s\n", d);
    model_destroy(&m);
    drop(path);
}
END_TEST

/* The same model's other representation (the llama2.c copy of tinystories-656k, whose
 * attention rows are permuted) has another fingerprint; a model's own fingerprint is stable. */
START_TEST(test_fingerprint)
{
    model_t *a = load(KJV), *b = load(KJV), *c = load(TINY);
    char fa[MODEL_FINGERPRINT_LEN], fb[MODEL_FINGERPRINT_LEN], fc[MODEL_FINGERPRINT_LEN];
    ck_assert_int_eq(model_fingerprint(a, fa), 0);
    ck_assert_int_eq(model_fingerprint(b, fb), 0);
    ck_assert_int_eq(model_fingerprint(c, fc), 0);
    ck_assert_str_eq(fa, fb);
    ck_assert_str_ne(fa, fc);
    /* One changed weight inside a sampled window changes it. */
    float *copy = malloc((size_t)(b->layers[3].wq.rows * b->layers[3].wq.cols) * 4);
    memcpy(copy, b->layers[3].wq.data, (size_t)(b->layers[3].wq.rows * b->layers[3].wq.cols) * 4);
    copy[0] += 1.0f;
    b->layers[3].wq.data = copy;
    ck_assert_int_eq(model_fingerprint(b, fb), 0);
    ck_assert_str_ne(fa, fb);
    b->layers[3].wq.data = a->layers[3].wq.data;
    free(copy);
    model_destroy(&a);
    model_destroy(&b);
    model_destroy(&c);
}
END_TEST

/* Truncated files at every interesting length fail cleanly. */
START_TEST(test_river_truncated)
{
    const char *path = kjv_river();
    size_t len;
    unsigned char *bytes = test_read_file(path, &len);
    ck_assert_ptr_nonnull(bytes);
    model_t *m = load(KJV);
    const size_t cuts[] = {0, 4, 8, 100, len / 3, len / 2, len - 1000, len - 1};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        const char *p = test_write_tmp("cut.safetensors", bytes, cuts[i]);
        ck_assert_ptr_nonnull(p);
        exitriver_t *r = NULL;
        int err = exitriver_load(&r, m, p);
        ck_assert_msg(err < 0, "a river cut at %zu of %zu bytes loaded", cuts[i], len);
        ck_assert_ptr_null(r);
    }
    /* Garbage in the header length. */
    bytes[7] = 0x7f;
    const char *p = test_write_tmp("badlen.safetensors", bytes, len);
    exitriver_t *r = NULL;
    ck_assert_int_lt(exitriver_load(&r, m, p), 0);
    ck_assert_int_eq(exitriver_load(&r, m, tmp_path("no-such-river.safetensors")), RIVER_ENOTFOUND);
    free(bytes);
    model_destroy(&m);
    drop(tmp_path("cut.safetensors"));
    drop(tmp_path("badlen.safetensors"));
    drop(path);
}
END_TEST

/* Copies the river at src to dst, changing one metadata value (key = value, or dropping
 * the key when value is NULL), dropping tensor `drop`, and giving tensor `reshape` one row
 * less; returns dst. */
static const char *rewrite(const char *src, const char *dst, const char *key, const char *value,
                           const char *drop, const char *reshape)
{
    static const char *keys[] = {"format", "format_version", "fingerprint", "source",
                                 "start_layer", "n_layers", "bits", "group", "method", "hqq"};
    safetensors_t *f = NULL;
    ck_assert_int_eq(safetensors_open(&f, src), 0);
    safetensors_writer_t *w = NULL;
    ck_assert_int_eq(safetensors_writer_new(&w, dst), 0);
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        const char *v = safetensors_metadata(f, keys[i]);
        if (key && !strcmp(key, keys[i]))
            v = value;
        if (v)
            ck_assert_int_eq(safetensors_writer_set_metadata(w, keys[i], v), 0);
    }
    if (key && !safetensors_metadata(f, key) && value)
        ck_assert_int_eq(safetensors_writer_set_metadata(w, key, value), 0);
    size_t n = safetensors_count(f);
    for (size_t i = 0; i < n; i++) {
        const safetensors_tensor_t *t = safetensors_tensor_at(f, i);
        if (drop && !strcmp(t->name, drop))
            continue;
        int64_t shape[SAFETENSORS_MAX_DIMS];
        memcpy(shape, t->shape, sizeof shape);
        if (reshape && !strcmp(t->name, reshape))
            shape[0]--;
        ck_assert_int_eq(safetensors_writer_add(w, t->name, t->dtype, t->n_dims, shape), 0);
    }
    ck_assert_int_eq(safetensors_writer_begin(w), 0);
    for (size_t i = 0; i < n; i++) {
        const safetensors_tensor_t *t = safetensors_tensor_at(f, i);
        if (drop && !strcmp(t->name, drop))
            continue;
        size_t bytes = t->nbytes;
        if (reshape && !strcmp(t->name, reshape))
            bytes -= bytes / (size_t)t->shape[0];
        ck_assert_int_eq(safetensors_writer_write(w, t->data, bytes), 0);
    }
    ck_assert_int_eq(safetensors_writer_finish(w), 0);
    safetensors_writer_destroy(&w);
    safetensors_destroy(&f);
    return dst;
}

static void expect_load_error(const model_t *m, const char *path, int want, const char *needle)
{
    exitriver_t *r = NULL;
    int err = exitriver_load(&r, m, path);
    ck_assert_msg(err == want, "%s: got %s (%s), want %s", path, river_err_name(err),
                  river_err_detail(), river_err_name(want));
    ck_assert_ptr_null(r);
    if (needle)
        ck_assert_msg(strstr(river_err_detail(), needle), "'%s' lacks '%s'", river_err_detail(),
                      needle);
}

START_TEST(test_river_corrupt)
{
    const char *src = kjv_river();
    const char *dst = tmp_path("bad.safetensors");
    model_t *m = load(KJV);
    /* The unchanged copy loads: the rewriting itself is sound. */
    exitriver_t *r = NULL;
    ck_assert_int_eq(exitriver_load(&r, m, rewrite(src, dst, NULL, NULL, NULL, NULL)), 0);
    exitriver_destroy(&r);

    expect_load_error(m, rewrite(src, dst, "format", "gguf", NULL, NULL), RIVER_EFORMAT,
                      "not a river file");
    expect_load_error(m, rewrite(src, dst, "format", NULL, NULL, NULL), RIVER_EFORMAT, NULL);
    expect_load_error(m, rewrite(src, dst, "format_version", "9", NULL, NULL),
                      RIVER_EUNSUPPORTED, NULL);
    expect_load_error(m, rewrite(src, dst, "fingerprint", NULL, NULL, NULL), RIVER_EFORMAT,
                      "fingerprint");
    expect_load_error(m, rewrite(src, dst, "fingerprint", "0123", NULL, NULL), RIVER_EINVAL,
                      "different model");
    expect_load_error(m, rewrite(src, dst, "bits", "5", NULL, NULL), RIVER_EFORMAT, "bits");
    expect_load_error(m, rewrite(src, dst, "bits", "4x", NULL, NULL), RIVER_EFORMAT, "bits");
    expect_load_error(m, rewrite(src, dst, "bits", "8", NULL, NULL), RIVER_ESHAPE, NULL);
    expect_load_error(m, rewrite(src, dst, "group", "0", NULL, NULL), RIVER_EFORMAT, "group");
    expect_load_error(m, rewrite(src, dst, "group", "100", NULL, NULL), RIVER_EFORMAT,
                      "does not divide");
    expect_load_error(m, rewrite(src, dst, "group", "32", NULL, NULL), RIVER_ESHAPE, NULL);
    expect_load_error(m, rewrite(src, dst, "start_layer", "12", NULL, NULL), RIVER_EFORMAT,
                      NULL);
    expect_load_error(m, rewrite(src, dst, "start_layer", "-1", NULL, NULL), RIVER_EFORMAT,
                      NULL);
    /* Layer 0 was never written. */
    expect_load_error(m, rewrite(src, dst, "start_layer", "0", NULL, NULL), RIVER_ENOTFOUND,
                      "layers.0.wq");
    expect_load_error(m, rewrite(src, dst, "n_layers", "13", NULL, NULL), RIVER_EFORMAT, NULL);
    expect_load_error(m, rewrite(src, dst, "method", "awq", NULL, NULL), RIVER_EFORMAT,
                      "method");
    expect_load_error(m, rewrite(src, dst, NULL, NULL, "layers.5.w_up.zeros", NULL),
                      RIVER_ENOTFOUND, "layers.5.w_up.zeros");
    expect_load_error(m, rewrite(src, dst, NULL, NULL, NULL, "layers.11.w_down.codes"),
                      RIVER_ESHAPE, "layers.11.w_down.codes");
    expect_load_error(m, rewrite(src, dst, NULL, NULL, NULL, "layers.2.wk.scales"),
                      RIVER_ESHAPE, "layers.2.wk.scales");
    /* A river may start later than it was built to: layers before its start are ignored. */
    ck_assert_int_eq(exitriver_load(&r, m, rewrite(src, dst, "start_layer", "6", NULL, NULL)), 0);
    ck_assert_int_eq(exitriver_start_layer(r), 6);
    ck_assert_ptr_null(exitriver_layer(r, 5));
    ck_assert_ptr_nonnull(exitriver_layer(r, 6));
    exitriver_destroy(&r);
    /* A plain checkpoint is not a river. */
    expect_load_error(m, KJV "/model.safetensors", RIVER_EFORMAT, "not a river file");
    model_destroy(&m);
    drop(dst);
    drop(src);
}
END_TEST

/* A wrong dtype for a tensor. */
/* 2- and 3-bit rivers of kjv-12l (groups of 32, a 2-bit head): the file records the width,
 * every matrix loads as Q2/Q3 with the quantizer's bytes in cols/4 (+ cols/8) a row, and
 * metadata that disagrees with the codes is refused: another width (the codes' shape no
 * longer fits), a group that is no run of 16, a width this build does not read. */
START_TEST(test_river_lowbit)
{
    model_t *m = load(KJV);
    for (int bits = 2; bits <= 3; bits++) {
        const char *path = tmp_path(bits == 2 ? "kjv-river-q2.safetensors"
                                              : "kjv-river-q3.safetensors");
        exitriver_build_opts_t o = exitriver_build_opts_default();
        o.quant.bits = bits;
        o.quant.group = 32;
        o.head_bits = 2;
        o.n_threads = 2;
        quant_stats_t total;
        ck_assert_msg(exitriver_build(m, path, &o, &total) == 0, "%s", river_err_detail());
        ck_assert(total.abs_err <= total.rtn_abs_err);
        exitriver_t *r = NULL;
        ck_assert_msg(exitriver_load(&r, m, path) == 0, "%s", river_err_detail());
        ck_assert_int_eq(exitriver_bits(r), bits);
        ck_assert_int_eq(exitriver_group(r), 32);
        safetensors_t *f = NULL;
        ck_assert_int_eq(safetensors_open(&f, path), 0);
        ck_assert_str_eq(safetensors_metadata(f, "bits"), bits == 2 ? "2" : "3");
        ck_assert_str_eq(safetensors_metadata(f, "head_bits"), "2");
        safetensors_destroy(&f);
        ck_assert_int_eq(exitriver_head(r)->dtype, DTYPE_Q2);
        quant_params_t p = o.quant;
        for (int l = 1; l < m->cfg.n_layers; l += 5)
            for (int i = 0; i < 7; i++) {
                const weight_t *rw = layer_matrix(exitriver_layer(r, l), i);
                const weight_t *bw = layer_matrix(&m->layers[l], i);
                ck_assert_int_eq(rw->dtype, bits == 2 ? DTYPE_Q2 : DTYPE_Q3);
                quant_matrix_t *q = quantize(bw, &p, NULL, NULL);
                ck_assert_uint_eq(quant_matrix_code_bytes(q),
                                  (size_t)bw->rows * (size_t)(bw->cols / 4 +
                                                              (bits == 3 ? bw->cols / 8 : 0)));
                ck_assert(!memcmp(rw->data, q->codes, quant_matrix_code_bytes(q)));
                ck_assert(!memcmp(rw->zeros, q->zeros, quant_matrix_group_count(q) * 2));
                quant_matrix_destroy(&q);
            }
        /* The bytes a token reads, counted here from the layout: codes at bits/8 bytes a
         * weight, 4 bytes of scale and zero per group, the backbone's f32 norms; a draft step
         * exiting after 4 layers reads the embedding row, layers 0..3 in f32, the river's
         * layers 4..11, the final norm and the river's 2-bit head. */
        int64_t want_river = 0, want_draft = 0;
        for (int l = 0; l < m->cfg.n_layers; l++) {
            const layer_weights_t *B = &m->layers[l];
            int64_t norms = 4 * (B->attn_norm.rows * B->attn_norm.cols +
                                 B->ffn_norm.rows * B->ffn_norm.cols), river = norms, full = norms;
            for (int i = 0; i < 7; i++) {
                const weight_t *bw = layer_matrix(B, i);
                river += bw->rows * (bw->cols * bits / 8 + bw->cols / 32 * 4);
                full += bw->rows * bw->cols * 4;
            }
            if (l >= 4)
                want_river += river;
            want_draft += l < 4 ? full : river;
        }
        const weight_t *h = &m->lm_head;
        want_draft += 4 * m->cfg.dim + 4 * m->cfg.dim + h->rows * (h->cols / 4 + h->cols / 32 * 4);
        const layer_weights_t *layers[16] = {0};
        ck_assert_int_le(m->cfg.n_layers, 16);
        for (int l = 0; l < m->cfg.n_layers; l++)
            layers[l] = exitriver_layer(r, l);
        exit_config_t ex = {.policy = {.rule = EXIT_RULE_FIXED, .kv = EXIT_KV_RIVER},
                            .river = layers, .river_start = exitriver_start_layer(r),
                            .river_head = exitriver_head(r)};
        spec_bytes_t draft, plain;
        spec_path_bytes(m, &ex, 4, 0, DTYPE_F32, &draft);
        spec_path_bytes(m, NULL, m->cfg.n_layers, 0, DTYPE_F32, &plain);
        ck_assert_double_eq(draft.river_layers, (double)want_river);
        ck_assert_double_eq(draft.total, (double)want_draft);
        ck_assert_double_eq(plain.total, (double)model_bytes_per_token(m));
        ck_assert_double_lt(draft.total, plain.total);
        exitriver_destroy(&r);
        const char *dst = tmp_path("kjv-river-lowbit-bad.safetensors");
        expect_load_error(m, rewrite(path, dst, "bits", bits == 2 ? "3" : "2", NULL, NULL),
                          RIVER_ESHAPE, NULL);
        expect_load_error(m, rewrite(path, dst, "group", "8", NULL, NULL), RIVER_EFORMAT,
                          "multiple of 16");
        expect_load_error(m, rewrite(path, dst, "bits", "5", NULL, NULL), RIVER_EFORMAT, "bits");
        drop(dst);
        drop(path);
    }
    /* A 3-bit river with groups of 24 is refused before anything is written. */
    exitriver_build_opts_t o = exitriver_build_opts_default();
    o.quant.bits = 3;
    o.quant.group = 24;
    const char *path = tmp_path("kjv-river-g24.safetensors");
    ck_assert_int_eq(exitriver_build(m, path, &o, NULL), RIVER_EINVAL);
    ck_assert_int_ne(access(path, F_OK), 0);
    model_destroy(&m);
}
END_TEST

START_TEST(test_river_wrong_dtype)
{
    const char *src = kjv_river();
    const char *dst = tmp_path("dtype.safetensors");
    safetensors_t *f = NULL;
    ck_assert_int_eq(safetensors_open(&f, src), 0);
    safetensors_writer_t *w = NULL;
    ck_assert_int_eq(safetensors_writer_new(&w, dst), 0);
    const char *keys[] = {"format", "format_version", "fingerprint", "start_layer",
                          "n_layers", "bits", "group", "method"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        ck_assert_int_eq(safetensors_writer_set_metadata(w, keys[i],
                                                         safetensors_metadata(f, keys[i])), 0);
    size_t n = safetensors_count(f);
    for (size_t i = 0; i < n; i++) {
        const safetensors_tensor_t *t = safetensors_tensor_at(f, i);
        /* Same bytes, read as I16 instead of F16. */
        safetensors_dtype_t dt = !strcmp(t->name, "layers.4.wo.scales") ? SAFETENSORS_I16
                                                                         : t->dtype;
        ck_assert_int_eq(safetensors_writer_add(w, t->name, dt, t->n_dims, t->shape), 0);
    }
    ck_assert_int_eq(safetensors_writer_begin(w), 0);
    for (size_t i = 0; i < n; i++) {
        const safetensors_tensor_t *t = safetensors_tensor_at(f, i);
        ck_assert_int_eq(safetensors_writer_write(w, t->data, t->nbytes), 0);
    }
    ck_assert_int_eq(safetensors_writer_finish(w), 0);
    safetensors_writer_destroy(&w);
    safetensors_destroy(&f);
    model_t *m = load(KJV);
    expect_load_error(m, dst, RIVER_EDTYPE, "layers.4.wo.scales");
    model_destroy(&m);
    drop(dst);
    drop(src);
}
END_TEST

/* The llama2.c model: a group that does not divide every matrix fails before anything is
 * written; one that does (4 divides 64 and 172) builds an 8-bit RTN river that loads. */
START_TEST(test_river_stories260k)
{
    model_t *m = load(STORIES);
    exitriver_build_opts_t o = exitriver_build_opts_default();
    o.n_threads = 1;
    const char *path = tmp_path("stories.safetensors");
    int err = exitriver_build(m, path, &o, NULL);
    ck_assert_int_eq(err, RIVER_ESHAPE);
    ck_assert_ptr_nonnull(strstr(river_err_detail(), "172"));
    ck_assert_int_eq(access(path, F_OK), -1);

    o.quant = params(8, 4, QUANT_RTN);
    o.start_layer = 2;
    ck_assert_int_eq(exitriver_build(m, path, &o, NULL), 0);
    exitriver_t *r = NULL;
    ck_assert_int_eq(exitriver_load(&r, m, path), 0);
    ck_assert_int_eq(exitriver_bits(r), 8);
    ck_assert_int_eq(exitriver_group(r), 4);
    ck_assert_int_eq(exitriver_method(r), QUANT_RTN);
    ck_assert_ptr_null(exitriver_layer(r, 1));
    const layer_weights_t *L = exitriver_layer(r, 4);
    ck_assert_ptr_nonnull(L);
    ck_assert_int_eq(L->w_down.dtype, DTYPE_Q8);
    ck_assert_int_eq(L->w_down.cols, 172);
    quant_error_t e;
    ck_assert_int_eq(quant_error(&m->layers[4].w_down, &L->w_down, 0.7, &e), 0);
    ck_assert(e.rel_fro < 0.01);
    exitriver_destroy(&r);

    char def[1024];
    ck_assert_int_eq(exitriver_default_path(m, &o.quant, def, sizeof def), 0);
    ck_assert_str_eq(def, TEST_DATA "/stories260K/stories260K-river-q8-g4-rtn.safetensors");
    o.start_layer = 5;
    ck_assert_int_eq(exitriver_build(m, path, &o, NULL), RIVER_EINVAL);
    model_destroy(&m);
    drop(path);

    m = load(KJV);
    quant_params_t p = quant_params_default();
    ck_assert_int_eq(exitriver_default_path(m, &p, def, sizeof def), 0);
    ck_assert_str_eq(def, KJV "/river-q4-g64-hqq.safetensors");
    model_destroy(&m);
}
END_TEST

/* stories260K's FFN has 172 inputs, which no group of 64 divides: river quant without
 * --group picks the largest group that divides every matrix (4), says so, and the river
 * it writes loads with that group; --group 64 named explicitly is refused, naming 4. */
START_TEST(test_quant_group_fit)
{
    model_t *m = NULL;
    ck_assert_int_eq(model_load(&m, STORIES), 0);
    exitriver_build_opts_t o = exitriver_build_opts_default();
    ck_assert_int_eq(exitriver_group_fit(m, &o, 64), 4);
    o.quant.bits = 8;
    ck_assert_int_eq(exitriver_group_fit(m, &o, 3), 2);
    char out_path[320];
    snprintf(out_path, sizeof out_path, "%s/fit.safetensors", test_tmpdir());
    char *argv[] = {(char *)test_bin("river"), "quant", "--model", STORIES, "--out", out_path,
                    "--threads", "1", NULL};
    char *out;
    ck_assert_int_eq(test_capture(argv, NULL, 1, &out), 0);
    ck_assert_msg(strstr(out, "no group of 64 divides every matrix") &&
                  strstr(out, "using the largest that does, 4"), "river quant said: %.400s", out);
    free(out);
    exitriver_t *r = NULL;
    ck_assert_msg(exitriver_load(&r, m, out_path) == 0, "%s", river_err_detail());
    ck_assert_int_eq(exitriver_group(r), 4);
    exitriver_destroy(&r);
    char *argv2[] = {(char *)test_bin("river"), "quant", "--model", STORIES, "--out", out_path,
                     "--group", "64", "--threads", "1", NULL};
    remove(out_path);
    ck_assert_int_ne(test_capture(argv2, NULL, 1, &out), 0);
    ck_assert_msg(strstr(out, "not a multiple of the group size 64") &&
                  strstr(out, "divides every matrix is 4"), "river quant said: %.400s", out);
    free(out);
    model_destroy(&m);
}
END_TEST

/* The number after "key": in a JSON line; fails the test where there is none. */
static double bench_num(const char *out, const char *key)
{
    char k[96];
    snprintf(k, sizeof k, "\"%s\":", key);
    const char *f = strstr(out, k);
    ck_assert_msg(f, "no %s in %.600s", k, out);
    return strtod(f + strlen(k), NULL);
}

/* The numbers `river bench` prints come out and are figures: --split-costs on a river
 * gives one JSON line per batch size, 1..64 rows, with positive layer times; the decode
 * run gives tokens/s, a read bandwidth and a roofline fraction above zero. */
START_TEST(test_bench_prints_figures)
{
    char river_path[320];
    snprintf(river_path, sizeof river_path, "%s/bench.safetensors", test_tmpdir());
    char *q[] = {(char *)test_bin("river"), "quant", "--model", STORIES, "--out", river_path,
                 "--threads", "1", NULL};
    char *out;
    ck_assert_int_eq(test_capture(q, NULL, 1, &out), 0);
    free(out);
    /* On the CPU and on a device backend (opaque): a GPU's river and backbone layers are
     * timed the same way, each pass ended by the backend's sync. */
    static const char *const devices[] = {"cpu", "opaque"};
    for (int d = 0; d < 2; d++) {
        char *sc[] = {(char *)test_bin("river"), "bench", "--model", STORIES, "--threads", "1",
                      "--device", (char *)devices[d], "--split-costs", river_path, "--output",
                      "json", NULL};
        ck_assert_int_eq(test_capture(sc, NULL, 0, &out), 0);
        static const int rows[] = {1, 2, 4, 8, 16, 32, 64};
        const char *line = out;
        for (int i = 0; i < 7; i++) {
            ck_assert_msg(line && *line, "bench --split-costs on %s printed %d lines: %.400s",
                          devices[d], i, out);
            int n = 0;
            double tb = 0, tr = 0;
            const char *f = strstr(line, "\"rows\":");
            ck_assert_ptr_nonnull(f);
            ck_assert_int_eq(sscanf(f, "\"rows\":%d,\"backbone_ms\":%lf,\"river_ms\":%lf", &n,
                                    &tb, &tr), 3);
            ck_assert_int_eq(n, rows[i]);
            ck_assert_msg(tb > 0 && tr > 0, "rows %d: T_B %g T_R %g", n, tb, tr);
            line = strchr(line, '\n');
            line = line ? line + 1 : NULL;
        }
        free(out);
    }
    char *dec[] = {(char *)test_bin("river"), "bench", "--model", STORIES, "--threads", "1",
                   "--prompt-len", "4", "--gen-len", "4", "--runs", "2", "--bandwidth-mib",
                   "16", "--output", "json", NULL};
    ck_assert_int_eq(test_capture(dec, NULL, 0, &out), 0);
    const char *keys[] = {"\"decode_tok_s\":", "\"read_bandwidth_gbs\":",
                          "\"roofline_fraction\":", "\"read_bandwidth_widest_gbs\":",
                          "\"roofline_fraction_widest\":"};
    for (int k = 0; k < 5; k++) {
        const char *f = strstr(out, keys[k]);
        ck_assert_msg(f, "no %s in %.400s", keys[k], out);
        double v = strtod(f + strlen(keys[k]), NULL);
        ck_assert_msg(v > 0, "%s %g", keys[k], v);
    }
    /* Four decode steps are too few pairs for the paired fraction; eight are enough. */
    ck_assert_msg(!strstr(out, "\"roofline_fraction_paired\":"), "%.400s", out);
    /* Prefill's arithmetic for stories260K (dim 64, FFN 172, 5 layers, 8 heads and 4 KV
     * heads of 8, vocabulary 512) at 4 tokens: per layer 64 x (2 x 64 + 2 x 32) + 3 x 64 x
     * 172 multiply-adds, attention 64 x 5 / 2 x 2, the head 512 x 64 once in 4 tokens; and
     * its rate is that times the prefill tokens/s. */
    const char *gk = strstr(out, "\"prefill_gflop_per_token\":");
    const char *rk = strstr(out, "\"prefill_gflops\":"), *tk = strstr(out, "\"prefill_tok_s\":");
    ck_assert_msg(gk && rk && tk, "%.400s", out);
    double gflop = strtod(gk + strlen("\"prefill_gflop_per_token\":"), NULL);
    double rate = strtod(rk + strlen("\"prefill_gflops\":"), NULL);
    double tps = strtod(tk + strlen("\"prefill_tok_s\":"), NULL);
    double want = 2.0 * ((64.0 * 192 + 3.0 * 64 * 172 + 2.0 * 64 * 5 / 2) * 5 + 512.0 * 64 / 4) / 1e9;
    ck_assert_msg(fabs(gflop - want) <= 1e-9 * want, "prefill_gflop_per_token %.9g, want %.9g",
                  gflop, want);
    ck_assert_msg(fabs(rate - gflop * tps) <= 1e-6 * rate, "prefill_gflops %g, %g x %g", rate,
                  gflop, tps);
    free(out);
    char *dec8[] = {(char *)test_bin("river"), "bench", "--model", STORIES, "--threads", "1",
                    "--prompt-len", "4", "--gen-len", "8", "--runs", "1", "--bandwidth-mib",
                    "16", "--output", "json", NULL};
    ck_assert_int_eq(test_capture(dec8, NULL, 0, &out), 0);
    double paired = bench_num(out, "roofline_fraction_paired");
    ck_assert_msg(paired > 0 && isfinite(paired), "roofline_fraction_paired %g", paired);
    free(out);
    /* The weights kept in the mapped checkpoint (the A/B against the huge-page copies);
     * a mode that is neither is refused, naming it. */
    char *mapped[] = {(char *)test_bin("river"), "bench", "--model", STORIES, "--threads", "1",
                      "--prompt-len", "4", "--gen-len", "4", "--runs", "1", "--bandwidth-mib",
                      "16", "--weights", "mapped", "--output", "json", NULL};
    ck_assert_int_eq(test_capture(mapped, NULL, 0, &out), 0);
    ck_assert_msg(strstr(out, "\"decode_tok_s\":"), "%.400s", out);
    free(out);
    char *bad[] = {(char *)test_bin("river"), "bench", "--model", STORIES,
                   "--weights", "huge", NULL};
    ck_assert_int_eq(test_capture(bad, NULL, 1, &out), 1);
    ck_assert_msg(strstr(out, "weights 'huge'") && strstr(out, "mapped"), "%.400s", out);
    free(out);
    remove(river_path);
}
END_TEST

/* `river bench --profile` times decode steps only: after a prompt of more than one prefill
 * chunk (256 tokens), no matmul or attention of its window ran more than one row of x. */
START_TEST(test_bench_profile_window)
{
    char *b[] = {(char *)test_bin("river"), "bench", "--model", STORIES, "--threads", "1",
                 "--profile", "--prompt-len", "300", "--gen-len", "3", "--bandwidth-mib", "16",
                 "--output", "json", NULL};
    char *out;
    ck_assert_msg(test_capture(b, NULL, 0, &out) == 0, "%s", out);
    ck_assert_int_eq((int)bench_num(out, "steps"), 3);
    /* n is the rows of x for these ops (for others, such as add, their width). */
    const char *ops[] = {"{\"op\":\"matmul\"", "{\"op\":\"attention\""};
    int n_ops = 0;
    for (int k = 0; k < 2; k++)
        for (const char *f = strstr(out, ops[k]); f; f = strstr(f + 1, ops[k])) {
            const char *n = strstr(f, "\"n\":");
            ck_assert_ptr_nonnull(n);
            ck_assert_msg(strtol(n + 4, NULL, 10) == 1, "an op of %ld rows in the window: "
                          "%.300s", strtol(n + 4, NULL, 10), f);
            n_ops++;
        }
    ck_assert_int_ge(n_ops, 5);
    free(out);
}
END_TEST

/* `river bench --profile-prefill` times the prompt's steps only: a prompt of 300 tokens
 * runs its matmuls on chunks of 256 and 44 rows, and the one row of the last prompt
 * position's logits on the head; no decode step's one-row matmul of a layer is in the
 * window. It prints text only and says so to --output json. */
START_TEST(test_bench_profile_prefill)
{
    char *b[] = {(char *)test_bin("river"), "bench", "--model", STORIES, "--threads", "1",
                 "--profile-prefill", "--prompt-len", "300", "--gen-len", "3", NULL};
    char *out;
    ck_assert_msg(test_capture(b, NULL, 0, &out) == 0, "%s", out);
    ck_assert_msg(strstr(out, "prefill profile: 300 tokens in chunks of 256"), "%s", out);
    int chunks[2] = {0, 0}, head = 0;
    for (const char *l = out; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
        char shape[64];
        int n = 0;
        long long calls = 0;
        if (strncmp(l, "matmul ", 7) != 0 ||
            sscanf(l, "matmul %*s %63s %d %lld", shape, &n, &calls) != 3)
            continue;
        if (n == 256 || n == 44)
            chunks[n == 44]++;
        else if (n == 1 && !strcmp(shape, "512x64") && calls == 1)
            head++;
        else
            ck_abort_msg("a matmul of %d rows on %s in the window: %.200s", n, shape, l);
    }
    ck_assert_int_ge(chunks[0], 4);
    ck_assert_int_eq(chunks[0], chunks[1]);
    ck_assert_int_eq(head, 1);
    free(out);
    char *j[] = {(char *)test_bin("river"), "bench", "--model", STORIES, "--profile-prefill",
                 "--output", "json", NULL};
    ck_assert_int_ne(test_capture(j, NULL, 1, &out), 0);
    ck_assert_msg(strstr(out, "--profile-prefill prints text only"), "%s", out);
    free(out);
}
END_TEST

/* `river bench` measures the compute peak after each run, the float one for a float model
 * and the 8-bit one for a q8 backbone, and prefill's fraction of it: with one run, exactly
 * prefill_gflops over compute_peak_gflops. A device backend has no CPU peak to report. */
START_TEST(test_bench_compute_peak)
{
    char dir[320], q8[340];
    snprintf(dir, sizeof dir, "%s/peak-tiny", test_tmpdir());
    snprintf(q8, sizeof q8, "%s/peak-tiny-q8", test_tmpdir());
    char *synth[] = {(char *)test_bin("river"), "synth", "--shape", "llama3-tiny", "--out", dir,
                     "--quiet", NULL};
    char *quant[] = {(char *)test_bin("river"), "quant", "--backbone", "q8", "--model", dir,
                     "--out", q8, "--threads", "1", NULL};
    char *out;
    ck_assert_int_eq(test_capture(synth, NULL, 1, &out), 0);
    free(out);
    ck_assert_int_eq(test_capture(quant, NULL, 1, &out), 0);
    free(out);
    const char *models[] = {STORIES, q8}, *kinds[] = {"\"f32\"", "\"int8\""};
    for (int m = 0; m < 2; m++) {
        char *b[] = {(char *)test_bin("river"), "bench", "--model", (char *)models[m],
                     "--threads", "1", "--prompt-len", "8", "--gen-len", "2", "--runs", "1",
                     "--bandwidth-mib", "16", "--output", "json", NULL};
        ck_assert_int_eq(test_capture(b, NULL, 0, &out), 0);
        const char *kk = strstr(out, "\"compute_peak_kind\":");
        ck_assert_msg(kk && !strncmp(kk + strlen("\"compute_peak_kind\":"), kinds[m],
                                     strlen(kinds[m])),
                      "%s: want kind %s in %.600s", models[m], kinds[m], out);
        double peak = bench_num(out, "compute_peak_gflops");
        double rate = bench_num(out, "prefill_gflops");
        double frac = bench_num(out, "prefill_peak_fraction");
        ck_assert_msg(peak > 0 && rate > 0, "%s: peak %g, prefill %g GFLOP/s", models[m], peak,
                      rate);
        ck_assert_msg(fabs(frac - rate / peak) <= 1e-6 * frac + 1e-12,
                      "%s: prefill_peak_fraction %g, %g / %g", models[m], frac, rate, peak);
        free(out);
    }
    char *dev[] = {(char *)test_bin("river"), "bench", "--model", STORIES, "--threads", "1",
                   "--prompt-len", "4", "--gen-len", "2", "--runs", "1", "--bandwidth-mib", "16",
                   "--device", "opaque", "--output", "json", NULL};
    ck_assert_int_eq(test_capture(dev, NULL, 0, &out), 0);
    ck_assert_msg(strstr(out, "\"prefill_tok_s\":") && !strstr(out, "compute_peak"), "%.600s",
                  out);
    free(out);
}
END_TEST

/* `river bench --kernels --peak`: one line a level, in order, with the f32 and 8-bit
 * peaks, and the Q8 tile's ceiling at every level but the portable one, which has none. */
START_TEST(test_bench_kernels_peak)
{
    char *b[] = {(char *)test_bin("river"), "bench", "--kernels", "--peak", "--threads", "1",
                 "--runs", "1", "--output", "json", NULL};
    char *out;
    ck_assert_int_eq(test_capture(b, NULL, 0, &out), 0);
    const char *line = out;
    for (int l = 0; l <= (int)cpu_simd_detect(); l++) {
        char want[64];
        snprintf(want, sizeof want, "{\"level\":\"%s\",", cpu_simd_name((cpu_simd_t)l));
        ck_assert_msg(line && !strncmp(line, want, strlen(want)), "line %d is not %s: %.600s", l,
                      want, out);
        const char *end = strchr(line, '\n');
        ck_assert_msg(end, "%.600s", out);
        char *one = strndup(line, (size_t)(end - line));
        ck_assert_msg(bench_num(one, "peak_f32_gflops") > 0 && bench_num(one, "peak_i8_gops") > 0,
                      "%s", one);
        if (l == CPU_SIMD_SCALAR)
            ck_assert_msg(!strstr(one, "q8_tile_gops"), "%s", one);
        else
            ck_assert_msg(bench_num(one, "q8_tile_gops") > 0, "%s", one);
        free(one);
        line = end + 1;
    }
    ck_assert_msg(!*line, "more lines than levels: %.600s", out);
    free(out);
}
END_TEST

/* `river bench --kernels`, level after level and --interleave (the levels call by call):
 * one line a level the processor has, in order, each with a time per call. */
START_TEST(test_bench_kernels_interleave)
{
    int levels = (int)cpu_simd_detect() + 1;
    for (int mixed = 0; mixed < 2; mixed++) {
        char *b[] = {(char *)test_bin("river"), "bench", "--kernels", "--threads", "1",
                     "--pool-mib", "8", "--bandwidth-mib", "16", "--formats", "bf16x8",
                     "--batches", "1", "--shapes", "512x2048", "--runs", "1", "--output",
                     "json", mixed ? "--interleave" : NULL, NULL};
        char *out;
        ck_assert_int_eq(test_capture(b, NULL, 0, &out), 0);
        const char *line = out;
        for (int l = 0; l < levels; l++) {
            char want[64];
            snprintf(want, sizeof want, "{\"level\":\"%s\",", cpu_simd_name((cpu_simd_t)l));
            ck_assert_msg(line && !strncmp(line, want, strlen(want)),
                          "interleave %d: line %d is not %s: %.600s", mixed, l, want, out);
            ck_assert_msg(bench_num(line, "ms") > 0, "%.300s", line);
            line = strchr(line, '\n');
            line = line ? line + 1 : NULL;
        }
        ck_assert_msg(!line || !*line, "interleave %d: more than %d lines: %.600s", mixed, levels,
                      out);
        free(out);
    }
}
END_TEST

static Suite *quant_suite(void)
{
    Suite *s = suite_create("quant");
    TCase *q = tcase_create("quantizers");
    tcase_add_test(q, test_rtn_round_trip);
    tcase_add_test(q, test_bench_prints_figures);
    tcase_add_test(q, test_bench_profile_window);
    tcase_add_test(q, test_bench_profile_prefill);
    tcase_add_test(q, test_bench_compute_peak);
    tcase_add_test(q, test_bench_kernels_interleave);
    tcase_add_test(q, test_bench_kernels_peak);
    tcase_add_test(q, test_hqq_round_trip);
    tcase_add_test(q, test_kernels_and_threads_agree);
    tcase_add_test(q, test_simd_kernels_agree);
    tcase_add_test(q, test_lowbit_round_trip);
    tcase_add_test(q, test_odd_shapes);
    tcase_add_test(q, test_degenerate_groups);
    tcase_add_test(q, test_bad_input);
    suite_add_tcase(s, q);
    TCase *real = tcase_create("real models");
    tcase_set_timeout(real, 300);
    tcase_add_test(real, test_hqq_beats_rtn_kjv);
    tcase_add_test(real, test_hqq_beats_rtn_tinystories);
    tcase_add_test(real, test_hqq_beats_rtn_stories260k);
    tcase_add_test(real, test_8bit_much_better);
    suite_add_tcase(s, real);
    TCase *rv = tcase_create("river file");
    tcase_set_timeout(rv, 300);
    tcase_add_test(rv, test_river_round_trip);
    tcase_add_test(rv, test_river_wrong_model);
    tcase_add_test(rv, test_fingerprint);
    tcase_add_test(rv, test_river_truncated);
    tcase_add_test(rv, test_river_corrupt);
    tcase_add_test(rv, test_river_wrong_dtype);
    tcase_add_test(rv, test_river_lowbit);
    tcase_add_test(rv, test_river_stories260k);
    tcase_add_test(rv, test_quant_group_fit);
    suite_add_tcase(s, rv);
    return s;
}

RIVER_TEST_MAIN(quant_suite)
