/* Chat-template values: the arena they live in, strings, lists and dicts, and the Python
 * semantics templates see through them: truth values, ==, ordering, str(), repr() and
 * json.dumps(). Code points are counted on UTF-8 as Python counts characters. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include <utf8proc.h>

#include "common/err.h"
#include "text/jinja.h"
#include "text/utf8.h"

/* ---- Arena ---- */

typedef struct jchunk {
    struct jchunk *next;
    size_t size, used; /* bytes of data */
    size_t mapped;     /* bytes of the mapping, this header included */
    _Alignas(16) unsigned char data[];
} jchunk_t;

struct jarena {
    jchunk_t *head;
    size_t cap, total;
    size_t chunk; /* data bytes of the next chunk */
    int over;
};

/* Chunks are mappings of their own, unmapped when the arena is dropped: a large
 * rendering's memory leaves the process at once rather than staying in the allocator's
 * free lists (and in the RSS) after it. They grow from 64 KiB to 4 MiB, so a small
 * rendering maps little and a large one maps few times. */
#define JARENA_CHUNK_MIN (64u << 10)
#define JARENA_CHUNK_MAX (4u << 20)

jarena_t *jarena_new(size_t cap)
{
    jarena_t *a = calloc(1, sizeof *a);
    if (a) {
        a->cap = cap;
        a->chunk = JARENA_CHUNK_MIN;
    }
    return a;
}

void jarena_destroy(jarena_t **ap)
{
    if (!ap || !*ap)
        return;
    jchunk_t *c = (*ap)->head;
    while (c) {
        jchunk_t *nx = c->next;
        munmap(c, c->mapped);
        c = nx;
    }
    free(*ap);
    *ap = NULL;
}

static jchunk_t *jarena__map(size_t size)
{
    size_t page = 4096, mapped = (sizeof(jchunk_t) + size + page - 1) & ~(page - 1);
    void *m = mmap(NULL, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED)
        return NULL;
    jchunk_t *c = m;
    c->mapped = mapped;
    c->size = mapped - sizeof *c;
    c->used = 0;
    return c;
}

void *jarena_alloc(jarena_t *a, size_t n)
{
    n = (n + 15) & ~(size_t)15;
    if (n == 0)
        n = 16;
    if (n > a->cap || a->total > a->cap - n) {
        a->over = 1;
        return NULL;
    }
    jchunk_t *c = a->head;
    if (!c || c->size - c->used < n) {
        int big = n > a->chunk / 4;
        jchunk_t *nc = jarena__map(big ? n : a->chunk);
        if (!nc) {
            a->over = 0;
            return NULL;
        }
        if (!big && a->chunk < JARENA_CHUNK_MAX)
            a->chunk *= 2;
        if (big && c) {
            /* A big block goes behind the current chunk, which keeps its free space. */
            nc->next = c->next;
            c->next = nc;
        } else {
            nc->next = c;
            a->head = nc;
        }
        c = nc;
    }
    void *p = c->data + c->used;
    c->used += n;
    a->total += n;
    memset(p, 0, n);
    return p;
}

int jarena_over_cap(const jarena_t *a)
{
    return a->over;
}

/* ---- Code points ---- */

int32_t ju_decode(const char *s, size_t n, size_t *adv)
{
    const unsigned char *u = (const unsigned char *)s;
    unsigned c = u[0];
    size_t k;
    int32_t cp;
    if (c < 0x80) {
        *adv = 1;
        return (int32_t)c;
    } else if (c >= 0xC2 && c <= 0xDF) {
        k = 1;
        cp = c & 0x1F;
    } else if (c >= 0xE0 && c <= 0xEF) {
        k = 2;
        cp = c & 0x0F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        k = 3;
        cp = c & 0x07;
    } else {
        *adv = 1;
        return (int32_t)c;
    }
    if (n < k + 1) {
        *adv = 1;
        return (int32_t)c;
    }
    for (size_t i = 1; i <= k; i++) {
        if ((u[i] & 0xC0) != 0x80) {
            *adv = 1;
            return (int32_t)c;
        }
        cp = (cp << 6) | (u[i] & 0x3F);
    }
    if ((k == 2 && cp < 0x800) || (k == 3 && (cp < 0x10000 || cp > 0x10FFFF))) {
        *adv = 1;
        return (int32_t)c;
    }
    *adv = k + 1;
    return cp;
}

