/* The profiling wrapper (kernels/profile.h): a backend whose ops time the same ops of the
 * backend beneath. */
#include "kernels/profile.h"

#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/err.h"

struct ops_ctx {
    backend_t inner; /* the wrapped backend, as it was before profile_attach */
    ops_t ops;       /* this wrapper's table, with the inner table's optional ops */
    profile_row_t rows[PROFILE_MAX_ROWS + 1]; /* the last one is "other" */
    int n_rows;
    int other;       /* calls went to the "other" row */
    double t0;       /* start of the window */
};

static const ops_t profile_ops;

static ops_ctx_t *prof__of(const backend_t *be)
{
    return be && be->ops && be->ops->destroy == profile_ops.destroy ? be->ctx : NULL;
}

static double prof__weight_bytes(const weight_t *w)
{
    double b = (double)dtype_row_bytes(w->dtype, w->cols) * (double)w->rows;
    if (dtype_is_quant(w->dtype) && w->group > 0)
        b += 2.0 * (double)w->rows * (double)(w->cols / w->group) * sizeof(uint16_t);
    return b;
}

/* Bytes of the K and V values of `positions` positions of a pool (Q8 scales included). */
static double prof__kv_bytes(const kv_view_t *kv, int64_t positions)
{
    int64_t n = positions * kv->kv_dim;
    return 2.0 * (double)(kv_dtype_bytes(kv->dtype, n) + kv_dtype_scale_bytes(kv->dtype, n));
}

/* Adds one call of op (reading data of type dt_w, shape rows x cols, n rows, `bytes` bytes)
 * that started at t to its group. */
static void prof__add_row(ops_ctx_t *p, const char *op, dtype_t dt_w, int64_t rows,
                          int64_t cols, int n, double bytes, double t)
{
    double dt = clock_now_s() - t;
    profile_row_t *r = NULL;
    for (int i = 0; i < p->n_rows && !r; i++) {
        profile_row_t *c = &p->rows[i];
        if (c->op == op && c->dtype == dt_w && c->rows == rows && c->cols == cols && c->n == n)
            r = c;
    }
    if (!r && p->n_rows < PROFILE_MAX_ROWS) {
        r = &p->rows[p->n_rows++];
        *r = (profile_row_t){.op = op, .dtype = dt_w, .rows = rows, .cols = cols, .n = n};
    }
    if (!r) {
        r = &p->rows[PROFILE_MAX_ROWS];
        if (!p->other)
            *r = (profile_row_t){.op = "other", .dtype = DTYPE_COUNT};
        p->other = 1;
    }
    r->calls++;
    r->seconds += dt;
    r->bytes += bytes;
}

/* Adds one call of op (weight w or NULL, n rows) that started at t to its group. */
static void prof__add(ops_ctx_t *p, const char *op, const weight_t *w, int n, double t)
{
    double bytes = w && strcmp(op, "matmul") == 0 ? prof__weight_bytes(w) : 0;
    prof__add_row(p, op, w ? w->dtype : DTYPE_COUNT, w ? w->rows : 0, w ? w->cols : 0, n,
                  bytes, t);
}

#define IN (ctx->inner.ops)
#define INCTX (ctx->inner.ctx)

/* Runs CALL on the inner backend, syncs it, and files the call under (op, w, n). */
#define PROF_TIMED(op, w, n, CALL)                                                           \
    do {                                                                                    \
        double t_ = clock_now_s();                                                          \
        int e_ = (CALL);                                                                    \
        if (!e_)                                                                            \
            e_ = IN->sync(INCTX);                                                           \
        prof__add(ctx, (op), (w), (n), t_);                                                 \
        return e_;                                                                          \
    } while (0)

/* ---- timed ops ------------------------------------------------------------------------- */

static int prof_to_host(ops_ctx_t *ctx, float *dst, const void *src, size_t offset, size_t n)
{
    PROF_TIMED("to_host", NULL, (int)n, IN->to_host(INCTX, dst, src, offset, n));
}

