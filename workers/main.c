/* river-worker: one engine on one device, serving riverd (DESIGN.md §1).
 *
 *     river-worker --config FILE [--riverd ENDPOINT] [--id NAME]
 *
 * Start-up loads what the configuration names (model, tokenizer, Exit River, routers),
 * builds the engine, connects to riverd and sends Ready. Then one poll loop runs the
 * process: frames from riverd (link.c), timers (heartbeats, riverd's liveness,
 * deadlines), signals, and one engine step per turn while there is work (sched.c), in
 * which case the poll does not wait.
 *
 * Stopping: Drain from riverd, or SIGTERM/SIGINT, takes nothing new and lets running
 * requests finish (a signal gives them WORKER_TERM_GRACE_MS, then fails what is left with
 * UNAVAILABLE, which riverd re-dispatches); the last message is a Heartbeat saying
 * draining with nothing running, and the process exits 0. A second signal fails
 * everything at once. */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <zmq.h>

#include "cli/cli.h"
#include "cli/exit_opts.h"
#include "common/config.h"
#include "common/err.h"
#include "engine/forward.h"
#include "engine/generate.h"
#include "workers/link.h"
#include "workers/sched.h"
#include "workers/wlog.h"

/* What a signal leaves running requests before they fail with UNAVAILABLE. */
#define WORKER_TERM_GRACE_MS 5000
/* Heartbeats before riverd's Welcome names its own, and the riverd default liveness. */
#define WORKER_HEARTBEAT_MS 1000
#define WORKER_LIVENESS 3
/* Longest wait between attempts to reach a riverd that is gone. */
#define WORKER_BACKOFF_MAX_MS 30000
/* How long the last frames may take to leave when the worker exits. */
#define WORKER_LINGER_MS 2000
/* Requests queued in the worker beyond the running ones, per sequence slot. riverd
 * bounds its own queue; this one only absorbs riverd's dispatch running ahead. */
#define WORKER_QUEUE_PER_SEQ 4
#define WORKER_MAX_STOP 64
#define WORKER_MAX_STOP_BYTES 1024

typedef struct worker {
    config_worker_t cfg;
    char id[256];
    cli_env_t env;
    exit_ctx_t xc;
    gen_t *gen;
    void *zctx;
    link_t *link;
    sched_t *sched;
    int sigfd;
    int signals;          /* SIGTERM/SIGINT received */
} worker_t;

static void worker_usage(FILE *f)
{
    fprintf(f, "usage: river-worker --config FILE [--riverd ENDPOINT] [--id NAME]\n"
               "Serves one model for riverd; the options override the file's riverd and "
               "id keys.\n");
}

/* ---- The link's handlers: the scheduler behind it ---- */

static void worker__on_submit(void *user, const River__Worker__Submit *m)
{
    worker_t *w = user;
    sched_submit(w->sched, m, link_clock_ms());
}

static void worker__on_cancel(void *user, uint64_t request_id)
{
    worker_t *w = user;
    sched_cancel(w->sched, request_id);
}

static void worker__on_drain(void *user, uint32_t deadline_ms)
{
    worker_t *w = user;
    sched_drain(w->sched, deadline_ms, link_clock_ms(), RIVER__CLIENT__ERROR__CODE__CANCELLED);
}

static void worker__on_reset(void *user, const char *why)
{
    worker_t *w = user;
    (void)why;
    sched_drop_all(w->sched);
}

static void worker__on_status(void *user, link_status_t *st)
{
    worker_t *w = user;
    sched_status(w->sched, st);
}

/* ---- Start-up ---- */

/* Blocks the stop signals and reads them from a descriptor the poll loop watches. Done
 * first thing, so every thread started later (ZMQ's, the backend's) inherits the mask
 * and the signals reach only the descriptor. */
