/* Tokenizers: Hugging Face tokenizer.json (BPE, SentencePiece-style and byte-level) and
 * llama2.c tok*.bin files, behind one interface.
 *
 * Encoding agrees with the Hugging Face `tokenizers` library (added tokens matched in the
 * text, normalizer, pre-tokenizer, BPE model, post-processor); decoding agrees with its
 * decode(). Failures return a river_err code with a detail naming the file and the
 * problem, and leave no allocation behind. */
#ifndef RIVER_TEXT_TOKENIZER_H
#define RIVER_TEXT_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "text/span.h"

typedef struct tokenizer tokenizer_t;

/* Loads a tokenizer.json, a llama2.c tok*.bin (recognised by content, not by name), or the
 * tokenizer in a GGUF file's tokenizer.ggml.* metadata (text/tokenizer_gguf.c).
 * `vocab_size_hint` is the model's vocabulary size for .bin files (0: derive it). */
int tokenizer_load(tokenizer_t **out, const char *path, int vocab_size_hint);
void tokenizer_destroy(tokenizer_t **t);

/* Encodes len bytes of UTF-8 text. add_special: apply the post-processor (BOS/EOS as the
 * tokenizer declares them). *ids is malloc'd and owned by the caller. */
int tokenizer_encode(const tokenizer_t *t, const char *text, size_t len, int add_special,
                     int32_t **ids, size_t *n_ids);

/* As tokenizer_encode, with special-token parsing limited to spans (n_spans in text
 * order, disjoint; none: nowhere): a special added token is matched only where its text
 * lies wholly inside one span, and elsewhere its text is encoded as plain text, as Hugging
 * Face's encode(..., split_special_tokens=True) encodes it. Added tokens that are not
 * special match everywhere, as they do there. The text is not cut at the spans' edges: a
 * text holding no special-token text outside the spans gets tokenizer_encode's ids.
 * Spans out of order or past len are RIVER_EINVAL. */
int tokenizer_encode_spans(const tokenizer_t *t, const char *text, size_t len, int add_special,
                           const text_span_t *spans, size_t n_spans, int32_t **ids,
                           size_t *n_ids);

/* Decodes ids to UTF-8 text, as the library's decode(ids, skip_special). *text is
 * malloc'd, NUL-terminated, owned by the caller. */
int tokenizer_decode(const tokenizer_t *t, const int32_t *ids, size_t n, int skip_special,
                     char **text, size_t *len);

/* The bytes id stands for in the middle of a generated text (cap bytes of buf; *len gets
 * their number): a byte-level or byte-fallback token's own bytes, which may be part of a
 * UTF-8 character, a SentencePiece piece with its leading space, an added token's text.
 * RIVER_ERANGE for an id outside the vocabulary or more than cap bytes. */
int tokenizer_token_bytes(const tokenizer_t *t, int32_t id, char *buf, size_t cap, size_t *len);

int tokenizer_vocab_size(const tokenizer_t *t);
/* Special ids; -1 when the tokenizer has none. */
int tokenizer_bos_id(const tokenizer_t *t);
int tokenizer_eos_id(const tokenizer_t *t);
/* Whether id is an added special token (skipped by skip_special decoding). */
int tokenizer_is_special(const tokenizer_t *t, int32_t id);

/* Streaming decoder for generated ids: text comes out as soon as it is final, never half a
 * UTF-8 character, and the concatenation of all pieces equals tokenizer_decode of all ids
 * pushed (skip_special as given at init). */
typedef struct tok_stream tok_stream_t;
int tok_stream_new(tok_stream_t **out, const tokenizer_t *t, int skip_special);
void tok_stream_destroy(tok_stream_t **s);
/* Pushes one id; *piece (owned by the stream, valid until the next call) receives the
 * newly final text, possibly empty. */
int tok_stream_push(tok_stream_t *s, int32_t id, const char **piece, size_t *len);
/* Flushes what is left (e.g. an incomplete byte sequence at the end, as U+FFFD). */
int tok_stream_finish(tok_stream_t *s, const char **piece, size_t *len);

#endif
