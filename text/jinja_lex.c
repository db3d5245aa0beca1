/* The chat-template lexer: template source to tokens, with the whitespace rules of Jinja2
 * as transformers configures it (trim_blocks, lstrip_blocks), the "-" and "+" markers on
 * tags, comments, raw blocks and Python string literals.
 *
 * It follows jinja2/lexer.py: the text before a "{%" or "{#" loses the spaces and tabs
 * that start its last line (lstrip_blocks) when the tag starts that line; "{%-", "{{-" and
 * "{#-" strip all whitespace before; "-%}", "-}}" and "-#}" strip all whitespace after;
 * "%}" and "#}" eat one newline after (trim_blocks). Inside a tag an unclosed bracket keeps
 * "}}" or "%}" from ending it, as Jinja2's balancing stack does. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "text/jinja.h"
#include "text/hex.h"

typedef struct lexer {
    jarena_t *a;
    const char *name;
    const char *src;
    size_t len, pos;
    int line;
    jtok_t *toks;
    size_t n, cap;
} lexer_t;

static int lex_fail(lexer_t *L, int line, const char *msg)
{
    return river_err_set(RIVER_EFORMAT, "%s:%d: %s", L->name, line, msg);
}

static int lex_oom(lexer_t *L)
{
    return river_err_set(jarena_over_cap(L->a) ? RIVER_EFULL : RIVER_ENOMEM,
                         "%s: template too large to compile", L->name);
}

static jtok_t *lex_push(lexer_t *L, jtok_type_t type, int line)
{
    if (L->n == L->cap) {
        size_t cap = L->cap ? L->cap * 2 : 256;
        jtok_t *t = jarena_alloc(L->a, cap * sizeof *t);
        if (!t)
            return NULL;
        if (L->n)
            memcpy(t, L->toks, L->n * sizeof *t);
        L->toks = t;
        L->cap = cap;
    }
    jtok_t *t = &L->toks[L->n++];
    memset(t, 0, sizeof *t);
    t->type = type;
    t->line = line;
    return t;
}

static int is_ws(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v' ||
           (c >= 0x1c && c <= 0x1f);
}

static void count_lines(lexer_t *L, size_t from, size_t to)
{
    for (size_t i = from; i < to; i++)
        if (L->src[i] == '\n')
            L->line++;
}

/* Emits text src[b, e) as data (a copy), when not empty. */
static int lex_data(lexer_t *L, size_t b, size_t e, int line)
{
    if (e <= b)
        return 0;
    char *s = jarena_alloc(L->a, e - b + 1);
    jtok_t *t = s ? lex_push(L, TK_DATA, line) : NULL;
    if (!t)
        return lex_oom(L);
    memcpy(s, L->src + b, e - b);
    s[e - b] = 0;
    t->s = s;
    t->len = e - b;
    return 0;
}

/* The end of the text before a tag at tag_pos, after its whitespace control: sign is '-',
 * '+' or 0; lstrip applies to block and comment tags. */
static size_t text_end(lexer_t *L, size_t b, size_t tag_pos, char sign, int lstrip,
                       int line_starting)
{
    size_t e = tag_pos;
    if (sign == '-') {
        while (e > b && is_ws(L->src[e - 1]))
            e--;
    } else if (sign != '+' && lstrip) {
        size_t l = e;
        while (l > b && L->src[l - 1] != '\n')
            l--;
        if (l > b || line_starting) {
            size_t i = l;
            while (i < e && is_ws(L->src[i]))
                i++;
            if (i == e)
                e = l;
        }
    }
    return e;
}

/* Whether "{%" [-+]? ws* word ws* [-+]? "%}" starts at p; *end: after "%}", *rsign the
 * sign before "%}" (0 if none). */
static int match_word_tag(const lexer_t *L, size_t p, const char *word, size_t *end,
                          char *rsign)
{
    size_t wl = strlen(word);
    if (p + 2 > L->len || L->src[p] != '{' || L->src[p + 1] != '%')
        return 0;
    p += 2;
    if (p < L->len && (L->src[p] == '-' || L->src[p] == '+'))
        p++;
    while (p < L->len && is_ws(L->src[p]))
        p++;
    if (p + wl > L->len || memcmp(L->src + p, word, wl) != 0)
        return 0;
    p += wl;
    if (p < L->len && (L->src[p] == '_' || (L->src[p] >= 'a' && L->src[p] <= 'z') ||
                       (L->src[p] >= 'A' && L->src[p] <= 'Z') ||
                       (L->src[p] >= '0' && L->src[p] <= '9')))
        return 0;
    while (p < L->len && is_ws(L->src[p]))
        p++;
    *rsign = 0;
    if (p < L->len && (L->src[p] == '-' || L->src[p] == '+'))
        *rsign = L->src[p++];
    if (p + 2 > L->len || L->src[p] != '%' || L->src[p + 1] != '}')
        return 0;
    *end = p + 2;
    return 1;
}

