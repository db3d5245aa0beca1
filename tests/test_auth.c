/* Authentication, end to end: real riverd, river-worker and riverctl processes on ipc://
 * sockets under a temporary directory, with CurveZMQ keys that `riverctl keygen` writes.
 *
 * What must hold (the "what it must show"): an authenticated client generates; a
 * client without a key, with a key riverd does not know or with the wrong key for riverd
 * gets nothing from it, and riverd logs the refusal; a worker whose key is unknown, or a
 * client's key used as a worker's, never appears in riverd's worker list while a known one
 * joins; a client or worker key cannot issue admin commands; plain mode runs only when the
 * configuration says so and riverd then warns; keygen writes a pair with the right modes
 * that loads; configuration mistakes name the configuration file, the key and the file. */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>
#include <zmq.h>

#include "client/river_client.h"
#include "common/clock.h"
#include "common/err.h"
#include "common/keys.h"
#include "tests/cluster.h"
#include "tests/proc.h"
#include "tests/testutil.h"

#define TA_MODEL TEST_DATA "/tinystories-656k"
/* riverctl against riverd ends within its admin timeout (5 s) or its generation; one that
 * does not is reported with its threads' stacks (test_capture_within), not left to the
 * test's own time limit, which says only that time ran out. */
#define TA_CTL_LIMIT_MS 30000

/* ---- Keys, configurations, riverd ---- */

typedef struct ta_env {
    cluster_t c;
    char server_key[320];  /* riverd's public key */
} ta_env_t;

/* The path of a file under the test's directory, in one of a few rotating buffers. */
static const char *ta_path(const ta_env_t *e, const char *rel)
{
    static char out[8][PATH_MAX];
    static int k;
    char *p = out[k++ % 8];
    snprintf(p, PATH_MAX, "%s/%s", e->c.dir, rel);
    return p;
}

static void ta_mkdir(const char *path)
{
    ck_assert_msg(mkdir(path, 0755) == 0 || errno == EEXIST, "%s: %s", path, strerror(errno));
}

/* Public keys of the test's peers. */
typedef struct ta_keys {
    char riverd[41], w1[41], c1[41], a1[41], stranger[41], stranger2[41];
} ta_keys_t;

/* riverd's pair in keys/, the peers' pairs in own/, and the public keys riverd allows in
 * keys/clients (c1), keys/workers (w1) and keys/admin (a1). */
static void ta_make_keys(ta_env_t *e, ta_keys_t *k)
{
    const char *keys = ta_path(e, "keys"), *own = ta_path(e, "own");
    cluster_keygen(keys, "riverd", k->riverd);
    cluster_keygen(own, "w1", k->w1);
    cluster_keygen(own, "c1", k->c1);
    cluster_keygen(own, "a1", k->a1);
    cluster_keygen(own, "stranger", k->stranger);
    cluster_keygen(own, "stranger2", k->stranger2);
    ta_mkdir(ta_path(e, "keys/clients"));
    ta_mkdir(ta_path(e, "keys/workers"));
    ta_mkdir(ta_path(e, "keys/admin"));
    cluster_copy(ta_path(e, "own/c1.key"), ta_path(e, "keys/clients/c1.key"));
    cluster_copy(ta_path(e, "own/w1.key"), ta_path(e, "keys/workers/w1.key"));
    cluster_copy(ta_path(e, "own/a1.key"), ta_path(e, "keys/admin/a1.key"));
    snprintf(e->server_key, sizeof e->server_key, "%s/keys/riverd.key", e->c.dir);
}

static void ta_init(ta_env_t *e)
{
    memset(e, 0, sizeof *e);
    cluster_opts_t o = {0};
    cluster_init(&e->c, &o);
}

/* riverd's configuration: the endpoints, then `auth` (YAML, may be "" for the defaults). */
static void ta_write_riverd(ta_env_t *e, const char *auth)
{
    cluster_opts_t o = {.extra = auth};
    cluster_write_config(&e->c, &o);
}

/* A worker with the keys `secret` (own/NAME.key_secret, relative to its configuration) and
 * riverd's public key; NULL secret: plain mode. */
static pid_t ta_start_worker_on(ta_env_t *e, const char *id, const char *secret,
                                const char *server_key, const char *model_dir)
{
    char auth[600], cfg[128];
    if (secret)
        snprintf(auth, sizeof auth, "auth:\n  secret_key: \"%s\"\n  server_key: \"%s\"\n",
                 secret, server_key ? server_key : "keys/riverd.key");
    else
        snprintf(auth, sizeof auth, "auth:\n  mode: plain\n");
    snprintf(cfg, sizeof cfg, "worker-%s", id);
    cluster_worker_opts_t w = {.model = model_dir, .max_seqs = 4, .yaml = auth, .cfg_name = cfg};
    return e->c.wk[cluster_worker_start(&e->c, id, &w)].pid;
}

