/* Requests: admission, the queue, session affinity, deadlines, streaming back to the
 * client, and re-dispatch when a worker dies.
 *
 * A request is QUEUED until a worker has room, then RUNNING on that worker. riverd keeps
 * the ids of every token it forwarded; when the worker dies the request goes back to the
 * front of the queue and the next worker gets them as Submit.delivered_ids, prefills
 * prompt + delivered and numbers its tokens from there. Tokens whose index the client
 * already has are dropped, tokens of an earlier dispatch never match the current one
 * (each dispatch has its own link id), and a dispatch that lost tokens is replaced by a
 * new one; so the client sees one stream with consecutive sequence numbers whatever
 * happened behind riverd.
 *
 * A client that stops reading fills the queue riverd keeps for it (limits.max_client_backlog
 * replies, ZMQ's send high-water mark). The next chunk that does not fit ends its request:
 * cancelled on the worker, counted as RESOURCE_EXHAUSTED, and the Error frame is owed to
 * the client, sent again on a timer until it fits behind the tokens already queued (or the
 * client leaves, or DISPATCH_OWED_KEEP_MS pass). So a slow client reads every token it was
 * sent and then an explicit end, never silence; a request whose end is still owed counts
 * against limits.max_requests_per_client, which bounds what riverd keeps for one client. */
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "common/clock.h"
#include "common/err.h"
#include "common/exit_names.h"
#include "common/prefix_hash.h"
#include "daemon/riverd.h"

/* Longest client request_id and session_id riverd keeps. */
#define DISPATCH_RID_MAX 128
#define DISPATCH_SESSION_MAX 256
/* Sessions not used for this long lose their binding (their worker's prefix KV is long
 * gone by then). */
#define DISPATCH_SESSION_IDLE_MS (60 * 60 * 1000)
#define DISPATCH_SESSION_SWEEP_MS 60000
/* How long requests may wait while no worker can serve them at all: the liveness window
 * when nothing is coming, this many windows while supervised workers are (re)starting. */
#define DISPATCH_STARTING_FACTOR 10
/* How often riverd tries again to hand a slow client the ends it owes it, and for how
 * long before it gives up on a client that never reads again. */
#define DISPATCH_OWED_RETRY_MS 50
#define DISPATCH_OWED_KEEP_MS (10 * 60 * 1000)
/* Ends owed to all clients together; past it (many clients stuck at once) one more is
 * dropped and logged, the client's own timeout ends that request. */
#define DISPATCH_OWED_MAX 65536

/* An encoded ClientReply (a Final or an Error) a client was not reading when it was due. */
typedef struct dispatch_owed {
    struct dispatch_owed *next;
    route_t client;
    int64_t since_ms;
    size_t len;
    uint8_t frame[];
} dispatch_owed_t;

struct dispatch_deadline {
    int64_t at;
    uint64_t id;
};

typedef struct session {
    worker_t *w;     /* NULL: unbound */
    uint64_t serial; /* w's serial, so that a reused pointer is not mistaken for it */
    int64_t last_used_ms;
} session_t;

/* ---- Clients ---- */

/* Bytes of a client's identity: key or routing id, a 0 and the tenant, or a 1 for the
 * client as a whole. */
#define DISPATCH_IDENTITY_MAX (RIVERD_ROUTE_MAX + 1 + RIVERD_TENANT_MAX)

/* What a client is, for its limits: its CURVE key when riverd authenticates, so that one
 * key cannot multiply its share by opening more connections; in plain mode, where a
 * client is no more than a connection, the routing id riverd's client ROUTER gave it. A
 * client that serves many (river-gateway) names the tenant of each request, and each
 * tenant is a client of its own: one API key cannot use up everyone's share. */
static size_t dispatch__client_identity(const route_t *r, bool whole,
                                        uint8_t id[DISPATCH_IDENTITY_MAX])
{
    size_t n;
    if (r->key[0]) {
        n = strlen(r->key);
        memcpy(id, r->key, n);
    } else {
        n = r->len;
        memcpy(id, r->id, n);
    }
    id[n++] = whole ? 1 : 0;
    if (whole)
        return n;
    size_t t = strlen(r->tenant);
    memcpy(id + n, r->tenant, t);
    return n + t;
}

/* Requests in flight plus ends owed, for the client and tenant at r (whole: for all the
 * client's tenants). The count lives in the map's value pointer itself, so counting costs
 * no allocation per client. */
static int dispatch__load_of(riverd_t *rd, const route_t *r, bool whole)
{
    uint8_t id[DISPATCH_IDENTITY_MAX];
    size_t len = dispatch__client_identity(r, whole, id);
    return (int)(uintptr_t)hmap_get(rd->client_load, id, len);
}

static int dispatch__client_load(riverd_t *rd, const route_t *r)
{
    return dispatch__load_of(rd, r, false);
}

/* Adds delta to one of the counts; the entry goes when it reaches 0. */
static int dispatch__load_add(riverd_t *rd, const route_t *r, bool whole, int delta)
{
    uint8_t id[DISPATCH_IDENTITY_MAX];
    size_t len = dispatch__client_identity(r, whole, id);
    int n = dispatch__load_of(rd, r, whole) + delta;
    if (n <= 0) {
        hmap_del(rd->client_load, id, len);
        return 0;
    }
    return hmap_put(rd->client_load, id, len, (void *)(uintptr_t)n);
}

/* Adds delta to the load of the client's tenant and of the client as a whole. */
static int dispatch__client_add(riverd_t *rd, const route_t *r, int delta)
{
    if (dispatch__load_add(rd, r, false, delta) < 0)
        return -1;
    if (dispatch__load_add(rd, r, true, delta) < 0) {
        dispatch__load_add(rd, r, false, -delta);
        return -1;
    }
    return 0;
}

/* ---- Maps and lists ---- */

static size_t dispatch__client_key(const route_t *r, const char *rid, uint8_t *key)
{
    size_t n = strlen(rid);
    key[0] = r->len;
    memcpy(key + 1, r->id, r->len);
    memcpy(key + 1 + r->len, rid, n);
    return 1 + (size_t)r->len + n;
}

static request_t *dispatch__by_client(riverd_t *rd, const route_t *r, const char *rid)
{
    uint8_t key[1 + RIVERD_ROUTE_MAX + DISPATCH_RID_MAX];
    if (strlen(rid) > DISPATCH_RID_MAX)
        return NULL;
    return hmap_get(rd->req_by_client, key, dispatch__client_key(r, rid, key));
}

