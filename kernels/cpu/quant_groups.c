/* The portable quantization kernel, and the choice between it and the SIMD ones
 * (quant_groups.h). */
#include "kernels/cpu/quant_groups.h"

#include <math.h>
#include <stdint.h>

#include "kernels/cpu/quant_groups_internal.h"
#include "kernels/half.h"

/* |x|^e for x >= 1e-8, as described in quant_groups_internal.h; the AVX-512 kernel does the same
 * operations lane by lane. */
static inline float quant_pow(float x, float e)
{
    uint32_t b = half_f32_bits(x);
    int32_t ex = (int32_t)(b >> 23) - 127;
    float m = half_bits_f32((b & 0x007fffffu) | 0x3f800000u) - 1.0f;
    float lg = (((QUANT_LOG2_C4 * m + QUANT_LOG2_C3) * m + QUANT_LOG2_C2) * m + QUANT_LOG2_C1) * m;
    float y = e * ((float)ex + lg);
    y = fminf(fmaxf(y, -126.0f), 126.0f);
    int32_t yi = (int32_t)y;
    if ((float)yi > y)
        yi--;
    float f = y - (float)yi;
    float p = (((QUANT_EXP2_D4 * f + QUANT_EXP2_D3) * f + QUANT_EXP2_D2) * f + QUANT_EXP2_D1) * f +
              1.0f;
    return half_bits_f32(half_f32_bits(p) + (uint32_t)((uint32_t)yi << 23));
}

/* The code of value x: clamp(round(x * s + z), 0, qmax). Clamping to [-1, qmax + 1] first
 * keeps the magic-number rounding in its exact range without changing the result. */
static inline float quant_code(float x, const quant_gp_t *gp)
{
    float t = x * gp->inv + gp->zero;
    t = fminf(fmaxf(t, -1.0f), gp->qmax + 1.0f);
    float r = (t + QUANT_ROUND_MAGIC) - QUANT_ROUND_MAGIC;
    return fminf(fmaxf(r, 0.0f), gp->qmax);
}

static void scalar_iter(const float *w, int g, const quant_gp_t *gp, quant_sums_t *out)
{
    float sa[QUANT_LANES] = {0}, ss[QUANT_LANES] = {0}, sz[QUANT_LANES] = {0};
    for (int k = 0; k < g; k++) {
        float x = w[k];
        float q = quant_code(x, gp);
        float d = x - (q - gp->zero) * gp->scale;
        float a = fabsf(d);
        float pw = quant_pow(a + QUANT_POW_EPS, gp->expo);
        float m = fmaxf(a - pw * gp->ibeta, 0.0f);
        float we = copysignf(m, d);
        int l = k % QUANT_LANES;
        sa[l] += a;
        ss[l] += d * d;
        sz[l] += q - (x - we) * gp->inv;
    }
    out->abs = quant_lane_reduce(sa);
    out->sq = quant_lane_reduce(ss);
    out->zsum = quant_lane_reduce(sz);
}

static void scalar_final(const float *w, int g, const quant_gp_t *gp, uint8_t *qout,
                         quant_sums_t *out)
{
    float sa[QUANT_LANES] = {0}, ss[QUANT_LANES] = {0}, sr[QUANT_LANES] = {0};
    for (int k = 0; k < g; k++) {
        float x = w[k];
        float q = quant_code(x, gp);
        float d = x - (q - gp->zero) * gp->scale;
        int l = k % QUANT_LANES;
        sa[l] += fabsf(d);
        ss[l] += d * d;
        sr[l] += x * x;
        qout[k] = (uint8_t)q;
    }
    out->abs = quant_lane_reduce(sa);
    out->sq = quant_lane_reduce(ss);
    out->zsum = quant_lane_reduce(sr);
}

int quant_groups_scalar(const quant_job_t *j, const float *w, int64_t n_groups, uint8_t *q,
                        uint16_t *scales, uint16_t *zeros, quant_stats_t *st)
{
    int g = j->group;
    for (int64_t i = 0; i < n_groups; i++) {
        const float *wg = w + i * g;
        float lo = wg[0], hi = wg[0];
        for (int k = 1; k < g; k++) {
            lo = fminf(lo, wg[k]);
            hi = fmaxf(hi, wg[k]);
        }
        if (quant_group_run(j, wg, lo, hi, q + i * g, &scales[i], &zeros[i], st, scalar_iter,
                            scalar_final) != 0)
            return (int)(-1 - i);
    }
    return 0;
}

int quant_groups(cpu_simd_t level, const quant_job_t *j, const float *w, int64_t n_groups,
                 uint8_t *q, uint16_t *scales, uint16_t *zeros, quant_stats_t *st)
{
    if (j->group % QUANT_LANES != 0)
        level = CPU_SIMD_SCALAR;
    return level >= CPU_SIMD_AVX512 ? quant_groups_avx512(j, w, n_groups, q, scales, zeros, st)
           : level == CPU_SIMD_AVX2 ? quant_groups_avx2(j, w, n_groups, q, scales, zeros, st)
                                    : quant_groups_scalar(j, w, n_groups, q, scales, zeros, st);
}
