/* Constrained decoding and log-probabilities in the engine (engine/logits.h), on a tiny
 * random model with the real Llama 3 vocabulary (`river synth --shape llama3-tiny`, the
 * bundled tokenizer.json): the bundled real models' vocabularies have no '{'.
 *
 * Under every path that can emit a token (the plain backbone, a fixed exit onto the river,
 * the cosine rule, lossless drafting and verifying) sampled completions that end follow the
 * grammar; lossless greedy output equals the constrained backbone's; a continued
 * completion (re-dispatch) picks up the grammar where it was; log-probabilities are the
 * masked log-softmax, the sampled token's entry agrees with its top_logprobs entry, greedy
 * takes the top one, and no masked token is ever listed. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "engine/exit_setup.h"
#include "engine/generate.h"
#include "kernels/cpu/cpu.h"
#include "offline/exitriver_build.h"
#include "offline/synth.h"
#include "tests/testutil.h"
#include "text/grammar.h"
#include "text/tokenizer.h"

#define MAX_IDS 160
#define LLAMA3_TOKENIZER TEST_DATA "/tokenizers/llama3/tokenizer.json"

/* Values a random model can close: enums, booleans, bounded arrays, nested objects, anyOf
 * and a $ref. */
static const char schema_text[] =
    "{\"type\":\"object\",\"properties\":{"
    "\"unit\":{\"enum\":[\"celsius\",\"fahrenheit\"]},"
    "\"ok\":{\"type\":\"boolean\"},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/color\"},\"maxItems\":3},"
    "\"where\":{\"type\":\"object\",\"properties\":{\"city\":{\"enum\":[\"Paris\",\"Oslo\"]}},"
    "\"required\":[\"city\"],\"additionalProperties\":false},"
    "\"n\":{\"anyOf\":[{\"type\":\"null\"},{\"enum\":[1,2,3]}]}},"
    "\"required\":[\"unit\",\"ok\",\"tags\",\"where\",\"n\"],\"additionalProperties\":false,"
    "\"$defs\":{\"color\":{\"enum\":[\"red\",\"green\"]}}}";

typedef struct out {
    int32_t ids[MAX_IDS];
    int n;
    int finish;
    logits_logprob_t lp[MAX_IDS];
    int n_lp;
} out_t;

static void on_token(void *user, const gen_event_t *ev)
{
    out_t *o = user;
    if (ev->id >= 0 && o->n < MAX_IDS) {
        if (ev->logprob)
            o->lp[o->n_lp++] = *ev->logprob;
        o->ids[o->n++] = ev->id;
    }
    if (ev->finish != GEN_RUNNING)
        o->finish = ev->finish;
}

/* One model for the whole suite: synthesized once per process. */
typedef struct env {
    model_t *m;
    tokenizer_t *tok;
    backend_t *be;
    exit_setup_t xs;
    grammar_t *gram;
    gen_t *vocab_gen;           /* owns the vocabulary the grammar is bound to */
    grammar_matcher_t *matcher;
    int32_t prompt[64];
    size_t n_prompt;
} env_t;

static void env_open(env_t *e)
{
    memset(e, 0, sizeof *e);
    char dir[512], river[600];
    snprintf(dir, sizeof dir, "%s/llama3-tiny", test_tmpdir());
    synth_opts_t so = {.shape = "llama3-tiny", .dtype = DTYPE_BF16, .out_dir = dir, .seed = 7};
    ck_assert_msg(synth_write(&so) == 0, "%s", river_err_detail());
    ck_assert_msg(model_load(&e->m, dir) == 0, "%s", river_err_detail());
    ck_assert_msg(tokenizer_load(&e->tok, LLAMA3_TOKENIZER, 0) == 0, "%s",
                  river_err_detail());
    ck_assert_int_eq(cpu_backend_new(&e->be, 2, CPU_SIMD_COUNT), 0);
    snprintf(river, sizeof river, "%s/river.safetensors", dir);
    exitriver_build_opts_t o = exitriver_build_opts_default();
    o.start_layer = 1;
    ck_assert_msg(exitriver_build(e->m, river, &o, NULL) == 0, "%s", river_err_detail());
    exit_policy_t pol = {.rule = EXIT_RULE_FIXED, .exit_layer = 1, .tau = 0.5f,
                         .agg = EXIT_AGG_ROW, .kv = EXIT_KV_RIVER};
    ck_assert_msg(exit_setup_open(&e->xs, &pol, river, NULL, e->m) == 0, "%s",
                  river_err_detail());
    ck_assert_msg(grammar_from_json_schema(&e->gram, schema_text, strlen(schema_text)) == 0,
                  "%s", river_err_detail());
    gen_config_t gc = {.max_rows = 1, .prefill_chunk = 1, .page_size = 16, .max_seqs = 1,
                       .n_pages = 1};
    ck_assert_msg(gen_new(&e->vocab_gen, e->m, e->tok, e->be, &gc) == 0, "%s",
                  river_err_detail());
    const grammar_vocab_t *v;
    ck_assert_msg(gen_grammar_vocab(e->vocab_gen, &v) == 0, "%s", river_err_detail());
    ck_assert_msg(grammar_matcher_new(&e->matcher, e->gram, v) == 0, "%s", river_err_detail());
    static const char text[] = "Give me the weather as JSON:";
    int32_t *ids;
    ck_assert_int_eq(tokenizer_encode(e->tok, text, strlen(text), 1, &ids, &e->n_prompt), 0);
    ck_assert_uint_le(e->n_prompt, 64);
    memcpy(e->prompt, ids, e->n_prompt * sizeof *ids);
    free(ids);
}

