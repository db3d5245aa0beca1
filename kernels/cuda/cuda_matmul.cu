/* The CUDA matmul (kernels/cuda/cuda.h): bandwidth-bound GEMV kernels for a few rows and
 * every quantized weight, cuBLAS for batches of rows. */
#include "kernels/cuda/cuda_internal.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

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
        float4 a = __ldg(p), b = __ldg(p + 1);
        v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
        v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
    } else if (DT == DTYPE_F16 || DT == DTYPE_BF16) {
        uint4 q = __ldg((const uint4 *)((const uint16_t *)w.data + r * w.cols + c));
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

/* What one warp of a GEMV block takes: output feature r (one warp each), rows i0..i0+nr-1
 * of x (blockIdx.y picks which GEMV_ROWS) and the columns [kbeg, kend) of split blockIdx.z
 * (kchunk each); the kernels start their sums from acc. */
struct gemv_part {
    int lane;
    int64_t r;
    int i0, nr;      /* first row of x, rows of x (at most GEMV_ROWS) */
    int kbeg, kend;  /* columns */
};

/* False for the warps of the last block that lie past the weight's rows. */
__device__ __forceinline__ bool gemv_part_of(const dweight &w, int n, int kchunk,
                                             gemv_part &p, float acc[GEMV_ROWS])
{
    p.lane = threadIdx.x & 31;
    p.r = (int64_t)blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5);
    p.i0 = blockIdx.y * GEMV_ROWS;
    p.nr = n - p.i0 < GEMV_ROWS ? n - p.i0 : GEMV_ROWS;
    int cols = (int)w.cols;
    p.kbeg = blockIdx.z * kchunk;
    p.kend = cols - p.kbeg < kchunk ? cols : p.kbeg + kchunk;
#pragma unroll
    for (int i = 0; i < GEMV_ROWS; i++)
        acc[i] = 0.0f;
    return p.r < w.rows;
}

/* Sums of the warp's output feature over its rows of x: to y, or with split-K to this
 * split's slice of the partials (summed by k_splitk_sum). */
