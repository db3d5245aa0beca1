/* The cost model of lossless mode (speculative decoding with the exit path as the draft):
 * from the measured time of one draft step and of verify passes of k+1 rows, the expected
 * speed-up over plain decoding at a per-token acceptance rate, and the draft length that
 * maximizes it. */
#ifndef RIVER_ENGINE_SPEC_COST_H
#define RIVER_ENGINE_SPEC_COST_H

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

#endif
