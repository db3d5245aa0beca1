/* A fake riverd: riverd's end of the worker link, driven by a test; tests/fakerd.h says
 * what each function does. */
#include "tests/fakerd.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zmq.h>

#include "common/clock.h"
#include "common/err.h"
#include "tests/proc.h"
#include "tests/testutil.h"

/* ---- The worker process and the link ---- */

pid_t wk_spawn(const char *name, const char *yaml, const char *id, const char *log,
               const char *const *env)
{
    const char *path = test_write_tmp(name, yaml, strlen(yaml));
    ck_assert_ptr_nonnull(path);
    char *argv[] = {(char *)test_bin("river-worker"), "--config", (char *)path,
                    id ? "--id" : NULL, (char *)id, NULL};
    return test_spawn(argv, log, env);
}

River__Worker__WorkerMessage *wk_launch(wk_t *w, const char *model, int max_seqs,
                                        const char *extra, int mandatory)
{
    static int n_started;
    memset(w, 0, sizeof *w);
    char endpoint[300], name[64], cfg[2048];
    snprintf(endpoint, sizeof endpoint, "ipc://%s/riverd-%d.sock", test_tmpdir(), n_started);
    snprintf(name, sizeof name, "worker-%d.yaml", n_started++);
    snprintf(cfg, sizeof cfg,
             "riverd: \"%s\"\nmodel: %s\nthreads: 1\nmax_seqs: %d\nmax_batch_rows: 64\n"
             "prefill_chunk: 32\nlog_level: %s\nauth: {mode: plain}\n%s%s",
             endpoint, model, max_seqs, getenv("WORKER_LOG") ? getenv("WORKER_LOG") : "warn",
             test_device_yaml(), extra ? extra : "");

    w->ctx = zmq_ctx_new();
    ck_assert_ptr_nonnull(w->ctx);
    w->router = zmq_socket(w->ctx, ZMQ_ROUTER);
    int one = 1, zero = 0;
    /* A worker that reconnects comes back under the same routing id while its old
     * connection may not be gone yet: the new one must win (riverd does the same). */
    zmq_setsockopt(w->router, ZMQ_ROUTER_HANDOVER, &one, sizeof one);
    if (mandatory)
        zmq_setsockopt(w->router, ZMQ_ROUTER_MANDATORY, &one, sizeof one);
    zmq_setsockopt(w->router, ZMQ_LINGER, &zero, sizeof zero);
    ck_assert_int_eq(zmq_bind(w->router, endpoint), 0);

    w->pid = wk_spawn(name, cfg, "w1", NULL, NULL);
    River__Worker__WorkerMessage *m =
        wk_expect(w, RIVER__WORKER__WORKER_MESSAGE__KIND_READY, 20000);
    ck_assert_ptr_nonnull(m->ready->capabilities);
    w->caps = *m->ready->capabilities;
    w->caps.model = NULL;
    w->caps.prefix_key.len = 0;
    if (m->ready->capabilities->prefix_key.len == sizeof w->prefix_key) {
        memcpy(w->prefix_key, m->ready->capabilities->prefix_key.data, sizeof w->prefix_key);
        w->caps.prefix_key.len = sizeof w->prefix_key;
    }
    w->caps.prefix_key.data = w->caps.prefix_key.len ? w->prefix_key : NULL;
    return m;
}

void wk_welcome(wk_t *w, int hb_ms, int liveness)
{
    River__Worker__Welcome wel = RIVER__WORKER__WELCOME__INIT;
    wel.heartbeat_ms = (uint32_t)hb_ms;
    wel.liveness = (uint32_t)liveness;
    River__Worker__DaemonMessage m = RIVER__WORKER__DAEMON_MESSAGE__INIT;
    m.kind_case = RIVER__WORKER__DAEMON_MESSAGE__KIND_WELCOME;
    m.welcome = &wel;
    wk_send(w, &m);
    w->hb_ms = hb_ms;
}

void wk_stop(wk_t *w)
{
    test_kill(&w->pid, SIGKILL);
    zmq_close(w->router);
    zmq_ctx_term(w->ctx);
}

int wk_wait_exit(wk_t *w, int timeout_ms)
{
    int code = test_wait_code(w->pid, timeout_ms);
    if (code >= 0)
        w->pid = 0;
    return code;
}

