/* NCCL between the two GPUs of a split pair: the CUDA backend's peer link
 * (kernels/cuda/cuda_nccl.h). */
#include "kernels/cuda/cuda_nccl.h"

#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>
#include <nccl.h>

#include "common/err.h"

_Static_assert(sizeof(ncclUniqueId) == OPS_PEER_ID_BYTES, "ncclUniqueId size");

struct ops_peer {
    ncclComm_t comm;
    cudaStream_t stream; /* the communicator's own, not the backend's */
    int rank;
    int device;
};

int cuda_nccl_id(ops_ctx_t *ctx, unsigned char id[OPS_PEER_ID_BYTES])
{
    (void)ctx;
    ncclUniqueId u;
    ncclResult_t r = ncclGetUniqueId(&u);
    if (r != ncclSuccess)
        return river_err_set(RIVER_EDEVICE, "ncclGetUniqueId: %s", ncclGetErrorString(r));
    memcpy(id, &u, sizeof u);
    return 0;
}

int cuda_nccl_open(ops_ctx_t *ctx, ops_peer_t **out, const unsigned char id[OPS_PEER_ID_BYTES],
                   int rank)
{
    int device = cuda_ctx_device(ctx);
    if (rank != 0 && rank != 1)
        return river_err_set(RIVER_EINVAL, "nccl: rank %d of 2", rank);
    cudaError_t ce = cudaSetDevice(device);
    if (ce != cudaSuccess)
        return river_err_set(RIVER_EDEVICE, "nccl: cudaSetDevice(%d): %s", device,
                             cudaGetErrorString(ce));
    ops_peer_t *c = calloc(1, sizeof *c);
    if (!c)
        return river_err_set(RIVER_ENOMEM, "nccl");
    c->rank = rank;
    c->device = device;
    if ((ce = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking)) != cudaSuccess) {
        free(c);
        return river_err_set(RIVER_EDEVICE, "nccl: cudaStreamCreate: %s",
                             cudaGetErrorString(ce));
    }
    ncclUniqueId u;
    memcpy(&u, id, sizeof u);
    ncclResult_t r = ncclCommInitRank(&c->comm, 2, u, rank);
    if (r != ncclSuccess) {
        cudaStreamDestroy(c->stream);
        free(c);
        return river_err_set(RIVER_EDEVICE, "ncclCommInitRank(rank %d of 2, GPU %d): %s",
                             rank, device, ncclGetErrorString(r));
    }
    *out = c;
    return 0;
}

void cuda_nccl_close(ops_ctx_t *ctx, ops_peer_t *c)
{
    (void)ctx;
    (void)cudaSetDevice(c->device);
    (void)ncclCommDestroy(c->comm);
    (void)cudaStreamDestroy(c->stream);
    free(c);
}

int cuda_nccl_send(ops_ctx_t *ctx, ops_peer_t *c, const void *buf, size_t n)
{
    (void)ctx;
    if (!c)
        return river_err_set(RIVER_ESTATE, "nccl: no communicator");
    (void)cudaSetDevice(c->device);
    ncclResult_t r = ncclSend(buf, n, ncclFloat32, 1 - c->rank, c->comm, c->stream);
    if (r != ncclSuccess)
        return river_err_set(RIVER_EDEVICE, "ncclSend of %zu floats: %s", n,
                             ncclGetErrorString(r));
    return 0;
}

int cuda_nccl_recv(ops_ctx_t *ctx, ops_peer_t *c, void *buf, size_t n)
{
    (void)ctx;
    if (!c)
        return river_err_set(RIVER_ESTATE, "nccl: no communicator");
    (void)cudaSetDevice(c->device);
    ncclResult_t r = ncclRecv(buf, n, ncclFloat32, 1 - c->rank, c->comm, c->stream);
    if (r != ncclSuccess)
        return river_err_set(RIVER_EDEVICE, "ncclRecv of %zu floats: %s", n,
                             ncclGetErrorString(r));
    cudaError_t ce = cudaStreamSynchronize(c->stream);
    if (ce != cudaSuccess)
        return river_err_set(RIVER_EDEVICE, "nccl: waiting for %zu floats: %s", n,
                             cudaGetErrorString(ce));
    return 0;
}
