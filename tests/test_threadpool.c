/* The thread pool: every task of every run executes exactly once, on a valid thread, for
 * pools smaller and larger than the task count, back to back (workers spinning) and with
 * pauses between runs (workers asleep on the futex). */
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#include "common/err.h"
#include "kernels/cpu/threadpool.h"
#include "tests/testutil.h"

/* Checks inside long loops: Check records every passing ck_assert (a write to its log), so
 * hot loops only call into it on failure. */
#define EXPECT(cond, ...)                                                                    \
    do {                                                                                     \
        if (!(cond))                                                                         \
            ck_abort_msg(__VA_ARGS__);                                                       \
    } while (0)
#define EXPECT_TRUE(cond) EXPECT(cond, "assertion '%s' failed", #cond)

typedef struct count_job {
    _Atomic int *hits;   /* per task */
    _Atomic int bad_thread;
    _Atomic int *per_thread; /* tasks run by each thread */
    int n_threads;
    int spin;            /* busy work per task, to let tasks overlap */
} count_job_t;

static void count_task(void *arg, int task, int thread)
{
    count_job_t *j = arg;
    if (thread < 0 || thread >= j->n_threads)
        atomic_fetch_add(&j->bad_thread, 1);
    else
        atomic_fetch_add(&j->per_thread[thread], 1);
    volatile int sink = 0;
    for (int i = 0; i < j->spin; i++)
        sink += i;
    atomic_fetch_add(&j->hits[task], 1);
}

/* Runs `runs` runs of n_tasks tasks and checks the counts after each. */
static void check_runs(threadpool_t *pool, int n_tasks, int runs, int spin, long pause_ns)
{
    int nt = threadpool_threads(pool);
    count_job_t j = { .n_threads = nt, .spin = spin };
    j.hits = calloc((size_t)(n_tasks ? n_tasks : 1), sizeof *j.hits);
    j.per_thread = calloc((size_t)nt, sizeof *j.per_thread);
    ck_assert(j.hits && j.per_thread);
    for (int r = 0; r < runs; r++) {
        threadpool_run(pool, count_task, &j, n_tasks);
        for (int t = 0; t < n_tasks; t++)
            EXPECT(atomic_load(&j.hits[t]) == r + 1,
                          "%d threads, %d tasks, run %d: task %d ran %d times", nt, n_tasks, r,
                          t, atomic_load(&j.hits[t]) - r);
        if (pause_ns) {
            struct timespec ts = { 0, pause_ns };
            nanosleep(&ts, NULL);
        }
    }
    ck_assert_int_eq(atomic_load(&j.bad_thread), 0);
    long total = 0;
    for (int t = 0; t < nt; t++)
        total += atomic_load(&j.per_thread[t]);
    ck_assert_int_eq(total, (long)n_tasks * runs);
    free(j.hits);
    free(j.per_thread);
}

START_TEST(test_exactly_once)
{
    static const int task_counts[] = { 0, 1, 2, 3, 5, 17, 100, 1000 };
    int n_threads = 1 + _i; /* 1..4: fewer and more threads than tasks, and than cores */
    threadpool_t *pool = NULL;
    ck_assert_int_eq(threadpool_new(&pool, n_threads), 0);
    ck_assert_int_eq(threadpool_threads(pool), n_threads);
    for (size_t c = 0; c < sizeof task_counts / sizeof task_counts[0]; c++) {
        check_runs(pool, task_counts[c], 2000, 0, 0);
        check_runs(pool, task_counts[c], 50, 2000, 0);
    }
    threadpool_destroy(&pool);
    ck_assert_ptr_null(pool);
}
END_TEST

START_TEST(test_sleeping_workers)
{
    /* Pauses longer than the spin phase put the workers to sleep before each run. */
    threadpool_t *pool = NULL;
    ck_assert_int_eq(threadpool_new(&pool, 2 + _i), 0);
    check_runs(pool, 7, 20, 100, 3000000);
    check_runs(pool, 1, 5, 0, 3000000);
    check_runs(pool, 64, 20, 1000, 1500000);
    threadpool_destroy(&pool);
}
END_TEST

