/* The C client library: river_client.h over ZMQ DEALER sockets and the frame codec. */
#include "client/river_client.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <zmq.h>

#include "common/clock.h"
#include "common/err.h"
#include "common/frame.h"
#include "common/keys.h"

/* How long destroying a client waits for its last frames (a Cancel) to leave. */
#define CLIENT_LINGER_MS 200
/* ZMTP heartbeats on a client's connection: a riverd host that vanished without closing
 * the connection (a network partition, a stopped process) is noticed after the timeout,
 * like a closed connection. riverd's I/O threads answer them, however busy it is. */
#define CLIENT_HEARTBEAT_MS 2000
#define CLIENT_HEARTBEAT_TIMEOUT_MS 10000
/* Where a client's socket reports its connection events (inproc: per ZMQ context, and
 * every client has a context of its own). */
#define CLIENT_MONITOR_ENDPOINT "inproc://river-client-monitor"
#define ADMIN_MONITOR_ENDPOINT "inproc://river-admin-monitor"
#define ADMIN_TIMEOUT_DEFAULT_MS 5000

static const char *const client__codes[] = {
    "OK",          "INVALID_ARGUMENT", "RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED",
    "CANCELLED",   "UNAVAILABLE",      "INTERNAL",           "UNAUTHENTICATED",
};

static const char *const client__finishes[] = {
    "unspecified", "length", "eos", "stop", "context", "cancelled",
};

const char *river_code_name(river_code_t code)
{
    return (unsigned)code < sizeof client__codes / sizeof client__codes[0] ? client__codes[code]
                                                                          : "INTERNAL";
}

const char *river_finish_name(river_finish_t f)
{
    return (unsigned)f < sizeof client__finishes / sizeof client__finishes[0]
               ? client__finishes[f]
               : "unspecified";
}

/* Unknown codes must read as INTERNAL (river_client.proto). */
static river_code_t client__code(int code)
{
    return code >= 0 && code <= RIVER_CODE_UNAUTHENTICATED ? (river_code_t)code
                                                           : RIVER_CODE_INTERNAL;
}

/* A socket of its own ZMQ context, connected. */
/* Makes sock a CURVE client of riverd with the keys of those files. */
static int client__curve(void *sock, const river_keys_t *keys)
{
    if (!keys->secret_key || !keys->server_key)
        return river_err_set(RIVER_EINVAL, "CURVE needs both key files: this client's secret "
                             "key and riverd's public key");
    keys_pair_t me;
    char server[KEYS_Z85_LEN + 1];
    int rc = keys_load_secret(keys->secret_key, &me);
    if (rc == 0)
        rc = keys_load_public(keys->server_key, server);
    if (rc == 0 &&
        (zmq_setsockopt(sock, ZMQ_CURVE_SERVERKEY, server, KEYS_Z85_LEN) != 0 ||
         zmq_setsockopt(sock, ZMQ_CURVE_PUBLICKEY, me.public_txt, KEYS_Z85_LEN) != 0 ||
         zmq_setsockopt(sock, ZMQ_CURVE_SECRETKEY, me.secret_txt, KEYS_Z85_LEN) != 0))
        rc = river_err_set(RIVER_ESYS, "CURVE: %s", zmq_strerror(zmq_errno()));
    memset(&me, 0, sizeof me);
    return rc;
}

static int client__socket(const char *endpoint, const river_keys_t *keys, void **ctx,
                          void **sock)
{
    *ctx = zmq_ctx_new();
    if (!*ctx)
        return river_err_set(RIVER_ESYS, "zmq context: %s", zmq_strerror(zmq_errno()));
    *sock = zmq_socket(*ctx, ZMQ_DEALER);
    int linger = CLIENT_LINGER_MS, hb = CLIENT_HEARTBEAT_MS, hb_to = CLIENT_HEARTBEAT_TIMEOUT_MS;
    if (!*sock || zmq_setsockopt(*sock, ZMQ_LINGER, &linger, sizeof linger) != 0 ||
        zmq_setsockopt(*sock, ZMQ_HEARTBEAT_IVL, &hb, sizeof hb) != 0 ||
        zmq_setsockopt(*sock, ZMQ_HEARTBEAT_TIMEOUT, &hb_to, sizeof hb_to) != 0) {
        int e = zmq_errno();
        if (*sock)
            zmq_close(*sock);
        zmq_ctx_term(*ctx);
        *ctx = *sock = NULL;
        return river_err_set(RIVER_ESYS, "zmq socket: %s", zmq_strerror(e));
    }
    int rc = keys ? client__curve(*sock, keys) : 0;
    if (rc < 0) {
        zmq_close(*sock);
        zmq_ctx_term(*ctx);
        *ctx = *sock = NULL;
        return rc;
    }
    if (zmq_connect(*sock, endpoint) != 0) {
        int e = zmq_errno();
        zmq_close(*sock);
        zmq_ctx_term(*ctx);
        *ctx = *sock = NULL;
        return river_err_set(RIVER_EINVAL, "cannot connect to %s: %s", endpoint,
                             zmq_strerror(e));
    }
    return 0;
}

static int client__send(void *sock, const ProtobufCMessage *env)
{
    zmq_msg_t m;
    int rc = frame_encode_msg(env, &m);
    if (rc < 0) {
        zmq_msg_close(&m);
        return rc;
    }
    while (zmq_msg_send(&m, sock, 0) < 0) {
        if (zmq_errno() == EINTR)
            continue;
        int e = zmq_errno();
        zmq_msg_close(&m);
        return river_err_set(RIVER_EIO, "send: %s", zmq_strerror(e));
    }
    return 0;
}

