/* The Exit River file at run time: its default name, and mapping it back and checking it
 * against its model (exitriver_load). See exitriver.h for the format; the builder is
 * offline/exitriver_build.c. */
#include "engine/exitriver.h"

#include <errno.h>
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/err.h"
#include "kernels/backend.h"
#include "model/fingerprint.h"
#include "model/safetensors.h"

/* The matrices of a layer that the river quantizes, by their layer_weights_t field. */
typedef struct exitriver_matrix {
    const char *name;
    size_t offset;
} exitriver_matrix_t;

static const exitriver_matrix_t exitriver_matrices[] = {
    {"wq", offsetof(layer_weights_t, wq)},         {"wk", offsetof(layer_weights_t, wk)},
    {"wv", offsetof(layer_weights_t, wv)},         {"wo", offsetof(layer_weights_t, wo)},
    {"w_gate", offsetof(layer_weights_t, w_gate)}, {"w_up", offsetof(layer_weights_t, w_up)},
    {"w_down", offsetof(layer_weights_t, w_down)},
};
_Static_assert(sizeof exitriver_matrices / sizeof exitriver_matrices[0] ==
               EXITRIVER_N_MATRICES, "one name per river matrix");

const char *exitriver_matrix_name(int i)
{
    return exitriver_matrices[i].name;
}

const weight_t *exitriver_matrix(const layer_weights_t *L, int i)
{
    return (const weight_t *)((const char *)L + exitriver_matrices[i].offset);
}

static weight_t *exitriver_mat_mut(layer_weights_t *L, int i)
{
    return (weight_t *)((char *)L + exitriver_matrices[i].offset);
}

/* ---- paths ---- */

