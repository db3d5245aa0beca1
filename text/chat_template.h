/* Chat templates: the Jinja2 subset that Hugging Face chat templates use, rendered byte for
 * byte as transformers' apply_chat_template renders them (trim_blocks, lstrip_blocks,
 * loop controls, tojson as Python's json.dumps, raise_exception, strftime_now, namespace).
 *
 * A template is compiled once and rendered many times; a compiled template is read-only
 * while rendering, so several threads may render it at once. */
#ifndef RIVER_TEXT_CHAT_TEMPLATE_H
#define RIVER_TEXT_CHAT_TEMPLATE_H

#include <stddef.h>

#include <jansson.h>

#include "text/span.h"

typedef struct chat_template chat_template_t;
/* Compiles template source once. name appears in error messages ("<name>:LINE: ..."). */
int chat_template_new(chat_template_t **out, const char *name, const char *source);
/* From a model directory's tokenizer_config.json: chat_template as a string or as the list
 * of {"name","template"} (which: NULL picks "default", else the named one); also reads
 * bos_token / eos_token (string or {"content": ...} object). RIVER_ENOTFOUND when the
 * model has no chat template. */
/* (As transformers, a chat_template.jinja in model_dir replaces the default template and
 * additional_chat_templates/NAME.jinja the named ones.) */
int chat_template_load_dir(chat_template_t **out, const char *model_dir, const char *which);
/* Renders with a context object (messages, tools, add_generation_prompt, bos_token,
 * eos_token, any extra keyword args). Keys missing from context: bos_token/eos_token from
 * the file when loaded by load_dir. *out is malloc'd, NUL-terminated, caller frees.
 * raise_exception and runtime errors: negative river_err, river_err_set() detail naming the
 * template and line. */
int chat_template_render(const chat_template_t *t, const json_t *context, char **out, size_t *out_len);
/* As chat_template_render, and where the rendering's bytes came from: *special (malloc'd,
 * *n_special ranges in order) covers the bytes that are the template's own text or the
 * bos_token / eos_token values, the only bytes that may be tokenized as special tokens
 * (tokenizer_encode_spans); every other byte came from the context (messages, tools,
 * keyword arguments) and is text whatever it spells. max_memory bounds the bytes of values
 * the rendering allocates (0: the engine's bound, 256 MiB); over it is RIVER_EFULL. On
 * failure *out and *special are NULL. */
int chat_template_render_spans(const chat_template_t *t, const json_t *context,
                               size_t max_memory, char **out, size_t *out_len,
                               text_span_t **special, size_t *n_special);
const char *chat_template_bos(const chat_template_t *t); /* "" when none */
/* The template's text as compiled (line ends normalized), to tell what it renders. */
const char *chat_template_source(const chat_template_t *t);
const char *chat_template_eos(const chat_template_t *t);
void chat_template_destroy(chat_template_t **t);

#endif
