/* The CPU backend: the ops table, the backend state and the simple ops. matmul lives in
 * matmul.c, attention in attention.c, the SIMD level in simd_level.c and the kernels of
 * each level in kernels_*.c. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/err.h"
#include "common/meminfo.h"
#include "kernels/backend_driver.h"
#include "kernels/cpu/cpu_internal.h"
#include "kernels/cpu/huge_pages.h"
#include "kernels/cpu/lowbit.h"
#include "kernels/cpu/q4x8.h"
#include "kernels/cpu/rowblock.h"
#include "kernels/cpu/x8_pick.h"
#include "kernels/half.h"
#include "kernels/shm.h"

/* Element-wise ops on fewer elements than this run on the calling thread: below it the
 * dispatch to the pool costs more than the work it would share. */
#define CPU_PAR_ELEMS (1 << 16)

/* ---- scratch ---------------------------------------------------------------------------- */

int cpu_scratch_reserve(cpu_scratch_t *s, size_t n)
{
    if (n <= s->cap)
        return 0;
    /* Grow by half again so a slowly lengthening context does not reallocate every step. */
    size_t cap = n + n / 2 + 16;
    void *p;
    if (posix_memalign(&p, 64, cap * sizeof(float)) != 0)
        return river_err_set(RIVER_ENOMEM, "cpu: scratch of %zu floats", cap);
    free(s->p);
    s->p = p;
    s->cap = cap;
    return 0;
}

int cpu_thread_scratch_reserve(ops_ctx_t *ctx, size_t n)
{
    for (int t = 0; t < ctx->n_threads; t++) {
        int e = cpu_scratch_reserve(&ctx->thread_scratch[t].s, n);
        if (e)
            return e;
    }
    return 0;
}

int cpu_weight_check(const weight_t *w, const char *what)
{
    if (!w || !w->data)
        return river_err_set(RIVER_EINVAL, "cpu %s: no weight data", what);
    if ((unsigned)w->dtype >= DTYPE_COUNT)
        return river_err_set(RIVER_EDTYPE, "cpu %s: dtype %d", what, (int)w->dtype);
    if (w->rows <= 0 || w->cols <= 0)
        return river_err_set(RIVER_ESHAPE, "cpu %s: shape (%lld, %lld)", what,
                             (long long)w->rows, (long long)w->cols);
    if (w->dtype == DTYPE_Q4X8 && !cpu_q4x8_eligible(&(weight_t){.dtype = DTYPE_Q4,
                                                                 .data = w->data, .cols = w->cols,
                                                                 .group = w->group}))
        return river_err_set(RIVER_EFORMAT, "cpu %s: q4x8 weight with group %d over %lld "
                             "columns", what, w->group, (long long)w->cols);
    if (w->dtype == DTYPE_Q8X8 && !cpu_q8x8_eligible(&(weight_t){.dtype = DTYPE_Q8,
                                                                 .data = w->data, .cols = w->cols,
                                                                 .group = w->group}))
        return river_err_set(RIVER_EFORMAT, "cpu %s: q8x8 weight with group %d over %lld "
                             "columns", what, w->group, (long long)w->cols);
    if (w->dtype == DTYPE_Q4 || w->dtype == DTYPE_Q8 || w->dtype == DTYPE_Q4X8 ||
        w->dtype == DTYPE_Q8X8) {
        if (!w->scales || !w->zeros || w->group <= 0 || w->cols % w->group != 0 ||
            (w->dtype == DTYPE_Q4 && w->group % 2 != 0))
            return river_err_set(RIVER_EFORMAT, "cpu %s: %s weight with group %d over %lld "
                                 "columns", what, dtype_name(w->dtype), w->group,
                                 (long long)w->cols);
    }
    /* The 2- and 3-bit kernels unpack whole runs of LOWBIT_GROUP_UNIT codes of one group. */
    if (w->dtype == DTYPE_Q2 || w->dtype == DTYPE_Q3) {
        if (!w->scales || !w->zeros || w->group <= 0 || w->group % LOWBIT_GROUP_UNIT != 0 ||
            w->cols % w->group != 0)
            return river_err_set(RIVER_EFORMAT, "cpu %s: %s weight with group %d over %lld "
                                 "columns (groups of a multiple of %d that divides the "
                                 "columns)", what, dtype_name(w->dtype), w->group,
                                 (long long)w->cols, LOWBIT_GROUP_UNIT);
    }
    return 0;
}

/* A 1 x d weight vector as f32: the weight itself when it is f32, else converted into
 * `s`. The caller runs on the calling thread, before any dispatch. */
static int cpu_vector_f32(const float **out, ops_ctx_t *ctx, cpu_scratch_t *s,
                          const weight_t *w, int d, const char *what)
{
    int e = cpu_weight_check(w, what);
    if (e)
        return e;
    if (w->rows * w->cols != d)
        return river_err_set(RIVER_ESHAPE, "cpu %s: weight (%lld, %lld) for width %d", what,
                             (long long)w->rows, (long long)w->cols, d);
    if (w->dtype == DTYPE_F32) {
        *out = w->data;
        return 0;
    }
    if (w->rows != 1)
        return river_err_set(RIVER_ESHAPE, "cpu %s: %s vector of %lld rows", what,
                             dtype_name(w->dtype), (long long)w->rows);
    e = cpu_scratch_reserve(s, (size_t)d);
    if (e)
        return e;
    cpu_kernels_for(ctx->k, w, 0)->rows_to_f32(s->p, w, 0, 1);
    *out = s->p;
    return 0;
}

