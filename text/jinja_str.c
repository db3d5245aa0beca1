/* Chat-template builtins: the Python string methods templates call (strip, split, replace,
 * startswith, find, format, the is* classes, ...), each as its Python counterpart, and the
 * case mapping and splitting helpers the string filters share with them. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <utf8proc.h>

#include "common/err.h"
#include "text/jinja_builtins.h"

/* ---- Case mapping and classes ---- */

int32_t jinja__cp_upper(int32_t c)
{
    return c < 0x80 ? (c >= 'a' && c <= 'z' ? c - 32 : c) : utf8proc_toupper(c);
}

int32_t jinja__cp_lower(int32_t c)
{
    return c < 0x80 ? (c >= 'A' && c <= 'Z' ? c + 32 : c) : utf8proc_tolower(c);
}

static int32_t cp_title(int32_t c)
{
    return c < 0x80 ? jinja__cp_upper(c) : utf8proc_totitle(c);
}

static int cp_cased(int32_t c)
{
    if (c < 0x80)
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
    return utf8proc_toupper(c) != c || utf8proc_tolower(c) != c || utf8proc_totitle(c) != c;
}

int jinja__cp_alnum(int32_t c)
{
    if (c < 0x80)
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
    int cat = utf8proc_category(c);
    return (cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO) ||
           (cat >= UTF8PROC_CATEGORY_ND && cat <= UTF8PROC_CATEGORY_NO);
}

int jinja__map_str(jrender_t *r, const jnode_t *at, const jstr_t *s, cpmap_t f, jval_t *out)
{
    tb_t b = {.r = r, .at = at};
    size_t i = 0, adv;
    while (i < s->len && !b.err) {
        int32_t c = ju_decode(s->s + i, s->len - i, &adv);
        if (adv == 1 && (unsigned char)s->s[i] >= 0x80)
            jinja__tb_put(&b, s->s + i, 1);
        else
            jinja__tb_cp(&b, f(c));
        i += adv;
    }
    return jinja__tb_done(&b, out);
}

/* Python's str.title(): upper after an uncased character, lower after a cased one. */
static int py_title(jrender_t *r, const jnode_t *at, const jstr_t *s, jval_t *out)
{
    tb_t b = {.r = r, .at = at};
    size_t i = 0, adv;
    int prev_cased = 0;
    while (i < s->len && !b.err) {
        int32_t c = ju_decode(s->s + i, s->len - i, &adv);
        jinja__tb_cp(&b, prev_cased ? jinja__cp_lower(c) : cp_title(c));
        prev_cased = cp_cased(c);
        i += adv;
    }
    return jinja__tb_done(&b, out);
}

