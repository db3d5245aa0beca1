/* The river side of the split pair: the hello, liveness, and one round trip per backbone
 * layer a batch needs (workers/pair.h). */
#include "workers/pair.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/err.h"
#include "common/log.h"
#include "kernels/backend.h"
#include "proto/river_pair.pb-c.h"
#include "workers/link.h"
#include "workers/pair_transport.h"
#include "workers/pair_wire.h"

/* ---- The river side ---- */

typedef enum {
    PAIR_IDLE = 0, /* no hello out; the next one at hello_at */
    PAIR_HELLO,    /* hello sent, waiting for the answer until hello_deadline */
    PAIR_READY,    /* paired */
} pair_state_t;

struct pair_river {
    void *zctx;
    void *sock;               /* NULL while idle */
    pair_river_config_t cfg;  /* strings point at the copies below */
    char *endpoint, *river_id, *fingerprint, *backend;
    const model_t *m;
    kv_pool_t *kv;
    int memfd;
    pair_transport_t *tr;     /* how the hidden states cross: the first choice */
    pair_transport_t *alt;    /* what split.transport auto also offers, in case the backbone
                                 shares this side's GPU (p2p beside nccl); NULL: none */
    pair_transport_t *cur;    /* tr or alt: the one the backbone took; NULL before */
    char uuid[48];            /* this side's device (backend_info.uuid), "" on the host */
    pair_state_t state;
    bool ever_paired, refused;
    char refusal[512];
    int64_t hello_at, hello_deadline, backoff_ms;
    int64_t last_recv_ms, last_sent_ms;
    pid_t peer_pid;
    int pidfd;                /* the backbone's, -1 when none */
    uint64_t seq;             /* last LayerRequest sent */
    size_t max_reply;
    /* Request assembly, (max_rows) each, and the flattened page ids. */
    const int32_t **tables;
    uint32_t *row_table, *table_len;
    int32_t *pages;
    size_t cap_pages;
    int64_t trips;
    double trip_s;
};

static void pair__river_close(pair_river_t *p)
{
    if (p->sock)
        zmq_close(p->sock);
    p->sock = NULL;
    if (p->pidfd >= 0)
        close(p->pidfd);
    p->pidfd = -1;
}

/* The backbone is gone: no request can reach it; hello again after one interval. */
static void pair__river_lost(pair_river_t *p, int64_t now, const char *why)
{
    log_warn("backbone peer at %s lost: %s; requests that need layers >= %d fail "
             "with UNAVAILABLE until it is back", p->cfg.endpoint, why, p->cfg.boundary);
    pair__river_close(p);
    p->state = PAIR_IDLE;
    p->backoff_ms = p->cfg.heartbeat_ms;
    p->hello_at = now + p->backoff_ms;
}

/* The backbone refused this side (p->refusal says why). Refused at start-up, the
 * configuration is wrong and stays wrong; later, the backbone may have been restarted
 * with another, and may be fixed again: hello again after the back-off. */
static void pair__river_refused(pair_river_t *p, int64_t now)
{
    log_error("%s", p->refusal);
    if (!p->ever_paired)
        p->refused = true;
    pair__river_close(p);
    p->state = PAIR_IDLE;
    p->hello_at = now + p->backoff_ms;
}

/* The next back-off: doubled, up to backoff_max_ms. */
static void pair__river_back_off(pair_river_t *p)
{
    p->backoff_ms = p->backoff_ms * 2 > p->cfg.backoff_max_ms ? p->cfg.backoff_max_ms
                                                              : p->backoff_ms * 2;
}

