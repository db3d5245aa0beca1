/* TIDE routers at run time (router.h): the router math, router sets, their file format,
 * and scoring on the host or placed on a backend. Calibration and training are offline work
 * (offline/router_calib.c, offline/router_train.c). */
#include "engine/router.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "engine/router_vec.h"
#include "model/fingerprint.h"
#include "model/safetensors.h"

#define ROUTER_FORMAT "river-router"
#define ROUTER_VERSION "1"

/* ---- One router ----------------------------------------------------------------------- */

int router_init(router_t *r, int layer, int dim, float eps)
{
    memset(r, 0, sizeof *r);
    if (dim <= 0 || layer < 0)
        return river_err_set(RIVER_EINVAL, "router: layer %d, dim %d", layer, dim);
    r->layer = layer;
    r->dim = dim;
    r->eps = eps;
    r->n_params = (int64_t)dim + (int64_t)ROUTER_HIDDEN * dim + ROUTER_HIDDEN;
    r->params = calloc((size_t)r->n_params, sizeof *r->params);
    if (!r->params)
        return river_err_set(RIVER_ENOMEM, "router: %" PRId64 " parameters", r->n_params);
    r->norm = r->params;
    r->w_down = r->norm + dim;
    r->w_up = r->w_down + (size_t)ROUTER_HIDDEN * (size_t)dim;
    return 0;
}

void router_release(router_t *r)
{
    free(r->params);
    memset(r, 0, sizeof *r);
}

float router_sigmoid(float z)
{
    /* Both branches avoid exp overflow for large |z|. */
    if (z >= 0)
        return 1.0f / (1.0f + expf(-z));
    float e = expf(z);
    return e / (1.0f + e);
}

float router_softplus(float z)
{
    return fmaxf(z, 0.0f) + log1pf(expf(-fabsf(z)));
}

ROUTER_CLONES
float router_logit(const router_t *r, const float *h, float *nrm, float *pre)
{
    int d = r->dim;
    double ss = 0;
    for (int i = 0; i < d; i++)
        ss += (double)h[i] * (double)h[i];
    float inv = (float)(1.0 / sqrt(ss / d + (double)r->eps));
    if (nrm)
        for (int i = 0; i < d; i++)
            nrm[i] = h[i] * inv;
    /* a_j = W_down[j] . (norm * h) * inv: scaling after the dot product needs no buffer,
     * which keeps scoring allocation-free. */
    float z = 0;
    for (int j = 0; j < ROUTER_HIDDEN; j++) {
        float a = router__dot3(r->w_down + (size_t)j * (size_t)d, r->norm, h, d) * inv;
        if (pre)
            pre[j] = a;
        z += r->w_up[j] * (a * router_sigmoid(a));
    }
    return z;
}

int router_checkpoints(int n_layers, int interval, int *layers, int cap)
{
    if (interval < 1)
        return river_err_set(RIVER_EINVAL, "router: checkpoint interval %d (must be >= 1)",
                             interval);
    int n = 0;
    for (int k = interval - 1; k < n_layers - 1; k += interval) {
        if (n < cap)
            layers[n] = k;
        n++;
    }
    return n;
}

/* ---- Router sets ---------------------------------------------------------------------- */

struct router_set {
    int interval;
    float label_tau;
    int n_layers;
    int dim;
    model_config_t cfg;  /* dimensions of the model the routers belong to (no owned ptrs) */
    char fingerprint[MODEL_FINGERPRINT_LEN]; /* model_fingerprint of that model */
    int n;               /* routers */
    router_t *routers;   /* (n) in layer order */
    int *slot;           /* (n_layers) router index of each layer, -1 where none */
    router_weights_t *placed; /* (n) the routers as ops->router_prob reads them, once
                                 router_set_place ran; NULL before */
};

