/* Syntax tree → compiled grammar (text/grammar_internal.h), and the analyses the matcher
 * relies on.
 *
 * Lowering. Groups with more than one alternative become rules of their own (one per group,
 * however often a repetition copies it). Repetitions become rules whose recursion is always
 * in tail position, so that the parse stack does not grow with the count:
 *   x* followed by the rest R of a sequence   →  L ::= x L | R   (the rest moves into the
 *       loop's exit, so a token that ends x's run and starts R stays inside one rule, which
 *       is what lets the matcher classify it without knowing the context);
 *   x+  →  x x*;   x?  →  O ::= x | "";
 *   x{m,n}  →  a chain of n rules, rule k ::= x rule(k+1) (k < m), or x rule(k+1) | ""
 *       (k >= m); x{m,} ends its chain in a loop.
 *
 * Analyses: the shortest sentence of each rule (Knuth's generalization of Dijkstra, which
 * also finds rules that can never finish), left recursion (refused), FIRST and FOLLOW byte
 * sets (worklists), and the most frames one closure can push. All of them run in time
 * linear (or n log n) in the grammar's size, with explicit stacks. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "text/grammar.h"
#include "text/grammar_internal.h"

#define NOMEM() river_err_set(RIVER_ENOMEM, "grammar: no memory")

int grammar__room(void **v, uint32_t need, uint32_t *cap, size_t size, uint32_t first)
{
    if (need <= *cap)
        return 0;
    uint64_t nc = *cap ? *cap : first;
    while (nc < need)
        nc *= 2;
    if (nc > UINT32_MAX || nc > SIZE_MAX / size)
        return NOMEM();
    void *x = realloc(*v, (size_t)nc * size);
    if (!x)
        return NOMEM();
    *v = x;
    *cap = (uint32_t)nc;
    return 0;
}

/* ---- builder ---------------------------------------------------------------------------- */

typedef struct balt {
    uint32_t *e, n, cap;
} balt_t;

typedef struct brule {
    balt_t *alts;
    uint32_t n, cap;
    uint32_t name_of; /* named rule this one was made for */
    uint32_t serial;  /* k of "name-k"; 0 for the named rule itself */
    grammar__chain_t chain;
} brule_t;

typedef struct builder {
    const grammar__rules_ast_t *ast;
    brule_t *rules;
    uint32_t n_rules, cap_rules;
    uint32_t *serials; /* [ast->n] anonymous rules made so far per named rule */
    uint32_t n_elem;   /* elements so far, END included */
    uint32_t n_chains;
    uint32_t cur_named; /* the named rule being lowered */
    /* classes */
    grammar__class_t *cls;
    uint32_t n_cls, cap_cls;
    uint32_t *ranges, n_ranges, cap_ranges;
    uint32_t *cmap, cmask; /* class hash → id, UINT32_MAX empty */
    uint32_t single[128];  /* ASCII single-character class ids + 1 */
} builder_t;

static int elem_budget(builder_t *b, uint32_t n)
{
    if (n > GRAMMAR_MAX_ELEMENTS - b->n_elem)
        return river_err_set(RIVER_ERANGE,
                             "grammar: more than %u elements once repetitions are expanded "
                             "(rule \"%s\")",
                             (unsigned)GRAMMAR_MAX_ELEMENTS, b->ast->names[b->cur_named]);
    b->n_elem += n;
    return 0;
}

static int rule_new(builder_t *b, uint32_t *out)
{
    if (b->n_rules >= GRAMMAR_MAX_RULES)
        return river_err_set(RIVER_ERANGE,
                             "grammar: more than %u rules once repetitions are expanded (rule "
                             "\"%s\")",
                             (unsigned)GRAMMAR_MAX_RULES, b->ast->names[b->cur_named]);
    int err = grammar__room((void **)&b->rules, b->n_rules + 1, &b->cap_rules, sizeof *b->rules,
                            64);
    if (err)
        return err;
    brule_t *r = &b->rules[b->n_rules];
    memset(r, 0, sizeof *r);
    r->name_of = b->cur_named;
    r->serial = ++b->serials[b->cur_named];
    *out = b->n_rules++;
    return 0;
}

/* Adds an empty alternative to rule r; *alt receives its index. */
static int alt_new(builder_t *b, uint32_t r, uint32_t *alt)
{
    brule_t *br = &b->rules[r];
    int err = grammar__room((void **)&br->alts, br->n + 1, &br->cap, sizeof *br->alts, 2);
    if (err)
        return err;
    memset(&br->alts[br->n], 0, sizeof br->alts[0]);
    *alt = br->n++;
    return elem_budget(b, 1); /* its END */
}

typedef struct target {
    uint32_t rule, alt;
} target_t;

static int emit(builder_t *b, target_t t, uint32_t e)
{
    int err = elem_budget(b, 1);
    if (err)
        return err;
    balt_t *a = &b->rules[t.rule].alts[t.alt];
    err = grammar__room((void **)&a->e, a->n + 1, &a->cap, sizeof *a->e, 4);
    if (err)
        return err;
    a->e[a->n++] = e;
    return 0;
}

/* ---- classes ---------------------------------------------------------------------------- */

static uint32_t ranges_hash(const uint32_t *r, uint32_t n)
{
    uint64_t h = 1469598103934665603ULL ^ n;
    for (uint32_t i = 0; i < 2 * n; i++) {
        h ^= r[i];
        h *= 1099511628211ULL;
    }
    return (uint32_t)(h ^ (h >> 32));
}