static request_t *dispatch__by_id(riverd_t *rd, uint64_t id)
{
    return hmap_get(rd->req_by_id, &id, sizeof id);
}

static void dispatch__enqueue(riverd_t *rd, request_t *req, bool front)
{
    req->state = REQ_QUEUED;
    if (front) {
        req->q_prev = NULL;
        req->q_next = rd->queue_head;
        if (rd->queue_head)
            rd->queue_head->q_prev = req;
        else
            rd->queue_tail = req;
        rd->queue_head = req;
    } else {
        req->q_next = NULL;
        req->q_prev = rd->queue_tail;
        if (rd->queue_tail)
            rd->queue_tail->q_next = req;
        else
            rd->queue_head = req;
        rd->queue_tail = req;
    }
    rd->n_queued++;
    rd->pump = true;
}

static void dispatch__dequeue(riverd_t *rd, request_t *req)
{
    if (req->q_prev)
        req->q_prev->q_next = req->q_next;
    else
        rd->queue_head = req->q_next;
    if (req->q_next)
        req->q_next->q_prev = req->q_prev;
    else
        rd->queue_tail = req->q_prev;
    req->q_prev = req->q_next = NULL;
    rd->n_queued--;
}

static void dispatch__assign(riverd_t *rd, request_t *req, worker_t *w)
{
    hmap_put(rd->req_by_link, &req->link_id, sizeof req->link_id, req);
    req->state = REQ_RUNNING;
    req->worker = w;
    req->w_prev = NULL;
    req->w_next = w->reqs;
    if (w->reqs)
        w->reqs->w_prev = req;
    w->reqs = req;
    w->assigned++;
    rd->n_running++;
}

static void dispatch__unassign(riverd_t *rd, request_t *req)
{
    worker_t *w = req->worker;
    if (req->w_prev)
        req->w_prev->w_next = req->w_next;
    else
        w->reqs = req->w_next;
    if (req->w_next)
        req->w_next->w_prev = req->w_prev;
    req->w_prev = req->w_next = NULL;
    req->worker = NULL;
    hmap_del(rd->req_by_link, &req->link_id, sizeof req->link_id);
    req->link_id = 0;
    w->assigned--;
    rd->n_running--;
    /* Its slot is free again. */
    rd->pump = true;
}

/* Forgets a request; whatever it owed the client was sent before. */
static void dispatch__free(riverd_t *rd, request_t *req)
{
    if (req->state == REQ_QUEUED)
        dispatch__dequeue(rd, req);
    else if (req->worker)
        dispatch__unassign(rd, req);
    hmap_del(rd->req_by_id, &req->id, sizeof req->id);
    uint8_t key[1 + RIVERD_ROUTE_MAX + DISPATCH_RID_MAX];
    hmap_del(rd->req_by_client, key, dispatch__client_key(&req->client, req->rid, key));
    dispatch__client_add(rd, &req->client, -1);
    free(req->delivered);
    ProtobufCMessage *m = &req->env->base;
    frame_free(&m);
    free(req);
}

/* ---- Ends of a request ---- */

/* Keeps the end r for a client that is not reading. It adds to the client's load until it
 * is delivered or given up, and a client may be owed at most twice its request limit (its
 * requests' ends and as many refusals), so that one that sends without ever reading cannot
 * make riverd keep more and more for it. */
static int dispatch__owe(riverd_t *rd, const route_t *to, const River__Client__ClientReply *r)
{
    if (rd->n_owed >= DISPATCH_OWED_MAX)
        return river_err_set(RIVER_EFULL, "%d ends are owed to clients already", rd->n_owed);
    if (dispatch__client_load(rd, to) >= 2 * rd->cfg.max_requests_per_client)
        return river_err_set(RIVER_EFULL, "the client is owed %d ends already",
                             dispatch__client_load(rd, to));
    uint8_t *buf;
    size_t len;
    int rc = frame_encode_buf(&r->base, &buf, &len);
    if (rc < 0)
        return rc;
    dispatch_owed_t *o = malloc(sizeof *o + len);
    if (!o || dispatch__client_add(rd, to, 1) < 0) {
        free(o);
        free(buf);
        return river_err_set(RIVER_ENOMEM, "an owed reply of %zu bytes", len);
    }
    o->next = NULL;
    o->client = *to;
    o->since_ms = clock_now_ms();
    o->len = len;
    memcpy(o->frame, buf, len);
    free(buf);
    if (rd->owed_tail)
        rd->owed_tail->next = o;
    else
        rd->owed_head = o;
    rd->owed_tail = o;
    rd->n_owed++;
    if (!rd->next_owed_ms)
        rd->next_owed_ms = o->since_ms + DISPATCH_OWED_RETRY_MS;
    return 0;
}

/* Sends the end of a request (a Final or an Error). A client that is not reading gets it
 * later, after what is queued for it already; one that is gone never reads it. */
static void dispatch__send_end(riverd_t *rd, const route_t *to, const char *rid,
                               const River__Client__ClientReply *r)
{
    int rc = loop_send_client(rd, to, r);
    if (rc == RIVER_EFULL && (rc = dispatch__owe(rd, to, r)) < 0)
        log_warn("the end of request '%s' is lost: the client is not reading and %s", rid,
                 river_err_detail());
    else if (rc < 0)
        log_debug("the end of request '%s' is not delivered: %s", rid, river_err_detail());
}

static void dispatch__send_error(riverd_t *rd, const route_t *to, const char *rid,
                                 River__Client__Error__Code code, const char *msg)
{
    River__Client__Error e;
    river__client__error__init(&e);
    frame_error_fill(&e, rid, code, msg);
    River__Client__ClientReply r;
    river__client__client_reply__init(&r);
    r.kind_case = RIVER__CLIENT__CLIENT_REPLY__KIND_ERROR;
    r.error = &e;
    dispatch__send_end(rd, to, rid, &r);
}

