/* River client library: talk to riverd from C (proto/river_client.proto and
 * proto/river_admin.proto, without their generated types).
 *
 * A river_client_t is one connection (a ZMQ DEALER) to riverd's client endpoint. It may
 * have many requests in flight; each reports through its own callback, one event per
 * TokenChunk and then exactly one FINAL or ERROR. Everything happens inside
 * river_client_poll (or river_client_generate, which polls until its request ends), on
 * the caller's thread: a client is not thread-safe, use one per thread.
 *
 * riverd keeps no request across a restart, so when the connection to it is lost (riverd
 * crashed, restarted or dropped the connection; a host that vanished silently is found by
 * ZMTP heartbeats within about 12 s) every request in flight on it ends with
 * RIVER_CODE_UNAVAILABLE, at once and without any timeout_ms. The connection comes back by
 * itself when riverd does: later requests go to the new riverd.
 *
 *     river_client_t *c;
 *     river_client_new(&c, "tcp://127.0.0.1:5555");
 *     river_generate_opts_t o = RIVER_GENERATE_OPTS_INIT;
 *     o.prompt = "Once upon a time";
 *     o.max_tokens = 64;
 *     river_result_t res;
 *     river_client_generate(c, &o, print_chunk, NULL, &res);
 *     river_client_destroy(&c);
 *
 * A river_admin_t talks to the admin endpoint (riverctl's commands).
 *
 * A riverd whose auth.mode is curve (the default) talks only to peers with a CurveZMQ key
 * it allows: connect with river_client_new_secure / river_admin_new_secure and the key
 * files of `riverctl keygen`. A connection riverd refuses gets no reply; the library sees
 * the refused handshake and ends the client's requests with RIVER_CODE_UNAUTHENTICATED, an
 * admin call with RIVER_EAUTH, and from then on river_client_submit and admin calls fail
 * with RIVER_EAUTH at once (ZMQ does not retry a refused handshake: a new client may).
 *
 * Functions return 0 or a negative River error code (common/err.h); river_err_detail()
 * says what went wrong. Link with libriverclient.a, libriver.a, -lzmq -lczmq
 * -lprotobuf-c. */
#ifndef RIVER_CLIENT_H
#define RIVER_CLIENT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Longest request id the library makes or accepts, with its NUL. */
#define RIVER_CLIENT_ID_MAX 129

/* Error codes, as riverd sends them. Codes not listed here read as INTERNAL. */
typedef enum {
    RIVER_CODE_OK = 0,
    RIVER_CODE_INVALID_ARGUMENT = 1,   /* bad request, over a per-request limit */
    RIVER_CODE_RESOURCE_EXHAUSTED = 2, /* queue full */
    RIVER_CODE_DEADLINE_EXCEEDED = 3,  /* deadline_ms passed, or timeout_ms here */
    RIVER_CODE_CANCELLED = 4,          /* cancelled by the server */
    RIVER_CODE_UNAVAILABLE = 5,        /* no worker; retrying later may work */
    RIVER_CODE_INTERNAL = 6,
    RIVER_CODE_UNAUTHENTICATED = 7,
} river_code_t;

typedef enum {
    RIVER_FINISH_UNSPECIFIED = 0,
    RIVER_FINISH_LENGTH = 1,    /* max_tokens generated */
    RIVER_FINISH_EOS = 2,
    RIVER_FINISH_STOP = 3,      /* a stop string appeared (not part of the text) */
    RIVER_FINISH_CONTEXT = 4,   /* the model's context is full */
    RIVER_FINISH_CANCELLED = 5, /* river_client_cancel */
} river_finish_t;

const char *river_code_name(river_code_t code);     /* "DEADLINE_EXCEEDED" */
const char *river_finish_name(river_finish_t f);    /* "length" */

