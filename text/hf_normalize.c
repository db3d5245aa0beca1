/* Normalizers of a Hugging Face tokenizer.json: a table of the supported types, each with
 * the function that reads its options and the one that applies it to a text, and the runner
 * of a normalizer chain (a Sequence is flattened into the chain at load time). */
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "common/err.h"
#include "text/hf_internal.h"

typedef int (*norm_parse_fn)(tokenizer_t *t, const json_t *o, hf_norm_t *n);
/* Writes the normalized s to out (emptied first). */
typedef int (*norm_apply_fn)(const tokenizer_t *t, const hf_norm_t *n, const char *s, size_t len,
                             tok_buf_t *out, pcre2_match_data *md);

struct hf_norm_kind {
    const char *name;
    norm_parse_fn parse; /* NULL: no options */
    norm_apply_fn apply;
    int utf8proc_opt; /* the Unicode normalization forms: utf8proc_map's options */
};

/* ---- applying --------------------------------------------------------------------------- */

static int norm_unicode(const tokenizer_t *t, const hf_norm_t *n, const char *s, size_t len,
                        tok_buf_t *out, pcre2_match_data *md)
{
    (void)md;
    if (len == 0)
        return tok_buf_put(out, "", 0);
    utf8proc_uint8_t *dst = NULL;
    utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)len, &dst,
                                      (utf8proc_option_t)n->kind->utf8proc_opt);
    if (r < 0) {
        free(dst);
        return river_err_set(r == UTF8PROC_ERROR_NOMEM ? RIVER_ENOMEM : RIVER_ETOKENIZER,
                             "%s: Unicode normalization failed: %s", t->path, utf8proc_errmsg(r));
    }
    int err = tok_buf_put(out, dst, (size_t)r);
    free(dst);
    return err;
}

static int norm_lower(const tokenizer_t *t, const hf_norm_t *n, const char *s, size_t len,
                      tok_buf_t *out, pcre2_match_data *md)
{
    (void)t, (void)n, (void)md;
    for (size_t i = 0; i < len;) {
        int32_t c = text_utf8_next(s, len, &i);
        char u[4];
        if (tok_buf_put(out, u, text_utf8_encode((uint32_t)utf8proc_tolower(c), u)))
            return RIVER_ENOMEM;
    }
    return 0;
}

static int norm_prepend(const tokenizer_t *t, const hf_norm_t *n, const char *s, size_t len,
                        tok_buf_t *out, pcre2_match_data *md)
{
    (void)t, (void)md;
    if (len == 0)
        return 0;
    if (tok_buf_put(out, n->text, n->text_len))
        return RIVER_ENOMEM;
    return tok_buf_put(out, s, len);
}

static int norm_replace(const tokenizer_t *t, const hf_norm_t *n, const char *s, size_t len,
                        tok_buf_t *out, pcre2_match_data *md)
{
    return hf_replace_all(t, &n->pat, s, len, n->text, n->text_len, out, md);
}

static int norm_strip(const tokenizer_t *t, const hf_norm_t *n, const char *s, size_t len,
                      tok_buf_t *out, pcre2_match_data *md)
{
    (void)t, (void)md;
    size_t a = 0, b = len;
    while (n->left && a < b) {
        size_t p = a;
        if (!hf_is_white(text_utf8_next(s, len, &p)))
            break;
        a = p;
    }
    while (n->right && b > a) {
        size_t q = b - 1;
        while (q > a && ((unsigned char)s[q] & 0xC0) == 0x80)
            q--;
        if (!hf_is_white(hf_cp_at(s, len, q)))
            break;
        b = q;
    }
    return tok_buf_put(out, s + a, b - a);
}

/* ---- reading ---------------------------------------------------------------------------- */

static int norm_parse_text(tokenizer_t *t, const char *s, size_t len, hf_norm_t *n)
{
    if (!(n->text = hf_dupn(s, len)))
        return river_err_set(RIVER_ENOMEM, "%s: no memory", t->path);
    n->text_len = len;
    return 0;
}

static int norm_parse_prepend(tokenizer_t *t, const json_t *o, hf_norm_t *n)
{
    size_t len;
    const char *s = hf_jstr(o, "prepend", &len);
    if (!s)
        return river_err_set(RIVER_EFORMAT, "%s: Prepend normalizer without text", t->path);
    return norm_parse_text(t, s, len, n);
}

static int norm_parse_replace(tokenizer_t *t, const json_t *o, hf_norm_t *n)
{
    int err = hf_pat_parse(t, o, "Replace normalizer", &n->pat);
    if (err)
        return err;
    size_t len;
    const char *s = hf_jstr(o, "content", &len);
    if (!s)
        return river_err_set(RIVER_EFORMAT, "%s: Replace normalizer without content", t->path);
    return norm_parse_text(t, s, len, n);
}

static int norm_parse_strip(tokenizer_t *t, const json_t *o, hf_norm_t *n)
{
    (void)t;
    n->left = hf_jbool(o, "strip_left", 1);
    n->right = hf_jbool(o, "strip_right", 1);
    return 0;
}

static const hf_norm_kind_t norm_kinds[] = {
    {"NFC", NULL, norm_unicode, UTF8PROC_STABLE | UTF8PROC_COMPOSE},
    {"NFD", NULL, norm_unicode, UTF8PROC_STABLE | UTF8PROC_DECOMPOSE},
    {"NFKC", NULL, norm_unicode, UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT},
    {"NFKD", NULL, norm_unicode, UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT},
    {"Lowercase", NULL, norm_lower, 0},
    {"Prepend", norm_parse_prepend, norm_prepend, 0},
    {"Replace", norm_parse_replace, norm_replace, 0},
    {"Strip", norm_parse_strip, norm_strip, 0},
};

int hf_parse_norm(tokenizer_t *t, const json_t *o, int depth)
{
    hf_tok_t *h = t->hf;
    if (!o || json_is_null(o))
        return 0;
    const void *kind;
    hf_kinds_t kinds = {norm_kinds, sizeof norm_kinds / sizeof norm_kinds[0], sizeof norm_kinds[0]};
    int head = hf_parse_step(t, o, depth, "normalizer", "normalizers", hf_parse_norm, kinds, &kind);
    if (head)
        return head < 0 ? head : 0;
    hf_norm_t *n = hf_step_new((void **)&h->norm, &h->n_norm, sizeof *n);
    if (!n)
        return river_err_set(RIVER_ENOMEM, "%s: no memory", t->path);
    n->kind = kind;
    return n->kind->parse ? n->kind->parse(t, o, n) : 0;
}

int hf_normalize(const tokenizer_t *t, const char *s, size_t len, hf_work_t *w, const char **res,
                 size_t *res_len)
{
    const hf_tok_t *h = t->hf;
    const char *cur = s;
    size_t cur_len = len;
    tok_buf_t *dst = &w->n1;
    for (size_t i = 0; i < h->n_norm; i++) {
        const hf_norm_t *n = &h->norm[i];
        dst->len = 0;
        int err = n->kind->apply(t, n, cur, cur_len, dst, w->md);
        if (err)
            return err == RIVER_ENOMEM ? river_err_set(err, "%s: no memory", t->path) : err;
        if (tok_buf_reserve(dst, 0))
            return river_err_set(RIVER_ENOMEM, "%s: no memory", t->path);
        cur = dst->p;
        cur_len = dst->len;
        dst = dst == &w->n1 ? &w->n2 : &w->n1;
    }
    *res = cur;
    *res_len = cur_len;
    return 0;
}
