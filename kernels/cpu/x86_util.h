/* Small 256-bit helpers shared by the AVX2 and AVX-512 kernels (both compile 256-bit code:
 * the AVX-512 level runs the Q4X8 integer kernels at that width). Included after
 * <immintrin.h>, with AI defined. */
#ifndef RIVER_KERNELS_CPU_X86_UTIL_H
#define RIVER_KERNELS_CPU_X86_UTIL_H

#include "kernels/cpu/peak_rounds.h"

/* The sum of the eight lanes. */
AI float hsum8(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* max |x[k]| over n floats (a multiple of 8). */
AI float x86_absmax(const float *x, int n)
{
    __m256 sign = _mm256_set1_ps(-0.0f), mx = _mm256_setzero_ps();
    for (int j = 0; j < n; j += 8)
        mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + j)));
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}

/* t[k] = round(x[k] * iv) as int8 (saturating), 32 values in column order: the 8-bit
 * activations of the integer kernels. */
AI void x86_pack32(int8_t *t, const float *x, __m256 iv)
{
    __m256i q[4];
    for (int j = 0; j < 4; j++)
        q[j] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 8 * j), iv));
    /* packs works within 128-bit lanes: the permute puts the 32 values back in column
     * order. */
    __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]),
                                   _mm256_packs_epi32(q[2], q[3]));
    p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256((__m256i *)t, p);
}

/* The 8-bit rounds of the compute peak (simd.h: peak_i8) with vpmaddubsw, as the AVX2
 * level's Q8/Q4 kernels multiply: each chain fed its own products as the unsigned operand,
 * 32 products a chain and round. */
PEAK_FN AI int32_t x86_peak_maddubs(int64_t iters)
{
    const __m256i x = _mm256_set1_epi8(3);
#define INIT(i) _mm256_set1_epi8((char)((i) + 1))
#define MADD(a) _mm256_maddubs_epi16(a, x)
    __m256i s = PEAK_ROUNDS(__m256i, iters, INIT, MADD, _mm256_xor_si256);
#undef INIT
#undef MADD
    return _mm256_extract_epi32(s, 0) ^ _mm256_extract_epi32(s, 7);
}

#endif
