/* The opaque backend (kernels/opaque/opaque.h): every op translates its arguments from the
 * inaccessible range the caller sees to the readable mapping, checks that they are this
 * backend's memory, and runs the CPU kernel. */
#include "kernels/opaque/opaque.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/err.h"
#include "kernels/backend_driver.h"
#include "kernels/cpu/cpu.h"
#include "kernels/shm.h"

struct ops_ctx {
    backend_t *cpu;    /* the kernels */
    char *real;        /* (OPAQUE_ARENA_BYTES) readable mapping of the arena */
    char *shadow;      /* (OPAQUE_ARENA_BYTES) PROT_NONE range the caller's addresses are in */
    size_t used;       /* bytes handed out, page-rounded; never reused */
    size_t page;
    /* RIVER_OPAQUE_FAULT_AFTER=N: the device is lost at the N+1st matmul, as a GPU is after
     * a sticky fault, and every op from then on fails; tests of what a worker does then. */
    long fault_after; /* matmuls left before the fault; -1: never */
    int lost;
    /* The shared buffers this backend exported, so that mapping one of them again gives
     * the buffer itself, as the CUDA backend's own IPC handles do (a CUDA process cannot
     * open them): a memfd by its inode. */
    struct opq_export {
        void *buf;
        dev_t dev;
        ino_t ino;
        int aliases; /* maps of it not freed yet */
    } *exports;
    size_t n_exports, cap_exports;
};

/* Counts a matmul towards RIVER_OPAQUE_FAULT_AFTER; RIVER_EDEVICE once the device is lost. */
static int opq__alive(ops_ctx_t *c, const char *op)
{
    if (!c->lost && c->fault_after >= 0 && c->fault_after-- == 0)
        c->lost = 1;
    if (c->lost)
        return river_err_set(RIVER_EDEVICE, "opaque %s: the device is lost "
                             "(RIVER_OPAQUE_FAULT_AFTER)", op);
    return 0;
}

/* The readable address of caller address h, or NULL when h is not inside what this backend
 * handed out. */
static void *opq__real(const ops_ctx_t *c, const void *h)
{
    const char *p = h;
    if (p < c->shadow || p >= c->shadow + c->used)
        return NULL;
    return c->real + (p - c->shadow);
}

static int opq__not_mine(const char *op, const char *what, const void *h)
{
    return river_err_set(RIVER_EDEVICE, "opaque backend: %s: %s %p is not memory of this "
                         "backend (a host pointer, or a weight that was never placed)", op,
                         what, h);
}