static int prof_from_host(ops_ctx_t *ctx, void *dst, size_t offset, const float *src, size_t n)
{
    PROF_TIMED("from_host", NULL, (int)n, IN->from_host(INCTX, dst, offset, src, n));
}

static int prof_embed(ops_ctx_t *ctx, void *out, const weight_t *table, const int32_t *tokens,
                      int n)
{
    PROF_TIMED("embed", NULL, n, IN->embed(INCTX, out, table, tokens, n));
}

static int prof_rmsnorm(ops_ctx_t *ctx, void *out, const void *x, const weight_t *w, int n,
                        int d, float eps)
{
    PROF_TIMED("rmsnorm", NULL, n, IN->rmsnorm(INCTX, out, x, w, n, d, eps));
}

static int prof_matmul(ops_ctx_t *ctx, void *y, const void *x, const weight_t *w, int n)
{
    PROF_TIMED("matmul", w, n, IN->matmul(INCTX, y, x, w, n));
}

/* Filed as one matmul of all the weights' rows (3072 x 2048 for q, k and v of Llama 3.2
 * 1B), which it is to the memory. Where the inner backend has no matmul_multi, the weights
 * are timed one by one, as ops_matmuls runs them. */
static int prof_matmul_multi(ops_ctx_t *ctx, void *const *y, const void *x,
                             const weight_t *const *w, int count, int n)
{
    if (!IN->matmul_multi) {
        for (int i = 0; i < count; i++) {
            int e = prof_matmul(ctx, y[i], x, w[i], n);
            if (e)
                return e;
        }
        return 0;
    }
    double t = clock_now_s();
    int e = IN->matmul_multi(INCTX, y, x, w, count, n);
    if (!e)
        e = IN->sync(INCTX);
    int64_t rows = 0;
    double bytes = 0;
    for (int i = 0; i < count; i++) {
        rows += w[i]->rows;
        bytes += prof__weight_bytes(w[i]);
    }
    prof__add_row(ctx, "matmul", w[0]->dtype, rows, w[0]->cols, n, bytes, t);
    return e;
}

static int prof_add_bias(ops_ctx_t *ctx, void *y, const weight_t *b, int n, int d)
{
    PROF_TIMED("add_bias", NULL, n, IN->add_bias(INCTX, y, b, n, d));
}

static int prof_add(ops_ctx_t *ctx, void *y, const void *x, size_t n_elems)
{
    PROF_TIMED("add", NULL, (int)n_elems, IN->add(INCTX, y, x, n_elems));
}

static int prof_rope(ops_ctx_t *ctx, void *x, const int32_t *pos, int n, int n_heads,
                     const rope_t *rope)
{
    PROF_TIMED("rope", NULL, n, IN->rope(INCTX, x, pos, n, n_heads, rope));
}

static int prof_swiglu(ops_ctx_t *ctx, void *out, const void *gate, const void *up, int n,
                       int d, int stride)
{
    PROF_TIMED("swiglu", NULL, n, IN->swiglu(INCTX, out, gate, up, n, d, stride));
}

/* The same for the KV ops, filed under the pool's element type with `bytes` KV bytes. */
#define PROF_TIMED_KV(op, kv, n, bytes, CALL)                                                \
    do {                                                                                    \
        double t_ = clock_now_s();                                                          \
        int e_ = (CALL);                                                                    \
        if (!e_)                                                                            \
            e_ = IN->sync(INCTX);                                                           \
        prof__add_row(ctx, (op), (kv)->dtype, 0, 0, (n), (bytes), t_);                      \
        return e_;                                                                          \
    } while (0)

/* kv_write's bytes are the rows it writes. */
static int prof_kv_write(ops_ctx_t *ctx, const kv_view_t *kv, int layer, const attn_batch_t *b,
                         const void *k, const void *v)
{
    if (!kv || !b)
        return IN->kv_write(INCTX, kv, layer, b, k, v);
    PROF_TIMED_KV("kv_write", kv, b->n, prof__kv_bytes(kv, b->n),
                  IN->kv_write(INCTX, kv, layer, b, k, v));
}

/* attention's bytes are every row's context, K and V (a decode step's reads; the rows of a
 * prefill tile share theirs, so there it is a bound). */
