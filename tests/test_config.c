/* YAML configuration: the example files load and hold the defaults, values land in the
 * right fields, and every kind of mistake is refused with file:line:column and the key. */
#include <stdlib.h>
#include <string.h>

#include "common/config.h"
#include "common/err.h"
#include "daemon/config.h"
#include "engine/exit.h"
#include "engine/generate.h"
#include "workers/config.h"
#include "workers/pair_transport.h"
#include "tests/testutil.h"

typedef union {
    config_riverd_t r;
    config_worker_t w;
} any_config_t;

static int load(const config_schema_t *s, const char *text, any_config_t *c)
{
    river_err_clear();
    return config_load_string(s, "cfg.yaml", text, strlen(text), c);
}

/* config_write into a malloc'd string. */
static char *written(const config_schema_t *s, const void *cfg)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    ck_assert_ptr_nonnull(f);
    ck_assert_int_eq(config_write(s, cfg, f), 0);
    fclose(f);
    return buf;
}

static void check_example(const config_schema_t *s, const char *path)
{
    any_config_t c, d;
    int rc = config_load(s, path, &c);
    ck_assert_msg(rc == 0, "%s: %s", path, river_err_detail());
    ck_assert_int_eq(config_defaults(s, &d), 0);
    /* The example shows the defaults: both write the same text. */
    char *a = written(s, &c), *b = written(s, &d);
    ck_assert_str_eq(a, b);
    free(a);
    free(b);

    /* Every key of the schema is in the file, with a comment above it. */
    size_t len;
    char *text = test_read_file(path, &len);
    ck_assert_ptr_nonnull(text);
    for (size_t i = 0; i < s->n_keys; i++) {
        const char *name = s->keys[i].name, *leaf = strrchr(name, '.');
        leaf = leaf ? leaf + 1 : name;
        char pat[128];
        snprintf(pat, sizeof pat, "\n%*s%s:", 2 * (int)(leaf != name ? 1 : 0), "", leaf);
        const char *at = strstr(text, pat);
        ck_assert_msg(at, "%s lacks key %s", path, name);
        const char *prev = at - 1;
        while (prev > text && *prev != '\n')
            prev--;
        ck_assert_msg(strstr(prev, "#") && strstr(prev, "#") < at, "%s: key %s has no comment",
                      path, name);
    }
    free(text);
    config_free(s, &c);
    config_free(s, &d);
}

START_TEST(test_examples)
{
    check_example(&config_schema_riverd, "configs/riverd.yaml");
    check_example(&config_schema_worker, "configs/worker.yaml");
}
END_TEST

