/* The admin API (proto/river_admin.proto): one AdminRequest, one AdminReply with the same
 * id. Commands are a table keyed by the request's kind; each fills the reply or returns
 * a River error, which becomes the reply's `error`. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/err.h"
#include "daemon/riverd.h"

/* Workers one Workers reply lists. */
#define ADMIN_MAX_WORKERS 1024

/* Storage for one reply; everything in it lives until the reply is sent. */
typedef struct admin_ctx {
    riverd_t *rd;
    River__Admin__AdminReply *reply;
    union {
        River__Admin__StatusReply status;
        River__Admin__DrainReply drain;
        River__Admin__ScaleReply scale;
        River__Admin__MetricsReply metrics;
    } u;
    River__Admin__WorkersReply workers;
    River__Admin__ReloadReply reload;
    /* Workers reply. */
    River__Admin__WorkerInfo *infos;
    River__Admin__WorkerInfo **info_ptrs;
    River__Worker__Capabilities *caps;
    /* Reload reply. */
    const char *applied[64], *restart[64];
    char *text; /* metrics */
} admin_ctx_t;

typedef int (*admin_fn)(admin_ctx_t *c, const River__Admin__AdminRequest *req);

static int admin__status(admin_ctx_t *c, const River__Admin__AdminRequest *req)
{
    riverd_t *rd = c->rd;
    River__Admin__StatusReply *s = &c->u.status;
    river__admin__status_reply__init(s);
    int ready, draining, dead, dispatchable;
    workers_count(rd, &ready, &draining, &dead, &dispatchable);
    s->version = (char *)RIVERD_VERSION;
    s->uptime_s = (uint64_t)(clock_now_ms() - rd->started_ms) / 1000;
    s->workers_ready = (uint32_t)dispatchable;
    s->workers_total = (uint32_t)(ready + draining + dead + supervise_starting(rd, NULL, 0));
    s->queue_length = (uint32_t)rd->n_queued;
    s->queue_capacity = (uint32_t)rd->cfg.queue_length;
    s->running = (uint32_t)rd->n_running;
    s->requests_total = rd->metrics.requests_total;
    s->requests_failed = rd->metrics.requests_failed;
    s->draining = rd->draining;
    c->reply->kind_case = RIVER__ADMIN__ADMIN_REPLY__KIND_STATUS;
    c->reply->status = s;
    return 0;
}

static const River__Admin__WorkerInfo__State admin__states[] = {
    [WORKER_READY] = RIVER__ADMIN__WORKER_INFO__STATE__READY,
    [WORKER_DRAINING] = RIVER__ADMIN__WORKER_INFO__STATE__DRAINING,
    [WORKER_DEAD] = RIVER__ADMIN__WORKER_INFO__STATE__DEAD,
};

static int admin__workers(admin_ctx_t *c, const River__Admin__AdminRequest *req)
{
    riverd_t *rd = c->rd;
    const char *starting[64];
    int n_start = supervise_starting(rd, starting, 64);
    if (n_start > 64)
        n_start = 64;
    size_t n = (size_t)rd->n_table + (size_t)n_start;
    if (n > ADMIN_MAX_WORKERS)
        n = ADMIN_MAX_WORKERS;
    c->infos = calloc(n ? n : 1, sizeof *c->infos);
    c->info_ptrs = calloc(n ? n : 1, sizeof *c->info_ptrs);
    c->caps = calloc(n ? n : 1, sizeof *c->caps);
    if (!c->infos || !c->info_ptrs || !c->caps)
        return river_err_set(RIVER_ENOMEM, "workers reply");
    int64_t now = clock_now_ms();
    size_t k = 0;
    for (int i = 0; i < rd->n_table && k < n; i++, k++) {
        worker_t *w = rd->table[i];
        River__Admin__WorkerInfo *wi = &c->infos[k];
        River__Worker__Capabilities *cp = &c->caps[k];
        river__admin__worker_info__init(wi);
        river__worker__capabilities__init(cp);
        cp->model = w->caps.model;
        cp->max_batch = w->caps.max_batch;
        cp->max_seqs = w->caps.max_seqs;
        cp->kv_page_size = w->caps.kv_page_size;
        cp->kv_pages_total = w->caps.kv_pages_total;
        cp->kv_pages_free = w->kv_pages_free;
        cp->n_layers = w->caps.n_layers;
        cp->layer_begin = w->caps.layer_begin;
        cp->layer_end = w->caps.layer_end;
        cp->has_river = w->caps.has_river;
        cp->max_context = w->caps.max_context;
        wi->worker_id = w->id;
        wi->address = w->peer;
        wi->role = w->role;
        wi->state = w->state == WORKER_READY && w->reported_unavailable
                        ? RIVER__ADMIN__WORKER_INFO__STATE__UNAVAILABLE
                        : admin__states[w->state];
        wi->capabilities = cp;
        wi->queue_length = w->queue_length;
        /* What riverd has on it; the worker's own count is in its heartbeat. */
        wi->running = (uint32_t)(w->assigned > (int)w->running ? w->assigned : (int)w->running);
        wi->kv_pages_free = w->kv_pages_free;
        int64_t silent = now - w->last_seen_ms;
        wi->missed_beats = (uint32_t)(silent / rd->cfg.heartbeat_ms);
        wi->last_seen_ms = (uint64_t)(silent > 0 ? silent : 0);
        wi->supervised = w->slot >= 0;
        c->info_ptrs[k] = wi;
    }
    for (int i = 0; i < n_start && k < n; i++, k++) {
        River__Admin__WorkerInfo *wi = &c->infos[k];
        river__admin__worker_info__init(wi);
        wi->worker_id = (char *)starting[i];
        wi->state = RIVER__ADMIN__WORKER_INFO__STATE__STARTING;
        wi->supervised = true;
        c->info_ptrs[k] = wi;
    }
    river__admin__workers_reply__init(&c->workers);
    c->workers.n_workers = k;
    c->workers.workers = c->info_ptrs;
    c->reply->kind_case = RIVER__ADMIN__ADMIN_REPLY__KIND_WORKERS;
    c->reply->workers = &c->workers;
    return 0;
}

