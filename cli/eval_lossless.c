#include "cli/eval_lossless.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "engine/generate.h"
#include "engine/spec_cost.h"

typedef struct ll_out {
    int32_t *ids; /* (cap) */
    int n, cap;
    int failed;
} ll_out_t;

static void ll__on_token(void *user, const gen_event_t *ev)
{
    ll_out_t *o = user;
    if (ev->id < 0)
        return;
    if (o->n < o->cap)
        o->ids[o->n++] = ev->id;
    else
        o->failed = 1;
}

/* Adds the counts and times of one run to sum. */
static void ll__add(gen_stats_t *sum, const gen_stats_t *st)
{
    sum->decode_s += st->decode_s;
    sum->decode_tokens += st->decode_tokens;
    sum->spec_drafts += st->spec_drafts;
    sum->spec_draft_tokens += st->spec_draft_tokens;
    sum->spec_accepted_tokens += st->spec_accepted_tokens;
    sum->spec_verify_passes += st->spec_verify_passes;
    sum->spec_ngram_drafts += st->spec_ngram_drafts;
    sum->spec_ngram_draft_tokens += st->spec_ngram_draft_tokens;
    sum->spec_ngram_accepted_tokens += st->spec_ngram_accepted_tokens;
    sum->draft_s += st->draft_s;
    sum->verify_s += st->verify_s;
    sum->draft_steps += st->draft_steps;
    sum->verify_steps += st->verify_steps;
}

/* Runs every prompt alone through a fresh generator (lossless or plain), greedy, EOS
 * ignored, collecting ids into outs[i] and adding up the generator's statistics. */
static int ll__run(cli_env_t *env, const exit_config_t *ex, const gen_spec_t *spec,
                   const eval_ll_prompt_t *ps, int n_ps, int max_tokens, ll_out_t *outs,
                   gen_stats_t *sum)
{
    memset(sum, 0, sizeof *sum);
    for (int i = 0; i < n_ps; i++) {
        gen_config_t gc = {.max_rows = 32, .prefill_chunk = 64, .page_size = 16, .max_seqs = 1,
                           .kv_dtype = cli_env_kv_dtype()};
        gen_t *g;
        int e = gen_new(&g, env->model, NULL, env->be, &gc);
        if (e)
            return e;
        if (ex)
            e = gen_set_exit(g, ex);
        if (!e && spec)
            e = gen_set_spec(g, spec);
        outs[i].n = 0;
        gen_request_t r = {.prompt = ps[i].ids, .n_prompt = ps[i].n_ids,
                           .max_tokens = max_tokens, .ignore_eos = 1,
                           .on_token = ll__on_token, .user = &outs[i], .lossless = ex != NULL};
        int seq;
        if (!e)
            e = gen_submit(g, &r, &seq);
        if (!e)
            e = gen_run_all(g);
        gen_stats_t st;
        gen_get_stats(g, &st);
        gen_destroy(&g);
        if (e)
            return e;
        if (outs[i].failed)
            return river_err_set(RIVER_ENOMEM, "eval: ids of prompt %d", i + 1);
        ll__add(sum, &st);
    }
    return 0;
}

