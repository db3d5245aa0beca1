/* Byte ranges of a text, in order and disjoint: the chat template marks the bytes that are
 * its own text (text/chat_template.h), and the tokenizer matches special tokens only there
 * (tokenizer_encode_spans), so that text from a request never becomes a control token. */
#ifndef RIVER_TEXT_SPAN_H
#define RIVER_TEXT_SPAN_H

#include <stddef.h>

typedef struct text_span {
    size_t off, len; /* bytes [off, off + len) */
} text_span_t;

#endif
