/* The CUDA ops on positions and the paged KV cache (kernels/cuda/cuda.h): RoPE, KV writes
 * and flash-decoding attention, with the packing of a batch's page tables and validity maps
 * into the upload slots. The pool's elements are f32, f16 or bf16 (kv_view_t.dtype; the
 * kernels are templates on the element type, rounding to nearest even on the write as the
 * CPU's kernels/kv_row.h does); Q8 pools are the CPU's only, and refused here. */
#include "kernels/cuda/cuda_internal.h"

#include <cuda_bf16.h>
#include <math.h>
#include <string.h>

/* Element access of a KV pool: widening to f32 on reads, rounding to nearest even on
 * writes. */
__device__ __forceinline__ float kv_load(const float *p, int64_t i) { return p[i]; }
__device__ __forceinline__ float kv_load(const __half *p, int64_t i) { return __half2float(p[i]); }
__device__ __forceinline__ float kv_load(const __nv_bfloat16 *p, int64_t i)
{
    return __bfloat162float(p[i]);
}
__device__ __forceinline__ void kv_store(float *p, int64_t i, float x) { p[i] = x; }
__device__ __forceinline__ void kv_store(__half *p, int64_t i, float x)
{
    p[i] = __float2half_rn(x);
}
__device__ __forceinline__ void kv_store(__nv_bfloat16 *p, int64_t i, float x)
{
    p[i] = __float2bfloat16_rn(x);
}

/* RIVER_EUNSUPPORTED for a pool type the CUDA kernels do not read (Q8, a symmetric int8
 * layout that only the CPU backend implements), naming kv.dtype. */
