/* The split pair: two river-worker processes on one host that serve one
 * model together, speaking proto/river_pair.proto over ZMQ ipc://.
 *
 * - role river: the shallow backbone layers (below the offload boundary B), the whole Exit
 *   River, the LM heads, the KV pool and the scheduler; it is the one riverd talks to.
 * - role backbone: the backbone layers from B on. It loads the same model but only ever
 *   reads layers >= B, so the other layers' pages of the mapped checkpoint are never
 *   resident (pair_release_weights drops what start-up touched).
 *
 * Both map one KV page pool. The river worker makes it (kv_pool_new_shared: a memfd) and
 * names it in PairHello by its pid and descriptor number; the backbone worker opens
 * /proc/<pid>/fd/<fd> and maps the same pages. /proc rather than SCM_RIGHTS: ZMQ sockets
 * cannot carry descriptors, and a second (unix) socket only for the handshake would be a
 * second connection to keep in step with the first; the pair runs on one host as one user,
 * which is exactly what /proc/<pid>/fd needs. The hello also carries everything the two
 * must agree on, and the backbone refuses it (PairError, with the reason) when anything
 * differs: the model's fingerprint, the boundary, the pool's geometry and dtype, the
 * backend and, where its kernels run on host threads, their count; the transport
 * (workers/pair_transport.h, which takes the devices the two name into account).
 *
 * Each backbone layer >= B that a batch needs is one LayerRequest: the river worker's
 * forward pass (forward_set_remote, pair_river_remote) sends the rows' positions and page
 * tables, hands their hidden states over through the pair's transport
 * (workers/pair_transport.h: inline bytes over ZMQ on the CPU, NCCL or peer copies between
 * devices) and waits for the LayerReply; the backbone runs forward_layer_rows (or
 * forward_layer_rows_dev on a device transport), which writes the K/V of those positions
 * straight into the shared pool, and hands the states back. The river side then goes on
 * with its exit decision.
 *
 * Bit-exactness: the backbone runs the kernels the full worker would run, on the same rows
 * in the same order, and hidden states cross as raw f32 bytes, so a pair gives the tokens
 * of one role-full worker bit for bit, provided both processes run the same backend at
 * the same SIMD level with the same thread count (checked in the hello: the work split
 * among threads may change the order of additions in a kernel; a GPU backend counts no
 * host threads, and its count is not compared).
 *
 * Liveness: the river worker pings while idle; each side counts the other gone after
 * `liveness` silent heartbeat intervals, or at once when the other's process ends (each
 * watches the other's pid through a pidfd). The river side then fails every step that
 * needs a layer >= B with RIVER_EUNAVAILABLE (UNAVAILABLE for riverd, which continues the
 * request on another worker from the tokens the client has), refuses new requests the same
 * way, tells riverd in a heartbeat that it cannot serve (Heartbeat.unavailable, sent at
 * once by workers/main.c, so that riverd sends it nothing meanwhile), and says hello again
 * until the backbone is back. The backbone side drops the session (unmaps the pool) and
 * waits for a new hello.
 *
 * Why fail rather than finish the tokens on the Exit River: the river is a 4-bit
 * approximation of the deep layers, so a token that needs them would come out different
 * from the model's (and from what a full worker or a later retry gives), the K/V it writes
 * past the boundary would be approximate for every later token too, and on a GPU pair the
 * river worker may not hold the deep layers at all. An explicit UNAVAILABLE, which riverd
 * turns into a continuation on a worker that has the whole model, keeps every completion
 * exact; with no such worker the client gets the error instead of a silently degraded
 * completion.
 *
 * Everything runs on the worker's one thread: the poll loop polls the items a side
 * gives, calls on_poll and tick; only pair_river_remote's run waits on the socket inside
 * an engine step, for the reply it needs. */
#ifndef RIVER_WORKERS_PAIR_H
#define RIVER_WORKERS_PAIR_H

#include <stdbool.h>
#include <stdint.h>

#include <zmq.h>

#include "engine/forward.h"
#include "engine/kv_pool.h"
#include "model/model.h"
#include "kernels/ops.h"

/* Version of the pair protocol (PairHello.protocol). */
#define PAIR_PROTOCOL 1
/* Poll items a side may ask for: its socket and the peer's pidfd. */
#define PAIR_POLL_ITEMS 2

/* The backend as the hello names it ("cpu-avx512"): the same kernels on both sides. */
const char *pair_backend_name(const backend_t *be);

/* Drops the resident pages of the backbone matrices of layers [begin, end) (and of the
 * embedding and LM head when `ends`): pages of the mapped checkpoint that start-up
 * touched (fingerprints read samples of every tensor) but this process never computes
 * with. Read-only file pages come back from the file if anything reads them again. */
