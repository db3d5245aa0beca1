/* The river-gateway suites' fixture; see gwenv.h. */
#include <errno.h>
#include <limits.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <arpa/inet.h>

#include "common/clock.h"
#include "common/err.h"
#include "tests/gwenv.h"
#include "tests/proc.h"
#include "tests/testutil.h"

/* ---- Processes ---- */


const char *gt_path(const gt_env_t *e, const char *rel)
{
    static char out[8][PATH_MAX];
    static int k;
    char *p = out[k++ % 8];
    snprintf(p, PATH_MAX, "%s/%s", e->c.dir, rel);
    return p;
}

/* Keys: riverd's pair in keys/, the worker's, the gateway's and an admin's in own/, their
 * public halves where riverd looks for them. */
void gt_keys(gt_env_t *e)
{
    cluster_keygen(gt_path(e, "keys"), "riverd", NULL);
    cluster_keygen(gt_path(e, "own"), "w1", NULL);
    cluster_keygen(gt_path(e, "own"), "gw", NULL);
    cluster_keygen(gt_path(e, "own"), "a1", NULL);
    const char *dirs[] = {"keys/clients", "keys/workers", "keys/admin"};
    for (int i = 0; i < 3; i++)
        ck_assert(mkdir(gt_path(e, dirs[i]), 0755) == 0 || errno == EEXIST);
    cluster_copy(gt_path(e, "own/gw.key"), gt_path(e, "keys/clients/gw.key"));
    cluster_copy(gt_path(e, "own/w1.key"), gt_path(e, "keys/workers/w1.key"));
    cluster_copy(gt_path(e, "own/a1.key"), gt_path(e, "keys/admin/a1.key"));
    /* The API key file: the hash `river-gateway --hash-key` prints, then the tenants'
     * keys, each with its tenant's name. */
    static const char *const keys[][2] = {{GT_KEY, ""},
                                          {GT_KEY_A, " tenant-a"},
                                          {GT_KEY_B, " tenant-b"},
                                          {GT_KEY_C, " tenant-c requests_per_minute=100"}};
    char file[1024] = "# test key\n";
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        char *argv[] = {(char *)test_bin("river-gateway"), "--hash-key", (char *)keys[i][0],
                        NULL};
        char *out;
        ck_assert_int_eq(test_capture(argv, NULL, 0, &out), 0);
        ck_assert_uint_eq(strlen(out), 65);
        out[64] = '\0';
        size_t n = strlen(file);
        snprintf(file + n, sizeof file - n, "%s%s\n", out, keys[i][1]);
        free(out);
    }
    test_write(gt_path(e, "api-keys.txt"), file);
}

river_keys_t gt_admin_keys(const gt_env_t *e)
{
    return e->admin_keys;
}

/* The worker, or -1 when riverd does not answer; fills its KV page counts. */
int gt_worker_state(const gt_env_t *e, char *state, size_t cap, uint32_t *free_pages,
                    uint32_t *total_pages)
{
    river_keys_t k = gt_admin_keys(e);
    river_admin_t *a;
    ck_assert_int_eq(river_admin_new_secure(&a, e->c.admin, 1000, &k), 0);
    river_worker_info_t *w;
    size_t n;
    int rc = river_admin_workers(a, &w, &n);
    river_admin_destroy(&a);
    if (rc < 0)
        return -1;
    snprintf(state, cap, "%s", n ? w[0].state : "none");
    if (n && free_pages) {
        *free_pages = w[0].kv_pages_free;
        *total_pages = w[0].kv_pages_total;
    }
    free(w);
    return (int)n;
}