START_TEST(test_defaults)
{
    any_config_t c;
    ck_assert_int_eq(load(&config_schema_riverd, "queue_length: 10\n", &c), 0);
    config_riverd_t *r = &c.r;
    ck_assert_int_eq(r->queue_length, 10);
    ck_assert_int_eq(r->clients.n, 1);
    ck_assert_str_eq(r->clients.v[0], "tcp://*:5555");
    ck_assert_str_eq(r->workers.v[0], "tcp://*:5556");
    ck_assert_str_eq(r->admin, "tcp://127.0.0.1:5557");
    ck_assert_int_eq(r->metrics_port, 9464);
    ck_assert_int_eq(r->max_prompt_tokens, 8192);
    ck_assert_int_eq(r->max_tokens, 2048);
    ck_assert_int_eq(r->max_stop_strings, 8);
    ck_assert_int_eq(r->max_frame_bytes, 1 << 20);
    ck_assert_int_eq(r->heartbeat_ms, 1000);
    ck_assert_int_eq(r->heartbeat_liveness, 3);
    ck_assert_int_eq(r->drain_timeout_ms, 30000);
    ck_assert_int_eq(r->local_workers.n, 0);
    ck_assert_int_eq(r->log_level, CONFIG_LOG_INFO);
    /* Authentication is on unless a file says otherwise. */
    ck_assert_int_eq(r->auth_mode, CONFIG_AUTH_CURVE);
    ck_assert_str_eq(r->auth_secret_key, "keys/riverd.key_secret");
    ck_assert_str_eq(r->auth_clients, "keys/clients");
    ck_assert_str_eq(r->auth_workers, "keys/workers");
    ck_assert_str_eq(r->auth_admin, "keys/admin");
    config_free(&config_schema_riverd, r);
    ck_assert_ptr_null(r->admin);

    /* An empty file, an empty document and a section without keys are all defaults. */
    const char *empty[] = {"", "---\n", "# nothing\n", "kv:\n", "exit: {}\n"};
    for (size_t i = 0; i < sizeof empty / sizeof empty[0]; i++) {
        ck_assert_msg(load(&config_schema_worker, empty[i], &c) == 0, "'%s': %s", empty[i],
                      river_err_detail());
        ck_assert_str_eq(c.w.riverd, "tcp://127.0.0.1:5556");
        ck_assert_str_eq(c.w.model, "");
        ck_assert_int_eq(c.w.role, CONFIG_ROLE_FULL);
        ck_assert_int_eq(c.w.kv_page_size, 16);
        ck_assert_int_eq(c.w.exit_rule, EXIT_RULE_NONE);
        ck_assert_double_eq(c.w.exit_tau, 0.9);
        ck_assert_double_eq(c.w.exit_theta, 0.5);
        ck_assert_int_eq(c.w.exit_aggregation, EXIT_AGG_MIN);
        ck_assert_int_eq(c.w.max_batch_rows, 256);
        ck_assert_int_eq(c.w.auth_mode, CONFIG_AUTH_CURVE);
        ck_assert_str_eq(c.w.auth_secret_key, "keys/worker.key_secret");
        ck_assert_str_eq(c.w.auth_server_key, "keys/riverd.key");
        config_free(&config_schema_worker, &c);
    }
}
END_TEST

static const char *riverd_custom =
    "endpoints:\n"
    "  clients: [\"tcp://*:7000\", ipc:///run/river/clients]\n"
    "  workers:\n"
    "    - tcp://*:7001\n"
    "  admin: ipc:///run/river/admin\n"
    "  metrics_port: 0\n"
    "queue_length: 1000\n"
    "limits:\n"
    "  max_prompt_tokens: 4096\n"
    "  max_tokens: 512\n"
    "  max_stop_strings: 0\n"
    "  max_frame_bytes: 65536\n"
    "heartbeat: {interval: 250ms, liveness: 5}\n"
    "drain_timeout: 2m\n"
    "local_workers:\n"
    "  - count: 2\n"
    "    config: /etc/river/full.yaml\n"
    "  - {config: \"/etc/river/river half.yaml\"}\n"
    "log_level: debug\n"
    "auth: {mode: plain, clients: /etc/river/keys/c}\n";

