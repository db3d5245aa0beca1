/* The cluster fixture of the serving suites: riverd and river-workers as child processes
 * on configurations under the test's directory (tests/cluster.h). */
#include "tests/cluster.h"

#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "common/clock.h"
#include "common/err.h"
#include "common/keys.h"
#include "tests/proc.h"
#include "tests/testutil.h"

/* argv = wrap (may be NULL) followed by rest, NULL-ended, into out (cap entries). */
static void cluster__argv(char **out, size_t cap, const char *const *wrap, char *const *rest)
{
    size_t n = 0;
    for (; wrap && wrap[n]; n++) {
        ck_assert_uint_lt(n, cap - 1);
        out[n] = (char *)wrap[n];
    }
    for (size_t i = 0; rest[i]; i++) {
        ck_assert_uint_lt(n, cap - 1);
        out[n++] = rest[i];
    }
    out[n] = NULL;
}

void cluster_write_config(cluster_t *c, const cluster_opts_t *o)
{
    char liveness[64] = "", y[8192];
    if (o->liveness)
        snprintf(liveness, sizeof liveness, "  liveness: %d\n", o->liveness);
    snprintf(y, sizeof y,
             "endpoints:\n"
             "  clients: [\"%s\"]\n"
             "  workers: [\"%s\"]\n"
             "  admin: \"%s\"\n"
             "  metrics_port: %d\n"
             "  metrics_address: \"127.0.0.1\"\n"
             "heartbeat:\n"
             "  interval: %dms\n"
             "%s%s%s",
             c->clients, o->workers_bind ? o->workers_bind : c->workers, c->admin,
             o->metrics_port, o->heartbeat_ms ? o->heartbeat_ms : 200, liveness,
             o->plain ? "auth:\n  mode: plain\n" : "", o->extra ? o->extra : "");
    test_write(c->cfg, y);
}

void cluster_init(cluster_t *c, const cluster_opts_t *o)
{
    memset(c, 0, sizeof *c);
    snprintf(c->dir, sizeof c->dir, "%s", o->dir ? o->dir : test_tmpdir());
    snprintf(c->cfg, sizeof c->cfg, "%s/riverd.yaml", c->dir);
    snprintf(c->log, sizeof c->log, "%s/riverd.log", c->dir);
    const char *given[3] = {o->clients, o->workers, o->admin};
    const char *sock[3] = {"clients", "workers", "admin"};
    char *dst[3] = {c->clients, c->workers, c->admin};
    for (int i = 0; i < 3; i++) {
        if (given[i])
            snprintf(dst[i], sizeof c->clients, "%s", given[i]);
        else
            snprintf(dst[i], sizeof c->clients, "ipc://%.250s/%s.sock", c->dir, sock[i]);
    }
    c->keys = o->keys;
    c->admin_ms = o->admin_ms ? o->admin_ms : 1000;
    c->wrap = o->wrap;
}

void cluster_riverd_start(cluster_t *c, const char *const *env)
{
    char *rest[] = {(char *)test_bin("riverd"), "--config", c->cfg, NULL};
    char *argv[16];
    cluster__argv(argv, 16, c->wrap, rest);
    c->pid = test_spawn(argv, c->log, env);
}

void cluster_start(cluster_t *c, const cluster_opts_t *o)
{
    cluster_init(c, o);
    cluster_write_config(c, o);
    cluster_riverd_start(c, NULL);
}

const char *cluster_worker_write(const cluster_t *c, const char *name,
                                 const cluster_worker_opts_t *w)
{
    static char paths[4][400];
    static int k;
    char *path = paths[k++ % 4];
    char seqs[32] = "", level[64] = "", y[8192];
    if (w->max_seqs)
        snprintf(seqs, sizeof seqs, "max_seqs: %d\n", w->max_seqs);
    if (w->log_level)
        snprintf(level, sizeof level, "log_level: %s\n", w->log_level);
    snprintf(y, sizeof y, "riverd: \"%s\"\nmodel: \"%s\"\nthreads: 1\n%s%s%s",
             w->endpoint ? w->endpoint : c->workers, test_abs_path(w->model), seqs, level,
             w->yaml ? w->yaml : "");
    snprintf(path, sizeof paths[0], "%s/%s.yaml", c->dir, name);
    test_write(path, y);
    return path;
}

static void cluster__worker_run(cluster_worker_t *w)
{
    char *rest[] = {(char *)test_bin("river-worker"), "--config", w->cfg, "--id", w->id, NULL};
    char *argv[16];
    cluster__argv(argv, 16, w->wrap, rest);
    w->pid = test_spawn(argv, w->log, NULL);
}

int cluster_worker_spawn(cluster_t *c, const char *id, const char *cfg, const char *log_name,
                         const char *const *wrap)
{
    ck_assert_int_lt(c->n_wk, CLUSTER_MAX_WORKERS);
    int i = c->n_wk++;
    cluster_worker_t *w = &c->wk[i];
    snprintf(w->id, sizeof w->id, "%s", id);
    size_t len = strlen(cfg);
    ck_assert_uint_lt(len, sizeof w->cfg);
    memmove(w->cfg, cfg, len + 1);
    char log[sizeof w->log];
    snprintf(log, sizeof log, "%.250s/%.100s.log", c->dir, log_name ? log_name : id);
    memcpy(w->log, log, sizeof log);
    w->wrap = wrap;
    cluster__worker_run(w);
    return i;
}