/* Python's str.capitalize(): the first character title case, the rest lower. */
int jinja__py_capitalize(jrender_t *r, const jnode_t *at, const jstr_t *s, jval_t *out)
{
    tb_t b = {.r = r, .at = at};
    size_t i = 0, adv;
    while (i < s->len && !b.err) {
        int32_t c = ju_decode(s->s + i, s->len - i, &adv);
        jinja__tb_cp(&b, i == 0 ? cp_title(c) : jinja__cp_lower(c));
        i += adv;
    }
    return jinja__tb_done(&b, out);
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
int jinja__py_strip(jrender_t *r, const jnode_t *at, const jstr_t *s, const jstr_t *chars,
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

static int strip_args(jrender_t *r, const jnode_t *at, jval_t self, const jargs_t *args, int which,
                      jval_t *out)
{
    BIND("strip", "chars");
    jstr_t *chars = NULL;
    int err;
    if (GIVEN(a[0]) && a[0].t != JV_NONE && (err = jinja__want_str(r, at, a[0], "strip", &chars)))
        return err;
    return jinja__py_strip(r, at, self.u.s, chars, which, out);
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
            if ((err = jr_count(r, at, 1)) ||
                (err = push_str(r, at, l, s->s + k + sep->len, e - k - sep->len)))
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
    *out = jinja__list_val(l);
    return 0;
}

static int split_common(jrender_t *r, const jnode_t *at, jval_t self, const jargs_t *args, int rev,
                        jval_t *out)
{
    BIND("split", "sep", "maxsplit");
    jstr_t *sep = NULL;
    int64_t maxsplit = -1;
    int err;
    if (GIVEN(a[0]) && a[0].t != JV_NONE && (err = jinja__want_str(r, at, a[0], "split", &sep)))
        return err;
    if (GIVEN(a[1]) && (err = jinja__want_int(r, at, a[1], "split", &maxsplit)))
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

int jinja__py_splitlines(jrender_t *r, const jnode_t *at, const char *s, size_t n, jlist_t **out)
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
    int err = jinja__py_splitlines(r, at, self.u.s->s, self.u.s->len, &l);
    if (!err)
        *out = jinja__list_val(l);
    return err;
}

int jinja__py_replace(jrender_t *r, const jnode_t *at, const jstr_t *s, const jstr_t *old,
                      const jstr_t *new_, int64_t count, jval_t *out)
{
    tb_t b = {.r = r, .at = at};
    int err;
    if (old->len == 0) {
        /* Python inserts new between characters (and at both ends). */
        size_t i = 0, adv;
        if (count != 0) {
            jinja__tb_put(&b, new_->s, new_->len);
            if (count > 0)
                count--;
        }
        while (i < s->len && !b.err) {
            ju_decode(s->s + i, s->len - i, &adv);
            jinja__tb_put(&b, s->s + i, adv);
            i += adv;
            if (count != 0 && (err = jr_count(r, at, 1)) == 0) {
                jinja__tb_put(&b, new_->s, new_->len);
                if (count > 0)
                    count--;
            } else if (count != 0) {
                return err;
            }
        }
        return jinja__tb_done(&b, out);
    }
    size_t p = 0;
    while (count != 0 && !b.err) {
        const char *h = memmem(s->s + p, s->len - p, old->s, old->len);
        if (!h)
            break;
        jinja__tb_put(&b, s->s + p, (size_t)(h - s->s) - p);
        jinja__tb_put(&b, new_->s, new_->len);
        p = (size_t)(h - s->s) + old->len;
        if (count > 0)
            count--;
    }
    jinja__tb_put(&b, s->s + p, s->len - p);
    return jinja__tb_done(&b, out);
}

static int m_replace(jrender_t *r, const jnode_t *at, jval_t self, const jargs_t *args, jval_t *out)
{
    BIND("replace", "old", "new", "count");
    jstr_t *o, *n;
    int64_t count = -1;
    int err;
    /* Markup.replace escapes new (any value: escape() takes one), not old (markupsafe 3;
     * 2.x escaped both). */
    if ((err = jinja__want_str(r, at, a[0], "replace", &o)) ||
        (err = self.u.s->markup ? jr_escape_value(r, at, a[1], &n)
                                : jinja__want_str(r, at, a[1], "replace", &n)))
        return err;
    if (GIVEN(a[2]) && (err = jinja__want_int(r, at, a[2], "replace", &count)))
        return err;
    return jinja__py_replace(r, at, self.u.s, o, n, count, out);
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
        int err = jinja__want_str(r, at, cands[i], end ? "endswith" : "startswith", &p);
        if (err)
            return err;
        if (p->len <= s->len && !memcmp(end ? s->s + s->len - p->len : s->s, p->s, p->len)) {
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
    return jinja__map_str(r, at, self.u.s, jinja__cp_upper, out);
}

static int m_lower(jrender_t *r, const jnode_t *at, jval_t self, const jargs_t *args, jval_t *out)
{
    NO_ARGS("lower");
    return jinja__map_str(r, at, self.u.s, jinja__cp_lower, out);
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
    return jinja__py_capitalize(r, at, self.u.s, out);
}

/* find / rfind / index / count of a substring, in code points. */
static int substr_op(jrender_t *r, const jnode_t *at, jval_t self, const jargs_t *args, int op,
                     jval_t *out)
{
    BIND("find", "sub", "start", "end");
    jstr_t *sub;
    int err = jinja__want_str(r, at, a[0], "find", &sub);
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
        /* Markup.join escapes its items, and escape() takes any value (1, None). */
        if (self.u.s->markup) {
            if ((err = jr_escape_value(r, at, items->v[i], &s)))
                return err;
        } else if (items->v[i].t != JV_STR) {
            return jr_fail(r, at, RIVER_EINVAL,
                           "sequence item %zu: expected str instance, %s found", i,
                           jv_type_name(items->v[i]));
        } else {
            s = items->v[i].u.s;
        }
        if (i)
            jinja__tb_put(&b, self.u.s->s, self.u.s->len);
        jinja__tb_put(&b, s->s, s->len);
    }
    return jinja__tb_done(&b, out);
}

/* str.isdigit and friends: 'd' digits, 'a' letters, 'n' alphanumerics, 's' space, 'u' upper,
 * 'l' lower. */
int jinja__str_class(const jstr_t *s, int cls)
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
            if (!jinja__cp_alnum(c) || (c < 0x80 && c >= '0' && c <= '9') ||
                (c >= 0x80 && utf8proc_category(c) >= UTF8PROC_CATEGORY_ND &&
                 utf8proc_category(c) <= UTF8PROC_CATEGORY_NO))
                return 0;
            break;
        case 'n':
            if (!jinja__cp_alnum(c))
                return 0;
            break;
        case 's':
            if (!ju_isspace(c))
                return 0;
            break;
        case 'u':
        case 'l':
            if (cp_cased(c)) {
                int up = jinja__cp_lower(c) != c, lo = jinja__cp_upper(c) != c;
                if ((cls == 'u' && lo) || (cls == 'l' && up))
                    return 0;
                cased = 1;
            }
            break;
        }
    }
    return cls == 'u' || cls == 'l' ? cased : 1;
}

