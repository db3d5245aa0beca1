/* Framing: every message of the three links survives encode/decode; oversize, truncated,
 * garbage and unknown frames are refused with a useful detail; random bytes never crash
 * the decoder. */
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/frame.h"
#include "tests/testutil.h"

/* Encodes env, decodes it as kind, checks that the decoded message carries the same
 * case and encodes to the same bytes (protobuf-c writes fields in a fixed order, so equal
 * bytes mean equal messages). Returns the decoded message for field checks. */
static ProtobufCMessage *roundtrip(frame_kind_t kind, const ProtobufCMessage *env)
{
    uint8_t *buf, *again;
    size_t len, len2;
    ck_assert_int_eq(frame_kind_of(env), kind);
    int rc = frame_encode_buf(env, &buf, &len);
    ck_assert_msg(rc == 0, "encode %s: %s", frame_kind_name(kind), river_err_detail());
    ck_assert_uint_eq(len, frame_size(env));

    ProtobufCMessage *m;
    rc = frame_decode(kind, buf, len, 0, &m);
    ck_assert_msg(rc == 0, "decode %s: %s", frame_kind_name(kind), river_err_detail());
    ck_assert_ptr_nonnull(m);
    ck_assert_str_eq(frame_case_name(m), frame_case_name(env));
    ck_assert_str_ne(frame_case_name(m), "none");

    ck_assert_int_eq(frame_encode_buf(m, &again, &len2), 0);
    ck_assert_uint_eq(len2, len);
    ck_assert_int_eq(memcmp(again, buf, len), 0);

    /* The same through a ZMQ message. */
    zmq_msg_t zm;
    ck_assert_int_eq(frame_encode_msg(env, &zm), 0);
    ck_assert_uint_eq(zmq_msg_size(&zm), len);
    ck_assert_int_eq(memcmp(zmq_msg_data(&zm), buf, len), 0);
    ProtobufCMessage *m2;
    ck_assert_int_eq(frame_decode_msg(kind, &zm, len, &m2), 0);
    frame_free(&m2);
    ck_assert_ptr_null(m2);
    zmq_msg_close(&zm);

    free(again);
    free(buf);
    return m;
}

static int32_t ids[] = {1, 15043, 32000, 0, 7};
static int32_t layers[] = {3, 12, 12, 0, 31};
static uint32_t histogram[] = {0, 4, 9, 1};
static char *stops[] = {"\n\n", "User:", "é✓"};

/* A Generate with every field set. */
static void fill_generate(River__Client__Generate *g, River__Client__Sampling *s,
                          River__Client__ExitOverride *x)
{
    river__client__sampling__init(s);
    s->temperature = 0.7f;
    s->top_k = 40;
    s->top_p = 0.95f;
    s->opt_seed_case = RIVER__CLIENT__SAMPLING__OPT_SEED_SEED;
    s->seed = 1234567890123ull;
    river__client__exit_override__init(x);
    x->policy = "cosine";
    x->opt_tau_case = RIVER__CLIENT__EXIT_OVERRIDE__OPT_TAU_TAU;
    x->tau = 0.0f; /* zero, yet present */
    x->opt_exit_layer_case = RIVER__CLIENT__EXIT_OVERRIDE__OPT_EXIT_LAYER_EXIT_LAYER;
    x->exit_layer = 6;
    river__client__generate__init(g);
    g->request_id = "req-1";
    g->session_id = "sess-α";
    g->prompt_case = RIVER__CLIENT__GENERATE__PROMPT_TEXT;
    g->text = "In the beginning";
    g->sampling = s;
    g->max_tokens = 64;
    g->n_stop = 3;
    g->stop = stops;
    g->exit = x;
    g->deadline_ms = 5000;
    g->ignore_eos = 1;
}