/* Hands slow clients the ends owed to them, as far as their queues have room now. */
static void dispatch__owed_tick(riverd_t *rd, int64_t now)
{
    if (!rd->owed_head || now < rd->next_owed_ms)
        return;
    dispatch_owed_t **pp = &rd->owed_head, *o;
    rd->owed_tail = NULL;
    while ((o = *pp)) {
        int rc = loop_send_client_frame(rd, &o->client, o->frame, o->len);
        if (rc == RIVER_EFULL && now - o->since_ms < DISPATCH_OWED_KEEP_MS) {
            rd->owed_tail = o;
            pp = &o->next;
            continue;
        }
        if (rc == RIVER_EFULL)
            log_warn("a client did not read for %d s; the end of a request owed to it is "
                     "dropped", DISPATCH_OWED_KEEP_MS / 1000);
        else if (rc < 0)
            log_debug("an end owed to a client is dropped: %s", river_err_detail());
        *pp = o->next;
        dispatch__client_add(rd, &o->client, -1);
        free(o);
        rd->n_owed--;
    }
    rd->next_owed_ms = rd->owed_head ? now + DISPATCH_OWED_RETRY_MS : 0;
}

static void dispatch__cancel_on_worker(riverd_t *rd, request_t *req)
{
    worker_t *w = req->worker;
    if (req->state != REQ_RUNNING || !w || w->state == WORKER_DEAD || w->unreachable)
        return;
    River__Worker__Cancel c;
    river__worker__cancel__init(&c);
    c.request_id = req->link_id;
    River__Worker__DaemonMessage m;
    river__worker__daemon_message__init(&m);
    m.kind_case = RIVER__WORKER__DAEMON_MESSAGE__KIND_CANCEL;
    m.cancel = &c;
    loop_send_worker(rd, w, &m);
}

static void dispatch__finish_error(riverd_t *rd, request_t *req, River__Client__Error__Code code,
                                   const char *fmt, ...) __attribute__((format(printf, 4, 5)));

static void dispatch__finish_error(riverd_t *rd, request_t *req, River__Client__Error__Code code,
                                   const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    log_debug("request %" PRIu64 " (%s) fails: %s", req->id, req->rid, msg);
    dispatch__send_error(rd, &req->client, req->rid, code, msg);
    metrics_on_error(rd, code);
    dispatch__free(rd, req);
}

/* Sends the Final: the worker's when it has one, else one riverd makes (cancel). The
 * completion count is what the client got, across dispatches. */
static void dispatch__finish_final(riverd_t *rd, request_t *req, const River__Client__Final *wf,
                                   River__Client__Final__Reason reason)
{
    River__Client__Final f;
    River__Client__Usage u;
    river__client__final__init(&f);
    river__client__usage__init(&u);
    if (wf) {
        f = *wf;
        if (wf->usage) {
            u = *wf->usage;
            rd->metrics.prefix_hit_tokens += u.cached_tokens;
            rd->metrics.prefix_query_tokens += u.prompt_tokens;
        }
        metrics_on_exit_stats(rd, wf->exit_stats);
    } else {
        f.reason = reason;
    }
    f.request_id = (char *)req->rid;
    u.completion_tokens = req->n_delivered;
    f.usage = &u;
    River__Client__ClientReply r;
    river__client__client_reply__init(&r);
    r.kind_case = RIVER__CLIENT__CLIENT_REPLY__KIND_FINAL;
    r.final = &f;
    dispatch__send_end(rd, &req->client, req->rid, &r);
    metrics_on_final(rd, f.reason);
    dispatch__free(rd, req);
}

/* ---- Admission: per-request limits, a table of checks ---- */

/* Each check writes why the request is refused and returns false. */
typedef bool (*dispatch_check_fn)(const config_riverd_t *c, const River__Client__Generate *g,
                                  char *why, size_t cap);

static bool dispatch__check_prompt(const config_riverd_t *c, const River__Client__Generate *g,
                                   char *why, size_t cap)
{
    switch (g->prompt_case) {
    case RIVER__CLIENT__GENERATE__PROMPT_TEXT: {
        size_t n = strlen(g->text);
        if (n == 0)
            return snprintf(why, cap, "prompt is empty"), false;
        if (n > (size_t)c->max_prompt_bytes)
            return snprintf(why, cap, "prompt is %zu bytes, over limits.max_prompt_bytes (%d)",
                            n, c->max_prompt_bytes),
                   false;
        return true;
    }
    case RIVER__CLIENT__GENERATE__PROMPT_TOKENS: {
        size_t n = g->tokens ? g->tokens->n_ids : 0;
        if (n == 0)
            return snprintf(why, cap, "prompt is empty"), false;
        if (n > (size_t)c->max_prompt_tokens)
            return snprintf(why, cap,
                            "prompt is %zu tokens, over limits.max_prompt_tokens (%d)", n,
                            c->max_prompt_tokens),
                   false;
        for (size_t i = 0; i < n; i++)
            if (g->tokens->ids[i] < 0)
                return snprintf(why, cap, "prompt token %zu is negative (%d)", i,
                                g->tokens->ids[i]),
                       false;
        return true;
    }
    default:
        return snprintf(why, cap, "prompt is required (text or tokens)"), false;
    }
}

static bool dispatch__check_max_tokens(const config_riverd_t *c,
                                       const River__Client__Generate *g, char *why, size_t cap)
{
    if (g->max_tokens > (uint32_t)c->max_tokens)
        return snprintf(why, cap, "max_tokens %u is over limits.max_tokens (%d)",
                        g->max_tokens, c->max_tokens),
               false;
    return true;
}

static bool dispatch__check_stop(const config_riverd_t *c, const River__Client__Generate *g,
                                 char *why, size_t cap)
{
    if (g->n_stop > (size_t)c->max_stop_strings)
        return snprintf(why, cap, "%zu stop strings, over limits.max_stop_strings (%d)",
                        g->n_stop, c->max_stop_strings),
               false;
    for (size_t i = 0; i < g->n_stop; i++) {
        size_t n = strlen(g->stop[i]);
        if (n == 0)
            return snprintf(why, cap, "stop string %zu is empty", i), false;
        if (n > (size_t)c->max_stop_length)
            return snprintf(why, cap,
                            "stop string %zu is %zu bytes, over limits.max_stop_length (%d)",
                            i, n, c->max_stop_length),
                   false;
    }
    return true;
}

static bool dispatch__check_sampling(const config_riverd_t *c,
                                     const River__Client__Generate *g, char *why, size_t cap)
{
    const River__Client__Sampling *s = g->sampling;
    if (!s)
        return true;
    if (!isfinite(s->temperature) || s->temperature < 0)
        return snprintf(why, cap, "sampling.temperature must be a finite number >= 0"), false;
    if (!isfinite(s->top_p))
        return snprintf(why, cap, "sampling.top_p must be a finite number"), false;
    return true;
}

