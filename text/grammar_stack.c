/* Parse stacks: the hash-consed node pool, and the two moves of the matcher, closure (from
 * "continue at element pos" to the CHARS tops it can reach without a byte) and advance (one
 * byte from a set of tops).
 *
 * A top's aux holds a character that a byte began but did not finish, so that a token may
 * end in the middle of a UTF-8 sequence:
 *     aux = acc << 5 | len << 2 | rem
 * rem (1..3): continuation bytes still to come; len (2..4): bytes of the whole sequence; acc:
 * the code point bits so far. A partial character is kept only when some member of the
 * class starts with those bytes, so a dead end is seen at the byte that makes it one. */
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "text/grammar.h"
#include "text/grammar_internal.h"

/* Nodes one pool may hold: well above what any grammar needs between two compactions, and
 * small enough that a runaway grammar fails before it takes the machine's memory. */
#define POOL_MAX (1u << 23)

/* ---- pool ------------------------------------------------------------------------------- */

static uint32_t node_hash(uint32_t pos, uint32_t parent, uint32_t aux)
{
    uint64_t h = ((uint64_t)pos << 32 | parent) * 0x9E3779B97F4A7C15ULL;
    h ^= (uint64_t)aux * 0xC2B2AE3D27D4EB4FULL;
    h ^= h >> 29;
    return (uint32_t)h;
}

/* Fills a fresh bucket table with every node. Inserting in id order keeps every chain newest
 * first, which truncation relies on. */
static void pool_fill(grammar__pool_t *p, uint32_t *head, uint32_t buckets)
{
    memset(head, 0xFF, buckets * sizeof *head);
    for (uint32_t id = 2; id < p->n; id++) {
        const grammar__node_t *nd = &p->node[id];
        uint32_t h = node_hash(nd->pos, nd->parent, nd->aux) & (buckets - 1);
        p->next[id] = head[h];
        head[h] = id;
    }
    free(p->head);
    p->head = head;
    p->mask = buckets - 1;
}

static int pool_rehash(grammar__pool_t *p, uint32_t buckets)
{
    uint32_t *head = malloc(buckets * sizeof *head);
    if (!head)
        return RIVER_ENOMEM;
    pool_fill(p, head, buckets);
    return 0;
}

int grammar__pool_init(grammar__pool_t *p)
{
    memset(p, 0, sizeof *p);
    p->cap = 1024;
    p->node = malloc(p->cap * sizeof *p->node);
    p->next = malloc(p->cap * sizeof *p->next);
    if (!p->node || !p->next) {
        grammar__pool_free(p);
        return RIVER_ENOMEM;
    }
    for (int i = 0; i < 2; i++) {
        p->node[i] = (grammar__node_t){UINT32_MAX, UINT32_MAX, 0, 0};
        p->next[i] = UINT32_MAX;
    }
    p->n = 2;
    if (pool_rehash(p, 1024)) {
        grammar__pool_free(p);
        return RIVER_ENOMEM;
    }
    return 0;
}

void grammar__pool_free(grammar__pool_t *p)
{
    free(p->node);
    free(p->next);
    free(p->head);
    memset(p, 0, sizeof *p);
}

void grammar__pool_truncate(grammar__pool_t *p, uint32_t n)
{
    while (p->n > n && p->n > 2) {
        uint32_t id = --p->n;
        const grammar__node_t *nd = &p->node[id];
        uint32_t h = node_hash(nd->pos, nd->parent, nd->aux) & p->mask;
        /* The newest node heads its chain. */
        p->head[h] = p->next[id];
    }
}