START_TEST(test_client_roundtrip)
{
    River__Client__Sampling s;
    River__Client__ExitOverride x;
    River__Client__Generate g;
    fill_generate(&g, &s, &x);
    River__Client__ClientRequest req = RIVER__CLIENT__CLIENT_REQUEST__INIT;
    req.kind_case = RIVER__CLIENT__CLIENT_REQUEST__KIND_GENERATE;
    req.generate = &g;

    ProtobufCMessage *m = roundtrip(FRAME_CLIENT_REQUEST, &req.base);
    River__Client__ClientRequest *r = (River__Client__ClientRequest *)m;
    ck_assert_int_eq(r->kind_case, RIVER__CLIENT__CLIENT_REQUEST__KIND_GENERATE);
    ck_assert_str_eq(frame_case_name(m), "generate");
    River__Client__Generate *d = r->generate;
    ck_assert_str_eq(d->request_id, "req-1");
    ck_assert_str_eq(d->session_id, "sess-α");
    ck_assert_int_eq(d->prompt_case, RIVER__CLIENT__GENERATE__PROMPT_TEXT);
    ck_assert_str_eq(d->text, "In the beginning");
    ck_assert_float_eq(d->sampling->temperature, 0.7f);
    ck_assert_uint_eq(d->sampling->top_k, 40);
    ck_assert_int_eq(d->sampling->opt_seed_case, RIVER__CLIENT__SAMPLING__OPT_SEED_SEED);
    ck_assert_uint_eq(d->sampling->seed, 1234567890123ull);
    ck_assert_uint_eq(d->n_stop, 3);
    ck_assert_str_eq(d->stop[2], "é✓");
    ck_assert_str_eq(d->exit->policy, "cosine");
    ck_assert_int_eq(d->exit->opt_tau_case, RIVER__CLIENT__EXIT_OVERRIDE__OPT_TAU_TAU);
    ck_assert_float_eq(d->exit->tau, 0.0f);
    ck_assert_int_eq(d->exit->opt_theta_case, RIVER__CLIENT__EXIT_OVERRIDE__OPT_THETA__NOT_SET);
    ck_assert_int_eq(d->exit->exit_layer, 6);
    ck_assert_uint_eq(d->deadline_ms, 5000);
    ck_assert(d->ignore_eos);
    frame_free(&m);

    /* Token ids instead of text, no sampling (greedy), no seed. */
    River__Client__TokenIds t = RIVER__CLIENT__TOKEN_IDS__INIT;
    t.n_ids = 5;
    t.ids = ids;
    g.prompt_case = RIVER__CLIENT__GENERATE__PROMPT_TOKENS;
    g.tokens = &t;
    g.sampling = NULL;
    m = roundtrip(FRAME_CLIENT_REQUEST, &req.base);
    d = ((River__Client__ClientRequest *)m)->generate;
    ck_assert_int_eq(d->prompt_case, RIVER__CLIENT__GENERATE__PROMPT_TOKENS);
    ck_assert_uint_eq(d->tokens->n_ids, 5);
    ck_assert_int_eq(d->tokens->ids[2], 32000);
    ck_assert_ptr_null(d->sampling);
    frame_free(&m);

    River__Client__Cancel c = RIVER__CLIENT__CANCEL__INIT;
    c.request_id = "req-1";
    req.kind_case = RIVER__CLIENT__CLIENT_REQUEST__KIND_CANCEL;
    req.cancel = &c;
    m = roundtrip(FRAME_CLIENT_REQUEST, &req.base);
    ck_assert_str_eq(((River__Client__ClientRequest *)m)->cancel->request_id, "req-1");
    frame_free(&m);

    /* Replies: chunk, final, error. */
    River__Client__ClientReply rep = RIVER__CLIENT__CLIENT_REPLY__INIT;
    River__Client__TokenChunk ch = RIVER__CLIENT__TOKEN_CHUNK__INIT;
    ch.request_id = "req-1";
    ch.seq = 0;
    ch.text = " God created";
    ch.n_ids = 5;
    ch.ids = ids;
    ch.n_exit_layers = 5;
    ch.exit_layers = layers;
    rep.kind_case = RIVER__CLIENT__CLIENT_REPLY__KIND_CHUNK;
    rep.chunk = &ch;
    m = roundtrip(FRAME_CLIENT_REPLY, &rep.base);
    River__Client__TokenChunk *dc = ((River__Client__ClientReply *)m)->chunk;
    ck_assert_uint_eq(dc->n_exit_layers, 5);
    ck_assert_int_eq(dc->exit_layers[4], 31);
    ck_assert_str_eq(dc->text, " God created");
    frame_free(&m);

    River__Client__Usage u = RIVER__CLIENT__USAGE__INIT;
    u.prompt_tokens = 4;
    u.completion_tokens = 64;
    River__Client__ExitStats es = RIVER__CLIENT__EXIT_STATS__INIT;
    es.mean_exit_layer = 11.5f;
    es.n_histogram = 4;
    es.histogram = histogram;
    River__Client__Final fin = RIVER__CLIENT__FINAL__INIT;
    fin.request_id = "req-1";
    fin.reason = RIVER__CLIENT__FINAL__REASON__STOP;
    fin.usage = &u;
    fin.exit_stats = &es;
    rep.kind_case = RIVER__CLIENT__CLIENT_REPLY__KIND_FINAL;
    rep.final = &fin;
    m = roundtrip(FRAME_CLIENT_REPLY, &rep.base);
    River__Client__Final *df = ((River__Client__ClientReply *)m)->final;
    ck_assert_int_eq(df->reason, RIVER__CLIENT__FINAL__REASON__STOP);
    ck_assert_uint_eq(df->usage->completion_tokens, 64);
    ck_assert_uint_eq(df->exit_stats->histogram[2], 9);
    frame_free(&m);

    River__Client__Error err;
    frame_error_fill(&err, "req-1", RIVER__CLIENT__ERROR__CODE__DEADLINE_EXCEEDED, "late");
    rep.kind_case = RIVER__CLIENT__CLIENT_REPLY__KIND_ERROR;
    rep.error = &err;
    m = roundtrip(FRAME_CLIENT_REPLY, &rep.base);
    ck_assert_int_eq(((River__Client__ClientReply *)m)->error->code,
                     RIVER__CLIENT__ERROR__CODE__DEADLINE_EXCEEDED);
    ck_assert_str_eq(((River__Client__ClientReply *)m)->error->message, "late");
    frame_free(&m);
}
END_TEST

