/* Random-weight checkpoints of real model shapes (see synth.h). */
#include "offline/synth.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/err.h"
#include "common/rng.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "kernels/half.h"

typedef struct synth_shape {
    const char *name;
    arch_t arch;
    int n_layers, dim, n_heads, n_kv_heads, head_dim, hidden, vocab, max_pos;
    double eps, theta;
    int tied;
    int tied_as_lm_head;  /* keep the tied table only as lm_head.weight (TinyStories-656K) */
    int head_dim_in_config;
    rope_scaling_t scaling;
    double factor, low, high;
    int orig_max_pos;
    double partial;       /* partial_rotary_factor, written when below 1 */
    int bos;
    int eos[2];
    int n_eos;
} synth_shape_t;

static const synth_shape_t synth_shapes[] = {
    {.name = "llama-3.2-1b", .arch = ARCH_LLAMA, .n_layers = 16, .dim = 2048, .n_heads = 32,
     .n_kv_heads = 8, .head_dim = 64, .hidden = 8192, .vocab = 128256, .max_pos = 131072,
     .eps = 1e-5, .theta = 500000, .tied = 1, .head_dim_in_config = 1,
     .scaling = ROPE_SCALING_LLAMA3, .factor = 32, .low = 1, .high = 4, .orig_max_pos = 8192,
     .partial = 1, .bos = 128000, .eos = {128001}, .n_eos = 1},
    {.name = "llama-3.1-8b", .arch = ARCH_LLAMA, .n_layers = 32, .dim = 4096, .n_heads = 32,
     .n_kv_heads = 8, .head_dim = 128, .hidden = 14336, .vocab = 128256, .max_pos = 131072,
     .eps = 1e-5, .theta = 500000, .tied = 0, .scaling = ROPE_SCALING_LLAMA3, .factor = 8,
     .low = 1, .high = 4, .orig_max_pos = 8192, .partial = 1, .bos = 128000,
     .eos = {128001}, .n_eos = 1},
    /* The Llama 3 vocabulary on a tiny body, for the byte-level BPE tokenizer of
     * tests/data/tokenizers/llama3 (copied beside it by whoever needs a tokenizer): every
     * matrix has a multiple of 256 columns, so a GGUF export holds K-quant blocks. */
    {.name = "llama3-tiny", .arch = ARCH_LLAMA, .n_layers = 2, .dim = 256, .n_heads = 4,
     .n_kv_heads = 2, .head_dim = 64, .hidden = 768, .vocab = 128256, .max_pos = 131072,
     .eps = 1e-5, .theta = 500000, .tied = 1, .head_dim_in_config = 1,
     .scaling = ROPE_SCALING_LLAMA3, .factor = 32, .low = 1, .high = 4, .orig_max_pos = 8192,
     .partial = 1, .bos = 128000, .eos = {128001}, .n_eos = 1},
    {.name = "stories260K", .arch = ARCH_LLAMA, .n_layers = 5, .dim = 64, .n_heads = 8,
     .n_kv_heads = 4, .head_dim = 8, .hidden = 172, .vocab = 512, .max_pos = 512, .eps = 1e-5,
     .theta = 10000, .tied = 1, .partial = 1, .bos = 1, .eos = {2}, .n_eos = 1},
    {.name = "stories15M", .arch = ARCH_LLAMA, .n_layers = 6, .dim = 288, .n_heads = 6,
     .n_kv_heads = 6, .head_dim = 48, .hidden = 768, .vocab = 32000, .max_pos = 256,
     .eps = 1e-5, .theta = 10000, .tied = 1, .partial = 1, .bos = 1, .eos = {2}, .n_eos = 1},
    {.name = "tinystories-656k", .arch = ARCH_LLAMA, .n_layers = 2, .dim = 128, .n_heads = 8,
     .n_kv_heads = 4, .head_dim = 16, .hidden = 384, .vocab = 2048, .max_pos = 512,
     .eps = 1e-6, .theta = 10000, .tied = 1, .tied_as_lm_head = 1, .partial = 1, .bos = 1,
     .eos = {2}, .n_eos = 1},
    {.name = "qwen2-tiny", .arch = ARCH_QWEN2, .n_layers = 2, .dim = 128, .n_heads = 4,
     .n_kv_heads = 2, .head_dim = 32, .hidden = 256, .vocab = 512, .max_pos = 1024,
     .eps = 1e-6, .theta = 1000000, .tied = 1, .partial = 1, .bos = 1, .eos = {2},
     .n_eos = 1},
    /* head_dim 48 differs from hidden/heads = 32, as in the real Qwen3 models. */
    {.name = "qwen3-tiny", .arch = ARCH_QWEN3, .n_layers = 2, .dim = 128, .n_heads = 4,
     .n_kv_heads = 2, .head_dim = 48, .hidden = 256, .vocab = 512, .max_pos = 1024,
     .eps = 1e-6, .theta = 1000000, .tied = 0, .head_dim_in_config = 1, .partial = 1,
     .bos = 1, .eos = {2, 3}, .n_eos = 2},
    {.name = "mistral-tiny", .arch = ARCH_MISTRAL, .n_layers = 2, .dim = 128, .n_heads = 4,
     .n_kv_heads = 2, .head_dim = 32, .hidden = 256, .vocab = 512, .max_pos = 1024,
     .eps = 1e-5, .theta = 1000000, .tied = 0, .partial = 1, .bos = 1, .eos = {2},
     .n_eos = 1},
    {.name = "phi3-tiny", .arch = ARCH_PHI3, .n_layers = 2, .dim = 128, .n_heads = 4,
     .n_kv_heads = 2, .head_dim = 32, .hidden = 256, .vocab = 512, .max_pos = 1024,
     .eps = 1e-5, .theta = 10000, .tied = 0, .scaling = ROPE_SCALING_LONGROPE,
     .orig_max_pos = 256, .partial = 0.75, .bos = 1, .eos = {2}, .n_eos = 1},
};

