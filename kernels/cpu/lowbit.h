/* Internal to the CPU backend: the kernels of the 2- and 3-bit weight types (DTYPE_Q2,
 * DTYPE_Q3 in kernels/ops.h; bit order in docs/FORMATS.md) at every SIMD level. lowbit.c
 * holds the kernel tables and the gemv the vector levels share (kernels_scalar.c the
 * portable reference); lowbit_avx2.c and lowbit_avx512.c the
 * vector kernels, which unpack a run of 16 codes from one 32-bit load of the 2-bit plane
 * (and one 16-bit load of the 1-bit plane for Q3) with variable shifts.
 *
 * Every level computes each weight as ((float)q - zero) * scale, the same float operations
 * as the portable code, so a dequantized row (rows_to_f32) is bit-identical at every level;
 * matmul sums in lanes on the SIMD levels, so its results differ between levels by rounding
 * only. The weights are read in place; nothing is repacked at placement. */
#ifndef RIVER_KERNELS_CPU_LOWBIT_H
#define RIVER_KERNELS_CPU_LOWBIT_H

#include <stdint.h>

#include "kernels/cpu/simd.h"
#include "kernels/ops.h"

/* Q2/Q3 groups are whole runs of this many codes, which the vector kernels unpack at once
 * (cpu_weight_check refuses other groups). */
#define LOWBIT_GROUP_UNIT 16

/* Code k of a Q2 or Q3 row of `cols` codes starting at `row`. */
static inline unsigned cpu_lowbit_code(dtype_t dt, const uint8_t *row, int64_t cols, int64_t k)
{
    unsigned q = (unsigned)(row[k >> 2] >> (2 * (k & 3))) & 3u;
    if (dt == DTYPE_Q3)
        q |= ((unsigned)(row[(cols + 3) / 4 + (k >> 3)] >> (k & 7)) & 1u) << 2;
    return q;
}

/* The kernel table to run weight w with, for the level table k: k itself for most dtypes;
 * for Q2/Q3 a copy of k whose gemv and rows_to_f32 are this file's kernels of k's level (no
 * gemv_prep; the prefill path's packing and tiles stay k's); for Q4X8 and Q8X8 the table
 * whose integer kernels measured faster against n rows of x (x8_pick.h; n 0 where there
 * is no x). */
const cpu_kernels_t *cpu_kernels_for(const cpu_kernels_t *k, const weight_t *w, int n);

/* The direct kernel of a vector level: rows r0..r1 of Q2/Q3 weight w against rows
 * i0..i0+nb-1 of x, one function per (dtype, nb) so that its loops unroll for them. */
typedef void (*cpu_lowbit_rows_fn)(float *y, int64_t ldy, const float *x, int64_t ldx, int i0,
                                   const weight_t *w, int64_t r0, int64_t r1);

/* Defines the cpu_lowbit_rows_fn `name` for dtype DT and NB rows of x on the including
 * file's own gemv_rows(dt, R, y, ldy, x, ldx, i0, nb, w, ng, rb, r), which computes weight
 * rows r..r+R-1 (R = 1 or 2): pairs of weight rows, then the odd one. */
#define CPU_LOWBIT_ROWS_FN(name, DT, NB)                                                     \
    static void name(float *y, int64_t ldy, const float *x, int64_t ldx, int i0,            \
                     const weight_t *w, int64_t r0, int64_t r1)                             \
    {                                                                                        \
        int64_t r = r0, ng = w->cols / w->group;                                             \
        size_t rb = dtype_row_bytes(DT, w->cols);                                            \
        for (; r + 2 <= r1; r += 2)                                                          \
            gemv_rows(DT, 2, y, ldy, x, ldx, i0, NB, w, ng, rb, r);                          \
        if (r < r1)                                                                          \
            gemv_rows(DT, 1, y, ldy, x, ldx, i0, NB, w, ng, rb, r);                          \
    }

/* What a vector level brings to the gemv the levels share (cpu_lowbit_gemv_level). */
typedef struct {
    const cpu_kernels_t *base; /* the level's own kernels: their f32 gemv serves many x rows */
    void (*rows_to_f32)(float *, const weight_t *, int64_t, int64_t); /* the level's own */
    int direct_n;                     /* most rows of x the direct kernels take */
    int nb;                           /* most rows of x one direct kernel serves */
    const cpu_lowbit_rows_fn *fns[2]; /* [dtype == Q3][rows of x - 1], nb entries each */
} cpu_lowbit_level_t;

/* The gemv of a vector level, with the arguments of cpu_kernels_t's gemv but xq. Up to
 * direct_n rows of x, each block of weight rows small enough for L1 meets every block of nb
 * x rows on the direct kernels, so the weights are read from memory once. Past that,
 * unpacking every code once per pass costs more than dequantizing once: each block of
 * weight rows is dequantized (rows_to_f32) into a stack buffer of LOWBIT_DEQ_FLOATS floats
 * that stays in L1/L2, and the level's f32 gemv runs every row of x against it. Groups that
 * are not whole LOWBIT_GROUP_UNIT runs (cpu_weight_check refuses them) take the portable
 * kernel. */
#define LOWBIT_DEQ_FLOATS 16384
void cpu_lowbit_gemv_level(const cpu_lowbit_level_t *l, float *y, int64_t ldy, const float *x,
                           int64_t ldx, int n, const weight_t *w, int64_t r0, int64_t r1);

/* The kernels of the vector levels, with the signatures of cpu_kernels_t's gemv and
 * rows_to_f32 (xq and ldq unused); the portable level's are cpu_scalar_gemv and
 * cpu_scalar_rows_to_f32 (simd.h). */
void cpu_lowbit_gemv_avx2(float *y, int64_t ldy, const float *x, int64_t ldx, const float *xq,
                          int64_t ldq, int n, const weight_t *w, int64_t r0, int64_t r1);
void cpu_lowbit_rows_to_f32_avx2(float *dst, const weight_t *w, int64_t r0, int64_t r1);
void cpu_lowbit_gemv_avx512(float *y, int64_t ldy, const float *x, int64_t ldx,
                            const float *xq, int64_t ldq, int n, const weight_t *w, int64_t r0,
                            int64_t r1);
void cpu_lowbit_rows_to_f32_avx512(float *dst, const weight_t *w, int64_t r0, int64_t r1);

#endif
