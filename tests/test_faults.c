/* Fault injection, end to end: real riverd and river-worker processes on ipc:// sockets
 * under a temporary directory, real signals, and the client library; binaries come from
 * <builddir>/bin (test_bin).
 *
 * Each test breaks something while streams run and then checks every request: it either
 * completed exactly once, with exactly the tokens of a greedy reference run (`river run`,
 * in-process), or it ended with an explicit error code. None is lost (every stream ends,
 * none is left waiting), and no token index arrives twice (chunk sequence numbers are
 * consecutive from 0 and the tokens are a prefix of the reference, so a repeated or
 * skipped token shows as a mismatch).
 *
 *   test_sigstop_worker       a worker stops answering (SIGSTOP) mid-stream, then resumes
 *   test_riverd_restart       riverd is killed (SIGKILL) while workers live, then restarted
 *   test_slow_client          a client stops reading its streams
 *   test_split_backbone_lost  the backbone half of a split pair is killed mid-stream
 *   test_client_limit         limits.max_requests_per_client
 *
 * Heartbeats are short (200 ms, liveness 3) so that a silent worker is declared dead in a
 * fraction of a second; RIVER_TEST_KEEP=1 keeps the logs of every process. */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "client/river_client.h"
#include "common/clock.h"
#include "common/err.h"
#include "tests/cluster.h"
#include "tests/proc.h"
#include "tests/streams.h"
#include "tests/testutil.h"

#define TF_FAST_MODEL TEST_DATA "/tinystories-656k" /* context 512, ~10k tokens/s */
#define TF_SLOW_MODEL TEST_DATA "/kjv-12l"          /* context 256, 12 layers */
#define TF_HEARTBEAT_MS 200
#define TF_LIVENESS 3

/* ---- riverd and its workers ---- */

/* riverd with endpoints under the test's directory, short heartbeats, then `extra`. */
static void tf_riverd_start(cluster_t *s, const char *extra)
{
    if (!s->dir[0]) {
        cluster_opts_t o = {.heartbeat_ms = TF_HEARTBEAT_MS, .liveness = TF_LIVENESS,
                            .plain = 1, /* tests/test_auth.c covers CURVE */
                            .extra = extra};
        cluster_init(s, &o);
        cluster_write_config(s, &o);
    }
    cluster_riverd_start(s, NULL);
}

/* Starts a worker named id on `model` with `extra` YAML; returns its index in s->wk. */
static int tf_worker_start(cluster_t *s, const char *id, const char *model, const char *extra)
{
    char y[2048];
    snprintf(y, sizeof y, "auth: {mode: plain}\n%s", extra ? extra : "");
    cluster_worker_opts_t w = {.model = model, .log_level = "info", .yaml = y};
    return cluster_worker_start(s, id, &w);
}

/* ---- Tests ---- */

/* A worker stops answering mid-stream (SIGSTOP): riverd declares it dead after
 * `liveness` heartbeats and continues its streams on the other worker from the tokens the
 * clients have. Then it resumes (SIGCONT) with its old streams still in its engine: what
 * it sends for them is dropped (riverd tells it to Reconnect), so no client sees a token
 * twice; it comes back as a fresh worker and serves again. */
