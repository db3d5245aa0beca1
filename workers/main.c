/* river-worker: one engine on one device, serving riverd (docs/ARCHITECTURE.md, "Processes").
 *
 *     river-worker --config FILE [--riverd ENDPOINT] [--id NAME]
 *
 * The configuration's role says which engine: full (the whole model), or one half of a
 * split pair (workers/pair.h): river (the shallow layers, the Exit River, the heads, the KV
 * pool; it serves riverd once its backbone peer accepted it) or backbone (the layers from
 * split.boundary on, serving only its river peer; it never talks to riverd).
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

#include <systemd/sd-daemon.h>
#include <zmq.h>

#include "engine/exit_setup.h"
#include "common/clock.h"
#include "common/err.h"
#include "common/keys.h"
#include "engine/engine_open.h"
#include "common/log.h"
#include "common/prefix_hash.h"
#include "engine/forward.h"
#include "engine/generate.h"
#include "engine/offload.h"
#include "engine/exitriver.h"
#include "kernels/backend.h"
#include "model/fingerprint.h"
#include "workers/link.h"
#include "workers/config.h"
#include "workers/pair.h"
#include "workers/pair_transport.h"
#include "workers/sched.h"

/* What a signal leaves running requests before they fail with UNAVAILABLE. */
#define WORKER_TERM_GRACE_MS 5000
/* Heartbeats before riverd's Welcome names its own, and the riverd default liveness. */
#define WORKER_HEARTBEAT_MS 1000
#define WORKER_LIVENESS 3
/* How long the last frames may take to leave when the worker exits. */
#define WORKER_LINGER_MS 2000
/* Requests queued in the worker beyond the running ones, per sequence slot. riverd
 * bounds its own queue; this one only absorbs riverd's dispatch running ahead. */
#define WORKER_QUEUE_PER_SEQ 4
#define WORKER_MAX_STOP 64
#define WORKER_MAX_STOP_BYTES 1024
/* Split pair: how long the river side waits for one layer's reply before it counts its
 * backbone peer as gone (a dead process is noticed at once through its pidfd; this only
 * bounds a hung one). A layer of the largest batch must fit in it with room to spare. */
#define WORKER_PAIR_REPLY_TIMEOUT_MS 30000

typedef struct worker {
    config_worker_t cfg;
    int64_t watchdog_ms;   /* systemd watchdog ping interval (half WATCHDOG_USEC), 0: off */
    int64_t watchdog_next; /* when the next ping is due */
    char id[256];
    engine_env_t env;
    exit_setup_t xc;
    gen_t *gen;
    void *zctx;
    link_t *link;
    sched_t *sched;
    int sigfd;
    int signals;          /* SIGTERM/SIGINT received */
    /* Split pair. */
    char fingerprint[MODEL_FINGERPRINT_LEN];
    kv_pool_t *kv;        /* role river: the shared pool the engine borrows */
    int memfd;            /* its descriptor, owned by the pool */
    pair_river_t *pair;   /* role river: the link to the backbone peer */
    pair_backbone_t *bb;  /* role backbone: the link to the river peer */
    bool linked;          /* role river: Ready went to riverd (after the first pairing) */
    /* auth.mode curve: this worker's keys and riverd's public key. */
    bool curve;
    keys_pair_t keys;
    char server_key[KEYS_Z85_LEN + 1];
    bool said_unavailable; /* role river: what riverd was last told about the backbone */
    /* The secret of the prefix cache's page names, drawn at start (Capabilities
     * .prefix_key): nobody without it can predict or collide a name. */
    uint8_t prefix_key[PREFIX_KEY_BYTES];
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
    if (w->pair && !pair_river_ready(w->pair) && m->request_id) {
        /* UNAVAILABLE: riverd gives it to another worker instead of this half a model. */
        char msg[600];
        snprintf(msg, sizeof msg, "this river worker's backbone peer (%s) is not connected",
                 w->cfg.split_peer);
        link_send_failed(w->link, m->request_id, RIVER__CLIENT__ERROR__CODE__UNAVAILABLE, msg);
        return;
    }
    sched_submit(w->sched, m, clock_now_ms());
}

static void worker__on_cancel(void *user, uint64_t request_id)
{
    worker_t *w = user;
    sched_cancel(w->sched, request_id);
}

static void worker__on_drain(void *user, uint32_t deadline_ms)
{
    worker_t *w = user;
    sched_drain(w->sched, deadline_ms, clock_now_ms(), RIVER__CLIENT__ERROR__CODE__CANCELLED);
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
    st->unavailable = w->pair && !pair_river_ready(w->pair);
}

