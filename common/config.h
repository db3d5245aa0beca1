/* YAML configuration files, read with libyaml against a schema that each program keeps
 * with its own code (riverd: daemon/config.h, river-worker: workers/config.h,
 * river-gateway: gateway/gateway.h).
 *
 * A schema is a table of keys, each with its type, where it lives in the configuration
 * struct, its range, its default (as YAML text) and a line of documentation. Nested
 * mappings are sections: the key "limits.max_tokens" is `max_tokens:` inside `limits:`.
 * Loading fills the struct with the defaults, then with the file's values; anything the
 * schema does not allow (an unknown or duplicate key, a value of the wrong type or out of
 * range, malformed YAML) fails with RIVER_ECONFIG and a detail line
 *     riverd.yaml:12:5: key 'limits.max_tokens': expected an integer in [1, 16777216],
 *     got 'lots'
 * The same table writes a commented file with every key (config_write), which is how the
 * examples under configs/ were made. */
#ifndef RIVER_COMMON_CONFIG_H
#define RIVER_COMMON_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef enum {
    CONFIG_SECTION = 0, /* a nested mapping; its keys follow it in the table */
    CONFIG_INT,         /* int */
    CONFIG_FLOAT,       /* double */
    CONFIG_BOOL,        /* bool: true/false (also yes/no, on/off) */
    CONFIG_STRING,      /* char *, owned by the struct; "" when empty, never NULL */
    CONFIG_ENUM,        /* int: the index of the name in `choices` */
    CONFIG_LIST,        /* config_strv_t: a list of strings */
    CONFIG_DURATION,    /* int64_t milliseconds; written 250ms, 2s, 5m, 1h */
    CONFIG_ITEMS,       /* config_items_t: a list of mappings, each a struct of `sub` */
} config_type_t;

typedef struct config_strv {
    char **v;
    int n;
} config_strv_t;

typedef struct config_items {
    void *v; /* n structs of the item schema's size */
    int n;
} config_items_t;

typedef struct config_schema config_schema_t;

typedef struct config_key {
    const char *name;            /* dotted path: "heartbeat.interval" */
    config_type_t type;
    size_t offset;               /* of the value in the configuration struct */
    double min, max;             /* int, float, duration (ms): the value's range;
                                    list, items: the number of entries */
    const char *def;             /* the default as YAML would spell it ("30s", "info");
                                    lists: entries joined by ','; NULL: required */
    const char *doc;
    const char *const *choices;  /* enum: the names, NULL-terminated */
    const config_schema_t *sub;  /* items: the schema of one item */
    /* string: optional check of the value's form (0: fine), and what the error then says
     * was expected ("cpu, cuda, cuda:N or opaque"), from the code that owns the form so
     * that the message cannot drift from the check */
    int (*check)(const char *value);
    const char *(*expect)(void);
} config_key_t;

struct config_schema {
    const char *name; /* "riverd", shown in messages */
    const config_key_t *keys;
    size_t n_keys;
    size_t size;      /* of the configuration struct */
    /* Optional check of keys that only make sense together, after the whole file is read:
     * returns NULL when cfg is fine, else a message, with *key the key at fault (its line
     * goes into the error). */
    const char *(*check)(const void *cfg, const char **key);
};

/* Entries of a schema's key table, for every program that has one (riverd, river-worker,
 * river-gateway): a key of struct T's field f, an enum key, a section, and a table's size. */
#define CONFIG_KEY(T, n, t, f, lo, hi, d, dc)                                            \
    {                                                                                     \
        .name = (n), .type = (t), .offset = offsetof(T, f), .min = (lo), .max = (hi),     \
        .def = (d), .doc = (dc)                                                           \
    }
#define CONFIG_ENUM_KEY(T, n, f, ch, d, dc)                                                  \
    {                                                                                     \
        .name = (n), .type = CONFIG_ENUM, .offset = offsetof(T, f), .def = (d),           \
        .doc = (dc), .choices = (ch)                                                      \
    }
#define CONFIG_SECTION_KEY(n, dc)                                                            \
    {                                                                                     \
        .name = (n), .type = CONFIG_SECTION, .doc = (dc)                                  \
    }
#define CONFIG_N(a) (sizeof(a) / sizeof((a)[0]))

/* Fills cfg (a struct of s->size bytes) with the defaults. RIVER_EINVAL names a broken
 * schema (a default that does not parse, a key outside its section...). */
int config_defaults(const config_schema_t *s, void *cfg);

/* Reads a YAML file into cfg: defaults first, then the file. On error cfg holds nothing
 * to free (it is zeroed) and river_err_detail() says file:line:column and the key. */
int config_load(const config_schema_t *s, const char *path, void *cfg);

/* config_load on text in memory; name stands for the file name in messages. */
int config_load_string(const config_schema_t *s, const char *name, const char *text,
                       size_t len, void *cfg);

/* Frees what the struct owns (strings, lists, items) and zeroes it. */
void config_free(const config_schema_t *s, void *cfg);

/* Writes cfg as YAML: every key, each after its documentation as a comment. Loading the
 * output gives cfg back. RIVER_EIO when the stream fails. */
int config_write(const config_schema_t *s, const void *cfg, FILE *f);

/* The key of that dotted name, or NULL. */
const config_key_t *config_find_key(const config_schema_t *s, const char *name);

/* ---- What every process's schema shares ---- */

/* log_level of riverd, river-worker and river-gateway (common/log.h). */
typedef enum {
    CONFIG_LOG_ERROR = 0,
    CONFIG_LOG_WARN,
    CONFIG_LOG_INFO,
    CONFIG_LOG_DEBUG,
} config_log_level_t;

/* auth.mode of riverd, river-worker and river-gateway. */
typedef enum {
    CONFIG_AUTH_CURVE = 0, /* CurveZMQ: encrypted, every peer's key checked (the default) */
    CONFIG_AUTH_PLAIN,     /* ZMQ's NULL mechanism: neither encryption nor authentication */
} config_auth_mode_t;

/* Their names, in the order of the enums, NULL-terminated: the `choices` of the log_level
 * and auth.mode keys of every schema. */
extern const char *const config_log_level_names[];
extern const char *const config_auth_mode_names[];

#endif
