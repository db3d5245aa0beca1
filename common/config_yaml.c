/* Reading a configuration file: libyaml's events walked against a schema. */
#include "common/config.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include <yaml.h>

#include "common/err.h"
#include "common/config_internal.h"

/* Configuration files are a few kilobytes; a bigger one is a mistake (a model passed as a
 * config), better refused than parsed. */
#define CONFIG_FILE_MAX ((size_t)1 << 20)

/* ---- The YAML walk ----
 *
 * libyaml's event stream is walked with the schema in hand, so that every value is
 * checked where it stands and errors carry the mark (line, column) of the key or value
 * at fault. */

typedef struct config__parser {
    yaml_parser_t yp;
    yaml_event_t ev;
    bool have_ev;
    const char *file;
    const char *text; /* the input, to place reader errors that come with an offset only */
    size_t len;
    char key[CONFIG_NAME_MAX]; /* the key being read, as the user sees it, for messages */
} config__parser_t;

/* One struct being filled: the top-level configuration, or one item of a list. */
typedef struct config__ctx {
    const config_schema_t *s;
    char *base;
    char prefix[CONFIG_NAME_MAX]; /* how its keys are shown: "" or "local_workers[1]." */
    size_t *line;                 /* per key: the line that set it, 0 when not set */
} config__ctx_t;

__attribute__((format(printf, 3, 4))) static int
config__fail(config__parser_t *p, yaml_mark_t m, const char *fmt, ...)
{
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (p->key[0])
        return river_err_set(RIVER_ECONFIG, "%s:%zu:%zu: key '%s': %s", p->file, m.line + 1,
                             m.column + 1, p->key, msg);
    return river_err_set(RIVER_ECONFIG, "%s:%zu:%zu: %s", p->file, m.line + 1, m.column + 1,
                         msg);
}

static int config__syntax(config__parser_t *p)
{
    if (p->yp.error == YAML_MEMORY_ERROR)
        return river_err_set(RIVER_ENOMEM, "%s: out of memory parsing YAML", p->file);
    yaml_mark_t m = p->yp.problem_mark;
    if (p->yp.error == YAML_READER_ERROR) {
        /* The reader (encoding, control characters) reports a byte offset, not a mark. */
        memset(&m, 0, sizeof m);
        for (size_t i = 0; i < p->yp.problem_offset && i < p->len; i++) {
            if (p->text[i] == '\n') {
                m.line++;
                m.column = 0;
            } else {
                m.column++;
            }
        }
    }
    const char *problem = p->yp.problem ? p->yp.problem : "malformed YAML";
    if (p->yp.context)
        return config__fail(p, m, "YAML syntax error: %s (%s at line %zu)", problem,
                            p->yp.context, p->yp.context_mark.line + 1);
    return config__fail(p, m, "YAML syntax error: %s", problem);
}

static int config__next(config__parser_t *p)
{
    if (p->have_ev) {
        yaml_event_delete(&p->ev);
        p->have_ev = false;
    }
    if (!yaml_parser_parse(&p->yp, &p->ev))
        return config__syntax(p);
    p->have_ev = true;
    /* Anchors and aliases would let one value stand in several places; configurations
     * here are short enough to write out, and the checks stay simple. */
    if (p->ev.type == YAML_ALIAS_EVENT)
        return config__fail(p, p->ev.start_mark, "YAML aliases (*name) are not supported");
    return 0;
}

static bool config__is_null(const yaml_event_t *ev)
{
    if (ev->type != YAML_SCALAR_EVENT || ev->data.scalar.style != YAML_PLAIN_SCALAR_STYLE)
        return false;
    const char *v = (const char *)ev->data.scalar.value;
    return !*v || strcmp(v, "~") == 0 || strcmp(v, "null") == 0 || strcmp(v, "Null") == 0 ||
           strcmp(v, "NULL") == 0;
}

