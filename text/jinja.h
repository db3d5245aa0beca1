/* The chat-template engine's insides: an arena, the values a template computes with, the
 * lexer's tokens, the parser's AST and the tables of filters, tests and methods. Only
 * engine/jinja_*.c and text/chat_template.c include this; the public API is
 * text/chat_template.h.
 *
 * Memory: a compiled template keeps its tokens, AST and constants in one arena; a rendering
 * allocates every value in an arena of its own, dropped whole at the end. Values therefore
 * need no reference counts, cycles (a list appended to itself) cannot leak, and an error
 * anywhere unwinds by returning. */
#ifndef RIVER_TEXT_JINJA_H
#define RIVER_TEXT_JINJA_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "text/span.h"

/* Bounds of one rendering; each one exceeded is an error that says which. */
#define JINJA_MAX_OUTPUT (16u << 20)  /* bytes of the rendering, and of any captured block */
#define JINJA_MAX_MEMORY (256u << 20) /* bytes of values one rendering may allocate */
#define JINJA_MAX_ITERS 1000000u      /* loop iterations, all loops of a rendering together */
#define JINJA_MAX_CALLS 64            /* nested macro calls */
#define JINJA_MAX_NEST 256            /* nesting of expressions and blocks in a template */
#define JINJA_MAX_EVAL 2000           /* nested evaluation steps (C recursion) of a rendering */
#define JINJA_MAX_DEPTH 256           /* nesting walked by repr, tojson and comparisons */

/* ---- Arena ---- */

typedef struct jarena jarena_t;
/* cap: the most bytes it hands out in all. */
jarena_t *jarena_new(size_t cap);
void jarena_destroy(jarena_t **a);
/* NULL when out of memory or over the cap (zeroed memory otherwise, 16-byte aligned). */
void *jarena_alloc(jarena_t *a, size_t n);
/* Whether the last failed allocation was over the cap rather than out of memory. */
int jarena_over_cap(const jarena_t *a);

/* ---- Values ---- */

typedef enum {
    JV_ABSENT, /* an argument not given (argument binding only; never a template value) */
    JV_UNDEF,
    JV_NONE,
    JV_BOOL,
    JV_INT,
    JV_FLOAT,
    JV_STR,
    JV_LIST,
    JV_DICT,
    JV_NS,   /* namespace(): a dict whose attributes a template may set */
    JV_LOOP, /* the loop variable of a for */
    JV_FUNC, /* a global function, a bound method or a macro */
} jv_type_t;

/* Provenance of a string's bytes: the template's own text (its literals, and the context
 * values the caller names as such: bos_token, eos_token) or data (everything else the
 * context holds: messages, tools, keyword arguments). Only template bytes may become
 * special tokens when the rendering is tokenized (chat_template_render_spans); the same
 * marks are what a markupsafe-style autoescape would leave alone, escaping the data.
 * Concatenation, output and captured blocks keep the marks byte for byte; any other
 * operation makes a string of template text only when every string it was given was
 * template text (text/jinja_prov.c), so a string nobody marked is data. */
typedef enum { JPROV_DATA = 0, JPROV_TEMPLATE, JPROV_MIXED } jprov_t;

typedef struct jspan {
    uint32_t off, len; /* bytes of a string (strings stay under JINJA_MAX_MEMORY) */
} jspan_t;

typedef struct jstr {
    size_t len;  /* bytes, not counting the NUL after them */
    int ascii;   /* all bytes < 0x80: code point indexing is byte indexing */
    int markup;  /* a markupsafe.Markup (text/jinja_markup.c); a string is never marked in
                    place once others may hold it: marking makes a copy */
    jprov_t prov;
    uint32_t nspan;       /* JPROV_MIXED: the template bytes, in order and disjoint */
    const jspan_t *span;
    char s[];
} jstr_t;

struct jval;
typedef struct jlist {
    size_t n, cap;
    int tuple; /* printed as (a, b) */
    struct jval *v;
} jlist_t;

