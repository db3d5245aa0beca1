#include "engine/kv_pool.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/err.h"

struct kv_pool {
    backend_t *be;
    kv_view_t view;
    int32_t *free_list; /* (n_pages) stack of free page ids; NULL when attached */
    int n_free;
    int n_layers;
    /* Shared pools: K and V live in one MAP_SHARED mapping instead of backend buffers. */
    void *map;          /* NULL for a private pool */
    size_t map_bytes;
    int fd;             /* the owner's memfd, -1 when attached or private */
    int shared;         /* made by kv_pool_new_shared or kv_pool_attach */
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
    p->fd = -1;
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
    if (!p->free_list)
        goto fail_list;
    /* Pages are handed out lowest id first, which keeps small runs compact. */
    for (int i = 0; i < n_pages; i++)
        p->free_list[i] = n_pages - 1 - i;
    p->n_free = n_pages;
    *out = p;
    return 0;

fail_list:
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

/* The parts every shared pool has: geometry, K at the start of the mapping, V after it. */
static int kv_pool__shared(kv_pool_t **out, backend_t *be, int n_layers, int kv_dim,
                           int page_size, int n_pages, size_t *bytes)
{
    if (strcmp(be->ops->name, "cpu") != 0)
        return river_err_set(RIVER_EUNSUPPORTED, "kv pool: shared memory needs the CPU "
                             "backend, not %s", be->ops->name);
    *bytes = kv_pool_shared_bytes(n_layers, kv_dim, page_size, n_pages);
    if (!*bytes)
        return river_err_set(RIVER_EINVAL, "kv pool: bad geometry (%d layers, kv_dim %d, "
                             "page %d, %d pages)", n_layers, kv_dim, page_size, n_pages);
    kv_pool_t *p = calloc(1, sizeof *p);
    if (!p)
        return river_err_set(RIVER_ENOMEM, "kv pool: state");
    p->be = be;
    p->fd = -1;
    p->shared = 1;
    p->n_layers = n_layers;
    p->view.page_size = page_size;
    p->view.kv_dim = kv_dim;
    p->view.n_pages = n_pages;
    p->view.layer_stride = (int64_t)page_size * kv_dim;
    p->view.page_stride = p->view.layer_stride * n_layers;
    *out = p;
    return 0;
}

static int kv_pool__map(kv_pool_t *p, int fd, size_t bytes)
{
    void *map = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED)
        return river_err_set(RIVER_ESYS, "kv pool: mmap of %zu shared bytes: %s", bytes,
                             strerror(errno));
    p->map = map;
    p->map_bytes = bytes;
    p->view.k = map;
    p->view.v = (float *)map + bytes / (2 * sizeof(float));
    return 0;
}

int kv_pool_new_shared(kv_pool_t **out, backend_t *be, int n_layers, int kv_dim, int page_size,
                       int n_pages, int *fd_out)
{
    size_t bytes;
    kv_pool_t *p;
    int e = kv_pool__shared(&p, be, n_layers, kv_dim, page_size, n_pages, &bytes);
    if (e)
        return e;
    /* Close-on-exec: the peer reopens the memory through /proc, it inherits nothing. */
    p->fd = memfd_create("river-kv", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (p->fd < 0) {
        e = river_err_set(RIVER_ESYS, "kv pool: memfd_create: %s", strerror(errno));
        goto fail;
    }
    if (ftruncate(p->fd, (off_t)bytes)) {
        e = river_err_set(RIVER_ESYS, "kv pool: %zu bytes of shared memory: %s", bytes,
                          strerror(errno));
        goto fail;
    }
    /* The size is part of what both sides agree on: neither may change it later. */
    if (fcntl(p->fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)) {
        e = river_err_set(RIVER_ESYS, "kv pool: sealing the shared memory: %s",
                          strerror(errno));
        goto fail;
    }
    if ((e = kv_pool__map(p, p->fd, bytes)))
        goto fail;
    p->free_list = malloc(sizeof *p->free_list * (size_t)n_pages);
    if (!p->free_list) {
        e = river_err_set(RIVER_ENOMEM, "kv pool: free list of %d pages", n_pages);
        goto fail;
    }
    for (int i = 0; i < n_pages; i++)
        p->free_list[i] = n_pages - 1 - i;
    p->n_free = n_pages;
    *fd_out = p->fd;
    *out = p;
    return 0;

fail:
    kv_pool_destroy(&p);
    return e;
}

int kv_pool_attach(kv_pool_t **out, backend_t *be, int fd, int n_layers, int kv_dim,
                   int page_size, int n_pages)
{
    size_t bytes;
    kv_pool_t *p;
    int e = kv_pool__shared(&p, be, n_layers, kv_dim, page_size, n_pages, &bytes);
    if (e)
        return e;
    p->attached = 1;
    struct stat st;
    /* Only a memfd has seals; anything else is not a pool. */
    if (fcntl(fd, F_GET_SEALS) < 0) {
        e = river_err_set(RIVER_EINVAL, "kv pool: descriptor %d is not shared memory (%s)",
                          fd, strerror(errno));
        goto fail;
    }
    if (fstat(fd, &st)) {
        e = river_err_set(RIVER_ESYS, "kv pool: fstat of descriptor %d: %s", fd,
                          strerror(errno));
        goto fail;
    }
    if ((size_t)st.st_size != bytes) {
        e = river_err_set(RIVER_EINVAL, "kv pool: the shared memory has %lld bytes, the "
                          "geometry (%d layers, kv_dim %d, page %d, %d pages) needs %zu",
                          (long long)st.st_size, n_layers, kv_dim, page_size, n_pages, bytes);
        goto fail;
    }
    if ((e = kv_pool__map(p, fd, bytes)))
        goto fail;
    *out = p;
    return 0;

fail:
    kv_pool_destroy(&p);
    return e;
}

int kv_pool_is_attached(const kv_pool_t *p) { return p->attached; }
int kv_pool_n_layers(const kv_pool_t *p) { return p->n_layers; }

void kv_pool_destroy(kv_pool_t **pp)
{
    kv_pool_t *p = *pp;
    if (!p)
        return;
    if (p->map) {
        /* munmap of a range this pool mapped only fails on a corrupted pool. */
        (void)munmap(p->map, p->map_bytes);
    } else if (!p->shared) {
        p->be->ops->buf_free(p->be->ctx, p->view.k);
        p->be->ops->buf_free(p->be->ctx, p->view.v);
    }
    if (p->fd >= 0)
        close(p->fd);
    free(p->free_list);
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
    return 0;
}

void kv_pool_free_page(kv_pool_t *p, int32_t page)
{
    if (!p->attached && page >= 0 && page < p->view.n_pages && p->n_free < p->view.n_pages)
        p->free_list[p->n_free++] = page;
}

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
    if (need > s->cap) {
        int cap = s->cap ? s->cap : 8;
        while (cap < need)
            cap *= 2;
        int32_t *pages = realloc(s->pages, sizeof *pages * (size_t)cap);
        if (!pages)
            return river_err_set(RIVER_ENOMEM, "kv pool: page table of %d entries", cap);
        s->pages = pages;
        s->cap = cap;
    }
    while (s->n_pages < need) {
        int e = kv_pool_alloc_page(p, &s->pages[s->n_pages]);
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