int grammar__pool_copy(grammar__pool_t *dst, const grammar__pool_t *src)
{
    /* Rollbacks copy often: reuse dst's arrays when they are big enough. */
    size_t buckets = (size_t)src->mask + 1;
    if (dst->cap < src->n || dst->mask != src->mask || !dst->node) {
        grammar__pool_t t = {0};
        t.cap = src->cap;
        t.node = malloc(t.cap * sizeof *t.node);
        t.next = malloc(t.cap * sizeof *t.next);
        t.head = malloc(buckets * sizeof *t.head);
        if (!t.node || !t.next || !t.head) {
            grammar__pool_free(&t);
            return RIVER_ENOMEM;
        }
        t.mask = src->mask;
        grammar__pool_free(dst);
        *dst = t;
    }
    memcpy(dst->node, src->node, src->n * sizeof *dst->node);
    memcpy(dst->next, src->next, src->n * sizeof *dst->next);
    memcpy(dst->head, src->head, buckets * sizeof *dst->head);
    dst->n = src->n;
    return 0;
}

uint32_t grammar__pool_intern(grammar__pool_t *p, uint32_t pos, uint32_t parent, uint32_t aux,
                              int *err)
{
    uint32_t h = node_hash(pos, parent, aux) & p->mask;
    for (uint32_t id = p->head[h]; id != UINT32_MAX; id = p->next[id]) {
        const grammar__node_t *nd = &p->node[id];
        if (nd->pos == pos && nd->parent == parent && nd->aux == aux)
            return id;
    }
    if (p->n >= POOL_MAX) {
        *err = river_err_set(RIVER_EFULL, "grammar: more than %u parse stack nodes",
                             (unsigned)POOL_MAX);
        return GRAMMAR__NONE;
    }
    if (p->n == p->cap) {
        uint32_t cap = p->cap * 2;
        grammar__node_t *nv = realloc(p->node, cap * sizeof *nv);
        if (!nv)
            goto nomem;
        p->node = nv;
        uint32_t *xv = realloc(p->next, cap * sizeof *xv);
        if (!xv)
            goto nomem;
        p->next = xv;
        p->cap = cap;
    }
    uint32_t id = p->n++;
    p->node[id] = (grammar__node_t){pos, parent, aux, p->node[parent].depth + 1};
    if (p->n > p->mask + 1) {
        if (pool_rehash(p, (p->mask + 1) * 2)) {
            p->n--;
            goto nomem;
        }
        return id;
    }
    p->next[id] = p->head[h];
    p->head[h] = id;
    return id;
nomem:
    *err = river_err_set(RIVER_ENOMEM, "grammar: no memory for parse stacks");
    return GRAMMAR__NONE;
}

int grammar__pool_compact(grammar__pool_t *p, uint32_t *ids, uint32_t n_ids)
{
    uint32_t *map = malloc((size_t)p->n * sizeof *map);
    if (!map)
        return RIVER_ENOMEM;
    memset(map, 0xFF, (size_t)p->n * sizeof *map);
    map[0] = 0;
    map[1] = 1;
    uint32_t live = 2;
    for (uint32_t i = 0; i < n_ids; i++)
        for (uint32_t id = ids[i]; map[id] == UINT32_MAX; id = p->node[id].parent) {
            map[id] = 0; /* marked; numbered below */
            live++;
        }
    uint32_t buckets = 1024;
    while (buckets < live)
        buckets *= 2;
    uint32_t *head = malloc(buckets * sizeof *head);
    if (!head) {
        free(map);
        return RIVER_ENOMEM;
    }
    /* Parents have smaller ids than their children, so numbering in id order keeps that. */
    uint32_t n = 2;
    for (uint32_t id = 2; id < p->n; id++) {
        if (map[id] == UINT32_MAX)
            continue;
        map[id] = n;
        grammar__node_t nd = p->node[id];
        nd.parent = map[nd.parent];
        p->node[n++] = nd;
    }
    for (uint32_t i = 0; i < n_ids; i++)
        ids[i] = map[ids[i]];
    free(map);
    p->n = n;
    pool_fill(p, head, buckets);
    return 0;
}

/* ---- tops and scratch ------------------------------------------------------------------- */

