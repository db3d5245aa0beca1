/* riverd --config FILE: the River router daemon.
 *
 * Start-up: configuration, sockets, the HTTP metrics endpoint, local workers, then
 * READY=1 to systemd (Type=notify) once everything listens. The poll loop (loop.c)
 * runs until a drain completes: SIGTERM/SIGINT or admin Drain with no worker named stop
 * taking requests, let the running ones finish (up to drain_timeout) and leave. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <systemd/sd-daemon.h>

#include "common/clock.h"
#include "common/err.h"
#include "daemon/riverd.h"

/* Exit status of a configuration that does not load: sysexits' EX_CONFIG, which the unit
 * file lists in RestartPreventExitStatus (restarting cannot fix a file). Usage errors
 * exit 2, anything else that stops riverd 1. */
#define RIVERD_EXIT_CONFIG 78
/* How long stopping waits for supervised workers before SIGKILL. */
#define RIVERD_CHILD_WAIT_MS 5000

static void riverd__usage(FILE *f)
{
    fprintf(f, "usage: riverd --config FILE [--check]\n"
               "  --config FILE  riverd's YAML configuration (see configs/riverd.yaml)\n"
               "  --check        load the configuration, report errors, and exit\n"
               "  --version\n");
}

void riverd_notify_status(riverd_t *rd, int64_t now, bool force)
{
    if (rd->watchdog_ms && now >= rd->next_watchdog_ms) {
        sd_notify(0, "WATCHDOG=1");
        rd->next_watchdog_ms = now + (int64_t)rd->watchdog_ms / 2;
    }
    if (!force && now < rd->next_status_ms)
        return;
    rd->next_status_ms = now + 1000;
    int ready, draining, dead, dispatchable;
    workers_count(rd, &ready, &draining, &dead, &dispatchable);
    char status[sizeof rd->status];
    snprintf(status, sizeof status,
             "STATUS=%s%d workers ready, %d draining, %d dead; %d queued, %d running; "
             "%.0f tokens/s",
             rd->draining ? "draining: " : "", dispatchable, draining, dead, rd->n_queued,
             rd->n_running, metrics_tokens_per_s(rd, now));
    if (force || strcmp(status, rd->status)) {
        memcpy(rd->status, status, sizeof status);
        sd_notify(0, status);
    }
}

