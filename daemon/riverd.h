/* riverd, the River router daemon: the records every part of it shares.
 *
 * riverd owns no model math. It keeps a table of workers, a queue of
 * requests and the map from requests to the workers running them, and moves frames
 * between three ZMQ ROUTER sockets: clients, workers and the admin endpoint. Everything
 * runs on one thread in one poll loop (loop.c), so none of these records needs a lock.
 *
 * Files, by responsibility:
 *   main.c       command line, start-up, systemd notification, shutdown
 *   loop.c       sockets, signals, the poll loop and its timers, frame I/O
 *   workers.c    the worker table: Ready, heartbeats both ways, liveness, drain
 *   dispatch.c   admission, the queue, session affinity, deadlines, streaming, re-dispatch
 *   admin.c      the admin API (a table of commands)
 *   auth.c       CurveZMQ: zauth for the handshakes, the role of every message
 *   reload.c     SIGHUP and admin Reload: what changes live and what needs a restart
 *   metrics.c    counters, Prometheus text, the HTTP endpoint (libmicrohttpd)
 *   supervise.c  local workers: fork/exec, restart with back-off, scale
 *   hmap.c       the hash map of requests and peers (the log is common/log.c) */
#ifndef RIVER_DAEMON_RIVERD_H
#define RIVER_DAEMON_RIVERD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/config.h"
#include "common/frame.h"
#include "common/log.h"
#include "common/prefix_hash.h"
#include "daemon/hmap.h"

#define RIVERD_VERSION "0.1.0"
/* Worker link version riverd speaks (Ready.protocol). */
#define RIVERD_LINK_PROTOCOL 1
/* A peer's network address as ZMQ reports it (an IPv6 address and a scope fit). */
#define RIVERD_PEER_MAX 64
/* ZMQ routing ids are at most 255 bytes. */
#define RIVERD_ROUTE_MAX 255
/* Longest Generate.tenant and Generate.cache_salt riverd takes. */
#define RIVERD_TENANT_MAX 128
/* Dispatches of one request before riverd gives up on it with UNAVAILABLE. */
#define RIVERD_MAX_ATTEMPTS 4
/* Exit layers the metrics histogram tells apart; deeper exits share the last bucket. */
#define RIVERD_EXIT_HIST 128
/* Seconds over which tokens/s is averaged. */
#define RIVERD_RATE_WINDOW 10

typedef struct riverd riverd_t;
typedef struct worker worker_t;
typedef struct request request_t;
typedef struct supervise supervise_t;
typedef struct http http_t;
typedef struct auth auth_t;

/* Where a peer is: its routing id on a ROUTER socket, and whether it talks through a REQ
 * socket, whose frames carry an empty delimiter before the payload. */
typedef struct route {
    uint8_t id[RIVERD_ROUTE_MAX];
    uint8_t len;
    bool delim;
    /* The peer's CURVE public key (Z85, 40 characters) as its handshake authenticated it;
     * empty in plain mode. One key may hold several connections. */
    char key[41];
    /* The tenant a client request is for (Generate.tenant), set by dispatch at admission
     * so that the per-client limits count per key and tenant; empty elsewhere. */
    char tenant[RIVERD_TENANT_MAX + 1];
} route_t;

/* ---- Workers (workers.c) ---- */

typedef enum {
    WORKER_READY = 0, /* takes requests */
    WORKER_DRAINING,  /* finishes what it has, takes nothing new */
    WORKER_DEAD,      /* missed its heartbeats or its process ended; kept for display */
} worker_state_t;

typedef struct worker_caps {
    char model[128];
    uint32_t max_batch, max_seqs, kv_page_size, kv_pages_total, n_layers;
    uint32_t layer_begin, layer_end, max_context;
    bool has_river;
    uint64_t prefix_seed;   /* 0: no prefix cache */
    prefix_key_t prefix_key; /* the secret of its page names (Capabilities.prefix_key) */
} worker_caps_t;

/* Most prefix page names riverd keeps per worker (Heartbeat.prefix_pages). */
#define RIVERD_PREFIX_PAGES 64

