#include "common/config.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include <yaml.h>

#include "common/err.h"

/* Configuration files are a few kilobytes; a bigger one is a mistake (a model passed as a
 * config), better refused than parsed. */
#define CONFIG_FILE_MAX ((size_t)1 << 20)
#define CONFIG_NAME_MAX 256

/* ---- Schemas ---- */

static const char *const config__log_levels[] = {"error", "warn", "info", "debug", NULL};
static const char *const config__roles[] = {"full", "river", "backbone", NULL};
static const char *const config__auth_modes[] = {"curve", "plain", NULL};
static const char *const config__placements[] = {"prefix", "load", NULL};
/* The engine's names (engine/exit.c), in the order of exit_rule_t and exit_agg_t; the
 * config test checks that they agree. */
static const char *const config__exit_rules[] = {"none", "cosine", "router", "fixed", NULL};
static const char *const config__exit_aggs[] = {"min", "row", NULL};
static const char *const config__exit_modes[] = {"lossy", "lossless", NULL};
/* In the order of pair_transport_kind_t (workers/pair_transport.h). */
static const char *const config__pair_transports[] = {"auto", "zmq", "nccl", "p2p", NULL};


#define LW(...) CONFIG_KEY(config_local_workers_t, __VA_ARGS__)
static const config_key_t config__local_workers_keys[] = {
    LW("count", CONFIG_INT, count, 1, 256, "1", "Workers to run with this configuration."),
    LW("config", CONFIG_STRING, config, 0, 0, NULL,
       "Their configuration file (required)."),
};
#undef LW

static const config_schema_t config__local_workers = {
    "local_workers", config__local_workers_keys, CONFIG_N(config__local_workers_keys),
    sizeof(config_local_workers_t), NULL};

