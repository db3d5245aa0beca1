/* Hugging Face tokenizer.json with a BPE model, following the `tokenizers` library (0.22):
 *
 *   encode: added tokens matched in the raw text (leftmost-longest), normalizer on the rest,
 *           added tokens marked `normalized` matched in the normalized text, pre-tokenizer,
 *           BPE per pre-token, post-processor when add_special is set;
 *   decode: ids to token strings (added tokens by their content), special ones dropped when
 *           skipping, then the decoder chain (hf_decode.c).
 *
 * This file loads the file with jansson, reads the JSON values and the pipeline steps'
 * common shape, and runs the encode pipeline; the steps of each kind live in their own
 * files (see text/hf_internal.h). Normalizer, pre-tokenizer and decoder sequences are
 * flattened into lists of steps at load time. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/err.h"
#include "common/file.h"
#include "text/hf_internal.h"

/* ---- reading JSON values ---------------------------------------------------------------- */

char *hf_dupn(const char *s, size_t n)
{
    char *p = malloc(n + 1);
    if (p) {
        memcpy(p, s, n);
        p[n] = '\0';
    }
    return p;
}

const char *hf_jstr(const json_t *o, const char *key, size_t *len)
{
    json_t *v = json_object_get(o, key);
    if (!json_is_string(v))
        return NULL;
    if (len)
        *len = json_string_length(v);
    return json_string_value(v);
}

int hf_jbool(const json_t *o, const char *key, int def)
{
    json_t *v = json_object_get(o, key);
    if (json_is_boolean(v))
        return json_is_true(v);
    return def;
}

/* Integers may come as JSON integers or, from files written by other tools, as integral
 * reals. */
int hf_jint(const json_t *v, int64_t *out)
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
        hf_pat_free(&h->norm[i].pat);
        free(h->norm[i].text);
    }
    free(h->norm);
    for (size_t i = 0; i < h->n_pre; i++)
        hf_pat_free(&h->pre[i].pat);
    free(h->pre);
    for (size_t i = 0; i < h->n_dec; i++) {
        hf_pat_free(&h->dec[i].pat);
        free(h->dec[i].text);
    }
    free(h->dec);
}

void tok_hf_free(hf_tok_t *h)
{
    if (!h)
        return;
    hf_bpe_free(&h->bpe);
    hf_free_steps(h);
    for (size_t i = 0; i < h->n_added; i++)
        free(h->added[i].content);
    free(h->added);
    hf_matcher_free(&h->raw);
    hf_matcher_free(&h->normd);
    free(h->tmpl);
    tok_buf_free(&h->strs);
    free(h->str_off);
    free(h->str_len);
    free(h->flags);
    free(h);
}

/* Appends one zeroed step to a flat array. */
void *hf_step_new(void **arr, size_t *n, size_t size)
{
    char *p = realloc(*arr, (*n + 1) * size);
    if (!p)
        return NULL;
    *arr = p;
    memset(p + *n * size, 0, size);
    return p + (*n)++ * size;
}

int hf_one_char(const tokenizer_t *t, const char *what, const char *s, size_t n, char out[4],
                size_t *out_len)
{
    size_t p = 0;
    if (!s || n == 0 || !text_utf8_valid(s, n) || (text_utf8_next(s, n, &p), p != n))
        return river_err_set(RIVER_EFORMAT, "%s: %s must be a single character", t->path, what);
    memcpy(out, s, n);
    *out_len = n;
    return 0;
}

