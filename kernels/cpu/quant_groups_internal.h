/* Shared between quant_groups.c (the portable kernel), quant_groups_avx2.c and
 * quant_groups_avx512.c; not public.
 *
 * A kernel quantizes a run of consecutive groups of float32 values. The per-group control
 * flow (scale and zero set-up, HQQ's iteration and stopping rule) lives here, once, as a
 * static inline driver that each kernel instantiates with its own two inner loops: `iter`
 * (one HQQ step: reconstruct, measure, propose a zero) and `final` (the codes and error sums
 * for a chosen zero). The inner loops of both kernels do the same float operations in the
 * same order, and sum element j of a group into lane j % 16 before adding the 16 lanes as a
 * fixed tree, so that the AVX-512 kernel gives exactly the portable kernel's bytes. */
#ifndef RIVER_KERNELS_CPU_QUANT_GROUPS_INTERNAL_H
#define RIVER_KERNELS_CPU_QUANT_GROUPS_INTERNAL_H

#include <math.h>
#include <stdint.h>

#include "kernels/cpu/quant_groups.h"
#include "kernels/half.h"

/* |x|^(p-1) is computed as exp2((p-1) * log2(x)) with two short polynomials: log2(1+f) and
 * 2^f - 1 on [0, 1), least-squares fits of degree 4 (absolute error 1.2e-4 in log2 and
 * 3e-6 relative in exp2; for p-1 = -0.3 the power is within 1e-4 of the true value, far
 * below what the shrinkage threshold needs). HQQ adds 1e-8 to |x| so that zero stays finite. */
#define QUANT_LOG2_C1 1.43863803f
#define QUANT_LOG2_C2 -0.677743267f
#define QUANT_LOG2_C3 0.321879707f
#define QUANT_LOG2_C4 -0.0828606982f
#define QUANT_EXP2_D1 0.693044008f
#define QUANT_EXP2_D2 0.241282688f
#define QUANT_EXP2_D3 0.0522408969f
#define QUANT_EXP2_D4 0.0134265511f
#define QUANT_POW_EPS 1e-8f
/* 1.5 * 2^23: adding and subtracting it rounds a float of magnitude below 2^22 to the
 * nearest integer, ties to even, as the AVX-512 round instruction does. */
#define QUANT_ROUND_MAGIC 12582912.0f

/* What the driver hands the inner loops for one group. */
typedef struct quant_gp {
    float scale;  /* the stored fp16 scale, widened: value = (q - zero) * scale */
    float inv;    /* 1 / scale: the s of W * s + z */
    float zero;   /* the fp16 zero being tried, widened */
    float qmax;   /* 2^bits - 1 */
    float expo;   /* p - 1 */
    float ibeta;  /* 1 / beta */
} quant_gp_t;

/* Sums one inner loop returns. */
typedef struct quant_sums {
    float abs;   /* sum |W - Wr| */
    float sq;    /* sum (W - Wr)^2 */
    float zsum;  /* iter: sum (Wq - (W - We) * s); final: sum W^2 */
} quant_sums_t;

typedef void (*quant_iter_fn)(const float *w, int g, const quant_gp_t *gp, quant_sums_t *out);
typedef void (*quant_final_fn)(const float *w, int g, const quant_gp_t *gp, uint8_t *q,
                               quant_sums_t *out);

/* The 16 lane sums added as a fixed tree: lanes i and i+8, then i and i+4, i+2, i+1. */
static inline float quant_lane_reduce(float s[QUANT_LANES])
{
    for (int w = QUANT_LANES / 2; w >= 1; w /= 2)
        for (int i = 0; i < w; i++)
            s[i] += s[i + w];
    return s[0];
}

/* Scale and RTN zero of a group spanning [lo, hi]. Returns -1 when the span does not fit
 * an fp16 scale. */