static int prof_attention(ops_ctx_t *ctx, void *out, const void *q, const kv_view_t *kv,
                          int layer, const attn_batch_t *b, int n_heads, int n_kv_heads,
                          int head_dim, float scale)
{
    if (!kv || !b || (b->n > 0 && !b->pos))
        return IN->attention(INCTX, out, q, kv, layer, b, n_heads, n_kv_heads, head_dim,
                             scale);
    int64_t positions = 0;
    for (int i = 0; i < b->n; i++)
        positions += b->pos[i] >= 0 ? (int64_t)b->pos[i] + 1 : 0;
    PROF_TIMED_KV("attention", kv, b->n, prof__kv_bytes(kv, positions),
                  IN->attention(INCTX, out, q, kv, layer, b, n_heads, n_kv_heads, head_dim,
                                scale));
}

static int prof_cosine(ops_ctx_t *ctx, float *out, const void *a, const void *b, int n, int d)
{
    PROF_TIMED("cosine", NULL, n, IN->cosine(INCTX, out, a, b, n, d));
}

static int prof_router_prob(ops_ctx_t *ctx, float *out, const void *x,
                            const router_weights_t *w, const int32_t *rows, int n)
{
    PROF_TIMED("router_prob", NULL, n, IN->router_prob(INCTX, out, x, w, rows, n));
}

static int prof_gather_rows(ops_ctx_t *ctx, void *dst, const void *src, const int32_t *idx,
                            int n, int d)
{
    PROF_TIMED("gather_rows", NULL, n, IN->gather_rows(INCTX, dst, src, idx, n, d));
}

static int prof_scatter_rows(ops_ctx_t *ctx, void *dst, const void *src, const int32_t *idx,
                             int n, int d)
{
    PROF_TIMED("scatter_rows", NULL, n, IN->scatter_rows(INCTX, dst, src, idx, n, d));
}

/* ---- passed through -------------------------------------------------------------------- */

static void prof_info(ops_ctx_t *ctx, backend_info_t *out)
{
    IN->info(INCTX, out);
}

static int64_t prof_mem_free(ops_ctx_t *ctx)
{
    return IN->mem_free ? IN->mem_free(INCTX) : 0;
}

static int prof_weight_upload(ops_ctx_t *ctx, weight_t *w)
{
    return IN->weight_upload(INCTX, w);
}

static int prof_weight_residency(ops_ctx_t *ctx, const weight_t *w, int resident)
{
    return IN->weight_residency(INCTX, w, resident);
}

static void *prof_shared_alloc(ops_ctx_t *ctx, size_t bytes, shared_handle_t *h)
{
    return IN->shared_alloc(INCTX, bytes, h);
}

static void *prof_shared_map(ops_ctx_t *ctx, const shared_handle_t *h)
{
    return IN->shared_map(INCTX, h);
}

static void prof_shared_free(ops_ctx_t *ctx, void *buf, const shared_handle_t *h, int owner)
{
    IN->shared_free(INCTX, buf, h, owner);
}

static void *prof_buf_alloc(ops_ctx_t *ctx, size_t n_elems)
{
    return IN->buf_alloc(INCTX, n_elems);
}

static void prof_buf_free(ops_ctx_t *ctx, void *buf)
{
    IN->buf_free(INCTX, buf);
}

static int prof_sync(ops_ctx_t *ctx)
{
    return IN->sync(INCTX);
}

static int prof_peer_id(ops_ctx_t *ctx, unsigned char id[OPS_PEER_ID_BYTES])
{
    return IN->peer_id(INCTX, id);
}

static int prof_peer_open(ops_ctx_t *ctx, ops_peer_t **out,
                          const unsigned char id[OPS_PEER_ID_BYTES], int rank)
{
    return IN->peer_open(INCTX, out, id, rank);
}

static void prof_peer_close(ops_ctx_t *ctx, ops_peer_t *peer)
{
    IN->peer_close(INCTX, peer);
}

static int prof_peer_send(ops_ctx_t *ctx, ops_peer_t *peer, const void *buf, size_t n)
{
    return IN->peer_send(INCTX, peer, buf, n);
}