struct worker {
    route_t route;
    char id[128];           /* Ready.worker_id */
    char peer[RIVERD_PEER_MAX]; /* address its connection comes from; "" over ipc:// */
    uint64_t serial;        /* unique per entry, never reused (pointers may be) */
    int role;               /* River__Worker__Role */
    worker_caps_t caps;
    worker_state_t state;
    /* What the last heartbeat said. */
    uint32_t kv_pages_free, queue_length, running;
    bool reported_draining;
    /* It said it cannot serve for now (a river worker whose backbone peer is gone): it
     * gets no requests until a heartbeat says otherwise. */
    bool reported_unavailable;
    int64_t last_seen_ms;   /* anything heard from it */
    int64_t last_sent_ms;   /* anything sent to it */
    int64_t state_since_ms;
    int64_t drain_deadline_ms; /* riverd takes back what is left then; 0: none */
    bool unreachable;       /* a send failed: its connection is gone */
    /* Requests riverd sent it and that have not ended, linked through request.w_next. */
    request_t *reqs;
    int assigned;
    int slot;               /* supervisor slot, -1: not started by riverd */
    uint64_t tokens;        /* tokens it generated for clients */
    /* Its prefix cache as the last heartbeat said: pages, and names of cached pages. */
    uint32_t prefix_cache_pages;
    uint64_t prefix_pages[RIVERD_PREFIX_PAGES];
    int n_prefix_pages;
};

/* The table entry of the worker at that route, NULL when none. */
worker_t *workers_by_route(riverd_t *rd, const route_t *r);
worker_t *workers_by_id(riverd_t *rd, const char *id);
/* Handles one frame from a worker (a table of message kinds). Takes env. peer: the
 * address the frame's connection comes from ("" when ZMQ has none). */
void workers_on_message(riverd_t *rd, const route_t *from, const char *peer,
                        River__Worker__WorkerMessage *env);
/* Heartbeats out, liveness in, drain deadlines, forgetting the dead. */
void workers_tick(riverd_t *rd, int64_t now);
int64_t workers_next_ms(riverd_t *rd, int64_t now);
/* Removes an entry; what it still had goes back to the queue first. */
void workers_forget(riverd_t *rd, worker_t *w);
/* Declares a worker dead: its requests go back to the queue (re-dispatch). */
void workers_mark_dead(riverd_t *rd, worker_t *w, const char *why);
/* Starts draining a worker; deadline_ms 0 uses the configured drain_timeout. */
int workers_drain(riverd_t *rd, worker_t *w, uint32_t deadline_ms);
/* Whether the worker takes new requests (ready, and of a role that serves clients). */
bool workers_takes_work(const worker_t *w);
/* Counts by state; `dispatchable`: READY ones that serve clients. */
void workers_count(riverd_t *rd, int *ready, int *draining, int *dead, int *dispatchable);
uint64_t workers_kv_pages_free(riverd_t *rd);
void workers_destroy_all(riverd_t *rd);

/* ---- Requests (dispatch.c) ---- */

typedef enum {
    REQ_QUEUED = 0, /* waiting for a worker */
    REQ_RUNNING,    /* submitted to `worker` */
} req_state_t;

struct request {
    uint64_t id;            /* riverd's number for it (logs, deadlines) */
    /* The id of its current dispatch on the worker link, 0 while queued. Every dispatch
     * gets a fresh one, so that a late message of an earlier dispatch (from a worker that
     * was declared dead but was only slow, say) is never taken for the current one. */
    uint64_t link_id;
    route_t client;
    const char *rid;        /* the client's request_id (inside env) */
    River__Client__ClientRequest *env; /* the decoded frame, owns gen */
    River__Client__Generate *gen;
    uint32_t max_tokens;    /* after riverd's limit */
    req_state_t state;
    worker_t *worker;       /* REQ_RUNNING: where it runs */
    request_t *w_prev, *w_next; /* on the worker's list */
    request_t *q_prev, *q_next; /* in the queue */
    /* Tokens the client has, in order; a re-dispatch sends them as delivered_ids. */
    int32_t *delivered;
    uint32_t n_delivered, cap_delivered;
    uint64_t next_seq;      /* TokenChunk.seq of the next chunk to the client */
    int64_t received_ms, deadline_ms, first_token_ms;
    int attempts;           /* dispatches so far */
    uint64_t avoid_serial;  /* worker that refused it last; 0: none */
    bool cancelled;         /* the client sent Cancel */
};

