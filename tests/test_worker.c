/* river-worker as a process: each test starts the real binary on a bundled model with a
 * temporary configuration and plays riverd's side of the worker link with a ZMQ ROUTER
 * (answering Ready with Welcome, sending heartbeats as riverd does). The tokens that come
 * back are checked against the engine run in this process on the same prompt. */
#include <signal.h>
#include <poll.h>
#include <sys/un.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <zmq.h>

#include "common/clock.h"
#include "common/err.h"
#include "common/frame.h"
#include "common/prefix_hash.h"
#include "engine/generate.h"
#include "engine/exitriver.h"
#include "kernels/cpu/cpu.h"
#include "offline/exitriver_build.h"
#include "tests/fakerd.h"
#include "tests/proc.h"
#include "tests/testutil.h"

#define TINY TEST_DATA "/tinystories-656k"
#define KJV TEST_DATA "/kjv-12l"
#define STORIES TEST_DATA "/stories260K/stories260K.bin"
#define MAX_IDS 600

/* ---- The worker process (tests/fakerd.h plays riverd's end of the link) ---- */

/* Starts the worker with the base configuration plus `extra` YAML, waits for its Ready
 * (checked) and welcomes it. */
static void wk_start(wk_t *w, const char *model, int max_seqs, const char *extra, int hb_ms,
                     int liveness)
{
    River__Worker__WorkerMessage *m = wk_launch(w, model, max_seqs, extra, 1);
    const River__Worker__Ready *r = m->ready;
    ck_assert_uint_eq(r->protocol, 1);
    ck_assert_str_eq(r->worker_id, "w1");
    ck_assert_uint_eq(w->route_len, 2);
    ck_assert_int_eq(memcmp(w->route, "w1", 2), 0);
    ck_assert_int_eq(r->role, RIVER__WORKER__ROLE__ROLE_FULL);
    ck_assert_uint_eq(w->caps.max_seqs, (unsigned)max_seqs);
    ck_assert_uint_eq(w->caps.max_batch, 64);
    ck_assert_uint_gt(w->caps.kv_pages_total, 0);
    ck_assert_uint_eq(w->caps.kv_pages_free, w->caps.kv_pages_total);
    ck_assert_uint_eq(w->caps.layer_begin, 0);
    ck_assert_uint_eq(w->caps.layer_end, w->caps.n_layers);
    frame_free((ProtobufCMessage **)&m);
    wk_welcome(w, hb_ms, liveness);
}

/* What one request's stream delivered, checked as it arrives. */
typedef struct stream {
    uint64_t id;
    int32_t ids[MAX_IDS];
    int32_t layers[MAX_IDS];
    size_t n;
    uint32_t first_index;
    int started;
    uint64_t next_seq;
    char text[16384];
    size_t n_text;
    int ended;               /* 1: Done, 2: Failed */
    int reason;              /* Final.Reason */
    int code;                /* Error.Code */
    uint32_t prompt_tokens, completion_tokens, cached_tokens;
    uint32_t hist_sum, hist_n;
    uint32_t drafted, accepted, drafts; /* Final.exit_stats, lossless mode */
} stream_t;

/* Feeds one message to the stream it belongs to; 0 when it belongs to none. */
static int stream_take(stream_t *streams, int n_streams, const River__Worker__WorkerMessage *m)
{
    for (int i = 0; i < n_streams; i++) {
        stream_t *st = &streams[i];
        if (m->kind_case == RIVER__WORKER__WORKER_MESSAGE__KIND_TOKENS &&
            m->tokens->request_id == st->id) {
            const River__Worker__Tokens *t = m->tokens;
            ck_assert_msg(!st->ended, "tokens after the end of request %llu",
                          (unsigned long long)st->id);
            ck_assert_uint_eq(t->seq, st->next_seq++);
            if (!st->started) {
                st->first_index = t->index;
                st->started = 1;
            }
            ck_assert_uint_eq(t->index, st->first_index + st->n);
            ck_assert_uint_eq(t->n_exit_layers, t->n_ids);
            for (size_t k = 0; k < t->n_ids && st->n < MAX_IDS; k++) {
                st->layers[st->n] = t->exit_layers[k];
                st->ids[st->n++] = t->ids[k];
            }
            size_t len = strlen(t->text);
            ck_assert_uint_lt(st->n_text + len, sizeof st->text);
            memcpy(st->text + st->n_text, t->text, len + 1);
            st->n_text += len;
            return 1;
        }
        if (m->kind_case == RIVER__WORKER__WORKER_MESSAGE__KIND_DONE &&
            m->done->request_id == st->id) {
            ck_assert_int_eq(st->ended, 0);
            st->ended = 1;
            ck_assert_ptr_nonnull(m->done->final);
            st->reason = m->done->final->reason;
            if (m->done->final->usage) {
                st->prompt_tokens = m->done->final->usage->prompt_tokens;
                st->completion_tokens = m->done->final->usage->completion_tokens;
                st->cached_tokens = m->done->final->usage->cached_tokens;
            }
            if (m->done->final->exit_stats) {
                st->hist_n = (uint32_t)m->done->final->exit_stats->n_histogram;
                for (size_t k = 0; k < st->hist_n; k++)
                    st->hist_sum += m->done->final->exit_stats->histogram[k];
                st->drafted = m->done->final->exit_stats->drafted_tokens;
                st->accepted = m->done->final->exit_stats->accepted_tokens;
                st->drafts = m->done->final->exit_stats->drafts;
            }
            return 1;
        }
        if (m->kind_case == RIVER__WORKER__WORKER_MESSAGE__KIND_FAILED &&
            m->failed->request_id == st->id) {
            ck_assert_int_eq(st->ended, 0);
            st->ended = 2;
            st->code = m->failed->error->code;
            return 1;
        }
    }
    return 0;
}

/* Receives until every stream ended. */
static void streams_collect(wk_t *w, stream_t *streams, int n_streams, int timeout_ms)
{
    int64_t end = clock_now_ms() + timeout_ms;
    for (;;) {
        int open = 0;
        for (int i = 0; i < n_streams; i++)
            open += !streams[i].ended;
        if (!open)
            return;
        int left = (int)(end - clock_now_ms());
        River__Worker__WorkerMessage *m = wk_recv(w, left > 0 ? left : 0);
        ck_assert_msg(m != NULL, "streams not ended within %d ms", timeout_ms);
        if (m->kind_case != RIVER__WORKER__WORKER_MESSAGE__KIND_HEARTBEAT)
            ck_assert_msg(stream_take(streams, n_streams, m), "unexpected %s",
                          frame_case_name(&m->base));
        frame_free((ProtobufCMessage **)&m);
    }
}

/* ---- The engine in this process, for reference ---- */

typedef struct ref {
    int32_t ids[MAX_IDS];
    size_t n;
    char text[16384];
    size_t n_text;
    size_t text_at[MAX_IDS]; /* n_text after each token */
    int32_t depth[MAX_IDS];  /* exit layer of each token */
    int32_t prompt[512];
    size_t n_prompt;
} ref_t;

static void ref_on_token(void *user, const gen_event_t *ev)
{
    ref_t *r = user;
    if (r->n_text + ev->len < sizeof r->text) {
        memcpy(r->text + r->n_text, ev->text, ev->len);
        r->n_text += ev->len;
        r->text[r->n_text] = '\0';
    }
    if (ev->id >= 0 && r->n < MAX_IDS) {
        r->depth[r->n] = ev->depth;
        r->ids[r->n] = ev->id;
        r->text_at[r->n++] = r->n_text;
    }
}

