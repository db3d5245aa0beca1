/* The served models and their chat templates. Each model's template is compiled once at
 * start (text/chat_template.h), from the model directory's tokenizer_config.json, from a
 * GGUF file's tokenizer.chat_template (`dir` naming the .gguf), or from a template file the
 * configuration names; a chat request renders it into a prompt that
 * carries its special tokens as text, which the worker encodes without adding BOS. */
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/err.h"
#include "common/file.h"
#include "common/gguf.h"
#include "common/log.h"
#include "text/chat_template.h"
#include "gateway/gateway.h"

typedef struct gw_model {
    const char *name;
    chat_template_t *tmpl; /* NULL: the model has no chat template */
    char *bos, *eos;       /* special tokens the template is given */
    toolcall_format_t tool_format; /* how its template renders tool calls */
} gw_model_t;

struct gw_models {
    gw_model_t *v;
    int n;
};

/* bos_token / eos_token of tokenizer_config.json: a string or {"content": ...}. */
static char *gw_models__token(json_t *cfg, const char *key)
{
    json_t *v = json_object_get(cfg, key);
    if (json_is_object(v))
        v = json_object_get(v, "content");
    return strdup(json_is_string(v) ? json_string_value(v) : "");
}

/* The text of the token a GGUF file names by the id under `key`, or "" when none. */
static char *gw_models__gguf_token(const gguf_t *g, const char *key)
{
    int id = -1;
    const gguf_kv_t *toks;
    if (gguf_get_int(g, key, &id) || id < 0 ||
        gguf_get_arr(g, "tokenizer.ggml.tokens", GGUF_TYPE_STRING, &toks) ||
        (uint64_t)id >= toks->n) {
        river_err_clear();
        return strdup("");
    }
    size_t len;
    const char *s = gguf_arr_str(toks, (uint64_t)id, &len);
    return strndup(s, len);
}

/* A GGUF model: its chat template (tmpl stays NULL without one, unless a template file is
 * configured) and its bos/eos texts. */
static int gw_models__load_gguf(gw_model_t *m, const gw_model_cfg_t *mc, int want_template)
{
    gguf_t *g;
    int rc = gguf_open(&g, mc->dir);
    if (rc)
        return rc;
    if (want_template) {
        char *src = NULL;
        rc = gguf_get_strdup(g, "tokenizer.chat_template", &src);
        if (rc == RIVER_ENOTFOUND) {
            log_warn("model %s: %s has no chat template: /v1/chat/completions will refuse it",
                     mc->name, mc->dir);
            rc = 0;
        } else if (!rc) {
            rc = chat_template_new(&m->tmpl, mc->dir, src);
        }
        free(src);
    }
    if (!rc) {
        m->bos = gw_models__gguf_token(g, "tokenizer.ggml.bos_token_id");
        m->eos = gw_models__gguf_token(g, "tokenizer.ggml.eos_token_id");
        if (!m->bos || !m->eos)
            rc = river_err_set(RIVER_ENOMEM, "special tokens");
    }
    gguf_destroy(&g);
    return rc;
}

/* A template file named by the configuration; bos/eos still come from the directory. */
static int gw_models__load_file(gw_model_t *m, const gw_model_cfg_t *mc)
{
    char *src = NULL;
    size_t len;
    int rc = river_read_file(mc->chat_template, &src, &len);
    if (rc)
        return rc;
    rc = chat_template_new(&m->tmpl, mc->chat_template, src);
    free(src);
    if (rc)
        return rc;
    json_t *tc = NULL;
    if (mc->dir[0] && gguf_path_is_gguf(mc->dir))
        return gw_models__load_gguf(m, mc, 0);
    if (mc->dir[0]) {
        char path[4096];
        snprintf(path, sizeof path, "%s/tokenizer_config.json", mc->dir);
        json_error_t je;
        /* model_max_length is often 1e30 written as an integer: read numbers as reals. */
        tc = json_load_file(path, JSON_DECODE_INT_AS_REAL, &je);
        if (!tc)
            return river_err_set(RIVER_EFORMAT, "%s: %s", path, je.text);
    }
    m->bos = gw_models__token(tc, "bos_token");
    m->eos = gw_models__token(tc, "eos_token");
    json_decref(tc);
    return m->bos && m->eos ? 0 : river_err_set(RIVER_ENOMEM, "special tokens");
}

static int gw_models__load(gw_model_t *m, const gw_model_cfg_t *mc)
{
    m->name = mc->name;
    if (mc->chat_template[0])
        return gw_models__load_file(m, mc);
    if (!mc->dir[0])
        return 0;
    struct stat st;
    if (stat(mc->dir, &st) == 0 && S_ISREG(st.st_mode) && gguf_path_is_gguf(mc->dir))
        return gw_models__load_gguf(m, mc, 1);
    if (stat(mc->dir, &st) || !S_ISDIR(st.st_mode))
        return river_err_set(RIVER_ENOTFOUND, "dir %s is neither a directory nor a GGUF file",
                             mc->dir);
    int rc = chat_template_load_dir(&m->tmpl, mc->dir, mc->template_name[0] ? mc->template_name
                                                                            : NULL);
    if (rc == RIVER_ENOTFOUND) {
        log_warn("model %s: %s has no chat template: /v1/chat/completions will refuse it",
                 mc->name, mc->dir);
        m->tmpl = NULL;
        return 0;
    }
    if (rc)
        return rc;
    m->bos = strdup(chat_template_bos(m->tmpl));
    m->eos = strdup(chat_template_eos(m->tmpl));
    return m->bos && m->eos ? 0 : river_err_set(RIVER_ENOMEM, "special tokens");
}

