/* Internals of the Hugging Face tokenizer.json tokenizer, shared by its files: the loaded
 * tokenizer (hf_tok), the steps of its pipeline, the scratch space of one call, and the
 * entry points each file offers the others.
 *
 *   tokenizer_hf.c   loading (jansson) and the encode pipeline's glue
 *   hf_pattern.c     String/Regex patterns, splitting, piece lists, character classes
 *   hf_added.c       added tokens: reading them and matching them in text
 *   hf_normalize.c   normalizers
 *   hf_pretokenize.c pre-tokenizers
 *   hf_bpe.c         the BPE model: vocabulary, merges and merging
 *   hf_post.c        post-processors (the template of special ids around a sequence)
 *   hf_decode.c      decoders and tok_hf_decode
 *
 * Each kind of step (normalizer, pre-tokenizer, decoder, post-processor) is a table of
 * {type name, parse, apply} in its file; a parsed step points at its table entry. Nothing
 * here is part of the public interface in text/tokenizer.h. */
#ifndef RIVER_TEXT_HF_INTERNAL_H
#define RIVER_TEXT_HF_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8

#include <jansson.h>
#include <pcre2.h>
#include <stddef.h>
#include <stdint.h>

#include "text/tokenizer_internal.h"

/* ---- the loaded tokenizer --------------------------------------------------------------- */

/* A String pattern (literal, matched with memmem) or a Regex pattern (PCRE2, UTF + UCP). */
typedef struct hf_pat {
    char *lit;
    size_t lit_len;
    pcre2_code *re;
} hf_pat_t;

/* Split delimiter behaviours, in the order of their names in the file format. */
enum { BEH_REMOVED, BEH_ISOLATED, BEH_MERGED_PREV, BEH_MERGED_NEXT, BEH_CONTIGUOUS };
enum { PREPEND_NEVER, PREPEND_FIRST, PREPEND_ALWAYS };

typedef struct hf_norm_kind hf_norm_kind_t;
typedef struct hf_pre_kind hf_pre_kind_t;
typedef struct hf_dec_kind hf_dec_kind_t;

typedef struct hf_norm {
    const hf_norm_kind_t *kind;
    hf_pat_t pat; /* Replace */
    char *text;   /* Prepend text, Replace content */
    size_t text_len;
    int left, right; /* Strip */
} hf_norm_t;

typedef struct hf_pre {
    const hf_pre_kind_t *kind;
    hf_pat_t pat; /* Split pattern; ByteLevel's regex (re NULL: none); Metaspace's character */
    int behavior, invert;
    int add_prefix_space; /* ByteLevel */
    char repl[4];         /* Metaspace replacement character, UTF-8 */
    size_t repl_len;
    int prepend, split;
} hf_pre_t;

typedef struct hf_dec {
    const hf_dec_kind_t *kind;
    hf_pat_t pat; /* Replace */
    char *text;   /* Replace content */
    size_t text_len;
    char ch[4]; /* Strip content, Metaspace replacement */
    size_t ch_len;
    int start, stop; /* Strip */
    int prepend;     /* Metaspace */
} hf_dec_t;

typedef struct hf_added {
    char *content;
    size_t len;
    int32_t id;
    int single_word, lstrip, rstrip, normalized, special;
} hf_added_t;

/* Leftmost-longest matching over a set of strings: candidates grouped by first byte, longest
 * first, so the first candidate that matches at a position is the longest there. */
typedef struct hf_matcher {
    size_t n;
    char **pat;
    size_t *len;
    size_t *tok; /* index into hf_tok.added */
    uint32_t first[257];
    size_t n_special; /* of the n, those that are special tokens */
} hf_matcher_t;

/* Where special tokens may match in the text being split: spans in its own offsets, in
 * order (n 0: nowhere). A NULL hf_allow_t: everywhere. */
typedef struct hf_allow {
    const text_span_t *v;
    size_t n;
} hf_allow_t;

typedef struct hf_bpe {
    tok_map_t vocab;
    uint64_t *mkeys; /* (left << 32 | right) → (rank << 32 | merged id) */
    uint64_t *mvals;
    size_t mmask, mcount;
    int has_unk;
    char *unk;
    int32_t unk_id; /* -1 when unk_token is not in the vocabulary */
    int fuse_unk, byte_fallback, ignore_merges;
    char *prefix, *suffix;
    size_t prefix_len, suffix_len;
    int32_t byte_id[256]; /* id of "<0xNN>", -1 when absent */
} hf_bpe_t;

