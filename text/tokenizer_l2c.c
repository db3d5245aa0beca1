/* llama2.c tokenizers (tok*.bin): an int32 max_token_length, then one record per token,
 * {float32 score, int32 len, len bytes}, little-endian, until the end of the file.
 *
 * Encoding follows Karpathy's run.c encode(): BOS (with add_special), a dummy-prefix " "
 * token when the text is non-empty, one token per UTF-8 character (or byte + 3 for each byte
 * of a character missing from the vocabulary), then repeated merging of the adjacent pair
 * whose concatenation is a token with the highest score, the leftmost pair on ties. A heap
 * of candidate pairs over a linked list makes that O(n log n) instead of run.c's O(n^2). */
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "text/tokenizer_internal.h"
#include "text/hex.h"

struct l2c_tok {
    int n;
    int max_len;
    float *score;
    size_t *off;
    uint32_t *len;
    tok_buf_t pieces;
    tok_map_t map; /* piece → lowest id holding it */
    int32_t space_id;
};

void tok_l2c_free(l2c_tok_t *l)
{
    if (!l)
        return;
    free(l->score);
    free(l->off);
    free(l->len);
    tok_buf_free(&l->pieces);
    tok_map_free(&l->map);
    free(l);
}

static int32_t rd_i32(const char *p)
{
    const unsigned char *u = (const unsigned char *)p;
    return (int32_t)((uint32_t)u[0] | (uint32_t)u[1] << 8 | (uint32_t)u[2] << 16 |
                     (uint32_t)u[3] << 24);
}

static float rd_f32(const char *p)
{
    int32_t i = rd_i32(p);
    float f;
    memcpy(&f, &i, sizeof f);
    return f;
}

int tok_l2c_load(tokenizer_t *t, const char *data, size_t len, int vocab_size_hint)
{
    const char *path = t->path;
    int err;
    if (len < 4)
        return river_err_set(RIVER_ETRUNC,
                             "%s: truncated llama2.c tokenizer: %zu bytes, the header needs 4",
                             path, len);
    int32_t max_len = rd_i32(data);
    if (max_len <= 0 || max_len > (1 << 20))
        return river_err_set(RIVER_EFORMAT,
                             "%s: neither a tokenizer.json nor a llama2.c tokenizer "
                             "(max_token_length would be %d)",
                             path, (int)max_len);

    l2c_tok_t *l = calloc(1, sizeof *l);
    if (!l)
        return river_err_set(RIVER_ENOMEM, "%s: no memory", path);
    l->max_len = max_len;

    /* Count the records first, validating every length, so that the arrays are sized once
     * and a damaged file is reported before anything else is allocated. */
    size_t off = 4;
    int n = 0;
    while (off < len) {
        if (len - off < 8) {
            err = river_err_set(RIVER_ETRUNC,
                                "%s: truncated: record %d at byte %zu needs an 8-byte header, "
                                "%zu bytes left",
                                path, n, off, len - off);
            goto fail_l;
        }
        int32_t plen = rd_i32(data + off + 4);
        if (plen < 0 || plen > max_len) {
            err = river_err_set(RIVER_EFORMAT,
                                "%s: record %d at byte %zu has length %d, outside 0..%d "
                                "(max_token_length)",
                                path, n, off, (int)plen, (int)max_len);
            goto fail_l;
        }
        if ((size_t)plen > len - off - 8) {
            err = river_err_set(RIVER_ETRUNC,
                                "%s: truncated: record %d at byte %zu needs %d bytes, %zu left",
                                path, n, off, (int)plen, len - off - 8);
            goto fail_l;
        }
        off += 8 + (size_t)plen;
        if (n == INT32_MAX) {
            err = river_err_set(RIVER_EFORMAT, "%s: too many records", path);
            goto fail_l;
        }
        n++;
    }
    if (n == 0) {
        err = river_err_set(RIVER_EFORMAT, "%s: llama2.c tokenizer holds no tokens", path);
        goto fail_l;
    }
    if (vocab_size_hint > 0 && n != vocab_size_hint) {
        err = river_err_set(RIVER_EFORMAT, "%s: holds %d tokens but the model's vocabulary has %d",
                            path, n, vocab_size_hint);
        goto fail_l;
    }

    l->n = n;
    l->score = malloc((size_t)n * sizeof *l->score);
    l->off = malloc((size_t)n * sizeof *l->off);
    l->len = malloc((size_t)n * sizeof *l->len);
    if (!l->score || !l->off || !l->len || tok_map_init(&l->map, (size_t)n) ||
        tok_buf_reserve(&l->pieces, len)) {
        err = river_err_set(RIVER_ENOMEM, "%s: no memory for %d tokens", path, n);
        goto fail_l;
    }
    off = 4;
    for (int i = 0; i < n; i++) {
        int32_t plen = rd_i32(data + off + 4);
        l->score[i] = rd_f32(data + off);
        l->off[i] = l->pieces.len;
        l->len[i] = (uint32_t)plen;
        if (tok_buf_put(&l->pieces, data + off + 8, (size_t)plen) ||
            tok_map_put(&l->map, data + off + 8, (size_t)plen, i, 0, NULL)) {
            err = river_err_set(RIVER_ENOMEM, "%s: no memory for %d tokens", path, n);
            goto fail_l;
        }
        off += 8 + (size_t)plen;
    }
    l->space_id = tok_map_get(&l->map, " ", 1);

    t->l2c = l;
    t->vocab_size = n;
    t->bos_id = n > 1 ? 1 : -1;
    t->eos_id = n > 2 ? 2 : -1;
    return 0;

fail_l:
    tok_l2c_free(l);
    return err;
}

