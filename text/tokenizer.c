/* Tokenizer front end: format detection, the public calls, and the shared helpers (buffers,
 * the string hash map, UTF-8). The formats live in tokenizer_hf.c and tokenizer_l2c.c, the
 * streaming decoder in tokenizer_stream.c. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/err.h"
#include "common/gguf.h"
#include "common/file.h"
#include "text/tokenizer.h"
#include "text/tokenizer_internal.h"

/* ---- buffers ---------------------------------------------------------------------------- */

int tok_buf_reserve(tok_buf_t *b, size_t extra)
{
    if (extra <= b->cap - b->len && b->p)
        return 0;
    if (extra > SIZE_MAX / 2 - b->len)
        return RIVER_ENOMEM;
    size_t need = b->len + extra + 1;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < need)
        cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p)
        return RIVER_ENOMEM;
    b->p = p;
    b->cap = cap - 1; /* one byte stays free for a terminating NUL */
    return 0;
}

int tok_buf_put(tok_buf_t *b, const void *s, size_t n)
{
    if (tok_buf_reserve(b, n))
        return RIVER_ENOMEM;
    if (n)
        memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
    return 0;
}

int tok_buf_putc(tok_buf_t *b, int c)
{
    char ch = (char)c;
    return tok_buf_put(b, &ch, 1);
}

void tok_buf_free(tok_buf_t *b)
{
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
}

int tok_ids_push(tok_ids_t *v, int32_t id)
{
    if (v->len == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 32;
        int32_t *p = realloc(v->p, cap * sizeof *p);
        if (!p)
            return RIVER_ENOMEM;
        v->p = p;
        v->cap = cap;
    }
    v->p[v->len++] = id;
    return 0;
}

int tok_ids_append(tok_ids_t *v, const int32_t *ids, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (tok_ids_push(v, ids[i]))
            return RIVER_ENOMEM;
    return 0;
}

void tok_ids_free(tok_ids_t *v)
{
    free(v->p);
    v->p = NULL;
    v->len = v->cap = 0;
}

/* ---- string map ------------------------------------------------------------------------- */

uint64_t tok_hash(const void *p, size_t n)
{
    /* FNV-1a with a final avalanche: keys are short token strings, so a byte loop is fast
     * enough, and the mix spreads the low bits that index the table. */
    const unsigned char *s = p;
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++) {
        h ^= s[i];
        h *= 1099511628211ULL;
    }
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    return h;
}

int tok_map_init(tok_map_t *m, size_t expected)
{
    memset(m, 0, sizeof *m);
    size_t slots = 16;
    while (slots < expected * 2 + 2)
        slots *= 2;
    m->slots = calloc(slots, sizeof *m->slots);
    if (!m->slots)
        return RIVER_ENOMEM;
    m->mask = slots - 1;
    if (expected && !(m->ent = malloc(expected * sizeof *m->ent)))
        return RIVER_ENOMEM;
    m->cap = expected;
    return 0;
}

static int map_grow_entries(tok_map_t *m)
{
    size_t cap = m->cap ? m->cap * 2 : 64;
    tok_map_entry_t *e = realloc(m->ent, cap * sizeof *e);
    if (!e)
        return RIVER_ENOMEM;
    m->ent = e;
    m->cap = cap;
    return 0;
}

static int map_rehash(tok_map_t *m)
{
    size_t slots = (m->mask + 1) * 2;
    uint32_t *s = calloc(slots, sizeof *s);
    if (!s)
        return RIVER_ENOMEM;
    for (size_t e = 0; e < m->n; e++) {
        size_t i = tok_hash(m->keys.p + m->ent[e].off, m->ent[e].len) & (slots - 1);
        while (s[i])
            i = (i + 1) & (slots - 1);
        s[i] = (uint32_t)(e + 1);
    }
    free(m->slots);
    m->slots = s;
    m->mask = slots - 1;
    return 0;
}

int32_t tok_map_get(const tok_map_t *m, const char *key, size_t len)
{
    if (!m->slots)
        return -1;
    size_t i = tok_hash(key, len) & m->mask;
    for (;;) {
        uint32_t s = m->slots[i];
        if (!s)
            return -1;
        const tok_map_entry_t *e = &m->ent[s - 1];
        if (e->len == len && memcmp(m->keys.p + e->off, key, len) == 0)
            return e->val;
        i = (i + 1) & m->mask;
    }
}

