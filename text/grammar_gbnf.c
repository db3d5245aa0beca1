/* GBNF text → syntax tree (text/grammar_internal.h), and grammar_parse, which hands the tree
 * to grammar__build. Also the small helpers the other grammar files share: code point
 * ranges and the growable string that GBNF text is written into.
 *
 * The parser is recursive descent; only parentheses recurse, and they are bounded by
 * GRAMMAR_MAX_NESTING, so a hostile text cannot exhaust the C stack. Every syntax tree node
 * counts against GRAMMAR_MAX_ELEMENTS, so it cannot exhaust memory either. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "text/grammar.h"
#include "text/grammar_internal.h"
#include "text/hex.h"
#include "text/utf8.h"

/* ---- growable string -------------------------------------------------------------------- */

void grammar__buf_put(grammar__buf_t *b, const char *s, size_t n)
{
    if (b->oom)
        return;
    if (n + 1 > b->cap - b->len || !b->p) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1) {
            if (cap > SIZE_MAX / 4) {
                b->oom = 1;
                return;
            }
            cap *= 2;
        }
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    if (n)
        memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

void grammar__buf_puts(grammar__buf_t *b, const char *s)
{
    grammar__buf_put(b, s, strlen(s));
}

void grammar__buf_printf(grammar__buf_t *b, const char *fmt, ...)
{
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) {
        b->oom = 1;
        return;
    }
    if ((size_t)n < sizeof tmp) {
        grammar__buf_put(b, tmp, (size_t)n);
        return;
    }
    char *big = malloc((size_t)n + 1);
    if (!big) {
        b->oom = 1;
        return;
    }
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    grammar__buf_put(b, big, (size_t)n);
    free(big);
}

void grammar__buf_literal(grammar__buf_t *b, const char *s, size_t n)
{
    grammar__buf_put(b, "\"", 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') {
            char e[2] = {'\\', (char)c};
            grammar__buf_put(b, e, 2);
        } else if (c < 0x20 || c == 0x7F) {
            grammar__buf_printf(b, "\\x%02X", c);
        } else {
            /* Bytes of multi-byte characters go through as they are: GBNF text is UTF-8. */
            grammar__buf_put(b, (const char *)&s[i], 1);
        }
    }
    grammar__buf_put(b, "\"", 1);
}

void grammar__buf_free(grammar__buf_t *b)
{
    free(b->p);
    memset(b, 0, sizeof *b);
}

/* ---- code point ranges ------------------------------------------------------------------ */

static int range_cmp(const void *a, const void *b)
{
    const uint32_t *x = a, *y = b;
    return x[0] < y[0] ? -1 : x[0] > y[0] ? 1 : (x[1] < y[1] ? -1 : x[1] > y[1]);
}

int grammar__ranges_normalize(uint32_t **ranges, uint32_t *n)
{
    uint32_t *r = *ranges, m = *n;
    qsort(r, m, 2 * sizeof *r, range_cmp);
    uint32_t k = 0;
    for (uint32_t i = 0; i < m; i++) {
        uint32_t lo = r[2 * i], hi = r[2 * i + 1];
        if (hi > 0x10FFFF)
            hi = 0x10FFFF;
        if (lo > hi)
            continue;
        if (k > 0 && lo <= r[2 * (k - 1) + 1] + 1) {
            if (hi > r[2 * (k - 1) + 1])
                r[2 * (k - 1) + 1] = hi;
            continue;
        }
        r[2 * k] = lo;
        r[2 * k + 1] = hi;
        k++;
    }
    /* Cut the surrogates out; at most one range can span them after merging. */
    uint32_t out = 0;
    uint32_t *res = malloc((2 * (size_t)k + 2) * sizeof *res);
    if (!res)
        return RIVER_ENOMEM;
    for (uint32_t i = 0; i < k; i++) {
        uint32_t lo = r[2 * i], hi = r[2 * i + 1];
        if (lo < 0xD800 && hi >= 0xD800) {
            res[2 * out] = lo;
            res[2 * out + 1] = 0xD7FF;
            out++;
            if (hi > 0xDFFF) {
                res[2 * out] = 0xE000;
                res[2 * out + 1] = hi;
                out++;
            }
            continue;
        }
        if (lo >= 0xD800 && lo <= 0xDFFF) {
            if (hi <= 0xDFFF)
                continue;
            lo = 0xE000;
        }
        res[2 * out] = lo;
        res[2 * out + 1] = hi;
        out++;
    }
    free(r);
    *ranges = res;
    *n = out;
    return 0;
}