#define SYNTH_N_SHAPES (sizeof synth_shapes / sizeof synth_shapes[0])

static const char *const synth_arch_class[ARCH_COUNT] = {
    [ARCH_LLAMA] = "LlamaForCausalLM", [ARCH_MISTRAL] = "MistralForCausalLM",
    [ARCH_QWEN2] = "Qwen2ForCausalLM", [ARCH_QWEN3] = "Qwen3ForCausalLM",
    [ARCH_PHI3] = "Phi3ForCausalLM",
};

const char *synth_shape_name(int i)
{
    return i >= 0 && (size_t)i < SYNTH_N_SHAPES ? synth_shapes[i].name : NULL;
}

static const synth_shape_t *synth_find(const char *name)
{
    for (size_t i = 0; i < SYNTH_N_SHAPES; i++)
        if (!strcmp(synth_shapes[i].name, name))
            return &synth_shapes[i];
    return NULL;
}

/* ---- the tensor list ---- */

typedef enum { SYNTH_MATRIX, SYNTH_NORM, SYNTH_BIAS } synth_kind_t;

typedef struct synth_tensor {
    char name[96];
    int n_dims;
    int64_t shape[2];
    synth_kind_t kind;
    int shard; /* index of the file it goes to */
} synth_tensor_t;

typedef struct synth_list {
    synth_tensor_t *t;
    int n;
} synth_list_t;

static void synth_add(synth_list_t *l, synth_kind_t kind, int64_t rows, int64_t cols,
                      const char *fmt, int layer)
{
    synth_tensor_t *t = &l->t[l->n++];
    snprintf(t->name, sizeof t->name, fmt, layer);
    t->kind = kind;
    t->n_dims = kind == SYNTH_MATRIX ? 2 : 1;
    t->shape[0] = kind == SYNTH_MATRIX ? rows : cols;
    t->shape[1] = cols;
}

