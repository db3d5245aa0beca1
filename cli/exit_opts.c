#include "cli/exit_opts.h"

#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "common/err.h"
#include "engine/generate.h"

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
    case EXIT_OPT_AGGREGATION: {
        int r = exit_agg_parse(arg);
        if (r < 0)
            return -1;
        xo->policy.agg = (exit_agg_t)r;
        return 1;
    }
    case EXIT_OPT_RIVER: xo->river_path = arg; return 1;
    case EXIT_OPT_ROUTERS: xo->routers_path = arg; return 1;
    case EXIT_OPT_NO_COST_MODEL: xo->policy.split_cost_model = 0; return 1;
    case EXIT_OPT_LOSSLESS: xo->lossless = 1; return 1;
    case EXIT_OPT_DRAFT:
        if (cli_parse_int(arg, 1, GEN_DRAFT_MAX, &k))
            return -1;
        xo->draft_k = (int)k;
        return 1;
    case EXIT_OPT_NO_REUSE: xo->no_reuse = 1; return 1;
    case EXIT_OPT_DRAFT_SOURCE: {
        int r = gen_draft_source_parse(arg);
        if (r < 0)
            return -1;
        xo->draft_source = r;
        return 1;
    }
    case EXIT_OPT_NGRAM_MAX:
        if (cli_parse_int(arg, 1, SPEC_NGRAM_MAX, &k))
            return -1;
        xo->ngram_max = (int)k;
        return 1;
    case EXIT_OPT_DRAFT_CONF:
        if (cli_parse_float(arg, &v) || v < 0 || v > 1)
            return -1;
        xo->draft_conf = v;
        return 1;
    }
    return 0;
}

int exit_opts_check_lossless(const exit_opts_t *xo)
{
    if (!xo->lossless) {
        if (xo->draft_k || xo->draft_conf > 0 || xo->no_reuse || xo->draft_source ||
            xo->ngram_max)
            return river_err_set(RIVER_EINVAL, "--draft, --draft-conf, --no-reuse, "
                                 "--draft-source and --ngram-max need --lossless");
        return 0;
    }
    if (xo->policy.rule == EXIT_RULE_NONE)
        return river_err_set(RIVER_EINVAL, "--lossless drafts on the exit path: it needs "
                             "--policy cosine, router or fixed (and a --river)");
    if (xo->policy.kv != EXIT_KV_RIVER)
        return river_err_set(RIVER_EINVAL, "--lossless needs --strategy river (the draft "
                             "must write every KV slot), not --strategy %s",
                             exit_kv_name(xo->policy.kv));
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

gen_spec_t exit_opts_spec(const exit_opts_t *xo)
{
    return (gen_spec_t){.k_max = xo->draft_k ? xo->draft_k : 4,
                        .min_conf = (float)xo->draft_conf, .no_reuse = xo->no_reuse,
                        .source = (gen_draft_source_t)xo->draft_source, .ngram_min = 1,
                        .ngram_max = xo->ngram_max ? xo->ngram_max : 3};
}

void exit_opts_usage(FILE *f, int indent)
{
    static const char *const lines[] = {
        "[--policy none|cosine|router|fixed] [--tau T] [--theta P] [--exit-layer K]",
        "[--river FILE] [--routers FILE] [--aggregation min|row] [--no-cost-model]",
        "[--strategy river|mask|propagate|recompute|mono|posthoc]",
        "[--lossless [--draft K] [--draft-conf P] [--no-reuse]",
        " [--draft-source river|ngram|both] [--ngram-max N]]",
    };
    for (size_t i = 0; i < sizeof lines / sizeof lines[0]; i++)
        fprintf(f, "%*s%s\n", indent, "", lines[i]);
    fputs("--lossless drafts up to K tokens (default 4) on the exit path and verifies them\n"
          "on the backbone: the ids are the backbone's (greedy: identical). --draft-conf P\n"
          "ends a draft after a token whose probability is below P; --no-reuse runs every\n"
          "layer of a verify row again instead of resuming where its draft left the backbone.\n"
          "--draft-source ngram drafts from the sequence's own prompt and output (the ids\n"
          "that followed the latest earlier occurrence of its last 1..N ids, --ngram-max N,\n"
          "default 3) instead of the exit path; both takes the n-gram draft where one\n"
          "matches and the cost model predicts it faster, else the river's.\n",
          f);
}