static pid_t ta_start_worker(ta_env_t *e, const char *id, const char *secret,
                             const char *server_key)
{
    return ta_start_worker_on(e, id, secret, server_key, TA_MODEL);
}

/* A path that lives as long as the test (its process). */
static const char *ta_keep(const char *path)
{
    static char kept[32][PATH_MAX];
    static int n;
    ck_assert_int_lt(n, 32);
    snprintf(kept[n], PATH_MAX, "%s", path);
    return kept[n++];
}

/* Keys of one of the test's peers. */
static river_keys_t ta_keys(const ta_env_t *e, const char *secret_rel)
{
    river_keys_t k = {.secret_key = ta_keep(ta_path(e, secret_rel)),
                      .server_key = ta_keep(e->server_key)};
    return k;
}

/* The ids riverd lists, comma-separated, through an admin connection with admin keys;
 * -1 when riverd does not answer. */
static int ta_worker_ids(const ta_env_t *e, const river_keys_t *admin_keys, char *ids,
                         size_t cap)
{
    river_admin_t *a;
    ck_assert_int_eq(river_admin_new_secure(&a, e->c.admin, 1000, admin_keys), 0);
    river_worker_info_t *w;
    size_t n;
    int rc = river_admin_workers(a, &w, &n);
    river_admin_destroy(&a);
    if (rc < 0) {
        snprintf(ids, cap, "%s", river_err_detail());
        return -1;
    }
    ids[0] = '\0';
    for (size_t i = 0; i < n; i++)
        snprintf(ids + strlen(ids), cap - strlen(ids), "%s%s(%s)", i ? "," : "", w[i].id,
                 w[i].state);
    free(w);
    return (int)n;
}

/* ---- One request ---- */

typedef struct ta_stream {
    size_t n_ids, chunks;
    int ended;
    river_event_kind_t end;
    river_code_t code;
    char msg[512];
} ta_stream_t;

static void ta_on_event(void *user, const river_event_t *ev)
{
    ta_stream_t *s = user;
    if (ev->kind == RIVER_EVENT_CHUNK) {
        s->chunks++;
        s->n_ids += ev->n_ids;
        return;
    }
    s->ended = 1;
    s->end = ev->kind;
    s->code = ev->code;
    snprintf(s->msg, sizeof s->msg, "%s", ev->message ? ev->message : "");
}

/* Submits one request on c and polls it for up to ms; returns what submit returned. */
static int ta_request(river_client_t *c, int ms, ta_stream_t *s)
{
    memset(s, 0, sizeof *s);
    river_generate_opts_t o = RIVER_GENERATE_OPTS_INIT;
    o.prompt = "Once upon a time";
    o.max_tokens = 16;
    o.ignore_eos = 1;
    int rc = river_client_submit(c, &o, NULL, ta_on_event, s, NULL);
    double until = clock_now_s() + ms / 1000.0;
    while (rc == 0 && !s->ended && clock_now_s() < until)
        ck_assert_int_ge(river_client_poll(c, 50), 0);
    return rc;
}

/* A client riverd refuses: nothing of riverd's reaches it, however long it waits. The
 * library may end the request itself (UNAUTHENTICATED, when it sees the refused handshake),
 * but never with riverd's tokens or Final. */
static void ta_expect_refused(const ta_env_t *e, const river_keys_t *keys, const char *what)
{
    river_client_t *c;
    ck_assert_int_eq(river_client_new_secure(&c, e->c.clients, keys), 0);
    ta_stream_t s;
    /* Twice: the second request finds the refusal already known (or meets it). */
    for (int i = 0; i < 2; i++) {
        int rc = ta_request(c, 1500, &s);
        ck_assert_msg(rc == 0 || rc == RIVER_EAUTH, "%s: submit: %s", what, river_err_detail());
        if (rc == RIVER_EAUTH)
            ck_assert_ptr_nonnull(strstr(river_err_detail(), "riverd"));
    }
    ck_assert_msg(s.chunks == 0 && s.n_ids == 0, "%s: got %zu tokens", what, s.n_ids);
    ck_assert_msg(!s.ended || s.end == RIVER_EVENT_ERROR, "%s: got a Final", what);
    if (s.ended)
        ck_assert_msg(s.code == RIVER_CODE_UNAUTHENTICATED || s.code == RIVER_CODE_UNAVAILABLE,
                      "%s: ended with %s: %s", what, river_code_name(s.code), s.msg);
    river_client_destroy(&c);
}

/* ---- Tests ---- */

/* keygen writes NAME.key (0644) and NAME.key_secret (0600) that load as one pair, prints
 * the public key, and never replaces a key. */
