/* Model loading (format detection, Hugging Face safetensors checkpoints), configuration
 * checks and the size accounting used by the roofline. llama2.c files are read in
 * llama2c.c and config.json in hfconfig.c. */
#include "model/model.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/err.h"
#include "model/model_internal.h"
#include "model/safetensors.h"
#include "kernels/half.h"

const char *arch_name(arch_t a)
{
    switch (a) {
    case ARCH_LLAMA:
        return "llama";
    case ARCH_MISTRAL:
        return "mistral";
    case ARCH_QWEN2:
        return "qwen2";
    case ARCH_QWEN3:
        return "qwen3";
    case ARCH_PHI3:
        return "phi3";
    case ARCH_COUNT:
        break;
    }
    return "unknown";
}

/* Bounds that keep every size product well inside int64 and reject absurd headers early;
 * they are far above any real model. */
#define MODEL_MAX_DIM (1 << 20)
#define MODEL_MAX_LAYERS 4096
#define MODEL_MAX_HEADS (1 << 14)
#define MODEL_MAX_VOCAB (1 << 24)
#define MODEL_MAX_SEQ (1 << 26)

int model_config_validate(const model_config_t *cfg, const char *what)
{
#define CHECK(cond, ...)                                       \
    do {                                                       \
        if (!(cond))                                           \
            return river_err_set(RIVER_ECONFIG, __VA_ARGS__); \
    } while (0)
    CHECK((unsigned)cfg->arch < ARCH_COUNT, "%s: unknown architecture %d", what, cfg->arch);
    CHECK(cfg->dim > 0 && cfg->dim <= MODEL_MAX_DIM, "%s: hidden size %d", what, cfg->dim);
    CHECK(cfg->n_layers > 0 && cfg->n_layers <= MODEL_MAX_LAYERS, "%s: %d layers", what,
          cfg->n_layers);
    CHECK(cfg->n_heads > 0 && cfg->n_heads <= MODEL_MAX_HEADS, "%s: %d attention heads", what,
          cfg->n_heads);
    CHECK(cfg->n_kv_heads > 0 && cfg->n_kv_heads <= cfg->n_heads &&
              cfg->n_heads % cfg->n_kv_heads == 0,
          "%s: %d key/value heads do not divide %d attention heads", what, cfg->n_kv_heads,
          cfg->n_heads);
    CHECK(cfg->head_dim > 0 && cfg->head_dim <= MODEL_MAX_HEADS &&
              (int64_t)cfg->head_dim * cfg->n_heads <= MODEL_MAX_DIM,
          "%s: head_dim %d", what, cfg->head_dim);
    CHECK(cfg->hidden_dim > 0 && cfg->hidden_dim <= 4 * MODEL_MAX_DIM, "%s: FFN size %d", what,
          cfg->hidden_dim);
    CHECK(cfg->vocab_size > 0 && cfg->vocab_size <= MODEL_MAX_VOCAB, "%s: vocabulary %d",
          what, cfg->vocab_size);
    CHECK(cfg->max_seq_len > 0 && cfg->max_seq_len <= MODEL_MAX_SEQ, "%s: max sequence %d",
          what, cfg->max_seq_len);
    CHECK(cfg->norm_eps > 0 && cfg->norm_eps < 1, "%s: norm eps %g", what,
          (double)cfg->norm_eps);
    CHECK(cfg->rope_theta > 0 && isfinite(cfg->rope_theta), "%s: rope theta %g", what,
          (double)cfg->rope_theta);
    CHECK(cfg->partial_rotary_factor > 0 && cfg->partial_rotary_factor <= 1,
          "%s: partial rotary factor %g", what, (double)cfg->partial_rotary_factor);
    int rot = (int)((float)cfg->head_dim * cfg->partial_rotary_factor) & ~1;
    CHECK(rot >= 2, "%s: no rotary dimensions (head_dim %d, partial factor %g)", what,
          cfg->head_dim, (double)cfg->partial_rotary_factor);
    CHECK(cfg->rope_layout == ROPE_INTERLEAVED || cfg->rope_layout == ROPE_HALF,
          "%s: rope layout %d", what, cfg->rope_layout);
    switch (cfg->rope_scaling) {
    case ROPE_SCALING_NONE:
        break;
    case ROPE_SCALING_LINEAR:
        CHECK(cfg->rope_factor > 0, "%s: rope scaling factor %g", what,
              (double)cfg->rope_factor);
        break;
    case ROPE_SCALING_LLAMA3:
        CHECK(cfg->rope_factor > 0 && cfg->rope_low_freq_factor > 0 &&
                  cfg->rope_high_freq_factor > cfg->rope_low_freq_factor &&
                  cfg->rope_orig_max_pos > 0,
              "%s: llama3 rope scaling needs factor > 0, 0 < low < high frequency factors "
              "and an original context",
              what);
        break;
    case ROPE_SCALING_LONGROPE:
        CHECK(cfg->rope_short_factor && cfg->rope_long_factor && cfg->rope_orig_max_pos > 0 &&
                  cfg->rope_factor > 0,
              "%s: longrope scaling needs short/long factors and an original context", what);
        break;
    default:
        CHECK(0, "%s: rope scaling %d", what, cfg->rope_scaling);
    }
    CHECK(cfg->bos_id >= -1 && cfg->bos_id < cfg->vocab_size, "%s: bos id %d outside the "
          "vocabulary of %d", what, cfg->bos_id, cfg->vocab_size);
    CHECK(cfg->n_eos >= 0 && cfg->n_eos <= 4, "%s: %d eos ids", what, cfg->n_eos);
    for (int i = 0; i < cfg->n_eos; i++)
        CHECK(cfg->eos_ids[i] >= 0 && cfg->eos_ids[i] < cfg->vocab_size,
              "%s: eos id %d outside the vocabulary of %d", what, cfg->eos_ids[i],
              cfg->vocab_size);
    return 0;
#undef CHECK
}