/* After a block or comment end at pos: trim_blocks eats one newline, "-" all whitespace. */
static size_t after_end(const lexer_t *L, size_t pos, char sign)
{
    if (sign == '-') {
        while (pos < L->len && is_ws(L->src[pos]))
            pos++;
    } else if (sign != '+' && pos < L->len && L->src[pos] == '\n') {
        pos++;
    }
    return pos;
}

/* A string literal at L->pos (its quote): Python's unicode-escape decoding of its body. */
static int lex_string(lexer_t *L)
{
    char q = L->src[L->pos];
    int line = L->line;
    size_t p = L->pos + 1;
    /* The decoded text is never longer than the source. */
    size_t end = p;
    while (end < L->len && L->src[end] != q) {
        if (L->src[end] == '\\' && end + 1 < L->len)
            end++;
        end++;
    }
    if (end >= L->len)
        return lex_fail(L, line, "unterminated string literal");
    char *out = jarena_alloc(L->a, end - p + 1);
    if (!out)
        return lex_oom(L);
    size_t o = 0;
    while (p < end) {
        char c = L->src[p++];
        if (c != '\\') {
            out[o++] = c;
            continue;
        }
        char e = L->src[p++];
        int32_t cp = -1;
        switch (e) {
        case '\n': break; /* a line continuation */
        case '\\': out[o++] = '\\'; break;
        case '\'': out[o++] = '\''; break;
        case '"': out[o++] = '"'; break;
        case 'a': out[o++] = '\a'; break;
        case 'b': out[o++] = '\b'; break;
        case 'f': out[o++] = '\f'; break;
        case 'n': out[o++] = '\n'; break;
        case 'r': out[o++] = '\r'; break;
        case 't': out[o++] = '\t'; break;
        case 'v': out[o++] = '\v'; break;
        case 'x':
        case 'u':
        case 'U': {
            int nd = e == 'x' ? 2 : e == 'u' ? 4 : 8;
            cp = 0;
            for (int k = 0; k < nd; k++) {
                int h = p < end ? text_hex_digit(L->src[p]) : -1;
                if (h < 0)
                    return lex_fail(L, line, "truncated \\x, \\u or \\U escape in a string");
                cp = cp * 16 + h;
                p++;
                if (cp > 0x10FFFF)
                    return lex_fail(L, line, "escape beyond U+10FFFF in a string");
            }
            break;
        }
        default:
            if (e >= '0' && e <= '7') {
                cp = e - '0';
                for (int k = 0; k < 2 && p < end && L->src[p] >= '0' && L->src[p] <= '7'; k++)
                    cp = cp * 8 + (L->src[p++] - '0');
            } else {
                /* Python keeps an unknown escape as it is. */
                out[o++] = '\\';
                out[o++] = e;
            }
        }
        if (cp >= 0) {
            if (cp >= 0xD800 && cp <= 0xDFFF)
                return lex_fail(L, line, "surrogate escape in a string");
            /* The encoding is at most as long as the escape that gave it. */
            o += ju_encode(cp, out + o);
        }
    }
    out[o] = 0;
    count_lines(L, L->pos, end);
    jtok_t *t = lex_push(L, TK_STRING, line);
    if (!t)
        return lex_oom(L);
    t->s = out;
    t->len = o;
    L->pos = end + 1;
    return 0;
}

static int is_digit(char c)
{
    return c >= '0' && c <= '9';
}

static int is_name_char(char c)
{
    return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || is_digit(c) ||
           (unsigned char)c >= 0x80;
}

