/* The CUDA backend's peer link (ops->peer_*, kernels/ops.h): NCCL between two processes of
 * one host, each on its own GPU, for the split pair's hand-off of hidden states. Plain C
 * over NCCL and cudart (kernels/cuda/cuda_nccl.c); the op table of
 * kernels/cuda/cuda_backend.cu points at these. Built with the CUDA backend (RIVER_CUDA). */
#ifndef RIVER_KERNELS_CUDA_NCCL_H
#define RIVER_KERNELS_CUDA_NCCL_H

#include <stddef.h>

#include "kernels/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The GPU the backend runs on (kernels/cuda/cuda_backend.cu). */
int cuda_ctx_device(const ops_ctx_t *ctx);

/* ops->peer_id: a fresh ncclUniqueId, made by the side that is rank 0. */
int cuda_nccl_id(ops_ctx_t *ctx, unsigned char id[OPS_PEER_ID_BYTES]);
/* ops->peer_open: joins the two-rank communicator of that id as `rank` on the backend's
 * GPU; waits until the other rank has joined too. On failure *out is untouched. */
int cuda_nccl_open(ops_ctx_t *ctx, ops_peer_t **out, const unsigned char id[OPS_PEER_ID_BYTES],
                   int rank);
void cuda_nccl_close(ops_ctx_t *ctx, ops_peer_t *peer);
/* ops->peer_send: n floats of device buffer buf to the other rank, queued on the
 * communicator's stream; it completes when the peer receives, so the caller does not wait
 * for it (the frame that tells the peer to receive goes after this call). */
int cuda_nccl_send(ops_ctx_t *ctx, ops_peer_t *peer, const void *buf, size_t n);
/* ops->peer_recv: n floats from the other rank into device buffer buf; waits for them. */
int cuda_nccl_recv(ops_ctx_t *ctx, ops_peer_t *peer, void *buf, size_t n);

#ifdef __cplusplus
}
#endif

#endif
