/* Tool calls in a model's generated text: which format a chat template renders calls in,
 * and parsers that split a completion into content and calls, whole (a non-streamed
 * response) or piece by piece (a stream), with the same result either way.
 *
 * A model calls tools in the format its chat template renders an assistant message's
 * tool_calls in, since that is what it was trained on:
 *   TOOLCALL_LLAMA3_JSON   {"name": "f", "parameters": {...}}, the whole reply (optionally
 *                          after <|python_tag|>, which may also follow content); several
 *                          calls separated by ';' or whitespace (Llama 3.1 / 3.2)
 *   TOOLCALL_HERMES        <tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>,
 *                          any number, after content (Hermes 2 Pro, Qwen 2.5, Qwen3)
 *   TOOLCALL_MISTRAL       [TOOL_CALLS][{"name": "f", "arguments": {...}, "id": "..."}, ...]
 *                          (Mistral Nemo; a single object without the list is accepted)
 *   TOOLCALL_FUNCTIONARY   <function=f>{...}</function>, any number, after content; and
 *                          <|python_tag|>CODE to the end, the call "python" with arguments
 *                          {"code": CODE} (functionary v3.1)
 *   TOOLCALL_COMMAND_R     Action: ```json [{"tool_name": "f", "parameters": {...}}, ...]```
 *                          (Command R+)
 * Every JSON object format takes "name" or "tool_name" for the name and "arguments" or
 * "parameters" for the arguments, in that order (the templates' order: the name must come
 * first so that a stream can announce the call before its arguments arrive); a leading
 * "type": "function" member is skipped, members after the arguments (Mistral's "id") are
 * read and ignored, and {"name": "f"} alone is a call with arguments {}.
 *
 * What is content and what is a call:
 * - A call is committed (its TOOLCALL_EV_CALL_START goes out) as soon as its name has been
 *   read (for functionary once "<function=NAME>" is complete): the name must be 1 to
 *   TOOLCALL_NAME_MAX bytes of letters, digits and "_-.:/@", without escapes, and one of
 *   tool_names when a list is given. Text that opens like a call but breaks off before
 *   that point (bad JSON, an unknown name, another key) stays content, byte for byte.
 * - Whitespace next to a call (between content and a call, between calls, after the last
 *   one) is not content, nor is a ';' right after a Llama call; everything else outside
 *   calls is content, unchanged. A text without calls is all content, exactly as
 *   generated.
 * - Arguments are the call's JSON value made compact: whitespace outside strings removed,
 *   strings re-escaped as jansson's json_dumps does (only '"', '\\' and control characters
 *   escaped, as \b \f \n \r \t or \u00XX; \uXXXX escapes and surrogate pairs decoded to
 *   UTF-8, \u0000 kept as an escape), key order, duplicate keys and numbers exactly as
 *   generated (no loss on large integers). Invalid UTF-8 or a lone surrogate in a string,
 *   or nesting deeper than TOOLCALL_MAX_DEPTH, is a JSON error.
 * - A JSON error inside committed arguments ends the call there, flagged incomplete, with
 *   the arguments as far as they were valid; the text from the offending byte on is
 *   content again (where further calls may start). The end of the text inside arguments
 *   ends it the same way (a completion cut by max_tokens). Between the name and the
 *   arguments, anything but the format's syntax (another key) or the end of the text ends
 *   the call incomplete with empty arguments, the syntax read after the name being
 *   content again. Trailing syntax after complete arguments (the object's closing brace,
 *   "</tool_call>") cut by the end of the text is dropped; broken by other text, what was
 *   read of it is content again.
 * - Ids: "call_" and 24 random letters and digits; Mistral's are 9 letters and digits, the
 *   only ids its template accepts in the conversation's next turn. An "id" the model
 *   writes is ignored (it comes after the arguments, too late for a stream's first event).
 *
 * Streaming emits content as soon as it is certainly content: it holds back only a
 * possible marker prefix ("<tool_c"), trailing whitespace (which a following call would
 * drop), and an opened call until it commits. Arguments are not buffered: each piece's
 * compact arguments text goes out as it arrives (less at most an unfinished UTF-8
 * sequence or escape), so concatenating a call's TOOLCALL_EV_ARGS texts gives exactly
 * toolcall_parse's arguments. The work per byte is constant (amortized): nothing is
 * rescanned. toolcall_parse is the stream run over the whole text, so the two agree for
 * every split of the text. */
#ifndef RIVER_GATEWAY_TOOLCALL_H
#define RIVER_GATEWAY_TOOLCALL_H

#include <stddef.h>

typedef enum toolcall_format {
    TOOLCALL_NONE = 0, /* no tool calls: everything is content */
    TOOLCALL_LLAMA3_JSON,
    TOOLCALL_HERMES,
    TOOLCALL_MISTRAL,
    TOOLCALL_FUNCTIONARY,
    TOOLCALL_COMMAND_R,
} toolcall_format_t;
#define TOOLCALL_N_FORMATS 6

