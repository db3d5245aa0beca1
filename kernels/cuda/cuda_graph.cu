/* CUDA graphs of a plain decode step (ops->graph_begin / graph_end, kernels/cuda/cuda.h)
 * and the arena their host inputs go through. */
#include "kernels/cuda/cuda_internal.h"

#include <string.h>

/* ---- step graphs ------------------------------------------------------------------------ */

/* A plain decode step (ops->graph_begin .. graph_end around the backbone layers) is captured
 * into a CUDA graph instead of launched: its kernels are recorded, its host inputs are
 * appended to a pinned arena rather than staged, and at graph_end the graph is written over
 * the instantiated one (cudaGraphExecUpdate: a step of the same shape changes only kernel
 * arguments) or instantiated anew when the shape changed, then the arena is copied and the
 * graph launched. Capturing every step keeps the replay exact (it is what eager launches
 * would have been) without checking the engine's inputs; the saving is the launch gaps on
 * the device. When instantiation is needed step after step (rows change shape), graphs are
 * off for GRAPH_COOLDOWN steps. Enabled with RIVER_CUDA_GRAPHS=1. */
#define ARENA_BYTES ((size_t)8 << 20)
#define ARENA_ENTRIES 64
#define GRAPH_MISSES 3
#define GRAPH_COOLDOWN 64

/* Appends src to the arena of the step being captured, reusing an identical earlier input
 * of the same step; *dev is where the kernels read it once graph_end copied the arena. */
int cuda__arena_put(ops_ctx_t *ctx, const void *src, size_t bytes, const void **dev)
{
    char *host = (char *)ctx->arena_host[ctx->arena_k];
    for (int i = 0; i < ctx->arena_n; i++)
        if (ctx->arena_len[i] == bytes && memcmp(host + ctx->arena_at[i], src, bytes) == 0) {
            *dev = (const char *)ctx->arena_dev + ctx->arena_at[i];
            return 0;
        }
    size_t at = align256(ctx->arena_off);
    if (at + bytes > ARENA_BYTES)
        return river_err_set(RIVER_ENOMEM, "cuda graph: step inputs over the %zu-byte arena",
                             ARENA_BYTES);
    memcpy(host + at, src, bytes);
    if (ctx->arena_n < ARENA_ENTRIES) {
        ctx->arena_at[ctx->arena_n] = at;
        ctx->arena_len[ctx->arena_n++] = bytes;
    }
    ctx->arena_off = at + bytes;
    *dev = (const char *)ctx->arena_dev + at;
    return 0;
}

int cuda__graph_begin(ops_ctx_t *ctx, int *active)
{
    *active = 0;
    if (!ctx->graphs)
        return 0;
    if (ctx->graph_cooldown > 0) {
        ctx->graph_cooldown--;
        return 0;
    }
    int e = cuda__enter(ctx);
    if (e)
        return e;
    if (!ctx->arena_dev) {
        for (int k = 0; k < 2; k++) {
            CU_TRY(cudaHostAlloc(&ctx->arena_host[k], ARENA_BYTES, cudaHostAllocDefault),
                   "graph arena");
            CU_TRY(cudaEventCreateWithFlags(&ctx->arena_done[k], cudaEventDisableTiming),
                   "graph arena");
        }
        CU_TRY(cudaMalloc(&ctx->arena_dev, ARENA_BYTES), "graph arena");
    }
    /* The pinned half written now was last copied two steps ago; that copy must be done. */
    CU_TRY(cudaEventSynchronize(ctx->arena_done[ctx->arena_k]), "graph arena");
    ctx->arena_off = 0;
    ctx->arena_n = 0;
    /* Relaxed: cuBLAS and a growing scratch may allocate while the step is captured. */
    CU_TRY(cudaStreamBeginCapture(ctx->stream, cudaStreamCaptureModeRelaxed), "graph capture");
    ctx->capturing = 1;
    *active = 1;
    return 0;
}

