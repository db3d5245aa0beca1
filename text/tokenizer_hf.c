/* Hugging Face tokenizer.json with a BPE model, following the `tokenizers` library (0.22):
 *
 *   encode: added tokens matched in the raw text (leftmost-longest), normalizer on the rest,
 *           added tokens marked `normalized` matched in the normalized text, pre-tokenizer,
 *           BPE per pre-token, post-processor when add_special is set;
 *   decode: ids to token strings (added tokens by their content), special ones dropped when
 *           skipping, then the decoder chain.
 *
 * Normalizer, pre-tokenizer and decoder sequences are flattened into lists of steps at load
 * time. BPE merging runs a min-heap of (rank, position) candidates over a linked list of
 * symbols, as the library does, so a word of n characters costs O(n log n). */
#define PCRE2_CODE_UNIT_WIDTH 8

#include <jansson.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <utf8proc.h>

#include "common/err.h"
#include "common/file.h"
#include "text/tokenizer_internal.h"

/* ---- model structures ------------------------------------------------------------------- */

/* A String pattern (literal, matched with memmem) or a Regex pattern (PCRE2, UTF + UCP). */
typedef struct hf_pat {
    char *lit;
    size_t lit_len;
    pcre2_code *re;
} hf_pat_t;

enum {
    NORM_NFC,
    NORM_NFD,
    NORM_NFKC,
    NORM_NFKD,
    NORM_LOWER,
    NORM_PREPEND,
    NORM_REPLACE,
    NORM_STRIP
};

typedef struct hf_norm {
    int type;
    hf_pat_t pat; /* Replace */
    char *text;   /* Prepend text, Replace content */
    size_t text_len;
    int left, right; /* Strip */
} hf_norm_t;

enum { PRE_SPLIT, PRE_BYTELEVEL, PRE_METASPACE };
enum { BEH_REMOVED, BEH_ISOLATED, BEH_MERGED_PREV, BEH_MERGED_NEXT, BEH_CONTIGUOUS };
enum { PREPEND_NEVER, PREPEND_FIRST, PREPEND_ALWAYS };

typedef struct hf_pre {
    int type;
    hf_pat_t pat; /* Split pattern; ByteLevel's regex (re NULL: none); Metaspace's character */
    int behavior, invert;
    int add_prefix_space; /* ByteLevel */
    char repl[4];         /* Metaspace replacement character, UTF-8 */
    size_t repl_len;
    int prepend, split;
} hf_pre_t;

enum { DEC_REPLACE, DEC_BYTEFALLBACK, DEC_FUSE, DEC_STRIP, DEC_BYTELEVEL, DEC_METASPACE };

typedef struct hf_dec {
    int type;
    hf_pat_t pat; /* Replace */
    char *text;   /* Replace content */
    size_t text_len;
    char ch[4]; /* Strip content, Metaspace replacement */
    size_t ch_len;
    int start, stop; /* Strip */
    int prepend;     /* Metaspace */
} hf_dec_t;

typedef struct hf_added {
    char *content;
    size_t len;
    int32_t id;
    int single_word, lstrip, rstrip, normalized, special;
} hf_added_t;

/* Leftmost-longest matching over a set of strings: candidates grouped by first byte, longest
 * first, so the first candidate that matches at a position is the longest there. */
typedef struct hf_matcher {
    size_t n;
    char **pat;
    size_t *len;
    size_t *tok; /* index into hf_tok.added */
    uint32_t first[257];
} hf_matcher_t;

typedef struct hf_bpe {
    tok_map_t vocab;
    uint64_t *mkeys; /* (left << 32 | right) → (rank << 32 | merged id) */
    uint64_t *mvals;
    size_t mmask, mcount;
    int has_unk;
    char *unk;
    int32_t unk_id; /* -1 when unk_token is not in the vocabulary */
    int fuse_unk, byte_fallback, ignore_merges;
    char *prefix, *suffix;
    size_t prefix_len, suffix_len;
    int32_t byte_id[256]; /* id of "<0xNN>", -1 when absent */
} hf_bpe_t;

enum { FLAG_SPECIAL = 1, FLAG_ADDED = 2, FLAG_BYTE = 4, FLAG_VALID = 8 };

struct hf_tok {
    hf_bpe_t bpe;
    hf_norm_t *norm;
    size_t n_norm;
    hf_pre_t *pre;
    size_t n_pre;
    hf_dec_t *dec;
    size_t n_dec;
    int has_decoder; /* a decoder is declared (a null one joins tokens with spaces) */
    int dec_bytefallback;

    hf_added_t *added;
    size_t n_added;
    hf_matcher_t raw, normd;

    int32_t *tmpl; /* post-processor: ids, -1 = the sequence, -2 = end of one template */
    size_t n_tmpl;
    int32_t tmpl_bos, tmpl_eos;

    tok_buf_t strs; /* decoding strings of all ids */
    size_t *str_off;
    uint32_t *str_len;
    uint8_t *flags;

    char bl_enc[256][2]; /* ByteLevel: byte → character (UTF-8, 1 or 2 bytes) */
    uint8_t bl_enc_len[256];
    int16_t bl_dec[324]; /* code point → byte, -1 for others */
};

/* ---- small helpers ---------------------------------------------------------------------- */

static char *dupn(const char *s, size_t n)
{
    char *p = malloc(n + 1);
    if (p) {
        memcpy(p, s, n);
        p[n] = '\0';
    }
    return p;
}

static const char *jstr(const json_t *o, const char *key, size_t *len)
{
    json_t *v = json_object_get(o, key);
    if (!json_is_string(v))
        return NULL;
    if (len)
        *len = json_string_length(v);
    return json_string_value(v);
}

static int jbool(const json_t *o, const char *key, int def)
{
    json_t *v = json_object_get(o, key);
    if (json_is_boolean(v))
        return json_is_true(v);
    return def;
}

/* Integers may come as JSON integers or, from files written by other tools, as integral
 * reals. */
static int jint(const json_t *v, int64_t *out)
{
    if (json_is_integer(v)) {
        *out = json_integer_value(v);
        return 1;
    }
    if (json_is_real(v)) {
        double d = json_real_value(v);
        if (d >= -9.0e18 && d <= 9.0e18 && (double)(int64_t)d == d) {
            *out = (int64_t)d;
            return 1;
        }
    }
    return 0;
}

static void pat_free(hf_pat_t *p)
{
    free(p->lit);
    if (p->re)
        pcre2_code_free(p->re);
    p->lit = NULL;
    p->re = NULL;
}

static int re_compile(const tokenizer_t *t, const char *what, const char *src, size_t len,
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

/* Reads {"String": "..."} or {"Regex": "..."}. */
static int pat_parse(const tokenizer_t *t, const json_t *o, const char *what, hf_pat_t *p)
{
    json_t *pat = json_object_get(o, "pattern");
    size_t n;
    const char *s;
    if ((s = jstr(pat, "String", &n))) {
        p->lit = dupn(s, n);
        if (!p->lit)
            return river_err_set(RIVER_ENOMEM, "%s: no memory", t->path);
        p->lit_len = n;
        return 0;
    }
    if ((s = jstr(pat, "Regex", &n)))
        return re_compile(t, what, s, n, &p->re);
    return river_err_set(RIVER_EFORMAT, "%s: %s has no String or Regex pattern", t->path, what);
}

/* Finds the first match at or after start. Returns 1 and its bounds, 0 when none, or an
 * error. */
static int pat_find(const tokenizer_t *t, const hf_pat_t *p, const char *s, size_t len,
                    size_t start, pcre2_match_data *md, size_t *ms, size_t *me)
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
static int is_white(int32_t c)
{
    return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
           c == 0x205F || c == 0x3000;
}

/* Rust regex \w: alphabetic, marks, decimal digits, connector punctuation, join controls. */
static int is_word(int32_t c)
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

/* The code point ending at s[end) (valid UTF-8), or -1 at the start. */
static int32_t cp_before(const char *s, size_t end)
{
    if (end == 0)
        return -1;
    size_t b = end - 1;
    while (b > 0 && ((unsigned char)s[b] & 0xC0) == 0x80)
        b--;
    size_t p = b;
    return tok_utf8_next(s, end, &p);
}

static int32_t cp_at(const char *s, size_t len, size_t at)
{
    if (at >= len)
        return -1;
    size_t p = at;
    return tok_utf8_next(s, len, &p);
}

/* ---- piece lists ------------------------------------------------------------------------ */

typedef struct piece {
    size_t off, len;
    int32_t id; /* >= 0: already an added token */
    int origin; /* starts at offset 0 of the original text */
} piece_t;

typedef struct pieces {
    tok_buf_t text;
    piece_t *p;
    size_t n, cap;
} pieces_t;

static int pieces_add(pieces_t *ps, const char *s, size_t len, int32_t id, int origin)
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

static void pieces_reset(pieces_t *ps)
{
    ps->text.len = 0;
    ps->n = 0;
}

static void pieces_free(pieces_t *ps)
{
    tok_buf_free(&ps->text);
    free(ps->p);
    memset(ps, 0, sizeof *ps);
}

typedef struct span {
    size_t s, e;
    int m;
} span_t;

typedef struct spans {
    span_t *p;
    size_t n, cap;
} spans_t;

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

typedef struct bpe_sym {
    int32_t id, prev, next;
    int alive;
} bpe_sym_t;

typedef struct bpe_cand {
    uint32_t rank, pos;
    int32_t merged;
} bpe_cand_t;

/* Scratch space of one encode or decode call; the tokenizer itself stays read-only so that
 * threads can share it. */
typedef struct hf_work {
    pcre2_match_data *md;
    tok_buf_t n1, n2, tmp, key;
    spans_t sp, sp2;
    bpe_sym_t *sym;
    size_t n_sym, cap_sym;
    bpe_cand_t *heap;
    size_t n_heap, cap_heap;
} hf_work_t;

static int work_init(hf_work_t *w)
{
    memset(w, 0, sizeof *w);
    w->md = pcre2_match_data_create(8, NULL);
    return w->md ? 0 : RIVER_ENOMEM;
}

static void work_free(hf_work_t *w)
{
    if (w->md)
        pcre2_match_data_free(w->md);
    tok_buf_free(&w->n1);
    tok_buf_free(&w->n2);
    tok_buf_free(&w->tmp);
    tok_buf_free(&w->key);
    free(w->sp.p);
    free(w->sp2.p);
    free(w->sym);
    free(w->heap);
}

/* ---- splitting (pattern.rs / normalizer.rs split semantics) ----------------------------- */

/* Splits s by the matches of pat with the given delimiter behaviour and adds the non-empty
 * parts to out. */
static int split_piece(const tokenizer_t *t, const hf_pat_t *pat, int behavior, int invert,
                       const char *s, size_t len, int origin, pieces_t *out, hf_work_t *w)
{
    spans_t *sp = &w->sp, *res = &w->sp2;
    sp->n = res->n = 0;
    if (len == 0)
        return 0;
    size_t prev = 0, start = 0;
    for (;;) {
        size_t ms, me;
        int r = pat_find(t, pat, s, len, start, w->md, &ms, &me);
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
            (void)tok_utf8_next(s, len, &start);
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
        if (!r.m && r.e > r.s && pieces_add(out, s + r.s, r.e - r.s, -1, origin && r.s == 0))
            return RIVER_ENOMEM;
    }
    return 0;
}

/* ---- added tokens ----------------------------------------------------------------------- */

static void matcher_free(hf_matcher_t *m)
{
    if (m->pat)
        for (size_t i = 0; i < m->n; i++)
            free(m->pat[i]);
    free(m->pat);
    free(m->len);
    free(m->tok);
    memset(m, 0, sizeof *m);
}

typedef struct mentry {
    char *pat;
    size_t len, tok, order;
} mentry_t;

static int mentry_cmp(const void *a, const void *b)
{
    const mentry_t *x = a, *y = b;
    unsigned char fx = (unsigned char)x->pat[0], fy = (unsigned char)y->pat[0];
    if (fx != fy)
        return fx < fy ? -1 : 1;
    if (x->len != y->len)
        return x->len > y->len ? -1 : 1;
    return x->order < y->order ? -1 : (x->order > y->order);
}

/* Splits s at the matches of m: matched added tokens become pieces with their id, as
 * AddedVocabulary::find_matches does (single_word, lstrip and rstrip included). */
static int added_split(const tokenizer_t *t, const hf_matcher_t *m, const char *s, size_t len,
                       int origin, pieces_t *out)
{
    const hf_tok_t *h = t->hf;
    size_t start_offset = 0, pos = 0;
    while (m->n && pos < len) {
        size_t ms = 0, me = 0, k = 0;
        int found = 0;
        for (size_t i = pos; i < len && !found; i++) {
            unsigned char b = (unsigned char)s[i];
            for (uint32_t j = m->first[b]; j < m->first[b + 1]; j++) {
                if (m->len[j] <= len - i && memcmp(s + i, m->pat[j], m->len[j]) == 0) {
                    ms = i;
                    me = i + m->len[j];
                    k = j;
                    found = 1;
                    break;
                }
            }
        }
        if (!found)
            break;
        /* Matching resumes after this match whether or not it is kept. */
        pos = me;
        const hf_added_t *a = &h->added[m->tok[k]];
        if (a->single_word) {
            int32_t before = cp_before(s, ms), after = cp_at(s, len, me);
            if ((before >= 0 && is_word(before)) || (after >= 0 && is_word(after)))
                continue;
        }
        size_t start = ms, stop = me;
        if (a->lstrip) {
            size_t ns = ms;
            while (ns > 0) {
                size_t b = ns - 1;
                while (b > 0 && ((unsigned char)s[b] & 0xC0) == 0x80)
                    b--;
                if (!is_white(cp_at(s, len, b)))
                    break;
                ns = b;
            }
            start = ns > start_offset ? ns : start_offset;
        }
        if (a->rstrip) {
            while (stop < len) {
                size_t p = stop;
                if (!is_white(tok_utf8_next(s, len, &p)))
                    break;
                stop = p;
            }
        }
        if (start < start_offset)
            continue;
        if (start_offset < start && pieces_add(out, s + start_offset, start - start_offset, -1,
                                               origin && start_offset == 0))
            return RIVER_ENOMEM;
        if (pieces_add(out, s + start, stop - start, a->id, origin && start == 0))
            return RIVER_ENOMEM;
        start_offset = stop;
        if (pos < stop)
            pos = stop;
    }
    if (start_offset < len &&
        pieces_add(out, s + start_offset, len - start_offset, -1, origin && start_offset == 0))
        return RIVER_ENOMEM;
    return 0;
}

/* ---- normalizers ------------------------------------------------------------------------ */

static int replace_all(const tokenizer_t *t, const hf_pat_t *pat, const char *s, size_t len,
                       const char *with, size_t with_len, tok_buf_t *out, pcre2_match_data *md)
{
    size_t start = 0, copied = 0;
    while (start <= len) {
        size_t ms, me;
        int r = pat_find(t, pat, s, len, start, md, &ms, &me);
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
            (void)tok_utf8_next(s, len, &start);
            if (tok_buf_put(out, s + me, start - me))
                return RIVER_ENOMEM;
            copied = start;
        }
    }
    return tok_buf_put(out, s + copied, len - copied);
}