int model_mapping_own(model_mapping_t *map, void *p)
{
    if (map->n_owned == map->cap_owned) {
        int cap = map->cap_owned ? 2 * map->cap_owned : 64;
        void **o = realloc(map->owned, sizeof *o * (size_t)cap);
        if (!o) {
            free(p);
            return river_err_set(RIVER_ENOMEM, "model: owned buffers");
        }
        map->owned = o;
        map->cap_owned = cap;
    }
    map->owned[map->n_owned++] = p;
    return 0;
}

/* ---- Hugging Face checkpoints ---- */

typedef struct hf_ctx {
    model_t *m;
    const char *single_path;   /* model.safetensors when unsharded */
    json_t *index;             /* model.safetensors.index.json, or NULL */
    const json_t *weight_map;  /* borrowed from index */
    char *index_path;
    const char **shard_names;  /* (map->n_files) names from weight_map, parallel to files */
} hf_ctx_t;

static char *path_join(const char *dir, const char *name)
{
    size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + b + 2);
    if (!p)
        return NULL;
    memcpy(p, dir, a);
    p[a] = '/';
    memcpy(p + a + 1, name, b + 1);
    return p;
}

static int file_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

static int hf_open_shard(hf_ctx_t *c, const char *name)
{
    model_mapping_t *map = c->m->map;
    char *p = path_join(c->m->dir, name);
    if (!p)
        return river_err_set(RIVER_ENOMEM, "%s: path", name);
    int err = safetensors_open(&map->files[map->n_files], p);
    free(p);
    if (err)
        return err;
    if (c->shard_names)
        c->shard_names[map->n_files] = name;
    map->n_files++;
    return 0;
}