/* ---- Messages ---- */

void wk_send_raw(wk_t *w, const void *data, size_t len, int more_parts)
{
    ck_assert_uint_gt(w->route_len, 0);
    ck_assert_int_ge(zmq_send(w->router, w->route, w->route_len, ZMQ_SNDMORE), 0);
    if (more_parts)
        ck_assert_int_ge(zmq_send(w->router, "x", 1, ZMQ_SNDMORE), 0);
    ck_assert_int_ge(zmq_send(w->router, data, len, 0), 0);
    w->last_sent_ms = clock_now_ms();
}

void wk_send(wk_t *w, River__Worker__DaemonMessage *m)
{
    uint8_t *buf;
    size_t len;
    ck_assert_int_eq(frame_encode_buf(&m->base, &buf, &len), 0);
    wk_send_raw(w, buf, len, 0);
    free(buf);
}

/* Without ZMQ_DONTWAIT a heartbeat to a worker that is gone could block the test, and
 * without ignoring the failure it would fail a test that ends the worker on purpose. */
void wk_send_heartbeat(wk_t *w)
{
    River__Worker__DaemonHeartbeat hb = RIVER__WORKER__DAEMON_HEARTBEAT__INIT;
    River__Worker__DaemonMessage m = RIVER__WORKER__DAEMON_MESSAGE__INIT;
    m.kind_case = RIVER__WORKER__DAEMON_MESSAGE__KIND_HEARTBEAT;
    m.heartbeat = &hb;
    uint8_t buf[16];
    size_t len = river__worker__daemon_message__pack(&m, buf);
    if (zmq_send(w->router, w->route, w->route_len, ZMQ_SNDMORE | ZMQ_DONTWAIT) >= 0)
        zmq_send(w->router, buf, len, ZMQ_DONTWAIT);
    w->last_sent_ms = clock_now_ms();
}

/* Polls in slices of at most one heartbeat interval, so that riverd's heartbeats go out
 * on time however long the caller waits. */
River__Worker__WorkerMessage *wk_recv(wk_t *w, int timeout_ms)
{
    int64_t end = clock_now_ms() + timeout_ms;
    for (;;) {
        int64_t now = clock_now_ms();
        if (w->hb_ms && !w->silent && now - w->last_sent_ms >= w->hb_ms)
            wk_send_heartbeat(w);
        if (now >= end)
            return NULL;
        int slice = (int)(end - now);
        if (w->hb_ms && slice > w->hb_ms)
            slice = w->hb_ms;
        zmq_pollitem_t it = {.socket = w->router, .events = ZMQ_POLLIN};
        int rc = zmq_poll(&it, 1, slice);
        ck_assert_int_ge(rc, 0);
        if (rc == 0)
            continue;
        zmq_msg_t id, body;
        zmq_msg_init(&id);
        zmq_msg_init(&body);
        ck_assert_int_ge(zmq_msg_recv(&id, w->router, 0), 0);
        ck_assert_msg(zmq_msg_more(&id), "worker frame without a body");
        ck_assert_int_ge(zmq_msg_recv(&body, w->router, 0), 0);
        ck_assert_msg(!zmq_msg_more(&body), "worker message of more than one frame");
        w->route_len = zmq_msg_size(&id);
        memcpy(w->route, zmq_msg_data(&id), w->route_len);
        ProtobufCMessage *out;
        int e = frame_decode_msg(FRAME_WORKER_MESSAGE, &body, 0, &out);
        ck_assert_msg(e == 0, "undecodable frame from the worker: %s", river_err_detail());
        zmq_msg_close(&id);
        zmq_msg_close(&body);
        River__Worker__WorkerMessage *m = (River__Worker__WorkerMessage *)out;
        if (m->kind_case == RIVER__WORKER__WORKER_MESSAGE__KIND_HEARTBEAT) {
            w->heartbeats++;
            w->last_hb = *m->heartbeat;
            /* The message is freed after the caller is done with it: keep a copy. */
            size_t n = m->heartbeat->n_prefix_pages;
            if (n > 64)
                n = 64;
            if (n)
                memcpy(w->hb_prefix_pages, m->heartbeat->prefix_pages, n * sizeof(uint64_t));
            w->last_hb.n_prefix_pages = n;
            w->last_hb.prefix_pages = w->hb_prefix_pages;
        }
        return m;
    }
}

