/* The CUDA backend: the ops table, its state and every kernel (see cuda.h for the
 * semantics). The host side of each op checks its arguments the way the CPU backend does
 * (same error codes), makes the op's host inputs readable on the device through the upload
 * slots (or, while a step is captured, the graph arena) and launches on the backend's
 * stream. */
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <math.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "common/err.h"
#include "kernels/cuda/cuda.h"
#include "kernels/cuda/cuda_router.h"
}

/* ---- state ------------------------------------------------------------------------------ */

/* Host inputs of the ops (positions, packed page tables, kv_valid bytes, token ids, row
 * indices, RoPE frequencies) reach the device through a few upload slots. A slot keeps a
 * pinned copy of the bytes it last uploaded and their device copy; an op whose input bytes
 * equal a slot's reuses its device copy, so the inputs of one step are uploaded once per
 * step (once per row group), not once per op and layer, and the RoPE frequencies once per
 * backend. The match is on content, never on a host pointer, so a caller that changes an
 * array in place can never be handed a stale copy. */
#define STAGE_SLOTS 16

struct stage_slot {
    void *host;        /* pinned (cudaHostAlloc) copy of the bytes last uploaded */
    void *dev;         /* their device copy */
    size_t cap;        /* bytes of host and dev */
    size_t bytes;      /* bytes uploaded; 0: empty */
    cudaEvent_t done;  /* recorded after the upload: host may be rewritten once it fired */
    uint64_t used;     /* ctx->tick at the last use, for least-recently-used replacement */
};

struct ops_ctx {
    int device;
    int n_sm;          /* multiprocessors of the device, for grid sizing */
    cudaStream_t stream;
    cublasHandle_t blas;
    /* Device scratch for converted activations and partial results; grows geometrically
     * and is kept. Reuse across ops is safe: everything runs in stream order. */
    void *scratch;
    size_t scratch_cap;
    /* Pageable host memory where an op packs its inputs before the upload slots see them. */
    void *host;
    size_t host_cap;
    stage_slot stage[STAGE_SLOTS];
    uint64_t tick;
    uint64_t uploads;  /* slot uploads so far (misses), for tests and benchmarks */
    /* Step graphs (see "step graphs" below). */
    int graphs;              /* RIVER_CUDA_GRAPHS=1 at creation */
    int capturing;           /* between graph_begin and graph_end */
    int graph_misses;        /* steps in a row that needed a new instantiation */
    int graph_cooldown;      /* steps left without graphs */
    cudaGraphExec_t exec;
    void *arena_host[2];     /* pinned, ARENA_BYTES each, alternate steps */
    cudaEvent_t arena_done[2];
    void *arena_dev;         /* ARENA_BYTES */
    int arena_k;             /* the half this step writes */
    size_t arena_off;        /* bytes used this step */
    int arena_n;
    size_t arena_at[64], arena_len[64]; /* this step's inputs, for reuse (ARENA_ENTRIES) */
    void *deferred[8];       /* scratch replaced during a capture, freed after it */
    int n_deferred;
    uint64_t graph_launches, graph_instantiations;
    /* Device allocations holding uploaded weights, freed at destroy. */
    void **owned;
    size_t n_owned, cap_owned;
    char name[256];
};

/* A weight as the kernels see it (by value, so no device copy of weight_t is needed). */
struct dweight {
    int dtype;
    int64_t rows, cols;
    const void *data;
    const uint16_t *scales, *zeros;
    int group;
    int64_t ngroups; /* Q4/Q8: groups per row (cols / group) */
    int gshift;      /* Q4/Q8: log2(group) where group is a power of two, else -1 */
};

static int cu_fail(cudaError_t err, const char *what)
{
    /* Clears a sticky launch error so that the next call reports its own. */
    (void)cudaGetLastError();
    return river_err_set(RIVER_EDEVICE, "cuda %s: %s", what, cudaGetErrorString(err));
}

#define CU_TRY(call, what)                                                                 \
    do {                                                                                   \
        cudaError_t cu_e_ = (call);                                                        \
        if (cu_e_ != cudaSuccess)                                                          \
            return cu_fail(cu_e_, what);                                                   \
    } while (0)

/* After a kernel launch: a bad configuration shows up here, not at the launch. */
#define CU_LAUNCHED(what) CU_TRY(cudaGetLastError(), what)

static int blas_fail(cublasStatus_t st, const char *what)
{
    return river_err_set(RIVER_EDEVICE, "cublas %s: %s", what, cublasGetStatusString(st));
}

/* Ops may run on any host thread; the current device is per thread. */
static int cu_enter(ops_ctx_t *ctx)
{
    CU_TRY(cudaSetDevice(ctx->device), "set device");
    return 0;
}

/* Geometric growth: a run of growing batches reallocates a handful of times, never once
 * per op. */
static size_t grow_cap(size_t cap, size_t bytes)
{
    size_t c = cap ? cap : 4096;
    while (c < bytes)
        c *= 2;
    return c;
}

static int scratch_reserve(ops_ctx_t *ctx, size_t bytes)
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

static int host_reserve(ops_ctx_t *ctx, size_t bytes)
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

/* Makes `bytes` of host memory at src readable on the device at *dev, in stream order:
 * from a slot that already holds these bytes, else through the least recently used slot's
 * pinned buffer with one asynchronous copy. src may change as soon as this returns. */
static int arena_put(ops_ctx_t *ctx, const void *src, size_t bytes, const void **dev);

static int stage_put(ops_ctx_t *ctx, const void *src, size_t bytes, const void **dev)
{
    *dev = NULL;
    if (!bytes)
        return 0;
    if (ctx->capturing)
        return arena_put(ctx, src, bytes, dev);
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

static void stage_release(ops_ctx_t *ctx)
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

static size_t align256(size_t n)
{
    return (n + 255) / 256 * 256;
}

static int weight_check(const weight_t *w, const char *what)
{
    if (!w || !w->data)
        return river_err_set(RIVER_EINVAL, "cuda %s: no weight data", what);
    if ((unsigned)w->dtype >= DTYPE_COUNT)
        return river_err_set(RIVER_EDTYPE, "cuda %s: dtype %d", what, (int)w->dtype);
    if (w->rows <= 0 || w->cols <= 0)
        return river_err_set(RIVER_ESHAPE, "cuda %s: shape (%lld, %lld)", what,
                             (long long)w->rows, (long long)w->cols);
    if (w->dtype == DTYPE_Q4 || w->dtype == DTYPE_Q8) {
        if (!w->scales || !w->zeros || w->group <= 0 || w->cols % w->group != 0 ||
            (w->dtype == DTYPE_Q4 && w->group % 2 != 0))
            return river_err_set(RIVER_EFORMAT, "cuda %s: %s weight with group %d over %lld "
                                 "columns", what, dtype_name(w->dtype), w->group,
                                 (long long)w->cols);
    }
    return 0;
}

static dweight to_dweight(const weight_t *w)
{
    dweight d;
    d.dtype = (int)w->dtype;
    d.rows = w->rows;
    d.cols = w->cols;
    d.data = w->data;
    d.scales = w->scales;
    d.zeros = w->zeros;
    d.group = w->group;
    d.ngroups = w->group > 0 ? w->cols / w->group : 0;
    d.gshift = -1;
    for (int sh = 0; sh < 31 && w->group > 0; sh++)
        if (w->group == 1 << sh)
            d.gshift = sh;
    return d;
}

/* ---- device helpers --------------------------------------------------------------------- */

__device__ __forceinline__ float h2f(uint16_t h)
{
    return __half2float(__ushort_as_half(h));
}

__device__ __forceinline__ float bf2f(uint16_t h)
{
    return __uint_as_float((uint32_t)h << 16);
}

/* Element (r, c) of a weight as f32, any dtype. */
__device__ float w_at(const dweight &w, int64_t r, int64_t c)
{
    switch (w.dtype) {
    case DTYPE_F32:
        return ((const float *)w.data)[r * w.cols + c];
    case DTYPE_F16:
        return h2f(((const uint16_t *)w.data)[r * w.cols + c]);
    case DTYPE_BF16:
        return bf2f(((const uint16_t *)w.data)[r * w.cols + c]);
    case DTYPE_Q8: {
        int64_t gi = r * (w.cols / w.group) + c / w.group;
        float q = (float)((const uint8_t *)w.data)[r * w.cols + c];
        return (q - h2f(w.zeros[gi])) * h2f(w.scales[gi]);
    }
    case DTYPE_Q4: {
        int64_t gi = r * (w.cols / w.group) + c / w.group;
        uint8_t byte = ((const uint8_t *)w.data)[r * (w.cols / 2) + c / 2];
        float q = (float)((c & 1) ? byte >> 4 : byte & 15);
        return (q - h2f(w.zeros[gi])) * h2f(w.scales[gi]);
    }
    default:
        return 0.0f;
    }
}

/* A 1-D weight read flat (the CPU accepts any rows x cols == d for f32 vectors). */
__device__ __forceinline__ float w_flat(const dweight &w, int64_t j)
{
    return w_at(w, j / w.cols, j % w.cols);
}

__device__ __forceinline__ float warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* Sum over a block of blockDim.x (a multiple of 32, at most 1024) threads; every thread
 * gets the result. */
__device__ float block_sum(float v)
{
    __shared__ float part[32];
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0)
        part[wid] = v;
    __syncthreads();
    float t = lane < nw ? part[lane] : 0.0f;
    return warp_sum(t);
}

