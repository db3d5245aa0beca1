/* The chat-template evaluator: walks the AST over values (text/jinja.h) with Jinja2's
 * semantics: undefined values that print as nothing but fail on attribute access, calls
 * and arithmetic; attribute lookup before item lookup for "a.b" and the reverse for
 * "a[b]"; for loops with a loop object, an "if" filter, "else" and break/continue, each
 * iteration in a scope of its own (what a loop body sets does not leave it, which is why
 * templates use namespace()); macros with defaults and caller(); block set and filter
 * blocks. Every bound (output, memory, iterations, macro depth) is an error naming the
 * template and line. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/err.h"
#include "text/jinja.h"

typedef struct jscope {
    struct jscope *parent;
    size_t n, cap;
    const char **names;
    jval_t *vals;
} jscope_t;

typedef struct obuf {
    char *p;
    size_t n, cap;
    jspans_t spans; /* which of the n bytes are template text */
} obuf_t;

struct jrender {
    const char *name;
    jarena_t *arena;
    obuf_t *out;
    jscope_t *root;
    int calls;    /* nested macro calls now */
    int depth;    /* nested eval/exec calls now */
    size_t iters; /* loop iterations so far */
    const jval_t *filter_input; /* the body of the filter block being applied */
    size_t max_memory;          /* bytes the arena hands out */
};

enum { FLOW_BREAK = 1, FLOW_CONTINUE = 2 };

int jr_fail(jrender_t *r, const jnode_t *at, int err, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return river_err_set(err, "%s:%d: %s", r->name, at ? at->line : 0, msg);
}

void *jr_alloc(jrender_t *r, const jnode_t *at, size_t n)
{
    void *p = jarena_alloc(r->arena, n);
    if (!p) {
        if (jarena_over_cap(r->arena))
            jr_fail(r, at, RIVER_EFULL, "the rendering needs more than %zu KiB of memory",
                    r->max_memory >> 10);
        else
            jr_fail(r, at, RIVER_ENOMEM, "out of memory");
    }
    return p;
}

int jr_count(jrender_t *r, const jnode_t *at, size_t n)
{
    if (n > JINJA_MAX_ITERS || r->iters + n > JINJA_MAX_ITERS)
        return jr_fail(r, at, RIVER_EFULL, "more than %u loop iterations (or as much work)",
                       JINJA_MAX_ITERS);
    r->iters += n;
    return 0;
}

int jr_work(jrender_t *r, const jnode_t *at, size_t bytes)
{
    return bytes >= 1024 ? jr_count(r, at, bytes / 1024) : 0;
}

/* ---- Scopes ---- */

static jscope_t *scope_new(jrender_t *r, const jnode_t *at, jscope_t *parent)
{
    jscope_t *s = jr_alloc(r, at, sizeof *s);
    if (s)
        s->parent = parent;
    return s;
}

static jval_t *scope_find(jscope_t *s, const char *name)
{
    for (; s; s = s->parent)
        for (size_t i = s->n; i-- > 0;)
            if (!strcmp(s->names[i], name))
                return &s->vals[i];
    return NULL;
}

static int scope_set(jrender_t *r, const jnode_t *at, jscope_t *s, const char *name, jval_t v)
{
    for (size_t i = 0; i < s->n; i++)
        if (!strcmp(s->names[i], name)) {
            s->vals[i] = v;
            return 0;
        }
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 8;
        const char **nn = jr_alloc(r, at, cap * sizeof *nn);
        jval_t *nv = nn ? jr_alloc(r, at, cap * sizeof *nv) : NULL;
        if (!nv)
            return RIVER_ENOMEM;
        if (s->n) {
            memcpy(nn, s->names, s->n * sizeof *nn);
            memcpy(nv, s->vals, s->n * sizeof *nv);
        }
        s->names = nn;
        s->vals = nv;
        s->cap = cap;
    }
    s->names[s->n] = name;
    s->vals[s->n] = v;
    s->n++;
    return 0;
}

/* ---- Output ---- */

static int emit(jrender_t *r, const jnode_t *at, const jstr_t *str)
{
    obuf_t *b = r->out;
    const char *s = str->s;
    size_t n = str->len;
    if (n == 0)
        return 0;
    if (n > JINJA_MAX_OUTPUT || b->n + n > JINJA_MAX_OUTPUT)
        return jr_fail(r, at, RIVER_EFULL, "the rendering is over %u MiB", JINJA_MAX_OUTPUT >> 20);
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n)
            cap *= 2;
        char *np = jr_alloc(r, at, cap + 1);
        if (!np)
            return RIVER_ENOMEM;
        if (b->n)
            memcpy(np, b->p, b->n);
        b->p = np;
        b->cap = cap;
    }
    int err = jr_spans_add_str(r, at, &b->spans, str, b->n);
    if (err)
        return err;
    memcpy(b->p + b->n, s, n);
    b->n += n;
    return 0;
}

static int emit_value(jrender_t *r, const jnode_t *at, jval_t v)
{
    jstr_t *s;
    int err = jr_to_str(r, at, v, &s);
    return err ? err : emit(r, at, s);
}

static int eval(jrender_t *r, jscope_t *sc, const jnode_t *nd, jval_t *out);
static int exec(jrender_t *r, jscope_t *sc, const jnode_t *nd);

/* Runs body with its output captured into a string. */
static int capture(jrender_t *r, jscope_t *sc, const jnode_t *body, jval_t *out)
{
    obuf_t buf = {0}, *saved = r->out;
    r->out = &buf;
    int err = exec(r, sc, body);
    r->out = saved;
    if (err < 0)
        return err;
    if ((err = jr_strval(r, body, buf.p ? buf.p : "", buf.n, out)))
        return err;
    jr_str_mark(out->u.s, &buf.spans);
    return 0;
}

/* ---- Conversions ---- */

static int from_json(jrender_t *r, const json_t *j, jval_t *out, int depth)
{
    if (depth > JINJA_MAX_DEPTH)
        return jr_fail(r, NULL, RIVER_EFULL, "context nested more than %d deep", JINJA_MAX_DEPTH);
    switch (json_typeof(j)) {
    case JSON_NULL: *out = jv_none(); return 0;
    case JSON_TRUE: *out = jv_bool(1); return 0;
    case JSON_FALSE: *out = jv_bool(0); return 0;
    case JSON_INTEGER: *out = jv_int((int64_t)json_integer_value(j)); return 0;
    case JSON_REAL: *out = jv_float(json_real_value(j)); return 0;
    case JSON_STRING: return jr_strval(r, NULL, json_string_value(j), json_string_length(j), out);
    case JSON_ARRAY: {
        size_t n = json_array_size(j);
        jlist_t *l = jr_list_new(r, NULL, n);
        if (!l)
            return RIVER_ENOMEM;
        for (size_t i = 0; i < n; i++) {
            int err = from_json(r, json_array_get(j, i), &l->v[i], depth + 1);
            if (err)
                return err;
        }
        l->n = n;
        out->t = JV_LIST;
        out->u.l = l;
        return 0;
    }
    case JSON_OBJECT: {
        jdict_t *d = jr_dict_new(r, NULL, json_object_size(j));
        if (!d)
            return RIVER_ENOMEM;
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)j, k, v) {
            jstr_t *ks = jr_str_new(r, NULL, k, strlen(k));
            if (!ks)
                return RIVER_ENOMEM;
            d->k[d->n] = ks;
            int err = from_json(r, v, &d->v[d->n], depth + 1);
            if (err)
                return err;
            d->n++;
        }
        out->t = JV_DICT;
        out->u.d = d;
        return 0;
    }
    }
    *out = jv_none();
    return 0;
}