int dispatch_init(riverd_t *rd);
void dispatch_fini(riverd_t *rd);
/* Handles one client frame (a table of request kinds). Takes env. */
void dispatch_on_client(riverd_t *rd, const route_t *from, River__Client__ClientRequest *env);
void dispatch_on_tokens(riverd_t *rd, worker_t *w, const River__Worker__Tokens *t);
void dispatch_on_done(riverd_t *rd, worker_t *w, const River__Worker__Done *d);
void dispatch_on_failed(riverd_t *rd, worker_t *w, const River__Worker__Failed *f);
/* Takes every request off w and queues it again at the front (in order), for another
 * worker to continue from the tokens already delivered; a live w is told to Cancel
 * them. A request that was cancelled by its client ends, and one dispatched
 * RIVERD_MAX_ATTEMPTS times fails with UNAVAILABLE. */
void dispatch_requeue_worker(riverd_t *rd, worker_t *w, const char *why);
/* Sessions bound to w lose their binding. */
void dispatch_forget_worker(riverd_t *rd, worker_t *w);
/* Deadlines, the no-worker timer, and the dispatch pass when something changed. */
void dispatch_tick(riverd_t *rd, int64_t now);
int64_t dispatch_next_ms(riverd_t *rd, int64_t now);
/* Ends every queued request with that error (shutdown). */
void dispatch_fail_queued(riverd_t *rd, River__Client__Error__Code code, const char *why);
/* Ends every request, queued or running, with that error (last moment of shutdown). */
void dispatch_fail_all(riverd_t *rd, River__Client__Error__Code code, const char *why);

/* ---- Supervision of local workers (supervise.c) ---- */

int supervise_new(riverd_t *rd, supervise_t **out);
/* Sends SIGTERM to every child and waits up to wait_ms for them, then SIGKILL. */
void supervise_destroy(riverd_t *rd, supervise_t **s, int64_t wait_ms);
/* Reaps children (SIGCHLD); a worker whose process ended is dead at once. */
void supervise_reap(riverd_t *rd);
void supervise_tick(riverd_t *rd, int64_t now);
int64_t supervise_next_ms(riverd_t *rd, int64_t now);
/* Links a worker that just sent Ready to the slot that started it, if any. */
void supervise_on_ready(riverd_t *rd, worker_t *w);
/* The worker entry goes away: unlink it from its slot. */
void supervise_on_forget(riverd_t *rd, worker_t *w);
/* Kills the process of a supervised worker that stopped answering; it is restarted. */
void supervise_kill(riverd_t *rd, worker_t *w);
/* Sets the number of local workers; *previous receives the old target. */
int supervise_scale(riverd_t *rd, int target, int *previous);
/* Slots whose process runs but has not sent Ready: admin lists them as STARTING. */
int supervise_starting(riverd_t *rd, const char **ids, int max);
int supervise_target(riverd_t *rd);
/* Whether some supervised process exists (running or about to be restarted). */
bool supervise_expecting(riverd_t *rd);

/* ---- Metrics (metrics.c) ---- */

/* Outcomes of requests: Final reasons first, then Error codes. */
#define METRICS_OUTCOME_ERROR 8
#define METRICS_OUTCOMES (METRICS_OUTCOME_ERROR + 8)