/* ---- buffers ---------------------------------------------------------------------------- */

/* Every buffer starts with a 64-byte header recording how it was allocated. Large ones
 * are mapped anonymously, which gives zeroed memory without touching it (a KV cache of
 * gigabytes costs nothing until used) and lets the kernel back them with huge pages. */
#define BUF_HEADER 64
#define BUF_MMAP_MIN (1u << 20)

typedef struct buf_header {
    size_t total;
    int mapped;
} buf_header_t;

static void *cpu_buf_alloc(ops_ctx_t *ctx, size_t n_elems)
{
    (void)ctx;
    if (n_elems > (SIZE_MAX - 2 * BUF_HEADER) / sizeof(float)) {
        river_err_set(RIVER_ENOMEM, "cpu: buffer of %zu floats", n_elems);
        return NULL;
    }
    size_t total = BUF_HEADER + (n_elems * sizeof(float) + 63) / 64 * 64;
    uint8_t *base;
    int mapped = total >= BUF_MMAP_MIN;
    if (mapped) {
        void *p = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) {
            river_err_set(RIVER_ENOMEM, "cpu: mmap of %zu bytes failed", total);
            return NULL;
        }
        /* Only a hint: without transparent huge pages the buffer simply uses small pages. */
        (void)madvise(p, total, MADV_HUGEPAGE);
        base = p;
    } else {
        void *p;
        if (posix_memalign(&p, 64, total) != 0) {
            river_err_set(RIVER_ENOMEM, "cpu: buffer of %zu bytes", total);
            return NULL;
        }
        memset(p, 0, total);
        base = p;
    }
    buf_header_t *h = (buf_header_t *)base;
    h->total = total;
    h->mapped = mapped;
    return base + BUF_HEADER;
}

static void cpu_buf_free(ops_ctx_t *ctx, void *buf)
{
    (void)ctx;
    if (!buf)
        return;
    uint8_t *base = (uint8_t *)buf - BUF_HEADER;
    buf_header_t *h = (buf_header_t *)base;
    if (h->mapped) {
        /* munmap of a range we mapped can only fail on a corrupted header. */
        (void)munmap(base, h->total);
    } else {
        free(base);
    }
}

static int cpu_to_host(ops_ctx_t *ctx, float *dst, const void *src, size_t offset, size_t n)
{
    (void)ctx;
    if (n && (!dst || !src))
        return river_err_set(RIVER_EINVAL, "cpu to_host: NULL buffer");
    if (n)
        memcpy(dst, (const float *)src + offset, n * sizeof(float));
    return 0;
}

static int cpu_from_host(ops_ctx_t *ctx, void *dst, size_t offset, const float *src, size_t n)
{
    (void)ctx;
    if (n && (!dst || !src))
        return river_err_set(RIVER_EINVAL, "cpu from_host: NULL buffer");
    if (n)
        memcpy((float *)dst + offset, src, n * sizeof(float));
    return 0;
}

/* ---- row-parallel helper ---------------------------------------------------------------- */

typedef struct rows_job rows_job_t;
typedef void (*rows_fn_t)(const rows_job_t *j, int64_t r0, int64_t r1, int thread);

/* One element-wise op over rows: what each op needs, in generic fields. */
struct rows_job {
    ops_ctx_t *ctx;
    rows_fn_t fn;
    int64_t n_rows;
    int n_tasks;
    float *out;
    const float *a;
    const float *b;
    const float *w;
    const int32_t *idx;
    int d;
    int stride;
    float eps;
    int n_heads;
    const rope_t *rope;
    int64_t total; /* add: elements */
    const kv_view_t *kv; /* kv_write: the pool, its batch and layer */
    const attn_batch_t *batch;
    int layer;
};

static void rows_task(void *arg, int task, int thread)
{
    const rows_job_t *j = arg;
    int64_t r0 = j->n_rows * task / j->n_tasks;
    int64_t r1 = j->n_rows * (task + 1) / j->n_tasks;
    if (r1 > r0)
        j->fn(j, r0, r1, thread);
}

/* Runs j->fn over all rows, split across the pool when there are enough elements. */
static void rows_run(rows_job_t *j, int64_t elems)
{
    ops_ctx_t *ctx = j->ctx;
    if (ctx->n_threads == 1 || elems < CPU_PAR_ELEMS || j->n_rows < 2) {
        j->fn(j, 0, j->n_rows, 0);
        return;
    }
    j->n_tasks = (int)(j->n_rows < ctx->n_threads ? j->n_rows : ctx->n_threads);
    threadpool_run(ctx->pool, rows_task, j, j->n_tasks);
}

/* ---- embed ------------------------------------------------------------------------------ */

