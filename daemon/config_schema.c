/* riverd's configuration schema: every key of its file, its type, default and what it
 * does (tables over code; common/config.h). */
#include "daemon/config.h"

#include <stddef.h>

static const char *const config__placements[] = {"prefix", "load", NULL};

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
       "A client is its key under auth.mode curve, its connection in plain mode, and each "
       "tenant a client names (Generate.tenant: river-gateway's API keys) is one of its own."),
    RD("limits.max_requests_per_key", CONFIG_INT, max_requests_per_key, 1, 1000000, "256",
       "Requests one client may have queued or running at once over all the tenants it "
       "names, so that naming more tenants does not multiply a client's share; one more is "
       "refused with RESOURCE_EXHAUSTED."),
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
    CONFIG_ENUM_KEY(config_riverd_t, "log_level", log_level, config_log_level_names, "info",
                 "Least severe messages logged: error, warn, info or debug."),
    CONFIG_SECTION_KEY("auth",
                    "CurveZMQ on every endpoint: traffic is encrypted and a peer whose key is "
                    "not allowed is refused (and logged). Keys are files of `riverctl "
                    "keygen`; relative paths are relative to this file's directory. riverd "
                    "reads the keys at start: adding or removing one takes a restart."),
    CONFIG_ENUM_KEY(config_riverd_t, "auth.mode", auth_mode, config_auth_mode_names, "curve",
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
