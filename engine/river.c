/* The Exit River file: building it from a model (river_build) and mapping it back
 * (river_load). See river.h for the format. */
#include "engine/river.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/err.h"
#include "kernels/backend.h"
#include "model/safetensors.h"
#include "kernels/cpu/threadpool.h"

#define RIVER_FORMAT "river"
#define RIVER_FORMAT_VERSION "1"

/* The seven matrices of a layer that the river quantizes, by their layer_weights_t field. */
typedef struct river_matrix {
    const char *name;
    size_t offset;
} river_matrix_t;

static const river_matrix_t river_matrices[] = {
    {"wq", offsetof(layer_weights_t, wq)},         {"wk", offsetof(layer_weights_t, wk)},
    {"wv", offsetof(layer_weights_t, wv)},         {"wo", offsetof(layer_weights_t, wo)},
    {"w_gate", offsetof(layer_weights_t, w_gate)}, {"w_up", offsetof(layer_weights_t, w_up)},
    {"w_down", offsetof(layer_weights_t, w_down)},
};
#define RIVER_N_MATRICES ((int)(sizeof river_matrices / sizeof river_matrices[0]))

static const weight_t *river_mat(const layer_weights_t *L, int i)
{
    return (const weight_t *)((const char *)L + river_matrices[i].offset);
}

static weight_t *river_mat_mut(layer_weights_t *L, int i)
{
    return (weight_t *)((char *)L + river_matrices[i].offset);
}

/* ---- fingerprint ---- */

/* Two 64-bit lanes, each a multiply-xorshift chain over 8-byte words with its own
 * constants; 128 bits make an accidental match between two models implausible. Not a
 * cryptographic hash: it guards against mistakes, not adversaries. */
typedef struct fp_state {
    uint64_t a, b;
} fp_state_t;

static uint64_t fp_mix(uint64_t x, uint64_t k)
{
    x ^= x >> 32;
    x *= k;
    x ^= x >> 29;
    x *= 0xbf58476d1ce4e5b9u;
    x ^= x >> 32;
    return x;
}

static void fp_word(fp_state_t *s, uint64_t w)
{
    s->a = fp_mix(s->a ^ w, 0x9e3779b97f4a7c15u);
    s->b = fp_mix(s->b + w + (s->b << 7), 0xd6e8feb86659fd93u);
}

static void fp_bytes(fp_state_t *s, const void *p, size_t n)
{
    const unsigned char *c = p;
    fp_word(s, (uint64_t)n);
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, c, 8);
        fp_word(s, w);
        c += 8;
        n -= 8;
    }
    if (n) {
        uint64_t w = 0;
        memcpy(&w, c, n);
        fp_word(s, w);
    }
}

static void fp_str(fp_state_t *s, const char *str)
{
    fp_bytes(s, str, strlen(str));
}

/* A tensor's name, dtype, shape and bytes: all of them when small, else 32 windows of 64
 * bytes spread evenly from the first byte to the last. */
static void fp_weight(fp_state_t *s, const char *name, const weight_t *w)
{
    fp_str(s, name);
    if (!w->data) {
        fp_word(s, UINT64_MAX);
        return;
    }
    fp_word(s, (uint64_t)w->dtype);
    fp_word(s, (uint64_t)w->rows);
    fp_word(s, (uint64_t)w->cols);
    fp_word(s, (uint64_t)w->group);
    size_t n = (size_t)w->rows * dtype_row_bytes(w->dtype, w->cols);
    const unsigned char *d = w->data;
    if (n <= 4096) {
        fp_bytes(s, d, n);
        return;
    }
    enum { WINDOWS = 32, WINDOW = 64 };
    for (size_t i = 0; i < WINDOWS; i++)
        fp_bytes(s, d + i * (n - WINDOW) / (WINDOWS - 1), WINDOW);
}