/* The tensors of a shape in file order (the order a forward pass reads them). */
static int synth_tensors(const synth_shape_t *s, synth_list_t *l)
{
    l->t = calloc((size_t)s->n_layers * 16 + 4, sizeof *l->t);
    if (!l->t)
        return river_err_set(RIVER_ENOMEM, "synth: tensor list");
    l->n = 0;
    int64_t D = s->dim, q = (int64_t)s->n_heads * s->head_dim;
    int64_t kv = (int64_t)s->n_kv_heads * s->head_dim, H = s->hidden;
    if (!s->tied_as_lm_head)
        synth_add(l, SYNTH_MATRIX, s->vocab, D, "model.embed_tokens.weight", 0);
    for (int i = 0; i < s->n_layers; i++) {
        synth_add(l, SYNTH_NORM, 1, D, "model.layers.%d.input_layernorm.weight", i);
        if (s->arch == ARCH_PHI3) {
            synth_add(l, SYNTH_MATRIX, q + 2 * kv, D, "model.layers.%d.self_attn.qkv_proj.weight",
                      i);
        } else {
            synth_add(l, SYNTH_MATRIX, q, D, "model.layers.%d.self_attn.q_proj.weight", i);
            synth_add(l, SYNTH_MATRIX, kv, D, "model.layers.%d.self_attn.k_proj.weight", i);
            synth_add(l, SYNTH_MATRIX, kv, D, "model.layers.%d.self_attn.v_proj.weight", i);
        }
        if (s->arch == ARCH_QWEN2) {
            synth_add(l, SYNTH_BIAS, 1, q, "model.layers.%d.self_attn.q_proj.bias", i);
            synth_add(l, SYNTH_BIAS, 1, kv, "model.layers.%d.self_attn.k_proj.bias", i);
            synth_add(l, SYNTH_BIAS, 1, kv, "model.layers.%d.self_attn.v_proj.bias", i);
        }
        if (s->arch == ARCH_QWEN3) {
            synth_add(l, SYNTH_NORM, 1, s->head_dim, "model.layers.%d.self_attn.q_norm.weight",
                      i);
            synth_add(l, SYNTH_NORM, 1, s->head_dim, "model.layers.%d.self_attn.k_norm.weight",
                      i);
        }
        synth_add(l, SYNTH_MATRIX, D, q, "model.layers.%d.self_attn.o_proj.weight", i);
        synth_add(l, SYNTH_NORM, 1, D, "model.layers.%d.post_attention_layernorm.weight", i);
        if (s->arch == ARCH_PHI3) {
            synth_add(l, SYNTH_MATRIX, 2 * H, D, "model.layers.%d.mlp.gate_up_proj.weight", i);
        } else {
            synth_add(l, SYNTH_MATRIX, H, D, "model.layers.%d.mlp.gate_proj.weight", i);
            synth_add(l, SYNTH_MATRIX, H, D, "model.layers.%d.mlp.up_proj.weight", i);
        }
        synth_add(l, SYNTH_MATRIX, D, H, "model.layers.%d.mlp.down_proj.weight", i);
    }
    synth_add(l, SYNTH_NORM, 1, D, "model.norm.weight", 0);
    if (!s->tied || s->tied_as_lm_head)
        synth_add(l, SYNTH_MATRIX, s->vocab, D, "lm_head.weight", 0);
    return 0;
}

static int64_t synth_numel(const synth_tensor_t *t)
{
    return t->n_dims == 2 ? t->shape[0] * t->shape[1] : t->shape[0];
}

int64_t synth_data_bytes(const char *shape, dtype_t dtype)
{
    const synth_shape_t *s = synth_find(shape);
    synth_list_t l;
    if (!s || dtype_size(dtype) == 0 || synth_tensors(s, &l) != 0)
        return -1;
    int64_t b = 0;
    for (int i = 0; i < l.n; i++)
        b += synth_numel(&l.t[i]) * (int64_t)dtype_size(dtype);
    free(l.t);
    return b;
}

