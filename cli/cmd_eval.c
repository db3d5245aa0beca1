/* river eval: decode prompts with an exit policy and with the full backbone, teacher-forced
 * on the backbone's tokens so every position compares like with like, and report exit
 * depth, agreement (next-token match, KL) and speed against the ideal speed-up. */
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "cli/cli.h"
#include "cli/eval_lossless.h"
#include "cli/exit_opts.h"
#include "engine/exit_setup.h"
#include "common/clock.h"
#include "common/err.h"
#include "common/file.h"
#include "engine/forward.h"
#include "engine/offload.h"
#include "engine/sampler.h"
#include "engine/spec_cost.h"

#define EVAL_MAX_SWEEP 32

typedef struct eval_prompt {
    int32_t *ids;        /* (n_ids) prompt with BOS */
    size_t n_ids;
    int32_t *gen;        /* (n_gen) the backbone's greedy tokens */
    float *logits;       /* (n_gen, vocab) the backbone's logits at each generated position */
    int n_gen;
} eval_prompt_t;

typedef struct eval_result {
    double mean_depth, match, kl, tok_s, decide_frac;
    int64_t tokens;
    int64_t *hist;       /* (n_layers + 1) tokens by depth */
    double river_layers; /* mean layers a token ran on the river */
} eval_result_t;

/* KL(p || q) of two logit rows, in nats. */
static double eval__kl(const float *lp, const float *lq, int n)
{
    float mp = lp[sampler_argmax(lp, n)], mq = lq[sampler_argmax(lq, n)];
    double zp = 0, zq = 0;
    for (int i = 0; i < n; i++) {
        zp += exp((double)(lp[i] - mp));
        zq += exp((double)(lq[i] - mq));
    }
    double lzp = log(zp), lzq = log(zq), kl = 0;
    for (int i = 0; i < n; i++) {
        double a = (double)(lp[i] - mp) - lzp, b = (double)(lq[i] - mq) - lzq;
        kl += exp(a) * (a - b);
    }
    return kl > 0 ? kl : 0;
}

/* One sequence through the forward pass: the prompt in chunks (one exit group), then
 * n_gen decode steps fed with `feed` (the backbone's tokens) or, when feed is NULL, with
 * the greedy choice. Logits of each generated position go to logits (n_gen, vocab),
 * depths to depth (n_gen), decode seconds to *decode_s. */
static int eval__sequence(forward_t *f, kv_pool_t *kv, const model_t *m, const int32_t *ids,
                          size_t n_ids, int n_gen, const int32_t *feed, int32_t *out_gen,
                          float *logits, int32_t *depth, double *decode_s)
{
    int vocab = m->cfg.vocab_size;
    int max_rows = forward_max_rows(f);
    kv_seq_t seq;
    exit_seq_t es;
    kv_seq_init(&seq);
    exit_seq_init(&es);
    int e = kv_seq_reserve(&seq, kv, (int)n_ids + n_gen);
    int32_t *pos = malloc(sizeof *pos * (size_t)max_rows);
    int32_t *grp = calloc((size_t)max_rows, sizeof *grp);
    int32_t *dep = malloc(sizeof *dep * (size_t)max_rows);
    const int32_t **tab = malloc(sizeof *tab * (size_t)max_rows);
    exit_seq_t **ess = malloc(sizeof *ess * (size_t)max_rows);
    if (!e && (!pos || !grp || !dep || !tab || !ess))
        e = river_err_set(RIVER_ENOMEM, "eval: batch bookkeeping");
    for (int i = 0; !e && i < max_rows; i++) {
        tab[i] = seq.pages;
        ess[i] = &es;
    }
    /* The prompt, in chunks that each exit as one group. */
    for (size_t done = 0; !e && done < n_ids;) {
        int n = (int)(n_ids - done < (size_t)max_rows ? n_ids - done : (size_t)max_rows);
        for (int i = 0; i < n; i++)
            pos[i] = (int32_t)done + i;
        int32_t last = n - 1;
        fwd_batch_t b = {.n = n, .tokens = ids + done, .pos = pos, .page_table = tab,
                         .n_logits = done + (size_t)n == n_ids, .logit_rows = &last,
                         .group = grp, .exit_seq = ess, .depth = dep};
        e = forward_step(f, kv, &b, logits);
        if (!e && done + (size_t)n == n_ids)
            depth[0] = dep[last];
        done += (size_t)n;
    }
    double t0 = clock_now_s();
    for (int t = 1; !e && t < n_gen; t++) {
        int32_t tok = feed ? feed[t - 1] : out_gen[t - 1], p = (int32_t)n_ids + t - 1, row = 0;
        if (!feed)
            out_gen[t - 1] = sampler_argmax(logits + (size_t)(t - 1) * (size_t)vocab, vocab);
        tok = feed ? feed[t - 1] : out_gen[t - 1];
        fwd_batch_t b = {.n = 1, .tokens = &tok, .pos = &p, .page_table = tab, .n_logits = 1,
                         .logit_rows = &row, .group = grp, .exit_seq = ess, .depth = dep};
        e = forward_step(f, kv, &b, logits + (size_t)t * (size_t)vocab);
        depth[t] = dep[0];
    }
    *decode_s = clock_now_s() - t0;
    if (!e && !feed)
        out_gen[n_gen - 1] = sampler_argmax(logits + (size_t)(n_gen - 1) * (size_t)vocab, vocab);
    kv_seq_free(&seq, kv);
    exit_seq_free(&es);
    free(pos);
    free(grp);
    free(dep);
    free(tab);
    free(ess);
    return e;
}

