/* OpenAI requests in, OpenAI responses out: the body of POST /v1/chat/completions and
 * /v1/completions validated into a gw_request_t (every refusal names its field), and the
 * JSON of responses, stream chunks and the model list. No I/O here: the fuzz target
 * `openai_request` drives gw_request_parse directly. */
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "common/exit_names.h"
#include "gateway/gateway.h"

#define GW_MAX_STOP 64          /* riverd's limits.max_stop_strings decides below this */
#define GW_MAX_PROMPT_IDS (1 << 24)

/* ---- Field readers: each returns 0, or -1 with err naming the field ---- */

static int oa__bool(json_t *o, const char *key, int *out, gw_error_t *err)
{
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_boolean(v))
        return gw_error_set(err, GW_ERR_INVALID, key, "'%s' must be a boolean", key);
    *out = json_is_true(v);
    return 0;
}

static int oa__number(json_t *o, const char *key, const char *param, double lo, double hi,
                      int *has, double *out, gw_error_t *err)
{
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_number(v))
        return gw_error_set(err, GW_ERR_INVALID, param, "'%s' must be a number", param);
    double d = json_number_value(v);
    if (!(d >= lo && d <= hi))
        return gw_error_set(err, GW_ERR_INVALID, param, "'%s' must be in [%g, %g], got %g",
                            param, lo, hi, d);
    *out = d;
    if (has)
        *has = 1;
    return 0;
}

static int oa__int(json_t *o, const char *key, const char *param, json_int_t lo, json_int_t hi,
                   int *has, json_int_t *out, gw_error_t *err)
{
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_integer(v))
        return gw_error_set(err, GW_ERR_INVALID, param, "'%s' must be an integer", param);
    json_int_t i = json_integer_value(v);
    if (i < lo || i > hi)
        return gw_error_set(err, GW_ERR_INVALID, param,
                            "'%s' must be in [%lld, %lld], got %lld", param, (long long)lo,
                            (long long)hi, (long long)i);
    *out = i;
    if (has)
        *has = 1;
    return 0;
}

/* A message's content as one string: text parts joined with newlines (as vLLM does for
 * templates that expect a string); other part types are refused. */
static int oa__flatten_content(json_t *msg, size_t idx, gw_error_t *err)
{
    char param[96];
    snprintf(param, sizeof param, "messages[%zu].content", idx);
    json_t *c = json_object_get(msg, "content");
    if (!c || json_is_null(c) || json_is_string(c))
        return 0;
    if (!json_is_array(c))
        return gw_error_set(err, GW_ERR_INVALID, param,
                            "'%s' must be a string or an array of text parts", param);
    size_t total = 0, i;
    json_t *part;
    json_array_foreach(c, i, part) {
        const char *type = json_string_value(json_object_get(part, "type"));
        json_t *t = json_object_get(part, "text");
        if (!json_is_object(part) || !type || strcmp(type, "text") || !json_is_string(t))
            return gw_error_set(err, GW_ERR_INVALID, param,
                                "'%s[%zu]' must be {\"type\": \"text\", \"text\": ...}: only "
                                "text parts are supported", param, i);
        total += json_string_length(t) + 1;
    }
    char *buf = malloc(total + 1);
    if (!buf)
        return gw_error_set(err, GW_ERR_INTERNAL, NULL, "out of memory");
    size_t n = 0;
    json_array_foreach(c, i, part) {
        json_t *t = json_object_get(part, "text");
        if (i)
            buf[n++] = '\n';
        memcpy(buf + n, json_string_value(t), json_string_length(t));
        n += json_string_length(t);
    }
    json_t *s = json_stringn(buf, n);
    free(buf);
    if (!s || json_object_set_new(msg, "content", s))
        return gw_error_set(err, GW_ERR_INVALID, param, "'%s' is not valid UTF-8", param);
    return 0;
}