START_TEST(test_values)
{
    any_config_t c;
    ck_assert_msg(load(&config_schema_riverd, riverd_custom, &c) == 0, "%s",
                  river_err_detail());
    config_riverd_t *r = &c.r;
    ck_assert_int_eq(r->clients.n, 2);
    ck_assert_str_eq(r->clients.v[1], "ipc:///run/river/clients");
    ck_assert_int_eq(r->workers.n, 1);
    ck_assert_str_eq(r->workers.v[0], "tcp://*:7001");
    ck_assert_str_eq(r->admin, "ipc:///run/river/admin");
    ck_assert_int_eq(r->metrics_port, 0);
    ck_assert_int_eq(r->queue_length, 1000);
    ck_assert_int_eq(r->max_prompt_tokens, 4096);
    ck_assert_int_eq(r->max_tokens, 512);
    ck_assert_int_eq(r->max_stop_strings, 0);
    ck_assert_int_eq(r->max_frame_bytes, 65536);
    ck_assert_int_eq(r->heartbeat_ms, 250);
    ck_assert_int_eq(r->heartbeat_liveness, 5);
    ck_assert_int_eq(r->drain_timeout_ms, 120000);
    ck_assert_int_eq(r->local_workers.n, 2);
    config_local_workers_t *lw = r->local_workers.v;
    ck_assert_int_eq(lw[0].count, 2);
    ck_assert_str_eq(lw[0].config, "/etc/river/full.yaml");
    ck_assert_int_eq(lw[1].count, 1); /* the item default */
    ck_assert_str_eq(lw[1].config, "/etc/river/river half.yaml");
    ck_assert_int_eq(r->log_level, CONFIG_LOG_DEBUG);
    ck_assert_int_eq(r->auth_mode, CONFIG_AUTH_PLAIN);
    ck_assert_str_eq(r->auth_clients, "/etc/river/keys/c");
    ck_assert_str_eq(r->auth_workers, "keys/workers");

    /* What config_write makes loads back to the same configuration. */
    char *a = written(&config_schema_riverd, r);
    any_config_t c2;
    ck_assert_msg(load(&config_schema_riverd, a, &c2) == 0, "%s\n%s", river_err_detail(), a);
    char *b = written(&config_schema_riverd, &c2.r);
    ck_assert_str_eq(a, b);
    free(a);
    free(b);
    config_free(&config_schema_riverd, &c2);
    config_free(&config_schema_riverd, &c);

    const char *worker =
        "riverd: tcp://10.0.0.1:5556\n"
        "id: gpu0\n"
        "role: river\n"
        "model: /models/llama-3.2-1b\n"
        "river: /models/llama-3.2-1b/river.safetensors\n"
        "threads: 8\n"
        "kv: {page_size: 32, pages: 8192}\n"
        "exit:\n"
        "  rule: cosine\n"
        "  tau: 0.75\n"
        "  theta: 1\n"
        "  exit_layer: 6\n"
        "  aggregation: row\n"
        "split:\n"
        "  boundary: 10\n"
        "  peer: \"ipc:///tmp/river-pair\"\n"
        "reconnect:\n"
        "  backoff_max: 1500ms\n"
        "log_level: warn\n";
    ck_assert_msg(load(&config_schema_worker, worker, &c) == 0, "%s", river_err_detail());
    config_worker_t *w = &c.w;
    ck_assert_str_eq(w->riverd, "tcp://10.0.0.1:5556");
    ck_assert_str_eq(w->id, "gpu0");
    ck_assert_int_eq(w->role, CONFIG_ROLE_RIVER);
    ck_assert_str_eq(w->model, "/models/llama-3.2-1b");
    ck_assert_str_eq(w->tokenizer, "");
    ck_assert_int_eq(w->threads, 8);
    ck_assert_int_eq(w->kv_page_size, 32);
    ck_assert_int_eq(w->kv_pages, 8192);
    ck_assert_int_eq(w->exit_rule, EXIT_RULE_COSINE);
    ck_assert_double_eq(w->exit_tau, 0.75);
    ck_assert_double_eq(w->exit_theta, 1.0);
    ck_assert_int_eq(w->exit_layer, 6);
    ck_assert_int_eq(w->exit_aggregation, EXIT_AGG_ROW);
    ck_assert_int_eq(w->split_boundary, 10);
    ck_assert_str_eq(w->split_peer, "ipc:///tmp/river-pair");
    ck_assert_int_eq(w->reconnect_backoff_max_ms, 1500);
    ck_assert_int_eq(w->log_level, CONFIG_LOG_WARN);
    config_free(&config_schema_worker, &c);
    /* The default cap, and its neighbours untouched by it. */
    ck_assert_int_eq(load(&config_schema_worker, "log_level: debug\n", &c), 0);
    ck_assert_int_eq(c.w.reconnect_backoff_max_ms, 5000);
    ck_assert_int_eq(c.w.log_level, CONFIG_LOG_DEBUG);
    config_free(&config_schema_worker, &c);
}
END_TEST

/* The load fails with RIVER_ECONFIG, the detail holds where ("cfg.yaml:L:C:") and the
 * key ("key 'name'"), plus what went wrong; the struct is left empty. */
static void expect_error(const config_schema_t *s, const char *text, const char *where,
                         const char *key, const char *what)
{
    any_config_t c;
    memset(&c, 0xab, sizeof c);
    int rc = load(s, text, &c);
    const char *d = river_err_detail();
    ck_assert_msg(rc == RIVER_ECONFIG, "rc %d for:\n%s", rc, text);
    ck_assert_msg(strstr(d, where), "'%s' lacks '%s'", d, where);
    if (key) {
        char k[160];
        snprintf(k, sizeof k, "key '%s'", key);
        ck_assert_msg(strstr(d, k), "'%s' lacks \"%s\"", d, k);
    }
    ck_assert_msg(strstr(d, what), "'%s' lacks '%s'", d, what);
    static const char zero[sizeof(any_config_t)];
    ck_assert_int_eq(memcmp(&c, zero, s->size), 0);
}

