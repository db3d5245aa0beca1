/* river calibrate: train TIDE exit routers on the frozen model over calibration text, or
 * (--generate) write calibration text sampled from the model itself. */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"
#include "common/clock.h"
#include "common/err.h"
#include "common/file.h"
#include "engine/generate.h"
#include "engine/router.h"
#include "offline/router_calib.h"
#include "offline/router_train.h"

static void cal__usage(FILE *f)
{
    fprintf(f,
            "usage: river calibrate --model PATH [--tokenizer PATH] --text FILE [--interval N]\n"
            "                       [--label-tau T|auto] [--epochs N] [--batch N]\n"
            "                       [--pos-weight W|balanced] [--max-tokens N] [--window N]\n"
            "                       [--seed S] [--threads N] [--out FILE] [--kv-dtype D]\n"
            "       river calibrate --model PATH [--tokenizer PATH] --generate N --out FILE\n"
            "                       [--gen-tokens N] [--temperature T] [--seed S] [--threads N]\n"
            "                       [--kv-dtype auto|f32|f16|bf16|q8]\n"
            "\n"
            "Runs the model over the text (paragraphs separated by blank lines are documents;\n"
            "windows of up to --window positions, each starting with BOS), labels a token\n"
            "converged at checkpoint k when cos(h_k, h_L) > --label-tau, trains one router per\n"
            "checkpoint (after layers interval-1, 2*interval-1, ... below the last) with BCE\n"
            "and Adam on 90%% of the tokens, reports it on the other 10%% and writes the\n"
            "routers as safetensors (default: routers.safetensors beside the model).\n"
            "Defaults: interval 4, label tau auto (the median cosine over all checkpoints and\n"
            "tokens, so that half the labels are positive; TIDE's fixed 0.98 leaves nearly\n"
            "every label 0 on small models), 100 epochs, batch 64, plain BCE (--pos-weight 1),\n"
            "no token limit, window min(context, 1024), seed 1.\n"
            "\n"
            "--generate N writes N samples (prompt + completion, one paragraph each) from a\n"
            "built-in list of varied prompts, sampled at --temperature (0.8) for up to\n"
            "--gen-tokens (160) tokens, seeded per sample.\n");
}


/* ---- --generate ----------------------------------------------------------------------- */

/* Openings of many kinds (stories, scripture, proverbs, letters, plain prose), so that the
 * sampled text covers more than one register of whatever the model learned. */
static const char *const cal_prompts[] = {
    "Once upon a time",
    "One day, a little girl named Lily",
    "The big dog ran to the park and",
    "Tom and his friend Sam wanted to build",
    "In the beginning",
    "And the LORD spake unto Moses, saying,",
    "Blessed are the",
    "And it came to pass, when the king",
    "The wise man said that",
    "A fool and his money",
    "There was an old woman who lived",
    "The sun was shining and the birds",
    "My dear friend, I write to tell you",
    "Yesterday I went to the market and",
    "The little bird could not fly, so",
    "Hear, O Israel:",
    "When the night came, the children",
    "He that keepeth his mouth",
    "It was a cold winter morning when",
    "The cat looked at the box and",
    "Thus saith the LORD of hosts,",
    "Mom said, \"Don't",
    "The boy found a shiny stone under",
    "Knowledge is",
    "The teacher asked the class",
    "And Jesus answered and said unto them,",
    "A long time ago, in a small village,",
    "The rain fell all day, and",
    "Every morning, the old farmer",
    "Praise ye the LORD.",
    "Ben was sad because his toy",
    "The computer",
    "Love is",
    "On the first day of school,",
    "The princess opened the door and saw",
    "My son, forget not",
};
#define CAL_N_PROMPTS ((int)(sizeof cal_prompts / sizeof cal_prompts[0]))

/* One sample: its prompt ids, then the ids generated after them. Text is made at the end
 * by decoding all of them with special tokens skipped, so that neither BOS nor the EOS that
 * ends a story ends up in the calibration text. */
typedef struct cal_sample {
    int32_t *ids;   /* (n) */
    size_t n, cap;
    int failed;
} cal_sample_t;

