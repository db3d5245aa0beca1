/* Serving, end to end: real riverd, river-worker and riverctl processes on ipc:// sockets
 * under a temporary directory (and one HTTP port on 127.0.0.1), driven through the client
 * library and raw ZMQ sockets. Binaries are found in <builddir>/bin, builddir being two
 * levels above this test binary.
 *
 * What must hold: the tokens through riverd are the in-process engine's
 * (greedy); every stream is complete with consecutive sequence numbers or ends with an
 * explicit error, also when a worker is killed mid-stream; cancel frees the KV pages;
 * deadlines, limits and a full queue give their error codes; bad frames get error replies
 * and the daemon stays up; a bad configuration stops riverd with file:line:column. */
#include <arpa/inet.h>
#include <dirent.h>
#include <jansson.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <zmq.h>

#include "client/river_client.h"
#include "common/clock.h"
#include "common/err.h"
#include "common/frame.h"
#include "tests/cluster.h"
#include "tests/proc.h"
#include "tests/streams.h"
#include "tests/testutil.h"

#define TS_FAST_MODEL TEST_DATA "/tinystories-656k" /* ~10k tokens/s on one thread */
#define TS_SLOW_MODEL TEST_DATA "/kjv-12l"          /* 12 layers, ~700 tokens/s, context 256 */
#define TS_MAX_WORKERS 4

/* ---- riverd and its workers ---- */

typedef struct ts_opts {
    const char *model;       /* the workers' model (repository-relative) */
    int supervised;          /* local_workers riverd starts */
    int external;            /* workers the test starts (their pids are known) */
    int max_seqs;            /* per worker; 0: 16 */
    int heartbeat_ms;        /* 0: 200 */
    int liveness;            /* 0: 3 */
    int metrics_port;        /* 0: off */
    const char *extra;       /* more riverd YAML: top-level keys other than endpoints,
                                heartbeat, local_workers */
    int no_wait;             /* do not wait for the workers */
    const char *worker_extra;/* more worker YAML (river, exit section) */
} ts_opts_t;

typedef struct ts_srv {
    cluster_t c;
    char wcfg[400];          /* the workers' configuration, shared by all of them */
    ts_opts_t o;
} ts_srv_t;

/* riverd's configuration of s, with `extra` at the end. */
static void ts_write_config(ts_srv_t *s, const char *extra)
{
    char local[128] = "", y[4096];
    if (s->o.supervised)
        snprintf(local, sizeof local, "local_workers:\n  - config: worker.yaml\n    count: %d\n",
                 s->o.supervised);
    snprintf(y, sizeof y, "%s%s", local, extra ? extra : "");
    cluster_opts_t co = {.metrics_port = s->o.metrics_port,
                         .heartbeat_ms = s->o.heartbeat_ms,
                         .liveness = s->o.liveness ? s->o.liveness : 3,
                         .plain = 1, /* tests/test_auth.c covers CURVE */
                         .extra = y,
                         .admin_ms = 500};
    if (!s->c.dir[0])
        cluster_init(&s->c, &co);
    cluster_write_config(&s->c, &co);
}

static void ts_start(ts_srv_t *s, const ts_opts_t *o, const char *const *env)
{
    memset(s, 0, sizeof *s);
    s->o = *o;
    ts_write_config(s, o->extra);
    char yaml[2048];
    snprintf(yaml, sizeof yaml, "auth: {mode: plain}\n%s", o->worker_extra ? o->worker_extra : "");
    cluster_worker_opts_t w = {.model = o->model ? o->model : TS_FAST_MODEL,
                               .max_seqs = o->max_seqs ? o->max_seqs : 16,
                               .log_level = "warn",
                               .yaml = yaml};
    snprintf(s->wcfg, sizeof s->wcfg, "%s", cluster_worker_write(&s->c, "worker", &w));
    cluster_riverd_start(&s->c, env);
    for (int i = 0; i < o->external; i++) {
        char id[32];
        snprintf(id, sizeof id, "ext-%d", i);
        cluster_worker_spawn(&s->c, id, s->wcfg, NULL, NULL);
    }
    if (!o->no_wait)
        ck_assert_msg(cluster_wait_ready(&s->c, o->supervised + o->external, 15000),
                      "workers did not get ready; see %s", s->c.log);
}

static void ts_stop(ts_srv_t *s)
{
    cluster_stop(&s->c);
    test_remove_tree(test_tmpdir());
}

/* ---- Streams ---- */

typedef struct ts_job {
    const char *endpoint;
    river_generate_opts_t opts;
    streams_stream_t *stream;
    int rc;
} ts_job_t;

static void *ts_job_run(void *arg)
{
    ts_job_t *j = arg;
    river_client_t *c;
    j->rc = river_client_new(&c, j->endpoint);
    if (j->rc < 0)
        return NULL;
    j->rc = river_client_submit(c, &j->opts, NULL, streams_on_event, j->stream, NULL);
    while (j->rc >= 0 && !j->stream->ended)
        j->rc = river_client_poll(c, 1000);
    river_client_destroy(&c);
    return NULL;
}

/* n concurrent clients, each on its own connection and thread, prompts in turn. Returns
 * the wall time. */
static double ts_load(const char *endpoint, int n, streams_stream_t *streams,
                      const streams_expect_t *want, int max_tokens, int ignore_eos,
                      atomic_long *progress)
{
    ts_job_t *jobs = calloc((size_t)n, sizeof *jobs);
    pthread_t *th = calloc((size_t)n, sizeof *th);
    double t0 = clock_now_s();
    for (int i = 0; i < n; i++) {
        memset(&streams[i], 0, sizeof streams[i]);
        streams[i].want = &want[i % STREAMS_N_PROMPTS];
        streams[i].progress = progress;
        river_generate_opts_t o = RIVER_GENERATE_OPTS_INIT;
        o.prompt = streams_prompts[i % STREAMS_N_PROMPTS];
        o.max_tokens = (uint32_t)max_tokens;
        o.ignore_eos = ignore_eos;
        o.timeout_ms = 30000;
        jobs[i] = (ts_job_t){.endpoint = endpoint, .opts = o, .stream = &streams[i]};
        ck_assert_int_eq(pthread_create(&th[i], NULL, ts_job_run, &jobs[i]), 0);
    }
    for (int i = 0; i < n; i++) {
        pthread_join(th[i], NULL);
        ck_assert_msg(jobs[i].rc >= 0, "client %d: %s", i, river_err_detail());
    }
    double dt = clock_now_s() - t0;
    free(jobs);
    free(th);
    return dt;
}

static river_worker_info_t *ts_workers(const ts_srv_t *s, size_t *n)
{
    river_admin_t *a;
    ck_assert_int_eq(river_admin_new(&a, s->c.admin, 2000), 0);
    river_worker_info_t *w;
    ck_assert_msg(river_admin_workers(a, &w, n) == 0, "workers: %s", river_err_detail());
    river_admin_destroy(&a);
    return w;
}

/* Polls the first worker's free KV pages until they are `total` (2 s at most). */
static uint32_t ts_wait_kv_free(const ts_srv_t *s, uint32_t total)
{
    double until = clock_now_s() + 2;
    uint32_t free_now = 0;
    size_t nw;
    while (clock_now_s() < until) {
        river_worker_info_t *w = ts_workers(s, &nw);
        free_now = nw ? w[0].kv_pages_free : 0;
        free(w);
        if (free_now == total)
            break;
        test_sleep_ms(20);
    }
    return free_now;
}

/* ---- Tests ---- */

