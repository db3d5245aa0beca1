/* CurveZMQ for riverd's three endpoints: who may connect, and as what.
 *
 * Two checks, both against the public keys in the directories auth.clients, auth.workers
 * and auth.admin:
 *
 *   1. The handshake. CZMQ's ZAP handler, zauth, runs on the context of riverd's sockets and
 *      is given every allowed key (one in-memory certificate store). A peer whose key is in
 *      none of the directories, or that speaks no CURVE at all, never gets a connection.
 *   2. Every message. zauth cannot tell riverd's sockets apart (it has one store for the
 *      whole context), so the role is checked per message: libzmq stamps each message with
 *      the key ZAP authenticated, as its "User-Id" property, and the key must be in the
 *      directory of the socket it came in on. A client key on the worker or admin endpoint
 *      is refused there. The property can only come from ZAP while a handler runs, which it
 *      does from before the first bind to after the last socket closes; a message without
 *      it is refused too.
 *
 * Refusals are logged, at most once per AUTH_LOG_INTERVAL_MS for the same key or endpoint
 * (a refused peer retries every 100 ms) with the number left out: the endpoint from a ZMQ
 * socket monitor on each socket, the refused key and the peer's address from zauth's own
 * log lines (CZMQ sends them to an inproc PUB socket that riverd reads), the role mismatch
 * from the per-message check. Everything is read in the poll loop (loop.c). */
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <czmq.h>

#include "common/clock.h"
#include "common/err.h"
#include "common/keys.h"
#include "daemon/riverd.h"

/* How often the same refusal is logged again. */
#define AUTH_LOG_INTERVAL_MS 10000
/* Refusals remembered for that; past it the memory starts over. */
#define AUTH_SEEN_MAX 4096
/* Where CZMQ publishes its log lines (zauth's decisions among them). */
#define AUTH_LOG_ENDPOINT "inproc://riverd-zauth-log"
/* Monitored events: the handshake failures, which are the refusals. */
#define AUTH_MONITOR_EVENTS                                                               \
    (ZMQ_EVENT_HANDSHAKE_FAILED_AUTH | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |              \
     ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL)

typedef struct auth_monitor {
    void *pair;       /* receives the socket's events; NULL: none */
    const char *what; /* "clients", "workers", "admin" */
} auth_monitor_t;

typedef struct auth_seen {
    int64_t next_ms;     /* logged again from then on */
    uint64_t suppressed; /* refusals not logged since */
} auth_seen_t;

struct auth {
    bool plain;
    keys_pair_t server;       /* riverd's own keys */
    hmap_t *roles;            /* Z85 public key -> role mask (AUTH_ROLE_*, as a pointer) */
    int n_keys[3];            /* per role */
    zcertstore_t *store;      /* every allowed key, until auth_start gives it to zauth */
    zactor_t *zauth;
    void *log_sub;            /* zauth's log lines */
    auth_monitor_t mons[3];   /* by auth__index of the socket's role */
    hmap_t *seen;             /* what was logged lately -> auth_seen_t */
    uint64_t refused[3];      /* refusals by endpoint (auth__index), logged or not */
    char zap_address[128];    /* peer of the ZAP request zauth is deciding (its log) */
};

static const struct {
    int role;
    const char *key;  /* the configuration key of its directory */
    const char *name; /* a key of that role, in messages */
    const char *what; /* its endpoint, in messages */
} auth__roles[] = {
    {AUTH_ROLE_CLIENT, "auth.clients", "client", "clients"},
    {AUTH_ROLE_WORKER, "auth.workers", "worker", "workers"},
    {AUTH_ROLE_ADMIN, "auth.admin", "admin", "admin"},
};

static int auth__index(int role)
{
    return role == AUTH_ROLE_CLIENT ? 0 : role == AUTH_ROLE_WORKER ? 1 : 2;
}

/* ---- Loading the keys ---- */

/* Adds the public key of one certificate file to the role's set. */
static int auth__add_key(auth_t *a, int role, const char *path)
{
    char pub[KEYS_Z85_LEN + 1];
    int rc = keys_load_public(path, pub);
    if (rc < 0)
        return rc;
    uintptr_t mask = (uintptr_t)hmap_get(a->roles, pub, KEYS_Z85_LEN);
    if (mask & (uintptr_t)role)
        return 0; /* the same key twice in one directory */
    if ((rc = hmap_put(a->roles, pub, KEYS_Z85_LEN, (void *)(mask | (uintptr_t)role))) < 0)
        return rc;
    a->n_keys[auth__index(role)]++;
    return 0;
}

