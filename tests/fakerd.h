/* A fake riverd for the suites that run river-worker as a process (test_worker,
 * test_split): riverd's end of the worker link, a ZMQ ROUTER that the test drives by hand
 * (answering Ready with Welcome, sending heartbeats while it waits, as riverd does), and
 * the requests riverd sends over it. With it a test sees every message the worker sends,
 * in order, which riverd itself would hide behind its client protocol. */
#ifndef RIVER_TESTS_FAKERD_H
#define RIVER_TESTS_FAKERD_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/frame.h"

/* One worker process and riverd's end of its link. */
typedef struct wk {
    pid_t pid;
    void *ctx, *router;
    uint8_t route[256];   /* the worker's routing id, from its first frame */
    size_t route_len;
    int hb_ms;            /* riverd's heartbeat once Welcome was sent; 0: none yet */
    int silent;           /* 1: riverd sends no heartbeats (the worker should give up) */
    int64_t last_sent_ms;
    /* What the worker's heartbeats said last, and how many came. */
    int heartbeats;
    River__Worker__Heartbeat last_hb; /* prefix_pages point into hb_prefix_pages */
    uint64_t hb_prefix_pages[64];
    River__Worker__Capabilities caps; /* from Ready (model string not kept; prefix_key
                                         points into prefix_key) */
    uint8_t prefix_key[16];
} wk_t;

/* Writes yaml to the file `name` under the test's directory and starts river-worker on
 * it, with --id id when id is not NULL; log and env as for test_spawn. */
pid_t wk_spawn(const char *name, const char *yaml, const char *id, const char *log,
               const char *const *env);

/* Binds riverd's end on a fresh ipc:// endpoint under the test's directory and starts
 * worker "w1" on `model` with max_seqs, a batch of 64 rows, prefill chunks of 32, plain
 * auth and then `extra` YAML (may be NULL); its log level is $WORKER_LOG, else warn.
 * Returns its Ready message, after w->caps took its capabilities, for the caller to check
 * and free before it welcomes the worker. mandatory sets ZMQ_ROUTER_MANDATORY: a send to
 * a worker that is not connected then fails its check instead of vanishing. */
River__Worker__WorkerMessage *wk_launch(wk_t *w, const char *model, int max_seqs,
                                        const char *extra, int mandatory);
/* Sends Welcome with riverd's heartbeat interval and liveness; from then on wk_recv sends
 * riverd's heartbeats every hb_ms. */
void wk_welcome(wk_t *w, int hb_ms, int liveness);
/* Kills the worker (when it runs) and closes riverd's end. */
void wk_stop(wk_t *w);
/* The worker's exit code within timeout_ms (then w->pid is 0), -1 while it still runs. */
int wk_wait_exit(wk_t *w, int timeout_ms);

/* Sends len bytes as one message to the worker, after one more frame "x" when more_parts
 * (a malformed message, for tests of the worker's checks). */
void wk_send_raw(wk_t *w, const void *data, size_t len, int more_parts);
void wk_send(wk_t *w, River__Worker__DaemonMessage *m);
/* A heartbeat to a worker that may have exited already: a failed send is fine. */
void wk_send_heartbeat(wk_t *w);
/* The next message from the worker within timeout_ms, decoded (frame_free it); NULL on
 * timeout. Sends riverd's heartbeats meanwhile, as riverd would, and counts the worker's. */
River__Worker__WorkerMessage *wk_recv(wk_t *w, int timeout_ms);
/* The next message of that kind, skipping heartbeats; fails on anything else. */
River__Worker__WorkerMessage *wk_expect(wk_t *w, River__Worker__WorkerMessage__KindCase kind,
                                        int timeout_ms);

/* ---- Requests ---- */

typedef struct req {
    uint64_t id;
    const char *text;        /* text prompt, or */
    const int32_t *ids;      /* token ids */
    size_t n_ids;
    uint32_t max_tokens;
    uint32_t deadline_ms;
    const int32_t *delivered;
    size_t n_delivered;
    int ignore_eos;
    int bad_count;           /* tokens_delivered disagrees with the ids sent */
    const char *exit_policy; /* per-request exit override: rule name, or NULL */
    int exit_layer;          /* per-request fixed exit layer, 0: none */
    int lossless;            /* 1: ask for lossless mode, -1: ask for lossy, 0: the worker's */
    uint32_t draft_tokens;   /* lossless: draft length, 0: the worker's */
} req_t;

void wk_submit(wk_t *w, const req_t *q);
void wk_cancel(wk_t *w, uint64_t id);
void wk_drain(wk_t *w, uint32_t deadline_ms);

#endif
