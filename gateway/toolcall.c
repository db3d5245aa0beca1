/* Tool calls in generated text (gateway/toolcall.h): the stream. Each push runs the
 * text byte by byte through the machine of gateway/toolcall_int.h, which records events
 * over one byte store; content and the opening markers are here, a call's syntax in
 * gateway/toolcall_syntax.c. toolcall_parse runs the same stream over the whole text, so
 * that a stream and a whole response can never disagree. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "common/err.h"
#include "common/rng.h"
#include "gateway/toolcall_int.h"

/* ---- Buffers and events ---- */

void tc_put(toolcall_stream_t *s, tc_buf_t *b, const void *p, size_t n)
{
    if (s->oom)
        return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->n + n + 1)
            cap *= 2;
        char *q = realloc(b->p, cap);
        if (!q) {
            s->oom = 1;
            return;
        }
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->n, p, n);
    b->n += n;
    b->p[b->n] = '\0';
}

void tc_putc(toolcall_stream_t *s, tc_buf_t *b, uint8_t c)
{
    if (b->n + 2 <= b->cap) { /* the common case, without a call */
        b->p[b->n++] = (char)c;
        b->p[b->n] = '\0';
        return;
    }
    tc_put(s, b, &c, 1);
}

tc_rec_t *tc_rec(toolcall_stream_t *s, toolcall_event_kind_t kind)
{
    if (s->oom)
        return NULL;
    if (s->n_recs == s->cap_recs) {
        size_t cap = s->cap_recs ? s->cap_recs * 2 : 16;
        tc_rec_t *r = realloc(s->recs, cap * sizeof *r);
        if (!r) {
            s->oom = 1;
            return NULL;
        }
        s->recs = r;
        s->cap_recs = cap;
    }
    tc_rec_t *r = &s->recs[s->n_recs++];
    memset(r, 0, sizeof *r);
    r->kind = kind;
    r->index = kind == TOOLCALL_EV_CONTENT ? -1 : s->n_calls - 1;
    r->off = s->out.n;
    return r;
}

/* Appends text to the last event when it is of the same kind (its bytes are the last of
 * the store), else to a new one. */
void tc_emit(toolcall_stream_t *s, toolcall_event_kind_t kind, const char *p, size_t n)
{
    if (!n)
        return;
    tc_rec_t *r = s->n_recs ? &s->recs[s->n_recs - 1] : NULL;
    if (!r || r->kind != kind || (kind != TOOLCALL_EV_CONTENT && r->index != s->n_calls - 1))
        r = tc_rec(s, kind);
    if (!r)
        return;
    tc_put(s, &s->out, p, n);
    if (!s->oom)
        r->len += n;
}