void pair_release_weights(const model_t *m, int begin, int end, bool ends);

/* Bytes of the model's weights resident in this process: its checkpoint mapping and the
 * backend's host copies (from /proc/self/smaps), or a negative river_err code. */
int64_t pair_model_resident_bytes(const model_t *m);

/* ---- The river side ---- */

typedef struct pair_river pair_river_t;

typedef struct pair_river_config {
    const char *endpoint;      /* the backbone worker's split.peer */
    const char *river_id;      /* this worker's id, for the backbone's logs */
    int boundary;              /* split.boundary */
    const char *fingerprint;   /* model_fingerprint of the model */
    const char *backend;       /* pair_backend_name */
    int threads;               /* the backend's threads */
    int max_rows;              /* rows of the largest forward batch */
    int64_t heartbeat_ms;
    int liveness;
    int64_t reply_timeout_ms;  /* longest wait for one LayerReply before the peer is gone */
    int64_t backoff_max_ms;    /* longest wait between two hellos */
    int transport;             /* pair_transport_kind_t; auto: what the backend asks for,
                                  with p2p offered beside nccl for a backbone on this
                                  worker's GPU */
    backend_t *be;             /* where the hidden states live; NULL: the model's backend */
} pair_river_config_t;

/* kv is the shared pool and memfd its descriptor (kv_pool_new_shared); both must outlive
 * the pair. Nothing is sent before the first pair_river_tick. */
int pair_river_new(pair_river_t **out, void *zctx, const pair_river_config_t *cfg,
                   const model_t *m, kv_pool_t *kv, int memfd);
void pair_river_destroy(pair_river_t **p);

/* The remote for forward_set_remote: layers >= boundary through the peer. Its run fails
 * with RIVER_EUNAVAILABLE while the pair is not ready or when the peer goes away. */
void pair_river_remote(pair_river_t *p, fwd_remote_t *r);

/* Paired: the backbone accepted the hello and is alive as far as this side knows. */
bool pair_river_ready(const pair_river_t *p);
/* The backbone refused the first hello (a configuration mismatch that retrying cannot
 * mend); pair_river_refusal says why. */
bool pair_river_refused(const pair_river_t *p);
const char *pair_river_refusal(const pair_river_t *p);

/* Fills items (PAIR_POLL_ITEMS entries) with what to poll for input; returns how many. */
int pair_river_poll_items(pair_river_t *p, zmq_pollitem_t *items);
/* Handles what the poll found in those items. */
void pair_river_on_poll(pair_river_t *p, const zmq_pollitem_t *items, int n, int64_t now);
/* Hellos, pings, the peer's liveness. */
void pair_river_tick(pair_river_t *p, int64_t now);
/* When pair_river_tick next has something to do (absolute, clock_now_ms). */
int64_t pair_river_next_ms(const pair_river_t *p);
/* Layer round trips so far and the seconds they took, wire and backbone compute. */
void pair_river_stats(const pair_river_t *p, int64_t *trips, double *seconds);

/* ---- The backbone side ---- */

typedef struct pair_backbone pair_backbone_t;

typedef struct pair_backbone_config {
    const char *endpoint;      /* split.peer, bound here */
    int boundary;              /* split.boundary: the first layer this side runs */
    const char *fingerprint;   /* model_fingerprint of the model */
    const char *backend;       /* pair_backend_name */
    int threads;               /* the backend's threads */
    int transport;             /* pair_transport_kind_t a hello must ask for; auto: what the
                                  backend asks for, and p2p instead of nccl with a river
                                  on this worker's GPU */
    dtype_t kv_dtype;          /* the KV pool's element type a hello must offer: this
                                  worker's kv.dtype (gen_kv_dtype) */
} pair_backbone_config_t;

/* Binds the endpoint. m and be must outlive the pair. */
int pair_backbone_new(pair_backbone_t **out, void *zctx, const pair_backbone_config_t *cfg,
                      const model_t *m, backend_t *be);
void pair_backbone_destroy(pair_backbone_t **p);

int pair_backbone_poll_items(pair_backbone_t *p, zmq_pollitem_t *items);
/* Answers hellos, layer requests and pings; notices a river that exited. */
void pair_backbone_on_poll(pair_backbone_t *p, const zmq_pollitem_t *items, int n,
                           int64_t now);
/* The river's liveness. */
void pair_backbone_tick(pair_backbone_t *p, int64_t now);
int64_t pair_backbone_next_ms(const pair_backbone_t *p);
bool pair_backbone_paired(const pair_backbone_t *p);

#endif