static int pair__river_open(pair_river_t *p)
{
    void *s = zmq_socket(p->zctx, ZMQ_DEALER);
    if (!s)
        return river_err_set(RIVER_ESYS, "pair: zmq_socket: %s", zmq_strerror(errno));
    int zero = 0;
    int64_t max = (int64_t)p->max_reply;
    /* Frames of a dead connection are worthless (their requests failed), so closing
     * never waits; a reply larger than any reply can be drops the connection. */
    if (zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero) ||
        zmq_setsockopt(s, ZMQ_SNDHWM, &zero, sizeof zero) ||
        zmq_setsockopt(s, ZMQ_RCVHWM, &zero, sizeof zero) ||
        zmq_setsockopt(s, ZMQ_MAXMSGSIZE, &max, sizeof max)) {
        int err = errno;
        zmq_close(s);
        return river_err_set(RIVER_ESYS, "pair: zmq_setsockopt: %s", zmq_strerror(err));
    }
    if (zmq_connect(s, p->cfg.endpoint)) {
        int err = errno;
        zmq_close(s);
        return river_err_set(RIVER_ESYS, "pair: connecting to %s: %s", p->cfg.endpoint,
                             zmq_strerror(err));
    }
    p->sock = s;
    return 0;
}

static int pair__river_send(pair_river_t *p, River__Pair__RiverMessage *env, int64_t now)
{
    int e = pair_wire_send(p->sock, &env->base, 0);
    if (!e)
        p->last_sent_ms = now;
    return e;
}

static int pair__river_hello(pair_river_t *p, int64_t now)
{
    const kv_view_t *v = kv_pool_view(p->kv);
    River__Pair__KvGeometry kv = RIVER__PAIR__KV_GEOMETRY__INIT;
    kv.n_layers = (uint32_t)kv_pool_n_layers(p->kv);
    kv.kv_dim = (uint32_t)v->kv_dim;
    kv.page_size = (uint32_t)v->page_size;
    kv.n_pages = (uint32_t)v->n_pages;
    kv.dtype = (char *)dtype_name(v->dtype);
    kv.bytes = kv_pool_shared_bytes((int)kv.n_layers, v->kv_dim, v->dtype, v->page_size,
                                    v->n_pages);
    River__Pair__PairHello h = RIVER__PAIR__PAIR_HELLO__INIT;
    h.protocol = PAIR_PROTOCOL;
    h.river_id = p->river_id;
    h.river_pid = (uint32_t)getpid();
    h.memfd = p->memfd;
    /* The handle kind comes from the backend that made the pool: a memfd on the CPU, an IPC
     * handle of device memory on a GPU. */
    const shared_handle_t *sh = kv_pool_shared_handle(p->kv);
    h.kv_kind = sh ? (uint32_t)sh->kind : SHARED_MEMFD;
    if (sh && sh->kind == SHARED_CUDA_IPC) {
        h.kv_ipc.data = (uint8_t *)sh->ipc;
        h.kv_ipc.len = sizeof sh->ipc;
    }
    h.kv = &kv;
    h.fingerprint = p->fingerprint;
    h.boundary = (uint32_t)p->cfg.boundary;
    h.backend = p->backend;
    h.threads = (uint32_t)p->cfg.threads;
    h.max_rows = (uint32_t)p->cfg.max_rows;
    h.heartbeat_ms = (uint32_t)p->cfg.heartbeat_ms;
    h.liveness = (uint32_t)p->cfg.liveness;
    h.device_uuid = p->uuid;
    /* The alternative first: each offer names its kind in h.transport, and the first
     * choice's must be the one left there. */
    int e = 0;
    if (p->alt && !(e = pair_transport_offer(p->alt, &h)))
        h.transport_alt = h.transport;
    if (!e)
        e = pair_transport_offer(p->tr, &h);
    if (e)
        return e;
    River__Pair__RiverMessage env = RIVER__PAIR__RIVER_MESSAGE__INIT;
    env.kind_case = RIVER__PAIR__RIVER_MESSAGE__KIND_HELLO;
    env.hello = &h;
    return pair__river_send(p, &env, now);
}

