/* The Exit River file: the 4-bit (or 8-bit) copy of a model's decoder layers from the river
 * start layer L_s to the last one (DESIGN.md §3), built once by `river quant` and mapped
 * beside the full-precision backbone at run time.
 *
 * Format: one safetensors file. For each layer l >= L_s and each matrix M of wq, wk, wv,
 * wo, w_gate, w_up, w_down (the layer_weights_t field names) it holds
 *   layers.<l>.<M>.codes   U8   (rows, (cols+1)/2) for 4 bits, low nibble = even column;
 *                               (rows, cols) for 8 bits
 *   layers.<l>.<M>.scales  F16  (rows, cols/group)
 *   layers.<l>.<M>.zeros   F16  (rows, cols/group), in code units
 * so that value = (code - zero) * scale (see engine/quant.h). Its "__metadata__" holds
 * format "river", format_version "1", fingerprint (of the source model, river_fingerprint),
 * source (the model's path, for people), start_layer, n_layers (the model's), bits, group,
 * method ("hqq" or "rtn") and, for HQQ, its parameters. Norms and biases are not stored: they
 * stay full precision and are shared with the backbone.
 *
 * Default start layer: 1. DESIGN.md's decode loop moves a token to the river after layer l
 * when l+1 >= L_s, so L_s = 1 lets a token exit after any layer, the first included; layer
 * 0 is never needed (a river from 0 would be a fully quantized model). */
#ifndef RIVER_ENGINE_RIVER_H
#define RIVER_ENGINE_RIVER_H

#include <stddef.h>

#include "model/model.h"
#include "engine/quant.h"

#define RIVER_DEFAULT_START_LAYER 1
/* 32 hex digits and a terminating NUL. */
#define RIVER_FINGERPRINT_LEN 33

/* A 128-bit fingerprint of a model, as 32 lowercase hex digits: a hash of its shape
 * configuration and of every tensor's name, dtype, shape and a sample of its bytes (about
 * 2 KB per tensor, so it costs milliseconds even for gigabytes of weights). Two checkpoints
 * with the same weights in the same dtype and layout share it; changing a tensor changes it
 * unless the change avoids every sampled byte. */
int river_fingerprint(const model_t *m, char out[RIVER_FINGERPRINT_LEN]);

/* The default river path for a model and parameters: river-q4-g64-hqq.safetensors in the
 * model's directory, or <stem>-river-q4-g64-hqq.safetensors beside a llama2.c .bin (so two
 * .bin models in one directory do not share a name). */
int river_default_path(const model_t *m, const quant_params_t *p, char *buf, size_t cap);

/* Called after each layer is quantized and written: its error sums and the seconds it took. */
typedef void (*river_progress_fn)(void *arg, int layer, const quant_stats_t *stats,
                                  double seconds);

typedef struct river_build_opts {
    quant_params_t quant;
    int start_layer;             /* first layer of the river, 0..n_layers-1 */
    int head_bits;               /* 0: exited tokens use the backbone's LM head; 4 or 8: the
                                    river carries its own quantized copy of the head, so a
                                    token that exited reads no full-precision weight at all */
    int n_threads;               /* 0: one per online core */
    river_progress_fn progress;  /* may be NULL */
    void *progress_arg;
} river_build_opts_t;

/* Default quantization (quant_params_default), start RIVER_DEFAULT_START_LAYER, all cores. */
river_build_opts_t river_build_opts_default(void);

/* The largest group size up to `most` that divides the columns of every matrix the river
 * quantizes (layers o->start_layer.., the LM head too when o->head_bits), even for 4 bits
 * (two codes share a byte); 0 when none does. */
int river_group_fit(const model_t *m, const river_build_opts_t *o, int most);

/* Quantizes layers start_layer.. of m and writes the river to path (through "<path>.part",
 * renamed when complete). total, when not NULL, receives the error sums of all layers.
 * Every matrix is checked (dtype, group divides its columns) before anything is written. */
int river_build(const model_t *m, const char *path, const river_build_opts_t *o,
                quant_stats_t *total);

typedef struct river river_t;

/* Maps the river file at path and checks it against m: format, fingerprint (a river built
 * from another model fails with RIVER_EINVAL naming both files), parameters, and every
 * tensor's presence, dtype and shape. The river points into m (norms, biases) and must be
 * destroyed before it. When m is placed (model_place), the river's matrices are placed on
 * the same backend. Errors: those of safetensors_open, RIVER_EFORMAT (not a river file,
 * bad metadata), RIVER_EINVAL (another model's river), RIVER_ENOTFOUND (missing tensor),
 * RIVER_EDTYPE, RIVER_ESHAPE, RIVER_ENOMEM. */
int river_load(river_t **out, const model_t *m, const char *path);
void river_destroy(river_t **r);

int river_start_layer(const river_t *r);
int river_bits(const river_t *r);
int river_group(const river_t *r);
quant_method_t river_method(const river_t *r);
const char *river_path(const river_t *r);
const char *river_fingerprint_of(const river_t *r);

/* The river's copy of layer l: Q4/Q8 weights for the seven matrices (pointing into the
 * mapped file) and the backbone's own norm and bias weights. NULL for l < start layer or
 * l >= n_layers. */
const layer_weights_t *river_layer(const river_t *r, int layer);

/* The river's quantized LM head (vocab, dim), or NULL when it was built without one. */
const weight_t *river_head(const river_t *r);

#endif