START_TEST(test_worker_roundtrip)
{
    River__Worker__WorkerMessage wm = RIVER__WORKER__WORKER_MESSAGE__INIT;
    ProtobufCMessage *m;

    River__Worker__Capabilities cap = RIVER__WORKER__CAPABILITIES__INIT;
    cap.model = "kjv-12l";
    cap.max_batch = 64;
    cap.max_seqs = 16;
    cap.kv_page_size = 16;
    cap.kv_pages_total = 4096;
    cap.kv_pages_free = 4000;
    cap.n_layers = 12;
    cap.layer_begin = 0;
    cap.layer_end = 8;
    cap.has_river = 1;
    cap.max_context = 2048;
    River__Worker__Ready ready = RIVER__WORKER__READY__INIT;
    ready.protocol = 1;
    ready.worker_id = "gpu0";
    ready.role = RIVER__WORKER__ROLE__ROLE_RIVER;
    ready.capabilities = &cap;
    wm.kind_case = RIVER__WORKER__WORKER_MESSAGE__KIND_READY;
    wm.ready = &ready;
    m = roundtrip(FRAME_WORKER_MESSAGE, &wm.base);
    River__Worker__Ready *dr = ((River__Worker__WorkerMessage *)m)->ready;
    ck_assert_int_eq(dr->role, RIVER__WORKER__ROLE__ROLE_RIVER);
    ck_assert_uint_eq(dr->capabilities->layer_end, 8);
    ck_assert_str_eq(dr->capabilities->model, "kjv-12l");
    frame_free(&m);

    River__Worker__Heartbeat hb = RIVER__WORKER__HEARTBEAT__INIT;
    hb.kv_pages_free = 17;
    hb.queue_length = 2;
    hb.running = 3;
    hb.draining = 1;
    wm.kind_case = RIVER__WORKER__WORKER_MESSAGE__KIND_HEARTBEAT;
    wm.heartbeat = &hb;
    m = roundtrip(FRAME_WORKER_MESSAGE, &wm.base);
    ck_assert_uint_eq(((River__Worker__WorkerMessage *)m)->heartbeat->kv_pages_free, 17);
    frame_free(&m);

    River__Worker__Tokens tk = RIVER__WORKER__TOKENS__INIT;
    tk.request_id = 99;
    tk.seq = 4;
    tk.index = 12;
    tk.n_ids = 5;
    tk.ids = ids;
    tk.text = "abc";
    tk.n_exit_layers = 5;
    tk.exit_layers = layers;
    wm.kind_case = RIVER__WORKER__WORKER_MESSAGE__KIND_TOKENS;
    wm.tokens = &tk;
    m = roundtrip(FRAME_WORKER_MESSAGE, &wm.base);
    ck_assert_uint_eq(((River__Worker__WorkerMessage *)m)->tokens->index, 12);
    frame_free(&m);

    River__Client__Final fin = RIVER__CLIENT__FINAL__INIT;
    fin.reason = RIVER__CLIENT__FINAL__REASON__EOS;
    River__Worker__Done done = RIVER__WORKER__DONE__INIT;
    done.request_id = 99;
    done.final = &fin;
    wm.kind_case = RIVER__WORKER__WORKER_MESSAGE__KIND_DONE;
    wm.done = &done;
    m = roundtrip(FRAME_WORKER_MESSAGE, &wm.base);
    ck_assert_int_eq(((River__Worker__WorkerMessage *)m)->done->final->reason,
                     RIVER__CLIENT__FINAL__REASON__EOS);
    frame_free(&m);

    River__Client__Error err;
    frame_error_fill(&err, NULL, RIVER__CLIENT__ERROR__CODE__RESOURCE_EXHAUSTED, "no pages");
    River__Worker__Failed failed = RIVER__WORKER__FAILED__INIT;
    failed.request_id = 99;
    failed.error = &err;
    wm.kind_case = RIVER__WORKER__WORKER_MESSAGE__KIND_FAILED;
    wm.failed = &failed;
    m = roundtrip(FRAME_WORKER_MESSAGE, &wm.base);
    ck_assert_str_eq(((River__Worker__WorkerMessage *)m)->failed->error->message, "no pages");
    frame_free(&m);

    River__Worker__DaemonMessage dm = RIVER__WORKER__DAEMON_MESSAGE__INIT;
    River__Worker__Welcome wel = RIVER__WORKER__WELCOME__INIT;
    wel.heartbeat_ms = 1000;
    wel.liveness = 3;
    dm.kind_case = RIVER__WORKER__DAEMON_MESSAGE__KIND_WELCOME;
    dm.welcome = &wel;
    m = roundtrip(FRAME_DAEMON_MESSAGE, &dm.base);
    ck_assert_uint_eq(((River__Worker__DaemonMessage *)m)->welcome->liveness, 3);
    frame_free(&m);

    /* An empty message still marks the case: the envelope is not empty on the wire. */
    River__Worker__DaemonHeartbeat dhb = RIVER__WORKER__DAEMON_HEARTBEAT__INIT;
    dm.kind_case = RIVER__WORKER__DAEMON_MESSAGE__KIND_HEARTBEAT;
    dm.heartbeat = &dhb;
    m = roundtrip(FRAME_DAEMON_MESSAGE, &dm.base);
    ck_assert_str_eq(frame_case_name(m), "heartbeat");
    frame_free(&m);

    River__Client__Sampling s;
    River__Client__ExitOverride x;
    River__Client__Generate g;
    fill_generate(&g, &s, &x);
    River__Worker__Submit sub = RIVER__WORKER__SUBMIT__INIT;
    sub.request_id = 1ull << 40;
    sub.generate = &g;
    sub.tokens_delivered = 5;
    sub.n_delivered_ids = 5;
    sub.delivered_ids = ids;
    dm.kind_case = RIVER__WORKER__DAEMON_MESSAGE__KIND_SUBMIT;
    dm.submit = &sub;
    m = roundtrip(FRAME_DAEMON_MESSAGE, &dm.base);
    River__Worker__Submit *ds = ((River__Worker__DaemonMessage *)m)->submit;
    ck_assert_uint_eq(ds->request_id, 1ull << 40);
    ck_assert_uint_eq(ds->tokens_delivered, 5);
    ck_assert_int_eq(ds->delivered_ids[1], 15043);
    ck_assert_str_eq(ds->generate->text, "In the beginning");
    frame_free(&m);

    River__Worker__Cancel wc = RIVER__WORKER__CANCEL__INIT;
    wc.request_id = 7;
    dm.kind_case = RIVER__WORKER__DAEMON_MESSAGE__KIND_CANCEL;
    dm.cancel = &wc;
    frame_free((m = roundtrip(FRAME_DAEMON_MESSAGE, &dm.base), &m));

    River__Worker__Drain dr2 = RIVER__WORKER__DRAIN__INIT;
    dr2.deadline_ms = 30000;
    dm.kind_case = RIVER__WORKER__DAEMON_MESSAGE__KIND_DRAIN;
    dm.drain = &dr2;
    m = roundtrip(FRAME_DAEMON_MESSAGE, &dm.base);
    ck_assert_uint_eq(((River__Worker__DaemonMessage *)m)->drain->deadline_ms, 30000);
    frame_free(&m);

    River__Worker__Reconnect rc = RIVER__WORKER__RECONNECT__INIT;
    rc.reason = "unknown worker";
    dm.kind_case = RIVER__WORKER__DAEMON_MESSAGE__KIND_RECONNECT;
    dm.reconnect = &rc;
    m = roundtrip(FRAME_DAEMON_MESSAGE, &dm.base);
    ck_assert_str_eq(((River__Worker__DaemonMessage *)m)->reconnect->reason, "unknown worker");
    frame_free(&m);
}
END_TEST

