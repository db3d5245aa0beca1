/* Chat-template builtins: Jinja2's tests (defined, none, string, odd, divisibleby, in, ...)
 * and the globals transformers provides to templates (raise_exception, strftime_now,
 * namespace, range, dict). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <utf8proc.h>

#include "common/err.h"
#include "text/jinja_builtins.h"

/* ---- Tests ---- */

#define TEST_FN(fname, expr)                                                                       \
    static int fname(jrender_t *r, const jnode_t *at, jval_t v, const jargs_t *args, jval_t *out)  \
    {                                                                                              \
        NO_ARGS(#fname);                                                                           \
        *out = jv_bool(expr);                                                                      \
        return 0;                                                                                  \
    }
TEST_FN(t_defined, v.t != JV_UNDEF)
TEST_FN(t_undefined, v.t == JV_UNDEF)
TEST_FN(t_none, v.t == JV_NONE)
TEST_FN(t_boolean, v.t == JV_BOOL)
TEST_FN(t_true, v.t == JV_BOOL && v.u.b)
TEST_FN(t_false, v.t == JV_BOOL && !v.u.b)
TEST_FN(t_number, v.t == JV_INT || v.t == JV_FLOAT || v.t == JV_BOOL)
TEST_FN(t_integer, v.t == JV_INT)
TEST_FN(t_float, v.t == JV_FLOAT)
TEST_FN(t_string, v.t == JV_STR)
TEST_FN(t_mapping, v.t == JV_DICT)
TEST_FN(t_iterable,
        v.t == JV_STR || v.t == JV_LIST || v.t == JV_DICT || v.t == JV_UNDEF || v.t == JV_LOOP)
TEST_FN(t_sequence, v.t == JV_STR || v.t == JV_LIST || v.t == JV_DICT || v.t == JV_UNDEF)
TEST_FN(t_callable, v.t == JV_FUNC || v.t == JV_UNDEF)
/* hasattr(value, "__html__"): only a Markup has one here. */
TEST_FN(t_escaped, v.t == JV_STR && v.u.s->markup)
TEST_FN(t_lower, v.t == JV_STR && jinja__str_class(v.u.s, 'l'))
TEST_FN(t_upper, v.t == JV_STR && jinja__str_class(v.u.s, 'u'))

static int t_odd_even(jrender_t *r, const jnode_t *at, jval_t v, const jargs_t *args, int odd,
                      jval_t *out)
{
    NO_ARGS(odd ? "odd" : "even");
    int64_t i;
    int err = jinja__want_int(r, at, v, odd ? "odd" : "even", &i);
    if (!err)
        *out = jv_bool((i % 2 != 0) == odd);
    return err;
}

static int t_odd(jrender_t *r, const jnode_t *at, jval_t v, const jargs_t *args, jval_t *out)
{
    return t_odd_even(r, at, v, args, 1, out);
}

static int t_even(jrender_t *r, const jnode_t *at, jval_t v, const jargs_t *args, jval_t *out)
{
    return t_odd_even(r, at, v, args, 0, out);
}

static int t_divisibleby(jrender_t *r, const jnode_t *at, jval_t v, const jargs_t *args,
                         jval_t *out)
{
    BIND("divisibleby", "num");
    int64_t x, y;
    int err;
    if ((err = jinja__want_int(r, at, v, "divisibleby", &x)) ||
        (err = jinja__want_int(r, at, a[0], "divisibleby", &y)))
        return err;
    if (y == 0)
        return jr_fail(r, at, RIVER_EINVAL, "integer division or modulo by zero");
    *out = jv_bool(y == -1 || x % y == 0);
    return 0;
}

static int t_eq(jrender_t *r, const jnode_t *at, jval_t v, const jargs_t *args, jval_t *out)
{
    BIND("eq", "other");
    *out = jv_bool(jv_equal(v, a[0]));
    return 0;
}

static int t_ne(jrender_t *r, const jnode_t *at, jval_t v, const jargs_t *args, jval_t *out)
{
    BIND("ne", "other");
    *out = jv_bool(!jv_equal(v, a[0]));
    return 0;
}

static int t_order(jrender_t *r, const jnode_t *at, jval_t v, const jargs_t *args, int op,
                   jval_t *out)
{
    BIND("compare", "other");
    int res, err = jr_compare(r, at, op, v, a[0], &res);
    if (!err)
        *out = jv_bool(res);
    return err;
}

static int t_lt(jrender_t *r, const jnode_t *at, jval_t v, const jargs_t *args, jval_t *out)
{
    return t_order(r, at, v, args, '<', out);
}

static int t_le(jrender_t *r, const jnode_t *at, jval_t v, const jargs_t *args, jval_t *out)
{
    return t_order(r, at, v, args, OP_LE, out);
}

static int t_gt(jrender_t *r, const jnode_t *at, jval_t v, const jargs_t *args, jval_t *out)
{
    return t_order(r, at, v, args, '>', out);
}

static int t_ge(jrender_t *r, const jnode_t *at, jval_t v, const jargs_t *args, jval_t *out)
{
    return t_order(r, at, v, args, OP_GE, out);
}

static int t_in(jrender_t *r, const jnode_t *at, jval_t v, const jargs_t *args, jval_t *out)
{
    BIND("in", "seq");
    jval_t hay = a[0];
    int res = 0;
    if (hay.t == JV_STR) {
        if (v.t != JV_STR)
            return jr_fail(r, at, RIVER_EINVAL, "'in <string>' requires string as left operand");
        res = v.u.s->len == 0 || memmem(hay.u.s->s, hay.u.s->len, v.u.s->s, v.u.s->len) != NULL;
    } else if (hay.t == JV_DICT) {
        res = v.t == JV_STR && jv_dict_get(hay.u.d, v.u.s->s, v.u.s->len) != NULL;
    } else if (hay.t == JV_LIST) {
        for (size_t i = 0; i < hay.u.l->n && !res; i++)
            res = jv_equal(v, hay.u.l->v[i]);
    } else if (hay.t != JV_UNDEF) {
        return jr_fail(r, at, RIVER_EINVAL, "argument of type '%s' is not iterable",
                       jv_type_name(hay));
    }
    *out = jv_bool(res);
    return 0;
}

static int t_sameas(jrender_t *r, const jnode_t *at, jval_t v, const jargs_t *args, jval_t *out)
{
    BIND("sameas", "other");
    jval_t o = a[0];
    int same = v.t == o.t;
    if (same) {
        switch (v.t) {
        case JV_BOOL:
            same = v.u.b == o.u.b;
            break;
        case JV_INT:
            same = v.u.i == o.u.i;
            break;
        case JV_FLOAT:
            same = 0;
            break;
        case JV_STR:
            same = v.u.s == o.u.s;
            break;
        case JV_LIST:
            same = v.u.l == o.u.l;
            break;
        case JV_DICT:
        case JV_NS:
            same = v.u.d == o.u.d;
            break;
        case JV_FUNC:
            same = v.u.fn == o.u.fn;
            break;
        case JV_LOOP:
            same = v.u.loop == o.u.loop;
            break;
        default:
            break;
        }
    }
    *out = jv_bool(same);
    return 0;
}

static int t_filter(jrender_t *r, const jnode_t *at, jval_t v, const jargs_t *args, jval_t *out)
{
    NO_ARGS("filter");
    *out = jv_bool(v.t == JV_STR && jinja_filter_find(v.u.s->s));
    return 0;
}

static int t_test(jrender_t *r, const jnode_t *at, jval_t v, const jargs_t *args, jval_t *out)
{
    NO_ARGS("test");
    *out = jv_bool(v.t == JV_STR && jinja_test_find(v.u.s->s));
    return 0;
}

/* ---- Globals ---- */

static int g_raise_exception(jrender_t *r, const jnode_t *at, jval_t self, const jargs_t *args,
                             jval_t *out)
{
    BIND("raise_exception", "message");
    jstr_t *s;
    int err = jinja__text_of(r, at, a[0], &s);
    if (err)
        return err;
    return jr_fail(r, at, RIVER_EINVAL, "%.*s", (int)(s->len > 400 ? 400 : s->len), s->s);
}

static int g_strftime_now(jrender_t *r, const jnode_t *at, jval_t self, const jargs_t *args,
                          jval_t *out)
{
    BIND("strftime_now", "format");
    jstr_t *fmt;
    struct tm tm;
    int err;
    if ((err = jinja__want_str(r, at, a[0], "strftime_now", &fmt)) || (err = jr_now(r, at, &tm)))
        return err;
    if (fmt->len > 256)
        return jr_fail(r, at, RIVER_EINVAL, "strftime_now: format too long");
    /* 256 bytes of format expand to far less than this; 0 is also an empty result. */
    char buf[16384];
    size_t n = fmt->len ? strftime(buf, sizeof buf, fmt->s, &tm) : 0;
    return jr_strval(r, at, buf, n, out);
}

/* namespace(dict?, key=value...) and dict(dict?, key=value...). */
static int make_mapping(jrender_t *r, const jnode_t *at, const jargs_t *args, jv_type_t t,
                        jval_t *out)
{
    jdict_t *d = jr_dict_new(r, at, 0);
    int err;
    if (!d)
        return RIVER_ENOMEM;
    if (args->npos > 1)
        return jr_fail(r, at, RIVER_EINVAL, "expected at most 1 positional argument");
    if (args->npos == 1) {
        jval_t src = args->pos[0];
        if (src.t != JV_DICT && src.t != JV_NS)
            return jr_fail(r, at, RIVER_EINVAL, "expected a mapping, not '%s'", jv_type_name(src));
        for (size_t i = 0; i < src.u.d->n; i++)
            if ((err = jr_dict_set(r, at, d, src.u.d->k[i], src.u.d->v[i])))
                return err;
    }
    for (size_t k = 0; k < args->nkw; k++) {
        jstr_t *ks = jr_str_new(r, at, args->kwn[k], strlen(args->kwn[k]));
        if (!ks || (err = jr_dict_set(r, at, d, ks, args->kwv[k])))
            return ks ? err : RIVER_ENOMEM;
    }
    *out = jinja__dict_val(d);
    out->t = t;
    return 0;
}

static int g_namespace(jrender_t *r, const jnode_t *at, jval_t self, const jargs_t *args,
                       jval_t *out)
{
    return make_mapping(r, at, args, JV_NS, out);
}

static int g_dict(jrender_t *r, const jnode_t *at, jval_t self, const jargs_t *args, jval_t *out)
{
    return make_mapping(r, at, args, JV_DICT, out);
}

static int g_range(jrender_t *r, const jnode_t *at, jval_t self, const jargs_t *args, jval_t *out)
{
    BIND("range", "start", "stop", "step");
    int64_t v[3] = {0, 0, 1};
    int err;
    size_t n = args->npos;
    if (n < 1 || n > 3 || args->nkw)
        return jr_fail(r, at, RIVER_EINVAL, "range expects 1 to 3 integer arguments");
    for (size_t i = 0; i < n; i++)
        if ((err = jinja__want_int(r, at, a[i], "range", &v[n == 1 ? 1 : i])))
            return err;
    if (v[2] == 0)
        return jr_fail(r, at, RIVER_EINVAL, "range() arg 3 must not be zero");
    /* The element count, without overflow. */
    uint64_t count = jinja_range_len(v[0], v[1], v[2]);
    if (count > JINJA_MAX_ITERS)
        return jr_fail(r, at, RIVER_EFULL, "range of %llu items is over the loop bound",
                       (unsigned long long)count);
    if ((err = jr_count(r, at, (size_t)count)))
        return err;
    jlist_t *l = jr_list_new(r, at, (size_t)count);
    if (!l)
        return RIVER_ENOMEM;
    for (uint64_t i = 0; i < count; i++)
        l->v[l->n++] = jv_int((int64_t)((uint64_t)v[0] + i * (uint64_t)v[2])); /* no overflow: it is in range */
    *out = jinja__list_val(l);
    return 0;
}

/* ---- Tables ---- */

const jbuiltin_t jinja__tests[] = {
    {"boolean", t_boolean, JV_ABSENT},
    {"callable", t_callable, JV_ABSENT},
    {"defined", t_defined, JV_ABSENT},
    {"divisibleby", t_divisibleby, JV_ABSENT},
    {"eq", t_eq, JV_ABSENT},
    {"equalto", t_eq, JV_ABSENT},
    {"==", t_eq, JV_ABSENT},
    {"escaped", t_escaped, JV_ABSENT},
    {"even", t_even, JV_ABSENT},
    {"false", t_false, JV_ABSENT},
    {"filter", t_filter, JV_ABSENT},
    {"float", t_float, JV_ABSENT},
    {"ge", t_ge, JV_ABSENT},
    {">=", t_ge, JV_ABSENT},
    {"gt", t_gt, JV_ABSENT},
    {"greaterthan", t_gt, JV_ABSENT},
    {">", t_gt, JV_ABSENT},
    {"in", t_in, JV_ABSENT},
    {"integer", t_integer, JV_ABSENT},
    {"iterable", t_iterable, JV_ABSENT},
    {"le", t_le, JV_ABSENT},
    {"<=", t_le, JV_ABSENT},
    {"lower", t_lower, JV_ABSENT},
    {"lt", t_lt, JV_ABSENT},
    {"lessthan", t_lt, JV_ABSENT},
    {"<", t_lt, JV_ABSENT},
    {"mapping", t_mapping, JV_ABSENT},
    {"ne", t_ne, JV_ABSENT},
    {"!=", t_ne, JV_ABSENT},
    {"none", t_none, JV_ABSENT},
    {"number", t_number, JV_ABSENT},
    {"odd", t_odd, JV_ABSENT},
    {"sameas", t_sameas, JV_ABSENT},
    {"sequence", t_sequence, JV_ABSENT},
    {"string", t_string, JV_ABSENT},
    {"test", t_test, JV_ABSENT},
    {"true", t_true, JV_ABSENT},
    {"undefined", t_undefined, JV_ABSENT},
    {"upper", t_upper, JV_ABSENT},
};
const size_t jinja__n_tests = sizeof jinja__tests / sizeof jinja__tests[0];

const jbuiltin_t jinja__globals[] = {
    {"raise_exception", g_raise_exception, JV_ABSENT},
    {"strftime_now", g_strftime_now, JV_ABSENT},
    {"namespace", g_namespace, JV_ABSENT},
    {"dict", g_dict, JV_ABSENT},
    {"range", g_range, JV_ABSENT},
};
const size_t jinja__n_globals = sizeof jinja__globals / sizeof jinja__globals[0];