START_TEST(test_unknown_key)
{
    const config_schema_t *rd = &config_schema_riverd;
    expect_error(rd, "queue_lenght: 5\n", "cfg.yaml:1:1:", "queue_lenght",
                 "unknown key (known here: endpoints, queue_length,");
    expect_error(rd, "limits:\n  max_tokenz: 5\n", "cfg.yaml:2:3:", "limits.max_tokenz",
                 "known here: max_prompt_tokens, max_tokens, max_stop_strings, "
                 "max_frame_bytes");
    /* Dotted names belong to the table, not to files. */
    expect_error(rd, "limits.max_tokens: 5\n", "cfg.yaml:1:1:", "limits.max_tokens",
                 "unknown key");
    expect_error(rd, "local_workers:\n  - {config: a.yaml, cnt: 1}\n", "cfg.yaml:2:22:",
                 "local_workers[0].cnt", "unknown key (known here: count, config)");
    expect_error(&config_schema_worker, "exit:\n  rule: cosine\n  tua: 0.5\n",
                 "cfg.yaml:3:3:", "exit.tua", "unknown key");
}
END_TEST

START_TEST(test_wrong_type)
{
    const config_schema_t *rd = &config_schema_riverd, *wk = &config_schema_worker;
    expect_error(rd, "queue_length: lots\n", "cfg.yaml:1:15:", "queue_length",
                 "expected an integer in [1, 1000000], got 'lots'");
    expect_error(rd, "queue_length: 1.5\n", "cfg.yaml:1:15:", "queue_length",
                 "expected an integer");
    expect_error(rd, "queue_length:\n", "cfg.yaml:1:", "queue_length", "got no value");
    expect_error(rd, "queue_length: [1]\n", "cfg.yaml:1:15:", "queue_length", "got a list");
    expect_error(rd, "auth:\n  mode: maybe\n", "cfg.yaml:2:9:", "auth.mode",
                 "expected curve or plain, got 'maybe'");
    expect_error(rd, "heartbeat:\n  interval: 5\n", "cfg.yaml:2:13:", "heartbeat.interval",
                 "expected a duration such as 250ms, 2s, 5m or 1h, in [10ms, 1m], got '5'");
    expect_error(rd, "drain_timeout: 30 seconds\n", "cfg.yaml:1:16:", "drain_timeout",
                 "expected a duration");
    expect_error(rd, "limits: 5\n", "cfg.yaml:1:9:", "limits", "expected a mapping, got '5'");
    expect_error(rd, "endpoints:\n  clients: tcp://*:1\n", "cfg.yaml:2:12:",
                 "endpoints.clients",
                 "expected a list of 1 to 16 strings, got 'tcp://*:1'");
    expect_error(rd, "endpoints:\n  clients: [a, {b: c}]\n", "cfg.yaml:2:16:",
                 "endpoints.clients", "entry 1 is a mapping");
    expect_error(rd, "local_workers: [a.yaml]\n", "cfg.yaml:1:17:", "local_workers",
                 "entry 0 is 'a.yaml'");
    expect_error(wk, "model:\n", "cfg.yaml:1:", "model", "expected a string, got no value");
    expect_error(wk, "model: {path: x}\n", "cfg.yaml:1:8:", "model", "got a mapping");
    expect_error(wk, "id: \"a\\0b\"\n", "cfg.yaml:1:5:", "id", "NUL");
    expect_error(wk, "- role: full\n", "cfg.yaml:1:1:", NULL,
                 "expected a mapping of worker keys at the top, got a list");
}
END_TEST

