/* A loaded model: its configuration and its weights, mapped in place from the checkpoint.
 *
 * Loading accepts a Hugging Face checkpoint directory (config.json + model.safetensors, or
 * shards named by model.safetensors.index.json), a llama2.c .bin file, or a GGUF file
 * (model/gguf_model.c: a name ending in .gguf or a file starting with the GGUF magic). Every malformed
 * input fails with a river_err code and a detail naming the file and the problem; on
 * failure nothing stays allocated or mapped. */
#ifndef RIVER_MODEL_MODEL_H
#define RIVER_MODEL_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/ops.h"

typedef enum {
    ARCH_LLAMA = 0, /* Llama 2/3/3.1/3.2, and llama2.c .bin */
    ARCH_MISTRAL,
    ARCH_QWEN2,     /* q/k/v bias */
    ARCH_QWEN3,     /* per-head q/k RMSNorm */
    ARCH_PHI3,      /* fused qkv and gate_up, partial rotary, longrope */
    ARCH_COUNT
} arch_t;

const char *arch_name(arch_t a);

typedef enum {
    ROPE_SCALING_NONE = 0,
    ROPE_SCALING_LLAMA3,
    ROPE_SCALING_LONGROPE,
    ROPE_SCALING_LINEAR,
} rope_scaling_t;

typedef struct model_config {
    arch_t arch;
    int dim;            /* hidden size */
    int n_layers;
    int n_heads;
    int n_kv_heads;
    int head_dim;
    int hidden_dim;     /* FFN intermediate size */
    int vocab_size;
    int max_seq_len;    /* max_position_embeddings */
    float norm_eps;
    float rope_theta;
    rope_layout_t rope_layout;
    float partial_rotary_factor;  /* 1 unless the config says otherwise */
    rope_scaling_t rope_scaling;
    float rope_factor;            /* llama3 / linear / longrope scaling factor */
    float rope_low_freq_factor;   /* llama3 */
    float rope_high_freq_factor;  /* llama3 */
    int rope_orig_max_pos;        /* llama3 / longrope original_max_position_embeddings */
    float *rope_short_factor;     /* longrope: (rot_dim/2), owned, else NULL */
    float *rope_long_factor;      /* longrope: (rot_dim/2), owned, else NULL */
    int tied_embeddings;
    int bos_id;          /* -1 when none */
    int eos_ids[4];      /* ids that end generation; n_eos of them */
    int n_eos;
    dtype_t dtype;       /* dtype of the large matrices */
} model_config_t;

/* Weights of one decoder layer. A fused checkpoint tensor (Phi-3 qkv_proj, gate_up_proj)
 * appears here as views: wq, wk, wv point at consecutive row ranges of one tensor. */
typedef struct layer_weights {
    weight_t attn_norm;  /* (1, dim) */
    weight_t wq;         /* (n_heads*head_dim, dim) */
    weight_t wk;         /* (n_kv_heads*head_dim, dim) */
    weight_t wv;         /* (n_kv_heads*head_dim, dim) */
    weight_t wo;         /* (dim, n_heads*head_dim) */
    weight_t bq, bk, bv; /* (1, rows of wq/wk/wv); data NULL when absent */
    weight_t q_norm;     /* (1, head_dim); data NULL when absent (Qwen3) */
    weight_t k_norm;     /* (1, head_dim); data NULL when absent */
    weight_t ffn_norm;   /* (1, dim) */
    weight_t w_gate;     /* (hidden_dim, dim) */
    weight_t w_up;       /* (hidden_dim, dim) */
    weight_t w_down;     /* (dim, hidden_dim) */
} layer_weights_t;

typedef struct model_mapping model_mapping_t; /* opaque: mmaps and owned copies */

/* A model fingerprint's 32 hex digits and a terminating NUL (model/fingerprint.h). */
#define MODEL_FINGERPRINT_LEN 33

