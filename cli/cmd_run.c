/* river run: generate a completion for one prompt, streamed as text or reported as JSON. */
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "common/err.h"
#include "cli/exit_opts.h"
#include "engine/exit_setup.h"
#include "engine/generate.h"

#define RUN_MAX_STOP 16

typedef struct run_out {
    int json;
    int32_t *ids;   /* (n_ids) generated ids */
    int32_t *depth; /* (n_ids) backbone layers each token ran before it exited */
    size_t n_ids, cap, cap_depth;
    char *text;     /* generated text (JSON mode) */
    size_t n_text, cap_text;
    gen_finish_t finish;
    int failed;
} run_out_t;

static int run__append(void **buf, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return 0;
    size_t c = *cap ? *cap * 2 : 256;
    while (c < need)
        c *= 2;
    void *p = realloc(*buf, c * elem);
    if (!p)
        return -1;
    *buf = p;
    *cap = c;
    return 0;
}

static void run__on_token(void *user, const gen_event_t *ev)
{
    run_out_t *o = user;
    int32_t id = ev->id;
    const char *text = ev->text;
    size_t len = ev->len;
    if (id >= 0) {
        if (run__append((void **)&o->ids, &o->cap, o->n_ids + 1, sizeof *o->ids) ||
            run__append((void **)&o->depth, &o->cap_depth, o->n_ids + 1, sizeof *o->depth)) {
            o->failed = 1;
        } else {
            o->depth[o->n_ids] = ev->depth;
            o->ids[o->n_ids++] = id;
        }
    }
    if (o->json) {
        if (run__append((void **)&o->text, &o->cap_text, o->n_text + len + 1, 1)) {
            o->failed = 1;
        } else {
            memcpy(o->text + o->n_text, text, len);
            o->n_text += len;
            o->text[o->n_text] = '\0';
        }
    } else if (len) {
        fwrite(text, 1, len, stdout);
        fflush(stdout);
    }
    o->finish = ev->finish;
}

static void run__usage(FILE *f)
{
    fprintf(f,
            "usage: river run --model PATH [--tokenizer PATH] --prompt TEXT [--max-tokens N]\n"
            "                 [--temperature T] [--top-k K] [--top-p P] [--seed S]\n"
            "                 [--stop TEXT]... [--ignore-eos] [--threads N] [--device cpu|cuda]\n"
            "                 [--output text|json] [--no-special]\n"
            "                 [--kv-dtype auto|f32|f16|bf16|q8]\n");
    exit_opts_usage(f, 17);
    fprintf(f,
            "Greedy decoding unless --temperature > 0. Text mode streams the completion;\n"
            "json prints {prompt_ids, ids, exit_layers, text, finish, prefill_tok_s,\n"
            "decode_tok_s}; exit_layers holds the backbone layers each token ran.\n"
            "--no-special: the prompt carries its special tokens as text (a rendered chat\n"
            "template), so no BOS is added.\n");
}

