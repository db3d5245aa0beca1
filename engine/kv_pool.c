#include "engine/kv_pool.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/err.h"
#include "kernels/backend.h"

struct kv_pool {
    backend_t *be;
    kv_view_t view;
    int32_t *free_list; /* (n_pages) stack of free page ids; NULL when attached */
    uint8_t *is_free;   /* (n_pages) 1 while the page is on the free list; NULL attached */
    int n_free;
    int n_layers;
    /* Shared pools: K and V live in one shared buffer of the backend instead of two
     * private ones. */
    void *map;              /* NULL for a private pool */
    shared_handle_t handle; /* what the owner exports (fd -1 when attached) */
    int shared;             /* made by kv_pool_new_shared or kv_pool_attach */
    int owner;              /* made by kv_pool_new_shared: frees the buffer */
    int64_t double_frees; /* kv_pool_free_page calls for a page already free */
    int attached;
};

int kv_pool_new(kv_pool_t **out, backend_t *be, int n_layers, int kv_dim, int page_size,
                int n_pages)
{
    if (n_layers <= 0 || kv_dim <= 0 || page_size <= 0 || n_pages <= 0)
        return river_err_set(RIVER_EINVAL, "kv pool: bad geometry (%d layers, kv_dim %d, "
                             "page %d, %d pages)", n_layers, kv_dim, page_size, n_pages);
    kv_pool_t *p = calloc(1, sizeof *p);
    if (!p)
        goto fail_alloc;
    p->be = be;
    p->n_layers = n_layers;
    p->view.page_size = page_size;
    p->view.kv_dim = kv_dim;
    p->view.n_pages = n_pages;
    p->view.layer_stride = (int64_t)page_size * kv_dim;
    p->view.page_stride = p->view.layer_stride * n_layers;
    size_t n = (size_t)p->view.page_stride * (size_t)n_pages;
    p->view.k = be->ops->buf_alloc(be->ctx, n);
    if (!p->view.k)
        goto fail_k;
    p->view.v = be->ops->buf_alloc(be->ctx, n);
    if (!p->view.v)
        goto fail_v;
    p->free_list = malloc(sizeof *p->free_list * (size_t)n_pages);
    p->is_free = malloc((size_t)n_pages);
    if (!p->free_list || !p->is_free)
        goto fail_list;
    /* Pages are handed out lowest id first, which keeps small runs compact. */
    for (int i = 0; i < n_pages; i++)
        p->free_list[i] = n_pages - 1 - i;
    memset(p->is_free, 1, (size_t)n_pages);
    p->n_free = n_pages;
    *out = p;
    return 0;

fail_list:
    free(p->free_list);
    free(p->is_free);
    be->ops->buf_free(be->ctx, p->view.v);
fail_v:
    be->ops->buf_free(be->ctx, p->view.k);
fail_k:
    free(p);
fail_alloc:
    return river_err_set(RIVER_ENOMEM, "kv pool: cannot allocate %d pages of %d positions",
                         n_pages, page_size);
}

size_t kv_pool_shared_bytes(int n_layers, int kv_dim, int page_size, int n_pages)
{
    if (n_layers <= 0 || kv_dim <= 0 || page_size <= 0 || n_pages <= 0)
        return 0;
    size_t n = 2 * sizeof(float);
    const int dims[] = {n_layers, kv_dim, page_size, n_pages};
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++) {
        if (n > SIZE_MAX / (size_t)dims[i])
            return 0;
        n *= (size_t)dims[i];
    }
    return n;
}

/* The parts every shared pool has: geometry, K at the start of the shared buffer, V after
 * it. Where the buffer lives is the backend's (ops->shared_alloc / shared_map): a memfd for
 * host memory, a CUDA IPC handle for device memory. */
static int kv_pool__shared(kv_pool_t **out, backend_t *be, int n_layers, int kv_dim,
                           int page_size, int n_pages, size_t *bytes)
{
    *bytes = kv_pool_shared_bytes(n_layers, kv_dim, page_size, n_pages);
    if (!*bytes)
        return river_err_set(RIVER_EINVAL, "kv pool: bad geometry (%d layers, kv_dim %d, "
                             "page %d, %d pages)", n_layers, kv_dim, page_size, n_pages);
    kv_pool_t *p = calloc(1, sizeof *p);
    if (!p)
        return river_err_set(RIVER_ENOMEM, "kv pool: state");
    p->be = be;
    p->shared = 1;
    p->handle.fd = -1;
    p->n_layers = n_layers;
    p->view.page_size = page_size;
    p->view.kv_dim = kv_dim;
    p->view.n_pages = n_pages;
    p->view.layer_stride = (int64_t)page_size * kv_dim;
    p->view.page_stride = p->view.layer_stride * n_layers;
    *out = p;
    return 0;
}

