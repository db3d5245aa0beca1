/* river-gateway under attack: real riverd, river-worker and river-gateway processes and
 * hostile clients over real sockets, each bound to its own 127.x.y.z source address (all of
 * 127/8 is loopback on Linux), so that the gateway sees many distinct clients.
 *
 * What must hold: 2000 connections that never finish their headers, from 250 addresses,
 * leave `/health` and a real completion answering within a second, and are themselves
 * still served when they finish; one address over limits.max_connections_per_address has
 * its excess closed while another address is served, and the warnings about refusals are
 * a few a second; a client that keeps dripping header
 * bytes is closed at timeouts.headers, one idle between two requests is not; 200 keyless
 * connections each sending a chunked 1 MiB body that never ends grow the gateway by under
 * 20 MB, a keyless request is answered 401 before its body is sent, and an unknown path or
 * /metrics without a key is a 401 too; a non-streaming client that hangs up has its request cancelled and its slot
 * freed within a second; error bodies carry no server file paths; metrics.port's listener
 * serves /metrics without a key while the main one asks for it; a client that half-closes
 * after its request is answered and closed. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "common/clock.h"
#include "tests/gwenv.h"
#include "tests/proc.h"
#include "tests/testutil.h"

#define GA_SLOW_CONNS 2000
#define GA_SLOW_ADDRS 250   /* 8 connections each, under the per-address limit of 16 */
#define GA_PER_ADDRESS 16
#define GA_BODY_CONNS 200
#define GA_BODY_BYTES (1u << 20)

/* A 127.a.b.c address in host order. */
static uint32_t ga_addr(unsigned a, unsigned b, unsigned c)
{
    return (127u << 24) | (a << 16) | (b << 8) | c;
}

static void ga_send_all(int fd, const char *text)
{
    size_t n = strlen(text);
    ck_assert_msg(send(fd, text, n, MSG_NOSIGNAL) == (ssize_t)n, "send: %s", strerror(errno));
}

/* Whether the server closed fd (or reset it) within ms. */
static int ga_closed_within(int fd, int ms)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, ms) <= 0)
        return 0;
    char buf[256];
    ssize_t got = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    return got == 0 || (got < 0 && errno != EAGAIN);
}

/* The status line of what arrives on fd within ms, 0 when nothing does. */
static int ga_status_within(int fd, int ms)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, ms) <= 0)
        return 0;
    char buf[512];
    ssize_t got = recv(fd, buf, sizeof buf - 1, 0);
    if (got <= 0)
        return 0;
    buf[got] = '\0';
    int status = 0;
    return sscanf(buf, "HTTP/1.%*d %d", &status) == 1 ? status : 0;
}

/* VmRSS of pid in kB. */
static long ga_rss_kb(pid_t pid)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    ck_assert_msg(f, "%s: %s", path, strerror(errno));
    long kb = -1;
    while (kb < 0 && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmRSS:", 6))
            kb = atol(line + 6);
    fclose(f);
    ck_assert_msg(kb > 0, "no VmRSS in %s", path);
    return kb;
}

/* The test process holds thousands of sockets too. */
static void ga_raise_nofile(void)
{
    struct rlimit rl;
    ck_assert_int_eq(getrlimit(RLIMIT_NOFILE, &rl), 0);
    rl.rlim_cur = rl.rlim_max;
    ck_assert_int_eq(setrlimit(RLIMIT_NOFILE, &rl), 0);
    ck_assert_msg(rl.rlim_cur > GA_SLOW_CONNS + 256, "open-file limit %llu",
                  (unsigned long long)rl.rlim_cur);
}

/* A value of the gateway's own metrics, read with the key. */
static long ga_metric(int port, const char *name)
{
    gt_resp_t r;
    gt_http(port, "GET", "/metrics", GT_KEY, NULL, &r);
    ck_assert_int_eq(r.status, 200);
    char key[128];
    snprintf(key, sizeof key, "\n%s ", name);
    const char *p = strstr(r.body, key);
    long v = p ? atol(p + strlen(key)) : -1;
    gt_resp_free(&r);
    return v;
}

static const char *ga_completion = "{\"model\":\"stories\",\"prompt\":\"Once upon a time\","
                                   "\"max_tokens\":4,\"temperature\":0}";

/* ---- Slow clients ---- */

