/* YAML configuration for riverd and river-worker, read with libyaml against a schema.
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
     * was expected ("cpu, cuda or cuda:N") */
    int (*check)(const char *value);
    const char *expect;
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

/* ---- The two configurations ---- */

typedef enum {
    CONFIG_LOG_ERROR = 0,
    CONFIG_LOG_WARN,
    CONFIG_LOG_INFO,
    CONFIG_LOG_DEBUG,
} config_log_level_t;

typedef enum {
    CONFIG_ROLE_FULL = 0, /* the whole model */
    CONFIG_ROLE_RIVER,    /* split pair: shallow backbone and the Exit River */
    CONFIG_ROLE_BACKBONE, /* split pair: the backbone past the offload boundary */
} config_role_t;

/* In the order of the weights key's names: a CPU worker's matrices copied into huge pages,
 * or read in the mapped checkpoint (BACKEND_WEIGHTS_COPY / _MAPPED, kernels/backend.h). */
typedef enum {
    CONFIG_WEIGHTS_COPY = 0,
    CONFIG_WEIGHTS_MAPPED,
} config_weights_t;

/* auth.mode of riverd and river-worker. */
typedef enum {
    CONFIG_AUTH_CURVE = 0, /* CurveZMQ: encrypted, every peer's key checked (the default) */
    CONFIG_AUTH_PLAIN,     /* ZMQ's NULL mechanism: neither encryption nor authentication */
} config_auth_mode_t;

/* riverd's placement of requests that have no session binding. */
typedef enum {
    CONFIG_PLACEMENT_PREFIX = 0, /* the longest cached prefix, then load (the default) */
    CONFIG_PLACEMENT_LOAD,       /* free sequence slots, then free KV pages */
} config_placement_t;

/* One entry of riverd's local_workers: workers riverd starts and restarts itself. */
typedef struct config_local_workers {
    int count;
    char *config; /* the workers' configuration file */
} config_local_workers_t;

typedef struct config_riverd {
    config_strv_t clients;     /* endpoints.clients: ZMQ addresses bound for clients */
    config_strv_t workers;     /* endpoints.workers: ... for workers */
    char *admin;               /* endpoints.admin */
    int metrics_port;          /* endpoints.metrics_port, 0: off */
    char *metrics_address;     /* endpoints.metrics_address: IPv4 address the HTTP port binds */
    int queue_length;          /* requests waiting for a worker before RESOURCE_EXHAUSTED */
    int placement;             /* config_placement_t */
    int max_prompt_tokens;     /* limits.* */
    int max_prompt_bytes;      /* text prompts, before the worker tokenizes them */
    int max_tokens;
    int max_stop_strings;
    int max_stop_length;       /* bytes of one stop string */
    int max_frame_bytes;
    int max_requests_per_client; /* queued or running, per client connection */
    int max_client_backlog;    /* replies queued to one client that does not read them */
    int64_t heartbeat_ms;      /* heartbeat.interval */
    int heartbeat_liveness;    /* heartbeat.liveness: missed beats before a peer is dead */
    int64_t drain_timeout_ms;
    config_items_t local_workers; /* config_local_workers_t */
    int log_level;             /* config_log_level_t */
    /* auth.*: key paths relative to the configuration file's directory. */
    int auth_mode;             /* config_auth_mode_t */
    char *auth_secret_key;     /* riverd's secret certificate (NAME.key_secret) */
    char *auth_clients;        /* directories of the public certificates (NAME.key) */
    char *auth_workers;        /*   allowed on each endpoint */
    char *auth_admin;
} config_riverd_t;

typedef struct config_worker {
    char *riverd;              /* riverd's worker endpoint */
    char *id;                  /* "": host name and process id */
    int role;                  /* config_role_t */
    char *model;
    char *tokenizer;           /* "": beside the model */
    char *river;               /* Exit River file, "": none */
    char *routers;             /* router file, "": none */
    char *device;              /* "cpu", "cuda", "cuda:N" (kernels/backend.h) */
    int threads;               /* 0: every core */
    int weights;               /* config_weights_t */
    int max_batch_rows;
    int max_seqs;
    int prefill_chunk;
    int kv_page_size;          /* kv.page_size */
    int kv_pages;              /* kv.pages, 0: enough for max_seqs full contexts */
    bool prefix_cache_enabled; /* prefix_cache.enabled */
    int prefix_cache_pages;    /* prefix_cache.pages, 0: the pool */
    int exit_rule;             /* exit.rule: exit_rule_t (engine/exit.h) */
    double exit_tau;
    double exit_theta;
    int exit_layer;
    int exit_aggregation;      /* exit.aggregation: exit_agg_t */
    int exit_mode;             /* exit.mode: 0 lossy, 1 lossless (CONFIG_EXIT_MODE_*) */
    int exit_draft_tokens;     /* exit.draft_tokens: most draft tokens per verify pass */
    int split_boundary;        /* split.boundary: first layer on the backbone worker */
    char *split_peer;          /* split.peer */
    int split_transport;       /* split.transport: pair_transport_kind_t (workers/
                                  pair_transport.h) */
    int64_t reconnect_backoff_max_ms; /* reconnect.backoff_max */
    int log_level;             /* config_log_level_t */
    int auth_mode;             /* auth.mode: config_auth_mode_t */
    char *auth_secret_key;     /* this worker's secret certificate */
    char *auth_server_key;     /* riverd's public certificate */
} config_worker_t;

enum { CONFIG_EXIT_MODE_LOSSY = 0, CONFIG_EXIT_MODE_LOSSLESS };

extern const config_schema_t config_schema_riverd; /* config_riverd_t */
extern const config_schema_t config_schema_worker; /* config_worker_t */

#endif
