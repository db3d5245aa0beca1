#include "engine/forward.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "common/err.h"
#include "engine/offload.h"

/* Where a row stands during one forward step. */
typedef enum {
    ROW_BACKBONE = 0, /* still on the backbone */
    ROW_RIVER,        /* exited, continues on the river */
    ROW_STOPPED,      /* exited, computes nothing more (mask, mono, recompute) */
    ROW_PROPAGATE,    /* exited, only writes K/V of the remaining layers */
    ROW_POSTHOC,      /* exit recorded, keeps running on the backbone */
} row_state_t;

struct forward {
    const model_t *m;
    backend_t *be;
    int max_rows;
    rope_t rope;
    /* Activation buffers in backend memory, each sized for max_rows rows. */
    void *x;     /* (max_rows, dim) residual stream */
    void *xs;    /* (max_rows, dim) compacted rows of one group */
    void *xprev; /* (max_rows, dim) residual stream before the layer (similarity rule) */
    void *hexit; /* (max_rows, dim) residual stream at the exit layer (post-hoc) */
    void *xb;    /* (max_rows, dim) normed input / projection output */
    void *q;     /* (max_rows, n_heads*head_dim) */
    void *k;     /* (max_rows, kv_dim) */
    void *v;     /* (max_rows, kv_dim) */
    void *att;   /* (max_rows, n_heads*head_dim) attention output */
    void *hb;    /* (max_rows, hidden_dim) gate, then silu(gate)*up */
    void *hb2;   /* (max_rows, hidden_dim) up */
    void *xl;    /* (max_rows, dim) normed rows that need logits */
    void *lg;    /* (max_rows, vocab) logits */
    float *host_hidden; /* (max_rows, dim) host copy for hooks and routers */
    fwd_layer_hook_t hook;
    void *hook_user;

    int has_exit;
    exit_config_t ex;
    int has_remote;       /* backbone layers >= remote.boundary run elsewhere */
    fwd_remote_t remote;
    /* Per-row bookkeeping of one step, (max_rows) each; rows of an extended batch are the
     * caller's rows followed by the recompute baseline's pending rows. */
    uint8_t *state;
    int32_t *depth, *start, *driver, *group, *pos, *tokens, *idx, *idx2, *sub_pos, *iota,
        *reached;
    const int32_t **tables, **sub_tables;
    const uint8_t **valid, **sub_valid;
    exit_seq_t **seq;
    uint8_t *pass;
    float *cos;
    exit_row_t *rx;     /* (max_rows) this step's per-row thresholds */
    fwd_stats_t stats;
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
    if (e) {
        free(f);
        return e;
    }
    size_t r = (size_t)max_rows;
    size_t qd = (size_t)c->n_heads * (size_t)c->head_dim;
    size_t kvd = (size_t)c->n_kv_heads * (size_t)c->head_dim;
    struct {
        void **buf;
        size_t n;
    } bufs[] = {
        {&f->x, r * (size_t)c->dim},         {&f->xs, r * (size_t)c->dim},
        {&f->xprev, r * (size_t)c->dim},     {&f->hexit, r * (size_t)c->dim},
        {&f->xb, r * (size_t)c->dim},        {&f->q, r * qd},
        {&f->k, r * kvd},                    {&f->v, r * kvd},
        {&f->att, r * qd},                   {&f->hb, r * (size_t)c->hidden_dim},
        {&f->hb2, r * (size_t)c->hidden_dim}, {&f->xl, r * (size_t)c->dim},
        {&f->lg, r * (size_t)c->vocab_size},
    };
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
        *bufs[i].buf = be->ops->buf_alloc(be->ctx, bufs[i].n);
        if (!*bufs[i].buf) {
            e = river_err_set(RIVER_ENOMEM, "forward: %zu activations", bufs[i].n);
            goto fail;
        }
    }
    f->host_hidden = malloc(sizeof(float) * r * (size_t)c->dim);
    f->state = malloc(r);
    f->pass = malloc(r);
    f->cos = malloc(sizeof(float) * r);
    f->rx = malloc(sizeof *f->rx * r);
    int32_t **ints[] = {&f->depth, &f->start, &f->driver, &f->group, &f->pos, &f->tokens,
                        &f->idx, &f->idx2, &f->sub_pos, &f->iota, &f->reached};
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
        *ints[i] = malloc(sizeof(int32_t) * r);
    f->tables = malloc(sizeof *f->tables * r);
    f->sub_tables = malloc(sizeof *f->sub_tables * r);
    f->valid = malloc(sizeof *f->valid * r);
    f->sub_valid = malloc(sizeof *f->sub_valid * r);
    f->seq = malloc(sizeof *f->seq * r);
    int ok = f->host_hidden && f->state && f->pass && f->cos && f->rx && f->tables && f->sub_tables &&
             f->valid && f->sub_valid && f->seq;
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
        ok = ok && *ints[i];
    if (!ok) {
        e = river_err_set(RIVER_ENOMEM, "forward: bookkeeping for %d rows", max_rows);
        goto fail;
    }
    for (int i = 0; i < max_rows; i++)
        f->iota[i] = i;
    *out = f;
    return 0;

fail:
    forward_destroy(&f);
    return e;
}

void forward_destroy(forward_t **fp)
{
    forward_t *f = *fp;
    if (!f)
        return;
    void *bufs[] = {f->x,  f->xs,  f->xprev, f->hexit, f->xb,  f->q, f->k,
                    f->v,  f->att, f->hb,    f->hb2,   f->xl,  f->lg};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i])
            f->be->ops->buf_free(f->be->ctx, bufs[i]);
    free((void *)f->rope.inv_freq);
    free(f->host_hidden);
    free(f->state);
    free(f->pass);
    free(f->cos);
    free(f->rx);
    int32_t *ints[] = {f->depth, f->start, f->driver, f->group, f->pos,  f->tokens,
                       f->idx,   f->idx2,  f->sub_pos, f->iota, f->reached};
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++)
        free(ints[i]);
    free(f->tables);
    free(f->sub_tables);
    free(f->valid);
    free(f->sub_valid);
    free(f->seq);
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

