/* The configuration files' schemas: every key of riverd's and river-worker's files, its
 * type, default and what it does (tables over code; common/config.h). */
#include "common/config.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/config_internal.h"

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
static const char *const config__weights[] = {"copy", "mapped", NULL};
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
    CONFIG_ENUM_KEY(config_worker_t, "weights", weights, config__weights, "copy",
                    "On the CPU: copy, each matrix of 2 MiB or more copied into huge pages "
                    "at start (decode reads those 12-14 % faster than the checkpoint's "
                    "pages; the copies are this process's own memory), or mapped, read in "
                    "the mapped checkpoint, whose page cache other processes of the host "
                    "share. A GPU copies every weight either way."),
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
