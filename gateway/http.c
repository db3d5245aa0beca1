/* The HTTP side: libmicrohttpd with one thread per connection, so a handler may wait for
 * riverd on its request's condition variable. Routes are a table. A streamed completion is
 * a callback response writing Server-Sent Events: `data: {json}\n\n` per chunk, then
 * `data: [DONE]\n\n`; while nothing arrives for a second it writes an SSE comment, so that
 * a client that went away is noticed (the write fails), the response is freed, and the
 * request is cancelled on its worker. */
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/time.h>
#include <time.h>

#include <microhttpd.h>

#include "common/err.h"
#include "common/log.h"
#include "gateway/gateway.h"

/* A stream with nothing new for this long gets an SSE comment line. */
#define GW_HTTP_KEEPALIVE_MS 1000

struct gw_http {
    struct MHD_Daemon *d;
    gw_ctx_t *ctx;
    int port;
};

/* One HTTP request: its body as it arrives. */
typedef struct gw_conn {
    char *body;
    size_t n, cap;
    int too_large;
} gw_conn_t;

static atomic_int gw_http__in_flight;
static atomic_uint_fast64_t gw_http__serial;

/* ---- Responses ---- */

static enum MHD_Result gw_http__queue(struct MHD_Connection *c, int status,
                                      struct MHD_Response *resp)
{
    if (!resp)
        return MHD_NO;
    enum MHD_Result r = MHD_queue_response(c, (unsigned)status, resp);
    MHD_destroy_response(resp);
    gw_metrics_request(status);
    return r;
}

static enum MHD_Result gw_http__json(struct MHD_Connection *c, int status, json_t *o)
{
    char *text = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (!text)
        return MHD_NO;
    size_t len = strlen(text);
    char *body = realloc(text, len + 2);
    if (!body) {
        free(text);
        return MHD_NO;
    }
    body[len] = '\n';
    body[len + 1] = '\0';
    struct MHD_Response *r =
        MHD_create_response_from_buffer(len + 1, body, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
    return gw_http__queue(c, status, r);
}

static enum MHD_Result gw_http__error(struct MHD_Connection *c, const gw_error_t *e)
{
    int status = gw_error_status(e->kind);
    if (status >= 500 || e->kind == GW_ERR_RATE)
        log_warn("%d: %s", status, e->message);
    else
        log_debug("%d: %s", status, e->message);
    return gw_http__json(c, status, gw_error_json(e));
}

/* ---- Streaming ---- */

typedef struct gw_stream {
    gw_ctx_t *ctx;
    gw_call_t *call;
    int64_t created;
    char *out;            /* SSE bytes not yet handed to MHD */
    size_t n_out, off_out, cap_out;
    int role_sent, ended;
} gw_stream_t;

static int gw_stream__add(gw_stream_t *s, const char *text, size_t len)
{
    if (s->n_out + len > s->cap_out) {
        size_t cap = s->cap_out ? s->cap_out : 1024;
        while (cap < s->n_out + len)
            cap *= 2;
        char *p = realloc(s->out, cap);
        if (!p)
            return -1;
        s->out = p;
        s->cap_out = cap;
    }
    memcpy(s->out + s->n_out, text, len);
    s->n_out += len;
    return 0;
}

/* Appends `data: {json}\n\n` and drops the reference to o. */
static int gw_stream__event(gw_stream_t *s, json_t *o)
{
    char *text = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (!text)
        return -1;
    int rc = gw_stream__add(s, "data: ", 6) || gw_stream__add(s, text, strlen(text)) ||
             gw_stream__add(s, "\n\n", 2);
    free(text);
    return rc ? -1 : 0;
}

/* Metrics of a call that ended (once per call). */
static void gw_http__account(const gw_call_t *c)
{
    if (c->t_first > 0)
        gw_metrics_first_token(c->t_first - c->t_start);
    if (c->ok)
        gw_metrics_tokens(c->usage.prompt_tokens, c->usage.completion_tokens,
                          c->t_first > 0 ? c->t_end - c->t_first : 0);
}

/* Waits (call locked) until something new arrived, the call ended, or ms passed. */
static void gw_http__wait(gw_call_t *c, int ms, int need_start)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += ms / 1000;
    ts.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    while (!c->done && (need_start ? !c->started : c->n_ids == 0 && c->n_text == 0)) {
        int e = ms < 0 ? pthread_cond_wait(&c->cv, &c->mu)
                       : pthread_cond_timedwait(&c->cv, &c->mu, &ts);
        if (e == ETIMEDOUT)
            return;
    }
}

