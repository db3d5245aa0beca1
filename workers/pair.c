#include "workers/pair.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/pidfd.h>
#include <time.h>
#include <unistd.h>

#include "common/err.h"
#include "kernels/cpu/cpu.h"
#include "proto/river_pair.pb-c.h"
#include "workers/link.h"
#include "workers/wlog.h"

/* A hello (and anything from a peer that is not paired) is small; its frames are held to
 * this before they are decoded. */
#define PAIR_HELLO_MAX_BYTES (64u << 10)
/* Bounds on what a hello may ask for. */
#define PAIR_MAX_ROWS 65536
#define PAIR_HEARTBEAT_MIN_MS 10
#define PAIR_HEARTBEAT_MAX_MS 3600000
#define PAIR_LIVENESS_MAX 1000

/* ---- Shared helpers ---- */

static double pair__now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

const char *pair_backend_name(const backend_t *be)
{
    static char name[64];
    /* The level the backend runs (RIVER_SIMD or the best the processor has): on one host
     * both sides of a pair name the same one unless they were started differently. */
    snprintf(name, sizeof name, "%s-%s", be->ops->name,
             cpu_simd_name(strcmp(be->ops->name, "cpu") ? cpu_simd_detect() : cpu_backend_simd(be)));
    return name;
}

/* The whole pages inside one weight, dropped (offload.c does the same for eviction). */
static void pair__release(const weight_t *w)
{
    if (!w->data)
        return;
    size_t bytes = dtype_row_bytes(w->dtype, w->cols) * (size_t)w->rows;
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t a = (uintptr_t)w->data, b = a + bytes;
    uintptr_t lo = (a + page - 1) & ~(page - 1), hi = b & ~(page - 1);
    /* Advice only: a failure leaves the pages resident, which costs memory, not results. */
    if (hi > lo)
        (void)madvise((void *)lo, hi - lo, MADV_DONTNEED);
}

void pair_release_weights(const model_t *m, int begin, int end, bool ends)
{
    for (int l = begin < 0 ? 0 : begin; l < end && l < m->cfg.n_layers; l++) {
        const layer_weights_t *w = &m->layers[l];
        const weight_t *mats[] = {&w->wq, &w->wk, &w->wv, &w->wo, &w->w_gate, &w->w_up,
                                  &w->w_down};
        for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++)
            pair__release(mats[i]);
    }
    if (ends) {
        pair__release(&m->embed);
        pair__release(&m->lm_head);
    }
}

int64_t pair_model_resident_bytes(const model_t *m)
{
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f)
        return river_err_set(RIVER_ESYS, "/proc/self/smaps: %s", strerror(errno));
    /* The checkpoint's mappings are those that hold a layer's weights; a sharded model
     * has several files, each mapped once. */
    char line[4096];
    int64_t total = 0;
    int in_model = 0;
    while (fgets(line, sizeof line, f)) {
        uintptr_t lo, hi;
        int name_at = 0;
        if (sscanf(line, "%" SCNxPTR "-%" SCNxPTR " %*s %*s %*s %*s %n", &lo, &hi,
                   &name_at) == 2 && name_at > 0) {
            in_model = 0;
            for (int l = 0; l < m->cfg.n_layers && !in_model; l++) {
                uintptr_t p = (uintptr_t)m->layers[l].wq.data;
                in_model = p >= lo && p < hi;
            }
            continue;
        }
        long kb;
        if (in_model && sscanf(line, "Rss: %ld kB", &kb) == 1)
            total += (int64_t)kb * 1024;
    }
    fclose(f);
    return total;
}

/* Keeps a peer's string printable for the log: at most 80 bytes, control bytes as '?'. */
static const char *pair__printable(const char *s, char *buf, size_t cap)
{
    size_t n = 0;
    for (; s && *s && n + 1 < cap && n < 80; s++)
        buf[n++] = (unsigned char)*s < 0x20 || *s == 0x7f ? '?' : *s;
    buf[n] = '\0';
    return buf;
}

/* Unpacks a frame of at most max_bytes into an envelope with a message kind set. */
static int pair__decode(const ProtobufCMessageDescriptor *d, const void *data, size_t len,
                        size_t max_bytes, ProtobufCMessage **out)
{
    *out = NULL;
    if (len > max_bytes)
        return river_err_set(RIVER_ERANGE, "pair: frame of %zu bytes over the limit of %zu",
                             len, max_bytes);
    ProtobufCMessage *m = protobuf_c_message_unpack(d, NULL, len, data);
    if (!m)
        return river_err_set(RIVER_EPROTO, "pair: malformed %s frame of %zu bytes",
                             d->short_name, len);
    /* Both envelopes are one oneof; its case is the first field's quantifier. */
    uint32_t kind;
    memcpy(&kind, (const char *)m + d->fields[0].quantifier_offset, sizeof kind);
    if (kind == 0) {
        protobuf_c_message_free_unpacked(m, NULL);
        return river_err_set(RIVER_EPROTO, "pair: %s frame without a message kind",
                             d->short_name);
    }
    *out = m;
    return 0;
}

