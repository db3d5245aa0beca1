/* Chat-template filters on numbers: abs, int, float, round and sum, each as its Jinja2 3.1
 * counterpart (int and float read strings the way Python's int() and float() do). The table
 * at the end joins the filter lookup in jinja_filters.c. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "text/jinja_builtins.h"

static int f_abs(jrender_t *r, const jnode_t *at, jval_t v, const jargs_t *args, jval_t *out)
{
    NO_ARGS("abs");
    if (v.t == JV_INT || v.t == JV_BOOL) {
        int64_t i = v.t == JV_INT ? v.u.i : v.u.b;
        if (i == INT64_MIN)
            return jr_fail(r, at, RIVER_ERANGE, "integer overflow");
        *out = jv_int(i < 0 ? -i : i);
    } else if (v.t == JV_FLOAT) {
        *out = jv_float(fabs(v.u.f));
    } else {
        return jr_fail(r, at, RIVER_EINVAL, "bad operand type for abs(): '%s'", jv_type_name(v));
    }
    return 0;
}

/* The number text of a string as Python's int() and float() see it: spaces around trimmed,
 * digit-group underscores dropped. Fails on an empty or over-long text. */
static int num_text(const jstr_t *s, char buf[128])
{
    size_t b = 0, e = s->len, o = 0;
    while (b < e && ju_isspace((unsigned char)s->s[b]))
        b++;
    while (e > b && ju_isspace((unsigned char)s->s[e - 1]))
        e--;
    if (e == b || e - b >= 128)
        return -1;
    for (size_t i = b; i < e; i++)
        if (s->s[i] != '_')
            buf[o++] = s->s[i];
    buf[o] = 0;
    return 0;
}

/* Python's float() of a string: a decimal literal, inf or nan (strtod's hex forms refused). */
static int parse_float(const jstr_t *s, double *out)
{
    char buf[128];
    if (num_text(s, buf) || strpbrk(buf, "xXpP"))
        return -1;
    char *end;
    *out = strtod(buf, &end);
    return *end ? -1 : 0;
}

static int parse_int(const jstr_t *s, int base, int64_t *out)
{
    char buf[128];
    if (num_text(s, buf))
        return -1;
    const char *p = buf;
    if (base == 16 && p[0] && (p[1] == 'x' || p[1] == 'X') && p[0] == '0')
        p += 2;
    char *end;
    errno = 0;
    long long v = strtoll(p, &end, base);
    if (*end || end == p || errno)
        return -1;
    *out = v;
    return 0;
}

static int f_int(jrender_t *r, const jnode_t *at, jval_t v, const jargs_t *args, jval_t *out)
{
    BIND("int", "default", "base");
    int64_t base = 10, i;
    double f;
    int err;
    if (GIVEN(a[1]) && (err = jinja__want_int(r, at, a[1], "int", &base)))
        return err;
    if (base < 2 || base > 36)
        return jr_fail(r, at, RIVER_EINVAL, "int: base must be in 2..36");
    jval_t dflt = GIVEN(a[0]) ? a[0] : jv_int(0);
    switch (v.t) {
    case JV_INT:
        *out = v;
        return 0;
    case JV_BOOL:
        *out = jv_int(v.u.b);
        return 0;
    case JV_FLOAT:
        if (!isfinite(v.u.f) || fabs(v.u.f) >= 9.2e18) {
            *out = dflt;
            return 0;
        }
        *out = jv_int((int64_t)v.u.f);
        return 0;
    case JV_STR:
        if (parse_int(v.u.s, (int)base, &i) == 0) {
            *out = jv_int(i);
        } else if (parse_float(v.u.s, &f) == 0 && isfinite(f) && fabs(f) < 9.2e18) {
            *out = jv_int((int64_t)f);
        } else {
            *out = dflt;
        }
        return 0;
    default:
        *out = dflt;
        return 0;
    }
}

static int f_float(jrender_t *r, const jnode_t *at, jval_t v, const jargs_t *args, jval_t *out)
{
    BIND("float", "default");
    double f;
    jval_t dflt = GIVEN(a[0]) ? a[0] : jv_float(0.0);
    if (v.t == JV_FLOAT)
        *out = v;
    else if (v.t == JV_INT)
        *out = jv_float((double)v.u.i);
    else if (v.t == JV_BOOL)
        *out = jv_float(v.u.b);
    else if (v.t == JV_STR && parse_float(v.u.s, &f) == 0)
        *out = jv_float(f);
    else
        *out = dflt;
    return 0;
}

