/* river bench --prefix-reuse: a multi-turn chat whose history grows to N tokens, run once
 * without the prefix cache and once with it on one generator, timing each turn's first
 * token. The first turn is a leading context (a system prompt, a document) of
 * N - (T - 1) * (U + G) tokens; each later turn's prompt is the last prompt, the model's
 * answer to it (G tokens) and a new user message (U tokens), so the last turn's prompt is N
 * tokens and with the cache a turn prefills only what the last one did not hold. When N is
 * too short for that, the turns grow evenly to N instead. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/cli.h"
#include "common/clock.h"
#include "common/err.h"
#include "engine/generate.h"
#include "kernels/cpu/cpu.h"

typedef struct bp_turn {
    double t0, first;  /* submit and first token, seconds */
    double c0, cfirst; /* the same in CPU time of the process (all threads), seconds */
    int32_t *ids;      /* (n) generated */
    int n, cap;
    int cached;
} bp_turn_t;

/* CPU time of every thread of the process: on a machine other programs share, the work a
 * turn took rather than how long it waited for a core. */
static double bp__cpu(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void bp__on_token(void *user, const gen_event_t *ev)
{
    bp_turn_t *t = user;
    if (ev->id < 0)
        return;
    if (!t->first) {
        t->first = clock_now_s();
        t->cfirst = bp__cpu();
    }
    if (t->n < t->cap)
        t->ids[t->n++] = ev->id;
    t->cached = ev->cached_tokens;
}

/* Runs the chat on g: turn k's prompt is prompts[k] (n_prompt[k] ids). */
static int bp__run(gen_t *g, int32_t *const *prompts, const size_t *n_prompt, int turns,
                   int gen_len, bp_turn_t *out)
{
    for (int k = 0; k < turns; k++) {
        out[k].n = 0;
        out[k].first = 0;
        gen_request_t r = {.prompt = prompts[k], .n_prompt = n_prompt[k],
                           .max_tokens = gen_len, .ignore_eos = 1,
                           .on_token = bp__on_token, .user = &out[k]};
        int seq;
        out[k].t0 = clock_now_s();
        out[k].c0 = bp__cpu();
        int e = gen_submit(g, &r, &seq);
        if (!e)
            e = gen_run_all(g);
        if (e)
            return e;
    }
    return 0;
}

int bench_prefix_reuse(cli_env_t *env, int history, int turns, int gen_len, int user_len,
                       int json)
{
    const model_config_t *cfg = &env->model->cfg;
    if (turns < 1 || history < turns * 2 || history + gen_len >= cfg->max_seq_len)
        return river_err_set(RIVER_EINVAL, "--history %d with %d turns and --gen-len %d: "
                             "need 2 * turns <= history and history + gen-len below the "
                             "context of %d", history, turns, gen_len, cfg->max_seq_len);
    int e = 0;
    gen_t *cold = NULL, *warm = NULL;
    int32_t **prompts = calloc((size_t)turns, sizeof *prompts);
    size_t *n_prompt = calloc((size_t)turns, sizeof *n_prompt);
    bp_turn_t *a = calloc((size_t)turns, sizeof *a), *b = calloc((size_t)turns, sizeof *b);
    if (!prompts || !n_prompt || !a || !b) {
        e = river_err_set(RIVER_ENOMEM, "bench buffers");
        goto done;
    }
    for (int k = 0; k < turns && !e; k++) {
        prompts[k] = malloc(sizeof **prompts * (size_t)(history + gen_len));
        a[k].ids = malloc(sizeof *a[k].ids * (size_t)gen_len);
        b[k].ids = malloc(sizeof *b[k].ids * (size_t)gen_len);
        a[k].cap = b[k].cap = gen_len;
        if (!prompts[k] || !a[k].ids || !b[k].ids)
            e = river_err_set(RIVER_ENOMEM, "bench buffers");
    }
    if (e)
        goto done;
    int chunk = 256;
    gen_config_t gc = {.max_rows = chunk, .prefill_chunk = chunk, .page_size = 16,
                       .kv_dtype = cli_env_kv_dtype(),
                       .max_seqs = 1};
    if ((e = gen_new(&cold, env->model, NULL, env->be, &gc)))
        goto done;
    gc.prefix_cache = 1;
    gc.prefix_seed = 1;
    if ((e = gen_new(&warm, env->model, NULL, env->be, &gc)))
        goto done;
    /* The prompts: turn k holds turn k-1's prompt, the answer the model gave it (greedy,
     * from the run without the cache) and new pseudo-random user ids. */
    uint32_t x = 12345;
    long first = (long)history - (long)(turns - 1) * (user_len + gen_len);
    int even = first < user_len;
    for (int k = 0; k < turns; k++) {
        size_t n = 0;
        if (k) {
            memcpy(prompts[k], prompts[k - 1], n_prompt[k - 1] * sizeof **prompts);
            n = n_prompt[k - 1];
            memcpy(prompts[k] + n, a[k - 1].ids, (size_t)a[k - 1].n * sizeof **prompts);
            n += (size_t)a[k - 1].n;
        }
        size_t want = even ? (size_t)history * (size_t)(k + 1) / (size_t)turns
                           : (size_t)(first + (long)k * (user_len + gen_len));
        if (want < n + 1)
            want = n + 1;
        while (n < want) {
            x = x * 1664525u + 1013904223u;
            prompts[k][n++] = (int32_t)((x >> 8) % (uint32_t)cfg->vocab_size);
        }
        n_prompt[k] = n;
        /* Only this turn of the cold run: its answer is part of the next prompt. */
        if ((e = bp__run(cold, &prompts[k], &n_prompt[k], 1, gen_len, &a[k])))
            goto done;
    }
    if ((e = bp__run(warm, prompts, n_prompt, turns, gen_len, b)))
        goto done;
    int identical = 1;
    for (int k = 0; k < turns; k++) {
        identical &= a[k].n == b[k].n;
        for (int i = 0; identical && i < a[k].n; i++)
            identical &= a[k].ids[i] == b[k].ids[i];
    }
    /* TTFT over the turns after the first, where the history could be reused. */
    double cold_ms = 0, warm_ms = 0, cold_cpu = 0, warm_cpu = 0;
    int from = turns > 1 ? 1 : 0;
    for (int k = from; k < turns; k++) {
        cold_ms += (a[k].first - a[k].t0) * 1e3;
        warm_ms += (b[k].first - b[k].t0) * 1e3;
        cold_cpu += (a[k].cfirst - a[k].c0) * 1e3;
        warm_cpu += (b[k].cfirst - b[k].c0) * 1e3;
    }
    cold_ms /= (double)(turns - from);
    warm_ms /= (double)(turns - from);
    cold_cpu /= (double)(turns - from);
    warm_cpu /= (double)(turns - from);
    gen_stats_t st;
    gen_get_stats(warm, &st);
    double hit_rate = st.prefix_query_tokens
                          ? (double)st.prefix_hit_tokens / (double)st.prefix_query_tokens
                          : 0.0;
    int threads = cli_env_is_cpu(env) ? cpu_backend_threads(env->be) : 1;
    if (json) {
        json_t *tc = json_array(), *tw = json_array(), *cached = json_array(),
               *lens = json_array();
        for (int k = 0; k < turns; k++) {
            json_array_append_new(tc, json_real((a[k].first - a[k].t0) * 1e3));
            json_array_append_new(tw, json_real((b[k].first - b[k].t0) * 1e3));
            json_array_append_new(cached, json_integer(b[k].cached));
            json_array_append_new(lens, json_integer((json_int_t)n_prompt[k]));
        }
        json_t *o = json_pack("{s:i, s:i, s:i, s:i, s:i, s:f, s:f, s:f, s:f, s:f, s:b, s:f, "
                              "s:o, s:o, s:o, s:o}",
                              "history", history, "turns", turns, "gen_len", gen_len,
                              "user_len", user_len,
                              "threads", threads, "ttft_cold_ms", cold_ms,
                              "ttft_cached_ms", warm_ms,
                              "speedup", warm_ms > 0 ? cold_ms / warm_ms : 0.0,
                              "ttft_cold_cpu_ms", cold_cpu, "ttft_cached_cpu_ms", warm_cpu,
                              "identical", identical, "hit_rate", hit_rate,
                              "prompt_tokens", lens, "cached_tokens", cached,
                              "ttft_cold_ms_by_turn", tc, "ttft_cached_ms_by_turn", tw);
        char *s = o ? json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(6)) : NULL;
        if (s)
            printf("%s\n", s);
        free(s);
        json_decref(o);
    } else {
        printf("turns %d, history %d tokens, %d generated per turn, %d threads\n", turns,
               history, gen_len, threads);
        printf("%5s %8s %8s %14s %14s\n", "turn", "prompt", "cached", "ttft_cold_ms",
               "ttft_cached_ms");
        for (int k = 0; k < turns; k++)
            printf("%5d %8zu %8d %14.2f %14.2f\n", k + 1, n_prompt[k], b[k].cached,
                   (a[k].first - a[k].t0) * 1e3, (b[k].first - b[k].t0) * 1e3);
        printf("ttft_cold_ms    %.2f\nttft_cached_ms  %.2f\nspeedup         %.2f\n"
               "ttft_cold_cpu_ms    %.2f\nttft_cached_cpu_ms  %.2f\n"
               "identical       %s\nhit_rate        %.3f\n", cold_ms, warm_ms,
               warm_ms > 0 ? cold_ms / warm_ms : 0.0, cold_cpu, warm_cpu,
               identical ? "true" : "false", hit_rate);
    }
done:
    for (int k = 0; k < turns && prompts && a && b; k++) {
        free(prompts[k]);
        free(a[k].ids);
        free(b[k].ids);
    }
    free(prompts);
    free(n_prompt);
    free(a);
    free(b);
    gen_destroy(&cold);
    gen_destroy(&warm);
    return e;
}
