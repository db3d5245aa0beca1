/* The paged KV cache: a pool of fixed-size pages in backend memory, and per-sequence page
 * tables. A page holds `page_size` consecutive positions of one sequence for every layer,
 * so a sequence grows one page at a time and gives all its pages back when it ends.
 *
 * The pool's memory layout is kv_view_t (kernels/ops.h); attention reads it through the
 * page tables. A failed call leaves the pool and the sequence unchanged. */
#ifndef RIVER_ENGINE_KV_POOL_H
#define RIVER_ENGINE_KV_POOL_H

#include <stdint.h>

#include "kernels/ops.h"

typedef struct kv_pool kv_pool_t;

/* n_pages pages of page_size positions, n_layers layers, kv_dim K and V values each, stored
 * as dtype (kv_view_t: F32, F16, BF16, or Q8 with its scales after each array's codes).
 * RIVER_EINVAL names kv.dtype for a type the pool cannot hold (Q8 with a kv_dim that is
 * not a multiple of KV_Q8_BLOCK). */
int kv_pool_new(kv_pool_t **out, backend_t *be, int n_layers, int kv_dim, dtype_t dtype,
                int page_size, int n_pages);
void kv_pool_destroy(kv_pool_t **p);

/* The pool of a split pair (workers/pair.h), in memory two processes map: one shared buffer
 * of the backend (ops->shared_alloc) holds every K value, then every V value. On host
 * backends it is a sealed memfd, whose descriptor *fd_out receives (the pool owns it;
 * kv_pool_destroy closes it) and the peer opens as /proc/<this pid>/fd/<fd>; on CUDA it is
 * device memory exported as an IPC handle (*fd_out -1). kv_pool_shared_handle says which,
 * for the pairing handshake. The free list stays private to this process: only the owner
 * hands out pages. RIVER_ESYS when the backend cannot make the buffer. */
int kv_pool_new_shared(kv_pool_t **out, backend_t *be, int n_layers, int kv_dim, dtype_t dtype,
                       int page_size, int n_pages, int *fd_out);
/* What a shared pool exports (NULL for a private pool). */
const shared_handle_t *kv_pool_shared_handle(const kv_pool_t *p);
/* Maps another process's shared pool from its handle through this backend (for a memfd,
 * h->fd is a descriptor of this process); otherwise as kv_pool_attach. */
int kv_pool_attach_handle(kv_pool_t **out, backend_t *be, const shared_handle_t *h,
                          int n_layers, int kv_dim, dtype_t dtype, int page_size, int n_pages);
/* Maps the memory of another process's shared pool from fd, which must be a memfd of
 * exactly kv_pool_shared_bytes of the geometry given (RIVER_EINVAL names what differs).
 * The mapping does not need fd afterwards; the caller closes it. An attached pool reads
 * and writes K/V slots like its owner, but hands out no pages: kv_pool_alloc_page and
 * kv_seq_reserve fail with RIVER_ESTATE, kv_pool_free_page does nothing. */
int kv_pool_attach(kv_pool_t **out, backend_t *be, int fd, int n_layers, int kv_dim,
                   dtype_t dtype, int page_size, int n_pages);
/* Bytes a shared pool of that geometry maps (K and V, Q8 scales included), 0 when it does
 * not fit a size_t or the geometry is bad. The same count as a private pool's two buffers:
 * the worker sizes kv.pages 0 by it. */
size_t kv_pool_shared_bytes(int n_layers, int kv_dim, dtype_t dtype, int page_size,
                            int n_pages);
/* 1 for a pool made by kv_pool_attach. */
int kv_pool_is_attached(const kv_pool_t *p);
int kv_pool_n_layers(const kv_pool_t *p);
backend_t *kv_pool_backend(const kv_pool_t *p);

/* RIVER_EFULL when every page is in use. */
int kv_pool_alloc_page(kv_pool_t *p, int32_t *page);
/* Freeing a page that is already free does nothing but count (kv_pool_double_frees). */
void kv_pool_free_page(kv_pool_t *p, int32_t page);
/* 1 while page is on the free list. */
int kv_pool_page_is_free(const kv_pool_t *p, int32_t page);
int64_t kv_pool_double_frees(const kv_pool_t *p);
int kv_pool_free_pages(const kv_pool_t *p);
int kv_pool_total_pages(const kv_pool_t *p);
int kv_pool_page_size(const kv_pool_t *p);
const kv_view_t *kv_pool_view(const kv_pool_t *p);
/* The pool's element type (kv_view_t.dtype). */
dtype_t kv_pool_dtype(const kv_pool_t *p);
/* Sets every K and V value of the pool to `value` as kv_write would store it (tests fill it
 * with NaN, which reads back as NaN in every dtype). */
int kv_pool_fill(kv_pool_t *p, float value);
/* Copies page src's K and V (Q8 scales included) over page dst through host memory: buf
 * holds kv_pool_page_floats(p) floats. */
int kv_pool_copy_page(kv_pool_t *p, int32_t src, int32_t dst, float *buf);
size_t kv_pool_page_floats(const kv_pool_t *p);

/* The pages of one sequence. Embedded in its owner: kv_seq_init / kv_seq_free. */
typedef struct kv_seq {
    int32_t *pages; /* (n_pages) page ids, position p lives in pages[p / page_size] */
    int n_pages;
    int cap;        /* allocated entries of pages */
} kv_seq_t;

void kv_seq_init(kv_seq_t *s);
/* Makes room for positions 0..n_pos-1; on RIVER_EFULL the sequence keeps what it had. */
int kv_seq_reserve(kv_seq_t *s, kv_pool_t *p, int n_pos);
/* Gives back the pages past those positions 0..n_pos-1 need (rolled-back speculative
 * positions); the slots of positions it keeps are untouched. */
void kv_seq_truncate(kv_seq_t *s, kv_pool_t *p, int n_pos);
/* Returns every page to the pool. */
void kv_seq_free(kv_seq_t *s, kv_pool_t *p);
/* Appends a page the caller already holds (a shared prefix page, a copy) to the table. */
int kv_seq_push(kv_seq_t *s, int32_t page);

#endif