size_t ju_encode(int32_t cp, char *buf)
{
    return text_utf8_encode((uint32_t)cp, buf);
}

size_t ju_len(const char *s, size_t n)
{
    size_t cps = 0, i = 0, adv;
    while (i < n) {
        if ((unsigned char)s[i] < 0x80) {
            i++;
        } else {
            ju_decode(s + i, n - i, &adv);
            i += adv;
        }
        cps++;
    }
    return cps;
}

size_t ju_offset(const char *s, size_t n, size_t cp)
{
    size_t i = 0, adv;
    while (cp > 0 && i < n) {
        ju_decode(s + i, n - i, &adv);
        i += adv;
        cp--;
    }
    return i;
}

int ju_isspace(int32_t cp)
{
    if (cp == ' ' || (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x1F) || cp == 0x85)
        return 1;
    if (cp < 0xA0)
        return 0;
    int cat = utf8proc_category(cp);
    return cat == UTF8PROC_CATEGORY_ZS || cat == UTF8PROC_CATEGORY_ZL ||
           cat == UTF8PROC_CATEGORY_ZP;
}

/* ---- Strings, lists, dicts ---- */

jval_t jv_str(jstr_t *s)
{
    jval_t v = {.t = JV_STR};
    v.u.s = s;
    return v;
}

jstr_t *jr_str_new(jrender_t *r, const jnode_t *at, const char *s, size_t len)
{
    if (len > JINJA_MAX_MEMORY) {
        jr_fail(r, at, RIVER_EFULL, "string too long");
        return NULL;
    }
    jstr_t *o = jr_alloc(r, at, sizeof *o + len + 1);
    if (!o)
        return NULL;
    if (len)
        memcpy(o->s, s, len);
    o->len = len;
    o->ascii = 1;
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)s[i] >= 0x80) {
            o->ascii = 0;
            break;
        }
    return o;
}

int jr_strval(jrender_t *r, const jnode_t *at, const char *s, size_t len, jval_t *out)
{
    jstr_t *o = jr_str_new(r, at, s, len);
    if (!o)
        return RIVER_ENOMEM;
    *out = jv_str(o);
    return 0;
}

jlist_t *jr_list_new(jrender_t *r, const jnode_t *at, size_t cap)
{
    jlist_t *l = jr_alloc(r, at, sizeof *l);
    if (!l)
        return NULL;
    if (cap) {
        if (cap > JINJA_MAX_MEMORY / sizeof(jval_t)) {
            jr_fail(r, at, RIVER_EFULL, "list too long");
            return NULL;
        }
        l->v = jr_alloc(r, at, cap * sizeof *l->v);
        if (!l->v)
            return NULL;
        l->cap = cap;
    }
    return l;
}

int jr_list_push(jrender_t *r, const jnode_t *at, jlist_t *l, jval_t v)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 4;
        if (cap > JINJA_MAX_MEMORY / sizeof(jval_t))
            return jr_fail(r, at, RIVER_EFULL, "list too long");
        jval_t *nv = jr_alloc(r, at, cap * sizeof *nv);
        if (!nv)
            return RIVER_ENOMEM;
        if (l->n)
            memcpy(nv, l->v, l->n * sizeof *nv);
        l->v = nv;
        l->cap = cap;
    }
    l->v[l->n++] = v;
    return 0;
}

