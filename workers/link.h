/* The worker link: river-worker's side of proto/river_worker.proto.
 *
 * One ZMQ DEALER socket, its routing id the worker's id (with CURVE followed by random bytes,
 * new for each connection: see link.c), connects to riverd's ROUTER. The
 * link decodes riverd's DaemonMessage frames and hands each kind to a handler (a table
 * keyed by the oneof case), and encodes the worker's messages. It keeps the Paranoid
 * Pirate liveness of the zguide: a Heartbeat every interval (the interval and the
 * liveness riverd's Welcome gives, defaults until then), and when riverd has been silent
 * for `liveness` intervals the link drops every request (riverd has re-dispatched them or
 * forgotten them), closes the socket and, after a back-off that doubles up to a limit,
 * opens a new one and sends Ready again: a restarted riverd gets its workers back.
 *
 * Everything runs on the worker's one thread: link_recv and link_tick are called from the
 * poll loop, and the handlers run inside link_recv. */
#ifndef RIVER_WORKERS_LINK_H
#define RIVER_WORKERS_LINK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proto/river_worker.pb-c.h"

/* Most prefix page names one heartbeat carries. */
#define LINK_PREFIX_PAGES 64

/* Version of the worker link this worker speaks (Ready.protocol). */
#define LINK_PROTOCOL 1

typedef struct link link_t;

/* What heartbeats and Ready report about the worker's load. */
typedef struct link_status {
    uint32_t kv_pages_free;
    uint32_t queue_length; /* submitted, not running yet */
    uint32_t running;      /* sequences in the engine */
    bool draining;
    bool unavailable;      /* cannot run requests for now (Heartbeat.unavailable) */
    uint32_t prefix_cache_pages;
    uint64_t prefix_pages[LINK_PREFIX_PAGES]; /* Heartbeat.prefix_pages */
    size_t n_prefix_pages;
} link_status_t;

/* The worker behind the link. Every callback gets `user`. */
typedef struct link_handlers {
    void *user;
    void (*submit)(void *user, const River__Worker__Submit *m);
    void (*cancel)(void *user, uint64_t request_id);
    void (*drain)(void *user, uint32_t deadline_ms);
    /* riverd no longer knows this worker's requests (Reconnect, or it went silent): end
     * them all without a message. */
    void (*reset)(void *user, const char *why);
    void (*status)(void *user, link_status_t *st);
} link_handlers_t;

typedef struct link_config {
    const char *endpoint;   /* riverd's worker endpoint */
    const char *worker_id;  /* routing id and Ready.worker_id, 1..255 bytes */
    River__Worker__Role role;
    /* Capabilities sent with Ready (kv_pages_free is refreshed from status each time);
     * the link keeps its own copy of the strings of the configuration. */
    River__Worker__Capabilities caps;
    int64_t heartbeat_ms;   /* until riverd's Welcome names its own */
    int liveness;           /* silent intervals before riverd counts as gone */
    int64_t backoff_max_ms; /* longest wait before reconnecting (0: 5 s); each wait is
                             * jittered between half and all of the back-off */
    size_t max_frame_bytes; /* largest frame accepted (0: FRAME_MAX_BYTES_DEFAULT) */
    int linger_ms;          /* how long link_destroy waits for unsent frames */
    /* CurveZMQ: this worker's public and secret keys and riverd's public key, Z85 text
     * (copied); NULL: the NULL mechanism (riverd's auth.mode plain). */
    const char *curve_public, *curve_secret, *curve_server;
} link_config_t;

/* A link that is not connected yet. zctx is the process's ZMQ context. */
int link_new(link_t **out, void *zctx, const link_config_t *cfg, const link_handlers_t *h);
/* Connects and sends Ready (which asks the status handler for the free pages).
 * RIVER_ESYS when the socket cannot be made or the endpoint is malformed. */
int link_start(link_t *l);
/* Closes the socket, waiting up to linger_ms for frames not sent yet. */
void link_destroy(link_t **l);

/* The socket to poll for input; NULL while the link waits to reconnect. */
void *link_socket(const link_t *l);
/* Reads and handles the frames waiting (at most a batch, so that the engine is not
 * starved by a flood). */
void link_recv(link_t *l);
/* Heartbeats due, riverd's liveness, reconnection; a handshake riverd refused (the key)
 * is logged and the link backs off before it tries again. */
void link_tick(link_t *l, int64_t now);
/* When link_tick next has something to do (absolute, clock_now_ms). */
int64_t link_next_ms(const link_t *l);
/* Whether riverd welcomed this worker since its last Ready. */
bool link_welcomed(const link_t *l);

/* The worker's messages. A frame that cannot be sent is logged and dropped: the stream's
 * sequence numbers let riverd see the gap, and a link that stays broken is reset. */
/* logprobs: NULL, or one per id (a request that asked for them). */
int link_send_tokens(link_t *l, uint64_t request_id, uint64_t seq, uint32_t index,
                     const int32_t *ids, const int32_t *exit_layers, size_t n,
                     const char *text, River__Client__TokenLogprob **logprobs);
int link_send_done(link_t *l, uint64_t request_id, River__Client__Final *final);
/* request_id 0 answers a frame too broken to name a request. */
int link_send_failed(link_t *l, uint64_t request_id, River__Client__Error__Code code,
                     const char *message);
int link_send_heartbeat(link_t *l);

#endif