static int cpu_embed(ops_ctx_t *ctx, void *out, const weight_t *table, const int32_t *tokens,
                     int n)
{
    int e = cpu_weight_check(table, "embed");
    if (e)
        return e;
    if (n < 0 || (n > 0 && (!out || !tokens)))
        return river_err_set(RIVER_EINVAL, "cpu embed: %d tokens", n);
    void (*rows_to_f32)(float *, const weight_t *, int64_t, int64_t) =
        cpu_kernels_for(ctx->k, table, 0)->rows_to_f32;
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= table->rows)
            return river_err_set(RIVER_ERANGE, "cpu embed: token %d outside vocabulary of %lld",
                                 (int)tokens[i], (long long)table->rows);
    for (int i = 0; i < n; i++)
        rows_to_f32((float *)out + (int64_t)i * table->cols, table, tokens[i], tokens[i] + 1);
    return 0;
}

/* ---- rmsnorm ---------------------------------------------------------------------------- */

static void rmsnorm_rows(const rows_job_t *j, int64_t r0, int64_t r1, int thread)
{
    (void)thread;
    const cpu_kernels_t *k = j->ctx->k;
    for (int64_t i = r0; i < r1; i++) {
        const float *x = j->a + i * j->d;
        /* The order of llama2.c: mean of squares, plus eps, reciprocal square root, and
         * the weight applied last. */
        float ss = k->sumsq(x, j->d);
        ss /= (float)j->d;
        ss += j->eps;
        ss = 1.0f / sqrtf(ss);
        k->scale_mul(j->out + i * j->d, x, ss, j->w, j->d);
    }
}

static int cpu_rmsnorm(ops_ctx_t *ctx, void *out, const void *x, const weight_t *w, int n,
                       int d, float eps)
{
    if (n < 0 || d <= 0 || (n > 0 && (!out || !x)))
        return river_err_set(RIVER_EINVAL, "cpu rmsnorm: n %d, d %d", n, d);
    rows_job_t j = { .ctx = ctx, .fn = rmsnorm_rows, .n_rows = n, .out = out, .a = x,
                     .d = d, .eps = eps };
    int e = cpu_vector_f32(&j.w, ctx, &ctx->shared, w, d, "rmsnorm");
    if (e)
        return e;
    rows_run(&j, (int64_t)n * d);
    return 0;
}

/* ---- add_bias, add ---------------------------------------------------------------------- */

static void add_bias_rows(const rows_job_t *j, int64_t r0, int64_t r1, int thread)
{
    (void)thread;
    for (int64_t i = r0; i < r1; i++)
        j->ctx->k->add(j->out + i * j->d, j->w, j->d);
}

static int cpu_add_bias(ops_ctx_t *ctx, void *y, const weight_t *b, int n, int d)
{
    if (n < 0 || d <= 0 || (n > 0 && !y))
        return river_err_set(RIVER_EINVAL, "cpu add_bias: n %d, d %d", n, d);
    rows_job_t j = { .ctx = ctx, .fn = add_bias_rows, .n_rows = n, .out = y, .d = d };
    int e = cpu_vector_f32(&j.w, ctx, &ctx->shared, b, d, "add_bias");
    if (e)
        return e;
    rows_run(&j, (int64_t)n * d);
    return 0;
}

/* add works on a flat array, cut into blocks of this many elements to share it out. */
#define ADD_BLOCK 4096

static void add_rows(const rows_job_t *j, int64_t r0, int64_t r1, int thread)
{
    (void)thread;
    int64_t k0 = r0 * ADD_BLOCK;
    int64_t k1 = r1 * ADD_BLOCK < j->total ? r1 * ADD_BLOCK : j->total;
    j->ctx->k->add(j->out + k0, j->a + k0, k1 - k0);
}

static int cpu_add(ops_ctx_t *ctx, void *y, const void *x, size_t n_elems)
{
    if (n_elems == 0)
        return 0;
    if (!y || !x)
        return river_err_set(RIVER_EINVAL, "cpu add: NULL buffer");
    rows_job_t j = { .ctx = ctx, .fn = add_rows, .out = y, .a = x,
                     .n_rows = ((int64_t)n_elems + ADD_BLOCK - 1) / ADD_BLOCK,
                     .total = (int64_t)n_elems };
    rows_run(&j, (int64_t)n_elems);
    return 0;
}

/* ---- rope ------------------------------------------------------------------------------- */

static void rope_rows(const rows_job_t *j, int64_t r0, int64_t r1, int thread)
{
    const rope_t *rp = j->rope;
    int hd = rp->head_dim, half = rp->rot_dim / 2;
    float *cs = j->ctx->thread_scratch[thread].s.p;
    float *sn = cs + half;
    for (int64_t i = r0; i < r1; i++) {
        float pos = (float)j->idx[i];
        for (int f = 0; f < half; f++) {
            float angle = pos * rp->inv_freq[f];
            cs[f] = cosf(angle) * rp->attn_factor;
            sn[f] = sinf(angle) * rp->attn_factor;
        }
        float *row = j->out + i * (int64_t)j->n_heads * hd;
        for (int h = 0; h < j->n_heads; h++) {
            float *x = row + (int64_t)h * hd;
            if (rp->layout == ROPE_INTERLEAVED) {
                for (int f = 0; f < half; f++) {
                    float x0 = x[2 * f], x1 = x[2 * f + 1];
                    x[2 * f] = x0 * cs[f] - x1 * sn[f];
                    x[2 * f + 1] = x0 * sn[f] + x1 * cs[f];
                }
            } else {
                for (int f = 0; f < half; f++) {
                    float x0 = x[f], x1 = x[f + half];
                    x[f] = x0 * cs[f] - x1 * sn[f];
                    x[f + half] = x0 * sn[f] + x1 * cs[f];
                }
            }
        }
    }
}

