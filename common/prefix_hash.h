/* The hash chain that names a run of KV pages by the token ids they hold, shared by the
 * worker's prefix cache (engine/prefix_cache.h) and riverd's prefix-aware placement
 * (daemon/dispatch.c), which must compute the same value from a request's token ids.
 *
 * Names are 128 bits of SipHash-2-4 (its 128-bit output) under a secret key, so that
 * nobody without the key can predict a name or construct two prefixes that share one.
 * Page i of a sequence (positions i*page_size .. (i+1)*page_size - 1) is named
 *     h_0 = root, h_(i+1) = prefix_hash_page(key, h_i, ids of page i, page_size)
 * so a name covers the page's tokens and every token before it. The root carries what
 * makes the same ids give other K/V, the model and Exit River fingerprints (the seed of
 * prefix_hash_seed), and the salt of the partition the request belongs to (a tenant), so
 * that the same prompt from two partitions never has the same names.
 *
 * A name is only a lookup key: the prefix cache still compares a page's tokens and the
 * identity of the page before it, so even a collision could not splice one prefix's K/V
 * into another's request. */
#ifndef RIVER_COMMON_PREFIX_HASH_H
#define RIVER_COMMON_PREFIX_HASH_H

#include <stddef.h>
#include <stdint.h>

/* The secret of one worker's names (128 bits). */
typedef struct prefix_key {
    uint64_t k0, k1;
} prefix_key_t;

#define PREFIX_KEY_BYTES 16

/* A page's name; lo alone is what a worker's heartbeat reports (a placement hint). */
typedef struct prefix_name {
    uint64_t lo, hi;
} prefix_name_t;

/* The seed of a worker's chains: the model's fingerprint text and the river's (NULL or ""
 * without a river), hashed; never 0. */
uint64_t prefix_hash_seed(const char *model_fingerprint, const char *river_fingerprint);

/* A fresh key from the system's random source; RIVER_ESYS when it has none. */
int prefix_key_random(prefix_key_t *key);
/* The key as 16 bytes (little-endian k0 then k1), and back; prefix_key_from_bytes fails
 * with RIVER_EFORMAT unless n is PREFIX_KEY_BYTES. */
void prefix_key_to_bytes(const prefix_key_t *key, uint8_t out[PREFIX_KEY_BYTES]);
int prefix_key_from_bytes(prefix_key_t *key, const uint8_t *b, size_t n);

/* The name before a partition's first page: seed and salt (n bytes, may be 0) hashed. */
prefix_name_t prefix_hash_root(const prefix_key_t *key, uint64_t seed, const void *salt,
                               size_t n);

/* The name of a page of n ids that follows a page named parent (the root for page 0). */
prefix_name_t prefix_hash_page(const prefix_key_t *key, prefix_name_t parent,
                               const int32_t *ids, size_t n);

/* Names the first min(max_pages, n_ids / page_size) full pages of ids into out; returns
 * how many it wrote. */
size_t prefix_hash_chain(const prefix_key_t *key, prefix_name_t root, const int32_t *ids,
                         size_t n_ids, int page_size, prefix_name_t *out, size_t max_pages);

static inline int prefix_name_eq(prefix_name_t a, prefix_name_t b)
{
    return a.lo == b.lo && a.hi == b.hi;
}

#endif
