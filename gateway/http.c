/* The HTTP side: libmicrohttpd on a few epoll threads, so that idle or slow connections
 * cost a socket and a little memory, not a thread. No handler blocks: a request waiting
 * for riverd suspends its connection, and the bridge thread resumes it when something
 * arrives (gw_call_t.on_event). Routes are a table; a request's route and API key are
 * checked when its headers are complete, before any of its body is read.
 *
 * One more thread, the watcher, runs one poll loop over what libmicrohttpd cannot do: the
 * absolute deadlines for a request's headers and body (libmicrohttpd only knows an idle
 * timeout, which a client sending a byte now and then never reaches), the one-second
 * keep-alive tick of a waiting stream, and the sockets of suspended connections, which
 * libmicrohttpd no longer watches: a client that hangs up while its request runs has the
 * request cancelled at once, streaming or not.
 *
 * A streamed completion is a callback response writing Server-Sent Events: `data: {json}\n\n`
 * per chunk, then `data: [DONE]\n\n`; while nothing arrives for a second it writes an SSE
 * comment. */
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>
#include <time.h>

#include <microhttpd.h>

#include "common/clock.h"
#include "common/err.h"
#include "common/log.h"
#include "gateway/gateway.h"

/* A stream with nothing new for this long gets an SSE comment line. */
#define GW_HTTP_KEEPALIVE_MS 1000

/* How many epoll threads serve the connections: rendering a large chat template takes one
 * of them for a while, and the others keep answering. */
#define GW_HTTP_THREADS 4
/* At most this many warnings a second about refused or closed connections; the rest are
 * counted and the count logged with the next one allowed. */
#define GW_HTTP_LOG_PER_S 5

/* Where a connection is: each phase is a list, HEADERS, BODY and IDLE in deadline order
 * (every entry of one of them got the same timeout, appended when it began). */
typedef enum {
    GW_SOCK_HEADERS = 0, /* until its headers are complete: closed at the deadline */
    GW_SOCK_BODY,        /* until its body is complete: closed at the deadline */
    GW_SOCK_IDLE,        /* between two requests, until a request line: closed at the deadline */
    GW_SOCK_RUN,         /* its request is being answered */
    GW_SOCK_WAIT,        /* suspended on a call: resumed by the bridge, a hangup or the deadline */
    GW_SOCK_NPHASES
} gw_sock_phase_t;

/* One client connection, from accept to close (libmicrohttpd's socket context). Its
 * fields after `c` are under gw_http__mu. */
typedef struct gw_sock {
    struct gw_http *h;
    struct MHD_Connection *c;
    int fd;
    char addr[INET_ADDRSTRLEN];
    struct gw_sock *prev, *next; /* in h->lists[phase] */
    gw_sock_phase_t phase;
    double deadline;  /* monotonic seconds; 0: none */
    uint64_t serial;  /* which suspension, so the watcher never acts on a later one */
    int suspended;    /* libmicrohttpd holds it suspended, and someone must resume it */
    int gone;         /* the client hung up while it was suspended */
} gw_sock_t;

typedef struct gw_sock_list {
    gw_sock_t *head, *tail;
} gw_sock_list_t;

struct gw_http {
    struct MHD_Daemon *d;
    struct MHD_Daemon *metrics; /* metrics.port's listener, or NULL */
    gw_ctx_t *ctx;
    int port, metrics_port;
    gw_sock_list_t lists[GW_SOCK_NPHASES]; /* under gw_http__mu */
    size_t n_waiting;                      /* the WAIT list's length */
    int efd;                               /* wakes the watcher */
    pthread_t watcher;
    int stop; /* under gw_http__mu */
};

/* One HTTP request: its route, its body as it arrives, and its call while it waits. */
typedef struct gw_conn {
    gw_sock_t *sock;
    const struct gw_route *route;
    char *body;
    size_t n, cap;
    int too_large;
    gw_tenant_t *tenant; /* whose key it carries, once the route's key check passed */
    gw_call_t *call; /* in flight, holds a reference and one of limits.max_concurrent */
    int64_t created;
} gw_conn_t;

/* The sockets' lists and phases, and every call's waiter. */
static pthread_mutex_t gw_http__mu = PTHREAD_MUTEX_INITIALIZER;
static atomic_int gw_http__in_flight;
static atomic_uint_fast64_t gw_http__serial;
static uint64_t gw_http__suspensions; /* under gw_http__mu */

/* ---- Rate-limited warnings ---- */

static void gw_http__warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void gw_http__warn(const char *fmt, ...)
{
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    static int64_t second;
    static int n_this_second;
    static long suppressed;
    pthread_mutex_lock(&mu);
    int64_t now = clock_now_ms() / 1000;
    if (now != second) {
        second = now;
        n_this_second = 0;
    }
    if (n_this_second >= GW_HTTP_LOG_PER_S) {
        suppressed++;
        pthread_mutex_unlock(&mu);
        return;
    }
    n_this_second++;
    long before = suppressed;
    suppressed = 0;
    pthread_mutex_unlock(&mu);
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (before)
        log_warn("%s (%ld similar lines left out)", line, before);
    else
        log_warn("%s", line);
}

/* ---- Connections and the watcher ---- */

static void gw_http__wake_watcher(gw_http_t *h)
{
    uint64_t one = 1;
    if (write(h->efd, &one, sizeof one) < 0 && errno != EAGAIN)
        log_debug("watcher wake: %s", strerror(errno));
}