/* Reads the public certificates (NAME.key) of one directory. */
static int auth__load_dir(auth_t *a, const char *config_path, int i, const char *dir)
{
    const char *key = auth__roles[i].key;
    char path[4096];
    int rc = keys_resolve_path(config_path, dir, path, sizeof path);
    if (rc < 0)
        return keys_config_error(config_path, key);
    DIR *d = opendir(path);
    if (!d)
        return river_err_set(RIVER_ECONFIG, "%s: key '%s': %s: %s", config_path, key, path,
                             strerror(errno));
    struct dirent *e;
    errno = 0;
    while ((e = readdir(d))) {
        const char *name = e->d_name;
        size_t n = strlen(name);
        char file[8192];
        snprintf(file, sizeof file, "%s/%s", path, name);
        if (n > 11 && !strcmp(name + n - 11, ".key_secret")) {
            /* Not loaded: riverd needs only the public half, and a secret key found here
             * has been copied where it should not be. */
            log_warn("%s: %s is a secret key; only public keys (NAME.key) belong in %s, and "
                     "riverd ignores it", key, file, key);
            continue;
        }
        if (n < 5 || strcmp(name + n - 4, ".key") || name[0] == '.')
            continue;
        if ((rc = auth__add_key(a, auth__roles[i].role, file)) < 0) {
            closedir(d);
            return keys_config_error(config_path, key);
        }
        errno = 0;
    }
    int e_read = errno;
    closedir(d);
    if (e_read)
        return river_err_set(RIVER_ECONFIG, "%s: key '%s': %s: %s", config_path, key, path,
                             strerror(e_read));
    if (a->n_keys[i] == 0)
        log_warn("%s: no keys (NAME.key) in %s: no %s can connect", key, path,
                 auth__roles[i].name);
    return 0;
}

/* Puts one key into zauth's store (a visitor of the roles map). */
static bool auth__store_key(void *user, const void *key, size_t len, void *val)
{
    auth_t *a = user;
    char txt[KEYS_Z85_LEN + 1];
    byte pub[32], secret[32] = {0};
    memcpy(txt, key, KEYS_Z85_LEN);
    txt[KEYS_Z85_LEN] = '\0';
    /* A certificate of the public key alone, without the file's metadata: zauth copies a
     * certificate's metadata into a fixed buffer, and has no use for it here. */
    zcert_t *c = a->store && zmq_z85_decode(pub, txt) ? zcert_new_from(pub, secret) : NULL;
    if (c)
        zcertstore_insert(a->store, &c);
    else
        zcertstore_destroy(&a->store); /* auth_new reports it */
    (void)len, (void)val;
    return false;
}

int auth_new(auth_t **out, const char *config_path, const config_riverd_t *cfg)
{
    *out = NULL;
    auth_t *a = calloc(1, sizeof *a);
    if (!a)
        return river_err_set(RIVER_ENOMEM, "auth");
    int rc = 0;
    if (cfg->auth_mode == CONFIG_AUTH_PLAIN) {
        a->plain = true;
        *out = a;
        return 0;
    }
    if ((rc = hmap_new(&a->roles)) < 0 || (rc = hmap_new(&a->seen)) < 0)
        goto fail;
    char path[4096];
    if ((rc = keys_resolve_path(config_path, cfg->auth_secret_key, path, sizeof path)) < 0 ||
        (rc = keys_load_secret(path, &a->server)) < 0) {
        rc = keys_config_error(config_path, "auth.secret_key");
        goto fail;
    }
    const char *dirs[3] = {cfg->auth_clients, cfg->auth_workers, cfg->auth_admin};
    for (int i = 0; i < 3; i++) {
        /* Without an admin endpoint, its directory is not needed. */
        if (auth__roles[i].role == AUTH_ROLE_ADMIN && !cfg->admin[0])
            continue;
        if ((rc = auth__load_dir(a, config_path, i, dirs[i])) < 0)
            goto fail;
    }
    a->store = zcertstore_new(NULL);
    if (!a->store) {
        rc = river_err_set(RIVER_ENOMEM, "auth: certificate store");
        goto fail;
    }
    hmap_sweep(a->roles, auth__store_key, a);
    if (!a->store) {
        rc = river_err_set(RIVER_ENOMEM, "auth: certificate store");
        goto fail;
    }
    *out = a;
    return 0;
fail:
    auth_destroy(&a);
    return rc;
}