static int worker__signals(worker_t *w)
{
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    if (sigprocmask(SIG_BLOCK, &set, NULL))
        return river_err_set(RIVER_ESYS, "sigprocmask: %s", strerror(errno));
    w->sigfd = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
    if (w->sigfd < 0)
        return river_err_set(RIVER_ESYS, "signalfd: %s", strerror(errno));
    if (signal(SIGPIPE, SIG_IGN) == SIG_ERR)
        return river_err_set(RIVER_ESYS, "ignoring SIGPIPE: %s", strerror(errno));
    return 0;
}

/* The model's name as riverd shows it: the last part of its path. */
static const char *worker__model_name(const char *path, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s", path);
    size_t n = strlen(buf);
    while (n > 1 && buf[n - 1] == '/')
        buf[--n] = '\0';
    const char *slash = strrchr(buf, '/');
    return slash && slash[1] ? slash + 1 : buf;
}

/* Loads the model, its tokenizer, the river and routers, and builds the engine. */
static int worker__open_engine(worker_t *w)
{
    const config_worker_t *c = &w->cfg;
    if (!c->model[0])
        return river_err_set(RIVER_ECONFIG, "no model configured (key 'model')");
    if (c->role != CONFIG_ROLE_FULL)
        return river_err_set(RIVER_EUNSUPPORTED, "role %s: the split pair is not implemented "
                             "yet; use role full",
                             c->role == CONFIG_ROLE_RIVER ? "river" : "backbone");
    int e = cli_env_open(&w->env, c->model, c->tokenizer[0] ? c->tokenizer : NULL, c->threads, 1);
    if (e)
        return e;
    exit_opts_t xo;
    exit_opts_init(&xo);
    xo.policy.rule = (exit_rule_t)c->exit_rule;
    xo.policy.tau = (float)c->exit_tau;
    xo.policy.theta = (float)c->exit_theta;
    xo.policy.exit_layer = c->exit_layer;
    xo.policy.agg = (exit_agg_t)c->exit_aggregation;
    xo.river_path = c->river[0] ? c->river : NULL;
    xo.routers_path = c->routers[0] ? c->routers : NULL;
    if ((e = exit_ctx_open(&w->xc, &xo, w->env.model)))
        return e;
    /* Preemption: a worker under load must not fail a request because the pool is
     * momentarily full. */
    gen_config_t gc = {.max_rows = c->max_batch_rows, .prefill_chunk = c->prefill_chunk,
                       .page_size = c->kv_page_size, .n_pages = c->kv_pages,
                       .max_seqs = c->max_seqs, .preempt = 1};
    if ((e = gen_new(&w->gen, w->env.model, w->env.tok, w->env.be, &gc)))
        return e;
    if (xo.policy.rule != EXIT_RULE_NONE) {
        if (xo.policy.agg == EXIT_AGG_ROW && w->xc.river &&
            (e = forward_calibrate_costs(gen_forward(w->gen), gen_kv_pool(w->gen), &w->xc.cfg)))
            return e;
        if ((e = gen_set_exit(w->gen, &w->xc.cfg)))
            return e;
    }
    return 0;
}