/* ---- values ---- */

/* An approximately standard normal value from 64 bits of splitmix64 (common/rng.h: one
 * multiply-xorshift step, and good enough statistically for weights, since it passes
 * BigCrush): the sum of four 16-bit uniforms has mean
 * 4 * 32767.5 and standard deviation sqrt(4 * (65536^2 - 1) / 12). */
static inline float synth_normal(uint64_t *s)
{
    uint64_t r = rng_next(s);
    uint32_t sum = (uint32_t)(r & 0xffff) + (uint32_t)((r >> 16) & 0xffff) +
                   (uint32_t)((r >> 32) & 0xffff) + (uint32_t)(r >> 48);
    return ((float)sum - 131070.0f) * (1.0f / 37837.22f);
}

static uint64_t synth_tensor_seed(uint64_t seed, const char *name)
{
    uint64_t h = UINT64_C(0xcbf29ce484222325); /* FNV-1a */
    for (const unsigned char *p = (const unsigned char *)name; *p; p++)
        h = (h ^ *p) * UINT64_C(0x100000001b3);
    uint64_t s = seed;
    return h ^ rng_next(&s);
}

#define SYNTH_CHUNK (1u << 22) /* elements generated per write */

typedef struct synth_progress {
    int on;
    const char *label;
    uint64_t done, total;
    int next_pct;
} synth_progress_t;

static void synth_report(synth_progress_t *p, uint64_t add)
{
    p->done += add;
    if (!p->on || p->total == 0)
        return;
    int pct = (int)(p->done * 100 / p->total);
    if (pct >= p->next_pct) {
        fprintf(stderr, "synth: %s: %3d%% (%.2f / %.2f GB)\n", p->label, pct,
                (double)p->done / 1e9, (double)p->total / 1e9);
        p->next_pct = (pct / 10 + 1) * 10;
    }
}

static int synth_fill(safetensors_writer_t *w, const synth_tensor_t *t, dtype_t dt,
                      uint64_t seed, void *buf, synth_progress_t *prog)
{
    uint64_t s = synth_tensor_seed(seed, t->name);
    float base = t->kind == SYNTH_NORM ? 1.0f : 0.0f;
    const float std = 0.02f;
    int64_t left = synth_numel(t);
    while (left > 0) {
        size_t n = left > SYNTH_CHUNK ? SYNTH_CHUNK : (size_t)left;
        switch (dt) {
        case DTYPE_F32: {
            float *o = buf;
            for (size_t i = 0; i < n; i++)
                o[i] = base + std * synth_normal(&s);
            break;
        }
        case DTYPE_F16: {
            uint16_t *o = buf;
            for (size_t i = 0; i < n; i++)
                o[i] = f32_to_f16(base + std * synth_normal(&s));
            break;
        }
        default: {
            uint16_t *o = buf;
            for (size_t i = 0; i < n; i++)
                o[i] = f32_to_bf16(base + std * synth_normal(&s));
            break;
        }
        }
        size_t bytes = n * dtype_size(dt);
        int err = safetensors_writer_write(w, buf, bytes);
        if (err)
            return err;
        synth_report(prog, bytes);
        left -= (int64_t)n;
    }
    return 0;
}

/* ---- files ---- */

static char *synth_path(const char *dir, const char *name)
{
    size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + b + 2);
    if (p) {
        memcpy(p, dir, a);
        p[a] = '/';
        memcpy(p + a + 1, name, b + 1);
    }
    return p;
}

static int synth_dump(json_t *j, const char *dir, const char *name)
{
    char *p = synth_path(dir, name);
    if (!p) {
        json_decref(j);
        return river_err_set(RIVER_ENOMEM, "synth: path");
    }
    int rc = j ? json_dump_file(j, p, JSON_INDENT(2) | JSON_REAL_PRECISION(15)) : -1;
    json_decref(j);
    int err = rc == 0 ? 0 : river_err_set(RIVER_EIO, "%s: cannot write", p);
    free(p);
    return err;
}

