/* Chat-template builtins: the Python dict and list methods templates call (items, keys,
 * get, append, pop, ...) and the loop object's cycle, each as its Python counterpart. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <utf8proc.h>

#include "common/err.h"
#include "text/jinja_builtins.h"

/* ---- dict, list and loop methods ---- */

int jinja__m_items(jrender_t *r, const jnode_t *at, jval_t self, const jargs_t *args, jval_t *out)
{
    NO_ARGS("items");
    const jdict_t *d = self.u.d;
    jlist_t *l = jr_list_new(r, at, d->n);
    if (!l)
        return RIVER_ENOMEM;
    for (size_t i = 0; i < d->n; i++) {
        jlist_t *pair = jr_list_new(r, at, 2);
        if (!pair)
            return RIVER_ENOMEM;
        pair->tuple = 1;
        pair->v[0] = jv_str(d->k[i]);
        pair->v[1] = d->v[i];
        pair->n = 2;
        l->v[l->n++] = jinja__list_val(pair);
    }
    *out = jinja__list_val(l);
    return 0;
}

static int m_keys(jrender_t *r, const jnode_t *at, jval_t self, const jargs_t *args, jval_t *out)
{
    NO_ARGS("keys");
    jlist_t *l;
    int err = jr_iterate(r, at, self, &l);
    if (!err)
        *out = jinja__list_val(l);
    return err;
}

static int m_values(jrender_t *r, const jnode_t *at, jval_t self, const jargs_t *args, jval_t *out)
{
    NO_ARGS("values");
    const jdict_t *d = self.u.d;
    jlist_t *l = jr_list_new(r, at, d->n);
    if (!l)
        return RIVER_ENOMEM;
    if (d->n)
        memcpy(l->v, d->v, d->n * sizeof *l->v);
    l->n = d->n;
    *out = jinja__list_val(l);
    return 0;
}

static int m_get(jrender_t *r, const jnode_t *at, jval_t self, const jargs_t *args, jval_t *out)
{
    BIND("get", "key", "default");
    jval_t *v = a[0].t == JV_STR ? jv_dict_get(self.u.d, a[0].u.s->s, a[0].u.s->len) : NULL;
    *out = v ? *v : GIVEN(a[1]) ? a[1] : jv_none();
    return 0;
}

static int m_append(jrender_t *r, const jnode_t *at, jval_t self, const jargs_t *args, jval_t *out)
{
    BIND("append", "object");
    int err = jr_count(r, at, 1);
    if (err || (err = jr_list_push(r, at, self.u.l, a[0])))
        return err;
    *out = jv_none();
    return 0;
}

static int m_extend(jrender_t *r, const jnode_t *at, jval_t self, const jargs_t *args, jval_t *out)
{
    BIND("extend", "iterable");
    jlist_t *items;
    int err = jr_iterate(r, at, a[0], &items);
    if (err || (err = jr_count(r, at, items->n)))
        return err;
    size_t n = items->n; /* extending a list by itself adds it once */
    for (size_t i = 0; i < n; i++)
        if ((err = jr_list_push(r, at, self.u.l, items->v[i])))
            return err;
    *out = jv_none();
    return 0;
}

static int m_pop(jrender_t *r, const jnode_t *at, jval_t self, const jargs_t *args, jval_t *out)
{
    BIND("pop", "index");
    jlist_t *l = self.u.l;
    int64_t i = -1;
    int err;
    if (GIVEN(a[0]) && (err = jinja__want_int(r, at, a[0], "pop", &i)))
        return err;
    if (i < 0)
        i += (int64_t)l->n;
    if (i < 0 || i >= (int64_t)l->n)
        return jr_fail(r, at, RIVER_EINVAL, "pop index out of range");
    *out = l->v[i];
    memmove(l->v + i, l->v + i + 1, (l->n - (size_t)i - 1) * sizeof *l->v);
    l->n--;
    return 0;
}

static int m_insert(jrender_t *r, const jnode_t *at, jval_t self, const jargs_t *args, jval_t *out)
{
    BIND("insert", "index", "object");
    jlist_t *l = self.u.l;
    int64_t i;
    int err;
    if ((err = jinja__want_int(r, at, a[0], "insert", &i)) || (err = jr_count(r, at, 1)) ||
        (err = jr_list_push(r, at, l, a[1])))
        return err;
    int64_t n = (int64_t)l->n - 1;
    if (i < 0)
        i = i + n < 0 ? 0 : i + n;
    if (i > n)
        i = n;
    memmove(l->v + i + 1, l->v + i, (size_t)(n - i) * sizeof *l->v);
    l->v[i] = a[1];
    *out = jv_none();
    return 0;
}

static int m_lindex(jrender_t *r, const jnode_t *at, jval_t self, const jargs_t *args, jval_t *out)
{
    BIND("index", "value");
    for (size_t i = 0; i < self.u.l->n; i++)
        if (jv_equal(self.u.l->v[i], a[0])) {
            *out = jv_int((int64_t)i);
            return 0;
        }
    return jr_fail(r, at, RIVER_EINVAL, "value is not in list");
}

static int m_lcount(jrender_t *r, const jnode_t *at, jval_t self, const jargs_t *args, jval_t *out)
{
    BIND("count", "value");
    int64_t c = 0;
    for (size_t i = 0; i < self.u.l->n; i++)
        c += jv_equal(self.u.l->v[i], a[0]);
    *out = jv_int(c);
    return 0;
}

static int m_cycle(jrender_t *r, const jnode_t *at, jval_t self, const jargs_t *args, jval_t *out)
{
    if (!args->npos)
        return jr_fail(r, at, RIVER_EINVAL, "no items for cycling given");
    *out = args->pos[self.u.loop->i % args->npos];
    return 0;
}

/* ---- Table ---- */

const jbuiltin_t jinja__seq_methods[] = {
    {"items", jinja__m_items, JV_DICT},  {"keys", m_keys, JV_DICT},     {"values", m_values, JV_DICT},
    {"get", m_get, JV_DICT},      {"append", m_append, JV_LIST}, {"extend", m_extend, JV_LIST},
    {"pop", m_pop, JV_LIST},      {"insert", m_insert, JV_LIST}, {"index", m_lindex, JV_LIST},
    {"count", m_lcount, JV_LIST}, {"cycle", m_cycle, JV_LOOP},
};
const size_t jinja__n_seq_methods = sizeof jinja__seq_methods / sizeof jinja__seq_methods[0];