/* Greedy, alone, ignore_eos as given: what the worker must reproduce. tok_path NULL:
 * the model directory's tokenizer.json. *tok_s (when not NULL) receives the rate of the
 * whole generation, prefill included. */
static void ref_run_exit(const char *model, const char *tok_path, const char *prompt,
                         int max_tokens, int ignore_eos, ref_t *r, double *tok_s,
                         const char *river_file, const exit_policy_t *policy)
{
    memset(r, 0, sizeof *r);
    model_t *m;
    tokenizer_t *tok;
    backend_t *be;
    char tp[256];
    snprintf(tp, sizeof tp, "%s/tokenizer.json", model);
    if (tok_path)
        snprintf(tp, sizeof tp, "%s", tok_path);
    ck_assert_msg(model_load(&m, model) == 0, "%s", river_err_detail());
    ck_assert_msg(tokenizer_load(&tok, tp, 0) == 0, "%s", river_err_detail());
    ck_assert_int_eq(cpu_backend_new(&be, 1, CPU_SIMD_COUNT), 0);
    int32_t *ids;
    size_t n;
    ck_assert_int_eq(tokenizer_encode(tok, prompt, strlen(prompt), 1, &ids, &n), 0);
    ck_assert_uint_le(n, 512);
    memcpy(r->prompt, ids, n * sizeof *ids);
    r->n_prompt = n;
    gen_t *g;
    gen_config_t c = {.max_rows = 64, .prefill_chunk = 64, .page_size = 16, .max_seqs = 1};
    ck_assert_int_eq(gen_new(&g, m, tok, be, &c), 0);
    exitriver_t *rv = NULL;
    const layer_weights_t *layers[64] = {0};
    if (river_file) {
        ck_assert_msg(exitriver_load(&rv, m, river_file) == 0, "%s", river_err_detail());
        ck_assert_int_le(m->cfg.n_layers, 64);
        for (int l = 0; l < m->cfg.n_layers; l++)
            layers[l] = exitriver_layer(rv, l);
        exit_config_t ex = {.policy = *policy, .river = layers,
                            .river_start = exitriver_start_layer(rv), .river_head = exitriver_head(rv)};
        ck_assert_msg(gen_set_exit(g, &ex) == 0, "%s", river_err_detail());
    }
    gen_request_t q = {.prompt = ids, .n_prompt = n, .max_tokens = max_tokens,
                       .ignore_eos = ignore_eos, .on_token = ref_on_token, .user = r};
    int seq;
    int64_t t0 = clock_now_ms();
    ck_assert_int_eq(gen_submit(g, &q, &seq), 0);
    ck_assert_int_eq(gen_run_all(g), 0);
    if (tok_s)
        *tok_s = (double)r->n * 1000.0 / (double)(clock_now_ms() - t0 + 1);
    gen_destroy(&g);
    exitriver_destroy(&rv);
    free(ids);
    cpu_backend_destroy(&be);
    tokenizer_destroy(&tok);
    model_destroy(&m);
}

static void ref_run_timed(const char *model, const char *tok_path, const char *prompt,
                          int max_tokens, int ignore_eos, ref_t *r, double *tok_s)
{
    ref_run_exit(model, tok_path, prompt, max_tokens, ignore_eos, r, tok_s, NULL, NULL);
}

static void ref_run(const char *model, const char *prompt, int max_tokens, int ignore_eos,
                    ref_t *r)
{
    ref_run_timed(model, NULL, prompt, max_tokens, ignore_eos, r, NULL);
}

static void expect_same(const stream_t *st, const ref_t *r, size_t from)
{
    ck_assert_uint_eq(st->n, r->n - from);
    for (size_t t = 0; t < st->n; t++)
        ck_assert_msg(st->ids[t] == r->ids[from + t], "request %llu token %zu: worker %d, "
                      "engine %d", (unsigned long long)st->id, from + t, st->ids[t],
                      r->ids[from + t]);
    ck_assert_str_eq(st->text, r->text + (from ? r->text_at[from - 1] : 0));
}

static const char *prompts[] = {
    "Once upon a time",
    "Tom and Lily went to the park. They saw a big",
    "The little dog",
};

/* ---- Tests ---- */

/* Three requests at once (text and token-id prompts) through a KV pool too small for all
 * of them: each stream is whole and numbered, and gives exactly the engine's tokens and
 * text for its prompt alone; exit layers come per token, Done carries usage and the exit
 * histogram; heartbeats come and report the pool free again afterwards. */
START_TEST(test_serve_matches_engine)
{
    static ref_t ref[3];
    for (int i = 0; i < 3; i++)
        ref_run(TINY, prompts[i], 48, 1, &ref[i]);
    wk_t w;
    /* Pages of 4: a request needs 15; three need 45 of 40, so some are preempted. */
    wk_start(&w, TINY, 4, "kv:\n  page_size: 4\n  pages: 40\n", 50, 100);
    ck_assert(!w.caps.has_river);
    static stream_t st[3];
    memset(st, 0, sizeof st);
    for (int i = 0; i < 3; i++) {
        st[i].id = 100 + (uint64_t)i;
        req_t q = {.id = st[i].id, .max_tokens = 48, .ignore_eos = 1};
        if (i == 1) {
            q.ids = ref[i].prompt;
            q.n_ids = ref[i].n_prompt;
        } else {
            q.text = prompts[i];
        }
        wk_submit(&w, &q);
    }
    streams_collect(&w, st, 3, 20000);
    for (int i = 0; i < 3; i++) {
        ck_assert_int_eq(st[i].ended, 1);
        ck_assert_int_eq(st[i].reason, RIVER__CLIENT__FINAL__REASON__LENGTH);
        ck_assert_uint_eq(st[i].first_index, 0);
        expect_same(&st[i], &ref[i], 0);
        ck_assert_uint_eq(st[i].completion_tokens, 48);
        ck_assert_uint_eq(st[i].prompt_tokens, ref[i].n_prompt);
        ck_assert_uint_eq(st[i].hist_n, w.caps.n_layers + 1);
        ck_assert_uint_eq(st[i].hist_sum, 48);
        for (size_t t = 0; t < st[i].n; t++) /* no exit policy: every layer ran */
            ck_assert_int_eq(st[i].layers[t], (int)w.caps.n_layers);
    }
    int before = w.heartbeats;
    int64_t t0 = clock_now_ms();
    while (clock_now_ms() - t0 < 300) {
        River__Worker__WorkerMessage *m = wk_recv(&w, 50);
        if (m)
            ck_assert_int_eq(m->kind_case, RIVER__WORKER__WORKER_MESSAGE__KIND_HEARTBEAT);
        frame_free((ProtobufCMessage **)&m);
    }
    ck_assert_int_ge(w.heartbeats - before, 3);
    ck_assert_uint_eq(w.last_hb.kv_pages_free, w.caps.kv_pages_total);
    ck_assert_uint_eq(w.last_hb.running, 0);
    ck_assert_uint_eq(w.last_hb.queue_length, 0);
    /* Idle, SIGTERM ends it at once, cleanly. */
    ck_assert_int_eq(kill(w.pid, SIGTERM), 0);
    ck_assert_int_eq(wk_wait_exit(&w, 5000), 0);
    wk_stop(&w);
}
END_TEST

/* With an Exit River and a fixed exit layer from the configuration, every token leaves the
 * backbone after that many layers: the stream says so per token and in Done's histogram,
 * Ready says the worker holds a river, and the tokens are the engine's under the same
 * policy. */