void forward_get_stats(const forward_t *f, fwd_stats_t *st) { *st = f->stats; }
void forward_reset_stats(forward_t *f) { memset(&f->stats, 0, sizeof f->stats); }

int forward_set_exit(forward_t *f, const exit_config_t *cfg)
{
    if (!cfg || cfg->policy.rule == EXIT_RULE_NONE) {
        f->has_exit = 0;
        if (cfg)
            f->ex = *cfg;
        return 0;
    }
    const exit_policy_t *p = &cfg->policy;
    int L = f->m->cfg.n_layers;
    if (p->kv == EXIT_KV_RIVER && !cfg->river)
        return river_err_set(RIVER_EINVAL, "exit: the river strategy needs a river file");
    if (p->rule == EXIT_RULE_ROUTER && !cfg->router.prob)
        return river_err_set(RIVER_EINVAL, "exit: the router rule needs routers");
    if (p->rule == EXIT_RULE_FIXED && (p->exit_layer < 1 || p->exit_layer > L))
        return river_err_set(RIVER_EINVAL, "exit: fixed exit layer %d outside 1..%d",
                             p->exit_layer, L);
    if (cfg->river && (cfg->river_start < 1 || cfg->river_start > L))
        return river_err_set(RIVER_EINVAL, "exit: river start %d outside 1..%d",
                             cfg->river_start, L);
    if (p->kv < 0 || p->kv >= EXIT_KV_COUNT)
        return river_err_set(RIVER_EINVAL, "exit: unknown KV strategy %d", p->kv);
    f->ex = *cfg;
    f->has_exit = 1;
    return 0;
}

int forward_set_remote(forward_t *f, const fwd_remote_t *r)
{
    if (!r) {
        f->has_remote = 0;
        return 0;
    }
    if (!r->run && !r->run_dev)
        return river_err_set(RIVER_EINVAL, "forward: remote without a run function");
    if (r->boundary < 0 || r->boundary > f->m->cfg.n_layers)
        return river_err_set(RIVER_EINVAL, "forward: remote boundary %d outside 0..%d",
                             r->boundary, f->m->cfg.n_layers);
    f->remote = *r;
    f->has_remote = 1;
    return 0;
}

/* One decoder layer over n rows of residual stream x: attention then SwiGLU FFN, each with
 * a residual add. Its K/V go to the (layer, position) slots of the rows. */
static int forward__layer(forward_t *f, const layer_weights_t *w, int l, void *x,
                          const kv_view_t *kv, const attn_batch_t *ab)
{
    const ops_t *o = f->be->ops;
    ops_ctx_t *ctx = f->be->ctx;
    const model_config_t *c = &f->m->cfg;
    int n = ab->n;
    int qd = c->n_heads * c->head_dim;
    int kvd = c->n_kv_heads * c->head_dim;

    FWD_TRY(o->rmsnorm(ctx, f->xb, x, &w->attn_norm, n, c->dim, c->norm_eps));
    void *qkv[] = {f->q, f->k, f->v};
    const weight_t *wqkv[] = {&w->wq, &w->wk, &w->wv};
    FWD_TRY(ops_matmuls(o, ctx, qkv, f->xb, wqkv, 3, n));
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
    double ta = clock_now_s();
    FWD_TRY(o->attention(ctx, f->att, f->q, kv, l, ab, c->n_heads, c->n_kv_heads,
                         c->head_dim, 1.0f / sqrtf((float)c->head_dim)));
    f->stats.attn_s += clock_now_s() - ta;
    FWD_TRY(o->matmul(ctx, f->xb, f->att, &w->wo, n));
    FWD_TRY(o->add(ctx, x, f->xb, (size_t)n * (size_t)c->dim));

    FWD_TRY(o->rmsnorm(ctx, f->xb, x, &w->ffn_norm, n, c->dim, c->norm_eps));
    void *gate_up[] = {f->hb, f->hb2};
    const weight_t *wgate_up[] = {&w->w_gate, &w->w_up};
    FWD_TRY(ops_matmuls(o, ctx, gate_up, f->xb, wgate_up, 2, n));
    FWD_TRY(o->swiglu(ctx, f->hb, f->hb, f->hb2, n, c->hidden_dim, c->hidden_dim));
    FWD_TRY(o->matmul(ctx, f->xb, f->hb, &w->w_down, n));
    FWD_TRY(o->add(ctx, x, f->xb, (size_t)n * (size_t)c->dim));
    return 0;
}

/* State propagation: layer l's K/V computed from the frozen exit hidden state x, without
 * attention or FFN. */
static int forward__kv_only(forward_t *f, const layer_weights_t *w, int l, void *x,
                            const kv_view_t *kv, const attn_batch_t *ab)
{
    const ops_t *o = f->be->ops;
    ops_ctx_t *ctx = f->be->ctx;
    const model_config_t *c = &f->m->cfg;
    int n = ab->n;
    FWD_TRY(o->rmsnorm(ctx, f->xb, x, &w->attn_norm, n, c->dim, c->norm_eps));
    void *kv_y[] = {f->k, f->v};
    const weight_t *wkv[] = {&w->wk, &w->wv};
    FWD_TRY(ops_matmuls(o, ctx, kv_y, f->xb, wkv, 2, n));
    if (w->bk.data) {
        FWD_TRY(o->add_bias(ctx, f->k, &w->bk, n, c->n_kv_heads * c->head_dim));
        FWD_TRY(o->add_bias(ctx, f->v, &w->bv, n, c->n_kv_heads * c->head_dim));
    }
    if (w->k_norm.data)
        FWD_TRY(o->rmsnorm(ctx, f->k, f->k, &w->k_norm, n * c->n_kv_heads, c->head_dim,
                           c->norm_eps));
    FWD_TRY(o->rope(ctx, f->k, ab->pos, n, c->n_kv_heads, &f->rope));
    return o->kv_write(ctx, kv, l, ab, f->k, f->v);
}

