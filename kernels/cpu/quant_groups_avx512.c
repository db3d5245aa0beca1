/* The AVX-512 quantization kernel: groups whose size is a multiple of 16, one group at a
 * time, 16 values per vector. Compiled with AVX-512 flags and called only after
 * cpu_simd_detect() found them (quant_groups.c decides).
 *
 * Every vector operation here mirrors one float operation of the portable kernel in
 * quant_groups.c, in the same order, with no fused multiply-adds, and lane l of an accumulator
 * sums elements l, l+16, l+32... of the group exactly as the portable lane sums do; that is
 * what makes the two kernels agree to the bit. */
#include <immintrin.h>
#include <stdint.h>

#include "kernels/cpu/quant_groups_internal.h"

#define AI static inline __attribute__((always_inline))

/* The 16 lanes added as quant_lane_reduce does: i + (i+8), then + (i+4), + (i+2), + (i+1). */
AI float v_reduce(__m512 v)
{
    __m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    __m128 s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));
    return _mm_cvtss_f32(s1);
}

/* x^e for x >= 1e-8: the portable quant_pow, lane by lane. */
AI __m512 v_pow(__m512 x, __m512 e)
{
    const __m512 one = _mm512_set1_ps(1.0f);
    __m512i b = _mm512_castps_si512(x);
    __m512 ex = _mm512_cvtepi32_ps(
        _mm512_sub_epi32(_mm512_srli_epi32(b, 23), _mm512_set1_epi32(127)));
    __m512 m = _mm512_sub_ps(
        _mm512_castsi512_ps(_mm512_or_si512(_mm512_and_si512(b, _mm512_set1_epi32(0x007fffff)),
                                            _mm512_set1_epi32(0x3f800000))),
        one);
    __m512 lg = _mm512_mul_ps(_mm512_set1_ps(QUANT_LOG2_C4), m);
    lg = _mm512_mul_ps(_mm512_add_ps(lg, _mm512_set1_ps(QUANT_LOG2_C3)), m);
    lg = _mm512_mul_ps(_mm512_add_ps(lg, _mm512_set1_ps(QUANT_LOG2_C2)), m);
    lg = _mm512_mul_ps(_mm512_add_ps(lg, _mm512_set1_ps(QUANT_LOG2_C1)), m);
    __m512 y = _mm512_mul_ps(e, _mm512_add_ps(ex, lg));
    y = _mm512_min_ps(_mm512_max_ps(y, _mm512_set1_ps(-126.0f)), _mm512_set1_ps(126.0f));
    __m512 yf = _mm512_roundscale_ps(y, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    __m512 f = _mm512_sub_ps(y, yf);
    __m512 p = _mm512_mul_ps(_mm512_set1_ps(QUANT_EXP2_D4), f);
    p = _mm512_mul_ps(_mm512_add_ps(p, _mm512_set1_ps(QUANT_EXP2_D3)), f);
    p = _mm512_mul_ps(_mm512_add_ps(p, _mm512_set1_ps(QUANT_EXP2_D2)), f);
    p = _mm512_mul_ps(_mm512_add_ps(p, _mm512_set1_ps(QUANT_EXP2_D1)), f);
    p = _mm512_add_ps(p, one);
    __m512i yi = _mm512_slli_epi32(_mm512_cvttps_epi32(yf), 23);
    return _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(p), yi));
}

/* clamp(round(x * s + z), 0, qmax), rounding to nearest even. */
AI __m512 v_code(__m512 x, __m512 inv, __m512 zero, __m512 qmax)
{
    __m512 t = _mm512_add_ps(_mm512_mul_ps(x, inv), zero);
    __m512 r = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    /* The zero vector is the second operand so that a -0 from rounding becomes +0. */
    return _mm512_min_ps(_mm512_max_ps(r, _mm512_setzero_ps()), qmax);
}

