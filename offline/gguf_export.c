/* GGUF export (offline/gguf_export.h): metadata first, then one tensor at a time converted
 * to f32 rows, permuted where llama.cpp's rope wants it, and quantized to its type. */
#include "offline/gguf_export.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "common/err.h"
#include "common/file.h"
#include "engine/engine_open.h"
#include "kernels/half.h"
#include "model/gguf_blocks.h"
#include "offline/gguf_write.h"

/* llama.cpp's token types (tokenizer.ggml.token_type). */
enum { TT_NORMAL = 1, TT_UNKNOWN = 2, TT_CONTROL = 3, TT_USER = 4, TT_UNUSED = 5, TT_BYTE = 6 };

/* The export types: base type of the matrices, llama.cpp's general.file_type, and whether
 * it is a K mix. */
static const struct {
    const char *name;
    int base;
    int ftype;
    int kmix;
} export_types[] = {
    {"f32", GGML_TYPE_F32, 0, 0},     {"f16", GGML_TYPE_F16, 1, 0},
    {"bf16", GGML_TYPE_BF16, 32, 0},  {"q8_0", GGML_TYPE_Q8_0, 7, 0},
    {"q4_0", GGML_TYPE_Q4_0, 2, 0},   {"q4_1", GGML_TYPE_Q4_1, 3, 0},
    {"q4_k_m", GGML_TYPE_Q4_K, 15, 1}, {"q5_k_m", GGML_TYPE_Q5_K, 17, 1},
};

/* llama.cpp's use_more_bits: the first and last eighth of the layers, every third between. */
static int more_bits(int l, int n)
{
    return l < n / 8 || l >= 7 * n / 8 || (l - n / 8) % 3 == 2;
}

/* The K types need rows of 256, the others of 32: llama.cpp's fallbacks otherwise, and F16
 * for a row that takes no block at all. */
static int fit_type(int type, int64_t cols)
{
    if (cols % ggml_type_block(type) == 0)
        return type;
    switch (type) {
    case GGML_TYPE_Q4_K:
        return fit_type(GGML_TYPE_Q5_0, cols);
    case GGML_TYPE_Q5_K:
        return fit_type(GGML_TYPE_Q5_1, cols);
    case GGML_TYPE_Q6_K:
        return fit_type(GGML_TYPE_Q8_0, cols);
    default:
        return GGML_TYPE_F16;
    }
}

typedef enum { ROLE_OTHER, ROLE_OUTPUT, ROLE_V, ROLE_DOWN } role_t;

static int pick_type(int t, role_t role, int layer, int n_layers, int64_t cols)
{
    int base = export_types[t].base;
    if (base == GGML_TYPE_F32 || base == GGML_TYPE_F16 || base == GGML_TYPE_BF16 ||
        base == GGML_TYPE_Q8_0)
        return fit_type(base, cols);
    int type = base;
    if (role == ROLE_OUTPUT)
        type = GGML_TYPE_Q6_K;
    else if (export_types[t].kmix && (role == ROLE_V || role == ROLE_DOWN) &&
             more_bits(layer, n_layers))
        type = GGML_TYPE_Q6_K;
    return fit_type(type, cols);
}

/* Row r of a weight as f32 (any dtype a loaded model holds). */
static void weight_row_f32(const weight_t *w, int64_t r, float *out)
{
    const unsigned char *p =
        (const unsigned char *)w->data + (size_t)r * dtype_row_bytes(w->dtype, w->cols);
    for (int64_t c = 0; c < w->cols; c++) {
        uint16_t h;
        switch (w->dtype) {
        case DTYPE_F32:
            memcpy(&out[c], p + 4 * c, 4);
            break;
        case DTYPE_F16:
        case DTYPE_BF16:
            memcpy(&h, p + 2 * c, 2);
            out[c] = w->dtype == DTYPE_F16 ? f16_to_f32(h) : bf16_to_f32(h);
            break;
        case DTYPE_Q8:
        case DTYPE_Q4: {
            int q = w->dtype == DTYPE_Q8 ? p[c] : (p[c / 2] >> (4 * (c & 1))) & 0xF;
            int64_t g = r * (w->cols / w->group) + c / w->group;
            out[c] = ((float)q - f16_to_f32(w->zeros[g])) * f16_to_f32(w->scales[g]);
            break;
        }
        default:
            out[c] = 0;
        }
    }
}