/* An empty set (no routers allocated yet) bound to model m. */
static int router__set_alloc(router_set_t **out, const model_t *m, int interval,
                             float label_tau)
{
    const model_config_t *c = &m->cfg;
    int n = router_checkpoints(c->n_layers, interval, NULL, 0);
    if (n < 0)
        return n;
    if (n == 0)
        return river_err_set(RIVER_EINVAL, "router: interval %d leaves no checkpoint below "
                             "the last of %d layers", interval, c->n_layers);
    char fp[MODEL_FINGERPRINT_LEN];
    int e = model_fingerprint(m, fp);
    if (e)
        return e;
    router_set_t *s = calloc(1, sizeof *s);
    if (!s)
        goto fail_set;
    s->interval = interval;
    s->label_tau = label_tau;
    s->n_layers = c->n_layers;
    s->dim = c->dim;
    s->cfg = *c;
    s->cfg.rope_short_factor = NULL;
    s->cfg.rope_long_factor = NULL;
    memcpy(s->fingerprint, fp, sizeof fp);
    s->n = n;
    s->routers = calloc((size_t)n, sizeof *s->routers);
    if (!s->routers)
        goto fail_routers;
    s->slot = malloc(sizeof *s->slot * (size_t)c->n_layers);
    if (!s->slot)
        goto fail_slot;
    for (int l = 0; l < c->n_layers; l++)
        s->slot[l] = -1;
    *out = s;
    return 0;

fail_slot:
    free(s->routers);
fail_routers:
    free(s);
fail_set:
    return river_err_set(RIVER_ENOMEM, "router: set of %d routers", n);
}

/* Allocates every router of s with the given epsilon and fills the layer -> slot map. */
static int router__set_alloc_routers(router_set_t *s, float eps)
{
    int *layers = malloc(sizeof *layers * (size_t)s->n);
    if (!layers)
        return river_err_set(RIVER_ENOMEM, "router: checkpoint list");
    router_checkpoints(s->n_layers, s->interval, layers, s->n);
    int e = 0;
    for (int i = 0; i < s->n && !e; i++) {
        e = router_init(&s->routers[i], layers[i], s->dim, eps);
        if (!e)
            s->slot[layers[i]] = i;
    }
    free(layers);
    return e;
}

int router_set_create(router_set_t **out, const model_t *m, int interval, float label_tau,
                      float eps)
{
    router_set_t *s = NULL;
    int e = router__set_alloc(&s, m, interval, label_tau);
    if (e)
        return e;
    e = router__set_alloc_routers(s, eps);
    if (e) {
        router_set_destroy(&s);
        return e;
    }
    *out = s;
    return 0;
}

void router_set_destroy(router_set_t **sp)
{
    router_set_t *s = *sp;
    if (!s)
        return;
    if (s->routers)
        for (int i = 0; i < s->n; i++)
            router_release(&s->routers[i]);
    free(s->routers);
    free(s->slot);
    free(s->placed);
    free(s);
    *sp = NULL;
}

int router_set_interval(const router_set_t *s) { return s->interval; }
float router_set_label_tau(const router_set_t *s) { return s->label_tau; }
int router_set_count(const router_set_t *s) { return s->n; }

router_t *router_set_at(router_set_t *s, int i)
{
    return i >= 0 && i < s->n ? &s->routers[i] : NULL;
}

const router_t *router_set_at_const(const router_set_t *s, int i)
{
    return i >= 0 && i < s->n ? &s->routers[i] : NULL;
}

int router_set_is_checkpoint(const router_set_t *s, int layer)
{
    return layer >= 0 && layer < s->n_layers && s->slot[layer] >= 0;
}

float router_prob(const router_set_t *s, int layer, const float *h)
{
    if (!router_set_is_checkpoint(s, layer))
        return 0.0f;
    return router_sigmoid(router_logit(&s->routers[s->slot[layer]], h, NULL, NULL));
}

void router_prob_rows(const router_set_t *s, int layer, const float *h, int n, float *out)
{
    for (int i = 0; i < n; i++)
        out[i] = router_prob(s, layer, h + (size_t)i * (size_t)s->dim);
}

int router_set_place(router_set_t *s, backend_t *be)
{
    router_weights_t *pw = calloc((size_t)s->n, sizeof *pw);
    if (!pw)
        return river_err_set(RIVER_ENOMEM, "routers: %d placed routers", s->n);
    for (int i = 0; i < s->n; i++) {
        const router_t *r = &s->routers[i];
        router_weights_t *w = &pw[i];
        w->norm = (weight_t){.dtype = DTYPE_F32, .rows = 1, .cols = r->dim, .data = r->norm};
        w->down = (weight_t){.dtype = DTYPE_F32, .rows = ROUTER_HIDDEN, .cols = r->dim,
                             .data = r->w_down};
        w->up = (weight_t){.dtype = DTYPE_F32, .rows = 1, .cols = ROUTER_HIDDEN,
                           .data = r->w_up};
        w->eps = r->eps;
        weight_t *t[3] = {&w->norm, &w->down, &w->up};
        for (int k = 0; k < 3; k++) {
            int e = be->ops->weight_upload(be->ctx, t[k]);
            if (e) {
                /* Copies made so far belong to the backend until it is destroyed. */
                free(pw);
                return e;
            }
        }
    }
    free(s->placed);
    s->placed = pw;
    return 0;
}