static jval_t func_val(jfunc_t *f)
{
    jval_t v = {.t = JV_FUNC};
    v.u.fn = f;
    return v;
}

static jval_t undef_named(const char *name)
{
    jval_t v = {.t = JV_UNDEF};
    v.u.undef_name = name;
    return v;
}

static int undef_error(jrender_t *r, const jnode_t *at, jval_t v, const char *what)
{
    if (v.u.undef_name)
        return jr_fail(r, at, RIVER_EINVAL, "'%s' is undefined%s", v.u.undef_name, what);
    return jr_fail(r, at, RIVER_EINVAL, "undefined value%s", what);
}

int jr_iterate(jrender_t *r, const jnode_t *at, jval_t v, jlist_t **out)
{
    switch (v.t) {
    case JV_ABSENT:
    case JV_UNDEF:
        *out = jr_list_new(r, at, 0);
        return *out ? 0 : RIVER_ENOMEM;
    case JV_LIST: *out = v.u.l; return 0;
    case JV_DICT:
    case JV_NS: {
        jlist_t *l = jr_list_new(r, at, v.u.d->n);
        if (!l)
            return RIVER_ENOMEM;
        for (size_t i = 0; i < v.u.d->n; i++)
            l->v[i] = jv_str(v.u.d->k[i]);
        l->n = v.u.d->n;
        *out = l;
        return 0;
    }
    case JV_STR: {
        const jstr_t *s = v.u.s;
        if (jr_count(r, at, s->len / 16))
            return RIVER_EFULL;
        size_t n = s->ascii ? s->len : ju_len(s->s, s->len);
        jlist_t *l = jr_list_new(r, at, n);
        if (!l)
            return RIVER_ENOMEM;
        size_t i = 0;
        while (i < s->len) {
            size_t adv = 1;
            if (!s->ascii)
                ju_decode(s->s + i, s->len - i, &adv);
            jstr_t *c = jr_str_new(r, at, s->s + i, adv);
            if (!c)
                return RIVER_ENOMEM;
            l->v[l->n++] = jv_str(c);
            i += adv;
        }
        *out = l;
        return 0;
    }
    default:
        return jr_fail(r, at, RIVER_EINVAL, "'%s' object is not iterable", jv_type_name(v));
    }
}

/* ---- Attribute and item lookup ---- */

static int bound_method(jrender_t *r, const jnode_t *at, const jbuiltin_t *m, jval_t self,
                        jval_t *out)
{
    jfunc_t *f = jr_alloc(r, at, sizeof *f);
    if (!f)
        return RIVER_ENOMEM;
    f->kind = JF_METHOD;
    f->entry = m;
    f->self = self;
    *out = func_val(f);
    return 0;
}

static int loop_attr(jrender_t *r, const jnode_t *at, const jloop_t *lp, const char *name,
                     jval_t *out)
{
    size_t n = lp->items->n, i = lp->i;
    if (!strcmp(name, "index"))
        *out = jv_int((int64_t)i + 1);
    else if (!strcmp(name, "index0"))
        *out = jv_int((int64_t)i);
    else if (!strcmp(name, "revindex"))
        *out = jv_int((int64_t)(n - i));
    else if (!strcmp(name, "revindex0"))
        *out = jv_int((int64_t)(n - i - 1));
    else if (!strcmp(name, "first"))
        *out = jv_bool(i == 0);
    else if (!strcmp(name, "last"))
        *out = jv_bool(i + 1 == n);
    else if (!strcmp(name, "length"))
        *out = jv_int((int64_t)n);
    else if (!strcmp(name, "depth"))
        *out = jv_int(lp->depth);
    else if (!strcmp(name, "depth0"))
        *out = jv_int(lp->depth - 1);
    else if (!strcmp(name, "previtem"))
        *out = i > 0 ? lp->items->v[i - 1] : undef_named("previtem");
    else if (!strcmp(name, "nextitem"))
        *out = i + 1 < n ? lp->items->v[i + 1] : undef_named("nextitem");
    else {
        jval_t self = {.t = JV_LOOP};
        self.u.loop = (jloop_t *)lp;
        const jbuiltin_t *m = jinja_method_find(JV_LOOP, name);
        if (m)
            return bound_method(r, at, m, self, out);
        *out = undef_named(name);
    }
    return 0;
}

int jr_getattr(jrender_t *r, const jnode_t *at, jval_t obj, const char *name, jval_t *out)
{
    if (obj.t == JV_UNDEF || obj.t == JV_ABSENT)
        return undef_error(r, at, obj, " (reading an attribute of it)");
    if (obj.t == JV_LOOP)
        return loop_attr(r, at, obj.u.loop, name, out);
    if (obj.t == JV_NS) {
        jval_t *v = jv_dict_get(obj.u.d, name, strlen(name));
        *out = v ? *v : undef_named(name);
        return 0;
    }
    const jbuiltin_t *m = jinja_method_find(obj.t, name);
    if (m)
        return bound_method(r, at, m, obj, out);
    if (obj.t == JV_DICT) {
        jval_t *v = jv_dict_get(obj.u.d, name, strlen(name));
        if (v) {
            *out = *v;
            return 0;
        }
    }
    *out = undef_named(name);
    return 0;
}

uint64_t jinja_range_len(int64_t start, int64_t stop, int64_t step)
{
    /* In unsigned arithmetic: stop - start and -step overflow int64_t at the extremes
     * (a step of INT64_MAX, or INT64_MIN). */
    if (step > 0 && stop > start)
        return ((uint64_t)stop - (uint64_t)start - 1) / (uint64_t)step + 1;
    if (step < 0 && stop < start)
        return ((uint64_t)start - (uint64_t)stop - 1) / (0 - (uint64_t)step) + 1;
    return 0;
}

