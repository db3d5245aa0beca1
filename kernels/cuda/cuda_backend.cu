/* The CUDA backend (kernels/cuda/cuda.h): its op table, creation and teardown, its driver
 * for kernels/backend.c, and what every op file shares of it (errors, weight checks). The
 * ops themselves are in the other files of kernels/cuda/ (cuda_internal.h lists them). */
#include "kernels/cuda/cuda_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "kernels/backend_driver.h"
}

/* Set once an error has left the process's CUDA context unusable (backend_info.lost). */
static int cuda__lost;

/* The errors after which the context is corrupt and every later call fails the same way
 * (CUDA's "sticky" errors): the process must end for the device to serve again. */
static int cuda__sticky(cudaError_t err)
{
    switch (err) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorHardwareStackError:
    case cudaErrorAssert:
    case cudaErrorECCUncorrectable:
    case cudaErrorLaunchTimeout:
        return 1;
    default:
        return 0;
    }
}

int cuda__fail(cudaError_t err, const char *what)
{
    if (cuda__sticky(err))
        cuda__lost = 1;
    /* Clears a launch error that is not sticky so that the next call reports its own. */
    (void)cudaGetLastError();
    return river_err_set(RIVER_EDEVICE, "cuda %s: %s%s", what, cudaGetErrorString(err),
                         cuda__lost ? " (the device is lost to this process)" : "");
}

int cuda__blas_fail(cublasStatus_t st, const char *what)
{
    return river_err_set(RIVER_EDEVICE, "cublas %s: %s", what, cublasGetStatusString(st));
}

/* Ops may run on any host thread; the current device is per thread. */
int cuda__enter(ops_ctx_t *ctx)
{
    CU_TRY(cudaSetDevice(ctx->device), "set device");
    return 0;
}

