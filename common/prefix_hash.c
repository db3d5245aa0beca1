#include "common/prefix_hash.h"

#include <string.h>

/* splitmix64's finalizer: every input bit reaches every output bit. */
static uint64_t prefix__mix(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t prefix__text(uint64_t h, const char *s)
{
    /* FNV-1a over the bytes, then mixed: fingerprints are short hex strings. */
    for (; s && *s; s++) {
        h ^= (unsigned char)*s;
        h *= 0x100000001B3ull;
    }
    return prefix__mix(h);
}

uint64_t prefix_hash_seed(const char *model_fingerprint, const char *river_fingerprint)
{
    uint64_t h = prefix__text(0xcbf29ce484222325ull, model_fingerprint);
    h = prefix__text(h ^ 0x7269766572ull /* "river" */, river_fingerprint);
    return h ? h : 1;
}

uint64_t prefix_hash_page(uint64_t parent, const int32_t *ids, size_t n)
{
    uint64_t h = prefix__mix(parent ^ 0x9E3779B97F4A7C15ull);
    for (size_t i = 0; i < n; i++)
        h = prefix__mix(h ^ ((uint64_t)(uint32_t)ids[i] + 0x9E3779B97F4A7C15ull * (i + 1)));
    h = prefix__mix(h ^ (uint64_t)n);
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