static void avx512_iter(const float *w, int g, const quant_gp_t *gp, quant_sums_t *out)
{
    const __m512 inv = _mm512_set1_ps(gp->inv), zero = _mm512_set1_ps(gp->zero);
    const __m512 scale = _mm512_set1_ps(gp->scale), qmax = _mm512_set1_ps(gp->qmax);
    const __m512 expo = _mm512_set1_ps(gp->expo), ibeta = _mm512_set1_ps(gp->ibeta);
    const __m512 eps = _mm512_set1_ps(QUANT_POW_EPS);
    const __m512i sign = _mm512_set1_epi32((int)0x80000000u);
    __m512 sa = _mm512_setzero_ps(), ss = _mm512_setzero_ps(), sz = _mm512_setzero_ps();
    for (int k = 0; k < g; k += QUANT_LANES) {
        __m512 x = _mm512_loadu_ps(w + k);
        __m512 q = v_code(x, inv, zero, qmax);
        __m512 d = _mm512_sub_ps(x, _mm512_mul_ps(_mm512_sub_ps(q, zero), scale));
        __m512 a = _mm512_abs_ps(d);
        __m512 pw = v_pow(_mm512_add_ps(a, eps), expo);
        __m512 m = _mm512_max_ps(_mm512_sub_ps(a, _mm512_mul_ps(pw, ibeta)),
                                 _mm512_setzero_ps());
        __m512 we = _mm512_castsi512_ps(_mm512_or_si512(
            _mm512_castps_si512(m), _mm512_and_si512(_mm512_castps_si512(d), sign)));
        sa = _mm512_add_ps(sa, a);
        ss = _mm512_add_ps(ss, _mm512_mul_ps(d, d));
        sz = _mm512_add_ps(sz, _mm512_sub_ps(q, _mm512_mul_ps(_mm512_sub_ps(x, we), inv)));
    }
    out->abs = v_reduce(sa);
    out->sq = v_reduce(ss);
    out->zsum = v_reduce(sz);
}

static void avx512_final(const float *w, int g, const quant_gp_t *gp, uint8_t *qout,
                         quant_sums_t *out)
{
    const __m512 inv = _mm512_set1_ps(gp->inv), zero = _mm512_set1_ps(gp->zero);
    const __m512 scale = _mm512_set1_ps(gp->scale), qmax = _mm512_set1_ps(gp->qmax);
    __m512 sa = _mm512_setzero_ps(), ss = _mm512_setzero_ps(), sr = _mm512_setzero_ps();
    for (int k = 0; k < g; k += QUANT_LANES) {
        __m512 x = _mm512_loadu_ps(w + k);
        __m512 q = v_code(x, inv, zero, qmax);
        __m512 d = _mm512_sub_ps(x, _mm512_mul_ps(_mm512_sub_ps(q, zero), scale));
        sa = _mm512_add_ps(sa, _mm512_abs_ps(d));
        ss = _mm512_add_ps(ss, _mm512_mul_ps(d, d));
        sr = _mm512_add_ps(sr, _mm512_mul_ps(x, x));
        _mm_storeu_si128((__m128i *)(qout + k), _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(q)));
    }
    out->abs = v_reduce(sa);
    out->sq = v_reduce(ss);
    out->zsum = v_reduce(sr);
}

int quant_groups_avx512(const quant_job_t *j, const float *w, int64_t n_groups, uint8_t *q,
                        uint16_t *scales, uint16_t *zeros, quant_stats_t *st)
{
    int g = j->group;
    for (int64_t i = 0; i < n_groups; i++) {
        const float *wg = w + i * g;
        __m512 lo = _mm512_loadu_ps(wg), hi = lo;
        for (int k = QUANT_LANES; k < g; k += QUANT_LANES) {
            __m512 x = _mm512_loadu_ps(wg + k);
            lo = _mm512_min_ps(lo, x);
            hi = _mm512_max_ps(hi, x);
        }
        if (quant_group_run(j, wg, _mm512_reduce_min_ps(lo), _mm512_reduce_max_ps(hi),
                            q + i * g, &scales[i], &zeros[i], st, avx512_iter,
                            avx512_final) != 0)
            return (int)(-1 - i);
    }
    return 0;
}