bool auth_plain(const auth_t *a)
{
    return a->plain;
}

void auth_describe(const auth_t *a, char *buf, size_t cap)
{
    if (a->plain)
        snprintf(buf, cap, "plain (no authentication, no encryption)");
    else
        snprintf(buf, cap, "curve, riverd's key %s; %d client, %d worker, %d admin keys",
                 a->server.public_txt, a->n_keys[0], a->n_keys[1], a->n_keys[2]);
}

/* ---- Logging refusals ---- */

static bool auth__drop_seen(void *user, const void *key, size_t len, void *val)
{
    (void)user, (void)key, (void)len;
    free(val);
    return true;
}

/* Whether a refusal known as `what` is to be logged now; *suppressed receives how many were
 * not logged since the last time. */
static bool auth__should_log(auth_t *a, const char *what, uint64_t *suppressed)
{
    int64_t now = clock_now_ms();
    size_t len = strlen(what);
    auth_seen_t *s = hmap_get(a->seen, what, len);
    if (!s) {
        if (hmap_count(a->seen) >= AUTH_SEEN_MAX)
            hmap_sweep(a->seen, auth__drop_seen, NULL);
        s = calloc(1, sizeof *s);
        if (!s || hmap_put(a->seen, what, len, s) < 0) {
            free(s);
            *suppressed = 0;
            return true; /* log it anyway: a refusal is worth more than the memory */
        }
    }
    if (now < s->next_ms) {
        s->suppressed++;
        return false;
    }
    *suppressed = s->suppressed;
    s->suppressed = 0;
    s->next_ms = now + AUTH_LOG_INTERVAL_MS;
    return true;
}

static const char *auth__more(uint64_t suppressed, char *buf, size_t cap)
{
    if (!suppressed)
        return "";
    snprintf(buf, cap, " (and %llu more times in the last %d s)", (unsigned long long)suppressed,
             AUTH_LOG_INTERVAL_MS / 1000);
    return buf;
}

/* One of zauth's log lines. It decides one ZAP request at a time, logging the request
 * (with the peer's address) and then the decision (with its key), so the address of a
 * refusal is the one of the request before it. */
static void auth__on_zauth_line(auth_t *a, const char *line)
{
    const char *z = strstr(line, "zauth: ");
    if (!z)
        return;
    z += 7;
    const char *p;
    if ((p = strstr(z, "ipaddress="))) {
        snprintf(a->zap_address, sizeof a->zap_address, "%s", p + 10);
        return;
    }
    if (!(p = strstr(z, "client_key=")))
        return;
    const char *key = p + 11;
    if (!strncmp(z, "- allowed", 9)) {
        log_debug("auth: key %s from %s allowed", key, a->zap_address);
        return;
    }
    char what[160], more[96];
    uint64_t n;
    snprintf(what, sizeof what, "denied %s", key);
    if (auth__should_log(a, what, &n))
        log_warn("auth: refused CURVE key %s from %s: it is in none of auth.clients, "
                 "auth.workers and auth.admin%s", key, a->zap_address,
                 auth__more(n, more, sizeof more));
}

static void auth__read_log(auth_t *a)
{
    for (int i = 0; i < 256; i++) {
        char line[1100];
        int n = zmq_recv(a->log_sub, line, sizeof line - 1, ZMQ_DONTWAIT);
        if (n < 0) {
            if (zmq_errno() != EAGAIN && zmq_errno() != EINTR)
                log_error("auth: reading zauth's log: %s", zmq_strerror(zmq_errno()));
            return;
        }
        line[n < (int)sizeof line - 1 ? n : (int)sizeof line - 1] = '\0';
        auth__on_zauth_line(a, line);
    }
}

/* What a failed handshake means, for the log. */
static const char *auth__failure(uint16_t event, uint32_t value)
{
    if (event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH)
        return "its CURVE key is not allowed";
    if (event == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL) {
        if (value == ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH)
            return "it does not speak CURVE (a peer in plain mode, or without keys)";
        if (value == ZMQ_PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC)
            return "its CURVE handshake does not decrypt (it was not given riverd's public key)";
        return "its CURVE handshake is malformed";
    }
    return NULL;
}

