/* Grammars for constrained decoding: which tokens may come next so that the generated text
 * stays inside a grammar (GBNF text, or a JSON Schema compiled to one).
 *
 * Four objects, from the most shared to the least:
 *
 *   grammar_t          a compiled grammar (grammar_parse, grammar_from_json_schema,
 *                      grammar_json_object). Immutable; any number of threads may use it.
 *   grammar_vocab_t    one tokenizer's vocabulary as byte strings in a trie. Immutable; build
 *                      it once per tokenizer and share it.
 *   grammar_matcher_t  a grammar bound to a vocabulary: for every place in the grammar, the
 *                      tokens that are allowed there whatever comes around it, the tokens
 *                      that never are, and the few that depend on the enclosing rules
 *                      (XGrammar's "context-independent" tokens). Building it is the one
 *                      expensive step: over Llama 3's 128k tokens ~10 ms for a schema of
 *                      plain strings, numbers and enums, ~100 ms more per distinct string
 *                      length bound (maxLength), one core. Immutable afterwards and
 *                      shareable, so the n sequences of one request build it once.
 *   grammar_state_t    one sequence's position: the set of parse stacks, a cache of its last
 *                      masks and a memo of the grammar's transitions (a few MiB at most).
 *                      Not shareable; a state must not be used by two threads at once.
 *
 * A mask costs microseconds inside a JSON string (the same state again: a cached copy) and
 * tens to a few hundred elsewhere over Llama 3's vocabulary (`make bench-grammar`).
 * The grammar and the vocabulary must outlive the matchers made from them, and a matcher
 * the states made from it.
 *
 * The matcher works on BYTES. Character classes are classes of Unicode code points matched
 * on their UTF-8 encoding, so `[^"\\]` takes any multi-byte character whole, and a token that
 * ends inside a character is allowed when some character of the class starts that way.
 * Invalid UTF-8 never matches a class.
 *
 * GBNF (llama.cpp's grammar format):
 *   name ::= alternatives          one rule a line; a line that starts with `|` continues the
 *                                  rule above; newlines are free inside parentheses and after
 *                                  `::=` and `|`. Names: [A-Za-z0-9_-]+. The start rule is
 *                                  "root".
 *   "lit"  [a-z0-9_]  [^"\\]  .    literals, classes, negated classes, any character; escapes
 *                                  \n \r \t \\ \" \' \[ \] \- \^ \/ \xNN \uNNNN \UNNNNNNNN
 *   ( )  |  *  +  ?  {m}  {m,}  {m,n}   grouping, alternation, repetition
 *   # comment                      to the end of the line
 * Left recursion (a rule that can reach itself before consuming a byte, including a
 * repetition of something that can match nothing, like (x*)*) and rules that can never
 * finish (no base case) are refused at parse time, naming the rule.
 *
 * Errors: every function returns 0 or a negative RIVER_E* code (common/err.h) and records a
 * detail with river_err_set(): a grammar text error names "line L, column C"; a schema error
 * names the JSON pointer of the offending schema part ("/properties/age/type: unknown type
 * \"integr\""). A failing constructor sets *out to NULL and leaves nothing allocated; a
 * failing state operation leaves the state as it was, unless it says otherwise. */
#ifndef RIVER_TEXT_GRAMMAR_H
#define RIVER_TEXT_GRAMMAR_H

#include <stddef.h>
#include <stdint.h>

/* ---- limits ------------------------------------------------------------------------------
 * Every resource a hostile grammar, schema or vocabulary could inflate has a bound; going
 * over one is an error (RIVER_ERANGE for sizes, RIVER_EFULL for the matcher's stacks) whose
 * detail names the limit and where it was hit. None of them is reached by recursion on the C
 * stack: deep structures are parsed with explicit stacks up to GRAMMAR_MAX_NESTING. */