static bool dispatch__check_exit(const config_riverd_t *c, const River__Client__Generate *g,
                                 char *why, size_t cap)
{
    const River__Client__ExitOverride *x = g->exit;
    if (!x)
        return true;
    /* "": the worker's rule. */
    if (x->policy[0] && exit_names_find(exit_names_rules, x->policy) < 0)
        return snprintf(why, cap, "exit.policy '%.64s' is not none, cosine, router or fixed",
                        x->policy),
               false;
    if ((x->opt_tau_case && !isfinite(x->tau)) || (x->opt_theta_case && !isfinite(x->theta)))
        return snprintf(why, cap, "exit.tau and exit.theta must be finite numbers"), false;
    if (x->opt_exit_layer_case && x->exit_layer < 0)
        return snprintf(why, cap, "exit.exit_layer must be >= 0"), false;
    if (x->draft_tokens > 16)
        return snprintf(why, cap, "exit.draft_tokens %u must be in 1..16 (0: the worker's)",
                        x->draft_tokens), false;
    if (x->opt_lossless_case && x->lossless && !strcmp(x->policy, "none"))
        return snprintf(why, cap, "exit.lossless with exit.policy none: the backbone alone "
                        "has nothing to draft with"), false;
    return true;
}

static bool dispatch__check_ids(const config_riverd_t *c, const River__Client__Generate *g,
                                char *why, size_t cap)
{
    size_t n = strlen(g->request_id);
    if (n == 0)
        return snprintf(why, cap, "request_id is required"), false;
    if (n > DISPATCH_RID_MAX)
        return snprintf(why, cap, "request_id is %zu bytes, over the limit of %d", n,
                        DISPATCH_RID_MAX),
               false;
    if (strlen(g->session_id) > DISPATCH_SESSION_MAX)
        return snprintf(why, cap, "session_id is over the limit of %d bytes",
                        DISPATCH_SESSION_MAX),
               false;
    if (strlen(g->tenant) > RIVERD_TENANT_MAX || strlen(g->cache_salt) > RIVERD_TENANT_MAX)
        return snprintf(why, cap, "%s is over the limit of %d bytes",
                        strlen(g->tenant) > RIVERD_TENANT_MAX ? "tenant" : "cache_salt",
                        RIVERD_TENANT_MAX),
               false;
    return true;
}

/* Bytes of a request's prefix-cache salt: the client's key, a 0, its cache_salt. */
#define DISPATCH_SALT_MAX (sizeof ((route_t *)0)->key + 1 + RIVERD_TENANT_MAX)

/* The salt of req's prefix-cache partition (Submit.prefix_salt): the client's CURVE key
 * (empty in plain mode) and the cache_salt it sent, so that another client key never
 * reaches a partition whatever salt it sends, and a client's tenants stay apart. */
static size_t dispatch__salt(const request_t *req, uint8_t salt[DISPATCH_SALT_MAX])
{
    size_t n = strlen(req->client.key), m = strlen(req->gen->cache_salt);
    memcpy(salt, req->client.key, n);
    salt[n++] = 0;
    memcpy(salt + n, req->gen->cache_salt, m);
    return n + m;
}

static const dispatch_check_fn dispatch__checks[] = {
    dispatch__check_ids,  dispatch__check_prompt,   dispatch__check_max_tokens,
    dispatch__check_stop, dispatch__check_sampling, dispatch__check_exit,
};

/* ---- Choosing a worker ---- */

static int dispatch__room(const worker_t *w)
{
    int cap = w->caps.max_seqs ? (int)w->caps.max_seqs : 1;
    return cap - w->assigned;
}

/* Pages of req's prompt that w's prefix cache names (Heartbeat.prefix_pages): the
 * longest run from the start, found by hashing the token ids the way the worker names its
 * pages (its key, its seed, the request's salt). 0 for a text prompt (riverd has no
 * tokenizer) or a worker without a cache. The heartbeat carries 64 bits of each name: a
 * clash misplaces a request at worst, since the worker verifies every hit itself. */
static int dispatch__prefix_pages(const worker_t *w, const request_t *req)
{
    const River__Client__Generate *g = req->gen;
    if (!w->caps.prefix_seed || !w->n_prefix_pages || !w->caps.kv_page_size ||
        g->prompt_case != RIVER__CLIENT__GENERATE__PROMPT_TOKENS || !g->tokens)
        return 0;
    int best = 0;
    uint8_t salt[DISPATCH_SALT_MAX];
    size_t n_salt = dispatch__salt(req, salt);
    prefix_name_t h = prefix_hash_root(&w->caps.prefix_key, w->caps.prefix_seed, salt, n_salt);
    size_t P = w->caps.kv_page_size;
    /* The worker never reuses the last prompt token, so neither does the count. */
    size_t n = g->tokens->n_ids ? (g->tokens->n_ids - 1) / P : 0;
    for (size_t i = 0; i < n; i++) {
        h = prefix_hash_page(&w->caps.prefix_key, h, g->tokens->ids + i * P, P);
        for (int k = 0; k < w->n_prefix_pages; k++)
            if (w->prefix_pages[k] == h.lo) {
                best = (int)i + 1;
                break;
            }
    }
    return best;
}

/* The worker for req, NULL when it must wait. A live session binding wins (its prefix KV
 * is there), even if that means waiting for room on it; otherwise (placement prefix) the
 * worker whose prefix cache holds most of the prompt's leading pages, then the worker with
 * the most free sequence slots, then the most free KV pages. */
