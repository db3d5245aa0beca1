/* The cluster fixture of the serving suites (test_serving, test_faults, test_gateway,
 * test_auth, test_multihost): riverd and its river-workers as real child processes on
 * configurations written under the test's directory, riverd's admin endpoint asked what
 * it sees, and the teardown that leaves no process behind. Each of those suites used to
 * write its own launcher; the one here is what they share, and each keeps only what it
 * tests (its keys, its YAML keys, its network namespaces through the argv prefixes).
 *
 * Like proc.h, every helper fails the test (a Check assertion) where the test cannot go
 * on; the ones that wait return whether what they waited for happened. */
#ifndef RIVER_TESTS_CLUSTER_H
#define RIVER_TESTS_CLUSTER_H

#include <stddef.h>
#include <sys/types.h>

#include "client/river_client.h"

#define CLUSTER_MAX_WORKERS 8

/* What riverd's configuration says and how the fixture reaches riverd. */
typedef struct cluster_opts {
    const char *dir;          /* where the files go; NULL: test_tmpdir() */
    /* riverd's endpoints; NULL: ipc://DIR/clients.sock, workers.sock, admin.sock. */
    const char *clients, *workers, *admin;
    const char *workers_bind; /* what riverd binds for workers; NULL: `workers` */
    int metrics_port;         /* 0: off (metrics_address is 127.0.0.1 either way) */
    int heartbeat_ms;         /* 0: 200 */
    int liveness;             /* heartbeats; 0: riverd's default (the key is not written) */
    int plain;                /* 1: auth mode plain; 0: the auth YAML is up to `extra` */
    const char *extra;        /* more riverd YAML at the end (top-level keys), or NULL */
    const river_keys_t *keys; /* the admin connection's keys; NULL: plain */
    int admin_ms;             /* the admin connection's timeout; 0: 1000 ms */
    const char *const *wrap;  /* argv riverd runs under (ip netns exec NS), NULL-ended */
} cluster_opts_t;

typedef struct cluster_worker {
    pid_t pid;                /* 0: not running */
    char id[32];
    char cfg[400], log[400];
    const char *const *wrap;  /* as cluster_worker_opts_t.wrap */
} cluster_worker_t;

typedef struct cluster {
    char dir[256], cfg[320], log[320];
    char clients[320], workers[320], admin[320];
    const river_keys_t *keys; /* the admin connection's keys; NULL: plain */
    int admin_ms;
    const char *const *wrap;
    pid_t pid;                /* riverd; 0: not running */
    cluster_worker_t wk[CLUSTER_MAX_WORKERS];
    int n_wk;
} cluster_t;

/* One worker's configuration: riverd's endpoint, the model, one thread, then the keys
 * below that are set, then `yaml`. */
typedef struct cluster_worker_opts {
    const char *model;        /* repository-relative */
    const char *endpoint;     /* NULL: the cluster's worker endpoint */
    int max_seqs;             /* 0: not written */
    const char *log_level;    /* NULL: not written */
    const char *yaml;         /* the rest (auth, river, exit...), or NULL */
    const char *cfg_name;     /* the file DIR/NAME.yaml; NULL: the worker's id */
    const char *log_name;     /* its log DIR/NAME.log; NULL: the worker's id */
    const char *const *wrap;  /* argv the worker runs under, NULL-ended, or NULL */
} cluster_worker_opts_t;

/* Sets c up from o (paths, endpoints, the admin connection); writes and starts nothing. */
void cluster_init(cluster_t *c, const cluster_opts_t *o);
/* Writes riverd's configuration (DIR/riverd.yaml) from o, its endpoints c's; again for a
 * test of what a reload or a bad file does. */
void cluster_write_config(cluster_t *c, const cluster_opts_t *o);
/* Starts riverd on its configuration, its output appended to c->log; env as for
 * test_spawn. */
void cluster_riverd_start(cluster_t *c, const char *const *env);
/* cluster_init, cluster_write_config and cluster_riverd_start. */
void cluster_start(cluster_t *c, const cluster_opts_t *o);

/* Writes worker configuration w to DIR/<name>.yaml (w->cfg_name is not looked at);
 * returns its path (static, rotating). */
const char *cluster_worker_write(const cluster_t *c, const char *name,
                                 const cluster_worker_opts_t *w);
/* Starts worker id on the configuration at cfg, its log DIR/<log_name or id>.log; returns
 * its index in c->wk. */
int cluster_worker_spawn(cluster_t *c, const char *id, const char *cfg, const char *log_name,
                         const char *const *wrap);
/* cluster_worker_write and cluster_worker_spawn. */
int cluster_worker_start(cluster_t *c, const char *id, const cluster_worker_opts_t *w);
/* Starts worker i again on the configuration it had. */
void cluster_worker_restart(cluster_t *c, int i);

/* An admin connection to riverd (the caller destroys it). */
river_admin_t *cluster_admin(const cluster_t *c);
/* How many workers riverd counts ready, -1 when it does not answer. */
int cluster_ready_workers(const cluster_t *c);
/* Whether riverd counts exactly n ready workers within ms. */
int cluster_wait_ready(const cluster_t *c, int n, int ms);
/* The state riverd lists for worker id ("ready", "dead"...; "" when it lists none), in a
 * static buffer; its address into addr (may be NULL). */
const char *cluster_worker_state(const cluster_t *c, const char *id, char *addr, size_t cap);
/* Polls until riverd lists worker id in `state`; the seconds it took, or -1 after ms. */
double cluster_wait_state(const cluster_t *c, const char *id, const char *state, int ms);

/* Stops riverd with SIGTERM; it must exit 0 within 15 s (also what a sanitizer build's
 * leak check says), else it is killed and the test fails. Nothing when it is not running. */
void cluster_riverd_stop(cluster_t *c);
/* Kills the workers (continuing a stopped one first), then cluster_riverd_stop. */
void cluster_stop(cluster_t *c);
/* Sends sig to the workers and riverd and reaps them, with no verdict on how they ended. */
void cluster_kill(cluster_t *c, int sig);

/* ---- Keys ---- */

/* `riverctl keygen NAME --dir DIR`; with pub, through --output json, whose public key
 * (KEYS_Z85_LEN characters) it copies there. */
void cluster_keygen(const char *dir, const char *name, char *pub);
/* Copies the file at from to to. */
void cluster_copy(const char *from, const char *to);

#endif