static int cal__push(cal_sample_t *s, const int32_t *ids, size_t n)
{
    if (s->n + n > s->cap) {
        size_t c = s->cap ? s->cap * 2 : 256;
        while (c < s->n + n)
            c *= 2;
        int32_t *p = realloc(s->ids, c * sizeof *p);
        if (!p)
            return -1;
        s->ids = p;
        s->cap = c;
    }
    memcpy(s->ids + s->n, ids, n * sizeof *ids);
    s->n += n;
    return 0;
}

static void cal__on_token(void *user, const gen_event_t *ev)
{
    cal_sample_t *s = user;
    if (ev->id >= 0 && cal__push(s, &ev->id, 1))
        s->failed = 1;
}

/* Writes one sample as one paragraph: blank lines inside it would split it into several
 * documents, so they go, as do leading and trailing blanks. */
static int cal__write_paragraph(FILE *f, const char *t, size_t n, int first)
{
    size_t a = 0, b = n;
    while (a < b && (t[a] == ' ' || t[a] == '\n' || t[a] == '\r' || t[a] == '\t'))
        a++;
    while (b > a && (t[b - 1] == ' ' || t[b - 1] == '\n' || t[b - 1] == '\r' ||
                     t[b - 1] == '\t'))
        b--;
    if (a == b)
        return 0;
    if (!first && fputs("\n", f) == EOF)
        return -1;
    int blank = 1;
    size_t line = a;
    for (size_t i = a; i <= b; i++) {
        if (i < b && t[i] != '\n') {
            if (t[i] != ' ' && t[i] != '\t' && t[i] != '\r')
                blank = 0;
            continue;
        }
        if (!blank && (fwrite(t + line, 1, i - line, f) != i - line || fputc('\n', f) == EOF))
            return -1;
        line = i + 1;
        blank = 1;
    }
    return 0;
}

static int cal__generate(cli_env_t *env, int n, int gen_tokens, float temperature,
                         uint64_t seed, const char *out_path)
{
    const model_t *m = env->model;
    int bos = m->cfg.bos_id >= 0 ? m->cfg.bos_id : tokenizer_bos_id(env->tok);
    gen_t *g = NULL;
    FILE *f = NULL;
    char part[4096];
    int e = 0;
    cal_sample_t *samples = calloc((size_t)n, sizeof *samples);
    int32_t **prompts = calloc((size_t)n, sizeof *prompts);
    size_t *n_prompt = calloc((size_t)n, sizeof *n_prompt);
    if (!samples || !prompts || !n_prompt) {
        e = river_err_set(RIVER_ENOMEM, "generate: %d samples", n);
        goto done;
    }
    int max_seqs = 8;
    gen_config_t gc = {.max_rows = 64, .prefill_chunk = 64, .page_size = 16,
                       .kv_dtype = cli_env_kv_dtype(),
                       .max_seqs = max_seqs};
    if ((e = gen_new(&g, m, env->tok, env->be, &gc)))
        goto done;
    for (int i = 0; i < n; i++) {
        const char *p = cal_prompts[i % CAL_N_PROMPTS];
        int32_t *ids = NULL;
        size_t k = 0;
        if ((e = tokenizer_encode(env->tok, p, strlen(p), 0, &ids, &k)))
            goto done;
        int has_bos = bos >= 0;
        prompts[i] = malloc(sizeof *prompts[i] * (k + 1));
        if (!prompts[i]) {
            free(ids);
            e = river_err_set(RIVER_ENOMEM, "generate: prompt");
            goto done;
        }
        if (has_bos)
            prompts[i][0] = bos;
        if (k)
            memcpy(prompts[i] + has_bos, ids, sizeof *ids * k);
        free(ids);
        n_prompt[i] = k + (size_t)has_bos;
        if (cal__push(&samples[i], prompts[i], n_prompt[i])) {
            e = river_err_set(RIVER_ENOMEM, "generate: sample ids");
            goto done;
        }
    }
    int next = 0;
    while (next < n || gen_active(g)) {
        while (next < n && gen_active(g) < max_seqs) {
            gen_request_t r = {
                .prompt = prompts[next], .n_prompt = n_prompt[next], .max_tokens = gen_tokens,
                .sampling = {.temperature = temperature, .top_k = 40, .top_p = 0.95f,
                             .seed = seed + (uint64_t)next},
                .on_token = cal__on_token, .user = &samples[next],
            };
            int seq;
            if ((e = gen_submit(g, &r, &seq)))
                goto done;
            next++;
        }
        if ((e = gen_step(g)))
            goto done;
    }
    snprintf(part, sizeof part, "%s.part", out_path);
    f = fopen(part, "wb");
    if (!f) {
        e = river_err_set(RIVER_EIO, "%s: cannot create: %s", part, strerror(errno));
        goto done;
    }
    int first = 1;
    for (int i = 0; i < n; i++) {
        if (samples[i].failed) {
            e = river_err_set(RIVER_ENOMEM, "generate: sample %d ids", i);
            goto done;
        }
        char *text = NULL;
        size_t len = 0;
        if ((e = tokenizer_decode(env->tok, samples[i].ids, samples[i].n, 1, &text, &len)))
            goto done;
        int we = cal__write_paragraph(f, text, len, first);
        free(text);
        if (we) {
            e = river_err_set(RIVER_EIO, "%s: write failed: %s", part, strerror(errno));
            goto done;
        }
        first = 0;
    }
    int ce = fclose(f);
    f = NULL;
    if (ce) {
        e = river_err_set(RIVER_EIO, "%s: close failed: %s", part, strerror(errno));
        goto done;
    }
    if (rename(part, out_path)) {
        e = river_err_set(RIVER_EIO, "%s: cannot rename into place: %s", out_path,
                          strerror(errno));
        goto done;
    }
    fprintf(stderr, "river calibrate: wrote %d samples to %s\n", n, out_path);

done:
    if (f) {
        fclose(f);
        remove(part);
    }
    gen_destroy(&g);
    for (int i = 0; samples && i < n; i++)
        free(samples[i].ids);
    for (int i = 0; prompts && i < n; i++)
        free(prompts[i]);
    free(samples);
    free(prompts);
    free(n_prompt);
    return e;
}

