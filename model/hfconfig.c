/* Hugging Face config.json -> model_config_t, for the architectures in arch_t. */
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/err.h"
#include "model/model_internal.h"

static const struct {
    const char *cls;  /* architectures[0] */
    const char *type; /* model_type */
    arch_t arch;
} hf_archs[] = {
    {"LlamaForCausalLM", "llama", ARCH_LLAMA},
    {"MistralForCausalLM", "mistral", ARCH_MISTRAL},
    {"Qwen2ForCausalLM", "qwen2", ARCH_QWEN2},
    {"Qwen3ForCausalLM", "qwen3", ARCH_QWEN3},
    {"Phi3ForCausalLM", "phi3", ARCH_PHI3},
};

/* An integer field. Absent or null gives `def` unless required. */
static int hf_int(const char *path, const json_t *o, const char *key, int required, int def,
                  int *out)
{
    const json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) {
        if (required)
            return river_err_set(RIVER_EFORMAT, "%s: missing \"%s\"", path, key);
        *out = def;
        return 0;
    }
    if (!json_is_integer(v) || json_integer_value(v) < INT_MIN ||
        json_integer_value(v) > INT_MAX)
        return river_err_set(RIVER_EFORMAT, "%s: \"%s\" must be an integer", path, key);
    *out = (int)json_integer_value(v);
    return 0;
}

/* A number field (integer or real). Absent or null gives `def` unless required. */
static int hf_float(const char *path, const json_t *o, const char *key, int required,
                    float def, float *out)
{
    const json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) {
        if (required)
            return river_err_set(RIVER_EFORMAT, "%s: missing \"%s\"", path, key);
        *out = def;
        return 0;
    }
    if (!json_is_number(v))
        return river_err_set(RIVER_EFORMAT, "%s: \"%s\" must be a number", path, key);
    *out = (float)json_number_value(v);
    return 0;
}

static int hf_bool(const char *path, const json_t *o, const char *key, int def, int *out)
{
    const json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return 0;
    }
    if (!json_is_boolean(v))
        return river_err_set(RIVER_EFORMAT, "%s: \"%s\" must be true or false", path, key);
    *out = json_is_true(v);
    return 0;
}

static int hf_arch(const char *path, const json_t *root, arch_t *out)
{
    const json_t *archs = json_object_get(root, "architectures");
    const char *name = NULL;
    int by_class = 0;
    if (json_is_array(archs) && json_array_size(archs) > 0) {
        name = json_string_value(json_array_get(archs, 0));
        if (!name)
            return river_err_set(RIVER_EFORMAT, "%s: architectures[0] is not a string", path);
        by_class = 1;
    } else {
        name = json_string_value(json_object_get(root, "model_type"));
        if (!name)
            return river_err_set(RIVER_EFORMAT,
                                 "%s: neither \"architectures\" nor \"model_type\" is given",
                                 path);
    }
    for (size_t i = 0; i < sizeof hf_archs / sizeof hf_archs[0]; i++)
        if (!strcmp(name, by_class ? hf_archs[i].cls : hf_archs[i].type)) {
            *out = hf_archs[i].arch;
            return 0;
        }
    return river_err_set(RIVER_EARCH,
                         "%s: architecture '%s' is not supported (supported: Llama, Mistral, "
                         "Qwen2, Qwen3, Phi3 causal LMs)",
                         path, name);
}

/* A token id field that may be an integer, a list of integers or null. */
static int hf_ids(const char *path, const json_t *v, const char *key, int *ids, int max,
                  int *n)
{
    *n = 0;
    if (!v || json_is_null(v))
        return 0;
    if (json_is_integer(v)) {
        if (json_integer_value(v) < 0 || json_integer_value(v) > INT_MAX)
            return river_err_set(RIVER_EFORMAT, "%s: \"%s\" is not a token id", path, key);
        ids[(*n)++] = (int)json_integer_value(v);
        return 0;
    }
    if (!json_is_array(v))
        return river_err_set(RIVER_EFORMAT, "%s: \"%s\" must be an integer or a list", path,
                             key);
    if (json_array_size(v) > (size_t)max)
        return river_err_set(RIVER_EUNSUPPORTED, "%s: \"%s\" lists %zu ids, at most %d are "
                             "supported", path, key, json_array_size(v), max);
    size_t i;
    json_t *e;
    json_array_foreach(v, i, e)
    {
        if (!json_is_integer(e) || json_integer_value(e) < 0 ||
            json_integer_value(e) > INT_MAX)
            return river_err_set(RIVER_EFORMAT, "%s: \"%s\" holds a non-id", path, key);
        ids[(*n)++] = (int)json_integer_value(e);
    }
    return 0;
}