int river_fingerprint(const model_t *m, char out[RIVER_FINGERPRINT_LEN])
{
    /* A placed model's weights may be device memory; model_place kept the fingerprint. */
    if (m->fingerprint[0]) {
        memcpy(out, m->fingerprint, RIVER_FINGERPRINT_LEN);
        return 0;
    }
    if (m->backend)
        return river_err_set(RIVER_ESTATE, "%s: fingerprint of a placed model not taken",
                             m->path);
    const model_config_t *c = &m->cfg;
    fp_state_t s = {0x243f6a8885a308d3u, 0x13198a2e03707344u};
    fp_str(&s, "river-fingerprint-1");
    const int64_t cfg[] = {c->arch,      c->dim,        c->n_layers,       c->n_heads,
                           c->n_kv_heads, c->head_dim,  c->hidden_dim,     c->vocab_size,
                           c->tied_embeddings};
    for (size_t i = 0; i < sizeof cfg / sizeof cfg[0]; i++)
        fp_word(&s, (uint64_t)cfg[i]);
    fp_weight(&s, "embed", &m->embed);
    fp_weight(&s, "final_norm", &m->final_norm);
    fp_weight(&s, "lm_head", &m->lm_head);
    char name[64];
    for (int l = 0; l < c->n_layers; l++) {
        const layer_weights_t *L = &m->layers[l];
        const struct {
            const char *n;
            const weight_t *w;
        } ws[] = {{"attn_norm", &L->attn_norm}, {"wq", &L->wq},         {"wk", &L->wk},
                  {"wv", &L->wv},               {"wo", &L->wo},         {"bq", &L->bq},
                  {"bk", &L->bk},               {"bv", &L->bv},         {"q_norm", &L->q_norm},
                  {"k_norm", &L->k_norm},       {"ffn_norm", &L->ffn_norm},
                  {"w_gate", &L->w_gate},       {"w_up", &L->w_up},     {"w_down", &L->w_down}};
        for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++) {
            snprintf(name, sizeof name, "layers.%d.%s", l, ws[i].n);
            fp_weight(&s, name, ws[i].w);
        }
    }
    snprintf(out, RIVER_FINGERPRINT_LEN, "%016" PRIx64 "%016" PRIx64, s.a, s.b);
    return 0;
}

/* ---- paths and options ---- */

int river_default_path(const model_t *m, const quant_params_t *p, char *buf, size_t cap)
{
    char tail[64];
    snprintf(tail, sizeof tail, "river-q%d-g%d-%s.safetensors", p->bits, p->group,
             quant_method_name(p->method));
    int n;
    if (m->is_llama2c) {
        const char *base = strrchr(m->path, '/');
        base = base ? base + 1 : m->path;
        const char *dot = strrchr(base, '.');
        int stem = dot && dot > base ? (int)(dot - base) : (int)strlen(base);
        n = snprintf(buf, cap, "%s/%.*s-%s", m->dir, stem, base, tail);
    } else {
        n = snprintf(buf, cap, "%s/%s", m->dir, tail);
    }
    if (n < 0 || (size_t)n >= cap)
        return river_err_set(RIVER_EINVAL, "%s: river path too long", m->path);
    return 0;
}

river_build_opts_t river_build_opts_default(void)
{
    return (river_build_opts_t){
        .quant = quant_params_default(),
        .start_layer = RIVER_DEFAULT_START_LAYER,
        .head_bits = 8,
        .n_threads = 0,
    };
}

static double river_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void river_tensor_name(char *buf, size_t cap, int layer, int mat, const char *part)
{
    snprintf(buf, cap, "layers.%d.%s.%s", layer, river_matrices[mat].name, part);
}

/* ---- building ---- */

int river_group_fit(const model_t *m, const river_build_opts_t *o, int most)
{
    int n_layers = m->cfg.n_layers;
    int64_t common = o->head_bits ? m->lm_head.cols : 0;
    for (int l = o->start_layer < 0 ? 0 : o->start_layer; l < n_layers; l++)
        for (int i = 0; i < RIVER_N_MATRICES; i++) {
            int64_t a = river_mat(&m->layers[l], i)->cols, b = common;
            while (b) {
                int64_t t = a % b;
                a = b;
                b = t;
            }
            common = a;
        }
    for (int g = most; g >= 1; g--)
        if (common % g == 0 && (o->quant.bits != 4 || g % 2 == 0))
            return g;
    return 0;
}

/* Everything is checked before the file is created, so a bad group size fails at once
 * instead of after minutes of work. */