#define OPQ_BUF(var, h, op)                                                                  \
    void *var = opq__real(ctx, (h));                                                        \
    if (!var)                                                                               \
        return opq__not_mine((op), #h, (h))

/* A weight as the CPU kernels read it; an absent weight (data NULL) stays absent. */
static int opq__weight(const ops_ctx_t *ctx, const weight_t *w, weight_t *out, const char *op)
{
    *out = *w;
    if (!w->data)
        return 0;
    if (!(out->data = opq__real(ctx, w->data)))
        return opq__not_mine(op, "weight data", w->data);
    if (w->scales && !(out->scales = opq__real(ctx, w->scales)))
        return opq__not_mine(op, "weight scales", w->scales);
    if (w->zeros && !(out->zeros = opq__real(ctx, w->zeros)))
        return opq__not_mine(op, "weight zeros", w->zeros);
    return 0;
}

#define OPQ_WEIGHT(var, w, op)                                                               \
    weight_t var;                                                                           \
    {                                                                                       \
        int we_ = opq__weight(ctx, (w), &var, (op));                                        \
        if (we_)                                                                            \
            return we_;                                                                     \
    }

static int opq__kv(const ops_ctx_t *ctx, const kv_view_t *kv, kv_view_t *out, const char *op)
{
    *out = *kv;
    if (!(out->k = opq__real(ctx, kv->k)))
        return opq__not_mine(op, "K pages", kv->k);
    if (!(out->v = opq__real(ctx, kv->v)))
        return opq__not_mine(op, "V pages", kv->v);
    /* Q8 scales live in the pool's buffers too (after the codes), and move with them. */
    if (kv->k_scale && !(out->k_scale = opq__real(ctx, kv->k_scale)))
        return opq__not_mine(op, "K scales", kv->k_scale);
    if (kv->v_scale && !(out->v_scale = opq__real(ctx, kv->v_scale)))
        return opq__not_mine(op, "V scales", kv->v_scale);
    return 0;
}

#define CPU ctx->cpu->ops
#define CPUCTX ctx->cpu->ctx

/* ---- memory ----------------------------------------------------------------------------- */

/* Page-rounded, so that freeing returns exactly its own pages; zero-filled because the
 * arena's pages are fresh anonymous memory that no one wrote before. */
static void *opq__alloc(ops_ctx_t *ctx, size_t bytes)
{
    size_t len = (bytes + ctx->page - 1) / ctx->page * ctx->page;
    if (!len)
        len = ctx->page;
    if (len > OPAQUE_ARENA_BYTES - ctx->used) {
        river_err_set(RIVER_ENOMEM, "opaque backend: arena of %zu bytes exhausted",
                      (size_t)OPAQUE_ARENA_BYTES);
        return NULL;
    }
    void *h = ctx->shadow + ctx->used;
    ctx->used += len;
    return h;
}

static void *opq_buf_alloc(ops_ctx_t *ctx, size_t n_elems)
{
    if (n_elems > SIZE_MAX / sizeof(float))
        return NULL;
    return opq__alloc(ctx, n_elems * sizeof(float));
}

/* The pages go back to the system; their addresses are never handed out again, so a late
 * read through the kernels sees zeros and one on the host still faults. */
static void opq_buf_free(ops_ctx_t *ctx, void *buf)
{
    if (!buf)
        return;
    (void)ctx;
    /* The length is not recorded: a buffer is freed by its first page only, which is enough
     * to release small scratch; large buffers are few and live as long as the backend. */
    char *r = opq__real(ctx, buf);
    if (r)
        (void)madvise(r, ctx->page, MADV_DONTNEED);
}

static int opq_to_host(ops_ctx_t *ctx, float *dst, const void *src, size_t offset, size_t n)
{
    OPQ_BUF(s, src, "to_host");
    return CPU->to_host(CPUCTX, dst, s, offset, n);
}

static int opq_from_host(ops_ctx_t *ctx, void *dst, size_t offset, const float *src, size_t n)
{
    OPQ_BUF(d, dst, "from_host");
    return CPU->from_host(CPUCTX, d, offset, src, n);
}

/* ---- the model ops ---------------------------------------------------------------------- */

static int opq_embed(ops_ctx_t *ctx, void *out, const weight_t *table, const int32_t *tokens,
                     int n)
{
    OPQ_BUF(o, out, "embed");
    OPQ_WEIGHT(t, table, "embed");
    return CPU->embed(CPUCTX, o, &t, tokens, n);
}

static int opq_rmsnorm(ops_ctx_t *ctx, void *out, const void *x, const weight_t *w, int n,
                       int d, float eps)
{
    OPQ_BUF(o, out, "rmsnorm");
    OPQ_BUF(xr, x, "rmsnorm");
    OPQ_WEIGHT(wr, w, "rmsnorm");
    return CPU->rmsnorm(CPUCTX, o, xr, &wr, n, d, eps);
}

static int opq_matmul(ops_ctx_t *ctx, void *y, const void *x, const weight_t *w, int n)
{
    int e = opq__alive(ctx, "matmul");
    if (e)
        return e;
    OPQ_BUF(yr, y, "matmul");
    OPQ_BUF(xr, x, "matmul");
    OPQ_WEIGHT(wr, w, "matmul");
    return CPU->matmul(CPUCTX, yr, xr, &wr, n);
}

/* Each weight counts as a matmul towards RIVER_OPAQUE_FAULT_AFTER, as when the engine
 * called matmul once per weight. */
static int opq_matmul_multi(ops_ctx_t *ctx, void *const *y, const void *x,
                            const weight_t *const *w, int count, int n)
{
    if (count < 1 || count > OPS_MATMULS_MAX)
        return river_err_set(RIVER_EINVAL, "opaque matmul_multi: %d weights", count);
    void *yr[OPS_MATMULS_MAX];
    weight_t wr[OPS_MATMULS_MAX];
    const weight_t *wp[OPS_MATMULS_MAX];
    for (int i = 0; i < count; i++) {
        int e = opq__alive(ctx, "matmul");
        if (e)
            return e;
        if (!(yr[i] = opq__real(ctx, y[i])))
            return opq__not_mine("matmul_multi", "y", y[i]);
        if ((e = opq__weight(ctx, w[i], &wr[i], "matmul_multi")) != 0)
            return e;
        wp[i] = &wr[i];
    }
    OPQ_BUF(xr, x, "matmul_multi");
    return CPU->matmul_multi(CPUCTX, yr, xr, wp, count, n);
}

static int opq_add_bias(ops_ctx_t *ctx, void *y, const weight_t *b, int n, int d)
{
    OPQ_BUF(yr, y, "add_bias");
    OPQ_WEIGHT(br, b, "add_bias");
    return CPU->add_bias(CPUCTX, yr, &br, n, d);
}

static int opq_add(ops_ctx_t *ctx, void *y, const void *x, size_t n_elems)
{
    OPQ_BUF(yr, y, "add");
    OPQ_BUF(xr, x, "add");
    return CPU->add(CPUCTX, yr, xr, n_elems);
}

static int opq_rope(ops_ctx_t *ctx, void *x, const int32_t *pos, int n, int n_heads,
                    const rope_t *rope)
{
    OPQ_BUF(xr, x, "rope");
    return CPU->rope(CPUCTX, xr, pos, n, n_heads, rope);
}

static int opq_swiglu(ops_ctx_t *ctx, void *out, const void *gate, const void *up, int n,
                      int d, int stride)
{
    OPQ_BUF(o, out, "swiglu");
    OPQ_BUF(g, gate, "swiglu");
    OPQ_BUF(u, up, "swiglu");
    return CPU->swiglu(CPUCTX, o, g, u, n, d, stride);
}

static int opq_kv_write(ops_ctx_t *ctx, const kv_view_t *kv, int layer, const attn_batch_t *b,
                        const void *k, const void *v)
{
    kv_view_t kr;
    int e = opq__kv(ctx, kv, &kr, "kv_write");
    if (e)
        return e;
    OPQ_BUF(kk, k, "kv_write");
    OPQ_BUF(vv, v, "kv_write");
    return CPU->kv_write(CPUCTX, &kr, layer, b, kk, vv);
}

static int opq_attention(ops_ctx_t *ctx, void *out, const void *q, const kv_view_t *kv,
                         int layer, const attn_batch_t *b, int n_heads, int n_kv_heads,
                         int head_dim, float scale)
{
    kv_view_t kr;
    int e = opq__kv(ctx, kv, &kr, "attention");
    if (e)
        return e;
    OPQ_BUF(o, out, "attention");
    OPQ_BUF(qr, q, "attention");
    return CPU->attention(CPUCTX, o, qr, &kr, layer, b, n_heads, n_kv_heads, head_dim, scale);
}

static int opq_cosine(ops_ctx_t *ctx, float *out, const void *a, const void *b, int n, int d)
{
    OPQ_BUF(ar, a, "cosine");
    OPQ_BUF(br, b, "cosine");
    return CPU->cosine(CPUCTX, out, ar, br, n, d);
}

static int opq_router_prob(ops_ctx_t *ctx, float *out, const void *x,
                           const router_weights_t *w, const int32_t *rows, int n)
{
    OPQ_BUF(xr, x, "router_prob");
    router_weights_t wr = *w;
    int e;
    if ((e = opq__weight(ctx, &w->norm, &wr.norm, "router_prob")) ||
        (e = opq__weight(ctx, &w->down, &wr.down, "router_prob")) ||
        (e = opq__weight(ctx, &w->up, &wr.up, "router_prob")))
        return e;
    return CPU->router_prob(CPUCTX, out, xr, &wr, rows, n);
}

static int opq_gather_rows(ops_ctx_t *ctx, void *dst, const void *src, const int32_t *idx,
                           int n, int d)
{
    OPQ_BUF(dr, dst, "gather_rows");
    OPQ_BUF(sr, src, "gather_rows");
    return CPU->gather_rows(CPUCTX, dr, sr, idx, n, d);
}

static int opq_scatter_rows(ops_ctx_t *ctx, void *dst, const void *src, const int32_t *idx,
                            int n, int d)
{
    OPQ_BUF(dr, dst, "scatter_rows");
    OPQ_BUF(sr, src, "scatter_rows");
    return CPU->scatter_rows(CPUCTX, dr, sr, idx, n, d);
}

static int opq_sync(ops_ctx_t *ctx)
{
    return CPU->sync(CPUCTX);
}

/* ---- the backend ------------------------------------------------------------------------ */

/* Its device memory is the host's. */
static int64_t opq_mem_free(ops_ctx_t *ctx)
{
    return CPU->mem_free(CPUCTX);
}

static void opq_info(ops_ctx_t *ctx, backend_info_t *out)
{
    backend_info_t cpu;
    memset(&cpu, 0, sizeof cpu);
    CPU->info(CPUCTX, &cpu);
    out->name = "opaque";
    memcpy(out->variant, cpu.variant, sizeof out->variant);
    out->threads = cpu.threads;
    out->device = 0;
    /* Every opaque backend on a host stands for one device, as two workers on one GPU
     * would be: the split pair's choices for a shared device run here without one. */
    snprintf(out->uuid, sizeof out->uuid, "%s", OPAQUE_DEVICE_UUID);
    out->host_memory = 0;
    out->lost = ctx->lost;
    /* Peer copies through a shared buffer run the same ops a GPU pair's would, on memory
     * the worker cannot touch; NCCL has no CPU form. */
    out->handoff = HANDOFF_SHARED;
}

/* Copies the weight into the arena like a device upload. */
static int opq_weight_upload(ops_ctx_t *ctx, weight_t *w)
{
    if (!w->data)
        return 0;
    if (opq__real(ctx, w->data))
        return 0; /* placed already (a view shared by two weights) */
    size_t bytes = dtype_row_bytes(w->dtype, w->cols) * (size_t)w->rows;
    size_t qbytes = 0;
    if (dtype_is_quant(w->dtype)) {
        if (w->group <= 0 || w->cols % w->group)
            return river_err_set(RIVER_EINVAL, "opaque upload: group %d does not divide %lld "
                                 "columns", w->group, (long long)w->cols);
        qbytes = (size_t)w->rows * (size_t)(w->cols / w->group) * sizeof(uint16_t);
    }
    void *d = opq__alloc(ctx, bytes);
    void *s = qbytes ? opq__alloc(ctx, qbytes) : NULL;
    void *z = qbytes ? opq__alloc(ctx, qbytes) : NULL;
    if (!d || (qbytes && (!s || !z)))
        return RIVER_ENOMEM;
    memcpy(opq__real(ctx, d), w->data, bytes);
    if (qbytes) {
        memcpy(opq__real(ctx, s), w->scales, qbytes);
        memcpy(opq__real(ctx, z), w->zeros, qbytes);
    }
    /* The CPU backend may place a weight in a form of its own (Q4 codes repacked for its
     * integer kernels, Q4X8): the kernels here must see what they see on the CPU, so the
     * CPU places the copy too, and a repacked form (the same size) replaces the copy. The
     * CPU's own repacked buffer then stays unused until the backend is destroyed. */
    weight_t cw = *w;
    cw.data = opq__real(ctx, d);
    cw.scales = qbytes ? opq__real(ctx, s) : NULL;
    cw.zeros = qbytes ? opq__real(ctx, z) : NULL;
    int e = CPU->weight_upload(CPUCTX, &cw);
    if (e)
        return e;
    if (cw.data != opq__real(ctx, d)) {
        if (dtype_row_bytes(cw.dtype, cw.cols) * (size_t)cw.rows != bytes)
            return river_err_set(RIVER_EINVAL, "opaque upload: the CPU placed a %s weight of "
                                 "another size", dtype_name(w->dtype));
        memcpy(opq__real(ctx, d), cw.data, bytes);
    }
    w->dtype = cw.dtype;
    w->zero_int = cw.zero_int; /* what the CPU's placement found, for the same kernels */
    if (qbytes) {
        w->scales = s;
        w->zeros = z;
    }
    w->data = d;
    return 0;
}

/* Placed weights are the backend's own copies (anonymous memory): releasing them would
 * lose them, so they stay, as a device backend without eviction keeps its copies. */
static int opq_weight_residency(ops_ctx_t *ctx, const weight_t *w, int resident)
{
    (void)resident;
    if (w->data && !opq__real(ctx, w->data))
        return opq__not_mine("weight_residency", "weight data", w->data);
    return 0;
}

/* A shared buffer takes the next stretch of the arena, with the memfd mapped over the
 * readable side, so the kernels see the peer's writes and the caller still only sees the
 * inaccessible range. */
static void *opq__shared_place(ops_ctx_t *ctx, int fd, size_t bytes)
{
    void *h = opq__alloc(ctx, bytes);
    if (!h)
        return NULL;
    char *r = opq__real(ctx, h);
    size_t len = (bytes + ctx->page - 1) / ctx->page * ctx->page;
    if (mmap(r, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) == MAP_FAILED) {
        river_err_set(RIVER_ESYS, "opaque backend: mapping %zu shared bytes: %s", bytes,
                      strerror(errno));
        return NULL;
    }
    return h;
}

/* The export whose buffer is buf, or (buf NULL) whose memfd st describes; NULL if none. */
static struct opq_export *opq__export_find(ops_ctx_t *ctx, const void *buf,
                                           const struct stat *st)
{
    for (size_t i = 0; i < ctx->n_exports; i++) {
        struct opq_export *x = &ctx->exports[i];
        if (buf ? x->buf == buf : x->dev == st->st_dev && x->ino == st->st_ino)
            return x;
    }
    return NULL;
}

static void *opq_shared_alloc(ops_ctx_t *ctx, size_t bytes, shared_handle_t *h)
{
    int fd;
    if (shm_create(bytes, &fd))
        return NULL;
    struct stat st;
    if (fstat(fd, &st)) {
        river_err_set(RIVER_ESYS, "opaque backend: fstat of shared memory: %s",
                      strerror(errno));
        close(fd);
        return NULL;
    }
    if (ctx->n_exports == ctx->cap_exports) {
        size_t cap = ctx->cap_exports ? 2 * ctx->cap_exports : 8;
        struct opq_export *n = realloc(ctx->exports, cap * sizeof *n);
        if (!n) {
            river_err_set(RIVER_ENOMEM, "opaque backend: export list");
            close(fd);
            return NULL;
        }
        ctx->exports = n;
        ctx->cap_exports = cap;
    }
    void *buf = opq__shared_place(ctx, fd, bytes);
    if (!buf) {
        close(fd);
        return NULL;
    }
    ctx->exports[ctx->n_exports++] =
        (struct opq_export){.buf = buf, .dev = st.st_dev, .ino = st.st_ino};
    memset(h, 0, sizeof *h);
    h->kind = SHARED_MEMFD;
    h->bytes = bytes;
    h->fd = fd;
    return buf;
}

static void *opq_shared_map(ops_ctx_t *ctx, const shared_handle_t *h)
{
    if (h->kind != SHARED_MEMFD) {
        river_err_set(RIVER_EUNSUPPORTED, "opaque backend: cannot map shared memory of kind "
                      "%d", (int)h->kind);
        return NULL;
    }
    if (shm_check(h->fd, h->bytes))
        return NULL;
    /* Its own export (the same memfd, through whichever descriptor): the buffer itself. */
    struct stat st;
    struct opq_export *x = fstat(h->fd, &st) == 0 ? opq__export_find(ctx, NULL, &st) : NULL;
    if (x) {
        x->aliases++;
        return x->buf;
    }
    return opq__shared_place(ctx, h->fd, h->bytes);
}

/* The stretch goes back to private zero pages; its addresses are not handed out again. */
static void opq_shared_free(ops_ctx_t *ctx, void *buf, const shared_handle_t *h, int owner)
{
    struct opq_export *x = buf ? opq__export_find(ctx, buf, NULL) : NULL;
    if (x && !owner && x->aliases > 0) {
        /* An alias: the owner's mapping stays as it is. */
        x->aliases--;
        return;
    }
    if (x && owner)
        *x = ctx->exports[--ctx->n_exports];
    char *r = buf ? opq__real(ctx, buf) : NULL;
    if (r) {
        size_t len = (h->bytes + ctx->page - 1) / ctx->page * ctx->page;
        (void)mmap(r, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED |
                   MAP_NORESERVE, -1, 0);
    }
    if (owner && h->fd >= 0)
        close(h->fd);
}

static void opq_destroy(backend_t *be)
{
    opaque_backend_destroy(&be);
}

static const ops_t opaque_ops = {
    .name = "opaque",
    .info = opq_info,
    .mem_free = opq_mem_free,
    .weight_upload = opq_weight_upload,
    .weight_residency = opq_weight_residency,
    .shared_alloc = opq_shared_alloc,
    .shared_map = opq_shared_map,
    .shared_free = opq_shared_free,
    .destroy = opq_destroy,
    .buf_alloc = opq_buf_alloc,
    .buf_free = opq_buf_free,
    .to_host = opq_to_host,
    .from_host = opq_from_host,
    .embed = opq_embed,
    .rmsnorm = opq_rmsnorm,
    .matmul = opq_matmul,
    .matmul_multi = opq_matmul_multi,
    .add_bias = opq_add_bias,
    .add = opq_add,
    .rope = opq_rope,
    .swiglu = opq_swiglu,
    .kv_write = opq_kv_write,
    .attention = opq_attention,
    .cosine = opq_cosine,
    .router_prob = opq_router_prob,
    .gather_rows = opq_gather_rows,
    .scatter_rows = opq_scatter_rows,
    .sync = opq_sync,
};

int opaque_backend_new(backend_t **out, int n_threads, cpu_simd_t simd)
{
    int e = RIVER_ENOMEM;
    backend_t *b = calloc(1, sizeof *b);
    ops_ctx_t *ctx = calloc(1, sizeof *ctx);
    if (!b || !ctx) {
        river_err_set(e, "opaque backend: state");
        goto fail;
    }
    ctx->page = (size_t)sysconf(_SC_PAGESIZE);
    const char *fa = getenv("RIVER_OPAQUE_FAULT_AFTER");
    char *end = NULL;
    ctx->fault_after = fa && *fa ? strtol(fa, &end, 10) : -1;
    if (fa && *fa && (*end || ctx->fault_after < 0)) {
        e = river_err_set(RIVER_EINVAL, "RIVER_OPAQUE_FAULT_AFTER '%s' is not a count of "
                          "matmuls", fa);
        goto fail;
    }
    ctx->real = mmap(NULL, OPAQUE_ARENA_BYTES, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (ctx->real == MAP_FAILED) {
        ctx->real = NULL;
        e = river_err_set(RIVER_ESYS, "opaque backend: reserving %zu bytes: %s",
                          (size_t)OPAQUE_ARENA_BYTES, strerror(errno));
        goto fail;
    }
    ctx->shadow = mmap(NULL, OPAQUE_ARENA_BYTES, PROT_NONE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (ctx->shadow == MAP_FAILED) {
        ctx->shadow = NULL;
        e = river_err_set(RIVER_ESYS, "opaque backend: reserving %zu bytes: %s",
                          (size_t)OPAQUE_ARENA_BYTES, strerror(errno));
        goto fail_real;
    }
    if ((e = cpu_backend_new(&ctx->cpu, n_threads, simd)))
        goto fail_shadow;
    b->ops = &opaque_ops;
    b->ctx = ctx;
    *out = b;
    return 0;

fail_shadow:
    munmap(ctx->shadow, OPAQUE_ARENA_BYTES);
fail_real:
    munmap(ctx->real, OPAQUE_ARENA_BYTES);
fail:
    free(ctx);
    free(b);
    return e;
}

void opaque_backend_destroy(backend_t **bp)
{
    if (!bp || !*bp)
        return;
    ops_ctx_t *ctx = (*bp)->ctx;
    cpu_backend_destroy(&ctx->cpu);
    free(ctx->exports);
    munmap(ctx->shadow, OPAQUE_ARENA_BYTES);
    munmap(ctx->real, OPAQUE_ARENA_BYTES);
    free(ctx);
    free(*bp);
    *bp = NULL;
}

/* The device "opaque" (kernels/backend_driver.h): at the selected SIMD level. Its weights
 * are always copies into the arena, whatever `weights` asks. */
static int opaque_driver_open(backend_t **out, int index, int n_threads,
                              backend_weights_t weights)
{
    (void)index;
    (void)weights;
    return opaque_backend_new(out, n_threads, CPU_SIMD_COUNT);
}

const backend_driver_t opaque_backend_driver = {.name = "opaque", .open = opaque_driver_open};
