/* Tool calls in generated text: a call's syntax, from the opening marker to the close.
 * Its header is held back until the name is read and known, which commits the call (the
 * stream's CALL_START); then the arguments go through the JSON scanner byte by byte and
 * out compact; then the trailing syntax ("}", "</tool_call>", the list's next element) is
 * read, and a byte that breaks it is content again. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/rng.h"
#include "gateway/toolcall_int.h"
#include "text/utf8.h"

/* ---- Names and ids ---- */

/* Whether a name just read may be called. */
static int tc__name_known(const toolcall_stream_t *s, const char *name, size_t n)
{
    if (n == 0)
        return 0;
    if (!s->names)
        return 1;
    for (size_t i = 0; i < s->n_names; i++)
        if (s->name_lens[i] == n && !memcmp(s->names[i], name, n))
            return 1;
    return 0;
}

static void tc__make_id(toolcall_stream_t *s, char *id)
{
    static const char alnum[] =
        "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    size_t n = 0, k = 24;
    if (s->fmt == TOOLCALL_MISTRAL) {
        k = 9;
    } else {
        memcpy(id, "call_", 5);
        n = 5;
    }
    for (size_t i = 0; i < k; i++)
        id[n++] = alnum[rng_next(&s->rng) % 62];
    id[n] = '\0';
}

/* ---- Calls ---- */

/* The name is read and known: the call starts. Whatever whitespace and header were held
 * are the call's, not content. */
static void tc__commit(toolcall_stream_t *s, const char *name, size_t name_len)
{
    char id[32];
    tc__make_id(s, id);
    s->ws.n = 0;
    s->held.n = 0;
    s->n_calls++;
    s->call_open = 1;
    tc_rec_t *r = tc_rec(s, TOOLCALL_EV_CALL_START);
    if (!r)
        return;
    r->id_off = s->out.n;
    tc_put(s, &s->out, id, strlen(id) + 1);
    r->name_off = s->out.n;
    tc_put(s, &s->out, name, name_len);
    tc_put(s, &s->out, "", 1);
}

void tc_end_call(toolcall_stream_t *s, int incomplete)
{
    tc_rec_t *r = tc_rec(s, TOOLCALL_EV_CALL_END);
    if (r)
        r->incomplete = incomplete;
    s->call_open = 0;
    s->skip_ws = 1;
    s->at_start = 0;
}

/* A block of calls is over: back to content. */
static void tc__block_done(toolcall_stream_t *s)
{
    s->held.n = 0;
    s->mode = M_TEXT;
    s->skip_ws = 1;
    s->at_start = 0;
    s->llama_after = s->fmt == TOOLCALL_LLAMA3_JSON;
}

/* The byte c does not continue what was held (c is its last byte): the held bytes are
 * content, and c is read again as content. An open call ends incomplete first. */
static void tc__break(toolcall_stream_t *s, uint8_t c)
{
    if (s->call_open)
        tc_end_call(s, 1);
    size_t n = s->held.n - 1;
    s->held.n = 0; /* content does not touch held, so its bytes stay readable */
    s->mode = M_TEXT;
    tc_content_buf(s, s->held.p, n);
    tc_text(s, c);
}

void tc_open_marker(toolcall_stream_t *s, int k)
{
    s->mode = M_HEAD;
    switch (s->fmt) {
    case TOOLCALL_MISTRAL:
        s->st = H_LIST_OPEN;
        break;
    case TOOLCALL_COMMAND_R:
        s->st = H_FENCE;
        s->lit = "```json";
        s->lit_pos = 0;
        break;
    case TOOLCALL_FUNCTIONARY:
        if (k == 1) { /* <|python_tag|>: code to the end, as {"code": ...} */
            tc__commit(s, "python", 6);
            s->mode = M_CODE;
            s->cun = s->cneed = 0;
            tc_emit(s, TOOLCALL_EV_ARGS, "{\"code\":\"", 9);
            return;
        }
        s->st = H_FN_NAME;
        s->tok.n = 0;
        break;
    default:
        s->st = H_OBJ_OPEN;
        break;
    }
}