int exitriver_default_path(const model_t *m, const quant_params_t *p, char *buf, size_t cap)
{
    char tail[64];
    snprintf(tail, sizeof tail, "river-q%d-g%d-%s.safetensors", p->bits, p->group,
             quant_method_name(p->method));
    int n;
    if (m->is_gguf) {
        /* model.gguf -> model.river-q4-g64-hqq.safetensors, beside it. */
        size_t len = strlen(m->path);
        int stem = len > 5 && !strcasecmp(m->path + len - 5, ".gguf") ? (int)len - 5 : (int)len;
        n = snprintf(buf, cap, "%.*s.%s", stem, m->path, tail);
    } else if (m->is_llama2c) {
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

void exitriver_tensor_name(char *buf, size_t cap, int layer, int mat, const char *part)
{
    snprintf(buf, cap, "layers.%d.%s.%s", layer, exitriver_matrices[mat].name, part);
}


/* ---- loading ---- */

struct exitriver {
    safetensors_t *file;
    int start_layer;
    int n_layers;
    int bits;
    int group;
    quant_method_t method;
    char fingerprint[MODEL_FINGERPRINT_LEN];
    layer_weights_t *layers; /* (n_layers); entries below start_layer stay zeroed */
    weight_t head;           /* quantized LM head; data NULL when the river has none */
    void **owned;            /* (n_owned) realigned copies of scales and zeros */
    int n_owned;
};

/* The river goes where its model is: its quantized matrices and head are placed on the
 * model's backend (norms and biases were copied from the placed model, so they are there
 * already). A device backend owns the copies; the mapped file stays the source. */
static int exitriver__place(exitriver_t *r, backend_t *be)
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
static int exitriver_meta_int(const safetensors_t *f, const char *key, long min, long max,
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

/* Whether codes of `bits` bits in r's groups are a layout this build reads: 2, 3 (groups of
 * a multiple of 16), 4 or 8 bits. */
static int exitriver_bits_check(const exitriver_t *r, int bits, const char *what)
{
    quant_params_t p = quant_params_default();
    p.bits = bits;
    p.group = r->group;
    if (dtype_quant_of_bits(bits) == DTYPE_COUNT || quant_params_check(&p, 0, what) != 0)
        return river_err_set(RIVER_EFORMAT, "%s: %s of %d bits in groups of %d; this build "
                             "reads 2 and 3 bits (groups of a multiple of %d), 4 and 8",
                             safetensors_path(r->file), what, bits, r->group,
                             QUANT_LOWBIT_GROUP_UNIT);
    return 0;
}

/* The fp16 array t->data as a 2-byte aligned pointer: in place when it already is (always
 * for files exitriver_build wrote unless an odd-sized code tensor precedes it), else a copy. */
static int exitriver_f16_ptr(exitriver_t *r, const safetensors_tensor_t *t, const uint16_t **out)
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
static int exitriver_tensor(const exitriver_t *r, int l, int mat, const char *part,
                            safetensors_dtype_t dt, int64_t rows, int64_t cols,
                            const safetensors_tensor_t **out)
{
    const char *path = safetensors_path(r->file);
    char name[96];
    exitriver_tensor_name(name, sizeof name, l, mat, part);
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

static int exitriver_load_layer(exitriver_t *r, const model_t *m, int l)
{
    const char *path = safetensors_path(r->file);
    layer_weights_t *L = &r->layers[l];
    /* Norms and biases are the backbone's own, full precision. */
    *L = m->layers[l];
    for (int i = 0; i < EXITRIVER_N_MATRICES; i++) {
        const weight_t *src = exitriver_matrix(&m->layers[l], i);
        if (src->cols % r->group != 0)
            return river_err_set(RIVER_EFORMAT, "%s: group size %d does not divide the %lld "
                                 "columns of layer %d %s", path, r->group,
                                 (long long)src->cols, l, exitriver_matrices[i].name);
        dtype_t dt = dtype_quant_of_bits(r->bits);
        int64_t ng = src->cols / r->group;
        const safetensors_tensor_t *codes, *scales, *zeros;
        int err;
        if ((err = exitriver_tensor(r, l, i, "codes", SAFETENSORS_U8, src->rows,
                                    (int64_t)dtype_row_bytes(dt, src->cols), &codes)) ||
            (err = exitriver_tensor(r, l, i, "scales", SAFETENSORS_F16, src->rows, ng, &scales)) ||
            (err = exitriver_tensor(r, l, i, "zeros", SAFETENSORS_F16, src->rows, ng, &zeros)))
            return err;
        weight_t *w = exitriver_mat_mut(L, i);
        *w = (weight_t){.dtype = dt, .rows = src->rows, .cols = src->cols,
                        .data = codes->data, .group = r->group};
        if ((err = exitriver_f16_ptr(r, scales, &w->scales)) ||
            (err = exitriver_f16_ptr(r, zeros, &w->zeros)))
            return err;
    }
    return 0;
}

/* The optional quantized LM head, checked like a layer matrix. */
static int exitriver_load_head(exitriver_t *r, const model_t *m)
{
    const char *path = safetensors_path(r->file);
    int bits, err;
    if ((err = exitriver_meta_int(r->file, "head_bits", 2, 8, &bits)))
        return err;
    if ((err = exitriver_bits_check(r, bits, "LM head")))
        return err;
    const weight_t *src = &m->lm_head;
    dtype_t dt = dtype_quant_of_bits(bits);
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
    if ((err = exitriver_f16_ptr(r, parts[1].t, &r->head.scales)) ||
        (err = exitriver_f16_ptr(r, parts[2].t, &r->head.zeros)))
        return err;
    return 0;
}

int exitriver_load(exitriver_t **out, const model_t *m, const char *path)
{
    exitriver_t *r = calloc(1, sizeof *r);
    if (!r)
        return river_err_set(RIVER_ENOMEM, "%s: river", path);
    int err = safetensors_open(&r->file, path);
    if (err)
        goto fail;
    const char *format = safetensors_metadata(r->file, "format");
    if (!format || strcmp(format, EXITRIVER_FORMAT) != 0) {
        err = river_err_set(RIVER_EFORMAT, "%s: not a river file (metadata format is %s%s%s)",
                            path, format ? "'" : "", format ? format : "absent",
                            format ? "'" : "");
        goto fail;
    }
    const char *version = safetensors_metadata(r->file, "format_version");
    if (!version || strcmp(version, EXITRIVER_FORMAT_VERSION) != 0) {
        err = river_err_set(RIVER_EUNSUPPORTED, "%s: river format version %s; this build "
                            "reads version %s", path, version ? version : "(absent)",
                            EXITRIVER_FORMAT_VERSION);
        goto fail;
    }
    /* The fingerprint comes before any shape check: a river of another model would
     * otherwise fail with a confusing shape error, or, worse, load. */
    char mine[MODEL_FINGERPRINT_LEN];
    const char *theirs = safetensors_metadata(r->file, "fingerprint");
    if ((err = model_fingerprint(m, mine)))
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
    if ((err = exitriver_meta_int(r->file, "n_layers", 1, INT_MAX, &r->n_layers)) ||
        (err = exitriver_meta_int(r->file, "start_layer", 0, INT_MAX, &r->start_layer)) ||
        (err = exitriver_meta_int(r->file, "bits", 2, 8, &bits)) ||
        (err = exitriver_meta_int(r->file, "group", 1, INT_MAX, &r->group)) ||
        (err = exitriver_bits_check(r, bits, "river")))
        goto fail;
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
        if ((err = exitriver_load_layer(r, m, l)))
            goto fail;
    if (safetensors_metadata(r->file, "head_bits") && (err = exitriver_load_head(r, m)))
        goto fail;
    if (m->backend && (err = exitriver__place(r, m->backend)))
        goto fail;
    *out = r;
    return 0;

fail:
    exitriver_destroy(&r);
    return err;
}

void exitriver_destroy(exitriver_t **pr)
{
    exitriver_t *r = *pr;
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

int exitriver_start_layer(const exitriver_t *r)
{
    return r->start_layer;
}

int exitriver_bits(const exitriver_t *r)
{
    return r->bits;
}

int exitriver_group(const exitriver_t *r)
{
    return r->group;
}

quant_method_t exitriver_method(const exitriver_t *r)
{
    return r->method;
}

const char *exitriver_path(const exitriver_t *r)
{
    return safetensors_path(r->file);
}

const char *exitriver_fingerprint_of(const exitriver_t *r)
{
    return r->fingerprint;
}

const layer_weights_t *exitriver_layer(const exitriver_t *r, int layer)
{
    if (!r || layer < r->start_layer || layer >= r->n_layers)
        return NULL;
    return &r->layers[layer];
}

const weight_t *exitriver_head(const exitriver_t *r)
{
    return r && r->head.data ? &r->head : NULL;
}
