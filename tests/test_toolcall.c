/* Tool-call parser tests (gateway/toolcall.h): format detection on the real templates of
 * tests/data/chat-templates/, render -> parse round trips per format, the assistant turns
 * those templates render for tool_calls parsed back, content around calls, malformed and
 * unknown calls staying content, incomplete calls, compact arguments checked against
 * jansson, stream events and their order, and the invariant that any split of a text into
 * pieces streams to exactly what toolcall_parse gives for the whole, on a corpus run
 * through every format and on hostile input (garbage with NULs, 1 MB arguments a byte at
 * a time, nesting 10000 deep). */
#include <check.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "gateway/toolcall.h"
#include "text/chat_template.h"
#include "tests/testutil.h"

#define CT_DIR TEST_DATA "/chat-templates"

static const char *const NAMES[] = {"get_weather", "get_time"};
#define N_NAMES 2

/* ---- Helpers ---- */

/* A check for the hot loops: Check records every passing ck_assert through a pipe, which
 * millions of events would turn into millions of system calls. */
#define REQUIRE(cond, ...)                  \
    do {                                    \
        if (!(cond))                        \
            ck_abort_msg(__VA_ARGS__);      \
    } while (0)

static int id_ok(toolcall_format_t f, const char *id)
{
    size_t n = strlen(id), skip = 0;
    if (f == TOOLCALL_MISTRAL) {
        if (n != 9)
            return 0;
    } else {
        if (n != 29 || strncmp(id, "call_", 5))
            return 0;
        skip = 5;
    }
    for (size_t i = skip; i < n; i++)
        if (!((id[i] >= 'a' && id[i] <= 'z') || (id[i] >= 'A' && id[i] <= 'Z') ||
              (id[i] >= '0' && id[i] <= '9')))
            return 0;
    return 1;
}

/* What a stream's events assemble to, with room to grow (realloc per piece would make a
 * megabyte pushed a byte at a time quadratic in the test, not in the parser). */
typedef struct acc {
    toolcall_result_t r;
    size_t content_cap, *args_cap;
    int open;
} acc_t;

static void acc_put(char **p, size_t *n, size_t *cap, const char *text, size_t len)
{
    if (*n + len + 1 > *cap) {
        *cap = (*n + len + 1) * 2;
        *p = realloc(*p, *cap);
        REQUIRE(*p != NULL, "*p is NULL");
    }
    memcpy(*p + *n, text, len);
    *n += len;
    (*p)[*n] = '\0';
}

/* Adds one push's events, checking what the header promises of them: content as one event
 * between call events, calls started in order and never overlapping, arguments only inside
 * a started call, one end each. */
static void collect(const toolcall_event_t *ev, size_t n, acc_t *a)
{
    toolcall_result_t *out = &a->r;
    for (size_t i = 0; i < n; i++) {
        const toolcall_event_t *e = &ev[i];
        if (i > 0 && e->kind == TOOLCALL_EV_CONTENT)
            REQUIRE(ev[i - 1].kind != TOOLCALL_EV_CONTENT, "two content events in a row");
        switch (e->kind) {
        case TOOLCALL_EV_CONTENT:
            REQUIRE(e->index == -1, "e->index != -1");
            REQUIRE(e->len > 0, "empty event");
            acc_put(&out->content, &out->content_len, &a->content_cap, e->text, e->len);
            break;
        case TOOLCALL_EV_CALL_START: {
            REQUIRE(!a->open, "a call started inside another");
            REQUIRE(e->index == (int)out->n_calls, "e->index != (int)out->n_calls");
            REQUIRE(e->id != NULL, "e->id is NULL");
            REQUIRE(e->name != NULL, "e->name is NULL");
            out->calls = realloc(out->calls, (out->n_calls + 1) * sizeof *out->calls);
            a->args_cap = realloc(a->args_cap, (out->n_calls + 1) * sizeof *a->args_cap);
            a->args_cap[out->n_calls] = 1;
            toolcall_call_t *c = &out->calls[out->n_calls++];
            memset(c, 0, sizeof *c);
            c->id = strdup(e->id);
            c->name = strdup(e->name);
            c->arguments = strdup("");
            a->open = 1;
            break;
        }
        case TOOLCALL_EV_ARGS: {
            REQUIRE(a->open, "arguments outside a call");
            REQUIRE(e->index == (int)out->n_calls - 1, "e->index != (int)out->n_calls - 1");
            REQUIRE(e->len > 0, "empty event");
            toolcall_call_t *c = &out->calls[e->index];
            acc_put(&c->arguments, &c->arguments_len, &a->args_cap[e->index], e->text, e->len);
            break;
        }
        case TOOLCALL_EV_CALL_END:
            REQUIRE(a->open, "an end without a call");
            REQUIRE(e->index == (int)out->n_calls - 1, "e->index != (int)out->n_calls - 1");
            out->calls[e->index].incomplete = e->incomplete;
            a->open = 0;
            break;
        default:
            ck_abort_msg("unknown event kind %d", (int)e->kind);
        }
    }
}

/* Streams text cut at the offsets cuts[] (ascending) and assembles the events. */
static void stream_cuts(toolcall_format_t f, const char *text, size_t len,
                        const char *const *names, size_t n_names, const size_t *cuts,
                        size_t n_cuts, toolcall_result_t *out)
{
    acc_t a;
    memset(&a, 0, sizeof a);
    toolcall_stream_t *s;
    REQUIRE(toolcall_stream_new(&s, f, names, n_names) == 0, "stream_new failed");
    toolcall_event_t *ev;
    size_t n, prev = 0;
    for (size_t i = 0; i <= n_cuts; i++) {
        size_t end = i < n_cuts ? cuts[i] : len;
        REQUIRE(toolcall_stream_push(s, text + prev, end - prev, &ev, &n) == 0, "push failed");
        collect(ev, n, &a);
        prev = end;
    }
    REQUIRE(toolcall_stream_finish(s, &ev, &n) == 0, "finish failed");
    collect(ev, n, &a);
    REQUIRE(!a.open, "a call never ended");
    if (!a.r.content)
        a.r.content = strdup("");
    free(a.args_cap);
    toolcall_stream_destroy(&s);
    REQUIRE(s == NULL, "s is not NULL");
    *out = a.r;
}

static int shown(size_t len)
{
    return len < 300 ? (int)len : 300;
}

static void same_result(toolcall_format_t f, const toolcall_result_t *a,
                        const toolcall_result_t *b, const char *what)
{
    REQUIRE(a->content_len == b->content_len && !memcmp(a->content, b->content, a->content_len),
            "%s (%s): content [%.*s] vs [%.*s]", what, toolcall_format_name(f),
            shown(a->content_len), a->content, shown(b->content_len), b->content);
    REQUIRE(a->n_calls == b->n_calls, "%s (%s): %zu calls vs %zu", what,
            toolcall_format_name(f), a->n_calls, b->n_calls);
    for (size_t i = 0; i < a->n_calls; i++) {
        const toolcall_call_t *x = &a->calls[i], *y = &b->calls[i];
        REQUIRE(!strcmp(x->name, y->name), "%s: call %zu name %s vs %s", what, i, x->name,
                y->name);
        REQUIRE(x->arguments_len == y->arguments_len &&
                    !memcmp(x->arguments, y->arguments, x->arguments_len),
                "%s (%s): call %zu arguments [%.*s] vs [%.*s]", what, toolcall_format_name(f), i,
                shown(x->arguments_len), x->arguments, shown(y->arguments_len), y->arguments);
        REQUIRE(x->incomplete == y->incomplete, "%s: call %zu incomplete %d vs %d", what, i,
                x->incomplete, y->incomplete);
        REQUIRE(id_ok(f, x->id) && id_ok(f, y->id), "bad ids %s %s", x->id, y->id);
    }
}

/* Every two-piece split, byte at a time, and random multi-piece splits stream to what the
 * whole text parses to. Exhaustive splits only up to max_exhaustive bytes. */
static void check_splits_n(toolcall_format_t f, const char *text, size_t len,
                           const char *const *names, size_t n_names, size_t max_exhaustive,
                           int rounds)
{
    toolcall_result_t whole, part;
    ck_assert_int_eq(toolcall_parse(f, text, len, names, n_names, &whole), 0);
    if (len <= max_exhaustive) {
        for (size_t cut = 0; cut <= len; cut++) {
            stream_cuts(f, text, len, names, n_names, &cut, 1, &part);
            same_result(f, &whole, &part, "two pieces");
            toolcall_result_free(&part);
        }
        size_t *all = malloc((len + 1) * sizeof *all);
        for (size_t i = 0; i < len; i++)
            all[i] = i;
        stream_cuts(f, text, len, names, n_names, all, len, &part);
        same_result(f, &whole, &part, "byte at a time");
        toolcall_result_free(&part);
        free(all);
    }
    size_t cuts[64];
    for (int round = 0; round < rounds; round++) {
        size_t n_cuts = test_rand_u32() % 64, prev = 0;
        for (size_t i = 0; i < n_cuts; i++) {
            prev += len ? test_rand_u32() % (len / 8 + 2) : 0;
            cuts[i] = prev < len ? prev : len;
        }
        stream_cuts(f, text, len, names, n_names, cuts, n_cuts, &part);
        same_result(f, &whole, &part, "random pieces");
        toolcall_result_free(&part);
    }
    toolcall_result_free(&whole);
}

static void check_splits(toolcall_format_t f, const char *text, const char *const *names,
                         size_t n_names)
{
    check_splits_n(f, text, strlen(text), names, n_names, 4096, 16);
}

typedef struct want {
    const char *name, *args;
    int incomplete;
} want_t;