START_TEST(test_admin_roundtrip)
{
    ProtobufCMessage *m;
    River__Admin__AdminRequest rq = RIVER__ADMIN__ADMIN_REQUEST__INIT;
    rq.id = 42;

    River__Admin__StatusRequest st = RIVER__ADMIN__STATUS_REQUEST__INIT;
    rq.kind_case = RIVER__ADMIN__ADMIN_REQUEST__KIND_STATUS;
    rq.status = &st;
    m = roundtrip(FRAME_ADMIN_REQUEST, &rq.base);
    ck_assert_uint_eq(((River__Admin__AdminRequest *)m)->id, 42);
    frame_free(&m);

    River__Admin__WorkersRequest wr = RIVER__ADMIN__WORKERS_REQUEST__INIT;
    rq.kind_case = RIVER__ADMIN__ADMIN_REQUEST__KIND_WORKERS;
    rq.workers = &wr;
    frame_free((m = roundtrip(FRAME_ADMIN_REQUEST, &rq.base), &m));

    River__Admin__DrainRequest drq = RIVER__ADMIN__DRAIN_REQUEST__INIT;
    drq.worker_id = "gpu1";
    drq.deadline_ms = 100;
    rq.kind_case = RIVER__ADMIN__ADMIN_REQUEST__KIND_DRAIN;
    rq.drain = &drq;
    m = roundtrip(FRAME_ADMIN_REQUEST, &rq.base);
    ck_assert_str_eq(((River__Admin__AdminRequest *)m)->drain->worker_id, "gpu1");
    frame_free(&m);

    River__Admin__ScaleRequest sc = RIVER__ADMIN__SCALE_REQUEST__INIT;
    sc.workers = 4;
    rq.kind_case = RIVER__ADMIN__ADMIN_REQUEST__KIND_SCALE;
    rq.scale = &sc;
    m = roundtrip(FRAME_ADMIN_REQUEST, &rq.base);
    ck_assert_uint_eq(((River__Admin__AdminRequest *)m)->scale->workers, 4);
    frame_free(&m);

    River__Admin__ReloadRequest rl = RIVER__ADMIN__RELOAD_REQUEST__INIT;
    rq.kind_case = RIVER__ADMIN__ADMIN_REQUEST__KIND_RELOAD;
    rq.reload = &rl;
    frame_free((m = roundtrip(FRAME_ADMIN_REQUEST, &rq.base), &m));

    River__Admin__MetricsRequest mr = RIVER__ADMIN__METRICS_REQUEST__INIT;
    rq.kind_case = RIVER__ADMIN__ADMIN_REQUEST__KIND_METRICS;
    rq.metrics = &mr;
    frame_free((m = roundtrip(FRAME_ADMIN_REQUEST, &rq.base), &m));

    River__Admin__AdminReply rp = RIVER__ADMIN__ADMIN_REPLY__INIT;
    rp.id = 42;
    River__Admin__StatusReply sr = RIVER__ADMIN__STATUS_REPLY__INIT;
    sr.version = "0.1";
    sr.uptime_s = 3600;
    sr.workers_ready = 2;
    sr.workers_total = 3;
    sr.queue_length = 5;
    sr.queue_capacity = 256;
    sr.running = 7;
    sr.requests_total = 1000;
    sr.requests_failed = 3;
    sr.draining = 1;
    rp.kind_case = RIVER__ADMIN__ADMIN_REPLY__KIND_STATUS;
    rp.status = &sr;
    m = roundtrip(FRAME_ADMIN_REPLY, &rp.base);
    ck_assert_uint_eq(((River__Admin__AdminReply *)m)->status->requests_failed, 3);
    frame_free(&m);

    River__Worker__Capabilities cap = RIVER__WORKER__CAPABILITIES__INIT;
    cap.model = "m";
    River__Admin__WorkerInfo w0 = RIVER__ADMIN__WORKER_INFO__INIT, w1 = w0;
    w0.worker_id = "gpu0";
    w0.role = RIVER__WORKER__ROLE__ROLE_FULL;
    w0.state = RIVER__ADMIN__WORKER_INFO__STATE__READY;
    w0.capabilities = &cap;
    w0.supervised = 1;
    w1.worker_id = "gpu1";
    w1.state = RIVER__ADMIN__WORKER_INFO__STATE__DEAD;
    w1.missed_beats = 3;
    w1.last_seen_ms = 3500;
    River__Admin__WorkerInfo *wl[] = {&w0, &w1};
    River__Admin__WorkersReply wrp = RIVER__ADMIN__WORKERS_REPLY__INIT;
    wrp.n_workers = 2;
    wrp.workers = wl;
    rp.kind_case = RIVER__ADMIN__ADMIN_REPLY__KIND_WORKERS;
    rp.workers = &wrp;
    m = roundtrip(FRAME_ADMIN_REPLY, &rp.base);
    River__Admin__WorkersReply *dw = ((River__Admin__AdminReply *)m)->workers;
    ck_assert_uint_eq(dw->n_workers, 2);
    ck_assert_int_eq(dw->workers[1]->state, RIVER__ADMIN__WORKER_INFO__STATE__DEAD);
    ck_assert_str_eq(dw->workers[0]->capabilities->model, "m");
    frame_free(&m);

    River__Admin__DrainReply drp = RIVER__ADMIN__DRAIN_REPLY__INIT;
    drp.draining = 1;
    rp.kind_case = RIVER__ADMIN__ADMIN_REPLY__KIND_DRAIN;
    rp.drain = &drp;
    frame_free((m = roundtrip(FRAME_ADMIN_REPLY, &rp.base), &m));

    River__Admin__ScaleReply srp = RIVER__ADMIN__SCALE_REPLY__INIT;
    srp.previous = 2;
    srp.target = 4;
    rp.kind_case = RIVER__ADMIN__ADMIN_REPLY__KIND_SCALE;
    rp.scale = &srp;
    frame_free((m = roundtrip(FRAME_ADMIN_REPLY, &rp.base), &m));

    char *applied[] = {"queue_length", "limits.max_tokens"}, *restart[] = {"endpoints.clients"};
    River__Admin__ReloadReply rlp = RIVER__ADMIN__RELOAD_REPLY__INIT;
    rlp.n_applied = 2;
    rlp.applied = applied;
    rlp.n_needs_restart = 1;
    rlp.needs_restart = restart;
    rp.kind_case = RIVER__ADMIN__ADMIN_REPLY__KIND_RELOAD;
    rp.reload = &rlp;
    m = roundtrip(FRAME_ADMIN_REPLY, &rp.base);
    ck_assert_str_eq(((River__Admin__AdminReply *)m)->reload->applied[1], "limits.max_tokens");
    frame_free(&m);

    River__Admin__MetricsReply mrp = RIVER__ADMIN__METRICS_REPLY__INIT;
    mrp.text = "# TYPE river_requests_total counter\nriver_requests_total 1000\n";
    rp.kind_case = RIVER__ADMIN__ADMIN_REPLY__KIND_METRICS;
    rp.metrics = &mrp;
    frame_free((m = roundtrip(FRAME_ADMIN_REPLY, &rp.base), &m));

    River__Client__Error err;
    frame_error_fill(&err, "", RIVER__CLIENT__ERROR__CODE__UNAVAILABLE, "draining");
    rp.kind_case = RIVER__ADMIN__ADMIN_REPLY__KIND_ERROR;
    rp.error = &err;
    m = roundtrip(FRAME_ADMIN_REPLY, &rp.base);
    ck_assert_int_eq(((River__Admin__AdminReply *)m)->error->code,
                     RIVER__CLIENT__ERROR__CODE__UNAVAILABLE);
    frame_free(&m);
}
END_TEST

