/* Patterns and splitting for the Hugging Face tokenizer: String and Regex patterns of
 * tokenizer.json (PCRE2 in UTF + UCP mode), replacing and splitting by them with the
 * library's delimiter behaviours (pattern.rs / normalizer.rs), the Unicode character classes
 * of Rust's regex, the piece lists that carry text through the pipeline, and the scratch
 * space of one call. */
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "common/err.h"
#include "text/hf_internal.h"

void hf_pat_free(hf_pat_t *p)
{
    free(p->lit);
    if (p->re)
        pcre2_code_free(p->re);
    p->lit = NULL;
    p->re = NULL;
}

int hf_re_compile(const tokenizer_t *t, const char *what, const char *src, size_t len,
                  pcre2_code **out)
{
    int ec;
    PCRE2_SIZE eo;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)src, len, PCRE2_UTF | PCRE2_UCP, &ec, &eo, NULL);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(ec, msg, sizeof msg);
        return river_err_set(RIVER_EFORMAT, "%s: %s regex does not compile at offset %zu: %s",
                             t->path, what, (size_t)eo, (const char *)msg);
    }
    /* Without JIT support matching still works, through the interpreter. */
    (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
    *out = re;
    return 0;
}

int hf_pat_parse(const tokenizer_t *t, const json_t *o, const char *what, hf_pat_t *p)
{
    json_t *pat = json_object_get(o, "pattern");
    size_t n;
    const char *s;
    if ((s = hf_jstr(pat, "String", &n))) {
        p->lit = hf_dupn(s, n);
        if (!p->lit)
            return river_err_set(RIVER_ENOMEM, "%s: no memory", t->path);
        p->lit_len = n;
        return 0;
    }
    if ((s = hf_jstr(pat, "Regex", &n)))
        return hf_re_compile(t, what, s, n, &p->re);
    return river_err_set(RIVER_EFORMAT, "%s: %s has no String or Regex pattern", t->path, what);
}

int hf_pat_find(const tokenizer_t *t, const hf_pat_t *p, const char *s, size_t len, size_t start,
                pcre2_match_data *md, size_t *ms, size_t *me)
{
    if (!p->re) {
        if (p->lit_len == 0 || start >= len)
            return 0;
        const char *f = memmem(s + start, len - start, p->lit, p->lit_len);
        if (!f)
            return 0;
        *ms = (size_t)(f - s);
        *me = *ms + p->lit_len;
        return 1;
    }
    int rc = pcre2_match(p->re, (PCRE2_SPTR)s, len, start, PCRE2_NO_UTF_CHECK, md, NULL);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
        rc = pcre2_match(p->re, (PCRE2_SPTR)s, len, start, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md,
                         NULL);
    if (rc == PCRE2_ERROR_NOMATCH)
        return 0;
    if (rc < 0) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(rc, msg, sizeof msg);
        return river_err_set(RIVER_ETOKENIZER, "%s: regex matching failed: %s", t->path,
                             (const char *)msg);
    }
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
    if (ov[0] > ov[1] || ov[1] > len)
        return river_err_set(RIVER_ETOKENIZER, "%s: regex reported an impossible match", t->path);
    *ms = ov[0];
    *me = ov[1];
    return 1;
}

/* Unicode White_Space, as Rust's char::is_whitespace and regex \s. */
int hf_is_white(int32_t c)
{
    return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
           c == 0x205F || c == 0x3000;
}

/* Rust regex \w: alphabetic, marks, decimal digits, connector punctuation, join controls. */
int hf_is_word(int32_t c)
{
    if (c == 0x200C || c == 0x200D)
        return 1;
    switch (utf8proc_category(c)) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_PC:
        return 1;
    default:
        return 0;
    }
}

int32_t hf_cp_before(const char *s, size_t end)
{
    if (end == 0)
        return -1;
    size_t b = end - 1;
    while (b > 0 && ((unsigned char)s[b] & 0xC0) == 0x80)
        b--;
    size_t p = b;
    return text_utf8_next(s, end, &p);
}

int32_t hf_cp_at(const char *s, size_t len, size_t at)
{
    if (at >= len)
        return -1;
    size_t p = at;
    return text_utf8_next(s, len, &p);
}

int hf_pieces_add(pieces_t *ps, const char *s, size_t len, int32_t id, int origin)
{
    /* The library drops empty splits. */
    if (len == 0 && id < 0)
        return 0;
    if (ps->n == ps->cap) {
        size_t cap = ps->cap ? ps->cap * 2 : 32;
        piece_t *p = realloc(ps->p, cap * sizeof *p);
        if (!p)
            return RIVER_ENOMEM;
        ps->p = p;
        ps->cap = cap;
    }
    size_t off = ps->text.len;
    if (tok_buf_put(&ps->text, s, len))
        return RIVER_ENOMEM;
    ps->p[ps->n++] = (piece_t){off, len, id, origin};
    return 0;
}

void hf_pieces_reset(pieces_t *ps)
{
    ps->text.len = 0;
    ps->n = 0;
}

void hf_pieces_free(pieces_t *ps)
{
    tok_buf_free(&ps->text);
    free(ps->p);
    memset(ps, 0, sizeof *ps);
}

