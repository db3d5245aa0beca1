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
       "--hash-key` prints the line for a key); requests must send `Authorization: Bearer "
       "KEY`. Empty: no keys asked for."),
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
       "Generation requests in flight at once; one more is answered 429. riverd's "
       "limits.max_requests_per_client counts them all as one client's."),
    GW("limits.max_connections", CONFIG_INT, max_connections, 1, 100000, "512",
       "HTTP connections at once (one thread each)."),
    CONFIG_SECTION_KEY("timeouts", "Time limits."),
    GW("timeouts.request", CONFIG_DURATION, request_timeout_ms, 0, 86400000, "10m",
       "Deadline of one generation, given to riverd; past it the request ends with 504 "
       "(or an error chunk once streaming began). 0: none."),
    GW("timeouts.connection", CONFIG_DURATION, connection_timeout_ms, 1000, 86400000, "5m",
       "An HTTP connection idle this long is closed."),
    CONFIG_SECTION_KEY("sampling", "Defaults for what a request leaves out."),
    GW("sampling.default_temperature", CONFIG_FLOAT, default_temperature, 0, 2, "1.0",
       "Temperature of a request without one; OpenAI's default is 1 (0: greedy)."),
    GW_ENUM("log_level", log_level, config_log_level_names, "info",
            "Least severe messages logged: error, warn, info or debug."),
};
#undef GW

const config_schema_t gw_config_schema = {"gateway", gw_config__keys, CONFIG_N(gw_config__keys),
                                          sizeof(gw_config_t), NULL};
