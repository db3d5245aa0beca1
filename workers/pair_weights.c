/* The split pair's memory: which weights each side releases, and what of the checkpoint
 * stays resident (workers/pair.h). */
#include "workers/pair.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "common/err.h"
#include "kernels/backend.h"

const char *pair_backend_name(const backend_t *be)
{
    static char name[96];
    /* The kind and the variant (the CPU's SIMD level): both halves must run the same
     * kernels for the deep layers to give the same floats as one process would. */
    return backend_describe(be, name, sizeof name);
}

/* Through the backend that holds the weights (on the CPU: the mapped file's pages are
 * dropped). Release is advice: a failure leaves the weights resident, which costs memory,
 * not results, so errors are not reported. */
static void pair__release(const model_t *m, const weight_t *w)
{
    const backend_t *be = m->backend;
    if (be)
        (void)be->ops->weight_residency(be->ctx, w, 0);
}

void pair_release_weights(const model_t *m, int begin, int end, bool ends)
{
    for (int l = begin < 0 ? 0 : begin; l < end && l < m->cfg.n_layers; l++) {
        const layer_weights_t *w = &m->layers[l];
        const weight_t *mats[] = {&w->wq, &w->wk, &w->wv, &w->wo, &w->w_gate, &w->w_up,
                                  &w->w_down};
        for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++)
            pair__release(m, mats[i]);
    }
    if (ends) {
        pair__release(m, &m->embed);
        pair__release(m, &m->lm_head);
    }
}

/* Whether [lo, hi) holds the data of one of m's matrices. */
static int pair__holds_matrix(const model_t *m, uintptr_t lo, uintptr_t hi)
{
    const weight_t *ends[] = {&m->embed, &m->lm_head};
    for (size_t i = 0; i < sizeof ends / sizeof ends[0]; i++)
        if ((uintptr_t)ends[i]->data >= lo && (uintptr_t)ends[i]->data < hi)
            return 1;
    for (int l = 0; l < m->cfg.n_layers; l++) {
        const layer_weights_t *w = &m->layers[l];
        const weight_t *mats[] = {&w->wq, &w->wk, &w->wv, &w->wo, &w->w_gate, &w->w_up,
                                  &w->w_down};
        for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++)
            if ((uintptr_t)mats[i]->data >= lo && (uintptr_t)mats[i]->data < hi)
                return 1;
    }
    return 0;
}

int64_t pair_model_resident_bytes(const model_t *m)
{
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f)
        return river_err_set(RIVER_ESYS, "/proc/self/smaps: %s", strerror(errno));
    /* The model's mappings are those that hold one of its matrices: the checkpoint's files
     * (a sharded model has several, each mapped once) and the copies a host backend made
     * at placement (one mapping per matrix on the CPU). */
    char line[4096];
    int64_t total = 0;
    int in_model = 0;
    while (fgets(line, sizeof line, f)) {
        uintptr_t lo, hi;
        int name_at = 0;
        if (sscanf(line, "%" SCNxPTR "-%" SCNxPTR " %*s %*s %*s %*s %n", &lo, &hi,
                   &name_at) == 2 && name_at > 0) {
            in_model = pair__holds_matrix(m, lo, hi);
            continue;
        }
        long kb;
        if (in_model && sscanf(line, "Rss: %ld kB", &kb) == 1)
            total += (int64_t)kb * 1024;
    }
    fclose(f);
    return total;
}