START_TEST(test_sigstop_worker)
{
    enum { N = 8, TOKENS = 160 };
    streams_expect_t want[STREAMS_N_PROMPTS];
    streams_expect_all(TF_SLOW_MODEL, TOKENS, want);
    cluster_t s = {0};
    tf_riverd_start(&s, NULL);
    tf_worker_start(&s, "w0", TF_SLOW_MODEL, NULL);
    tf_worker_start(&s, "w1", TF_SLOW_MODEL, NULL);
    streams_wait_ready(s.admin, NULL, 2, 20000, s.dir);

    streams_load_t l;
    streams_load_start(&l, s.clients, NULL, N, want, TOKENS, 30000);
    long at_stop = streams_load_wait(&l, N * 16);
    ck_assert_int_eq(kill(s.wk[0].pid, SIGSTOP), 0);
    double dead_after = cluster_wait_state(&s, "w0", "dead", 5000);
    ck_assert_msg(dead_after >= 0, "riverd did not declare the stopped worker dead");
    long at_cont = atomic_load(&l.progress);
    ck_assert_int_eq(kill(s.wk[0].pid, SIGCONT), 0);
    int complete = streams_load_finish(&l, "SIGSTOP");
    /* One worker answered throughout, so every stream could finish there. */
    ck_assert_int_eq(complete, N);
    ck_assert_int_ge(streams_metric(s.admin, NULL, "river_worker_deaths_total"), 1);
    ck_assert_int_ge(streams_metric(s.admin, NULL, "river_requests_redispatched_total"), 1);
    printf("faults: SIGSTOP after %ld of %d tokens, worker dead after %.2f s, SIGCONT at %ld "
           "tokens; %d of %d streams complete and exact\n",
           at_stop, N * TOKENS, dead_after, at_cont, complete, N);
    streams_load_free(&l);

    /* The resumed worker comes back and takes work again, exactly. */
    double back = cluster_wait_state(&s, "w0", "ready", 10000);
    ck_assert_msg(back >= 0, "the resumed worker did not come back");
    long before = streams_metric(s.admin, NULL, "river_worker_tokens_total{worker=\"w0\"}");
    streams_load_start(&l, s.clients, NULL, 4, want, 40, 30000);
    streams_expect_t short_want[STREAMS_N_PROMPTS];
    streams_expect_all(TF_SLOW_MODEL, 40, short_want);
    for (int i = 0; i < 4; i++)
        l.st[i].want = &short_want[i % STREAMS_N_PROMPTS];
    ck_assert_int_eq(streams_load_finish(&l, "after SIGCONT"), 4);
    ck_assert_int_gt(streams_metric(s.admin, NULL, "river_worker_tokens_total{worker=\"w0\"}"), before);
    streams_load_free(&l);
    cluster_stop(&s);
}
END_TEST

/* riverd is killed (SIGKILL) while workers stream: every client sees its requests end at
 * once with UNAVAILABLE (the client library notices the lost connection; riverd's state
 * died with it), without any timeout of its own. riverd started again on the same
 * endpoints gets its workers back without any help, and serves new requests exactly; a
 * client connection from before the crash works again too. */
START_TEST(test_riverd_restart)
{
    enum { N = 6, TOKENS = 160 };
    streams_expect_t want[STREAMS_N_PROMPTS];
    streams_expect_all(TF_SLOW_MODEL, TOKENS, want);
    cluster_t s = {0};
    tf_riverd_start(&s, NULL);
    tf_worker_start(&s, "w0", TF_SLOW_MODEL, NULL);
    tf_worker_start(&s, "w1", TF_SLOW_MODEL, NULL);
    streams_wait_ready(s.admin, NULL, 2, 20000, s.dir);

    /* A connection of this thread's that outlives the crash. */
    river_client_t *c;
    ck_assert_int_eq(river_client_new(&c, s.clients), 0);
    streams_stream_t mine = {.want = &want[0]};
    river_generate_opts_t o = RIVER_GENERATE_OPTS_INIT;
    o.prompt = streams_prompts[0];
    o.max_tokens = TOKENS;
    o.ignore_eos = 1;
    ck_assert_int_eq(river_client_submit(c, &o, NULL, streams_on_event, &mine, NULL), 0);

    streams_load_t l;
    streams_load_start(&l, s.clients, NULL, N, want, TOKENS, 0);
    long at_kill = streams_load_wait(&l, N * 16);
    double t_kill = clock_now_s();
    test_kill(&s.pid, SIGKILL);
    while (!mine.ended && clock_now_s() < t_kill + STREAMS_LIMIT_S)
        ck_assert_int_ge(river_client_poll(c, 100), 0);
    int complete =
        streams_load_finish(&l, "riverd killed") + streams_check(&mine, "riverd killed, mine");
    double slowest = mine.end_at - t_kill;
    int unavailable = mine.end == RIVER_EVENT_ERROR && mine.code == RIVER_CODE_UNAVAILABLE;
    for (int i = 0; i < N; i++) {
        if (l.st[i].end != RIVER_EVENT_ERROR)
            continue;
        ck_assert_msg(l.st[i].code == RIVER_CODE_UNAVAILABLE, "stream %d: %s: %s", i,
                      river_code_name(l.st[i].code), l.st[i].msg);
        unavailable++;
        if (l.st[i].end_at - t_kill > slowest)
            slowest = l.st[i].end_at - t_kill;
    }
    /* Cut off mid-stream, so (nearly) every request was lost with riverd, and the clients
     * knew within a moment. */
    ck_assert_int_ge(unavailable, 1);
    ck_assert_msg(slowest < 3.0, "a client took %.2f s to see riverd gone", slowest);
    streams_load_free(&l);

    /* Started again on the same endpoints after a while (longer than the workers' view of
     * riverd's liveness, so that they have given it up and reconnect on their own): the
     * workers come back by themselves. */
    test_sleep_ms(1500);
    double t_start = clock_now_s();
    tf_riverd_start(&s, NULL);
    streams_wait_ready(s.admin, NULL, 2, 20000, s.dir);
    double rejoin = clock_now_s() - t_start;
    streams_load_start(&l, s.clients, NULL, N, want, TOKENS, 30000);
    ck_assert_int_eq(streams_load_finish(&l, "after the restart"), N);
    streams_load_free(&l);
    streams_stream_t again = {.want = &want[0]};
    ck_assert_int_eq(river_client_submit(c, &o, NULL, streams_on_event, &again, NULL), 0);
    while (!again.ended)
        ck_assert_int_ge(river_client_poll(c, 1000), 0);
    ck_assert_int_eq(streams_check(&again, "old connection after the restart"), 1);
    river_client_destroy(&c);
    printf("faults: riverd killed after %ld of %d tokens: %d of %d requests ended with "
           "UNAVAILABLE within %.2f s, %d had completed; restarted 1.5 s later, both workers "
           "back %.2f s after that, %d new streams exact\n",
           at_kill, (N + 1) * TOKENS, unavailable, N + 1, slowest, complete, rejoin, N);
    cluster_stop(&s);
}
END_TEST

