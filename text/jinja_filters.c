/* Chat-template builtins: Jinja2's filters on strings and sequences, as a table, the helpers
 * the builtin files share, and the lookups of every builtin table (the number filters are in
 * jinja_num.c, tojson in jinja_json.c, the string, dict, list and loop methods in jinja_str.c
 * and jinja_seq.c, the tests and globals in jinja_tests.c). Each behaves as its Jinja2 3.1 /
 * Python counterpart on the values templates meet. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "text/jinja_builtins.h"

/* ---- Text building ---- */

void jinja__tb_put(tb_t *b, const char *s, size_t n)
{
    if (b->err || n == 0)
        return;
    if (b->n + n > b->cap) {
        if (b->n + n > JINJA_MAX_OUTPUT) {
            b->err = jr_fail(b->r, b->at, RIVER_EFULL, "string over %u bytes", JINJA_MAX_OUTPUT);
            return;
        }
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->n + n)
            cap *= 2;
        char *np = jr_alloc(b->r, b->at, cap + 1);
        if (!np) {
            b->err = RIVER_ENOMEM;
            return;
        }
        if (b->n)
            memcpy(np, b->p, b->n);
        b->p = np;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
}

void jinja__tb_cp(tb_t *b, int32_t cp)
{
    char buf[4];
    jinja__tb_put(b, buf, ju_encode(cp, buf));
}

int jinja__tb_done(tb_t *b, jval_t *out)
{
    if (b->err)
        return b->err;
    int err = jr_work(b->r, b->at, b->n);
    if (err)
        return err;
    return jr_strval(b->r, b->at, b->p ? b->p : "", b->n, out);
}

jval_t jinja__list_val(jlist_t *l)
{
    jval_t v = {.t = JV_LIST};
    v.u.l = l;
    return v;
}

jval_t jinja__dict_val(jdict_t *d)
{
    jval_t v = {.t = JV_DICT};
    v.u.d = d;
    return v;
}

/* soft_str(): the value as text (undefined: ""). */
int jinja__text_of(jrender_t *r, const jnode_t *at, jval_t v, jstr_t **out)
{
    return jr_to_str(r, at, v, out);
}

int jinja__want_str(jrender_t *r, const jnode_t *at, jval_t v, const char *what, jstr_t **out)
{
    *out = NULL;
    if (v.t != JV_STR)
        return jr_fail(r, at, RIVER_EINVAL, "%s: expected a string, not '%s'", what,
                       jv_type_name(v));
    *out = v.u.s;
    return 0;
}

int jinja__want_int(jrender_t *r, const jnode_t *at, jval_t v, const char *what, int64_t *out)
{
    *out = 0;
    if (v.t == JV_INT)
        *out = v.u.i;
    else if (v.t == JV_BOOL)
        *out = v.u.b;
    else
        return jr_fail(r, at, RIVER_EINVAL, "%s: expected an integer, not '%s'", what,
                       jv_type_name(v));
    return 0;
}

/* ---- Filters ---- */

static int f_attr(jrender_t *r, const jnode_t *at, jval_t v, const jargs_t *args, jval_t *out)
{
    BIND("attr", "name");
    jstr_t *n;
    int err = jinja__want_str(r, at, a[0], "attr", &n);
    if (err)
        return err;
    if (v.t == JV_DICT && !jinja_method_find(JV_DICT, n->s)) {
        /* An attribute only, never an item: of a dict, only its methods. */
        *out = jv_undef();
        return 0;
    }
    return jr_getattr(r, at, v, n->s, out);
}

static int f_capitalize(jrender_t *r, const jnode_t *at, jval_t v, const jargs_t *args, jval_t *out)
{
    NO_ARGS("capitalize");
    jstr_t *s;
    int err = jinja__text_of(r, at, v, &s);
    return err ? err : jinja__py_capitalize(r, at, s, out);
}

static int f_center(jrender_t *r, const jnode_t *at, jval_t v, const jargs_t *args, jval_t *out)
{
    BIND("center", "width");
    jstr_t *s;
    int64_t w = 80;
    int err;
    if ((err = jinja__text_of(r, at, v, &s)) ||
        (GIVEN(a[0]) && (err = jinja__want_int(r, at, a[0], "center", &w))))
        return err;
    int64_t n = (int64_t)ju_len(s->s, s->len);
    if (w > (int64_t)JINJA_MAX_OUTPUT)
        return jr_fail(r, at, RIVER_EFULL, "center width too large");
    if (w <= n) {
        *out = jv_str(s);
        return 0;
    }
    int64_t pad = w - n, left = pad / 2 + (pad & w & 1);
    tb_t b = {.r = r, .at = at};
    for (int64_t i = 0; i < left; i++)
        jinja__tb_put(&b, " ", 1);
    jinja__tb_put(&b, s->s, s->len);
    for (int64_t i = 0; i < pad - left; i++)
        jinja__tb_put(&b, " ", 1);
    return jinja__tb_done(&b, out);
}

static int f_default(jrender_t *r, const jnode_t *at, jval_t v, const jargs_t *args, jval_t *out)
{
    BIND("default", "default_value", "boolean");
    int boolean = GIVEN(a[1]) && jv_truthy(a[1]);
    if (v.t == JV_UNDEF || (boolean && !jv_truthy(v))) {
        if (GIVEN(a[0]))
            *out = a[0];
        else
            return jr_strval(r, at, "", 0, out);
    } else {
        *out = v;
    }
    return 0;
}

