/* Prompt-lookup drafts (the n-gram speculation of llama-server and vLLM): a sequence's next
 * ids guessed from its own history, with no model run. Where the last few ids occurred
 * before, in the prompt or in the output, the ids that followed them then are the draft. */
#ifndef RIVER_ENGINE_SPEC_NGRAM_H
#define RIVER_ENGINE_SPEC_NGRAM_H

#include <stddef.h>
#include <stdint.h>

/* The longest suffix the lookup tries to match (gen_spec_t.ngram_max). */
#define SPEC_NGRAM_MAX 8

/* The draft for the ids that follow ids[0..n_ids-1]: the longest suffix of n_max down to
 * n_min ids (1 <= n_min <= n_max <= SPEC_NGRAM_MAX) that also ends earlier in ids, its most
 * recent earlier occurrence; up to lim of the ids that followed that occurrence go to out.
 * Returns their count, 0 when no suffix recurs (or lim <= 0). Reads ids only. */
int spec_ngram_draft(const int32_t *ids, size_t n_ids, int n_min, int n_max, int lim,
                     int32_t *out);

#endif