/* Runs one group of rows (idx, m of them, out of n in x) through layer l with weights w:
 * in place when the group is the whole batch in order, else compacted into xs and
 * scattered back. kv_only selects state propagation instead of the full layer. */
static int forward__group(forward_t *f, const layer_weights_t *w, int l, const int32_t *idx,
                          int m, int n, int kv_only, const kv_view_t *kv, int stride)
{
    const ops_t *o = f->be->ops;
    ops_ctx_t *ctx = f->be->ctx;
    int dim = f->m->cfg.dim;
    int whole = m == n;
    for (int i = 0; whole && i < m; i++)
        whole = idx[i] == i;
    for (int i = 0; i < m; i++) {
        f->sub_pos[i] = f->pos[idx[i]];
        f->sub_tables[i] = f->tables[idx[i]];
        f->sub_valid[i] = f->valid[idx[i]];
    }
    attn_batch_t ab = {.n = m, .pos = f->sub_pos, .page_table = f->sub_tables,
                       .kv_valid = f->ex.policy.kv == EXIT_KV_MASK && f->has_exit
                                       ? f->sub_valid : NULL,
                       .kv_valid_stride = stride};
    void *x = f->x;
    if (!whole) {
        FWD_TRY(o->gather_rows(ctx, f->xs, f->x, idx, m, dim));
        x = f->xs;
    }
    FWD_TRY(kv_only ? forward__kv_only(f, w, l, x, kv, &ab) : forward__layer(f, w, l, x, kv, &ab));
    if (!whole && !kv_only)
        FWD_TRY(o->scatter_rows(ctx, f->x, f->xs, idx, m, dim));
    return 0;
}

/* The rows idx[0..m) of the extended batch (n rows) run backbone layer l on the remote:
 * gathered (unless they are the whole batch in order), copied to the host, run, copied
 * back and scattered. Copies and gathers move floats unchanged, so the rows get exactly
 * what the remote's kernels computed. */
static int forward__remote_group(forward_t *f, int l, const int32_t *idx, int m, int n)
{
    const ops_t *o = f->be->ops;
    ops_ctx_t *ctx = f->be->ctx;
    int dim = f->m->cfg.dim;
    int whole = m == n;
    for (int i = 0; whole && i < m; i++)
        whole = idx[i] == i;
    for (int i = 0; i < m; i++) {
        f->sub_pos[i] = f->pos[idx[i]];
        f->sub_tables[i] = f->tables[idx[i]];
    }
    size_t len = (size_t)m * (size_t)dim;
    void *x = f->x;
    if (!whole) {
        FWD_TRY(o->gather_rows(ctx, f->xs, f->x, idx, m, dim));
        x = f->xs;
    }
    if (f->remote.run_dev) {
        /* The rows stay in the backend's memory: the remote moves them device to device. */
        FWD_TRY(f->remote.run_dev(f->remote.user, l, m, f->sub_pos,
                                  (const int32_t *const *)f->sub_tables, x));
        if (!whole)
            FWD_TRY(o->scatter_rows(ctx, f->x, f->xs, idx, m, dim));
        return 0;
    }
    FWD_TRY(o->to_host(ctx, f->host_hidden, x, 0, len));
    FWD_TRY(f->remote.run(f->remote.user, l, m, f->sub_pos,
                          (const int32_t *const *)f->sub_tables, f->host_hidden));
    FWD_TRY(o->from_host(ctx, x, 0, f->host_hidden, len));
    if (!whole)
        FWD_TRY(o->scatter_rows(ctx, f->x, f->xs, idx, m, dim));
    return 0;
}

/* Grows a sequence's mask map to hold position `pos` (masking baseline). */
static int forward__valid_reserve(exit_seq_t *s, int n_layers, int pos)
{
    if (pos < s->cap_pos)
        return 0;
    int cap = s->cap_pos ? s->cap_pos : 64;
    while (cap <= pos)
        cap *= 2;
    uint8_t *v = calloc((size_t)n_layers * (size_t)cap, 1);
    if (!v)
        return river_err_set(RIVER_ENOMEM, "exit: mask map of %d positions", cap);
    for (int l = 0; l < n_layers && s->kv_valid; l++)
        memcpy(v + (size_t)l * (size_t)cap, s->kv_valid + (size_t)l * (size_t)s->cap_pos,
               (size_t)s->cap_pos);
    free(s->kv_valid);
    s->kv_valid = v;
    s->cap_pos = cap;
    return 0;
}

/* The masking baseline's maps all share one stride per step: the largest capacity. */
static int forward__valid_stride(forward_t *f, int n)
{
    int stride = 0;
    for (int r = 0; r < n; r++)
        if (f->seq[r] && f->seq[r]->cap_pos > stride)
            stride = f->seq[r]->cap_pos;
    return stride;
}

static int forward__valid_prepare(forward_t *f, int n, int L)
{
    for (int r = 0; r < n; r++) {
        if (!f->seq[r])
            return river_err_set(RIVER_EINVAL, "exit: the mask strategy needs per-sequence "
                                 "state for every row");
        FWD_TRY(forward__valid_reserve(f->seq[r], L, f->pos[r]));
    }
    /* Every map of the step must have the same stride; grow the smaller ones. */
    int stride = forward__valid_stride(f, n);
    for (int r = 0; r < n; r++)
        FWD_TRY(forward__valid_reserve(f->seq[r], L, stride - 1));
    for (int r = 0; r < n; r++)
        f->valid[r] = f->seq[r]->kv_valid;
    return 0;
}

/* Adds the recompute baseline's pending rows behind the caller's rows: positions of the
 * same sequences whose deeper layers were skipped, restarting at their exit layer. */