jdict_t *jr_dict_new(jrender_t *r, const jnode_t *at, size_t cap)
{
    jdict_t *d = jr_alloc(r, at, sizeof *d);
    if (!d)
        return NULL;
    if (cap) {
        if (cap > JINJA_MAX_MEMORY / sizeof(jval_t)) {
            jr_fail(r, at, RIVER_EFULL, "dict too large");
            return NULL;
        }
        d->k = jr_alloc(r, at, cap * sizeof *d->k);
        d->v = jr_alloc(r, at, cap * sizeof *d->v);
        if (!d->k || !d->v)
            return NULL;
        d->cap = cap;
    }
    return d;
}

jval_t *jv_dict_get(const jdict_t *d, const char *key, size_t len)
{
    for (size_t i = 0; i < d->n; i++)
        if (d->k[i]->len == len && !memcmp(d->k[i]->s, key, len))
            return &d->v[i];
    return NULL;
}

int jr_dict_set(jrender_t *r, const jnode_t *at, jdict_t *d, jstr_t *k, jval_t v)
{
    jval_t *old = jv_dict_get(d, k->s, k->len);
    if (old) {
        *old = v;
        return 0;
    }
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 4;
        if (cap > JINJA_MAX_MEMORY / sizeof(jval_t))
            return jr_fail(r, at, RIVER_EFULL, "dict too large");
        jstr_t **nk = jr_alloc(r, at, cap * sizeof *nk);
        jval_t *nv = nk ? jr_alloc(r, at, cap * sizeof *nv) : NULL;
        if (!nv)
            return RIVER_ENOMEM;
        if (d->n) {
            memcpy(nk, d->k, d->n * sizeof *nk);
            memcpy(nv, d->v, d->n * sizeof *nv);
        }
        d->k = nk;
        d->v = nv;
        d->cap = cap;
    }
    d->k[d->n] = k;
    d->v[d->n] = v;
    d->n++;
    return 0;
}

/* ---- Python semantics ---- */

int jv_truthy(jval_t v)
{
    switch (v.t) {
    case JV_ABSENT:
    case JV_UNDEF:
    case JV_NONE: return 0;
    case JV_BOOL: return v.u.b;
    case JV_INT: return v.u.i != 0;
    case JV_FLOAT: return v.u.f != 0.0;
    case JV_STR: return v.u.s->len != 0;
    case JV_LIST: return v.u.l->n != 0;
    case JV_DICT: return v.u.d->n != 0;
    default: return 1;
    }
}

const char *jv_type_name(jval_t v)
{
    switch (v.t) {
    case JV_ABSENT:
    case JV_UNDEF: return "Undefined";
    case JV_NONE: return "NoneType";
    case JV_BOOL: return "bool";
    case JV_INT: return "int";
    case JV_FLOAT: return "float";
    case JV_STR: return v.u.s->markup ? "Markup" : "str";
    case JV_LIST: return v.u.l->tuple ? "tuple" : "list";
    case JV_DICT: return "dict";
    case JV_NS: return "Namespace";
    case JV_LOOP: return "LoopContext";
    case JV_FUNC: return "function";
    }
    return "object";
}

static int is_num(jval_t v)
{
    return v.t == JV_BOOL || v.t == JV_INT || v.t == JV_FLOAT;
}

static double num_f(jval_t v)
{
    return v.t == JV_FLOAT ? v.u.f : v.t == JV_INT ? (double)v.u.i : (double)v.u.b;
}

static int64_t num_i(jval_t v)
{
    return v.t == JV_INT ? v.u.i : v.u.b;
}