static int synth_config(const synth_shape_t *s, dtype_t dt, const char *dir)
{
    static const char *const torch_dtype[] = {
        [DTYPE_F32] = "float32", [DTYPE_F16] = "float16", [DTYPE_BF16] = "bfloat16"};
    static const char *const model_type[ARCH_COUNT] = {
        [ARCH_LLAMA] = "llama", [ARCH_MISTRAL] = "mistral", [ARCH_QWEN2] = "qwen2",
        [ARCH_QWEN3] = "qwen3", [ARCH_PHI3] = "phi3"};
    json_t *c = json_pack(
        "{s:[s], s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:f, s:f, s:b, s:i, s:s, s:s}",
        "architectures", synth_arch_class[s->arch], "model_type", model_type[s->arch],
        "hidden_size", s->dim, "intermediate_size", s->hidden, "num_hidden_layers",
        s->n_layers, "num_attention_heads", s->n_heads, "num_key_value_heads", s->n_kv_heads,
        "vocab_size", s->vocab, "max_position_embeddings", s->max_pos, "rms_norm_eps", s->eps,
        "rope_theta", s->theta, "tie_word_embeddings", s->tied, "bos_token_id", s->bos,
        "hidden_act", "silu", "torch_dtype", torch_dtype[dt]);
    if (!c)
        return river_err_set(RIVER_ENOMEM, "synth: config.json");
    if (s->n_eos == 1) {
        json_object_set_new(c, "eos_token_id", json_integer(s->eos[0]));
    } else {
        json_t *e = json_array();
        for (int i = 0; i < s->n_eos; i++)
            json_array_append_new(e, json_integer(s->eos[i]));
        json_object_set_new(c, "eos_token_id", e);
    }
    if (s->head_dim_in_config)
        json_object_set_new(c, "head_dim", json_integer(s->head_dim));
    if (s->partial < 1)
        json_object_set_new(c, "partial_rotary_factor", json_real(s->partial));
    json_t *rs = json_null();
    if (s->scaling == ROPE_SCALING_LLAMA3) {
        rs = json_pack("{s:f, s:f, s:f, s:i, s:s}", "factor", s->factor, "low_freq_factor",
                       s->low, "high_freq_factor", s->high, "original_max_position_embeddings",
                       s->orig_max_pos, "rope_type", "llama3");
    } else if (s->scaling == ROPE_SCALING_LONGROPE) {
        /* Made-up but plausible factors: near 1 for the short context, growing towards
         * the low frequencies for the long one. */
        int half = (int)((double)s->head_dim * s->partial) / 2;
        json_t *sf = json_array(), *lf = json_array();
        for (int i = 0; i < half; i++) {
            json_array_append_new(sf, json_real(1.0 + 0.01 * i));
            json_array_append_new(lf, json_real(1.0 + 0.25 * i));
        }
        rs = json_pack("{s:s, s:o, s:o}", "type", "longrope", "short_factor", sf,
                       "long_factor", lf);
        json_object_set_new(c, "original_max_position_embeddings",
                            json_integer(s->orig_max_pos));
    }
    json_object_set_new(c, "rope_scaling", rs);
    return synth_dump(c, dir, "config.json");
}

static void synth_unlink(const char *dir, const char *name)
{
    char *p = synth_path(dir, name);
    if (p)
        unlink(p); /* absence is the goal, so ENOENT is fine */
    free(p);
}

