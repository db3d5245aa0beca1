/* The matcher (a grammar bound to a vocabulary), states, and token masks.
 *
 * Building the matcher classifies, for every grammar position a stack top can sit on (a
 * CHARS element), every token as
 *   accepted   some path consumes all its bytes within the known frames (or leaves them
 *              exactly at the token's last byte): allowed in every context;
 *   rejected   every path fails within them: allowed in none;
 *   uncertain  some path leaves them with bytes to spare, and the next byte could follow
 *              (the FOLLOW set of the rule left): the unknown frames decide.
 * The known frames are the position's rule and its static context (grammar.ctx_*: the
 * frames every instance of the rule has above it, when one place calls it), so a token that
 * runs from a string's last characters through its closing quote into the next key is
 * classified, not left uncertain. The walk that classifies a position runs over the
 * vocabulary trie with the stack cut at BOUNDARY under those frames, and memoizes the sets
 * of tops it meets with their 256 successors, so each trie node costs a table look-up.
 * Positions of a repetition chain that see the same text for longer than a token (up to
 * HORIZON bytes) share one classification (grammar__chain_t).
 *
 * A mask is then, for each top of the state, the accepted set (a list, the complement of one,
 * or a bitset, whichever is smallest) and an exact check of the uncertain tokens from that
 * top, in trie order, on memoized transitions of the same kind (the state's own walker):
 * through the known frames first, then frame by frame into the real stack. Tops whose
 * classification would not be exact -- a partial UTF-8 character, or a stack deep enough
 * that GRAMMAR_MAX_DEPTH could cut a path the classification kept -- walk the trie from the
 * top on the real stacks instead. A small per-state cache of masks keyed by the set of tops
 * makes repeated states (the inside of a JSON string) cost a copy. */
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "text/grammar.h"
#include "text/grammar_internal.h"

#define NOMEM() river_err_set(RIVER_ENOMEM, "grammar: no memory")

/* Repetition chains: positions whose next HORIZON + 1 items are alike share a class even when
 * the vocabulary has longer tokens; those longer tokens are then left uncertain in that
 * class (checked exactly at mask time, on memoized transitions) rather than classified.
 * Llama 3 has ~230 tokens over 32 bytes, so a chain of any length costs at most ~34
 * classifications (about 27 walks of the whole trie, ~100 ms), and a mask inside it checks
 * those ~230 (~0.1 ms). 16 halves the first and triples the second. */
#define HORIZON 32

enum { REP_ACC, REP_NACC, REP_BITS };

typedef struct pos_class {
    uint8_t rep;
    size_t off;        /* into ids (REP_ACC, REP_NACC) or bits (REP_BITS) */
    uint32_t n;        /* ids of the list */
    size_t unc_off;    /* uncertain tokens, trie order, into ids */
    uint32_t n_unc;
    uint32_t dmax;     /* deepest top of the walk (start top: 1); > GRAMMAR_MAX_DEPTH: inexact */
    uint32_t horizon;  /* tokens longer than this many bytes are uncertain (0: none) */
    uint32_t rule;     /* whose static context the walk assumed (grammar.ctx_*) */
} pos_class_t;

struct grammar_matcher {
    const grammar_t *g;
    const grammar_vocab_t *v;
    uint32_t words;     /* mask words */
    uint32_t *cls_of;   /* [n_elem] class of each reachable CHARS position, else UINT32_MAX */
    pos_class_t *cls;
    uint32_t n_cls;
    int32_t *ids;
    size_t n_ids, cap_ids;
    uint32_t *bits;
    size_t n_bits, cap_bits;
};

/* ---- growable lists --------------------------------------------------------------------- */

static int ids_reserve(grammar_matcher_t *m, size_t extra)
{
    if (extra <= m->cap_ids - m->n_ids && m->ids)
        return 0;
    size_t cap = m->cap_ids ? m->cap_ids : 4096;
    while (cap - m->n_ids < extra)
        cap *= 2;
    int32_t *v = realloc(m->ids, cap * sizeof *v);
    if (!v)
        return NOMEM();
    m->ids = v;
    m->cap_ids = cap;
    return 0;
}

typedef struct ivec {
    int32_t *v;
    size_t n, cap;
} ivec_t;

static int ivec_add(ivec_t *x, const int32_t *src, size_t n)
{
    if (n == 0)
        return 0;
    if (n > x->cap - x->n) {
        size_t cap = x->cap ? x->cap : 1024;
        while (cap - x->n < n)
            cap *= 2;
        int32_t *v = realloc(x->v, cap * sizeof *v);
        if (!v)
            return NOMEM();
        x->v = v;
        x->cap = cap;
    }
    memcpy(x->v + x->n, src, n * sizeof *src);
    x->n += n;
    return 0;
}

/* ---- classification walks --------------------------------------------------------------- */

/* Row entries: UNKNOWN, or next set << 2 | cut << 1 | boundary. */
#define ROW_UNKNOWN UINT32_MAX

typedef struct walker {
    const grammar_t *g;
    const grammar_vocab_t *v;
    grammar__pool_t pool;
    grammar__scratch_t sc;
    grammar__tops_t tmp;
    /* Interned sets of tops: set i is data[off[i] .. off[i] + n[i]). Set 0 is empty. */
    uint32_t *data;
    size_t n_data, cap_data;
    size_t *off;
    uint32_t *n, *maxd, n_sets, cap_sets;
    uint32_t **rows;
    uint32_t *map, map_mask;
    /* Closures from a frame's position (pos → set << 2 | cut << 1 | boundary), for the
     * state's checks that follow a token out of its rule into the enclosing ones. */
    uint64_t *fmap;
    uint32_t fmask, fcount;
    /* Per trie depth. */
    uint32_t *set_at;
    uint8_t *pend, *bnd;
    ivec_t acc, unc;
    uint32_t *accbits;
} walker_t;

static uint32_t set_hash(const uint32_t *v, uint32_t n)
{
    uint64_t h = 0x9E3779B97F4A7C15ULL ^ n;
    for (uint32_t i = 0; i < n; i++)
        h = (h ^ v[i]) * 0xBF58476D1CE4E5B9ULL;
    return (uint32_t)(h ^ (h >> 31));
}

static void walker_reset_sets(walker_t *w)
{
    for (uint32_t i = 0; i < w->n_sets; i++)
        free(w->rows[i]);
    w->n_sets = 0;
    w->n_data = 0;
    if (w->map)
        memset(w->map, 0xFF, ((size_t)w->map_mask + 1) * sizeof *w->map);
    if (w->fmap)
        memset(w->fmap, 0xFF, ((size_t)w->fmask + 1) * sizeof *w->fmap);
    w->fcount = 0;
}

