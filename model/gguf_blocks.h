/* ggml's public block layouts, written from the GGUF specification: dequantization of every
 * type River reads (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K) and a
 * quantizer of its own for each (the writer's, offline/gguf_write.h), and the conversion of
 * one row of blocks into River's affine groups (DTYPE_Q4 / DTYPE_Q8: value = (q - zero) *
 * scale with an fp16 scale and zero per group), which the GGUF loader uses.
 *
 * Conversions, per weight (ggml's bytes -> River's bytes, codes + fp16 scale + fp16 zero):
 *   Q8_0 -> Q8 g32, zero 128, code q+128           exact       1.0625 -> 1.125
 *   Q4_0 -> Q4 g32, zero 8                         exact       0.5625 -> 0.625
 *   Q4_1 -> Q4 g32, zero -m/d rounded to fp16                  0.625  -> 0.625
 *   Q5_0 -> Q8 g32, zero 16                        exact       0.6875 -> 1.125
 *   Q5_1 -> Q8 g32, zero -m/d rounded to fp16                  0.75   -> 1.125
 *   Q4_K -> Q4 g32, scale d*sc and zero dmin*m/(d*sc), each rounded to fp16
 *                                                              0.5625 -> 0.625
 *   Q5_K -> Q8 g32, as Q4_K                                    0.6875 -> 1.125
 *   Q6_K -> Q8 g16, scale d*sc rounded to fp16, zero 32 exact  0.8203 -> 1.25
 * A group whose scale is zero but whose offset is not (a constant group) gets codes 1, zero
 * 0 and the constant as its scale, so it stays exact up to that fp16 rounding. */
#ifndef RIVER_MODEL_GGUF_BLOCKS_H
#define RIVER_MODEL_GGUF_BLOCKS_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/ops.h"

/* Whether type has a dequantizer (and a quantizer) here. */
int gguf_block_known(int type);

/* n elements (a multiple of the type's block) from src to f32. */
void gguf_block_dequant(int type, const void *src, float *dst, int64_t n);
/* n elements (a multiple of the type's block) of src into blocks at dst. F16 and BF16 round
 * to nearest even; the block quantizers pick scales from each block's range. */
void gguf_block_quant(int type, const float *src, void *dst, int64_t n);
/* Bytes of n elements. */
size_t gguf_block_row_bytes(int type, int64_t n);

/* What a type becomes in River: *dt (DTYPE_Q4 or DTYPE_Q8) and *group, or 0 when it is used
 * as it is (F32, F16, BF16) or has no conversion (-1). */
int gguf_block_river_type(int type, dtype_t *dt, int *group);
/* One row of n elements of a block type into River's groups: codes (dtype_row_bytes of dt),
 * n/group fp16 scales and zeros. */
void gguf_block_to_river(int type, const void *src, int64_t n, uint8_t *codes,
                         uint16_t *scales, uint16_t *zeros);

#endif