static unsigned blocks_for(int64_t n, int threads)
{
    return (unsigned)((n + threads - 1) / threads);
}

/* ---- buffers ---------------------------------------------------------------------------- */

static void *cuda_buf_alloc(ops_ctx_t *ctx, size_t n_elems)
{
    if (cu_enter(ctx))
        return NULL;
    void *p = NULL;
    size_t bytes = (n_elems ? n_elems : 1) * sizeof(float);
    cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess) {
        cu_fail(e, "buffer");
        return NULL;
    }
    e = cudaMemsetAsync(p, 0, bytes, ctx->stream);
    if (e != cudaSuccess) {
        cu_fail(e, "zero buffer");
        cudaFree(p);
        return NULL;
    }
    return p;
}

static void cuda_buf_free(ops_ctx_t *ctx, void *buf)
{
    if (!buf)
        return;
    (void)cudaSetDevice(ctx->device);
    /* cudaFree fails only on a pointer we did not allocate or a dead context; nothing can
     * be done about either here. */
    if (cudaFree(buf) != cudaSuccess)
        (void)cudaGetLastError();
}

static int cuda_to_host(ops_ctx_t *ctx, float *dst, const void *src, size_t offset, size_t n)
{
    if (n && (!dst || !src))
        return river_err_set(RIVER_EINVAL, "cuda to_host: NULL buffer");
    if (!n)
        return 0;
    int e = cu_enter(ctx);
    if (e)
        return e;
    CU_TRY(cudaMemcpyAsync(dst, (const float *)src + offset, n * sizeof(float),
                           cudaMemcpyDeviceToHost, ctx->stream),
           "to_host");
    CU_TRY(cudaStreamSynchronize(ctx->stream), "to_host");
    return 0;
}

static int cuda_from_host(ops_ctx_t *ctx, void *dst, size_t offset, const float *src, size_t n)
{
    if (n && (!dst || !src))
        return river_err_set(RIVER_EINVAL, "cuda from_host: NULL buffer");
    if (!n)
        return 0;
    int e = cu_enter(ctx);
    if (e)
        return e;
    CU_TRY(cudaMemcpyAsync((float *)dst + offset, src, n * sizeof(float),
                           cudaMemcpyHostToDevice, ctx->stream),
           "from_host");
    return 0;
}

/* ---- embed ------------------------------------------------------------------------------ */

__global__ void k_embed(float *out, dweight t, const int32_t *tokens, int n)
{
    int i = blockIdx.y;
    for (int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; c < t.cols;
         c += (int64_t)gridDim.x * blockDim.x)
        out[(int64_t)i * t.cols + c] = w_at(t, tokens[i], c);
}

static int cuda_embed(ops_ctx_t *ctx, void *out, const weight_t *table, const int32_t *tokens,
                      int n)
{
    int e = weight_check(table, "embed");
    if (e)
        return e;
    if (n < 0 || (n > 0 && (!out || !tokens)))
        return river_err_set(RIVER_EINVAL, "cuda embed: %d tokens", n);
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= table->rows)
            return river_err_set(RIVER_ERANGE, "cuda embed: token %d outside vocabulary of "
                                 "%lld", (int)tokens[i], (long long)table->rows);
    if (n == 0)
        return 0;
    const void *dtok;
    if ((e = cu_enter(ctx)) || (e = stage_put(ctx, tokens, (size_t)n * sizeof(int32_t), &dtok)))
        return e;
    dim3 grid(blocks_for(table->cols, 256) < 64 ? blocks_for(table->cols, 256) : 64, n);
    k_embed<<<grid, 256, 0, ctx->stream>>>((float *)out, to_dweight(table),
                                           (const int32_t *)dtok, n);
    CU_LAUNCHED("embed");
    return 0;
}

/* ---- rmsnorm, add_bias, add ------------------------------------------------------------- */

__global__ void k_rmsnorm(float *out, const float *x, dweight w, int d, float eps)
{
    const float *xi = x + (int64_t)blockIdx.x * d;
    float *oi = out + (int64_t)blockIdx.x * d;
    float ss = 0.0f;
    for (int j = threadIdx.x; j < d; j += blockDim.x)
        ss += xi[j] * xi[j];
    ss = block_sum(ss);
    /* The CPU's order: mean of squares, plus eps, reciprocal square root, weight last. */
    ss = ss / (float)d + eps;
    ss = 1.0f / sqrtf(ss);
    for (int j = threadIdx.x; j < d; j += blockDim.x)
        oi[j] = xi[j] * ss * w_flat(w, j);
}

static int vector_check(const weight_t *w, int d, const char *what)
{
    int e = weight_check(w, what);
    if (e)
        return e;
    if (w->rows * w->cols != d)
        return river_err_set(RIVER_ESHAPE, "cuda %s: weight (%lld, %lld) for width %d", what,
                             (long long)w->rows, (long long)w->cols, d);
    if (w->dtype != DTYPE_F32 && w->rows != 1)
        return river_err_set(RIVER_ESHAPE, "cuda %s: %s vector of %lld rows", what,
                             dtype_name(w->dtype), (long long)w->rows);
    return 0;
}

static int cuda_rmsnorm(ops_ctx_t *ctx, void *out, const void *x, const weight_t *w, int n,
                        int d, float eps)
{
    if (n < 0 || d <= 0 || (n > 0 && (!out || !x)))
        return river_err_set(RIVER_EINVAL, "cuda rmsnorm: n %d, d %d", n, d);
    int e = vector_check(w, d, "rmsnorm");
    if (e || n == 0)
        return e;
    if ((e = cu_enter(ctx)))
        return e;
    k_rmsnorm<<<n, 256, 0, ctx->stream>>>((float *)out, (const float *)x, to_dweight(w), d,
                                          eps);
    CU_LAUNCHED("rmsnorm");
    return 0;
}

__global__ void k_add_bias(float *y, dweight b, int64_t total, int d)
{
    for (int64_t k = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; k < total;
         k += (int64_t)gridDim.x * blockDim.x)
        y[k] += w_flat(b, k % d);
}

static unsigned grid_cap(int64_t n, int threads)
{
    unsigned g = blocks_for(n, threads);
    return g < 4096 ? (g ? g : 1) : 4096;
}

static int cuda_add_bias(ops_ctx_t *ctx, void *y, const weight_t *b, int n, int d)
{
    if (n < 0 || d <= 0 || (n > 0 && !y))
        return river_err_set(RIVER_EINVAL, "cuda add_bias: n %d, d %d", n, d);
    int e = vector_check(b, d, "add_bias");
    if (e || n == 0)
        return e;
    if ((e = cu_enter(ctx)))
        return e;
    int64_t total = (int64_t)n * d;
    k_add_bias<<<grid_cap(total, 256), 256, 0, ctx->stream>>>((float *)y, to_dweight(b), total,
                                                                d);
    CU_LAUNCHED("add_bias");
    return 0;
}

__global__ void k_add(float *y, const float *x, int64_t total)
{
    for (int64_t k = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; k < total;
         k += (int64_t)gridDim.x * blockDim.x)
        y[k] += x[k];
}

static int cuda_add(ops_ctx_t *ctx, void *y, const void *x, size_t n_elems)
{
    if (n_elems == 0)
        return 0;
    if (!y || !x)
        return river_err_set(RIVER_EINVAL, "cuda add: NULL buffer");
    int e = cu_enter(ctx);
    if (e)
        return e;
    k_add<<<grid_cap((int64_t)n_elems, 256), 256, 0, ctx->stream>>>((float *)y,
                                                                     (const float *)x,
                                                                     (int64_t)n_elems);
    CU_LAUNCHED("add");
    return 0;
}

/* ---- rope ------------------------------------------------------------------------------- */

/* One block per row; threads over (head, pair). */
__global__ void k_rope(float *x, const int32_t *pos, const float *inv_freq, int n_heads,
                       int head_dim, int half, int layout, float attn_factor)
{
    int i = blockIdx.x;
    float p = (float)pos[i];
    float *row = x + (int64_t)i * n_heads * head_dim;
    for (int k = threadIdx.x; k < n_heads * half; k += blockDim.x) {
        int h = k / half, f = k % half;
        float angle = p * inv_freq[f];
        float cs = cosf(angle) * attn_factor, sn = sinf(angle) * attn_factor;
        float *xh = row + (int64_t)h * head_dim;
        int a = layout == ROPE_INTERLEAVED ? 2 * f : f;
        int b = layout == ROPE_INTERLEAVED ? 2 * f + 1 : f + half;
        float x0 = xh[a], x1 = xh[b];
        xh[a] = x0 * cs - x1 * sn;
        xh[b] = x0 * sn + x1 * cs;
    }
}