int cluster_worker_start(cluster_t *c, const char *id, const cluster_worker_opts_t *w)
{
    const char *cfg = cluster_worker_write(c, w->cfg_name ? w->cfg_name : id, w);
    return cluster_worker_spawn(c, id, cfg, w->log_name, w->wrap);
}

void cluster_worker_restart(cluster_t *c, int i)
{
    ck_assert_int_lt(i, c->n_wk);
    cluster__worker_run(&c->wk[i]);
}

river_admin_t *cluster_admin(const cluster_t *c)
{
    river_admin_t *a;
    int rc = c->keys ? river_admin_new_secure(&a, c->admin, c->admin_ms, c->keys)
                     : river_admin_new(&a, c->admin, c->admin_ms);
    ck_assert_msg(rc == 0, "admin: %s", river_err_detail());
    return a;
}

int cluster_ready_workers(const cluster_t *c)
{
    river_admin_t *a = cluster_admin(c);
    river_status_t st;
    int rc = river_admin_status(a, &st);
    river_admin_destroy(&a);
    return rc < 0 ? -1 : (int)st.workers_ready;
}

int cluster_wait_ready(const cluster_t *c, int n, int ms)
{
    double until = clock_now_s() + ms / 1000.0;
    while (clock_now_s() < until) {
        if (cluster_ready_workers(c) == n)
            return 1;
        test_sleep_ms(20);
    }
    return 0;
}

const char *cluster_worker_state(const cluster_t *c, const char *id, char *addr, size_t cap)
{
    static char state[32];
    state[0] = '\0';
    if (addr)
        addr[0] = '\0';
    river_admin_t *a = cluster_admin(c);
    river_worker_info_t *w;
    size_t n;
    if (river_admin_workers(a, &w, &n) == 0) {
        for (size_t i = 0; i < n; i++)
            if (!strcmp(w[i].id, id)) {
                snprintf(state, sizeof state, "%s", w[i].state);
                if (addr)
                    snprintf(addr, cap, "%s", w[i].address);
            }
        free(w);
    }
    river_admin_destroy(&a);
    return state;
}

double cluster_wait_state(const cluster_t *c, const char *id, const char *state, int ms)
{
    double t0 = clock_now_s(), until = t0 + ms / 1000.0;
    while (clock_now_s() < until) {
        if (!strcmp(cluster_worker_state(c, id, NULL, 0), state))
            return clock_now_s() - t0;
        test_sleep_ms(10);
    }
    return -1;
}

void cluster_riverd_stop(cluster_t *c)
{
    if (c->pid <= 0)
        return;
    kill(c->pid, SIGTERM);
    int st = 0, ended = test_wait_exit(c->pid, 15000, &st);
    if (!ended)
        test_kill(&c->pid, SIGKILL);
    c->pid = 0;
    ck_assert_msg(ended, "riverd did not stop on SIGTERM; see %s", c->log);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "riverd ended with status %d; see %s",
                  st, c->log);
}

void cluster_stop(cluster_t *c)
{
    for (int i = 0; i < c->n_wk; i++)
        if (c->wk[i].pid > 0) {
            kill(c->wk[i].pid, SIGCONT);
            test_kill(&c->wk[i].pid, SIGKILL);
        }
    cluster_riverd_stop(c);
}

void cluster_kill(cluster_t *c, int sig)
{
    for (int i = 0; i < c->n_wk; i++)
        test_kill(&c->wk[i].pid, sig);
    test_kill(&c->pid, sig);
}

void cluster_keygen(const char *dir, const char *name, char *pub)
{
    char *plain[] = {(char *)test_bin("riverctl"), "keygen", (char *)name, "--dir",
                     (char *)dir, NULL};
    char *json[] = {(char *)test_bin("riverctl"), "--output", "json", "keygen",
                    (char *)name, "--dir", (char *)dir, NULL};
    char *out;
    ck_assert_msg(test_capture(pub ? json : plain, NULL, 1, &out) == 0, "keygen %s: %s", name,
                  out);
    if (pub) {
        json_error_t je;
        json_t *o = json_loads(out, 0, &je);
        ck_assert_msg(o, "keygen output: %s", out);
        const char *k = json_string_value(json_object_get(o, "public_key"));
        ck_assert_ptr_nonnull(k);
        ck_assert_uint_eq(strlen(k), KEYS_Z85_LEN);
        memcpy(pub, k, KEYS_Z85_LEN + 1);
        json_decref(o);
    }
    free(out);
}

void cluster_copy(const char *from, const char *to)
{
    size_t len;
    char *text = test_read_file(from, &len);
    ck_assert_msg(text, "%s", from);
    test_write(to, text);
    free(text);
}
