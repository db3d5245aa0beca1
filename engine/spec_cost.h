/* The cost model of lossless mode (speculative decoding with the exit path as the draft):
 * from the measured time of one draft step and of verify passes of k+1 rows, the expected
 * speed-up over plain decoding at a per-token acceptance rate, and the draft length that
 * maximizes it. */
#ifndef RIVER_ENGINE_SPEC_COST_H
#define RIVER_ENGINE_SPEC_COST_H

#include "engine/exit.h"
#include "engine/exitriver.h"
#include "engine/forward.h"
#include "engine/kv_pool.h"

/* The longest draft the cost model considers (GEN_DRAFT_MAX). */
#define SPEC_K_MAX 16

/* Measured step times of one sequence in lossless mode. */
typedef struct spec_costs {
    int k_max;                      /* entries 1..k_max of t_verify are measured */
    double t_plain;                 /* seconds: a backbone decode step of one row */
    double t_draft;                 /* seconds: a draft step of one row (exit path) */
    double t_verify[SPEC_K_MAX + 1];/* seconds: a verify pass of k+1 rows, at index k */
} spec_costs_t;

/* Ids one verify pass emits on average when each draft token is accepted independently
 * with probability alpha and the draft has k tokens: (1 - alpha^(k+1)) / (1 - alpha). */
double spec_expected_tokens(double alpha, int k);

/* Predicted speed-up of drafting k tokens: expected ids per pass times the plain decode
 * step t_plain, over the pass's cost k * t_draft + t_verify_k (seconds). */
double spec_speedup(double alpha, int k, double t_plain, double t_draft, double t_verify_k);

/* The k in 1..k_max with the highest predicted speed-up; t_verify[k] is the verify pass
 * of k+1 rows (entries 1..k_max are read). *best receives that speed-up when not NULL. */
int spec_pick_k(double alpha, int k_max, double t_plain, double t_draft,
                const double *t_verify, double *best);

/* Bytes of weights one draft step of one row reads when it leaves the backbone after
 * exit_layer layers (at the river's start layer at the earliest) onto river r: the
 * embedding row, the backbone's layers before the exit, the river's layers after it (the
 * codes packed as their dtype packs them, with their scales and zeros:
 * exitriver_layer_bytes), the final norm, and the river's LM head where it has one (else the
 * backbone's). A plain step reads model_bytes_per_token(m); in memory-bound decode the
 * ratio of the two is the least a draft step can cost relative to a plain one. */
int64_t spec_draft_bytes(const model_t *m, const exitriver_t *r, int exit_layer);

/* Times the steps on forward f (over model m): `runs` steps each (median, 1..64), at positions ctx.. of a scratch
 * sequence in kv (pages reserved and given back here), the draft step under exit config
 * `draft`. f needs k_max + 1 rows. Leaves f's exit turned off (the caller sets its own
 * afterwards). On failure *out is unspecified. */
int spec_costs_measure(forward_t *f, const model_t *m, kv_pool_t *kv,
                       const exit_config_t *draft, int k_max, int ctx, int runs,
                       spec_costs_t *out);

#endif