static int cpu_rope(ops_ctx_t *ctx, void *x, const int32_t *pos, int n, int n_heads,
                    const rope_t *rope)
{
    if (n < 0 || n_heads <= 0 || !rope || (n > 0 && (!x || !pos)))
        return river_err_set(RIVER_EINVAL, "cpu rope: n %d, %d heads", n, n_heads);
    if (rope->head_dim <= 0 || rope->rot_dim <= 0 || rope->rot_dim % 2 != 0 ||
        rope->rot_dim > rope->head_dim || !rope->inv_freq ||
        (rope->layout != ROPE_INTERLEAVED && rope->layout != ROPE_HALF))
        return river_err_set(RIVER_EINVAL, "cpu rope: head_dim %d, rot_dim %d, layout %d",
                             rope->head_dim, rope->rot_dim, (int)rope->layout);
    int e = cpu_thread_scratch_reserve(ctx, (size_t)rope->rot_dim);
    if (e)
        return e;
    rows_job_t j = { .ctx = ctx, .fn = rope_rows, .n_rows = n, .out = x, .idx = pos,
                     .n_heads = n_heads, .rope = rope };
    rows_run(&j, (int64_t)n * n_heads * rope->head_dim);
    return 0;
}

/* ---- swiglu ----------------------------------------------------------------------------- */

static void swiglu_rows(const rows_job_t *j, int64_t r0, int64_t r1, int thread)
{
    (void)thread;
    for (int64_t i = r0; i < r1; i++)
        j->ctx->k->swiglu(j->out + i * j->d, j->a + i * j->stride, j->b + i * j->stride, j->d);
}

static int cpu_swiglu(ops_ctx_t *ctx, void *out, const void *gate, const void *up, int n, int d,
                      int stride)
{
    if (n < 0 || d <= 0 || stride < d || (n > 0 && (!out || !gate || !up)))
        return river_err_set(RIVER_EINVAL, "cpu swiglu: n %d, d %d, stride %d", n, d, stride);
    rows_job_t j = { .ctx = ctx, .fn = swiglu_rows, .n_rows = n, .out = out, .a = gate,
                     .b = up, .d = d, .stride = stride };
    rows_run(&j, (int64_t)n * d);
    return 0;
}

/* ---- kv_write --------------------------------------------------------------------------- */

/* The page holding position p of row i, checked against the pool. */
static int kv_slot(const kv_view_t *kv, const attn_batch_t *b, int i, int64_t *off)
{
    int32_t p = b->pos[i];
    if (p < 0)
        return river_err_set(RIVER_ERANGE, "cpu kv: row %d at position %d", i, (int)p);
    if (!b->page_table[i])
        return river_err_set(RIVER_EINVAL, "cpu kv: row %d has no page table", i);
    int32_t page = b->page_table[i][p / kv->page_size];
    if (page < 0 || page >= kv->n_pages)
        return river_err_set(RIVER_ERANGE, "cpu kv: page %d outside pool of %d", (int)page,
                             kv->n_pages);
    *off = (int64_t)page * kv->page_stride + (int64_t)(p % kv->page_size) * kv->kv_dim;
    return 0;
}

/* Rows r0..r1-1 of a batch into their slots (checked by cpu_kv_write), which are distinct
 * (ops.h: kv_write), so the threads write apart. */
static void kv_write_rows(const rows_job_t *j, int64_t r0, int64_t r1, int thread)
{
    (void)thread;
    const kv_view_t *kv = j->kv;
    for (int64_t i = r0; i < r1; i++) {
        int64_t off;
        (void)kv_slot(kv, j->batch, (int)i, &off);
        off += (int64_t)j->layer * kv->layer_stride;
        j->ctx->k->kv_from_f32(kv->dtype, kv->k, kv->k_scale, off, j->a + i * kv->kv_dim,
                               kv->kv_dim);
        j->ctx->k->kv_from_f32(kv->dtype, kv->v, kv->v_scale, off, j->b + i * kv->kv_dim,
                               kv->kv_dim);
    }
}