int grammar__ranges_negate(uint32_t **ranges, uint32_t *n)
{
    uint32_t *r = *ranges, m = *n, k = 0;
    uint32_t *res = malloc((2 * (size_t)m + 4) * sizeof *res);
    if (!res)
        return RIVER_ENOMEM;
    uint32_t next = 0;
    for (uint32_t i = 0; i < m; i++) {
        if (r[2 * i] > next) {
            res[2 * k] = next;
            res[2 * k + 1] = r[2 * i] - 1;
            k++;
        }
        next = r[2 * i + 1] + 1;
    }
    if (next <= 0x10FFFF) {
        res[2 * k] = next;
        res[2 * k + 1] = 0x10FFFF;
        k++;
    }
    free(r);
    *ranges = res;
    *n = k;
    return grammar__ranges_normalize(ranges, n);
}

/* ---- syntax tree ------------------------------------------------------------------------ */

void grammar__ast_free(grammar__ast_t *a)
{
    if (!a)
        return;
    /* Trees are at most GRAMMAR_MAX_NESTING deep in groups, but sequences of repetitions
     * nest one REPEAT per suffix; free with an explicit stack all the same. */
    grammar__ast_t **stack = malloc(64 * sizeof *stack);
    size_t n = 0, cap = 64;
    if (!stack)
        return; /* leaks on OOM while freeing; nothing better to do */
    stack[n++] = a;
    while (n) {
        grammar__ast_t *x = stack[--n];
        for (uint32_t i = 0; i < x->n_kids; i++) {
            if (n == cap) {
                grammar__ast_t **s = realloc(stack, 2 * cap * sizeof *s);
                if (!s)
                    break;
                stack = s;
                cap *= 2;
            }
            stack[n++] = x->kids[i];
        }
        free(x->kids);
        free(x->ranges);
        free(x->cps);
        free(x);
    }
    free(stack);
}

void grammar__rules_ast_free(grammar__rules_ast_t *r)
{
    for (uint32_t i = 0; i < r->n; i++) {
        free(r->names[i]);
        grammar__ast_free(r->body[i]);
    }
    free(r->names);
    free(r->body);
    free(r->at);
    memset(r, 0, sizeof *r);
}

/* ---- parser ----------------------------------------------------------------------------- */

typedef struct parser {
    const char *s;
    size_t len, pos;
    grammar__rules_ast_t *rules;
    uint32_t n_nodes;
    int depth;
    /* Rule name → index, open addressing over rules->names. */
    uint32_t *map, map_mask;
} parser_t;

static void where(const parser_t *p, size_t pos, uint32_t *line, uint32_t *col)
{
    uint32_t l = 1, c = 1;
    for (size_t i = 0; i < pos && i < p->len; i++) {
        if (p->s[i] == '\n') {
            l++;
            c = 1;
        } else {
            c++;
        }
    }
    *line = l;
    *col = c;
}

static int fail_at(const parser_t *p, size_t pos, int err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int fail_at(const parser_t *p, size_t pos, int err, const char *fmt, ...)
{
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    uint32_t line, col;
    where(p, pos, &line, &col);
    return river_err_set(err, "grammar: line %u, column %u: %s", line, col, msg);
}

static grammar__ast_t *node_new(parser_t *p, int kind, int *err)
{
    if (p->n_nodes >= GRAMMAR_MAX_ELEMENTS) {
        *err = fail_at(p, p->pos, RIVER_ERANGE, "grammar larger than %u elements",
                       (unsigned)GRAMMAR_MAX_ELEMENTS);
        return NULL;
    }
    grammar__ast_t *a = calloc(1, sizeof *a);
    if (!a) {
        *err = river_err_set(RIVER_ENOMEM, "grammar: no memory");
        return NULL;
    }
    p->n_nodes++;
    a->kind = kind;
    return a;
}

static int kid_add(grammar__ast_t *a, grammar__ast_t *k)
{
    if (a->n_kids == a->cap_kids) {
        uint32_t cap = a->cap_kids ? a->cap_kids * 2 : 4;
        grammar__ast_t **v = realloc(a->kids, cap * sizeof *v);
        if (!v)
            return river_err_set(RIVER_ENOMEM, "grammar: no memory");
        a->kids = v;
        a->cap_kids = cap;
    }
    a->kids[a->n_kids++] = k;
    return 0;
}

static uint64_t name_hash(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)s[i];
        h *= 1099511628211ULL;
    }
    return h ^ (h >> 29);
}