typedef struct metrics {
    uint64_t outcomes[METRICS_OUTCOMES];
    uint64_t requests_total, requests_failed;
    uint64_t tokens_total;
    uint64_t redispatched;
    uint64_t worker_deaths;
    uint64_t stale_messages;  /* from dead or unknown workers, dropped */
    uint64_t bad_frames;
    uint64_t exit_hist[RIVERD_EXIT_HIST];
    uint64_t exit_sum, exit_count;
    /* Lossless mode, from the workers' Final.exit_stats (vLLM's names). */
    uint64_t spec_drafts, spec_draft_tokens, spec_accepted_tokens;
    /* Tokens per second of monotonic time, a ring of the last seconds. */
    uint64_t rate[RIVERD_RATE_WINDOW];
    int64_t rate_second[RIVERD_RATE_WINDOW];
    /* Time to first token, seconds, cumulative buckets. */
    uint64_t ttft_buckets[12];
    double ttft_sum;
    uint64_t ttft_count;
    /* Prefix cache, from the workers' Final.usage. */
    uint64_t prefix_hit_tokens, prefix_query_tokens;
} metrics_t;

void metrics_on_final(riverd_t *rd, River__Client__Final__Reason reason);
/* Adds a worker's Final.exit_stats (lossless counts) to the totals; xs may be NULL. */
void metrics_on_exit_stats(riverd_t *rd, const River__Client__ExitStats *xs);
void metrics_on_error(riverd_t *rd, River__Client__Error__Code code);
void metrics_on_tokens(riverd_t *rd, size_t n, const int32_t *exit_layers, size_t n_exit,
                       int64_t now);
void metrics_on_first_token(riverd_t *rd, double seconds);
double metrics_tokens_per_s(riverd_t *rd, int64_t now);
/* The Prometheus text exposition; malloc'd. */
char *metrics_render(riverd_t *rd, size_t *len);
/* The HTTP endpoint (/metrics, /health, /ready), served from the poll loop. */
int http_start(riverd_t *rd, http_t **out);
void http_stop(http_t **h);
/* Its epoll descriptor for the poll loop, -1 when off. */
int http_fd(http_t *h);
void http_run(http_t *h);
/* Milliseconds until the server wants to run again; -1: no timer. */
int64_t http_timeout_ms(http_t *h);

/* ---- Admin (admin.c) and reload (reload.c) ---- */

void admin_on_request(riverd_t *rd, const route_t *from, River__Admin__AdminRequest *req);
/* Re-reads the configuration file. applied and needs_restart receive key names
 * (static strings), at most max each. RIVER_ECONFIG leaves everything as it was. */
int reload_config(riverd_t *rd, const char **applied, int *n_applied,
                  const char **needs_restart, int *n_restart, int max);

/* ---- Authentication (auth.c) ---- */

/* What a key may be; the endpoint a message came in on needs its role. */
enum {
    AUTH_ROLE_CLIENT = 1, /* auth.clients */
    AUTH_ROLE_WORKER = 2, /* auth.workers */
    AUTH_ROLE_ADMIN = 4,  /* auth.admin */
};

/* Reads riverd's key and the allowed keys of the configuration (nothing with auth.mode
 * plain). RIVER_ECONFIG names the configuration file, the key and what is wrong with the
 * file or directory it names. config_path: where relative key paths start. */
int auth_new(auth_t **out, const char *config_path, const config_riverd_t *cfg);
void auth_destroy(auth_t **a);
bool auth_plain(const auth_t *a);
/* One line for the log: the mode, riverd's public key and how many keys each role has. */
void auth_describe(const auth_t *a, char *buf, size_t cap);
/* The ZMQ context of riverd's sockets: CZMQ's, because zauth runs there and serves only
 * the sockets of its own context. NULL when it cannot be made. */
void *auth_open_context(void);
/* Terminates it, after every socket is closed. */
void auth_close_context(void);
/* Starts the ZAP handler on zctx, CZMQ's context, before any socket binds. */
int auth_start(auth_t *a, void *zctx);
/* Makes sock a CURVE server with riverd's key and watches its handshakes; before bind. */
int auth_secure_socket(auth_t *a, void *zctx, void *sock, int role, const char *what);
/* The sockets the poll loop watches for auth (refusals to log); at most max. */
int auth_poll_items(auth_t *a, zmq_pollitem_t *items, int max);
void auth_on_poll(auth_t *a, const zmq_pollitem_t *items, int n);
/* Whether the first frame of a message (after the routing id) comes from a key of that role;
 * RIVER_EAUTH (logged, at most every few seconds per key) when not. */