/* riverctl and the client library give exactly the engine's greedy tokens and text. */
START_TEST(test_greedy_matches_engine)
{
    ts_srv_t s;
    ts_start(&s, &(ts_opts_t){.model = TS_FAST_MODEL, .supervised = 1}, NULL);
    river_client_t *c;
    ck_assert_int_eq(river_client_new(&c, s.c.clients), 0);
    for (int p = 0; p < STREAMS_N_PROMPTS; p++) {
        streams_expect_t want;
        streams_expect_eos(TS_FAST_MODEL, streams_prompts[p], 80, 0, &want);
        ck_assert_uint_gt(want.n, 0);

        streams_stream_t st = {.want = &want};
        river_generate_opts_t o = RIVER_GENERATE_OPTS_INIT;
        o.prompt = streams_prompts[p];
        o.max_tokens = 80;
        o.timeout_ms = 10000;
        river_result_t res;
        ck_assert_msg(river_client_generate(c, &o, streams_on_event, &st, &res) == 0, "%s",
                      river_err_detail());
        streams_check_complete(&st, streams_prompts[p]);
        ck_assert_str_eq(st.text, want.text);

        /* riverctl generate --output json prints the same ids and text. */
        char *argv[] = {(char *)test_bin("riverctl"), "--endpoint", s.c.clients, "generate",
                        (char *)streams_prompts[p], "--max-tokens", "80", "--output", "json", NULL};
        char *out;
        ck_assert_int_eq(test_capture(argv, NULL, 0, &out), 0);
        json_error_t je;
        json_t *j = json_loads(out, 0, &je);
        ck_assert_msg(j, "riverctl output: %.300s", out);
        json_t *ids = json_object_get(j, "ids");
        ck_assert_uint_eq(json_array_size(ids), want.n);
        for (size_t i = 0; i < want.n; i++)
            ck_assert_int_eq(json_integer_value(json_array_get(ids, i)), want.ids[i]);
        ck_assert_str_eq(json_string_value(json_object_get(j, "text")), want.text);
        json_decref(j);
        free(out);
    }
    /* Text mode streams the same text, then a newline. */
    streams_expect_t want;
    streams_expect_eos(TS_FAST_MODEL, streams_prompts[0], 40, 0, &want);
    char *argv[] = {(char *)test_bin("riverctl"), "--endpoint", s.c.clients, "generate",
                    (char *)streams_prompts[0], "--max-tokens", "40", NULL};
    char *out;
    ck_assert_int_eq(test_capture(argv, NULL, 0, &out), 0);
    ck_assert_uint_eq(strlen(out), strlen(want.text) + 1);
    ck_assert_int_eq(strncmp(out, want.text, strlen(want.text)), 0);
    free(out);

    /* One long stream: tokens/s through riverd against the engine in-process. */
    streams_expect_t lw;
    streams_expect_eos(TS_FAST_MODEL, streams_prompts[0], 400, 1, &lw);
    streams_stream_t ls = {.want = &lw};
    river_generate_opts_t o = RIVER_GENERATE_OPTS_INIT;
    o.prompt = streams_prompts[0];
    o.max_tokens = 400;
    o.ignore_eos = 1;
    river_result_t res;
    double t0 = clock_now_s();
    ck_assert_int_eq(river_client_generate(c, &o, streams_on_event, &ls, &res), 0);
    double dt = clock_now_s() - t0;
    streams_check_complete(&ls, "long stream");
    printf("serving: one stream of %zu tokens: %.0f tokens/s through riverd, %.0f tokens/s "
           "decode in-process (river run)\n",
           ls.n_ids, (double)ls.n_ids / dt, lw.decode_tok_s);
    river_client_destroy(&c);

    /* The admin commands of riverctl answer. */
    const char *cmds[] = {"status", "workers", "metrics"};
    for (size_t i = 0; i < 3; i++) {
        char *av[] = {(char *)test_bin("riverctl"), "--admin", s.c.admin, (char *)cmds[i], NULL};
        ck_assert_int_eq(test_capture(av, NULL, 0, &out), 0);
        ck_assert_uint_gt(strlen(out), 10);
        free(out);
    }
    ts_stop(&s);
}
END_TEST

/* 64 concurrent streaming clients over two workers, then over one (admin Scale): all
 * complete and correct; throughput printed for both. */
START_TEST(test_concurrent_clients)
{
    enum { N = 64, TOKENS = 400 };
    streams_expect_t want[STREAMS_N_PROMPTS];
    for (int p = 0; p < STREAMS_N_PROMPTS; p++)
        streams_expect_eos(TS_FAST_MODEL, streams_prompts[p], TOKENS, 1, &want[p]);
    ts_srv_t s;
    ts_start(&s, &(ts_opts_t){.model = TS_FAST_MODEL, .supervised = 2, .max_seqs = 32}, NULL);
    streams_stream_t *streams = calloc(N, sizeof *streams);
    double two = ts_load(s.c.clients, N, streams, want, TOKENS, 1, NULL);
    long total = 0;
    for (int i = 0; i < N; i++) {
        char what[32];
        snprintf(what, sizeof what, "client %d", i);
        streams_check_complete(&streams[i], what);
        total += (long)streams[i].n_ids;
    }
    /* Both workers served. */
    size_t nw;
    river_worker_info_t *w = ts_workers(&s, &nw);
    ck_assert_uint_eq(nw, 2);
    free(w);

    river_admin_t *a;
    ck_assert_int_eq(river_admin_new(&a, s.c.admin, 2000), 0);
    uint32_t prev = 0;
    ck_assert_int_eq(river_admin_scale(a, 1, &prev), 0);
    ck_assert_uint_eq(prev, 2);
    river_admin_destroy(&a);
    ck_assert(cluster_wait_ready(&s.c, 1, 5000));
    /* The retired worker drains and leaves the table. */
    double until = clock_now_s() + 5;
    do {
        w = ts_workers(&s, &nw);
        free(w);
        if (nw == 1)
            break;
        test_sleep_ms(50);
    } while (clock_now_s() < until);
    ck_assert_uint_eq(nw, 1);

    double one = ts_load(s.c.clients, N, streams, want, TOKENS, 1, NULL);
    for (int i = 0; i < N; i++) {
        char what[32];
        snprintf(what, sizeof what, "client %d (one worker)", i);
        streams_check_complete(&streams[i], what);
    }
    printf("serving: %d concurrent streams of %d tokens: %.0f tokens/s over two workers, "
           "%.0f tokens/s over one\n",
           N, TOKENS, (double)total / two, (double)total / one);
    free(streams);
    ts_stop(&s);
}
END_TEST

/* kill -9 of a worker in the middle of streams: each stream completes on the other
 * worker from where it was (no token twice, none skipped, consecutive sequence numbers)
 * or ends with an explicit error. */
START_TEST(test_kill_worker_midstream)
{
    enum { N = 24, TOKENS = 200 };
    streams_expect_t want[STREAMS_N_PROMPTS];
    for (int p = 0; p < STREAMS_N_PROMPTS; p++)
        streams_expect_eos(TS_SLOW_MODEL, streams_prompts[p], TOKENS, 1, &want[p]);
    ts_srv_t s;
    ts_start(&s, &(ts_opts_t){.model = TS_SLOW_MODEL, .external = 2}, NULL);

    streams_stream_t *streams = calloc(N, sizeof *streams);
    ts_job_t *jobs = calloc(N, sizeof *jobs);
    pthread_t th[N];
    atomic_long progress = 0;
    for (int i = 0; i < N; i++) {
        streams[i].want = &want[i % STREAMS_N_PROMPTS];
        streams[i].progress = &progress;
        river_generate_opts_t o = RIVER_GENERATE_OPTS_INIT;
        o.prompt = streams_prompts[i % STREAMS_N_PROMPTS];
        o.max_tokens = TOKENS;
        o.ignore_eos = 1;
        o.timeout_ms = 30000;
        jobs[i] = (ts_job_t){.endpoint = s.c.clients, .opts = o, .stream = &streams[i]};
        ck_assert_int_eq(pthread_create(&th[i], NULL, ts_job_run, &jobs[i]), 0);
    }
    /* Kill once every stream is well under way. */
    double until = clock_now_s() + 20;
    while (atomic_load(&progress) < N * TOKENS / 4 && clock_now_s() < until)
        test_sleep_ms(5);
    long at_kill = atomic_load(&progress);
    ck_assert_int_lt(at_kill, N * TOKENS);
    test_kill(&s.c.wk[0].pid, SIGKILL);
    for (int i = 0; i < N; i++)
        pthread_join(th[i], NULL);
    int complete = 0;
    for (int i = 0; i < N; i++) {
        char what[32];
        snprintf(what, sizeof what, "stream %d", i);
        ck_assert_msg(jobs[i].rc >= 0, "%s: %s", what, river_err_detail());
        streams_check_prefix(&streams[i], what);
        if (streams[i].end == RIVER_EVENT_FINAL) {
            streams_check_complete(&streams[i], what);
            complete++;
        }
    }
    /* One worker stays up, so every stream can finish there. */
    ck_assert_int_eq(complete, N);
    char *out;
    char *av[] = {(char *)test_bin("riverctl"), "--admin", s.c.admin, "metrics", NULL};
    ck_assert_int_eq(test_capture(av, NULL, 0, &out), 0);
    /* At least the killed one; a worker that was only slow may have been counted too. */
    long deaths = 0, moved = 0;
    const char *p = strstr(out, "\nriver_worker_deaths_total ");
    ck_assert_ptr_nonnull(p);
    sscanf(p, "\nriver_worker_deaths_total %ld", &deaths);
    p = strstr(out, "\nriver_requests_redispatched_total ");
    ck_assert_ptr_nonnull(p);
    sscanf(p, "\nriver_requests_redispatched_total %ld", &moved);
    ck_assert_int_ge(deaths, 1);
    ck_assert_int_ge(moved, 1);
    free(out);
    printf("serving: killed a worker after %ld of %d tokens; %d of %d streams completed on "
           "the other worker (%ld re-dispatches)\n", at_kill, N * TOKENS, complete, N, moved);
    free(streams);
    free(jobs);
    ts_stop(&s);
}
END_TEST

/* Lossless workers (exit.mode lossless, cosine rule, a 4-bit river) behind riverd: lossless
 * and plain streams share their batches, one worker is killed mid-stream, and every stream
 * completes on the other with exactly the plain backbone's ids (the re-dispatch continues a
 * lossless completion from the delivered ids). riverd's metrics count the drafts. A bad
 * combination on the wire is INVALID_ARGUMENT. */