static int map_grow(parser_t *p)
{
    uint32_t slots = p->map ? (p->map_mask + 1) * 2 : 64;
    uint32_t *m = malloc(slots * sizeof *m);
    if (!m)
        return river_err_set(RIVER_ENOMEM, "grammar: no memory");
    memset(m, 0xFF, slots * sizeof *m);
    for (uint32_t i = 0; i < p->rules->n; i++) {
        const char *nm = p->rules->names[i];
        uint32_t h = (uint32_t)name_hash(nm, strlen(nm)) & (slots - 1);
        while (m[h] != UINT32_MAX)
            h = (h + 1) & (slots - 1);
        m[h] = i;
    }
    free(p->map);
    p->map = m;
    p->map_mask = slots - 1;
    return 0;
}

/* The index of rule `name`, added (undefined) when new. */
static int rule_index(parser_t *p, const char *name, size_t n, size_t at, uint32_t *idx)
{
    grammar__rules_ast_t *r = p->rules;
    if (!p->map || (r->n + 1) * 2 > p->map_mask + 1) {
        int err = map_grow(p);
        if (err)
            return err;
    }
    uint32_t h = (uint32_t)name_hash(name, n) & p->map_mask;
    while (p->map[h] != UINT32_MAX) {
        const char *nm = r->names[p->map[h]];
        if (strlen(nm) == n && memcmp(nm, name, n) == 0) {
            *idx = p->map[h];
            return 0;
        }
        h = (h + 1) & p->map_mask;
    }
    if (r->n >= GRAMMAR_MAX_RULES)
        return fail_at(p, at, RIVER_ERANGE, "more than %u rules", (unsigned)GRAMMAR_MAX_RULES);
    if (r->n == r->cap) {
        uint32_t cap = r->cap ? r->cap * 2 : 16;
        char **nv = realloc(r->names, cap * sizeof *nv);
        if (!nv)
            return river_err_set(RIVER_ENOMEM, "grammar: no memory");
        r->names = nv;
        grammar__ast_t **bv = realloc(r->body, cap * sizeof *bv);
        if (!bv)
            return river_err_set(RIVER_ENOMEM, "grammar: no memory");
        r->body = bv;
        size_t *av = realloc(r->at, cap * sizeof *av);
        if (!av)
            return river_err_set(RIVER_ENOMEM, "grammar: no memory");
        r->at = av;
        r->cap = cap;
    }
    char *copy = malloc(n + 1);
    if (!copy)
        return river_err_set(RIVER_ENOMEM, "grammar: no memory");
    memcpy(copy, name, n);
    copy[n] = '\0';
    r->names[r->n] = copy;
    r->body[r->n] = NULL;
    r->at[r->n] = at;
    p->map[h] = r->n;
    *idx = r->n++;
    return 0;
}

static int is_name_char(int c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '-' || c == '_';
}

/* Skips spaces, tabs, carriage returns and comments; newlines too when newline_ok. */
static void skip_space(parser_t *p, int newline_ok)
{
    while (p->pos < p->len) {
        char c = p->s[p->pos];
        if (c == ' ' || c == '\t' || c == '\r') {
            p->pos++;
        } else if (c == '#') {
            while (p->pos < p->len && p->s[p->pos] != '\n')
                p->pos++;
        } else if (c == '\n' && newline_ok) {
            p->pos++;
        } else {
            break;
        }
    }
}