int tc_ws(uint8_t c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

/* One byte of content: whitespace waits for the next other byte (a call would drop it),
 * and right after a call it is dropped. */
void tc_content(toolcall_stream_t *s, uint8_t c)
{
    if (s->fmt == TOOLCALL_NONE) {
        tc_emit(s, TOOLCALL_EV_CONTENT, (const char *)&c, 1);
        return;
    }
    if (tc_ws(c)) {
        if (!s->skip_ws)
            tc_putc(s, &s->ws, c);
        return;
    }
    s->skip_ws = s->at_start = s->llama_after = 0;
    if (s->ws.n) {
        tc_emit(s, TOOLCALL_EV_CONTENT, s->ws.p, s->ws.n);
        s->ws.n = 0;
    }
    tc_emit(s, TOOLCALL_EV_CONTENT, (const char *)&c, 1);
}

void tc_content_buf(toolcall_stream_t *s, const char *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        tc_content(s, (uint8_t)p[i]);
}

/* ---- Content: markers ---- */

static const char *const tc__markers[TOOLCALL_N_FORMATS][3] = {
    [TOOLCALL_LLAMA3_JSON] = {"<|python_tag|>", NULL},
    [TOOLCALL_HERMES] = {"<tool_call>", NULL},
    [TOOLCALL_MISTRAL] = {"[TOOL_CALLS]", NULL},
    [TOOLCALL_FUNCTIONARY] = {"<function=", "<|python_tag|>", NULL},
    [TOOLCALL_COMMAND_R] = {"Action:", NULL},
};

/* -1: held is no marker's prefix; 0: a prefix; k + 1: the whole marker k. */
static int tc__marker_match(const toolcall_stream_t *s)
{
    int prefix = 0;
    for (int k = 0; tc__markers[s->fmt][k]; k++) {
        const char *m = tc__markers[s->fmt][k];
        if (s->fmt == TOOLCALL_FUNCTIONARY && k == 1 && !s->python_ok)
            continue;
        size_t n = strlen(m);
        if (s->held.n <= n && !memcmp(s->held.p, m, s->held.n)) {
            if (s->held.n == n)
                return k + 1;
            prefix = 1;
        }
    }
    return prefix ? 0 : -1;
}

void tc_text(toolcall_stream_t *s, uint8_t c)
{
    if (s->fmt == TOOLCALL_NONE) {
        tc_content(s, c);
        return;
    }
    if (!s->held.n) {
        if (s->fmt == TOOLCALL_LLAMA3_JSON && c == '{' && (s->at_start || s->llama_after)) {
            tc_putc(s, &s->held, c);
            s->mode = M_HEAD;
            s->st = H_KEY;
            s->slot = SLOT_FIRST;
            return;
        }
        if (s->llama_after && c == ';')
            return;
        if (c != '<' && c != '[' && c != 'A') { /* no marker starts otherwise */
            tc_content(s, c);
            return;
        }
    }
    tc_putc(s, &s->held, c);
    for (;;) {
        int m = tc__marker_match(s);
        if (m > 0) {
            tc_open_marker(s, m - 1);
            return;
        }
        if (m == 0 || s->oom)
            return;
        /* Not a marker: its first byte is content, and the rest may still start one. */
        tc_content(s, (uint8_t)s->held.p[0]);
        memmove(s->held.p, s->held.p + 1, --s->held.n);
        if (!s->held.n)
            return;
    }
}

static void tc__byte(toolcall_stream_t *s, uint8_t c)
{
    switch (s->mode) {
    case M_TEXT:
        tc_text(s, c);
        break;
    case M_HEAD:
        tc_head(s, c);
        break;
    case M_ARGS:
        tc_args_byte(s, c);
        break;
    case M_TAIL:
        tc_tail(s, c);
        break;
    default:
        tc_code_byte(s, c);
        break;
    }
}

/* ---- The stream ---- */

int toolcall_stream_new(toolcall_stream_t **out, toolcall_format_t f,
                        const char *const *tool_names, size_t n_names)
{
    if (!out)
        return river_err_set(RIVER_EINVAL, "toolcall_stream_new: no result pointer");
    *out = NULL;
    if ((unsigned)f >= TOOLCALL_N_FORMATS || (n_names && !tool_names))
        return river_err_set(RIVER_EINVAL, "toolcall_stream_new: bad format %d or tool names",
                             (int)f);
    toolcall_stream_t *s = calloc(1, sizeof *s);
    if (!s)
        return river_err_set(RIVER_ENOMEM, "tool call stream: out of memory");
    s->fmt = f;
    s->at_start = 1;
    s->python_ok = 1;
    if (tool_names && n_names) {
        s->python_ok = 0;
        s->names = calloc(n_names, sizeof *s->names);
        s->name_lens = calloc(n_names, sizeof *s->name_lens);
        for (size_t i = 0; s->names && s->name_lens && i < n_names; i++) {
            s->names[i] = strdup(tool_names[i] ? tool_names[i] : "");
            if (!s->names[i])
                break;
            s->name_lens[i] = strlen(s->names[i]);
            s->n_names++;
            if (!strcmp(s->names[i], "python"))
                s->python_ok = 1;
        }
        if (s->n_names < n_names) {
            toolcall_stream_destroy(&s);
            return river_err_set(RIVER_ENOMEM, "tool call stream: out of memory");
        }
    }
    /* Ids only need to be unpredictable enough not to collide; without the kernel's random
     * bytes, the clock and the stream's address stand in. */
    if (getrandom(&s->rng, sizeof s->rng, GRND_NONBLOCK) != (ssize_t)sizeof s->rng) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        s->rng = rng_mix((uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 30) ^ (uintptr_t)s);
    }
    *out = s;
    return 0;
}