/* Role river: tells riverd at once when the backbone peer goes or comes back, rather than
 * at the next heartbeat, so that riverd stops sending requests this worker would only fail
 * (and starts again as soon as it can serve). A new Ready means "available" to riverd, so
 * until riverd welcomes the worker again there is nothing to correct. */
static void worker__report_pair(worker_t *w)
{
    if (!w->pair || !w->linked)
        return;
    if (!link_welcomed(w->link)) {
        w->said_unavailable = false;
        return;
    }
    bool unavailable = !pair_river_ready(w->pair);
    if (unavailable != w->said_unavailable && link_send_heartbeat(w->link) == 0)
        w->said_unavailable = unavailable;
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

/* The weights key as engine_open takes it. */
static backend_weights_t worker__weights(const config_worker_t *c)
{
    return c->weights == CONFIG_WEIGHTS_MAPPED ? BACKEND_WEIGHTS_MAPPED : BACKEND_WEIGHTS_COPY;
}

/* KV pages of the pool: kv.pages, or for 0 enough for max_seqs full contexts, capped at
 * half the memory the backend has free once the weights are placed (backend_mem_free:
 * the host's, or the GPU's). The pool is reserved up front, and 16 full contexts of a model
 * with a long context ask for more than a host or a GPU has (Llama 3.2 1B: 131072
 * positions, 1 MiB a page of 16, 128 GiB in all), which the kernel refuses to map;
 * sequences past the cap wait or are preempted. Never fewer than one full context's pages:
 * where even that is more than the memory has free, RIVER_ENOMEM says so and names the
 * key. */
static int worker__kv_pages(const worker_t *w, const config_worker_t *c, int *out)
{
    const model_config_t *mc = &w->env.model->cfg;
    int64_t per_seq = (mc->max_seq_len + c->kv_page_size - 1) / c->kv_page_size;
    int64_t want = (int64_t)c->max_seqs * per_seq;
    *out = c->kv_pages;
    if (c->kv_pages > 0)
        return 0;
    if (want > (1 << 24))
        want = 1 << 24;
    int host = backend_is_host(w->env.be);
    int64_t mem_free = backend_mem_free(w->env.be);
    dtype_t dt = gen_kv_dtype(w->env.model, c->kv_dtype);
    size_t page_bytes = kv_pool_shared_bytes(mc->n_layers, mc->n_kv_heads * mc->head_dim, dt,
                                             c->kv_page_size, 1);
    *out = (int)want;
    if (mem_free <= 0 || page_bytes == 0)
        return 0;
    int64_t fit = (int64_t)((double)mem_free * 0.5 / (double)page_bytes);
    if (fit >= want)
        return 0;
    /* A pool without room for one whole context would fail the longest requests however
     * long they wait; one that the memory cannot hold would fail here at the mapping with
     * a less helpful message. */
    if ((double)per_seq * (double)page_bytes > (double)mem_free)
        return river_err_set(RIVER_ENOMEM, "kv.pages 0: one full context of %d positions "
                             "takes %.1f GiB of KV (kv.dtype %s), more than the %.1f GiB the "
                             "%s has free; set kv.pages to the pages to reserve (of %d "
                             "positions, %.1f MiB each), and requests longer than the pool "
                             "wait or fail", mc->max_seq_len,
                             (double)per_seq * (double)page_bytes / 1073741824.0, dtype_name(dt),
                             (double)mem_free / 1073741824.0, host ? "host" : "device",
                             c->kv_page_size, (double)page_bytes / 1048576.0);
    int64_t pages = fit > per_seq ? fit : per_seq; /* fit < want here, and per_seq <= want */
    log_info("kv.pages 0: %lld pages of %d positions (%.1f GiB, kv.dtype %s), half the %s "
             "memory available; %d full contexts of %d would take %lld (set kv.pages to "
             "choose)", (long long)pages, c->kv_page_size,
             (double)pages * (double)page_bytes / 1073741824.0, dtype_name(dt),
             host ? "host's" : "device's", c->max_seqs, mc->max_seq_len, (long long)want);
    *out = (int)pages;
    return 0;
}

/* Logs what this process holds in memory: all of it, and the model's weights. */
static void worker__log_resident(const worker_t *w, const char *what)
{
    int64_t rss = offload_rss_bytes();
    int64_t model = pair_model_resident_bytes(w->env.model);
    log_info("%s: %.1f MiB resident, of which %.1f MiB of the model's weights", what,
             rss > 0 ? (double)rss / (1 << 20) : 0.0, model > 0 ? (double)model / (1 << 20) : 0.0);
}

/* Role river: the link to the backbone peer becomes the engine's remote for the layers
 * past the boundary, which this process then never reads. */
static int worker__open_pair(worker_t *w)
{
    const model_t *m = w->env.model;
    pair_river_config_t pc = {
        .endpoint = w->cfg.split_peer,
        .river_id = w->id,
        .boundary = w->cfg.split_boundary,
        .fingerprint = w->fingerprint,
        .backend = pair_backend_name(w->env.be),
        .threads = backend_threads(w->env.be),
        .max_rows = w->cfg.max_batch_rows,
        .heartbeat_ms = WORKER_HEARTBEAT_MS,
        .liveness = WORKER_LIVENESS,
        .reply_timeout_ms = WORKER_PAIR_REPLY_TIMEOUT_MS,
        .backoff_max_ms = w->cfg.reconnect_backoff_max_ms,
        .transport = w->cfg.split_transport,
        .be = w->env.be,
    };
    int e = pair_river_new(&w->pair, w->zctx, &pc, m, w->kv, w->memfd);
    if (e)
        return e;
    fwd_remote_t r;
    pair_river_remote(w->pair, &r);
    if ((e = forward_set_remote(gen_forward(w->gen), &r)))
        return e;
    /* The river half's cost model, once the layers past the boundary are the peer's: only
     * those below it are timed here. */
    if (w->xc.cfg.policy.rule != EXIT_RULE_NONE && w->xc.cfg.policy.agg == EXIT_AGG_ROW &&
        w->xc.river &&
        (e = forward_calibrate_costs(gen_forward(w->gen), gen_kv_pool(w->gen), &w->xc.cfg)))
        return e;
    pair_release_weights(m, w->cfg.split_boundary, m->cfg.n_layers, false);
    worker__log_resident(w, "river half");
    return 0;
}

/* Loads the model, its tokenizer, the river and routers, and builds the engine. */
/* Lossless mode's draft length: exit.draft_tokens, or with 0 the cost model's pick from
 * step times measured here at start-up (a few dozen forward steps), refined as requests
 * are served (gen_spec_t.costs). Measured only where lossless is the worker's default
 * mode of a whole-model worker (the river half of a split pair would time its peer's
 * layers before the pair is up); elsewhere lossless requests draft up to 4 tokens. */
static int worker__open_spec(worker_t *w)
{
    const config_worker_t *c = &w->cfg;
    gen_spec_t spec = {.k_max = c->exit_draft_tokens ? c->exit_draft_tokens : 4};
    spec_costs_t costs;
    if (!c->exit_draft_tokens && c->exit_mode == CONFIG_EXIT_MODE_LOSSLESS && w->xc.river &&
        c->role == CONFIG_ROLE_FULL) {
        const model_config_t *mc = &w->env.model->cfg;
        int k_max = c->max_batch_rows - 1 < 8 ? c->max_batch_rows - 1 : 8;
        int ctx = mc->max_seq_len / 4 < 64 ? mc->max_seq_len / 4 : 64;
        int e = spec_costs_measure(gen_forward(w->gen), w->env.model, gen_kv_pool(w->gen),
                                   &w->xc.cfg, k_max, ctx, 5, &costs);
        if (e)
            return e;
        /* The measurement left the forward's exit off. */
        if ((e = gen_set_exit(w->gen, &w->xc.cfg)))
            return e;
        spec.k_max = k_max;
        spec.costs = &costs;
        log_info("lossless: plain step %.3f ms, draft step %.3f ms, verify of 2 rows "
                 "%.3f ms, of %d rows %.3f ms: drafting %d at acceptance 0.9 to start", costs.t_plain * 1e3,
                 costs.t_draft * 1e3, costs.t_verify[1] * 1e3, k_max + 1,
                 costs.t_verify[k_max] * 1e3,
                 spec_pick_k(0.9, k_max, costs.t_plain, costs.t_draft, costs.t_verify, NULL));
    }
    return gen_set_spec(w->gen, &spec);
}

static int worker__open_engine(worker_t *w)
{
    const config_worker_t *c = &w->cfg;
    if (!c->model[0])
        return river_err_set(RIVER_ECONFIG, "no model configured (key 'model')");
    bool river = c->role == CONFIG_ROLE_RIVER;
    if (river && !c->split_peer[0])
        return river_err_set(RIVER_ECONFIG, "role river needs split.peer, the backbone "
                             "worker's address");
    /* A river half places the shallow layers and the ends; the deep layers are its
     * backbone peer's (on GPUs: its device's). */
    engine_opts_t eo = {.model = c->model, .tokenizer = c->tokenizer[0] ? c->tokenizer : NULL,
                        .want_tokenizer = 1, .device = c->device, .threads = c->threads,
                        .place_end = river ? c->split_boundary : 0,
                        .weights = worker__weights(c)};
    int e = engine_open(&w->env, &eo);
    if (e)
        return e;
    if (river && (c->split_boundary < 1 || c->split_boundary >= w->env.model->cfg.n_layers))
        return river_err_set(RIVER_ECONFIG, "split.boundary %d: must be in 1..%d for a model "
                             "of %d layers", c->split_boundary,
                             w->env.model->cfg.n_layers - 1, w->env.model->cfg.n_layers);
    if (river && (e = model_fingerprint(w->env.model, w->fingerprint)))
        return e;
    exit_policy_t pol = {.rule = (exit_rule_t)c->exit_rule, .tau = (float)c->exit_tau,
                         .theta = (float)c->exit_theta, .exit_layer = c->exit_layer,
                         .agg = (exit_agg_t)c->exit_aggregation, .kv = EXIT_KV_RIVER,
                         .split_cost_model = 1};
    if ((e = exit_setup_open(&w->xc, &pol, c->river[0] ? c->river : NULL,
                             c->routers[0] ? c->routers : NULL, w->env.model)))
        return e;
    int kv_pages = 0;
    if ((e = worker__kv_pages(w, c, &kv_pages)))
        return e;
    /* Preemption: a worker under load must not fail a request because the pool is
     * momentarily full. */
    gen_config_t gc = {.max_rows = c->max_batch_rows, .prefill_chunk = c->prefill_chunk,
                       .page_size = c->kv_page_size, .n_pages = kv_pages,
                       .kv_dtype = c->kv_dtype,
                       .max_seqs = c->max_seqs, .preempt = 1,
                       .prefix_cache = c->prefix_cache_enabled && !river,
                       .prefix_cache_pages = c->prefix_cache_pages};
    if (gc.prefix_cache) {
        /* Page names carry the model and river, so riverd never takes one worker's pages
         * for another model's (and the seed names the river a worker runs). */
        char fp[MODEL_FINGERPRINT_LEN];
        if ((e = model_fingerprint(w->env.model, fp)))
            return e;
        char rfp[64] = "";
        if (w->xc.river)
            snprintf(rfp, sizeof rfp, "%s/q%d/g%d/s%d", exitriver_fingerprint_of(w->xc.river),
                     exitriver_bits(w->xc.river), exitriver_group(w->xc.river),
                     exitriver_start_layer(w->xc.river));
        gc.prefix_seed = prefix_hash_seed(fp, rfp);
        if ((e = prefix_key_random(&gc.prefix_key)))
            return e;
        prefix_key_to_bytes(&gc.prefix_key, w->prefix_key);
    }
    if (river) {
        /* The pool the backbone peer maps too. */
        const model_config_t *mc = &w->env.model->cfg;
        if ((e = kv_dtype_check(gen_kv_dtype(w->env.model, c->kv_dtype), mc->head_dim)))
            return e;
        if ((e = kv_pool_new_shared(&w->kv, w->env.be, mc->n_layers,
                                    mc->n_kv_heads * mc->head_dim,
                                    gen_kv_dtype(w->env.model, c->kv_dtype), c->kv_page_size,
                                    kv_pages,
                                    &w->memfd)))
            return e;
        gc.kv_pool = w->kv;
    }
    if ((e = gen_new(&w->gen, w->env.model, w->env.tok, w->env.be, &gc)))
        return e;
    if (pol.rule != EXIT_RULE_NONE) {
        /* The cost model decides when row aggregation splits a layer; under min aggregation
         * rows split only between groups (a prompt chunk beside decode rows, a request that
         * opted out), which always runs as two groups. */
        if (pol.agg == EXIT_AGG_ROW && w->xc.river && !river &&
            (e = forward_calibrate_costs(gen_forward(w->gen), gen_kv_pool(w->gen), &w->xc.cfg)))
            return e;
        if ((e = gen_set_exit(w->gen, &w->xc.cfg)))
            return e;
    }
    return worker__open_spec(w);
}

static int worker__open(worker_t *w)
{
    w->zctx = zmq_ctx_new();
    if (!w->zctx)
        return river_err_set(RIVER_ESYS, "zmq_ctx_new: %s", zmq_strerror(errno));
    int e = worker__open_engine(w);
    if (e)
        return e;
    bool river = w->cfg.role == CONFIG_ROLE_RIVER;
    if (river && (e = worker__open_pair(w)))
        return e;
    const model_config_t *mc = &w->env.model->cfg;
    kv_pool_t *kv = gen_kv_pool(w->gen);
    char name[512];
    link_config_t lc = {
        .endpoint = w->cfg.riverd,
        .worker_id = w->id,
        .role = river ? RIVER__WORKER__ROLE__ROLE_RIVER : RIVER__WORKER__ROLE__ROLE_FULL,
        .caps = RIVER__WORKER__CAPABILITIES__INIT,
        .heartbeat_ms = WORKER_HEARTBEAT_MS,
        .liveness = WORKER_LIVENESS,
        .backoff_max_ms = w->cfg.reconnect_backoff_max_ms,
        .linger_ms = WORKER_LINGER_MS,
        .curve_public = w->curve ? w->keys.public_txt : NULL,
        .curve_secret = w->curve ? w->keys.secret_txt : NULL,
        .curve_server = w->curve ? w->server_key : NULL,
    };
    lc.caps.model = (char *)worker__model_name(w->cfg.model, name, sizeof name);
    lc.caps.max_batch = (uint32_t)w->cfg.max_batch_rows;
    lc.caps.max_seqs = (uint32_t)w->cfg.max_seqs;
    lc.caps.kv_page_size = (uint32_t)kv_pool_page_size(kv);
    lc.caps.kv_pages_total = (uint32_t)kv_pool_total_pages(kv);
    lc.caps.n_layers = (uint32_t)mc->n_layers;
    lc.caps.layer_begin = 0;
    /* The river half holds the backbone below the boundary (and all of the Exit River). */
    lc.caps.layer_end = (uint32_t)(river ? w->cfg.split_boundary : mc->n_layers);
    lc.caps.has_river = w->xc.river != NULL;
    lc.caps.max_context = (uint32_t)mc->max_seq_len;
    const prefix_cache_t *pcache = gen_prefix_cache(w->gen);
    lc.caps.prefix_seed = pcache ? prefix_cache_seed(pcache) : 0;
    if (pcache) {
        lc.caps.prefix_key.data = w->prefix_key;
        lc.caps.prefix_key.len = sizeof w->prefix_key;
    }
    sched_config_t sc = {
        .max_queue = WORKER_QUEUE_PER_SEQ * w->cfg.max_seqs,
        .max_stop = WORKER_MAX_STOP,
        .max_stop_bytes = WORKER_MAX_STOP_BYTES,
        .policy = w->xc.cfg.policy,
        .lossless = w->cfg.exit_mode == CONFIG_EXIT_MODE_LOSSLESS,
        .can_lossless = w->xc.river != NULL && w->xc.cfg.policy.rule != EXIT_RULE_NONE,
        .be = w->env.be,
    };
    link_handlers_t h = {
        .user = w,
        .submit = worker__on_submit,
        .cancel = worker__on_cancel,
        .drain = worker__on_drain,
        .reset = worker__on_reset,
        .status = worker__on_status,
    };
    if ((e = link_new(&w->link, w->zctx, &lc, &h)) ||
        (e = sched_new(&w->sched, w->gen, w->env.model, w->env.tok, w->link, &sc)))
        return e;
    /* A river half connects to riverd once its backbone accepted it (worker__run): riverd
     * should not count on a worker that cannot run a whole token yet. */
    if (!river) {
        if ((e = link_start(w->link)))
            return e;
        w->linked = true;
    }
    char be_name[96];
    log_info("serving %s on %s (%d threads): %d layers, context %d, %d sequences, %d "
             "rows, %d KV pages of %d (kv.dtype %s, %.1f MiB), exit policy %s%s", lc.caps.model,
             backend_describe(w->env.be, be_name, sizeof be_name), backend_threads(w->env.be),
             mc->n_layers, mc->max_seq_len, w->cfg.max_seqs, w->cfg.max_batch_rows,
             kv_pool_total_pages(kv), kv_pool_page_size(kv), dtype_name(kv_pool_dtype(kv)),
             (double)kv_pool_shared_bytes(mc->n_layers, mc->n_kv_heads * mc->head_dim,
                                          kv_pool_dtype(kv), kv_pool_page_size(kv),
                                          kv_pool_total_pages(kv)) / 1048576.0,
             exit_rule_name(w->xc.cfg.policy.rule),
             w->xc.river ? " with the Exit River" : "");
    return 0;
}

static void worker__close(worker_t *w)
{
    gen_stats_t st = {0};
    if (w->gen)
        gen_get_stats(w->gen, &st);
    if (w->pair) {
        int64_t trips;
        double secs;
        pair_river_stats(w->pair, &trips, &secs);
        if (trips)
            log_info("pair: %lld backbone layer round trips, %.0f us each on average "
                     "(wire and backbone compute)", (long long)trips, secs * 1e6 / (double)trips);
    }
    if (st.prefill_tokens) {
        log_info("engine: %lld prefill tokens at %.0f tok/s, %lld decode tokens at "
                 "%.0f tok/s, %lld preemptions, prefix cache %lld of %lld prompt tokens",
                 (long long)st.prefill_tokens,
                 st.prefill_s > 0 ? (double)st.prefill_tokens / st.prefill_s : 0.0,
                 (long long)st.decode_tokens,
                 st.decode_s > 0 ? (double)st.decode_tokens / st.decode_s : 0.0,
                 (long long)st.preemptions, (long long)st.prefix_hit_tokens,
                 (long long)st.prefix_query_tokens);
    }
    sched_destroy(&w->sched);
    link_destroy(&w->link);
    pair_river_destroy(&w->pair);
    pair_backbone_destroy(&w->bb);
    if (w->zctx) {
        /* Waits for the linger of the closed socket: the last frames leave first. */
        while (zmq_ctx_term(w->zctx) && errno == EINTR) {
        }
        w->zctx = NULL;
    }
    gen_destroy(&w->gen);
    kv_pool_destroy(&w->kv);
    exit_setup_close(&w->xc);
    engine_close(&w->env);
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
            log_info("%s: finishing running requests (at most %d ms), then exiting",
                     strsignal((int)si.ssi_signo), WORKER_TERM_GRACE_MS);
            /* UNAVAILABLE: riverd gives what is cut off to another worker. */
            sched_drain(w->sched, WORKER_TERM_GRACE_MS, clock_now_ms(),
                        RIVER__CLIENT__ERROR__CODE__UNAVAILABLE);
        } else {
            log_warn("%s again: failing every request now", strsignal((int)si.ssi_signo));
            sched_fail_all(w->sched, RIVER__CLIENT__ERROR__CODE__UNAVAILABLE,
                           "the worker is shutting down");
        }
    }
}

