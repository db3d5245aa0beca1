/* The poll loop: three ROUTER sockets, the signal descriptor and the HTTP server's epoll
 * descriptor in one zmq_poll whose timeout is the next timer; periodic work in one place
 * (loop__tick). Also the frame I/O every other part goes through. */
#include <errno.h>
#include <malloc.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/signalfd.h>
#include <time.h>
#include <unistd.h>

#include <zmq.h>

#include "common/clock.h"
#include "common/err.h"
#include "daemon/riverd.h"

/* Messages read from one socket before the loop looks at the others, so that a flood on
 * one link cannot starve the rest. */
#define LOOP_BATCH 256
/* Longest wait of the poll loop when no timer is due: a ceiling, not a tick. */
#define LOOP_MAX_WAIT_MS 60000
/* Messages queued to one worker: Submits and Cancels are few, so reaching this means
 * the worker stopped reading. */
#define LOOP_WORKER_HWM 100000
/* Frames beyond two per allowed request that a client connection may have waiting (pings
 * of the library, a request refused and sent again). */
#define LOOP_CLIENT_RCVHWM_SLACK 16
/* Frames past max_frame_bytes up to this many times it still reach riverd and get an
 * error reply; larger ones make ZMQ drop the connection before they use the memory. */
#define LOOP_OVERSIZE_FACTOR 4
/* How often riverd hands the heap pages freed since to the kernel (malloc_trim). */
#define LOOP_TRIM_MS 30000

/* ---- Sockets ---- */

static int loop__socket(riverd_t *rd, void **out, const char *what, bool mandatory,
                          int sndhwm, int rcvhwm)
{
    void *s = zmq_socket(rd->zctx, ZMQ_ROUTER);
    if (!s)
        return river_err_set(RIVER_ESYS, "%s socket: %s", what, zmq_strerror(zmq_errno()));
    int one = 1, linger = 1000;
    int64_t maxmsg = (int64_t)rd->cfg.max_frame_bytes * LOOP_OVERSIZE_FACTOR;
    /* ROUTER_MANDATORY turns a reply to a peer that went away into EHOSTUNREACH instead
     * of a silent drop, which is how riverd learns that a client left or a worker's
     * connection is gone. */
    if ((mandatory && zmq_setsockopt(s, ZMQ_ROUTER_MANDATORY, &one, sizeof one)) ||
        zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof linger) ||
        zmq_setsockopt(s, ZMQ_MAXMSGSIZE, &maxmsg, sizeof maxmsg) ||
        (sndhwm && zmq_setsockopt(s, ZMQ_SNDHWM, &sndhwm, sizeof sndhwm)) ||
        (rcvhwm && zmq_setsockopt(s, ZMQ_RCVHWM, &rcvhwm, sizeof rcvhwm))) {
        int e = zmq_errno();
        zmq_close(s);
        return river_err_set(RIVER_ESYS, "%s socket options: %s", what, zmq_strerror(e));
    }
    *out = s;
    return 0;
}

static int loop__bind(void *s, const char *endpoint, const char *what, char *bound,
                        size_t cap)
{
    if (zmq_bind(s, endpoint) != 0)
        return river_err_set(RIVER_ESYS, "cannot bind the %s endpoint %s: %s", what,
                             endpoint, zmq_strerror(zmq_errno()));
    char last[256] = "";
    size_t n = sizeof last;
    if (zmq_getsockopt(s, ZMQ_LAST_ENDPOINT, last, &n) != 0)
        snprintf(last, sizeof last, "%s", endpoint);
    log_info("%s on %s", what, last);
    if (bound && !bound[0]) {
        /* What a process on this host connects to: a wildcard bind is reachable on
         * loopback. */
        const char *any = "tcp://0.0.0.0:";
        if (!strncmp(last, any, strlen(any)))
            snprintf(bound, cap, "tcp://127.0.0.1:%.200s", last + strlen(any));
        else
            snprintf(bound, cap, "%s", last);
    }
    return 0;
}