static inline int quant_group_setup(float lo, float hi, int qmax, uint16_t *scale16,
                                    uint16_t *zero16, quant_gp_t *gp)
{
    /* Adding +0 turns a -0 bound into +0: kernels that find the minimum in different orders
     * may disagree on the sign of a zero, and the zero's stored bits must not. */
    lo += 0.0f;
    hi += 0.0f;
    for (int widened = 0;; widened = 1) {
        float span = hi - lo;
        uint16_t s16 = f32_to_f16(span / (float)qmax);
        if ((s16 & 0x7fffu) >= 0x7c00u)
            return -1;
        /* A scale that rounds to zero (a constant group, or values below fp16's subnormals)
         * becomes the smallest subnormal, so that 1/scale stays finite. */
        if (s16 == 0)
            s16 = 1;
        /* Rounding the scale down could push the group's maximum past the top code; the
         * next fp16 value up keeps every value inside the code range. */
        if (f16_to_f32(s16) * (float)qmax < span) {
            s16++;
            if ((s16 & 0x7fffu) >= 0x7c00u)
                return -1;
        }
        float sf = f16_to_f32(s16);
        float inv = 1.0f / sf;
        float z = -lo * inv + 0.0f;
        uint16_t z16 = f32_to_f16(z);
        /* A group far from zero relative to its width (a constant one, above all) has a
         * zero beyond fp16; quantizing it over a range widened to include 0 brings the zero
         * into [0, qmax]. Zeros that fp16 holds only coarsely are kept: widening would cost
         * more than their rounding does. */
        if (widened || (z16 & 0x7fffu) < 0x7c00u) {
            *scale16 = s16;
            *zero16 = z16;
            gp->scale = sf;
            gp->inv = inv;
            gp->zero = f16_to_f32(z16);
            gp->qmax = (float)qmax;
            return 0;
        }
        lo = fminf(lo, 0.0f);
        hi = fmaxf(hi, 0.0f);
    }
}

/* Accumulates a group's float sums into the double statistics. */
static inline void quant_stats_group(quant_stats_t *st, int g, const quant_sums_t *fin,
                                     const quant_sums_t *rtn, int iters)
{
    st->n += g;
    st->groups++;
    st->iters += iters;
    st->abs_err += fin->abs;
    st->sq_err += fin->sq;
    st->sq_ref += fin->zsum;
    st->rtn_abs_err += rtn->abs;
    st->rtn_sq_err += rtn->sq;
}

/* Quantizes one group of g values spanning [lo, hi]: codes (one per byte) into q, the fp16
 * scale and zero into *scale16 and *zero16, error sums into st. Returns -1 when the group
 * does not fit an fp16 scale. */
static inline int quant_group_run(const quant_job_t *j, const float *w, float lo, float hi,
                                  uint8_t *q, uint16_t *scale16, uint16_t *zero16,
                                  quant_stats_t *st, quant_iter_fn iter,
                                  quant_final_fn final)
{
    int g = j->group;
    quant_gp_t gp = {.expo = j->expo};
    uint16_t s16, z16;
    if (quant_group_setup(lo, hi, j->qmax, &s16, &z16, &gp) != 0)
        return -1;
    quant_sums_t fin, rtn = {0};
    int iters = 0;
    if (j->hqq) {
        /* The first step measures RTN's own zero, so the best zero is never worse than
         * RTN's. Each later step tries the zero the previous one proposed. */
        float best = INFINITY, beta = j->beta;
        uint16_t best16 = z16;
        for (int it = 0; it < j->iters; it++) {
            quant_sums_t s;
            gp.ibeta = 1.0f / beta;
            iter(w, g, &gp, &s);
            iters++;
            if (it == 0)
                rtn = s;
            if (!(s.abs < best))
                break;
            best = s.abs;
            best16 = z16;
            z16 = f32_to_f16(s.zsum / (float)g);
            gp.zero = f16_to_f32(z16);
            if (!isfinite(gp.zero))
                break;
            beta *= j->kappa;
        }
        z16 = best16;
        gp.zero = f16_to_f32(z16);
    }
    final(w, g, &gp, q, &fin);
    if (!j->hqq)
        rtn = fin;
    *scale16 = s16;
    *zero16 = z16;
    quant_stats_group(st, g, &fin, &rtn, iters);
    return 0;
}

/* The AVX-512 kernel (quant_groups_avx512.c), for groups whose size is a multiple of 16;
 * the portable one is in quant_groups.c. Both quantize n_groups consecutive groups of w and return 0,
 * or -1 - (index of the first group that does not fit an fp16 scale). */
int quant_groups_avx512(const quant_job_t *j, const float *w, int64_t n_groups, uint8_t *q,
                        uint16_t *scales, uint16_t *zeros, quant_stats_t *st);
/* The portable kernel (quant_groups.c), for any group size. */
int quant_groups_scalar(const quant_job_t *j, const float *w, int64_t n_groups, uint8_t *q,
                        uint16_t *scales, uint16_t *zeros, quant_stats_t *st);
/* The same with AVX2 (quant_groups_avx2.c), for the same groups, giving the same bytes. */
int quant_groups_avx2(const quant_job_t *j, const float *w, int64_t n_groups, uint8_t *q,
                      uint16_t *scales, uint16_t *zeros, quant_stats_t *st);

#endif
