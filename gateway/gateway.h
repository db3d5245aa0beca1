/* river-gateway: an OpenAI-compatible HTTP server in front of riverd.
 *
 * The gateway owns no model. It speaks HTTP to its clients (gateway/http.c, libmicrohttpd
 * on a few epoll threads, connections suspended while they wait for riverd) and riverd's client protocol to riverd (gateway/bridge.c: one
 * thread owns the river_client_t connection, since a client connection is not
 * thread-safe). Requests are parsed and validated by gateway/openai.c, which also builds
 * the response and chunk JSON; chat requests are rendered with the model's chat template
 * (gateway/models.c, text/chat_template.h) into a prompt that carries its special tokens
 * as text. Errors map to OpenAI's error object through one table (gateway/errors.c).
 *
 * The declarations below are shared by the gateway's files only. */
#ifndef RIVER_GATEWAY_GATEWAY_H
#define RIVER_GATEWAY_GATEWAY_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "client/river_client.h"
#include "common/config.h"
#include "gateway/toolcall.h"

/* ---- Configuration (gateway/config.c) ---- */

/* One entry of `models:`: a name clients use and where its chat template comes from. */
typedef struct gw_model_cfg {
    char *name;          /* the `model` field clients send */
    char *dir;           /* model directory whose tokenizer_config.json has the template */
    char *chat_template; /* a Jinja file that replaces the directory's template; "": none */
    char *template_name; /* which of a list of named templates; "": the default */
} gw_model_cfg_t;

typedef struct gw_config {
    char *listen_address;      /* listen.address: IPv4 address bound */
    int listen_port;           /* listen.port, 0: any free port (logged) */
    char *riverd_endpoint;     /* riverd.endpoint: riverd's client endpoint */
    int auth_mode;             /* riverd.auth_mode: config_auth_mode_t */
    char *secret_key;          /* riverd.secret_key: the gateway's client key */
    char *server_key;          /* riverd.server_key: riverd's public key */
    config_items_t models;     /* gw_model_cfg_t */
    char *api_keys;            /* api_keys: file of SHA-256 hex digests; "": no keys */
    char *raw_special_keys;    /* raw_special_keys: keys whose text may hold special tokens */
    int max_render_bytes;      /* limits.max_render_bytes: bytes one rendering may take */
    int max_body_bytes;        /* limits.max_body_bytes */
    int max_concurrent;        /* limits.max_concurrent: requests in flight */
    int max_connections;       /* limits.max_connections: HTTP connections */
    int max_connections_per_address; /* limits.max_connections_per_address: from one IP */
    int64_t request_timeout_ms; /* timeouts.request: deadline given to riverd, 0: none */
    int64_t connection_timeout_ms; /* timeouts.connection: idle HTTP connection */
    int tenant_requests_per_minute; /* tenants.requests_per_minute, 0: no limit */
    int tenant_tokens_per_minute;   /* tenants.tokens_per_minute, 0: no limit */
    bool tenant_share_cache;        /* tenants.share_prefix_cache */
    int64_t headers_timeout_ms; /* timeouts.headers: accept to the end of the headers */
    int64_t body_timeout_ms;   /* timeouts.body: the end of the headers to the end of the body */
    double default_temperature; /* sampling.default_temperature: when a request has none */
    char *metrics_address;     /* metrics.address: IPv4 address of the metrics listener */
    int metrics_port;          /* metrics.port: -1 none (on the main listener, keyed), 0 any */
    int log_level;             /* config_log_level_t */
} gw_config_t;

extern const config_schema_t gw_config_schema; /* gw_config_t */

/* ---- Errors (gateway/errors.c) ---- */

typedef enum {
    GW_ERR_INVALID = 0,    /* 400: malformed JSON, wrong type, bad value */
    GW_ERR_AUTH,           /* 401: missing or unknown API key */
    GW_ERR_MODEL,          /* 404: unknown model */
    GW_ERR_NOT_FOUND,      /* 404: unknown path */
    GW_ERR_METHOD,         /* 405 */
    GW_ERR_TOO_LARGE,      /* 413: body over limits.max_body_bytes */
    GW_ERR_RATE,           /* 429: over a limit (here or riverd's RESOURCE_EXHAUSTED) */
    GW_ERR_INTERNAL,       /* 500 */
    GW_ERR_UPSTREAM_AUTH,  /* 502: riverd refused the gateway's key */
    GW_ERR_UNAVAILABLE,    /* 503: no worker, riverd unreachable or shutting down */
    GW_ERR_DEADLINE,       /* 504 */
    GW_ERR_COUNT
} gw_err_kind_t;