static void mark_first(uint32_t first[8], uint32_t lo, uint32_t hi)
{
    /* Lead bytes of the members of [lo, hi], band by band of encoded length. */
    static const uint32_t band_lo[4] = {0, 0x80, 0x800, 0x10000};
    static const uint32_t band_hi[4] = {0x7F, 0x7FF, 0xFFFF, 0x10FFFF};
    static const uint32_t shift[4] = {0, 6, 12, 18};
    static const uint32_t tag[4] = {0x00, 0xC0, 0xE0, 0xF0};
    for (int k = 0; k < 4; k++) {
        uint32_t a = lo > band_lo[k] ? lo : band_lo[k];
        uint32_t z = hi < band_hi[k] ? hi : band_hi[k];
        if (a > z)
            continue;
        for (uint32_t lead = tag[k] | (a >> shift[k]); lead <= (tag[k] | (z >> shift[k])); lead++)
            first[lead >> 5] |= 1u << (lead & 31);
    }
}

static int utf8_len(uint32_t cp)
{
    return cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
}

static int class_rehash(builder_t *b)
{
    uint32_t slots = b->cmap ? (b->cmask + 1) * 2 : 256;
    uint32_t *m = malloc(slots * sizeof *m);
    if (!m)
        return NOMEM();
    memset(m, 0xFF, slots * sizeof *m);
    for (uint32_t c = 0; c < b->n_cls; c++) {
        uint32_t h = ranges_hash(b->ranges + 2 * b->cls[c].off, b->cls[c].n) & (slots - 1);
        while (m[h] != UINT32_MAX)
            h = (h + 1) & (slots - 1);
        m[h] = c;
    }
    free(b->cmap);
    b->cmap = m;
    b->cmask = slots - 1;
    return 0;
}

/* The id of the class with normalized ranges r[0..2n). */
static int class_intern(builder_t *b, const uint32_t *r, uint32_t n, uint32_t *id)
{
    if (!b->cmap || (b->n_cls + 1) * 2 > b->cmask + 1) {
        int err = class_rehash(b);
        if (err)
            return err;
    }
    uint32_t h = ranges_hash(r, n) & b->cmask;
    while (b->cmap[h] != UINT32_MAX) {
        const grammar__class_t *c = &b->cls[b->cmap[h]];
        if (c->n == n && memcmp(b->ranges + 2 * c->off, r, 2 * n * sizeof *r) == 0) {
            *id = b->cmap[h];
            return 0;
        }
        h = (h + 1) & b->cmask;
    }
    int err = grammar__room((void **)&b->cls, b->n_cls + 1, &b->cap_cls, sizeof *b->cls, 64);
    if (err)
        return err;
    /* Ranges are pairs (lo, hi): an entry is two values. */
    err = grammar__room((void **)&b->ranges, b->n_ranges + n, &b->cap_ranges,
                        2 * sizeof *b->ranges, 256);
    if (err)
        return err;
    grammar__class_t *c = &b->cls[b->n_cls];
    memset(c, 0, sizeof *c);
    c->off = b->n_ranges;
    c->n = n;
    memcpy(b->ranges + 2 * b->n_ranges, r, 2 * n * sizeof *r);
    b->n_ranges += n;
    for (uint32_t i = 0; i < n; i++)
        mark_first(c->first, r[2 * i], r[2 * i + 1]);
    c->minlen = (uint8_t)utf8_len(r[0]);
    b->cmap[h] = b->n_cls;
    *id = b->n_cls++;
    return 0;
}

static int class_single(builder_t *b, uint32_t cp, uint32_t *id)
{
    if (cp < 128 && b->single[cp]) {
        *id = b->single[cp] - 1;
        return 0;
    }
    uint32_t r[2] = {cp, cp};
    int err = class_intern(b, r, 1, id);
    if (!err && cp < 128)
        b->single[cp] = *id + 1;
    return err;
}

/* ---- lowering --------------------------------------------------------------------------- */

static int lower(builder_t *b, target_t *t, grammar__ast_t *a);

/* The alternatives of x: an ALT's sequences (*v), else x alone (*v NULL, *n 1). */
static void x_alts(grammar__ast_t *x, grammar__ast_t ***v, uint32_t *n)
{
    if (x->kind == GRAMMAR__AST_ALT) {
        *v = x->kids;
        *n = x->n_kids;
    } else {
        *v = NULL;
        *n = 1;
    }
}

/* Adds to rule r one alternative per alternative of x, each followed by `then` (a RULE
 * element, or 0 for nothing). */
static int x_into_rule(builder_t *b, uint32_t r, grammar__ast_t *x, uint32_t then)
{
    grammar__ast_t **alts;
    uint32_t n;
    x_alts(x, &alts, &n);
    for (uint32_t i = 0; i < n; i++) {
        target_t t = {r, 0};
        int err = alt_new(b, r, &t.alt);
        if (!err)
            err = lower(b, &t, alts ? alts[i] : x);
        if (!err && then)
            err = emit(b, t, then);
        if (err)
            return err;
    }
    return 0;
}

