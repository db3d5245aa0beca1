/* The thread pool: see threadpool.h.
 *
 * A run is published through one 64-bit word holding the run's generation (high half) and
 * the next unclaimed task (low half). Threads claim tasks with a compare-and-swap on that
 * word, so a worker that wakes up late, after the run is over and another one has begun,
 * fails its claim instead of taking a task of the wrong run; and the caller only has to
 * wait for the tasks to finish, not for every worker to notice the run. The job fields (fn,
 * arg) are read only after a successful claim, when the caller is still waiting for that
 * very task and so cannot have overwritten them. */
#include "kernels/cpu/threadpool.h"

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/err.h"

/* How long an idle worker polls before it sleeps: long enough to cover the gap between
 * two ops of a forward pass, short enough not to burn a core when the engine is idle. */
#define POOL_SPIN_NS 1000000L
/* Pure busy-waiting (pause instructions only) lasts this long; after it, waiting threads
 * yield their core between polls. Where threads outnumber cores, a spinning thread would
 * otherwise keep a preempted one (holding the last task) off the core for a whole time
 * slice; on an idle core sched_yield returns at once and costs well under a microsecond. */
#define POOL_PAUSE_NS 20000L
/* The task index of a generation that is being set up: above any task count. */
#define POOL_CLOSED 0xFFFFFFFFu

typedef struct worker {
    threadpool_t *pool;
    int index;
    pthread_t thread;
} worker_t;

struct threadpool {
    int n_threads;
    worker_t *workers; /* n_threads - 1 */
    int n_started;

    /* The job, written by the caller before the run is published. */
    threadpool_fn_t fn;
    void *arg;
    _Atomic int n_tasks; /* read before a claim, possibly while the next run sets it */
    uint32_t gen;      /* the caller's copy of the current generation */

    _Alignas(64) _Atomic uint64_t work;    /* (generation << 32) | next task */
    _Alignas(64) _Atomic uint32_t futex_gen; /* the generation, for workers to wait on */
    _Atomic int sleepers;
    _Atomic int stop;
    _Alignas(64) _Atomic int finished;     /* tasks of this run done */
};

static inline void pool_pause(void)
{
    __builtin_ia32_pause();
}

/* futex(2) on the generation word. Waiting returns early with EAGAIN when the value has
 * already changed and with EINTR on a signal; both are ordinary, and the callers re-check
 * the word in a loop, so the result needs no other handling. */
static void pool_futex_wait(_Atomic uint32_t *addr, uint32_t expected)
{
    long r = syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAIT_PRIVATE, expected, NULL, NULL, 0);
    if (r != 0 && errno != EAGAIN && errno != EINTR) {
        /* Futexes unavailable (seccomp, say): degrade to yielding in the caller's loop. */
        sched_yield();
    }
}

static void pool_futex_wake(_Atomic uint32_t *addr)
{
    long r = syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
    /* A failed wake leaves sleepers sleeping; they re-check after any later wake, and the
     * waits degrade to yielding when futexes do not work at all, so nothing more to do. */
    (void)r;
}

/* Claims and runs tasks of generation g until none is left. */
static void pool_work(threadpool_t *pool, uint32_t g, int thread)
{
    uint64_t w = atomic_load_explicit(&pool->work, memory_order_acquire);
    for (;;) {
        if ((uint32_t)(w >> 32) != g)
            return;
        uint32_t idx = (uint32_t)w;
        /* n_tasks may already belong to a later run when this one is over. The caller
         * closes the old generation in the word before it changes n_tasks (and publishes
         * n_tasks with release, read here with acquire), so a count from the later run
         * always meets a word whose generation has moved on, and the claim below fails. */
        if (idx >= (uint32_t)atomic_load_explicit(&pool->n_tasks, memory_order_acquire))
            return;
        if (atomic_compare_exchange_weak_explicit(&pool->work, &w, w + 1,
                                                  memory_order_acq_rel,
                                                  memory_order_acquire)) {
            pool->fn(pool->arg, (int)idx, thread);
            atomic_fetch_add_explicit(&pool->finished, 1, memory_order_release);
            w = atomic_load_explicit(&pool->work, memory_order_acquire);
        }
    }
}

/* Waits for a generation other than `seen`: spins first, then sleeps. */
static uint32_t pool_wait_gen(threadpool_t *pool, uint32_t seen)
{
    long start = clock_now_ns();
    int yielding = 0;
    for (unsigned i = 1;; i++) {
        uint32_t g = atomic_load_explicit(&pool->futex_gen, memory_order_acquire);
        if (g != seen)
            return g;
        if (yielding)
            sched_yield();
        else
            pool_pause();
        if (yielding || (i & 63) == 0) {
            long waited = clock_now_ns() - start;
            if (waited > POOL_SPIN_NS)
                break;
            yielding = waited > POOL_PAUSE_NS;
        }
    }
    /* Announce the sleep before the final check: the caller bumps the generation and then
     * reads `sleepers` (both sequentially consistent), so either it sees us and wakes us,
     * or we see its new generation here. */
    atomic_fetch_add(&pool->sleepers, 1);
    uint32_t g;
    while ((g = atomic_load(&pool->futex_gen)) == seen)
        pool_futex_wait(&pool->futex_gen, seen);
    atomic_fetch_sub(&pool->sleepers, 1);
    return g;
}

