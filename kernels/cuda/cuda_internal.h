/* What the files of the CUDA backend in kernels/cuda/ (see kernels/cuda/cuda.h) share:
 * the backend's state, the error and staging helpers every op uses, the device helpers of
 * the kernels, and the ops each file defines for the table in cuda_backend.cu. CUDA sources
 * only. */
#ifndef RIVER_KERNELS_CUDA_INTERNAL_H
#define RIVER_KERNELS_CUDA_INTERNAL_H

#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <stdint.h>

extern "C" {
#include "common/err.h"
#include "kernels/cuda/cuda.h"
#include "kernels/cuda/cuda_nccl.h"
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
/* cuBLAS workspace bytes (the size its documentation asks for on Hopper). */
#define CUDA_BLAS_WS_BYTES ((size_t)32 << 20)

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
    void *blas_ws; /* cuBLAS's workspace, CUDA_BLAS_WS_BYTES: set once, so that a GEMM
                      captured into a graph allocates nothing inside it */
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
    char uuid[48]; /* backend_info.uuid: "GPU-" and the device's UUID, "" if unknown */
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

/* ---- errors and staging (cuda_backend.cu, cuda_staging.cu) ------------------------------ */

/* RIVER_EDEVICE with the CUDA error string; clears a sticky launch error so that the next
 * call reports its own. */
int cuda__fail(cudaError_t err, const char *what);
int cuda__blas_fail(cublasStatus_t st, const char *what);

#define CU_TRY(call, what)                                                                 \
    do {                                                                                   \
        cudaError_t cu_e_ = (call);                                                        \
        if (cu_e_ != cudaSuccess)                                                          \
            return cuda__fail(cu_e_, what);                                                   \
    } while (0)

/* After a kernel launch: a bad configuration shows up here, not at the launch. */
#define CU_LAUNCHED(what) CU_TRY(cudaGetLastError(), what)

/* Makes the backend's GPU current: ops may run on any host thread, and the current device
 * is per thread. */
int cuda__enter(ops_ctx_t *ctx);

/* Grows the device scratch (or the host packing area) to at least `bytes`; the contents
 * are not kept. */
int cuda__scratch_reserve(ops_ctx_t *ctx, size_t bytes);
int cuda__host_reserve(ops_ctx_t *ctx, size_t bytes);

/* Makes `bytes` of host memory at src readable on the device at *dev, in stream order:
 * from a slot that already holds these bytes, else through the least recently used slot's
 * pinned buffer with one asynchronous copy (while a step is captured: the graph arena,
 * cuda__arena_put). src may change as soon as this returns. */
int cuda__stage_put(ops_ctx_t *ctx, const void *src, size_t bytes, const void **dev);
int cuda__arena_put(ops_ctx_t *ctx, const void *src, size_t bytes, const void **dev);
/* Teardown of the upload slots and of the graph state and arena. */
void cuda__stage_release(ops_ctx_t *ctx);
void cuda__graph_release(ops_ctx_t *ctx);

/* The checks every op makes of a weight (error codes as on the CPU), and the weight as the
 * kernels take it. */
int cuda__weight_check(const weight_t *w, const char *what);
dweight cuda__to_dweight(const weight_t *w);
/* Copies a weight's data (and Q4/Q8 scales and zeros) to device memory the backend owns
 * and points w at it (ops->weight_upload). */
int cuda__upload_weight(ops_ctx_t *ctx, weight_t *w);

static inline size_t align256(size_t n)
{
    return (n + 255) / 256 * 256;
}

static inline unsigned blocks_for(int64_t n, int threads)
{
    return (unsigned)((n + threads - 1) / threads);
}

/* Blocks of a grid-stride loop over n elements: at least one, at most 4096. */
static inline unsigned grid_cap(int64_t n, int threads)
{
    unsigned g = blocks_for(n, threads);
    return g < 4096 ? (g ? g : 1) : 4096;
}

/* ---- device helpers --------------------------------------------------------------------- */

static __device__ __forceinline__ float h2f(uint16_t h)
{
    return __half2float(__ushort_as_half(h));
}

static __device__ __forceinline__ float bf2f(uint16_t h)
{
    return __uint_as_float((uint32_t)h << 16);
}

/* Element (r, c) of a weight as f32, any dtype. */
static __device__ __forceinline__ float w_at(const dweight &w, int64_t r, int64_t c)
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
static __device__ __forceinline__ float w_flat(const dweight &w, int64_t j)
{
    return w_at(w, j / w.cols, j % w.cols);
}

static __device__ __forceinline__ float warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* Sum over a block of blockDim.x (a multiple of 32, at most 1024) threads; every thread
 * gets the result. */
static __device__ __forceinline__ float block_sum(float v)
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

/* ---- the ops, one file a job ----------------------------------------------------------- */

/* cuda_staging.cu */
void *cuda__buf_alloc(ops_ctx_t *ctx, size_t n_elems);
void cuda__buf_free(ops_ctx_t *ctx, void *buf);
int cuda__to_host(ops_ctx_t *ctx, float *dst, const void *src, size_t offset, size_t n);
int cuda__from_host(ops_ctx_t *ctx, void *dst, size_t offset, const float *src, size_t n);
/* cuda_rowwise.cu */
int cuda__embed(ops_ctx_t *ctx, void *out, const weight_t *table, const int32_t *tokens,
                int n);
int cuda__rmsnorm(ops_ctx_t *ctx, void *out, const void *x, const weight_t *w, int n, int d,
                  float eps);
int cuda__add_bias(ops_ctx_t *ctx, void *y, const weight_t *b, int n, int d);
int cuda__add(ops_ctx_t *ctx, void *y, const void *x, size_t n_elems);
int cuda__swiglu(ops_ctx_t *ctx, void *out, const void *gate, const void *up, int n, int d,
                 int stride);
int cuda__cosine(ops_ctx_t *ctx, float *out, const void *a, const void *b, int n, int d);
int cuda__gather_rows(ops_ctx_t *ctx, void *dst, const void *src, const int32_t *idx, int n,
                      int d);
int cuda__scatter_rows(ops_ctx_t *ctx, void *dst, const void *src, const int32_t *idx, int n,
                       int d);
/* cuda_matmul.cu */
int cuda__matmul(ops_ctx_t *ctx, void *y, const void *x, const weight_t *w, int n);
/* cuda_attention.cu */
int cuda__rope(ops_ctx_t *ctx, void *x, const int32_t *pos, int n, int n_heads,
               const rope_t *rope);
int cuda__kv_write(ops_ctx_t *ctx, const kv_view_t *kv, int layer, const attn_batch_t *b,
                   const void *k, const void *v);
int cuda__attention(ops_ctx_t *ctx, void *out, const void *q, const kv_view_t *kv, int layer,
                    const attn_batch_t *b, int n_heads, int n_kv_heads, int head_dim,
                    float scale);
/* cuda_graph.cu */
int cuda__graph_begin(ops_ctx_t *ctx, int *active);
int cuda__graph_end(ops_ctx_t *ctx, int abort);
/* cuda_ipc.cu */
void *cuda__shared_alloc(ops_ctx_t *ctx, size_t bytes, shared_handle_t *h);
void *cuda__shared_map(ops_ctx_t *ctx, const shared_handle_t *h);
void cuda__shared_free(ops_ctx_t *ctx, void *buf, const shared_handle_t *h, int owner);

#endif