int pair_river_new(pair_river_t **out, void *zctx, const pair_river_config_t *cfg,
                   const model_t *m, kv_pool_t *kv, int memfd)
{
    if (cfg->boundary < 1 || cfg->boundary >= m->cfg.n_layers)
        return river_err_set(RIVER_ECONFIG, "split.boundary %d: the backbone worker must "
                             "hold layers %d..%d of %d, so the boundary must be in 1..%d",
                             cfg->boundary, cfg->boundary, m->cfg.n_layers - 1,
                             m->cfg.n_layers, m->cfg.n_layers - 1);
    if (!cfg->endpoint || !cfg->endpoint[0])
        return river_err_set(RIVER_ECONFIG, "split.peer: the backbone worker's address is "
                             "not configured");
    if (cfg->max_rows <= 0 || cfg->heartbeat_ms <= 0 || cfg->liveness <= 0 ||
        cfg->reply_timeout_ms <= 0)
        return river_err_set(RIVER_EINVAL, "pair: rows %d, heartbeat %lld ms, liveness %d, "
                             "reply timeout %lld ms", cfg->max_rows,
                             (long long)cfg->heartbeat_ms, cfg->liveness,
                             (long long)cfg->reply_timeout_ms);
    pair_river_t *p = calloc(1, sizeof *p);
    if (!p)
        return river_err_set(RIVER_ENOMEM, "pair");
    p->zctx = zctx;
    p->cfg = *cfg;
    p->m = m;
    p->kv = kv;
    p->memfd = memfd;
    p->pidfd = -1;
    p->endpoint = strdup(cfg->endpoint);
    p->river_id = strdup(cfg->river_id ? cfg->river_id : "");
    p->fingerprint = strdup(cfg->fingerprint);
    p->backend = strdup(cfg->backend);
    size_t r = (size_t)cfg->max_rows;
    p->tables = malloc(r * sizeof *p->tables);
    p->row_table = malloc(r * sizeof *p->row_table);
    p->table_len = malloc(r * sizeof *p->table_len);
    if (!p->endpoint || !p->river_id || !p->fingerprint || !p->backend || !p->tables ||
        !p->row_table || !p->table_len) {
        pair_river_destroy(&p);
        return river_err_set(RIVER_ENOMEM, "pair: buffers for %d rows", cfg->max_rows);
    }
    p->cfg.endpoint = p->endpoint;
    p->cfg.river_id = p->river_id;
    p->cfg.fingerprint = p->fingerprint;
    p->cfg.backend = p->backend;
    if (p->cfg.backoff_max_ms < p->cfg.heartbeat_ms)
        p->cfg.backoff_max_ms = p->cfg.heartbeat_ms;
    p->backoff_ms = p->cfg.heartbeat_ms;
    p->max_reply = pair_wire_frame_limit(cfg->max_rows, m->cfg.dim, m->cfg.max_seq_len,
                                         kv_pool_page_size(kv));
    /* Without a backend named, the model's: where the hidden states live. */
    p->cfg.be = cfg->be ? cfg->be : m->backend;
    p->cfg.transport = (int)pair_transport_resolve((pair_transport_kind_t)cfg->transport,
                                                   p->cfg.be);
    backend_info_t bi;
    backend_get_info(p->cfg.be, &bi);
    snprintf(p->uuid, sizeof p->uuid, "%s", bi.uuid);
    int e = pair_transport_new(&p->tr, (pair_transport_kind_t)p->cfg.transport,
                               PAIR_SIDE_RIVER, p->cfg.be, m->cfg.dim, cfg->max_rows);
    /* Both device kinds take backend buffers, so the remote pair_river_remote sets up from
     * tr suits either. */
    pair_transport_kind_t alt = pair_transport_fallback((pair_transport_kind_t)cfg->transport,
                                                        p->cfg.be);
    if (!e && alt != PAIR_TRANSPORT_AUTO)
        e = pair_transport_new(&p->alt, alt, PAIR_SIDE_RIVER, p->cfg.be, m->cfg.dim,
                               cfg->max_rows);
    if (e) {
        char why[256];
        snprintf(why, sizeof why, "%s", river_err_detail());
        pair_river_destroy(&p);
        return river_err_set(e, "split.transport %s: %s",
                             pair_transport_name(cfg->transport), why);
    }
    *out = p;
    return 0;
}

void pair_river_destroy(pair_river_t **pp)
{
    pair_river_t *p = *pp;
    if (!p)
        return;
    pair__river_close(p);
    free(p->endpoint);
    free(p->river_id);
    free(p->fingerprint);
    free(p->backend);
    free(p->tables);
    free(p->row_table);
    free(p->table_len);
    free(p->pages);
    pair_transport_destroy(&p->tr);
    pair_transport_destroy(&p->alt);
    free(p);
    *pp = NULL;
}