static void env_close(env_t *e)
{
    grammar_matcher_destroy(&e->matcher);
    grammar_destroy(&e->gram);
    gen_destroy(&e->vocab_gen);
    exit_setup_close(&e->xs);
    cpu_backend_destroy(&e->be);
    tokenizer_destroy(&e->tok);
    model_destroy(&e->m);
}

typedef enum { MODE_PLAIN = 0, MODE_FIXED, MODE_COSINE, MODE_LOSSLESS, MODE_COUNT } mode_t_;
static const char *const mode_names[] = {"plain", "fixed exit", "cosine", "lossless"};

static gen_t *gen_open(env_t *e, mode_t_ mode)
{
    gen_config_t gc = {.max_rows = 64, .prefill_chunk = 32, .page_size = 16, .max_seqs = 24,
                       .n_pages = 24 * 12};
    gen_t *g;
    ck_assert_msg(gen_new(&g, e->m, e->tok, e->be, &gc) == 0, "%s", river_err_detail());
    if (mode != MODE_PLAIN) {
        exit_config_t cfg = e->xs.cfg;
        if (mode == MODE_COSINE) {
            cfg.policy.rule = EXIT_RULE_COSINE;
            cfg.policy.tau = 0.0f; /* every row that may leave does */
        }
        ck_assert_msg(gen_set_exit(g, &cfg) == 0, "%s", river_err_detail());
    }
    return g;
}

/* Runs n requests at once (seeds seed0..), each into outs[i]. */
static void run_batch(env_t *e, mode_t_ mode, float temperature, uint64_t seed0, int n,
                      out_t *outs, int top)
{
    gen_t *g = gen_open(e, mode);
    for (int i = 0; i < n; i++) {
        memset(&outs[i], 0, sizeof outs[i]);
        gen_request_t r = {.prompt = e->prompt, .n_prompt = e->n_prompt,
                           .max_tokens = MAX_IDS,
                           .sampling = {.temperature = temperature, .top_p = 1,
                                        .seed = seed0 + (uint64_t)i},
                           .on_token = on_token, .user = &outs[i],
                           .lossless = mode == MODE_LOSSLESS, .grammar = e->matcher,
                           .logprobs = 1, .top_logprobs = top};
        int seq;
        ck_assert_msg(gen_submit(g, &r, &seq) == 0, "%s", river_err_detail());
    }
    ck_assert_int_eq(gen_run_all(g), 0);
    gen_destroy(&g);
}

/* The completion's text without its end-of-sequence id. */
static char *out_text(const env_t *e, const out_t *o)
{
    int n = o->n;
    if (o->finish == GEN_FINISH_EOS)
        n--;
    char *text;
    size_t len;
    ck_assert_int_eq(tokenizer_decode(e->tok, o->ids, (size_t)n, 0, &text, &len), 0);
    return text;
}

static int has_value(json_t *arr, json_t *v)
{
    size_t i;
    json_t *x;
    json_array_foreach(arr, i, x) if (json_equal(x, v)) return 1;
    return 0;
}