/* markupsafe.escape: a Markup as it is, anything else its text escaped, as a Markup. */
static int f_escape(jrender_t *r, const jnode_t *at, jval_t v, const jargs_t *args, jval_t *out)
{
    NO_ARGS("escape");
    jstr_t *s;
    int err = jr_escape_value(r, at, v, &s);
    if (!err)
        *out = jv_str(s);
    return err;
}

/* Escapes even a Markup's text again (Jinja2's do_forceescape: escape(str(value))). */
static int f_forceescape(jrender_t *r, const jnode_t *at, jval_t v, const jargs_t *args,
                         jval_t *out)
{
    NO_ARGS("forceescape");
    jstr_t *s;
    int err = jinja__text_of(r, at, v, &s);
    if (!err && !(err = jr_escape_force(r, at, s, &s)))
        *out = jv_str(s);
    return err;
}

static int f_first(jrender_t *r, const jnode_t *at, jval_t v, const jargs_t *args, jval_t *out)
{
    NO_ARGS("first");
    jlist_t *l;
    int err = jr_iterate(r, at, v, &l);
    if (err)
        return err;
    *out = l->n ? l->v[0] : jv_undef();
    return 0;
}

static int f_last(jrender_t *r, const jnode_t *at, jval_t v, const jargs_t *args, jval_t *out)
{
    NO_ARGS("last");
    jlist_t *l;
    int err = jr_iterate(r, at, v, &l);
    if (err)
        return err;
    *out = l->n ? l->v[l->n - 1] : jv_undef();
    return 0;
}

/* printf-style formatting of Python's str % args (the format filter). */
static int f_format(jrender_t *r, const jnode_t *at, jval_t v, const jargs_t *args, jval_t *out)
{
    jstr_t *s;
    int err = jinja__text_of(r, at, v, &s);
    if (err)
        return err;
    tb_t b = {.r = r, .at = at};
    size_t ai = 0;
    for (size_t i = 0; i < s->len && !b.err; i++) {
        char c = s->s[i];
        if (c != '%') {
            jinja__tb_put(&b, &c, 1);
            continue;
        }
        char spec[32];
        size_t o = 0;
        spec[o++] = '%';
        i++;
        const char *key = NULL;
        size_t keylen = 0;
        if (i < s->len && s->s[i] == '(') {
            const char *e = memchr(s->s + i, ')', s->len - i);
            if (!e)
                return jr_fail(r, at, RIVER_EINVAL, "format: incomplete format key");
            key = s->s + i + 1;
            keylen = (size_t)(e - key);
            i = (size_t)(e - s->s) + 1;
        }
        while (i < s->len && s->s[i] && strchr("-+ #0", s->s[i]) && o < 8)
            spec[o++] = s->s[i++];
        /* Width and precision: at most three digits each, so printf never pads for long. */
        for (int part = 0; part < 2; part++) {
            if (part == 1) {
                if (i >= s->len || s->s[i] != '.')
                    break;
                spec[o++] = s->s[i++];
            }
            int digits = 0;
            while (i < s->len && s->s[i] >= '0' && s->s[i] <= '9') {
                if (++digits > 3)
                    return jr_fail(r, at, RIVER_EINVAL, "format: width or precision over 999");
                spec[o++] = s->s[i++];
            }
        }
        if (i >= s->len)
            return jr_fail(r, at, RIVER_EINVAL, "format: incomplete format");
        char conv = s->s[i];
        if (conv == '%') {
            jinja__tb_put(&b, "%", 1);
            continue;
        }
        jval_t arg;
        if (key) {
            size_t k = 0;
            while (k < args->nkw &&
                   (strlen(args->kwn[k]) != keylen || memcmp(args->kwn[k], key, keylen)))
                k++;
            if (k == args->nkw)
                return jr_fail(r, at, RIVER_EINVAL, "format: no argument '%.*s'", (int)keylen, key);
            arg = args->kwv[k];
        } else {
            if (ai >= args->npos)
                return jr_fail(r, at, RIVER_EINVAL, "not enough arguments for format string");
            arg = args->pos[ai++];
        }
        char buf[512];
        if (conv == 's' || conv == 'r' || conv == 'a') {
            jstr_t *t;
            if ((err = conv == 's' ? jinja__text_of(r, at, arg, &t) : jr_repr(r, at, arg, &t)))
                return err;
            /* Markup % args escapes each argument's text (a Markup's is left as it is)
             * before width and precision apply, as markupsafe's _MarkupEscapeHelper does. */
            if (s->markup && (err = jr_escape(r, at, t, &t)))
                return err;
            if (o == 1) {
                jinja__tb_put(&b, t->s, t->len);
            } else {
                spec[o++] = 's';
                spec[o] = 0;
                /* Width and precision count code points; this counts bytes (ASCII alike). */
                char *tmp = jr_alloc(r, at, t->len + 600);
                if (!tmp)
                    return RIVER_ENOMEM;
                int n = snprintf(tmp, t->len + 600, spec, t->s);
                jinja__tb_put(&b, tmp,
                              n > 0 ? (size_t)n < t->len + 600 ? (size_t)n : t->len + 599 : 0);
            }
        } else if (strchr("diouxXc", conv)) {
            int64_t iv;
            /* Markup % args wraps every argument in a helper that is neither an int nor a
             * one-character str, so Python refuses %c there. */
            if (conv == 'c' && s->markup)
                return jr_fail(r, at, RIVER_EINVAL, "format: %%c requires int or char");
            if (arg.t == JV_FLOAT && conv != 'c') {
                /* Casting a float outside int64_t's range is undefined behaviour. */
                if (!(fabs(arg.u.f) < 9.2e18))
                    return jr_fail(r, at, RIVER_ERANGE, "format: %g does not fit an integer",
                                   arg.u.f);
                iv = (int64_t)arg.u.f;
            } else if ((err = jinja__want_int(r, at, arg, "format", &iv)))
                return err;
            if (conv == 'c') {
                if (iv < 0 || iv > 0x10FFFF)
                    return jr_fail(r, at, RIVER_ERANGE, "format: %%c arg not in range(0x110000)");
                jinja__tb_cp(&b, (int32_t)iv);
                continue;
            }
            spec[o++] = 'l';
            spec[o++] = 'l';
            spec[o++] = conv == 'i' || conv == 'u' ? 'd' : conv;
            spec[o] = 0;
            int n = snprintf(buf, sizeof buf, spec, (long long)iv);
            jinja__tb_put(&b, buf, n > 0 ? (size_t)n < sizeof buf ? (size_t)n : sizeof buf - 1 : 0);
        } else if (strchr("eEfFgG", conv)) {
            double fv;
            if (arg.t == JV_FLOAT)
                fv = arg.u.f;
            else if (arg.t == JV_INT)
                fv = (double)arg.u.i;
            else if (arg.t == JV_BOOL)
                fv = arg.u.b;
            else
                return jr_fail(r, at, RIVER_EINVAL, "format: a number is required, not %s",
                               jv_type_name(arg));
            spec[o++] = conv;
            spec[o] = 0;
            int n = snprintf(buf, sizeof buf, spec, fv);
            jinja__tb_put(&b, buf, n > 0 ? (size_t)n < sizeof buf ? (size_t)n : sizeof buf - 1 : 0);
        } else {
            return jr_fail(r, at, RIVER_EINVAL, "format: unsupported format character '%c'",
                           conv >= 0x20 && conv < 0x7f ? conv : '?');
        }
    }
    return jinja__tb_done(&b, out);
}