static worker_t *dispatch__pick(riverd_t *rd, request_t *req)
{
    const char *sid = req->gen->session_id;
    session_t *s = sid[0] ? hmap_get(rd->sessions, sid, strlen(sid)) : NULL;
    if (s && s->w) {
        if (s->w->serial == s->serial && workers_takes_work(s->w))
            return dispatch__room(s->w) > 0 ? s->w : NULL;
        s->w = NULL;
    }
    worker_t *best = NULL, *avoided = NULL;
    int best_pages = 0;
    bool by_prefix = rd->cfg.placement == CONFIG_PLACEMENT_PREFIX;
    for (int i = 0; i < rd->n_table; i++) {
        worker_t *w = rd->table[i];
        if (!workers_takes_work(w) || dispatch__room(w) <= 0)
            continue;
        if (w->serial == req->avoid_serial) {
            avoided = w;
            continue;
        }
        int pages = by_prefix ? dispatch__prefix_pages(w, req) : 0;
        if (!best || pages > best_pages ||
            (pages == best_pages &&
             (dispatch__room(w) > dispatch__room(best) ||
              (dispatch__room(w) == dispatch__room(best) &&
               w->kv_pages_free > best->kv_pages_free)))) {
            best = w;
            best_pages = pages;
        }
    }
    /* The worker that refused it last is still better than waiting forever. */
    if (!best)
        best = avoided;
    if (best && sid[0]) {
        if (!s) {
            s = calloc(1, sizeof *s);
            if (s && hmap_put(rd->sessions, sid, strlen(sid), s) < 0) {
                free(s);
                s = NULL;
            }
        }
        if (s) {
            s->w = best;
            s->serial = best->serial;
        }
    }
    if (s)
        s->last_used_ms = clock_now_ms();
    return best;
}

static int dispatch__submit(riverd_t *rd, request_t *req, worker_t *w)
{
    /* The worker gets the client's Generate as it came, with riverd's decisions in it:
     * the token limit, the deadline left, and (set at admission) the seed. */
    River__Client__Generate g = *req->gen;
    g.request_id = (char *)"";
    g.max_tokens = req->max_tokens;
    if (req->deadline_ms) {
        int64_t left = req->deadline_ms - clock_now_ms();
        g.deadline_ms = left > 0 ? (uint32_t)left : 1;
    }
    River__Worker__Submit s;
    river__worker__submit__init(&s);
    uint64_t link_id = ++rd->next_link_id;
    s.request_id = link_id;
    s.generate = &g;
    s.tokens_delivered = req->n_delivered;
    s.n_delivered_ids = req->n_delivered;
    s.delivered_ids = req->delivered;
    uint8_t salt[DISPATCH_SALT_MAX];
    s.prefix_salt.len = dispatch__salt(req, salt);
    s.prefix_salt.data = salt;
    River__Worker__DaemonMessage m;
    river__worker__daemon_message__init(&m);
    m.kind_case = RIVER__WORKER__DAEMON_MESSAGE__KIND_SUBMIT;
    m.submit = &s;
    int rc = loop_send_worker(rd, w, &m);
    if (rc < 0)
        return rc;
    dispatch__dequeue(rd, req);
    req->link_id = link_id;
    dispatch__assign(rd, req, w);
    req->attempts++;
    log_debug("request %" PRIu64 " (%s) to worker %s, attempt %d, %u tokens delivered",
              req->id, req->rid, w->id, req->attempts, req->n_delivered);
    return 0;
}

/* One pass over the queue, oldest first. A request waiting for its session's worker
 * does not hold back the ones behind it. */
static void dispatch__pump(riverd_t *rd)
{
    rd->pump = false;
    int room = 0;
    for (int i = 0; i < rd->n_table; i++)
        if (workers_takes_work(rd->table[i]) && dispatch__room(rd->table[i]) > 0)
            room += dispatch__room(rd->table[i]);
    request_t *next;
    for (request_t *req = rd->queue_head; req && room > 0; req = next) {
        next = req->q_next;
        worker_t *w = dispatch__pick(rd, req);
        if (w && dispatch__submit(rd, req, w) == 0)
            room--;
    }
}

/* ---- Client requests, one handler per kind ---- */

static int64_t dispatch__unavailable_ms(riverd_t *rd)
{
    int64_t window = rd->cfg.heartbeat_ms * rd->cfg.heartbeat_liveness;
    return supervise_expecting(rd) ? window * DISPATCH_STARTING_FACTOR : window;
}

static void dispatch__heap_push(riverd_t *rd, int64_t at, uint64_t id)
{
    if (rd->n_heap == rd->cap_heap) {
        size_t cap = rd->cap_heap ? 2 * rd->cap_heap : 64;
        struct dispatch_deadline *h = realloc(rd->heap, cap * sizeof *h);
        if (!h) {
            log_error("out of memory for deadlines");
            return;
        }
        rd->heap = h;
        rd->cap_heap = cap;
    }
    size_t i = rd->n_heap++;
    while (i > 0 && rd->heap[(i - 1) / 2].at > at) {
        rd->heap[i] = rd->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    rd->heap[i] = (struct dispatch_deadline){at, id};
}

static void dispatch__heap_pop(riverd_t *rd)
{
    struct dispatch_deadline last = rd->heap[--rd->n_heap];
    size_t i = 0, n = rd->n_heap;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && rd->heap[c + 1].at < rd->heap[c].at)
            c++;
        if (rd->heap[c].at >= last.at)
            break;
        rd->heap[i] = rd->heap[c];
        i = c;
    }
    if (n)
        rd->heap[i] = last;
}