static int river_build_check(const model_t *m, const river_build_opts_t *o)
{
    int n_layers = m->cfg.n_layers;
    if (o->start_layer < 0 || o->start_layer >= n_layers)
        return river_err_set(RIVER_EINVAL, "%s: river start layer %d outside 0..%d", m->path,
                             o->start_layer, n_layers - 1);
    if (o->n_threads < 0 || o->n_threads > 1024)
        return river_err_set(RIVER_EINVAL, "river: %d threads", o->n_threads);
    int err = quant_params_check(&o->quant, 0, m->path);
    if (err)
        return err;
    if (o->head_bits != 0 && o->head_bits != 4 && o->head_bits != 8)
        return river_err_set(RIVER_EINVAL, "river: LM head bits %d; 0, 4 or 8", o->head_bits);
    if (o->head_bits && m->lm_head.cols % o->quant.group != 0)
        return river_err_set(RIVER_EINVAL, "%s: group %d does not divide the LM head's %lld "
                             "columns", m->path, o->quant.group, (long long)m->lm_head.cols);
    /* The largest group up to 128 that divides every matrix, to suggest one on failure. */
    int suggest = river_group_fit(m, o, 128);
    for (int l = o->start_layer; l < n_layers; l++)
        for (int i = 0; i < RIVER_N_MATRICES; i++) {
            const weight_t *w = river_mat(&m->layers[l], i);
            if (w->dtype != DTYPE_F32 && w->dtype != DTYPE_F16 && w->dtype != DTYPE_BF16)
                return river_err_set(RIVER_EDTYPE, "%s: layer %d %s is %s; the river "
                                     "quantizes F32, F16 or BF16 weights", m->path, l,
                                     river_matrices[i].name, dtype_name(w->dtype));
            if (w->cols % o->quant.group != 0)
                return river_err_set(RIVER_ESHAPE, "%s: layer %d %s has %lld columns, not a "
                                     "multiple of the group size %d; the largest group up "
                                     "to 128 that divides every matrix is %d", m->path, l,
                                     river_matrices[i].name, (long long)w->cols,
                                     o->quant.group, suggest);
        }
    return 0;
}

static int river_declare(safetensors_writer_t *wr, const model_t *m, const river_build_opts_t *o,
                         const char *fingerprint)
{
    const quant_params_t *p = &o->quant;
    char num[4][24], hqq[128];
    snprintf(num[0], sizeof num[0], "%d", o->start_layer);
    snprintf(num[1], sizeof num[1], "%d", m->cfg.n_layers);
    snprintf(num[2], sizeof num[2], "%d", p->bits);
    snprintf(num[3], sizeof num[3], "%d", p->group);
    snprintf(hqq, sizeof hqq, "p=%g beta=%g kappa=%g iters=%d", (double)p->hqq_p,
             (double)p->hqq_beta, (double)p->hqq_kappa, p->hqq_iters);
    const char *meta[][2] = {
        {"format", RIVER_FORMAT},   {"format_version", RIVER_FORMAT_VERSION},
        {"fingerprint", fingerprint}, {"source", m->path},
        {"start_layer", num[0]},    {"n_layers", num[1]},
        {"bits", num[2]},           {"group", num[3]},
        {"method", quant_method_name(p->method)},
    };
    int err;
    for (size_t i = 0; i < sizeof meta / sizeof meta[0]; i++)
        if ((err = safetensors_writer_set_metadata(wr, meta[i][0], meta[i][1])))
            return err;
    if (p->method == QUANT_HQQ && (err = safetensors_writer_set_metadata(wr, "hqq", hqq)))
        return err;
    char name[96];
    if (o->head_bits) {
        char hb[8];
        snprintf(hb, sizeof hb, "%d", o->head_bits);
        const weight_t *w = &m->lm_head;
        int64_t gshape[2] = {w->rows, w->cols / p->group};
        int64_t cshape[2] = {
            w->rows, (int64_t)dtype_row_bytes(o->head_bits == 4 ? DTYPE_Q4 : DTYPE_Q8, w->cols)};
        if ((err = safetensors_writer_set_metadata(wr, "head_bits", hb)) ||
            (err = safetensors_writer_add(wr, "lm_head.scales", SAFETENSORS_F16, 2, gshape)) ||
            (err = safetensors_writer_add(wr, "lm_head.zeros", SAFETENSORS_F16, 2, gshape)) ||
            (err = safetensors_writer_add(wr, "lm_head.codes", SAFETENSORS_U8, 2, cshape)))
            return err;
    }
    for (int l = o->start_layer; l < m->cfg.n_layers; l++)
        for (int i = 0; i < RIVER_N_MATRICES; i++) {
            const weight_t *w = river_mat(&m->layers[l], i);
            int64_t gshape[2] = {w->rows, w->cols / p->group};
            int64_t cshape[2] = {
                w->rows, (int64_t)dtype_row_bytes(p->bits == 4 ? DTYPE_Q4 : DTYPE_Q8, w->cols)};
            /* Scales and zeros come first: their sizes are even, so they stay 2-byte aligned
             * in the mapping whenever the codes before them are. */
            river_tensor_name(name, sizeof name, l, i, "scales");
            if ((err = safetensors_writer_add(wr, name, SAFETENSORS_F16, 2, gshape)))
                return err;
            river_tensor_name(name, sizeof name, l, i, "zeros");
            if ((err = safetensors_writer_add(wr, name, SAFETENSORS_F16, 2, gshape)))
                return err;
            river_tensor_name(name, sizeof name, l, i, "codes");
            if ((err = safetensors_writer_add(wr, name, SAFETENSORS_U8, 2, cshape)))
                return err;
        }
    return 0;
}