static void kv_pool__set_buffer(kv_pool_t *p, void *buf, size_t bytes)
{
    p->map = buf;
    p->view.k = buf;
    /* Pointer arithmetic only: the buffer may be device memory. */
    p->view.v = (float *)buf + bytes / (2 * sizeof(float));
}

int kv_pool_new_shared(kv_pool_t **out, backend_t *be, int n_layers, int kv_dim, int page_size,
                       int n_pages, int *fd_out)
{
    size_t bytes;
    kv_pool_t *p;
    int e = kv_pool__shared(&p, be, n_layers, kv_dim, page_size, n_pages, &bytes);
    if (e)
        return e;
    void *buf = be->ops->shared_alloc(be->ctx, bytes, &p->handle);
    if (!buf) {
        char why[256];
        snprintf(why, sizeof why, "%s", river_err_detail());
        e = river_err_set(RIVER_ESYS, "kv pool: %zu bytes of shared memory: %s", bytes, why);
        goto fail;
    }
    p->owner = 1;
    kv_pool__set_buffer(p, buf, bytes);
    p->free_list = malloc(sizeof *p->free_list * (size_t)n_pages);
    p->is_free = malloc((size_t)n_pages);
    if (!p->free_list || !p->is_free) {
        e = river_err_set(RIVER_ENOMEM, "kv pool: free list of %d pages", n_pages);
        goto fail;
    }
    for (int i = 0; i < n_pages; i++)
        p->free_list[i] = n_pages - 1 - i;
    memset(p->is_free, 1, (size_t)n_pages);
    p->n_free = n_pages;
    if (fd_out)
        *fd_out = p->handle.fd;
    *out = p;
    return 0;

fail:
    kv_pool_destroy(&p);
    return e;
}

const shared_handle_t *kv_pool_shared_handle(const kv_pool_t *p)
{
    return p->shared ? &p->handle : NULL;
}

int kv_pool_attach_handle(kv_pool_t **out, backend_t *be, const shared_handle_t *h,
                          int n_layers, int kv_dim, int page_size, int n_pages)
{
    size_t bytes;
    kv_pool_t *p;
    int e = kv_pool__shared(&p, be, n_layers, kv_dim, page_size, n_pages, &bytes);
    if (e)
        return e;
    p->attached = 1;
    if (h->bytes != bytes) {
        e = river_err_set(RIVER_EINVAL, "kv pool: the shared memory has %zu bytes, the "
                          "geometry (%d layers, kv_dim %d, page %d, %d pages) needs %zu",
                          h->bytes, n_layers, kv_dim, page_size, n_pages, bytes);
        goto fail;
    }
    void *buf = be->ops->shared_map(be->ctx, h);
    if (!buf) {
        char why[256];
        snprintf(why, sizeof why, "%s", river_err_detail());
        e = river_err_set(RIVER_EINVAL, "kv pool: %s", why);
        goto fail;
    }
    p->handle = *h;
    p->handle.fd = -1; /* the caller's descriptor: the mapping does not need it */
    kv_pool__set_buffer(p, buf, bytes);
    *out = p;
    return 0;

fail:
    kv_pool_destroy(&p);
    return e;
}

int kv_pool_attach(kv_pool_t **out, backend_t *be, int fd, int n_layers, int kv_dim,
                   int page_size, int n_pages)
{
    shared_handle_t h = {.kind = SHARED_MEMFD, .fd = fd,
                         .bytes = kv_pool_shared_bytes(n_layers, kv_dim, page_size, n_pages)};
    return kv_pool_attach_handle(out, be, &h, n_layers, kv_dim, page_size, n_pages);
}

int kv_pool_is_attached(const kv_pool_t *p) { return p->attached; }
int kv_pool_n_layers(const kv_pool_t *p) { return p->n_layers; }
backend_t *kv_pool_backend(const kv_pool_t *p) { return p->be; }

void kv_pool_destroy(kv_pool_t **pp)
{
    kv_pool_t *p = *pp;
    if (!p)
        return;
    if (p->shared) {
        if (p->map || p->owner)
            p->be->ops->shared_free(p->be->ctx, p->map, &p->handle, p->owner);
    } else {
        p->be->ops->buf_free(p->be->ctx, p->view.k);
        p->be->ops->buf_free(p->be->ctx, p->view.v);
    }
    free(p->free_list);
    free(p->is_free);
    free(p);
    *pp = NULL;
}

