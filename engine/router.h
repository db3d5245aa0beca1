/* TIDE routers: small MLPs at checkpoint layers that predict whether a token's residual
 * stream has already converged to what the last layer will produce (the TIDE method).
 *
 * A checkpoint sits after every `interval` layers: after layer k for k = interval-1,
 * 2*interval-1, ... below n_layers-1 (the last layer is the full model, so no router sits
 * there). The router of checkpoint k reads h_k, the residual stream after layer k, and gives
 *
 *     p = sigmoid(w_up . silu(W_down . rmsnorm(h_k)))
 *
 * with a learned RMSNorm weight, no biases, and a bottleneck of ROUTER_HIDDEN units. The
 * same normalised input is used in training and in scoring.
 *
 * Calibration runs the frozen model over text, keeps h_k at every checkpoint and the cosine
 * cos(h_k, h_L) to the last layer's output for every token, labels a token converged at k
 * when that cosine exceeds label_tau, and trains each router with BCE and Adam; that is
 * offline work (offline/router_calib.h, offline/router_train.h). A router set is stored as
 * safetensors beside the model, tied to it by model_fingerprint (model/fingerprint.h);
 * loading it for another model fails. */
#ifndef RIVER_ENGINE_ROUTER_H
#define RIVER_ENGINE_ROUTER_H

#include <stddef.h>
#include <stdint.h>

#include "model/model.h"
#include "kernels/ops.h"

#define ROUTER_HIDDEN 128
#define ROUTER_DEFAULT_INTERVAL 4

/* One router's parameters. All three tensors live in one allocation, `params`, in the order
 * norm, w_down, w_up, so that optimiser state and gradients are flat arrays of n_params. */
typedef struct router {
    int layer;       /* the checkpoint: the residual stream after this layer */
    int dim;         /* model hidden size d */
    float eps;       /* RMSNorm epsilon (the model's) */
    int64_t n_params;/* dim + ROUTER_HIDDEN*dim + ROUTER_HIDDEN */
    float *params;   /* (n_params) owned */
    float *norm;     /* (dim) RMSNorm weight, inside params */
    float *w_down;   /* (ROUTER_HIDDEN, dim) inside params */
    float *w_up;     /* (ROUTER_HIDDEN) inside params */
} router_t;

/* Allocates a router with zero parameters; router_release frees it. Training initialises
 * them (offline/router_train.h). */
int router_init(router_t *r, int layer, int dim, float eps);
void router_release(router_t *r);
/* The router math, in one place (a device kernel mirrors this function): the logit
 * z = w_up . silu(W_down . (norm * h / rms(h))). p = sigmoid(z). O(ROUTER_HIDDEN * dim).
 * nrm (dim) and pre (ROUTER_HIDDEN), when not NULL, receive h / rms(h) and W_down . x for
 * backpropagation. Non-finite input gives a non-finite logit. */
float router_logit(const router_t *r, const float *h, float *nrm, float *pre);
float router_sigmoid(float z);
/* log(1 + e^z) without overflow: the BCE of a logit, -log p = softplus(-z). */
float router_softplus(float z);

/* Checkpoint layers for a model of n_layers layers: writes up to cap of them to layers and
 * returns how many there are (0 when interval >= n_layers: no checkpoint below the last
 * layer), or RIVER_EINVAL for interval < 1. */
int router_checkpoints(int n_layers, int interval, int *layers, int cap);

/* ---- Router sets: one router per checkpoint of one model ---------------------------- */

typedef struct router_set router_set_t;

/* A set with every router's parameters zero (norm epsilon eps) for model m: what loading
 * fills, and what offline training initialises. RIVER_EINVAL when the interval leaves no
 * checkpoint. */
int router_set_create(router_set_t **out, const model_t *m, int interval, float label_tau,
                      float eps);
/* Loads routers written by router_set_save. Fails with RIVER_ECONFIG when they were
 * calibrated for another model (dimensions or model_fingerprint differ), RIVER_EFORMAT /
 * RIVER_ETRUNC / RIVER_ESHAPE / RIVER_EDTYPE for a malformed file; the detail names the
 * file and the problem. */
int router_set_load(router_set_t **out, const model_t *m, const char *path);
/* Writes the set as safetensors (tensors router.<layer>.{norm,down,up}.weight, F32; metadata
 * with the interval, label_tau and the model's dimensions and model_fingerprint). */
int router_set_save(const router_set_t *s, const char *path);
void router_set_destroy(router_set_t **s);

int router_set_interval(const router_set_t *s);
float router_set_label_tau(const router_set_t *s);
int router_set_count(const router_set_t *s);
/* The i-th router in layer order (0 <= i < count); NULL out of range. Mutable for training. */
router_t *router_set_at(router_set_t *s, int i);
const router_t *router_set_at_const(const router_set_t *s, int i);
/* Whether a router sits after `layer` (0 for layers outside the model). */
int router_set_is_checkpoint(const router_set_t *s, int layer);

/* The exit probability of one token's residual stream h (dim host floats) after `layer`.
 * 0 when `layer` is no checkpoint (never exit there); NaN for non-finite input, which never
 * passes a `p > theta` test. */
float router_prob(const router_set_t *s, int layer, const float *h);
/* The same for n rows of h (n, dim) into out (n). */
void router_prob_rows(const router_set_t *s, int layer, const float *h, int n, float *out);

/* Places every router of the set on backend be (ops->weight_upload of its three tensors:
 * host backends read the set's own floats, device backends copy them), so that the forward
 * pass scores rows where they are with ops->router_prob. The set's host parameters stay
 * as they are (router_prob above and training read them). Placing again replaces the
 * previous placement; the backend owns device copies until it is destroyed. */
int router_set_place(router_set_t *s, backend_t *be);
/* The placed router after `layer`, or NULL when the set is not placed or no router sits
 * there. */
const router_weights_t *router_set_weights(const router_set_t *s, int layer);

/* The functions above in the callback shape of exit_router_t (engine/exit.h): user is the
 * const router_set_t *. */
int router_set_is_checkpoint_cb(void *user, int layer);
float router_prob_cb(void *user, int layer, const float *h);
const router_weights_t *router_set_weights_cb(void *user, int layer);

/* TIDE's post-hoc exit (the baseline that runs every layer): h_by_layer[l] is one token's
 * residual stream after layer l (NULL allowed for non-checkpoint layers). Returns the
 * earliest checkpoint layer whose router gives p > theta, or -1 when none does (take the
 * full model's logits). Logits at exit layer k come from lm_head(final_norm(h_k)). */
int router_set_first_exit(const router_set_t *s, const float *const *h_by_layer, float theta);
/* The same, considering only checkpoints at or after min_layer (TIDE's k_min). */
int router_set_first_exit_from(const router_set_t *s, const float *const *h_by_layer,
                               float theta, int min_layer);

#endif