START_TEST(test_exit_policy)
{
    char river_file[512];
    snprintf(river_file, sizeof river_file, "%s/kjv-river-q4.safetensors", test_tmpdir());
    model_t *m;
    ck_assert_msg(model_load(&m, KJV) == 0, "%s", river_err_detail());
    exitriver_build_opts_t o = exitriver_build_opts_default();
    o.start_layer = 2;
    o.n_threads = 1;
    ck_assert_msg(exitriver_build(m, river_file, &o, NULL) == 0, "%s", river_err_detail());
    model_destroy(&m);
    exit_policy_t pol = {.rule = EXIT_RULE_FIXED, .exit_layer = 6, .agg = EXIT_AGG_MIN,
                         .kv = EXIT_KV_RIVER};
    static ref_t ref;
    ref_run_exit(KJV, NULL, prompts[0], 30, 1, &ref, NULL, river_file, &pol);
    char extra[700];
    snprintf(extra, sizeof extra, "river: %s\nexit:\n  rule: fixed\n  exit_layer: 6\n",
             river_file);
    wk_t w;
    wk_start(&w, KJV, 4, extra, 50, 100);
    ck_assert(w.caps.has_river);
    req_t q = {.id = 21, .text = prompts[0], .max_tokens = 30, .ignore_eos = 1};
    wk_submit(&w, &q);
    stream_t st = {.id = 21};
    streams_collect(&w, &st, 1, 10000);
    ck_assert_int_eq(st.ended, 1);
    expect_same(&st, &ref, 0);
    for (size_t t = 0; t < st.n; t++) {
        ck_assert_int_eq(st.layers[t], ref.depth[t]);
        ck_assert_int_eq(st.layers[t], 6);
    }
    ck_assert_uint_eq(st.hist_sum, 30);

    /* Per-request overrides under the worker's rule: "none" keeps a request on the full
     * backbone (the plain engine's tokens, depth 12 throughout), and an exit layer of its
     * own moves its exits, while the other request keeps the worker's. */
    static ref_t plain;
    ref_run_exit(KJV, NULL, prompts[0], 30, 1, &plain, NULL, NULL, NULL);
    req_t qn = {.id = 22, .text = prompts[0], .max_tokens = 30, .ignore_eos = 1,
                .exit_policy = "none"};
    req_t q3 = {.id = 23, .text = prompts[0], .max_tokens = 30, .ignore_eos = 1,
                .exit_layer = 3};
    wk_submit(&w, &qn);
    wk_submit(&w, &q3);
    stream_t two[2] = {{.id = 22}, {.id = 23}};
    streams_collect(&w, two, 2, 20000);
    ck_assert_int_eq(two[0].ended, 1);
    ck_assert_int_eq(two[1].ended, 1);
    expect_same(&two[0], &plain, 0);
    for (size_t t = 0; t < two[0].n; t++)
        ck_assert_int_eq(two[0].layers[t], 12);
    ck_assert_uint_eq(two[1].n, 30);
    for (size_t t = 0; t < two[1].n; t++)
        ck_assert_int_eq(two[1].layers[t], 3);
    /* A rule that does not parse is the request's error. */
    req_t qb = {.id = 24, .text = prompts[0], .max_tokens = 4, .exit_policy = "sideways"};
    wk_submit(&w, &qb);
    stream_t sb = {.id = 24};
    streams_collect(&w, &sb, 1, 5000);
    ck_assert_int_eq(sb.ended, 2); /* Failed */
    ck_assert_int_eq(sb.code, RIVER__CLIENT__ERROR__CODE__INVALID_ARGUMENT);
    wk_stop(&w);
    remove(river_file);
}
END_TEST

/* A 2-bit river (groups of 32) and a 3-bit one load in the worker as in the engine: under a
 * fixed exit after 6 layers every token leaves there, and the tokens are the engine's with
 * the same river and policy. */
START_TEST(test_exit_policy_lowbit)
{
    /* CUDA refuses 2- and 3-bit weights at upload, naming the dtype (test_backend_ops holds
     * it to that); a worker there stops at start-up with that error. */
    if (strcmp(test_device(), "cuda") == 0) {
        printf("test_exit_policy_lowbit: not on cuda (2- and 3-bit weights are the CPU's)\n");
        return;
    }
    for (int bits = 2; bits <= 3; bits++) {
        char river_file[512];
        snprintf(river_file, sizeof river_file, "%s/kjv-river-q%d.safetensors", test_tmpdir(),
                 bits);
        model_t *m;
        ck_assert_msg(model_load(&m, KJV) == 0, "%s", river_err_detail());
        exitriver_build_opts_t o = exitriver_build_opts_default();
        o.start_layer = 2;
        o.n_threads = 1;
        o.quant.bits = bits;
        o.quant.group = 32;
        ck_assert_msg(exitriver_build(m, river_file, &o, NULL) == 0, "%s", river_err_detail());
        model_destroy(&m);
        exit_policy_t pol = {.rule = EXIT_RULE_FIXED, .exit_layer = 6, .agg = EXIT_AGG_MIN,
                             .kv = EXIT_KV_RIVER};
        static ref_t ref;
        ref_run_exit(KJV, NULL, prompts[1], 24, 1, &ref, NULL, river_file, &pol);
        char extra[700];
        snprintf(extra, sizeof extra, "river: %s\nexit:\n  rule: fixed\n  exit_layer: 6\n",
                 river_file);
        wk_t w;
        wk_start(&w, KJV, 4, extra, 50, 100);
        ck_assert(w.caps.has_river);
        req_t q = {.id = 31, .text = prompts[1], .max_tokens = 24, .ignore_eos = 1};
        wk_submit(&w, &q);
        stream_t st = {.id = 31};
        streams_collect(&w, &st, 1, 10000);
        ck_assert_int_eq(st.ended, 1);
        expect_same(&st, &ref, 0);
        ck_assert_uint_eq(st.n, 24);
        for (size_t t = 0; t < st.n; t++)
            ck_assert_int_eq(st.layers[t], 6);
        wk_stop(&w);
        remove(river_file);
    }
}
END_TEST

/* Lossless mode through the worker: lossless requests (the worker's default and asked for,
 * with their own draft lengths), a plain one (policy none) and a lossy one share batches,
 * joining at different times; the lossless and plain ids are the plain backbone's, Done's
 * exit statistics carry drafted and accepted counts. A lossless request continued from
 * delivered ids (a re-dispatch after a worker died) goes on with the backbone's ids. A
 * worker without an exit rule refuses lossless requests with INVALID_ARGUMENT. */