void riverd_begin_shutdown(riverd_t *rd, uint32_t deadline_ms, const char *why)
{
    if (rd->draining)
        return;
    int64_t now = clock_now_ms();
    uint32_t d = deadline_ms ? deadline_ms : (uint32_t)rd->cfg.drain_timeout_ms;
    rd->draining = true;
    /* Workers get d to finish; riverd gives them two heartbeats more to report back
     * before it answers for them. */
    rd->drain_deadline_ms = d ? now + d + 2 * rd->cfg.heartbeat_ms : 0;
    log_info("%s: draining (%d queued, %d running, deadline %u ms)", why, rd->n_queued,
             rd->n_running, d);
    sd_notify(0, "STOPPING=1");
    dispatch_fail_queued(rd, RIVER__CLIENT__ERROR__CODE__UNAVAILABLE, "riverd is shutting down");
    for (int i = 0; i < rd->n_table; i++)
        if (rd->table[i]->state == WORKER_READY)
            workers_drain(rd, rd->table[i], d);
    riverd_notify_status(rd, now, true);
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"config", required_argument, 0, 'c'},
        {"check", no_argument, 0, 'k'},
        {"version", no_argument, 0, 'v'},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    const char *config_path = NULL;
    bool check_only = false;
    int c;
    while ((c = getopt_long(argc, argv, "c:h", opts, NULL)) != -1) {
        switch (c) {
        case 'c': config_path = optarg; break;
        case 'k': check_only = true; break;
        case 'v': printf("riverd %s\n", RIVERD_VERSION); return 0;
        case 'h': riverd__usage(stdout); return 0;
        default: riverd__usage(stderr); return 2;
        }
    }
    if (!config_path || optind != argc) {
        riverd__usage(stderr);
        return 2;
    }
    log_init(&(log_opts_t){.name = "riverd", .journal = true});

    static riverd_t rd_storage;
    riverd_t *rd = &rd_storage;
    rd->config_path = config_path;
    rd->sig_fd = -1;
    int rc = config_load(&config_schema_riverd, config_path, &rd->cfg);
    if (rc < 0) {
        /* The detail is file:line:column: key: what is wrong. */
        fprintf(stderr, "riverd: %s\n", river_err_detail());
        sd_notifyf(0, "STATUS=configuration error: %s", river_err_detail());
        return RIVERD_EXIT_CONFIG;
    }
    /* The keys are part of the configuration: --check reads them too, and one that does not
     * load stops riverd as a bad file does, naming the file and the key. */
    rc = auth_new(&rd->auth, config_path, &rd->cfg);
    if (rc < 0) {
        fprintf(stderr, "riverd: %s\n", river_err_detail());
        sd_notifyf(0, "STATUS=configuration error: %s", river_err_detail());
        config_free(&config_schema_riverd, &rd->cfg);
        return RIVERD_EXIT_CONFIG;
    }
    char auth_line[256];
    auth_describe(rd->auth, auth_line, sizeof auth_line);
    if (check_only) {
        printf("%s: ok (auth: %s)\n", config_path, auth_line);
        auth_destroy(&rd->auth);
        config_free(&config_schema_riverd, &rd->cfg);
        return 0;
    }
    /* Said before the configured log level applies, so that no level hides it. */
    if (auth_plain(rd->auth))
        log_warn("auth.mode is plain: serving clients, workers and riverctl WITHOUT "
                 "authentication or encryption; anyone who can reach an endpoint can use it");
    log_set_level(rd->cfg.log_level);
    rd->started_ms = clock_now_ms();
    int exit_code = 1;

    if ((rc = hmap_new(&rd->by_route)) < 0)
        goto fail_config;
    if ((rc = dispatch_init(rd)) < 0)
        goto fail_dispatch;
    if ((rc = loop_open(rd)) < 0)
        goto fail_dispatch;
    if ((rc = http_start(rd, &rd->http)) < 0)
        goto fail_loop;
    if ((rc = supervise_new(rd, &rd->sup)) < 0)
        goto fail_http;

    uint64_t usec = 0;
    if (sd_watchdog_enabled(0, &usec) > 0 && usec >= 2000) {
        rd->watchdog_ms = usec / 1000;
        rd->next_watchdog_ms = rd->started_ms;
        log_info("systemd watchdog every %llu ms", (unsigned long long)rd->watchdog_ms / 2);
    }
    sd_notify(0, "READY=1");
    riverd_notify_status(rd, rd->started_ms, true);
    log_info("riverd %s ready; auth: %s", RIVERD_VERSION, auth_line);

    rc = loop_run(rd);
    if (rc == 0)
        exit_code = 0;
    sd_notify(0, "STOPPING=1");
    /* Whatever is left gets its explicit end while the client socket is still open. */
    dispatch_fail_all(rd, RIVER__CLIENT__ERROR__CODE__CANCELLED, "riverd stopped");
    supervise_destroy(rd, &rd->sup, RIVERD_CHILD_WAIT_MS);
fail_http:
    http_stop(&rd->http);
fail_loop:
    loop_close(rd);
fail_dispatch:
    /* Workers first: forgetting one touches the requests and sessions. */
    workers_destroy_all(rd);
    dispatch_fini(rd);
    hmap_destroy(&rd->by_route);
fail_config:
    auth_destroy(&rd->auth);
    if (rc == RIVER_ECONFIG)
        exit_code = RIVERD_EXIT_CONFIG;
    if (rc < 0)
        fprintf(stderr, "riverd: %s\n", river_err_detail());
    else
        log_info("riverd stopped");
    config_free(&config_schema_riverd, &rd->cfg);
    return exit_code;
}
