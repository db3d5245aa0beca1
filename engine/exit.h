/* Early-exit policies: when a token leaves the full-precision backbone, and what happens
 * to the layers it skips (docs/ARCHITECTURE.md, "The exit engine").
 *
 * One code path in the forward pass serves every policy. A rule decides per row after each
 * backbone layer; rows are aggregated into groups that exit together (a prefill chunk is
 * one group, decode rows are one group under EXIT_AGG_MIN and one group each under
 * EXIT_AGG_ROW); the KV strategy says what an exited row does in the remaining layers. */
#ifndef RIVER_ENGINE_EXIT_H
#define RIVER_ENGINE_EXIT_H

#include <stdint.h>

#include "model/model.h"

typedef enum {
    EXIT_RULE_NONE = 0, /* the full backbone */
    EXIT_RULE_COSINE,   /* cos(h^l, h^(l+1)) > tau (River-LLM) */
    EXIT_RULE_ROUTER,   /* router probability > theta at checkpoint layers (TIDE) */
    EXIT_RULE_FIXED,    /* layers 0..K-1 on the backbone, K.. exited (measurement) */
} exit_rule_t;

typedef enum {
    EXIT_AGG_MIN = 0, /* the decode batch exits together when every row passes */
    EXIT_AGG_ROW,     /* each row decides; rows are split per layer when that pays */
} exit_agg_t;

typedef enum {
    EXIT_KV_RIVER = 0,  /* exited rows finish on the Exit River, writing every KV slot */
    EXIT_KV_MASK,       /* exited rows stop; later tokens skip the missing KV */
    EXIT_KV_PROPAGATE,  /* skipped layers' K/V are computed from the exit hidden state */
    EXIT_KV_RECOMPUTE,  /* skipped layers run later, batched with the next deep token */
    EXIT_KV_MONO,       /* exit depth never grows within a sequence, so no KV is missing */
    EXIT_KV_POSTHOC,    /* every layer runs; logits come from the exit layer (TIDE) */
    EXIT_KV_COUNT
} exit_kv_t;

/* The rules' and aggregations' names are common/exit_names.h's, in the order of the enums
 * above. */
const char *exit_rule_name(exit_rule_t r);
const char *exit_agg_name(exit_agg_t a);
const char *exit_kv_name(exit_kv_t k);
/* Parses a name as printed by the _name functions; -1 when unknown. */
int exit_rule_parse(const char *s);
int exit_agg_parse(const char *s);
int exit_kv_parse(const char *s);

typedef struct exit_policy {
    exit_rule_t rule;
    float tau;       /* cosine threshold */
    float theta;     /* router threshold */
    int exit_layer;  /* fixed rule: backbone layers K */
    exit_agg_t agg;
    exit_kv_t kv;
    int split_cost_model; /* split a layer only when the cost model says the two groups
                             together beat the whole batch on the backbone (once the costs
                             are measured: forward_calibrate_costs; until then rows split) */
} exit_policy_t;

/* One request's own thresholds under the worker's rule (the serving contract lets a
 * request override them). The rule itself stays the worker's, except that `off` keeps the
 * request on the full backbone. */
typedef struct exit_row {
    uint8_t off;     /* never exit */
    float tau;       /* cosine threshold */
    float theta;     /* router threshold */
    int exit_layer;  /* fixed rule: backbone layers */
} exit_row_t;

/* The routers seen through callbacks, so the forward pass does not depend on how they are
 * stored. weights, when set and not NULL for a layer, gives the placed router that
 * ops->router_prob scores the rows with on the backend, so that only the probabilities
 * reach the host; otherwise prob gets one row's residual stream (dim floats, host memory),
 * which costs a copy of the batch to the host. */
typedef struct exit_router {
    void *user;
    int (*is_checkpoint)(void *user, int layer);
    float (*prob)(void *user, int layer, const float *h);
    const router_weights_t *(*weights)(void *user, int layer);
} exit_router_t;

struct offload;

/* Everything the forward pass needs for early exit. */
typedef struct exit_config {
    exit_policy_t policy;
    const layer_weights_t *const *river; /* (n_layers) river layers, NULL below river_start;
                                            NULL as a whole when there is no river */
    int river_start;                     /* first layer the river has (LS) */
    const weight_t *river_head;          /* the river's LM head for rows that exited onto
                                            the river, or NULL: the backbone's head */
    exit_router_t router;
    /* Cost model for splitting, seconds: a layer on n rows costs a + b*n. Measured by
     * forward_calibrate_costs; the split pays when cost_B(nb) + cost_R(nr) < cost_B(n). */
    double cost_b_fixed, cost_b_row, cost_r_fixed, cost_r_row;
    /* Optional backbone offloading: an evicted layer is brought back before a row runs it
     * on the backbone (engine/offload.h). */
    struct offload *offload;
} exit_config_t;

/* Per-sequence state the baseline strategies need across steps. The river strategy needs
 * none of it. Embedded in the sequence's owner: exit_seq_init / exit_seq_free. */
typedef struct exit_seq {
    uint8_t *kv_valid;  /* mask: (n_layers, cap_pos) 1 where the slot was written */
    int cap_pos;
    int last_depth;     /* mono: backbone depth of the previous token (0: none yet) */
    int n_pending;      /* recompute: positions whose deeper layers are still missing */
    int cap_pending;
    int32_t *pending_pos;   /* (cap_pending) */
    int32_t *pending_layer; /* (cap_pending) first layer still to run */
    float *pending_h;       /* (cap_pending, dim) residual stream at that layer */
} exit_seq_t;

void exit_seq_init(exit_seq_t *s);
void exit_seq_free(exit_seq_t *s);

#endif
