/* Markup strings (text/jinja.h, "Markup"): markupsafe's escape(), Markup(), Markup + str
 * and the marking of what Markup's methods return, as markupsafe 3.0 does them. The
 * builtins that take Markup arguments or receivers apply these where Python would (the
 * escaping of Markup.join's items, Markup % args and Markup.format's fields lives with
 * those builtins). */
#include <string.h>

#include "common/err.h"
#include "text/jinja_builtins.h"

/* The replacement of one byte, or NULL when markupsafe leaves it alone. */
static const char *escape_of(char c, size_t *n)
{
    switch (c) {
    case '&': *n = 5; return "&amp;";
    case '<': *n = 4; return "&lt;";
    case '>': *n = 4; return "&gt;";
    case '"': *n = 5; return "&#34;";
    case '\'': *n = 5; return "&#39;";
    default: return NULL;
    }
}

/* Whether byte i of s is template text; *k walks s's spans forward with i. */
static int byte_is_template(const jstr_t *s, size_t i, uint32_t *k)
{
    if (s->prov != JPROV_MIXED)
        return s->prov == JPROV_TEMPLATE;
    while (*k < s->nspan && (size_t)s->span[*k].off + s->span[*k].len <= i)
        (*k)++;
    return *k < s->nspan && s->span[*k].off <= i;
}

int jr_escape_force(jrender_t *r, const jnode_t *at, const jstr_t *s, jstr_t **out)
{
    tb_t b = {.r = r, .at = at};
    jspans_t sp = {0};
    uint32_t k = 0;
    int err = 0;
    size_t run = 0, o = 0; /* the first byte not copied yet; the output offset of byte i */
    for (size_t i = 0; i < s->len && !b.err && !err; i++) {
        size_t n = 1;
        const char *rep = escape_of(s->s[i], &n);
        /* What a byte becomes has that byte's provenance (mixed text only: text of one
         * kind stays of that kind as a whole, below). */
        if (s->prov == JPROV_MIXED && byte_is_template(s, i, &k))
            err = jr_spans_push(r, at, &sp, o, n);
        o += n;
        if (rep) {
            jinja__tb_put(&b, s->s + run, i - run);
            jinja__tb_put(&b, rep, n);
            run = i + 1;
        }
    }
    if (err)
        return err;
    jinja__tb_put(&b, s->s + run, s->len - run);
    jval_t v;
    if ((err = jinja__tb_done(&b, &v)))
        return err;
    jstr_t *e = v.u.s;
    if (s->prov == JPROV_MIXED)
        jr_str_mark(e, &sp);
    else
        e->prov = s->prov;
    e->markup = 1;
    *out = e;
    return 0;
}

int jr_escape(jrender_t *r, const jnode_t *at, jstr_t *s, jstr_t **out)
{
    if (s->markup) {
        *out = s;
        return 0;
    }
    return jr_escape_force(r, at, s, out);
}

int jr_escape_value(jrender_t *r, const jnode_t *at, jval_t v, jstr_t **out)
{
    jstr_t *s;
    int err = jr_to_str(r, at, v, &s);
    return err ? err : jr_escape(r, at, s, out);
}

int jr_markup(jrender_t *r, const jnode_t *at, jstr_t *s, jstr_t **out)
{
    if (s->markup) {
        *out = s;
        return 0;
    }
    int err = jr_work(r, at, s->len);
    if (err)
        return err;
    jstr_t *m = jr_str_new(r, at, s->s, s->len);
    if (!m)
        return RIVER_ENOMEM;
    /* The same bytes: the same provenance (strings never change, so the spans are shared). */
    m->prov = s->prov;
    m->nspan = s->nspan;
    m->span = s->span;
    m->markup = 1;
    *out = m;
    return 0;
}

int jr_markup_value(jrender_t *r, const jnode_t *at, jval_t *v)
{
    int err;
    if (v->t == JV_STR) {
        jstr_t *m;
        if ((err = jr_markup(r, at, v->u.s, &m)))
            return err;
        *v = jv_str(m);
        return 0;
    }
    if (v->t != JV_LIST)
        return 0;
    /* A copy of the list: the one a builtin returned may be held elsewhere too. */
    jlist_t *l = jr_list_new(r, at, v->u.l->n);
    if (!l)
        return RIVER_ENOMEM;
    for (size_t i = 0; i < v->u.l->n; i++) {
        l->v[i] = v->u.l->v[i];
        if ((err = jr_markup_value(r, at, &l->v[i])))
            return err;
    }
    l->n = v->u.l->n;
    l->tuple = v->u.l->tuple;
    v->u.l = l;
    return 0;
}

/* The filters that keep a Markup a Markup: Jinja2's code for each calls a Markup method on
 * soft_str(value) (upper, strip, center, %, slicing, splitlines and join in indent) or
 * slices it (last goes through reversed(), which indexes). title, join and replace are not
 * here: with autoescape off they build a plain str even from a Markup. */
static const char *const keeping_filters[] = {
    "capitalize", "center", "format", "indent", "last", "lower", "reverse", "trim",
    "truncate", "upper",
};

/* The str methods markupsafe's Markup overrides to return a Markup (or a list of them). */
static const char *const keeping_methods[] = {
    "capitalize", "format", "join", "lower", "lstrip", "replace", "rsplit", "rstrip",
    "split", "splitlines", "strip", "title", "upper",
};

static int listed(const char *const *names, size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (!strcmp(names[i], name))
            return 1;
    return 0;
}

int jr_markup_result(jrender_t *r, const jnode_t *at, const jbuiltin_t *b, jval_t self,
                     jval_t *out)
{
    if (self.t != JV_STR || !self.u.s->markup)
        return 0;
    int keeps = b->type == JV_STR
                    ? listed(keeping_methods, sizeof keeping_methods / sizeof *keeping_methods,
                             b->name)
                    : b->type == JV_ABSENT &&
                          listed(keeping_filters, sizeof keeping_filters / sizeof *keeping_filters,
                                 b->name);
    return keeps ? jr_markup_value(r, at, out) : 0;
}

int jr_markup_add(jrender_t *r, const jnode_t *at, jstr_t *x, jstr_t *y, jstr_t **out)
{
    jstr_t *ex, *ey;
    int err;
    if ((err = jr_escape(r, at, x, &ex)) || (err = jr_escape(r, at, y, &ey)) ||
        (err = jr_str_concat(r, at, ex, ey, out)))
        return err;
    (*out)->markup = 1; /* jr_str_concat made it: no one else holds it yet */
    return 0;
}
