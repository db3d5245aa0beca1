/* The worker table: who is connected, what each can take, whether it is alive.
 *
 * Paranoid Pirate on both sides: riverd sends a DaemonHeartbeat to each worker when it
 * sent it nothing else for an interval, and a worker silent for `liveness` intervals is
 * dead. Death (missed beats, a lost connection, or its process ending, which the
 * supervisor reports at once) puts the worker's requests back in the queue; they continue
 * on another worker from the tokens the client already has. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/err.h"
#include "daemon/riverd.h"

/* A dead worker stays listed (admin Workers shows it) this long, unless it comes back. */
#define WORKERS_FORGET_MS 60000

worker_t *workers_by_route(riverd_t *rd, const route_t *r)
{
    return hmap_get(rd->by_route, r->id, r->len);
}

worker_t *workers_by_id(riverd_t *rd, const char *id)
{
    for (int i = 0; i < rd->n_table; i++)
        if (!strcmp(rd->table[i]->id, id))
            return rd->table[i];
    return NULL;
}

bool workers_takes_work(const worker_t *w)
{
    /* The backbone half of a split pair only serves its river worker. */
    return w->state == WORKER_READY && !w->unreachable && !w->reported_unavailable &&
           w->role != RIVER__WORKER__ROLE__ROLE_BACKBONE;
}

void workers_count(riverd_t *rd, int *ready, int *draining, int *dead, int *dispatchable)
{
    int n[3] = {0, 0, 0}, d = 0;
    for (int i = 0; i < rd->n_table; i++) {
        n[rd->table[i]->state]++;
        d += workers_takes_work(rd->table[i]);
    }
    if (ready)
        *ready = n[WORKER_READY];
    if (draining)
        *draining = n[WORKER_DRAINING];
    if (dead)
        *dead = n[WORKER_DEAD];
    if (dispatchable)
        *dispatchable = d;
}

uint64_t workers_kv_pages_free(riverd_t *rd)
{
    uint64_t n = 0;
    for (int i = 0; i < rd->n_table; i++)
        if (rd->table[i]->state != WORKER_DEAD)
            n += rd->table[i]->kv_pages_free;
    return n;
}

/* ---- Entries ---- */

static worker_t *workers__add(riverd_t *rd, const route_t *r)
{
    if (rd->n_table == rd->cap_table) {
        int cap = rd->cap_table ? 2 * rd->cap_table : 8;
        worker_t **t = realloc(rd->table, (size_t)cap * sizeof *t);
        if (!t)
            return NULL;
        rd->table = t;
        rd->cap_table = cap;
    }
    worker_t *w = calloc(1, sizeof *w);
    if (!w)
        return NULL;
    w->route = *r;
    w->slot = -1;
    w->serial = ++rd->worker_serial;
    if (hmap_put(rd->by_route, r->id, r->len, w) < 0) {
        free(w);
        return NULL;
    }
    rd->table[rd->n_table++] = w;
    return w;
}

/* Removes the entry; what it still had goes back to the queue first. */
void workers_forget(riverd_t *rd, worker_t *w)
{
    if (w->reqs)
        dispatch_requeue_worker(rd, w, "worker left");
    dispatch_forget_worker(rd, w);
    supervise_on_forget(rd, w);
    if (hmap_get(rd->by_route, w->route.id, w->route.len) == w)
        hmap_del(rd->by_route, w->route.id, w->route.len);
    for (int i = 0; i < rd->n_table; i++) {
        if (rd->table[i] == w) {
            memmove(&rd->table[i], &rd->table[i + 1],
                    (size_t)(rd->n_table - i - 1) * sizeof *rd->table);
            rd->n_table--;
            break;
        }
    }
    free(w);
}

void workers_destroy_all(riverd_t *rd)
{
    while (rd->n_table)
        workers_forget(rd, rd->table[rd->n_table - 1]);
    free(rd->table);
    rd->table = NULL;
    rd->cap_table = 0;
}

void workers_mark_dead(riverd_t *rd, worker_t *w, const char *why)
{
    if (w->state == WORKER_DEAD)
        return;
    log_warn("worker %s is dead (%s); %d requests to re-dispatch", w->id, why, w->assigned);
    w->state = WORKER_DEAD;
    w->state_since_ms = clock_now_ms();
    w->kv_pages_free = 0;
    w->running = w->queue_length = 0;
    rd->metrics.worker_deaths++;
    dispatch_requeue_worker(rd, w, why);
    dispatch_forget_worker(rd, w);
    /* A supervised worker that stopped answering but still runs is hung: kill it so
     * that the supervisor starts a fresh one. */
    supervise_kill(rd, w);
}

