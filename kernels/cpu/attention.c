/* Paged causal grouped-query attention.
 *
 * The unit of work is a tile of rows (below) and a range of its KV heads: all of them,
 * unless there are too few tiles to keep every thread busy, as in decoding one sequence.
 * Heads are computed apart from each other, so the cut changes no bit. Where even cutting
 * by heads leaves threads idle on a long sequence (a model with one KV head, many
 * threads), and for the scalar level and rows with validity maps, the unit is one row and
 * a range of its positions. The K and V rows of a position hold every KV head side by
 * side, so a task walks them in blocks of ATTN_BLOCK positions and lets every head use a
 * block while it is in cache. Memory then sees a few sequential streams instead of one
 * strided stream per head. The G = n_heads/n_kv_heads query heads that share a KV head
 * are computed together, each K and V slice loaded once for them. When a sequence is cut
 * into chunks of positions, each chunk yields its own maximum, sum of exponentials and
 * unnormalised output per head, and a final pass merges them (the usual log-sum-exp
 * rescaling).
 *
 * Prefill (consecutive rows of one sequence at consecutive positions) goes a tile of up to
 * ATTN_TILE query rows at a time, flash-attention style: for each block of ATTN_BLOCK
 * positions and each KV head, every row of the tile takes its scores against the block's
 * K slice, updates its running maximum and sum of exponentials (online softmax, the output
 * rescaled when the maximum grows) and adds the block's V slice, while both slices are in
 * L1. Each K/V row is then read once per tile instead of once per row. The scalar level
 * keeps the one-row path (it reproduces llama2.c's arithmetic exactly), and so do rows with
 * validity maps and rows cut into chunks of positions.
 *
 * Pools of F16, BF16 or Q8 (kv_view_t.dtype) are read a block of ATTN_BLOCK positions at a
 * time: the level's kv_to_f32 widens the block's K (then V) rows, the task's heads of
 * them, into the thread's scratch, once for every head and every row of a tile, and the
 * f32 kernels read those rows. The widening is exact and per position, so the rule above
 * holds in every dtype; an F32 pool is read in place, as before. */
#include <math.h>
#include <string.h>

#include "common/err.h"
#include "kernels/cpu/cpu_internal.h"

/* Below this many multiply-adds (q.k and p.v together) attention runs on the calling
 * thread: dispatch would cost more than it saves. */
#define ATTN_PAR_WORK (1 << 15)
/* Below this many multiply-adds a tile is not cut into parts by KV heads (ctx 128 of
 * Llama 3.2 1B's 32 heads of 64): at 16 to 64 positions the parts took longer than the
 * tile on one thread (river bench --profile). */
#define ATTN_SPLIT_WORK (1 << 19)
/* The shortest chunk a sequence is cut into. */
#define ATTN_MIN_CHUNK 256
/* Positions whose K (or V) rows every head goes through before the next ones. */
#define ATTN_BLOCK 64
/* Query rows of one sequence that share each K/V block (prefill). */
#define ATTN_TILE 16
/* Positions ahead of the one being widened whose rows are prefetched. */
#define ATTN_WIDEN_PF 8

/* A thread's view of the K and V rows of one block of positions (attn_block_rows). */
typedef struct attn_rows {
    int64_t *off;       /* (positions of the task) element offset of each position's row in
                           the layer, -1 for a slot never written (masked early exit) */
    const float **krow; /* (ATTN_BLOCK) the block's K rows as f32, NULL where off is -1 */
    const float **vrow; /* (ATTN_BLOCK) the same for V */
    float *kbuf;        /* (ATTN_BLOCK * kv_dim) widened K rows, non-F32 pools only */
    float *vbuf;
} attn_rows_t;

/* Floats of scratch attn_rows_carve takes for n positions. */
static size_t attn_rows_floats(const kv_view_t *kv, int64_t n)
{
    size_t conv = kv->dtype == DTYPE_F32 ? 0 : 2 * (size_t)ATTN_BLOCK * (size_t)kv->kv_dim;
    size_t ptr = sizeof(const float *);
    return 2 * (size_t)n + 2 * ATTN_BLOCK * ptr / sizeof(float) + conv;
}