/* How a node looks, for messages: "a mapping", "a list", "no value", "'text'". */
static void config__describe(const yaml_event_t *ev, char *buf, size_t cap)
{
    if (ev->type == YAML_MAPPING_START_EVENT) {
        snprintf(buf, cap, "a mapping");
    } else if (ev->type == YAML_SEQUENCE_START_EVENT) {
        snprintf(buf, cap, "a list");
    } else if (ev->type != YAML_SCALAR_EVENT) {
        snprintf(buf, cap, "something else");
    } else if (config__is_null(ev)) {
        snprintf(buf, cap, "no value");
    } else {
        /* Quote at most 60 bytes, cut before a UTF-8 continuation byte. */
        const char *v = (const char *)ev->data.scalar.value;
        size_t n = ev->data.scalar.length, show = n < 60 ? n : 60;
        while (show < n && show > 0 && ((unsigned char)v[show] & 0xc0) == 0x80)
            show--;
        snprintf(buf, cap, "'%.*s%s'", (int)show, v, show < n ? "..." : "");
    }
}

static int config__mapping(config__parser_t *p, config__ctx_t *c, const char *section);

/* The current event is the value of a scalar key. */
static int config__scalar(config__parser_t *p, const config_key_t *k, void *dst)
{
    char want[256], got[128];
    config__expect(k, want, sizeof want);
    config__describe(&p->ev, got, sizeof got);
    yaml_mark_t m = p->ev.start_mark;
    if (p->ev.type != YAML_SCALAR_EVENT || config__is_null(&p->ev))
        return config__fail(p, m, "expected %s, got %s", want, got);
    const char *v = (const char *)p->ev.data.scalar.value;
    if (memchr(v, '\0', p->ev.data.scalar.length))
        return config__fail(p, m, "expected %s, got a value with a NUL character", want);
    int rc = config__convert(k, v, dst);
    if (rc == 1)
        return config__fail(p, m, "expected %s, got %s", want, got);
    return rc;
}

static int config__list(config__parser_t *p, const config_key_t *k, config_strv_t *l)
{
    char want[256], got[128];
    config__expect(k, want, sizeof want);
    config__describe(&p->ev, got, sizeof got);
    yaml_mark_t m = p->ev.start_mark;
    if (p->ev.type != YAML_SEQUENCE_START_EVENT && !config__is_null(&p->ev))
        return config__fail(p, m, "expected %s, got %s", want, got);
    config__strv_free(l); /* the file's list replaces the default */
    if (p->ev.type == YAML_SEQUENCE_START_EVENT) {
        for (;;) {
            int rc = config__next(p);
            if (rc < 0)
                return rc;
            if (p->ev.type == YAML_SEQUENCE_END_EVENT)
                break;
            config__describe(&p->ev, got, sizeof got);
            if (p->ev.type != YAML_SCALAR_EVENT || config__is_null(&p->ev) ||
                memchr(p->ev.data.scalar.value, '\0', p->ev.data.scalar.length))
                return config__fail(p, p->ev.start_mark, "expected %s, entry %d is %s", want,
                                    l->n, got);
            if (l->n >= k->max)
                return config__fail(p, p->ev.start_mark, "expected %s, got more", want);
            rc = config__strv_push(l, (const char *)p->ev.data.scalar.value,
                                   p->ev.data.scalar.length);
            if (rc < 0)
                return rc;
        }
    }
    if (l->n < k->min)
        return config__fail(p, m, "expected %s, got %d", want, l->n);
    return 0;
}

/* Keys without a default that the file did not set; m is where the struct began. */
static int config__required(config__parser_t *p, const config__ctx_t *c, yaml_mark_t m)
{
    for (size_t i = 0; i < c->s->n_keys; i++) {
        const config_key_t *k = &c->s->keys[i];
        if (!k->def && k->type != CONFIG_SECTION && !c->line[i]) {
            snprintf(p->key, sizeof p->key, "%s%s", c->prefix, k->name);
            return config__fail(p, m, "required key missing");
        }
    }
    return 0;
}