/* Decodes one UTF-8 character of the text; -1 when invalid, *pos then unchanged (the
 * error names where the character starts). */
static int32_t utf8_at(const parser_t *p, size_t *pos)
{
    size_t at = *pos;
    int32_t c = text_utf8_next(p->s, p->len, &at);
    if (c >= 0)
        *pos = at;
    return c;
}

/* One character of a literal or class, escapes decoded. */
static int parse_char(parser_t *p, uint32_t *cp)
{
    size_t at = p->pos;
    if (p->pos >= p->len)
        return fail_at(p, at, RIVER_EFORMAT, "unexpected end of text");
    if (p->s[p->pos] != '\\') {
        int32_t c = utf8_at(p, &p->pos);
        if (c < 0)
            return fail_at(p, at, RIVER_EFORMAT, "invalid UTF-8");
        *cp = (uint32_t)c;
        return 0;
    }
    p->pos++;
    if (p->pos >= p->len)
        return fail_at(p, at, RIVER_EFORMAT, "unexpected end of text after '\\'");
    char e = p->s[p->pos++];
    int digits = 0;
    switch (e) {
    case 'n': *cp = '\n'; return 0;
    case 'r': *cp = '\r'; return 0;
    case 't': *cp = '\t'; return 0;
    case '0': *cp = 0; return 0;
    case '\\': case '"': case '\'': case '[': case ']': case '-': case '^': case '/':
    case '.': case '(': case ')': case '|': case '*': case '+': case '?': case '{': case '}':
        *cp = (uint32_t)(unsigned char)e;
        return 0;
    case 'x': digits = 2; break;
    case 'u': digits = 4; break;
    case 'U': digits = 8; break;
    default:
        return fail_at(p, at, RIVER_EFORMAT, "unknown escape '\\%c'", e);
    }
    uint32_t v = 0;
    for (int i = 0; i < digits; i++) {
        int h = p->pos < p->len ? text_hex_digit((unsigned char)p->s[p->pos]) : -1;
        if (h < 0)
            return fail_at(p, at, RIVER_EFORMAT, "'\\%c' needs %d hex digits", e, digits);
        v = (v << 4) | (uint32_t)h;
        p->pos++;
    }
    if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF))
        return fail_at(p, at, RIVER_EFORMAT, "U+%04X is not a character", (unsigned)v);
    *cp = v;
    return 0;
}

static int parse_literal(parser_t *p, grammar__ast_t **out)
{
    int err = 0;
    size_t at = p->pos;
    grammar__ast_t *a = node_new(p, GRAMMAR__AST_LIT, &err);
    if (!a)
        return err;
    p->pos++; /* the opening quote */
    uint32_t cap = 0;
    for (;;) {
        if (p->pos >= p->len || p->s[p->pos] == '\n') {
            err = fail_at(p, at, RIVER_EFORMAT, "unterminated literal");
            goto fail;
        }
        if (p->s[p->pos] == '"') {
            p->pos++;
            break;
        }
        uint32_t cp;
        if ((err = parse_char(p, &cp)))
            goto fail;
        if (a->n_cps == cap) {
            cap = cap ? cap * 2 : 8;
            uint32_t *v = realloc(a->cps, cap * sizeof *v);
            if (!v) {
                err = river_err_set(RIVER_ENOMEM, "grammar: no memory");
                goto fail;
            }
            a->cps = v;
        }
        a->cps[a->n_cps++] = cp;
        /* Each character becomes an element. */
        if (++p->n_nodes > GRAMMAR_MAX_ELEMENTS) {
            err = fail_at(p, at, RIVER_ERANGE, "grammar larger than %u elements",
                          (unsigned)GRAMMAR_MAX_ELEMENTS);
            goto fail;
        }
    }
    *out = a;
    return 0;
fail:
    grammar__ast_free(a);
    return err;
}