static int norm_step(const tokenizer_t *t, const hf_norm_t *n, const char *s, size_t len,
                     tok_buf_t *out, pcre2_match_data *md)
{
    out->len = 0;
    switch (n->type) {
    case NORM_NFC:
    case NORM_NFD:
    case NORM_NFKC:
    case NORM_NFKD: {
        if (len == 0)
            return tok_buf_put(out, "", 0);
        int opt = UTF8PROC_STABLE;
        if (n->type == NORM_NFC || n->type == NORM_NFKC)
            opt |= UTF8PROC_COMPOSE;
        else
            opt |= UTF8PROC_DECOMPOSE;
        if (n->type == NORM_NFKC || n->type == NORM_NFKD)
            opt |= UTF8PROC_COMPAT;
        utf8proc_uint8_t *dst = NULL;
        utf8proc_ssize_t r =
            utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)len, &dst, opt);
        if (r < 0) {
            free(dst);
            return river_err_set(r == UTF8PROC_ERROR_NOMEM ? RIVER_ENOMEM : RIVER_ETOKENIZER,
                                 "%s: Unicode normalization failed: %s", t->path,
                                 utf8proc_errmsg(r));
        }
        int err = tok_buf_put(out, dst, (size_t)r);
        free(dst);
        return err;
    }
    case NORM_LOWER:
        for (size_t i = 0; i < len;) {
            int32_t c = tok_utf8_next(s, len, &i);
            char u[4];
            if (tok_buf_put(out, u, tok_utf8_encode((uint32_t)utf8proc_tolower(c), u)))
                return RIVER_ENOMEM;
        }
        return 0;
    case NORM_PREPEND:
        if (len == 0)
            return 0;
        if (tok_buf_put(out, n->text, n->text_len))
            return RIVER_ENOMEM;
        return tok_buf_put(out, s, len);
    case NORM_REPLACE:
        return replace_all(t, &n->pat, s, len, n->text, n->text_len, out, md);
    case NORM_STRIP: {
        size_t a = 0, b = len;
        while (n->left && a < b) {
            size_t p = a;
            if (!is_white(tok_utf8_next(s, len, &p)))
                break;
            a = p;
        }
        while (n->right && b > a) {
            size_t q = b - 1;
            while (q > a && ((unsigned char)s[q] & 0xC0) == 0x80)
                q--;
            if (!is_white(cp_at(s, len, q)))
                break;
            b = q;
        }
        return tok_buf_put(out, s + a, b - a);
    }
    }
    return 0;
}

/* Runs the normalizer steps; *res points at w->n1 or w->n2 or, with no steps, at s. */
static int normalize(const tokenizer_t *t, const char *s, size_t len, hf_work_t *w,
                     const char **res, size_t *res_len)
{
    const hf_tok_t *h = t->hf;
    const char *cur = s;
    size_t cur_len = len;
    tok_buf_t *dst = &w->n1;
    for (size_t i = 0; i < h->n_norm; i++) {
        int err = norm_step(t, &h->norm[i], cur, cur_len, dst, w->md);
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

/* ---- pre-tokenizers --------------------------------------------------------------------- */

static int bytelevel_map(const hf_tok_t *h, const char *s, size_t len, int origin, pieces_t *out,
                         tok_buf_t *tmp)
{
    tmp->len = 0;
    if (tok_buf_reserve(tmp, len * 2))
        return RIVER_ENOMEM;
    for (size_t i = 0; i < len; i++) {
        unsigned char b = (unsigned char)s[i];
        memcpy(tmp->p + tmp->len, h->bl_enc[b], h->bl_enc_len[b]);
        tmp->len += h->bl_enc_len[b];
    }
    return pieces_add(out, tmp->p, tmp->len, -1, origin);
}

static int pre_step(const tokenizer_t *t, const hf_pre_t *p, const pieces_t *in, pieces_t *out,
                    hf_work_t *w)
{
    const hf_tok_t *h = t->hf;
    pieces_t sub = {0};
    int err = 0;
    for (size_t i = 0; i < in->n && !err; i++) {
        const piece_t *pc = &in->p[i];
        const char *s = in->text.p + pc->off;
        if (pc->id >= 0) {
            err = pieces_add(out, s, pc->len, pc->id, pc->origin);
            continue;
        }
        switch (p->type) {
        case PRE_SPLIT:
            err = split_piece(t, &p->pat, p->behavior, p->invert, s, pc->len, pc->origin, out, w);
            break;
        case PRE_BYTELEVEL: {
            tok_buf_t *tmp = &w->key;
            tmp->len = 0;
            if (p->add_prefix_space && (pc->len == 0 || s[0] != ' '))
                err = tok_buf_putc(tmp, ' ');
            if (!err)
                err = tok_buf_put(tmp, s, pc->len);
            if (err)
                break;
            pieces_reset(&sub);
            if (p->pat.re)
                err =
                    split_piece(t, &p->pat, BEH_ISOLATED, 0, tmp->p, tmp->len, pc->origin, &sub, w);
            else
                err = pieces_add(&sub, tmp->p, tmp->len, -1, pc->origin);
            for (size_t k = 0; k < sub.n && !err; k++)
                err = bytelevel_map(h, sub.text.p + sub.p[k].off, sub.p[k].len, sub.p[k].origin,
                                    out, &w->tmp);
            break;
        }
        case PRE_METASPACE: {
            tok_buf_t *tmp = &w->key;
            tmp->len = 0;
            for (size_t k = 0; k < pc->len && !err; k++)
                err =
                    s[k] == ' ' ? tok_buf_put(tmp, p->repl, p->repl_len) : tok_buf_putc(tmp, s[k]);
            if (err)
                break;
            int starts = tmp->len >= p->repl_len && memcmp(tmp->p, p->repl, p->repl_len) == 0;
            if (!starts &&
                (p->prepend == PREPEND_ALWAYS || (p->prepend == PREPEND_FIRST && pc->origin))) {
                /* Prepending shifts the text: rebuild it in the scratch buffer. */
                w->tmp.len = 0;
                if (tok_buf_put(&w->tmp, p->repl, p->repl_len) ||
                    tok_buf_put(&w->tmp, tmp->p, tmp->len)) {
                    err = RIVER_ENOMEM;
                    break;
                }
                tmp->len = 0;
                if (tok_buf_put(tmp, w->tmp.p, w->tmp.len)) {
                    err = RIVER_ENOMEM;
                    break;
                }
            }
            if (p->split)
                err = split_piece(t, &p->pat, BEH_MERGED_NEXT, 0, tmp->p, tmp->len, pc->origin, out,
                                  w);
            else
                err = pieces_add(out, tmp->p, tmp->len, -1, pc->origin);
            break;
        }
        }
    }
    pieces_free(&sub);
    if (err == RIVER_ENOMEM)
        river_err_set(err, "%s: no memory while pre-tokenizing", t->path);
    return err;
}

/* ---- BPE -------------------------------------------------------------------------------- */

static uint64_t mix64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

#define MERGE_EMPTY UINT64_MAX

static int merge_get(const hf_bpe_t *b, int32_t l, int32_t r, uint32_t *rank, int32_t *merged)
{
    if (!b->mkeys)
        return 0;
    uint64_t key = (uint64_t)(uint32_t)l << 32 | (uint32_t)r;
    size_t i = mix64(key) & b->mmask;
    while (b->mkeys[i] != MERGE_EMPTY) {
        if (b->mkeys[i] == key) {
            *rank = (uint32_t)(b->mvals[i] >> 32);
            *merged = (int32_t)(uint32_t)b->mvals[i];
            return 1;
        }
        i = (i + 1) & b->mmask;
    }
    return 0;
}

static void merge_insert(uint64_t *keys, uint64_t *vals, size_t mask, uint64_t key, uint64_t val,
                         size_t *count)
{
    size_t i = mix64(key) & mask;
    while (keys[i] != MERGE_EMPTY && keys[i] != key)
        i = (i + 1) & mask;
    if (keys[i] == MERGE_EMPTY)
        (*count)++;
    keys[i] = key;
    vals[i] = val;
}

/* Later duplicates of a merge replace earlier ones, as the library's HashMap collect does. */
static int merge_put(hf_bpe_t *b, int32_t l, int32_t r, uint32_t rank, int32_t merged)
{
    if ((b->mcount + 1) * 2 > (b->mkeys ? b->mmask + 1 : 0)) {
        size_t slots = b->mkeys ? (b->mmask + 1) * 2 : 1024;
        uint64_t *k = malloc(slots * sizeof *k), *v = malloc(slots * sizeof *v);
        if (!k || !v) {
            free(k);
            free(v);
            return RIVER_ENOMEM;
        }
        memset(k, 0xFF, slots * sizeof *k);
        size_t count = 0;
        if (b->mkeys)
            for (size_t i = 0; i <= b->mmask; i++)
                if (b->mkeys[i] != MERGE_EMPTY)
                    merge_insert(k, v, slots - 1, b->mkeys[i], b->mvals[i], &count);
        free(b->mkeys);
        free(b->mvals);
        b->mkeys = k;
        b->mvals = v;
        b->mmask = slots - 1;
        b->mcount = count;
    }
    merge_insert(b->mkeys, b->mvals, b->mmask, (uint64_t)(uint32_t)l << 32 | (uint32_t)r,
                 (uint64_t)rank << 32 | (uint32_t)merged, &b->mcount);
    return 0;
}

static int cand_before(const bpe_cand_t *a, const bpe_cand_t *b)
{
    if (a->rank != b->rank)
        return a->rank < b->rank;
    return a->pos < b->pos;
}

static int heap_push(hf_work_t *w, bpe_cand_t c)
{
    if (w->n_heap == w->cap_heap) {
        size_t cap = w->cap_heap ? w->cap_heap * 2 : 64;
        bpe_cand_t *p = realloc(w->heap, cap * sizeof *p);
        if (!p)
            return RIVER_ENOMEM;
        w->heap = p;
        w->cap_heap = cap;
    }
    size_t i = w->n_heap++;
    while (i > 0) {
        size_t up = (i - 1) / 2;
        if (!cand_before(&c, &w->heap[up]))
            break;
        w->heap[i] = w->heap[up];
        i = up;
    }
    w->heap[i] = c;
    return 0;
}

static bpe_cand_t heap_pop(hf_work_t *w)
{
    bpe_cand_t top = w->heap[0];
    bpe_cand_t last = w->heap[--w->n_heap];
    size_t i = 0, n = w->n_heap;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && cand_before(&w->heap[c + 1], &w->heap[c]))
            c++;
        if (!cand_before(&w->heap[c], &last))
            break;
        w->heap[i] = w->heap[c];
        i = c;
    }
    if (n)
        w->heap[i] = last;
    return top;
}