/* Python's slice.indices(): start, stop, step over length n. */
static int slice_indices(jrender_t *r, const jnode_t *at, jval_t *parts, int64_t n, int64_t *start,
                         int64_t *stop, int64_t *step)
{
    int64_t v[3];
    int have[3];
    for (int k = 0; k < 3; k++) {
        jval_t p = parts[k];
        have[k] = p.t != JV_ABSENT && p.t != JV_NONE;
        if (!have[k])
            continue;
        if (p.t != JV_INT && p.t != JV_BOOL)
            return jr_fail(r, at, RIVER_EINVAL, "slice indices must be integers or None");
        v[k] = p.t == JV_INT ? p.u.i : p.u.b;
    }
    *step = have[2] ? v[2] : 1;
    if (*step == 0)
        return jr_fail(r, at, RIVER_EINVAL, "slice step cannot be zero");
    /* As CPython's PySlice_AdjustIndices. */
    int64_t lo = *step < 0 ? -1 : 0, hi = *step < 0 ? n - 1 : n;
    for (int k = 0; k < 2; k++) {
        int64_t x;
        if (!have[k]) {
            x = (k == 0) == (*step < 0) ? hi : lo;
        } else {
            x = v[k];
            if (x < 0) {
                x = x < -n ? lo : x + n;
                if (x < lo)
                    x = lo;
            } else if (x > hi) {
                x = hi;
            }
        }
        if (k == 0)
            *start = x;
        else
            *stop = x;
    }
    return 0;
}

/* A slice of a string, by code points. */
static int slice_str(jrender_t *r, const jnode_t *at, const jstr_t *s, jval_t *parts, jval_t *out)
{
    int64_t start, stop, step;
    int err;
    if ((err = jr_work(r, at, s->len)))
        return err;
    if (s->ascii) {
        if ((err = slice_indices(r, at, parts, (int64_t)s->len, &start, &stop, &step)))
            return err;
        if (step == 1)
            return jr_strval(r, at, s->s + start, stop > start ? (size_t)(stop - start) : 0,
                             out);
        char *tmp = jr_alloc(r, at, s->len + 1);
        size_t o = 0;
        if (!tmp)
            return RIVER_ENOMEM;
        uint64_t count = jinja_range_len(start, stop, step);
        for (uint64_t k = 0; k < count; k++)
            tmp[o++] = s->s[start + (int64_t)k * step];
        return jr_strval(r, at, tmp, o, out);
    }
    /* Code point offsets, then the same walk. */
    size_t n = ju_len(s->s, s->len);
    size_t *offs = jr_alloc(r, at, (n + 1) * sizeof *offs);
    if (!offs)
        return RIVER_ENOMEM;
    size_t i = 0, k = 0, adv;
    while (i < s->len) {
        offs[k++] = i;
        ju_decode(s->s + i, s->len - i, &adv);
        i += adv;
    }
    offs[n] = s->len;
    if ((err = slice_indices(r, at, parts, (int64_t)n, &start, &stop, &step)))
        return err;
    if (step == 1)
        return jr_strval(r, at, s->s + (stop > start ? offs[start] : 0),
                         stop > start ? offs[stop] - offs[start] : 0, out);
    char *tmp = jr_alloc(r, at, s->len + 1);
    size_t o = 0;
    if (!tmp)
        return RIVER_ENOMEM;
    uint64_t count = jinja_range_len(start, stop, step);
    for (uint64_t e = 0; e < count; e++) {
        int64_t j = start + (int64_t)e * step;
        memcpy(tmp + o, s->s + offs[j], offs[j + 1] - offs[j]);
        o += offs[j + 1] - offs[j];
    }
    return jr_strval(r, at, tmp, o, out);
}

static int do_slice(jrender_t *r, const jnode_t *at, jval_t obj, jval_t *parts, jval_t *out)
{
    if (obj.t == JV_UNDEF)
        return undef_error(r, at, obj, " (slicing it)");
    int64_t start, stop, step;
    int err;
    if (obj.t == JV_LIST) {
        const jlist_t *l = obj.u.l;
        if ((err = jr_count(r, at, l->n / 64)) || (err = slice_indices(r, at, parts, (int64_t)l->n, &start, &stop, &step)))
            return err;
        jlist_t *o = jr_list_new(r, at, 0);
        if (!o)
            return RIVER_ENOMEM;
        o->tuple = l->tuple;
        uint64_t count = jinja_range_len(start, stop, step);
        for (uint64_t k = 0; k < count; k++)
            if ((err = jr_list_push(r, at, o, l->v[start + (int64_t)k * step])))
                return err;
        out->t = JV_LIST;
        out->u.l = o;
        return 0;
    }
    if (obj.t == JV_STR) {
        if ((err = slice_str(r, at, obj.u.s, parts, out)))
            return err;
        /* A piece of template text is template text; of mixed text, data. A piece of a
         * Markup is a Markup (its __getitem__). slice_str made the string: ours to mark. */
        out->u.s->prov = obj.u.s->prov == JPROV_TEMPLATE ? JPROV_TEMPLATE : JPROV_DATA;
        out->u.s->markup = obj.u.s->markup;
        return 0;
    }
    *out = jv_undef();
    return 0;
}

int jr_getitem(jrender_t *r, const jnode_t *at, jval_t obj, jval_t key, jval_t *out)
{
    if (obj.t == JV_UNDEF || obj.t == JV_ABSENT)
        return undef_error(r, at, obj, " (reading an item of it)");
    if ((obj.t == JV_DICT || obj.t == JV_NS) && key.t == JV_STR) {
        jval_t *v = jv_dict_get(obj.u.d, key.u.s->s, key.u.s->len);
        if (v) {
            *out = *v;
            return 0;
        }
    }
    if ((obj.t == JV_LIST || obj.t == JV_STR) && (key.t == JV_INT || key.t == JV_BOOL)) {
        int64_t i = key.t == JV_INT ? key.u.i : key.u.b;
        if (obj.t == JV_LIST) {
            int64_t n = (int64_t)obj.u.l->n;
            if (i < 0)
                i += n;
            *out = i >= 0 && i < n ? obj.u.l->v[i] : jv_undef();
            return 0;
        }
        const jstr_t *s = obj.u.s;
        int64_t n = (int64_t)(s->ascii ? s->len : ju_len(s->s, s->len));
        if (i < 0)
            i += n;
        if (i < 0 || i >= n) {
            *out = jv_undef();
            return 0;
        }
        size_t off = s->ascii ? (size_t)i : ju_offset(s->s, s->len, (size_t)i), adv = 1;
        if (!s->ascii)
            ju_decode(s->s + off, s->len - off, &adv);
        int err = jr_strval(r, at, s->s + off, adv, out);
        if (!err && s->prov == JPROV_TEMPLATE)
            out->u.s->prov = JPROV_TEMPLATE;
        if (!err)
            out->u.s->markup = s->markup;
        return err;
    }
    if (key.t == JV_STR)
        return jr_getattr(r, at, obj, key.u.s->s, out);
    *out = jv_undef();
    return 0;
}

/* ---- Calls ---- */