/* text parses to content and the calls (names, compact arguments, flags), and streams to
 * the same whatever the split. */
static void expect_n(toolcall_format_t f, const char *text, size_t len,
                     const char *const *names, size_t n_names, const char *content,
                     size_t content_len, const want_t *calls, size_t n_calls)
{
    toolcall_result_t r;
    int rc = toolcall_parse(f, text, len, names, n_names, &r);
    ck_assert_msg(rc == 0, "parse failed: %s", river_err_detail());
    ck_assert_msg(r.content_len == content_len && !memcmp(r.content, content, content_len),
                  "%s [%.*s]: content [%.*s], want [%.*s]", toolcall_format_name(f), (int)len,
                  text, (int)r.content_len, r.content, (int)content_len, content);
    ck_assert_msg(r.n_calls == n_calls, "%s [%.*s]: %zu calls, want %zu",
                  toolcall_format_name(f), (int)len, text, r.n_calls, n_calls);
    for (size_t i = 0; i < n_calls; i++) {
        ck_assert_msg(!strcmp(r.calls[i].name, calls[i].name), "call %zu: name %s, want %s", i,
                      r.calls[i].name, calls[i].name);
        ck_assert_msg(!strcmp(r.calls[i].arguments, calls[i].args),
                      "%s [%.*s] call %zu: arguments [%s], want [%s]", toolcall_format_name(f),
                      (int)len, text, i, r.calls[i].arguments, calls[i].args);
        ck_assert_uint_eq(r.calls[i].arguments_len, strlen(calls[i].args));
        ck_assert_msg(r.calls[i].incomplete == calls[i].incomplete,
                      "call %zu: incomplete %d, want %d", i, r.calls[i].incomplete,
                      calls[i].incomplete);
        ck_assert_msg(id_ok(f, r.calls[i].id), "bad id %s", r.calls[i].id);
    }
    toolcall_result_free(&r);
    ck_assert_ptr_null(r.content);
    check_splits_n(f, text, len, names, n_names, 2048, 16);
}

static void expect(toolcall_format_t f, const char *text, const char *const *names,
                   size_t n_names, const char *content, const want_t *calls, size_t n_calls)
{
    expect_n(f, text, strlen(text), names, n_names, content, strlen(content), calls, n_calls);
}

/* text is all content, exactly. */
static void expect_content(toolcall_format_t f, const char *text, const char *const *names,
                           size_t n_names)
{
    expect(f, text, names, n_names, text, NULL, 0);
}

#define W(name, args) {name, args, 0}
#define W_CUT(name, args) {name, args, 1}

/* ---- Formats ---- */

START_TEST(test_format_detect)
{
    static const struct {
        const char *file;
        toolcall_format_t f;
    } cases[] = {
        {"meta-llama-Llama-3.1-8B-Instruct", TOOLCALL_LLAMA3_JSON},
        {"meta-llama-Llama-3.2-3B-Instruct", TOOLCALL_LLAMA3_JSON},
        {"NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use", TOOLCALL_HERMES},
        {"Qwen-Qwen2.5-7B-Instruct", TOOLCALL_HERMES},
        {"qwen3", TOOLCALL_HERMES},
        {"mistralai-Mistral-Nemo-Instruct-2407", TOOLCALL_MISTRAL},
        {"meetkai-functionary-medium-v3.1", TOOLCALL_FUNCTIONARY},
        {"CohereForAI-c4ai-command-r-plus-tool_use", TOOLCALL_COMMAND_R},
        {"llama3", TOOLCALL_NONE},
        {"google-gemma-2-2b-it", TOOLCALL_NONE},
        {"deepseek-ai-DeepSeek-R1-Distill-Llama-8B", TOOLCALL_NONE},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char path[256];
        snprintf(path, sizeof path, CT_DIR "/%s.jinja", cases[i].file);
        size_t len;
        char *src = test_read_file(path, &len);
        ck_assert_msg(src != NULL, "cannot read %s", path);
        toolcall_format_t got = toolcall_format_detect(src, len);
        ck_assert_msg(got == cases[i].f, "%s: detected %s, want %s", cases[i].file,
                      toolcall_format_name(got), toolcall_format_name(cases[i].f));
        free(src);
    }
    ck_assert_int_eq(toolcall_format_detect(NULL, 0), TOOLCALL_NONE);
    ck_assert_int_eq(toolcall_format_detect("", 0), TOOLCALL_NONE);
    /* Only the bytes given count. */
    ck_assert_int_eq(toolcall_format_detect("<tool_call>", 10), TOOLCALL_NONE);
    ck_assert_int_eq(toolcall_format_detect("<tool_call>", 11), TOOLCALL_HERMES);
}
END_TEST

START_TEST(test_format_names)
{
    for (int i = 0; i < TOOLCALL_N_FORMATS; i++) {
        toolcall_format_t f = (toolcall_format_t)-1;
        ck_assert_int_eq(toolcall_format_from_name(toolcall_format_name(i), &f), 0);
        ck_assert_int_eq(f, i);
    }
    ck_assert_str_eq(toolcall_format_name(TOOLCALL_HERMES), "hermes");
    ck_assert_str_eq(toolcall_format_name(TOOLCALL_N_FORMATS), "?");
    toolcall_format_t f;
    ck_assert_int_eq(toolcall_format_from_name("qwen", &f), RIVER_EINVAL);
    ck_assert_ptr_nonnull(strstr(river_err_detail(), "qwen"));
    ck_assert_int_eq(toolcall_format_from_name(NULL, &f), RIVER_EINVAL);

    ck_assert(toolcall_name_valid("get_weather"));
    ck_assert(toolcall_name_valid("ns.tool-1:v2/x@y"));
    ck_assert(!toolcall_name_valid(""));
    ck_assert(!toolcall_name_valid(NULL));
    ck_assert(!toolcall_name_valid("get weather"));
    ck_assert(!toolcall_name_valid("a\"b"));
    ck_assert(!toolcall_name_valid("a>b"));
    char longname[TOOLCALL_NAME_MAX + 2];
    memset(longname, 'x', sizeof longname);
    longname[TOOLCALL_NAME_MAX] = '\0';
    ck_assert(toolcall_name_valid(longname));
    longname[TOOLCALL_NAME_MAX] = 'x';
    longname[TOOLCALL_NAME_MAX + 1] = '\0';
    ck_assert(!toolcall_name_valid(longname));
}
END_TEST

/* ---- Rendering ---- */

/* jansson's compact dump of a JSON text: the independent check of compact arguments. */
static char *jansson_compact(const char *json)
{
    json_error_t e;
    json_t *v = json_loads(json, JSON_DECODE_ANY, &e);
    ck_assert_msg(v != NULL, "bad test JSON %s: %s", json, e.text);
    char *s = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    json_decref(v);
    return s;
}

START_TEST(test_render_roundtrip)
{
    static const char *const args[] = {
        "{}",
        "{\"city\": \"Paris\", \"days\": 3}",
        " {\n  \"b\" : [1, 2.5, -3, true, false, null, {\"x\": []}],\n  \"a\": \"z\"\n} ",
        "{\"s\": \"quote \\\" backslash \\\\ slash \\/ nl \\n tab \\t cr \\r bs \\b ff \\f "
        "ctl \\u0001 \\u001f e \\u00e9 \\u00E9 emoji \\ud83d\\ude00 raw \xc3\xa9 \xf0\x9f\x98\x80 "
        "del \x7f\"}",
        "{\"z\": 1, \"a\": 2, \"m\": {\"y\": 1, \"b\": 2}}",
        "[1, \"two\"]",
        "\"just a string\"",
        "42",
        "-1.5",
        "null",
        "{\"deep\": [[[[[[[[[[{\"k\": [[]]}]]]]]]]]]]}",
    };
    static const char *const names[] = {"get_weather", "x", "ns.tool-1:v2/x@y"};
    for (int f = 1; f < TOOLCALL_N_FORMATS; f++) {
        for (size_t a = 0; a < sizeof args / sizeof args[0]; a++) {
            for (size_t k = 0; k < 3; k++) {
                char *text;
                int rc = toolcall_render(f, names[k], args[a], &text);
                ck_assert_msg(rc == 0, "render %s %s: %s", toolcall_format_name(f), args[a],
                              river_err_detail());
                /* The call's open and close strings frame it. */
                const char *open = toolcall_call_open(f), *close = toolcall_call_close(f);
                ck_assert(!strncmp(text, open, strlen(open)));
                ck_assert(!strcmp(text + strlen(text) - strlen(close), close));
                char *want = jansson_compact(args[a]);
                want_t w = {names[k], want, 0};
                const char *const one[] = {names[k]};
                expect(f, text, NULL, 0, "", &w, 1);
                expect(f, text, one, 1, "", &w, 1);
                /* Another tool list: the call is content. */
                const char *const other[] = {"other_tool"};
                toolcall_result_t r;
                ck_assert_int_eq(toolcall_parse(f, text, strlen(text), other, 1, &r), 0);
                ck_assert_uint_eq(r.n_calls, 0);
                ck_assert_str_eq(r.content, text);
                toolcall_result_free(&r);
                free(want);
                free(text);
            }
        }
    }
}
END_TEST

