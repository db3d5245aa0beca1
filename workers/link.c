#include "workers/link.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include <zmq.h>

#include "common/clock.h"
#include "common/err.h"
#include "common/frame.h"
#include "common/log.h"

/* Frames handled per link_recv: enough to empty the socket in normal traffic, few enough
 * that a flood of frames cannot hold the engine up for long. */
#define LINK_RECV_BATCH 256
/* Bounds on what riverd's Welcome may ask for; outside them the link keeps its values. */
#define LINK_HEARTBEAT_MIN_MS 10
#define LINK_HEARTBEAT_MAX_MS 3600000
#define LINK_LIVENESS_MAX 1000
/* The reconnection cap when the configuration gives none (reconnect.backoff_max). */
#define LINK_BACKOFF_MAX_DEFAULT_MS 5000
/* Handshake failures that mean riverd refuses this worker, as opposed to a connection
 * that broke: its key is not allowed, or the two ends do not speak the same mechanism. */
#define LINK_REFUSAL_EVENTS                                                               \
    (ZMQ_EVENT_HANDSHAKE_FAILED_AUTH | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |               \
     ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL)

struct link {
    void *zctx;
    void *sock;               /* NULL while waiting to reconnect */
    link_config_t cfg;        /* endpoint and id point at the copies below */
    char *endpoint, *worker_id, *model; /* owned copies */
    link_handlers_t h;
    int64_t heartbeat_ms;     /* current interval: the configured one, then Welcome's */
    int liveness;
    int64_t backoff_ms;       /* wait before the next reconnection, before jitter */
    uint64_t jitter_state;    /* xorshift state of the jitter, seeded per process */
    int64_t last_recv_ms;     /* anything heard from riverd (or the time of connecting) */
    int64_t last_beat_ms;     /* last Heartbeat sent */
    int64_t reconnect_at_ms;  /* sock == NULL: when to open a new one */
    bool welcomed;
    uint64_t dropped;         /* frames that could not be sent */
    /* CurveZMQ keys, Z85; curve false: the NULL mechanism. */
    bool curve;
    char curve_public[41], curve_secret[41], curve_server[41];
    void *monitor;            /* the handshake failures of sock */
    unsigned monitors;        /* monitors made, for their endpoint names */
};

/* ---- Sending ---- */

static int link__send(link_t *l, River__Worker__WorkerMessage *env)
{
    if (!l->sock) {
        l->dropped++;
        return RIVER_ESTATE;
    }
    zmq_msg_t m;
    int e = frame_encode_msg(&env->base, &m);
    if (e) {
        zmq_msg_close(&m);
        log_error("cannot encode %s: %s", frame_case_name(&env->base),
                  river_err_detail());
        return e;
    }
    /* Never block the engine on the network: the socket has no high-water mark, so a send
     * only fails when the socket itself is broken. */
    if (zmq_msg_send(&m, l->sock, ZMQ_DONTWAIT) < 0) {
        int err = errno;
        zmq_msg_close(&m);
        if (l->dropped++ % 1000 == 0)
            log_warn("cannot send %s to riverd: %s (%llu dropped so far)",
                     frame_case_name(&env->base), zmq_strerror(err),
                     (unsigned long long)l->dropped);
        return river_err_set(RIVER_ESYS, "zmq_msg_send: %s", zmq_strerror(err));
    }
    return 0;
}

static int link__send_ready(link_t *l)
{
    link_status_t st = {0};
    l->h.status(l->h.user, &st);
    River__Worker__Capabilities caps = l->cfg.caps;
    caps.kv_pages_free = st.kv_pages_free;
    River__Worker__Ready ready = RIVER__WORKER__READY__INIT;
    ready.protocol = LINK_PROTOCOL;
    ready.worker_id = l->worker_id;
    ready.role = l->cfg.role;
    ready.capabilities = &caps;
    River__Worker__WorkerMessage env = RIVER__WORKER__WORKER_MESSAGE__INIT;
    env.kind_case = RIVER__WORKER__WORKER_MESSAGE__KIND_READY;
    env.ready = &ready;
    l->welcomed = false;
    return link__send(l, &env);
}