/* Moves s to the end of phase's list (gw_http__mu held). */
static void gw_http__move(gw_sock_t *s, gw_sock_phase_t phase, double deadline)
{
    gw_http_t *h = s->h;
    gw_sock_list_t *from = &h->lists[s->phase];
    if (s->prev)
        s->prev->next = s->next;
    else if (from->head == s)
        from->head = s->next;
    if (s->next)
        s->next->prev = s->prev;
    else if (from->tail == s)
        from->tail = s->prev;
    if (s->phase == GW_SOCK_WAIT)
        h->n_waiting--;
    gw_sock_list_t *to = &h->lists[phase];
    int was_empty = !to->head;
    s->prev = to->tail;
    s->next = NULL;
    if (to->tail)
        to->tail->next = s;
    else
        to->head = s;
    to->tail = s;
    s->phase = phase;
    s->deadline = deadline;
    if (phase == GW_SOCK_WAIT)
        h->n_waiting++;
    /* The watcher's poll must learn of a new socket to watch, or of a deadline sooner
     * than the ones it has; a deadline appended behind others is never sooner. */
    if (phase == GW_SOCK_WAIT || (was_empty && deadline > 0))
        gw_http__wake_watcher(h);
}

static void gw_http__unlink(gw_sock_t *s)
{
    gw_http__move(s, GW_SOCK_RUN, 0);
    gw_sock_list_t *l = &s->h->lists[GW_SOCK_RUN];
    l->tail = s->prev;
    if (s->prev)
        s->prev->next = NULL;
    else
        l->head = NULL;
    s->prev = s->next = NULL;
}

/* Suspends s (inside one of libmicrohttpd's callbacks for it) until the call it waits on
 * changes, its client hangs up, or the deadline (0: none). The caller checks the call once
 * more afterwards and resumes s itself when it already changed. */
static void gw_http__suspend(gw_sock_t *s, gw_call_t *call, double deadline)
{
    MHD_suspend_connection(s->c);
    pthread_mutex_lock(&gw_http__mu);
    s->suspended = 1;
    s->serial = ++gw_http__suspensions;
    gw_http__move(s, GW_SOCK_WAIT, deadline);
    call->waiter = s;
    pthread_mutex_unlock(&gw_http__mu);
}

/* Takes s out of WAIT (gw_http__mu held); whether the caller must resume it. */
static int gw_http__unwait(gw_sock_t *s)
{
    if (!s || !s->suspended)
        return 0;
    s->suspended = 0;
    gw_http__move(s, GW_SOCK_RUN, 0);
    return 1;
}

/* A suspended connection is not closed by libmicrohttpd, so s stays valid between
 * gw_http__unwait and the resume, which happens outside gw_http__mu: libmicrohttpd takes
 * its own locks in it. */
static void gw_http__resume(gw_sock_t *s)
{
    pthread_mutex_lock(&gw_http__mu);
    int resume = gw_http__unwait(s);
    pthread_mutex_unlock(&gw_http__mu);
    if (resume)
        MHD_resume_connection(s->c);
}

/* gw_call_t.on_event, in the bridge thread. */
static void gw_http__on_event(gw_call_t *call)
{
    pthread_mutex_lock(&gw_http__mu);
    gw_sock_t *s = call->waiter;
    int resume = gw_http__unwait(s);
    pthread_mutex_unlock(&gw_http__mu);
    if (resume)
        MHD_resume_connection(s->c);
}

static void gw_http__detach(gw_call_t *call)
{
    pthread_mutex_lock(&gw_http__mu);
    call->waiter = NULL;
    pthread_mutex_unlock(&gw_http__mu);
}

/* The watcher's poll timeout: until the soonest deadline (gw_http__mu held). */
static int gw_http__next_timeout(const gw_http_t *h, double now)
{
    double next = 0;
    for (int p = 0; p < GW_SOCK_NPHASES; p++) {
        /* HEADERS and BODY are in deadline order; WAIT is short and read whole. */
        for (const gw_sock_t *s = h->lists[p].head; s; s = s->next) {
            if (s->deadline > 0 && (next == 0 || s->deadline < next))
                next = s->deadline;
            if (p != GW_SOCK_WAIT)
                break;
        }
    }
    if (next == 0)
        return -1;
    double ms = (next - now) * 1000.0 + 1;
    return ms < 0 ? 0 : ms > 60000 ? 60000 : (int)ms;
}

/* Closes the connections past their header, body or idle deadline (gw_http__mu held): a
 * shutdown makes libmicrohttpd's next read see the end and close the socket itself. */
static void gw_http__expire(gw_http_t *h, double now)
{
    static const char *what[] = {"headers", "body", "connection"};
    for (int p = GW_SOCK_HEADERS; p <= GW_SOCK_IDLE; p++) {
        gw_sock_t *s;
        while ((s = h->lists[p].head) && s->deadline > 0 && s->deadline <= now) {
            /* An idle keep-alive connection closed is routine; a slow request is not. */
            if (p == GW_SOCK_IDLE)
                log_debug("closing an idle connection from %s (timeouts.connection)", s->addr);
            else
                gw_http__warn("closing a connection from %s: its %s took longer than "
                              "timeouts.%s", s->addr, what[p], what[p]);
            if (shutdown(s->fd, SHUT_RDWR))
                log_debug("shutdown: %s", strerror(errno));
            gw_http__move(s, GW_SOCK_RUN, 0);
        }
    }
}