/* Adds tensor `name` from w (rows x cols; a vector when rows is 1 and vec) in type, with its
 * rows permuted from the rotate-half layout to the interleaved one when perm_heads > 0. */
static int add_weight(gguf_writer_t *gw, const char *name, const weight_t *w, int type,
                      int vec, int perm_heads)
{
    if (w->dtype == DTYPE_Q4X8)
        return river_err_set(RIVER_EUNSUPPORTED, "export: tensor '%s' is repacked for the "
                             "CPU kernels; export from the unplaced model", name);
    int64_t rows = w->rows, cols = w->cols;
    if (vec) {
        cols = rows * cols;
        rows = 1;
        type = GGML_TYPE_F32;
    }
    size_t rb = gguf_block_row_bytes(type, cols);
    unsigned char *data = malloc(rb * (size_t)rows);
    float *row = malloc(sizeof *row * (size_t)cols);
    if (!data || !row) {
        free(data);
        free(row);
        return river_err_set(RIVER_ENOMEM, "export: tensor '%s'", name);
    }
    int64_t hd = perm_heads > 0 ? rows / perm_heads : 0;
    for (int64_t r = 0; r < rows; r++) {
        int64_t src = r;
        if (hd >= 2) {
            /* Interleaved row h*hd + 2j + s holds rotate-half row h*hd + s*hd/2 + j. */
            int64_t h = r / hd, i = r % hd;
            src = h * hd + (i % 2) * (hd / 2) + i / 2;
        }
        if (vec) {
            weight_t v = *w;
            v.rows = 1;
            v.cols = cols;
            weight_row_f32(&v, 0, row);
        } else {
            weight_row_f32(w, src, row);
        }
        gguf_block_quant(type, row, data + (size_t)r * rb, cols);
    }
    free(row);
    int64_t ne[2] = {cols, rows};
    return gguf_writer_add_tensor(gw, name, type, vec ? 1 : 2, ne, data, rb * (size_t)rows);
}

/* ---- tokenizer ---- */

typedef struct tokv {
    char **tok;     /* (n) */
    size_t *len;    /* (n) */
    float *score;   /* (n) */
    int32_t *type;  /* (n) */
    int n;
} tokv_t;

static void tokv_free(tokv_t *v)
{
    for (int i = 0; v->tok && i < v->n; i++)
        free(v->tok[i]);
    free(v->tok);
    free(v->len);
    free(v->score);
    free(v->type);
}

static int tokv_init(tokv_t *v, int n)
{
    v->n = n;
    v->tok = calloc((size_t)n, sizeof *v->tok);
    v->len = calloc((size_t)n, sizeof *v->len);
    v->score = calloc((size_t)n, sizeof *v->score);
    v->type = calloc((size_t)n, sizeof *v->type);
    return v->tok && v->len && v->score && v->type ? 0 : RIVER_ENOMEM;
}

static int tokv_set(tokv_t *v, int id, const char *s, size_t len, float score, int type)
{
    free(v->tok[id]);
    v->tok[id] = malloc(len + 1);
    if (!v->tok[id])
        return RIVER_ENOMEM;
    memcpy(v->tok[id], s, len);
    v->tok[id][len] = 0;
    v->len[id] = len;
    v->score[id] = score;
    v->type[id] = type;
    return 0;
}

static int is_byte_token(const char *s, size_t len)
{
    return len == 6 && !strncmp(s, "<0x", 3) && s[5] == '>';
}

/* Whether s is one UTF-8 character. */
static int one_char(const char *s, size_t len)
{
    unsigned char c = (unsigned char)s[0];
    size_t n = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    return len == n;
}