/* An encoded Generate request, the frame the error tests start from. */
static uint8_t *generate_frame(size_t *len)
{
    River__Client__Sampling s;
    River__Client__ExitOverride x;
    River__Client__Generate g;
    fill_generate(&g, &s, &x);
    River__Client__ClientRequest req = RIVER__CLIENT__CLIENT_REQUEST__INIT;
    req.kind_case = RIVER__CLIENT__CLIENT_REQUEST__KIND_GENERATE;
    req.generate = &g;
    uint8_t *buf;
    ck_assert_int_eq(frame_encode_buf(&req.base, &buf, len), 0);
    return buf;
}

START_TEST(test_oversize)
{
    size_t len;
    uint8_t *buf = generate_frame(&len);
    ProtobufCMessage *m = (ProtobufCMessage *)1;
    ck_assert_int_eq(frame_decode(FRAME_CLIENT_REQUEST, buf, len, len, &m), 0);
    frame_free(&m);
    river_err_clear();
    ck_assert_int_eq(frame_decode(FRAME_CLIENT_REQUEST, buf, len, len - 1, &m), RIVER_ERANGE);
    ck_assert_ptr_null(m);
    char limit[64];
    snprintf(limit, sizeof limit, "limit of %zu bytes", len - 1);
    ck_assert_msg(strstr(river_err_detail(), limit), "%s", river_err_detail());
    free(buf);

    /* The default limit applies when max_bytes is 0. */
    size_t big = FRAME_MAX_BYTES_DEFAULT + 1;
    uint8_t *zeros = calloc(1, big);
    ck_assert_int_eq(frame_decode(FRAME_CLIENT_REQUEST, zeros, big, 0, &m), RIVER_ERANGE);
    ck_assert_ptr_nonnull(strstr(river_err_detail(), "1048576"));
    free(zeros);
}
END_TEST