static void *gw_http__watch(void *arg)
{
    gw_http_t *h = arg;
    struct pollfd *fds = NULL;
    gw_sock_t **who = NULL;
    uint64_t *serials = NULL;
    gw_sock_t **wake = NULL;
    size_t cap = 0;
    pthread_mutex_lock(&gw_http__mu);
    while (!h->stop) {
        size_t need = h->n_waiting + 1;
        if (need > cap) {
            size_t c = cap ? cap : 64;
            while (c < need)
                c *= 2;
            struct pollfd *f = realloc(fds, c * sizeof *f);
            if (f)
                fds = f;
            gw_sock_t **w = realloc(who, c * sizeof *w);
            if (w)
                who = w;
            uint64_t *sr = realloc(serials, c * sizeof *sr);
            if (sr)
                serials = sr;
            gw_sock_t **wk = realloc(wake, c * sizeof *wk);
            if (wk)
                wake = wk;
            if (f && w && sr && wk)
                cap = c;
            else
                log_error("http watcher: out of memory: some waiting sockets unwatched");
            if (!cap)
                break;
        }
        fds[0] = (struct pollfd){.fd = h->efd, .events = POLLIN};
        size_t n = 1;
        for (gw_sock_t *s = h->lists[GW_SOCK_WAIT].head; s && n < cap; s = s->next, n++) {
            fds[n] = (struct pollfd){.fd = s->fd, .events = POLLRDHUP};
            who[n] = s;
            serials[n] = s->serial;
        }
        int timeout = gw_http__next_timeout(h, clock_now_s());
        pthread_mutex_unlock(&gw_http__mu);
        int got = poll(fds, n, timeout);
        if (got < 0 && errno != EINTR)
            log_error("http watcher: poll: %s", strerror(errno));
        uint64_t count;
        if (got > 0 && (fds[0].revents & POLLIN) && read(h->efd, &count, sizeof count) < 0)
            log_debug("watcher: %s", strerror(errno));
        pthread_mutex_lock(&gw_http__mu);
        double now = clock_now_s();
        size_t n_wake = 0;
        /* A socket polled is acted on only while it is still in the same suspension; one
         * resumed meanwhile may already be closed and its memory reused. */
        for (size_t i = 1; got > 0 && i < n; i++) {
            if (!(fds[i].revents & (POLLRDHUP | POLLHUP | POLLERR)))
                continue;
            for (gw_sock_t *s = h->lists[GW_SOCK_WAIT].head; s; s = s->next) {
                if (s == who[i] && s->serial == serials[i]) {
                    s->gone = 1;
                    if (gw_http__unwait(s))
                        wake[n_wake++] = s;
                    break;
                }
            }
        }
        for (gw_sock_t *s = h->lists[GW_SOCK_WAIT].head, *next; s; s = next) {
            next = s->next;
            if (s->deadline > 0 && s->deadline <= now && n_wake < cap && gw_http__unwait(s))
                wake[n_wake++] = s;
        }
        gw_http__expire(h, now);
        pthread_mutex_unlock(&gw_http__mu);
        for (size_t i = 0; i < n_wake; i++)
            MHD_resume_connection(wake[i]->c);
        pthread_mutex_lock(&gw_http__mu);
    }
    pthread_mutex_unlock(&gw_http__mu);
    free(fds);
    free(who);
    free(serials);
    free(wake);
    return NULL;
}

/* libmicrohttpd's connection notifications: a connection begins with its header deadline
 * and leaves every list when it closes (before its socket is closed). */
static void gw_http__notify(void *cls, struct MHD_Connection *c, void **socket_context,
                            enum MHD_ConnectionNotificationCode toe)
{
    gw_http_t *h = cls;
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        gw_sock_t *s = calloc(1, sizeof *s);
        if (!s)
            return;
        s->h = h;
        s->c = c;
        s->phase = GW_SOCK_RUN;
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        s->fd = ci ? ci->connect_fd : -1;
        ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
        if (ci && ci->client_addr && ci->client_addr->sa_family == AF_INET)
            inet_ntop(AF_INET, &((const struct sockaddr_in *)ci->client_addr)->sin_addr,
                      s->addr, sizeof s->addr);
        /* A stream is many small writes: without TCP_NODELAY each waits for the client's
         * delayed ACK of the one before (Nagle), tens of milliseconds a token. */
        int one = 1;
        if (s->fd >= 0 && setsockopt(s->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one))
            log_debug("TCP_NODELAY: %s", strerror(errno));
        pthread_mutex_lock(&gw_http__mu);
        /* Linked into RUN first so that every socket is in exactly one list. */
        gw_sock_list_t *l = &h->lists[GW_SOCK_RUN];
        s->prev = l->tail;
        if (l->tail)
            l->tail->next = s;
        else
            l->head = s;
        l->tail = s;
        gw_http__move(s, GW_SOCK_HEADERS,
                      clock_now_s() + (double)h->ctx->cfg->headers_timeout_ms / 1000.0);
        pthread_mutex_unlock(&gw_http__mu);
        *socket_context = s;
        return;
    }
    gw_sock_t *s = *socket_context;
    if (!s)
        return;
    pthread_mutex_lock(&gw_http__mu);
    gw_http__unlink(s);
    pthread_mutex_unlock(&gw_http__mu);
    free(s);
    *socket_context = NULL;
}

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
    /* A flood of 429s is a flood of refusals too: its warnings are rate-limited. */
    if (status >= 500 || e->kind == GW_ERR_RATE)
        gw_http__warn("%d: %s", status, e->message);
    else
        log_debug("%d: %s", status, e->message);
    return gw_http__json(c, status, gw_error_json(e));
}