/* ---- Client ---- */

typedef struct client_req {
    char id[RIVER_CLIENT_ID_MAX];
    river_event_cb cb;
    void *user;
    int64_t last_ms;     /* last word from riverd about it (or the submit) */
    uint32_t timeout_ms;
    bool replied;        /* riverd said something about it */
    int lost;            /* 1 + the client__events entry that lost it; 0: not lost */
} client_req_t;

struct river_client {
    void *zctx, *sock;
    void *mon;           /* PAIR receiving sock's connection events */
    const char *refused; /* why riverd refused the handshake; NULL: it did not */
    client_req_t *reqs;  /* in flight, oldest first */
    int n, cap;
    uint64_t counter;
};

static void client__read_monitor(river_client_t *c);

/* ---- Connection events (both the client and the admin client) ---- */

/* Has sock report `events` to *mon, a PAIR socket on the inproc `endpoint` (one per
 * context, and each client has its own context). */
static int client__monitor_open(void *zctx, void *sock, const char *endpoint, int events,
                                void **mon)
{
    int zero = 0;
    if (zmq_socket_monitor(sock, endpoint, events) != 0)
        return river_err_set(RIVER_ESYS, "zmq_socket_monitor: %s", zmq_strerror(zmq_errno()));
    *mon = zmq_socket(zctx, ZMQ_PAIR);
    if (!*mon || zmq_setsockopt(*mon, ZMQ_LINGER, &zero, sizeof zero) != 0 ||
        zmq_connect(*mon, endpoint) != 0) {
        int e = zmq_errno();
        if (*mon)
            zmq_close(*mon);
        *mon = NULL;
        zmq_socket_monitor(sock, NULL, 0);
        return river_err_set(RIVER_ESYS, "connection monitor: %s", zmq_strerror(e));
    }
    return 0;
}

static void client__monitor_close(void *sock, void **mon)
{
    if (!*mon)
        return;
    zmq_socket_monitor(sock, NULL, 0);
    zmq_close(*mon);
    *mon = NULL;
}

/* The next event the monitor reported: 1 with *event set, 0 when none is waiting. */
static int client__monitor_next(void *mon, uint16_t *event)
{
    zmq_msg_t f;
    zmq_msg_init(&f);
    if (zmq_msg_recv(&f, mon, ZMQ_DONTWAIT) < 0) {
        zmq_msg_close(&f);
        return 0;
    }
    /* The first frame starts with the event number; the second is the address. */
    *event = 0;
    if (zmq_msg_size(&f) >= sizeof *event)
        memcpy(event, zmq_msg_data(&f), sizeof *event);
    bool more = zmq_msg_more(&f);
    zmq_msg_close(&f);
    while (more) {
        zmq_msg_init(&f);
        more = zmq_msg_recv(&f, mon, ZMQ_DONTWAIT) >= 0 && zmq_msg_more(&f);
        zmq_msg_close(&f);
    }
    return 1;
}

/* riverd keeps no request across a restart, and a connection that ends takes the requests
 * riverd had from it along: a lost connection is how a client learns that its requests in
 * flight are gone (riverd crashed or restarted, or dropped the connection). The socket
 * reports its disconnections to c->mon; river_client_poll ends those requests. */
static int client__monitor(river_client_t *c)
{
    return client__monitor_open(c->zctx, c->sock, CLIENT_MONITOR_ENDPOINT,
                                ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH |
                                    ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                                    ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL,
                                &c->mon);
}

int river_client_new(river_client_t **out, const char *endpoint)
{
    return river_client_new_secure(out, endpoint, NULL);
}

int river_client_new_secure(river_client_t **out, const char *endpoint,
                            const river_keys_t *keys)
{
    *out = NULL;
    if (!endpoint || !endpoint[0])
        return river_err_set(RIVER_EINVAL, "no riverd endpoint");
    river_client_t *c = calloc(1, sizeof *c);
    if (!c)
        return river_err_set(RIVER_ENOMEM, "client");
    int rc = client__socket(endpoint, keys, &c->zctx, &c->sock);
    if (rc < 0) {
        free(c);
        return rc;
    }
    if ((rc = client__monitor(c)) < 0) {
        river_client_destroy(&c);
        return rc;
    }
    *out = c;
    return 0;
}

void river_client_destroy(river_client_t **pc)
{
    river_client_t *c = pc ? *pc : NULL;
    if (!c)
        return;
    /* Requests still in flight are abandoned: riverd sees the client gone when it
     * cannot deliver to it and cancels them. */
    client__monitor_close(c->sock, &c->mon);
    zmq_close(c->sock);
    zmq_ctx_term(c->zctx);
    free(c->reqs);
    free(c);
    *pc = NULL;
}

static int client__find(const river_client_t *c, const char *id)
{
    for (int i = 0; i < c->n; i++)
        if (!strcmp(c->reqs[i].id, id))
            return i;
    return -1;
}

static void client__remove(river_client_t *c, int i)
{
    memmove(&c->reqs[i], &c->reqs[i + 1], (size_t)(c->n - i - 1) * sizeof *c->reqs);
    c->n--;
}

