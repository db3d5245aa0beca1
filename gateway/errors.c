/* OpenAI's error object and the HTTP status of each error the gateway gives, in one
 * table; riverd's error codes map onto the same kinds. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "gateway/gateway.h"

typedef struct gw_err_row {
    int status;
    const char *type;  /* OpenAI's error.type */
    const char *code;  /* OpenAI's error.code; NULL: null */
} gw_err_row_t;

/* Types and codes as OpenAI's API spells them, so that SDKs classify them (the openai
 * package picks its error class from the status alone). */
static const gw_err_row_t gw_errors__table[GW_ERR_COUNT] = {
    [GW_ERR_INVALID] = {400, "invalid_request_error", "invalid_value"},
    [GW_ERR_AUTH] = {401, "invalid_request_error", "invalid_api_key"},
    [GW_ERR_MODEL] = {404, "invalid_request_error", "model_not_found"},
    [GW_ERR_NOT_FOUND] = {404, "invalid_request_error", "not_found"},
    [GW_ERR_METHOD] = {405, "invalid_request_error", "method_not_allowed"},
    [GW_ERR_TOO_LARGE] = {413, "invalid_request_error", "request_too_large"},
    [GW_ERR_RATE] = {429, "rate_limit_error", "rate_limit_exceeded"},
    [GW_ERR_INTERNAL] = {500, "server_error", "internal_error"},
    [GW_ERR_UPSTREAM_AUTH] = {502, "server_error", "upstream_unauthenticated"},
    [GW_ERR_UNAVAILABLE] = {503, "server_error", "service_unavailable"},
    [GW_ERR_DEADLINE] = {504, "server_error", "timeout"},
};

int gw_error_set(gw_error_t *e, gw_err_kind_t kind, const char *param, const char *fmt, ...)
{
    e->kind = kind;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return -1;
}

int gw_error_status(gw_err_kind_t kind)
{
    return (unsigned)kind < GW_ERR_COUNT ? gw_errors__table[kind].status : 500;
}

/* Whether c may be part of a file path. */
static int gw_errors__path_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '/' || c == '.' || c == '_' || c == '-' || c == '+' || c == '~' || c == '#';
}

void gw_error_scrub_paths(char *msg)
{
    char *w = msg;
    for (const char *r = msg; *r;) {
        int starts = *r == '/' && (r == msg || !gw_errors__path_char(r[-1]));
        size_t len = 0, n_slash = 0, last = 0;
        while (starts && gw_errors__path_char(r[len])) {
            if (r[len] == '/') {
                n_slash++;
                last = len;
            }
            len++;
        }
        if (n_slash < 2) {
            *w++ = *r++;
            continue;
        }
        /* "/home/u/models/x.jinja:3:7" becomes "x.jinja:3:7": what the file is called
         * still tells an operator which one, the directories stay on the server. */
        const char *base = r + last + 1;
        size_t n_base = len - last - 1;
        memmove(w, base, n_base);
        w += n_base;
        r += len;
    }
    *w = '\0';
}

json_t *gw_error_json(const gw_error_t *e)
{
    const gw_err_row_t *row =
        &gw_errors__table[(unsigned)e->kind < GW_ERR_COUNT ? e->kind : GW_ERR_INTERNAL];
    char text[sizeof e->message];
    snprintf(text, sizeof text, "%s", e->message);
    /* The path of a 404 or 405 is the client's own; any other path in a message came from
     * the server (a template's file, a worker's model directory) and stays there. */
    if (e->kind != GW_ERR_NOT_FOUND && e->kind != GW_ERR_METHOD)
        gw_error_scrub_paths(text);
    json_t *msg = json_string(text);
    if (!msg)
        msg = json_string("(the error message was not valid UTF-8)");
    return json_pack("{s:{s:o,s:s,s:o,s:o}}", "error", "message", msg, "type", row->type,
                     "param", e->param[0] ? json_string(e->param) : json_null(), "code",
                     row->code ? json_string(row->code) : json_null());
}

gw_err_kind_t gw_error_from_river(river_code_t code)
{
    switch (code) {
    case RIVER_CODE_INVALID_ARGUMENT: return GW_ERR_INVALID;
    case RIVER_CODE_RESOURCE_EXHAUSTED: return GW_ERR_RATE;
    case RIVER_CODE_DEADLINE_EXCEEDED: return GW_ERR_DEADLINE;
    case RIVER_CODE_CANCELLED:
    case RIVER_CODE_UNAVAILABLE: return GW_ERR_UNAVAILABLE;
    case RIVER_CODE_UNAUTHENTICATED: return GW_ERR_UPSTREAM_AUTH;
    default: return GW_ERR_INTERNAL;
    }
}
