/* The one conversion between f32 and the element types of the KV cache (kv_view_t in
 * kernels/ops.h): kv_write narrows rows with kv_row_from_f32, and every reader widens them
 * as kv_row_to_f32 does (the SIMD levels of the CPU backend widen with instructions that
 * give the same floats, since widening is exact). A position's values therefore depend only
 * on the floats written, never on the batch that wrote or reads them. Static inline, so
 * that the backends and the engine's pool (kv_pool_fill) share it without a link
 * dependency. */
#ifndef RIVER_KERNELS_KV_ROW_H
#define RIVER_KERNELS_KV_ROW_H

#include <math.h>
#include <stdint.h>

#include "kernels/half.h"
#include "kernels/ops.h"

/* Writes src[0..n) as elements off..off+n-1 of a KV array of type dt at base (scales: its
 * Q8 scale array, unused otherwise). For Q8, off and n are multiples of KV_Q8_BLOCK: each
 * block gets scale max|x| / 127 and codes round(x / scale), ties to even; a block holding
 * a NaN or an infinity reads back as NaN (its scale is NaN), so that a poisoned slot stays
 * visible (tests fill pools with NaN). */
static inline void kv_row_from_f32(dtype_t dt, void *base, float *scales, int64_t off,
                                   const float *src, int64_t n)
{
    switch (dt) {
    case DTYPE_F16:
        for (int64_t j = 0; j < n; j++)
            ((uint16_t *)base)[off + j] = f32_to_f16(src[j]);
        return;
    case DTYPE_BF16:
        for (int64_t j = 0; j < n; j++)
            ((uint16_t *)base)[off + j] = f32_to_bf16(src[j]);
        return;
    case DTYPE_Q8:
        for (int64_t b = 0; b < n; b += KV_Q8_BLOCK) {
            float amax = 0.0f;
            int finite = 1;
            for (int j = 0; j < KV_Q8_BLOCK; j++) {
                float a = fabsf(src[b + j]);
                finite &= isfinite(a) != 0;
                amax = a > amax ? a : amax;
            }
            float scale = finite ? amax / 127.0f : NAN;
            int8_t *codes = (int8_t *)base + off + b;
            for (int j = 0; j < KV_Q8_BLOCK; j++) {
                float c = scale > 0.0f ? nearbyintf(src[b + j] / scale) : 0.0f;
                codes[j] = (int8_t)(c > 127.0f ? 127.0f : c < -127.0f ? -127.0f : c);
            }
            scales[(off + b) / KV_Q8_BLOCK] = scale;
        }
        return;
    default: /* DTYPE_F32 */
        for (int64_t j = 0; j < n; j++)
            ((float *)base)[off + j] = src[j];
        return;
    }
}

/* dst[0..n) = elements off..off+n-1 of a KV array of type dt, widened to f32 (for Q8, off
 * and n are multiples of KV_Q8_BLOCK). */
static inline void kv_row_to_f32(dtype_t dt, const void *base, const float *scales,
                                 int64_t off, float *dst, int64_t n)
{
    switch (dt) {
    case DTYPE_F16:
        for (int64_t j = 0; j < n; j++)
            dst[j] = f16_to_f32(((const uint16_t *)base)[off + j]);
        return;
    case DTYPE_BF16:
        for (int64_t j = 0; j < n; j++)
            dst[j] = bf16_to_f32(((const uint16_t *)base)[off + j]);
        return;
    case DTYPE_Q8:
        for (int64_t j = 0; j < n; j++)
            dst[j] = (float)((const int8_t *)base)[off + j] * scales[(off + j) / KV_Q8_BLOCK];
        return;
    default: /* DTYPE_F32 */
        for (int64_t j = 0; j < n; j++)
            dst[j] = ((const float *)base)[off + j];
        return;
    }
}

#endif