/* Packs an envelope into a ZMQ message and sends it without waiting. */
static int pair__send(void *sock, const ProtobufCMessage *env, int flags)
{
    size_t n = protobuf_c_message_get_packed_size(env);
    zmq_msg_t m;
    if (zmq_msg_init_size(&m, n))
        return river_err_set(RIVER_ENOMEM, "pair: message of %zu bytes", n);
    protobuf_c_message_pack(env, zmq_msg_data(&m));
    if (zmq_msg_send(&m, sock, flags | ZMQ_DONTWAIT) < 0) {
        int err = errno;
        zmq_msg_close(&m);
        return river_err_set(err == EHOSTUNREACH || err == EAGAIN ? RIVER_EUNAVAILABLE
                                                                  : RIVER_ESYS,
                             "pair: sending: %s", zmq_strerror(err));
    }
    return 0;
}

/* A pidfd for a peer process (readable once it ends), or -1 when the kernel has none:
 * liveness then rests on heartbeats alone. */
static int pair__pidfd(pid_t pid)
{
    int fd = pidfd_open(pid, 0);
    if (fd < 0)
        wlog(WLOG_WARN, "pidfd_open(%d): %s; the peer's end is noticed by heartbeats only",
             (int)pid, strerror(errno));
    return fd;
}

/* Largest frame a layer request or reply of this shape takes: hidden states, positions
 * and tables (every int at most 10 bytes on the wire), and room for the rest. */