#define STR_CLASS_METHOD(fname, cls)                                                               \
    static int fname(jrender_t *r, const jnode_t *at, jval_t self, const jargs_t *args,            \
                     jval_t *out)                                                                  \
    {                                                                                              \
        NO_ARGS(#fname);                                                                           \
        *out = jv_bool(jinja__str_class(self.u.s, cls));                                           \
        return 0;                                                                                  \
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
            jinja__tb_put(&b, &c, 1);
            i += 2;
            continue;
        }
        if (c == '}')
            return jr_fail(r, at, RIVER_EINVAL, "single '}' encountered in format string");
        if (c != '{') {
            jinja__tb_put(&b, &c, 1);
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
            while (k < args->nkw &&
                   (strlen(args->kwn[k]) != ne - fb || memcmp(args->kwn[k], s->s + fb, ne - fb)))
                k++;
            if (k == args->nkw)
                return jr_fail(r, at, RIVER_EINVAL, "format: no argument '%.*s'", (int)(ne - fb),
                               s->s + fb);
            v = args->kwv[k];
        }
        jstr_t *t;
        int err = ne < fe && s->s[ne] == '!' && ne + 1 < fe && s->s[ne + 1] == 'r'
                      ? jr_repr(r, at, v, &t)
                      : jinja__text_of(r, at, v, &t);
        /* Markup.format escapes each field's text, a Markup's excepted (markupsafe's
         * EscapeFormatter); the receiver's own text stays as it is. */
        if (!err && s->markup)
            err = jr_escape(r, at, t, &t);
        if (err)
            return err;
        jinja__tb_put(&b, t->s, t->len);
        i = fe + 1;
    }
    return jinja__tb_done(&b, out);
}

/* ---- Table ---- */

const jbuiltin_t jinja__str_methods[] = {
    {"strip", m_strip, JV_STR},           {"lstrip", m_lstrip, JV_STR},
    {"rstrip", m_rstrip, JV_STR},         {"split", m_split, JV_STR},
    {"rsplit", m_rsplit, JV_STR},         {"splitlines", m_splitlines, JV_STR},
    {"startswith", m_startswith, JV_STR}, {"endswith", m_endswith, JV_STR},
    {"upper", m_upper, JV_STR},           {"lower", m_lower, JV_STR},
    {"title", m_title, JV_STR},           {"capitalize", m_capitalize, JV_STR},
    {"replace", m_replace, JV_STR},       {"find", m_find, JV_STR},
    {"rfind", m_rfind, JV_STR},           {"index", m_sindex, JV_STR},
    {"count", m_scount, JV_STR},          {"join", m_sjoin, JV_STR},
    {"format", m_format, JV_STR},         {"isdigit", m_isdigit, JV_STR},
    {"isalpha", m_isalpha, JV_STR},       {"isalnum", m_isalnum, JV_STR},
    {"isspace", m_isspace, JV_STR},       {"isupper", m_isupper, JV_STR},
    {"islower", m_islower, JV_STR},
};
const size_t jinja__n_str_methods = sizeof jinja__str_methods / sizeof jinja__str_methods[0];