typedef struct model {
    model_config_t cfg;
    weight_t embed;       /* (vocab, dim) */
    layer_weights_t *layers; /* (n_layers) */
    weight_t final_norm;  /* (1, dim) */
    weight_t lm_head;     /* (vocab, dim); the embedding table when tied */
    char *path;           /* what was loaded, owned */
    char *dir;            /* directory holding it (for tokenizer.json), owned */
    int is_llama2c;       /* loaded from a llama2.c .bin */
    int is_gguf;          /* loaded from a GGUF file (its tokenizer is in the file) */
    model_mapping_t *map; /* owns every byte the weights point at */
    /* Where the weights live once model_place ran (borrowed; NULL before): the river and
     * offloading place and release their weights through it. */
    backend_t *backend;
    /* The fingerprint of the weights as loaded, taken by model_place before any weight
     * moves to a device (model_fingerprint reads it from here then, never from device
     * memory). */
    char fingerprint[MODEL_FINGERPRINT_LEN]; /* model_fingerprint's 32 hex digits; "" before */
} model_t;

/* Loads `path`: a directory with config.json, a config.json file, a GGUF file, or a llama2.c
 * .bin.
 * A llama2.c file has no eps field: it gets rms_norm_eps (or norm_eps) from a JSON file
 * beside it named like it (stories.bin -> stories.json) or config.json, else run.c's 1e-5;
 * model_set_norm_eps overrides it. Errors: RIVER_ENOTFOUND (file or tensor missing),
 * RIVER_EFORMAT (malformed file), RIVER_ETRUNC, RIVER_ESHAPE, RIVER_EDTYPE, RIVER_EARCH,
 * RIVER_ECONFIG (inconsistent configuration values), RIVER_EUNSUPPORTED. */
int model_load(model_t **out, const char *path);
void model_destroy(model_t **m);

/* Places every weight on backend be (ops->weight_upload: host backends read the mapping in
 * place, device backends copy) after taking the model's fingerprint from the mapped file.
 * A tied LM head shares the embedding's copy. The backend must outlive the model's use and
 * be destroyed before the model. On failure some weights may already point at the device:
 * destroy the model. Placing a placed model again is RIVER_ESTATE. */
int model_place(model_t *m, backend_t *be);
/* Places the matrices of layers [begin, end) only (clamped to the model; every layer's norms
 * and biases, which the river shares), and the embedding, final norm and
 * LM head when ends: each half of a split pair places what it computes with, so on GPUs the
 * deep layers occupy only the backbone's device. The other weights stay where the loader
 * mapped them; an op given one on a device backend fails (the opaque backend says which). */
int model_place_layers(model_t *m, backend_t *be, int begin, int end, int ends);

/* Replaces every Q4/Q8 matrix with an f32 copy (value = (q - zero) * scale), after keeping
 * the fingerprint of the weights as loaded, so what is built from the copy (a river) still
 * names the model as it is served. For the offline tools whose math reads floats. Before
 * model_place only (RIVER_ESTATE after). On failure some matrices may be copies already:
 * destroy the model. */
int model_dequantize(model_t *m);

/* Sets the RMSNorm epsilon (for llama2.c files, whose format does not record it). */
void model_set_norm_eps(model_t *m, float eps);

/* Parameters, counting a tied embedding once. */
int64_t model_param_count(const model_t *m);
/* Bytes of weights one decode step reads: every matrix and vector of every layer, the
 * final norm and the LM head (the embedding lookup reads one row, counted as one row).
 * Quantized weights count their packed codes plus their fp16 scales and zeros. */
int64_t model_bytes_per_token(const model_t *m);
/* Bytes of `rows` rows of w as stored: codes (packing included) plus, for Q2/Q3/Q4/Q8, the
 * fp16 scales and zeros of those rows; 0 for an absent weight (data NULL). */
int64_t model_weight_bytes(const weight_t *w, int64_t rows);
/* Bytes of weights one decoder layer reads per decode step (its matrices, packed, with
 * their scales and zeros, norms and biases): the share of one layer in
 * model_bytes_per_token, for a model's layer or a copy of one (the Exit River's). */
int64_t model_layer_bytes(const layer_weights_t *L);

/* Checks a configuration (positive, plausible sizes; kv heads dividing heads; rotary dims;
 * scaling parameters; special ids inside the vocabulary). Returns 0, or RIVER_ECONFIG with
 * a detail that starts with `what` (normally the file the configuration came from). */
int model_config_validate(const model_config_t *cfg, const char *what);

#endif