int link_send_heartbeat(link_t *l)
{
    link_status_t st = {0};
    l->h.status(l->h.user, &st);
    River__Worker__Heartbeat hb = RIVER__WORKER__HEARTBEAT__INIT;
    hb.kv_pages_free = st.kv_pages_free;
    hb.queue_length = st.queue_length;
    hb.running = st.running;
    hb.draining = st.draining;
    hb.unavailable = st.unavailable;
    hb.prefix_cache_pages = st.prefix_cache_pages;
    hb.n_prefix_pages = st.n_prefix_pages;
    hb.prefix_pages = st.prefix_pages;
    River__Worker__WorkerMessage env = RIVER__WORKER__WORKER_MESSAGE__INIT;
    env.kind_case = RIVER__WORKER__WORKER_MESSAGE__KIND_HEARTBEAT;
    env.heartbeat = &hb;
    l->last_beat_ms = clock_now_ms();
    return link__send(l, &env);
}

int link_send_tokens(link_t *l, uint64_t request_id, uint64_t seq, uint32_t index,
                     const int32_t *ids, const int32_t *exit_layers, size_t n,
                     const char *text, River__Client__TokenLogprob **logprobs)
{
    River__Worker__Tokens t = RIVER__WORKER__TOKENS__INIT;
    t.request_id = request_id;
    t.seq = seq;
    t.index = index;
    t.n_ids = n;
    t.ids = (int32_t *)ids;
    t.n_exit_layers = n;
    t.exit_layers = (int32_t *)exit_layers;
    t.text = (char *)(text ? text : "");
    if (logprobs) {
        t.n_logprobs = n;
        t.logprobs = logprobs;
    }
    River__Worker__WorkerMessage env = RIVER__WORKER__WORKER_MESSAGE__INIT;
    env.kind_case = RIVER__WORKER__WORKER_MESSAGE__KIND_TOKENS;
    env.tokens = &t;
    return link__send(l, &env);
}

int link_send_done(link_t *l, uint64_t request_id, River__Client__Final *final)
{
    River__Worker__Done d = RIVER__WORKER__DONE__INIT;
    d.request_id = request_id;
    d.final = final;
    River__Worker__WorkerMessage env = RIVER__WORKER__WORKER_MESSAGE__INIT;
    env.kind_case = RIVER__WORKER__WORKER_MESSAGE__KIND_DONE;
    env.done = &d;
    return link__send(l, &env);
}

int link_send_failed(link_t *l, uint64_t request_id, River__Client__Error__Code code,
                     const char *message)
{
    River__Client__Error err = RIVER__CLIENT__ERROR__INIT;
    /* Error.message is bounded like the ones riverd sends to clients. */
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", message ? message : "");
    frame_error_fill(&err, "", code, msg);
    River__Worker__Failed f = RIVER__WORKER__FAILED__INIT;
    f.request_id = request_id;
    f.error = &err;
    River__Worker__WorkerMessage env = RIVER__WORKER__WORKER_MESSAGE__INIT;
    env.kind_case = RIVER__WORKER__WORKER_MESSAGE__KIND_FAILED;
    env.failed = &f;
    return link__send(l, &env);
}

/* ---- Connection ---- */

/* Watches the handshakes of s, so that a refusal by riverd is logged as one: without it
 * the worker would only see riverd stay silent. */
static int link__monitor(link_t *l, void *s)
{
    char endpoint[64];
    snprintf(endpoint, sizeof endpoint, "inproc://river-link-monitor-%u", l->monitors++);
    if (zmq_socket_monitor(s, endpoint, LINK_REFUSAL_EVENTS) != 0)
        return river_err_set(RIVER_ESYS, "zmq_socket_monitor: %s", zmq_strerror(errno));
    void *m = zmq_socket(l->zctx, ZMQ_PAIR);
    if (!m || zmq_connect(m, endpoint) != 0) {
        int err = errno;
        if (m)
            zmq_close(m);
        return river_err_set(RIVER_ESYS, "monitor: %s", zmq_strerror(err));
    }
    l->monitor = m;
    return 0;
}

static void link__close_monitor(link_t *l)
{
    if (l->monitor)
        zmq_close(l->monitor);
    l->monitor = NULL;
}

/* The routing id riverd sends to. Plain, the worker's id. With CURVE, the worker's id and 16
 * random bytes, new for each connection: riverd's worker socket hands a routing id over to
 * whoever connects with it (so that a restarted worker gets its name back), and an id
 * anyone could guess would let any key riverd accepts on another endpoint (a client's)
 * take over a worker's connection, and the prompts riverd sends it, even though riverd
 * refuses every message such a peer sends. riverd knows a worker by Ready's worker_id,
 * and takes a Ready with a known id from a new connection as that worker coming back. */
