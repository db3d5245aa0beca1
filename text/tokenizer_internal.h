/* Internals shared by the tokenizer modules: the tokenizer object, growable buffers, a string
 * hash map, UTF-8 helpers, and the entry points of the two formats (Hugging Face
 * tokenizer.json in tokenizer_hf.c and the hf_*.c files listed in text/hf_internal.h,
 * llama2.c tok*.bin in tokenizer_l2c.c). Nothing here is part of the public interface in
 * text/tokenizer.h. */
#ifndef RIVER_TEXT_TOKENIZER_INTERNAL_H
#define RIVER_TEXT_TOKENIZER_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "text/tokenizer.h"
#include "text/utf8.h"

/* A growable byte buffer. Zero-initialised is empty and valid. */
typedef struct tok_buf {
    char *p;
    size_t len, cap;
} tok_buf_t;

int tok_buf_reserve(tok_buf_t *b, size_t extra);
int tok_buf_put(tok_buf_t *b, const void *s, size_t n);
int tok_buf_putc(tok_buf_t *b, int c);
void tok_buf_free(tok_buf_t *b);

/* A growable id vector. Zero-initialised is empty and valid. */
typedef struct tok_ids {
    int32_t *p;
    size_t len, cap;
} tok_ids_t;

int tok_ids_push(tok_ids_t *v, int32_t id);
int tok_ids_append(tok_ids_t *v, const int32_t *ids, size_t n);
void tok_ids_free(tok_ids_t *v);

/* One key of a tok_map. The three fields share a struct so that a lookup touches one cache
 * line per candidate instead of three arrays: tokenizer.json loads do ~3 lookups per merge. */
typedef struct tok_map_entry {
    size_t off;   /* byte offset of the key in tok_map.keys */
    uint32_t len; /* key length in bytes */
    int32_t val;
} tok_map_entry_t;

/* A map from byte strings to int32 values with open addressing; keys are copied. */
typedef struct tok_map {
    uint32_t *slots; /* 0: empty, otherwise entry index + 1 */
    size_t mask;
    tok_map_entry_t *ent; /* [cap], in insertion order */
    size_t n, cap;
    tok_buf_t keys;
} tok_map_t;

/* Sizes the table and the entry array for `expected` keys, so that loading that many needs
 * no rehash or regrowth. On failure the map is empty and tok_map_free is still safe. */
int tok_map_init(tok_map_t *m, size_t expected);
/* Inserts key → val. When the key exists, overwrite selects whether the new value replaces
 * the old one. *entry (optional) receives the entry index of the key. */
int tok_map_put(tok_map_t *m, const char *key, size_t len, int32_t val, int overwrite,
                size_t *entry);
/* The value of key, or -1 when absent. */
int32_t tok_map_get(const tok_map_t *m, const char *key, size_t len);
void tok_map_free(tok_map_t *m);

uint64_t tok_hash(const void *p, size_t n);

/* UTF-8 itself is text/utf8.h. Appends s to out with every maximal invalid subpart replaced by U+FFFD. *incomplete
 * (optional) is set when s ends inside a character that more bytes could complete. */
int tok_utf8_lossy(tok_buf_t *out, const char *s, size_t len, int *incomplete);

enum { TOK_KIND_HF = 1, TOK_KIND_L2C = 2 };

typedef struct hf_tok hf_tok_t;
typedef struct l2c_tok l2c_tok_t;

struct tokenizer {
    int kind;
    char *path; /* the file, for error messages */
    int vocab_size;
    int bos_id, eos_id;
    hf_tok_t *hf;
    l2c_tok_t *l2c;
};

/* Decoding of a window of ids for the streaming decoder and for tokenizer_decode.
 *  - cont: text before ids[0] exists and is non-empty, so effects that apply only at the
 *    start of the text (SentencePiece's leading-space strip) are off.
 *  - open_end: more ids may follow, so effects that apply only at the end of the text are
 *    deferred; *hold receives how many trailing bytes of the output may still change.
 *  - prev_id: the id just before ids[0] (-1 when none), for llama2.c's space after BOS. */
typedef struct tok_window {
    int cont;
    int open_end;
    int32_t prev_id;
    size_t hold;
    /* 1: byte-level and byte-fallback bytes come out as they are, not made valid UTF-8
     * (tokenizer_token_bytes: one token's own bytes, perhaps part of a character). */
    int raw_bytes;
} tok_window_t;

int tok_hf_load(tokenizer_t *t, const char *data, size_t len);
void tok_hf_free(hf_tok_t *h);
/* spans NULL: special tokens match everywhere; else only inside them (n_spans may be 0). */
int tok_hf_encode(const tokenizer_t *t, const char *text, size_t len, int add_special,
                  const text_span_t *spans, size_t n_spans, tok_ids_t *out);
int tok_hf_decode(const tokenizer_t *t, const int32_t *ids, size_t n, int skip_special,
                  tok_window_t *w, tok_buf_t *out);
int tok_hf_is_special(const tokenizer_t *t, int32_t id);
/* Whether text decoded so far may still change when ids follow this one (byte-fallback
 * pieces, which the decoder groups with their neighbours). */
int tok_hf_is_pending(const tokenizer_t *t, int32_t id);
int tok_hf_id_valid(const tokenizer_t *t, int32_t id);

/* A GGUF file's tokenizer (t->path names the file); text/tokenizer_gguf.c. */
int tok_gguf_load(tokenizer_t *t, int vocab_size_hint);

int tok_l2c_load(tokenizer_t *t, const char *data, size_t len, int vocab_size_hint);
void tok_l2c_free(l2c_tok_t *l);
int tok_l2c_encode(const tokenizer_t *t, const char *text, size_t len, int add_special,
                   tok_ids_t *out);
int tok_l2c_decode(const tokenizer_t *t, const int32_t *ids, size_t n, int skip_special,
                   tok_window_t *w, tok_buf_t *out);

/* Dispatchers used by the stream (tokenizer.c). */
int tok_decode_window(const tokenizer_t *t, const int32_t *ids, size_t n, int skip_special,
                      tok_window_t *w, tok_buf_t *out);
int tok_id_valid(const tokenizer_t *t, int32_t id);
int tok_is_pending(const tokenizer_t *t, int32_t id, int skip_special);

#endif