void toolcall_stream_destroy(toolcall_stream_t **ps)
{
    toolcall_stream_t *s = ps ? *ps : NULL;
    if (!s)
        return;
    for (size_t i = 0; i < s->n_names; i++)
        free(s->names[i]);
    free(s->names);
    free(s->name_lens);
    free(s->out.p);
    free(s->recs);
    free(s->evs);
    free(s->ws.p);
    free(s->held.p);
    free(s->tok.p);
    free(s);
    *ps = NULL;
}

static int tc__begin(toolcall_stream_t *s, toolcall_event_t **events, size_t *n_events)
{
    if (!s || !events || !n_events)
        return river_err_set(RIVER_EINVAL, "tool call stream: NULL argument");
    *events = NULL;
    *n_events = 0;
    if (s->oom)
        return river_err_set(RIVER_ENOMEM, "tool call stream: out of memory earlier");
    if (s->finished)
        return river_err_set(RIVER_ESTATE, "tool call stream: already finished");
    s->out.n = 0;
    s->n_recs = 0;
    return 0;
}

static int tc__events(toolcall_stream_t *s, toolcall_event_t **events, size_t *n_events)
{
    if (!s->oom && s->n_recs > s->cap_evs) {
        toolcall_event_t *e = realloc(s->evs, s->n_recs * sizeof *e);
        if (e) {
            s->evs = e;
            s->cap_evs = s->n_recs;
        } else {
            s->oom = 1;
        }
    }
    if (s->oom)
        return river_err_set(RIVER_ENOMEM, "tool call stream: out of memory");
    for (size_t i = 0; i < s->n_recs; i++) {
        const tc_rec_t *r = &s->recs[i];
        toolcall_event_t *e = &s->evs[i];
        memset(e, 0, sizeof *e);
        e->kind = r->kind;
        e->index = r->index;
        e->incomplete = r->incomplete;
        if (r->kind == TOOLCALL_EV_CALL_START) {
            e->id = s->out.p + r->id_off;
            e->name = s->out.p + r->name_off;
        } else if (r->kind != TOOLCALL_EV_CALL_END) {
            e->text = s->out.p + r->off;
            e->len = r->len;
        }
    }
    *events = s->n_recs ? s->evs : NULL;
    *n_events = s->n_recs;
    return 0;
}

int toolcall_stream_push(toolcall_stream_t *s, const char *text, size_t len,
                         toolcall_event_t **events, size_t *n_events)
{
    int rc = tc__begin(s, events, n_events);
    if (rc)
        return rc;
    if (len && !text)
        return river_err_set(RIVER_EINVAL, "toolcall_stream_push: NULL text");
    for (size_t i = 0; i < len && !s->oom; i++)
        tc__byte(s, (uint8_t)text[i]);
    return tc__events(s, events, n_events);
}