static int forward__add_pending(forward_t *f, int n, int *n_ext)
{
    const ops_t *o = f->be->ops;
    int dim = f->m->cfg.dim;
    int total = n;
    for (int r = 0; r < n; r++) {
        exit_seq_t *s = f->seq[r];
        if (!s || !s->n_pending)
            continue;
        int dup = 0; /* a sequence's pending rows join once, driven by its last row */
        for (int q = r + 1; q < n && !dup; q++)
            dup = f->seq[q] == s;
        if (dup)
            continue;
        if (total + s->n_pending > f->max_rows)
            return river_err_set(RIVER_EFULL, "exit: %d pending rows do not fit a batch of %d",
                                 s->n_pending, f->max_rows);
        for (int i = 0; i < s->n_pending; i++, total++) {
            f->pos[total] = s->pending_pos[i];
            f->tokens[total] = 0;
            f->tables[total] = f->tables[r];
            f->valid[total] = NULL;
            f->seq[total] = NULL;
            f->start[total] = s->pending_layer[i];
            f->driver[total] = r;
            f->group[total] = -1;
            f->state[total] = ROW_BACKBONE;
            f->depth[total] = f->m->cfg.n_layers;
            FWD_TRY(o->from_host(f->be->ctx, f->x, (size_t)total * (size_t)dim,
                                 s->pending_h + (size_t)i * (size_t)dim, (size_t)dim));
        }
    }
    *n_ext = total;
    return 0;
}

/* After the step: pending rows that reached the last layer are done; the others, and a
 * driver row that stopped early, wait for the next deep token at the layer they reached. */
static int forward__update_pending(forward_t *f, int n, int n_ext, const int32_t *reached)
{
    int dim = f->m->cfg.dim;
    int L = f->m->cfg.n_layers;
    for (int r = 0; r < n; r++) {
        exit_seq_t *s = f->seq[r];
        if (!s)
            continue;
        int dup = 0;
        for (int q = r + 1; q < n && !dup; q++)
            dup = f->seq[q] == s;
        if (!dup)
            s->n_pending = 0;
    }
    for (int r = 0; r < n_ext; r++) {
        int drv = r < n ? r : f->driver[r];
        exit_seq_t *s = f->seq[drv];
        if (!s || reached[r] >= L)
            continue;
        if (s->n_pending == s->cap_pending) {
            int cap = s->cap_pending ? s->cap_pending * 2 : 16;
            int32_t *pp = realloc(s->pending_pos, sizeof *pp * (size_t)cap);
            if (pp)
                s->pending_pos = pp;
            int32_t *pl = realloc(s->pending_layer, sizeof *pl * (size_t)cap);
            if (pl)
                s->pending_layer = pl;
            float *ph = realloc(s->pending_h, sizeof *ph * (size_t)cap * (size_t)dim);
            if (ph)
                s->pending_h = ph;
            if (!pp || !pl || !ph)
                return river_err_set(RIVER_ENOMEM, "exit: pending list of %d", cap);
            s->cap_pending = cap;
        }
        int i = s->n_pending++;
        s->pending_pos[i] = f->pos[r];
        s->pending_layer[i] = reached[r];
        FWD_TRY(f->be->ops->to_host(f->be->ctx, s->pending_h + (size_t)i * (size_t)dim, f->x,
                                    (size_t)r * (size_t)dim, (size_t)dim));
    }
    return 0;
}

/* Whether row r computes layer l in full (propagation rows only write K/V). */
static int forward__row_active(const forward_t *f, int r, int l, int n)
{
    if (l < f->start[r]) /* a resumed row, or a pending row, not there yet */
        return 0;
    if (r >= n) /* a pending row runs while the row that drives it still runs */
        return f->state[f->driver[r]] != ROW_STOPPED &&
               f->state[f->driver[r]] != ROW_PROPAGATE;
    return f->state[r] != ROW_STOPPED && f->state[r] != ROW_PROPAGATE;
}

/* Rule and aggregation after layer l: marks the rows whose group passes. */
static int forward__decide(forward_t *f, int l, int n, int n_ext)
{
    const exit_policy_t *p = &f->ex.policy;
    const model_config_t *c = &f->m->cfg;
    int L = c->n_layers;
    int min_exit = f->ex.river ? f->ex.river_start : 1;
    int any = 0;
    /* Cleared before any early return: forward__apply_exits reads pass after every layer,
     * and a stale (or never written) value would exit rows where no exit is allowed. */
    for (int r = 0; r < n; r++) {
        f->pass[r] = 0;
        any |= f->state[r] == ROW_BACKBONE;
    }
    if (l + 1 >= L || l + 1 < min_exit)
        return 0;
    if (!any)
        return 0;
    switch (p->rule) {
    case EXIT_RULE_COSINE:
        FWD_TRY(f->be->ops->cosine(f->be->ctx, f->cos, f->xprev, f->x, n, c->dim));
        for (int r = 0; r < n; r++)
            f->pass[r] = f->cos[r] > f->rx[r].tau;
        break;
    case EXIT_RULE_ROUTER: {
        if (!f->ex.router.is_checkpoint(f->ex.router.user, l))
            break;
        const router_weights_t *rw =
            f->ex.router.weights ? f->ex.router.weights(f->ex.router.user, l) : NULL;
        if (rw) {
            /* Only the rows still on the backbone, scored on the backend; their
             * probabilities are all that comes back. idx2 is free between the layer and
             * forward__apply_exits. */
            int m = 0;
            for (int r = 0; r < n; r++)
                if (f->state[r] == ROW_BACKBONE)
                    f->idx2[m++] = r;
            FWD_TRY(f->be->ops->router_prob(f->be->ctx, f->cos, f->x, rw, f->idx2, m));
            for (int i = 0; i < m; i++)
                f->pass[f->idx2[i]] = f->cos[i] > f->rx[f->idx2[i]].theta;
            break;
        }
        FWD_TRY(f->be->ops->to_host(f->be->ctx, f->host_hidden, f->x, 0,
                                    (size_t)n * (size_t)c->dim));
        for (int r = 0; r < n; r++)
            if (f->state[r] == ROW_BACKBONE)
                f->pass[r] = f->ex.router.prob(f->ex.router.user, l,
                                               f->host_hidden + (size_t)r * (size_t)c->dim) >
                             f->rx[r].theta;
        break;
    }
    case EXIT_RULE_FIXED:
        for (int r = 0; r < n; r++)
            f->pass[r] = l + 1 == f->rx[r].exit_layer;
        break;
    case EXIT_RULE_NONE:
        break;
    }
    for (int r = 0; r < n; r++)
        if (f->rx[r].off || l < f->start[r])
            f->pass[r] = 0;
    if (p->kv == EXIT_KV_MONO)
        for (int r = 0; r < n; r++)
            if (f->seq[r] && f->seq[r]->last_depth > 0 && l + 1 >= f->seq[r]->last_depth &&
                l >= f->start[r])
                f->pass[r] = 1;
    /* A group exits only when every row of it that is still on the backbone passes. */
    for (int r = 0; r < n; r++) {
        /* A row that asked never to exit stays on the backbone without holding its group
         * back. */
        if (f->state[r] != ROW_BACKBONE || f->pass[r] || f->rx[r].off || l < f->start[r])
            continue;
        for (int q = 0; q < n; q++)
            if (f->group[q] == f->group[r])
                f->pass[q] = 0;
    }
    (void)n_ext;
    return 0;
}

