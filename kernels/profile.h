/* Timing every op a backend runs (`river bench --profile`).
 *
 * profile_attach wraps a backend in place: the backend_t keeps its address, so the engine,
 * a generator and everything else that holds it go through the wrapper from the next op on,
 * and buffers, KV pages and weights made before stay valid (the wrapper hands every call to
 * the backend beneath unchanged). Each compute op is timed from its call to the end of the
 * backend's sync after it, so on an asynchronous backend (CUDA) the profile serialises the
 * queue, and op recording (graph_begin) is off while attached: every op runs, and is seen,
 * one at a time. On the CPU the ops are synchronous and nothing changes but the clock reads.
 *
 * Ops are grouped by what they do and on what: the op, and for the ops that read a weight
 * (matmul, embed, rmsnorm, add_bias, router_prob) its dtype and shape, with the rows of x
 * of the call. Groups are kept in the order they first ran, so one decode step's groups read
 * as a layer's data flow. A matmul's bytes are its weight's (codes, scales and zeros): the
 * memory a decode step must stream, which makes bytes / time its achieved bandwidth; the
 * KV ops are grouped by the pool's element type (kv.dtype), their bytes the K and V values
 * they write or read in it. */
#ifndef RIVER_KERNELS_PROFILE_H
#define RIVER_KERNELS_PROFILE_H

#include <stdint.h>

#include "kernels/ops.h"

/* One group of timed calls. */
typedef struct profile_row {
    const char *op;  /* the ops_t member's name: "matmul", "attention", ... */
    dtype_t dtype;   /* of the weight read, the KV pool's for kv_write and attention;
                        DTYPE_COUNT for ops without one */
    int64_t rows;    /* weight shape (rows, cols); 0 without one */
    int64_t cols;
    int n;           /* rows of x (or sequences, positions) the calls ran on */
    int64_t calls;
    double seconds;  /* all calls together */
    double bytes;    /* weight bytes all matmul calls read; K and V bytes (the pool's
                        dtype) kv_write wrote and attention read */
} profile_row_t;

/* Most groups kept; calls past them are summed into one row of op "other". */
#define PROFILE_MAX_ROWS 96

/* Wraps be (see above). RIVER_EINVAL when be is wrapped already; RIVER_ENOMEM. On failure be
 * is unchanged. backend_destroy of a wrapped backend frees the wrapper and the backend. */
int profile_attach(backend_t *be);
/* Unwraps be, which then is the backend it was before profile_attach; nothing is lost. A
 * backend that is not wrapped is left alone. */
void profile_detach(backend_t *be);
/* Forgets the calls timed so far and starts the wall clock of the window anew. RIVER_EINVAL
 * on a backend that is not wrapped. */
int profile_reset(backend_t *be);
/* The groups timed since the last reset (valid until the next op, reset or detach), and the
 * wall time of the window, whose excess over the groups' sum is time spent between ops.
 * RIVER_EINVAL on a backend that is not wrapped. */
int profile_read(const backend_t *be, const profile_row_t **rows, int *n_rows,
                 double *window_s);

#endif
