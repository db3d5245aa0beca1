#include "engine/forward.h"

#include <math.h>
#include <stdlib.h>

#include "common/err.h"

struct forward {
    const model_t *m;
    backend_t *be;
    int max_rows;
    rope_t rope;
    /* Activation buffers in backend memory, each sized for max_rows rows. */
    void *x;    /* (max_rows, dim) residual stream */
    void *xb;   /* (max_rows, dim) normed input / projection output */
    void *q;    /* (max_rows, n_heads*head_dim) */
    void *k;    /* (max_rows, kv_dim) */
    void *v;    /* (max_rows, kv_dim) */
    void *att;  /* (max_rows, n_heads*head_dim) attention output */
    void *hb;   /* (max_rows, hidden_dim) gate, then silu(gate)*up */
    void *hb2;  /* (max_rows, hidden_dim) up */
    void *xl;   /* (max_rows, dim) normed rows that need logits */
    void *lg;   /* (max_rows, vocab) logits */
    float *host_hidden; /* (max_rows, dim) host copy for the layer hook */
    fwd_layer_hook_t hook;
    void *hook_user;
};

#define FWD_TRY(expr)          \
    do {                       \
        int fwd__e = (expr);   \
        if (fwd__e)            \
            return fwd__e;     \
    } while (0)

int forward_new(forward_t **out, const model_t *m, backend_t *be, int max_rows)
{
    const model_config_t *c = &m->cfg;
    if (max_rows <= 0)
        return river_err_set(RIVER_EINVAL, "forward: max_rows %d", max_rows);
    forward_t *f = calloc(1, sizeof *f);
    if (!f)
        return river_err_set(RIVER_ENOMEM, "forward: state");
    f->m = m;
    f->be = be;
    f->max_rows = max_rows;
    int e = rope_build(&f->rope, c);
    if (e)
        goto fail_rope;
    size_t r = (size_t)max_rows;
    size_t qd = (size_t)c->n_heads * (size_t)c->head_dim;
    size_t kvd = (size_t)c->n_kv_heads * (size_t)c->head_dim;
    struct {
        void **buf;
        size_t n;
    } bufs[] = {
        {&f->x, r * (size_t)c->dim},         {&f->xb, r * (size_t)c->dim},
        {&f->q, r * qd},                     {&f->k, r * kvd},
        {&f->v, r * kvd},                    {&f->att, r * qd},
        {&f->hb, r * (size_t)c->hidden_dim}, {&f->hb2, r * (size_t)c->hidden_dim},
        {&f->xl, r * (size_t)c->dim},        {&f->lg, r * (size_t)c->vocab_size},
    };
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
        *bufs[i].buf = be->ops->buf_alloc(be->ctx, bufs[i].n);
        if (!*bufs[i].buf) {
            e = river_err_set(RIVER_ENOMEM, "forward: %zu activations", bufs[i].n);
            goto fail_bufs;
        }
    }
    f->host_hidden = malloc(sizeof(float) * r * (size_t)c->dim);
    if (!f->host_hidden) {
        e = river_err_set(RIVER_ENOMEM, "forward: host hidden copy");
        goto fail_bufs;
    }
    *out = f;
    return 0;

fail_bufs:
    forward_destroy(&f);
    return e;
fail_rope:
    free(f);
    return e;
}

void forward_destroy(forward_t **fp)
{
    forward_t *f = *fp;
    if (!f)
        return;
    void *bufs[] = {f->x, f->xb, f->q, f->k, f->v, f->att, f->hb, f->hb2, f->xl, f->lg};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i])
            f->be->ops->buf_free(f->be->ctx, bufs[i]);
    free((void *)f->rope.inv_freq);
    free(f->host_hidden);
    free(f);
    *fp = NULL;
}

int forward_max_rows(const forward_t *f) { return f->max_rows; }
const rope_t *forward_rope(const forward_t *f) { return &f->rope; }

void forward_set_layer_hook(forward_t *f, fwd_layer_hook_t hook, void *user)
{
    f->hook = hook;
    f->hook_user = user;
}