START_TEST(test_out_of_range)
{
    const config_schema_t *rd = &config_schema_riverd, *wk = &config_schema_worker;
    expect_error(rd, "heartbeat:\n  liveness: 0\n", "cfg.yaml:2:13:", "heartbeat.liveness",
                 "expected an integer in [1, 100], got '0'");
    expect_error(rd, "endpoints:\n  metrics_port: 70000\n", "cfg.yaml:2:17:",
                 "endpoints.metrics_port", "in [0, 65535]");
    expect_error(rd, "queue_length: 99999999999999999999\n", "cfg.yaml:1:15:", "queue_length",
                 "expected an integer");
    expect_error(rd, "heartbeat: {interval: 2m}\n", "cfg.yaml:1:23:", "heartbeat.interval",
                 "in [10ms, 1m], got '2m'");
    expect_error(wk, "exit:\n  tau: 1.5\n", "cfg.yaml:2:8:", "exit.tau",
                 "expected a number in [-1, 1], got '1.5'");
    expect_error(wk, "exit:\n  theta: nan\n", "cfg.yaml:2:10:", "exit.theta", "got 'nan'");
    expect_error(wk, "threads: -1\n", "cfg.yaml:1:10:", "threads", "in [0, 1024]");
    expect_error(rd, "endpoints:\n  workers: []\n", "cfg.yaml:2:12:", "endpoints.workers",
                 "expected a list of 1 to 16 strings, got 0");
    expect_error(rd, "local_workers:\n  - {count: 0, config: a}\n", "cfg.yaml:2:13:",
                 "local_workers[0].count", "in [1, 256]");
}
END_TEST

START_TEST(test_bad_enum)
{
    expect_error(&config_schema_riverd, "log_level: loud\n", "cfg.yaml:1:12:", "log_level",
                 "expected error, warn, info or debug, got 'loud'");
}
END_TEST

/* A string key with a form of its own: the worker's device. */
START_TEST(test_worker_device)
{
    const config_schema_t *wk = &config_schema_worker;
    const char *bad[] = {"gpu", "cuda:x", "cuda:1a", "cuda:-1", "cuda:12345", "CPU"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char yaml[64], got[64];
        snprintf(yaml, sizeof yaml, "model: m\ndevice: %s\n", bad[i]);
        snprintf(got, sizeof got, "expected cpu, cuda, cuda:N or opaque, got '%s'", bad[i]);
        expect_error(wk, yaml, "cfg.yaml:2:9:", "device", got);
    }
    const char *good[] = {"cpu", "cuda", "cuda:0", "cuda:7", "opaque"};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        char yaml[64];
        snprintf(yaml, sizeof yaml, "device: %s\n", good[i]);
        const char *path = test_write_tmp("device.yaml", yaml, strlen(yaml));
        config_worker_t c;
        ck_assert_msg(config_load(wk, path, &c) == 0, "%s: %s", good[i], river_err_detail());
        ck_assert_str_eq(c.device, good[i]);
        config_free(wk, &c);
    }
}
END_TEST

/* Lossless mode needs an exit rule and a river: the error names the exit.mode line. */
START_TEST(test_lossless_needs_exit)
{
    const config_schema_t *wk = &config_schema_worker;
    expect_error(wk, "model: m\nexit:\n  rule: none\n  mode: lossless\n", "cfg.yaml:4:",
                 "exit.mode", "exit.rule cosine, router or fixed (exit.rule is none)");
    expect_error(wk, "model: m\nexit:\n  mode: lossless\n  rule: cosine\n", "cfg.yaml:3:",
                 "exit.mode", "it needs a river file");
    any_config_t c;
    ck_assert_int_eq(load(wk, "model: m\nriver: r.safetensors\nexit:\n  rule: cosine\n"
                              "  mode: lossless\n  draft_tokens: 6\n", &c), 0);
    ck_assert_int_eq(c.w.exit_mode, CONFIG_EXIT_MODE_LOSSLESS);
    ck_assert_int_eq(c.w.exit_draft_tokens, 6);
    config_free(wk, &c);
    ck_assert_int_eq(load(wk, "model: m\n", &c), 0);
    ck_assert_int_eq(c.w.exit_mode, CONFIG_EXIT_MODE_LOSSY);
    ck_assert_int_eq(c.w.exit_draft_tokens, 0); /* the cost model's pick */
    config_free(wk, &c);
}
END_TEST

/* split.transport takes the names of workers/pair_transport.h, in its order; anything else
 * is refused at its line. */
