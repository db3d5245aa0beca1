/* Internals of the grammar engine, shared by its files. Nothing here is part of the public
 * interface in text/grammar.h.
 *
 *   grammar_gbnf.c    GBNF text → syntax tree (grammar__ast_t)
 *   grammar_build.c   syntax tree → compiled grammar: repetitions expanded into rules,
 *                     classes interned, and the analyses the matcher needs (shortest
 *                     sentence of each rule, FIRST/FOLLOW bytes, left recursion, push depth)
 *   grammar_schema.c  JSON Schema → GBNF text; grammar_regex.c: a pattern → GBNF expression
 *   grammar_stack.c   parse stacks: the node pool and the advance over one byte
 *   grammar_vocab.c   the vocabulary trie
 *   grammar_match.c   the matcher (per-position token classes), states and masks
 *
 * A compiled grammar is a flat array of elements. Rule r has alternatives
 * alt_start[rule_alt[r] .. rule_alt[r + 1]); each alternative is a run of CHARS and RULE
 * elements ended by an END element. A parse stack is a chain of nodes (pos, parent): pos is
 * the element to match next, parent the node to return to when pos's alternative ends. The
 * top node of a live stack always sits on a CHARS element; nodes below it sit on the
 * element after a RULE reference (never on END: a reference at the end of an alternative
 * returns straight to its own parent, so tail recursion does not grow the stack). */
#ifndef RIVER_TEXT_GRAMMAR_INTERNAL_H
#define RIVER_TEXT_GRAMMAR_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "text/grammar.h"

/* ---- compiled grammar ------------------------------------------------------------------- */

enum { GRAMMAR__END = 0, GRAMMAR__CHARS = 1, GRAMMAR__RULE = 2 };
#define GRAMMAR__ETYPE(e) ((e) & 3u)
#define GRAMMAR__EVAL(e) ((e) >> 2)
#define GRAMMAR__ELEM(type, val) (((uint32_t)(val) << 2) | (uint32_t)(type))

#define GRAMMAR__INF UINT32_MAX

/* A set of code points: inclusive [lo, hi] ranges, sorted, disjoint, never touching, and
 * without the surrogates D800-DFFF (which UTF-8 cannot encode). */
typedef struct grammar__class {
    uint32_t off, n;    /* ranges grammar.ranges[2 * off .. 2 * (off + n)) */
    uint32_t first[8];  /* bit b: some member's UTF-8 encoding starts with byte b */
    uint8_t minlen;     /* bytes of the shortest member's encoding */
} grammar__class_t;

/* The rules a repetition x{m,n} expands into form a chain: rule j holds one copy of x's
 * alternatives followed by a reference to rule j+1. Two positions at the same place of x in
 * two rules of one chain see the same text for the next T items once at least T of them
 * must, or may, follow; the matcher classifies such positions once (grammar_match.c). */
typedef struct grammar__chain {
    uint32_t chain; /* chain id + 1; 0: the rule is not in a chain */
    uint32_t a;     /* items that must follow the current one */
    uint32_t b;     /* items that may follow after those (GRAMMAR__INF: unbounded) */
    uint32_t n_x;   /* alternatives of x (the rule may have one more: the empty one) */
} grammar__chain_t;

struct grammar {
    uint32_t *elem, n_elem;
    uint32_t *elem_rule; /* [n_elem] rule that owns each element */
    uint32_t *rule_alt;  /* [n_rules + 1] */
    uint32_t *alt_start, n_alt;
    uint32_t n_rules, root;
    grammar__class_t *cls;
    uint32_t n_cls;
    uint32_t *ranges, n_ranges; /* lo, hi pairs */
    char *names;                /* rule names, NUL-separated */
    uint32_t *name_off;         /* [n_rules] */
    grammar__chain_t *chain;    /* [n_rules] */

    /* Analyses (grammar_build.c). */
    uint32_t *minlen;       /* [n_rules] bytes of the shortest sentence */
    uint32_t *suffix_min;   /* [n_elem] bytes of the shortest completion from the element to
                             * the end of its alternative (END: 0) */
    uint32_t (*follow)[8];  /* [n_rules] bytes that can come right after the rule in some
                             * context (end of text is not a byte and is not in it) */
    uint8_t *reachable;     /* [n_rules] from root */
    uint32_t max_push;      /* most frames one closure pushes above its start node */
    /* Static context: the return positions every instance of rule r has above it, innermost
     * first, ctx_pos[ctx_off[r] .. ctx_off[r + 1]) (at most GRAMMAR__CTX_MAX); under them
     * BOTTOM when ctx_end[r] (the text ends there), else a frame nobody can know. When a
     * path returns past the known frames, what comes next is in FOLLOW(ctx_follow[r]). A
     * rule called from one place only (a repetition's rules, a whitespace group) thus lets
     * the matcher classify tokens that run on past its end. */
    uint32_t *ctx_off, *ctx_pos, *ctx_follow;
    uint8_t *ctx_end;
};