START_TEST(test_lossless_kill_worker)
{
    enum { N = 8, TOKENS = 150 };
    char river_file[512], extra[900];
    snprintf(river_file, sizeof river_file, "%s/kjv-ll.safetensors", test_tmpdir());
    char *qv[] = {(char *)test_bin("river"), "quant", "--model", TS_SLOW_MODEL, "--start", "1",
                  "--out", river_file, "--threads", "1", NULL};
    char *qout;
    ck_assert_int_eq(test_capture(qv, NULL, 0, &qout), 0);
    free(qout);
    snprintf(extra, sizeof extra, "river: \"%s\"\nexit:\n  rule: cosine\n  tau: 0.9\n"
             "  aggregation: row\n  mode: lossless\n  draft_tokens: 0\n", river_file);
    streams_expect_t want[STREAMS_N_PROMPTS];
    for (int p = 0; p < STREAMS_N_PROMPTS; p++)
        streams_expect_eos(TS_SLOW_MODEL, streams_prompts[p], TOKENS, 1, &want[p]);
    ts_srv_t s;
    ts_start(&s, &(ts_opts_t){.model = TS_SLOW_MODEL, .external = 2, .worker_extra = extra},
             NULL);
    streams_stream_t *streams = calloc(N, sizeof *streams);
    streams_job_t *jobs = calloc(N, sizeof *jobs);
    pthread_t th[N];
    atomic_long progress = 0;
    for (int i = 0; i < N; i++) {
        streams[i].want = &want[i % STREAMS_N_PROMPTS];
        streams[i].progress = &progress;
        river_generate_opts_t o = RIVER_GENERATE_OPTS_INIT;
        o.prompt = streams_prompts[i % STREAMS_N_PROMPTS];
        o.max_tokens = TOKENS;
        o.ignore_eos = 1;
        o.timeout_ms = 60000;
        if (i % 4 == 3)
            o.exit_policy = "none"; /* plain backbone rows in the same batches */
        else if (i % 4 == 1)
            o.draft_tokens = 2 + (uint32_t)i % 5;
        jobs[i] = (streams_job_t){.endpoint = s.c.clients, .opts = o, .st = &streams[i]};
        ck_assert_int_eq(pthread_create(&th[i], NULL, streams_job_run, &jobs[i]), 0);
    }
    double until = clock_now_s() + 30;
    while (atomic_load(&progress) < N * TOKENS / 4 && clock_now_s() < until)
        test_sleep_ms(5);
    long at_kill = atomic_load(&progress);
    ck_assert_int_lt(at_kill, N * TOKENS);
    test_kill(&s.c.wk[0].pid, SIGKILL);
    for (int i = 0; i < N; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < N; i++) {
        char what[32];
        snprintf(what, sizeof what, "stream %d", i);
        ck_assert_msg(jobs[i].rc >= 0, "%s: %s", what, river_err_detail());
        streams_check_complete(&streams[i], what);
    }
    char *out;
    char *av[] = {(char *)test_bin("riverctl"), "--admin", s.c.admin, "metrics", NULL};
    ck_assert_int_eq(test_capture(av, NULL, 0, &out), 0);
    long drafts = 0, drafted = 0, accepted = 0;
    const char *p = strstr(out, "\nriver_spec_decode_num_drafts_total ");
    ck_assert_ptr_nonnull(p);
    sscanf(p, "\nriver_spec_decode_num_drafts_total %ld", &drafts);
    p = strstr(out, "\nriver_spec_decode_num_draft_tokens_total ");
    ck_assert_ptr_nonnull(p);
    sscanf(p, "\nriver_spec_decode_num_draft_tokens_total %ld", &drafted);
    p = strstr(out, "\nriver_spec_decode_num_accepted_tokens_total ");
    ck_assert_ptr_nonnull(p);
    sscanf(p, "\nriver_spec_decode_num_accepted_tokens_total %ld", &accepted);
    free(out);
    ck_assert_int_gt(drafts, 0);
    ck_assert_int_ge(drafted, drafts);
    ck_assert_int_gt(accepted, 0);
    ck_assert_int_le(accepted, drafted);
    printf("serving: lossless, killed a worker after %ld of %d tokens; %d streams identical "
           "to the backbone; %ld of %ld draft tokens accepted\n", at_kill, N * TOKENS, N,
           accepted, drafted);
    /* Bad combinations on the wire. */
    river_client_t *c;
    ck_assert_int_eq(river_client_new(&c, s.c.clients), 0);
    river_generate_opts_t o = RIVER_GENERATE_OPTS_INIT;
    o.prompt = streams_prompts[0];
    o.max_tokens = 4;
    o.timeout_ms = 10000;
    o.exit_policy = "none";
    o.lossless = 1;
    river_result_t res;
    ck_assert_int_lt(river_client_generate(c, &o, NULL, NULL, &res), 0);
    ck_assert_int_eq(res.code, RIVER_CODE_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(res.message, "lossless"));
    o.exit_policy = NULL;
    o.draft_tokens = 17;
    ck_assert_int_lt(river_client_generate(c, &o, NULL, NULL, &res), 0);
    ck_assert_int_eq(res.code, RIVER_CODE_INVALID_ARGUMENT);
    /* A good one reports its drafts in the result. */
    o.draft_tokens = 0;
    o.max_tokens = 40;
    o.ignore_eos = 1;
    ck_assert_int_eq(river_client_generate(c, &o, NULL, NULL, &res), 0);
    ck_assert_uint_gt(res.drafted_tokens, 0);
    ck_assert_uint_le(res.accepted_tokens, res.drafted_tokens);
    river_client_destroy(&c);
    free(streams);
    free(jobs);
    ts_stop(&s);
    remove(river_file);
}
END_TEST

/* The only worker dies mid-stream: the stream ends with an explicit UNAVAILABLE, and
 * new requests get UNAVAILABLE too (no silence). */
START_TEST(test_no_worker_unavailable)
{
    streams_expect_t want;
    streams_expect_eos(TS_SLOW_MODEL, streams_prompts[0], 240, 1, &want);
    ts_srv_t s;
    ts_start(&s, &(ts_opts_t){.model = TS_SLOW_MODEL, .external = 1, .liveness = 2}, NULL);
    river_client_t *c;
    ck_assert_int_eq(river_client_new(&c, s.c.clients), 0);
    streams_stream_t st = {.want = &want};
    river_generate_opts_t o = RIVER_GENERATE_OPTS_INIT;
    o.prompt = streams_prompts[0];
    o.max_tokens = 240;
    o.ignore_eos = 1;
    o.timeout_ms = 10000;
    ck_assert_int_eq(river_client_submit(c, &o, NULL, streams_on_event, &st, NULL), 0);
    while (st.n_ids < 20 && !st.ended)
        ck_assert_int_ge(river_client_poll(c, 1000), 0);
    test_kill(&s.c.wk[0].pid, SIGKILL);
    while (!st.ended)
        ck_assert_int_ge(river_client_poll(c, 1000), 0);
    streams_check_prefix(&st, "orphaned stream");
    ck_assert_int_eq(st.end, RIVER_EVENT_ERROR);
    ck_assert_int_eq(st.code, RIVER_CODE_UNAVAILABLE);

    streams_stream_t st2 = {.want = &want};
    river_result_t res;
    ck_assert_int_eq(river_client_generate(c, &o, streams_on_event, &st2, &res), RIVER_EPROTO);
    ck_assert_int_eq(res.code, RIVER_CODE_UNAVAILABLE);
    river_client_destroy(&c);
    ts_stop(&s);
}
END_TEST

/* Cancel ends the stream with Final(cancelled) and the worker's free KV pages, as its
 * heartbeat reports them through admin Workers, return to the total. */
START_TEST(test_cancel_frees_kv)
{
    streams_expect_t want;
    streams_expect_eos(TS_SLOW_MODEL, streams_prompts[2], 240, 1, &want);
    ts_srv_t s;
    ts_start(&s, &(ts_opts_t){.model = TS_SLOW_MODEL, .external = 1}, NULL);
    size_t nw;
    river_worker_info_t *w = ts_workers(&s, &nw);
    ck_assert_uint_eq(nw, 1);
    uint32_t total = w[0].kv_pages_total;
    ck_assert_uint_gt(total, 0);
    ck_assert_uint_eq(w[0].kv_pages_free, total);
    free(w);

    river_client_t *c;
    ck_assert_int_eq(river_client_new(&c, s.c.clients), 0);
    streams_stream_t st = {.want = &want};
    river_generate_opts_t o = RIVER_GENERATE_OPTS_INIT;
    o.prompt = streams_prompts[2];
    o.max_tokens = 240;
    o.ignore_eos = 1;
    o.timeout_ms = 10000;
    char id[RIVER_CLIENT_ID_MAX];
    ck_assert_int_eq(river_client_submit(c, &o, NULL, streams_on_event, &st, id), 0);
    while (st.n_ids < 10 && !st.ended)
        ck_assert_int_ge(river_client_poll(c, 1000), 0);
    /* While it runs its pages are taken, which a heartbeat (every 200 ms) reports; wait
     * for one, but cancel before the end in any case (a fast machine may be quicker than
     * the heartbeat), so seeing the pages in use is printed, not required. */
    uint32_t seen_free = total;
    while (seen_free == total && st.n_ids < 180 && !st.ended) {
        w = ts_workers(&s, &nw);
        seen_free = w[0].kv_pages_free;
        free(w);
        river_client_poll(c, 10);
    }
    ck_assert_int_eq(river_client_cancel(c, id), 0);
    while (!st.ended)
        ck_assert_int_ge(river_client_poll(c, 1000), 0);
    streams_check_prefix(&st, "cancelled stream");
    ck_assert_int_eq(st.end, RIVER_EVENT_FINAL);
    ck_assert_int_eq(st.finish, RIVER_FINISH_CANCELLED);
    ck_assert_uint_lt(st.n_ids, want.n);
    ck_assert_uint_eq(st.completion, st.n_ids);
    river_client_destroy(&c);

    ck_assert_uint_eq(ts_wait_kv_free(&s, total), total);
    printf("serving: cancel after %zu tokens: %u of %u KV pages free while running, all free "
           "after\n", st.n_ids, seen_free, total);

    /* A client that goes away: riverd cannot deliver, cancels on the worker, and the pages
     * come back as well. */
    ck_assert_int_eq(river_client_new(&c, s.c.clients), 0);
    streams_stream_t gone = {.want = &want};
    ck_assert_int_eq(river_client_submit(c, &o, NULL, streams_on_event, &gone, id), 0);
    while (gone.n_ids < 5 && !gone.ended)
        ck_assert_int_ge(river_client_poll(c, 1000), 0);
    river_client_destroy(&c);
    ck_assert_uint_eq(ts_wait_kv_free(&s, total), total);
    river_admin_t *a;
    ck_assert_int_eq(river_admin_new(&a, s.c.admin, 2000), 0);
    river_status_t rs;
    double until = clock_now_s() + 2;
    do {
        ck_assert_int_eq(river_admin_status(a, &rs), 0);
        if (rs.running == 0)
            break;
        test_sleep_ms(20);
    } while (clock_now_s() < until);
    ck_assert_uint_eq(rs.running, 0);
    river_admin_destroy(&a);
    ts_stop(&s);
}
END_TEST