#define RD(...) CONFIG_KEY(config_riverd_t, __VA_ARGS__)
static const config_key_t config__riverd_keys[] = {
    CONFIG_SECTION_KEY("endpoints", "Where riverd listens. ZMQ addresses: tcp://host:port, "
                                 "ipc:///path or inproc://name."),
    RD("endpoints.clients", CONFIG_LIST, clients, 1, 16, "tcp://*:5555",
       "Addresses bound for clients (the client API)."),
    RD("endpoints.workers", CONFIG_LIST, workers, 1, 16, "tcp://*:5556",
       "Addresses bound for river-workers (the worker link)."),
    RD("endpoints.admin", CONFIG_STRING, admin, 0, 0, "tcp://127.0.0.1:5557",
       "Address bound for riverctl (the admin API); keep it on loopback or ipc://."),
    RD("endpoints.metrics_port", CONFIG_INT, metrics_port, 0, 65535, "9464",
       "HTTP port of the Prometheus text metrics; 0 turns them off."),
    RD("endpoints.metrics_address", CONFIG_STRING, metrics_address, 0, 0, "0.0.0.0",
       "IPv4 address the metrics port binds; 127.0.0.1 keeps it on this host."),
    RD("queue_length", CONFIG_INT, queue_length, 1, 1000000, "256",
       "Requests that may wait for a worker; one more is refused with RESOURCE_EXHAUSTED."),
    CONFIG_ENUM_KEY(config_riverd_t, "placement", placement, config__placements, "prefix",
                 "Where a request without a live session binding goes. prefix: to the "
                 "worker whose prefix cache holds the longest run of its prompt's pages "
                 "(requests that carry token ids; text prompts cannot be hashed before a "
                 "worker tokenizes them), else as load; load: the most free sequence "
                 "slots, then the most free KV pages."),
    CONFIG_SECTION_KEY("limits",
                    "Limits on what one request or one client may ask for. A request over a "
                    "per-request limit is refused with INVALID_ARGUMENT, one over a "
                    "per-client limit with RESOURCE_EXHAUSTED; the error names the key."),
    RD("limits.max_prompt_tokens", CONFIG_INT, max_prompt_tokens, 1, 1 << 24, "8192",
       "Longest prompt, in tokens."),
    RD("limits.max_tokens", CONFIG_INT, max_tokens, 1, 1 << 24, "2048",
       "Most tokens one request may generate; also what a request asking for 0 gets."),
    RD("limits.max_stop_strings", CONFIG_INT, max_stop_strings, 0, 1024, "8",
       "Most stop strings in one request."),
    RD("limits.max_frame_bytes", CONFIG_INT, max_frame_bytes, 1024, 1 << 30, "1048576",
       "Largest frame accepted from a client, worker or riverctl; a larger one gets an "
       "error reply."),
    RD("limits.max_prompt_bytes", CONFIG_INT, max_prompt_bytes, 1, 1 << 28, "262144",
       "Longest prompt given as text, in bytes (riverd does not tokenize)."),
    RD("limits.max_stop_length", CONFIG_INT, max_stop_length, 1, 1 << 20, "256",
       "Longest stop string, in bytes."),
    RD("limits.max_requests_per_client", CONFIG_INT, max_requests_per_client, 1, 1000000,
       "64",
       "Requests one client may have queued or running at once (a request whose end the "
       "client has not read yet still counts); one more is refused with RESOURCE_EXHAUSTED. "
       "A client is its key under auth.mode curve, its connection in plain mode."),
    RD("limits.max_client_backlog", CONFIG_INT, max_client_backlog, 256, 1000000, "10000",
       "Replies riverd queues for one client connection that does not read them (beyond "
       "what the operating system buffers). Past it the client's requests are cancelled on "
       "their workers and end with RESOURCE_EXHAUSTED, which the client reads after the "
       "tokens it was sent. At least 256: one pass of riverd's loop may forward that many "
       "chunks to one client."),
    CONFIG_SECTION_KEY("heartbeat", "Heartbeats between riverd and its workers, both ways."),
    RD("heartbeat.interval", CONFIG_DURATION, heartbeat_ms, 10, 60000, "1s",
       "Time between heartbeats; workers take it from riverd."),
    RD("heartbeat.liveness", CONFIG_INT, heartbeat_liveness, 1, 100, "3",
       "Heartbeats missed in a row after which a worker is dead and its requests are "
       "re-dispatched."),
    RD("drain_timeout", CONFIG_DURATION, drain_timeout_ms, 0, 3600000, "30s",
       "How long a drain lets running requests finish before cancelling them; 0 waits "
       "as long as they take."),
    {.name = "local_workers",
     .type = CONFIG_ITEMS,
     .offset = offsetof(config_riverd_t, local_workers),
     .min = 0,
     .max = 64,
     .def = "",
     .doc = "Workers riverd starts, and restarts when they die. Empty: workers are started "
            "elsewhere (systemd, other hosts) and connect on their own.",
     .sub = &config__local_workers},
    CONFIG_ENUM_KEY(config_riverd_t, "log_level", log_level, config__log_levels, "info",
                 "Least severe messages logged: error, warn, info or debug."),
    CONFIG_SECTION_KEY("auth",
                    "CurveZMQ on every endpoint: traffic is encrypted and a peer whose key is "
                    "not allowed is refused (and logged). Keys are files of `riverctl "
                    "keygen`; relative paths are relative to this file's directory. riverd "
                    "reads the keys at start: adding or removing one takes a restart."),
    CONFIG_ENUM_KEY(config_riverd_t, "auth.mode", auth_mode, config__auth_modes, "curve",
                 "curve, or plain: no encryption and no authentication (ZMQ's NULL "
                 "mechanism), for a network nobody else can reach; riverd warns at start."),
    RD("auth.secret_key", CONFIG_STRING, auth_secret_key, 0, 0, "keys/riverd.key_secret",
       "riverd's secret key (mode 0600); clients and workers are given its public half, "
       "riverd.key."),
    RD("auth.clients", CONFIG_STRING, auth_clients, 0, 0, "keys/clients",
       "Directory of the public keys (NAME.key) allowed on the client endpoints."),
    RD("auth.workers", CONFIG_STRING, auth_workers, 0, 0, "keys/workers",
       "Directory of the public keys allowed on the worker endpoints."),
    RD("auth.admin", CONFIG_STRING, auth_admin, 0, 0, "keys/admin",
       "Directory of the public keys allowed on the admin endpoint (riverctl's admin "
       "commands); a client or worker key is refused there."),
};
#undef RD

const config_schema_t config_schema_riverd = {"riverd", config__riverd_keys,
                                              CONFIG_N(config__riverd_keys),
                                              sizeof(config_riverd_t), NULL};

/* A device name as kernels/backend.h reads it; whether this build has the CUDA backend is
 * the backend's to say when the worker opens it. */
static int config__check_device(const char *v)
{
    if (!strcmp(v, "cpu") || !strcmp(v, "cuda") || !strcmp(v, "opaque"))
        return 0;
    if (strncmp(v, "cuda:", 5) != 0 || !v[5])
        return 1;
    for (const char *c = v + 5; *c; c++)
        if (*c < '0' || *c > '9')
            return 1;
    return strlen(v + 5) > 3;
}