START_TEST(test_truncated)
{
    size_t len;
    uint8_t *buf = generate_frame(&len);
    /* The envelope holds one length-prefixed field, so every strict prefix is broken. */
    for (size_t n = 0; n < len; n++) {
        ProtobufCMessage *m = (ProtobufCMessage *)1;
        river_err_clear();
        int rc = frame_decode(FRAME_CLIENT_REQUEST, buf, n, 0, &m);
        ck_assert_msg(rc == RIVER_EPROTO, "prefix %zu of %zu: rc %d", n, len, rc);
        ck_assert_ptr_null(m);
        ck_assert_str_ne(river_err_detail(), "no detail");
    }
    ck_assert_int_eq(frame_decode(FRAME_CLIENT_REQUEST, buf, len - 1, 0,
                                  &(ProtobufCMessage *){NULL}),
                     RIVER_EPROTO);
    ck_assert_msg(strstr(river_err_detail(), "truncated"), "%s", river_err_detail());
    ck_assert_msg(strstr(river_err_detail(), "ClientRequest.generate"), "%s",
                  river_err_detail());
    free(buf);
}
END_TEST

static void expect_proto_error(frame_kind_t kind, const void *data, size_t len,
                               const char *needle)
{
    ProtobufCMessage *m = (ProtobufCMessage *)1;
    river_err_clear();
    int rc = frame_decode(kind, data, len, 0, &m);
    ck_assert_msg(rc == RIVER_EPROTO, "rc %d for '%s'", rc, needle);
    ck_assert_ptr_null(m);
    ck_assert_msg(strstr(river_err_detail(), needle), "'%s' lacks '%s'", river_err_detail(),
                  needle);
}

START_TEST(test_garbage)
{
    static const uint8_t ff[] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
                                 0xff};
    expect_proto_error(FRAME_CLIENT_REQUEST, ff, sizeof ff, "bad or truncated field tag");
    static const uint8_t field0[] = {0x02, 0x00};
    expect_proto_error(FRAME_CLIENT_REQUEST, field0, sizeof field0, "invalid field number 0");
    static const uint8_t wt7[] = {0x0f};
    expect_proto_error(FRAME_CLIENT_REPLY, wt7, sizeof wt7, "wire type");
    /* Field 1 (generate, a message) sent as a varint. */
    static const uint8_t wrong_wt[] = {0x08, 0x01};
    expect_proto_error(FRAME_CLIENT_REQUEST, wrong_wt, sizeof wrong_wt,
                       "generate: wire type 0");
    /* Inside generate: field 3 (text) claims 100 bytes. */
    static const uint8_t inner[] = {0x0a, 0x03, 0x1a, 0x64, 'a'};
    expect_proto_error(FRAME_CLIENT_REQUEST, inner, sizeof inner,
                       "ClientRequest.generate.text: truncated, 100 bytes");
    /* Plain text is not a frame. */
    const char *hello = "GET / HTTP/1.1\r\n\r\n";
    expect_proto_error(FRAME_ADMIN_REQUEST, hello, strlen(hello), "AdminRequest");
}
END_TEST

START_TEST(test_unknown_kind)
{
    /* Field 15, an empty message: a kind from a newer peer. */
    static const uint8_t unknown[] = {0x7a, 0x00};
    for (int k = 0; k < FRAME_KIND_COUNT; k++)
        expect_proto_error(k, unknown, sizeof unknown, "unknown message kind (field 15)");
    /* No kind at all: an empty frame, or only the admin id. */
    expect_proto_error(FRAME_WORKER_MESSAGE, "", 0, "WorkerMessage frame carries no message");
    static const uint8_t id_only[] = {0x08, 0x2a};
    expect_proto_error(FRAME_ADMIN_REQUEST, id_only, sizeof id_only, "carries no message");
    ck_assert_int_eq(frame_decode(FRAME_KIND_COUNT, unknown, 2, 0,
                                  &(ProtobufCMessage *){NULL}),
                     RIVER_EINVAL);
}
END_TEST

START_TEST(test_bad_utf8)
{
    River__Client__Sampling s;
    River__Client__ExitOverride x;
    River__Client__Generate g;
    fill_generate(&g, &s, &x);
    char *bad_stops[] = {"ok", "bad\xc3("};
    g.n_stop = 2;
    g.stop = bad_stops;
    River__Client__ClientRequest req = RIVER__CLIENT__CLIENT_REQUEST__INIT;
    req.kind_case = RIVER__CLIENT__CLIENT_REQUEST__KIND_GENERATE;
    req.generate = &g;
    uint8_t *buf;
    size_t len;
    ck_assert_int_eq(frame_encode_buf(&req.base, &buf, &len), 0);
    expect_proto_error(FRAME_CLIENT_REQUEST, buf, len,
                       "ClientRequest.generate.stop[1] is not valid UTF-8");
    free(buf);

    /* Surrogates and overlong forms are not UTF-8 either. */
    g.stop = stops;
    g.n_stop = 1;
    const char *bad[] = {"\xed\xa0\x80", "\xc0\xaf", "\xf4\x90\x80\x80", "\xe2\x82"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        g.text = (char *)bad[i];
        ck_assert_int_eq(frame_encode_buf(&req.base, &buf, &len), 0);
        expect_proto_error(FRAME_CLIENT_REQUEST, buf, len, "generate.text is not valid UTF-8");
        free(buf);
    }
}
END_TEST

