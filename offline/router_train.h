/* Training TIDE routers (engine/router.h) offline: their seeded initialisation, a fresh set
 * for a model, and BCE + Adam training of one router or of a whole set on calibration
 * samples (offline/router_calib.h), one router per thread. */
#ifndef RIVER_OFFLINE_ROUTER_TRAIN_H
#define RIVER_OFFLINE_ROUTER_TRAIN_H

#include <stdint.h>

#include "engine/router.h"
#include "model/model.h"
#include "offline/router_calib.h"

/* Norm weight 1, W_down and w_up uniform in +-1/sqrt(fan_in) (PyTorch's Linear default),
 * drawn from a generator seeded with `seed`. */
void router_init_params(router_t *r, uint64_t seed);

/* Floats of scratch router_loss_grad needs: 3*dim + ROUTER_HIDDEN. */
size_t router_scratch_floats(const router_t *r);
/* Weighted BCE of one sample on the logit: -(w_pos*y*log p + (1-y)*log(1-p)). Adds the
 * gradient of that loss with respect to every parameter to grad (n_params floats, the same
 * layout as r->params) and returns the loss. */
float router_loss_grad(const router_t *r, const float *h, float y, float w_pos, float *grad,
                       float *scratch);

/* A set of freshly initialised routers (router i seeded seed + i, the model's norm epsilon)
 * for model m. RIVER_EINVAL when the interval leaves no checkpoint. */
int router_set_new(router_set_t **out, const model_t *m, int interval, float label_tau,
                   uint64_t seed);

typedef struct router_train_opts {
    int epochs;        /* 100 */
    int batch;         /* samples per Adam step, 64 */
    float lr;          /* 1e-3 */
    float beta1, beta2, adam_eps; /* 0.9, 0.999, 1e-8 */
    float pos_weight;  /* weight of positive samples in the loss; 1 plain BCE, 0 balanced
                          (n_neg / n_pos of the training split) */
    float holdout;     /* fraction of samples held out, 0.1 */
    uint64_t seed;     /* shuffles and initialisation */
    int n_threads;     /* routers trained at once (each router is trained by one thread, so
                          the result does not depend on this) */
} router_train_opts_t;

/* The defaults above. */
router_train_opts_t router_train_defaults(void);

typedef struct router_train_report {
    int layer;
    int64_t n_samples, n_train, n_held;
    double pos_frac;       /* positive fraction over all samples (label balance) */
    double pos_weight;     /* the positive weight used */
    double majority_acc;   /* held-out accuracy of always answering the training majority */
    double held_acc;       /* held-out accuracy at p > 0.5 */
    double held_precision; /* of held-out samples with p > 0.5, the fraction truly positive
                              (a false exit is the costly error); NaN when none */
    double held_recall;    /* of truly positive held-out samples, the fraction found; NaN
                              when none */
    double held_loss;      /* mean weighted BCE on the held-out split after training */
    double train_acc;      /* training accuracy after training */
    double loss_first;     /* mean weighted training BCE over the first epoch */
    double loss_last;      /* ... over the last epoch */
    float *loss_curve;     /* (epochs) mean training loss per epoch, malloc'd; free it */
    int epochs;
} router_train_report_t;

/* Trains one router on n samples h (n, dim) with labels y (n, 0 or 1): initialises it from
 * o->seed, splits 90/10 by a seeded shuffle, runs Adam on mini-batches for o->epochs and
 * fills rep (may be NULL). Deterministic for a given seed. */
int router_train(router_t *r, const float *h, const uint8_t *y, int64_t n,
                 const router_train_opts_t *o, router_train_report_t *rep);

/* Labels the calibration samples with cos > the set's label_tau and trains every router of
 * the set (router i on checkpoint i of c, seeded o->seed + i), o->n_threads at a time.
 * reps receives router_set_count entries (may be NULL). */
int router_set_train(router_set_t *s, const router_calib_t *c, const router_train_opts_t *o,
                     router_train_report_t *reps);

void router_train_report_free(router_train_report_t *rep);

#endif