/* Under systemd (Type=notify), READY once the engine is built, then watchdog pings from the
 * poll loop: a worker stuck in a step stops pinging and systemd restarts it. */
static void worker__notify_ready(worker_t *w)
{
    uint64_t usec = 0;
    if (sd_watchdog_enabled(0, &usec) > 0 && usec >= 2000) {
        w->watchdog_ms = (int64_t)(usec / 2000);
        w->watchdog_next = clock_now_ms() + w->watchdog_ms;
    }
    sd_notifyf(0, "READY=1\nSTATUS=worker %s serving %s", w->id, w->cfg.model);
}

/* Pings the watchdog when due; returns when the next ping is due (INT64_MAX: never). */
static int64_t worker__watchdog(worker_t *w, int64_t now)
{
    if (!w->watchdog_ms)
        return INT64_MAX;
    if (now >= w->watchdog_next) {
        sd_notify(0, "WATCHDOG=1");
        w->watchdog_next = now + w->watchdog_ms;
    }
    return w->watchdog_next;
}

static int worker__run(worker_t *w)
{
    for (;;) {
        int64_t now = clock_now_ms();
        int timeout = 0;
        int64_t wd = worker__watchdog(w, now);
        if (!sched_busy(w->sched)) {
            int64_t next = w->linked ? link_next_ms(w->link) : INT64_MAX;
            if (wd < next)
                next = wd;
            int64_t d = sched_next_ms(w->sched);
            if (d < next)
                next = d;
            if (w->pair && (d = pair_river_next_ms(w->pair)) < next)
                next = d;
            int64_t wait = next - now;
            timeout = wait < 0 ? 0 : wait > 60000 ? 60000 : (int)wait;
        }
        /* Signals, riverd, and (role river) the backbone peer's socket and process. */
        zmq_pollitem_t items[2 + PAIR_POLL_ITEMS] = {
            {.fd = w->sigfd, .events = ZMQ_POLLIN},
        };
        int n_items = 1, link_at = -1;
        if (w->linked && link_socket(w->link)) {
            link_at = n_items;
            items[n_items++] = (zmq_pollitem_t){.socket = link_socket(w->link),
                                                .events = ZMQ_POLLIN};
        }
        int pair_at = n_items, n_pair = w->pair ? pair_river_poll_items(w->pair, items + n_items)
                                                : 0;
        n_items += n_pair;
        if (zmq_poll(items, n_items, timeout) < 0 && errno != EINTR)
            return river_err_set(RIVER_ESYS, "zmq_poll: %s", zmq_strerror(errno));
        if (items[0].revents & ZMQ_POLLIN)
            worker__on_signal(w);
        if (link_at > 0 && (items[link_at].revents & ZMQ_POLLIN))
            link_recv(w->link);
        now = clock_now_ms();
        if (w->pair) {
            pair_river_on_poll(w->pair, items + pair_at, n_pair, now);
            pair_river_tick(w->pair, now);
            if (pair_river_refused(w->pair))
                return river_err_set(RIVER_ECONFIG, "%s", pair_river_refusal(w->pair));
            if (!w->linked && pair_river_ready(w->pair)) {
                int e = link_start(w->link);
                if (e)
                    return e;
                w->linked = true;
            }
        }
        if (w->linked)
            link_tick(w->link, now);
        worker__report_pair(w);
        /* An engine step that failed has failed its requests; the worker stays up, unless
         * its device is lost for good: then only a new process can serve, and riverd, which
         * sees the link go, sends this worker's requests elsewhere. */
        if (sched_step(w->sched, now) && backend_is_lost(w->env.be))
            return RIVER_EDEVICE;
        if (sched_drained(w->sched)) {
            /* The last word: draining, nothing queued, nothing running. */
            link_send_heartbeat(w->link);
            log_info("drained; exiting");
            return 0;
        }
    }
}

