/* Internal to the CPU backend: Q4X8, the layout the CPU backend repacks 4-bit weights into
 * at placement (cpu_weight_upload) for its integer kernels.
 *
 * Why: the integer dot product of a Q4 block with 8-bit activations ends in one int32
 * vector whose lanes all belong to that block, which must be converted to f32 and scaled
 * by the block's two scales (weight group, activation block) before the next block: three
 * float operations for every 64 multiply-adds, as many as the integer work, and at 4 to 16
 * rows of activations the kernel is bound by them. In Q4X8 each lane of the vector belongs
 * to a different block instead: one conversion and one scaling serve eight blocks (256
 * columns), and the kernel is bound by the integer dot products alone.
 *
 * Layout, per row: the columns in sets of 256, each set eight blocks of 32 columns, stored
 * as 4 vectors of 32 bytes (128 bytes, the same size as Q4). In vector p (0..3), the four
 * bytes of lane j (0..7), byte t (0..3), hold block j's columns 8p+t (low nibble) and
 * 8p+4+t (high nibble). So the low nibbles of vector p are, lane by lane, four consecutive
 * columns of each block, and the high nibbles the next four. Scales and zeros stay as Q4
 * has them: (rows, cols/group) fp16.
 *
 * Which weights: Q4 with cols a multiple of 256 and a group of 32, 64, 128 or a multiple
 * of 256 (a set then spans whole groups in the same pattern every set). */
#ifndef RIVER_KERNELS_CPU_Q4X8_H
#define RIVER_KERNELS_CPU_Q4X8_H

#include <stdint.h>

#include "kernels/ops.h"

#define Q4X8_SET 256       /* columns per set */
#define Q4X8_SET_BYTES 128 /* bytes per set */

/* Whether a Q4 weight can take the layout. */
int cpu_q4x8_eligible(const weight_t *w);

/* Writes w's codes (Q4, eligible) in the Q4X8 layout to dst (rows * cols / 2 bytes). */
void cpu_q4x8_repack(const weight_t *w, uint8_t *dst);

/* Q8X8: the same idea for 8-bit codes. Why: the integer dot product of a Q8 block of 32
 * columns is one vector whose lanes all belong to that block, so every 32 columns need a
 * conversion to f32 and a scaling (q8_x86.h); in Q8X8 each lane of the vector belongs to a
 * different block, and one conversion and scaling serve eight blocks.
 *
 * Layout, per row: the columns in sets of 256, each set eight blocks of 32 columns, stored
 * as 8 vectors of 32 bytes (256 bytes, the same size as Q8). In vector v (0..7), the four
 * bytes of lane j (0..7), byte t (0..3), hold block j's column 4v+t. Which weights: Q8
 * with the same columns and groups as Q4X8, and groups of 16 (llama.cpp's Q6_K), whose two
 * groups a block are vectors 0-3 and 4-7 of a set: the kernels scale a set's dot products
 * once a half (q8_x86.h, x8_half_step), still a conversion for eight groups, where the
 * file's layout takes one for every two (the q4_k_m file's Q6_K head and down projections
 * took 24.8 of its 46.3 ms decode step there, at 15-17 G multiply-adds/s against Q4X8's
 * 45 in the same step: river bench --profile, avx512bf16). Every code stays
 * the byte it was: only its place changes, so zeros and scales are Q8's. */
#define Q8X8_SET_BYTES 256 /* bytes per set */

/* Rows of x above which the VNNI kernels of the AVX-512 level take Q4X8 and Q8X8 in 4 x 4
 * tiles of 512-bit vpdpbusd (tile_z in q4x8_x86.h, x8_tile_z in q8_x86.h), and AMD
 * processors run Q4X8 at that level (x8_pick.h). With fewer rows the weights come from
 * memory, and the wide tile, reading four of their rows at once, ran at 0.8x the 256-bit
 * tiles at 4 rows of x on the Zen 5 VM (river bench --kernels, q8x8, 2 threads); they tied
 * at 8, and the wide tile won from 16 rows on, 1.3-1.4x at 128 and 512. */
#define CPU_X8_WIDE_MIN_N 8

int cpu_q8x8_eligible(const weight_t *w);
void cpu_q8x8_repack(const weight_t *w, uint8_t *dst);

/* Whether the SIMD levels' integer kernels read Q8 weight w in the file's layout (q8_x86.h)
 * with x quantized to 8 bits, at every number of rows: groups of whole 32-column blocks,
 * or of halves of one (groups of 16, llama.cpp's Q6_K). Other Q8 weights take the float
 * path. */
static inline int cpu_q8_int_eligible(const weight_t *w)
{
    return w->dtype == DTYPE_Q8 &&
           (w->group % 32 == 0 || (w->group == 16 && w->cols % 32 == 0));
}

/* Byte of a Q8X8 row that holds column k. */
static inline int64_t cpu_q8x8_byte(int64_t k)
{
    int64_t c = k % Q4X8_SET, j = c / 32, o = c % 32;
    return k / Q4X8_SET * Q8X8_SET_BYTES + (o / 4) * 32 + j * 4 + o % 4;
}

/* Byte of a Q4X8 row that holds column k, and whether k is its high nibble. */
static inline int64_t cpu_q4x8_byte(int64_t k, int *high)
{
    int64_t c = k % Q4X8_SET;
    int64_t j = c / 32, o = c % 32;
    *high = (int)((o % 8) / 4);
    return k / Q4X8_SET * Q4X8_SET_BYTES + (o / 8) * 32 + j * 4 + o % 4;
}

#endif
