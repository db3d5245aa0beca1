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

/* The weight bytes one decoded token reads on its path, the memory-bound decode's cost:
 * packed codes plus fp16 scales and zeros for Q4/Q8 weights (model_weight_bytes). */
typedef struct spec_bytes {
    double backbone_layers; /* the backbone layers it ran */
    double river_layers;    /* the river layers it ran after it exited */
    double heads;           /* the embedding row, the final norm and the LM head it used (the
                               river's own head after an exit, where the river has one) */
    double kv;              /* the K and V its attention read: ctx positions of kv_dim f32
                               pairs in every layer it ran, backbone or river */
    double total;
} spec_bytes_t;

/* Bytes of one K and one V value of a pool of element type kv_dtype (kernels/ops.h
 * kv_view_t), Q8's scales spread over the values they scale. */
double spec_kv_elem_bytes(dtype_t kv_dtype);

/* The bytes of a token that leaves the backbone after `exit_layer` layers (0..n_layers)
 * under exit configuration x: with the river strategy it runs the river's layers from there
 * (a layer below the river's start on the backbone) and the river's head where there is
 * one; the baselines but post-hoc skip the remaining layers (recompute's later catch-up is
 * not counted); x NULL, rule none, post-hoc or exit_layer n_layers: the plain backbone.
 * This one function is the bytes model of `river eval` and of the draft step of `bench
 * --spec-costs`: a river of the backbone's own bits reads as many bytes a layer as the
 * backbone, so only a smaller river head makes its path cheaper. ctx is the number of
 * positions the token's attention reads (its own included; 0 leaves the KV out), each of
 * kv_dtype (spec_kv_elem_bytes: the pool's kv.dtype, gen_kv_dtype); under
 * the river strategy every layer runs, so an exit saves no KV bytes. */
void spec_path_bytes(const model_t *m, const exit_config_t *x, int exit_layer, double ctx,
                     dtype_t kv_dtype, spec_bytes_t *out);
/* The mean over tokens counted by exit depth, hist[0..n_layers] (hist[d]: tokens that left
 * after d layers), each reading ctx positions; an empty histogram gives the plain
 * backbone's bytes. A function of its arguments only: the same histogram gives the same
 * bytes. */
void spec_path_bytes_mean(const model_t *m, const exit_config_t *x, const int64_t *hist,
                          double ctx, dtype_t kv_dtype, spec_bytes_t *out);

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

/* Times the steps on forward f (over model m): `runs` steps each (median, 1..64), at positions ctx.. of a scratch
 * sequence in kv (pages reserved and given back here), the draft step under exit config
 * `draft`. f needs k_max + 1 rows. Leaves f's exit turned off (the caller sets its own
 * afterwards). On failure *out is unspecified. */
int spec_costs_measure(forward_t *f, const model_t *m, kv_pool_t *kv,
                       const exit_config_t *draft, int k_max, int ctx, int runs,
                       spec_costs_t *out);

#endif
