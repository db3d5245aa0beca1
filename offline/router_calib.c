/* Collecting TIDE calibration samples (router_calib.h): the text tokenised per document,
 * run through the frozen model in BOS-led windows, a layer hook keeping every checkpoint's
 * hidden state and its cosine to the last layer's. */
#include "offline/router_calib.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "engine/forward.h"
#include "engine/generate.h"
#include "engine/kv_pool.h"
#include "engine/router.h"

/* What the layer hook needs while one window runs. */
typedef struct calib_hook {
    router_calib_t *c;
    const int *slot;          /* (n_layers) checkpoint index of each layer, -1 where none */
    int last_layer;
    const int64_t *row_sample;/* (rows of the batch) sample index, -1 for BOS */
} calib_hook_t;

static void router_calib__hook(void *user, int layer, const float *hidden, int n, int dim)
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

static void router_calib__docs_free(calib_docs_t *d)
{
    for (size_t i = 0; i < d->n; i++)
        free(d->ids[i]);
    free(d->ids);
    free(d->len);
    memset(d, 0, sizeof *d);
}

static int router_calib__docs_push(calib_docs_t *d, int32_t *ids, size_t n)
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

static int router_calib__line_blank(const char *p, const char *end)
{
    for (; p < end && *p != '\n'; p++)
        if (*p != ' ' && *p != '\t' && *p != '\r')
            return 0;
    return 1;
}

/* Splits text at blank lines and encodes each document on its own, without special tokens
 * (the caller adds BOS per window). Stops once `enough` tokens are there (0: no limit). */
static int router_calib__tokenize(calib_docs_t *d, const tokenizer_t *tok, const char *text,
                                  size_t len, int64_t enough)
{
    const char *p = text, *end = text + len;
    while (p < end && (!enough || d->total < enough)) {
        /* Skip blank lines, then take lines up to the next blank one. */
        while (p < end && router_calib__line_blank(p, end)) {
            const char *nl = memchr(p, '\n', (size_t)(end - p));
            p = nl ? nl + 1 : end;
        }
        if (p >= end)
            break;
        const char *start = p, *stop = p;
        while (p < end && !router_calib__line_blank(p, end)) {
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
        e = router_calib__docs_push(d, ids, n);
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
static int router_calib__window(router_calib_t *c, forward_t *f, kv_pool_t *kv,
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
    int e = router_calib__tokenize(&docs, tok, text, len, o->max_tokens);
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
    if ((e = kv_pool_new(&kv, be, mc->n_layers, mc->n_kv_heads * mc->head_dim,
                         gen_kv_dtype(m, o->kv_dtype), page,
                         (window + page - 1) / page)))
        goto done;
    calib_hook_t hk = {.c = c, .slot = slot, .last_layer = mc->n_layers - 1};
    forward_set_layer_hook(f, router_calib__hook, &hk);
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
            e = router_calib__window(c, f, kv, &hk, row_sample, win, (int)take + has_bos,
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
    router_calib__docs_free(&docs);
    if (e)
        router_calib_destroy(&c);
    else
        *out = c;
    return e;
}

static int router_calib__cmp_float(const void *a, const void *b)
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
    qsort(v, cnt, sizeof *v, router_calib__cmp_float);
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