static int link__routing_id(const link_t *l, char *out, size_t cap)
{
    if (!l->curve) {
        snprintf(out, cap, "%s", l->worker_id);
        return 0;
    }
    uint8_t r[16];
    ssize_t n = getrandom(r, sizeof r, 0);
    if (n != (ssize_t)sizeof r)
        return river_err_set(RIVER_ESYS, "getrandom: %s", n < 0 ? strerror(errno) : "short");
    /* ZMQ takes at most 255 bytes; the id keeps what fits beside the 33 of the suffix. */
    int k = snprintf(out, cap, "%.222s#", l->worker_id);
    for (size_t i = 0; i < sizeof r && k > 0 && (size_t)k + 2 < cap; i++)
        k += snprintf(out + k, cap - (size_t)k, "%02x", r[i]);
    return 0;
}

static int link__connect(link_t *l, int64_t now)
{
    char routing_id[256];
    int e = link__routing_id(l, routing_id, sizeof routing_id);
    if (e)
        return e;
    void *s = zmq_socket(l->zctx, ZMQ_DEALER);
    if (!s)
        return river_err_set(RIVER_ESYS, "zmq_socket: %s", zmq_strerror(errno));
    int zero = 0;
    /* Unsent frames of a dead connection are worthless: riverd re-dispatches their
     * requests, so closing never waits for them (link_destroy sets its own linger). */
    if (zmq_setsockopt(s, ZMQ_ROUTING_ID, routing_id, strlen(routing_id)) ||
        zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero) ||
        zmq_setsockopt(s, ZMQ_SNDHWM, &zero, sizeof zero) ||
        zmq_setsockopt(s, ZMQ_RCVHWM, &zero, sizeof zero) ||
        (l->curve && (zmq_setsockopt(s, ZMQ_CURVE_SERVERKEY, l->curve_server, 40) ||
                      zmq_setsockopt(s, ZMQ_CURVE_PUBLICKEY, l->curve_public, 40) ||
                      zmq_setsockopt(s, ZMQ_CURVE_SECRETKEY, l->curve_secret, 40)))) {
        int err = errno;
        zmq_close(s);
        return river_err_set(RIVER_ESYS, "zmq_setsockopt: %s", zmq_strerror(err));
    }
    e = link__monitor(l, s);
    if (e) {
        zmq_close(s);
        return e;
    }
    if (zmq_connect(s, l->endpoint)) {
        int err = errno;
        zmq_close(s);
        link__close_monitor(l);
        return river_err_set(RIVER_ESYS, "connecting to %s: %s", l->endpoint,
                             zmq_strerror(err));
    }
    l->sock = s;
    l->last_recv_ms = now; /* riverd gets a full liveness period to answer */
    l->last_beat_ms = now;
    return link__send_ready(l);
}

/* The next wait before reconnecting: the current back-off with "equal jitter" (a uniform
 * draw between half of it and all of it, so that workers cut off at the same moment spread
 * their attempts), and the back-off doubled for the time after, never past the cap. */
static int64_t link__next_backoff(link_t *l)
{
    uint64_t x = l->jitter_state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    l->jitter_state = x;
    int64_t b = l->backoff_ms, half = b / 2;
    int64_t wait = half + (int64_t)(x % (uint64_t)(b - half + 1));
    l->backoff_ms = b * 2 > l->cfg.backoff_max_ms ? l->cfg.backoff_max_ms : b * 2;
    return wait;
}

/* riverd is gone as far as this worker can tell: forget its requests, close the socket
 * and come back after the back-off. */
static void link__disconnect(link_t *l, int64_t now, const char *why)
{
    int64_t wait = link__next_backoff(l);
    log_warn("%s; reconnecting to %s in %lld ms", why, l->endpoint, (long long)wait);
    l->h.reset(l->h.user, why);
    if (l->sock)
        zmq_close(l->sock);
    l->sock = NULL;
    link__close_monitor(l);
    l->welcomed = false;
    l->reconnect_at_ms = now + wait;
}

