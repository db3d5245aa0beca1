/* The hash chain that names a run of KV pages by the token ids they hold, shared by the
 * worker's prefix cache (engine/prefix_cache.h) and riverd's prefix-aware placement
 * (daemon/dispatch.c), which must compute the same value from a request's token ids.
 *
 * Page i of a sequence (positions i*page_size .. (i+1)*page_size - 1) is named
 *     h_0 = seed, h_(i+1) = prefix_hash_page(h_i, ids of page i, page_size)
 * so a name covers the page's tokens and every token before it. The seed carries what
 * makes the same ids give other K/V: the model and Exit River fingerprints
 * (prefix_hash_seed). */
#ifndef RIVER_COMMON_PREFIX_HASH_H
#define RIVER_COMMON_PREFIX_HASH_H

#include <stddef.h>
#include <stdint.h>

/* The seed of a worker's chains: the model's fingerprint text and the river's (NULL or ""
 * without a river), hashed; never 0. */
uint64_t prefix_hash_seed(const char *model_fingerprint, const char *river_fingerprint);

/* The name of a page of n ids that follows a page named parent (the seed for page 0). */
uint64_t prefix_hash_page(uint64_t parent, const int32_t *ids, size_t n);

/* Names the first min(max_pages, n_ids / page_size) full pages of ids into out; returns
 * how many it wrote. */
size_t prefix_hash_chain(uint64_t seed, const int32_t *ids, size_t n_ids, int page_size,
                         uint64_t *out, size_t max_pages);

#endif
