/* The backbone side of the split pair: answers hellos, runs the layers the river asks for
 * on the shared KV pool, watches the river's liveness (workers/pair.h). */
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

/* ---- The backbone side ---- */

struct pair_backbone {
    void *sock;
    pair_backbone_config_t cfg;
    pair_transport_kind_t want; /* split.transport as configured, auto kept: on one GPU
                                   with its river, auto comes to p2p instead of nccl */
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
    pair_transport_t *tr;     /* how the hidden states cross */
    void *x;                  /* (max_rows, dim) the rows of one request: host f32, or a
                                 backend buffer where the transport moves device memory */
    const int32_t **tables;   /* (max_rows) each row's page table */
    int64_t requests;
    double busy_s;
};

/* Frees what a session holds. */
static void pair__backbone_drop(pair_backbone_t *p)
{
    if (p->x && p->tr && pair_transport_on_device(p->tr))
        p->be->ops->buf_free(p->be->ctx, p->x);
    else
        free(p->x);
    p->x = NULL;
    pair_transport_destroy(&p->tr);
    forward_destroy(&p->fwd);
    kv_pool_destroy(&p->kv);
    free(p->tables);
    p->tables = NULL;
}

static void pair__backbone_end(pair_backbone_t *p, const char *why)
{
    if (!p->paired)
        return;
    log_warn("session with river %s (pid %d) ended: %s; %lld layer requests served "
             "in %.3f s; waiting for a new PairHello", p->river_id, (int)p->river_pid, why,
             (long long)p->requests, p->busy_s);
    pair__backbone_drop(p);
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
    p->want = (pair_transport_kind_t)cfg->transport;
    p->cfg.transport = (int)pair_transport_resolve(p->want, be);
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
        log_warn("cannot reply to the river peer: %s", zmq_strerror(errno));
        return;
    }
    if (pair_wire_send(p->sock, &env->base, 0))
        log_warn("cannot reply to the river peer: %s", river_err_detail());
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
 * sentence for both logs. *kind: the transport both take. */
static int pair__hello_check(const pair_backbone_t *p, const River__Pair__PairHello *h,
                             pair_transport_kind_t *kind)
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
                             pair_wire_printable(h->fingerprint, a, sizeof a),
                             p->cfg.fingerprint);
    if (h->boundary != (uint32_t)p->cfg.boundary)
        return river_err_set(RIVER_EINVAL, "boundary %u differs from this backbone's "
                             "split.boundary %d", h->boundary, p->cfg.boundary);
    if (strcmp(h->backend, p->cfg.backend) != 0)
        return river_err_set(RIVER_EINVAL, "kernels %s differ from this backbone's %s: the "
                             "pair would not give the tokens of one worker bit for bit "
                             "(configure the same device)",
                             pair_wire_printable(h->backend, b, sizeof b), p->cfg.backend);
    /* The same kernels on host threads may still split their sums among threads another
     * way. A device backend runs on no host threads (it counts 0), and its hello may say
     * anything there: the count is compared only where this side's kernels run on host
     * threads (the CPU backend, and the opaque one over it), the same backend as the
     * river's by the check above. */
    if (p->cfg.threads > 0 && h->threads != (uint32_t)p->cfg.threads)
        return river_err_set(RIVER_EINVAL, "kernels %s with %u threads differ from this "
                             "backbone's %s with %d: the pair would not give the tokens of "
                             "one worker bit for bit (configure the same threads)",
                             pair_wire_printable(h->backend, b, sizeof b), h->threads,
                             p->cfg.backend, p->cfg.threads);
    const River__Pair__KvGeometry *g = h->kv;
    if (!g)
        return river_err_set(RIVER_EINVAL, "hello without the KV pool's geometry");
    if (g->n_layers != (uint32_t)c->n_layers || g->kv_dim != (uint32_t)kvd ||
        g->page_size == 0 || g->page_size > 65536 || g->n_pages == 0 ||
        g->n_pages > (1u << 24))
        return river_err_set(RIVER_EINVAL, "KV geometry of %u layers, kv_dim %u, %u pages of "
                             "%u does not fit this model (%d layers, kv_dim %d)", g->n_layers,
                             g->kv_dim, g->n_pages, g->page_size, c->n_layers, kvd);
    /* Both sides read the one pool: its bytes mean one element type to both. */
    if (strcmp(g->dtype, dtype_name(p->cfg.kv_dtype)) != 0)
        return river_err_set(RIVER_EINVAL, "the river's KV pool holds kv.dtype %s, this "
                             "backbone's kv.dtype is %s (configure the same kv.dtype on both)",
                             pair_wire_printable(g->dtype, a, sizeof a),
                             dtype_name(p->cfg.kv_dtype));
    size_t bytes = kv_pool_shared_bytes((int)g->n_layers, (int)g->kv_dim, p->cfg.kv_dtype,
                                        (int)g->page_size, (int)g->n_pages);
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
    if (h->transport >= PAIR_TRANSPORT_COUNT || h->transport_alt >= PAIR_TRANSPORT_COUNT)
        return river_err_set(RIVER_EINVAL, "transport of unknown kind %u (or %u)",
                             h->transport, h->transport_alt);
    int e = pair_transport_choose(p->want, p->be, (pair_transport_kind_t)h->transport,
                                  (pair_transport_kind_t)h->transport_alt,
                                  pair_wire_printable(h->device_uuid, a, sizeof a), kind);
    if (e)
        return e;
    if (h->kv_kind > SHARED_CUDA_IPC)
        return river_err_set(RIVER_EINVAL, "KV memory of unknown kind %u", h->kv_kind);
    if (h->kv_kind == SHARED_CUDA_IPC && h->kv_ipc.len != sizeof(((shared_handle_t *)0)->ipc))
        return river_err_set(RIVER_EINVAL, "CUDA IPC handle of %zu bytes", h->kv_ipc.len);
    if (h->kv_kind != SHARED_CUDA_IPC &&
        (h->river_pid == 0 || h->river_pid > INT_MAX || h->memfd < 0))
        return river_err_set(RIVER_EINVAL, "river pid %u, descriptor %d", h->river_pid,
                             h->memfd);
    return 0;
}

