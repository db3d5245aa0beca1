/* The CUDA ops that live in files of their own (kernels/cuda/cuda_router.cu), and what
 * they need of the backend's state in kernels/cuda/cuda_backend.cu. CUDA sources only. */
#ifndef RIVER_KERNELS_CUDA_ROUTER_H
#define RIVER_KERNELS_CUDA_ROUTER_H

#include <cuda_runtime.h>

#include "kernels/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Makes the backend's GPU current on this thread and gives the stream its ops queue on. */
int cuda_ctx_stream(ops_ctx_t *ctx, cudaStream_t *stream);

/* ops->router_prob. */
int cuda_router_prob(ops_ctx_t *ctx, float *out, const void *x, const router_weights_t *w,
                     const int32_t *rows, int n);

#ifdef __cplusplus
}
#endif

#endif