static int equal_depth(jval_t a, jval_t b, int depth)
{
    if (depth > JINJA_MAX_DEPTH)
        return 0;
    if (is_num(a) && is_num(b)) {
        if (a.t == JV_FLOAT || b.t == JV_FLOAT)
            return num_f(a) == num_f(b);
        return num_i(a) == num_i(b);
    }
    if (a.t == JV_ABSENT)
        a.t = JV_UNDEF;
    if (b.t == JV_ABSENT)
        b.t = JV_UNDEF;
    if (a.t != b.t)
        return 0;
    switch (a.t) {
    case JV_UNDEF:
    case JV_NONE: return 1;
    case JV_STR: return a.u.s->len == b.u.s->len && !memcmp(a.u.s->s, b.u.s->s, a.u.s->len);
    case JV_LIST:
        if (a.u.l->tuple != b.u.l->tuple || a.u.l->n != b.u.l->n)
            return 0;
        for (size_t i = 0; i < a.u.l->n; i++)
            if (!equal_depth(a.u.l->v[i], b.u.l->v[i], depth + 1))
                return 0;
        return 1;
    case JV_DICT:
        if (a.u.d->n != b.u.d->n)
            return 0;
        for (size_t i = 0; i < a.u.d->n; i++) {
            jval_t *o = jv_dict_get(b.u.d, a.u.d->k[i]->s, a.u.d->k[i]->len);
            if (!o || !equal_depth(a.u.d->v[i], *o, depth + 1))
                return 0;
        }
        return 1;
    case JV_NS: return a.u.d == b.u.d;
    case JV_LOOP: return a.u.loop == b.u.loop;
    case JV_FUNC: return a.u.fn == b.u.fn;
    default: return 0;
    }
}

int jv_equal(jval_t a, jval_t b)
{
    return equal_depth(a, b, 0);
}

/* Three-way order of two values Python orders; 2 when it does not. */
static int order(jval_t a, jval_t b, int depth)
{
    if (depth > JINJA_MAX_DEPTH)
        return 2;
    if (is_num(a) && is_num(b)) {
        if (a.t == JV_FLOAT || b.t == JV_FLOAT) {
            double x = num_f(a), y = num_f(b);
            if (isnan(x) || isnan(y))
                return 3; /* unordered: every comparison false */
            return x < y ? -1 : x > y;
        }
        int64_t x = num_i(a), y = num_i(b);
        return x < y ? -1 : x > y;
    }
    if (a.t == JV_STR && b.t == JV_STR) {
        size_t n = a.u.s->len < b.u.s->len ? a.u.s->len : b.u.s->len;
        int c = memcmp(a.u.s->s, b.u.s->s, n);
        if (c)
            return c < 0 ? -1 : 1;
        return a.u.s->len < b.u.s->len ? -1 : a.u.s->len > b.u.s->len;
    }
    if (a.t == JV_LIST && b.t == JV_LIST && a.u.l->tuple == b.u.l->tuple) {
        size_t n = a.u.l->n < b.u.l->n ? a.u.l->n : b.u.l->n;
        for (size_t i = 0; i < n; i++) {
            if (equal_depth(a.u.l->v[i], b.u.l->v[i], depth + 1))
                continue;
            return order(a.u.l->v[i], b.u.l->v[i], depth + 1);
        }
        return a.u.l->n < b.u.l->n ? -1 : a.u.l->n > b.u.l->n;
    }
    return 2;
}

int jr_compare(jrender_t *r, const jnode_t *at, int op, jval_t a, jval_t b, int *res)
{
    if (a.t == JV_UNDEF || b.t == JV_UNDEF)
        return jr_fail(r, at, RIVER_EINVAL, "%s is undefined (in a comparison)",
                       a.t == JV_UNDEF && a.u.undef_name ? a.u.undef_name
                       : b.t == JV_UNDEF && b.u.undef_name ? b.u.undef_name : "a value");
    int c = order(a, b, 0);
    if (c == 2)
        return jr_fail(r, at, RIVER_EINVAL, "'%s' not supported between instances of '%s' and '%s'",
                       op == '<' ? "<" : op == OP_LE ? "<=" : op == '>' ? ">" : ">=",
                       jv_type_name(a), jv_type_name(b));
    if (c == 3) {
        *res = 0;
        return 0;
    }
    *res = op == '<' ? c < 0 : op == OP_LE ? c <= 0 : op == '>' ? c > 0 : c >= 0;
    return 0;
}