static void dispatch__on_generate(riverd_t *rd, const route_t *from,
                                  River__Client__ClientRequest *env)
{
    River__Client__Generate *g = env->generate;
    River__Client__Error__Code code = RIVER__CLIENT__ERROR__CODE__INVALID_ARGUMENT;
    char why[512];
    int64_t now = clock_now_ms();
    for (size_t i = 0; i < sizeof dispatch__checks / sizeof dispatch__checks[0]; i++)
        if (!dispatch__checks[i](&rd->cfg, g, why, sizeof why))
            goto refuse;
    /* The request counts against its tenant's share (checked to fit above). */
    route_t who = *from;
    snprintf(who.tenant, sizeof who.tenant, "%s", g->tenant);
    from = &who;
    if (dispatch__by_client(rd, from, g->request_id)) {
        snprintf(why, sizeof why, "request_id '%s' is already in flight", g->request_id);
        goto refuse;
    }
    code = RIVER__CLIENT__ERROR__CODE__UNAVAILABLE;
    if (rd->draining) {
        snprintf(why, sizeof why, "riverd is shutting down");
        goto refuse;
    }
    if (rd->no_worker_since_ms && now - rd->no_worker_since_ms >= dispatch__unavailable_ms(rd)) {
        snprintf(why, sizeof why, "no worker is available");
        goto refuse;
    }
    /* Full means full after whatever can start now has started. */
    if (rd->n_queued >= rd->cfg.queue_length)
        dispatch__pump(rd);
    code = RIVER__CLIENT__ERROR__CODE__RESOURCE_EXHAUSTED;
    int load = dispatch__client_load(rd, from);
    if (load >= rd->cfg.max_requests_per_client) {
        snprintf(why, sizeof why,
                 "this client%s%s has %d requests in flight, at "
                 "limits.max_requests_per_client (%d)", who.tenant[0] ? ", tenant " : "",
                 who.tenant, load, rd->cfg.max_requests_per_client);
        goto refuse;
    }
    load = dispatch__load_of(rd, from, true);
    if (load >= rd->cfg.max_requests_per_key) {
        snprintf(why, sizeof why,
                 "this client has %d requests in flight over all its tenants, at "
                 "limits.max_requests_per_key (%d)", load, rd->cfg.max_requests_per_key);
        goto refuse;
    }
    if (rd->n_queued >= rd->cfg.queue_length) {
        snprintf(why, sizeof why, "queue is full (queue_length %d)", rd->cfg.queue_length);
        goto refuse;
    }

    request_t *req = calloc(1, sizeof *req);
    if (!req) {
        code = RIVER__CLIENT__ERROR__CODE__RESOURCE_EXHAUSTED;
        snprintf(why, sizeof why, "out of memory");
        goto refuse;
    }
    req->id = ++rd->next_req_id;
    req->client = *from;
    req->env = env;
    req->gen = g;
    req->rid = g->request_id;
    req->max_tokens = g->max_tokens ? g->max_tokens : (uint32_t)rd->cfg.max_tokens;
    req->received_ms = now;
    req->deadline_ms = g->deadline_ms ? now + g->deadline_ms : 0;
    /* "Absent: riverd picks one": picked once, so a re-dispatch samples with the same. */
    if (g->sampling && g->sampling->temperature > 0 && !g->sampling->opt_seed_case) {
        uint64_t seed = (uint64_t)now * 0x9e3779b97f4a7c15ull ^ req->id;
        if (getrandom(&seed, sizeof seed, GRND_NONBLOCK) != (ssize_t)sizeof seed)
            log_debug("getrandom: using a time-based seed");
        g->sampling->opt_seed_case = RIVER__CLIENT__SAMPLING__OPT_SEED_SEED;
        g->sampling->seed = seed;
    }
    uint8_t key[1 + RIVERD_ROUTE_MAX + DISPATCH_RID_MAX];
    size_t klen = dispatch__client_key(from, req->rid, key);
    if (hmap_put(rd->req_by_id, &req->id, sizeof req->id, req) < 0 ||
        hmap_put(rd->req_by_client, key, klen, req) < 0 ||
        dispatch__client_add(rd, from, 1) < 0) {
        hmap_del(rd->req_by_id, &req->id, sizeof req->id);
        hmap_del(rd->req_by_client, key, klen);
        free(req);
        code = RIVER__CLIENT__ERROR__CODE__RESOURCE_EXHAUSTED;
        snprintf(why, sizeof why, "out of memory");
        goto refuse;
    }
    if (req->deadline_ms)
        dispatch__heap_push(rd, req->deadline_ms, req->id);
    rd->metrics.requests_total++;
    dispatch__enqueue(rd, req, false);
    log_debug("request %" PRIu64 " (%s) queued", req->id, req->rid);
    return;

refuse:
    log_debug("request '%s' refused: %s", g->request_id, why);
    dispatch__send_error(rd, from, g->request_id, code, why);
    rd->metrics.requests_total++;
    metrics_on_error(rd, code);
    ProtobufCMessage *m = &env->base;
    frame_free(&m);
}

static void dispatch__on_cancel(riverd_t *rd, const route_t *from,
                                River__Client__ClientRequest *env)
{
    request_t *req = dispatch__by_client(rd, from, env->cancel->request_id);
    ProtobufCMessage *m = &env->base;
    if (!req) {
        frame_free(&m);
        return;
    }
    frame_free(&m);
    if (req->state == REQ_QUEUED) {
        dispatch__finish_final(rd, req, NULL, RIVER__CLIENT__FINAL__REASON__CANCELLED);
        return;
    }
    /* The worker answers Done(CANCELLED) once the sequence is gone and its KV pages are
     * free; that Done ends the request. */
    if (!req->cancelled) {
        req->cancelled = true;
        dispatch__cancel_on_worker(rd, req);
    }
}

typedef void (*dispatch_client_fn)(riverd_t *rd, const route_t *from,
                                   River__Client__ClientRequest *env);

static const dispatch_client_fn dispatch__client_handlers[] = {
    [RIVER__CLIENT__CLIENT_REQUEST__KIND_GENERATE] = dispatch__on_generate,
    [RIVER__CLIENT__CLIENT_REQUEST__KIND_CANCEL] = dispatch__on_cancel,
};

void dispatch_on_client(riverd_t *rd, const route_t *from, River__Client__ClientRequest *env)
{
    unsigned k = (unsigned)env->kind_case;
    if (k < sizeof dispatch__client_handlers / sizeof dispatch__client_handlers[0] &&
        dispatch__client_handlers[k]) {
        dispatch__client_handlers[k](rd, from, env);
        return;
    }
    /* frame_decode lets only known kinds through; this build may know fewer handlers. */
    loop_send_error(rd, from, "", RIVER__CLIENT__ERROR__CODE__INVALID_ARGUMENT,
                      "request kind %u is not served", k);
    ProtobufCMessage *m = &env->base;
    frame_free(&m);
}

/* ---- Worker replies ---- */

static void dispatch__retry(riverd_t *rd, request_t *req, const char *why);

/* The request a worker message is about, if that worker is (still) the one running it.
 * Anything else is a late message from a worker the request was taken from. */
static request_t *dispatch__mine(riverd_t *rd, worker_t *w, uint64_t id)
{
    request_t *req = hmap_get(rd->req_by_link, &id, sizeof id);
    if (!req || req->state != REQ_RUNNING || req->worker != w) {
        log_debug("worker %s: dispatch %" PRIu64 " is not running there", w->id, id);
        return NULL;
    }
    return req;
}

