#include "common/prefix_hash.h"
#include "common/rng.h"

#include <string.h>


static uint64_t prefix__text(uint64_t h, const char *s)
{
    /* FNV-1a over the bytes, then mixed: fingerprints are short hex strings. */
    for (; s && *s; s++) {
        h ^= (unsigned char)*s;
        h *= 0x100000001B3ull;
    }
    return rng_mix(h);
}

uint64_t prefix_hash_seed(const char *model_fingerprint, const char *river_fingerprint)
{
    uint64_t h = prefix__text(0xcbf29ce484222325ull, model_fingerprint);
    h = prefix__text(h ^ 0x7269766572ull /* "river" */, river_fingerprint);
    return h ? h : 1;
}

uint64_t prefix_hash_page(uint64_t parent, const int32_t *ids, size_t n)
{
    uint64_t h = rng_mix(parent ^ RNG_GOLDEN);
    for (size_t i = 0; i < n; i++)
        h = rng_mix(h ^ ((uint64_t)(uint32_t)ids[i] + RNG_GOLDEN * (i + 1)));
    h = rng_mix(h ^ (uint64_t)n);
    return h ? h : 1;
}

size_t prefix_hash_chain(uint64_t seed, const int32_t *ids, size_t n_ids, int page_size,
                         uint64_t *out, size_t max_pages)
{
    if (page_size <= 0)
        return 0;
    size_t n = n_ids / (size_t)page_size;
    if (n > max_pages)
        n = max_pages;
    uint64_t h = seed;
    for (size_t i = 0; i < n; i++) {
        h = prefix_hash_page(h, ids + i * (size_t)page_size, (size_t)page_size);
        out[i] = h;
    }
    return n;
}
