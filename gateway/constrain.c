/* The grammar a chat or completion request's output must follow, built from what OpenAI
 * clients send: response_format (any JSON object, or a JSON Schema) and tool_choice
 * (required, or a named function, forces a call of the tools' parameter schemas, in the
 * model's own tool-call format). The worker compiles the text again and masks every
 * head's logits with it (engine/logits.h); compiling it here first is what turns a bad
 * schema into a 400 naming its path rather than a failed stream.
 *
 * A forced call is written exactly as toolcall_render writes it, with the arguments'
 * grammar where the arguments go, so that gateway/toolcall.h parses what the grammar
 * lets through. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "gateway/gateway.h"
#include "text/grammar.h"

/* A growing text. */
typedef struct gw_buf {
    char *s;
    size_t n, cap;
    int failed;
} gw_buf_t;

static void gw_buf__add(gw_buf_t *b, const char *s, size_t n)
{
    if (b->failed)
        return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 1024;
        while (cap < b->n + n + 1)
            cap *= 2;
        char *p = realloc(b->s, cap);
        if (!p) {
            b->failed = 1;
            return;
        }
        b->s = p;
        b->cap = cap;
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = '\0';
}

static void gw_buf__str(gw_buf_t *b, const char *s) { gw_buf__add(b, s, strlen(s)); }

/* s as a grammar literal: quotes, backslashes and control bytes escaped, the rest as is. */
static void gw_buf__literal(gw_buf_t *b, const char *s, size_t n)
{
    gw_buf__add(b, "\"", 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        char esc[8];
        if (c == '"' || c == '\\')
            snprintf(esc, sizeof esc, "\\%c", c);
        else if (c == '\n')
            snprintf(esc, sizeof esc, "\\n");
        else if (c < 0x20 || c == 0x7f)
            snprintf(esc, sizeof esc, "\\x%02x", c);
        else
            esc[0] = (char)c, esc[1] = 0;
        gw_buf__str(b, esc);
    }
    gw_buf__add(b, "\"", 1);
}

/* The rules of one schema, their entry rule named prefix. */
static int gw_constrain__schema(gw_buf_t *b, json_t *schema, const char *prefix,
                                const char *param, gw_error_t *err)
{
    char *text = json_dumps(schema, JSON_COMPACT | JSON_ENCODE_ANY);
    char *rules = NULL;
    if (!text)
        return gw_error_set(err, GW_ERR_INTERNAL, NULL, "out of memory");
    int e = grammar_json_schema_to_gbnf(text, strlen(text), prefix, &rules);
    free(text);
    /* The schema's JSON pointer as a URI fragment ("#/properties/a"): the client's own
     * path, which the error scrubber leaves alone (it cuts server paths). */
    if (e) {
        const char *d = river_err_detail();
        return gw_error_set(err, e == RIVER_ENOMEM ? GW_ERR_INTERNAL : GW_ERR_INVALID, param,
                            "'%s': %s%s", param, d[0] == '/' ? "#" : "", d);
    }
    gw_buf__str(b, rules);
    gw_buf__str(b, "\n");
    free(rules);
    return 0;
}

/* The text format f renders a call of name in, split around its arguments. */
static int gw_constrain__call_text(toolcall_format_t f, const char *name, char **before,
                                   char **after)
{
    static const char mark[] = "\"__river_arguments__\"";
    char *full = NULL;
    int e = toolcall_render(f, name, mark, &full);
    if (e)
        return e;
    char *at = strstr(full, mark);
    if (!at) {
        free(full);
        return river_err_set(RIVER_ESTATE, "the %s format renders no arguments",
                             toolcall_format_name(f));
    }
    *before = strndup(full, (size_t)(at - full));
    *after = strdup(at + strlen(mark));
    free(full);
    if (!*before || !*after) {
        free(*before);
        free(*after);
        return river_err_set(RIVER_ENOMEM, "tool-call grammar");
    }
    return 0;
}