static int cuda_rope(ops_ctx_t *ctx, void *x, const int32_t *pos, int n, int n_heads,
                     const rope_t *rope)
{
    if (n < 0 || n_heads <= 0 || !rope || (n > 0 && (!x || !pos)))
        return river_err_set(RIVER_EINVAL, "cuda rope: n %d, %d heads", n, n_heads);
    if (rope->head_dim <= 0 || rope->rot_dim <= 0 || rope->rot_dim % 2 != 0 ||
        rope->rot_dim > rope->head_dim || !rope->inv_freq ||
        (rope->layout != ROPE_INTERLEAVED && rope->layout != ROPE_HALF))
        return river_err_set(RIVER_EINVAL, "cuda rope: head_dim %d, rot_dim %d, layout %d",
                             rope->head_dim, rope->rot_dim, (int)rope->layout);
    if (n == 0)
        return 0;
    int half = rope->rot_dim / 2;
    int e;
    /* Both inputs hit the upload slots after the first layer of a step (the frequencies
     * after the first call of the backend). */
    const void *dpos, *dfreq;
    if ((e = cu_enter(ctx)) || (e = stage_put(ctx, pos, (size_t)n * sizeof(int32_t), &dpos)) ||
        (e = stage_put(ctx, rope->inv_freq, (size_t)half * sizeof(float), &dfreq)))
        return e;
    k_rope<<<n, 256, 0, ctx->stream>>>((float *)x, (const int32_t *)dpos, (const float *)dfreq,
                                       n_heads, rope->head_dim, half, (int)rope->layout,
                                       rope->attn_factor);
    CU_LAUNCHED("rope");
    return 0;
}

/* ---- swiglu ----------------------------------------------------------------------------- */

__global__ void k_swiglu(float *out, const float *g, const float *u, int n, int d, int stride)
{
    int64_t total = (int64_t)n * d;
    for (int64_t k = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; k < total;
         k += (int64_t)gridDim.x * blockDim.x) {
        int64_t i = k / d, j = k % d;
        float gv = g[i * stride + j];
        out[k] = gv / (1.0f + expf(-gv)) * u[i * stride + j];
    }
}

static int cuda_swiglu(ops_ctx_t *ctx, void *out, const void *gate, const void *up, int n,
                       int d, int stride)
{
    if (n < 0 || d <= 0 || stride < d || (n > 0 && (!out || !gate || !up)))
        return river_err_set(RIVER_EINVAL, "cuda swiglu: n %d, d %d, stride %d", n, d, stride);
    if (n == 0)
        return 0;
    int e = cu_enter(ctx);
    if (e)
        return e;
    k_swiglu<<<grid_cap((int64_t)n * d, 256), 256, 0, ctx->stream>>>(
        (float *)out, (const float *)gate, (const float *)up, n, d, stride);
    CU_LAUNCHED("swiglu");
    return 0;
}

/* ---- matmul ----------------------------------------------------------------------------- */

/* Rows of x one GEMV pass handles; the weight is read once per pass. */
#define GEMV_ROWS 8
/* Output features per block: one warp each. */
#define GEMV_WARPS 8
/* 8-column loads each lane keeps in flight per step of the 16-byte kernel. */
#define GEMV_UNROLL 4
/* Columns one step of a warp covers: 32 lanes, GEMV_UNROLL loads of 8 columns each. Split-K
 * chunks are multiples of it, so every lane's loads stay aligned. */
#define GEMV_STEP (32 * 8 * GEMV_UNROLL)

/* Group index of column c (c < 2^31: matmul refuses wider weights) without a division
 * where the group is a power of two, as it is in every checkpoint seen so far. */
__device__ __forceinline__ int group_of(const dweight &w, int c)
{
    return w.gshift >= 0 ? c >> w.gshift : c / w.group;
}

/* Eight consecutive weights of row r from column c (c % 8 == 0, and for Q4/Q8 the eight
 * lie in one group), loaded with one wide access. */
template <int DT>
__device__ __forceinline__ void load8(const dweight &w, int64_t r, int c, float v[8])
{
    if (DT == DTYPE_F32) {
        const float4 *p = (const float4 *)((const float *)w.data + r * w.cols + c);
        float4 a = p[0], b = p[1];
        v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
        v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
    } else if (DT == DTYPE_F16 || DT == DTYPE_BF16) {
        uint4 q = *(const uint4 *)((const uint16_t *)w.data + r * w.cols + c);
        uint32_t u[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
        for (int k = 0; k < 4; k++) {
            uint16_t lo = (uint16_t)(u[k] & 0xffffu), hi = (uint16_t)(u[k] >> 16);
            v[2 * k] = DT == DTYPE_F16 ? h2f(lo) : bf2f(lo);
            v[2 * k + 1] = DT == DTYPE_F16 ? h2f(hi) : bf2f(hi);
        }
    } else {
        int64_t gi = r * w.ngroups + group_of(w, c);
        float s = h2f(w.scales[gi]), z = h2f(w.zeros[gi]);
        if (DT == DTYPE_Q8) {
            uint2 q = *(const uint2 *)((const uint8_t *)w.data + r * w.cols + c);
            uint32_t u[2] = {q.x, q.y};
#pragma unroll
            for (int k = 0; k < 8; k++)
                v[k] = ((float)((u[k / 4] >> (8 * (k % 4))) & 0xffu) - z) * s;
        } else {
            /* Q4: low nibble is the even column. */
            uint32_t q = *(const uint32_t *)((const uint8_t *)w.data + r * (w.cols / 2) + c / 2);
#pragma unroll
            for (int k = 0; k < 8; k++)
                v[k] = ((float)((q >> (4 * k)) & 0xfu) - z) * s;
        }
    }
}

/* Sums of one output feature r over the rows of x of this pass: to y, or with split-K to
 * this split's slice of the partials (summed by k_splitk_sum). */
__device__ __forceinline__ void gemv_store(float *y, float *part, const float acc[GEMV_ROWS],
                                           int64_t rows, int64_t r, int n, int i0, int nr,
                                           int lane)
{
#pragma unroll
    for (int i = 0; i < GEMV_ROWS; i++) {
        float s = warp_sum(acc[i]);
        if (lane == 0 && i < nr) {
            int64_t at = (int64_t)(i0 + i) * rows + r;
            if (gridDim.z == 1)
                y[at] = s;
            else
                part[(int64_t)blockIdx.z * n * rows + at] = s;
        }
    }
}

/* y (n, rows) = x (n, cols) W^T for up to GEMV_ROWS rows of x (blockIdx.y picks which) and
 * the columns of split blockIdx.z (kchunk each): one warp per output feature, each lane
 * issuing GEMV_UNROLL independent 16-byte (f32: 32-byte) coalesced loads before it uses
 * any, so enough bytes are in flight to stream the weight at memory speed. */
template <int DT>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
k_gemv8(float *y, float *part, const float *x, dweight w, int n, int kchunk)
{
    int lane = threadIdx.x & 31;
    int64_t r = (int64_t)blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5);
    int i0 = blockIdx.y * GEMV_ROWS;
    int nr = n - i0 < GEMV_ROWS ? n - i0 : GEMV_ROWS;
    if (r >= w.rows)
        return;
    int cols = (int)w.cols;
    int kbeg = blockIdx.z * kchunk;
    int kend = cols - kbeg < kchunk ? cols : kbeg + kchunk;
    float acc[GEMV_ROWS];
#pragma unroll
    for (int i = 0; i < GEMV_ROWS; i++)
        acc[i] = 0.0f;
    for (int c0 = kbeg + lane * 8; c0 < kend; c0 += GEMV_STEP) {
        float v[GEMV_UNROLL][8];
#pragma unroll
        for (int u = 0; u < GEMV_UNROLL; u++)
            if (c0 + u * 256 < kend)
                load8<DT>(w, r, c0 + u * 256, v[u]);
#pragma unroll
        for (int u = 0; u < GEMV_UNROLL; u++) {
            int c = c0 + u * 256;
            if (c >= kend)
                break;
#pragma unroll
            for (int i = 0; i < GEMV_ROWS; i++) {
                if (i < nr) {
                    const float4 *xp = (const float4 *)(x + (int64_t)(i0 + i) * cols + c);
                    float4 a = __ldg(xp), b = __ldg(xp + 1);
                    acc[i] += v[u][0] * a.x + v[u][1] * a.y + v[u][2] * a.z + v[u][3] * a.w +
                              v[u][4] * b.x + v[u][5] * b.y + v[u][6] * b.z + v[u][7] * b.w;
                }
            }
        }
    }
    gemv_store(y, part, acc, w.rows, r, n, i0, nr, lane);
}

/* W4A16 with wide loads: each lane reads 16 bytes (32 columns, one group: group % 32 == 0)
 * per step, with one scale and zero for the 32. */
__global__ void __launch_bounds__(GEMV_WARPS * 32)
k_gemv_q4w(float *y, float *part, const float *x, dweight w, int n, int kchunk)
{
    int lane = threadIdx.x & 31;
    int64_t r = (int64_t)blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5);
    int i0 = blockIdx.y * GEMV_ROWS;
    int nr = n - i0 < GEMV_ROWS ? n - i0 : GEMV_ROWS;
    if (r >= w.rows)
        return;
    int cols = (int)w.cols;
    int kbeg = blockIdx.z * kchunk;
    int kend = cols - kbeg < kchunk ? cols : kbeg + kchunk;
    const uint8_t *wr = (const uint8_t *)w.data + r * (w.cols / 2);
    const uint16_t *sr = w.scales + r * w.ngroups, *zr = w.zeros + r * w.ngroups;
    float acc[GEMV_ROWS];