/* A client sends requests and does not read. riverd's queue for it is bounded
 * (limits.max_client_backlog); once it is full riverd cancels the client's requests on the
 * worker, counts them as RESOURCE_EXHAUSTED and keeps serving everyone else. When the
 * client reads at last it gets, per request, the tokens it was sent and then an explicit
 * end: the error naming the limit (or the Final of a request that had finished). */
START_TEST(test_slow_client)
{
    enum { MAX_REQS = 48, TOKENS = 440 };
    streams_expect_t want[STREAMS_N_PROMPTS];
    streams_expect_all(TF_FAST_MODEL, TOKENS, want);
    cluster_t s = {0};
    tf_riverd_start(&s, "limits:\n  max_client_backlog: 1000\n  max_requests_per_client: 64\n");
    tf_worker_start(&s, "w0", TF_FAST_MODEL, "max_seqs: 16\n");
    streams_wait_ready(s.admin, NULL, 1, 20000, s.dir);

    river_client_t *slow;
    ck_assert_int_eq(river_client_new(&slow, s.clients), 0);
    static streams_stream_t st[MAX_REQS];
    memset(st, 0, sizeof st);
    river_generate_opts_t o = RIVER_GENERATE_OPTS_INIT;
    o.max_tokens = TOKENS;
    o.ignore_eos = 1;
    o.timeout_ms = 60000;
    /* Requests until riverd says the client's queue overflowed: how many that takes
     * depends on the socket buffers of the system. */
    int n = 0;
    double t0 = clock_now_s();
    while (n < MAX_REQS && streams_metric(s.admin, NULL, "river_requests_total{outcome=\"resource_exhausted\"}")
                               == 0) {
        st[n].want = &want[n % STREAMS_N_PROMPTS];
        o.prompt = streams_prompts[n % STREAMS_N_PROMPTS];
        ck_assert_int_eq(river_client_submit(slow, &o, NULL, streams_on_event, &st[n], NULL), 0);
        n++;
        test_sleep_ms(100);
    }
    ck_assert_msg(n < MAX_REQS, "riverd never found the client's queue full");
    /* Everything the client has is cancelled on the worker or finished: nothing runs. */
    river_admin_t *a = cluster_admin(&s);
    river_status_t rs;
    double until = clock_now_s() + 20;
    do {
        ck_assert_int_eq(river_admin_status(a, &rs), 0);
        if (rs.running == 0 && rs.queue_length == 0)
            break;
        test_sleep_ms(20);
    } while (clock_now_s() < until);
    river_admin_destroy(&a);
    ck_assert_msg(rs.running == 0 && rs.queue_length == 0, "%u running, %u queued", rs.running,
                  rs.queue_length);
    double stalled = clock_now_s() - t0;

    /* Others are served meanwhile (short streams: fewer chunks than the backlog, so that
     * a reader descheduled for a moment cannot overflow it). */
    streams_expect_t short_want[STREAMS_N_PROMPTS];
    streams_expect_all(TF_FAST_MODEL, 40, short_want);
    streams_load_t l;
    streams_load_start(&l, s.clients, NULL, 2, short_want, 40, 30000);
    ck_assert_int_eq(streams_load_finish(&l, "beside the slow client"), 2);
    streams_load_free(&l);

    /* The slow client reads at last: every request ends, explicitly. */
    until = clock_now_s() + 30;
    while (river_client_in_flight(slow) > 0 && clock_now_s() < until)
        ck_assert_int_ge(river_client_poll(slow, 100), 0);
    int complete = 0, exhausted = 0;
    size_t tokens = 0;
    for (int i = 0; i < n; i++) {
        char what[64];
        snprintf(what, sizeof what, "slow client, request %d", i);
        int ok = streams_check(&st[i], what);
        complete += ok;
        tokens += st[i].n_ids;
        if (!ok) {
            ck_assert_msg(st[i].code == RIVER_CODE_RESOURCE_EXHAUSTED &&
                              strstr(st[i].msg, "limits.max_client_backlog"),
                          "%s: %s: %s", what, river_code_name(st[i].code), st[i].msg);
            exhausted++;
        }
    }
    ck_assert_int_ge(exhausted, 1);
    ck_assert_int_eq(streams_metric(s.admin, NULL, "river_requests_total{outcome=\"resource_exhausted\"}"),
                     exhausted);
    river_client_destroy(&slow);
    printf("faults: a client that did not read: %d requests, its queue overflowed after "
           "%.1f s; it then read %zu tokens, %d Finals and %d RESOURCE_EXHAUSTED errors\n", n,
           stalled, tokens, complete, exhausted);
    cluster_stop(&s);
}
END_TEST

