/* river-worker's configuration file: the struct its schema fills (workers/config_schema.c
 * holds the keys; common/config.h reads and writes files against it). */
#ifndef RIVER_WORKERS_CONFIG_H
#define RIVER_WORKERS_CONFIG_H

#include <stdbool.h>
#include <stdint.h>

#include "common/config.h"

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
    int kv_dtype;              /* kv.dtype, a gen_kv_dtype_t (engine/generate.h) */
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

extern const config_schema_t config_schema_worker; /* config_worker_t */

#endif