int cmd_run(int argc, char **argv)
{
    static const struct option opts[] = {
        EXIT_OPTS_LONG,
        {"model", required_argument, 0, 'm'},     {"tokenizer", required_argument, 0, 'k'},
        {"prompt", required_argument, 0, 'p'},    {"max-tokens", required_argument, 0, 'n'},
        {"temperature", required_argument, 0, 't'}, {"top-k", required_argument, 0, 'K'},
        {"top-p", required_argument, 0, 'P'},     {"seed", required_argument, 0, 's'},
        {"stop", required_argument, 0, 'S'},      {"ignore-eos", no_argument, 0, 'E'},
        {"threads", required_argument, 0, 'j'},   {"output", required_argument, 0, 'o'},
        {"device", required_argument, 0, 1000},   {"no-special", no_argument, 0, 1001},
        {"kv-dtype", required_argument, 0, 1100},
        {"help", no_argument, 0, 'h'},            {0, 0, 0, 0},
    };
    const char *model_path = NULL, *tok_path = NULL, *prompt = NULL;
    const char *stop[RUN_MAX_STOP];
    int n_stop = 0;
    long max_tokens = 256, threads = 0, top_k = 0, seed = 0;
    double temperature = 0, top_p = 1;
    int json = 0, ignore_eos = 0, add_special = 1;
    int c, li = 0;
    exit_opts_t xo;
    exit_opts_init(&xo);
    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, &li)) != -1) {
        int xr = exit_opts_parse(&xo, c, optarg);
        if (xr == 1)
            continue;
        if (xr < 0)
            goto bad_value;
        switch (c) {
        case 'm': model_path = optarg; break;
        case 'k': tok_path = optarg; break;
        case 'p': prompt = optarg; break;
        case 'n':
            if (cli_parse_int(optarg, 1, 1 << 24, &max_tokens))
                goto bad_value;
            break;
        case 't':
            if (cli_parse_float(optarg, &temperature) || temperature < 0)
                goto bad_value;
            break;
        case 'K':
            if (cli_parse_int(optarg, 0, 1 << 30, &top_k))
                goto bad_value;
            break;
        case 'P':
            if (cli_parse_float(optarg, &top_p) || top_p < 0 || top_p > 1)
                goto bad_value;
            break;
        case 's':
            if (cli_parse_int(optarg, 0, 0x7fffffffL, &seed))
                goto bad_value;
            break;
        case 'S':
            if (n_stop == RUN_MAX_STOP) {
                fprintf(stderr, "river run: at most %d --stop strings\n", RUN_MAX_STOP);
                return 2;
            }
            stop[n_stop++] = optarg;
            break;
        case 'E': ignore_eos = 1; break;
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
        case 1000: {
            int de = cli_env_set_device(optarg);
            if (de)
                return cli_fail("run", de);
            break;
        }
        case 1001: add_special = 0; break;
        case 1100: {
            int ke = cli_env_set_kv_dtype(optarg);
            if (ke)
                return cli_fail("run", ke);
            break;
        }
        case 'h': run__usage(stdout); return 0;
        default: run__usage(stderr); return 2;
        }
    }
    if (!model_path || !prompt || optind != argc) {
        fprintf(stderr, "river run: --model and --prompt are required\n");
        run__usage(stderr);
        return 2;
    }

    int e = exit_opts_check_lossless(&xo);
    if (e)
        return cli_fail("run", e);
    cli_env_t env;
    e = cli_env_open(&env, model_path, tok_path, (int)threads, 1);
    if (e)
        return cli_fail("run", e);
    int rc = 1;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    gen_t *g = NULL;
    run_out_t out = {.json = json};
    exit_setup_t xc;
    e = exit_setup_open(&xc, &xo.policy, xo.river_path, xo.routers_path, env.model);
    if (e) {
        cli_env_close(&env);
        return cli_fail("run", e);
    }
    e = tokenizer_encode(env.tok, prompt, strlen(prompt), add_special, &ids, &n_ids);
    if (e)
        goto done;
    /* A worker's default chunk (configs/worker.yaml): the prompt's matmuls run 0.7-0.8x
     * as fast at 64 rows as at 256. */
    gen_config_t gc = {.max_rows = 256, .prefill_chunk = 256, .page_size = 16, .max_seqs = 1,
                       .kv_dtype = cli_env_kv_dtype()};
    e = gen_new(&g, env.model, env.tok, env.be, &gc);
    if (!e && xo.policy.rule != EXIT_RULE_NONE)
        e = gen_set_exit(g, &xc.cfg);
    gen_spec_t sp = exit_opts_spec(&xo);
    if (!e && xo.lossless)
        e = gen_set_spec(g, &sp);
    if (e)
        goto done;
    gen_request_t req = {
        .prompt = ids, .n_prompt = n_ids, .max_tokens = (int)max_tokens,
        .sampling = {.temperature = (float)temperature, .top_k = (int)top_k,
                     .top_p = (float)top_p, .seed = (uint64_t)seed},
        .stop = stop, .n_stop = n_stop, .ignore_eos = ignore_eos,
        .on_token = run__on_token, .user = &out, .lossless = xo.lossless,
    };
    int seq;
    e = gen_submit(g, &req, &seq);
    if (e)
        goto done;
    e = gen_run_all(g);
    if (e)
        goto done;
    if (out.failed) {
        e = river_err_set(RIVER_ENOMEM, "collecting the output");
        goto done;
    }
    gen_stats_t st;
    gen_get_stats(g, &st);
    double prefill_tps = st.prefill_s > 0 ? (double)st.prefill_tokens / st.prefill_s : 0;
    double decode_tps = st.decode_s > 0 ? (double)st.decode_tokens / st.decode_s : 0;
    if (json) {
        json_t *o = json_object(), *pa = json_array(), *ga = json_array();
        for (size_t i = 0; i < n_ids; i++)
            json_array_append_new(pa, json_integer(ids[i]));
        for (size_t i = 0; i < out.n_ids; i++)
            json_array_append_new(ga, json_integer(out.ids[i]));
        json_object_set_new(o, "prompt_ids", pa);
        json_object_set_new(o, "ids", ga);
        json_t *xa = json_array();
        for (size_t i = 0; i < out.n_ids; i++)
            json_array_append_new(xa, json_integer(out.depth[i]));
        json_object_set_new(o, "exit_layers", xa);
        json_object_set_new(o, "text", json_stringn(out.text ? out.text : "", out.n_text));
        json_object_set_new(o, "finish", json_string(gen_finish_name(out.finish)));
        json_object_set_new(o, "prefill_tok_s", json_real(prefill_tps));
        json_object_set_new(o, "decode_tok_s", json_real(decode_tps));
        if (xo.lossless) {
            json_object_set_new(o, "drafted", json_integer(st.spec_draft_tokens));
            json_object_set_new(o, "accepted", json_integer(st.spec_accepted_tokens));
            json_object_set_new(o, "verify_passes", json_integer(st.spec_verify_passes));
            json_object_set_new(o, "ngram_drafted", json_integer(st.spec_ngram_draft_tokens));
            json_object_set_new(o, "ngram_accepted",
                                json_integer(st.spec_ngram_accepted_tokens));
        }
        char *s = json_dumps(o, JSON_COMPACT | JSON_ENSURE_ASCII);
        if (s)
            printf("%s\n", s);
        free(s);
        json_decref(o);
    } else {
        printf("\n");
        fflush(stdout);
        fprintf(stderr, "river run: %zu prompt tokens, %zu generated (%s); prefill %.1f tok/s, "
                "decode %.1f tok/s\n", n_ids, out.n_ids, gen_finish_name(out.finish),
                prefill_tps, decode_tps);
        if (xo.lossless)
            fprintf(stderr, "river run: lossless: %lld of %lld draft tokens accepted (n-gram "
                    "%lld of %lld), %lld verify passes\n", (long long)st.spec_accepted_tokens,
                    (long long)st.spec_draft_tokens, (long long)st.spec_ngram_accepted_tokens,
                    (long long)st.spec_ngram_draft_tokens, (long long)st.spec_verify_passes);
    }
    rc = out.finish == GEN_FINISH_ERROR ? 1 : 0;
    if (rc)
        fprintf(stderr, "river run: generation failed: %s\n", river_err_detail());
done:
    if (e)
        rc = cli_fail("run", e);
    gen_destroy(&g);
    free(ids);
    free(out.ids);
    free(out.depth);
    free(out.text);
    exit_setup_close(&xc);
    cli_env_close(&env);
    return rc;

bad_value:
    fprintf(stderr, "river run: bad value '%s' for --%s\n", optarg, opts[li].name);
    return 2;
}