int link_new(link_t **out, void *zctx, const link_config_t *cfg, const link_handlers_t *h)
{
    size_t id_len = strlen(cfg->worker_id);
    if (id_len == 0 || id_len > 255)
        return river_err_set(RIVER_EINVAL, "worker id must have 1 to 255 bytes, not %zu",
                             id_len);
    if (cfg->heartbeat_ms <= 0 || cfg->liveness <= 0)
        return river_err_set(RIVER_EINVAL, "heartbeat %lld ms, liveness %d",
                             (long long)cfg->heartbeat_ms, cfg->liveness);
    link_t *l = calloc(1, sizeof *l);
    if (!l)
        return river_err_set(RIVER_ENOMEM, "link");
    l->endpoint = strdup(cfg->endpoint);
    l->worker_id = strdup(cfg->worker_id);
    l->model = strdup(cfg->caps.model ? cfg->caps.model : "");
    int e = RIVER_ENOMEM;
    if (!l->endpoint || !l->worker_id || !l->model) {
        river_err_set(e, "link: endpoint and id");
        goto fail;
    }
    l->zctx = zctx;
    l->cfg = *cfg;
    l->cfg.endpoint = l->endpoint;
    l->cfg.worker_id = l->worker_id;
    l->cfg.caps.model = l->model;
    if (l->cfg.backoff_max_ms <= 0)
        l->cfg.backoff_max_ms = LINK_BACKOFF_MAX_DEFAULT_MS;
    l->h = *h;
    if (cfg->curve_public && cfg->curve_secret && cfg->curve_server) {
        if (strlen(cfg->curve_public) != 40 || strlen(cfg->curve_secret) != 40 ||
            strlen(cfg->curve_server) != 40) {
            e = river_err_set(RIVER_EINVAL, "CURVE keys must be 40 characters of Z85");
            goto fail;
        }
        l->curve = true;
        memcpy(l->curve_public, cfg->curve_public, 41);
        memcpy(l->curve_secret, cfg->curve_secret, 41);
        memcpy(l->curve_server, cfg->curve_server, 41);
    }
    l->cfg.curve_public = l->cfg.curve_secret = l->cfg.curve_server = NULL;
    l->heartbeat_ms = cfg->heartbeat_ms;
    l->liveness = cfg->liveness;
    l->backoff_ms = cfg->heartbeat_ms;
    if (l->backoff_ms > l->cfg.backoff_max_ms)
        l->backoff_ms = l->cfg.backoff_max_ms;
    /* The jitter needs no secrecy, only a different sequence in each worker. */
    if (getrandom(&l->jitter_state, sizeof l->jitter_state, 0) !=
            (ssize_t)sizeof l->jitter_state ||
        !l->jitter_state)
        l->jitter_state = (uint64_t)clock_now_ms() * 0x9e3779b97f4a7c15ull | 1;
    *out = l;
    return 0;
fail:
    free(l->endpoint);
    free(l->worker_id);
    free(l->model);
    free(l);
    return e;
}

int link_start(link_t *l)
{
    int e = link__connect(l, clock_now_ms());
    if (e && !l->sock)
        return e;
    log_info("connected to %s, Ready sent", l->endpoint);
    return 0;
}

void link_destroy(link_t **lp)
{
    link_t *l = *lp;
    if (!l)
        return;
    if (l->sock) {
        int linger = l->cfg.linger_ms;
        zmq_setsockopt(l->sock, ZMQ_LINGER, &linger, sizeof linger);
        zmq_close(l->sock);
    }
    link__close_monitor(l);
    memset(l->curve_secret, 0, sizeof l->curve_secret);
    free(l->endpoint);
    free(l->worker_id);
    free(l->model);
    free(l);
    *lp = NULL;
}

void *link_socket(const link_t *l) { return l->sock; }
bool link_welcomed(const link_t *l) { return l->welcomed; }

/* ---- Receiving: one handler per DaemonMessage kind ---- */