int gw_models_new(gw_models_t **out, const gw_config_t *cfg)
{
    *out = NULL;
    gw_models_t *ms = calloc(1, sizeof *ms);
    if (!ms)
        return river_err_set(RIVER_ENOMEM, "models");
    ms->v = calloc((size_t)cfg->models.n + 1, sizeof *ms->v);
    if (!ms->v) {
        free(ms);
        return river_err_set(RIVER_ENOMEM, "models");
    }
    const gw_model_cfg_t *mc = cfg->models.v;
    for (int i = 0; i < cfg->models.n; i++) {
        for (int j = 0; j < i; j++)
            if (!strcmp(mc[i].name, mc[j].name)) {
                gw_models_destroy(&ms);
                return river_err_set(RIVER_ECONFIG, "models: '%s' is listed twice",
                                     mc[i].name);
            }
        ms->n++;
        int rc = gw_models__load(&ms->v[i], &mc[i]);
        if (!rc && ms->v[i].tmpl) {
            const char *src = chat_template_source(ms->v[i].tmpl);
            ms->v[i].tool_format = toolcall_format_detect(src, strlen(src));
            log_info("model %s: tool calls in the %s format", mc[i].name,
                     toolcall_format_name(ms->v[i].tool_format));
        }
        if (rc) {
            char why[600];
            snprintf(why, sizeof why, "%s", river_err_detail());
            gw_models_destroy(&ms);
            return river_err_set(rc, "model %s: %s", mc[i].name, why);
        }
    }
    *out = ms;
    return 0;
}

void gw_models_destroy(gw_models_t **pm)
{
    gw_models_t *ms = *pm;
    if (!ms)
        return;
    *pm = NULL;
    for (int i = 0; i < ms->n; i++) {
        chat_template_destroy(&ms->v[i].tmpl);
        free(ms->v[i].bos);
        free(ms->v[i].eos);
    }
    free(ms->v);
    free(ms);
}

static const gw_model_t *gw_models__find(const gw_models_t *ms, const char *name)
{
    for (int i = 0; i < ms->n; i++)
        if (!strcmp(ms->v[i].name, name))
            return &ms->v[i];
    return NULL;
}

int gw_models_has(const gw_models_t *ms, const char *name)
{
    return gw_models__find(ms, name) != NULL;
}

toolcall_format_t gw_models_tool_format(const gw_models_t *ms, const char *name)
{
    const gw_model_t *m = gw_models__find(ms, name);
    return m ? m->tool_format : TOOLCALL_NONE;
}

void gw_release_memory(size_t body_bytes)
{
    if (body_bytes >= GW_TRIM_BODY_BYTES)
        malloc_trim(0);
}

size_t gw_models_render_budget(const gw_config_t *cfg, size_t body_len)
{
    size_t cap = (size_t)cfg->max_render_bytes;
    size_t want = body_len > cap / GW_RENDER_BODY_FACTOR ? cap : body_len * GW_RENDER_BODY_FACTOR;
    if (want < (1u << 20))
        want = 1u << 20;
    return want < cap ? want : cap;
}

int gw_models_render(const gw_models_t *ms, const gw_request_t *r, size_t max_memory,
                     char **prompt, uint32_t **special, size_t *n_special, gw_error_t *err)
{
    *prompt = NULL;
    *special = NULL;
    *n_special = 0;
    const gw_model_t *m = gw_models__find(ms, r->model);
    if (!m)
        return gw_error_set(err, GW_ERR_MODEL, "model", "the model '%s' does not exist",
                            r->model);
    if (!m->tmpl)
        return gw_error_set(err, GW_ERR_INVALID, "model",
                            "the model '%s' has no chat template: use /v1/completions",
                            r->model);
    /* Extra keyword arguments first, so that the request's own fields win. */
    json_t *ctx = r->template_kwargs ? json_deep_copy(r->template_kwargs) : json_object();
    if (!ctx)
        return gw_error_set(err, GW_ERR_INTERNAL, NULL, "out of memory");
    json_object_set(ctx, "messages", r->messages);
    if (r->tools)
        json_object_set(ctx, "tools", r->tools);
    json_object_set_new(ctx, "add_generation_prompt", json_boolean(r->add_generation_prompt));
    json_object_set_new(ctx, "bos_token", json_string(m->bos));
    json_object_set_new(ctx, "eos_token", json_string(m->eos));
    size_t len, n;
    text_span_t *spans;
    int rc = chat_template_render_spans(m->tmpl, ctx, max_memory, prompt, &len, &spans, &n);
    json_decref(ctx);
    if (rc) {
        *prompt = NULL;
        return gw_error_set(err, rc == RIVER_EFULL ? GW_ERR_TOO_LARGE : GW_ERR_INVALID,
                            "messages", "chat template: %s", river_err_detail());
    }
    if (len == 0 || strlen(*prompt) != len) {
        free(*prompt);
        free(spans);
        *prompt = NULL;
        return gw_error_set(err, GW_ERR_INVALID, "messages",
                            "the chat template rendered an empty prompt or one with a NUL");
    }
    /* A rendering stays under JINJA_MAX_OUTPUT (16 MiB): its offsets fit 32 bits. */
    *special = malloc((n ? n : 1) * 2 * sizeof **special);
    if (!*special) {
        free(*prompt);
        free(spans);
        *prompt = NULL;
        return gw_error_set(err, GW_ERR_INTERNAL, NULL, "out of memory");
    }
    for (size_t i = 0; i < n; i++) {
        (*special)[2 * i] = (uint32_t)spans[i].off;
        (*special)[2 * i + 1] = (uint32_t)(spans[i].off + spans[i].len);
    }
    *n_special = n;
    free(spans);
    return 0;
}