START_TEST(test_keygen)
{
    ta_env_t e;
    ta_init(&e);
    const char *dir = ta_path(&e, "new-keys");
    char pub[KEYS_Z85_LEN + 1];
    cluster_keygen(dir, "alice", pub);

    struct stat st;
    ck_assert_int_eq(stat(ta_path(&e, "new-keys/alice.key_secret"), &st), 0);
    ck_assert_int_eq(st.st_mode & 0777, 0600);
    ck_assert_int_eq(stat(ta_path(&e, "new-keys/alice.key"), &st), 0);
    ck_assert_int_eq(st.st_mode & 0777, 0644);
    ck_assert_int_eq(stat(dir, &st), 0);
    ck_assert_int_eq(st.st_mode & 0777, 0700);

    keys_pair_t pair;
    ck_assert_msg(keys_load_secret(ta_path(&e, "new-keys/alice.key_secret"), &pair) == 0, "%s",
                  river_err_detail());
    ck_assert_str_eq(pair.public_txt, pub);
    char loaded[KEYS_Z85_LEN + 1];
    ck_assert_int_eq(keys_load_public(ta_path(&e, "new-keys/alice.key"), loaded), 0);
    ck_assert_str_eq(loaded, pub);
    /* The public file holds no secret. */
    size_t len;
    char *text = test_read_file(ta_path(&e, "new-keys/alice.key"), &len);
    ck_assert_ptr_nonnull(text);
    ck_assert_ptr_null(strstr(text, "secret-key"));
    ck_assert_ptr_nonnull(strstr(text, pub));
    free(text);

    /* A second keygen of the same name fails and leaves the first pair as it was. */
    char *argv[] = {(char *)test_bin("riverctl"), "keygen", "alice", "--dir", (char *)dir, NULL};
    char *out;
    ck_assert_int_eq(test_capture(argv, NULL, 1, &out), 1);
    ck_assert_msg(strstr(out, "never replaces"), "%s", out);
    free(out);
    keys_pair_t again;
    ck_assert_int_eq(keys_load_secret(ta_path(&e, "new-keys/alice.key_secret"), &again), 0);
    ck_assert_str_eq(again.secret_txt, pair.secret_txt);
    /* A name that is a path is refused. */
    char *bad[] = {(char *)test_bin("riverctl"), "keygen", "../x", "--dir", (char *)dir, NULL};
    ck_assert_int_eq(test_capture(bad, NULL, 1, &out), 1);
    free(out);

    /* A secret key others may read is refused, and so is a public key given as a secret. */
    ck_assert_int_eq(chmod(ta_path(&e, "new-keys/alice.key_secret"), 0640), 0);
    ck_assert_int_eq(keys_load_secret(ta_path(&e, "new-keys/alice.key_secret"), &again),
                     RIVER_EINVAL);
    ck_assert_ptr_nonnull(strstr(river_err_detail(), "chmod 600"));
    cluster_copy(ta_path(&e, "new-keys/alice.key"), ta_path(&e, "public-as-secret"));
    ck_assert_int_eq(chmod(ta_path(&e, "public-as-secret"), 0600), 0);
    ck_assert_int_eq(keys_load_secret(ta_path(&e, "public-as-secret"), &again), RIVER_EFORMAT);
    ck_assert_ptr_nonnull(strstr(river_err_detail(), "holds no secret key"));
    test_write(ta_path(&e, "garbage.key"), "this is not a certificate\n");
    ck_assert_int_eq(keys_load_public(ta_path(&e, "garbage.key"), loaded), RIVER_EFORMAT);
    ck_assert_int_eq(keys_load_public(ta_path(&e, "missing.key"), loaded), RIVER_EIO);
    ck_assert_ptr_nonnull(strstr(river_err_detail(), "missing.key"));
    test_remove_tree(test_tmpdir());
}
END_TEST