/* ---- encoding ---------------------------------------------------------------------------- */

typedef struct l2c_node {
    int32_t id;
    int32_t prev, next;
    int alive;
} l2c_node_t;

typedef struct l2c_cand {
    float score;
    int32_t left, right; /* node indices */
    int32_t left_id, right_id, merged;
} l2c_cand_t;

/* Heap order: highest score first; on equal scores the leftmost pair, which run.c's
 * left-to-right scan with a strict '>' would pick. Node indices keep the list order because
 * a merged node keeps the index of its left part. */
static int cand_before(const l2c_cand_t *a, const l2c_cand_t *b)
{
    if (a->score != b->score)
        return a->score > b->score;
    return a->left < b->left;
}

typedef struct l2c_heap {
    l2c_cand_t *p;
    size_t n, cap;
} l2c_heap_t;

static int heap_push(l2c_heap_t *h, l2c_cand_t c)
{
    if (h->n == h->cap) {
        size_t cap = h->cap ? h->cap * 2 : 64;
        l2c_cand_t *p = realloc(h->p, cap * sizeof *p);
        if (!p)
            return RIVER_ENOMEM;
        h->p = p;
        h->cap = cap;
    }
    size_t i = h->n++;
    while (i > 0) {
        size_t up = (i - 1) / 2;
        if (!cand_before(&c, &h->p[up]))
            break;
        h->p[i] = h->p[up];
        i = up;
    }
    h->p[i] = c;
    return 0;
}

static l2c_cand_t heap_pop(l2c_heap_t *h)
{
    l2c_cand_t top = h->p[0];
    l2c_cand_t last = h->p[--h->n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= h->n)
            break;
        if (c + 1 < h->n && cand_before(&h->p[c + 1], &h->p[c]))
            c++;
        if (!cand_before(&h->p[c], &last))
            break;
        h->p[i] = h->p[c];
        i = c;
    }
    if (h->n)
        h->p[i] = last;
    return top;
}

/* Adds the pair (a, b) when their concatenation is a token that run.c would merge. */
static int consider_pair(const l2c_tok_t *l, const l2c_node_t *nodes, int32_t a, int32_t b,
                         tok_buf_t *key, l2c_heap_t *heap)
{
    int32_t ia = nodes[a].id, ib = nodes[b].id;
    key->len = 0;
    if (tok_buf_put(key, l->pieces.p + l->off[ia], l->len[ia]) ||
        tok_buf_put(key, l->pieces.p + l->off[ib], l->len[ib]))
        return RIVER_ENOMEM;
    int32_t id = tok_map_get(&l->map, key->p, key->len);
    /* run.c starts its search at a best score of -1e10 and needs a strictly greater one. */
    if (id < 0 || !(l->score[id] > -1e10f))
        return 0;
    l2c_cand_t c = {l->score[id], a, b, ia, ib, id};
    return heap_push(heap, c);
}