/* Opens the river's KV memory and builds the session. */
static int pair__backbone_pair(pair_backbone_t *p, const River__Pair__PairHello *h,
                               pair_transport_kind_t kind, const uint8_t *route,
                               size_t route_len, int64_t now)
{
    const River__Pair__KvGeometry *g = h->kv;
    shared_handle_t sh = {.kind = h->kv_kind ? (shared_kind_t)h->kv_kind : SHARED_MEMFD,
                          .bytes = (size_t)g->bytes, .fd = -1};
    if (sh.kind == SHARED_CUDA_IPC) {
        memcpy(sh.ipc, h->kv_ipc.data, sizeof sh.ipc);
    } else {
        char path[64];
        snprintf(path, sizeof path, "/proc/%u/fd/%d", h->river_pid, h->memfd);
        sh.fd = open(path, O_RDWR | O_CLOEXEC);
        if (sh.fd < 0)
            return river_err_set(RIVER_ESYS, "cannot open the river's KV memory %s: %s (the "
                                 "pair must run on one host as one user)", path,
                                 strerror(errno));
    }
    int e = kv_pool_attach_handle(&p->kv, p->be, &sh, (int)g->n_layers, (int)g->kv_dim,
                                  p->cfg.kv_dtype, (int)g->page_size, (int)g->n_pages);
    if (sh.fd >= 0)
        close(sh.fd);
    if (e)
        return e;
    int dim = p->m->cfg.dim;
    p->max_rows = (int)h->max_rows;
    if ((e = forward_new(&p->fwd, p->m, p->be, p->max_rows)))
        goto fail;
    if ((e = pair_transport_new(&p->tr, kind, PAIR_SIDE_BACKBONE, p->be, dim, p->max_rows)) ||
        (e = pair_transport_accept(p->tr, h)))
        goto fail;
    size_t elems = (size_t)p->max_rows * (size_t)dim;
    p->x = pair_transport_on_device(p->tr) ? p->be->ops->buf_alloc(p->be->ctx, elems)
                                           : malloc(elems * sizeof(float));
    p->tables = malloc((size_t)p->max_rows * sizeof *p->tables);
    if (!p->x || !p->tables) {
        e = river_err_set(RIVER_ENOMEM, "pair: buffers for %d rows", p->max_rows);
        goto fail;
    }
    /* The pid is alive now: the river waits for this answer. */
    p->pidfd = pair_wire_pidfd((pid_t)h->river_pid);
    p->river_pid = (pid_t)h->river_pid;
    pair_wire_printable(h->river_id, p->river_id, sizeof p->river_id);
    memcpy(p->route, route, route_len);
    p->route_len = route_len;
    p->heartbeat_ms = h->heartbeat_ms;
    p->liveness = (int)h->liveness;
    p->last_recv_ms = now;
    p->max_frame = pair_wire_frame_limit(p->max_rows, dim, p->m->cfg.max_seq_len,
                                         (int)g->page_size);
    p->requests = 0;
    p->busy_s = 0;
    p->paired = true;
    return 0;

fail:
    pair__backbone_drop(p);
    return e;
}