int jr_bind(jrender_t *r, const jnode_t *at, const char *what, const jargs_t *args,
            const char *const *params, jval_t *out)
{
    size_t np = 0;
    while (params[np])
        np++;
    for (size_t i = 0; i < np; i++)
        out[i].t = JV_ABSENT;
    if (args->npos > np)
        return jr_fail(r, at, RIVER_EINVAL, "%s takes at most %zu arguments (%zu given)", what, np,
                       args->npos);
    for (size_t i = 0; i < args->npos; i++)
        out[i] = args->pos[i];
    for (size_t k = 0; k < args->nkw; k++) {
        size_t i = 0;
        while (i < np && strcmp(params[i], args->kwn[k]))
            i++;
        if (i == np)
            return jr_fail(r, at, RIVER_EINVAL, "%s got an unexpected keyword argument '%s'", what,
                           args->kwn[k]);
        if (out[i].t != JV_ABSENT)
            return jr_fail(r, at, RIVER_EINVAL, "%s got multiple values for '%s'", what, params[i]);
        out[i] = args->kwv[k];
    }
    return 0;
}

static int call_macro(jrender_t *r, const jnode_t *at, const jfunc_t *f, const jargs_t *args,
                      const jval_t *caller, jval_t *out)
{
    const jnode_t *m = f->macro;
    const char *mname = m->kind == S_MACRO ? m->name : "caller";
    if (r->calls >= JINJA_MAX_CALLS)
        return jr_fail(r, at, RIVER_EFULL, "macro calls nested more than %d deep (recursion?)",
                       JINJA_MAX_CALLS);
    jscope_t *sc = scope_new(r, at, f->closure);
    jlist_t *varargs = jr_list_new(r, at, 0);
    jdict_t *kwargs = jr_dict_new(r, at, 0);
    if (!sc || !varargs || !kwargs)
        return RIVER_ENOMEM;
    int err;
    for (size_t i = 0; i < args->npos; i++) {
        if (i < m->n)
            err = scope_set(r, at, sc, m->list[i]->name, args->pos[i]);
        else
            err = jr_list_push(r, at, varargs, args->pos[i]);
        if (err)
            return err;
    }
    for (size_t k = 0; k < args->nkw; k++) {
        size_t i = 0;
        while (i < m->n && strcmp(m->list[i]->name, args->kwn[k]))
            i++;
        if (i < m->n) {
            if (i < args->npos)
                return jr_fail(r, at, RIVER_EINVAL, "macro '%s' got multiple values for '%s'",
                               mname, args->kwn[k]);
            err = scope_set(r, at, sc, m->list[i]->name, args->kwv[k]);
        } else {
            jstr_t *ks = jr_str_new(r, at, args->kwn[k], strlen(args->kwn[k]));
            err = ks ? jr_dict_set(r, at, kwargs, ks, args->kwv[k]) : RIVER_ENOMEM;
        }
        if (err)
            return err;
    }
    /* Defaults are evaluated in the macro's scope, after the arguments given. */
    for (size_t i = 0; i < m->n; i++) {
        const jnode_t *p = m->list[i];
        int given = i < args->npos;
        for (size_t k = 0; !given && k < args->nkw; k++)
            given = !strcmp(p->name, args->kwn[k]);
        if (given)
            continue;
        jval_t dv = undef_named(p->name);
        if (p->a && (err = eval(r, sc, p->a, &dv)))
            return err;
        if ((err = scope_set(r, at, sc, p->name, dv)))
            return err;
    }
    jval_t va = {.t = JV_LIST}, kw = {.t = JV_DICT};
    va.u.l = varargs;
    kw.u.d = kwargs;
    if ((err = scope_set(r, at, sc, "varargs", va)) || (err = scope_set(r, at, sc, "kwargs", kw)))
        return err;
    if (caller && (err = scope_set(r, at, sc, "caller", *caller)))
        return err;
    r->calls++;
    err = capture(r, sc, m->c, out);
    r->calls--;
    return err;
}

int jr_call(jrender_t *r, const jnode_t *at, jval_t fn, const jargs_t *args, jval_t *out)
{
    if (fn.t == JV_UNDEF || fn.t == JV_ABSENT)
        return undef_error(r, at, fn, " (calling it)");
    if (fn.t != JV_FUNC)
        return jr_fail(r, at, RIVER_EINVAL, "'%s' object is not callable", jv_type_name(fn));
    const jfunc_t *f = fn.u.fn;
    if (f->kind == JF_MACRO)
        return call_macro(r, at, f, args, NULL, out);
    jval_t self = f->kind == JF_METHOD ? f->self : (jval_t){.t = JV_ABSENT};
    int err = f->entry->fn(r, at, self, args, out);
    if (!err && !(err = jr_markup_result(r, at, f->entry, self, out)))
        jr_prov_result(self, args, out);
    return err;
}

int jr_apply_named(jrender_t *r, const jnode_t *at, int test, const char *name, jval_t v,
                   const jargs_t *args, jval_t *out)
{
    const jbuiltin_t *b = test ? jinja_test_find(name) : jinja_filter_find(name);
    if (!b)
        return jr_fail(r, at, RIVER_EINVAL, "no %s named '%s'", test ? "test" : "filter", name);
    int err = b->fn(r, at, v, args, out);
    if (!err && !(err = jr_markup_result(r, at, b, v, out)))
        jr_prov_result(v, args, out);
    return err;
}

int jr_now(jrender_t *r, const jnode_t *at, struct tm *tm)
{
    const char *fixed = getenv("RIVER_NOW");
    if (fixed && *fixed) {
        int y, mo, d, h = 0, mi = 0, s = 0;
        if (sscanf(fixed, "%d-%d-%dT%d:%d:%d", &y, &mo, &d, &h, &mi, &s) < 3 || mo < 1 ||
            mo > 12 || d < 1 || d > 31 || h < 0 || h > 23 || mi < 0 || mi > 59 || s < 0 || s > 60)
            return jr_fail(r, at, RIVER_EINVAL, "RIVER_NOW '%.40s' is not YYYY-MM-DDTHH:MM:SS",
                           fixed);
        struct tm t = {.tm_year = y - 1900, .tm_mon = mo - 1, .tm_mday = d, .tm_hour = h,
                       .tm_min = mi, .tm_sec = s};
        time_t tt = timegm(&t); /* fills in the weekday and the day of the year */
        if (!gmtime_r(&tt, tm))
            return jr_fail(r, at, RIVER_EINVAL, "RIVER_NOW is out of range");
        return 0;
    }
    time_t now = time(NULL);
    if (!localtime_r(&now, tm))
        return jr_fail(r, at, RIVER_ESYS, "localtime failed");
    return 0;
}

/* Evaluates the arguments of a call, filter or test node. */
static int eval_args(jrender_t *r, jscope_t *sc, const jnode_t *nd, jargs_t *a)
{
    jval_t *pos = NULL, *kwv = NULL;
    int err;
    if (nd->n && !(pos = jr_alloc(r, nd, nd->n * sizeof *pos)))
        return RIVER_ENOMEM;
    if (nd->nkw && !(kwv = jr_alloc(r, nd, nd->nkw * sizeof *kwv)))
        return RIVER_ENOMEM;
    for (size_t i = 0; i < nd->n; i++)
        if ((err = eval(r, sc, nd->list[i], &pos[i])))
            return err;
    for (size_t i = 0; i < nd->nkw; i++)
        if ((err = eval(r, sc, nd->kwvals[i], &kwv[i])))
            return err;
    a->npos = nd->n;
    a->pos = pos;
    a->nkw = nd->nkw;
    a->kwn = nd->kwnames;
    a->kwv = kwv;
    return 0;
}