bool pair_river_ready(const pair_river_t *p) { return p->state == PAIR_READY; }
bool pair_river_refused(const pair_river_t *p) { return p->refused; }
const char *pair_river_refusal(const pair_river_t *p) { return p->refusal; }

void pair_river_stats(const pair_river_t *p, int64_t *trips, double *seconds)
{
    *trips = p->trips;
    *seconds = p->trip_s;
}

/* One frame from the backbone outside a layer's round trip: the hello's answer, a pong,
 * or a stale reply of a request that already failed. */
static void pair__river_handle(pair_river_t *p, zmq_msg_t *msg, int64_t now)
{
    ProtobufCMessage *out;
    int e = pair_wire_decode(&river__pair__backbone_message__descriptor, zmq_msg_data(msg),
                             zmq_msg_size(msg), p->max_reply, &out);
    if (e) {
        log_warn("bad frame from the backbone peer: %s", river_err_detail());
        return;
    }
    p->last_recv_ms = now;
    River__Pair__BackboneMessage *bm = (River__Pair__BackboneMessage *)out;
    char buf[128];
    if (p->state == PAIR_HELLO &&
        bm->kind_case == RIVER__PAIR__BACKBONE_MESSAGE__KIND_HELLO_OK) {
        const River__Pair__PairHelloOk *ok = bm->hello_ok;
        uint32_t kind = ok->transport ? ok->transport : PAIR_TRANSPORT_ZMQ;
        p->cur = kind == (uint32_t)pair_transport_kind(p->tr) ? p->tr
                 : p->alt && kind == (uint32_t)pair_transport_kind(p->alt) ? p->alt
                                                                            : NULL;
        int e2 = p->cur ? pair_transport_connect(p->cur)
                        : river_err_set(RIVER_EPROTO, "the backbone took transport %s, this "
                                        "river asked for %s", pair_transport_name((int)kind),
                                        pair_transport_name(pair_transport_kind(p->tr)));
        if (e2) {
            /* A backbone that cannot meet this side's transport is configured wrong, like
             * one that refuses the hello. */
            snprintf(p->refusal, sizeof p->refusal, "the backbone worker at %s: %s",
                     p->cfg.endpoint, river_err_detail());
            pair__river_refused(p, now);
            protobuf_c_message_free_unpacked(out, NULL);
            return;
        }
        p->state = PAIR_READY;
        p->ever_paired = true;
        p->backoff_ms = p->cfg.heartbeat_ms;
        p->peer_pid = (pid_t)ok->backbone_pid;
        p->pidfd = ok->backbone_pid > 0 ? pair_wire_pidfd(p->peer_pid) : -1;
        log_info("paired with the backbone worker at %s (pid %u): layers %u..%u run "
                 "there, the KV pool is shared, transport %s", p->cfg.endpoint,
                 ok->backbone_pid, ok->layer_begin, ok->layer_end ? ok->layer_end - 1 : 0,
                 pair_transport_name((int)kind));
    } else if (p->state == PAIR_HELLO &&
               bm->kind_case == RIVER__PAIR__BACKBONE_MESSAGE__KIND_ERROR) {
        snprintf(p->refusal, sizeof p->refusal, "the backbone worker at %s refused the "
                 "pair: %s", p->cfg.endpoint,
                 pair_wire_printable(bm->error->message, buf, sizeof buf));
        pair__river_refused(p, now);
        pair__river_back_off(p);
    } else if (p->state == PAIR_READY &&
               bm->kind_case == RIVER__PAIR__BACKBONE_MESSAGE__KIND_ERROR &&
               bm->error->seq == 0) {
        /* The backbone no longer knows this pairing (it timed this side out). */
        pair__river_lost(p, now, pair_wire_printable(bm->error->message, buf, sizeof buf));
    }
    protobuf_c_message_free_unpacked(out, NULL);
}

