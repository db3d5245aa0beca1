#include "engine/router.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "engine/forward.h"
#include "engine/kv_pool.h"
#include "model/safetensors.h"

#define ROUTER_FORMAT "river-router"
#define ROUTER_VERSION "1"

/* ---- Random numbers ------------------------------------------------------------------- */

/* splitmix64: small, seedable, and the same sequence on every platform, which keeps
 * calibration reproducible from its seed. */
static uint64_t router__rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* Uniform in [0, 1) with 24 bits, exact in a float. */
static float router__rng_unit(uint64_t *s)
{
    return (float)(router__rng_next(s) >> 40) * (1.0f / 16777216.0f);
}

/* Uniform in [0, n) without modulo bias worth worrying about for n far below 2^64. */
static int64_t router__rng_below(uint64_t *s, int64_t n)
{
    return (int64_t)(router__rng_next(s) % (uint64_t)n);
}

static void router__shuffle(int64_t *a, int64_t n, uint64_t *s)
{
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = router__rng_below(s, i + 1);
        int64_t t = a[i];
        a[i] = a[j];
        a[j] = t;
    }
}

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

void router_init_params(router_t *r, uint64_t seed)
{
    uint64_t s = seed;
    float bd = 1.0f / sqrtf((float)r->dim);
    float bu = 1.0f / sqrtf((float)ROUTER_HIDDEN);
    for (int i = 0; i < r->dim; i++)
        r->norm[i] = 1.0f;
    for (size_t i = 0; i < (size_t)ROUTER_HIDDEN * (size_t)r->dim; i++)
        r->w_down[i] = (2.0f * router__rng_unit(&s) - 1.0f) * bd;
    for (int j = 0; j < ROUTER_HIDDEN; j++)
        r->w_up[j] = (2.0f * router__rng_unit(&s) - 1.0f) * bu;
}

float router_sigmoid(float z)
{
    /* Both branches avoid exp overflow for large |z|. */
    if (z >= 0)
        return 1.0f / (1.0f + expf(-z));
    float e = expf(z);
    return e / (1.0f + e);
}

/* log(1 + e^z) without overflow. */
static float router__softplus(float z)
{
    return fmaxf(z, 0.0f) + log1pf(expf(-fabsf(z)));
}

/* The hot loops are written with GCC vector types, 8 floats wide, so that they vectorise at
 * -O2 whatever the cost model, and the two functions that run them are compiled for several
 * x86 levels and picked at load time (target_clones): AVX-512 or AVX2 where the processor
 * has them, SSE2 otherwise. The helpers are always inlined into those clones. Every clone
 * adds the same lanes in the same order (ISO C mode contracts no FMAs), so all of them give
 * bit-identical results. */
typedef float router_vf __attribute__((vector_size(32)));
#define ROUTER_INLINE static inline __attribute__((always_inline))
/* ThreadSanitizer's runtime is not up yet when the dynamic loader runs ifunc resolvers, and
 * an instrumented resolver crashes there: a TSan build gets the default clone only. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(__SANITIZE_THREAD__)
#define ROUTER_CLONES \
    __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define ROUTER_CLONES
#endif

/* Unaligned loads and stores through memcpy (a macro: a function returning a 32-byte vector
 * would change the ABI between the clones). */
#define ROUTER_LD(v, p) memcpy(&(v), (p), sizeof(v))
#define ROUTER_ST(p, v) memcpy((p), &(v), sizeof(v))

/* sum a[i]*b[i]*c[i] (c may be NULL). */
ROUTER_INLINE float router__dot3(const float *restrict a, const float *restrict b,
                                 const float *restrict c, int n)
{
    router_vf acc = {0}, va, vb, vc;
    int i = 0;
    if (c) {
        for (; i + 8 <= n; i += 8) {
            ROUTER_LD(va, a + i);
            ROUTER_LD(vb, b + i);
            ROUTER_LD(vc, c + i);
            acc += va * (vb * vc);
        }
    } else {
        for (; i + 8 <= n; i += 8) {
            ROUTER_LD(va, a + i);
            ROUTER_LD(vb, b + i);
            acc += va * vb;
        }
    }
    float s = 0;
    for (; i < n; i++)
        s += a[i] * b[i] * (c ? c[i] : 1.0f);
    for (int k = 0; k < 8; k++)
        s += acc[k];
    return s;
}

