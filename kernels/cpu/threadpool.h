/* A persistent thread pool for the CPU backend.
 *
 * threadpool_run() hands n_tasks numbered tasks to the workers and to the calling thread,
 * which takes part, and returns when all of them have run. Workers pick tasks from a shared
 * counter, so uneven tasks balance themselves. Between runs a worker spins briefly on a
 * generation counter (a run a few microseconds after the previous one starts at once) and
 * then sleeps on a futex. A pool of one thread creates no thread and runs tasks inline. */
#ifndef RIVER_KERNELS_CPU_THREADPOOL_H
#define RIVER_KERNELS_CPU_THREADPOOL_H

typedef struct threadpool threadpool_t;

/* One task: `task` is its number (0..n_tasks-1), `thread` the index of the thread running it
 * (0 is the caller of threadpool_run, 1..n_threads-1 the workers), for per-thread scratch. */
typedef void (*threadpool_fn_t)(void *arg, int task, int thread);

/* Creates a pool of n_threads threads in all, the caller included (n_threads >= 1). */
int threadpool_new(threadpool_t **out, int n_threads);
void threadpool_destroy(threadpool_t **pool);

int threadpool_threads(const threadpool_t *pool);

/* Runs fn(arg, t, thread) once for every t in 0..n_tasks-1 and waits for all of them. Not
 * reentrant: one run at a time per pool, from one thread at a time. */
void threadpool_run(threadpool_t *pool, threadpool_fn_t fn, void *arg, int n_tasks);

#endif
