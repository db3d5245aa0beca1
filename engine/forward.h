/* The forward pass: one batch of tokens through the model, written once against the op
 * interface (kernels/ops.h), so every backend runs the same model code.
 *
 * A batch mixes sequences freely: each row is one token at one position of one sequence
 * (a prefill chunk is several rows of one sequence, a decode step one row per sequence).
 * The rows' K/V go into the paged pool before attention reads it, so rows of one sequence
 * in one batch see each other causally. */
#ifndef RIVER_ENGINE_FORWARD_H
#define RIVER_ENGINE_FORWARD_H

#include <stdint.h>

#include "engine/exit.h"
#include "engine/kv_pool.h"
#include "model/model.h"
#include "kernels/ops.h"

typedef struct fwd_batch {
    int n;                            /* rows, at most the forward's max_rows */
    const int32_t *tokens;            /* (n) token ids */
    const int32_t *pos;               /* (n) positions */
    const int32_t *const *page_table; /* (n) each row's sequence page table */
    int n_logits;                     /* rows whose logits are wanted */
    const int32_t *logit_rows;        /* (n_logits) row indices into the batch */
    /* Early exit, all optional (forward_set_exit): */
    const int32_t *group;       /* (n) rows of one group exit together; NULL: one group per
                                   row under EXIT_AGG_ROW, one for the batch under MIN */
    exit_seq_t *const *exit_seq;/* (n) each row's sequence state, for the baselines */
    int32_t *depth;             /* (n) out: backbone layers each row ran before it exited
                                   (n_layers when it never did) */
    const exit_row_t *row_exit; /* (n) per-row thresholds, or NULL: the policy's */
    /* Rows that resume part-way, all optional: lossless verification restarts each drafted
     * position where its draft left the exact backbone (LayerSkip's reuse). A row that
     * starts at layer s > 0 runs layers s..n_layers-1 only; its K/V below s must already
     * be in the pool (its draft wrote them), which is what makes the result bit-identical
     * to running it from layer 0 with the same kernels. */
    const int32_t *start_layer; /* (n) first layer each row runs, 0..n_layers; NULL: 0 */
    const float *start_hidden;  /* (n, dim) host: the residual stream entering
                                   start_layer[r]; read only for rows with a start > 0 */
    const int32_t *save_layer;  /* (n) layer whose input each row's residual stream is
                                   saved at, capped at the row's exit (depth); -1: none */
    float *saved_hidden;        /* (n, dim) host out: the stream entering layer
                                   min(save_layer[r], depth[r]) of rows with save_layer >= 0 */
} fwd_batch_t;

/* Called after every layer with the residual stream of all rows, copied to the host:
 * hidden is (n, dim). Used by tests (per-layer parity) and by exit statistics. */
typedef void (*fwd_layer_hook_t)(void *user, int layer, const float *hidden, int n, int dim);

typedef struct forward forward_t;

/* Scratch for batches of up to max_rows rows on backend `be`. The model and backend must
 * outlive the forward. */
int forward_new(forward_t **out, const model_t *m, backend_t *be, int max_rows);
void forward_destroy(forward_t **f);

int forward_max_rows(const forward_t *f);
const rope_t *forward_rope(const forward_t *f);

/* Runs the batch. logits (n_logits, vocab) in host memory receives the LM-head output of
 * the requested rows. Positions must have pages reserved in every row's page table. On
 * failure the KV slots of this batch's positions hold unspecified values. */
int forward_step(forward_t *f, kv_pool_t *kv, const fwd_batch_t *b, float *logits);

/* Runs layer `layer` alone on host input x_in (n, dim), writing its K/V and its output to
 * x_out (n, dim). Tests use it to check each layer on its own against a reference. */
int forward_layer_host(forward_t *f, kv_pool_t *kv, const fwd_batch_t *b, int layer,
                       const float *x_in, float *x_out);