#pragma unroll
    for (int i = 0; i < GEMV_ROWS; i++)
        acc[i] = 0.0f;
    for (int c = kbeg + lane * 32; c < kend; c += 32 * 32) {
        uint4 q = *(const uint4 *)(wr + c / 2);
        int g = group_of(w, c);
        float s = h2f(sr[g]), z = h2f(zr[g]);
        uint32_t u[4] = {q.x, q.y, q.z, q.w};
        float v[32];
#pragma unroll
        for (int k = 0; k < 32; k++)
            v[k] = ((float)((u[k / 8] >> (4 * (k % 8))) & 0xfu) - z) * s;
#pragma unroll
        for (int i = 0; i < GEMV_ROWS; i++) {
            if (i < nr) {
                const float4 *xp = (const float4 *)(x + (int64_t)(i0 + i) * cols + c);
                float t = 0.0f;
#pragma unroll
                for (int k = 0; k < 8; k++) {
                    float4 a = __ldg(xp + k);
                    t += v[4 * k] * a.x + v[4 * k + 1] * a.y + v[4 * k + 2] * a.z +
                         v[4 * k + 3] * a.w;
                }
                acc[i] += t;
            }
        }
    }
    gemv_store(y, part, acc, w.rows, r, n, i0, nr, lane);
}

/* Any shape and group: one element at a time (columns not a multiple of 8, odd groups). */
__global__ void __launch_bounds__(GEMV_WARPS * 32)
k_gemv_any(float *y, const float *x, dweight w, int n)
{
    int lane = threadIdx.x & 31;
    int64_t r = (int64_t)blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5);
    int i0 = blockIdx.y * GEMV_ROWS;
    int nr = n - i0 < GEMV_ROWS ? n - i0 : GEMV_ROWS;
    if (r >= w.rows)
        return;
    float acc[GEMV_ROWS];
#pragma unroll
    for (int i = 0; i < GEMV_ROWS; i++)
        acc[i] = 0.0f;
    for (int64_t c = lane; c < w.cols; c += 32) {
        float v = w_at(w, r, c);
#pragma unroll
        for (int i = 0; i < GEMV_ROWS; i++)
            if (i < nr)
                acc[i] += v * x[(int64_t)(i0 + i) * w.cols + c];
    }
#pragma unroll
    for (int i = 0; i < GEMV_ROWS; i++) {
        float s = warp_sum(acc[i]);
        if (lane == 0 && i < nr)
            y[(int64_t)(i0 + i) * w.rows + r] = s;
    }
}

/* y[k] = sum over the ks splits of part[z][k], in split order (deterministic, unlike
 * atomics: two runs of one batch give the same bits). */
__global__ void k_splitk_sum(float *y, const float *part, int ks, int64_t total)
{
    for (int64_t k = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; k < total;
         k += (int64_t)gridDim.x * blockDim.x) {
        float s = 0.0f;
        for (int z = 0; z < ks; z++)
            s += part[(int64_t)z * total + k];
        y[k] = s;
    }
}

/* Split-K for short-and-wide matrices (the K/V projections of a decode step: few output
 * features, so few blocks): enough splits to give the device two blocks per
 * multiprocessor, each at least one warp step of `step` columns. */
static int gemv_splits(const ops_ctx_t *ctx, int64_t blocks, int cols, int step, int *kchunk)
{
    int ks = 1;
    int64_t target = 2 * (int64_t)ctx->n_sm;
    if (blocks < target && cols >= 2 * step) {
        int64_t want = (target + blocks - 1) / blocks;
        int64_t most = cols / step;
        ks = (int)(want < most ? want : most);
        ks = ks < 16 ? ks : 16;
        ks = ks < 1 ? 1 : ks;
    }
    int chunk = (cols + ks - 1) / ks;
    chunk = (chunk + step - 1) / step * step;
    *kchunk = chunk;
    return (cols + chunk - 1) / chunk;
}

static int gemv_launch(ops_ctx_t *ctx, float *y, const float *x, const weight_t *w, int n)
{
    dweight dw = to_dweight(w);
    int quant = w->dtype == DTYPE_Q4 || w->dtype == DTYPE_Q8;
    /* The wide loads need 16-byte aligned rows of x and W: x may be a pointer into the
     * middle of a buffer (a fused half), and a misaligned vector load is a fatal error
     * that poisons the whole context, so anything unaligned takes the element path. */
    int wide = w->cols % 8 == 0 && (!quant || w->group % 8 == 0) &&
               (uintptr_t)x % 16 == 0 && (uintptr_t)w->data % 16 == 0;
    int q4w = wide && w->dtype == DTYPE_Q4 && w->cols % 32 == 0 && w->group % 32 == 0;
    int64_t row_blocks = blocks_for(w->rows, GEMV_WARPS);
    unsigned passes = (unsigned)((n + GEMV_ROWS - 1) / GEMV_ROWS);
    dim3 block(GEMV_WARPS * 32);
    if (!wide) {
        k_gemv_any<<<dim3((unsigned)row_blocks, passes), block, 0, ctx->stream>>>(y, x, dw, n);
        CU_LAUNCHED("matmul gemv");
        return 0;
    }
    int kchunk;
    int ks = gemv_splits(ctx, row_blocks * passes, (int)w->cols, q4w ? 32 * 32 : GEMV_STEP,
                         &kchunk);
    float *part = NULL;
    int64_t total = (int64_t)n * w->rows;
    if (ks > 1) {
        int e = scratch_reserve(ctx, (size_t)ks * (size_t)total * sizeof(float));
        if (e)
            return e;
        part = (float *)ctx->scratch;
    }
    dim3 grid((unsigned)row_blocks, passes, (unsigned)ks);
    if (q4w)
        k_gemv_q4w<<<grid, block, 0, ctx->stream>>>(y, part, x, dw, n, kchunk);
    else if (w->dtype == DTYPE_F32)
        k_gemv8<DTYPE_F32><<<grid, block, 0, ctx->stream>>>(y, part, x, dw, n, kchunk);
    else if (w->dtype == DTYPE_F16)
        k_gemv8<DTYPE_F16><<<grid, block, 0, ctx->stream>>>(y, part, x, dw, n, kchunk);
    else if (w->dtype == DTYPE_BF16)
        k_gemv8<DTYPE_BF16><<<grid, block, 0, ctx->stream>>>(y, part, x, dw, n, kchunk);
    else if (w->dtype == DTYPE_Q8)
        k_gemv8<DTYPE_Q8><<<grid, block, 0, ctx->stream>>>(y, part, x, dw, n, kchunk);
    else
        k_gemv8<DTYPE_Q4><<<grid, block, 0, ctx->stream>>>(y, part, x, dw, n, kchunk);
    CU_LAUNCHED("matmul gemv");
    if (ks > 1) {
        k_splitk_sum<<<grid_cap(total, 256), 256, 0, ctx->stream>>>(y, part, ks, total);
        CU_LAUNCHED("matmul split-k");
    }
    return 0;
}

__global__ void k_to_bf16(__nv_bfloat16 *out, const float *x, int64_t total)
{
    for (int64_t k = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; k < total;
         k += (int64_t)gridDim.x * blockDim.x)
        out[k] = __float2bfloat16(x[k]);
}

__global__ void k_to_f16(__half *out, const float *x, int64_t total)
{
    for (int64_t k = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; k < total;
         k += (int64_t)gridDim.x * blockDim.x)
        out[k] = __float2half(x[k]);
}

/* Batches of rows through cuBLAS: row-major y (n, rows) is column-major y^T (rows, n) =
 * W x^T, and row-major W (rows, cols) is column-major W^T, hence op(A) = T. GemmEx wants
 * A and B of one type, so a 16-bit weight gets x converted to its type first. */
