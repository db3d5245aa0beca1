/* Metrics: counters kept by the rest of riverd, written in the Prometheus text format,
 * and served over HTTP by libmicrohttpd from the same poll loop (MHD_USE_EPOLL without a
 * thread of its own: its epoll descriptor sits in riverd's zmq_poll), so a scrape reads
 * the counters without locks and /health answering proves the loop is alive. */
#include <arpa/inet.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <microhttpd.h>

#include "common/clock.h"
#include "common/err.h"
#include "daemon/riverd.h"

/* Names of the outcome label, by metrics index: Final reasons, then Error codes. */
static const char *const metrics__outcomes[METRICS_OUTCOMES] = {
    [RIVER__CLIENT__FINAL__REASON__UNSPECIFIED] = "finished",
    [RIVER__CLIENT__FINAL__REASON__LENGTH] = "length",
    [RIVER__CLIENT__FINAL__REASON__EOS] = "eos",
    [RIVER__CLIENT__FINAL__REASON__STOP] = "stop",
    [RIVER__CLIENT__FINAL__REASON__CONTEXT] = "context",
    [RIVER__CLIENT__FINAL__REASON__CANCELLED] = "cancelled",
    [METRICS_OUTCOME_ERROR + RIVER__CLIENT__ERROR__CODE__OK] = "error",
    [METRICS_OUTCOME_ERROR + RIVER__CLIENT__ERROR__CODE__INVALID_ARGUMENT] = "invalid_argument",
    [METRICS_OUTCOME_ERROR + RIVER__CLIENT__ERROR__CODE__RESOURCE_EXHAUSTED] =
        "resource_exhausted",
    [METRICS_OUTCOME_ERROR + RIVER__CLIENT__ERROR__CODE__DEADLINE_EXCEEDED] =
        "deadline_exceeded",
    [METRICS_OUTCOME_ERROR + RIVER__CLIENT__ERROR__CODE__CANCELLED] = "aborted",
    [METRICS_OUTCOME_ERROR + RIVER__CLIENT__ERROR__CODE__UNAVAILABLE] = "unavailable",
    [METRICS_OUTCOME_ERROR + RIVER__CLIENT__ERROR__CODE__INTERNAL] = "internal",
    [METRICS_OUTCOME_ERROR + RIVER__CLIENT__ERROR__CODE__UNAUTHENTICATED] = "unauthenticated",
};

/* Upper bounds of the time-to-first-token buckets, seconds. */
static const double metrics__ttft_le[12] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                            0.5,   1,    2.5,   5,    10,  30};

void metrics_on_final(riverd_t *rd, River__Client__Final__Reason reason)
{
    unsigned i = (unsigned)reason < METRICS_OUTCOME_ERROR ? (unsigned)reason : 0;
    rd->metrics.outcomes[i]++;
}

void metrics_on_exit_stats(riverd_t *rd, const River__Client__ExitStats *xs)
{
    if (!xs)
        return;
    rd->metrics.spec_drafts += xs->drafts;
    rd->metrics.spec_draft_tokens += xs->drafted_tokens;
    rd->metrics.spec_accepted_tokens += xs->accepted_tokens;
}

void metrics_on_error(riverd_t *rd, River__Client__Error__Code code)
{
    unsigned c = (unsigned)code < METRICS_OUTCOMES - METRICS_OUTCOME_ERROR
                     ? (unsigned)code
                     : RIVER__CLIENT__ERROR__CODE__INTERNAL;
    rd->metrics.outcomes[METRICS_OUTCOME_ERROR + c]++;
    rd->metrics.requests_failed++;
}

void metrics_on_tokens(riverd_t *rd, size_t n, const int32_t *exit_layers, size_t n_exit,
                       int64_t now)
{
    metrics_t *m = &rd->metrics;
    m->tokens_total += n;
    int64_t sec = now / 1000;
    size_t b = (size_t)(sec % RIVERD_RATE_WINDOW);
    if (m->rate_second[b] != sec) {
        m->rate_second[b] = sec;
        m->rate[b] = 0;
    }
    m->rate[b] += n;
    for (size_t i = 0; i < n_exit; i++) {
        int32_t l = exit_layers[i] < 0 ? 0 : exit_layers[i];
        m->exit_hist[l < RIVERD_EXIT_HIST ? l : RIVERD_EXIT_HIST - 1]++;
        m->exit_sum += (uint64_t)l;
        m->exit_count++;
    }
}