/* One timed round: every prompt teacher-forced on the backbone's tokens under the
 * forward's current exit setting; *secs receives the decode seconds added up. */
static int eval__round(forward_t *f, kv_pool_t *kv, const model_t *m, const eval_prompt_t *ps,
                       int n_ps, float *lg, int32_t *depth, double *secs)
{
    int e = 0;
    *secs = 0;
    for (int i = 0; i < n_ps && !e; i++) {
        double ds;
        e = eval__sequence(f, kv, m, ps[i].ids, ps[i].n_ids, ps[i].n_gen, ps[i].gen, NULL, lg,
                           depth, &ds);
        *secs += ds;
    }
    return e;
}

/* The reference run of --reference: opens the model at path (it must share the vocabulary),
 * decodes every prompt greedily on it and keeps its tokens and logits in ps. */
static int eval__reference(const char *path, const char *tok_path, int threads,
                           eval_prompt_t *ps, int n_ps, int max_tokens, int vocab)
{
    cli_env_t renv;
    int e = cli_env_open(&renv, path, tok_path, threads, 0);
    if (e)
        return e;
    forward_t *f = NULL;
    kv_pool_t *kv = NULL;
    int32_t *depth = malloc(sizeof *depth * (size_t)max_tokens);
    const model_config_t *cfg = &renv.model->cfg;
    if (cfg->vocab_size != vocab) {
        e = river_err_set(RIVER_EINVAL, "%s: reference vocabulary of %d; the model's is %d",
                          path, cfg->vocab_size, vocab);
        goto out;
    }
    if (!depth) {
        e = river_err_set(RIVER_ENOMEM, "eval: reference depths");
        goto out;
    }
    if ((e = forward_new(&f, renv.model, renv.be, 64)) ||
        (e = kv_pool_new(&kv, renv.be, cfg->n_layers, cfg->n_kv_heads * cfg->head_dim,
                         gen_kv_dtype(renv.model, cli_env_kv_dtype()), 16,
                         (cfg->max_seq_len + 15) / 16 + 2)))
        goto out;
    for (int i = 0; i < n_ps && !e; i++) {
        eval_prompt_t *p = &ps[i];
        if ((size_t)p->n_ids + (size_t)max_tokens > (size_t)cfg->max_seq_len) {
            e = river_err_set(RIVER_EINVAL, "%s: prompt %d does not fit the reference's "
                              "context of %d", path, i + 1, cfg->max_seq_len);
            break;
        }
        p->n_gen = max_tokens;
        p->gen = malloc(sizeof *p->gen * (size_t)p->n_gen);
        p->logits = malloc(sizeof *p->logits * (size_t)p->n_gen * (size_t)vocab);
        if (!p->gen || !p->logits) {
            e = river_err_set(RIVER_ENOMEM, "eval: reference logits");
            break;
        }
        double ds;
        e = eval__sequence(f, kv, renv.model, p->ids, p->n_ids, p->n_gen, NULL, p->gen,
                           p->logits, depth, &ds);
    }
out:
    free(depth);
    kv_pool_destroy(&kv);
    forward_destroy(&f);
    cli_env_close(&renv);
    return e;
}