/* Formats what the call has into SSE events (call locked). */
static int gw_stream__fill(gw_stream_t *s)
{
    gw_call_t *c = s->call;
    const gw_request_t *r = &c->req;
    if (c->n_text || c->n_ids) {
        gw_piece_t p = {c->text, c->n_text, c->ids, c->exit_layers, c->n_ids,
                        c->n_exit_layers};
        if (gw_stream__event(s, gw_chunk_json(r, c->id, s->created, &p, NULL, 0)))
            return -1;
        c->n_text = c->n_ids = c->n_exit_layers = 0;
    }
    if (!c->done)
        return 0;
    s->ended = 1;
    if (!c->ok) {
        gw_error_t e;
        gw_error_set(&e, gw_error_from_river(c->code), NULL, "%s: %s", river_code_name(c->code),
                     c->message);
        gw_metrics_stream_error();
        log_warn("stream %s ended with %s", c->id, e.message);
        return gw_stream__event(s, gw_error_json(&e));
    }
    if (gw_stream__event(s, gw_chunk_json(r, c->id, s->created, NULL,
                                          gw_finish_reason(c->finish), 0)))
        return -1;
    if (r->include_usage && gw_stream__event(s, gw_usage_chunk_json(r, c->id, s->created,
                                                                     &c->usage)))
        return -1;
    return gw_stream__add(s, "data: [DONE]\n\n", 14);
}