static void graph_miss(ops_ctx_t *ctx)
{
    if (++ctx->graph_misses >= GRAPH_MISSES) {
        ctx->graph_misses = 0;
        ctx->graph_cooldown = GRAPH_COOLDOWN;
    }
}

int cuda__graph_end(ops_ctx_t *ctx, int abort)
{
    if (!ctx->capturing)
        return 0;
    ctx->capturing = 0;
    int e = cuda__enter(ctx);
    if (e)
        return e;
    cudaGraph_t g = NULL;
    cudaError_t ce = cudaStreamEndCapture(ctx->stream, &g);
    if (abort || ce != cudaSuccess) {
        if (g)
            (void)cudaGraphDestroy(g);
        graph_miss(ctx);
        e = ce != cudaSuccess ? cuda__fail(ce, "graph capture") : 0;
        /* Nothing captured runs; scratch replaced meanwhile is free once the work queued
         * before the capture is done. */
        if (ctx->n_deferred && cudaStreamSynchronize(ctx->stream) == cudaSuccess) {
            for (int i = 0; i < ctx->n_deferred; i++)
                (void)cudaFree(ctx->deferred[i]);
            ctx->n_deferred = 0;
        }
        (void)cudaGetLastError();
        return e;
    }
    if (ctx->exec) {
        cudaGraphExecUpdateResultInfo info;
        if (cudaGraphExecUpdate(ctx->exec, g, &info) == cudaSuccess) {
            ctx->graph_misses = 0;
        } else {
            (void)cudaGetLastError();
            (void)cudaGraphExecDestroy(ctx->exec);
            ctx->exec = NULL;
        }
    }
    if (!ctx->exec) {
        ce = cudaGraphInstantiate(&ctx->exec, g, 0);
        if (ce != cudaSuccess) {
            ctx->exec = NULL;
            (void)cudaGraphDestroy(g);
            graph_miss(ctx);
            return cuda__fail(ce, "graph instantiate");
        }
        ctx->graph_instantiations++;
        graph_miss(ctx);
    }
    (void)cudaGraphDestroy(g);
    int k = ctx->arena_k;
    if (ctx->arena_off)
        CU_TRY(cudaMemcpyAsync(ctx->arena_dev, ctx->arena_host[k], ctx->arena_off,
                               cudaMemcpyHostToDevice, ctx->stream),
               "graph arena");
    CU_TRY(cudaEventRecord(ctx->arena_done[k], ctx->stream), "graph arena");
    ctx->arena_k ^= 1;
    CU_TRY(cudaGraphLaunch(ctx->exec, ctx->stream), "graph launch");
    ctx->graph_launches++;
    if (ctx->n_deferred) {
        /* Scratch replaced during the capture: the old areas are free once the work that
         * may read them is done. */
        CU_TRY(cudaStreamSynchronize(ctx->stream), "graph");
        for (int i = 0; i < ctx->n_deferred; i++)
            (void)cudaFree(ctx->deferred[i]);
        ctx->n_deferred = 0;
    }
    return 0;
}

void cuda__graph_release(ops_ctx_t *ctx)
{
    if (ctx->exec)
        (void)cudaGraphExecDestroy(ctx->exec);
    ctx->exec = NULL;
    for (int k = 0; k < 2; k++) {
        if (ctx->arena_host[k])
            (void)cudaFreeHost(ctx->arena_host[k]);
        if (ctx->arena_done[k])
            (void)cudaEventDestroy(ctx->arena_done[k]);
        ctx->arena_host[k] = NULL;
        ctx->arena_done[k] = NULL;
    }
    if (ctx->arena_dev)
        (void)cudaFree(ctx->arena_dev);
    ctx->arena_dev = NULL;
    for (int i = 0; i < ctx->n_deferred; i++)
        (void)cudaFree(ctx->deferred[i]);
    ctx->n_deferred = 0;
}