void dispatch_on_tokens(riverd_t *rd, worker_t *w, const River__Worker__Tokens *t)
{
    request_t *req = dispatch__mine(rd, w, t->request_id);
    if (!req)
        return;
    uint32_t have = req->n_delivered;
    if (t->index > have) {
        /* Tokens of this dispatch were lost on the way: this dispatch cannot give the
         * client a complete stream, another one continues from what it has. */
        log_warn("worker %s skipped tokens %u..%u of request %" PRIu64 "; re-dispatching",
                 w->id, have, t->index - 1, req->id);
        dispatch__cancel_on_worker(rd, req);
        dispatch__retry(rd, req, "tokens lost");
        return;
    }
    /* Tokens the client already has (a worker that restarted the count) are dropped. */
    size_t skip = have - t->index;
    if (skip > t->n_ids)
        skip = t->n_ids;
    size_t n = t->n_ids - skip;
    const char *text = t->text;
    if (skip && n) {
        /* A conforming worker numbers from tokens_delivered, so this does not happen;
         * the text cannot be split by token, so it is dropped rather than repeated. */
        log_warn("worker %s repeated %zu tokens of request %" PRIu64 "; dropping its text",
                 w->id, skip, req->id);
        text = "";
    } else if (skip) {
        return;
    }
    if (n == 0 && !text[0])
        return;
    if (req->n_delivered + n > req->cap_delivered) {
        uint32_t cap = req->cap_delivered ? req->cap_delivered : 64;
        while (cap < req->n_delivered + n)
            cap *= 2;
        int32_t *d = realloc(req->delivered, cap * sizeof *d);
        if (!d) {
            dispatch__cancel_on_worker(rd, req);
            dispatch__finish_error(rd, req, RIVER__CLIENT__ERROR__CODE__RESOURCE_EXHAUSTED,
                                   "riverd is out of memory");
            return;
        }
        req->delivered = d;
        req->cap_delivered = cap;
    }
    memcpy(req->delivered + req->n_delivered, t->ids + skip, n * sizeof *t->ids);
    req->n_delivered += (uint32_t)n;

    River__Client__TokenChunk c;
    river__client__token_chunk__init(&c);
    c.request_id = (char *)req->rid;
    c.seq = req->next_seq++;
    c.text = (char *)text;
    c.n_ids = n;
    c.ids = t->ids + skip;
    if (t->n_exit_layers == t->n_ids) {
        c.n_exit_layers = n;
        c.exit_layers = t->exit_layers + skip;
    }
    if (t->n_logprobs == t->n_ids) {
        c.n_logprobs = n;
        c.logprobs = t->logprobs + skip;
    }
    River__Client__ClientReply r;
    river__client__client_reply__init(&r);
    r.kind_case = RIVER__CLIENT__CLIENT_REPLY__KIND_CHUNK;
    r.chunk = &c;
    int64_t now = clock_now_ms();
    if (n && !req->first_token_ms) {
        req->first_token_ms = now;
        metrics_on_first_token(rd, (double)(now - req->received_ms) / 1000.0);
    }
    metrics_on_tokens(rd, n, c.exit_layers, c.n_exit_layers, now);
    w->tokens += n;
    int rc = loop_send_client(rd, &req->client, &r);
    if (rc == RIVER_EFULL) {
        /* The client stopped reading: its queue is full. The worker stops at once, and
         * the client reads the tokens it was sent, then this error (owed until it fits). */
        uint32_t sent = req->n_delivered - (uint32_t)n;
        log_info("request %" PRIu64 " (%s): client not reading after %u tokens; cancelling",
                 req->id, req->rid, sent);
        dispatch__cancel_on_worker(rd, req);
        dispatch__finish_error(rd, req, RIVER__CLIENT__ERROR__CODE__RESOURCE_EXHAUSTED,
                               "the client did not read its stream: %d replies were queued "
                               "for it, limits.max_client_backlog; cancelled after %u tokens",
                               rd->cfg.max_client_backlog, sent);
        return;
    }
    if (rc < 0) {
        /* The client left: nobody wants the rest. */
        log_info("request %" PRIu64 " (%s): client gone (%s); cancelling", req->id, req->rid,
                 river_err_detail());
        dispatch__cancel_on_worker(rd, req);
        metrics_on_final(rd, RIVER__CLIENT__FINAL__REASON__CANCELLED);
        dispatch__free(rd, req);
    }
}

void dispatch_on_done(riverd_t *rd, worker_t *w, const River__Worker__Done *d)
{
    request_t *req = dispatch__mine(rd, w, d->request_id);
    if (!req)
        return;
    dispatch__finish_final(rd, req, d->final, RIVER__CLIENT__FINAL__REASON__UNSPECIFIED);
}

static void dispatch__retry(riverd_t *rd, request_t *req, const char *why)
{
    dispatch__unassign(rd, req);
    if (req->attempts >= RIVERD_MAX_ATTEMPTS) {
        dispatch__finish_error(rd, req, RIVER__CLIENT__ERROR__CODE__UNAVAILABLE,
                               "no worker could finish the request (%d attempts; last: %s)",
                               req->attempts, why);
        return;
    }
    rd->metrics.redispatched++;
    dispatch__enqueue(rd, req, true);
}

void dispatch_on_failed(riverd_t *rd, worker_t *w, const River__Worker__Failed *f)
{
    request_t *req = dispatch__mine(rd, w, f->request_id);
    if (!req)
        return;
    River__Client__Error__Code code =
        f->error ? f->error->code : RIVER__CLIENT__ERROR__CODE__INTERNAL;
    const char *msg = f->error && f->error->message[0] ? f->error->message : "worker failed";
    if (req->cancelled && code == RIVER__CLIENT__ERROR__CODE__CANCELLED) {
        dispatch__finish_final(rd, req, NULL, RIVER__CLIENT__FINAL__REASON__CANCELLED);
        return;
    }
    /* What another worker may well finish: a worker out of room, one going away, or one
     * whose drain deadline cut the request off. */
    bool retry = !req->cancelled && !rd->draining &&
                 (code == RIVER__CLIENT__ERROR__CODE__UNAVAILABLE ||
                  code == RIVER__CLIENT__ERROR__CODE__RESOURCE_EXHAUSTED ||
                  (code == RIVER__CLIENT__ERROR__CODE__CANCELLED &&
                   w->state == WORKER_DRAINING));
    if (retry) {
        log_info("request %" PRIu64 " (%s) failed on worker %s (%s); re-dispatching",
                 req->id, req->rid, w->id, msg);
        req->avoid_serial = w->serial;
        dispatch__retry(rd, req, msg);
        return;
    }
    dispatch__finish_error(rd, req, code, "%s", msg);
}