#define WK(...) CONFIG_KEY(config_worker_t, __VA_ARGS__)
static const config_key_t config__worker_keys[] = {
    WK("riverd", CONFIG_STRING, riverd, 0, 0, "tcp://127.0.0.1:5556",
       "riverd's worker endpoint, which this worker connects to."),
    WK("id", CONFIG_STRING, id, 0, 0, "",
       "Name of this worker in riverd's table and logs; empty: host name and process id."),
    CONFIG_ENUM_KEY(config_worker_t, "role", role, config__roles, "full",
                 "full runs the whole model; river and backbone are the two halves of a "
                 "split pair (see split)."),
    WK("model", CONFIG_STRING, model, 0, 0, "",
       "Model to serve: a Hugging Face directory (config.json, safetensors) or a llama2.c "
       ".bin file."),
    WK("tokenizer", CONFIG_STRING, tokenizer, 0, 0, "",
       "Tokenizer file; empty: the one beside the model."),
    WK("river", CONFIG_STRING, river, 0, 0, "",
       "Exit River file (the 4-bit copy of the deep layers); empty: none, so no early "
       "exit."),
    WK("routers", CONFIG_STRING, routers, 0, 0, "",
       "TIDE router file, needed by exit.rule router; empty: none."),
    {.name = "device", .type = CONFIG_STRING, .offset = offsetof(config_worker_t, device),
     .def = "cpu", .check = config__check_device, .expect = "cpu, cuda, cuda:N or opaque",
     .doc = "Where the engine runs: cpu, or cuda:N for GPU N (cuda = cuda:0; needs a build "
            "with the CUDA backend); opaque is the test backend that proves the engine "
            "never touches device memory."},
    WK("threads", CONFIG_INT, threads, 0, 1024, "0",
       "CPU threads for the forward pass; 0: one per core."),
    WK("max_batch_rows", CONFIG_INT, max_batch_rows, 1, 65536, "64",
       "Rows in one forward batch: one per decoding sequence plus prefill chunks."),
    WK("max_seqs", CONFIG_INT, max_seqs, 1, 65536, "16",
       "Sequences running at once; more wait in the worker's queue."),
    WK("prefill_chunk", CONFIG_INT, prefill_chunk, 1, 65536, "256",
       "Prompt tokens one sequence may put into one batch, so that a long prompt does not "
       "stall the others."),
    CONFIG_SECTION_KEY("kv", "The paged KV cache."),
    WK("kv.page_size", CONFIG_INT, kv_page_size, 1, 4096, "16", "Positions per KV page."),
    WK("kv.pages", CONFIG_INT, kv_pages, 0, 1 << 24, "0",
       "Pages in the pool; 0: enough for max_seqs full contexts."),
    CONFIG_SECTION_KEY("prefix_cache", "Full KV pages kept after their request ends and reused "
                                    "by requests that start with the same token ids (a "
                                    "chat's earlier turns, a shared system prompt). Greedy "
                                    "tokens do not change; requests with exit policy none "
                                    "reuse only pages the full backbone wrote."),
    WK("prefix_cache.enabled", CONFIG_BOOL, prefix_cache_enabled, 0, 0, "true",
       "Keep and reuse prefix pages; false: every request prefills its whole prompt. Off "
       "anyway for role river (the shared pool of a split pair)."),
    WK("prefix_cache.pages", CONFIG_INT, prefix_cache_pages, 0, 1 << 24, "0",
       "Most KV pages the cache may hold; 0: any the pool has (unused cached pages are "
       "given back before a running request would be preempted)."),
    CONFIG_SECTION_KEY("exit", "Early-exit policy; a request may override rule, tau, theta "
                            "and exit_layer."),
    CONFIG_ENUM_KEY(config_worker_t, "exit.rule", exit_rule, config__exit_rules, "none",
                 "none: the full backbone; cosine: River-LLM's similarity rule (tau); "
                 "router: TIDE's routers (theta); fixed: every token exits after "
                 "exit_layer layers."),
    WK("exit.tau", CONFIG_FLOAT, exit_tau, -1, 1, "0.9",
       "Cosine rule: a token exits when cos(h^l, h^(l+1)) > tau."),
    WK("exit.theta", CONFIG_FLOAT, exit_theta, 0, 1, "0.5",
       "Router rule: a token exits when its router's probability > theta."),
    WK("exit.exit_layer", CONFIG_INT, exit_layer, 0, 4096, "0",
       "Fixed rule: backbone layers every token runs."),
    CONFIG_ENUM_KEY(config_worker_t, "exit.aggregation", exit_aggregation, config__exit_aggs,
                 "min",
                 "min: a decode batch exits when every row passes (the papers); row: each "
                 "row decides and the batch splits where the cost model says it pays."),
    CONFIG_ENUM_KEY(config_worker_t, "exit.mode", exit_mode, config__exit_modes, "lossy",
                 "Requests' default mode (a request may choose its own). lossy: tokens "
                 "that exit take the exit path's output; lossless: the exit path drafts "
                 "up to draft_tokens tokens and the backbone verifies them in one pass, so "
                 "the output is the backbone's (needs a rule other than none and a river)."),
    WK("exit.draft_tokens", CONFIG_INT, exit_draft_tokens, 0, 16, "0",
       "Lossless mode: most draft tokens per verify pass; 0: where exit.mode is lossless, "
       "the count the cost model predicts fastest, from step times measured at start-up "
       "and the acceptance rate seen while serving (elsewhere 4)."),
    CONFIG_SECTION_KEY("split", "The split pair: a river worker and a backbone worker that "
                             "share KV pages (role river or backbone). Both load the same "
                             "model with the same threads, which the pair checks."),
    WK("split.boundary", CONFIG_INT, split_boundary, 0, 4096, "0",
       "Offload boundary: the first backbone layer held by the backbone worker; 0 with "
       "role full."),
    WK("split.peer", CONFIG_STRING, split_peer, 0, 0, "",
       "Address of the other worker of the pair (ipc:// on one host): the backbone worker "
       "binds it, the river worker connects to it."),
    CONFIG_ENUM_KEY(config_worker_t, "split.transport", split_transport,
                    config__pair_transports, "auto",
                    "How hidden states cross between the pair (both workers must agree). "
                    "zmq: as bytes in the pair's messages, from host memory; nccl: NCCL "
                    "send/recv between the two GPUs (CUDA builds); p2p: peer copies through a "
                    "buffer both map; auto: what the backend asks for (zmq on the CPU, nccl "
                    "on GPUs)."),
    CONFIG_SECTION_KEY("reconnect", "What the worker does when riverd (or its split peer) "
                                 "goes silent for heartbeat.liveness intervals."),
    WK("reconnect.backoff_max", CONFIG_DURATION, reconnect_backoff_max_ms, 100, 600000, "5s",
       "Longest wait before connecting again. The wait starts at riverd's heartbeat "
       "interval and doubles after each failed attempt up to this; each wait is drawn at "
       "random between half and all of it, so that workers cut off together do not "
       "reconnect together. A worker is back at most this long (and a handshake) after "
       "riverd is."),
    CONFIG_ENUM_KEY(config_worker_t, "log_level", log_level, config__log_levels, "info",
                 "Least severe messages logged: error, warn, info or debug."),
    CONFIG_SECTION_KEY("auth", "CurveZMQ on the link to riverd (riverd's auth section); key "
                            "paths are relative to this file's directory."),
    CONFIG_ENUM_KEY(config_worker_t, "auth.mode", auth_mode, config__auth_modes, "curve",
                 "curve, or plain: no encryption and no authentication, for a riverd whose "
                 "auth.mode is plain."),
    WK("auth.secret_key", CONFIG_STRING, auth_secret_key, 0, 0, "keys/worker.key_secret",
       "This worker's secret key (mode 0600); its public half, worker.key, goes into "
       "riverd's auth.workers directory."),
    WK("auth.server_key", CONFIG_STRING, auth_server_key, 0, 0, "keys/riverd.key",
       "riverd's public key: the worker talks only to the riverd that holds its secret "
       "half."),
};
#undef WK

