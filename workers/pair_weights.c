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

int64_t pair_model_resident_bytes(const model_t *m)
{
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f)
        return river_err_set(RIVER_ESYS, "/proc/self/smaps: %s", strerror(errno));
    /* The checkpoint's mappings are those that hold a layer's weights; a sharded model
     * has several files, each mapped once. */
    char line[4096];
    int64_t total = 0;
    int in_model = 0;
    while (fgets(line, sizeof line, f)) {
        uintptr_t lo, hi;
        int name_at = 0;
        if (sscanf(line, "%" SCNxPTR "-%" SCNxPTR " %*s %*s %*s %*s %n", &lo, &hi,
                   &name_at) == 2 && name_at > 0) {
            in_model = 0;
            for (int l = 0; l < m->cfg.n_layers && !in_model; l++) {
                uintptr_t p = (uintptr_t)m->layers[l].wq.data;
                in_model = p >= lo && p < hi;
            }
            continue;
        }
        long kb;
        if (in_model && sscanf(line, "Rss: %ld kB", &kb) == 1)
            total += (int64_t)kb * 1024;
    }
    fclose(f);
    return total;
}