typedef struct river_generate_opts {
    const char *prompt;          /* text, tokenized by the worker; or NULL and: */
    int text_has_special;        /* prompt carries its special tokens (BOS...) as text: the
                                    worker adds none (a rendered chat template) */
    /* With prompt text: where special tokens may be matched. special_spans_given 0: anywhere
     * (the default); 1: only where a special token's text lies wholly inside one of the
     * n_special_spans byte ranges special_spans holds as start, end pairs (none: nowhere),
     * the rest tokenized as plain text (proto Generate.special_spans). */
    int special_spans_given;
    const uint32_t *special_spans; /* 2 * n_special_spans offsets into prompt */
    size_t n_special_spans;
    const int32_t *prompt_ids;   /* token ids, BOS included when the model wants one */
    size_t n_prompt_ids;
    const char *session_id;      /* same id, same worker while it lives; NULL: none */
    uint32_t max_tokens;         /* 0: riverd's limit */
    float temperature;           /* <= 0: greedy */
    uint32_t top_k;              /* 0: off */
    float top_p;                 /* outside (0, 1): off */
    int has_seed;                /* otherwise riverd picks a seed */
    uint64_t seed;
    const char *const *stop;     /* stop strings */
    size_t n_stop;
    int ignore_eos;
    /* For a client that serves many (Generate.tenant, .cache_salt): whose request it is,
     * for riverd's per-client limits, and its prefix-cache partition; NULL: none. */
    const char *tenant;
    const char *cache_salt;
    /* Early-exit overrides; NULL / has_* 0 keep the worker's. */
    const char *exit_policy;     /* "none", "cosine", "router", "fixed" */
    int has_tau;
    float tau;
    int has_theta;
    float theta;
    int has_exit_layer;
    int32_t exit_layer;
    uint32_t deadline_ms;        /* riverd ends the request with DEADLINE_EXCEEDED; 0: none */
    /* The library's own limit: when riverd says nothing about the request for this long,
     * it sends Cancel and ends the request with DEADLINE_EXCEEDED. 0: wait forever. */
    uint32_t timeout_ms;
    /* Lossless mode (the exit path drafts, the backbone verifies: the backbone's ids):
     * 1 asks for it, -1 for the lossy mode, 0 keeps the worker's exit.mode. */
    int lossless;
    uint32_t draft_tokens;       /* lossless: most draft tokens per verify pass; 0: worker's */
    /* Log-probabilities of each token in its chunk (river_event_t.logprobs), with the
     * top_logprobs (0..RIVER_TOP_LOGPROBS_MAX) most likely tokens beside. */
    int logprobs;
    uint32_t top_logprobs;
    /* A grammar the completion must follow (text/grammar.h's text, root rule "root");
     * NULL: none. A grammar the worker cannot compile is INVALID_ARGUMENT. */
    const char *grammar;
} river_generate_opts_t;

#define RIVER_GENERATE_OPTS_INIT {.top_p = 1.0f}

typedef enum {
    RIVER_EVENT_CHUNK = 0,
    RIVER_EVENT_FINAL,
    RIVER_EVENT_ERROR,
} river_event_kind_t;

/* Most top_logprobs a request may ask for. */
#define RIVER_TOP_LOGPROBS_MAX 20

/* One of the most likely tokens at a position. token: its bytes (not NUL-terminated; a
 * token may hold part of a UTF-8 character). */
typedef struct river_top_logprob {
    int32_t id;
    float logprob;
    const char *token;
    size_t token_len;
} river_top_logprob_t;

/* The log-probabilities at one generated position (river_generate_opts_t.logprobs): of
 * the token generated, under the grammar's mask and before temperature and top-p, and the
 * n_top most likely tokens there, most likely first. */
typedef struct river_token_logprob {
    int32_t id;
    float logprob;
    const char *token;
    size_t token_len;
    size_t n_top;
    river_top_logprob_t top[RIVER_TOP_LOGPROBS_MAX];
} river_token_logprob_t;

/* What a callback gets; pointers are valid during the call only. */
typedef struct river_event {
    river_event_kind_t kind;
    const char *request_id;
    /* CHUNK */
    uint64_t seq;                /* 0, 1, 2... per request, without gaps */
    const char *text;            /* new UTF-8 text, not NUL-terminated; may be empty */
    size_t text_len;
    const int32_t *ids;
    size_t n_ids;
    const int32_t *exit_layers;  /* n_exit_layers (n_ids, or 0 when not reported) */
    size_t n_exit_layers;
    const river_token_logprob_t *logprobs; /* n_logprobs (n_ids when asked, else 0) */
    size_t n_logprobs;
    /* FINAL */
    river_finish_t finish;
    uint32_t prompt_tokens, completion_tokens;
    uint32_t cached_tokens;      /* prompt tokens the worker's prefix cache held */
    float mean_exit_layer;
    /* ERROR */
    river_code_t code;
    const char *message;
    /* FINAL, lossless mode: draft tokens verified in the last dispatch, and accepted */
    uint32_t drafted_tokens, accepted_tokens;
} river_event_t;

typedef void (*river_event_cb)(void *user, const river_event_t *ev);

typedef struct river_client river_client_t;

/* The CurveZMQ keys of a connection: files written by `riverctl keygen`. */
typedef struct river_keys {
    const char *secret_key; /* this client's secret key, NAME.key_secret (mode 0600), whose
                               public half NAME.key is in riverd's auth.clients (for
                               river_client) or auth.admin (for river_admin) */
    const char *server_key; /* riverd's public key, riverd.key */
} river_keys_t;

