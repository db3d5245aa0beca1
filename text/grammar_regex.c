/* A JSON Schema "pattern" (ECMA-262 syntax, the subset below) → a GBNF expression over the raw
 * text between a JSON string's quotes. A character the pattern matches is written the way a
 * JSON encoder writes it: `"` as \", `\` as \\, control characters as \n \t \r \b \f or
 * \u00XX, everything else as itself.
 *
 * Supported: literals; escapes \d \w \s \D \W \S (ASCII classes, as PCRE2 without UCP), \n
 * \r \t \f \v \0 \xNN \uNNNN and escaped punctuation; classes [...] and [^...] with ranges;
 * `.` (any character but \n \r U+2028 U+2029); groups (...) and (?:...); alternation;
 * quantifiers * + ? {m} {m,} {m,n} (a lazy `?` after them changes nothing for a grammar);
 * ^ at the start and $ at the end of a top-level alternative. A side without its anchor may
 * hold any characters, as a regex search would allow. Anything else (backreferences, \b,
 * lookaround, anchors inside) is an error naming the pattern's path and offset. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "text/grammar.h"
#include "text/grammar_internal.h"
#include "text/hex.h"
#include "text/utf8.h"

typedef struct rx {
    const char *s;
    size_t len, pos;
    const char *path;
    const char *any_char; /* GBNF expression of one JSON string character */
    grammar__buf_t *out;
    int depth;
} rx_t;

static int rx_fail(const rx_t *r, const char *what)
{
    return river_err_set(RIVER_EUNSUPPORTED, "%s: pattern at offset %zu: %s", r->path, r->pos,
                         what);
}

/* Ranges: a growable list of lo, hi pairs. */
typedef struct rset {
    uint32_t *r, n, cap;
} rset_t;

static int rset_add(rset_t *s, uint32_t lo, uint32_t hi)
{
    if (s->n == s->cap) {
        uint32_t cap = s->cap ? s->cap * 2 : 8;
        uint32_t *v = realloc(s->r, (2 * (size_t)cap + 2) * sizeof *v);
        if (!v)
            return RIVER_ENOMEM;
        s->r = v;
        s->cap = cap;
    }
    s->r[2 * s->n] = lo;
    s->r[2 * s->n + 1] = hi;
    s->n++;
    return 0;
}

/* The ASCII classes \d \w \s (and their negations when upper). */
static int rset_add_escape_class(rset_t *s, char e)
{
    rset_t t = {0};
    int err = 0;
    char lower = (char)(e | 0x20);
    if (lower == 'd') {
        err = rset_add(&t, '0', '9');
    } else if (lower == 'w') {
        err = rset_add(&t, '0', '9') || rset_add(&t, 'A', 'Z') || rset_add(&t, '_', '_') ||
              rset_add(&t, 'a', 'z');
    } else {
        err = rset_add(&t, '\t', '\r') || rset_add(&t, ' ', ' ');
    }
    if (!err && !t.r)
        err = rset_add(&t, 1, 0);
    if (!err)
        err = grammar__ranges_normalize(&t.r, &t.n);
    if (!err && e != lower)
        err = grammar__ranges_negate(&t.r, &t.n);
    for (uint32_t i = 0; !err && i < t.n; i++)
        err = rset_add(s, t.r[2 * i], t.r[2 * i + 1]);
    free(t.r);
    return err ? RIVER_ENOMEM : 0;
}

static void emit_cp(grammar__buf_t *b, uint32_t cp)
{
    if (cp <= 0xFFFF)
        grammar__buf_printf(b, "\\u%04X", (unsigned)cp);
    else
        grammar__buf_printf(b, "\\U%08X", (unsigned)cp);
}

/* The JSON text of one character as a GBNF literal. */
static void emit_json_char(grammar__buf_t *b, uint32_t cp)
{
    static const char *short_esc[32] = {[8] = "b", [9] = "t", [10] = "n", [12] = "f",
                                        [13] = "r"};
    if (cp == '"') {
        grammar__buf_puts(b, "\"\\\\\\\"\"");
    } else if (cp == '\\') {
        grammar__buf_puts(b, "\"\\\\\\\\\"");
    } else if (cp < 0x20) {
        if (short_esc[cp])
            grammar__buf_printf(b, "\"\\\\%s\"", short_esc[cp]);
        else
            grammar__buf_printf(b, "\"\\\\u00%02x\"", (unsigned)cp);
    } else {
        grammar__buf_puts(b, "\"");
        emit_cp(b, cp);
        grammar__buf_puts(b, "\"");
    }
}

