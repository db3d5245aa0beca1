/* `river info`: what a checkpoint holds, as text or as one JSON object. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "common/err.h"
#include "model/model.h"

static void info_usage(FILE *f)
{
    fprintf(f, "usage: river info --model PATH [--output text|json]\n\n"
               "Prints a model's architecture, dimensions, weight dtype, parameter count,\n"
               "the bytes of weights one decode step reads, and its rotary embedding.\n"
               "PATH is a Hugging Face directory, its config.json, a GGUF file or a\n"
               "llama2.c .bin.\n");
}

static const char *info_scaling_name(rope_scaling_t s)
{
    switch (s) {
    case ROPE_SCALING_NONE:
        return "none";
    case ROPE_SCALING_LLAMA3:
        return "llama3";
    case ROPE_SCALING_LONGROPE:
        return "longrope";
    case ROPE_SCALING_LINEAR:
        return "linear";
    }
    return "unknown";
}

static int info_rot_dim(const model_config_t *c)
{
    return (int)((float)c->head_dim * c->partial_rotary_factor) & ~1;
}

/* 1234567 -> "1,234,567" */
static const char *info_grouped(char *buf, size_t cap, long long v)
{
    char digits[32];
    int n = snprintf(digits, sizeof digits, "%lld", v < 0 ? -v : v);
    size_t k = 0;
    if (v < 0 && k + 1 < cap)
        buf[k++] = '-';
    for (int i = 0; i < n && k + 2 < cap; i++) {
        if (i > 0 && (n - i) % 3 == 0)
            buf[k++] = ',';
        buf[k++] = digits[i];
    }
    buf[k] = '\0';
    return buf;
}

static int info_text(const model_t *m)
{
    const model_config_t *c = &m->cfg;
    char a[40], b[40];
    long long params = model_param_count(m), bpt = model_bytes_per_token(m);
    printf("model:            %s\n", m->path);
    printf("format:           %s\n",
           m->is_llama2c ? "llama2.c v0" : m->is_gguf ? "gguf" : "safetensors");
    printf("architecture:     %s\n", arch_name(c->arch));
    printf("layers:           %d\n", c->n_layers);
    printf("dim:              %d\n", c->dim);
    printf("heads:            %d\n", c->n_heads);
    printf("kv heads:         %d\n", c->n_kv_heads);
    printf("head dim:         %d\n", c->head_dim);
    printf("hidden:           %d\n", c->hidden_dim);
    printf("vocab:            %d\n", c->vocab_size);
    printf("max seq:          %d\n", c->max_seq_len);
    printf("dtype:            %s\n", dtype_name(c->dtype));
    printf("tied embeddings:  %s\n", c->tied_embeddings ? "yes" : "no");
    printf("norm eps:         %g\n", (double)c->norm_eps);
    printf("rope:             %s pairs, theta %g, %d of %d dims rotated, scaling %s\n",
           c->rope_layout == ROPE_HALF ? "half-split" : "interleaved", (double)c->rope_theta,
           info_rot_dim(c), c->head_dim, info_scaling_name(c->rope_scaling));
    if (c->rope_scaling == ROPE_SCALING_LLAMA3)
        printf("                  factor %g, low %g, high %g, original context %d\n",
               (double)c->rope_factor, (double)c->rope_low_freq_factor,
               (double)c->rope_high_freq_factor, c->rope_orig_max_pos);
    else if (c->rope_scaling == ROPE_SCALING_LINEAR)
        printf("                  factor %g\n", (double)c->rope_factor);
    else if (c->rope_scaling == ROPE_SCALING_LONGROPE)
        printf("                  factor %g, original context %d, %d short/long factors\n",
               (double)c->rope_factor, c->rope_orig_max_pos, info_rot_dim(c) / 2);
    printf("bos:              %d\n", c->bos_id);
    printf("eos:             ");
    for (int i = 0; i < c->n_eos; i++)
        printf(" %d", c->eos_ids[i]);
    printf("%s\n", c->n_eos ? "" : " none");
    printf("parameters:       %s (%.2f M)\n", info_grouped(a, sizeof a, params),
           (double)params / 1e6);
    printf("bytes per token:  %s (%.2f MB)\n", info_grouped(b, sizeof b, bpt),
           (double)bpt / 1e6);
    return 0;
}