static int f_indent(jrender_t *r, const jnode_t *at, jval_t v, const jargs_t *args, jval_t *out)
{
    BIND("indent", "width", "first", "blank");
    jstr_t *s, *ind;
    int err;
    if ((err = jinja__text_of(r, at, v, &s)))
        return err;
    jval_t width = GIVEN(a[0]) ? a[0] : jv_int(4);
    if (width.t == JV_STR) {
        ind = width.u.s;
    } else {
        int64_t w;
        if ((err = jinja__want_int(r, at, width, "indent", &w)))
            return err;
        if (w < 0)
            w = 0;
        if (w > 4096)
            return jr_fail(r, at, RIVER_EFULL, "indent width too large");
        char sp[4096];
        memset(sp, ' ', (size_t)w);
        if (!(ind = jr_str_new(r, at, sp, (size_t)w)))
            return RIVER_ENOMEM;
    }
    int first = GIVEN(a[1]) && jv_truthy(a[1]), blank = GIVEN(a[2]) && jv_truthy(a[2]);
    /* Jinja2 appends a newline, then splits the lines as Python's splitlines(). */
    tb_t t = {.r = r, .at = at};
    jinja__tb_put(&t, s->s, s->len);
    jinja__tb_put(&t, "\n", 1);
    if (t.err)
        return t.err;
    jlist_t *lines;
    if ((err = jinja__py_splitlines(r, at, t.p, t.n, &lines)))
        return err;
    tb_t b = {.r = r, .at = at};
    if (first)
        jinja__tb_put(&b, ind->s, ind->len);
    for (size_t i = 0; i < lines->n && !b.err; i++) {
        const jstr_t *ln = lines->v[i].u.s;
        if (i) {
            jinja__tb_put(&b, "\n", 1);
            if (blank || ln->len)
                jinja__tb_put(&b, ind->s, ind->len);
        }
        jinja__tb_put(&b, ln->s, ln->len);
    }
    return jinja__tb_done(&b, out);
}

static int f_items(jrender_t *r, const jnode_t *at, jval_t v, const jargs_t *args, jval_t *out)
{
    NO_ARGS("items");
    if (v.t == JV_UNDEF) {
        jlist_t *l = jr_list_new(r, at, 0);
        if (!l)
            return RIVER_ENOMEM;
        *out = jinja__list_val(l);
        return 0;
    }
    if (v.t != JV_DICT)
        return jr_fail(r, at, RIVER_EINVAL, "Can only get item pairs from a mapping.");
    return jinja__m_items(r, at, v, args, out);
}

