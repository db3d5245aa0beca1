/* Internal to the CPU backend: the kernels of the 2- and 3-bit weight types (DTYPE_Q2,
 * DTYPE_Q3 in kernels/ops.h; bit order in docs/FORMATS.md) at every SIMD level. lowbit.c
 * holds the portable reference and the kernel tables; lowbit_avx2.c and lowbit_avx512.c the
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

/* The kernel table to run weight w with, for the level table k: k itself for every dtype
 * but Q2/Q3, and for those a copy of k whose gemv and rows_to_f32 are this file's kernels
 * of k's level (no gemv_prep; the prefill path's packing and tiles stay k's). */
const cpu_kernels_t *cpu_kernels_for(const cpu_kernels_t *k, const weight_t *w);

/* Several rows of x against a Q2/Q3 weight: each block of weight rows is dequantized
 * (to_f32, the level's rows_to_f32) into a stack buffer of LOWBIT_DEQ_FLOATS floats that
 * stays in L1/L2, then the level's own f32 gemv (base) runs every row of x against it, so a
 * code is unpacked once however many rows x has. Needs cols <= LOWBIT_DEQ_FLOATS. */
#define LOWBIT_DEQ_FLOATS 16384
void cpu_lowbit_gemv_dequant(const cpu_kernels_t *base,
                             void (*to_f32)(float *, const weight_t *, int64_t, int64_t),
                             float *y, int64_t ldy, const float *x, int64_t ldx, int n,
                             const weight_t *w, int64_t r0, int64_t r1);

/* The kernels of one level, with the signatures of cpu_kernels_t's gemv and rows_to_f32
 * (xq and ldq unused). The SIMD ones need groups of whole LOWBIT_GROUP_UNIT runs. */
void cpu_lowbit_gemv_scalar(float *y, int64_t ldy, const float *x, int64_t ldx,
                            const float *xq, int64_t ldq, int n, const weight_t *w, int64_t r0,
                            int64_t r1);
void cpu_lowbit_rows_to_f32_scalar(float *dst, const weight_t *w, int64_t r0, int64_t r1);
void cpu_lowbit_gemv_avx2(float *y, int64_t ldy, const float *x, int64_t ldx, const float *xq,
                          int64_t ldq, int n, const weight_t *w, int64_t r0, int64_t r1);
void cpu_lowbit_rows_to_f32_avx2(float *dst, const weight_t *w, int64_t r0, int64_t r1);
void cpu_lowbit_gemv_avx512(float *y, int64_t ldy, const float *x, int64_t ldx,
                            const float *xq, int64_t ldq, int n, const weight_t *w, int64_t r0,
                            int64_t r1);
void cpu_lowbit_rows_to_f32_avx512(float *dst, const weight_t *w, int64_t r0, int64_t r1);

#endif
