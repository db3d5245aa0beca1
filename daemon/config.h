/* riverd's configuration file: the struct its schema fills (daemon/config_schema.c holds
 * the keys; common/config.h reads and writes files against it). */
#ifndef RIVER_DAEMON_CONFIG_H
#define RIVER_DAEMON_CONFIG_H

#include <stdint.h>

#include "common/config.h"

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
    int max_requests_per_client; /* queued or running, per client (key or connection) and
                                    tenant */
    int max_requests_per_key;    /* the same, of all of one client's tenants together */
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

extern const config_schema_t config_schema_riverd; /* config_riverd_t */

#endif
