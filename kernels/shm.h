/* Sealed memfd memory for the host backends' shared buffers (ops->shared_alloc): one place
 * that makes it and checks what a peer hands over. */
#ifndef RIVER_KERNELS_SHM_H
#define RIVER_KERNELS_SHM_H

#include <stddef.h>

/* A memfd of exactly `bytes`, zero-filled, sealed against resizing (both sides agree on the
 * size and neither may change it). *fd is close-on-exec: a peer reopens it through /proc. */
int shm_create(size_t bytes, int *fd);
/* Checks that fd is such a memfd of exactly `bytes` (RIVER_EINVAL naming what differs). */
int shm_check(int fd, size_t bytes);

#endif