/* The schema above, checked by hand on jansson's parse. */
static void assert_valid(const char *text, const char *what)
{
    json_error_t je;
    json_t *v = json_loads(text, 0, &je);
    ck_assert_msg(v != NULL, "%s: not JSON (%s): %s", what, je.text, text);
    ck_assert_msg(json_is_object(v) && json_object_size(v) == 5, "%s: %s", what, text);
    json_t *units = json_pack("[s,s]", "celsius", "fahrenheit");
    json_t *colors = json_pack("[s,s]", "red", "green");
    json_t *cities = json_pack("[s,s]", "Paris", "Oslo");
    json_t *ns = json_pack("[n,i,i,i]", 1, 2, 3);
    ck_assert_msg(has_value(units, json_object_get(v, "unit")), "%s: unit in %s", what, text);
    ck_assert_msg(json_is_boolean(json_object_get(v, "ok")), "%s: ok in %s", what, text);
    json_t *tags = json_object_get(v, "tags");
    ck_assert_msg(json_is_array(tags) && json_array_size(tags) <= 3, "%s: tags in %s", what,
                  text);
    for (size_t i = 0; i < json_array_size(tags); i++)
        ck_assert_msg(has_value(colors, json_array_get(tags, i)), "%s: tag in %s", what, text);
    json_t *w = json_object_get(v, "where");
    ck_assert_msg(json_is_object(w) && json_object_size(w) == 1 &&
                      has_value(cities, json_object_get(w, "city")),
                  "%s: where in %s", what, text);
    ck_assert_msg(has_value(ns, json_object_get(v, "n")), "%s: n in %s", what, text);
    json_decref(units);
    json_decref(colors);
    json_decref(cities);
    json_decref(ns);
    json_decref(v);
}

/* Sampled (temperature 1) completions on every path: each that ends with EOS is valid,
 * and each prefix follows the grammar (the bytes are accepted by a fresh state). */
START_TEST(test_valid_on_every_path)
{
    env_t e;
    env_open(&e);
    const int n = 24;
    out_t *outs = calloc((size_t)n, sizeof *outs);
    for (int mode = 0; mode < MODE_COUNT; mode++) {
        run_batch(&e, (mode_t_)mode, 1.0f, 1000, n, outs, 0);
        int ended = 0;
        for (int i = 0; i < n; i++) {
            char *text = out_text(&e, &outs[i]);
            grammar_state_t *st;
            ck_assert_int_eq(grammar_state_new(&st, e.matcher), 0);
            ck_assert_msg(grammar_state_accept_bytes(st, text, strlen(text)) == 0,
                          "%s seed %d: the grammar refuses %s", mode_names[mode], i, text);
            if (outs[i].finish == GEN_FINISH_EOS) {
                ck_assert_msg(grammar_state_can_end(st), "%s: ended early: %s",
                              mode_names[mode], text);
                assert_valid(text, mode_names[mode]);
                ended++;
            } else {
                ck_assert_msg(outs[i].finish == GEN_FINISH_LENGTH, "%s: finish %d",
                              mode_names[mode], outs[i].finish);
            }
            grammar_state_destroy(&st);
            free(text);
        }
        printf("%s: %d of %d sampled completions ended within %d tokens, all valid\n",
               mode_names[mode], ended, n, MAX_IDS);
        ck_assert_msg(ended >= n / 2, "%s: only %d of %d ended", mode_names[mode], ended, n);
    }
    free(outs);
    env_close(&e);
}
END_TEST

/* Lossless greedy output is the constrained backbone's, token for token. */
START_TEST(test_lossless_equals_constrained_backbone)
{
    env_t e;
    env_open(&e);
    out_t want, got;
    run_batch(&e, MODE_PLAIN, 0, 1, 1, &want, 0);
    run_batch(&e, MODE_LOSSLESS, 0, 1, 1, &got, 0);
    ck_assert_int_eq(got.n, want.n);
    for (int i = 0; i < want.n; i++)
        ck_assert_msg(got.ids[i] == want.ids[i], "id %d: lossless %d, backbone %d", i,
                      got.ids[i], want.ids[i]);
    /* The fixed exit's own output differs somewhere (else the test shows nothing). */
    out_t lossy;
    run_batch(&e, MODE_FIXED, 0, 1, 1, &lossy, 0);
    int differ = lossy.n != want.n;
    for (int i = 0; i < want.n && i < lossy.n; i++)
        differ |= lossy.ids[i] != want.ids[i];
    ck_assert_msg(differ, "the exit path gives the backbone's ids: nothing was verified");
    char *text = out_text(&e, &want);
    if (want.finish == GEN_FINISH_EOS)
        assert_valid(text, "greedy");
    free(text);
    env_close(&e);
}
END_TEST

/* Greedy takes the top entry; a sampled token's logprob is its top_logprobs entry; the
 * top list is sorted, sums to at most 1 and holds only ids the grammar allows there. */
