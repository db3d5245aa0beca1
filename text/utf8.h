/* UTF-8, strictly: no overlong forms, no surrogates, nothing past U+10FFFF. One decoder for
 * every text format here (tokenizers, grammar text, regular expressions, the tool-call
 * JSON scanner), so that they agree on which bytes are a character. */
#ifndef RIVER_TEXT_UTF8_H
#define RIVER_TEXT_UTF8_H

#include <stddef.h>
#include <stdint.h>

/* The bytes of the sequence lead byte c starts (1 to 4), or 0 when c cannot start one; for
 * a multi-byte sequence, *lo..*hi is the range its second byte must lie in (the rest are
 * 0x80..0xBF). The narrower ranges after E0, ED, F0 and F4 are what exclude overlong
 * forms, surrogates and code points past U+10FFFF, so a decoder fed one byte at a time
 * needs no check at the end. */
static inline int text_utf8_lead(unsigned c, unsigned *lo, unsigned *hi)
{
    *lo = 0x80;
    *hi = 0xBF;
    if (c < 0x80)
        return 1;
    if (c >= 0xC2 && c <= 0xDF)
        return 2;
    if (c >= 0xE0 && c <= 0xEF) {
        if (c == 0xE0)
            *lo = 0xA0;
        else if (c == 0xED)
            *hi = 0x9F;
        return 3;
    }
    if (c >= 0xF0 && c <= 0xF4) {
        if (c == 0xF0)
            *lo = 0x90;
        else if (c == 0xF4)
            *hi = 0x8F;
        return 4;
    }
    return 0;
}

/* Decodes the character at s[*pos] (len bytes in all): returns its code point and advances
 * *pos, or returns -1 and advances by the length of the maximal invalid subpart (Unicode's
 * "substitution of maximal subparts", as Rust's from_utf8_lossy). *pos < len. */
int32_t text_utf8_next(const char *s, size_t len, size_t *pos);
/* 1 when all len bytes are UTF-8. */
int text_utf8_valid(const char *s, size_t len);
/* Writes cp (at most U+10FFFF) as 1 to 4 bytes; returns how many. */
size_t text_utf8_encode(uint32_t cp, char out[4]);

#endif