/* The whole picture with CURVE: who gets in, who does not, and what riverd logs. */
START_TEST(test_curve_serving)
{
    ta_env_t e;
    ta_init(&e);
    ta_keys_t k;
    ta_make_keys(&e, &k);
    /* Key paths relative to the configuration file (riverd runs from elsewhere). */
    ta_write_riverd(&e, "auth:\n"
                        "  mode: curve\n"
                        "  secret_key: keys/riverd.key_secret\n"
                        "  clients: keys/clients\n"
                        "  workers: keys/workers\n"
                        "  admin: keys/admin\n");
    cluster_riverd_start(&e.c, NULL);
    pid_t w1 = ta_start_worker(&e, "w1", "own/w1.key_secret", NULL);
    /* A worker with a key riverd does not know, and one with a client's key. */
    pid_t intruder = ta_start_worker(&e, "intruder", "own/stranger.key_secret", NULL);
    pid_t impostor = ta_start_worker(&e, "impostor", "own/c1.key_secret", NULL);
    river_keys_t admin = ta_keys(&e, "own/a1.key_secret");

    /* The known worker joins; the other two never appear, however long they try. */
    char ids[512] = "";
    double until = clock_now_s() + 15;
    while (clock_now_s() < until && !strstr(ids, "w1(ready)")) {
        ta_worker_ids(&e, &admin, ids, sizeof ids);
        test_sleep_ms(50);
    }
    ck_assert_msg(strstr(ids, "w1(ready)"), "workers: '%s'; see %s", ids, e.c.log);
    for (int i = 0; i < 20; i++) {
        ck_assert_int_eq(ta_worker_ids(&e, &admin, ids, sizeof ids), 1);
        ck_assert_msg(!strstr(ids, "intruder") && !strstr(ids, "impostor"), "workers: %s", ids);
        test_sleep_ms(50);
    }

    /* A client's key on the worker endpoint, under the worker's name as its routing id: the
     * routing id of a CURVE worker is its name and random bytes, so this takes nothing of
     * w1's (ZMQ would hand w1's connection over to a peer with the same id). */
    keys_pair_t c1_pair;
    char server_pub[KEYS_Z85_LEN + 1];
    ck_assert_int_eq(keys_load_secret(ta_path(&e, "own/c1.key_secret"), &c1_pair), 0);
    ck_assert_int_eq(keys_load_public(e.server_key, server_pub), 0);
    void *hctx = zmq_ctx_new();
    void *hijack = zmq_socket(hctx, ZMQ_DEALER);
    int zero = 0;
    ck_assert_int_eq(zmq_setsockopt(hijack, ZMQ_LINGER, &zero, sizeof zero), 0);
    ck_assert_int_eq(zmq_setsockopt(hijack, ZMQ_ROUTING_ID, "w1", 2), 0);
    ck_assert_int_eq(zmq_setsockopt(hijack, ZMQ_CURVE_SERVERKEY, server_pub, 40), 0);
    ck_assert_int_eq(zmq_setsockopt(hijack, ZMQ_CURVE_PUBLICKEY, c1_pair.public_txt, 40), 0);
    ck_assert_int_eq(zmq_setsockopt(hijack, ZMQ_CURVE_SECRETKEY, c1_pair.secret_txt, 40), 0);
    ck_assert_int_eq(zmq_connect(hijack, e.c.workers), 0);
    test_sleep_ms(300);

    /* An authenticated client generates, through the library and through riverctl. */
    river_keys_t c1 = ta_keys(&e, "own/c1.key_secret");
    river_client_t *c;
    ck_assert_int_eq(river_client_new_secure(&c, e.c.clients, &c1), 0);
    ta_stream_t s;
    ck_assert_int_eq(ta_request(c, 10000, &s), 0);
    ck_assert_msg(s.ended && s.end == RIVER_EVENT_FINAL, "ended %d with %s: %s", s.ended,
                  river_code_name(s.code), s.msg);
    ck_assert_uint_eq(s.n_ids, 16);
    river_client_destroy(&c);
    char *argv[] = {(char *)test_bin("riverctl"), "--endpoint", e.c.clients, "--key",
                    (char *)ta_path(&e, "own/c1.key_secret"), "--server-key", e.server_key,
                    "--output", "json", "generate", "Once upon a time", "--max-tokens", "8",
                    NULL};
    char *out;
    ck_assert_msg(test_capture_within(argv, NULL, 1, TA_CTL_LIMIT_MS, &out) == 0, "%s", out);
    ck_assert_msg(strstr(out, "\"finish\""), "%s", out);
    free(out);
    /* Nothing of riverd's reached the would-be worker: no Submit, not even a heartbeat. */
    zmq_pollitem_t hit = {.socket = hijack, .events = ZMQ_POLLIN};
    ck_assert_int_eq(zmq_poll(&hit, 1, 500), 0);
    zmq_close(hijack);
    zmq_ctx_term(hctx);
    /* The keys may come from the environment as well. */
    char env_key[400], env_server[400], env_admin[400];
    snprintf(env_key, sizeof env_key, "RIVER_KEY=%s", ta_path(&e, "own/a1.key_secret"));
    snprintf(env_server, sizeof env_server, "RIVER_SERVER_KEY=%s", e.server_key);
    snprintf(env_admin, sizeof env_admin, "RIVER_ADMIN=%s", e.c.admin);
    const char *env[] = {env_key, env_server, env_admin, NULL};
    char *status[] = {(char *)test_bin("riverctl"), "status", NULL};
    ck_assert_int_eq(test_capture_within(status, env, 1, TA_CTL_LIMIT_MS, &out), 0);
    ck_assert_msg(strstr(out, "1 ready"), "%s", out);
    free(out);

    /* No key, an unknown key, the wrong server key: nothing comes back, and riverd logs the
     * refusals with the endpoint and, where there is one, the key. */
    ta_expect_refused(&e, NULL, "client without keys");
    /* riverd hears why (no CURVE) or only that the peer left the handshake, whichever end
     * of the connection notices first. */
    ck_assert_msg(test_log_has(e.c.log, "clients endpoint ipc://", 3000) &&
                      (test_log_has(e.c.log, "does not speak CURVE", 1000) ||
                       test_log_has(e.c.log, "ended during its handshake", 1000)),
                  "no refusal of the client without keys in %s", e.c.log);
    river_keys_t unknown = ta_keys(&e, "own/stranger2.key_secret");
    ta_expect_refused(&e, &unknown, "client with an unknown key");
    char want[200];
    snprintf(want, sizeof want, "refused CURVE key %s", k.stranger2);
    ck_assert_msg(test_log_has(e.c.log, want, 3000), "riverd did not log '%s'", want);
    ck_assert(test_log_has(e.c.log, "refused a connection: its CURVE key is not allowed", 3000));
    river_keys_t wrong_server = ta_keys(&e, "own/c1.key_secret");
    wrong_server.server_key = ta_keep(ta_path(&e, "own/stranger.key"));
    ta_expect_refused(&e, &wrong_server, "client with the wrong server key");
    ck_assert(test_log_has(e.c.log, "does not decrypt", 3000));

    /* A known key on the wrong endpoint: riverd answers UNAUTHENTICATED, serves nothing. */
    river_keys_t w1_as_client = ta_keys(&e, "own/w1.key_secret");
    ck_assert_int_eq(river_client_new_secure(&c, e.c.clients, &w1_as_client), 0);
    ck_assert_int_eq(ta_request(c, 5000, &s), 0);
    ck_assert_msg(s.ended && s.end == RIVER_EVENT_ERROR && s.code == RIVER_CODE_UNAUTHENTICATED,
                  "worker key as client: %s %s", river_code_name(s.code), s.msg);
    ck_assert_uint_eq(s.n_ids, 0);
    ck_assert_ptr_nonnull(strstr(s.msg, "auth.clients"));
    river_client_destroy(&c);

    /* Admin commands need an admin key: a client key and a worker key are refused, an
     * unknown key too, with RIVER_EAUTH at once rather than a timeout. */
    const char *not_admin[] = {"own/c1.key_secret", "own/w1.key_secret",
                               "own/stranger.key_secret"};
    for (size_t i = 0; i < 3; i++) {
        river_keys_t key = ta_keys(&e, not_admin[i]);
        river_admin_t *a;
        ck_assert_int_eq(river_admin_new_secure(&a, e.c.admin, 5000, &key), 0);
        river_status_t st;
        double t0 = clock_now_s();
        int rc = river_admin_status(a, &st);
        ck_assert_msg(rc == RIVER_EAUTH, "%s: status gave %d: %s", not_admin[i], rc,
                      river_err_detail());
        ck_assert_msg(clock_now_s() - t0 < 4.0, "%s: the refusal took %.1f s", not_admin[i],
                      clock_now_s() - t0);
        uint32_t prev = 0;
        ck_assert_int_eq(river_admin_scale(a, 3, &prev), RIVER_EAUTH);
        river_admin_destroy(&a);
    }
    snprintf(want, sizeof want, "admin endpoint: refused a message from key %s", k.c1);
    ck_assert_msg(test_log_has(e.c.log, want, 3000), "riverd did not log '%s'", want);
    char *ctl_status[] = {(char *)test_bin("riverctl"), "--admin", e.c.admin, "--key",
                          (char *)ta_path(&e, "own/c1.key_secret"), "--server-key",
                          e.server_key, "status", NULL};
    ck_assert_int_eq(test_capture_within(ctl_status, NULL, 1, TA_CTL_LIMIT_MS, &out), 1);
    ck_assert_msg(strstr(out, "UNAUTHENTICATED"), "%s", out);
    free(out);
    /* riverctl without keys against a CURVE riverd fails and says why. */
    char *no_keys[] = {(char *)test_bin("riverctl"), "--admin", e.c.admin, "status", NULL};
    ck_assert_int_eq(test_capture_within(no_keys, NULL, 1, TA_CTL_LIMIT_MS, &out), 1);
    free(out);
    /* The admin key still works, and nothing the refused keys asked for happened. */
    ck_assert_msg(ta_worker_ids(&e, &admin, ids, sizeof ids) == 1, "%s", ids);

    /* The two bad workers: riverd logged both, each worker logged that it was refused, and
     * neither ever joined. */
    snprintf(want, sizeof want, "refused CURVE key %s", k.stranger);
    ck_assert_msg(test_log_has(e.c.log, want, 3000), "riverd did not log '%s'", want);
    ck_assert(test_log_has(e.c.log, "workers endpoint ipc://", 3000));
    snprintf(want, sizeof want, "workers endpoint: refused a message from key %s", k.c1);
    ck_assert_msg(test_log_has(e.c.log, want, 3000), "riverd did not log '%s'", want);
    ck_assert_msg(test_log_has(ta_path(&e, "intruder.log"), "riverd refused this worker", 8000),
                  "the intruder did not log its refusal");
    ck_assert_int_eq(ta_worker_ids(&e, &admin, ids, sizeof ids), 1);
    ck_assert_msg(!strstr(ids, "intruder") && !strstr(ids, "impostor"), "workers: %s", ids);

    /* The refusals are counted for Prometheus, by endpoint. */
    river_admin_t *a;
    ck_assert_int_eq(river_admin_new_secure(&a, e.c.admin, 2000, &admin), 0);
    char *metrics;
    ck_assert_int_eq(river_admin_metrics(a, &metrics), 0);
    river_admin_destroy(&a);
    const char *endpoints[] = {"clients", "workers", "admin"};
    for (size_t i = 0; i < 3; i++) {
        char name[96];
        snprintf(name, sizeof name, "river_auth_refused_total{endpoint=\"%s\"} ",
                 endpoints[i]);
        const char *at = strstr(metrics, name);
        ck_assert_msg(at && atoi(at + strlen(name)) > 0, "%s in:\n%s", name, metrics);
    }
    free(metrics);

    test_kill(&intruder, SIGKILL);
    test_kill(&impostor, SIGKILL);
    test_kill(&w1, SIGKILL);
    cluster_riverd_stop(&e.c);
    test_remove_tree(test_tmpdir());
}
END_TEST