/* Maps model.safetensors, or every shard the index names. */
static int hf_open_weights(hf_ctx_t *c)
{
    model_t *m = c->m;
    model_mapping_t *map = m->map;
    c->index_path = path_join(m->dir, "model.safetensors.index.json");
    if (!c->index_path)
        return river_err_set(RIVER_ENOMEM, "%s: path", m->dir);
    if (!file_exists(c->index_path)) {
        map->files = calloc(1, sizeof *map->files);
        if (!map->files)
            return river_err_set(RIVER_ENOMEM, "%s: shards", m->dir);
        int err = hf_open_shard(c, "model.safetensors");
        if (err == RIVER_ENOTFOUND)
            return river_err_set(RIVER_ENOTFOUND, "%s: no model.safetensors or "
                                 "model.safetensors.index.json", m->dir);
        if (!err)
            c->single_path = safetensors_path(map->files[0]);
        return err;
    }

    json_error_t jerr;
    c->index = json_load_file(c->index_path, JSON_REJECT_DUPLICATES, &jerr);
    if (!c->index)
        return river_err_set(RIVER_EFORMAT, "%s: invalid JSON: %s (line %d)", c->index_path,
                             jerr.text, jerr.line);
    c->weight_map = json_object_get(c->index, "weight_map");
    if (!json_is_object(c->weight_map) || json_object_size(c->weight_map) == 0)
        return river_err_set(RIVER_EFORMAT, "%s: no weight_map object", c->index_path);
    size_t n = json_object_size(c->weight_map);
    map->files = calloc(n, sizeof *map->files);
    c->shard_names = calloc(n, sizeof *c->shard_names);
    if (!map->files || !c->shard_names)
        return river_err_set(RIVER_ENOMEM, "%s: shards", c->index_path);
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)c->weight_map, key, val)
    {
        const char *shard = json_string_value(val);
        /* A shard is a file beside the index; anything else could point anywhere. */
        if (!shard || !shard[0] || strchr(shard, '/') || !strcmp(shard, ".") ||
            !strcmp(shard, ".."))
            return river_err_set(RIVER_EFORMAT, "%s: weight_map entry '%s' -> '%s' is not a "
                                 "plain file name", c->index_path, key, shard ? shard : "?");
        int seen = 0;
        for (int i = 0; i < map->n_files && !seen; i++)
            seen = !strcmp(c->shard_names[i], shard);
        if (seen)
            continue;
        int err = hf_open_shard(c, shard);
        if (err)
            return err;
    }
    return 0;
}

/* Finds a tensor; *file names where it was looked for (for messages). No error detail. */
static const safetensors_tensor_t *hf_find(const hf_ctx_t *c, const char *name,
                                           const char **file)
{
    const model_mapping_t *map = c->m->map;
    if (!c->weight_map) {
        *file = c->single_path;
        return safetensors_find(map->files[0], name);
    }
    const char *shard = json_string_value(json_object_get(c->weight_map, name));
    *file = c->index_path;
    if (!shard)
        return NULL;
    for (int i = 0; i < map->n_files; i++)
        if (!strcmp(c->shard_names[i], shard)) {
            *file = safetensors_path(map->files[i]);
            return safetensors_find(map->files[i], name);
        }
    return NULL;
}

static void shape_str(char *buf, size_t cap, const safetensors_tensor_t *t)
{
    size_t k = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < t->n_dims && k < cap; i++)
        k += (size_t)snprintf(buf + k, cap - k, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    if (k < cap)
        snprintf(buf + k, cap - k, "]");
}

/* Looks up a float tensor of the given shape (n_dims 1 or 2). */
static int hf_tensor(const hf_ctx_t *c, const char *name, int n_dims, int64_t rows,
                     int64_t cols, const safetensors_tensor_t **out, dtype_t *dt)
{
    const char *file;
    const safetensors_tensor_t *t = hf_find(c, name, &file);
    if (!t)
        return river_err_set(RIVER_ENOTFOUND, "%s: tensor '%s' not found", file, name);
    if (safetensors_dtype_to_weight(t->dtype, dt) != 0)
        return river_err_set(RIVER_EDTYPE, "%s: tensor '%s' has dtype %s; expected F32, F16 "
                             "or BF16", file, name, t->dtype_str);
    int ok = t->n_dims == n_dims &&
             (n_dims == 1 ? t->shape[0] == cols : t->shape[0] == rows && t->shape[1] == cols);
    if (!ok) {
        char got[160];
        shape_str(got, sizeof got, t);
        if (n_dims == 1)
            return river_err_set(RIVER_ESHAPE, "%s: tensor '%s' has shape %s, expected [%lld]",
                                 file, name, got, (long long)cols);
        return river_err_set(RIVER_ESHAPE, "%s: tensor '%s' has shape %s, expected "
                             "[%lld, %lld]", file, name, got, (long long)rows, (long long)cols);
    }
    *out = t;
    return 0;
}

/* A matrix, used in place from the mapping. */
static int hf_matrix(const hf_ctx_t *c, const char *name, int64_t rows, int64_t cols,
                     weight_t *w)
{
    const safetensors_tensor_t *t;
    dtype_t dt;
    int err = hf_tensor(c, name, 2, rows, cols, &t, &dt);
    if (err)
        return err;
    *w = (weight_t){.dtype = dt, .rows = rows, .cols = cols, .data = t->data};
    return 0;
}