START_TEST(test_lossless)
{
    char river_file[512];
    snprintf(river_file, sizeof river_file, "%s/kjv-river-ll.safetensors", test_tmpdir());
    model_t *m;
    ck_assert_msg(model_load(&m, KJV) == 0, "%s", river_err_detail());
    exitriver_build_opts_t o = exitriver_build_opts_default();
    o.start_layer = 1;
    o.n_threads = 1;
    ck_assert_msg(exitriver_build(m, river_file, &o, NULL) == 0, "%s", river_err_detail());
    model_destroy(&m);
    static ref_t plain[3];
    for (int i = 0; i < 3; i++)
        ref_run_exit(KJV, NULL, prompts[i], 60, 1, &plain[i], NULL, NULL, NULL);
    char extra[700];
    snprintf(extra, sizeof extra, "river: %s\nexit:\n  rule: cosine\n  tau: 0.9\n"
             "  aggregation: row\n  mode: lossless\n  draft_tokens: 4\n", river_file);
    wk_t w;
    wk_start(&w, KJV, 6, extra, 50, 100);
    static stream_t st[6];
    memset(st, 0, sizeof st);
    req_t q[6] = {
        {.id = 31, .text = prompts[0], .max_tokens = 60, .ignore_eos = 1},
        {.id = 32, .text = prompts[1], .max_tokens = 60, .ignore_eos = 1,
         .exit_policy = "none"},
        {.id = 33, .text = prompts[2], .max_tokens = 40, .ignore_eos = 1, .lossless = -1},
        {.id = 34, .text = prompts[1], .max_tokens = 60, .ignore_eos = 1, .lossless = 1,
         .draft_tokens = 2},
        {.id = 35, .text = prompts[2], .max_tokens = 25, .ignore_eos = 1, .lossless = 1,
         .draft_tokens = 7},
        {.id = 36, .text = prompts[2], .max_tokens = 60, .ignore_eos = 1,
         .delivered = plain[2].ids, .n_delivered = 17},
    };
    for (int i = 0; i < 6; i++)
        st[i].id = q[i].id;
    /* Three now, three once the first tokens came back. */
    for (int i = 0; i < 3; i++)
        wk_submit(&w, &q[i]);
    int64_t end = clock_now_ms() + 20000;
    while (st[0].n < 5) {
        River__Worker__WorkerMessage *msg = wk_recv(&w, (int)(end - clock_now_ms()));
        ck_assert_ptr_nonnull(msg);
        if (msg->kind_case != RIVER__WORKER__WORKER_MESSAGE__KIND_HEARTBEAT)
            ck_assert(stream_take(st, 6, msg));
        frame_free((ProtobufCMessage **)&msg);
    }
    for (int i = 3; i < 6; i++)
        wk_submit(&w, &q[i]);
    streams_collect(&w, st, 6, 30000);
    static const int same_as[6] = {0, 1, -1, 1, 2, 2};
    for (int i = 0; i < 6; i++) {
        ck_assert_msg(st[i].ended == 1, "request %d did not finish", i);
        if (same_as[i] < 0)
            continue; /* lossy */
        ck_assert_uint_eq(st[i].n, q[i].max_tokens - q[i].n_delivered);
        ck_assert_uint_eq(st[i].first_index, q[i].n_delivered);
        for (size_t t = 0; t < st[i].n; t++)
            ck_assert_msg(st[i].ids[t] == plain[same_as[i]].ids[q[i].n_delivered + t],
                          "request %d id %zu: %d, backbone %d", i, q[i].n_delivered + t,
                          st[i].ids[t], plain[same_as[i]].ids[q[i].n_delivered + t]);
        if (i == 1) {
            ck_assert_uint_eq(st[i].drafted, 0);
            continue;
        }
        ck_assert_msg(st[i].drafted > 0, "request %d drafted nothing", i);
        ck_assert_uint_le(st[i].accepted, st[i].drafted);
        ck_assert_uint_gt(st[i].drafts, 0);
        ck_assert_uint_le(st[i].drafts, st[i].drafted);
    }
    ck_assert_uint_eq(st[2].drafted, 0); /* lossy asked for */
    /* Lossless with policy none is the request's error. */
    req_t qb = {.id = 37, .text = prompts[0], .max_tokens = 4, .exit_policy = "none",
                .lossless = 1};
    wk_submit(&w, &qb);
    stream_t sb = {.id = 37};
    streams_collect(&w, &sb, 1, 5000);
    ck_assert_int_eq(sb.ended, 2);
    ck_assert_int_eq(sb.code, RIVER__CLIENT__ERROR__CODE__INVALID_ARGUMENT);
    wk_stop(&w);

    /* A worker without an exit rule cannot draft. */
    wk_start(&w, KJV, 2, NULL, 50, 100);
    req_t qn = {.id = 38, .text = prompts[0], .max_tokens = 4, .lossless = 1};
    wk_submit(&w, &qn);
    stream_t sn = {.id = 38};
    streams_collect(&w, &sn, 1, 5000);
    ck_assert_int_eq(sn.ended, 2);
    ck_assert_int_eq(sn.code, RIVER__CLIENT__ERROR__CODE__INVALID_ARGUMENT);
    wk_stop(&w);
    remove(river_file);
}
END_TEST

/* tinystories-656k (links to its files) under a config.json that says it has `positions`
 * positions; the directory is written to dir. */
static void longctx_model(char *dir, size_t cap, const char *name, long positions)
{
    char path[600];
    snprintf(dir, cap, "%s/%s", test_tmpdir(), name);
    ck_assert_int_eq(mkdir(dir, 0755), 0);
    const char *files[] = {"model.safetensors", "tokenizer.json", "tokenizer_config.json",
                           "special_tokens_map.json", "generation_config.json"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char src[600];
        snprintf(src, sizeof src, "%s/%s", TINY, files[i]);
        char *abs = realpath(src, NULL);
        ck_assert_ptr_nonnull(abs);
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        ck_assert_int_eq(symlink(abs, path), 0);
        free(abs);
    }
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fprintf(f, "{\"architectures\": [\"LlamaForCausalLM\"], \"bos_token_id\": 1, "
               "\"eos_token_id\": 2, \"hidden_act\": \"silu\", \"hidden_size\": 128, "
               "\"intermediate_size\": 384, \"max_position_embeddings\": %ld, "
               "\"model_type\": \"llama\", \"num_attention_heads\": 8, "
               "\"num_hidden_layers\": 2, \"num_key_value_heads\": 4, "
               "\"rms_norm_eps\": 1e-06, \"rope_theta\": 10000.0, "
               "\"tie_word_embeddings\": true, \"torch_dtype\": \"float32\", "
               "\"vocab_size\": 2048}\n", positions);
    ck_assert_int_eq(fclose(f), 0);
}

/* kv.pages 0 on a model whose full contexts outgrow the host (tinystories-656k told it has
 * 2^21 positions: 2 GiB of KV a sequence, 32 GiB for 16): the worker starts, its pool holds
 * at least one full context and at most half the physical memory beyond that, and it
 * serves; with kv.dtype f16 the same memory holds twice the pages. Uncapped, the pool is refused at start-up on any host of less than 64 GiB. */
START_TEST(test_kv_pages_default_fits)
{
    char dir[512];
    longctx_model(dir, sizeof dir, "longctx", 2097152);
    wk_t w;
    wk_start(&w, dir, 16, NULL, 50, 200);
    /* 2 layers, K and V, 4 heads of 16, 16 positions, f32: 16 KiB a page. */
    const double page = 2.0 * 2 * 64 * 16 * 4, per_seq = 2097152 / 16;
    double phys = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
    double total = (double)w.caps.kv_pages_total;
    ck_assert_msg(total >= per_seq, "%.0f pages: less than one full context", total);
    ck_assert_msg(total <= per_seq || total * page <= phys / 2, "%.0f pages of %.0f bytes "
                  "on a host of %.0f bytes", total, page, phys);
    req_t q = {.id = 3, .text = "Once upon a time", .max_tokens = 8, .ignore_eos = 1};
    wk_submit(&w, &q);
    stream_t st = {.id = 3};
    streams_collect(&w, &st, 1, 20000);
    ck_assert_int_eq(st.ended, 1);
    ck_assert_uint_eq(st.n, 8);
    wk_stop(&w);

    /* kv.dtype f16 halves a page's bytes, so the capped pool holds twice the pages (within
     * what the free memory moved meanwhile), and it serves the same way. */
    wk_start(&w, dir, 16, "kv: {dtype: f16}\n", 50, 200);
    double half = (double)w.caps.kv_pages_total;
    if (total < 16 * per_seq && half < 16 * per_seq)
        ck_assert_msg(half >= 1.6 * total && half <= 2.4 * total, "%.0f f16 pages against "
                      "%.0f of f32", half, total);
    else
        ck_assert_msg(half >= total, "%.0f f16 pages against %.0f of f32", half, total);
    req_t q2 = {.id = 4, .text = "Once upon a time", .max_tokens = 8, .ignore_eos = 1};
    wk_submit(&w, &q2);
    stream_t st2 = {.id = 4};
    streams_collect(&w, &st2, 1, 20000);
    ck_assert_int_eq(st2.ended, 1);
    ck_assert_uint_eq(st2.n, 8);
    wk_stop(&w);
}
END_TEST

