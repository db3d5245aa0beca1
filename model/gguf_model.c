/* Models from GGUF files (llama.cpp's container, common/gguf.h): architectures llama (Llama
 * 2/3/3.1/3.2 and Mistral, which llama.cpp's converter writes as llama), qwen2 and qwen3.
 *
 * F32, F16 and BF16 matrices are used in place from the mapping; the block types become
 * River's affine groups (model/gguf_blocks.h lists the conversion of each, its rounding and
 * its bytes per weight) in owned buffers; vectors become owned f32. llama.cpp's llama
 * stores q/k rows for the interleaved rope (its converter permuted them from Hugging
 * Face's rotate-half), so a llama GGUF runs with ROPE_INTERLEAVED and its weights as they
 * are; qwen2/qwen3 keep rotate-half (ROPE_HALF). A rope_freqs.weight tensor (Llama 3.1
 * scaling as llama.cpp's converter writes it: the factor each frequency is divided by)
 * becomes per-frequency factors (the longrope slot, with attention factor 1). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/gguf.h"
#include "kernels/half.h"
#include "model/gguf_blocks.h"
#include "model/model_internal.h"

static int gm_tensor(const gguf_t *g, const char *name, int n_dims, int64_t rows, int64_t cols,
                     const gguf_tensor_t **out)
{
    const gguf_tensor_t *t = gguf_find_tensor(g, name);
    if (!t)
        return river_err_set(RIVER_ENOTFOUND, "%s: tensor '%s' not found", g->path, name);
    int ok = n_dims == 1 ? t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3] == cols
                         : t->ne[0] == cols && t->ne[1] == rows && t->ne[2] == 1 && t->ne[3] == 1;
    if (!ok)
        return river_err_set(RIVER_ESHAPE, "%s: tensor '%s' has shape [%lld, %lld, %lld, %lld] "
                             "(ggml order, contiguous first), expected [%lld, %lld]", g->path,
                             name, (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2],
                             (long long)t->ne[3], (long long)cols,
                             (long long)(n_dims == 1 ? 1 : rows));
    if (!gguf_block_known(t->type))
        return river_err_set(RIVER_EDTYPE, "%s: tensor '%s' has type %s, which River does not "
                             "read (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, "
                             "Q6_K)", g->path, name, ggml_type_name(t->type));
    *out = t;
    return 0;
}

static int gm_own(model_t *m, void *p, const char *name)
{
    if (!p)
        return river_err_set(RIVER_ENOMEM, "%s: tensor '%s'", m->path, name);
    return model_mapping_own(m->map, p);
}

/* A matrix: in place for the float types, converted to River's groups for the others. */
static int gm_matrix(model_t *m, const char *name, int64_t rows, int64_t cols, weight_t *w)
{
    const gguf_t *g = m->map->gguf;
    const gguf_tensor_t *t;
    int e = gm_tensor(g, name, 2, rows, cols, &t);
    if (e)
        return e;
    switch (t->type) {
    case GGML_TYPE_F32:
        *w = (weight_t){.dtype = DTYPE_F32, .rows = rows, .cols = cols, .data = t->data};
        return 0;
    case GGML_TYPE_F16:
        *w = (weight_t){.dtype = DTYPE_F16, .rows = rows, .cols = cols, .data = t->data};
        return 0;
    case GGML_TYPE_BF16:
        *w = (weight_t){.dtype = DTYPE_BF16, .rows = rows, .cols = cols, .data = t->data};
        return 0;
    default:
        break;
    }
    dtype_t dt;
    int group;
    if (gguf_block_river_type(t->type, &dt, &group) != 1)
        return river_err_set(RIVER_EDTYPE, "%s: tensor '%s': type %s has no conversion",
                             g->path, name, ggml_type_name(t->type));
    size_t rb = dtype_row_bytes(dt, cols), ng = (size_t)(cols / group);
    uint8_t *codes = malloc(rb * (size_t)rows);
    if ((e = gm_own(m, codes, name)))
        return e;
    uint16_t *sc = malloc(sizeof *sc * ng * (size_t)rows);
    if ((e = gm_own(m, sc, name)))
        return e;
    uint16_t *zr = malloc(sizeof *zr * ng * (size_t)rows);
    if ((e = gm_own(m, zr, name)))
        return e;
    size_t srb = gguf_block_row_bytes(t->type, cols);
    for (int64_t r = 0; r < rows; r++)
        gguf_block_to_river(t->type, (const uint8_t *)t->data + (size_t)r * srb, cols,
                            codes + (size_t)r * rb, sc + (size_t)r * ng, zr + (size_t)r * ng);
    *w = (weight_t){.dtype = dt, .rows = rows, .cols = cols, .data = codes, .scales = sc,
                    .zeros = zr, .group = group};
    return 0;
}

/* A vector (or any tensor of n elements) as owned f32. */
static int gm_vector(model_t *m, const char *name, int64_t n, weight_t *w)
{
    const gguf_tensor_t *t;
    int e = gm_tensor(m->map->gguf, name, 1, 1, n, &t);
    if (e)
        return e;
    float *v = malloc(sizeof *v * (size_t)n);
    if ((e = gm_own(m, v, name)))
        return e;
    gguf_block_dequant(t->type, t->data, v, n);
    *w = (weight_t){.dtype = DTYPE_F32, .rows = 1, .cols = n, .data = v};
    return 0;
}

