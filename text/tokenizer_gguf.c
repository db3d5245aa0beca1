/* Tokenizers from a GGUF file's tokenizer.ggml.* metadata, built as the tokenizer.json the
 * arrays describe and loaded by the Hugging Face path (tokenizer_hf.c), so both kinds reuse
 * its components:
 *  - model "llama" (SentencePiece BPE with scores): a BPE model with byte fallback whose
 *    merges are rebuilt from the scores the way Hugging Face converts a SentencePiece model
 *    (every split of a normal token into two vocabulary pieces, ranked by the token's score,
 *    highest first), so the lowest-rank merge is the pair whose concatenation scores
 *    highest: SentencePiece's and llama.cpp's rule. The normalizer prepends U+2581 when
 *    tokenizer.ggml.add_space_prefix (default true) and turns spaces into it; the decoder
 *    reverses that.
 *  - model "gpt2" (byte-level BPE with merges): the split regex named by tokenizer.ggml.pre
 *    (llama-bpe, qwen2; gpt-2/default use ByteLevel's own) and ByteLevel.
 * Token types pick the added tokens: control and unknown ones are special, user-defined
 * ones are matched in the text but not special. bos/eos come from their ids, and
 * add_bos_token / add_eos_token make the post-processor's template. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/gguf.h"
#include "text/tokenizer_internal.h"

/* The longest token whose splits become merges (bytes). */
#define SPM_MAX_PIECE 512

enum { TT_NORMAL = 1, TT_UNKNOWN = 2, TT_CONTROL = 3, TT_USER = 4, TT_UNUSED = 5, TT_BYTE = 6 };

static const struct {
    const char *pre;
    const char *regex; /* NULL: ByteLevel's own split */
    int nfc;
    int ignore_merges;
} pre_table[] = {
    {"llama-bpe", "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
                  "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+", 0, 1},
    {"llama3", "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
               "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+", 0, 1},
    {"qwen2", "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
              "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+", 1, 0},
    {"gpt-2", NULL, 0, 0},
    {"default", NULL, 0, 0},
};

typedef struct split {
    int32_t left, right;
} split_t;

typedef struct cand {
    float score;
    int32_t id;
} cand_t;