/* Lays r out at the start of a thread's scratch (64-byte aligned), returns what follows. */
static float *attn_rows_carve(float *p, const kv_view_t *kv, int64_t n, attn_rows_t *r)
{
    r->off = (int64_t *)p;
    r->krow = (const float **)(r->off + n);
    r->vrow = r->krow + ATTN_BLOCK;
    float *f = (float *)(r->vrow + ATTN_BLOCK);
    r->kbuf = r->vbuf = NULL;
    if (kv->dtype != DTYPE_F32) {
        r->kbuf = f;
        r->vbuf = f + (size_t)ATTN_BLOCK * kv->kv_dim;
        f = r->vbuf + (size_t)ATTN_BLOCK * kv->kv_dim;
    }
    return f;
}

/* rows[t] = the row of position b0 + t of K (v 0) or V (v 1) for t < n (n <= ATTN_BLOCK):
 * the pool's own row for F32, else the row widened into buf, only its elements c0 to
 * c0 + cn - 1 (the KV heads the task computes; the others are left as they were). off
 * holds the left positions from b0 on. */
static void attn_block_rows(const cpu_kernels_t *k, const kv_view_t *kv, int v,
                            const int64_t *off, int64_t n, int64_t left, int64_t c0, int64_t cn,
                            float *buf, const float **rows)
{
    const void *base = v ? kv->v : kv->k;
    const float *sc = v ? kv->v_scale : kv->k_scale;
    size_t es = kv_dtype_bytes(kv->dtype, 1), bytes = (size_t)cn * es;
    for (int64_t t = 0; t < n; t++) {
        /* A page's rows lie apart from the next page's, which the hardware prefetchers do
         * not follow: the row ATTN_WIDEN_PF positions on is asked for (of the left
         * positions from this block's first, the next block's too). */
        if (kv->dtype != DTYPE_F32 && t + ATTN_WIDEN_PF < left && off[t + ATTN_WIDEN_PF] >= 0) {
            const char *p = (const char *)base + (size_t)(off[t + ATTN_WIDEN_PF] + c0) * es;
            for (size_t b = 0; b < bytes; b += 64)
                __builtin_prefetch(p + b, 0, 3);
        }
        if (off[t] < 0) {
            rows[t] = NULL;
        } else if (kv->dtype == DTYPE_F32) {
            rows[t] = (const float *)base + off[t];
        } else {
            float *r = buf + t * kv->kv_dim;
            k->kv_to_f32(r + c0, kv->dtype, base, sc, off[t] + c0, cn);
            rows[t] = r;
        }
    }
}

typedef struct attn_job {
    ops_ctx_t *ctx;
    float *out;
    const float *q;
    const kv_view_t *kv;
    int layer;
    const attn_batch_t *b;
    int n_heads, n_kv, hd, G;
    float scale;
    int n_chunks;  /* chunks per row */
    int chunk_len; /* positions per chunk */
    float *part;   /* n_chunks > 1: per (row, chunk), n_heads * (hd + 2) floats: o, then m, l */
    const int *tile_row; /* tiled: (n_tiles + 1) first batch row of each tile */
    int kv_per;          /* tiled: KV heads a task computes (all of them, or a part) */
} attn_job_t;

/* The parts a tile is cut into, kv_per KV heads each (the last may hold fewer). */
static int attn_parts(int n_kv, int kv_per)
{
    return (n_kv + kv_per - 1) / kv_per;
}

/* One tile of rows r0..r1-1 of one sequence at consecutive positions (pos[r0] + i), for
 * KV heads h0..h1-1 and their query heads: a tile's heads are computed apart from each
 * other, so cutting it into parts changes no bit. */