/* ---- calibration ---------------------------------------------------------------------- */

static void cal__print_reports(const router_train_report_t *reps, int n, float tau,
                               const router_calib_t *c)
{
    printf("\n%5s %8s %7s %9s %9s %7s %7s %19s %9s\n", "layer", "samples", "pos", "majority",
           "held-acc", "prec", "recall", "train loss first->last", "held-loss");
    for (int i = 0; i < n; i++) {
        const router_train_report_t *r = &reps[i];
        char prec[16], rec[16];
        if (isnan(r->held_precision))
            snprintf(prec, sizeof prec, "-");
        else
            snprintf(prec, sizeof prec, "%.1f%%", 100 * r->held_precision);
        if (isnan(r->held_recall))
            snprintf(rec, sizeof rec, "-");
        else
            snprintf(rec, sizeof rec, "%.1f%%", 100 * r->held_recall);
        printf("%5d %8lld %6.1f%% %8.1f%% %8.1f%% %7s %7s    %8.4f -> %-8.4f %9.4f\n", r->layer,
               (long long)r->n_samples, 100 * r->pos_frac, 100 * r->majority_acc,
               100 * r->held_acc, prec, rec, r->loss_first, r->loss_last, r->held_loss);
    }
    printf("\nloss curves (mean training BCE per epoch):\n");
    for (int i = 0; i < n; i++) {
        const router_train_report_t *r = &reps[i];
        printf("  layer %d:", r->layer);
        int marks[] = {0, r->epochs / 10, r->epochs / 4, r->epochs / 2, 3 * r->epochs / 4,
                       r->epochs - 1};
        int last = -1;
        for (size_t k = 0; k < sizeof marks / sizeof marks[0]; k++) {
            if (marks[k] <= last)
                continue;
            last = marks[k];
            printf(" e%d %.4f", marks[k] + 1, r->loss_curve[marks[k]]);
        }
        printf("\n");
    }
    for (int i = 0; i < n; i++) {
        const router_train_report_t *r = &reps[i];
        if (r->pos_frac < 0.02 || r->pos_frac > 0.98)
            fprintf(stderr, "river calibrate: warning: layer %d labels are %.1f%% positive at "
                    "tau %.3f, so its router has little to learn (median cosine there: %.3f; "
                    "a --label-tau near it balances the task)\n", r->layer, 100 * r->pos_frac,
                    (double)tau, (double)router_calib_cos_quantile(c, i, 0.5));
    }
}

