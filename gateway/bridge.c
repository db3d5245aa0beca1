/* The connection to riverd. A river_client_t is not thread-safe, so one thread owns it:
 * HTTP threads hand it requests and cancellations through a queue, and it delivers what
 * riverd sends into each request's gw_call_t, waking the HTTP thread that waits on it. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "common/err.h"
#include "common/log.h"
#include "gateway/gateway.h"

/* How long the thread waits in river_client_poll while requests are in flight: the most a
 * new request or a cancellation waits in the queue. */
#define GW_BRIDGE_POLL_MS 1
/* ... and on its queue when nothing is in flight (the client's own housekeeping, the
 * connection monitor, runs at least this often). */
#define GW_BRIDGE_IDLE_MS 50

typedef struct gw_op {
    struct gw_op *next;
    gw_call_t *call; /* holds a reference */
    int cancel;
} gw_op_t;

struct gw_bridge {
    river_client_t *client;
    pthread_t thread;
    int thread_started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    gw_op_t *head, *tail;
    int stop;
    /* The requests the thread has sent and not seen end; only the thread touches them. */
    gw_call_t **live;
    size_t n_live, cap_live;
    uint32_t timeout_ms; /* the client library's own limit per request */
};

/* ---- Calls ---- */

gw_call_t *gw_call_new(void)
{
    gw_call_t *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    if (pthread_mutex_init(&c->mu, NULL)) {
        free(c);
        return NULL;
    }
    if (pthread_cond_init(&c->cv, NULL)) {
        pthread_mutex_destroy(&c->mu);
        free(c);
        return NULL;
    }
    c->refs = 1;
    river_generate_opts_t init = RIVER_GENERATE_OPTS_INIT;
    c->opts = init;
    return c;
}

static void gw_call__ref(gw_call_t *c)
{
    pthread_mutex_lock(&c->mu);
    c->refs++;
    pthread_mutex_unlock(&c->mu);
}

void gw_call_release(gw_call_t **pc)
{
    gw_call_t *c = *pc;
    if (!c)
        return;
    *pc = NULL;
    pthread_mutex_lock(&c->mu);
    int left = --c->refs;
    pthread_mutex_unlock(&c->mu);
    if (left > 0)
        return;
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->mu);
    size_t body_bytes = c->body_bytes;
    gw_request_free(&c->req);
    free(c->prompt);
    free(c->special);
    free(c->text);
    free(c->ids);
    free(c->exit_layers);
    json_decref(c->logprobs);
    free(c);
    gw_release_memory(body_bytes);
}

static int gw_call__grow(void **v, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return 0;
    size_t n = *cap ? *cap : 64;
    while (n < need)
        n *= 2;
    void *p = realloc(*v, n * elem);
    if (!p)
        return -1;
    *v = p;
    *cap = n;
    return 0;
}

/* Ends a call (caller holds its lock). */
static void gw_call__fail_locked(gw_call_t *c, river_code_t code, const char *message)
{
    if (c->done)
        return;
    c->done = 1;
    c->ok = 0;
    c->code = code;
    snprintf(c->message, sizeof c->message, "%s", message);
    c->t_end = clock_now_s();
    pthread_cond_broadcast(&c->cv);
}

static void gw_call__fail(gw_call_t *c, river_code_t code, const char *message)
{
    pthread_mutex_lock(&c->mu);
    gw_call__fail_locked(c, code, message);
    pthread_mutex_unlock(&c->mu);
    if (c->on_event)
        c->on_event(c);
}