int river_client_submit(river_client_t *c, const river_generate_opts_t *o,
                        const char *request_id, river_event_cb cb, void *user,
                        char id_out[RIVER_CLIENT_ID_MAX])
{
    char id[RIVER_CLIENT_ID_MAX];
    if (request_id) {
        if (!request_id[0] || strlen(request_id) >= sizeof id)
            return river_err_set(RIVER_EINVAL, "request id must have 1 to %d bytes",
                                 RIVER_CLIENT_ID_MAX - 1);
        snprintf(id, sizeof id, "%s", request_id);
    } else {
        snprintf(id, sizeof id, "r%d-%llu", (int)getpid(), (unsigned long long)++c->counter);
    }
    if (client__find(c, id) >= 0)
        return river_err_set(RIVER_EINVAL, "request %s is already in flight", id);
    if (!o->prompt && !o->n_prompt_ids)
        return river_err_set(RIVER_EINVAL, "no prompt");

    River__Client__Generate g;
    river__client__generate__init(&g);
    g.request_id = id;
    g.session_id = (char *)(o->session_id ? o->session_id : "");
    River__Client__TokenIds toks;
    river__client__token_ids__init(&toks);
    River__Client__TextSpans spans;
    river__client__text_spans__init(&spans);
    if (o->prompt) {
        g.prompt_case = RIVER__CLIENT__GENERATE__PROMPT_TEXT;
        g.text = (char *)o->prompt;
        g.text_has_special = o->text_has_special ? 1 : 0;
        if (o->special_spans_given) {
            if (o->n_special_spans > SIZE_MAX / 2 || (o->n_special_spans && !o->special_spans))
                return river_err_set(RIVER_EINVAL, "special_spans: %zu spans without offsets",
                                     o->n_special_spans);
            spans.n_bounds = 2 * o->n_special_spans;
            spans.bounds = (uint32_t *)o->special_spans;
            g.special_spans = &spans;
        }
    } else {
        toks.n_ids = o->n_prompt_ids;
        toks.ids = (int32_t *)o->prompt_ids;
        g.prompt_case = RIVER__CLIENT__GENERATE__PROMPT_TOKENS;
        g.tokens = &toks;
    }
    River__Client__Sampling s;
    river__client__sampling__init(&s);
    s.temperature = o->temperature;
    s.top_k = o->top_k;
    s.top_p = o->top_p;
    if (o->has_seed) {
        s.opt_seed_case = RIVER__CLIENT__SAMPLING__OPT_SEED_SEED;
        s.seed = o->seed;
    }
    g.sampling = &s;
    g.max_tokens = o->max_tokens;
    g.n_stop = o->n_stop;
    g.stop = (char **)o->stop;
    River__Client__ExitOverride x;
    river__client__exit_override__init(&x);
    if (o->exit_policy || o->has_tau || o->has_theta || o->has_exit_layer || o->lossless ||
        o->draft_tokens) {
        x.policy = (char *)(o->exit_policy ? o->exit_policy : "");
        if (o->lossless) {
            x.opt_lossless_case = RIVER__CLIENT__EXIT_OVERRIDE__OPT_LOSSLESS_LOSSLESS;
            x.lossless = o->lossless > 0;
        }
        x.draft_tokens = o->draft_tokens;
        if (o->has_tau) {
            x.opt_tau_case = RIVER__CLIENT__EXIT_OVERRIDE__OPT_TAU_TAU;
            x.tau = o->tau;
        }
        if (o->has_theta) {
            x.opt_theta_case = RIVER__CLIENT__EXIT_OVERRIDE__OPT_THETA_THETA;
            x.theta = o->theta;
        }
        if (o->has_exit_layer) {
            x.opt_exit_layer_case = RIVER__CLIENT__EXIT_OVERRIDE__OPT_EXIT_LAYER_EXIT_LAYER;
            x.exit_layer = o->exit_layer;
        }
        g.exit = &x;
    }
    g.deadline_ms = o->deadline_ms;
    g.ignore_eos = o->ignore_eos != 0;
    g.logprobs = o->logprobs != 0;
    g.top_logprobs = o->top_logprobs;
    if (o->grammar)
        g.grammar = (char *)o->grammar;
    if (o->tenant)
        g.tenant = (char *)o->tenant;
    if (o->cache_salt)
        g.cache_salt = (char *)o->cache_salt;
    River__Client__ClientRequest env;
    river__client__client_request__init(&env);
    env.kind_case = RIVER__CLIENT__CLIENT_REQUEST__KIND_GENERATE;
    env.generate = &g;

    /* A disconnection reported before this request was sent is not its own: it is taken
     * now, for the requests already in flight. */
    client__read_monitor(c);
    if (c->refused)
        return river_err_set(RIVER_EAUTH, "%s", c->refused);
    if (c->n == c->cap) {
        int cap = c->cap ? 2 * c->cap : 8;
        client_req_t *r = realloc(c->reqs, (size_t)cap * sizeof *r);
        if (!r)
            return river_err_set(RIVER_ENOMEM, "request table");
        c->reqs = r;
        c->cap = cap;
    }
    int rc = client__send(c->sock, &env.base);
    if (rc < 0)
        return rc;
    client_req_t *r = &c->reqs[c->n++];
    memset(r, 0, sizeof *r);
    memcpy(r->id, id, sizeof id);
    r->cb = cb;
    r->user = user;
    r->last_ms = clock_now_ms();
    r->timeout_ms = o->timeout_ms;
    if (id_out)
        memcpy(id_out, id, sizeof id);
    return 0;
}

int river_client_cancel(river_client_t *c, const char *request_id)
{
    River__Client__Cancel k;
    river__client__cancel__init(&k);
    k.request_id = (char *)request_id;
    River__Client__ClientRequest env;
    river__client__client_request__init(&env);
    env.kind_case = RIVER__CLIENT__CLIENT_REQUEST__KIND_CANCEL;
    env.cancel = &k;
    return client__send(c->sock, &env.base);
}