/* ---- Text building ---- */

typedef struct sbuf {
    jrender_t *r;
    const jnode_t *at;
    char *p;
    size_t n, cap;
    int err;
} sbuf_t;

static int sb_grow(sbuf_t *b, size_t extra)
{
    if (b->err)
        return b->err;
    if (b->n + extra <= b->cap)
        return 0;
    if (b->n + extra > JINJA_MAX_OUTPUT)
        return b->err = jr_fail(b->r, b->at, RIVER_EFULL, "a value's text is over %u bytes",
                                JINJA_MAX_OUTPUT);
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->n + extra)
        cap *= 2;
    char *np = jr_alloc(b->r, b->at, cap + 1);
    if (!np)
        return b->err = RIVER_ENOMEM;
    if (b->n)
        memcpy(np, b->p, b->n);
    b->p = np;
    b->cap = cap;
    return 0;
}

static void sb_put(sbuf_t *b, const char *s, size_t n)
{
    if (sb_grow(b, n))
        return;
    memcpy(b->p + b->n, s, n);
    b->n += n;
}

static void sb_puts(sbuf_t *b, const char *s)
{
    sb_put(b, s, strlen(s));
}

static int sb_done(sbuf_t *b, jstr_t **out)
{
    if (b->err)
        return b->err;
    int err = jr_work(b->r, b->at, b->n);
    if (err)
        return err;
    jstr_t *s = jr_str_new(b->r, b->at, b->p ? b->p : "", b->n);
    if (!s)
        return RIVER_ENOMEM;
    *out = s;
    return 0;
}

void jv_float_repr(double f, char *buf, size_t cap)
{
    if (isnan(f)) {
        snprintf(buf, cap, "nan");
        return;
    }
    if (isinf(f)) {
        snprintf(buf, cap, f < 0 ? "-inf" : "inf");
        return;
    }
    /* The shortest digits that read back as f, placed as Python's repr places them. */
    char e[40];
    int prec;
    for (prec = 1; prec <= 17; prec++) {
        snprintf(e, sizeof e, "%.*e", prec - 1, f);
        if (strtod(e, NULL) == f)
            break;
    }
    char digits[24];
    size_t nd = 0;
    const char *p = e;
    int neg = 0;
    if (*p == '-') {
        neg = 1;
        p++;
    }
    for (; *p && *p != 'e'; p++)
        if (*p >= '0' && *p <= '9')
            digits[nd++] = *p;
    int exp10 = atoi(p + 1);
    while (nd > 1 && digits[nd - 1] == '0')
        nd--;
    char out[64];
    size_t o = 0;
    if (neg)
        out[o++] = '-';
    if (exp10 >= -5 + 1 && exp10 < 16) {
        if (exp10 < 0) {
            out[o++] = '0';
            out[o++] = '.';
            for (int i = 0; i < -exp10 - 1; i++)
                out[o++] = '0';
            for (size_t i = 0; i < nd; i++)
                out[o++] = digits[i];
        } else {
            for (int i = 0; i <= exp10; i++)
                out[o++] = (size_t)i < nd ? digits[i] : '0';
            out[o++] = '.';
            if ((size_t)exp10 + 1 < nd)
                for (size_t i = (size_t)exp10 + 1; i < nd; i++)
                    out[o++] = digits[i];
            else
                out[o++] = '0';
        }
        out[o] = 0;
    } else {
        out[o++] = digits[0];
        if (nd > 1) {
            out[o++] = '.';
            for (size_t i = 1; i < nd; i++)
                out[o++] = digits[i];
        }
        o += (size_t)snprintf(out + o, sizeof out - o, "e%c%02d", exp10 < 0 ? '-' : '+',
                              exp10 < 0 ? -exp10 : exp10);
    }
    snprintf(buf, cap, "%s", out);
}

