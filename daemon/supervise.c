/* Local workers: riverd starts river-worker processes itself (config local_workers),
 * restarts one that ends, and changes their number on admin Scale.
 *
 * Each process runs in a slot and is started as
 *     river-worker --config FILE --riverd ENDPOINT --id local-N
 * the endpoint being riverd's own worker endpoint (so the worker's file need not repeat
 * it), the id naming the slot, which is how a Ready links the table entry to the slot. The
 * end of a process is seen at once through SIGCHLD (the signal descriptor in the poll
 * loop), so its requests move to another worker without waiting for missed heartbeats.
 * A worker that dies young is restarted after a growing pause, so that one that cannot
 * start does not spin. */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/err.h"
#include "daemon/riverd.h"

/* Pause before restarting a worker, doubling while it keeps dying within
 * SUPERVISE_YOUNG_MS of its start. */
#define SUPERVISE_BACKOFF_MIN_MS 100
#define SUPERVISE_BACKOFF_MAX_MS 30000
#define SUPERVISE_YOUNG_MS 10000

typedef struct slot {
    int num;              /* local-<num>; w->slot holds it */
    char *config;         /* the worker's configuration file */
    char id[32];
    pid_t pid;            /* 0: no process */
    int64_t started_ms;
    int64_t restart_at_ms;
    int64_t backoff_ms;
    int restarts;
    bool retiring;        /* scaled away: drain, stop, do not restart */
    bool term_sent;
    worker_t *w;
} slot_t;

struct supervise {
    slot_t **slots;
    int n, cap;
    int next_num;
    char bin[PATH_MAX];
    char config_dir[PATH_MAX];
    char endpoint[256];
};

static slot_t *supervise__by_num(supervise_t *s, int num)
{
    for (int i = 0; s && i < s->n; i++)
        if (s->slots[i]->num == num)
            return s->slots[i];
    return NULL;
}

/* The worker binary: $RIVER_WORKER_BIN, else river-worker beside riverd, else PATH. */
static void supervise__find_bin(supervise_t *s)
{
    const char *env = getenv("RIVER_WORKER_BIN");
    if (env && env[0]) {
        snprintf(s->bin, sizeof s->bin, "%s", env);
        return;
    }
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n > 0) {
        self[n] = '\0';
        char *slash = strrchr(self, '/');
        if (slash) {
            *slash = '\0';
            snprintf(s->bin, sizeof s->bin, "%.*s/river-worker", (int)(sizeof s->bin - 16),
                     self);
            if (access(s->bin, X_OK) == 0)
                return;
        }
    }
    snprintf(s->bin, sizeof s->bin, "river-worker");
}

static slot_t *supervise__add(supervise_t *s, const char *config)
{
    if (s->n == s->cap) {
        int cap = s->cap ? 2 * s->cap : 8;
        slot_t **v = realloc(s->slots, (size_t)cap * sizeof *v);
        if (!v)
            return NULL;
        s->slots = v;
        s->cap = cap;
    }
    slot_t *sl = calloc(1, sizeof *sl);
    if (!sl)
        return NULL;
    /* Relative worker configurations are relative to riverd's own file, so that the
     * pair works from any directory (systemd starts riverd in /). */
    if (config[0] == '/' || !s->config_dir[0])
        sl->config = strdup(config);
    else if (asprintf(&sl->config, "%s/%s", s->config_dir, config) < 0)
        sl->config = NULL;
    if (!sl->config) {
        free(sl);
        return NULL;
    }
    sl->num = ++s->next_num;
    snprintf(sl->id, sizeof sl->id, "local-%d", sl->num);
    s->slots[s->n++] = sl;
    return sl;
}

static void supervise__remove(supervise_t *s, slot_t *sl)
{
    if (sl->w)
        sl->w->slot = -1;
    for (int i = 0; i < s->n; i++) {
        if (s->slots[i] == sl) {
            memmove(&s->slots[i], &s->slots[i + 1], (size_t)(s->n - i - 1) * sizeof *s->slots);
            s->n--;
            break;
        }
    }
    free(sl->config);
    free(sl);
}