/* A dotted attribute path ("a.b", "0.name") as Jinja2's make_attrgetter walks it. */
int jinja__get_path(jrender_t *r, const jnode_t *at, jval_t v, const jstr_t *path, jval_t *out)
{
    size_t b = 0;
    int err;
    for (;;) {
        const char *dot = memchr(path->s + b, '.', path->len - b);
        size_t e = dot ? (size_t)(dot - path->s) : path->len;
        jval_t key;
        int digits = e > b;
        for (size_t i = b; i < e; i++)
            digits = digits && path->s[i] >= '0' && path->s[i] <= '9';
        if (digits && e - b < 18)
            key = jv_int(strtoll(path->s + b, NULL, 10));
        else if ((err = jr_strval(r, at, path->s + b, e - b, &key)))
            return err;
        if ((err = jr_getitem(r, at, v, key, &v)))
            return err;
        if (!dot)
            break;
        b = e + 1;
    }
    *out = v;
    return 0;
}

static int f_join(jrender_t *r, const jnode_t *at, jval_t v, const jargs_t *args, jval_t *out)
{
    BIND("join", "d", "attribute");
    jlist_t *items;
    jstr_t *sep = NULL, *attr = NULL;
    int err;
    if ((err = jr_iterate(r, at, v, &items)))
        return err;
    if (GIVEN(a[0]) && (err = jinja__text_of(r, at, a[0], &sep)))
        return err;
    if (GIVEN(a[1]) && a[1].t != JV_NONE && (err = jinja__want_str(r, at, a[1], "join", &attr)))
        return err;
    tb_t b = {.r = r, .at = at};
    for (size_t i = 0; i < items->n && !b.err; i++) {
        jval_t it = items->v[i];
        jstr_t *s;
        if (attr && (err = jinja__get_path(r, at, it, attr, &it)))
            return err;
        if ((err = jinja__text_of(r, at, it, &s)))
            return err;
        if (i && sep)
            jinja__tb_put(&b, sep->s, sep->len);
        jinja__tb_put(&b, s->s, s->len);
    }
    return jinja__tb_done(&b, out);
}

static int f_length(jrender_t *r, const jnode_t *at, jval_t v, const jargs_t *args, jval_t *out)
{
    NO_ARGS("length");
    switch (v.t) {
    case JV_UNDEF:
        *out = jv_int(0);
        return 0;
    case JV_STR:
        *out = jv_int((int64_t)(v.u.s->ascii ? v.u.s->len : ju_len(v.u.s->s, v.u.s->len)));
        return 0;
    case JV_LIST:
        *out = jv_int((int64_t)v.u.l->n);
        return 0;
    case JV_DICT:
        *out = jv_int((int64_t)v.u.d->n);
        return 0;
    default:
        return jr_fail(r, at, RIVER_EINVAL, "object of type '%s' has no len()", jv_type_name(v));
    }
}

static int f_list(jrender_t *r, const jnode_t *at, jval_t v, const jargs_t *args, jval_t *out)
{
    NO_ARGS("list");
    jlist_t *l;
    int err = jr_iterate(r, at, v, &l);
    if (err)
        return err;
    jlist_t *c = jr_list_new(r, at, l->n);
    if (!c)
        return RIVER_ENOMEM;
    if (l->n)
        memcpy(c->v, l->v, l->n * sizeof *c->v);
    c->n = l->n;
    *out = jinja__list_val(c);
    return 0;
}

static int f_lower(jrender_t *r, const jnode_t *at, jval_t v, const jargs_t *args, jval_t *out)
{
    NO_ARGS("lower");
    jstr_t *s;
    int err = jinja__text_of(r, at, v, &s);
    return err ? err : jinja__map_str(r, at, s, jinja__cp_lower, out);
}

static int f_upper(jrender_t *r, const jnode_t *at, jval_t v, const jargs_t *args, jval_t *out)
{
    NO_ARGS("upper");
    jstr_t *s;
    int err = jinja__text_of(r, at, v, &s);
    return err ? err : jinja__map_str(r, at, s, jinja__cp_upper, out);
}

/* Jinja2's title filter: words start after runs of "-", whitespace and "({[<". */
static int f_title(jrender_t *r, const jnode_t *at, jval_t v, const jargs_t *args, jval_t *out)
{
    NO_ARGS("title");
    jstr_t *s;
    int err = jinja__text_of(r, at, v, &s);
    if (err)
        return err;
    tb_t b = {.r = r, .at = at};
    size_t i = 0, adv;
    int start = 1;
    while (i < s->len && !b.err) {
        int32_t c = ju_decode(s->s + i, s->len - i, &adv);
        int sep = c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || ju_isspace(c);
        if (sep) {
            jinja__tb_put(&b, s->s + i, adv);
            start = 1;
        } else {
            jinja__tb_cp(&b, start ? jinja__cp_upper(c) : jinja__cp_lower(c));
            start = 0;
        }
        i += adv;
    }
    return jinja__tb_done(&b, out);
}