static int forward__apply_exits(forward_t *f, int l, int n)
{
    const exit_policy_t *p = &f->ex.policy;
    int m = 0;
    for (int r = 0; r < n; r++) {
        if (f->state[r] != ROW_BACKBONE || !f->pass[r])
            continue;
        f->depth[r] = l + 1;
        switch (p->kv) {
        case EXIT_KV_RIVER: f->state[r] = ROW_RIVER; break;
        case EXIT_KV_PROPAGATE: f->state[r] = ROW_PROPAGATE; break;
        case EXIT_KV_POSTHOC: f->state[r] = ROW_POSTHOC; f->idx2[m++] = r; break;
        default: f->state[r] = ROW_STOPPED; break;
        }
    }
    if (m) { /* post-hoc keeps the exit layer's residual stream for the logits */
        const ops_t *o = f->be->ops;
        FWD_TRY(o->gather_rows(f->be->ctx, f->xs, f->x, f->idx2, m, f->m->cfg.dim));
        FWD_TRY(o->scatter_rows(f->be->ctx, f->hexit, f->xs, f->idx2, m, f->m->cfg.dim));
    }
    return 0;
}

/* Runs layer l over the extended batch with early exit: rows on the backbone and rows on
 * the river as (at most) two groups, propagation rows K/V only. */
/* reached[r]: layers row r has computed in full, for the recompute baseline's bookkeeping. */
static int forward__exit_layer(forward_t *f, int l, int n, int n_ext, const kv_view_t *kv,
                               int32_t *reached, int stride)
{
    const model_t *m = f->m;
    int nb = 0, nr = 0, np = 0;
    int32_t *bidx = f->idx, *ridx = f->idx2;
    const layer_weights_t *rw = f->ex.river ? f->ex.river[l] : NULL;
    for (int r = 0; r < n_ext; r++) {
        if (r < n && f->state[r] == ROW_PROPAGATE)
            np++;
        else if (!forward__row_active(f, r, l, n))
            continue;
        else if (r < n && f->state[r] == ROW_RIVER && rw)
            ridx[nr++] = r;
        else
            bidx[nb++] = r;
    }
    /* In memory-bound decode a split layer reads both weight sets; carry the river rows on
     * the backbone when the two groups together would cost more than one. */
    int calibrated = f->ex.cost_b_fixed + f->ex.cost_b_row > 0;
    if (nb && nr && f->ex.policy.split_cost_model && calibrated) {
        double split = f->ex.cost_b_fixed + f->ex.cost_b_row * nb + f->ex.cost_r_fixed +
                       f->ex.cost_r_row * nr;
        double whole = f->ex.cost_b_fixed + f->ex.cost_b_row * (nb + nr);
        if (split >= whole) {
            for (int i = 0; i < nr; i++)
                bidx[nb++] = ridx[i];
            nr = 0;
            /* Keep row order so an all-backbone layer runs in place. */
            for (int i = 1; i < nb; i++)
                for (int j = i; j > 0 && bidx[j - 1] > bidx[j]; j--) {
                    int32_t t = bidx[j];
                    bidx[j] = bidx[j - 1];
                    bidx[j - 1] = t;
                }
        }
    }
    if (nb && nr)
        f->stats.splits++;
    if (f->ex.policy.rule == EXIT_RULE_COSINE) {
        double t0 = clock_now_s();
        FWD_TRY(f->be->ops->gather_rows(f->be->ctx, f->xprev, f->x, f->iota, n, m->cfg.dim));
        f->stats.decide_s += clock_now_s() - t0;
    }
    if (nb && f->has_remote && l >= f->remote.boundary) {
        f->stats.layer_rows_backbone += nb;
        FWD_TRY(forward__remote_group(f, l, bidx, nb, n_ext));
    } else if (nb) {
        if (f->ex.offload)
            offload_touch(f->ex.offload, l);
        f->stats.layer_rows_backbone += nb;
        FWD_TRY(forward__group(f, &m->layers[l], l, bidx, nb, n_ext, 0, kv, stride));
    }
    if (nr) {
        f->stats.layer_rows_river += nr;
        FWD_TRY(forward__group(f, rw, l, ridx, nr, n_ext, 0, kv, stride));
    }
    if (np) {
        int k = 0;
        for (int r = 0; r < n; r++)
            if (f->state[r] == ROW_PROPAGATE)
                ridx[k++] = r;
        FWD_TRY(forward__group(f, &m->layers[l], l, ridx, k, n_ext, 1, kv, stride));
    }
    for (int r = 0; r < n_ext; r++) {
        if (!forward__row_active(f, r, l, n))
            continue;
        reached[r] = l + 1;
        if (f->ex.policy.kv == EXIT_KV_MASK && r < n)
            f->seq[r]->kv_valid[(size_t)l * (size_t)stride + (size_t)f->pos[r]] = 1;
    }
    return 0;
}

/* After layer l (-1: the embedding) copies to the host the residual stream of the rows
 * whose save point this is: their save layer, or the layer they left the backbone at when
 * that comes first. */