/* {arch}.suffix into *out; absent keeps *out when `def` is set, else it is an error. */
static int gm_int(const gguf_t *g, const char *arch, const char *suffix, int *out, int def)
{
    char k[128];
    snprintf(k, sizeof k, "%s.%s", arch, suffix);
    int e = gguf_get_int(g, k, out);
    if (e == RIVER_ENOTFOUND && def) {
        river_err_clear();
        return 0;
    }
    return e;
}

static int gm_f32(const gguf_t *g, const char *arch, const char *suffix, float *out)
{
    char k[128];
    snprintf(k, sizeof k, "%s.%s", arch, suffix);
    int e = gguf_get_f32(g, k, out);
    if (e == RIVER_ENOTFOUND) {
        river_err_clear();
        return 0;
    }
    return e;
}

static int gm_config(model_t *m, const char *arch_s)
{
    const gguf_t *g = m->map->gguf;
    model_config_t *c = &m->cfg;
    int e;
    *c = (model_config_t){.norm_eps = 1e-5f, .rope_theta = 10000.0f, .partial_rotary_factor = 1,
                          .rope_factor = 1, .max_seq_len = 2048, .bos_id = -1};
    if (!strcmp(arch_s, "llama")) {
        c->arch = ARCH_LLAMA;
        c->rope_layout = ROPE_INTERLEAVED;
    } else if (!strcmp(arch_s, "qwen2")) {
        c->arch = ARCH_QWEN2;
        c->rope_layout = ROPE_HALF;
    } else if (!strcmp(arch_s, "qwen3")) {
        c->arch = ARCH_QWEN3;
        c->rope_layout = ROPE_HALF;
    } else {
        return river_err_set(RIVER_EARCH, "%s: key 'general.architecture' is '%s'; River reads "
                             "llama, qwen2 and qwen3 GGUF files", g->path, arch_s);
    }
    if ((e = gm_int(g, arch_s, "embedding_length", &c->dim, 0)) ||
        (e = gm_int(g, arch_s, "block_count", &c->n_layers, 0)) ||
        (e = gm_int(g, arch_s, "feed_forward_length", &c->hidden_dim, 0)) ||
        (e = gm_int(g, arch_s, "attention.head_count", &c->n_heads, 0)))
        return e;
    c->n_kv_heads = c->n_heads;
    if (c->n_heads <= 0)
        return river_err_set(RIVER_ECONFIG, "%s: key '%s.attention.head_count' is %d", g->path,
                             arch_s, c->n_heads);
    c->head_dim = c->dim / c->n_heads;
    int rot = -1;
    if ((e = gm_int(g, arch_s, "attention.head_count_kv", &c->n_kv_heads, 1)) ||
        (e = gm_int(g, arch_s, "attention.key_length", &c->head_dim, 1)) ||
        (e = gm_int(g, arch_s, "context_length", &c->max_seq_len, 1)) ||
        (e = gm_int(g, arch_s, "rope.dimension_count", &rot, 1)) ||
        (e = gm_f32(g, arch_s, "rope.freq_base", &c->rope_theta)) ||
        (e = gm_f32(g, arch_s, "attention.layer_norm_rms_epsilon", &c->norm_eps)))
        return e;
    if (rot > 0 && c->head_dim > 0)
        c->partial_rotary_factor = (float)rot / (float)c->head_dim;
    char k[128];
    snprintf(k, sizeof k, "%s.rope.scaling.type", arch_s);
    const char *st;
    size_t stl;
    if ((e = gguf_get_str(g, k, &st, &stl)) == 0) {
        if (stl == 6 && !memcmp(st, "linear", 6)) {
            c->rope_scaling = ROPE_SCALING_LINEAR;
            if ((e = gm_f32(g, arch_s, "rope.scaling.factor", &c->rope_factor)))
                return e;
        } else if (!(stl == 4 && !memcmp(st, "none", 4))) {
            return river_err_set(RIVER_EUNSUPPORTED, "%s: key '%s' is '%.*s'; River takes "
                                 "linear scaling and rope_freqs factors", g->path, k, (int)stl, st);
        }
    } else if (e != RIVER_ENOTFOUND) {
        return e;
    }
    river_err_clear();
    /* The vocabulary: the token list, else the embedding's rows. */
    const gguf_tensor_t *emb = gguf_find_tensor(g, "token_embd.weight");
    const gguf_kv_t *toks = gguf_find_kv(g, "tokenizer.ggml.tokens");
    c->vocab_size = toks && toks->type == GGUF_TYPE_ARRAY ? (int)toks->n
                    : emb                                 ? (int)emb->ne[1]
                                                          : 0;
    if ((e = gm_int(g, arch_s, "vocab_size", &c->vocab_size, 1)))
        return e;
    c->tied_embeddings = gguf_find_tensor(g, "output.weight") == NULL;
    if ((e = gguf_get_int(g, "tokenizer.ggml.bos_token_id", &c->bos_id)) && e != RIVER_ENOTFOUND)
        return e;
    static const char *const eos_keys[] = {"tokenizer.ggml.eos_token_id",
                                           "tokenizer.ggml.eot_token_id",
                                           "tokenizer.ggml.eom_token_id"};
    for (size_t i = 0; i < 3; i++) {
        int id;
        if ((e = gguf_get_int(g, eos_keys[i], &id)) == 0) {
            int seen = 0;
            for (int j = 0; j < c->n_eos; j++)
                seen |= c->eos_ids[j] == id;
            if (!seen)
                c->eos_ids[c->n_eos++] = id;
        } else if (e != RIVER_ENOTFOUND) {
            return e;
        }
    }
    river_err_clear();
    const gguf_tensor_t *rf = gguf_find_tensor(g, "rope_freqs.weight");
    if (rf) {
        int half = (int)((float)c->head_dim * c->partial_rotary_factor) / 2;
        weight_t v;
        if ((e = gm_vector(m, "rope_freqs.weight", half, &v)))
            return e;
        c->rope_short_factor = malloc(sizeof(float) * (size_t)half);
        c->rope_long_factor = malloc(sizeof(float) * (size_t)half);
        if (!c->rope_short_factor || !c->rope_long_factor)
            return river_err_set(RIVER_ENOMEM, "%s: rope factors", g->path);
        memcpy(c->rope_short_factor, v.data, sizeof(float) * (size_t)half);
        memcpy(c->rope_long_factor, v.data, sizeof(float) * (size_t)half);
        c->rope_scaling = ROPE_SCALING_LONGROPE;
        c->rope_orig_max_pos = c->max_seq_len; /* no attention factor */
        c->rope_factor = 1;
    }
    return model_config_validate(c, g->path);
}