static int worker__open(worker_t *w)
{
    int e = worker__open_engine(w);
    if (e)
        return e;
    const model_config_t *mc = &w->env.model->cfg;
    kv_pool_t *kv = gen_kv_pool(w->gen);
    char name[512];
    link_config_t lc = {
        .endpoint = w->cfg.riverd,
        .worker_id = w->id,
        .role = RIVER__WORKER__ROLE__ROLE_FULL,
        .caps = RIVER__WORKER__CAPABILITIES__INIT,
        .heartbeat_ms = WORKER_HEARTBEAT_MS,
        .liveness = WORKER_LIVENESS,
        .backoff_max_ms = WORKER_BACKOFF_MAX_MS,
        .linger_ms = WORKER_LINGER_MS,
    };
    lc.caps.model = (char *)worker__model_name(w->cfg.model, name, sizeof name);
    lc.caps.max_batch = (uint32_t)w->cfg.max_batch_rows;
    lc.caps.max_seqs = (uint32_t)w->cfg.max_seqs;
    lc.caps.kv_page_size = (uint32_t)kv_pool_page_size(kv);
    lc.caps.kv_pages_total = (uint32_t)kv_pool_total_pages(kv);
    lc.caps.n_layers = (uint32_t)mc->n_layers;
    lc.caps.layer_begin = 0;
    lc.caps.layer_end = (uint32_t)mc->n_layers;
    lc.caps.has_river = w->xc.river != NULL;
    lc.caps.max_context = (uint32_t)mc->max_seq_len;
    sched_config_t sc = {
        .max_queue = WORKER_QUEUE_PER_SEQ * w->cfg.max_seqs,
        .max_stop = WORKER_MAX_STOP,
        .max_stop_bytes = WORKER_MAX_STOP_BYTES,
        .policy = w->xc.cfg.policy,
    };
    link_handlers_t h = {
        .user = w,
        .submit = worker__on_submit,
        .cancel = worker__on_cancel,
        .drain = worker__on_drain,
        .reset = worker__on_reset,
        .status = worker__on_status,
    };
    w->zctx = zmq_ctx_new();
    if (!w->zctx)
        return river_err_set(RIVER_ESYS, "zmq_ctx_new: %s", zmq_strerror(errno));
    if ((e = link_new(&w->link, w->zctx, &lc, &h)) ||
        (e = sched_new(&w->sched, w->gen, w->env.model, w->env.tok, w->link, &sc)) ||
        (e = link_start(w->link)))
        return e;
    wlog(WLOG_INFO, "serving %s: %d layers, context %d, %d sequences, %d rows, %d KV pages "
         "of %d, exit policy %s%s", lc.caps.model, mc->n_layers, mc->max_seq_len,
         w->cfg.max_seqs, w->cfg.max_batch_rows, kv_pool_total_pages(kv),
         kv_pool_page_size(kv), exit_rule_name(w->xc.cfg.policy.rule),
         w->xc.river ? " with the Exit River" : "");
    return 0;
}

static void worker__close(worker_t *w)
{
    gen_stats_t st = {0};
    if (w->gen)
        gen_get_stats(w->gen, &st);
    if (st.prefill_tokens) {
        wlog(WLOG_INFO, "engine: %lld prefill tokens at %.0f tok/s, %lld decode tokens at "
             "%.0f tok/s, %lld preemptions", (long long)st.prefill_tokens,
             st.prefill_s > 0 ? (double)st.prefill_tokens / st.prefill_s : 0.0,
             (long long)st.decode_tokens,
             st.decode_s > 0 ? (double)st.decode_tokens / st.decode_s : 0.0,
             (long long)st.preemptions);
    }
    sched_destroy(&w->sched);
    link_destroy(&w->link);
    if (w->zctx) {
        /* Waits for the linger of the closed socket: the last frames leave first. */
        while (zmq_ctx_term(w->zctx) && errno == EINTR) {
        }
        w->zctx = NULL;
    }
    gen_destroy(&w->gen);
    exit_ctx_close(&w->xc);
    cli_env_close(&w->env);
    if (w->sigfd >= 0)
        close(w->sigfd);
    config_free(&config_schema_worker, &w->cfg);
}

/* ---- The loop ---- */

static void worker__on_signal(worker_t *w)
{
    struct signalfd_siginfo si;
    while (read(w->sigfd, &si, sizeof si) == (ssize_t)sizeof si) {
        if (w->signals++ == 0) {
            wlog(WLOG_INFO, "%s: finishing running requests (at most %d ms), then exiting",
                 strsignal((int)si.ssi_signo), WORKER_TERM_GRACE_MS);
            /* UNAVAILABLE: riverd gives what is cut off to another worker. */
            sched_drain(w->sched, WORKER_TERM_GRACE_MS, link_clock_ms(),
                        RIVER__CLIENT__ERROR__CODE__UNAVAILABLE);
        } else {
            wlog(WLOG_WARN, "%s again: failing every request now", strsignal((int)si.ssi_signo));
            sched_fail_all(w->sched, RIVER__CLIENT__ERROR__CODE__UNAVAILABLE,
                           "the worker is shutting down");
        }
    }
}