static void attn_tile_task(void *arg, int task, int thread)
{
    const attn_job_t *j = arg;
    const kv_view_t *kv = j->kv;
    const cpu_kernels_t *k = j->ctx->k;
    int n_parts = attn_parts(j->n_kv, j->kv_per);
    int tile = task / n_parts, part = task % n_parts;
    int r0 = j->tile_row[tile], r1 = j->tile_row[tile + 1], m = r1 - r0;
    int G = j->G, hd = j->hd, H = j->n_heads;
    int h0 = part * j->kv_per, h1 = h0 + j->kv_per < j->n_kv ? h0 + j->kv_per : j->n_kv;
    int64_t c0 = (int64_t)h0 * hd, cn = (int64_t)(h1 - h0) * hd; /* the K/V row's part */
    int q0 = h0 * G, qn = (h1 - h0) * G;                          /* query heads */
    int64_t len = (int64_t)j->b->pos[r1 - 1] + 1; /* positions the last row attends to */
    int64_t p0 = j->b->pos[r0];
    /* Scratch: the rows of every position (attn_rows_t), the tile's outputs (m rows of
     * H * hd), running maxima and sums (m * H each), and m * G * ATTN_BLOCK scores. */
    attn_rows_t r;
    float *o = attn_rows_carve(j->ctx->thread_scratch[thread].s.p, kv, j->chunk_len, &r);
    float *mx = o + (int64_t)ATTN_TILE * H * hd;
    float *sum = mx + ATTN_TILE * H;
    float *s = sum + ATTN_TILE * H;
    const int32_t *pt = j->b->page_table[r0];
    int64_t layer_off = (int64_t)j->layer * kv->layer_stride;
    for (int64_t t = 0; t < len; t++)
        r.off[t] = (int64_t)pt[t / kv->page_size] * kv->page_stride + layer_off +
                   (t % kv->page_size) * kv->kv_dim;
    for (int i = 0; i < m; i++) {
        memset(o + ((int64_t)i * H + q0) * hd, 0, (size_t)qn * hd * sizeof(float));
        for (int hh = q0; hh < q0 + qn; hh++) {
            mx[i * H + hh] = -INFINITY;
            sum[i * H + hh] = 0.0f;
        }
    }
    for (int64_t b0 = 0; b0 < len; b0 += ATTN_BLOCK) {
        int64_t blk = len - b0 < ATTN_BLOCK ? len - b0 : ATTN_BLOCK;
        attn_block_rows(k, kv, 0, r.off + b0, blk, len - b0, c0, cn, r.kbuf, r.krow);
        attn_block_rows(k, kv, 1, r.off + b0, blk, len - b0, c0, cn, r.vbuf, r.vrow);
        /* Where every row of the tile sees the whole block (all but the block on the
         * diagonal), the values of all rows go in one call after their scores, as one
         * product of the tile's probabilities and the V block. */
        int whole = k->attn_values_rows && p0 + 1 - b0 >= blk;
        /* And so do the scores, before any row's softmax step, where the level has it. */
        int whole_scores = whole && k->attn_scores_rows;
        for (int h = h0; h < h1; h++) {
            if (whole_scores)
                k->attn_scores_rows(s, blk, j->q + ((int64_t)r0 * H + (int64_t)h * G) * hd,
                                    (int64_t)H * hd, m, G, hd, r.krow, (int64_t)h * hd, blk,
                                    j->scale);
            for (int i = 0; i < m; i++) {
                /* Row i attends to positions 0..p0 + i. */
                int64_t bn = p0 + i + 1 - b0;
                if (bn <= 0)
                    continue;
                if (bn > ATTN_BLOCK)
                    bn = ATTN_BLOCK;
                const float *q = j->q + ((int64_t)(r0 + i) * H + (int64_t)h * G) * hd;
                float *oi = o + ((int64_t)i * H + (int64_t)h * G) * hd;
                float *si = whole ? s + (int64_t)i * G * bn : s;
                if (!whole_scores)
                    k->attn_scores(si, bn, q, G, hd, r.krow, (int64_t)h * hd, bn, j->scale);
                for (int g = 0; g < G; g++) {
                    float *mg = &mx[i * H + h * G + g], *lg = &sum[i * H + h * G + g];
                    float bm = k->max(si + g * bn, bn);
                    float nm = bm > *mg ? bm : *mg;
                    if (nm > *mg && *lg > 0.0f) {
                        /* The maximum grew: what was summed so far shrinks by e^(old-new). */
                        float c = expf(*mg - nm);
                        *lg *= c;
                        for (int d = 0; d < hd; d++)
                            oi[g * hd + d] *= c;
                    }
                    *mg = nm;
                    *lg += k->exp_sum(si + g * bn, bn, nm);
                }
                if (!whole)
                    k->attn_values(oi, s, bn, G, hd, r.vrow, (int64_t)h * hd, bn);
            }
            if (whole)
                k->attn_values_rows(o + (int64_t)h * G * hd, (int64_t)H * hd, s, blk, m, G, hd,
                                    r.vrow, (int64_t)h * hd, blk);
        }
    }
    /* Written only now that every q row of the tile has been read: out may be q (the
     * other parts of the tile read and write only their own heads). */
    for (int i = 0; i < m; i++) {
        float *dst = j->out + (int64_t)(r0 + i) * H * hd;
        for (int hh = q0; hh < q0 + qn; hh++) {
            float inv = sum[i * H + hh] > 0.0f ? 1.0f / sum[i * H + hh] : 0.0f;
            for (int d = 0; d < hd; d++)
                dst[hh * hd + d] = o[((int64_t)i * H + hh) * hd + d] * inv;
        }
    }
}