#define GRAMMAR_MAX_TEXT (8u << 20)     /* bytes of grammar text or schema JSON */
#define GRAMMAR_MAX_NESTING 64          /* parentheses in GBNF and patterns; schema depth */
#define GRAMMAR_MAX_RULES 65536         /* rules, after repetitions are expanded */
#define GRAMMAR_MAX_ELEMENTS (1u << 20) /* grammar elements, after expansion */
#define GRAMMAR_MAX_REPEAT 10000        /* n of {m,n}; minLength/maxLength/minItems/maxItems */
#define GRAMMAR_MAX_ENUM 4096           /* values of one enum */
/* Frames of one parse stack. A token that would push a stack deeper is not allowed there
 * (the mask leaves it out, and closing stays possible), which is what bounds recursive
 * grammars: the JSON grammars of this file nest at most 128 levels. */
#define GRAMMAR_MAX_DEPTH 256
/* Parse stacks alive at once in one state (ambiguity). Past it, grammar_state_accept and
 * grammar_state_mask fail with RIVER_EFULL: the grammar is too ambiguous to follow. */
#define GRAMMAR_MAX_STACKS 8192
#define GRAMMAR_MAX_TOKEN_BYTES 1024 /* bytes of one vocabulary token */
#define GRAMMAR_MAX_VOCAB (1 << 22)  /* tokens of a vocabulary */

/* ---- grammars ---------------------------------------------------------------------------- */

typedef struct grammar grammar_t;

/* Compiles GBNF text (len bytes, need not be NUL-terminated; the start rule is "root"). */
int grammar_parse(grammar_t **out, const char *text, size_t len);

/* Compiles a JSON Schema (the subset OpenAI's structured outputs document, strict mode):
 *   type: object, array, string, number, integer, boolean, null, or a list of them;
 *   enum, const (any JSON values, written compactly); anyOf, and oneOf as anyOf; allOf of
 *   one schema; $ref to "#", "#/$defs/NAME" or "#/definitions/NAME" (recursion allowed,
 *   bounded by GRAMMAR_MAX_DEPTH; a recursion with no way out is an error);
 *   object: properties (emitted in schema order), required (the others may be left out),
 *     additionalProperties: absent or false = no other keys, as strict mode requires; true
 *     or a schema = other members (any key, even a declared one again) after the declared
 *     ones; with no properties and no additionalProperties an object is "{}" only;
 *   array: items (absent: any JSON value), minItems, maxItems;
 *   string: minLength, maxLength (characters, an escape counts as one), pattern (a regular
 *     expression subset: literals, escapes, classes, \d \w \s \D \W \S, ., groups,
 *     alternation, * + ? {m} {m,} {m,n}, ^ and $ at the ends; an unanchored end may hold any
 *     characters; each character the pattern matches is written as a JSON encoder writes
 *     it, so "\u0041" is refused where "A" is allowed); pattern together with
 *     minLength/maxLength is refused;
 *   number/integer: JSON numbers of at most 16 integer digits, 16 fraction digits and a
 *     2-digit exponent (integer: no fraction or exponent), so that a number always ends and
 *     fits a double;
 *     "minimum" >= 0 (or "exclusiveMinimum" >= 0) drops the minus sign; other bounds
 *     (maximum, multipleOf...) are accepted and not enforced.
 *   Ignored as annotations: title, description, default, examples, $schema, $id, $comment,
 *   format, strict, deprecated, readOnly, writeOnly, and $defs/definitions themselves. Any
 *   other keyword is an error naming its path. The schema `true` or `{}` is any JSON value.
 * Whitespace between JSON tokens is bounded, so a model cannot loop on it: after `{`, `[`,
 * `,` and `:` and after each member's value or array item, either nothing, one space, or
 * one newline followed by up to 16 spaces or tabs; none between a key and its `:`, and none
 * before or after the document. Keys and strings are written as a JSON encoder writes
 * them (escapes \" \\ \/ \b \f \n \r \t \uXXXX, no raw control characters); enum and
 * const values compactly, as jansson's JSON_COMPACT writes them. Refused schemas name the
 * JSON pointer of the part at fault. */
int grammar_from_json_schema(grammar_t **out, const char *schema_json, size_t len);

/* Any JSON object (response_format "json_object"), the schema {"type": "object",
 * "additionalProperties": true}: nesting at most 128 levels (GRAMMAR_MAX_DEPTH), whitespace
 * and numbers bounded as above. */
int grammar_json_object(grammar_t **out);