START_TEST(test_render_layout)
{
    static const struct {
        toolcall_format_t f;
        const char *want;
    } cases[] = {
        {TOOLCALL_LLAMA3_JSON, "{\"name\": \"f\", \"parameters\": {\"a\":1}}"},
        {TOOLCALL_HERMES, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\":1}}\n</tool_call>"},
        {TOOLCALL_MISTRAL, "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {\"a\":1}}]"},
        {TOOLCALL_FUNCTIONARY, "<function=f>{\"a\":1}</function>"},
        {TOOLCALL_COMMAND_R, "Action:\n```json\n[\n    {\n        \"tool_name\": \"f\",\n"
                             "        \"parameters\": {\"a\":1}\n    }\n]```"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *text;
        ck_assert_int_eq(toolcall_render(cases[i].f, "f", " { \"a\" : 1 } ", &text), 0);
        ck_assert_str_eq(text, cases[i].want);
        free(text);
    }
    ck_assert_str_eq(toolcall_call_open(TOOLCALL_HERMES), "<tool_call>\n");
    ck_assert_str_eq(toolcall_call_close(TOOLCALL_HERMES), "\n</tool_call>");
    ck_assert_str_eq(toolcall_call_open(TOOLCALL_NONE), "");
    ck_assert_str_eq(toolcall_call_close(TOOLCALL_N_FORMATS), "");
}
END_TEST

START_TEST(test_render_errors)
{
    char *out = (char *)"untouched";
    ck_assert_int_eq(toolcall_render(TOOLCALL_NONE, "f", "{}", &out), RIVER_EINVAL);
    ck_assert_ptr_null(out);
    ck_assert_int_eq(toolcall_render(TOOLCALL_N_FORMATS, "f", "{}", &out), RIVER_EINVAL);
    ck_assert_int_eq(toolcall_render(TOOLCALL_HERMES, "bad name", "{}", &out), RIVER_EINVAL);
    ck_assert_ptr_nonnull(strstr(river_err_detail(), "bad name"));
    ck_assert_int_eq(toolcall_render(TOOLCALL_HERMES, NULL, "{}", &out), RIVER_EINVAL);
    ck_assert_int_eq(toolcall_render(TOOLCALL_HERMES, "f", NULL, &out), RIVER_EINVAL);
    static const char *const bad[] = {
        "", "   ", "{", "{}}", "{} {}", "{\"a\":}", "{'a': 1}", "[1,]", "01", "1.", "-",
        "tru", "\"\\x\"", "\"\\ud800\"", "\"\\udc00\"", "\"\xc3\"", "\"\xc0\xaf\"",
        "\"\xed\xa0\x80\"", "\"a\nb\"", "{\"a\" 1}", "nul", "+1", ".5",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int rc = toolcall_render(TOOLCALL_HERMES, "f", bad[i], &out);
        ck_assert_msg(rc == RIVER_EINVAL, "arguments [%s] rendered", bad[i]);
        ck_assert_ptr_null(out);
    }
    ck_assert_int_eq(toolcall_render(TOOLCALL_HERMES, "f", "{}", NULL), RIVER_EINVAL);
}
END_TEST

/* ---- The templates' own renderings ---- */

#define TOOLS_JSON                                                                               \
    "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": "     \
    "\"Get the weather.\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": "  \
    "{\"type\": \"string\", \"description\": \"City name\"}, \"days\": {\"type\": \"integer\", " \
    "\"description\": \"Days ahead\"}}, \"required\": [\"city\"]}}}, {\"type\": \"function\", "  \
    "\"function\": {\"name\": \"get_time\", \"description\": \"Get the time.\", \"parameters\": " \
    "{\"type\": \"object\", \"properties\": {\"zone\": {\"type\": \"string\", \"description\": " \
    "\"Time zone\"}}, \"required\": [\"zone\"]}}}]"

#define USER_MSG "{\"role\": \"user\", \"content\": \"Weather in Zurich, and the time?\"}"
#define CALL_WEATHER(id)                                                                    \
    "{\"id\": \"" id "\", \"type\": \"function\", \"function\": {\"name\": \"get_weather\", " \
    "\"arguments\": {\"city\": \"Z\\u00fcrich\", \"days\": 2}}}"
#define CALL_TIME(id)                                                                    \
    "{\"id\": \"" id "\", \"type\": \"function\", \"function\": {\"name\": \"get_time\", " \
    "\"arguments\": {\"zone\": \"Europe/Zurich\"}}}"
#define ARGS_WEATHER "{\"city\":\"Z\xc3\xbcrich\",\"days\":2}"
#define ARGS_TIME "{\"zone\":\"Europe/Zurich\"}"

typedef struct tmpl_case {
    const char *file, *ctx;
    toolcall_format_t f;
    const char *start, *end; /* the assistant turn: after the last start, up to end */
    const char *content;
    want_t calls[2];
    size_t n_calls;
    int python; /* the tool list has "python" */
} tmpl_case_t;

static const tmpl_case_t TMPL_CASES[] = {
    {"meta-llama-Llama-3.1-8B-Instruct",
     "{\"messages\": [" USER_MSG ", {\"role\": \"assistant\", \"tool_calls\": [" CALL_WEATHER(
         "call_1") "]}], \"tools\": " TOOLS_JSON ", \"bos_token\": \"<|begin_of_text|>\"}",
     TOOLCALL_LLAMA3_JSON, "<|start_header_id|>assistant<|end_header_id|>\n\n", "<|eot_id|>", "",
     {W("get_weather", ARGS_WEATHER)}, 1, 0},
    {"meta-llama-Llama-3.2-3B-Instruct",
     "{\"messages\": [" USER_MSG ", {\"role\": \"assistant\", \"tool_calls\": [" CALL_TIME(
         "call_1") "]}], \"tools\": " TOOLS_JSON ", \"bos_token\": \"<|begin_of_text|>\"}",
     TOOLCALL_LLAMA3_JSON, "<|start_header_id|>assistant<|end_header_id|>\n\n", "<|eot_id|>", "",
     {W("get_time", ARGS_TIME)}, 1, 0},
    {"NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use",
     "{\"messages\": [" USER_MSG ", {\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": "
     "[" CALL_WEATHER("call_1") ", " CALL_TIME("call_2") "]}], \"tools\": " TOOLS_JSON
     ", \"bos_token\": \"<|begin_of_text|>\"}",
     TOOLCALL_HERMES, "<|im_start|>assistant", "<|im_end|>", "",
     {W("get_weather", ARGS_WEATHER), W("get_time", ARGS_TIME)}, 2, 0},
    {"Qwen-Qwen2.5-7B-Instruct",
     "{\"messages\": [" USER_MSG ", {\"role\": \"assistant\", \"content\": \"Let me check.\", "
     "\"tool_calls\": [" CALL_WEATHER("call_1") ", " CALL_TIME("call_2") "]}], \"tools\": "
     TOOLS_JSON "}",
     TOOLCALL_HERMES, "<|im_start|>assistant\n", "<|im_end|>", "Let me check.",
     {W("get_weather", ARGS_WEATHER), W("get_time", ARGS_TIME)}, 2, 0},
    {"qwen3",
     "{\"messages\": [" USER_MSG ", {\"role\": \"assistant\", \"content\": \"Checking both.\", "
     "\"tool_calls\": [" CALL_WEATHER("call_1") ", {\"id\": \"call_2\", \"type\": \"function\", "
     "\"function\": {\"name\": \"get_time\", \"arguments\": \"{\\\"zone\\\": "
     "\\\"Europe/Zurich\\\"}\"}}]}], \"tools\": " TOOLS_JSON "}",
     TOOLCALL_HERMES, "<|im_start|>assistant\n", "<|im_end|>",
     "<think>\n\n</think>\n\nChecking both.",
     {W("get_weather", ARGS_WEATHER), W("get_time", ARGS_TIME)}, 2, 0},
    {"mistralai-Mistral-Nemo-Instruct-2407",
     "{\"messages\": [" USER_MSG ", {\"role\": \"assistant\", \"tool_calls\": [" CALL_WEATHER(
         "abcdefghi") ", " CALL_TIME("ABCDEFGH1") "]}], \"tools\": " TOOLS_JSON
     ", \"bos_token\": \"<s>\", \"eos_token\": \"</s>\"}",
     TOOLCALL_MISTRAL, "[/INST]", "</s>", "",
     {W("get_weather", ARGS_WEATHER), W("get_time", ARGS_TIME)}, 2, 0},
    {"meetkai-functionary-medium-v3.1",
     "{\"messages\": [" USER_MSG ", {\"role\": \"assistant\", \"content\": \"Checking.\", "
     "\"tool_calls\": [{\"id\": \"c1\", \"type\": \"function\", \"function\": {\"name\": "
     "\"get_weather\", \"arguments\": \"{\\\"city\\\": \\\"Z\\u00fcrich\\\", \\\"days\\\": 2}\"}}, "
     "{\"id\": \"c2\", \"type\": \"function\", \"function\": {\"name\": \"get_time\", "
     "\"arguments\": \"{\\\"zone\\\": \\\"Europe/Zurich\\\"}\"}}]}], \"tools\": " TOOLS_JSON
     ", \"bos_token\": \"<|begin_of_text|>\"}",
     TOOLCALL_FUNCTIONARY, "<|start_header_id|>assistant<|end_header_id|>\n\n", "<|eom_id|>",
     "Checking.", {W("get_weather", ARGS_WEATHER), W("get_time", ARGS_TIME)}, 2, 0},
    {"meetkai-functionary-medium-v3.1",
     "{\"messages\": [" USER_MSG ", {\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": "
     "[{\"id\": \"c1\", \"type\": \"function\", \"function\": {\"name\": \"python\", "
     "\"arguments\": \"import math\\nprint(\\\"pi\\\", math.pi)\"}}]}], \"tools\": [{\"type\": "
     "\"code_interpreter\"}], \"bos_token\": \"<|begin_of_text|>\"}",
     TOOLCALL_FUNCTIONARY, "<|start_header_id|>assistant<|end_header_id|>\n\n", "<|eom_id|>", "",
     {W("python", "{\"code\":\"import math\\nprint(\\\"pi\\\", math.pi)\"}")}, 1, 1},
    {"CohereForAI-c4ai-command-r-plus-tool_use",
     "{\"messages\": [" USER_MSG ", {\"role\": \"assistant\", \"content\": \"I will look them "
     "up.\", \"tool_calls\": [" CALL_WEATHER("call_1") ", " CALL_TIME("call_2") "]}], "
     "\"tools\": " TOOLS_JSON ", \"bos_token\": \"<BOS_TOKEN>\", \"eos_token\": "
     "\"<|END_OF_TURN_TOKEN|>\"}",
     TOOLCALL_COMMAND_R, "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>", "<|START_OF_TURN_TOKEN|>",
     "I will look them up.", {W("get_weather", ARGS_WEATHER), W("get_time", ARGS_TIME)}, 2, 0},
};

static const char *memrstr(const char *hay, const char *needle)
{
    const char *last = NULL, *p = hay;
    while ((p = strstr(p, needle)))
        last = p++;
    return last;
}

START_TEST(test_template_turns)
{
    const tmpl_case_t *c = &TMPL_CASES[_i];
    char path[256];
    snprintf(path, sizeof path, CT_DIR "/%s.jinja", c->file);
    size_t len;
    char *src = test_read_file(path, &len);
    ck_assert_ptr_nonnull(src);
    ck_assert_int_eq(toolcall_format_detect(src, len), c->f);
    chat_template_t *t;
    ck_assert_int_eq(chat_template_new(&t, c->file, src), 0);
    json_error_t je;
    json_t *ctx = json_loads(c->ctx, 0, &je);
    ck_assert_msg(ctx != NULL, "bad context: %s", je.text);
    char *out;
    size_t out_len;
    int rc = chat_template_render(t, ctx, &out, &out_len);
    ck_assert_msg(rc == 0, "%s: %s", c->file, river_err_detail());
    const char *turn = memrstr(out, c->start);
    ck_assert_msg(turn != NULL, "%s: no [%s] in [%s]", c->file, c->start, out);
    turn += strlen(c->start);
    const char *end = strstr(turn, c->end);
    ck_assert_msg(end != NULL, "%s: no [%s] after the turn", c->file, c->end);
    char *gen = strndup(turn, (size_t)(end - turn));
    const char *const names[] = {"get_weather", "get_time", "python"};
    expect(c->f, gen, names, c->python ? 3 : 2, c->content, c->calls, c->n_calls);
    expect(c->f, gen, NULL, 0, c->content, c->calls, c->n_calls);
    /* The turn with a tool list that lacks its tools is content, unchanged. */
    const char *const other[] = {"other_tool"};
    expect_content(c->f, gen, other, 1);
    /* And what render makes of the first call parses as the template's does. */
    char *r;
    ck_assert_int_eq(toolcall_render(c->f, c->calls[0].name, c->calls[0].args, &r), 0);
    expect(c->f, r, names, 3, "", c->calls, 1);
    free(r);
    free(gen);
    free(out);
    json_decref(ctx);
    chat_template_destroy(&t);
    free(src);
}
END_TEST

/* ---- Content and calls ---- */

START_TEST(test_hermes)
{
    toolcall_format_t f = TOOLCALL_HERMES;
    want_t w1[] = {W("get_weather", "{\"city\":\"Paris\"}")};
    expect(f, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n"
              "</tool_call>", NAMES, N_NAMES, "", w1, 1);
    want_t w2[] = {W("get_weather", "{\"city\":\"Paris\"}"), W("get_time", "{\"zone\":\"CET\"}")};
    expect(f, "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
              "\"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": "
              "{\"zone\": \"CET\"}}\n</tool_call>", NAMES, N_NAMES, "Let me check.", w2, 2);
    /* Whitespace next to calls is not content; other whitespace is. */
    want_t w3[] = {W("get_time", "{}")};
    expect(f, "<tool_call>{\"name\":\"get_time\",\"arguments\":{}}</tool_call>\n\nDone.  ",
           NAMES, N_NAMES, "Done.  ", w3, 1);
    want_t w4[] = {W("get_time", "{}"), W("get_time", "{\"zone\":\"UTC\"}")};
    expect(f, "A <tool_call>{\"name\":\"get_time\",\"arguments\":{}}</tool_call> B\n"
              "<tool_call>{\"name\":\"get_time\",\"arguments\":{\"zone\":\"UTC\"}}</tool_call>"
              " C", NAMES, N_NAMES, "ABC", w4, 2);
    /* A text without calls is content byte for byte, its whitespace included. */
    expect_content(f, "  Hello,\n\n world!  \n", NAMES, N_NAMES);
    expect_content(f, "", NAMES, N_NAMES);
    /* Members after the arguments are read and ignored; a "type" before the name too;
     * "parameters" is the arguments too. */
    want_t w5[] = {W("get_time", "{\"zone\":\"UTC\"}")};
    expect(f, "<tool_call>{\"name\":\"get_time\",\"arguments\":{\"zone\":\"UTC\"},\"id\":\"x1\","
              "\"extra\":[1,{\"a\":null}],\"n\":-2.5e3}</tool_call>", NAMES, N_NAMES, "", w5, 1);
    expect(f, "<tool_call>{\"type\": \"function\", \"name\": \"get_time\", \"parameters\": "
              "{\"zone\": \"UTC\"}}</tool_call>", NAMES, N_NAMES, "", w5, 1);
    /* No arguments: {}. Scalar arguments as they are. */
    expect(f, "<tool_call>{\"name\": \"get_time\"}</tool_call>", NAMES, N_NAMES, "", w3, 1);
    want_t w6[] = {W("get_time", "42")};
    expect(f, "<tool_call>{\"name\":\"get_time\",\"arguments\":42}</tool_call>", NAMES, N_NAMES,
           "", w6, 1);
    want_t w7[] = {W("get_time", "-0.5e+7")};
    expect(f, "<tool_call>{\"name\":\"get_time\",\"arguments\":-0.5e+7 }\n</tool_call>x", NAMES,
           N_NAMES, "x", w7, 1);
    /* A marker inside content that opens no call. */
    expect_content(f, "Use <tool_call> tags.", NAMES, N_NAMES);
    expect_content(f, "<<tool_call>>", NAMES, N_NAMES);
    expect_content(f, "<tool_call><tool_call>", NAMES, N_NAMES);
    want_t w8[] = {W("get_time", "{}")};
    expect(f, "<tool_call>\n<tool_call>{\"name\":\"get_time\",\"arguments\":{}}</tool_call>",
           NAMES, N_NAMES, "<tool_call>", w8, 1);
    /* A marker that starts inside a broken one. */
    expect(f, "<<tool_call>{\"name\":\"get_time\",\"arguments\":{}}</tool_call>", NAMES,
           N_NAMES, "<", w8, 1);
    expect(f, "x<tool_<tool_call>{\"name\":\"get_time\",\"arguments\":{}}</tool_call>", NAMES,
           N_NAMES, "x<tool_", w8, 1);
    expect(TOOLCALL_FUNCTIONARY, "<function<|python<function=get_time>{}</function>", NAMES,
           N_NAMES, "<function<|python", w8, 1);
}
END_TEST

START_TEST(test_llama3)
{
    toolcall_format_t f = TOOLCALL_LLAMA3_JSON;
    want_t w1[] = {W("get_weather", "{\"city\":\"Paris\"}")};
    expect(f, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}", NAMES,
           N_NAMES, "", w1, 1);
    want_t w2[] = {W("get_weather", "{\"city\":\"Paris\"}"), W("get_time", "{\"zone\":\"UTC\"}")};
    expect(f, "<|python_tag|>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}; "
              "{\"name\": \"get_time\", \"parameters\": {\"zone\": \"UTC\"}}", NAMES, N_NAMES, "",
           w2, 2);
    expect(f, "  \n{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}\n"
              "{\"name\": \"get_time\", \"parameters\": {\"zone\": \"UTC\"}}\n", NAMES, N_NAMES, "",
           w2, 2);
    want_t w3[] = {W("get_time", "{}")};
    expect(f, "Calling.<|python_tag|>{\"name\": \"get_time\", \"parameters\": {}}", NAMES, N_NAMES,
           "Calling.", w3, 1);
    expect(f, "{\"name\": \"get_time\", \"parameters\": {}}; then text;", NAMES, N_NAMES,
           "then text;", w3, 1);
    expect(f, "{\"type\": \"function\", \"name\": \"get_time\", \"parameters\": {}}", NAMES,
           N_NAMES, "", w3, 1);
    /* JSON content, a call after content without the tag, the builtin-tool form. */
    expect_content(f, "{\"answer\": 42}", NAMES, N_NAMES);
    expect_content(f, "  {\"answer\": 42}", NAMES, N_NAMES);
    expect_content(f, "Here: {\"name\": \"get_time\", \"parameters\": {}}", NAMES, N_NAMES);
    expect_content(f, "<|python_tag|>brave_search.call(query=\"x\")", NAMES, N_NAMES);
    expect_content(f, "{\"name\": \"get time\", \"parameters\": {}}", NULL, 0);
    expect_content(f, "{\"name\": 5}", NULL, 0);
    expect_content(f, "{\"type\": \"tool\", \"name\": \"get_time\"}", NULL, 0);
    /* A second call cut after its name: started, so a call, with no arguments. */
    want_t w4[] = {W("get_time", "{}"), W_CUT("get_weather", "")};
    expect(f, "{\"name\": \"get_time\", \"parameters\": {}} {\"name\": \"get_weather\"", NAMES,
           N_NAMES, "", w4, 2);
}
END_TEST

START_TEST(test_mistral)
{
    toolcall_format_t f = TOOLCALL_MISTRAL;
    want_t w2[] = {W("get_weather", "{\"city\":\"Paris\"}"), W("get_time", "{\"zone\":\"UTC\"}")};
    expect(f, "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}, "
              "\"id\": \"abcdefghi\"}, {\"name\": \"get_time\", \"arguments\": {\"zone\": "
              "\"UTC\"}, \"id\": \"123456789\"}]", NAMES, N_NAMES, "", w2, 2);
    want_t w1[] = {W("get_time", "{}")};
    expect(f, "[TOOL_CALLS] [{\"name\": \"get_time\", \"arguments\": {}}]", NAMES, N_NAMES, "",
           w1, 1);
    expect(f, "[TOOL_CALLS]{\"name\": \"get_time\", \"arguments\": {}}", NAMES, N_NAMES, "", w1,
           1);
    expect(f, "Sure.[TOOL_CALLS][{\"name\":\"get_time\",\"arguments\":{}}]", NAMES, N_NAMES,
           "Sure.", w1, 1);
    expect(f, "[TOOL_CALLS][]", NAMES, N_NAMES, "", NULL, 0);
    expect(f, "x [TOOL_CALLS][] y", NAMES, N_NAMES, "xy", NULL, 0);
    expect_content(f, "[TOOL_CALLS] oops", NAMES, N_NAMES);
    expect_content(f, "[TOOL_CALLS][{\"name\": \"rm\", \"arguments\": {}}]", NAMES, N_NAMES);
    /* A broken second element: the first call stands, the rest is content. */
    expect(f, "[TOOL_CALLS][{\"name\":\"get_time\",\"arguments\":{}}, {\"oops\": 1}]", NAMES,
           N_NAMES, "{\"oops\": 1}]", w1, 1);
    /* The list cut after whole arguments: the call is whole. */
    want_t w3[] = {W("get_time", "{\"zone\":\"UTC\"}")};
    expect(f, "[TOOL_CALLS][{\"name\":\"get_time\",\"arguments\":{\"zone\":\"UTC\"}", NAMES,
           N_NAMES, "", w3, 1);
    expect(f, "[TOOL_CALLS][{\"name\":\"get_time\",\"arguments\":{\"zone\":\"UTC\"}, \"id\": \"ab",
           NAMES, N_NAMES, "", w3, 1);
}
END_TEST

START_TEST(test_functionary)
{
    toolcall_format_t f = TOOLCALL_FUNCTIONARY;
    want_t w1[] = {W("get_weather", "{\"city\":\"Paris\"}")};
    expect(f, "<function=get_weather>{\"city\": \"Paris\"}</function>", NAMES, N_NAMES, "", w1, 1);
    want_t w2[] = {W("get_weather", "{\"city\":\"Paris\"}"), W("get_time", "{\"zone\":\"UTC\"}")};
    expect(f, "Checking.<function=get_weather>{\"city\": \"Paris\"}</function>\n"
              "<function=get_time>{\"zone\": \"UTC\"}</function>", NAMES, N_NAMES, "Checking.",
           w2, 2);
    want_t w3[] = {W("get_time", "{}")};
    expect(f, "<function=get_time>{}</function> Done.", NAMES, N_NAMES, "Done.", w3, 1);
    expect_content(f, "<function=get time>{}</function>", NULL, 0);
    expect_content(f, "<function=>{}</function>", NULL, 0);
    expect_content(f, "<function=nope>{}</function>", NAMES, N_NAMES);
    /* A missing close: the call is whole, what follows is content. */
    want_t w4[] = {W("get_time", "{\"zone\":\"UTC\"}")};
    expect(f, "<function=get_time>{\"zone\": \"UTC\"} <b>bold</b>", NAMES, N_NAMES,
           "<b>bold</b>", w4, 1);
    /* Python: the code to the end, escaped, invalid UTF-8 replaced. */
    want_t w5[] = {W("python", "{\"code\":\"print(\\\"hi\\\")\\n\\ttab \\\\ \\u0001 \xc3\xa9"
                               " \xef\xbf\xbd\xef\xbf\xbdx \xef\xbf\xbd\"}")};
    const char *const with_python[] = {"get_time", "python"};
    expect(f, "<|python_tag|>print(\"hi\")\n\ttab \\ \x01 \xc3\xa9 \xff\xc3x \xe2\x82", with_python,
           2, "", w5, 1);
    expect(f, "<|python_tag|>print(\"hi\")\n\ttab \\ \x01 \xc3\xa9 \xff\xc3x \xe2\x82", NULL, 0,
           "", w5, 1);
    want_t w6[] = {W("python", "{\"code\":\"\"}")};
    expect(f, "Run it.\n<|python_tag|>", NULL, 0, "Run it.", w6, 1);
    expect_content(f, "<|python_tag|>print(1)", NAMES, N_NAMES);
}
END_TEST

START_TEST(test_command_r)
{
    toolcall_format_t f = TOOLCALL_COMMAND_R;
    want_t w1[] = {W("get_weather", "{\"city\":\"Paris\"}")};
    expect(f, "I will look up the weather.\nAction:\n```json\n[\n    {\n        \"tool_name\": "
              "\"get_weather\",\n        \"parameters\": {\n            \"city\": \"Paris\"\n"
              "        }\n    }\n]```\n", NAMES, N_NAMES, "I will look up the weather.", w1, 1);
    want_t w2[] = {W("get_weather", "{\"city\":\"Paris\"}"), W("get_time", "{\"zone\":\"UTC\"}")};
    expect(f, "Action: ```json\n[{\"tool_name\": \"get_weather\", \"parameters\": {\"city\": "
              "\"Paris\"}}, {\"tool_name\": \"get_time\", \"parameters\": {\"zone\": \"UTC\"}}]\n"
              "```", NAMES, N_NAMES, "", w2, 2);
    expect_content(f, "Action: I think so", NAMES, N_NAMES);
    expect_content(f, "Action:\n```python\nprint(1)\n```", NAMES, N_NAMES);
    expect(f, "Plan: do it.\nAction: ```json\n[]\n```", NAMES, N_NAMES, "Plan: do it.", NULL, 0);
    expect(f, "Action: ```json\n[{\"tool_name\": \"get_weather\", \"parameters\": {\"city\": "
              "\"Paris\"}}]``` And more.", NAMES, N_NAMES, "And more.", w1, 1);
}
END_TEST

START_TEST(test_none)
{
    /* No format: every marker is text. */
    const char *texts[] = {
        "<tool_call>{\"name\":\"get_time\",\"arguments\":{}}</tool_call>",
        "{\"name\": \"get_time\", \"parameters\": {}}",
        "  trailing  \n",
    };
    for (size_t i = 0; i < 3; i++)
        expect_content(TOOLCALL_NONE, texts[i], NULL, 0);
}
END_TEST

/* ---- Arguments ---- */

START_TEST(test_arguments_compact)
{
    toolcall_format_t f = TOOLCALL_HERMES;
    static const struct {
        const char *in, *want;
    } cases[] = {
        /* Whitespace goes, key order and duplicates stay. */
        {" { \"b\" : 1 ,\n\t\"a\" : [ ] , \"b\" : { } } ", "{\"b\":1,\"a\":[],\"b\":{}}"},
        /* Escapes: decoded to UTF-8, re-escaped as jansson does. */
        {"\"\\u00e9\\u00C9\\u20ac\\ud83d\\ude00\"", "\"\xc3\xa9\xc3\x89\xe2\x82\xac\xf0\x9f\x98\x80\""},
        {"\"\\/\\\"\\\\\\b\\f\\n\\r\\t\"", "\"/\\\"\\\\\\b\\f\\n\\r\\t\""},
        {"\"\\u0000\\u0001\\u001f\\u0020\\u007f\\u0022\\u005c\"",
         "\"\\u0000\\u0001\\u001F \x7f\\\"\\\\\""},
        /* Numbers exactly as written, however large. */
        {"[0, -0, 1.50, 1e5, 1E+5, -2.5e-3, 123456789012345678901234567890]",
         "[0,-0,1.50,1e5,1E+5,-2.5e-3,123456789012345678901234567890]"},
        {"[true,false,null]", "[true,false,null]"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char text[512];
        snprintf(text, sizeof text,
                 "<tool_call>{\"name\": \"get_time\", \"arguments\": %s}</tool_call>", cases[i].in);
        want_t w = {"get_time", cases[i].want, 0};
        expect(f, text, NAMES, N_NAMES, "", &w, 1);
    }
}
END_TEST

START_TEST(test_incomplete_calls)
{
    toolcall_format_t f = TOOLCALL_HERMES;
    /* Cut by the end of the text: the arguments as far as they got. */
    want_t w1[] = {W_CUT("get_weather", "{\"city\":\"Par")};
    expect(f, "<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Par", NAMES,
           N_NAMES, "", w1, 1);
    want_t w2[] = {W_CUT("get_weather", "")};
    expect(f, "<tool_call>{\"name\": \"get_weather\", \"argum", NAMES, N_NAMES, "", w2, 1);
    expect(f, "<tool_call>{\"name\": \"get_weather\"", NAMES, N_NAMES, "", w2, 1);
    /* A number at the end of the text may be whole. */
    want_t w3[] = {W("get_weather", "12")};
    expect(f, "<tool_call>{\"name\": \"get_weather\", \"arguments\": 12", NAMES, N_NAMES, "", w3,
           1);
    want_t w4[] = {W_CUT("get_weather", "12.")};
    expect(f, "<tool_call>{\"name\": \"get_weather\", \"arguments\": 12.", NAMES, N_NAMES, "",
           w4, 1);
    /* A JSON error: the call ends there, the rest is content again. */
    want_t w5[] = {W_CUT("get_weather", "{\"city\":\"Paris\",")};
    expect(f, "<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\",, }}"
              "</tool_call> tail", NAMES, N_NAMES, ", }}</tool_call> tail", w5, 1);
    /* ... where another call may start. */
    want_t w6[] = {W_CUT("get_weather", "{\"city\":"), W("get_time", "{}")};
    expect(f, "<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": <tool_call>"
              "{\"name\":\"get_time\",\"arguments\":{}}</tool_call>", NAMES, N_NAMES, "", w6, 2);
    /* Another key where the arguments belong. */
    want_t w7[] = {W_CUT("get_time", "")};
    expect(f, "<tool_call>{\"name\": \"get_time\", \"zone\": \"UTC\"}</tool_call>", NAMES,
           N_NAMES, ", \"zone\": \"UTC\"}</tool_call>", w7, 1);
    expect(f, "<tool_call>{\"name\": \"get_time\" , }</tool_call>x", NAMES, N_NAMES,
           ", }</tool_call>x", w7, 1);
    /* Invalid UTF-8, a lone surrogate, a raw control character in a string. */
    want_t w8[] = {W_CUT("get_time", "{\"zone\":\"a")};
    const char *bad[] = {"\xff", "\xc3(", "\xe0\x80\x80", "\xed\xa0\x80", "\xf4\x90\x80\x80",
                         "\\ud800x", "\\udc00", "\\ud800\\u0041", "\n", "\\q", "\\u12g4"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char text[256];
        int n = snprintf(text, sizeof text, "<tool_call>{\"name\": \"get_time\", \"arguments\": "
                                            "{\"zone\": \"a%s\"}}</tool_call>", bad[i]);
        toolcall_result_t r;
        ck_assert_int_eq(toolcall_parse(f, text, (size_t)n, NAMES, N_NAMES, &r), 0);
        ck_assert_uint_eq(r.n_calls, 1);
        ck_assert_msg(r.calls[0].incomplete, "[%s] was accepted", bad[i]);
        ck_assert_str_eq(r.calls[0].arguments, w8[0].args);
        toolcall_result_free(&r);
        check_splits(f, text, NAMES, N_NAMES);
    }
}
END_TEST

START_TEST(test_malformed_is_content)
{
    static const char *const hermes[] = {
        "<tool_call>\nnot json\n</tool_call>",
        "<tool_call>{\"function\": \"get_time\"}</tool_call>",
        "<tool_call>{\"arguments\": {}, \"name\": \"get_time\"}</tool_call>",
        "<tool_call>{\"name\": \"get_\\u0074ime\", \"arguments\": {}}</tool_call>",
        "<tool_call>{\"name\": \"\", \"arguments\": {}}</tool_call>",
        "<tool_call>{\"na\\me\": \"get_time\"}",
        "<tool_call>[{\"name\": \"get_time\"}]",
        "Sure <tool_call>{\"name\": \"get_wea",
        "Hello <tool_ca",
        "<tool_call>{\"type\": \"function\", \"type\": \"function\", \"name\": \"get_time\"}",
        "<tool_call>{\"name\": \"rm_rf\", \"arguments\": {}}</tool_call>",
    };
    for (size_t i = 0; i < sizeof hermes / sizeof hermes[0]; i++)
        expect_content(TOOLCALL_HERMES, hermes[i], NAMES, N_NAMES);
    /* Too long a name. */
    char text[512];
    char name[TOOLCALL_NAME_MAX + 2];
    memset(name, 'n', sizeof name - 1);
    name[sizeof name - 1] = '\0';
    snprintf(text, sizeof text, "<tool_call>{\"name\": \"%s\", \"arguments\": {}}</tool_call>",
             name);
    expect_content(TOOLCALL_HERMES, text, NULL, 0);
    name[TOOLCALL_NAME_MAX] = '\0';
    snprintf(text, sizeof text, "<tool_call>{\"name\": \"%s\", \"arguments\": {}}</tool_call>",
             name);
    want_t w = {name, "{}", 0};
    expect(TOOLCALL_HERMES, text, NULL, 0, "", &w, 1);
}
END_TEST

START_TEST(test_tool_names)
{
    const char *text = "<tool_call>{\"name\": \"get_time\", \"arguments\": {}}</tool_call>"
                       "<tool_call>{\"name\": \"get_weather\", \"arguments\": {}}</tool_call>";
    /* Only the listed tools are calls; the others are content. */
    const char *const only_time[] = {"get_time"};
    want_t w1[] = {W("get_time", "{}")};
    expect(TOOLCALL_HERMES, text, only_time, 1,
           "<tool_call>{\"name\": \"get_weather\", \"arguments\": {}}</tool_call>", w1, 1);
    /* A listed name that is a prefix or extension of the generated one does not match. */
    const char *const near[] = {"get_tim", "get_times", "get_weather"};
    want_t w2[] = {W("get_weather", "{}")};
    expect(TOOLCALL_HERMES, text, near, 3,
           "<tool_call>{\"name\": \"get_time\", \"arguments\": {}}</tool_call>", w2, 1);
    /* An empty list is no list. */
    want_t w3[] = {W("get_time", "{}"), W("get_weather", "{}")};
    expect(TOOLCALL_HERMES, text, near, 0, "", w3, 2);
    /* The list is copied. */
    char *mine = strdup("get_time");
    const char *const dyn[] = {mine};
    toolcall_stream_t *s;
    ck_assert_int_eq(toolcall_stream_new(&s, TOOLCALL_HERMES, dyn, 1), 0);
    memset(mine, 'x', strlen(mine));
    toolcall_event_t *ev;
    size_t n;
    ck_assert_int_eq(toolcall_stream_push(s, text, strlen(text), &ev, &n), 0);
    ck_assert_uint_ge(n, 1);
    ck_assert_int_eq(ev[0].kind, TOOLCALL_EV_CALL_START);
    ck_assert_str_eq(ev[0].name, "get_time");
    toolcall_stream_destroy(&s);
    free(mine);
}
END_TEST

START_TEST(test_ids)
{
    for (int f = 1; f < TOOLCALL_N_FORMATS; f++) {
        char *one;
        ck_assert_int_eq(toolcall_render(f, "get_time", "{}", &one), 0);
        size_t n = strlen(one);
        char *text = malloc(8 * n + 1);
        for (int k = 0; k < 8; k++)
            memcpy(text + k * n, one, n);
        text[8 * n] = '\0';
        toolcall_result_t a, b;
        ck_assert_int_eq(toolcall_parse(f, text, 8 * n, NULL, 0, &a), 0);
        ck_assert_int_eq(toolcall_parse(f, text, 8 * n, NULL, 0, &b), 0);
        ck_assert_msg(a.n_calls == 8, "%s: %zu calls",
                      toolcall_format_name(f), a.n_calls);
        for (size_t i = 0; i < a.n_calls; i++) {
            ck_assert_msg(id_ok(f, a.calls[i].id), "%s: id %s", toolcall_format_name(f),
                          a.calls[i].id);
            for (size_t j = 0; j < i; j++)
                ck_assert_str_ne(a.calls[i].id, a.calls[j].id);
            ck_assert_str_ne(a.calls[i].id, b.calls[i].id);
        }
        /* The Mistral template takes back what it gets. */
        if (f == TOOLCALL_MISTRAL)
            ck_assert_uint_eq(strlen(a.calls[0].id), 9);
        toolcall_result_free(&a);
        toolcall_result_free(&b);
        free(text);
        free(one);
    }
}
END_TEST

/* ---- Streaming ---- */

static int push_str(toolcall_stream_t *s, const char *text, toolcall_event_t **ev, size_t *n)
{
    return toolcall_stream_push(s, text, strlen(text), ev, n);
}

static size_t count_kind(const toolcall_event_t *ev, size_t n, toolcall_event_kind_t k)
{
    size_t c = 0;
    for (size_t i = 0; i < n; i++)
        c += ev[i].kind == k;
    return c;
}

START_TEST(test_stream_events)
{
    toolcall_stream_t *s;
    toolcall_event_t *ev;
    size_t n;
    ck_assert_int_eq(toolcall_stream_new(&s, TOOLCALL_HERMES, NAMES, N_NAMES), 0);
    /* Content goes out at once, less trailing whitespace and a possible marker. */
    ck_assert_int_eq(push_str(s, "Hello there <tool_c", &ev, &n), 0);
    ck_assert_uint_eq(n, 1);
    ck_assert_int_eq(ev[0].kind, TOOLCALL_EV_CONTENT);
    ck_assert_uint_eq(ev[0].len, 11);
    ck_assert(!memcmp(ev[0].text, "Hello there", 11));
    /* The header is held until the name is whole, then the call starts. */
    ck_assert_int_eq(push_str(s, "all>\n{\"name\": \"get_wea", &ev, &n), 0);
    ck_assert_uint_eq(n, 0);
    ck_assert_int_eq(push_str(s, "ther\"", &ev, &n), 0);
    ck_assert_uint_eq(n, 1);
    ck_assert_int_eq(ev[0].kind, TOOLCALL_EV_CALL_START);
    ck_assert_int_eq(ev[0].index, 0);
    ck_assert_str_eq(ev[0].name, "get_weather");
    ck_assert(id_ok(TOOLCALL_HERMES, ev[0].id));
    char id0[64];
    snprintf(id0, sizeof id0, "%s", ev[0].id);
    /* Arguments leave compact as they arrive, nothing buffered but an open escape. */
    ck_assert_int_eq(push_str(s, ", \"arguments\": { \"city\" : \"Pa", &ev, &n),
                     0);
    ck_assert_uint_eq(n, 1);
    ck_assert_int_eq(ev[0].kind, TOOLCALL_EV_ARGS);
    ck_assert_int_eq(ev[0].index, 0);
    ck_assert_uint_eq(ev[0].len, 11);
    ck_assert(!memcmp(ev[0].text, "{\"city\":\"Pa", 11));
    ck_assert_int_eq(push_str(s, "ris\\u00", &ev, &n), 0);
    ck_assert_uint_eq(n, 1);
    ck_assert_uint_eq(ev[0].len, 3);
    ck_assert_int_eq(push_str(s, "e9\xc3", &ev, &n), 0);
    ck_assert_uint_eq(n, 1);
    ck_assert_uint_eq(ev[0].len, 2);
    ck_assert(!memcmp(ev[0].text, "\xc3\xa9", 2));
    ck_assert_int_eq(push_str(s, "\xa9\"}", &ev, &n), 0);
    ck_assert_uint_eq(n, 2);
    ck_assert_int_eq(ev[0].kind, TOOLCALL_EV_ARGS);
    ck_assert_uint_eq(ev[0].len, 4);
    ck_assert(!memcmp(ev[0].text, "\xc3\xa9\"}", 4));
    ck_assert_int_eq(ev[1].kind, TOOLCALL_EV_CALL_END);
    ck_assert_int_eq(ev[1].index, 0);
    ck_assert_int_eq(ev[1].incomplete, 0);
    /* A second call in one push (breaking the first one's trailing syntax, which is then
     * dropped as whitespace): every event in order. */
    const char *more = " <tool_call>{\"name\":\"get_time\",\"arguments\":{\"zone\":\"UTC\"}}"
                       "</tool_call>\nBye ";
    ck_assert_int_eq(toolcall_stream_push(s, more, strlen(more), &ev, &n), 0);
    ck_assert_uint_eq(n, 4);
    ck_assert_int_eq(ev[0].kind, TOOLCALL_EV_CALL_START);
    ck_assert_int_eq(ev[0].index, 1);
    ck_assert_str_ne(ev[0].id, id0);
    ck_assert_int_eq(ev[1].kind, TOOLCALL_EV_ARGS);
    ck_assert_uint_eq(ev[1].len, strlen("{\"zone\":\"UTC\"}"));
    ck_assert_int_eq(ev[2].kind, TOOLCALL_EV_CALL_END);
    ck_assert_int_eq(ev[3].kind, TOOLCALL_EV_CONTENT);
    ck_assert_uint_eq(ev[3].len, 3);
    /* The end lets out held whitespace; nothing may follow. */
    ck_assert_int_eq(toolcall_stream_finish(s, &ev, &n), 0);
    ck_assert_uint_eq(n, 1);
    ck_assert_uint_eq(ev[0].len, 1);
    ck_assert_int_eq(push_str(s, "x", &ev, &n), RIVER_ESTATE);
    ck_assert_ptr_null(ev);
    ck_assert_uint_eq(n, 0);
    ck_assert_int_eq(toolcall_stream_finish(s, &ev, &n), RIVER_ESTATE);
    toolcall_stream_destroy(&s);
    ck_assert_ptr_null(s);
    toolcall_stream_destroy(&s);
    toolcall_stream_destroy(NULL);

    /* An unfinished call ends at finish, flagged. */
    ck_assert_int_eq(toolcall_stream_new(&s, TOOLCALL_MISTRAL, NULL, 0), 0);
    ck_assert_int_eq(push_str(s, "[TOOL_CALLS][{\"name\":\"f\",\"arguments\":{\"a\":[1", &ev, &n),
                     0);
    ck_assert_uint_eq(count_kind(ev, n, TOOLCALL_EV_CALL_START), 1);
    ck_assert_uint_eq(count_kind(ev, n, TOOLCALL_EV_CALL_END), 0);
    ck_assert_int_eq(toolcall_stream_finish(s, &ev, &n), 0);
    ck_assert_uint_eq(n, 1);
    ck_assert_int_eq(ev[0].kind, TOOLCALL_EV_CALL_END);
    ck_assert_int_eq(ev[0].incomplete, 1);
    toolcall_stream_destroy(&s);

    /* Empty pushes are fine; bad arguments are refused. */
    ck_assert_int_eq(toolcall_stream_new(&s, TOOLCALL_HERMES, NULL, 0), 0);
    ck_assert_int_eq(toolcall_stream_push(s, NULL, 0, &ev, &n), 0);
    ck_assert_uint_eq(n, 0);
    ck_assert_int_eq(toolcall_stream_push(s, NULL, 3, &ev, &n), RIVER_EINVAL);
    ck_assert_int_eq(toolcall_stream_push(s, "x", 1, NULL, &n), RIVER_EINVAL);
    ck_assert_int_eq(toolcall_stream_push(NULL, "x", 1, &ev, &n), RIVER_EINVAL);
    toolcall_stream_destroy(&s);
    ck_assert_int_eq(toolcall_stream_new(&s, TOOLCALL_N_FORMATS, NULL, 0), RIVER_EINVAL);
    ck_assert_ptr_null(s);
    ck_assert_int_eq(toolcall_stream_new(&s, TOOLCALL_HERMES, NULL, 2), RIVER_EINVAL);
    ck_assert_int_eq(toolcall_stream_new(NULL, TOOLCALL_HERMES, NULL, 0), RIVER_EINVAL);
    toolcall_result_t r;
    ck_assert_int_eq(toolcall_parse(TOOLCALL_HERMES, NULL, 1, NULL, 0, &r), RIVER_EINVAL);
    ck_assert_int_eq(toolcall_parse(TOOLCALL_HERMES, "x", 1, NULL, 0, NULL), RIVER_EINVAL);
    ck_assert_int_eq(toolcall_parse(TOOLCALL_HERMES, NULL, 0, NULL, 0, &r), 0);
    ck_assert_str_eq(r.content, "");
    ck_assert_uint_eq(r.n_calls, 0);
    toolcall_result_free(&r);
    toolcall_result_free(NULL);
}
END_TEST

/* Texts for the split invariant: run through every format, with and without a tool list,
 * each is a mix of calls, near-calls and content for some format. */
static const char *const CORPUS[] = {
    "",
    " ",
    "plain text, no calls at all\n",
    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
    "a <tool_call>{\"name\":\"get_time\",\"arguments\":{}}</tool_call> b <tool_call>{\"name\":"
    "\"get_time\",\"arguments\":{\"zone\":\"UTC\"}}</tool_call> c ",
    "<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\",, }}</tool_call>",
    "<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Par",
    "<tool_call>{\"name\": \"get_time\", \"zone\": 1}<tool_call>{\"name\": \"get_time\"}",
    "<<tool_call><tool_call>{\"name\": \"get_wea\"ther\"}",
    "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}",
    " {\"name\": \"get_time\", \"parameters\": {}}; {\"name\": \"get_weather\", \"arguments\": "
    "{\"city\": \"Rome\", \"days\": 10}};\n ok",
    "x<|python_tag|>{\"name\": \"get_time\", \"parameters\": {\"zone\": \"\\ud83d\\ude00\"}}",
    "{\"answer\": [1, 2, {\"name\": \"get_time\"}]}",
    "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}, \"id\": "
    "\"abcdefghi\"}, {\"name\": \"get_time\", \"arguments\": {\"zone\": \"UTC\"}}]",
    "[TOOL_CALLS] {\"name\": \"get_time\", \"arguments\": 1.5e3} tail",
    "[TOOL_CALLS][{\"name\":\"get_time\",\"arguments\":{}}, {\"oops\": 1}] [TOOL_CALLS][]",
    "Checking.<function=get_weather>{\"city\": \"Paris\"}</function>\n<function=get_time>"
    "{\"zone\": \"UTC\"}</function> <function=get time>{}</function>",
    "<function=get_time>{\"zone\": \"UTC\"} <b>bold</b>",
    "Run:\n<|python_tag|>print(\"\\\\n\")\n\t\xc3\xa9\xff\x01",
    "Plan.\nAction:\n```json\n[\n    {\n        \"tool_name\": \"get_weather\",\n        "
    "\"parameters\": {\n            \"city\": \"Paris\"\n        }\n    }\n]```\n",
    "Action: ```json\n[{\"tool_name\": \"get_time\", \"parameters\": {}}, {\"tool_name\": 2}]",
    "Action: nothing. [TOOL_CALLS [TOOL_CALLS] <tool <function <|python",
    "<tool_call>{\"name\": \"get_time\", \"arguments\": [[[[[[[1]]]]]], {\"a\": \"\\u00e9\"}]}"
    "</tool_call>",
    "<tool_call>{\"name\": \"get_time\", \"arguments\": {\"a\": \"\xe2\x82\xac\xf0\x9f\x98\x80\""
    "}}</tool_call>",
    "<tool_call>{\"name\": \"get_time\", \"arguments\": 12",
    "<tool_call>{\"type\": \"function\", \"name\": \"get_time\", \"arguments\": null, \"x\": "
    "[1, 2.5, \"s\"]}\n</tool_cal",
};

START_TEST(test_split_invariance)
{
    test_rand_seed(TEST_RAND_SEED);
    for (size_t i = 0; i < sizeof CORPUS / sizeof CORPUS[0]; i++) {
        for (int f = 0; f < TOOLCALL_N_FORMATS; f++) {
            check_splits(f, CORPUS[i], NULL, 0);
            check_splits(f, CORPUS[i], NAMES, N_NAMES);
        }
    }
    /* The corpus glued together, and with NULs in it. */
    size_t total = 0;
    for (size_t i = 0; i < sizeof CORPUS / sizeof CORPUS[0]; i++)
        total += strlen(CORPUS[i]) + 1;
    char *all = malloc(total);
    size_t at = 0;
    for (size_t i = 0; i < sizeof CORPUS / sizeof CORPUS[0]; i++) {
        memcpy(all + at, CORPUS[i], strlen(CORPUS[i]));
        at += strlen(CORPUS[i]);
        all[at++] = i % 3 ? '\n' : '\0';
    }
    for (int f = 0; f < TOOLCALL_N_FORMATS; f++)
        check_splits_n(f, all, at, NAMES, N_NAMES, 0, 16);
    free(all);
}
END_TEST

/* ---- Hostile input ---- */

/* Random text built from fragments of every format's syntax, random bytes and NULs. */
static char *garbage(size_t len)
{
    static const char *const frags[] = {
        "<tool_call>", "</tool_call>", "[TOOL_CALLS]", "<function=", "</function>",
        "<|python_tag|>", "Action:", "```json", "{", "}", "[", "]", "\"name\"", "\"arguments\"",
        "\"parameters\"", "\"tool_name\"", ":", ",", "\"get_time\"", " ", "\n", "\\", "\\u",
        "\"", "1", "-", "e", "true", "\xff", "\xc3", "\xa9", "\xed\xa0\x80", "{\"name\": \"f\", ",
        "\"arguments\": {", "get_time>",
    };
    char *t = malloc(len + 64);
    size_t n = 0;
    while (n < len) {
        uint32_t r = test_rand_u32();
        if (r % 4 == 0) {
            t[n++] = (char)(r >> 8);
        } else {
            const char *fr = frags[(r >> 8) % (sizeof frags / sizeof frags[0])];
            size_t k = strlen(fr);
            memcpy(t + n, fr, k);
            n += k;
        }
    }
    return t;
}

START_TEST(test_hostile_garbage)
{
    test_rand_seed(TEST_RAND_SEED ^ 0x5a5a);
    for (int round = 0; round < 40; round++) {
        size_t len = round < 2 ? 400 : 64 + test_rand_u32() % 2000;
        char *t = garbage(len);
        for (int f = 0; f < TOOLCALL_N_FORMATS; f++) {
            check_splits_n(f, t, len, NULL, 0, round < 2 ? len : 0, 16);
            check_splits_n(f, t, len, NAMES, N_NAMES, 0, 16);
        }
        free(t);
    }
    /* One megabyte of it, a byte at a time against whole. */
    size_t len = 1 << 20;
    char *t = garbage(len);
    size_t *cuts = malloc(len * sizeof *cuts);
    for (size_t i = 0; i < len; i++)
        cuts[i] = i;
    for (int f = 0; f < TOOLCALL_N_FORMATS; f++) {
        toolcall_result_t whole, part;
        ck_assert_int_eq(toolcall_parse(f, t, len, NULL, 0, &whole), 0);
        stream_cuts(f, t, len, NULL, 0, cuts, len - 1, &part);
        same_result(f, &whole, &part, "1 MB byte at a time");
        /* Nothing is made up: content and arguments are at most the text's size. */
        ck_assert_uint_le(whole.content_len, len);
        if (f == TOOLCALL_NONE)
            ck_assert(whole.content_len == len && !memcmp(whole.content, t, len));
        toolcall_result_free(&whole);
        toolcall_result_free(&part);
    }
    free(cuts);
    free(t);
}
END_TEST

START_TEST(test_hostile_large)
{
    /* 1 MB of arguments, a byte at a time. */
    const char *head = "<tool_call>{\"name\": \"get_time\", \"arguments\": {\"data\": \"";
    const char *tail = "\"}}</tool_call>";
    size_t big = 1 << 20, hl = strlen(head), tl = strlen(tail);
    char *t = malloc(hl + big + tl);
    memcpy(t, head, hl);
    for (size_t i = 0; i < big; i++)
        t[hl + i] = (char)('a' + i % 26);
    memcpy(t + hl + big, tail, tl);
    size_t len = hl + big + tl;
    toolcall_stream_t *s;
    ck_assert_int_eq(toolcall_stream_new(&s, TOOLCALL_HERMES, NAMES, N_NAMES), 0);
    size_t args_len = 0, starts = 0, ends = 0;
    for (size_t i = 0; i < len; i++) {
        toolcall_event_t *ev;
        size_t n;
        ck_assert_int_eq(toolcall_stream_push(s, t + i, 1, &ev, &n), 0);
        for (size_t k = 0; k < n; k++) {
            ck_assert_int_ne(ev[k].kind, TOOLCALL_EV_CONTENT);
            starts += ev[k].kind == TOOLCALL_EV_CALL_START;
            ends += ev[k].kind == TOOLCALL_EV_CALL_END;
            if (ev[k].kind == TOOLCALL_EV_ARGS)
                args_len += ev[k].len;
        }
    }
    toolcall_stream_destroy(&s);
    ck_assert_uint_eq(starts, 1);
    ck_assert_uint_eq(ends, 1);
    ck_assert_uint_eq(args_len, big + strlen("{\"data\":\"\"}"));
    toolcall_result_t r;
    ck_assert_int_eq(toolcall_parse(TOOLCALL_HERMES, t, len, NAMES, N_NAMES, &r), 0);
    ck_assert_uint_eq(r.n_calls, 1);
    ck_assert_uint_eq(r.calls[0].arguments_len, args_len);
    ck_assert_uint_eq(r.content_len, 0);
    toolcall_result_free(&r);
    free(t);

    /* Nesting 10000 deep: cut at TOOLCALL_MAX_DEPTH, the rest is content. */
    size_t depth = 10000;
    head = "<tool_call>{\"name\": \"get_time\", \"arguments\": ";
    hl = strlen(head);
    t = malloc(hl + 2 * depth + 32);
    memcpy(t, head, hl);
    memset(t + hl, '[', depth);
    memset(t + hl + depth, ']', depth);
    memcpy(t + hl + 2 * depth, "}</tool_call>", 13);
    len = hl + 2 * depth + 13;
    ck_assert_int_eq(toolcall_parse(TOOLCALL_HERMES, t, len, NAMES, N_NAMES, &r), 0);
    ck_assert_uint_eq(r.n_calls, 1);
    ck_assert_int_eq(r.calls[0].incomplete, 1);
    ck_assert_uint_eq(r.calls[0].arguments_len, TOOLCALL_MAX_DEPTH);
    ck_assert_uint_eq(r.content_len, len - hl - TOOLCALL_MAX_DEPTH);
    toolcall_result_free(&r);
    check_splits_n(TOOLCALL_HERMES, t, len, NAMES, N_NAMES, 0, 4);
    /* At the limit it is whole. */
    depth = TOOLCALL_MAX_DEPTH;
    memset(t + hl, '[', depth);
    memset(t + hl + depth, ']', depth);
    memcpy(t + hl + 2 * depth, "}</tool_call>", 13);
    len = hl + 2 * depth + 13;
    ck_assert_int_eq(toolcall_parse(TOOLCALL_HERMES, t, len, NAMES, N_NAMES, &r), 0);
    ck_assert_uint_eq(r.n_calls, 1);
    ck_assert_int_eq(r.calls[0].incomplete, 0);
    ck_assert_uint_eq(r.calls[0].arguments_len, 2 * depth);
    ck_assert_uint_eq(r.content_len, 0);
    toolcall_result_free(&r);
    free(t);

    /* Unbalanced braces, endless whitespace, endless open headers, NULs. */
    static const char *const units[] = {"{", "}", "[TOOL_CALLS][", "<tool_call>{\"name\": \"",
                                        " ", "{\"name\": \"get_time\"}", "\0"};
    for (size_t u = 0; u < sizeof units / sizeof units[0]; u++) {
        size_t ul = strlen(units[u]) ? strlen(units[u]) : 1, reps = (64 << 10) / ul;
        t = malloc(ul * reps);
        for (size_t i = 0; i < reps; i++)
            memcpy(t + i * ul, units[u], ul);
        for (int f = 0; f < TOOLCALL_N_FORMATS; f++)
            check_splits_n(f, t, ul * reps, NULL, 0, 0, 4);
        free(t);
    }
}
END_TEST

static Suite *toolcall_suite(void)
{
    Suite *s = suite_create("toolcall");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_format_detect);
    tcase_add_test(tc, test_format_names);
    tcase_add_test(tc, test_render_roundtrip);
    tcase_add_test(tc, test_render_layout);
    tcase_add_test(tc, test_render_errors);
    tcase_add_loop_test(tc, test_template_turns, 0,
                        (int)(sizeof TMPL_CASES / sizeof TMPL_CASES[0]));
    tcase_add_test(tc, test_hermes);
    tcase_add_test(tc, test_llama3);
    tcase_add_test(tc, test_mistral);
    tcase_add_test(tc, test_functionary);
    tcase_add_test(tc, test_command_r);
    tcase_add_test(tc, test_none);
    tcase_add_test(tc, test_arguments_compact);
    tcase_add_test(tc, test_incomplete_calls);
    tcase_add_test(tc, test_malformed_is_content);
    tcase_add_test(tc, test_tool_names);
    tcase_add_test(tc, test_ids);
    tcase_add_test(tc, test_stream_events);
    tcase_add_test(tc, test_split_invariance);
    tcase_add_test(tc, test_hostile_garbage);
    tcase_add_test(tc, test_hostile_large);
    suite_add_tcase(s, tc);
    return s;
}

RIVER_TEST_MAIN(toolcall_suite)