static int cpu_kv_write(ops_ctx_t *ctx, const kv_view_t *kv, int layer, const attn_batch_t *b,
                        const void *k, const void *v)
{
    if (!kv || !b || layer < 0 || kv->page_size <= 0 || kv->kv_dim <= 0 || b->n < 0 ||
        (b->n > 0 && (!k || !v || !b->pos || !b->page_table || !kv->k || !kv->v)))
        return river_err_set(RIVER_EINVAL, "cpu kv_write: bad arguments");
    if (!kv_dtype_ok(kv->dtype) ||
        (kv->dtype == DTYPE_Q8 && (kv->kv_dim % KV_Q8_BLOCK || !kv->k_scale || !kv->v_scale)))
        return river_err_set(RIVER_EINVAL, "cpu kv_write: kv.dtype %s with kv_dim %d",
                             dtype_name(kv->dtype), kv->kv_dim);
    for (int i = 0; i < b->n; i++) {
        int64_t off;
        int e = kv_slot(kv, b, i, &off);
        if (e)
            return e;
    }
    rows_job_t j = { .ctx = ctx, .fn = kv_write_rows, .n_rows = b->n, .a = k, .b = v,
                     .kv = kv, .batch = b, .layer = layer };
    rows_run(&j, 2 * (int64_t)b->n * kv->kv_dim);
    return 0;
}

/* ---- cosine, gather, scatter, sync ------------------------------------------------------ */

static int cpu_cosine(ops_ctx_t *ctx, float *out, const void *a, const void *b, int n, int d)
{
    if (n < 0 || d <= 0 || (n > 0 && (!out || !a || !b)))
        return river_err_set(RIVER_EINVAL, "cpu cosine: n %d, d %d", n, d);
    const cpu_kernels_t *k = ctx->k;
    for (int i = 0; i < n; i++) {
        const float *ai = (const float *)a + (int64_t)i * d;
        const float *bi = (const float *)b + (int64_t)i * d;
        float ab = k->dot(ai, bi, d), aa = k->sumsq(ai, d), bb = k->sumsq(bi, d);
        /* A zero vector has no direction; call it orthogonal to everything. */
        out[i] = aa > 0.0f && bb > 0.0f ? ab / (sqrtf(aa) * sqrtf(bb)) : 0.0f;
    }
    return 0;
}

static int cpu_gather_rows(ops_ctx_t *ctx, void *dst, const void *src, const int32_t *idx,
                           int n, int d)
{
    (void)ctx;
    if (n < 0 || d <= 0 || (n > 0 && (!dst || !src || !idx)))
        return river_err_set(RIVER_EINVAL, "cpu gather_rows: n %d, d %d", n, d);
    for (int i = 0; i < n; i++)
        if (idx[i] < 0)
            return river_err_set(RIVER_ERANGE, "cpu gather_rows: index %d", (int)idx[i]);
    for (int i = 0; i < n; i++)
        memcpy((float *)dst + (int64_t)i * d, (const float *)src + (int64_t)idx[i] * d,
               (size_t)d * sizeof(float));
    return 0;
}

static int cpu_scatter_rows(ops_ctx_t *ctx, void *dst, const void *src, const int32_t *idx,
                            int n, int d)
{
    (void)ctx;
    if (n < 0 || d <= 0 || (n > 0 && (!dst || !src || !idx)))
        return river_err_set(RIVER_EINVAL, "cpu scatter_rows: n %d, d %d", n, d);
    for (int i = 0; i < n; i++)
        if (idx[i] < 0)
            return river_err_set(RIVER_ERANGE, "cpu scatter_rows: index %d", (int)idx[i]);
    for (int i = 0; i < n; i++)
        memcpy((float *)dst + (int64_t)idx[i] * d, (const float *)src + (int64_t)i * d,
               (size_t)d * sizeof(float));
    return 0;
}

static int cpu_sync(ops_ctx_t *ctx)
{
    (void)ctx;
    return 0;
}

static void cpu_info(ops_ctx_t *ctx, backend_info_t *out)
{
    out->name = "cpu";
    snprintf(out->variant, sizeof out->variant, "%s", cpu_simd_name(ctx->k->level));
    out->threads = ctx->n_threads;
    out->device = -1;
    out->host_memory = 1;
}

static int64_t cpu_mem_free(ops_ctx_t *ctx)
{
    (void)ctx;
    return meminfo_available();
}

/* Where placement puts a weight. The mapped checkpoint's pages are 4 KiB page-cache pages
 * scattered over physical memory; a decode step streams every matrix once, and from such
 * pages it read 12-14 % slower than from the same bytes in 2 MiB pages (huge_pages.h;
 * README, performance). So every matrix of at least CPU_HUGE_BYTES is copied into such
 * memory, and the source's pages are handed back (MADV_PAGEOUT, which loses nothing: file
 * pages come back from the file, and memory the caller owns is only swapped, if at all).
 * Q4 and Q8 codes that this level's integer kernels want in Q4X8 or Q8X8 (q4x8.h) are
 * repacked into such memory, and Q4 and Q8 weights whose zeros are all one integer are
 * marked (weight_t.zero_int) so that the integer kernels fold their zero terms into the
 * integer sums. A backend told to keep weights mapped (cpu_backend_keep_mapped, for
 * backbone offloading: the copies cannot be released) reads every weight in place, 4-bit
 * and 8-bit codes in the file's layout included. */
