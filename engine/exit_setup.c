/* Opening what an exit policy needs (exit_setup.h): the Exit River, found beside the model
 * when none is named, and the TIDE routers, placed where the model is. */
#include "engine/exit_setup.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/err.h"
#include "engine/exitriver.h"
#include "engine/router.h"

int exit_setup_open(exit_setup_t *xc, const exit_policy_t *policy, const char *river_path,
                    const char *routers_path, const model_t *m)
{
    memset(xc, 0, sizeof *xc);
    xc->cfg.policy = *policy;
    xc->cfg.river_start = 1;
    int e = 0;
    int L = m->cfg.n_layers;
    /* The river `river quant` writes by default, when none is named and one is needed. */
    char found[4096];
    if (!river_path && policy->rule != EXIT_RULE_NONE && policy->kv == EXIT_KV_RIVER) {
        quant_params_t qp = quant_params_default();
        if (exitriver_default_path(m, &qp, found, sizeof found) == 0 && access(found, R_OK) == 0)
            river_path = found;
    }
    if (river_path) {
        e = exitriver_load(&xc->river, m, river_path);
        if (e)
            goto fail;
        xc->layers = calloc((size_t)L, sizeof *xc->layers);
        if (!xc->layers) {
            e = river_err_set(RIVER_ENOMEM, "river layer table");
            goto fail;
        }
        for (int l = 0; l < L; l++)
            xc->layers[l] = exitriver_layer(xc->river, l);
        xc->cfg.river = xc->layers;
        xc->cfg.river_start = exitriver_start_layer(xc->river);
        xc->cfg.river_head = exitriver_head(xc->river);
    }
    if (routers_path) {
        e = router_set_load(&xc->routers, m, routers_path);
        if (e)
            goto fail;
        xc->cfg.router.user = xc->routers;
        xc->cfg.router.is_checkpoint = router_set_is_checkpoint_cb;
        xc->cfg.router.prob = router_prob_cb;
        /* On the backend the model is placed on, the rows are scored where they are. */
        if (m->backend) {
            if ((e = router_set_place(xc->routers, m->backend)))
                goto fail;
            xc->cfg.router.weights = router_set_weights_cb;
        }
    }
    const exit_policy_t *p = policy;
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
    exit_setup_close(xc);
    return e;
}

void exit_setup_close(exit_setup_t *xc)
{
    if (xc->river)
        exitriver_destroy(&xc->river);
    if (xc->routers)
        router_set_destroy(&xc->routers);
    free(xc->layers);
    xc->layers = NULL;
}
