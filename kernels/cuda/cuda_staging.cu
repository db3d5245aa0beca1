/* The CUDA backend's memory (kernels/cuda/cuda_internal.h): scratch and host packing
 * areas, the upload slots that stage the ops' host inputs, activation buffers and their
 * copies to and from the host, and the device copies of placed weights. */
#include "kernels/cuda/cuda_internal.h"

#include <stdlib.h>
#include <string.h>

/* Geometric growth: a run of growing batches reallocates a handful of times, never once
 * per op. */
static size_t grow_cap(size_t cap, size_t bytes)
{
    size_t c = cap ? cap : 4096;
    while (c < bytes)
        c *= 2;
    return c;
}

int cuda__scratch_reserve(ops_ctx_t *ctx, size_t bytes)
{
    if (bytes <= ctx->scratch_cap)
        return 0;
    size_t cap = grow_cap(ctx->scratch_cap, bytes);
    if (ctx->capturing) {
        /* No cudaFree while a step is captured: the old area is freed after it. */
        if (ctx->n_deferred == (int)(sizeof ctx->deferred / sizeof ctx->deferred[0]))
            return river_err_set(RIVER_ENOMEM, "cuda graph: scratch regrown too often");
        void *p = NULL;
        CU_TRY(cudaMalloc(&p, cap), "scratch");
        if (ctx->scratch)
            ctx->deferred[ctx->n_deferred++] = ctx->scratch;
        ctx->scratch = p;
        ctx->scratch_cap = cap;
        return 0;
    }
    /* cudaFree waits for the queued work that may still read the old area. */
    if (ctx->scratch)
        CU_TRY(cudaFree(ctx->scratch), "free scratch");
    ctx->scratch = NULL;
    ctx->scratch_cap = 0;
    CU_TRY(cudaMalloc(&ctx->scratch, cap), "scratch");
    ctx->scratch_cap = cap;
    return 0;
}

int cuda__host_reserve(ops_ctx_t *ctx, size_t bytes)
{
    if (bytes <= ctx->host_cap)
        return 0;
    size_t cap = grow_cap(ctx->host_cap, bytes);
    void *p = realloc(ctx->host, cap);
    if (!p)
        return river_err_set(RIVER_ENOMEM, "cuda: host staging of %zu bytes", cap);
    ctx->host = p;
    ctx->host_cap = cap;
    return 0;
}

int cuda__stage_put(ops_ctx_t *ctx, const void *src, size_t bytes, const void **dev)
{
    *dev = NULL;
    if (!bytes)
        return 0;
    if (ctx->capturing)
        return cuda__arena_put(ctx, src, bytes, dev);
    ctx->tick++;
    stage_slot *sl = &ctx->stage[0];
    for (int i = 0; i < STAGE_SLOTS; i++) {
        stage_slot *c = &ctx->stage[i];
        if (c->bytes == bytes && memcmp(c->host, src, bytes) == 0) {
            c->used = ctx->tick;
            *dev = c->dev;
            return 0;
        }
        if (c->used < sl->used)
            sl = c;
    }
    /* The slot is rewritten below: until then it must never match. */
    sl->bytes = 0;
    if (!sl->done)
        CU_TRY(cudaEventCreateWithFlags(&sl->done, cudaEventDisableTiming), "stage event");
    else
        CU_TRY(cudaEventSynchronize(sl->done), "stage wait");
    if (bytes > sl->cap) {
        /* cudaFree waits for kernels that may still read the old device copy. */
        if (sl->host)
            CU_TRY(cudaFreeHost(sl->host), "stage free");
        sl->host = NULL;
        if (sl->dev)
            CU_TRY(cudaFree(sl->dev), "stage free");
        sl->dev = NULL;
        sl->cap = 0;
        size_t cap = grow_cap(0, bytes);
        CU_TRY(cudaHostAlloc(&sl->host, cap, cudaHostAllocDefault), "stage pinned");
        CU_TRY(cudaMalloc(&sl->dev, cap), "stage device");
        sl->cap = cap;
    }
    memcpy(sl->host, src, bytes);
    CU_TRY(cudaMemcpyAsync(sl->dev, sl->host, bytes, cudaMemcpyHostToDevice, ctx->stream),
           "copy inputs");
    CU_TRY(cudaEventRecord(sl->done, ctx->stream), "stage record");
    sl->bytes = bytes;
    sl->used = ctx->tick;
    ctx->uploads++;
    *dev = sl->dev;
    return 0;
}

void cuda__stage_release(ops_ctx_t *ctx)
{
    for (int i = 0; i < STAGE_SLOTS; i++) {
        stage_slot *sl = &ctx->stage[i];
        if (sl->host)
            (void)cudaFreeHost(sl->host);
        if (sl->dev)
            (void)cudaFree(sl->dev);
        if (sl->done)
            (void)cudaEventDestroy(sl->done);
        memset(sl, 0, sizeof *sl);
    }
}