/* kv.pages 0 on a model one of whose contexts is more KV than the memory has free (2^26
 * positions: 64 GiB): the worker refuses to start, saying what it needed and which key to
 * set, rather than failing at the mapping. */
START_TEST(test_kv_context_too_large)
{
    /* 2^26 positions (the most a model may have) of 1 KiB of KV each: 64 GiB. */
    long avail = sysconf(_SC_PHYS_PAGES) * sysconf(_SC_PAGESIZE) / (1L << 30);
    if (avail >= 60) {
        printf("test_kv_context_too_large: %ld GiB here, one context may fit\n", avail);
        return;
    }
    char dir[512], cfg[1024], log[600];
    longctx_model(dir, sizeof dir, "hugectx", 1L << 26);
    snprintf(cfg, sizeof cfg, "riverd: \"ipc://%s/nobody.sock\"\nmodel: %s\nthreads: 1\n"
             "log_level: error\nauth: {mode: plain}\n%s", test_tmpdir(), dir, test_device_yaml());
    snprintf(log, sizeof log, "%s/hugectx.log", test_tmpdir());
    pid_t pid = wk_spawn("hugectx.yaml", cfg, NULL, log, NULL);
    int code = test_wait_code(pid, 30000);
    ck_assert_msg(code > 0, "worker exit status %d", code);
    size_t n = 0;
    char *text = test_read_file(log, &n);
    ck_assert_ptr_nonnull(text);
    ck_assert_msg(strstr(text, "one full context of 67108864 positions") &&
                      strstr(text, "set kv.pages"), "%s", text);
    free(text);
}
END_TEST

/* A batch smaller than the prefill chunk cuts every chunk to it: the worker says so at
 * start (before it loads the model, so a missing one does not hide it), and says nothing
 * with the defaults, whose batch holds a whole chunk. */
START_TEST(test_batch_below_chunk_warns)
{
    const char *extra[] = {"max_batch_rows: 64\n", ""};
    for (int i = 0; i < 2; i++) {
        char cfg[1024], log[600], name[64];
        snprintf(cfg, sizeof cfg, "riverd: \"ipc://%s/nobody.sock\"\nmodel: %s/no-model\n"
                 "threads: 1\nlog_level: warn\nauth: {mode: plain}\n%s", test_tmpdir(),
                 test_tmpdir(), extra[i]);
        snprintf(name, sizeof name, "chunk-%d.yaml", i);
        snprintf(log, sizeof log, "%s/chunk-%d.log", test_tmpdir(), i);
        pid_t pid = wk_spawn(name, cfg, NULL, log, NULL);
        int code = test_wait_code(pid, 30000);
        ck_assert_msg(code > 0, "worker exit status %d", code);
        size_t n = 0;
        char *text = test_read_file(log, &n);
        ck_assert_ptr_nonnull(text);
        const char *warn = "max_batch_rows 64 is below prefill_chunk 256: prompts prefill at "
                           "most 64 rows a step";
        if (i == 0)
            ck_assert_msg(strstr(text, warn), "%s", text);
        else
            ck_assert_msg(!strstr(text, "is below prefill_chunk"), "%s", text);
        ck_assert_msg(strstr(text, "no-model"), "%s", text);
        free(text);
    }
}
END_TEST

/* A device lost for good (a sticky GPU fault; here the opaque backend's
 * RIVER_OPAQUE_FAULT_AFTER) fails the running request UNAVAILABLE, which riverd sends to
 * another worker, and ends the worker with a failure status instead of answering every
 * later request with the same error. */
START_TEST(test_device_lost_exits)
{
    if (!strcmp(test_device(), "cuda"))
        return; /* nothing can lose a real GPU on purpose */
    wk_t w;
    ck_assert_int_eq(setenv("RIVER_OPAQUE_FAULT_AFTER", "60", 1), 0);
    wk_start(&w, TINY, 4, strcmp(test_device(), "opaque") ? "device: opaque\n" : NULL, 50, 200);
    unsetenv("RIVER_OPAQUE_FAULT_AFTER");
    req_t q = {.id = 9, .text = "Once upon a time", .max_tokens = 64, .ignore_eos = 1};
    wk_submit(&w, &q);
    stream_t st = {.id = 9};
    int64_t end = clock_now_ms() + 10000;
    int code = -1;
    while (code < 0 && clock_now_ms() < end) {
        River__Worker__WorkerMessage *m = wk_recv(&w, 100);
        if (m) {
            if (m->kind_case != RIVER__WORKER__WORKER_MESSAGE__KIND_HEARTBEAT)
                ck_assert_msg(stream_take(&st, 1, m), "unexpected %s", frame_case_name(&m->base));
            frame_free((ProtobufCMessage **)&m);
        }
        code = wk_wait_exit(&w, 0);
    }
    ck_assert_msg(code > 0, "worker exit status %d after its device was lost", code);
    /* What it sent before it went may still be on the socket. */
    River__Worker__WorkerMessage *m;
    while (!st.ended && (m = wk_recv(&w, 500))) {
        if (m->kind_case != RIVER__WORKER__WORKER_MESSAGE__KIND_HEARTBEAT)
            ck_assert_msg(stream_take(&st, 1, m), "unexpected %s", frame_case_name(&m->base));
        frame_free((ProtobufCMessage **)&m);
    }
    ck_assert_int_eq(st.ended, 2);
    ck_assert_int_eq(st.code, RIVER__CLIENT__ERROR__CODE__UNAVAILABLE);
    ck_assert_uint_lt(st.n, 64);
    wk_stop(&w);
}
END_TEST

/* Cancel in mid-stream ends the request with Done(CANCELLED) and its KV pages come back.
 * The worker is paused while the Cancel is sent, so the cancel lands mid-stream. */
