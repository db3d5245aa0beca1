/* river eval --lossless: each prompt generated greedily by the plain backbone and by
 * lossless mode (exit path drafts, backbone verifies), compared id for id and timed. */
#ifndef RIVER_CLI_EVAL_LOSSLESS_H
#define RIVER_CLI_EVAL_LOSSLESS_H

#include <stddef.h>
#include <stdint.h>

#include "cli/cli.h"
#include "cli/exit_opts.h"
#include "engine/exit_setup.h"

typedef struct eval_ll_prompt {
    const int32_t *ids; /* (n_ids) prompt with BOS */
    size_t n_ids;
} eval_ll_prompt_t;

/* Prints one line (json: one object) per value of sweep (or the policy's own value when
 * n_sweep is 0): acceptance_rate, mean_accepted, identical, the same per draft source,
 * tok_s and backbone_tok_s (medians of `repeat` alternating rounds, cli_repeats), speedup
 * (the median of the rounds' ratios), the bytes ideal under a fixed exit, and the measured
 * draft-step and verify-step times. Returns 0 or a river_err code. */
int eval_lossless(cli_env_t *env, const exit_setup_t *xc, const exit_opts_t *xo,
                  const eval_ll_prompt_t *ps, int n_ps, int max_tokens, const double *sweep,
                  int n_sweep, int repeat, int json);

#endif