/* One decoder layer over the batch: attention then SwiGLU FFN, each with a residual add. */
static int forward__layer(forward_t *f, const layer_weights_t *w, int l, const kv_view_t *kv,
                          const attn_batch_t *ab)
{
    const ops_t *o = f->be->ops;
    ops_ctx_t *ctx = f->be->ctx;
    const model_config_t *c = &f->m->cfg;
    int n = ab->n;
    int qd = c->n_heads * c->head_dim;
    int kvd = c->n_kv_heads * c->head_dim;

    FWD_TRY(o->rmsnorm(ctx, f->xb, f->x, &w->attn_norm, n, c->dim, c->norm_eps));
    FWD_TRY(o->matmul(ctx, f->q, f->xb, &w->wq, n));
    FWD_TRY(o->matmul(ctx, f->k, f->xb, &w->wk, n));
    FWD_TRY(o->matmul(ctx, f->v, f->xb, &w->wv, n));
    if (w->bq.data) {
        FWD_TRY(o->add_bias(ctx, f->q, &w->bq, n, qd));
        FWD_TRY(o->add_bias(ctx, f->k, &w->bk, n, kvd));
        FWD_TRY(o->add_bias(ctx, f->v, &w->bv, n, kvd));
    }
    if (w->q_norm.data) {
        /* Qwen3 normalises every head on its own before the rotation. */
        FWD_TRY(o->rmsnorm(ctx, f->q, f->q, &w->q_norm, n * c->n_heads, c->head_dim,
                           c->norm_eps));
        FWD_TRY(o->rmsnorm(ctx, f->k, f->k, &w->k_norm, n * c->n_kv_heads, c->head_dim,
                           c->norm_eps));
    }
    FWD_TRY(o->rope(ctx, f->q, ab->pos, n, c->n_heads, &f->rope));
    FWD_TRY(o->rope(ctx, f->k, ab->pos, n, c->n_kv_heads, &f->rope));
    FWD_TRY(o->kv_write(ctx, kv, l, ab, f->k, f->v));
    FWD_TRY(o->attention(ctx, f->att, f->q, kv, l, ab, c->n_heads, c->n_kv_heads,
                         c->head_dim, 1.0f / sqrtf((float)c->head_dim)));
    FWD_TRY(o->matmul(ctx, f->xb, f->att, &w->wo, n));
    FWD_TRY(o->add(ctx, f->x, f->xb, (size_t)n * (size_t)c->dim));

    FWD_TRY(o->rmsnorm(ctx, f->xb, f->x, &w->ffn_norm, n, c->dim, c->norm_eps));
    FWD_TRY(o->matmul(ctx, f->hb, f->xb, &w->w_gate, n));
    FWD_TRY(o->matmul(ctx, f->hb2, f->xb, &w->w_up, n));
    FWD_TRY(o->swiglu(ctx, f->hb, f->hb, f->hb2, n, c->hidden_dim, c->hidden_dim));
    FWD_TRY(o->matmul(ctx, f->xb, f->hb, &w->w_down, n));
    FWD_TRY(o->add(ctx, f->x, f->xb, (size_t)n * (size_t)c->dim));
    return 0;
}

int forward_step(forward_t *f, kv_pool_t *kv, const fwd_batch_t *b, float *logits)
{
    const ops_t *o = f->be->ops;
    ops_ctx_t *ctx = f->be->ctx;
    const model_t *m = f->m;
    const model_config_t *c = &m->cfg;
    if (b->n <= 0 || b->n > f->max_rows)
        return river_err_set(RIVER_EINVAL, "forward: batch of %d rows (max %d)", b->n,
                             f->max_rows);
    if (b->n_logits < 0 || b->n_logits > b->n)
        return river_err_set(RIVER_EINVAL, "forward: %d logit rows of %d", b->n_logits, b->n);
    const kv_view_t *view = kv_pool_view(kv);
    for (int i = 0; i < b->n; i++) {
        if (b->tokens[i] < 0 || b->tokens[i] >= c->vocab_size)
            return river_err_set(RIVER_ERANGE, "forward: token id %d outside vocab %d",
                                 b->tokens[i], c->vocab_size);
        if (b->pos[i] < 0 || b->pos[i] >= c->max_seq_len)
            return river_err_set(RIVER_ERANGE, "forward: position %d outside context %d",
                                 b->pos[i], c->max_seq_len);
    }
    for (int i = 0; i < b->n_logits; i++)
        if (b->logit_rows[i] < 0 || b->logit_rows[i] >= b->n)
            return river_err_set(RIVER_ERANGE, "forward: logit row %d of %d",
                                 b->logit_rows[i], b->n);

    attn_batch_t ab = {.n = b->n, .pos = b->pos, .page_table = b->page_table};
    FWD_TRY(o->embed(ctx, f->x, &m->embed, b->tokens, b->n));
    for (int l = 0; l < c->n_layers; l++) {
        FWD_TRY(forward__layer(f, &m->layers[l], l, view, &ab));
        if (f->hook) {
            FWD_TRY(o->to_host(ctx, f->host_hidden, f->x, 0, (size_t)b->n * (size_t)c->dim));
            f->hook(f->hook_user, l, f->host_hidden, b->n, c->dim);
        }
    }
    if (b->n_logits == 0)
        return o->sync(ctx);
    FWD_TRY(o->gather_rows(ctx, f->xl, f->x, b->logit_rows, b->n_logits, c->dim));
    FWD_TRY(o->rmsnorm(ctx, f->xl, f->xl, &m->final_norm, b->n_logits, c->dim, c->norm_eps));
    FWD_TRY(o->matmul(ctx, f->lg, f->xl, &m->lm_head, b->n_logits));
    return o->to_host(ctx, logits, f->lg, 0, (size_t)b->n_logits * (size_t)c->vocab_size);
}

int forward_layer_host(forward_t *f, kv_pool_t *kv, const fwd_batch_t *b, int layer,
                       const float *x_in, float *x_out)
{
    const ops_t *o = f->be->ops;
    const model_config_t *c = &f->m->cfg;
    if (b->n <= 0 || b->n > f->max_rows || layer < 0 || layer >= c->n_layers)
        return river_err_set(RIVER_EINVAL, "forward: layer %d with %d rows", layer, b->n);
    size_t n = (size_t)b->n * (size_t)c->dim;
    attn_batch_t ab = {.n = b->n, .pos = b->pos, .page_table = b->page_table};
    FWD_TRY(o->from_host(f->be->ctx, f->x, 0, x_in, n));
    FWD_TRY(forward__layer(f, &f->m->layers[layer], layer, kv_pool_view(kv), &ab));
    return o->to_host(f->be->ctx, x_out, f->x, 0, n);
}