static int prof_peer_recv(ops_ctx_t *ctx, ops_peer_t *peer, void *buf, size_t n)
{
    return IN->peer_recv(INCTX, peer, buf, n);
}

static void prof_destroy(backend_t *be)
{
    ops_ctx_t *ctx = be->ctx;
    *be = ctx->inner;
    free(ctx);
    be->ops->destroy(be);
}

#undef IN
#undef INCTX

static const ops_t profile_ops = {
    .info = prof_info,
    .mem_free = prof_mem_free,
    .weight_upload = prof_weight_upload,
    .weight_residency = prof_weight_residency,
    .shared_alloc = prof_shared_alloc,
    .shared_map = prof_shared_map,
    .shared_free = prof_shared_free,
    .destroy = prof_destroy,
    .buf_alloc = prof_buf_alloc,
    .buf_free = prof_buf_free,
    .to_host = prof_to_host,
    .from_host = prof_from_host,
    .embed = prof_embed,
    .rmsnorm = prof_rmsnorm,
    .matmul = prof_matmul,
    .matmul_multi = prof_matmul_multi,
    .add_bias = prof_add_bias,
    .add = prof_add,
    .rope = prof_rope,
    .swiglu = prof_swiglu,
    .kv_write = prof_kv_write,
    .attention = prof_attention,
    .cosine = prof_cosine,
    .router_prob = prof_router_prob,
    .gather_rows = prof_gather_rows,
    .scatter_rows = prof_scatter_rows,
    .sync = prof_sync,
    .peer_id = prof_peer_id,
    .peer_open = prof_peer_open,
    .peer_close = prof_peer_close,
    .peer_send = prof_peer_send,
    .peer_recv = prof_peer_recv,
};

int profile_attach(backend_t *be)
{
    if (!be || !be->ops)
        return river_err_set(RIVER_EINVAL, "profile: no backend");
    if (prof__of(be))
        return river_err_set(RIVER_EINVAL, "profile: the backend is profiled already");
    ops_ctx_t *p = calloc(1, sizeof *p);
    if (!p)
        return river_err_set(RIVER_ENOMEM, "profile: state");
    p->inner = *be;
    p->ops = profile_ops;
    p->ops.name = be->ops->name;
    /* The optional ops stay absent where the backend beneath has none, so that callers
     * that test for them see the same backend; op recording stays off (profile.h). */
    const ops_t *in = be->ops;
    if (!in->weight_residency)
        p->ops.weight_residency = NULL;
    if (!in->shared_alloc)
        p->ops.shared_alloc = NULL;
    if (!in->shared_map)
        p->ops.shared_map = NULL;
    if (!in->shared_free)
        p->ops.shared_free = NULL;
    if (!in->router_prob)
        p->ops.router_prob = NULL;
    if (!in->peer_id) {
        p->ops.peer_id = NULL;
        p->ops.peer_open = NULL;
        p->ops.peer_close = NULL;
        p->ops.peer_send = NULL;
        p->ops.peer_recv = NULL;
    }
    p->t0 = clock_now_s();
    be->ops = &p->ops;
    be->ctx = p;
    return 0;
}

void profile_detach(backend_t *be)
{
    ops_ctx_t *p = prof__of(be);
    if (!p)
        return;
    *be = p->inner;
    free(p);
}

int profile_reset(backend_t *be)
{
    ops_ctx_t *p = prof__of(be);
    if (!p)
        return river_err_set(RIVER_EINVAL, "profile: the backend is not profiled");
    p->n_rows = 0;
    p->other = 0;
    p->t0 = clock_now_s();
    return 0;
}

int profile_read(const backend_t *be, const profile_row_t **rows, int *n_rows,
                 double *window_s)
{
    ops_ctx_t *p = prof__of(be);
    if (!p)
        return river_err_set(RIVER_EINVAL, "profile: the backend is not profiled");
    *rows = p->rows;
    *n_rows = p->n_rows + p->other; /* "other" follows the full table */
    *window_s = clock_now_s() - p->t0;
    return 0;
}