static int supervise__spawn(supervise_t *s, slot_t *sl)
{
    /* Everything the child needs is built before fork: between fork and exec only
     * async-signal-safe calls are allowed, and riverd has ZMQ threads. */
    char *argv[] = {s->bin,      (char *)"--config", sl->config, (char *)"--riverd",
                    s->endpoint, (char *)"--id",     sl->id,     NULL};
    sigset_t none;
    sigemptyset(&none);
    pid_t parent = getpid();

    pid_t pid = fork();
    if (pid < 0)
        return river_err_set(RIVER_ESYS, "fork: %s", strerror(errno));
    if (pid == 0) {
        /* The child: riverd's blocked signals would be inherited through exec. A worker
         * must not outlive riverd by accident (it would hold its device), so it gets
         * SIGTERM when riverd goes. _exit, not exit: the child must not run riverd's
         * atexit handlers or flush its stdio buffers a second time. */
        sigprocmask(SIG_SETMASK, &none, NULL);
        signal(SIGPIPE, SIG_DFL);
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() != parent)
            _exit(1);
        if (strchr(argv[0], '/'))
            execv(argv[0], argv);
        else
            execvp(argv[0], argv);
        _exit(127);
    }
    sl->pid = pid;
    sl->started_ms = clock_now_ms();
    sl->term_sent = false;
    log_info("started worker %s: %s --config %s --riverd %s (pid %d)", sl->id, s->bin,
             sl->config, s->endpoint, (int)pid);
    return 0;
}

int supervise_new(riverd_t *rd, supervise_t **out)
{
    *out = NULL;
    supervise_t *s = calloc(1, sizeof *s);
    if (!s)
        return river_err_set(RIVER_ENOMEM, "supervisor");
    supervise__find_bin(s);
    snprintf(s->endpoint, sizeof s->endpoint, "%s", rd->worker_endpoint);
    if (rd->config_path) {
        const char *slash = strrchr(rd->config_path, '/');
        if (slash)
            snprintf(s->config_dir, sizeof s->config_dir, "%.*s", (int)(slash - rd->config_path),
                     rd->config_path);
    }
    const config_local_workers_t *lw = rd->cfg.local_workers.v;
    for (int e = 0; e < rd->cfg.local_workers.n; e++)
        for (int i = 0; i < lw[e].count; i++) {
            slot_t *sl = supervise__add(s, lw[e].config);
            if (!sl) {
                supervise_destroy(rd, &s, 0);
                return river_err_set(RIVER_ENOMEM, "supervisor slot");
            }
            int rc = supervise__spawn(s, sl);
            if (rc < 0) {
                supervise_destroy(rd, &s, 1000);
                return rc;
            }
        }
    *out = s;
    return 0;
}

void supervise_destroy(riverd_t *rd, supervise_t **ps, int64_t wait_ms)
{
    supervise_t *s = ps ? *ps : NULL;
    if (!s)
        return;
    for (int i = 0; i < s->n; i++)
        if (s->slots[i]->pid > 0 && kill(s->slots[i]->pid, SIGTERM) != 0 && errno != ESRCH)
            log_warn("kill %d: %s", (int)s->slots[i]->pid, strerror(errno));
    int64_t until = clock_now_ms() + wait_ms;
    for (;;) {
        int left = 0;
        for (int i = 0; i < s->n; i++) {
            slot_t *sl = s->slots[i];
            if (sl->pid > 0 && waitpid(sl->pid, NULL, WNOHANG) != 0)
                sl->pid = 0;
            left += sl->pid > 0;
        }
        if (!left)
            break;
        if (clock_now_ms() >= until) {
            for (int i = 0; i < s->n; i++) {
                slot_t *sl = s->slots[i];
                if (sl->pid > 0) {
                    log_warn("worker %s (pid %d) did not stop; killing it", sl->id,
                             (int)sl->pid);
                    kill(sl->pid, SIGKILL);
                    waitpid(sl->pid, NULL, 0);
                    sl->pid = 0;
                }
            }
            break;
        }
        usleep(10000);
    }
    while (s->n)
        supervise__remove(s, s->slots[s->n - 1]);
    free(s->slots);
    free(s);
    *ps = NULL;
}