int hf_prepend_scheme(const json_t *o, int def)
{
    const char *s = hf_jstr(o, "prepend_scheme", NULL);
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

int hf_parse_step(tokenizer_t *t, const json_t *o, int depth, const char *what,
                  const char *list_key, hf_parse_step_fn self, hf_kinds_t kinds, const void **kind)
{
    const char *type = hf_jstr(o, "type", NULL);
    if (!json_is_object(o) || !type)
        return river_err_set(RIVER_EFORMAT, "%s: %s without a type", t->path, what);
    if (depth > 32)
        return river_err_set(RIVER_EFORMAT, "%s: %ss nested too deeply", t->path, what);
    if (!strcmp(type, "Sequence")) {
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
    for (size_t i = 0; i < kinds.n; i++) {
        const char *entry = (const char *)kinds.table + i * kinds.size;
        if (!strcmp(*(const char *const *)entry, type)) {
            *kind = entry;
            return 0;
        }
    }
    return river_err_set(RIVER_EUNSUPPORTED, "%s: %s type \"%s\" is not supported", t->path, what,
                         type);
}

/* ---- encode ----------------------------------------------------------------------------- */

/* Whether s (n bytes) holds the text of one of the special tokens matched after
 * normalization. */
static int hf__has_normalized_special(const tokenizer_t *t, const char *s, size_t n)
{
    const hf_tok_t *h = t->hf;
    for (size_t i = 0; i < h->normd.n; i++) {
        const hf_added_t *a = &h->added[h->normd.tok[i]];
        if (a->special && memmem(s, n, a->content, a->len))
            return 1;
    }
    return 0;
}

/* The allowed spans of a piece at raw offset ro (pl bytes), in the offsets of its
 * normalized text (nl bytes): each span's ends mapped through the normalizer by
 * normalizing the piece up to them, which is exact for the normalizers that work
 * character by character (Prepend, Replace, case and Unicode forms). Only tokenizers with
 * normalized special tokens come here, and only spans that hold a special token's text
 * are mapped (a span without one cannot hold a match), so the work is the piece's length
 * for each special token the template wrote, not for each span. *allow_out is NULL when
 * the piece lies wholly inside one span (every match allowed). */
static int hf__normalized_allow(const tokenizer_t *t, const char *piece, size_t ro, size_t pl,
                                size_t nl, const text_span_t *spans, size_t n_spans,
                                hf_work_t *w2, text_span_t **buf, size_t *cap,
                                hf_allow_t *allow, const hf_allow_t **allow_out)
{
    allow->v = *buf;
    allow->n = 0;
    *allow_out = allow;
    for (size_t i = 0; i < n_spans; i++) {
        size_t a = spans[i].off, b = spans[i].off + spans[i].len;
        if (b <= ro || a >= ro + pl)
            continue;
        a = a > ro ? a - ro : 0;
        b = b < ro + pl ? b - ro : pl;
        if (a == 0 && b == pl) {
            *allow_out = NULL;
            return 0;
        }
        if (!hf__has_normalized_special(t, piece + a, b - a))
            continue;
        size_t na = 0, nb = nl;
        const char *ns;
        int err;
        if (a > 0) {
            if ((err = hf_normalize(t, piece, a, w2, &ns, &na)))
                return err;
        }
        if (b < pl) {
            if ((err = hf_normalize(t, piece, b, w2, &ns, &nb)))
                return err;
        }
        if (allow->n == *cap) {
            size_t nc = *cap ? *cap * 2 : 16;
            text_span_t *p = realloc(*buf, nc * sizeof *p);
            if (!p)
                return river_err_set(RIVER_ENOMEM, "%s: no memory while encoding", t->path);
            *buf = p;
            *cap = nc;
            allow->v = p;
        }
        (*buf)[allow->n++] = (text_span_t){na, nb > na ? nb - na : 0};
    }
    return 0;
}

int tok_hf_encode(const tokenizer_t *t, const char *text, size_t len, int add_special,
                  const text_span_t *spans, size_t n_spans, tok_ids_t *out)
{
    const hf_tok_t *h = t->hf;
    if (!text_utf8_valid(text, len))
        return river_err_set(RIVER_EINVAL, "%s: input text is not valid UTF-8", t->path);
    hf_work_t w, w2;
    pieces_t a = {0}, b = {0};
    tok_ids_t ids = {0}, tmp = {0};
    text_span_t *nspans = NULL;
    size_t ncap = 0;
    int have_w2 = 0;
    int err = hf_work_init(&w);
    if (err)
        goto nomem;
    hf_allow_t raw_allow = {spans, n_spans}, nallow;

    /* Added tokens in the raw text, then the normalizer and the normalized added tokens on
     * the rest. The pieces of the first split cover the text in order, so ro is each one's
     * offset in it. */
    if ((err = hf_added_split(t, &h->raw, text, len, 1, spans ? &raw_allow : NULL, &a)))
        goto nomem;
    size_t ro = 0;
    for (size_t i = 0; i < a.n; ro += a.p[i].len, i++) {
        const piece_t *pc = &a.p[i];
        if (pc->id >= 0) {
            if ((err = hf_pieces_add(&b, a.text.p + pc->off, pc->len, pc->id, pc->origin)))
                goto nomem;
            continue;
        }
        const char *ns;
        size_t nl;
        if ((err = hf_normalize(t, a.text.p + pc->off, pc->len, &w, &ns, &nl)))
            goto fail;
        const hf_allow_t *allow = NULL;
        if (spans && h->normd.n_special) {
            if (!have_w2 && (err = hf_work_init(&w2)))
                goto nomem;
            have_w2 = 1;
            if ((err = hf__normalized_allow(t, a.text.p + pc->off, ro, pc->len, nl, spans,
                                            n_spans, &w2, &nspans, &ncap, &nallow, &allow)))
                goto fail;
        }
        if ((err = hf_added_split(t, &h->normd, ns, nl, pc->origin, allow, &b)))
            goto nomem;
    }

    pieces_t *cur = &b, *nxt = &a;
    for (size_t i = 0; i < h->n_pre; i++) {
        hf_pieces_reset(nxt);
        if ((err = hf_pre_step(t, &h->pre[i], cur, nxt, &w)))
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
        } else if ((err = hf_bpe_word(t, cur->text.p + pc->off, pc->len, &ids, &w))) {
            goto fail;
        }
    }

    if (add_special && h->n_tmpl && (err = hf_post_apply(h, &ids, &tmp)))
        goto nomem;
    if ((err = tok_ids_append(out, ids.p, ids.len)))
        goto nomem;
    err = 0;
    goto done;

nomem:
    err = river_err_set(RIVER_ENOMEM, "%s: no memory while encoding", t->path);
fail:
done:
    hf_work_free(&w);
    if (have_w2)
        hf_work_free(&w2);
    free(nspans);
    hf_pieces_free(&a);
    hf_pieces_free(&b);
    tok_ids_free(&ids);
    tok_ids_free(&tmp);
    return err;
}

/* ---- special ids, id strings, the whole load ----------------------------------------------- */

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
        int keep =
            (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        uint32_t cp = keep ? (uint32_t)b : (uint32_t)(256 + n++);
        char u[4];
        size_t l = text_utf8_encode(cp, u);
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
        int32_t id = v->ent[e].val;
        if (h->flags[id] & FLAG_VALID)
            continue;
        h->str_off[id] = h->strs.len;
        h->str_len[id] = v->ent[e].len;
        h->flags[id] = FLAG_VALID;
        if (tok_buf_put(&h->strs, v->keys.p + v->ent[e].off, v->ent[e].len))
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
            hf_byte_token(h->strs.p + h->str_off[id], h->str_len[id]) >= 0)
            h->flags[id] |= FLAG_BYTE;
    t->vocab_size = (int)n;
    return 0;
}

int tok_hf_load(tokenizer_t *t, const char *data, size_t len)
{
    int err;
    json_error_t je;
    json_t *root = json_loadb(data, len, JSON_ALLOW_NUL, &je);
    if (!root)
        return river_err_set(RIVER_EFORMAT, "%s: invalid JSON at line %d, column %d: %s",
                             t->path, je.line, je.column, je.text);
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
    if ((err = hf_parse_model(t, json_object_get(root, "model"), &max_id)) ||
        (err = hf_parse_added(t, json_object_get(root, "added_tokens"), &max_id)) ||
        (err = hf_parse_norm(t, json_object_get(root, "normalizer"), 0)) ||
        (err = hf_parse_pre(t, json_object_get(root, "pre_tokenizer"), 0)) ||
        (err = hf_parse_post(t, json_object_get(root, "post_processor"), 0)) ||
        (dec && !json_is_null(dec) && (err = hf_parse_dec(t, dec, 0))))
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
    if ((err = build_strings(t, max_id)) || (err = hf_matcher_build(t, &h->raw, 0)) ||
        (err = hf_matcher_build(t, &h->normd, 1)))
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