static int gemm_launch(ops_ctx_t *ctx, float *y, const float *x, const weight_t *w, int n)
{
    const float alpha = 1.0f, beta = 0.0f;
    int m = (int)w->rows, k = (int)w->cols;
    const void *b = x;
    cudaDataType_t t = CUDA_R_32F;
    int64_t total = (int64_t)n * k;
    if (w->dtype != DTYPE_F32) {
        int e = scratch_reserve(ctx, (size_t)total * 2);
        if (e)
            return e;
        if (w->dtype == DTYPE_BF16) {
            t = CUDA_R_16BF;
            k_to_bf16<<<grid_cap(total, 256), 256, 0, ctx->stream>>>(
                (__nv_bfloat16 *)ctx->scratch, x, total);
        } else {
            t = CUDA_R_16F;
            k_to_f16<<<grid_cap(total, 256), 256, 0, ctx->stream>>>((__half *)ctx->scratch, x,
                                                                      total);
        }
        CU_LAUNCHED("matmul convert");
        b = ctx->scratch;
    }
    cublasStatus_t st = cublasGemmEx(ctx->blas, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &alpha,
                                     w->data, t, k, b, t, k, &beta, y, CUDA_R_32F, m,
                                     CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (st != CUBLAS_STATUS_SUCCESS)
        return blas_fail(st, "matmul");
    return 0;
}

static int cuda_matmul(ops_ctx_t *ctx, void *y, const void *x, const weight_t *w, int n)
{
    int e = weight_check(w, "matmul");
    if (e)
        return e;
    if (n < 0 || (n > 0 && (!y || !x)) || y == x)
        return river_err_set(RIVER_EINVAL, "cuda matmul: n %d", n);
    if (w->rows > INT32_MAX || w->cols > INT32_MAX)
        return river_err_set(RIVER_ESHAPE, "cuda matmul: (%lld, %lld) too large",
                             (long long)w->rows, (long long)w->cols);
    if (n == 0)
        return 0;
    if ((e = cu_enter(ctx)))
        return e;
    int quant = w->dtype == DTYPE_Q4 || w->dtype == DTYPE_Q8;
    if (quant || n <= GEMV_ROWS)
        return gemv_launch(ctx, (float *)y, (const float *)x, w, n);
    return gemm_launch(ctx, (float *)y, (const float *)x, w, n);
}

/* ---- kv_write --------------------------------------------------------------------------- */

/* Per row, as packed on the host: position and where its page table starts in the packed
 * page ids. */
struct attn_row {
    int32_t pos;
    int32_t pt_off;
};

/* The device copies of a batch's packed rows and page tables. kv_write and attention of
 * one layer, and every layer of a step, pack the same bytes, so after the first op of a
 * step they come from an upload slot without a copy. */
typedef struct attn_pack {
    const attn_row *rows;  /* (n) */
    const int32_t *pages;  /* page ids of every row, concatenated */
    int32_t max_len;       /* longest row context: max(pos) + 1 */
} attn_pack_t;

/* Checks and packs b's rows and page tables (entries 0..pos/page_size of each) and makes
 * them readable on the device. Attention (all_pages) reads every page of a row, so every
 * page must be inside the pool; kv_write reads only the page of pos, as on the CPU. */
static int attn_pack(ops_ctx_t *ctx, const kv_view_t *kv, const attn_batch_t *b, int all_pages,
                     attn_pack_t *pk)
{
    const char *what = all_pages ? "attention" : "kv";
    int64_t n_pt = 0;
    int32_t max_len = 0;
    for (int i = 0; i < b->n; i++) {
        if (b->pos[i] < 0)
            return river_err_set(all_pages ? RIVER_EINVAL : RIVER_ERANGE,
                                 "cuda %s: row %d at position %d", what, i, (int)b->pos[i]);
        if (!b->page_table[i])
            return river_err_set(RIVER_EINVAL, "cuda %s: row %d has no page table", what, i);
        int64_t np = (int64_t)b->pos[i] / kv->page_size + 1;
        for (int64_t p = all_pages ? 0 : np - 1; p < np; p++) {
            int32_t page = b->page_table[i][p];
            if (page < 0 || page >= kv->n_pages)
                return river_err_set(RIVER_ERANGE, "cuda %s: page %d outside pool of %d",
                                     what, (int)page, kv->n_pages);
        }
        n_pt += np;
        if (b->pos[i] + 1 > max_len)
            max_len = b->pos[i] + 1;
    }
    if (n_pt > INT32_MAX)
        return river_err_set(RIVER_ERANGE, "cuda %s: %lld page ids", what, (long long)n_pt);
    size_t rows_bytes = align256((size_t)b->n * sizeof(attn_row));
    size_t total = rows_bytes + (size_t)n_pt * sizeof(int32_t);
    int e = host_reserve(ctx, total);
    if (e)
        return e;
    /* Padding bytes are zeroed too: the slots compare whole buffers. */
    memset(ctx->host, 0, rows_bytes);
    attn_row *rows = (attn_row *)ctx->host;
    int32_t *pages = (int32_t *)((char *)ctx->host + rows_bytes);
    int64_t at = 0;
    for (int i = 0; i < b->n; i++) {
        int64_t np = (int64_t)b->pos[i] / kv->page_size + 1;
        rows[i].pos = b->pos[i];
        rows[i].pt_off = (int32_t)at;
        memcpy(pages + at, b->page_table[i], (size_t)np * sizeof(int32_t));
        at += np;
    }
    const void *d;
    if ((e = stage_put(ctx, ctx->host, total, &d)))
        return e;
    pk->rows = (const attn_row *)d;
    pk->pages = (const int32_t *)((const char *)d + rows_bytes);
    pk->max_len = max_len;
    return 0;
}

/* The kv_valid bytes of layer `layer` for every row that has a map, behind one offset per
 * row (-1: every slot valid). They change from layer to layer, so they are the one input
 * uploaded per layer, and only by the masking baseline. *voff is NULL without maps. */
static int attn_valid(ops_ctx_t *ctx, const attn_batch_t *b, int layer, const int64_t **voff,
                      const uint8_t **valid)
{
    *voff = NULL;
    *valid = NULL;
    if (!b->kv_valid)
        return 0;
    size_t off_bytes = align256((size_t)b->n * sizeof(int64_t));
    size_t total = off_bytes;
    for (int i = 0; i < b->n; i++)
        if (b->kv_valid[i])
            total += (size_t)b->pos[i] + 1;
    int e = host_reserve(ctx, total);
    if (e)
        return e;
    memset(ctx->host, 0, off_bytes);
    int64_t *off = (int64_t *)ctx->host;
    uint8_t *bytes = (uint8_t *)ctx->host + off_bytes;
    int64_t at = 0;
    for (int i = 0; i < b->n; i++) {
        off[i] = -1;
        if (b->kv_valid[i]) {
            off[i] = at;
            memcpy(bytes + at, b->kv_valid[i] + (int64_t)layer * b->kv_valid_stride,
                   (size_t)b->pos[i] + 1);
            at += (int64_t)b->pos[i] + 1;
        }
    }
    const void *d;
    if ((e = stage_put(ctx, ctx->host, total, &d)))
        return e;
    *voff = (const int64_t *)d;
    *valid = (const uint8_t *)d + off_bytes;
    return 0;
}

/* Row blockIdx.x goes to slot (layer, pos) of its sequence's pages. */
__global__ void k_kv_write(float *K, float *V, const attn_row *rows, const int32_t *pages,
                           int64_t page_stride, int64_t layer_off, int page_size,
                           const float *k, const float *v, int kv_dim)
{
    int i = blockIdx.x;
    attn_row r = rows[i];
    int64_t o = (int64_t)pages[r.pt_off + r.pos / page_size] * page_stride + layer_off +
                (int64_t)(r.pos % page_size) * kv_dim;
    for (int j = threadIdx.x; j < kv_dim; j += blockDim.x) {
        K[o + j] = k[(int64_t)i * kv_dim + j];
        V[o + j] = v[(int64_t)i * kv_dim + j];
    }
}

static int cuda_kv_write(ops_ctx_t *ctx, const kv_view_t *kv, int layer, const attn_batch_t *b,
                         const void *k, const void *v)
{
    if (!kv || !b || layer < 0 || kv->page_size <= 0 || kv->kv_dim <= 0 || b->n < 0 ||
        (b->n > 0 && (!k || !v || !b->pos || !b->page_table || !kv->k || !kv->v)))
        return river_err_set(RIVER_EINVAL, "cuda kv_write: bad arguments");
    if (b->n == 0)
        return 0;
    attn_pack_t pk;
    int e;
    if ((e = cu_enter(ctx)) || (e = attn_pack(ctx, kv, b, 0, &pk)))
        return e;
    k_kv_write<<<b->n, 256, 0, ctx->stream>>>((float *)kv->k, (float *)kv->v, pk.rows,
                                              pk.pages, kv->page_stride,
                                              (int64_t)layer * kv->layer_stride,
                                              kv->page_size, (const float *)k,
                                              (const float *)v, kv->kv_dim);
    CU_LAUNCHED("kv_write");
    return 0;
}

/* ---- attention -------------------------------------------------------------------------- */

#define ATTN_WARPS 4
#define ATTN_MAX_HD 256
/* Query heads one block serves: the heads of one KV head (GQA), ATTN_GMAX at a time. */
#define ATTN_GMAX 8
/* Fewest positions one split of a row's context takes. */
#define ATTN_MIN_CHUNK 64

/* Flash-decoding attention. Block (head chunk, split, row) takes positions
 * [split*chunk, split*chunk + chunk) of its row's context and the query heads g0..g0+ng-1
 * of one KV head, so each K/V row is read once for all the query heads that share it.
 * Each warp takes every ATTN_WARPS-th position and keeps an online softmax per query
 * head (running max, sum, weighted V) with head_dim spread over its lanes (PER elements
 * each); the warps are merged with the usual log-sum-exp rescaling. With one split the
 * block writes the normalised output; with more it writes its unnormalised partial and
 * its (max, sum) for k_attn_reduce. */
template <int PER>
__global__ void __launch_bounds__(ATTN_WARPS * 32)
k_attn_split(float *out, float *part_o, float *part_ml, const float *q, const float *K,
             const float *V, const attn_row *rows, const int32_t *pages, const int64_t *voff,
             const uint8_t *valid, int64_t page_stride, int64_t layer_off, int page_size,
             int kv_dim, int n_heads, int G, int hd, int chunk, int n_splits, float scale)
{
    __shared__ float s_m[ATTN_WARPS][ATTN_GMAX], s_l[ATTN_WARPS][ATTN_GMAX];
    __shared__ float s_o[ATTN_WARPS][ATTN_GMAX][PER * 32];
    int hchunks = (G + ATTN_GMAX - 1) / ATTN_GMAX;
    int kvh = blockIdx.x / hchunks, g0 = (blockIdx.x % hchunks) * ATTN_GMAX;
    int ng = G - g0 < ATTN_GMAX ? G - g0 : ATTN_GMAX;
    int split = blockIdx.y, i = blockIdx.z;
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    attn_row row = rows[i];
    int t0 = split * chunk;
    if (t0 > row.pos)
        return; /* this row's context is shorter: k_attn_reduce reads no partial here */
    int t1 = row.pos + 1 < t0 + chunk ? row.pos + 1 : t0 + chunk;
    int64_t vo = voff ? voff[i] : -1;
    int h0 = kvh * G + g0; /* first query head of the block */
    const float *qb = q + ((int64_t)i * n_heads + h0) * hd;
    int64_t kv_off = (int64_t)kvh * hd;
    float qv[ATTN_GMAX][PER], acc[ATTN_GMAX][PER], m[ATTN_GMAX], l[ATTN_GMAX];
#pragma unroll
    for (int g = 0; g < ATTN_GMAX; g++) {
        m[g] = -INFINITY;
        l[g] = 0.0f;
#pragma unroll
        for (int k = 0; k < PER; k++) {
            int d = lane + 32 * k;
            qv[g][k] = g < ng && d < hd ? qb[(int64_t)g * hd + d] : 0.0f;
            acc[g][k] = 0.0f;
        }
    }
    for (int t = t0 + wid; t < t1; t += ATTN_WARPS) {
        if (vo >= 0 && !valid[vo + t])
            continue;
        int64_t off = (int64_t)pages[row.pt_off + t / page_size] * page_stride + layer_off +
                      (int64_t)(t % page_size) * kv_dim + kv_off;
        float kr[PER], vr[PER];
#pragma unroll
        for (int k = 0; k < PER; k++) {
            int d = lane + 32 * k;
            kr[k] = d < hd ? K[off + d] : 0.0f;
            vr[k] = d < hd ? V[off + d] : 0.0f;
        }
#pragma unroll
        for (int g = 0; g < ATTN_GMAX; g++) {
            if (g >= ng) /* uniform over the block: the shuffles below stay converged */
                break;
            float dot = 0.0f;
#pragma unroll
            for (int k = 0; k < PER; k++)
                dot += qv[g][k] * kr[k];
            float s = scale * warp_sum(dot);
            float mn = s > m[g] ? s : m[g];
            float corr = expf(m[g] - mn); /* 0 on the first slot: m is -inf */
            float p = expf(s - mn);
            l[g] = l[g] * corr + p;
#pragma unroll
            for (int k = 0; k < PER; k++)
                acc[g][k] = acc[g][k] * corr + p * vr[k];
            m[g] = mn;
        }
    }
#pragma unroll
    for (int g = 0; g < ATTN_GMAX; g++) {
        if (lane == 0) {
            s_m[wid][g] = m[g];
            s_l[wid][g] = l[g];
        }
#pragma unroll
        for (int k = 0; k < PER; k++)
            s_o[wid][g][lane + 32 * k] = acc[g][k];
    }
    __syncthreads();
    for (int e = threadIdx.x; e < ng * hd; e += blockDim.x) {
        int g = e / hd, d = e % hd;
        float M = -INFINITY;
        for (int w = 0; w < ATTN_WARPS; w++)
            if (s_l[w][g] > 0.0f && s_m[w][g] > M)
                M = s_m[w][g];
        float L = 0.0f, o = 0.0f;
        for (int w = 0; w < ATTN_WARPS; w++) {
            float wgt = s_l[w][g] > 0.0f ? expf(s_m[w][g] - M) : 0.0f;
            L += s_l[w][g] * wgt;
            o += s_o[w][g][d] * wgt;
        }
        int64_t hi = (int64_t)i * n_heads + h0 + g;
        if (n_splits == 1) {
            /* L is 0 only when no slot was readable; the output is then 0, as on the CPU.
             * Only this block reads q rows (i, h0..h0+ng-1), and it has, so out may be q. */
            out[hi * hd + d] = L > 0.0f ? o / L : 0.0f;
        } else {
            part_o[(hi * n_splits + split) * hd + d] = o;
            if (d == 0) {
                part_ml[(hi * n_splits + split) * 2] = M;
                part_ml[(hi * n_splits + split) * 2 + 1] = L;
            }
        }
    }
}

/* Merges the splits of head blockIdx.x of row blockIdx.y. */
__global__ void k_attn_reduce(float *out, const float *part_o, const float *part_ml,
                              const attn_row *rows, int n_heads, int hd, int chunk,
                              int n_splits)
{
    int h = blockIdx.x, i = blockIdx.y;
    int ns = rows[i].pos / chunk + 1; /* splits that hold positions of this row */
    if (ns > n_splits)
        ns = n_splits;
    int64_t hi = (int64_t)i * n_heads + h;
    const float *ml = part_ml + hi * n_splits * 2;
    float M = -INFINITY;
    for (int s = 0; s < ns; s++)
        if (ml[2 * s + 1] > 0.0f && ml[2 * s] > M)
            M = ml[2 * s];
    float L = 0.0f;
    for (int s = 0; s < ns; s++)
        if (ml[2 * s + 1] > 0.0f)
            L += ml[2 * s + 1] * expf(ml[2 * s] - M);
    float inv = L > 0.0f ? 1.0f / L : 0.0f;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float o = 0.0f;
        for (int s = 0; s < ns; s++)
            if (ml[2 * s + 1] > 0.0f)
                o += part_o[(hi * n_splits + s) * hd + d] * expf(ml[2 * s] - M);
        out[hi * hd + d] = o * inv;
    }
}