/* Reads every frame waiting on the socket. */
static void pair__river_drain(pair_river_t *p, int64_t now)
{
    while (p->sock) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, p->sock, ZMQ_DONTWAIT) < 0) {
            int err = errno;
            zmq_msg_close(&m);
            if (err != EAGAIN && err != EINTR)
                log_error("receiving from the backbone peer: %s", zmq_strerror(err));
            return;
        }
        pair__river_handle(p, &m, now);
        zmq_msg_close(&m);
    }
}

int pair_river_poll_items(pair_river_t *p, zmq_pollitem_t *items)
{
    int n = 0;
    if (p->sock)
        items[n++] = (zmq_pollitem_t){.socket = p->sock, .events = ZMQ_POLLIN};
    if (p->pidfd >= 0)
        items[n++] = (zmq_pollitem_t){.fd = p->pidfd, .events = ZMQ_POLLIN};
    return n;
}

void pair_river_on_poll(pair_river_t *p, const zmq_pollitem_t *items, int n, int64_t now)
{
    int pidfd = p->pidfd;
    for (int i = 0; i < n; i++) {
        if (!(items[i].revents & ZMQ_POLLIN))
            continue;
        if (items[i].socket && items[i].socket == p->sock)
            pair__river_drain(p, now);
        else if (!items[i].socket && items[i].fd == pidfd && pidfd == p->pidfd && pidfd >= 0)
            pair__river_lost(p, now, "the backbone process exited");
    }
}

void pair_river_tick(pair_river_t *p, int64_t now)
{
    switch (p->state) {
    case PAIR_IDLE:
        if (now < p->hello_at || p->refused)
            return;
        if (!p->sock && pair__river_open(p)) {
            log_error("%s", river_err_detail());
            p->hello_at = now + p->backoff_ms;
            return;
        }
        if (pair__river_hello(p, now)) {
            log_error("hello to the backbone peer: %s", river_err_detail());
            pair__river_close(p);
            p->hello_at = now + p->backoff_ms;
            return;
        }
        log_debug("PairHello sent to %s", p->cfg.endpoint);
        p->state = PAIR_HELLO;
        p->hello_deadline = now + p->cfg.heartbeat_ms * p->cfg.liveness;
        return;
    case PAIR_HELLO:
        if (now < p->hello_deadline)
            return;
        /* A backbone that is not up yet: the hello may sit in a queue of a connection
         * that never comes; start over with a fresh socket after the back-off. */
        log_msg(p->ever_paired ? CONFIG_LOG_DEBUG : CONFIG_LOG_INFO, "no answer from the "
                "backbone worker at %s yet; trying again in %lld ms", p->cfg.endpoint, (long long)p->backoff_ms);
        pair__river_close(p);
        p->state = PAIR_IDLE;
        p->hello_at = now + p->backoff_ms;
        pair__river_back_off(p);
        return;
    case PAIR_READY:
        if (now - p->last_recv_ms > p->cfg.heartbeat_ms * p->cfg.liveness) {
            char why[96];
            snprintf(why, sizeof why, "silent for %lld ms", (long long)(now - p->last_recv_ms));
            pair__river_lost(p, now, why);
            return;
        }
        if (now - p->last_sent_ms >= p->cfg.heartbeat_ms) {
            River__Pair__Ping ping = RIVER__PAIR__PING__INIT;
            River__Pair__RiverMessage env = RIVER__PAIR__RIVER_MESSAGE__INIT;
            env.kind_case = RIVER__PAIR__RIVER_MESSAGE__KIND_PING;
            env.ping = &ping;
            if (pair__river_send(p, &env, now))
                pair__river_lost(p, now, river_err_detail());
        }
        return;
    }
}

int64_t pair_river_next_ms(const pair_river_t *p)
{
    switch (p->state) {
    case PAIR_IDLE:
        return p->refused ? INT64_MAX : p->hello_at;
    case PAIR_HELLO:
        return p->hello_deadline;
    case PAIR_READY: {
        int64_t dead = p->last_recv_ms + p->cfg.heartbeat_ms * p->cfg.liveness + 1;
        int64_t ping = p->last_sent_ms + p->cfg.heartbeat_ms;
        return ping < dead ? ping : dead;
    }
    }
    return INT64_MAX;
}

