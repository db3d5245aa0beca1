/* The AVX-512 kernels of the 2- and 3-bit weight types (lowbit.h). Compiled with AVX-512
 * F/BW/VL and only called after cpu_simd_detect() found them.
 *
 * A run of 16 codes at column k (a multiple of 16: groups are whole runs) is 32 bits of the
 * 2-bit plane at byte k/4, broadcast to sixteen lanes and shifted right by 0, 2, .., 30, so
 * that lane j holds code j in its low two bits; for Q3 the 16 bits of the 1-bit plane at
 * byte k/8, broadcast and shifted by 0, 1, .., 15 after a shift left by 2, bring bit 2 of
 * code j to bit 2 of lane j, and one bit select joins the two. The lane then indexes a
 * table of the group's dequantized values, ((float)q - zero) * scale for every code q,
 * made once per group with the portable level's float operations (so the values are the
 * portable level's bit for bit) and repeated across the sixteen entries a permute reads
 * (entry i holds the value of code i mod 2^bits, so bits above a code's own never need
 * clearing). Two weight rows go through together, so that even a single row of x keeps
 * two independent chains of multiply-adds. */
#include <immintrin.h>
#include <string.h>

#include "kernels/cpu/lowbit.h"

#define AI static inline __attribute__((always_inline))

/* Rows of x one pass over two weight rows serves: 2 * GEMV_NB accumulators. */
#define LOWBIT_AVX512_DIRECT_N 2
#define GEMV_NB 8

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
AI __m512 group_table(dtype_t dt, const weight_t *w, int64_t r, int64_t ng, int64_t g)
{
    const __m512 iota2 = _mm512_setr_ps(0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3);
    const __m512 iota3 = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7);
    __m512 s = _mm512_set1_ps(_cvtsh_ss(w->scales[r * ng + g]));
    __m512 z = _mm512_set1_ps(_cvtsh_ss(w->zeros[r * ng + g]));
    return _mm512_mul_ps(_mm512_sub_ps(dt == DTYPE_Q3 ? iota3 : iota2, z), s);
}

/* The sixteen codes of run k of a row (hi_plane: its 1-bit plane), one a lane in the low
 * bits (above them: other codes' bits, which the tables ignore). */
AI __m512i run_codes(dtype_t dt, const uint8_t *row, const uint8_t *hi_plane, uint64_t k)
{
    const __m512i sh = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26,
                                         28, 30);
    __m512i a = _mm512_srlv_epi32(_mm512_set1_epi32((int)ld_u32(row + k / 4)), sh);
    if (dt != DTYPE_Q3)
        return a;
    const __m512i bit = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    __m512i h = _mm512_srlv_epi32(_mm512_set1_epi32((int)((uint32_t)ld_u16(hi_plane + k / 8) << 2)),
                                  bit);
    /* Bits 0-1 from a, the rest from h: (mask ? a : h) bit by bit. */
    return _mm512_ternarylogic_epi32(a, h, _mm512_set1_epi32(3), 0xe4);
}

/* y[i*ldy + r + j] for rows i0..i0+nb-1 of x (nb <= GEMV_NB) and weight rows r + j,
 * j < R (1 or 2). */
AI void gemv_rows(dtype_t dt, int R, float *y, int64_t ldy, const float *x, int64_t ldx,
                  int i0, int nb, const weight_t *w, int64_t ng, size_t rb, int64_t r)
{
    uint64_t cols = (uint64_t)w->cols, group = (uint64_t)w->group;
    const uint8_t *row0 = (const uint8_t *)w->data + (size_t)r * rb, *row1 = row0 + rb;
    __m512 acc0[GEMV_NB], acc1[GEMV_NB];
    for (int i = 0; i < GEMV_NB; i++)
        acc0[i] = acc1[i] = _mm512_setzero_ps();
    for (int64_t g = 0; g < ng; g++) {
        __m512 t0 = group_table(dt, w, r, ng, g);
        __m512 t1 = R > 1 ? group_table(dt, w, r + 1, ng, g) : t0;
        for (uint64_t k = (uint64_t)g * group; k < (uint64_t)(g + 1) * group;
             k += LOWBIT_GROUP_UNIT) {
            __m512 w0 = _mm512_permutexvar_ps(run_codes(dt, row0, row0 + (cols + 3) / 4, k), t0);
            __m512 w1 = R > 1 ? _mm512_permutexvar_ps(
                                    run_codes(dt, row1, row1 + (cols + 3) / 4, k), t1)
                              : w0;
            for (int i = 0; i < nb; i++) {
                __m512 xv = _mm512_loadu_ps(x + (int64_t)(i0 + i) * ldx + (int64_t)k);
                acc0[i] = _mm512_fmadd_ps(w0, xv, acc0[i]);
                if (R > 1)
                    acc1[i] = _mm512_fmadd_ps(w1, xv, acc1[i]);
            }
        }
    }
    for (int i = 0; i < nb; i++) {
        y[(int64_t)(i0 + i) * ldy + r] = _mm512_reduce_add_ps(acc0[i]);
        if (R > 1)
            y[(int64_t)(i0 + i) * ldy + r + 1] = _mm512_reduce_add_ps(acc1[i]);
    }
}