/* ---- Streaming ---- */

typedef struct gw_stream {
    gw_ctx_t *ctx;
    gw_call_t *call;
    gw_sock_t *sock;
    int64_t created;
    double keepalive_at;  /* monotonic seconds: an SSE comment when nothing came by then */
    char *out;            /* SSE bytes not yet handed to MHD */
    size_t n_out, off_out, cap_out;
    int role_sent, ended;
    size_t offset;        /* completion bytes streamed (completions' text_offset) */
    gw_tools_stream_t *tools; /* splits content and tool calls; NULL: all is content */
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

/* Whether a waiting request has something to answer with (call locked): the end, or for
 * a stream its first token (the status line waits for it, so that a request riverd refuses
 * gets its HTTP status even when it asked for a stream) or anything new once streaming. */
static int gw_http__ready(const gw_call_t *c, int streaming)
{
    if (c->done)
        return 1;
    if (!c->req.stream)
        return 0;
    return streaming ? c->n_ids || c->n_text : c->started;
}

/* Suspends the connection of sock until call is ready (see gw_http__suspend). */
static void gw_http__park(gw_sock_t *sock, gw_call_t *call, int streaming, double deadline)
{
    gw_http__suspend(sock, call, deadline);
    pthread_mutex_lock(&call->mu);
    int ready = gw_http__ready(call, streaming);
    pthread_mutex_unlock(&call->mu);
    if (ready)
        gw_http__resume(sock);
}

/* Whether the client of sock hung up while its request waited. */
static int gw_http__gone(const gw_sock_t *sock)
{
    pthread_mutex_lock(&gw_http__mu);
    int gone = sock->gone;
    pthread_mutex_unlock(&gw_http__mu);
    return gone;
}

/* One chunk of what the call has (call locked): its text as content, or through the
 * tool-call stream as content and delta.tool_calls; last: the completion ended. */
static int gw_stream__piece(gw_stream_t *s, int last)
{
    gw_call_t *c = s->call;
    gw_piece_t p = {c->text, c->n_text, c->ids, c->exit_layers, c->n_ids, c->n_exit_layers,
                    c->logprobs, NULL};
    if (s->tools && gw_tools_stream_push(s->tools, c->text, c->n_text, last, &p.text,
                                         &p.text_len, &p.tool_calls))
        return -1;
    int rc = 0;
    if (p.text_len || p.n_ids || p.tool_calls)
        rc = gw_stream__event(s, gw_chunk_json(&c->req, c->id, s->created, &p, NULL, 0,
                                               &s->offset));
    json_decref(p.tool_calls);
    c->n_text = c->n_ids = c->n_exit_layers = 0;
    json_array_clear(c->logprobs);
    return rc;
}

/* Formats what the call has into SSE events (call locked). */
static int gw_stream__fill(gw_stream_t *s)
{
    gw_call_t *c = s->call;
    const gw_request_t *r = &c->req;
    if ((c->n_text || c->n_ids) && gw_stream__piece(s, 0))
        return -1;
    if (!c->done)
        return 0;
    if (c->ok && s->tools && gw_stream__piece(s, 1))
        return -1;
    s->ended = 1;
    if (!c->ok) {
        gw_error_t e;
        gw_error_set(&e, gw_error_from_river(c->code), NULL, "%s: %s", river_code_name(c->code),
                     c->message);
        gw_metrics_stream_error();
        log_warn("stream %s ended with %s", c->id, e.message);
        return gw_stream__event(s, gw_error_json(&e));
    }
    const char *finish = gw_finish_reason(c->finish);
    if (s->tools && gw_tools_stream_called(s->tools) && !strcmp(finish, "stop"))
        finish = "tool_calls";
    if (gw_stream__event(s, gw_chunk_json(r, c->id, s->created, NULL, finish, 0, &s->offset)))
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
        if (gw_http__gone(s->sock))
            return MHD_CONTENT_READER_END_WITH_ERROR;
        int rc = 0;
        double now = clock_now_s();
        if (s->call->req.api == GW_API_CHAT && !s->role_sent) {
            s->role_sent = 1;
            rc = gw_stream__event(s, gw_chunk_json(&s->call->req, s->call->id, s->created,
                                                   NULL, NULL, 1, &s->offset));
        } else {
            pthread_mutex_lock(&s->call->mu);
            rc = gw_stream__fill(s);
            pthread_mutex_unlock(&s->call->mu);
            if (!rc && s->n_out == 0) {
                if (now < s->keepalive_at) {
                    /* Nothing yet: no busy loop, the connection sleeps until the bridge,
                     * the client or the keep-alive tick wakes it. */
                    gw_http__park(s->sock, s->call, 1, s->keepalive_at);
                    return 0;
                }
                rc = gw_stream__add(s, ": keep-alive\n\n", 14);
            }
        }
        s->keepalive_at = now + GW_HTTP_KEEPALIVE_MS / 1000.0;
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

/* Lets go of a call and its slot of limits.max_concurrent: cancelled on its worker when it
 * has not ended (its client went away: seen by the watcher, by libmicrohttpd when it
 * closed the connection, or by a stream's failed write); account: a stream that ended
 * counts in the metrics here (a whole response did when it was built). */
static void gw_http__let_go(gw_ctx_t *ctx, gw_call_t *call, int account)
{
    gw_http__detach(call);
    pthread_mutex_lock(&call->mu);
    int done = call->done;
    pthread_mutex_unlock(&call->mu);
    if (!done) {
        log_info("client of %s went away: cancelling it", call->id);
        gw_bridge_cancel(ctx->bridge, call);
    } else if (account) {
        gw_http__account(call);
    }
    gw_call_release(&call);
    atomic_fetch_sub(&gw_http__in_flight, 1);
    gw_metrics_in_flight(-1);
}

/* The response is gone: the stream ended, or the client went away mid-stream, in which
 * case the request is cancelled on its worker. */
static void gw_stream__free(void *cls)
{
    gw_stream_t *s = cls;
    gw_http__let_go(s->ctx, s->call, 1);
    gw_tools_stream_destroy(&s->tools);
    free(s->out);
    free(s);
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
    o->logprobs = r->logprobs;
    o->top_logprobs = (uint32_t)r->top_logprobs;
    o->grammar = r->grammar;
}

static int gw_http__key_in(const gw_apikeys_t *keys, struct MHD_Connection *c);

/* Lets go of the request's call. */
static void gw_http__drop_call(gw_ctx_t *ctx, gw_conn_t *cc)
{
    gw_call_t *call = cc->call;
    if (!call)
        return;
    cc->call = NULL;
    gw_http__let_go(ctx, call, 0);
}

/* Parses, renders and submits a request, then suspends its connection until riverd
 * answers (gw_http__answer). */
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
    toolcall_format_t tool_format = gw_models_tool_format(ctx->models, req.model);
    if (gw_constrain(&req, tool_format, &err)) {
        gw_request_free(&req);
        return gw_http__error(conn, &err);
    }
    /* A tenant over its rates is refused before anything is spent on it. */
    if (cc->tenant && gw_tenant_admit(cc->tenant, &err)) {
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
    call->tool_format = tool_format;
    call->prompt = prompt;
    call->tenant = cc->tenant;
    call->on_event = gw_http__on_event;
    call->special = special;
    call->n_special = n_special;
    call->body_bytes = cc->n;
    call->raw_special = ctx->raw_keys && gw_http__key_in(ctx->raw_keys, conn);
    snprintf(call->id, sizeof call->id, "%s-%08lx%" PRIxFAST64,
             api == GW_API_CHAT ? "chatcmpl" : "cmpl", (unsigned long)(random() & 0xffffffffUL),
             atomic_fetch_add(&gw_http__serial, 1));
    gw_http__opts(call, ctx->cfg);
    cc->call = call;
    cc->created = (int64_t)time(NULL);
    if (gw_bridge_submit(ctx->bridge, call)) {
        gw_error_set(&err, GW_ERR_INTERNAL, NULL, "%s", river_err_detail());
        gw_http__drop_call(ctx, cc);
        return gw_http__error(conn, &err);
    }
    gw_http__park(cc->sock, call, 0, 0);
    return MHD_YES;
}

/* The connection of a waiting request was resumed: it answers when the call is ready
 * (the whole completion, or a stream's first token) and waits again otherwise. */
static enum MHD_Result gw_http__answer(gw_ctx_t *ctx, struct MHD_Connection *conn,
                                       gw_conn_t *cc)
{
    gw_call_t *call = cc->call;
    gw_error_t err;
    if (gw_http__gone(cc->sock)) {
        gw_http__drop_call(ctx, cc);
        return MHD_NO;
    }
    pthread_mutex_lock(&call->mu);
    if (!gw_http__ready(call, 0)) {
        pthread_mutex_unlock(&call->mu);
        gw_http__park(cc->sock, call, 0, 0);
        return MHD_YES;
    }
    int failed_early = call->done && !call->ok && (!call->req.stream || call->n_ids == 0);
    if (failed_early) {
        gw_error_set(&err, gw_error_from_river(call->code), NULL, "%s: %s",
                     river_code_name(call->code), call->message);
        pthread_mutex_unlock(&call->mu);
        gw_http__account(call);
        gw_http__drop_call(ctx, cc);
        return gw_http__error(conn, &err);
    }
    if (!call->req.stream) {
        gw_piece_t p = {call->text, call->n_text, call->ids, call->exit_layers, call->n_ids,
                        call->n_exit_layers, call->logprobs, NULL};
        const char *finish = gw_finish_reason(call->finish);
        char *content = NULL;
        if (gw_tools_apply(&call->req, call->tool_format)) {
            if (gw_tools_split(&call->req, call->tool_format, call->text, call->n_text,
                               &content, &p.text_len, &p.tool_calls)) {
                pthread_mutex_unlock(&call->mu);
                gw_error_set(&err, GW_ERR_INTERNAL, NULL, "tool calls: %s",
                             river_err_detail());
                gw_http__drop_call(ctx, cc);
                return gw_http__error(conn, &err);
            }
            p.text = content;
            if (p.tool_calls && !strcmp(finish, "stop"))
                finish = "tool_calls";
        }
        json_t *o = gw_response_json(&call->req, call->id, cc->created, &p, finish,
                                     &call->usage, call->prompt);
        json_decref(p.tool_calls);
        free(content);
        pthread_mutex_unlock(&call->mu);
        gw_http__account(call);
        gw_http__drop_call(ctx, cc);
        return gw_http__json(conn, 200, o);
    }
    pthread_mutex_unlock(&call->mu);
    gw_stream_t *s = calloc(1, sizeof *s);
    if (!s) {
        gw_http__drop_call(ctx, cc);
        return MHD_NO;
    }
    s->ctx = ctx;
    s->call = call;
    s->sock = cc->sock;
    if (gw_tools_apply(&call->req, call->tool_format) &&
        gw_tools_stream_new(&s->tools, &call->req, call->tool_format)) {
        free(s);
        gw_http__drop_call(ctx, cc);
        return MHD_NO;
    }
    s->created = cc->created;
    s->keepalive_at = clock_now_s() + GW_HTTP_KEEPALIVE_MS / 1000.0;
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384,
                                                               gw_stream__read, s,
                                                               gw_stream__free);
    if (!r) {
        gw_tools_stream_destroy(&s->tools);
        free(s);
        gw_http__drop_call(ctx, cc);
        return MHD_NO;
    }
    /* gw_stream__free lets go of the call and the in-flight count. */
    cc->call = NULL;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    return gw_http__queue(conn, 200, r);
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
    {"GET", "/metrics", gw_http__metrics, 1, 0},
};
#define GW_N_ROUTES (sizeof gw_http__routes / sizeof gw_http__routes[0])

/* The metrics listener (metrics.port) is the operator's: its routes need no key, and it
 * serves nothing else. */
static const gw_route_t gw_http__metrics_routes[] = {
    {"GET", "/metrics", gw_http__metrics, 0, 0},
    {"GET", "/health", gw_http__health, 0, 0},
};

static enum MHD_Result gw_http__metrics_access(void *cls, struct MHD_Connection *c,
                                               const char *url, const char *method,
                                               const char *version, const char *upload,
                                               size_t *upload_size, void **con_cls)
{
    static int first_seen;
    if (!*con_cls) {
        *con_cls = &first_seen; /* the headers are complete; a body, if any, is dropped */
        return MHD_YES;
    }
    if (*upload_size) {
        *upload_size = 0;
        return MHD_YES;
    }
    for (size_t i = 0; i < sizeof gw_http__metrics_routes / sizeof gw_http__metrics_routes[0];
         i++) {
        const gw_route_t *rt = &gw_http__metrics_routes[i];
        if (!strcmp(url, rt->path) && !strcmp(method, rt->method))
            return rt->fn(cls, c, NULL);
    }
    gw_error_t err;
    gw_error_set(&err, GW_ERR_NOT_FOUND, NULL, "the metrics listener serves GET /metrics and "
                 "GET /health only");
    return gw_http__error(c, &err);
}

/* The key of the request's `Authorization: Bearer KEY` header; NULL when it has none. */
static const char *gw_http__bearer(struct MHD_Connection *c)
{
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (!h || strncasecmp(h, "Bearer ", 7))
        return NULL;
    h += 7;
    while (*h == ' ')
        h++;
    return *h ? h : NULL;
}

/* Whether the request's key is one of keys. */
static int gw_http__key_in(const gw_apikeys_t *keys, struct MHD_Connection *c)
{
    const char *key = gw_http__bearer(c);
    return key && gw_apikeys_find(keys, key);
}

/* The tenant of the request's key (the one tenant, without a key file); NULL when the
 * key is missing or not allowed. */
static gw_tenant_t *gw_http__tenant(const gw_ctx_t *ctx, struct MHD_Connection *c)
{
    if (!ctx->keys)
        return ctx->anon;
    const char *key = gw_http__bearer(c);
    return key ? gw_apikeys_find(ctx->keys, key) : NULL;
}

/* The request's headers are complete and none of its body has been read: its route and
 * key are checked now, so that a request refused is never buffered. Only a keyless route
 * is answered without a key; an unknown path or a wrong method with no key is a 401, so
 * that a client without a key learns nothing of the routes. NULL: answered (*res). */
static const gw_route_t *gw_http__route(gw_ctx_t *ctx, struct MHD_Connection *c,
                                        const char *url, const char *method,
                                        gw_tenant_t **tenant, enum MHD_Result *res)
{
    gw_error_t err;
    const gw_route_t *path_match = NULL, *match = NULL;
    for (size_t i = 0; i < GW_N_ROUTES && !match; i++) {
        const gw_route_t *rt = &gw_http__routes[i];
        if (strcmp(url, rt->path))
            continue;
        path_match = rt;
        if (!strcmp(method, rt->method))
            match = rt;
    }
    if ((!match || match->needs_key) && !(*tenant = gw_http__tenant(ctx, c))) {
        gw_error_set(&err, GW_ERR_AUTH, NULL,
                     "Incorrect or missing API key: send Authorization: Bearer KEY");
        *res = gw_http__error(c, &err);
        return NULL;
    }
    if (match)
        return match;
    if (path_match)
        gw_error_set(&err, GW_ERR_METHOD, NULL, "%s needs %s, not %s", url, path_match->method,
                     method);
    else
        gw_error_set(&err, GW_ERR_NOT_FOUND, NULL, "no such path: %s %s", method, url);
    *res = gw_http__error(c, &err);
    return NULL;
}

static enum MHD_Result gw_http__access(void *cls, struct MHD_Connection *c, const char *url,
                                       const char *method, const char *version,
                                       const char *upload, size_t *upload_size, void **con_cls)
{
    gw_ctx_t *ctx = cls;
    gw_conn_t *cc = *con_cls;
    if (!cc) {
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
        gw_sock_t *sock = ci ? ci->socket_context : NULL;
        if (!sock)
            return MHD_NO;
        cc = calloc(1, sizeof *cc);
        if (!cc)
            return MHD_NO;
        *con_cls = cc;
        cc->sock = sock;
        /* The body deadline holds until the request is answered, also when it is refused
         * now: libmicrohttpd may go on reading a body nobody wants. */
        pthread_mutex_lock(&gw_http__mu);
        gw_http__move(sock, GW_SOCK_BODY,
                      clock_now_s() + (double)ctx->cfg->body_timeout_ms / 1000.0);
        pthread_mutex_unlock(&gw_http__mu);
        enum MHD_Result res = MHD_NO;
        cc->route = gw_http__route(ctx, c, url, method, &cc->tenant, &res);
        return cc->route ? MHD_YES : res;
    }
    if (cc->call)
        return gw_http__answer(ctx, c, cc);
    if (!cc->route)
        return MHD_NO;
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
    pthread_mutex_lock(&gw_http__mu);
    gw_http__move(cc->sock, GW_SOCK_RUN, 0);
    pthread_mutex_unlock(&gw_http__mu);
    if (cc->too_large) {
        gw_error_t err;
        gw_error_set(&err, GW_ERR_TOO_LARGE, NULL,
                     "the request body is over limits.max_body_bytes (%d bytes)",
                     ctx->cfg->max_body_bytes);
        return gw_http__error(c, &err);
    }
    return cc->route->fn(ctx, c, cc);
}

/* Whether the client of fd sent its FIN and nothing after it that waits unread. */
static int gw_http__peer_done(int fd)
{
    struct pollfd p = {.fd = fd, .events = POLLRDHUP};
    int unread = 0;
    return poll(&p, 1, 0) == 1 && (p.revents & (POLLRDHUP | POLLHUP)) &&
           ioctl(fd, FIONREAD, &unread) == 0 && unread == 0;
}

/* The request ended (answered, or its connection closed): the connection may stay idle for
 * timeouts.connection, counted from now. A client that half-closed its socket after its
 * request sends nothing more: its connection is closed now, since libmicrohttpd's
 * edge-triggered epoll may have read the request and the end in one go and never see the
 * end (it would wait for timeouts.connection). */
static void gw_http__completed(void *cls, struct MHD_Connection *c, void **con_cls,
                               enum MHD_RequestTerminationCode toe)
{
    gw_ctx_t *ctx = cls;
    gw_conn_t *cc = *con_cls;
    if (!cc)
        return;
    gw_http__drop_call(ctx, cc);
    pthread_mutex_lock(&gw_http__mu);
    gw_http__move(cc->sock, GW_SOCK_IDLE,
                  clock_now_s() + (double)ctx->cfg->connection_timeout_ms / 1000.0);
    if (toe == MHD_REQUEST_TERMINATED_COMPLETED_OK && gw_http__peer_done(cc->sock->fd) &&
        shutdown(cc->sock->fd, SHUT_RDWR))
        log_debug("shutdown: %s", strerror(errno));
    pthread_mutex_unlock(&gw_http__mu);
    free(cc->body);
    free(cc);
    *con_cls = NULL;
}

/* A request line arrived: on a connection idle since its previous request, the next
 * request's headers have timeouts.headers from now (the first request's count from the
 * accept). Returns the request's first context: none yet. */
static void *gw_http__request_line(void *cls, const char *uri, struct MHD_Connection *c)
{
    gw_ctx_t *ctx = cls;
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    gw_sock_t *sock = ci ? ci->socket_context : NULL;
    if (!sock)
        return NULL;
    pthread_mutex_lock(&gw_http__mu);
    if (sock->phase == GW_SOCK_IDLE)
        gw_http__move(sock, GW_SOCK_HEADERS,
                      clock_now_s() + (double)ctx->cfg->headers_timeout_ms / 1000.0);
    pthread_mutex_unlock(&gw_http__mu);
    return NULL;
}

static void gw_http__log(void *cls, const char *fmt, va_list ap)
{
    char line[1024];
    vsnprintf(line, sizeof line, fmt, ap);
    size_t n = strlen(line);
    while (n && line[n - 1] == '\n')
        line[--n] = '\0';
    gw_http__warn("http: %s", line);
}

/* Every connection is a descriptor: the soft limit is raised to fit them all, up to the
 * hard one. */
static void gw_http__raise_nofile(int max_connections)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl))
        return;
    rlim_t want = (rlim_t)max_connections + 256;
    if (rl.rlim_cur >= want)
        return;
    rl.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max >= want ? want : rl.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &rl) || rl.rlim_cur < want)
        log_warn("the open-file limit is %llu, under limits.max_connections (%d) + 256",
                 (unsigned long long)rl.rlim_cur, max_connections);
}

