/* Writing a configuration back out as YAML, every key with its comment (the documented
 * example files are written this way). */
#include "common/config.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/config_internal.h"

/* A comment wrapped to about 90 columns. */
static void config__comment(FILE *f, int indent, const char *text)
{
    const int width = 88 - indent;
    while (*text) {
        int n = (int)strlen(text);
        if (n > width) {
            n = width;
            while (n > 0 && text[n] != ' ')
                n--;
            if (n == 0)
                n = (int)strcspn(text, " ");
        }
        fprintf(f, "%*s# %.*s\n", indent, "", n, text);
        text += n;
        while (*text == ' ')
            text++;
    }
}

static void config__write_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            fprintf(f, "\\%c", ch);
        else if (ch < 0x20 || ch == 0x7f)
            fprintf(f, "\\x%02x", ch);
        else
            fputc(ch, f);
    }
    fputc('"', f);
}

static void config__write_value(FILE *f, const config_key_t *k, const void *src, int indent)
{
    char buf[64];
    switch (k->type) {
    case CONFIG_INT:
        fprintf(f, "%d", *(const int *)src);
        break;
    case CONFIG_FLOAT:
        fprintf(f, "%.15g", *(const double *)src);
        break;
    case CONFIG_BOOL:
        fputs(*(const bool *)src ? "true" : "false", f);
        break;
    case CONFIG_STRING: {
        const char *s = *(char *const *)src;
        config__write_string(f, s ? s : "");
        break;
    }
    case CONFIG_ENUM: {
        int v = *(const int *)src, n = 0;
        while (k->choices[n])
            n++;
        fputs(v >= 0 && v < n ? k->choices[v] : "?", f);
        break;
    }
    case CONFIG_DURATION:
        config__fmt_duration(buf, sizeof buf, *(const int64_t *)src);
        fputs(buf, f);
        break;
    case CONFIG_LIST: {
        const config_strv_t *l = src;
        fputc('[', f);
        for (int i = 0; i < l->n; i++) {
            fputs(i ? ", " : "", f);
            config__write_string(f, l->v[i]);
        }
        fputc(']', f);
        break;
    }
    case CONFIG_ITEMS: {
        /* One flow mapping per line; the item keys are documented above the list. */
        const config_items_t *it = src;
        if (it->n == 0)
            fputs("[]", f);
        for (int i = 0; i < it->n; i++) {
            const char *item = (const char *)it->v + (size_t)i * k->sub->size;
            fprintf(f, "\n%*s  - {", indent, "");
            for (size_t j = 0; j < k->sub->n_keys; j++) {
                const config_key_t *sk = &k->sub->keys[j];
                fprintf(f, "%s%s: ", j ? ", " : "", sk->name);
                config__write_value(f, sk, item + sk->offset, indent + 2);
            }
            fputc('}', f);
        }
        break;
    }
    case CONFIG_SECTION:
        break;
    }
}

int config_write(const config_schema_t *s, const void *cfg, FILE *f)
{
    for (size_t i = 0; i < s->n_keys; i++) {
        const config_key_t *k = &s->keys[i];
        int depth = 0;
        const char *leaf = k->name;
        for (const char *q = k->name; *q; q++)
            if (*q == '.')
                depth++, leaf = q + 1;
        int indent = 2 * depth;
        if (depth == 0 && i > 0)
            fputc('\n', f);
        config__comment(f, indent, k->doc);
        if (k->type == CONFIG_ITEMS) {
            config__comment(f, indent, "Each entry is a mapping of:");
            for (size_t j = 0; j < k->sub->n_keys; j++) {
                const config_key_t *sk = &k->sub->keys[j];
                char line[512];
                if (sk->def)
                    snprintf(line, sizeof line, "  %s: %s Default: %s.", sk->name, sk->doc,
                             sk->def);
                else
                    snprintf(line, sizeof line, "  %s: %s", sk->name, sk->doc);
                config__comment(f, indent, line);
            }
        }
        if (k->type == CONFIG_SECTION) {
            fprintf(f, "%*s%s:\n", indent, "", leaf);
            continue;
        }
        fprintf(f, "%*s%s: ", indent, "", leaf);
        config__write_value(f, k, (const char *)cfg + k->offset, indent);
        fputc('\n', f);
    }
    return ferror(f) ? river_err_set(RIVER_EIO, "config: write failed") : 0;
}