static int worker__run(worker_t *w)
{
    for (;;) {
        int64_t now = link_clock_ms();
        int timeout = 0;
        if (!sched_busy(w->sched)) {
            int64_t next = link_next_ms(w->link);
            int64_t d = sched_next_ms(w->sched);
            if (d < next)
                next = d;
            int64_t wait = next - now;
            timeout = wait < 0 ? 0 : wait > 60000 ? 60000 : (int)wait;
        }
        zmq_pollitem_t items[2] = {
            {.fd = w->sigfd, .events = ZMQ_POLLIN},
            {.socket = link_socket(w->link), .events = ZMQ_POLLIN},
        };
        int n_items = items[1].socket ? 2 : 1;
        if (zmq_poll(items, n_items, timeout) < 0 && errno != EINTR)
            return river_err_set(RIVER_ESYS, "zmq_poll: %s", zmq_strerror(errno));
        if (items[0].revents & ZMQ_POLLIN)
            worker__on_signal(w);
        if (n_items == 2 && (items[1].revents & ZMQ_POLLIN))
            link_recv(w->link);
        now = link_clock_ms();
        link_tick(w->link, now);
        /* An engine step that failed has failed its requests; the worker stays up. */
        sched_step(w->sched, now);
        if (sched_drained(w->sched)) {
            /* The last word: draining, nothing queued, nothing running. */
            link_send_heartbeat(w->link);
            wlog(WLOG_INFO, "drained; exiting");
            return 0;
        }
    }
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"config", required_argument, 0, 'c'},
        {"riverd", required_argument, 0, 'r'},
        {"id", required_argument, 0, 'i'},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    const char *config_path = NULL, *riverd = NULL, *id = NULL;
    int c;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'c': config_path = optarg; break;
        case 'r': riverd = optarg; break;
        case 'i': id = optarg; break;
        case 'h': worker_usage(stdout); return 0;
        default: worker_usage(stderr); return 2;
        }
    }
    if (!config_path || optind != argc) {
        worker_usage(stderr);
        return 2;
    }
    worker_t w;
    memset(&w, 0, sizeof w);
    w.sigfd = -1;
    int e = worker__signals(&w);
    if (e) {
        fprintf(stderr, "river-worker: %s\n", river_err_detail());
        return 1;
    }
    if ((e = config_load(&config_schema_worker, config_path, &w.cfg))) {
        fprintf(stderr, "river-worker: %s\n", river_err_detail());
        close(w.sigfd);
        return 1;
    }
    if (riverd) {
        free(w.cfg.riverd);
        w.cfg.riverd = strdup(riverd);
    }
    if (id)
        snprintf(w.id, sizeof w.id, "%s", id);
    else if (w.cfg.id[0])
        snprintf(w.id, sizeof w.id, "%s", w.cfg.id);
    else {
        char host[200] = "worker";
        if (gethostname(host, sizeof host))
            snprintf(host, sizeof host, "worker");
        host[sizeof host - 1] = '\0';
        snprintf(w.id, sizeof w.id, "%s-%d", host, (int)getpid());
    }
    wlog_init(w.id, w.cfg.log_level);
    int rc = 1;
    if (!w.cfg.riverd) {
        wlog(WLOG_ERROR, "out of memory");
    } else if ((e = worker__open(&w))) {
        wlog(WLOG_ERROR, "start-up failed: %s", river_err_detail());
    } else if ((e = worker__run(&w))) {
        wlog(WLOG_ERROR, "%s", river_err_detail());
        sched_fail_all(w.sched, RIVER__CLIENT__ERROR__CODE__INTERNAL, river_err_detail());
    } else {
        rc = 0;
    }
    worker__close(&w);
    return rc;
}