enum { FLAG_SPECIAL = 1, FLAG_ADDED = 2, FLAG_BYTE = 4, FLAG_VALID = 8 };

struct hf_tok {
    hf_bpe_t bpe;
    hf_norm_t *norm;
    size_t n_norm;
    hf_pre_t *pre;
    size_t n_pre;
    hf_dec_t *dec;
    size_t n_dec;
    int has_decoder; /* a decoder is declared (a null one joins tokens with spaces) */
    int dec_bytefallback;

    hf_added_t *added;
    size_t n_added;
    hf_matcher_t raw, normd;

    int32_t *tmpl; /* post-processor: ids, -1 = the sequence, -2 = end of one template */
    size_t n_tmpl;
    int32_t tmpl_bos, tmpl_eos;

    tok_buf_t strs; /* decoding strings of all ids */
    size_t *str_off;
    uint32_t *str_len;
    uint8_t *flags;

    char bl_enc[256][2]; /* ByteLevel: byte → character (UTF-8, 1 or 2 bytes) */
    uint8_t bl_enc_len[256];
    int16_t bl_dec[324]; /* code point → byte, -1 for others */
};

/* ---- scratch space of one call ---------------------------------------------------------- */

typedef struct piece {
    size_t off, len;
    int32_t id; /* >= 0: already an added token */
    int origin; /* starts at offset 0 of the original text */
} piece_t;

typedef struct pieces {
    tok_buf_t text;
    piece_t *p;
    size_t n, cap;
} pieces_t;

typedef struct span {
    size_t s, e;
    int m;
} span_t;

typedef struct spans {
    span_t *p;
    size_t n, cap;
} spans_t;

typedef struct bpe_sym {
    int32_t id, prev, next;
    int alive;
} bpe_sym_t;

typedef struct bpe_cand {
    uint32_t rank, pos;
    int32_t merged;
} bpe_cand_t;

/* Scratch space of one encode or decode call; the tokenizer itself stays read-only so that
 * threads can share it. */
typedef struct hf_work {
    pcre2_match_data *md;
    tok_buf_t n1, n2, tmp, key;
    spans_t sp, sp2;
    pieces_t sub; /* a pre-tokenizer's split of one piece */
    bpe_sym_t *sym;
    size_t n_sym, cap_sym;
    bpe_cand_t *heap;
    size_t n_heap, cap_heap;
} hf_work_t;

/* ---- tokenizer_hf.c: reading JSON values and steps -------------------------------------- */

char *hf_dupn(const char *s, size_t n);
/* The string member key of o (NULL when absent or not a string); *len (optional) its
 * length. */
const char *hf_jstr(const json_t *o, const char *key, size_t *len);
int hf_jbool(const json_t *o, const char *key, int def);
/* Integers may come as JSON integers or as integral reals: 1 with *out set, else 0. */
int hf_jint(const json_t *v, int64_t *out);
/* Appends one zeroed step to a flat array; NULL without memory (the array is unchanged). */
void *hf_step_new(void **arr, size_t *n, size_t size);
int hf_one_char(const tokenizer_t *t, const char *what, const char *s, size_t n, char out[4],
                size_t *out_len);
int hf_prepend_scheme(const json_t *o, int def);

typedef int (*hf_parse_step_fn)(tokenizer_t *t, const json_t *o, int depth);

/* A table of step kinds: entries of `size` bytes, each starting with its type name. */
typedef struct hf_kinds {
    const void *table;
    size_t n, size;
} hf_kinds_t;

/* What the four pipeline parsers share: every step is an object with a type, nesting is
 * bounded, and a Sequence lists further steps under list_key, each parsed by self. Returns
 * 1 when o was a Sequence (parsed), 0 with *kind set to the entry of kinds naming o's type,
 * or an error (RIVER_EUNSUPPORTED for a type not in the table). */
int hf_parse_step(tokenizer_t *t, const json_t *o, int depth, const char *what,
                  const char *list_key, hf_parse_step_fn self, hf_kinds_t kinds, const void **kind);