static void walker_free(walker_t *w)
{
    walker_reset_sets(w);
    grammar__pool_free(&w->pool);
    grammar__scratch_free(&w->sc);
    grammar__tops_free(&w->tmp);
    free(w->data);
    free(w->off);
    free(w->n);
    free(w->maxd);
    free(w->rows);
    free(w->map);
    free(w->fmap);
    free(w->set_at);
    free(w->pend);
    free(w->bnd);
    free(w->acc.v);
    free(w->unc.v);
    free(w->accbits);
}

static int set_map_grow(walker_t *w)
{
    uint32_t slots = w->map ? (w->map_mask + 1) * 2 : 1024;
    uint32_t *m = malloc(slots * sizeof *m);
    if (!m)
        return NOMEM();
    memset(m, 0xFF, slots * sizeof *m);
    for (uint32_t i = 0; i < w->n_sets; i++) {
        uint32_t h = set_hash(w->data + w->off[i], w->n[i]) & (slots - 1);
        while (m[h] != UINT32_MAX)
            h = (h + 1) & (slots - 1);
        m[h] = i;
    }
    free(w->map);
    w->map = m;
    w->map_mask = slots - 1;
    return 0;
}

/* The id of the set tops[0..n) (sorted), interned when new. */
static int set_intern(walker_t *w, const uint32_t *tops, uint32_t n, uint32_t *id)
{
    if (w->n_sets == 0 && n > 0) {
        /* Set 0 is the empty set: a row entry's 0 means "no tops". */
        uint32_t empty;
        int err = set_intern(w, NULL, 0, &empty);
        if (err)
            return err;
    }
    if (!w->map || (w->n_sets + 1) * 2 > w->map_mask + 1) {
        int err = set_map_grow(w);
        if (err)
            return err;
    }
    uint32_t h = set_hash(tops, n) & w->map_mask;
    while (w->map[h] != UINT32_MAX) {
        uint32_t s = w->map[h];
        if (w->n[s] == n && (n == 0 || memcmp(w->data + w->off[s], tops, n * sizeof *tops) == 0)) {
            *id = s;
            return 0;
        }
        h = (h + 1) & w->map_mask;
    }
    if (w->n_sets == w->cap_sets) {
        uint32_t cap = w->cap_sets ? w->cap_sets * 2 : 1024;
        size_t *o = realloc(w->off, cap * sizeof *o);
        if (!o)
            return NOMEM();
        w->off = o;
        uint32_t *nn = realloc(w->n, cap * sizeof *nn);
        if (!nn)
            return NOMEM();
        w->n = nn;
        uint32_t *md = realloc(w->maxd, cap * sizeof *md);
        if (!md)
            return NOMEM();
        w->maxd = md;
        uint32_t **r = realloc(w->rows, cap * sizeof *r);
        if (!r)
            return NOMEM();
        w->rows = r;
        w->cap_sets = cap;
    }
    if (n > w->cap_data - w->n_data || !w->data) {
        size_t cap = w->cap_data ? w->cap_data : 4096;
        while (cap - w->n_data < n)
            cap *= 2;
        uint32_t *d = realloc(w->data, cap * sizeof *d);
        if (!d)
            return NOMEM();
        w->data = d;
        w->cap_data = cap;
    }
    uint32_t s = w->n_sets++;
    w->off[s] = w->n_data;
    w->n[s] = n;
    w->rows[s] = NULL;
    uint32_t md = 0;
    for (uint32_t i = 0; i < n; i++) {
        w->data[w->n_data++] = tops[i];
        if (w->pool.node[tops[i]].depth > md)
            md = w->pool.node[tops[i]].depth;
    }
    w->maxd[s] = md;
    w->map[h] = s;
    *id = s;
    return 0;
}

/* The row entry of set s and byte b, computed when unknown. */
static int transition(walker_t *w, uint32_t s, uint8_t b, uint32_t *ent)
{
    if (!w->rows[s]) {
        w->rows[s] = malloc(256 * sizeof **w->rows);
        if (!w->rows[s])
            return NOMEM();
        memset(w->rows[s], 0xFF, 256 * sizeof **w->rows);
    }
    if (w->rows[s][b] != ROW_UNKNOWN) {
        *ent = w->rows[s][b];
        return 0;
    }
    w->sc.depth_cut = 0;
    /* The set's tops live in data, which set_intern may move: advance from a copy. */
    uint32_t n = w->n[s], stackbuf[16], *in = n <= 16 ? stackbuf : malloc(n * sizeof *in);
    if (!in)
        return NOMEM();
    memcpy(in, w->data + w->off[s], n * sizeof *in);
    int err = grammar__advance(w->g, &w->pool, &w->sc, in, n, b, &w->tmp);
    if (in != stackbuf)
        free(in);
    if (err)
        return err;
    uint32_t next = 0;
    if (w->tmp.n && (err = set_intern(w, w->tmp.v, w->tmp.n, &next)))
        return err;
    if (next >= (1u << 29))
        return river_err_set(RIVER_EFULL, "grammar: too many parse stack sets while "
                                          "classifying tokens");
    /* Returning to BOTTOM (a static context that reaches the root) leaves the known frames
     * too, into the end of the text, after which FOLLOW(root) allows no byte. */
    *ent = next << 2 | (uint32_t)w->sc.depth_cut << 1 | (w->tmp.boundary | w->tmp.accept);
    w->rows[s][b] = *ent;
    return 0;
}