/* A llama2.c tok*.bin: pieces with ' ' where SentencePiece writes U+2581. */
static int tok_from_l2c(const char *path, const char *data, size_t len, tokv_t *v)
{
    size_t off = 4;
    int n = 0;
    while (off + 8 <= len) {
        int32_t plen;
        memcpy(&plen, data + off + 4, 4);
        if (plen < 0 || (size_t)plen > len - off - 8)
            return river_err_set(RIVER_EFORMAT, "%s: record %d is damaged", path, n);
        off += 8 + (size_t)plen;
        n++;
    }
    if (tokv_init(v, n))
        return river_err_set(RIVER_ENOMEM, "%s: %d tokens", path, n);
    off = 4;
    for (int i = 0; i < n; i++) {
        float score;
        int32_t plen;
        memcpy(&score, data + off, 4);
        memcpy(&plen, data + off + 4, 4);
        const char *p = data + off + 8;
        char *s = malloc(3 * (size_t)plen + 1);
        if (!s)
            return river_err_set(RIVER_ENOMEM, "%s: token", path);
        size_t k = 0;
        for (int32_t j = 0; j < plen; j++) {
            if (p[j] == ' ') {
                memcpy(s + k, "\xE2\x96\x81", 3);
                k += 3;
            } else {
                s[k++] = p[j];
            }
        }
        int type = i == 0 ? TT_UNKNOWN : i < 3 ? TT_CONTROL
                   : is_byte_token(s, k) ? TT_BYTE : TT_NORMAL;
        int e = tokv_set(v, i, s, k, score, type);
        free(s);
        if (e)
            return river_err_set(RIVER_ENOMEM, "%s: token", path);
        off += 8 + (size_t)plen;
    }
    return 0;
}

/* Whether a pre-tokenizer, normalizer or decoder (or a Sequence of them) holds `type`. */
static const json_t *json_find_type(const json_t *o, const char *type)
{
    if (!json_is_object(o))
        return NULL;
    const char *t = json_string_value(json_object_get(o, "type"));
    if (t && !strcmp(t, type))
        return o;
    const char *lists[] = {"pretokenizers", "normalizers", "decoders"};
    for (size_t k = 0; k < 3; k++) {
        const json_t *arr = json_object_get(o, lists[k]);
        for (size_t i = 0; json_is_array(arr) && i < json_array_size(arr); i++) {
            const json_t *f = json_find_type(json_array_get(arr, i), type);
            if (f)
                return f;
        }
    }
    return NULL;
}

/* llama.cpp's tokenizer.ggml.pre names of the split regexes River knows
 * (text/tokenizer_gguf.c holds the same table the other way round). */