/* map(attribute=..., default=...) or map('filter', args...). */
static int f_map(jrender_t *r, const jnode_t *at, jval_t v, const jargs_t *args, jval_t *out)
{
    jlist_t *items, *res;
    int err;
    /* Jinja2 maps (and selects) nothing from a false value, None included. */
    if (!jv_truthy(v))
        v = jv_undef();
    if ((err = jr_iterate(r, at, v, &items)))
        return err;
    if (!(res = jr_list_new(r, at, items->n)))
        return RIVER_ENOMEM;
    const jstr_t *attr = NULL;
    const jval_t *dflt = NULL;
    for (size_t k = 0; k < args->nkw; k++) {
        if (!strcmp(args->kwn[k], "attribute") && args->kwv[k].t == JV_STR)
            attr = args->kwv[k].u.s;
        else if (!strcmp(args->kwn[k], "default"))
            dflt = &args->kwv[k];
        else if (args->npos == 0)
            return jr_fail(r, at, RIVER_EINVAL, "map: unexpected keyword argument '%s'",
                           args->kwn[k]);
    }
    if (!attr && (args->npos == 0 || args->pos[0].t != JV_STR))
        return jr_fail(r, at, RIVER_EINVAL, "map: needs a filter name or attribute=");
    for (size_t i = 0; i < items->n; i++) {
        jval_t x;
        if (attr) {
            if ((err = jinja__get_path(r, at, items->v[i], attr, &x)))
                return err;
            if (x.t == JV_UNDEF && dflt)
                x = *dflt;
        } else {
            jargs_t fa = {.npos = args->npos - 1,
                          .pos = args->pos + 1,
                          .nkw = args->nkw,
                          .kwn = args->kwn,
                          .kwv = args->kwv};
            if ((err = jr_apply_named(r, at, 0, args->pos[0].u.s->s, items->v[i], &fa, &x)))
                return err;
        }
        res->v[res->n++] = x;
    }
    *out = jinja__list_val(res);
    return 0;
}

/* select / reject / selectattr / rejectattr. */
static int select_common(jrender_t *r, const jnode_t *at, jval_t v, const jargs_t *args, int attr,
                         int keep, jval_t *out)
{
    jlist_t *items, *res;
    int err;
    if (!jv_truthy(v))
        v = jv_undef();
    if ((err = jr_iterate(r, at, v, &items)))
        return err;
    if (!(res = jr_list_new(r, at, 0)))
        return RIVER_ENOMEM;
    size_t p = 0;
    const jstr_t *path = NULL;
    if (attr) {
        if (args->npos < 1 || args->pos[0].t != JV_STR)
            return jr_fail(r, at, RIVER_EINVAL, "selectattr/rejectattr: needs an attribute name");
        path = args->pos[0].u.s;
        p = 1;
    }
    const char *test = NULL;
    if (args->npos > p) {
        if (args->pos[p].t != JV_STR)
            return jr_fail(r, at, RIVER_EINVAL, "select: the test name must be a string");
        test = args->pos[p].u.s->s;
        if (!jinja_test_find(test))
            return jr_fail(r, at, RIVER_EINVAL, "no test named '%s'", test);
        p++;
    }
    /* A call without arguments has no argument array: NULL + 0 is undefined behaviour. */
    jargs_t ta = {.npos = args->npos - p,
                  .pos = args->npos > p ? args->pos + p : NULL,
                  .nkw = args->nkw,
                  .kwn = args->kwn,
                  .kwv = args->kwv};
    for (size_t i = 0; i < items->n; i++) {
        jval_t x = items->v[i], res_v;
        if (path && (err = jinja__get_path(r, at, x, path, &x)))
            return err;
        int ok;
        if (test) {
            if ((err = jr_apply_named(r, at, 1, test, x, &ta, &res_v)))
                return err;
            ok = jv_truthy(res_v);
        } else {
            ok = jv_truthy(x);
        }
        if (ok == keep && (err = jr_list_push(r, at, res, items->v[i])))
            return err;
    }
    *out = jinja__list_val(res);
    return 0;
}

static int f_select(jrender_t *r, const jnode_t *at, jval_t v, const jargs_t *args, jval_t *out)
{
    return select_common(r, at, v, args, 0, 1, out);
}

static int f_reject(jrender_t *r, const jnode_t *at, jval_t v, const jargs_t *args, jval_t *out)
{
    return select_common(r, at, v, args, 0, 0, out);
}

static int f_selectattr(jrender_t *r, const jnode_t *at, jval_t v, const jargs_t *args, jval_t *out)
{
    return select_common(r, at, v, args, 1, 1, out);
}

static int f_rejectattr(jrender_t *r, const jnode_t *at, jval_t v, const jargs_t *args, jval_t *out)
{
    return select_common(r, at, v, args, 1, 0, out);
}

static int f_replace(jrender_t *r, const jnode_t *at, jval_t v, const jargs_t *args, jval_t *out)
{
    BIND("replace", "old", "new", "count");
    jstr_t *s, *o, *n;
    int64_t count = -1;
    int err;
    if ((err = jinja__text_of(r, at, v, &s)) || (err = jinja__text_of(r, at, a[0], &o)) ||
        (err = jinja__text_of(r, at, a[1], &n)))
        return err;
    if (GIVEN(a[2]) && a[2].t != JV_NONE && (err = jinja__want_int(r, at, a[2], "replace", &count)))
        return err;
    return jinja__py_replace(r, at, s, o, n, count, out);
}

static int f_reverse(jrender_t *r, const jnode_t *at, jval_t v, const jargs_t *args, jval_t *out)
{
    NO_ARGS("reverse");
    jlist_t *l;
    int err = jr_iterate(r, at, v, &l);
    if (err)
        return err;
    if (v.t == JV_STR) {
        tb_t b = {.r = r, .at = at};
        for (size_t i = l->n; i-- > 0;)
            jinja__tb_put(&b, l->v[i].u.s->s, l->v[i].u.s->len);
        return jinja__tb_done(&b, out);
    }
    jlist_t *c = jr_list_new(r, at, l->n);
    if (!c)
        return RIVER_ENOMEM;
    for (size_t i = 0; i < l->n; i++)
        c->v[i] = l->v[l->n - 1 - i];
    c->n = l->n;
    *out = jinja__list_val(c);
    return 0;
}