static int oa__messages(gw_request_t *r, gw_error_t *err)
{
    json_t *m = json_object_get(r->root, "messages");
    if (!m)
        return gw_error_set(err, GW_ERR_INVALID, "messages", "'messages' is required");
    if (!json_is_array(m) || json_array_size(m) == 0)
        return gw_error_set(err, GW_ERR_INVALID, "messages",
                            "'messages' must be a non-empty array of messages");
    size_t i;
    json_t *msg;
    json_array_foreach(m, i, msg) {
        char param[96];
        if (!json_is_object(msg))
            return gw_error_set(err, GW_ERR_INVALID, "messages",
                                "'messages[%zu]' must be an object", i);
        snprintf(param, sizeof param, "messages[%zu].role", i);
        if (!json_is_string(json_object_get(msg, "role")))
            return gw_error_set(err, GW_ERR_INVALID, param, "'%s' must be a string", param);
        if (oa__flatten_content(msg, i, err))
            return -1;
    }
    r->messages = m;
    json_t *tools = json_object_get(r->root, "tools");
    if (tools && !json_is_null(tools)) {
        if (!json_is_array(tools))
            return gw_error_set(err, GW_ERR_INVALID, "tools", "'tools' must be an array");
        r->tools = tools;
    }
    json_t *kw = json_object_get(r->root, "chat_template_kwargs");
    if (kw && !json_is_null(kw)) {
        if (!json_is_object(kw))
            return gw_error_set(err, GW_ERR_INVALID, "chat_template_kwargs",
                                "'chat_template_kwargs' must be an object");
        r->template_kwargs = kw;
    }
    r->add_generation_prompt = 1;
    return oa__bool(r->root, "add_generation_prompt", &r->add_generation_prompt, err);
}

/* prompt: a string, a list of one string, or token ids (a list of integers, or a list of
 * one such list). Several prompts would be several choices, which n = 1 rules out. */
static int oa__prompt(gw_request_t *r, gw_error_t *err)
{
    json_t *p = json_object_get(r->root, "prompt");
    if (!p)
        return gw_error_set(err, GW_ERR_INVALID, "prompt", "'prompt' is required");
    if (json_is_array(p) && json_array_size(p) == 1 &&
        (json_is_string(json_array_get(p, 0)) || json_is_array(json_array_get(p, 0))))
        p = json_array_get(p, 0);
    if (json_is_string(p)) {
        if (json_string_length(p) == 0)
            return gw_error_set(err, GW_ERR_INVALID, "prompt", "'prompt' is empty");
        if (strlen(json_string_value(p)) != json_string_length(p))
            return gw_error_set(err, GW_ERR_INVALID, "prompt", "'prompt' holds a NUL");
        r->prompt = json_string_value(p);
        return 0;
    }
    if (!json_is_array(p) || json_array_size(p) == 0)
        return gw_error_set(err, GW_ERR_INVALID, "prompt",
                            "'prompt' must be a string or an array of token ids (one prompt: "
                            "n = 1)");
    size_t n = json_array_size(p);
    if (n > GW_MAX_PROMPT_IDS)
        return gw_error_set(err, GW_ERR_INVALID, "prompt", "'prompt' has %zu ids", n);
    r->prompt_ids = malloc(n * sizeof *r->prompt_ids);
    if (!r->prompt_ids)
        return gw_error_set(err, GW_ERR_INTERNAL, NULL, "out of memory");
    for (size_t i = 0; i < n; i++) {
        json_t *v = json_array_get(p, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 ||
            json_integer_value(v) > INT32_MAX)
            return gw_error_set(err, GW_ERR_INVALID, "prompt",
                                "'prompt' must be a string or one list of token ids (one "
                                "prompt: n = 1); entry %zu is neither", i);
        r->prompt_ids[i] = (int32_t)json_integer_value(v);
    }
    r->n_prompt_ids = n;
    return 0;
}

static int oa__stop(gw_request_t *r, gw_error_t *err)
{
    json_t *s = json_object_get(r->root, "stop");
    if (!s || json_is_null(s))
        return 0;
    size_t n = json_is_string(s) ? 1 : json_is_array(s) ? json_array_size(s) : 0;
    if (!json_is_string(s) && !json_is_array(s))
        return gw_error_set(err, GW_ERR_INVALID, "stop",
                            "'stop' must be a string or an array of strings");
    if (n > GW_MAX_STOP)
        return gw_error_set(err, GW_ERR_INVALID, "stop", "'stop' has %zu strings, at most %d",
                            n, GW_MAX_STOP);
    if (n == 0)
        return 0;
    r->stop = calloc(n, sizeof *r->stop);
    if (!r->stop)
        return gw_error_set(err, GW_ERR_INTERNAL, NULL, "out of memory");
    for (size_t i = 0; i < n; i++) {
        json_t *v = json_is_string(s) ? s : json_array_get(s, i);
        if (!json_is_string(v) || json_string_length(v) == 0 ||
            strlen(json_string_value(v)) != json_string_length(v))
            return gw_error_set(err, GW_ERR_INVALID, "stop",
                                "'stop' entries must be non-empty strings");
        r->stop[i] = json_string_value(v);
    }
    r->n_stop = n;
    return 0;
}

