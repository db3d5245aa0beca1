#include "engine/offload.h"

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "common/err.h"

struct offload {
    const model_t *m;
    double threshold;
    int64_t min_tokens;
    int64_t *hist;     /* (n_layers + 1) tokens by backbone depth */
    int64_t total;
    uint8_t *evicted;  /* (n_layers) */
    int64_t reloads;
};

int offload_new(offload_t **out, const model_t *m, double threshold, int64_t min_tokens)
{
    if (!(threshold > 0 && threshold < 1))
        return river_err_set(RIVER_EINVAL, "offload: threshold %g must be in (0, 1)",
                             threshold);
    if (!m->backend)
        return river_err_set(RIVER_ESTATE, "offload: %s is not placed on a backend "
                             "(model_place)", m->path);
    /* Asking for a layer that is in use to stay resident changes nothing, and tells whether
     * the backend can release weights at all before any decision depends on it. */
    const backend_t *be = m->backend;
    int e = be->ops->weight_residency(be->ctx, &m->layers[0].wq, 1);
    if (e)
        return e;
    offload_t *o = calloc(1, sizeof *o);
    if (!o)
        return river_err_set(RIVER_ENOMEM, "offload");
    o->hist = calloc((size_t)m->cfg.n_layers + 1, sizeof *o->hist);
    o->evicted = calloc((size_t)m->cfg.n_layers, 1);
    if (!o->hist || !o->evicted) {
        free(o->hist);
        free(o->evicted);
        free(o);
        return river_err_set(RIVER_ENOMEM, "offload: histogram");
    }
    o->m = m;
    o->threshold = threshold;
    o->min_tokens = min_tokens;
    *out = o;
    return 0;
}

void offload_destroy(offload_t **op)
{
    offload_t *o = *op;
    if (!o)
        return;
    for (int l = 0; l < o->m->cfg.n_layers; l++)
        offload_touch(o, l);
    free(o->hist);
    free(o->evicted);
    free(o);
    *op = NULL;
}

void offload_record(offload_t *o, int depth)
{
    int L = o->m->cfg.n_layers;
    o->hist[depth < 0 ? 0 : depth > L ? L : depth]++;
    o->total++;
}

double offload_reach(const offload_t *o, int layer)
{
    if (!o->total)
        return 1.0;
    int64_t reached = 0; /* a token of depth d ran layers 0..d-1 */
    for (int d = layer + 1; d <= o->m->cfg.n_layers; d++)
        reached += o->hist[d];
    return (double)reached / (double)o->total;
}

/* Releases (resident 0) or recalls a backbone layer's matrices through the backend that
 * holds them (on the CPU: advice on the mapped file's pages). */
static int offload__layer(const offload_t *o, int l, int resident)
{
    const backend_t *be = o->m->backend;
    const layer_weights_t *w = &o->m->layers[l];
    const weight_t *mats[] = {&w->wq, &w->wk, &w->wv, &w->wo, &w->w_gate, &w->w_up,
                              &w->w_down};
    for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++) {
        int e = be->ops->weight_residency(be->ctx, mats[i], resident);
        if (e)
            return e;
    }
    return 0;
}

int offload_update(offload_t *o, int *n_evicted)
{
    int n = 0;
    if (o->total >= o->min_tokens)
        for (int l = 0; l < o->m->cfg.n_layers; l++)
            if (!o->evicted[l] && offload_reach(o, l) < o->threshold) {
                int e = offload__layer(o, l, 0);
                if (e)
                    return e;
                o->evicted[l] = 1;
                n++;
            }
    if (n_evicted)
        *n_evicted = n;
    return 0;
}

void offload_touch(offload_t *o, int layer)
{
    if (layer < 0 || layer >= o->m->cfg.n_layers || !o->evicted[layer])
        return;
    /* A failed recall leaves the layer readable (released weights stay readable), so the
     * token still gets its layer, only more slowly. */
    (void)offload__layer(o, layer, 1);
    o->evicted[layer] = 0;
    o->reloads++;
}

int offload_is_evicted(const offload_t *o, int layer)
{
    return layer >= 0 && layer < o->m->cfg.n_layers && o->evicted[layer];
}

int64_t offload_reloads(const offload_t *o) { return o->reloads; }

int64_t offload_evicted_bytes(const offload_t *o)
{
    int64_t bytes = 0;
    for (int l = 0; l < o->m->cfg.n_layers; l++) {
        if (!o->evicted[l])
            continue;
        const layer_weights_t *w = &o->m->layers[l];
        const weight_t *mats[] = {&w->wq, &w->wk, &w->wv, &w->wo, &w->w_gate, &w->w_up,
                                  &w->w_down};
        for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++)
            bytes += (int64_t)dtype_row_bytes(mats[i]->dtype, mats[i]->cols) * mats[i]->rows;
    }
    return bytes;
}

int64_t offload_rss_bytes(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f)
        return river_err_set(RIVER_ESYS, "/proc/self/statm: cannot open");
    long size, resident;
    int n = fscanf(f, "%ld %ld", &size, &resident);
    fclose(f);
    if (n != 2)
        return river_err_set(RIVER_EFORMAT, "/proc/self/statm: unexpected content");
    return (int64_t)resident * sysconf(_SC_PAGESIZE);
}
