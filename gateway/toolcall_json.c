/* The tool-call parsers' JSON scanner: a state machine over one byte at a time that checks
 * a JSON value (RFC 8259, with strict UTF-8) and writes its compact form to a sink. It
 * keeps no text and never looks back, so a stream of any length costs time linear in its
 * bytes, and the container stack is a fixed array, so hostile nesting is an error at
 * TOOLCALL_MAX_DEPTH instead of a deep recursion or an allocation. */
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "gateway/toolcall_int.h"
#include "text/hex.h"
#include "text/utf8.h"

enum {
    J_VALUE,     /* a value is expected (whitespace first) */
    J_ARR_FIRST, /* after '[': a value or ']' */
    J_OBJ_FIRST, /* after '{': a key or '}' */
    J_OBJ_KEY,   /* after ',' in an object: a key */
    J_COLON,     /* after a key */
    J_AFTER,     /* after a value inside a container: ',' or its close */
    J_STR,       /* inside a string */
    J_STR_UTF,   /* inside a multi-byte UTF-8 sequence */
    J_STR_ESC,   /* after '\' */
    J_STR_U,     /* inside \uXXXX */
    J_STR_LOW_BS, /* after a high surrogate: '\' of its low half */
    J_STR_LOW_U, /* ... and its 'u' */
    J_NUM,
    J_LIT,
    J_DONE,
};

/* Where a number is: after '-', after a leading 0, in the integer digits, after '.', in
 * the fraction, after 'e', after the exponent's sign, in the exponent. */
enum { N_MINUS, N_ZERO, N_INT, N_DOT, N_FRAC, N_E, N_ESIGN, N_EXP };

