/* Backbone offloading: the deep backbone layers that almost no token reaches are released
 * from memory while the river stays resident.
 *
 * An exit-depth histogram says, for every layer, which fraction of tokens still ran it on
 * the backbone. A layer reached by fewer than `threshold` of the tokens is evicted: on the
 * CPU its weights' mapped pages are released (madvise MADV_DONTNEED on the read-only file
 * mapping, so nothing is lost: the pages come back from the file). When a token does need
 * an evicted layer, offload_touch brings it back (MADV_WILLNEED) and counts the reload. */
#ifndef RIVER_ENGINE_OFFLOAD_H
#define RIVER_ENGINE_OFFLOAD_H

#include <stdint.h>

#include "model/model.h"

typedef struct offload offload_t;

/* threshold: a layer reached by fewer than this fraction of tokens is evicted (0 < t < 1).
 * min_tokens: no decision before this many tokens were recorded. */
int offload_new(offload_t **out, const model_t *m, double threshold, int64_t min_tokens);
void offload_destroy(offload_t **o);

/* Records one token that ran `depth` backbone layers. */
void offload_record(offload_t *o, int depth);
/* Evicts the layers now below the threshold; *n_evicted (may be NULL) receives how many
 * were released by this call. */
int offload_update(offload_t *o, int *n_evicted);
/* A token is about to run backbone layer l: makes it resident again if it was evicted. */
void offload_touch(offload_t *o, int layer);

int offload_is_evicted(const offload_t *o, int layer);
/* Fraction of recorded tokens that ran backbone layer l. */
double offload_reach(const offload_t *o, int layer);
int64_t offload_reloads(const offload_t *o);
/* Bytes of backbone weights currently released. */
int64_t offload_evicted_bytes(const offload_t *o);

/* The process's resident memory in bytes (from /proc/self/statm), or a negative river_err
 * code. */
int64_t offload_rss_bytes(void);

#endif