static int u32_cmp(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

/* The entry (as a row's) of the closure from frame position pos with parent BOUNDARY. */
static int frame_start(walker_t *w, uint32_t pos, uint32_t *ent)
{
    if (!w->fmap || (w->fcount + 1) * 2 > w->fmask + 1) {
        uint32_t slots = w->fmap ? (w->fmask + 1) * 2 : 256;
        uint64_t *m = malloc(slots * sizeof *m);
        if (!m)
            return NOMEM();
        memset(m, 0xFF, slots * sizeof *m);
        for (uint32_t i = 0; w->fmap && i <= w->fmask; i++) {
            if (w->fmap[i] == UINT64_MAX)
                continue;
            uint32_t h = (uint32_t)((w->fmap[i] >> 32) * 0x9E3779B1u) & (slots - 1);
            while (m[h] != UINT64_MAX)
                h = (h + 1) & (slots - 1);
            m[h] = w->fmap[i];
        }
        free(w->fmap);
        w->fmap = m;
        w->fmask = slots - 1;
    }
    uint32_t h = (uint32_t)(pos * 0x9E3779B1u) & w->fmask;
    while (w->fmap[h] != UINT64_MAX) {
        if ((uint32_t)(w->fmap[h] >> 32) == pos) {
            *ent = (uint32_t)w->fmap[h];
            return 0;
        }
        h = (h + 1) & w->fmask;
    }
    w->tmp.n = 0;
    w->tmp.accept = w->tmp.boundary = 0;
    w->sc.depth_cut = 0;
    int err = grammar__close(w->g, &w->pool, &w->sc, pos, GRAMMAR__BOUNDARY, &w->tmp);
    if (err)
        return err;
    qsort(w->tmp.v, w->tmp.n, sizeof *w->tmp.v, u32_cmp);
    uint32_t set = 0;
    if (w->tmp.n && (err = set_intern(w, w->tmp.v, w->tmp.n, &set)))
        return err;
    *ent = set << 2 | (uint32_t)w->sc.depth_cut << 1 | (w->tmp.boundary | w->tmp.accept);
    w->fmap[h] = (uint64_t)pos << 32 | *ent;
    w->fcount++;
    return 0;
}

static int follows(const uint32_t *f, uint8_t b)
{
    return f[b >> 5] >> (b & 31) & 1;
}

/* The local node of a top at p under the static context of rule r: the known return frames,
 * then BOTTOM or BOUNDARY. GRAMMAR__NONE on error (*err). */
static uint32_t local_start(walker_t *w, uint32_t p, uint32_t r, int *err)
{
    const grammar_t *g = w->g;
    uint32_t node = g->ctx_end[r] ? GRAMMAR__BOTTOM : GRAMMAR__BOUNDARY;
    for (uint32_t i = g->ctx_off[r + 1]; i-- > g->ctx_off[r] && node != GRAMMAR__NONE;)
        node = grammar__pool_intern(&w->pool, g->ctx_pos[i], node, 0, err);
    return node == GRAMMAR__NONE ? node : grammar__pool_intern(&w->pool, p, node, 0, err);
}

/* Classifies every token at CHARS position p into w->acc and w->unc (trie order); with a
 * horizon, the tokens longer than it that are still alive there go to w->unc. */
static int walk_position(walker_t *w, uint32_t p, uint32_t horizon, uint32_t *dmax_out)
{
    const grammar_t *g = w->g;
    const grammar_vocab_t *v = w->v;
    uint32_t r = g->elem_rule[p];
    const uint32_t *follow = g->follow[g->ctx_follow[r]];
    int err = 0;
    w->acc.n = w->unc.n = 0;
    uint32_t start = local_start(w, p, r, &err);
    if (start == GRAMMAR__NONE)
        return err;
    uint32_t s0;
    if ((err = set_intern(w, &start, 1, &s0)))
        return err;
    uint32_t dmax = w->maxd[s0];
    int cut = 0;
    w->set_at[0] = s0;
    w->pend[0] = w->bnd[0] = 0;
    /* The first byte must start a member of p's class: skip the other root children. */
    const uint32_t *first = g->cls[GRAMMAR__EVAL(g->elem[p])].first;
    uint32_t i = 1;
    while (i < v->n_nodes) {
        uint32_t d = v->node_depth[i];
        uint8_t b = v->node_byte[i];
        if (d == 1 && !follows(first, b)) {
            i = v->node_end[i];
            continue;
        }
        int pend = w->pend[d - 1] || (w->bnd[d - 1] && follows(follow, b));
        if (horizon && d > horizon) {
            /* The parent is alive (the walk only enters live nodes). */
            err = ivec_add(&w->unc, v->sorted + v->tok_lo[i],
                           v->tok_lo[v->node_end[i]] - v->tok_lo[i]);
            if (err)
                return err;
            i = v->node_end[i];
            continue;
        }
        uint32_t ent = 0, from = w->set_at[d - 1];
        if (w->rows[from] && w->rows[from][b] != ROW_UNKNOWN)
            ent = w->rows[from][b];
        else if ((err = transition(w, from, b, &ent)))
            return err;
        uint32_t next = ent >> 2;
        int bnd = ent & 1;
        cut |= (ent >> 1) & 1;
        if (next && w->maxd[next] > dmax)
            dmax = w->maxd[next];
        uint32_t lo = v->tok_lo[i], n_here = v->tok_lo[i + 1] - lo;
        if (n_here) {
            ivec_t *to = next || bnd ? &w->acc : pend ? &w->unc : NULL;
            if (to && n_here == 1 && to->n < to->cap)
                to->v[to->n++] = v->sorted[lo];
            else if (to && (err = ivec_add(to, v->sorted + lo, n_here)))
                return err;
        }
        if (next) {
            w->set_at[d] = next;
            w->pend[d] = (uint8_t)pend;
            w->bnd[d] = (uint8_t)bnd;
            i++;
            continue;
        }
        /* Nothing goes on inside the rule below this node. */
        uint32_t end = v->node_end[i];
        if (pend) {
            err = ivec_add(&w->unc, v->sorted + v->tok_lo[i + 1],
                           v->tok_lo[end] - v->tok_lo[i + 1]);
        } else if (bnd) {
            for (uint32_t c = i + 1; c < end && !err; c = v->node_end[c])
                if (follows(follow, v->node_byte[c]))
                    err = ivec_add(&w->unc, v->sorted + v->tok_lo[c],
                                   v->tok_lo[v->node_end[c]] - v->tok_lo[c]);
        }
        if (err)
            return err;
        i = end;
    }
    *dmax_out = cut ? GRAMMAR_MAX_DEPTH + 1 : dmax;
    return 0;
}

/* Stores w's lists as class c. */
static int i32_cmp(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return x < y ? -1 : x > y;
}

static int store_class(grammar_matcher_t *m, walker_t *w, pos_class_t *c)
{
    uint32_t n_tok = (uint32_t)m->v->n_tokens;
    /* Each token sits at one trie node, so the walk lists it at most once. */
    uint32_t n_acc = (uint32_t)w->acc.n, n_nacc = n_tok - n_acc;
    int err;
    if ((size_t)n_acc <= m->words && n_acc <= n_nacc) {
        c->rep = REP_ACC;
        c->n = n_acc;
        if ((err = ids_reserve(m, n_acc)))
            return err;
        c->off = m->n_ids;
        if (n_acc) {
            memcpy(m->ids + m->n_ids, w->acc.v, n_acc * sizeof *m->ids);
            qsort(m->ids + m->n_ids, n_acc, sizeof *m->ids, i32_cmp);
        }
        m->n_ids += n_acc;
    } else {
        memset(w->accbits, 0, m->words * sizeof *w->accbits);
        for (size_t k = 0; k < w->acc.n; k++) {
            uint32_t t = (uint32_t)w->acc.v[k];
            w->accbits[t >> 5] |= 1u << (t & 31);
        }
        if ((size_t)n_nacc <= m->words) {
            c->rep = REP_NACC;
            c->n = n_nacc;
            if ((err = ids_reserve(m, n_nacc)))
                return err;
            c->off = m->n_ids;
            for (uint32_t wd = 0; wd < m->words; wd++) {
                uint32_t x = ~w->accbits[wd];
                if (wd == m->words - 1 && (n_tok & 31))
                    x &= (1u << (n_tok & 31)) - 1;
                while (x) {
                    m->ids[m->n_ids++] = (int32_t)(wd * 32 + (uint32_t)__builtin_ctz(x));
                    x &= x - 1;
                }
            }
        } else {
            c->rep = REP_BITS;
            if (m->words > m->cap_bits - m->n_bits || !m->bits) {
                size_t cap = m->cap_bits ? m->cap_bits : 4 * (size_t)m->words;
                while (cap - m->n_bits < m->words)
                    cap *= 2;
                uint32_t *b = realloc(m->bits, cap * sizeof *b);
                if (!b)
                    return NOMEM();
                m->bits = b;
                m->cap_bits = cap;
            }
            c->off = m->n_bits;
            memcpy(m->bits + m->n_bits, w->accbits, m->words * sizeof *w->accbits);
            m->n_bits += m->words;
        }
    }
    if ((err = ids_reserve(m, w->unc.n)))
        return err;
    c->unc_off = m->n_ids;
    c->n_unc = (uint32_t)w->unc.n;
    if (w->unc.n)
        memcpy(m->ids + m->n_ids, w->unc.v, w->unc.n * sizeof *w->unc.v);
    m->n_ids += w->unc.n;
    return 0;
}

/* ---- matcher ---------------------------------------------------------------------------- */

void grammar_matcher_destroy(grammar_matcher_t **mp)
{
    if (!mp || !*mp)
        return;
    grammar_matcher_t *m = *mp;
    free(m->cls_of);
    free(m->cls);
    free(m->ids);
    free(m->bits);
    free(m);
    *mp = NULL;
}

/* Alternative index (within its rule) and offset of element p. */
static void alt_of(const grammar_t *g, uint32_t p, uint32_t *alt, uint32_t *offset)
{
    uint32_t r = g->elem_rule[p], a = g->rule_alt[r], z = g->rule_alt[r + 1];
    while (z - a > 1) {
        uint32_t mid = (a + z) / 2;
        if (g->alt_start[mid] <= p)
            a = mid;
        else
            z = mid;
    }
    *alt = a - g->rule_alt[r];
    *offset = p - g->alt_start[a];
}

/* cls_of for every reachable CHARS position, sharing classes along repetition chains;
 * *horizon_of[c] (malloc'd, by class) says which classes need a horizon. A chain rule's key is
 * (min(a, T), min(a + b, T)), an unbounded b its own value T + 1; a key with a value clamped
 * to T merges rules that differ only beyond T - 1 items, which every token of at most T - 1
 * bytes cannot tell apart (each item takes a byte at least: check_chains). */
static int assign_classes(grammar_matcher_t *m, uint8_t **horizon_of)
{
    const grammar_t *g = m->g;
    uint32_t max_len = m->v->max_len;
    uint32_t T = (max_len < HORIZON ? max_len : HORIZON) + 1;
    int need_horizon = max_len >= T;
    uint32_t slots = 64;
    while (slots < 2 * g->n_rules + 2)
        slots *= 2;
    uint64_t *keys = malloc(slots * sizeof *keys);
    uint32_t *reps = malloc(slots * sizeof *reps);
    uint32_t *rep_of = malloc((g->n_rules + 1) * sizeof *rep_of);
    uint8_t *clamped = calloc(g->n_rules + 1, 1);
    uint8_t *hz = calloc(g->n_elem + 1, 1);
    m->cls_of = malloc((g->n_elem + 1) * sizeof *m->cls_of);
    if (!keys || !reps || !rep_of || !clamped || !hz || !m->cls_of) {
        free(keys), free(reps), free(rep_of), free(clamped), free(hz);
        return NOMEM();
    }
    memset(keys, 0xFF, slots * sizeof *keys);
    for (uint32_t r = 0; r < g->n_rules; r++) {
        rep_of[r] = r;
        const grammar__chain_t *c = &g->chain[r];
        if (!c->chain || !g->reachable[r])
            continue;
        uint64_t ka = c->a < T ? c->a : T;
        uint64_t ab = c->b == GRAMMAR__INF ? (uint64_t)T + 1 : (uint64_t)c->a + c->b;
        uint64_t kab = ab < T || c->b == GRAMMAR__INF ? ab : T;
        clamped[r] = need_horizon && (ka == T || kab == T);
        uint64_t key = (uint64_t)c->chain << 40 | ka << 20 | kab;
        uint32_t h = (uint32_t)((key * 0x9E3779B97F4A7C15ULL) >> 33) & (slots - 1);
        while (keys[h] != UINT64_MAX && keys[h] != key)
            h = (h + 1) & (slots - 1);
        if (keys[h] == UINT64_MAX) {
            keys[h] = key;
            reps[h] = r;
        }
        rep_of[r] = reps[h];
    }
    m->n_cls = 0;
    for (uint32_t p = 0; p < g->n_elem; p++) {
        m->cls_of[p] = UINT32_MAX;
        uint32_t r = g->elem_rule[p];
        if (GRAMMAR__ETYPE(g->elem[p]) != GRAMMAR__CHARS || !g->reachable[r])
            continue;
        if (rep_of[r] != r) {
            uint32_t alt, off;
            alt_of(g, p, &alt, &off);
            if (alt < g->chain[r].n_x) {
                uint32_t q = g->alt_start[g->rule_alt[rep_of[r]] + alt] + off;
                /* The representative was built from the same x, so q holds the same class;
                 * check anyway rather than trust it. */
                if (q < p && g->elem[q] == g->elem[p] && m->cls_of[q] != UINT32_MAX) {
                    m->cls_of[p] = m->cls_of[q];
                    continue;
                }
            }
        }
        hz[m->n_cls] = clamped[r];
        m->cls_of[p] = m->n_cls++;
    }
    free(keys);
    free(reps);
    free(rep_of);
    free(clamped);
    *horizon_of = hz;
    return 0;
}

int grammar_matcher_new(grammar_matcher_t **out, const grammar_t *g, const grammar_vocab_t *v)
{
    if (!out)
        return river_err_set(RIVER_EINVAL, "grammar_matcher_new: no output pointer");
    *out = NULL;
    if (!g || !v)
        return river_err_set(RIVER_EINVAL, "grammar_matcher_new: no grammar or vocabulary");
    int err;
    walker_t w = {.g = g, .v = v};
    uint8_t *horizon_of = NULL;
    grammar_matcher_t *m = calloc(1, sizeof *m);
    if (!m)
        return NOMEM();
    m->g = g;
    m->v = v;
    m->words = ((uint32_t)v->n_tokens + 31) / 32;
    if ((err = assign_classes(m, &horizon_of)))
        goto fail;
    m->cls = calloc(m->n_cls + 1, sizeof *m->cls);
    w.set_at = malloc((v->max_len + 2) * sizeof *w.set_at);
    w.pend = malloc(v->max_len + 2);
    w.bnd = malloc(v->max_len + 2);
    w.accbits = malloc((size_t)m->words * sizeof *w.accbits);
    if (!m->cls || !w.set_at || !w.pend || !w.bnd || !w.accbits) {
        err = NOMEM();
        goto fail;
    }
    if ((err = grammar__pool_init(&w.pool))) {
        err = NOMEM();
        goto fail;
    }
    uint32_t done = 0;
    for (uint32_t p = 0; p < g->n_elem; p++) {
        uint32_t c = m->cls_of[p];
        if (c == UINT32_MAX || c < done)
            continue;
        /* Classes are numbered in position order, so c == done here. */
        m->cls[c].horizon = horizon_of[c] ? HORIZON : 0;
        m->cls[c].rule = g->elem_rule[p];
        if ((err = walk_position(&w, p, m->cls[c].horizon, &m->cls[c].dmax)) ||
            (err = store_class(m, &w, &m->cls[c])))
            goto fail;
        done = c + 1;
        /* The memo only helps while it stays in cache; a huge grammar starts afresh (16384
         * sets hold at most 16 MiB of rows). */
        if (w.n_sets > 16384 || w.pool.n > (1u << 20)) {
            walker_reset_sets(&w);
            grammar__pool_truncate(&w.pool, 2);
        }
    }
    walker_free(&w);
    free(horizon_of);
    *out = m;
    return 0;
fail:
    walker_free(&w);
    free(horizon_of);
    grammar_matcher_destroy(&m);
    return err;
}

/* ---- states ----------------------------------------------------------------------------- */

#define CACHE_WAYS 4

/* A state's pool is compacted to the nodes its tops use once it holds this many (or four
 * times what the last compaction kept): a copy (a speculative snapshot) then costs tens of
 * KiB, not the whole history of the generation. */
#define GC_MIN 4096

typedef struct cache_entry {
    uint32_t *tops, n, cap;
    uint8_t can_end;
    uint32_t *mask;
    uint64_t used; /* 0: empty */
} cache_entry_t;

struct grammar_state {
    const grammar_matcher_t *m;
    grammar__pool_t pool;
    grammar__scratch_t sc;
    grammar__tops_t tops;
    uint8_t can_end, stopped;
    grammar__tops_t *lvl; /* [n_lvl] stacks per depth of a token */
    uint32_t n_lvl;       /* max_len + 1, at least 2 (run_bytes alternates two) */
    uint32_t *tmp_mask;
    uint32_t gc_at;
    cache_entry_t cache[CACHE_WAYS];
    uint64_t clock;
    /* Uncertain tokens are first run inside their position's rule, on transitions memoized
     * here as in the matcher's walks (so a long token costs table look-ups), and only the
     * bytes after the rule ends are run on the real stacks. */
    walker_t lw;
    uint32_t *lset;       /* [n_lvl] local set after d bytes of the token (0: none) */
    uint8_t *lcross;      /* [n_lvl] the byte that led to depth d left the rule on some path */
    uint8_t *lok;         /* [n_lvl] no set up to depth d can be cut by GRAMMAR_MAX_DEPTH */
    /* frames_ok's memo (fmemo_get): keys frame << 16 | offset, stamped with fgen. */
    uint64_t *fkey;
    uint8_t *fval;
    uint32_t *fgen_of, fmask, fcount, fgen;
};

static void cache_clear(grammar_state_t *s)
{
    for (int i = 0; i < CACHE_WAYS; i++)
        s->cache[i].used = 0;
}

void grammar_state_destroy(grammar_state_t **sp)
{
    if (!sp || !*sp)
        return;
    grammar_state_t *s = *sp;
    grammar__pool_free(&s->pool);
    grammar__scratch_free(&s->sc);
    grammar__tops_free(&s->tops);
    for (uint32_t d = 0; s->lvl && d < s->n_lvl; d++)
        grammar__tops_free(&s->lvl[d]);
    free(s->lvl);
    free(s->tmp_mask);
    walker_free(&s->lw);
    free(s->lset);
    free(s->lcross);
    free(s->lok);
    free(s->fkey);
    free(s->fval);
    free(s->fgen_of);
    for (int i = 0; i < CACHE_WAYS; i++) {
        free(s->cache[i].tops);
        free(s->cache[i].mask);
    }
    free(s);
    *sp = NULL;
}

int grammar_state_new(grammar_state_t **out, const grammar_matcher_t *m)
{
    if (!out)
        return river_err_set(RIVER_EINVAL, "grammar_state_new: no output pointer");
    *out = NULL;
    if (!m)
        return river_err_set(RIVER_EINVAL, "grammar_state_new: no matcher");
    int err;
    grammar_state_t *s = calloc(1, sizeof *s);
    if (!s)
        return NOMEM();
    s->m = m;
    s->gc_at = GC_MIN;
    s->n_lvl = m->v->max_len + 1 < 2 ? 2 : m->v->max_len + 1;
    s->lvl = calloc(s->n_lvl, sizeof *s->lvl);
    s->tmp_mask = malloc(((size_t)m->words + 1) * sizeof *s->tmp_mask);
    s->lw.g = m->g;
    s->lw.v = m->v;
    s->lset = malloc(s->n_lvl * sizeof *s->lset);
    s->lcross = malloc(s->n_lvl);
    s->lok = malloc(s->n_lvl);
    if (!s->lvl || !s->tmp_mask || !s->lset || !s->lcross || !s->lok ||
        grammar__pool_init(&s->pool) || grammar__pool_init(&s->lw.pool)) {
        err = NOMEM();
        goto fail;
    }
    if ((err = grammar__start(m->g, &s->pool, &s->sc, &s->tops)))
        goto fail;
    s->can_end = s->tops.accept;
    *out = s;
    return 0;
fail:
    grammar_state_destroy(&s);
    return err;
}

int grammar_state_copy(grammar_state_t *dst, const grammar_state_t *src)
{
    if (!dst || !src || dst->m != src->m)
        return river_err_set(RIVER_EINVAL, "grammar_state_copy: states of different matchers");
    if (dst == src)
        return 0;
    grammar__tops_t t = {0};
    for (uint32_t i = 0; i < src->tops.n; i++)
        if (grammar__tops_push(&t, src->tops.v[i])) {
            grammar__tops_free(&t);
            return NOMEM();
        }
    if (grammar__pool_copy(&dst->pool, &src->pool)) {
        grammar__tops_free(&t);
        return NOMEM();
    }
    grammar__tops_free(&dst->tops);
    dst->tops = t;
    dst->tops.accept = src->tops.accept;
    dst->can_end = src->can_end;
    dst->stopped = src->stopped;
    dst->gc_at = src->gc_at;
    cache_clear(dst);
    return 0;
}

int grammar_state_can_end(const grammar_state_t *s)
{
    return s && !s->stopped && s->can_end;
}

int grammar_state_is_done(const grammar_state_t *s)
{
    return s && (s->stopped || (s->can_end && s->tops.n == 0));
}

uint64_t grammar__state_min_remaining(const grammar_state_t *s)
{
    if (s->stopped || s->can_end)
        return 0;
    uint64_t best = UINT64_MAX;
    for (uint32_t i = 0; i < s->tops.n; i++) {
        uint64_t c = grammar__min_remaining(s->m->g, &s->pool, s->tops.v[i]);
        if (c < best)
            best = c;
    }
    return best;
}

/* Advances tops over bytes into s->lvl; on success the result is in *res (one of s->lvl).
 * Returns RIVER_EINVAL (no detail) when the bytes do not continue the text. */
static int run_bytes(grammar_state_t *s, const uint32_t *tops, uint32_t n, const uint8_t *b,
                     size_t len, grammar__tops_t **res)
{
    const grammar_t *g = s->m->g;
    grammar__tops_t *cur = NULL;
    /* Two buffers alternate: lvl[0] and lvl[1] (max_len >= 1 whenever len > 0). */
    for (size_t i = 0; i < len; i++) {
        grammar__tops_t *next = &s->lvl[i & 1];
        const uint32_t *in = cur ? cur->v : tops;
        uint32_t nin = cur ? cur->n : n;
        int err = grammar__advance(g, &s->pool, &s->sc, in, nin, b[i], next);
        if (err)
            return err;
        if (next->n == 0 && !(next->accept && i + 1 == len))
            return RIVER_EINVAL;
        cur = next;
    }
    *res = cur;
    return 0;
}

static int maybe_gc(grammar_state_t *s)
{
    if (s->pool.n < s->gc_at)
        return 0;
    int err = grammar__pool_compact(&s->pool, s->tops.v, s->tops.n);
    if (err)
        return 0; /* keeping the garbage is correct, only bigger */
    cache_clear(s);
    s->gc_at = s->pool.n * 4 > GC_MIN ? s->pool.n * 4 : GC_MIN;
    return 0;
}

int grammar_state_accept_bytes(grammar_state_t *s, const char *bytes, size_t len)
{
    if (!s || (!bytes && len))
        return river_err_set(RIVER_EINVAL, "grammar_state_accept_bytes: invalid argument");
    if (len == 0)
        return 0;
    if (s->stopped)
        return river_err_set(RIVER_EINVAL, "grammar: bytes after the stop token");
    uint32_t mark = s->pool.n;
    grammar__tops_t *res = NULL;
    int err = run_bytes(s, s->tops.v, s->tops.n, (const uint8_t *)bytes, len, &res);
    if (err) {
        grammar__pool_truncate(&s->pool, mark);
        if (err == RIVER_EINVAL)
            return river_err_set(RIVER_EINVAL, "grammar: the bytes do not continue the text");
        return err;
    }
    grammar__tops_t t = s->tops;
    s->tops = *res;
    *res = t;
    s->can_end = s->tops.accept;
    return maybe_gc(s);
}

int grammar_state_accept(grammar_state_t *s, int32_t token)
{
    if (!s)
        return river_err_set(RIVER_EINVAL, "grammar_state_accept: no state");
    const grammar_vocab_t *v = s->m->v;
    if (token < 0 || token >= v->n_tokens)
        return river_err_set(RIVER_ERANGE, "grammar: token %d outside the vocabulary of %d",
                             (int)token, v->n_tokens);
    if (v->stop[token]) {
        if (s->stopped || !s->can_end)
            return river_err_set(RIVER_EINVAL, "grammar: stop token %d before the grammar "
                                               "may end",
                                 (int)token);
        s->stopped = 1;
        return 0;
    }
    if (v->len[token] == 0)
        return river_err_set(RIVER_EINVAL, "grammar: token %d has no bytes and is never "
                                           "allowed",
                             (int)token);
    int err = grammar_state_accept_bytes(s, v->bytes + v->off[token], v->len[token]);
    if (err == RIVER_EINVAL)
        river_err_set(err, "grammar: token %d is not allowed here", (int)token);
    return err;
}

/* ---- masks ------------------------------------------------------------------------------ */

static inline void bit_set(uint32_t *m, uint32_t t)
{
    m[t >> 5] |= 1u << (t & 31);
}

static inline int bit_get(const uint32_t *m, uint32_t t)
{
    return m[t >> 5] >> (t & 31) & 1;
}

/* Every token reachable from top (exactly), by a walk of the trie. */
static int mask_walk(grammar_state_t *s, uint32_t top, uint32_t *mask)
{
    const grammar_vocab_t *v = s->m->v;
    const grammar_t *g = s->m->g;
    grammar__tops_t *lvl = s->lvl;
    lvl[0].n = 0;
    int err = grammar__tops_push(&lvl[0], top);
    if (err)
        return err;
    uint32_t i = 1;
    while (i < v->n_nodes) {
        uint32_t d = v->node_depth[i];
        if ((err = grammar__advance(g, &s->pool, &s->sc, lvl[d - 1].v, lvl[d - 1].n,
                                    v->node_byte[i], &lvl[d])))
            return err;
        if (lvl[d].n || lvl[d].accept)
            for (uint32_t k = v->tok_lo[i]; k < v->tok_lo[i + 1]; k++)
                bit_set(mask, (uint32_t)v->sorted[k]);
        i = lvl[d].n ? i + 1 : v->node_end[i];
    }
    return 0;
}

/* 1 when bytes b[0..len) continue the real stacks tops[0..n); negative on error. */
static int real_ok(grammar_state_t *s, const uint32_t *tops, uint32_t n, const uint8_t *b,
                   size_t len)
{
    grammar__tops_t *res;
    int err = run_bytes(s, tops, n, b, len, &res);
    return err == RIVER_EINVAL ? 0 : err ? err : 1;
}

/* Results of frames_ok for the token being checked, by (frame, offset): without them a
 * token that can leave many nested frames at many of its bytes would be searched along
 * every split of its bytes among them. Reset per token by bumping gen. */
static int fmemo_get(grammar_state_t *s, uint32_t frame, uint32_t at, int *val)
{
    if (!s->fkey)
        return 0;
    uint64_t key = (uint64_t)frame << 16 | at;
    for (uint32_t h = (uint32_t)((key * 0x9E3779B97F4A7C15ULL) >> 40) & s->fmask;
         s->fgen_of[h] == s->fgen; h = (h + 1) & s->fmask)
        if (s->fkey[h] == key) {
            *val = s->fval[h];
            return 1;
        }
    return 0;
}

static int fmemo_put(grammar_state_t *s, uint32_t frame, uint32_t at, int val)
{
    if (!s->fkey || (s->fcount + 1) * 2 > s->fmask + 1) {
        uint32_t slots = s->fkey ? (s->fmask + 1) * 2 : 256;
        uint64_t *k = malloc(slots * sizeof *k);
        uint8_t *v = malloc(slots);
        uint32_t *g = calloc(slots, sizeof *g);
        if (!k || !v || !g) {
            free(k), free(v), free(g);
            return NOMEM();
        }
        for (uint32_t i = 0; s->fkey && i <= s->fmask; i++) {
            if (s->fgen_of[i] != s->fgen)
                continue;
            uint32_t h = (uint32_t)((s->fkey[i] * 0x9E3779B97F4A7C15ULL) >> 40) & (slots - 1);
            while (g[h] == s->fgen)
                h = (h + 1) & (slots - 1);
            k[h] = s->fkey[i], v[h] = s->fval[i], g[h] = s->fgen;
        }
        free(s->fkey), free(s->fval), free(s->fgen_of);
        s->fkey = k, s->fval = v, s->fgen_of = g, s->fmask = slots - 1;
    }
    uint64_t key = (uint64_t)frame << 16 | at;
    uint32_t h = (uint32_t)((key * 0x9E3779B97F4A7C15ULL) >> 40) & s->fmask;
    while (s->fgen_of[h] == s->fgen)
        h = (h + 1) & s->fmask;
    s->fkey[h] = key, s->fval[h] = (uint8_t)val, s->fgen_of[h] = s->fgen;
    s->fcount++;
    return 0;
}

static void fmemo_reset(grammar_state_t *s)
{
    s->fcount = 0;
    if (++s->fgen == 0) {
        if (s->fgen_of)
            memset(s->fgen_of, 0, ((size_t)s->fmask + 1) * sizeof *s->fgen_of);
        s->fgen = 1;
    }
}

enum { FRAMES_NO = 0, FRAMES_YES = 1, FRAMES_INEXACT = 2 };

/* Whether the token's bytes b[at..len) continue the text once a path returned to the real
 * node `frame` (continuing at its position, its parent next): a walk of memoized local
 * transitions in the frame's rule, which recurses into the next frame where a path leaves
 * that rule too. FRAMES_INEXACT where GRAMMAR_MAX_DEPTH could cut what the local walk kept.
 * The recursion follows the real stack, at most GRAMMAR_MAX_DEPTH frames deep. */
static int frames_ok(grammar_state_t *s, uint32_t frame, const uint8_t *b, uint32_t len,
                     uint32_t at)
{
    if (frame == GRAMMAR__BOTTOM)
        return at == len ? FRAMES_YES : FRAMES_NO; /* the text is complete */
    int r;
    if (fmemo_get(s, frame, at, &r))
        return r;
    walker_t *w = &s->lw;
    const grammar_t *g = s->m->g;
    grammar__node_t f = s->pool.node[frame];
    const uint32_t *follow = g->follow[g->elem_rule[f.pos]];
    uint32_t allowed = GRAMMAR_MAX_DEPTH + 1 - f.depth, ent;
    int err = frame_start(w, f.pos, &ent);
    if (err)
        return err;
    uint32_t set = ent >> 2;
    r = FRAMES_NO;
    if ((ent & 2) || (set && w->maxd[set] > allowed)) {
        r = FRAMES_INEXACT;
        goto done;
    }
    if ((ent & 1) && (at == len || follows(follow, b[at])) &&
        (r = frames_ok(s, f.parent, b, len, at)) != FRAMES_NO)
        goto done;
    for (uint32_t d = at; d < len && set; d++) {
        if ((err = transition(w, set, b[d], &ent)))
            return err;
        set = ent >> 2;
        if ((ent & 2) || (set && w->maxd[set] > allowed)) {
            r = FRAMES_INEXACT;
            goto done;
        }
        if ((ent & 1) && (d + 1 == len || follows(follow, b[d + 1]))) {
            if ((r = frames_ok(s, f.parent, b, len, d + 1)) < 0)
                return r;
            if (r != FRAMES_NO)
                goto done;
        }
    }
    r = set ? FRAMES_YES : FRAMES_NO;
done:
    if (r >= 0 && (err = fmemo_put(s, frame, at, r)))
        return err;
    return r;
}

/* The uncertain tokens of class c from top, each checked exactly: first inside the top's
 * rule (the local walk, memoized in s->lw), then, from each byte where a path leaves the
 * rule and FOLLOW allows the next byte, in the frames the rule returns to (frames_ok). */
static int mask_uncertain(grammar_state_t *s, uint32_t top, const pos_class_t *c, uint32_t *mask)
{
    const grammar_matcher_t *m = s->m;
    const grammar_vocab_t *v = m->v;
    const grammar_t *g = m->g;
    walker_t *w = &s->lw;
    grammar__node_t nd = s->pool.node[top];
    const uint32_t *follow = g->follow[g->ctx_follow[c->rule]];
    uint32_t n_ctx = g->ctx_off[c->rule + 1] - g->ctx_off[c->rule];
    /* A local depth r is the real depth nd.depth - n_ctx - 1 + r (exact_here holds). */
    uint32_t allowed = GRAMMAR_MAX_DEPTH + n_ctx + 1 - nd.depth;
    /* The real frame past the known ones (exact_here checked they are the known ones). */
    uint32_t beyond = nd.parent;
    for (uint32_t i = 0; i < n_ctx; i++)
        beyond = s->pool.node[beyond].parent;
    int err = 0;
    uint32_t start = local_start(w, nd.pos, c->rule, &err);
    if (start == GRAMMAR__NONE)
        return err;
    if ((err = set_intern(w, &start, 1, &s->lset[0])))
        return err;
    s->lcross[0] = 0;
    s->lok[0] = w->maxd[s->lset[0]] <= allowed;
    const uint8_t *prev = NULL;
    uint32_t prev_len = 0, valid = 0; /* lset[0..valid] hold prev's prefixes */
    uint32_t dead = UINT32_MAX;       /* prev's local walk died there, with no exit before */
    int prev_ok = 0;
    const int32_t *list = m->ids + c->unc_off;
    for (uint32_t k = 0; k < c->n_unc; k++) {
        uint32_t t = (uint32_t)list[k];
        if (bit_get(mask, t))
            continue;
        const uint8_t *b = (const uint8_t *)v->bytes + v->off[t];
        uint32_t len = v->len[t], lcp = 0;
        uint32_t lim = prev ? (prev_len < len ? prev_len : len) : 0;
        if (lim > valid)
            lim = valid;
        while (lcp < lim && b[lcp] == prev[lcp])
            lcp++;
        if (lcp == len && len == prev_len) {
            /* The same bytes as the token before (two ids for one string). */
            if (prev_ok)
                bit_set(mask, t);
            continue;
        }
        if (dead != UINT32_MAX && lcp >= dead)
            continue; /* shares a prefix that died inside the rule and never left it */
        uint32_t d = lcp;
        for (; d < len && s->lset[d]; d++) {
            uint32_t ent = 0;
            if ((err = transition(w, s->lset[d], b[d], &ent)))
                return err;
            uint32_t next = ent >> 2;
            s->lset[d + 1] = next;
            s->lcross[d + 1] = ent & 1;
            s->lok[d + 1] = s->lok[d] && !(ent & 2) && (!next || w->maxd[next] <= allowed);
        }
        for (; d < len; d++) {
            s->lset[d + 1] = 0;
            s->lcross[d + 1] = 0;
            s->lok[d + 1] = s->lok[d];
        }
        prev = b;
        prev_len = len;
        valid = len;
        int ok;
        fmemo_reset(s);
        if (!s->lok[len]) {
            /* Near GRAMMAR_MAX_DEPTH the local walk may keep what the real one cuts. */
            if ((ok = real_ok(s, &top, 1, b, len)) < 0)
                return ok;
        } else {
            ok = s->lset[len] != 0 || s->lcross[len];
            for (uint32_t j = 1; j < len && !ok; j++) {
                if (!s->lcross[j] || !follows(follow, b[j]))
                    continue;
                if ((ok = frames_ok(s, beyond, b, len, j)) < 0)
                    return ok;
                if (ok == FRAMES_INEXACT && (ok = real_ok(s, &top, 1, b, len)) < 0)
                    return ok;
            }
        }
        /* Where the local walk died, and whether it left the rule before. */
        dead = UINT32_MAX;
        for (uint32_t j = 1; j <= len; j++) {
            if (s->lcross[j])
                break;
            if (!s->lset[j]) {
                dead = j;
                break;
            }
        }
        prev_ok = ok;
        if (ok)
            bit_set(mask, t);
    }
    /* The memo is worth keeping while it stays small: 4096 sets hold at most 4 MiB of rows. */
    if (w->n_sets > 4096 || w->pool.n > (1u << 18)) {
        walker_reset_sets(w);
        grammar__pool_truncate(&w->pool, 2);
    }
    return 0;
}

static void apply_class(const grammar_matcher_t *m, const pos_class_t *c, uint32_t *mask,
                        uint32_t *tmp, int first)
{
    const int32_t *list = m->ids + c->off;
    uint32_t words = m->words;
    switch (c->rep) {
    case REP_ACC:
        for (uint32_t k = 0; k < c->n; k++)
            bit_set(mask, (uint32_t)list[k]);
        break;
    case REP_NACC: {
        uint32_t *dst = first ? mask : tmp;
        memset(dst, 0xFF, words * sizeof *dst);
        uint32_t n_tok = (uint32_t)m->v->n_tokens;
        if (n_tok & 31)
            dst[words - 1] = (1u << (n_tok & 31)) - 1;
        for (uint32_t k = 0; k < c->n; k++)
            dst[(uint32_t)list[k] >> 5] &= ~(1u << ((uint32_t)list[k] & 31));
        if (!first)
            for (uint32_t w = 0; w < words; w++)
                mask[w] |= tmp[w];
        break;
    }
    default: {
        const uint32_t *bits = m->bits + c->off;
        for (uint32_t w = 0; w < words; w++)
            mask[w] |= bits[w];
        break;
    }
    }
}

/* Whether class c is exact for this top: no partial character, the frames above it are the
 * static context the walk assumed (they always are; checked rather than trusted), and no
 * path of a token can reach GRAMMAR_MAX_DEPTH (the walk's deepest node, or a closure in the
 * unknown frame). The walk's depths count from under the static context. */
static int exact_here(const grammar_state_t *s, const pos_class_t *c, uint32_t top)
{
    const grammar_t *g = s->m->g;
    const grammar__node_t *nd = &s->pool.node[top];
    uint32_t n_ctx = g->ctx_off[c->rule + 1] - g->ctx_off[c->rule];
    int64_t base = (int64_t)nd->depth - n_ctx - 1;
    uint32_t reach = c->dmax > g->max_push ? c->dmax : g->max_push;
    if (nd->aux || base < 0 || base + reach > GRAMMAR_MAX_DEPTH)
        return 0;
    uint32_t f = nd->parent;
    for (uint32_t i = 0; i < n_ctx; i++, f = s->pool.node[f].parent)
        if (f <= GRAMMAR__BOUNDARY || s->pool.node[f].pos != g->ctx_pos[g->ctx_off[c->rule] + i])
            return 0;
    return !g->ctx_end[c->rule] || f == GRAMMAR__BOTTOM;
}

static int mask_compute(grammar_state_t *s, uint32_t *mask)
{
    const grammar_matcher_t *m = s->m;
    memset(mask, 0, m->words * sizeof *mask);
    if (s->stopped)
        return 0;
    int err = 0;
    /* Classes first (the first one may write the mask whole), then the exact checks. */
    int first = 1;
    for (uint32_t i = 0; i < s->tops.n; i++) {
        const grammar__node_t *nd = &s->pool.node[s->tops.v[i]];
        const pos_class_t *c = &m->cls[m->cls_of[nd->pos]];
        if (!exact_here(s, c, s->tops.v[i]))
            continue;
        apply_class(m, c, mask, s->tmp_mask, first);
        first = 0;
    }
    for (uint32_t i = 0; i < s->tops.n && !err; i++) {
        uint32_t top = s->tops.v[i];
        const grammar__node_t *nd = &s->pool.node[top];
        const pos_class_t *c = &m->cls[m->cls_of[nd->pos]];
        if (!exact_here(s, c, top))
            err = mask_walk(s, top, mask);
        else
            err = mask_uncertain(s, top, c, mask);
    }
    if (err)
        return err;
    if (s->can_end)
        for (int i = 0; i < m->v->n_stop; i++)
            bit_set(mask, (uint32_t)m->v->stop_ids[i]);
    return 0;
}

int grammar_state_mask(grammar_state_t *s, uint32_t *allowed)
{
    if (!s || !allowed)
        return river_err_set(RIVER_EINVAL, "grammar_state_mask: invalid argument");
    const grammar_matcher_t *m = s->m;
    size_t bytes = m->words * sizeof *allowed;
    /* A state seen lately: the same tops give the same mask. */
    for (int i = 0; i < CACHE_WAYS; i++) {
        cache_entry_t *e = &s->cache[i];
        if (e->used && e->n == s->tops.n && e->can_end == s->can_end && !s->stopped &&
            (s->tops.n == 0 || memcmp(e->tops, s->tops.v, s->tops.n * sizeof *e->tops) == 0)) {
            memcpy(allowed, e->mask, bytes);
            e->used = ++s->clock;
            return 0;
        }
    }
    uint32_t mark = s->pool.n;
    int err = mask_compute(s, allowed);
    grammar__pool_truncate(&s->pool, mark);
    if (err)
        return err;
    if (s->stopped)
        return 0;
    cache_entry_t *e = &s->cache[0];
    for (int i = 1; i < CACHE_WAYS; i++)
        if (s->cache[i].used < e->used)
            e = &s->cache[i];
    if (!e->mask && !(e->mask = malloc(bytes)))
        return 0; /* no cache is slower, not wrong */
    if (e->cap < s->tops.n) {
        uint32_t *t = realloc(e->tops, s->tops.n * sizeof *t);
        if (!t)
            return 0;
        e->tops = t;
        e->cap = s->tops.n;
    }
    if (s->tops.n)
        memcpy(e->tops, s->tops.v, s->tops.n * sizeof *e->tops);
    e->n = s->tops.n;
    e->can_end = s->can_end;
    memcpy(e->mask, allowed, bytes);
    e->used = ++s->clock;
    return 0;
}