/* The `river` extension: exit policy override and what the response reports. */
static int oa__river(gw_request_t *r, gw_error_t *err)
{
    json_t *x = json_object_get(r->root, "river");
    if (!x || json_is_null(x))
        return 0;
    if (!json_is_object(x))
        return gw_error_set(err, GW_ERR_INVALID, "river", "'river' must be an object");
    json_t *p = json_object_get(x, "policy");
    if (p && !json_is_null(p)) {
        const char *s = json_string_value(p);
        int k = s ? exit_names_find(exit_names_rules, s) : -1;
        if (k < 0)
            return gw_error_set(err, GW_ERR_INVALID, "river.policy",
                                "'river.policy' must be one of none, cosine, router, fixed");
        r->policy = exit_names_rules[k];
    }
    json_int_t layer = 0;
    if (oa__number(x, "tau", "river.tau", -1, 1, &r->has_tau, &r->tau, err) ||
        oa__number(x, "theta", "river.theta", 0, 1, &r->has_theta, &r->theta, err) ||
        oa__int(x, "exit_layer", "river.exit_layer", 0, 4096, &r->has_exit_layer, &layer,
                err))
        return -1;
    r->exit_layer = (int)layer;
    /* Lossless mode: the exit path drafts and the backbone verifies, so the completion is
     * the backbone's own. */
    json_t *ll = json_object_get(x, "lossless");
    if (ll && !json_is_null(ll)) {
        if (!json_is_boolean(ll))
            return gw_error_set(err, GW_ERR_INVALID, "river.lossless",
                                "'river.lossless' must be a boolean");
        r->lossless = json_is_true(ll) ? 1 : -1;
    }
    int has_draft = 0;
    json_int_t draft = 0;
    if (oa__int(x, "draft_tokens", "river.draft_tokens", 1, 16, &has_draft, &draft, err))
        return -1;
    r->draft_tokens = (int)draft;
    json_t *gr = json_object_get(x, "grammar");
    if (gr && !json_is_null(gr)) {
        if (!json_is_string(gr) || json_string_length(gr) == 0 ||
            strlen(json_string_value(gr)) != json_string_length(gr))
            return gw_error_set(err, GW_ERR_INVALID, "river.grammar",
                                "'river.grammar' must be grammar text (GBNF, root rule root)");
        r->river_grammar = json_string_value(gr);
    }
    static const struct {
        const char *key, *param;
        size_t offset;
    } flags[] = {
        {"exit_layers", "river.exit_layers", offsetof(gw_request_t, want_exit_layers)},
        {"token_ids", "river.token_ids", offsetof(gw_request_t, want_token_ids)},
        {"prompt", "river.prompt", offsetof(gw_request_t, want_prompt)},
        {"ignore_eos", "river.ignore_eos", offsetof(gw_request_t, ignore_eos)},
    };
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++) {
        json_t *b = json_object_get(x, flags[i].key);
        if (b && !json_is_null(b) && !json_is_boolean(b))
            return gw_error_set(err, GW_ERR_INVALID, flags[i].param, "'%s' must be a boolean",
                                flags[i].param);
        *(int *)((char *)r + flags[i].offset) = json_is_true(b);
    }
    return 0;
}

/* Log-probabilities: chat takes logprobs (a boolean) and top_logprobs (0..20, with
 * logprobs true); completions take logprobs N (0..20), the sampled token and the N most
 * likely ones. */