__device__ __forceinline__ void gemv_store(float *y, float *part, const float acc[GEMV_ROWS],
                                           int64_t rows, int n, const gemv_part &p)
{
#pragma unroll
    for (int i = 0; i < GEMV_ROWS; i++) {
        float s = warp_sum(acc[i]);
        if (p.lane == 0 && i < p.nr) {
            int64_t at = (int64_t)(p.i0 + i) * rows + p.r;
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
    gemv_part p;
    float acc[GEMV_ROWS];
    if (!gemv_part_of(w, n, kchunk, p, acc))
        return;
    int cols = (int)w.cols;
    for (int c0 = p.kbeg + p.lane * 8; c0 < p.kend; c0 += GEMV_STEP) {
        float v[GEMV_UNROLL][8];
#pragma unroll
        for (int u = 0; u < GEMV_UNROLL; u++)
            if (c0 + u * 256 < p.kend)
                load8<DT>(w, p.r, c0 + u * 256, v[u]);
#pragma unroll
        for (int u = 0; u < GEMV_UNROLL; u++) {
            int c = c0 + u * 256;
            if (c >= p.kend)
                break;
#pragma unroll
            for (int i = 0; i < GEMV_ROWS; i++) {
                if (i < p.nr) {
                    const float4 *xp = (const float4 *)(x + (int64_t)(p.i0 + i) * cols + c);
                    float4 a = __ldg(xp), b = __ldg(xp + 1);
                    acc[i] += v[u][0] * a.x + v[u][1] * a.y + v[u][2] * a.z + v[u][3] * a.w +
                              v[u][4] * b.x + v[u][5] * b.y + v[u][6] * b.z + v[u][7] * b.w;
                }
            }
        }
    }
    gemv_store(y, part, acc, w.rows, n, p);
}

/* Output features per warp of the few-rows kernel below. */
#define GEMV_RPW 4
/* 8-column loads per output feature each lane of that kernel issues per step. */
#define GEMV_FEW_UNROLL 2

/* What one warp of the few-rows kernels takes: output features r0..r0+GEMV_RPW-1 (those
 * that exist: has), the columns [kbeg, kend) of split blockIdx.z (kchunk each). */
struct few_part {
    int lane;
    int64_t r0;
    int kbeg, kend;
    bool has[GEMV_RPW];
};

/* False for the warps of the last block that lie past the weight's rows; zeroes acc. */
template <int NR>
__device__ __forceinline__ bool few_part_of(const dweight &w, int kchunk, few_part &p,
                                            float acc[GEMV_RPW][NR])
{
    p.lane = threadIdx.x & 31;
    p.r0 = ((int64_t)blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5)) * GEMV_RPW;
    int cols = (int)w.cols;
    p.kbeg = blockIdx.z * kchunk;
    p.kend = cols - p.kbeg < kchunk ? cols : p.kbeg + kchunk;
#pragma unroll
    for (int j = 0; j < GEMV_RPW; j++) {
        p.has[j] = p.r0 + j < w.rows;
#pragma unroll
        for (int i = 0; i < NR; i++)
            acc[j][i] = 0.0f;
    }
    return p.r0 < w.rows;
}

/* The warp's sums of its features over the nr rows of x: to y, or with split-K to this
 * split's slice of the partials (summed by k_splitk_sum). */
template <int NR>
__device__ __forceinline__ void few_store(float *y, float *part, float acc[GEMV_RPW][NR],
                                          int64_t rows, int nr, const few_part &p)
{
#pragma unroll
    for (int j = 0; j < GEMV_RPW; j++)
#pragma unroll
        for (int i = 0; i < NR; i++) {
            if (i >= nr)
                break;
            float s = warp_sum(acc[j][i]);
            if (p.lane == 0 && p.has[j]) {
                int64_t at = (int64_t)i * rows + p.r0 + j;
                if (gridDim.z == 1)
                    y[at] = s;
                else
                    part[(int64_t)blockIdx.z * nr * rows + at] = s;
            }
        }
}

/* The decode case, y (NR, rows) = x (NR, cols) W^T for NR <= GEMV_ROWS rows of x, over the
 * columns of split blockIdx.z: each warp takes GEMV_RPW output features and issues all
 * their loads (GEMV_RPW x GEMV_FEW_UNROLL of 16 bytes a lane) before it uses any. On the
 * H200, one feature a warp (k_gemv8) streamed bf16 weights at a quarter of the copy
 * bandwidth: too few bytes in flight, and a warp's share too small for its reduction and
 * exit. Here x's loads and the reduction are shared by GEMV_RPW features, and NR is a
 * template argument, so a decode step reduces one row of x, not GEMV_ROWS. A lane sums its
 * columns in k_gemv8's order; the splits are of GEMV_FEW_UNROLL steps, not GEMV_UNROLL. */
template <int DT, int NR>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
k_gemv_few(float *y, float *part, const float *x, dweight w, int nr, int kchunk)
{
    few_part p;
    float acc[GEMV_RPW][NR];
    if (!few_part_of(w, kchunk, p, acc))
        return;
    const int cols = (int)w.cols;
    for (int c0 = p.kbeg + p.lane * 8; c0 < p.kend; c0 += 32 * 8 * GEMV_FEW_UNROLL) {
        float v[GEMV_FEW_UNROLL][GEMV_RPW][8];
#pragma unroll
        for (int u = 0; u < GEMV_FEW_UNROLL; u++)
#pragma unroll
            for (int j = 0; j < GEMV_RPW; j++) {
                if (c0 + u * 256 < p.kend && p.has[j])
                    load8<DT>(w, p.r0 + j, c0 + u * 256, v[u][j]);
                else /* a feature past the last: summed, never stored */
                    for (int k = 0; k < 8; k++)
                        v[u][j][k] = 0.0f;
            }
#pragma unroll
        for (int u = 0; u < GEMV_FEW_UNROLL; u++) {
            int c = c0 + u * 256;
            if (c >= p.kend)
                break;
#pragma unroll
            for (int i = 0; i < NR; i++) {
                if (i >= nr)
                    break;
                const float4 *xp = (const float4 *)(x + (int64_t)i * cols + c);
                float4 a = __ldg(xp), b = __ldg(xp + 1);
#pragma unroll
                for (int j = 0; j < GEMV_RPW; j++) {
                    const float *t = v[u][j];
                    acc[j][i] += t[0] * a.x + t[1] * a.y + t[2] * a.z + t[3] * a.w +
                                 t[4] * b.x + t[5] * b.y + t[6] * b.z + t[7] * b.w;
                }
            }
        }
    }
    few_store<NR>(y, part, acc, w.rows, nr, p);
}

/* k_gemv_few for n (1..GEMV_ROWS) rows of x: one instance for the decode step of one row,
 * one for the rest (the rows present checked at run time). Each instance is compiled into
 * every program that links the backend, and a lent GPU machine takes 64 MiB of tree and
 * programs together, so the instances are few. */
template <int DT>
static void gemv_few_launch(dim3 grid, dim3 block, cudaStream_t st, float *y, float *part,
                            const float *x, const dweight &w, int n, int kchunk)
{
    if (n == 1)
        k_gemv_few<DT, 1><<<grid, block, 0, st>>>(y, part, x, w, 1, kchunk);
    else
        k_gemv_few<DT, GEMV_ROWS><<<grid, block, 0, st>>>(y, part, x, w, n, kchunk);
}

/* W4A16 with wide loads: each lane reads 16 bytes (32 columns, one group: group % 32 == 0)
 * per step, with one scale and zero for the 32. */
__global__ void __launch_bounds__(GEMV_WARPS * 32)
k_gemv_q4w(float *y, float *part, const float *x, dweight w, int n, int kchunk)
{
    gemv_part p;
    float acc[GEMV_ROWS];
    if (!gemv_part_of(w, n, kchunk, p, acc))
        return;
    int cols = (int)w.cols;
    const uint8_t *wr = (const uint8_t *)w.data + p.r * (w.cols / 2);
    const uint16_t *sr = w.scales + p.r * w.ngroups, *zr = w.zeros + p.r * w.ngroups;
    for (int c = p.kbeg + p.lane * 32; c < p.kend; c += 32 * 32) {
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
            if (i < p.nr) {
                const float4 *xp = (const float4 *)(x + (int64_t)(p.i0 + i) * cols + c);
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
    gemv_store(y, part, acc, w.rows, n, p);
}

/* k_gemv_q4w for NR <= GEMV_ROWS rows of x (the river's decode step), GEMV_RPW output
 * features a warp with all their 16-byte loads issued first, as k_gemv_few does for the
 * other types; a lane sums in k_gemv_q4w's order. */
template <int NR>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
k_gemv_q4w_few(float *y, float *part, const float *x, dweight w, int nr, int kchunk)
{
    few_part p;
    float acc[GEMV_RPW][NR];
    if (!few_part_of(w, kchunk, p, acc))
        return;
    const int cols = (int)w.cols;
    for (int c = p.kbeg + p.lane * 32; c < p.kend; c += 32 * 32) {
        int g = group_of(w, c);
        uint4 q[GEMV_RPW];
        float s[GEMV_RPW], z[GEMV_RPW];
#pragma unroll
        for (int j = 0; j < GEMV_RPW; j++) {
            q[j] = make_uint4(0, 0, 0, 0); /* a feature past the last: summed, never stored */
            s[j] = z[j] = 0.0f;
            if (p.has[j]) {
                int64_t r = p.r0 + j;
                q[j] = __ldg((const uint4 *)((const uint8_t *)w.data + r * (w.cols / 2) + c / 2));
                s[j] = h2f(w.scales[r * w.ngroups + g]);
                z[j] = h2f(w.zeros[r * w.ngroups + g]);
            }
        }
#pragma unroll
        for (int i = 0; i < NR; i++) {
            if (i >= nr)
                break;
            const float4 *xp = (const float4 *)(x + (int64_t)i * cols + c);
            float4 a[8];
#pragma unroll
            for (int k = 0; k < 8; k++)
                a[k] = __ldg(xp + k);
#pragma unroll
            for (int j = 0; j < GEMV_RPW; j++) {
                uint32_t u[4] = {q[j].x, q[j].y, q[j].z, q[j].w};
                float t = 0.0f;
#pragma unroll
                for (int k = 0; k < 8; k++) {
                    float v0 = ((float)((u[k / 2] >> (16 * (k % 2))) & 0xfu) - z[j]) * s[j];
                    float v1 = ((float)((u[k / 2] >> (16 * (k % 2) + 4)) & 0xfu) - z[j]) * s[j];
                    float v2 = ((float)((u[k / 2] >> (16 * (k % 2) + 8)) & 0xfu) - z[j]) * s[j];
                    float v3 = ((float)((u[k / 2] >> (16 * (k % 2) + 12)) & 0xfu) - z[j]) * s[j];
                    t += v0 * a[k].x + v1 * a[k].y + v2 * a[k].z + v3 * a[k].w;
                }
                acc[j][i] += t;
            }
        }
    }
    few_store<NR>(y, part, acc, w.rows, nr, p);
}

static void gemv_q4w_few_launch(dim3 grid, dim3 block, cudaStream_t st, float *y, float *part,
                                const float *x, const dweight &w, int n, int kchunk)
{
    if (n == 1)
        k_gemv_q4w_few<1><<<grid, block, 0, st>>>(y, part, x, w, 1, kchunk);
    else
        k_gemv_q4w_few<GEMV_ROWS><<<grid, block, 0, st>>>(y, part, x, w, n, kchunk);
}

/* Any shape and group: one element at a time (columns not a multiple of 8, odd groups). */
__global__ void __launch_bounds__(GEMV_WARPS * 32)
k_gemv_any(float *y, const float *x, dweight w, int n)
{
    gemv_part p;
    float acc[GEMV_ROWS];
    if (!gemv_part_of(w, n, (int)w.cols, p, acc)) /* launched with one split */
        return;
    for (int64_t c = p.lane; c < w.cols; c += 32) {
        float v = w_at(w, p.r, c);
#pragma unroll
        for (int i = 0; i < GEMV_ROWS; i++)
            if (i < p.nr)
                acc[i] += v * x[(int64_t)(p.i0 + i) * w.cols + c];
    }
    gemv_store(y, NULL, acc, w.rows, n, p);
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
    dweight dw = cuda__to_dweight(w);
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
    /* Up to GEMV_ROWS rows of x (a decode step) of the backbone's 16-bit weights and of a
     * river's Q4 in whole groups of 32 take the kernels of GEMV_RPW features a warp. */
    int few = n <= GEMV_ROWS && (q4w || w->dtype == DTYPE_BF16 || w->dtype == DTYPE_F16);
    if (few)
        row_blocks = blocks_for(w->rows, GEMV_WARPS * GEMV_RPW);
    int kchunk;
    int step = q4w ? 32 * 32 : few ? 32 * 8 * GEMV_FEW_UNROLL : GEMV_STEP;
    int ks = gemv_splits(ctx, row_blocks * passes, (int)w->cols, step, &kchunk);
    float *part = NULL;
    int64_t total = (int64_t)n * w->rows;
    if (ks > 1) {
        int e = cuda__scratch_reserve(ctx, (size_t)ks * (size_t)total * sizeof(float));
        if (e)
            return e;
        part = (float *)ctx->scratch;
    }
    dim3 grid((unsigned)row_blocks, passes, (unsigned)ks);
    if (few && q4w)
        gemv_q4w_few_launch(grid, block, ctx->stream, y, part, x, dw, n, kchunk);
    else if (few && w->dtype == DTYPE_F16)
        gemv_few_launch<DTYPE_F16>(grid, block, ctx->stream, y, part, x, dw, n, kchunk);
    else if (few)
        gemv_few_launch<DTYPE_BF16>(grid, block, ctx->stream, y, part, x, dw, n, kchunk);
    else if (q4w)
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
        int e = cuda__scratch_reserve(ctx, (size_t)total * 2);
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
        return cuda__blas_fail(st, "matmul");
    return 0;
}

int cuda__matmul(ops_ctx_t *ctx, void *y, const void *x, const weight_t *w, int n)
{
    int e = cuda__weight_check(w, "matmul");
    if (e)
        return e;
    if (n < 0 || (n > 0 && (!y || !x)) || y == x)
        return river_err_set(RIVER_EINVAL, "cuda matmul: n %d", n);
    if (w->rows > INT32_MAX || w->cols > INT32_MAX)
        return river_err_set(RIVER_ESHAPE, "cuda matmul: (%lld, %lld) too large",
                             (long long)w->rows, (long long)w->cols);
    if (n == 0)
        return 0;
    if ((e = cuda__enter(ctx)))
        return e;
    int quant = w->dtype == DTYPE_Q4 || w->dtype == DTYPE_Q8;
    if (quant || n <= GEMV_ROWS)
        return gemv_launch(ctx, (float *)y, (const float *)x, w, n);
    return gemm_launch(ctx, (float *)y, (const float *)x, w, n);
}