static const struct {
    const char *pre;
    const char *regex;
} pre_table[] = {
    {"llama-bpe", "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
                  "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
    {"qwen2", "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
              "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
};

/* A tokenizer.json's BPE model as GGUF tokens. */
static int tok_from_json(const char *path, json_t *root, tokv_t *v, int vocab_size, int *gpt2,
                         const char **pre, json_t **merges_out, int *space_prefix, int *unk)
{
    json_t *model = json_object_get(root, "model");
    json_t *vocab = json_object_get(model, "vocab");
    json_t *merges = json_object_get(model, "merges");
    const char *mtype = json_string_value(json_object_get(model, "type"));
    if (!json_is_object(vocab) || (mtype && strcmp(mtype, "BPE")))
        return river_err_set(RIVER_EUNSUPPORTED, "%s: only BPE tokenizer.json models export "
                             "to GGUF", path);
    json_t *added = json_object_get(root, "added_tokens");
    int n = vocab_size;
    const char *key;
    json_t *val;
    json_object_foreach(vocab, key, val)
        if (json_integer_value(val) >= n)
            n = (int)json_integer_value(val) + 1;
    for (size_t i = 0; json_is_array(added) && i < json_array_size(added); i++) {
        json_int_t id = json_integer_value(json_object_get(json_array_get(added, i), "id"));
        if (id >= n)
            n = (int)id + 1;
    }
    if (tokv_init(v, n))
        return river_err_set(RIVER_ENOMEM, "%s: %d tokens", path, n);
    const json_t *pret = json_object_get(root, "pre_tokenizer");
    *gpt2 = json_find_type(pret, "ByteLevel") ||
            json_find_type(json_object_get(root, "decoder"), "ByteLevel");
    const json_t *norm = json_object_get(root, "normalizer");
    const json_t *meta = json_find_type(pret, "Metaspace");
    *space_prefix = json_find_type(norm, "Prepend") != NULL ||
                    (meta && strcmp(json_string_value(json_object_get(meta, "prepend_scheme"))
                                        ? json_string_value(json_object_get(meta, "prepend_scheme"))
                                        : "always", "never"));
    /* Scores for the SentencePiece-style vocabulary: minus the rank of the merge that makes
     * a token (so llama.cpp's highest-score merging follows the merge order), 0 for single
     * characters and bytes, -1e9 for what no merge makes. */
    json_t *rank = json_object();
    for (size_t i = 0; json_is_array(merges) && i < json_array_size(merges); i++) {
        json_t *m = json_array_get(merges, i);
        char buf[1024];
        if (json_is_string(m)) {
            const char *s = json_string_value(m), *sp = strchr(s, ' ');
            if (!sp)
                continue;
            snprintf(buf, sizeof buf, "%.*s%s", (int)(sp - s), s, sp + 1);
        } else if (json_is_array(m) && json_array_size(m) == 2) {
            snprintf(buf, sizeof buf, "%s%s", json_string_value(json_array_get(m, 0)),
                     json_string_value(json_array_get(m, 1)));
        } else {
            continue;
        }
        if (!json_object_get(rank, buf))
            json_object_set_new(rank, buf, json_integer((json_int_t)i));
    }
    const char *unk_tok = json_string_value(json_object_get(model, "unk_token"));
    int err = 0;
    json_object_foreach(vocab, key, val)
    {
        int id = (int)json_integer_value(val);
        if (id < 0)
            continue;
        size_t len = strlen(key);
        json_t *r = json_object_get(rank, key);
        float score = r ? -(float)json_integer_value(r)
                      : one_char(key, len) || is_byte_token(key, len) ? 0
                                                                       : -1e9f;
        int type = unk_tok && !strcmp(key, unk_tok) ? TT_UNKNOWN
                   : !*gpt2 && is_byte_token(key, len) ? TT_BYTE : TT_NORMAL;
        if (type == TT_UNKNOWN)
            *unk = id;
        if (tokv_set(v, id, key, len, score, type))
            err = river_err_set(RIVER_ENOMEM, "%s: token", path);
    }
    json_decref(rank);
    for (size_t i = 0; !err && json_is_array(added) && i < json_array_size(added); i++) {
        json_t *a = json_array_get(added, i);
        const char *c = json_string_value(json_object_get(a, "content"));
        int id = (int)json_integer_value(json_object_get(a, "id"));
        if (!c || id < 0)
            continue;
        int type = json_is_true(json_object_get(a, "special")) ? TT_CONTROL : TT_USER;
        if (unk_tok && !strcmp(c, unk_tok))
            type = TT_UNKNOWN, *unk = id;
        if (tokv_set(v, id, c, strlen(c), 0, type))
            err = river_err_set(RIVER_ENOMEM, "%s: token", path);
    }
    for (int i = 0; !err && i < n; i++)
        if (!v->tok[i]) {
            char pad[32];
            snprintf(pad, sizeof pad, "[PAD%d]", i);
            if (tokv_set(v, i, pad, strlen(pad), -1e9f, TT_UNUSED))
                err = river_err_set(RIVER_ENOMEM, "%s: token", path);
        }
    if (err)
        return err;
    *pre = NULL;
    if (*gpt2) {
        const json_t *split = json_find_type(pret, "Split");
        const json_t *pat = split ? json_object_get(split, "pattern") : NULL;
        const char *re = json_string_value(json_object_get(pat, "Regex"));
        for (size_t i = 0; re && i < sizeof pre_table / sizeof pre_table[0]; i++)
            if (!strcmp(re, pre_table[i].regex))
                *pre = pre_table[i].pre;
        if (!*pre && !re)
            *pre = "gpt-2";
        if (!*pre)
            return river_err_set(RIVER_EUNSUPPORTED, "%s: the pre-tokenizer's split regex is "
                                 "none that llama.cpp names (llama-bpe, qwen2, gpt-2)", path);
        *merges_out = merges;
    }
    return 0;
}

/* tokenizer_config.json beside the tokenizer, or NULL. */
static json_t *load_tok_config(const char *tok_path)
{
    char p[4096];
    const char *slash = strrchr(tok_path, '/');
    int dl = slash ? (int)(slash - tok_path) : 1;
    snprintf(p, sizeof p, "%.*s/tokenizer_config.json", dl, slash ? tok_path : ".");
    /* model_max_length is often 1e30 written as an integer, which jansson's integers cannot
     * hold: read numbers as reals (nothing here reads an integer from this file). */
    return json_load_file(p, JSON_DECODE_INT_AS_REAL, NULL);
}

/* The chat template: tokenizer_config.json's chat_template (a string, or the "default" of a
 * list of named ones), else chat_template.jinja beside it; malloc'd or NULL. */
static char *find_chat_template(const char *tok_path, const json_t *cfg)
{
    const json_t *ct = json_object_get(cfg, "chat_template");
    if (json_is_string(ct))
        return strdup(json_string_value(ct));
    for (size_t i = 0; json_is_array(ct) && i < json_array_size(ct); i++) {
        const json_t *e = json_array_get(ct, i);
        const char *nm = json_string_value(json_object_get(e, "name"));
        if (nm && !strcmp(nm, "default") && json_is_string(json_object_get(e, "template")))
            return strdup(json_string_value(json_object_get(e, "template")));
    }
    char p[4096];
    const char *slash = strrchr(tok_path, '/');
    int dl = slash ? (int)(slash - tok_path) : 1;
    snprintf(p, sizeof p, "%.*s/chat_template.jinja", dl, slash ? tok_path : ".");
    char *src;
    size_t len;
    if (river_read_file(p, &src, &len) == 0)
        return src;
    river_err_clear();
    return NULL;
}

static int token_id_of(const tokv_t *v, const char *s)
{
    for (int i = 0; s && i < v->n; i++)
        if (!strcmp(v->tok[i], s))
            return i;
    return -1;
}

static const char *cfg_token(const json_t *cfg, const char *key)
{
    const json_t *t = json_object_get(cfg, key);
    if (json_is_object(t))
        t = json_object_get(t, "content");
    return json_string_value(t);
}

int gguf_export_tokenizer(gguf_writer_t *w, const char *tok_path, int vocab_size, int bos_id,
                          int eos_id)
{
    char *data;
    size_t len;
    int err = river_read_file(tok_path, &data, &len);
    if (err)
        return err;
    tokv_t v = {0};
    json_t *root = NULL, *cfg = load_tok_config(tok_path);
    json_t *merges = NULL;
    int gpt2 = 0, space_prefix = 1, unk = -1;
    const char *pre = NULL;
    int add_bos = 1, add_eos = 0;
    size_t i = 0;
    while (i < len && strchr(" \t\r\n", data[i]))
        i++;
    if (i < len && data[i] == '{') {
        json_error_t je;
        root = json_loadb(data, len, 0, &je);
        if (!root) {
            err = river_err_set(RIVER_EFORMAT, "%s: invalid JSON: %s", tok_path, je.text);
            goto out;
        }
        if ((err = tok_from_json(tok_path, root, &v, vocab_size, &gpt2, &pre, &merges,
                                 &space_prefix, &unk)))
            goto out;
        /* add_bos: tokenizer_config.json's add_bos_token, else whether the post-processor's
         * template starts with a special token. */
        const json_t *post = json_find_type(json_object_get(root, "post_processor"),
                                            "TemplateProcessing");
        const json_t *first = json_array_get(json_object_get(post, "single"), 0);
        add_bos = json_object_get(first, "SpecialToken") != NULL;
        const json_t *single = json_object_get(post, "single");
        const json_t *last = json_array_get(single, json_array_size(single) - 1);
        add_eos = json_array_size(single) > 1 && json_object_get(last, "SpecialToken") != NULL;
        if (bos_id < 0)
            bos_id = token_id_of(&v, cfg_token(cfg, "bos_token"));
        if (eos_id < 0)
            eos_id = token_id_of(&v, cfg_token(cfg, "eos_token"));
    } else {
        if ((err = tok_from_l2c(tok_path, data, len, &v)))
            goto out;
        unk = 0;
        if (bos_id < 0)
            bos_id = 1;
        if (eos_id < 0)
            eos_id = 2;
    }
    if (json_is_boolean(json_object_get(cfg, "add_bos_token")))
        add_bos = json_is_true(json_object_get(cfg, "add_bos_token"));
    if (json_is_boolean(json_object_get(cfg, "add_eos_token")))
        add_eos = json_is_true(json_object_get(cfg, "add_eos_token"));
    if ((err = gguf_writer_set_str(w, "tokenizer.ggml.model", gpt2 ? "gpt2" : "llama")) ||
        (pre && (err = gguf_writer_set_str(w, "tokenizer.ggml.pre", pre))) ||
        (err = gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)v.tok,
                                       v.len, (uint64_t)v.n)) ||
        (!gpt2 && (err = gguf_writer_set_arr(w, "tokenizer.ggml.scores", GGUF_TYPE_FLOAT32,
                                             v.score, (uint64_t)v.n))) ||
        (err = gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, v.type,
                                   (uint64_t)v.n)))
        goto out;
    if (gpt2 && merges) {
        size_t nm = json_array_size(merges);
        char **ms = calloc(nm ? nm : 1, sizeof *ms);
        if (!ms) {
            err = river_err_set(RIVER_ENOMEM, "%s: merges", tok_path);
            goto out;
        }
        for (size_t k = 0; k < nm && !err; k++) {
            json_t *m = json_array_get(merges, k);
            if (json_is_string(m)) {
                ms[k] = strdup(json_string_value(m));
            } else {
                const char *a = json_string_value(json_array_get(m, 0));
                const char *b = json_string_value(json_array_get(m, 1));
                if (a && b && (ms[k] = malloc(strlen(a) + strlen(b) + 2)))
                    sprintf(ms[k], "%s %s", a, b);
            }
            if (!ms[k])
                err = river_err_set(RIVER_EFORMAT, "%s: merge %zu", tok_path, k);
        }
        if (!err)
            err = gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", (const char *const *)ms,
                                          NULL, nm);
        for (size_t k = 0; k < nm; k++)
            free(ms[k]);
        free(ms);
        if (err)
            goto out;
    }
    int pad = token_id_of(&v, cfg_token(cfg, "pad_token"));
    const struct {
        const char *key;
        int id;
    } ids[] = {{"tokenizer.ggml.bos_token_id", bos_id},
               {"tokenizer.ggml.eos_token_id", eos_id},
               {"tokenizer.ggml.unknown_token_id", unk},
               {"tokenizer.ggml.padding_token_id", pad}};
    for (size_t k = 0; k < sizeof ids / sizeof ids[0] && !err; k++)
        if (ids[k].id >= 0)
            err = gguf_writer_set_u32(w, ids[k].key, (uint32_t)ids[k].id);
    if (err ||
        (err = gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", add_bos)) ||
        (err = gguf_writer_set_bool(w, "tokenizer.ggml.add_eos_token", add_eos)) ||
        (!gpt2 && (err = gguf_writer_set_bool(w, "tokenizer.ggml.add_space_prefix", space_prefix))))
        goto out;
    char *tmpl = find_chat_template(tok_path, cfg);
    if (tmpl) {
        err = gguf_writer_set_str(w, "tokenizer.chat_template", tmpl);
        free(tmpl);
    }
out:
    json_decref(root);
    json_decref(cfg);
    tokv_free(&v);
    free(data);
    return err;
}

