/* Internals of the tool-call parsers (gateway/toolcall.h), shared by their files and by
 * nothing else: gateway/toolcall.c (the stream: events, content and opening markers, the
 * public stream and whole-text calls), gateway/toolcall_syntax.c (a call's syntax from its
 * header to its trailing close), gateway/toolcall_json.c (the JSON scanner the arguments
 * go through) and gateway/toolcall_format.c (names, detection, rendering).
 *
 * One stream is one byte-at-a-time machine in one of five modes: content (looking for a
 * format's opening marker), a call's header (held back until the name commits the call,
 * then the syntax up to the arguments), the arguments (a JSON value written out compact as
 * it arrives), the call's trailing syntax, and functionary's python code. */
#ifndef RIVER_GATEWAY_TOOLCALL_INT_H
#define RIVER_GATEWAY_TOOLCALL_INT_H

#include <stddef.h>
#include <stdint.h>

#include "gateway/toolcall.h"

/* ---- The JSON scanner (gateway/toolcall_json.c) ----
 *
 * One byte at a time, no recursion and no rescanning, it checks one JSON value and, when
 * given a sink, writes the value's compact form as it goes (toolcall.h says what compact
 * means), so that a streamed call's arguments leave as they arrive and still equal the
 * whole text's. */

/* Where compact output goes; NULL checks without writing. */
typedef void (*tc_sink_fn)(void *ctx, const char *p, size_t n);

enum {
    TC_J_MORE = 0,   /* the byte belongs to the value, which goes on */
    TC_J_DONE,       /* the byte closed the value */
    TC_J_DONE_AGAIN, /* the value (a number) ended before the byte, which is not its own */
    TC_J_ERR,        /* the byte cannot continue a JSON value */
};

typedef struct tc_json {
    tc_sink_fn sink;
    void *ctx;
    int st, num, key;
    size_t depth;
    uint8_t stack[TOOLCALL_MAX_DEPTH]; /* '{' or '[' per open container */
    const char *lit;                   /* true / false / null being matched */
    int lit_pos;
    uint32_t u, hi;                    /* a \uXXXX escape; a high surrogate waiting */
    int un;
    int need;                          /* continuation bytes a UTF-8 sequence still needs */
    uint8_t lo, up;                    /* the range of the next one */
    uint8_t ub[4];
    int ubn;
} tc_json_t;

/* Ready for a new value (leading whitespace allowed). */
void tc_json_reset(tc_json_t *j, tc_sink_fn sink, void *ctx);
int tc_json_byte(tc_json_t *j, uint8_t c);
/* Whether the end of the text may end the value here: a top-level number in a state where
 * it is whole ("12", not "12."), or a value already done. */
int tc_json_can_end(const tc_json_t *j);
/* text as one compact JSON value (only whitespace around it); *out malloc'd. RIVER_EINVAL
 * when it is not one valid value, RIVER_ENOMEM. */
int tc_json_compact(const char *text, size_t len, char **out, size_t *out_len);

/* ---- The stream ---- */

typedef struct tc_buf {
    char *p;
    size_t n, cap;
} tc_buf_t;

/* One event of the current push, over the stream's byte store (whose address may move
 * while the push runs, so pointers are made at its end). */
typedef struct tc_rec {
    toolcall_event_kind_t kind;
    int index, incomplete;
    size_t off, len, id_off, name_off;
} tc_rec_t;

enum { M_TEXT, M_HEAD, M_ARGS, M_TAIL, M_CODE };

/* Header states: before the name commits the call, and (call_open) after it. */
enum {
    H_OBJ_OPEN,   /* whitespace, then '{' */
    H_LIST_OPEN,  /* whitespace, then '[' (or Mistral's single '{') */
    H_LIST_FIRST, /* whitespace, then '{' or an empty list's ']' */
    H_FENCE,      /* Command R: whitespace, then "```json" */
    H_KEY,        /* whitespace, then a key of the slot below */
    H_KEY_STR,
    H_COLON,
    H_TYPE_VAL,   /* "type": "function" */
    H_TYPE_STR,
    H_TYPE_SEP,
    H_NAME_VAL,
    H_NAME_STR,
    H_FN_NAME,    /* functionary: the name up to '>' */
    H_AFTER_NAME, /* committed: ',' then the arguments' key, or '}' (no arguments) */
};