/* The address a listener binds; key: the configuration key of address, for the error. */
static int gw_http__sockaddr(struct sockaddr_in *sa, const char *address, int port,
                             const char *key)
{
    memset(sa, 0, sizeof *sa);
    sa->sin_family = AF_INET;
    sa->sin_port = htons((uint16_t)port);
    if (inet_pton(AF_INET, address, &sa->sin_addr) != 1)
        return river_err_set(RIVER_ECONFIG, "%s '%s' is not an IPv4 address", key, address);
    return 0;
}

/* The metrics listener: one thread, a handful of connections, no key. */
static int gw_http__start_metrics(gw_http_t *h)
{
    const gw_config_t *cfg = h->ctx->cfg;
    struct sockaddr_in sa;
    int rc = gw_http__sockaddr(&sa, cfg->metrics_address, cfg->metrics_port,
                               "metrics.address");
    if (rc)
        return rc;
    h->metrics = MHD_start_daemon(
        MHD_USE_EPOLL_INTERNAL_THREAD | MHD_USE_ERROR_LOG, (uint16_t)cfg->metrics_port, NULL,
        NULL, gw_http__metrics_access, h->ctx, MHD_OPTION_EXTERNAL_LOGGER, gw_http__log, h->ctx,
        MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa, MHD_OPTION_CONNECTION_LIMIT, 64u,
        MHD_OPTION_PER_IP_CONNECTION_LIMIT, 16u, MHD_OPTION_CONNECTION_TIMEOUT, 10u,
        MHD_OPTION_END);
    if (!h->metrics)
        return river_err_set(RIVER_ESYS, "cannot listen on %s:%d for metrics: %s",
                             cfg->metrics_address, cfg->metrics_port, strerror(errno));
    const union MHD_DaemonInfo *di =
        MHD_get_daemon_info(h->metrics, MHD_DAEMON_INFO_BIND_PORT);
    h->metrics_port = di ? di->port : cfg->metrics_port;
    return 0;
}