START_TEST(test_split_transport)
{
    const config_schema_t *wk = &config_schema_worker;
    static const char *const names[PAIR_TRANSPORT_COUNT] = {
        [PAIR_TRANSPORT_AUTO] = "auto", [PAIR_TRANSPORT_ZMQ] = "zmq",
        [PAIR_TRANSPORT_NCCL] = "nccl", [PAIR_TRANSPORT_P2P] = "p2p"};
    for (int i = 0; i < PAIR_TRANSPORT_COUNT; i++) {
        char text[128];
        snprintf(text, sizeof text, "model: m\nsplit:\n  transport: %s\n", names[i]);
        any_config_t c;
        ck_assert_int_eq(load(wk, text, &c), 0);
        ck_assert_int_eq(c.w.split_transport, i);
        config_free(wk, &c);
    }
    expect_error(wk, "model: m\nsplit:\n  boundary: 3\n  transport: tcp\n", "cfg.yaml:4:",
                 "split.transport", "tcp");
}
END_TEST

/* weights: copy (the default) or mapped, what the worker hands engine_open; anything else
 * is refused at its line, naming both. */
START_TEST(test_weights)
{
    const config_schema_t *wk = &config_schema_worker;
    any_config_t c;
    ck_assert_int_eq(load(wk, "model: m\n", &c), 0);
    ck_assert_int_eq(c.w.weights, CONFIG_WEIGHTS_COPY);
    config_free(wk, &c);
    ck_assert_int_eq(load(wk, "model: m\nweights: mapped\n", &c), 0);
    ck_assert_int_eq(c.w.weights, CONFIG_WEIGHTS_MAPPED);
    config_free(wk, &c);
    expect_error(wk, "model: m\nweights: huge\n", "cfg.yaml:2:", "weights", "huge");
    expect_error(wk, "model: m\nweights: huge\n", "cfg.yaml:2:", "weights", "copy or mapped");
}
END_TEST

/* kv.dtype: auto by default, each name to its gen_kv_dtype_t, anything else an error that
 * names the key and the choices. */
START_TEST(test_kv_dtype)
{
    const config_schema_t *wk = &config_schema_worker;
    any_config_t c;
    ck_assert_int_eq(load(wk, "model: m\n", &c), 0);
    ck_assert_int_eq(c.w.kv_dtype, GEN_KV_AUTO);
    config_free(wk, &c);
    static const struct {
        const char *name;
        int want;
    } cases[] = {{"auto", GEN_KV_AUTO}, {"f32", GEN_KV_F32}, {"f16", GEN_KV_F16},
                 {"bf16", GEN_KV_BF16}, {"q8", GEN_KV_Q8}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char text[64];
        snprintf(text, sizeof text, "model: m\nkv:\n  dtype: %s\n", cases[i].name);
        ck_assert_msg(load(wk, text, &c) == 0, "%s: %s", text, river_err_detail());
        ck_assert_int_eq(c.w.kv_dtype, cases[i].want);
        config_free(wk, &c);
    }
    expect_error(wk, "model: m\nkv:\n  dtype: f8\n", "cfg.yaml:3:", "kv.dtype",
                 "expected auto, f32, f16, bf16 or q8, got 'f8'");
    /* The command line's parser takes the same names. */
    int choice = -1;
    ck_assert_int_eq(gen_kv_dtype_parse("bf16", &choice), 0);
    ck_assert_int_eq(choice, GEN_KV_BF16);
    ck_assert_int_eq(gen_kv_dtype_parse("fp16", &choice), RIVER_EINVAL);
    ck_assert_ptr_nonnull(strstr(river_err_detail(), "kv.dtype fp16"));
}
END_TEST

START_TEST(test_duplicate_key)
{
    const config_schema_t *rd = &config_schema_riverd;
    expect_error(rd, "queue_length: 1\nlog_level: info\nqueue_length: 2\n", "cfg.yaml:3:1:",
                 "queue_length", "duplicate key (first at line 1)");
    expect_error(rd, "limits:\n  max_tokens: 1\n  max_tokens: 2\n", "cfg.yaml:3:3:",
                 "limits.max_tokens", "duplicate key (first at line 2)");
    /* A section written twice is a duplicate too, even with different keys inside. */
    expect_error(rd, "limits: {max_tokens: 1}\nlimits: {max_stop_strings: 2}\n",
                 "cfg.yaml:2:1:", "limits", "duplicate key");
    expect_error(rd, "local_workers:\n  - {config: a, config: b}\n", "cfg.yaml:2:17:",
                 "local_workers[0].config", "duplicate key");
}
END_TEST

