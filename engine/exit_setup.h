/* Everything an exit policy needs besides the policy itself, opened from files: the Exit
 * River (exitriver_load) and the TIDE routers (router_set_load), wired into an exit_config_t
 * for forward_set_exit / gen_set_exit. Used by `river run`, `river eval` and river-worker. */
#ifndef RIVER_ENGINE_EXIT_SETUP_H
#define RIVER_ENGINE_EXIT_SETUP_H

#include "engine/exit.h"
#include "model/model.h"

typedef struct exitriver exitriver_t;
typedef struct router_set router_set_t;

typedef struct exit_setup {
    exit_config_t cfg;
    exitriver_t *river;
    router_set_t *routers;
    const layer_weights_t **layers; /* (n_layers) river layers, NULL below the start */
} exit_setup_t;

/* Opens the river and routers named for model m (river NULL: the default river beside the
 * model when the policy needs one and `river quant` wrote it there; routers NULL: none)
 * and checks that the policy
 * has what it needs: a rule other than none with the river strategy needs a river, the
 * router rule needs routers, a fixed exit layer must be in 1..n_layers. On failure
 * nothing stays open. */
int exit_setup_open(exit_setup_t *xs, const exit_policy_t *policy, const char *river_path,
                    const char *routers_path, const model_t *m);
void exit_setup_close(exit_setup_t *xs);

#endif