static int cand_cmp(const void *a, const void *b)
{
    const cand_t *x = a, *y = b;
    if (x->score != y->score)
        return x->score > y->score ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

static json_t *jstrn(const char *s, size_t n)
{
    return json_stringn(s, n);
}

/* The SentencePiece merges, as [left, right] pairs. */
static int spm_merges(const tokenizer_t *t, const gguf_kv_t *toks, const gguf_kv_t *scores,
                      const gguf_kv_t *types, json_t *merges)
{
    uint64_t n = toks->n;
    tok_map_t map = {0};
    cand_t *c = malloc(sizeof *c * (size_t)(n ? n : 1));
    int err = 0;
    if (!c || tok_map_init(&map, (size_t)n)) {
        err = river_err_set(RIVER_ENOMEM, "%s: merges", t->path);
        goto out;
    }
    size_t nc = 0;
    for (uint64_t i = 0; i < n; i++) {
        size_t len;
        const char *s = gguf_arr_str(toks, i, &len);
        if (tok_map_put(&map, s, len, (int32_t)i, 0, NULL)) {
            err = river_err_set(RIVER_ENOMEM, "%s: merges", t->path);
            goto out;
        }
        int type = types ? (int)gguf_arr_int(types, i) : TT_NORMAL;
        if (type == TT_NORMAL || type == TT_USER)
            c[nc++] = (cand_t){scores ? (float)gguf_arr_float(scores, i) : 0, (int32_t)i};
    }
    qsort(c, nc, sizeof *c, cand_cmp);
    split_t sp[256];
    for (size_t k = 0; k < nc; k++) {
        size_t len;
        const char *s = gguf_arr_str(toks, (uint64_t)c[k].id, &len);
        /* Splitting costs the token's length squared; no real piece is this long, and a
         * hostile one must not stall the load. */
        if (len > SPM_MAX_PIECE)
            continue;
        int ns = 0;
        for (size_t cut = 1; cut < len && ns < 256; cut++) {
            if (((unsigned char)s[cut] & 0xC0) == 0x80)
                continue; /* inside a character */
            int32_t l = tok_map_get(&map, s, cut), r = tok_map_get(&map, s + cut, len - cut);
            if (l < 0 || r < 0)
                continue;
            /* Insertion by (left id, right id), as Hugging Face orders one token's pairs. */
            int j = ns++;
            while (j > 0 && (sp[j - 1].left > l || (sp[j - 1].left == l && sp[j - 1].right > r))) {
                sp[j] = sp[j - 1];
                j--;
            }
            sp[j] = (split_t){l, r};
        }
        for (int j = 0; j < ns; j++) {
            size_t ll, rl;
            const char *ls = gguf_arr_str(toks, (uint64_t)sp[j].left, &ll);
            const char *rs = gguf_arr_str(toks, (uint64_t)sp[j].right, &rl);
            json_t *pair = json_array();
            if (!pair || json_array_append_new(pair, jstrn(ls, ll)) ||
                json_array_append_new(pair, jstrn(rs, rl)) || json_array_append_new(merges, pair)) {
                err = river_err_set(RIVER_ENOMEM, "%s: merges", t->path);
                goto out;
            }
        }
    }
out:
    free(c);
    tok_map_free(&map);
    return err;
}

static json_t *template_post(const gguf_kv_t *toks, int add_bos, int bos, int add_eos, int eos)
{
    json_t *single = json_array(), *specials = json_object();
    int ids[2] = {add_bos ? bos : -1, add_eos ? eos : -1};
    for (int k = 0; k < 2; k++) {
        if (k == 1)
            json_array_append_new(single, json_pack("{s:{s:s,s:i}}", "Sequence", "id", "A",
                                                    "type_id", 0));
        if (ids[k] < 0)
            continue;
        size_t len;
        const char *s = gguf_arr_str(toks, (uint64_t)ids[k], &len);
        json_t *name = jstrn(s, len);
        json_array_append_new(single, json_pack("{s:{s:O,s:i}}", "SpecialToken", "id", name,
                                                "type_id", 0));
        json_t *st = json_pack("{s:O,s:[i],s:[O]}", "id", name, "ids", ids[k], "tokens", name);
        json_object_setn_new(specials, s, len, st);
        json_decref(name);
    }
    return json_pack("{s:s,s:o,s:O,s:o}", "type", "TemplateProcessing", "single", single,
                     "pair", single, "special_tokens", specials);
}

int tok_gguf_load(tokenizer_t *t, int vocab_size_hint)
{
    gguf_t *g;
    int err = gguf_open(&g, t->path);
    if (err)
        return err;
    json_t *root = NULL;
    char *text = NULL;
    const gguf_kv_t *toks, *scores = NULL, *types = NULL, *merges = NULL;
    const char *model, *pre = NULL;
    size_t model_len, pre_len = 0;
    if ((err = gguf_get_str(g, "tokenizer.ggml.model", &model, &model_len)) ||
        (err = gguf_get_arr(g, "tokenizer.ggml.tokens", GGUF_TYPE_STRING, &toks)))
        goto out;
    int spm = model_len == 5 && !memcmp(model, "llama", 5);
    int gpt2 = model_len == 4 && !memcmp(model, "gpt2", 4);
    if (!spm && !gpt2) {
        err = river_err_set(RIVER_EUNSUPPORTED, "%s: key 'tokenizer.ggml.model' is '%.*s'; River "
                            "reads 'llama' and 'gpt2' tokenizers", t->path, (int)model_len, model);
        goto out;
    }
    if (toks->n == 0 || toks->n > (1u << 24)) {
        err = river_err_set(RIVER_EFORMAT, "%s: key 'tokenizer.ggml.tokens' holds %llu tokens",
                            t->path, (unsigned long long)toks->n);
        goto out;
    }
    if (vocab_size_hint > 0 && toks->n > (uint64_t)vocab_size_hint) {
        err = river_err_set(RIVER_EFORMAT, "%s: key 'tokenizer.ggml.tokens' holds %llu tokens, "
                            "more than the model's vocabulary of %d", t->path,
                            (unsigned long long)toks->n, vocab_size_hint);
        goto out;
    }
    struct {
        const char *key;
        gguf_type_t type;
        const gguf_kv_t **out;
    } arrs[] = {{"tokenizer.ggml.scores", GGUF_TYPE_FLOAT32, &scores},
                {"tokenizer.ggml.token_type", GGUF_TYPE_INT32, &types},
                {"tokenizer.ggml.merges", GGUF_TYPE_STRING, &merges}};
    for (size_t i = 0; i < 3; i++) {
        if ((err = gguf_get_arr(g, arrs[i].key, arrs[i].type, arrs[i].out)) == RIVER_ENOTFOUND) {
            err = 0;
            continue;
        }
        if (err)
            goto out;
        if (i < 2 && (*arrs[i].out)->n != toks->n) {
            err = river_err_set(RIVER_EFORMAT, "%s: key '%s' holds %llu values for %llu tokens",
                                t->path, arrs[i].key, (unsigned long long)(*arrs[i].out)->n,
                                (unsigned long long)toks->n);
            goto out;
        }
    }
    int bos = -1, eos = -1, unk = -1, add_bos = spm, add_eos = 0, space = 1;
    struct {
        const char *key;
        int *v;
        int is_bool;
    } ints[] = {{"tokenizer.ggml.bos_token_id", &bos, 0},
                {"tokenizer.ggml.eos_token_id", &eos, 0},
                {"tokenizer.ggml.unknown_token_id", &unk, 0},
                {"tokenizer.ggml.add_bos_token", &add_bos, 1},
                {"tokenizer.ggml.add_eos_token", &add_eos, 1},
                {"tokenizer.ggml.add_space_prefix", &space, 1}};
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
        err = ints[i].is_bool ? gguf_get_bool(g, ints[i].key, ints[i].v)
                              : gguf_get_int(g, ints[i].key, ints[i].v);
        if (err == RIVER_ENOTFOUND)
            err = 0;
        if (err)
            goto out;
        if (!ints[i].is_bool && (*ints[i].v < -1 || *ints[i].v >= (int64_t)toks->n)) {
            err = river_err_set(RIVER_ERANGE, "%s: key '%s' is %d, outside the %llu tokens",
                                t->path, ints[i].key, *ints[i].v, (unsigned long long)toks->n);
            goto out;
        }
    }
    river_err_clear();
    if ((add_bos && bos < 0) || (add_eos && eos < 0))
        add_bos = add_eos = 0;
    if (gpt2) {
        if ((err = gguf_get_str(g, "tokenizer.ggml.pre", &pre, &pre_len)) == RIVER_ENOTFOUND) {
            pre = "default", pre_len = 7, err = 0;
        } else if (err) {
            goto out;
        }
        if (!merges) {
            err = river_err_set(RIVER_ENOTFOUND, "%s: no key 'tokenizer.ggml.merges' for a "
                                "gpt2 tokenizer", t->path);
            goto out;
        }
    }

    root = json_object();
    json_t *vocab = json_object(), *added = json_array(), *jm = json_array();
    json_t *bpe = json_object();
    /* Everything hangs off root at once, so every exit below frees it with root. */
    json_object_set_new(root, "version", json_string("1.0"));
    json_object_set_new(root, "added_tokens", added);
    json_object_set_new(root, "model", bpe);
    json_object_set_new(bpe, "vocab", vocab);
    json_object_set_new(bpe, "merges", jm);
    for (uint64_t i = 0; i < toks->n; i++) {
        size_t len;
        const char *s = gguf_arr_str(toks, i, &len);
        int type = types ? (int)gguf_arr_int(types, i) : TT_NORMAL;
        if ((int)i == unk)
            type = TT_UNKNOWN;
        if (!text_utf8_valid(s, len)) {
            err = river_err_set(RIVER_EFORMAT, "%s: key 'tokenizer.ggml.tokens': token %llu is "
                                "not UTF-8", t->path, (unsigned long long)i);
            goto out;
        }
        json_object_setn_new(vocab, s, len, json_integer((json_int_t)i));
        if (type == TT_CONTROL || type == TT_UNKNOWN || type == TT_USER)
            json_array_append_new(added, json_pack("{s:I,s:s%,s:b,s:b,s:b,s:b,s:b}", "id",
                                                   (json_int_t)i, "content", s, len,
                                                   "single_word", 0, "lstrip", 0, "rstrip", 0,
                                                   "normalized", 0, "special",
                                                   type != TT_USER));
        if (type == TT_UNKNOWN && unk < 0)
            unk = (int)i;
    }
    if (spm) {
        if ((err = spm_merges(t, toks, scores, types, jm)))
            goto out;
    } else {
        for (uint64_t i = 0; i < merges->n; i++) {
            size_t len;
            const char *s = gguf_arr_str(merges, i, &len);
            json_array_append_new(jm, jstrn(s, len));
        }
    }
    json_object_set_new(bpe, "type", json_string("BPE"));
    json_object_set_new(bpe, "dropout", json_null());
    json_object_set_new(bpe, "fuse_unk", json_boolean(spm));
    json_object_set_new(bpe, "byte_fallback", json_boolean(spm));
    json_object_set_new(bpe, "ignore_merges", json_false());
    if (unk >= 0) {
        size_t len;
        const char *s = gguf_arr_str(toks, (uint64_t)unk, &len);
        json_object_set_new(bpe, "unk_token", jstrn(s, len));
    }
    if (spm) {
        json_t *rep = json_pack("{s:s,s:{s:s},s:s}", "type", "Replace", "pattern", "String",
                                " ", "content", "\xE2\x96\x81");
        json_object_set_new(root, "normalizer",
                            space ? json_pack("{s:s,s:[{s:s,s:s},o]}", "type", "Sequence",
                                              "normalizers", "type", "Prepend", "prepend",
                                              "\xE2\x96\x81", rep)
                                  : rep);
        json_object_set_new(root, "pre_tokenizer", json_null());
        json_t *dec = json_pack("{s:s,s:[{s:s,s:{s:s},s:s},{s:s},{s:s}]}", "type", "Sequence",
                                "decoders", "type", "Replace", "pattern", "String",
                                "\xE2\x96\x81", "content", " ", "type", "ByteFallback", "type",
                                "Fuse");
        if (space)
            json_array_append_new(json_object_get(dec, "decoders"),
                                  json_pack("{s:s,s:s,s:i,s:i}", "type", "Strip", "content",
                                            " ", "start", 1, "stop", 0));
        json_object_set_new(root, "decoder", dec);
    } else {
        int k = -1;
        for (size_t i = 0; i < sizeof pre_table / sizeof pre_table[0]; i++)
            if (strlen(pre_table[i].pre) == pre_len && !memcmp(pre_table[i].pre, pre, pre_len))
                k = (int)i;
        if (k < 0) {
            err = river_err_set(RIVER_EUNSUPPORTED, "%s: key 'tokenizer.ggml.pre' is '%.*s'; "
                                "River knows llama-bpe, qwen2, gpt-2 and default", t->path,
                                (int)pre_len, pre);
            goto out;
        }
        json_object_set_new(bpe, "ignore_merges", json_boolean(pre_table[k].ignore_merges));
        json_t *bl = json_pack("{s:s,s:b,s:b,s:b}", "type", "ByteLevel", "add_prefix_space", 0,
                               "trim_offsets", 0, "use_regex", pre_table[k].regex == NULL);
        json_object_set_new(root, "normalizer",
                            pre_table[k].nfc ? json_pack("{s:s}", "type", "NFC") : json_null());
        json_object_set_new(root, "pre_tokenizer",
                            pre_table[k].regex
                                ? json_pack("{s:s,s:[{s:s,s:{s:s},s:s,s:b},o]}", "type",
                                            "Sequence", "pretokenizers", "type", "Split",
                                            "pattern", "Regex", pre_table[k].regex, "behavior",
                                            "Isolated", "invert", 0, bl)
                                : bl);
        json_object_set_new(root, "decoder", json_pack("{s:s,s:b,s:b,s:b}", "type", "ByteLevel",
                                                       "add_prefix_space", 1, "trim_offsets", 1,
                                                       "use_regex", 1));
    }
    json_t *post = add_bos || add_eos ? template_post(toks, add_bos, bos, add_eos, eos)
                                      : json_null();
    json_object_set_new(root, "post_processor", post);
    text = json_dumps(root, JSON_COMPACT);
    if (!text) {
        err = river_err_set(RIVER_ENOMEM, "%s: tokenizer", t->path);
        goto out;
    }
    if ((err = tok_hf_load(t, text, strlen(text))))
        goto out;
    /* The ids the file names win over anything a tokenizer_config.json beside it says. */
    t->bos_id = bos;
    t->eos_id = eos;
out:
    free(text);
    json_decref(root);
    gguf_destroy(&g);
    return err;
}