int river_build(const model_t *m, const char *path, const river_build_opts_t *o,
                quant_stats_t *total)
{
    int err = river_build_check(m, o);
    if (err)
        return err;
    /* Quantizing is host work over the mapped checkpoint; a model placed on a device no
     * longer has its weights where the host can read them. */
    if (m->backend && !backend_is_host(m->backend))
        return river_err_set(RIVER_EUNSUPPORTED, "%s: quantize the model before placing it on "
                             "a device backend (river quant runs on the host)", m->path);
    char fingerprint[RIVER_FINGERPRINT_LEN];
    if ((err = river_fingerprint(m, fingerprint)))
        return err;
    int n_threads = o->n_threads;
    if (n_threads == 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = n < 1 ? 1 : n > 256 ? 256 : (int)n;
    }
    safetensors_writer_t *wr = NULL;
    threadpool_t *pool = NULL;
    quant_matrix_t *q = NULL;
    quant_stats_t sum = {0};
    if ((err = threadpool_new(&pool, n_threads)))
        goto fail;
    if ((err = safetensors_writer_new(&wr, path)) || (err = river_declare(wr, m, o, fingerprint)) ||
        (err = safetensors_writer_begin(wr)))
        goto fail;
    if (o->head_bits) {
        const weight_t *w = &m->lm_head;
        quant_params_t hp = o->quant;
        hp.bits = o->head_bits;
        quant_stats_t st;
        if ((err = quant_matrix_new(&q, w->rows, w->cols, hp.bits, hp.group)) ||
            (err = quant_weight(q, w, &hp, pool, &st)))
            goto fail;
        size_t gbytes = quant_matrix_group_count(q) * sizeof(uint16_t);
        if ((err = safetensors_writer_write(wr, q->scales, gbytes)) ||
            (err = safetensors_writer_write(wr, q->zeros, gbytes)) ||
            (err = safetensors_writer_write(wr, q->codes, quant_matrix_code_bytes(q))))
            goto fail;
        quant_matrix_destroy(&q);
    }
    for (int l = o->start_layer; l < m->cfg.n_layers; l++) {
        double t0 = river_now();
        quant_stats_t layer = {0};
        for (int i = 0; i < RIVER_N_MATRICES; i++) {
            const weight_t *w = river_mat(&m->layers[l], i);
            quant_stats_t st;
            if ((err = quant_matrix_new(&q, w->rows, w->cols, o->quant.bits, o->quant.group)))
                goto fail;
            if ((err = quant_weight(q, w, &o->quant, pool, &st))) {
                /* The detail lives in the buffer river_err_set writes, so copy it first. */
                char why[256];
                snprintf(why, sizeof why, "%s", river_err_detail());
                river_err_set(err, "%s: layer %d %s: %s", m->path, l, river_matrices[i].name,
                              why);
                goto fail;
            }
            size_t gbytes = quant_matrix_group_count(q) * sizeof(uint16_t);
            if ((err = safetensors_writer_write(wr, q->scales, gbytes)) ||
                (err = safetensors_writer_write(wr, q->zeros, gbytes)) ||
                (err = safetensors_writer_write(wr, q->codes, quant_matrix_code_bytes(q))))
                goto fail;
            quant_matrix_destroy(&q);
            quant_stats_add(&layer, &st);
        }
        quant_stats_add(&sum, &layer);
        if (o->progress)
            o->progress(o->progress_arg, l, &layer, river_now() - t0);
    }
    if ((err = safetensors_writer_finish(wr)))
        goto fail;
    if (total)
        *total = sum;
fail:
    quant_matrix_destroy(&q);
    safetensors_writer_destroy(&wr);
    threadpool_destroy(&pool);
    return err;
}