static void eval__usage(FILE *f)
{
    fprintf(f,
            "usage: river eval --model PATH [--tokenizer PATH] --prompts FILE\n"
            "                  [--sweep a,b,c] [--max-tokens N] [--threads N]\n"
            "                  [--offload-threshold F] [--reference MODEL]\n"
            "                  [--repeat N] [--output text|json]\n"
            "                  [--kv-dtype auto|f32|f16|bf16|q8]\n");
    exit_opts_usage(f, 18);
    fprintf(f,
            "Decodes every prompt (one a line) greedily with the full backbone, then again\n"
            "with the policy fed the backbone's tokens, and prints per setting: mean exit\n"
            "layer, exit histogram, next-token match, KL(backbone || exit), tok/s of both,\n"
            "speed-up, ideal_speedup_bytes (the bytes a backbone token reads over the mean\n"
            "bytes a token reads on the measured mix of exit paths: layers, river layers,\n"
            "heads and KV, engine/spec_cost.h; fixed for a given histogram), realized/ideal\n"
            "against it, ideal_speedup_layers L / (E[backbone layers] + r E[river layers])\n"
            "with r the measured river/backbone layer time, and peak RSS.\n"
            "--repeat N times every decode N times (prompt by prompt, the backbone's then the\n"
            "setting's) and reports the median tok/s of each and the median of the rounds'\n"
            "speed-ups; default 3 when the backbone's decode of all prompts takes under 2 s,\n"
            "else 1.\n"
            "--sweep varies tau (cosine), theta (router) or the exit layer (fixed).\n"
            "--offload-threshold F releases backbone layers reached by fewer than F of the\n"
            "tokens (their mapped pages) and reports resident memory before and after.\n"
            "--reference MODEL takes the reference tokens and logits from another\n"
            "checkpoint of the same vocabulary (e.g. the bf16 source of a quantized\n"
            "backbone): every setting, --policy none included, is then measured against it.\n"
            "Every setting also prints the bytes a token reads (backbone layers, river\n"
            "layers, heads, KV).\n"
            "--lossless generates every prompt with the plain backbone and in lossless mode\n"
            "(the exit path drafts, the backbone verifies) and prints per setting whether\n"
            "the ids are identical, acceptance_rate (accepted / drafted), mean_accepted (ids\n"
            "per verify pass), per draft source (river, ngram) the same, tok/s of both (the\n"
            "medians of --repeat alternating rounds), speed-up (the median of the rounds'\n"
            "ratios), and the draft and verify step times.\n");
}

