/* The router op on the GPU (ops->router_prob, kernels/ops.h): one block per row; the sum of
 * squares in double as the CPU reference takes it, then each warp takes hidden units in
 * turn, its lanes striding over W_down's row (coalesced) against norm * h, and the units'
 * silu terms are summed in one float per warp, then per block. Only the n probabilities
 * come back to the host. The order of additions differs from the CPU's 8-lane sums, so the
 * two agree to rounding, not bit for bit (tests/test_backend_ops.c). */
#include <math.h>
#include <stdint.h>

extern "C" {
#include "common/err.h"
#include "kernels/cuda/cuda_router.h"
}

#define ROUTER_THREADS 256
#define ROUTER_WARPS (ROUTER_THREADS / 32)

__device__ static float k_router_sigmoid(float z)
{
    if (z >= 0.0f)
        return 1.0f / (1.0f + expf(-z));
    float e = expf(z);
    return e / (1.0f + e);
}

__global__ void k_router_prob(float *out, const float *x, const int32_t *rows, int d,
                              int hidden, const float *norm, const float *down,
                              const float *up, float eps)
{
    __shared__ double ss_warp[ROUTER_WARPS];
    __shared__ float z_warp[ROUTER_WARPS];
    __shared__ float inv_s;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int64_t r = rows ? rows[blockIdx.x] : blockIdx.x;
    const float *h = x + r * d;
    double ss = 0;
    for (int k = threadIdx.x; k < d; k += blockDim.x)
        ss += (double)h[k] * (double)h[k];
    for (int o = 16; o > 0; o >>= 1)
        ss += __shfl_down_sync(0xffffffffu, ss, o);
    if (lane == 0)
        ss_warp[warp] = ss;
    __syncthreads();
    if (threadIdx.x == 0) {
        double t = 0;
        for (int w = 0; w < ROUTER_WARPS; w++)
            t += ss_warp[w];
        inv_s = (float)(1.0 / sqrt(t / d + (double)eps));
    }
    __syncthreads();
    float inv = inv_s, z = 0;
    for (int j = warp; j < hidden; j += ROUTER_WARPS) {
        const float *wj = down + (int64_t)j * d;
        float a = 0;
        for (int k = lane; k < d; k += 32)
            a += wj[k] * (norm[k] * h[k]);
        for (int o = 16; o > 0; o >>= 1)
            a += __shfl_down_sync(0xffffffffu, a, o);
        a *= inv;
        z += up[j] * (a * k_router_sigmoid(a)); /* meaningful in lane 0 */
    }
    if (lane == 0)
        z_warp[warp] = z;
    __syncthreads();
    if (threadIdx.x == 0) {
        float t = 0;
        for (int w = 0; w < ROUTER_WARPS; w++)
            t += z_warp[w];
        out[blockIdx.x] = k_router_sigmoid(t);
    }
}

static int cu_router_fail(cudaError_t err, const char *what)
{
    (void)cudaGetLastError();
    return river_err_set(RIVER_EDEVICE, "cuda router_prob: %s: %s", what,
                         cudaGetErrorString(err));
}

int cuda_router_prob(ops_ctx_t *ctx, float *out, const void *x, const router_weights_t *w,
                     const int32_t *rows, int n)
{
    if (n < 0 || !w || (n > 0 && (!out || !x)))
        return river_err_set(RIVER_EINVAL, "cuda router_prob: n %d", n);
    const weight_t *t[3] = {&w->norm, &w->down, &w->up};
    for (int i = 0; i < 3; i++)
        if (t[i]->dtype != DTYPE_F32 || !t[i]->data)
            return river_err_set(RIVER_EINVAL, "cuda router_prob: router weights must be F32");
    int64_t d = w->down.cols, hid = w->down.rows;
    if (d <= 0 || hid <= 0 || d > INT32_MAX || w->norm.rows * w->norm.cols != d ||
        w->up.rows * w->up.cols != hid)
        return river_err_set(RIVER_ESHAPE, "cuda router_prob: down %lldx%lld", (long long)hid,
                             (long long)d);
    if (n == 0)
        return 0;
    cudaStream_t st;
    int e = cuda_ctx_stream(ctx, &st);
    if (e)
        return e;
    /* The n results, then the row indices, in one stream-ordered allocation. */
    size_t out_bytes = ((size_t)n * sizeof(float) + 255) / 256 * 256;
    size_t bytes = out_bytes + (rows ? (size_t)n * sizeof(int32_t) : 0);
    char *dev = NULL;
    cudaError_t ce = cudaMallocAsync((void **)&dev, bytes, st);
    if (ce != cudaSuccess)
        return cu_router_fail(ce, "scratch");
    const int32_t *drows = NULL;
    if (rows) {
        drows = (const int32_t *)(dev + out_bytes);
        ce = cudaMemcpyAsync((void *)drows, rows, (size_t)n * sizeof(int32_t),
                             cudaMemcpyHostToDevice, st);
    }
    if (ce == cudaSuccess) {
        k_router_prob<<<n, ROUTER_THREADS, 0, st>>>((float *)dev, (const float *)x, drows,
                                                    (int)d, (int)hid,
                                                    (const float *)w->norm.data,
                                                    (const float *)w->down.data,
                                                    (const float *)w->up.data, w->eps);
        ce = cudaGetLastError();
    }
    if (ce == cudaSuccess)
        ce = cudaMemcpyAsync(out, dev, (size_t)n * sizeof(float), cudaMemcpyDeviceToHost, st);
    cudaError_t fe = cudaFreeAsync(dev, st);
    if (ce == cudaSuccess)
        ce = fe;
    if (ce == cudaSuccess)
        ce = cudaStreamSynchronize(st);
    return ce == cudaSuccess ? 0 : cu_router_fail(ce, "launch");
}
