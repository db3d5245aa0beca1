/* Keys and values of a configuration: lookup, conversion of a scalar to its key's type,
 * the schema's own checks and the defaults. */
#include "common/config.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/config_internal.h"

long config__find(const config_schema_t *s, const char *name)
{
    for (size_t i = 0; i < s->n_keys; i++)
        if (strcmp(s->keys[i].name, name) == 0)
            return (long)i;
    return -1;
}

const config_key_t *config_find_key(const config_schema_t *s, const char *name)
{
    long i = config__find(s, name);
    return i < 0 ? NULL : &s->keys[i];
}

void config__strv_free(config_strv_t *l)
{
    for (int i = 0; i < l->n; i++)
        free(l->v[i]);
    free(l->v);
    l->v = NULL;
    l->n = 0;
}

int config__strv_push(config_strv_t *l, const char *s, size_t n)
{
    char *copy = malloc(n + 1);
    char **v = copy ? realloc(l->v, (size_t)(l->n + 1) * sizeof *v) : NULL;
    if (!v) {
        free(copy);
        return river_err_set(RIVER_ENOMEM, "config: list entry of %zu bytes", n);
    }
    memcpy(copy, s, n);
    copy[n] = '\0';
    l->v = v;
    l->v[l->n++] = copy;
    return 0;
}

/* Writes a duration in the largest unit that divides it. */
void config__fmt_duration(char *buf, size_t cap, int64_t ms)
{
    static const struct {
        const char *unit;
        int64_t ms;
    } units[] = {{"h", 3600000}, {"m", 60000}, {"s", 1000}};
    for (size_t i = 0; i < CONFIG_N(units); i++) {
        if (ms != 0 && ms % units[i].ms == 0) {
            snprintf(buf, cap, "%lld%s", (long long)(ms / units[i].ms), units[i].unit);
            return;
        }
    }
    snprintf(buf, cap, ms == 0 ? "0s" : "%lldms", (long long)ms);
}

/* What a key's value must look like, for messages: "an integer in [1, 65535]". */
void config__expect(const config_key_t *k, char *buf, size_t cap)
{
    char lo[32], hi[32];
    switch (k->type) {
    case CONFIG_SECTION:
        snprintf(buf, cap, "a mapping");
        break;
    case CONFIG_INT:
        snprintf(buf, cap, "an integer in [%.0f, %.0f]", k->min, k->max);
        break;
    case CONFIG_FLOAT:
        snprintf(buf, cap, "a number in [%g, %g]", k->min, k->max);
        break;
    case CONFIG_BOOL:
        snprintf(buf, cap, "true or false");
        break;
    case CONFIG_STRING:
        snprintf(buf, cap, "%s", k->expect ? k->expect() : "a string");
        break;
    case CONFIG_ENUM: {
        /* "error, warn, info or debug" */
        size_t o = 0;
        buf[0] = '\0';
        for (int i = 0; k->choices[i] && o < cap; i++) {
            const char *sep = i == 0 ? "" : k->choices[i + 1] ? ", " : " or ";
            o += (size_t)snprintf(buf + o, cap - o, "%s%s", sep, k->choices[i]);
        }
        break;
    }
    case CONFIG_DURATION:
        config__fmt_duration(lo, sizeof lo, (int64_t)k->min);
        config__fmt_duration(hi, sizeof hi, (int64_t)k->max);
        snprintf(buf, cap, "a duration such as 250ms, 2s, 5m or 1h, in [%s, %s]", lo, hi);
        break;
    case CONFIG_LIST:
        snprintf(buf, cap, "a list of %.0f to %.0f strings", k->min, k->max);
        break;
    case CONFIG_ITEMS:
        snprintf(buf, cap, "a list of %.0f to %.0f mappings", k->min, k->max);
        break;
    }
}

/* strtoll/strtod skip leading blanks and accept a sign on their own; values here must
 * be the whole text. */
static bool config__plain_number(const char *s)
{
    return *s && !isspace((unsigned char)*s);
}

static bool config__parse_duration(const char *s, int64_t *ms)
{
    static const struct {
        const char *unit;
        double ms;
    } units[] = {{"ms", 1}, {"s", 1000}, {"m", 60000}, {"h", 3600000}};
    if (strcmp(s, "0") == 0) {
        *ms = 0;
        return true;
    }
    if (!isdigit((unsigned char)*s))
        return false;
    char *end;
    errno = 0;
    double x = strtod(s, &end);
    if (errno || end == s || !isfinite(x))
        return false;
    for (size_t i = 0; i < CONFIG_N(units); i++) {
        if (strcmp(end, units[i].unit) == 0) {
            double v = x * units[i].ms;
            if (v > 9.0e15)
                return false;
            *ms = (int64_t)llround(v);
            return true;
        }
    }
    return false;
}

/* Converts text to a scalar key's value and stores it at dst; 1 when the text is not a
 * value of the key (wrong type or out of range), RIVER_ENOMEM when a copy fails. */
