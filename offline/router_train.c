/* Router initialisation and training (router_train.h). */
#include "offline/router_train.h"

#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/rng.h"
#include "engine/router_vec.h"

/* ---- Random numbers ------------------------------------------------------------------- */

/* Uniform in [0, 1) with 24 bits, exact in a float. The bits come from splitmix64
 * (common/rng.h), whose sequence is the same on every platform, which keeps calibration
 * reproducible from its seed. */
static float router_train__rng_unit(uint64_t *s)
{
    return (float)(rng_next(s) >> 40) * (1.0f / 16777216.0f);
}

/* Uniform in [0, n) without modulo bias worth worrying about for n far below 2^64. */
static int64_t router_train__rng_below(uint64_t *s, int64_t n)
{
    return (int64_t)(rng_next(s) % (uint64_t)n);
}

static void router_train__shuffle(int64_t *a, int64_t n, uint64_t *s)
{
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = router_train__rng_below(s, i + 1);
        int64_t t = a[i];
        a[i] = a[j];
        a[j] = t;
    }
}

/* ---- Initialisation ------------------------------------------------------------------ */

void router_init_params(router_t *r, uint64_t seed)
{
    uint64_t s = seed;
    float bd = 1.0f / sqrtf((float)r->dim);
    float bu = 1.0f / sqrtf((float)ROUTER_HIDDEN);
    for (int i = 0; i < r->dim; i++)
        r->norm[i] = 1.0f;
    for (size_t i = 0; i < (size_t)ROUTER_HIDDEN * (size_t)r->dim; i++)
        r->w_down[i] = (2.0f * router_train__rng_unit(&s) - 1.0f) * bd;
    for (int j = 0; j < ROUTER_HIDDEN; j++)
        r->w_up[j] = (2.0f * router_train__rng_unit(&s) - 1.0f) * bu;
}

int router_set_new(router_set_t **out, const model_t *m, int interval, float label_tau,
                   uint64_t seed)
{
    router_set_t *s;
    int e = router_set_create(&s, m, interval, label_tau, m->cfg.norm_eps);
    if (e)
        return e;
    for (int i = 0; i < router_set_count(s); i++)
        router_init_params(router_set_at(s, i), seed + (uint64_t)i);
    *out = s;
    return 0;
}

/* ---- The loss and its gradient ------------------------------------------------------- */

size_t router_scratch_floats(const router_t *r)
{
    return 3 * (size_t)r->dim + ROUTER_HIDDEN;
}

ROUTER_CLONES
float router_loss_grad(const router_t *r, const float *h, float y, float w_pos, float *grad,
                       float *scratch)
{
    int d = r->dim;
    float *nrm = scratch;       /* (d) h / rms(h) */
    float *x = nrm + d;         /* (d) norm * h / rms(h): the input of W_down */
    float *dx = x + d;          /* (d) dL/dx */
    float *pre = dx + d;        /* (ROUTER_HIDDEN) W_down . x */
    float z = router_logit(r, h, nrm, pre);
    float p = router_sigmoid(z);
    /* -log p = softplus(-z), -log(1-p) = softplus(z); their z-derivatives are p-1 and p. */
    float loss = w_pos * y * router_softplus(-z) + (1.0f - y) * router_softplus(z);
    float dz = w_pos * y * (p - 1.0f) + (1.0f - y) * p;
    float *g_norm = grad;
    float *g_down = grad + d;
    float *g_up = g_down + (size_t)ROUTER_HIDDEN * (size_t)d;
    for (int i = 0; i < d; i++) {
        x[i] = r->norm[i] * nrm[i];
        dx[i] = 0;
    }
    for (int j = 0; j < ROUTER_HIDDEN; j++) {
        float a = pre[j];
        float s = router_sigmoid(a);
        g_up[j] += dz * a * s;
        /* silu'(a) = s * (1 + a * (1 - s)) */
        float da = dz * r->w_up[j] * s * (1.0f + a * (1.0f - s));
        if (da == 0.0f)
            continue;
        router__axpy(g_down + (size_t)j * (size_t)d, da, x, d);
        router__axpy(dx, da, r->w_down + (size_t)j * (size_t)d, d);
    }
    /* x_i = norm_i * nrm_i, so dL/dnorm_i = dx_i * nrm_i. The input h is data, so the
     * gradient stops here. */
    for (int i = 0; i < d; i++)
        g_norm[i] += dx[i] * nrm[i];
    return loss;
}

/* ---- Training ------------------------------------------------------------------------ */

router_train_opts_t router_train_defaults(void)
{
    return (router_train_opts_t){.epochs = 100, .batch = 64, .lr = 1e-3f, .beta1 = 0.9f,
                                 .beta2 = 0.999f, .adam_eps = 1e-8f, .pos_weight = 1.0f,
                                 .holdout = 0.1f, .seed = 1, .n_threads = 1};
}

void router_train_report_free(router_train_report_t *rep)
{
    free(rep->loss_curve);
    rep->loss_curve = NULL;
}

