/* The tojson filter: transformers' override of Jinja2's, Python's json.dumps with
 * ensure_ascii=False unless asked, and indent, separators and sort_keys as json.dumps takes
 * them. The serialisation itself is jr_tojson (jinja_value.c, over the value printer's text
 * builder); this file binds the arguments and adds the ensure_ascii escapes. */
#include <stdio.h>
#include <string.h>

#include "common/err.h"
#include "text/jinja_builtins.h"

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
            jinja__tb_put(&b, s->s + i, 1);
        } else if (c < 0x10000) {
            snprintf(esc, sizeof esc, "\\u%04x", (unsigned)c);
            jinja__tb_put(&b, esc, 6);
        } else {
            unsigned v = (unsigned)c - 0x10000;
            snprintf(esc, sizeof esc, "\\u%04x\\u%04x", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
            jinja__tb_put(&b, esc, 12);
        }
        i += adv;
    }
    return jinja__tb_done(&b, out);
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
            if ((err = jinja__want_int(r, at, a[1], "tojson indent", &w)))
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

const jbuiltin_t jinja__json_filters[] = {
    {"tojson", f_tojson, JV_ABSENT},
};
const size_t jinja__n_json_filters = sizeof jinja__json_filters / sizeof jinja__json_filters[0];