int auth_check(auth_t *a, int role, zmq_msg_t *m);
/* Handshakes refused (key not allowed, no CURVE) and messages refused (a key of another
 * role) on the endpoint of that role, for the metrics. */
uint64_t auth_refused(const auth_t *a, int role);
/* Closes what auth_start and auth_secure_socket opened; after riverd's own sockets. */
void auth_stop(auth_t *a);

/* ---- The process (loop.c, main.c) ---- */

struct riverd {
    const char *config_path;
    config_riverd_t cfg;
    void *zctx;                      /* CZMQ's context: zauth serves only its sockets */
    void *clients, *workers, *admin; /* ROUTER sockets */
    auth_t *auth;
    /* The worker endpoint as a local worker connects to it (wildcards resolved). */
    char worker_endpoint[256];
    int sig_fd;
    int64_t started_ms;

    /* The worker table (workers.c). */
    worker_t **table;
    int n_table, cap_table;
    hmap_t *by_route;
    uint64_t worker_serial;

    /* Requests (dispatch.c). */
    hmap_t *req_by_id, *req_by_link, *req_by_client, *sessions;
    /* Per client (dispatch__client_identity): requests in flight plus ends owed. */
    hmap_t *client_load;
    /* Ends of requests (Final or Error frames) a client was not reading when they were
     * due; sent again on a timer until they go through (dispatch.c). */
    struct dispatch_owed *owed_head, *owed_tail;
    int n_owed;
    int64_t next_owed_ms;
    request_t *queue_head, *queue_tail;
    int n_queued, n_running;
    uint64_t next_req_id, next_link_id;
    struct dispatch_deadline *heap;
    size_t n_heap, cap_heap;
    bool pump;                  /* a dispatch pass is due */
    int64_t no_worker_since_ms; /* since when no worker could serve; 0: one can */
    int64_t next_session_sweep_ms;

    supervise_t *sup;
    metrics_t metrics;
    http_t *http;

    /* Shutdown: drain, then leave. */
    bool draining;
    int64_t drain_deadline_ms;
    bool stop;
    bool reload_pending;

    /* systemd (main.c). */
    uint64_t watchdog_ms;       /* 0: no watchdog */
    int64_t next_watchdog_ms;
    int64_t next_status_ms;
    char status[256];
    int64_t next_trim_ms;       /* next malloc_trim (loop.c) */
};

/* Sends to a client; RIVER_EIO when the client is gone, RIVER_EFULL when it is not reading
 * (limits.max_client_backlog replies wait for it already). */
int loop_send_client(riverd_t *rd, const route_t *to, const River__Client__ClientReply *r);
/* The same for a ClientReply already encoded (a reply owed to a slow client). */
int loop_send_client_frame(riverd_t *rd, const route_t *to, const void *frame, size_t len);
/* Sends an Error reply; NULL rid reads as "". */
int loop_send_error(riverd_t *rd, const route_t *to, const char *rid,
                      River__Client__Error__Code code, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
int loop_send_worker(riverd_t *rd, worker_t *w, const River__Worker__DaemonMessage *m);
/* Sends to a worker route that may have no table entry (Reconnect). */
int loop_send_route(riverd_t *rd, const route_t *to, const River__Worker__DaemonMessage *m);
int loop_send_admin(riverd_t *rd, const route_t *to, const River__Admin__AdminReply *r);
int loop_open(riverd_t *rd);
void loop_close(riverd_t *rd);
int loop_run(riverd_t *rd);

/* main.c: systemd notification and the start of a full drain. */
void riverd_notify_status(riverd_t *rd, int64_t now, bool force);
void riverd_begin_shutdown(riverd_t *rd, uint32_t deadline_ms, const char *why);

#endif