START_TEST(test_cancel_frees_pages)
{
    wk_t w;
    wk_start(&w, KJV, 4, NULL, 10, 200);
    req_t q = {.id = 7, .text = "And the LORD spake unto Moses", .max_tokens = 200,
               .ignore_eos = 1};
    wk_submit(&w, &q);
    /* A heartbeat that shows the request holding pages. */
    int64_t end = clock_now_ms() + 10000;
    stream_t st = {.id = 7};
    while (!(w.last_hb.running == 1 && w.last_hb.kv_pages_free < w.caps.kv_pages_total)) {
        ck_assert_msg(clock_now_ms() < end, "no heartbeat with the request running");
        River__Worker__WorkerMessage *m = wk_recv(&w, 1000);
        ck_assert_ptr_nonnull(m);
        if (m->kind_case != RIVER__WORKER__WORKER_MESSAGE__KIND_HEARTBEAT)
            ck_assert(stream_take(&st, 1, m));
        frame_free((ProtobufCMessage **)&m);
    }
    ck_assert_int_eq(st.ended, 0);
    ck_assert_int_eq(kill(w.pid, SIGSTOP), 0);
    wk_cancel(&w, 7);
    ck_assert_int_eq(kill(w.pid, SIGCONT), 0);
    streams_collect(&w, &st, 1, 10000);
    ck_assert_int_eq(st.ended, 1);
    ck_assert_int_eq(st.reason, RIVER__CLIENT__FINAL__REASON__CANCELLED);
    ck_assert_uint_lt(st.n, 200);
    ck_assert_uint_eq(st.completion_tokens, st.n);
    /* The next heartbeat has every page free. */
    int hb = w.heartbeats;
    while (w.heartbeats == hb) {
        River__Worker__WorkerMessage *m = wk_recv(&w, 2000);
        ck_assert_ptr_nonnull(m);
        frame_free((ProtobufCMessage **)&m);
    }
    ck_assert_uint_eq(w.last_hb.kv_pages_free, w.caps.kv_pages_total);
    ck_assert_uint_eq(w.last_hb.running, 0);
    /* Cancelling an unknown (finished) request is ignored. */
    wk_cancel(&w, 7);
    wk_cancel(&w, 12345);
    ck_assert_int_eq(wk_wait_exit(&w, 100), -1);
    wk_stop(&w);
}
END_TEST

static void expect_failed(wk_t *w, uint64_t id, int code)
{
    River__Worker__WorkerMessage *m =
        wk_expect(w, RIVER__WORKER__WORKER_MESSAGE__KIND_FAILED, 5000);
    ck_assert_uint_eq(m->failed->request_id, id);
    ck_assert_ptr_nonnull(m->failed->error);
    ck_assert_msg((int)m->failed->error->code == code, "request %llu: code %d (%s), want %d",
                  (unsigned long long)id, m->failed->error->code, m->failed->error->message,
                  code);
    ck_assert_int_gt((int)strlen(m->failed->error->message), 0);
    frame_free((ProtobufCMessage **)&m);
}

/* Malformed frames and bad requests get Failed with INVALID_ARGUMENT, and the worker keeps
 * serving. */
START_TEST(test_bad_input)
{
    wk_t w;
    wk_start(&w, TINY, 4, NULL, 50, 100);
    const int INVALID = RIVER__CLIENT__ERROR__CODE__INVALID_ARGUMENT;
    wk_send_raw(&w, "\xff\xff\xff\xff", 4, 0); /* not protobuf */
    expect_failed(&w, 0, INVALID);
    wk_send_raw(&w, "", 0, 0); /* no message kind */
    expect_failed(&w, 0, INVALID);
    wk_send_raw(&w, "\x08\x01", 2, 1); /* two parts */
    expect_failed(&w, 0, INVALID);
    size_t big_len = 2u << 20; /* over the frame limit */
    char *big = calloc(1, big_len);
    wk_send_raw(&w, big, big_len, 0);
    free(big);
    expect_failed(&w, 0, INVALID);
    req_t none = {.id = 5, .max_tokens = 4}; /* no prompt */
    wk_submit(&w, &none);
    expect_failed(&w, 5, INVALID);
    int32_t bad_ids[] = {1, 99999};
    req_t range = {.id = 6, .ids = bad_ids, .n_ids = 2, .max_tokens = 4};
    wk_submit(&w, &range);
    expect_failed(&w, 6, INVALID);
    int32_t one = 3;
    req_t mismatch = {.id = 8, .text = "Hi", .max_tokens = 4, .delivered = &one,
                      .n_delivered = 1, .bad_count = 1};
    wk_submit(&w, &mismatch); /* tokens_delivered says 2, one id comes with it */
    expect_failed(&w, 8, INVALID);
    req_t zero = {.id = 0, .text = "Hi", .max_tokens = 4}; /* id 0 is for bad frames */
    wk_submit(&w, &zero);
    expect_failed(&w, 0, INVALID);
    int32_t long_prompt[600];
    for (int i = 0; i < 600; i++)
        long_prompt[i] = 5;
    req_t too_long = {.id = 11, .ids = long_prompt, .n_ids = 600, .max_tokens = 4};
    wk_submit(&w, &too_long); /* the context is 512 */
    expect_failed(&w, 11, INVALID);
    /* Still serving. */
    req_t ok = {.id = 12, .text = "Once upon a time", .max_tokens = 5, .ignore_eos = 1};
    wk_submit(&w, &ok);
    stream_t st = {.id = 12};
    streams_collect(&w, &st, 1, 5000);
    ck_assert_int_eq(st.ended, 1);
    ck_assert_uint_eq(st.n, 5);
    ck_assert_int_eq(wk_wait_exit(&w, 50), -1);
    wk_stop(&w);
}
END_TEST

/* A Submit carrying the ids the client already has continues the completion: the stream
 * starts at that index and gives exactly the engine's remaining tokens and text. */
START_TEST(test_resume_delivered)
{
    static ref_t ref;
    ref_run(TINY, prompts[1], 40, 1, &ref);
    wk_t w;
    wk_start(&w, TINY, 4, NULL, 50, 100);
    const size_t k = 15;
    req_t q = {.id = 9, .text = prompts[1], .max_tokens = 40, .ignore_eos = 1,
               .delivered = ref.ids, .n_delivered = k};
    wk_submit(&w, &q);
    stream_t st = {.id = 9};
    streams_collect(&w, &st, 1, 10000);
    ck_assert_int_eq(st.ended, 1);
    ck_assert_int_eq(st.reason, RIVER__CLIENT__FINAL__REASON__LENGTH);
    ck_assert_uint_eq(st.first_index, k);
    expect_same(&st, &ref, k);
    ck_assert_uint_eq(st.completion_tokens, 40);
    /* All of it delivered already: Done at once, nothing generated. */
    req_t all = {.id = 10, .text = prompts[1], .max_tokens = 40, .ignore_eos = 1,
                 .delivered = ref.ids, .n_delivered = 40};
    wk_submit(&w, &all);
    stream_t st2 = {.id = 10};
    streams_collect(&w, &st2, 1, 5000);
    ck_assert_int_eq(st2.ended, 1);
    ck_assert_int_eq(st2.reason, RIVER__CLIENT__FINAL__REASON__LENGTH);
    ck_assert_uint_eq(st2.n, 0);
    wk_stop(&w);
}
END_TEST

/* The prefix cache through the worker: a prompt sent again reuses all but its last token
 * (Usage.cached_tokens) and gives the same tokens; the heartbeat before its Done names
 * the cached pages under the seed of Ready. prefix_cache.enabled false turns it off. */
