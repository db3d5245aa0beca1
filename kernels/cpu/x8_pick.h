/* Internal to the CPU backend: which level's integer kernels run Q4X8 and Q8X8 matmuls at the
 * AVX-512 level.
 *
 * Both levels have them (q4x8_x86.h and q8_x86.h, compiled once with each level's flags, with
 * vpdpbusd at the AVX-512 level where the processor has VNNI). Their Q4X8 sums are the same
 * bits: the integer dot products of the unsigned codes are exact either way and the float work
 * around them is the same code. So are their Q8X8 sums where every zero is one integer z
 * (llama.cpp's Q8_0 and Q5_0, River's q8 backbones: both take exact integer sums of (q - z)
 * x8); with other zeros they differ by rounding (without VNNI the codes are taken as q - 128,
 * with zero terms to match). Which is faster depends on the processor, and not in a way a
 * kernel timed in cache shows: on this kind of machine (AMD EPYC with AVX-512 VNNI) both ran a
 * 256 x 2048 Q4X8 matrix in L2 in 7.4-7.6 us, but from memory (river bench --kernels, 2
 * threads, RIVER_X8_LEVEL alternating, three rounds, 8192 x 2048 and 2048 x 8192) the AVX2
 * level's Q4X8 kernels moved 1.00-1.21x the bytes of the VNNI ones at 1, 4 and 8 rows of x, and
 * in a decode step (river bench --profile, a bf16 backbone's exit onto a 4-bit river) the Q4X8
 * matmuls reached 0.83-0.85 of the bf16 matmuls' bandwidth against 0.69. Its Q8X8 kernels were
 * 1.05-1.15x at 1 and 4 rows but 0.85-0.93x at 8. So on AMD processors Q4X8 runs the AVX2
 * level's kernels, and so does Q8X8 at one row of x (decode of one stream) where every zero is
 * one integer: decode steps of llama.cpp's q8_0 file ran 1.15-1.29x as fast on them and River's
 * q8 backbone 1.09-1.19x (river bench, the binaries before and after alternating, six rounds,
 * every round faster), though the kernels timed alone, calls minutes apart, had read
 * 0.89-1.05x. Q8X8 with other zeros keeps one level at every n, since the two levels' bits
 * differ there and a row's bits must not depend on the batch; at more rows and elsewhere
 * (processors this machine cannot measure) Q8X8 runs the AVX-512 level's own. Past
 * CPU_X8_WIDE_MIN_N rows of x (a prefill, a batch of many rows) the weights no longer come from
 * memory at the kernels' pace, and the AVX-512 level's 512-bit VNNI tiles (q4x8_x86.h: tile_z)
 * ran Q4X8 1.3x as fast as the AVX2 level's at 128 and 512 rows and 1.1-1.2x at 16 (river bench
 * --kernels, 2 threads, RIVER_X8_LEVEL alternating, two rounds), so those take the AVX-512
 * level's kernels there too; a row's bits do not depend on it. RIVER_X8_LEVEL=avx2|avx512
 * forces one level for both types at every n; any other value is refused at placement, naming
 * it (tests/test_ops.c checks the two levels' Q4X8 sums bit for bit). */
#ifndef RIVER_KERNELS_CPU_X8_PICK_H
#define RIVER_KERNELS_CPU_X8_PICK_H

#include "kernels/cpu/q4x8.h"
#include "kernels/cpu/simd.h"

/* The table to run weight w with against n rows of x (0 where there is no x: the table's
 * dequantization, the same at both levels), for level table k: k itself below the AVX-512
 * level and for dtypes other than Q4X8 and Q8X8; else the AVX2 table where the choice
 * above says so. */
const cpu_kernels_t *cpu_x8_kernels(const cpu_kernels_t *k, const weight_t *w, int n);

/* RIVER_X8_LEVEL's error, checked at placement: 0, or RIVER_EINVAL naming the value. */
int cpu_x8_env_check(void);

#endif
