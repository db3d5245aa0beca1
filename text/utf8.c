/* UTF-8 decoding and encoding (text/utf8.h). */
#include "text/utf8.h"

int32_t text_utf8_next(const char *str, size_t len, size_t *pos)
{
    const unsigned char *s = (const unsigned char *)str;
    size_t i = *pos;
    unsigned c = s[i], lo, hi;
    int n = text_utf8_lead(c, &lo, &hi);
    if (n == 1) {
        *pos = i + 1;
        return (int32_t)c;
    }
    if (n == 0) {
        *pos = i + 1;
        return -1;
    }
    uint32_t cp = c & (0x7Fu >> n);
    /* A failing byte ends the invalid subpart before it. */
    for (int k = 1; k < n; k++) {
        if (i + k >= len) {
            *pos = i + k;
            return -1;
        }
        unsigned b = s[i + k];
        if (b < lo || b > hi) {
            *pos = i + k;
            return -1;
        }
        lo = 0x80;
        hi = 0xBF;
        cp = (cp << 6) | (b & 0x3F);
    }
    *pos = i + n;
    return (int32_t)cp;
}

int text_utf8_valid(const char *s, size_t len)
{
    size_t i = 0;
    while (i < len) {
        if ((unsigned char)s[i] < 0x80) {
            i++;
            continue;
        }
        if (text_utf8_next(s, len, &i) < 0)
            return 0;
    }
    return 1;
}

size_t text_utf8_encode(uint32_t cp, char out[4])
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}