static void pair__backbone_hello(pair_backbone_t *p, const River__Pair__PairHello *h,
                                 const uint8_t *route, size_t route_len, int64_t now)
{
    char id[96];
    pair_wire_printable(h->river_id, id, sizeof id);
    pair_transport_kind_t kind = PAIR_TRANSPORT_ZMQ;
    int e = pair__hello_check(p, h, &kind);
    /* One river at a time. The same river process may start over (after it timed this
     * side out, from a fresh socket); another one waits until the first is gone. */
    if (!e && p->paired && (pid_t)h->river_pid != p->river_pid &&
        (route_len != p->route_len || memcmp(route, p->route, route_len) != 0))
        e = river_err_set(RIVER_ESTATE, "this backbone is paired with river %s (pid %d), "
                          "which is alive", p->river_id, (int)p->river_pid);
    if (e) {
        log_warn("PairHello from river %s (pid %u) refused: %s", id, h->river_pid,
                 river_err_detail());
        pair__backbone_error(p, route, route_len, 0, river_err_detail());
        return;
    }
    pair__backbone_end(p, "the river said hello again");
    if ((e = pair__backbone_pair(p, h, kind, route, route_len, now))) {
        log_warn("PairHello from river %s (pid %u): %s", id, h->river_pid,
                 river_err_detail());
        pair__backbone_error(p, route, route_len, 0, river_err_detail());
        return;
    }
    River__Pair__PairHelloOk ok = RIVER__PAIR__PAIR_HELLO_OK__INIT;
    ok.backbone_pid = (uint32_t)getpid();
    ok.layer_begin = (uint32_t)p->cfg.boundary;
    ok.layer_end = (uint32_t)p->m->cfg.n_layers;
    ok.transport = (uint32_t)pair_transport_kind(p->tr);
    River__Pair__BackboneMessage env = RIVER__PAIR__BACKBONE_MESSAGE__INIT;
    env.kind_case = RIVER__PAIR__BACKBONE_MESSAGE__KIND_HELLO_OK;
    env.hello_ok = &ok;
    pair__backbone_send(p, route, route_len, &env);
    /* The river joins the transport (for nccl: the communicator) when it reads the answer;
     * this side joins now, and both wait for the other. */
    if ((e = pair_transport_connect(p->tr))) {
        char why[256];
        snprintf(why, sizeof why, "transport %s: %s",
                 pair_transport_name(pair_transport_kind(p->tr)), river_err_detail());
        pair__backbone_end(p, why);
        return;
    }
    log_info("paired with river %s (pid %d): layers %d..%d of %d rows at most, %u KV "
             "pages of %u positions shared, transport %s", p->river_id, (int)p->river_pid,
             p->cfg.boundary, p->m->cfg.n_layers - 1, p->max_rows, h->kv->n_pages,
             h->kv->page_size, pair_transport_name(pair_transport_kind(p->tr)));
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
    double t0 = clock_now_s();
    int e = pair__layer_check(p, q);
    if (!e)
        e = pair_transport_get(p->tr, p->x, (int)q->n, &q->hidden);
    if (!e && pair_transport_on_device(p->tr))
        e = forward_layer_rows_dev(p->fwd, p->kv, (int)q->layer, (int)q->n, q->pos,
                                   (const int32_t *const *)p->tables, p->x);
    else if (!e)
        e = forward_layer_rows(p->fwd, p->kv, (int)q->layer, (int)q->n, q->pos,
                               (const int32_t *const *)p->tables, p->x);
    River__Pair__LayerReply r = RIVER__PAIR__LAYER_REPLY__INIT;
    if (!e)
        e = pair_transport_put(p->tr, p->x, (int)q->n, &r.hidden);
    if (e) {
        log_warn("layer request %" PRIu64 " of river %s: %s", q->seq, p->river_id,
                 river_err_detail());
        pair__backbone_error(p, p->route, p->route_len, q->seq, river_err_detail());
        return;
    }
    r.seq = q->seq;
    River__Pair__BackboneMessage env = RIVER__PAIR__BACKBONE_MESSAGE__INIT;
    env.kind_case = RIVER__PAIR__BACKBONE_MESSAGE__KIND_LAYER;
    env.layer = &r;
    pair__backbone_send(p, p->route, p->route_len, &env);
    p->requests++;
    p->busy_s += clock_now_s() - t0;
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
    int e = pair_wire_decode(&river__pair__river_message__descriptor, zmq_msg_data(body),
                             zmq_msg_size(body),
                             from_peer ? p->max_frame : PAIR_HELLO_MAX_BYTES, &out);
    if (e) {
        log_warn("bad frame from a river peer: %s", river_err_detail());
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
                log_error("receiving from river peers: %s", zmq_strerror(err));
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