int router_train(router_t *r, const float *h, const uint8_t *y, int64_t n,
                 const router_train_opts_t *o, router_train_report_t *rep)
{
    if (n < 2 || o->epochs < 1 || o->batch < 1 || !(o->holdout >= 0 && o->holdout < 1) ||
        !(o->lr > 0))
        return river_err_set(RIVER_EINVAL, "router: training on %" PRId64 " samples, %d "
                             "epochs, batch %d, holdout %g", n, o->epochs, o->batch,
                             (double)o->holdout);
    size_t d = (size_t)r->dim;
    size_t np = (size_t)r->n_params;
    int e = 0;
    int64_t *perm = malloc(sizeof *perm * (size_t)n);
    float *grad = malloc(sizeof *grad * np);
    float *mom = calloc(np, sizeof *mom);
    float *vel = calloc(np, sizeof *vel);
    float *scratch = malloc(sizeof *scratch * router_scratch_floats(r));
    float *curve = malloc(sizeof *curve * (size_t)o->epochs);
    if (!perm || !grad || !mom || !vel || !scratch || !curve) {
        e = river_err_set(RIVER_ENOMEM, "router: training state");
        goto done;
    }
    uint64_t rng = o->seed ^ 0x5eed5eed5eed5eedULL;
    router_init_params(r, o->seed);
    for (int64_t i = 0; i < n; i++)
        perm[i] = i;
    router_train__shuffle(perm, n, &rng);
    int64_t n_held = (int64_t)((double)n * o->holdout + 0.5);
    if (o->holdout > 0 && n_held < 1)
        n_held = 1;
    if (n_held > n - 1)
        n_held = n - 1;
    int64_t *held = perm, *train = perm + n_held;
    int64_t n_train = n - n_held;

    int64_t pos_train = 0, pos_all = 0;
    for (int64_t i = 0; i < n_train; i++)
        pos_train += y[train[i]] != 0;
    for (int64_t i = 0; i < n; i++)
        pos_all += y[i] != 0;
    float w_pos = o->pos_weight;
    if (!(w_pos > 0))
        w_pos = pos_train > 0 && pos_train < n_train ?
                    (float)(n_train - pos_train) / (float)pos_train : 1.0f;

    int64_t step = 0;
    for (int ep = 0; ep < o->epochs; ep++) {
        router_train__shuffle(train, n_train, &rng);
        double ep_loss = 0;
        for (int64_t b0 = 0; b0 < n_train; b0 += o->batch) {
            int64_t bn = n_train - b0 < o->batch ? n_train - b0 : o->batch;
            memset(grad, 0, sizeof *grad * np);
            for (int64_t k = 0; k < bn; k++) {
                int64_t i = train[b0 + k];
                ep_loss += router_loss_grad(r, h + (size_t)i * d, y[i] ? 1.0f : 0.0f, w_pos,
                                            grad, scratch);
            }
            /* Adam on the batch-mean gradient, with bias correction. */
            step++;
            float inv_bn = 1.0f / (float)bn;
            float c1 = 1.0f - powf(o->beta1, (float)step);
            float c2 = 1.0f - powf(o->beta2, (float)step);
            float lr_t = o->lr * sqrtf(c2) / c1;
            float eps_t = o->adam_eps * sqrtf(c2);
            for (size_t p = 0; p < np; p++) {
                float g = grad[p] * inv_bn;
                mom[p] = o->beta1 * mom[p] + (1.0f - o->beta1) * g;
                vel[p] = o->beta2 * vel[p] + (1.0f - o->beta2) * g * g;
                r->params[p] -= lr_t * mom[p] / (sqrtf(vel[p]) + eps_t);
            }
        }
        curve[ep] = (float)(ep_loss / (double)n_train);
        if (!isfinite(curve[ep])) {
            e = river_err_set(RIVER_ERANGE, "router: layer %d: training loss became %g in "
                              "epoch %d", r->layer, (double)curve[ep], ep + 1);
            goto done;
        }
    }

    if (rep) {
        memset(rep, 0, sizeof *rep);
        rep->layer = r->layer;
        rep->n_samples = n;
        rep->n_train = n_train;
        rep->n_held = n_held;
        rep->pos_frac = (double)pos_all / (double)n;
        rep->pos_weight = w_pos;
        rep->epochs = o->epochs;
        rep->loss_first = curve[0];
        rep->loss_last = curve[o->epochs - 1];
        int majority = pos_train * 2 > n_train;
        int64_t maj_ok = 0, ok = 0, tp = 0, fp = 0, fn = 0;
        double hl = 0;
        for (int64_t k = 0; k < n_held; k++) {
            int64_t i = held[k];
            int yi = y[i] != 0;
            float z = router_logit(r, h + (size_t)i * d, NULL, NULL);
            int pred = router_sigmoid(z) > 0.5f;
            hl += yi ? w_pos * router_softplus(-z) : router_softplus(z);
            maj_ok += yi == majority;
            ok += pred == yi;
            tp += pred && yi;
            fp += pred && !yi;
            fn += !pred && yi;
        }
        rep->majority_acc = n_held ? (double)maj_ok / (double)n_held : NAN;
        rep->held_acc = n_held ? (double)ok / (double)n_held : NAN;
        rep->held_loss = n_held ? hl / (double)n_held : NAN;
        rep->held_precision = tp + fp ? (double)tp / (double)(tp + fp) : NAN;
        rep->held_recall = tp + fn ? (double)tp / (double)(tp + fn) : NAN;
        int64_t tok = 0;
        for (int64_t k = 0; k < n_train; k++) {
            int64_t i = train[k];
            int pred = router_sigmoid(router_logit(r, h + (size_t)i * d, NULL, NULL)) > 0.5f;
            tok += pred == (y[i] != 0);
        }
        rep->train_acc = (double)tok / (double)n_train;
        rep->loss_curve = curve;
        curve = NULL;
    }

done:
    free(perm);
    free(grad);
    free(mom);
    free(vel);
    free(scratch);
    free(curve);
    return e;
}