static ssize_t gw_stream__read(void *cls, uint64_t pos, char *buf, size_t max)
{
    gw_stream_t *s = cls;
    if (s->off_out == s->n_out) {
        s->off_out = s->n_out = 0;
        if (s->ended)
            return MHD_CONTENT_READER_END_OF_STREAM;
        int rc = 0;
        if (s->call->req.api == GW_API_CHAT && !s->role_sent) {
            s->role_sent = 1;
            rc = gw_stream__event(s, gw_chunk_json(&s->call->req, s->call->id, s->created,
                                                   NULL, NULL, 1));
        } else {
            pthread_mutex_lock(&s->call->mu);
            gw_http__wait(s->call, GW_HTTP_KEEPALIVE_MS, 0);
            rc = gw_stream__fill(s);
            pthread_mutex_unlock(&s->call->mu);
            if (!rc && s->n_out == 0)
                rc = gw_stream__add(s, ": keep-alive\n\n", 14);
        }
        if (rc)
            return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    size_t n = s->n_out - s->off_out;
    if (n > max)
        n = max;
    memcpy(buf, s->out + s->off_out, n);
    s->off_out += n;
    return (ssize_t)n;
}

/* The response is gone: the stream ended, or the client went away mid-stream, in which
 * case the request is cancelled on its worker. */
static void gw_stream__free(void *cls)
{
    gw_stream_t *s = cls;
    pthread_mutex_lock(&s->call->mu);
    int done = s->call->done;
    pthread_mutex_unlock(&s->call->mu);
    if (!done) {
        log_info("client of %s went away: cancelling it", s->call->id);
        gw_bridge_cancel(s->ctx->bridge, s->call);
    } else {
        gw_http__account(s->call);
    }
    gw_call_release(&s->call);
    free(s->out);
    free(s);
    atomic_fetch_sub(&gw_http__in_flight, 1);
    gw_metrics_in_flight(-1);
}

/* ---- Generation ---- */

/* Fills the call's riverd options from its request. */
static void gw_http__opts(gw_call_t *c, const gw_config_t *cfg)
{
    gw_request_t *r = &c->req;
    river_generate_opts_t *o = &c->opts;
    /* Special tokens come only from the template's own text, unless the caller's key is
     * one of raw_special_keys: a message or a prompt that spells one is text. */
    o->special_spans_given = !c->raw_special;
    if (c->prompt) {
        o->prompt = c->prompt;
        o->text_has_special = 1;
        o->special_spans = c->special;
        o->n_special_spans = c->n_special;
    } else if (r->prompt) {
        o->prompt = r->prompt;
    } else {
        o->prompt_ids = r->prompt_ids;
        o->n_prompt_ids = r->n_prompt_ids;
    }
    o->max_tokens = r->max_tokens;
    o->temperature = (float)r->temperature;
    o->top_p = (float)r->top_p;
    o->has_seed = r->has_seed;
    o->seed = r->seed;
    o->stop = r->stop;
    o->n_stop = r->n_stop;
    o->exit_policy = r->policy;
    o->has_tau = r->has_tau;
    o->tau = (float)r->tau;
    o->has_theta = r->has_theta;
    o->theta = (float)r->theta;
    o->has_exit_layer = r->has_exit_layer;
    o->exit_layer = r->exit_layer;
    o->lossless = r->lossless;
    o->draft_tokens = (uint32_t)r->draft_tokens;
    o->ignore_eos = r->ignore_eos;
    o->deadline_ms = (uint32_t)cfg->request_timeout_ms;
}

static int gw_http__key_in(const gw_apikeys_t *keys, struct MHD_Connection *c);

static enum MHD_Result gw_http__generate(gw_ctx_t *ctx, struct MHD_Connection *conn,
                                         gw_conn_t *cc, gw_api_t api)
{
    gw_error_t err;
    gw_request_t req;
    if (gw_request_parse(&req, api, cc->body ? cc->body : "", cc->n,
                         ctx->cfg->default_temperature, &err)) {
        gw_request_free(&req);
        return gw_http__error(conn, &err);
    }
    char *prompt = NULL;
    uint32_t *special = NULL;
    size_t n_special = 0;
    if (!gw_models_has(ctx->models, req.model)) {
        gw_error_set(&err, GW_ERR_MODEL, "model", "the model '%s' does not exist", req.model);
        gw_request_free(&req);
        return gw_http__error(conn, &err);
    }
    /* The in-flight slot comes before the rendering, so that max_concurrent bounds the
     * renderings at once too, and with them the memory they take. */
    if (atomic_fetch_add(&gw_http__in_flight, 1) >= ctx->cfg->max_concurrent) {
        atomic_fetch_sub(&gw_http__in_flight, 1);
        gw_error_set(&err, GW_ERR_RATE, NULL,
                     "too many requests in flight (limits.max_concurrent = %d)",
                     ctx->cfg->max_concurrent);
        gw_request_free(&req);
        return gw_http__error(conn, &err);
    }
    gw_metrics_in_flight(1);
    if (api == GW_API_CHAT &&
        gw_models_render(ctx->models, &req, gw_models_render_budget(ctx->cfg, cc->n), &prompt,
                         &special, &n_special, &err)) {
        atomic_fetch_sub(&gw_http__in_flight, 1);
        gw_metrics_in_flight(-1);
        gw_request_free(&req);
        gw_release_memory(cc->n);
        return gw_http__error(conn, &err);
    }
    gw_call_t *call = gw_call_new();
    if (!call) {
        atomic_fetch_sub(&gw_http__in_flight, 1);
        gw_metrics_in_flight(-1);
        free(prompt);
        free(special);
        gw_request_free(&req);
        return MHD_NO;
    }
    call->req = req;
    call->prompt = prompt;
    call->special = special;
    call->n_special = n_special;
    call->body_bytes = cc->n;
    call->raw_special = ctx->raw_keys && gw_http__key_in(ctx->raw_keys, conn);
    snprintf(call->id, sizeof call->id, "%s-%08lx%" PRIxFAST64,
             api == GW_API_CHAT ? "chatcmpl" : "cmpl", (unsigned long)(random() & 0xffffffffUL),
             atomic_fetch_add(&gw_http__serial, 1));
    gw_http__opts(call, ctx->cfg);
    int64_t created = (int64_t)time(NULL);
    enum MHD_Result res = MHD_NO;
    int handed_over = 0;
    if (gw_bridge_submit(ctx->bridge, call)) {
        gw_error_set(&err, GW_ERR_INTERNAL, NULL, "%s", river_err_detail());
        res = gw_http__error(conn, &err);
        goto out;
    }
    pthread_mutex_lock(&call->mu);
    /* The status line waits for the first token or the end, so that a request riverd
     * refuses gets its HTTP status even when it asked for a stream. */
    gw_http__wait(call, -1, !call->req.stream ? 0 : 1);
    while (!call->req.stream && !call->done)
        pthread_cond_wait(&call->cv, &call->mu);
    int failed_early = call->done && !call->ok && (!call->req.stream || call->n_ids == 0);
    if (failed_early) {
        gw_error_set(&err, gw_error_from_river(call->code), NULL, "%s: %s",
                     river_code_name(call->code), call->message);
        pthread_mutex_unlock(&call->mu);
        gw_http__account(call);
        res = gw_http__error(conn, &err);
        goto out;
    }
    if (!call->req.stream) {
        gw_piece_t p = {call->text, call->n_text, call->ids, call->exit_layers, call->n_ids,
                        call->n_exit_layers};
        json_t *o = gw_response_json(&call->req, call->id, created, &p,
                                     gw_finish_reason(call->finish), &call->usage,
                                     call->prompt);
        pthread_mutex_unlock(&call->mu);
        gw_http__account(call);
        res = gw_http__json(conn, 200, o);
        goto out;
    }
    pthread_mutex_unlock(&call->mu);
    gw_stream_t *s = calloc(1, sizeof *s);
    if (!s)
        goto out;
    s->ctx = ctx;
    s->call = call;
    s->created = created;
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384,
                                                               gw_stream__read, s,
                                                               gw_stream__free);
    if (!r) {
        free(s);
        goto out;
    }
    handed_over = 1; /* gw_stream__free lets go of the call and the in-flight count */
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    res = gw_http__queue(conn, 200, r);
out:
    if (!handed_over) {
        pthread_mutex_lock(&call->mu);
        int done = call->done;
        pthread_mutex_unlock(&call->mu);
        if (!done)
            gw_bridge_cancel(ctx->bridge, call);
        gw_call_release(&call);
        atomic_fetch_sub(&gw_http__in_flight, 1);
        gw_metrics_in_flight(-1);
    }
    return res;
}

