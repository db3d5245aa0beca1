/* How the split pair's hidden states cross between the two processes (workers/pair.h):
 * the rows' residual stream entering a backbone layer, from the river side to the backbone
 * side, and the stream after it back.
 *
 * The LayerRequest/LayerReply frames always carry the layer, positions and page tables over
 * ZMQ; a transport moves the (n, dim) f32 states themselves:
 * - zmq: inline in the frames' `hidden` bytes, from host memory (the CPU pair).
 * - nccl: ncclSend/ncclRecv of the backend's device buffers over a two-rank communicator
 *   (river rank 0, backbone rank 1), set up in the hello with an ncclUniqueId the river
 *   side makes (the backend's peer link, kernels/backend.h). CUDA builds only.
 * - p2p: copies on the backend into a staging buffer that the river side makes with
 *   ops->shared_alloc and the backbone maps with ops->shared_map, as the KV pool is shared:
 *   cudaIpc memory written by peer copies on GPUs, a memfd on the CPU and the opaque test
 *   backend (which is how this device path is tested without a GPU).
 *
 * Which one a pair uses is the worker YAML's split.transport (auto|zmq|nccl|p2p). auto asks
 * the backend (backend_info.handoff), never its name: zmq on host memory, nccl on devices
 * where NCCL is built, p2p otherwise, and p2p too when both workers are on one device
 * (the same backend_info.uuid), since NCCL cannot join two ranks on one GPU. The river
 * side names its kind in PairHello, with its device's uuid; where its auto comes to nccl
 * it offers p2p beside it, not knowing yet where the backbone is. The backbone side takes
 * the kind of its own that the river offers (pair_transport_choose) and refuses the hello
 * otherwise, since the two would not meet, and refuses an explicit nccl on one GPU.
 *
 * Each side holds one transport per pairing; everything runs on the worker's one thread. */
#ifndef RIVER_WORKERS_PAIR_TRANSPORT_H
#define RIVER_WORKERS_PAIR_TRANSPORT_H

#include <stdbool.h>

#include "kernels/ops.h"
#include "proto/river_pair.pb-c.h"

/* In the order of split.transport's names (workers/config_schema.c) and PairHello.transport. */
typedef enum {
    PAIR_TRANSPORT_AUTO = 0, /* configuration only: what the backend asks for */
    PAIR_TRANSPORT_ZMQ,
    PAIR_TRANSPORT_NCCL,
    PAIR_TRANSPORT_P2P,
    PAIR_TRANSPORT_COUNT
} pair_transport_kind_t;

/* NCCL ranks. */
typedef enum { PAIR_SIDE_RIVER = 0, PAIR_SIDE_BACKBONE = 1 } pair_side_t;

typedef struct pair_transport pair_transport_t;

/* "auto", "zmq", "nccl", "p2p"; "?" for anything else. */
const char *pair_transport_name(int kind);

/* The kind a configured kind comes to on backend be: itself, or for auto the one the
 * backend asks for (zmq when be is NULL). */
pair_transport_kind_t pair_transport_resolve(pair_transport_kind_t want, const backend_t *be);

/* The kind a river side configured for want on be also offers in case the backbone is on
 * its device: p2p where auto comes to nccl, else PAIR_TRANSPORT_AUTO (nothing more). */
pair_transport_kind_t pair_transport_fallback(pair_transport_kind_t want, const backend_t *be);

/* The backbone side's choice for a hello: want is its split.transport as configured (auto
 * kept), be its backend; offered and alt the hello's transport and transport_alt (zmq for
 * 0 in offered, nothing for 0 in alt); peer_uuid the hello's device_uuid. *out: the kind
 * both take. RIVER_EINVAL with a sentence for both logs when the two would not meet, or
 * when either side's split.transport is nccl and both are on one device (naming it). */
int pair_transport_choose(pair_transport_kind_t want, const backend_t *be,
                          pair_transport_kind_t offered, pair_transport_kind_t alt,
                          const char *peer_uuid, pair_transport_kind_t *out);

/* A transport of a resolved kind for n rows of dim floats at most, on be (which must
 * outlive it). RIVER_EUNSUPPORTED for nccl in a build without CUDA, or p2p on a backend
 * that cannot share memory. On failure *out is untouched. */
int pair_transport_new(pair_transport_t **out, pair_transport_kind_t kind, pair_side_t side,
                       backend_t *be, int dim, int max_rows);
void pair_transport_destroy(pair_transport_t **t);

pair_transport_kind_t pair_transport_kind(const pair_transport_t *t);
/* Whether put and get take the backend's buffers (else host f32 memory). */
bool pair_transport_on_device(const pair_transport_t *t);

/* River side, for each hello: starts a new pairing and writes what the backbone needs to
 * join it into h (pointers into t, valid until the next offer or destroy). */
int pair_transport_offer(pair_transport_t *t, River__Pair__PairHello *h);
/* Backbone side: takes them from an accepted hello. */
int pair_transport_accept(pair_transport_t *t, const River__Pair__PairHello *h);
/* Both sides once the hello is answered (the river on PairHelloOk, the backbone right after
 * sending it): for nccl the communicator, which waits until both have joined. */
int pair_transport_connect(pair_transport_t *t);

/* Hands n rows of x (n, dim) to the peer. *wire is what goes into the frame's hidden field
 * (zmq: the bytes of x, which must stay valid until the frame is packed; else empty). */
int pair_transport_put(pair_transport_t *t, const void *x, int n, ProtobufCBinaryData *wire);
/* Takes the n rows the peer put into x; wire is the frame's hidden field. RIVER_EPROTO when
 * it does not hold what the transport expects. */
int pair_transport_get(pair_transport_t *t, void *x, int n, const ProtobufCBinaryData *wire);

#endif