static int forward__save(forward_t *f, const fwd_batch_t *b, int l)
{
    if (!b->save_layer)
        return 0;
    size_t dim = (size_t)f->m->cfg.dim;
    for (int r = 0; r < b->n; r++) {
        int at = b->save_layer[r];
        if (at < 0)
            continue;
        if ((l + 1 == at && f->depth[r] >= at) || (l + 1 < at && f->depth[r] == l + 1))
            FWD_TRY(f->be->ops->to_host(f->be->ctx, b->saved_hidden + (size_t)r * dim, f->x,
                                        (size_t)r * dim, dim));
    }
    return 0;
}

/* Logits of the requested rows: final norm and LM head. Rows that finished on the river
 * use the river's quantized head when it has one, so an exited token reads no
 * full-precision weight; the others use the backbone's. */
static int forward__logits(forward_t *f, const fwd_batch_t *b, float *logits)
{
    const ops_t *o = f->be->ops;
    ops_ctx_t *ctx = f->be->ctx;
    const model_t *m = f->m;
    const model_config_t *c = &m->cfg;
    const weight_t *rh = f->has_exit && f->ex.policy.kv == EXIT_KV_RIVER ? f->ex.river_head
                                                                         : NULL;
    size_t vocab = (size_t)c->vocab_size;
    for (int pass = 0; pass < 2; pass++) {
        /* Pass 0: rows on the backbone head; pass 1: rows on the river's head. */
        int k = 0;
        for (int i = 0; i < b->n_logits; i++) {
            int on_river = rh && f->state[b->logit_rows[i]] == ROW_RIVER;
            if (on_river == pass) {
                f->idx[k] = b->logit_rows[i];
                f->idx2[k++] = i;
            }
        }
        if (!k)
            continue;
        FWD_TRY(o->gather_rows(ctx, f->xl, f->x, f->idx, k, c->dim));
        FWD_TRY(o->rmsnorm(ctx, f->xl, f->xl, &m->final_norm, k, c->dim, c->norm_eps));
        FWD_TRY(o->matmul(ctx, f->lg, f->xl, pass ? rh : &m->lm_head, k));
        if (k == b->n_logits) /* all rows in one pass, in order */
            return o->to_host(ctx, logits, f->lg, 0, (size_t)k * vocab);
        for (int j = 0; j < k; j++)
            FWD_TRY(o->to_host(ctx, logits + (size_t)f->idx2[j] * vocab, f->lg,
                               (size_t)j * vocab, vocab));
    }
    return 0;
}

/* The backbone layers of a plain step as one recorded launch where the backend records
 * runs of ops (ops->graph_begin: CUDA graphs). Returns 1 when they ran so; 0 when they did
 * not (no recording now, or it failed), and then nothing of them ran: the caller runs them
 * op by op, and any error shows there. */
static int forward__layers_graph(forward_t *f, const kv_view_t *kv, const attn_batch_t *ab)
{
    const ops_t *o = f->be->ops;
    int active = 0;
    if (!o->graph_begin || !o->graph_end || o->graph_begin(f->be->ctx, &active) || !active)
        return 0;
    int e = 0;
    for (int l = 0; l < f->m->cfg.n_layers && !e; l++)
        e = forward__layer(f, &f->m->layers[l], l, f->x, kv, ab);
    return o->graph_end(f->be->ctx, e != 0) == 0 && e == 0;
}