/* ---- loading ---- */

struct river {
    safetensors_t *file;
    int start_layer;
    int n_layers;
    int bits;
    int group;
    quant_method_t method;
    char fingerprint[RIVER_FINGERPRINT_LEN];
    layer_weights_t *layers; /* (n_layers); entries below start_layer stay zeroed */
    weight_t head;           /* quantized LM head; data NULL when the river has none */
    void **owned;            /* (n_owned) realigned copies of scales and zeros */
    int n_owned;
};

/* The river goes where its model is: its quantized matrices and head are placed on the
 * model's backend (norms and biases were copied from the placed model, so they are there
 * already). A device backend owns the copies; the mapped file stays the source. */
static int river__place(river_t *r, backend_t *be)
{
    int e;
    for (int l = r->start_layer; l < r->n_layers; l++) {
        layer_weights_t *lw = &r->layers[l];
        weight_t *mats[] = {&lw->wq, &lw->wk, &lw->wv, &lw->wo, &lw->w_gate, &lw->w_up,
                            &lw->w_down};
        for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++)
            if ((e = be->ops->weight_upload(be->ctx, mats[i])))
                return e;
    }
    return be->ops->weight_upload(be->ctx, &r->head);
}

/* A metadata integer: the whole string must be a decimal number within [min, max]. */
static int river_meta_int(const safetensors_t *f, const char *key, long min, long max,
                          int *out)
{
    const char *path = safetensors_path(f);
    const char *s = safetensors_metadata(f, key);
    if (!s)
        return river_err_set(RIVER_EFORMAT, "%s: river metadata lacks '%s'", path, key);
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < min || v > max)
        return river_err_set(RIVER_EFORMAT, "%s: river metadata '%s' is '%s'; expected an "
                             "integer in %ld..%ld", path, key, s, min, max);
    *out = (int)v;
    return 0;
}

/* The fp16 array t->data as a 2-byte aligned pointer: in place when it already is (always
 * for files river_build wrote unless an odd-sized code tensor precedes it), else a copy. */
static int river_f16_ptr(river_t *r, const safetensors_tensor_t *t, const uint16_t **out)
{
    if (((uintptr_t)t->data & 1) == 0) {
        *out = t->data;
        return 0;
    }
    void **owned = realloc(r->owned, sizeof *owned * (size_t)(r->n_owned + 1));
    if (!owned)
        return river_err_set(RIVER_ENOMEM, "%s: %s", safetensors_path(r->file), t->name);
    r->owned = owned;
    void *copy = malloc(t->nbytes ? t->nbytes : 1);
    if (!copy)
        return river_err_set(RIVER_ENOMEM, "%s: %s", safetensors_path(r->file), t->name);
    memcpy(copy, t->data, t->nbytes);
    r->owned[r->n_owned++] = copy;
    *out = copy;
    return 0;
}

/* The tensor layers.<l>.<mat>.<part>, checked for dtype and shape (rows, cols). */
static int river_tensor(const river_t *r, int l, int mat, const char *part,
                        safetensors_dtype_t dt, int64_t rows, int64_t cols,
                        const safetensors_tensor_t **out)
{
    const char *path = safetensors_path(r->file);
    char name[96];
    river_tensor_name(name, sizeof name, l, mat, part);
    const safetensors_tensor_t *t = safetensors_find(r->file, name);
    if (!t)
        return river_err_set(RIVER_ENOTFOUND, "%s: river tensor '%s' is missing", path, name);
    if (t->dtype != dt)
        return river_err_set(RIVER_EDTYPE, "%s: river tensor '%s' has dtype %s; expected %s",
                             path, name, t->dtype_str, safetensors_dtype_name(dt));
    if (t->n_dims != 2 || t->shape[0] != rows || t->shape[1] != cols)
        return river_err_set(RIVER_ESHAPE, "%s: river tensor '%s' does not have the shape "
                             "[%lld, %lld] that the model's matrix needs", path, name,
                             (long long)rows, (long long)cols);
    *out = t;
    return 0;
}

