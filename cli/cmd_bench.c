/* river bench: prefill and decode speed of a model, and how close decode comes to the
 * memory-bandwidth roofline (every weight byte read once per decoded token). */
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/bench_spec.h"
#include "cli/cli.h"
#include "common/err.h"
#include "engine/generate.h"
#include "engine/exitriver.h"
#include "kernels/cpu/cpu.h"

/* The measurements behind the row-split cost model: per-layer time of the backbone (T_B)
 * and the river (T_R) against batch rows, each the mean over the river's layers streamed
 * once per pass as a decode step streams them (forward_time_layers), and for an even
 * split of n rows whether T_B(n/2) + T_R(n/2) beats T_B(n). */
static int bench__split_costs(cli_env_t *env, const char *river_path, int json)
{
    const model_t *m = env->model;
    exitriver_t *r = NULL;
    forward_t *f = NULL;
    kv_pool_t *kv = NULL;
    const layer_weights_t **rl = NULL;
    int e = exitriver_load(&r, m, river_path);
    int L = m->cfg.n_layers, first = r ? exitriver_start_layer(r) : 0;
    if (!e)
        e = forward_new(&f, m, env->be, 64);
    if (!e)
        e = kv_pool_new(&kv, env->be, L, m->cfg.n_kv_heads * m->cfg.head_dim,
                        gen_kv_dtype(m, cli_env_kv_dtype()), 16, 8);
    if (!e && !(rl = calloc((size_t)L, sizeof *rl)))
        e = river_err_set(RIVER_ENOMEM, "bench: river layer table");
    for (int l = first; !e && l < L; l++)
        rl[l] = exitriver_layer(r, l);
    if (!e && first >= L)
        e = river_err_set(RIVER_EINVAL, "%s: the river has no layers", river_path);
    static const int ns[] = {1, 2, 4, 8, 16, 32, 64};
    double tb[7], tr[7];
    for (int i = 0; !e && i < 7; i++) {
        e = forward_time_layers(f, kv, NULL, first, ns[i], &tb[i]);
        if (!e)
            e = forward_time_layers(f, kv, rl, first, ns[i], &tr[i]);
    }
    if (!e) {
        if (!json)
            printf("layers %d..%d, %d threads, simd %s: per-layer ms, and an even split of n "
                   "rows\n%5s %9s %9s %7s %14s %6s\n", first, L - 1,
                   cli_env_is_cpu(env) ? cpu_backend_threads(env->be) : 0,
                   cli_env_simd_name(env), "rows", "T_B",
                   "T_R", "r", "T_B+T_R(n/2)", "pays");
        for (int i = 0; i < 7; i++) {
            double split = i ? tb[i - 1] + tr[i - 1] : 0;
            int pays = i && split < tb[i];
            if (json)
                printf("{\"simd\":\"%s\",\"rows\":%d,\"backbone_ms\":%.4f,\"river_ms\":%.4f,"
                       "\"r\":%.3f,\"split_half_ms\":%.4f,\"split_pays\":%s}\n",
                       cli_env_simd_name(env), ns[i], tb[i] * 1e3,
                       tr[i] * 1e3, tr[i] / tb[i], split * 1e3, pays ? "true" : "false");
            else
                printf("%5d %9.3f %9.3f %7.3f %14.3f %6s\n", ns[i], tb[i] * 1e3, tr[i] * 1e3,
                       tr[i] / tb[i], split * 1e3, i ? (pays ? "yes" : "no") : "-");
        }
    }
    free(rl);
    kv_pool_destroy(&kv);
    forward_destroy(&f);
    exitriver_destroy(&r);
    return e ? cli_fail("bench", e) : 0;
}

/* Decode steps each followed by one pass of the read sweep, and the median over the pairs
 * of the step's bytes a second over the pass's: the fraction of what the memory gave right
 * then. On a shared host the sweep read anything from 28 to 49 GB/s in runs a minute apart
 * (Zen 5 VM, 2 threads), and a run of 64 steps against a sweep after it measured that drift
 * as much as the step; a step and a pass a tenth of a second apart share the host's state.
 * Sets *frac, or leaves it 0 where the run had no decode step. */
