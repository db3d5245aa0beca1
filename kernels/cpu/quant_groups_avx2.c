/* The AVX2 quantization kernel: groups whose size is a multiple of 16, one group at a time.
 * Compiled with AVX2/FMA flags and called only when the selected SIMD level has them
 * (quant_groups.c decides).
 *
 * It is quant_groups_avx512.c with each 16-lane vector held as two 8-lane halves (lanes 0-7
 * and 8-15): every vector operation mirrors one float operation of the portable kernel in
 * quant_groups.c, in the same order, with no fused multiply-adds, and lane l sums elements
 * l, l+16, l+32... of the group; the halves are added first (i + (i+8)), then the 8 lanes
 * as the portable tree does. So this kernel, too, gives the portable kernel's bytes exactly. */
#include <immintrin.h>
#include <stdint.h>

#include "kernels/cpu/quant_groups_internal.h"

#define AI static inline __attribute__((always_inline))

typedef struct v16 {
    __m256 lo, hi;
} v16_t;

/* The 16 lanes added as quant_lane_reduce does: i + (i+8), then + (i+4), + (i+2), + (i+1). */
AI float v_reduce(v16_t v)
{
    __m256 s8 = _mm256_add_ps(v.lo, v.hi);
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    __m128 s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));
    return _mm_cvtss_f32(s1);
}

/* x^e for x >= 1e-8: the portable quant_pow, lane by lane. */
AI __m256 v_pow(__m256 x, __m256 e)
{
    const __m256 one = _mm256_set1_ps(1.0f);
    __m256i b = _mm256_castps_si256(x);
    __m256 ex = _mm256_cvtepi32_ps(
        _mm256_sub_epi32(_mm256_srli_epi32(b, 23), _mm256_set1_epi32(127)));
    __m256 m = _mm256_sub_ps(
        _mm256_castsi256_ps(_mm256_or_si256(_mm256_and_si256(b, _mm256_set1_epi32(0x007fffff)),
                                            _mm256_set1_epi32(0x3f800000))),
        one);
    __m256 lg = _mm256_mul_ps(_mm256_set1_ps(QUANT_LOG2_C4), m);
    lg = _mm256_mul_ps(_mm256_add_ps(lg, _mm256_set1_ps(QUANT_LOG2_C3)), m);
    lg = _mm256_mul_ps(_mm256_add_ps(lg, _mm256_set1_ps(QUANT_LOG2_C2)), m);
    lg = _mm256_mul_ps(_mm256_add_ps(lg, _mm256_set1_ps(QUANT_LOG2_C1)), m);
    __m256 y = _mm256_mul_ps(e, _mm256_add_ps(ex, lg));
    y = _mm256_min_ps(_mm256_max_ps(y, _mm256_set1_ps(-126.0f)), _mm256_set1_ps(126.0f));
    __m256 yf = _mm256_round_ps(y, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    __m256 f = _mm256_sub_ps(y, yf);
    __m256 p = _mm256_mul_ps(_mm256_set1_ps(QUANT_EXP2_D4), f);
    p = _mm256_mul_ps(_mm256_add_ps(p, _mm256_set1_ps(QUANT_EXP2_D3)), f);
    p = _mm256_mul_ps(_mm256_add_ps(p, _mm256_set1_ps(QUANT_EXP2_D2)), f);
    p = _mm256_mul_ps(_mm256_add_ps(p, _mm256_set1_ps(QUANT_EXP2_D1)), f);
    p = _mm256_add_ps(p, one);
    __m256i yi = _mm256_slli_epi32(_mm256_cvttps_epi32(yf), 23);
    return _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(p), yi));
}

/* clamp(round(x * s + z), 0, qmax), rounding to nearest even. */
AI __m256 v_code(__m256 x, __m256 inv, __m256 zero, __m256 qmax)
{
    __m256 t = _mm256_add_ps(_mm256_mul_ps(x, inv), zero);
    __m256 r = _mm256_round_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    /* The zero vector is the second operand so that a -0 from rounding becomes +0. */
    return _mm256_min_ps(_mm256_max_ps(r, _mm256_setzero_ps()), qmax);
}

AI __m256 v_abs(__m256 x)
{
    return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), x);
}

/* One 8-lane half of an HQQ step: adds its sums into sa, ss, sz. */
AI void iter8(__m256 x, const quant_gp_t *gp, __m256 *sa, __m256 *ss, __m256 *sz)
{
    const __m256 inv = _mm256_set1_ps(gp->inv), zero = _mm256_set1_ps(gp->zero);
    const __m256 scale = _mm256_set1_ps(gp->scale), qmax = _mm256_set1_ps(gp->qmax);
    const __m256 expo = _mm256_set1_ps(gp->expo), ibeta = _mm256_set1_ps(gp->ibeta);
    const __m256 eps = _mm256_set1_ps(QUANT_POW_EPS);
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 q = v_code(x, inv, zero, qmax);
    __m256 d = _mm256_sub_ps(x, _mm256_mul_ps(_mm256_sub_ps(q, zero), scale));
    __m256 a = v_abs(d);
    __m256 pw = v_pow(_mm256_add_ps(a, eps), expo);
    __m256 m = _mm256_max_ps(_mm256_sub_ps(a, _mm256_mul_ps(pw, ibeta)), _mm256_setzero_ps());
    __m256 we = _mm256_or_ps(m, _mm256_and_ps(d, sign));
    *sa = _mm256_add_ps(*sa, a);
    *ss = _mm256_add_ps(*ss, _mm256_mul_ps(d, d));
    *sz = _mm256_add_ps(*sz, _mm256_sub_ps(q, _mm256_mul_ps(_mm256_sub_ps(x, we), inv)));
}