int cmd_eval(int argc, char **argv)
{
    static const struct option opts[] = {
        EXIT_OPTS_LONG,
        {"model", required_argument, 0, 'm'},     {"tokenizer", required_argument, 0, 'k'},
        {"prompts", required_argument, 0, 'f'},   {"sweep", required_argument, 0, 'W'},
        {"max-tokens", required_argument, 0, 'n'}, {"threads", required_argument, 0, 'j'},
        {"output", required_argument, 0, 'o'},    {"help", no_argument, 0, 'h'},
        {"offload-threshold", required_argument, 0, 'O'},
        {"reference", required_argument, 0, 'R'},
        {"repeat", required_argument, 0, 'r'},
        {"kv-dtype", required_argument, 0, 1100},
        {0, 0, 0, 0},
    };
    const char *ref_path = NULL;
    double offload_threshold = 0;
    const char *model_path = NULL, *tok_path = NULL, *prompts_path = NULL, *sweep = NULL;
    long max_tokens = 32, threads = 0, repeat = 0;
    int json = 0, c, li = 0;
    exit_opts_t xo;
    exit_opts_init(&xo);
    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, &li)) != -1) {
        int r = exit_opts_parse(&xo, c, optarg);
        if (r == 1)
            continue;
        if (r < 0)
            goto bad_value;
        switch (c) {
        case 'm': model_path = optarg; break;
        case 'k': tok_path = optarg; break;
        case 'f': prompts_path = optarg; break;
        case 'W': sweep = optarg; break;
        case 'n':
            if (cli_parse_int(optarg, 2, 1 << 16, &max_tokens))
                goto bad_value;
            break;
        case 'j':
            if (cli_parse_int(optarg, 0, 1024, &threads))
                goto bad_value;
            break;
        case 'o':
            if (!strcmp(optarg, "json"))
                json = 1;
            else if (strcmp(optarg, "text"))
                goto bad_value;
            break;
        case 'O':
            if (cli_parse_float(optarg, &offload_threshold) || offload_threshold <= 0 ||
                offload_threshold >= 1)
                goto bad_value;
            break;
        case 'R': ref_path = optarg; break;
        case 'r':
            if (cli_parse_int(optarg, 1, CLI_REPEAT_MAX, &repeat))
                goto bad_value;
            break;
        case 1100: {
            int ke = cli_env_set_kv_dtype(optarg);
            if (ke)
                return cli_fail("eval", ke);
            break;
        }
        case 'h': eval__usage(stdout); return 0;
        default: eval__usage(stderr); return 2;
        }
    }
    if (!model_path || !prompts_path || optind != argc) {
        fprintf(stderr, "river eval: --model and --prompts are required\n");
        eval__usage(stderr);
        return 2;
    }
    double sweep_v[EVAL_MAX_SWEEP];
    int n_sweep = 0;
    if (sweep) {
        char *copy = strdup(sweep), *save = NULL;
        for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
            if (n_sweep == EVAL_MAX_SWEEP || cli_parse_float(t, &sweep_v[n_sweep])) {
                fprintf(stderr, "river eval: bad --sweep value '%s' (at most %d numbers)\n", t,
                        EVAL_MAX_SWEEP);
                free(copy);
                return 2;
            }
            n_sweep++;
        }
        free(copy);
    }

    if (n_sweep) /* the first value stands in for the policy's own option */
        exit_opts_set_value(&xo.policy, sweep_v[0]);
    int e = exit_opts_check_lossless(&xo);
    if (e)
        return cli_fail("eval", e);
    if (xo.lossless && ref_path)
        return cli_fail("eval", river_err_set(RIVER_EINVAL, "--lossless and --reference do "
                                              "not combine (lossless is exact to the model's "
                                              "own backbone)"));
    if (xo.lossless && offload_threshold > 0)
        return cli_fail("eval", river_err_set(RIVER_EINVAL, "--lossless and "
                                              "--offload-threshold do not combine"));
    cli_env_t env;
    /* Offloading releases backbone pages, which the CPU's huge-page copies cannot be. */
    if (offload_threshold > 0 && (e = cli_env_set_weights("mapped")))
        return cli_fail("eval", e);
    e = cli_env_open(&env, model_path, tok_path, (int)threads, 1);
    if (e)
        return cli_fail("eval", e);
    const model_t *m = env.model;
    const model_config_t *cfg = &m->cfg;
    int L = cfg->n_layers, vocab = cfg->vocab_size, rc = 1;
    exit_setup_t xc;
    eval_prompt_t *ps = NULL;
    int n_ps = 0;
    forward_t *f = NULL;
    kv_pool_t *kv = NULL;
    float *lg = NULL;
    int32_t *depth = NULL;
    e = exit_setup_open(&xc, &xo.policy, xo.river_path, xo.routers_path, m);
    if (e)
        goto done;
    /* Prompts, one a line. */
    size_t text_len;
    char *text = NULL;
    e = river_read_file(prompts_path, &text, &text_len);
    if (e)
        goto done;
    for (char *line = text, *next; line && line < text + text_len; line = next) {
        next = memchr(line, '\n', (size_t)(text + text_len - line));
        size_t len = next ? (size_t)(next - line) : (size_t)(text + text_len - line);
        if (next)
            next++;
        if (len && line[len - 1] == '\r')
            len--;
        if (!len)
            continue;
        eval_prompt_t *np = realloc(ps, sizeof *ps * (size_t)(n_ps + 1));
        if (!np) {
            e = river_err_set(RIVER_ENOMEM, "prompts");
            break;
        }
        ps = np;
        memset(&ps[n_ps], 0, sizeof ps[n_ps]);
        e = tokenizer_encode(env.tok, line, len, 1, &ps[n_ps].ids, &ps[n_ps].n_ids);
        n_ps++;
        if (e)
            break;
        if (ps[n_ps - 1].n_ids + (size_t)max_tokens > (size_t)cfg->max_seq_len) {
            e = river_err_set(RIVER_EINVAL, "%s: prompt %d has %zu tokens; with %ld generated "
                              "it exceeds the context of %d", prompts_path, n_ps,
                              ps[n_ps - 1].n_ids, max_tokens, cfg->max_seq_len);
            break;
        }
    }
    free(text);
    if (e)
        goto done;
    if (!n_ps) {
        e = river_err_set(RIVER_EINVAL, "%s: no prompts", prompts_path);
        goto done;
    }
    if (xo.lossless) {
        eval_ll_prompt_t *lp = malloc(sizeof *lp * (size_t)n_ps);
        if (!lp) {
            e = river_err_set(RIVER_ENOMEM, "prompts");
            goto done;
        }
        for (int i = 0; i < n_ps; i++)
            lp[i] = (eval_ll_prompt_t){.ids = ps[i].ids, .n_ids = ps[i].n_ids};
        e = eval_lossless(&env, &xc, &xo, lp, n_ps, (int)max_tokens, sweep_v, n_sweep,
                          (int)repeat, json);
        free(lp);
        if (!e)
            rc = 0;
        goto done;
    }
    int max_rows = 64;
    if (xo.policy.kv == EXIT_KV_RECOMPUTE) {
        /* Recompute carries every skipped position along until a deep token takes it, so
         * a batch may hold a whole sequence. */
        size_t longest = 0;
        for (int i = 0; i < n_ps; i++)
            longest = ps[i].n_ids > longest ? ps[i].n_ids : longest;
        max_rows = (int)longest + (int)max_tokens + 1;
    }
    e = forward_new(&f, m, env.be, max_rows);
    if (!e)
        e = kv_pool_new(&kv, env.be, L, cfg->n_kv_heads * cfg->head_dim,
                        gen_kv_dtype(m, cli_env_kv_dtype()), 16,
                        (cfg->max_seq_len + 15) / 16 + 2);
    lg = malloc(sizeof *lg * (size_t)max_tokens * (size_t)vocab);
    depth = malloc(sizeof *depth * (size_t)max_tokens);
    if (!e && (!lg || !depth))
        e = river_err_set(RIVER_ENOMEM, "eval: logits of %ld tokens", max_tokens);
    if (e)
        goto done;
    /* The river/backbone layer time ratio r for the ideal speed-up. */
    double r_ratio = 0;
    if (xc.cfg.river) {
        e = forward_calibrate_costs(f, kv, &xc.cfg);
        if (e)
            goto done;
        r_ratio = (xc.cfg.cost_r_fixed + xc.cfg.cost_r_row) /
                  (xc.cfg.cost_b_fixed + xc.cfg.cost_b_row);
    }
    /* The backbone's own greedy run, or the reference model's: the reference tokens and
     * logits. */
    double bb_s = 0;
    int64_t bb_tokens = 0;
    forward_set_exit(f, NULL);
    if (ref_path && (e = eval__reference(ref_path, tok_path, (int)threads, ps, n_ps,
                                         (int)max_tokens, vocab)))
        goto done;
    for (int i = 0; i < n_ps && !ref_path; i++) {
        eval_prompt_t *p = &ps[i];
        p->n_gen = (int)max_tokens;
        p->gen = malloc(sizeof *p->gen * (size_t)p->n_gen);
        p->logits = malloc(sizeof *p->logits * (size_t)p->n_gen * (size_t)vocab);
        if (!p->gen || !p->logits) {
            e = river_err_set(RIVER_ENOMEM, "eval: backbone logits");
            goto done;
        }
        /* Fault the pages in now, so the timed loop does not pay for them. */
        memset(p->logits, 0, sizeof *p->logits * (size_t)p->n_gen * (size_t)vocab);
        double ds;
        /* The first sequence runs twice: once to fault the mapped weights in, untimed. */
        for (int rep = i == 0 ? 0 : 1; rep < 2 && !e; rep++)
            e = eval__sequence(f, kv, m, p->ids, p->n_ids, p->n_gen, NULL, p->gen, p->logits,
                               depth, &ds);
        if (e)
            goto done;
        bb_s += ds;
        bb_tokens += p->n_gen - 1;
    }
    if (ref_path) {
        /* The reference came from another model: fault this one's weights in, untimed. */
        double ds;
        e = eval__sequence(f, kv, m, ps[0].ids, ps[0].n_ids, ps[0].n_gen, ps[0].gen, NULL, lg,
                           depth, &ds);
    }
    if (e)
        goto done;
    /* Decoded tokens a round times, and the positions their attention reads on average
     * (the KV part of the bytes model). */
    double ctx_sum = 0;
    bb_tokens = 0;
    for (int i = 0; i < n_ps; i++) {
        bb_tokens += ps[i].n_gen - 1;
        for (int t = 0; t < ps[i].n_gen; t++)
            ctx_sum += (double)ps[i].n_ids + t;
    }
    double ctx_mean = 0;
    for (int i = 0; i < n_ps; i++)
        ctx_mean += ps[i].n_gen;
    ctx_mean = ctx_sum / ctx_mean;
    /* The backbone's rounds of each setting, timed the way the setting's are (teacher-
     * forced, the same buffers, after the same warm-up): the first decides how many. */
    int n_rep = 0;
    double bb_t[CLI_REPEAT_MAX], set_t[CLI_REPEAT_MAX];
    forward_set_exit(f, NULL);
    e = eval__round(f, kv, m, ps, n_ps, lg, depth, &bb_s);
    if (e)
        goto done;
    n_rep = cli_repeats(repeat, bb_s);
    int n_set = n_sweep ? n_sweep : 1;
    if (!json)
        printf("%-8s %-9s %8s %7s %8s %8s %9s %9s %8s %8s %7s\n", "policy", "strategy",
               "value", "exit", "match", "kl", "tok/s", "bb tok/s", "speedup", "ideal",
               "r/i");
    for (int si = 0; si < n_set; si++) {
        exit_config_t sc = xc.cfg;
        if (n_sweep)
            exit_opts_set_value(&sc.policy, sweep_v[si]);
        offload_t *off = NULL;
        if (offload_threshold > 0) {
            e = offload_new(&off, m, offload_threshold, 32);
            if (e)
                goto done;
            sc.offload = off;
        }
        int64_t rss_before = offload_rss_bytes();
        e = forward_set_exit(f, &sc);
        if (e) {
            offload_destroy(&off);
            goto done;
        }
        int64_t *hist = calloc((size_t)L + 1, sizeof *hist);
        if (!hist) {
            offload_destroy(&off);
            e = river_err_set(RIVER_ENOMEM, "eval: histogram");
            goto done;
        }
        double kl = 0, depth_sum = 0, river_sum = 0, decide_s = 0, step_s = 0;
        int64_t match = 0, n_tok = 0, n_dec = bb_tokens;
        {
            /* Untimed warm-up of this setting's weights (the river's pages, too). */
            double ds;
            e = eval__sequence(f, kv, m, ps[0].ids, ps[0].n_ids, ps[0].n_gen, ps[0].gen, NULL,
                               lg, depth, &ds);
        }
        /* Rounds of pairs: each prompt on the backbone, then under this setting, so that
         * the two decodes a ratio compares run seconds apart and a machine whose load
         * drifts (other processes) moves both alike; the speed-up is the median of the
         * rounds' ratios. The first round also takes the setting's figures (the same in
         * every round: teacher-forced). Offloading times every backbone round first: a
         * backbone decode between the setting's would fault released layers back in. */
        double ratio[CLI_REPEAT_MAX], bs[CLI_REPEAT_MAX] = {0}, ss[CLI_REPEAT_MAX] = {0};
        for (int pass = 0; pass < (off ? 2 : 1) && !e; pass++) {
            for (int r = 0; r < n_rep && !e; r++) {
                for (int i = 0; i < n_ps && !e; i++) {
                    eval_prompt_t *p = &ps[i];
                    double ds;
                    if (!off || pass == 0) {
                        e = forward_set_exit(f, NULL);
                        if (!e)
                            e = eval__sequence(f, kv, m, p->ids, p->n_ids, p->n_gen, p->gen, NULL,
                                               lg, depth, &ds);
                        bs[r] += ds;
                    }
                    if (e || (off && pass == 0))
                        continue;
                    e = forward_set_exit(f, &sc);
                    forward_reset_stats(f);
                    if (!e)
                        e = eval__sequence(f, kv, m, p->ids, p->n_ids, p->n_gen, p->gen, NULL, lg,
                                           depth, &ds);
                    ss[r] += ds;
                    if (r > 0)
                        continue;
                    fwd_stats_t fs;
                    forward_get_stats(f, &fs);
                    decide_s += fs.decide_s;
                    step_s += fs.step_s;
                    for (int t = 0; !e && t < p->n_gen; t++) {
                        const float *pa = p->logits + (size_t)t * (size_t)vocab;
                        const float *pb = lg + (size_t)t * (size_t)vocab;
                        match += sampler_argmax(pb, vocab) == p->gen[t];
                        kl += eval__kl(pa, pb, vocab);
                        int d = depth[t] < 0 ? 0 : depth[t] > L ? L : depth[t];
                        hist[d]++;
                        if (off) {
                            offload_record(off, d);
                            if (t % 16 == 15)
                                offload_update(off, NULL);
                        }
                        depth_sum += d;
                        if (sc.policy.kv == EXIT_KV_RIVER && sc.policy.rule != EXIT_RULE_NONE)
                            river_sum += L - d;
                        n_tok++;
                    }
                }
            }
        }
        for (int r = 0; r < n_rep && !e; r++) {
            bb_t[r] = (double)bb_tokens / bs[r];
            set_t[r] = (double)n_dec / ss[r];
            ratio[r] = set_t[r] / bb_t[r];
        }
        int64_t rss_after = offload_rss_bytes();
        int64_t evicted_bytes = off ? offload_evicted_bytes(off) : 0;
        int64_t reloads = off ? offload_reloads(off) : 0;
        int n_evicted = 0;
        for (int l = 0; off && l < L; l++)
            n_evicted += offload_is_evicted(off, l);
        forward_set_exit(f, NULL);
        offload_destroy(&off);
        if (e) {
            free(hist);
            goto done;
        }
        /* Bytes a token reads on this setting's paths against the plain backbone's. */
        spec_bytes_t pb, sb;
        dtype_t kv_dt = gen_kv_dtype(m, cli_env_kv_dtype());
        spec_path_bytes(m, NULL, L, ctx_mean, kv_dt, &pb);
        spec_path_bytes_mean(m, &sc, hist, ctx_mean, kv_dt, &sb);
        double tok_s = cli_median(set_t, n_rep);
        double ideal_bytes = pb.total / sb.total;
        double mean_depth = depth_sum / (double)n_tok;
        double mean_river = river_sum / (double)n_tok;
        double bb_layers = sc.policy.kv == EXIT_KV_POSTHOC || sc.policy.rule == EXIT_RULE_NONE
                               ? L : mean_depth;
        double ideal_layers = (double)L / (bb_layers + r_ratio * mean_river);
        double bb_tok_s = cli_median(bb_t, n_rep);
        double speedup = cli_median(ratio, n_rep);
        struct rusage ru;
        getrusage(RUSAGE_SELF, &ru);
        long long rss = (long long)ru.ru_maxrss * 1024;
        double value = sc.policy.rule == EXIT_RULE_COSINE   ? sc.policy.tau
                       : sc.policy.rule == EXIT_RULE_ROUTER ? sc.policy.theta
                       : sc.policy.rule == EXIT_RULE_FIXED  ? sc.policy.exit_layer
                                                            : 0;
        if (json) {
            /* Entry d holds the tokens that left after d layers, as ExitStats.histogram
             * (L + 1 entries; entry 0 is a token that ran no backbone layer). */
            json_t *h = json_array();
            for (int d = 0; d <= L; d++)
                json_array_append_new(h, json_integer(hist[d]));
            json_t *o = json_pack(
                "{s:s, s:s, s:s, s:f, s:f, s:o, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:I, s:I}",
                "policy", exit_rule_name(sc.policy.rule), "strategy",
                exit_kv_name(sc.policy.kv), "aggregation",
                exit_agg_name(sc.policy.agg), "tau", (double)sc.policy.tau,
                "mean_exit_layer", mean_depth, "exit_histogram", h, "match_rate",
                (double)match / (double)n_tok, "kl", kl / (double)n_tok, "tok_s", tok_s,
                "backbone_tok_s", bb_tok_s, "speedup", speedup, "ideal_speedup_bytes",
                ideal_bytes, "realized_over_ideal", speedup / ideal_bytes, "r", r_ratio,
                "decision_fraction",
                step_s > 0 ? decide_s / step_s : 0.0, "peak_rss_bytes",
                (json_int_t)rss, "tokens", (json_int_t)n_tok);
            if (o && offload_threshold > 0) {
                json_object_set_new(o, "offload_threshold", json_real(offload_threshold));
                json_object_set_new(o, "evicted_layers", json_integer(n_evicted));
                json_object_set_new(o, "evicted_bytes", json_integer(evicted_bytes));
                json_object_set_new(o, "offload_reloads", json_integer(reloads));
                json_object_set_new(o, "rss_before_bytes", json_integer(rss_before));
                json_object_set_new(o, "rss_after_bytes", json_integer(rss_after));
            }
            if (o) {
                json_object_set_new(o, "bytes_per_token", json_real(sb.total));
                json_object_set_new(o, "bytes_backbone_layers", json_real(sb.backbone_layers));
                json_object_set_new(o, "bytes_river_layers", json_real(sb.river_layers));
                json_object_set_new(o, "bytes_heads", json_real(sb.heads));
                json_object_set_new(o, "bytes_kv", json_real(sb.kv));
                json_object_set_new(o, "mean_context", json_real(ctx_mean));
                json_object_set_new(o, "plain_bytes_per_token", json_real(pb.total));
                json_object_set_new(o, "ideal_speedup_layers", json_real(ideal_layers));
                json_object_set_new(o, "repeat", json_integer(n_rep));
                if (ref_path)
                    json_object_set_new(o, "reference", json_string(ref_path));
                json_object_set_new(o, "value", json_real(value));
                json_object_set_new(o, "simd", json_string(cli_env_simd_name(&env)));
                cli_json_print(o);
            }
        } else {
            printf("%-8s %-9s %8.3f %7.2f %7.2f%% %8.4f %9.1f %9.1f %8.2f %8.2f %7.2f\n",
                   exit_rule_name(sc.policy.rule), exit_kv_name(sc.policy.kv), value,
                   mean_depth, 100.0 * (double)match / (double)n_tok, kl / (double)n_tok, tok_s,
                   bb_tok_s, speedup, ideal_bytes, speedup / ideal_bytes);
            printf("         exit histogram (layers 0..%d):", L);
            for (int d = 0; d <= L; d++)
                printf(" %lld", (long long)hist[d]);
            printf("\n         decision %.3f%% of step time, peak RSS %.1f MiB, r = %.3f, "
                   "layer-ratio ideal %.3f, medians of %d rounds\n",
                   step_s > 0 ? 100.0 * decide_s / step_s : 0.0,
                   (double)rss / 1048576.0, r_ratio, ideal_layers, n_rep);
            printf("         bytes/token %.4f MB (backbone layers %.4f, river layers %.4f, "
                   "heads %.4f, KV %.4f at %.1f positions; plain %.4f)\n", sb.total / 1e6,
                   sb.backbone_layers / 1e6, sb.river_layers / 1e6, sb.heads / 1e6,
                   sb.kv / 1e6, ctx_mean, pb.total / 1e6);
            if (offload_threshold > 0)
                printf("         offload < %.3f: %d layers released (%.1f MiB), %lld reloads, "
                       "RSS %.1f -> %.1f MiB\n", offload_threshold, n_evicted,
                       (double)evicted_bytes / 1048576.0, (long long)reloads,
                       (double)rss_before / 1048576.0, (double)rss_after / 1048576.0);
        }
        free(hist);
    }
    rc = 0;
done:
    if (e)
        rc = cli_fail("eval", e);
    for (int i = 0; i < n_ps; i++) {
        free(ps[i].ids);
        free(ps[i].gen);
        free(ps[i].logits);
    }
    free(ps);
    free(lg);
    free(depth);
    kv_pool_destroy(&kv);
    forward_destroy(&f);
    exit_setup_close(&xc);
    cli_env_close(&env);
    return rc;

bad_value:
    fprintf(stderr, "river eval: bad value '%s' for --%s\n", optarg, opts[li].name);
    return 2;
}
