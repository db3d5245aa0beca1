/* TIDE router calibration data: the hidden states of calibration text at every checkpoint,
 * collected by running the frozen model forward, and their cosine to the last layer's
 * output, from which offline/router_train.h labels and trains the routers
 * (engine/router.h). */
#ifndef RIVER_OFFLINE_ROUTER_CALIB_H
#define RIVER_OFFLINE_ROUTER_CALIB_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/ops.h"
#include "model/model.h"
#include "text/tokenizer.h"

/* Hidden states of calibration text at every checkpoint and their cosine to the last
 * layer's output, one sample per text token (BOS rows are left out: every window's BOS is
 * the same token at the same position, so it would only repeat one sample). */
typedef struct router_calib {
    int dim;
    int n_ckpt;
    int *layers;     /* (n_ckpt) checkpoint layers, owned */
    int64_t n;       /* samples collected */
    int64_t cap;     /* samples allocated */
    float *h;        /* (n_ckpt, cap, dim) h_k of each sample */
    float *cos;      /* (n_ckpt, cap) cos(h_k, h_L) of each sample */
    int64_t n_docs;  /* documents read */
    int64_t n_windows; /* forward windows run */
} router_calib_t;

typedef struct router_calib_opts {
    int interval;       /* checkpoint interval (>= 1) */
    int64_t max_tokens; /* stop after this many samples (0: no limit) */
    int window;         /* positions per window including BOS (0: min(context, 1024)) */
    int kv_dtype;       /* kv.dtype of the KV pool, a gen_kv_dtype_t (0: auto) */
} router_calib_opts_t;

/* Tokenises `text` (documents separated by blank lines, each encoded on its own), runs the
 * frozen model over windows of up to `window` positions that each start with BOS, and
 * collects the samples. RIVER_EINVAL when the text has no tokens or the interval leaves no
 * checkpoint. */
int router_calib_collect(router_calib_t **out, const model_t *m, const tokenizer_t *tok,
                         backend_t *be, const char *text, size_t len,
                         const router_calib_opts_t *o);
void router_calib_destroy(router_calib_t **c);

/* Quantiles (q in [0,1]) of checkpoint i's cosines; i = -1 pools every checkpoint. NaN when
 * there is nothing to rank. */
float router_calib_cos_quantile(const router_calib_t *c, int i, double q);
/* Fraction of checkpoint i's samples with cos > tau. */
double router_calib_pos_frac(const router_calib_t *c, int i, float tau);
/* A label tau that makes the task meaningful on any model: the median cosine over every
 * checkpoint and token, so that half of all (token, checkpoint) pairs count as converged
 * (early checkpoints mostly not, late ones mostly so). TIDE's fixed 0.98 leaves every label
 * 0 on small models, whose intermediate states stay far from the last one. */
float router_calib_auto_tau(const router_calib_t *c);

#endif