/* Rules "call ::= ..." for the calls the request may make: every tool, or the named one. */
static int gw_constrain__calls(gw_buf_t *b, const gw_request_t *r, toolcall_format_t f,
                               gw_error_t *err)
{
    gw_buf_t alts = {0};
    size_t i;
    json_t *t;
    int n = 0;
    json_array_foreach(r->tools, i, t) {
        json_t *fn = json_object_get(t, "function");
        const char *name = json_string_value(json_object_get(fn, "name"));
        if (r->tool_choice == GW_TOOL_CHOICE_NAMED && strcmp(name, r->tool_name))
            continue;
        if (!toolcall_name_valid(name)) {
            free(alts.s);
            return gw_error_set(err, GW_ERR_INVALID, "tools",
                                "the tool name '%s' cannot be called: 1 to %d bytes of "
                                "letters, digits and _-.:/@", name, TOOLCALL_NAME_MAX);
        }
        char prefix[32], param[64];
        snprintf(prefix, sizeof prefix, "t%zu", i);
        snprintf(param, sizeof param, "tools[%zu].function.parameters", i);
        json_t *params = json_object_get(fn, "parameters");
        json_t *empty = NULL;
        if (!params || json_is_null(params))
            params = empty = json_pack("{s:s,s:{},s:b}", "type", "object", "properties",
                                       "additionalProperties", 0);
        int rc = gw_constrain__schema(b, params, prefix, param, err);
        json_decref(empty);
        char *before = NULL, *after = NULL;
        if (rc || gw_constrain__call_text(f, name, &before, &after)) {
            free(alts.s);
            return rc ? rc : gw_error_set(err, GW_ERR_INTERNAL, NULL, "%s",
                                          river_err_detail());
        }
        gw_buf__str(&alts, n++ ? " | " : "");
        gw_buf__str(&alts, "( ");
        gw_buf__literal(&alts, before, strlen(before));
        gw_buf__str(&alts, " ");
        gw_buf__str(&alts, prefix);
        gw_buf__str(&alts, " ");
        gw_buf__literal(&alts, after, strlen(after));
        gw_buf__str(&alts, " )");
        free(before);
        free(after);
    }
    gw_buf__str(b, "call ::= ");
    gw_buf__str(b, alts.s ? alts.s : "\"\"");
    gw_buf__str(b, "\n");
    int failed = alts.failed;
    free(alts.s);
    return failed ? gw_error_set(err, GW_ERR_INTERNAL, NULL, "out of memory") : 0;
}

int gw_constrain(gw_request_t *r, toolcall_format_t f, gw_error_t *err)
{
    int forced = r->api == GW_API_CHAT && (r->tool_choice == GW_TOOL_CHOICE_REQUIRED ||
                                           r->tool_choice == GW_TOOL_CHOICE_NAMED);
    int calls = forced || (r->api == GW_API_CHAT && r->json_mode &&
                           r->tool_choice == GW_TOOL_CHOICE_AUTO);
    if (r->river_grammar) {
        if (forced || r->json_mode)
            return gw_error_set(err, GW_ERR_INVALID, "river.grammar",
                                "'river.grammar' cannot be combined with a JSON "
                                "response_format or a tool_choice that forces a call");
        grammar_t *g = NULL;
        if (grammar_parse(&g, r->river_grammar, strlen(r->river_grammar)))
            return gw_error_set(err, GW_ERR_INVALID, "river.grammar", "'river.grammar': %s",
                                river_err_detail());
        grammar_destroy(&g);
        if (!(r->grammar = strdup(r->river_grammar)))
            return gw_error_set(err, GW_ERR_INTERNAL, NULL, "out of memory");
        return 0;
    }
    if (!forced && !r->json_mode)
        return 0;
    if (calls && f == TOOLCALL_NONE) {
        if (forced)
            return gw_error_set(err, GW_ERR_INVALID, "tool_choice",
                                "the model '%s' has no tool-call format in its chat template, "
                                "so a call cannot be required", r->model);
        calls = 0; /* auto on a model that cannot call: JSON alone */
    }
    gw_buf_t b = {0};
    int rc = 0;
    if (r->json_mode && !forced) {
        /* json_object: an object with any members (text/grammar.h). */
        json_t *any = r->response_schema ? NULL
                                         : json_pack("{s:s,s:b}", "type", "object",
                                                     "additionalProperties", 1);
        rc = gw_constrain__schema(&b, any ? any : r->response_schema, "r",
                                  "response_format.json_schema.schema", err);
        json_decref(any);
    }
    if (!rc && calls)
        rc = gw_constrain__calls(&b, r, f, err);
    if (rc) {
        free(b.s);
        return -1;
    }
    gw_buf__str(&b, forced ? "root ::= call\n" : calls ? "root ::= call | r\n"
                                                      : "root ::= r\n");
    if (b.failed) {
        free(b.s);
        return gw_error_set(err, GW_ERR_INTERNAL, NULL, "out of memory");
    }
    /* The worker compiles it again; a grammar that does not compile here is River's
     * fault, not the client's, unless it came from the client's schema (above). */
    grammar_t *g = NULL;
    if (grammar_parse(&g, b.s, b.n)) {
        gw_error_set(err, GW_ERR_INVALID, forced ? "tools" : "response_format",
                     "the constraint does not compile: %s", river_err_detail());
        free(b.s);
        return -1;
    }
    grammar_destroy(&g);
    r->grammar = b.s;
    return 0;
}