/* ---- Messages to workers ---- */

static void workers__send_heartbeat(riverd_t *rd, worker_t *w)
{
    River__Worker__DaemonHeartbeat hb;
    river__worker__daemon_heartbeat__init(&hb);
    River__Worker__DaemonMessage m;
    river__worker__daemon_message__init(&m);
    m.kind_case = RIVER__WORKER__DAEMON_MESSAGE__KIND_HEARTBEAT;
    m.heartbeat = &hb;
    loop_send_worker(rd, w, &m);
}

static void workers__send_reconnect(riverd_t *rd, const route_t *to, worker_t *w,
                                    const char *why)
{
    int64_t now = clock_now_ms();
    /* A dead worker may still be streaming; one Reconnect per interval is enough. */
    if (w && now - w->last_sent_ms < rd->cfg.heartbeat_ms)
        return;
    River__Worker__Reconnect rc;
    river__worker__reconnect__init(&rc);
    rc.reason = (char *)why;
    River__Worker__DaemonMessage m;
    river__worker__daemon_message__init(&m);
    m.kind_case = RIVER__WORKER__DAEMON_MESSAGE__KIND_RECONNECT;
    m.reconnect = &rc;
    if (w)
        w->last_sent_ms = now;
    if (loop_send_route(rd, to, &m) < 0)
        log_debug("Reconnect not sent: %s", river_err_detail());
}

int workers_drain(riverd_t *rd, worker_t *w, uint32_t deadline_ms)
{
    if (w->state == WORKER_DEAD)
        return river_err_set(RIVER_ESTATE, "worker %s is dead", w->id);
    if (deadline_ms == 0)
        deadline_ms = (uint32_t)rd->cfg.drain_timeout_ms;
    int64_t now = clock_now_ms();
    w->state = WORKER_DRAINING;
    w->state_since_ms = now;
    w->drain_deadline_ms = deadline_ms ? now + deadline_ms : 0;
    River__Worker__Drain d;
    river__worker__drain__init(&d);
    d.deadline_ms = deadline_ms;
    River__Worker__DaemonMessage m;
    river__worker__daemon_message__init(&m);
    m.kind_case = RIVER__WORKER__DAEMON_MESSAGE__KIND_DRAIN;
    m.drain = &d;
    loop_send_worker(rd, w, &m);
    /* New requests of its sessions go elsewhere from now on. */
    dispatch_forget_worker(rd, w);
    log_info("worker %s draining (%d requests left, deadline %u ms)", w->id, w->assigned,
             deadline_ms);
    return 0;
}

/* ---- Messages from workers, one handler per kind ---- */

typedef void (*workers_handler_fn)(riverd_t *rd, const route_t *from, const char *peer,
                                   worker_t *w, const River__Worker__WorkerMessage *m);

static void workers__caps(worker_caps_t *c, const River__Worker__Capabilities *cap)
{
    memset(c, 0, sizeof *c);
    if (!cap)
        return;
    snprintf(c->model, sizeof c->model, "%s", cap->model);
    c->max_batch = cap->max_batch;
    c->max_seqs = cap->max_seqs;
    c->kv_page_size = cap->kv_page_size;
    c->kv_pages_total = cap->kv_pages_total;
    c->n_layers = cap->n_layers;
    c->layer_begin = cap->layer_begin;
    c->layer_end = cap->layer_end;
    c->max_context = cap->max_context;
    c->has_river = cap->has_river;
    c->prefix_seed = cap->prefix_seed;
    /* A worker without a key (an older one) gets no prefix placement. */
    if (prefix_key_from_bytes(&c->prefix_key, cap->prefix_key.data, cap->prefix_key.len))
        c->prefix_seed = 0;
}

