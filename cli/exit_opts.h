/* The early-exit options that `run` and `eval` share: parsing them, and opening the river
 * and routers they name into an exit_config_t. */
#ifndef RIVER_CLI_EXIT_OPTS_H
#define RIVER_CLI_EXIT_OPTS_H

#include <getopt.h>
#include <stdio.h>

#include "engine/exit.h"
#include "engine/generate.h"
#include "model/model.h"

enum {
    EXIT_OPT_POLICY = 0x100,
    EXIT_OPT_TAU,
    EXIT_OPT_THETA,
    EXIT_OPT_EXIT_LAYER,
    EXIT_OPT_STRATEGY,
    EXIT_OPT_AGGREGATION,
    EXIT_OPT_RIVER,
    EXIT_OPT_ROUTERS,
    EXIT_OPT_NO_COST_MODEL,
    EXIT_OPT_LOSSLESS,
    EXIT_OPT_DRAFT,
    EXIT_OPT_DRAFT_CONF,
    EXIT_OPT_NO_REUSE,
    EXIT_OPT_DRAFT_SOURCE,
    EXIT_OPT_NGRAM_MAX,
};

#define EXIT_OPTS_LONG                                                          \
    {"policy", required_argument, 0, EXIT_OPT_POLICY},                          \
        {"tau", required_argument, 0, EXIT_OPT_TAU},                            \
        {"theta", required_argument, 0, EXIT_OPT_THETA},                        \
        {"exit-layer", required_argument, 0, EXIT_OPT_EXIT_LAYER},              \
        {"strategy", required_argument, 0, EXIT_OPT_STRATEGY},                  \
        {"aggregation", required_argument, 0, EXIT_OPT_AGGREGATION},            \
        {"river", required_argument, 0, EXIT_OPT_RIVER},                        \
        {"routers", required_argument, 0, EXIT_OPT_ROUTERS},                    \
        {"no-cost-model", no_argument, 0, EXIT_OPT_NO_COST_MODEL},              \
        {"lossless", no_argument, 0, EXIT_OPT_LOSSLESS},                        \
        {"draft", required_argument, 0, EXIT_OPT_DRAFT},                        \
        {"draft-conf", required_argument, 0, EXIT_OPT_DRAFT_CONF},              \
        {"no-reuse", no_argument, 0, EXIT_OPT_NO_REUSE},                        \
        {"draft-source", required_argument, 0, EXIT_OPT_DRAFT_SOURCE},          \
        {"ngram-max", required_argument, 0, EXIT_OPT_NGRAM_MAX}

typedef struct exit_opts {
    exit_policy_t policy;
    int policy_given;
    const char *river_path;
    const char *routers_path;
    int lossless;     /* --lossless: the exit path drafts, the backbone verifies */
    int draft_k;      /* --draft K: most draft tokens per verify pass (0: default 4) */
    double draft_conf;/* --draft-conf P: end a draft after a token below this probability */
    int no_reuse;     /* --no-reuse: verification runs every layer (gen_spec_t.no_reuse) */
    int draft_source; /* --draft-source river|ngram|both (gen_draft_source_t) */
    int ngram_max;    /* --ngram-max N: longest suffix the n-gram lookup matches (0: 3) */
} exit_opts_t;

/* Defaults: policy none, tau 0.9, theta 0.5, strategy river, aggregation min, the split
 * cost model on. */
void exit_opts_init(exit_opts_t *xo);
/* 1 when option c was an exit option and parsed, 0 when it is not one, -1 for a bad
 * value. */
int exit_opts_parse(exit_opts_t *xo, int c, const char *arg);
/* With --lossless: RIVER_EINVAL naming the problem when the policy cannot draft (no
 * exit rule, or a KV strategy other than the river); 0 otherwise. */
int exit_opts_check_lossless(const exit_opts_t *xo);
/* The exit options' part of a usage message, each line indented by `indent` spaces, then
 * what --lossless does; `run` and `eval` print it after their own options. */
void exit_opts_usage(FILE *f, int indent);
/* Sets the policy's own parameter: tau (cosine), theta (router) or the exit layer (fixed). */
void exit_opts_set_value(exit_policy_t *p, double v);
/* The lossless options as the generator takes them (gen_set_spec; no measured costs). */
gen_spec_t exit_opts_spec(const exit_opts_t *xo);

#endif
