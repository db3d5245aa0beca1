/* Small 256-bit helpers shared by the AVX2 and AVX-512 kernels (both compile 256-bit code:
 * the AVX-512 level runs the Q4X8 integer kernels at that width). Included after
 * <immintrin.h>, with AI defined. */
#ifndef RIVER_KERNELS_CPU_X86_HSUM_H
#define RIVER_KERNELS_CPU_X86_HSUM_H

/* The sum of the eight lanes. */
AI float hsum8(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

#endif