int grammar__tops_push(grammar__tops_t *t, uint32_t id)
{
    int err = grammar__room((void **)&t->v, t->n + 1, &t->cap, sizeof *t->v, 16);
    if (err)
        return err;
    t->v[t->n++] = id;
    return 0;
}

void grammar__tops_free(grammar__tops_t *t)
{
    free(t->v);
    memset(t, 0, sizeof *t);
}

void grammar__scratch_free(grammar__scratch_t *sc)
{
    free(sc->vkey);
    free(sc->vstamp);
    free(sc->work);
    memset(sc, 0, sizeof *sc);
}

static void visit_reset(grammar__scratch_t *sc)
{
    sc->vcount = 0;
    if (++sc->stamp == 0) {
        /* The stamp wrapped: old marks could read as current. */
        if (sc->vstamp)
            memset(sc->vstamp, 0, ((size_t)sc->vmask + 1) * sizeof *sc->vstamp);
        sc->stamp = 1;
    }
}

static int visit_grow(grammar__scratch_t *sc)
{
    uint32_t slots = sc->vkey ? (sc->vmask + 1) * 2 : 256;
    uint64_t *k = malloc(slots * sizeof *k);
    uint32_t *s = calloc(slots, sizeof *s);
    if (!k || !s) {
        free(k);
        free(s);
        return river_err_set(RIVER_ENOMEM, "grammar: no memory for parse stacks");
    }
    for (uint32_t i = 0; sc->vkey && i <= sc->vmask; i++) {
        if (sc->vstamp[i] != sc->stamp)
            continue;
        uint64_t key = sc->vkey[i];
        uint32_t h = (uint32_t)((key * 0x9E3779B97F4A7C15ULL) >> 32) & (slots - 1);
        while (s[h] == sc->stamp)
            h = (h + 1) & (slots - 1);
        k[h] = key;
        s[h] = sc->stamp;
    }
    free(sc->vkey);
    free(sc->vstamp);
    sc->vkey = k;
    sc->vstamp = s;
    sc->vmask = slots - 1;
    return 0;
}

/* 1 when (pos, parent) was visited since the last reset, else marks it and returns 0;
 * negative on error. */
static int visit(grammar__scratch_t *sc, uint32_t pos, uint32_t parent)
{
    if (!sc->vkey || (sc->vcount + 1) * 2 > sc->vmask + 1) {
        int err = visit_grow(sc);
        if (err)
            return err;
    }
    uint64_t key = (uint64_t)pos << 32 | parent;
    uint32_t h = (uint32_t)((key * 0x9E3779B97F4A7C15ULL) >> 32) & sc->vmask;
    while (sc->vstamp[h] == sc->stamp) {
        if (sc->vkey[h] == key)
            return 1;
        h = (h + 1) & sc->vmask;
    }
    sc->vkey[h] = key;
    sc->vstamp[h] = sc->stamp;
    sc->vcount++;
    return 0;
}

static int work_push(grammar__scratch_t *sc, uint32_t pos, uint32_t parent)
{
    int err = grammar__room((void **)&sc->work, sc->n_work + 2, &sc->cap_work, sizeof *sc->work,
                            64);
    if (err)
        return err;
    sc->work[sc->n_work++] = pos;
    sc->work[sc->n_work++] = parent;
    return 0;
}

/* ---- closure ---------------------------------------------------------------------------- */

static int too_many(const grammar_t *g, uint32_t pos)
{
    return river_err_set(RIVER_EFULL,
                         "grammar: more than %d parse stacks at once (rule \"%s\" is too "
                         "ambiguous)",
                         GRAMMAR_MAX_STACKS, grammar__rule_name(g, g->elem_rule[pos]));
}