int loop_open(riverd_t *rd)
{
    int rc;
    rd->sig_fd = -1;
    /* Signals arrive as reads on a descriptor in the poll loop, never as handlers that
     * interrupt it. They are blocked before any thread starts (CZMQ's actors do not block
     * them themselves), since every thread inherits the mask and a signal goes to any
     * thread that does not block it. Children get the default mask back before exec
     * (supervise.c). */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGHUP);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGCHLD);
    sigaddset(&set, SIGUSR1);
    if (sigprocmask(SIG_BLOCK, &set, NULL) != 0)
        return river_err_set(RIVER_ESYS, "sigprocmask: %s", strerror(errno));
    rd->zctx = auth_open_context();
    if (!rd->zctx)
        return river_err_set(RIVER_ESYS, "zmq context: %s", zmq_strerror(zmq_errno()));
    /* The ZAP handler runs before the first socket binds: a CURVE handshake that finds no
     * handler would be let in unchecked. */
    if ((rc = auth_start(rd->auth, rd->zctx)) < 0)
        goto fail;
    /* The bound on what waits for a client that does not read (limits.max_client_backlog):
     * past it a send fails with EAGAIN and dispatch.c ends that client's requests.
     * What waits unread from one client connection is bounded by what it may ask for:
     * a Generate and a Cancel for each request it may have (limits.max_requests_per_client)
     * and a few more. Past it ZMQ stops reading that connection (TCP pushes back on the
     * client) instead of queueing up to its default of 1000 frames, each of up to
     * LOOP_OVERSIZE_FACTOR times limits.max_frame_bytes, per connection. It is set
     * when the socket is made and a reload leaves it: it only holds back a client that
     * outruns this loop, while dispatch.c applies the limit itself live. */
    int client_rcvhwm = 2 * rd->cfg.max_requests_per_client + LOOP_CLIENT_RCVHWM_SLACK;
    rc = loop__socket(rd, &rd->clients, "client", true, rd->cfg.max_client_backlog,
                        client_rcvhwm);
    if (rc < 0)
        goto fail;
    rc = auth_secure_socket(rd->auth, rd->zctx, rd->clients, AUTH_ROLE_CLIENT, "client");
    if (rc < 0)
        goto fail;
    for (int i = 0; i < rd->cfg.clients.n; i++)
        if ((rc = loop__bind(rd->clients, rd->cfg.clients.v[i], "clients", NULL, 0)) < 0)
            goto fail;
    rc = loop__socket(rd, &rd->workers, "worker", true, LOOP_WORKER_HWM, 0);
    if (rc < 0)
        goto fail;
    rc = auth_secure_socket(rd->auth, rd->zctx, rd->workers, AUTH_ROLE_WORKER, "worker");
    if (rc < 0)
        goto fail;
    /* Workers connect with their id as routing id; a worker that restarts (or reconnects
     * before riverd noticed the old connection die) must get its name back. With CURVE a
     * worker adds random bytes to it for each connection (workers/link.c), and a Ready
     * with a known id replaces the old entry instead: no connection is ever handed over
     * then, so that no other key that passed the handshake can take a worker's traffic
     * even if it learnt the id. */
    int handover = auth_plain(rd->auth) ? 1 : 0;
    if (zmq_setsockopt(rd->workers, ZMQ_ROUTER_HANDOVER, &handover, sizeof handover) != 0) {
        rc = river_err_set(RIVER_ESYS, "worker socket: %s", zmq_strerror(zmq_errno()));
        goto fail;
    }
    /* Local workers connect to the first endpoint, or to the first ipc:// one: on the
     * same host that is the cheaper path. */
    for (int i = 0; i < rd->cfg.workers.n; i++) {
        const char *ep = rd->cfg.workers.v[i];
        if (!strncmp(ep, "ipc://", 6) && strncmp(rd->worker_endpoint, "ipc://", 6))
            rd->worker_endpoint[0] = '\0';
        if ((rc = loop__bind(rd->workers, ep, "workers", rd->worker_endpoint,
                               sizeof rd->worker_endpoint)) < 0)
            goto fail;
    }
    if (rd->cfg.admin[0]) {
        rc = loop__socket(rd, &rd->admin, "admin", false, 0, 0);
        if (rc < 0)
            goto fail;
        rc = auth_secure_socket(rd->auth, rd->zctx, rd->admin, AUTH_ROLE_ADMIN, "admin");
        if (rc < 0)
            goto fail;
        if ((rc = loop__bind(rd->admin, rd->cfg.admin, "admin", NULL, 0)) < 0)
            goto fail;
    }

    rd->sig_fd = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
    if (rd->sig_fd < 0) {
        rc = river_err_set(RIVER_ESYS, "signalfd: %s", strerror(errno));
        goto fail;
    }
    if (signal(SIGPIPE, SIG_IGN) == SIG_ERR) {
        rc = river_err_set(RIVER_ESYS, "ignoring SIGPIPE: %s", strerror(errno));
        goto fail;
    }
    return 0;
