/* Chat-template builtins, as tables: Jinja2's filters and tests, the Python string, dict
 * and list methods templates call, the loop object's methods and the globals transformers
 * provides (raise_exception, strftime_now, namespace, range, dict). Each behaves as its
 * Jinja2 3.1 / Python counterpart on the values templates meet; tojson is transformers'
 * override: Python's json.dumps with ensure_ascii=False. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <utf8proc.h>

#include "common/err.h"
#include "text/jinja.h"

#define BIND(what, ...)                                                        \
    static const char *const params_[] = {__VA_ARGS__, NULL};                  \
    jval_t a[sizeof params_ / sizeof params_[0]];                              \
    do {                                                                       \
        int berr_ = jr_bind(r, at, what, args, params_, a);                    \
        if (berr_)                                                             \
            return berr_;                                                      \
    } while (0)

#define NO_ARGS(what)                                                          \
    do {                                                                       \
        if (args->npos || args->nkw)                                           \
            return jr_fail(r, at, RIVER_EINVAL, "%s takes no arguments", what); \
    } while (0)

#define GIVEN(v) ((v).t != JV_ABSENT)

/* ---- Text building ---- */

typedef struct tb {
    jrender_t *r;
    const jnode_t *at;
    char *p;
    size_t n, cap;
    int err;
} tb_t;

static void tb_put(tb_t *b, const char *s, size_t n)
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

static void tb_cp(tb_t *b, int32_t cp)
{
    char buf[4];
    tb_put(b, buf, ju_encode(cp, buf));
}

static int tb_done(tb_t *b, jval_t *out)
{
    if (b->err)
        return b->err;
    int err = jr_work(b->r, b->at, b->n);
    if (err)
        return err;
    return jr_strval(b->r, b->at, b->p ? b->p : "", b->n, out);
}

static jval_t list_val(jlist_t *l)
{
    jval_t v = {.t = JV_LIST};
    v.u.l = l;
    return v;
}

static jval_t dict_val(jdict_t *d)
{
    jval_t v = {.t = JV_DICT};
    v.u.d = d;
    return v;
}

/* soft_str(): the value as text (undefined: ""). */
static int text_of(jrender_t *r, const jnode_t *at, jval_t v, jstr_t **out)
{
    return jr_to_str(r, at, v, out);
}

static int want_str(jrender_t *r, const jnode_t *at, jval_t v, const char *what, jstr_t **out)
{
    *out = NULL;
    if (v.t != JV_STR)
        return jr_fail(r, at, RIVER_EINVAL, "%s: expected a string, not '%s'", what,
                       jv_type_name(v));
    *out = v.u.s;
    return 0;
}

static int want_int(jrender_t *r, const jnode_t *at, jval_t v, const char *what, int64_t *out)
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

/* ---- Case mapping and classes ---- */

typedef int32_t (*cpmap_t)(int32_t);

static int32_t cp_upper(int32_t c)
{
    return c < 0x80 ? (c >= 'a' && c <= 'z' ? c - 32 : c) : utf8proc_toupper(c);
}

static int32_t cp_lower(int32_t c)
{
    return c < 0x80 ? (c >= 'A' && c <= 'Z' ? c + 32 : c) : utf8proc_tolower(c);
}

static int32_t cp_title(int32_t c)
{
    return c < 0x80 ? cp_upper(c) : utf8proc_totitle(c);
}

static int cp_cased(int32_t c)
{
    if (c < 0x80)
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
    return utf8proc_toupper(c) != c || utf8proc_tolower(c) != c || utf8proc_totitle(c) != c;
}

static int cp_alnum(int32_t c)
{
    if (c < 0x80)
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
    int cat = utf8proc_category(c);
    return (cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO) ||
           (cat >= UTF8PROC_CATEGORY_ND && cat <= UTF8PROC_CATEGORY_NO);
}

static int map_str(jrender_t *r, const jnode_t *at, const jstr_t *s, cpmap_t f, jval_t *out)
{
    tb_t b = {.r = r, .at = at};
    size_t i = 0, adv;
    while (i < s->len && !b.err) {
        int32_t c = ju_decode(s->s + i, s->len - i, &adv);
        if (adv == 1 && (unsigned char)s->s[i] >= 0x80)
            tb_put(&b, s->s + i, 1);
        else
            tb_cp(&b, f(c));
        i += adv;
    }
    return tb_done(&b, out);
}

/* Python's str.title(): upper after an uncased character, lower after a cased one. */
static int py_title(jrender_t *r, const jnode_t *at, const jstr_t *s, jval_t *out)
{
    tb_t b = {.r = r, .at = at};
    size_t i = 0, adv;
    int prev_cased = 0;
    while (i < s->len && !b.err) {
        int32_t c = ju_decode(s->s + i, s->len - i, &adv);
        tb_cp(&b, prev_cased ? cp_lower(c) : cp_title(c));
        prev_cased = cp_cased(c);
        i += adv;
    }
    return tb_done(&b, out);
}

/* Python's str.capitalize(): the first character title case, the rest lower. */
static int py_capitalize(jrender_t *r, const jnode_t *at, const jstr_t *s, jval_t *out)
{
    tb_t b = {.r = r, .at = at};
    size_t i = 0, adv;
    while (i < s->len && !b.err) {
        int32_t c = ju_decode(s->s + i, s->len - i, &adv);
        tb_cp(&b, i == 0 ? cp_title(c) : cp_lower(c));
        i += adv;
    }
    return tb_done(&b, out);
}

/* ---- strip, split, replace ---- */

static int in_chars(const jstr_t *chars, int32_t c)
{
    size_t i = 0, adv;
    while (i < chars->len) {
        if (ju_decode(chars->s + i, chars->len - i, &adv) == c)
            return 1;
        i += adv;
    }
    return 0;
}

/* Python's strip/lstrip/rstrip: which 1 left, 2 right, 3 both; chars NULL: whitespace. */
static int py_strip(jrender_t *r, const jnode_t *at, const jstr_t *s, const jstr_t *chars,
                    int which, jval_t *out)
{
    size_t b = 0, e = s->len, adv;
    if (which & 1)
        while (b < e) {
            int32_t c = ju_decode(s->s + b, e - b, &adv);
            if (chars ? !in_chars(chars, c) : !ju_isspace(c))
                break;
            b += adv;
        }
    if (which & 2)
        while (e > b) {
            size_t k = e - 1;
            while (k > b && ((unsigned char)s->s[k] & 0xC0) == 0x80 && e - k < 4)
                k--;
            int32_t c = ju_decode(s->s + k, e - k, &adv);
            if (k + adv != e) {
                k = e - 1; /* an invalid byte: one character on its own */
                c = (unsigned char)s->s[k];
            }
            if (chars ? !in_chars(chars, c) : !ju_isspace(c))
                break;
            e = k;
        }
    if (b == 0 && e == s->len) {
        *out = jv_str((jstr_t *)s);
        return 0;
    }
    return jr_strval(r, at, s->s + b, e - b, out);
}