typedef struct jdict {
    size_t n, cap; /* insertion order, as Python keeps it */
    jstr_t **k;
    struct jval *v;
} jdict_t;

struct jloop;
struct jfunc;
typedef struct jval {
    jv_type_t t;
    union {
        int b;
        int64_t i;
        double f;
        jstr_t *s;
        jlist_t *l;
        jdict_t *d; /* JV_DICT and JV_NS */
        struct jloop *loop;
        struct jfunc *fn;
        const char *undef_name; /* JV_UNDEF: the name that was missing, or NULL */
    } u;
} jval_t;

typedef struct jloop {
    jlist_t *items;
    size_t i; /* the current index0 */
    int depth;
} jloop_t;

enum { JF_GLOBAL, JF_METHOD, JF_MACRO };
struct jnode;
struct jbuiltin;
typedef struct jfunc {
    int kind;
    const struct jbuiltin *entry; /* JF_GLOBAL, JF_METHOD */
    jval_t self;                  /* JF_METHOD: the receiver */
    const struct jnode *macro;    /* JF_MACRO: its S_MACRO (or S_CALLBLOCK) node */
    struct jscope *closure;       /* JF_MACRO: the scope it was defined in */
} jfunc_t;

/* ---- Tokens ---- */

typedef enum {
    TK_EOF,
    TK_DATA,
    TK_VAR_BEGIN,
    TK_VAR_END,
    TK_BLOCK_BEGIN,
    TK_BLOCK_END,
    TK_NAME,
    TK_STRING,
    TK_INT,
    TK_FLOAT,
    TK_OP,
} jtok_type_t;

/* Operators of two characters; one-character operators are the character itself. */
enum { OP_FLOORDIV = 256, OP_POW, OP_EQ, OP_NE, OP_LE, OP_GE, OP_IN, OP_NOTIN };

typedef struct jtok {
    jtok_type_t type;
    int line;
    int op;          /* TK_OP */
    const char *s;   /* TK_NAME, TK_DATA, TK_STRING: NUL-terminated, in the arena */
    size_t len;      /* bytes of s */
    int64_t i;       /* TK_INT */
    double f;        /* TK_FLOAT */
} jtok_t;

/* Lexes normalised source (newlines "\n") into toks (arena). On error returns a negative
 * code with the detail set, naming name and the line. */
int jinja_lex(jarena_t *a, const char *name, const char *src, size_t len, jtok_t **toks,
              size_t *n);

/* ---- AST ---- */

typedef enum {
    /* expressions */
    N_CONST,
    N_NAME,
    N_ATTR,  /* a.name */
    N_ITEM,  /* a[b] */
    N_SLICE, /* a[b:c:d], each of b c d may be NULL */
    N_CALL,  /* a(args) */
    N_FILTER, /* a|fn(args); a NULL: the body of a filter block */
    N_TEST,   /* a is fn(args); op: 1 for "is not" */
    N_BIN,    /* a op b: + - * / // % ** ~ */
    N_CMP,    /* list[0] ops[0] list[1] ops[1] list[2] ... (chained) */
    N_AND,
    N_OR,
    N_NOT,
    N_NEG,
    N_POS,
    N_COND, /* a if b else c (c may be NULL) */
    N_LIST,
    N_TUPLE,
    N_DICT, /* list: key, value, key, value ... */
    /* statements */
    S_BODY,    /* list */
    S_DATA,    /* cval: the text */
    S_PRINT,   /* a */
    S_IF,      /* a: test, b: body, c: else body (or NULL) */
    S_FOR,     /* a: target, b: iterable, c: body, d: else body, e: filter test */
    S_SET,     /* a: target, b: value */
    S_SETBLOCK, /* a: target, c: body */
    S_MACRO,   /* name, list: N_NAME params (their a: default), c: body */
    S_CALLBLOCK, /* a: the N_CALL, list: caller's params, c: body */
    S_FILTERBLOCK, /* a: the filter chain (innermost a NULL), c: body */
    S_BREAK,
    S_CONTINUE,
} jnode_kind_t;

