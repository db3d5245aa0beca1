/* The BPE model of a Hugging Face tokenizer.json: reading its vocabulary, merges and options,
 * and tokenizing one pre-token. Merging runs a min-heap of (rank, position) candidates over
 * a linked list of symbols, as the library does, so a word of n characters costs O(n log n).
 * The merges live in an open-addressing table keyed by the pair of ids. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "text/hf_internal.h"

/* ---- merging ---------------------------------------------------------------------------- */
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

/* Makes room for `count` merges in all (at most half the slots used), rehashing what is
 * there. The load reserves the whole list up front, so it rehashes at most once. */
static int merge_reserve(hf_bpe_t *b, size_t count)
{
    size_t have = b->mkeys ? b->mmask + 1 : 0, slots = have ? have : 1024;
    while (count * 2 > slots)
        slots *= 2;
    if (slots == have)
        return 0;
    uint64_t *k = malloc(slots * sizeof *k), *v = malloc(slots * sizeof *v);
    if (!k || !v) {
        free(k);
        free(v);
        return RIVER_ENOMEM;
    }
    memset(k, 0xFF, slots * sizeof *k);
    size_t n = 0;
    for (size_t i = 0; i < have; i++)
        if (b->mkeys[i] != MERGE_EMPTY)
            merge_insert(k, v, slots - 1, b->mkeys[i], b->mvals[i], &n);
    free(b->mkeys);
    free(b->mvals);
    b->mkeys = k;
    b->mvals = v;
    b->mmask = slots - 1;
    b->mcount = n;
    return 0;
}

/* Later duplicates of a merge replace earlier ones, as the library's HashMap collect does. */
static int merge_put(hf_bpe_t *b, int32_t l, int32_t r, uint32_t rank, int32_t merged)
{
    if (merge_reserve(b, b->mcount + 1))
        return RIVER_ENOMEM;
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
int hf_bpe_word(const tokenizer_t *t, const char *s, size_t len, tok_ids_t *out, hf_work_t *w)
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
        (void)text_utf8_next(s, len, &j);
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

/* ---- reading -------------------------------------------------------------------------- */

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

int hf_parse_model(tokenizer_t *t, const json_t *model, int32_t *max_id)
{
    hf_tok_t *h = t->hf;
    hf_bpe_t *b = &h->bpe;
    int err;
    if (!json_is_object(model))
        return river_err_set(RIVER_EFORMAT, "%s: no \"model\" object (not a tokenizer.json?)",
                             t->path);
    const char *type = hf_jstr(model, "type", NULL);
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

    if (tok_map_init(&b->vocab, json_object_size(vocab)))
        return river_err_set(RIVER_ENOMEM, "%s: no memory", t->path);
    const char *key;
    size_t klen;
    json_t *val;
    json_object_keylen_foreach((json_t *)vocab, key, klen, val)
    {
        int64_t id = -1;
        int ok = hf_jint(val, &id);
        if ((err = vocab_add(t, key, klen, ok, id, max_id)))
            return err;
    }

    size_t len = 0;
    const char *s;
    if ((s = hf_jstr(model, "continuing_subword_prefix", &len)) && len &&
        !(b->prefix = hf_dupn(s, len)))
        return river_err_set(RIVER_ENOMEM, "%s: no memory", t->path);
    b->prefix_len = b->prefix ? len : 0;
    if ((s = hf_jstr(model, "end_of_word_suffix", &len)) && len && !(b->suffix = hf_dupn(s, len)))
        return river_err_set(RIVER_ENOMEM, "%s: no memory", t->path);
    b->suffix_len = b->suffix ? len : 0;
    if ((s = hf_jstr(model, "unk_token", &len))) {
        if (!(b->unk = hf_dupn(s, len)))
            return river_err_set(RIVER_ENOMEM, "%s: no memory", t->path);
        b->has_unk = 1;
        b->unk_id = tok_map_get(&b->vocab, s, len);
    }
    b->fuse_unk = hf_jbool(model, "fuse_unk", 0);
    b->byte_fallback = hf_jbool(model, "byte_fallback", 0);
    b->ignore_merges = hf_jbool(model, "ignore_merges", 0);
    for (int i = 0; i < 256; i++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", i);
        b->byte_id[i] = tok_map_get(&b->vocab, name, 6);
    }

    if (merges && json_array_size(merges) && merge_reserve(b, json_array_size(merges)))
        return river_err_set(RIVER_ENOMEM, "%s: no memory", t->path);
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

void hf_bpe_free(hf_bpe_t *b)
{
    tok_map_free(&b->vocab);
    free(b->mkeys);
    free(b->mvals);
    free(b->unk);
    free(b->prefix);
    free(b->suffix);
}