#define GRAMMAR__CTX_MAX 16

const char *grammar__rule_name(const grammar_t *g, uint32_t r);

/* ---- syntax tree (grammar_gbnf.c → grammar_build.c) ------------------------------------- */

enum {
    GRAMMAR__AST_ALT,   /* kids: alternatives (each a SEQ) */
    GRAMMAR__AST_SEQ,   /* kids: items */
    GRAMMAR__AST_CLASS, /* ranges (negation already applied) */
    GRAMMAR__AST_LIT,   /* code points cps[0..n_cps), one after the other */
    GRAMMAR__AST_REF,   /* rule index */
    GRAMMAR__AST_REPEAT /* kids[0] repeated min..max times (max GRAMMAR__INF: unbounded) */
};

typedef struct grammar__ast grammar__ast_t;
struct grammar__ast {
    int kind;
    grammar__ast_t **kids;
    uint32_t n_kids, cap_kids;
    uint32_t *ranges; /* CLASS: lo, hi pairs, normalized */
    uint32_t n_ranges;
    uint32_t *cps; /* LIT */
    uint32_t n_cps;
    uint32_t ref;      /* REF */
    uint32_t min, max; /* REPEAT */
    uint32_t memo;     /* build: rule made for this group + 1 */
};

typedef struct grammar__rules_ast {
    char **names;
    grammar__ast_t **body; /* [n] ALT, NULL until defined */
    size_t *at;            /* [n] byte offset of the first mention, for errors */
    uint32_t n, cap;
} grammar__rules_ast_t;

/* Makes room for `need` entries of `size` bytes in the array *v of *cap entries, doubling
 * its capacity (from `first` when it has none). RIVER_ENOMEM, with a message, when it
 * cannot; the array is then unchanged. The grammar's arrays grow through it. */
int grammar__room(void **v, uint32_t need, uint32_t *cap, size_t size, uint32_t first);

void grammar__ast_free(grammar__ast_t *a);
void grammar__rules_ast_free(grammar__rules_ast_t *r);

/* Normalizes a list of ranges in place: sorts, merges, removes surrogates; the count may
 * grow by one (a range across the surrogates splits), so the array needs room for 2n + 2. */
int grammar__ranges_normalize(uint32_t **ranges, uint32_t *n);
/* The complement of normalized ranges within 0..10FFFF (surrogates excluded). */
int grammar__ranges_negate(uint32_t **ranges, uint32_t *n);

/* Builds the compiled grammar from parsed rules; takes ownership of nothing. When a rule is
 * refused (left recursion, no way to finish) and bad_rule is not NULL, *bad_rule receives
 * its name (malloc'd). */
int grammar__build(grammar_t **out, const grammar__rules_ast_t *rules, char **bad_rule);
/* grammar_parse, reporting a refused rule's name as grammar__build does. */
int grammar__parse_ex(grammar_t **out, const char *text, size_t len, char **bad_rule);

/* ---- schema → GBNF ---------------------------------------------------------------------- */

/* A growable string. */
typedef struct grammar__buf {
    char *p;
    size_t len, cap;
    int oom;
} grammar__buf_t;