static int river_load_layer(river_t *r, const model_t *m, int l)
{
    const char *path = safetensors_path(r->file);
    layer_weights_t *L = &r->layers[l];
    /* Norms and biases are the backbone's own, full precision. */
    *L = m->layers[l];
    for (int i = 0; i < RIVER_N_MATRICES; i++) {
        const weight_t *src = river_mat(&m->layers[l], i);
        if (src->cols % r->group != 0)
            return river_err_set(RIVER_EFORMAT, "%s: group size %d does not divide the %lld "
                                 "columns of layer %d %s", path, r->group,
                                 (long long)src->cols, l, river_matrices[i].name);
        dtype_t dt = r->bits == 4 ? DTYPE_Q4 : DTYPE_Q8;
        int64_t ng = src->cols / r->group;
        const safetensors_tensor_t *codes, *scales, *zeros;
        int err;
        if ((err = river_tensor(r, l, i, "codes", SAFETENSORS_U8, src->rows,
                                (int64_t)dtype_row_bytes(dt, src->cols), &codes)) ||
            (err = river_tensor(r, l, i, "scales", SAFETENSORS_F16, src->rows, ng, &scales)) ||
            (err = river_tensor(r, l, i, "zeros", SAFETENSORS_F16, src->rows, ng, &zeros)))
            return err;
        weight_t *w = river_mat_mut(L, i);
        *w = (weight_t){.dtype = dt, .rows = src->rows, .cols = src->cols,
                        .data = codes->data, .group = r->group};
        if ((err = river_f16_ptr(r, scales, &w->scales)) ||
            (err = river_f16_ptr(r, zeros, &w->zeros)))
            return err;
    }
    return 0;
}

/* The optional quantized LM head, checked like a layer matrix. */
static int river_load_head(river_t *r, const model_t *m)
{
    const char *path = safetensors_path(r->file);
    int bits, err;
    if ((err = river_meta_int(r->file, "head_bits", 4, 8, &bits)))
        return err;
    if (bits != 4 && bits != 8)
        return river_err_set(RIVER_EFORMAT, "%s: LM head of %d bits; only 4 and 8 exist", path,
                             bits);
    const weight_t *src = &m->lm_head;
    dtype_t dt = bits == 4 ? DTYPE_Q4 : DTYPE_Q8;
    int64_t ng = src->cols / r->group;
    struct {
        const char *name;
        safetensors_dtype_t dt;
        int64_t cols;
        const safetensors_tensor_t *t;
    } parts[] = {{"lm_head.codes", SAFETENSORS_U8, (int64_t)dtype_row_bytes(dt, src->cols), NULL},
                 {"lm_head.scales", SAFETENSORS_F16, ng, NULL},
                 {"lm_head.zeros", SAFETENSORS_F16, ng, NULL}};
    for (size_t i = 0; i < 3; i++) {
        const safetensors_tensor_t *t = safetensors_find(r->file, parts[i].name);
        if (!t)
            return river_err_set(RIVER_ENOTFOUND, "%s: river tensor '%s' is missing", path,
                                 parts[i].name);
        if (t->dtype != parts[i].dt || t->n_dims != 2 || t->shape[0] != src->rows ||
            t->shape[1] != parts[i].cols)
            return river_err_set(RIVER_ESHAPE, "%s: river tensor '%s' is not %s [%lld, %lld]",
                                 path, parts[i].name, safetensors_dtype_name(parts[i].dt),
                                 (long long)src->rows, (long long)parts[i].cols);
        parts[i].t = t;
    }
    r->head = (weight_t){.dtype = dt, .rows = src->rows, .cols = src->cols,
                         .data = parts[0].t->data, .group = r->group};
    if ((err = river_f16_ptr(r, parts[1].t, &r->head.scales)) ||
        (err = river_f16_ptr(r, parts[2].t, &r->head.zeros)))
        return err;
    return 0;
}