static int lower_repeat(builder_t *b, target_t *t, grammar__ast_t *a)
{
    grammar__ast_t *x = a->kids[0];
    uint32_t min = a->min, max = a->max;
    int err;
    if (max == 0)
        return 0;
    if (min == 1 && max == 1)
        return lower(b, t, x);
    if (max == GRAMMAR__INF && min <= 1) {
        if (min == 1 && (err = lower(b, t, x)))
            return err;
        /* L ::= x L | <rest of the sequence> */
        uint32_t loop;
        if ((err = rule_new(b, &loop)) || (err = emit(b, *t, GRAMMAR__ELEM(GRAMMAR__RULE, loop))))
            return err;
        if ((err = x_into_rule(b, loop, x, GRAMMAR__ELEM(GRAMMAR__RULE, loop))))
            return err;
        target_t exit = {loop, 0};
        if ((err = alt_new(b, loop, &exit.alt)))
            return err;
        *t = exit;
        return 0;
    }
    if (min == 0 && max == 1) {
        /* O ::= x | "", one rule however often the node is lowered. */
        if (!a->memo) {
            uint32_t opt, dummy;
            if ((err = rule_new(b, &opt)))
                return err;
            a->memo = opt + 1;
            if ((err = x_into_rule(b, opt, x, 0)) || (err = alt_new(b, opt, &dummy)))
                return err;
        }
        return emit(b, *t, GRAMMAR__ELEM(GRAMMAR__RULE, a->memo - 1));
    }
    /* A chain; the same repetition node always lowers to the same chain. */
    if (a->memo)
        return emit(b, *t, GRAMMAR__ELEM(GRAMMAR__RULE, a->memo - 1));
    uint32_t n = max == GRAMMAR__INF ? min + 1 : max; /* rules; with INF the last loops */
    uint32_t first = b->n_rules, chain = ++b->n_chains, dummy;
    grammar__ast_t **alts;
    uint32_t n_x;
    x_alts(x, &alts, &n_x);
    for (uint32_t k = 0; k < n; k++) {
        uint32_t r;
        if ((err = rule_new(b, &r)))
            return err;
        if (r != first + k)
            return river_err_set(RIVER_EINVAL, "grammar: internal error (chain rules)");
    }
    a->memo = first + 1;
    for (uint32_t k = 0; k < n; k++) {
        uint32_t r = first + k;
        int loop = max == GRAMMAR__INF && k == n - 1;
        uint32_t then = loop ? GRAMMAR__ELEM(GRAMMAR__RULE, r)
                        : k + 1 < n ? GRAMMAR__ELEM(GRAMMAR__RULE, r + 1)
                                    : 0;
        if ((err = x_into_rule(b, r, x, then)))
            return err;
        if ((k >= min || loop) && (err = alt_new(b, r, &dummy)))
            return err;
        grammar__chain_t *c = &b->rules[r].chain;
        c->chain = chain;
        c->n_x = n_x;
        if (loop) {
            c->a = 0;
            c->b = GRAMMAR__INF;
        } else if (k < min) {
            c->a = min - k - 1;
            c->b = max == GRAMMAR__INF ? GRAMMAR__INF : max - min;
        } else {
            c->a = 0;
            c->b = max - k - 1;
        }
    }
    return emit(b, *t, GRAMMAR__ELEM(GRAMMAR__RULE, first));
}

static int lower(builder_t *b, target_t *t, grammar__ast_t *a)
{
    int err = 0;
    switch (a->kind) {
    case GRAMMAR__AST_LIT:
        for (uint32_t i = 0; i < a->n_cps && !err; i++) {
            uint32_t id;
            if (!(err = class_single(b, a->cps[i], &id)))
                err = emit(b, *t, GRAMMAR__ELEM(GRAMMAR__CHARS, id));
        }
        return err;
    case GRAMMAR__AST_CLASS: {
        uint32_t id;
        if ((err = class_intern(b, a->ranges, a->n_ranges, &id)))
            return err;
        return emit(b, *t, GRAMMAR__ELEM(GRAMMAR__CHARS, id));
    }
    case GRAMMAR__AST_REF:
        return emit(b, *t, GRAMMAR__ELEM(GRAMMAR__RULE, a->ref));
    case GRAMMAR__AST_SEQ:
        for (uint32_t i = 0; i < a->n_kids && !err; i++)
            err = lower(b, t, a->kids[i]);
        return err;
    case GRAMMAR__AST_ALT:
        if (a->n_kids == 1)
            return lower(b, t, a->kids[0]);
        if (!a->memo) {
            uint32_t r;
            if ((err = rule_new(b, &r)))
                return err;
            a->memo = r + 1;
            if ((err = x_into_rule(b, r, a, 0)))
                return err;
        }
        return emit(b, *t, GRAMMAR__ELEM(GRAMMAR__RULE, a->memo - 1));
    case GRAMMAR__AST_REPEAT:
        return lower_repeat(b, t, a);
    }
    return river_err_set(RIVER_EINVAL, "grammar: internal error (node kind %d)", a->kind);
}

static void builder_free(builder_t *b)
{
    for (uint32_t r = 0; r < b->n_rules; r++) {
        for (uint32_t i = 0; i < b->rules[r].n; i++)
            free(b->rules[r].alts[i].e);
        free(b->rules[r].alts);
    }
    free(b->rules);
    free(b->serials);
    free(b->cls);
    free(b->ranges);
    free(b->cmap);
}

/* ---- flattening ------------------------------------------------------------------------- */

