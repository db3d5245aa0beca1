#include "cli/bench_spec.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/err.h"
#include "engine/exit_setup.h"
#include "engine/forward.h"
#include "engine/generate.h"
#include "engine/spec_cost.h"

static double bs__now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int bs__cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median seconds of `runs` forward steps of n rows at positions ctx..ctx+n-1. */
static int bs__time(forward_t *f, kv_pool_t *kv, const int32_t *pages, int ctx, int n,
                    int runs, float *logits, double *secs)
{
    int32_t tok[GEN_DRAFT_MAX + 1], pos[GEN_DRAFT_MAX + 1], rows[GEN_DRAFT_MAX + 1];
    const int32_t *tab[GEN_DRAFT_MAX + 1];
    for (int i = 0; i < n; i++) {
        tok[i] = (int32_t)(7 + 13 * i);
        pos[i] = ctx + i;
        rows[i] = i;
        tab[i] = pages;
    }
    fwd_batch_t b = {.n = n, .tokens = tok, .pos = pos, .page_table = tab, .n_logits = n,
                     .logit_rows = rows};
    double *t = malloc(sizeof *t * (size_t)runs);
    if (!t)
        return river_err_set(RIVER_ENOMEM, "bench: timings");
    int e = 0;
    for (int r = 0; r < runs && !e; r++) {
        double t0 = bs__now();
        e = forward_step(f, kv, &b, logits);
        t[r] = bs__now() - t0;
    }
    if (!e) {
        qsort(t, (size_t)runs, sizeof *t, bs__cmp);
        *secs = runs % 2 ? t[runs / 2] : 0.5 * (t[runs / 2 - 1] + t[runs / 2]);
    }
    free(t);
    return e;
}