static void *pool_worker_main(void *p)
{
    worker_t *wk = p;
    threadpool_t *pool = wk->pool;
    uint32_t seen = 0;
    for (;;) {
        seen = pool_wait_gen(pool, seen);
        if (atomic_load(&pool->stop))
            break;
        pool_work(pool, seen, wk->index);
    }
    return NULL;
}

static void pool_stop_workers(threadpool_t *pool)
{
    atomic_store(&pool->stop, 1);
    pool->gen++;
    atomic_store(&pool->futex_gen, pool->gen);
    pool_futex_wake(&pool->futex_gen);
    for (int i = 0; i < pool->n_started; i++) {
        int e = pthread_join(pool->workers[i].thread, NULL);
        /* Joining a thread we created and have not joined cannot fail; nothing to undo. */
        (void)e;
    }
    pool->n_started = 0;
}

int threadpool_new(threadpool_t **out, int n_threads)
{
    if (!out || n_threads < 1)
        return river_err_set(RIVER_EINVAL, "threadpool: %d threads", n_threads);
    threadpool_t *pool;
    if (posix_memalign((void **)&pool, 64, sizeof *pool) != 0)
        return RIVER_ENOMEM;
    memset(pool, 0, sizeof *pool);
    pool->n_threads = n_threads;
    atomic_init(&pool->work, 0);
    atomic_init(&pool->futex_gen, 0);
    atomic_init(&pool->sleepers, 0);
    atomic_init(&pool->stop, 0);
    atomic_init(&pool->finished, 0);
    atomic_init(&pool->n_tasks, 0);
    int e = 0;
    if (n_threads > 1) {
        pool->workers = calloc((size_t)n_threads - 1, sizeof *pool->workers);
        if (!pool->workers) {
            e = RIVER_ENOMEM;
            goto fail_pool;
        }
        for (int i = 0; i < n_threads - 1; i++) {
            worker_t *wk = &pool->workers[i];
            wk->pool = pool;
            wk->index = i + 1;
            int pe = pthread_create(&wk->thread, NULL, pool_worker_main, wk);
            if (pe != 0) {
                e = river_err_set(RIVER_ESYS, "threadpool: pthread_create: %s",
                                  strerror(pe));
                goto fail_threads;
            }
            pool->n_started++;
        }
    }
    *out = pool;
    return 0;

fail_threads:
    pool_stop_workers(pool);
    free(pool->workers);
fail_pool:
    free(pool);
    return e;
}

void threadpool_destroy(threadpool_t **pp)
{
    if (!pp || !*pp)
        return;
    threadpool_t *pool = *pp;
    pool_stop_workers(pool);
    free(pool->workers);
    free(pool);
    *pp = NULL;
}

int threadpool_threads(const threadpool_t *pool)
{
    return pool->n_threads;
}

void threadpool_run(threadpool_t *pool, threadpool_fn_t fn, void *arg, int n_tasks)
{
    if (n_tasks <= 0)
        return;
    if (pool->n_threads == 1 || n_tasks == 1) {
        for (int t = 0; t < n_tasks; t++)
            fn(arg, t, 0);
        return;
    }
    /* Close the previous run first: a worker still holding that run's word (with an index
     * at its task count) would otherwise read the new, larger n_tasks, find its stale word
     * still in place and claim a task of this run with the old job's view of it, running
     * one task twice and counting it twice in `finished`. With the new generation already
     * in the word (no task claimable: POOL_CLOSED), that compare-and-swap fails. */
    uint32_t g = ++pool->gen;
    atomic_store_explicit(&pool->work, ((uint64_t)g << 32) | POOL_CLOSED,
                          memory_order_release);
    pool->fn = fn;
    pool->arg = arg;
    atomic_store_explicit(&pool->finished, 0, memory_order_relaxed);
    atomic_store_explicit(&pool->n_tasks, n_tasks, memory_order_release);
    atomic_store_explicit(&pool->work, (uint64_t)g << 32, memory_order_release);
    atomic_store(&pool->futex_gen, g);
    if (atomic_load(&pool->sleepers) > 0)
        pool_futex_wake(&pool->futex_gen);

    pool_work(pool, g, 0);

    if (atomic_load_explicit(&pool->finished, memory_order_acquire) == n_tasks)
        return;
    long start = clock_now_ns();
    int yielding = 0;
    for (unsigned i = 1;; i++) {
        if (atomic_load_explicit(&pool->finished, memory_order_acquire) == n_tasks)
            return;
        /* A worker holding the last task may have lost its core (more runnable threads
         * than cores); stop competing with it after a while. */
        if (yielding)
            sched_yield();
        else
            pool_pause();
        if (!yielding && (i & 63) == 0)
            yielding = clock_now_ns() - start > POOL_PAUSE_NS;
    }
}
