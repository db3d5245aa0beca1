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

/* The argmax with ties to the lowest id. */
int32_t sampler_argmax(const float *logits, int n);

#endif