static int config__items(config__parser_t *p, const config_key_t *k, config_items_t *it)
{
    char want[256], got[128], shown[CONFIG_NAME_MAX];
    config__expect(k, want, sizeof want);
    config__describe(&p->ev, got, sizeof got);
    snprintf(shown, sizeof shown, "%s", p->key);
    yaml_mark_t m = p->ev.start_mark;
    if (p->ev.type != YAML_SEQUENCE_START_EVENT && !config__is_null(&p->ev))
        return config__fail(p, m, "expected %s, got %s", want, got);
    const config_schema_t *sub = k->sub;
    if (p->ev.type == YAML_SEQUENCE_START_EVENT) {
        for (;;) {
            int rc = config__next(p);
            if (rc < 0)
                return rc;
            if (p->ev.type == YAML_SEQUENCE_END_EVENT)
                break;
            config__describe(&p->ev, got, sizeof got);
            snprintf(p->key, sizeof p->key, "%s", shown);
            if (p->ev.type != YAML_MAPPING_START_EVENT)
                return config__fail(p, p->ev.start_mark, "expected %s, entry %d is %s", want,
                                    it->n, got);
            if (it->n >= k->max)
                return config__fail(p, p->ev.start_mark, "expected %s, got more", want);
            char *v = realloc(it->v, (size_t)(it->n + 1) * sub->size);
            if (!v)
                return river_err_set(RIVER_ENOMEM, "config: %d items", it->n + 1);
            it->v = v;
            char *item = v + (size_t)it->n * sub->size;
            memset(item, 0, sub->size);
            it->n++;
            rc = config__apply_defaults(sub, item);
            if (rc < 0)
                return rc;
            config__ctx_t ic = {.s = sub, .base = item};
            snprintf(ic.prefix, sizeof ic.prefix, "%.200s[%d].", shown, it->n - 1);
            ic.line = calloc(sub->n_keys, sizeof *ic.line);
            if (!ic.line)
                return river_err_set(RIVER_ENOMEM, "config: item");
            yaml_mark_t im = p->ev.start_mark;
            rc = config__mapping(p, &ic, "");
            if (rc == 0)
                rc = config__required(p, &ic, im);
            free(ic.line);
            if (rc < 0)
                return rc;
        }
    }
    snprintf(p->key, sizeof p->key, "%s", shown);
    if (it->n < k->min)
        return config__fail(p, m, "expected %s, got %d", want, it->n);
    return 0;
}

/* An unknown key: say which keys would have been right here. */
static int config__unknown(config__parser_t *p, const config__ctx_t *c, yaml_mark_t m,
                           const char *section)
{
    char known[512];
    size_t o = 0, plen = strlen(section);
    known[0] = '\0';
    for (size_t i = 0; i < c->s->n_keys && o < sizeof known; i++) {
        const char *n = c->s->keys[i].name;
        if (strncmp(n, section, plen) != 0 || strchr(n + plen, '.'))
            continue;
        o += (size_t)snprintf(known + o, sizeof known - o, "%s%s", o ? ", " : "", n + plen);
    }
    return config__fail(p, m, "unknown key (known here: %s)", known);
}

/* The current event is a MAPPING_START; reads up to its MAPPING_END. section is the
 * schema prefix of its keys ("" or "limits."). */
static int config__mapping(config__parser_t *p, config__ctx_t *c, const char *section)
{
    for (;;) {
        int rc = config__next(p);
        if (rc < 0)
            return rc;
        if (p->ev.type == YAML_MAPPING_END_EVENT)
            return 0;
        yaml_mark_t km = p->ev.start_mark;
        if (p->ev.type != YAML_SCALAR_EVENT) {
            char got[128];
            config__describe(&p->ev, got, sizeof got);
            return config__fail(p, km, "expected a key name, got %s", got);
        }
        const char *name = (const char *)p->ev.data.scalar.value;
        size_t nlen = p->ev.data.scalar.length;
        char full[CONFIG_NAME_MAX];
        snprintf(full, sizeof full, "%s%.*s", section, (int)(nlen < 100 ? nlen : 100), name);
        snprintf(p->key, sizeof p->key, "%.100s%.150s", c->prefix, full);
        /* Dotted names are the table's spelling, not the file's: "limits.max_tokens:"
         * at the top would bypass the section. */
        long idx = nlen >= 100 || memchr(name, '.', nlen) || memchr(name, '\0', nlen)
                       ? -1
                       : config__find(c->s, full);
        if (idx < 0)
            return config__unknown(p, c, km, section);
        const config_key_t *k = &c->s->keys[idx];
        if (c->line[idx])
            return config__fail(p, km, "duplicate key (first at line %zu)", c->line[idx]);
        c->line[idx] = km.line + 1;

        rc = config__next(p);
        if (rc < 0)
            return rc;
        void *dst = c->base + k->offset;
        switch (k->type) {
        case CONFIG_SECTION:
            if (p->ev.type == YAML_MAPPING_START_EVENT) {
                char sub[CONFIG_NAME_MAX];
                snprintf(sub, sizeof sub, "%.200s.", full);
                rc = config__mapping(p, c, sub);
            } else if (!config__is_null(&p->ev)) {
                char got[128];
                config__describe(&p->ev, got, sizeof got);
                rc = config__fail(p, p->ev.start_mark, "expected a mapping, got %s", got);
            }
            break;
        case CONFIG_LIST:
            rc = config__list(p, k, dst);
            break;
        case CONFIG_ITEMS:
            rc = config__items(p, k, dst);
            break;
        default:
            rc = config__scalar(p, k, dst);
            break;
        }
        if (rc < 0)
            return rc;
    }
}