static int sym_add(hf_work_t *w, int32_t id)
{
    if (w->n_sym == w->cap_sym) {
        size_t cap = w->cap_sym ? w->cap_sym * 2 : 64;
        if (cap > INT32_MAX)
            return RIVER_ENOMEM;
        bpe_sym_t *p = realloc(w->sym, cap * sizeof *p);
        if (!p)
            return RIVER_ENOMEM;
        w->sym = p;
        w->cap_sym = cap;
    }
    int32_t i = (int32_t)w->n_sym++;
    w->sym[i] = (bpe_sym_t){id, i - 1, -1, 1};
    if (i > 0)
        w->sym[i - 1].next = i;
    return 0;
}

/* BPE::tokenize for one pre-token (merge_word + merge_all). */
static int bpe_word(const tokenizer_t *t, const char *s, size_t len, tok_ids_t *out, hf_work_t *w)
{
    const hf_bpe_t *b = &t->hf->bpe;
    if (len == 0)
        return 0;
    if (b->ignore_merges) {
        int32_t id = tok_map_get(&b->vocab, s, len);
        if (id >= 0)
            return tok_ids_push(out, id) ? river_err_set(RIVER_ENOMEM, "%s: no memory", t->path)
                                         : 0;
    }
    w->n_sym = 0;
    int pending_unk = 0;
    tok_buf_t *key = &w->key;
    for (size_t i = 0; i < len;) {
        size_t j = i;
        (void)tok_utf8_next(s, len, &j);
        key->len = 0;
        if ((i > 0 && tok_buf_put(key, b->prefix, b->prefix_len)) ||
            tok_buf_put(key, s + i, j - i) ||
            (j == len && tok_buf_put(key, b->suffix, b->suffix_len)))
            goto nomem;
        i = j;
        int32_t id = tok_map_get(&b->vocab, key->p, key->len);
        if (id >= 0) {
            if (pending_unk && sym_add(w, b->unk_id))
                goto nomem;
            pending_unk = 0;
            if (sym_add(w, id))
                goto nomem;
            continue;
        }
        if (b->byte_fallback) {
            int all = 1;
            for (size_t k = 0; k < key->len && all; k++)
                all = b->byte_id[(unsigned char)key->p[k]] >= 0;
            if (all) {
                /* As in the library, a pending unknown is not flushed here. */
                for (size_t k = 0; k < key->len; k++)
                    if (sym_add(w, b->byte_id[(unsigned char)key->p[k]]))
                        goto nomem;
                continue;
            }
        }
        if (b->has_unk) {
            if (b->unk_id < 0)
                return river_err_set(RIVER_ETOKENIZER,
                                     "%s: unk_token \"%s\" is not in the vocabulary", t->path,
                                     b->unk);
            if (pending_unk && !b->fuse_unk && sym_add(w, b->unk_id))
                goto nomem;
            pending_unk = 1;
        }
    }
    if (pending_unk && sym_add(w, b->unk_id))
        goto nomem;
    if (w->n_sym == 0)
        return 0;

    bpe_sym_t *sym = w->sym;
    w->n_heap = 0;
    uint32_t rank;
    int32_t merged;
    for (size_t i = 0; i + 1 < w->n_sym; i++)
        if (merge_get(b, sym[i].id, sym[i + 1].id, &rank, &merged) &&
            heap_push(w, (bpe_cand_t){rank, (uint32_t)i, merged}))
            goto nomem;
    while (w->n_heap) {
        bpe_cand_t c = heap_pop(w);
        bpe_sym_t *a = &sym[c.pos];
        if (!a->alive || a->next < 0)
            continue;
        /* A candidate is stale when its pair no longer produces the same token. */
        int32_t nx = a->next;
        if (!merge_get(b, a->id, sym[nx].id, &rank, &merged) || merged != c.merged)
            continue;
        a->id = merged;
        sym[nx].alive = 0;
        a->next = sym[nx].next;
        if (a->next >= 0)
            sym[a->next].prev = (int32_t)c.pos;
        if (a->prev >= 0 && merge_get(b, sym[a->prev].id, a->id, &rank, &merged) &&
            heap_push(w, (bpe_cand_t){rank, (uint32_t)a->prev, merged}))
            goto nomem;
        if (a->next >= 0 && merge_get(b, a->id, sym[a->next].id, &rank, &merged) &&
            heap_push(w, (bpe_cand_t){rank, c.pos, merged}))
            goto nomem;
    }
    for (int32_t i = 0; i >= 0; i = sym[i].next)
        if (tok_ids_push(out, sym[i].id))
            goto nomem;
    return 0;

nomem:
    return river_err_set(RIVER_ENOMEM, "%s: no memory while encoding", t->path);
}

/* ---- encode ----------------------------------------------------------------------------- */

int tok_hf_encode(const tokenizer_t *t, const char *text, size_t len, int add_special,
                  tok_ids_t *out)
{
    const hf_tok_t *h = t->hf;
    if (!tok_utf8_valid(text, len))
        return river_err_set(RIVER_EINVAL, "%s: input text is not valid UTF-8", t->path);
    hf_work_t w;
    pieces_t a = {0}, b = {0};
    tok_ids_t ids = {0}, tmp = {0};
    int err = work_init(&w);
    if (err)
        goto nomem;

    /* Added tokens in the raw text, then the normalizer and the normalized added tokens on
     * the rest. */
    if ((err = added_split(t, &h->raw, text, len, 1, &a)))
        goto nomem;
    for (size_t i = 0; i < a.n; i++) {
        const piece_t *pc = &a.p[i];
        if (pc->id >= 0) {
            if ((err = pieces_add(&b, a.text.p + pc->off, pc->len, pc->id, pc->origin)))
                goto nomem;
            continue;
        }
        const char *ns;
        size_t nl;
        if ((err = normalize(t, a.text.p + pc->off, pc->len, &w, &ns, &nl)))
            goto fail;
        if ((err = added_split(t, &h->normd, ns, nl, pc->origin, &b)))
            goto nomem;
    }

    pieces_t *cur = &b, *nxt = &a;
    for (size_t i = 0; i < h->n_pre; i++) {
        pieces_reset(nxt);
        if ((err = pre_step(t, &h->pre[i], cur, nxt, &w)))
            goto fail;
        pieces_t *x = cur;
        cur = nxt;
        nxt = x;
    }

    for (size_t i = 0; i < cur->n; i++) {
        const piece_t *pc = &cur->p[i];
        if (pc->id >= 0) {
            if ((err = tok_ids_push(&ids, pc->id)))
                goto nomem;
        } else if ((err = bpe_word(t, cur->text.p + pc->off, pc->len, &ids, &w))) {
            goto fail;
        }
    }

    if (add_special && h->n_tmpl) {
        size_t k = 0;
        while (k < h->n_tmpl) {
            tmp.len = 0;
            for (; k < h->n_tmpl && h->tmpl[k] != -2; k++) {
                err = h->tmpl[k] == -1 ? tok_ids_append(&tmp, ids.p, ids.len)
                                       : tok_ids_push(&tmp, h->tmpl[k]);
                if (err)
                    goto nomem;
            }
            k++;
            tok_ids_t x = ids;
            ids = tmp;
            tmp = x;
        }
    }
    if ((err = tok_ids_append(out, ids.p, ids.len)))
        goto nomem;
    err = 0;
    goto done;

nomem:
    err = river_err_set(RIVER_ENOMEM, "%s: no memory while encoding", t->path);
fail:
done:
    work_free(&w);
    pieces_free(&a);
    pieces_free(&b);
    tok_ids_free(&ids);
    tok_ids_free(&tmp);
    return err;
}

/* ---- decode ----------------------------------------------------------------------------- */

typedef struct dtoks {
    tok_buf_t text;
    size_t *off, *len;
    size_t n, cap;
} dtoks_t;

static int dtoks_add(dtoks_t *d, const char *s, size_t n)
{
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 32;
        size_t *o = realloc(d->off, cap * sizeof *o);
        if (!o)
            return RIVER_ENOMEM;
        d->off = o;
        size_t *l = realloc(d->len, cap * sizeof *l);
        if (!l)
            return RIVER_ENOMEM;
        d->len = l;
        d->cap = cap;
    }
    d->off[d->n] = d->text.len;
    d->len[d->n] = n;
    if (tok_buf_put(&d->text, s, n))
        return RIVER_ENOMEM;
    d->n++;
    return 0;
}

static void dtoks_free(dtoks_t *d)
{
    tok_buf_free(&d->text);
    free(d->off);
    free(d->len);
}