/* A vector, copied to owned float32 so the kernels see one type for norms and biases. The
 * copy goes through memcpy because the mapping gives no alignment guarantee. */
static int hf_vector(const hf_ctx_t *c, const char *name, int64_t n, weight_t *w)
{
    const safetensors_tensor_t *t;
    dtype_t dt;
    int err = hf_tensor(c, name, 1, 1, n, &t, &dt);
    if (err)
        return err;
    float *v = malloc(sizeof *v * (size_t)n);
    if (!v)
        return river_err_set(RIVER_ENOMEM, "%s: %lld floats", name, (long long)n);
    const unsigned char *src = t->data;
    if (dt == DTYPE_F32) {
        memcpy(v, src, sizeof *v * (size_t)n);
    } else {
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, src + 2 * i, sizeof h);
            v[i] = dt == DTYPE_F16 ? f16_to_f32(h) : bf16_to_f32(h);
        }
    }
    if ((err = model_mapping_own(c->m->map, v)))
        return err;
    *w = (weight_t){.dtype = DTYPE_F32, .rows = 1, .cols = n, .data = v};
    return 0;
}

/* Rows [row0, row0 + n) of a matrix, as a view into the same bytes. */
static weight_t weight_rows(const weight_t *w, int64_t row0, int64_t n)
{
    weight_t v = *w;
    v.rows = n;
    v.data = (const unsigned char *)w->data + (size_t)row0 * dtype_row_bytes(w->dtype, w->cols);
    return v;
}

static int hf_layer(const hf_ctx_t *c, int l, layer_weights_t *L)
{
    const model_config_t *cfg = &c->m->cfg;
    int64_t dim = cfg->dim, q_rows = (int64_t)cfg->n_heads * cfg->head_dim;
    int64_t kv_rows = (int64_t)cfg->n_kv_heads * cfg->head_dim, hid = cfg->hidden_dim;
    char n[128];
    int err;
#define NAME(suffix) (snprintf(n, sizeof n, "model.layers.%d.%s", l, suffix), n)
    if ((err = hf_vector(c, NAME("input_layernorm.weight"), dim, &L->attn_norm)) ||
        (err = hf_vector(c, NAME("post_attention_layernorm.weight"), dim, &L->ffn_norm)) ||
        (err = hf_matrix(c, NAME("self_attn.o_proj.weight"), dim, q_rows, &L->wo)) ||
        (err = hf_matrix(c, NAME("mlp.down_proj.weight"), dim, hid, &L->w_down)))
        return err;
    if (cfg->arch == ARCH_PHI3) {
        /* Fused projections: q, k, v (and gate, up) are consecutive row blocks. */
        weight_t qkv, gate_up;
        if ((err = hf_matrix(c, NAME("self_attn.qkv_proj.weight"), q_rows + 2 * kv_rows, dim,
                             &qkv)) ||
            (err = hf_matrix(c, NAME("mlp.gate_up_proj.weight"), 2 * hid, dim, &gate_up)))
            return err;
        L->wq = weight_rows(&qkv, 0, q_rows);
        L->wk = weight_rows(&qkv, q_rows, kv_rows);
        L->wv = weight_rows(&qkv, q_rows + kv_rows, kv_rows);
        L->w_gate = weight_rows(&gate_up, 0, hid);
        L->w_up = weight_rows(&gate_up, hid, hid);
    } else {
        if ((err = hf_matrix(c, NAME("self_attn.q_proj.weight"), q_rows, dim, &L->wq)) ||
            (err = hf_matrix(c, NAME("self_attn.k_proj.weight"), kv_rows, dim, &L->wk)) ||
            (err = hf_matrix(c, NAME("self_attn.v_proj.weight"), kv_rows, dim, &L->wv)) ||
            (err = hf_matrix(c, NAME("mlp.gate_proj.weight"), hid, dim, &L->w_gate)) ||
            (err = hf_matrix(c, NAME("mlp.up_proj.weight"), hid, dim, &L->w_up)))
            return err;
    }
    if (cfg->arch == ARCH_QWEN2) {
        if ((err = hf_vector(c, NAME("self_attn.q_proj.bias"), q_rows, &L->bq)) ||
            (err = hf_vector(c, NAME("self_attn.k_proj.bias"), kv_rows, &L->bk)) ||
            (err = hf_vector(c, NAME("self_attn.v_proj.bias"), kv_rows, &L->bv)))
            return err;
    }
    if (cfg->arch == ARCH_QWEN3) {
        if ((err = hf_vector(c, NAME("self_attn.q_norm.weight"), cfg->head_dim, &L->q_norm)) ||
            (err = hf_vector(c, NAME("self_attn.k_norm.weight"), cfg->head_dim, &L->k_norm)))
            return err;
    }
#undef NAME
    return 0;
}

