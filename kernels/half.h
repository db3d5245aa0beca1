/* Scalar conversions between float32 and the 16-bit float formats (IEEE fp16 and bfloat16).
 *
 * Narrowing rounds to nearest, ties to even, as hardware conversions do; values too large
 * for fp16 become infinity, tiny ones become fp16 subnormals or zero, and NaN stays NaN
 * (made quiet). Widening is exact. Everything is static inline so that kernels can use it
 * in inner loops. */
#ifndef RIVER_KERNELS_HALF_H
#define RIVER_KERNELS_HALF_H

#include <stdint.h>
#include <string.h>

static inline uint32_t half_f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float half_bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* bfloat16 is the top half of a float32, so widening is a shift. */
static inline float bf16_to_f32(uint16_t h)
{
    return half_bits_f32((uint32_t)h << 16);
}

static inline uint16_t f32_to_bf16(float f)
{
    uint32_t u = half_f32_bits(f);
    /* Rounding a NaN could carry into the exponent and turn it into infinity; keep the
     * high payload bits and set the quiet bit instead. */
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x0040u);
    /* Adding 0x7fff plus the lowest kept bit rounds to nearest with ties to even. */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    if (exp == 0x1f) /* infinity or NaN */
        return half_bits_f32(sign | 0x7f800000u | (man << 13));
    if (exp == 0) {
        /* Zero or subnormal: man * 2^-24, exact in float32. */
        float v = (float)man * 0x1p-24f;
        return sign ? -v : v;
    }
    return half_bits_f32(sign | ((exp + 112u) << 23) | (man << 13));
}

static inline uint16_t f32_to_f16(float f)
{
    uint32_t u = half_f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) /* NaN: keep the top payload bits, force quiet */
        return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
    /* 65520 is the midpoint between 65504 (the largest fp16) and 65536; ties go to the
     * even neighbour, which is the overflow, so everything from there up is infinity. */
    if (a >= 0x477ff000u)
        return (uint16_t)(sign | 0x7c00u);
    if (a >= 0x38800000u) {
        /* Normal range (>= 2^-14): rebias the exponent from 127 to 15 and round away the
         * low 13 mantissa bits; a mantissa carry correctly bumps the exponent. */
        uint32_t r = a - (112u << 23);
        r += 0x0fffu + ((r >> 13) & 1u);
        return (uint16_t)(sign | (r >> 13));
    }
    /* Below 2^-14: adding 0.5 puts the value's 2^-24 units into the low mantissa bits of
     * the sum, and the float addition itself rounds to nearest even there. */
    float s = half_bits_f32(a) + 0.5f;
    return (uint16_t)(sign | (half_f32_bits(s) - half_f32_bits(0.5f)));
}

#endif