int tok_map_put(tok_map_t *m, const char *key, size_t len, int32_t val, int overwrite,
                size_t *entry)
{
    if (len > UINT32_MAX || m->n >= UINT32_MAX - 1)
        return RIVER_ENOMEM;
    if ((m->n + 1) * 2 > m->mask + 1 && map_rehash(m))
        return RIVER_ENOMEM;
    size_t i = tok_hash(key, len) & m->mask;
    for (;;) {
        uint32_t s = m->slots[i];
        if (!s)
            break;
        size_t e = s - 1;
        if (m->ent[e].len == len && memcmp(m->keys.p + m->ent[e].off, key, len) == 0) {
            if (overwrite)
                m->ent[e].val = val;
            if (entry)
                *entry = e;
            return 0;
        }
        i = (i + 1) & m->mask;
    }
    if (m->n == m->cap && map_grow_entries(m))
        return RIVER_ENOMEM;
    size_t off = m->keys.len;
    if (tok_buf_put(&m->keys, key, len))
        return RIVER_ENOMEM;
    m->ent[m->n] = (tok_map_entry_t){off, (uint32_t)len, val};
    m->slots[i] = (uint32_t)(m->n + 1);
    if (entry)
        *entry = m->n;
    m->n++;
    return 0;
}

void tok_map_free(tok_map_t *m)
{
    free(m->slots);
    free(m->ent);
    tok_buf_free(&m->keys);
    memset(m, 0, sizeof *m);
}

/* ---- UTF-8 ------------------------------------------------------------------------------ */

int tok_utf8_lossy(tok_buf_t *out, const char *s, size_t len, int *incomplete)
{
    static const char fffd[3] = {(char)0xEF, (char)0xBF, (char)0xBD};
    if (incomplete)
        *incomplete = 0;
    if (tok_buf_reserve(out, len))
        return RIVER_ENOMEM;
    size_t i = 0, run = 0;
    while (i < len) {
        size_t at = i;
        if ((unsigned char)s[i] < 0x80) {
            i++;
            continue;
        }
        if (text_utf8_next(s, len, &i) >= 0)
            continue;
        /* Copy the valid run before the invalid subpart, then one replacement character. */
        if (tok_buf_put(out, s + run, at - run) || tok_buf_put(out, fffd, 3))
            return RIVER_ENOMEM;
        run = i;
        if (i == len && incomplete) {
            /* The subpart reached the end after a valid lead byte: every byte after the
             * lead passed its check (a failing one would have ended the subpart earlier),
             * so more bytes could still complete the character. */
            unsigned char lead = (unsigned char)s[at];
            *incomplete = lead >= 0xC2 && lead <= 0xF4;
        }
    }
    return tok_buf_put(out, s + run, len - run);
}

/* ---- files ------------------------------------------------------------------------------ */


/* ---- public interface ------------------------------------------------------------------- */

/* A tokenizer.json is a JSON object; a llama2.c file starts with a little-endian int32
 * (max_token_length), whose first byte could be '{' only for lengths like 123, and then the
 * next three bytes hold NULs, which JSON text never does. */
static int looks_like_json(const char *data, size_t len)
{
    size_t i = 0;
    if (len >= 3 && (unsigned char)data[0] == 0xEF && (unsigned char)data[1] == 0xBB &&
        (unsigned char)data[2] == 0xBF)
        i = 3;
    while (i < len && (data[i] == ' ' || data[i] == '\t' || data[i] == '\n' || data[i] == '\r'))
        i++;
    if (i >= len || data[i] != '{')
        return 0;
    for (size_t k = i + 1; k < i + 4 && k < len; k++)
        if (data[k] == '\0')
            return 0;
    return 1;
}