int config__convert(const config_key_t *k, const char *v, void *dst)
{
    char *end;
    switch (k->type) {
    case CONFIG_INT: {
        if (!config__plain_number(v))
            return 1;
        errno = 0;
        long long x = strtoll(v, &end, 10);
        if (errno || *end || x < k->min || x > k->max)
            return 1;
        *(int *)dst = (int)x;
        return 0;
    }
    case CONFIG_FLOAT: {
        if (!config__plain_number(v))
            return 1;
        errno = 0;
        double x = strtod(v, &end);
        if (errno || *end || !isfinite(x) || x < k->min || x > k->max)
            return 1;
        *(double *)dst = x;
        return 0;
    }
    case CONFIG_BOOL: {
        static const char *const yes[] = {"true", "yes", "on"}, *const no[] = {"false", "no",
                                                                                "off"};
        for (size_t i = 0; i < CONFIG_N(yes); i++) {
            if (strcasecmp(v, yes[i]) == 0) {
                *(bool *)dst = true;
                return 0;
            }
            if (strcasecmp(v, no[i]) == 0) {
                *(bool *)dst = false;
                return 0;
            }
        }
        return 1;
    }
    case CONFIG_STRING: {
        if (k->check && k->check(v))
            return 1;
        char *copy = strdup(v);
        if (!copy)
            return river_err_set(RIVER_ENOMEM, "config: string of %zu bytes", strlen(v));
        free(*(char **)dst);
        *(char **)dst = copy;
        return 0;
    }
    case CONFIG_ENUM:
        for (int i = 0; k->choices[i]; i++) {
            if (strcmp(v, k->choices[i]) == 0) {
                *(int *)dst = i;
                return 0;
            }
        }
        return 1;
    case CONFIG_DURATION: {
        int64_t ms;
        if (!config__parse_duration(v, &ms) || ms < k->min || ms > k->max)
            return 1;
        *(int64_t *)dst = ms;
        return 0;
    }
    default:
        return 1;
    }
}

/* ---- Schema checks and defaults ---- */

/* Catches table mistakes early, in the first test that loads a configuration: keys of a
 * section must follow the section, enums need names, items a schema. */
static int config__check_schema(const config_schema_t *s)
{
    for (size_t i = 0; i < s->n_keys; i++) {
        const config_key_t *k = &s->keys[i];
        const char *dot = strrchr(k->name, '.');
        if (!*k->name || strlen(k->name) >= CONFIG_NAME_MAX / 2 || k->offset >= s->size)
            return river_err_set(RIVER_EINVAL, "schema %s: key %zu: bad name or offset",
                                 s->name, i);
        if (dot) {
            /* The parent section must come before, with only its own keys in between. */
            size_t plen = (size_t)(dot - k->name);
            const config_key_t *prev = i ? &s->keys[i - 1] : NULL;
            bool ok = prev && strncmp(prev->name, k->name, plen) == 0 &&
                      (prev->name[plen] == '\0' || prev->name[plen] == '.');
            long parent = -1;
            for (size_t j = 0; j < i; j++)
                if (strlen(s->keys[j].name) == plen &&
                    strncmp(s->keys[j].name, k->name, plen) == 0)
                    parent = (long)j;
            if (!ok || parent < 0 || s->keys[parent].type != CONFIG_SECTION)
                return river_err_set(RIVER_EINVAL, "schema %s: key '%s' is not inside its "
                                     "section", s->name, k->name);
        }
        if (k->type == CONFIG_ENUM && !k->choices)
            return river_err_set(RIVER_EINVAL, "schema %s: enum '%s' has no names", s->name,
                                 k->name);
        if (k->type == CONFIG_ITEMS) {
            if (!k->sub)
                return river_err_set(RIVER_EINVAL, "schema %s: '%s' has no item schema",
                                     s->name, k->name);
            int rc = config__check_schema(k->sub);
            if (rc < 0)
                return rc;
        }
        if (config__find(s, k->name) != (long)i)
            return river_err_set(RIVER_EINVAL, "schema %s: key '%s' twice", s->name, k->name);
    }
    return 0;
}

int config__apply_defaults(const config_schema_t *s, void *cfg)
{
    for (size_t i = 0; i < s->n_keys; i++) {
        const config_key_t *k = &s->keys[i];
        void *dst = (char *)cfg + k->offset;
        int rc = 0;
        if (k->type == CONFIG_SECTION || k->type == CONFIG_ITEMS)
            continue;
        if (k->type == CONFIG_LIST) {
            /* Entries joined by ','; "" is the empty list. */
            const char *d = k->def ? k->def : "";
            while (*d && rc == 0) {
                size_t n = strcspn(d, ",");
                rc = config__strv_push(dst, d, n);
                d += n + (d[n] == ',');
            }
        } else if (k->def) {
            rc = config__convert(k, k->def, dst);
        } else if (k->type == CONFIG_STRING) {
            /* Required, and set by the file; "" until then so strings are never NULL. */
            rc = config__convert(k, "", dst);
        }
        if (rc == 1) {
            char want[256];
            config__expect(k, want, sizeof want);
            return river_err_set(RIVER_EINVAL, "schema %s: key '%s': default '%s' is not %s",
                                 s->name, k->name, k->def, want);
        }
        if (rc < 0)
            return rc;
    }
    return 0;
}

void config_free(const config_schema_t *s, void *cfg)
{
    if (!cfg)
        return;
    for (size_t i = 0; i < s->n_keys; i++) {
        const config_key_t *k = &s->keys[i];
        void *dst = (char *)cfg + k->offset;
        switch (k->type) {
        case CONFIG_STRING:
            free(*(char **)dst);
            break;
        case CONFIG_LIST:
            config__strv_free(dst);
            break;
        case CONFIG_ITEMS: {
            config_items_t *it = dst;
            for (int j = 0; j < it->n; j++)
                config_free(k->sub, (char *)it->v + (size_t)j * k->sub->size);
            free(it->v);
            break;
        }
        default:
            break;
        }
    }
    memset(cfg, 0, s->size);
}

int config_defaults(const config_schema_t *s, void *cfg)
{
    memset(cfg, 0, s->size);
    int rc = config__check_schema(s);
    if (rc == 0)
        rc = config__apply_defaults(s, cfg);
    if (rc < 0)
        config_free(s, cfg);
    return rc;
}