static int synth_write_shard(const synth_list_t *l, int shard, const char *path, dtype_t dt,
                             uint64_t seed, void *buf, synth_progress_t *prog)
{
    safetensors_writer_t *w;
    int err = safetensors_writer_new(&w, path);
    if (err)
        return err;
    safetensors_dtype_t sdt = safetensors_dtype_from_weight(dt);
    for (int i = 0; i < l->n && !err; i++)
        if (l->t[i].shard == shard)
            err = safetensors_writer_add(w, l->t[i].name, sdt, l->t[i].n_dims, l->t[i].shape);
    if (!err)
        err = safetensors_writer_set_metadata(w, "format", "pt");
    if (!err)
        err = safetensors_writer_begin(w);
    for (int i = 0; i < l->n && !err; i++)
        if (l->t[i].shard == shard)
            err = synth_fill(w, &l->t[i], dt, seed, buf, prog);
    if (!err)
        err = safetensors_writer_finish(w);
    safetensors_writer_destroy(&w);
    return err;
}

int synth_write(const synth_opts_t *o)
{
    const synth_shape_t *s = synth_find(o->shape);
    if (!s)
        return river_err_set(RIVER_ENOTFOUND, "synth: unknown shape '%s'", o->shape);
    if (o->dtype != DTYPE_F32 && o->dtype != DTYPE_F16 && o->dtype != DTYPE_BF16)
        return river_err_set(RIVER_EDTYPE, "synth: dtype %s (f32, f16 or bf16)",
                             dtype_name(o->dtype));
    if (mkdir(o->out_dir, 0755) != 0 && errno != EEXIST)
        return river_err_set(RIVER_EIO, "%s: mkdir: %s", o->out_dir, strerror(errno));

    synth_list_t l;
    int err = synth_tensors(s, &l);
    if (err)
        return err;
    void *buf = malloc((size_t)SYNTH_CHUNK * dtype_size(o->dtype));
    if (!buf) {
        free(l.t);
        return river_err_set(RIVER_ENOMEM, "synth: buffer");
    }

    /* Greedy sharding in file order; a tensor larger than a shard gets one of its own. */
    uint64_t limit = o->shard_bytes ? o->shard_bytes : SYNTH_DEFAULT_SHARD_BYTES;
    uint64_t in_shard = 0, total = 0;
    int n_shards = 1;
    for (int i = 0; i < l.n; i++) {
        uint64_t b = (uint64_t)synth_numel(&l.t[i]) * dtype_size(o->dtype);
        if (in_shard > 0 && in_shard + b > limit) {
            n_shards++;
            in_shard = 0;
        }
        l.t[i].shard = n_shards - 1;
        in_shard += b;
        total += b;
    }
    char label[96];
    snprintf(label, sizeof label, "%s %s", s->name, dtype_name(o->dtype));
    synth_progress_t prog = {.on = o->progress, .label = label, .total = total};

    /* A stale index would shadow a new single file and vice versa. */
    synth_unlink(o->out_dir, n_shards > 1 ? "model.safetensors" : "model.safetensors.index.json");
    json_t *weight_map = n_shards > 1 ? json_object() : NULL;
    for (int sh = 0; sh < n_shards && !err; sh++) {
        char name[64];
        if (n_shards == 1)
            snprintf(name, sizeof name, "model.safetensors");
        else
            snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", sh + 1, n_shards);
        char *path = synth_path(o->out_dir, name);
        if (!path) {
            err = river_err_set(RIVER_ENOMEM, "synth: path");
            break;
        }
        err = synth_write_shard(&l, sh, path, o->dtype, o->seed, buf, &prog);
        free(path);
        for (int i = 0; i < l.n && weight_map && !err; i++)
            if (l.t[i].shard == sh)
                json_object_set_new(weight_map, l.t[i].name, json_string(name));
    }
    if (!err && weight_map) {
        json_t *index = json_pack("{s:{s:I}, s:O}", "metadata", "total_size",
                                  (json_int_t)total, "weight_map", weight_map);
        err = synth_dump(index, o->out_dir, "model.safetensors.index.json");
    }
    json_decref(weight_map);
    /* config.json last: a directory is only a model once its weights are complete. */
    if (!err)
        err = synth_config(s, o->dtype, o->out_dir);
    free(buf);
    free(l.t);
    return err;
}
