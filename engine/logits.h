/* What happens to one row of logits between the head that computed it and the sampler:
 * the grammar's mask (constrained decoding) and the log-probabilities a request asked for.
 *
 * The generator calls these on whichever head emitted the row (an exit head, the river or
 * the backbone), so a constraint holds on every path, and in lossless mode the backbone
 * verifies against its own masked distribution. */
#ifndef RIVER_ENGINE_LOGITS_H
#define RIVER_ENGINE_LOGITS_H

#include <stddef.h>
#include <stdint.h>

#include "model/model.h"
#include "text/grammar.h"
#include "text/tokenizer.h"

/* Most top_logprobs a request may ask for (OpenAI's limit). */
#define LOGITS_TOP_MAX 20

/* The log-probabilities at one generated position. */
typedef struct logits_logprob {
    int32_t id;        /* the token generated */
    float logprob;     /* its log-softmax */
    int n_top;         /* entries of top_*, 0..LOGITS_TOP_MAX */
    int32_t top_ids[LOGITS_TOP_MAX];    /* most likely first; ties: lower id first */
    float top_logprobs[LOGITS_TOP_MAX];
} logits_logprob_t;

/* The grammar vocabulary of a model's tokenizer: every id's bytes, special tokens left
 * out (a grammar never produces a control token, so a user's schema cannot make the model
 * write one), and the model's end-of-sequence ids as the grammar's stop tokens. On failure
 * *out is NULL and nothing is allocated. */
int logits_vocab_new(grammar_vocab_t **out, const tokenizer_t *tok, const model_config_t *c);

/* The mask of st over a row of vocab logits: ids the grammar does not allow become
 * -INFINITY (the end-of-sequence ids are allowed exactly when the grammar can end there).
 * allowed is scratch of (vocab + 31) / 32 words. Returns the ids left allowed (0: the
 * grammar is stuck, the row is all -INFINITY), or a negative error (the row is then
 * unchanged). */
int logits_mask(grammar_state_t *st, int vocab, uint32_t *allowed, float *row);

/* Fills lp from a row of vocab logits: the log-softmax of id and, with n_top > 0, of the
 * n_top most likely ids. Masked (-INFINITY) ids have logprob -INFINITY and are never in
 * the top list. */
void logits_logprob(const float *row, int vocab, int32_t id, int n_top, logits_logprob_t *lp);

#endif
