/* river-gateway's configuration schema: the table common/config_yaml.c reads YAML against (the
 * same loader, defaults and file:line:column errors as riverd's). configs/gateway.yaml is
 * this table written out with `river-gateway --print-config`. */
#include <stddef.h>

#include "gateway/gateway.h"

#define GW_ENUM(...) CONFIG_ENUM_KEY(gw_config_t, __VA_ARGS__)

#define MD(...) CONFIG_KEY(gw_model_cfg_t, __VA_ARGS__)
static const config_key_t gw_config__model_keys[] = {
    MD("name", CONFIG_STRING, name, 0, 0, NULL,
       "The name clients give as `model` (required); GET /v1/models lists it."),
    MD("dir", CONFIG_STRING, dir, 0, 0, "",
       "Model directory whose tokenizer_config.json holds the chat template and the "
       "bos/eos tokens (the directory the workers load), or the GGUF file the workers "
       "load, whose tokenizer.chat_template and bos/eos ids serve instead. Empty: no chat template, so only "
       "/v1/completions serves this model unless chat_template is set."),
    MD("chat_template", CONFIG_STRING, chat_template, 0, 0, "",
       "A Jinja chat template file used instead of the directory's (for a model that has "
       "none); empty: the directory's."),
    MD("template", CONFIG_STRING, template_name, 0, 0, "",
       "Which of a list of named templates (tokenizer_config.json's list form); empty: "
       "\"default\"."),
};
#undef MD

static const config_schema_t gw_config__model = {"models", gw_config__model_keys,
                                                 CONFIG_N(gw_config__model_keys),
                                                 sizeof(gw_model_cfg_t), NULL};