static int hf_load(model_t *m, const char *config_path)
{
    int err = hfconfig_load(&m->cfg, config_path);
    if (err)
        return err;
    hf_ctx_t c = {.m = m};
    if ((err = hf_open_weights(&c)))
        goto out;
    model_config_t *cfg = &m->cfg;
    const char *file;
    if (cfg->tied_embeddings) {
        /* A tied checkpoint may keep the shared table under either name. */
        const char *name = hf_find(&c, "model.embed_tokens.weight", &file)
                               ? "model.embed_tokens.weight"
                               : hf_find(&c, "lm_head.weight", &file) ? "lm_head.weight" : NULL;
        if (!name) {
            err = river_err_set(RIVER_ENOTFOUND, "%s: tensor 'model.embed_tokens.weight' not "
                                "found (nor 'lm_head.weight', tied)", file);
            goto out;
        }
        if ((err = hf_matrix(&c, name, cfg->vocab_size, cfg->dim, &m->embed)))
            goto out;
        m->lm_head = m->embed;
    } else if ((err = hf_matrix(&c, "model.embed_tokens.weight", cfg->vocab_size, cfg->dim,
                                &m->embed)) ||
               (err = hf_matrix(&c, "lm_head.weight", cfg->vocab_size, cfg->dim,
                                &m->lm_head))) {
        goto out;
    }
    if ((err = hf_vector(&c, "model.norm.weight", cfg->dim, &m->final_norm)))
        goto out;
    m->layers = calloc((size_t)cfg->n_layers, sizeof *m->layers);
    if (!m->layers) {
        err = river_err_set(RIVER_ENOMEM, "%s: %d layers", config_path, cfg->n_layers);
        goto out;
    }
    for (int l = 0; l < cfg->n_layers; l++)
        if ((err = hf_layer(&c, l, &m->layers[l])))
            goto out;
    cfg->dtype = m->layers[0].wq.dtype;
out:
    json_decref(c.index);
    free(c.index_path);
    free(c.shard_names);
    return err;
}

/* ---- entry points ---- */

/* Whether a file holds JSON (a config.json) rather than a llama2.c .bin. The .bin starts
 * with a little-endian int32, which can only look like '{' followed by a JSON key or '}'
 * for implausible header values. */