/* Backbone layers run elsewhere: the split pair's seam (workers/pair.h). When a remote is
 * set, every backbone layer l >= boundary is not computed here: the rows that run it on the
 * backbone are gathered, copied to the host, handed to `run`, and its result is copied back
 * and scattered. River layers, exit decisions, the embedding and the LM heads stay local.
 *
 * run gets layer l, n rows at positions pos[i] of the sequences whose page tables are
 * page_table[i] (entries 0..pos[i]/page_size are valid), and x (n, dim) in host memory: the
 * residual stream entering the layer, to be overwritten with the stream after it. It must
 * write the K/V of (l, pos[i]) into the slots of this forward's KV pool, which is why the
 * pool is shared between the two processes (kv_pool_new_shared). It returns 0 or a river_err
 * code, which fails the step (RIVER_EUNAVAILABLE when the peer is gone).
 *
 * The result is bit-identical to the local layer when the other side runs the same
 * kernels (same backend, same SIMD level, same thread count) on the same rows in the same
 * order, which forward_layer_rows does: gathering, copying and scattering move floats
 * without changing them.
 *
 * The remote protocol carries no validity maps and no K/V-only passes, so the mask and
 * propagate baselines fail with RIVER_EUNSUPPORTED while a remote is set. */
typedef struct fwd_remote {
    void *user;
    int boundary; /* first backbone layer run remotely, 0..n_layers */
    int (*run)(void *user, int layer, int n, const int32_t *pos,
               const int32_t *const *page_table, float *x);
    /* Instead of run (used when set): x is the rows' backend buffer (n, dim), overwritten
     * in place, for remotes that move activations device to device (workers/
     * pair_transport.h); nothing is copied to the host. */
    int (*run_dev)(void *user, int layer, int n, const int32_t *pos,
                   const int32_t *const *page_table, void *x);
} fwd_remote_t;

/* Sets the remote (copied) or turns it off (NULL). RIVER_EINVAL for a boundary outside
 * 0..n_layers or no run function. */
int forward_set_remote(forward_t *f, const fwd_remote_t *r);

/* Runs backbone layer `layer` on n host rows x (n, dim) in place, writing the rows' K/V
 * into kv: what the backbone worker of a split pair does for each request. Positions and
 * page tables as in fwd_batch_t. */
int forward_layer_rows(forward_t *f, kv_pool_t *kv, int layer, int n, const int32_t *pos,
                       const int32_t *const *page_table, float *x);
/* The same on a buffer of this forward's backend (n, dim), in place: the backbone side of a
 * device transport. x must not be one of the forward's own activations. */
int forward_layer_rows_dev(forward_t *f, kv_pool_t *kv, int layer, int n, const int32_t *pos,
                           const int32_t *const *page_table, void *x);

/* Turns early exit on (cfg copied; the river layers and router must outlive the forward)
 * or off (cfg NULL). RIVER_EINVAL when the policy needs a river or router it lacks. */
int forward_set_exit(forward_t *f, const exit_config_t *cfg);

/* Measures the cost model of row splitting: one backbone and one river layer on 1 and on
 * max_rows rows, timed; fills the cost_* fields of cfg. Uses positions 0..max_rows-1 of
 * a scratch sequence in kv. With a remote set, only backbone layers below its boundary
 * are timed (those past it are not this process's). */
int forward_calibrate_costs(forward_t *f, kv_pool_t *kv, exit_config_t *cfg);

/* Seconds per layer of the backbone (river NULL) or of the river (river: (n_layers) layers,
 * those from first on set) over layers first..n_layers-1 on n rows at positions 0..n-1,
 * the measurement behind the cost model: every layer once per pass, as a decode step
 * streams them (a model larger than the caches is timed from memory, not from a cache a
 * repeated layer warms), best of 3 passes. Uses a scratch sequence in kv, given back.
 * RIVER_EINVAL for n outside 1..max_rows, first outside the layers or a missing river
 * layer; otherwise the errors of the ops. */
int forward_time_layers(forward_t *f, kv_pool_t *kv, const layer_weights_t *const *river,
                        int first, int n, double *secs);

typedef struct fwd_stats {
    double step_s;     /* wall time in forward_step */
    double decide_s;   /* of which: exit decisions (similarity, routers, aggregation) */
    double attn_s;     /* of which: the attention op (host time: meaningful on the CPU,
                          where ops complete before they return) */
    int64_t steps;
    int64_t layer_rows_backbone; /* rows x layers run with backbone weights */
    int64_t layer_rows_river;    /* rows x layers run with river weights */
    int64_t splits;              /* layers run as two groups */
} fwd_stats_t;

void forward_get_stats(const forward_t *f, fwd_stats_t *st);
void forward_reset_stats(forward_t *f);

void forward_set_layer_hook(forward_t *f, fwd_layer_hook_t hook, void *user);

/* Fills rope with the model's rotary parameters; inv_freq is malloc'd (caller frees). */
int rope_build(rope_t *rope, const model_config_t *cfg);

#endif