fail:
    loop_close(rd);
    return rc;
}

void loop_close(riverd_t *rd)
{
    if (rd->sig_fd >= 0)
        close(rd->sig_fd);
    rd->sig_fd = -1;
    void **socks[] = {&rd->clients, &rd->workers, &rd->admin};
    for (size_t i = 0; i < sizeof socks / sizeof socks[0]; i++) {
        if (*socks[i])
            zmq_close(*socks[i]);
        *socks[i] = NULL;
    }
    /* After the sockets it served: a handshake never goes unchecked. */
    auth_stop(rd->auth);
    if (rd->zctx)
        auth_close_context();
    rd->zctx = NULL;
}

/* ---- Frame I/O ---- */

/* Reads one message from a ROUTER: the routing id, an optional empty delimiter (REQ
 * peers) and one payload frame. Returns 1 with *payload set, 0 when nothing is waiting,
 * 2 when the message had the wrong shape, 3 when its sender's key may not use this socket
 * (`role`; auth.c logged it, river_err_detail() says why): in both cases it is consumed and
 * *from is valid. <0 on error. */
static int loop__recv(riverd_t *rd, void *s, int role, route_t *from, zmq_msg_t *payload)
{
    zmq_msg_t f;
    zmq_msg_init(&f);
    if (zmq_msg_recv(&f, s, ZMQ_DONTWAIT) < 0) {
        int e = zmq_errno();
        zmq_msg_close(&f);
        if (e == EAGAIN || e == EINTR)
            return 0;
        return river_err_set(RIVER_ESYS, "zmq recv: %s", zmq_strerror(e));
    }
    size_t n = zmq_msg_size(&f);
    from->len = (uint8_t)(n > RIVERD_ROUTE_MAX ? RIVERD_ROUTE_MAX : n);
    memcpy(from->id, zmq_msg_data(&f), from->len);
    from->delim = false;
    from->key[0] = '\0';
    from->tenant[0] = '\0';
    bool more = zmq_msg_more(&f);
    zmq_msg_close(&f);

    /* Keep the first two frames after the routing id; count the rest. */
    zmq_msg_t frames[2];
    int got = 0, extra = 0;
    while (more) {
        zmq_msg_t *m = got < 2 ? &frames[got] : &f;
        zmq_msg_init(m);
        if (zmq_msg_recv(m, s, 0) < 0) {
            int e = zmq_errno();
            zmq_msg_close(m);
            for (int i = 0; i < got; i++)
                zmq_msg_close(&frames[i]);
            return river_err_set(RIVER_ESYS, "zmq recv: %s", zmq_strerror(e));
        }
        more = zmq_msg_more(m);
        if (got < 2)
            got++;
        else {
            extra++;
            zmq_msg_close(m);
        }
    }
    int rc = 2;
    /* The first frame after the routing id came from the peer and carries the key its
     * handshake authenticated (the routing id frame is riverd's own). */
    if (got > 0 && auth_check(rd->auth, role, &frames[0]) < 0) {
        from->delim = got == 2 && zmq_msg_size(&frames[0]) == 0; /* for the refusal */
        for (int i = 0; i < got; i++)
            zmq_msg_close(&frames[i]);
        return 3;
    }
    if (got > 0 && !auth_plain(rd->auth)) {
        const char *key = zmq_msg_gets(&frames[0], "User-Id");
        if (key)
            snprintf(from->key, sizeof from->key, "%s", key);
    }
    if (got == 1 && !extra) {
        *payload = frames[0];
        return 1;
    }
    if (got == 2 && !extra && zmq_msg_size(&frames[0]) == 0) {
        from->delim = true;
        zmq_msg_close(&frames[0]);
        *payload = frames[1];
        return 1;
    }
    if (got == 2 && zmq_msg_size(&frames[0]) == 0)
        from->delim = true;
    for (int i = 0; i < got; i++)
        zmq_msg_close(&frames[i]);
    return rc;
}