/* ---- The header ---- */

static void tc__args_sink(void *ctx, const char *p, size_t n)
{
    tc_emit(ctx, TOOLCALL_EV_ARGS, p, n);
}

static void tc__start_args(toolcall_stream_t *s)
{
    s->held.n = 0;
    s->mode = M_ARGS;
    tc_json_reset(&s->args, tc__args_sink, s);
}

/* The key just read (s->tok), if the slot takes it. */
static int tc__key_kind(const toolcall_stream_t *s)
{
    static const char *const keys[] = {"type", "name", "tool_name", "arguments", "parameters"};
    static const int kinds[] = {KEY_TYPE, KEY_NAME, KEY_NAME, KEY_ARGS, KEY_ARGS};
    for (int i = 0; i < 5; i++) {
        if (strlen(keys[i]) != s->tok.n || memcmp(keys[i], s->tok.p, s->tok.n))
            continue;
        int k = kinds[i];
        if ((s->slot == SLOT_FIRST && k != KEY_ARGS) || (s->slot == SLOT_NAME && k == KEY_NAME) ||
            (s->slot == SLOT_ARGS && k == KEY_ARGS))
            return k;
    }
    return -1;
}

/* Reads one byte of a short string (a key or "function") into s->tok; 1 at its end, 0 to
 * go on, -1 when it cannot be one of the expected words. */
static int tc__word(toolcall_stream_t *s, uint8_t c)
{
    if (c == '"')
        return 1;
    if (c == '\\' || c < 0x20 || s->tok.n >= 16)
        return -1;
    tc_putc(s, &s->tok, c);
    return 0;
}

/* One header byte; 0, or -1 when c breaks the header. */
static int tc__head_step(toolcall_stream_t *s, uint8_t c)
{
    int ws = tc_ws(c), r;
    switch (s->st) {
    case H_OBJ_OPEN:
        if (ws)
            return 0;
        if (c != '{')
            return -1;
        s->st = H_KEY;
        s->slot = SLOT_FIRST;
        return 0;
    case H_LIST_OPEN:
        if (ws)
            return 0;
        if (c == '{' && s->fmt == TOOLCALL_MISTRAL) {
            s->in_list = 0;
            s->st = H_KEY;
            s->slot = SLOT_FIRST;
            return 0;
        }
        if (c != '[')
            return -1;
        s->in_list = 1;
        s->st = H_LIST_FIRST;
        return 0;
    case H_LIST_FIRST:
        if (ws)
            return 0;
        if (c == '{') {
            s->st = H_KEY;
            s->slot = SLOT_FIRST;
            return 0;
        }
        if (c != ']')
            return -1;
        /* An empty list: no calls, and no content either. */
        s->ws.n = 0;
        if (s->fmt == TOOLCALL_COMMAND_R) {
            s->held.n = 0;
            s->mode = M_TAIL;
            s->st = T_LIT;
            s->lit = "```";
            s->lit_pos = 0;
        } else {
            tc__block_done(s);
        }
        return 0;
    case H_FENCE:
        if (ws && s->lit_pos == 0)
            return 0;
        if (c != (uint8_t)s->lit[s->lit_pos])
            return -1;
        if (!s->lit[++s->lit_pos])
            s->st = H_LIST_OPEN;
        return 0;
    case H_KEY:
    case H_TYPE_VAL:
    case H_NAME_VAL:
        if (ws)
            return 0;
        if (c != '"')
            return -1;
        s->tok.n = 0;
        s->st = s->st == H_KEY ? H_KEY_STR : s->st == H_TYPE_VAL ? H_TYPE_STR : H_NAME_STR;
        return 0;
    case H_KEY_STR:
        if ((r = tc__word(s, c)) <= 0)
            return r;
        if ((s->key = tc__key_kind(s)) < 0)
            return -1;
        s->st = H_COLON;
        return 0;
    case H_COLON:
        if (ws)
            return 0;
        if (c != ':')
            return -1;
        if (s->key == KEY_ARGS)
            tc__start_args(s);
        else
            s->st = s->key == KEY_TYPE ? H_TYPE_VAL : H_NAME_VAL;
        return 0;
    case H_TYPE_STR:
        if ((r = tc__word(s, c)) <= 0)
            return r;
        if (s->tok.n != 8 || memcmp(s->tok.p, "function", 8))
            return -1;
        s->st = H_TYPE_SEP;
        return 0;
    case H_TYPE_SEP:
        if (ws)
            return 0;
        if (c != ',')
            return -1;
        s->st = H_KEY;
        s->slot = SLOT_NAME;
        return 0;
    case H_NAME_STR:
    case H_FN_NAME:
        if (c == (s->st == H_NAME_STR ? '"' : '>')) {
            if (!tc__name_known(s, s->tok.p, s->tok.n))
                return -1;
            tc__commit(s, s->tok.p, s->tok.n);
            if (s->st == H_FN_NAME)
                tc__start_args(s);
            else
                s->st = H_AFTER_NAME;
            return 0;
        }
        if (!tc_name_char(c) || s->tok.n >= TOOLCALL_NAME_MAX)
            return -1;
        tc_putc(s, &s->tok, c);
        return 0;
    default: /* H_AFTER_NAME */
        if (ws)
            return 0;
        if (c == ',') {
            s->st = H_KEY;
            s->slot = SLOT_ARGS;
            return 0;
        }
        if (c != '}')
            return -1;
        /* {"name": "f"}: a call without arguments. */
        tc_emit(s, TOOLCALL_EV_ARGS, "{}", 2);
        tc_end_call(s, 0);
        s->mode = M_TAIL;
        s->held.n = 0;
        s->st = T_OBJ_SEP;
        return 1; /* the object's '}' is read again as its end */
    }
}