/* Reads bos/eos from one JSON object; leaves fields the object does not have alone. */
static int hf_special_ids(const char *path, const json_t *o, model_config_t *cfg)
{
    int bos[1], nb;
    int err = hf_ids(path, json_object_get(o, "bos_token_id"), "bos_token_id", bos, 1, &nb);
    if (err)
        return err;
    if (nb && cfg->bos_id < 0)
        cfg->bos_id = bos[0];
    if (cfg->n_eos == 0)
        err = hf_ids(path, json_object_get(o, "eos_token_id"), "eos_token_id", cfg->eos_ids,
                     4, &cfg->n_eos);
    return err;
}

/* generation_config.json beside config.json supplies ids that config.json lacks. */
static int hf_generation_config(const char *config_path, model_config_t *cfg)
{
    const char *slash = strrchr(config_path, '/');
    size_t dlen = slash ? (size_t)(slash - config_path) + 1 : 0;
    static const char gen_name[] = "generation_config.json";
    char *gpath = malloc(dlen + sizeof gen_name);
    if (!gpath)
        return river_err_set(RIVER_ENOMEM, "%s: path", config_path);
    memcpy(gpath, config_path, dlen);
    memcpy(gpath + dlen, gen_name, sizeof gen_name);
    int err = 0;
    struct stat st;
    if (stat(gpath, &st) == 0) {
        json_error_t jerr;
        json_t *g = json_load_file(gpath, JSON_REJECT_DUPLICATES, &jerr);
        if (!g || !json_is_object(g))
            err = river_err_set(RIVER_EFORMAT, "%s: not a JSON object: %s (line %d)", gpath,
                                g ? "wrong type" : jerr.text, jerr.line);
        else
            err = hf_special_ids(gpath, g, cfg);
        json_decref(g);
    }
    free(gpath);
    return err;
}

/* A longrope factor list of exactly n numbers, as an owned float array. */
static int hf_factor_list(const char *path, const json_t *rs, const char *key, int n,
                          float **out)
{
    const json_t *v = json_object_get(rs, key);
    if (!json_is_array(v) || json_array_size(v) != (size_t)n)
        return river_err_set(RIVER_EFORMAT,
                             "%s: rope_scaling.%s must be a list of %d numbers "
                             "(rotary dims / 2)",
                             path, key, n);
    float *f = malloc(sizeof *f * (size_t)n);
    if (!f)
        return river_err_set(RIVER_ENOMEM, "%s: %s", path, key);
    for (int i = 0; i < n; i++) {
        const json_t *e = json_array_get(v, (size_t)i);
        if (!json_is_number(e) || !(json_number_value(e) > 0)) {
            free(f);
            return river_err_set(RIVER_EFORMAT, "%s: rope_scaling.%s[%d] is not a positive "
                                 "number", path, key, i);
        }
        f[i] = (float)json_number_value(e);
    }
    *out = f;
    return 0;
}

