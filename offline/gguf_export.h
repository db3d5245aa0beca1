/* `river export --gguf`: any model River loads written as a GGUF file llama.cpp can run.
 *
 * Tensors get llama.cpp's names (token_embd, blk.N.attn_q, ..., output_norm, output), the
 * q/k rows of a Hugging Face llama/mistral checkpoint are permuted to the interleaved rope
 * layout llama.cpp's llama architecture uses (the Meta layout; a llama2.c model is already
 * in it), and the metadata is what llama.cpp's converter writes: general.*, the
 * architecture's hyper-parameters, the rope base, rope_freqs.weight for Llama 3.1 scaling,
 * tokenizer.ggml.* (model "llama" with scores and token types for SentencePiece-style
 * vocabularies, "gpt2" with merges and tokenizer.ggml.pre for byte-level BPE), bos/eos/unk
 * ids, add_bos/add_eos and tokenizer.chat_template when the model directory has one.
 *
 * Types (`type`): f32, f16, bf16 (matrices; norms stay f32), q8_0, q4_0, q4_1, q4_k_m,
 * q5_k_m. The K mixes follow llama.cpp's: Q4_K (Q5_K) for most matrices, Q6_K for the
 * output matrix and for attn_v and ffn_down in the first and last eighth of the layers and
 * every third between (llama.cpp's use_more_bits); a row that is no multiple of 256 falls
 * back as llama.cpp does (Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0). q4_0 and q4_1 write the
 * output matrix (the embedding when tied) as Q6_K too. Errors name the problem;
 * RIVER_EUNSUPPORTED for an architecture or tokenizer it cannot express. No file is left on
 * failure. */
#ifndef RIVER_OFFLINE_GGUF_EXPORT_H
#define RIVER_OFFLINE_GGUF_EXPORT_H

#include "model/model.h"

typedef struct gguf_export_opts {
    const char *type;      /* f32 | f16 | bf16 | q8_0 | q4_0 | q4_1 | q4_k_m | q5_k_m */
    const char *tokenizer; /* tokenizer.json or tok*.bin; NULL: found beside the model */
    const char *name;      /* general.name; NULL: the model directory's name */
} gguf_export_opts_t;

int gguf_export_model(const model_t *m, const char *out_path, const gguf_export_opts_t *o);

/* The tokenizer.* metadata alone, from a tokenizer.json or tok*.bin (and the
 * tokenizer_config.json beside it), into a writer; bos/eos ids default to the file's when
 * bos_id/eos_id are -1. Exposed for tests of the GGUF tokenizer. */
struct gguf_writer;
int gguf_export_tokenizer(struct gguf_writer *w, const char *tok_path, int vocab_size,
                          int bos_id, int eos_id);

#endif