static int parse_class(parser_t *p, grammar__ast_t **out)
{
    int err = 0;
    size_t at = p->pos;
    grammar__ast_t *a = node_new(p, GRAMMAR__AST_CLASS, &err);
    if (!a)
        return err;
    p->pos++;
    int negate = 0;
    if (p->pos < p->len && p->s[p->pos] == '^') {
        negate = 1;
        p->pos++;
    }
    uint32_t cap = 0;
    for (;;) {
        if (p->pos >= p->len || p->s[p->pos] == '\n') {
            err = fail_at(p, at, RIVER_EFORMAT, "unterminated character class");
            goto fail;
        }
        if (p->s[p->pos] == ']') {
            p->pos++;
            break;
        }
        uint32_t lo, hi;
        if ((err = parse_char(p, &lo)))
            goto fail;
        hi = lo;
        if (p->pos + 1 < p->len && p->s[p->pos] == '-' && p->s[p->pos + 1] != ']') {
            size_t dash = p->pos;
            p->pos++;
            if ((err = parse_char(p, &hi)))
                goto fail;
            if (hi < lo) {
                err = fail_at(p, dash, RIVER_EFORMAT, "range end U+%04X before its start U+%04X",
                              (unsigned)hi, (unsigned)lo);
                goto fail;
            }
        }
        if (a->n_ranges == cap) {
            cap = cap ? cap * 2 : 8;
            uint32_t *v = realloc(a->ranges, (2 * (size_t)cap + 2) * sizeof *v);
            if (!v) {
                err = river_err_set(RIVER_ENOMEM, "grammar: no memory");
                goto fail;
            }
            a->ranges = v;
        }
        a->ranges[2 * a->n_ranges] = lo;
        a->ranges[2 * a->n_ranges + 1] = hi;
        a->n_ranges++;
    }
    if (!a->ranges && !(a->ranges = malloc(2 * sizeof *a->ranges))) {
        err = river_err_set(RIVER_ENOMEM, "grammar: no memory");
        goto fail;
    }
    if ((err = grammar__ranges_normalize(&a->ranges, &a->n_ranges)))
        goto fail_nomem;
    if (negate && (err = grammar__ranges_negate(&a->ranges, &a->n_ranges)))
        goto fail_nomem;
    if (a->n_ranges == 0) {
        err = fail_at(p, at, RIVER_EFORMAT, "character class matches nothing");
        goto fail;
    }
    *out = a;
    return 0;
fail_nomem:
    err = river_err_set(RIVER_ENOMEM, "grammar: no memory");
fail:
    grammar__ast_free(a);
    return err;
}

static int parse_alternates(parser_t *p, int nested, grammar__ast_t **out);

static int parse_uint(parser_t *p, uint32_t *v)
{
    size_t at = p->pos;
    uint64_t x = 0;
    if (p->pos >= p->len || p->s[p->pos] < '0' || p->s[p->pos] > '9')
        return fail_at(p, at, RIVER_EFORMAT, "expected a number");
    while (p->pos < p->len && p->s[p->pos] >= '0' && p->s[p->pos] <= '9') {
        x = x * 10 + (uint64_t)(p->s[p->pos] - '0');
        if (x > GRAMMAR_MAX_REPEAT)
            return fail_at(p, at, RIVER_ERANGE, "repetition count over %u",
                           (unsigned)GRAMMAR_MAX_REPEAT);
        p->pos++;
    }
    *v = (uint32_t)x;
    return 0;
}