int tok_l2c_encode(const tokenizer_t *t, const char *text, size_t len, int add_special,
                   tok_ids_t *out)
{
    const l2c_tok_t *l = t->l2c;
    tok_ids_t seq = {0};
    l2c_node_t *nodes = NULL;
    l2c_heap_t heap = {0};
    tok_buf_t key = {0};
    int err = RIVER_ENOMEM;

    if (add_special && t->bos_id >= 0 && tok_ids_push(&seq, t->bos_id))
        goto fail;
    if (len > 0 && l->space_id >= 0 && tok_ids_push(&seq, l->space_id))
        goto fail;

    /* One token per UTF-8 character as run.c groups bytes: a lead byte starts a new group,
     * continuation bytes join it, up to four bytes. */
    char buf[4];
    size_t blen = 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)text[i];
        if ((c & 0xC0) != 0x80)
            blen = 0;
        buf[blen++] = (char)c;
        unsigned char next = i + 1 < len ? (unsigned char)text[i + 1] : 0;
        if ((next & 0xC0) == 0x80 && blen < 4)
            continue;
        int32_t id = tok_map_get(&l->map, buf, blen);
        if (id >= 0) {
            if (tok_ids_push(&seq, id))
                goto fail;
        } else {
            for (size_t k = 0; k < blen; k++) {
                int32_t bid = (int32_t)(unsigned char)buf[k] + 3;
                if (bid >= l->n) {
                    err = river_err_set(RIVER_ETOKENIZER,
                                        "%s: byte 0x%02X has no byte-fallback token (vocabulary "
                                        "of %d)",
                                        t->path, (unsigned)(unsigned char)buf[k], l->n);
                    goto fail;
                }
                if (tok_ids_push(&seq, bid))
                    goto fail;
            }
        }
        blen = 0;
    }

    size_t n = seq.len;
    if (n > 1) {
        if (n > INT32_MAX) {
            err = river_err_set(RIVER_ERANGE, "%s: text too long to encode", t->path);
            goto fail;
        }
        nodes = malloc(n * sizeof *nodes);
        if (!nodes)
            goto fail;
        for (size_t i = 0; i < n; i++)
            nodes[i] = (l2c_node_t){seq.p[i], (int32_t)i - 1, i + 1 < n ? (int32_t)i + 1 : -1, 1};
        for (size_t i = 0; i + 1 < n; i++)
            if (consider_pair(l, nodes, (int32_t)i, (int32_t)i + 1, &key, &heap))
                goto fail;
        while (heap.n) {
            l2c_cand_t c = heap_pop(&heap);
            l2c_node_t *a = &nodes[c.left], *b = &nodes[c.right];
            /* Skip candidates made stale by an earlier merge of either side. */
            if (!a->alive || !b->alive || a->next != c.right || a->id != c.left_id ||
                b->id != c.right_id)
                continue;
            a->id = c.merged;
            a->next = b->next;
            if (b->next >= 0)
                nodes[b->next].prev = c.left;
            b->alive = 0;
            if (a->prev >= 0 && consider_pair(l, nodes, a->prev, c.left, &key, &heap))
                goto fail;
            if (a->next >= 0 && consider_pair(l, nodes, c.left, a->next, &key, &heap))
                goto fail;
        }
        for (int32_t i = 0; i >= 0; i = nodes[i].next)
            if (tok_ids_push(out, nodes[i].id))
                goto fail;
    } else if (n == 1 && tok_ids_push(out, seq.p[0])) {
        goto fail;
    }
    free(nodes);
    free(heap.p);
    tok_buf_free(&key);
    tok_ids_free(&seq);
    return 0;

fail:
    if (err == RIVER_ENOMEM)
        river_err_set(err, "%s: no memory while encoding", t->path);
    free(nodes);
    free(heap.p);
    tok_buf_free(&key);
    tok_ids_free(&seq);
    return err;
}

/* ---- decoding ---------------------------------------------------------------------------- */

int tok_l2c_decode(const tokenizer_t *t, const int32_t *ids, size_t n, int skip_special,
                   tok_window_t *w, tok_buf_t *out)
{
    const l2c_tok_t *l = t->l2c;
    tok_buf_t raw = {0};
    int32_t prev = w->prev_id;
    w->hold = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        if (id < 0 || id >= l->n) {
            tok_buf_free(&raw);
            return river_err_set(RIVER_ERANGE, "%s: token id %d is out of range (vocabulary of %d)",
                                 t->path, (int)id, l->n);
        }
        const char *p = l->pieces.p + l->off[id];
        size_t plen = l->len[id];
        int32_t before = prev;
        prev = id;
        if (skip_special && id <= 2)
            continue;
        /* run.c drops the leading space of the piece after BOS (SentencePiece's dummy
         * prefix) and prints "<0xNN>" pieces as the raw byte. */
        if (before == 1 && plen > 0 && p[0] == ' ') {
            p++;
            plen--;
        }
        char byte;
        if (plen == 6 && p[0] == '<' && p[1] == '0' && p[2] == 'x' && p[5] == '>' &&
            text_hex_digit(p[3]) >= 0 && text_hex_digit(p[4]) >= 0) {
            byte = (char)(text_hex_digit(p[3]) * 16 + text_hex_digit(p[4]));
            p = &byte;
            plen = 1;
        }
        if (tok_buf_put(&raw, p, plen)) {
            tok_buf_free(&raw);
            return river_err_set(RIVER_ENOMEM, "%s: no memory while decoding", t->path);
        }
    }
    /* Byte pieces may form invalid UTF-8; the text handed out is always valid, with U+FFFD
     * for what is not, and an unfinished character at an open end is held back. */
    int incomplete = 0;
    int err = w->raw_bytes ? tok_buf_put(out, raw.p ? raw.p : "", raw.len)
                           : tok_utf8_lossy(out, raw.p ? raw.p : "", raw.len, &incomplete);
    tok_buf_free(&raw);
    if (err)
        return river_err_set(RIVER_ENOMEM, "%s: no memory while decoding", t->path);
    if (w->open_end && incomplete)
        w->hold = 3;
    return 0;
}