static void auth__read_monitor(auth_t *a, int index)
{
    auth_monitor_t *m = &a->mons[index];
    for (int i = 0; i < 256; i++) {
        zmq_msg_t ev, ep;
        zmq_msg_init(&ev);
        if (zmq_msg_recv(&ev, m->pair, ZMQ_DONTWAIT) < 0) {
            int e = zmq_errno();
            zmq_msg_close(&ev);
            if (e != EAGAIN && e != EINTR)
                log_error("auth: reading the %s monitor: %s", m->what, zmq_strerror(e));
            return;
        }
        /* An event is two frames: 2 bytes of event and 4 of value, then the endpoint. */
        uint16_t event = 0;
        uint32_t value = 0;
        if (zmq_msg_size(&ev) >= 6) {
            memcpy(&event, zmq_msg_data(&ev), 2);
            memcpy(&value, (const char *)zmq_msg_data(&ev) + 2, 4);
        }
        char endpoint[256] = "";
        if (zmq_msg_more(&ev)) {
            zmq_msg_init(&ep);
            if (zmq_msg_recv(&ep, m->pair, 0) >= 0)
                snprintf(endpoint, sizeof endpoint, "%.*s", (int)zmq_msg_size(&ep),
                         (const char *)zmq_msg_data(&ep));
            zmq_msg_close(&ep);
        }
        zmq_msg_close(&ev);
        const char *why = auth__failure(event, value);
        if (why)
            a->refused[index]++;
        char what[320], more[96];
        uint64_t n;
        snprintf(what, sizeof what, "%s %u %u", endpoint, event, value);
        if (!auth__should_log(a, what, &n))
            continue;
        if (why)
            log_warn("%s endpoint %s: refused a connection: %s%s", m->what, endpoint, why,
                     auth__more(n, more, sizeof more));
        else
            /* No detail: the peer went away during the handshake. A peer without keys
             * does that as often as it is told why (whichever end notices first), but so
             * does one that only probes the port: worth a line, not a warning. */
            log_info("%s endpoint %s: a connection ended during its handshake (%s): a peer "
                     "without keys, or one that went away%s",
                     m->what, endpoint, zmq_strerror((int)value),
                     auth__more(n, more, sizeof more));
    }
}

/* ---- Serving ---- */

void *auth_open_context(void)
{
    /* CZMQ would catch SIGINT and SIGTERM itself; riverd reads them from a descriptor
     * (loop.c), so its handlers stay off. */
    zsys_handler_set(NULL);
    return zsys_init();
}

void auth_close_context(void)
{
    /* Terminates the context, waiting for the linger of the sockets closed before. */
    zsys_shutdown();
}

int auth_start(auth_t *a, void *zctx)
{
    if (a->plain)
        return 0;
    /* zauth writes its decisions with CZMQ's log only (and only when verbose); they go to
     * an inproc PUB socket instead of stdout, and riverd logs the refusals in its own
     * format. */
    zsys_set_logstream(NULL);
    zsys_set_logsender(AUTH_LOG_ENDPOINT);
    a->log_sub = zmq_socket(zctx, ZMQ_SUB);
    if (!a->log_sub || zmq_setsockopt(a->log_sub, ZMQ_SUBSCRIBE, "", 0) != 0 ||
        zmq_connect(a->log_sub, AUTH_LOG_ENDPOINT) != 0)
        return river_err_set(RIVER_ESYS, "auth: zauth's log: %s", zmq_strerror(zmq_errno()));
    /* zauth serves the ZAP requests of every socket of this context, CZMQ's. It owns the
     * store from here on. */
    a->zauth = zactor_new(zauth, a->store);
    if (!a->zauth)
        return river_err_set(RIVER_ESYS, "auth: cannot start zauth");
    a->store = NULL;
    if (zstr_send(a->zauth, "VERBOSE") != 0 || zsock_wait(a->zauth) != 0)
        return river_err_set(RIVER_ESYS, "auth: zauth does not answer");
    return 0;
}

