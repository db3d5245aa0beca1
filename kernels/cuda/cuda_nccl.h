/* NCCL between two processes of one host, each on its own GPU: the split pair's hand-off of
 * hidden states (workers/pair_transport.h). Plain C over NCCL and cudart, so that code
 * outside kernels/cuda/ needs neither header. Built with the CUDA backend (RIVER_CUDA). */
#ifndef RIVER_KERNELS_CUDA_NCCL_H
#define RIVER_KERNELS_CUDA_NCCL_H

#include <stddef.h>

/* Bytes of an ncclUniqueId. */
#define CUDA_NCCL_ID_BYTES 128

typedef struct cuda_nccl cuda_nccl_t;

/* A fresh unique id, made by the side that is rank 0. */
int cuda_nccl_unique_id(unsigned char id[CUDA_NCCL_ID_BYTES]);

/* Joins the two-rank communicator of that id as `rank` (0 or 1) on GPU `device`. Waits
 * until the other rank has joined too. On failure *out is untouched. */
int cuda_nccl_open(cuda_nccl_t **out, const unsigned char id[CUDA_NCCL_ID_BYTES], int rank,
                   int device);
void cuda_nccl_close(cuda_nccl_t **c);

/* Sends n floats of device buffer buf to the other rank. Queued on the communicator's
 * stream; it completes when the peer receives, so the caller does not wait for it (the
 * frame that tells the peer to receive goes after this call). buf must stay unchanged
 * until the next cuda_nccl_recv, which is ordered after it. */
int cuda_nccl_send(cuda_nccl_t *c, const void *buf, size_t n);
/* Receives n floats from the other rank into device buffer buf and waits for them. */
int cuda_nccl_recv(cuda_nccl_t *c, void *buf, size_t n);

#endif