/* RIVER_Q4X8=0 keeps 4-bit and 8-bit weights in the file's layout (the Q4 and Q8 kernels),
 * and RIVER_ROWBLOCK=0 bf16 and f16 weights row-major (rowblock.h), to measure the one
 * layout against the other in one run; 1 (or unset) repacks. Read once; any other value is
 * refused at every placement, naming it, rather than read as one or the other. */
typedef struct repack_env {
    const char *name;
    const char *what; /* what 0 keeps, for the error */
    int off, bad;
    char text[32];
} repack_env_t;

static repack_env_t repack_envs[] = {
    {"RIVER_Q4X8", "4-bit and 8-bit weights as the file has them", 0, 0, ""},
    {"RIVER_ROWBLOCK", "bf16 and f16 weights row-major", 0, 0, ""},
};
enum { REPACK_Q4X8, REPACK_ROWBLOCK };
static pthread_once_t repack_once = PTHREAD_ONCE_INIT;

static void repack_env_read(void)
{
    for (size_t i = 0; i < sizeof repack_envs / sizeof repack_envs[0]; i++) {
        repack_env_t *r = &repack_envs[i];
        const char *v = getenv(r->name);
        if (!v || !*v)
            continue;
        snprintf(r->text, sizeof r->text, "%s", v);
        r->off = !strcmp(v, "0");
        r->bad = !r->off && strcmp(v, "1") != 0;
    }
}

/* Memory for a weight's copy in huge pages (huge_pages.h), recorded in ctx->owned; NULL
 * (with an error set) when out of memory. */
static void *cpu__owned_alloc(ops_ctx_t *ctx, size_t bytes)
{
    size_t len = 0;
    struct cpu_owned *o = malloc(sizeof *o);
    void *p = o ? cpu_huge_map(bytes, &len) : NULL;
    if (!p) {
        free(o);
        river_err_set(RIVER_ENOMEM, "cpu upload: %zu bytes for a weight", bytes);
        return NULL;
    }
    o->p = p;
    o->bytes = len;
    o->next = ctx->owned;
    ctx->owned = o;
    return p;
}

/* Advice on the whole pages inside [p, p + bytes), so a neighbour's bytes stay untouched.
 * A failure leaves the pages as they were, which costs memory or time, not results. */
static void cpu__advise(const void *p, size_t bytes, int advice)
{
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t a = (uintptr_t)p, b = a + bytes;
    uintptr_t lo = (a + page - 1) & ~(page - 1), hi = b & ~(page - 1);
    if (hi > lo)
        (void)madvise((void *)lo, hi - lo, advice);
}

static int cpu__owns(const ops_ctx_t *ctx, const void *p);

/* The integer z when every zero of the Q4 or Q8 weight w is z (0 < z <= the largest code),
 * else 0: llama.cpp's Q8_0 (and River's q8 backbones) have zeros of 128, its Q4_0 8, its
 * Q5_0 16, and the integer kernels then fold the zero terms into their integer sums
 * (q4x8_x86.h, q8_x86.h). One pass over the zeros, a sixteenth of the 8-bit codes' bytes
 * at groups of 32, once at placement. */
static int cpu__zeros_all_int(const weight_t *w)
{
    if ((w->dtype != DTYPE_Q8 && w->dtype != DTYPE_Q8X8 && w->dtype != DTYPE_Q4 &&
         w->dtype != DTYPE_Q4X8) ||
        !w->zeros || w->group <= 0 || w->cols % w->group != 0)
        return 0;
    size_t n = (size_t)w->rows * (size_t)(w->cols / w->group);
    uint16_t z16 = w->zeros[0];
    for (size_t i = 1; i < n; i++)
        if (w->zeros[i] != z16)
            return 0;
    float z = f16_to_f32(z16);
    int top = w->dtype == DTYPE_Q8 || w->dtype == DTYPE_Q8X8 ? 255 : 15;
    return z >= 1.0f && z <= (float)top && z == (float)(int)z ? (int)z : 0;
}