int auth_secure_socket(auth_t *a, void *zctx, void *sock, int role, const char *what)
{
    if (a->plain)
        return 0;
    int one = 1;
    if (zmq_setsockopt(sock, ZMQ_CURVE_SERVER, &one, sizeof one) != 0 ||
        zmq_setsockopt(sock, ZMQ_CURVE_SECRETKEY, a->server.secret_txt, KEYS_Z85_LEN) != 0)
        return river_err_set(RIVER_ESYS, "%s socket: CURVE: %s", what,
                             zmq_strerror(zmq_errno()));
    auth_monitor_t *m = &a->mons[auth__index(role)];
    if (m->pair)
        return river_err_set(RIVER_ESTATE, "auth: a second %s socket", what);
    char endpoint[64];
    snprintf(endpoint, sizeof endpoint, "inproc://riverd-monitor-%s", auth__roles[auth__index(role)].what);
    m->what = auth__roles[auth__index(role)].what;
    if (zmq_socket_monitor(sock, endpoint, AUTH_MONITOR_EVENTS) != 0)
        return river_err_set(RIVER_ESYS, "%s socket: monitor: %s", what,
                             zmq_strerror(zmq_errno()));
    m->pair = zmq_socket(zctx, ZMQ_PAIR);
    if (!m->pair || zmq_connect(m->pair, endpoint) != 0) {
        int e = zmq_errno();
        if (m->pair)
            zmq_close(m->pair);
        m->pair = NULL;
        return river_err_set(RIVER_ESYS, "%s socket: monitor: %s", what, zmq_strerror(e));
    }
    return 0;
}

int auth_poll_items(auth_t *a, zmq_pollitem_t *items, int max)
{
    int n = 0;
    if (a->log_sub && n < max)
        items[n++] = (zmq_pollitem_t){.socket = a->log_sub, .events = ZMQ_POLLIN};
    for (int i = 0; i < 3 && n < max; i++)
        if (a->mons[i].pair)
            items[n++] = (zmq_pollitem_t){.socket = a->mons[i].pair, .events = ZMQ_POLLIN};
    return n;
}

void auth_on_poll(auth_t *a, const zmq_pollitem_t *items, int n)
{
    for (int i = 0; i < n; i++) {
        if (!(items[i].revents & ZMQ_POLLIN))
            continue;
        if (items[i].socket == a->log_sub) {
            auth__read_log(a);
            continue;
        }
        for (int j = 0; j < 3; j++)
            if (a->mons[j].pair && items[i].socket == a->mons[j].pair)
                auth__read_monitor(a, j);
    }
}

int auth_check(auth_t *a, int role, zmq_msg_t *m)
{
    if (a->plain)
        return 0;
    const char *key = zmq_msg_gets(m, "User-Id");
    size_t len = key ? strlen(key) : 0;
    uintptr_t mask = len == KEYS_Z85_LEN ? (uintptr_t)hmap_get(a->roles, key, len) : 0;
    if (mask & (uintptr_t)role)
        return 0;
    const char *peer = zmq_msg_gets(m, "Peer-Address");
    int i = auth__index(role);
    a->refused[i]++;
    char has[64] = "";
    for (int j = 0; j < 3; j++)
        if (mask & (uintptr_t)auth__roles[j].role)
            snprintf(has + strlen(has), sizeof has - strlen(has), "%s%s", has[0] ? ", " : "",
                     auth__roles[j].name);
    char what[128], more[96];
    uint64_t n;
    snprintf(what, sizeof what, "role %d %.60s", role, key ? key : "");
    if (auth__should_log(a, what, &n))
        log_warn("%s endpoint: refused a message from key %s (%s): it is not in %s%s%s%s%s",
                 auth__roles[i].what,
                 len ? key : "(none)", peer ? peer : "unknown address", auth__roles[i].key,
                 has[0] ? " (a " : "", has, has[0] ? " key)" : "",
                 auth__more(n, more, sizeof more));
    return river_err_set(RIVER_EAUTH, "key %s is not allowed on the %s endpoint (not in %s)",
                         len ? key : "(none)", auth__roles[i].name, auth__roles[i].key);
}

uint64_t auth_refused(const auth_t *a, int role)
{
    return a ? a->refused[auth__index(role)] : 0;
}

void auth_stop(auth_t *a)
{
    if (!a)
        return;
    for (int i = 0; i < 3; i++) {
        if (a->mons[i].pair)
            zmq_close(a->mons[i].pair);
        a->mons[i].pair = NULL;
    }
    if (a->log_sub)
        zmq_close(a->log_sub);
    a->log_sub = NULL;
    /* The sockets zauth served are closed by now (loop_close): no handshake can be left
     * without its handler. */
    zactor_destroy(&a->zauth);
    if (!a->plain)
        zsys_set_logsender(NULL);
}

void auth_destroy(auth_t **ap)
{
    auth_t *a = *ap;
    if (!a)
        return;
    auth_stop(a);
    zcertstore_destroy(&a->store);
    hmap_destroy(&a->roles);
    if (a->seen)
        hmap_sweep(a->seen, auth__drop_seen, NULL);
    hmap_destroy(&a->seen);
    memset(&a->server, 0, sizeof a->server);
    free(a);
    *ap = NULL;
}