/* Markup(value): the value's text (a list's too, as str() prints it), marked markup. */
static int f_safe(jrender_t *r, const jnode_t *at, jval_t v, const jargs_t *args, jval_t *out)
{
    NO_ARGS("safe");
    jstr_t *s;
    int err = jinja__text_of(r, at, v, &s);
    if (!err && !(err = jr_markup(r, at, s, &s)))
        *out = jv_str(s);
    return err;
}

static int f_string(jrender_t *r, const jnode_t *at, jval_t v, const jargs_t *args, jval_t *out)
{
    NO_ARGS("string");
    jstr_t *s;
    int err = jinja__text_of(r, at, v, &s);
    if (!err)
        *out = jv_str(s);
    return err;
}

static int f_pprint(jrender_t *r, const jnode_t *at, jval_t v, const jargs_t *args, jval_t *out)
{
    jstr_t *s;
    int err = jr_repr(r, at, v, &s);
    if (!err)
        *out = jv_str(s);
    return err;
}

/* The sort key of a value: its attribute path, lowered when case-insensitive. */
static int sort_key(jrender_t *r, const jnode_t *at, jval_t v, const jstr_t *attr, int cs,
                    jval_t *out)
{
    int err;
    if (attr && (err = jinja__get_path(r, at, v, attr, &v)))
        return err;
    if (!cs && v.t == JV_STR)
        return jinja__map_str(r, at, v.u.s, jinja__cp_lower, out);
    *out = v;
    return 0;
}

/* Stable merge sort of vals by keys (Python's sorted is stable). */
static int merge_sort(jrender_t *r, const jnode_t *at, jval_t *keys, jval_t *vals, size_t n,
                      int reverse, jval_t *tk, jval_t *tv)
{
    if (n < 2)
        return 0;
    size_t m = n / 2;
    int err;
    if ((err = merge_sort(r, at, keys, vals, m, reverse, tk, tv)) ||
        (err = merge_sort(r, at, keys + m, vals + m, n - m, reverse, tk, tv)))
        return err;
    size_t i = 0, j = m, o = 0;
    while (i < m && j < n) {
        int lt;
        /* Take the right one first only when it is strictly before the left. */
        if ((err = jr_compare(r, at, '<', reverse ? keys[i] : keys[j], reverse ? keys[j] : keys[i],
                              &lt)))
            return err;
        if (lt) {
            tk[o] = keys[j];
            tv[o++] = vals[j++];
        } else {
            tk[o] = keys[i];
            tv[o++] = vals[i++];
        }
    }
    while (i < m) {
        tk[o] = keys[i];
        tv[o++] = vals[i++];
    }
    while (j < n) {
        tk[o] = keys[j];
        tv[o++] = vals[j++];
    }
    memcpy(keys, tk, n * sizeof *keys);
    memcpy(vals, tv, n * sizeof *vals);
    return 0;
}

static int sort_items(jrender_t *r, const jnode_t *at, jlist_t *items, const jval_t *keys_in,
                      int reverse, jlist_t **out)
{
    size_t n = items->n;
    jlist_t *res = jr_list_new(r, at, n);
    jval_t *keys = jr_alloc(r, at, (n + 1) * sizeof *keys);
    jval_t *tk = jr_alloc(r, at, (n + 1) * sizeof *tk), *tv = jr_alloc(r, at, (n + 1) * sizeof *tv);
    if (!res || !keys || !tk || !tv)
        return RIVER_ENOMEM;
    if (n) {
        memcpy(res->v, items->v, n * sizeof *res->v);
        memcpy(keys, keys_in, n * sizeof *keys);
    }
    res->n = n;
    int err = jr_count(r, at, n);
    if (err || (err = merge_sort(r, at, keys, res->v, n, reverse, tk, tv)))
        return err;
    *out = res;
    return 0;
}

static int f_sort(jrender_t *r, const jnode_t *at, jval_t v, const jargs_t *args, jval_t *out)
{
    BIND("sort", "reverse", "case_sensitive", "attribute");
    jlist_t *items, *res;
    jstr_t *attr = NULL;
    int err;
    if ((err = jr_iterate(r, at, v, &items)))
        return err;
    if (GIVEN(a[2]) && a[2].t != JV_NONE && (err = jinja__text_of(r, at, a[2], &attr)))
        return err;
    jval_t *keys = jr_alloc(r, at, (items->n + 1) * sizeof *keys);
    if (!keys)
        return RIVER_ENOMEM;
    int cs = GIVEN(a[1]) && jv_truthy(a[1]);
    for (size_t i = 0; i < items->n; i++)
        if ((err = sort_key(r, at, items->v[i], attr, cs, &keys[i])))
            return err;
    if ((err = sort_items(r, at, items, keys, GIVEN(a[0]) && jv_truthy(a[0]), &res)))
        return err;
    *out = jinja__list_val(res);
    return 0;
}