/* Which keys a header accepts where it is. */
enum { SLOT_FIRST, SLOT_NAME, SLOT_ARGS };
enum { KEY_TYPE, KEY_NAME, KEY_ARGS };

/* Trailing-syntax states, after a call's arguments. */
enum {
    T_OBJ_SEP,    /* ',' and another member, or the object's '}' */
    T_OBJ_KEY,
    T_OBJ_KEYSTR,
    T_OBJ_COLON,
    T_OBJ_VAL,
    T_LIT,        /* a closing literal ("</tool_call>"), whitespace before it */
    T_LIST_NEXT,  /* ',' and the next call, or the list's ']' */
};

struct toolcall_stream {
    toolcall_format_t fmt;
    char **names;         /* the request's tools (NULL: any valid name), and their lengths */
    size_t *name_lens, n_names;
    int python_ok;        /* functionary: "python" may be called */
    uint64_t rng;
    int finished, oom;
    int n_calls;          /* calls started; the open one is n_calls - 1 */
    int call_open;

    tc_buf_t out;         /* this push's event bytes */
    tc_rec_t *recs;
    size_t n_recs, cap_recs;
    toolcall_event_t *evs;
    size_t cap_evs;

    int mode, st;
    tc_buf_t ws;          /* content's trailing whitespace: dropped if a call follows */
    tc_buf_t held;        /* an opening marker and header, or a call's trailing syntax */
    int skip_ws;          /* just after a call: whitespace is not content */
    int at_start;         /* only whitespace so far: a Llama call may open with '{' */
    int llama_after;      /* after a Llama call: '{' opens another, ';' separates */
    int in_list;          /* Mistral, Command R: the calls are a JSON list */
    int slot, key;
    tc_buf_t tok;         /* a key, the type or the name being read */
    const char *lit;      /* the literal being matched, and where */
    size_t lit_pos;
    tc_json_t args;       /* the open call's arguments, written out */
    tc_json_t skip;       /* members after the arguments, checked only */
    uint8_t cu[4];        /* functionary code: an unfinished UTF-8 sequence */
    int cun, cneed;
    uint8_t clo, cup;
};


/* ---- gateway/toolcall.c ---- */

/* Appends to a buffer; out of memory sets s->oom, which the push reports. */
void tc_put(toolcall_stream_t *s, tc_buf_t *b, const void *p, size_t n);
void tc_putc(toolcall_stream_t *s, tc_buf_t *b, uint8_t c);
/* A new event record of the current push (NULL out of memory). */
tc_rec_t *tc_rec(toolcall_stream_t *s, toolcall_event_kind_t kind);
/* Text for an event of kind, appended to the last event when it is one of the same kind. */
void tc_emit(toolcall_stream_t *s, toolcall_event_kind_t kind, const char *p, size_t n);
int tc_ws(uint8_t c);
/* Content bytes, whitespace held or dropped next to calls. */
void tc_content(toolcall_stream_t *s, uint8_t c);
void tc_content_buf(toolcall_stream_t *s, const char *p, size_t n);
/* One byte in content mode. */
void tc_text(toolcall_stream_t *s, uint8_t c);

/* ---- gateway/toolcall_syntax.c ---- */

/* Marker k of the format (tc__markers in toolcall.c) is whole. */
void tc_open_marker(toolcall_stream_t *s, int k);
/* One byte in each mode past content. */
void tc_head(toolcall_stream_t *s, uint8_t c);
void tc_tail(toolcall_stream_t *s, uint8_t c);
void tc_args_byte(toolcall_stream_t *s, uint8_t c);
void tc_code_byte(toolcall_stream_t *s, uint8_t c);
void tc_end_call(toolcall_stream_t *s, int incomplete);

/* ---- gateway/toolcall_format.c ---- */

/* A byte a tool name may hold. */
int tc_name_char(uint8_t c);

#endif