int river_client_in_flight(const river_client_t *c)
{
    return c->n;
}

/* Ends request i with ev: it leaves the table first, so the callback may submit. */
static void client__end(river_client_t *c, int i, river_event_t *ev)
{
    client_req_t r = c->reqs[i];
    client__remove(c, i);
    river_event_t e = *ev;
    e.request_id = r.id;
    if (r.cb)
        r.cb(r.user, &e);
}

/* A chunk's log-probabilities in the library's types (malloc'd, NULL when the chunk has
 * none, or not one per id, or no memory): they point into the chunk. */
static river_token_logprob_t *client__logprobs(const River__Client__TokenChunk *ch)
{
    if (!ch->n_logprobs || ch->n_logprobs != ch->n_ids)
        return NULL;
    river_token_logprob_t *out = calloc(ch->n_logprobs, sizeof *out);
    for (size_t i = 0; out && i < ch->n_logprobs; i++) {
        const River__Client__TokenLogprob *lp = ch->logprobs[i];
        river_token_logprob_t *o = &out[i];
        o->id = ch->ids[i];
        o->logprob = lp->logprob;
        o->token = (const char *)lp->token.data;
        o->token_len = lp->token.len;
        size_t n = lp->n_top_ids;
        if (n != lp->n_top_logprobs || n != lp->n_top_tokens)
            n = 0; /* a malformed list is left out, not half read */
        o->n_top = n < RIVER_TOP_LOGPROBS_MAX ? n : RIVER_TOP_LOGPROBS_MAX;
        for (size_t j = 0; j < o->n_top; j++)
            o->top[j] = (river_top_logprob_t){.id = lp->top_ids[j],
                                              .logprob = lp->top_logprobs[j],
                                              .token = (const char *)lp->top_tokens[j].data,
                                              .token_len = lp->top_tokens[j].len};
    }
    return out;
}

static void client__on_reply(river_client_t *c, const River__Client__ClientReply *m)
{
    river_event_t ev;
    memset(&ev, 0, sizeof ev);
    const char *id = "";
    switch (m->kind_case) {
    case RIVER__CLIENT__CLIENT_REPLY__KIND_CHUNK: id = m->chunk->request_id; break;
    case RIVER__CLIENT__CLIENT_REPLY__KIND_FINAL: id = m->final->request_id; break;
    case RIVER__CLIENT__CLIENT_REPLY__KIND_ERROR: id = m->error->request_id; break;
    default: return;
    }
    int i = client__find(c, id);
    /* An error without an id answers a frame riverd could not read (an oversize
     * prompt, say); frames are answered in order, so it belongs to the oldest request
     * that has heard nothing yet. */
    if (i < 0 && !id[0] && m->kind_case == RIVER__CLIENT__CLIENT_REPLY__KIND_ERROR)
        for (int j = 0; j < c->n && i < 0; j++)
            if (!c->reqs[j].replied)
                i = j;
    if (i < 0)
        return;
    client_req_t *r = &c->reqs[i];
    r->replied = true;
    r->last_ms = clock_now_ms();
    switch (m->kind_case) {
    case RIVER__CLIENT__CLIENT_REPLY__KIND_CHUNK:
        ev.kind = RIVER_EVENT_CHUNK;
        ev.request_id = r->id;
        ev.seq = m->chunk->seq;
        ev.text = m->chunk->text;
        ev.text_len = strlen(m->chunk->text);
        ev.ids = m->chunk->ids;
        ev.n_ids = m->chunk->n_ids;
        ev.exit_layers = m->chunk->exit_layers;
        ev.n_exit_layers = m->chunk->n_exit_layers;
        river_token_logprob_t *lps = client__logprobs(m->chunk);
        ev.logprobs = lps;
        ev.n_logprobs = lps ? m->chunk->n_logprobs : 0;
        if (r->cb)
            r->cb(r->user, &ev);
        free(lps);
        break;
    case RIVER__CLIENT__CLIENT_REPLY__KIND_FINAL:
        ev.kind = RIVER_EVENT_FINAL;
        ev.finish = (unsigned)m->final->reason <= RIVER_FINISH_CANCELLED
                        ? (river_finish_t)m->final->reason
                        : RIVER_FINISH_UNSPECIFIED;
        if (m->final->usage) {
            ev.prompt_tokens = m->final->usage->prompt_tokens;
            ev.completion_tokens = m->final->usage->completion_tokens;
            ev.cached_tokens = m->final->usage->cached_tokens;
        }
        if (m->final->exit_stats) {
            ev.mean_exit_layer = m->final->exit_stats->mean_exit_layer;
            ev.drafted_tokens = m->final->exit_stats->drafted_tokens;
            ev.accepted_tokens = m->final->exit_stats->accepted_tokens;
        }
        client__end(c, i, &ev);
        break;
    default:
        ev.kind = RIVER_EVENT_ERROR;
        ev.code = client__code(m->error->code);
        ev.message = m->error->message;
        client__end(c, i, &ev);
        break;
    }
}