static int f_round(jrender_t *r, const jnode_t *at, jval_t v, const jargs_t *args, jval_t *out)
{
    BIND("round", "precision", "method");
    int64_t prec = 0;
    int err;
    if (GIVEN(a[0]) && (err = jinja__want_int(r, at, a[0], "round", &prec)))
        return err;
    const char *method = "common";
    if (GIVEN(a[1])) {
        if (a[1].t != JV_STR)
            return jr_fail(r, at, RIVER_EINVAL, "round: method must be a string");
        method = a[1].u.s->s;
    }
    if (strcmp(method, "common") && strcmp(method, "ceil") && strcmp(method, "floor"))
        return jr_fail(r, at, RIVER_EINVAL, "method must be common, ceil or floor");
    if (v.t != JV_INT && v.t != JV_BOOL && v.t != JV_FLOAT)
        return jr_fail(r, at, RIVER_EINVAL, "round: '%s' is not a number", jv_type_name(v));
    if (prec > 300)
        prec = 300;
    if (prec < -300)
        prec = -300;
    double x = v.t == JV_FLOAT ? v.u.f : v.t == JV_INT ? (double)v.u.i : v.u.b;
    if (!strcmp(method, "common")) {
        if (v.t != JV_FLOAT) {
            *out = v.t == JV_BOOL ? jv_int(v.u.b) : v; /* round(int, n) stays an int */
            return 0;
        }
        if (!isfinite(x)) {
            *out = v;
            return 0;
        }
        if (prec >= 0) {
            /* printf rounds the exact binary value half to even, as Python's round does. */
            char buf[400];
            snprintf(buf, sizeof buf, "%.*f", (int)prec, x);
            *out = jv_float(strtod(buf, NULL));
        } else {
            double p = pow(10.0, (double)-prec);
            *out = jv_float(nearbyint(x / p) * p);
        }
        return 0;
    }
    double p = pow(10.0, (double)prec);
    *out = jv_float((!strcmp(method, "ceil") ? ceil(x * p) : floor(x * p)) / p);
    return 0;
}

static int f_sum(jrender_t *r, const jnode_t *at, jval_t v, const jargs_t *args, jval_t *out)
{
    BIND("sum", "attribute", "start");
    jlist_t *items;
    jstr_t *attr = NULL;
    int err;
    if ((err = jr_iterate(r, at, v, &items)))
        return err;
    if (GIVEN(a[0]) && a[0].t != JV_NONE && (err = jinja__text_of(r, at, a[0], &attr)))
        return err;
    int64_t si = 0;
    double sf = 0;
    int fl = 0;
    if (GIVEN(a[1])) {
        if (a[1].t == JV_FLOAT) {
            fl = 1;
            sf = a[1].u.f;
        } else if ((err = jinja__want_int(r, at, a[1], "sum", &si))) {
            return err;
        }
    }
    for (size_t i = 0; i < items->n; i++) {
        jval_t x = items->v[i];
        if (attr && (err = jinja__get_path(r, at, x, attr, &x)))
            return err;
        if (x.t == JV_FLOAT) {
            if (!fl) {
                fl = 1;
                sf = (double)si;
            }
            sf += x.u.f;
        } else if (x.t == JV_INT || x.t == JV_BOOL) {
            int64_t xi = x.t == JV_INT ? x.u.i : x.u.b;
            if (fl)
                sf += (double)xi;
            else if (__builtin_add_overflow(si, xi, &si))
                return jr_fail(r, at, RIVER_ERANGE, "integer overflow");
        } else {
            return jr_fail(r, at, RIVER_EINVAL, "unsupported operand type(s) for +: 'int' and '%s'",
                           jv_type_name(x));
        }
    }
    *out = fl ? jv_float(sf) : jv_int(si);
    return 0;
}

const jbuiltin_t jinja__num_filters[] = {
    {"abs", f_abs, JV_ABSENT},
    {"float", f_float, JV_ABSENT},
    {"int", f_int, JV_ABSENT},
    {"round", f_round, JV_ABSENT},
    {"sum", f_sum, JV_ABSENT},
};
const size_t jinja__n_num_filters = sizeof jinja__num_filters / sizeof jinja__num_filters[0];