START_TEST(test_prefix_cache_usage)
{
    static ref_t ref;
    ref_run(TINY, prompts[1], 20, 1, &ref);
    for (int on = 1; on >= 0; on--) {
        wk_t w;
        /* Pages of 4, so that the short prompt fills some. */
        wk_start(&w, TINY, 4,
                 on ? "kv:\n  page_size: 4\n"
                    : "kv:\n  page_size: 4\nprefix_cache:\n  enabled: false\n", 50, 100);
        ck_assert(on ? w.caps.prefix_seed != 0 : w.caps.prefix_seed == 0);
        ck_assert_uint_eq(w.caps.prefix_key.len, on ? PREFIX_KEY_BYTES : 0);
        for (int round = 0; round < 2; round++) {
            req_t q = {.id = 20 + (uint64_t)round, .text = prompts[1], .max_tokens = 20,
                       .ignore_eos = 1};
            wk_submit(&w, &q);
            stream_t st = {.id = q.id};
            streams_collect(&w, &st, 1, 10000);
            ck_assert_int_eq(st.ended, 1);
            expect_same(&st, &ref, 0);
            ck_assert_uint_eq(st.prompt_tokens, ref.n_prompt);
            ck_assert_uint_eq(st.cached_tokens, on && round ? ref.n_prompt - 1 : 0);
        }
        if (on) {
            /* The names riverd would compute from the prompt's ids (the worker's key and
             * seed, the empty salt fakerd's Submit leaves). */
            prefix_key_t key;
            ck_assert_int_eq(prefix_key_from_bytes(&key, w.caps.prefix_key.data,
                                                   w.caps.prefix_key.len), 0);
            prefix_name_t names[8];
            size_t n = prefix_hash_chain(&key, prefix_hash_root(&key, w.caps.prefix_seed,
                                                                NULL, 0),
                                         ref.prompt, ref.n_prompt, (int)w.caps.kv_page_size,
                                         names, 8);
            ck_assert_uint_gt(n, 0);
            ck_assert_uint_gt(w.last_hb.prefix_cache_pages, 0);
            int found = 0;
            for (size_t i = 0; i < w.last_hb.n_prefix_pages; i++)
                found |= w.last_hb.prefix_pages[i] == names[n - 1].lo;
            ck_assert_msg(found, "the heartbeat does not name the prompt's last full page");
            /* Once the request is gone, cached pages nobody uses count as free. */
            int hb = w.heartbeats;
            while (w.heartbeats == hb) {
                River__Worker__WorkerMessage *m = wk_recv(&w, 2000);
                ck_assert_ptr_nonnull(m);
                frame_free((ProtobufCMessage **)&m);
            }
            ck_assert_uint_gt(w.last_hb.prefix_cache_pages, 0);
            ck_assert_uint_eq(w.last_hb.kv_pages_free, w.caps.kv_pages_total);
        }
        wk_stop(&w);
    }
}
END_TEST

/* Drain: new requests are refused with UNAVAILABLE, the running one finishes, the last
 * message is a heartbeat saying draining with nothing left, and the process exits 0. */
START_TEST(test_drain_exits_zero)
{
    static ref_t ref;
    ref_run(KJV, "And the LORD spake unto Moses", 60, 1, &ref);
    wk_t w;
    wk_start(&w, KJV, 4, NULL, 50, 100);
    req_t q = {.id = 1, .text = "And the LORD spake unto Moses", .max_tokens = 60,
               .ignore_eos = 1};
    wk_submit(&w, &q);
    wk_drain(&w, 0);
    req_t late = {.id = 2, .text = "Blessed", .max_tokens = 4};
    wk_submit(&w, &late);
    stream_t st[2] = {{.id = 1}, {.id = 2}};
    streams_collect(&w, st, 2, 20000);
    ck_assert_int_eq(st[0].ended, 1);
    expect_same(&st[0], &ref, 0);
    ck_assert_int_eq(st[1].ended, 2);
    ck_assert_int_eq(st[1].code, RIVER__CLIENT__ERROR__CODE__UNAVAILABLE);
    River__Worker__WorkerMessage *m;
    int saw_last = 0;
    while ((m = wk_recv(&w, 2000))) {
        ck_assert_int_eq(m->kind_case, RIVER__WORKER__WORKER_MESSAGE__KIND_HEARTBEAT);
        saw_last = m->heartbeat->draining && m->heartbeat->running == 0 &&
                   m->heartbeat->queue_length == 0;
        frame_free((ProtobufCMessage **)&m);
    }
    ck_assert_int_eq(saw_last, 1);
    ck_assert_int_eq(wk_wait_exit(&w, 5000), 0);
    wk_stop(&w);
}
END_TEST

/* A drain deadline cuts off what is still running with CANCELLED (riverd re-dispatches it)
 * and the worker still exits 0. */
START_TEST(test_drain_deadline)
{
    wk_t w;
    wk_start(&w, KJV, 4, NULL, 50, 100);
    req_t q = {.id = 1, .text = "And the LORD", .max_tokens = 200, .ignore_eos = 1};
    wk_submit(&w, &q);
    wk_drain(&w, 60);
    stream_t st = {.id = 1};
    streams_collect(&w, &st, 1, 10000);
    ck_assert_int_eq(st.ended, 2);
    ck_assert_int_eq(st.code, RIVER__CLIENT__ERROR__CODE__CANCELLED);
    ck_assert_uint_lt(st.n, 200);
    ck_assert_int_eq(wk_wait_exit(&w, 5000), 0);
    wk_stop(&w);
}
END_TEST

/* SIGTERM: the running request still ends explicitly (it finishes within the grace
 * period), and the worker exits 0. */
START_TEST(test_sigterm_graceful)
{
    wk_t w;
    wk_start(&w, KJV, 4, NULL, 50, 100);
    req_t q = {.id = 3, .text = "And the LORD", .max_tokens = 100, .ignore_eos = 1};
    wk_submit(&w, &q);
    stream_t st = {.id = 3};
    River__Worker__WorkerMessage *m;
    while (!st.n) {
        m = wk_recv(&w, 5000);
        ck_assert_ptr_nonnull(m);
        if (m->kind_case != RIVER__WORKER__WORKER_MESSAGE__KIND_HEARTBEAT)
            ck_assert(stream_take(&st, 1, m));
        frame_free((ProtobufCMessage **)&m);
    }
    ck_assert_int_eq(kill(w.pid, SIGTERM), 0);
    streams_collect(&w, &st, 1, 10000);
    ck_assert_int_eq(st.ended, 1);
    ck_assert_uint_eq(st.n, 100);
    ck_assert_int_eq(wk_wait_exit(&w, 5000), 0);
    wk_stop(&w);
}
END_TEST

/* A request whose deadline passes while it waits behind another fails with
 * DEADLINE_EXCEEDED; the other one is unaffected, and a second Submit with its id (a
 * riverd bug) neither disturbs it nor gets an answer that would read as its end. */
START_TEST(test_deadline)
{
    wk_t w;
    wk_start(&w, KJV, 1, NULL, 50, 100);
    req_t a = {.id = 1, .text = "And the LORD", .max_tokens = 40, .ignore_eos = 1};
    req_t b = {.id = 2, .text = "Blessed", .max_tokens = 40, .deadline_ms = 5};
    wk_submit(&w, &a);
    wk_submit(&w, &a);
    wk_submit(&w, &b);
    stream_t st[2] = {{.id = 1}, {.id = 2}};
    streams_collect(&w, st, 2, 20000);
    int64_t t0 = clock_now_ms();
    while (clock_now_ms() - t0 < 200) {
        River__Worker__WorkerMessage *m = wk_recv(&w, 50);
        if (m)
            ck_assert_int_eq(m->kind_case, RIVER__WORKER__WORKER_MESSAGE__KIND_HEARTBEAT);
        frame_free((ProtobufCMessage **)&m);
    }
    ck_assert_int_eq(st[0].ended, 1);
    ck_assert_uint_eq(st[0].n, 40);
    ck_assert_int_eq(st[1].ended, 2);
    ck_assert_int_eq(st[1].code, RIVER__CLIENT__ERROR__CODE__DEADLINE_EXCEEDED);
    ck_assert_uint_eq(st[1].n, 0);
    wk_stop(&w);
}
END_TEST