/* Requests riverd has been silent about for their timeout end here. */
static void client__expire(river_client_t *c, int64_t now)
{
    for (int i = 0; i < c->n;) {
        client_req_t *r = &c->reqs[i];
        if (!r->timeout_ms || now - r->last_ms < r->timeout_ms) {
            i++;
            continue;
        }
        char msg[128];
        snprintf(msg, sizeof msg, "no reply from riverd for %u ms", r->timeout_ms);
        river_client_cancel(c, r->id);
        river_event_t ev;
        memset(&ev, 0, sizeof ev);
        ev.kind = RIVER_EVENT_ERROR;
        ev.code = RIVER_CODE_DEADLINE_EXCEEDED;
        ev.message = msg;
        client__end(c, i, &ev);
    }
}

/* What a connection event means for the requests in flight then: a table, so that another
 * event can be given its own code and message. */
static const struct {
    uint16_t event;
    river_code_t code;
    const char *message;
} client__events[] = {
    {ZMQ_EVENT_DISCONNECTED, RIVER_CODE_UNAVAILABLE,
     "the connection to riverd was lost (riverd stopped or restarted, or dropped the "
     "connection), and the request with it"},
    /* riverd refused the handshake: the request never reached it, and no reply will come. */
    {ZMQ_EVENT_HANDSHAKE_FAILED_AUTH, RIVER_CODE_UNAUTHENTICATED,
     "riverd refused this client's key: it is not in riverd's auth.clients"},
    {ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL, RIVER_CODE_UNAUTHENTICATED,
     "riverd refused the connection: riverd's auth.mode and this client's keys do not "
     "match (curve needs a secret key and riverd's public key, plain neither)"},
    /* riverd closed the connection during the handshake, which it does to a peer without
     * keys (when that peer does not hear why) or one that was given a wrong server key. */
    {ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL, RIVER_CODE_UNAUTHENTICATED,
     "the handshake with riverd failed: this client has no keys for a riverd that asks for "
     "them, or a wrong key for riverd (the server key is riverd.key)"},
};

/* Reads the events the monitor reported: one in the table marks every request in flight
 * as lost (river_client_poll ends them). */
static void client__read_monitor(river_client_t *c)
{
    uint16_t event;
    while (c->mon && client__monitor_next(c->mon, &event)) {
        for (size_t k = 0; k < sizeof client__events / sizeof client__events[0]; k++) {
            if (client__events[k].event != event)
                continue;
            /* ZMQ does not reconnect after riverd refused a handshake (a protocol error):
             * the refusal stands for every later request of this client. */
            if (event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH ||
                event == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL)
                c->refused = client__events[k].message;
            for (int i = 0; i < c->n; i++)
                if (!c->reqs[i].lost)
                    c->reqs[i].lost = (int)k + 1;
        }
    }
}

/* Sends Cancel without waiting: after a lost connection the frame may wait in the socket
 * for a riverd to connect; if a restarted riverd got the request after all, the Cancel
 * follows it there. */
static void client__cancel_nowait(river_client_t *c, const char *id)
{
    River__Client__Cancel k;
    river__client__cancel__init(&k);
    k.request_id = (char *)id;
    River__Client__ClientRequest env;
    river__client__client_request__init(&env);
    env.kind_case = RIVER__CLIENT__CLIENT_REQUEST__KIND_CANCEL;
    env.cancel = &k;
    zmq_msg_t m;
    if (frame_encode_msg(&env.base, &m) < 0 || zmq_msg_send(&m, c->sock, ZMQ_DONTWAIT) < 0)
        zmq_msg_close(&m);
}

/* Ends the requests a lost connection took along, with the event's code. */
static void client__end_lost(river_client_t *c)
{
    for (int i = 0; i < c->n;) {
        client_req_t *r = &c->reqs[i];
        if (!r->lost) {
            i++;
            continue;
        }
        client__cancel_nowait(c, r->id);
        river_event_t ev;
        memset(&ev, 0, sizeof ev);
        ev.kind = RIVER_EVENT_ERROR;
        ev.code = client__events[r->lost - 1].code;
        ev.message = client__events[r->lost - 1].message;
        client__end(c, i, &ev);
    }
}

static int64_t client__next_expiry(const river_client_t *c)
{
    int64_t next = -1;
    for (int i = 0; i < c->n; i++)
        if (c->reqs[i].timeout_ms) {
            int64_t t = c->reqs[i].last_ms + c->reqs[i].timeout_ms;
            if (next < 0 || t < next)
                next = t;
        }
    return next;
}

int river_client_poll(river_client_t *c, int timeout_ms)
{
    int64_t now = clock_now_ms();
    int64_t exp = client__next_expiry(c);
    long wait = timeout_ms;
    if (exp >= 0 && (wait < 0 || exp - now < wait))
        wait = exp > now ? (long)(exp - now) : 0;
    zmq_pollitem_t it[2] = {{.socket = c->sock, .events = ZMQ_POLLIN},
                            {.socket = c->mon, .events = ZMQ_POLLIN}};
    if (zmq_poll(it, c->mon ? 2 : 1, wait) < 0 && zmq_errno() != EINTR)
        return river_err_set(RIVER_ESYS, "zmq_poll: %s", zmq_strerror(zmq_errno()));
    /* Events first: what arrived before the connection was lost is read below anyway,
     * and a request that got its end there is no longer in flight to be lost. */
    client__read_monitor(c);
    for (;;) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, c->sock, ZMQ_DONTWAIT) < 0) {
            int e = zmq_errno();
            zmq_msg_close(&m);
            if (e == EAGAIN || e == EINTR)
                break;
            return river_err_set(RIVER_ESYS, "recv: %s", zmq_strerror(e));
        }
        ProtobufCMessage *msg = NULL;
        /* riverd's replies are bounded by its own limit; a reply the library cannot read
         * is dropped, and the request's timeout ends it if nothing else does. */
        int rc = frame_decode_msg(FRAME_CLIENT_REPLY, &m, 0, &msg);
        zmq_msg_close(&m);
        if (rc < 0)
            continue;
        client__on_reply(c, (River__Client__ClientReply *)msg);
        frame_free(&msg);
    }
    client__end_lost(c);
    client__expire(c, clock_now_ms());
    return c->n;
}