int river_load(river_t **out, const model_t *m, const char *path)
{
    river_t *r = calloc(1, sizeof *r);
    if (!r)
        return river_err_set(RIVER_ENOMEM, "%s: river", path);
    int err = safetensors_open(&r->file, path);
    if (err)
        goto fail;
    const char *format = safetensors_metadata(r->file, "format");
    if (!format || strcmp(format, RIVER_FORMAT) != 0) {
        err = river_err_set(RIVER_EFORMAT, "%s: not a river file (metadata format is %s%s%s)",
                            path, format ? "'" : "", format ? format : "absent",
                            format ? "'" : "");
        goto fail;
    }
    const char *version = safetensors_metadata(r->file, "format_version");
    if (!version || strcmp(version, RIVER_FORMAT_VERSION) != 0) {
        err = river_err_set(RIVER_EUNSUPPORTED, "%s: river format version %s; this build "
                            "reads version %s", path, version ? version : "(absent)",
                            RIVER_FORMAT_VERSION);
        goto fail;
    }
    /* The fingerprint comes before any shape check: a river of another model would
     * otherwise fail with a confusing shape error, or, worse, load. */
    char mine[RIVER_FINGERPRINT_LEN];
    const char *theirs = safetensors_metadata(r->file, "fingerprint");
    if ((err = river_fingerprint(m, mine)))
        goto fail;
    if (!theirs) {
        err = river_err_set(RIVER_EFORMAT, "%s: river metadata lacks 'fingerprint'", path);
        goto fail;
    }
    if (strcmp(theirs, mine) != 0) {
        const char *src = safetensors_metadata(r->file, "source");
        err = river_err_set(RIVER_EINVAL, "%s: this river was built from a different model "
                            "(%s, fingerprint %.32s) than %s (fingerprint %s); rebuild it with "
                            "`river quant --model %s`", path, src ? src : "unknown", theirs,
                            m->path, mine, m->path);
        goto fail;
    }
    memcpy(r->fingerprint, mine, sizeof mine);
    int bits;
    if ((err = river_meta_int(r->file, "n_layers", 1, INT_MAX, &r->n_layers)) ||
        (err = river_meta_int(r->file, "start_layer", 0, INT_MAX, &r->start_layer)) ||
        (err = river_meta_int(r->file, "bits", 4, 8, &bits)) ||
        (err = river_meta_int(r->file, "group", 1, INT_MAX, &r->group)))
        goto fail;
    if (bits != 4 && bits != 8) {
        err = river_err_set(RIVER_EFORMAT, "%s: river of %d bits; only 4 and 8 exist", path,
                            bits);
        goto fail;
    }
    r->bits = bits;
    if (r->n_layers != m->cfg.n_layers || r->start_layer >= r->n_layers) {
        err = river_err_set(RIVER_EFORMAT, "%s: river covers layers %d..%d of %d; %s has %d",
                            path, r->start_layer, r->n_layers - 1, r->n_layers, m->path,
                            m->cfg.n_layers);
        goto fail;
    }
    const char *method = safetensors_metadata(r->file, "method");
    if (!method || quant_method_parse(method, &r->method) != 0) {
        err = river_err_set(RIVER_EFORMAT, "%s: river metadata 'method' is %s; expected hqq "
                            "or rtn", path, method ? method : "absent");
        goto fail;
    }
    r->layers = calloc((size_t)r->n_layers, sizeof *r->layers);
    if (!r->layers) {
        err = river_err_set(RIVER_ENOMEM, "%s: %d layers", path, r->n_layers);
        goto fail;
    }
    for (int l = r->start_layer; l < r->n_layers; l++)
        if ((err = river_load_layer(r, m, l)))
            goto fail;
    if (safetensors_metadata(r->file, "head_bits") && (err = river_load_head(r, m)))
        goto fail;
    if (m->backend && (err = river__place(r, m->backend)))
        goto fail;
    *out = r;
    return 0;

fail:
    river_destroy(&r);
    return err;
}

void river_destroy(river_t **pr)
{
    river_t *r = *pr;
    if (!r)
        return;
    safetensors_destroy(&r->file);
    for (int i = 0; i < r->n_owned; i++)
        free(r->owned[i]);
    free(r->owned);
    free(r->layers);
    free(r);
    *pr = NULL;
}

int river_start_layer(const river_t *r)
{
    return r->start_layer;
}

int river_bits(const river_t *r)
{
    return r->bits;
}

int river_group(const river_t *r)
{
    return r->group;
}

quant_method_t river_method(const river_t *r)
{
    return r->method;
}

const char *river_path(const river_t *r)
{
    return safetensors_path(r->file);
}

const char *river_fingerprint_of(const river_t *r)
{
    return r->fingerprint;
}

const layer_weights_t *river_layer(const river_t *r, int layer)
{
    if (!r || layer < r->start_layer || layer >= r->n_layers)
        return NULL;
    return &r->layers[layer];
}

const weight_t *river_head(const river_t *r)
{
    return r && r->head.data ? &r->head : NULL;
}