/* A set of characters as a GBNF expression of their JSON text. */
static int emit_set(rx_t *r, rset_t *s)
{
    if (!s->r && rset_add(s, 1, 0))
        return RIVER_ENOMEM;
    if (grammar__ranges_normalize(&s->r, &s->n))
        return RIVER_ENOMEM;
    grammar__buf_t *b = r->out;
    int n_alt = 0;
    /* Characters written as themselves: the set minus ", \ and the controls. */
    grammar__buf_t cls = {0};
    for (uint32_t i = 0; i < s->n; i++) {
        uint32_t lo = s->r[2 * i], hi = s->r[2 * i + 1];
        uint32_t cuts[3][2] = {{0x20, 0x21}, {0x23, 0x5B}, {0x5D, 0x10FFFF}};
        for (int k = 0; k < 3; k++) {
            uint32_t a = lo > cuts[k][0] ? lo : cuts[k][0];
            uint32_t z = hi < cuts[k][1] ? hi : cuts[k][1];
            if (a > z)
                continue;
            emit_cp(&cls, a);
            if (z > a) {
                grammar__buf_puts(&cls, "-");
                emit_cp(&cls, z);
            }
        }
    }
    grammar__buf_puts(b, "(");
    if (cls.len) {
        grammar__buf_puts(b, "[");
        grammar__buf_put(b, cls.p, cls.len);
        grammar__buf_puts(b, "]");
        n_alt++;
    }
    int oom = cls.oom;
    grammar__buf_free(&cls);
    for (uint32_t i = 0; i < s->n; i++)
        for (uint32_t cp = s->r[2 * i]; cp <= s->r[2 * i + 1] && cp <= 0x5C; cp++) {
            if (cp >= 0x20 && cp != '"' && cp != '\\')
                continue;
            if (n_alt++)
                grammar__buf_puts(b, " | ");
            emit_json_char(b, cp);
        }
    grammar__buf_puts(b, ")");
    if (n_alt == 0)
        return rx_fail(r, "class matches no character");
    return oom ? RIVER_ENOMEM : 0;
}

/* Decodes one UTF-8 character of the pattern; -1 when invalid, the position then
 * unchanged (the error names where the character starts). */
static int32_t rx_utf8(rx_t *r)
{
    size_t at = r->pos;
    int32_t c = text_utf8_next(r->s, r->len, &at);
    if (c >= 0)
        r->pos = at;
    return c;
}

/* An escape after '\' (at r->pos): a class into s (returns 1), or one character into *cp
 * (returns 0); negative on error. in_class: inside [...], where \b is a backspace. */