/* ---- the model ---- */

static int add_meta(gguf_writer_t *w, const model_t *m, int t, const char *arch,
                    const char *name)
{
    const model_config_t *c = &m->cfg;
    char k[128];
    int e;
#define KEY(suffix) (snprintf(k, sizeof k, "%s.%s", arch, suffix), k)
    if ((e = gguf_writer_set_str(w, "general.architecture", arch)) ||
        (e = gguf_writer_set_str(w, "general.name", name)) ||
        (e = gguf_writer_set_u32(w, "general.file_type", (uint32_t)export_types[t].ftype)) ||
        (e = gguf_writer_set_u32(w, "general.quantization_version", 2)) ||
        (e = gguf_writer_set_u32(w, KEY("context_length"), (uint32_t)c->max_seq_len)) ||
        (e = gguf_writer_set_u32(w, KEY("embedding_length"), (uint32_t)c->dim)) ||
        (e = gguf_writer_set_u32(w, KEY("block_count"), (uint32_t)c->n_layers)) ||
        (e = gguf_writer_set_u32(w, KEY("feed_forward_length"), (uint32_t)c->hidden_dim)) ||
        (e = gguf_writer_set_u32(w, KEY("attention.head_count"), (uint32_t)c->n_heads)) ||
        (e = gguf_writer_set_u32(w, KEY("attention.head_count_kv"), (uint32_t)c->n_kv_heads)) ||
        (e = gguf_writer_set_f32(w, KEY("rope.freq_base"), c->rope_theta)) ||
        (e = gguf_writer_set_f32(w, KEY("attention.layer_norm_rms_epsilon"), c->norm_eps)) ||
        (e = gguf_writer_set_u32(w, KEY("rope.dimension_count"), (uint32_t)c->head_dim)) ||
        (e = gguf_writer_set_u32(w, KEY("vocab_size"), (uint32_t)c->vocab_size)))
        return e;
    if (c->head_dim * c->n_heads != c->dim &&
        ((e = gguf_writer_set_u32(w, KEY("attention.key_length"), (uint32_t)c->head_dim)) ||
         (e = gguf_writer_set_u32(w, KEY("attention.value_length"), (uint32_t)c->head_dim))))
        return e;
    if (c->rope_scaling == ROPE_SCALING_LINEAR &&
        ((e = gguf_writer_set_str(w, KEY("rope.scaling.type"), "linear")) ||
         (e = gguf_writer_set_f32(w, KEY("rope.scaling.factor"), c->rope_factor))))
        return e;
#undef KEY
    return 0;
}