/* A deadline that passes mid-stream ends the request with DEADLINE_EXCEEDED. */
START_TEST(test_deadline)
{
    streams_expect_t want;
    streams_expect_eos(TS_SLOW_MODEL, streams_prompts[1], 240, 1, &want);
    ts_srv_t s;
    ts_start(&s, &(ts_opts_t){.model = TS_SLOW_MODEL, .external = 1}, NULL);
    river_client_t *c;
    ck_assert_int_eq(river_client_new(&c, s.c.clients), 0);
    streams_stream_t st = {.want = &want};
    river_generate_opts_t o = RIVER_GENERATE_OPTS_INIT;
    o.prompt = streams_prompts[1];
    o.max_tokens = 240;
    o.ignore_eos = 1;
    o.deadline_ms = 40;
    o.timeout_ms = 10000;
    river_result_t res;
    double t0 = clock_now_s();
    ck_assert_int_eq(river_client_generate(c, &o, streams_on_event, &st, &res), RIVER_EPROTO);
    double dt = clock_now_s() - t0;
    ck_assert_int_eq(res.code, RIVER_CODE_DEADLINE_EXCEEDED);
    streams_check_prefix(&st, "deadline stream");
    ck_assert_uint_lt(st.n_ids, want.n);
    ck_assert_msg(dt < 2.0, "deadline took %.3f s", dt);

    /* riverd is fine afterwards. */
    o.deadline_ms = 0;
    o.max_tokens = 8;
    ck_assert_int_eq(river_client_generate(c, &o, NULL, NULL, &res), 0);
    river_client_destroy(&c);
    ts_stop(&s);
}
END_TEST

/* SIGTERM drains: the running stream completes, new requests get UNAVAILABLE, riverd
 * exits 0 once nothing is left. */
START_TEST(test_shutdown_drains)
{
    streams_expect_t want;
    streams_expect_eos(TS_SLOW_MODEL, streams_prompts[3], 200, 1, &want);
    ts_srv_t s;
    ts_start(&s, &(ts_opts_t){.model = TS_SLOW_MODEL, .external = 1}, NULL);
    river_client_t *c;
    ck_assert_int_eq(river_client_new(&c, s.c.clients), 0);
    streams_stream_t st = {.want = &want};
    river_generate_opts_t o = RIVER_GENERATE_OPTS_INIT;
    o.prompt = streams_prompts[3];
    o.max_tokens = 200;
    o.ignore_eos = 1;
    o.timeout_ms = 10000;
    ck_assert_int_eq(river_client_submit(c, &o, NULL, streams_on_event, &st, NULL), 0);
    while (st.n_ids < 5 && !st.ended)
        ck_assert_int_ge(river_client_poll(c, 1000), 0);
    ck_assert_int_eq(kill(s.c.pid, SIGTERM), 0);
    test_sleep_ms(20);
    streams_stream_t late = {.want = &want};
    o.max_tokens = 5;
    ck_assert_int_eq(river_client_submit(c, &o, NULL, streams_on_event, &late, NULL), 0);
    while (river_client_in_flight(c) > 0)
        ck_assert_int_ge(river_client_poll(c, 1000), 0);
    streams_check_complete(&st, "stream during the drain");
    ck_assert_int_eq(late.end, RIVER_EVENT_ERROR);
    ck_assert_int_eq(late.code, RIVER_CODE_UNAVAILABLE);
    river_client_destroy(&c);
    int status = -1;
    ck_assert_msg(test_wait_exit(s.c.pid, 5000, &status), "riverd did not exit after the drain");
    ck_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    s.c.pid = 0;
    /* The worker was told to drain and left too. */
    ck_assert(test_wait_exit(s.c.wk[0].pid, 5000, &status));
    s.c.wk[0].pid = 0;
    ts_stop(&s);
}
END_TEST