static int oa__logprobs(gw_request_t *r, gw_error_t *err)
{
    json_int_t top = 0;
    int has_top = 0;
    if (r->api == GW_API_CHAT) {
        if (oa__bool(r->root, "logprobs", &r->logprobs, err) ||
            oa__int(r->root, "top_logprobs", "top_logprobs", 0, RIVER_TOP_LOGPROBS_MAX,
                    &has_top, &top, err))
            return -1;
        if (has_top && !r->logprobs)
            return gw_error_set(err, GW_ERR_INVALID, "top_logprobs",
                                "'top_logprobs' needs 'logprobs' true");
    } else {
        if (oa__int(r->root, "logprobs", "logprobs", 0, RIVER_TOP_LOGPROBS_MAX, &has_top, &top,
                    err))
            return -1;
        r->logprobs = has_top;
    }
    r->top_logprobs = (int)top;
    return 0;
}

/* tool_choice: "none", "auto", "required" or {"type": "function", "function": {"name"}}
 * naming one of the tools; the default is auto with tools and none without. */
static int oa__tool_choice(gw_request_t *r, gw_error_t *err)
{
    json_t *tc = json_object_get(r->root, "tool_choice");
    r->tool_choice = r->tools && json_array_size(r->tools) ? GW_TOOL_CHOICE_AUTO
                                                          : GW_TOOL_CHOICE_NONE;
    if (!tc || json_is_null(tc))
        return 0;
    static const char *const names[] = {"auto", "none", "required"};
    const char *s = json_string_value(tc);
    if (json_is_string(tc)) {
        size_t i = 0;
        while (i < 3 && strcmp(s, names[i]))
            i++;
        if (i == 3)
            return gw_error_set(err, GW_ERR_INVALID, "tool_choice",
                                "'tool_choice' must be none, auto, required or a function");
        r->tool_choice = (gw_tool_choice_t)i;
    } else {
        json_t *f = json_object_get(tc, "function");
        const char *type = json_string_value(json_object_get(tc, "type"));
        r->tool_name = json_string_value(json_object_get(f, "name"));
        if (!json_is_object(tc) || !type || strcmp(type, "function") || !r->tool_name)
            return gw_error_set(err, GW_ERR_INVALID, "tool_choice",
                                "'tool_choice' as an object must be {\"type\": \"function\", "
                                "\"function\": {\"name\": ...}}");
        r->tool_choice = GW_TOOL_CHOICE_NAMED;
    }
    if (r->tool_choice == GW_TOOL_CHOICE_NONE || r->tool_choice == GW_TOOL_CHOICE_AUTO)
        return 0;
    if (!r->tools || json_array_size(r->tools) == 0)
        return gw_error_set(err, GW_ERR_INVALID, "tool_choice",
                            "'tool_choice' %s needs 'tools'", r->tool_name ? "naming a function"
                                                                           : "required");
    size_t i;
    json_t *t;
    json_array_foreach(r->tools, i, t) {
        const char *name = json_string_value(json_object_get(json_object_get(t, "function"),
                                                             "name"));
        if (!r->tool_name || (name && !strcmp(name, r->tool_name)))
            return 0;
    }
    return gw_error_set(err, GW_ERR_INVALID, "tool_choice",
                        "'tool_choice' names the function '%s', which is not in 'tools'",
                        r->tool_name);
}

/* tools: an array of {"type": "function", "function": {"name", "description"?,
 * "parameters"?}}, names unique. */
static int oa__tools(gw_request_t *r, gw_error_t *err)
{
    size_t i;
    json_t *t;
    json_array_foreach(r->tools, i, t) {
        char param[64];
        snprintf(param, sizeof param, "tools[%zu]", i);
        json_t *f = json_object_get(t, "function");
        const char *type = json_string_value(json_object_get(t, "type"));
        const char *name = json_string_value(json_object_get(f, "name"));
        json_t *params = json_object_get(f, "parameters");
        if (!json_is_object(t) || !type || strcmp(type, "function") || !json_is_object(f) ||
            !name || !name[0])
            return gw_error_set(err, GW_ERR_INVALID, param,
                                "'%s' must be {\"type\": \"function\", \"function\": "
                                "{\"name\": ...}}", param);
        if (params && !json_is_null(params) && !json_is_object(params))
            return gw_error_set(err, GW_ERR_INVALID, param,
                                "'%s.function.parameters' must be a JSON Schema object", param);
        for (size_t j = 0; j < i; j++)
            if (!strcmp(name, json_string_value(json_object_get(
                                  json_object_get(json_array_get(r->tools, j), "function"),
                                  "name"))))
                return gw_error_set(err, GW_ERR_INVALID, param,
                                    "'%s' repeats the function name '%s'", param, name);
    }
    return 0;
}

