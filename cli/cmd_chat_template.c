/* `river chat-template`: renders a chat template with a context JSON read from stdin. */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "common/err.h"
#include "common/gguf.h"
#include "text/chat_template.h"

static void chat_template_usage(FILE *f)
{
    fprintf(f,
            "usage: river chat-template (--template FILE | --model DIR [--name NAME])\n\n"
            "Reads a context JSON object from stdin (messages, tools, add_generation_prompt,\n"
            "bos_token, eos_token and any other template variable) and prints the rendering\n"
            "exactly, with no newline added. --model reads DIR/tokenizer_config.json: its\n"
            "chat_template (NAME picks one of a list, \"default\" otherwise) and its\n"
            "bos_token / eos_token, used when the context has none. A template that raises\n"
            "exits 1 with the error on stderr. RIVER_NOW=YYYY-MM-DDTHH:MM:SS fixes the clock\n"
            "of strftime_now. DIR may be a GGUF file: its tokenizer.chat_template.\n");
}

static int read_all(FILE *f, char **data, size_t *len)
{
    size_t cap = 65536, n = 0;
    char *buf = malloc(cap + 1);
    if (!buf)
        return RIVER_ENOMEM;
    for (;;) {
        if (n == cap) {
            if (cap > (256u << 20)) {
                free(buf);
                return river_err_set(RIVER_EFULL, "stdin: over 256 MiB");
            }
            char *nb = realloc(buf, cap * 2 + 1);
            if (!nb) {
                free(buf);
                return RIVER_ENOMEM;
            }
            buf = nb;
            cap *= 2;
        }
        size_t r = fread(buf + n, 1, cap - n, f);
        n += r;
        if (r == 0) {
            if (ferror(f)) {
                free(buf);
                return river_err_set(RIVER_EIO, "reading stdin: %s", strerror(errno));
            }
            break;
        }
    }
    buf[n] = 0;
    *data = buf;
    *len = n;
    return 0;
}

int cmd_chat_template(int argc, char **argv)
{
    const char *tpl_path = NULL, *model = NULL, *name = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            chat_template_usage(stdout);
            return 0;
        } else if ((!strcmp(a, "--template") || !strcmp(a, "--model") || !strcmp(a, "--name")) &&
                   i + 1 < argc) {
            const char **dst = a[2] == 't' ? &tpl_path : a[2] == 'm' ? &model : &name;
            *dst = argv[++i];
        } else {
            fprintf(stderr, "river chat-template: unknown or incomplete option '%s'\n", a);
            chat_template_usage(stderr);
            return 2;
        }
    }
    if (!tpl_path == !model) {
        fprintf(stderr, "river chat-template: give one of --template FILE and --model DIR\n");
        chat_template_usage(stderr);
        return 2;
    }
    chat_template_t *t = NULL;
    int err;
    if (tpl_path) {
        char *src = NULL;
        size_t len = 0;
        FILE *f = fopen(tpl_path, "rb");
        if (!f)
            return cli_fail("chat-template",
                            river_err_set(RIVER_EIO, "%s: %s", tpl_path, strerror(errno)));
        err = read_all(f, &src, &len);
        fclose(f);
        if (err)
            return cli_fail("chat-template", err);
        if (strlen(src) != len) {
            free(src);
            return cli_fail("chat-template",
                            river_err_set(RIVER_EFORMAT, "%s: template contains a NUL byte",
                                          tpl_path));
        }
        err = chat_template_new(&t, tpl_path, src);
        free(src);
    } else if (gguf_path_is_gguf(model)) {
        /* A GGUF file's tokenizer.chat_template; bos/eos come from the context. */
        gguf_t *g;
        char *src = NULL;
        if (!(err = gguf_open(&g, model))) {
            err = gguf_get_strdup(g, "tokenizer.chat_template", &src);
            gguf_destroy(&g);
        }
        if (!err)
            err = chat_template_new(&t, model, src);
        free(src);
    } else {
        err = chat_template_load_dir(&t, model, name);
    }
    if (err)
        return cli_fail("chat-template", err);
    char *in = NULL;
    size_t in_len = 0;
    if ((err = read_all(stdin, &in, &in_len))) {
        chat_template_destroy(&t);
        return cli_fail("chat-template", err);
    }
    json_error_t jerr;
    json_t *ctx = json_loadb(in, in_len, 0, &jerr);
    free(in);
    if (!ctx || !json_is_object(ctx)) {
        json_decref(ctx);
        chat_template_destroy(&t);
        return cli_fail("chat-template",
                        river_err_set(RIVER_EINVAL, "stdin: %s",
                                      ctx ? "the context must be a JSON object" : jerr.text));
    }
    char *out = NULL;
    size_t out_len = 0;
    err = chat_template_render(t, ctx, &out, &out_len);
    json_decref(ctx);
    chat_template_destroy(&t);
    if (err)
        return cli_fail("chat-template", err);
    int rc = 0;
    if (fwrite(out, 1, out_len, stdout) != out_len || fflush(stdout) != 0) {
        fprintf(stderr, "river chat-template: writing stdout: %s\n", strerror(errno));
        rc = 1;
    }
    free(out);
    return rc;
}