START_TEST(test_logprobs_consistent)
{
    env_t e;
    env_open(&e);
    out_t o[2];
    run_batch(&e, MODE_PLAIN, 0, 5, 1, &o[0], 20);
    run_batch(&e, MODE_PLAIN, 1.0f, 5, 1, &o[1], 20);
    for (int k = 0; k < 2; k++) {
        ck_assert_int_eq(o[k].n_lp, o[k].n);
        grammar_state_t *st;
        ck_assert_int_eq(grammar_state_new(&st, e.matcher), 0);
        int listed = 0;
        for (int i = 0; i < o[k].n; i++) {
            const logits_logprob_t *lp = &o[k].lp[i];
            ck_assert_int_eq(lp->id, o[k].ids[i]);
            ck_assert_msg(lp->logprob <= 0 && isfinite(lp->logprob), "logprob %g",
                          (double)lp->logprob);
            ck_assert_int_ge(lp->n_top, 1);
            double mass = 0;
            for (int j = 0; j < lp->n_top; j++) {
                mass += exp((double)lp->top_logprobs[j]);
                if (j)
                    ck_assert(lp->top_logprobs[j] <= lp->top_logprobs[j - 1]);
                if (lp->top_ids[j] == lp->id) {
                    ck_assert(lp->top_logprobs[j] == lp->logprob);
                    listed++;
                }
                /* Listed ids are allowed here: a copy of the state takes each. */
                int32_t t = lp->top_ids[j];
                if (t == e.m->cfg.eos_ids[0]) {
                    ck_assert(grammar_state_can_end(st));
                    continue;
                }
                grammar_state_t *cp;
                ck_assert_int_eq(grammar_state_new(&cp, e.matcher), 0);
                ck_assert_int_eq(grammar_state_copy(cp, st), 0);
                char buf[256];
                size_t len;
                ck_assert_int_eq(tokenizer_token_bytes(e.tok, t, buf, sizeof buf, &len), 0);
                ck_assert_msg(grammar_state_accept_bytes(cp, buf, len) == 0,
                              "step %d lists id %d, which the grammar refuses", i, t);
                grammar_state_destroy(&cp);
            }
            ck_assert_msg(mass <= 1.0001, "top mass %g", mass);
            if (k == 0)
                ck_assert_int_eq(lp->top_ids[0], lp->id);
            if (o[k].ids[i] != e.m->cfg.eos_ids[0]) {
                char buf[256];
                size_t len;
                ck_assert_int_eq(tokenizer_token_bytes(e.tok, o[k].ids[i], buf, sizeof buf,
                                                       &len), 0);
                ck_assert_int_eq(grammar_state_accept_bytes(st, buf, len), 0);
            }
        }
        if (k == 0)
            ck_assert_int_eq(listed, o[k].n);
        else
            ck_assert_int_gt(listed, 0);
        grammar_state_destroy(&st);
    }
    env_close(&e);
}
END_TEST

/* A continued completion (riverd's re-dispatch: done ids given) runs them through the
 * grammar first and continues exactly where the whole run went; done ids the grammar
 * refuses are the request's error. */
START_TEST(test_continue_with_done_ids)
{
    env_t e;
    env_open(&e);
    out_t whole, rest;
    run_batch(&e, MODE_PLAIN, 0, 3, 1, &whole, 0);
    ck_assert_int_gt(whole.n, 6);
    int k = whole.n / 2;
    gen_t *g = gen_open(&e, MODE_PLAIN);
    memset(&rest, 0, sizeof rest);
    gen_request_t r = {.prompt = e.prompt, .n_prompt = e.n_prompt, .max_tokens = MAX_IDS,
                       .sampling = {.top_p = 1}, .on_token = on_token, .user = &rest,
                       .grammar = e.matcher, .done = whole.ids, .n_done = (size_t)k};
    int seq;
    ck_assert_msg(gen_submit(g, &r, &seq) == 0, "%s", river_err_detail());
    ck_assert_int_eq(gen_run_all(g), 0);
    ck_assert_int_eq(rest.n, whole.n - k);
    for (int i = 0; i < rest.n; i++)
        ck_assert_int_eq(rest.ids[i], whole.ids[k + i]);
    /* "xyz" cannot start the object. */
    int32_t *bad;
    size_t nb;
    ck_assert_int_eq(tokenizer_encode(e.tok, "xyz", 3, 0, &bad, &nb), 0);
    r.done = bad;
    r.n_done = nb;
    ck_assert_int_eq(gen_submit(g, &r, &seq), RIVER_EINVAL);
    ck_assert_msg(strstr(river_err_detail(), "grammar"), "%s", river_err_detail());
    free(bad);
    gen_destroy(&g);
    env_close(&e);
}
END_TEST

static Suite *constrain_suite(void)
{
    Suite *s = suite_create("constrain");
    TCase *tc = tcase_create("constrain");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_valid_on_every_path);
    tcase_add_test(tc, test_lossless_equals_constrained_backbone);
    tcase_add_test(tc, test_logprobs_consistent);
    tcase_add_test(tc, test_continue_with_done_ids);
    suite_add_tcase(s, tc);
    return s;
}

RIVER_TEST_MAIN(constrain_suite)