static int strip_args(jrender_t *r, const jnode_t *at, jval_t self, const jargs_t *args,
                      int which, jval_t *out)
{
    BIND("strip", "chars");
    jstr_t *chars = NULL;
    int err;
    if (GIVEN(a[0]) && a[0].t != JV_NONE && (err = want_str(r, at, a[0], "strip", &chars)))
        return err;
    return py_strip(r, at, self.u.s, chars, which, out);
}

static int m_strip(jrender_t *r, const jnode_t *at, jval_t self, const jargs_t *args, jval_t *out)
{
    return strip_args(r, at, self, args, 3, out);
}

static int m_lstrip(jrender_t *r, const jnode_t *at, jval_t self, const jargs_t *args, jval_t *out)
{
    return strip_args(r, at, self, args, 1, out);
}

static int m_rstrip(jrender_t *r, const jnode_t *at, jval_t self, const jargs_t *args, jval_t *out)
{
    return strip_args(r, at, self, args, 2, out);
}

static int push_str(jrender_t *r, const jnode_t *at, jlist_t *l, const char *s, size_t n)
{
    jval_t v;
    int err = jr_strval(r, at, s, n, &v);
    return err ? err : jr_list_push(r, at, l, v);
}

/* Python's str.split (rev 0) and str.rsplit (rev 1). */
static int py_split(jrender_t *r, const jnode_t *at, const jstr_t *s, const jstr_t *sep,
                    int64_t maxsplit, int rev, jval_t *out)
{
    jlist_t *l = jr_list_new(r, at, 0);
    int err;
    if (!l)
        return RIVER_ENOMEM;
    if ((err = jr_work(r, at, s->len)))
        return err;
    if (sep && sep->len == 0)
        return jr_fail(r, at, RIVER_EINVAL, "empty separator");
    if (sep && !rev) {
        size_t p = 0;
        while (maxsplit != 0) {
            const char *h = memmem(s->s + p, s->len - p, sep->s, sep->len);
            if (!h)
                break;
            if ((err = jr_count(r, at, 1)) ||
                (err = push_str(r, at, l, s->s + p, (size_t)(h - s->s) - p)))
                return err;
            p = (size_t)(h - s->s) + sep->len;
            if (maxsplit > 0)
                maxsplit--;
        }
        if ((err = push_str(r, at, l, s->s + p, s->len - p)))
            return err;
    } else if (sep) {
        /* rsplit with a separator: split from the right, then reverse. */
        size_t e = s->len;
        while (maxsplit != 0 && e >= sep->len) {
            size_t k = e - sep->len;
            int found = 0;
            for (;;) {
                if (!memcmp(s->s + k, sep->s, sep->len)) {
                    found = 1;
                    break;
                }
                if (k == 0)
                    break;
                k--;
            }
            if (!found)
                break;
            if ((err = jr_count(r, at, 1)) || (err = push_str(r, at, l, s->s + k + sep->len,
                                                               e - k - sep->len)))
                return err;
            e = k;
            if (maxsplit > 0)
                maxsplit--;
        }
        if ((err = push_str(r, at, l, s->s, e)))
            return err;
        for (size_t i = 0; i < l->n / 2; i++) {
            jval_t t = l->v[i];
            l->v[i] = l->v[l->n - 1 - i];
            l->v[l->n - 1 - i] = t;
        }
    } else {
        /* Runs of whitespace, empty strings dropped. */
        size_t i = 0, adv;
        while (i < s->len) {
            while (i < s->len && ju_isspace(ju_decode(s->s + i, s->len - i, &adv)))
                i += adv;
            if (i >= s->len)
                break;
            size_t b = i;
            if (maxsplit == 0) {
                size_t e = s->len;
                while (e > b) {
                    size_t k = e - 1;
                    while (k > b && ((unsigned char)s->s[k] & 0xC0) == 0x80)
                        k--;
                    if (!ju_isspace(ju_decode(s->s + k, e - k, &adv)))
                        break;
                    e = k;
                }
                if ((err = push_str(r, at, l, s->s + b, e - b)))
                    return err;
                break;
            }
            while (i < s->len && !ju_isspace(ju_decode(s->s + i, s->len - i, &adv)))
                i += adv;
            if ((err = jr_count(r, at, 1)) || (err = push_str(r, at, l, s->s + b, i - b)))
                return err;
            if (maxsplit > 0)
                maxsplit--;
        }
    }
    *out = list_val(l);
    return 0;
}

static int split_common(jrender_t *r, const jnode_t *at, jval_t self, const jargs_t *args,
                        int rev, jval_t *out)
{
    BIND("split", "sep", "maxsplit");
    jstr_t *sep = NULL;
    int64_t maxsplit = -1;
    int err;
    if (GIVEN(a[0]) && a[0].t != JV_NONE && (err = want_str(r, at, a[0], "split", &sep)))
        return err;
    if (GIVEN(a[1]) && (err = want_int(r, at, a[1], "split", &maxsplit)))
        return err;
    return py_split(r, at, self.u.s, sep, maxsplit, rev, out);
}

static int m_split(jrender_t *r, const jnode_t *at, jval_t self, const jargs_t *args, jval_t *out)
{
    return split_common(r, at, self, args, 0, out);
}

static int m_rsplit(jrender_t *r, const jnode_t *at, jval_t self, const jargs_t *args, jval_t *out)
{
    return split_common(r, at, self, args, 1, out);
}

/* Python's str.splitlines() boundaries. */
static size_t line_break(const char *s, size_t n, size_t i)
{
    unsigned char c = (unsigned char)s[i];
    if (c == '\r')
        return i + 1 < n && s[i + 1] == '\n' ? 2 : 1;
    if (c == '\n' || c == '\v' || c == '\f' || (c >= 0x1c && c <= 0x1e))
        return 1;
    if (c == 0xC2 && i + 1 < n && (unsigned char)s[i + 1] == 0x85)
        return 2;
    if (c == 0xE2 && i + 2 < n && (unsigned char)s[i + 1] == 0x80 &&
        ((unsigned char)s[i + 2] == 0xA8 || (unsigned char)s[i + 2] == 0xA9))
        return 3;
    return 0;
}

static int py_splitlines(jrender_t *r, const jnode_t *at, const char *s, size_t n, jlist_t **out)
{
    jlist_t *l = jr_list_new(r, at, 0);
    int err;
    if (!l)
        return RIVER_ENOMEM;
    size_t b = 0, i = 0;
    while (i < n) {
        size_t k = line_break(s, n, i);
        if (!k) {
            i++;
            continue;
        }
        if ((err = push_str(r, at, l, s + b, i - b)))
            return err;
        i += k;
        b = i;
    }
    if (b < n && (err = push_str(r, at, l, s + b, n - b)))
        return err;
    *out = l;
    return 0;
}