START_TEST(test_encode_errors)
{
    uint8_t *buf = (uint8_t *)1;
    size_t len = 1;
    River__Client__ClientRequest req = RIVER__CLIENT__CLIENT_REQUEST__INIT;
    ck_assert_int_eq(frame_encode_buf(&req.base, &buf, &len), RIVER_EINVAL);
    ck_assert_ptr_null(buf);
    ck_assert_ptr_nonnull(strstr(river_err_detail(), "carries no message"));
    req.kind_case = RIVER__CLIENT__CLIENT_REQUEST__KIND_CANCEL; /* and cancel == NULL */
    ck_assert_int_eq(frame_encode_buf(&req.base, &buf, &len), RIVER_EINVAL);

    River__Client__Cancel c = RIVER__CLIENT__CANCEL__INIT;
    ck_assert_int_eq(frame_encode_buf(&c.base, &buf, &len), RIVER_EINVAL);
    ck_assert_ptr_nonnull(strstr(river_err_detail(), "not an envelope"));
    ck_assert_int_eq(frame_kind_of(&c.base), -1);
    ck_assert_str_eq(frame_case_name(&c.base), "?");
    ck_assert_uint_eq(frame_size(&c.base), 0);

    /* A NULL entry in a repeated string would crash packing; it is refused instead. */
    River__Client__Generate g = RIVER__CLIENT__GENERATE__INIT;
    char *stop[] = {"a", NULL};
    g.n_stop = 2;
    g.stop = stop;
    req.kind_case = RIVER__CLIENT__CLIENT_REQUEST__KIND_GENERATE;
    req.generate = &g;
    zmq_msg_t zm;
    ck_assert_int_eq(frame_encode_msg(&req.base, &zm), RIVER_EINVAL);
    zmq_msg_close(&zm);

    ck_assert_str_eq(frame_kind_name(FRAME_DAEMON_MESSAGE), "DaemonMessage");
    ck_assert_str_eq(frame_kind_name(FRAME_KIND_COUNT), "?");
}
END_TEST