typedef struct jnode {
    jnode_kind_t kind;
    int line;
    int op;
    const char *name; /* N_NAME, N_ATTR, S_MACRO, keyword names: NUL-terminated */
    jval_t cval;      /* N_CONST, S_DATA */
    struct jnode *a, *b, *c, *d, *e;
    struct jnode **list; /* positional arguments, items, statements */
    size_t n;
    int *ops;              /* N_CMP: n - 1 operators */
    const char **kwnames;  /* N_CALL, N_FILTER, N_TEST: keyword arguments */
    struct jnode **kwvals;
    size_t nkw;
    const struct jbuiltin *fn; /* N_FILTER, N_TEST: resolved at compile time */
} jnode_t;

/* Parses tokens into a template body (S_BODY). Unknown filters and tests, unknown tags and
 * unbalanced blocks are errors naming the line. */
int jinja_parse(jarena_t *a, const char *name, const jtok_t *toks, size_t n, jnode_t **root);

/* ---- Rendering ---- */

typedef struct jrender jrender_t;

/* Arguments of a call: positional, then keyword. */
typedef struct jargs {
    size_t npos;
    const jval_t *pos;
    size_t nkw;
    const char *const *kwn;
    const jval_t *kwv;
} jargs_t;

/* A filter, a test, a method or a global function. fn gets the receiver (the filtered
 * value, the tested value, the method's object; absent for globals). Tests write a JV_BOOL. */
typedef int (*jbuiltin_fn_t)(jrender_t *r, const jnode_t *at, jval_t self, const jargs_t *args,
                             jval_t *out);
typedef struct jbuiltin {
    const char *name;
    jbuiltin_fn_t fn;
    jv_type_t type; /* methods: the receiver's type (JV_ABSENT: filters, tests, globals) */
} jbuiltin_t;

const jbuiltin_t *jinja_filter_find(const char *name);
const jbuiltin_t *jinja_test_find(const char *name);
/* The method name of a value of type t, or NULL. */
const jbuiltin_t *jinja_method_find(jv_type_t t, const char *name);
const jbuiltin_t *jinja_global_find(const char *name);

/* What one rendering gets besides its template and context. */
typedef struct jinja_render_opts {
    const json_t *defaults;           /* variables the context lacks, or NULL */
    const char *const *template_keys; /* top-level variables whose strings count as template
                                         text (NULL-terminated), or NULL */
    size_t max_memory;                /* bytes of values; 0: JINJA_MAX_MEMORY */
} jinja_render_opts_t;

/* Renders root with the variables of ctx (a JSON object). *out malloc'd, NUL-terminated;
 * spans (may be NULL) receives the template bytes of the output (malloc'd, *n_spans, in
 * order, disjoint). On failure nothing is left allocated. */
int jinja_render(const char *name, const jnode_t *root, const json_t *ctx,
                 const jinja_render_opts_t *opts, char **out, size_t *out_len,
                 text_span_t **spans, size_t *n_spans);

/* ---- Provenance (text/jinja_prov.c) ---- */

/* A growing list of template byte ranges, in the rendering's arena. */
typedef struct jspans {
    jspan_t *v;
    size_t n, cap;
} jspans_t;

/* Adds bytes [off, off + len) (after every range already there; touching ranges merge). */
int jr_spans_push(jrender_t *r, const jnode_t *at, jspans_t *b, size_t off, size_t len);
/* Adds the template bytes of s, which sits at base in the text b describes. */
int jr_spans_add_str(jrender_t *r, const jnode_t *at, jspans_t *b, const jstr_t *s, size_t base);
/* Marks s with b's ranges (s->len bytes): data, template or mixed. */
void jr_str_mark(jstr_t *s, const jspans_t *b);
/* Whether v holds data bytes anywhere (strings, list items, dict keys and values; a value
 * too large to walk cheaply counts as holding some). */
int jv_holds_data(jval_t v);
/* x followed by y, their marks kept. */
int jr_str_concat(jrender_t *r, const jnode_t *at, const jstr_t *x, const jstr_t *y,
                  jstr_t **out);