static int m_splitlines(jrender_t *r, const jnode_t *at, jval_t self, const jargs_t *args,
                        jval_t *out)
{
    BIND("splitlines", "keepends");
    jlist_t *l;
    int err = py_splitlines(r, at, self.u.s->s, self.u.s->len, &l);
    if (!err)
        *out = list_val(l);
    return err;
}

static int py_replace(jrender_t *r, const jnode_t *at, const jstr_t *s, const jstr_t *old,
                      const jstr_t *new_, int64_t count, jval_t *out)
{
    tb_t b = {.r = r, .at = at};
    int err;
    if (old->len == 0) {
        /* Python inserts new between characters (and at both ends). */
        size_t i = 0, adv;
        if (count != 0) {
            tb_put(&b, new_->s, new_->len);
            if (count > 0)
                count--;
        }
        while (i < s->len && !b.err) {
            ju_decode(s->s + i, s->len - i, &adv);
            tb_put(&b, s->s + i, adv);
            i += adv;
            if (count != 0 && (err = jr_count(r, at, 1)) == 0) {
                tb_put(&b, new_->s, new_->len);
                if (count > 0)
                    count--;
            } else if (count != 0) {
                return err;
            }
        }
        return tb_done(&b, out);
    }
    size_t p = 0;
    while (count != 0 && !b.err) {
        const char *h = memmem(s->s + p, s->len - p, old->s, old->len);
        if (!h)
            break;
        tb_put(&b, s->s + p, (size_t)(h - s->s) - p);
        tb_put(&b, new_->s, new_->len);
        p = (size_t)(h - s->s) + old->len;
        if (count > 0)
            count--;
    }
    tb_put(&b, s->s + p, s->len - p);
    return tb_done(&b, out);
}

static int m_replace(jrender_t *r, const jnode_t *at, jval_t self, const jargs_t *args, jval_t *out)
{
    BIND("replace", "old", "new", "count");
    jstr_t *o, *n;
    int64_t count = -1;
    int err;
    if ((err = want_str(r, at, a[0], "replace", &o)) || (err = want_str(r, at, a[1], "replace", &n)))
        return err;
    if (GIVEN(a[2]) && (err = want_int(r, at, a[2], "replace", &count)))
        return err;
    return py_replace(r, at, self.u.s, o, n, count, out);
}

/* startswith / endswith: a string or a tuple of strings. */
static int affix(jrender_t *r, const jnode_t *at, jval_t self, const jargs_t *args, int end,
                 jval_t *out)
{
    BIND(end ? "endswith" : "startswith", "prefix", "start", "end");
    const jstr_t *s = self.u.s;
    size_t n = 1;
    const jval_t *cands = &a[0];
    if (a[0].t == JV_LIST) {
        n = a[0].u.l->n;
        cands = a[0].u.l->v;
    }
    for (size_t i = 0; i < n; i++) {
        jstr_t *p;
        int err = want_str(r, at, cands[i], end ? "endswith" : "startswith", &p);
        if (err)
            return err;
        if (p->len <= s->len &&
            !memcmp(end ? s->s + s->len - p->len : s->s, p->s, p->len)) {
            *out = jv_bool(1);
            return 0;
        }
    }
    *out = jv_bool(0);
    return 0;
}

static int m_startswith(jrender_t *r, const jnode_t *at, jval_t self, const jargs_t *args,
                        jval_t *out)
{
    return affix(r, at, self, args, 0, out);
}

static int m_endswith(jrender_t *r, const jnode_t *at, jval_t self, const jargs_t *args,
                      jval_t *out)
{
    return affix(r, at, self, args, 1, out);
}

static int m_upper(jrender_t *r, const jnode_t *at, jval_t self, const jargs_t *args, jval_t *out)
{
    NO_ARGS("upper");
    return map_str(r, at, self.u.s, cp_upper, out);
}

static int m_lower(jrender_t *r, const jnode_t *at, jval_t self, const jargs_t *args, jval_t *out)
{
    NO_ARGS("lower");
    return map_str(r, at, self.u.s, cp_lower, out);
}

static int m_title(jrender_t *r, const jnode_t *at, jval_t self, const jargs_t *args, jval_t *out)
{
    NO_ARGS("title");
    return py_title(r, at, self.u.s, out);
}

static int m_capitalize(jrender_t *r, const jnode_t *at, jval_t self, const jargs_t *args,
                        jval_t *out)
{
    NO_ARGS("capitalize");
    return py_capitalize(r, at, self.u.s, out);
}

/* find / rfind / index / count of a substring, in code points. */
static int substr_op(jrender_t *r, const jnode_t *at, jval_t self, const jargs_t *args, int op,
                     jval_t *out)
{
    BIND("find", "sub", "start", "end");
    jstr_t *sub;
    int err = want_str(r, at, a[0], "find", &sub);
    if (err)
        return err;
    const jstr_t *s = self.u.s;
    if ((err = jr_work(r, at, s->len)))
        return err;
    if (op == 'c') {
        int64_t c = 0;
        if (sub->len == 0) {
            c = (int64_t)ju_len(s->s, s->len) + 1;
        } else {
            size_t p = 0;
            const char *h;
            while ((h = memmem(s->s + p, s->len - p, sub->s, sub->len))) {
                c++;
                p = (size_t)(h - s->s) + sub->len;
            }
        }
        *out = jv_int(c);
        return 0;
    }
    const char *hit = NULL;
    if (op == 'r') {
        for (size_t k = s->len >= sub->len ? s->len - sub->len + 1 : 0; k-- > 0;)
            if (!memcmp(s->s + k, sub->s, sub->len)) {
                hit = s->s + k;
                break;
            }
    } else {
        hit = sub->len ? memmem(s->s, s->len, sub->s, sub->len) : s->s;
    }
    if (!hit && op == 'i')
        return jr_fail(r, at, RIVER_EINVAL, "substring not found");
    *out = jv_int(hit ? (int64_t)ju_len(s->s, (size_t)(hit - s->s)) : -1);
    return 0;
}

static int m_find(jrender_t *r, const jnode_t *at, jval_t self, const jargs_t *args, jval_t *out)
{
    return substr_op(r, at, self, args, 'f', out);
}

static int m_rfind(jrender_t *r, const jnode_t *at, jval_t self, const jargs_t *args, jval_t *out)
{
    return substr_op(r, at, self, args, 'r', out);
}

static int m_sindex(jrender_t *r, const jnode_t *at, jval_t self, const jargs_t *args, jval_t *out)
{
    return substr_op(r, at, self, args, 'i', out);
}

static int m_scount(jrender_t *r, const jnode_t *at, jval_t self, const jargs_t *args, jval_t *out)
{
    return substr_op(r, at, self, args, 'c', out);
}

