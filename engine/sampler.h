/* Token sampling from logits: greedy (ties go to the lowest id), or temperature with
 * optional top-k and top-p (nucleus) filtering, from a seeded generator so a run is
 * reproducible. */
#ifndef RIVER_ENGINE_SAMPLER_H
#define RIVER_ENGINE_SAMPLER_H

#include <stdint.h>

typedef struct sampler_params {
    float temperature; /* <= 0: greedy */
    int top_k;         /* 0: off */
    float top_p;       /* >= 1 or <= 0: off */
    uint64_t seed;
} sampler_params_t;

typedef struct sampler sampler_t;

/* Fails with RIVER_EINVAL naming the bad parameter (negative top_k, NaN temperature...). */
int sampler_new(sampler_t **out, const sampler_params_t *p, int vocab_size);
void sampler_destroy(sampler_t **s);

/* Picks the next id from vocab_size logits (not modified). */
int32_t sampler_sample(sampler_t *s, const float *logits);

/* Advances the random stream past n samples, as if sampler_sample had been called n times
 * (greedy sampling draws nothing): a resumed completion continues the stream it had. */
void sampler_skip(sampler_t *s, uint64_t n);

/* 1 when the sampler is greedy (temperature <= 0). */
int sampler_is_greedy(const sampler_t *s);

/* The distribution sampler_sample draws from, over vocab_size ids, into probs (vocab_size
 * floats summing to 1; zero outside top-k/top-p; greedy: 1 at the argmax). Draws nothing.
 * Speculative sampling compares the draft's and the backbone's distributions with it. */
void sampler_probs(sampler_t *s, const float *logits, float *probs);

/* One number in [0, 1) from the sampler's stream. */
float sampler_uniform(sampler_t *s);

/* Draws an id from vocab_size non-negative weights (need not sum to 1) with one number of
 * the stream; all-zero weights give their argmax. */
int32_t sampler_pick(sampler_t *s, const float *probs);

/* The argmax with ties to the lowest id. */
int32_t sampler_argmax(const float *logits, int n);

#endif
