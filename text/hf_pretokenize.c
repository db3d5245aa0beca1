/* Pre-tokenizers of a Hugging Face tokenizer.json: a table of the supported types, each with
 * the function that reads its options and the one that splits a piece of text, and the
 * runner of one step over a list of pieces. Whitespace, WhitespaceSplit, Digits and
 * Punctuation are Splits with fixed patterns, as in the library. */
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "text/hf_internal.h"

typedef int (*pre_parse_fn)(tokenizer_t *t, const json_t *o, hf_pre_t *p);
/* Splits the piece s (not an added token) and appends the parts to out. */
typedef int (*pre_apply_fn)(const tokenizer_t *t, const hf_pre_t *p, const char *s, size_t len,
                            int origin, pieces_t *out, hf_work_t *w);

struct hf_pre_kind {
    const char *name;
    pre_parse_fn parse;
    pre_apply_fn apply;
};

/* ---- applying --------------------------------------------------------------------------- */

static int pre_split(const tokenizer_t *t, const hf_pre_t *p, const char *s, size_t len, int origin,
                     pieces_t *out, hf_work_t *w)
{
    return hf_split(t, &p->pat, p->behavior, p->invert, s, len, origin, out, w);
}

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
    return hf_pieces_add(out, tmp->p, tmp->len, -1, origin);
}

static int pre_bytelevel(const tokenizer_t *t, const hf_pre_t *p, const char *s, size_t len,
                         int origin, pieces_t *out, hf_work_t *w)
{
    tok_buf_t *tmp = &w->key;
    pieces_t *sub = &w->sub;
    tmp->len = 0;
    int err = 0;
    if (p->add_prefix_space && (len == 0 || s[0] != ' '))
        err = tok_buf_putc(tmp, ' ');
    if (!err)
        err = tok_buf_put(tmp, s, len);
    if (err)
        return err;
    hf_pieces_reset(sub);
    if (p->pat.re)
        err = hf_split(t, &p->pat, BEH_ISOLATED, 0, tmp->p, tmp->len, origin, sub, w);
    else
        err = hf_pieces_add(sub, tmp->p, tmp->len, -1, origin);
    for (size_t k = 0; k < sub->n && !err; k++)
        err = bytelevel_map(t->hf, sub->text.p + sub->p[k].off, sub->p[k].len, sub->p[k].origin,
                            out, &w->tmp);
    return err;
}

static int pre_metaspace(const tokenizer_t *t, const hf_pre_t *p, const char *s, size_t len,
                         int origin, pieces_t *out, hf_work_t *w)
{
    tok_buf_t *tmp = &w->key;
    tmp->len = 0;
    int err = 0;
    for (size_t k = 0; k < len && !err; k++)
        err = s[k] == ' ' ? tok_buf_put(tmp, p->repl, p->repl_len) : tok_buf_putc(tmp, s[k]);
    if (err)
        return err;
    int starts = tmp->len >= p->repl_len && memcmp(tmp->p, p->repl, p->repl_len) == 0;
    if (!starts && (p->prepend == PREPEND_ALWAYS || (p->prepend == PREPEND_FIRST && origin))) {
        /* Prepending shifts the text: rebuild it in the scratch buffer. */
        w->tmp.len = 0;
        if (tok_buf_put(&w->tmp, p->repl, p->repl_len) || tok_buf_put(&w->tmp, tmp->p, tmp->len))
            return RIVER_ENOMEM;
        tmp->len = 0;
        if (tok_buf_put(tmp, w->tmp.p, w->tmp.len))
            return RIVER_ENOMEM;
    }
    if (p->split)
        return hf_split(t, &p->pat, BEH_MERGED_NEXT, 0, tmp->p, tmp->len, origin, out, w);
    return hf_pieces_add(out, tmp->p, tmp->len, -1, origin);
}

/* ---- reading ---------------------------------------------------------------------------- */