const router_weights_t *router_set_weights(const router_set_t *s, int layer)
{
    if (!s->placed || !router_set_is_checkpoint(s, layer))
        return NULL;
    return &s->placed[s->slot[layer]];
}

const router_weights_t *router_set_weights_cb(void *user, int layer)
{
    return router_set_weights(user, layer);
}

int router_set_is_checkpoint_cb(void *user, int layer)
{
    return router_set_is_checkpoint(user, layer);
}

float router_prob_cb(void *user, int layer, const float *h)
{
    return router_prob(user, layer, h);
}

int router_set_first_exit_from(const router_set_t *s, const float *const *h_by_layer,
                               float theta, int min_layer)
{
    for (int i = 0; i < s->n; i++) {
        int l = s->routers[i].layer;
        if (l < min_layer || !h_by_layer[l])
            continue;
        if (router_prob(s, l, h_by_layer[l]) > theta)
            return l;
    }
    return -1;
}

int router_set_first_exit(const router_set_t *s, const float *const *h_by_layer, float theta)
{
    return router_set_first_exit_from(s, h_by_layer, theta, 0);
}

/* ---- Saving and loading --------------------------------------------------------------- */

static const char *const router__part[3] = {"norm", "down", "up"};

/* Pointer, element count and shape of tensor `part` (0 norm, 1 down, 2 up) of r. */
static float *router__tensor(const router_t *r, int part, int64_t shape[2], int *n_dims)
{
    switch (part) {
    case 0:
        *n_dims = 1;
        shape[0] = r->dim;
        return r->norm;
    case 1:
        *n_dims = 2;
        shape[0] = ROUTER_HIDDEN;
        shape[1] = r->dim;
        return r->w_down;
    default:
        *n_dims = 2;
        shape[0] = 1;
        shape[1] = ROUTER_HIDDEN;
        return r->w_up;
    }
}

int router_set_save(const router_set_t *s, const char *path)
{
    safetensors_writer_t *w;
    int e = safetensors_writer_new(&w, path);
    if (e)
        return e;
    char name[64], val[512];
    for (int i = 0; i < s->n && !e; i++) {
        for (int p = 0; p < 3 && !e; p++) {
            int64_t shape[2];
            int nd;
            router__tensor(&s->routers[i], p, shape, &nd);
            snprintf(name, sizeof name, "router.%d.%s.weight", s->routers[i].layer,
                     router__part[p]);
            e = safetensors_writer_add(w, name, SAFETENSORS_F32, nd, shape);
        }
    }
    size_t off = 0;
    for (int i = 0; i < s->n; i++)
        off += (size_t)snprintf(val + off, off < sizeof val ? sizeof val - off : 0, "%s%d",
                                i ? "," : "", s->routers[i].layer);
    if (off >= sizeof val && !e)
        e = river_err_set(RIVER_ERANGE, "%s: too many checkpoints to list", path);
    struct {
        const char *key;
        char v[64];
    } meta[] = {{"format", ROUTER_FORMAT}, {"version", ROUTER_VERSION}, {"interval", ""},
                {"label_tau", ""},         {"hidden", ""},              {"norm_eps", ""},
                {"model_arch", ""},        {"model_dim", ""},           {"model_n_layers", ""},
                {"model_vocab_size", ""},  {"model_n_heads", ""},       {"model_n_kv_heads", ""},
                {"model_hidden_dim", ""},  {"model_fingerprint", ""}};
    const model_config_t *c = &s->cfg;
    snprintf(meta[2].v, sizeof meta[2].v, "%d", s->interval);
    snprintf(meta[3].v, sizeof meta[3].v, "%.9g", (double)s->label_tau);
    snprintf(meta[4].v, sizeof meta[4].v, "%d", ROUTER_HIDDEN);
    snprintf(meta[5].v, sizeof meta[5].v, "%.9g", (double)s->routers[0].eps);
    snprintf(meta[6].v, sizeof meta[6].v, "%s", arch_name(c->arch));
    snprintf(meta[7].v, sizeof meta[7].v, "%d", c->dim);
    snprintf(meta[8].v, sizeof meta[8].v, "%d", c->n_layers);
    snprintf(meta[9].v, sizeof meta[9].v, "%d", c->vocab_size);
    snprintf(meta[10].v, sizeof meta[10].v, "%d", c->n_heads);
    snprintf(meta[11].v, sizeof meta[11].v, "%d", c->n_kv_heads);
    snprintf(meta[12].v, sizeof meta[12].v, "%d", c->hidden_dim);
    snprintf(meta[13].v, sizeof meta[13].v, "%s", s->fingerprint);
    for (size_t i = 0; i < sizeof meta / sizeof meta[0] && !e; i++)
        e = safetensors_writer_set_metadata(w, meta[i].key, meta[i].v);
    if (!e)
        e = safetensors_writer_set_metadata(w, "checkpoints", val);
    if (!e)
        e = safetensors_writer_begin(w);
    for (int i = 0; i < s->n && !e; i++) {
        for (int p = 0; p < 3 && !e; p++) {
            int64_t shape[2];
            int nd;
            const float *t = router__tensor(&s->routers[i], p, shape, &nd);
            size_t cnt = nd == 1 ? (size_t)shape[0] : (size_t)shape[0] * (size_t)shape[1];
            e = safetensors_writer_write(w, t, cnt * sizeof *t);
        }
    }
    if (!e)
        e = safetensors_writer_finish(w);
    safetensors_writer_destroy(&w);
    return e;
}