/* Assistant messages' tool_calls carry their arguments as a JSON string (OpenAI's form);
 * templates read them as a mapping (transformers' form), so a string that parses to an
 * object is handed over parsed. */
static int oa__tool_call_args(gw_request_t *r, gw_error_t *err)
{
    size_t i, j;
    json_t *msg, *tc;
    json_array_foreach(r->messages, i, msg) {
        json_t *calls = json_object_get(msg, "tool_calls");
        if (!calls || json_is_null(calls))
            continue;
        if (!json_is_array(calls))
            return gw_error_set(err, GW_ERR_INVALID, "messages",
                                "'messages[%zu].tool_calls' must be an array", i);
        json_array_foreach(calls, j, tc) {
            json_t *f = json_object_get(tc, "function");
            json_t *a = json_object_get(f, "arguments");
            if (!json_is_object(f) || !json_is_string(json_object_get(f, "name")))
                return gw_error_set(err, GW_ERR_INVALID, "messages",
                                    "'messages[%zu].tool_calls[%zu].function' must have a "
                                    "name", i, j);
            if (!json_is_string(a))
                continue;
            json_t *v = json_loadb(json_string_value(a), json_string_length(a),
                                   JSON_DECODE_ANY, NULL);
            if (json_is_object(v))
                json_object_set_new(f, "arguments", v);
            else
                json_decref(v);
        }
    }
    return 0;
}

/* response_format: {"type": "text"}, {"type": "json_object"} or {"type": "json_schema",
 * "json_schema": {"name", "schema", "strict"}}. The schema is compiled when the request's
 * grammar is built (gateway/constrain.c). */
static int oa__response_format(gw_request_t *r, gw_error_t *err)
{
    json_t *rf = json_object_get(r->root, "response_format");
    if (!rf || json_is_null(rf))
        return 0;
    const char *type = json_string_value(json_object_get(rf, "type"));
    if (!json_is_object(rf) || !type)
        return gw_error_set(err, GW_ERR_INVALID, "response_format",
                            "'response_format' must be an object with a 'type'");
    if (!strcmp(type, "text"))
        return 0;
    r->json_mode = 1;
    if (!strcmp(type, "json_object"))
        return 0;
    if (strcmp(type, "json_schema"))
        return gw_error_set(err, GW_ERR_INVALID, "response_format.type",
                            "'response_format.type' must be text, json_object or json_schema");
    json_t *js = json_object_get(rf, "json_schema");
    json_t *sc = json_object_get(js, "schema");
    if (!json_is_object(js) || (sc && !json_is_null(sc) && !json_is_object(sc) &&
                                !json_is_boolean(sc)))
        return gw_error_set(err, GW_ERR_INVALID, "response_format.json_schema",
                            "'response_format.json_schema' must be an object whose 'schema' "
                            "is a JSON Schema");
    r->response_schema = sc && !json_is_null(sc) ? sc : NULL;
    return 0;
}

/* Fields River does not implement are refused rather than silently ignored, because a
 * client relying on them would get something else than it asked for. */
static int oa__refused(gw_request_t *r, gw_error_t *err)
{
    json_int_t n = 1;
    if (oa__int(r->root, "n", "n", INT64_MIN, INT64_MAX, NULL, &n, err))
        return -1;
    if (n != 1)
        return gw_error_set(err, GW_ERR_INVALID, "n",
                            "'n' must be 1: River returns one choice per request");
    json_t *bo = json_object_get(r->root, "best_of");
    if (bo && !json_is_null(bo) && !(json_is_integer(bo) && json_integer_value(bo) == 1))
        return gw_error_set(err, GW_ERR_INVALID, "best_of", "'best_of' must be 1");
    json_t *echo = json_object_get(r->root, "echo");
    if (json_is_true(echo))
        return gw_error_set(err, GW_ERR_INVALID, "echo", "'echo' is not supported by River");
    return 0;
}

