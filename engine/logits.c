#include "engine/logits.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"

/* Longest token the vocabulary takes; real vocabularies stay far below it. */
#define LOGITS_TOKEN_MAX 1024

int logits_vocab_new(grammar_vocab_t **out, const tokenizer_t *tok, const model_config_t *c)
{
    *out = NULL;
    if (!tok)
        return river_err_set(RIVER_EINVAL, "a grammar needs the model's tokenizer");
    int n = c->vocab_size;
    int e = RIVER_ENOMEM;
    char **bytes = calloc((size_t)n, sizeof *bytes);
    size_t *lens = calloc((size_t)n, sizeof *lens);
    char *buf = malloc(LOGITS_TOKEN_MAX);
    if (!bytes || !lens || !buf) {
        river_err_set(e, "grammar vocabulary of %d tokens", n);
        goto fail;
    }
    int n_tok = tokenizer_vocab_size(tok);
    for (int id = 0; id < n && id < n_tok; id++) {
        size_t len = 0;
        /* Ids past the tokenizer's (padding rows of the head) and special tokens stay out. */
        if (tokenizer_is_special(tok, id))
            continue;
        if ((e = tokenizer_token_bytes(tok, id, buf, LOGITS_TOKEN_MAX, &len)))
            goto fail;
        if (len == 0)
            continue;
        if (!(bytes[id] = malloc(len))) {
            e = river_err_set(RIVER_ENOMEM, "grammar vocabulary");
            goto fail;
        }
        memcpy(bytes[id], buf, len);
        lens[id] = len;
    }
    e = grammar_vocab_new(out, (const char *const *)bytes, lens, n, c->eos_ids, c->n_eos);
fail:
    for (int id = 0; bytes && id < n; id++)
        free(bytes[id]);
    free(bytes);
    free(lens);
    free(buf);
    return e;
}

int logits_mask(grammar_state_t *st, int vocab, uint32_t *allowed, float *row)
{
    int e = grammar_state_mask(st, allowed);
    if (e)
        return e;
    int left = 0;
    for (int w = 0; w < (vocab + 31) / 32; w++) {
        uint32_t bits = allowed[w];
        int base = w * 32, end = base + 32 < vocab ? base + 32 : vocab;
        /* Whole words of allowed or refused ids are the common case inside a value. */
        if (bits == 0) {
            for (int id = base; id < end; id++)
                row[id] = -INFINITY;
            continue;
        }
        for (int id = base; id < end; id++) {
            if (bits >> (id - base) & 1)
                left++;
            else
                row[id] = -INFINITY;
        }
    }
    return left;
}

void logits_logprob(const float *row, int vocab, int32_t id, int n_top, logits_logprob_t *lp)
{
    float mx = -INFINITY;
    for (int i = 0; i < vocab; i++)
        mx = row[i] > mx ? row[i] : mx;
    double sum = 0;
    for (int i = 0; i < vocab; i++)
        sum += exp((double)(row[i] - mx));
    float lse = mx + (float)log(sum);
    lp->id = id;
    lp->logprob = row[id] == -INFINITY ? -INFINITY : row[id] - lse;
    if (n_top > LOGITS_TOP_MAX)
        n_top = LOGITS_TOP_MAX;
    /* Insertion into a short sorted list: most ids fail the first comparison. */
    int k = 0;
    for (int i = 0; i < vocab && n_top > 0; i++) {
        float v = row[i];
        if (v == -INFINITY || (k == n_top && v <= row[lp->top_ids[k - 1]]))
            continue;
        int j = k < n_top ? k++ : k - 1;
        while (j > 0 && row[lp->top_ids[j - 1]] < v) {
            lp->top_ids[j] = lp->top_ids[j - 1];
            j--;
        }
        lp->top_ids[j] = i;
    }
    lp->n_top = k;
    for (int j = 0; j < k; j++)
        lp->top_logprobs[j] = row[lp->top_ids[j]] - lse;
}