static int tc__ws(uint8_t c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

static int tc__digit(uint8_t c)
{
    return c >= '0' && c <= '9';
}

static void tc__out(tc_json_t *j, const char *p, size_t n)
{
    if (j->sink)
        j->sink(j->ctx, p, n);
}

void tc_json_reset(tc_json_t *j, tc_sink_fn sink, void *ctx)
{
    j->sink = sink;
    j->ctx = ctx;
    j->st = J_VALUE;
    j->num = 0;
    j->key = 0;
    j->depth = 0;
    j->lit = NULL;
    j->lit_pos = 0;
    j->u = j->hi = 0;
    j->un = 0;
    j->need = 0;
    j->ubn = 0;
}

/* A code point from an escape, written as jansson's json_dumps writes it: '"', '\' and
 * control characters escaped, everything else as UTF-8. */
static void tc__out_cp(tc_json_t *j, uint32_t cp)
{
    char b[8];
    size_t n = 0;
    if (cp == '"' || cp == '\\') {
        b[n++] = '\\';
        b[n++] = (char)cp;
    } else if (cp < 0x20) {
        static const char short_esc[] = "\b\f\n\r\t";
        static const char short_name[] = "bfnrt";
        const char *e = cp ? memchr(short_esc, (int)cp, 5) : NULL;
        b[n++] = '\\';
        if (e) {
            b[n++] = short_name[e - short_esc];
        } else {
            static const char hex[] = "0123456789ABCDEF";
            b[n++] = 'u';
            b[n++] = '0';
            b[n++] = '0';
            b[n++] = hex[cp >> 4];
            b[n++] = hex[cp & 15];
        }
    } else {
        n += text_utf8_encode(cp, b + n);
    }
    tc__out(j, b, n);
}

/* A value is whole: the scanner goes back to its container, or is done. */
static int tc__end_value(tc_json_t *j)
{
    if (j->depth == 0) {
        j->st = J_DONE;
        return TC_J_DONE;
    }
    j->st = j->key ? J_COLON : J_AFTER;
    j->key = 0;
    return TC_J_MORE;
}

static int tc__close(tc_json_t *j, uint8_t c)
{
    j->depth--;
    tc__out(j, (const char *)&c, 1);
    return tc__end_value(j);
}

static int tc__start_string(tc_json_t *j, int key)
{
    j->key = key;
    j->st = J_STR;
    tc__out(j, "\"", 1);
    return TC_J_MORE;
}

static int tc__start_value(tc_json_t *j, uint8_t c)
{
    switch (c) {
    case '{':
    case '[':
        if (j->depth >= TOOLCALL_MAX_DEPTH)
            return TC_J_ERR;
        j->stack[j->depth++] = c;
        j->st = c == '{' ? J_OBJ_FIRST : J_ARR_FIRST;
        break;
    case '"':
        return tc__start_string(j, 0);
    case 't':
        j->lit = "true";
        j->st = J_LIT;
        j->lit_pos = 1;
        break;
    case 'f':
        j->lit = "false";
        j->st = J_LIT;
        j->lit_pos = 1;
        break;
    case 'n':
        j->lit = "null";
        j->st = J_LIT;
        j->lit_pos = 1;
        break;
    case '-':
        j->st = J_NUM;
        j->num = N_MINUS;
        break;
    default:
        if (!tc__digit(c))
            return TC_J_ERR;
        j->st = J_NUM;
        j->num = c == '0' ? N_ZERO : N_INT;
        break;
    }
    tc__out(j, (const char *)&c, 1);
    return TC_J_MORE;
}

static int tc__num_whole(int num)
{
    return num == N_ZERO || num == N_INT || num == N_FRAC || num == N_EXP;
}

static int tc__number(tc_json_t *j, uint8_t c)
{
    int next = -1, e = c == 'e' || c == 'E';
    switch (j->num) {
    case N_MINUS:
        if (tc__digit(c))
            next = c == '0' ? N_ZERO : N_INT;
        break;
    case N_ZERO:
        next = c == '.' ? N_DOT : e ? N_E : -1;
        break;
    case N_INT:
        next = tc__digit(c) ? N_INT : c == '.' ? N_DOT : e ? N_E : -1;
        break;
    case N_DOT:
    case N_FRAC:
        next = tc__digit(c) ? N_FRAC : (e && j->num == N_FRAC) ? N_E : -1;
        break;
    case N_E:
        next = (c == '+' || c == '-') ? N_ESIGN : tc__digit(c) ? N_EXP : -1;
        break;
    default: /* N_ESIGN, N_EXP */
        next = tc__digit(c) ? N_EXP : -1;
        break;
    }
    if (next >= 0) {
        j->num = next;
        tc__out(j, (const char *)&c, 1);
        return TC_J_MORE;
    }
    if (!tc__num_whole(j->num))
        return TC_J_ERR;
    /* The byte after a number is not the number's: the container (or the caller, at the
     * top level) takes it. */
    if (tc__end_value(j) == TC_J_DONE)
        return TC_J_DONE_AGAIN;
    return tc_json_byte(j, c);
}

static int tc__string(tc_json_t *j, uint8_t c)
{
    if (c == '"') {
        tc__out(j, "\"", 1);
        return tc__end_value(j);
    }
    if (c == '\\') {
        j->st = J_STR_ESC;
        return TC_J_MORE;
    }
    if (c < 0x20)
        return TC_J_ERR;
    if (c < 0x80) {
        tc__out(j, (const char *)&c, 1);
        return TC_J_MORE;
    }
    /* The first byte of a sequence bounds the second (no overlong forms, no surrogates,
     * nothing past U+10FFFF); the sequence goes out whole. */
    unsigned lo, hi;
    int n = text_utf8_lead(c, &lo, &hi);
    if (n < 2)
        return TC_J_ERR;
    j->need = n - 1;
    j->lo = (uint8_t)lo;
    j->up = (uint8_t)hi;
    j->ub[0] = c;
    j->ubn = 1;
    j->st = J_STR_UTF;
    return TC_J_MORE;
}

static int tc__escape(tc_json_t *j, uint8_t c)
{
    static const char from[] = "\"\\/bfnrt";
    static const uint8_t cp[] = {'"', '\\', '/', '\b', '\f', '\n', '\r', '\t'};
    if (c == 'u') {
        j->u = 0;
        j->un = 0;
        j->st = J_STR_U;
        return TC_J_MORE;
    }
    const char *p = c ? memchr(from, c, 8) : NULL;
    if (!p)
        return TC_J_ERR;
    tc__out_cp(j, cp[p - from]);
    j->st = J_STR;
    return TC_J_MORE;
}

static int tc__unicode(tc_json_t *j, uint8_t c)
{
    int h = text_hex_digit(c);
    if (h < 0)
        return TC_J_ERR;
    j->u = j->u * 16 + (uint32_t)h;
    if (++j->un < 4)
        return TC_J_MORE;
    uint32_t u = j->u;
    if (j->hi) {
        if (u < 0xDC00 || u > 0xDFFF)
            return TC_J_ERR;
        u = 0x10000 + ((j->hi - 0xD800) << 10) + (u - 0xDC00);
        j->hi = 0;
    } else if (u >= 0xD800 && u <= 0xDBFF) {
        j->hi = u;
        j->st = J_STR_LOW_BS;
        return TC_J_MORE;
    } else if (u >= 0xDC00 && u <= 0xDFFF) {
        return TC_J_ERR;
    }
    tc__out_cp(j, u);
    j->st = J_STR;
    return TC_J_MORE;
}

int tc_json_byte(tc_json_t *j, uint8_t c)
{
    switch (j->st) {
    case J_VALUE:
        return tc__ws(c) ? TC_J_MORE : tc__start_value(j, c);
    case J_ARR_FIRST:
        if (tc__ws(c))
            return TC_J_MORE;
        return c == ']' ? tc__close(j, c) : tc__start_value(j, c);
    case J_OBJ_FIRST:
    case J_OBJ_KEY:
        if (tc__ws(c))
            return TC_J_MORE;
        if (c == '"')
            return tc__start_string(j, 1);
        return (c == '}' && j->st == J_OBJ_FIRST) ? tc__close(j, c) : TC_J_ERR;
    case J_COLON:
        if (tc__ws(c))
            return TC_J_MORE;
        if (c != ':')
            return TC_J_ERR;
        tc__out(j, ":", 1);
        j->st = J_VALUE;
        return TC_J_MORE;
    case J_AFTER: {
        if (tc__ws(c))
            return TC_J_MORE;
        uint8_t open = j->stack[j->depth - 1];
        if (c == ',') {
            tc__out(j, ",", 1);
            j->st = open == '{' ? J_OBJ_KEY : J_VALUE;
            return TC_J_MORE;
        }
        if ((c == '}' && open == '{') || (c == ']' && open == '['))
            return tc__close(j, c);
        return TC_J_ERR;
    }
    case J_STR:
        return tc__string(j, c);
    case J_STR_UTF:
        if (c < j->lo || c > j->up)
            return TC_J_ERR;
        j->ub[j->ubn++] = c;
        j->lo = 0x80;
        j->up = 0xBF;
        if (--j->need == 0) {
            tc__out(j, (const char *)j->ub, (size_t)j->ubn);
            j->st = J_STR;
        }
        return TC_J_MORE;
    case J_STR_ESC:
        return tc__escape(j, c);
    case J_STR_U:
        return tc__unicode(j, c);
    case J_STR_LOW_BS:
        if (c != '\\')
            return TC_J_ERR;
        j->st = J_STR_LOW_U;
        return TC_J_MORE;
    case J_STR_LOW_U:
        if (c != 'u')
            return TC_J_ERR;
        j->u = 0;
        j->un = 0;
        j->st = J_STR_U;
        return TC_J_MORE;
    case J_NUM:
        return tc__number(j, c);
    case J_LIT:
        if (c != (uint8_t)j->lit[j->lit_pos])
            return TC_J_ERR;
        tc__out(j, (const char *)&c, 1);
        if (j->lit[++j->lit_pos])
            return TC_J_MORE;
        return tc__end_value(j);
    default: /* J_DONE: nothing more belongs to the value */
        return TC_J_ERR;
    }
}

int tc_json_can_end(const tc_json_t *j)
{
    return j->st == J_DONE || (j->st == J_NUM && j->depth == 0 && tc__num_whole(j->num));
}

typedef struct tc__grow {
    char *p;
    size_t n, cap;
    int oom;
} tc__grow_t;

static void tc__grow_sink(void *ctx, const char *p, size_t n)
{
    tc__grow_t *g = ctx;
    if (g->oom)
        return;
    if (g->n + n + 1 > g->cap) {
        size_t cap = g->cap ? g->cap * 2 : 64;
        while (cap < g->n + n + 1)
            cap *= 2;
        char *q = realloc(g->p, cap);
        if (!q) {
            g->oom = 1;
            return;
        }
        g->p = q;
        g->cap = cap;
    }
    memcpy(g->p + g->n, p, n);
    g->n += n;
    g->p[g->n] = '\0';
}

int tc_json_compact(const char *text, size_t len, char **out, size_t *out_len)
{
    *out = NULL;
    tc_json_t *j = malloc(sizeof *j);
    if (!j)
        return river_err_set(RIVER_ENOMEM, "tool call arguments: out of memory");
    tc__grow_t g = {0};
    tc_json_reset(j, tc__grow_sink, &g);
    int r = TC_J_MORE;
    size_t i = 0;
    for (; i < len && r == TC_J_MORE; i++)
        r = tc_json_byte(j, (uint8_t)text[i]);
    if (r == TC_J_DONE_AGAIN)
        i--;
    int whole = r == TC_J_DONE || r == TC_J_DONE_AGAIN || (r == TC_J_MORE && tc_json_can_end(j));
    while (whole && i < len && tc__ws((uint8_t)text[i]))
        i++;
    free(j);
    if (g.oom) {
        free(g.p);
        return river_err_set(RIVER_ENOMEM, "tool call arguments: out of memory");
    }
    if (!whole || i < len) {
        free(g.p);
        return river_err_set(RIVER_EINVAL, "tool call arguments are not one JSON value "
                             "(byte %zu)", i);
    }
    *out = g.p;
    *out_len = g.n;
    return 0;
}
