/* river bench --profile: where one decode step's time goes, op by op (kernels/profile.h),
 * against the read bandwidth of the machine. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "cli/cli.h"
#include "common/err.h"
#include "engine/exit_setup.h"
#include "engine/generate.h"
#include "kernels/cpu/cpu.h"
#include "kernels/profile.h"

/* What a run times: nothing (the warm-up), the decode steps after the prompt, or the
 * prompt's steps. */
enum { PROF_OFF, PROF_DECODE, PROF_PREFILL };

/* Runs one request of n_prompt tokens and gen_len more, a step at a time. PROF_DECODE: the
 * profile's window starts after the step that ran the prompt's last chunk (a prompt longer
 * than a chunk takes several steps), and *steps is the decode-only steps after it.
 * PROF_PREFILL: the window holds the prompt's steps, the run stops after the last of them
 * (the request stays in g), and *steps is 1, the prompt. */
static int prof__generate(gen_t *g, backend_t *be, const int32_t *prompt, int n_prompt,
                          int gen_len, int mode, int64_t *steps)
{
    gen_request_t req = {.prompt = prompt, .n_prompt = (size_t)n_prompt,
                         .max_tokens = gen_len + 1, .ignore_eos = 1};
    int seq;
    int e = gen_submit(g, &req, &seq);
    gen_stats_t a, b;
    gen_get_stats(g, &a);
    b = a;
    const int64_t prefilled = a.prefill_tokens + n_prompt;
    int started = 0;
    if (!e && mode == PROF_PREFILL)
        e = profile_reset(be);
    while (!e && gen_active(g)) {
        e = gen_step(g);
        gen_get_stats(g, &b);
        if (!e && mode == PROF_PREFILL && b.prefill_tokens >= prefilled) {
            *steps = 1;
            return 0;
        }
        if (!e && mode == PROF_DECODE && !started && b.prefill_tokens >= prefilled) {
            e = profile_reset(be);
            started = 1;
            a = b;
        }
    }
    *steps = b.decode_tokens - a.decode_tokens;
    return e;
}

/* A group's weight as the tables print it ("bf16x8 2048x2048"), empty for ops without one. */
static void prof__weight(const profile_row_t *r, char *buf, size_t size)
{
    buf[0] = '\0';
    if (r->dtype < DTYPE_COUNT)
        snprintf(buf, size, "%s %lldx%lld", dtype_name(r->dtype), (long long)r->rows,
                 (long long)r->cols);
}

/* The prefill profile's table: per group, milliseconds and share of the prompt, and for
 * matmuls the arithmetic (2 n rows cols a call) and its rate; then the matmuls' rate
 * against peak_gflops (0: none measured). */
static void prof__print_prefill(const profile_row_t *rows, int n_rows, double window,
                                int prompt_len, double peak_gflops)
{
    double ops_s = 0, mm_s = 0, mm_gflop = 0;
    printf("%-12s %-18s %5s %7s %10s %7s %10s %8s\n", "op", "weight", "rows", "calls", "ms",
           "share", "GFLOP/call", "GFLOP/s");
    for (int i = 0; i < n_rows; i++) {
        const profile_row_t *r = &rows[i];
        char wbuf[48];
        prof__weight(r, wbuf, sizeof wbuf);
        ops_s += r->seconds;
        printf("%-12s %-18s %5d %7lld %10.2f %6.1f%% ", r->op, wbuf, r->n, (long long)r->calls,
               r->seconds * 1e3, 100.0 * r->seconds / window);
        if (!strcmp(r->op, "matmul")) {
            double gflop = 2.0 * r->n * (double)r->rows * (double)r->cols / 1e9;
            mm_s += r->seconds;
            mm_gflop += gflop * (double)r->calls;
            printf("%10.3f %8.1f\n", gflop,
                   r->seconds > 0 ? gflop * (double)r->calls / r->seconds : 0.0);
        } else {
            printf("%10s %8s\n", "", "");
        }
    }
    printf("ops %.1f ms, between ops %.1f ms (%.1f%%), prompt %.1f ms (%.1f tok/s)\n",
           ops_s * 1e3, (window - ops_s) * 1e3, 100.0 * (window - ops_s) / window,
           window * 1e3, prompt_len / window);
    printf("matmuls: %.1f GFLOP in %.1f ms (%.1f%% of the prompt) = %.1f GFLOP/s", mm_gflop,
           mm_s * 1e3, 100.0 * mm_s / window, mm_s > 0 ? mm_gflop / mm_s : 0.0);
    if (peak_gflops > 0)
        printf("; compute peak %.1f GFLOP/s (matmuls at %.3f of it)", peak_gflops,
               mm_s > 0 ? mm_gflop / mm_s / peak_gflops : 0.0);
    printf("\n");
}

