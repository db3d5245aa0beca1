/* The CUDA ops that work row by row (kernels/cuda/cuda_internal.h): embed, rmsnorm,
 * add_bias, add, swiglu, cosine, and the gather and scatter of rows for compaction. */
#include "kernels/cuda/cuda_internal.h"

/* ---- embed ------------------------------------------------------------------------------ */

__global__ void k_embed(float *out, dweight t, const int32_t *tokens, int n)
{
    int i = blockIdx.y;
    for (int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; c < t.cols;
         c += (int64_t)gridDim.x * blockDim.x)
        out[(int64_t)i * t.cols + c] = w_at(t, tokens[i], c);
}

int cuda__embed(ops_ctx_t *ctx, void *out, const weight_t *table, const int32_t *tokens,
                      int n)
{
    int e = cuda__weight_check(table, "embed");
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
    if ((e = cuda__enter(ctx)) || (e = cuda__stage_put(ctx, tokens, (size_t)n * sizeof(int32_t), &dtok)))
        return e;
    dim3 grid(blocks_for(table->cols, 256) < 64 ? blocks_for(table->cols, 256) : 64, n);
    k_embed<<<grid, 256, 0, ctx->stream>>>((float *)out, cuda__to_dweight(table),
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
    int e = cuda__weight_check(w, what);
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

int cuda__rmsnorm(ops_ctx_t *ctx, void *out, const void *x, const weight_t *w, int n,
                        int d, float eps)
{
    if (n < 0 || d <= 0 || (n > 0 && (!out || !x)))
        return river_err_set(RIVER_EINVAL, "cuda rmsnorm: n %d, d %d", n, d);
    int e = vector_check(w, d, "rmsnorm");
    if (e || n == 0)
        return e;
    if ((e = cuda__enter(ctx)))
        return e;
    k_rmsnorm<<<n, 256, 0, ctx->stream>>>((float *)out, (const float *)x, cuda__to_dweight(w), d,
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

int cuda__add_bias(ops_ctx_t *ctx, void *y, const weight_t *b, int n, int d)
{
    if (n < 0 || d <= 0 || (n > 0 && !y))
        return river_err_set(RIVER_EINVAL, "cuda add_bias: n %d, d %d", n, d);
    int e = vector_check(b, d, "add_bias");
    if (e || n == 0)
        return e;
    if ((e = cuda__enter(ctx)))
        return e;
    int64_t total = (int64_t)n * d;
    k_add_bias<<<grid_cap(total, 256), 256, 0, ctx->stream>>>((float *)y, cuda__to_dweight(b), total,
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

int cuda__add(ops_ctx_t *ctx, void *y, const void *x, size_t n_elems)
{
    if (n_elems == 0)
        return 0;
    if (!y || !x)
        return river_err_set(RIVER_EINVAL, "cuda add: NULL buffer");
    int e = cuda__enter(ctx);
    if (e)
        return e;
    k_add<<<grid_cap((int64_t)n_elems, 256), 256, 0, ctx->stream>>>((float *)y,
                                                                     (const float *)x,
                                                                     (int64_t)n_elems);
    CU_LAUNCHED("add");
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

int cuda__swiglu(ops_ctx_t *ctx, void *out, const void *gate, const void *up, int n,
                       int d, int stride)
{
    if (n < 0 || d <= 0 || stride < d || (n > 0 && (!out || !gate || !up)))
        return river_err_set(RIVER_EINVAL, "cuda swiglu: n %d, d %d, stride %d", n, d, stride);
    if (n == 0)
        return 0;
    int e = cuda__enter(ctx);
    if (e)
        return e;
    k_swiglu<<<grid_cap((int64_t)n * d, 256), 256, 0, ctx->stream>>>(
        (float *)out, (const float *)gate, (const float *)up, n, d, stride);
    CU_LAUNCHED("swiglu");
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

int cuda__cosine(ops_ctx_t *ctx, float *out, const void *a, const void *b, int n, int d)
{
    if (n < 0 || d <= 0 || (n > 0 && (!out || !a || !b)))
        return river_err_set(RIVER_EINVAL, "cuda cosine: n %d, d %d", n, d);
    if (n == 0)
        return 0;
    int e;
    if ((e = cuda__enter(ctx)) || (e = cuda__scratch_reserve(ctx, (size_t)n * sizeof(float))))
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
    if ((e = cuda__enter(ctx)) || (e = cuda__stage_put(ctx, idx, (size_t)n * sizeof(int32_t), &didx)))
        return e;
    k_rows_copy<<<n, 256, 0, ctx->stream>>>((float *)dst, (const float *)src,
                                            (const int32_t *)didx, d, scatter);
    CU_LAUNCHED(what);
    return 0;
}

int cuda__gather_rows(ops_ctx_t *ctx, void *dst, const void *src, const int32_t *idx,
                            int n, int d)
{
    return rows_copy(ctx, dst, src, idx, n, d, 0);
}

int cuda__scatter_rows(ops_ctx_t *ctx, void *dst, const void *src, const int32_t *idx,
                             int n, int d)
{
    return rows_copy(ctx, dst, src, idx, n, d, 1);
}