static void attn_task(void *arg, int task, int thread)
{
    const attn_job_t *j = arg;
    const kv_view_t *kv = j->kv;
    const cpu_kernels_t *k = j->ctx->k;
    int i = task / j->n_chunks, c = task % j->n_chunks;
    int G = j->G, hd = j->hd, H = j->n_heads;
    int64_t len = (int64_t)j->b->pos[i] + 1;
    int64_t t0 = (int64_t)c * j->chunk_len;
    int64_t t1 = t0 + j->chunk_len < len ? t0 + j->chunk_len : len;
    const float *q = j->q + (int64_t)i * H * hd;
    const uint8_t *vmap = NULL;
    if (j->b->kv_valid && j->b->kv_valid[i])
        vmap = j->b->kv_valid[i] + (int64_t)j->layer * j->b->kv_valid_stride;
    float *o, *ml = NULL;
    if (j->n_chunks == 1) {
        o = j->out + (int64_t)i * H * hd;
    } else {
        o = j->part + (int64_t)task * H * (hd + 2);
        ml = o + (int64_t)H * hd;
    }
    int64_t T = t1 > t0 ? t1 - t0 : 0;

    /* The thread's scratch: the rows of the chunk (attn_rows_t; each row holds all KV
     * heads of a position), then a row of T scores per query head. */
    attn_rows_t r;
    float *s = attn_rows_carve(j->ctx->thread_scratch[thread].s.p, kv, j->chunk_len, &r);
    const int32_t *pt = j->b->page_table[i];
    int64_t layer_off = (int64_t)j->layer * kv->layer_stride;
    int64_t n_valid = 0;
    for (int64_t t = t0; t < t1; t++) {
        /* Slots never written (masked early exit) get NULL rows: no weight, never read. */
        if (vmap && !vmap[t]) {
            r.off[t - t0] = -1;
            continue;
        }
        r.off[t - t0] = (int64_t)pt[t / kv->page_size] * kv->page_stride + layer_off +
                        (t % kv->page_size) * kv->kv_dim;
        n_valid++;
    }
    if (n_valid > 0)
        for (int64_t b0 = 0; b0 < T; b0 += ATTN_BLOCK) {
            int64_t bn = T - b0 < ATTN_BLOCK ? T - b0 : ATTN_BLOCK;
            attn_block_rows(k, kv, 0, r.off + b0, bn, T - b0, 0, kv->kv_dim, r.kbuf, r.krow);
            for (int h = 0; h < j->n_kv; h++)
                k->attn_scores(s + (int64_t)h * G * T + b0, T, q + (int64_t)h * G * hd, G, hd,
                               r.krow, (int64_t)h * hd, bn, j->scale);
        }
    /* Cleared only now that q has been read: out may be the q buffer itself, and this task
     * is the only reader of the q row it overwrites. */
    memset(o, 0, (size_t)H * hd * sizeof(float));
    if (n_valid == 0) {
        /* Nothing to attend to in this chunk (a row shorter than others of the batch, or
         * only masked slots): it adds nothing. */
        if (ml)
            for (int h = 0; h < H; h++) {
                ml[2 * h] = -INFINITY;
                ml[2 * h + 1] = 0.0f;
            }
        return;
    }
    for (int h = 0; h < H; h++) {
        float mh = k->max(s + h * T, T);
        float lh = k->exp_sum(s + h * T, T, mh);
        if (ml) {
            ml[2 * h] = mh;
            ml[2 * h + 1] = lh;
        } else {
            /* A single chunk: normalise the probabilities before they weight V (dividing,
             * as llama2.c does, so that the scalar level reproduces it exactly). */
            for (int64_t t = 0; t < T; t++)
                s[h * T + t] /= lh;
        }
    }
    for (int64_t b0 = 0; b0 < T; b0 += ATTN_BLOCK) {
        int64_t bn = T - b0 < ATTN_BLOCK ? T - b0 : ATTN_BLOCK;
        attn_block_rows(k, kv, 1, r.off + b0, bn, T - b0, 0, kv->kv_dim, r.vbuf, r.vrow);
        for (int h = 0; h < j->n_kv; h++)
            k->attn_values(o + (int64_t)h * G * hd, s + (int64_t)h * G * T + b0, T, G, hd,
                           r.vrow, (int64_t)h * hd, bn);
    }
}

