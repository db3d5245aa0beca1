#include "cli/bench_spec.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "engine/exit_setup.h"
#include "engine/exitriver.h"
#include "engine/forward.h"
#include "engine/generate.h"
#include "engine/spec_cost.h"

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
    int rows = k_max + 1 > 64 ? k_max + 1 : 64;
    spec_costs_t sc = {0};
    e = forward_new(&f, m, env->be, rows);
    int pages = (ctx + k_max + 1 + 15) / 16 + 1;
    if (!e)
        e = kv_pool_new(&kv, env->be, L, c->n_kv_heads * c->head_dim,
                        gen_kv_dtype(m, cli_env_kv_dtype()), 16, pages);
    if (!e)
        e = spec_costs_measure(f, m, kv, &xs.cfg, k_max, ctx, runs, &sc);
    double t_plain = sc.t_plain, t_draft = sc.t_draft;
    /* What the bytes model predicts for the draft step against the plain one: the ratio a
     * memory-bound decode would show. */
    spec_bytes_t bp, bd;
    dtype_t kv_dt = gen_kv_dtype(m, cli_env_kv_dtype());
    spec_path_bytes(m, NULL, L, ctx + 1, kv_dt, &bp);
    spec_path_bytes(m, &xs.cfg, exit_layer, ctx + 1, kv_dt, &bd);
    int river_bits = xs.river ? exitriver_bits(xs.river) : 0;
    const double *t_verify = sc.t_verify;
    static const double alphas[] = {0.8, 0.9, 0.95, 0.98};
    if (!e && json) {
        printf("{\"plain_step_ms\":%.4f,\"draft_step_ms\":%.4f,\"plain_bytes\":%.0f,"
               "\"draft_bytes\":%.0f,\"draft_bytes_ratio\":%.4f,\"exit_layer\":%d,"
               "\"layers\":%d,\"context\":%d,\"river_bits\":%d,\"verify_ms\":[",
               t_plain * 1e3, t_draft * 1e3, bp.total, bd.total, bd.total / bp.total,
               exit_layer, L, ctx, river_bits);
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
        printf("context %d, %d layers, draft leaves the backbone after %d (then the %d-bit "
               "river)\n"
               "plain decode step %.3f ms, draft step %.3f ms (%.2f of plain)\n"
               "bytes a token reads: plain %.2f MB, draft %.2f MB (%.2f of plain; backbone "
               "layers %.2f, river layers %.2f, heads %.2f, KV %.2f)\n"
               "%3s %11s %11s   predicted speed-up at acceptance\n%3s %11s %11s", ctx, L,
               exit_layer, river_bits, t_plain * 1e3, t_draft * 1e3, t_draft / t_plain,
               bp.total / 1e6, bd.total / 1e6, bd.total / bp.total, bd.backbone_layers / 1e6,
               bd.river_layers / 1e6, bd.heads / 1e6, bd.kv / 1e6, "k", "verify_ms", "vs_plain",
               "", "", "");
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
    kv_pool_destroy(&kv);
    forward_destroy(&f);
    exit_setup_close(&xs);
    return e ? cli_fail("bench", e) : 0;
}