static void link__on_welcome(link_t *l, const River__Worker__DaemonMessage *m)
{
    const River__Worker__Welcome *w = m->welcome;
    if (w->heartbeat_ms >= LINK_HEARTBEAT_MIN_MS && w->heartbeat_ms <= LINK_HEARTBEAT_MAX_MS)
        l->heartbeat_ms = w->heartbeat_ms;
    else if (w->heartbeat_ms)
        log_warn("Welcome: heartbeat %u ms out of [%d, %d]; keeping %lld ms",
                 w->heartbeat_ms, LINK_HEARTBEAT_MIN_MS, LINK_HEARTBEAT_MAX_MS,
                 (long long)l->heartbeat_ms);
    if (w->liveness >= 1 && w->liveness <= LINK_LIVENESS_MAX)
        l->liveness = (int)w->liveness;
    /* Reconnection backs off from riverd's interval: what it expects of its workers. */
    l->backoff_ms = l->heartbeat_ms < l->cfg.backoff_max_ms ? l->heartbeat_ms
                                                            : l->cfg.backoff_max_ms;
    l->welcomed = true;
    log_info("welcomed by riverd: heartbeat %lld ms, liveness %d",
             (long long)l->heartbeat_ms, l->liveness);
}

static void link__on_heartbeat(link_t *l, const River__Worker__DaemonMessage *m)
{
    /* Hearing anything is what keeps riverd alive (link_recv). */
    (void)l;
    (void)m;
}

static void link__on_submit(link_t *l, const River__Worker__DaemonMessage *m)
{
    l->h.submit(l->h.user, m->submit);
}

static void link__on_cancel(link_t *l, const River__Worker__DaemonMessage *m)
{
    l->h.cancel(l->h.user, m->cancel->request_id);
}

static void link__on_drain(link_t *l, const River__Worker__DaemonMessage *m)
{
    l->h.drain(l->h.user, m->drain->deadline_ms);
}

static void link__on_reconnect(link_t *l, const River__Worker__DaemonMessage *m)
{
    log_warn("riverd asks for a new Ready (%s); dropping every request",
             m->reconnect->reason[0] ? m->reconnect->reason : "no reason given");
    l->h.reset(l->h.user, "riverd sent Reconnect");
    link__send_ready(l);
}

typedef void (*link_handler_fn)(link_t *l, const River__Worker__DaemonMessage *m);

static const link_handler_fn link__handlers[] = {
    [RIVER__WORKER__DAEMON_MESSAGE__KIND_WELCOME] = link__on_welcome,
    [RIVER__WORKER__DAEMON_MESSAGE__KIND_HEARTBEAT] = link__on_heartbeat,
    [RIVER__WORKER__DAEMON_MESSAGE__KIND_SUBMIT] = link__on_submit,
    [RIVER__WORKER__DAEMON_MESSAGE__KIND_CANCEL] = link__on_cancel,
    [RIVER__WORKER__DAEMON_MESSAGE__KIND_DRAIN] = link__on_drain,
    [RIVER__WORKER__DAEMON_MESSAGE__KIND_RECONNECT] = link__on_reconnect,
};

/* Handles one received message (the first part of it in m). */
static void link__handle(link_t *l, zmq_msg_t *m, int parts)
{
    if (parts != 1) {
        /* The link is one envelope per frame; a multi-part message is a peer that does
         * not speak it. */
        log_warn("bad frame from riverd: %d parts, expected 1", parts);
        char msg[96];
        snprintf(msg, sizeof msg, "expected a message of one frame, got %d parts", parts);
        link_send_failed(l, 0, RIVER__CLIENT__ERROR__CODE__INVALID_ARGUMENT, msg);
        return;
    }
    ProtobufCMessage *out = NULL;
    int e = frame_decode_msg(FRAME_DAEMON_MESSAGE, m, l->cfg.max_frame_bytes, &out);
    if (e) {
        log_warn("bad frame from riverd: %s", river_err_detail());
        link_send_failed(l, 0, frame_error_code(e), river_err_detail());
        return;
    }
    River__Worker__DaemonMessage *dm = (River__Worker__DaemonMessage *)out;
    unsigned k = (unsigned)dm->kind_case;
    if (k < sizeof link__handlers / sizeof link__handlers[0] && link__handlers[k]) {
        log_debug("riverd: %s", frame_case_name(out));
        link__handlers[k](l, dm);
    }
    frame_free(&out);
}