int cmd_calibrate(int argc, char **argv)
{
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'},      {"tokenizer", required_argument, 0, 'k'},
        {"text", required_argument, 0, 'x'},       {"interval", required_argument, 0, 'i'},
        {"label-tau", required_argument, 0, 'T'},  {"epochs", required_argument, 0, 'e'},
        {"batch", required_argument, 0, 'b'},      {"pos-weight", required_argument, 0, 'w'},
        {"max-tokens", required_argument, 0, 'n'}, {"window", required_argument, 0, 'W'},
        {"seed", required_argument, 0, 's'},       {"threads", required_argument, 0, 'j'},
        {"out", required_argument, 0, 'o'},        {"generate", required_argument, 0, 'g'},
        {"gen-tokens", required_argument, 0, 'G'}, {"temperature", required_argument, 0, 't'},
        {"kv-dtype", required_argument, 0, 1100},
        {"help", no_argument, 0, 'h'},             {0, 0, 0, 0},
    };
    const char *model_path = NULL, *tok_path = NULL, *text_path = NULL, *out_path = NULL;
    long interval = ROUTER_DEFAULT_INTERVAL, epochs = 100, batch = 64, max_tokens = 0;
    long window = 0, seed = 1, threads = 0, generate = 0, gen_tokens = 160;
    double tau = NAN, pos_weight = 1, temperature = 0.8; /* tau NaN: auto */
    int c, li = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, &li)) != -1) {
        switch (c) {
        case 'm': model_path = optarg; break;
        case 'k': tok_path = optarg; break;
        case 'x': text_path = optarg; break;
        case 'o': out_path = optarg; break;
        case 'i':
            if (cli_parse_int(optarg, 1, 1 << 20, &interval))
                goto bad_value;
            break;
        case 'T':
            if (!strcmp(optarg, "auto"))
                tau = NAN;
            else if (cli_parse_float(optarg, &tau) || tau < -1 || tau > 1)
                goto bad_value;
            break;
        case 'e':
            if (cli_parse_int(optarg, 1, 1 << 20, &epochs))
                goto bad_value;
            break;
        case 'b':
            if (cli_parse_int(optarg, 1, 1 << 20, &batch))
                goto bad_value;
            break;
        case 'w':
            if (!strcmp(optarg, "balanced"))
                pos_weight = 0;
            else if (cli_parse_float(optarg, &pos_weight) || pos_weight <= 0)
                goto bad_value;
            break;
        case 'n':
            if (cli_parse_int(optarg, 1, 1L << 40, &max_tokens))
                goto bad_value;
            break;
        case 'W':
            if (cli_parse_int(optarg, 2, 1 << 24, &window))
                goto bad_value;
            break;
        case 's':
            if (cli_parse_int(optarg, 0, 0x7fffffffL, &seed))
                goto bad_value;
            break;
        case 'j':
            if (cli_parse_int(optarg, 0, 1024, &threads))
                goto bad_value;
            break;
        case 'g':
            if (cli_parse_int(optarg, 1, 1 << 20, &generate))
                goto bad_value;
            break;
        case 'G':
            if (cli_parse_int(optarg, 1, 1 << 20, &gen_tokens))
                goto bad_value;
            break;
        case 't':
            if (cli_parse_float(optarg, &temperature) || temperature < 0)
                goto bad_value;
            break;
        case 1100: {
            int ke = cli_env_set_kv_dtype(optarg);
            if (ke)
                return cli_fail("calibrate", ke);
            break;
        }
        case 'h': cal__usage(stdout); return 0;
        default: cal__usage(stderr); return 2;
        }
    }
    if (!model_path || optind != argc || (generate ? !out_path : !text_path)) {
        fprintf(stderr, "river calibrate: --model and --text (or --generate N with --out) "
                "are required\n");
        cal__usage(stderr);
        return 2;
    }

    cli_env_t env;
    int e = cli_env_open(&env, model_path, tok_path, (int)threads, 1);
    if (e)
        return cli_fail("calibrate", e);
    if (generate) {
        e = cal__generate(&env, (int)generate, (int)gen_tokens, (float)temperature,
                          (uint64_t)seed, out_path);
        cli_env_close(&env);
        return e ? cli_fail("calibrate", e) : 0;
    }

    int rc = 1;
    char *text = NULL, default_out[4096];
    size_t len = 0;
    router_calib_t *cal = NULL;
    router_set_t *set = NULL;
    router_train_report_t *reps = NULL;
    if (!out_path) {
        snprintf(default_out, sizeof default_out, "%s/routers.safetensors",
                 env.model->dir ? env.model->dir : ".");
        out_path = default_out;
    }
    if ((e = river_read_file(text_path, &text, &len)))
        goto done;
    double t0 = clock_now_s();
    router_calib_opts_t co = {.interval = (int)interval, .max_tokens = max_tokens,
                              .kv_dtype = cli_env_kv_dtype(),
                              .window = (int)window};
    if ((e = router_calib_collect(&cal, env.model, env.tok, env.be, text, len, &co)))
        goto done;
    double t1 = clock_now_s();
    printf("river calibrate: %lld tokens from %lld documents (%lld windows) in %.1f s; "
           "checkpoints after layers", (long long)cal->n, (long long)cal->n_docs,
           (long long)cal->n_windows, t1 - t0);
    for (int i = 0; i < cal->n_ckpt; i++)
        printf(" %d", cal->layers[i]);
    printf(" of %d\n", env.model->cfg.n_layers);
    int auto_tau = isnan(tau);
    if (auto_tau)
        tau = router_calib_auto_tau(cal);
    printf("cos(h_k, h_L) per checkpoint:   p10     p50     p90   pos@tau  pos@0.98\n");
    for (int i = 0; i < cal->n_ckpt; i++)
        printf("  layer %-3d                    %.4f  %.4f  %.4f  %6.1f%%  %6.1f%%\n",
               cal->layers[i], (double)router_calib_cos_quantile(cal, i, 0.1),
               (double)router_calib_cos_quantile(cal, i, 0.5),
               (double)router_calib_cos_quantile(cal, i, 0.9),
               100 * router_calib_pos_frac(cal, i, (float)tau),
               100 * router_calib_pos_frac(cal, i, 0.98f));
    printf("label tau %.4f%s\n", tau, auto_tau ? " (auto: median cosine over all checkpoints)"
                                               : "");

    if ((e = router_set_new(&set, env.model, (int)interval, (float)tau, (uint64_t)seed)))
        goto done;
    int n = router_set_count(set);
    reps = calloc((size_t)n, sizeof *reps);
    if (!reps) {
        e = river_err_set(RIVER_ENOMEM, "reports");
        goto done;
    }
    router_train_opts_t to = router_train_defaults();
    to.epochs = (int)epochs;
    to.batch = (int)batch;
    to.pos_weight = (float)pos_weight;
    to.seed = (uint64_t)seed;
    /* Routers train independently, one per thread, as many at once as --threads (or the
     * online cores) allow; the result does not depend on it. */
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    to.n_threads = threads > 0 ? (int)threads : cores > 0 ? (int)cores : 1;
    printf("training %d router%s: %ld epochs, batch %ld, lr %g, %s\n", n, n == 1 ? "" : "s",
           epochs, batch, (double)to.lr, pos_weight > 0 ? "plain BCE" : "balanced BCE");
    fflush(stdout);
    if ((e = router_set_train(set, cal, &to, reps)))
        goto done;
    double t2 = clock_now_s();
    cal__print_reports(reps, n, (float)tau, cal);
    if ((e = router_set_save(set, out_path)))
        goto done;
    printf("\nwrote %s (%d router%s); collect %.1f s, train %.1f s\n", out_path, n,
           n == 1 ? "" : "s", t1 - t0, t2 - t1);
    rc = 0;

done:
    if (e)
        rc = cli_fail("calibrate", e);
    for (int i = 0; reps && i < router_set_count(set); i++)
        router_train_report_free(&reps[i]);
    free(reps);
    router_set_destroy(&set);
    router_calib_destroy(&cal);
    free(text);
    cli_env_close(&env);
    return rc;

bad_value:
    fprintf(stderr, "river calibrate: bad value '%s' for --%s\n", optarg, opts[li].name);
    return 2;
}