/* ---- Blocking generate ---- */

typedef struct client_wait {
    river_event_cb cb;
    void *user;
    river_result_t *res;
    bool done;
} client_wait_t;

static void client__collect(void *user, const river_event_t *ev)
{
    client_wait_t *w = user;
    river_result_t *res = w->res;
    switch (ev->kind) {
    case RIVER_EVENT_CHUNK:
        res->chunks++;
        break;
    case RIVER_EVENT_FINAL:
        res->ok = 1;
        res->finish = ev->finish;
        res->prompt_tokens = ev->prompt_tokens;
        res->completion_tokens = ev->completion_tokens;
        res->cached_tokens = ev->cached_tokens;
        res->mean_exit_layer = ev->mean_exit_layer;
        res->drafted_tokens = ev->drafted_tokens;
        res->accepted_tokens = ev->accepted_tokens;
        w->done = true;
        break;
    case RIVER_EVENT_ERROR:
        res->ok = 0;
        res->code = ev->code;
        snprintf(res->message, sizeof res->message, "%s", ev->message ? ev->message : "");
        w->done = true;
        break;
    }
    if (w->cb)
        w->cb(w->user, ev);
}

int river_client_generate(river_client_t *c, const river_generate_opts_t *o, river_event_cb cb,
                          void *user, river_result_t *res)
{
    memset(res, 0, sizeof *res);
    client_wait_t w = {.cb = cb, .user = user, .res = res};
    int rc = river_client_submit(c, o, NULL, client__collect, &w, NULL);
    if (rc < 0)
        return rc;
    while (!w.done) {
        rc = river_client_poll(c, -1);
        if (rc < 0)
            return rc;
    }
    if (!res->ok)
        return river_err_set(RIVER_EPROTO, "%s: %s", river_code_name(res->code), res->message);
    return 0;
}

/* ---- Admin ---- */

struct river_admin {
    void *zctx, *sock;
    void *mon;           /* PAIR receiving sock's handshake failures */
    char refused[512];   /* why riverd refused the handshake ("": it did not); for good,
                            since ZMQ does not reconnect after a refusal */
    int timeout_ms;
    uint64_t next_id;
};

/* A handshake riverd refused means every call would time out: the admin client watches
 * for one and fails the call at once instead, saying why. */
static int admin__monitor(river_admin_t *a)
{
    return client__monitor_open(a->zctx, a->sock, ADMIN_MONITOR_ENDPOINT,
                                ZMQ_EVENT_HANDSHAKE_FAILED_AUTH |
                                    ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                                    ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL,
                                &a->mon);
}

/* RIVER_EAUTH when the monitor reported a refused handshake, 0 otherwise. */
static int admin__refused(river_admin_t *a)
{
    int rc = 0;
    uint16_t event;
    while (client__monitor_next(a->mon, &event)) {
        if (event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH)
            rc = river_err_set(RIVER_EAUTH, "riverd refused this key: it is not in riverd's "
                               "auth.admin (or any other auth directory)");
        else if ((event == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL ||
                  event == ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL) && !rc)
            rc = river_err_set(RIVER_EAUTH, "the handshake with riverd failed: riverd's "
                               "auth.mode and this client's keys do not match (curve needs "
                               "--key and --server-key, riverd.key being the server key; "
                               "plain neither)");
        if (event != ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL && rc)
            snprintf(a->refused, sizeof a->refused, "%s", river_err_detail());
    }
    return rc;
}

int river_admin_new(river_admin_t **out, const char *endpoint, int timeout_ms)
{
    return river_admin_new_secure(out, endpoint, timeout_ms, NULL);
}

int river_admin_new_secure(river_admin_t **out, const char *endpoint, int timeout_ms,
                           const river_keys_t *keys)
{
    *out = NULL;
    if (!endpoint || !endpoint[0])
        return river_err_set(RIVER_EINVAL, "no admin endpoint");
    river_admin_t *a = calloc(1, sizeof *a);
    if (!a)
        return river_err_set(RIVER_ENOMEM, "admin client");
    int rc = client__socket(endpoint, keys, &a->zctx, &a->sock);
    if (rc < 0) {
        free(a);
        return rc;
    }
    if ((rc = admin__monitor(a)) < 0) {
        river_admin_destroy(&a);
        return rc;
    }
    a->timeout_ms = timeout_ms > 0 ? timeout_ms : ADMIN_TIMEOUT_DEFAULT_MS;
    *out = a;
    return 0;
}

void river_admin_destroy(river_admin_t **pa)
{
    river_admin_t *a = pa ? *pa : NULL;
    if (!a)
        return;
    /* Every admin call waits for its reply, so a request still queued here is one whose
     * caller was already told it failed (a timeout, a refused handshake): it is dropped,
     * not delivered to a riverd that comes up later. Nothing left to send also means
     * nothing for the context's end to wait on after a handshake riverd refused. */
    int zero = 0;
    zmq_setsockopt(a->sock, ZMQ_LINGER, &zero, sizeof zero);
    client__monitor_close(a->sock, &a->mon);
    zmq_close(a->sock);
    zmq_ctx_term(a->zctx);
    free(a);
    *pa = NULL;
}