int bench_spec_costs(cli_env_t *env, const char *river_path, int exit_layer, int k_max,
                     int ctx, int runs, int json)
{
    const model_t *m = env->model;
    const model_config_t *c = &m->cfg;
    int L = c->n_layers;
    if (k_max < 1 || k_max > GEN_DRAFT_MAX)
        return cli_fail("bench", river_err_set(RIVER_EINVAL, "--draft %d outside 1..%d", k_max,
                                               GEN_DRAFT_MAX));
    if (exit_layer <= 0)
        exit_layer = L / 2;
    if (ctx + k_max + 1 > c->max_seq_len)
        return cli_fail("bench", river_err_set(RIVER_EINVAL, "--prompt-len %d with --draft %d "
                                               "exceeds the context of %d", ctx, k_max,
                                               c->max_seq_len));
    exit_setup_t xs;
    exit_policy_t pol = {.rule = EXIT_RULE_FIXED, .exit_layer = exit_layer, .kv = EXIT_KV_RIVER};
    int e = exit_setup_open(&xs, &pol, river_path, NULL, m);
    if (e)
        return cli_fail("bench", e);
    forward_t *f = NULL;
    kv_pool_t *kv = NULL;
    kv_seq_t seq;
    kv_seq_init(&seq);
    int rows = k_max + 1 > 64 ? k_max + 1 : 64;
    float *logits = malloc(sizeof *logits * (size_t)rows * (size_t)c->vocab_size);
    double t_plain = 0, t_draft = 0, t_verify[GEN_DRAFT_MAX + 1] = {0};
    e = logits ? forward_new(&f, m, env->be, rows)
               : river_err_set(RIVER_ENOMEM, "bench: logits");
    int pages = (ctx + k_max + 1 + 15) / 16 + 1;
    if (!e)
        e = kv_pool_new(&kv, env->be, L, c->n_kv_heads * c->head_dim, 16, pages);
    if (!e)
        e = kv_seq_reserve(&seq, kv, ctx + k_max + 1);
    /* The context: ctx positions prefilled in chunks (values do not matter for timing, but
     * attention reads ctx slots per row as in a real decode). */
    for (int p0 = 0; !e && p0 < ctx; p0 += rows) {
        int n = ctx - p0 < rows ? ctx - p0 : rows;
        int32_t *tok = malloc(sizeof *tok * (size_t)n), *pos = malloc(sizeof *pos * (size_t)n);
        const int32_t **tab = malloc(sizeof *tab * (size_t)n);
        if (!tok || !pos || !tab)
            e = river_err_set(RIVER_ENOMEM, "bench: prefill");
        for (int i = 0; !e && i < n; i++) {
            tok[i] = (int32_t)((p0 + i) * 31 % c->vocab_size);
            pos[i] = p0 + i;
            tab[i] = seq.pages;
        }
        fwd_batch_t b = {.n = n, .tokens = tok, .pos = pos, .page_table = tab};
        if (!e)
            e = forward_step(f, kv, &b, NULL);
        free(tok);
        free(pos);
        free(tab);
    }
    /* Warm-up of both weight sets, untimed. */
    if (!e)
        e = bs__time(f, kv, seq.pages, ctx, 1, 3, logits, &t_plain);
    if (!e)
        e = bs__time(f, kv, seq.pages, ctx, 1, runs, logits, &t_plain);
    if (!e)
        e = forward_set_exit(f, &xs.cfg);
    if (!e)
        e = bs__time(f, kv, seq.pages, ctx, 1, 3, logits, &t_draft);
    if (!e)
        e = bs__time(f, kv, seq.pages, ctx, 1, runs, logits, &t_draft);
    if (!e)
        e = forward_set_exit(f, NULL);
    for (int k = 1; !e && k <= k_max; k++)
        e = bs__time(f, kv, seq.pages, ctx, k + 1, runs, logits, &t_verify[k]);
    static const double alphas[] = {0.8, 0.9, 0.95, 0.98};
    if (!e && json) {
        printf("{\"plain_step_ms\":%.4f,\"draft_step_ms\":%.4f,\"exit_layer\":%d,\"layers\":%d,"
               "\"context\":%d,\"verify_ms\":[", t_plain * 1e3, t_draft * 1e3, exit_layer, L,
               ctx);
        for (int k = 1; k <= k_max; k++)
            printf("%s{\"k\":%d,\"ms\":%.4f}", k > 1 ? "," : "", k, t_verify[k] * 1e3);
        printf("],\"predicted\":[");
        for (size_t a = 0; a < 4; a++) {
            double best;
            int kb = spec_pick_k(alphas[a], k_max, t_plain, t_draft, t_verify, &best);
            printf("%s{\"acceptance\":%.2f,\"best_k\":%d,\"speedup\":%.3f,\"by_k\":[",
                   a ? "," : "", alphas[a], kb, best);
            for (int k = 1; k <= k_max; k++)
                printf("%s%.3f", k > 1 ? "," : "",
                       spec_speedup(alphas[a], k, t_plain, t_draft, t_verify[k]));
            printf("]}");
        }
        printf("]}\n");
    } else if (!e) {
        printf("context %d, %d layers, draft leaves the backbone after %d (then the river)\n"
               "plain decode step %.3f ms, draft step %.3f ms (%.2f of plain)\n"
               "%3s %11s %11s   predicted speed-up at acceptance\n%3s %11s %11s", ctx, L,
               exit_layer, t_plain * 1e3, t_draft * 1e3, t_draft / t_plain, "k", "verify_ms",
               "vs_plain", "", "", "");
        for (size_t a = 0; a < 4; a++)
            printf(" %7.2f", alphas[a]);
        printf("\n");
        for (int k = 1; k <= k_max; k++) {
            printf("%3d %11.3f %11.2f", k, t_verify[k] * 1e3, t_verify[k] / t_plain);
            for (size_t a = 0; a < 4; a++)
                printf(" %7.2f", spec_speedup(alphas[a], k, t_plain, t_draft, t_verify[k]));
            printf("\n");
        }
        printf("best k:                    ");
        for (size_t a = 0; a < 4; a++) {
            double best;
            int kb = spec_pick_k(alphas[a], k_max, t_plain, t_draft, t_verify, &best);
            printf(" %3d@%.2f", kb, best);
        }
        printf("\n");
    }
    kv_seq_free(&seq, kv);
    kv_pool_destroy(&kv);
    forward_destroy(&f);
    free(logits);
    exit_setup_close(&xs);
    return e ? cli_fail("bench", e) : 0;
}