START_TEST(test_error_reply)
{
    const River__Client__Error__Code bad_arg = RIVER__CLIENT__ERROR__CODE__INVALID_ARGUMENT;
    ck_assert_int_eq(frame_error_code(0), RIVER__CLIENT__ERROR__CODE__OK);
    ck_assert_int_eq(frame_error_code(RIVER_EPROTO), bad_arg);
    ck_assert_int_eq(frame_error_code(RIVER_ERANGE), bad_arg);
    ck_assert_int_eq(frame_error_code(RIVER_EFULL),
                     RIVER__CLIENT__ERROR__CODE__RESOURCE_EXHAUSTED);
    ck_assert_int_eq(frame_error_code(RIVER_ETIMEOUT),
                     RIVER__CLIENT__ERROR__CODE__DEADLINE_EXCEEDED);
    ck_assert_int_eq(frame_error_code(RIVER_ECANCELED), RIVER__CLIENT__ERROR__CODE__CANCELLED);
    ck_assert_int_eq(frame_error_code(RIVER_EIO), RIVER__CLIENT__ERROR__CODE__INTERNAL);
    ck_assert_int_eq(frame_error_code(-9999), RIVER__CLIENT__ERROR__CODE__INTERNAL);

    /* The reply to a bad frame, as riverd builds it. */
    static const uint8_t junk[] = {0xff};
    ProtobufCMessage *m;
    int rc = frame_decode(FRAME_CLIENT_REQUEST, junk, 1, 0, &m);
    ck_assert_int_eq(rc, RIVER_EPROTO);
    char detail[1024];
    snprintf(detail, sizeof detail, "%s", river_err_detail());
    zmq_msg_t out;
    ck_assert_int_eq(frame_error_reply(NULL, frame_error_code(rc), detail, &out), 0);
    ck_assert_int_eq(frame_decode_msg(FRAME_CLIENT_REPLY, &out, 0, &m), 0);
    zmq_msg_close(&out);
    River__Client__ClientReply *r = (River__Client__ClientReply *)m;
    ck_assert_int_eq(r->kind_case, RIVER__CLIENT__CLIENT_REPLY__KIND_ERROR);
    ck_assert_int_eq(r->error->code, RIVER__CLIENT__ERROR__CODE__INVALID_ARGUMENT);
    ck_assert_str_eq(r->error->request_id, "");
    ck_assert_str_eq(r->error->message, detail);
    frame_free(&m);

    /* Whatever the message holds, the reply is a valid frame: bad bytes become '?', and
     * a long message is cut at a character boundary. */
    char big[3000];
    size_t o = 0;
    big[o++] = '\xff';
    while (o + 2 < sizeof big) {
        big[o++] = '\xc3';
        big[o++] = '\xa9'; /* é */
    }
    big[o] = '\0';
    rc = frame_error_reply("id\x80", RIVER__CLIENT__ERROR__CODE__INTERNAL, big, &out);
    ck_assert_int_eq(rc, 0);
    ck_assert_int_eq(frame_decode_msg(FRAME_CLIENT_REPLY, &out, 0, &m), 0);
    zmq_msg_close(&out);
    r = (River__Client__ClientReply *)m;
    ck_assert_str_eq(r->error->request_id, "id?");
    ck_assert_int_eq(r->error->message[0], '?');
    ck_assert_uint_le(strlen(r->error->message), 1023);
    ck_assert_uint_ge(strlen(r->error->message), 1020);
    frame_free(&m);
}
END_TEST

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rng(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

/* 10,000 frames of random bytes and of valid frames with random damage (flipped bytes,
 * cuts, insertions), decoded as every kind: each must either decode to a message that
 * encodes again, or fail with RIVER_EPROTO and a detail. Check runs each test in its own
 * process, so a crash fails the test instead of the run. */
START_TEST(test_fuzz)
{
    size_t len[4];
    uint8_t *seeds[4];
    seeds[0] = generate_frame(&len[0]);
    {
        River__Client__TokenChunk ch = RIVER__CLIENT__TOKEN_CHUNK__INIT;
        ch.request_id = "r";
        ch.text = "tokens";
        ch.n_ids = 5;
        ch.ids = ids;
        ch.n_exit_layers = 5;
        ch.exit_layers = layers;
        River__Client__ClientReply rep = RIVER__CLIENT__CLIENT_REPLY__INIT;
        rep.kind_case = RIVER__CLIENT__CLIENT_REPLY__KIND_CHUNK;
        rep.chunk = &ch;
        ck_assert_int_eq(frame_encode_buf(&rep.base, &seeds[1], &len[1]), 0);
    }
    {
        River__Client__Sampling s;
        River__Client__ExitOverride x;
        River__Client__Generate g;
        fill_generate(&g, &s, &x);
        River__Worker__Submit sub = RIVER__WORKER__SUBMIT__INIT;
        sub.request_id = 5;
        sub.generate = &g;
        sub.n_delivered_ids = 5;
        sub.delivered_ids = ids;
        River__Worker__DaemonMessage dm = RIVER__WORKER__DAEMON_MESSAGE__INIT;
        dm.kind_case = RIVER__WORKER__DAEMON_MESSAGE__KIND_SUBMIT;
        dm.submit = &sub;
        ck_assert_int_eq(frame_encode_buf(&dm.base, &seeds[2], &len[2]), 0);
    }
    {
        River__Worker__Capabilities cap = RIVER__WORKER__CAPABILITIES__INIT;
        cap.model = "model";
        cap.n_layers = 12;
        River__Admin__WorkerInfo w = RIVER__ADMIN__WORKER_INFO__INIT;
        w.worker_id = "w";
        w.capabilities = &cap;
        River__Admin__WorkerInfo *wl[] = {&w, &w, &w};
        River__Admin__WorkersReply wr = RIVER__ADMIN__WORKERS_REPLY__INIT;
        wr.n_workers = 3;
        wr.workers = wl;
        River__Admin__AdminReply rp = RIVER__ADMIN__ADMIN_REPLY__INIT;
        rp.kind_case = RIVER__ADMIN__ADMIN_REPLY__KIND_WORKERS;
        rp.workers = &wr;
        ck_assert_int_eq(frame_encode_buf(&rp.base, &seeds[3], &len[3]), 0);
    }
    static const frame_kind_t seed_kind[4] = {FRAME_CLIENT_REQUEST, FRAME_CLIENT_REPLY,
                                              FRAME_DAEMON_MESSAGE, FRAME_ADMIN_REPLY};

    uint8_t buf[1024];
    int decoded = 0, refused = 0;
    for (int i = 0; i < 10000; i++) {
        size_t n;
        frame_kind_t kind;
        if (i % 2 == 0) {
            n = rng() % 300;
            for (size_t j = 0; j < n; j++)
                buf[j] = (uint8_t)rng();
            kind = (frame_kind_t)(rng() % FRAME_KIND_COUNT);
        } else {
            int s = (int)(rng() % 4);
            n = len[s];
            memcpy(buf, seeds[s], n);
            kind = rng() % 4 ? seed_kind[s] : (frame_kind_t)(rng() % FRAME_KIND_COUNT);
            int edits = 1 + (int)(rng() % 4);
            for (int e = 0; e < edits; e++) {
                switch (rng() % 4) {
                case 0: /* flip a byte */
                    buf[rng() % n] ^= (uint8_t)(1 + rng() % 255);
                    break;
                case 1: /* cut */
                    n = rng() % (n + 1);
                    break;
                case 2: /* insert a byte */
                    if (n + 1 < sizeof buf) {
                        size_t at = rng() % (n + 1);
                        memmove(buf + at + 1, buf + at, n - at);
                        buf[at] = (uint8_t)rng();
                        n++;
                    }
                    break;
                default: /* set a byte to a varint continuation */
                    if (n)
                        buf[rng() % n] |= 0x80;
                    break;
                }
                if (n == 0)
                    break;
            }
        }
        ProtobufCMessage *m = NULL;
        river_err_clear();
        int rc = frame_decode(kind, buf, n, 0, &m);
        if (rc == 0) {
            uint8_t *again;
            size_t len2;
            ck_assert_ptr_nonnull(m);
            ck_assert_int_eq(frame_kind_of(m), kind);
            ck_assert_int_eq(frame_encode_buf(m, &again, &len2), 0);
            free(again);
            frame_free(&m);
            decoded++;
        } else {
            ck_assert_msg(rc == RIVER_EPROTO, "iteration %d: rc %d", i, rc);
            ck_assert_ptr_null(m);
            ck_assert_str_ne(river_err_detail(), "no detail");
            refused++;
        }
    }
    /* Both paths ran: damage that keeps a frame valid is common (a flipped id). */
    ck_assert_int_gt(decoded, 100);
    ck_assert_int_gt(refused, 1000);
    for (int s = 0; s < 4; s++)
        free(seeds[s]);
}
END_TEST

static Suite *frame_suite(void)
{
    Suite *s = suite_create("frame");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_client_roundtrip);
    tcase_add_test(tc, test_worker_roundtrip);
    tcase_add_test(tc, test_admin_roundtrip);
    tcase_add_test(tc, test_oversize);
    tcase_add_test(tc, test_truncated);
    tcase_add_test(tc, test_garbage);
    tcase_add_test(tc, test_unknown_kind);
    tcase_add_test(tc, test_bad_utf8);
    tcase_add_test(tc, test_encode_errors);
    tcase_add_test(tc, test_error_reply);
    tcase_add_test(tc, test_fuzz);
    suite_add_tcase(s, tc);
    return s;
}

RIVER_TEST_MAIN(frame_suite)