void link_recv(link_t *l)
{
    for (int i = 0; i < LINK_RECV_BATCH && l->sock; i++) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, l->sock, ZMQ_DONTWAIT) < 0) {
            int err = errno;
            zmq_msg_close(&m);
            if (err != EAGAIN && err != EINTR)
                log_error("receiving from riverd: %s", zmq_strerror(err));
            return;
        }
        /* A frame, even a bad one, proves riverd alive; the back-off starts over. */
        l->last_recv_ms = clock_now_ms();
        l->backoff_ms = l->heartbeat_ms < l->cfg.backoff_max_ms ? l->heartbeat_ms
                                                                : l->cfg.backoff_max_ms;
        int parts = 1;
        while (zmq_msg_more(&m)) {
            /* Read the rest so that the next message starts clean. */
            zmq_msg_t rest;
            zmq_msg_init(&rest);
            int rc = zmq_msg_recv(&rest, l->sock, ZMQ_DONTWAIT);
            int more = rc >= 0 && zmq_msg_more(&rest);
            zmq_msg_close(&rest);
            parts++;
            if (!more)
                break;
        }
        link__handle(l, &m, parts);
        zmq_msg_close(&m);
    }
}

/* What the monitor says about riverd's answer to the handshake: NULL, or why riverd
 * refused this worker. */
static const char *link__refused(link_t *l)
{
    const char *why = NULL;
    for (int i = 0; i < 64 && l->monitor; i++) {
        zmq_msg_t ev;
        zmq_msg_init(&ev);
        if (zmq_msg_recv(&ev, l->monitor, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&ev);
            break;
        }
        uint16_t event = 0;
        uint32_t value = 0;
        if (zmq_msg_size(&ev) >= 6) {
            memcpy(&event, zmq_msg_data(&ev), 2);
            memcpy(&value, (const char *)zmq_msg_data(&ev) + 2, 4);
        }
        /* The second frame names the endpoint, which the link knows. */
        while (zmq_msg_more(&ev)) {
            zmq_msg_close(&ev);
            zmq_msg_init(&ev);
            if (zmq_msg_recv(&ev, l->monitor, 0) < 0)
                break;
        }
        zmq_msg_close(&ev);
        if (event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH)
            why = l->curve ? "its key is not in riverd's auth.workers (auth.secret_key)"
                           : "riverd asks for a CURVE key";
        else if (event == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL)
            why = value == ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH
                      ? (l->curve ? "riverd serves without authentication (auth.mode plain "
                                    "there, curve here)"
                                  : "riverd asks for CURVE keys (auth.mode curve there, plain "
                                    "here)")
                      : "the CURVE handshake failed (is auth.server_key riverd's key?)";
        else if (event == ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL && !why)
            /* riverd closes the connection without a word to a peer without keys, or one
             * whose CURVE hello it cannot decrypt. */
            why = l->curve ? "riverd closed the handshake (is auth.server_key riverd's key, "
                             "and riverd's auth.mode curve?)"
                           : "riverd closed the handshake (riverd's auth.mode is curve? this "
                             "worker's is plain)";
    }
    return why;
}

void link_tick(link_t *l, int64_t now)
{
    if (!l->sock) {
        if (now < l->reconnect_at_ms)
            return;
        int e = link__connect(l, now);
        if (e && !l->sock) {
            log_error("reconnecting: %s", river_err_detail());
            l->reconnect_at_ms = now + link__next_backoff(l);
            return;
        }
        log_info("reconnected to %s, Ready sent", l->endpoint);
        return;
    }
    const char *refused = link__refused(l);
    if (refused) {
        /* ZMQ would try again every 100 ms; the back-off spares riverd's log. */
        char why[256];
        snprintf(why, sizeof why, "riverd refused this worker: %s", refused);
        link__disconnect(l, now, why);
        return;
    }
    if (now - l->last_recv_ms > l->heartbeat_ms * l->liveness) {
        char why[128];
        snprintf(why, sizeof why, "riverd silent for %lld ms", (long long)(now - l->last_recv_ms));
        link__disconnect(l, now, why);
        return;
    }
    /* Heartbeats go out every interval even while tokens flow: they carry the free KV
     * pages and queue length riverd's admission reads, which tokens do not. Before
     * Welcome riverd does not know the worker yet; Ready is all it needs. */
    if (l->welcomed && now - l->last_beat_ms >= l->heartbeat_ms)
        link_send_heartbeat(l);
}

int64_t link_next_ms(const link_t *l)
{
    if (!l->sock)
        return l->reconnect_at_ms;
    int64_t dead = l->last_recv_ms + l->heartbeat_ms * l->liveness + 1;
    if (!l->welcomed)
        return dead;
    int64_t beat = l->last_beat_ms + l->heartbeat_ms;
    return beat < dead ? beat : dead;
}