static size_t pair__frame_limit(int max_rows, int dim, int max_seq_len, int page_size)
{
    size_t rows = (size_t)max_rows;
    size_t pages = (size_t)(max_seq_len / page_size + 2);
    return 4096 + rows * (size_t)dim * sizeof(float) + rows * 40 + rows * pages * 10;
}

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
    wlog(WLOG_WARN, "backbone peer at %s lost: %s; requests that need layers >= %d fail "
         "with UNAVAILABLE until it is back", p->cfg.endpoint, why, p->cfg.boundary);
    pair__river_close(p);
    p->state = PAIR_IDLE;
    p->backoff_ms = p->cfg.heartbeat_ms;
    p->hello_at = now + p->backoff_ms;
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
    int e = pair__send(p->sock, &env->base, 0);
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
    kv.dtype = "f32";
    kv.bytes = kv_pool_shared_bytes((int)kv.n_layers, v->kv_dim, v->page_size, v->n_pages);
    River__Pair__PairHello h = RIVER__PAIR__PAIR_HELLO__INIT;
    h.protocol = PAIR_PROTOCOL;
    h.river_id = p->river_id;
    h.river_pid = (uint32_t)getpid();
    h.memfd = p->memfd;
    h.kv = &kv;
    h.fingerprint = p->fingerprint;
    h.boundary = (uint32_t)p->cfg.boundary;
    h.backend = p->backend;
    h.threads = (uint32_t)p->cfg.threads;
    h.max_rows = (uint32_t)p->cfg.max_rows;
    h.heartbeat_ms = (uint32_t)p->cfg.heartbeat_ms;
    h.liveness = (uint32_t)p->cfg.liveness;
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
    p->max_reply = pair__frame_limit(cfg->max_rows, m->cfg.dim, m->cfg.max_seq_len,
                                     kv_pool_page_size(kv));
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
    int e = pair__decode(&river__pair__backbone_message__descriptor, zmq_msg_data(msg),
                         zmq_msg_size(msg), p->max_reply, &out);
    if (e) {
        wlog(WLOG_WARN, "bad frame from the backbone peer: %s", river_err_detail());
        return;
    }
    p->last_recv_ms = now;
    River__Pair__BackboneMessage *bm = (River__Pair__BackboneMessage *)out;
    char buf[128];
    if (p->state == PAIR_HELLO &&
        bm->kind_case == RIVER__PAIR__BACKBONE_MESSAGE__KIND_HELLO_OK) {
        const River__Pair__PairHelloOk *ok = bm->hello_ok;
        p->state = PAIR_READY;
        p->ever_paired = true;
        p->backoff_ms = p->cfg.heartbeat_ms;
        p->peer_pid = (pid_t)ok->backbone_pid;
        p->pidfd = ok->backbone_pid > 0 ? pair__pidfd(p->peer_pid) : -1;
        wlog(WLOG_INFO, "paired with the backbone worker at %s (pid %u): layers %u..%u run "
             "there, the KV pool is shared", p->cfg.endpoint, ok->backbone_pid,
             ok->layer_begin, ok->layer_end ? ok->layer_end - 1 : 0);
    } else if (p->state == PAIR_HELLO &&
               bm->kind_case == RIVER__PAIR__BACKBONE_MESSAGE__KIND_ERROR) {
        snprintf(p->refusal, sizeof p->refusal, "the backbone worker at %s refused the "
                 "pair: %s", p->cfg.endpoint,
                 pair__printable(bm->error->message, buf, sizeof buf));
        wlog(WLOG_ERROR, "%s", p->refusal);
        /* Refused at start-up, the configuration is wrong and stays wrong; later, the
         * backbone may have been restarted with another, and may be fixed again. */
        if (!p->ever_paired)
            p->refused = true;
        pair__river_close(p);
        p->state = PAIR_IDLE;
        p->hello_at = now + p->backoff_ms;
        p->backoff_ms = p->backoff_ms * 2 > p->cfg.backoff_max_ms ? p->cfg.backoff_max_ms
                                                                  : p->backoff_ms * 2;
    } else if (p->state == PAIR_READY &&
               bm->kind_case == RIVER__PAIR__BACKBONE_MESSAGE__KIND_ERROR &&
               bm->error->seq == 0) {
        /* The backbone no longer knows this pairing (it timed this side out). */
        pair__river_lost(p, now, pair__printable(bm->error->message, buf, sizeof buf));
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
                wlog(WLOG_ERROR, "receiving from the backbone peer: %s", zmq_strerror(err));
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
            wlog(WLOG_ERROR, "%s", river_err_detail());
            p->hello_at = now + p->backoff_ms;
            return;
        }
        if (pair__river_hello(p, now)) {
            wlog(WLOG_ERROR, "hello to the backbone peer: %s", river_err_detail());
            pair__river_close(p);
            p->hello_at = now + p->backoff_ms;
            return;
        }
        wlog(WLOG_DEBUG, "PairHello sent to %s", p->cfg.endpoint);
        p->state = PAIR_HELLO;
        p->hello_deadline = now + p->cfg.heartbeat_ms * p->cfg.liveness;
        return;
    case PAIR_HELLO:
        if (now < p->hello_deadline)
            return;
        /* A backbone that is not up yet: the hello may sit in a queue of a connection
         * that never comes; start over with a fresh socket after the back-off. */
        wlog(p->ever_paired ? WLOG_DEBUG : WLOG_INFO, "no answer from the backbone worker "
             "at %s yet; trying again in %lld ms", p->cfg.endpoint, (long long)p->backoff_ms);
        pair__river_close(p);
        p->state = PAIR_IDLE;
        p->hello_at = now + p->backoff_ms;
        p->backoff_ms = p->backoff_ms * 2 > p->cfg.backoff_max_ms ? p->cfg.backoff_max_ms
                                                                  : p->backoff_ms * 2;
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
static int pair__river_wait(pair_river_t *p, int layer, size_t bytes, float *x)
{
    int64_t start = link_clock_ms();
    int64_t deadline = start + p->cfg.reply_timeout_ms;
    char buf[128];
    for (;;) {
        int64_t now = link_clock_ms();
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
        now = link_clock_ms();
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
            int e = pair__decode(&river__pair__backbone_message__descriptor, zmq_msg_data(&m),
                                 zmq_msg_size(&m), p->max_reply, &out);
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
                size_t got = bm->layer->hidden.len;
                if (got == bytes)
                    memcpy(x, bm->layer->hidden.data, bytes);
                protobuf_c_message_free_unpacked(out, NULL);
                if (got != bytes) {
                    pair__river_lost(p, now, "reply of the wrong size");
                    return river_err_set(RIVER_EUNAVAILABLE, "backbone peer: layer %d reply "
                                         "of %zu bytes, expected %zu", layer, got, bytes);
                }
                return 0;
            }
            if (bm->kind_case == RIVER__PAIR__BACKBONE_MESSAGE__KIND_ERROR &&
                (bm->error->seq == p->seq || bm->error->seq == 0)) {
                int lost = bm->error->seq == 0;
                e = river_err_set(lost ? RIVER_EUNAVAILABLE : RIVER_EIO,
                                  "backbone worker, layer %d: %s", layer,
                                  pair__printable(bm->error->message, buf, sizeof buf));
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

static int pair__river_run(void *user, int layer, int n, const int32_t *pos,
                           const int32_t *const *page_table, float *x)
{
    pair_river_t *p = user;
    if (p->state != PAIR_READY)
        return river_err_set(RIVER_EUNAVAILABLE, "backbone layer %d: the backbone worker at "
                             "%s is not paired with this river worker", layer,
                             p->cfg.endpoint);
    if (n <= 0 || n > p->cfg.max_rows)
        return river_err_set(RIVER_EINVAL, "pair: %d rows (max %d)", n, p->cfg.max_rows);
    double t0 = pair__now_s();
    size_t n_tables = 0, n_pages = 0;
    int e = pair__river_tables(p, n, pos, page_table, &n_tables, &n_pages);
    if (e)
        return e;
    size_t bytes = (size_t)n * (size_t)p->m->cfg.dim * sizeof(float);
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
    q.hidden.len = bytes;
    q.hidden.data = (uint8_t *)x;
    River__Pair__RiverMessage env = RIVER__PAIR__RIVER_MESSAGE__INIT;
    env.kind_case = RIVER__PAIR__RIVER_MESSAGE__KIND_LAYER;
    env.layer = &q;
    int64_t now = link_clock_ms();
    if ((e = pair__river_send(p, &env, now))) {
        char why[128];
        snprintf(why, sizeof why, "%s", river_err_detail());
        pair__river_lost(p, now, why);
        return river_err_set(RIVER_EUNAVAILABLE, "backbone peer: %s", why);
    }
    if ((e = pair__river_wait(p, layer, bytes, x)))
        return e;
    p->trips++;
    p->trip_s += pair__now_s() - t0;
    return 0;
}

void pair_river_remote(pair_river_t *p, fwd_remote_t *r)
{
    r->user = p;
    r->boundary = p->cfg.boundary;
    r->run = pair__river_run;
}

/* ---- The backbone side ---- */

struct pair_backbone {
    void *sock;
    pair_backbone_config_t cfg;
    char *endpoint, *fingerprint, *backend;
    const model_t *m;
    backend_t *be;
    /* The session with one river worker, while paired. */
    bool paired;
    uint8_t route[256];       /* its routing id on the ROUTER */
    size_t route_len;
    char river_id[96];
    pid_t river_pid;
    int pidfd;                /* -1 when none */
    kv_pool_t *kv;            /* the river's pool, attached */
    forward_t *fwd;
    int max_rows;
    int64_t heartbeat_ms;
    int liveness;
    int64_t last_recv_ms;
    size_t max_frame;
    float *x;                 /* (max_rows, dim) the rows of one request */
    const int32_t **tables;   /* (max_rows) each row's page table */
    int64_t requests;
    double busy_s;
};

static void pair__backbone_end(pair_backbone_t *p, const char *why)
{
    if (!p->paired)
        return;
    wlog(WLOG_WARN, "session with river %s (pid %d) ended: %s; %lld layer requests served "
         "in %.3f s; waiting for a new PairHello", p->river_id, (int)p->river_pid, why,
         (long long)p->requests, p->busy_s);
    forward_destroy(&p->fwd);
    kv_pool_destroy(&p->kv);
    free(p->x);
    free(p->tables);
    p->x = NULL;
    p->tables = NULL;
    if (p->pidfd >= 0)
        close(p->pidfd);
    p->pidfd = -1;
    p->paired = false;
    p->route_len = 0;
}

int pair_backbone_new(pair_backbone_t **out, void *zctx, const pair_backbone_config_t *cfg,
                      const model_t *m, backend_t *be)
{
    if (cfg->boundary < 1 || cfg->boundary >= m->cfg.n_layers)
        return river_err_set(RIVER_ECONFIG, "split.boundary %d: must be in 1..%d for a model "
                             "of %d layers", cfg->boundary, m->cfg.n_layers - 1,
                             m->cfg.n_layers);
    if (!cfg->endpoint || !cfg->endpoint[0])
        return river_err_set(RIVER_ECONFIG, "split.peer: the address to bind for the river "
                             "worker is not configured");
    pair_backbone_t *p = calloc(1, sizeof *p);
    if (!p)
        return river_err_set(RIVER_ENOMEM, "pair");
    p->cfg = *cfg;
    p->m = m;
    p->be = be;
    p->pidfd = -1;
    p->endpoint = strdup(cfg->endpoint);
    p->fingerprint = strdup(cfg->fingerprint);
    p->backend = strdup(cfg->backend);
    int e;
    if (!p->endpoint || !p->fingerprint || !p->backend) {
        e = river_err_set(RIVER_ENOMEM, "pair: configuration");
        goto fail;
    }
    p->cfg.endpoint = p->endpoint;
    p->cfg.fingerprint = p->fingerprint;
    p->cfg.backend = p->backend;
    p->sock = zmq_socket(zctx, ZMQ_ROUTER);
    if (!p->sock) {
        e = river_err_set(RIVER_ESYS, "pair: zmq_socket: %s", zmq_strerror(errno));
        goto fail;
    }
    int one = 1, zero = 0;
    /* Mandatory: a reply to a river that is gone fails at once instead of vanishing. */
    if (zmq_setsockopt(p->sock, ZMQ_ROUTER_MANDATORY, &one, sizeof one) ||
        zmq_setsockopt(p->sock, ZMQ_LINGER, &zero, sizeof zero) ||
        zmq_setsockopt(p->sock, ZMQ_SNDHWM, &zero, sizeof zero) ||
        zmq_setsockopt(p->sock, ZMQ_RCVHWM, &zero, sizeof zero)) {
        e = river_err_set(RIVER_ESYS, "pair: zmq_setsockopt: %s", zmq_strerror(errno));
        goto fail;
    }
    if (zmq_bind(p->sock, p->endpoint)) {
        e = river_err_set(RIVER_ESYS, "pair: binding %s: %s", p->endpoint,
                          zmq_strerror(errno));
        goto fail;
    }
    *out = p;
    return 0;

fail:
    pair_backbone_destroy(&p);
    return e;
}

void pair_backbone_destroy(pair_backbone_t **pp)
{
    pair_backbone_t *p = *pp;
    if (!p)
        return;
    pair__backbone_end(p, "the backbone worker is stopping");
    if (p->sock)
        zmq_close(p->sock);
    free(p->endpoint);
    free(p->fingerprint);
    free(p->backend);
    free(p);
    *pp = NULL;
}

bool pair_backbone_paired(const pair_backbone_t *p) { return p->paired; }

/* Sends an envelope to the peer of that routing id. */
static void pair__backbone_send(pair_backbone_t *p, const uint8_t *route, size_t route_len,
                                River__Pair__BackboneMessage *env)
{
    if (zmq_send(p->sock, route, route_len, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0) {
        wlog(WLOG_WARN, "cannot reply to the river peer: %s", zmq_strerror(errno));
        return;
    }
    if (pair__send(p->sock, &env->base, 0))
        wlog(WLOG_WARN, "cannot reply to the river peer: %s", river_err_detail());
}

static void pair__backbone_error(pair_backbone_t *p, const uint8_t *route, size_t route_len,
                                 uint64_t seq, const char *message)
{
    River__Pair__PairError err = RIVER__PAIR__PAIR_ERROR__INIT;
    err.seq = seq;
    err.message = (char *)message;
    River__Pair__BackboneMessage env = RIVER__PAIR__BACKBONE_MESSAGE__INIT;
    env.kind_case = RIVER__PAIR__BACKBONE_MESSAGE__KIND_ERROR;
    env.error = &err;
    pair__backbone_send(p, route, route_len, &env);
}

/* What the hello asks for against what this side is; the first difference, as a
 * sentence for both logs. */
static int pair__hello_check(const pair_backbone_t *p, const River__Pair__PairHello *h)
{
    const model_config_t *c = &p->m->cfg;
    int kvd = c->n_kv_heads * c->head_dim;
    char a[128], b[128];
    if (h->protocol != PAIR_PROTOCOL)
        return river_err_set(RIVER_EPROTO, "pair protocol %u, this backbone speaks %d",
                             h->protocol, PAIR_PROTOCOL);
    if (strcmp(h->fingerprint, p->cfg.fingerprint) != 0)
        return river_err_set(RIVER_EINVAL, "model fingerprint %s differs from this "
                             "backbone's %s: the two workers load different models",
                             pair__printable(h->fingerprint, a, sizeof a), p->cfg.fingerprint);
    if (h->boundary != (uint32_t)p->cfg.boundary)
        return river_err_set(RIVER_EINVAL, "boundary %u differs from this backbone's "
                             "split.boundary %d", h->boundary, p->cfg.boundary);
    if (strcmp(h->backend, p->cfg.backend) != 0 || h->threads != (uint32_t)p->cfg.threads)
        return river_err_set(RIVER_EINVAL, "kernels %s with %u threads differ from this "
                             "backbone's %s with %d: the pair would not give the tokens of "
                             "one worker bit for bit (configure the same threads)",
                             pair__printable(h->backend, b, sizeof b), h->threads,
                             p->cfg.backend, p->cfg.threads);
    const River__Pair__KvGeometry *g = h->kv;
    if (!g)
        return river_err_set(RIVER_EINVAL, "hello without the KV pool's geometry");
    if (g->n_layers != (uint32_t)c->n_layers || g->kv_dim != (uint32_t)kvd ||
        strcmp(g->dtype, "f32") != 0 || g->page_size == 0 || g->page_size > 65536 ||
        g->n_pages == 0 || g->n_pages > (1u << 24))
        return river_err_set(RIVER_EINVAL, "KV geometry of %u layers, kv_dim %u, %u pages of "
                             "%u, dtype %s does not fit this model (%d layers, kv_dim %d, "
                             "f32)", g->n_layers, g->kv_dim, g->n_pages, g->page_size,
                             pair__printable(g->dtype, a, sizeof a), c->n_layers, kvd);
    size_t bytes = kv_pool_shared_bytes((int)g->n_layers, (int)g->kv_dim, (int)g->page_size,
                                        (int)g->n_pages);
    if (!bytes || g->bytes != bytes)
        return river_err_set(RIVER_EINVAL, "KV geometry says %" PRIu64 " bytes, %u pages of "
                             "%u positions take %zu", g->bytes, g->n_pages, g->page_size,
                             bytes);
    if (h->max_rows == 0 || h->max_rows > PAIR_MAX_ROWS)
        return river_err_set(RIVER_EINVAL, "max_rows %u outside 1..%d", h->max_rows,
                             PAIR_MAX_ROWS);
    if (h->heartbeat_ms < PAIR_HEARTBEAT_MIN_MS || h->heartbeat_ms > PAIR_HEARTBEAT_MAX_MS ||
        h->liveness == 0 || h->liveness > PAIR_LIVENESS_MAX)
        return river_err_set(RIVER_EINVAL, "heartbeat %u ms, liveness %u outside [%d, %d] "
                             "and [1, %d]", h->heartbeat_ms, h->liveness,
                             PAIR_HEARTBEAT_MIN_MS, PAIR_HEARTBEAT_MAX_MS, PAIR_LIVENESS_MAX);
    if (h->river_pid == 0 || h->river_pid > INT_MAX || h->memfd < 0)
        return river_err_set(RIVER_EINVAL, "river pid %u, descriptor %d", h->river_pid,
                             h->memfd);
    return 0;
}

/* Opens the river's KV memory and builds the session. */
static int pair__backbone_pair(pair_backbone_t *p, const River__Pair__PairHello *h,
                               const uint8_t *route, size_t route_len, int64_t now)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%u/fd/%d", h->river_pid, h->memfd);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0)
        return river_err_set(RIVER_ESYS, "cannot open the river's KV memory %s: %s (the "
                             "pair must run on one host as one user)", path, strerror(errno));
    const River__Pair__KvGeometry *g = h->kv;
    int e = kv_pool_attach(&p->kv, p->be, fd, (int)g->n_layers, (int)g->kv_dim,
                           (int)g->page_size, (int)g->n_pages);
    close(fd);
    if (e)
        return e;
    int dim = p->m->cfg.dim;
    p->max_rows = (int)h->max_rows;
    if ((e = forward_new(&p->fwd, p->m, p->be, p->max_rows)))
        goto fail;
    p->x = malloc((size_t)p->max_rows * (size_t)dim * sizeof *p->x);
    p->tables = malloc((size_t)p->max_rows * sizeof *p->tables);
    if (!p->x || !p->tables) {
        e = river_err_set(RIVER_ENOMEM, "pair: buffers for %d rows", p->max_rows);
        goto fail;
    }
    /* The pid is alive now: the river waits for this answer. */
    p->pidfd = pair__pidfd((pid_t)h->river_pid);
    p->river_pid = (pid_t)h->river_pid;
    pair__printable(h->river_id, p->river_id, sizeof p->river_id);
    memcpy(p->route, route, route_len);
    p->route_len = route_len;
    p->heartbeat_ms = h->heartbeat_ms;
    p->liveness = (int)h->liveness;
    p->last_recv_ms = now;
    p->max_frame = pair__frame_limit(p->max_rows, dim, p->m->cfg.max_seq_len,
                                     (int)g->page_size);
    p->requests = 0;
    p->busy_s = 0;
    p->paired = true;
    return 0;

fail:
    forward_destroy(&p->fwd);
    kv_pool_destroy(&p->kv);
    free(p->x);
    free(p->tables);
    p->x = NULL;
    p->tables = NULL;
    return e;
}

static void pair__backbone_hello(pair_backbone_t *p, const River__Pair__PairHello *h,
                                 const uint8_t *route, size_t route_len, int64_t now)
{
    char id[96];
    pair__printable(h->river_id, id, sizeof id);
    int e = pair__hello_check(p, h);
    /* One river at a time. The same river process may start over (after it timed this
     * side out, from a fresh socket); another one waits until the first is gone. */
    if (!e && p->paired && (pid_t)h->river_pid != p->river_pid &&
        (route_len != p->route_len || memcmp(route, p->route, route_len) != 0))
        e = river_err_set(RIVER_ESTATE, "this backbone is paired with river %s (pid %d), "
                          "which is alive", p->river_id, (int)p->river_pid);
    if (e) {
        wlog(WLOG_WARN, "PairHello from river %s (pid %u) refused: %s", id, h->river_pid,
             river_err_detail());
        pair__backbone_error(p, route, route_len, 0, river_err_detail());
        return;
    }
    pair__backbone_end(p, "the river said hello again");
    if ((e = pair__backbone_pair(p, h, route, route_len, now))) {
        wlog(WLOG_WARN, "PairHello from river %s (pid %u): %s", id, h->river_pid,
             river_err_detail());
        pair__backbone_error(p, route, route_len, 0, river_err_detail());
        return;
    }
    River__Pair__PairHelloOk ok = RIVER__PAIR__PAIR_HELLO_OK__INIT;
    ok.backbone_pid = (uint32_t)getpid();
    ok.layer_begin = (uint32_t)p->cfg.boundary;
    ok.layer_end = (uint32_t)p->m->cfg.n_layers;
    River__Pair__BackboneMessage env = RIVER__PAIR__BACKBONE_MESSAGE__INIT;
    env.kind_case = RIVER__PAIR__BACKBONE_MESSAGE__KIND_HELLO_OK;
    env.hello_ok = &ok;
    pair__backbone_send(p, route, route_len, &env);
    wlog(WLOG_INFO, "paired with river %s (pid %d): layers %d..%d of %d rows at most, %u KV "
         "pages of %u positions shared", p->river_id, (int)p->river_pid, p->cfg.boundary,
         p->m->cfg.n_layers - 1, p->max_rows, h->kv->n_pages, h->kv->page_size);
}

/* Checks a layer request against the session and the pool; fills p->tables. */
static int pair__layer_check(pair_backbone_t *p, const River__Pair__LayerRequest *q)
{
    const model_config_t *c = &p->m->cfg;
    const kv_view_t *v = kv_pool_view(p->kv);
    if (q->layer < (uint32_t)p->cfg.boundary || q->layer >= (uint32_t)c->n_layers)
        return river_err_set(RIVER_EINVAL, "layer %u is not one of this backbone's %d..%d",
                             q->layer, p->cfg.boundary, c->n_layers - 1);
    if (q->n == 0 || q->n > (uint32_t)p->max_rows || q->n_pos != q->n ||
        q->n_row_table != q->n)
        return river_err_set(RIVER_EINVAL, "%u rows with %zu positions and %zu table "
                             "indices (at most %d rows)", q->n, q->n_pos, q->n_row_table,
                             p->max_rows);
    size_t bytes = (size_t)q->n * (size_t)c->dim * sizeof(float);
    if (q->hidden.len != bytes)
        return river_err_set(RIVER_EINVAL, "%zu bytes of hidden states for %u rows of %d, "
                             "expected %zu", q->hidden.len, q->n, c->dim, bytes);
    if (q->n_table_len == 0 || q->n_table_len > q->n)
        return river_err_set(RIVER_EINVAL, "%zu page tables for %u rows", q->n_table_len,
                             q->n);
    size_t total = 0;
    for (size_t t = 0; t < q->n_table_len; t++)
        total += q->table_len[t];
    if (total != q->n_pages)
        return river_err_set(RIVER_EINVAL, "page tables of %zu entries in all, %zu page ids "
                             "sent", total, q->n_pages);
    for (size_t i = 0; i < q->n_pages; i++)
        if (q->pages[i] < 0 || q->pages[i] >= v->n_pages)
            return river_err_set(RIVER_ERANGE, "page %d outside the pool of %d", q->pages[i],
                                 v->n_pages);
    for (uint32_t i = 0; i < q->n; i++) {
        uint32_t t = q->row_table[i];
        if (t >= q->n_table_len)
            return river_err_set(RIVER_EINVAL, "row %u names table %u of %zu", i, t,
                                 q->n_table_len);
        int32_t pos = q->pos[i];
        if (pos < 0 || pos >= c->max_seq_len || (uint32_t)(pos / v->page_size) >= q->table_len[t])
            return river_err_set(RIVER_ERANGE, "row %u at position %d: outside the context "
                                 "of %d or past its page table of %u pages", i, pos,
                                 c->max_seq_len, q->table_len[t]);
    }
    /* Tables follow each other in pages; each row points at its own. */
    size_t start = 0;
    for (size_t t = 0; t < q->n_table_len; t++) {
        for (uint32_t i = 0; i < q->n; i++)
            if (q->row_table[i] == t)
                p->tables[i] = q->pages + start;
        start += q->table_len[t];
    }
    return 0;
}

static void pair__backbone_layer(pair_backbone_t *p, const River__Pair__LayerRequest *q)
{
    double t0 = pair__now_s();
    int e = pair__layer_check(p, q);
    if (!e) {
        /* The bytes in the frame need not be aligned for floats. */
        memcpy(p->x, q->hidden.data, q->hidden.len);
        e = forward_layer_rows(p->fwd, p->kv, (int)q->layer, (int)q->n, q->pos,
                               (const int32_t *const *)p->tables, p->x);
    }
    if (e) {
        wlog(WLOG_WARN, "layer request %" PRIu64 " of river %s: %s", q->seq, p->river_id,
             river_err_detail());
        pair__backbone_error(p, p->route, p->route_len, q->seq, river_err_detail());
        return;
    }
    River__Pair__LayerReply r = RIVER__PAIR__LAYER_REPLY__INIT;
    r.seq = q->seq;
    r.hidden.len = q->hidden.len;
    r.hidden.data = (uint8_t *)p->x;
    River__Pair__BackboneMessage env = RIVER__PAIR__BACKBONE_MESSAGE__INIT;
    env.kind_case = RIVER__PAIR__BACKBONE_MESSAGE__KIND_LAYER;
    env.layer = &r;
    pair__backbone_send(p, p->route, p->route_len, &env);
    p->requests++;
    p->busy_s += pair__now_s() - t0;
}

/* One message from a river: [routing id][envelope]. */
static void pair__backbone_handle(pair_backbone_t *p, const uint8_t *route, size_t route_len,
                                  zmq_msg_t *body, int parts, int64_t now)
{
    bool from_peer = p->paired && route_len == p->route_len &&
                     memcmp(route, p->route, route_len) == 0;
    if (parts != 2) {
        char msg[96];
        snprintf(msg, sizeof msg, "expected one frame per message, got %d", parts - 1);
        pair__backbone_error(p, route, route_len, 0, msg);
        return;
    }
    ProtobufCMessage *out;
    int e = pair__decode(&river__pair__river_message__descriptor, zmq_msg_data(body),
                         zmq_msg_size(body), from_peer ? p->max_frame : PAIR_HELLO_MAX_BYTES,
                         &out);
    if (e) {
        wlog(WLOG_WARN, "bad frame from a river peer: %s", river_err_detail());
        pair__backbone_error(p, route, route_len, 0, river_err_detail());
        return;
    }
    River__Pair__RiverMessage *rm = (River__Pair__RiverMessage *)out;
    if (from_peer)
        p->last_recv_ms = now;
    switch (rm->kind_case) {
    case RIVER__PAIR__RIVER_MESSAGE__KIND_HELLO:
        pair__backbone_hello(p, rm->hello, route, route_len, now);
        break;
    case RIVER__PAIR__RIVER_MESSAGE__KIND_LAYER:
        if (from_peer)
            pair__backbone_layer(p, rm->layer);
        else
            pair__backbone_error(p, route, route_len, 0, "not paired: send PairHello first");
        break;
    case RIVER__PAIR__RIVER_MESSAGE__KIND_PING:
        if (from_peer) {
            River__Pair__Pong pong = RIVER__PAIR__PONG__INIT;
            River__Pair__BackboneMessage env = RIVER__PAIR__BACKBONE_MESSAGE__INIT;
            env.kind_case = RIVER__PAIR__BACKBONE_MESSAGE__KIND_PONG;
            env.pong = &pong;
            pair__backbone_send(p, route, route_len, &env);
        } else {
            pair__backbone_error(p, route, route_len, 0, "not paired: send PairHello first");
        }
        break;
    default:
        break;
    }
    protobuf_c_message_free_unpacked(out, NULL);
}

/* Reads every message waiting on the ROUTER. */
static void pair__backbone_drain(pair_backbone_t *p, int64_t now)
{
    for (;;) {
        zmq_msg_t id, body;
        zmq_msg_init(&id);
        if (zmq_msg_recv(&id, p->sock, ZMQ_DONTWAIT) < 0) {
            int err = errno;
            zmq_msg_close(&id);
            if (err != EAGAIN && err != EINTR)
                wlog(WLOG_ERROR, "receiving from river peers: %s", zmq_strerror(err));
            return;
        }
        uint8_t route[256];
        size_t route_len = zmq_msg_size(&id) < sizeof route ? zmq_msg_size(&id) : sizeof route;
        memcpy(route, zmq_msg_data(&id), route_len);
        int parts = 1, more = zmq_msg_more(&id);
        zmq_msg_close(&id);
        zmq_msg_init(&body);
        /* The body is the first part after the id; any further part is read and dropped so
         * that the next message starts clean. */
        while (more) {
            zmq_msg_t part;
            zmq_msg_init(&part);
            if (zmq_msg_recv(&part, p->sock, ZMQ_DONTWAIT) < 0) {
                zmq_msg_close(&part);
                break;
            }
            more = zmq_msg_more(&part);
            if (parts++ == 1) {
                zmq_msg_close(&body);
                body = part;
            } else {
                zmq_msg_close(&part);
            }
        }
        if (parts >= 2)
            pair__backbone_handle(p, route, route_len, &body, parts, now);
        zmq_msg_close(&body);
    }
}

int pair_backbone_poll_items(pair_backbone_t *p, zmq_pollitem_t *items)
{
    int n = 0;
    items[n++] = (zmq_pollitem_t){.socket = p->sock, .events = ZMQ_POLLIN};
    if (p->paired && p->pidfd >= 0)
        items[n++] = (zmq_pollitem_t){.fd = p->pidfd, .events = ZMQ_POLLIN};
    return n;
}

void pair_backbone_on_poll(pair_backbone_t *p, const zmq_pollitem_t *items, int n, int64_t now)
{
    int pidfd = p->pidfd;
    bool gone = false, input = false;
    for (int i = 0; i < n; i++) {
        if (!(items[i].revents & ZMQ_POLLIN))
            continue;
        if (items[i].socket == p->sock)
            input = true;
        else if (!items[i].socket && items[i].fd == pidfd && pidfd >= 0)
            gone = true;
    }
    if (gone && pidfd == p->pidfd)
        pair__backbone_end(p, "the river process exited");
    if (input)
        pair__backbone_drain(p, now);
}

void pair_backbone_tick(pair_backbone_t *p, int64_t now)
{
    if (p->paired && now - p->last_recv_ms > p->heartbeat_ms * p->liveness) {
        char why[96];
        snprintf(why, sizeof why, "the river was silent for %lld ms",
                 (long long)(now - p->last_recv_ms));
        pair__backbone_end(p, why);
    }
}

int64_t pair_backbone_next_ms(const pair_backbone_t *p)
{
    return p->paired ? p->last_recv_ms + p->heartbeat_ms * p->liveness + 1 : INT64_MAX;
}