static int gm_layer(model_t *m, int l, layer_weights_t *L)
{
    const model_config_t *c = &m->cfg;
    int64_t dim = c->dim, q = (int64_t)c->n_heads * c->head_dim;
    int64_t kv = (int64_t)c->n_kv_heads * c->head_dim, hid = c->hidden_dim;
    char n[96];
    int e;
#define NM(s) (snprintf(n, sizeof n, "blk.%d.%s", l, s), n)
    if ((e = gm_vector(m, NM("attn_norm.weight"), dim, &L->attn_norm)) ||
        (e = gm_vector(m, NM("ffn_norm.weight"), dim, &L->ffn_norm)) ||
        (e = gm_matrix(m, NM("attn_q.weight"), q, dim, &L->wq)) ||
        (e = gm_matrix(m, NM("attn_k.weight"), kv, dim, &L->wk)) ||
        (e = gm_matrix(m, NM("attn_v.weight"), kv, dim, &L->wv)) ||
        (e = gm_matrix(m, NM("attn_output.weight"), dim, q, &L->wo)) ||
        (e = gm_matrix(m, NM("ffn_gate.weight"), hid, dim, &L->w_gate)) ||
        (e = gm_matrix(m, NM("ffn_up.weight"), hid, dim, &L->w_up)) ||
        (e = gm_matrix(m, NM("ffn_down.weight"), dim, hid, &L->w_down)))
        return e;
    if (c->arch == ARCH_QWEN2 &&
        ((e = gm_vector(m, NM("attn_q.bias"), q, &L->bq)) ||
         (e = gm_vector(m, NM("attn_k.bias"), kv, &L->bk)) ||
         (e = gm_vector(m, NM("attn_v.bias"), kv, &L->bv))))
        return e;
    if (c->arch == ARCH_QWEN3 &&
        ((e = gm_vector(m, NM("attn_q_norm.weight"), c->head_dim, &L->q_norm)) ||
         (e = gm_vector(m, NM("attn_k_norm.weight"), c->head_dim, &L->k_norm))))
        return e;
#undef NM
    return 0;
}

int gguf_model_load(model_t *m, const char *path)
{
    gguf_t *g;
    int e = gguf_open(&g, path);
    if (e)
        return e;
    m->map->gguf = g;
    m->is_gguf = 1;
    char *arch;
    if ((e = gguf_get_strdup(g, "general.architecture", &arch)))
        return e;
    e = gm_config(m, arch);
    free(arch);
    if (e)
        return e;
    model_config_t *c = &m->cfg;
    if ((e = gm_matrix(m, "token_embd.weight", c->vocab_size, c->dim, &m->embed)) ||
        (e = gm_vector(m, "output_norm.weight", c->dim, &m->final_norm)))
        return e;
    if (c->tied_embeddings)
        m->lm_head = m->embed;
    else if ((e = gm_matrix(m, "output.weight", c->vocab_size, c->dim, &m->lm_head)))
        return e;
    m->layers = calloc((size_t)c->n_layers, sizeof *m->layers);
    if (!m->layers)
        return river_err_set(RIVER_ENOMEM, "%s: %d layers", path, c->n_layers);
    for (int l = 0; l < c->n_layers; l++)
        if ((e = gm_layer(m, l, &m->layers[l])))
            return e;
    c->dtype = m->layers[0].wq.dtype;
    return 0;
}