/* ---- hf_pattern.c ----------------------------------------------------------------------- */

void hf_pat_free(hf_pat_t *p);
int hf_re_compile(const tokenizer_t *t, const char *what, const char *src, size_t len,
                  pcre2_code **out);
/* Reads o's {"pattern": {"String": "..."}} or {"pattern": {"Regex": "..."}}. */
int hf_pat_parse(const tokenizer_t *t, const json_t *o, const char *what, hf_pat_t *p);
/* Finds the first match at or after start. Returns 1 and its bounds, 0 when none, or an
 * error. */
int hf_pat_find(const tokenizer_t *t, const hf_pat_t *p, const char *s, size_t len, size_t start,
                pcre2_match_data *md, size_t *ms, size_t *me);
/* Appends s to out with every match of pat replaced by `with`. */
int hf_replace_all(const tokenizer_t *t, const hf_pat_t *pat, const char *s, size_t len,
                   const char *with, size_t with_len, tok_buf_t *out, pcre2_match_data *md);
/* Splits s by the matches of pat with the given delimiter behaviour and adds the non-empty
 * parts to out. */
int hf_split(const tokenizer_t *t, const hf_pat_t *pat, int behavior, int invert, const char *s,
             size_t len, int origin, pieces_t *out, hf_work_t *w);

int hf_is_white(int32_t c);
int hf_is_word(int32_t c);
/* The code point ending at s[end) (valid UTF-8), or -1 at the start. */
int32_t hf_cp_before(const char *s, size_t end);
/* The code point at s[at], or -1 at the end. */
int32_t hf_cp_at(const char *s, size_t len, size_t at);

/* Empty pieces that are not added tokens are dropped, as the library drops empty splits. */
int hf_pieces_add(pieces_t *ps, const char *s, size_t len, int32_t id, int origin);
void hf_pieces_reset(pieces_t *ps);
void hf_pieces_free(pieces_t *ps);

int hf_work_init(hf_work_t *w);
void hf_work_free(hf_work_t *w);

/* ---- the steps -------------------------------------------------------------------------- */

int hf_parse_added(tokenizer_t *t, const json_t *arr, int32_t *max_id);
/* The matcher over the added tokens with the given `normalized` flag. */
int hf_matcher_build(tokenizer_t *t, hf_matcher_t *m, int normalized);
void hf_matcher_free(hf_matcher_t *m);
/* Splits s at the matches of m: matched added tokens become pieces with their id. */
int hf_added_split(const tokenizer_t *t, const hf_matcher_t *m, const char *s, size_t len,
                   int origin, const hf_allow_t *allow, pieces_t *out);

int hf_parse_norm(tokenizer_t *t, const json_t *o, int depth);
/* Runs the normalizer steps; *res points at w->n1 or w->n2 or, with no steps, at s. */
int hf_normalize(const tokenizer_t *t, const char *s, size_t len, hf_work_t *w, const char **res,
                 size_t *res_len);

int hf_parse_pre(tokenizer_t *t, const json_t *o, int depth);
/* Runs pre-tokenizer step p over the pieces of in, appending to out. */
int hf_pre_step(const tokenizer_t *t, const hf_pre_t *p, const pieces_t *in, pieces_t *out,
                hf_work_t *w);

/* Reads the BPE model (vocabulary, merges, options); *max_id grows to its largest id. */
int hf_parse_model(tokenizer_t *t, const json_t *model, int32_t *max_id);
void hf_bpe_free(hf_bpe_t *b);
/* BPE::tokenize for one pre-token, appending its ids to out. */
int hf_bpe_word(const tokenizer_t *t, const char *s, size_t len, tok_ids_t *out, hf_work_t *w);

int hf_parse_post(tokenizer_t *t, const json_t *o, int depth);
/* Puts ids inside the post-processor's template; tmp is scratch. */
int hf_post_apply(const hf_tok_t *h, tok_ids_t *ids, tok_ids_t *tmp);

int hf_parse_dec(tokenizer_t *t, const json_t *o, int depth);
/* The byte of a "<0xNN>" token as the ByteFallback decoder reads it, or -1. */
int hf_byte_token(const char *s, size_t n);

#endif