static int looks_like_json(const char *path, int *is_json)
{
    size_t n = strlen(path);
    if (n >= 5 && !strcmp(path + n - 5, ".json")) {
        *is_json = 1;
        return 0;
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return river_err_set(errno == ENOENT ? RIVER_ENOTFOUND : RIVER_ESYS, "%s: open: %s",
                             path, strerror(errno));
    unsigned char buf[64];
    ssize_t got = read(fd, buf, sizeof buf);
    int rerr = errno;
    close(fd);
    if (got < 0)
        return river_err_set(RIVER_EIO, "%s: read: %s", path, strerror(rerr));
    ssize_t i = 0;
    while (i < got && strchr(" \t\r\n", buf[i]) && buf[i])
        i++;
    *is_json = 0;
    if (i < got && buf[i] == '{') {
        i++;
        while (i < got && strchr(" \t\r\n", buf[i]) && buf[i])
            i++;
        *is_json = i < got && (buf[i] == '"' || buf[i] == '}');
    }
    return 0;
}

static char *dir_of(const char *path)
{
    const char *slash = strrchr(path, '/');
    if (!slash)
        return strdup(".");
    if (slash == path)
        return strdup("/");
    return strndup(path, (size_t)(slash - path));
}

int model_load(model_t **out, const char *path)
{
    int err;
    model_t *m = calloc(1, sizeof *m);
    if (!m)
        return river_err_set(RIVER_ENOMEM, "%s: model", path);
    m->map = calloc(1, sizeof *m->map);
    m->path = strdup(path);
    if (!m->map || !m->path) {
        err = river_err_set(RIVER_ENOMEM, "%s: model", path);
        goto fail;
    }
    struct stat st;
    if (stat(path, &st) != 0) {
        err = river_err_set(errno == ENOENT ? RIVER_ENOTFOUND : RIVER_ESYS, "%s: %s", path,
                            strerror(errno));
        goto fail;
    }
    if (S_ISDIR(st.st_mode)) {
        m->dir = strdup(path);
        char *cfg_path = m->dir ? path_join(path, "config.json") : NULL;
        if (!cfg_path) {
            err = river_err_set(RIVER_ENOMEM, "%s: path", path);
            goto fail;
        }
        if (!file_exists(cfg_path))
            err = river_err_set(RIVER_ENOTFOUND, "%s: no config.json in this directory", path);
        else
            err = hf_load(m, cfg_path);
        free(cfg_path);
        if (err)
            goto fail;
    } else {
        int is_json = 0;
        if ((err = looks_like_json(path, &is_json)))
            goto fail;
        m->dir = dir_of(path);
        if (!m->dir) {
            err = river_err_set(RIVER_ENOMEM, "%s: path", path);
            goto fail;
        }
        if (is_json) {
            err = hf_load(m, path);
        } else {
            m->is_llama2c = 1;
            err = llama2c_load(m, path);
        }
        if (err)
            goto fail;
    }
    *out = m;
    return 0;

fail:
    model_destroy(&m);
    return err;
}

void model_destroy(model_t **pm)
{
    model_t *m = *pm;
    if (!m)
        return;
    model_mapping_t *map = m->map;
    if (map) {
        for (int i = 0; i < map->n_files; i++)
            safetensors_destroy(&map->files[i]);
        free(map->files);
        if (map->bin)
            munmap(map->bin, map->bin_size);
        for (int i = 0; i < map->n_owned; i++)
            free(map->owned[i]);
        free(map->owned);
        free(map);
    }
    hfconfig_free(&m->cfg);
    free(m->layers);
    free(m->path);
    free(m->dir);
    free(m);
    *pm = NULL;
}

void model_set_norm_eps(model_t *m, float eps)
{
    m->cfg.norm_eps = eps;
}

/* ---- size accounting ---- */

static int64_t weight_numel(const weight_t *w)
{
    return w->data ? w->rows * w->cols : 0;
}

/* Bytes of `rows` rows of w: codes plus, for grouped quantization, fp16 scales and zeros. */
static int64_t weight_rows_bytes(const weight_t *w, int64_t rows)
{
    if (!w->data)
        return 0;
    int64_t per_row = (int64_t)dtype_row_bytes(w->dtype, w->cols);
    if (w->group > 0) {
        int64_t groups = (w->cols + w->group - 1) / w->group;
        per_row += groups * 2 * ((w->scales != NULL) + (w->zeros != NULL));
    }
    return rows * per_row;
}

static int64_t layer_sum(const layer_weights_t *L, int bytes)
{
    const weight_t *ws[] = {&L->attn_norm, &L->wq,     &L->wk,     &L->wv,     &L->wo,
                            &L->bq,        &L->bk,     &L->bv,     &L->q_norm, &L->k_norm,
                            &L->ffn_norm,  &L->w_gate, &L->w_up,   &L->w_down};
    int64_t s = 0;
    for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++)
        s += bytes ? weight_rows_bytes(ws[i], ws[i]->rows) : weight_numel(ws[i]);
    return s;
}

static int model_is_tied(const model_t *m)
{
    return m->lm_head.data == m->embed.data;
}

int64_t model_param_count(const model_t *m)
{
    int64_t n = weight_numel(&m->embed) + weight_numel(&m->final_norm);
    if (!model_is_tied(m))
        n += weight_numel(&m->lm_head);
    for (int l = 0; l < m->cfg.n_layers; l++)
        n += layer_sum(&m->layers[l], 0);
    return n;
}

int64_t model_layer_bytes(const layer_weights_t *L)
{
    return layer_sum(L, 1);
}

int64_t model_bytes_per_token(const model_t *m)
{
    int64_t b = weight_rows_bytes(&m->final_norm, 1) +
                weight_rows_bytes(&m->lm_head, m->lm_head.rows) +
                weight_rows_bytes(&m->embed, 1);
    for (int l = 0; l < m->cfg.n_layers; l++)
        b += layer_sum(&m->layers[l], 1);
    return b;
}
