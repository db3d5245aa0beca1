/* Device memory two processes share (ops->shared_alloc / shared_map / shared_free): the
 * split pair's KV pool through CUDA IPC handles. */
#include "kernels/cuda/cuda_internal.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* The buffers this process exported, so that mapping one of its own handles gives the
 * buffer itself: cudaIpcOpenMemHandle refuses a handle in the process that made it, yet a
 * process maps its own pool when one process plays both halves of a pair (the engine seam
 * of tests/test_split.c). Process-wide, since a handle names the allocation whichever
 * backend made it; ops may run on any thread, hence the lock. */
typedef struct cuda_export {
    void *buf;
    int device;
    unsigned char ipc[sizeof(cudaIpcMemHandle_t)];
    int aliases;    /* maps of it in this process not freed yet */
    int owner_gone; /* the owner freed it first: the entry stays for the aliases' frees */
} cuda_export;

static pthread_mutex_t cuda__exports_lock = PTHREAD_MUTEX_INITIALIZER;
static cuda_export *cuda__exports;
static size_t cuda__n_exports, cuda__cap_exports;

/* The entry of buf (by address) or of handle ipc (by its bytes), among those whose owner
 * still holds them, or with gone among the others too; NULL if none. Under the lock. */
static cuda_export *cuda__export_find(const void *buf, const unsigned char *ipc, int gone)
{
    for (size_t i = 0; i < cuda__n_exports; i++) {
        cuda_export *x = &cuda__exports[i];
        if (!gone && x->owner_gone)
            continue;
        if (buf ? x->buf == buf : ipc && memcmp(x->ipc, ipc, sizeof x->ipc) == 0)
            return x;
    }
    return NULL;
}

static void cuda__export_drop(cuda_export *x)
{
    *x = cuda__exports[--cuda__n_exports];
}

static int cuda__export_add(void *buf, int device, const cudaIpcMemHandle_t *ipc)
{
    pthread_mutex_lock(&cuda__exports_lock);
    int e = 0;
    if (cuda__n_exports == cuda__cap_exports) {
        size_t cap = cuda__cap_exports ? 2 * cuda__cap_exports : 8;
        cuda_export *n = (cuda_export *)realloc(cuda__exports, cap * sizeof *n);
        if (n) {
            cuda__exports = n;
            cuda__cap_exports = cap;
        } else {
            e = river_err_set(RIVER_ENOMEM, "cuda shared alloc: export list");
        }
    }
    if (!e) {
        cuda_export *x = &cuda__exports[cuda__n_exports++];
        memset(x, 0, sizeof *x);
        x->buf = buf;
        x->device = device;
        memcpy(x->ipc, ipc, sizeof x->ipc);
    }
    pthread_mutex_unlock(&cuda__exports_lock);
    return e;
}

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
    if (cuda__export_add(d, ctx->device, &ipc)) {
        (void)cudaFree(d);
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
    /* A handle of this process's own: the memory is mapped here already. Another device
     * of this process goes on to cudaIpcOpenMemHandle, which says why it cannot. */
    pthread_mutex_lock(&cuda__exports_lock);
    cuda_export *x = cuda__export_find(NULL, h->ipc, 0);
    void *own = x && x->device == ctx->device ? x->buf : NULL;
    if (own)
        x->aliases++;
    pthread_mutex_unlock(&cuda__exports_lock);
    if (own)
        return own;
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
    if (!buf)
        return;
    /* An alias of this process's own export is neither freed nor closed: its owner frees
     * the memory. The owner's free leaves the entry to aliases still out, so that theirs
     * do not close an address that may belong to something else by then. */
    pthread_mutex_lock(&cuda__exports_lock);
    cuda_export *x = cuda__export_find(buf, NULL, !owner);
    int alias = x && !owner;
    if (alias) {
        if (--x->aliases <= 0 && x->owner_gone)
            cuda__export_drop(x);
    } else if (x) {
        if (x->aliases > 0)
            x->owner_gone = 1;
        else
            cuda__export_drop(x);
    }
    pthread_mutex_unlock(&cuda__exports_lock);
    if (alias || cuda__enter(ctx))
        return;
    /* Teardown is best effort, as in cuda_backend_destroy. */
    if (owner)
        (void)cudaFree(buf);
    else
        (void)cudaIpcCloseMemHandle(buf);
    (void)cudaGetLastError();
}