int eval_lossless(cli_env_t *env, const exit_setup_t *xc, const exit_opts_t *xo,
                  const eval_ll_prompt_t *ps, int n_ps, int max_tokens, const double *sweep,
                  int n_sweep, int repeat, int json)
{
    int e = 0;
    ll_out_t *bb = calloc((size_t)n_ps, sizeof *bb), *ll = calloc((size_t)n_ps, sizeof *ll);
    if (!bb || !ll) {
        free(bb);
        free(ll);
        return river_err_set(RIVER_ENOMEM, "eval: outputs");
    }
    for (int i = 0; i < n_ps && !e; i++) {
        bb[i].cap = ll[i].cap = max_tokens;
        bb[i].ids = malloc(sizeof(int32_t) * (size_t)max_tokens);
        ll[i].ids = malloc(sizeof(int32_t) * (size_t)max_tokens);
        if (!bb[i].ids || !ll[i].ids)
            e = river_err_set(RIVER_ENOMEM, "eval: ids");
    }
    gen_stats_t bst, st;
    /* Faults the mapped weights in, untimed. */
    if (!e)
        e = ll__run(env, NULL, NULL, ps, n_ps, max_tokens, bb, &bst);
    gen_spec_t spec = exit_opts_spec(xo);
    /* The positions a decoded token's attention reads on average (the bytes model's KV). */
    double ctx = 0;
    for (int i = 0; i < n_ps; i++)
        ctx += (double)ps[i].n_ids + 0.5 * (max_tokens - 1);
    ctx /= n_ps;
    const model_t *m = env->model;
    int L = m->cfg.n_layers;
    if (!e && !json)
        printf("%-8s %8s %5s %9s %8s %9s %9s %9s %8s %10s %10s\n", "policy", "value", "k",
               "identical", "accept", "mean_acc", "tok/s", "bb tok/s", "speedup", "draft_ms",
               "verify_ms");
    int n_set = n_sweep ? n_sweep : 1;
    for (int si = 0; si < n_set && !e; si++) {
        exit_config_t sc = xc->cfg;
        if (n_sweep)
            exit_opts_set_value(&sc.policy, sweep[si]);
        /* A warm-up pass (the river's pages), then rounds of the backbone and lossless mode,
         * as many as --repeat (cli_repeats: the default decided by the first round's
         * longer decode), reporting medians: on a shared machine single rounds are noisy.
         * The counts are the same every round (greedy, and draft choices that do not
         * depend on timing). */
        e = ll__run(env, &sc, &spec, ps, n_ps, max_tokens, ll, &st);
        double tl[CLI_REPEAT_MAX], tb[CLI_REPEAT_MAX], ratio[CLI_REPEAT_MAX];
        double sum_draft_s = 0, sum_verify_s = 0, sum_bb_s = 0;
        int64_t n_draft = 0, n_verify = 0, n_bb = 0;
        gen_stats_t one;
        int n_rep = repeat > 0 ? (int)repeat : 1;
        for (int rep = 0; rep < n_rep && !e; rep++) {
            /* Prompt by prompt, the backbone and then lossless mode: the two decodes a
             * ratio compares run close together, so a drifting load moves both alike. */
            gen_stats_t b1, l1;
            memset(&bst, 0, sizeof bst);
            memset(&one, 0, sizeof one);
            for (int i = 0; i < n_ps && !e; i++) {
                e = ll__run(env, NULL, NULL, ps + i, 1, max_tokens, bb + i, &b1);
                if (!e)
                    e = ll__run(env, &sc, &spec, ps + i, 1, max_tokens, ll + i, &l1);
                ll__add(&bst, &b1);
                ll__add(&one, &l1);
            }
            if (e)
                break;
            tb[rep] = bst.decode_s > 0 ? (double)bst.decode_tokens / bst.decode_s : 0;
            tl[rep] = one.decode_s > 0 ? (double)one.decode_tokens / one.decode_s : 0;
            ratio[rep] = tb[rep] > 0 ? tl[rep] / tb[rep] : 0;
            sum_draft_s += one.draft_s;
            sum_verify_s += one.verify_s;
            sum_bb_s += bst.decode_s;
            n_draft += one.draft_steps;
            n_verify += one.verify_steps;
            n_bb += bst.decode_tokens;
            st = one;
            if (rep == 0)
                n_rep = cli_repeats(repeat, bst.decode_s > one.decode_s ? bst.decode_s
                                                                       : one.decode_s);
        }
        if (e)
            break;
        int identical = 1;
        for (int i = 0; i < n_ps; i++) {
            identical &= ll[i].n == bb[i].n;
            for (int t = 0; identical && t < bb[i].n; t++)
                identical &= ll[i].ids[t] == bb[i].ids[t];
        }
        double acc = st.spec_draft_tokens ? (double)st.spec_accepted_tokens /
                                                (double)st.spec_draft_tokens : 0;
        double mean_acc = st.spec_verify_passes
                              ? (double)(st.spec_accepted_tokens + st.spec_verify_passes) /
                                    (double)st.spec_verify_passes : 0;
        double draft_ms = n_draft ? 1e3 * sum_draft_s / (double)n_draft : 0;
        double verify_ms = n_verify ? 1e3 * sum_verify_s / (double)n_verify : 0;
        double bb_ms = n_bb ? 1e3 * sum_bb_s / (double)n_bb : 0;
        double tok_s = cli_median(tl, n_rep), bb_tok_s = cli_median(tb, n_rep);
        /* Per source: the n-gram rounds' counts, and the river's (the rest). */
        int64_t ng_d = st.spec_ngram_draft_tokens, ng_a = st.spec_ngram_accepted_tokens;
        int64_t rv_d = st.spec_draft_tokens - ng_d, rv_a = st.spec_accepted_tokens - ng_a;
        double acc_ngram = ng_d ? (double)ng_a / (double)ng_d : 0;
        double acc_river = rv_d ? (double)rv_a / (double)rv_d : 0;
        /* The bytes ideal of a fixed exit (its draft path is known): every emitted id at the
         * backbone's bytes, over what the rounds read: each river draft token its exit
         * path, each verify pass the backbone's weights once and each of its rows the KV. */
        double ideal_bytes = 0;
        if (sc.policy.rule == EXIT_RULE_FIXED) {
            spec_bytes_t pb, db;
            dtype_t kv_dt = gen_kv_dtype(m, cli_env_kv_dtype());
            spec_path_bytes(m, NULL, L, ctx, kv_dt, &pb);
            spec_path_bytes(m, &sc, sc.policy.exit_layer, ctx, kv_dt, &db);
            double read = (double)rv_d * db.total +
                          (double)st.spec_verify_passes * (pb.total - pb.kv) +
                          (double)(st.spec_draft_tokens + st.spec_verify_passes) * pb.kv;
            ideal_bytes = read > 0 ? (double)st.decode_tokens * pb.total / read : 0;
        }
        double value = sc.policy.rule == EXIT_RULE_COSINE   ? sc.policy.tau
                       : sc.policy.rule == EXIT_RULE_ROUTER ? sc.policy.theta
                                                            : sc.policy.exit_layer;
        double speedup = cli_median(ratio, n_rep);
        if (json) {
            json_t *o = json_pack("{s:s, s:s, s:f, s:i, s:f, s:b, s:f, s:f, s:f, s:f, s:f, s:f, "
                                  "s:f, s:f, s:I, s:I, s:I, s:I}",
                                  "mode", "lossless", "policy", exit_rule_name(sc.policy.rule),
                                  "value", value, "k_max", spec.k_max, "draft_conf",
                                  (double)spec.min_conf, "identical", identical,
                                  "acceptance_rate", acc, "mean_accepted", mean_acc, "tok_s",
                                  tok_s, "backbone_tok_s", bb_tok_s, "speedup", speedup,
                                  "draft_step_ms", draft_ms, "verify_step_ms", verify_ms,
                                  "backbone_step_ms", bb_ms, "drafted",
                                  (json_int_t)st.spec_draft_tokens, "accepted",
                                  (json_int_t)st.spec_accepted_tokens, "verify_passes",
                                  (json_int_t)st.spec_verify_passes, "tokens",
                                  (json_int_t)st.decode_tokens);
            if (o) {
                json_object_set_new(o, "draft_source",
                                    json_string(gen_draft_source_name(spec.source)));
                json_object_set_new(o, "ngram_drafted", json_integer(ng_d));
                json_object_set_new(o, "ngram_accepted", json_integer(ng_a));
                json_object_set_new(o, "ngram_rounds", json_integer(st.spec_ngram_drafts));
                json_object_set_new(o, "ngram_acceptance_rate", json_real(acc_ngram));
                json_object_set_new(o, "river_drafted", json_integer(rv_d));
                json_object_set_new(o, "river_accepted", json_integer(rv_a));
                json_object_set_new(o, "river_acceptance_rate", json_real(acc_river));
                json_object_set_new(o, "repeat", json_integer(n_rep));
                json_object_set_new(o, "mean_context", json_real(ctx));
                if (ideal_bytes > 0) {
                    json_object_set_new(o, "ideal_speedup_bytes", json_real(ideal_bytes));
                    json_object_set_new(o, "realized_over_ideal",
                                        json_real(speedup / ideal_bytes));
                }
            }
            cli_json_print(o);
        } else {
            printf("%-8s %8.3f %5d %9s %7.2f%% %9.2f %9.1f %9.1f %8.2f %10.3f %10.3f\n",
                   exit_rule_name(sc.policy.rule), value, spec.k_max, identical ? "yes" : "NO",
                   100.0 * acc, mean_acc, tok_s, bb_tok_s, speedup, draft_ms, verify_ms);
            printf("         draft source %s: river %lld of %lld accepted, n-gram %lld of %lld "
                   "(%lld rounds); medians of %d rounds", gen_draft_source_name(spec.source),
                   (long long)rv_a, (long long)rv_d, (long long)ng_a, (long long)ng_d,
                   (long long)st.spec_ngram_drafts, n_rep);
            if (ideal_bytes > 0)
                printf("; bytes ideal %.3f, realized/ideal %.3f", ideal_bytes,
                       speedup / ideal_bytes);
            printf("\n");
        }
    }
    for (int i = 0; i < n_ps; i++) {
        free(bb[i].ids);
        free(ll[i].ids);
    }
    free(bb);
    free(ll);
    return e;
}