static int hf_rope_scaling(const char *path, const json_t *root, model_config_t *cfg)
{
    /* transformers 5 moved the scaling (and theta) into "rope_parameters". */
    const json_t *rs = json_object_get(root, "rope_scaling");
    if (!rs || json_is_null(rs))
        rs = json_object_get(root, "rope_parameters");
    cfg->rope_scaling = ROPE_SCALING_NONE;
    cfg->rope_factor = 1.0f;
    if (!rs || json_is_null(rs))
        return 0;
    if (!json_is_object(rs))
        return river_err_set(RIVER_EFORMAT, "%s: rope_scaling must be an object or null", path);
    /* Newer configs say "rope_type", older ones "type". */
    const char *type = json_string_value(json_object_get(rs, "rope_type"));
    if (!type)
        type = json_string_value(json_object_get(rs, "type"));
    if (!type) {
        if (rs == json_object_get(root, "rope_parameters"))
            return 0; /* theta only */
        return river_err_set(RIVER_EFORMAT, "%s: rope_scaling has no rope_type", path);
    }
    int err;
    if (!strcmp(type, "default"))
        return 0;
    if (!strcmp(type, "linear")) {
        cfg->rope_scaling = ROPE_SCALING_LINEAR;
        return hf_float(path, rs, "factor", 1, 1.0f, &cfg->rope_factor);
    }
    if (!strcmp(type, "llama3")) {
        cfg->rope_scaling = ROPE_SCALING_LLAMA3;
        if ((err = hf_float(path, rs, "factor", 1, 1.0f, &cfg->rope_factor)) ||
            (err = hf_float(path, rs, "low_freq_factor", 1, 1.0f,
                            &cfg->rope_low_freq_factor)) ||
            (err = hf_float(path, rs, "high_freq_factor", 1, 1.0f,
                            &cfg->rope_high_freq_factor)) ||
            (err = hf_int(path, rs, "original_max_position_embeddings", 1, 0,
                          &cfg->rope_orig_max_pos)))
            return err;
        if (!(cfg->rope_high_freq_factor > cfg->rope_low_freq_factor))
            return river_err_set(RIVER_ECONFIG, "%s: llama3 rope_scaling needs "
                                 "high_freq_factor > low_freq_factor", path);
        return 0;
    }
    if (!strcmp(type, "longrope") || !strcmp(type, "su")) {
        cfg->rope_scaling = ROPE_SCALING_LONGROPE;
        /* Phi-3 keeps original_max_position_embeddings at the top level; later configs
         * repeat it inside rope_scaling. */
        if ((err = hf_int(path, root, "original_max_position_embeddings", 0, 0,
                          &cfg->rope_orig_max_pos)) ||
            (err = hf_int(path, rs, "original_max_position_embeddings", 0,
                          cfg->rope_orig_max_pos, &cfg->rope_orig_max_pos)))
            return err;
        if (cfg->rope_orig_max_pos <= 0)
            return river_err_set(RIVER_EFORMAT, "%s: longrope needs "
                                 "original_max_position_embeddings", path);
        float dflt = (float)cfg->max_seq_len / (float)cfg->rope_orig_max_pos;
        if ((err = hf_float(path, rs, "factor", 0, dflt, &cfg->rope_factor)))
            return err;
        int rot = (int)((float)cfg->head_dim * cfg->partial_rotary_factor) & ~1;
        if (rot <= 0)
            return river_err_set(RIVER_ECONFIG, "%s: no rotary dimensions", path);
        if ((err = hf_factor_list(path, rs, "short_factor", rot / 2,
                                  &cfg->rope_short_factor)) ||
            (err = hf_factor_list(path, rs, "long_factor", rot / 2, &cfg->rope_long_factor)))
            return err;
        return 0;
    }
    return river_err_set(RIVER_EUNSUPPORTED, "%s: rope_scaling type '%s' is not supported",
                         path, type);
}