/* The backbone half of a split pair dies mid-stream (SIGKILL). The river worker does not
 * finish the tokens on the Exit River (that would change them): it fails the requests
 * that need the deep layers with UNAVAILABLE, riverd continues them on another worker from
 * the tokens the clients have, and sends the river worker nothing while it says it cannot
 * serve. A new backbone pairs again and the pair serves; with the pair alone, losing the
 * backbone again ends the streams with an explicit UNAVAILABLE. */
START_TEST(test_split_backbone_lost)
{
    enum { N = 6, TOKENS = 120 };
    streams_expect_t want[STREAMS_N_PROMPTS];
    streams_expect_all(TF_SLOW_MODEL, TOKENS, want);
    cluster_t s = {0};
    tf_riverd_start(&s, NULL);
    char peer[400], pair_yaml[600];
    snprintf(peer, sizeof peer, "ipc://%s/pair.sock", s.dir);
    snprintf(pair_yaml, sizeof pair_yaml, "split:\n  boundary: 6\n  peer: \"%s\"\n", peer);
    char bb_yaml[700], river_yaml[700];
    snprintf(bb_yaml, sizeof bb_yaml, "role: backbone\n%s", pair_yaml);
    snprintf(river_yaml, sizeof river_yaml, "role: river\n%s", pair_yaml);
    int bb = tf_worker_start(&s, "backbone", TF_SLOW_MODEL, bb_yaml);
    int rv = tf_worker_start(&s, "river", TF_SLOW_MODEL, river_yaml);
    int full = tf_worker_start(&s, "full", TF_SLOW_MODEL, NULL);
    streams_wait_ready(s.admin, NULL, 2, 20000, s.dir);

    /* Streams on both the pair and the full worker; the backbone goes. */
    streams_load_t l;
    streams_load_start(&l, s.clients, NULL, N, want, TOKENS, 30000);
    long at_kill = streams_load_wait(&l, N * 12);
    ck_assert_int_gt(streams_metric(s.admin, NULL, "river_worker_tokens_total{worker=\"river\"}"), 0);
    test_kill(&s.wk[bb].pid, SIGKILL);
    ck_assert_int_eq(streams_load_finish(&l, "backbone killed"), N);
    streams_load_free(&l);
    long moved = streams_metric(s.admin, NULL, "river_requests_redispatched_total");
    ck_assert_int_ge(moved, 1);
    /* The river worker stays, and riverd knows it cannot serve. */
    ck_assert_int_eq(waitpid(s.wk[rv].pid, NULL, WNOHANG), 0);
    ck_assert_msg(cluster_wait_state(&s, "river", "unavailable", 2000) >= 0, "river worker is %s",
                  cluster_worker_state(&s, "river", NULL, 0));

    /* Meanwhile every request goes to the full worker at once: none is sent to the river
     * worker to fail there. */
    streams_load_start(&l, s.clients, NULL, 4, want, TOKENS, 30000);
    ck_assert_int_eq(streams_load_finish(&l, "without a backbone"), 4);
    streams_load_free(&l);
    ck_assert_int_eq(streams_metric(s.admin, NULL, "river_requests_redispatched_total"), moved);

    /* A new backbone: the pair serves again, also alone. */
    cluster_worker_restart(&s, bb);
    double paired = cluster_wait_state(&s, "river", "ready", 20000);
    ck_assert_msg(paired >= 0, "the river worker did not pair again");
    test_kill(&s.wk[full].pid, SIGKILL);
    ck_assert(cluster_wait_state(&s, "full", "dead", 5000) >= 0);
    streams_load_start(&l, s.clients, NULL, 4, want, TOKENS, 30000);
    ck_assert_int_eq(streams_load_finish(&l, "paired again"), 4);
    streams_load_free(&l);

    /* The pair alone loses its backbone: explicit UNAVAILABLE, no silence. */
    streams_load_start(&l, s.clients, NULL, 4, want, TOKENS, 0);
    streams_load_wait(&l, 4 * 12);
    test_kill(&s.wk[bb].pid, SIGKILL);
    int complete = streams_load_finish(&l, "pair alone");
    for (int i = 0; i < 4; i++)
        if (l.st[i].end == RIVER_EVENT_ERROR)
            ck_assert_msg(l.st[i].code == RIVER_CODE_UNAVAILABLE, "stream %d: %s: %s", i,
                          river_code_name(l.st[i].code), l.st[i].msg);
    ck_assert_int_lt(complete, 4);
    streams_load_free(&l);
    printf("faults: backbone killed after %ld of %d tokens: every stream completed exactly "
           "(%ld re-dispatched to the full worker); paired again in %.2f s; the pair alone "
           "then failed %d of 4 streams with UNAVAILABLE\n",
           at_kill, N * TOKENS, moved, paired, 4 - complete);
    cluster_stop(&s);
}
END_TEST