/* One direct kernel per (dtype, rows of x) pair. */
CPU_LOWBIT_ROWS_FN(gemv_q2_1, DTYPE_Q2, 1)
CPU_LOWBIT_ROWS_FN(gemv_q2_2, DTYPE_Q2, 2)
CPU_LOWBIT_ROWS_FN(gemv_q2_3, DTYPE_Q2, 3)
CPU_LOWBIT_ROWS_FN(gemv_q2_4, DTYPE_Q2, 4)
CPU_LOWBIT_ROWS_FN(gemv_q2_5, DTYPE_Q2, 5)
CPU_LOWBIT_ROWS_FN(gemv_q2_6, DTYPE_Q2, 6)
CPU_LOWBIT_ROWS_FN(gemv_q2_7, DTYPE_Q2, 7)
CPU_LOWBIT_ROWS_FN(gemv_q2_8, DTYPE_Q2, 8)
CPU_LOWBIT_ROWS_FN(gemv_q3_1, DTYPE_Q3, 1)
CPU_LOWBIT_ROWS_FN(gemv_q3_2, DTYPE_Q3, 2)
CPU_LOWBIT_ROWS_FN(gemv_q3_3, DTYPE_Q3, 3)
CPU_LOWBIT_ROWS_FN(gemv_q3_4, DTYPE_Q3, 4)
CPU_LOWBIT_ROWS_FN(gemv_q3_5, DTYPE_Q3, 5)
CPU_LOWBIT_ROWS_FN(gemv_q3_6, DTYPE_Q3, 6)
CPU_LOWBIT_ROWS_FN(gemv_q3_7, DTYPE_Q3, 7)
CPU_LOWBIT_ROWS_FN(gemv_q3_8, DTYPE_Q3, 8)

static const cpu_lowbit_rows_fn q2_fns[GEMV_NB] = {gemv_q2_1, gemv_q2_2, gemv_q2_3, gemv_q2_4, gemv_q2_5, gemv_q2_6, gemv_q2_7, gemv_q2_8};
static const cpu_lowbit_rows_fn q3_fns[GEMV_NB] = {gemv_q3_1, gemv_q3_2, gemv_q3_3, gemv_q3_4, gemv_q3_5, gemv_q3_6, gemv_q3_7, gemv_q3_8};
static const cpu_lowbit_level_t level = {
    .base = &cpu_kernels_avx512,
    .rows_to_f32 = cpu_lowbit_rows_to_f32_avx512,
    .direct_n = LOWBIT_AVX512_DIRECT_N,
    .nb = GEMV_NB,
    .fns = {q2_fns, q3_fns},
};

void cpu_lowbit_gemv_avx512(float *y, int64_t ldy, const float *x, int64_t ldx, const float *xq,
                            int64_t ldq, int n, const weight_t *w, int64_t r0, int64_t r1)
{
    (void)xq;
    (void)ldq;
    cpu_lowbit_gemv_level(&level, y, ldy, x, ldx, n, w, r0, r1);
}

void cpu_lowbit_rows_to_f32_avx512(float *dst, const weight_t *w, int64_t r0, int64_t r1)
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
            __m512 t = group_table(dt, w, r, ng, g);
            for (int64_t k = g * w->group; k < (g + 1) * w->group; k += LOWBIT_GROUP_UNIT)
                _mm512_storeu_ps(d + k, _mm512_permutexvar_ps(
                                            run_codes(dt, row, hi_plane, (uint64_t)k), t));
        }
    }
}
