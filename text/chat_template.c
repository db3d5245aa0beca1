/* Chat templates (text/chat_template.h): compiles a template once (text/jinja_lex.c,
 * text/jinja_parse.c) and renders it with a JSON context (text/jinja_eval.c); reads a
 * model directory's tokenizer_config.json for its template and special tokens. */
#include "text/chat_template.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "text/jinja.h"

/* The most bytes of template source (the largest real templates are ~10 KB). */
#define CHAT_TEMPLATE_MAX_SOURCE (1u << 20)
/* The arena a compilation may use: tokens and AST of a template this large. */
#define CHAT_TEMPLATE_MAX_COMPILE (64u << 20)

struct chat_template {
    char *name;
    jarena_t *arena; /* tokens, AST, constants */
    jnode_t *root;
    char *bos, *eos;   /* "" when none */
    json_t *defaults;  /* bos_token / eos_token from tokenizer_config.json, or NULL */
    const char *source; /* the template's text as compiled (in the arena) */
};

static char *dup_str(const char *s)
{
    size_t n = strlen(s);
    char *d = malloc(n + 1);
    if (d)
        memcpy(d, s, n + 1);
    return d;
}

int chat_template_new(chat_template_t **out, const char *name, const char *source)
{
    *out = NULL;
    if (!name)
        name = "template";
    if (!source)
        return river_err_set(RIVER_EINVAL, "%s: no template source", name);
    size_t len = strlen(source);
    if (len > CHAT_TEMPLATE_MAX_SOURCE)
        return river_err_set(RIVER_EFULL, "%s: template of %zu bytes is over the %u-byte limit",
                             name, len, CHAT_TEMPLATE_MAX_SOURCE);
    chat_template_t *t = calloc(1, sizeof *t);
    if (!t)
        return river_err_set(RIVER_ENOMEM, "%s: out of memory", name);
    int err = RIVER_ENOMEM;
    t->name = dup_str(name);
    t->bos = dup_str("");
    t->eos = dup_str("");
    t->arena = jarena_new(CHAT_TEMPLATE_MAX_COMPILE);
    if (!t->name || !t->bos || !t->eos || !t->arena) {
        river_err_set(err, "%s: out of memory", name);
        goto fail;
    }
    /* Jinja2 turns "\r\n" and "\r" into "\n" and drops one trailing newline
     * (keep_trailing_newline=False). */
    char *src = jarena_alloc(t->arena, len + 1);
    if (!src) {
        river_err_set(err, "%s: out of memory", name);
        goto fail;
    }
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (source[i] == '\r') {
            src[n++] = '\n';
            if (i + 1 < len && source[i + 1] == '\n')
                i++;
        } else {
            src[n++] = source[i];
        }
    }
    if (n && src[n - 1] == '\n')
        n--;
    src[n] = 0;
    t->source = src;
    jtok_t *toks;
    size_t ntoks;
    if ((err = jinja_lex(t->arena, t->name, src, n, &toks, &ntoks)) ||
        (err = jinja_parse(t->arena, t->name, toks, ntoks, &t->root)))
        goto fail;
    *out = t;
    return 0;
fail:
    chat_template_destroy(&t);
    return err;
}

/* A special token: a string, or an AddedToken object {"content": ...}. */
static const char *token_text(const json_t *v)
{
    if (json_is_string(v))
        return json_string_value(v);
    if (json_is_object(v) && json_is_string(json_object_get(v, "content")))
        return json_string_value(json_object_get(v, "content"));
    return NULL;
}

/* A whole text file (malloc'd), or NULL when it is missing; *err set when it is there but
 * cannot be read. */
static char *read_text(const char *path, int *err)
{
    *err = 0;
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = CHAT_TEMPLATE_MAX_SOURCE + 1;
    char *buf = malloc(cap + 1);
    if (!buf) {
        fclose(f);
        *err = river_err_set(RIVER_ENOMEM, "%s: out of memory", path);
        return NULL;
    }
    size_t n = fread(buf, 1, cap, f);
    int bad = ferror(f);
    fclose(f);
    if (bad || n == cap) {
        free(buf);
        *err = bad ? river_err_set(RIVER_EIO, "%s: read error", path)
                   : river_err_set(RIVER_EFULL, "%s: template over %u bytes", path,
                                   CHAT_TEMPLATE_MAX_SOURCE);
        return NULL;
    }
    buf[n] = 0;
    return buf;
}