static int config__document(config__parser_t *p, config__ctx_t *c)
{
    int rc = config__next(p); /* STREAM_START */
    if (rc < 0)
        return rc;
    yaml_mark_t start = p->ev.start_mark;
    rc = config__next(p);
    if (rc < 0)
        return rc;
    if (p->ev.type == YAML_DOCUMENT_START_EVENT) {
        start = p->ev.start_mark;
        rc = config__next(p);
        if (rc < 0)
            return rc;
        if (p->ev.type == YAML_MAPPING_START_EVENT) {
            rc = config__mapping(p, c, "");
        } else if (!config__is_null(&p->ev)) {
            char got[128];
            config__describe(&p->ev, got, sizeof got);
            rc = config__fail(p, p->ev.start_mark,
                              "expected a mapping of %s keys at the top, got %s", c->s->name,
                              got);
        }
        if (rc < 0)
            return rc;
        p->key[0] = '\0';
        rc = config__next(p); /* DOCUMENT_END */
        if (rc < 0)
            return rc;
        rc = config__next(p);
        if (rc < 0)
            return rc;
        if (p->ev.type != YAML_STREAM_END_EVENT)
            return config__fail(p, p->ev.start_mark, "only one YAML document is allowed");
    }
    return config__required(p, c, start);
}

int config_load_string(const config_schema_t *s, const char *name, const char *text,
                       size_t len, void *cfg)
{
    int rc = config_defaults(s, cfg);
    if (rc < 0)
        return rc;
    config__parser_t p = {.file = name, .text = text, .len = len};
    config__ctx_t c = {.s = s, .base = cfg};
    c.line = calloc(s->n_keys, sizeof *c.line);
    if (!c.line) {
        rc = river_err_set(RIVER_ENOMEM, "%s: config", name);
        goto fail_line;
    }
    if (!yaml_parser_initialize(&p.yp)) {
        rc = river_err_set(RIVER_ENOMEM, "%s: YAML parser", name);
        goto fail_parser;
    }
    yaml_parser_set_input_string(&p.yp, (const unsigned char *)text, len);
    rc = config__document(&p, &c);
    const char *bad_key = NULL, *why = rc >= 0 && s->check ? s->check(cfg, &bad_key) : NULL;
    if (why) {
        long ki = bad_key ? config__find(s, bad_key) : -1;
        size_t line = ki >= 0 ? c.line[ki] : 0;
        if (line)
            rc = river_err_set(RIVER_ECONFIG, "%s:%zu: key '%s': %s", name, line, bad_key, why);
        else
            rc = river_err_set(RIVER_ECONFIG, "%s: key '%s': %s", name, bad_key, why);
    }
    if (p.have_ev)
        yaml_event_delete(&p.ev);
    yaml_parser_delete(&p.yp);
fail_parser:
    free(c.line);
fail_line:
    if (rc < 0)
        config_free(s, cfg);
    return rc;
}

int config_load(const config_schema_t *s, const char *path, void *cfg)
{
    memset(cfg, 0, s->size);
    FILE *f = fopen(path, "rb");
    if (!f)
        return river_err_set(RIVER_EIO, "%s: %s", path, strerror(errno));
    char *text = malloc(CONFIG_FILE_MAX + 1);
    if (!text) {
        fclose(f);
        return river_err_set(RIVER_ENOMEM, "%s: read buffer", path);
    }
    size_t n = fread(text, 1, CONFIG_FILE_MAX + 1, f);
    int rc = 0;
    if (ferror(f))
        rc = river_err_set(RIVER_EIO, "%s: read failed", path);
    else if (n > CONFIG_FILE_MAX)
        rc = river_err_set(RIVER_ECONFIG, "%s: over %zu bytes, not a configuration file",
                           path, CONFIG_FILE_MAX);
    fclose(f);
    if (rc == 0)
        rc = config_load_string(s, path, text, n, cfg);
    free(text);
    return rc;
}
