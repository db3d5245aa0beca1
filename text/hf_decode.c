/* Decoders of a Hugging Face tokenizer.json: a table of the supported types, each with the
 * function that reads its options and the one that applies it to the list of token strings,
 * and tok_hf_decode, which turns ids into their strings and runs the decoder chain over a
 * window of them (see tok_window_t for what a window defers). */
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "text/hf_internal.h"
#include "text/hex.h"

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

/* "<0xNN>" as the ByteFallback decoder reads it (u8::from_str_radix, which takes a '+'). */
int hf_byte_token(const char *s, size_t n)
{
    if (n != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>')
        return -1;
    if (s[3] == '+')
        return text_hex_digit(s[4]);
    if (text_hex_digit(s[3]) < 0 || text_hex_digit(s[4]) < 0)
        return -1;
    return text_hex_digit(s[3]) * 16 + text_hex_digit(s[4]);
}

static int byte_group_flush(dtoks_t *out, tok_buf_t *bytes, int raw)
{
    static const char fffd[3] = {(char)0xEF, (char)0xBF, (char)0xBD};
    if (bytes->len == 0)
        return 0;
    int err = 0;
    if (raw || text_utf8_valid(bytes->p, bytes->len))
        err = dtoks_add(out, bytes->p, bytes->len);
    else
        for (size_t i = 0; i < bytes->len && !err; i++)
            err = dtoks_add(out, fffd, 3);
    bytes->len = 0;
    return err;
}

/* The state of one decode call that steps share. */
typedef struct dec_run {
    tok_window_t *win;
    int fused;      /* a step has joined the tokens into one */
    int incomplete; /* the text ends inside a character that more bytes could complete */
    tok_buf_t tmp;
    pcre2_match_data *md; /* created by the first Replace with a regex */
} dec_run_t;

typedef int (*dec_parse_fn)(tokenizer_t *t, const json_t *o, hf_dec_t *d);
/* Decodes the tokens of in into out (empty on entry). */
typedef int (*dec_apply_fn)(const tokenizer_t *t, const hf_dec_t *d, const dtoks_t *in,
                            dtoks_t *out, dec_run_t *run);

struct hf_dec_kind {
    const char *name;
    dec_parse_fn parse; /* NULL: no options */
    dec_apply_fn apply;
};

/* ---- applying --------------------------------------------------------------------------- */

static int dec_replace(const tokenizer_t *t, const hf_dec_t *d, const dtoks_t *in, dtoks_t *out,
                       dec_run_t *run)
{
    tok_buf_t *tmp = &run->tmp;
    int err = 0;
    if (d->pat.re && !run->md && !(run->md = pcre2_match_data_create(8, NULL)))
        return RIVER_ENOMEM;
    for (size_t i = 0; i < in->n && !err; i++) {
        tmp->len = 0;
        err = hf_replace_all(t, &d->pat, in->text.p + in->off[i], in->len[i], d->text, d->text_len,
                             tmp, run->md);
        if (!err)
            err = dtoks_add(out, tmp->p ? tmp->p : "", tmp->len);
    }
    return err;
}

static int dec_bytefallback(const tokenizer_t *t, const hf_dec_t *d, const dtoks_t *in,
                            dtoks_t *out, dec_run_t *run)
{
    (void)t, (void)d;
    tok_buf_t *tmp = &run->tmp;
    int err = 0;
    tmp->len = 0;
    for (size_t i = 0; i < in->n && !err; i++) {
        const char *s = in->text.p + in->off[i];
        int byte = hf_byte_token(s, in->len[i]);
        if (byte >= 0) {
            err = tok_buf_putc(tmp, byte);
            continue;
        }
        err = byte_group_flush(out, tmp, run->win->raw_bytes);
        if (!err)
            err = dtoks_add(out, s, in->len[i]);
    }
    if (!err)
        err = byte_group_flush(out, tmp, run->win->raw_bytes);
    return err;
}

static int dec_fuse(const tokenizer_t *t, const hf_dec_t *d, const dtoks_t *in, dtoks_t *out,
                    dec_run_t *run)
{
    (void)t, (void)d;
    run->fused = 1;
    return dtoks_add(out, in->text.p ? in->text.p : "", in->text.len);
}

static int dec_strip(const tokenizer_t *t, const hf_dec_t *d, const dtoks_t *in, dtoks_t *out,
                     dec_run_t *run)
{
    (void)t;
    int err = 0;
    for (size_t i = 0; i < in->n && !err; i++) {
        const char *s = in->text.p + in->off[i];
        size_t a = 0, b = in->len[i];
        /* After Fuse the single token is the whole text: its start is the text's start
         * only outside a continuation, its end the text's end only at a closed end. */
        int start = (i == 0 && run->win->cont && run->fused) ? 0 : d->start;
        int stop = (run->win->open_end && run->fused) ? 0 : d->stop;
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
}

static int dec_bytelevel(const tokenizer_t *t, const hf_dec_t *d, const dtoks_t *in, dtoks_t *out,
                         dec_run_t *run)
{
    (void)d;
    const hf_tok_t *h = t->hf;
    tok_buf_t *tmp = &run->tmp;
    int err = 0;
    tmp->len = 0;
    for (size_t i = 0; i < in->n && !err; i++) {
        const char *s = in->text.p + in->off[i];
        size_t n = in->len[i], mark = tmp->len;
        int mapped = 1;
        for (size_t p = 0; p < n && mapped;) {
            int32_t c = text_utf8_next(s, n, &p);
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
    run->fused = 1;
    if (run->win->raw_bytes)
        return dtoks_add(out, tmp->p ? tmp->p : "", tmp->len);
    tok_buf_t lossy = {0};
    err = tok_utf8_lossy(&lossy, tmp->p ? tmp->p : "", tmp->len, &run->incomplete);
    if (!err)
        err = dtoks_add(out, lossy.p ? lossy.p : "", lossy.len);
    tok_buf_free(&lossy);
    return err;
}

static int dec_metaspace(const tokenizer_t *t, const hf_dec_t *d, const dtoks_t *in, dtoks_t *out,
                         dec_run_t *run)
{
    (void)t;
    tok_buf_t *tmp = &run->tmp;
    int err = 0;
    for (size_t i = 0; i < in->n && !err; i++) {
        const char *s = in->text.p + in->off[i];
        size_t n = in->len[i];
        int drop = i == 0 && !run->win->cont && d->prepend != PREPEND_NEVER;
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

/* ---- reading ---------------------------------------------------------------------------- */

static int parse_replace(tokenizer_t *t, const json_t *o, hf_dec_t *d)
{
    size_t n = 0;
    int err = hf_pat_parse(t, o, "Replace decoder", &d->pat);
    if (err)
        return err;
    const char *s = hf_jstr(o, "content", &n);
    if (!s)
        return river_err_set(RIVER_EFORMAT, "%s: Replace decoder without content", t->path);
    if (!(d->text = hf_dupn(s, n)))
        return river_err_set(RIVER_ENOMEM, "%s: no memory", t->path);
    d->text_len = n;
    return 0;
}

static int parse_bytefallback(tokenizer_t *t, const json_t *o, hf_dec_t *d)
{
    (void)o, (void)d;
    t->hf->dec_bytefallback = 1;
    return 0;
}

static int parse_strip(tokenizer_t *t, const json_t *o, hf_dec_t *d)
{
    int64_t a = 0, b = 0;
    size_t n = 0;
    const char *s = hf_jstr(o, "content", &n);
    int err = hf_one_char(t, "Strip decoder content", s, n, d->ch, &d->ch_len);
    if (err)
        return err;
    if ((json_object_get(o, "start") && !hf_jint(json_object_get(o, "start"), &a)) ||
        (json_object_get(o, "stop") && !hf_jint(json_object_get(o, "stop"), &b)) || a < 0 ||
        b < 0 || a > 1000000 || b > 1000000)
        return river_err_set(RIVER_EFORMAT, "%s: Strip decoder with bad start/stop", t->path);
    d->start = (int)a;
    d->stop = (int)b;
    return 0;
}

static int parse_metaspace(tokenizer_t *t, const json_t *o, hf_dec_t *d)
{
    size_t n = 0;
    const char *s = hf_jstr(o, "replacement", &n);
    if (!s) {
        s = "\xE2\x96\x81";
        n = 3;
    }
    int err = hf_one_char(t, "Metaspace replacement", s, n, d->ch, &d->ch_len);
    if (err)
        return err;
    d->prepend = hf_prepend_scheme(o, PREPEND_ALWAYS);
    return 0;
}

static const hf_dec_kind_t dec_kinds[] = {
    {"Replace", parse_replace, dec_replace},
    {"ByteFallback", parse_bytefallback, dec_bytefallback},
    {"Fuse", NULL, dec_fuse},
    {"Strip", parse_strip, dec_strip},
    {"ByteLevel", NULL, dec_bytelevel},
    {"Metaspace", parse_metaspace, dec_metaspace},
};

int hf_parse_dec(tokenizer_t *t, const json_t *o, int depth)
{
    hf_tok_t *h = t->hf;
    const void *kind;
    hf_kinds_t kinds = {dec_kinds, sizeof dec_kinds / sizeof dec_kinds[0], sizeof dec_kinds[0]};
    int head = hf_parse_step(t, o, depth, "decoder", "decoders", hf_parse_dec, kinds, &kind);
    if (head)
        return head < 0 ? head : 0;
    hf_dec_t *d = hf_step_new((void **)&h->dec, &h->n_dec, sizeof *d);
    if (!d)
        return river_err_set(RIVER_ENOMEM, "%s: no memory", t->path);
    d->kind = kind;
    return d->kind->parse ? d->kind->parse(t, o, d) : 0;
}

/* ---- decoding --------------------------------------------------------------------------- */

int tok_hf_decode(const tokenizer_t *t, const int32_t *ids, size_t n, int skip_special,
                  tok_window_t *win, tok_buf_t *out)
{
    const hf_tok_t *h = t->hf;
    dtoks_t a = {0}, b = {0};
    dec_run_t run = {.win = win};
    int err = 0;
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
        if (d->kind->apply == dec_strip && run.fused && d->stop > 0) {
            strip = d;
            strip_stop = d->stop;
        }
        err = d->kind->apply(t, d, cur, nxt, &run);
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
        if (run.incomplete && len >= 3 && memcmp(s + len - 3, "\xEF\xBF\xBD", 3) == 0)
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
    if (run.md)
        pcre2_match_data_free(run.md);
    dtoks_free(&a);
    dtoks_free(&b);
    tok_buf_free(&run.tmp);
    return err;
}