/* What riverd sent about a call, in the bridge thread. */
static void gw_bridge__event(void *user, const river_event_t *ev)
{
    gw_call_t *c = user;
    pthread_mutex_lock(&c->mu);
    if (c->done) {
        pthread_mutex_unlock(&c->mu);
        return;
    }
    double now = clock_now_s();
    switch (ev->kind) {
    case RIVER_EVENT_CHUNK:
        if (gw_call__grow((void **)&c->text, &c->cap_text, c->n_text + ev->text_len + 1, 1) ||
            gw_call__grow((void **)&c->ids, &c->cap_ids, c->n_ids + ev->n_ids, sizeof(int32_t)) ||
            gw_call__grow((void **)&c->exit_layers, &c->cap_exit_layers,
                          c->n_exit_layers + ev->n_exit_layers, sizeof(int32_t))) {
            gw_call__fail_locked(c, RIVER_CODE_INTERNAL, "out of memory for the completion");
            break;
        }
        memcpy(c->text + c->n_text, ev->text, ev->text_len);
        c->n_text += ev->text_len;
        c->text[c->n_text] = '\0';
        memcpy(c->ids + c->n_ids, ev->ids, ev->n_ids * sizeof(int32_t));
        c->n_ids += ev->n_ids;
        memcpy(c->exit_layers + c->n_exit_layers, ev->exit_layers,
               ev->n_exit_layers * sizeof(int32_t));
        c->n_exit_layers += ev->n_exit_layers;
        if (ev->n_logprobs && !c->logprobs)
            c->logprobs = json_array();
        for (size_t i = 0; c->logprobs && i < ev->n_logprobs; i++)
            json_array_append_new(c->logprobs, gw_logprob_json(&ev->logprobs[i]));
        if (!c->started && ev->n_ids) {
            c->started = 1;
            c->t_first = now;
        }
        break;
    case RIVER_EVENT_FINAL:
        c->done = 1;
        c->ok = 1;
        c->finish = ev->finish;
        c->usage.prompt_tokens = ev->prompt_tokens;
        c->usage.completion_tokens = ev->completion_tokens;
        /* Shared pages could be another tenant's: their count would tell it. */
        if (c->tenant && !gw_tenant_cache_shared(c->tenant))
            c->usage.cached_tokens = ev->cached_tokens;
        c->usage.mean_exit_layer = ev->mean_exit_layer;
        c->t_end = now;
        if (c->tenant)
            gw_tenant_charge(c->tenant, ev->prompt_tokens + ev->completion_tokens);
        break;
    case RIVER_EVENT_ERROR:
        if (c->tenant)
            gw_tenant_charge(c->tenant, (uint32_t)c->n_ids);
        gw_call__fail_locked(c, ev->code, ev->message ? ev->message : "");
        break;
    }
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    if (c->on_event)
        c->on_event(c);
}

/* ---- The thread ---- */

static void gw_bridge__do_submit(gw_bridge_t *b, gw_call_t *c, int stopping)
{
    if (stopping) {
        gw_call__fail(c, RIVER_CODE_UNAVAILABLE, "the gateway is shutting down");
        gw_call_release(&c);
        return;
    }
    if (gw_call__grow((void **)&b->live, &b->cap_live, b->n_live + 1, sizeof *b->live)) {
        gw_call__fail(c, RIVER_CODE_INTERNAL, "out of memory");
        gw_call_release(&c);
        return;
    }
    c->opts.timeout_ms = b->timeout_ms;
    if (c->tenant) {
        c->opts.tenant = gw_tenant_name(c->tenant);
        c->opts.cache_salt = gw_tenant_cache_salt(c->tenant);
    }
    int rc = river_client_submit(b->client, &c->opts, c->id, gw_bridge__event, c, NULL);
    if (rc) {
        char msg[512];
        snprintf(msg, sizeof msg, "riverd: %s", river_err_detail());
        gw_call__fail(c, rc == RIVER_EAUTH ? RIVER_CODE_UNAUTHENTICATED
                                           : rc == RIVER_EINVAL ? RIVER_CODE_INVALID_ARGUMENT
                                                                : RIVER_CODE_UNAVAILABLE,
                      msg);
        gw_call_release(&c);
        return;
    }
    b->live[b->n_live++] = c; /* the submit's reference, until the call ends */
}

static void gw_bridge__do_cancel(gw_bridge_t *b, gw_call_t *c)
{
    for (size_t i = 0; i < b->n_live; i++)
        if (b->live[i] == c) {
            int rc = river_client_cancel(b->client, c->id);
            if (rc)
                log_warn("cancel %s: %s", c->id, river_err_detail());
            break;
        }
    gw_call_release(&c);
}

/* Lets go of the calls that have ended. */
static void gw_bridge__sweep(gw_bridge_t *b)
{
    size_t k = 0;
    for (size_t i = 0; i < b->n_live; i++) {
        gw_call_t *c = b->live[i];
        pthread_mutex_lock(&c->mu);
        int done = c->done;
        pthread_mutex_unlock(&c->mu);
        if (done)
            gw_call_release(&c);
        else
            b->live[k++] = c;
    }
    b->n_live = k;
}

static void *gw_bridge__main(void *arg)
{
    gw_bridge_t *b = arg;
    for (;;) {
        pthread_mutex_lock(&b->mu);
        if (!b->head && !b->stop && b->n_live == 0) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += GW_BRIDGE_IDLE_MS * 1000000L;
            if (ts.tv_nsec >= 1000000000L) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000L;
            }
            int e = pthread_cond_timedwait(&b->cv, &b->mu, &ts);
            if (e && e != ETIMEDOUT)
                log_error("bridge: pthread_cond_timedwait: %s", strerror(e));
        }
        gw_op_t *ops = b->head;
        b->head = b->tail = NULL;
        int stopping = b->stop;
        pthread_mutex_unlock(&b->mu);
        while (ops) {
            gw_op_t *next = ops->next;
            if (ops->cancel)
                gw_bridge__do_cancel(b, ops->call);
            else
                gw_bridge__do_submit(b, ops->call, stopping);
            free(ops);
            ops = next;
        }
        if (stopping) {
            for (size_t i = 0; i < b->n_live; i++) {
                river_client_cancel(b->client, b->live[i]->id);
                gw_call__fail(b->live[i], RIVER_CODE_UNAVAILABLE,
                              "the gateway is shutting down");
            }
            gw_bridge__sweep(b);
            return NULL;
        }
        int rc = river_client_poll(b->client, b->n_live ? GW_BRIDGE_POLL_MS : 0);
        if (rc < 0)
            log_warn("riverd connection: %s", river_err_detail());
        gw_bridge__sweep(b);
    }
}