int gw_request_parse(gw_request_t *r, gw_api_t api, const char *body, size_t len,
                     double default_temperature, gw_error_t *err)
{
    memset(r, 0, sizeof *r);
    r->api = api;
    r->temperature = default_temperature;
    r->top_p = 1.0;
    json_error_t je;
    r->root = json_loadb(body, len, 0, &je); /* duplicate keys: the last wins, as in Python */
    if (!r->root)
        return gw_error_set(err, GW_ERR_INVALID, NULL,
                            "the body is not valid JSON: %s (line %d, column %d)", je.text,
                            je.line, je.column);
    if (!json_is_object(r->root))
        return gw_error_set(err, GW_ERR_INVALID, NULL, "the body must be a JSON object");
    json_t *model = json_object_get(r->root, "model");
    if (!model)
        return gw_error_set(err, GW_ERR_INVALID, "model", "'model' is required");
    if (!json_is_string(model) || json_string_length(model) == 0)
        return gw_error_set(err, GW_ERR_INVALID, "model", "'model' must be a non-empty string");
    r->model = json_string_value(model);
    if ((api == GW_API_CHAT ? oa__messages(r, err) : oa__prompt(r, err)) ||
        oa__refused(r, err) || oa__stop(r, err) || oa__river(r, err) ||
        oa__logprobs(r, err) || oa__response_format(r, err))
        return -1;
    if (api == GW_API_CHAT && ((r->tools && oa__tools(r, err)) || oa__tool_choice(r, err) ||
                               oa__tool_call_args(r, err)))
        return -1;
    if (oa__bool(r->root, "stream", &r->stream, err))
        return -1;
    json_t *so = json_object_get(r->root, "stream_options");
    if (so && !json_is_null(so)) {
        if (!json_is_object(so))
            return gw_error_set(err, GW_ERR_INVALID, "stream_options",
                                "'stream_options' must be an object");
        json_t *iu = json_object_get(so, "include_usage");
        if (iu && !json_is_null(iu) && !json_is_boolean(iu))
            return gw_error_set(err, GW_ERR_INVALID, "stream_options.include_usage",
                                "'stream_options.include_usage' must be a boolean");
        r->include_usage = json_is_true(iu);
    }
    json_int_t mt = 0, seed = 0;
    int has_mt = 0;
    /* max_completion_tokens is the newer name; a request with both uses it. */
    if (oa__int(r->root, "max_completion_tokens", "max_completion_tokens", 1, 1 << 24,
                &has_mt, &mt, err))
        return -1;
    if (!has_mt && oa__int(r->root, "max_tokens", "max_tokens", 1, 1 << 24, NULL, &mt, err))
        return -1;
    r->max_tokens = (uint32_t)mt;
    if (oa__number(r->root, "temperature", "temperature", 0, 2, NULL, &r->temperature, err) ||
        oa__number(r->root, "top_p", "top_p", 0, 1, NULL, &r->top_p, err))
        return -1;
    if (r->top_p <= 0)
        return gw_error_set(err, GW_ERR_INVALID, "top_p", "'top_p' must be in (0, 1]");
    if (oa__int(r->root, "seed", "seed", INT64_MIN, INT64_MAX, &r->has_seed, &seed, err))
        return -1;
    r->seed = (uint64_t)seed;
    return 0;
}

void gw_request_free(gw_request_t *r)
{
    free(r->grammar);
    free(r->prompt_ids);
    free(r->stop);
    json_decref(r->root);
    memset(r, 0, sizeof *r);
}

/* ---- Responses ---- */

const char *gw_finish_reason(river_finish_t f)
{
    return f == RIVER_FINISH_LENGTH || f == RIVER_FINISH_CONTEXT ? "length" : "stop";
}

static json_t *oa__ints(const int32_t *v, size_t n)
{
    json_t *a = json_array();
    for (size_t i = 0; a && i < n; i++)
        json_array_append_new(a, json_integer(v[i]));
    return a;
}

/* Model text is valid UTF-8 (the worker's streaming decoder never splits a character);
 * should it not be, the client gets U+FFFD rather than no response. */
static json_t *oa__text(const char *s, size_t n)
{
    json_t *t = json_stringn(s ? s : "", s ? n : 0);
    return t ? t : json_string("\xef\xbf\xbd");
}

/* OpenAI's stand-in for the log-probability of a token that cannot be chosen (JSON has no
 * infinity). */
#define OA_LOGPROB_FLOOR -9999.0

static json_t *oa__logprob_real(float lp)
{
    return json_real(isfinite(lp) ? (double)lp : OA_LOGPROB_FLOOR);
}

/* A token's text as OpenAI writes it: its bytes when they are whole UTF-8, else
 * "bytes:\xNN..." (a token that holds part of a character). */
