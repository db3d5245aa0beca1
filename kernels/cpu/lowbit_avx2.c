/* The AVX2 + FMA + F16C kernels of the 2- and 3-bit weight types (lowbit.h). Compiled with
 * those flags and only called after cpu_simd_detect() found them.
 *
 * A run of 16 codes at column k (a multiple of 16: groups are whole runs) is 32 bits of the
 * 2-bit plane at byte k/4, broadcast to eight lanes and shifted right by 0, 2, .., 14
 * (codes k..k+7) and by 16, .., 30 (k+8..k+15), so that each lane holds its code in its low
 * two bits; for Q3 the 16 bits of the 1-bit plane at byte k/8, shifted left by 2, broadcast
 * and shifted right by 0, .., 7 and 8, .., 15, bring bit 2 of each code to bit 2 of its
 * lane. The lane then indexes (vpermps, low three bits) a table of the group's dequantized
 * values, ((float)q - zero) * scale for every code q, made once per group with the portable
 * level's float operations (so the values are the portable level's bit for bit); for Q2 the
 * four values fill the eight entries twice, so the bits above a code never need clearing.
 * Two weight rows go through together, so that even a single row of x keeps independent
 * chains of multiply-adds. */
#include <immintrin.h>
#include <string.h>

#include "kernels/cpu/lowbit.h"

#define AI static inline __attribute__((always_inline))

#include "kernels/cpu/x86_util.h"

/* Rows of x one pass over two weight rows serves: 4 * GEMV_NB accumulators (two weight
 * rows, two halves of a run) within sixteen registers, with the tables and shifts. */
#define LOWBIT_AVX2_DIRECT_N 2
#define GEMV_NB 2

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

/* The table of group g of weight row r: entry i = ((float)(i mod 2^bits) - zero) * scale. */
AI __m256 group_table(dtype_t dt, const weight_t *w, int64_t r, int64_t ng, int64_t g)
{
    const __m256 iota2 = _mm256_setr_ps(0, 1, 2, 3, 0, 1, 2, 3);
    const __m256 iota3 = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7);
    __m256 s = _mm256_set1_ps(_cvtsh_ss(w->scales[r * ng + g]));
    __m256 z = _mm256_set1_ps(_cvtsh_ss(w->zeros[r * ng + g]));
    return _mm256_mul_ps(_mm256_sub_ps(dt == DTYPE_Q3 ? iota3 : iota2, z), s);
}

/* The sixteen codes of run k of a row (hi_plane: its 1-bit plane) as two vectors of eight
 * lanes, each code in the low bits of its lane. */
AI void run_codes(dtype_t dt, const uint8_t *row, const uint8_t *hi_plane, uint64_t k,
                  __m256i *lo, __m256i *hi)
{
    const __m256i sh_lo = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
    const __m256i sh_hi = _mm256_setr_epi32(16, 18, 20, 22, 24, 26, 28, 30);
    __m256i v = _mm256_set1_epi32((int)ld_u32(row + k / 4));
    __m256i a = _mm256_srlv_epi32(v, sh_lo), b = _mm256_srlv_epi32(v, sh_hi);
    if (dt == DTYPE_Q3) {
        const __m256i bit_lo = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        const __m256i bit_hi = _mm256_setr_epi32(8, 9, 10, 11, 12, 13, 14, 15);
        const __m256i three = _mm256_set1_epi32(3), four = _mm256_set1_epi32(4);
        __m256i h = _mm256_set1_epi32((int)((uint32_t)ld_u16(hi_plane + k / 8) << 2));
        a = _mm256_or_si256(_mm256_and_si256(a, three),
                            _mm256_and_si256(_mm256_srlv_epi32(h, bit_lo), four));
        b = _mm256_or_si256(_mm256_and_si256(b, three),
                            _mm256_and_si256(_mm256_srlv_epi32(h, bit_hi), four));
    }
    *lo = a;
    *hi = b;
}

/* y[i*ldy + r + j] for rows i0..i0+nb-1 of x (nb <= GEMV_NB) and weight rows r + j,
 * j < R (1 or 2). */