/* ---- Operators ---- */

static int is_numv(jval_t v)
{
    return v.t == JV_INT || v.t == JV_FLOAT || v.t == JV_BOOL;
}

static double as_f(jval_t v)
{
    return v.t == JV_FLOAT ? v.u.f : v.t == JV_INT ? (double)v.u.i : (double)v.u.b;
}

static int64_t as_i(jval_t v)
{
    return v.t == JV_INT ? v.u.i : v.u.b;
}

static int repeat(jrender_t *r, const jnode_t *at, jval_t seq, int64_t times, jval_t *out)
{
    /* An empty sequence repeated is empty, however many times: no loop of that length. */
    if (times < 0 || (seq.t == JV_STR ? seq.u.s->len : seq.u.l->n) == 0)
        times = 0;
    if (seq.t == JV_STR) {
        size_t len = seq.u.s->len;
        if (len && (uint64_t)times > JINJA_MAX_OUTPUT / len)
            return jr_fail(r, at, RIVER_EFULL, "string repetition too long");
        char *p = jr_alloc(r, at, len * (size_t)times + 1);
        if (!p)
            return RIVER_ENOMEM;
        for (int64_t i = 0; i < times; i++)
            memcpy(p + (size_t)i * len, seq.u.s->s, len);
        int err = jr_strval(r, at, p, len * (size_t)times, out);
        if (!err)
            out->u.s->markup = seq.u.s->markup; /* Markup * n is a Markup */
        return err;
    }
    size_t n = seq.u.l->n;
    if (n && (uint64_t)times > JINJA_MAX_ITERS / n)
        return jr_fail(r, at, RIVER_EFULL, "list repetition too long");
    jlist_t *l = jr_list_new(r, at, n * (size_t)times);
    if (!l)
        return RIVER_ENOMEM;
    for (int64_t i = 0; i < times; i++)
        for (size_t k = 0; k < n; k++)
            l->v[l->n++] = seq.u.l->v[k];
    l->tuple = seq.u.l->tuple;
    out->t = JV_LIST;
    out->u.l = l;
    return 0;
}

static int binop(jrender_t *r, const jnode_t *at, int op, jval_t a, jval_t b, jval_t *out)
{
    int err;
    if (op == '~') {
        jstr_t *x, *y, *s;
        if ((err = jr_to_str(r, at, a, &x)) || (err = jr_to_str(r, at, b, &y)) ||
            (err = jr_str_concat(r, at, x, y, &s)))
            return err;
        *out = jv_str(s);
        return 0;
    }
    if (a.t == JV_UNDEF)
        return undef_error(r, at, a, " (in arithmetic)");
    if (b.t == JV_UNDEF)
        return undef_error(r, at, b, " (in arithmetic)");
    if (op == '+' && a.t == JV_STR && b.t == JV_STR) {
        jstr_t *s;
        /* Markup + str escapes the str, as markupsafe's __add__ and __radd__ do ("~" does
         * not: Jinja2 compiles it to str_join when autoescape is off). */
        if ((err = a.u.s->markup || b.u.s->markup ? jr_markup_add(r, at, a.u.s, b.u.s, &s)
                                                   : jr_str_concat(r, at, a.u.s, b.u.s, &s)))
            return err;
        *out = jv_str(s);
        return 0;
    }
    if (op == '+' && a.t == JV_LIST && b.t == JV_LIST && a.u.l->tuple == b.u.l->tuple) {
        if ((err = jr_count(r, at, (a.u.l->n + b.u.l->n) / 64)))
            return err;
        jlist_t *l = jr_list_new(r, at, a.u.l->n + b.u.l->n);
        if (!l)
            return RIVER_ENOMEM;
        if (a.u.l->n)
            memcpy(l->v, a.u.l->v, a.u.l->n * sizeof *l->v);
        if (b.u.l->n)
            memcpy(l->v + a.u.l->n, b.u.l->v, b.u.l->n * sizeof *l->v);
        l->n = a.u.l->n + b.u.l->n;
        l->tuple = a.u.l->tuple;
        out->t = JV_LIST;
        out->u.l = l;
        return 0;
    }
    if (op == '*' && (a.t == JV_STR || a.t == JV_LIST) && (b.t == JV_INT || b.t == JV_BOOL))
        return repeat(r, at, a, as_i(b), out);
    if (op == '*' && (b.t == JV_STR || b.t == JV_LIST) && (a.t == JV_INT || a.t == JV_BOOL))
        return repeat(r, at, b, as_i(a), out);
    if (op == '%' && a.t == JV_STR) {
        /* printf-style formatting, as the format filter does it. */
        jargs_t fa = {0};
        if (b.t == JV_LIST && b.u.l->tuple) {
            fa.npos = b.u.l->n;
            fa.pos = b.u.l->v;
        } else {
            fa.npos = 1;
            fa.pos = &b;
        }
        return jr_apply_named(r, at, 0, "format", a, &fa, out);
    }
    if (!is_numv(a) || !is_numv(b)) {
        static const char *names[] = {['+'] = "+", ['-'] = "-", ['*'] = "*", ['/'] = "/",
                                      ['%'] = "%"};
        const char *on = op == OP_FLOORDIV ? "//" : op == OP_POW ? "**"
                         : op < (int)(sizeof names / sizeof names[0]) && names[op] ? names[op] : "?";
        return jr_fail(r, at, RIVER_EINVAL, "unsupported operand type(s) for %s: '%s' and '%s'", on,
                       jv_type_name(a), jv_type_name(b));
    }
    int fl = a.t == JV_FLOAT || b.t == JV_FLOAT;
    if (op == '/') {
        if (as_f(b) == 0.0)
            return jr_fail(r, at, RIVER_EINVAL, "division by zero");
        *out = jv_float(as_f(a) / as_f(b));
        return 0;
    }
    if (fl) {
        double x = as_f(a), y = as_f(b), z;
        switch (op) {
        case '+': z = x + y; break;
        case '-': z = x - y; break;
        case '*': z = x * y; break;
        case OP_FLOORDIV:
        case '%':
            if (y == 0.0)
                return jr_fail(r, at, RIVER_EINVAL, "float division by zero");
            if (op == OP_FLOORDIV) {
                z = floor(x / y);
            } else {
                z = fmod(x, y);
                if (z != 0.0 && ((z < 0) != (y < 0)))
                    z += y;
            }
            break;
        default: z = pow(x, y); break;
        }
        *out = jv_float(z);
        return 0;
    }
    int64_t x = as_i(a), y = as_i(b), z;
    switch (op) {
    case '+':
        if (__builtin_add_overflow(x, y, &z))
            return jr_fail(r, at, RIVER_ERANGE, "integer overflow");
        break;
    case '-':
        if (__builtin_sub_overflow(x, y, &z))
            return jr_fail(r, at, RIVER_ERANGE, "integer overflow");
        break;
    case '*':
        if (__builtin_mul_overflow(x, y, &z))
            return jr_fail(r, at, RIVER_ERANGE, "integer overflow");
        break;
    case OP_FLOORDIV:
    case '%':
        if (y == 0)
            return jr_fail(r, at, RIVER_EINVAL, "integer division or modulo by zero");
        if (x == INT64_MIN && y == -1)
            return jr_fail(r, at, RIVER_ERANGE, "integer overflow");
        if (op == OP_FLOORDIV) {
            z = x / y;
            if ((x % y != 0) && ((x < 0) != (y < 0)))
                z--;
        } else {
            z = x % y;
            if (z != 0 && ((z < 0) != (y < 0)))
                z += y;
        }
        break;
    default:
        if (y < 0) {
            *out = jv_float(pow((double)x, (double)y));
            return 0;
        }
        z = 1;
        for (int64_t i = 0; i < y; i++) {
            if (__builtin_mul_overflow(z, x, &z))
                return jr_fail(r, at, RIVER_ERANGE, "integer overflow");
            if (z == 0 || z == 1)
                break;
            if (z == -1) {
                z = (y - i - 1) % 2 ? -z : z;
                break;
            }
        }
        break;
    }
    *out = jv_int(z);
    return 0;
}