/* Under CURVE a client is its key: limits.max_requests_per_client counts the requests of
 * every connection with that key, so a second connection cannot double a client's share,
 * while another key has its own. The worker runs kjv-12l (about 1,000 tokens/s here), so
 * the first request is still running when the second connection has made its handshake. */
START_TEST(test_limit_per_key)
{
    ta_env_t e;
    ta_init(&e);
    ta_keys_t k;
    ta_make_keys(&e, &k);
    char c2[41];
    cluster_keygen(ta_path(&e, "own"), "c2", c2);
    cluster_copy(ta_path(&e, "own/c2.key"), ta_path(&e, "keys/clients/c2.key"));
    ta_write_riverd(&e, "limits:\n"
                        "  max_requests_per_client: 1\n"
                        "auth:\n"
                        "  mode: curve\n"
                        "  secret_key: keys/riverd.key_secret\n"
                        "  clients: keys/clients\n"
                        "  workers: keys/workers\n"
                        "  admin: keys/admin\n");
    cluster_riverd_start(&e.c, NULL);
    pid_t w1 = ta_start_worker_on(&e, "w1", "own/w1.key_secret", NULL, TEST_DATA "/kjv-12l");
    river_keys_t admin = ta_keys(&e, "own/a1.key_secret");
    char ids[512] = "";
    double until = clock_now_s() + 15;
    while (clock_now_s() < until && !strstr(ids, "w1(ready)")) {
        ta_worker_ids(&e, &admin, ids, sizeof ids);
        test_sleep_ms(50);
    }
    ck_assert_msg(strstr(ids, "w1(ready)"), "workers: '%s'; see %s", ids, e.c.log);

    river_keys_t kc1 = ta_keys(&e, "own/c1.key_secret"), kc2 = ta_keys(&e, "own/c2.key_secret");
    river_client_t *a, *b, *other;
    ck_assert_int_eq(river_client_new_secure(&a, e.c.clients, &kc1), 0);
    ta_stream_t sa, sb, so;
    /* One short request first, so that a's connection is up before the long one. */
    ck_assert_int_eq(ta_request(a, 10000, &sa), 0);
    ck_assert_int_eq(sa.end, RIVER_EVENT_FINAL);
    memset(&sa, 0, sizeof sa);
    river_generate_opts_t o = RIVER_GENERATE_OPTS_INIT;
    o.prompt = "In the beginning";
    o.max_tokens = 200;
    o.ignore_eos = 1;
    ck_assert_int_eq(river_client_submit(a, &o, NULL, ta_on_event, &sa, NULL), 0);
    /* Once it is running, the worker is stopped, so that the long request is still in
     * flight however long the next checks take on a loaded machine: riverd applies the
     * limit at admission, without the worker. */
    until = clock_now_s() + 20;
    while (sa.n_ids == 0 && !sa.ended && clock_now_s() < until)
        ck_assert_int_ge(river_client_poll(a, 20), 0);
    ck_assert_msg(sa.n_ids > 0 && !sa.ended, "the long request did not start: %s", sa.msg);
    ck_assert_int_eq(kill(w1, SIGSTOP), 0);

    /* The same key on a second connection: over the limit. */
    ck_assert_int_eq(river_client_new_secure(&b, e.c.clients, &kc1), 0);
    ck_assert_int_eq(ta_request(b, 10000, &sb), 0);
    ck_assert_msg(sb.ended && sb.end == RIVER_EVENT_ERROR &&
                      sb.code == RIVER_CODE_RESOURCE_EXHAUSTED,
                  "second connection of c1: ended %d, %s: %s", sb.ended,
                  river_code_name(sb.code), sb.msg);
    ck_assert_msg(strstr(sb.msg, "limits.max_requests_per_client"), "%s", sb.msg);
    ck_assert_msg(!sa.ended, "the long request ended before the check: %s", sa.msg);
    ck_assert_int_eq(kill(w1, SIGCONT), 0);

    /* Another key is another client. */
    ck_assert_int_eq(river_client_new_secure(&other, e.c.clients, &kc2), 0);
    ck_assert_int_eq(ta_request(other, 10000, &so), 0);
    ck_assert_msg(so.ended && so.end == RIVER_EVENT_FINAL, "c2: %s: %s",
                  river_code_name(so.code), so.msg);
    ck_assert_uint_eq(so.n_ids, 16);

    /* The long request completes, and then c1 may ask again from either connection. */
    until = clock_now_s() + 20;
    while (!sa.ended && clock_now_s() < until)
        ck_assert_int_ge(river_client_poll(a, 50), 0);
    ck_assert_msg(sa.ended && sa.end == RIVER_EVENT_FINAL, "long request: %s: %s",
                  river_code_name(sa.code), sa.msg);
    ck_assert_uint_eq(sa.n_ids, 200);
    ck_assert_int_eq(ta_request(b, 10000, &sb), 0);
    ck_assert_msg(sb.ended && sb.end == RIVER_EVENT_FINAL, "c1 again: %s: %s",
                  river_code_name(sb.code), sb.msg);

    river_client_destroy(&a);
    river_client_destroy(&b);
    river_client_destroy(&other);
    test_kill(&w1, SIGKILL);
    cluster_riverd_stop(&e.c);
    test_remove_tree(test_tmpdir());
}
END_TEST