int chat_template_load_dir(chat_template_t **out, const char *model_dir, const char *which)
{
    *out = NULL;
    char path[4096], fpath[4400];
    if (snprintf(path, sizeof path, "%s/tokenizer_config.json", model_dir) >= (int)sizeof path)
        return river_err_set(RIVER_EINVAL, "%s: path too long", model_dir);
    const char *want = which ? which : "default";
    if (!*want || strchr(want, '/') || want[0] == '.')
        return river_err_set(RIVER_EINVAL, "'%s' is not a chat template name", want);
    /* Newer checkpoints keep the template in a file of its own, which takes precedence over
     * tokenizer_config.json's (as in transformers): chat_template.jinja for the default,
     * additional_chat_templates/NAME.jinja for the others. */
    if (!strcmp(want, "default"))
        snprintf(fpath, sizeof fpath, "%s/chat_template.jinja", model_dir);
    else
        snprintf(fpath, sizeof fpath, "%s/additional_chat_templates/%s.jinja", model_dir, want);
    int err;
    char *file_src = read_text(fpath, &err);
    if (err)
        return err;
    json_error_t jerr;
    /* Integers as reals: model_max_length is often 1e30 written as an integer. */
    json_t *cfg = json_load_file(path, JSON_DECODE_INT_AS_REAL, &jerr);
    if (!cfg) {
        FILE *f = fopen(path, "rb");
        if (f) {
            fclose(f);
            free(file_src);
            return river_err_set(RIVER_EFORMAT, "%s:%d: %s", path, jerr.line, jerr.text);
        }
        if (!file_src)
            return river_err_set(RIVER_ENOTFOUND, "%s: no tokenizer_config.json", model_dir);
        cfg = json_object(); /* a template file without a config: no special tokens */
        if (!cfg) {
            free(file_src);
            return river_err_set(RIVER_ENOMEM, "out of memory");
        }
    }
    const char *src = NULL;
    char name[4500];
    json_t *ct = json_object_get(cfg, "chat_template");
    if (file_src) {
        src = file_src;
        snprintf(name, sizeof name, "%s", fpath);
    } else if (json_is_string(ct)) {
        if (strcmp(want, "default")) {
            err = river_err_set(RIVER_ENOTFOUND, "%s: no chat template named '%s'", path, want);
            goto done;
        }
        src = json_string_value(ct);
        snprintf(name, sizeof name, "%s:chat_template", path);
    } else if (json_is_array(ct)) {
        size_t i;
        json_t *e;
        json_array_foreach(ct, i, e) {
            const char *nm = json_string_value(json_object_get(e, "name"));
            const char *tpl = json_string_value(json_object_get(e, "template"));
            if (nm && tpl && !strcmp(nm, want)) {
                src = tpl;
                break;
            }
        }
        if (!src) {
            err = river_err_set(RIVER_ENOTFOUND, "%s: no chat template named '%s'", path, want);
            goto done;
        }
        snprintf(name, sizeof name, "%s:chat_template[%s]", path, want);
    } else if (ct && !json_is_null(ct)) {
        err = river_err_set(RIVER_EFORMAT, "%s: chat_template is neither a string nor a list", path);
        goto done;
    } else {
        err = river_err_set(RIVER_ENOTFOUND, "%s: the model has no chat template", path);
        goto done;
    }
    chat_template_t *t;
    if ((err = chat_template_new(&t, name, src)))
        goto done;
    t->defaults = json_object();
    if (!t->defaults) {
        chat_template_destroy(&t);
        err = river_err_set(RIVER_ENOMEM, "%s: out of memory", path);
        goto done;
    }
    static const char *const keys[] = {"bos_token", "eos_token"};
    for (int k = 0; k < 2; k++) {
        const char *tok = token_text(json_object_get(cfg, keys[k]));
        if (!tok)
            continue;
        char *c = dup_str(tok);
        json_t *js = json_string(tok);
        if (!c || !js || json_object_set_new(t->defaults, keys[k], js)) {
            free(c);
            chat_template_destroy(&t);
            err = river_err_set(RIVER_ENOMEM, "%s: out of memory", path);
            goto done;
        }
        if (k == 0) {
            free(t->bos);
            t->bos = c;
        } else {
            free(t->eos);
            t->eos = c;
        }
    }
    *out = t;
    err = 0;
done:
    json_decref(cfg);
    free(file_src);
    return err;
}

int chat_template_render(const chat_template_t *t, const json_t *context, char **out,
                         size_t *out_len)
{
    *out = NULL;
    if (out_len)
        *out_len = 0;
    return chat_template_render_spans(t, context, 0, out, out_len, NULL, NULL);
}

/* The variables whose values are special-token text the template is given. */
static const char *const chat_template__special_keys[] = {"bos_token", "eos_token", NULL};

int chat_template_render_spans(const chat_template_t *t, const json_t *context,
                               size_t max_memory, char **out, size_t *out_len,
                               text_span_t **special, size_t *n_special)
{
    *out = NULL;
    if (out_len)
        *out_len = 0;
    if (special) {
        *special = NULL;
        *n_special = 0;
    }
    if (!t)
        return river_err_set(RIVER_EINVAL, "no chat template");
    jinja_render_opts_t o = {.defaults = t->defaults,
                             .template_keys = chat_template__special_keys,
                             .max_memory = max_memory};
    return jinja_render(t->name, t->root, context, &o, out, out_len, special, n_special);
}

const char *chat_template_source(const chat_template_t *t)
{
    return t && t->source ? t->source : "";
}

const char *chat_template_bos(const chat_template_t *t)
{
    return t && t->bos ? t->bos : "";
}

const char *chat_template_eos(const chat_template_t *t)
{
    return t && t->eos ? t->eos : "";
}

void chat_template_destroy(chat_template_t **tp)
{
    if (!tp || !*tp)
        return;
    chat_template_t *t = *tp;
    jarena_destroy(&t->arena);
    json_decref(t->defaults);
    free(t->name);
    free(t->bos);
    free(t->eos);
    free(t);
    *tp = NULL;
}