static int contains(jrender_t *r, const jnode_t *at, jval_t needle, jval_t hay, int *res)
{
    switch (hay.t) {
    case JV_UNDEF: *res = 0; return 0;
    case JV_STR:
        if (jr_work(r, at, hay.u.s->len))
            return RIVER_EFULL;
        if (needle.t != JV_STR)
            return jr_fail(r, at, RIVER_EINVAL, "'in <string>' requires string as left operand, not %s",
                           jv_type_name(needle));
        *res = needle.u.s->len == 0 ||
               memmem(hay.u.s->s, hay.u.s->len, needle.u.s->s, needle.u.s->len) != NULL;
        return 0;
    case JV_LIST:
        *res = 0;
        if (jr_count(r, at, hay.u.l->n / 64))
            return RIVER_EFULL;
        for (size_t i = 0; i < hay.u.l->n && !*res; i++)
            *res = jv_equal(needle, hay.u.l->v[i]);
        return 0;
    case JV_DICT:
    case JV_NS:
        *res = needle.t == JV_STR && jv_dict_get(hay.u.d, needle.u.s->s, needle.u.s->len) != NULL;
        return 0;
    default:
        return jr_fail(r, at, RIVER_EINVAL, "argument of type '%s' is not iterable",
                       jv_type_name(hay));
    }
}

/* ---- Expressions ---- */

static int eval_node(jrender_t *r, jscope_t *sc, const jnode_t *nd, jval_t *out);

/* Bounds the C recursion of evaluation, whatever mix of nesting and macro calls. */
static int eval(jrender_t *r, jscope_t *sc, const jnode_t *nd, jval_t *out)
{
    if (r->depth >= JINJA_MAX_EVAL)
        return jr_fail(r, nd, RIVER_EFULL, "evaluation nested more than %d deep", JINJA_MAX_EVAL);
    r->depth++;
    int err = eval_node(r, sc, nd, out);
    r->depth--;
    return err;
}

static int eval_node(jrender_t *r, jscope_t *sc, const jnode_t *nd, jval_t *out)
{
    int err;
    jval_t a, b;
    switch (nd->kind) {
    case N_CONST: *out = nd->cval; return 0;
    case N_NAME: {
        jval_t *v = scope_find(sc, nd->name);
        if (v) {
            *out = *v;
            return 0;
        }
        const jbuiltin_t *g = jinja_global_find(nd->name);
        if (g) {
            jfunc_t *f = jr_alloc(r, nd, sizeof *f);
            if (!f)
                return RIVER_ENOMEM;
            f->kind = JF_GLOBAL;
            f->entry = g;
            *out = func_val(f);
            return 0;
        }
        *out = undef_named(nd->name);
        return 0;
    }
    case N_ATTR:
        if ((err = eval(r, sc, nd->a, &a)))
            return err;
        return jr_getattr(r, nd, a, nd->name, out);
    case N_ITEM:
        if ((err = eval(r, sc, nd->a, &a)) || (err = eval(r, sc, nd->b, &b)))
            return err;
        return jr_getitem(r, nd, a, b, out);
    case N_SLICE: {
        jval_t parts[3];
        const jnode_t *pn[3] = {nd->b, nd->c, nd->d};
        if ((err = eval(r, sc, nd->a, &a)))
            return err;
        for (int k = 0; k < 3; k++) {
            parts[k].t = JV_ABSENT;
            if (pn[k] && (err = eval(r, sc, pn[k], &parts[k])))
                return err;
        }
        return do_slice(r, nd, a, parts, out);
    }
    case N_CALL: {
        jargs_t args;
        if ((err = eval(r, sc, nd->a, &a)) || (err = eval_args(r, sc, nd, &args)))
            return err;
        return jr_call(r, nd, a, &args, out);
    }
    case N_FILTER: {
        jargs_t args;
        if (nd->a) {
            if ((err = eval(r, sc, nd->a, &a)))
                return err;
        } else {
            a = r->filter_input ? *r->filter_input : jv_undef();
        }
        if ((err = eval_args(r, sc, nd, &args)) || (err = nd->fn->fn(r, nd, a, &args, out)) ||
            (err = jr_markup_result(r, nd, nd->fn, a, out)))
            return err;
        jr_prov_result(a, &args, out);
        return 0;
    }
    case N_TEST: {
        jargs_t args;
        if ((err = eval(r, sc, nd->a, &a)) || (err = eval_args(r, sc, nd, &args)) ||
            (err = nd->fn->fn(r, nd, a, &args, &b)))
            return err;
        *out = jv_bool(jv_truthy(b) != nd->op);
        return 0;
    }
    case N_BIN:
        if ((err = eval(r, sc, nd->a, &a)) || (err = eval(r, sc, nd->b, &b)))
            return err;
        return binop(r, nd, nd->op, a, b, out);
    case N_CMP: {
        if ((err = eval(r, sc, nd->list[0], &a)))
            return err;
        int res = 1;
        for (size_t i = 1; i < nd->n && res; i++) {
            if ((err = eval(r, sc, nd->list[i], &b)))
                return err;
            int op = nd->ops[i - 1];
            switch (op) {
            case OP_EQ: res = jv_equal(a, b); break;
            case OP_NE: res = !jv_equal(a, b); break;
            case OP_IN:
            case OP_NOTIN:
                if ((err = contains(r, nd, a, b, &res)))
                    return err;
                if (op == OP_NOTIN)
                    res = !res;
                break;
            default:
                if ((err = jr_compare(r, nd, op, a, b, &res)))
                    return err;
            }
            a = b;
        }
        *out = jv_bool(res);
        return 0;
    }
    case N_AND:
        if ((err = eval(r, sc, nd->a, &a)))
            return err;
        if (!jv_truthy(a)) {
            *out = a;
            return 0;
        }
        return eval(r, sc, nd->b, out);
    case N_OR:
        if ((err = eval(r, sc, nd->a, &a)))
            return err;
        if (jv_truthy(a)) {
            *out = a;
            return 0;
        }
        return eval(r, sc, nd->b, out);
    case N_NOT:
        if ((err = eval(r, sc, nd->a, &a)))
            return err;
        *out = jv_bool(!jv_truthy(a));
        return 0;
    case N_NEG:
    case N_POS:
        if ((err = eval(r, sc, nd->a, &a)))
            return err;
        if (a.t == JV_UNDEF)
            return undef_error(r, nd, a, " (in arithmetic)");
        if (!is_numv(a))
            return jr_fail(r, nd, RIVER_EINVAL, "bad operand type for unary %c: '%s'",
                           nd->kind == N_NEG ? '-' : '+', jv_type_name(a));
        if (a.t == JV_FLOAT)
            *out = jv_float(nd->kind == N_NEG ? -a.u.f : a.u.f);
        else if (nd->kind == N_NEG && as_i(a) == INT64_MIN)
            return jr_fail(r, nd, RIVER_ERANGE, "integer overflow");
        else
            *out = jv_int(nd->kind == N_NEG ? -as_i(a) : as_i(a));
        return 0;
    case N_COND:
        if ((err = eval(r, sc, nd->b, &b)))
            return err;
        if (jv_truthy(b))
            return eval(r, sc, nd->a, out);
        if (nd->c)
            return eval(r, sc, nd->c, out);
        *out = jv_undef();
        return 0;
    case N_LIST:
    case N_TUPLE: {
        jlist_t *l = jr_list_new(r, nd, nd->n);
        if (!l)
            return RIVER_ENOMEM;
        for (size_t i = 0; i < nd->n; i++)
            if ((err = eval(r, sc, nd->list[i], &l->v[i])))
                return err;
        l->n = nd->n;
        l->tuple = nd->kind == N_TUPLE;
        out->t = JV_LIST;
        out->u.l = l;
        return 0;
    }
    case N_DICT: {
        jdict_t *d = jr_dict_new(r, nd, nd->n / 2);
        if (!d)
            return RIVER_ENOMEM;
        for (size_t i = 0; i + 1 < nd->n; i += 2) {
            if ((err = eval(r, sc, nd->list[i], &a)) || (err = eval(r, sc, nd->list[i + 1], &b)))
                return err;
            jstr_t *k;
            if (a.t == JV_STR)
                k = a.u.s;
            else if (a.t == JV_INT || a.t == JV_BOOL || a.t == JV_FLOAT || a.t == JV_NONE)
                err = jr_to_str(r, nd, a, &k); /* keys are kept as text */
            else
                return jr_fail(r, nd, RIVER_EINVAL, "unhashable dict key of type '%s'",
                               jv_type_name(a));
            if (err || (err = jr_dict_set(r, nd, d, k, b)))
                return err;
        }
        out->t = JV_DICT;
        out->u.d = d;
        return 0;
    }
    default: return jr_fail(r, nd, RIVER_ESTATE, "statement evaluated as an expression");
    }
}