#define TOOLCALL_NAME_MAX 128   /* bytes of a tool name */
#define TOOLCALL_MAX_DEPTH 1024 /* nesting of arguments (jansson's parser allows 2048) */

/* Which format a chat template's source renders tool calls in, by the markers it
 * contains; TOOLCALL_NONE when it has no tool support or renders calls in a format not
 * listed above (DeepSeek's). */
toolcall_format_t toolcall_format_detect(const char *template_src, size_t len);
/* "none", "llama3_json", "hermes", "mistral", "functionary", "command_r"; "?" otherwise. */
const char *toolcall_format_name(toolcall_format_t f);
/* The format of a name toolcall_format_name gives; RIVER_EINVAL (naming it) otherwise. */
int toolcall_format_from_name(const char *name, toolcall_format_t *out);
/* Whether name (NUL-terminated) can be a called tool's name: 1 to TOOLCALL_NAME_MAX bytes
 * of [A-Za-z0-9_.:/@-]. Tools named otherwise are never recognized in the output. */
int toolcall_name_valid(const char *name);

/* ---- Whole text ---- */

typedef struct toolcall_call {
    char *id;
    char *name;
    char *arguments;      /* compact JSON text, NUL-terminated */
    size_t arguments_len;
    int incomplete;       /* the arguments broke off (see above) */
} toolcall_call_t;

typedef struct toolcall_result {
    char *content;        /* NUL-terminated; may hold NULs of the text, see content_len */
    size_t content_len;
    toolcall_call_t *calls;
    size_t n_calls;
} toolcall_result_t;

/* Splits text into content and calls. tool_names (n_names of them, NULL/0: any valid
 * name) are the request's tools: a call of any other name stays content. *out is filled
 * on success (free with toolcall_result_free) and zeroed on failure (RIVER_ENOMEM,
 * RIVER_EINVAL for a format out of range or NULL pointers). */
int toolcall_parse(toolcall_format_t f, const char *text, size_t len,
                   const char *const *tool_names, size_t n_names, toolcall_result_t *out);
void toolcall_result_free(toolcall_result_t *r);

/* ---- Streaming ---- */

typedef struct toolcall_stream toolcall_stream_t;

typedef enum toolcall_event_kind {
    TOOLCALL_EV_CONTENT,    /* text, len: content */
    TOOLCALL_EV_CALL_START, /* index (0, 1, ... in order), id, name */
    TOOLCALL_EV_ARGS,       /* index, text, len: the next piece of the call's arguments */
    TOOLCALL_EV_CALL_END,   /* index, incomplete: the call's arguments are whole or cut */
} toolcall_event_kind_t;

typedef struct toolcall_event {
    toolcall_event_kind_t kind;
    int index;        /* the call's, from 0 in order; -1 for content */
    const char *id;   /* CALL_START */
    const char *name; /* CALL_START */
    const char *text; /* CONTENT, ARGS; not NUL-terminated */
    size_t len;
    int incomplete;   /* CALL_END */
} toolcall_event_t;

/* A stream of one completion. tool_names are copied. */
int toolcall_stream_new(toolcall_stream_t **out, toolcall_format_t f,
                        const char *const *tool_names, size_t n_names);
void toolcall_stream_destroy(toolcall_stream_t **s);
/* Feeds the next piece of generated text; *events (*n_events of them, in order) is what it
 * makes certain, owned by the stream and valid until its next call. Consecutive content is
 * one event; an ARGS event comes after its call's START, and every started call gets one
 * END (at the latest from toolcall_stream_finish). RIVER_ESTATE after finish. */
int toolcall_stream_push(toolcall_stream_t *s, const char *text, size_t len,
                         toolcall_event_t **events, size_t *n_events);
/* The end of the generation: held-back content goes out, an opened call that never
 * committed is content, a call whose arguments are unfinished ends incomplete, a
 * functionary python call ends complete. No push after it. */
int toolcall_stream_finish(toolcall_stream_t *s, toolcall_event_t **events, size_t *n_events);

/* ---- Rendering ---- */

/* How format f renders one call of name with arguments args_json (any JSON text; written
 * compact, as the parser returns it): toolcall_call_open(f), the call's body, then
 * toolcall_call_close(f). The templates' own layout otherwise (Llama's "parameters",
 * Command R's indentation); Mistral's without an id. Parsing it back gives name and the
 * compact arguments. *out malloc'd. RIVER_EINVAL for TOOLCALL_NONE, an invalid name or
 * arguments that are not one JSON value. */
int toolcall_render(toolcall_format_t f, const char *name, const char *args_json, char **out);
/* What begins and ends a rendered call: "<tool_call>\n" and "\n</tool_call>" for Hermes,
 * "[TOOL_CALLS][" and "]" for Mistral, "<function=" and "</function>" for functionary,
 * "Action:\n```json\n[\n" and "\n]```" for Command R, "" and "" for Llama (whose call is
 * a bare JSON object) and TOOLCALL_NONE. */
const char *toolcall_call_open(toolcall_format_t f);
const char *toolcall_call_close(toolcall_format_t f);

#endif