static void workers__on_ready(riverd_t *rd, const route_t *from, const char *peer,
                              worker_t *w, const River__Worker__WorkerMessage *m)
{
    const River__Worker__Ready *r = m->ready;
    if (r->protocol != RIVERD_LINK_PROTOCOL) {
        log_error("worker %s speaks link protocol %u, riverd speaks %u: not accepted",
                  r->worker_id, r->protocol, RIVERD_LINK_PROTOCOL);
        return;
    }
    char id[sizeof w->id];
    if (r->worker_id[0])
        snprintf(id, sizeof id, "%s", r->worker_id);
    else
        snprintf(id, sizeof id, "worker-%" PRIu64, rd->worker_serial + 1);

    /* Another entry with this name is this worker's past: a process that restarted and
     * connected again. Whatever it had is lost on the worker side. */
    worker_t *old = workers_by_id(rd, id);
    if (old && old != w) {
        if (old->state != WORKER_DEAD && old->state != WORKER_DRAINING)
            log_warn("worker %s connected again; its old connection is gone", id);
        workers_mark_dead(rd, old, "replaced by a new connection");
        workers_forget(rd, old);
    }
    if (w) {
        /* Ready again on the same connection: the worker dropped what it had (it was
         * told to Reconnect, or restarted its link). */
        if (w->reqs)
            dispatch_requeue_worker(rd, w, "worker sent Ready again");
        if (strcmp(w->id, id))
            dispatch_forget_worker(rd, w);
    } else {
        w = workers__add(rd, from);
        if (!w) {
            log_error("out of memory adding worker %s", id);
            return;
        }
    }
    int64_t now = clock_now_ms();
    snprintf(w->id, sizeof w->id, "%s", id);
    snprintf(w->peer, sizeof w->peer, "%s", peer);
    w->role = r->role;
    workers__caps(&w->caps, r->capabilities);
    w->state = WORKER_READY;
    w->state_since_ms = now;
    w->last_seen_ms = now;
    w->kv_pages_free = r->capabilities ? r->capabilities->kv_pages_free : 0;
    w->queue_length = w->running = 0;
    w->prefix_cache_pages = 0;
    w->n_prefix_pages = 0;
    w->reported_draining = false;
    w->reported_unavailable = false;
    w->unreachable = false;
    w->drain_deadline_ms = 0;
    supervise_on_ready(rd, w);

    River__Worker__Welcome wel;
    river__worker__welcome__init(&wel);
    wel.heartbeat_ms = (uint32_t)rd->cfg.heartbeat_ms;
    wel.liveness = (uint32_t)rd->cfg.heartbeat_liveness;
    River__Worker__DaemonMessage dm;
    river__worker__daemon_message__init(&dm);
    dm.kind_case = RIVER__WORKER__DAEMON_MESSAGE__KIND_WELCOME;
    dm.welcome = &wel;
    loop_send_worker(rd, w, &dm);
    log_info("worker %s ready%s%s: model %s, %u sequences, %u of %u KV pages free%s", w->id,
             w->peer[0] ? " from " : "", w->peer, w->caps.model, w->caps.max_seqs,
             w->kv_pages_free, w->caps.kv_pages_total, w->slot >= 0 ? " (supervised)" : "");
    rd->pump = true;
}

static void workers__on_heartbeat(riverd_t *rd, const route_t *from, const char *peer,
                                  worker_t *w, const River__Worker__WorkerMessage *m)
{
    const River__Worker__Heartbeat *hb = m->heartbeat;
    w->kv_pages_free = hb->kv_pages_free;
    w->queue_length = hb->queue_length;
    w->running = hb->running;
    w->reported_draining = hb->draining;
    if (hb->unavailable != w->reported_unavailable) {
        log_info("worker %s %s", w->id,
                 hb->unavailable ? "cannot serve for now; sending it nothing"
                                 : "can serve again");
        /* Requests waiting for a worker may go to it now. */
        rd->pump |= !hb->unavailable;
    }
    w->reported_unavailable = hb->unavailable;
    w->prefix_cache_pages = hb->prefix_cache_pages;
    w->n_prefix_pages = 0;
    for (size_t i = 0; i < hb->n_prefix_pages && i < RIVERD_PREFIX_PAGES; i++)
        w->prefix_pages[w->n_prefix_pages++] = hb->prefix_pages[i];
    /* A worker may drain on its own (it got SIGTERM): take nothing new to it. */
    if (hb->draining && w->state == WORKER_READY) {
        w->state = WORKER_DRAINING;
        w->state_since_ms = clock_now_ms();
        dispatch_forget_worker(rd, w);
        log_info("worker %s is draining on its own", w->id);
    }
}

static void workers__on_tokens(riverd_t *rd, const route_t *from, const char *peer,
                               worker_t *w, const River__Worker__WorkerMessage *m)
{
    dispatch_on_tokens(rd, w, m->tokens);
}

static void workers__on_done(riverd_t *rd, const route_t *from, const char *peer,
                             worker_t *w, const River__Worker__WorkerMessage *m)
{
    dispatch_on_done(rd, w, m->done);
}

static void workers__on_failed(riverd_t *rd, const route_t *from, const char *peer,
                               worker_t *w, const River__Worker__WorkerMessage *m)
{
    dispatch_on_failed(rd, w, m->failed);
}

/* By message kind; `live`: only from a worker riverd counts as alive, everything else
 * gets Reconnect (riverd restarted, or declared the worker dead and re-dispatched its
 * requests, so the worker must drop them and introduce itself again). */