/* ---- Statements ---- */

/* Assigns v to a target: a name, a tuple of names (unpacking) or ns.attr. */
static int assign(jrender_t *r, jscope_t *sc, const jnode_t *target, jval_t v)
{
    if (target->kind == N_NAME)
        return scope_set(r, target, sc, target->name, v);
    if (target->kind == N_ATTR) {
        jval_t *ns = scope_find(sc, target->a->name);
        if (!ns || ns->t != JV_NS)
            return jr_fail(r, target, RIVER_EINVAL, "cannot assign attribute on non-namespace object");
        jstr_t *k = jr_str_new(r, target, target->name, strlen(target->name));
        return k ? jr_dict_set(r, target, ns->u.d, k, v) : RIVER_ENOMEM;
    }
    jlist_t *items;
    int err;
    if (v.t == JV_UNDEF)
        return undef_error(r, target, v, " (unpacking it)");
    if ((err = jr_iterate(r, target, v, &items)))
        return err;
    if (items->n != target->n)
        return jr_fail(r, target, RIVER_EINVAL, "cannot unpack %zu values into %zu names", items->n,
                       target->n);
    for (size_t i = 0; i < target->n; i++)
        if ((err = scope_set(r, target, sc, target->list[i]->name, items->v[i])))
            return err;
    return 0;
}

static int exec_for(jrender_t *r, jscope_t *sc, const jnode_t *nd)
{
    jval_t it;
    jlist_t *items;
    int err;
    if ((err = eval(r, sc, nd->b, &it)) || (err = jr_iterate(r, nd, it, &items)))
        return err;
    jscope_t *isc = scope_new(r, nd, sc);
    if (!isc)
        return RIVER_ENOMEM;
    if (nd->e) {
        /* The filter sees the loop variable but not loop: it picks the items first. */
        jlist_t *kept = jr_list_new(r, nd, 0);
        if (!kept)
            return RIVER_ENOMEM;
        for (size_t i = 0; i < items->n; i++) {
            jval_t ok;
            isc->n = 0;
            if ((err = jr_count(r, nd, 1)) || (err = assign(r, isc, nd->a, items->v[i])) ||
                (err = eval(r, isc, nd->e, &ok)))
                return err;
            if (jv_truthy(ok) && (err = jr_list_push(r, nd, kept, items->v[i])))
                return err;
        }
        items = kept;
    } else if (items->n) {
        /* A snapshot, so that a body appending to the list does not loop forever. */
        jlist_t *snap = jr_list_new(r, nd, items->n);
        if (!snap)
            return RIVER_ENOMEM;
        memcpy(snap->v, items->v, items->n * sizeof *snap->v);
        snap->n = items->n;
        items = snap;
    }
    if (!items->n) {
        if (!nd->d)
            return 0;
        isc->n = 0;
        err = exec(r, isc, nd->d);
        return err < 0 ? err : 0;
    }
    jloop_t *lp = jr_alloc(r, nd, sizeof *lp);
    if (!lp)
        return RIVER_ENOMEM;
    lp->items = items;
    lp->depth = 1; /* only recursive loops (not supported) go deeper */
    jval_t lv = {.t = JV_LOOP};
    lv.u.loop = lp;
    for (size_t i = 0; i < items->n; i++) {
        lp->i = i;
        isc->n = 0;
        if ((err = jr_count(r, nd, 1)) || (err = assign(r, isc, nd->a, items->v[i])) ||
            (err = scope_set(r, nd, isc, "loop", lv)))
            return err;
        err = exec(r, isc, nd->c);
        if (err < 0)
            return err;
        if (err == FLOW_BREAK)
            break;
    }
    return 0;
}