/* The River error for an error riverd sent. */
static int admin__error(const River__Client__Error *e)
{
    static const int errs[] = {
        [RIVER_CODE_OK] = RIVER_EPROTO,
        [RIVER_CODE_INVALID_ARGUMENT] = RIVER_EINVAL,
        [RIVER_CODE_RESOURCE_EXHAUSTED] = RIVER_EFULL,
        [RIVER_CODE_DEADLINE_EXCEEDED] = RIVER_ETIMEOUT,
        [RIVER_CODE_CANCELLED] = RIVER_ECANCELED,
        [RIVER_CODE_UNAVAILABLE] = RIVER_ESTATE,
        [RIVER_CODE_INTERNAL] = RIVER_EIO,
        [RIVER_CODE_UNAUTHENTICATED] = RIVER_EAUTH,
    };
    river_code_t c = client__code(e->code);
    return river_err_set(errs[c], "riverd: %s: %s", river_code_name(c), e->message);
}

/* Sends req and waits for the reply with its id, which must be of kind `want`. */
static int admin__call(river_admin_t *a, River__Admin__AdminRequest *req,
                       River__Admin__AdminReply__KindCase want, River__Admin__AdminReply **out)
{
    *out = NULL;
    if (a->refused[0])
        return river_err_set(RIVER_EAUTH, "%s", a->refused);
    req->id = ++a->next_id;
    int rc = client__send(a->sock, &req->base);
    if (rc < 0)
        return rc;
    int64_t until = clock_now_ms() + a->timeout_ms;
    for (;;) {
        int64_t left = until - clock_now_ms();
        if (left <= 0)
            return river_err_set(RIVER_ETIMEOUT, "riverd did not answer within %d ms",
                                 a->timeout_ms);
        zmq_pollitem_t items[2] = {{.socket = a->sock, .events = ZMQ_POLLIN},
                                   {.socket = a->mon, .events = ZMQ_POLLIN}};
        if (zmq_poll(items, 2, (long)left) < 0) {
            if (zmq_errno() == EINTR)
                continue;
            return river_err_set(RIVER_ESYS, "zmq_poll: %s", zmq_strerror(zmq_errno()));
        }
        if ((items[1].revents & ZMQ_POLLIN) && (rc = admin__refused(a)) < 0)
            return rc;
        if (!(items[0].revents & ZMQ_POLLIN))
            continue;
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, a->sock, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&m);
            continue;
        }
        ProtobufCMessage *msg = NULL;
        rc = frame_decode_msg(FRAME_ADMIN_REPLY, &m, 64u << 20, &msg);
        zmq_msg_close(&m);
        if (rc < 0)
            return rc;
        River__Admin__AdminReply *r = (River__Admin__AdminReply *)msg;
        /* A late answer to a call that timed out is not this one's. */
        if (r->id != req->id && !(r->id == 0 && r->kind_case ==
                                                    RIVER__ADMIN__ADMIN_REPLY__KIND_ERROR)) {
            frame_free(&msg);
            continue;
        }
        if (r->kind_case == RIVER__ADMIN__ADMIN_REPLY__KIND_ERROR) {
            rc = admin__error(r->error);
            frame_free(&msg);
            return rc;
        }
        if (r->kind_case != want) {
            frame_free(&msg);
            return river_err_set(RIVER_EPROTO, "riverd answered with the wrong kind");
        }
        *out = r;
        return 0;
    }
}

static void admin__free(River__Admin__AdminReply **r)
{
    ProtobufCMessage *m = *r ? &(*r)->base : NULL;
    frame_free(&m);
    *r = NULL;
}

int river_admin_status(river_admin_t *a, river_status_t *st)
{
    River__Admin__StatusRequest s;
    river__admin__status_request__init(&s);
    River__Admin__AdminRequest req;
    river__admin__admin_request__init(&req);
    req.kind_case = RIVER__ADMIN__ADMIN_REQUEST__KIND_STATUS;
    req.status = &s;
    River__Admin__AdminReply *r;
    int rc = admin__call(a, &req, RIVER__ADMIN__ADMIN_REPLY__KIND_STATUS, &r);
    if (rc < 0)
        return rc;
    const River__Admin__StatusReply *x = r->status;
    memset(st, 0, sizeof *st);
    snprintf(st->version, sizeof st->version, "%s", x->version);
    st->uptime_s = x->uptime_s;
    st->workers_ready = x->workers_ready;
    st->workers_total = x->workers_total;
    st->queue_length = x->queue_length;
    st->queue_capacity = x->queue_capacity;
    st->running = x->running;
    st->requests_total = x->requests_total;
    st->requests_failed = x->requests_failed;
    st->draining = x->draining;
    admin__free(&r);
    return 0;
}

static const char *const admin__states[] = {"unknown", "starting", "ready", "draining",
                                            "dead",    "unavailable"};
static const char *const admin__roles[] = {"unspecified", "full", "river", "backbone"};

