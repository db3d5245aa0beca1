/* Quantized backbones: `river quant --backbone q8|q4` writes a checkpoint directory whose
 * decoder matrices and LM head are Q8 or Q4 (docs/FORMATS.md, "Quantized backbone
 * checkpoints"), which model_load then loads like any other checkpoint.
 *
 * The directory holds config.json (the source's, with a "river_quantization" object added),
 * the tokenizer files copied as they are, and one model.safetensors: every matrix the
 * backbone multiplies by (q/k/v/o, gate/up/down, or Phi-3's fused qkv and gate_up, and the LM
 * head) as U8 codes under the tensor's own name with fp16 companions `<name>.qscales` and
 * `<name>.qzeros` of shape [rows, cols/group]; norms and biases as F32. A tied embedding is
 * the quantized head itself: the embedding lookup dequantizes one row a token, which costs
 * nothing measurable, where a separate full-precision table would add vocab x dim x 2 bytes
 * to the file and to memory. An untied embedding is quantized like the head. */
#ifndef RIVER_OFFLINE_BACKBONE_QUANT_H
#define RIVER_OFFLINE_BACKBONE_QUANT_H

#include "model/model.h"
#include "offline/quant.h"

/* The safetensors metadata "format" of a quantized backbone file. */
#define BACKBONE_QUANT_FORMAT "river-backbone"
#define BACKBONE_QUANT_FORMAT_VERSION "1"

/* Called after each layer (0..n_layers-1) and, with layer = n_layers, after the LM head
 * (and an untied embedding): its error sums and the seconds it took. */
typedef void (*backbone_quant_progress_fn)(void *arg, int layer, const quant_stats_t *stats,
                                           double seconds);

typedef struct backbone_quant_opts {
    quant_params_t quant;  /* the layers' matrices: bits 8 with QUANT_SYM and group 32 is
                              llama.cpp's Q8_0; bits 4 with HQQ or RTN */
    int head_bits;         /* the LM head (and the embedding): 0 keeps them as they are;
                              8: symmetric in blocks of 32 (the layers' group where 32
                              does not divide the head's columns); 4: the layers' 4-bit
                              parameters */
    int n_threads;         /* 0: one per online core */
    backbone_quant_progress_fn progress; /* may be NULL */
    void *progress_arg;
} backbone_quant_opts_t;

/* The format names: "q8" (8-bit symmetric, group 32) and "q4" (4-bit HQQ, group 64 or the
 * largest even group up to 64 dividing every matrix: pass the model to pick it), with the
 * head at 8 bits. Returns -1 for another name. */
int backbone_quant_opts_for(const char *format, const model_t *m, backbone_quant_opts_t *o);

/* The largest group up to `most` (a multiple of 32 when one fits, which the AVX-512
 * integer kernels need, else even for 4 bits) dividing the columns of every matrix the
 * backbone quantizes; 0 when none does. */
int backbone_quant_group_fit(const model_t *m, int bits, int head_bits, int most);

/* Quantizes m (a Hugging Face checkpoint, not placed on a device) into directory dir (made
 * when missing; a directory holding the source itself, or a model.safetensors that is not
 * a quantized backbone, is refused with RIVER_EINVAL). Every matrix is checked before
 * anything is written; model.safetensors is written through "<path>.part" and renamed when
 * complete. total and head (either may be NULL) receive the error sums of the layers and
 * of the head. Errors: RIVER_EUNSUPPORTED (a llama2.c source), RIVER_EINVAL, RIVER_ESHAPE
 * (a group that does not divide a matrix), those of quant_weight and of file I/O. */
int backbone_quant_build(const model_t *m, const char *dir, const backbone_quant_opts_t *o,
                         quant_stats_t *total, quant_stats_t *head);

#endif