static int cpu_weight_upload(ops_ctx_t *ctx, weight_t *w)
{
    if (pthread_once(&repack_once, repack_env_read) != 0)
        return river_err_set(RIVER_ESYS, "cpu upload: pthread_once failed");
    for (size_t i = 0; i < sizeof repack_envs / sizeof repack_envs[0]; i++)
        if (repack_envs[i].bad)
            return river_err_set(RIVER_EINVAL, "%s=%s: not 0 (keep %s) or 1 (repack them for "
                                 "the decode kernels)", repack_envs[i].name,
                                 repack_envs[i].text, repack_envs[i].what);
    int q4x8_off = repack_envs[REPACK_Q4X8].off;
    int xe = cpu_x8_env_check();
    if (xe)
        return xe;
    /* Placed already: a view shared by two weights (a tied head). */
    if (!w->data || cpu__owns(ctx, w->data))
        return 0;
    int zero_int = cpu__zeros_all_int(w);
    size_t bytes = dtype_row_bytes(w->dtype, w->cols) * (size_t)w->rows;
    /* Kept mapped, 4-bit and 8-bit codes stay in the file's layout too (the Q4 and Q8
     * kernels read it), so that a quantized backbone's layers can be released like any
     * other. */
    int repack = ctx->k->q4x8 && !q4x8_off && !ctx->keep_mapped && cpu_q4x8_eligible(w);
    int repack8 = ctx->k->q8x8 && !q4x8_off && !ctx->keep_mapped && cpu_q8x8_eligible(w);
    int blocked = ctx->k->rowblock && !repack_envs[REPACK_ROWBLOCK].off && !ctx->keep_mapped &&
                  cpu_rowblock_eligible(w);
    if (!repack && !repack8 && !blocked && (ctx->keep_mapped || bytes < CPU_HUGE_BYTES)) {
        w->zero_int = zero_int;
        return 0;
    }
    uint8_t *p = cpu__owned_alloc(ctx, bytes);
    if (!p)
        return RIVER_ENOMEM;
    if (repack)
        cpu_q4x8_repack(w, p);
    else if (repack8)
        cpu_q8x8_repack(w, p);
    else if (blocked)
        cpu_rowblock_repack(w, p);
    else
        memcpy(p, w->data, bytes);
#ifdef MADV_PAGEOUT
    /* The source's pages leave this process (an old kernel: they stay resident). */
    cpu__advise(w->data, bytes, MADV_PAGEOUT);
#endif
    w->data = p;
    w->zero_int = zero_int;
    if (repack)
        w->dtype = DTYPE_Q4X8;
    else if (repack8)
        w->dtype = DTYPE_Q8X8;
    else if (blocked)
        w->dtype = w->dtype == DTYPE_BF16 ? DTYPE_BF16X8 : DTYPE_F16X8;
    return 0;
}

static int cpu__owns(const ops_ctx_t *ctx, const void *p)
{
    for (const struct cpu_owned *o = ctx->owned; o; o = o->next)
        if ((const char *)p >= (const char *)o->p && (const char *)p < (const char *)o->p + o->bytes)
            return 1;
    return 0;
}

/* Advice cannot lose data on a read-only file mapping: released pages come back from the
 * file when read. */
static int cpu_weight_residency(ops_ctx_t *ctx, const weight_t *w, int resident)
{
    if (!w->data)
        return 0;
    /* The backend's own copies are anonymous memory: advice to drop them would zero them. */
    if (cpu__owns(ctx, w->data))
        return river_err_set(RIVER_EUNSUPPORTED, "cpu: a %s weight of %lld x %lld is the "
                             "backend's copy (huge pages or repacked codes), which cannot be "
                             "released; open the backend with weights kept mapped",
                             dtype_name(w->dtype), (long long)w->rows, (long long)w->cols);
    int advice = resident ? MADV_WILLNEED : MADV_DONTNEED;
    cpu__advise(w->data, dtype_row_bytes(w->dtype, w->cols) * (size_t)w->rows, advice);
    /* A quantized weight's scales and zeros go with its codes (ops.h: they are mapped file
     * memory as the codes are, unless this backend copied them). */
    if (w->group > 0 && w->scales && w->zeros) {
        size_t gb = (size_t)w->rows * (size_t)(w->cols / w->group) * sizeof(uint16_t);
        if (!cpu__owns(ctx, w->scales))
            cpu__advise(w->scales, gb, advice);
        if (!cpu__owns(ctx, w->zeros))
            cpu__advise(w->zeros, gb, advice);
    }
    return 0;
}

static void *cpu__shared_mmap(int fd, size_t bytes)
{
    void *map = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) {
        river_err_set(RIVER_ESYS, "shared memory: mmap of %zu bytes: %s", bytes,
                      strerror(errno));
        return NULL;
    }
    return map;
}

static void *cpu_shared_alloc(ops_ctx_t *ctx, size_t bytes, shared_handle_t *h)
{
    (void)ctx;
    int fd;
    if (shm_create(bytes, &fd))
        return NULL;
    void *map = cpu__shared_mmap(fd, bytes);
    if (!map) {
        close(fd);
        return NULL;
    }
    memset(h, 0, sizeof *h);
    h->kind = SHARED_MEMFD;
    h->bytes = bytes;
    h->fd = fd;
    return map;
}

static void *cpu_shared_map(ops_ctx_t *ctx, const shared_handle_t *h)
{
    (void)ctx;
    if (h->kind != SHARED_MEMFD) {
        river_err_set(RIVER_EUNSUPPORTED, "cpu backend: cannot map shared memory of kind %d "
                      "(host memory only)", (int)h->kind);
        return NULL;
    }
    if (shm_check(h->fd, h->bytes))
        return NULL;
    return cpu__shared_mmap(h->fd, h->bytes);
}

static void cpu_shared_free(ops_ctx_t *ctx, void *buf, const shared_handle_t *h, int owner)
{
    (void)ctx;
    if (buf)
        munmap(buf, h->bytes);
    if (owner && h->fd >= 0)
        close(h->fd);
}

static void cpu_destroy(backend_t *be)
{
    cpu_backend_destroy(&be);
}