/* A float field as JSON with the float's own precision (1e-05, not 9.99999974e-06). */
static json_t *info_real(float f)
{
    char buf[32];
    snprintf(buf, sizeof buf, "%.7g", (double)f);
    double d;
    sscanf(buf, "%lf", &d);
    return json_real(d);
}

static int info_json(const model_t *m)
{
    const model_config_t *c = &m->cfg;
    json_t *eos = json_array();
    for (int i = 0; i < c->n_eos; i++)
        json_array_append_new(eos, json_integer(c->eos_ids[i]));
    json_t *rope = json_pack("{s:s, s:o, s:i, s:o, s:s}", "layout",
                             c->rope_layout == ROPE_HALF ? "half" : "interleaved", "theta",
                             info_real(c->rope_theta), "rot_dim", info_rot_dim(c),
                             "partial_rotary_factor", info_real(c->partial_rotary_factor),
                             "scaling", info_scaling_name(c->rope_scaling));
    if (rope && c->rope_scaling != ROPE_SCALING_NONE)
        json_object_set_new(rope, "factor", info_real(c->rope_factor));
    if (rope && c->rope_scaling == ROPE_SCALING_LLAMA3) {
        json_object_set_new(rope, "low_freq_factor", info_real(c->rope_low_freq_factor));
        json_object_set_new(rope, "high_freq_factor", info_real(c->rope_high_freq_factor));
    }
    if (rope && (c->rope_scaling == ROPE_SCALING_LLAMA3 ||
                 c->rope_scaling == ROPE_SCALING_LONGROPE))
        json_object_set_new(rope, "original_max_position_embeddings",
                            json_integer(c->rope_orig_max_pos));
    json_t *o = json_pack(
        "{s:s, s:s, s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:s, s:b, s:o, s:o, s:i, "
        "s:o, s:I, s:I}",
        "path", m->path, "format",
        m->is_llama2c ? "llama2c" : m->is_gguf ? "gguf" : "safetensors", "architecture",
        arch_name(c->arch), "layers", c->n_layers, "dim", c->dim, "heads", c->n_heads,
        "kv_heads", c->n_kv_heads, "head_dim", c->head_dim, "hidden_dim", c->hidden_dim,
        "vocab_size", c->vocab_size, "max_seq_len", c->max_seq_len, "dtype",
        dtype_name(c->dtype), "tied_embeddings", c->tied_embeddings, "norm_eps",
        info_real(c->norm_eps), "rope", rope, "bos_id", c->bos_id, "eos_ids", eos, "params",
        (json_int_t)model_param_count(m), "bytes_per_token",
        (json_int_t)model_bytes_per_token(m));
    char *s = o ? json_dumps(o, JSON_INDENT(2) | JSON_REAL_PRECISION(7)) : NULL;
    json_decref(o);
    if (!s) {
        fprintf(stderr, "river info: out of memory\n");
        return 1;
    }
    printf("%s\n", s);
    free(s);
    return 0;
}

int cmd_info(int argc, char **argv)
{
    const char *path = NULL, *output = "text";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            info_usage(stdout);
            return 0;
        } else if (!strcmp(a, "--model") && i + 1 < argc) {
            path = argv[++i];
        } else if (!strncmp(a, "--model=", 8)) {
            path = a + 8;
        } else if (!strcmp(a, "--output") && i + 1 < argc) {
            output = argv[++i];
        } else if (!strncmp(a, "--output=", 9)) {
            output = a + 9;
        } else {
            fprintf(stderr, "river info: unknown or incomplete option '%s'\n", a);
            info_usage(stderr);
            return 2;
        }
    }
    if (!path) {
        fprintf(stderr, "river info: --model is required\n");
        info_usage(stderr);
        return 2;
    }
    if (strcmp(output, "text") != 0 && strcmp(output, "json") != 0) {
        fprintf(stderr, "river info: --output must be text or json\n");
        return 2;
    }
    model_t *m = NULL;
    int err = model_load(&m, path);
    if (err)
        return cli_fail("info", err);
    int rc = !strcmp(output, "json") ? info_json(m) : info_text(m);
    model_destroy(&m);
    return rc;
}
