/* The AVX2 + FMA + F16C kernels of the 2- and 3-bit weight types (lowbit.h). Compiled with
 * those flags and only called after cpu_simd_detect() found them.
 *
 * A run of 16 codes at column k (a multiple of 16: groups are whole runs) is 32 bits of the
 * 2-bit plane at byte k/4, broadcast to eight lanes and shifted right by 0, 2, .., 14 (codes
 * k..k+7) and 16, .., 30 (k+8..k+15); for Q3 the 16 bits of the 1-bit plane at byte k/8 add
 * bit 2 the same way. Each code becomes ((float)q - zero) * scale, as on the portable
 * level, and meets up to GEMV_NB rows of x before the next run is unpacked. */
#include <immintrin.h>
#include <string.h>

#include "kernels/cpu/lowbit.h"

#define AI static inline __attribute__((always_inline))

#include "kernels/cpu/x86_util.h"

/* Rows of x one pass over a weight row serves: one accumulator each for two 8-lane halves
 * of a run keeps 2 * GEMV_NB + the unpacking's registers within sixteen. */
#define GEMV_NB 4

AI uint32_t ld_u32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

AI uint16_t ld_u16(const uint8_t *p)
{
    uint16_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* The 16 codes of run k as two vectors of eight floats. */
AI void unpack16(dtype_t dt, const uint8_t *row, const uint8_t *hi_plane, int64_t k,
                 __m256 *lo, __m256 *hi)
{
    const __m256i sh_lo = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
    const __m256i sh_hi = _mm256_setr_epi32(16, 18, 20, 22, 24, 26, 28, 30);
    const __m256i three = _mm256_set1_epi32(3);
    __m256i v = _mm256_set1_epi32((int)ld_u32(row + k / 4));
    __m256i a = _mm256_and_si256(_mm256_srlv_epi32(v, sh_lo), three);
    __m256i b = _mm256_and_si256(_mm256_srlv_epi32(v, sh_hi), three);
    if (dt == DTYPE_Q3) {
        const __m256i bit_lo = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        const __m256i bit_hi = _mm256_setr_epi32(8, 9, 10, 11, 12, 13, 14, 15);
        const __m256i one = _mm256_set1_epi32(1);
        __m256i h = _mm256_set1_epi32((int)ld_u16(hi_plane + k / 8));
        a = _mm256_or_si256(a, _mm256_slli_epi32(
                                   _mm256_and_si256(_mm256_srlv_epi32(h, bit_lo), one), 2));
        b = _mm256_or_si256(b, _mm256_slli_epi32(
                                   _mm256_and_si256(_mm256_srlv_epi32(h, bit_hi), one), 2));
    }
    *lo = _mm256_cvtepi32_ps(a);
    *hi = _mm256_cvtepi32_ps(b);
}

/* y[i*ldy + r] for rows i0..i0+nb-1 of x (nb <= GEMV_NB) and one weight row r. */
AI void gemv_row(dtype_t dt, float *y, int64_t ldy, const float *x, int64_t ldx, int i0, int nb,
                 const weight_t *w, int64_t r)
{
    int64_t cols = w->cols, ng = cols / w->group;
    const uint8_t *row = (const uint8_t *)w->data + (size_t)r * dtype_row_bytes(dt, cols);
    const uint8_t *hi_plane = row + (cols + 3) / 4;
    __m256 acc[GEMV_NB];
    for (int i = 0; i < GEMV_NB; i++)
        acc[i] = _mm256_setzero_ps();
    for (int64_t g = 0; g < ng; g++) {
        __m256 s = _mm256_set1_ps(_cvtsh_ss(w->scales[r * ng + g]));
        __m256 z = _mm256_set1_ps(_cvtsh_ss(w->zeros[r * ng + g]));
        for (int64_t k = g * w->group; k < (g + 1) * w->group; k += LOWBIT_GROUP_UNIT) {
            __m256 a, b;
            unpack16(dt, row, hi_plane, k, &a, &b);
            a = _mm256_mul_ps(_mm256_sub_ps(a, z), s);
            b = _mm256_mul_ps(_mm256_sub_ps(b, z), s);
            for (int i = 0; i < nb; i++) {
                const float *xi = x + (int64_t)(i0 + i) * ldx + k;
                acc[i] = _mm256_fmadd_ps(a, _mm256_loadu_ps(xi), acc[i]);
                acc[i] = _mm256_fmadd_ps(b, _mm256_loadu_ps(xi + 8), acc[i]);
            }
        }
    }
    for (int i = 0; i < nb; i++)
        y[(int64_t)(i0 + i) * ldy + r] = hsum8(acc[i]);
}

/* One function per (dtype, rows of x) pair, so the inner loops are unrolled for it. */
#define GEMV_ROWS(name, DT, NB)                                                              \
    static void name(float *y, int64_t ldy, const float *x, int64_t ldx, int i0,            \
                     const weight_t *w, int64_t r0, int64_t r1)                             \
    {                                                                                        \
        for (int64_t r = r0; r < r1; r++)                                                    \
            gemv_row(DT, y, ldy, x, ldx, i0, NB, w, r);                                      \
    }
GEMV_ROWS(gemv_q2_1, DTYPE_Q2, 1)
GEMV_ROWS(gemv_q2_2, DTYPE_Q2, 2)
GEMV_ROWS(gemv_q2_3, DTYPE_Q2, 3)
GEMV_ROWS(gemv_q2_4, DTYPE_Q2, 4)
GEMV_ROWS(gemv_q3_1, DTYPE_Q3, 1)
GEMV_ROWS(gemv_q3_2, DTYPE_Q3, 2)
GEMV_ROWS(gemv_q3_3, DTYPE_Q3, 3)
GEMV_ROWS(gemv_q3_4, DTYPE_Q3, 4)

typedef void (*gemv_rows_fn)(float *, int64_t, const float *, int64_t, int, const weight_t *,
                             int64_t, int64_t);
static const gemv_rows_fn gemv_fns[2][GEMV_NB] = {
    {gemv_q2_1, gemv_q2_2, gemv_q2_3, gemv_q2_4},
    {gemv_q3_1, gemv_q3_2, gemv_q3_3, gemv_q3_4},
};

void cpu_lowbit_gemv_avx2(float *y, int64_t ldy, const float *x, int64_t ldx, const float *xq,
                          int64_t ldq, int n, const weight_t *w, int64_t r0, int64_t r1)
{
    if (w->group % LOWBIT_GROUP_UNIT != 0) {
        cpu_lowbit_gemv_scalar(y, ldy, x, ldx, xq, ldq, n, w, r0, r1);
        return;
    }
    const gemv_rows_fn *fns = gemv_fns[w->dtype == DTYPE_Q3];
    /* Blocks of weight rows small enough to stay in L1 while every block of x rows meets
     * them: the weights are read from memory once. */
    int64_t rb = (int64_t)dtype_row_bytes(w->dtype, w->cols);
    int64_t block = rb > 0 ? (16 * 1024) / rb : 1;
    if (block < 1)
        block = 1;
    for (int64_t b0 = r0; b0 < r1; b0 += block) {
        int64_t b1 = b0 + block < r1 ? b0 + block : r1;
        for (int i0 = 0; i0 < n; i0 += GEMV_NB) {
            int nb = n - i0 < GEMV_NB ? n - i0 : GEMV_NB;
            fns[nb - 1](y, ldy, x, ldx, i0, w, b0, b1);
        }
    }
}

void cpu_lowbit_rows_to_f32_avx2(float *dst, const weight_t *w, int64_t r0, int64_t r1)
{
    if (w->group % LOWBIT_GROUP_UNIT != 0) {
        cpu_lowbit_rows_to_f32_scalar(dst, w, r0, r1);
        return;
    }
    int64_t cols = w->cols, ng = cols / w->group;
    size_t rb = dtype_row_bytes(w->dtype, cols);
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *row = (const uint8_t *)w->data + (size_t)r * rb;
        const uint8_t *hi_plane = row + (cols + 3) / 4;
        float *d = dst + (r - r0) * cols;
        for (int64_t g = 0; g < ng; g++) {
            __m256 s = _mm256_set1_ps(_cvtsh_ss(w->scales[r * ng + g]));
            __m256 z = _mm256_set1_ps(_cvtsh_ss(w->zeros[r * ng + g]));
            for (int64_t k = g * w->group; k < (g + 1) * w->group; k += LOWBIT_GROUP_UNIT) {
                __m256 a, b;
                unpack16(w->dtype, row, hi_plane, k, &a, &b);
                _mm256_storeu_ps(d + k, _mm256_mul_ps(_mm256_sub_ps(a, z), s));
                _mm256_storeu_ps(d + k + 8, _mm256_mul_ps(_mm256_sub_ps(b, z), s));
            }
        }
    }
}