static int f_dictsort(jrender_t *r, const jnode_t *at, jval_t v, const jargs_t *args, jval_t *out)
{
    BIND("dictsort", "case_sensitive", "by", "reverse");
    if (v.t != JV_DICT)
        return jr_fail(r, at, RIVER_EINVAL, "dictsort: needs a mapping, not '%s'", jv_type_name(v));
    jval_t pairs;
    jargs_t none = {0};
    jlist_t *res;
    int err = jinja__m_items(r, at, v, &none, &pairs);
    if (err)
        return err;
    int by_value = GIVEN(a[1]) && a[1].t == JV_STR && !strcmp(a[1].u.s->s, "value");
    int cs = GIVEN(a[0]) && jv_truthy(a[0]);
    jlist_t *items = pairs.u.l;
    jval_t *keys = jr_alloc(r, at, (items->n + 1) * sizeof *keys);
    if (!keys)
        return RIVER_ENOMEM;
    for (size_t i = 0; i < items->n; i++)
        if ((err = sort_key(r, at, items->v[i].u.l->v[by_value], NULL, cs, &keys[i])))
            return err;
    if ((err = sort_items(r, at, items, keys, GIVEN(a[2]) && jv_truthy(a[2]), &res)))
        return err;
    *out = jinja__list_val(res);
    return 0;
}

static int minmax(jrender_t *r, const jnode_t *at, jval_t v, const jargs_t *args, int want_max,
                  jval_t *out)
{
    BIND("max", "case_sensitive", "attribute");
    jlist_t *items;
    jstr_t *attr = NULL;
    int err;
    if ((err = jr_iterate(r, at, v, &items)))
        return err;
    if (GIVEN(a[1]) && a[1].t != JV_NONE && (err = jinja__text_of(r, at, a[1], &attr)))
        return err;
    int cs = GIVEN(a[0]) && jv_truthy(a[0]);
    if (!items->n) {
        *out = jv_undef();
        return 0;
    }
    jval_t best = items->v[0], bk;
    if ((err = sort_key(r, at, best, attr, cs, &bk)))
        return err;
    for (size_t i = 1; i < items->n; i++) {
        jval_t k;
        int better;
        if ((err = sort_key(r, at, items->v[i], attr, cs, &k)) ||
            (err = jr_compare(r, at, want_max ? '>' : '<', k, bk, &better)))
            return err;
        if (better) {
            best = items->v[i];
            bk = k;
        }
    }
    *out = best;
    return 0;
}

static int f_max(jrender_t *r, const jnode_t *at, jval_t v, const jargs_t *args, jval_t *out)
{
    return minmax(r, at, v, args, 1, out);
}

static int f_min(jrender_t *r, const jnode_t *at, jval_t v, const jargs_t *args, jval_t *out)
{
    return minmax(r, at, v, args, 0, out);
}

static int f_trim(jrender_t *r, const jnode_t *at, jval_t v, const jargs_t *args, jval_t *out)
{
    BIND("trim", "chars");
    jstr_t *s, *chars = NULL;
    int err;
    if ((err = jinja__text_of(r, at, v, &s)))
        return err;
    if (GIVEN(a[0]) && a[0].t != JV_NONE && (err = jinja__want_str(r, at, a[0], "trim", &chars)))
        return err;
    return jinja__py_strip(r, at, s, chars, 3, out);
}

static int f_truncate(jrender_t *r, const jnode_t *at, jval_t v, const jargs_t *args, jval_t *out)
{
    BIND("truncate", "length", "killwords", "end", "leeway");
    jstr_t *s, *end = NULL;
    int64_t length = 255, leeway = 5;
    int err;
    if ((err = jinja__text_of(r, at, v, &s)) ||
        (GIVEN(a[0]) && (err = jinja__want_int(r, at, a[0], "truncate", &length))) ||
        (GIVEN(a[2]) && (err = jinja__text_of(r, at, a[2], &end))) ||
        (GIVEN(a[3]) && (err = jinja__want_int(r, at, a[3], "truncate", &leeway))))
        return err;
    if (!end && !(end = jr_str_new(r, at, "...", 3)))
        return RIVER_ENOMEM;
    size_t n = ju_len(s->s, s->len), el = ju_len(end->s, end->len);
    /* Jinja2's assertions, which also keep the sums below from overflowing. */
    if (length < (int64_t)el)
        return jr_fail(r, at, RIVER_EINVAL, "truncate: expected length >= %zu, got %lld", el,
                       (long long)length);
    if (leeway < 0)
        return jr_fail(r, at, RIVER_EINVAL, "truncate: expected leeway >= 0, got %lld",
                       (long long)leeway);
    if (length > INT64_MAX - leeway || (int64_t)n <= length + leeway) {
        *out = jv_str(s);
        return 0;
    }
    /* A Markup's piece + end escapes end, after its unescaped length counted (Jinja2's
     * do_truncate); jr_markup_result marks the result. */
    if (s->markup && (err = jr_escape(r, at, end, &end)))
        return err;
    int64_t keep = length - (int64_t)el;
    size_t off = ju_offset(s->s, s->len, (size_t)keep);
    if (!(GIVEN(a[1]) && jv_truthy(a[1]))) {
        /* Drop the last, partial word: rsplit(" ", 1)[0]. */
        size_t k = off;
        while (k > 0 && s->s[k - 1] != ' ')
            k--;
        if (k > 0)
            off = k - 1;
    }
    tb_t b = {.r = r, .at = at};
    jinja__tb_put(&b, s->s, off);
    jinja__tb_put(&b, end->s, end->len);
    return jinja__tb_done(&b, out);
}