/* Llama 3.1 scaling as llama.cpp's converter writes it: a rope_freqs tensor of the factor
 * each frequency is divided by. */
static int add_rope_freqs(gguf_writer_t *w, const model_config_t *c)
{
    int half = c->head_dim / 2;
    float *f = malloc(sizeof *f * (size_t)half);
    if (!f)
        return river_err_set(RIVER_ENOMEM, "export: rope_freqs");
    const float pi = 3.14159265358979323846f;
    float old_ctx = (float)c->rope_orig_max_pos;
    float low_wl = old_ctx / c->rope_low_freq_factor, high_wl = old_ctx / c->rope_high_freq_factor;
    for (int i = 0; i < half; i++) {
        float freq = 1.0f / powf(c->rope_theta, (float)(2 * i) / (float)c->head_dim);
        float wl = 2.0f * pi / freq;
        if (wl < high_wl) {
            f[i] = 1.0f;
        } else if (wl > low_wl) {
            f[i] = c->rope_factor;
        } else {
            float smooth = (old_ctx / wl - c->rope_low_freq_factor) /
                           (c->rope_high_freq_factor - c->rope_low_freq_factor);
            f[i] = 1.0f / ((1.0f - smooth) / c->rope_factor + smooth);
        }
    }
    int64_t ne[1] = {half};
    return gguf_writer_add_tensor(w, "rope_freqs.weight", GGML_TYPE_F32, 1, ne, f,
                                  sizeof *f * (size_t)half);
}

