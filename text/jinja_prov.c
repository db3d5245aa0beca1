/* Provenance of the strings a rendering computes (text/jinja.h, jprov_t): which bytes are
 * the template's own text and which came from the context. Concatenation and output keep
 * the marks byte for byte; every other operation is judged by what it was given
 * (jr_prov_result), so that no operation can turn data into template text. */
#include <string.h>

#include "common/err.h"
#include "text/jinja.h"

/* Values jv_holds_data walks before it gives up and answers "yes": a template applying a
 * filter to a large structure again and again must not walk it again and again. */
#define JPROV_WALK_MAX 4096

int jr_spans_push(jrender_t *r, const jnode_t *at, jspans_t *b, size_t off, size_t len)
{
    if (len == 0)
        return 0;
    if (b->n && (size_t)b->v[b->n - 1].off + b->v[b->n - 1].len == off) {
        b->v[b->n - 1].len += (uint32_t)len;
        return 0;
    }
    if (b->n == b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 8;
        jspan_t *v = jr_alloc(r, at, cap * sizeof *v);
        if (!v)
            return RIVER_ENOMEM;
        if (b->n)
            memcpy(v, b->v, b->n * sizeof *v);
        b->v = v;
        b->cap = cap;
    }
    b->v[b->n++] = (jspan_t){(uint32_t)off, (uint32_t)len};
    return 0;
}

int jr_spans_add_str(jrender_t *r, const jnode_t *at, jspans_t *b, const jstr_t *s, size_t base)
{
    if (s->prov == JPROV_TEMPLATE)
        return jr_spans_push(r, at, b, base, s->len);
    int err = 0;
    for (uint32_t i = 0; s->prov == JPROV_MIXED && i < s->nspan && !err; i++)
        err = jr_spans_push(r, at, b, base + s->span[i].off, s->span[i].len);
    return err;
}

void jr_str_mark(jstr_t *s, const jspans_t *b)
{
    s->nspan = 0;
    s->span = NULL;
    if (b->n == 0 || s->len == 0) {
        s->prov = s->len == 0 ? JPROV_TEMPLATE : JPROV_DATA;
    } else if (b->n == 1 && b->v[0].off == 0 && b->v[0].len == s->len) {
        s->prov = JPROV_TEMPLATE;
    } else {
        s->prov = JPROV_MIXED;
        s->nspan = (uint32_t)b->n;
        s->span = b->v;
    }
}

static int holds_data(jval_t v, int depth, size_t *budget)
{
    if (*budget == 0 || depth > JINJA_MAX_DEPTH)
        return 1;
    (*budget)--;
    switch (v.t) {
    case JV_STR: return v.u.s->prov != JPROV_TEMPLATE;
    case JV_LIST:
        for (size_t i = 0; i < v.u.l->n; i++)
            if (holds_data(v.u.l->v[i], depth + 1, budget))
                return 1;
        return 0;
    case JV_DICT:
    case JV_NS:
        for (size_t i = 0; i < v.u.d->n; i++)
            if (v.u.d->k[i]->prov != JPROV_TEMPLATE ||
                holds_data(v.u.d->v[i], depth + 1, budget))
                return 1;
        return 0;
    case JV_LOOP: {
        jval_t items = {.t = JV_LIST};
        items.u.l = v.u.loop->items;
        return holds_data(items, depth + 1, budget);
    }
    case JV_FUNC:
        /* A bound method answers for its receiver; a macro's closure is out of sight. */
        return v.u.fn->kind == JF_METHOD ? holds_data(v.u.fn->self, depth + 1, budget)
                                         : v.u.fn->kind == JF_MACRO;
    default: return 0; /* numbers, booleans, none, undefined: no text of anyone's */
    }
}

int jv_holds_data(jval_t v)
{
    size_t budget = JPROV_WALK_MAX;
    return holds_data(v, 0, &budget);
}

int jr_str_concat(jrender_t *r, const jnode_t *at, const jstr_t *x, const jstr_t *y,
                  jstr_t **out)
{
    int err;
    if (x->len + y->len > JINJA_MAX_OUTPUT)
        return jr_fail(r, at, RIVER_EFULL, "string too long");
    if ((err = jr_work(r, at, x->len + y->len)))
        return err;
    jstr_t *s = jr_alloc(r, at, sizeof *s + x->len + y->len + 1);
    if (!s)
        return RIVER_ENOMEM;
    memcpy(s->s, x->s, x->len);
    memcpy(s->s + x->len, y->s, y->len);
    s->len = x->len + y->len;
    s->ascii = x->ascii && y->ascii;
    if (x->prov == JPROV_DATA && y->prov == JPROV_DATA) {
        s->prov = JPROV_DATA;
    } else if ((x->prov == JPROV_TEMPLATE || !x->len) && (y->prov == JPROV_TEMPLATE || !y->len)) {
        s->prov = JPROV_TEMPLATE;
    } else {
        jspans_t b = {0};
        if ((err = jr_spans_add_str(r, at, &b, x, 0)) ||
            (err = jr_spans_add_str(r, at, &b, y, x->len)))
            return err;
        jr_str_mark(s, &b);
    }
    *out = s;
    return 0;
}

void jr_prov_result(jval_t self, const jargs_t *args, jval_t *out)
{
    if (out->t != JV_STR || out->u.s->prov != JPROV_DATA || out->u.s->len == 0)
        return;
    if (jv_holds_data(self))
        return;
    for (size_t i = 0; args && i < args->npos; i++)
        if (jv_holds_data(args->pos[i]))
            return;
    for (size_t i = 0; args && i < args->nkw; i++)
        if (jv_holds_data(args->kwv[i]))
            return;
    /* Made from template text alone. Not a string from the context either: that one
     * would be reachable from what the builtin was given, which holds no data. */
    out->u.s->prov = JPROV_TEMPLATE;
}