void grammar__buf_put(grammar__buf_t *b, const char *s, size_t n);
void grammar__buf_puts(grammar__buf_t *b, const char *s);
void grammar__buf_printf(grammar__buf_t *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* A GBNF literal for bytes s (quoted, escaped). */
void grammar__buf_literal(grammar__buf_t *b, const char *s, size_t n);
void grammar__buf_free(grammar__buf_t *b);

/* A regex pattern (ECMA-style subset) as a GBNF expression over the raw text of a JSON
 * string's contents (JSON escapes included), appended to out. path names the pattern in
 * errors. any_char: a GBNF expression of one JSON string character, for unanchored ends. */
int grammar__regex_to_gbnf(const char *re, size_t len, const char *path, const char *any_char,
                           grammar__buf_t *out);

/* ---- parse stacks (grammar_stack.c) -----------------------------------------------------
 * Node ids 0 and 1 are sentinels: BOTTOM is the parent of the root rule's frame (returning
 * to it completes the text); BOUNDARY stands for an unknown context when the matcher
 * classifies tokens at one position (returning to it leaves the known frames). */

#define GRAMMAR__BOTTOM 0u
#define GRAMMAR__BOUNDARY 1u
#define GRAMMAR__NONE UINT32_MAX

typedef struct grammar__node {
    uint32_t pos;    /* element index */
    uint32_t parent; /* node id */
    uint32_t aux;    /* partial UTF-8 character at a CHARS top (0: none), see grammar_stack.c */
    uint32_t depth;  /* frames from the sentinel: 1 for a node whose parent is a sentinel */
} grammar__node_t;

/* Nodes are hash-consed: one id per (pos, parent, aux), so equal stacks are equal ids. A
 * node's parent always has a smaller id. */
typedef struct grammar__pool {
    grammar__node_t *node;
    uint32_t *next; /* hash chain, newest first */
    uint32_t n, cap;
    uint32_t *head, mask;
} grammar__pool_t;

int grammar__pool_init(grammar__pool_t *p);
void grammar__pool_free(grammar__pool_t *p);
/* Drops every node with id >= n (nodes made by a look-ahead nobody kept). */
void grammar__pool_truncate(grammar__pool_t *p, uint32_t n);
int grammar__pool_copy(grammar__pool_t *dst, const grammar__pool_t *src);
/* The id of node (pos, parent, aux), made when new; GRAMMAR__NONE when out of memory or over
 * the pool's bound (*err says which). */
uint32_t grammar__pool_intern(grammar__pool_t *p, uint32_t pos, uint32_t parent, uint32_t aux,
                              int *err);
/* Keeps only the nodes under ids[0..n_ids) and renumbers them (ids rewritten in place, in the
 * same order); on RIVER_ENOMEM the pool is unchanged. */
int grammar__pool_compact(grammar__pool_t *p, uint32_t *ids, uint32_t n_ids);

/* A set of top nodes, and what the closure that made them met besides. */
typedef struct grammar__tops {
    uint32_t *v, n, cap;
    uint8_t accept;   /* a stack returned to BOTTOM: the text may end here */
    uint8_t boundary; /* a stack returned to BOUNDARY */
} grammar__tops_t;

int grammar__tops_push(grammar__tops_t *t, uint32_t id);
void grammar__tops_free(grammar__tops_t *t);

/* Scratch space of the stack operations: the visited set of one closure and a work list. */
typedef struct grammar__scratch {
    uint64_t *vkey;
    uint32_t *vstamp, vmask, stamp, vcount;
    uint32_t *work, n_work, cap_work; /* pairs pos, parent */
    uint32_t max_depth;  /* deepest node made since the caller reset it */
    uint8_t depth_cut;   /* a path died at GRAMMAR_MAX_DEPTH since the caller reset it */
} grammar__scratch_t;

void grammar__scratch_free(grammar__scratch_t *sc);

/* Adds to out the tops reached from "continue at pos with parent". */
int grammar__close(const grammar_t *g, grammar__pool_t *p, grammar__scratch_t *sc, uint32_t pos,
                   uint32_t parent, grammar__tops_t *out);
/* out (emptied first) := the tops after byte b from tops in[0..n), sorted by id. */
int grammar__advance(const grammar_t *g, grammar__pool_t *p, grammar__scratch_t *sc,
                     const uint32_t *in, uint32_t n, uint8_t b, grammar__tops_t *out);
/* The start: the root rule's alternatives from BOTTOM. */
int grammar__start(const grammar_t *g, grammar__pool_t *p, grammar__scratch_t *sc,
                   grammar__tops_t *out);
/* Bytes of the shortest completion of the stack under top `id`, and the least over a state's
 * tops (0 when it can end), for tests that must bring a random walk to an end. */
uint64_t grammar__min_remaining(const grammar_t *g, const grammar__pool_t *p, uint32_t id);
uint64_t grammar__state_min_remaining(const grammar_state_t *s);

/* ---- vocabulary (grammar_vocab.c) -------------------------------------------------------- */

/* The trie lists its nodes in preorder: node 0 is the root (no byte), the children of node i
 * start at i + 1 and the subtree of i ends before end[i]. The tokens in lexicographic byte
 * order are exactly the trie's tokens in preorder; those ending at node i are
 * sorted[tok_lo[i] .. tok_lo[i + 1]), those in its subtree sorted[tok_lo[i] .. tok_lo[end[i]]). */
struct grammar_vocab {
    int n_tokens;
    char *bytes;     /* all tokens' bytes */
    size_t *off;     /* [n_tokens] */
    uint32_t *len;   /* [n_tokens] 0: never allowed as bytes */
    uint8_t *stop;   /* [n_tokens] */
    int32_t *stop_ids;
    int n_stop;
    uint32_t max_len; /* bytes of the longest token */

    uint32_t n_nodes;
    uint8_t *node_byte;   /* [n_nodes] */
    uint16_t *node_depth; /* [n_nodes] root 0 */
    uint32_t *node_end;   /* [n_nodes] */
    uint32_t *tok_lo;     /* [n_nodes + 1] */
    int32_t *sorted;      /* [n_sorted] token ids with bytes, lexicographic */
    uint32_t n_sorted;
};

#endif