/* A metadata integer in [min, max]; the whole string must be the number. */
static int router__meta_int(const safetensors_t *f, const char *key, long min, long max,
                            long *out)
{
    const char *v = safetensors_metadata(f, key);
    if (!v)
        return river_err_set(RIVER_EFORMAT, "%s: router metadata lacks \"%s\"",
                             safetensors_path(f), key);
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || end == v || *end || x < min || x > max)
        return river_err_set(RIVER_EFORMAT, "%s: router metadata \"%s\" is \"%s\", not an "
                             "integer in [%ld, %ld]", safetensors_path(f), key, v, min, max);
    *out = x;
    return 0;
}

static int router__meta_float(const safetensors_t *f, const char *key, float *out)
{
    const char *v = safetensors_metadata(f, key);
    if (!v)
        return river_err_set(RIVER_EFORMAT, "%s: router metadata lacks \"%s\"",
                             safetensors_path(f), key);
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (errno || end == v || *end || !isfinite(x))
        return river_err_set(RIVER_EFORMAT, "%s: router metadata \"%s\" is \"%s\", not a "
                             "finite number", safetensors_path(f), key, v);
    *out = (float)x;
    return 0;
}

/* Checks that the file was calibrated for model m, naming what differs. */
static int router__check_model(const safetensors_t *f, const model_t *m)
{
    const model_config_t *c = &m->cfg;
    const char *path = safetensors_path(f);
    struct {
        const char *key;
        int have;
    } dims[] = {{"model_dim", c->dim},          {"model_n_layers", c->n_layers},
                {"model_vocab_size", c->vocab_size}, {"model_n_heads", c->n_heads},
                {"model_n_kv_heads", c->n_kv_heads}, {"model_hidden_dim", c->hidden_dim}};
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++) {
        long v;
        int e = router__meta_int(f, dims[i].key, 1, 1L << 30, &v);
        if (e)
            return e;
        if (v != dims[i].have)
            return river_err_set(RIVER_ECONFIG, "%s: routers belong to another model (%s %ld, "
                                 "this model %d)", path, dims[i].key + 6, v, dims[i].have);
    }
    const char *fp = safetensors_metadata(f, "model_fingerprint");
    if (!fp)
        return river_err_set(RIVER_EFORMAT, "%s: router metadata lacks \"model_fingerprint\"",
                             path);
    char mine[MODEL_FINGERPRINT_LEN];
    int e = model_fingerprint(m, mine);
    if (e)
        return e;
    if (strcmp(fp, mine))
        return river_err_set(RIVER_ECONFIG, "%s: routers belong to another model of the same "
                             "shape (weight fingerprint %.32s, this model %s)", path, fp, mine);
    return 0;
}

