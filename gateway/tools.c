/* Tool calls in chat responses: the model's text split by the parsers of its template's
 * format (gateway/toolcall.h) into content and OpenAI's tool_calls, whole for a response
 * and as delta.tool_calls for a stream. A request whose tool_choice is none, or a model
 * whose template renders no calls, gets its text as content, untouched. */
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "gateway/gateway.h"

struct gw_tools_stream {
    toolcall_stream_t *tc;
    int called;          /* a call started */
    char *content;       /* the content of the last push */
    size_t n_content, cap_content;
};

/* The names of the request's tools, in a malloc'd array pointing into its JSON. */
static const char **gw_tools__names(const gw_request_t *r, size_t *n)
{
    *n = json_array_size(r->tools);
    const char **v = malloc((*n ? *n : 1) * sizeof *v);
    for (size_t i = 0; v && i < *n; i++)
        v[i] = json_string_value(
            json_object_get(json_object_get(json_array_get(r->tools, i), "function"), "name"));
    return v;
}

int gw_tools_apply(const gw_request_t *r, toolcall_format_t f)
{
    return r->api == GW_API_CHAT && f != TOOLCALL_NONE && r->tools &&
           r->tool_choice != GW_TOOL_CHOICE_NONE;
}

static json_t *gw_tools__call(const toolcall_call_t *c, int index)
{
    return json_pack("{s:i,s:s,s:s,s:{s:s,s:s%}}", "index", index, "id", c->id, "type",
                     "function", "function", "name", c->name, "arguments", c->arguments,
                     c->arguments_len);
}

int gw_tools_split(const gw_request_t *r, toolcall_format_t f, const char *text, size_t len,
                   char **content, size_t *content_len, json_t **tool_calls)
{
    *content = NULL;
    *content_len = 0;
    *tool_calls = NULL;
    size_t n;
    const char **names = gw_tools__names(r, &n);
    if (!names)
        return river_err_set(RIVER_ENOMEM, "tool names");
    toolcall_result_t res;
    int e = toolcall_parse(f, text, len, names, n, &res);
    free(names);
    if (e)
        return e;
    if (res.n_calls) {
        *tool_calls = json_array();
        for (size_t i = 0; *tool_calls && i < res.n_calls; i++) {
            json_t *c = gw_tools__call(&res.calls[i], (int)i);
            json_object_del(c, "index"); /* only stream deltas carry it */
            json_array_append_new(*tool_calls, c);
        }
    }
    size_t n_calls = res.n_calls;
    *content = res.content;
    *content_len = res.content_len;
    res.content = NULL;
    toolcall_result_free(&res);
    return *tool_calls || !n_calls ? 0 : river_err_set(RIVER_ENOMEM, "tool calls");
}

int gw_tools_stream_new(gw_tools_stream_t **out, const gw_request_t *r, toolcall_format_t f)
{
    *out = NULL;
    gw_tools_stream_t *s = calloc(1, sizeof *s);
    size_t n;
    const char **names = gw_tools__names(r, &n);
    int e = !s || !names ? river_err_set(RIVER_ENOMEM, "tool-call stream")
                         : toolcall_stream_new(&s->tc, f, names, n);
    free(names);
    if (e) {
        free(s);
        return e;
    }
    *out = s;
    return 0;
}

void gw_tools_stream_destroy(gw_tools_stream_t **sp)
{
    gw_tools_stream_t *s = *sp;
    if (!s)
        return;
    toolcall_stream_destroy(&s->tc);
    free(s->content);
    free(s);
    *sp = NULL;
}

static int gw_tools__content(gw_tools_stream_t *s, const char *t, size_t n)
{
    if (s->n_content + n + 1 > s->cap_content) {
        size_t cap = s->cap_content ? s->cap_content : 256;
        while (cap < s->n_content + n + 1)
            cap *= 2;
        char *p = realloc(s->content, cap);
        if (!p)
            return river_err_set(RIVER_ENOMEM, "streamed content");
        s->content = p;
        s->cap_content = cap;
    }
    memcpy(s->content + s->n_content, t, n);
    s->n_content += n;
    s->content[s->n_content] = '\0';
    return 0;
}

/* One delta.tool_calls entry per event that carries something: the start with its id and
 * name and empty arguments, then argument pieces, consecutive pieces of one call joined. */
static int gw_tools__delta(gw_tools_stream_t *s, const toolcall_event_t *ev, json_t *calls)
{
    if (ev->kind == TOOLCALL_EV_CALL_START) {
        s->called = 1;
        return json_array_append_new(calls, json_pack("{s:i,s:s,s:s,s:{s:s,s:s}}", "index",
                                                      ev->index, "id", ev->id, "type",
                                                      "function", "function", "name", ev->name,
                                                      "arguments", ""));
    }
    if (ev->kind != TOOLCALL_EV_ARGS || ev->len == 0)
        return 0;
    size_t last = json_array_size(calls);
    json_t *prev = last ? json_array_get(calls, last - 1) : NULL;
    if (prev && json_integer_value(json_object_get(prev, "index")) == ev->index) {
        json_t *fn = json_object_get(prev, "function");
        json_t *a = json_object_get(fn, "arguments");
        size_t n = json_string_length(a);
        char *joined = malloc(n + ev->len);
        if (!joined)
            return -1;
        memcpy(joined, json_string_value(a), n);
        memcpy(joined + n, ev->text, ev->len);
        int rc = json_object_set_new(fn, "arguments", json_stringn(joined, n + ev->len));
        free(joined);
        return rc;
    }
    return json_array_append_new(calls, json_pack("{s:i,s:{s:s%}}", "index", ev->index,
                                                  "function", "arguments", ev->text, ev->len));
}

int gw_tools_stream_push(gw_tools_stream_t *s, const char *text, size_t len, int finish,
                         const char **content, size_t *content_len, json_t **tool_calls)
{
    *content = "";
    *content_len = 0;
    *tool_calls = NULL;
    s->n_content = 0;
    toolcall_event_t *evs;
    size_t n;
    int e = toolcall_stream_push(s->tc, text, len, &evs, &n);
    json_t *calls = json_array();
    if (!calls)
        return river_err_set(RIVER_ENOMEM, "tool calls");
    for (int round = 0; !e && round < 1 + (finish != 0); round++) {
        if (round == 1)
            e = toolcall_stream_finish(s->tc, &evs, &n);
        for (size_t i = 0; !e && i < n; i++) {
            if (evs[i].kind == TOOLCALL_EV_CONTENT)
                e = gw_tools__content(s, evs[i].text, evs[i].len);
            else if (gw_tools__delta(s, &evs[i], calls))
                e = river_err_set(RIVER_ENOMEM, "tool calls");
        }
    }
    if (e || json_array_size(calls) == 0)
        json_decref(calls);
    else
        *tool_calls = calls;
    if (!e && s->n_content) {
        *content = s->content;
        *content_len = s->n_content;
    }
    return e;
}

int gw_tools_stream_called(const gw_tools_stream_t *s) { return s->called; }
