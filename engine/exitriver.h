/* The Exit River file: the 2-, 3-, 4- or 8-bit copy of a model's decoder layers from the river
 * start layer L_s to the last one, built once by `river quant` and mapped
 * beside the full-precision backbone at run time. The builder is offline/exitriver_build.h.
 *
 * Format: one safetensors file. For each layer l >= L_s and each matrix M of wq, wk, wv,
 * wo, w_gate, w_up, w_down (the layer_weights_t field names) it holds
 *   layers.<l>.<M>.codes   U8   (rows, dtype_row_bytes(cols)) packed as DTYPE_Q<bits>
 *                               (kernels/ops.h, docs/FORMATS.md): (rows, cols/4) for 2
 *                               bits, (rows, cols/4 + cols/8) for 3 bits (the 2-bit plane,
 *                               then the 1-bit plane), (rows, (cols+1)/2) for 4 bits, low
 *                               nibble = even column, (rows, cols) for 8 bits
 *   layers.<l>.<M>.scales  F16  (rows, cols/group)
 *   layers.<l>.<M>.zeros   F16  (rows, cols/group), in code units
 * so that value = (code - zero) * scale (see engine/quant_params.h). Its "__metadata__"
 * holds format "river", format_version "1", fingerprint (of the source model,
 * model_fingerprint in model/fingerprint.h), source (the model's path, for people),
 * start_layer, n_layers (the model's), bits (2, 3, 4 or 8), group (a multiple of 16 for 2
 * and 3 bits), method ("hqq" or "rtn"), for HQQ its parameters, and head_bits when the
 * file carries a quantized LM head (lm_head.codes/scales/zeros, packed the same way). Norms and biases are not stored: they
 * stay full precision and are shared with the backbone.
 *
 * Default start layer: 1. The decode loop moves a token to the river after layer l
 * when l+1 >= L_s, so L_s = 1 lets a token exit after any layer, the first included; layer
 * 0 is never needed (a river from 0 would be a fully quantized model). */
#ifndef RIVER_ENGINE_EXITRIVER_H
#define RIVER_ENGINE_EXITRIVER_H

#include <stddef.h>

#include "model/model.h"
#include "engine/quant_params.h"

#define EXITRIVER_DEFAULT_START_LAYER 1

/* The format's name and version in the file's metadata. */
#define EXITRIVER_FORMAT "river"
#define EXITRIVER_FORMAT_VERSION "1"

/* The matrices of a layer the river quantizes: wq, wk, wv, wo, w_gate, w_up, w_down, in this
 * order (the order the builder writes them in), by index 0..EXITRIVER_N_MATRICES-1. */
#define EXITRIVER_N_MATRICES 7
/* The matrix's layer_weights_t field name, e.g. "w_gate". */
const char *exitriver_matrix_name(int i);
/* The matrix of L with index i. */
const weight_t *exitriver_matrix(const layer_weights_t *L, int i);
/* The name of one part ("codes", "scales" or "zeros") of matrix `mat` of `layer` in the
 * file: layers.<layer>.<name>.<part>. */
void exitriver_tensor_name(char *buf, size_t cap, int layer, int mat, const char *part);

/* The default river path for a model and parameters: river-q4-g64-hqq.safetensors in the
 * model's directory, <stem>.river-q4-g64-hqq.safetensors beside a GGUF file <stem>.gguf, or
 * <stem>-river-q4-g64-hqq.safetensors beside a llama2.c .bin (so two
 * .bin models in one directory do not share a name). */
int exitriver_default_path(const model_t *m, const quant_params_t *p, char *buf, size_t cap);

typedef struct exitriver exitriver_t;

/* Maps the river file at path and checks it against m: format, fingerprint (a river built
 * from another model fails with RIVER_EINVAL naming both files), parameters, and every
 * tensor's presence, dtype and shape. The river points into m (norms, biases) and must be
 * destroyed before it. When m is placed (model_place), the river's matrices are placed on
 * the same backend. Errors: those of safetensors_open, RIVER_EFORMAT (not a river file,
 * bad metadata), RIVER_EINVAL (another model's river), RIVER_ENOTFOUND (missing tensor),
 * RIVER_EDTYPE, RIVER_ESHAPE, RIVER_ENOMEM. */
int exitriver_load(exitriver_t **out, const model_t *m, const char *path);
void exitriver_destroy(exitriver_t **r);

int exitriver_start_layer(const exitriver_t *r);
int exitriver_bits(const exitriver_t *r);
int exitriver_group(const exitriver_t *r);
quant_method_t exitriver_method(const exitriver_t *r);
const char *exitriver_path(const exitriver_t *r);
const char *exitriver_fingerprint_of(const exitriver_t *r);

/* The river's copy of layer l: Q2/Q3/Q4/Q8 weights for the seven matrices (pointing into the
 * mapped file) and the backbone's own norm and bias weights. NULL for l < start layer or
 * l >= n_layers. */
const layer_weights_t *exitriver_layer(const exitriver_t *r, int layer);

/* The river's quantized LM head (vocab, dim), or NULL when it was built without one. */
const weight_t *exitriver_head(const exitriver_t *r);

#endif