/* Fills the request's page tables: each distinct table once, as long as its deepest row
 * needs (positions 0..pos are what attention reads). */
static int pair__river_tables(pair_river_t *p, int n, const int32_t *pos,
                              const int32_t *const *page_table, size_t *n_tables,
                              size_t *n_pages)
{
    int page = kv_pool_page_size(p->kv);
    size_t nt = 0;
    for (int i = 0; i < n; i++) {
        size_t t = 0;
        while (t < nt && p->tables[t] != page_table[i])
            t++;
        uint32_t need = (uint32_t)(pos[i] / page + 1);
        if (t == nt) {
            p->tables[nt] = page_table[i];
            p->table_len[nt++] = need;
        } else if (p->table_len[t] < need) {
            p->table_len[t] = need;
        }
        p->row_table[i] = (uint32_t)t;
    }
    size_t total = 0;
    for (size_t t = 0; t < nt; t++)
        total += p->table_len[t];
    if (total > p->cap_pages) {
        size_t cap = p->cap_pages ? p->cap_pages : 256;
        while (cap < total)
            cap *= 2;
        int32_t *pg = realloc(p->pages, cap * sizeof *pg);
        if (!pg)
            return river_err_set(RIVER_ENOMEM, "pair: %zu page ids", cap);
        p->pages = pg;
        p->cap_pages = cap;
    }
    size_t k = 0;
    for (size_t t = 0; t < nt; t++) {
        memcpy(p->pages + k, p->tables[t], p->table_len[t] * sizeof *p->pages);
        k += p->table_len[t];
    }
    *n_tables = nt;
    *n_pages = total;
    return 0;
}

/* Waits for the reply to request p->seq and copies its hidden states into x. */
static int pair__river_wait(pair_river_t *p, int layer, int rows, void *x)
{
    int64_t start = clock_now_ms();
    int64_t deadline = start + p->cfg.reply_timeout_ms;
    char buf[128];
    for (;;) {
        int64_t now = clock_now_ms();
        if (now >= deadline) {
            char why[128];
            snprintf(why, sizeof why, "no reply for layer %d within %lld ms", layer,
                     (long long)p->cfg.reply_timeout_ms);
            pair__river_lost(p, now, why);
            return river_err_set(RIVER_EUNAVAILABLE, "backbone peer: %s", why);
        }
        zmq_pollitem_t items[PAIR_POLL_ITEMS];
        int n = pair_river_poll_items(p, items);
        if (zmq_poll(items, n, (long)(deadline - now)) < 0) {
            if (errno == EINTR)
                continue;
            return river_err_set(RIVER_ESYS, "pair: zmq_poll: %s", zmq_strerror(errno));
        }
        now = clock_now_ms();
        if (n > 1 && (items[1].revents & ZMQ_POLLIN)) {
            pair__river_lost(p, now, "the backbone process exited");
            return river_err_set(RIVER_EUNAVAILABLE, "backbone peer: its process exited "
                                 "while it ran layer %d", layer);
        }
        if (!(items[0].revents & ZMQ_POLLIN))
            continue;
        for (;;) {
            zmq_msg_t m;
            zmq_msg_init(&m);
            if (zmq_msg_recv(&m, p->sock, ZMQ_DONTWAIT) < 0) {
                zmq_msg_close(&m);
                break;
            }
            ProtobufCMessage *out;
            int e = pair_wire_decode(&river__pair__backbone_message__descriptor,
                                     zmq_msg_data(&m), zmq_msg_size(&m), p->max_reply, &out);
            zmq_msg_close(&m);
            if (e) {
                /* The two sides no longer speak the same protocol: nothing later can be
                 * trusted either. */
                pair__river_lost(p, now, river_err_detail());
                return river_err_set(RIVER_EUNAVAILABLE, "backbone peer: bad frame");
            }
            p->last_recv_ms = now;
            River__Pair__BackboneMessage *bm = (River__Pair__BackboneMessage *)out;
            if (bm->kind_case == RIVER__PAIR__BACKBONE_MESSAGE__KIND_LAYER &&
                bm->layer->seq == p->seq) {
                e = pair_transport_get(p->cur, x, rows, &bm->layer->hidden);
                protobuf_c_message_free_unpacked(out, NULL);
                if (e) {
                    char why[256];
                    snprintf(why, sizeof why, "layer %d reply: %s", layer, river_err_detail());
                    pair__river_lost(p, now, why);
                    return river_err_set(RIVER_EUNAVAILABLE, "backbone peer: %s", why);
                }
                return 0;
            }
            if (bm->kind_case == RIVER__PAIR__BACKBONE_MESSAGE__KIND_ERROR &&
                (bm->error->seq == p->seq || bm->error->seq == 0)) {
                int lost = bm->error->seq == 0;
                e = river_err_set(lost ? RIVER_EUNAVAILABLE : RIVER_EIO,
                                  "backbone worker, layer %d: %s", layer,
                                  pair_wire_printable(bm->error->message, buf, sizeof buf));
                protobuf_c_message_free_unpacked(out, NULL);
                if (lost) {
                    char why[128];
                    snprintf(why, sizeof why, "%s", river_err_detail());
                    pair__river_lost(p, now, why);
                    river_err_set(e, "%s", why);
                }
                return e;
            }
            /* A pong, or the reply to a request that already failed. */
            protobuf_c_message_free_unpacked(out, NULL);
        }
    }
}