void metrics_on_first_token(riverd_t *rd, double seconds)
{
    metrics_t *m = &rd->metrics;
    for (size_t i = 0; i < sizeof metrics__ttft_le / sizeof metrics__ttft_le[0]; i++)
        if (seconds <= metrics__ttft_le[i])
            m->ttft_buckets[i]++;
    m->ttft_sum += seconds;
    m->ttft_count++;
}

double metrics_tokens_per_s(riverd_t *rd, int64_t now)
{
    /* The last complete seconds of the window; the current one is still filling. */
    int64_t sec = now / 1000;
    uint64_t n = 0;
    for (size_t b = 0; b < RIVERD_RATE_WINDOW; b++) {
        int64_t s = rd->metrics.rate_second[b];
        if (s < sec && s >= sec - (RIVERD_RATE_WINDOW - 1))
            n += rd->metrics.rate[b];
    }
    return (double)n / (RIVERD_RATE_WINDOW - 1);
}

/* ---- Text exposition ---- */

typedef struct metrics_buf {
    char *s;
    size_t len, cap;
    bool failed;
} metrics_buf_t;

static void metrics__printf(metrics_buf_t *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void metrics__printf(metrics_buf_t *b, const char *fmt, ...)
{
    if (b->failed)
        return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->s + b->len, b->cap - b->len, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->failed = true;
            return;
        }
        if ((size_t)n < b->cap - b->len) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = b->cap * 2 + (size_t)n;
        char *s = realloc(b->s, cap);
        if (!s) {
            b->failed = true;
            return;
        }
        b->s = s;
        b->cap = cap;
    }
}

/* A label value as the format wants it: backslash, quote and newline escaped. */
static const char *metrics__label(const char *v, char *out, size_t cap)
{
    size_t o = 0;
    for (; *v && o + 3 < cap; v++) {
        if (*v == '\\' || *v == '"')
            out[o++] = '\\', out[o++] = *v;
        else if (*v == '\n')
            out[o++] = '\\', out[o++] = 'n';
        else
            out[o++] = *v;
    }
    out[o] = '\0';
    return out;
}