/* Python's repr() of a str (markup 0) or of a Markup, which prints as Markup('...'). */
static void repr_str(sbuf_t *b, const char *s, size_t n, int markup)
{
    if (markup)
        sb_puts(b, "Markup(");
    int has_sq = memchr(s, '\'', n) != NULL, has_dq = memchr(s, '"', n) != NULL;
    char q = has_sq && !has_dq ? '"' : '\'';
    sb_put(b, &q, 1);
    size_t i = 0;
    while (i < n && !b->err) {
        size_t adv;
        int32_t cp = ju_decode(s + i, n - i, &adv);
        char esc[16];
        if (cp == q || cp == '\\') {
            esc[0] = '\\';
            esc[1] = (char)cp;
            sb_put(b, esc, 2);
        } else if (cp == '\n') {
            sb_puts(b, "\\n");
        } else if (cp == '\r') {
            sb_puts(b, "\\r");
        } else if (cp == '\t') {
            sb_puts(b, "\\t");
        } else if (cp < 0x20 || cp == 0x7f || (adv == 1 && cp >= 0x80) ||
                   (cp >= 0x80 && cp < 0xA0)) {
            snprintf(esc, sizeof esc, "\\x%02x", (unsigned)cp & 0xff);
            sb_puts(b, esc);
        } else {
            int cat = cp >= 0xA0 ? utf8proc_category(cp) : UTF8PROC_CATEGORY_LU;
            if (cp >= 0xA0 && (cat == UTF8PROC_CATEGORY_ZL || cat == UTF8PROC_CATEGORY_ZP ||
                               cat == UTF8PROC_CATEGORY_CC || cat == UTF8PROC_CATEGORY_CF ||
                               cat == UTF8PROC_CATEGORY_CS || cat == UTF8PROC_CATEGORY_CO ||
                               cat == UTF8PROC_CATEGORY_CN ||
                               (cat == UTF8PROC_CATEGORY_ZS && cp != ' '))) {
                if (cp < 0x100)
                    snprintf(esc, sizeof esc, "\\x%02x", (unsigned)cp);
                else if (cp < 0x10000)
                    snprintf(esc, sizeof esc, "\\u%04x", (unsigned)cp);
                else
                    snprintf(esc, sizeof esc, "\\U%08x", (unsigned)cp);
                sb_puts(b, esc);
            } else {
                sb_put(b, s + i, adv);
            }
        }
        i += adv;
    }
    sb_put(b, &q, 1);
    if (markup)
        sb_puts(b, ")");
}

static void put_value(sbuf_t *b, jval_t v, int repr, int depth);

static void put_seq(sbuf_t *b, const jval_t *items, size_t n, const char *open, const char *close,
                    int tuple, int depth)
{
    sb_puts(b, open);
    for (size_t i = 0; i < n && !b->err; i++) {
        if (i)
            sb_puts(b, ", ");
        put_value(b, items[i], 1, depth + 1);
    }
    if (tuple && n == 1)
        sb_puts(b, ",");
    sb_puts(b, close);
}

static void put_dict(sbuf_t *b, const jdict_t *d, int depth)
{
    sb_puts(b, "{");
    for (size_t i = 0; i < d->n && !b->err; i++) {
        if (i)
            sb_puts(b, ", ");
        repr_str(b, d->k[i]->s, d->k[i]->len, d->k[i]->markup);
        sb_puts(b, ": ");
        put_value(b, d->v[i], 1, depth + 1);
    }
    sb_puts(b, "}");
}