int gw_bridge_new(gw_bridge_t **out, const gw_config_t *cfg)
{
    *out = NULL;
    gw_bridge_t *b = calloc(1, sizeof *b);
    if (!b)
        return river_err_set(RIVER_ENOMEM, "bridge");
    int rc;
    if (cfg->auth_mode == CONFIG_AUTH_PLAIN) {
        rc = river_client_new(&b->client, cfg->riverd_endpoint);
    } else {
        river_keys_t keys = {.secret_key = cfg->secret_key, .server_key = cfg->server_key};
        rc = river_client_new_secure(&b->client, cfg->riverd_endpoint, &keys);
    }
    if (rc)
        goto fail_client;
    /* The library gives up on a request riverd says nothing about for this long; riverd's
     * own deadline (timeouts.request) should come first. */
    b->timeout_ms = cfg->request_timeout_ms ? (uint32_t)(cfg->request_timeout_ms + 30000) : 0;
    if (pthread_mutex_init(&b->mu, NULL)) {
        rc = river_err_set(RIVER_ESYS, "bridge mutex");
        goto fail_mutex;
    }
    if (pthread_cond_init(&b->cv, NULL)) {
        rc = river_err_set(RIVER_ESYS, "bridge condition");
        goto fail_cond;
    }
    int e = pthread_create(&b->thread, NULL, gw_bridge__main, b);
    if (e) {
        rc = river_err_set(RIVER_ESYS, "bridge thread: %s", strerror(e));
        goto fail_thread;
    }
    b->thread_started = 1;
    *out = b;
    return 0;
fail_thread:
    pthread_cond_destroy(&b->cv);
fail_cond:
    pthread_mutex_destroy(&b->mu);
fail_mutex:
    river_client_destroy(&b->client);
fail_client:
    free(b);
    return rc;
}

static int gw_bridge__push(gw_bridge_t *b, gw_call_t *c, int cancel)
{
    gw_op_t *op = calloc(1, sizeof *op);
    if (!op)
        return river_err_set(RIVER_ENOMEM, "bridge queue");
    pthread_mutex_lock(&b->mu);
    if (b->stop) {
        /* The thread is gone or going: nothing reaches riverd any more. */
        pthread_mutex_unlock(&b->mu);
        free(op);
        if (!cancel)
            gw_call__fail(c, RIVER_CODE_UNAVAILABLE, "the gateway is shutting down");
        return 0;
    }
    gw_call__ref(c);
    op->call = c;
    op->cancel = cancel;
    if (b->tail)
        b->tail->next = op;
    else
        b->head = op;
    b->tail = op;
    pthread_cond_signal(&b->cv);
    pthread_mutex_unlock(&b->mu);
    return 0;
}

int gw_bridge_submit(gw_bridge_t *b, gw_call_t *call)
{
    call->t_start = clock_now_s();
    return gw_bridge__push(b, call, 0);
}

void gw_bridge_cancel(gw_bridge_t *b, gw_call_t *call)
{
    if (gw_bridge__push(b, call, 1))
        log_warn("cancel %s: %s", call->id, river_err_detail());
}

void gw_bridge_stop(gw_bridge_t *b)
{
    pthread_mutex_lock(&b->mu);
    b->stop = 1;
    pthread_cond_signal(&b->cv);
    pthread_mutex_unlock(&b->mu);
    if (b->thread_started) {
        pthread_join(b->thread, NULL);
        b->thread_started = 0;
    }
}

void gw_bridge_destroy(gw_bridge_t **pb)
{
    gw_bridge_t *b = *pb;
    if (!b)
        return;
    *pb = NULL;
    gw_bridge_stop(b);
    /* Whatever was queued after the thread's last pass. */
    for (gw_op_t *op = b->head, *next; op; op = next) {
        next = op->next;
        gw_call__fail(op->call, RIVER_CODE_UNAVAILABLE, "the gateway is shutting down");
        gw_call_release(&op->call);
        free(op);
    }
    free(b->live);
    pthread_cond_destroy(&b->cv);
    pthread_mutex_destroy(&b->mu);
    river_client_destroy(&b->client);
    free(b);
}