static int f_unique(jrender_t *r, const jnode_t *at, jval_t v, const jargs_t *args, jval_t *out)
{
    BIND("unique", "case_sensitive", "attribute");
    jlist_t *items, *res, *seen;
    jstr_t *attr = NULL;
    int err;
    if ((err = jr_iterate(r, at, v, &items)))
        return err;
    if (GIVEN(a[1]) && a[1].t != JV_NONE && (err = jinja__text_of(r, at, a[1], &attr)))
        return err;
    int cs = GIVEN(a[0]) && jv_truthy(a[0]);
    if (!(res = jr_list_new(r, at, 0)) || !(seen = jr_list_new(r, at, 0)))
        return RIVER_ENOMEM;
    if ((err = jr_count(r, at, items->n)))
        return err;
    for (size_t i = 0; i < items->n; i++) {
        jval_t k;
        if ((err = sort_key(r, at, items->v[i], attr, cs, &k)))
            return err;
        int dup = 0;
        if ((err = jr_count(r, at, seen->n / 16)))
            return err; /* the scan below is quadratic: it counts against the loop bound */
        for (size_t j = 0; j < seen->n && !dup; j++)
            dup = jv_equal(seen->v[j], k);
        if (dup)
            continue;
        if ((err = jr_list_push(r, at, seen, k)) || (err = jr_list_push(r, at, res, items->v[i])))
            return err;
    }
    *out = jinja__list_val(res);
    return 0;
}

static int f_wordcount(jrender_t *r, const jnode_t *at, jval_t v, const jargs_t *args, jval_t *out)
{
    NO_ARGS("wordcount");
    jstr_t *s;
    int err = jinja__text_of(r, at, v, &s);
    if (err)
        return err;
    int64_t words = 0;
    int in = 0;
    size_t i = 0, adv;
    while (i < s->len) {
        int32_t c = ju_decode(s->s + i, s->len - i, &adv);
        int w = jinja__cp_alnum(c) || c == '_';
        if (w && !in)
            words++;
        in = w;
        i += adv;
    }
    *out = jv_int(words);
    return 0;
}

/* ---- Tables ---- */

static const jbuiltin_t filters[] = {
    {"attr", f_attr, JV_ABSENT},
    {"capitalize", f_capitalize, JV_ABSENT},
    {"center", f_center, JV_ABSENT},
    {"count", f_length, JV_ABSENT},
    {"d", f_default, JV_ABSENT},
    {"default", f_default, JV_ABSENT},
    {"dictsort", f_dictsort, JV_ABSENT},
    {"e", f_escape, JV_ABSENT},
    {"escape", f_escape, JV_ABSENT},
    {"first", f_first, JV_ABSENT},
    {"forceescape", f_forceescape, JV_ABSENT},
    {"format", f_format, JV_ABSENT},
    {"indent", f_indent, JV_ABSENT},
    {"items", f_items, JV_ABSENT},
    {"join", f_join, JV_ABSENT},
    {"last", f_last, JV_ABSENT},
    {"length", f_length, JV_ABSENT},
    {"list", f_list, JV_ABSENT},
    {"lower", f_lower, JV_ABSENT},
    {"map", f_map, JV_ABSENT},
    {"max", f_max, JV_ABSENT},
    {"min", f_min, JV_ABSENT},
    {"pprint", f_pprint, JV_ABSENT},
    {"reject", f_reject, JV_ABSENT},
    {"rejectattr", f_rejectattr, JV_ABSENT},
    {"replace", f_replace, JV_ABSENT},
    {"reverse", f_reverse, JV_ABSENT},
    {"safe", f_safe, JV_ABSENT},
    {"select", f_select, JV_ABSENT},
    {"selectattr", f_selectattr, JV_ABSENT},
    {"sort", f_sort, JV_ABSENT},
    {"string", f_string, JV_ABSENT},
    {"title", f_title, JV_ABSENT},
    {"trim", f_trim, JV_ABSENT},
    {"truncate", f_truncate, JV_ABSENT},
    {"unique", f_unique, JV_ABSENT},
    {"upper", f_upper, JV_ABSENT},
    {"wordcount", f_wordcount, JV_ABSENT},
};

#define N_OF(t) (sizeof(t) / sizeof((t)[0]))

static const jbuiltin_t *find(const jbuiltin_t *tab, size_t n, jv_type_t type, const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (tab[i].type == type && !strcmp(tab[i].name, name))
            return &tab[i];
    return NULL;
}

const jbuiltin_t *jinja_filter_find(const char *name)
{
    const jbuiltin_t *b = find(filters, N_OF(filters), JV_ABSENT, name);
    if (!b)
        b = find(jinja__num_filters, jinja__n_num_filters, JV_ABSENT, name);
    return b ? b : find(jinja__json_filters, jinja__n_json_filters, JV_ABSENT, name);
}

const jbuiltin_t *jinja_test_find(const char *name)
{
    return find(jinja__tests, jinja__n_tests, JV_ABSENT, name);
}

const jbuiltin_t *jinja_method_find(jv_type_t t, const char *name)
{
    const jbuiltin_t *b = find(jinja__str_methods, jinja__n_str_methods, t, name);
    return b ? b : find(jinja__seq_methods, jinja__n_seq_methods, t, name);
}

const jbuiltin_t *jinja_global_find(const char *name)
{
    return find(jinja__globals, jinja__n_globals, JV_ABSENT, name);
}