int cuda__weight_check(const weight_t *w, const char *what)
{
    if (!w || !w->data)
        return river_err_set(RIVER_EINVAL, "cuda %s: no weight data", what);
    if ((unsigned)w->dtype >= DTYPE_COUNT)
        return river_err_set(RIVER_EDTYPE, "cuda %s: dtype %d", what, (int)w->dtype);
    /* The 2- and 3-bit types have CPU kernels only (kernels/cpu/lowbit.h); refusing them
     * here, at upload, keeps a 2- or 3-bit river from loading on a GPU at all. */
    if (w->dtype == DTYPE_Q2 || w->dtype == DTYPE_Q3)
        return river_err_set(RIVER_EDTYPE, "cuda %s: %s weights (%lld x %lld) are not "
                             "supported on CUDA; build the river with --bits 4 or 8, or run "
                             "it on the CPU", what, dtype_name(w->dtype), (long long)w->rows,
                             (long long)w->cols);
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

dweight cuda__to_dweight(const weight_t *w)
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

static int cuda_sync(ops_ctx_t *ctx)
{
    int e = cuda__enter(ctx);
    if (e)
        return e;
    CU_TRY(cudaStreamSynchronize(ctx->stream), "sync");
    return 0;
}

static void cuda_info(ops_ctx_t *ctx, backend_info_t *out)
{
    out->name = "cuda";
    snprintf(out->variant, sizeof out->variant, "%.47s", ctx->name);
    out->threads = 0;
    out->device = ctx->device;
    static_assert(sizeof ctx->uuid == sizeof out->uuid, "backend_info.uuid holds the UUID");
    memcpy(out->uuid, ctx->uuid, sizeof out->uuid);
    out->host_memory = 0;
    out->lost = cuda__lost;
}

static int64_t cuda_mem_free(ops_ctx_t *ctx)
{
    size_t free_b = 0, total_b = 0;
    if (cuda__lost || cuda__enter(ctx) || cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return (int64_t)free_b;
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
    o.mem_free = cuda_mem_free;
    o.weight_upload = cuda__upload_weight;
    o.weight_residency = cuda_weight_residency;
    o.shared_alloc = cuda__shared_alloc;
    o.shared_map = cuda__shared_map;
    o.shared_free = cuda__shared_free;
    o.destroy = cuda_destroy;
    o.buf_alloc = cuda__buf_alloc;
    o.buf_free = cuda__buf_free;
    o.to_host = cuda__to_host;
    o.from_host = cuda__from_host;
    o.embed = cuda__embed;
    o.rmsnorm = cuda__rmsnorm;
    o.matmul = cuda__matmul;
    o.add_bias = cuda__add_bias;
    o.add = cuda__add;
    o.rope = cuda__rope;
    o.swiglu = cuda__swiglu;
    o.kv_write = cuda__kv_write;
    o.attention = cuda__attention;
    o.cosine = cuda__cosine;
    o.router_prob = cuda_router_prob;
    o.gather_rows = cuda__gather_rows;
    o.scatter_rows = cuda__scatter_rows;
    o.sync = cuda_sync;
    o.graph_begin = cuda__graph_begin;
    o.graph_end = cuda__graph_end;
    o.peer_id = cuda_nccl_id;
    o.peer_open = cuda_nccl_open;
    o.peer_close = cuda_nccl_close;
    o.peer_send = cuda_nccl_send;
    o.peer_recv = cuda_nccl_recv;
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
        e = cuda__fail(ce, "backend");
        goto fail_mem;
    }
    st = cublasCreate(&ctx->blas);
    if (st != CUBLAS_STATUS_SUCCESS) {
        e = cuda__blas_fail(st, "create");
        goto fail_stream;
    }
    st = cublasSetStream(ctx->blas, ctx->stream);
    if (st != CUBLAS_STATUS_SUCCESS) {
        e = cuda__blas_fail(st, "set stream");
        goto fail_blas;
    }
    /* Without a workspace of its own cuBLAS allocates one per stream on demand, and inside
     * a captured graph (RIVER_CUDA_GRAPHS) that becomes allocation nodes and a new
     * instantiation for every prefill. 32 MiB is what cuBLAS asks for on Hopper. */
    ce = cudaMalloc(&ctx->blas_ws, CUDA_BLAS_WS_BYTES);
    if (ce != cudaSuccess) {
        e = cuda__fail(ce, "cuBLAS workspace");
        goto fail_blas;
    }
    st = cublasSetWorkspace(ctx->blas, ctx->blas_ws, CUDA_BLAS_WS_BYTES);
    if (st != CUBLAS_STATUS_SUCCESS) {
        e = cuda__blas_fail(st, "set workspace");
        goto fail_ws;
    }
    ctx->n_sm = 1;
    {
        const char *g = getenv("RIVER_CUDA_GRAPHS");
        ctx->graphs = g && !strcmp(g, "1");
    }
    if (cudaGetDeviceProperties(&prop, device) == cudaSuccess) {
        snprintf(ctx->name, sizeof ctx->name, "%s", prop.name);
        ctx->n_sm = prop.multiProcessorCount > 0 ? prop.multiProcessorCount : 1;
        /* The UUID is the same in every process whatever CUDA_VISIBLE_DEVICES makes its
         * index there, so two workers tell from it that they share one GPU (a split pair
         * cannot use NCCL then). Written as nvidia-smi writes it. */
        const unsigned char *u = (const unsigned char *)prop.uuid.bytes;
        snprintf(ctx->uuid, sizeof ctx->uuid,
                 "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
                 u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11],
                 u[12], u[13], u[14], u[15]);
    } else {
        (void)cudaGetLastError();
    }
    b->ops = &cuda_ops;
    b->ctx = ctx;
    *out = b;
    return 0;

fail_ws:
    (void)cudaFree(ctx->blas_ws);
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
    cuda__stage_release(ctx);
    cuda__graph_release(ctx);
    free(ctx->host);
    cublasDestroy(ctx->blas);
    if (ctx->blas_ws)
        (void)cudaFree(ctx->blas_ws);
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
    int e = cuda__enter(ctx);
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
    e = ce == cudaSuccess ? 0 : cuda__fail(ce, "copy timing");
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

/* For the ops in C and in files of their own (kernels/cuda/cuda_router.h,
 * kernels/cuda/cuda_nccl.h). */
int cuda_ctx_stream(ops_ctx_t *ctx, cudaStream_t *stream)
{
    int e = cuda__enter(ctx);
    if (!e)
        *stream = ctx->stream;
    return e;
}

int cuda_ctx_device(const ops_ctx_t *ctx)
{
    return ctx->device;
}

/* The device "cuda" / "cuda:N" (kernels/backend_driver.h): GPU `index`, which copies every
 * weight whatever `weights` says. */
static int cuda_driver_open(backend_t **out, int index, int n_threads,
                            backend_weights_t weights)
{
    (void)n_threads;
    (void)weights;
    return cuda_backend_new(out, index);
}

extern "C" const backend_driver_t cuda_backend_driver = {"cuda", cuda_driver_open};
