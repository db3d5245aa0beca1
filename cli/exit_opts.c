#include "cli/exit_opts.h"

#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "common/err.h"
#include "engine/river.h"
#include "engine/router.h"

void exit_opts_init(exit_opts_t *xo)
{
    memset(xo, 0, sizeof *xo);
    xo->policy.rule = EXIT_RULE_NONE;
    xo->policy.tau = 0.9f;
    xo->policy.theta = 0.5f;
    xo->policy.agg = EXIT_AGG_MIN;
    xo->policy.kv = EXIT_KV_RIVER;
    xo->policy.split_cost_model = 1;
}

int exit_opts_parse(exit_opts_t *xo, int c, const char *arg)
{
    double v;
    long k;
    switch (c) {
    case EXIT_OPT_POLICY: {
        int r = exit_rule_parse(arg);
        if (r < 0)
            return -1;
        xo->policy.rule = (exit_rule_t)r;
        xo->policy_given = 1;
        return 1;
    }
    case EXIT_OPT_TAU:
        if (cli_parse_float(arg, &v))
            return -1;
        xo->policy.tau = (float)v;
        return 1;
    case EXIT_OPT_THETA:
        if (cli_parse_float(arg, &v) || v < 0 || v > 1)
            return -1;
        xo->policy.theta = (float)v;
        return 1;
    case EXIT_OPT_EXIT_LAYER:
        if (cli_parse_int(arg, 1, 1 << 16, &k))
            return -1;
        xo->policy.exit_layer = (int)k;
        return 1;
    case EXIT_OPT_STRATEGY: {
        int r = exit_kv_parse(arg);
        if (r < 0)
            return -1;
        xo->policy.kv = (exit_kv_t)r;
        return 1;
    }
    case EXIT_OPT_AGGREGATION:
        if (!strcmp(arg, "min"))
            xo->policy.agg = EXIT_AGG_MIN;
        else if (!strcmp(arg, "row"))
            xo->policy.agg = EXIT_AGG_ROW;
        else
            return -1;
        return 1;
    case EXIT_OPT_RIVER: xo->river_path = arg; return 1;
    case EXIT_OPT_ROUTERS: xo->routers_path = arg; return 1;
    case EXIT_OPT_NO_COST_MODEL: xo->policy.split_cost_model = 0; return 1;
    }
    return 0;
}

void exit_opts_set_value(exit_policy_t *p, double v)
{
    switch (p->rule) {
    case EXIT_RULE_COSINE: p->tau = (float)v; break;
    case EXIT_RULE_ROUTER: p->theta = (float)v; break;
    case EXIT_RULE_FIXED: p->exit_layer = (int)v; break;
    case EXIT_RULE_NONE: break;
    }
}

int exit_ctx_open(exit_ctx_t *xc, const exit_opts_t *xo, const model_t *m)
{
    memset(xc, 0, sizeof *xc);
    xc->cfg.policy = xo->policy;
    xc->cfg.river_start = 1;
    int e = 0;
    int L = m->cfg.n_layers;
    if (xo->river_path) {
        e = river_load(&xc->river, m, xo->river_path);
        if (e)
            goto fail;
        xc->layers = calloc((size_t)L, sizeof *xc->layers);
        if (!xc->layers) {
            e = river_err_set(RIVER_ENOMEM, "river layer table");
            goto fail;
        }
        for (int l = 0; l < L; l++)
            xc->layers[l] = river_layer(xc->river, l);
        xc->cfg.river = xc->layers;
        xc->cfg.river_start = river_start_layer(xc->river);
        xc->cfg.river_head = river_head(xc->river);
    }
    if (xo->routers_path) {
        e = router_set_load(&xc->routers, m, xo->routers_path);
        if (e)
            goto fail;
        xc->cfg.router.user = xc->routers;
        xc->cfg.router.is_checkpoint = router_set_is_checkpoint_cb;
        xc->cfg.router.prob = router_prob_cb;
    }
    const exit_policy_t *p = &xo->policy;
    if (p->rule != EXIT_RULE_NONE && p->kv == EXIT_KV_RIVER && !xc->river) {
        e = river_err_set(RIVER_EINVAL, "policy %s with the river strategy needs --river FILE "
                          "(build one with `river quant`)", exit_rule_name(p->rule));
        goto fail;
    }
    if (p->rule == EXIT_RULE_ROUTER && !xc->routers) {
        e = river_err_set(RIVER_EINVAL, "policy router needs --routers FILE (train them with "
                          "`river calibrate`)");
        goto fail;
    }
    if (p->rule == EXIT_RULE_FIXED && (p->exit_layer < 1 || p->exit_layer > L)) {
        e = river_err_set(RIVER_EINVAL, "policy fixed needs --exit-layer K with 1 <= K <= %d", L);
        goto fail;
    }
    return 0;
fail:
    exit_ctx_close(xc);
    return e;
}

void exit_ctx_close(exit_ctx_t *xc)
{
    if (xc->river)
        river_destroy(&xc->river);
    if (xc->routers)
        router_set_destroy(&xc->routers);
    free(xc->layers);
    xc->layers = NULL;
}