int kv_pool_alloc_page(kv_pool_t *p, int32_t *page)
{
    if (p->attached)
        return river_err_set(RIVER_ESTATE, "kv pool: an attached pool hands out no pages");
    if (p->n_free == 0)
        return river_err_set(RIVER_EFULL, "kv pool: all %d pages in use", p->view.n_pages);
    *page = p->free_list[--p->n_free];
    p->is_free[*page] = 0;
    return 0;
}

void kv_pool_free_page(kv_pool_t *p, int32_t page)
{
    if (p->attached || page < 0 || page >= p->view.n_pages)
        return;
    /* A page freed twice would be handed to two sequences; the second free is a bug of
     * the caller, counted so that tests see it, and otherwise ignored. */
    if (p->is_free[page]) {
        p->double_frees++;
        return;
    }
    p->is_free[page] = 1;
    p->free_list[p->n_free++] = page;
}

int kv_pool_page_is_free(const kv_pool_t *p, int32_t page)
{
    return p->is_free && page >= 0 && page < p->view.n_pages && p->is_free[page];
}

int64_t kv_pool_double_frees(const kv_pool_t *p) { return p->double_frees; }

int kv_pool_free_pages(const kv_pool_t *p) { return p->n_free; }
int kv_pool_total_pages(const kv_pool_t *p) { return p->view.n_pages; }
int kv_pool_page_size(const kv_pool_t *p) { return p->view.page_size; }
const kv_view_t *kv_pool_view(const kv_pool_t *p) { return &p->view; }

int kv_pool_fill(kv_pool_t *p, float value)
{
    size_t n = (size_t)p->view.page_stride * (size_t)p->view.n_pages;
    const size_t chunk = 4096;
    float buf[4096];
    for (size_t i = 0; i < chunk; i++)
        buf[i] = value;
    for (size_t off = 0; off < n; off += chunk) {
        size_t m = n - off < chunk ? n - off : chunk;
        int e = p->be->ops->from_host(p->be->ctx, p->view.k, off, buf, m);
        if (e == 0)
            e = p->be->ops->from_host(p->be->ctx, p->view.v, off, buf, m);
        if (e)
            return e;
    }
    return 0;
}

void kv_seq_init(kv_seq_t *s)
{
    s->pages = NULL;
    s->n_pages = 0;
    s->cap = 0;
}

static int kv_seq__grow(kv_seq_t *s, int need)
{
    if (need <= s->cap)
        return 0;
    int cap = s->cap ? s->cap : 8;
    while (cap < need)
        cap *= 2;
    int32_t *pages = realloc(s->pages, sizeof *pages * (size_t)cap);
    if (!pages)
        return river_err_set(RIVER_ENOMEM, "kv pool: page table of %d entries", cap);
    s->pages = pages;
    s->cap = cap;
    return 0;
}

int kv_seq_push(kv_seq_t *s, int32_t page)
{
    int e = kv_seq__grow(s, s->n_pages + 1);
    if (e)
        return e;
    s->pages[s->n_pages++] = page;
    return 0;
}

int kv_seq_reserve(kv_seq_t *s, kv_pool_t *p, int n_pos)
{
    int need = (n_pos + p->view.page_size - 1) / p->view.page_size;
    if (need <= s->n_pages)
        return 0;
    if (p->attached)
        return river_err_set(RIVER_ESTATE, "kv pool: an attached pool hands out no pages");
    if (need - s->n_pages > p->n_free)
        return river_err_set(RIVER_EFULL, "kv pool: %d more pages needed, %d free",
                             need - s->n_pages, p->n_free);
    int e = kv_seq__grow(s, need);
    if (e)
        return e;
    while (s->n_pages < need) {
        e = kv_pool_alloc_page(p, &s->pages[s->n_pages]);
        if (e)
            return e; /* cannot happen: the free count was checked above */
        s->n_pages++;
    }
    return 0;
}

void kv_seq_truncate(kv_seq_t *s, kv_pool_t *p, int n_pos)
{
    int keep = n_pos > 0 ? (n_pos + p->view.page_size - 1) / p->view.page_size : 0;
    while (s->n_pages > keep)
        kv_pool_free_page(p, s->pages[--s->n_pages]);
}

void kv_seq_free(kv_seq_t *s, kv_pool_t *p)
{
    for (int i = s->n_pages - 1; i >= 0; i--)
        kv_pool_free_page(p, s->pages[i]);
    free(s->pages);
    kv_seq_init(s);
}