static void metrics__head(metrics_buf_t *b, const char *name, const char *type,
                          const char *help)
{
    metrics__printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

char *metrics_render(riverd_t *rd, size_t *len)
{
    metrics_buf_t b = {.cap = 8192};
    b.s = malloc(b.cap);
    if (!b.s)
        return NULL;
    b.s[0] = '\0';
    const metrics_t *m = &rd->metrics;
    int64_t now = clock_now_ms();
    char lab[256];

    metrics__head(&b, "river_requests_total", "counter",
                  "Requests ended, by outcome (a Final reason or an Error code).");
    for (int i = 0; i < METRICS_OUTCOMES; i++)
        if (metrics__outcomes[i])
            metrics__printf(&b, "river_requests_total{outcome=\"%s\"} %" PRIu64 "\n",
                            metrics__outcomes[i], m->outcomes[i]);
    metrics__head(&b, "river_spec_decode_num_drafts_total", "counter",
                  "Lossless mode: verify passes that checked at least one draft token.");
    metrics__printf(&b, "river_spec_decode_num_drafts_total %" PRIu64 "\n", m->spec_drafts);
    metrics__head(&b, "river_spec_decode_num_draft_tokens_total", "counter",
                  "Lossless mode: draft tokens the backbone verified.");
    metrics__printf(&b, "river_spec_decode_num_draft_tokens_total %" PRIu64 "\n",
                    m->spec_draft_tokens);
    metrics__head(&b, "river_spec_decode_num_accepted_tokens_total", "counter",
                  "Lossless mode: draft tokens the backbone accepted.");
    metrics__printf(&b, "river_spec_decode_num_accepted_tokens_total %" PRIu64 "\n",
                    m->spec_accepted_tokens);
    metrics__head(&b, "river_requests_redispatched_total", "counter",
                  "Requests moved to another worker after theirs died or gave them up.");
    metrics__printf(&b, "river_requests_redispatched_total %" PRIu64 "\n", m->redispatched);
    metrics__head(&b, "river_queue_length", "gauge", "Requests waiting for a worker.");
    metrics__printf(&b, "river_queue_length %d\n", rd->n_queued);
    metrics__head(&b, "river_queue_capacity", "gauge", "Most requests that may wait.");
    metrics__printf(&b, "river_queue_capacity %d\n", rd->cfg.queue_length);
    metrics__head(&b, "river_requests_running", "gauge", "Requests on workers.");
    metrics__printf(&b, "river_requests_running %d\n", rd->n_running);

    int ready, draining, dead;
    workers_count(rd, &ready, &draining, &dead, NULL);
    metrics__head(&b, "river_workers", "gauge", "Workers by state.");
    metrics__printf(&b, "river_workers{state=\"starting\"} %d\n",
                    supervise_starting(rd, NULL, 0));
    metrics__printf(&b, "river_workers{state=\"ready\"} %d\n", ready);
    metrics__printf(&b, "river_workers{state=\"draining\"} %d\n", draining);
    metrics__printf(&b, "river_workers{state=\"dead\"} %d\n", dead);
    metrics__head(&b, "river_worker_deaths_total", "counter",
                  "Workers declared dead (missed heartbeats, lost connection, exited).");
    metrics__printf(&b, "river_worker_deaths_total %" PRIu64 "\n", m->worker_deaths);
    metrics__head(&b, "river_worker_stale_messages_total", "counter",
                  "Messages of a worker declared dead, or of a connection riverd no longer "
                  "knows (late tokens after a partition): dropped, answered with Reconnect.");
    metrics__printf(&b, "river_worker_stale_messages_total %" PRIu64 "\n", m->stale_messages);
    metrics__head(&b, "river_kv_pages_free", "gauge",
                  "Free KV cache pages over live workers, as their heartbeats say.");
    metrics__printf(&b, "river_kv_pages_free %" PRIu64 "\n", workers_kv_pages_free(rd));
    metrics__head(&b, "river_worker_kv_pages_free", "gauge", "Free KV cache pages by worker.");
    for (int i = 0; i < rd->n_table; i++)
        if (rd->table[i]->state != WORKER_DEAD)
            metrics__printf(&b, "river_worker_kv_pages_free{worker=\"%s\"} %u\n",
                            metrics__label(rd->table[i]->id, lab, sizeof lab),
                            rd->table[i]->kv_pages_free);
    metrics__head(&b, "river_worker_requests_running", "gauge",
                  "Requests riverd has on each worker.");
    for (int i = 0; i < rd->n_table; i++)
        if (rd->table[i]->state != WORKER_DEAD)
            metrics__printf(&b, "river_worker_requests_running{worker=\"%s\"} %d\n",
                            metrics__label(rd->table[i]->id, lab, sizeof lab),
                            rd->table[i]->assigned);

    metrics__head(&b, "river_worker_tokens_total", "counter",
                  "Tokens each worker generated for clients (while it is listed).");
    for (int i = 0; i < rd->n_table; i++)
        metrics__printf(&b, "river_worker_tokens_total{worker=\"%s\"} %" PRIu64 "\n",
                        metrics__label(rd->table[i]->id, lab, sizeof lab), rd->table[i]->tokens);

    metrics__head(&b, "river_prefix_cache_hit_tokens_total", "counter",
                  "Prompt tokens whose K/V a worker's prefix cache held (Final.usage."
                  "cached_tokens).");
    metrics__printf(&b, "river_prefix_cache_hit_tokens_total %" PRIu64 "\n",
                    m->prefix_hit_tokens);
    metrics__head(&b, "river_prefix_cache_query_tokens_total", "counter",
                  "Prompt tokens of finished requests, looked up in the prefix caches.");
    metrics__printf(&b, "river_prefix_cache_query_tokens_total %" PRIu64 "\n",
                    m->prefix_query_tokens);
    uint64_t pc_pages = 0;
    for (int i = 0; i < rd->n_table; i++)
        if (rd->table[i]->state != WORKER_DEAD)
            pc_pages += rd->table[i]->prefix_cache_pages;
    metrics__head(&b, "river_prefix_cache_pages", "gauge",
                  "KV pages the workers' prefix caches hold (from their heartbeats).");
    metrics__printf(&b, "river_prefix_cache_pages %" PRIu64 "\n", pc_pages);
    metrics__head(&b, "river_tokens_generated_total", "counter",
                  "Tokens streamed to clients.");
    metrics__printf(&b, "river_tokens_generated_total %" PRIu64 "\n", m->tokens_total);
    metrics__head(&b, "river_tokens_per_second", "gauge",
                  "Tokens streamed per second over the last complete seconds.");
    metrics__printf(&b, "river_tokens_per_second %.3f\n", metrics_tokens_per_s(rd, now));

    metrics__head(&b, "river_exit_layer", "histogram",
                  "Backbone layers each token ran before it exited (n_layers: no exit).");
    uint64_t cum = 0;
    int top = 0;
    for (int l = 0; l < RIVERD_EXIT_HIST; l++)
        if (m->exit_hist[l])
            top = l;
    for (int l = 0; l <= top; l++) {
        cum += m->exit_hist[l];
        metrics__printf(&b, "river_exit_layer_bucket{le=\"%d\"} %" PRIu64 "\n", l, cum);
    }
    metrics__printf(&b, "river_exit_layer_bucket{le=\"+Inf\"} %" PRIu64 "\n", m->exit_count);
    metrics__printf(&b, "river_exit_layer_sum %" PRIu64 "\n", m->exit_sum);
    metrics__printf(&b, "river_exit_layer_count %" PRIu64 "\n", m->exit_count);

    metrics__head(&b, "river_time_to_first_token_seconds", "histogram",
                  "From riverd receiving a request to its first token.");
    for (size_t i = 0; i < sizeof metrics__ttft_le / sizeof metrics__ttft_le[0]; i++)
        metrics__printf(&b, "river_time_to_first_token_seconds_bucket{le=\"%g\"} %" PRIu64 "\n",
                        metrics__ttft_le[i], m->ttft_buckets[i]);
    metrics__printf(&b, "river_time_to_first_token_seconds_bucket{le=\"+Inf\"} %" PRIu64 "\n",
                    m->ttft_count);
    metrics__printf(&b, "river_time_to_first_token_seconds_sum %.6f\n", m->ttft_sum);
    metrics__printf(&b, "river_time_to_first_token_seconds_count %" PRIu64 "\n",
                    m->ttft_count);

    metrics__head(&b, "river_bad_frames_total", "counter",
                  "Frames refused: malformed, oversize or of an unknown kind.");
    metrics__printf(&b, "river_bad_frames_total %" PRIu64 "\n", m->bad_frames);
    metrics__head(&b, "river_auth_refused_total", "counter",
                  "Connections and messages refused by authentication (auth.*): a key that "
                  "is not allowed, no CURVE, or a key of another role.");
    static const struct {
        int role;
        const char *endpoint;
    } auth_endpoints[] = {
        {AUTH_ROLE_CLIENT, "clients"}, {AUTH_ROLE_WORKER, "workers"}, {AUTH_ROLE_ADMIN, "admin"}};
    for (size_t i = 0; i < sizeof auth_endpoints / sizeof auth_endpoints[0]; i++)
        metrics__printf(&b, "river_auth_refused_total{endpoint=\"%s\"} %" PRIu64 "\n",
                        auth_endpoints[i].endpoint,
                        auth_refused(rd->auth, auth_endpoints[i].role));
    metrics__head(&b, "river_uptime_seconds", "gauge", "Seconds since riverd started.");
    metrics__printf(&b, "river_uptime_seconds %" PRId64 "\n", (now - rd->started_ms) / 1000);
    if (b.failed) {
        free(b.s);
        return NULL;
    }
    *len = b.len;
    return b.s;
}

/* ---- HTTP ---- */

struct http {
    riverd_t *rd;
    struct MHD_Daemon *d;
    int fd;
};

static enum MHD_Result http__reply(struct MHD_Connection *c, unsigned status, char *body,
                                   size_t len, const char *type)
{
    struct MHD_Response *r =
        MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", type);
    enum MHD_Result rc = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return rc;
}

static enum MHD_Result http__text(struct MHD_Connection *c, unsigned status, const char *s)
{
    char *body = strdup(s);
    return body ? http__reply(c, status, body, strlen(body), "text/plain; charset=utf-8")
                : MHD_NO;
}

static enum MHD_Result http__serve_metrics(http_t *h, struct MHD_Connection *c)
{
    size_t len = 0;
    char *text = metrics_render(h->rd, &len);
    if (!text)
        return http__text(c, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory\n");
    return http__reply(c, MHD_HTTP_OK, text, len, "text/plain; version=0.0.4; charset=utf-8");
}

/* Answering at all means the poll loop runs. */
static enum MHD_Result http__serve_health(http_t *h, struct MHD_Connection *c)
{
    return http__text(c, MHD_HTTP_OK, "ok\n");
}

/* Ready: some worker takes requests and riverd is not shutting down. */
static enum MHD_Result http__serve_ready(http_t *h, struct MHD_Connection *c)
{
    int n;
    workers_count(h->rd, NULL, NULL, NULL, &n);
    if (h->rd->draining)
        return http__text(c, MHD_HTTP_SERVICE_UNAVAILABLE, "draining\n");
    if (n == 0)
        return http__text(c, MHD_HTTP_SERVICE_UNAVAILABLE, "no worker ready\n");
    return http__text(c, MHD_HTTP_OK, "ready\n");
}

static const struct {
    const char *path;
    enum MHD_Result (*fn)(http_t *h, struct MHD_Connection *c);
} http__routes[] = {
    {"/metrics", http__serve_metrics},
    {"/health", http__serve_health},
    {"/ready", http__serve_ready},
};

static enum MHD_Result http__handle(void *cls, struct MHD_Connection *c, const char *url,
                                    const char *method, const char *version,
                                    const char *upload, size_t *upload_size, void **state)
{
    http_t *h = cls;
    if (strcmp(method, "GET") && strcmp(method, "HEAD"))
        return http__text(c, MHD_HTTP_METHOD_NOT_ALLOWED, "GET only\n");
    for (size_t i = 0; i < sizeof http__routes / sizeof http__routes[0]; i++)
        if (!strcmp(url, http__routes[i].path))
            return http__routes[i].fn(h, c);
    return http__text(c, MHD_HTTP_NOT_FOUND, "not found: try /metrics, /health or /ready\n");
}

int http_start(riverd_t *rd, http_t **out)
{
    *out = NULL;
    if (rd->cfg.metrics_port == 0)
        return 0;
    http_t *h = calloc(1, sizeof *h);
    if (!h)
        return river_err_set(RIVER_ENOMEM, "http server");
    h->rd = rd;
    h->fd = -1;
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)rd->cfg.metrics_port);
    if (inet_pton(AF_INET, rd->cfg.metrics_address, &sa.sin_addr) != 1) {
        free(h);
        return river_err_set(RIVER_ECONFIG, "endpoints.metrics_address '%s' is not an IPv4 "
                             "address", rd->cfg.metrics_address);
    }
    h->d = MHD_start_daemon(MHD_USE_EPOLL, (uint16_t)rd->cfg.metrics_port, NULL, NULL,
                            http__handle, h, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa,
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)10,
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)64, MHD_OPTION_END);
    if (!h->d) {
        free(h);
        return river_err_set(RIVER_ESYS, "cannot serve metrics on %s:%d",
                             rd->cfg.metrics_address, rd->cfg.metrics_port);
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_EPOLL_FD);
    if (!info) {
        MHD_stop_daemon(h->d);
        free(h);
        return river_err_set(RIVER_ESYS, "libmicrohttpd has no epoll descriptor");
    }
    h->fd = info->epoll_fd;
    log_info("metrics on http://%s:%d/metrics", rd->cfg.metrics_address,
             rd->cfg.metrics_port);
    *out = h;
    return 0;
}

void http_stop(http_t **ph)
{
    http_t *h = ph ? *ph : NULL;
    if (!h)
        return;
    MHD_stop_daemon(h->d);
    free(h);
    *ph = NULL;
}

int http_fd(http_t *h)
{
    return h ? h->fd : -1;
}

void http_run(http_t *h)
{
    if (h && MHD_run(h->d) != MHD_YES)
        log_warn("http: MHD_run failed");
}

int64_t http_timeout_ms(http_t *h)
{
    MHD_UNSIGNED_LONG_LONG t;
    if (!h || MHD_get_timeout(h->d, &t) != MHD_YES)
        return -1;
    return (int64_t)t;
}