/* limits.max_requests_per_client: a connection with that many requests in flight gets
 * RESOURCE_EXHAUSTED naming the key for one more; another connection is not affected; a
 * slot that frees up can be used again. */
START_TEST(test_client_limit)
{
    enum { LIMIT = 3, TOKENS = 120 };
    streams_expect_t want[STREAMS_N_PROMPTS];
    streams_expect_all(TF_SLOW_MODEL, TOKENS, want);
    cluster_t s = {0};
    tf_riverd_start(&s, "limits:\n  max_requests_per_client: 3\n  max_requests_per_key: 7\n");
    tf_worker_start(&s, "w0", TF_SLOW_MODEL, NULL);
    streams_wait_ready(s.admin, NULL, 1, 20000, s.dir);

    river_client_t *c;
    ck_assert_int_eq(river_client_new(&c, s.clients), 0);
    streams_stream_t st[LIMIT + 2];
    memset(st, 0, sizeof st);
    char ids[LIMIT + 2][RIVER_CLIENT_ID_MAX];
    river_generate_opts_t o = RIVER_GENERATE_OPTS_INIT;
    o.max_tokens = TOKENS;
    o.ignore_eos = 1;
    o.timeout_ms = 30000;
    for (int i = 0; i <= LIMIT; i++) {
        st[i].want = &want[i % STREAMS_N_PROMPTS];
        o.prompt = streams_prompts[i % STREAMS_N_PROMPTS];
        ck_assert_int_eq(river_client_submit(c, &o, NULL, streams_on_event, &st[i], ids[i]), 0);
    }
    while (!st[LIMIT].ended)
        ck_assert_int_ge(river_client_poll(c, 1000), 0);
    ck_assert_int_eq(st[LIMIT].end, RIVER_EVENT_ERROR);
    ck_assert_int_eq(st[LIMIT].code, RIVER_CODE_RESOURCE_EXHAUSTED);
    ck_assert_msg(strstr(st[LIMIT].msg, "limits.max_requests_per_client"), "%s",
                  st[LIMIT].msg);
    ck_assert_uint_eq(st[LIMIT].n_ids, 0);

    /* Another tenant of the same connection (Generate.tenant, what river-gateway sends for
     * each API key) has a share of its own: at its limit, and still served. */
    streams_stream_t tn[LIMIT + 1];
    memset(tn, 0, sizeof tn);
    river_generate_opts_t ot = o;
    ot.tenant = "other-tenant";
    ot.max_tokens = 4;
    for (int i = 0; i <= LIMIT; i++) {
        ot.prompt = streams_prompts[i % STREAMS_N_PROMPTS];
        ck_assert_int_eq(river_client_submit(c, &ot, NULL, streams_on_event, &tn[i], NULL), 0);
    }
    while (!tn[LIMIT].ended)
        ck_assert_int_ge(river_client_poll(c, 1000), 0);
    ck_assert_int_eq(tn[LIMIT].code, RIVER_CODE_RESOURCE_EXHAUSTED);
    ck_assert_msg(strstr(tn[LIMIT].msg, "tenant other-tenant"), "%s", tn[LIMIT].msg);
    for (int i = 0; i < LIMIT; i++) {
        while (!tn[i].ended)
            ck_assert_int_ge(river_client_poll(c, 1000), 0);
        ck_assert_msg(tn[i].end == RIVER_EVENT_FINAL, "tenant request %d: %s", i, tn[i].msg);
        ck_assert_uint_eq(tn[i].n_ids, 4);
    }
    /* Naming more tenants does not multiply the connection's share: with LIMIT requests
     * running, limits.max_requests_per_key (7) admits four more of four new tenants and
     * refuses a fifth. */
    enum { KEY_LIMIT = 7, MORE = KEY_LIMIT - LIMIT };
    streams_stream_t tk[MORE + 1];
    char tk_ids[MORE + 1][RIVER_CLIENT_ID_MAX];
    memset(tk, 0, sizeof tk);
    ot.max_tokens = TOKENS;
    for (int i = 0; i <= MORE; i++) {
        char name[16];
        snprintf(name, sizeof name, "t%d", i);
        ot.tenant = name;
        ot.prompt = streams_prompts[i % STREAMS_N_PROMPTS];
        ck_assert_int_eq(river_client_submit(c, &ot, NULL, streams_on_event, &tk[i], tk_ids[i]),
                         0);
    }
    while (!tk[MORE].ended)
        ck_assert_int_ge(river_client_poll(c, 1000), 0);
    ck_assert_int_eq(tk[MORE].code, RIVER_CODE_RESOURCE_EXHAUSTED);
    ck_assert_msg(strstr(tk[MORE].msg, "limits.max_requests_per_key (7)"), "%s", tk[MORE].msg);
    for (int i = 0; i < MORE; i++) {
        ck_assert_msg(!tk[i].ended, "tenant t%d: %s", i, tk[i].msg);
        ck_assert_int_eq(river_client_cancel(c, tk_ids[i]), 0);
    }
    for (int i = 0; i < MORE; i++)
        while (!tk[i].ended)
            ck_assert_int_ge(river_client_poll(c, 1000), 0);

    /* Another connection is its own client. */
    streams_load_t l;
    streams_load_start(&l, s.clients, NULL, 1, want, TOKENS, 30000);
    ck_assert_int_eq(streams_load_finish(&l, "other client"), 1);
    streams_load_free(&l);

    /* A cancelled request gives its slot back. */
    ck_assert_int_eq(river_client_cancel(c, ids[0]), 0);
    while (!st[0].ended)
        ck_assert_int_ge(river_client_poll(c, 1000), 0);
    ck_assert_int_eq(st[0].end, RIVER_EVENT_FINAL);
    st[LIMIT + 1].want = &want[0];
    o.prompt = streams_prompts[0];
    ck_assert_int_eq(river_client_submit(c, &o, NULL, streams_on_event, &st[LIMIT + 1], NULL), 0);
    while (river_client_in_flight(c) > 0)
        ck_assert_int_ge(river_client_poll(c, 1000), 0);
    for (int i = 1; i < LIMIT; i++)
        ck_assert_int_eq(streams_check(&st[i], "within the limit"), 1);
    ck_assert_int_eq(streams_check(&st[LIMIT + 1], "after a slot was freed"), 1);
    river_client_destroy(&c);
    cluster_stop(&s);
}
END_TEST

/* One case per test, so that CK_RUN_CASE=restart (say) runs one alone. */
static Suite *faults_suite(void)
{
    const struct {
        const char *name;
        const TTest *test;
    } cases[] = {
        {"client_limit", test_client_limit}, {"sigstop", test_sigstop_worker},
        {"restart", test_riverd_restart},    {"slow_client", test_slow_client},
        {"split", test_split_backbone_lost},
    };
    Suite *s = suite_create("faults");
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        TCase *tc = tcase_create(cases[i].name);
        tcase_set_timeout(tc, 180);
        tcase_add_test(tc, cases[i].test);
        suite_add_tcase(s, tc);
    }
    return s;
}

RIVER_TEST_MAIN(faults_suite)