/* A gateway on riverd with `extra` YAML at the end (timeouts...). */
void gt_start_gateway(gt_env_t *e, int i, const char *model, const char *extra)
{
    char y[4096], name[64];
    snprintf(y, sizeof y,
             "listen:\n  port: 0\n"
             "riverd:\n  endpoint: \"%s\"\n  secret_key: own/gw.key_secret\n"
             "  server_key: keys/riverd.key\n"
             "models:\n  - name: stories\n    dir: \"%s\"\n    chat_template: \"%s\"\n"
             "api_keys: api-keys.txt\nlog_level: debug\n%s",
             e->c.clients, test_abs_path(model),
             e->template_path ? e->template_path : test_abs_path(GT_TEMPLATE), extra);
    snprintf(name, sizeof name, "gateway%d.yaml", i);
    test_write(gt_path(e, name), y);
    char logp[320];
    snprintf(logp, sizeof logp, "%s/gateway%d.log", e->c.dir, i);
    memcpy(e->gw_log[i], logp, sizeof logp);
    char *argv[] = {(char *)test_bin("river-gateway"), "--config", (char *)gt_path(e, name),
                    NULL};
    e->gw[i] = test_spawn(argv, e->gw_log[i], NULL);
    ck_assert_msg(test_log_has(e->gw_log[i], "listening on http://127.0.0.1:", 15000),
                  "the gateway did not start; see %s", e->gw_log[i]);
    size_t len;
    char *log = test_read_file(e->gw_log[i], &len);
    const char *p = strstr(log, "listening on http://127.0.0.1:");
    e->port[i] = atoi(p + strlen("listening on http://127.0.0.1:"));
    free(log);
    ck_assert_int_gt(e->port[i], 0);
}

/* riverd, a worker on `model` (none when NULL) and gateway 0; liveness 0: riverd's. */
void gt_start_with(gt_env_t *e, const char *model, const char *worker_extra,
                   const char *gw_extra, int liveness)
{
    memset(e, 0, sizeof *e);
    cluster_opts_t o = {.liveness = liveness, .admin_ms = 1000,
                        .extra = "limits:\n  max_requests_per_client: 256\n"};
    cluster_init(&e->c, &o);
    snprintf(e->admin_secret, sizeof e->admin_secret, "%s", gt_path(e, "own/a1.key_secret"));
    snprintf(e->server_key, sizeof e->server_key, "%s", gt_path(e, "keys/riverd.key"));
    e->admin_keys = (river_keys_t){.secret_key = e->admin_secret, .server_key = e->server_key};
    e->c.keys = &e->admin_keys;
    gt_keys(e);
    cluster_write_config(&e->c, &o);
    cluster_riverd_start(&e->c, NULL);
    if (model) {
        char y[2048];
        snprintf(y, sizeof y, "%s"
                 "auth:\n  secret_key: own/w1.key_secret\n  server_key: keys/riverd.key\n",
                 worker_extra ? worker_extra : "");
        cluster_worker_opts_t w = {.model = model, .yaml = y, .cfg_name = "worker",
                                   .log_name = "worker"};
        cluster_worker_start(&e->c, "w1", &w);
        char state[32] = "";
        double until = clock_now_s() + 30;
        while (clock_now_s() < until) {
            if (gt_worker_state(e, state, sizeof state, NULL, NULL) > 0 &&
                !strcmp(state, "ready"))
                break;
            test_sleep_ms(100);
        }
        ck_assert_msg(!strcmp(state, "ready"), "worker not ready (%s); see %s", state,
                      gt_path(e, "worker.log"));
    }
    gt_start_gateway(e, 0, model ? model : GT_STORIES, gw_extra ? gw_extra : "");
}

/* riverd waits 20 heartbeats (4 s) before it calls a silent worker dead: a busy shared
 * machine stalls processes for a second or more. */
void gt_start(gt_env_t *e, const char *model, const char *worker_extra,
              const char *gw_extra)
{
    gt_start_with(e, model, worker_extra, gw_extra, 20);
}

/* Stops everything; the gateway must exit 0 on SIGTERM (it stayed up the whole test). */
void gt_stop(gt_env_t *e)
{
    for (int i = 0; i < 2; i++) {
        if (e->gw[i] <= 0)
            continue;
        kill(e->gw[i], SIGTERM);
        int st = 0;
        int ended = test_wait_exit(e->gw[i], 10000, &st);
        if (!ended)
            test_kill(&e->gw[i], SIGKILL);
        ck_assert_msg(ended && WIFEXITED(st) && WEXITSTATUS(st) == 0,
                      "gateway %d: status %d; see %s", i, st, e->gw_log[i]);
        e->gw[i] = 0;
    }
    cluster_kill(&e->c, SIGTERM);
}

