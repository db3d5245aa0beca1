/* Small 256-bit helpers shared by the AVX2 and AVX-512 kernels (both compile 256-bit code:
 * the AVX-512 level runs the Q4X8 integer kernels at that width). Included after
 * <immintrin.h>, with AI defined. */
#ifndef RIVER_KERNELS_CPU_X86_UTIL_H
#define RIVER_KERNELS_CPU_X86_UTIL_H

#include <string.h>

#include "kernels/cpu/peak_rounds.h"
#include "kernels/kv_row.h"

/* simd.h: kv_from_f32, eight F16 values at a time; the tail and the other types as
 * kv_row_from_f32. */
__attribute__((unused)) static void x86_kv_from_f32(dtype_t dt, void *base, float *scales,
                                                    int64_t off, const float *src, int64_t n)
{
    int64_t j = 0;
    if (dt == DTYPE_F16) {
        uint16_t *h = (uint16_t *)base + off;
        for (; j + 8 <= n; j += 8)
            _mm_storeu_si128((__m128i *)(h + j),
                             _mm256_cvtps_ph(_mm256_loadu_ps(src + j),
                                             _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
    if (j < n)
        kv_row_from_f32(dt, base, scales, off + j, src + j, n - j);
}

/* The sum of the eight lanes. */
AI float hsum8(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* hsum8 of eight vectors at once: lane u of the result is hsum8(x[u]), its additions in
 * hsum8's order (the halves, then lanes two apart, then neighbours), so the sums are
 * hsum8's bits. */
AI __m256 hsum8x8(const __m256 x[8])
{
    __m256 w[4];
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++)
        w[i] = _mm256_add_ps(_mm256_permute2f128_ps(x[2 * i], x[2 * i + 1], 0x20),
                             _mm256_permute2f128_ps(x[2 * i], x[2 * i + 1], 0x31));
    __m256 p0 = _mm256_add_ps(_mm256_shuffle_ps(w[0], w[1], 0x44),
                              _mm256_shuffle_ps(w[0], w[1], 0xee));
    __m256 p1 = _mm256_add_ps(_mm256_shuffle_ps(w[2], w[3], 0x44),
                              _mm256_shuffle_ps(w[2], w[3], 0xee));
    __m256 r = _mm256_add_ps(_mm256_shuffle_ps(p0, p1, 0x88), _mm256_shuffle_ps(p0, p1, 0xdd));
    /* r holds x[0], x[2], x[4], x[6] in its low half and x[1], x[3], ... in its high. */
    return _mm256_permutevar8x32_ps(r, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
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

/* The f32 sums of a Q8 tile ceiling (simd.h: peak_q8_tile) folded into one value that
 * depends on each of them. */
AI int32_t x86_fold_sums(const __m256 *acc, int n)
{
    __m256i s = _mm256_setzero_si256();
    for (int k = 0; k < n; k++)
        s = _mm256_xor_si256(s, _mm256_castps_si256(acc[k]));
    return _mm256_extract_epi32(s, 0) ^ _mm256_extract_epi32(s, 7);
}

/* Operands for a Q8 tile ceiling: codes, x8, x's folded zero sums and scales for n rows of
 * x, f16 scales (2^-10) for r weight rows; values whose f32 sums stay normal floats. */
AI void x86_q8_tile_operands(uint8_t *q, int nq, int8_t *x8, int nx, int32_t (*z)[8],
                             float (*dv)[8], int n, uint16_t (*sh)[8], int r)
{
    for (int k = 0; k < nq; k++)
        q[k] = (uint8_t)(k * 7 + 1);
    for (int k = 0; k < nx; k++)
        x8[k] = (int8_t)(k % 13 - 6);
    for (int i = 0; i < n; i++)
        for (int l = 0; l < 8; l++) {
            z[i][l] = -128 * l;
            dv[i][l] = 1.0f / 64 + (float)l / 4096;
        }
    for (int j = 0; j < r; j++)
        for (int l = 0; l < 8; l++)
            sh[j][l] = 0x1400;
}

/* The Q8X8 prefill tile of the levels without VNNI (q8_x86.h: x8_tile at 2 x 4, the sign
 * trick), one set of 256 columns a round, its instructions as that tile issues them: the
 * codes, x8, the folded zero sums and both scales read from L1, the dot products held in
 * registers, the f32 sums kept in memory (simd.h: peak_q8_tile). The empty asm makes the
 * compiler read them again every round, as the tile reads a new set. */
#define X86_Q8_TILE_MACS (8 * 2 * 4 * 32)
PEAK_FN AI int32_t x86_peak_q8_tile_maddubs(int64_t iters)
{
    enum { R = 2, N = 4 };
    _Alignas(32) uint8_t q[8][R][32];
    _Alignas(32) int8_t x8[N][8][32];
    _Alignas(32) int32_t z[N][8];
    _Alignas(32) uint16_t sh[R][8];
    _Alignas(32) float dv[N][8];
    _Alignas(32) __m256 acc[R][N];
    x86_q8_tile_operands((uint8_t *)q, (int)sizeof q, (int8_t *)x8, (int)sizeof x8, z, dv, N, sh,
                         R);
    memset(acc, 0, sizeof acc);
    const __m256i ones = _mm256_set1_epi16(1), top = _mm256_set1_epi8((char)0x80);
    for (int64_t it = 0; it < iters; it++) {
        __asm__ volatile("" : "+m"(acc), "+m"(q), "+m"(x8), "+m"(z), "+m"(sh), "+m"(dv));
        __m256i dot[R][N];
#pragma GCC unroll 4
        for (int i = 0; i < N; i++) {
            __m256i z0 = _mm256_load_si256((const __m256i *)z[i]);
#pragma GCC unroll 2
            for (int r = 0; r < R; r++)
                dot[r][i] = z0;
        }
#pragma GCC unroll 8
        for (int v = 0; v < 8; v++)
#pragma GCC unroll 2
            for (int r = 0; r < R; r++) {
                __m256i qs = _mm256_xor_si256(_mm256_load_si256((const __m256i *)q[v][r]), top);
                __m256i qa = _mm256_abs_epi8(qs);
#pragma GCC unroll 4
                for (int i = 0; i < N; i++) {
                    __m256i xv = _mm256_load_si256((const __m256i *)x8[i][v]);
                    dot[r][i] = _mm256_add_epi32(
                        dot[r][i], _mm256_madd_epi16(
                                       _mm256_maddubs_epi16(qa, _mm256_sign_epi8(xv, qs)), ones));
                    __asm__("" : "+x"(dot[r][i]));
                }
            }
#pragma GCC unroll 2
        for (int r = 0; r < R; r++) {
            __m256 sc = _mm256_cvtph_ps(_mm_load_si128((const __m128i *)sh[r]));
#pragma GCC unroll 4
            for (int i = 0; i < N; i++)
                acc[r][i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[r][i]),
                                            _mm256_mul_ps(sc, _mm256_load_ps(dv[i])), acc[r][i]);
        }
    }
    return x86_fold_sums(&acc[0][0], R * N);
}

#endif