/* Copies tensor `part` of router r out of the file after checking its dtype and shape. */
static int router__load_tensor(const safetensors_t *f, router_t *r, int part)
{
    char name[64];
    snprintf(name, sizeof name, "router.%d.%s.weight", r->layer, router__part[part]);
    const char *path = safetensors_path(f);
    const safetensors_tensor_t *t = safetensors_find(f, name);
    if (!t)
        return river_err_set(RIVER_EFORMAT, "%s: tensor %s is missing", path, name);
    if (t->dtype != SAFETENSORS_F32)
        return river_err_set(RIVER_EDTYPE, "%s: tensor %s is %s, expected F32", path, name,
                             t->dtype_str);
    int64_t shape[2];
    int nd;
    float *dst = router__tensor(r, part, shape, &nd);
    int ok = t->n_dims == nd && t->shape[0] == shape[0] && (nd == 1 || t->shape[1] == shape[1]);
    /* Accept the up projection also as a plain vector of ROUTER_HIDDEN. */
    if (part == 2 && t->n_dims == 1 && t->shape[0] == ROUTER_HIDDEN)
        ok = 1;
    size_t cnt = nd == 1 ? (size_t)shape[0] : (size_t)shape[0] * (size_t)shape[1];
    if (!ok || t->nbytes != cnt * sizeof(float))
        return river_err_set(RIVER_ESHAPE, "%s: tensor %s has the wrong shape (expected "
                             "%zu floats)", path, name, cnt);
    /* The mapping may place data at any byte offset, so copy instead of casting. */
    memcpy(dst, t->data, t->nbytes);
    for (size_t i = 0; i < cnt; i++)
        if (!isfinite(dst[i]))
            return river_err_set(RIVER_EFORMAT, "%s: tensor %s holds a non-finite value",
                                 path, name);
    return 0;
}

int router_set_load(router_set_t **out, const model_t *m, const char *path)
{
    safetensors_t *f;
    int e = safetensors_open(&f, path);
    if (e)
        return e;
    router_set_t *s = NULL;
    const char *fmt = safetensors_metadata(f, "format");
    if (!fmt || strcmp(fmt, ROUTER_FORMAT)) {
        e = river_err_set(RIVER_EFORMAT, "%s: not a router file (metadata format is \"%s\", "
                          "expected \"%s\")", path, fmt ? fmt : "(none)", ROUTER_FORMAT);
        goto fail;
    }
    const char *ver = safetensors_metadata(f, "version");
    if (!ver || strcmp(ver, ROUTER_VERSION)) {
        e = river_err_set(RIVER_EUNSUPPORTED, "%s: router file version \"%s\" (this build "
                          "reads \"%s\")", path, ver ? ver : "(none)", ROUTER_VERSION);
        goto fail;
    }
    long hidden, interval;
    float tau, eps;
    if ((e = router__meta_int(f, "hidden", 1, 1 << 20, &hidden)))
        goto fail;
    if (hidden != ROUTER_HIDDEN) {
        e = river_err_set(RIVER_EUNSUPPORTED, "%s: routers with %ld hidden units (this build "
                          "has %d)", path, hidden, ROUTER_HIDDEN);
        goto fail;
    }
    if ((e = router__check_model(f, m)))
        goto fail;
    if ((e = router__meta_int(f, "interval", 1, m->cfg.n_layers, &interval)))
        goto fail;
    if ((e = router__meta_float(f, "label_tau", &tau)))
        goto fail;
    if ((e = router__meta_float(f, "norm_eps", &eps)))
        goto fail;
    if (!(eps > 0 && eps < 1)) {
        e = river_err_set(RIVER_EFORMAT, "%s: router norm_eps %g out of range", path,
                          (double)eps);
        goto fail;
    }
    if ((e = router_set_create(&s, m, (int)interval, tau, eps)))
        goto fail;
    if (safetensors_count(f) != (size_t)s->n * 3) {
        e = river_err_set(RIVER_EFORMAT, "%s: %zu tensors, expected %d (3 for each of %d "
                          "checkpoints at interval %ld)", path, safetensors_count(f), s->n * 3,
                          s->n, interval);
        goto fail;
    }
    for (int i = 0; i < s->n; i++)
        for (int p = 0; p < 3; p++)
            if ((e = router__load_tensor(f, &s->routers[i], p)))
                goto fail;
    safetensors_destroy(&f);
    *out = s;
    return 0;

fail:
    router_set_destroy(&s);
    safetensors_destroy(&f);
    return e;
}