static int close_from(const grammar_t *g, grammar__pool_t *p, grammar__scratch_t *sc,
                      uint32_t pos, uint32_t parent, grammar__tops_t *out)
{
    int err = work_push(sc, pos, parent);
    while (!err && sc->n_work) {
        uint32_t par = sc->work[--sc->n_work];
        uint32_t q = sc->work[--sc->n_work];
        int seen = visit(sc, q, par);
        if (seen < 0) {
            err = seen;
            break;
        }
        if (seen)
            continue;
        uint32_t e = g->elem[q];
        switch (GRAMMAR__ETYPE(e)) {
        case GRAMMAR__END:
            if (par == GRAMMAR__BOTTOM)
                out->accept = 1;
            else if (par == GRAMMAR__BOUNDARY)
                out->boundary = 1;
            else
                err = work_push(sc, p->node[par].pos, p->node[par].parent);
            break;
        case GRAMMAR__CHARS: {
            uint32_t depth = p->node[par].depth + 1;
            if (depth > GRAMMAR_MAX_DEPTH) {
                sc->depth_cut = 1;
                break;
            }
            uint32_t id = grammar__pool_intern(p, q, par, 0, &err);
            if (id == GRAMMAR__NONE)
                break;
            if (depth > sc->max_depth)
                sc->max_depth = depth;
            if (out->n >= GRAMMAR_MAX_STACKS) {
                err = too_many(g, q);
                break;
            }
            err = grammar__tops_push(out, id);
            break;
        }
        default: {
            uint32_t s = GRAMMAR__EVAL(e), ret = par;
            if (GRAMMAR__ETYPE(g->elem[q + 1]) != GRAMMAR__END) {
                uint32_t depth = p->node[par].depth + 1;
                if (depth > GRAMMAR_MAX_DEPTH) {
                    sc->depth_cut = 1;
                    break;
                }
                ret = grammar__pool_intern(p, q + 1, par, 0, &err);
                if (ret == GRAMMAR__NONE)
                    break;
                if (depth > sc->max_depth)
                    sc->max_depth = depth;
            }
            for (uint32_t a = g->rule_alt[s + 1]; a-- > g->rule_alt[s] && !err;)
                err = work_push(sc, g->alt_start[a], ret);
            break;
        }
        }
    }
    sc->n_work = 0;
    return err;
}

int grammar__close(const grammar_t *g, grammar__pool_t *p, grammar__scratch_t *sc, uint32_t pos,
                   uint32_t parent, grammar__tops_t *out)
{
    visit_reset(sc);
    return close_from(g, p, sc, pos, parent, out);
}

static void sort_unique(grammar__tops_t *t)
{
    if (t->n < 2)
        return;
    /* Shell sort (Ciura's gaps): no allocation, and fast on the few hundred ids of even
     * ambiguous sets; most sets are a handful. */
    static const uint32_t gaps[] = {701, 301, 132, 57, 23, 10, 4, 1};
    for (size_t gi = 0; gi < sizeof gaps / sizeof *gaps; gi++) {
        uint32_t gap = gaps[gi];
        for (uint32_t i = gap; i < t->n; i++) {
            uint32_t x = t->v[i], j = i;
            while (j >= gap && t->v[j - gap] > x) {
                t->v[j] = t->v[j - gap];
                j -= gap;
            }
            t->v[j] = x;
        }
    }
    uint32_t k = 1;
    for (uint32_t i = 1; i < t->n; i++)
        if (t->v[i] != t->v[k - 1])
            t->v[k++] = t->v[i];
    t->n = k;
}

int grammar__start(const grammar_t *g, grammar__pool_t *p, grammar__scratch_t *sc,
                   grammar__tops_t *out)
{
    out->n = 0;
    out->accept = out->boundary = 0;
    visit_reset(sc);
    int err = 0;
    uint32_t r = g->root;
    for (uint32_t a = g->rule_alt[r]; a < g->rule_alt[r + 1] && !err; a++)
        err = close_from(g, p, sc, g->alt_start[a], GRAMMAR__BOTTOM, out);
    sort_unique(out);
    return err;
}

