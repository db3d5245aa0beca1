/* Tool-call formats: names, detection from a chat template's source, and how each format
 * renders one call (gateway/toolcall.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "gateway/toolcall_int.h"

int tc_name_char(uint8_t c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           (c && strchr("_-.:/@", c));
}

int toolcall_name_valid(const char *name)
{
    size_t n = name ? strlen(name) : 0;
    if (n == 0 || n > TOOLCALL_NAME_MAX)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!tc_name_char((uint8_t)name[i]))
            return 0;
    return 1;
}

/* ---- Formats ---- */

static const char *const tc__format_names[TOOLCALL_N_FORMATS] = {
    "none", "llama3_json", "hermes", "mistral", "functionary", "command_r",
};

const char *toolcall_format_name(toolcall_format_t f)
{
    return (unsigned)f < TOOLCALL_N_FORMATS ? tc__format_names[f] : "?";
}

int toolcall_format_from_name(const char *name, toolcall_format_t *out)
{
    for (int i = 0; name && i < TOOLCALL_N_FORMATS; i++) {
        if (!strcmp(name, tc__format_names[i])) {
            *out = (toolcall_format_t)i;
            return 0;
        }
    }
    return river_err_set(RIVER_EINVAL, "unknown tool call format '%s'", name ? name : "");
}

static int tc__has(const char *src, size_t len, const char *needle)
{
    return memmem(src, len, needle, strlen(needle)) != NULL;
}

toolcall_format_t toolcall_format_detect(const char *src, size_t len)
{
    if (!src)
        return TOOLCALL_NONE;
    /* Functionary's template also holds <|python_tag|> and Llama's headers, so it is
     * recognized first by its own marker. */
    if (tc__has(src, len, "<function="))
        return TOOLCALL_FUNCTIONARY;
    if (tc__has(src, len, "<tool_call>"))
        return TOOLCALL_HERMES;
    if (tc__has(src, len, "[TOOL_CALLS]"))
        return TOOLCALL_MISTRAL;
    if (tc__has(src, len, "Action:") && tc__has(src, len, "tool_name"))
        return TOOLCALL_COMMAND_R;
    if (tc__has(src, len, "<|start_header_id|>") && tc__has(src, len, "tool_call") &&
        (tc__has(src, len, "\"parameters\"") || tc__has(src, len, "<|python_tag|>")))
        return TOOLCALL_LLAMA3_JSON;
    return TOOLCALL_NONE;
}

static const char *const tc__open[TOOLCALL_N_FORMATS] = {
    "", "", "<tool_call>\n", "[TOOL_CALLS][", "<function=", "Action:\n```json\n[\n",
};
static const char *const tc__close_str[TOOLCALL_N_FORMATS] = {
    "", "", "\n</tool_call>", "]", "</function>", "\n]```",
};

const char *toolcall_call_open(toolcall_format_t f)
{
    return (unsigned)f < TOOLCALL_N_FORMATS ? tc__open[f] : "";
}

const char *toolcall_call_close(toolcall_format_t f)
{
    return (unsigned)f < TOOLCALL_N_FORMATS ? tc__close_str[f] : "";
}

int toolcall_render(toolcall_format_t f, const char *name, const char *args_json, char **out)
{
    if (!out)
        return river_err_set(RIVER_EINVAL, "toolcall_render: no result pointer");
    *out = NULL;
    if (f == TOOLCALL_NONE || (unsigned)f >= TOOLCALL_N_FORMATS)
        return river_err_set(RIVER_EINVAL, "toolcall_render: format %s has no calls",
                             toolcall_format_name(f));
    if (!toolcall_name_valid(name))
        return river_err_set(RIVER_EINVAL, "toolcall_render: invalid tool name '%s'",
                             name ? name : "");
    char *args;
    size_t args_len;
    int rc = tc_json_compact(args_json ? args_json : "", args_json ? strlen(args_json) : 0,
                             &args, &args_len);
    if (rc)
        return rc;
    const char *fmt;
    switch (f) {
    case TOOLCALL_LLAMA3_JSON:
        fmt = "%s{\"name\": \"%s\", \"parameters\": %s}%s";
        break;
    case TOOLCALL_FUNCTIONARY:
        fmt = "%s%s>%s%s";
        break;
    case TOOLCALL_COMMAND_R:
        fmt = "%s    {\n        \"tool_name\": \"%s\",\n        \"parameters\": %s\n    }%s";
        break;
    default:
        fmt = "%s{\"name\": \"%s\", \"arguments\": %s}%s";
        break;
    }
    int n = asprintf(out, fmt, tc__open[f], name, args, tc__close_str[f]);
    free(args);
    if (n < 0) {
        *out = NULL;
        return river_err_set(RIVER_ENOMEM, "toolcall_render: out of memory");
    }
    return 0;
}