void tc_head(toolcall_stream_t *s, uint8_t c)
{
    tc_putc(s, &s->held, c);
    int r = tc__head_step(s, c);
    if (r < 0) {
        tc__break(s, c);
    } else if (r > 0) {
        tc_tail(s, c);
    }
}

/* ---- After the arguments ---- */

/* The call object's closing brace is read. */
static void tc__obj_closed(toolcall_stream_t *s)
{
    switch (s->fmt) {
    case TOOLCALL_HERMES:
        s->st = T_LIT;
        s->lit = "</tool_call>";
        s->lit_pos = 0;
        break;
    case TOOLCALL_MISTRAL:
    case TOOLCALL_COMMAND_R:
        if (s->in_list) {
            s->st = T_LIST_NEXT;
            break;
        }
        tc__block_done(s);
        break;
    default:
        tc__block_done(s);
        break;
    }
}

/* One byte of trailing syntax; 0, 1 to read it again, -1 when it breaks. */
static int tc__tail_step(toolcall_stream_t *s, uint8_t c)
{
    int ws = tc_ws(c), r;
    switch (s->st) {
    case T_OBJ_SEP:
        if (ws)
            return 0;
        if (c == '}') {
            tc__obj_closed(s);
            return 0;
        }
        if (c != ',')
            return -1;
        s->st = T_OBJ_KEY;
        return 0;
    case T_OBJ_KEY:
        if (ws)
            return 0;
        if (c != '"')
            return -1;
        tc_json_reset(&s->skip, NULL, NULL);
        tc_json_byte(&s->skip, c);
        s->st = T_OBJ_KEYSTR;
        return 0;
    case T_OBJ_KEYSTR:
        r = tc_json_byte(&s->skip, c);
        if (r == TC_J_ERR)
            return -1;
        if (r == TC_J_DONE)
            s->st = T_OBJ_COLON;
        return 0;
    case T_OBJ_COLON:
        if (ws)
            return 0;
        if (c != ':')
            return -1;
        tc_json_reset(&s->skip, NULL, NULL);
        s->st = T_OBJ_VAL;
        return 0;
    case T_OBJ_VAL:
        r = tc_json_byte(&s->skip, c);
        if (r == TC_J_ERR)
            return -1;
        if (r == TC_J_MORE)
            return 0;
        s->st = T_OBJ_SEP;
        return r == TC_J_DONE_AGAIN;
    case T_LIT:
        if (ws && s->lit_pos == 0)
            return 0;
        if (c != (uint8_t)s->lit[s->lit_pos])
            return -1;
        if (!s->lit[++s->lit_pos])
            tc__block_done(s);
        return 0;
    default: /* T_LIST_NEXT */
        if (ws)
            return 0;
        if (c == ',') {
            s->held.n = 0;
            s->mode = M_HEAD;
            s->st = H_OBJ_OPEN;
            return 0;
        }
        if (c != ']')
            return -1;
        if (s->fmt == TOOLCALL_COMMAND_R) {
            s->st = T_LIT;
            s->lit = "```";
            s->lit_pos = 0;
        } else {
            tc__block_done(s);
        }
        return 0;
    }
}