int tokenizer_load(tokenizer_t **out, const char *path, int vocab_size_hint)
{
    if (!out)
        return river_err_set(RIVER_EINVAL, "tokenizer_load: no output pointer");
    *out = NULL;
    if (!path || !*path)
        return river_err_set(RIVER_EINVAL, "tokenizer_load: no path given");
    if (vocab_size_hint < 0)
        return river_err_set(RIVER_EINVAL, "%s: negative vocabulary size hint %d", path,
                             vocab_size_hint);

    int err;
    tokenizer_t *t = calloc(1, sizeof *t);
    if (!t)
        return river_err_set(RIVER_ENOMEM, "%s: no memory for the tokenizer", path);
    t->bos_id = t->eos_id = -1;

    /* A model directory stands for the tokenizer.json inside it. */
    struct stat st;
    if (stat(path, &st) != 0) {
        err = river_err_set(errno == ENOENT ? RIVER_ENOTFOUND : RIVER_EIO, "%s: %s", path,
                            strerror(errno));
        goto fail_t;
    }
    if (S_ISDIR(st.st_mode)) {
        size_t n = strlen(path);
        t->path = malloc(n + sizeof "/tokenizer.json");
        if (!t->path) {
            err = river_err_set(RIVER_ENOMEM, "%s: no memory", path);
            goto fail_t;
        }
        memcpy(t->path, path, n);
        strcpy(t->path + n, (n && path[n - 1] == '/') ? "tokenizer.json" : "/tokenizer.json");
        if (access(t->path, F_OK) != 0) {
            err = river_err_set(RIVER_ENOTFOUND, "%s: directory holds no tokenizer.json", path);
            goto fail_path;
        }
    } else {
        t->path = strdup(path);
        if (!t->path) {
            err = river_err_set(RIVER_ENOMEM, "%s: no memory", path);
            goto fail_t;
        }
    }

    /* A GGUF file carries its tokenizer in its metadata; it is mapped, never read whole. */
    if (!S_ISDIR(st.st_mode) && gguf_path_is_gguf(t->path)) {
        t->kind = TOK_KIND_HF;
        if ((err = tok_gguf_load(t, vocab_size_hint)))
            goto fail_path;
        *out = t;
        return 0;
    }
    char *data;
    size_t len;
    err = river_read_file(t->path, &data, &len);
    if (err)
        goto fail_path;
    if (len == 0) {
        err = river_err_set(RIVER_EFORMAT, "%s: empty file", t->path);
        goto fail_data;
    }
    if (looks_like_json(data, len)) {
        /* jansson does not take a byte-order mark, which some editors write. */
        size_t bom = (len >= 3 && memcmp(data, "\xEF\xBB\xBF", 3) == 0) ? 3 : 0;
        t->kind = TOK_KIND_HF;
        err = tok_hf_load(t, data + bom, len - bom);
    } else {
        t->kind = TOK_KIND_L2C;
        err = tok_l2c_load(t, data, len, vocab_size_hint);
    }
    if (err)
        goto fail_data;
    free(data);
    *out = t;
    return 0;

fail_data:
    free(data);
fail_path:
    free(t->path);
fail_t:
    free(t);
    return err;
}

void tokenizer_destroy(tokenizer_t **tp)
{
    if (!tp || !*tp)
        return;
    tokenizer_t *t = *tp;
    if (t->hf)
        tok_hf_free(t->hf);
    if (t->l2c)
        tok_l2c_free(t->l2c);
    free(t->path);
    free(t);
    *tp = NULL;
}

/* spans NULL: special tokens everywhere. */
static int tokenizer__encode(const tokenizer_t *t, const char *text, size_t len, int add_special,
                             const text_span_t *spans, size_t n_spans, int32_t **ids,
                             size_t *n_ids)
{
    if (!t || !ids || !n_ids || (!text && len))
        return river_err_set(RIVER_EINVAL, "tokenizer_encode: invalid argument");
    *ids = NULL;
    *n_ids = 0;
    tok_ids_t v = {0};
    /* A llama2.c tokenizer has no added-token matching (run.c merges all text alike), so
     * spans change nothing there. */
    int err = t->kind == TOK_KIND_HF
                  ? tok_hf_encode(t, text ? text : "", len, add_special, spans, n_spans, &v)
                  : tok_l2c_encode(t, text ? text : "", len, add_special, &v);
    if (err) {
        tok_ids_free(&v);
        return err;
    }
    if (!v.p) {
        /* Callers may free() the result whatever its length, so hand out a real block. */
        v.p = malloc(sizeof *v.p);
        if (!v.p)
            return river_err_set(RIVER_ENOMEM, "%s: no memory", t->path);
    }
    *ids = v.p;
    *n_ids = v.len;
    return 0;
}

int tokenizer_encode(const tokenizer_t *t, const char *text, size_t len, int add_special,
                     int32_t **ids, size_t *n_ids)
{
    return tokenizer__encode(t, text, len, add_special, NULL, 0, ids, n_ids);
}