START_TEST(test_slow_headers)
{
    ga_raise_nofile();
    gt_env_t e;
    char extra[256];
    snprintf(extra, sizeof extra,
             "limits:\n  max_connections: 4096\n  max_connections_per_address: %d\n"
             "timeouts:\n  headers: 60s\n", GA_PER_ADDRESS);
    gt_start(&e, GT_STORIES, NULL, extra);
    int port = e.port[0];
    static int fds[GA_SLOW_CONNS];
    for (int i = 0; i < GA_SLOW_CONNS; i++) {
        fds[i] = gt_connect_from(port, ga_addr(1, 1 + i % GA_SLOW_ADDRS / 200,
                                               1 + i % GA_SLOW_ADDRS % 200));
        ga_send_all(fds[i], "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ");
    }
    /* Every one of them drips one more byte, as a slow client does. */
    for (int i = 0; i < GA_SLOW_CONNS; i++)
        ga_send_all(fds[i], "a");
    /* Everyone else is still served, at once. */
    for (int k = 0; k < 3; k++) {
        double t0 = clock_now_s();
        gt_health(port);
        double dt = clock_now_s() - t0;
        ck_assert_msg(dt < 1.0, "/health took %.3f s beside %d slow connections", dt,
                      GA_SLOW_CONNS);
        t0 = clock_now_s();
        int st;
        json_t *o = gt_post(port, "/v1/completions", ga_completion, &st);
        dt = clock_now_s() - t0;
        ck_assert_msg(st == 200, "status %d: %s", st, json_dumps(o, 0));
        json_decref(o);
        ck_assert_msg(dt < 1.0, "a completion took %.3f s beside %d slow connections", dt,
                      GA_SLOW_CONNS);
    }
    /* One address over its limit: its excess is closed, the rest of it is held, and
     * another address is served meanwhile. */
    int mine[GA_PER_ADDRESS + 4];
    for (int i = 0; i < GA_PER_ADDRESS + 4; i++) {
        mine[i] = gt_connect_from(port, ga_addr(77, 0, 1));
        ga_send_all(mine[i], "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ");
    }
    /* The excess is closed when the gateway accepts it, which a loaded machine may delay
     * behind the slow connections' traffic: all get one deadline together. Which four are
     * the excess is the order the gateway's threads accept them in (a pool, every thread
     * accepting from the one socket), not always the order they connected in, so any four
     * of them may be. */
    enum { MINE = GA_PER_ADDRESS + 4 };
    int refused = 0, gone[MINE] = {0};
    double until = clock_now_s() + 10;
    while (refused < 4 && clock_now_s() < until) {
        for (int k = 0; k < MINE; k++) {
            if (!gone[k] && ga_closed_within(mine[k], 5)) {
                gone[k] = 1;
                refused++;
            }
        }
    }
    ck_assert_msg(refused == 4, "%d of %d connections of one address (limit %d) closed "
                  "within 10 s", refused, MINE, GA_PER_ADDRESS);
    /* The others are held: none of them closes. */
    int also = 0, waited = 0;
    for (int i = 0; i < MINE; i++) {
        if (gone[i])
            continue;
        also += ga_closed_within(mine[i], waited ? 0 : 200);
        waited = 1;
    }
    ck_assert_msg(also == 0, "%d more connections of the address, under its limit, closed",
                  also);
    int other = gt_connect_from(port, ga_addr(77, 0, 2));
    ga_send_all(other, "GET /health HTTP/1.0\r\n\r\n");
    ck_assert_int_eq(ga_status_within(other, 1000), 200);
    close(other);
    /* The slow ones were held, not dropped: each still gets its answer when it ends its
     * headers. */
    int closed = 0;
    for (int i = 0; i < GA_SLOW_CONNS; i++)
        closed += ga_closed_within(fds[i], 0);
    ck_assert_msg(closed == 0, "%d of the slow connections were closed", closed);
    for (int i = 0; i < GA_SLOW_CONNS; i += 97) {
        ga_send_all(fds[i], "\r\nConnection: close\r\n\r\n");
        ck_assert_int_eq(ga_status_within(fds[i], 2000), 200);
    }
    for (int i = 0; i < GA_SLOW_CONNS; i++)
        close(fds[i]);
    /* 200 more from the address at its limit, each refused: the warnings about them are
     * a few a second, not one each. */
    double t_burst = clock_now_s();
    for (int i = 0; i < 200; i++) {
        int fd = gt_connect_from(port, ga_addr(77, 0, 1));
        ga_closed_within(fd, 1000);
        close(fd);
    }
    double burst_s = clock_now_s() - t_burst;
    for (int i = 0; i < GA_PER_ADDRESS + 4; i++)
        close(mine[i]);
    ck_assert_msg(test_log_has(e.gw_log[0], "reached connection limit", 1000),
                  "no refusal logged; see %s", e.gw_log[0]);
    size_t len;
    char *log = test_read_file(e.gw_log[0], &len);
    int lines = 0;
    for (const char *p = log; (p = strstr(p, "reached connection limit")); p++)
        lines++;
    free(log);
    ck_assert_msg(lines <= 5 * ((int)burst_s + 3),
                  "%d refusal warnings for 204 refusals in %.1f s", lines, burst_s);

    /* A gateway whose headers must be complete in 2 s: a client dripping a byte every
     * 200 ms, never idle, is closed when they are not. */
    gt_start_gateway(&e, 1, GT_STORIES, "timeouts:\n  headers: 2s\n");
    int fd = gt_connect_from(e.port[1], ga_addr(78, 0, 1));
    ga_send_all(fd, "GET /health HTTP/1.1\r\nX-Slow: ");
    double t0 = clock_now_s();
    int was_closed = 0;
    while (!was_closed && clock_now_s() - t0 < 8) {
        if (send(fd, "a", 1, MSG_NOSIGNAL) != 1)
            break;
        was_closed = ga_closed_within(fd, 200);
    }
    double dt = clock_now_s() - t0;
    ck_assert_msg(dt > 1.5 && dt < 4, "the dripping client was closed after %.2f s", dt);
    close(fd);
    ck_assert_msg(test_log_has(e.gw_log[1], "took longer than timeouts.headers", 2000),
                  "the close was not logged; see %s", e.gw_log[1]);
    /* A kept-alive connection idle between two requests for longer than timeouts.headers
     * is not slow: that is timeouts.connection's (5 minutes) to close. */
    fd = gt_connect_from(e.port[1], ga_addr(78, 0, 2));
    ga_send_all(fd, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
    ck_assert_int_eq(ga_status_within(fd, 2000), 200);
    test_sleep_ms(3000);
    char rest[512];
    while (recv(fd, rest, sizeof rest, MSG_DONTWAIT) > 0)
        continue;
    ga_send_all(fd, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
    ck_assert_int_eq(ga_status_within(fd, 2000), 200);
    close(fd);
    gt_health(e.port[1]);
    gt_stop(&e);
}
END_TEST

/* ---- Bodies before the key ---- */

START_TEST(test_keyless_bodies)
{
    ga_raise_nofile();
    gt_env_t e;
    gt_start(&e, GT_STORIES, NULL, "");
    int port = e.port[0];
    /* Refused on the headers alone: the body is never sent, the answer comes anyway. */
    int fd = gt_connect_from(port, ga_addr(2, 1, 1));
    ga_send_all(fd, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                    "Content-Type: application/json\r\nContent-Length: 1000000\r\n\r\n");
    ck_assert_int_eq(ga_status_within(fd, 3000), 401);
    close(fd);
    gt_resp_t r;
    gt_http(port, "POST", "/v1/nothing", NULL, "{}", &r);
    ck_assert_msg(r.status == 401, "unknown path without a key: %d", r.status);
    gt_resp_free(&r);
    gt_http(port, "GET", "/v1/chat/completions", NULL, NULL, &r);
    ck_assert_msg(r.status == 401, "wrong method without a key: %d", r.status);
    gt_resp_free(&r);
    gt_http(port, "POST", "/v1/nothing", GT_KEY, "{}", &r);
    ck_assert_int_eq(r.status, 404);
    gt_resp_free(&r);
    gt_http(port, "GET", "/metrics", NULL, NULL, &r);
    ck_assert_msg(r.status == 401, "/metrics without a key: %d", r.status);
    gt_resp_free(&r);

    long rss0 = ga_rss_kb(e.gw[0]);
    static int fds[GA_BODY_CONNS];
    static size_t sent[GA_BODY_CONNS];
    static char chunk[65536];
    memset(chunk, 'x', sizeof chunk);
    for (int i = 0; i < GA_BODY_CONNS; i++) {
        fds[i] = gt_connect_from(port, ga_addr(3, 0, 1 + (unsigned)i));
        ga_send_all(fds[i], "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                            "Content-Type: application/json\r\n"
                            "Transfer-Encoding: chunked\r\n\r\n100000\r\n");
        sent[i] = 0;
    }
    /* Each sends its 1 MiB chunk as far as the gateway lets it, never the end. */
    double until = clock_now_s() + 10;
    for (int progress = 1; progress && clock_now_s() < until;) {
        progress = 0;
        for (int i = 0; i < GA_BODY_CONNS; i++) {
            if (fds[i] < 0 || sent[i] >= GA_BODY_BYTES)
                continue;
            size_t n = GA_BODY_BYTES - sent[i] < sizeof chunk ? GA_BODY_BYTES - sent[i]
                                                              : sizeof chunk;
            ssize_t w = send(fds[i], chunk, n, MSG_DONTWAIT | MSG_NOSIGNAL);
            if (w > 0) {
                sent[i] += (size_t)w;
                progress = 1;
            } else if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
                close(fds[i]);
                fds[i] = -1;
            }
        }
    }
    test_sleep_ms(500);
    long rss1 = ga_rss_kb(e.gw[0]);
    size_t total = 0;
    for (int i = 0; i < GA_BODY_CONNS; i++)
        total += sent[i];
    fprintf(stderr, "keyless bodies: %zu MiB sent, gateway RSS %ld -> %ld kB\n", total >> 20,
            rss0, rss1);
    ck_assert_msg(rss1 - rss0 < 20 * 1024, "gateway RSS grew %ld kB (%ld -> %ld)",
                  rss1 - rss0, rss0, rss1);
    for (int i = 0; i < GA_BODY_CONNS; i++)
        if (fds[i] >= 0)
            close(fds[i]);
    gt_health(port);
    gt_stop(&e);
}
END_TEST

/* ---- A client that hangs up ---- */

START_TEST(test_whole_disconnect)
{
    gt_env_t e;
    gt_start(&e, GT_KJV, NULL, "limits:\n  max_concurrent: 1\n");
    int port = e.port[0];
    const char *body = "{\"model\":\"stories\",\"prompt\":\"In the beginning\",\"max_tokens\":240,"
                       "\"river\":{\"ignore_eos\":true}}";
    /* The worker is stopped first, so that the request is certainly still running when
     * its client leaves, however fast the machine. */
    ck_assert_int_eq(kill(e.c.wk[0].pid, SIGSTOP), 0);
    int fd = gt_send(port, "POST", "/v1/completions", GT_KEY, body, strlen(body));
    double until = clock_now_s() + 3;
    while (ga_metric(port, "river_gateway_requests_in_flight") != 1 && clock_now_s() < until)
        test_sleep_ms(20);
    ck_assert_int_eq(ga_metric(port, "river_gateway_requests_in_flight"), 1);
    close(fd);
    double t0 = clock_now_s();
    long in_flight = 1;
    while ((in_flight = ga_metric(port, "river_gateway_requests_in_flight")) != 0 &&
           clock_now_s() - t0 < 3)
        test_sleep_ms(20);
    double dt = clock_now_s() - t0;
    ck_assert_msg(in_flight == 0 && dt < 1.0, "the slot was freed after %.3f s (%ld in flight)",
                  dt, in_flight);
    ck_assert_msg(test_log_has(e.gw_log[0], "went away: cancelling", 1000),
                  "the gateway did not cancel; see %s", e.gw_log[0]);
    ck_assert_int_eq(kill(e.c.wk[0].pid, SIGCONT), 0);
    /* riverd ended it as cancelled, and the worker gave its KV pages back. */
    char state[32];
    uint32_t free_pages = 0, total = 0;
    long cancelled = 0;
    until = clock_now_s() + 10;
    while (clock_now_s() < until) {
        cancelled = gt_riverd_outcome(&e, "cancelled");
        gt_worker_state(&e, state, sizeof state, &free_pages, &total);
        if (cancelled == 1 && free_pages == total && total > 0)
            break;
        test_sleep_ms(50);
    }
    ck_assert_msg(cancelled == 1, "riverd counted %ld cancelled requests", cancelled);
    ck_assert_msg(free_pages == total && total > 0, "%u of %u KV pages free", free_pages,
                  total);
    int st;
    json_t *o = gt_post(port, "/v1/completions", ga_completion, &st);
    ck_assert_msg(st == 200, "status %d: %s", st, json_dumps(o, 0));
    json_decref(o);
    gt_stop(&e);
}
END_TEST

/* ---- What errors and metrics tell ---- */

START_TEST(test_exposure)
{
    gt_env_t e;
    gt_start(&e, GT_STORIES, NULL, "");
    /* A template that refuses a role, from a file deep in the test's directory. */
    char dir[512], tmpl[600];
    snprintf(dir, sizeof dir, "%s", gt_path(&e, "secret-dir"));
    ck_assert_int_eq(mkdir(dir, 0755), 0);
    snprintf(tmpl, sizeof tmpl, "%s/boom.jinja", dir);
    test_write(tmpl, "{%- for m in messages -%}{%- if m['role'] == 'tool' -%}"
                     "{{ raise_exception('no tool turns here') }}{%- endif -%}"
                     "{{ m['content'] }}{%- endfor -%}{{ undefined_fn() }}");
    e.template_path = tmpl;
    gt_start_gateway(&e, 1, GT_STORIES, "metrics:\n  port: 0\n");
    int st;
    json_t *o = gt_post(e.port[1], "/v1/chat/completions",
                        "{\"model\":\"stories\",\"messages\":[{\"role\":\"user\","
                        "\"content\":\"hi\"}],\"max_tokens\":2}", &st);
    char *text = json_dumps(o, 0);
    ck_assert_msg(st == 400, "status %d: %s", st, text);
    ck_assert_msg(strstr(text, "boom.jinja"), "the template's name is gone: %s", text);
    ck_assert_msg(!strstr(text, dir) && !strstr(text, e.c.dir),
                  "a server path in the error: %s", text);
    free(text);
    json_decref(o);

    /* Its metrics listener of its own serves the scraper without a key, and nothing else. */
    ck_assert_msg(test_log_has(e.gw_log[1], "metrics on http://127.0.0.1:", 5000),
                  "no metrics listener; see %s", e.gw_log[1]);
    size_t len;
    char *log = test_read_file(e.gw_log[1], &len);
    int mport = atoi(strstr(log, "metrics on http://127.0.0.1:") +
                     strlen("metrics on http://127.0.0.1:"));
    free(log);
    ck_assert_int_gt(mport, 0);
    gt_resp_t r;
    gt_http(mport, "GET", "/metrics", NULL, NULL, &r);
    ck_assert_int_eq(r.status, 200);
    ck_assert_msg(strstr(r.body, "river_gateway_requests_total{status=\"400\"} 1"), "%s",
                  r.body);
    gt_resp_free(&r);
    gt_http(mport, "GET", "/v1/models", NULL, NULL, &r);
    ck_assert_int_eq(r.status, 404);
    gt_resp_free(&r);
    gt_http(e.port[1], "GET", "/metrics", NULL, NULL, &r);
    ck_assert_int_eq(r.status, 401);
    gt_resp_free(&r);

    /* A kept-alive client that half-closes after its request is answered and closed at
     * once, not at timeouts.connection. */
    int fd = gt_connect_from(e.port[1], 0);
    ga_send_all(fd, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n");
    ck_assert_int_eq(shutdown(fd, SHUT_WR), 0);
    ck_assert_int_eq(ga_status_within(fd, 2000), 200);
    double t0 = clock_now_s();
    int ended = 0;
    while (!ended && clock_now_s() - t0 < 2)
        ended = ga_closed_within(fd, 100);
    ck_assert_msg(ended, "a half-closed client's connection stayed open");
    close(fd);
    gt_stop(&e);
}
END_TEST

static Suite *gateway_attacks_suite(void)
{
    Suite *s = suite_create("gateway_attacks");
    TCase *tc = tcase_create("gateway_attacks");
    tcase_set_timeout(tc, 180);
    tcase_add_test(tc, test_slow_headers);
    tcase_add_test(tc, test_keyless_bodies);
    tcase_add_test(tc, test_whole_disconnect);
    tcase_add_test(tc, test_exposure);
    suite_add_tcase(s, tc);
    return s;
}

RIVER_TEST_MAIN(gateway_attacks_suite)