/* A builtin's result: a string it made of only template text is template text. */
void jr_prov_result(jval_t self, const jargs_t *args, jval_t *out);

/* ---- Markup (text/jinja_markup.c) ----
 *
 * transformers renders with autoescape off, yet markupsafe's Markup still shows through:
 * the safe and escape filters return one, and Markup + str escapes the plain str (& < > " '
 * become &amp; &lt; &gt; &#34; &#39;), as do Markup's methods with their arguments. A
 * template that builds text from "..."|safe + data therefore prints that data escaped, and
 * a chat API must do the same. Everything else (~, join, the replace filter, output)
 * treats a Markup as the plain string it is. Escaping keeps provenance byte for byte:
 * what a template byte becomes is template text, what a data byte becomes is data. */

/* markupsafe.escape(s): s itself when it is markup, else its text escaped, marked markup. */
int jr_escape(jrender_t *r, const jnode_t *at, jstr_t *s, jstr_t **out);
/* s's text escaped and marked markup even when s is markup already (forceescape). */
int jr_escape_force(jrender_t *r, const jnode_t *at, const jstr_t *s, jstr_t **out);
/* markupsafe.escape(v) of any value: str(v) escaped, a markup string left as it is. */
int jr_escape_value(jrender_t *r, const jnode_t *at, jval_t v, jstr_t **out);
/* Markup(s): s's text marked markup, its provenance kept (s itself when it is markup). */
int jr_markup(jrender_t *r, const jnode_t *at, jstr_t *s, jstr_t **out);
/* Marks a result markup: a string, or each string of a list (Markup.split gives Markups). */
int jr_markup_value(jrender_t *r, const jnode_t *at, jval_t *v);
/* After filter or method b ran on self: when self is a markup string and b is one that
 * keeps markup (Markup.upper(), and the filters that call such methods through soft_str),
 * marks *out. Tests never come here. */
int jr_markup_result(jrender_t *r, const jnode_t *at, const jbuiltin_t *b, jval_t self,
                     jval_t *out);
/* x + y where x or y is markup: Markup.__add__ / __radd__ escape the plain one. */
int jr_markup_add(jrender_t *r, const jnode_t *at, jstr_t *x, jstr_t *y, jstr_t **out);

/* ---- What the evaluator offers the builtins (text/jinja_eval.c) ---- */