void supervise_reap(riverd_t *rd)
{
    supervise_t *s = rd->sup;
    int st;
    pid_t pid;
    while ((pid = waitpid(-1, &st, WNOHANG)) > 0) {
        slot_t *sl = NULL;
        for (int i = 0; s && i < s->n && !sl; i++)
            if (s->slots[i]->pid == pid)
                sl = s->slots[i];
        if (!sl)
            continue;
        char how[64];
        if (WIFEXITED(st))
            snprintf(how, sizeof how, "exited with status %d", WEXITSTATUS(st));
        else if (WIFSIGNALED(st))
            snprintf(how, sizeof how, "killed by signal %d", WTERMSIG(st));
        else
            snprintf(how, sizeof how, "ended");
        int64_t now = clock_now_ms();
        sl->pid = 0;
        worker_t *w = sl->w;
        if (w) {
            /* A drained worker that left is done, not dead. */
            if (w->state == WORKER_DRAINING && !w->reqs)
                workers_forget(rd, w);
            else
                workers_mark_dead(rd, w, how);
        }
        if (sl->retiring || rd->draining) {
            log_info("worker %s (pid %d) %s", sl->id, (int)pid, how);
            if (sl->retiring)
                supervise__remove(s, sl);
            continue;
        }
        if (now - sl->started_ms < SUPERVISE_YOUNG_MS)
            sl->backoff_ms = sl->backoff_ms ? sl->backoff_ms * 2 : SUPERVISE_BACKOFF_MIN_MS;
        else
            sl->backoff_ms = SUPERVISE_BACKOFF_MIN_MS;
        if (sl->backoff_ms > SUPERVISE_BACKOFF_MAX_MS)
            sl->backoff_ms = SUPERVISE_BACKOFF_MAX_MS;
        sl->restart_at_ms = now + sl->backoff_ms;
        sl->restarts++;
        log_warn("worker %s (pid %d) %s; restarting it in %lld ms", sl->id, (int)pid, how,
                 (long long)sl->backoff_ms);
    }
}

void supervise_tick(riverd_t *rd, int64_t now)
{
    supervise_t *s = rd->sup;
    for (int i = 0; s && i < s->n; i++) {
        slot_t *sl = s->slots[i];
        if (!sl->pid && !sl->retiring && !rd->draining && now >= sl->restart_at_ms) {
            if (supervise__spawn(s, sl) < 0) {
                log_error("cannot start worker %s: %s", sl->id, river_err_detail());
                sl->backoff_ms = SUPERVISE_BACKOFF_MAX_MS;
                sl->restart_at_ms = now + sl->backoff_ms;
            }
            continue;
        }
        /* A drained worker may idle instead of leaving; a supervised one is stopped so
         * that its slot starts a fresh process (or goes away, when scaled down). */
        worker_t *w = sl->w;
        if (sl->pid && w && w->state == WORKER_DRAINING && !w->reqs && !w->running &&
            !sl->term_sent) {
            sl->term_sent = true;
            if (kill(sl->pid, SIGTERM) != 0 && errno != ESRCH)
                log_warn("kill %d: %s", (int)sl->pid, strerror(errno));
        }
    }
}

int64_t supervise_next_ms(riverd_t *rd, int64_t now)
{
    supervise_t *s = rd->sup;
    int64_t next = 0;
    for (int i = 0; s && i < s->n; i++) {
        slot_t *sl = s->slots[i];
        if (!sl->pid && !sl->retiring && !rd->draining &&
            (!next || sl->restart_at_ms < next))
            next = sl->restart_at_ms;
    }
    return next;
}