#define GW(...) CONFIG_KEY(gw_config_t, __VA_ARGS__)
static const config_key_t gw_config__keys[] = {
    CONFIG_SECTION_KEY("listen", "The HTTP listener. TLS is a reverse proxy's job (nginx, caddy): "
                         "bind to loopback behind one."),
    GW("listen.address", CONFIG_STRING, listen_address, 0, 0, "127.0.0.1",
       "IPv4 address to bind; 0.0.0.0 for every interface."),
    GW("listen.port", CONFIG_INT, listen_port, 0, 65535, "8000",
       "TCP port; 0 picks a free one, which the log's `listening on` line names."),
    CONFIG_SECTION_KEY("riverd", "The riverd this gateway is a client of; key paths are relative "
                         "to this file's directory."),
    GW("riverd.endpoint", CONFIG_STRING, riverd_endpoint, 0, 0, "tcp://127.0.0.1:5555",
       "riverd's client endpoint (endpoints.clients in riverd.yaml)."),
    GW_ENUM("riverd.auth_mode", auth_mode, config_auth_mode_names, "curve",
            "curve (riverd's default), or plain for a riverd whose auth.mode is plain."),
    GW("riverd.secret_key", CONFIG_STRING, secret_key, 0, 0, "keys/gateway.key_secret",
       "The gateway's secret key (riverctl keygen gateway); its public half goes into "
       "riverd's auth.clients directory."),
    GW("riverd.server_key", CONFIG_STRING, server_key, 0, 0, "keys/riverd.key",
       "riverd's public key."),
    {.name = "models",
     .type = CONFIG_ITEMS,
     .offset = offsetof(gw_config_t, models),
     .min = 1,
     .max = 64,
     .def = NULL,
     .doc = "The models served (riverd's workers serve them): a list of mappings with "
            "name, dir, chat_template and template.",
     .sub = &gw_config__model},
    GW("api_keys", CONFIG_STRING, api_keys, 0, 0, "",
       "File of allowed API keys as SHA-256 hex digests, one a line (`river-gateway "
       "--hash-key` prints the line for a key), each optionally followed by its tenant's "
       "name (keys without one are tenants of their own) and, on a tenant's first line, "
       "its own rates (requests_per_minute=N tokens_per_minute=N); requests must send "
       "`Authorization: Bearer KEY`. Empty: no keys asked for, one tenant."),
    GW("raw_special_keys", CONFIG_STRING, raw_special_keys, 0, 0, "",
       "File of API keys (SHA-256 hex digests, as api_keys) whose requests are tokenized "
       "with special-token parsing everywhere, as transformers' apply_chat_template and "
       "tokenizer do: text in their messages and prompts that spells a special token "
       "becomes that token. For trusted callers only (an evaluation harness sending "
       "prompts it rendered itself). Empty: nobody; for every other request the text of "
       "messages, tools and prompts is plain text whatever it spells."),
    CONFIG_SECTION_KEY("limits", "What one request or everyone may hold."),
    GW("limits.max_body_bytes", CONFIG_INT, max_body_bytes, 1024, 1 << 30, "1048576",
       "Largest request body; a larger one is answered 413."),
    GW("limits.max_render_bytes", CONFIG_INT, max_render_bytes, 1 << 20, 1 << 30, "67108864",
       "Most memory one chat-template rendering may take (the values it computes, the "
       "request's messages and tools among them); a request also gets no more than 64 "
       "times its body (at least 1 MiB). Over it the request is answered 413."),
    GW("limits.max_concurrent", CONFIG_INT, max_concurrent, 1, 100000, "256",
       "Generation requests in flight at once, all tenants together; one more is answered "
       "429. riverd's limits.max_requests_per_client counts each tenant's apart."),
    GW("limits.max_connections", CONFIG_INT, max_connections, 1, 100000, "4096",
       "HTTP connections at once (a few epoll threads serve them all; the open-file limit "
       "is raised to fit). One more is closed at once."),
    GW("limits.max_connections_per_address", CONFIG_INT, max_connections_per_address, 1,
       100000, "64",
       "HTTP connections at once from one client IP address; one more is closed at once, "
       "while other addresses are still served. Behind a reverse proxy every client has "
       "the proxy's address: set it to limits.max_connections there."),
    CONFIG_SECTION_KEY("tenants", "Each API key is a tenant (the api_keys file may give "
                       "several keys one tenant's name): its own rates here, its own share "
                       "of riverd's limits.max_requests_per_client, its own prefix cache."),
    GW("tenants.requests_per_minute", CONFIG_INT, tenant_requests_per_minute, 0, 10000000,
       "0",
       "Generation requests one tenant may start a minute (a burst of that many, then that "
       "pace); one more is answered 429 naming this key. 0: no limit."),
    GW("tenants.tokens_per_minute", CONFIG_INT, tenant_tokens_per_minute, 0, 1000000000,
       "0",
       "Prompt and completion tokens one tenant may use a minute; while its tokens of the "
       "last minute are over it, a request is answered 429 naming this key. 0: no limit."),
    GW("tenants.share_prefix_cache", CONFIG_BOOL, tenant_share_cache, 0, 0, "false",
       "Let tenants reuse each other's cached prompt pages. Off, a tenant's prompts are "
       "cached apart (a tenant cannot learn another's prompts from cached_tokens); on, "
       "cached_tokens reads 0 for everyone, since it would tell one tenant's prompts to "
       "another."),
    CONFIG_SECTION_KEY("timeouts", "Time limits."),
    GW("timeouts.request", CONFIG_DURATION, request_timeout_ms, 0, 86400000, "10m",
       "Deadline of one generation, given to riverd; past it the request ends with 504 "
       "(or an error chunk once streaming began). 0: none."),
    GW("timeouts.connection", CONFIG_DURATION, connection_timeout_ms, 1000, 86400000, "5m",
       "An HTTP connection idle this long (between two requests, or sending nothing) is "
       "closed."),
    GW("timeouts.headers", CONFIG_DURATION, headers_timeout_ms, 100, 3600000, "10s",
       "A request's headers must be complete this long after the connection opened (on a "
       "kept-alive connection: after the request line arrived); past it the connection is "
       "closed, however slowly the client keeps sending."),
    GW("timeouts.body", CONFIG_DURATION, body_timeout_ms, 100, 86400000, "1m",
       "A request's body must be complete this long after its headers; past it the "
       "connection is closed."),
    CONFIG_SECTION_KEY("sampling", "Defaults for what a request leaves out."),
    GW("sampling.default_temperature", CONFIG_FLOAT, default_temperature, 0, 2, "1.0",
       "Temperature of a request without one; OpenAI's default is 1 (0: greedy)."),
    CONFIG_SECTION_KEY("metrics", "Where Prometheus scrapes the gateway's own metrics."),
    GW("metrics.address", CONFIG_STRING, metrics_address, 0, 0, "127.0.0.1",
       "IPv4 address of the metrics listener."),
    GW("metrics.port", CONFIG_INT, metrics_port, -1, 65535, "-1",
       "A listener of its own for GET /metrics (and /health), without an API key, for a "
       "scraper on a network clients cannot reach; 0: any free port (logged). -1: none, "
       "/metrics is on the main listener only, and with api_keys needs a key there."),
    GW_ENUM("log_level", log_level, config_log_level_names, "info",
            "Least severe messages logged: error, warn, info or debug."),
};
#undef GW

const config_schema_t gw_config_schema = {"gateway", gw_config__keys, CONFIG_N(gw_config__keys),
                                          sizeof(gw_config_t), NULL};