static json_t *oa__token_text(const char *t, size_t n)
{
    json_t *s = json_stringn(t ? t : "", t ? n : 0);
    if (s)
        return s;
    char *buf = malloc(6 + 4 * n + 1);
    if (!buf)
        return json_string("");
    size_t k = (size_t)sprintf(buf, "bytes:");
    for (size_t i = 0; i < n; i++)
        k += (size_t)sprintf(buf + k, "\\x%02x", (unsigned char)t[i]);
    s = json_stringn(buf, k);
    free(buf);
    return s;
}

static json_t *oa__bytes(const char *t, size_t n)
{
    json_t *a = json_array();
    for (size_t i = 0; a && i < n; i++)
        json_array_append_new(a, json_integer((unsigned char)t[i]));
    return a;
}

json_t *gw_logprob_json(const river_token_logprob_t *lp)
{
    json_t *top = json_array();
    for (size_t i = 0; top && i < lp->n_top; i++)
        json_array_append_new(top, json_pack("{s:o,s:o,s:o}", "token",
                                             oa__token_text(lp->top[i].token,
                                                            lp->top[i].token_len),
                                             "logprob", oa__logprob_real(lp->top[i].logprob),
                                             "bytes", oa__bytes(lp->top[i].token,
                                                                lp->top[i].token_len)));
    return json_pack("{s:o,s:o,s:o,s:o}", "token", oa__token_text(lp->token, lp->token_len),
                     "logprob", oa__logprob_real(lp->logprob), "bytes",
                     oa__bytes(lp->token, lp->token_len), "top_logprobs",
                     top ? top : json_array());
}

/* A choice's logprobs: chat's {"content": [...], "refusal": null}, or the completions
 * form {"tokens", "token_logprobs", "top_logprobs", "text_offset"} (offsets in bytes of
 * the completion, counted from *offset, which moves past these tokens). */
static json_t *oa__logprobs_json(const gw_request_t *r, json_t *entries, size_t *offset)
{
    if (!r->logprobs)
        return json_null();
    if (r->api == GW_API_CHAT)
        return json_pack("{s:O,s:n}", "content", entries ? entries : json_array(), "refusal");
    json_t *toks = json_array(), *lps = json_array(), *tops = json_array(),
           *offs = json_array();
    size_t i;
    json_t *e;
    json_array_foreach(entries, i, e) {
        json_t *tok = json_object_get(e, "token");
        json_array_append(toks, tok);
        json_array_append(lps, json_object_get(e, "logprob"));
        json_t *m = json_object(), *t;
        size_t j;
        json_array_foreach(json_object_get(e, "top_logprobs"), j, t)
            json_object_set(m, json_string_value(json_object_get(t, "token")),
                            json_object_get(t, "logprob"));
        json_array_append_new(tops, m);
        json_array_append_new(offs, json_integer((json_int_t)*offset));
        *offset += json_array_size(json_object_get(e, "bytes"));
    }
    return json_pack("{s:o,s:o,s:o,s:o}", "tokens", toks, "token_logprobs", lps,
                     "top_logprobs", tops, "text_offset", offs);
}

/* The River extension of one choice: exit layers and token ids when asked. */
static void oa__choice_river(const gw_request_t *r, json_t *choice, const gw_piece_t *p)
{
    if (!r->want_exit_layers && !r->want_token_ids)
        return;
    json_t *x = json_object();
    if (r->want_exit_layers)
        json_object_set_new(x, "exit_layers", oa__ints(p->exit_layers, p->n_exit_layers));
    if (r->want_token_ids)
        json_object_set_new(x, "token_ids", oa__ints(p->ids, p->n_ids));
    json_object_set_new(choice, "river", x);
}

static json_t *oa__envelope(const gw_request_t *r, const char *id, int64_t created,
                            const char *object)
{
    return json_pack("{s:s,s:s,s:I,s:s,s:s}", "id", id, "object", object, "created",
                     (json_int_t)created, "model", r->model, "system_fingerprint", "river");
}