static jfunc_t *macro_new(jrender_t *r, const jnode_t *nd, jscope_t *closure)
{
    jfunc_t *f = jr_alloc(r, nd, sizeof *f);
    if (f) {
        f->kind = JF_MACRO;
        f->macro = nd;
        f->closure = closure;
    }
    return f;
}

static int exec_node(jrender_t *r, jscope_t *sc, const jnode_t *nd);

static int exec(jrender_t *r, jscope_t *sc, const jnode_t *nd)
{
    if (r->depth >= JINJA_MAX_EVAL)
        return jr_fail(r, nd, RIVER_EFULL, "evaluation nested more than %d deep", JINJA_MAX_EVAL);
    r->depth++;
    int err = exec_node(r, sc, nd);
    r->depth--;
    return err;
}

static int exec_node(jrender_t *r, jscope_t *sc, const jnode_t *nd)
{
    int err;
    jval_t v;
    switch (nd->kind) {
    case S_BODY:
        for (size_t i = 0; i < nd->n; i++)
            if ((err = exec(r, sc, nd->list[i])))
                return err;
        return 0;
    case S_DATA: return emit(r, nd, nd->cval.u.s);
    case S_PRINT:
        if ((err = eval(r, sc, nd->a, &v)))
            return err;
        return emit_value(r, nd, v);
    case S_IF:
        if ((err = eval(r, sc, nd->a, &v)))
            return err;
        if (jv_truthy(v))
            return exec(r, sc, nd->b);
        return nd->c ? exec(r, sc, nd->c) : 0;
    case S_FOR: return exec_for(r, sc, nd);
    case S_SET:
        if ((err = eval(r, sc, nd->b, &v)))
            return err;
        return assign(r, sc, nd->a, v);
    case S_SETBLOCK: {
        jscope_t *inner = scope_new(r, nd, sc);
        if (!inner || (err = capture(r, inner, nd->c, &v)))
            return inner ? err : RIVER_ENOMEM;
        return assign(r, sc, nd->a, v);
    }
    case S_MACRO: {
        jfunc_t *f = macro_new(r, nd, sc);
        return f ? scope_set(r, nd, sc, nd->name, func_val(f)) : RIVER_ENOMEM;
    }
    case S_CALLBLOCK: {
        jfunc_t *caller = macro_new(r, nd, sc);
        jargs_t args;
        if (!caller)
            return RIVER_ENOMEM;
        if ((err = eval(r, sc, nd->a->a, &v)) || (err = eval_args(r, sc, nd->a, &args)))
            return err;
        if (v.t != JV_FUNC || v.u.fn->kind != JF_MACRO)
            return jr_fail(r, nd, RIVER_EINVAL, "{%% call %%} needs a macro");
        jval_t cv = func_val(caller), res;
        if ((err = call_macro(r, nd, v.u.fn, &args, &cv, &res)))
            return err;
        return emit_value(r, nd, res);
    }
    case S_FILTERBLOCK: {
        jval_t body, res;
        jscope_t *inner = scope_new(r, nd, sc);
        if (!inner)
            return RIVER_ENOMEM;
        if ((err = capture(r, inner, nd->c, &body)))
            return err;
        const jval_t *saved = r->filter_input;
        r->filter_input = &body;
        err = eval(r, sc, nd->a, &res);
        r->filter_input = saved;
        return err ? err : emit_value(r, nd, res);
    }
    case S_BREAK: return FLOW_BREAK;
    case S_CONTINUE: return FLOW_CONTINUE;
    default: return jr_fail(r, nd, RIVER_ESTATE, "expression executed as a statement");
    }
}

/* Whether name is one of the caller's template-text variables. */
static int is_template_key(const char *const *keys, const char *name)
{
    for (; keys && *keys; keys++)
        if (!strcmp(*keys, name))
            return 1;
    return 0;
}

int jinja_render(const char *name, const jnode_t *root, const json_t *ctx,
                 const jinja_render_opts_t *opts, char **out, size_t *out_len,
                 text_span_t **spans, size_t *n_spans)
{
    static const jinja_render_opts_t none = {0};
    if (!opts)
        opts = &none;
    obuf_t buf = {0};
    jrender_t r = {.name = name, .out = &buf,
                   .max_memory = opts->max_memory ? opts->max_memory : JINJA_MAX_MEMORY};
    int err = 0;
    *out = NULL;
    if (out_len)
        *out_len = 0;
    if (spans) {
        *spans = NULL;
        *n_spans = 0;
    }
    if (ctx && !json_is_object(ctx))
        return river_err_set(RIVER_EINVAL, "%s: the context must be a JSON object", name);
    r.arena = jarena_new(r.max_memory);
    if (!r.arena)
        return river_err_set(RIVER_ENOMEM, "%s: out of memory", name);
    r.root = scope_new(&r, NULL, NULL);
    if (!r.root) {
        err = RIVER_ENOMEM;
        goto done;
    }
    const json_t *srcs[2] = {ctx, opts->defaults};
    for (int s = 0; s < 2; s++) {
        const char *k;
        json_t *jv;
        if (!srcs[s] || !json_is_object(srcs[s]))
            continue;
        json_object_foreach((json_t *)srcs[s], k, jv) {
            if (s == 1 && ctx && json_object_get(ctx, k))
                continue;
            jval_t v;
            size_t kl = strlen(k);
            char *kc = jr_alloc(&r, NULL, kl + 1);
            if (!kc) {
                err = RIVER_ENOMEM;
                goto done;
            }
            memcpy(kc, k, kl + 1);
            if ((err = from_json(&r, jv, &v, 0)))
                goto done;
            if (v.t == JV_STR && is_template_key(opts->template_keys, kc))
                v.u.s->prov = JPROV_TEMPLATE;
            if ((err = scope_set(&r, NULL, r.root, kc, v)))
                goto done;
        }
    }
    err = exec(&r, r.root, root);
    if (err > 0)
        err = 0; /* break/continue cannot leave a loop: the parser refuses them outside */
    if (err)
        goto done;
    *out = malloc(buf.n + 1);
    if (spans && !(*spans = malloc((buf.spans.n ? buf.spans.n : 1) * sizeof **spans))) {
        free(*out);
        *out = NULL;
    }
    if (!*out) {
        err = river_err_set(RIVER_ENOMEM, "%s: out of memory", name);
        goto done;
    }
    if (buf.n)
        memcpy(*out, buf.p, buf.n);
    (*out)[buf.n] = 0;
    if (out_len)
        *out_len = buf.n;
    if (spans) {
        for (size_t i = 0; i < buf.spans.n; i++)
            (*spans)[i] = (text_span_t){buf.spans.v[i].off, buf.spans.v[i].len};
        *n_spans = buf.spans.n;
    }
done:
    if (err == RIVER_ENOMEM && jarena_over_cap(r.arena))
        err = RIVER_EFULL; /* the detail already says which bound */
    jarena_destroy(&r.arena);
    return err;
}