int gw_http_start(gw_http_t **out, gw_ctx_t *ctx)
{
    *out = NULL;
    gw_http_t *h = calloc(1, sizeof *h);
    if (!h)
        return river_err_set(RIVER_ENOMEM, "http");
    h->ctx = ctx;
    struct sockaddr_in sa;
    int rc = gw_http__sockaddr(&sa, ctx->cfg->listen_address, ctx->cfg->listen_port,
                               "listen.address");
    if (rc)
        goto fail_addr;
    gw_http__raise_nofile(ctx->cfg->max_connections);
    h->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (h->efd < 0) {
        rc = river_err_set(RIVER_ESYS, "eventfd: %s", strerror(errno));
        goto fail_addr;
    }
    if (pthread_create(&h->watcher, NULL, gw_http__watch, h)) {
        rc = river_err_set(RIVER_ESYS, "cannot start the http watcher thread");
        goto fail_thread;
    }
    unsigned timeout_s = (unsigned)((ctx->cfg->connection_timeout_ms + 999) / 1000);
    h->d = MHD_start_daemon(
        MHD_USE_EPOLL_INTERNAL_THREAD | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG,
        (uint16_t)ctx->cfg->listen_port, NULL, NULL, gw_http__access, ctx,
        MHD_OPTION_EXTERNAL_LOGGER, gw_http__log, ctx, MHD_OPTION_SOCK_ADDR,
        (struct sockaddr *)&sa, MHD_OPTION_THREAD_POOL_SIZE, (unsigned)GW_HTTP_THREADS,
        MHD_OPTION_CONNECTION_LIMIT, (unsigned)ctx->cfg->max_connections,
        MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)ctx->cfg->max_connections_per_address,
        MHD_OPTION_CONNECTION_TIMEOUT, timeout_s, MHD_OPTION_NOTIFY_CONNECTION,
        gw_http__notify, h, MHD_OPTION_NOTIFY_COMPLETED, gw_http__completed, ctx,
        MHD_OPTION_URI_LOG_CALLBACK, gw_http__request_line, ctx, MHD_OPTION_END);
    if (!h->d) {
        rc = river_err_set(RIVER_ESYS, "cannot listen on %s:%d: %s", ctx->cfg->listen_address,
                           ctx->cfg->listen_port, strerror(errno));
        goto fail_daemon;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
    h->port = di ? di->port : ctx->cfg->listen_port;
    h->metrics_port = -1;
    if (ctx->cfg->metrics_port >= 0) {
        rc = gw_http__start_metrics(h);
        if (rc)
            goto fail_metrics;
    }
    *out = h;
    return 0;
fail_metrics:
    MHD_stop_daemon(h->d);
fail_daemon:
    pthread_mutex_lock(&gw_http__mu);
    h->stop = 1;
    gw_http__wake_watcher(h);
    pthread_mutex_unlock(&gw_http__mu);
    pthread_join(h->watcher, NULL);
fail_thread:
    close(h->efd);
fail_addr:
    free(h);
    return rc;
}

int gw_http_port(const gw_http_t *h)
{
    return h->port;
}

int gw_http_metrics_port(const gw_http_t *h)
{
    return h->metrics_port;
}

void gw_http_stop(gw_http_t **ph)
{
    gw_http_t *h = *ph;
    if (!h)
        return;
    *ph = NULL;
    if (h->metrics)
        MHD_stop_daemon(h->metrics);
    MHD_stop_daemon(h->d);
    pthread_mutex_lock(&gw_http__mu);
    h->stop = 1;
    gw_http__wake_watcher(h);
    pthread_mutex_unlock(&gw_http__mu);
    pthread_join(h->watcher, NULL);
    close(h->efd);
    free(h);
}