/* ---- HTTP ---- */


void gt_resp_free(gt_resp_t *r)
{
    free(r->head);
    free(r->body);
    memset(r, 0, sizeof *r);
}

int gt_connect_from(int port, uint32_t src)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_msg(fd >= 0, "socket: %s", strerror(errno));
    if (src) {
        struct sockaddr_in me = {.sin_family = AF_INET};
        me.sin_addr.s_addr = htonl(src);
        ck_assert_msg(bind(fd, (struct sockaddr *)&me, sizeof me) == 0, "bind: %s",
                      strerror(errno));
    }
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ck_assert_msg(connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0, "connect: %s",
                  strerror(errno));
    return fd;
}

int gt_connect(int port)
{
    int fd = gt_connect_from(port, 0);
    struct timeval tv = {.tv_sec = 60};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return fd;
}

/* Sends one HTTP/1.0 request (so the response ends when the connection does); key NULL:
 * no Authorization header. Returns the socket, response unread. */
int gt_send(int port, const char *method, const char *path, const char *key,
            const char *body, size_t len)
{
    int fd = gt_connect(port);
    char head[1024];
    int n = snprintf(head, sizeof head,
                     "%s %s HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     "Content-Length: %zu\r\n%s%s%s\r\n",
                     method, path, len, key ? "Authorization: Bearer " : "", key ? key : "",
                     key ? "\r\n" : "");
    ck_assert(send(fd, head, (size_t)n, MSG_NOSIGNAL) == n);
    size_t off = 0;
    while (off < len) {
        ssize_t w = send(fd, body + off, len - off, MSG_NOSIGNAL);
        if (w <= 0)
            break; /* the server may answer (413) and close before taking it all */
        off += (size_t)w;
    }
    return fd;
}

void gt_read_all(int fd, gt_resp_t *r)
{
    size_t cap = 65536, n = 0;
    char *buf = malloc(cap);
    ck_assert_ptr_nonnull(buf);
    for (;;) {
        if (n + 4096 > cap) {
            cap *= 2;
            buf = realloc(buf, cap);
            ck_assert_ptr_nonnull(buf);
        }
        ssize_t got = recv(fd, buf + n, cap - n - 1, 0);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            break;
        n += (size_t)got;
    }
    close(fd);
    buf[n] = '\0';
    memset(r, 0, sizeof *r);
    char *sep = strstr(buf, "\r\n\r\n");
    ck_assert_msg(sep, "no HTTP header in %zu bytes: %.200s", n, buf);
    *sep = '\0';
    ck_assert_msg(sscanf(buf, "HTTP/1.%*d %d", &r->status) == 1, "status line: %.100s", buf);
    r->head = strdup(buf);
    r->len = n - (size_t)(sep + 4 - buf);
    r->body = malloc(r->len + 1);
    memcpy(r->body, sep + 4, r->len + 1);
    free(buf);
}

void gt_http(int port, const char *method, const char *path, const char *key,
             const char *body, gt_resp_t *r)
{
    int fd = gt_send(port, method, path, key, body ? body : "", body ? strlen(body) : 0);
    gt_read_all(fd, r);
}

json_t *gt_json(const gt_resp_t *r)
{
    json_error_t je;
    json_t *o = json_loads(r->body, 0, &je);
    ck_assert_msg(o, "status %d, not JSON (%s): %.300s", r->status, je.text, r->body);
    return o;
}

json_t *gt_post_key(int port, const char *key, const char *path, const char *body,
                    int *status)
{
    gt_resp_t r;
    gt_http(port, "POST", path, key, body, &r);
    *status = r.status;
    json_t *o = gt_json(&r);
    gt_resp_free(&r);
    return o;
}

json_t *gt_post(int port, const char *path, const char *body, int *status)
{
    return gt_post_key(port, GT_KEY, path, body, status);
}

/* Checks SSE framing: events `data: ...` separated by one blank line, SSE comments
 * allowed, `data: [DONE]` last (when done_last) and nothing after it. Returns the JSON
 * events in order. */