/* Per-request limits name the limit; a full queue is RESOURCE_EXHAUSTED. */
START_TEST(test_limits_and_queue)
{
    ts_srv_t s;
    ts_start(&s,
             &(ts_opts_t){.model = TS_SLOW_MODEL,
                          .external = 1,
                          .max_seqs = 1,
                          .extra = "queue_length: 2\n"
                                   "limits:\n"
                                   "  max_prompt_tokens: 16\n"
                                   "  max_tokens: 200\n"
                                   "  max_stop_strings: 2\n"
                                   "  max_prompt_bytes: 64\n"
                                   "  max_stop_length: 8\n"},
             NULL);
    river_client_t *c;
    ck_assert_int_eq(river_client_new(&c, s.c.clients), 0);
    river_result_t res;
    static const int32_t ids[17] = {1, 80, 147, 201, 282, 57, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
    const char *stop3[] = {"a", "b", "c"};
    const char *stoplong[] = {"123456789"};
    struct {
        river_generate_opts_t o;
        const char *limit;
    } cases[5];
    for (int i = 0; i < 5; i++) {
        cases[i].o = (river_generate_opts_t)RIVER_GENERATE_OPTS_INIT;
        cases[i].o.prompt = "Once upon a time";
        cases[i].o.max_tokens = 8;
        cases[i].o.timeout_ms = 5000;
    }
    cases[0].o.prompt = "0123456789012345678901234567890123456789012345678901234567890123456789";
    cases[0].limit = "limits.max_prompt_bytes";
    cases[1].o.prompt = NULL;
    cases[1].o.prompt_ids = ids;
    cases[1].o.n_prompt_ids = 17;
    cases[1].limit = "limits.max_prompt_tokens";
    cases[2].o.max_tokens = 201;
    cases[2].limit = "limits.max_tokens";
    cases[3].o.stop = stop3;
    cases[3].o.n_stop = 3;
    cases[3].limit = "limits.max_stop_strings";
    cases[4].o.stop = stoplong;
    cases[4].o.n_stop = 1;
    cases[4].limit = "limits.max_stop_length";
    for (int i = 0; i < 5; i++) {
        ck_assert_int_eq(river_client_generate(c, &cases[i].o, NULL, NULL, &res), RIVER_EPROTO);
        ck_assert_int_eq(res.code, RIVER_CODE_INVALID_ARGUMENT);
        ck_assert_msg(strstr(res.message, cases[i].limit), "'%s' does not name %s",
                      res.message, cases[i].limit);
    }
    /* Within the limits it works, token ids too. */
    river_generate_opts_t ok = RIVER_GENERATE_OPTS_INIT;
    ok.prompt_ids = ids;
    ok.n_prompt_ids = 6;
    ok.max_tokens = 8;
    ok.timeout_ms = 5000;
    ck_assert_int_eq(river_client_generate(c, &ok, NULL, NULL, &res), 0);

    /* One sequence runs, two wait, the fourth is refused. */
    streams_stream_t st[4];
    char idv[4][RIVER_CLIENT_ID_MAX];
    memset(st, 0, sizeof st);
    river_generate_opts_t o = RIVER_GENERATE_OPTS_INIT;
    o.prompt = streams_prompts[0];
    o.max_tokens = 200;
    o.ignore_eos = 1;
    o.timeout_ms = 10000;
    for (int i = 0; i < 4; i++)
        ck_assert_int_eq(river_client_submit(c, &o, NULL, streams_on_event, &st[i], idv[i]), 0);
    double until = clock_now_s() + 10;
    int exhausted = -1;
    while (exhausted < 0 && clock_now_s() < until) {
        river_client_poll(c, 100);
        for (int i = 0; i < 4; i++)
            if (st[i].ended && st[i].end == RIVER_EVENT_ERROR) {
                ck_assert_int_eq(st[i].code, RIVER_CODE_RESOURCE_EXHAUSTED);
                ck_assert_ptr_nonnull(strstr(st[i].msg, "queue_length"));
                exhausted = i;
            }
    }
    ck_assert_int_eq(exhausted, 3);
    for (int i = 0; i < 3; i++)
        river_client_cancel(c, idv[i]);
    while (river_client_in_flight(c) > 0)
        ck_assert_int_ge(river_client_poll(c, 1000), 0);
    for (int i = 0; i < 3; i++) {
        ck_assert_int_eq(st[i].end, RIVER_EVENT_FINAL);
        ck_assert(!st[i].bad_seq);
    }
    river_client_destroy(&c);
    ts_stop(&s);
}
END_TEST

/* Garbage, oversize, unknown-kind and wrongly shaped frames get Error replies; riverd
 * stays up and serves the next request. */
START_TEST(test_bad_frames)
{
    ts_srv_t s;
    ts_start(&s,
             &(ts_opts_t){.model = TS_FAST_MODEL,
                          .supervised = 1,
                          .extra = "limits:\n  max_frame_bytes: 4096\n"},
             NULL);
    void *ctx = zmq_ctx_new();
    void *d = zmq_socket(ctx, ZMQ_DEALER);
    int linger = 0;
    zmq_setsockopt(d, ZMQ_LINGER, &linger, sizeof linger);
    ck_assert_int_eq(zmq_connect(d, s.c.clients), 0);
    int timeout = 3000;
    zmq_setsockopt(d, ZMQ_RCVTIMEO, &timeout, sizeof timeout);

    static uint8_t big[10000];
    memset(big, 'x', sizeof big);
    /* ClientRequest with field 15 (unknown) and no kind; a string that is not UTF-8. */
    static const uint8_t unknown[] = {0x7a, 0x00};
    static const uint8_t bad_utf8[] = {0x0a, 0x06, 0x0a, 0x01, 'r', 0x1a, 0x01, 0xff};
    static const uint8_t garbage[] = {0xff, 0xff, 0xff, 0xff, 0x0f};
    struct {
        const void *data;
        size_t len;
        const char *expect;
    } bad[] = {
        {garbage, sizeof garbage, ""},
        {big, sizeof big, "over the limit of 4096 bytes (limits.max_frame_bytes)"},
        {unknown, sizeof unknown, ""},
        {"", 0, ""},
        {bad_utf8, sizeof bad_utf8, "UTF-8"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ck_assert_int_eq(zmq_send(d, bad[i].data, bad[i].len, 0), (int)bad[i].len);
        zmq_msg_t m;
        zmq_msg_init(&m);
        ck_assert_msg(zmq_msg_recv(&m, d, 0) >= 0, "no reply to bad frame %zu", i);
        ProtobufCMessage *r = NULL;
        ck_assert_int_eq(frame_decode_msg(FRAME_CLIENT_REPLY, &m, 0, &r), 0);
        zmq_msg_close(&m);
        River__Client__ClientReply *rep = (River__Client__ClientReply *)r;
        ck_assert_int_eq(rep->kind_case, RIVER__CLIENT__CLIENT_REPLY__KIND_ERROR);
        ck_assert_int_eq(rep->error->code, RIVER__CLIENT__ERROR__CODE__INVALID_ARGUMENT);
        ck_assert_msg(strstr(rep->error->message, bad[i].expect), "frame %zu: '%s'", i,
                      rep->error->message);
        frame_free(&r);
    }
    /* Two payload frames in one message. */
    zmq_send(d, "a", 1, ZMQ_SNDMORE);
    zmq_send(d, "b", 1, ZMQ_SNDMORE);
    zmq_send(d, "c", 1, 0);
    zmq_msg_t m;
    zmq_msg_init(&m);
    ck_assert_int_ge(zmq_msg_recv(&m, d, 0), 0);
    ProtobufCMessage *r = NULL;
    ck_assert_int_eq(frame_decode_msg(FRAME_CLIENT_REPLY, &m, 0, &r), 0);
    ck_assert_int_eq(((River__Client__ClientReply *)r)->kind_case,
                     RIVER__CLIENT__CLIENT_REPLY__KIND_ERROR);
    frame_free(&r);
    zmq_msg_close(&m);
    zmq_close(d);

    /* Garbage on the admin and worker endpoints. */
    void *a = zmq_socket(ctx, ZMQ_DEALER);
    zmq_setsockopt(a, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(a, ZMQ_RCVTIMEO, &timeout, sizeof timeout);
    ck_assert_int_eq(zmq_connect(a, s.c.admin), 0);
    zmq_send(a, garbage, sizeof garbage, 0);
    zmq_msg_init(&m);
    ck_assert_int_ge(zmq_msg_recv(&m, a, 0), 0);
    ck_assert_int_eq(frame_decode_msg(FRAME_ADMIN_REPLY, &m, 0, &r), 0);
    ck_assert_int_eq(((River__Admin__AdminReply *)r)->kind_case,
                     RIVER__ADMIN__ADMIN_REPLY__KIND_ERROR);
    frame_free(&r);
    zmq_msg_close(&m);
    zmq_close(a);
    void *wk = zmq_socket(ctx, ZMQ_DEALER);
    zmq_setsockopt(wk, ZMQ_LINGER, &linger, sizeof linger);
    ck_assert_int_eq(zmq_connect(wk, s.c.workers), 0);
    zmq_send(wk, garbage, sizeof garbage, 0);
    zmq_send(wk, big, sizeof big, 0);
    zmq_send(wk, unknown, sizeof unknown, 0);
    /* A Heartbeat from a worker riverd does not know: it is told to Reconnect. */
    River__Worker__Heartbeat hb = RIVER__WORKER__HEARTBEAT__INIT;
    River__Worker__WorkerMessage wm = RIVER__WORKER__WORKER_MESSAGE__INIT;
    wm.kind_case = RIVER__WORKER__WORKER_MESSAGE__KIND_HEARTBEAT;
    wm.heartbeat = &hb;
    uint8_t *buf;
    size_t len;
    ck_assert_int_eq(frame_encode_buf(&wm.base, &buf, &len), 0);
    zmq_send(wk, buf, len, 0);
    free(buf);
    zmq_setsockopt(wk, ZMQ_RCVTIMEO, &timeout, sizeof timeout);
    zmq_msg_init(&m);
    ck_assert_int_ge(zmq_msg_recv(&m, wk, 0), 0);
    ck_assert_int_eq(frame_decode_msg(FRAME_DAEMON_MESSAGE, &m, 0, &r), 0);
    ck_assert_int_eq(((River__Worker__DaemonMessage *)r)->kind_case,
                     RIVER__WORKER__DAEMON_MESSAGE__KIND_RECONNECT);
    frame_free(&r);
    zmq_msg_close(&m);
    zmq_close(wk);
    zmq_ctx_term(ctx);

    /* The client library gets the error of an oversize prompt as its request's. */
    river_client_t *c;
    ck_assert_int_eq(river_client_new(&c, s.c.clients), 0);
    river_generate_opts_t o = RIVER_GENERATE_OPTS_INIT;
    char *prompt = malloc(8000);
    memset(prompt, 'a', 7999);
    prompt[7999] = '\0';
    o.prompt = prompt;
    o.timeout_ms = 5000;
    river_result_t res;
    ck_assert_int_eq(river_client_generate(c, &o, NULL, NULL, &res), RIVER_EPROTO);
    ck_assert_int_eq(res.code, RIVER_CODE_INVALID_ARGUMENT);
    free(prompt);

    /* Still up: a request completes and the daemon answers status. */
    streams_expect_t want;
    streams_expect_eos(TS_FAST_MODEL, streams_prompts[3], 30, 0, &want);
    streams_stream_t st = {.want = &want};
    o.prompt = streams_prompts[3];
    o.max_tokens = 30;
    ck_assert_int_eq(river_client_generate(c, &o, streams_on_event, &st, &res), 0);
    streams_check_complete(&st, "after bad frames");
    river_client_destroy(&c);
    ck_assert_int_eq(cluster_ready_workers(&s.c), 1);
    ck_assert_int_eq(waitpid(s.c.pid, NULL, WNOHANG), 0);
    ts_stop(&s);
}
END_TEST

/* A bad configuration stops riverd at start with file:line:column and the key. */
START_TEST(test_bad_config)
{
    char path[400];
    snprintf(path, sizeof path, "%s/bad.yaml", test_tmpdir());
    struct {
        const char *yaml;
        const char *expect;
    } cases[] = {
        {"queue_length: 10\nlimits:\n  max_tokens: lots\n", ":3:15: key 'limits.max_tokens'"},
        {"endpoints:\n  clients: [\"ipc:///tmp/x\"\n", ":"},
        {"queue_lenght: 10\n", ":1:1: key 'queue_lenght'"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        test_write(path, cases[i].yaml);
        char *argv[] = {(char *)test_bin("riverd"), "--config", path, NULL};
        char *out;
        int rc = test_capture(argv, NULL, 1, &out);
        ck_assert_int_eq(rc, 78); /* EX_CONFIG */
        char want[512];
        snprintf(want, sizeof want, "%s%s", path, cases[i].expect);
        ck_assert_msg(strstr(out, want), "case %zu: '%s' lacks '%s'", i, out, want);
        /* file:line:col, with numbers. */
        const char *p = strstr(out, path) + strlen(path);
        int line = 0, col = 0;
        ck_assert_msg(sscanf(p, ":%d:%d:", &line, &col) == 2 && line > 0 && col > 0, "'%s'",
                      out);
        free(out);
    }
    test_remove_tree(test_tmpdir());
}
END_TEST

/* Drain a worker: its requests finish, it takes nothing new, it exits and leaves the
 * table; the other worker serves on. */
START_TEST(test_drain_worker)
{
    enum { N = 8, TOKENS = 150 };
    streams_expect_t want[STREAMS_N_PROMPTS];
    for (int p = 0; p < STREAMS_N_PROMPTS; p++)
        streams_expect_eos(TS_SLOW_MODEL, streams_prompts[p], TOKENS, 1, &want[p]);
    ts_srv_t s;
    ts_start(&s, &(ts_opts_t){.model = TS_SLOW_MODEL, .external = 2}, NULL);
    streams_stream_t *streams = calloc(N, sizeof *streams);
    ts_job_t jobs[N];
    pthread_t th[N];
    atomic_long progress = 0;
    for (int i = 0; i < N; i++) {
        streams[i].want = &want[i % STREAMS_N_PROMPTS];
        streams[i].progress = &progress;
        river_generate_opts_t o = RIVER_GENERATE_OPTS_INIT;
        o.prompt = streams_prompts[i % STREAMS_N_PROMPTS];
        o.max_tokens = TOKENS;
        o.ignore_eos = 1;
        o.timeout_ms = 30000;
        jobs[i] = (ts_job_t){.endpoint = s.c.clients, .opts = o, .stream = &streams[i]};
        ck_assert_int_eq(pthread_create(&th[i], NULL, ts_job_run, &jobs[i]), 0);
    }
    double until = clock_now_s() + 10;
    while (atomic_load(&progress) < N * 10 && clock_now_s() < until)
        test_sleep_ms(5);
    char *out;
    char *av[] = {(char *)test_bin("riverctl"), "--admin", s.c.admin, "drain", "ext-0", NULL};
    ck_assert_int_eq(test_capture(av, NULL, 1, &out), 0);
    free(out);
    for (int i = 0; i < N; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < N; i++) {
        char what[32];
        snprintf(what, sizeof what, "stream %d", i);
        streams_check_complete(&streams[i], what);
    }
    /* The drained worker exits by itself, cleanly. */
    int st = -1;
    ck_assert_msg(test_wait_exit(s.c.wk[0].pid, 5000, &st), "drained worker did not exit");
    ck_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    s.c.wk[0].pid = 0;
    /* ...and leaves the table; new work goes to the other. */
    size_t nw = 0;
    until = clock_now_s() + 3;
    do {
        free(ts_workers(&s, &nw));
        if (nw == 1)
            break;
        test_sleep_ms(50);
    } while (clock_now_s() < until);
    ck_assert_uint_eq(nw, 1);
    river_worker_info_t *w = ts_workers(&s, &nw);
    ck_assert_str_eq(w[0].id, "ext-1");
    ck_assert_str_eq(w[0].state, "ready");
    free(w);
    double t = ts_load(s.c.clients, 4, streams, want, 20, 1, NULL);
    (void)t;
    streams_expect_t short_want[STREAMS_N_PROMPTS];
    for (int p = 0; p < STREAMS_N_PROMPTS; p++)
        streams_expect_eos(TS_SLOW_MODEL, streams_prompts[p], 20, 1, &short_want[p]);
    for (int i = 0; i < 4; i++) {
        streams[i].want = &short_want[i % STREAMS_N_PROMPTS];
        streams_check_complete(&streams[i], "after drain");
    }
    free(streams);
    ts_stop(&s);
}
END_TEST

/* Requests of one session go to one worker. */
START_TEST(test_session_affinity)
{
    ts_srv_t s;
    ts_start(&s, &(ts_opts_t){.model = TS_FAST_MODEL, .external = 2}, NULL);
    river_client_t *c;
    ck_assert_int_eq(river_client_new(&c, s.c.clients), 0);
    river_generate_opts_t o = RIVER_GENERATE_OPTS_INIT;
    o.max_tokens = 10;
    o.ignore_eos = 1;
    o.session_id = "session-a";
    o.timeout_ms = 5000;
    river_result_t res;
    for (int i = 0; i < 6; i++) {
        o.prompt = streams_prompts[i % STREAMS_N_PROMPTS];
        ck_assert_int_eq(river_client_generate(c, &o, NULL, NULL, &res), 0);
    }
    river_client_destroy(&c);
    river_admin_t *a;
    ck_assert_int_eq(river_admin_new(&a, s.c.admin, 2000), 0);
    char *text;
    ck_assert_int_eq(river_admin_metrics(a, &text), 0);
    river_admin_destroy(&a);
    long t0 = -1, t1 = -1;
    const char *p0 = strstr(text, "river_worker_tokens_total{worker=\"ext-0\"} ");
    const char *p1 = strstr(text, "river_worker_tokens_total{worker=\"ext-1\"} ");
    ck_assert(p0 && p1);
    sscanf(strchr(p0, '}') + 1, "%ld", &t0);
    sscanf(strchr(p1, '}') + 1, "%ld", &t1);
    ck_assert_msg((t0 == 60 && t1 == 0) || (t0 == 0 && t1 == 60), "tokens %ld and %ld", t0,
                  t1);
    free(text);
    ts_stop(&s);
}
END_TEST

/* The children of pid, from /proc (their stat's ppid field); up to max. */
static int ts_children(pid_t pid, pid_t *out, int max)
{
    DIR *d = opendir("/proc");
    ck_assert_ptr_nonnull(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < max) {
        char *end;
        long p = strtol(e->d_name, &end, 10);
        if (*end || p <= 0)
            continue;
        char path[64], buf[512];
        snprintf(path, sizeof path, "/proc/%ld/stat", p);
        FILE *f = fopen(path, "r");
        if (!f)
            continue;
        size_t len = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[len] = '\0';
        /* pid (comm) state ppid: comm may hold spaces, so read after the last ')'. */
        char *rp = strrchr(buf, ')');
        char state;
        int ppid;
        if (rp && sscanf(rp + 1, " %c %d", &state, &ppid) == 2 && ppid == pid && state != 'Z')
            out[n++] = (pid_t)p;
    }
    closedir(d);
    return n;
}

/* A supervised worker that is killed is restarted; Scale changes the count. */
START_TEST(test_supervision)
{
    ts_srv_t s;
    ts_start(&s, &(ts_opts_t){.model = TS_FAST_MODEL, .supervised = 2}, NULL);
    pid_t kids[8];
    ck_assert_int_eq(ts_children(s.c.pid, kids, 8), 2);
    pid_t victim = kids[0];
    ck_assert_int_eq(kill(victim, SIGKILL), 0);
    /* Its death is seen at once (SIGCHLD), and a new process takes its slot. */
    double until = clock_now_s() + 5;
    int back = 0;
    while (!back && clock_now_s() < until) {
        test_sleep_ms(50);
        int n = ts_children(s.c.pid, kids, 8);
        back = n == 2 && kids[0] != victim && kids[1] != victim && cluster_ready_workers(&s.c) == 2;
    }
    ck_assert_msg(back, "killed worker not restarted");
    river_client_t *c;
    ck_assert_int_eq(river_client_new(&c, s.c.clients), 0);
    river_generate_opts_t o = RIVER_GENERATE_OPTS_INIT;
    o.prompt = streams_prompts[0];
    o.max_tokens = 10;
    o.timeout_ms = 5000;
    river_result_t res;
    ck_assert_int_eq(river_client_generate(c, &o, NULL, NULL, &res), 0);
    river_client_destroy(&c);

    char *out;
    char *up[] = {(char *)test_bin("riverctl"), "--admin", s.c.admin, "scale", "3", NULL};
    ck_assert_int_eq(test_capture(up, NULL, 1, &out), 0);
    free(out);
    ck_assert(cluster_wait_ready(&s.c, 3, 5000));
    ck_assert_int_eq(ts_children(s.c.pid, kids, 8), 3);
    char *down[] = {(char *)test_bin("riverctl"), "--admin", s.c.admin, "scale", "1", NULL};
    ck_assert_int_eq(test_capture(down, NULL, 1, &out), 0);
    free(out);
    ck_assert(cluster_wait_ready(&s.c, 1, 5000));
    until = clock_now_s() + 5;
    int n_kids = -1;
    while (clock_now_s() < until && (n_kids = ts_children(s.c.pid, kids, 8)) != 1)
        test_sleep_ms(50);
    ck_assert_int_eq(n_kids, 1);
    ts_stop(&s);
}
END_TEST

/* SIGHUP and admin Reload apply what changes live and list what needs a restart; a bad
 * file changes nothing and says where it is wrong. */
START_TEST(test_reload)
{
    ts_srv_t s;
    ts_start(&s, &(ts_opts_t){.supervised = 0, .no_wait = 1, .extra = "queue_length: 5\n"},
             NULL);
    ck_assert(cluster_wait_ready(&s.c, 0, 5000));
    river_admin_t *a;
    ck_assert_int_eq(river_admin_new(&a, s.c.admin, 2000), 0);
    river_status_t st;
    ck_assert_int_eq(river_admin_status(a, &st), 0);
    ck_assert_uint_eq(st.queue_capacity, 5);

    /* A new queue length and log level, and a metrics port (needs a restart). */
    s.o.metrics_port = 1;
    ts_write_config(&s, "queue_length: 7\nlog_level: debug\n");
    char *applied, *restart;
    ck_assert_int_eq(river_admin_reload(a, &applied, &restart), 0);
    ck_assert_msg(strstr(applied, "queue_length") && strstr(applied, "log_level"), "%s",
                  applied);
    ck_assert_msg(strstr(restart, "endpoints.metrics_port"), "%s", restart);
    ck_assert_ptr_null(strstr(applied, "endpoints"));
    free(applied);
    free(restart);
    ck_assert_int_eq(river_admin_status(a, &st), 0);
    ck_assert_uint_eq(st.queue_capacity, 7);

    /* SIGHUP does the same. */
    ts_write_config(&s, "queue_length: 9\n");
    ck_assert_int_eq(kill(s.c.pid, SIGHUP), 0);
    double until = clock_now_s() + 3;
    do {
        test_sleep_ms(20);
        ck_assert_int_eq(river_admin_status(a, &st), 0);
    } while (st.queue_capacity != 9 && clock_now_s() < until);
    ck_assert_uint_eq(st.queue_capacity, 9);

    /* A broken file: an error with the place, and the old values stay. */
    ts_write_config(&s, "queue_length: [\n");
    ck_assert_int_ne(river_admin_reload(a, &applied, &restart), 0);
    ck_assert_msg(strstr(river_err_detail(), "riverd.yaml:"), "%s", river_err_detail());
    ck_assert_int_eq(river_admin_status(a, &st), 0);
    ck_assert_uint_eq(st.queue_capacity, 9);
    river_admin_destroy(&a);
    s.o.metrics_port = 0;
    ts_write_config(&s, NULL);
    ts_stop(&s);
}
END_TEST

/* systemd Type=notify: READY=1 once listening, STATUS= lines, WATCHDOG=1 from the loop. */
START_TEST(test_systemd_notify)
{
    char sock_path[100];
    snprintf(sock_path, sizeof sock_path, "%.80s/notify.sock", test_tmpdir());
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    ck_assert_int_ge(fd, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", sock_path);
    unlink(sock_path);
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    struct timeval tv = {0, 100000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    static char env_sock[400];
    snprintf(env_sock, sizeof env_sock, "NOTIFY_SOCKET=%s", sock_path);
    const char *env[] = {env_sock, "WATCHDOG_USEC=200000", NULL};
    ts_srv_t s;
    ts_start(&s, &(ts_opts_t){.model = TS_FAST_MODEL, .supervised = 1}, env);
    int ready = 0, status = 0, watchdog = 0;
    double until = clock_now_s() + 3;
    while (clock_now_s() < until && !(ready && status && watchdog >= 3)) {
        char buf[1024];
        ssize_t n = recv(fd, buf, sizeof buf - 1, 0);
        if (n <= 0)
            continue;
        buf[n] = '\0';
        ready |= strstr(buf, "READY=1") != NULL;
        status |= strstr(buf, "STATUS=") != NULL && strstr(buf, "workers ready") != NULL;
        watchdog += strstr(buf, "WATCHDOG=1") != NULL;
    }
    close(fd);
    ck_assert(ready);
    ck_assert(status);
    ck_assert_int_ge(watchdog, 3);
    ts_stop(&s);
}
END_TEST

/* Prometheus text over HTTP on 127.0.0.1, and /health, /ready. */
static int ts_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    socklen_t l = sizeof sa;
    getsockname(fd, (struct sockaddr *)&sa, &l);
    close(fd);
    return ntohs(sa.sin_port);
}

static char *ts_http_get(int port, const char *path, int *code)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    char req[256];
    int n = snprintf(req, sizeof req, "GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n", path);
    ck_assert_int_eq(write(fd, req, (size_t)n), n);
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    ssize_t r;
    while ((r = read(fd, buf + len, cap - len - 1)) > 0) {
        len += (size_t)r;
        if (cap - len < 4096)
            buf = realloc(buf, cap *= 2);
    }
    buf[len] = '\0';
    close(fd);
    *code = 0;
    sscanf(buf, "HTTP/1.%*d %d", code);
    return buf;
}

START_TEST(test_metrics_http)
{
    ts_srv_t s;
    int port = ts_free_port();
    ts_start(&s, &(ts_opts_t){.model = TS_FAST_MODEL, .supervised = 1, .metrics_port = port},
             NULL);
    river_client_t *c;
    ck_assert_int_eq(river_client_new(&c, s.c.clients), 0);
    river_generate_opts_t o = RIVER_GENERATE_OPTS_INIT;
    o.prompt = streams_prompts[0];
    o.max_tokens = 12;
    o.ignore_eos = 1;
    o.timeout_ms = 5000;
    river_result_t res;
    ck_assert_int_eq(river_client_generate(c, &o, NULL, NULL, &res), 0);
    river_client_destroy(&c);
    int code;
    char *body = ts_http_get(port, "/metrics", &code);
    ck_assert_int_eq(code, 200);
    const char *want[] = {
        "river_requests_total{outcome=\"length\"} 1", "river_queue_length 0",
        "river_workers{state=\"ready\"} 1",           "river_kv_pages_free ",
        "river_tokens_generated_total 12",            "river_tokens_per_second ",
        "river_exit_layer_bucket{le=\"+Inf\"} 12",    "river_exit_layer_count 12",
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        if (!strstr(body, want[i]))
            fprintf(stderr, "%s", body);
        ck_assert_msg(strstr(body, want[i]), "/metrics lacks '%s'", want[i]);
    }
    free(body);
    body = ts_http_get(port, "/health", &code);
    ck_assert_int_eq(code, 200);
    free(body);
    body = ts_http_get(port, "/ready", &code);
    ck_assert_int_eq(code, 200);
    free(body);
    body = ts_http_get(port, "/nothing", &code);
    ck_assert_int_eq(code, 404);
    free(body);
    ts_stop(&s);
}
END_TEST


/* ---- Prefix-aware placement ---- */

#define TP_SESSIONS 4
#define TP_TURNS 4
#define TP_GEN 8

/* A metric's value in Prometheus text, -1 when absent. */
static double ts_metric(const char *text, const char *name)
{
    char key[160];
    snprintf(key, sizeof key, "\n%s ", name);
    const char *p = strstr(text, key);
    return p ? strtod(p + strlen(key), NULL) : -1;
}

typedef struct tp_stream {
    int32_t ids[TP_GEN];
    size_t n;
    int ended, ok;
    uint32_t cached, prompt;
} tp_stream_t;

static void tp_on_event(void *user, const river_event_t *ev)
{
    tp_stream_t *s = user;
    if (ev->kind == RIVER_EVENT_CHUNK) {
        for (size_t i = 0; i < ev->n_ids && s->n < TP_GEN; i++)
            s->ids[s->n++] = ev->ids[i];
        return;
    }
    s->ended = 1;
    s->ok = ev->kind == RIVER_EVENT_FINAL;
    s->cached = ev->cached_tokens;
    s->prompt = ev->prompt_tokens;
}

/* Sends TP_GEN tokens' request of ids (without a session id) into st. */
static void tp_submit(river_client_t *c, const int32_t *ids, size_t n, const char *cache_salt,
                      tp_stream_t *st)
{
    river_generate_opts_t o = RIVER_GENERATE_OPTS_INIT;
    o.prompt_ids = ids;
    o.n_prompt_ids = n;
    o.max_tokens = TP_GEN;
    o.ignore_eos = 1;
    o.timeout_ms = 10000;
    o.cache_salt = cache_salt;
    ck_assert_int_eq(river_client_submit(c, &o, NULL, tp_on_event, st, NULL), 0);
}

/* Several chats that share a system prompt, each turn resending the whole history as
 * token ids without a session id (a stateless API), through riverd with two workers and
 * placement `placement`. Each round sends one turn of every chat at once, the chats in a
 * new order each round. Returns the prefix cache hit rate riverd's metrics give; ids
 * receives every turn's completion. */
static double ts_prefix_run(const char *placement, int32_t ids[TP_SESSIONS][TP_TURNS][TP_GEN])
{
    char extra[64];
    snprintf(extra, sizeof extra, "placement: %s\n", placement);
    /* The run before removed the temp directory (ts_stop). */
    ck_assert(mkdir(test_tmpdir(), 0700) == 0 || errno == EEXIST);
    ts_srv_t s;
    ts_start(&s, &(ts_opts_t){.model = TEST_DATA "/stories260K/stories260K.bin", .external = 2,
                              .extra = extra}, NULL);
    river_client_t *c;
    ck_assert_int_eq(river_client_new(&c, s.c.clients), 0);
    static int32_t hist[TP_SESSIONS][512];
    size_t n[TP_SESSIONS];
    uint32_t x = 99;
    for (int k = 0; k < TP_SESSIONS; k++) {
        hist[k][0] = 1;
        n[k] = 1;
    }
    /* The system prompt all chats start with: 47 ids after BOS, three pages. */
    for (int i = 0; i < 47; i++) {
        x = x * 1664525u + 1013904223u;
        for (int k = 0; k < TP_SESSIONS; k++)
            hist[k][n[k]++] = 3 + (int32_t)((x >> 8) % 500);
    }
    uint32_t cached = 0, prompt = 0;
    for (int t = 0; t < TP_TURNS; t++) {
        int order[TP_SESSIONS];
        for (int k = 0; k < TP_SESSIONS; k++)
            order[k] = k;
        for (int k = TP_SESSIONS - 1; k > 0; k--) { /* Fisher-Yates, fixed seed */
            x = x * 1664525u + 1013904223u;
            int j = (int)((x >> 8) % (uint32_t)(k + 1)), tmp = order[k];
            order[k] = order[j];
            order[j] = tmp;
        }
        tp_stream_t st[TP_SESSIONS];
        memset(st, 0, sizeof st);
        for (int i = 0; i < TP_SESSIONS; i++) {
            int k = order[i];
            for (int u = 0; u < 12; u++) { /* the user's message */
                x = x * 1664525u + 1013904223u;
                hist[k][n[k]++] = 3 + (int32_t)((x >> 8) % 500);
            }
            tp_submit(c, hist[k], n[k], NULL, &st[k]);
        }
        int64_t until = clock_now_ms() + 20000;
        while (river_client_in_flight(c) > 0) {
            ck_assert_msg(clock_now_ms() < until, "round %d did not end", t);
            ck_assert_int_ge(river_client_poll(c, 200), 0);
        }
        for (int k = 0; k < TP_SESSIONS; k++) {
            ck_assert(st[k].ok);
            ck_assert_uint_eq(st[k].n, TP_GEN);
            ck_assert_uint_le(st[k].cached, st[k].prompt - 1);
            cached += st[k].cached;
            prompt += st[k].prompt;
            for (int i = 0; i < TP_GEN; i++)
                hist[k][n[k]++] = ids[k][t][i] = st[k].ids[i];
        }
    }
    river_client_destroy(&c);
    river_admin_t *a;
    ck_assert_int_eq(river_admin_new(&a, s.c.admin, 2000), 0);
    char *text;
    ck_assert_int_eq(river_admin_metrics(a, &text), 0);
    river_admin_destroy(&a);
    double hit = ts_metric(text, "river_prefix_cache_hit_tokens_total");
    double query = ts_metric(text, "river_prefix_cache_query_tokens_total");
    double pages = ts_metric(text, "river_prefix_cache_pages");
    free(text);
    ck_assert_msg(hit == cached && query == prompt, "metrics say %g of %g, the Finals %u of %u",
                  hit, query, cached, prompt);
    ck_assert_msg(pages > 0, "river_prefix_cache_pages %g", pages);
    ts_stop(&s);
    return query > 0 ? hit / query : 0;
}

/* Runs one request of ids on c alone and returns its end. */
static tp_stream_t tp_run_one(river_client_t *c, const int32_t *ids, size_t n,
                              const char *cache_salt)
{
    tp_stream_t st = {0};
    tp_submit(c, ids, n, cache_salt, &st);
    while (!st.ended)
        ck_assert_int_ge(river_client_poll(c, 1000), 0);
    ck_assert(st.ok);
    return st;
}

/* placement prefix with keyed, salted page names: two prompts that ran at once (so on
 * the two workers) each go back to the worker that holds them when repeated alone, where
 * load-only placement would send both to the same idle worker; a request of another
 * cache_salt finds nothing of them. */
START_TEST(test_prefix_repeat)
{
    ck_assert(mkdir(test_tmpdir(), 0700) == 0 || errno == EEXIST);
    ts_srv_t s;
    ts_start(&s, &(ts_opts_t){.model = TEST_DATA "/stories260K/stories260K.bin", .external = 2,
                              .extra = "placement: prefix\n"}, NULL);
    river_client_t *c;
    ck_assert_int_eq(river_client_new(&c, s.c.clients), 0);
    enum { N = 60 };
    static int32_t p[2][N];
    uint32_t x = 5;
    for (int k = 0; k < 2; k++) {
        p[k][0] = 1;
        for (int i = 1; i < N; i++) {
            x = x * 1664525u + 1013904223u;
            p[k][i] = 3 + (int32_t)((x >> 8) % 500);
        }
    }
    tp_stream_t st[2];
    memset(st, 0, sizeof st);
    for (int k = 0; k < 2; k++)
        tp_submit(c, p[k], N, NULL, &st[k]);
    while (river_client_in_flight(c) > 0)
        ck_assert_int_ge(river_client_poll(c, 1000), 0);
    ck_assert(st[0].ok && st[1].ok);
    for (int round = 0; round < 2; round++)
        for (int k = 0; k < 2; k++) {
            tp_stream_t r = tp_run_one(c, p[k], N, NULL);
            ck_assert_msg(r.cached == N - 1, "round %d prompt %d: %u of %d tokens cached",
                          round, k, r.cached, N - 1);
        }
    /* One salt each: two prompts of one partition share their first token (BOS). */
    ck_assert_uint_eq(tp_run_one(c, p[0], N, "partition 1").cached, 0);
    ck_assert_uint_eq(tp_run_one(c, p[1], N, "partition 2").cached, 0);
    river_client_destroy(&c);
    ts_stop(&s);
}
END_TEST

/* Prefix-aware placement finds the worker holding a chat's history; load-only placement
 * spreads each round over the workers by free slots, so a chat lands wherever its place
 * in the round puts it. The completions are the same either way. */
START_TEST(test_prefix_placement)
{
    static int32_t by_prefix[TP_SESSIONS][TP_TURNS][TP_GEN], by_load[TP_SESSIONS][TP_TURNS][TP_GEN];
    double load = ts_prefix_run("load", by_load);
    double prefix = ts_prefix_run("prefix", by_prefix);
    printf("prefix cache hit rate through riverd, 2 workers, %d chats of %d turns: "
           "placement load %.3f, placement prefix %.3f\n", TP_SESSIONS, TP_TURNS, load, prefix);
    ck_assert_msg(prefix > load, "prefix placement hit rate %.3f, load %.3f", prefix, load);
    ck_assert(!memcmp(by_prefix, by_load, sizeof by_prefix));
}
END_TEST

/* An admin call riverd never answered has failed for its caller (RIVER_ETIMEOUT): closing
 * the admin client drops it, so a riverd that comes up after the caller gave up never runs
 * it. Here riverd's admin socket is bound right after the timeout, while the client closes:
 * a client that lingered on its unsent request would connect within its reconnect interval
 * (100 ms) and deliver the scale. */
START_TEST(test_admin_abandoned_call)
{
    char ep[256];
    snprintf(ep, sizeof ep, "ipc://%s/late-admin", test_tmpdir());
    river_admin_t *a;
    ck_assert_int_eq(river_admin_new(&a, ep, 300), 0);
    uint32_t prev = 0;
    ck_assert_int_eq(river_admin_scale(a, 3, &prev), RIVER_ETIMEOUT);
    void *ctx = zmq_ctx_new();
    void *late = zmq_socket(ctx, ZMQ_ROUTER);
    int zero = 0;
    zmq_setsockopt(late, ZMQ_LINGER, &zero, sizeof zero);
    ck_assert_int_eq(zmq_bind(late, ep), 0);
    double t0 = clock_now_s();
    river_admin_destroy(&a);
    double closed = clock_now_s() - t0;
    zmq_pollitem_t it = {.socket = late, .events = ZMQ_POLLIN};
    int n = zmq_poll(&it, 1, 600);
    zmq_close(late);
    zmq_ctx_term(ctx);
    ck_assert_msg(n == 0, "the timed-out scale reached the late riverd after its caller was "
                  "told it failed (the client took %.3f s to close)", closed);
}
END_TEST

static Suite *serving_suite(void)
{
    Suite *s = suite_create("serving");
    TCase *tc = tcase_create("serving");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_bad_config);
    tcase_add_test(tc, test_admin_abandoned_call);
    tcase_add_test(tc, test_greedy_matches_engine);
    tcase_add_test(tc, test_bad_frames);
    tcase_add_test(tc, test_limits_and_queue);
    tcase_add_test(tc, test_deadline);
    tcase_add_test(tc, test_cancel_frees_kv);
    tcase_add_test(tc, test_shutdown_drains);
    tcase_add_test(tc, test_no_worker_unavailable);
    tcase_add_test(tc, test_kill_worker_midstream);
    tcase_add_test(tc, test_lossless_kill_worker);
    tcase_add_test(tc, test_drain_worker);
    tcase_add_test(tc, test_session_affinity);
    tcase_add_test(tc, test_supervision);
    tcase_add_test(tc, test_reload);
    tcase_add_test(tc, test_systemd_notify);
    tcase_add_test(tc, test_metrics_http);
    tcase_add_test(tc, test_concurrent_clients);
    suite_add_tcase(s, tc);
    TCase *tp = tcase_create("prefix");
    tcase_set_timeout(tp, 120);
    tcase_add_test(tp, test_prefix_placement);
    tcase_add_test(tp, test_prefix_repeat);
    suite_add_tcase(s, tp);
    return s;
}

RIVER_TEST_MAIN(serving_suite)