/* ---- Role backbone: the deep half of a split pair ---- */

/* Loads the model (only its layers from the boundary on are ever read), binds split.peer
 * and waits for a river worker's hello. */
static int worker__open_backbone(worker_t *w)
{
    const config_worker_t *c = &w->cfg;
    if (!c->model[0])
        return river_err_set(RIVER_ECONFIG, "no model configured (key 'model')");
    if (!c->split_peer[0])
        return river_err_set(RIVER_ECONFIG, "role backbone needs split.peer, the address it "
                             "binds for its river worker");
    w->zctx = zmq_ctx_new();
    if (!w->zctx)
        return river_err_set(RIVER_ESYS, "zmq_ctx_new: %s", zmq_strerror(errno));
    /* Only the layers from the boundary on are ever computed here. */
    engine_opts_t eo = {.model = c->model, .device = c->device, .threads = c->threads,
                        .place_begin = c->split_boundary, .place_end = 1 << 20,
                        .place_no_ends = 1, .weights = worker__weights(c)};
    int e = engine_open(&w->env, &eo);
    if (e)
        return e;
    const model_t *m = w->env.model;
    if ((e = model_fingerprint(m, w->fingerprint)))
        return e;
    pair_backbone_config_t pc = {
        .endpoint = c->split_peer,
        .boundary = c->split_boundary,
        .fingerprint = w->fingerprint,
        .backend = pair_backend_name(w->env.be),
        .threads = backend_threads(w->env.be),
        .transport = c->split_transport,
        .kv_dtype = gen_kv_dtype(m, c->kv_dtype),
    };
    if ((e = pair_backbone_new(&w->bb, w->zctx, &pc, m, w->env.be)))
        return e;
    /* The fingerprint read samples of every tensor; the shallow layers and the ends of
     * the model are the river worker's, so their pages go. */
    pair_release_weights(m, 0, c->split_boundary, true);
    worker__log_resident(w, "backbone half");
    log_info("backbone of %s: layers %d..%d on %d threads, waiting for a river worker "
             "at %s (transport %s%s)", c->model, c->split_boundary, m->cfg.n_layers - 1, pc.threads,
             c->split_peer,
             pair_transport_name(pair_transport_resolve((pair_transport_kind_t)pc.transport,
                                                        w->env.be)),
             pair_transport_fallback((pair_transport_kind_t)pc.transport, w->env.be)
                 ? ", p2p with a river on this GPU" : "");
    return 0;
}