void supervise_on_ready(riverd_t *rd, worker_t *w)
{
    supervise_t *s = rd->sup;
    for (int i = 0; s && i < s->n; i++) {
        slot_t *sl = s->slots[i];
        if (sl->pid && !strcmp(sl->id, w->id)) {
            if (sl->w && sl->w != w)
                sl->w->slot = -1;
            sl->w = w;
            w->slot = sl->num;
            return;
        }
    }
}

void supervise_on_forget(riverd_t *rd, worker_t *w)
{
    slot_t *sl = w->slot >= 0 ? supervise__by_num(rd->sup, w->slot) : NULL;
    if (sl && sl->w == w)
        sl->w = NULL;
    w->slot = -1;
}

void supervise_kill(riverd_t *rd, worker_t *w)
{
    slot_t *sl = w->slot >= 0 ? supervise__by_num(rd->sup, w->slot) : NULL;
    if (sl && sl->w == w && sl->pid > 0) {
        log_warn("killing worker %s (pid %d): it stopped answering", sl->id, (int)sl->pid);
        if (kill(sl->pid, SIGKILL) != 0 && errno != ESRCH)
            log_warn("kill %d: %s", (int)sl->pid, strerror(errno));
    }
}

int supervise_target(riverd_t *rd)
{
    int n = 0;
    for (int i = 0; rd->sup && i < rd->sup->n; i++)
        n += !rd->sup->slots[i]->retiring;
    return n;
}

int supervise_scale(riverd_t *rd, int target, int *previous)
{
    supervise_t *s = rd->sup;
    int active = supervise_target(rd);
    *previous = active;
    if (target < 0)
        return river_err_set(RIVER_EINVAL, "scale: %d workers", target);
    if (rd->draining)
        return river_err_set(RIVER_ESTATE, "riverd is shutting down");
    if (target > active && (!s || rd->cfg.local_workers.n == 0))
        return river_err_set(RIVER_ESTATE,
                             "no local_workers in the configuration: riverd does not know "
                             "how to start a worker");
    /* New workers use the last configured entry's file. */
    const config_local_workers_t *lw = rd->cfg.local_workers.v;
    while (active < target) {
        slot_t *sl = supervise__add(s, lw[rd->cfg.local_workers.n - 1].config);
        if (!sl)
            return river_err_set(RIVER_ENOMEM, "supervisor slot");
        int rc = supervise__spawn(s, sl);
        if (rc < 0) {
            supervise__remove(s, sl);
            return rc;
        }
        active++;
    }
    /* Fewer: the newest go first, by drain so that their requests finish. */
    for (int i = s ? s->n - 1 : -1; i >= 0 && active > target; i--) {
        slot_t *sl = s->slots[i];
        if (sl->retiring)
            continue;
        sl->retiring = true;
        active--;
        if (sl->w && sl->w->state != WORKER_DEAD) {
            workers_drain(rd, sl->w, 0);
        } else if (sl->pid > 0) {
            if (kill(sl->pid, SIGTERM) != 0 && errno != ESRCH)
                log_warn("kill %d: %s", (int)sl->pid, strerror(errno));
        } else {
            supervise__remove(s, sl);
        }
    }
    log_info("scale: %d local workers (was %d)", target, *previous);
    return 0;
}

int supervise_starting(riverd_t *rd, const char **ids, int max)
{
    int n = 0;
    for (int i = 0; rd->sup && i < rd->sup->n; i++) {
        slot_t *sl = rd->sup->slots[i];
        if (sl->pid > 0 && !sl->w) {
            if (ids && n < max)
                ids[n] = sl->id;
            n++;
        }
    }
    return n;
}

bool supervise_expecting(riverd_t *rd)
{
    for (int i = 0; rd->sup && i < rd->sup->n; i++)
        if (!rd->sup->slots[i]->retiring)
            return true;
    return false;
}