static int hf_parse(const char *path, const json_t *root, model_config_t *cfg)
{
    int err;
    if ((err = hf_arch(path, root, &cfg->arch)))
        return err;
    if ((err = hf_int(path, root, "hidden_size", 1, 0, &cfg->dim)) ||
        (err = hf_int(path, root, "num_hidden_layers", 1, 0, &cfg->n_layers)) ||
        (err = hf_int(path, root, "num_attention_heads", 1, 0, &cfg->n_heads)) ||
        (err = hf_int(path, root, "num_key_value_heads", 0, cfg->n_heads, &cfg->n_kv_heads)) ||
        (err = hf_int(path, root, "intermediate_size", 1, 0, &cfg->hidden_dim)) ||
        (err = hf_int(path, root, "vocab_size", 1, 0, &cfg->vocab_size)) ||
        (err = hf_int(path, root, "max_position_embeddings", 0,
                      cfg->arch == ARCH_PHI3 ? 4096 : 2048, &cfg->max_seq_len)))
        return err;
    if (cfg->n_heads <= 0)
        return river_err_set(RIVER_ECONFIG, "%s: num_attention_heads is %d", path,
                             cfg->n_heads);
    if ((err = hf_int(path, root, "head_dim", 0, cfg->dim / cfg->n_heads, &cfg->head_dim)))
        return err;
    if (!json_object_get(root, "head_dim") && cfg->dim % cfg->n_heads != 0)
        return river_err_set(RIVER_ECONFIG,
                             "%s: hidden_size %d is not a multiple of num_attention_heads %d "
                             "and no head_dim is given",
                             path, cfg->dim, cfg->n_heads);
    /* Defaults as in the transformers config classes. */
    float eps_default = cfg->arch == ARCH_PHI3 ? 1e-5f : 1e-6f;
    if ((err = hf_float(path, root, "rms_norm_eps", 0, eps_default, &cfg->norm_eps)) ||
        (err = hf_float(path, root, "rope_theta", 0, 10000.0f, &cfg->rope_theta)) ||
        (err = hf_float(path, json_object_get(root, "rope_parameters"), "rope_theta", 0,
                        cfg->rope_theta, &cfg->rope_theta)) ||
        (err = hf_float(path, root, "partial_rotary_factor", 0, 1.0f,
                        &cfg->partial_rotary_factor)) ||
        (err = hf_bool(path, root, "tie_word_embeddings", 0, &cfg->tied_embeddings)))
        return err;
    cfg->rope_layout = ROPE_HALF;

    /* Features this engine does not implement must fail loudly, not compute garbage. */
    const char *act = json_string_value(json_object_get(root, "hidden_act"));
    if (act && strcmp(act, "silu") != 0)
        return river_err_set(RIVER_EUNSUPPORTED, "%s: hidden_act '%s' (only silu)", path, act);
    int attn_bias = 0, mlp_bias = 0;
    if ((err = hf_bool(path, root, "attention_bias", 0, &attn_bias)) ||
        (err = hf_bool(path, root, "mlp_bias", 0, &mlp_bias)))
        return err;
    if ((attn_bias && (cfg->arch == ARCH_LLAMA || cfg->arch == ARCH_MISTRAL ||
                       cfg->arch == ARCH_QWEN3)) ||
        mlp_bias)
        return river_err_set(RIVER_EUNSUPPORTED,
                             "%s: attention_bias/mlp_bias (o_proj and MLP biases) are not "
                             "supported",
                             path);

    if (cfg->partial_rotary_factor <= 0 || cfg->partial_rotary_factor > 1)
        return river_err_set(RIVER_ECONFIG, "%s: partial_rotary_factor %g is not in (0, 1]",
                             path, (double)cfg->partial_rotary_factor);
    if ((err = hf_rope_scaling(path, root, cfg)))
        return err;

    /* Sliding-window attention (Mistral, Phi-3; Qwen only with use_sliding_window) is not
     * implemented, but up to the window it equals full causal attention, so the usable
     * context is capped there. The cap comes after the rope scaling, which derives its
     * defaults from the configured context. */
    int window = 0, use_window = 1;
    if ((err = hf_int(path, root, "sliding_window", 0, 0, &window)) ||
        (err = hf_bool(path, root, "use_sliding_window", 1, &use_window)))
        return err;
    if (use_window && window > 0 && window < cfg->max_seq_len)
        cfg->max_seq_len = window;

    cfg->bos_id = -1;
    cfg->n_eos = 0;
    if ((err = hf_special_ids(path, root, cfg)))
        return err;
    if (cfg->bos_id < 0 || cfg->n_eos == 0)
        if ((err = hf_generation_config(path, cfg)))
            return err;
    return model_config_validate(cfg, path);
}

int hfconfig_load(model_config_t *cfg, const char *config_path)
{
    memset(cfg, 0, sizeof *cfg);
    struct stat st;
    if (stat(config_path, &st) != 0)
        return river_err_set(errno == ENOENT ? RIVER_ENOTFOUND : RIVER_ESYS, "%s: %s",
                             config_path, strerror(errno));
    json_error_t jerr;
    json_t *root = json_load_file(config_path, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return river_err_set(RIVER_EFORMAT, "%s: invalid JSON: %s (line %d, column %d)",
                             config_path, jerr.text, jerr.line, jerr.column);
    int err;
    if (!json_is_object(root))
        err = river_err_set(RIVER_EFORMAT, "%s: not a JSON object", config_path);
    else
        err = hf_parse(config_path, root, cfg);
    json_decref(root);
    if (err)
        hfconfig_free(cfg);
    return err;
}

void hfconfig_free(model_config_t *cfg)
{
    free(cfg->rope_short_factor);
    free(cfg->rope_long_factor);
    cfg->rope_short_factor = NULL;
    cfg->rope_long_factor = NULL;
}
