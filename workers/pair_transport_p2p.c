/* The p2p transport (workers/pair_transport.h): hidden states copied on the backend into a
 * staging buffer both processes map, made by the river side with ops->shared_alloc and
 * mapped by the backbone with ops->shared_map, as the KV pool is. On GPUs that buffer is
 * CUDA IPC memory and the copies are peer copies between the two devices; on the CPU and
 * the opaque backend it is a memfd, and the frames carry no floats at all.
 *
 * The staging buffer holds one direction at a time: the river puts the rows and sends the
 * request; the backbone gets them, runs the layer, puts the result and replies; the river
 * gets it. Each put waits for its copy (ops->sync) before the frame that announces it. */
#include "workers/pair_transport_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/err.h"

typedef struct p2p {
    void *stage;          /* (max_rows, dim) in the backend's memory, NULL while unmapped */
    shared_handle_t sh;   /* as shared_alloc filled it, or as mapped */
    int32_t *ident;       /* (max_rows) 0, 1, 2, ...: gather_rows as a plain copy */
} p2p_t;

static size_t p2p__bytes(const pair_transport_t *t)
{
    return (size_t)t->max_rows * (size_t)t->dim * sizeof(float);
}

static void p2p__unmap(pair_transport_t *t)
{
    p2p_t *s = t->impl;
    if (s->stage)
        t->be->ops->shared_free(t->be->ctx, s->stage, &s->sh, t->side == PAIR_SIDE_RIVER);
    s->stage = NULL;
}

static int p2p__init(pair_transport_t *t)
{
    p2p_t *s = calloc(1, sizeof *s);
    int32_t *ident = malloc((size_t)t->max_rows * sizeof *ident);
    if (!s || !ident) {
        free(s);
        free(ident);
        return river_err_set(RIVER_ENOMEM, "p2p transport");
    }
    for (int i = 0; i < t->max_rows; i++)
        ident[i] = i;
    s->ident = ident;
    s->sh.fd = -1;
    t->impl = s;
    if (t->side == PAIR_SIDE_RIVER) {
        s->stage = t->be->ops->shared_alloc(t->be->ctx, p2p__bytes(t), &s->sh);
        if (!s->stage) {
            char why[256];
            snprintf(why, sizeof why, "%s", river_err_detail());
            int e = river_err_set(RIVER_ESYS, "p2p transport: staging buffer of %zu bytes: %s",
                                  p2p__bytes(t), why);
            free(ident);
            free(s);
            t->impl = NULL;
            return e;
        }
    }
    return 0;
}

static void p2p__fini(pair_transport_t *t)
{
    p2p_t *s = t->impl;
    if (!s)
        return;
    p2p__unmap(t);
    free(s->ident);
    free(s);
    t->impl = NULL;
}

static int p2p__offer(pair_transport_t *t, River__Pair__PairHello *h)
{
    p2p_t *s = t->impl;
    h->stage_kind = (uint32_t)s->sh.kind;
    h->stage_bytes = s->sh.bytes;
    h->stage_fd = s->sh.fd;
    if (s->sh.kind == SHARED_CUDA_IPC) {
        h->stage_ipc.data = s->sh.ipc;
        h->stage_ipc.len = sizeof s->sh.ipc;
    }
    return 0;
}

static int p2p__accept(pair_transport_t *t, const River__Pair__PairHello *h)
{
    p2p_t *s = t->impl;
    p2p__unmap(t);
    if (h->stage_bytes != p2p__bytes(t))
        return river_err_set(RIVER_EINVAL, "p2p transport: a staging buffer of %llu bytes "
                             "for %d rows of %d, expected %zu",
                             (unsigned long long)h->stage_bytes, t->max_rows, t->dim,
                             p2p__bytes(t));
    shared_handle_t sh = {.kind = (shared_kind_t)h->stage_kind, .bytes = p2p__bytes(t),
                          .fd = -1};
    if (sh.kind == SHARED_CUDA_IPC) {
        if (h->stage_ipc.len != sizeof sh.ipc)
            return river_err_set(RIVER_EINVAL, "p2p transport: CUDA IPC handle of %zu bytes",
                                 h->stage_ipc.len);
        memcpy(sh.ipc, h->stage_ipc.data, sizeof sh.ipc);
    } else if (sh.kind == SHARED_MEMFD) {
        char path[64];
        snprintf(path, sizeof path, "/proc/%u/fd/%d", h->river_pid, h->stage_fd);
        if (h->stage_fd < 0 || (sh.fd = open(path, O_RDWR | O_CLOEXEC)) < 0)
            return river_err_set(RIVER_ESYS, "p2p transport: cannot open the river's staging "
                                 "buffer %s: %s", path, strerror(errno));
    } else {
        return river_err_set(RIVER_EINVAL, "p2p transport: staging buffer of kind %u",
                             h->stage_kind);
    }
    void *stage = t->be->ops->shared_map(t->be->ctx, &sh);
    char why[256] = "";
    if (!stage)
        snprintf(why, sizeof why, "%s", river_err_detail());
    int e = stage ? 0 : river_err_set(RIVER_EUNSUPPORTED, "p2p transport: %s", why);
    if (sh.fd >= 0)
        close(sh.fd);
    sh.fd = -1;
    if (e)
        return e;
    s->stage = stage;
    s->sh = sh;
    return 0;
}

static int p2p__put(pair_transport_t *t, const void *x, int n, ProtobufCBinaryData *wire)
{
    p2p_t *s = t->impl;
    if (!s->stage)
        return river_err_set(RIVER_ESTATE, "p2p transport: no staging buffer mapped");
    const ops_t *o = t->be->ops;
    int e = o->gather_rows(t->be->ctx, s->stage, x, s->ident, n, t->dim);
    return e ? e : o->sync(t->be->ctx);
}

static int p2p__get(pair_transport_t *t, void *x, int n, const ProtobufCBinaryData *wire)
{
    p2p_t *s = t->impl;
    if (!s->stage)
        return river_err_set(RIVER_ESTATE, "p2p transport: no staging buffer mapped");
    if (wire->len)
        return river_err_set(RIVER_EPROTO, "p2p transport: %zu bytes of hidden states in the "
                             "frame, which should carry none", wire->len);
    return t->be->ops->gather_rows(t->be->ctx, x, s->stage, s->ident, n, t->dim);
}

const pair_transport_vt_t pair_transport_p2p_vt = {
    .device = true,
    .init = p2p__init,
    .offer = p2p__offer,
    .accept = p2p__accept,
    .put = p2p__put,
    .get = p2p__get,
    .fini = p2p__fini,
};