static void put_value(sbuf_t *b, jval_t v, int repr, int depth)
{
    if (b->err)
        return;
    if (depth > JINJA_MAX_DEPTH) {
        b->err = jr_fail(b->r, b->at, RIVER_EFULL, "value nested too deeply to print");
        return;
    }
    char num[64];
    switch (v.t) {
    case JV_ABSENT:
    case JV_UNDEF: break;
    case JV_NONE: sb_puts(b, "None"); break;
    case JV_BOOL: sb_puts(b, v.u.b ? "True" : "False"); break;
    case JV_INT:
        snprintf(num, sizeof num, "%lld", (long long)v.u.i);
        sb_puts(b, num);
        break;
    case JV_FLOAT:
        jv_float_repr(v.u.f, num, sizeof num);
        sb_puts(b, num);
        break;
    case JV_STR:
        if (repr)
            repr_str(b, v.u.s->s, v.u.s->len, v.u.s->markup);
        else
            sb_put(b, v.u.s->s, v.u.s->len);
        break;
    case JV_LIST:
        put_seq(b, v.u.l->v, v.u.l->n, v.u.l->tuple ? "(" : "[", v.u.l->tuple ? ")" : "]",
                v.u.l->tuple, depth);
        break;
    case JV_DICT: put_dict(b, v.u.d, depth); break;
    case JV_NS:
        sb_puts(b, "<Namespace ");
        put_dict(b, v.u.d, depth);
        sb_puts(b, ">");
        break;
    case JV_LOOP: sb_puts(b, "<LoopContext>"); break;
    case JV_FUNC:
        if (v.u.fn->kind == JF_MACRO)
            snprintf(num, sizeof num, "<Macro '%.40s'>",
                     v.u.fn->macro->kind == S_MACRO ? v.u.fn->macro->name : "caller");
        else
            snprintf(num, sizeof num, "<built-in function %.30s>", v.u.fn->entry->name);
        sb_puts(b, num);
        break;
    }
}

int jr_to_str(jrender_t *r, const jnode_t *at, jval_t v, jstr_t **out)
{
    if (v.t == JV_STR) {
        *out = v.u.s;
        return 0;
    }
    sbuf_t b = {.r = r, .at = at};
    put_value(&b, v, 0, 0);
    int err = sb_done(&b, out);
    /* The text of a number, or of a list holding template strings only, is the
     * template's. */
    if (!err && !jv_holds_data(v))
        (*out)->prov = JPROV_TEMPLATE;
    return err;
}

int jr_repr(jrender_t *r, const jnode_t *at, jval_t v, jstr_t **out)
{
    sbuf_t b = {.r = r, .at = at};
    if (v.t == JV_UNDEF || v.t == JV_ABSENT)
        sb_puts(&b, "Undefined");
    else
        put_value(&b, v, 1, 0);
    return sb_done(&b, out);
}

/* ---- json.dumps ---- */

typedef struct jsonopt {
    const char *indent;
    size_t indent_len;
    int use_indent;
    const char *item_sep, *key_sep;
    int sort_keys;
} jsonopt_t;

static void json_str(sbuf_t *b, const char *s, size_t n)
{
    sb_put(b, "\"", 1);
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c != '"' && c != '\\')
            continue;
        sb_put(b, s + run, i - run);
        run = i + 1;
        char esc[8];
        switch (c) {
        case '"': sb_puts(b, "\\\""); break;
        case '\\': sb_puts(b, "\\\\"); break;
        case '\n': sb_puts(b, "\\n"); break;
        case '\r': sb_puts(b, "\\r"); break;
        case '\t': sb_puts(b, "\\t"); break;
        case '\b': sb_puts(b, "\\b"); break;
        case '\f': sb_puts(b, "\\f"); break;
        default:
            snprintf(esc, sizeof esc, "\\u%04x", c);
            sb_puts(b, esc);
        }
    }
    sb_put(b, s + run, n - run);
    sb_put(b, "\"", 1);
}

static void json_newline(sbuf_t *b, const jsonopt_t *o, int level)
{
    sb_put(b, "\n", 1);
    for (int i = 0; i < level && !b->err; i++)
        sb_put(b, o->indent, o->indent_len);
}