/* One round trip: x is host memory or a backend buffer, as the transport takes it. */
static int pair__river_trip(void *user, int layer, int n, const int32_t *pos,
                            const int32_t *const *page_table, void *x)
{
    pair_river_t *p = user;
    if (p->state != PAIR_READY)
        return river_err_set(RIVER_EUNAVAILABLE, "backbone layer %d: the backbone worker at "
                             "%s is not paired with this river worker", layer,
                             p->cfg.endpoint);
    if (n <= 0 || n > p->cfg.max_rows)
        return river_err_set(RIVER_EINVAL, "pair: %d rows (max %d)", n, p->cfg.max_rows);
    double t0 = clock_now_s();
    size_t n_tables = 0, n_pages = 0;
    int e = pair__river_tables(p, n, pos, page_table, &n_tables, &n_pages);
    if (e)
        return e;
    River__Pair__LayerRequest q = RIVER__PAIR__LAYER_REQUEST__INIT;
    q.seq = ++p->seq;
    q.layer = (uint32_t)layer;
    q.n = (uint32_t)n;
    q.n_pos = (size_t)n;
    q.pos = (int32_t *)pos;
    q.n_row_table = (size_t)n;
    q.row_table = p->row_table;
    q.n_table_len = n_tables;
    q.table_len = p->table_len;
    q.n_pages = n_pages;
    q.pages = p->pages;
    if ((e = pair_transport_put(p->cur, x, n, &q.hidden)))
        return e;
    River__Pair__RiverMessage env = RIVER__PAIR__RIVER_MESSAGE__INIT;
    env.kind_case = RIVER__PAIR__RIVER_MESSAGE__KIND_LAYER;
    env.layer = &q;
    int64_t now = clock_now_ms();
    if ((e = pair__river_send(p, &env, now))) {
        char why[128];
        snprintf(why, sizeof why, "%s", river_err_detail());
        pair__river_lost(p, now, why);
        return river_err_set(RIVER_EUNAVAILABLE, "backbone peer: %s", why);
    }
    if ((e = pair__river_wait(p, layer, n, x)))
        return e;
    p->trips++;
    p->trip_s += clock_now_s() - t0;
    return 0;
}

static int pair__river_host_trip(void *user, int layer, int n, const int32_t *pos,
                                 const int32_t *const *page_table, float *x)
{
    return pair__river_trip(user, layer, n, pos, page_table, x);
}

void pair_river_remote(pair_river_t *p, fwd_remote_t *r)
{
    r->user = p;
    r->boundary = p->cfg.boundary;
    if (pair_transport_on_device(p->tr)) {
        r->run = NULL;
        r->run_dev = pair__river_trip;
    } else {
        r->run = pair__river_host_trip;
        r->run_dev = NULL;
    }
}