/* One poll loop: signals, the river peer's socket and process. A signal ends the process
 * at once, between two layer requests; the river worker fails what needed this half and
 * pairs again when a backbone is back. */
static int worker__run_backbone(worker_t *w)
{
    for (;;) {
        int64_t now = clock_now_ms();
        int64_t wait = pair_backbone_next_ms(w->bb) - now;
        int timeout = wait < 0 ? 0 : wait > 60000 ? 60000 : (int)wait;
        zmq_pollitem_t items[1 + PAIR_POLL_ITEMS] = {
            {.fd = w->sigfd, .events = ZMQ_POLLIN},
        };
        int n = pair_backbone_poll_items(w->bb, items + 1);
        if (zmq_poll(items, 1 + n, timeout) < 0 && errno != EINTR)
            return river_err_set(RIVER_ESYS, "zmq_poll: %s", zmq_strerror(errno));
        if (items[0].revents & ZMQ_POLLIN) {
            struct signalfd_siginfo si;
            if (read(w->sigfd, &si, sizeof si) == (ssize_t)sizeof si) {
                log_info("%s: exiting", strsignal((int)si.ssi_signo));
                return 0;
            }
        }
        now = clock_now_ms();
        pair_backbone_on_poll(w->bb, items + 1, n, now);
        pair_backbone_tick(w->bb, now);
    }
}