void dispatch_requeue_worker(riverd_t *rd, worker_t *w, const char *why)
{
    /* w->reqs is newest first; putting each at the front of the queue leaves the oldest
     * at the front. */
    request_t *req;
    while ((req = w->reqs)) {
        dispatch__cancel_on_worker(rd, req);
        if (req->cancelled) {
            dispatch__unassign(rd, req);
            dispatch__finish_final(rd, req, NULL, RIVER__CLIENT__FINAL__REASON__CANCELLED);
            continue;
        }
        log_info("request %" PRIu64 " (%s): %s after %u tokens; re-dispatching", req->id,
                 req->rid, why, req->n_delivered);
        dispatch__retry(rd, req, why);
    }
}

static bool dispatch__unbind(void *user, const void *key, size_t len, void *val)
{
    session_t *s = val;
    if (s->w == user)
        s->w = NULL;
    return false;
}

void dispatch_forget_worker(riverd_t *rd, worker_t *w)
{
    if (rd->sessions)
        hmap_sweep(rd->sessions, dispatch__unbind, w);
}

/* ---- Timers ---- */

static bool dispatch__session_idle(void *user, const void *key, size_t len, void *val)
{
    session_t *s = val;
    if (*(const int64_t *)user - s->last_used_ms < DISPATCH_SESSION_IDLE_MS)
        return false;
    free(s);
    return true;
}

void dispatch_tick(riverd_t *rd, int64_t now)
{
    /* Deadlines: entries of requests that ended already are skipped. */
    while (rd->n_heap && rd->heap[0].at <= now) {
        struct dispatch_deadline d = rd->heap[0];
        dispatch__heap_pop(rd);
        request_t *req = dispatch__by_id(rd, d.id);
        if (!req || req->deadline_ms != d.at)
            continue;
        dispatch__cancel_on_worker(rd, req);
        dispatch__finish_error(rd, req, RIVER__CLIENT__ERROR__CODE__DEADLINE_EXCEEDED,
                               "deadline of %u ms passed after %u tokens",
                               req->gen->deadline_ms, req->n_delivered);
    }

    /* Requests must not wait for workers that are not coming. */
    int dispatchable;
    workers_count(rd, NULL, NULL, NULL, &dispatchable);
    if (dispatchable > 0)
        rd->no_worker_since_ms = 0;
    else if (!rd->no_worker_since_ms)
        rd->no_worker_since_ms = now;
    if (rd->no_worker_since_ms && rd->n_queued &&
        now - rd->no_worker_since_ms >= dispatch__unavailable_ms(rd))
        dispatch_fail_queued(rd, RIVER__CLIENT__ERROR__CODE__UNAVAILABLE,
                             "no worker is available");

    dispatch__owed_tick(rd, now);
    if (now >= rd->next_session_sweep_ms) {
        hmap_sweep(rd->sessions, dispatch__session_idle, &now);
        rd->next_session_sweep_ms = now + DISPATCH_SESSION_SWEEP_MS;
    }
    if (rd->pump)
        dispatch__pump(rd);
}

int64_t dispatch_next_ms(riverd_t *rd, int64_t now)
{
    int64_t next = rd->next_session_sweep_ms;
    if (rd->n_heap && rd->heap[0].at < next)
        next = rd->heap[0].at;
    if (rd->no_worker_since_ms && rd->n_queued) {
        int64_t t = rd->no_worker_since_ms + dispatch__unavailable_ms(rd);
        if (t < next)
            next = t;
    }
    if (rd->next_owed_ms && rd->next_owed_ms < next)
        next = rd->next_owed_ms;
    if (rd->pump)
        next = now;
    return next;
}

/* ---- Life cycle ---- */

void dispatch_fail_queued(riverd_t *rd, River__Client__Error__Code code, const char *why)
{
    while (rd->queue_head) {
        request_t *req = rd->queue_head;
        dispatch__finish_error(rd, req, code, "%s after %u tokens", why, req->n_delivered);
    }
}

static bool dispatch__collect(void *user, const void *key, size_t len, void *val)
{
    request_t ***p = user;
    *(*p)++ = val;
    return false;
}

void dispatch_fail_all(riverd_t *rd, River__Client__Error__Code code, const char *why)
{
    dispatch_fail_queued(rd, code, why);
    size_t n = hmap_count(rd->req_by_id);
    request_t **all = n ? malloc(n * sizeof *all) : NULL, **p = all;
    if (!all)
        return;
    hmap_sweep(rd->req_by_id, dispatch__collect, &p);
    for (size_t i = 0; i < n; i++) {
        dispatch__cancel_on_worker(rd, all[i]);
        dispatch__finish_error(rd, all[i], code, "%s", why);
    }
    free(all);
}

int dispatch_init(riverd_t *rd)
{
    int rc;
    if ((rc = hmap_new(&rd->req_by_id)) < 0 || (rc = hmap_new(&rd->req_by_link)) < 0 ||
        (rc = hmap_new(&rd->req_by_client)) < 0 || (rc = hmap_new(&rd->client_load)) < 0 ||
        (rc = hmap_new(&rd->sessions)) < 0)
        return rc;
    rd->next_session_sweep_ms = clock_now_ms() + DISPATCH_SESSION_SWEEP_MS;
    return 0;
}

static bool dispatch__free_session(void *user, const void *key, size_t len, void *val)
{
    free(val);
    return true;
}

void dispatch_fini(riverd_t *rd)
{
    if (rd->req_by_id) {
        size_t n = hmap_count(rd->req_by_id);
        request_t **all = n ? malloc(n * sizeof *all) : NULL, **p = all;
        if (all) {
            hmap_sweep(rd->req_by_id, dispatch__collect, &p);
            for (size_t i = 0; i < n; i++)
                dispatch__free(rd, all[i]);
            free(all);
        }
    }
    if (rd->sessions)
        hmap_sweep(rd->sessions, dispatch__free_session, NULL);
    while (rd->owed_head) {
        dispatch_owed_t *o = rd->owed_head;
        rd->owed_head = o->next;
        free(o);
    }
    rd->owed_tail = NULL;
    rd->n_owed = 0;
    hmap_destroy(&rd->client_load);
    hmap_destroy(&rd->req_by_id);
    hmap_destroy(&rd->req_by_link);
    hmap_destroy(&rd->req_by_client);
    hmap_destroy(&rd->sessions);
    free(rd->heap);
    rd->heap = NULL;
    rd->n_heap = rd->cap_heap = 0;
}
