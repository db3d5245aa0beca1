/* splitmix64: a small seedable generator whose sequence is the same on every platform, so
 * that whatever is drawn from a seed (synthetic weights, router initialisation, request
 * seeds) can be drawn again. Each step adds the golden-ratio increment to the state and
 * mixes it; the mix alone is a good 64-bit hash finalizer (every input bit reaches every
 * output bit), which the prefix hashes use. */
#ifndef RIVER_COMMON_RNG_H
#define RIVER_COMMON_RNG_H

#include <stdint.h>

#define RNG_GOLDEN UINT64_C(0x9e3779b97f4a7c15) /* 2^64 / the golden ratio, odd */

static inline uint64_t rng_mix(uint64_t z)
{
    z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
    return z ^ (z >> 31);
}

/* The next 64 random bits of the generator whose state is *s (any value, 0 included). */
static inline uint64_t rng_next(uint64_t *s)
{
    return rng_mix(*s += RNG_GOLDEN);
}

#endif