static int key_cmp(const void *x, const void *y)
{
    const jstr_t *a = **(jstr_t *const *const *)x, *c = **(jstr_t *const *const *)y;
    size_t n = a->len < c->len ? a->len : c->len;
    int r = memcmp(a->s, c->s, n);
    return r ? r : (a->len > c->len) - (a->len < c->len);
}

static void json_value(sbuf_t *b, jval_t v, const jsonopt_t *o, int level)
{
    if (b->err)
        return;
    if (level > JINJA_MAX_DEPTH) {
        b->err = jr_fail(b->r, b->at, RIVER_EFULL, "value nested too deeply for tojson");
        return;
    }
    char num[64];
    switch (v.t) {
    case JV_NONE: sb_puts(b, "null"); break;
    case JV_BOOL: sb_puts(b, v.u.b ? "true" : "false"); break;
    case JV_INT:
        snprintf(num, sizeof num, "%lld", (long long)v.u.i);
        sb_puts(b, num);
        break;
    case JV_FLOAT:
        if (isnan(v.u.f))
            sb_puts(b, "NaN");
        else if (isinf(v.u.f))
            sb_puts(b, v.u.f < 0 ? "-Infinity" : "Infinity");
        else {
            jv_float_repr(v.u.f, num, sizeof num);
            sb_puts(b, num);
        }
        break;
    case JV_STR: json_str(b, v.u.s->s, v.u.s->len); break;
    case JV_LIST: {
        const jlist_t *l = v.u.l;
        if (!l->n) {
            sb_puts(b, "[]");
            break;
        }
        sb_puts(b, "[");
        for (size_t i = 0; i < l->n && !b->err; i++) {
            if (i)
                sb_puts(b, o->item_sep);
            if (o->use_indent)
                json_newline(b, o, level + 1);
            json_value(b, l->v[i], o, level + 1);
        }
        if (o->use_indent)
            json_newline(b, o, level);
        sb_puts(b, "]");
        break;
    }
    case JV_DICT: {
        const jdict_t *d = v.u.d;
        if (!d->n) {
            sb_puts(b, "{}");
            break;
        }
        jstr_t **order_k = NULL;
        if (o->sort_keys) {
            /* Sort pointers to the keys, then find each key's value. */
            jstr_t ***idx = jr_alloc(b->r, b->at, d->n * sizeof *idx);
            if (!idx) {
                b->err = RIVER_ENOMEM;
                return;
            }
            for (size_t i = 0; i < d->n; i++)
                idx[i] = &d->k[i];
            qsort(idx, d->n, sizeof *idx, key_cmp);
            order_k = (jstr_t **)idx;
        }
        sb_puts(b, "{");
        for (size_t j = 0; j < d->n && !b->err; j++) {
            size_t i = order_k ? (size_t)(((jstr_t ***)order_k)[j] - d->k) : j;
            if (j)
                sb_puts(b, o->item_sep);
            if (o->use_indent)
                json_newline(b, o, level + 1);
            json_str(b, d->k[i]->s, d->k[i]->len);
            sb_puts(b, o->key_sep);
            json_value(b, d->v[i], o, level + 1);
        }
        if (o->use_indent)
            json_newline(b, o, level);
        sb_puts(b, "}");
        break;
    }
    default:
        b->err = jr_fail(b->r, b->at, RIVER_EINVAL, "Object of type %s is not JSON serializable",
                         jv_type_name(v));
    }
}

int jr_tojson(jrender_t *r, const jnode_t *at, jval_t v, const char *indent, size_t indent_len,
              int use_indent, const char *item_sep, const char *key_sep, int sort_keys,
              jstr_t **out)
{
    jsonopt_t o = {indent, indent_len, use_indent, item_sep, key_sep, sort_keys};
    sbuf_t b = {.r = r, .at = at};
    json_value(&b, v, &o, 0);
    return sb_done(&b, out);
}