/* Splits of the context per row: enough blocks to fill the device (a decode batch of a
 * few rows has few (row, KV head) pairs), each split at least ATTN_MIN_CHUNK positions;
 * a prefill batch has blocks enough and keeps one split (no partials, no reduce). */
static void attn_splits(const ops_ctx_t *ctx, int n, int n_kv_heads, int G, int max_len,
                        int *chunk, int *n_splits)
{
    int64_t base = (int64_t)n * n_kv_heads * ((G + ATTN_GMAX - 1) / ATTN_GMAX);
    int64_t target = 2 * (int64_t)ctx->n_sm;
    int64_t want = base >= target ? 1 : (target + base - 1) / base;
    int64_t by_len = (max_len + ATTN_MIN_CHUNK - 1) / ATTN_MIN_CHUNK;
    int64_t s = want < by_len ? want : by_len;
    if (s < 1)
        s = 1;
    int c = (int)((max_len + s - 1) / s);
    *chunk = c;
    *n_splits = (max_len + c - 1) / c;
}

static int cuda_attention(ops_ctx_t *ctx, void *out, const void *q, const kv_view_t *kv,
                          int layer, const attn_batch_t *b, int n_heads, int n_kv_heads,
                          int head_dim, float scale)
{
    if (!kv || !b || b->n < 0 || layer < 0 || n_heads <= 0 || n_kv_heads <= 0 ||
        head_dim <= 0 || n_heads % n_kv_heads != 0 || kv->page_size <= 0 ||
        kv->kv_dim != n_kv_heads * head_dim)
        return river_err_set(RIVER_EINVAL, "cuda attention: %d heads, %d kv heads, head_dim "
                             "%d, kv_dim %d", n_heads, n_kv_heads, head_dim,
                             kv ? kv->kv_dim : -1);
    if (b->n == 0)
        return 0;
    if (!out || !q || !b->pos || !b->page_table || !kv->k || !kv->v)
        return river_err_set(RIVER_EINVAL, "cuda attention: NULL buffer");
    if (head_dim > ATTN_MAX_HD)
        return river_err_set(RIVER_EUNSUPPORTED, "cuda attention: head_dim %d above %d",
                             head_dim, ATTN_MAX_HD);
    attn_pack_t pk;
    const int64_t *voff;
    const uint8_t *valid;
    int e;
    if ((e = cu_enter(ctx)) || (e = attn_pack(ctx, kv, b, 1, &pk)) ||
        (e = attn_valid(ctx, b, layer, &voff, &valid)))
        return e;
    int G = n_heads / n_kv_heads, chunk, ns;
    attn_splits(ctx, b->n, n_kv_heads, G, pk.max_len, &chunk, &ns);
    float *part_o = NULL, *part_ml = NULL;
    if (ns > 1) {
        size_t heads = (size_t)b->n * (size_t)n_heads * (size_t)ns;
        size_t o_bytes = align256(heads * (size_t)head_dim * sizeof(float));
        if ((e = scratch_reserve(ctx, o_bytes + heads * 2 * sizeof(float))))
            return e;
        part_o = (float *)ctx->scratch;
        part_ml = (float *)((char *)ctx->scratch + o_bytes);
    }
    dim3 grid((unsigned)(n_kv_heads * ((G + ATTN_GMAX - 1) / ATTN_GMAX)), (unsigned)ns,
              (unsigned)b->n);
    if (b->n > 65535)
        return river_err_set(RIVER_ERANGE, "cuda attention: %d rows in one batch", b->n);
    int64_t lo = (int64_t)layer * kv->layer_stride;
#define ATTN_LAUNCH(P)                                                                     \
    k_attn_split<P><<<grid, ATTN_WARPS * 32, 0, ctx->stream>>>(                            \
        (float *)out, part_o, part_ml, (const float *)q, (const float *)kv->k,             \
        (const float *)kv->v, pk.rows, pk.pages, voff, valid, kv->page_stride, lo,         \
        kv->page_size, kv->kv_dim, n_heads, G, head_dim, chunk, ns, scale)
    if (head_dim <= 64)
        ATTN_LAUNCH(2);
    else if (head_dim <= 128)
        ATTN_LAUNCH(4);
    else
        ATTN_LAUNCH(8);
#undef ATTN_LAUNCH
    CU_LAUNCHED("attention");
    if (ns > 1) {
        k_attn_reduce<<<dim3((unsigned)n_heads, (unsigned)b->n), 128, 0, ctx->stream>>>(
            (float *)out, part_o, part_ml, pk.rows, n_heads, head_dim, chunk, ns);
        CU_LAUNCHED("attention reduce");
    }
    return 0;
}