json_t *gt_sse(const char *body, int done_last)
{
    json_t *events = json_array();
    const char *p = body;
    int saw_done = 0;
    while (*p) {
        const char *end = strstr(p, "\n\n");
        ck_assert_msg(end, "event without its blank line: %.200s", p);
        ck_assert_msg(!saw_done, "something after [DONE]: %.200s", p);
        if (*p == ':') {
            p = end + 2;
            continue;
        }
        ck_assert_msg(!strncmp(p, "data: ", 6), "event not `data: `: %.200s", p);
        const char *d = p + 6;
        size_t n = (size_t)(end - d);
        ck_assert_msg(!memchr(d, '\n', n), "multi-line event: %.200s", p);
        if (n == 6 && !strncmp(d, "[DONE]", 6)) {
            saw_done = 1;
        } else {
            json_error_t je;
            json_t *o = json_loadb(d, n, 0, &je);
            ck_assert_msg(o, "event not JSON (%s): %.*s", je.text, (int)n, d);
            json_array_append_new(events, o);
        }
        p = end + 2;
    }
    ck_assert_int_eq(saw_done, done_last);
    return events;
}

json_t *gt_stream(int port, const char *path, const char *body, int *status)
{
    gt_resp_t r;
    gt_http(port, "POST", path, GT_KEY, body, &r);
    *status = r.status;
    ck_assert_msg(r.status == 200, "status %d: %s", r.status, r.body);
    ck_assert_msg(strstr(r.head, "text/event-stream"), "%s", r.head);
    json_t *ev = gt_sse(r.body, 1);
    gt_resp_free(&r);
    return ev;
}

const char *gt_str(json_t *o, const char *path)
{
    json_t *v = json_object_get(o, path);
    return json_is_string(v) ? json_string_value(v) : NULL;
}

int gt_same_counts(json_t *a, json_t *b)
{
    json_t *x = json_deep_copy(a), *y = json_deep_copy(b);
    json_object_del(x, "prompt_tokens_details");
    json_object_del(y, "prompt_tokens_details");
    int same = json_equal(x, y);
    json_decref(x);
    json_decref(y);
    return same;
}

const char *gt_error_message(json_t *o)
{
    return gt_str(json_object_get(o, "error"), "message");
}

json_t *gt_choice(json_t *o)
{
    return json_array_get(json_object_get(o, "choices"), 0);
}

void gt_health(int port)
{
    gt_resp_t r;
    gt_http(port, "GET", "/health", NULL, NULL, &r);
    ck_assert_msg(r.status == 200, "health: %d", r.status);
    gt_resp_free(&r);
}

/* ---- riverd ---- */

/* riverd's count of requests that ended with outcome (its Prometheus text), -1 when it
 * does not answer. */
long gt_riverd_metric(const gt_env_t *e, const char *name)
{
    river_keys_t k = gt_admin_keys(e);
    river_admin_t *a;
    ck_assert_int_eq(river_admin_new_secure(&a, e->c.admin, 1000, &k), 0);
    char *text = NULL;
    int rc = river_admin_metrics(a, &text);
    river_admin_destroy(&a);
    if (rc < 0)
        return -1;
    char key[160];
    snprintf(key, sizeof key, "\n%s ", name);
    const char *p = strstr(text, key);
    long n = p ? atol(p + strlen(key)) : -1;
    free(text);
    return n;
}

long gt_riverd_outcome(const gt_env_t *e, const char *outcome)
{
    char name[128];
    snprintf(name, sizeof name, "river_requests_total{outcome=\"%s\"}", outcome);
    return gt_riverd_metric(e, name);
}

/* Reads a stream's socket until its first chunk with text. */
void gt_read_first_chunk(int fd)
{
    char buf[8192];
    size_t len = 0;
    buf[0] = '\0';
    while (len < sizeof buf - 1 && !strstr(buf, "\"text\":\"")) {
        ssize_t got = recv(fd, buf + len, sizeof buf - 1 - len, 0);
        ck_assert_msg(got > 0, "stream ended before its first chunk: %s", buf);
        len += (size_t)got;
        buf[len] = '\0';
    }
}