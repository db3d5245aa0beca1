/* The nccl transport (workers/pair_transport.h): hidden states sent device to device over
 * the backend's peer link (kernels/backend.h: backend_peer_open, NCCL send/recv on the CUDA
 * backend). The river side makes a link id for each hello; both sides join the two-rank
 * link once the hello is answered. Each put first waits for the backend's queued work
 * (ops->sync), since the link has its own stream; each get waits for its floats before the
 * backend reads them. In a build without CUDA the kind exists but cannot be opened. */
#include "workers/pair_transport_internal.h"

#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "kernels/backend.h"

typedef struct nccl {
    unsigned char id[OPS_PEER_ID_BYTES];
    int have_id;
    ops_peer_t *comm; /* NULL until connected */
} nccl_t;

static int nccl__init(pair_transport_t *t)
{
#ifndef RIVER_CUDA
    return river_err_set(RIVER_EUNSUPPORTED, "nccl transport: this build has no CUDA backend "
                         "(make CUDA=1)");
#endif
    backend_info_t bi;
    backend_get_info(t->be, &bi);
    if (bi.host_memory || bi.handoff == HANDOFF_SHARED || bi.handoff == HANDOFF_HOST)
        return river_err_set(RIVER_EUNSUPPORTED, "nccl transport: the %s backend does not "
                             "hand off through NCCL (its split.transport is %s)", bi.name,
                             bi.host_memory ? "zmq" : "p2p");
    t->impl = calloc(1, sizeof(nccl_t));
    return t->impl ? 0 : river_err_set(RIVER_ENOMEM, "nccl transport");
}

static void nccl__fini(pair_transport_t *t)
{
    nccl_t *s = t->impl;
    if (s)
        backend_peer_close(t->be, &s->comm);
    free(s);
    t->impl = NULL;
}

static int nccl__offer(pair_transport_t *t, River__Pair__PairHello *h)
{
    nccl_t *s = t->impl;
    backend_peer_close(t->be, &s->comm);
    int e = backend_peer_id(t->be, s->id);
    if (e)
        return e;
    s->have_id = 1;
    h->nccl_id.data = s->id;
    h->nccl_id.len = sizeof s->id;
    return 0;
}

static int nccl__accept(pair_transport_t *t, const River__Pair__PairHello *h)
{
    nccl_t *s = t->impl;
    backend_peer_close(t->be, &s->comm);
    if (h->nccl_id.len != sizeof s->id)
        return river_err_set(RIVER_EINVAL, "nccl transport: a unique id of %zu bytes, "
                             "expected %zu", h->nccl_id.len, sizeof s->id);
    memcpy(s->id, h->nccl_id.data, sizeof s->id);
    s->have_id = 1;
    return 0;
}

static int nccl__connect(pair_transport_t *t)
{
    nccl_t *s = t->impl;
    if (!s->have_id)
        return river_err_set(RIVER_ESTATE, "nccl transport: no unique id");
    return backend_peer_open(t->be, &s->comm, s->id, (int)t->side);
}

static int nccl__put(pair_transport_t *t, const void *x, int n, ProtobufCBinaryData *wire)
{
    nccl_t *s = t->impl;
    if (!s->comm)
        return river_err_set(RIVER_ESTATE, "nccl transport: not connected");
    int e = t->be->ops->sync(t->be->ctx);
    return e ? e : backend_peer_send(t->be, s->comm, x, (size_t)n * (size_t)t->dim);
}

static int nccl__get(pair_transport_t *t, void *x, int n, const ProtobufCBinaryData *wire)
{
    nccl_t *s = t->impl;
    if (!s->comm)
        return river_err_set(RIVER_ESTATE, "nccl transport: not connected");
    if (wire->len)
        return river_err_set(RIVER_EPROTO, "nccl transport: %zu bytes of hidden states in "
                             "the frame, which should carry none", wire->len);
    return backend_peer_recv(t->be, s->comm, x, (size_t)n * (size_t)t->dim);
}

const pair_transport_vt_t pair_transport_nccl_vt = {
    .device = true,
    .init = nccl__init,
    .offer = nccl__offer,
    .accept = nccl__accept,
    .connect = nccl__connect,
    .put = nccl__put,
    .get = nccl__get,
    .fini = nccl__fini,
};
