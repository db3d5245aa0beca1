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
#include "kernels/kv_row.h"

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

/* Bytes of one array (K or V) of a pool: its elements, then for Q8 its scales; 0 when
 * the geometry is bad or does not fit a size_t. A page's bytes are whole 4-byte words
 * (page_stride even for the 16-bit types, a multiple of KV_Q8_BLOCK for Q8), because the
 * backends copy buffers in floats (ops->to_host, from_host). */
static size_t kv_pool__array_bytes(int n_layers, int kv_dim, dtype_t dtype, int page_size,
                                   int n_pages)
{
    if (n_layers <= 0 || kv_dim <= 0 || page_size <= 0 || n_pages <= 0 ||
        !kv_dtype_ok(dtype) || (dtype == DTYPE_Q8 && kv_dim % KV_Q8_BLOCK != 0))
        return 0;
    size_t n = 1;
    const int dims[] = {n_layers, kv_dim, page_size, n_pages};
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++) {
        if (n > SIZE_MAX / 8 / (size_t)dims[i])
            return 0;
        n *= (size_t)dims[i];
    }
    size_t page = kv_dtype_bytes(dtype, (int64_t)n / n_pages) +
                  kv_dtype_scale_bytes(dtype, (int64_t)n / n_pages);
    if (page % sizeof(float) != 0)
        return 0;
    return kv_dtype_bytes(dtype, (int64_t)n) + kv_dtype_scale_bytes(dtype, (int64_t)n);
}

/* The geometry every pool has, checked; K and V are set by the caller. */
static int kv_pool__geometry(kv_pool_t *p, int n_layers, int kv_dim, dtype_t dtype,
                             int page_size, int n_pages, size_t *array_bytes)
{
    if (!kv_dtype_ok(dtype) || (dtype == DTYPE_Q8 && kv_dim % KV_Q8_BLOCK != 0))
        return river_err_set(RIVER_EINVAL, "kv pool: kv.dtype %s cannot hold rows of kv_dim "
                             "%d (q8 needs a multiple of %d)", dtype_name(dtype), kv_dim,
                             KV_Q8_BLOCK);
    *array_bytes = kv_pool__array_bytes(n_layers, kv_dim, dtype, page_size, n_pages);
    if (!*array_bytes)
        return river_err_set(RIVER_EINVAL, "kv pool: bad geometry (%d layers, kv_dim %d, "
                             "page %d, %d pages, kv.dtype %s)", n_layers, kv_dim, page_size,
                             n_pages, dtype_name(dtype));
    p->n_layers = n_layers;
    p->view.dtype = dtype;
    p->view.page_size = page_size;
    p->view.kv_dim = kv_dim;
    p->view.n_pages = n_pages;
    p->view.layer_stride = (int64_t)page_size * kv_dim;
    p->view.page_stride = p->view.layer_stride * n_layers;
    return 0;
}

/* Points the view at K and V arrays of array_bytes each; Q8 scales follow each array's
 * codes. Pointer arithmetic only: the memory may be the device's. */
static void kv_pool__set_arrays(kv_pool_t *p, void *k, void *v)
{
    p->view.k = k;
    p->view.v = v;
    if (p->view.dtype == DTYPE_Q8) {
        size_t codes = kv_dtype_bytes(DTYPE_Q8, p->view.page_stride * p->view.n_pages);
        p->view.k_scale = (float *)((char *)k + codes);
        p->view.v_scale = (float *)((char *)v + codes);
    }
}

int kv_pool_new(kv_pool_t **out, backend_t *be, int n_layers, int kv_dim, dtype_t dtype,
                int page_size, int n_pages)
{
    size_t bytes;
    kv_pool_t *p = calloc(1, sizeof *p);
    if (!p)
        goto fail_alloc;
    int e = kv_pool__geometry(p, n_layers, kv_dim, dtype, page_size, n_pages, &bytes);
    if (e) {
        free(p);
        return e;
    }
    p->be = be;
    /* Buffers are allocated in floats (the backends' activation type). */
    void *k = be->ops->buf_alloc(be->ctx, bytes / sizeof(float));
    if (!k)
        goto fail_k;
    void *v = be->ops->buf_alloc(be->ctx, bytes / sizeof(float));
    if (!v) {
        be->ops->buf_free(be->ctx, k);
        goto fail_k;
    }
    kv_pool__set_arrays(p, k, v);
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
    be->ops->buf_free(be->ctx, p->view.k);
fail_k:
    free(p);
fail_alloc:
    return river_err_set(RIVER_ENOMEM, "kv pool: cannot allocate %d pages of %d positions",
                         n_pages, page_size);
}

size_t kv_pool_shared_bytes(int n_layers, int kv_dim, dtype_t dtype, int page_size,
                            int n_pages)
{
    size_t a = kv_pool__array_bytes(n_layers, kv_dim, dtype, page_size, n_pages);
    return a && a <= SIZE_MAX / 2 ? 2 * a : 0;
}

/* The parts every shared pool has: geometry, K at the start of the shared buffer, V after
 * it. Where the buffer lives is the backend's (ops->shared_alloc / shared_map): a memfd for
 * host memory, a CUDA IPC handle for device memory. */
static int kv_pool__shared(kv_pool_t **out, backend_t *be, int n_layers, int kv_dim,
                           dtype_t dtype, int page_size, int n_pages, size_t *bytes)
{
    kv_pool_t *p = calloc(1, sizeof *p);
    if (!p)
        return river_err_set(RIVER_ENOMEM, "kv pool: state");
    size_t array;
    int e = kv_pool__geometry(p, n_layers, kv_dim, dtype, page_size, n_pages, &array);
    if (e) {
        free(p);
        return e;
    }
    *bytes = 2 * array;
    p->be = be;
    p->shared = 1;
    p->handle.fd = -1;
    *out = p;
    return 0;
}