int forward_step(forward_t *f, kv_pool_t *kv, const fwd_batch_t *b, float *logits)
{
    const ops_t *o = f->be->ops;
    ops_ctx_t *ctx = f->be->ctx;
    const model_t *m = f->m;
    const model_config_t *c = &m->cfg;
    int n = b->n, L = c->n_layers;
    if (n <= 0 || n > f->max_rows)
        return river_err_set(RIVER_EINVAL, "forward: batch of %d rows (max %d)", n,
                             f->max_rows);
    if (b->n_logits < 0 || b->n_logits > n)
        return river_err_set(RIVER_EINVAL, "forward: %d logit rows of %d", b->n_logits, n);
    const kv_view_t *view = kv_pool_view(kv);
    for (int i = 0; i < n; i++) {
        if (b->tokens[i] < 0 || b->tokens[i] >= c->vocab_size)
            return river_err_set(RIVER_ERANGE, "forward: token id %d outside vocab %d",
                                 b->tokens[i], c->vocab_size);
        if (b->pos[i] < 0 || b->pos[i] >= c->max_seq_len)
            return river_err_set(RIVER_ERANGE, "forward: position %d outside context %d",
                                 b->pos[i], c->max_seq_len);
    }
    for (int i = 0; b->start_layer && i < n; i++) {
        if (b->start_layer[i] < 0 || b->start_layer[i] > L)
            return river_err_set(RIVER_ERANGE, "forward: start layer %d outside 0..%d",
                                 b->start_layer[i], L);
        if (b->start_layer[i] > 0 && !b->start_hidden)
            return river_err_set(RIVER_EINVAL, "forward: row %d starts at layer %d without "
                                 "its residual stream", i, b->start_layer[i]);
    }
    if (b->save_layer && !b->saved_hidden)
        return river_err_set(RIVER_EINVAL, "forward: save layers without a buffer");
    for (int i = 0; i < b->n_logits; i++)
        if (b->logit_rows[i] < 0 || b->logit_rows[i] >= n)
            return river_err_set(RIVER_ERANGE, "forward: logit row %d of %d",
                                 b->logit_rows[i], n);
    if (f->has_remote && f->has_exit &&
        (f->ex.policy.kv == EXIT_KV_MASK || f->ex.policy.kv == EXIT_KV_PROPAGATE))
        return river_err_set(RIVER_EUNSUPPORTED, "forward: the %s strategy cannot run "
                             "backbone layers on a remote (no validity maps or K/V-only "
                             "passes cross the split)", exit_kv_name(f->ex.policy.kv));
    double t0 = clock_now_s();
    for (int r = 0; r < n; r++) {
        f->pos[r] = b->pos[r];
        f->tokens[r] = b->tokens[r];
        f->tables[r] = b->page_table[r];
        f->valid[r] = NULL;
        f->seq[r] = b->exit_seq ? b->exit_seq[r] : NULL;
        f->state[r] = ROW_BACKBONE;
        f->depth[r] = L;
        f->start[r] = b->start_layer ? b->start_layer[r] : 0;
        f->driver[r] = -1;
        f->group[r] = b->group ? b->group[r] : f->ex.policy.agg == EXIT_AGG_ROW ? r : 0;
        f->rx[r] = b->row_exit ? b->row_exit[r]
                               : (exit_row_t){.tau = f->ex.policy.tau, .theta = f->ex.policy.theta,
                                              .exit_layer = f->ex.policy.exit_layer};
    }
    FWD_TRY(o->embed(ctx, f->x, &m->embed, b->tokens, n));
    int resumed = 0; /* rows that start past layer 0 */
    for (int r = 0; b->start_layer && r < n; r++)
        if (f->start[r] > 0) {
            resumed++;
            FWD_TRY(o->from_host(ctx, f->x, (size_t)r * (size_t)c->dim,
                                 b->start_hidden + (size_t)r * (size_t)c->dim,
                                 (size_t)c->dim));
        }
    FWD_TRY(forward__save(f, b, -1));
    if (!f->has_exit) {
        attn_batch_t ab = {.n = n, .pos = f->pos, .page_table = f->tables};
        /* The recorded path covers the plain case only: every row from layer 0, nothing
         * copied to the host between layers. */
        int plain = !f->hook && !f->has_remote && !b->save_layer;
        for (int r = 0; r < n && plain; r++)
            plain = f->start[r] == 0;
        int done = plain && forward__layers_graph(f, view, &ab);
        if (done)
            f->stats.layer_rows_backbone += (int64_t)n * L;
        for (int l = 0; l < L && !done; l++) {
            int m_rows = n;
            if (resumed) {
                m_rows = 0;
                for (int r = 0; r < n; r++)
                    if (l >= f->start[r])
                        f->idx[m_rows++] = r;
            }
            if (m_rows == 0)
                continue;
            if (f->has_remote && l >= f->remote.boundary)
                FWD_TRY(forward__remote_group(f, l, resumed ? f->idx : f->iota, m_rows, n));
            else if (m_rows < n)
                FWD_TRY(forward__group(f, &m->layers[l], l, f->idx, m_rows, n, 0, view, 0));
            else
                FWD_TRY(forward__layer(f, &m->layers[l], l, f->x, view, &ab));
            f->stats.layer_rows_backbone += m_rows;
            FWD_TRY(forward__save(f, b, l));
            if (f->hook) {
                FWD_TRY(o->to_host(ctx, f->host_hidden, f->x, 0, (size_t)n * (size_t)c->dim));
                f->hook(f->hook_user, l, f->host_hidden, n, c->dim);
            }
        }
    } else {
        exit_kv_t kvs = f->ex.policy.kv;
        int n_ext = n, stride = 0;
        if (kvs == EXIT_KV_RECOMPUTE)
            FWD_TRY(forward__add_pending(f, n, &n_ext));
        if (kvs == EXIT_KV_MASK) {
            FWD_TRY(forward__valid_prepare(f, n, L));
            stride = forward__valid_stride(f, n);
        }
        for (int r = 0; r < n_ext; r++)
            f->reached[r] = f->start[r];
        for (int l = 0; l < L; l++) {
            FWD_TRY(forward__exit_layer(f, l, n, n_ext, view, f->reached, stride));
            if (f->hook) {
                FWD_TRY(o->to_host(ctx, f->host_hidden, f->x, 0, (size_t)n * (size_t)c->dim));
                f->hook(f->hook_user, l, f->host_hidden, n, c->dim);
            }
            double td = clock_now_s();
            FWD_TRY(forward__decide(f, l, n, n_ext));
            FWD_TRY(forward__apply_exits(f, l, n));
            f->stats.decide_s += clock_now_s() - td;
            FWD_TRY(forward__save(f, b, l));
        }
        if (kvs == EXIT_KV_RECOMPUTE)
            FWD_TRY(forward__update_pending(f, n, n_ext, f->reached));
        for (int r = 0; r < n && kvs == EXIT_KV_MONO; r++)
            if (f->seq[r])
                f->seq[r]->last_depth = f->depth[r];
        if (kvs == EXIT_KV_POSTHOC) {
            /* Post-hoc rows take their logits from the exit layer's residual stream. */
            int k = 0;
            for (int r = 0; r < n; r++)
                if (f->state[r] == ROW_POSTHOC)
                    f->idx[k++] = r;
            if (k) {
                FWD_TRY(o->gather_rows(ctx, f->xs, f->hexit, f->idx, k, c->dim));
                FWD_TRY(o->scatter_rows(ctx, f->x, f->xs, f->idx, k, c->dim));
            }
        }
    }
    if (b->depth)
        memcpy(b->depth, f->depth, sizeof *b->depth * (size_t)n);
    int e = b->n_logits > 0 ? forward__logits(f, b, logits) : o->sync(ctx);
    f->stats.step_s += clock_now_s() - t0;
    f->stats.steps++;
    return e;
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
    FWD_TRY(forward__layer(f, &f->m->layers[layer], layer, f->x, kv_pool_view(kv), &ab));
    return o->to_host(f->be->ctx, x_out, f->x, 0, n);
}

/* The checks forward_layer_rows and forward_layer_rows_dev share. */
static int forward__rows_check(const forward_t *f, int layer, int n, const int32_t *pos,
                               const int32_t *const *page_table, const void *x)
{
    const model_config_t *c = &f->m->cfg;
    if (n <= 0 || n > f->max_rows || layer < 0 || layer >= c->n_layers || !pos ||
        !page_table || !x)
        return river_err_set(RIVER_EINVAL, "forward: layer %d with %d rows (max %d)", layer,
                             n, f->max_rows);
    for (int i = 0; i < n; i++)
        if (pos[i] < 0 || pos[i] >= c->max_seq_len)
            return river_err_set(RIVER_ERANGE, "forward: position %d outside context %d",
                                 pos[i], c->max_seq_len);
    return 0;
}