River__Worker__WorkerMessage *wk_expect(wk_t *w, River__Worker__WorkerMessage__KindCase kind,
                                        int timeout_ms)
{
    int64_t end = clock_now_ms() + timeout_ms;
    for (;;) {
        int left = (int)(end - clock_now_ms());
        River__Worker__WorkerMessage *m = wk_recv(w, left > 0 ? left : 0);
        ck_assert_msg(m != NULL, "no %d message from the worker within %d ms", kind, timeout_ms);
        if (m->kind_case == kind)
            return m;
        ck_assert_msg(m->kind_case == RIVER__WORKER__WORKER_MESSAGE__KIND_HEARTBEAT,
                      "expected message kind %d, got %s", kind, frame_case_name(&m->base));
        frame_free((ProtobufCMessage **)&m);
    }
}

/* ---- Requests ---- */

void wk_submit(wk_t *w, const req_t *q)
{
    River__Client__Generate g = RIVER__CLIENT__GENERATE__INIT;
    River__Client__TokenIds tids = RIVER__CLIENT__TOKEN_IDS__INIT;
    if (q->text) {
        g.prompt_case = RIVER__CLIENT__GENERATE__PROMPT_TEXT;
        g.text = (char *)q->text;
    } else if (q->ids) {
        tids.n_ids = q->n_ids;
        tids.ids = (int32_t *)q->ids;
        g.prompt_case = RIVER__CLIENT__GENERATE__PROMPT_TOKENS;
        g.tokens = &tids;
    }
    g.max_tokens = q->max_tokens;
    g.deadline_ms = q->deadline_ms;
    g.ignore_eos = q->ignore_eos;
    River__Client__ExitOverride x = RIVER__CLIENT__EXIT_OVERRIDE__INIT;
    if (q->exit_policy || q->exit_layer || q->lossless || q->draft_tokens) {
        x.policy = (char *)(q->exit_policy ? q->exit_policy : "");
        if (q->lossless) {
            x.opt_lossless_case = RIVER__CLIENT__EXIT_OVERRIDE__OPT_LOSSLESS_LOSSLESS;
            x.lossless = q->lossless > 0;
        }
        x.draft_tokens = q->draft_tokens;
        if (q->exit_layer) {
            x.opt_exit_layer_case = RIVER__CLIENT__EXIT_OVERRIDE__OPT_EXIT_LAYER_EXIT_LAYER;
            x.exit_layer = q->exit_layer;
        }
        g.exit = &x;
    }
    River__Worker__Submit s = RIVER__WORKER__SUBMIT__INIT;
    s.request_id = q->id;
    s.generate = &g;
    s.tokens_delivered = (uint32_t)q->n_delivered + (q->bad_count ? 1 : 0);
    s.n_delivered_ids = q->n_delivered;
    s.delivered_ids = (int32_t *)q->delivered;
    River__Worker__DaemonMessage m = RIVER__WORKER__DAEMON_MESSAGE__INIT;
    m.kind_case = RIVER__WORKER__DAEMON_MESSAGE__KIND_SUBMIT;
    m.submit = &s;
    wk_send(w, &m);
}

void wk_cancel(wk_t *w, uint64_t id)
{
    River__Worker__Cancel c = RIVER__WORKER__CANCEL__INIT;
    c.request_id = id;
    River__Worker__DaemonMessage m = RIVER__WORKER__DAEMON_MESSAGE__INIT;
    m.kind_case = RIVER__WORKER__DAEMON_MESSAGE__KIND_CANCEL;
    m.cancel = &c;
    wk_send(w, &m);
}

void wk_drain(wk_t *w, uint32_t deadline_ms)
{
    River__Worker__Drain d = RIVER__WORKER__DRAIN__INIT;
    d.deadline_ms = deadline_ms;
    River__Worker__DaemonMessage m = RIVER__WORKER__DAEMON_MESSAGE__INIT;
    m.kind_case = RIVER__WORKER__DAEMON_MESSAGE__KIND_DRAIN;
    m.drain = &d;
    wk_send(w, &m);
}