typedef struct sum_job {
    const int *data;
    long long *partial;
    int n, n_tasks;
} sum_job_t;

static void sum_task(void *arg, int task, int thread)
{
    (void)thread;
    sum_job_t *j = arg;
    long long s = 0;
    for (int i = j->n * task / j->n_tasks; i < j->n * (task + 1) / j->n_tasks; i++)
        s += j->data[i];
    j->partial[task] = s;
}

START_TEST(test_results_visible)
{
    /* Plain (non-atomic) writes of the tasks are visible to the caller after the run. */
    threadpool_t *pool = NULL;
    ck_assert_int_eq(threadpool_new(&pool, 2), 0);
    int n = 100000;
    int *data = malloc((size_t)n * sizeof(int));
    long long want = 0;
    for (int i = 0; i < n; i++) {
        data[i] = i % 97;
        want += data[i];
    }
    long long partial[8];
    for (int r = 0; r < 500; r++) {
        sum_job_t j = { .data = data, .partial = partial, .n = n, .n_tasks = 1 + r % 8 };
        for (int t = 0; t < 8; t++)
            partial[t] = -1;
        threadpool_run(pool, sum_task, &j, j.n_tasks);
        long long got = 0;
        for (int t = 0; t < j.n_tasks; t++)
            got += partial[t];
        EXPECT(got == want, "sum %lld, want %lld", got, want);
    }
    free(data);
    threadpool_destroy(&pool);
}
END_TEST

/* Runs whose task count alternates between small and large, each with its own job: a
 * worker that finished the small run late must not claim a task of the large one through
 * its stale view of the small run (it would run that task twice, or with the old job, and
 * let the caller return before the large run is done). Each job counts its own tasks and
 * has room past its count, so a task run for the wrong job shows up too. */
typedef struct grow_job {
    _Atomic int hits[64];
} grow_job_t;

static void grow_task(void *arg, int task, int thread)
{
    (void)thread;
    grow_job_t *j = arg;
    atomic_fetch_add_explicit(&j->hits[task], 1, memory_order_relaxed);
}

START_TEST(test_growing_runs)
{
    threadpool_t *pool = NULL;
    ck_assert_int_eq(threadpool_new(&pool, 2 + _i), 0);
    grow_job_t *jobs = calloc(2, sizeof *jobs);
    ck_assert_ptr_nonnull(jobs);
    for (int r = 0; r < 200000; r++) {
        grow_job_t *j = &jobs[r & 1];
        int n = (r & 1) ? 48 : 1 + r % 3;
        for (int t = 0; t < 64; t++)
            atomic_store_explicit(&j->hits[t], 0, memory_order_relaxed);
        threadpool_run(pool, grow_task, j, n);
        for (int t = 0; t < 64; t++) {
            int h = atomic_load_explicit(&j->hits[t], memory_order_relaxed);
            EXPECT(h == (t < n), "run %d of %d tasks: task %d ran %d times", r, n, t, h);
        }
    }
    free(jobs);
    threadpool_destroy(&pool);
}
END_TEST

START_TEST(test_errors)
{
    threadpool_t *pool = NULL;
    ck_assert_int_eq(threadpool_new(&pool, 0), RIVER_EINVAL);
    ck_assert_ptr_null(pool);
    ck_assert_int_eq(threadpool_new(NULL, 2), RIVER_EINVAL);
    threadpool_destroy(&pool);
    threadpool_destroy(NULL);
}
END_TEST

static Suite *threadpool_suite(void)
{
    Suite *s = suite_create("threadpool");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, test_exactly_once, 0, 4);
    tcase_add_loop_test(tc, test_sleeping_workers, 0, 2);
    tcase_add_test(tc, test_results_visible);
    tcase_add_loop_test(tc, test_growing_runs, 0, 3);
    tcase_add_test(tc, test_errors);
    suite_add_tcase(s, tc);
    return s;
}

RIVER_TEST_MAIN(threadpool_suite)
