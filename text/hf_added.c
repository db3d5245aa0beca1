/* Added tokens of a Hugging Face tokenizer.json: reading added_tokens, building the two
 * leftmost-longest matchers (tokens matched in the raw text, and tokens matched in the
 * normalized text), and splitting text at their matches as AddedVocabulary::find_matches
 * does. */
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "text/hf_internal.h"

void hf_matcher_free(hf_matcher_t *m)
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

/* Whether [ms, me) lies wholly inside one of the allowed spans. */
static int hf_added__allowed(const hf_allow_t *allow, size_t ms, size_t me)
{
    size_t lo = 0, hi = allow->n;
    while (lo < hi) { /* the first span ending after ms */
        size_t mid = lo + (hi - lo) / 2;
        if (allow->v[mid].off + allow->v[mid].len <= ms)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < allow->n && allow->v[lo].off <= ms &&
           me <= allow->v[lo].off + allow->v[lo].len;
}

/* Splits s at the matches of m: matched added tokens become pieces with their id, as
 * AddedVocabulary::find_matches does (single_word, lstrip and rstrip included). */
int hf_added_split(const tokenizer_t *t, const hf_matcher_t *m, const char *s, size_t len,
                   int origin, const hf_allow_t *allow, pieces_t *out)
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
        /* A special token outside the allowed spans stays text, as the library's
         * encode_special_tokens skips the match (its text joins the gap around it). */
        if (a->special && allow && !hf_added__allowed(allow, ms, me))
            continue;
        if (a->single_word) {
            int32_t before = hf_cp_before(s, ms), after = hf_cp_at(s, len, me);
            if ((before >= 0 && hf_is_word(before)) || (after >= 0 && hf_is_word(after)))
                continue;
        }
        size_t start = ms, stop = me;
        if (a->lstrip) {
            size_t ns = ms;
            while (ns > 0) {
                size_t b = ns - 1;
                while (b > 0 && ((unsigned char)s[b] & 0xC0) == 0x80)
                    b--;
                if (!hf_is_white(hf_cp_at(s, len, b)))
                    break;
                ns = b;
            }
            start = ns > start_offset ? ns : start_offset;
        }
        if (a->rstrip) {
            while (stop < len) {
                size_t p = stop;
                if (!hf_is_white(text_utf8_next(s, len, &p)))
                    break;
                stop = p;
            }
        }
        if (start < start_offset)
            continue;
        if (start_offset < start && hf_pieces_add(out, s + start_offset, start - start_offset, -1,
                                                  origin && start_offset == 0))
            return RIVER_ENOMEM;
        if (hf_pieces_add(out, s + start, stop - start, a->id, origin && start == 0))
            return RIVER_ENOMEM;
        start_offset = stop;
        if (pos < stop)
            pos = stop;
    }
    if (start_offset < len &&
        hf_pieces_add(out, s + start_offset, len - start_offset, -1, origin && start_offset == 0))
        return RIVER_ENOMEM;
    return 0;
}

int hf_matcher_build(tokenizer_t *t, hf_matcher_t *m, int normalized)
{
    hf_tok_t *h = t->hf;
    size_t n = 0;
    for (size_t i = 0; i < h->n_added; i++)
        n += h->added[i].normalized == normalized;
    memset(m, 0, sizeof *m);
    mentry_t *e = calloc(n ? n : 1, sizeof *e);
    hf_work_t w;
    int err = hf_work_init(&w);
    if (!e || err) {
        free(e);
        hf_work_free(&w);
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
            if (normalized && (err = hf_normalize(t, a->content, a->len, &w, &s, &len)))
                break;
            if (len == 0)
                continue;
            e[k] = (mentry_t){hf_dupn(s, len), len, i, k};
            if (!e[k].pat)
                err = river_err_set(RIVER_ENOMEM, "%s: no memory", t->path);
            else
                k++;
        }
    hf_work_free(&w);
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
        hf_matcher_free(m);
        return err;
    }
    for (size_t i = 0; i < k; i++) {
        m->pat[i] = e[i].pat;
        m->len[i] = e[i].len;
        m->tok[i] = e[i].tok;
    }
    m->n = k;
    for (size_t i = 0; i < k; i++)
        m->n_special += h->added[m->tok[i]].special != 0;
    free(e);
    size_t j = 0;
    for (int b = 0; b <= 256; b++) {
        while (j < k && (unsigned char)m->pat[j][0] < b)
            j++;
        m->first[b] = (uint32_t)j;
    }
    return 0;
}

int hf_parse_added(tokenizer_t *t, const json_t *arr, int32_t *max_id)
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
        const char *c = hf_jstr(o, "content", &len);
        if (!c || !hf_jint(json_object_get(o, "id"), &id))
            return river_err_set(RIVER_EFORMAT, "%s: added_tokens[%zu] lacks an id or content",
                                 t->path, i);
        if (id < 0 || id >= (1 << 26))
            return river_err_set(RIVER_EFORMAT, "%s: added_tokens[%zu] has id %lld out of range",
                                 t->path, i, (long long)id);
        if (!text_utf8_valid(c, len))
            return river_err_set(RIVER_EFORMAT, "%s: added_tokens[%zu] is not valid UTF-8", t->path,
                                 i);
        if (len == 0)
            continue; /* the library ignores empty added tokens */
        hf_added_t *a = &h->added[h->n_added];
        if (!(a->content = hf_dupn(c, len)))
            return river_err_set(RIVER_ENOMEM, "%s: no memory", t->path);
        h->n_added++;
        a->len = len;
        a->id = (int32_t)id;
        a->special = hf_jbool(o, "special", 0);
        a->single_word = hf_jbool(o, "single_word", 0);
        a->lstrip = hf_jbool(o, "lstrip", 0);
        a->rstrip = hf_jbool(o, "rstrip", 0);
        a->normalized = hf_jbool(o, "normalized", !a->special);
        if (a->id > *max_id)
            *max_id = a->id;
    }
    return 0;
}