/* Liveness: heartbeats come every interval; when riverd goes silent the worker drops its
 * requests, reconnects and says Ready again; Reconnect from riverd gets a Ready too. */
START_TEST(test_heartbeats_and_reconnect)
{
    wk_t w;
    wk_start(&w, TINY, 4, NULL, 40, 3);
    River__Worker__WorkerMessage *m;
    int64_t t0 = clock_now_ms();
    while (clock_now_ms() - t0 < 500) {
        m = wk_recv(&w, 100);
        if (m) {
            ck_assert_int_eq(m->kind_case, RIVER__WORKER__WORKER_MESSAGE__KIND_HEARTBEAT);
            frame_free((ProtobufCMessage **)&m);
        }
    }
    ck_assert_int_ge(w.heartbeats, 6);  /* 500 ms at 40 ms, loosely */
    ck_assert_int_le(w.heartbeats, 20);
    /* riverd falls silent: after 3 x 40 ms and a back-off the worker comes back. */
    w.silent = 1;
    m = wk_expect(&w, RIVER__WORKER__WORKER_MESSAGE__KIND_READY, 3000);
    ck_assert_str_eq(m->ready->worker_id, "w1");
    frame_free((ProtobufCMessage **)&m);
    w.silent = 0;
    wk_welcome(&w, 40, 3);
    /* Still serving after the reconnection. */
    req_t q = {.id = 4, .text = "Once upon a time", .max_tokens = 8, .ignore_eos = 1};
    wk_submit(&w, &q);
    stream_t st = {.id = 4};
    streams_collect(&w, &st, 1, 5000);
    ck_assert_int_eq(st.ended, 1);
    ck_assert_uint_eq(st.n, 8);
    /* Reconnect: a fresh Ready on the same connection. */
    River__Worker__Reconnect rc = RIVER__WORKER__RECONNECT__INIT;
    rc.reason = "test";
    River__Worker__DaemonMessage dm = RIVER__WORKER__DAEMON_MESSAGE__INIT;
    dm.kind_case = RIVER__WORKER__DAEMON_MESSAGE__KIND_RECONNECT;
    dm.reconnect = &rc;
    wk_send(&w, &dm);
    m = wk_expect(&w, RIVER__WORKER__WORKER_MESSAGE__KIND_READY, 3000);
    frame_free((ProtobufCMessage **)&m);
    wk_stop(&w);
}
END_TEST

/* Tokens per second through the worker (Submit to Done, as riverd sees it) against the
 * engine in this process, stories260K greedy, 256 tokens; one stream, then four at once.
 * The rates are printed; the check is that the tokens are the engine's. */
START_TEST(test_throughput)
{
    const char *model = TEST_DATA "/stories260K/stories260K.bin";
    const char *tokp = TEST_DATA "/stories260K/tok512.bin";
    static ref_t ref;
    double local = 0;
    ref_run_timed(model, tokp, "Once upon a time", 256, 1, &ref, &local);
    wk_t w;
    wk_start(&w, model, 4, NULL, 100, 50);
    double rate[2];
    for (int pass = 0; pass < 2; pass++) {
        int n = pass ? 4 : 1;
        static stream_t st[4];
        memset(st, 0, sizeof st);
        int64_t t0 = clock_now_ms();
        for (int i = 0; i < n; i++) {
            st[i].id = 1000 + (uint64_t)(pass * 10 + i);
            req_t q = {.id = st[i].id, .text = "Once upon a time", .max_tokens = 256,
                       .ignore_eos = 1};
            wk_submit(&w, &q);
        }
        streams_collect(&w, st, n, 30000);
        rate[pass] = 256.0 * n * 1000.0 / (double)(clock_now_ms() - t0 + 1);
        for (int i = 0; i < n; i++) {
            ck_assert_int_eq(st[i].ended, 1);
            ck_assert_uint_eq(st[i].n, ref.n);
            for (size_t t = 0; t < ref.n; t++)
                ck_assert_int_eq(st[i].ids[t], ref.ids[t]);
        }
    }
    printf("throughput, stories260K greedy 256 tokens, 1 thread: in-process %.0f tok/s; "
           "through river-worker %.0f tok/s (1 stream), %.0f tok/s (4 streams)\n", local,
           rate[0], rate[1]);
    fflush(stdout);
    wk_stop(&w);
}
END_TEST

/* Under systemd (Type=notify): READY once the engine is built, then watchdog pings from the
 * poll loop at half of WATCHDOG_USEC, on a real notify socket. */
START_TEST(test_systemd_notify)
{
    char sock_path[300], cfg[600];
    snprintf(sock_path, sizeof sock_path, "%s/notify.sock", test_tmpdir());
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    ck_assert_int_ge(fd, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    ck_assert_uint_lt(strlen(sock_path), sizeof sa.sun_path);
    memcpy(sa.sun_path, sock_path, strlen(sock_path) + 1);
    unlink(sock_path);
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    snprintf(cfg, sizeof cfg, "riverd: \"ipc://%s/nobody.sock\"\nmodel: %s\nthreads: 1\n"
             "log_level: error\nauth: {mode: plain}\n", test_tmpdir(), STORIES);
    char notify_env[320];
    snprintf(notify_env, sizeof notify_env, "NOTIFY_SOCKET=%s", sock_path);
    const char *env[] = {notify_env, "WATCHDOG_USEC=200000", NULL};
    pid_t pid = wk_spawn("notify.yaml", cfg, NULL, NULL, env);
    int ready = 0, pings = 0;
    int64_t end = clock_now_ms() + 5000;
    while (clock_now_ms() < end && pings < 3) {
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        if (poll(&pfd, 1, 500) <= 0)
            continue;
        char buf[512];
        ssize_t n = recv(fd, buf, sizeof buf - 1, 0);
        ck_assert_int_gt((int)n, 0);
        buf[n] = '\0';
        if (strstr(buf, "READY=1"))
            ready = 1;
        if (strstr(buf, "WATCHDOG=1")) {
            ck_assert_msg(ready, "a watchdog ping came before READY");
            pings++;
        }
    }
    test_kill(&pid, SIGKILL);
    close(fd);
    ck_assert(ready);
    ck_assert_int_ge(pings, 3);
}
END_TEST

static Suite *worker_suite(void)
{
    Suite *s = suite_create("worker");
    TCase *tc = tcase_create("process");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_serve_matches_engine);
    tcase_add_test(tc, test_kv_pages_default_fits);
    tcase_add_test(tc, test_device_lost_exits);
    tcase_add_test(tc, test_kv_context_too_large);
    tcase_add_test(tc, test_batch_below_chunk_warns);
    tcase_add_test(tc, test_systemd_notify);
    tcase_add_test(tc, test_exit_policy);
    tcase_add_test(tc, test_exit_policy_lowbit);
    tcase_add_test(tc, test_lossless);
    tcase_add_test(tc, test_cancel_frees_pages);
    tcase_add_test(tc, test_bad_input);
    tcase_add_test(tc, test_resume_delivered);
    tcase_add_test(tc, test_prefix_cache_usage);
    tcase_add_test(tc, test_drain_exits_zero);
    tcase_add_test(tc, test_drain_deadline);
    tcase_add_test(tc, test_sigterm_graceful);
    tcase_add_test(tc, test_deadline);
    tcase_add_test(tc, test_heartbeats_and_reconnect);
    tcase_add_test(tc, test_throughput);
    suite_add_tcase(s, tc);
    return s;
}

RIVER_TEST_MAIN(worker_suite)