/* Work shared by the training threads: routers are handed out one at a time. */
typedef struct train_pool {
    router_set_t *s;
    const router_calib_t *c;
    const router_train_opts_t *o;
    router_train_report_t *reps;
    uint8_t **labels;      /* (n_ckpt) each (c->n) */
    pthread_mutex_t lock;
    int next;
    int err;               /* first failure */
    char detail[512];      /* its river_err_detail, copied from the failing thread */
} train_pool_t;

static void *router_train__worker(void *arg)
{
    train_pool_t *tp = arg;
    for (;;) {
        pthread_mutex_lock(&tp->lock);
        int i = tp->err ? router_set_count(tp->s) : tp->next++;
        pthread_mutex_unlock(&tp->lock);
        if (i >= router_set_count(tp->s))
            break;
        router_train_opts_t o = *tp->o;
        o.seed = tp->o->seed + (uint64_t)i;
        const float *h = tp->c->h + (size_t)i * (size_t)tp->c->cap * (size_t)tp->c->dim;
        router_train_report_t *rep = tp->reps ? &tp->reps[i] : NULL;
        int e = router_train(router_set_at(tp->s, i), h, tp->labels[i], tp->c->n, &o, rep);
        if (e) {
            pthread_mutex_lock(&tp->lock);
            if (!tp->err) {
                tp->err = e;
                snprintf(tp->detail, sizeof tp->detail, "%s", river_err_detail());
            }
            pthread_mutex_unlock(&tp->lock);
        }
    }
    return NULL;
}

int router_set_train(router_set_t *s, const router_calib_t *c, const router_train_opts_t *o,
                     router_train_report_t *reps)
{
    int n = router_set_count(s), dim = router_set_at(s, 0)->dim;
    if (c->n_ckpt != n || c->dim != dim)
        return river_err_set(RIVER_EINVAL, "router: calibration data has %d checkpoints of "
                             "dim %d, the set %d of dim %d", c->n_ckpt, c->dim, n, dim);
    for (int i = 0; i < n; i++)
        if (c->layers[i] != router_set_at(s, i)->layer)
            return river_err_set(RIVER_EINVAL, "router: calibration checkpoint %d is layer "
                                 "%d, the set's is %d", i, c->layers[i],
                                 router_set_at(s, i)->layer);
    if (reps)
        memset(reps, 0, sizeof *reps * (size_t)n);
    train_pool_t tp = {.s = s, .c = c, .o = o, .reps = reps};
    int e = 0;
    tp.labels = calloc((size_t)n, sizeof *tp.labels);
    if (!tp.labels)
        return river_err_set(RIVER_ENOMEM, "router: labels");
    for (int i = 0; i < n && !e; i++) {
        tp.labels[i] = malloc((size_t)(c->n > 0 ? c->n : 1));
        if (!tp.labels[i]) {
            e = river_err_set(RIVER_ENOMEM, "router: labels");
            break;
        }
        const float *cs = c->cos + (size_t)i * (size_t)c->cap;
        for (int64_t k = 0; k < c->n; k++)
            tp.labels[i][k] = cs[k] > router_set_label_tau(s);
    }
    if (e)
        goto done;
    if ((e = pthread_mutex_init(&tp.lock, NULL))) {
        e = river_err_set(RIVER_ESYS, "router: pthread_mutex_init: %s", strerror(e));
        goto done;
    }
    int nt = o->n_threads < 1 ? 1 : o->n_threads > n ? n : o->n_threads;
    pthread_t th[64];
    if (nt > 64)
        nt = 64;
    int started = 0;
    /* The calling thread trains too, so one thread needs no pthread_create at all. */
    for (; started < nt - 1; started++) {
        int pe = pthread_create(&th[started], NULL, router_train__worker, &tp);
        if (pe)
            break; /* fewer helpers just means slower training */
    }
    router_train__worker(&tp);
    for (int i = 0; i < started; i++)
        pthread_join(th[i], NULL);
    pthread_mutex_destroy(&tp.lock);
    if (tp.err)
        e = river_err_set(tp.err, "%s", tp.detail);

done:
    for (int i = 0; i < n; i++)
        free(tp.labels[i]);
    free(tp.labels);
    if (e && reps)
        for (int i = 0; i < n; i++)
            router_train_report_free(&reps[i]);
    return e;
}