int forward_layer_rows_dev(forward_t *f, kv_pool_t *kv, int layer, int n, const int32_t *pos,
                           const int32_t *const *page_table, void *x)
{
    FWD_TRY(forward__rows_check(f, layer, n, pos, page_table, x));
    attn_batch_t ab = {.n = n, .pos = pos, .page_table = page_table};
    return forward__layer(f, &f->m->layers[layer], layer, x, kv_pool_view(kv), &ab);
}

int forward_layer_rows(forward_t *f, kv_pool_t *kv, int layer, int n, const int32_t *pos,
                       const int32_t *const *page_table, float *x)
{
    FWD_TRY(forward__rows_check(f, layer, n, pos, page_table, x));
    /* forward_layer_host reads all of x into the activations before it writes any of it,
     * so input and output may be one buffer. */
    fwd_batch_t b = {.n = n, .pos = pos, .page_table = page_table};
    return forward_layer_host(f, kv, &b, layer, x, x);
}

/* Seconds for one layer with weights w on n rows at positions 0..n-1, best of 3. */
/* Seconds per layer of one weight set (river or backbone) over layers first..L-1 on n
 * rows: every layer once per pass, as a decode step streams them, so a model whose layers
 * do not all fit the caches is timed from memory, not from a cache warmed by repeats. Best
 * of 3 passes. */
static int forward__time_stack(forward_t *f, const layer_weights_t *const *river, int first,
                               int L, kv_pool_t *kv, const int32_t *pages, int n, double *secs)
{
    for (int r = 0; r < n; r++) {
        f->sub_pos[r] = r;
        f->sub_tables[r] = pages;
    }
    attn_batch_t ab = {.n = n, .pos = f->sub_pos, .page_table = f->sub_tables};
    double best = 1e30;
    for (int rep = 0; rep < 3; rep++) {
        double t0 = clock_now_s();
        for (int l = first; l < L; l++)
            FWD_TRY(forward__layer(f, river ? river[l] : &f->m->layers[l], l, f->xs,
                                   kv_pool_view(kv), &ab));
        FWD_TRY(f->be->ops->sync(f->be->ctx));
        double dt = clock_now_s() - t0;
        best = dt < best ? dt : best;
    }
    *secs = best / (double)(L - first);
    return 0;
}

int forward_time_layers(forward_t *f, kv_pool_t *kv, const layer_weights_t *const *river,
                        int first, int n, double *secs)
{
    int L = f->m->cfg.n_layers;
    if (n < 1 || n > f->max_rows || first < 0 || first >= L)
        return river_err_set(RIVER_EINVAL, "forward: timing layers %d..%d on %d rows", first,
                             L - 1, n);
    for (int l = first; river && l < L; l++)
        if (!river[l])
            return river_err_set(RIVER_EINVAL, "forward: timing: the river has no layer %d", l);
    kv_seq_t s;
    kv_seq_init(&s);
    int e = kv_seq_reserve(&s, kv, n);
    if (!e)
        e = forward__time_stack(f, river, first, L, kv, s.pages, n, secs);
    kv_seq_free(&s, kv);
    return e;
}

int forward_calibrate_costs(forward_t *f, kv_pool_t *kv, exit_config_t *cfg)
{
    int L = f->m->cfg.n_layers;
    if (!cfg->river)
        return river_err_set(RIVER_EINVAL, "exit: costs need a river");
    int first = cfg->river_start < L ? cfg->river_start : L - 1;
    for (int l = first; l < L; l++)
        if (!cfg->river[l])
            return river_err_set(RIVER_EINVAL, "exit: river has no layer %d", l);
    /* Backbone layers that run on a remote are not this process's to time (a device
     * backend may not even hold them): the stack below the boundary stands for them. */
    int bend = f->has_remote && f->remote.boundary < L ? f->remote.boundary : L;
    int bfirst = first < bend ? first : bend - 1;
    if (bfirst < 0)
        return river_err_set(RIVER_EINVAL, "exit: no backbone layer runs here to time");
    int n2 = f->max_rows < 16 ? f->max_rows : 16;
    if (n2 < 2)
        return river_err_set(RIVER_EINVAL, "exit: costs need batches of 2 rows or more");
    kv_seq_t s;
    kv_seq_init(&s);
    int e = kv_seq_reserve(&s, kv, n2);
    double b1 = 0, b2 = 0, r1 = 0, r2 = 0;
    /* Zeroed inputs are as costly as any: the kernels do not branch on values. */
    if (!e)
        e = forward__time_stack(f, NULL, bfirst, bend, kv, s.pages, 1, &b1);
    if (!e)
        e = forward__time_stack(f, NULL, bfirst, bend, kv, s.pages, n2, &b2);
    if (!e)
        e = forward__time_stack(f, cfg->river, first, L, kv, s.pages, 1, &r1);
    if (!e)
        e = forward__time_stack(f, cfg->river, first, L, kv, s.pages, n2, &r2);
    kv_seq_free(&s, kv);
    if (e)
        return e;
    cfg->cost_b_row = b2 > b1 ? (b2 - b1) / (n2 - 1) : 0;
    cfg->cost_b_fixed = b1 - cfg->cost_b_row > 0 ? b1 - cfg->cost_b_row : 0;
    cfg->cost_r_row = r2 > r1 ? (r2 - r1) / (n2 - 1) : 0;
    cfg->cost_r_fixed = r1 - cfg->cost_r_row > 0 ? r1 - cfg->cost_r_row : 0;
    if (f->has_exit) {
        f->ex.cost_b_fixed = cfg->cost_b_fixed;
        f->ex.cost_b_row = cfg->cost_b_row;
        f->ex.cost_r_fixed = cfg->cost_r_fixed;
        f->ex.cost_r_row = cfg->cost_r_row;
    }
    return 0;
}