int gguf_export_model(const model_t *m, const char *out_path, const gguf_export_opts_t *o)
{
    const model_config_t *c = &m->cfg;
    int t = -1;
    for (size_t i = 0; i < sizeof export_types / sizeof export_types[0]; i++)
        if (o->type && !strcasecmp(o->type, export_types[i].name))
            t = (int)i;
    if (t < 0)
        return river_err_set(RIVER_EINVAL, "export: type '%s' is none of f32, f16, bf16, q8_0, "
                             "q4_0, q4_1, q4_k_m, q5_k_m", o->type ? o->type : "");
    const char *arch;
    switch (c->arch) {
    case ARCH_LLAMA:
    case ARCH_MISTRAL:
        arch = "llama";
        break;
    case ARCH_QWEN2:
        arch = "qwen2";
        break;
    case ARCH_QWEN3:
        arch = "qwen3";
        break;
    default:
        return river_err_set(RIVER_EUNSUPPORTED, "export: architecture %s has no GGUF export",
                             arch_name(c->arch));
    }
    if (c->partial_rotary_factor != 1.0f || c->rope_scaling == ROPE_SCALING_LONGROPE)
        return river_err_set(RIVER_EUNSUPPORTED, "export: partial rotary or longrope scaling "
                             "has no GGUF form here");
    /* llama.cpp's llama rope is interleaved; its qwen architectures use rotate-half. */
    int want_interleaved = !strcmp(arch, "llama");
    int perm = want_interleaved && c->rope_layout == ROPE_HALF;
    if (!want_interleaved && c->rope_layout != ROPE_HALF)
        return river_err_set(RIVER_EUNSUPPORTED, "export: a %s model with interleaved rope",
                             arch);
    char tok_found[4096];
    const char *tok = o->tokenizer;
    int err;
    if (!tok) {
        if ((err = engine_find_tokenizer(m->path, tok_found, sizeof tok_found)))
            return err;
        tok = tok_found;
    }
    char name[256];
    if (o->name) {
        snprintf(name, sizeof name, "%s", o->name);
    } else {
        const char *d = m->dir && strcmp(m->dir, ".") ? m->dir : m->path;
        const char *b = strrchr(d, '/');
        snprintf(name, sizeof name, "%s", b && b[1] ? b + 1 : d);
    }
    gguf_writer_t *w;
    if ((err = gguf_writer_new(&w)))
        return err;
    if ((err = add_meta(w, m, t, arch, name)) ||
        (err = gguf_export_tokenizer(w, tok, c->vocab_size, c->bos_id,
                                     c->n_eos ? c->eos_ids[0] : -1)))
        goto out;
    if (c->rope_scaling == ROPE_SCALING_LLAMA3 && (err = add_rope_freqs(w, c)))
        goto out;
    int tied = m->lm_head.data == m->embed.data;
    int nl = c->n_layers;
    if ((err = add_weight(w, "token_embd.weight", &m->embed,
                          pick_type(t, tied ? ROLE_OUTPUT : ROLE_OTHER, 0, nl, c->dim), 0, 0)))
        goto out;
    for (int l = 0; l < nl && !err; l++) {
        const layer_weights_t *L = &m->layers[l];
        char n[96];
#define NM(s) (snprintf(n, sizeof n, "blk.%d.%s", l, s), n)
        int64_t dim = c->dim, qd = (int64_t)c->n_heads * c->head_dim;
        if ((err = add_weight(w, NM("attn_norm.weight"), &L->attn_norm, 0, 1, 0)) ||
            (err = add_weight(w, NM("attn_q.weight"), &L->wq,
                              pick_type(t, ROLE_OTHER, l, nl, dim), 0, perm ? c->n_heads : 0)) ||
            (err = add_weight(w, NM("attn_k.weight"), &L->wk,
                              pick_type(t, ROLE_OTHER, l, nl, dim), 0,
                              perm ? c->n_kv_heads : 0)) ||
            (err = add_weight(w, NM("attn_v.weight"), &L->wv, pick_type(t, ROLE_V, l, nl, dim),
                              0, 0)) ||
            (err = add_weight(w, NM("attn_output.weight"), &L->wo,
                              pick_type(t, ROLE_OTHER, l, nl, qd), 0, 0)))
            break;
        if (L->bq.data &&
            ((err = add_weight(w, NM("attn_q.bias"), &L->bq, 0, 1, 0)) ||
             (err = add_weight(w, NM("attn_k.bias"), &L->bk, 0, 1, 0)) ||
             (err = add_weight(w, NM("attn_v.bias"), &L->bv, 0, 1, 0))))
            break;
        if (L->q_norm.data &&
            ((err = add_weight(w, NM("attn_q_norm.weight"), &L->q_norm, 0, 1, 0)) ||
             (err = add_weight(w, NM("attn_k_norm.weight"), &L->k_norm, 0, 1, 0))))
            break;
        if ((err = add_weight(w, NM("ffn_norm.weight"), &L->ffn_norm, 0, 1, 0)) ||
            (err = add_weight(w, NM("ffn_gate.weight"), &L->w_gate,
                              pick_type(t, ROLE_OTHER, l, nl, dim), 0, 0)) ||
            (err = add_weight(w, NM("ffn_up.weight"), &L->w_up,
                              pick_type(t, ROLE_OTHER, l, nl, dim), 0, 0)) ||
            (err = add_weight(w, NM("ffn_down.weight"), &L->w_down,
                              pick_type(t, ROLE_DOWN, l, nl, c->hidden_dim), 0, 0)))
            break;
#undef NM
    }
    if (err)
        goto out;
    if ((err = add_weight(w, "output_norm.weight", &m->final_norm, 0, 1, 0)))
        goto out;
    if (!tied && (err = add_weight(w, "output.weight", &m->lm_head,
                                   pick_type(t, ROLE_OUTPUT, 0, nl, c->dim), 0, 0)))
        goto out;
    err = gguf_writer_write(w, out_path);
out:
    gguf_writer_destroy(&w);
    return err;
}