int river_admin_workers(river_admin_t *a, river_worker_info_t **workers, size_t *n)
{
    *workers = NULL;
    *n = 0;
    River__Admin__WorkersRequest w;
    river__admin__workers_request__init(&w);
    River__Admin__AdminRequest req;
    river__admin__admin_request__init(&req);
    req.kind_case = RIVER__ADMIN__ADMIN_REQUEST__KIND_WORKERS;
    req.workers = &w;
    River__Admin__AdminReply *r;
    int rc = admin__call(a, &req, RIVER__ADMIN__ADMIN_REPLY__KIND_WORKERS, &r);
    if (rc < 0)
        return rc;
    size_t k = r->workers->n_workers;
    river_worker_info_t *v = calloc(k ? k : 1, sizeof *v);
    if (!v) {
        admin__free(&r);
        return river_err_set(RIVER_ENOMEM, "workers");
    }
    for (size_t i = 0; i < k; i++) {
        const River__Admin__WorkerInfo *x = r->workers->workers[i];
        river_worker_info_t *o = &v[i];
        snprintf(o->id, sizeof o->id, "%s", x->worker_id);
        snprintf(o->address, sizeof o->address, "%s", x->address);
        o->state = (unsigned)x->state < sizeof admin__states / sizeof admin__states[0]
                       ? admin__states[x->state]
                       : "unknown";
        o->role = (unsigned)x->role < 4 ? admin__roles[x->role] : "unspecified";
        if (x->capabilities) {
            const River__Worker__Capabilities *cp = x->capabilities;
            snprintf(o->model, sizeof o->model, "%s", cp->model);
            o->max_seqs = cp->max_seqs;
            o->max_batch = cp->max_batch;
            o->n_layers = cp->n_layers;
            o->max_context = cp->max_context;
            o->kv_page_size = cp->kv_page_size;
            o->kv_pages_total = cp->kv_pages_total;
            o->has_river = cp->has_river;
        }
        o->queue_length = x->queue_length;
        o->running = x->running;
        o->kv_pages_free = x->kv_pages_free;
        o->missed_beats = x->missed_beats;
        o->last_seen_ms = x->last_seen_ms;
        o->supervised = x->supervised;
    }
    admin__free(&r);
    *workers = v;
    *n = k;
    return 0;
}

int river_admin_drain(river_admin_t *a, const char *worker_id, uint32_t deadline_ms,
                      uint32_t *draining)
{
    River__Admin__DrainRequest d;
    river__admin__drain_request__init(&d);
    d.worker_id = (char *)(worker_id ? worker_id : "");
    d.deadline_ms = deadline_ms;
    River__Admin__AdminRequest req;
    river__admin__admin_request__init(&req);
    req.kind_case = RIVER__ADMIN__ADMIN_REQUEST__KIND_DRAIN;
    req.drain = &d;
    River__Admin__AdminReply *r;
    int rc = admin__call(a, &req, RIVER__ADMIN__ADMIN_REPLY__KIND_DRAIN, &r);
    if (rc < 0)
        return rc;
    if (draining)
        *draining = r->drain->draining;
    admin__free(&r);
    return 0;
}

int river_admin_scale(river_admin_t *a, uint32_t workers, uint32_t *previous)
{
    River__Admin__ScaleRequest s;
    river__admin__scale_request__init(&s);
    s.workers = workers;
    River__Admin__AdminRequest req;
    river__admin__admin_request__init(&req);
    req.kind_case = RIVER__ADMIN__ADMIN_REQUEST__KIND_SCALE;
    req.scale = &s;
    River__Admin__AdminReply *r;
    int rc = admin__call(a, &req, RIVER__ADMIN__ADMIN_REPLY__KIND_SCALE, &r);
    if (rc < 0)
        return rc;
    if (previous)
        *previous = r->scale->previous;
    admin__free(&r);
    return 0;
}

static char *admin__join(char **v, size_t n)
{
    size_t len = 1;
    for (size_t i = 0; i < n; i++)
        len += strlen(v[i]) + 2;
    char *s = malloc(len);
    if (!s)
        return NULL;
    s[0] = '\0';
    for (size_t i = 0; i < n; i++) {
        if (i)
            strcat(s, ", ");
        strcat(s, v[i]);
    }
    return s;
}

int river_admin_reload(river_admin_t *a, char **applied, char **needs_restart)
{
    *applied = *needs_restart = NULL;
    River__Admin__ReloadRequest x;
    river__admin__reload_request__init(&x);
    River__Admin__AdminRequest req;
    river__admin__admin_request__init(&req);
    req.kind_case = RIVER__ADMIN__ADMIN_REQUEST__KIND_RELOAD;
    req.reload = &x;
    River__Admin__AdminReply *r;
    int rc = admin__call(a, &req, RIVER__ADMIN__ADMIN_REPLY__KIND_RELOAD, &r);
    if (rc < 0)
        return rc;
    *applied = admin__join(r->reload->applied, r->reload->n_applied);
    *needs_restart = admin__join(r->reload->needs_restart, r->reload->n_needs_restart);
    admin__free(&r);
    if (!*applied || !*needs_restart) {
        free(*applied);
        free(*needs_restart);
        *applied = *needs_restart = NULL;
        return river_err_set(RIVER_ENOMEM, "reload reply");
    }
    return 0;
}

int river_admin_metrics(river_admin_t *a, char **text)
{
    *text = NULL;
    River__Admin__MetricsRequest x;
    river__admin__metrics_request__init(&x);
    River__Admin__AdminRequest req;
    river__admin__admin_request__init(&req);
    req.kind_case = RIVER__ADMIN__ADMIN_REQUEST__KIND_METRICS;
    req.metrics = &x;
    River__Admin__AdminReply *r;
    int rc = admin__call(a, &req, RIVER__ADMIN__ADMIN_REPLY__KIND_METRICS, &r);
    if (rc < 0)
        return rc;
    *text = strdup(r->metrics->text);
    admin__free(&r);
    return *text ? 0 : river_err_set(RIVER_ENOMEM, "metrics text");
}