/* Sends m (taken) to `to`. A full queue (the peer is not reading) is RIVER_EFULL, anything
 * else that fails RIVER_EIO. */
static int loop__send_msg(void *s, const route_t *to, zmq_msg_t *m)
{
    if (zmq_send(s, to->id, to->len, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0)
        goto fail;
    if (to->delim && zmq_send(s, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0)
        goto fail;
    if (zmq_msg_send(m, s, ZMQ_DONTWAIT) < 0)
        goto fail;
    return 0;
fail:;
    int e = zmq_errno();
    zmq_msg_close(m);
    if (e == EAGAIN)
        return river_err_set(RIVER_EFULL, "peer is not reading");
    return river_err_set(RIVER_EIO, "%s", e == EHOSTUNREACH ? "peer is gone" : zmq_strerror(e));
}

static int loop__send(void *s, const route_t *to, const ProtobufCMessage *env)
{
    if (!s)
        return river_err_set(RIVER_EIO, "socket closed");
    zmq_msg_t m;
    int rc = frame_encode_msg(env, &m);
    if (rc < 0) {
        zmq_msg_close(&m);
        log_error("cannot encode a %s: %s", frame_case_name(env), river_err_detail());
        return rc;
    }
    return loop__send_msg(s, to, &m);
}

int loop_send_client(riverd_t *rd, const route_t *to, const River__Client__ClientReply *r)
{
    return loop__send(rd->clients, to, &r->base);
}

int loop_send_client_frame(riverd_t *rd, const route_t *to, const void *frame, size_t len)
{
    if (!rd->clients)
        return river_err_set(RIVER_EIO, "socket closed");
    zmq_msg_t m;
    if (zmq_msg_init_size(&m, len) != 0)
        return river_err_set(RIVER_ENOMEM, "reply of %zu bytes", len);
    memcpy(zmq_msg_data(&m), frame, len);
    return loop__send_msg(rd->clients, to, &m);
}

int loop_send_error(riverd_t *rd, const route_t *to, const char *rid,
                      River__Client__Error__Code code, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (!rd->clients)
        return river_err_set(RIVER_EIO, "socket closed");
    zmq_msg_t m;
    int rc = frame_error_reply(rid, code, msg, &m);
    if (rc < 0) {
        zmq_msg_close(&m);
        return rc;
    }
    return loop__send_msg(rd->clients, to, &m);
}

int loop_send_route(riverd_t *rd, const route_t *to, const River__Worker__DaemonMessage *m)
{
    return loop__send(rd->workers, to, &m->base);
}

int loop_send_worker(riverd_t *rd, worker_t *w, const River__Worker__DaemonMessage *m)
{
    int rc = loop__send(rd->workers, &w->route, &m->base);
    if (rc == 0)
        w->last_sent_ms = clock_now_ms();
    else if (w->state != WORKER_DEAD && !w->unreachable) {
        /* Marked here, handled in workers_tick: the caller may be walking a list that
         * declaring the worker dead would change. */
        w->unreachable = true;
        log_warn("worker %s: cannot send %s: %s", w->id, frame_case_name(&m->base),
                 river_err_detail());
    }
    return rc;
}

int loop_send_admin(riverd_t *rd, const route_t *to, const River__Admin__AdminReply *r)
{
    return loop__send(rd->admin, to, &r->base);
}

/* ---- Readers, one per socket ---- */

static void loop__on_clients(riverd_t *rd)
{
    for (int i = 0; i < LOOP_BATCH && !rd->stop; i++) {
        route_t from;
        zmq_msg_t p;
        int rc = loop__recv(rd, rd->clients, AUTH_ROLE_CLIENT, &from, &p);
        if (rc <= 0) {
            if (rc < 0)
                log_error("clients: %s", river_err_detail());
            return;
        }
        if (rc == 3) {
            /* The key is allowed somewhere (its handshake passed), just not here: say so,
             * which tells its owner nothing they do not know. */
            loop_send_error(rd, &from, "", RIVER__CLIENT__ERROR__CODE__UNAUTHENTICATED,
                              "%s", river_err_detail());
            continue;
        }
        rd->metrics.bad_frames += rc == 2;
        if (rc == 2) {
            loop_send_error(rd, &from, "", RIVER__CLIENT__ERROR__CODE__INVALID_ARGUMENT,
                              "frame: expected one ClientRequest frame after the routing "
                              "id");
            continue;
        }
        ProtobufCMessage *m = NULL;
        int e = frame_decode_msg(FRAME_CLIENT_REQUEST, &p, (size_t)rd->cfg.max_frame_bytes,
                                 &m);
        zmq_msg_close(&p);
        if (e < 0) {
            rd->metrics.bad_frames++;
            log_debug("bad client frame: %s", river_err_detail());
            /* An oversize frame is a breach of a configured limit: the reply names it. */
            loop_send_error(rd, &from, "", frame_error_code(e), "%s%s", river_err_detail(),
                              e == RIVER_ERANGE ? " (limits.max_frame_bytes)" : "");
            continue;
        }
        dispatch_on_client(rd, &from, (River__Client__ClientRequest *)m);
    }
}

static void loop__on_workers(riverd_t *rd)
{
    for (int i = 0; i < LOOP_BATCH && !rd->stop; i++) {
        route_t from;
        zmq_msg_t p;
        int rc = loop__recv(rd, rd->workers, AUTH_ROLE_WORKER, &from, &p);
        if (rc <= 0) {
            if (rc < 0)
                log_error("workers: %s", river_err_detail());
            return;
        }
        if (rc == 3)
            continue; /* not a worker key: never in the table (auth.c logged it) */
        /* The worker link has no error reply: a worker that sends what riverd cannot
         * read is broken, and saying so in the log is all riverd can do. */
        if (rc == 2) {
            rd->metrics.bad_frames++;
            log_warn("worker frame with the wrong number of parts");
            continue;
        }
        /* The address the worker's connection comes from, as the kernel gave it to ZMQ
         * (an IP address for tcp://, empty for ipc://): what `riverctl workers` shows. */
        char peer[RIVERD_PEER_MAX] = "";
        const char *pa = zmq_msg_gets(&p, "Peer-Address");
        if (pa)
            snprintf(peer, sizeof peer, "%s", pa);
        ProtobufCMessage *m = NULL;
        int e = frame_decode_msg(FRAME_WORKER_MESSAGE, &p, (size_t)rd->cfg.max_frame_bytes,
                                 &m);
        zmq_msg_close(&p);
        if (e < 0) {
            rd->metrics.bad_frames++;
            worker_t *w = workers_by_route(rd, &from);
            log_warn("bad frame from worker %s: %s", w ? w->id : "(unknown)",
                     river_err_detail());
            continue;
        }
        workers_on_message(rd, &from, peer, (River__Worker__WorkerMessage *)m);
    }
}

static void loop__on_admin(riverd_t *rd)
{
    for (int i = 0; i < LOOP_BATCH && !rd->stop; i++) {
        route_t from;
        zmq_msg_t p;
        int rc = loop__recv(rd, rd->admin, AUTH_ROLE_ADMIN, &from, &p);
        if (rc <= 0) {
            if (rc < 0)
                log_error("admin: %s", river_err_detail());
            return;
        }
        ProtobufCMessage *m = NULL;
        int e = RIVER_EPROTO;
        if (rc == 3)
            e = RIVER_EAUTH; /* a client or worker key: the reply says it is refused */
        else if (rc == 2)
            river_err_set(e, "frame: expected one AdminRequest frame after the routing id");
        else {
            e = frame_decode_msg(FRAME_ADMIN_REQUEST, &p, (size_t)rd->cfg.max_frame_bytes,
                                 &m);
            zmq_msg_close(&p);
        }
        if (e < 0) {
            rd->metrics.bad_frames++;
            River__Client__Error err;
            river__client__error__init(&err);
            frame_error_fill(&err, "", frame_error_code(e), river_err_detail());
            River__Admin__AdminReply r;
            river__admin__admin_reply__init(&r);
            r.kind_case = RIVER__ADMIN__ADMIN_REPLY__KIND_ERROR;
            r.error = &err;
            loop_send_admin(rd, &from, &r);
            continue;
        }
        admin_on_request(rd, &from, (River__Admin__AdminRequest *)m);
        frame_free(&m);
    }
}

/* SIGUSR1: the allocator's own account of riverd's heap (glibc's malloc_info XML: every
 * arena, what it holds from the system and what of that is free) on stderr, the log, so
 * that memory growth can be told apart into live allocations and fragmentation without
 * stopping the process under a debugger. */
static void loop__malloc_info(void)
{
    fprintf(stderr, "riverd: malloc_info at %lld ms\n", (long long)clock_now_ms());
    if (malloc_info(0, stderr) != 0)
        log_warn("malloc_info: %s", strerror(errno));
    fflush(stderr);
}

static void loop__on_signals(riverd_t *rd)
{
    struct signalfd_siginfo si;
    ssize_t n;
    while ((n = read(rd->sig_fd, &si, sizeof si)) == (ssize_t)sizeof si) {
        switch (si.ssi_signo) {
        case SIGHUP:
            rd->reload_pending = true;
            break;
        case SIGTERM:
        case SIGINT:
            /* The first asks for a drain; a second one means now. */
            if (rd->draining) {
                log_warn("signal %u during the drain: stopping now", si.ssi_signo);
                dispatch_fail_all(rd, RIVER__CLIENT__ERROR__CODE__CANCELLED,
                                  "riverd stopped");
                rd->stop = true;
            } else {
                riverd_begin_shutdown(rd, 0, si.ssi_signo == SIGTERM ? "SIGTERM" : "SIGINT");
            }
            break;
        case SIGCHLD:
            supervise_reap(rd);
            break;
        case SIGUSR1:
            loop__malloc_info();
            break;
        default:
            break;
        }
    }
    if (n < 0 && errno != EAGAIN && errno != EINTR)
        log_error("reading signals: %s", strerror(errno));
}

/* ---- The loop ---- */

/* All periodic work, in one place, in an order that lets each step see the effects of
 * the one before: reloads and restarts first, then worker liveness (which may put
 * requests back in the queue), then dispatch (deadlines and the queue), then the drain
 * and what systemd is told. */
static void loop__tick(riverd_t *rd, int64_t now)
{
    if (rd->reload_pending) {
        rd->reload_pending = false;
        const char *applied[64], *restart[64];
        int na = 0, nr = 0;
        if (reload_config(rd, applied, &na, restart, &nr, 64) < 0)
            log_error("reload: %s; keeping the running configuration", river_err_detail());
    }
    supervise_tick(rd, now);
    workers_tick(rd, now);
    dispatch_tick(rd, now);
    /* Frames queued for a client that stalled, or from a worker faster than this loop,
     * are freed once they move on, but glibc keeps the pages of a thread's arena (ZMQ's
     * I/O thread allocates every frame it receives) resident unless they are at its top.
     * Handing them back every so often keeps riverd's resident memory at what it uses
     * rather than at the highest it ever used; it costs a walk of the free lists. */
    if (now >= rd->next_trim_ms) {
        malloc_trim(0);
        rd->next_trim_ms = now + LOOP_TRIM_MS;
    }
    if (rd->draining) {
        if (rd->n_queued == 0 && rd->n_running == 0) {
            log_info("drain complete");
            rd->stop = true;
        } else if (rd->drain_deadline_ms && now >= rd->drain_deadline_ms) {
            log_warn("drain deadline passed with %d requests left; cancelling them",
                     rd->n_queued + rd->n_running);
            dispatch_fail_all(rd, RIVER__CLIENT__ERROR__CODE__CANCELLED,
                              "riverd shut down before the request finished");
            rd->stop = true;
        }
    }
    riverd_notify_status(rd, now, false);
}

static int64_t loop__next(riverd_t *rd, int64_t now)
{
    int64_t next = now + LOOP_MAX_WAIT_MS;
#define LOOP_MIN(t)                                                                     \
    do {                                                                                  \
        int64_t t_ = (t);                                                                 \
        if (t_ > 0 && t_ < next)                                                          \
            next = t_;                                                                    \
    } while (0)
    LOOP_MIN(workers_next_ms(rd, now));
    LOOP_MIN(dispatch_next_ms(rd, now));
    LOOP_MIN(supervise_next_ms(rd, now));
    int64_t h = http_timeout_ms(rd->http);
    if (h >= 0)
        LOOP_MIN(now + h);
    if (rd->watchdog_ms)
        LOOP_MIN(rd->next_watchdog_ms);
    LOOP_MIN(rd->next_status_ms);
    LOOP_MIN(rd->next_trim_ms);
    if (rd->draining)
        LOOP_MIN(rd->drain_deadline_ms);
#undef LOOP_MIN
    return next;
}

int loop_run(riverd_t *rd)
{
    /* Authentication watches up to four sockets of its own: zauth's log and the monitors
     * of the three ROUTER sockets. */
    enum { P_CLIENTS, P_WORKERS, P_SIGNALS, P_ADMIN, P_HTTP, P_AUTH, P_COUNT = P_AUTH + 4 };
    while (!rd->stop) {
        int64_t now = clock_now_ms();
        loop__tick(rd, now);
        if (rd->stop)
            break;
        int64_t wait = loop__next(rd, now) - now;
        if (wait < 0)
            wait = 0;

        zmq_pollitem_t items[P_COUNT];
        int kinds[P_COUNT], n = 0;
        memset(items, 0, sizeof items);
        items[n] = (zmq_pollitem_t){.socket = rd->clients, .events = ZMQ_POLLIN};
        kinds[n++] = P_CLIENTS;
        items[n] = (zmq_pollitem_t){.socket = rd->workers, .events = ZMQ_POLLIN};
        kinds[n++] = P_WORKERS;
        items[n] = (zmq_pollitem_t){.fd = rd->sig_fd, .events = ZMQ_POLLIN};
        kinds[n++] = P_SIGNALS;
        if (rd->admin) {
            items[n] = (zmq_pollitem_t){.socket = rd->admin, .events = ZMQ_POLLIN};
            kinds[n++] = P_ADMIN;
        }
        int hfd = http_fd(rd->http);
        if (hfd >= 0) {
            items[n] = (zmq_pollitem_t){.fd = hfd, .events = ZMQ_POLLIN};
            kinds[n++] = P_HTTP;
        }
        int auth_at = n, n_auth = auth_poll_items(rd->auth, items + n, P_COUNT - n);
        for (int i = 0; i < n_auth; i++)
            kinds[n++] = P_AUTH;
        int rc = zmq_poll(items, n, (long)wait);
        if (rc < 0) {
            if (zmq_errno() == EINTR)
                continue;
            return river_err_set(RIVER_ESYS, "zmq_poll: %s", zmq_strerror(zmq_errno()));
        }
        for (int i = 0; i < n; i++) {
            /* The HTTP server also has timeouts of its own; run it on every pass. */
            if (kinds[i] == P_HTTP) {
                http_run(rd->http);
                continue;
            }
            if (!(items[i].revents & ZMQ_POLLIN))
                continue;
            switch (kinds[i]) {
            case P_CLIENTS: loop__on_clients(rd); break;
            case P_WORKERS: loop__on_workers(rd); break;
            case P_SIGNALS: loop__on_signals(rd); break;
            case P_ADMIN: loop__on_admin(rd); break;
            default: break;
            }
        }
        if (n_auth)
            auth_on_poll(rd->auth, items + auth_at, n_auth);
    }
    return 0;
}
