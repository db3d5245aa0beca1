/* river-gateway --config FILE: the OpenAI-compatible HTTP gateway (gateway/gateway.h).
 *
 * Start-up: configuration (paths relative to its directory), chat templates, API keys,
 * the connection to riverd, then the HTTP listener, and READY=1 to systemd. SIGTERM or
 * SIGINT ends every request in flight with an error and stops; SIGPIPE is ignored (a
 * client that went away is an ordinary event). */
#include <getopt.h>
#include <libgen.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <systemd/sd-daemon.h>

#include "common/err.h"
#include "common/log.h"
#include "gateway/gateway.h"

/* As riverd: sysexits' EX_CONFIG for a configuration that does not load, 2 for usage. */
#define GW_EXIT_CONFIG 78

static void gw__usage(FILE *f)
{
    fprintf(f,
            "usage: river-gateway --config FILE [--check]\n"
            "       river-gateway --hash-key [KEY]   (no KEY: read it from stdin)\n"
            "       river-gateway --print-config\n"
            "  --config FILE   the gateway's YAML configuration (see configs/gateway.yaml)\n"
            "  --check         load the configuration, templates and keys, and exit\n"
            "  --hash-key      print the line of an api_keys file for a key\n"
            "  --print-config  write every key with its default and documentation\n");
}

/* Makes a configuration path absolute against the configuration's directory. */
static int gw__resolve(char **path, const char *dir)
{
    if (!(*path)[0] || (*path)[0] == '/')
        return 0;
    size_t n = strlen(dir) + strlen(*path) + 2;
    char *p = malloc(n);
    if (!p)
        return river_err_set(RIVER_ENOMEM, "path");
    snprintf(p, n, "%s/%s", dir, *path);
    free(*path);
    *path = p;
    return 0;
}

static int gw__resolve_all(gw_config_t *cfg, const char *config_path)
{
    char tmp[PATH_MAX];
    snprintf(tmp, sizeof tmp, "%s", config_path);
    const char *dir = dirname(tmp);
    int rc = gw__resolve(&cfg->api_keys, dir) || gw__resolve(&cfg->raw_special_keys, dir) ||
             gw__resolve(&cfg->secret_key, dir) ||
             gw__resolve(&cfg->server_key, dir);
    gw_model_cfg_t *m = cfg->models.v;
    for (int i = 0; !rc && i < cfg->models.n; i++)
        rc = gw__resolve(&m[i].dir, dir) || gw__resolve(&m[i].chat_template, dir);
    return rc ? RIVER_ENOMEM : 0;
}

