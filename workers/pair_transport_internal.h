/* What each transport file of workers/pair_transport.h fills in. Internal. */
#ifndef RIVER_WORKERS_PAIR_TRANSPORT_INTERNAL_H
#define RIVER_WORKERS_PAIR_TRANSPORT_INTERNAL_H

#include "workers/pair_transport.h"

typedef struct pair_transport_vt {
    bool device; /* put and get take backend buffers */
    int (*init)(pair_transport_t *t);
    int (*offer)(pair_transport_t *t, River__Pair__PairHello *h);
    int (*accept)(pair_transport_t *t, const River__Pair__PairHello *h);
    int (*connect)(pair_transport_t *t);
    int (*put)(pair_transport_t *t, const void *x, int n, ProtobufCBinaryData *wire);
    int (*get)(pair_transport_t *t, void *x, int n, const ProtobufCBinaryData *wire);
    void (*fini)(pair_transport_t *t); /* frees impl */
} pair_transport_vt_t;

struct pair_transport {
    const pair_transport_vt_t *vt;
    pair_transport_kind_t kind;
    pair_side_t side;
    backend_t *be;
    int dim;      /* floats per row */
    int max_rows;
    void *impl;   /* the transport's own state */
};

extern const pair_transport_vt_t pair_transport_zmq_vt;
extern const pair_transport_vt_t pair_transport_nccl_vt;
extern const pair_transport_vt_t pair_transport_p2p_vt;

#endif
