/* The vocabulary as the matcher needs it: each token's bytes, and a trie of them in preorder
 * (text/grammar_internal.h), so that a walk over all tokens shares the work of common
 * prefixes and skips a whole subtree the moment its prefix is refused. */
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "text/grammar.h"
#include "text/grammar_internal.h"

static int tok_cmp(const void *a, const void *b, void *arg)
{
    const grammar_vocab_t *v = arg;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    uint32_t lx = v->len[x], ly = v->len[y];
    int c = memcmp(v->bytes + v->off[x], v->bytes + v->off[y], lx < ly ? lx : ly);
    if (c)
        return c;
    if (lx != ly)
        return lx < ly ? -1 : 1;
    return x < y ? -1 : x > y;
}

void grammar_vocab_destroy(grammar_vocab_t **vp)
{
    if (!vp || !*vp)
        return;
    grammar_vocab_t *v = *vp;
    free(v->bytes);
    free(v->off);
    free(v->len);
    free(v->stop);
    free(v->stop_ids);
    free(v->node_byte);
    free(v->node_depth);
    free(v->node_end);
    free(v->tok_lo);
    free(v->sorted);
    free(v);
    *vp = NULL;
}

int grammar_vocab_size(const grammar_vocab_t *v)
{
    return v ? v->n_tokens : 0;
}

static int build_trie(grammar_vocab_t *v)
{
    size_t total = 1;
    for (uint32_t k = 0; k < v->n_sorted; k++)
        total += v->len[v->sorted[k]];
    if (total > UINT32_MAX - 2)
        return river_err_set(RIVER_ERANGE, "grammar vocabulary: %zu bytes of tokens is too many",
                             total);
    v->node_byte = malloc(total);
    v->node_depth = malloc(total * sizeof *v->node_depth);
    v->node_end = malloc(total * sizeof *v->node_end);
    v->tok_lo = malloc((total + 1) * sizeof *v->tok_lo);
    uint32_t *end_node = malloc(((size_t)v->n_sorted + 1) * sizeof *end_node);
    uint32_t path[GRAMMAR_MAX_TOKEN_BYTES + 1];
    if (!v->node_byte || !v->node_depth || !v->node_end || !v->tok_lo || !end_node) {
        free(end_node);
        return river_err_set(RIVER_ENOMEM, "grammar vocabulary: no memory for the trie");
    }
    uint32_t n = 1, depth = 0;
    v->node_byte[0] = 0;
    v->node_depth[0] = 0;
    path[0] = 0;
    const char *prev = NULL;
    uint32_t prev_len = 0;
    for (uint32_t k = 0; k < v->n_sorted; k++) {
        const char *s = v->bytes + v->off[v->sorted[k]];
        uint32_t len = v->len[v->sorted[k]], lcp = 0;
        while (prev && lcp < len && lcp < prev_len && s[lcp] == prev[lcp])
            lcp++;
        /* Close the nodes the new token leaves; open the ones it adds. */
        for (; depth > lcp; depth--)
            v->node_end[path[depth]] = n;
        for (; depth < len; depth++) {
            v->node_byte[n] = (uint8_t)s[depth];
            v->node_depth[n] = (uint16_t)(depth + 1);
            path[depth + 1] = n++;
        }
        end_node[k] = path[len];
        prev = s;
        prev_len = len;
    }
    for (;; depth--) {
        v->node_end[path[depth]] = n;
        if (depth == 0)
            break;
    }
    /* tok_lo[i]: the first token (in sorted order) whose end node is i or after it. */
    uint32_t k = 0;
    for (uint32_t i = 0; i <= n; i++) {
        while (k < v->n_sorted && end_node[k] < i)
            k++;
        v->tok_lo[i] = k;
    }
    free(end_node);
    v->n_nodes = n;
    return 0;
}

int grammar_vocab_new(grammar_vocab_t **out, const char *const *token_bytes,
                      const size_t *token_lens, int n_tokens, const int32_t *stop_ids,
                      int n_stop)
{
    if (!out)
        return river_err_set(RIVER_EINVAL, "grammar_vocab_new: no output pointer");
    *out = NULL;
    if (!token_bytes || !token_lens || n_tokens <= 0 || n_tokens > GRAMMAR_MAX_VOCAB)
        return river_err_set(RIVER_EINVAL, "grammar_vocab_new: %d tokens (1 to %d)", n_tokens,
                             GRAMMAR_MAX_VOCAB);
    if (n_stop < 0 || (n_stop > 0 && !stop_ids))
        return river_err_set(RIVER_EINVAL, "grammar_vocab_new: bad stop token list");
    int err;
    grammar_vocab_t *v = calloc(1, sizeof *v);
    if (!v)
        return river_err_set(RIVER_ENOMEM, "grammar vocabulary: no memory");
    v->n_tokens = n_tokens;
    v->off = malloc((size_t)n_tokens * sizeof *v->off);
    v->len = calloc((size_t)n_tokens, sizeof *v->len);
    v->stop = calloc((size_t)n_tokens, 1);
    v->sorted = malloc((size_t)n_tokens * sizeof *v->sorted);
    v->stop_ids = malloc(((size_t)n_stop + 1) * sizeof *v->stop_ids);
    if (!v->off || !v->len || !v->stop || !v->sorted || !v->stop_ids)
        goto nomem;
    for (int i = 0; i < n_stop; i++) {
        if (stop_ids[i] < 0 || stop_ids[i] >= n_tokens) {
            err = river_err_set(RIVER_ERANGE, "grammar_vocab_new: stop token %d out of range",
                                (int)stop_ids[i]);
            goto fail;
        }
        if (!v->stop[stop_ids[i]])
            v->stop_ids[v->n_stop++] = stop_ids[i];
        v->stop[stop_ids[i]] = 1;
    }
    size_t total = 0;
    for (int i = 0; i < n_tokens; i++) {
        size_t l = token_bytes[i] ? token_lens[i] : 0;
        if (l > GRAMMAR_MAX_TOKEN_BYTES) {
            err = river_err_set(RIVER_ERANGE,
                                "grammar_vocab_new: token %d has %zu bytes (limit %u)", i, l,
                                (unsigned)GRAMMAR_MAX_TOKEN_BYTES);
            goto fail;
        }
        if (!v->stop[i])
            total += l;
    }
    v->bytes = malloc(total + 1);
    if (!v->bytes)
        goto nomem;
    size_t at = 0;
    for (int i = 0; i < n_tokens; i++) {
        size_t l = token_bytes[i] && !v->stop[i] ? token_lens[i] : 0;
        v->off[i] = at;
        v->len[i] = (uint32_t)l;
        if (l) {
            memcpy(v->bytes + at, token_bytes[i], l);
            at += l;
            v->sorted[v->n_sorted++] = i;
            if (l > v->max_len)
                v->max_len = (uint32_t)l;
        }
    }
    qsort_r(v->sorted, v->n_sorted, sizeof *v->sorted, tok_cmp, v);
    if ((err = build_trie(v)))
        goto fail;
    *out = v;
    return 0;
nomem:
    err = river_err_set(RIVER_ENOMEM, "grammar vocabulary: no memory");
fail:
    grammar_vocab_destroy(&v);
    return err;
}
