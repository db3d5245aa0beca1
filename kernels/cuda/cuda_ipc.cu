/* Device memory two processes share (ops->shared_alloc / shared_map / shared_free): the
 * split pair's KV pool through CUDA IPC handles. */
#include "kernels/cuda/cuda_internal.h"

#include <string.h>

/* The split pair on two GPUs: the KV pool is device memory of the river worker's GPU, and
 * the backbone worker opens it through a CUDA IPC handle (cudaIpcOpenMemHandle maps it into
 * its own context, with peer access where the GPUs allow). */
void *cuda__shared_alloc(ops_ctx_t *ctx, size_t bytes, shared_handle_t *h)
{
    if (cuda__enter(ctx))
        return NULL;
    void *d = NULL;
    cudaError_t ce = cudaMalloc(&d, bytes);
    if (ce == cudaSuccess)
        ce = cudaMemset(d, 0, bytes);
    /* cudaMemset may return before the zeros are written, and the other process maps the
     * pool through the handle at once, on streams of its own: it must not see the memory
     * before it is zero. */
    if (ce == cudaSuccess)
        ce = cudaDeviceSynchronize();
    cudaIpcMemHandle_t ipc;
    if (ce == cudaSuccess)
        ce = cudaIpcGetMemHandle(&ipc, d);
    if (ce != cudaSuccess) {
        if (d)
            (void)cudaFree(d);
        cuda__fail(ce, "shared alloc");
        return NULL;
    }
    static_assert(sizeof ipc <= sizeof h->ipc, "shared_handle_t.ipc holds a CUDA IPC handle");
    memset(h, 0, sizeof *h);
    h->kind = SHARED_CUDA_IPC;
    h->bytes = bytes;
    h->fd = -1;
    memcpy(h->ipc, &ipc, sizeof ipc);
    return d;
}

void *cuda__shared_map(ops_ctx_t *ctx, const shared_handle_t *h)
{
    if (h->kind != SHARED_CUDA_IPC) {
        river_err_set(RIVER_EUNSUPPORTED, "cuda backend: cannot map shared memory of kind %d "
                      "(CUDA IPC only)", (int)h->kind);
        return NULL;
    }
    if (cuda__enter(ctx))
        return NULL;
    cudaIpcMemHandle_t ipc;
    memcpy(&ipc, h->ipc, sizeof ipc);
    void *d = NULL;
    cudaError_t ce = cudaIpcOpenMemHandle(&d, ipc, cudaIpcMemLazyEnablePeerAccess);
    if (ce != cudaSuccess) {
        cuda__fail(ce, "shared map");
        return NULL;
    }
    return d;
}

void cuda__shared_free(ops_ctx_t *ctx, void *buf, const shared_handle_t *h, int owner)
{
    (void)h;
    if (!buf || cuda__enter(ctx))
        return;
    /* Teardown is best effort, as in cuda_backend_destroy. */
    if (owner)
        (void)cudaFree(buf);
    else
        (void)cudaIpcCloseMemHandle(buf);
    (void)cudaGetLastError();
}