ROUTER_INLINE void router__axpy(float *restrict y, float a, const float *restrict x, int n)
{
    int i = 0;
    router_vf vy, vx;
    for (; i + 8 <= n; i += 8) {
        ROUTER_LD(vy, y + i);
        ROUTER_LD(vx, x + i);
        vy += a * vx;
        ROUTER_ST(y + i, vy);
    }
    for (; i < n; i++)
        y[i] += a * x[i];
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
    float loss = w_pos * y * router__softplus(-z) + (1.0f - y) * router__softplus(z);
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
    uint64_t fingerprint;
    int n;               /* routers */
    router_t *routers;   /* (n) in layer order */
    int *slot;           /* (n_layers) router index of each layer, -1 where none */
    router_weights_t *placed; /* (n) the routers as ops->router_prob reads them, once
                                 router_set_place ran; NULL before */
};

static void router__fnv(uint64_t *hsh, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) {
        *hsh ^= b[i];
        *hsh *= 0x100000001b3ULL;
    }
}

static void router__fnv_weight_row(uint64_t *hsh, const weight_t *w)
{
    if (!w->data || w->cols <= 0)
        return;
    router__fnv(hsh, w->data, dtype_row_bytes(w->dtype, w->cols));
}

uint64_t router_model_fingerprint(const model_t *m)
{
    /* A placed model's weights may be device memory; model_place kept the fingerprint. */
    if (m->fingerprint[0])
        return m->router_fingerprint;
    const model_config_t *c = &m->cfg;
    uint64_t h = 0xcbf29ce484222325ULL;
    int32_t dims[] = {(int32_t)c->arch, c->dim,        c->n_layers,   c->n_heads,
                      c->n_kv_heads,    c->head_dim,   c->hidden_dim, c->vocab_size};
    router__fnv(&h, dims, sizeof dims);
    router__fnv_weight_row(&h, &m->embed);
    router__fnv_weight_row(&h, &m->final_norm);
    for (int l = 0; l < c->n_layers; l++) {
        router__fnv_weight_row(&h, &m->layers[l].attn_norm);
        router__fnv_weight_row(&h, &m->layers[l].ffn_norm);
        router__fnv_weight_row(&h, &m->layers[l].wq);
    }
    return h;
}

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
    s->fingerprint = router_model_fingerprint(m);
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