int bench_profile(cli_env_t *env, const char *river_path, int exit_layer, int prompt_len,
                  int gen_len, long bw_mib, int prefill, int json)
{
    const model_t *m = env->model;
    const model_config_t *c = &m->cfg;
    exit_setup_t xs = {0};
    int have_exit = river_path != NULL, e;
    if (prefill && json)
        return cli_fail("bench", river_err_set(RIVER_EINVAL, "--profile-prefill prints text "
                                                             "only"));
    if (exit_layer <= 0)
        exit_layer = c->n_layers / 4 > 0 ? c->n_layers / 4 : 1;
    if (have_exit) {
        exit_policy_t pol = {.rule = EXIT_RULE_FIXED, .exit_layer = exit_layer,
                             .kv = EXIT_KV_RIVER};
        if ((e = exit_setup_open(&xs, &pol, river_path, NULL, m)))
            return cli_fail("bench", e);
    }
    int32_t *prompt = malloc(sizeof *prompt * (size_t)prompt_len);
    gen_t *g = NULL;
    int64_t steps = 0;
    e = prompt ? 0 : river_err_set(RIVER_ENOMEM, "bench prompt");
    uint32_t x = 12345;
    for (int i = 0; prompt && i < prompt_len; i++) {
        x = x * 1664525u + 1013904223u;
        prompt[i] = (int32_t)((x >> 8) % (uint32_t)c->vocab_size);
    }
    int chunk = prompt_len < 256 ? prompt_len : 256;
    gen_config_t gc = {.max_rows = chunk, .prefill_chunk = chunk, .page_size = 16,
                       .kv_dtype = cli_env_kv_dtype(),
                       .max_seqs = 1};
    if (!e)
        e = gen_new(&g, m, NULL, env->be, &gc);
    if (!e && have_exit)
        e = gen_set_exit(g, &xs.cfg);
    int n_threads = cli_env_is_cpu(env) ? cpu_backend_threads(env->be) : 1;
    cpu_simd_t level = cli_env_is_cpu(env) ? cpu_backend_simd(env->be) : CPU_SIMD_COUNT;
    /* An untimed run first faults the weights in. */
    if (!e)
        e = prof__generate(g, env->be, prompt, prompt_len, gen_len, PROF_OFF, &steps);
    if (!e)
        e = profile_attach(env->be);
    int attached = !e;
    if (!e)
        e = prof__generate(g, env->be, prompt, prompt_len, gen_len,
                           prefill ? PROF_PREFILL : PROF_DECODE, &steps);
    const profile_row_t *rows = NULL;
    int n_rows = 0;
    double window = 0;
    profile_row_t *copy = NULL;
    if (!e)
        e = profile_read(env->be, &rows, &n_rows, &window);
    if (!e && !(copy = malloc(sizeof *copy * (size_t)(n_rows > 0 ? n_rows : 1))))
        e = river_err_set(RIVER_ENOMEM, "bench profile rows");
    if (!e)
        memcpy(copy, rows, sizeof *copy * (size_t)n_rows);
    if (attached)
        profile_detach(env->be);
    if (!e && steps <= 0)
        e = river_err_set(RIVER_EINVAL, "profile: no decode step ran (--gen-len)");
    if (!e && prefill) {
        /* The peak right after the prompt, as river bench takes it (a shared host's speed
         * moves between minutes). */
        cpu_peak_t kind = cpu_peak_for(c->dtype);
        double peak = cli_env_is_cpu(env) ? 2.0 * cpu_peak_gmacs(n_threads, level, kind, 2) : 0;
        printf("prefill profile: %d tokens in chunks of %d, %d threads, simd %s", prompt_len,
               chunk, n_threads, cli_env_simd_name(env));
        if (have_exit)
            printf(", fixed exit after %d of %d layers onto the river", exit_layer,
                   c->n_layers);
        printf("\n");
        prof__print_prefill(copy, n_rows, window, prompt_len, peak > 0 ? peak : 0);
        goto done;
    }
    double bw = 0;
    if (!e) {
        bw = cpu_read_bandwidth_gbs(n_threads, (size_t)bw_mib << 20, 3, level);
        if (bw <= 0)
            e = (int)bw;
    }
    if (e)
        goto done;

    double ops_s = 0, mm_s = 0, mm_bytes = 0;
    for (int i = 0; i < n_rows; i++) {
        ops_s += copy[i].seconds;
        if (!strcmp(copy[i].op, "matmul")) {
            mm_s += copy[i].seconds;
            mm_bytes += copy[i].bytes;
        }
    }
    double per = 1e6 / (double)steps; /* seconds in all -> microseconds per step */
    double step_us = window * per, between_us = (window - ops_s) * per;
    double mm_gbs = mm_s > 0 ? mm_bytes / mm_s / 1e9 : 0;
    double step_gbs = window > 0 ? mm_bytes / window / 1e9 : 0;
    if (json) {
        json_t *o = json_object(), *arr = json_array();
        for (int i = 0; o && arr && i < n_rows; i++) {
            const profile_row_t *r = &copy[i];
            json_t *jr = json_pack("{s:s, s:s, s:I, s:I, s:i, s:f, s:f, s:f, s:f}", "op", r->op,
                                   "dtype", r->dtype < DTYPE_COUNT ? dtype_name(r->dtype) : "",
                                   "rows", (json_int_t)r->rows, "cols", (json_int_t)r->cols,
                                   "n", r->n, "calls_per_step", (double)r->calls / steps,
                                   "us_per_step", r->seconds * per, "bytes_per_step",
                                   r->bytes / steps,
                                   "gbs", r->seconds > 0 ? r->bytes / r->seconds / 1e9 : 0.0);
            json_array_append_new(arr, jr);
        }
        json_object_set_new(o, "simd", json_string(cli_env_simd_name(env)));
        json_object_set_new(o, "threads", json_integer(n_threads));
        json_object_set_new(o, "context", json_integer(prompt_len));
        json_object_set_new(o, "steps", json_integer(steps));
        json_object_set_new(o, "exit_layer", json_integer(have_exit ? exit_layer : 0));
        json_object_set_new(o, "step_us", json_real(step_us));
        json_object_set_new(o, "between_ops_us", json_real(between_us));
        json_object_set_new(o, "matmul_us", json_real(mm_s * per));
        json_object_set_new(o, "matmul_bytes_per_step", json_real(mm_bytes / steps));
        json_object_set_new(o, "matmul_gbs", json_real(mm_gbs));
        json_object_set_new(o, "step_gbs", json_real(step_gbs));
        json_object_set_new(o, "read_bandwidth_gbs", json_real(bw));
        json_object_set_new(o, "ops", arr);
        cli_json_print(o);
    } else {
        printf("decode step profile: %lld steps at context %d, %d threads, simd %s",
               (long long)steps, prompt_len, n_threads, cli_env_simd_name(env));
        if (have_exit)
            printf(", fixed exit after %d of %d layers onto the river", exit_layer,
                   c->n_layers);
        printf("\n%-12s %-18s %5s %10s %10s %7s %10s %8s\n", "op", "weight", "rows",
               "calls/step", "us/step", "share", "MB/call", "GB/s");
        for (int i = 0; i < n_rows; i++) {
            const profile_row_t *r = &copy[i];
            char wbuf[48];
            prof__weight(r, wbuf, sizeof wbuf);
            double us = r->seconds * per;
            printf("%-12s %-18s %5d %10.2f %10.1f %6.1f%% ", r->op, wbuf, r->n,
                   (double)r->calls / steps, us, 100.0 * r->seconds / window);
            if (r->bytes > 0)
                printf("%10.3f %8.2f\n", r->bytes / (double)r->calls / 1e6,
                       r->bytes / r->seconds / 1e9);
            else
                printf("%10s %8s\n", "", "");
        }
        printf("ops %.1f us, between ops %.1f us (%.1f%%), step %.1f us (%.2f tok/s)\n",
               ops_s * per, between_us, 100.0 * (window - ops_s) / window, step_us,
               1e6 / step_us);
        printf("matmuls: %.2f MB a step in %.1f us (%.1f%% of the step) = %.2f GB/s; over the "
               "whole step %.2f GB/s; read sweep %.2f GB/s (matmuls at %.3f of it, the step "
               "at %.3f)\n", mm_bytes / steps / 1e6, mm_s * per, 100.0 * mm_s / window, mm_gbs,
               step_gbs, bw, mm_gbs / bw, step_gbs / bw);
    }
done:
    free(copy);
    gen_destroy(&g);
    free(prompt);
    if (have_exit)
        exit_setup_close(&xs);
    return e ? cli_fail("bench", e) : 0;
}