/* ---- cosine, gather, scatter, sync ------------------------------------------------------ */

__global__ void k_cosine(float *out, const float *a, const float *b, int d)
{
    const float *ai = a + (int64_t)blockIdx.x * d, *bi = b + (int64_t)blockIdx.x * d;
    float ab = 0.0f, aa = 0.0f, bb = 0.0f;
    for (int j = threadIdx.x; j < d; j += blockDim.x) {
        ab += ai[j] * bi[j];
        aa += ai[j] * ai[j];
        bb += bi[j] * bi[j];
    }
    ab = block_sum(ab);
    aa = block_sum(aa);
    bb = block_sum(bb);
    /* A zero vector has no direction; call it orthogonal to everything (as the CPU). */
    if (threadIdx.x == 0)
        out[blockIdx.x] = aa > 0.0f && bb > 0.0f ? ab / (sqrtf(aa) * sqrtf(bb)) : 0.0f;
}

static int cuda_cosine(ops_ctx_t *ctx, float *out, const void *a, const void *b, int n, int d)
{
    if (n < 0 || d <= 0 || (n > 0 && (!out || !a || !b)))
        return river_err_set(RIVER_EINVAL, "cuda cosine: n %d, d %d", n, d);
    if (n == 0)
        return 0;
    int e;
    if ((e = cu_enter(ctx)) || (e = scratch_reserve(ctx, (size_t)n * sizeof(float))))
        return e;
    k_cosine<<<n, 256, 0, ctx->stream>>>((float *)ctx->scratch, (const float *)a,
                                         (const float *)b, d);
    CU_LAUNCHED("cosine");
    CU_TRY(cudaMemcpyAsync(out, ctx->scratch, (size_t)n * sizeof(float),
                           cudaMemcpyDeviceToHost, ctx->stream),
           "cosine");
    CU_TRY(cudaStreamSynchronize(ctx->stream), "cosine");
    return 0;
}

/* dst[di(i)] = src[si(i)] for row i: gather reads through idx, scatter writes through it. */
__global__ void k_rows_copy(float *dst, const float *src, const int32_t *idx, int d,
                            int scatter)
{
    int i = blockIdx.x;
    int64_t di = scatter ? idx[i] : i, si = scatter ? i : idx[i];
    for (int j = threadIdx.x; j < d; j += blockDim.x)
        dst[di * d + j] = src[si * d + j];
}

static int rows_copy(ops_ctx_t *ctx, void *dst, const void *src, const int32_t *idx, int n,
                     int d, int scatter)
{
    const char *what = scatter ? "scatter_rows" : "gather_rows";
    if (n < 0 || d <= 0 || (n > 0 && (!dst || !src || !idx)))
        return river_err_set(RIVER_EINVAL, "cuda %s: n %d, d %d", what, n, d);
    for (int i = 0; i < n; i++)
        if (idx[i] < 0)
            return river_err_set(RIVER_ERANGE, "cuda %s: index %d", what, (int)idx[i]);
    if (n == 0)
        return 0;
    int e;
    const void *didx;
    if ((e = cu_enter(ctx)) || (e = stage_put(ctx, idx, (size_t)n * sizeof(int32_t), &didx)))
        return e;
    k_rows_copy<<<n, 256, 0, ctx->stream>>>((float *)dst, (const float *)src,
                                            (const int32_t *)didx, d, scatter);
    CU_LAUNCHED(what);
    return 0;
}

static int cuda_gather_rows(ops_ctx_t *ctx, void *dst, const void *src, const int32_t *idx,
                            int n, int d)
{
    return rows_copy(ctx, dst, src, idx, n, d, 0);
}

static int cuda_scatter_rows(ops_ctx_t *ctx, void *dst, const void *src, const int32_t *idx,
                             int n, int d)
{
    return rows_copy(ctx, dst, src, idx, n, d, 1);
}

static int cuda_sync(ops_ctx_t *ctx)
{
    int e = cu_enter(ctx);
    if (e)
        return e;
    CU_TRY(cudaStreamSynchronize(ctx->stream), "sync");
    return 0;
}

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
static int arena_put(ops_ctx_t *ctx, const void *src, size_t bytes, const void **dev)
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