int router_set_new(router_set_t **out, const model_t *m, int interval, float label_tau,
                   uint64_t seed)
{
    router_set_t *s;
    int e = router__set_alloc(&s, m, interval, label_tau);
    if (e)
        return e;
    e = router__set_alloc_routers(s, m->cfg.norm_eps);
    if (e) {
        router_set_destroy(&s);
        return e;
    }
    for (int i = 0; i < s->n; i++)
        router_init_params(&s->routers[i], seed + (uint64_t)i);
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
    snprintf(meta[13].v, sizeof meta[13].v, "%016" PRIx64, s->fingerprint);
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
    char mine[32];
    snprintf(mine, sizeof mine, "%016" PRIx64, router_model_fingerprint(m));
    if (strcmp(fp, mine))
        return river_err_set(RIVER_ECONFIG, "%s: routers belong to another model of the same "
                             "shape (weight fingerprint %.20s, this model %s)", path, fp, mine);
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
    if ((e = router__set_alloc(&s, m, (int)interval, tau)))
        goto fail;
    if ((e = router__set_alloc_routers(s, eps)))
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

/* ---- Calibration: collecting hidden states -------------------------------------------- */

/* What the layer hook needs while one window runs. */
typedef struct calib_hook {
    router_calib_t *c;
    const int *slot;          /* (n_layers) checkpoint index of each layer, -1 where none */
    int last_layer;
    const int64_t *row_sample;/* (rows of the batch) sample index, -1 for BOS */
} calib_hook_t;

static void router__calib_hook(void *user, int layer, const float *hidden, int n, int dim)
{
    calib_hook_t *k = user;
    router_calib_t *c = k->c;
    int slot = k->slot[layer];
    if (slot >= 0) {
        for (int r = 0; r < n; r++) {
            int64_t i = k->row_sample[r];
            if (i < 0)
                continue;
            memcpy(c->h + ((size_t)slot * (size_t)c->cap + (size_t)i) * (size_t)dim,
                   hidden + (size_t)r * (size_t)dim, sizeof(float) * (size_t)dim);
        }
    }
    if (layer != k->last_layer)
        return;
    for (int r = 0; r < n; r++) {
        int64_t i = k->row_sample[r];
        if (i < 0)
            continue;
        const float *hl = hidden + (size_t)r * (size_t)dim;
        for (int s = 0; s < c->n_ckpt; s++) {
            const float *hk = c->h + ((size_t)s * (size_t)c->cap + (size_t)i) * (size_t)dim;
            double ab = 0, aa = 0, bb = 0;
            for (int j = 0; j < dim; j++) {
                ab += (double)hk[j] * hl[j];
                aa += (double)hk[j] * hk[j];
                bb += (double)hl[j] * hl[j];
            }
            /* A zero vector has no direction: call it unconverged. */
            c->cos[(size_t)s * (size_t)c->cap + (size_t)i] =
                aa > 0 && bb > 0 ? (float)(ab / sqrt(aa * bb)) : 0.0f;
        }
    }
}

/* Tokenised documents of the calibration text. */
typedef struct calib_docs {
    int32_t **ids;  /* (n) each malloc'd */
    size_t *len;    /* (n) */
    size_t n, cap;
    int64_t total;  /* tokens over all documents */
} calib_docs_t;

static void router__docs_free(calib_docs_t *d)
{
    for (size_t i = 0; i < d->n; i++)
        free(d->ids[i]);
    free(d->ids);
    free(d->len);
    memset(d, 0, sizeof *d);
}

static int router__docs_push(calib_docs_t *d, int32_t *ids, size_t n)
{
    if (d->n == d->cap) {
        size_t c = d->cap ? d->cap * 2 : 64;
        int32_t **ni = realloc(d->ids, c * sizeof *ni);
        if (!ni)
            return river_err_set(RIVER_ENOMEM, "router: document list");
        d->ids = ni;
        size_t *nl = realloc(d->len, c * sizeof *nl);
        if (!nl)
            return river_err_set(RIVER_ENOMEM, "router: document list");
        d->len = nl;
        d->cap = c;
    }
    d->ids[d->n] = ids;
    d->len[d->n] = n;
    d->n++;
    d->total += (int64_t)n;
    return 0;
}

static int router__line_blank(const char *p, const char *end)
{
    for (; p < end && *p != '\n'; p++)
        if (*p != ' ' && *p != '\t' && *p != '\r')
            return 0;
    return 1;
}

/* Splits text at blank lines and encodes each document on its own, without special tokens
 * (the caller adds BOS per window). Stops once `enough` tokens are there (0: no limit). */
static int router__tokenize(calib_docs_t *d, const tokenizer_t *tok, const char *text,
                            size_t len, int64_t enough)
{
    const char *p = text, *end = text + len;
    while (p < end && (!enough || d->total < enough)) {
        /* Skip blank lines, then take lines up to the next blank one. */
        while (p < end && router__line_blank(p, end)) {
            const char *nl = memchr(p, '\n', (size_t)(end - p));
            p = nl ? nl + 1 : end;
        }
        if (p >= end)
            break;
        const char *start = p, *stop = p;
        while (p < end && !router__line_blank(p, end)) {
            const char *nl = memchr(p, '\n', (size_t)(end - p));
            stop = nl ? nl : end;
            p = nl ? nl + 1 : end;
        }
        int32_t *ids = NULL;
        size_t n = 0;
        int e = tokenizer_encode(tok, start, (size_t)(stop - start), 0, &ids, &n);
        if (e)
            return e;
        if (n == 0) {
            free(ids);
            continue;
        }
        e = router__docs_push(d, ids, n);
        if (e) {
            free(ids);
            return e;
        }
    }
    return 0;
}

void router_calib_destroy(router_calib_t **cp)
{
    router_calib_t *c = *cp;
    if (!c)
        return;
    free(c->layers);
    free(c->h);
    free(c->cos);
    free(c);
    *cp = NULL;
}

/* Runs one window (tokens win, n_win of them, BOS first when has_bos) through the model and
 * stores its samples from index c->n on. */
static int router__calib_window(router_calib_t *c, forward_t *f, kv_pool_t *kv,
                                calib_hook_t *hk, int64_t *row_sample, const int32_t *win,
                                int n_win, int has_bos)
{
    kv_seq_t seq;
    kv_seq_init(&seq);
    int e = kv_seq_reserve(&seq, kv, n_win);
    if (e)
        return e;
    int max_rows = forward_max_rows(f);
    const int32_t *pt[256];
    int32_t pos[256];
    if (max_rows > 256)
        max_rows = 256;
    for (int s = 0; s < n_win && !e; s += max_rows) {
        int rows = n_win - s < max_rows ? n_win - s : max_rows;
        for (int r = 0; r < rows; r++) {
            int p = s + r;
            pos[r] = p;
            pt[r] = seq.pages;
            row_sample[r] = has_bos && p == 0 ? -1 : c->n + (p - has_bos);
        }
        hk->row_sample = row_sample;
        fwd_batch_t b = {.n = rows, .tokens = win + s, .pos = pos, .page_table = pt,
                         .n_logits = 0, .logit_rows = NULL};
        e = forward_step(f, kv, &b, NULL);
    }
    kv_seq_free(&seq, kv);
    return e;
}

int router_calib_collect(router_calib_t **out, const model_t *m, const tokenizer_t *tok,
                         backend_t *be, const char *text, size_t len,
                         const router_calib_opts_t *o)
{
    const model_config_t *mc = &m->cfg;
    int n_ckpt = router_checkpoints(mc->n_layers, o->interval, NULL, 0);
    if (n_ckpt < 0)
        return n_ckpt;
    if (n_ckpt == 0)
        return river_err_set(RIVER_EINVAL, "router: interval %d leaves no checkpoint below "
                             "the last of %d layers", o->interval, mc->n_layers);
    if (o->max_tokens < 0)
        return river_err_set(RIVER_EINVAL, "router: max_tokens %" PRId64, o->max_tokens);
    int bos = mc->bos_id >= 0 ? mc->bos_id : tokenizer_bos_id(tok);
    int has_bos = bos >= 0;
    int window = o->window > 0 ? o->window : (mc->max_seq_len < 1024 ? mc->max_seq_len : 1024);
    if (window > mc->max_seq_len || window < 1 + has_bos)
        return river_err_set(RIVER_EINVAL, "router: window of %d positions (context %d)",
                             window, mc->max_seq_len);

    calib_docs_t docs = {0};
    router_calib_t *c = NULL;
    forward_t *f = NULL;
    kv_pool_t *kv = NULL;
    int *slot = NULL;
    int32_t *win = NULL;
    int64_t *row_sample = NULL;
    int e = router__tokenize(&docs, tok, text, len, o->max_tokens);
    if (e)
        goto done;
    if (docs.total == 0) {
        e = river_err_set(RIVER_EINVAL, "router: the calibration text has no tokens");
        goto done;
    }
    c = calloc(1, sizeof *c);
    if (!c)
        goto fail_mem;
    c->dim = mc->dim;
    c->n_ckpt = n_ckpt;
    c->cap = o->max_tokens && o->max_tokens < docs.total ? o->max_tokens : docs.total;
    c->layers = malloc(sizeof *c->layers * (size_t)n_ckpt);
    c->h = malloc(sizeof(float) * (size_t)n_ckpt * (size_t)c->cap * (size_t)mc->dim);
    c->cos = malloc(sizeof(float) * (size_t)n_ckpt * (size_t)c->cap);
    slot = malloc(sizeof *slot * (size_t)mc->n_layers);
    win = malloc(sizeof *win * (size_t)window);
    row_sample = malloc(sizeof *row_sample * 256);
    if (!c->layers || !c->h || !c->cos || !slot || !win || !row_sample)
        goto fail_mem;
    router_checkpoints(mc->n_layers, o->interval, c->layers, n_ckpt);
    for (int l = 0; l < mc->n_layers; l++)
        slot[l] = -1;
    for (int i = 0; i < n_ckpt; i++)
        slot[c->layers[i]] = i;

    int page = 16;
    if ((e = forward_new(&f, m, be, window < 128 ? window : 128)))
        goto done;
    if ((e = kv_pool_new(&kv, be, mc->n_layers, mc->n_kv_heads * mc->head_dim, page,
                         (window + page - 1) / page)))
        goto done;
    calib_hook_t hk = {.c = c, .slot = slot, .last_layer = mc->n_layers - 1};
    forward_set_layer_hook(f, router__calib_hook, &hk);
    for (size_t d = 0; d < docs.n && c->n < c->cap && !e; d++) {
        c->n_docs++;
        for (size_t at = 0; at < docs.len[d] && c->n < c->cap && !e;) {
            int64_t take = window - has_bos;
            if ((int64_t)(docs.len[d] - at) < take)
                take = (int64_t)(docs.len[d] - at);
            if (c->cap - c->n < take)
                take = c->cap - c->n;
            if (has_bos)
                win[0] = bos;
            memcpy(win + has_bos, docs.ids[d] + at, sizeof *win * (size_t)take);
            e = router__calib_window(c, f, kv, &hk, row_sample, win, (int)take + has_bos,
                                     has_bos);
            if (!e) {
                c->n += take;
                c->n_windows++;
            }
            at += (size_t)take;
        }
    }
    goto done;

fail_mem:
    e = river_err_set(RIVER_ENOMEM, "router: calibration buffers for %" PRId64 " tokens",
                      docs.total);
done:
    kv_pool_destroy(&kv);
    forward_destroy(&f);
    free(slot);
    free(win);
    free(row_sample);
    router__docs_free(&docs);
    if (e)
        router_calib_destroy(&c);
    else
        *out = c;
    return e;
}

static int router__cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

float router_calib_cos_quantile(const router_calib_t *c, int i, double q)
{
    if (i < -1 || i >= c->n_ckpt || c->n == 0)
        return NAN;
    int first = i < 0 ? 0 : i, last = i < 0 ? c->n_ckpt - 1 : i;
    size_t cnt = (size_t)(last - first + 1) * (size_t)c->n;
    float *v = malloc(sizeof *v * cnt);
    if (!v)
        return NAN;
    for (int k = first; k <= last; k++)
        memcpy(v + (size_t)(k - first) * (size_t)c->n, c->cos + (size_t)k * (size_t)c->cap,
               sizeof *v * (size_t)c->n);
    qsort(v, cnt, sizeof *v, router__cmp_float);
    double at = q < 0 ? 0 : q > 1 ? 1 : q;
    float r = v[(size_t)(at * (double)(cnt - 1) + 0.5)];
    free(v);
    return r;
}

double router_calib_pos_frac(const router_calib_t *c, int i, float tau)
{
    if (i < 0 || i >= c->n_ckpt || c->n == 0)
        return NAN;
    const float *cs = c->cos + (size_t)i * (size_t)c->cap;
    int64_t pos = 0;
    for (int64_t k = 0; k < c->n; k++)
        pos += cs[k] > tau;
    return (double)pos / (double)c->n;
}

float router_calib_auto_tau(const router_calib_t *c)
{
    return router_calib_cos_quantile(c, -1, 0.5);
}

/* ---- Calibration: training ------------------------------------------------------------ */

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
    router__shuffle(perm, n, &rng);
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
        router__shuffle(train, n_train, &rng);
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
            hl += yi ? w_pos * router__softplus(-z) : router__softplus(z);
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

static void *router__train_worker(void *arg)
{
    train_pool_t *tp = arg;
    for (;;) {
        pthread_mutex_lock(&tp->lock);
        int i = tp->err ? tp->s->n : tp->next++;
        pthread_mutex_unlock(&tp->lock);
        if (i >= tp->s->n)
            break;
        router_train_opts_t o = *tp->o;
        o.seed = tp->o->seed + (uint64_t)i;
        const float *h = tp->c->h + (size_t)i * (size_t)tp->c->cap * (size_t)tp->c->dim;
        router_train_report_t *rep = tp->reps ? &tp->reps[i] : NULL;
        int e = router_train(&tp->s->routers[i], h, tp->labels[i], tp->c->n, &o, rep);
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
    if (c->n_ckpt != s->n || c->dim != s->dim)
        return river_err_set(RIVER_EINVAL, "router: calibration data has %d checkpoints of "
                             "dim %d, the set %d of dim %d", c->n_ckpt, c->dim, s->n, s->dim);
    for (int i = 0; i < s->n; i++)
        if (c->layers[i] != s->routers[i].layer)
            return river_err_set(RIVER_EINVAL, "router: calibration checkpoint %d is layer "
                                 "%d, the set's is %d", i, c->layers[i], s->routers[i].layer);
    if (reps)
        memset(reps, 0, sizeof *reps * (size_t)s->n);
    train_pool_t tp = {.s = s, .c = c, .o = o, .reps = reps};
    int e = 0;
    tp.labels = calloc((size_t)s->n, sizeof *tp.labels);
    if (!tp.labels)
        return river_err_set(RIVER_ENOMEM, "router: labels");
    for (int i = 0; i < s->n && !e; i++) {
        tp.labels[i] = malloc((size_t)(c->n > 0 ? c->n : 1));
        if (!tp.labels[i]) {
            e = river_err_set(RIVER_ENOMEM, "router: labels");
            break;
        }
        const float *cs = c->cos + (size_t)i * (size_t)c->cap;
        for (int64_t k = 0; k < c->n; k++)
            tp.labels[i][k] = cs[k] > s->label_tau;
    }
    if (e)
        goto done;
    if ((e = pthread_mutex_init(&tp.lock, NULL))) {
        e = river_err_set(RIVER_ESYS, "router: pthread_mutex_init: %s", strerror(e));
        goto done;
    }
    int nt = o->n_threads < 1 ? 1 : o->n_threads > s->n ? s->n : o->n_threads;
    pthread_t th[64];
    if (nt > 64)
        nt = 64;
    int started = 0;
    /* The calling thread trains too, so one thread needs no pthread_create at all. */
    for (; started < nt - 1; started++) {
        int pe = pthread_create(&th[started], NULL, router__train_worker, &tp);
        if (pe)
            break; /* fewer helpers just means slower training */
    }
    router__train_worker(&tp);
    for (int i = 0; i < started; i++)
        pthread_join(th[i], NULL);
    pthread_mutex_destroy(&tp.lock);
    if (tp.err)
        e = river_err_set(tp.err, "%s", tp.detail);

done:
    for (int i = 0; i < s->n; i++)
        free(tp.labels[i]);
    free(tp.labels);
    if (e && reps)
        for (int i = 0; i < s->n; i++)
            router_train_report_free(&reps[i]);
    return e;
}