int tokenizer_encode_spans(const tokenizer_t *t, const char *text, size_t len, int add_special,
                           const text_span_t *spans, size_t n_spans, int32_t **ids,
                           size_t *n_ids)
{
    static const text_span_t none[1];
    if (n_spans && !spans)
        return river_err_set(RIVER_EINVAL, "tokenizer_encode_spans: invalid argument");
    size_t end = 0;
    for (size_t i = 0; i < n_spans; i++) {
        if (spans[i].off < end || spans[i].off > len || spans[i].len > len - spans[i].off)
            return river_err_set(RIVER_EINVAL, "special-token span %zu (bytes %zu+%zu) is out "
                                 "of order or past the text's %zu bytes", i, spans[i].off,
                                 spans[i].len, len);
        end = spans[i].off + spans[i].len;
    }
    return tokenizer__encode(t, text, len, add_special, n_spans ? spans : none, n_spans, ids,
                             n_ids);
}

int tok_decode_window(const tokenizer_t *t, const int32_t *ids, size_t n, int skip_special,
                      tok_window_t *w, tok_buf_t *out)
{
    return t->kind == TOK_KIND_HF ? tok_hf_decode(t, ids, n, skip_special, w, out)
                                  : tok_l2c_decode(t, ids, n, skip_special, w, out);
}

int tokenizer_decode(const tokenizer_t *t, const int32_t *ids, size_t n, int skip_special,
                     char **text, size_t *len)
{
    if (!t || !text || (!ids && n))
        return river_err_set(RIVER_EINVAL, "tokenizer_decode: invalid argument");
    *text = NULL;
    if (len)
        *len = 0;
    tok_buf_t out = {0};
    tok_window_t w = {.cont = 0, .open_end = 0, .prev_id = -1, .hold = 0};
    int err = tok_decode_window(t, ids, n, skip_special, &w, &out);
    if (!err && !out.p)
        err = tok_buf_reserve(&out, 0);
    if (err) {
        tok_buf_free(&out);
        if (err == RIVER_ENOMEM)
            river_err_set(err, "%s: no memory while decoding", t->path);
        return err;
    }
    out.p[out.len] = '\0';
    *text = out.p;
    if (len)
        *len = out.len;
    return 0;
}

int tokenizer_token_bytes(const tokenizer_t *t, int32_t id, char *buf, size_t cap, size_t *len)
{
    *len = 0;
    if (!t || !buf || id < 0 || id >= t->vocab_size)
        return river_err_set(RIVER_ERANGE, "tokenizer_token_bytes: id %d outside the "
                             "vocabulary of %d", (int)id, t ? t->vocab_size : 0);
    /* Mid-text and open-ended, so that no start or end rule of the decoder touches it. */
    tok_window_t w = {.cont = 1, .open_end = 1, .prev_id = -1, .raw_bytes = 1};
    tok_buf_t out = {0};
    int err = tok_decode_window(t, &id, 1, 0, &w, &out);
    if (!err && out.len > cap)
        err = river_err_set(RIVER_ERANGE, "%s: token %d has %zu bytes, over %zu", t->path,
                            (int)id, out.len, cap);
    if (!err) {
        memcpy(buf, out.p ? out.p : "", out.len);
        *len = out.len;
    }
    tok_buf_free(&out);
    return err;
}

int tokenizer_vocab_size(const tokenizer_t *t)
{
    return t ? t->vocab_size : 0;
}

int tokenizer_bos_id(const tokenizer_t *t)
{
    return t ? t->bos_id : -1;
}

int tokenizer_eos_id(const tokenizer_t *t)
{
    return t ? t->eos_id : -1;
}

int tokenizer_is_special(const tokenizer_t *t, int32_t id)
{
    if (!t || id < 0 || id >= t->vocab_size)
        return 0;
    if (t->kind == TOK_KIND_HF)
        return tok_hf_is_special(t, id);
    /* llama2.c files keep SentencePiece's layout: <unk>, BOS and EOS are ids 0, 1, 2. */
    return id <= 2;
}

int tok_id_valid(const tokenizer_t *t, int32_t id)
{
    if (id < 0 || id >= t->vocab_size)
        return 0;
    return t->kind == TOK_KIND_HF ? tok_hf_id_valid(t, id) : 1;
}

int tok_is_pending(const tokenizer_t *t, int32_t id, int skip_special)
{
    /* A skipped special token adds no text, but the decoder does not see it at all, so
     * byte pieces on both sides of it join into one group: treat it like its neighbours. */
    if (skip_special && tokenizer_is_special(t, id))
        return 1;
    return t->kind == TOK_KIND_HF ? tok_hf_is_pending(t, id) : 0;
}