/* A number at L->pos: digits with "_" between them, an optional fraction and exponent. */
static int lex_number(lexer_t *L)
{
    char buf[128];
    size_t o = 0, p = L->pos;
    int is_float = 0;
    while (p < L->len && (is_digit(L->src[p]) || (L->src[p] == '_' && p + 1 < L->len &&
                                                   is_digit(L->src[p + 1])))) {
        if (L->src[p] != '_' && o < sizeof buf - 1)
            buf[o++] = L->src[p];
        p++;
    }
    if (p + 1 < L->len && L->src[p] == '.' && is_digit(L->src[p + 1])) {
        is_float = 1;
        buf[o < sizeof buf - 1 ? o++ : o] = '.';
        p++;
        while (p < L->len && (is_digit(L->src[p]) || L->src[p] == '_')) {
            if (L->src[p] != '_' && o < sizeof buf - 1)
                buf[o++] = L->src[p];
            p++;
        }
    }
    if (p < L->len && (L->src[p] == 'e' || L->src[p] == 'E')) {
        size_t q = p + 1;
        if (q < L->len && (L->src[q] == '+' || L->src[q] == '-'))
            q++;
        if (q < L->len && is_digit(L->src[q])) {
            is_float = 1;
            while (p < q && o < sizeof buf - 1)
                buf[o++] = L->src[p++];
            while (p < L->len && is_digit(L->src[p])) {
                if (o < sizeof buf - 1)
                    buf[o++] = L->src[p];
                p++;
            }
        }
    }
    buf[o] = 0;
    if (o >= sizeof buf - 1)
        return lex_fail(L, L->line, "number literal too long");
    jtok_t *t = lex_push(L, is_float ? TK_FLOAT : TK_INT, L->line);
    if (!t)
        return lex_oom(L);
    if (is_float) {
        t->f = strtod(buf, NULL);
    } else {
        unsigned long long v = strtoull(buf, NULL, 10);
        if (o > 19 || v > (unsigned long long)INT64_MAX)
            return lex_fail(L, L->line, "integer literal too large");
        t->i = (int64_t)v;
    }
    L->pos = p;
    return 0;
}

static const struct {
    const char *s;
    int op;
} two_char_ops[] = {
    {"//", OP_FLOORDIV}, {"**", OP_POW}, {"==", OP_EQ}, {"!=", OP_NE}, {"<=", OP_LE}, {">=", OP_GE},
};

/* The tokens of one tag, up to and including its end. var: "{{" (else "{%"). */
static int lex_tag(lexer_t *L, int var, int *line_starting)
{
    int depth = 0;
    int begin_line = L->line;
    for (;;) {
        while (L->pos < L->len && is_ws(L->src[L->pos])) {
            if (L->src[L->pos] == '\n')
                L->line++;
            L->pos++;
        }
        if (L->pos >= L->len)
            return lex_fail(L, begin_line, var ? "unexpected end of template: '}}' missing"
                                               : "unexpected end of template: '%}' missing");
        const char *s = L->src + L->pos;
        size_t rest = L->len - L->pos;
        char close = var ? '}' : '%';
        if (depth == 0) {
            char sign = 0;
            size_t k = 0;
            if (rest >= 3 && (s[0] == '-' || s[0] == '+') && s[1] == close && s[2] == '}')
                sign = s[0], k = 3;
            else if (rest >= 2 && s[0] == close && s[1] == '}')
                k = 2;
            if (k && !(var && sign == '+')) {
                jtok_t *t = lex_push(L, var ? TK_VAR_END : TK_BLOCK_END, L->line);
                if (!t)
                    return lex_oom(L);
                size_t from = L->pos + k;
                size_t to = var ? (sign == '-' ? after_end(L, from, '-') : from)
                                : after_end(L, from, sign);
                count_lines(L, from, to);
                L->pos = to;
                *line_starting = to > 0 && L->src[to - 1] == '\n';
                return 0;
            }
        }
        char c = s[0];
        if (c == '\'' || c == '"') {
            int err = lex_string(L);
            if (err)
                return err;
        } else if (is_digit(c)) {
            int err = lex_number(L);
            if (err)
                return err;
        } else if (c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) {
            size_t p = L->pos;
            while (p < L->len && is_name_char(L->src[p]))
                p++;
            char *nm = jarena_alloc(L->a, p - L->pos + 1);
            jtok_t *t = nm ? lex_push(L, TK_NAME, L->line) : NULL;
            if (!t)
                return lex_oom(L);
            memcpy(nm, s, p - L->pos);
            nm[p - L->pos] = 0;
            t->s = nm;
            t->len = p - L->pos;
            L->pos = p;
        } else {
            int op = 0;
            size_t k = 1;
            for (size_t i = 0; i < sizeof two_char_ops / sizeof two_char_ops[0]; i++)
                if (rest >= 2 && s[0] == two_char_ops[i].s[0] && s[1] == two_char_ops[i].s[1]) {
                    op = two_char_ops[i].op;
                    k = 2;
                    break;
                }
            if (!op) {
                if (!strchr("+-*/%~<>=.,:|()[]{}", c) || c == 0) {
                    char msg[64];
                    snprintf(msg, sizeof msg, "unexpected character '%c' in a tag",
                             (unsigned char)c >= 0x20 && (unsigned char)c < 0x7f ? c : '?');
                    return lex_fail(L, L->line, msg);
                }
                op = c;
                if (c == '(' || c == '[' || c == '{') {
                    if (++depth > JINJA_MAX_NEST)
                        return lex_fail(L, L->line, "brackets nested too deeply");
                } else if (c == ')' || c == ']' || c == '}') {
                    if (depth == 0)
                        return lex_fail(L, L->line, "unbalanced closing bracket");
                    depth--;
                }
            }
            jtok_t *t = lex_push(L, TK_OP, L->line);
            if (!t)
                return lex_oom(L);
            t->op = op;
            L->pos += k;
        }
    }
}