/* ---- advance ---------------------------------------------------------------------------- */

static int class_has(const grammar_t *g, const grammar__class_t *c, uint32_t lo, uint32_t hi)
{
    /* Some member in [lo, hi]: the first range ending at or after lo must start by hi. */
    const uint32_t *r = g->ranges + 2 * c->off;
    uint32_t a = 0, b = c->n;
    while (a < b) {
        uint32_t m = (a + b) / 2;
        if (r[2 * m + 1] < lo)
            a = m + 1;
        else
            b = m;
    }
    return a < c->n && r[2 * a] <= hi;
}

enum { STEP_REJECT, STEP_PARTIAL, STEP_DONE };

static int step(const grammar_t *g, const grammar__class_t *c, uint32_t aux, uint32_t b,
                uint32_t *naux)
{
    static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
    uint32_t acc, len, rem;
    if (aux == 0) {
        /* first[] marks only ASCII members and valid lead bytes of members. */
        if (!(c->first[b >> 5] >> (b & 31) & 1))
            return STEP_REJECT;
        if (b < 0x80)
            return STEP_DONE;
        len = b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : 2;
        acc = b & (0x7Fu >> len);
        rem = len - 1;
    } else {
        if ((b & 0xC0) != 0x80)
            return STEP_REJECT;
        rem = aux & 3;
        len = (aux >> 2) & 7;
        acc = ((aux >> 5) << 6) | (b & 0x3F);
        rem--;
        if (rem == 0) {
            if (acc < min_cp[len] || acc > 0x10FFFF || !class_has(g, c, acc, acc))
                return STEP_REJECT;
            return STEP_DONE;
        }
    }
    uint32_t lo = acc << (6 * rem), hi = lo | ((1u << (6 * rem)) - 1);
    if (lo < min_cp[len])
        lo = min_cp[len];
    if (hi > 0x10FFFF)
        hi = 0x10FFFF;
    if (lo > hi || !class_has(g, c, lo, hi))
        return STEP_REJECT;
    *naux = acc << 5 | len << 2 | rem;
    return STEP_PARTIAL;
}

int grammar__advance(const grammar_t *g, grammar__pool_t *p, grammar__scratch_t *sc,
                     const uint32_t *in, uint32_t n, uint8_t b, grammar__tops_t *out)
{
    out->n = 0;
    out->accept = out->boundary = 0;
    visit_reset(sc);
    int err = 0;
    for (uint32_t i = 0; i < n && !err; i++) {
        grammar__node_t nd = p->node[in[i]];
        const grammar__class_t *c = &g->cls[GRAMMAR__EVAL(g->elem[nd.pos])];
        uint32_t naux = 0;
        switch (step(g, c, nd.aux, b, &naux)) {
        case STEP_PARTIAL: {
            uint32_t id = grammar__pool_intern(p, nd.pos, nd.parent, naux, &err);
            if (id == GRAMMAR__NONE)
                break;
            if (out->n >= GRAMMAR_MAX_STACKS) {
                err = too_many(g, nd.pos);
                break;
            }
            err = grammar__tops_push(out, id);
            break;
        }
        case STEP_DONE:
            err = close_from(g, p, sc, nd.pos + 1, nd.parent, out);
            break;
        default:
            break;
        }
    }
    sort_unique(out);
    return err;
}

uint64_t grammar__min_remaining(const grammar_t *g, const grammar__pool_t *p, uint32_t id)
{
    const grammar__node_t *nd = &p->node[id];
    uint64_t cost = nd->aux ? (nd->aux & 3)
                            : g->cls[GRAMMAR__EVAL(g->elem[nd->pos])].minlen;
    cost += g->suffix_min[nd->pos + 1];
    for (uint32_t par = nd->parent; par > GRAMMAR__BOUNDARY; par = p->node[par].parent)
        cost += g->suffix_min[p->node[par].pos];
    return cost;
}