static int cuda_graph_begin(ops_ctx_t *ctx, int *active)
{
    *active = 0;
    if (!ctx->graphs)
        return 0;
    if (ctx->graph_cooldown > 0) {
        ctx->graph_cooldown--;
        return 0;
    }
    int e = cu_enter(ctx);
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

static int cuda_graph_end(ops_ctx_t *ctx, int abort)
{
    if (!ctx->capturing)
        return 0;
    ctx->capturing = 0;
    int e = cu_enter(ctx);
    if (e)
        return e;
    cudaGraph_t g = NULL;
    cudaError_t ce = cudaStreamEndCapture(ctx->stream, &g);
    if (abort || ce != cudaSuccess) {
        if (g)
            (void)cudaGraphDestroy(g);
        graph_miss(ctx);
        e = ce != cudaSuccess ? cu_fail(ce, "graph capture") : 0;
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
            return cu_fail(ce, "graph instantiate");
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

static void graph_release(ops_ctx_t *ctx)
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

static void cuda_info(ops_ctx_t *ctx, backend_info_t *out)
{
    out->name = "cuda";
    snprintf(out->variant, sizeof out->variant, "%.47s", ctx->name);
    out->threads = 0;
    out->device = ctx->device;
    out->host_memory = 0;
}

static int upload_weight(ops_ctx_t *ctx, weight_t *w);

static int cuda_weight_upload(ops_ctx_t *ctx, weight_t *w)
{
    return upload_weight(ctx, w);
}

/* Device copies are not released yet: eviction to host memory (or to the backbone GPU of a
 * split pair) is still to come. */
static int cuda_weight_residency(ops_ctx_t *ctx, const weight_t *w, int resident)
{
    (void)ctx;
    (void)w;
    (void)resident;
    return river_err_set(RIVER_EUNSUPPORTED, "cuda backend: weights cannot be released from "
                         "device memory yet");
}

/* The split pair on two GPUs: the KV pool is device memory of the river worker's GPU, and
 * the backbone worker opens it through a CUDA IPC handle (cudaIpcOpenMemHandle maps it into
 * its own context, with peer access where the GPUs allow). */
static void *cuda_shared_alloc(ops_ctx_t *ctx, size_t bytes, shared_handle_t *h)
{
    if (cu_enter(ctx))
        return NULL;
    void *d = NULL;
    cudaError_t ce = cudaMalloc(&d, bytes);
    if (ce == cudaSuccess)
        ce = cudaMemset(d, 0, bytes);
    cudaIpcMemHandle_t ipc;
    if (ce == cudaSuccess)
        ce = cudaIpcGetMemHandle(&ipc, d);
    if (ce != cudaSuccess) {
        if (d)
            (void)cudaFree(d);
        cu_fail(ce, "shared alloc");
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

static void *cuda_shared_map(ops_ctx_t *ctx, const shared_handle_t *h)
{
    if (h->kind != SHARED_CUDA_IPC) {
        river_err_set(RIVER_EUNSUPPORTED, "cuda backend: cannot map shared memory of kind %d "
                      "(CUDA IPC only)", (int)h->kind);
        return NULL;
    }
    if (cu_enter(ctx))
        return NULL;
    cudaIpcMemHandle_t ipc;
    memcpy(&ipc, h->ipc, sizeof ipc);
    void *d = NULL;
    cudaError_t ce = cudaIpcOpenMemHandle(&d, ipc, cudaIpcMemLazyEnablePeerAccess);
    if (ce != cudaSuccess) {
        cu_fail(ce, "shared map");
        return NULL;
    }
    return d;
}

static void cuda_shared_free(ops_ctx_t *ctx, void *buf, const shared_handle_t *h, int owner)
{
    (void)h;
    if (!buf || cu_enter(ctx))
        return;
    /* Teardown is best effort, as in cuda_backend_destroy. */
    if (owner)
        (void)cudaFree(buf);
    else
        (void)cudaIpcCloseMemHandle(buf);
    (void)cudaGetLastError();
}

static void cuda_destroy(backend_t *be)
{
    cuda_backend_destroy(&be);
}

static ops_t make_cuda_ops(void)
{
    ops_t o;
    memset(&o, 0, sizeof o);
    o.name = "cuda";
    o.info = cuda_info;
    o.weight_upload = cuda_weight_upload;
    o.weight_residency = cuda_weight_residency;
    o.shared_alloc = cuda_shared_alloc;
    o.shared_map = cuda_shared_map;
    o.shared_free = cuda_shared_free;
    o.destroy = cuda_destroy;
    o.buf_alloc = cuda_buf_alloc;
    o.buf_free = cuda_buf_free;
    o.to_host = cuda_to_host;
    o.from_host = cuda_from_host;
    o.embed = cuda_embed;
    o.rmsnorm = cuda_rmsnorm;
    o.matmul = cuda_matmul;
    o.add_bias = cuda_add_bias;
    o.add = cuda_add;
    o.rope = cuda_rope;
    o.swiglu = cuda_swiglu;
    o.kv_write = cuda_kv_write;
    o.attention = cuda_attention;
    o.cosine = cuda_cosine;
    o.router_prob = cuda_router_prob;
    o.gather_rows = cuda_gather_rows;
    o.scatter_rows = cuda_scatter_rows;
    o.sync = cuda_sync;
    o.graph_begin = cuda_graph_begin;
    o.graph_end = cuda_graph_end;
    return o;
}

/* Filled in order, like the CPU's designated initialiser (C++ before C++20 has none). */
static const ops_t cuda_ops = make_cuda_ops();

/* ---- the backend ------------------------------------------------------------------------ */

extern "C" int cuda_device_count(void)
{
    int n = 0;
    /* No driver, no GPU, or a driver older than the runtime: all mean "no device here". */
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return n;
}

extern "C" int cuda_backend_new(backend_t **out, int device)
{
    if (!out || device < 0)
        return river_err_set(RIVER_EINVAL, "cuda backend: device %d", device);
    int n = 0;
    cudaError_t ce = cudaGetDeviceCount(&n);
    if (ce != cudaSuccess) {
        (void)cudaGetLastError();
        return river_err_set(RIVER_EDEVICE, "no CUDA device: %s", cudaGetErrorString(ce));
    }
    if (device >= n)
        return river_err_set(RIVER_EDEVICE, "no CUDA device: device %d of %d", device, n);

    int e = RIVER_ENOMEM;
    backend_t *b = (backend_t *)calloc(1, sizeof *b);
    ops_ctx_t *ctx = (ops_ctx_t *)calloc(1, sizeof *ctx);
    cublasStatus_t st;
    cudaDeviceProp prop;
    if (!b || !ctx) {
        river_err_set(e, "cuda backend: out of memory");
        goto fail_mem;
    }
    ctx->device = device;
    ce = cudaSetDevice(device);
    if (ce == cudaSuccess)
        ce = cudaStreamCreate(&ctx->stream);
    if (ce != cudaSuccess) {
        e = cu_fail(ce, "backend");
        goto fail_mem;
    }
    st = cublasCreate(&ctx->blas);
    if (st != CUBLAS_STATUS_SUCCESS) {
        e = blas_fail(st, "create");
        goto fail_stream;
    }
    st = cublasSetStream(ctx->blas, ctx->stream);
    if (st != CUBLAS_STATUS_SUCCESS) {
        e = blas_fail(st, "set stream");
        goto fail_blas;
    }
    ctx->n_sm = 1;
    {
        const char *g = getenv("RIVER_CUDA_GRAPHS");
        ctx->graphs = g && !strcmp(g, "1");
    }
    if (cudaGetDeviceProperties(&prop, device) == cudaSuccess) {
        snprintf(ctx->name, sizeof ctx->name, "%s", prop.name);
        ctx->n_sm = prop.multiProcessorCount > 0 ? prop.multiProcessorCount : 1;
    } else {
        (void)cudaGetLastError();
    }
    b->ops = &cuda_ops;
    b->ctx = ctx;
    *out = b;
    return 0;

fail_blas:
    cublasDestroy(ctx->blas);
fail_stream:
    cudaStreamDestroy(ctx->stream);
fail_mem:
    free(ctx);
    free(b);
    return e;
}

extern "C" void cuda_backend_destroy(backend_t **bp)
{
    if (!bp || !*bp)
        return;
    backend_t *b = *bp;
    ops_ctx_t *ctx = b->ctx;
    /* Teardown is best effort: errors here (a dead context) leave nothing to recover. */
    (void)cudaSetDevice(ctx->device);
    (void)cudaStreamSynchronize(ctx->stream);
    for (size_t i = 0; i < ctx->n_owned; i++)
        (void)cudaFree(ctx->owned[i]);
    free(ctx->owned);
    if (ctx->scratch)
        (void)cudaFree(ctx->scratch);
    stage_release(ctx);
    graph_release(ctx);
    free(ctx->host);
    cublasDestroy(ctx->blas);
    cudaStreamDestroy(ctx->stream);
    (void)cudaGetLastError();
    free(ctx);
    free(b);
    *bp = NULL;
}

extern "C" const char *cuda_backend_device_name(const backend_t *b)
{
    return b && b->ctx ? b->ctx->name : "";
}

extern "C" uint64_t cuda_backend_graph_launches(const backend_t *b)
{
    return b && b->ctx ? b->ctx->graph_launches : 0;
}

extern "C" uint64_t cuda_backend_uploads(const backend_t *b)
{
    return b && b->ctx ? b->ctx->uploads : 0;
}

extern "C" int cuda_backend_time_copy(backend_t *b, size_t bytes, int reps, double *secs)
{
    if (!b || !secs || bytes == 0 || reps <= 0)
        return river_err_set(RIVER_EINVAL, "cuda copy timing: bad arguments");
    ops_ctx_t *ctx = b->ctx;
    int e = cu_enter(ctx);
    if (e)
        return e;
    void *src = NULL, *dst = NULL;
    cudaEvent_t t0 = NULL, t1 = NULL;
    float ms = 0.0f;
    cudaError_t ce = cudaMalloc(&src, bytes);
    if (ce == cudaSuccess)
        ce = cudaMalloc(&dst, bytes);
    if (ce == cudaSuccess)
        ce = cudaMemsetAsync(src, 1, bytes, ctx->stream);
    if (ce == cudaSuccess)
        ce = cudaEventCreate(&t0);
    if (ce == cudaSuccess)
        ce = cudaEventCreate(&t1);
    if (ce == cudaSuccess) /* warm-up */
        ce = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, ctx->stream);
    if (ce == cudaSuccess)
        ce = cudaEventRecord(t0, ctx->stream);
    for (int i = 0; i < reps && ce == cudaSuccess; i++)
        ce = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, ctx->stream);
    if (ce == cudaSuccess)
        ce = cudaEventRecord(t1, ctx->stream);
    if (ce == cudaSuccess)
        ce = cudaEventSynchronize(t1);
    if (ce == cudaSuccess)
        ce = cudaEventElapsedTime(&ms, t0, t1);
    e = ce == cudaSuccess ? 0 : cu_fail(ce, "copy timing");
    if (t0)
        (void)cudaEventDestroy(t0);
    if (t1)
        (void)cudaEventDestroy(t1);
    if (src)
        (void)cudaFree(src);
    if (dst)
        (void)cudaFree(dst);
    if (!e)
        *secs = (double)ms / 1e3 / reps;
    return e;
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
        return cu_fail(ce, "upload");
    }
    ctx->owned[ctx->n_owned++] = d;
    *dst = d;
    return 0;
}

extern "C" int cuda_backend_upload(backend_t *b, weight_t *w)
{
    if (!b || !w)
        return river_err_set(RIVER_EINVAL, "cuda upload: NULL argument");
    return upload_weight(b->ctx, w);
}

static int upload_weight(ops_ctx_t *ctx, weight_t *w)
{
    if (!w->data)
        return 0;
    int e = weight_check(w, "upload");
    if (e)
        return e;
    if ((e = cu_enter(ctx)))
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

/* For the ops in files of their own (kernels/cuda/cuda_router.h). */
int cuda_ctx_stream(ops_ctx_t *ctx, cudaStream_t *stream)
{
    int e = cu_enter(ctx);
    if (!e)
        *stream = ctx->stream;
    return e;
}