static void avx2_iter(const float *w, int g, const quant_gp_t *gp, quant_sums_t *out)
{
    v16_t sa = {_mm256_setzero_ps(), _mm256_setzero_ps()}, ss = sa, sz = sa;
    for (int k = 0; k < g; k += QUANT_LANES) {
        iter8(_mm256_loadu_ps(w + k), gp, &sa.lo, &ss.lo, &sz.lo);
        iter8(_mm256_loadu_ps(w + k + 8), gp, &sa.hi, &ss.hi, &sz.hi);
    }
    out->abs = v_reduce(sa);
    out->sq = v_reduce(ss);
    out->zsum = v_reduce(sz);
}

/* One 8-lane half of the final pass: the codes of 8 elements into q8 (as int32 lanes). */
AI __m256i final8(__m256 x, const quant_gp_t *gp, __m256 *sa, __m256 *ss, __m256 *sr)
{
    const __m256 inv = _mm256_set1_ps(gp->inv), zero = _mm256_set1_ps(gp->zero);
    const __m256 scale = _mm256_set1_ps(gp->scale), qmax = _mm256_set1_ps(gp->qmax);
    __m256 q = v_code(x, inv, zero, qmax);
    __m256 d = _mm256_sub_ps(x, _mm256_mul_ps(_mm256_sub_ps(q, zero), scale));
    *sa = _mm256_add_ps(*sa, v_abs(d));
    *ss = _mm256_add_ps(*ss, _mm256_mul_ps(d, d));
    *sr = _mm256_add_ps(*sr, _mm256_mul_ps(x, x));
    return _mm256_cvtps_epi32(q);
}

static void avx2_final(const float *w, int g, const quant_gp_t *gp, uint8_t *qout,
                       quant_sums_t *out)
{
    v16_t sa = {_mm256_setzero_ps(), _mm256_setzero_ps()}, ss = sa, sr = sa;
    for (int k = 0; k < g; k += QUANT_LANES) {
        __m256i a = final8(_mm256_loadu_ps(w + k), gp, &sa.lo, &ss.lo, &sr.lo);
        __m256i b = final8(_mm256_loadu_ps(w + k + 8), gp, &sa.hi, &ss.hi, &sr.hi);
        /* Codes are 0..255: packing with unsigned saturation keeps them; packs works in
         * 128-bit lanes, so the 16 bytes come out as a0-3 b0-3 a4-7 b4-7 and are put back
         * in order. */
        __m256i w16 = _mm256_packus_epi32(a, b);
        w16 = _mm256_permute4x64_epi64(w16, 0xd8);
        __m128i b8 = _mm_packus_epi16(_mm256_castsi256_si128(w16),
                                      _mm256_extracti128_si256(w16, 1));
        _mm_storeu_si128((__m128i *)(qout + k), b8);
    }
    out->abs = v_reduce(sa);
    out->sq = v_reduce(ss);
    out->zsum = v_reduce(sr);
}

int quant_groups_avx2(const quant_job_t *j, const float *w, int64_t n_groups, uint8_t *q,
                      uint16_t *scales, uint16_t *zeros, quant_stats_t *st)
{
    int g = j->group;
    for (int64_t i = 0; i < n_groups; i++) {
        const float *wg = w + i * g;
        __m256 lo = _mm256_loadu_ps(wg), hi = lo;
        for (int k = 8; k < g; k += 8) {
            __m256 x = _mm256_loadu_ps(wg + k);
            lo = _mm256_min_ps(lo, x);
            hi = _mm256_max_ps(hi, x);
        }
        __m128 l4 = _mm_min_ps(_mm256_castps256_ps128(lo), _mm256_extractf128_ps(lo, 1));
        l4 = _mm_min_ps(l4, _mm_movehl_ps(l4, l4));
        l4 = _mm_min_ss(l4, _mm_shuffle_ps(l4, l4, 1));
        __m128 h4 = _mm_max_ps(_mm256_castps256_ps128(hi), _mm256_extractf128_ps(hi, 1));
        h4 = _mm_max_ps(h4, _mm_movehl_ps(h4, h4));
        h4 = _mm_max_ss(h4, _mm_shuffle_ps(h4, h4, 1));
        if (quant_group_run(j, wg, _mm_cvtss_f32(l4), _mm_cvtss_f32(h4), q + i * g, &scales[i],
                            &zeros[i], st, avx2_iter, avx2_final) != 0)
            return (int)(-1 - i);
    }
    return 0;
}