static void kv_pool__set_buffer(kv_pool_t *p, void *buf, size_t bytes)
{
    p->map = buf;
    kv_pool__set_arrays(p, buf, (char *)buf + bytes / 2);
}

int kv_pool_new_shared(kv_pool_t **out, backend_t *be, int n_layers, int kv_dim, dtype_t dtype,
                       int page_size, int n_pages, int *fd_out)
{
    size_t bytes;
    kv_pool_t *p;
    int e = kv_pool__shared(&p, be, n_layers, kv_dim, dtype, page_size, n_pages, &bytes);
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
                          int n_layers, int kv_dim, dtype_t dtype, int page_size, int n_pages)
{
    size_t bytes;
    kv_pool_t *p;
    int e = kv_pool__shared(&p, be, n_layers, kv_dim, dtype, page_size, n_pages, &bytes);
    if (e)
        return e;
    p->attached = 1;
    if (h->bytes != bytes) {
        e = river_err_set(RIVER_EINVAL, "kv pool: the shared memory has %zu bytes, the "
                          "geometry (%d layers, kv_dim %d, page %d, %d pages, kv.dtype %s) "
                          "needs %zu", h->bytes, n_layers, kv_dim, page_size, n_pages,
                          dtype_name(dtype), bytes);
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
                   dtype_t dtype, int page_size, int n_pages)
{
    shared_handle_t h = {.kind = SHARED_MEMFD, .fd = fd,
                         .bytes = kv_pool_shared_bytes(n_layers, kv_dim, dtype, page_size,
                                                       n_pages)};
    return kv_pool_attach_handle(out, be, &h, n_layers, kv_dim, dtype, page_size, n_pages);
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

dtype_t kv_pool_dtype(const kv_pool_t *p) { return p->view.dtype; }

/* The byte ranges of page `page` in one array (K or V): its elements, and for Q8 its
 * scales. In floats, the unit of ops->to_host and from_host, which copy any bytes. */
static void kv_pool__page_span(const kv_pool_t *p, int32_t page, size_t off[2], size_t n[2])
{
    const kv_view_t *v = &p->view;
    size_t data = kv_dtype_bytes(v->dtype, v->page_stride) / sizeof(float);
    size_t sc = kv_dtype_scale_bytes(v->dtype, v->page_stride) / sizeof(float);
    off[0] = data * (size_t)page;
    n[0] = data;
    off[1] = kv_dtype_bytes(v->dtype, v->page_stride * v->n_pages) / sizeof(float) +
             sc * (size_t)page;
    n[1] = sc;
}

int kv_pool_fill(kv_pool_t *p, float value)
{
    /* One page's image, converted as kv_write would convert a row of `value`. */
    const kv_view_t *v = &p->view;
    size_t off[2], n[2];
    kv_pool__page_span(p, 0, off, n);
    float *img = malloc((n[0] + n[1]) * sizeof(float));
    float *row = malloc((size_t)v->kv_dim * sizeof(float));
    int e = 0;
    if (!img || !row) {
        e = river_err_set(RIVER_ENOMEM, "kv pool: fill buffer of %zu floats", n[0] + n[1]);
        goto out;
    }
    for (int j = 0; j < v->kv_dim; j++)
        row[j] = value;
    /* The image's scales start right after its elements, so one page of the pool reads as
     * element index t at img, scale index t / KV_Q8_BLOCK at img + n[0]. */
    for (int64_t t = 0; t < v->page_stride; t += v->kv_dim)
        kv_row_from_f32(v->dtype, img, img + n[0], t, row, v->kv_dim);
    for (int32_t page = 0; page < v->n_pages && !e; page++) {
        kv_pool__page_span(p, page, off, n);
        for (int a = 0; a < 2 && !e; a++) {
            void *base = a ? v->v : v->k;
            e = p->be->ops->from_host(p->be->ctx, base, off[0], img, n[0]);
            if (!e && n[1])
                e = p->be->ops->from_host(p->be->ctx, base, off[1], img + n[0], n[1]);
        }
    }
out:
    free(img);
    free(row);
    return e;
}

int kv_pool_copy_page(kv_pool_t *p, int32_t src, int32_t dst, float *buf)
{
    if (src < 0 || src >= p->view.n_pages || dst < 0 || dst >= p->view.n_pages)
        return river_err_set(RIVER_ERANGE, "kv pool: copy of page %d to %d, pool of %d",
                             (int)src, (int)dst, p->view.n_pages);
    size_t so[2], sn[2], d_off[2], dn[2];
    kv_pool__page_span(p, src, so, sn);
    kv_pool__page_span(p, dst, d_off, dn);
    int e = 0;
    for (int a = 0; a < 2 && !e; a++) {
        void *base = a ? p->view.v : p->view.k;
        for (int part = 0; part < 2 && !e; part++) {
            if (!sn[part])
                continue;
            e = p->be->ops->to_host(p->be->ctx, buf, base, so[part], sn[part]);
            if (!e)
                e = p->be->ops->from_host(p->be->ctx, base, d_off[part], buf, sn[part]);
        }
    }
    return e;
}

size_t kv_pool_page_floats(const kv_pool_t *p)
{
    size_t off[2], n[2];
    kv_pool__page_span(p, 0, off, n);
    return n[0] > n[1] ? n[0] : n[1];
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
