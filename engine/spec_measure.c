/* Measuring the cost model of lossless mode (spec_cost.h): forward steps of the sizes a
 * lossless sequence runs, timed on the backend that will serve them. */
#include <stdlib.h>
#include <time.h>

#include "common/clock.h"
#include "common/err.h"
#include "engine/spec_cost.h"

static int sm__cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median seconds of `runs` forward steps of n rows at positions ctx..ctx+n-1, after one
 * untimed step (first touch of the weights). */
static int sm__time(forward_t *f, kv_pool_t *kv, const int32_t *pages, int ctx, int n,
                    int runs, float *logits, double *secs)
{
    int32_t tok[SPEC_K_MAX + 1], pos[SPEC_K_MAX + 1], rows[SPEC_K_MAX + 1];
    const int32_t *tab[SPEC_K_MAX + 1];
    for (int i = 0; i < n; i++) {
        tok[i] = (int32_t)(7 + 13 * i);
        pos[i] = ctx + i;
        rows[i] = i;
        tab[i] = pages;
    }
    fwd_batch_t b = {.n = n, .tokens = tok, .pos = pos, .page_table = tab, .n_logits = n,
                     .logit_rows = rows};
    double t[64];
    int e = forward_step(f, kv, &b, logits);
    for (int r = 0; r < runs && !e; r++) {
        double t0 = clock_now_s();
        e = forward_step(f, kv, &b, logits);
        t[r] = clock_now_s() - t0;
    }
    if (!e) {
        qsort(t, (size_t)runs, sizeof *t, sm__cmp);
        *secs = runs % 2 ? t[runs / 2] : 0.5 * (t[runs / 2 - 1] + t[runs / 2]);
    }
    return e;
}

/* Writes positions 0..ctx-1 of the scratch sequence, so that each timed row attends to
 * ctx slots as a real decode row does (the values do not matter for timing). */
static int sm__context(forward_t *f, kv_pool_t *kv, const model_t *m, const int32_t *pages,
                       int ctx)
{
    int rows = forward_max_rows(f);
    int32_t *tok = malloc(sizeof *tok * (size_t)rows), *pos = malloc(sizeof *pos * (size_t)rows);
    const int32_t **tab = malloc(sizeof *tab * (size_t)rows);
    int e = tok && pos && tab ? 0 : river_err_set(RIVER_ENOMEM, "spec costs: context");
    for (int p0 = 0; !e && p0 < ctx; p0 += rows) {
        int n = ctx - p0 < rows ? ctx - p0 : rows;
        for (int i = 0; i < n; i++) {
            tok[i] = (int32_t)((p0 + i) * 31 % m->cfg.vocab_size);
            pos[i] = p0 + i;
            tab[i] = pages;
        }
        fwd_batch_t b = {.n = n, .tokens = tok, .pos = pos, .page_table = tab};
        e = forward_step(f, kv, &b, NULL);
    }
    free(tok);
    free(pos);
    free(tab);
    return e;
}

int spec_costs_measure(forward_t *f, const model_t *m, kv_pool_t *kv,
                       const exit_config_t *draft, int k_max, int ctx, int runs,
                       spec_costs_t *out)
{
    if (k_max < 1 || k_max > SPEC_K_MAX || k_max + 1 > forward_max_rows(f))
        return river_err_set(RIVER_EINVAL, "spec costs: draft length %d outside 1..%d (or "
                             "more rows than the forward's %d)", k_max, SPEC_K_MAX,
                             forward_max_rows(f));
    if (runs < 1 || runs > 64 || ctx < 0 || ctx + k_max + 1 > m->cfg.max_seq_len)
        return river_err_set(RIVER_EINVAL, "spec costs: %d runs at context %d (the model's "
                             "is %d)", runs, ctx, m->cfg.max_seq_len);
    float *logits = malloc(sizeof *logits * (size_t)(k_max + 1) * (size_t)m->cfg.vocab_size);
    if (!logits)
        return river_err_set(RIVER_ENOMEM, "spec costs: logits");
    kv_seq_t seq;
    kv_seq_init(&seq);
    spec_costs_t c = {.k_max = k_max};
    int e = kv_seq_reserve(&seq, kv, ctx + k_max + 1);
    if (!e)
        e = forward_set_exit(f, NULL);
    if (!e)
        e = sm__context(f, kv, m, seq.pages, ctx);
    if (!e)
        e = sm__time(f, kv, seq.pages, ctx, 1, runs, logits, &c.t_plain);
    for (int k = 1; !e && k <= k_max; k++)
        e = sm__time(f, kv, seq.pages, ctx, k + 1, runs, logits, &c.t_verify[k]);
    if (!e)
        e = forward_set_exit(f, draft);
    if (!e)
        e = sm__time(f, kv, seq.pages, ctx, 1, runs, logits, &c.t_draft);
    int e2 = forward_set_exit(f, NULL);
    kv_seq_free(&seq, kv);
    free(logits);
    if (!e && e2)
        e = e2;
    if (!e)
        *out = c;
    return e;
}