START_TEST(test_malformed_yaml)
{
    const config_schema_t *rd = &config_schema_riverd;
    /* The key being read when the syntax broke is named. */
    expect_error(rd, "limits:\n  max_tokens: \"12\n", "cfg.yaml:", "limits.max_tokens",
                 "YAML syntax error");
    expect_error(rd, "queue_length: 1: 2\n", "cfg.yaml:1:16:", "queue_length",
                 "YAML syntax error: mapping values are not allowed in this context");
    expect_error(rd, "limits:\n  max_tokens: 1\n bad\n", "cfg.yaml:3:", "limits.max_tokens",
                 "YAML syntax error");
    expect_error(rd, "endpoints:\n  clients: [a, b\n", "cfg.yaml:3:1:", "endpoints.clients",
                 "YAML syntax error");
    expect_error(rd, "queue_length: 1\n---\nqueue_length: 2\n", "cfg.yaml:2:1:", NULL,
                 "only one YAML document is allowed");
    expect_error(rd, "a: &x 1\nqueue_length: *x\n", "cfg.yaml:1:1:", "a", "unknown key");
    expect_error(rd, "limits: &l {max_tokens: 1}\nheartbeat: *l\n", "cfg.yaml:2:12:",
                 "heartbeat", "aliases");
    expect_error(rd, "queue_length: 1\nlog_level: \xff\n", "cfg.yaml:2:12:", NULL,
                 "YAML syntax error: invalid");
    expect_error(rd, "{a: 1}: 2\n", "cfg.yaml:1:1:", NULL, "expected a key name");
}
END_TEST

START_TEST(test_required)
{
    expect_error(&config_schema_riverd, "local_workers:\n  - count: 2\n", "cfg.yaml:2:5:",
                 "local_workers[0].config", "required key missing");
}
END_TEST

START_TEST(test_files)
{
    any_config_t c;
    ck_assert_int_eq(config_load(&config_schema_riverd, "tests/data/no-such.yaml", &c),
                     RIVER_EIO);
    ck_assert_ptr_nonnull(strstr(river_err_detail(), "no-such.yaml"));
    const char *path = test_write_tmp("w.yaml", "role: backbone\nthreads: x\n", 26);
    ck_assert_ptr_nonnull(path);
    ck_assert_int_eq(config_load(&config_schema_worker, path, &c), RIVER_ECONFIG);
    char where[600];
    snprintf(where, sizeof where, "%s:2:10: key 'threads'", path);
    ck_assert_msg(strstr(river_err_detail(), where), "%s", river_err_detail());
}
END_TEST

/* The enum names of exit.rule and exit.aggregation are the engine's, in its order. */
START_TEST(test_engine_names)
{
    const config_key_t *k = config_find_key(&config_schema_worker, "exit.rule");
    ck_assert_ptr_nonnull(k);
    int n = 0;
    for (; k->choices[n]; n++) {
        ck_assert_str_eq(k->choices[n], exit_rule_name((exit_rule_t)n));
        ck_assert_int_eq(exit_rule_parse(k->choices[n]), n);
    }
    ck_assert_int_eq(n, EXIT_RULE_FIXED + 1);
    k = config_find_key(&config_schema_worker, "exit.aggregation");
    ck_assert_str_eq(k->choices[EXIT_AGG_MIN], "min");
    ck_assert_str_eq(k->choices[EXIT_AGG_ROW], "row");
    ck_assert_ptr_null(k->choices[EXIT_AGG_ROW + 1]);
    ck_assert_ptr_null(config_find_key(&config_schema_worker, "exit.nope"));
}
END_TEST

/* A broken table is caught before any file is read. */
typedef struct {
    int a;
    char *b;
} tiny_t;