AI void gemv_rows(dtype_t dt, int R, float *y, int64_t ldy, const float *x, int64_t ldx,
                  int i0, int nb, const weight_t *w, int64_t ng, size_t rb, int64_t r)
{
    uint64_t cols = (uint64_t)w->cols, group = (uint64_t)w->group;
    const uint8_t *row0 = (const uint8_t *)w->data + (size_t)r * rb, *row1 = row0 + rb;
    __m256 acc0[GEMV_NB], acc1[GEMV_NB];
    for (int i = 0; i < GEMV_NB; i++)
        acc0[i] = acc1[i] = _mm256_setzero_ps();
    for (int64_t g = 0; g < ng; g++) {
        __m256 t0 = group_table(dt, w, r, ng, g);
        __m256 t1 = R > 1 ? group_table(dt, w, r + 1, ng, g) : t0;
        for (uint64_t k = (uint64_t)g * group; k < (uint64_t)(g + 1) * group;
             k += LOWBIT_GROUP_UNIT) {
            __m256i a0, b0, a1, b1;
            run_codes(dt, row0, row0 + (cols + 3) / 4, k, &a0, &b0);
            __m256 wa0 = _mm256_permutevar8x32_ps(t0, a0), wb0 = _mm256_permutevar8x32_ps(t0, b0);
            __m256 wa1 = wa0, wb1 = wb0;
            if (R > 1) {
                run_codes(dt, row1, row1 + (cols + 3) / 4, k, &a1, &b1);
                wa1 = _mm256_permutevar8x32_ps(t1, a1);
                wb1 = _mm256_permutevar8x32_ps(t1, b1);
            }
            for (int i = 0; i < nb; i++) {
                const float *xi = x + (int64_t)(i0 + i) * ldx + (int64_t)k;
                __m256 xa = _mm256_loadu_ps(xi), xb = _mm256_loadu_ps(xi + 8);
                acc0[i] = _mm256_fmadd_ps(wb0, xb, _mm256_fmadd_ps(wa0, xa, acc0[i]));
                if (R > 1)
                    acc1[i] = _mm256_fmadd_ps(wb1, xb, _mm256_fmadd_ps(wa1, xa, acc1[i]));
            }
        }
    }
    for (int i = 0; i < nb; i++) {
        y[(int64_t)(i0 + i) * ldy + r] = hsum8(acc0[i]);
        if (R > 1)
            y[(int64_t)(i0 + i) * ldy + r + 1] = hsum8(acc1[i]);
    }
}

/* One direct kernel per (dtype, rows of x) pair. */
CPU_LOWBIT_ROWS_FN(gemv_q2_1, DTYPE_Q2, 1)
CPU_LOWBIT_ROWS_FN(gemv_q2_2, DTYPE_Q2, 2)
CPU_LOWBIT_ROWS_FN(gemv_q3_1, DTYPE_Q3, 1)
CPU_LOWBIT_ROWS_FN(gemv_q3_2, DTYPE_Q3, 2)

static const cpu_lowbit_rows_fn q2_fns[GEMV_NB] = {gemv_q2_1, gemv_q2_2};
static const cpu_lowbit_rows_fn q3_fns[GEMV_NB] = {gemv_q3_1, gemv_q3_2};
static const cpu_lowbit_level_t level = {
    .base = &cpu_kernels_avx2,
    .rows_to_f32 = cpu_lowbit_rows_to_f32_avx2,
    .direct_n = LOWBIT_AVX2_DIRECT_N,
    .nb = GEMV_NB,
    .fns = {q2_fns, q3_fns},
};

void cpu_lowbit_gemv_avx2(float *y, int64_t ldy, const float *x, int64_t ldx, const float *xq,
                          int64_t ldq, int n, const weight_t *w, int64_t r0, int64_t r1)
{
    (void)xq;
    (void)ldq;
    cpu_lowbit_gemv_level(&level, y, ldy, x, ldx, n, w, r0, r1);
}

void cpu_lowbit_rows_to_f32_avx2(float *dst, const weight_t *w, int64_t r0, int64_t r1)
{
    if (w->group % LOWBIT_GROUP_UNIT != 0) {
        cpu_scalar_rows_to_f32(dst, w, r0, r1);
        return;
    }
    dtype_t dt = w->dtype;
    int64_t cols = w->cols, ng = cols / w->group;
    size_t rb = dtype_row_bytes(dt, cols);
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *row = (const uint8_t *)w->data + (size_t)r * rb;
        const uint8_t *hi_plane = row + (cols + 3) / 4;
        float *d = dst + (r - r0) * cols;
        for (int64_t g = 0; g < ng; g++) {
            __m256 t = group_table(dt, w, r, ng, g);
            for (int64_t k = g * w->group; k < (g + 1) * w->group; k += LOWBIT_GROUP_UNIT) {
                __m256i a, b;
                run_codes(dt, row, hi_plane, (uint64_t)k, &a, &b);
                _mm256_storeu_ps(d + k, _mm256_permutevar8x32_ps(t, a));
                _mm256_storeu_ps(d + k + 8, _mm256_permutevar8x32_ps(t, b));
            }
        }
    }
}