/* Lossless mode drafts on the exit path, so it needs one. */
static const char *config__worker_check(const void *cfg, const char **key)
{
    const config_worker_t *w = cfg;
    *key = "exit.mode";
    if (w->exit_mode == CONFIG_EXIT_MODE_LOSSLESS && w->exit_rule == 0)
        return "lossless drafts on the exit path: it needs exit.rule cosine, router or "
               "fixed (exit.rule is none)";
    if (w->exit_mode == CONFIG_EXIT_MODE_LOSSLESS && (!w->river || !w->river[0]))
        return "lossless drafts on the Exit River: it needs a river file (river is empty)";
    return NULL;
}

const config_schema_t config_schema_worker = {"worker", config__worker_keys,
                                              CONFIG_N(config__worker_keys),
                                              sizeof(config_worker_t), config__worker_check};

/* ---- Keys and values ---- */

static long config__find(const config_schema_t *s, const char *name)
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

static void config__strv_free(config_strv_t *l)
{
    for (int i = 0; i < l->n; i++)
        free(l->v[i]);
    free(l->v);
    l->v = NULL;
    l->n = 0;
}

static int config__strv_push(config_strv_t *l, const char *s, size_t n)
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
static void config__fmt_duration(char *buf, size_t cap, int64_t ms)
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
static void config__expect(const config_key_t *k, char *buf, size_t cap)
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
        snprintf(buf, cap, "%s", k->expect ? k->expect : "a string");
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

/* Converts text to a scalar key's value and stores it at dst; -1 when the text is not a
 * value of the key (wrong type or out of range), RIVER_ENOMEM when a copy fails. (Not -1:
 * that is RIVER_ENOMEM.) */
static int config__convert(const config_key_t *k, const char *v, void *dst)
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

static int config__apply_defaults(const config_schema_t *s, void *cfg)
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

/* ---- Writing ---- */

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