int toolcall_stream_finish(toolcall_stream_t *s, toolcall_event_t **events, size_t *n_events)
{
    int rc = tc__begin(s, events, n_events);
    if (rc)
        return rc;
    s->finished = 1;
    switch (s->mode) {
    case M_ARGS:
        tc_end_call(s, !tc_json_can_end(&s->args));
        break;
    case M_CODE:
        if (s->cneed)
            tc_emit(s, TOOLCALL_EV_ARGS, "\xEF\xBF\xBD", 3);
        tc_emit(s, TOOLCALL_EV_ARGS, "\"}", 2);
        tc_end_call(s, 0);
        break;
    case M_TAIL:
        break; /* trailing syntax cut by the end of the text */
    default: /* M_TEXT, M_HEAD: a marker or header that never committed is content */
        if (s->call_open) {
            tc_end_call(s, 1);
        } else {
            size_t n = s->held.n;
            s->held.n = 0;
            tc_content_buf(s, s->held.p, n);
        }
        break;
    }
    /* Whitespace at the end of content is content. */
    if (s->ws.n)
        tc_emit(s, TOOLCALL_EV_CONTENT, s->ws.p, s->ws.n);
    s->ws.n = 0;
    return tc__events(s, events, n_events);
}

/* ---- The whole text ---- */

void toolcall_result_free(toolcall_result_t *r)
{
    if (!r)
        return;
    for (size_t i = 0; i < r->n_calls; i++) {
        free(r->calls[i].id);
        free(r->calls[i].name);
        free(r->calls[i].arguments);
    }
    free(r->calls);
    free(r->content);
    memset(r, 0, sizeof *r);
}

static int tc__append(char **p, size_t *n, const char *text, size_t len)
{
    char *q = realloc(*p, *n + len + 1);
    if (!q)
        return -1;
    memcpy(q + *n, text, len);
    *n += len;
    q[*n] = '\0';
    *p = q;
    return 0;
}

/* Adds a push's events to the result. */
static int tc__collect(toolcall_result_t *r, const toolcall_event_t *ev, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const toolcall_event_t *e = &ev[i];
        toolcall_call_t *c = e->index >= 0 && (size_t)e->index < r->n_calls
                                 ? &r->calls[e->index] : NULL;
        switch (e->kind) {
        case TOOLCALL_EV_CONTENT:
            if (tc__append(&r->content, &r->content_len, e->text, e->len))
                return -1;
            break;
        case TOOLCALL_EV_CALL_START: {
            toolcall_call_t *v = realloc(r->calls, (r->n_calls + 1) * sizeof *v);
            if (!v)
                return -1;
            r->calls = v;
            c = &v[r->n_calls++];
            memset(c, 0, sizeof *c);
            c->id = strdup(e->id);
            c->name = strdup(e->name);
            c->arguments = strdup("");
            if (!c->id || !c->name || !c->arguments)
                return -1;
            break;
        }
        case TOOLCALL_EV_ARGS:
            if (c && tc__append(&c->arguments, &c->arguments_len, e->text, e->len))
                return -1;
            break;
        default:
            if (c)
                c->incomplete = e->incomplete;
            break;
        }
    }
    return 0;
}

int toolcall_parse(toolcall_format_t f, const char *text, size_t len,
                   const char *const *tool_names, size_t n_names, toolcall_result_t *out)
{
    if (!out || (len && !text))
        return river_err_set(RIVER_EINVAL, "toolcall_parse: NULL argument");
    memset(out, 0, sizeof *out);
    toolcall_stream_t *s;
    int rc = toolcall_stream_new(&s, f, tool_names, n_names);
    if (rc)
        return rc;
    toolcall_event_t *ev;
    size_t n;
    rc = toolcall_stream_push(s, text, len, &ev, &n);
    if (!rc && tc__collect(out, ev, n))
        rc = river_err_set(RIVER_ENOMEM, "tool calls: out of memory");
    if (!rc)
        rc = toolcall_stream_finish(s, &ev, &n);
    if (!rc && tc__collect(out, ev, n))
        rc = river_err_set(RIVER_ENOMEM, "tool calls: out of memory");
    if (!rc && !out->content && !(out->content = strdup("")))
        rc = river_err_set(RIVER_ENOMEM, "tool calls: out of memory");
    toolcall_stream_destroy(&s);
    if (rc)
        toolcall_result_free(out);
    return rc;
}

