/* Time, file and process helpers for the suites that run River's programs as processes;
 * tests/proc.h says what each does. */
#include "tests/proc.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "tests/testutil.h"

/* ---- Time ---- */

void test_sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) && errno == EINTR) {
    }
}

/* ---- Files ---- */

/* Rotating buffers, so that a caller can hold a few paths at once (a snprintf with two
 * of them, say) without copying. */
const char *test_abs_path(const char *rel)
{
    static char out[4][PATH_MAX];
    static int k;
    char *p = out[k++ % 4];
    ck_assert_msg(realpath(rel, p), "%s: %s", rel, strerror(errno));
    return p;
}

void test_write(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    ck_assert_msg(f, "%s: %s", path, strerror(errno));
    fputs(text, f);
    ck_assert_int_eq(fclose(f), 0);
}

int test_log_has(const char *path, const char *text, int ms)
{
    double until = clock_now_s() + ms / 1000.0;
    do {
        size_t len;
        char *log = test_read_file(path, &len);
        int found = log && strstr(log, text);
        free(log);
        if (found)
            return 1;
        test_sleep_ms(50);
    } while (clock_now_s() < until);
    return 0;
}

static int proc__rm(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

/* The suites call this on their test directory at the end of a test that passed. Check
 * ends a test's process without running its exit handlers, so testutil's own removal of
 * that directory does not happen there; a test that fails never gets here, and its logs
 * stay for whoever reads the failure. */
void test_remove_tree(const char *path)
{
    nftw(path, proc__rm, 16, FTW_DEPTH | FTW_PHYS);
}

/* ---- Processes ---- */

int test_exit_code(int status)
{
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* In the child, after fork: adds the env entries (they stay valid, the child has its own
 * copy of the parent's memory) and executes argv; 127 when it cannot. */
static void proc__exec(char *const argv[], const char *const *env)
{
    for (int i = 0; env && env[i]; i++)
        putenv((char *)env[i]);
    execv(argv[0], argv);
    _exit(127);
}

/* In the child, after fork: nothing a test starts outlives it, even a test that fails
 * half-way or runs out of time. The parent may have died before prctl took effect, which
 * the death signal would then miss. */
static void proc__die_with(pid_t parent)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent)
        _exit(126);
}

/* Writes to stderr what every thread of pid is doing: gdb's backtraces where gdb is
 * installed (a parent may attach to its child), else each thread's name, state, kernel wait
 * channel and system call from /proc. */
static void proc__describe(pid_t pid)
{
    char cmd[256];
    fprintf(stderr, "---- process %d, still running: its threads ----\n", (int)pid);
    fflush(stderr);
    if (access("/usr/bin/gdb", X_OK) == 0) {
        snprintf(cmd, sizeof cmd,
                 "/usr/bin/gdb -batch -nx -p %d -ex 'thread apply all bt' 1>&2 2>/dev/null",
                 (int)pid);
        if (system(cmd) == 0)
            return;
    }
    snprintf(cmd, sizeof cmd,
             "for t in /proc/%d/task/*; do echo \"$(cat $t/comm) $(cut -d' ' -f3 $t/stat) "
             "wchan=$(cat $t/wchan) syscall=$(cat $t/syscall 2>&1)\"; done 1>&2",
             (int)pid);
    if (system(cmd) != 0)
        fprintf(stderr, "(its threads could not be read)\n");
}

int test_capture(char *const argv[], const char *const *env, int merge_stderr, char **out)
{
    return test_capture_within(argv, env, merge_stderr, 0, out);
}

int test_capture_within(char *const argv[], const char *const *env, int merge_stderr,
                        int limit_ms, char **out)
{
    int fd[2];
    ck_assert_int_eq(pipe(fd), 0);
    pid_t parent = getpid();
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        proc__die_with(parent);
        dup2(fd[1], 1);
        if (merge_stderr)
            dup2(fd[1], 2);
        close(fd[0]);
        close(fd[1]);
        proc__exec(argv, env);
    }
    close(fd[1]);
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    ck_assert_ptr_nonnull(buf);
    double until = clock_now_s() + limit_ms / 1000.0;
    ssize_t r;
    for (;;) {
        if (limit_ms > 0) {
            int left = (int)((until - clock_now_s()) * 1000.0);
            struct pollfd p = {.fd = fd[0], .events = POLLIN};
            int ready = left > 0 ? poll(&p, 1, left) : 0;
            if (ready < 0 && errno == EINTR)
                continue;
            if (ready == 0) {
                proc__describe(pid);
                kill(pid, SIGKILL);
                waitpid(pid, NULL, 0);
                buf[len] = '\0';
                ck_abort_msg("%s did not end within %d ms (its threads are on stderr); it had "
                             "written: %.300s", argv[0], limit_ms, buf);
            }
        }
        r = read(fd[0], buf + len, cap - len - 1);
        if (r == 0)
            break;
        if (r < 0) {
            if (errno == EINTR)
                continue;
            break;
        }
        len += (size_t)r;
        if (cap - len < 1024) {
            buf = realloc(buf, cap *= 2);
            ck_assert_ptr_nonnull(buf);
        }
    }
    buf[len] = '\0';
    close(fd[0]);
    int st;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    *out = buf;
    return test_exit_code(st);
}

pid_t test_spawn(char *const argv[], const char *log, const char *const *env)
{
    pid_t parent = getpid();
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        proc__die_with(parent);
        if (log) {
            int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
            if (fd >= 0) {
                dup2(fd, 1);
                dup2(fd, 2);
                close(fd);
            }
        }
        proc__exec(argv, env);
    }
    return pid;
}

/* Polls rather than blocking so that the wait has a limit; waitpid failing (a pid that is
 * not this process's child, or was reaped already) is a mistake in the test. */
int test_wait_exit(pid_t pid, int ms, int *status)
{
    double until = clock_now_s() + ms / 1000.0;
    do {
        int st;
        pid_t r = waitpid(pid, &st, WNOHANG);
        ck_assert_msg(r >= 0 || errno == EINTR, "waitpid %d: %s", (int)pid, strerror(errno));
        if (r == pid) {
            if (status)
                *status = st;
            return 1;
        }
        test_sleep_ms(10);
    } while (clock_now_s() < until);
    return 0;
}

int test_wait_code(pid_t pid, int ms)
{
    int st;
    return test_wait_exit(pid, ms, &st) ? test_exit_code(st) : -1;
}

/* The kill must succeed: *pid is this process's child that was not reaped yet (a zombie
 * still takes signals), so a failure means the test lost track of it. */
void test_kill(pid_t *pid, int sig)
{
    if (*pid > 0) {
        ck_assert_int_eq(kill(*pid, sig), 0);
        waitpid(*pid, NULL, 0);
        *pid = 0;
    }
}