/* Merges the chunks of every row into out. */
static void attn_merge(const attn_job_t *j, int n_rows)
{
    int H = j->n_heads, hd = j->hd;
    for (int i = 0; i < n_rows; i++) {
        const float *base = j->part + (int64_t)i * j->n_chunks * H * (hd + 2);
        for (int h = 0; h < H; h++) {
            float M = -INFINITY;
            for (int c = 0; c < j->n_chunks; c++) {
                const float *ml = base + (int64_t)c * H * (hd + 2) + (int64_t)H * hd;
                if (ml[2 * h] > M)
                    M = ml[2 * h];
            }
            float L = 0.0f;
            float *o = j->out + ((int64_t)i * H + h) * hd;
            memset(o, 0, (size_t)hd * sizeof(float));
            for (int c = 0; c < j->n_chunks; c++) {
                const float *oc = base + (int64_t)c * H * (hd + 2);
                const float *ml = oc + (int64_t)H * hd;
                if (ml[2 * h + 1] == 0.0f)
                    continue;
                float wgt = expf(ml[2 * h] - M);
                L += ml[2 * h + 1] * wgt;
                for (int d = 0; d < hd; d++)
                    o[d] += oc[(int64_t)h * hd + d] * wgt;
            }
            /* L is 0 only when no chunk had a slot to read; the output then stays 0. */
            float inv = L > 0.0f ? 1.0f / L : 0.0f;
            for (int d = 0; d < hd; d++)
                o[d] *= inv;
        }
    }
}

