/* Hexadecimal digits, for the escapes every text format here has: grammar text and
 * regular expressions (\xNN), Jinja string literals, byte tokens (<0xNN>). */
#ifndef RIVER_TEXT_HEX_H
#define RIVER_TEXT_HEX_H

/* The value of c as a hexadecimal digit, or -1 when it is none. */
static inline int text_hex_digit(int c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

#endif