/* Connects to riverd's client endpoint (tcp://host:port, ipc://path) without keys, for a
 * riverd whose auth.mode is plain. Connecting does not wait for riverd: frames wait until
 * it is there (see timeout_ms). */
int river_client_new(river_client_t **out, const char *endpoint);
/* The same with CurveZMQ keys (NULL: none, as river_client_new). A key file that cannot
 * be read fails here, with the file named. */
int river_client_new_secure(river_client_t **out, const char *endpoint,
                            const river_keys_t *keys);
void river_client_destroy(river_client_t **c);

/* Sends a Generate and returns. request_id NULL: the library makes one; id_out (may be
 * NULL) receives the id used. cb gets every event of the request, inside
 * river_client_poll. */
int river_client_submit(river_client_t *c, const river_generate_opts_t *o,
                        const char *request_id, river_event_cb cb, void *user,
                        char id_out[RIVER_CLIENT_ID_MAX]);
/* Asks riverd to end a request; it ends with FINAL (finish CANCELLED) as usual. */
int river_client_cancel(river_client_t *c, const char *request_id);
/* Waits up to timeout_ms (0: only what is there; -1: until something arrives) and handles
 * what arrived. Returns the requests still in flight, or a negative error. */
int river_client_poll(river_client_t *c, int timeout_ms);
int river_client_in_flight(const river_client_t *c);

/* How a request ended, for river_client_generate. */
typedef struct river_result {
    int ok;                    /* 1: FINAL, 0: ERROR */
    river_finish_t finish;
    uint32_t prompt_tokens, completion_tokens;
    uint32_t cached_tokens;    /* prompt tokens the worker's prefix cache held */
    float mean_exit_layer;
    river_code_t code;         /* ERROR */
    char message[512];
    uint64_t chunks;
    uint32_t drafted_tokens, accepted_tokens; /* FINAL, lossless mode */
} river_result_t;

/* Submits and polls until the request ends; cb (may be NULL) sees its events as they
 * come. Returns 0 when it ended with FINAL; RIVER_EPROTO when riverd answered with an
 * ERROR (res says which); another negative code when the library failed. */
int river_client_generate(river_client_t *c, const river_generate_opts_t *o, river_event_cb cb,
                          void *user, river_result_t *res);

/* ---- Admin ---- */

typedef struct river_admin river_admin_t;

/* timeout_ms: how long each call waits for riverd (0: 5000). */
int river_admin_new(river_admin_t **out, const char *endpoint, int timeout_ms);
/* The same with CurveZMQ keys (NULL: none); the key must be in riverd's auth.admin, and a
 * call with another one fails with RIVER_EAUTH. */
int river_admin_new_secure(river_admin_t **out, const char *endpoint, int timeout_ms,
                           const river_keys_t *keys);
/* Closes the connection at once: a request whose call failed (timed out, refused) is
 * dropped, never delivered later. */
void river_admin_destroy(river_admin_t **a);

typedef struct river_status {
    char version[32];
    uint64_t uptime_s;
    uint32_t workers_ready, workers_total;
    uint32_t queue_length, queue_capacity, running;
    uint64_t requests_total, requests_failed;
    int draining;
} river_status_t;

typedef struct river_worker_info {
    char id[128];
    char address[64];          /* where its connection comes from (tcp: the IP); "": ipc */
    const char *state;         /* "starting", "ready", "draining", "dead", "unavailable" */
    const char *role;          /* "full", "river", "backbone" */
    char model[128];
    uint32_t max_seqs, max_batch, n_layers, max_context;
    uint32_t queue_length, running;
    uint32_t kv_page_size, kv_pages_total, kv_pages_free;
    uint32_t missed_beats;
    uint64_t last_seen_ms;
    int supervised, has_river;
} river_worker_info_t;

int river_admin_status(river_admin_t *a, river_status_t *st);
/* *workers is malloc'd (free it), *n entries. */
int river_admin_workers(river_admin_t *a, river_worker_info_t **workers, size_t *n);
/* worker_id NULL or "": drain every worker, then riverd exits. */
int river_admin_drain(river_admin_t *a, const char *worker_id, uint32_t deadline_ms,
                      uint32_t *draining);
int river_admin_scale(river_admin_t *a, uint32_t workers, uint32_t *previous);
/* *applied and *needs_restart: malloc'd, comma-separated key names (free them). */
int river_admin_reload(river_admin_t *a, char **applied, char **needs_restart);
/* *text: malloc'd Prometheus text (free it). */
int river_admin_metrics(river_admin_t *a, char **text);

#ifdef __cplusplus
}
#endif

#endif