static const char gpt2_regex[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+"
                                 "|\\s+(?!\\S)|\\s+";

static int parse_behavior(const tokenizer_t *t, const json_t *o, int def, int *out)
{
    const char *b = hf_jstr(o, "behavior", NULL);
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

static int parse_split(tokenizer_t *t, const json_t *o, hf_pre_t *p)
{
    p->invert = hf_jbool(o, "invert", 0);
    int err = parse_behavior(t, o, BEH_ISOLATED, &p->behavior);
    return err ? err : hf_pat_parse(t, o, "Split pre_tokenizer", &p->pat);
}

static int parse_bytelevel(tokenizer_t *t, const json_t *o, hf_pre_t *p)
{
    p->add_prefix_space = hf_jbool(o, "add_prefix_space", 1);
    if (hf_jbool(o, "use_regex", 1))
        return hf_re_compile(t, "ByteLevel", gpt2_regex, sizeof gpt2_regex - 1, &p->pat.re);
    return 0;
}

static int parse_metaspace(tokenizer_t *t, const json_t *o, hf_pre_t *p)
{
    size_t n;
    const char *r = hf_jstr(o, "replacement", &n);
    if (!r) {
        r = "\xE2\x96\x81";
        n = 3;
    }
    int err = hf_one_char(t, "Metaspace replacement", r, n, p->repl, &p->repl_len);
    p->prepend = hf_prepend_scheme(o, PREPEND_ALWAYS);
    p->split = hf_jbool(o, "split", 1);
    if (!err && !(p->pat.lit = hf_dupn(p->repl, p->repl_len)))
        err = river_err_set(RIVER_ENOMEM, "%s: no memory", t->path);
    p->pat.lit_len = p->repl_len;
    return err;
}

static int parse_whitespace(tokenizer_t *t, const json_t *o, hf_pre_t *p)
{
    (void)o;
    /* The library splits on \w+|[^\w\s]+ and keeps the matches. */
    p->behavior = BEH_REMOVED;
    p->invert = 1;
    return hf_re_compile(t, "Whitespace", "\\w+|[^\\w\\s]+", PCRE2_ZERO_TERMINATED, &p->pat.re);
}

static int parse_whitespace_split(tokenizer_t *t, const json_t *o, hf_pre_t *p)
{
    (void)o;
    p->behavior = BEH_REMOVED;
    return hf_re_compile(t, "WhitespaceSplit", "\\s+", PCRE2_ZERO_TERMINATED, &p->pat.re);
}

static int parse_digits(tokenizer_t *t, const json_t *o, hf_pre_t *p)
{
    p->behavior = hf_jbool(o, "individual_digits", 0) ? BEH_ISOLATED : BEH_CONTIGUOUS;
    return hf_re_compile(t, "Digits", "\\p{N}", PCRE2_ZERO_TERMINATED, &p->pat.re);
}

static int parse_punctuation(tokenizer_t *t, const json_t *o, hf_pre_t *p)
{
    int err = parse_behavior(t, o, BEH_ISOLATED, &p->behavior);
    if (err)
        return err;
    return hf_re_compile(t, "Punctuation", "[\\p{P}\\x21-\\x2F\\x3A-\\x40\\x5B-\\x60\\x7B-\\x7E]",
                         PCRE2_ZERO_TERMINATED, &p->pat.re);
}

static const hf_pre_kind_t pre_kinds[] = {
    {"Split", parse_split, pre_split},
    {"ByteLevel", parse_bytelevel, pre_bytelevel},
    {"Metaspace", parse_metaspace, pre_metaspace},
    {"Whitespace", parse_whitespace, pre_split},
    {"WhitespaceSplit", parse_whitespace_split, pre_split},
    {"Digits", parse_digits, pre_split},
    {"Punctuation", parse_punctuation, pre_split},
};

int hf_parse_pre(tokenizer_t *t, const json_t *o, int depth)
{
    hf_tok_t *h = t->hf;
    if (!o || json_is_null(o))
        return 0;
    const void *kind;
    hf_kinds_t kinds = {pre_kinds, sizeof pre_kinds / sizeof pre_kinds[0], sizeof pre_kinds[0]};
    int head =
        hf_parse_step(t, o, depth, "pre_tokenizer", "pretokenizers", hf_parse_pre, kinds, &kind);
    if (head)
        return head < 0 ? head : 0;
    hf_pre_t *p = hf_step_new((void **)&h->pre, &h->n_pre, sizeof *p);
    if (!p)
        return river_err_set(RIVER_ENOMEM, "%s: no memory", t->path);
    p->kind = kind;
    return p->kind->parse(t, o, p);
}

int hf_pre_step(const tokenizer_t *t, const hf_pre_t *p, const pieces_t *in, pieces_t *out,
                hf_work_t *w)
{
    int err = 0;
    for (size_t i = 0; i < in->n && !err; i++) {
        const piece_t *pc = &in->p[i];
        const char *s = in->text.p + pc->off;
        if (pc->id >= 0)
            err = hf_pieces_add(out, s, pc->len, pc->id, pc->origin);
        else
            err = p->kind->apply(t, p, s, pc->len, pc->origin, out, w);
    }
    if (err == RIVER_ENOMEM)
        river_err_set(err, "%s: no memory while pre-tokenizing", t->path);
    return err;
}