int cpu_attention(ops_ctx_t *ctx, void *out, const void *q, const kv_view_t *kv, int layer,
                  const attn_batch_t *b, int n_heads, int n_kv_heads, int head_dim,
                  float scale)
{
    if (!kv || !b || b->n < 0 || layer < 0 || n_heads <= 0 || n_kv_heads <= 0 ||
        head_dim <= 0 || n_heads % n_kv_heads != 0 || kv->page_size <= 0 ||
        kv->kv_dim != n_kv_heads * head_dim)
        return river_err_set(RIVER_EINVAL, "cpu attention: %d heads, %d kv heads, head_dim %d, "
                             "kv_dim %d", n_heads, n_kv_heads, head_dim, kv ? kv->kv_dim : -1);
    if (b->n == 0)
        return 0;
    if (!out || !q || !b->pos || !b->page_table || !kv->k || !kv->v)
        return river_err_set(RIVER_EINVAL, "cpu attention: NULL buffer");
    if (!kv_dtype_ok(kv->dtype) ||
        (kv->dtype == DTYPE_Q8 && (kv->kv_dim % KV_Q8_BLOCK || !kv->k_scale || !kv->v_scale)))
        return river_err_set(RIVER_EINVAL, "cpu attention: kv.dtype %s with kv_dim %d",
                             dtype_name(kv->dtype), kv->kv_dim);
    int64_t max_len = 0, total_len = 0;
    for (int i = 0; i < b->n; i++) {
        if (b->pos[i] < 0 || !b->page_table[i])
            return river_err_set(RIVER_EINVAL, "cpu attention: row %d at position %d", i,
                                 (int)b->pos[i]);
        int64_t len = (int64_t)b->pos[i] + 1;
        for (int64_t p = 0; p <= (len - 1) / kv->page_size; p++) {
            int32_t page = b->page_table[i][p];
            if (page < 0 || page >= kv->n_pages)
                return river_err_set(RIVER_ERANGE, "cpu attention: page %d outside pool of %d",
                                     (int)page, kv->n_pages);
        }
        max_len = len > max_len ? len : max_len;
        total_len += len;
    }

    attn_job_t j = { .ctx = ctx, .out = out, .q = q, .kv = kv, .layer = layer, .b = b,
                     .n_heads = n_heads, .n_kv = n_kv_heads, .hd = head_dim,
                     .G = n_heads / n_kv_heads, .scale = scale, .n_chunks = 1 };
    int threads = ctx->n_threads;
    if (total_len * n_heads * head_dim * 2 < ATTN_PAR_WORK)
        threads = 1;
    /* Tiles of consecutive rows of one sequence at consecutive positions (the scalar level
     * and validity maps aside). A decode row is a tile of one: a row's arithmetic in a tile
     * does not depend on the tile's other rows, so a position gets the same floats whether
     * it is prefilled, decoded or verified (lossless mode, a resumed or preempted
     * sequence, a prefix reused from the cache). */
    int tiled = !b->kv_valid && ctx->k->level != CPU_SIMD_SCALAR;
    int n_tiles = 0, *tile_row = NULL;
    if (tiled) {
        int e = cpu_scratch_reserve(&ctx->shared2, (size_t)b->n + 1);
        if (e)
            return e;
        tile_row = (int *)ctx->shared2.p;
        for (int i = 0; i < b->n; i++) {
            int start = n_tiles == 0 || i - tile_row[n_tiles - 1] >= ATTN_TILE ||
                        b->page_table[i] != b->page_table[i - 1] ||
                        b->pos[i] != b->pos[i - 1] + 1;
            if (start)
                tile_row[n_tiles++] = i;
        }
        tile_row[n_tiles] = b->n;
    }
    /* Fewer tiles than twice the threads (one sequence decoding, a few): each tile is cut
     * into parts of whole KV heads, so that every thread has work and no bit moves; not
     * for a short context, whose attention takes less than handing it out would (unless
     * it is long enough to be cut into chunks below instead). For a Q8 pool a part must
     * hold whole blocks of its scales. */
    int kv_per = n_kv_heads;
    if (tiled && threads > 1 && n_tiles < 2 * threads &&
        (max_len * n_heads * head_dim * 2 >= ATTN_SPLIT_WORK ||
         max_len >= 2 * ATTN_MIN_CHUNK)) {
        int want = (2 * threads + n_tiles - 1) / n_tiles;
        int per = (n_kv_heads + want - 1) / want;
        while (per < n_kv_heads && kv->dtype == DTYPE_Q8 && (per * head_dim) % KV_Q8_BLOCK)
            per++;
        kv_per = per;
    }
    int n_split = attn_parts(n_kv_heads, kv_per);
    /* Still too few tasks to share among the threads evenly, with a long sequence: cut the
     * sequences into chunks of positions instead, whose partial sums a final pass merges
     * (in another order than a tile adds them, so those rows' bits are their own). */
    if (threads > 1 && max_len >= 2 * ATTN_MIN_CHUNK &&
        (tiled ? n_tiles * n_split < threads : b->n < 4 * threads)) {
        int want = (4 * threads + b->n - 1) / b->n;
        int most = (int)(max_len / ATTN_MIN_CHUNK);
        j.n_chunks = want < most ? want : most;
        tiled = 0;
    }
    if (tiled) {
        j.tile_row = tile_row;
        j.chunk_len = (int)max_len;
        j.kv_per = kv_per;
        int e = cpu_thread_scratch_reserve(ctx, attn_rows_floats(kv, max_len) +
                                                    (size_t)ATTN_TILE * n_heads * (head_dim + 2) +
                                                    (size_t)ATTN_TILE *
                                                        (n_heads / n_kv_heads) * ATTN_BLOCK);
        if (e)
            return e;
        int n_tasks = n_tiles * n_split;
        if (threads == 1 || n_tasks == 1) {
            for (int t = 0; t < n_tasks; t++)
                attn_tile_task(&j, t, 0);
        } else {
            threadpool_run(ctx->pool, attn_tile_task, &j, n_tasks);
        }
        return 0;
    }
    j.chunk_len = (int)((max_len + j.n_chunks - 1) / j.n_chunks);
    /* Per thread: the chunk's rows and n_heads rows of chunk_len scores. */
    int e = cpu_thread_scratch_reserve(ctx, attn_rows_floats(kv, j.chunk_len) +
                                                (size_t)n_heads * j.chunk_len);
    if (e)
        return e;
    if (j.n_chunks > 1) {
        e = cpu_scratch_reserve(&ctx->shared2,
                                (size_t)b->n * j.n_chunks * n_heads * (head_dim + 2));
        if (e)
            return e;
        j.part = ctx->shared2.p;
    }
    int n_tasks = b->n * j.n_chunks;
    if (threads == 1) {
        for (int t = 0; t < n_tasks; t++)
            attn_task(&j, t, 0);
    } else {
        threadpool_run(ctx->pool, attn_task, &j, n_tasks);
    }
    if (j.n_chunks > 1)
        attn_merge(&j, b->n);
    return 0;
}