START_TEST(test_bad_schema)
{
    static const config_key_t orphan[] = {
        {.name = "sec.a", .type = CONFIG_INT, .offset = offsetof(tiny_t, a), .max = 9,
         .def = "1", .doc = "a"},
    };
    static const config_schema_t s1 = {"tiny", orphan, 1, sizeof(tiny_t), NULL};
    tiny_t t;
    ck_assert_int_eq(config_defaults(&s1, &t), RIVER_EINVAL);
    ck_assert_ptr_nonnull(strstr(river_err_detail(), "not inside its section"));

    static const config_key_t bad_def[] = {
        {.name = "a", .type = CONFIG_INT, .offset = offsetof(tiny_t, a), .max = 9,
         .def = "10", .doc = "a"},
    };
    static const config_schema_t s2 = {"tiny", bad_def, 1, sizeof(tiny_t), NULL};
    ck_assert_int_eq(config_defaults(&s2, &t), RIVER_EINVAL);
    ck_assert_ptr_nonnull(strstr(river_err_detail(), "default '10'"));
}
END_TEST

/* Damaged copies of the example file (bytes flipped, cut, duplicated lines) either load
 * or fail with RIVER_ECONFIG and a place; never a crash (Check runs the test in its own
 * process) and nothing left to free on failure. */
START_TEST(test_fuzz)
{
    size_t len;
    char *text = test_read_file("configs/riverd.yaml", &len);
    ck_assert_ptr_nonnull(text);
    static const char pieces[] = ":-[]{},#&*!|>'\"%@` \n\t0a.";
    uint64_t st = 0x2545f4914f6cdd1dull;
    char *buf = malloc(2 * len + 64);
    int ok = 0, bad = 0;
    for (int i = 0; i < 2000; i++) {
        memcpy(buf, text, len);
        size_t n = len;
        int edits = 1 + (int)(i % 3);
        for (int e = 0; e < edits; e++) {
            st ^= st << 13, st ^= st >> 7, st ^= st << 17;
            size_t at = (size_t)(st >> 8) % n;
            switch (st % 4) {
            case 0:
                buf[at] = pieces[(st >> 40) % (sizeof pieces - 1)];
                break;
            case 1:
                n = at + 1;
                break;
            case 2: /* repeat a stretch: duplicate keys, broken indentation */
                if (n + 40 < 2 * len + 64) {
                    size_t k = (size_t)(st >> 32) % 40;
                    k = k < n - at ? k : n - at;
                    memmove(buf + at + k, buf + at, n - at);
                    n += k;
                }
                break;
            default:
                buf[at] = (char)(st >> 24);
                break;
            }
        }
        any_config_t c;
        river_err_clear();
        int rc = config_load_string(&config_schema_riverd, "cfg.yaml", buf, n, &c);
        if (rc == 0) {
            config_free(&config_schema_riverd, &c);
            ok++;
        } else {
            ck_assert_msg(rc == RIVER_ECONFIG, "rc %d: %s", rc, river_err_detail());
            ck_assert_msg(strncmp(river_err_detail(), "cfg.yaml:", 9) == 0, "%s",
                          river_err_detail());
            bad++;
        }
    }
    ck_assert_int_gt(ok, 50);
    ck_assert_int_gt(bad, 500);
    free(buf);
    free(text);
}
END_TEST

static Suite *config_suite(void)
{
    Suite *s = suite_create("config");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_examples);
    tcase_add_test(tc, test_defaults);
    tcase_add_test(tc, test_values);
    tcase_add_test(tc, test_unknown_key);
    tcase_add_test(tc, test_wrong_type);
    tcase_add_test(tc, test_out_of_range);
    tcase_add_test(tc, test_bad_enum);
    tcase_add_test(tc, test_worker_device);
    tcase_add_test(tc, test_duplicate_key);
    tcase_add_test(tc, test_split_transport);
    tcase_add_test(tc, test_weights);
    tcase_add_test(tc, test_kv_dtype);
    tcase_add_test(tc, test_malformed_yaml);
    tcase_add_test(tc, test_required);
    tcase_add_test(tc, test_files);
    tcase_add_test(tc, test_engine_names);
    tcase_add_test(tc, test_bad_schema);
    tcase_add_test(tc, test_lossless_needs_exit);
    tcase_add_test(tc, test_fuzz);
    suite_add_tcase(s, tc);
    return s;
}

RIVER_TEST_MAIN(config_suite)