static int bench__paired_fraction(gen_t *g, const model_t *m, const int32_t *prompt,
                                  long prompt_len, long gen_len, int n_threads,
                                  cpu_simd_t level, long bw_mib, double *frac)
{
    *frac = 0.0;
    cpu_sweep_t *sw = NULL;
    double *ratios = calloc((size_t)gen_len + 1, sizeof *ratios);
    int n = 0, seq;
    int e = ratios ? cpu_sweep_new(&sw, n_threads, (size_t)bw_mib << 20, level)
                   : river_err_set(RIVER_ENOMEM, "bench: paired ratios");
    gen_request_t req = {.prompt = prompt, .n_prompt = (size_t)prompt_len,
                         .max_tokens = (int)gen_len + 1, .ignore_eos = 1};
    if (!e)
        e = gen_submit(g, &req, &seq);
    double bytes = (double)model_bytes_per_token(m);
    while (!e && gen_active(g) > 0) {
        gen_stats_t a, b;
        gen_get_stats(g, &a);
        e = gen_step(g);
        gen_get_stats(g, &b);
        /* Decode-only steps: the prompt's step reads far fewer bytes per second of work. */
        if (e || b.decode_tokens != a.decode_tokens + 1 || b.decode_s <= a.decode_s ||
            n > gen_len)
            continue;
        double step_gbs = bytes / (b.decode_s - a.decode_s) / 1e9;
        double pass_gbs = cpu_sweep_pass_gbs(sw);
        if (pass_gbs > 0.0)
            ratios[n++] = step_gbs / pass_gbs;
    }
    if (!e && n > 0)
        *frac = cli_median(ratios, n);
    cpu_sweep_destroy(&sw);
    free(ratios);
    return e;
}

static void bench__usage(FILE *f)
{
    fprintf(f, "usage: river bench --model PATH [--threads N] [--prompt-len P] [--gen-len G]\n"
               "                   [--runs R] [--bandwidth-mib M] [--output text|json]\n"
               "                   [--device cpu|cuda] [--weights copy|mapped]\n"
               "                   [--kv-dtype auto|f32|f16|bf16|q8]\n"
               "Prints the median prefill and decode tokens/s over R runs, the median read\n"
               "bandwidth of a SIMD sweep over M MiB (default 2048) with the same threads and\n"
               "the loads of the SIMD level decode runs at, taken after each run, and\n"
               "roofline_fraction: the median over the runs of bytes_per_token *\n"
               "decode_tok_s / read_bandwidth, each run against its sweep; the same against a\n"
               "sweep with the widest loads the processor has (read_bandwidth_widest_gbs,\n"
               "roofline_fraction_widest) where RIVER_SIMD forces a narrower level; and\n"
               "prefill's arithmetic (prefill_gflop_per_token: the layers, attention over the\n"
               "mean causal context, the head once a prompt) and rate (prefill_gflops); on\n"
               "a CPU, the compute peak after each run (compute_peak_gflops: the level's f32\n"
               "multiply-adds, at avx512bf16 its vdpbf16ps, or for integer weights its 8-bit\n"
               "ones, as river bench --kernels --peak) and prefill_peak_fraction, the median\n"
               "over the runs of prefill_gflops / that run's peak, and\n"
               "roofline_fraction_paired (on a CPU, G >= 8): one more run whose every\n"
               "decode step is followed by one pass of the sweep, the median over those\n"
               "pairs of the step's bytes_per_token a second over the pass's bytes a second\n"
               "(a shared host's bandwidth drifts between a run and a sweep after it, hardly\n"
               "within a pair).\n"
               "--split-costs RIVER instead times the backbone and the river layers (per layer,\n"
               "every river layer once a pass, as decoding streams them) on 1..64 rows and\n"
               "shows when running a batch as two groups (row aggregation) beats running it\n"
               "whole on the backbone.\n"
               "--prefix-reuse [--history N] [--turns T] [--user-len U] runs a T-turn chat\n"
               "(default 4) whose prompt grows to N tokens (default 512): a leading context,\n"
               "then per turn the answer (G tokens, default 16) and a user message (U, default\n"
               "32), without and with the prefix cache: ttft_cold_ms, ttft_cached_ms (mean\n"
               "over turns 2..T), identical (every generated id agrees) and hit_rate.\n"

               "--spec-costs RIVER [--draft K] [--exit-layer E] instead times lossless mode's\n"
               "steps at a context of --prompt-len positions: the plain decode step, the draft\n"
               "step (backbone to layer E, default L/2, then the river) and verify passes of\n"
               "k+1 rows for k = 1..K (default 8), median of --runs (at least 5), and prints\n"
               "the speed-up they predict at acceptance 0.8, 0.9, 0.95, 0.98, with the bytes\n"
               "of weights each step reads (the river's codes packed as its 2, 3, 4 or 8 bits\n"
               "pack them, with their scales and zeros).\n"
               "--profile [--river RIVER [--exit-layer E]] instead times every op of G decode\n"
               "steps after a prompt of P (one warm-up run first): per op and weight shape,\n"
               "calls and microseconds per step, share of the step, and for matmuls the\n"
               "weight bytes per call and GB/s; then the time between ops and the matmuls'\n"
               "bandwidth against a read sweep. With --river, every step leaves the backbone\n"
               "after E layers (default a quarter) onto that river.\n"
               "--profile-prefill [--river RIVER [--exit-layer E]] instead times every op of\n"
               "the prompt's prefill (chunks of up to 256 rows, after a warm-up run): per op\n"
               "and weight shape, calls, milliseconds, share, and for matmuls the GFLOP a\n"
               "call and GFLOP/s; then the matmuls' rate against the compute peak taken\n"
               "right after (on a CPU, as river bench prints compute_peak_gflops).\n"
               "--kernels instead times the CPU matmul kernels alone on Llama 3.2 1B's shapes\n"
               "(river bench --kernels --help).\n"
               "--weights mapped reads the CPU's weights in the mapped checkpoint instead of\n"
               "copying each matrix of 2 MiB or more into huge pages (copy, the default).\n");
}

