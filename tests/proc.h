/* Time, file and process helpers for the suites that run River's programs as real
 * processes (test_serving, test_faults, test_auth, test_split, test_worker). Each of those
 * suites used to carry its own copy of these; they live here once so that a fix (an EINTR
 * that was not retried, a child that outlived a failed test) reaches all of them.
 *
 * Every helper that can fail in a way the test cannot go on from fails the test (a Check
 * assertion) rather than returning an error; the ones that wait return whether what they
 * waited for happened, and leave the verdict to the test. */
#ifndef RIVER_TESTS_PROC_H
#define RIVER_TESTS_PROC_H

#include <stdint.h>
#include <sys/types.h>

/* ---- Time ---- */

/* Sleeps ms milliseconds, the whole time even when a signal interrupts it. */
void test_sleep_ms(int ms);

/* ---- Files ---- */

/* The absolute path of rel (which must exist), in one of a few rotating static buffers:
 * a configuration file under the test's directory names the model by it. */
const char *test_abs_path(const char *rel);
/* Writes text to path, replacing what was there. */
void test_write(const char *path, const char *text);
/* Whether the file at path holds text, reading it again every 50 ms for up to ms: a
 * process logs asynchronously, so the line may not be there yet. */
int test_log_has(const char *path, const char *text, int ms);
/* Removes path and everything under it. */
void test_remove_tree(const char *path);

/* ---- Processes ---- */

/* Runs argv (argv[0] a path) to its end with its stdout, and its stderr too when
 * merge_stderr, in *out (malloc'd, NUL-terminated; the caller frees it). env: NAME=VALUE
 * entries added to the child's environment, NULL-terminated, or NULL. Returns the exit
 * status as test_exit_code does. */
int test_capture(char *const argv[], const char *const *env, int merge_stderr, char **out);
/* test_capture for a program that must end within limit_ms: one still running then has
 * every thread's stack written to the test's stderr (through gdb where it is installed,
 * else each thread's kernel wait and system call from /proc), is killed, and the test fails
 * there, so that a hang is reported where it happened and with what it waited on. */
int test_capture_within(char *const argv[], const char *const *env, int merge_stderr,
                        int limit_ms, char **out);
/* Starts argv (argv[0] a path) with its stdout and stderr appended to log (NULL: the test's
 * own), env as for test_capture. The child is killed when the test's process ends, however
 * it ends. */
pid_t test_spawn(char *const argv[], const char *log, const char *const *env);
/* Whether pid ended within ms; then it is reaped and *status (may be NULL) receives its
 * wait status. */
int test_wait_exit(pid_t pid, int ms, int *status);
/* pid's exit code (test_exit_code) when it ends within ms, reaped; -1 while it runs. */
int test_wait_code(pid_t pid, int ms);
/* Sends sig (one that ends the process: the reaping waits for it) to *pid and reaps it,
 * then sets *pid to 0; nothing when *pid is 0 or less. */
void test_kill(pid_t *pid, int sig);
/* A wait status as one number: the exit code, or 128 + the signal that ended it, as a
 * shell reports it. */
int test_exit_code(int status);

#endif