/* ---- Routes ---- */

static enum MHD_Result gw_http__chat(gw_ctx_t *ctx, struct MHD_Connection *c, gw_conn_t *cc)
{
    return gw_http__generate(ctx, c, cc, GW_API_CHAT);
}

static enum MHD_Result gw_http__completions(gw_ctx_t *ctx, struct MHD_Connection *c,
                                            gw_conn_t *cc)
{
    return gw_http__generate(ctx, c, cc, GW_API_COMPLETIONS);
}

static enum MHD_Result gw_http__models(gw_ctx_t *ctx, struct MHD_Connection *c, gw_conn_t *cc)
{
    return gw_http__json(c, 200, gw_models_json(ctx->cfg, (int64_t)time(NULL)));
}

static enum MHD_Result gw_http__health(gw_ctx_t *ctx, struct MHD_Connection *c, gw_conn_t *cc)
{
    return gw_http__json(c, 200, json_pack("{s:s}", "status", "ok"));
}

static enum MHD_Result gw_http__metrics(gw_ctx_t *ctx, struct MHD_Connection *c,
                                        gw_conn_t *cc)
{
    char *text = gw_metrics_text();
    if (!text)
        return MHD_NO;
    struct MHD_Response *r =
        MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(text);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE,
                            "text/plain; version=0.0.4; charset=utf-8");
    return gw_http__queue(c, 200, r);
}

typedef struct gw_route {
    const char *method, *path;
    enum MHD_Result (*fn)(gw_ctx_t *, struct MHD_Connection *, gw_conn_t *);
    int needs_key;  /* the API key is checked */
    int has_body;   /* POST: the body limit applies */
} gw_route_t;

static const gw_route_t gw_http__routes[] = {
    {"POST", "/v1/chat/completions", gw_http__chat, 1, 1},
    {"POST", "/v1/completions", gw_http__completions, 1, 1},
    {"GET", "/v1/models", gw_http__models, 1, 0},
    {"GET", "/health", gw_http__health, 0, 0},
    {"GET", "/metrics", gw_http__metrics, 0, 0},
};
#define GW_N_ROUTES (sizeof gw_http__routes / sizeof gw_http__routes[0])

/* Whether the request's Bearer key is one of keys. */
static int gw_http__key_in(const gw_apikeys_t *keys, struct MHD_Connection *c)
{
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (!h || strncasecmp(h, "Bearer ", 7))
        return 0;
    h += 7;
    while (*h == ' ')
        h++;
    return *h && gw_apikeys_check(keys, h);
}

/* Whether the request carries an allowed key (always, without a key file). */
static int gw_http__key_ok(const gw_ctx_t *ctx, struct MHD_Connection *c)
{
    return !ctx->keys || gw_http__key_in(ctx->keys, c);
}