static int admin__drain(admin_ctx_t *c, const River__Admin__AdminRequest *req)
{
    riverd_t *rd = c->rd;
    const River__Admin__DrainRequest *d = req->drain;
    River__Admin__DrainReply *r = &c->u.drain;
    river__admin__drain_reply__init(r);
    if (d->worker_id[0]) {
        worker_t *w = workers_by_id(rd, d->worker_id);
        if (!w)
            return river_err_set(RIVER_ENOTFOUND, "no worker '%s'", d->worker_id);
        if (w->state == WORKER_DEAD)
            return river_err_set(RIVER_ESTATE, "worker '%s' is dead", d->worker_id);
        if (w->state == WORKER_READY) {
            int rc = workers_drain(rd, w, d->deadline_ms);
            if (rc < 0)
                return rc;
        }
        r->draining = 1;
    } else {
        riverd_begin_shutdown(rd, d->deadline_ms, "admin drain");
        int draining;
        workers_count(rd, NULL, &draining, NULL, NULL);
        r->draining = (uint32_t)draining;
    }
    c->reply->kind_case = RIVER__ADMIN__ADMIN_REPLY__KIND_DRAIN;
    c->reply->drain = r;
    return 0;
}

static int admin__scale(admin_ctx_t *c, const River__Admin__AdminRequest *req)
{
    River__Admin__ScaleReply *r = &c->u.scale;
    river__admin__scale_reply__init(r);
    if (req->scale->workers > 1024)
        return river_err_set(RIVER_ERANGE, "scale: %u workers is over 1024", req->scale->workers);
    int prev = 0;
    int rc = supervise_scale(c->rd, (int)req->scale->workers, &prev);
    if (rc < 0)
        return rc;
    r->previous = (uint32_t)prev;
    r->target = req->scale->workers;
    c->reply->kind_case = RIVER__ADMIN__ADMIN_REPLY__KIND_SCALE;
    c->reply->scale = r;
    return 0;
}

static int admin__reload(admin_ctx_t *c, const River__Admin__AdminRequest *req)
{
    int na = 0, nr = 0;
    int rc = reload_config(c->rd, c->applied, &na, c->restart, &nr, 64);
    if (rc < 0)
        return rc;
    river__admin__reload_reply__init(&c->reload);
    c->reload.n_applied = (size_t)na;
    c->reload.applied = (char **)c->applied;
    c->reload.n_needs_restart = (size_t)nr;
    c->reload.needs_restart = (char **)c->restart;
    c->reply->kind_case = RIVER__ADMIN__ADMIN_REPLY__KIND_RELOAD;
    c->reply->reload = &c->reload;
    return 0;
}

static int admin__metrics(admin_ctx_t *c, const River__Admin__AdminRequest *req)
{
    size_t len;
    c->text = metrics_render(c->rd, &len);
    if (!c->text)
        return river_err_set(RIVER_ENOMEM, "metrics text");
    River__Admin__MetricsReply *r = &c->u.metrics;
    river__admin__metrics_reply__init(r);
    r->text = c->text;
    c->reply->kind_case = RIVER__ADMIN__ADMIN_REPLY__KIND_METRICS;
    c->reply->metrics = r;
    return 0;
}

static const admin_fn admin__commands[] = {
    [RIVER__ADMIN__ADMIN_REQUEST__KIND_STATUS] = admin__status,
    [RIVER__ADMIN__ADMIN_REQUEST__KIND_WORKERS] = admin__workers,
    [RIVER__ADMIN__ADMIN_REQUEST__KIND_DRAIN] = admin__drain,
    [RIVER__ADMIN__ADMIN_REQUEST__KIND_SCALE] = admin__scale,
    [RIVER__ADMIN__ADMIN_REQUEST__KIND_RELOAD] = admin__reload,
    [RIVER__ADMIN__ADMIN_REQUEST__KIND_METRICS] = admin__metrics,
};

void admin_on_request(riverd_t *rd, const route_t *from, River__Admin__AdminRequest *req)
{
    River__Admin__AdminReply reply;
    river__admin__admin_reply__init(&reply);
    reply.id = req->id;
    admin_ctx_t c;
    memset(&c, 0, sizeof c);
    c.rd = rd;
    c.reply = &reply;
    unsigned k = (unsigned)req->kind_case;
    int rc;
    if (k < sizeof admin__commands / sizeof admin__commands[0] && admin__commands[k])
        rc = admin__commands[k](&c, req);
    else
        rc = river_err_set(RIVER_EUNSUPPORTED, "admin request kind %u is not served", k);
    River__Client__Error err;
    if (rc < 0) {
        river__client__error__init(&err);
        River__Client__Error__Code code = rc == RIVER_ENOTFOUND || rc == RIVER_ESTATE
                                              ? RIVER__CLIENT__ERROR__CODE__INVALID_ARGUMENT
                                              : frame_error_code(rc);
        frame_error_fill(&err, "", code, river_err_detail());
        reply.kind_case = RIVER__ADMIN__ADMIN_REPLY__KIND_ERROR;
        reply.error = &err;
        log_info("admin %s: %s", frame_case_name(&req->base), river_err_detail());
    }
    if (loop_send_admin(rd, from, &reply) < 0)
        log_warn("admin reply not sent: %s", river_err_detail());
    free(c.infos);
    free(c.info_ptrs);
    free(c.caps);
    free(c.text);
}