/* Plain mode runs only when asked for, and riverd says so at start, whatever the log level;
 * without an auth section riverd wants keys. */
START_TEST(test_plain_only_when_stated)
{
    ta_env_t e;
    ta_init(&e);
    /* No auth section: CURVE, and no keys where the defaults point. */
    ta_write_riverd(&e, "");
    char *check[] = {(char *)test_bin("riverd"), "--config", e.c.cfg, NULL};
    char *out;
    ck_assert_int_eq(test_capture(check, NULL, 1, &out), 78);
    ck_assert_msg(strstr(out, "key 'auth.secret_key'") &&
                      strstr(out, "keys/riverd.key_secret: No such file"),
                  "%s", out);
    ck_assert_msg(strstr(out, e.c.cfg), "%s", out);
    free(out);

    ta_write_riverd(&e, "log_level: error\nauth: {mode: plain}\n");
    cluster_riverd_start(&e.c, NULL);
    pid_t w = ta_start_worker(&e, "plain-worker", NULL, NULL);
    river_client_t *c;
    ck_assert_int_eq(river_client_new(&c, e.c.clients), 0);
    ta_stream_t s;
    ck_assert_int_eq(ta_request(c, 15000, &s), 0);
    ck_assert_msg(s.ended && s.end == RIVER_EVENT_FINAL, "%s: %s", river_code_name(s.code),
                  s.msg);
    river_client_destroy(&c);
    ck_assert_msg(test_log_has(e.c.log, "auth.mode is plain: serving clients, workers and riverctl "
                                    "WITHOUT authentication",
                             1000),
                  "riverd did not warn about plain mode");
    ck_assert(test_log_has(ta_path(&e, "plain-worker.log"), "auth.mode is plain", 1000));

    /* A CURVE client against a plain riverd gets nothing either: both ends must agree. */
    char keys[400];
    snprintf(keys, sizeof keys, "%s/k", e.c.dir);
    char pub[KEYS_Z85_LEN + 1];
    cluster_keygen(keys, "c", pub);
    cluster_keygen(keys, "riverd", pub);
    river_keys_t curve = {.secret_key = ta_path(&e, "k/c.key_secret"),
                          .server_key = ta_path(&e, "k/riverd.key")};
    ta_expect_refused(&e, &curve, "CURVE client of a plain riverd");
    test_kill(&w, SIGKILL);
    cluster_riverd_stop(&e.c);
    test_remove_tree(test_tmpdir());
}
END_TEST