typedef struct gw_error {
    gw_err_kind_t kind;
    char message[512];
    char param[96]; /* the request field at fault; "" when none */
} gw_error_t;

/* Fills e and returns -1, so that parsers can `return gw_error_set(...)`. */
int gw_error_set(gw_error_t *e, gw_err_kind_t kind, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
int gw_error_status(gw_err_kind_t kind);
/* Cuts every absolute path in msg (in place) down to its last component. */
void gw_error_scrub_paths(char *msg);
/* {"error":{"message","type","param","code"}}, server paths cut from the message (but a
 * 404's or 405's, whose path is the client's); a new reference. */
json_t *gw_error_json(const gw_error_t *e);
/* The kind of an error riverd (or the client library) ended a request with. */
gw_err_kind_t gw_error_from_river(river_code_t code);

/* ---- Requests and responses (gateway/openai.c) ---- */

typedef enum { GW_API_CHAT = 0, GW_API_COMPLETIONS } gw_api_t;

/* tool_choice: whether the model may call (auto), must not (none), must call one of the
 * tools (required) or the one named. */
typedef enum {
    GW_TOOL_CHOICE_AUTO = 0,
    GW_TOOL_CHOICE_NONE,
    GW_TOOL_CHOICE_REQUIRED,
    GW_TOOL_CHOICE_NAMED,
} gw_tool_choice_t;

/* A validated request. Pointers into `root` stay valid while it lives. */
typedef struct gw_request {
    gw_api_t api;
    json_t *root;              /* the parsed body, owned */
    const char *model;
    json_t *messages;          /* chat: borrowed from root, content parts flattened */
    json_t *tools;             /* chat: borrowed, or NULL */
    json_t *template_kwargs;   /* chat: chat_template_kwargs, borrowed, or NULL */
    int add_generation_prompt; /* chat: default 1 */
    const char *prompt;        /* completions: text, or NULL and prompt_ids */
    int32_t *prompt_ids;       /* completions: owned */
    size_t n_prompt_ids;
    int stream, include_usage;
    uint32_t max_tokens;       /* 0: riverd's limit */
    double temperature, top_p;
    int has_seed;
    uint64_t seed;
    const char **stop;         /* owned array of borrowed strings */
    size_t n_stop;
    /* The `river` extension. */
    const char *policy;        /* NULL: the worker's */
    int has_tau, has_theta, has_exit_layer;
    double tau, theta;
    int exit_layer;
    int lossless;              /* 1 lossless, -1 lossy, 0 the worker's exit.mode */
    int draft_tokens;          /* lossless: most draft tokens per verify pass; 0: worker's */
    int want_exit_layers, want_token_ids; /* report them per chunk / choice */
    int want_prompt;           /* chat: the response carries the rendered prompt */
    int ignore_eos;            /* keep going past EOS (benchmarks) */
    /* Log-probabilities: chat's logprobs and top_logprobs, completions' logprobs N (top N). */
    int logprobs, top_logprobs;
    /* Constrained output: response_format (json_object or json_schema) or a tool call that
     * tool_choice forces, as the grammar text the worker masks with (text/grammar.h);
     * owned, NULL: unconstrained. */
    char *grammar;
    int json_mode;             /* response_format json_object or json_schema */
    json_t *response_schema;   /* response_format's json_schema.schema, borrowed; NULL: any
                                  JSON object */
    gw_tool_choice_t tool_choice;
    const char *tool_name;
    const char *river_grammar; /* river.grammar: the client's own GBNF text, borrowed */     /* GW_TOOL_CHOICE_NAMED: the function, borrowed from root */
} gw_request_t;

/* Parses and validates a body. Fields OpenAI defines that River cannot honour (n > 1,
 * best_of, echo) are refused naming the field; unknown fields are ignored. A
 * response_format schema is compiled here, so a bad one is a 400 naming its path. */
int gw_request_parse(gw_request_t *r, gw_api_t api, const char *body, size_t len,
                     double default_temperature, gw_error_t *err);
void gw_request_free(gw_request_t *r);

/* What one chunk or the whole completion carries. */
typedef struct gw_piece {
    const char *text;
    size_t text_len;
    const int32_t *ids, *exit_layers;
    size_t n_ids, n_exit_layers;
    json_t *logprobs;   /* gw_logprob_json entries of its tokens, borrowed; NULL: none */
    json_t *tool_calls; /* chat: OpenAI tool_calls (whole) or delta.tool_calls (a chunk),
                           borrowed; NULL: none */
} gw_piece_t;

/* One token's log-probabilities as chat's logprobs.content entry: token (its text, or
 * "bytes:\xNN..." when its bytes are not whole UTF-8), logprob, bytes, top_logprobs. */
json_t *gw_logprob_json(const river_token_logprob_t *lp);

typedef struct gw_usage {
    uint32_t prompt_tokens, completion_tokens;
    float mean_exit_layer;
    /* Prompt tokens the worker's prefix cache held (prompt_tokens_details.cached_tokens):
     * pages of this tenant's own earlier prompts; 0 where tenants share the cache. */
    uint32_t cached_tokens;
} gw_usage_t;

/* "stop" or "length" for a finish reason. */
const char *gw_finish_reason(river_finish_t f);
/* A streamed chunk (chat.completion.chunk or text_completion); finish NULL while it runs;
 * role_only: chat's first chunk, the assistant role with empty content. offset: the
 * completion's bytes streamed so far (completions' logprobs.text_offset), moved past the
 * chunk's tokens. */
json_t *gw_chunk_json(const gw_request_t *r, const char *id, int64_t created,
                      const gw_piece_t *p, const char *finish, int role_only, size_t *offset);
/* The last chunk of stream_options.include_usage: empty choices and usage. */
json_t *gw_usage_chunk_json(const gw_request_t *r, const char *id, int64_t created,
                            const gw_usage_t *u);
/* The non-streaming response; prompt: the rendered chat prompt (river.prompt), or NULL. */
json_t *gw_response_json(const gw_request_t *r, const char *id, int64_t created,
                         const gw_piece_t *p, const char *finish, const gw_usage_t *u,
                         const char *prompt);
/* GET /v1/models. */
json_t *gw_models_json(const gw_config_t *cfg, int64_t created);

/* ---- Chat templates (gateway/models.c) ---- */

typedef struct gw_models gw_models_t;
/* Loads every configured model's chat template (paths already resolved). */
int gw_models_new(gw_models_t **out, const gw_config_t *cfg);
void gw_models_destroy(gw_models_t **m);
/* Whether the model is served. */
int gw_models_has(const gw_models_t *m, const char *name);
/* The rendering memory a request of body_len bytes gets: GW_RENDER_BODY_FACTOR times its
 * body (at least 1 MiB), at most limits.max_render_bytes. */
#define GW_RENDER_BODY_FACTOR 64
size_t gw_models_render_budget(const gw_config_t *cfg, size_t body_len);
/* Renders a chat request's prompt (malloc'd) within max_memory bytes, and the template's
 * own bytes of it (*special: malloc'd start, end offset pairs, *n_special pairs), the only
 * ones where special tokens may be matched. GW error on failure (413 over max_memory). */
int gw_models_render(const gw_models_t *m, const gw_request_t *r, size_t max_memory,
                     char **prompt, uint32_t **special, size_t *n_special, gw_error_t *err);

/* After a request of body_bytes ends: a large one (its JSON and its rendering took many
 * small blocks) has the allocator hand its free memory back to the system, so that one
 * burst of large requests does not stay in the gateway's RSS. */
#define GW_TRIM_BODY_BYTES (256u << 10)
void gw_release_memory(size_t body_bytes);

/* The model's tool-call format, from its chat template (TOOLCALL_NONE: it has none, or
 * the model is not served). */
toolcall_format_t gw_models_tool_format(const gw_models_t *m, const char *name);

/* ---- Tool calls in responses (gateway/tools.c) ---- */

/* Whether a request's completion is split into content and tool calls: a chat request
 * with tools whose tool_choice is not none, on a model with a tool-call format f. */
int gw_tools_apply(const gw_request_t *r, toolcall_format_t f);
/* A whole completion: *content (malloc'd, content_len bytes) and *tool_calls, OpenAI's
 * message.tool_calls (NULL when the text calls nothing). Failure leaves both NULL. */
int gw_tools_split(const gw_request_t *r, toolcall_format_t f, const char *text, size_t len,
                   char **content, size_t *content_len, json_t **tool_calls);
/* A streamed completion, piece by piece: each push gives the content that is certain now
 * (owned by the stream until the next push) and *tool_calls, the delta.tool_calls entries
 * for the chunk (a new reference, NULL when none); finish 1 on the last push. */
typedef struct gw_tools_stream gw_tools_stream_t;
int gw_tools_stream_new(gw_tools_stream_t **out, const gw_request_t *r, toolcall_format_t f);
void gw_tools_stream_destroy(gw_tools_stream_t **s);
int gw_tools_stream_push(gw_tools_stream_t *s, const char *text, size_t len, int finish,
                         const char **content, size_t *content_len, json_t **tool_calls);
/* Whether the stream has started a call (finish_reason "tool_calls"). */
int gw_tools_stream_called(const gw_tools_stream_t *s);

/* ---- Constrained output (gateway/constrain.c) ---- */

/* Fills r->grammar from response_format, tools and tool_choice for a model whose calls
 * are in format f: required or a named function force a call of the tools' schemas; a
 * JSON response_format forces JSON (of its schema), or with tool_choice auto a call or
 * that JSON. A schema that cannot be compiled is a 400 naming its path. */
int gw_constrain(gw_request_t *r, toolcall_format_t f, gw_error_t *err);

/* ---- Tenants (gateway/tenants.c) ---- */

/* Who a request is for: an API key's tenant (several keys may name one), or the one
 * tenant of a gateway without keys. Each has its own request and token rates
 * (tenants.requests_per_minute, tenants.tokens_per_minute), its own share of riverd's
 * per-client limits (Generate.tenant) and its own prefix-cache partition
 * (Generate.cache_salt) unless tenants.share_prefix_cache. Thread-safe. */
typedef struct gw_tenant gw_tenant_t;

#define GW_TENANT_NAME_MAX 64

/* A tenant named name (at most GW_TENANT_NAME_MAX bytes) under cfg's limits; NULL when
 * out of memory. cfg must outlive it. */
gw_tenant_t *gw_tenant_new(const char *name, const gw_config_t *cfg);
void gw_tenant_destroy(gw_tenant_t **t);
const char *gw_tenant_name(const gw_tenant_t *t);
/* The partition its requests' cached pages belong to: its name, "" when shared. */
const char *gw_tenant_cache_salt(const gw_tenant_t *t);
/* Whether its cached pages may be other tenants' (tenants.share_prefix_cache), so that
 * their count must not be reported to it. */
bool gw_tenant_cache_shared(const gw_tenant_t *t);
/* Its own rates instead of tenants.*, each -1 to keep that one (the key file's options);
 * called before the tenant serves. */
void gw_tenant_set_limits(gw_tenant_t *t, int requests_per_minute, int tokens_per_minute);
/* Takes one request from the tenant's rate, or fills err (429 naming the limit and when
 * to retry) and returns -1 when it is over a limit; nothing is taken then. */
int gw_tenant_admit(gw_tenant_t *t, gw_error_t *err);
/* Counts tokens (prompt and completion) a request used against the token rate. */
void gw_tenant_charge(gw_tenant_t *t, uint32_t tokens);

/* ---- API keys (gateway/apikeys.c) ---- */

#define GW_KEY_HEX_LEN 64 /* SHA-256 in lower-case hex */

typedef struct gw_apikeys gw_apikeys_t;
/* Reads a key file: one SHA-256 hex digest a line, optionally followed by the name of its
 * tenant ([A-Za-z0-9._-], at most GW_TENANT_NAME_MAX; keys without one are tenants of
 * their own, "key-" and the digest's first 16 digits) and the tenant's own rates
 * (requests_per_minute=N, tokens_per_minute=N, on the tenant's first line; cfg's
 * tenants.* otherwise); '#' comments and blank lines allowed. Fails naming the line;
 * *out NULL then. */
int gw_apikeys_load(gw_apikeys_t **out, const char *path, const gw_config_t *cfg);
void gw_apikeys_destroy(gw_apikeys_t **k);
/* The tenant of key (the Bearer token), NULL when it hashes to no digest of the file:
 * one hash-set probe, whatever the number of keys. */
gw_tenant_t *gw_apikeys_find(const gw_apikeys_t *k, const char *key);
size_t gw_apikeys_count(const gw_apikeys_t *k);
/* The line a key file holds for key. */
void gw_apikeys_hash(const char *key, size_t len, char hex[GW_KEY_HEX_LEN + 1]);

/* ---- Metrics (gateway/metrics.c) ---- */

void gw_metrics_request(int status);
void gw_metrics_stream_error(void);
void gw_metrics_first_token(double seconds);
void gw_metrics_tokens(uint32_t prompt_tokens, uint32_t completion_tokens, double decode_s);
void gw_metrics_in_flight(int delta);
/* Prometheus text (malloc'd). */
char *gw_metrics_text(void);

/* ---- The connection to riverd (gateway/bridge.c) ---- */

/* One request on its way through riverd: shared by its HTTP connection's thread and the
 * bridge thread, under its own lock, and freed when both let go. */
typedef struct gw_call {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs;
    char id[RIVER_CLIENT_ID_MAX];
    river_generate_opts_t opts; /* points into req and prompt */
    gw_tenant_t *tenant;        /* whose it is (borrowed: tenants outlive the calls) */
    gw_request_t req;
    char *prompt;               /* chat: the rendered template */
    uint32_t *special;          /* chat: the template's own bytes of prompt, as start, end
                                   offset pairs (n_special pairs) */
    size_t n_special;
    int raw_special;            /* a raw_special_keys caller: special tokens anywhere */
    size_t body_bytes;          /* of the HTTP request (gw_release_memory when it ends) */
    toolcall_format_t tool_format; /* the model's, for splitting the completion */
    /* What arrived and the HTTP side has not taken yet. */
    char *text;
    size_t n_text, cap_text;
    int32_t *ids, *exit_layers;
    size_t n_ids, n_exit_layers, cap_ids, cap_exit_layers;
    json_t *logprobs;           /* gw_logprob_json entries of those ids; NULL: not asked */
    int started;                /* a chunk (or the end) arrived */
    int done, ok;
    river_finish_t finish;
    gw_usage_t usage;
    river_code_t code;
    char message[512];
    double t_start, t_first, t_end; /* monotonic seconds */
    /* Called by the bridge thread after each change above, with the lock released: the
     * HTTP side resumes the connection waiting on the call. Set before submit. */
    void (*on_event)(struct gw_call *c);
    void *waiter; /* the HTTP side's, under its own lock */
} gw_call_t;

typedef struct gw_bridge gw_bridge_t;
int gw_bridge_new(gw_bridge_t **out, const gw_config_t *cfg);
/* Fails every request in flight (UNAVAILABLE) and stops the thread; later submits fail at
 * once. HTTP threads may still call in until gw_bridge_destroy. */
void gw_bridge_stop(gw_bridge_t *b);
/* Stops (when not yet) and closes the connection. */
void gw_bridge_destroy(gw_bridge_t **b);
/* Sends call (which must have opts and id filled) to riverd; the bridge holds a reference
 * until the request ends. */
int gw_bridge_submit(gw_bridge_t *b, gw_call_t *call);
/* Asks riverd to end it (the client went away). */
void gw_bridge_cancel(gw_bridge_t *b, gw_call_t *call);

gw_call_t *gw_call_new(void);
void gw_call_release(gw_call_t **call);

/* ---- HTTP (gateway/http.c) ---- */

typedef struct gw_http gw_http_t;
typedef struct gw_ctx {
    const gw_config_t *cfg;
    gw_models_t *models;
    gw_apikeys_t *keys;    /* NULL: no API keys */
    gw_tenant_t *anon;     /* the tenant of every request when there are no keys */
    gw_apikeys_t *raw_keys; /* raw_special_keys, or NULL */
    gw_bridge_t *bridge;
} gw_ctx_t;
int gw_http_start(gw_http_t **out, gw_ctx_t *ctx);
int gw_http_port(const gw_http_t *h);
/* The metrics listener's port; -1 when metrics.port is off. */
int gw_http_metrics_port(const gw_http_t *h);
void gw_http_stop(gw_http_t **h);

#endif
