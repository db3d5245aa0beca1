/* Choosing and driving the split pair's transport (workers/pair_transport.h). */
#include "workers/pair_transport_internal.h"

#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "kernels/backend.h"

static const char *const pair__transport_names[PAIR_TRANSPORT_COUNT] = {
    [PAIR_TRANSPORT_AUTO] = "auto", [PAIR_TRANSPORT_ZMQ] = "zmq",
    [PAIR_TRANSPORT_NCCL] = "nccl", [PAIR_TRANSPORT_P2P] = "p2p"};

static const pair_transport_vt_t *const pair__transport_vts[PAIR_TRANSPORT_COUNT] = {
    [PAIR_TRANSPORT_ZMQ] = &pair_transport_zmq_vt,
    [PAIR_TRANSPORT_NCCL] = &pair_transport_nccl_vt,
    [PAIR_TRANSPORT_P2P] = &pair_transport_p2p_vt};

const char *pair_transport_name(int kind)
{
    return kind >= 0 && kind < PAIR_TRANSPORT_COUNT ? pair__transport_names[kind] : "?";
}

pair_transport_kind_t pair_transport_resolve(pair_transport_kind_t want, const backend_t *be)
{
    if (want != PAIR_TRANSPORT_AUTO)
        return want;
    if (!be)
        return PAIR_TRANSPORT_ZMQ; /* no backend: the states are host memory */
    backend_info_t bi;
    backend_get_info(be, &bi);
    switch (bi.handoff) {
    case HANDOFF_HOST:
        return PAIR_TRANSPORT_ZMQ;
    case HANDOFF_SHARED:
        return PAIR_TRANSPORT_P2P;
    case HANDOFF_NCCL:
        return PAIR_TRANSPORT_NCCL;
    case HANDOFF_DEFAULT:
        break;
    }
    if (bi.host_memory)
        return PAIR_TRANSPORT_ZMQ;
#ifdef RIVER_CUDA
    return PAIR_TRANSPORT_NCCL;
#else
    return PAIR_TRANSPORT_P2P;
#endif
}

pair_transport_kind_t pair_transport_fallback(pair_transport_kind_t want, const backend_t *be)
{
    /* Only auto may change its mind at the hello; an explicit kind is what it says. */
    if (want != PAIR_TRANSPORT_AUTO || pair_transport_resolve(want, be) != PAIR_TRANSPORT_NCCL)
        return PAIR_TRANSPORT_AUTO;
    return PAIR_TRANSPORT_P2P;
}

int pair_transport_choose(pair_transport_kind_t want, const backend_t *be,
                          pair_transport_kind_t offered, pair_transport_kind_t alt,
                          const char *peer_uuid, pair_transport_kind_t *out)
{
    if (offered == PAIR_TRANSPORT_AUTO)
        offered = PAIR_TRANSPORT_ZMQ; /* older river workers leave the field 0 */
    if (offered >= PAIR_TRANSPORT_COUNT || alt >= PAIR_TRANSPORT_COUNT)
        return river_err_set(RIVER_EINVAL, "transport of unknown kind %u (or %u)",
                             (unsigned)offered, (unsigned)alt);
    backend_info_t bi = {.device = -1};
    if (be)
        backend_get_info(be, &bi);
    /* Host backends name no device: two of them share nothing NCCL would mind. */
    bool one_device = bi.uuid[0] && peer_uuid && strcmp(bi.uuid, peer_uuid) == 0;
    pair_transport_kind_t mine = pair_transport_resolve(want, be);
    if (one_device && mine == PAIR_TRANSPORT_NCCL) {
        if (want == PAIR_TRANSPORT_AUTO)
            mine = PAIR_TRANSPORT_P2P;
        else
            return river_err_set(RIVER_EINVAL, "this backbone's split.transport is nccl, but "
                                 "both workers are on one GPU (%s), where NCCL cannot join "
                                 "two ranks; configure split.transport p2p (or auto) on both",
                                 bi.uuid);
    }
    if (one_device && offered == PAIR_TRANSPORT_NCCL && alt != PAIR_TRANSPORT_P2P)
        return river_err_set(RIVER_EINVAL, "the river's split.transport is nccl, but both "
                             "workers are on one GPU (%s), where NCCL cannot join two ranks; "
                             "configure split.transport p2p (or auto) on both", bi.uuid);
    if (offered == mine || (alt != PAIR_TRANSPORT_AUTO && alt == mine)) {
        *out = mine;
        return 0;
    }
    return river_err_set(RIVER_EINVAL, "transport %s differs from this backbone's %s "
                         "(split.transport on its backend)", pair_transport_name((int)offered),
                         pair_transport_name((int)mine));
}

int pair_transport_new(pair_transport_t **out, pair_transport_kind_t kind, pair_side_t side,
                       backend_t *be, int dim, int max_rows)
{
    if (kind <= PAIR_TRANSPORT_AUTO || kind >= PAIR_TRANSPORT_COUNT || dim <= 0 ||
        max_rows <= 0)
        return river_err_set(RIVER_EINVAL, "pair transport %d for %d rows of %d", (int)kind,
                             max_rows, dim);
    pair_transport_t *t = calloc(1, sizeof *t);
    if (!t)
        return river_err_set(RIVER_ENOMEM, "pair transport");
    *t = (pair_transport_t){.vt = pair__transport_vts[kind], .kind = kind, .side = side,
                            .be = be, .dim = dim, .max_rows = max_rows};
    int e = t->vt->init ? t->vt->init(t) : 0;
    if (e) {
        free(t);
        return e;
    }
    *out = t;
    return 0;
}

void pair_transport_destroy(pair_transport_t **pt)
{
    pair_transport_t *t = *pt;
    if (!t)
        return;
    if (t->vt->fini)
        t->vt->fini(t);
    free(t);
    *pt = NULL;
}

pair_transport_kind_t pair_transport_kind(const pair_transport_t *t) { return t->kind; }
bool pair_transport_on_device(const pair_transport_t *t) { return t->vt->device; }

int pair_transport_offer(pair_transport_t *t, River__Pair__PairHello *h)
{
    h->transport = (uint32_t)t->kind;
    return t->vt->offer ? t->vt->offer(t, h) : 0;
}

int pair_transport_accept(pair_transport_t *t, const River__Pair__PairHello *h)
{
    return t->vt->accept ? t->vt->accept(t, h) : 0;
}

int pair_transport_connect(pair_transport_t *t)
{
    return t->vt->connect ? t->vt->connect(t) : 0;
}

int pair_transport_put(pair_transport_t *t, const void *x, int n, ProtobufCBinaryData *wire)
{
    wire->data = NULL;
    wire->len = 0;
    if (n <= 0 || n > t->max_rows)
        return river_err_set(RIVER_EINVAL, "pair transport: %d rows (max %d)", n, t->max_rows);
    return t->vt->put(t, x, n, wire);
}

int pair_transport_get(pair_transport_t *t, void *x, int n, const ProtobufCBinaryData *wire)
{
    if (n <= 0 || n > t->max_rows)
        return river_err_set(RIVER_EINVAL, "pair transport: %d rows (max %d)", n, t->max_rows);
    return t->vt->get(t, x, n, wire);
}