/* auth.mode curve: reads the keys the configuration names, before anything slow, so that
 * a wrong path fails at once; the error names the file and the key. */
static int worker__load_keys(worker_t *w, const char *config_path)
{
    const config_worker_t *c = &w->cfg;
    if (c->auth_mode == CONFIG_AUTH_PLAIN || c->role == CONFIG_ROLE_BACKBONE)
        return 0;
    char path[4096];
    if (keys_resolve_path(config_path, c->auth_secret_key, path, sizeof path) < 0 ||
        keys_load_secret(path, &w->keys) < 0)
        return keys_config_error(config_path, "auth.secret_key");
    if (keys_resolve_path(config_path, c->auth_server_key, path, sizeof path) < 0 ||
        keys_load_public(path, w->server_key) < 0)
        return keys_config_error(config_path, "auth.server_key");
    w->curve = true;
    return 0;
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
    if ((e = worker__load_keys(&w, config_path))) {
        fprintf(stderr, "river-worker: %s\n", river_err_detail());
        config_free(&config_schema_worker, &w.cfg);
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
    log_init(&(log_opts_t){.name = "river-worker", .tag = w.id, .utc = true});
    log_set_level(w.cfg.log_level);
    if (w.cfg.auth_mode == CONFIG_AUTH_PLAIN && w.cfg.role != CONFIG_ROLE_BACKBONE)
        log_warn("auth.mode is plain: the link to riverd is neither authenticated nor "
                 "encrypted");
    if (w.cfg.max_batch_rows < w.cfg.prefill_chunk && w.cfg.role != CONFIG_ROLE_BACKBONE)
        log_warn("max_batch_rows %d is below prefill_chunk %d: prompts prefill at most %d "
                 "rows a step", w.cfg.max_batch_rows, w.cfg.prefill_chunk,
                 w.cfg.max_batch_rows);
    int rc = 1;
    if (w.cfg.role == CONFIG_ROLE_BACKBONE) {
        if ((e = worker__open_backbone(&w)))
            log_error("start-up failed: %s", river_err_detail());
        else if ((e = worker__run_backbone(&w)))
            log_error("%s", river_err_detail());
        else
            rc = 0;
    } else if (!w.cfg.riverd) {
        log_error("out of memory");
    } else if ((e = worker__open(&w))) {
        log_error("start-up failed: %s", river_err_detail());
    } else if (worker__notify_ready(&w), (e = worker__run(&w))) {
        log_error("%s", river_err_detail());
        /* Requests on a lost device fail UNAVAILABLE, which riverd re-dispatches to
         * another worker with the tokens they already have. */
        if (backend_is_lost(w.env.be)) {
            log_error("the device is lost to this process; exiting so that riverd "
                      "re-dispatches its requests");
            sched_fail_all(w.sched, RIVER__CLIENT__ERROR__CODE__UNAVAILABLE, river_err_detail());
        } else {
            sched_fail_all(w.sched, RIVER__CLIENT__ERROR__CODE__INTERNAL, river_err_detail());
        }
    } else {
        rc = 0;
    }
    worker__close(&w);
    memset(&w.keys, 0, sizeof w.keys);
    return rc;
}