static int hexval(int c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* "<0xNN>" as the ByteFallback decoder reads it (u8::from_str_radix, which takes a '+'). */
static int byte_token(const char *s, size_t n)
{
    if (n != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>')
        return -1;
    if (s[3] == '+')
        return hexval(s[4]);
    if (hexval(s[3]) < 0 || hexval(s[4]) < 0)
        return -1;
    return hexval(s[3]) * 16 + hexval(s[4]);
}

static int byte_group_flush(dtoks_t *out, tok_buf_t *bytes)
{
    static const char fffd[3] = {(char)0xEF, (char)0xBF, (char)0xBD};
    if (bytes->len == 0)
        return 0;
    int err = 0;
    if (tok_utf8_valid(bytes->p, bytes->len))
        err = dtoks_add(out, bytes->p, bytes->len);
    else
        for (size_t i = 0; i < bytes->len && !err; i++)
            err = dtoks_add(out, fffd, 3);
    bytes->len = 0;
    return err;
}

static int dec_step(const tokenizer_t *t, const hf_dec_t *d, const dtoks_t *in, dtoks_t *out,
                    tok_window_t *win, int *fused, int *incomplete, tok_buf_t *tmp,
                    pcre2_match_data **md)
{
    const hf_tok_t *h = t->hf;
    int err = 0;
    switch (d->type) {
    case DEC_REPLACE:
        if (d->pat.re && !*md && !(*md = pcre2_match_data_create(8, NULL)))
            return RIVER_ENOMEM;
        for (size_t i = 0; i < in->n && !err; i++) {
            tmp->len = 0;
            err = replace_all(t, &d->pat, in->text.p + in->off[i], in->len[i], d->text, d->text_len,
                              tmp, *md);
            if (!err)
                err = dtoks_add(out, tmp->p ? tmp->p : "", tmp->len);
        }
        return err;
    case DEC_BYTEFALLBACK:
        tmp->len = 0;
        for (size_t i = 0; i < in->n && !err; i++) {
            const char *s = in->text.p + in->off[i];
            int byte = byte_token(s, in->len[i]);
            if (byte >= 0) {
                err = tok_buf_putc(tmp, byte);
                continue;
            }
            err = byte_group_flush(out, tmp);
            if (!err)
                err = dtoks_add(out, s, in->len[i]);
        }
        if (!err)
            err = byte_group_flush(out, tmp);
        return err;
    case DEC_FUSE:
        *fused = 1;
        return dtoks_add(out, in->text.p ? in->text.p : "", in->text.len);
    case DEC_STRIP:
        for (size_t i = 0; i < in->n && !err; i++) {
            const char *s = in->text.p + in->off[i];
            size_t a = 0, b = in->len[i];
            /* After Fuse the single token is the whole text: its start is the text's start
             * only outside a continuation, its end the text's end only at a closed end. */
            int start = (i == 0 && win->cont && *fused) ? 0 : d->start;
            int stop = (win->open_end && *fused) ? 0 : d->stop;
            for (int k = 0; k < start && b - a >= d->ch_len && memcmp(s + a, d->ch, d->ch_len) == 0;
                 k++)
                a += d->ch_len;
            for (int k = 0;
                 k < stop && b - a >= d->ch_len && memcmp(s + b - d->ch_len, d->ch, d->ch_len) == 0;
                 k++)
                b -= d->ch_len;
            err = dtoks_add(out, s + a, b - a);
        }
        return err;
    case DEC_BYTELEVEL: {
        tmp->len = 0;
        for (size_t i = 0; i < in->n && !err; i++) {
            const char *s = in->text.p + in->off[i];
            size_t n = in->len[i], mark = tmp->len;
            int mapped = 1;
            for (size_t p = 0; p < n && mapped;) {
                int32_t c = tok_utf8_next(s, n, &p);
                if (c < 0 || c >= 324 || h->bl_dec[c] < 0)
                    mapped = 0;
                else
                    err = tok_buf_putc(tmp, h->bl_dec[c]);
            }
            /* A token with characters outside the byte alphabet goes in as its own bytes. */
            if (!err && !mapped) {
                tmp->len = mark;
                err = tok_buf_put(tmp, s, n);
            }
        }
        if (err)
            return err;
        *fused = 1;
        tok_buf_t lossy = {0};
        err = tok_utf8_lossy(&lossy, tmp->p ? tmp->p : "", tmp->len, incomplete);
        if (!err)
            err = dtoks_add(out, lossy.p ? lossy.p : "", lossy.len);
        tok_buf_free(&lossy);
        return err;
    }
    case DEC_METASPACE:
        for (size_t i = 0; i < in->n && !err; i++) {
            const char *s = in->text.p + in->off[i];
            size_t n = in->len[i];
            int drop = i == 0 && !win->cont && d->prepend != PREPEND_NEVER;
            tmp->len = 0;
            for (size_t p = 0; p < n && !err;) {
                if (n - p >= d->ch_len && memcmp(s + p, d->ch, d->ch_len) == 0) {
                    if (!drop)
                        err = tok_buf_putc(tmp, ' ');
                    p += d->ch_len;
                } else {
                    err = tok_buf_putc(tmp, s[p]);
                    p++;
                }
            }
            if (!err)
                err = dtoks_add(out, tmp->p ? tmp->p : "", tmp->len);
        }
        return err;
    }
    return 0;
}

int tok_hf_decode(const tokenizer_t *t, const int32_t *ids, size_t n, int skip_special,
                  tok_window_t *win, tok_buf_t *out)
{
    const hf_tok_t *h = t->hf;
    dtoks_t a = {0}, b = {0};
    tok_buf_t tmp = {0};
    pcre2_match_data *md = NULL;
    int err = 0, fused = 0, incomplete = 0;
    win->hold = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        if (!tok_hf_id_valid(t, id)) {
            err = river_err_set(RIVER_ERANGE, "%s: token id %d is out of range (vocabulary of %d)",
                                t->path, (int)id, t->vocab_size);
            goto fail;
        }
        if (skip_special && (h->flags[id] & FLAG_SPECIAL))
            continue;
        if (dtoks_add(&a, h->strs.p + h->str_off[id], h->str_len[id]))
            goto nomem;
    }
    size_t base = out->len;
    if (!h->has_decoder) {
        /* Without a decoder the library joins the tokens with spaces. */
        for (size_t i = 0; i < a.n; i++)
            if (((i > 0 || win->cont) && tok_buf_putc(out, ' ')) ||
                tok_buf_put(out, a.text.p + a.off[i], a.len[i]))
                goto nomem;
        goto done;
    }
    int strip_stop = 0;
    const hf_dec_t *strip = NULL;
    dtoks_t *cur = &a, *nxt = &b;
    for (size_t k = 0; k < h->n_dec; k++) {
        nxt->text.len = 0;
        nxt->n = 0;
        const hf_dec_t *d = &h->dec[k];
        if (d->type == DEC_STRIP && fused && d->stop > 0) {
            strip = d;
            strip_stop = d->stop;
        }
        err = dec_step(t, d, cur, nxt, win, &fused, &incomplete, &tmp, &md);
        if (err == RIVER_ENOMEM)
            goto nomem;
        if (err)
            goto fail;
        dtoks_t *x = cur;
        cur = nxt;
        nxt = x;
    }
    for (size_t i = 0; i < cur->n; i++)
        if (tok_buf_put(out, cur->text.p + cur->off[i], cur->len[i]))
            goto nomem;
    if (win->open_end && out->len > base) {
        /* What may still change when more ids come: an unfinished character, and trailing
         * characters that a final Strip would remove. */
        size_t len = out->len - base;
        const char *s = out->p + base;
        if (incomplete && len >= 3 && memcmp(s + len - 3, "\xEF\xBF\xBD", 3) == 0)
            win->hold = 3;
        else if (strip)
            for (int k = 0;
                 k < strip_stop && len - win->hold >= strip->ch_len &&
                 memcmp(s + len - win->hold - strip->ch_len, strip->ch, strip->ch_len) == 0;
                 k++)
                win->hold += strip->ch_len;
    }
done:
    err = tok_buf_reserve(out, 0) ? RIVER_ENOMEM : 0;
    if (err)
        goto nomem;
    goto end;
nomem:
    err = river_err_set(RIVER_ENOMEM, "%s: no memory while decoding", t->path);
fail:
end:
    if (md)
        pcre2_match_data_free(md);
    dtoks_free(&a);
    dtoks_free(&b);
    tok_buf_free(&tmp);
    return err;
}

int tok_hf_id_valid(const tokenizer_t *t, int32_t id)
{
    return id >= 0 && id < t->vocab_size && (t->hf->flags[id] & FLAG_VALID);
}

int tok_hf_is_special(const tokenizer_t *t, int32_t id)
{
    return tok_hf_id_valid(t, id) && (t->hf->flags[id] & FLAG_SPECIAL);
}

int tok_hf_is_pending(const tokenizer_t *t, int32_t id)
{
    return t->hf->dec_bytefallback && tok_hf_id_valid(t, id) && (t->hf->flags[id] & FLAG_BYTE);
}

/* ---- loading ---------------------------------------------------------------------------- */

static void hf_free_steps(hf_tok_t *h)
{
    for (size_t i = 0; i < h->n_norm; i++) {
        pat_free(&h->norm[i].pat);
        free(h->norm[i].text);
    }
    free(h->norm);
    for (size_t i = 0; i < h->n_pre; i++)
        pat_free(&h->pre[i].pat);
    free(h->pre);
    for (size_t i = 0; i < h->n_dec; i++) {
        pat_free(&h->dec[i].pat);
        free(h->dec[i].text);
    }
    free(h->dec);
}

void tok_hf_free(hf_tok_t *h)
{
    if (!h)
        return;
    tok_map_free(&h->bpe.vocab);
    free(h->bpe.mkeys);
    free(h->bpe.mvals);
    free(h->bpe.unk);
    free(h->bpe.prefix);
    free(h->bpe.suffix);
    hf_free_steps(h);
    for (size_t i = 0; i < h->n_added; i++)
        free(h->added[i].content);
    free(h->added);
    matcher_free(&h->raw);
    matcher_free(&h->normd);
    free(h->tmpl);
    tok_buf_free(&h->strs);
    free(h->str_off);
    free(h->str_len);
    free(h->flags);
    free(h);
}

/* Appends one zeroed step to a flat array. */
static void *step_new(void **arr, size_t *n, size_t size)
{
    char *p = realloc(*arr, (*n + 1) * size);
    if (!p)
        return NULL;
    *arr = p;
    memset(p + *n * size, 0, size);
    return p + (*n)++ * size;
}

static int one_char(const tokenizer_t *t, const char *what, const char *s, size_t n, char out[4],
                    size_t *out_len)
{
    size_t p = 0;
    if (!s || n == 0 || !tok_utf8_valid(s, n) || (tok_utf8_next(s, n, &p), p != n))
        return river_err_set(RIVER_EFORMAT, "%s: %s must be a single character", t->path, what);
    memcpy(out, s, n);
    *out_len = n;
    return 0;
}

static int prepend_scheme(const json_t *o, int def)
{
    const char *s = jstr(o, "prepend_scheme", NULL);
    if (s) {
        if (!strcmp(s, "first"))
            return PREPEND_FIRST;
        if (!strcmp(s, "never"))
            return PREPEND_NEVER;
        return PREPEND_ALWAYS;
    }
    json_t *aps = json_object_get(o, "add_prefix_space");
    if (json_is_boolean(aps))
        return json_is_true(aps) ? PREPEND_ALWAYS : PREPEND_NEVER;
    return def;
}

typedef int (*parse_step_fn)(tokenizer_t *t, const json_t *o, int depth);

/* What the four pipeline parsers (normalizer, pre-tokenizer, decoder, post-processor)
 * share: every step is an object with a type, nesting is bounded, and a Sequence lists
 * further steps under `list_key`, each parsed by the same function. Returns 1 when o was a
 * Sequence (parsed), 0 with *type set for any other step, or an error. */
static int parse_step_head(tokenizer_t *t, const json_t *o, int depth, const char *what,
                           const char *list_key, parse_step_fn self, const char **type)
{
    *type = jstr(o, "type", NULL);
    if (!json_is_object(o) || !*type)
        return river_err_set(RIVER_EFORMAT, "%s: %s without a type", t->path, what);
    if (depth > 32)
        return river_err_set(RIVER_EFORMAT, "%s: %ss nested too deeply", t->path, what);
    if (strcmp(*type, "Sequence"))
        return 0;
    json_t *arr = json_object_get(o, list_key);
    if (!json_is_array(arr))
        return river_err_set(RIVER_EFORMAT, "%s: Sequence %s without a list", t->path, what);
    for (size_t i = 0; i < json_array_size(arr); i++) {
        int err = self(t, json_array_get(arr, i), depth + 1);
        if (err)
            return err;
    }
    return 1;
}

static int parse_norm(tokenizer_t *t, const json_t *o, int depth)
{
    hf_tok_t *h = t->hf;
    if (!o || json_is_null(o))
        return 0;
    const char *type;
    int head = parse_step_head(t, o, depth, "normalizer", "normalizers", parse_norm, &type);
    if (head)
        return head < 0 ? head : 0;
    int kind;
    if (!strcmp(type, "NFC"))
        kind = NORM_NFC;
    else if (!strcmp(type, "NFD"))
        kind = NORM_NFD;
    else if (!strcmp(type, "NFKC"))
        kind = NORM_NFKC;
    else if (!strcmp(type, "NFKD"))
        kind = NORM_NFKD;
    else if (!strcmp(type, "Lowercase"))
        kind = NORM_LOWER;
    else if (!strcmp(type, "Prepend"))
        kind = NORM_PREPEND;
    else if (!strcmp(type, "Replace"))
        kind = NORM_REPLACE;
    else if (!strcmp(type, "Strip"))
        kind = NORM_STRIP;
    else
        return river_err_set(RIVER_EUNSUPPORTED, "%s: normalizer type \"%s\" is not supported",
                             t->path, type);
    hf_norm_t *n = step_new((void **)&h->norm, &h->n_norm, sizeof *n);
    if (!n)
        return river_err_set(RIVER_ENOMEM, "%s: no memory", t->path);
    n->type = kind;
    size_t len = 0;
    const char *s = NULL;
    if (kind == NORM_PREPEND && !(s = jstr(o, "prepend", &len)))
        return river_err_set(RIVER_EFORMAT, "%s: Prepend normalizer without text", t->path);
    if (kind == NORM_REPLACE) {
        int err = pat_parse(t, o, "Replace normalizer", &n->pat);
        if (err)
            return err;
        if (!(s = jstr(o, "content", &len)))
            return river_err_set(RIVER_EFORMAT, "%s: Replace normalizer without content", t->path);
    }
    if (s && !(n->text = dupn(s, len)))
        return river_err_set(RIVER_ENOMEM, "%s: no memory", t->path);
    n->text_len = len;
    n->left = jbool(o, "strip_left", 1);
    n->right = jbool(o, "strip_right", 1);
    return 0;
}

static const char gpt2_regex[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+"
                                 "|\\s+(?!\\S)|\\s+";

static int parse_behavior(const tokenizer_t *t, const json_t *o, int def, int *out)
{
    const char *b = jstr(o, "behavior", NULL);
    if (!b) {
        *out = def;
        return 0;
    }
    static const char *names[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext",
                                  "Contiguous"};
    for (int i = 0; i < 5; i++)
        if (!strcmp(b, names[i])) {
            *out = i;
            return 0;
        }
    return river_err_set(RIVER_EFORMAT, "%s: unknown split behavior \"%s\"", t->path, b);
}

static int parse_pre(tokenizer_t *t, const json_t *o, int depth)
{
    hf_tok_t *h = t->hf;
    if (!o || json_is_null(o))
        return 0;
    const char *type;
    int head = parse_step_head(t, o, depth, "pre_tokenizer", "pretokenizers", parse_pre, &type);
    if (head)
        return head < 0 ? head : 0;
    hf_pre_t *p = step_new((void **)&h->pre, &h->n_pre, sizeof *p);
    if (!p)
        return river_err_set(RIVER_ENOMEM, "%s: no memory", t->path);
    int err = 0;
    if (!strcmp(type, "Split")) {
        p->type = PRE_SPLIT;
        p->invert = jbool(o, "invert", 0);
        if (!(err = parse_behavior(t, o, BEH_ISOLATED, &p->behavior)))
            err = pat_parse(t, o, "Split pre_tokenizer", &p->pat);
    } else if (!strcmp(type, "ByteLevel")) {
        p->type = PRE_BYTELEVEL;
        p->add_prefix_space = jbool(o, "add_prefix_space", 1);
        if (jbool(o, "use_regex", 1))
            err = re_compile(t, "ByteLevel", gpt2_regex, sizeof gpt2_regex - 1, &p->pat.re);
    } else if (!strcmp(type, "Metaspace")) {
        p->type = PRE_METASPACE;
        size_t n;
        const char *r = jstr(o, "replacement", &n);
        if (!r) {
            r = "\xE2\x96\x81";
            n = 3;
        }
        err = one_char(t, "Metaspace replacement", r, n, p->repl, &p->repl_len);
        p->prepend = prepend_scheme(o, PREPEND_ALWAYS);
        p->split = jbool(o, "split", 1);
        if (!err && !(p->pat.lit = dupn(p->repl, p->repl_len)))
            err = river_err_set(RIVER_ENOMEM, "%s: no memory", t->path);
        p->pat.lit_len = p->repl_len;
    } else if (!strcmp(type, "Whitespace")) {
        /* The library splits on \w+|[^\w\s]+ and keeps the matches. */
        p->type = PRE_SPLIT;
        p->behavior = BEH_REMOVED;
        p->invert = 1;
        err = re_compile(t, "Whitespace", "\\w+|[^\\w\\s]+", PCRE2_ZERO_TERMINATED, &p->pat.re);
    } else if (!strcmp(type, "WhitespaceSplit")) {
        p->type = PRE_SPLIT;
        p->behavior = BEH_REMOVED;
        err = re_compile(t, "WhitespaceSplit", "\\s+", PCRE2_ZERO_TERMINATED, &p->pat.re);
    } else if (!strcmp(type, "Digits")) {
        p->type = PRE_SPLIT;
        p->behavior = jbool(o, "individual_digits", 0) ? BEH_ISOLATED : BEH_CONTIGUOUS;
        err = re_compile(t, "Digits", "\\p{N}", PCRE2_ZERO_TERMINATED, &p->pat.re);
    } else if (!strcmp(type, "Punctuation")) {
        p->type = PRE_SPLIT;
        if (!(err = parse_behavior(t, o, BEH_ISOLATED, &p->behavior)))
            err =
                re_compile(t, "Punctuation", "[\\p{P}\\x21-\\x2F\\x3A-\\x40\\x5B-\\x60\\x7B-\\x7E]",
                           PCRE2_ZERO_TERMINATED, &p->pat.re);
    } else {
        err = river_err_set(RIVER_EUNSUPPORTED, "%s: pre_tokenizer type \"%s\" is not supported",
                            t->path, type);
    }
    return err;
}

static int parse_dec(tokenizer_t *t, const json_t *o, int depth)
{
    hf_tok_t *h = t->hf;
    const char *type;
    int head = parse_step_head(t, o, depth, "decoder", "decoders", parse_dec, &type);
    if (head)
        return head < 0 ? head : 0;
    hf_dec_t *d = step_new((void **)&h->dec, &h->n_dec, sizeof *d);
    if (!d)
        return river_err_set(RIVER_ENOMEM, "%s: no memory", t->path);
    size_t n = 0;
    const char *s;
    if (!strcmp(type, "Replace")) {
        d->type = DEC_REPLACE;
        int err = pat_parse(t, o, "Replace decoder", &d->pat);
        if (err)
            return err;
        if (!(s = jstr(o, "content", &n)))
            return river_err_set(RIVER_EFORMAT, "%s: Replace decoder without content", t->path);
        if (!(d->text = dupn(s, n)))
            return river_err_set(RIVER_ENOMEM, "%s: no memory", t->path);
        d->text_len = n;
    } else if (!strcmp(type, "ByteFallback")) {
        d->type = DEC_BYTEFALLBACK;
        h->dec_bytefallback = 1;
    } else if (!strcmp(type, "Fuse")) {
        d->type = DEC_FUSE;
    } else if (!strcmp(type, "Strip")) {
        d->type = DEC_STRIP;
        int64_t a = 0, b = 0;
        s = jstr(o, "content", &n);
        int err = one_char(t, "Strip decoder content", s, n, d->ch, &d->ch_len);
        if (err)
            return err;
        if ((json_object_get(o, "start") && !jint(json_object_get(o, "start"), &a)) ||
            (json_object_get(o, "stop") && !jint(json_object_get(o, "stop"), &b)) || a < 0 ||
            b < 0 || a > 1000000 || b > 1000000)
            return river_err_set(RIVER_EFORMAT, "%s: Strip decoder with bad start/stop", t->path);
        d->start = (int)a;
        d->stop = (int)b;
    } else if (!strcmp(type, "ByteLevel")) {
        d->type = DEC_BYTELEVEL;
    } else if (!strcmp(type, "Metaspace")) {
        d->type = DEC_METASPACE;
        s = jstr(o, "replacement", &n);
        if (!s) {
            s = "\xE2\x96\x81";
            n = 3;
        }
        int err = one_char(t, "Metaspace replacement", s, n, d->ch, &d->ch_len);
        if (err)
            return err;
        d->prepend = prepend_scheme(o, PREPEND_ALWAYS);
    } else {
        return river_err_set(RIVER_EUNSUPPORTED, "%s: decoder type \"%s\" is not supported",
                             t->path, type);
    }
    return 0;
}

static int tmpl_push(tokenizer_t *t, int32_t v)
{
    hf_tok_t *h = t->hf;
    int32_t *p = realloc(h->tmpl, (h->n_tmpl + 1) * sizeof *p);
    if (!p)
        return river_err_set(RIVER_ENOMEM, "%s: no memory", t->path);
    h->tmpl = p;
    p[h->n_tmpl++] = v;
    return 0;
}

static int parse_post(tokenizer_t *t, const json_t *o, int depth)
{
    hf_tok_t *h = t->hf;
    if (!o || json_is_null(o))
        return 0;
    const char *type;
    int err = parse_step_head(t, o, depth, "post_processor", "processors", parse_post, &type);
    if (err)
        return err < 0 ? err : 0;
    if (!strcmp(type, "ByteLevel"))
        return 0; /* it only adjusts offsets */
    if (!strcmp(type, "TemplateProcessing")) {
        json_t *single = json_object_get(o, "single");
        json_t *specials = json_object_get(o, "special_tokens");
        if (!json_is_array(single))
            return river_err_set(RIVER_EFORMAT, "%s: TemplateProcessing without a single template",
                                 t->path);
        int seen_seq = 0;
        for (size_t i = 0; i < json_array_size(single) && !err; i++) {
            json_t *item = json_array_get(single, i);
            json_t *st = json_object_get(item, "SpecialToken");
            json_t *sq = json_object_get(item, "Sequence");
            if (sq) {
                const char *which = jstr(sq, "id", NULL);
                /* A single sequence has only A. */
                if (!which || !strcmp(which, "A")) {
                    err = tmpl_push(t, -1);
                    seen_seq = 1;
                }
                continue;
            }
            const char *name = jstr(st, "id", NULL);
            json_t *spec = name ? json_object_get(specials, name) : NULL;
            json_t *ids = json_object_get(spec, "ids");
            if (!json_is_array(ids))
                return river_err_set(RIVER_EFORMAT, "%s: template special token \"%s\" has no ids",
                                     t->path, name ? name : "?");
            for (size_t k = 0; k < json_array_size(ids) && !err; k++) {
                int64_t v;
                if (!jint(json_array_get(ids, k), &v) || v < 0 || v >= INT32_MAX)
                    return river_err_set(RIVER_EFORMAT,
                                         "%s: template special token \"%s\" has a "
                                         "bad id",
                                         t->path, name);
                if (k == 0 && !seen_seq && h->tmpl_bos < 0)
                    h->tmpl_bos = (int32_t)v;
                if (k == 0 && seen_seq && h->tmpl_eos < 0)
                    h->tmpl_eos = (int32_t)v;
                err = tmpl_push(t, (int32_t)v);
            }
        }
        return err ? err : tmpl_push(t, -2);
    }
    if (!strcmp(type, "RobertaProcessing") || !strcmp(type, "BertProcessing")) {
        json_t *cls = json_object_get(o, "cls"), *sep = json_object_get(o, "sep");
        int64_t c, s;
        if (!jint(json_array_get(cls, 1), &c) || !jint(json_array_get(sep, 1), &s) || c < 0 ||
            s < 0 || c >= INT32_MAX || s >= INT32_MAX)
            return river_err_set(RIVER_EFORMAT, "%s: %s without cls/sep ids", t->path, type);
        if (h->tmpl_bos < 0)
            h->tmpl_bos = (int32_t)c;
        if (h->tmpl_eos < 0)
            h->tmpl_eos = (int32_t)s;
        if ((err = tmpl_push(t, (int32_t)c)) || (err = tmpl_push(t, -1)) ||
            (err = tmpl_push(t, (int32_t)s)))
            return err;
        return tmpl_push(t, -2);
    }
    return river_err_set(RIVER_EUNSUPPORTED, "%s: post_processor type \"%s\" is not supported",
                         t->path, type);
}

static int matcher_build(tokenizer_t *t, hf_matcher_t *m, int normalized)
{
    hf_tok_t *h = t->hf;
    size_t n = 0;
    for (size_t i = 0; i < h->n_added; i++)
        n += h->added[i].normalized == normalized;
    memset(m, 0, sizeof *m);
    mentry_t *e = calloc(n ? n : 1, sizeof *e);
    hf_work_t w;
    int err = work_init(&w);
    if (!e || err) {
        free(e);
        work_free(&w);
        return river_err_set(RIVER_ENOMEM, "%s: no memory", t->path);
    }
    size_t k = 0;
    /* The library's trie lists special tokens first, then the others, each in file order. */
    for (int pass = 0; pass < 2 && !err; pass++)
        for (size_t i = 0; i < h->n_added && !err; i++) {
            hf_added_t *a = &h->added[i];
            if (a->normalized != normalized || a->special != (pass == 0))
                continue;
            const char *s = a->content;
            size_t len = a->len;
            /* Tokens matched in normalized text are normalized themselves first. */
            if (normalized && (err = normalize(t, a->content, a->len, &w, &s, &len)))
                break;
            if (len == 0)
                continue;
            e[k] = (mentry_t){dupn(s, len), len, i, k};
            if (!e[k].pat)
                err = river_err_set(RIVER_ENOMEM, "%s: no memory", t->path);
            else
                k++;
        }
    work_free(&w);
    if (!err) {
        qsort(e, k, sizeof *e, mentry_cmp);
        m->pat = malloc((k ? k : 1) * sizeof *m->pat);
        m->len = malloc((k ? k : 1) * sizeof *m->len);
        m->tok = malloc((k ? k : 1) * sizeof *m->tok);
        if (!m->pat || !m->len || !m->tok)
            err = river_err_set(RIVER_ENOMEM, "%s: no memory", t->path);
    }
    if (err) {
        for (size_t i = 0; i < k; i++)
            free(e[i].pat);
        free(e);
        matcher_free(m);
        return err;
    }
    for (size_t i = 0; i < k; i++) {
        m->pat[i] = e[i].pat;
        m->len[i] = e[i].len;
        m->tok[i] = e[i].tok;
    }
    m->n = k;
    free(e);
    size_t j = 0;
    for (int b = 0; b <= 256; b++) {
        while (j < k && (unsigned char)m->pat[j][0] < b)
            j++;
        m->first[b] = (uint32_t)j;
    }
    return 0;
}

static int parse_added(tokenizer_t *t, const json_t *arr, int32_t *max_id)
{
    hf_tok_t *h = t->hf;
    if (!arr || json_is_null(arr))
        return 0;
    if (!json_is_array(arr))
        return river_err_set(RIVER_EFORMAT, "%s: added_tokens is not a list", t->path);
    size_t n = json_array_size(arr);
    h->added = calloc(n ? n : 1, sizeof *h->added);
    if (!h->added)
        return river_err_set(RIVER_ENOMEM, "%s: no memory", t->path);
    for (size_t i = 0; i < n; i++) {
        json_t *o = json_array_get(arr, i);
        int64_t id;
        size_t len;
        const char *c = jstr(o, "content", &len);
        if (!c || !jint(json_object_get(o, "id"), &id))
            return river_err_set(RIVER_EFORMAT, "%s: added_tokens[%zu] lacks an id or content",
                                 t->path, i);
        if (id < 0 || id >= (1 << 26))
            return river_err_set(RIVER_EFORMAT, "%s: added_tokens[%zu] has id %lld out of range",
                                 t->path, i, (long long)id);
        if (!tok_utf8_valid(c, len))
            return river_err_set(RIVER_EFORMAT, "%s: added_tokens[%zu] is not valid UTF-8", t->path,
                                 i);
        if (len == 0)
            continue; /* the library ignores empty added tokens */
        hf_added_t *a = &h->added[h->n_added];
        if (!(a->content = dupn(c, len)))
            return river_err_set(RIVER_ENOMEM, "%s: no memory", t->path);
        h->n_added++;
        a->len = len;
        a->id = (int32_t)id;
        a->special = jbool(o, "special", 0);
        a->single_word = jbool(o, "single_word", 0);
        a->lstrip = jbool(o, "lstrip", 0);
        a->rstrip = jbool(o, "rstrip", 0);
        a->normalized = jbool(o, "normalized", !a->special);
        if (a->id > *max_id)
            *max_id = a->id;
    }
    return 0;
}

/* ---- the vocabulary and the merges ------------------------------------------------------ */

/* These two members are nearly all of a large tokenizer.json. A small scanner reads them
 * straight from the text, and jansson parses the rest with them blanked out, which halves
 * the load time of a 150,000-token file. The jansson objects remain the path when the scanner
 * does not find them (odd layouts); both paths feed the same functions below. */

enum { JS_OK = 0, JS_BAD = 1 }; /* or RIVER_ENOMEM */

typedef struct jscan {
    const char *s;
    size_t n, i;
} jscan_t;

static void js_ws(jscan_t *j)
{
    while (j->i < j->n) {
        char c = j->s[j->i];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r')
            break;
        j->i++;
    }
}

static int js_at(const jscan_t *j, char c)
{
    return j->i < j->n && j->s[j->i] == c;
}

static int js_hex4(jscan_t *j, uint32_t *v)
{
    if (j->n - j->i < 4)
        return JS_BAD;
    *v = 0;
    for (int k = 0; k < 4; k++) {
        int h = hexval(j->s[j->i + k]);
        if (h < 0)
            return JS_BAD;
        *v = *v * 16 + (uint32_t)h;
    }
    j->i += 4;
    return JS_OK;
}

/* Reads a JSON string, decoded into out unless out is NULL. */
static int js_str(jscan_t *j, tok_buf_t *out)
{
    if (out)
        out->len = 0;
    if (!js_at(j, '"'))
        return JS_BAD;
    size_t run = ++j->i;
    while (j->i < j->n) {
        unsigned char c = (unsigned char)j->s[j->i];
        if (c == '"') {
            if (out && tok_buf_put(out, j->s + run, j->i - run))
                return RIVER_ENOMEM;
            j->i++;
            return JS_OK;
        }
        if (c < 0x20)
            return JS_BAD;
        if (c != '\\') {
            j->i++;
            continue;
        }
        if (out && tok_buf_put(out, j->s + run, j->i - run))
            return RIVER_ENOMEM;
        if (++j->i >= j->n)
            return JS_BAD;
        char e = j->s[j->i++], ch;
        switch (e) {
        case '"':
        case '\\':
        case '/':
            ch = e;
            break;
        case 'b':
            ch = '\b';
            break;
        case 'f':
            ch = '\f';
            break;
        case 'n':
            ch = '\n';
            break;
        case 'r':
            ch = '\r';
            break;
        case 't':
            ch = '\t';
            break;
        case 'u': {
            uint32_t cp, lo;
            if (js_hex4(j, &cp) || (cp >= 0xDC00 && cp <= 0xDFFF))
                return JS_BAD;
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                if (j->n - j->i < 2 || j->s[j->i] != '\\' || j->s[j->i + 1] != 'u')
                    return JS_BAD;
                j->i += 2;
                if (js_hex4(j, &lo) || lo < 0xDC00 || lo > 0xDFFF)
                    return JS_BAD;
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            }
            char u[4];
            if (out && tok_buf_put(out, u, tok_utf8_encode(cp, u)))
                return RIVER_ENOMEM;
            run = j->i;
            continue;
        }
        default:
            return JS_BAD;
        }
        if (out && tok_buf_putc(out, ch))
            return RIVER_ENOMEM;
        run = j->i;
    }
    return JS_BAD;
}

static int js_skip(jscan_t *j, int depth)
{
    js_ws(j);
    if (depth > 512 || j->i >= j->n)
        return JS_BAD;
    char c = j->s[j->i];
    if (c == '"')
        return js_str(j, NULL);
    if (c == '{' || c == '[') {
        char close = c == '{' ? '}' : ']';
        j->i++;
        js_ws(j);
        if (js_at(j, close)) {
            j->i++;
            return JS_OK;
        }
        for (;;) {
            int r;
            if (c == '{') {
                js_ws(j);
                if ((r = js_str(j, NULL)))
                    return r;
                js_ws(j);
                if (!js_at(j, ':'))
                    return JS_BAD;
                j->i++;
            }
            if ((r = js_skip(j, depth + 1)))
                return r;
            js_ws(j);
            if (js_at(j, ',')) {
                j->i++;
                continue;
            }
            if (js_at(j, close)) {
                j->i++;
                return JS_OK;
            }
            return JS_BAD;
        }
    }
    static const char *const lits[] = {"true", "false", "null"};
    for (int k = 0; k < 3; k++) {
        size_t l = strlen(lits[k]);
        if (j->n - j->i >= l && memcmp(j->s + j->i, lits[k], l) == 0) {
            j->i += l;
            return JS_OK;
        }
    }
    size_t st = j->i;
    while (j->i < j->n && strchr("+-0123456789.eE", j->s[j->i]) && j->s[j->i])
        j->i++;
    return j->i > st ? JS_OK : JS_BAD;
}

/* Reads an integer (an integral real is accepted too, as jint does). */
static int js_int(jscan_t *j, int64_t *v)
{
    size_t st = j->i;
    int neg = js_at(j, '-');
    if (neg)
        j->i++;
    int64_t x = 0;
    size_t digits = 0;
    while (j->i < j->n && j->s[j->i] >= '0' && j->s[j->i] <= '9') {
        if (x < (int64_t)1 << 40)
            x = x * 10 + (j->s[j->i] - '0');
        j->i++;
        digits++;
    }
    if (!digits)
        return JS_BAD;
    if (j->i < j->n && strchr(".eE", j->s[j->i]) && j->s[j->i]) {
        while (j->i < j->n && strchr("+-0123456789.eE", j->s[j->i]) && j->s[j->i])
            j->i++;
        char num[64];
        if (j->i - st >= sizeof num)
            return JS_BAD;
        memcpy(num, j->s + st, j->i - st);
        num[j->i - st] = '\0';
        json_t *r = json_real(strtod(num, NULL));
        int ok = r && jint(r, v);
        json_decref(r);
        return ok ? JS_OK : JS_BAD;
    }
    *v = neg ? -x : x;
    return JS_OK;
}

typedef struct big_spans {
    size_t vs, ve; /* model.vocab, ve == 0 when not found */
    size_t ms, me; /* model.merges */
} big_spans_t;

/* Finds the spans of model.vocab (an object) and model.merges (an array) in a JSON object
 * text, taking the last of duplicate keys as jansson does. Leaves *sp zeroed when the text
 * does not scan, so that jansson reports the problem. */
static int find_big(const char *s, size_t n, big_spans_t *sp)
{
    jscan_t j = {s, n, 0};
    tok_buf_t key = {0};
    int r = JS_BAD;
    memset(sp, 0, sizeof *sp);
    js_ws(&j);
    if (!js_at(&j, '{'))
        goto out;
    j.i++;
    js_ws(&j);
    if (js_at(&j, '}'))
        goto out;
    for (;;) {
        js_ws(&j);
        if ((r = js_str(&j, &key)))
            goto out;
        js_ws(&j);
        r = JS_BAD;
        if (!js_at(&j, ':'))
            goto out;
        j.i++;
        js_ws(&j);
        int is_model = key.len == 5 && memcmp(key.p, "model", 5) == 0;
        if (is_model && js_at(&j, '{')) {
            big_spans_t cur = {0};
            j.i++;
            js_ws(&j);
            if (js_at(&j, '}'))
                j.i++;
            else
                for (;;) {
                    js_ws(&j);
                    if ((r = js_str(&j, &key)))
                        goto out;
                    js_ws(&j);
                    r = JS_BAD;
                    if (!js_at(&j, ':'))
                        goto out;
                    j.i++;
                    js_ws(&j);
                    size_t vstart = j.i;
                    char first = j.i < n ? s[j.i] : 0;
                    if ((r = js_skip(&j, 0)))
                        goto out;
                    if (key.len == 5 && memcmp(key.p, "vocab", 5) == 0) {
                        cur.vs = vstart;
                        cur.ve = first == '{' ? j.i : 0;
                    } else if (key.len == 6 && memcmp(key.p, "merges", 6) == 0) {
                        cur.ms = vstart;
                        cur.me = first == '[' ? j.i : 0;
                    }
                    js_ws(&j);
                    r = JS_BAD;
                    if (js_at(&j, ',')) {
                        j.i++;
                        continue;
                    }
                    if (!js_at(&j, '}'))
                        goto out;
                    j.i++;
                    break;
                }
            *sp = cur;
        } else {
            if (is_model)
                memset(sp, 0, sizeof *sp);
            if ((r = js_skip(&j, 0)))
                goto out;
        }
        js_ws(&j);
        r = JS_BAD;
        if (js_at(&j, ',')) {
            j.i++;
            continue;
        }
        if (!js_at(&j, '}'))
            goto out;
        break;
    }
    tok_buf_free(&key);
    return 0;
out:
    memset(sp, 0, sizeof *sp);
    tok_buf_free(&key);
    return r == RIVER_ENOMEM ? RIVER_ENOMEM : 0;
}

static int scan_error(const tokenizer_t *t, const char *what, const char *s, size_t at, int r)
{
    if (r == RIVER_ENOMEM)
        return river_err_set(RIVER_ENOMEM, "%s: no memory", t->path);
    int line = 1, col = 1;
    for (size_t i = 0; i < at; i++) {
        if (s[i] == '\n') {
            line++;
            col = 1;
        } else {
            col++;
        }
    }
    return river_err_set(RIVER_EFORMAT, "%s: invalid JSON in model.%s at line %d, column %d",
                         t->path, what, line, col);
}

static int vocab_add(tokenizer_t *t, const char *key, size_t klen, int ok, int64_t id,
                     int32_t *max_id)
{
    if (!ok || id < 0 || id >= (1 << 26))
        return river_err_set(RIVER_EFORMAT, "%s: vocab entry \"%.*s\" has a bad id", t->path,
                             (int)(klen > 200 ? 200 : klen), key);
    if (tok_map_put(&t->hf->bpe.vocab, key, klen, (int32_t)id, 1, NULL))
        return river_err_set(RIVER_ENOMEM, "%s: no memory", t->path);
    if (id > *max_id)
        *max_id = (int32_t)id;
    return 0;
}

static int scan_vocab(tokenizer_t *t, const char *s, const big_spans_t *sp, int32_t *max_id)
{
    if (!tok_utf8_valid(s + sp->vs, sp->ve - sp->vs))
        return river_err_set(RIVER_EFORMAT, "%s: model.vocab is not valid UTF-8", t->path);
    jscan_t j = {s, sp->ve, sp->vs + 1};
    tok_buf_t key = {0};
    int r = JS_OK, err = 0;
    js_ws(&j);
    if (js_at(&j, '}'))
        goto out;
    for (;;) {
        int64_t id = -1;
        js_ws(&j);
        if ((r = js_str(&j, &key)))
            break;
        js_ws(&j);
        r = JS_BAD;
        if (!js_at(&j, ':'))
            break;
        j.i++;
        js_ws(&j);
        int bad = js_int(&j, &id) != JS_OK;
        if (bad && js_skip(&j, 0) != JS_OK)
            break;
        if ((err = vocab_add(t, key.p, key.len, !bad, id, max_id)))
            goto out;
        js_ws(&j);
        if (js_at(&j, ',')) {
            j.i++;
            continue;
        }
        if (js_at(&j, '}'))
            r = JS_OK;
        break;
    }
    if (r)
        err = scan_error(t, "vocab", s, j.i, r);
out:
    tok_buf_free(&key);
    return err;
}

static int merge_token_id(const tokenizer_t *t, size_t rank, const char *s, size_t n, int32_t *id)
{
    *id = tok_map_get(&t->hf->bpe.vocab, s, n);
    if (*id < 0)
        return river_err_set(RIVER_EFORMAT,
                             "%s: merge %zu uses \"%.*s\", which is not in the vocabulary", t->path,
                             rank + 1, (int)(n > 200 ? 200 : n), s);
    return 0;
}

static int merge_add(tokenizer_t *t, size_t *rank, const char *l, size_t ll, const char *r,
                     size_t rl, tok_buf_t *cat)
{
    hf_bpe_t *b = &t->hf->bpe;
    int32_t li, ri, mi;
    int err;
    if ((err = merge_token_id(t, *rank, l, ll, &li)) ||
        (err = merge_token_id(t, *rank, r, rl, &ri)))
        return err;
    /* The merged token drops the right part's continuing-subword prefix. */
    size_t skip = b->prefix_len && b->prefix_len <= rl && memcmp(r, b->prefix, b->prefix_len) == 0
                      ? b->prefix_len
                      : 0;
    cat->len = 0;
    if (tok_buf_put(cat, l, ll) || tok_buf_put(cat, r + skip, rl - skip))
        return river_err_set(RIVER_ENOMEM, "%s: no memory", t->path);
    if ((err = merge_token_id(t, *rank, cat->p, cat->len, &mi)))
        return err;
    if (merge_put(b, li, ri, (uint32_t)*rank, mi))
        return river_err_set(RIVER_ENOMEM, "%s: no memory", t->path);
    (*rank)++;
    return 0;
}

/* The "a b" form: exactly one space; "#version" lines are skipped. */
static int merge_add_str(tokenizer_t *t, size_t *rank, const char *s, size_t len, tok_buf_t *cat)
{
    if (len >= 8 && memcmp(s, "#version", 8) == 0)
        return 0;
    const char *sp = memchr(s, ' ', len);
    if (!sp || memchr(sp + 1, ' ', len - (size_t)(sp + 1 - s)))
        return river_err_set(RIVER_EFORMAT,
                             "%s: merge %zu is not two tokens separated by one space", t->path,
                             *rank + 1);
    return merge_add(t, rank, s, (size_t)(sp - s), sp + 1, len - (size_t)(sp - s) - 1, cat);
}

static int scan_merges(tokenizer_t *t, const char *s, const big_spans_t *sp)
{
    if (!tok_utf8_valid(s + sp->ms, sp->me - sp->ms))
        return river_err_set(RIVER_EFORMAT, "%s: model.merges is not valid UTF-8", t->path);
    jscan_t j = {s, sp->me, sp->ms + 1};
    tok_buf_t a = {0}, b = {0}, cat = {0};
    size_t rank = 0;
    int r = JS_OK, err = 0;
    js_ws(&j);
    if (js_at(&j, ']'))
        goto out;
    for (;;) {
        js_ws(&j);
        if (js_at(&j, '"')) {
            if ((r = js_str(&j, &a)))
                break;
            if ((err = merge_add_str(t, &rank, a.p, a.len, &cat)))
                goto out;
        } else if (js_at(&j, '[')) {
            j.i++;
            js_ws(&j);
            if ((r = js_str(&j, &a)))
                break;
            js_ws(&j);
            r = JS_BAD;
            if (!js_at(&j, ','))
                break;
            j.i++;
            js_ws(&j);
            if ((r = js_str(&j, &b)))
                break;
            js_ws(&j);
            r = JS_BAD;
            if (!js_at(&j, ']'))
                break;
            j.i++;
            if ((err = merge_add(t, &rank, a.p, a.len, b.p, b.len, &cat)))
                goto out;
        } else {
            err = river_err_set(RIVER_EFORMAT, "%s: merge %zu is neither \"a b\" nor [a, b]",
                                t->path, rank + 1);
            goto out;
        }
        js_ws(&j);
        r = JS_BAD;
        if (js_at(&j, ',')) {
            j.i++;
            continue;
        }
        if (js_at(&j, ']'))
            r = JS_OK;
        break;
    }
    if (r)
        err = scan_error(t, "merges", s, j.i, r);
out:
    tok_buf_free(&a);
    tok_buf_free(&b);
    tok_buf_free(&cat);
    return err;
}

static int parse_model(tokenizer_t *t, const json_t *model, const char *text, const big_spans_t *sp,
                       int32_t *max_id)
{
    hf_tok_t *h = t->hf;
    hf_bpe_t *b = &h->bpe;
    int err;
    if (!json_is_object(model))
        return river_err_set(RIVER_EFORMAT, "%s: no \"model\" object (not a tokenizer.json?)",
                             t->path);
    const char *type = jstr(model, "type", NULL);
    json_t *vocab = json_object_get(model, "vocab");
    json_t *merges = json_object_get(model, "merges");
    if (!type && merges)
        type = "BPE"; /* files from old versions leave the type out */
    if (!type)
        return river_err_set(RIVER_EFORMAT, "%s: model has no type", t->path);
    if (strcmp(type, "BPE") != 0)
        return river_err_set(RIVER_EUNSUPPORTED,
                             "%s: model type \"%s\" is not supported (only BPE)", t->path, type);
    if (!json_is_object(vocab))
        return river_err_set(RIVER_EFORMAT, "%s: the BPE model has no \"vocab\" object", t->path);
    if (merges && !json_is_array(merges))
        return river_err_set(RIVER_EFORMAT, "%s: merges is not a list", t->path);

    /* About 12 bytes of text per vocabulary entry in the files seen. */
    size_t nv = sp->ve ? (sp->ve - sp->vs) / 12 : json_object_size(vocab);
    if (tok_map_init(&b->vocab, nv))
        return river_err_set(RIVER_ENOMEM, "%s: no memory", t->path);
    if (sp->ve) {
        if ((err = scan_vocab(t, text, sp, max_id)))
            return err;
    } else {
        const char *key;
        size_t klen;
        json_t *val;
        json_object_keylen_foreach((json_t *)vocab, key, klen, val)
        {
            int64_t id = -1;
            int ok = jint(val, &id);
            if ((err = vocab_add(t, key, klen, ok, id, max_id)))
                return err;
        }
    }

    size_t len = 0;
    const char *s;
    if ((s = jstr(model, "continuing_subword_prefix", &len)) && len && !(b->prefix = dupn(s, len)))
        return river_err_set(RIVER_ENOMEM, "%s: no memory", t->path);
    b->prefix_len = b->prefix ? len : 0;
    if ((s = jstr(model, "end_of_word_suffix", &len)) && len && !(b->suffix = dupn(s, len)))
        return river_err_set(RIVER_ENOMEM, "%s: no memory", t->path);
    b->suffix_len = b->suffix ? len : 0;
    if ((s = jstr(model, "unk_token", &len))) {
        if (!(b->unk = dupn(s, len)))
            return river_err_set(RIVER_ENOMEM, "%s: no memory", t->path);
        b->has_unk = 1;
        b->unk_id = tok_map_get(&b->vocab, s, len);
    }
    b->fuse_unk = jbool(model, "fuse_unk", 0);
    b->byte_fallback = jbool(model, "byte_fallback", 0);
    b->ignore_merges = jbool(model, "ignore_merges", 0);
    for (int i = 0; i < 256; i++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", i);
        b->byte_id[i] = tok_map_get(&b->vocab, name, 6);
    }

    if (sp->me)
        return scan_merges(t, text, sp);
    tok_buf_t cat = {0};
    size_t rank = 0;
    err = 0;
    for (size_t i = 0; merges && i < json_array_size(merges) && !err; i++) {
        json_t *m = json_array_get(merges, i);
        if (json_is_string(m)) {
            err = merge_add_str(t, &rank, json_string_value(m), json_string_length(m), &cat);
        } else if (json_is_array(m) && json_array_size(m) == 2 &&
                   json_is_string(json_array_get(m, 0)) && json_is_string(json_array_get(m, 1))) {
            json_t *l = json_array_get(m, 0), *r = json_array_get(m, 1);
            err = merge_add(t, &rank, json_string_value(l), json_string_length(l),
                            json_string_value(r), json_string_length(r), &cat);
        } else {
            err = river_err_set(RIVER_EFORMAT, "%s: merge %zu is neither \"a b\" nor [a, b]",
                                t->path, rank + 1);
        }
    }
    tok_buf_free(&cat);
    return err;
}

/* The id of a token text: added tokens first, then the model's vocabulary. */
static int32_t token_id(const tokenizer_t *t, const char *s, size_t n)
{
    const hf_tok_t *h = t->hf;
    for (size_t i = 0; i < h->n_added; i++)
        if (h->added[i].len == n && memcmp(h->added[i].content, s, n) == 0)
            return h->added[i].id;
    return tok_map_get(&h->bpe.vocab, s, n);
}

/* bos_token / eos_token of tokenizer_config.json: a string, {"content": ...}, or null. */
static int config_token(const tokenizer_t *t, const json_t *cfg, const char *key, int32_t *id)
{
    json_t *v = json_object_get(cfg, key);
    if (!v)
        return 0;
    *id = -1;
    if (json_is_object(v))
        v = json_object_get(v, "content");
    if (json_is_string(v))
        *id = token_id(t, json_string_value(v), json_string_length(v));
    return 1;
}

/* Special ids come from tokenizer_config.json beside the file when it names them, else from
 * the post-processor's template. The config is optional: a missing or unreadable one leaves
 * the template's choice. */
static void read_config(tokenizer_t *t)
{
    hf_tok_t *h = t->hf;
    int32_t bos = h->tmpl_bos, eos = h->tmpl_eos;
    const char *slash = strrchr(t->path, '/');
    size_t dir = slash ? (size_t)(slash - t->path) + 1 : 0;
    char *cfg_path = malloc(dir + sizeof "tokenizer_config.json");
    if (cfg_path) {
        memcpy(cfg_path, t->path, dir);
        strcpy(cfg_path + dir, "tokenizer_config.json");
        char *data;
        size_t len;
        if (access(cfg_path, R_OK) == 0 && river_read_file(cfg_path, &data, &len) == 0) {
            json_error_t je;
            json_t *cfg = json_loadb(data, len, JSON_DECODE_INT_AS_REAL | JSON_ALLOW_NUL, &je);
            if (json_is_object(cfg)) {
                config_token(t, cfg, "bos_token", &bos);
                config_token(t, cfg, "eos_token", &eos);
            }
            json_decref(cfg);
            free(data);
        }
        river_err_clear();
        free(cfg_path);
    }
    t->bos_id = bos;
    t->eos_id = eos;
}

static void bytelevel_tables(hf_tok_t *h)
{
    int n = 0;
    for (int i = 0; i < 324; i++)
        h->bl_dec[i] = -1;
    for (int b = 0; b < 256; b++) {
        int keep = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        uint32_t cp = keep ? (uint32_t)b : (uint32_t)(256 + n++);
        char u[4];
        size_t l = tok_utf8_encode(cp, u);
        memcpy(h->bl_enc[b], u, l);
        h->bl_enc_len[b] = (uint8_t)l;
        h->bl_dec[cp] = (int16_t)b;
    }
}

/* The string every id decodes from: an added token's content, else the vocabulary's. */
static int build_strings(tokenizer_t *t, int32_t max_id)
{
    hf_tok_t *h = t->hf;
    size_t n = (size_t)max_id + 1;
    h->str_off = calloc(n, sizeof *h->str_off);
    h->str_len = calloc(n, sizeof *h->str_len);
    h->flags = calloc(n, sizeof *h->flags);
    if (!h->str_off || !h->str_len || !h->flags ||
        tok_buf_reserve(&h->strs, h->bpe.vocab.keys.len + 1024))
        return river_err_set(RIVER_ENOMEM, "%s: no memory", t->path);
    const tok_map_t *v = &h->bpe.vocab;
    for (size_t e = 0; e < v->n; e++) {
        int32_t id = v->val[e];
        if (h->flags[id] & FLAG_VALID)
            continue;
        h->str_off[id] = h->strs.len;
        h->str_len[id] = v->key_len[e];
        h->flags[id] = FLAG_VALID;
        if (tok_buf_put(&h->strs, v->keys.p + v->key_off[e], v->key_len[e]))
            return river_err_set(RIVER_ENOMEM, "%s: no memory", t->path);
    }
    for (size_t i = 0; i < h->n_added; i++) {
        const hf_added_t *a = &h->added[i];
        h->str_off[a->id] = h->strs.len;
        h->str_len[a->id] = (uint32_t)a->len;
        h->flags[a->id] |= FLAG_VALID | FLAG_ADDED;
        if (a->special)
            h->flags[a->id] |= FLAG_SPECIAL;
        else
            h->flags[a->id] &= (uint8_t)~FLAG_SPECIAL;
        if (tok_buf_put(&h->strs, a->content, a->len))
            return river_err_set(RIVER_ENOMEM, "%s: no memory", t->path);
    }
    for (size_t id = 0; id < n; id++)
        if ((h->flags[id] & FLAG_VALID) &&
            byte_token(h->strs.p + h->str_off[id], h->str_len[id]) >= 0)
            h->flags[id] |= FLAG_BYTE;
    t->vocab_size = (int)n;
    return 0;
}

int tok_hf_load(tokenizer_t *t, const char *data, size_t len)
{
    big_spans_t sp;
    int err = find_big(data, len, &sp);
    if (err)
        return river_err_set(err, "%s: no memory", t->path);
    /* jansson reads a copy with the two big members blanked, newlines kept so that its
     * error positions stay right. */
    char *copy = NULL;
    if (sp.ve || sp.me) {
        copy = malloc(len);
        if (!copy)
            return river_err_set(RIVER_ENOMEM, "%s: no memory", t->path);
        memcpy(copy, data, len);
        size_t span[2][2] = {{sp.vs, sp.ve}, {sp.ms, sp.me}};
        for (int k = 0; k < 2; k++) {
            if (!span[k][1])
                continue;
            for (size_t i = span[k][0] + 1; i + 1 < span[k][1]; i++)
                if (copy[i] != '\n')
                    copy[i] = ' ';
        }
    }
    json_error_t je;
    json_t *root = json_loadb(copy ? copy : data, len, JSON_ALLOW_NUL, &je);
    free(copy);
    if (!root)
        return river_err_set(RIVER_EFORMAT, "%s: invalid JSON at line %d, column %d: %s", t->path,
                             je.line, je.column, je.text);
    if (!json_is_object(root)) {
        err = river_err_set(RIVER_EFORMAT, "%s: the JSON is not an object", t->path);
        goto fail_root;
    }
    t->hf = calloc(1, sizeof *t->hf);
    if (!t->hf) {
        err = river_err_set(RIVER_ENOMEM, "%s: no memory", t->path);
        goto fail_root;
    }
    hf_tok_t *h = t->hf;
    h->tmpl_bos = h->tmpl_eos = -1;
    bytelevel_tables(h);
    int32_t max_id = -1;
    json_t *dec = json_object_get(root, "decoder");
    if ((err = parse_model(t, json_object_get(root, "model"), data, &sp, &max_id)) ||
        (err = parse_added(t, json_object_get(root, "added_tokens"), &max_id)) ||
        (err = parse_norm(t, json_object_get(root, "normalizer"), 0)) ||
        (err = parse_pre(t, json_object_get(root, "pre_tokenizer"), 0)) ||
        (err = parse_post(t, json_object_get(root, "post_processor"), 0)) ||
        (dec && !json_is_null(dec) && (err = parse_dec(t, dec, 0))))
        goto fail_hf;
    h->has_decoder = dec && !json_is_null(dec);
    if (max_id < 0) {
        err = river_err_set(RIVER_EFORMAT, "%s: the vocabulary is empty", t->path);
        goto fail_hf;
    }
    for (size_t i = 0; i < h->n_tmpl; i++)
        if (h->tmpl[i] > max_id) {
            err = river_err_set(RIVER_EFORMAT,
                                "%s: post_processor uses id %d beyond the "
                                "vocabulary",
                                t->path, (int)h->tmpl[i]);
            goto fail_hf;
        }
    if ((err = build_strings(t, max_id)) || (err = matcher_build(t, &h->raw, 0)) ||
        (err = matcher_build(t, &h->normd, 1)))
        goto fail_hf;
    json_decref(root);
    read_config(t);
    return 0;

fail_hf:
    tok_hf_free(t->hf);
    t->hf = NULL;
fail_root:
    json_decref(root);
    return err;
}