void tc_tail(toolcall_stream_t *s, uint8_t c)
{
    tc_putc(s, &s->held, c);
    int r;
    while ((r = tc__tail_step(s, c)) > 0)
        ;
    if (r < 0)
        tc__break(s, c);
}

void tc_args_byte(toolcall_stream_t *s, uint8_t c)
{
    int r = tc_json_byte(&s->args, c);
    if (r == TC_J_MORE)
        return;
    if (r == TC_J_ERR) {
        tc_end_call(s, 1);
        s->mode = M_TEXT;
        s->held.n = 0;
        tc_text(s, c);
        return;
    }
    tc_end_call(s, 0);
    s->mode = M_TAIL;
    s->held.n = 0;
    if (s->fmt == TOOLCALL_FUNCTIONARY) {
        s->st = T_LIT;
        s->lit = "</function>";
        s->lit_pos = 0;
    } else {
        s->st = T_OBJ_SEP;
    }
    if (r == TC_J_DONE_AGAIN)
        tc_tail(s, c);
}

/* Functionary's python code: each byte as a JSON string's, invalid UTF-8 as U+FFFD. */
void tc_code_byte(toolcall_stream_t *s, uint8_t c)
{
    static const char fffd[] = "\xEF\xBF\xBD";
    static const char ctl[] = "\b\f\n\r\t", ctl_name[] = "bfnrt";
    if (s->cneed) {
        if (c >= s->clo && c <= s->cup) {
            s->cu[s->cun++] = c;
            s->clo = 0x80;
            s->cup = 0xBF;
            if (--s->cneed == 0)
                tc_emit(s, TOOLCALL_EV_ARGS, (const char *)s->cu, (size_t)s->cun);
            return;
        }
        tc_emit(s, TOOLCALL_EV_ARGS, fffd, 3);
        s->cneed = 0;
    }
    char e[8];
    if (c == '"' || c == '\\') {
        e[0] = '\\';
        e[1] = (char)c;
        tc_emit(s, TOOLCALL_EV_ARGS, e, 2);
    } else if (c < 0x20) {
        const char *sh = c ? memchr(ctl, c, 5) : NULL;
        if (sh)
            snprintf(e, sizeof e, "\\%c", ctl_name[sh - ctl]);
        else
            snprintf(e, sizeof e, "\\u%04X", c);
        tc_emit(s, TOOLCALL_EV_ARGS, e, strlen(e));
    } else if (c < 0x80) {
        tc_emit(s, TOOLCALL_EV_ARGS, (const char *)&c, 1);
    } else {
        unsigned lo, hi;
        int n = text_utf8_lead(c, &lo, &hi);
        if (n < 2) {
            tc_emit(s, TOOLCALL_EV_ARGS, fffd, 3);
            return;
        }
        s->cneed = n - 1;
        s->clo = (uint8_t)lo;
        s->cup = (uint8_t)hi;
        s->cu[0] = c;
        s->cun = 1;
    }
}

