/* The zmq transport (workers/pair_transport.h): hidden states as raw f32 bytes inside the
 * frames, from and into host memory. Floats cross unchanged, which the pair's bit-exactness
 * rests on. */
#include "workers/pair_transport_internal.h"

#include <string.h>

#include "common/err.h"

static int zmq__put(pair_transport_t *t, const void *x, int n, ProtobufCBinaryData *wire)
{
    wire->data = (uint8_t *)x;
    wire->len = (size_t)n * (size_t)t->dim * sizeof(float);
    return 0;
}

static int zmq__get(pair_transport_t *t, void *x, int n, const ProtobufCBinaryData *wire)
{
    size_t bytes = (size_t)n * (size_t)t->dim * sizeof(float);
    if (wire->len != bytes)
        return river_err_set(RIVER_EPROTO, "%zu bytes of hidden states for %d rows of %d, "
                             "expected %zu", wire->len, n, t->dim, bytes);
    /* The bytes in the frame need not be aligned for floats. */
    memcpy(x, wire->data, bytes);
    return 0;
}

const pair_transport_vt_t pair_transport_zmq_vt = {
    .device = false,
    .put = zmq__put,
    .get = zmq__get,
};