/* item suffix: * + ? {m} {m,} {m,n} */
static int parse_suffixes(parser_t *p, grammar__ast_t **item)
{
    /* Each suffix wraps the item once more, and building recurses once per wrap. */
    for (int n_suffix = 0;; n_suffix++) {
        if (n_suffix > GRAMMAR_MAX_NESTING)
            return fail_at(p, p->pos, RIVER_ERANGE, "more than %d repetition suffixes in a row",
                           GRAMMAR_MAX_NESTING);
        if (p->pos >= p->len)
            return 0;
        char c = p->s[p->pos];
        uint32_t min, max;
        size_t at = p->pos;
        if (c == '*') {
            min = 0, max = GRAMMAR__INF;
            p->pos++;
        } else if (c == '+') {
            min = 1, max = GRAMMAR__INF;
            p->pos++;
        } else if (c == '?') {
            min = 0, max = 1;
            p->pos++;
        } else if (c == '{') {
            p->pos++;
            skip_space(p, 0);
            int err = parse_uint(p, &min);
            if (err)
                return err;
            skip_space(p, 0);
            max = min;
            if (p->pos < p->len && p->s[p->pos] == ',') {
                p->pos++;
                skip_space(p, 0);
                if (p->pos < p->len && p->s[p->pos] == '}') {
                    max = GRAMMAR__INF;
                } else {
                    if ((err = parse_uint(p, &max)))
                        return err;
                    skip_space(p, 0);
                    if (max < min)
                        return fail_at(p, at, RIVER_EFORMAT, "repetition {%u,%u} has max < min",
                                       (unsigned)min, (unsigned)max);
                }
            }
            if (p->pos >= p->len || p->s[p->pos] != '}')
                return fail_at(p, p->pos, RIVER_EFORMAT, "expected '}'");
            p->pos++;
        } else {
            return 0;
        }
        int err = 0;
        grammar__ast_t *r = node_new(p, GRAMMAR__AST_REPEAT, &err);
        if (!r)
            return err;
        r->min = min;
        r->max = max;
        if ((err = kid_add(r, *item))) {
            free(r);
            return err;
        }
        *item = r;
    }
}

static int parse_sequence(parser_t *p, int nested, grammar__ast_t **out)
{
    int err = 0;
    grammar__ast_t *seq = node_new(p, GRAMMAR__AST_SEQ, &err);
    if (!seq)
        return err;
    for (;;) {
        skip_space(p, nested);
        if (p->pos >= p->len)
            break;
        char c = p->s[p->pos];
        size_t at = p->pos;
        grammar__ast_t *item = NULL;
        if (c == '"') {
            err = parse_literal(p, &item);
        } else if (c == '[') {
            err = parse_class(p, &item);
        } else if (c == '.') {
            item = node_new(p, GRAMMAR__AST_CLASS, &err);
            if (item) {
                p->pos++;
                item->ranges = malloc(4 * sizeof *item->ranges);
                if (!item->ranges) {
                    err = river_err_set(RIVER_ENOMEM, "grammar: no memory");
                } else {
                    item->ranges[0] = 0;
                    item->ranges[1] = 0x10FFFF;
                    item->n_ranges = 1;
                    err = grammar__ranges_normalize(&item->ranges, &item->n_ranges);
                }
            }
        } else if (c == '(') {
            if (p->depth >= GRAMMAR_MAX_NESTING) {
                err = fail_at(p, at, RIVER_ERANGE, "parentheses nested deeper than %d",
                              GRAMMAR_MAX_NESTING);
            } else {
                p->pos++;
                p->depth++;
                err = parse_alternates(p, 1, &item);
                p->depth--;
                if (!err) {
                    skip_space(p, 1);
                    if (p->pos >= p->len || p->s[p->pos] != ')')
                        err = fail_at(p, p->pos, RIVER_EFORMAT, "expected ')'");
                    else
                        p->pos++;
                }
            }
        } else if (is_name_char((unsigned char)c)) {
            size_t n = 0;
            while (p->pos + n < p->len && is_name_char((unsigned char)p->s[p->pos + n]))
                n++;
            /* A name followed by ::= starts the next rule: the sequence ended at the last
             * newline, which only happens when nested (a missing ')'). */
            size_t save = p->pos;
            p->pos += n;
            skip_space(p, 0);
            if (p->pos + 3 <= p->len && memcmp(p->s + p->pos, "::=", 3) == 0) {
                p->pos = save;
                err = fail_at(p, at, RIVER_EFORMAT, "rule definition inside parentheses "
                                                    "(a ')' is missing)");
            } else {
                p->pos = save;
                uint32_t idx;
                err = rule_index(p, p->s + p->pos, n, at, &idx);
                if (!err) {
                    item = node_new(p, GRAMMAR__AST_REF, &err);
                    if (item) {
                        item->ref = idx;
                        p->pos += n;
                    }
                }
            }
        } else {
            break;
        }
        if (!err && item)
            err = parse_suffixes(p, &item);
        if (!err && item)
            err = kid_add(seq, item);
        if (err) {
            grammar__ast_free(item);
            grammar__ast_free(seq);
            return err;
        }
    }
    *out = seq;
    return 0;
}