static int m_sjoin(jrender_t *r, const jnode_t *at, jval_t self, const jargs_t *args, jval_t *out)
{
    BIND("join", "iterable");
    jlist_t *items;
    int err = jr_iterate(r, at, a[0], &items);
    if (err)
        return err;
    tb_t b = {.r = r, .at = at};
    for (size_t i = 0; i < items->n && !b.err; i++) {
        jstr_t *s;
        if (items->v[i].t != JV_STR)
            return jr_fail(r, at, RIVER_EINVAL, "sequence item %zu: expected str instance, %s found",
                           i, jv_type_name(items->v[i]));
        s = items->v[i].u.s;
        if (i)
            tb_put(&b, self.u.s->s, self.u.s->len);
        tb_put(&b, s->s, s->len);
    }
    return tb_done(&b, out);
}

/* str.isdigit and friends: 'd' digits, 'a' letters, 'n' alphanumerics, 's' space, 'u' upper,
 * 'l' lower. */
static int str_class(const jstr_t *s, int cls)
{
    size_t i = 0, adv;
    int cased = 0;
    if (s->len == 0)
        return 0;
    while (i < s->len) {
        int32_t c = ju_decode(s->s + i, s->len - i, &adv);
        i += adv;
        switch (cls) {
        case 'd':
            if (!(c >= '0' && c <= '9') &&
                !(c >= 0x80 && utf8proc_category(c) == UTF8PROC_CATEGORY_ND))
                return 0;
            break;
        case 'a':
            if (!cp_alnum(c) || (c < 0x80 && c >= '0' && c <= '9') ||
                (c >= 0x80 && utf8proc_category(c) >= UTF8PROC_CATEGORY_ND &&
                 utf8proc_category(c) <= UTF8PROC_CATEGORY_NO))
                return 0;
            break;
        case 'n':
            if (!cp_alnum(c))
                return 0;
            break;
        case 's':
            if (!ju_isspace(c))
                return 0;
            break;
        case 'u':
        case 'l':
            if (cp_cased(c)) {
                int up = cp_lower(c) != c, lo = cp_upper(c) != c;
                if ((cls == 'u' && lo) || (cls == 'l' && up))
                    return 0;
                cased = 1;
            }
            break;
        }
    }
    return cls == 'u' || cls == 'l' ? cased : 1;
}

#define STR_CLASS_METHOD(fname, cls)                                                          \
    static int fname(jrender_t *r, const jnode_t *at, jval_t self, const jargs_t *args,       \
                     jval_t *out)                                                             \
    {                                                                                         \
        NO_ARGS(#fname);                                                                      \
        *out = jv_bool(str_class(self.u.s, cls));                                             \
        return 0;                                                                             \
    }
STR_CLASS_METHOD(m_isdigit, 'd')
STR_CLASS_METHOD(m_isalpha, 'a')
STR_CLASS_METHOD(m_isalnum, 'n')
STR_CLASS_METHOD(m_isspace, 's')
STR_CLASS_METHOD(m_isupper, 'u')
STR_CLASS_METHOD(m_islower, 'l')

/* str.format: {} {0} {name} fields (format specs after ':' are ignored), {{ and }}. */
static int m_format(jrender_t *r, const jnode_t *at, jval_t self, const jargs_t *args, jval_t *out)
{
    const jstr_t *s = self.u.s;
    tb_t b = {.r = r, .at = at};
    size_t auto_idx = 0, i = 0;
    while (i < s->len && !b.err) {
        char c = s->s[i];
        if ((c == '{' || c == '}') && i + 1 < s->len && s->s[i + 1] == c) {
            tb_put(&b, &c, 1);
            i += 2;
            continue;
        }
        if (c == '}')
            return jr_fail(r, at, RIVER_EINVAL, "single '}' encountered in format string");
        if (c != '{') {
            tb_put(&b, &c, 1);
            i++;
            continue;
        }
        const char *e = memchr(s->s + i, '}', s->len - i);
        if (!e)
            return jr_fail(r, at, RIVER_EINVAL, "single '{' encountered in format string");
        size_t fb = i + 1, fe = (size_t)(e - s->s), ne = fb;
        while (ne < fe && s->s[ne] != ':' && s->s[ne] != '!')
            ne++;
        jval_t v;
        if (ne == fb) {
            if (auto_idx >= args->npos)
                return jr_fail(r, at, RIVER_EINVAL, "format: not enough positional arguments");
            v = args->pos[auto_idx++];
        } else if (s->s[fb] >= '0' && s->s[fb] <= '9') {
            size_t k = (size_t)strtoul(s->s + fb, NULL, 10);
            if (k >= args->npos)
                return jr_fail(r, at, RIVER_EINVAL, "format: index %zu out of range", k);
            v = args->pos[k];
        } else {
            size_t k = 0;
            while (k < args->nkw && (strlen(args->kwn[k]) != ne - fb ||
                                     memcmp(args->kwn[k], s->s + fb, ne - fb)))
                k++;
            if (k == args->nkw)
                return jr_fail(r, at, RIVER_EINVAL, "format: no argument '%.*s'", (int)(ne - fb),
                               s->s + fb);
            v = args->kwv[k];
        }
        jstr_t *t;
        int err = ne < fe && s->s[ne] == '!' && ne + 1 < fe && s->s[ne + 1] == 'r'
                      ? jr_repr(r, at, v, &t)
                      : text_of(r, at, v, &t);
        if (err)
            return err;
        tb_put(&b, t->s, t->len);
        i = fe + 1;
    }
    return tb_done(&b, out);
}

/* ---- dict, list and loop methods ---- */

static int m_items(jrender_t *r, const jnode_t *at, jval_t self, const jargs_t *args, jval_t *out)
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
        l->v[l->n++] = list_val(pair);
    }
    *out = list_val(l);
    return 0;
}