static int gw__hash_key(const char *key)
{
    char buf[4096];
    if (!key) {
        if (!fgets(buf, sizeof buf, stdin)) {
            fprintf(stderr, "river-gateway: --hash-key: no key on stdin\n");
            return 2;
        }
        buf[strcspn(buf, "\r\n")] = '\0';
        key = buf;
    }
    if (!key[0]) {
        fprintf(stderr, "river-gateway: --hash-key: the key is empty\n");
        return 2;
    }
    char hex[GW_KEY_HEX_LEN + 1];
    gw_apikeys_hash(key, strlen(key), hex);
    printf("%s\n", hex);
    return 0;
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"config", required_argument, 0, 'c'}, {"check", no_argument, 0, 'k'},
        {"hash-key", no_argument, 0, 'H'},     {"print-config", no_argument, 0, 'P'},
        {"help", no_argument, 0, 'h'},         {0, 0, 0, 0},
    };
    const char *config_path = NULL;
    int check = 0, c;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'c': config_path = optarg; break;
        case 'k': check = 1; break;
        case 'H': return gw__hash_key(optind < argc ? argv[optind] : NULL);
        case 'P': {
            gw_config_t d;
            /* models is required, so the defaults alone leave it empty: fine to print. */
            if (config_defaults(&gw_config_schema, &d)) {
                fprintf(stderr, "river-gateway: %s\n", river_err_detail());
                return 1;
            }
            int rc = config_write(&gw_config_schema, &d, stdout);
            config_free(&gw_config_schema, &d);
            return rc ? 1 : 0;
        }
        case 'h': gw__usage(stdout); return 0;
        default: gw__usage(stderr); return 2;
        }
    }
    if (!config_path || optind != argc) {
        gw__usage(stderr);
        return 2;
    }
    log_init(&(log_opts_t){.name = "river-gateway", .journal = true});
    /* Response ids only need to differ between runs, not to be secret. */
    srandom((unsigned)time(NULL) ^ (unsigned)getpid());
    gw_config_t cfg;
    if (config_load(&gw_config_schema, config_path, &cfg)) {
        fprintf(stderr, "river-gateway: %s\n", river_err_detail());
        return GW_EXIT_CONFIG;
    }
    log_set_level(cfg.log_level);
    int status = GW_EXIT_CONFIG;
    gw_ctx_t ctx = {.cfg = &cfg};
    gw_http_t *http = NULL;
    if (gw__resolve_all(&cfg, config_path))
        goto fail_models;
    if (gw_models_new(&ctx.models, &cfg)) {
        fprintf(stderr, "river-gateway: %s: %s\n", config_path, river_err_detail());
        goto fail_models;
    }
    if (cfg.api_keys[0] && gw_apikeys_load(&ctx.keys, cfg.api_keys, &cfg)) {
        fprintf(stderr, "river-gateway: %s: %s\n", config_path, river_err_detail());
        goto fail_keys;
    }
    /* Without keys every request is one tenant's, the gateway's own share of riverd. */
    if (!ctx.keys && !(ctx.anon = gw_tenant_new("", &cfg))) {
        fprintf(stderr, "river-gateway: out of memory\n");
        goto fail_bridge;
    }
    if (cfg.raw_special_keys[0] &&
        gw_apikeys_load(&ctx.raw_keys, cfg.raw_special_keys, &cfg)) {
        fprintf(stderr, "river-gateway: %s: %s\n", config_path, river_err_detail());
        goto fail_bridge;
    }
    if (check) {
        printf("%s: ok (%d models, %s)\n", config_path, cfg.models.n,
               ctx.keys ? "API keys required" : "no API keys");
        status = 0;
        goto fail_bridge;
    }
    status = 1;
    /* Every thread started from here on inherits the mask: signals are taken by sigwait
     * below, and SIGPIPE by nobody. */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGHUP);
    if (signal(SIGPIPE, SIG_IGN) == SIG_ERR || pthread_sigmask(SIG_BLOCK, &set, NULL)) {
        log_error("signals: cannot set them up");
        goto fail_bridge;
    }
    if (gw_bridge_new(&ctx.bridge, &cfg)) {
        log_error("riverd %s: %s", cfg.riverd_endpoint, river_err_detail());
        goto fail_bridge;
    }
    if (gw_http_start(&http, &ctx)) {
        log_error("%s", river_err_detail());
        goto fail_http;
    }
    log_info("listening on http://%s:%d (riverd %s, %d models, %s)", cfg.listen_address,
             gw_http_port(http), cfg.riverd_endpoint, cfg.models.n,
             ctx.keys ? "API keys required" : "no API keys");
    if (gw_http_metrics_port(http) >= 0)
        log_info("metrics on http://%s:%d/metrics", cfg.metrics_address,
                 gw_http_metrics_port(http));
    sd_notify(0, "READY=1");
    for (;;) {
        int sig = 0;
        if (sigwait(&set, &sig))
            continue;
        if (sig == SIGHUP) {
            log_info("SIGHUP: the gateway reads its configuration at start only; restart "
                     "it to apply changes");
            continue;
        }
        log_info("signal %d: stopping", sig);
        break;
    }
    sd_notify(0, "STOPPING=1");
    status = 0;
    /* Requests in flight end first (their connections' threads wake up), then the HTTP
     * threads are joined, then the riverd connection closes. */
    gw_bridge_stop(ctx.bridge);
    gw_http_stop(&http);
fail_http:
    gw_bridge_destroy(&ctx.bridge);
fail_bridge:
    gw_tenant_destroy(&ctx.anon);
    gw_apikeys_destroy(&ctx.raw_keys);
    gw_apikeys_destroy(&ctx.keys);
fail_keys:
    gw_models_destroy(&ctx.models);
fail_models:
    config_free(&gw_config_schema, &cfg);
    return status;
}