static int spans_push(spans_t *v, size_t s, size_t e, int m)
{
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 32;
        span_t *p = realloc(v->p, cap * sizeof *p);
        if (!p)
            return RIVER_ENOMEM;
        v->p = p;
        v->cap = cap;
    }
    v->p[v->n++] = (span_t){s, e, m};
    return 0;
}

int hf_work_init(hf_work_t *w)
{
    memset(w, 0, sizeof *w);
    w->md = pcre2_match_data_create(8, NULL);
    return w->md ? 0 : RIVER_ENOMEM;
}

void hf_work_free(hf_work_t *w)
{
    if (w->md)
        pcre2_match_data_free(w->md);
    tok_buf_free(&w->n1);
    tok_buf_free(&w->n2);
    tok_buf_free(&w->tmp);
    tok_buf_free(&w->key);
    free(w->sp.p);
    free(w->sp2.p);
    hf_pieces_free(&w->sub);
    free(w->sym);
    free(w->heap);
}

/* ---- replacing and splitting ---------------------------------------------------------- */

int hf_replace_all(const tokenizer_t *t, const hf_pat_t *pat, const char *s, size_t len,
                   const char *with, size_t with_len, tok_buf_t *out, pcre2_match_data *md)
{
    size_t start = 0, copied = 0;
    while (start <= len) {
        size_t ms, me;
        int r = hf_pat_find(t, pat, s, len, start, md, &ms, &me);
        if (r < 0)
            return r;
        if (r == 0)
            break;
        if (tok_buf_put(out, s + copied, ms - copied) || tok_buf_put(out, with, with_len))
            return RIVER_ENOMEM;
        copied = me;
        if (me > ms) {
            start = me;
        } else {
            if (me >= len)
                break;
            start = me;
            (void)text_utf8_next(s, len, &start);
            if (tok_buf_put(out, s + me, start - me))
                return RIVER_ENOMEM;
            copied = start;
        }
    }
    return tok_buf_put(out, s + copied, len - copied);
}

int hf_split(const tokenizer_t *t, const hf_pat_t *pat, int behavior, int invert, const char *s,
             size_t len, int origin, pieces_t *out, hf_work_t *w)
{
    spans_t *sp = &w->sp, *res = &w->sp2;
    sp->n = res->n = 0;
    if (len == 0)
        return 0;
    size_t prev = 0, start = 0;
    for (;;) {
        size_t ms, me;
        int r = hf_pat_find(t, pat, s, len, start, w->md, &ms, &me);
        if (r < 0)
            return r;
        if (r == 0)
            break;
        if (prev != ms && spans_push(sp, prev, ms, 0))
            return RIVER_ENOMEM;
        if (spans_push(sp, ms, me, 1))
            return RIVER_ENOMEM;
        prev = me;
        if (me > ms) {
            start = me;
        } else {
            /* An empty match: search again one character further on. */
            if (me >= len)
                break;
            start = me;
            (void)text_utf8_next(s, len, &start);
        }
        if (start >= len)
            break;
    }
    if (prev != len && spans_push(sp, prev, len, 0))
        return RIVER_ENOMEM;
    if (invert)
        for (size_t i = 0; i < sp->n; i++)
            sp->p[i].m = !sp->p[i].m;

    /* In res, m marks a span to drop. */
    int pm = 0;
    switch (behavior) {
    case BEH_ISOLATED:
        for (size_t i = 0; i < sp->n; i++)
            if (spans_push(res, sp->p[i].s, sp->p[i].e, 0))
                return RIVER_ENOMEM;
        break;
    case BEH_REMOVED:
        for (size_t i = 0; i < sp->n; i++)
            if (spans_push(res, sp->p[i].s, sp->p[i].e, sp->p[i].m))
                return RIVER_ENOMEM;
        break;
    case BEH_CONTIGUOUS:
        for (size_t i = 0; i < sp->n; i++) {
            if (sp->p[i].m == pm && res->n)
                res->p[res->n - 1].e = sp->p[i].e;
            else if (spans_push(res, sp->p[i].s, sp->p[i].e, 0))
                return RIVER_ENOMEM;
            pm = sp->p[i].m;
        }
        break;
    case BEH_MERGED_PREV:
        for (size_t i = 0; i < sp->n; i++) {
            if (sp->p[i].m && !pm && res->n)
                res->p[res->n - 1].e = sp->p[i].e;
            else if (spans_push(res, sp->p[i].s, sp->p[i].e, 0))
                return RIVER_ENOMEM;
            pm = sp->p[i].m;
        }
        break;
    case BEH_MERGED_NEXT:
        for (size_t i = sp->n; i-- > 0;) {
            if (sp->p[i].m && !pm && res->n)
                res->p[res->n - 1].s = sp->p[i].s;
            else if (spans_push(res, sp->p[i].s, sp->p[i].e, 0))
                return RIVER_ENOMEM;
            pm = sp->p[i].m;
        }
        for (size_t i = 0; i < res->n / 2; i++) {
            span_t x = res->p[i];
            res->p[i] = res->p[res->n - 1 - i];
            res->p[res->n - 1 - i] = x;
        }
        break;
    }
    for (size_t i = 0; i < res->n; i++) {
        span_t r = res->p[i];
        if (!r.m && r.e > r.s && hf_pieces_add(out, s + r.s, r.e - r.s, -1, origin && r.s == 0))
            return RIVER_ENOMEM;
    }
    return 0;
}