static int m_keys(jrender_t *r, const jnode_t *at, jval_t self, const jargs_t *args, jval_t *out)
{
    NO_ARGS("keys");
    jlist_t *l;
    int err = jr_iterate(r, at, self, &l);
    if (!err)
        *out = list_val(l);
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
    *out = list_val(l);
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
    if (GIVEN(a[0]) && (err = want_int(r, at, a[0], "pop", &i)))
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
    if ((err = want_int(r, at, a[0], "insert", &i)) || (err = jr_count(r, at, 1)) ||
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

/* ---- Filters ---- */

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

static int f_attr(jrender_t *r, const jnode_t *at, jval_t v, const jargs_t *args, jval_t *out)
{
    BIND("attr", "name");
    jstr_t *n;
    int err = want_str(r, at, a[0], "attr", &n);
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
    int err = text_of(r, at, v, &s);
    return err ? err : py_capitalize(r, at, s, out);
}

static int f_center(jrender_t *r, const jnode_t *at, jval_t v, const jargs_t *args, jval_t *out)
{
    BIND("center", "width");
    jstr_t *s;
    int64_t w = 80;
    int err;
    if ((err = text_of(r, at, v, &s)) || (GIVEN(a[0]) && (err = want_int(r, at, a[0], "center", &w))))
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
        tb_put(&b, " ", 1);
    tb_put(&b, s->s, s->len);
    for (int64_t i = 0; i < pad - left; i++)
        tb_put(&b, " ", 1);
    return tb_done(&b, out);
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

static int f_escape(jrender_t *r, const jnode_t *at, jval_t v, const jargs_t *args, jval_t *out)
{
    NO_ARGS("escape");
    jstr_t *s;
    int err = text_of(r, at, v, &s);
    if (err)
        return err;
    tb_t b = {.r = r, .at = at};
    for (size_t i = 0; i < s->len; i++) {
        switch (s->s[i]) {
        case '&': tb_put(&b, "&amp;", 5); break;
        case '<': tb_put(&b, "&lt;", 4); break;
        case '>': tb_put(&b, "&gt;", 4); break;
        case '"': tb_put(&b, "&#34;", 5); break;
        case '\'': tb_put(&b, "&#39;", 5); break;
        default: tb_put(&b, s->s + i, 1);
        }
    }
    return tb_done(&b, out);
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

/* Python's float() of a string: optional spaces, a decimal literal, inf or nan. */
static int parse_float(const jstr_t *s, double *out)
{
    char buf[128];
    size_t b = 0, e = s->len;
    while (b < e && ju_isspace((unsigned char)s->s[b]))
        b++;
    while (e > b && ju_isspace((unsigned char)s->s[e - 1]))
        e--;
    if (e == b || e - b >= sizeof buf)
        return -1;
    size_t o = 0;
    for (size_t i = b; i < e; i++) {
        char c = s->s[i];
        if (c == '_')
            continue;
        if (c == 'x' || c == 'X' || c == 'p' || c == 'P')
            return -1;
        buf[o++] = c;
    }
    buf[o] = 0;
    char *end;
    *out = strtod(buf, &end);
    return *end ? -1 : 0;
}

static int parse_int(const jstr_t *s, int base, int64_t *out)
{
    char buf[128];
    size_t b = 0, e = s->len, o = 0;
    while (b < e && ju_isspace((unsigned char)s->s[b]))
        b++;
    while (e > b && ju_isspace((unsigned char)s->s[e - 1]))
        e--;
    if (e == b || e - b >= sizeof buf)
        return -1;
    for (size_t i = b; i < e; i++)
        if (s->s[i] != '_')
            buf[o++] = s->s[i];
    buf[o] = 0;
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
    if (GIVEN(a[1]) && (err = want_int(r, at, a[1], "int", &base)))
        return err;
    if (base < 2 || base > 36)
        return jr_fail(r, at, RIVER_EINVAL, "int: base must be in 2..36");
    jval_t dflt = GIVEN(a[0]) ? a[0] : jv_int(0);
    switch (v.t) {
    case JV_INT: *out = v; return 0;
    case JV_BOOL: *out = jv_int(v.u.b); return 0;
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
    default: *out = dflt; return 0;
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

/* printf-style formatting of Python's str % args (the format filter). */
static int f_format(jrender_t *r, const jnode_t *at, jval_t v, const jargs_t *args, jval_t *out)
{
    jstr_t *s;
    int err = text_of(r, at, v, &s);
    if (err)
        return err;
    tb_t b = {.r = r, .at = at};
    size_t ai = 0;
    for (size_t i = 0; i < s->len && !b.err; i++) {
        char c = s->s[i];
        if (c != '%') {
            tb_put(&b, &c, 1);
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
            tb_put(&b, "%", 1);
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
            if ((err = conv == 's' ? text_of(r, at, arg, &t) : jr_repr(r, at, arg, &t)))
                return err;
            if (o == 1) {
                tb_put(&b, t->s, t->len);
            } else {
                spec[o++] = 's';
                spec[o] = 0;
                /* Width and precision count code points; this counts bytes (ASCII alike). */
                char *tmp = jr_alloc(r, at, t->len + 600);
                if (!tmp)
                    return RIVER_ENOMEM;
                int n = snprintf(tmp, t->len + 600, spec, t->s);
                tb_put(&b, tmp, n > 0 ? (size_t)n < t->len + 600 ? (size_t)n : t->len + 599 : 0);
            }
        } else if (strchr("diouxXc", conv)) {
            int64_t iv;
            if (arg.t == JV_FLOAT && conv != 'c')
                iv = (int64_t)arg.u.f;
            else if ((err = want_int(r, at, arg, "format", &iv)))
                return err;
            if (conv == 'c') {
                tb_cp(&b, (int32_t)(iv & 0x1FFFFF) > 0x10FFFF ? 0xFFFD : (int32_t)iv);
                continue;
            }
            spec[o++] = 'l';
            spec[o++] = 'l';
            spec[o++] = conv == 'i' || conv == 'u' ? 'd' : conv;
            spec[o] = 0;
            int n = snprintf(buf, sizeof buf, spec, (long long)iv);
            tb_put(&b, buf, n > 0 ? (size_t)n < sizeof buf ? (size_t)n : sizeof buf - 1 : 0);
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
            tb_put(&b, buf, n > 0 ? (size_t)n < sizeof buf ? (size_t)n : sizeof buf - 1 : 0);
        } else {
            return jr_fail(r, at, RIVER_EINVAL, "format: unsupported format character '%c'",
                           conv >= 0x20 && conv < 0x7f ? conv : '?');
        }
    }
    return tb_done(&b, out);
}

static int f_indent(jrender_t *r, const jnode_t *at, jval_t v, const jargs_t *args, jval_t *out)
{
    BIND("indent", "width", "first", "blank");
    jstr_t *s, *ind;
    int err;
    if ((err = text_of(r, at, v, &s)))
        return err;
    jval_t width = GIVEN(a[0]) ? a[0] : jv_int(4);
    if (width.t == JV_STR) {
        ind = width.u.s;
    } else {
        int64_t w;
        if ((err = want_int(r, at, width, "indent", &w)))
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
    tb_put(&t, s->s, s->len);
    tb_put(&t, "\n", 1);
    if (t.err)
        return t.err;
    jlist_t *lines;
    if ((err = py_splitlines(r, at, t.p, t.n, &lines)))
        return err;
    tb_t b = {.r = r, .at = at};
    if (first)
        tb_put(&b, ind->s, ind->len);
    for (size_t i = 0; i < lines->n && !b.err; i++) {
        const jstr_t *ln = lines->v[i].u.s;
        if (i) {
            tb_put(&b, "\n", 1);
            if (blank || ln->len)
                tb_put(&b, ind->s, ind->len);
        }
        tb_put(&b, ln->s, ln->len);
    }
    return tb_done(&b, out);
}

static int f_items(jrender_t *r, const jnode_t *at, jval_t v, const jargs_t *args, jval_t *out)
{
    NO_ARGS("items");
    if (v.t == JV_UNDEF) {
        jlist_t *l = jr_list_new(r, at, 0);
        if (!l)
            return RIVER_ENOMEM;
        *out = list_val(l);
        return 0;
    }
    if (v.t != JV_DICT)
        return jr_fail(r, at, RIVER_EINVAL, "Can only get item pairs from a mapping.");
    return m_items(r, at, v, args, out);
}

/* A dotted attribute path ("a.b", "0.name") as Jinja2's make_attrgetter walks it. */
static int get_path(jrender_t *r, const jnode_t *at, jval_t v, const jstr_t *path, jval_t *out)
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
    if (GIVEN(a[0]) && (err = text_of(r, at, a[0], &sep)))
        return err;
    if (GIVEN(a[1]) && a[1].t != JV_NONE && (err = want_str(r, at, a[1], "join", &attr)))
        return err;
    tb_t b = {.r = r, .at = at};
    for (size_t i = 0; i < items->n && !b.err; i++) {
        jval_t it = items->v[i];
        jstr_t *s;
        if (attr && (err = get_path(r, at, it, attr, &it)))
            return err;
        if ((err = text_of(r, at, it, &s)))
            return err;
        if (i && sep)
            tb_put(&b, sep->s, sep->len);
        tb_put(&b, s->s, s->len);
    }
    return tb_done(&b, out);
}

static int f_length(jrender_t *r, const jnode_t *at, jval_t v, const jargs_t *args, jval_t *out)
{
    NO_ARGS("length");
    switch (v.t) {
    case JV_UNDEF: *out = jv_int(0); return 0;
    case JV_STR:
        *out = jv_int((int64_t)(v.u.s->ascii ? v.u.s->len : ju_len(v.u.s->s, v.u.s->len)));
        return 0;
    case JV_LIST: *out = jv_int((int64_t)v.u.l->n); return 0;
    case JV_DICT: *out = jv_int((int64_t)v.u.d->n); return 0;
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
    *out = list_val(c);
    return 0;
}

static int f_lower(jrender_t *r, const jnode_t *at, jval_t v, const jargs_t *args, jval_t *out)
{
    NO_ARGS("lower");
    jstr_t *s;
    int err = text_of(r, at, v, &s);
    return err ? err : map_str(r, at, s, cp_lower, out);
}

static int f_upper(jrender_t *r, const jnode_t *at, jval_t v, const jargs_t *args, jval_t *out)
{
    NO_ARGS("upper");
    jstr_t *s;
    int err = text_of(r, at, v, &s);
    return err ? err : map_str(r, at, s, cp_upper, out);
}

/* Jinja2's title filter: words start after runs of "-", whitespace and "({[<". */
static int f_title(jrender_t *r, const jnode_t *at, jval_t v, const jargs_t *args, jval_t *out)
{
    NO_ARGS("title");
    jstr_t *s;
    int err = text_of(r, at, v, &s);
    if (err)
        return err;
    tb_t b = {.r = r, .at = at};
    size_t i = 0, adv;
    int start = 1;
    while (i < s->len && !b.err) {
        int32_t c = ju_decode(s->s + i, s->len - i, &adv);
        int sep = c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || ju_isspace(c);
        if (sep) {
            tb_put(&b, s->s + i, adv);
            start = 1;
        } else {
            tb_cp(&b, start ? cp_upper(c) : cp_lower(c));
            start = 0;
        }
        i += adv;
    }
    return tb_done(&b, out);
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
            if ((err = get_path(r, at, items->v[i], attr, &x)))
                return err;
            if (x.t == JV_UNDEF && dflt)
                x = *dflt;
        } else {
            jargs_t fa = {.npos = args->npos - 1, .pos = args->pos + 1, .nkw = args->nkw,
                          .kwn = args->kwn, .kwv = args->kwv};
            if ((err = jr_apply_named(r, at, 0, args->pos[0].u.s->s, items->v[i], &fa, &x)))
                return err;
        }
        res->v[res->n++] = x;
    }
    *out = list_val(res);
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
    jargs_t ta = {.npos = args->npos - p, .pos = args->pos + p, .nkw = args->nkw,
                  .kwn = args->kwn, .kwv = args->kwv};
    for (size_t i = 0; i < items->n; i++) {
        jval_t x = items->v[i], res_v;
        if (path && (err = get_path(r, at, x, path, &x)))
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
    *out = list_val(res);
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
    if ((err = text_of(r, at, v, &s)) || (err = text_of(r, at, a[0], &o)) ||
        (err = text_of(r, at, a[1], &n)))
        return err;
    if (GIVEN(a[2]) && a[2].t != JV_NONE && (err = want_int(r, at, a[2], "replace", &count)))
        return err;
    return py_replace(r, at, s, o, n, count, out);
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
            tb_put(&b, l->v[i].u.s->s, l->v[i].u.s->len);
        return tb_done(&b, out);
    }
    jlist_t *c = jr_list_new(r, at, l->n);
    if (!c)
        return RIVER_ENOMEM;
    for (size_t i = 0; i < l->n; i++)
        c->v[i] = l->v[l->n - 1 - i];
    c->n = l->n;
    *out = list_val(c);
    return 0;
}

static int f_round(jrender_t *r, const jnode_t *at, jval_t v, const jargs_t *args, jval_t *out)
{
    BIND("round", "precision", "method");
    int64_t prec = 0;
    int err;
    if (GIVEN(a[0]) && (err = want_int(r, at, a[0], "round", &prec)))
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

static int f_safe(jrender_t *r, const jnode_t *at, jval_t v, const jargs_t *args, jval_t *out)
{
    NO_ARGS("safe");
    *out = v;
    return 0;
}

static int f_string(jrender_t *r, const jnode_t *at, jval_t v, const jargs_t *args, jval_t *out)
{
    NO_ARGS("string");
    jstr_t *s;
    int err = text_of(r, at, v, &s);
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
    if (attr && (err = get_path(r, at, v, attr, &v)))
        return err;
    if (!cs && v.t == JV_STR)
        return map_str(r, at, v.u.s, cp_lower, out);
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
    if (GIVEN(a[2]) && a[2].t != JV_NONE && (err = text_of(r, at, a[2], &attr)))
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
    *out = list_val(res);
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
    int err = m_items(r, at, v, &none, &pairs);
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
    *out = list_val(res);
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
    if (GIVEN(a[1]) && a[1].t != JV_NONE && (err = text_of(r, at, a[1], &attr)))
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

static int f_sum(jrender_t *r, const jnode_t *at, jval_t v, const jargs_t *args, jval_t *out)
{
    BIND("sum", "attribute", "start");
    jlist_t *items;
    jstr_t *attr = NULL;
    int err;
    if ((err = jr_iterate(r, at, v, &items)))
        return err;
    if (GIVEN(a[0]) && a[0].t != JV_NONE && (err = text_of(r, at, a[0], &attr)))
        return err;
    int64_t si = 0;
    double sf = 0;
    int fl = 0;
    if (GIVEN(a[1])) {
        if (a[1].t == JV_FLOAT) {
            fl = 1;
            sf = a[1].u.f;
        } else if ((err = want_int(r, at, a[1], "sum", &si))) {
            return err;
        }
    }
    for (size_t i = 0; i < items->n; i++) {
        jval_t x = items->v[i];
        if (attr && (err = get_path(r, at, x, attr, &x)))
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

/* Adds the \u escapes of ensure_ascii=True to a JSON text. */
static int json_ascii(jrender_t *r, const jnode_t *at, const jstr_t *s, jval_t *out)
{
    if (s->ascii) {
        *out = jv_str((jstr_t *)s);
        return 0;
    }
    tb_t b = {.r = r, .at = at};
    size_t i = 0, adv;
    while (i < s->len && !b.err) {
        int32_t c = ju_decode(s->s + i, s->len - i, &adv);
        char esc[16];
        if (c < 0x80) {
            tb_put(&b, s->s + i, 1);
        } else if (c < 0x10000) {
            snprintf(esc, sizeof esc, "\\u%04x", (unsigned)c);
            tb_put(&b, esc, 6);
        } else {
            unsigned v = (unsigned)c - 0x10000;
            snprintf(esc, sizeof esc, "\\u%04x\\u%04x", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
            tb_put(&b, esc, 12);
        }
        i += adv;
    }
    return tb_done(&b, out);
}

static int f_tojson(jrender_t *r, const jnode_t *at, jval_t v, const jargs_t *args, jval_t *out)
{
    BIND("tojson", "ensure_ascii", "indent", "separators", "sort_keys");
    const char *ind = "", *item_sep = ", ", *key_sep = ": ";
    size_t ind_len = 0;
    int use_indent = 0, err;
    char spaces[256];
    if (GIVEN(a[1]) && a[1].t != JV_NONE) {
        use_indent = 1;
        item_sep = ",";
        if (a[1].t == JV_STR) {
            ind = a[1].u.s->s;
            ind_len = a[1].u.s->len;
        } else {
            int64_t w;
            if ((err = want_int(r, at, a[1], "tojson indent", &w)))
                return err;
            if (w > (int64_t)sizeof spaces)
                return jr_fail(r, at, RIVER_EFULL, "tojson indent too large");
            ind_len = w > 0 ? (size_t)w : 0;
            memset(spaces, ' ', ind_len);
            ind = spaces;
        }
    }
    if (GIVEN(a[2]) && a[2].t != JV_NONE) {
        if (a[2].t != JV_LIST || a[2].u.l->n != 2 || a[2].u.l->v[0].t != JV_STR ||
            a[2].u.l->v[1].t != JV_STR)
            return jr_fail(r, at, RIVER_EINVAL, "tojson: separators must be two strings");
        item_sep = a[2].u.l->v[0].u.s->s;
        key_sep = a[2].u.l->v[1].u.s->s;
    }
    jstr_t *s;
    if ((err = jr_tojson(r, at, v, ind, ind_len, use_indent, item_sep, key_sep,
                         GIVEN(a[3]) && jv_truthy(a[3]), &s)))
        return err;
    if (GIVEN(a[0]) && jv_truthy(a[0]))
        return json_ascii(r, at, s, out);
    *out = jv_str(s);
    return 0;
}

static int f_trim(jrender_t *r, const jnode_t *at, jval_t v, const jargs_t *args, jval_t *out)
{
    BIND("trim", "chars");
    jstr_t *s, *chars = NULL;
    int err;
    if ((err = text_of(r, at, v, &s)))
        return err;
    if (GIVEN(a[0]) && a[0].t != JV_NONE && (err = want_str(r, at, a[0], "trim", &chars)))
        return err;
    return py_strip(r, at, s, chars, 3, out);
}

static int f_truncate(jrender_t *r, const jnode_t *at, jval_t v, const jargs_t *args, jval_t *out)
{
    BIND("truncate", "length", "killwords", "end", "leeway");
    jstr_t *s, *end = NULL;
    int64_t length = 255, leeway = 5;
    int err;
    if ((err = text_of(r, at, v, &s)) ||
        (GIVEN(a[0]) && (err = want_int(r, at, a[0], "truncate", &length))) ||
        (GIVEN(a[2]) && (err = text_of(r, at, a[2], &end))) ||
        (GIVEN(a[3]) && (err = want_int(r, at, a[3], "truncate", &leeway))))
        return err;
    if (!end && !(end = jr_str_new(r, at, "...", 3)))
        return RIVER_ENOMEM;
    size_t n = ju_len(s->s, s->len), el = ju_len(end->s, end->len);
    if ((int64_t)n <= length + leeway) {
        *out = jv_str(s);
        return 0;
    }
    int64_t keep = length - (int64_t)el;
    if (keep < 0)
        keep = 0;
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
    tb_put(&b, s->s, off);
    tb_put(&b, end->s, end->len);
    return tb_done(&b, out);
}

static int f_unique(jrender_t *r, const jnode_t *at, jval_t v, const jargs_t *args, jval_t *out)
{
    BIND("unique", "case_sensitive", "attribute");
    jlist_t *items, *res, *seen;
    jstr_t *attr = NULL;
    int err;
    if ((err = jr_iterate(r, at, v, &items)))
        return err;
    if (GIVEN(a[1]) && a[1].t != JV_NONE && (err = text_of(r, at, a[1], &attr)))
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
    *out = list_val(res);
    return 0;
}

static int f_wordcount(jrender_t *r, const jnode_t *at, jval_t v, const jargs_t *args, jval_t *out)
{
    NO_ARGS("wordcount");
    jstr_t *s;
    int err = text_of(r, at, v, &s);
    if (err)
        return err;
    int64_t words = 0;
    int in = 0;
    size_t i = 0, adv;
    while (i < s->len) {
        int32_t c = ju_decode(s->s + i, s->len - i, &adv);
        int w = cp_alnum(c) || c == '_';
        if (w && !in)
            words++;
        in = w;
        i += adv;
    }
    *out = jv_int(words);
    return 0;
}

/* ---- Tests ---- */

#define TEST_FN(fname, expr)                                                                  \
    static int fname(jrender_t *r, const jnode_t *at, jval_t v, const jargs_t *args,          \
                     jval_t *out)                                                             \
    {                                                                                         \
        NO_ARGS(#fname);                                                                      \
        *out = jv_bool(expr);                                                                 \
        return 0;                                                                             \
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
TEST_FN(t_iterable, v.t == JV_STR || v.t == JV_LIST || v.t == JV_DICT || v.t == JV_UNDEF ||
                        v.t == JV_LOOP)
TEST_FN(t_sequence, v.t == JV_STR || v.t == JV_LIST || v.t == JV_DICT || v.t == JV_UNDEF)
TEST_FN(t_callable, v.t == JV_FUNC || v.t == JV_UNDEF)
TEST_FN(t_escaped, 0)
TEST_FN(t_lower, v.t == JV_STR && str_class(v.u.s, 'l'))
TEST_FN(t_upper, v.t == JV_STR && str_class(v.u.s, 'u'))

static int t_odd_even(jrender_t *r, const jnode_t *at, jval_t v, const jargs_t *args, int odd,
                      jval_t *out)
{
    NO_ARGS(odd ? "odd" : "even");
    int64_t i;
    int err = want_int(r, at, v, odd ? "odd" : "even", &i);
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

static int t_divisibleby(jrender_t *r, const jnode_t *at, jval_t v, const jargs_t *args, jval_t *out)
{
    BIND("divisibleby", "num");
    int64_t x, y;
    int err;
    if ((err = want_int(r, at, v, "divisibleby", &x)) ||
        (err = want_int(r, at, a[0], "divisibleby", &y)))
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
        case JV_BOOL: same = v.u.b == o.u.b; break;
        case JV_INT: same = v.u.i == o.u.i; break;
        case JV_FLOAT: same = 0; break;
        case JV_STR: same = v.u.s == o.u.s; break;
        case JV_LIST: same = v.u.l == o.u.l; break;
        case JV_DICT:
        case JV_NS: same = v.u.d == o.u.d; break;
        case JV_FUNC: same = v.u.fn == o.u.fn; break;
        case JV_LOOP: same = v.u.loop == o.u.loop; break;
        default: break;
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
    int err = text_of(r, at, a[0], &s);
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
    if ((err = want_str(r, at, a[0], "strftime_now", &fmt)) || (err = jr_now(r, at, &tm)))
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
    *out = dict_val(d);
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
        if ((err = want_int(r, at, a[i], "range", &v[n == 1 ? 1 : i])))
            return err;
    if (v[2] == 0)
        return jr_fail(r, at, RIVER_EINVAL, "range() arg 3 must not be zero");
    /* The element count, without overflow. */
    uint64_t count = 0;
    if (v[2] > 0 && v[1] > v[0])
        count = ((uint64_t)v[1] - (uint64_t)v[0] - 1) / (uint64_t)v[2] + 1;
    else if (v[2] < 0 && v[1] < v[0])
        count = ((uint64_t)v[0] - (uint64_t)v[1] - 1) / (uint64_t)(-(v[2] + 1) + 1) + 1;
    if (count > JINJA_MAX_ITERS)
        return jr_fail(r, at, RIVER_EFULL, "range of %llu items is over the loop bound",
                       (unsigned long long)count);
    if ((err = jr_count(r, at, (size_t)count)))
        return err;
    jlist_t *l = jr_list_new(r, at, (size_t)count);
    if (!l)
        return RIVER_ENOMEM;
    for (uint64_t i = 0; i < count; i++)
        l->v[l->n++] = jv_int(v[0] + (int64_t)i * v[2]);
    *out = list_val(l);
    return 0;
}

/* ---- Tables ---- */

static const jbuiltin_t filters[] = {
    {"abs", f_abs, JV_ABSENT},
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
    {"float", f_float, JV_ABSENT},
    {"forceescape", f_escape, JV_ABSENT},
    {"format", f_format, JV_ABSENT},
    {"indent", f_indent, JV_ABSENT},
    {"int", f_int, JV_ABSENT},
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
    {"round", f_round, JV_ABSENT},
    {"safe", f_safe, JV_ABSENT},
    {"select", f_select, JV_ABSENT},
    {"selectattr", f_selectattr, JV_ABSENT},
    {"sort", f_sort, JV_ABSENT},
    {"string", f_string, JV_ABSENT},
    {"sum", f_sum, JV_ABSENT},
    {"title", f_title, JV_ABSENT},
    {"tojson", f_tojson, JV_ABSENT},
    {"trim", f_trim, JV_ABSENT},
    {"truncate", f_truncate, JV_ABSENT},
    {"unique", f_unique, JV_ABSENT},
    {"upper", f_upper, JV_ABSENT},
    {"wordcount", f_wordcount, JV_ABSENT},
};

static const jbuiltin_t tests[] = {
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

static const jbuiltin_t methods[] = {
    {"strip", m_strip, JV_STR},
    {"lstrip", m_lstrip, JV_STR},
    {"rstrip", m_rstrip, JV_STR},
    {"split", m_split, JV_STR},
    {"rsplit", m_rsplit, JV_STR},
    {"splitlines", m_splitlines, JV_STR},
    {"startswith", m_startswith, JV_STR},
    {"endswith", m_endswith, JV_STR},
    {"upper", m_upper, JV_STR},
    {"lower", m_lower, JV_STR},
    {"title", m_title, JV_STR},
    {"capitalize", m_capitalize, JV_STR},
    {"replace", m_replace, JV_STR},
    {"find", m_find, JV_STR},
    {"rfind", m_rfind, JV_STR},
    {"index", m_sindex, JV_STR},
    {"count", m_scount, JV_STR},
    {"join", m_sjoin, JV_STR},
    {"format", m_format, JV_STR},
    {"isdigit", m_isdigit, JV_STR},
    {"isalpha", m_isalpha, JV_STR},
    {"isalnum", m_isalnum, JV_STR},
    {"isspace", m_isspace, JV_STR},
    {"isupper", m_isupper, JV_STR},
    {"islower", m_islower, JV_STR},
    {"items", m_items, JV_DICT},
    {"keys", m_keys, JV_DICT},
    {"values", m_values, JV_DICT},
    {"get", m_get, JV_DICT},
    {"append", m_append, JV_LIST},
    {"extend", m_extend, JV_LIST},
    {"pop", m_pop, JV_LIST},
    {"insert", m_insert, JV_LIST},
    {"index", m_lindex, JV_LIST},
    {"count", m_lcount, JV_LIST},
    {"cycle", m_cycle, JV_LOOP},
};

static const jbuiltin_t globals[] = {
    {"raise_exception", g_raise_exception, JV_ABSENT},
    {"strftime_now", g_strftime_now, JV_ABSENT},
    {"namespace", g_namespace, JV_ABSENT},
    {"dict", g_dict, JV_ABSENT},
    {"range", g_range, JV_ABSENT},
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
    return find(filters, N_OF(filters), JV_ABSENT, name);
}

const jbuiltin_t *jinja_test_find(const char *name)
{
    return find(tests, N_OF(tests), JV_ABSENT, name);
}

const jbuiltin_t *jinja_method_find(jv_type_t t, const char *name)
{
    return find(methods, N_OF(methods), t, name);
}

const jbuiltin_t *jinja_global_find(const char *name)
{
    return find(globals, N_OF(globals), JV_ABSENT, name);
}