/* The GBNF text of a schema, for composing it into a larger grammar: rules named
 * rule_prefix (the schema's value) and rule_prefix-* (its parts), e.g. with prefix "call",
 *     root ::= "<tool_call>" call "</tool_call>"
 * followed by this text. rule_prefix: [A-Za-z0-9_]+, at most 64 bytes. *gbnf_out is
 * malloc'd and NUL-terminated; the caller frees it. */
int grammar_json_schema_to_gbnf(const char *schema_json, size_t len, const char *rule_prefix,
                                char **gbnf_out);

void grammar_destroy(grammar_t **g);

/* ---- vocabularies ------------------------------------------------------------------------ */

typedef struct grammar_vocab grammar_vocab_t;

/* token_bytes[i] / token_lens[i]: the bytes token i stands for in the generated text (for a
 * tokenizer: tokenizer_token_bytes, text/tokenizer.h). NULL or length 0: a special or
 * control token, which no grammar ever allows. stop_ids: the n_stop tokens that end a
 * generation (eos, eot, ...); they are allowed exactly when the grammar may end, whatever
 * bytes they have. n_tokens is at most GRAMMAR_MAX_VOCAB; a token longer than
 * GRAMMAR_MAX_TOKEN_BYTES is RIVER_ERANGE. The bytes are copied. */
int grammar_vocab_new(grammar_vocab_t **out, const char *const *token_bytes,
                      const size_t *token_lens, int n_tokens, const int32_t *stop_ids,
                      int n_stop);
int grammar_vocab_size(const grammar_vocab_t *v);
void grammar_vocab_destroy(grammar_vocab_t **v);

/* ---- matchers ---------------------------------------------------------------------------- */

typedef struct grammar_matcher grammar_matcher_t;

/* Binds g to v, precomputing each grammar position's token classes. g and v must outlive
 * the matcher. RIVER_EFULL when the grammar is too ambiguous (GRAMMAR_MAX_STACKS) while
 * classifying some token; RIVER_ENOMEM. */
int grammar_matcher_new(grammar_matcher_t **out, const grammar_t *g, const grammar_vocab_t *v);
void grammar_matcher_destroy(grammar_matcher_t **m);

/* ---- states ------------------------------------------------------------------------------ */

typedef struct grammar_state grammar_state_t;

/* A state at the start of the grammar. m must outlive it. */
int grammar_state_new(grammar_state_t **out, const grammar_matcher_t *m);
void grammar_state_destroy(grammar_state_t **s);

/* Makes dst the same position as src (both states of the same matcher, else RIVER_EINVAL):
 * a snapshot to roll back to after speculative tokens. On RIVER_ENOMEM dst is unchanged. */
int grammar_state_copy(grammar_state_t *dst, const grammar_state_t *src);

/* Fills allowed, a bitset of ceil(n_tokens / 32) words (bit i % 32 of word i / 32 for token
 * i), with the tokens that may come next: those whose bytes continue the text within the
 * grammar, and the stop tokens iff the grammar may end here. After a stop token was accepted
 * nothing is allowed. On error (RIVER_EFULL, RIVER_ENOMEM) the words are unspecified and
 * the state is unchanged. */
int grammar_state_mask(grammar_state_t *s, uint32_t *allowed);

/* Advances past one token. RIVER_EINVAL (state unchanged) when the mask would not allow
 * it, RIVER_ERANGE for an id outside the vocabulary; RIVER_EFULL or RIVER_ENOMEM (state
 * unchanged) as for grammar_state_mask. */
int grammar_state_accept(grammar_state_t *s, int32_t token);

/* Advances past bytes (a forced prefix, tests). RIVER_EINVAL (state unchanged) when they
 * do not continue the text within the grammar; len 0 is a no-op. */
int grammar_state_accept_bytes(grammar_state_t *s, const char *bytes, size_t len);

/* 1 when the text so far is a complete sentence of the grammar, so stop tokens are allowed. */
int grammar_state_can_end(const grammar_state_t *s);
/* 1 when nothing but a stop token can follow (complete, and no byte may continue it), or a
 * stop token was accepted. */
int grammar_state_is_done(const grammar_state_t *s);

#endif