json_t *gw_chunk_json(const gw_request_t *r, const char *id, int64_t created,
                      const gw_piece_t *p, const char *finish, int role_only, size_t *offset)
{
    int chat = r->api == GW_API_CHAT;
    json_t *o = oa__envelope(r, id, created, chat ? "chat.completion.chunk" : "text_completion");
    json_t *choice = json_pack("{s:i,s:o}", "index", 0, "logprobs",
                               p && p->logprobs ? oa__logprobs_json(r, p->logprobs, offset)
                                                : json_null());
    if (chat) {
        json_t *delta = json_object();
        if (role_only) {
            json_object_set_new(delta, "role", json_string("assistant"));
            json_object_set_new(delta, "content", json_string(""));
        } else if (p && p->text_len) {
            json_object_set_new(delta, "content", oa__text(p->text, p->text_len));
        }
        if (p && p->tool_calls)
            json_object_set(delta, "tool_calls", p->tool_calls);
        json_object_set_new(choice, "delta", delta);
    } else {
        json_object_set_new(choice, "text", oa__text(p ? p->text : "", p ? p->text_len : 0));
    }
    json_object_set_new(choice, "finish_reason", finish ? json_string(finish) : json_null());
    if (p)
        oa__choice_river(r, choice, p);
    json_object_set_new(o, "choices", json_pack("[o]", choice));
    /* With include_usage OpenAI sends "usage": null on every chunk but the last. */
    if (r->include_usage)
        json_object_set_new(o, "usage", json_null());
    return o;
}

static json_t *oa__usage(const gw_usage_t *u)
{
    return json_pack("{s:i,s:i,s:i,s:{s:i}}", "prompt_tokens", (int)u->prompt_tokens,
                     "completion_tokens", (int)u->completion_tokens, "total_tokens",
                     (int)(u->prompt_tokens + u->completion_tokens),
                     "prompt_tokens_details", "cached_tokens", (int)u->cached_tokens);
}

json_t *gw_usage_chunk_json(const gw_request_t *r, const char *id, int64_t created,
                            const gw_usage_t *u)
{
    int chat = r->api == GW_API_CHAT;
    json_t *o = oa__envelope(r, id, created, chat ? "chat.completion.chunk" : "text_completion");
    json_object_set_new(o, "choices", json_array());
    json_object_set_new(o, "usage", oa__usage(u));
    return o;
}

json_t *gw_response_json(const gw_request_t *r, const char *id, int64_t created,
                         const gw_piece_t *p, const char *finish, const gw_usage_t *u,
                         const char *prompt)
{
    int chat = r->api == GW_API_CHAT;
    json_t *o = oa__envelope(r, id, created, chat ? "chat.completion" : "text_completion");
    size_t offset = 0;
    json_t *choice = json_pack("{s:i,s:o,s:s}", "index", 0, "logprobs",
                               oa__logprobs_json(r, p->logprobs, &offset), "finish_reason",
                               finish);
    if (chat) {
        /* With tool calls and no other text, content is null (as OpenAI sends it). */
        json_t *msg = json_pack("{s:s,s:o}", "role", "assistant", "content",
                                p->tool_calls && !p->text_len ? json_null()
                                                              : oa__text(p->text, p->text_len));
        if (p->tool_calls)
            json_object_set(msg, "tool_calls", p->tool_calls);
        json_object_set_new(choice, "message", msg);
    } else
        json_object_set_new(choice, "text", oa__text(p->text, p->text_len));
    oa__choice_river(r, choice, p);
    json_object_set_new(o, "choices", json_pack("[o]", choice));
    json_object_set_new(o, "usage", oa__usage(u));
    if (r->want_exit_layers || (r->want_prompt && prompt)) {
        json_t *x = json_object();
        if (r->want_exit_layers)
            json_object_set_new(x, "mean_exit_layer", json_real(u->mean_exit_layer));
        if (r->want_prompt && prompt)
            json_object_set_new(x, "prompt", oa__text(prompt, strlen(prompt)));
        json_object_set_new(o, "river", x);
    }
    return o;
}

json_t *gw_models_json(const gw_config_t *cfg, int64_t created)
{
    json_t *data = json_array();
    const gw_model_cfg_t *m = cfg->models.v;
    for (int i = 0; i < cfg->models.n; i++)
        json_array_append_new(data, json_pack("{s:s,s:s,s:I,s:s}", "id", m[i].name, "object",
                                              "model", "created", (json_int_t)created,
                                              "owned_by", "river"));
    return json_pack("{s:s,s:o}", "object", "list", "data", data);
}