static int rx_escape(rx_t *r, rset_t *s, uint32_t *cp, int in_class)
{
    if (r->pos >= r->len)
        return rx_fail(r, "pattern ends with '\\'");
    char e = r->s[r->pos++];
    switch (e) {
    case 'd': case 'D': case 'w': case 'W': case 's': case 'S':
        return rset_add_escape_class(s, e) ? RIVER_ENOMEM : 1;
    case 'n': *cp = '\n'; return 0;
    case 'r': *cp = '\r'; return 0;
    case 't': *cp = '\t'; return 0;
    case 'f': *cp = '\f'; return 0;
    case 'v': *cp = '\v'; return 0;
    case '0': *cp = 0; return 0;
    case 'b':
        if (in_class) {
            *cp = '\b';
            return 0;
        }
        r->pos--;
        return rx_fail(r, "word boundaries (\\b) are not supported");
    case 'x': case 'u': {
        int digits = e == 'x' ? 2 : 4;
        uint32_t v = 0;
        for (int i = 0; i < digits; i++) {
            int h = r->pos < r->len ? text_hex_digit((unsigned char)r->s[r->pos]) : -1;
            if (h < 0)
                return rx_fail(r, "bad hex escape");
            v = v << 4 | (uint32_t)h;
            r->pos++;
        }
        if (v >= 0xD800 && v <= 0xDFFF)
            return rx_fail(r, "surrogate escapes are not supported");
        *cp = v;
        return 0;
    }
    default:
        if ((e >= '1' && e <= '9') || e == 'k')
            return rx_fail(r, "backreferences are not supported");
        if ((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z'))
            return rx_fail(r, "unknown escape");
        r->pos--;
        {
            int32_t c = rx_utf8(r);
            if (c < 0)
                return rx_fail(r, "invalid UTF-8");
            *cp = (uint32_t)c;
        }
        return 0;
    }
}

static int rx_class(rx_t *r)
{
    r->pos++; /* [ */
    int negate = 0;
    if (r->pos < r->len && r->s[r->pos] == '^') {
        negate = 1;
        r->pos++;
    }
    rset_t s = {0};
    int err = 0;
    for (;;) {
        if (r->pos >= r->len) {
            err = rx_fail(r, "unterminated character class");
            break;
        }
        if (r->s[r->pos] == ']') {
            r->pos++;
            break;
        }
        uint32_t lo, hi;
        int k;
        if (r->s[r->pos] == '\\') {
            r->pos++;
            if ((k = rx_escape(r, &s, &lo, 1)) < 0) {
                err = k;
                break;
            }
            if (k == 1)
                continue;
        } else {
            int32_t c = rx_utf8(r);
            if (c < 0) {
                err = rx_fail(r, "invalid UTF-8");
                break;
            }
            lo = (uint32_t)c;
        }
        hi = lo;
        if (r->pos + 1 < r->len && r->s[r->pos] == '-' && r->s[r->pos + 1] != ']') {
            r->pos++;
            if (r->s[r->pos] == '\\') {
                r->pos++;
                rset_t dummy = {0};
                k = rx_escape(r, &dummy, &hi, 1);
                free(dummy.r);
                if (k < 0) {
                    err = k;
                    break;
                }
                if (k == 1) {
                    err = rx_fail(r, "a class escape cannot end a range");
                    break;
                }
            } else {
                int32_t c = rx_utf8(r);
                if (c < 0) {
                    err = rx_fail(r, "invalid UTF-8");
                    break;
                }
                hi = (uint32_t)c;
            }
            if (hi < lo) {
                err = rx_fail(r, "range out of order");
                break;
            }
        }
        if (rset_add(&s, lo, hi)) {
            err = RIVER_ENOMEM;
            break;
        }
    }
    if (!err && negate) {
        if (!s.r && rset_add(&s, 1, 0))
            err = RIVER_ENOMEM;
        if (!err && (grammar__ranges_normalize(&s.r, &s.n) || grammar__ranges_negate(&s.r, &s.n)))
            err = RIVER_ENOMEM;
    }
    if (!err)
        err = emit_set(r, &s);
    free(s.r);
    return err;
}

static int rx_alt(rx_t *r, int top);

/* A quantifier at r->pos, if any: *min, *max (GRAMMAR__INF). Returns 1 when found, 0 when
 * none, or a negative error. */
static int rx_quant(rx_t *r, uint32_t *min, uint32_t *max)
{
    if (r->pos >= r->len)
        return 0;
    char c = r->s[r->pos];
    if (c == '*' || c == '+' || c == '?') {
        *min = c == '+';
        *max = c == '?' ? 1 : GRAMMAR__INF;
        r->pos++;
    } else if (c == '{') {
        size_t p = r->pos + 1;
        uint64_t a = 0, z;
        int digits = 0;
        while (p < r->len && r->s[p] >= '0' && r->s[p] <= '9' && a <= GRAMMAR_MAX_REPEAT) {
            a = a * 10 + (uint64_t)(r->s[p++] - '0');
            digits++;
        }
        if (!digits)
            return 0; /* a literal '{' */
        z = a;
        if (p < r->len && r->s[p] == ',') {
            p++;
            z = GRAMMAR__INF;
            if (p < r->len && r->s[p] >= '0' && r->s[p] <= '9') {
                z = 0;
                while (p < r->len && r->s[p] >= '0' && r->s[p] <= '9' && z <= GRAMMAR_MAX_REPEAT)
                    z = z * 10 + (uint64_t)(r->s[p++] - '0');
            }
        }
        if (p >= r->len || r->s[p] != '}')
            return 0;
        if (a > GRAMMAR_MAX_REPEAT || (z != GRAMMAR__INF && z > GRAMMAR_MAX_REPEAT))
            return river_err_set(RIVER_ERANGE, "%s: pattern at offset %zu: repetition over %u",
                                 r->path, r->pos, (unsigned)GRAMMAR_MAX_REPEAT);
        if (z < a)
            return river_err_set(RIVER_EFORMAT, "%s: pattern at offset %zu: repetition {m,n} "
                                                "with n < m",
                                 r->path, r->pos);
        *min = (uint32_t)a;
        *max = (uint32_t)z;
        r->pos = p + 1;
    } else {
        return 0;
    }
    if (r->pos < r->len && r->s[r->pos] == '?')
        r->pos++; /* lazy: the same language */
    return 1;
}

static int rx_seq(rx_t *r, int top, int *anchored_start, int *anchored_end)
{
    grammar__buf_t *b = r->out;
    int items = 0, err;
    if (top && r->pos < r->len && r->s[r->pos] == '^') {
        *anchored_start = 1;
        r->pos++;
    }
    for (;;) {
        if (r->pos >= r->len)
            break;
        char c = r->s[r->pos];
        if (c == '|' || c == ')')
            break;
        if (c == '$') {
            if (top && (r->pos + 1 == r->len || r->s[r->pos + 1] == '|')) {
                *anchored_end = 1;
                r->pos++;
                break;
            }
            return rx_fail(r, "'$' is only supported at the end");
        }
        if (c == '^')
            return rx_fail(r, "'^' is only supported at the start");
        if (c == '*' || c == '+' || c == '?')
            return rx_fail(r, "quantifier without anything to repeat");
        grammar__buf_puts(b, items++ ? " (" : "(");
        if (c == '(') {
            if (r->depth >= GRAMMAR_MAX_NESTING)
                return river_err_set(RIVER_ERANGE, "%s: pattern groups nested deeper than %d",
                                     r->path, GRAMMAR_MAX_NESTING);
            r->pos++;
            if (r->pos < r->len && r->s[r->pos] == '?') {
                if (r->pos + 1 < r->len && r->s[r->pos + 1] == ':')
                    r->pos += 2;
                else
                    return rx_fail(r, "lookaround and named groups are not supported");
            }
            r->depth++;
            err = rx_alt(r, 0);
            r->depth--;
            if (err)
                return err;
            if (r->pos >= r->len || r->s[r->pos] != ')')
                return rx_fail(r, "missing ')'");
            r->pos++;
        } else if (c == '[') {
            if ((err = rx_class(r)))
                return err;
        } else if (c == '.') {
            r->pos++;
            rset_t s = {0};
            if (rset_add(&s, 0, 9) || rset_add(&s, 11, 12) || rset_add(&s, 14, 0x2027) ||
                rset_add(&s, 0x202A, 0x10FFFF)) {
                free(s.r);
                return RIVER_ENOMEM;
            }
            err = emit_set(r, &s);
            free(s.r);
            if (err)
                return err;
        } else {
            uint32_t cp = 0;
            rset_t s = {0};
            int k;
            if (c == '\\') {
                r->pos++;
                k = rx_escape(r, &s, &cp, 0);
            } else {
                int32_t ch = rx_utf8(r);
                k = ch < 0 ? rx_fail(r, "invalid UTF-8") : 0;
                cp = (uint32_t)ch;
            }
            if (k == 0) {
                free(s.r);
                s.r = NULL;
                s.n = s.cap = 0;
                k = rset_add(&s, cp, cp) ? RIVER_ENOMEM : 1;
            }
            if (k == 1)
                k = emit_set(r, &s);
            free(s.r);
            if (k < 0)
                return k;
        }
        grammar__buf_puts(b, ")");
        uint32_t min = 0, max = 0;
        int q = rx_quant(r, &min, &max);
        if (q < 0)
            return q;
        if (q == 1) {
            if (max == GRAMMAR__INF)
                grammar__buf_printf(b, "{%u,}", (unsigned)min);
            else
                grammar__buf_printf(b, "{%u,%u}", (unsigned)min, (unsigned)max);
            if (r->pos < r->len &&
                (r->s[r->pos] == '*' || r->s[r->pos] == '+' || r->s[r->pos] == '?'))
                return rx_fail(r, "nested quantifier");
        }
    }
    if (!items)
        grammar__buf_puts(b, "\"\"");
    return 0;
}

static int rx_alt(rx_t *r, int top)
{
    grammar__buf_t *b = r->out;
    grammar__buf_puts(b, "(");
    for (int n = 0;; n++) {
        int as = 0, ae = 0;
        if (n)
            grammar__buf_puts(b, " | ");
        if (top) {
            /* A search: an end without its anchor may hold any characters. */
            grammar__buf_puts(b, "(");
            size_t body = b->len;
            int err = rx_seq(r, 1, &as, &ae);
            if (err)
                return err;
            if (!as && !b->oom) {
                /* Put "any*" before the body, which comes first in the text. */
                size_t blen = b->len - body;
                char *tmp = malloc(blen + 1);
                if (!tmp)
                    return RIVER_ENOMEM;
                memcpy(tmp, b->p + body, blen);
                b->len = body;
                grammar__buf_puts(b, "(");
                grammar__buf_puts(b, r->any_char);
                grammar__buf_puts(b, ")* ");
                grammar__buf_put(b, tmp, blen);
                free(tmp);
            }
            if (!ae) {
                grammar__buf_puts(b, " (");
                grammar__buf_puts(b, r->any_char);
                grammar__buf_puts(b, ")*");
            }
            grammar__buf_puts(b, ")");
        } else {
            int err = rx_seq(r, 0, &as, &ae);
            if (err)
                return err;
        }
        if (r->pos < r->len && r->s[r->pos] == '|') {
            r->pos++;
            continue;
        }
        break;
    }
    grammar__buf_puts(b, ")");
    return b->oom ? RIVER_ENOMEM : 0;
}

int grammar__regex_to_gbnf(const char *re, size_t len, const char *path, const char *any_char,
                           grammar__buf_t *out)
{
    rx_t r = {.s = re, .len = len, .path = path, .any_char = any_char, .out = out};
    int err = rx_alt(&r, 1);
    if (err == RIVER_ENOMEM)
        return river_err_set(err, "%s: no memory", path);
    if (!err && r.pos < r.len)
        return rx_fail(&r, "unmatched ')'");
    return err;
}