int jinja_lex(jarena_t *a, const char *name, const char *src, size_t len, jtok_t **toks,
              size_t *n)
{
    lexer_t L = {.a = a, .name = name, .src = src, .len = len, .line = 1};
    int line_starting = 1;
    while (L.pos < L.len) {
        /* The next tag start. */
        size_t p = L.pos;
        const char *hit = NULL;
        while (p + 1 < L.len) {
            hit = memchr(L.src + p, '{', L.len - p - 1);
            if (!hit)
                break;
            char c = hit[1];
            if (c == '{' || c == '%' || c == '#')
                break;
            p = (size_t)(hit - L.src) + 1;
            hit = NULL;
        }
        if (!hit) {
            int err = lex_data(&L, L.pos, L.len, L.line);
            if (err)
                return err;
            count_lines(&L, L.pos, L.len);
            L.pos = L.len;
            break;
        }
        size_t tag = (size_t)(hit - L.src);
        char kind = hit[1];
        char sign = tag + 2 < L.len && (hit[2] == '-' || hit[2] == '+') ? hit[2] : 0;
        int data_line = L.line;
        size_t raw_end;
        char raw_rsign;
        int is_raw = kind == '%' && match_word_tag(&L, tag, "raw", &raw_end, &raw_rsign);
        size_t te = text_end(&L, L.pos, tag, sign, kind != '{', line_starting);
        int err = lex_data(&L, L.pos, te, data_line);
        if (err)
            return err;
        count_lines(&L, L.pos, tag);
        if (kind == '#') {
            const char *ce = NULL;
            size_t q = tag + 2;
            while (q + 1 < L.len) {
                const char *h = memchr(L.src + q, '#', L.len - q - 1);
                if (!h)
                    break;
                if (h[1] == '}') {
                    ce = h;
                    break;
                }
                q = (size_t)(h - L.src) + 1;
            }
            if (!ce)
                return lex_fail(&L, L.line, "comment not closed: '#}' missing");
            size_t cpos = (size_t)(ce - L.src);
            char csign = cpos > tag + 2 && ce[-1] == '-' ? '-' : 0;
            size_t to = after_end(&L, cpos + 2, csign);
            count_lines(&L, tag, to);
            L.pos = to;
            line_starting = to > 0 && L.src[to - 1] == '\n';
            continue;
        }
        if (is_raw) {
            /* The body runs to the first {% endraw %}. */
            size_t q = raw_end, e_end = 0;
            char e_rsign = 0;
            int found = 0;
            if (raw_rsign == '-')
                q = after_end(&L, q, '-');
            size_t body = q;
            while (q + 1 < L.len) {
                const char *h = memchr(L.src + q, '{', L.len - q - 1);
                if (!h)
                    break;
                q = (size_t)(h - L.src);
                if (match_word_tag(&L, q, "endraw", &e_end, &e_rsign)) {
                    found = 1;
                    break;
                }
                q++;
            }
            if (!found)
                return lex_fail(&L, L.line, "raw block not closed: '{% endraw %}' missing");
            char esign = L.src[q + 2] == '-' ? '-' : 0;
            size_t be = text_end(&L, body, q, esign, 0, 0);
            count_lines(&L, tag, body);
            err = lex_data(&L, body, be, L.line);
            if (err)
                return err;
            size_t to = after_end(&L, e_end, e_rsign);
            count_lines(&L, body, to);
            L.pos = to;
            line_starting = to > 0 && L.src[to - 1] == '\n';
            continue;
        }
        int var = kind == '{';
        jtok_t *t = lex_push(&L, var ? TK_VAR_BEGIN : TK_BLOCK_BEGIN, L.line);
        if (!t)
            return lex_oom(&L);
        L.pos = tag + 2 + (sign ? 1 : 0);
        err = lex_tag(&L, var, &line_starting);
        if (err)
            return err;
    }
    if (!lex_push(&L, TK_EOF, L.line))
        return lex_oom(&L);
    *toks = L.toks;
    *n = L.n;
    return 0;
}