static int flatten(builder_t *b, grammar_t *g)
{
    uint32_t n_alt = 0, n_elem = 0;
    for (uint32_t r = 0; r < b->n_rules; r++) {
        n_alt += b->rules[r].n;
        for (uint32_t i = 0; i < b->rules[r].n; i++)
            n_elem += b->rules[r].alts[i].n + 1;
    }
    g->n_rules = b->n_rules;
    g->n_alt = n_alt;
    g->n_elem = n_elem;
    g->elem = malloc((n_elem + 1) * sizeof *g->elem);
    g->elem_rule = malloc((n_elem + 1) * sizeof *g->elem_rule);
    g->rule_alt = malloc((b->n_rules + 1) * sizeof *g->rule_alt);
    g->alt_start = malloc((n_alt + 1) * sizeof *g->alt_start);
    g->chain = calloc(b->n_rules + 1, sizeof *g->chain);
    g->name_off = malloc((b->n_rules + 1) * sizeof *g->name_off);
    if (!g->elem || !g->elem_rule || !g->rule_alt || !g->alt_start || !g->chain || !g->name_off)
        return NOMEM();
    uint32_t e = 0, k = 0;
    for (uint32_t r = 0; r < b->n_rules; r++) {
        g->rule_alt[r] = k;
        g->chain[r] = b->rules[r].chain;
        for (uint32_t i = 0; i < b->rules[r].n; i++) {
            const balt_t *a = &b->rules[r].alts[i];
            g->alt_start[k++] = e;
            for (uint32_t j = 0; j < a->n; j++) {
                g->elem_rule[e] = r;
                g->elem[e++] = a->e[j];
            }
            g->elem_rule[e] = r;
            g->elem[e++] = GRAMMAR__ELEM(GRAMMAR__END, 0);
        }
    }
    g->rule_alt[b->n_rules] = k;
    g->alt_start[n_alt] = e;
    /* Names: "name" for named rules, "name-k" for the rules made while lowering them. */
    grammar__buf_t nb = {0};
    for (uint32_t r = 0; r < b->n_rules; r++) {
        g->name_off[r] = (uint32_t)nb.len;
        const char *base = b->ast->names[b->rules[r].name_of];
        if (r < b->ast->n)
            grammar__buf_put(&nb, base, strlen(base) + 1);
        else
            grammar__buf_printf(&nb, "%s-%u%c", base, (unsigned)b->rules[r].serial, '\0');
    }
    if (nb.oom) {
        grammar__buf_free(&nb);
        return NOMEM();
    }
    g->names = nb.p;
    g->cls = b->cls;
    g->n_cls = b->n_cls;
    g->ranges = b->ranges;
    g->n_ranges = b->n_ranges;
    b->cls = NULL;
    b->ranges = NULL;
    return 0;
}

const char *grammar__rule_name(const grammar_t *g, uint32_t r)
{
    return g->names + g->name_off[r];
}

/* ---- analyses --------------------------------------------------------------------------- */

#define LEN_CAP (1u << 30)

static uint32_t sat_add(uint32_t a, uint32_t b)
{
    uint64_t s = (uint64_t)a + b;
    return s > LEN_CAP ? LEN_CAP : (uint32_t)s;
}

/* A min-heap of (value, rule). */
typedef struct heap {
    uint64_t *v;
    uint32_t n, cap;
} heap_t;