/* Records "<template>:<line>: message" and returns err. */
int jr_fail(jrender_t *r, const jnode_t *at, int err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* An allocation in the rendering's arena; NULL after recording the error. */
void *jr_alloc(jrender_t *r, const jnode_t *at, size_t n);
/* Counts n loop iterations (or elements built) against JINJA_MAX_ITERS. */
int jr_count(jrender_t *r, const jnode_t *at, size_t n);
/* Counts work on bytes (a KiB as one iteration), so that string operations repeated in
 * loops stay bounded too. */
int jr_work(jrender_t *r, const jnode_t *at, size_t bytes);

jstr_t *jr_str_new(jrender_t *r, const jnode_t *at, const char *s, size_t len);
jval_t jv_str(jstr_t *s);
int jr_strval(jrender_t *r, const jnode_t *at, const char *s, size_t len, jval_t *out);
jlist_t *jr_list_new(jrender_t *r, const jnode_t *at, size_t cap);
int jr_list_push(jrender_t *r, const jnode_t *at, jlist_t *l, jval_t v);
jdict_t *jr_dict_new(jrender_t *r, const jnode_t *at, size_t cap);
/* Sets (or replaces) key k. */
int jr_dict_set(jrender_t *r, const jnode_t *at, jdict_t *d, jstr_t *k, jval_t v);
/* The value of key (len bytes), or NULL. */
jval_t *jv_dict_get(const jdict_t *d, const char *key, size_t len);

static inline jval_t jv_none(void) { jval_t v = {.t = JV_NONE}; return v; }
static inline jval_t jv_undef(void) { jval_t v = {.t = JV_UNDEF}; return v; }
static inline jval_t jv_bool(int b) { jval_t v = {.t = JV_BOOL}; v.u.b = !!b; return v; }
static inline jval_t jv_int(int64_t i) { jval_t v = {.t = JV_INT}; v.u.i = i; return v; }
static inline jval_t jv_float(double f) { jval_t v = {.t = JV_FLOAT}; v.u.f = f; return v; }

/* Python's truth value. */
int jv_truthy(jval_t v);
/* Python's ==. JINJA_MAX_DEPTH deep at most (deeper: not equal). */
int jv_equal(jval_t a, jval_t b);
/* Python's <, <=, >, >= (op '<', OP_LE...): 0/1, or an error for types that do not order. */
int jr_compare(jrender_t *r, const jnode_t *at, int op, jval_t a, jval_t b, int *res);
/* The type name Python would give ("str", "int", "dict" ...). */
const char *jv_type_name(jval_t v);

/* str(v) and repr(v) as Python prints them (undefined: ""). */
int jr_to_str(jrender_t *r, const jnode_t *at, jval_t v, jstr_t **out);
int jr_repr(jrender_t *r, const jnode_t *at, jval_t v, jstr_t **out);
/* json.dumps(v, ensure_ascii=False, indent, separators, sort_keys): indent NULL for none. */
int jr_tojson(jrender_t *r, const jnode_t *at, jval_t v, const char *indent, size_t indent_len,
              int use_indent, const char *item_sep, const char *key_sep, int sort_keys,
              jstr_t **out);
/* Python's repr() of a float ("1.0", "1e-05", "inf"); buf of at least 32 bytes. */
void jv_float_repr(double f, char *buf, size_t cap);

/* The elements of range(start, stop, step) (step != 0), computed without overflow: slices
 * walk their indices by this count, never by adding step until past stop. */
uint64_t jinja_range_len(int64_t start, int64_t stop, int64_t step);

/* Elements of an iterable (list, tuple, dict keys, string characters; undefined: none). */
int jr_iterate(jrender_t *r, const jnode_t *at, jval_t v, jlist_t **out);
/* obj.name as Jinja resolves it (attribute first, then item) and obj[key] (item first). */
int jr_getattr(jrender_t *r, const jnode_t *at, jval_t obj, const char *name, jval_t *out);
int jr_getitem(jrender_t *r, const jnode_t *at, jval_t obj, jval_t key, jval_t *out);
/* Calls a callable value. */
int jr_call(jrender_t *r, const jnode_t *at, jval_t fn, const jargs_t *args, jval_t *out);
/* Applies the filter or test of that name (for map, select and friends). */
int jr_apply_named(jrender_t *r, const jnode_t *at, int test, const char *name, jval_t v,
                   const jargs_t *args, jval_t *out);
/* strftime_now's clock: RIVER_NOW (YYYY-MM-DDTHH:MM:SS) or the local time. */
int jr_now(jrender_t *r, const jnode_t *at, struct tm *tm);

/* Binds args to params (names, NULL-terminated) in order; unset ones JV_ABSENT. Too many
 * positional or unknown keyword arguments are errors naming what. */
int jr_bind(jrender_t *r, const jnode_t *at, const char *what, const jargs_t *args,
            const char *const *params, jval_t *out);

/* ---- Code points ---- */

/* Length in code points (invalid bytes count one each). */
size_t ju_len(const char *s, size_t n);
/* Byte offset of code point index cp (clamped to n). */
size_t ju_offset(const char *s, size_t n, size_t cp);
/* Decodes one code point at s (n > 0 bytes); *adv its byte length. Invalid: the byte. */
int32_t ju_decode(const char *s, size_t n, size_t *adv);
/* Encodes cp as UTF-8 into buf (4 bytes); returns the byte count. */
size_t ju_encode(int32_t cp, char *buf);
/* Python's str.isspace() for one code point. */
int ju_isspace(int32_t cp);

#endif