static int kv_dtype_cuda_check(const kv_view_t *kv, const char *op)
{
    if (kv->dtype == DTYPE_F32 || kv->dtype == DTYPE_F16 || kv->dtype == DTYPE_BF16)
        return 0;
    return river_err_set(RIVER_EUNSUPPORTED, "cuda %s: kv.dtype %s is not supported on CUDA "
                         "(use f32, f16 or bf16)", op, dtype_name(kv->dtype));
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

int cuda__rope(ops_ctx_t *ctx, void *x, const int32_t *pos, int n, int n_heads,
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
    if ((e = cuda__enter(ctx)) || (e = cuda__stage_put(ctx, pos, (size_t)n * sizeof(int32_t), &dpos)) ||
        (e = cuda__stage_put(ctx, rope->inv_freq, (size_t)half * sizeof(float), &dfreq)))
        return e;
    k_rope<<<n, 256, 0, ctx->stream>>>((float *)x, (const int32_t *)dpos, (const float *)dfreq,
                                       n_heads, rope->head_dim, half, (int)rope->layout,
                                       rope->attn_factor);
    CU_LAUNCHED("rope");
    return 0;
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
    int e = cuda__host_reserve(ctx, total);
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
    if ((e = cuda__stage_put(ctx, ctx->host, total, &d)))
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
    int e = cuda__host_reserve(ctx, total);
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
    if ((e = cuda__stage_put(ctx, ctx->host, total, &d)))
        return e;
    *voff = (const int64_t *)d;
    *valid = (const uint8_t *)d + off_bytes;
    return 0;
}

/* Row blockIdx.x goes to slot (layer, pos) of its sequence's pages. */
template <typename T>
__global__ void k_kv_write(T *K, T *V, const attn_row *rows, const int32_t *pages,
                           int64_t page_stride, int64_t layer_off, int page_size,
                           const float *k, const float *v, int kv_dim)
{
    int i = blockIdx.x;
    attn_row r = rows[i];
    int64_t o = (int64_t)pages[r.pt_off + r.pos / page_size] * page_stride + layer_off +
                (int64_t)(r.pos % page_size) * kv_dim;
    for (int j = threadIdx.x; j < kv_dim; j += blockDim.x) {
        kv_store(K, o + j, k[(int64_t)i * kv_dim + j]);
        kv_store(V, o + j, v[(int64_t)i * kv_dim + j]);
    }
}

int cuda__kv_write(ops_ctx_t *ctx, const kv_view_t *kv, int layer, const attn_batch_t *b,
                         const void *k, const void *v)
{
    if (!kv || !b || layer < 0 || kv->page_size <= 0 || kv->kv_dim <= 0 || b->n < 0 ||
        (b->n > 0 && (!k || !v || !b->pos || !b->page_table || !kv->k || !kv->v)))
        return river_err_set(RIVER_EINVAL, "cuda kv_write: bad arguments");
    int e = kv_dtype_cuda_check(kv, "kv_write");
    if (e)
        return e;
    if (b->n == 0)
        return 0;
    attn_pack_t pk;
    if ((e = cuda__enter(ctx)) || (e = attn_pack(ctx, kv, b, 0, &pk)))
        return e;
#define KV_WRITE_LAUNCH(T)                                                                 \
    k_kv_write<T><<<b->n, 256, 0, ctx->stream>>>((T *)kv->k, (T *)kv->v, pk.rows, pk.pages, \
                                                 kv->page_stride,                          \
                                                 (int64_t)layer * kv->layer_stride,        \
                                                 kv->page_size, (const float *)k,          \
                                                 (const float *)v, kv->kv_dim)
    if (kv->dtype == DTYPE_F16)
        KV_WRITE_LAUNCH(__half);
    else if (kv->dtype == DTYPE_BF16)
        KV_WRITE_LAUNCH(__nv_bfloat16);
    else
        KV_WRITE_LAUNCH(float);
#undef KV_WRITE_LAUNCH
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
template <int PER, typename T>
__global__ void __launch_bounds__(ATTN_WARPS * 32)
k_attn_split(float *out, float *part_o, float *part_ml, const float *q, const T *K,
             const T *V, const attn_row *rows, const int32_t *pages, const int64_t *voff,
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
            kr[k] = d < hd ? kv_load(K, off + d) : 0.0f;
            vr[k] = d < hd ? kv_load(V, off + d) : 0.0f;
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

int cuda__attention(ops_ctx_t *ctx, void *out, const void *q, const kv_view_t *kv,
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
    if (int de = kv_dtype_cuda_check(kv, "attention"))
        return de;
    if (head_dim > ATTN_MAX_HD)
        return river_err_set(RIVER_EUNSUPPORTED, "cuda attention: head_dim %d above %d",
                             head_dim, ATTN_MAX_HD);
    attn_pack_t pk;
    const int64_t *voff;
    const uint8_t *valid;
    int e;
    if ((e = cuda__enter(ctx)) || (e = attn_pack(ctx, kv, b, 1, &pk)) ||
        (e = attn_valid(ctx, b, layer, &voff, &valid)))
        return e;
    int G = n_heads / n_kv_heads, chunk, ns;
    attn_splits(ctx, b->n, n_kv_heads, G, pk.max_len, &chunk, &ns);
    float *part_o = NULL, *part_ml = NULL;
    if (ns > 1) {
        size_t heads = (size_t)b->n * (size_t)n_heads * (size_t)ns;
        size_t o_bytes = align256(heads * (size_t)head_dim * sizeof(float));
        if ((e = cuda__scratch_reserve(ctx, o_bytes + heads * 2 * sizeof(float))))
            return e;
        part_o = (float *)ctx->scratch;
        part_ml = (float *)((char *)ctx->scratch + o_bytes);
    }
    dim3 grid((unsigned)(n_kv_heads * ((G + ATTN_GMAX - 1) / ATTN_GMAX)), (unsigned)ns,
              (unsigned)b->n);
    if (b->n > 65535)
        return river_err_set(RIVER_ERANGE, "cuda attention: %d rows in one batch", b->n);
    int64_t lo = (int64_t)layer * kv->layer_stride;
#define ATTN_LAUNCH_T(P, T)                                                                \
    k_attn_split<P, T><<<grid, ATTN_WARPS * 32, 0, ctx->stream>>>(                         \
        (float *)out, part_o, part_ml, (const float *)q, (const T *)kv->k,                 \
        (const T *)kv->v, pk.rows, pk.pages, voff, valid, kv->page_stride, lo,             \
        kv->page_size, kv->kv_dim, n_heads, G, head_dim, chunk, ns, scale)
#define ATTN_LAUNCH(P)                                                                     \
    do {                                                                                   \
        if (kv->dtype == DTYPE_F16)                                                        \
            ATTN_LAUNCH_T(P, __half);                                                      \
        else if (kv->dtype == DTYPE_BF16)                                                  \
            ATTN_LAUNCH_T(P, __nv_bfloat16);                                               \
        else                                                                               \
            ATTN_LAUNCH_T(P, float);                                                       \
    } while (0)
    if (head_dim <= 64)
        ATTN_LAUNCH(2);
    else if (head_dim <= 128)
        ATTN_LAUNCH(4);
    else
        ATTN_LAUNCH(8);
#undef ATTN_LAUNCH
#undef ATTN_LAUNCH_T
    CU_LAUNCHED("attention");
    if (ns > 1) {
        k_attn_reduce<<<dim3((unsigned)n_heads, (unsigned)b->n), 128, 0, ctx->stream>>>(
            (float *)out, part_o, part_ml, pk.rows, n_heads, head_dim, chunk, ns);
        CU_LAUNCHED("attention reduce");
    }
    return 0;
}