/* Every mistake in the keys stops riverd (or the worker) at start with the configuration
 * file, the key and the file or directory at fault; riverd --check finds them too. */
START_TEST(test_config_errors)
{
    ta_env_t e;
    ta_init(&e);
    ta_keys_t k;
    ta_make_keys(&e, &k);
    char *check[] = {(char *)test_bin("riverd"), "--config", e.c.cfg, "--check", NULL};
    char *out;

    ta_write_riverd(&e, "");
    ck_assert_int_eq(test_capture(check, NULL, 1, &out), 0);
    ck_assert_msg(strstr(out, "ok (auth: curve") && strstr(out, k.riverd) &&
                      strstr(out, "1 client, 1 worker, 1 admin keys"),
                  "%s", out);
    free(out);

    struct {
        const char *auth;
        const char *key;
        const char *what;
    } cases[] = {
        {"auth:\n  secret_key: keys/nothing.key_secret\n", "auth.secret_key",
         "keys/nothing.key_secret: No such file"},
        {"auth:\n  secret_key: keys/riverd.key\n", "auth.secret_key", "chmod 600"},
        {"auth:\n  secret_key: own/public-0600.key\n", "auth.secret_key",
         "holds no secret key"},
        {"auth:\n  clients: keys/nowhere\n", "auth.clients", "keys/nowhere: No such file"},
        {"auth:\n  admin: keys/riverd.key\n", "auth.admin", "keys/riverd.key: Not a directory"},
        {"auth:\n  workers: broken\n", "auth.workers", "bad.key: holds no public key"},
    };
    cluster_copy(ta_path(&e, "keys/riverd.key"), ta_path(&e, "own/public-0600.key"));
    ck_assert_int_eq(chmod(ta_path(&e, "own/public-0600.key"), 0600), 0);
    ta_mkdir(ta_path(&e, "broken"));
    cluster_copy(ta_path(&e, "own/w1.key"), ta_path(&e, "broken/w1.key"));
    test_write(ta_path(&e, "broken/bad.key"), "curve\n    nothing = \"here\"\n");
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ta_write_riverd(&e, cases[i].auth);
        ck_assert_int_eq(test_capture(check, NULL, 1, &out), 78);
        char key[512];
        snprintf(key, sizeof key, "%s: key '%s': ", e.c.cfg, cases[i].key);
        ck_assert_msg(strstr(out, key) && strstr(out, cases[i].what), "case %zu: '%s'", i, out);
        free(out);
    }
    /* Without an admin endpoint the admin directory is not needed. */
    char y[1024];
    snprintf(y, sizeof y,
             "endpoints:\n  clients: [\"%s\"]\n  workers: [\"%s\"]\n  admin: \"\"\n"
             "  metrics_port: 0\nauth:\n  admin: keys/nowhere\n",
             e.c.clients, e.c.workers);
    test_write(e.c.cfg, y);
    ck_assert_int_eq(test_capture(check, NULL, 1, &out), 0);
    free(out);

    /* The worker names its keys as well, before loading anything. */
    struct {
        const char *secret, *server, *key, *what;
    } wcases[] = {
        {"own/none.key_secret", "keys/riverd.key", "auth.secret_key", "No such file"},
        {"own/w1.key_secret", "keys/none.key", "auth.server_key", "keys/none.key"},
        {"own/w1.key", "keys/riverd.key", "auth.secret_key", "chmod 600"},
    };
    for (size_t i = 0; i < sizeof wcases / sizeof wcases[0]; i++) {
        char wy[1024], wpath[400];
        snprintf(wpath, sizeof wpath, "%s/bad-worker.yaml", e.c.dir);
        snprintf(wy, sizeof wy,
                 "riverd: \"%s\"\nmodel: nothing\nauth:\n  secret_key: %s\n  server_key: %s\n",
                 e.c.workers, wcases[i].secret, wcases[i].server);
        test_write(wpath, wy);
        char *argv[] = {(char *)test_bin("river-worker"), "--config", wpath, NULL};
        ck_assert_int_eq(test_capture(argv, NULL, 1, &out), 1);
        char key[512];
        snprintf(key, sizeof key, "%s: key '%s': ", wpath, wcases[i].key);
        ck_assert_msg(strstr(out, key) && strstr(out, wcases[i].what), "worker case %zu: '%s'",
                      i, out);
        free(out);
    }

    /* riverctl: both keys or neither, and a key file that does not load is named. */
    char *half[] = {(char *)test_bin("riverctl"), "--key", (char *)ta_path(&e, "own/c1.key_secret"),
                    "status", NULL};
    ck_assert_int_eq(test_capture(half, NULL, 1, &out), 2);
    free(out);
    char *missing[] = {(char *)test_bin("riverctl"), "--endpoint", e.c.clients, "--key",
                       (char *)ta_path(&e, "own/none.key_secret"), "--server-key",
                       e.server_key, "generate", "x", NULL};
    ck_assert_int_eq(test_capture(missing, NULL, 1, &out), 1);
    ck_assert_msg(strstr(out, "none.key_secret"), "%s", out);
    free(out);
    test_remove_tree(test_tmpdir());
}
END_TEST

static Suite *auth_suite(void)
{
    Suite *s = suite_create("auth");
    TCase *tc = tcase_create("auth");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_keygen);
    tcase_add_test(tc, test_config_errors);
    tcase_add_test(tc, test_plain_only_when_stated);
    tcase_add_test(tc, test_curve_serving);
    tcase_add_test(tc, test_limit_per_key);
    suite_add_tcase(s, tc);
    return s;
}

RIVER_TEST_MAIN(auth_suite)