/* ---- buffers ---------------------------------------------------------------------------- */

void *cuda__buf_alloc(ops_ctx_t *ctx, size_t n_elems)
{
    if (cuda__enter(ctx))
        return NULL;
    void *p = NULL;
    size_t bytes = (n_elems ? n_elems : 1) * sizeof(float);
    cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess) {
        cuda__fail(e, "buffer");
        return NULL;
    }
    e = cudaMemsetAsync(p, 0, bytes, ctx->stream);
    if (e != cudaSuccess) {
        cuda__fail(e, "zero buffer");
        cudaFree(p);
        return NULL;
    }
    return p;
}

void cuda__buf_free(ops_ctx_t *ctx, void *buf)
{
    if (!buf)
        return;
    (void)cudaSetDevice(ctx->device);
    /* cudaFree fails only on a pointer we did not allocate or a dead context; nothing can
     * be done about either here. */
    if (cudaFree(buf) != cudaSuccess)
        (void)cudaGetLastError();
}

int cuda__to_host(ops_ctx_t *ctx, float *dst, const void *src, size_t offset, size_t n)
{
    if (n && (!dst || !src))
        return river_err_set(RIVER_EINVAL, "cuda to_host: NULL buffer");
    if (!n)
        return 0;
    int e = cuda__enter(ctx);
    if (e)
        return e;
    CU_TRY(cudaMemcpyAsync(dst, (const float *)src + offset, n * sizeof(float),
                           cudaMemcpyDeviceToHost, ctx->stream),
           "to_host");
    CU_TRY(cudaStreamSynchronize(ctx->stream), "to_host");
    return 0;
}

int cuda__from_host(ops_ctx_t *ctx, void *dst, size_t offset, const float *src, size_t n)
{
    if (n && (!dst || !src))
        return river_err_set(RIVER_EINVAL, "cuda from_host: NULL buffer");
    if (!n)
        return 0;
    int e = cuda__enter(ctx);
    if (e)
        return e;
    CU_TRY(cudaMemcpyAsync((float *)dst + offset, src, n * sizeof(float),
                           cudaMemcpyHostToDevice, ctx->stream),
           "from_host");
    return 0;
}

/* Copies `bytes` of host memory into a new device allocation that the backend owns. */
static int upload_bytes(ops_ctx_t *ctx, void **dst, const void *src, size_t bytes)
{
    if (ctx->n_owned == ctx->cap_owned) {
        size_t cap = ctx->cap_owned ? 2 * ctx->cap_owned : 64;
        void **p = (void **)realloc(ctx->owned, cap * sizeof *p);
        if (!p)
            return river_err_set(RIVER_ENOMEM, "cuda upload: %zu allocations", cap);
        ctx->owned = p;
        ctx->cap_owned = cap;
    }
    void *d = NULL;
    CU_TRY(cudaMalloc(&d, bytes ? bytes : 1), "upload");
    cudaError_t ce = cudaMemcpy(d, src, bytes, cudaMemcpyHostToDevice);
    if (ce != cudaSuccess) {
        cudaFree(d);
        return cuda__fail(ce, "upload");
    }
    ctx->owned[ctx->n_owned++] = d;
    *dst = d;
    return 0;
}

extern "C" int cuda_backend_upload(backend_t *b, weight_t *w)
{
    if (!b || !w)
        return river_err_set(RIVER_EINVAL, "cuda upload: NULL argument");
    return cuda__upload_weight(b->ctx, w);
}

int cuda__upload_weight(ops_ctx_t *ctx, weight_t *w)
{
    if (!w->data)
        return 0;
    int e = cuda__weight_check(w, "upload");
    if (e)
        return e;
    if ((e = cuda__enter(ctx)))
        return e;
    size_t data_bytes = (size_t)w->rows * dtype_row_bytes(w->dtype, w->cols);
    void *d = NULL, *s = NULL, *z = NULL;
    if ((e = upload_bytes(ctx, &d, w->data, data_bytes)))
        return e;
    if (w->dtype == DTYPE_Q4 || w->dtype == DTYPE_Q8) {
        size_t qbytes = (size_t)w->rows * (size_t)(w->cols / w->group) * sizeof(uint16_t);
        /* On failure the copies made so far stay owned (freed at destroy) and w unchanged. */
        if ((e = upload_bytes(ctx, &s, w->scales, qbytes)) ||
            (e = upload_bytes(ctx, &z, w->zeros, qbytes)))
            return e;
        w->scales = (const uint16_t *)s;
        w->zeros = (const uint16_t *)z;
    }
    w->data = d;
    return 0;
}
