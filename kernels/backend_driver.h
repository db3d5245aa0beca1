/* What each backend exports to the registry (kernels/backend.c): a driver, the one entry
 * point through which a device name becomes a backend. The registry holds the table of
 * device names and knows no backend's header, so the backends, which include the op
 * interface, never sit below the code that opens them. */
#ifndef RIVER_KERNELS_BACKEND_DRIVER_H
#define RIVER_KERNELS_BACKEND_DRIVER_H

#include "kernels/backend.h"

typedef struct backend_driver {
    const char *name; /* the backend's kind, as backend_info.name reports it */
    /* Opens instance `index` of the kind (the GPU for an indexed device name, else 0) with
     * n_threads host threads (0: one per core) and what placement may do with host weights.
     * On failure *out is untouched. */
    int (*open)(backend_t **out, int index, int n_threads, backend_weights_t weights);
} backend_driver_t;

extern const backend_driver_t cpu_backend_driver;
extern const backend_driver_t opaque_backend_driver;
#ifdef RIVER_CUDA
extern const backend_driver_t cuda_backend_driver;
#endif

#endif