static const struct {
    workers_handler_fn fn;
    bool live;
} workers__handlers[] = {
    [RIVER__WORKER__WORKER_MESSAGE__KIND_READY] = {workers__on_ready, false},
    [RIVER__WORKER__WORKER_MESSAGE__KIND_HEARTBEAT] = {workers__on_heartbeat, true},
    [RIVER__WORKER__WORKER_MESSAGE__KIND_TOKENS] = {workers__on_tokens, true},
    [RIVER__WORKER__WORKER_MESSAGE__KIND_DONE] = {workers__on_done, true},
    [RIVER__WORKER__WORKER_MESSAGE__KIND_FAILED] = {workers__on_failed, true},
};

void workers_on_message(riverd_t *rd, const route_t *from, const char *peer,
                        River__Worker__WorkerMessage *env)
{
    worker_t *w = workers_by_route(rd, from);
    unsigned k = (unsigned)env->kind_case;
    if (w)
        w->last_seen_ms = clock_now_ms();
    if (k >= sizeof workers__handlers / sizeof workers__handlers[0] ||
        !workers__handlers[k].fn) {
        /* frame_decode only lets known kinds through; a newer peer may know more. */
        log_warn("worker message of kind %u not handled", k);
    } else if (workers__handlers[k].live && (!w || w->state == WORKER_DEAD)) {
        rd->metrics.stale_messages++;
        workers__send_reconnect(rd, from, w, w ? "declared dead" : "unknown worker");
    } else {
        workers__handlers[k].fn(rd, from, peer, w, env);
    }
    ProtobufCMessage *m = &env->base;
    frame_free(&m);
}

/* ---- Liveness ---- */

void workers_tick(riverd_t *rd, int64_t now)
{
    int64_t hb = rd->cfg.heartbeat_ms;
    int64_t dead_after = hb * rd->cfg.heartbeat_liveness;
    for (int i = 0; i < rd->n_table;) {
        worker_t *w = rd->table[i];
        if (w->state == WORKER_DEAD) {
            if (now - w->state_since_ms >= WORKERS_FORGET_MS) {
                workers_forget(rd, w);
                continue;
            }
            i++;
            continue;
        }
        bool silent = now - w->last_seen_ms > dead_after;
        if ((w->unreachable || silent) && w->state == WORKER_DRAINING && !w->reqs) {
            /* A drained worker that went away did what it was asked. */
            log_info("worker %s drained and left", w->id);
            workers_forget(rd, w);
            continue;
        }
        if (w->unreachable) {
            workers_mark_dead(rd, w, "its connection is gone");
        } else if (silent) {
            char why[64];
            snprintf(why, sizeof why, "missed %d heartbeats", rd->cfg.heartbeat_liveness);
            workers_mark_dead(rd, w, why);
        } else {
            if (now - w->last_sent_ms >= hb)
                workers__send_heartbeat(rd, w);
            /* The worker should have cancelled what was left at its drain deadline;
             * if it did not, riverd takes the requests back itself. */
            if (w->state == WORKER_DRAINING && w->drain_deadline_ms && w->reqs &&
                now >= w->drain_deadline_ms + 2 * hb) {
                log_warn("worker %s: drain deadline passed; moving %d requests", w->id,
                         w->assigned);
                dispatch_requeue_worker(rd, w, "drain deadline passed");
            }
        }
        i++;
    }
}

int64_t workers_next_ms(riverd_t *rd, int64_t now)
{
    int64_t hb = rd->cfg.heartbeat_ms;
    int64_t dead_after = hb * rd->cfg.heartbeat_liveness;
    int64_t next = 0;
#define WORKERS_MIN(t)                                                                    \
    do {                                                                                  \
        int64_t t_ = (t);                                                                 \
        if (!next || t_ < next)                                                           \
            next = t_;                                                                    \
    } while (0)
    for (int i = 0; i < rd->n_table; i++) {
        const worker_t *w = rd->table[i];
        if (w->state == WORKER_DEAD) {
            WORKERS_MIN(w->state_since_ms + WORKERS_FORGET_MS);
            continue;
        }
        if (w->unreachable)
            WORKERS_MIN(now);
        WORKERS_MIN(w->last_sent_ms + hb);
        WORKERS_MIN(w->last_seen_ms + dead_after + 1);
        if (w->state == WORKER_DRAINING && w->drain_deadline_ms && w->reqs)
            WORKERS_MIN(w->drain_deadline_ms + 2 * hb);
    }
#undef WORKERS_MIN
    return next;
}
