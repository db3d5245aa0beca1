/* The river-gateway suites' fixture (test_gateway, test_gateway_attacks): riverd, one
 * worker and gateways as real processes on CurveZMQ keys, and HTTP/1.0 over real sockets.
 * Every helper fails the test (a Check assertion) where the test cannot go on. */
#ifndef RIVER_TESTS_GWENV_H
#define RIVER_TESTS_GWENV_H

#include <limits.h>
#include <stdint.h>
#include <sys/types.h>

#include <jansson.h>

#include "client/river_client.h"
#include "tests/cluster.h"

#define GT_STORIES TEST_DATA "/tinystories-656k"
#define GT_KJV TEST_DATA "/kjv-12l"
#define GT_TEMPLATE TEST_DATA "/gateway/chatml-stories.jinja"
#define GT_KEY "sk-river-test-key"
/* Keys of two named tenants and one more of its own (the key file's third column). */
#define GT_KEY_A "sk-tenant-a"
#define GT_KEY_B "sk-tenant-b"
#define GT_KEY_C "sk-tenant-c"

typedef struct gt_env {
    cluster_t c;
    river_keys_t admin_keys; /* an admin's: own/a1.key_secret, keys/riverd.key */
    char admin_secret[PATH_MAX], server_key[PATH_MAX];
    pid_t gw[2];
    int port[2];
    char gw_log[2][320];
    const char *template_path; /* the gateways' chat template; NULL: GT_TEMPLATE */
} gt_env_t;

typedef struct gt_resp {
    int status;
    char *head, *body; /* NUL-terminated */
    size_t len;
} gt_resp_t;

/* DIR/rel (static, rotating among 8). */
const char *gt_path(const gt_env_t *e, const char *rel);

/* Keys: riverd's pair in keys/, the worker's, the gateway's and an admin's in own/, their
 * public halves where riverd looks for them. */
void gt_keys(gt_env_t *e);

river_keys_t gt_admin_keys(const gt_env_t *e);

/* The worker, or -1 when riverd does not answer; fills its KV page counts. */
int gt_worker_state(const gt_env_t *e, char *state, size_t cap, uint32_t *free_pages,
                    uint32_t *total_pages);

/* A gateway on riverd with `extra` YAML at the end (timeouts...). */
void gt_start_gateway(gt_env_t *e, int i, const char *model, const char *extra);

/* riverd, a worker on `model` (none when NULL) and gateway 0; liveness 0: riverd's. */
void gt_start_with(gt_env_t *e, const char *model, const char *worker_extra,
                   const char *gw_extra, int liveness);

/* riverd waits 20 heartbeats (4 s) before it calls a silent worker dead: a busy shared
 * machine stalls processes for a second or more. */
void gt_start(gt_env_t *e, const char *model, const char *worker_extra,
              const char *gw_extra);

/* Stops everything; the gateway must exit 0 on SIGTERM (it stayed up the whole test). */
void gt_stop(gt_env_t *e);

void gt_resp_free(gt_resp_t *r);

/* A socket connected to 127.0.0.1:port from source address src (host order; any 127.x.y.z
 * is loopback; 0: the kernel's choice). */
int gt_connect_from(int port, uint32_t src);

/* A socket connected to 127.0.0.1:port, receives timing out after 60 s. */
int gt_connect(int port);

/* Sends one HTTP/1.0 request (so the response ends when the connection does); key NULL:
 * no Authorization header. Returns the socket, response unread. */
int gt_send(int port, const char *method, const char *path, const char *key,
            const char *body, size_t len);

/* Reads the response until the connection ends, closes fd and splits head from body. */
void gt_read_all(int fd, gt_resp_t *r);

void gt_http(int port, const char *method, const char *path, const char *key,
             const char *body, gt_resp_t *r);

/* The body parsed as JSON (a new reference). */
json_t *gt_json(const gt_resp_t *r);

/* POST with key; the parsed body; *status the HTTP status. */
json_t *gt_post_key(int port, const char *key, const char *path, const char *body,
                    int *status);

/* POST with the test key. */
json_t *gt_post(int port, const char *path, const char *body, int *status);

/* Checks SSE framing: events `data: ...` separated by one blank line, SSE comments
 * allowed, `data: [DONE]` last (when done_last) and nothing after it. Returns the JSON
 * events in order. */
json_t *gt_sse(const char *body, int done_last);

json_t *gt_stream(int port, const char *path, const char *body, int *status);

const char *gt_str(json_t *o, const char *path);

json_t *gt_choice(json_t *o);

/* Whether two usage objects have the same token counts; prompt_tokens_details may differ
 * (a request repeated finds the pages of the one before). */
int gt_same_counts(json_t *a, json_t *b);

/* The error message of an error response. */
const char *gt_error_message(json_t *o);

/* GET /health, keyless: must be 200. */
void gt_health(int port);

/* A counter of riverd's Prometheus text (name and labels), -1 when riverd does not
 * answer or has none. */
long gt_riverd_metric(const gt_env_t *e, const char *name);

/* riverd's count of requests that ended with outcome. */
long gt_riverd_outcome(const gt_env_t *e, const char *outcome);

/* Reads a stream's socket until its first chunk with text. */
void gt_read_first_chunk(int fd);

#endif