static int parse_alternates(parser_t *p, int nested, grammar__ast_t **out)
{
    int err = 0;
    grammar__ast_t *alt = node_new(p, GRAMMAR__AST_ALT, &err);
    if (!alt)
        return err;
    for (;;) {
        grammar__ast_t *seq = NULL;
        if ((err = parse_sequence(p, nested, &seq)) || (err = kid_add(alt, seq))) {
            grammar__ast_free(seq);
            grammar__ast_free(alt);
            return err;
        }
        skip_space(p, nested);
        if (p->pos < p->len && p->s[p->pos] == '|') {
            p->pos++;
            skip_space(p, 1);
            continue;
        }
        if (!nested) {
            /* A following line that starts with '|' continues this rule. */
            size_t save = p->pos;
            skip_space(p, 1);
            if (p->pos < p->len && p->s[p->pos] == '|') {
                p->pos++;
                skip_space(p, 1);
                continue;
            }
            p->pos = save;
        }
        break;
    }
    *out = alt;
    return 0;
}

static int parse_rules(parser_t *p)
{
    for (;;) {
        skip_space(p, 1);
        if (p->pos >= p->len)
            return 0;
        size_t at = p->pos;
        size_t n = 0;
        while (p->pos + n < p->len && is_name_char((unsigned char)p->s[p->pos + n]))
            n++;
        if (n == 0)
            return fail_at(p, at, RIVER_EFORMAT, "expected a rule name");
        uint32_t idx;
        int err = rule_index(p, p->s + p->pos, n, at, &idx);
        if (err)
            return err;
        p->pos += n;
        skip_space(p, 0);
        if (p->pos + 3 > p->len || memcmp(p->s + p->pos, "::=", 3) != 0)
            return fail_at(p, p->pos, RIVER_EFORMAT, "expected '::=' after rule name \"%s\"",
                           p->rules->names[idx]);
        if (p->rules->body[idx])
            return fail_at(p, at, RIVER_EFORMAT, "rule \"%s\" defined twice",
                           p->rules->names[idx]);
        p->pos += 3;
        skip_space(p, 1);
        grammar__ast_t *body = NULL;
        if ((err = parse_alternates(p, 0, &body)))
            return err;
        p->rules->body[idx] = body;
        skip_space(p, 0);
        if (p->pos < p->len && p->s[p->pos] != '\n') {
            char c = p->s[p->pos];
            if (c == ')')
                return fail_at(p, p->pos, RIVER_EFORMAT, "unmatched ')'");
            if ((unsigned char)c >= 0x20 && (unsigned char)c < 0x7F)
                return fail_at(p, p->pos, RIVER_EFORMAT, "unexpected '%c'", c);
            return fail_at(p, p->pos, RIVER_EFORMAT, "unexpected byte 0x%02X",
                           (unsigned char)c);
        }
    }
}

int grammar_parse(grammar_t **out, const char *text, size_t len)
{
    return grammar__parse_ex(out, text, len, NULL);
}

int grammar__parse_ex(grammar_t **out, const char *text, size_t len, char **bad_rule)
{
    if (!out)
        return river_err_set(RIVER_EINVAL, "grammar_parse: no output pointer");
    *out = NULL;
    if (!text && len)
        return river_err_set(RIVER_EINVAL, "grammar_parse: no text");
    if (len > GRAMMAR_MAX_TEXT)
        return river_err_set(RIVER_ERANGE, "grammar: text of %zu bytes is over the limit of %u",
                             len, (unsigned)GRAMMAR_MAX_TEXT);
    grammar__rules_ast_t rules = {0};
    parser_t p = {.s = text ? text : "", .len = len, .rules = &rules};
    int err = parse_rules(&p);
    if (err)
        goto fail;
    for (uint32_t i = 0; i < rules.n; i++)
        if (!rules.body[i]) {
            err = fail_at(&p, rules.at[i], RIVER_EFORMAT, "rule \"%s\" is used but not defined",
                          rules.names[i]);
            goto fail;
        }
    err = grammar__build(out, &rules, bad_rule);
fail:
    free(p.map);
    grammar__rules_ast_free(&rules);
    return err;
}