static enum MHD_Result gw_http__access(void *cls, struct MHD_Connection *c, const char *url,
                                       const char *method, const char *version,
                                       const char *upload, size_t *upload_size, void **con_cls)
{
    gw_ctx_t *ctx = cls;
    gw_conn_t *cc = *con_cls;
    if (!cc) {
        cc = calloc(1, sizeof *cc);
        if (!cc)
            return MHD_NO;
        *con_cls = cc;
        /* A stream is many small writes: without TCP_NODELAY each waits for the client's
         * delayed ACK of the one before (Nagle), tens of milliseconds a token. */
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        int one = 1;
        if (ci && setsockopt(ci->connect_fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one))
            log_debug("TCP_NODELAY: %s", strerror(errno));
        return MHD_YES;
    }
    if (*upload_size) {
        /* A body over the limit is read and dropped, then answered 413: answering before
         * the client has sent it all would reset a connection it is still writing to. */
        size_t n = *upload_size;
        *upload_size = 0;
        if (cc->too_large || cc->n + n > (size_t)ctx->cfg->max_body_bytes) {
            cc->too_large = 1;
            free(cc->body);
            cc->body = NULL;
            cc->n = cc->cap = 0;
            return MHD_YES;
        }
        if (cc->n + n + 1 > cc->cap) {
            size_t cap = cc->cap ? cc->cap : 4096;
            while (cap < cc->n + n + 1)
                cap *= 2;
            char *p = realloc(cc->body, cap);
            if (!p)
                return MHD_NO;
            cc->body = p;
            cc->cap = cap;
        }
        memcpy(cc->body + cc->n, upload, n);
        cc->n += n;
        cc->body[cc->n] = '\0';
        return MHD_YES;
    }
    gw_error_t err;
    const gw_route_t *path_match = NULL;
    for (size_t i = 0; i < GW_N_ROUTES; i++) {
        const gw_route_t *rt = &gw_http__routes[i];
        if (strcmp(url, rt->path))
            continue;
        path_match = rt;
        if (strcmp(method, rt->method))
            continue;
        if (rt->needs_key && !gw_http__key_ok(ctx, c)) {
            gw_error_set(&err, GW_ERR_AUTH, NULL,
                         "Incorrect or missing API key: send Authorization: Bearer KEY");
            return gw_http__error(c, &err);
        }
        if (cc->too_large) {
            gw_error_set(&err, GW_ERR_TOO_LARGE, NULL,
                         "the request body is over limits.max_body_bytes (%d bytes)",
                         ctx->cfg->max_body_bytes);
            return gw_http__error(c, &err);
        }
        return rt->fn(ctx, c, cc);
    }
    if (path_match) {
        gw_error_set(&err, GW_ERR_METHOD, NULL, "%s needs %s, not %s", url, path_match->method,
                     method);
        return gw_http__error(c, &err);
    }
    gw_error_set(&err, GW_ERR_NOT_FOUND, NULL, "no such path: %s %s", method, url);
    return gw_http__error(c, &err);
}

static void gw_http__completed(void *cls, struct MHD_Connection *c, void **con_cls,
                               enum MHD_RequestTerminationCode toe)
{
    gw_conn_t *cc = *con_cls;
    if (!cc)
        return;
    free(cc->body);
    free(cc);
    *con_cls = NULL;
}

static void gw_http__log(void *cls, const char *fmt, va_list ap)
{
    char line[1024];
    vsnprintf(line, sizeof line, fmt, ap);
    size_t n = strlen(line);
    while (n && line[n - 1] == '\n')
        line[--n] = '\0';
    log_warn("http: %s", line);
}

int gw_http_start(gw_http_t **out, gw_ctx_t *ctx)
{
    *out = NULL;
    gw_http_t *h = calloc(1, sizeof *h);
    if (!h)
        return river_err_set(RIVER_ENOMEM, "http");
    h->ctx = ctx;
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)ctx->cfg->listen_port);
    if (inet_pton(AF_INET, ctx->cfg->listen_address, &sa.sin_addr) != 1) {
        free(h);
        return river_err_set(RIVER_ECONFIG, "listen.address '%s' is not an IPv4 address",
                             ctx->cfg->listen_address);
    }
    unsigned timeout_s = (unsigned)((ctx->cfg->connection_timeout_ms + 999) / 1000);
    h->d = MHD_start_daemon(
        MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG,
        (uint16_t)ctx->cfg->listen_port, NULL, NULL, gw_http__access, ctx,
        MHD_OPTION_EXTERNAL_LOGGER, gw_http__log, ctx, MHD_OPTION_SOCK_ADDR,
        (struct sockaddr *)&sa, MHD_OPTION_CONNECTION_LIMIT,
        (unsigned)ctx->cfg->max_connections, MHD_OPTION_CONNECTION_TIMEOUT, timeout_s,
        MHD_OPTION_NOTIFY_COMPLETED, gw_http__completed, ctx, MHD_OPTION_END);
    if (!h->d) {
        free(h);
        return river_err_set(RIVER_ESYS, "cannot listen on %s:%d: %s", ctx->cfg->listen_address,
                             ctx->cfg->listen_port, strerror(errno));
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
    h->port = di ? di->port : ctx->cfg->listen_port;
    *out = h;
    return 0;
}

int gw_http_port(const gw_http_t *h)
{
    return h->port;
}

void gw_http_stop(gw_http_t **ph)
{
    gw_http_t *h = *ph;
    if (!h)
        return;
    *ph = NULL;
    MHD_stop_daemon(h->d);
    free(h);
}