static const ops_t cpu_ops = {
    .name = "cpu",
    .info = cpu_info,
    .mem_free = cpu_mem_free,
    .weight_upload = cpu_weight_upload,
    .weight_residency = cpu_weight_residency,
    .shared_alloc = cpu_shared_alloc,
    .shared_map = cpu_shared_map,
    .shared_free = cpu_shared_free,
    .destroy = cpu_destroy,
    .buf_alloc = cpu_buf_alloc,
    .buf_free = cpu_buf_free,
    .to_host = cpu_to_host,
    .from_host = cpu_from_host,
    .embed = cpu_embed,
    .rmsnorm = cpu_rmsnorm,
    .matmul = cpu_matmul,
    .matmul_multi = cpu_matmul_multi,
    .add_bias = cpu_add_bias,
    .add = cpu_add,
    .rope = cpu_rope,
    .swiglu = cpu_swiglu,
    .kv_write = cpu_kv_write,
    .attention = cpu_attention,
    .cosine = cpu_cosine,
    .router_prob = cpu_router_prob,
    .gather_rows = cpu_gather_rows,
    .scatter_rows = cpu_scatter_rows,
    .sync = cpu_sync,
};

/* ---- the backend ------------------------------------------------------------------------ */

int cpu_backend_new(backend_t **out, int n_threads, cpu_simd_t simd)
{
    if (!out || n_threads < 0 || (unsigned)simd > CPU_SIMD_COUNT)
        return river_err_set(RIVER_EINVAL, "cpu backend: %d threads, level %d", n_threads,
                             (int)simd);
    if (n_threads == 0) {
        long online = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = online > 0 ? (int)online : 1;
    }
    int e;
    if (simd == CPU_SIMD_COUNT) {
        e = cpu_simd_selected(&simd);
        if (e)
            return e;
    }
    cpu_simd_t best = cpu_simd_detect();
    if (simd > best)
        simd = best;

    e = RIVER_ENOMEM;
    backend_t *b = calloc(1, sizeof *b);
    if (!b)
        goto fail;
    ops_ctx_t *ctx = calloc(1, sizeof *ctx);
    if (!ctx)
        goto fail_backend;
    ctx->k = cpu_kernels_get(simd);
    ctx->n_threads = n_threads;
    ctx->thread_scratch = calloc((size_t)n_threads, sizeof *ctx->thread_scratch);
    if (!ctx->thread_scratch)
        goto fail_ctx;
    e = threadpool_new(&ctx->pool, n_threads);
    if (e)
        goto fail_scratch;
    b->ops = &cpu_ops;
    b->ctx = ctx;
    *out = b;
    return 0;

fail_scratch:
    free(ctx->thread_scratch);
fail_ctx:
    free(ctx);
fail_backend:
    free(b);
fail:
    if (e == RIVER_ENOMEM)
        river_err_set(e, "cpu backend: out of memory");
    return e;
}

int cpu_backend_keep_mapped(backend_t *b)
{
    if (!b || b->ops != &cpu_ops)
        return river_err_set(RIVER_EINVAL, "cpu_backend_keep_mapped: not a CPU backend");
    b->ctx->keep_mapped = 1;
    return 0;
}

/* The device "cpu" (kernels/backend_driver.h): at the selected SIMD level, weights placed as
 * `weights` says. */
static int cpu_driver_open(backend_t **out, int index, int n_threads,
                           backend_weights_t weights)
{
    (void)index;
    int e = cpu_backend_new(out, n_threads, CPU_SIMD_COUNT);
    if (e)
        return e;
    if (weights == BACKEND_WEIGHTS_MAPPED)
        (void)cpu_backend_keep_mapped(*out); /* a CPU backend: cannot fail */
    return 0;
}

const backend_driver_t cpu_backend_driver = {.name = "cpu", .open = cpu_driver_open};

void cpu_backend_destroy(backend_t **bp)
{
    if (!bp || !*bp)
        return;
    backend_t *b = *bp;
    ops_ctx_t *ctx = b->ctx;
    threadpool_destroy(&ctx->pool);
    while (ctx->owned) {
        struct cpu_owned *o = ctx->owned;
        ctx->owned = o->next;
        munmap(o->p, o->bytes);
        free(o);
    }
    for (int t = 0; t < ctx->n_threads; t++)
        free(ctx->thread_scratch[t].s.p);
    free(ctx->thread_scratch);
    free(ctx->shared.p);
    free(ctx->shared2.p);
    free(ctx);
    free(b);
    *bp = NULL;
}

int cpu_backend_threads(const backend_t *b)
{
    return b->ctx->n_threads;
}

cpu_simd_t cpu_backend_simd(const backend_t *b)
{
    return b->ctx->k->level;
}

int cpu_backend_set_simd(backend_t *b, cpu_simd_t simd)
{
    if (!b || b->ops != &cpu_ops || (unsigned)simd >= CPU_SIMD_COUNT)
        return river_err_set(RIVER_EINVAL, "cpu backend: set simd level %d", (int)simd);
    if (simd > cpu_simd_detect())
        return river_err_set(RIVER_EUNSUPPORTED, "cpu backend: this processor has up to %s, "
                             "not %s", cpu_simd_name(cpu_simd_detect()), cpu_simd_name(simd));
    b->ctx->k = cpu_kernels_get(simd);
    return 0;
}