static int heap_push(heap_t *h, uint32_t val, uint32_t rule)
{
    int err = grammar__room((void **)&h->v, h->n + 1, &h->cap, sizeof *h->v, 256);
    if (err)
        return err;
    uint64_t x = ((uint64_t)val << 32) | rule;
    uint32_t i = h->n++;
    while (i > 0 && h->v[(i - 1) / 2] > x) {
        h->v[i] = h->v[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h->v[i] = x;
    return 0;
}

static uint64_t heap_pop(heap_t *h)
{
    uint64_t top = h->v[0], x = h->v[--h->n];
    uint32_t i = 0;
    for (;;) {
        uint32_t c = 2 * i + 1;
        if (c >= h->n)
            break;
        if (c + 1 < h->n && h->v[c + 1] < h->v[c])
            c++;
        if (h->v[c] >= x)
            break;
        h->v[i] = h->v[c];
        i = c;
    }
    if (h->n)
        h->v[i] = x;
    return top;
}

/* The shortest sentence of every rule; LEN_CAP for rules that can never finish. */
static int analyse_minlen(grammar_t *g)
{
    int err = 0;
    uint32_t *cnt = calloc(g->n_alt + 1, sizeof *cnt);
    uint32_t *sum = calloc(g->n_alt + 1, sizeof *sum);
    uint32_t *alt_rule = malloc((g->n_alt + 1) * sizeof *alt_rule);
    uint32_t *occ_off = calloc(g->n_rules + 2, sizeof *occ_off);
    uint32_t *occ = NULL;
    uint8_t *done = calloc(g->n_rules + 1, 1);
    heap_t h = {0};
    g->minlen = malloc((g->n_rules + 1) * sizeof *g->minlen);
    if (!cnt || !sum || !alt_rule || !occ_off || !done || !g->minlen)
        goto nomem;
    for (uint32_t r = 0; r < g->n_rules; r++) {
        g->minlen[r] = LEN_CAP;
        for (uint32_t a = g->rule_alt[r]; a < g->rule_alt[r + 1]; a++)
            alt_rule[a] = r;
    }
    uint32_t n_occ = 0;
    for (uint32_t a = 0; a < g->n_alt; a++)
        for (uint32_t p = g->alt_start[a]; GRAMMAR__ETYPE(g->elem[p]) != GRAMMAR__END; p++) {
            uint32_t e = g->elem[p];
            if (GRAMMAR__ETYPE(e) == GRAMMAR__CHARS) {
                sum[a] = sat_add(sum[a], g->cls[GRAMMAR__EVAL(e)].minlen);
            } else {
                cnt[a]++;
                occ_off[GRAMMAR__EVAL(e) + 1]++;
                n_occ++;
            }
        }
    for (uint32_t r = 0; r < g->n_rules; r++)
        occ_off[r + 1] += occ_off[r];
    occ = malloc((n_occ + 1) * sizeof *occ);
    uint32_t *fill = malloc((g->n_rules + 1) * sizeof *fill);
    if (!occ || !fill) {
        free(fill);
        goto nomem;
    }
    memcpy(fill, occ_off, g->n_rules * sizeof *fill);
    for (uint32_t a = 0; a < g->n_alt; a++)
        for (uint32_t p = g->alt_start[a]; GRAMMAR__ETYPE(g->elem[p]) != GRAMMAR__END; p++)
            if (GRAMMAR__ETYPE(g->elem[p]) == GRAMMAR__RULE)
                occ[fill[GRAMMAR__EVAL(g->elem[p])]++] = a;
    free(fill);
    for (uint32_t a = 0; a < g->n_alt; a++)
        if (cnt[a] == 0 && heap_push(&h, sum[a], alt_rule[a]))
            goto nomem;
    while (h.n) {
        uint64_t x = heap_pop(&h);
        uint32_t r = (uint32_t)x, v = (uint32_t)(x >> 32);
        if (done[r])
            continue;
        done[r] = 1;
        g->minlen[r] = v;
        for (uint32_t i = occ_off[r]; i < occ_off[r + 1]; i++) {
            uint32_t a = occ[i];
            sum[a] = sat_add(sum[a], v);
            if (--cnt[a] == 0 && heap_push(&h, sum[a], alt_rule[a]))
                goto nomem;
        }
    }
    goto end;
nomem:
    err = NOMEM();
end:
    free(cnt);
    free(sum);
    free(alt_rule);
    free(occ_off);
    free(occ);
    free(done);
    free(h.v);
    return err;
}

static uint32_t elem_minlen(const grammar_t *g, uint32_t e)
{
    if (GRAMMAR__ETYPE(e) == GRAMMAR__CHARS)
        return g->cls[GRAMMAR__EVAL(e)].minlen;
    if (GRAMMAR__ETYPE(e) == GRAMMAR__RULE)
        return g->minlen[GRAMMAR__EVAL(e)];
    return 0;
}

static int analyse_reachable(grammar_t *g)
{
    g->reachable = calloc(g->n_rules + 1, 1);
    uint32_t *stack = malloc((g->n_rules + 1) * sizeof *stack);
    if (!g->reachable || !stack) {
        free(stack);
        return NOMEM();
    }
    uint32_t n = 0;
    stack[n++] = g->root;
    g->reachable[g->root] = 1;
    while (n) {
        uint32_t r = stack[--n];
        for (uint32_t p = g->alt_start[g->rule_alt[r]]; p < g->alt_start[g->rule_alt[r + 1]]; p++)
            if (GRAMMAR__ETYPE(g->elem[p]) == GRAMMAR__RULE) {
                uint32_t s = GRAMMAR__EVAL(g->elem[p]);
                if (!g->reachable[s]) {
                    g->reachable[s] = 1;
                    stack[n++] = s;
                }
            }
    }
    free(stack);
    return 0;
}

/* Left edges: rule r can call rule s before consuming a byte. Visits them for r. */
typedef struct ledge_iter {
    uint32_t alt, alt_end, p;
} ledge_iter_t;

static void ledge_begin(const grammar_t *g, uint32_t r, ledge_iter_t *it)
{
    it->alt = g->rule_alt[r];
    it->alt_end = g->rule_alt[r + 1];
    it->p = it->alt < it->alt_end ? g->alt_start[it->alt] : 0;
}

/* The next left edge target, or UINT32_MAX. *tail: the reference ends its alternative. */
static uint32_t ledge_next(const grammar_t *g, ledge_iter_t *it, int *tail)
{
    while (it->alt < it->alt_end) {
        uint32_t e = g->elem[it->p];
        if (GRAMMAR__ETYPE(e) == GRAMMAR__RULE) {
            uint32_t s = GRAMMAR__EVAL(e);
            *tail = GRAMMAR__ETYPE(g->elem[it->p + 1]) == GRAMMAR__END;
            if (g->minlen[s] == 0) {
                it->p++;
            } else if (++it->alt < it->alt_end) {
                it->p = g->alt_start[it->alt];
            }
            return s;
        }
        /* CHARS consumes a byte; END closes the alternative. */
        if (++it->alt < it->alt_end)
            it->p = g->alt_start[it->alt];
    }
    return UINT32_MAX;
}

/* Whether every rule of the cycle that closes at s (on the DFS stack) was made by lowering
 * rather than named in the text: then the text wrote no left recursion, only a repetition of
 * something nullable. */
static int cycle_made(const grammar_t *g, const uint32_t *stack, uint32_t n, uint32_t s,
                      uint32_t n_named)
{
    (void)g;
    for (uint32_t i = n; i-- > 0;) {
        if (stack[i] < n_named)
            return 0;
        if (stack[i] == s)
            return 1;
    }
    return 0;
}

/* Refuses left recursion, and computes the most frames a closure pushes (max_push). */
static int analyse_left(grammar_t *g, uint32_t n_named, uint32_t *bad)
{
    int err = 0;
    uint8_t *color = calloc(g->n_rules + 1, 1); /* 0 new, 1 on stack, 2 done */
    uint32_t *ps = calloc(g->n_rules + 1, sizeof *ps); /* most frames a call of r pushes */
    uint32_t *stack = malloc((g->n_rules + 1) * sizeof *stack);
    ledge_iter_t *its = malloc((g->n_rules + 1) * sizeof *its);
    if (!color || !ps || !stack || !its) {
        err = NOMEM();
        goto end;
    }
    for (uint32_t root = 0; root < g->n_rules && !err; root++) {
        if (color[root] || !g->reachable[root])
            continue;
        uint32_t n = 0;
        stack[n] = root;
        ledge_begin(g, root, &its[n]);
        color[root] = 1;
        n++;
        while (n && !err) {
            uint32_t r = stack[n - 1];
            int tail;
            uint32_t s = ledge_next(g, &its[n - 1], &tail);
            if (s == UINT32_MAX) {
                color[r] = 2;
                n--;
                continue;
            }
            if (color[s] == 1) {
                /* A rule made by lowering (its name has a '-k' suffix) is a repetition or
                 * a group: its own cycle is a repetition of something nullable. */
                err = river_err_set(RIVER_EFORMAT,
                                    "grammar: rule \"%s\" is left-recursive (it can reach "
                                    "itself through \"%s\" before matching anything)%s",
                                    grammar__rule_name(g, s), grammar__rule_name(g, r),
                                    cycle_made(g, stack, n, s, n_named)
                                        ? "; it repeats something that can match nothing, "
                                          "like (x*)*"
                                        : "");
                *bad = s;
                break;
            }
            if (color[s] == 0) {
                color[s] = 1;
                stack[n] = s;
                ledge_begin(g, s, &its[n]);
                n++;
            }
        }
    }
    if (err)
        goto end;
    /* ps in post-order: a second pass over the DAG, children first (colors reused). */
    memset(color, 0, g->n_rules + 1);
    for (uint32_t root = 0; root < g->n_rules; root++) {
        if (color[root] || !g->reachable[root])
            continue;
        uint32_t n = 0;
        stack[n] = root;
        ledge_begin(g, root, &its[n]);
        color[root] = 1;
        n++;
        while (n) {
            uint32_t r = stack[n - 1];
            int tail;
            uint32_t s = ledge_next(g, &its[n - 1], &tail);
            if (s == UINT32_MAX) {
                /* Every child is done: ps(r) from them. */
                ledge_iter_t it;
                ledge_begin(g, r, &it);
                uint32_t best = 0, t;
                int tl;
                while ((t = ledge_next(g, &it, &tl)) != UINT32_MAX) {
                    uint32_t v = (tl ? 0 : 1) + ps[t];
                    if (v > best)
                        best = v;
                }
                ps[r] = best > GRAMMAR_MAX_DEPTH ? GRAMMAR_MAX_DEPTH + 1 : best;
                color[r] = 2;
                n--;
                continue;
            }
            if (color[s] == 0) {
                color[s] = 1;
                stack[n] = s;
                ledge_begin(g, s, &its[n]);
                n++;
            }
        }
    }
    /* From any position: the frames pushed by the references it can reach before a byte. */
    uint32_t best = 0;
    for (uint32_t r = 0; r < g->n_rules; r++) {
        if (!g->reachable[r])
            continue;
        for (uint32_t a = g->rule_alt[r]; a < g->rule_alt[r + 1]; a++) {
            uint32_t run = 0; /* walk(p), from the end of the alternative backwards */
            for (uint32_t p = g->alt_start[a + 1] - 1; p + 1 > g->alt_start[a]; p--) {
                uint32_t e = g->elem[p];
                if (GRAMMAR__ETYPE(e) == GRAMMAR__END) {
                    run = 0;
                } else if (GRAMMAR__ETYPE(e) == GRAMMAR__CHARS) {
                    run = 0;
                } else {
                    uint32_t s = GRAMMAR__EVAL(e);
                    int tail = GRAMMAR__ETYPE(g->elem[p + 1]) == GRAMMAR__END;
                    uint32_t here = (tail ? 0 : 1) + ps[s];
                    uint32_t next = g->minlen[s] == 0 ? run : 0;
                    run = here > next ? here : next;
                }
                if (run > best)
                    best = run;
                if (p == 0)
                    break;
            }
        }
    }
    g->max_push = best + 1; /* the top node itself */
end:
    free(color);
    free(ps);
    free(stack);
    free(its);
    return err;
}

/* Edges for set propagation: dst ⊇ src. */
typedef struct edges {
    uint32_t *src, *dst, n, cap;
} edges_t;

static int edge_add(edges_t *e, uint32_t src, uint32_t dst)
{
    if (e->n == e->cap) {
        uint32_t cap = e->cap ? e->cap * 2 : 256;
        uint32_t *s = realloc(e->src, cap * sizeof *s);
        if (!s)
            return RIVER_ENOMEM;
        e->src = s;
        uint32_t *d = realloc(e->dst, cap * sizeof *d);
        if (!d)
            return RIVER_ENOMEM;
        e->dst = d;
        e->cap = cap;
    }
    e->src[e->n] = src;
    e->dst[e->n] = dst;
    e->n++;
    return 0;
}

static void edges_free(edges_t *e)
{
    free(e->src);
    free(e->dst);
}

/* Propagates sets[dst] |= sets[src] along the edges to a fixpoint (worklist). */
static int propagate(uint32_t (*sets)[8], uint32_t n_sets, const edges_t *e)
{
    uint32_t *off = calloc(n_sets + 2, sizeof *off);
    uint32_t *adj = malloc((e->n + 1) * sizeof *adj);
    uint32_t *work = malloc((n_sets + 1) * sizeof *work);
    uint8_t *queued = calloc(n_sets + 1, 1);
    if (!off || !adj || !work || !queued) {
        free(off), free(adj), free(work), free(queued);
        return RIVER_ENOMEM;
    }
    for (uint32_t i = 0; i < e->n; i++)
        off[e->src[i] + 1]++;
    for (uint32_t i = 0; i < n_sets; i++)
        off[i + 1] += off[i];
    uint32_t *fill = work; /* borrowed before the work list starts */
    memcpy(fill, off, n_sets * sizeof *fill);
    for (uint32_t i = 0; i < e->n; i++)
        adj[fill[e->src[i]]++] = e->dst[i];
    uint32_t head = 0, count = 0;
    for (uint32_t i = 0; i < n_sets; i++) {
        work[i] = i;
        queued[i] = 1;
    }
    count = n_sets;
    /* A ring of n_sets slots holds each set at most once. */
    while (count) {
        uint32_t s = work[head];
        head = head + 1 == n_sets ? 0 : head + 1;
        count--;
        queued[s] = 0;
        for (uint32_t i = off[s]; i < off[s + 1]; i++) {
            uint32_t d = adj[i];
            int changed = 0;
            for (int w = 0; w < 8; w++) {
                uint32_t v = sets[d][w] | sets[s][w];
                if (v != sets[d][w]) {
                    sets[d][w] = v;
                    changed = 1;
                }
            }
            if (changed && !queued[d]) {
                queued[d] = 1;
                uint32_t tail = head + count;
                work[tail >= n_sets ? tail - n_sets : tail] = d;
                count++;
            }
        }
    }
    free(off);
    free(adj);
    free(work);
    free(queued);
    return 0;
}

static int analyse_follow(grammar_t *g)
{
    int err = 0;
    uint32_t(*first)[8] = calloc(g->n_rules + 1, sizeof *first);
    g->follow = calloc(g->n_rules + 1, sizeof *g->follow);
    edges_t ef = {0}, eo = {0};
    if (!first || !g->follow) {
        err = NOMEM();
        goto end;
    }
    /* FIRST. */
    for (uint32_t r = 0; r < g->n_rules && !err; r++)
        for (uint32_t a = g->rule_alt[r]; a < g->rule_alt[r + 1] && !err; a++)
            for (uint32_t p = g->alt_start[a];; p++) {
                uint32_t e = g->elem[p];
                if (GRAMMAR__ETYPE(e) == GRAMMAR__END)
                    break;
                if (GRAMMAR__ETYPE(e) == GRAMMAR__CHARS) {
                    for (int w = 0; w < 8; w++)
                        first[r][w] |= g->cls[GRAMMAR__EVAL(e)].first[w];
                    break;
                }
                if ((err = edge_add(&ef, GRAMMAR__EVAL(e), r)))
                    break;
                if (g->minlen[GRAMMAR__EVAL(e)] > 0)
                    break;
            }
    if (err || (err = propagate(first, g->n_rules, &ef))) {
        err = NOMEM();
        goto end;
    }
    /* FOLLOW. */
    for (uint32_t r = 0; r < g->n_rules && !err; r++)
        for (uint32_t a = g->rule_alt[r]; a < g->rule_alt[r + 1] && !err; a++)
            for (uint32_t p = g->alt_start[a]; GRAMMAR__ETYPE(g->elem[p]) != GRAMMAR__END; p++) {
                if (GRAMMAR__ETYPE(g->elem[p]) != GRAMMAR__RULE)
                    continue;
                uint32_t bref = GRAMMAR__EVAL(g->elem[p]);
                for (uint32_t q = p + 1;; q++) {
                    uint32_t e = g->elem[q];
                    if (GRAMMAR__ETYPE(e) == GRAMMAR__END) {
                        err = edge_add(&eo, r, bref);
                        break;
                    }
                    const uint32_t *f = GRAMMAR__ETYPE(e) == GRAMMAR__CHARS
                                            ? g->cls[GRAMMAR__EVAL(e)].first
                                            : first[GRAMMAR__EVAL(e)];
                    for (int w = 0; w < 8; w++)
                        g->follow[bref][w] |= f[w];
                    if (elem_minlen(g, e) > 0)
                        break;
                }
                if (err)
                    break;
            }
    if (err || (err = propagate(g->follow, g->n_rules, &eo)))
        err = NOMEM();
end:
    free(first);
    edges_free(&ef);
    edges_free(&eo);
    return err;
}

static int analyse_suffix(grammar_t *g)
{
    g->suffix_min = malloc((g->n_elem + 1) * sizeof *g->suffix_min);
    if (!g->suffix_min)
        return NOMEM();
    uint32_t run = 0;
    for (uint32_t p = g->n_elem; p-- > 0;) {
        uint32_t e = g->elem[p];
        run = GRAMMAR__ETYPE(e) == GRAMMAR__END ? 0 : sat_add(run, elem_minlen(g, e));
        g->suffix_min[p] = run;
    }
    return 0;
}

/* A chain whose x can match nothing has items that take no bytes, so its positions are not
 * interchangeable (grammar__chain_t); forget such chains. */
static void check_chains(grammar_t *g)
{
    for (uint32_t r = 0; r < g->n_rules; r++) {
        grammar__chain_t *c = &g->chain[r];
        if (!c->chain)
            continue;
        for (uint32_t i = 0; i < c->n_x; i++) {
            uint32_t a = g->rule_alt[r] + i, len = 0;
            for (uint32_t p = g->alt_start[a]; GRAMMAR__ETYPE(g->elem[p]) != GRAMMAR__END; p++) {
                uint32_t e = g->elem[p];
                int is_next = GRAMMAR__ETYPE(g->elem[p + 1]) == GRAMMAR__END &&
                              GRAMMAR__ETYPE(e) == GRAMMAR__RULE &&
                              g->chain[GRAMMAR__EVAL(e)].chain == c->chain;
                if (!is_next)
                    len = sat_add(len, elem_minlen(g, e));
            }
            if (len == 0) {
                uint32_t id = c->chain;
                for (uint32_t s = 0; s < g->n_rules; s++)
                    if (g->chain[s].chain == id)
                        memset(&g->chain[s], 0, sizeof g->chain[s]);
                break;
            }
        }
    }
}

/* The static context of every reachable rule (struct grammar). A rule has a known parent
 * when exactly one place calls it, not counting its own tail calls (which keep the frame);
 * the root is called once more, by the start. */
static int analyse_context(grammar_t *g)
{
    uint32_t n = g->n_rules;
    uint32_t *sites = calloc(n + 1, sizeof *sites), *site = malloc((n + 1) * sizeof *site);
    g->ctx_off = calloc(n + 2, sizeof *g->ctx_off);
    g->ctx_follow = malloc((n + 1) * sizeof *g->ctx_follow);
    g->ctx_end = calloc(n + 1, 1);
    g->ctx_pos = malloc(((size_t)n * GRAMMAR__CTX_MAX + 1) * sizeof *g->ctx_pos);
    if (!sites || !site || !g->ctx_off || !g->ctx_follow || !g->ctx_end || !g->ctx_pos) {
        free(sites);
        free(site);
        return NOMEM();
    }
    sites[g->root] = 1;
    site[g->root] = UINT32_MAX;
    for (uint32_t q = 0; q < g->n_elem; q++) {
        uint32_t e = g->elem[q], owner = g->elem_rule[q];
        if (GRAMMAR__ETYPE(e) != GRAMMAR__RULE || !g->reachable[owner])
            continue;
        uint32_t r = GRAMMAR__EVAL(e);
        if (r == owner && GRAMMAR__ETYPE(g->elem[q + 1]) == GRAMMAR__END)
            continue;
        if (sites[r] < 2)
            sites[r]++;
        site[r] = q;
    }
    uint32_t k = 0;
    for (uint32_t r = 0; r < n; r++) {
        g->ctx_off[r] = k;
        uint32_t cur = r, len = 0;
        g->ctx_follow[r] = r;
        if (!g->reachable[r])
            continue;
        /* Up through unique callers; a cycle of them cannot be reachable, but bound it. */
        for (uint32_t steps = 0; steps < 4 * GRAMMAR__CTX_MAX; steps++) {
            if (cur == g->root && sites[cur] == 1) {
                g->ctx_end[r] = 1;
                break;
            }
            if (sites[cur] != 1)
                break;
            uint32_t q = site[cur];
            if (GRAMMAR__ETYPE(g->elem[q + 1]) != GRAMMAR__END) {
                if (len == GRAMMAR__CTX_MAX) {
                    /* Full: the last known frame's rule ends into the unknown. */
                    cur = g->elem_rule[g->ctx_pos[k - 1]];
                    break;
                }
                g->ctx_pos[k++] = q + 1;
                len++;
            }
            cur = g->elem_rule[q];
        }
        g->ctx_follow[r] = cur;
    }
    g->ctx_off[n] = k;
    free(sites);
    free(site);
    return 0;
}

void grammar_destroy(grammar_t **gp)
{
    if (!gp || !*gp)
        return;
    grammar_t *g = *gp;
    free(g->elem);
    free(g->elem_rule);
    free(g->rule_alt);
    free(g->alt_start);
    free(g->cls);
    free(g->ranges);
    free(g->names);
    free(g->name_off);
    free(g->chain);
    free(g->minlen);
    free(g->suffix_min);
    free(g->follow);
    free(g->reachable);
    free(g->ctx_off);
    free(g->ctx_pos);
    free(g->ctx_follow);
    free(g->ctx_end);
    free(g);
    *gp = NULL;
}

int grammar__build(grammar_t **out, const grammar__rules_ast_t *rules, char **bad_rule)
{
    *out = NULL;
    uint32_t root = UINT32_MAX;
    for (uint32_t i = 0; i < rules->n; i++)
        if (strcmp(rules->names[i], "root") == 0)
            root = i;
    if (root == UINT32_MAX)
        return river_err_set(RIVER_EFORMAT, "grammar: no rule named \"root\"");
    int err;
    builder_t b = {.ast = rules};
    b.cap_rules = rules->n + 16;
    b.rules = calloc(b.cap_rules, sizeof *b.rules);
    b.serials = calloc(rules->n + 1, sizeof *b.serials);
    grammar_t *g = calloc(1, sizeof *g);
    if (!b.rules || !b.serials || !g) {
        err = NOMEM();
        goto fail;
    }
    /* Named rules keep their indices; rules made while lowering come after them. */
    b.n_rules = rules->n;
    for (uint32_t i = 0; i < rules->n; i++)
        b.rules[i].name_of = i;
    for (uint32_t i = 0; i < rules->n; i++) {
        b.cur_named = i;
        const grammar__ast_t *body = rules->body[i];
        for (uint32_t k = 0; k < body->n_kids; k++) {
            target_t t = {i, 0};
            if ((err = alt_new(&b, i, &t.alt)) || (err = lower(&b, &t, body->kids[k])))
                goto fail;
        }
    }
    if ((err = flatten(&b, g)))
        goto fail;
    g->root = root;
    if ((err = analyse_minlen(g)) || (err = analyse_reachable(g)))
        goto fail;
    for (uint32_t r = 0; r < g->n_rules; r++)
        if (g->reachable[r] && g->minlen[r] >= LEN_CAP) {
            err = river_err_set(RIVER_EFORMAT,
                                "grammar: rule \"%s\" can never finish (each alternative needs "
                                "a rule that itself never finishes)",
                                grammar__rule_name(g, r));
            if (bad_rule)
                *bad_rule = strdup(grammar__rule_name(g, r));
            goto fail;
        }
    uint32_t left = UINT32_MAX;
    if ((err = analyse_left(g, rules->n, &left))) {
        if (bad_rule && left != UINT32_MAX)
            *bad_rule = strdup(grammar__rule_name(g, left));
        goto fail;
    }
    if ((err = analyse_follow(g)) || (err = analyse_suffix(g)) || (err = analyse_context(g)))
        goto fail;
    check_chains(g);
    builder_free(&b);
    *out = g;
    return 0;
fail:
    builder_free(&b);
    grammar_destroy(&g);
    return err;
}