/* The arithmetic of one prompt token in a prefill of P tokens, in GFLOP (a multiply-add is
 * two): every decoder layer's projections and FFN, attention over the mean causal context
 * of (P + 1) / 2 positions (scores and values), and the head's logits once per prompt. */
static double bench__prefill_gflop(const model_config_t *c, long prompt_len)
{
    double q = (double)c->n_heads * c->head_dim, kv = (double)c->n_kv_heads * c->head_dim;
    double layer = (double)c->dim * (2.0 * q + 2.0 * kv) + 3.0 * c->dim * (double)c->hidden_dim;
    double attn = 2.0 * q * (double)(prompt_len + 1) / 2.0;
    double head = (double)c->vocab_size * c->dim / (double)prompt_len;
    return 2.0 * ((layer + attn) * c->n_layers + head) / 1e9;
}

int cmd_bench(int argc, char **argv)
{
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'},      {"threads", required_argument, 0, 'j'},
        {"prompt-len", required_argument, 0, 'p'}, {"gen-len", required_argument, 0, 'g'},
        {"runs", required_argument, 0, 'r'},       {"bandwidth-mib", required_argument, 0, 'b'},
        {"output", required_argument, 0, 'o'},     {"help", no_argument, 0, 'h'},
        {"split-costs", required_argument, 0, 'S'},
        {"spec-costs", required_argument, 0, 'C'}, {"draft", required_argument, 0, 'D'},
        {"exit-layer", required_argument, 0, 'E'},
        {"device", required_argument, 0, 1000},
        {"weights", required_argument, 0, 1005},
        {"prefix-reuse", no_argument, 0, 1001},
        {"history", required_argument, 0, 1002},
        {"turns", required_argument, 0, 1003},
        {"user-len", required_argument, 0, 1004},
        {"profile", no_argument, 0, 1006},
        {"profile-prefill", no_argument, 0, 1008},
        {"river", required_argument, 0, 1007},
        {"kv-dtype", required_argument, 0, 1100},
        {0, 0, 0, 0},
    };
    const char *model_path = NULL, *split_river = NULL, *spec_river = NULL;
    const char *profile_river = NULL;
    long threads = 0, prompt_len = 128, gen_len = 64, runs = 5, bw_mib = 2048;
    long history = 512, turns = 4, user_len = 32;
    long draft = 8, exit_layer = 0;
    int json = 0, c, li = 0, prefix_reuse = 0, gen_len_set = 0, profile = 0;
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--kernels"))
            return bench_kernels(argc, argv);
    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, &li)) != -1) {
        long *target = NULL, lo = 1, hi = 1 << 20;
        switch (c) {
        case 'm': model_path = optarg; continue;
        case 'j': target = &threads; lo = 0; hi = 1024; break;
        case 'p': target = &prompt_len; break;
        case 'g': target = &gen_len; gen_len_set = 1; break;
        case 1001: prefix_reuse = 1; continue;
        case 1006: profile = 1; continue;
        case 1008: profile = 2; continue;
        case 1007: profile_river = optarg; continue;
        case 1002: target = &history; break;
        case 1003: target = &turns; hi = 1000; break;
        case 1004: target = &user_len; break;
        case 'r': target = &runs; hi = 1000; break;
        case 'b': target = &bw_mib; hi = 1 << 20; break;
        case 'o':
            if (!strcmp(optarg, "json"))
                json = 1;
            else if (strcmp(optarg, "text")) {
                fprintf(stderr, "river bench: bad value '%s' for --output\n", optarg);
                return 2;
            }
            continue;
        case 'S': split_river = optarg; continue;
        case 'C': spec_river = optarg; continue;
        case 'D': target = &draft; hi = GEN_DRAFT_MAX; break;
        case 'E': target = &exit_layer; hi = 1 << 16; break;
        case 1000: {
            int de = cli_env_set_device(optarg);
            if (de)
                return cli_fail("bench", de);
            continue;
        }
        case 1005: {
            int we = cli_env_set_weights(optarg);
            if (we)
                return cli_fail("bench", we);
            continue;
        }
        case 1100: {
            int ke = cli_env_set_kv_dtype(optarg);
            if (ke)
                return cli_fail("bench", ke);
            continue;
        }
        case 'h': bench__usage(stdout); return 0;
        default: bench__usage(stderr); return 2;
        }
        if (cli_parse_int(optarg, lo, hi, target)) {
            fprintf(stderr, "river bench: bad value '%s' for --%s\n", optarg, opts[li].name);
            return 2;
        }
    }
    if (!model_path || optind != argc) {
        bench__usage(stderr);
        return 2;
    }
    cli_env_t env;
    int e = cli_env_open(&env, model_path, NULL, (int)threads, 0);
    if (e)
        return cli_fail("bench", e);
    const model_config_t *cfg = &env.model->cfg;
    if (prefix_reuse) {
        e = bench_prefix_reuse(&env, (int)history, (int)turns, gen_len_set ? (int)gen_len : 16,
                               (int)user_len, json);
        cli_env_close(&env);
        return e ? cli_fail("bench", e) : 0;
    }
    if (prompt_len + gen_len > cfg->max_seq_len) {
        fprintf(stderr, "river bench: prompt-len + gen-len = %ld exceeds the context of %d\n",
                prompt_len + gen_len, cfg->max_seq_len);
        cli_env_close(&env);
        return 2;
    }
    if (profile_river && !profile) {
        cli_env_close(&env);
        fprintf(stderr, "river bench: --river goes with --profile or --profile-prefill\n");
        return 2;
    }
    if (profile) {
        int rc2 = bench_profile(&env, profile_river, (int)exit_layer, (int)prompt_len,
                                (int)gen_len, bw_mib, profile == 2, json);
        cli_env_close(&env);
        return rc2;
    }
    if (spec_river) {
        int rc2 = bench_spec_costs(&env, spec_river, (int)exit_layer, (int)draft,
                                   (int)prompt_len, runs < 5 ? 5 : (int)runs, json);
        cli_env_close(&env);
        return rc2;
    }
    if (split_river) {
        int rc2 = bench__split_costs(&env, split_river, json);
        cli_env_close(&env);
        return rc2;
    }
    int rc = 1;
    gen_t *g = NULL;
    int32_t *prompt = malloc(sizeof *prompt * (size_t)prompt_len);
    double *pre = calloc((size_t)runs, sizeof *pre), *dec = calloc((size_t)runs, sizeof *dec);
    /* Per run: the sweep with the loads of the level decode runs at, then (bws + runs, fracs
     * + runs) with the widest loads the processor has. */
    double *bws = calloc(2 * (size_t)runs, sizeof *bws);
    double *fracs = calloc(2 * (size_t)runs, sizeof *fracs);
    /* Per run on a CPU backend: the compute peak after it (GFLOP/s), then (peaks + runs)
     * prefill's fraction of it. */
    double *peaks = calloc(2 * (size_t)runs, sizeof *peaks);
    if (!prompt || !pre || !dec || !bws || !fracs || !peaks) {
        e = river_err_set(RIVER_ENOMEM, "bench buffers");
        goto done;
    }
    /* A fixed pseudo-random prompt: the speed does not depend on the ids. */
    uint32_t x = 12345;
    for (long i = 0; i < prompt_len; i++) {
        x = x * 1664525u + 1013904223u;
        prompt[i] = (int32_t)((x >> 8) % (uint32_t)cfg->vocab_size);
    }
    int chunk = prompt_len < 256 ? (int)prompt_len : 256;
    gen_config_t gc = {.max_rows = chunk, .prefill_chunk = chunk, .page_size = 16,
                       .kv_dtype = cli_env_kv_dtype(),
                       .max_seqs = 1};
    e = gen_new(&g, env.model, NULL, env.be, &gc);
    if (e)
        goto done;
    /* On a GPU the thread count only sizes the CPU bandwidth sweep below. */
    int n_threads = cli_env_is_cpu(&env) ? cpu_backend_threads(env.be) : 1;
    /* With RIVER_SIMD forcing a narrower level than the processor has, decode is judged
     * against what that level's loads read, as on a processor that has no more (on this
     * kind of machine 256-bit loads sweep 5-7 % slower than 512-bit ones); the widest
     * sweep is reported beside it. */
    cpu_simd_t level = cli_env_is_cpu(&env) ? cpu_backend_simd(env.be) : CPU_SIMD_COUNT;
    /* Prefill of float weights is judged against the level's float multiply-adds (at
     * avx512bf16, vdpbf16ps's, which its bf16 matmuls run), of integer ones against its
     * 8-bit ones, which their kernels run. */
    cpu_peak_t peak_kind = cpu_peak_for(cfg->dtype);
    double gflop = bench__prefill_gflop(cfg, prompt_len);
    if (!json)
        fprintf(stderr, "river bench: %s, %d threads, simd %s, prompt %ld, gen %ld, %ld runs\n",
                model_path, n_threads, cli_env_simd_name(&env), prompt_len, gen_len, runs);
    /* One untimed warm-up run faults the mapped weights in. */
    for (long r = -1; r < runs; r++) {
        gen_stats_t a, b;
        gen_get_stats(g, &a);
        gen_request_t req = {.prompt = prompt, .n_prompt = (size_t)prompt_len,
                             .max_tokens = (int)gen_len + 1, .ignore_eos = 1};
        int seq;
        e = gen_submit(g, &req, &seq);
        if (!e)
            e = gen_run_all(g);
        if (e)
            goto done;
        gen_get_stats(g, &b);
        if (r < 0)
            continue;
        pre[r] = (double)(b.prefill_tokens - a.prefill_tokens) / (b.prefill_s - a.prefill_s);
        dec[r] = (double)(b.decode_tokens - a.decode_tokens) / (b.decode_s - a.decode_s);
        /* The sweep right after the run: the machine's bandwidth drifts (other tenants of a
         * host), and a run compared with a sweep taken minutes away measures the drift. */
        /* At the processor's widest level the first sweep is the widest one. */
        int sweeps = level < cpu_simd_detect() ? 2 : 1;
        for (int widest = 0; widest < 2; widest++) {
            double *bw = bws + widest * runs;
            bw[r] = widest < sweeps ? cpu_read_bandwidth_gbs(n_threads, (size_t)bw_mib << 20,
                                                             3, widest ? CPU_SIMD_COUNT : level)
                                    : bws[r];
            if (bw[r] <= 0) {
                e = (int)bw[r];
                goto done;
            }
            fracs[widest * runs + r] =
                (double)model_bytes_per_token(env.model) * dec[r] / (bw[r] * 1e9);
        }
        /* The peak right after the run too, for the same reason: on a shared host it moved
         * by half within minutes (river bench --kernels --peak, Zen 5 VM). */
        if (level < CPU_SIMD_COUNT) {
            double gmacs = cpu_peak_gmacs(n_threads, level, peak_kind, 2);
            if (gmacs <= 0) {
                e = (int)gmacs;
                goto done;
            }
            peaks[r] = 2.0 * gmacs;
            peaks[runs + r] = gflop * pre[r] / peaks[r];
        }
    }
    /* Not for runs of a few decode steps (prefill benchmarks), whose pairs would be too few
     * for a median and whose extra prompt would double the run. */
    const bool paired = level < CPU_SIMD_COUNT && gen_len >= 8;
    double frac_paired = 0.0;
    if (paired) {
        e = bench__paired_fraction(g, env.model, prompt, prompt_len, gen_len, n_threads, level,
                                   bw_mib, &frac_paired);
        if (e)
            goto done;
    }
    /* The attention share of prefill: prompts alone (one token sampled, no decode step),
     * attention's time over the forward's, summed over the runs. */
    fwd_stats_t fa, fb;
    forward_get_stats(gen_forward(g), &fa);
    for (long r = 0; r < runs; r++) {
        gen_request_t req = {.prompt = prompt, .n_prompt = (size_t)prompt_len,
                             .max_tokens = 1, .ignore_eos = 1};
        int seq;
        e = gen_submit(g, &req, &seq);
        if (!e)
            e = gen_run_all(g);
        if (e)
            goto done;
    }
    forward_get_stats(gen_forward(g), &fb);
    double attn_share = fb.step_s > fa.step_s ? (fb.attn_s - fa.attn_s) / (fb.step_s - fa.step_s)
                                              : 0.0;
    double prefill_tps = cli_median(pre, (int)runs);
    double peak = cli_median(peaks, (int)runs), peak_frac = cli_median(peaks + runs, (int)runs);
    const char *peak_name = peak_kind == CPU_PEAK_I8 ? "int8" : "f32";
    double decode_tps = cli_median(dec, (int)runs);
    double bw = cli_median(bws, (int)runs), bw_widest = cli_median(bws + runs, (int)runs);
    int64_t bpt = model_bytes_per_token(env.model);
    double frac = cli_median(fracs, (int)runs);
    double frac_widest = cli_median(fracs + runs, (int)runs);
    if (json) {
        json_t *o = json_pack("{s:s, s:s, s:s, s:i, s:i, s:i, s:i, s:f, s:f, s:I, s:f, s:f}",
                              "model", model_path, "dtype", dtype_name(cfg->dtype),
                              "simd", cli_env_simd_name(&env),
                              "threads", n_threads, "prompt_len", (int)prompt_len,
                              "gen_len", (int)gen_len, "runs", (int)runs,
                              "prefill_tok_s", prefill_tps, "decode_tok_s", decode_tps,
                              "bytes_per_token", (json_int_t)bpt, "read_bandwidth_gbs", bw,
                              "roofline_fraction", frac);
        if (o) {
            json_object_set_new(o, "prefill_attention_share", json_real(attn_share));
            json_object_set_new(o, "prefill_gflop_per_token", json_real(gflop));
            json_object_set_new(o, "prefill_gflops", json_real(gflop * prefill_tps));
            json_object_set_new(o, "read_bandwidth_widest_gbs", json_real(bw_widest));
            json_object_set_new(o, "roofline_fraction_widest", json_real(frac_widest));
            if (paired)
                json_object_set_new(o, "roofline_fraction_paired", json_real(frac_paired));
            if (level < CPU_SIMD_COUNT) {
                json_object_set_new(o, "compute_peak_kind", json_string(peak_name));
                json_object_set_new(o, "compute_peak_gflops", json_real(peak));
                json_object_set_new(o, "prefill_peak_fraction", json_real(peak_frac));
            }
        }
        cli_json_print(o);
    } else {
        printf("prefill_tok_s       %.1f (%.1f GFLOP/s at %.3f GFLOP a token)\n", prefill_tps,
               gflop * prefill_tps, gflop);
        printf("decode_tok_s        %.2f\n", decode_tps);
        printf("bytes_per_token     %lld\n", (long long)bpt);
        printf("read_bandwidth_gbs  %.2f\n", bw);
        printf("roofline_fraction   %.3f\n", frac);
        printf("read_bandwidth_widest_gbs %.2f (roofline_fraction %.3f)\n", bw_widest,
               frac_widest);
        if (paired)
            printf("roofline_fraction_paired %.3f (each decode step against a sweep pass "
                   "right after it)\n", frac_paired);
        printf("prefill_attn_share  %.3f\n", attn_share);
        if (level < CPU_SIMD_COUNT)
            printf("compute_peak_gflops %.1f (%s; prefill_peak_fraction %.3f)\n", peak,
                   peak_name, peak_frac);
    }
    rc = 0;
done:
    if (e)
        rc = cli_fail("bench", e);
    gen_destroy(&g);
    free(prompt);
    free(pre);
    free(dec);
    free(bws);
    free(fracs);
    free(peaks);
    cli_env_close(&env);
    return rc;
}
