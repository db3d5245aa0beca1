/* cpu_peak_gmacs: the compute peak that prefill is judged against. Prefill is bound by
 * arithmetic, not memory, so its yardstick is how many multiply-adds the cores can retire
 * when nothing else is in the way: every thread runs the level's register-only chains
 * (simd.h: peak_f32, peak_i8) for about PEAK_SECONDS, on the same thread pool the matmuls
 * use. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/err.h"
#include "kernels/cpu/simd.h"
#include "kernels/cpu/threadpool.h"

/* Seconds one pass aims at: long enough that the pool's start and a timer tick do not
 * count, short enough that a benchmark can take several. */
#define PEAK_SECONDS 0.2
/* Rounds of the first, timed, single-thread pass that sizes the others. */
#define PEAK_PROBE_ITERS 200000

typedef struct peak_job {
    const cpu_kernels_t *k;
    cpu_peak_t kind;
    int64_t iters;
    int32_t sink[64]; /* one per task, published afterwards so no chain is dead */
} peak_job_t;

static void peak_task(void *arg, int task, int thread)
{
    (void)thread;
    peak_job_t *j = arg;
    if (j->kind == CPU_PEAK_F32) {
        float f = j->k->peak_f32(j->iters);
        memcpy(&j->sink[task], &f, sizeof f); /* its bits: the value may be any float */
    } else if (j->kind == CPU_PEAK_I8) {
        j->sink[task] = j->k->peak_i8(j->iters);
    } else {
        j->sink[task] = j->k->peak_q8_tile(j->iters);
    }
}

double cpu_peak_gmacs(int n_threads, cpu_simd_t simd, cpu_peak_t kind, int reps)
{
    if (n_threads < 1 || n_threads > 64 || reps < 1 || (unsigned)simd > CPU_SIMD_COUNT ||
        (kind != CPU_PEAK_F32 && kind != CPU_PEAK_I8 && kind != CPU_PEAK_Q8_TILE))
        return river_err_set(RIVER_EINVAL, "compute peak: %d threads, %d reps, level %d, "
                             "kind %d", n_threads, reps, (int)simd, (int)kind);
    cpu_simd_t has = cpu_simd_detect();
    if (simd > has)
        simd = has;
    if (kind == CPU_PEAK_Q8_TILE && !cpu_kernels_get(simd)->peak_q8_tile)
        return river_err_set(RIVER_EUNSUPPORTED, "compute peak: no Q8 tile ceiling at level %s",
                             cpu_simd_name(simd));
    threadpool_t *pool;
    int e = threadpool_new(&pool, n_threads);
    if (e)
        return e;
    peak_job_t j = {.k = cpu_kernels_get(simd), .kind = kind, .iters = PEAK_PROBE_ITERS};
    int macs = kind == CPU_PEAK_F32  ? j.k->peak_macs_f32
               : kind == CPU_PEAK_I8 ? j.k->peak_macs_i8
                                     : j.k->peak_macs_q8_tile;

    double t0 = clock_now_s();
    peak_task(&j, 0, 0);
    double dt = clock_now_s() - t0;
    if (dt > 0.0)
        j.iters = (int64_t)((double)PEAK_PROBE_ITERS * PEAK_SECONDS / dt);
    if (j.iters < PEAK_PROBE_ITERS)
        j.iters = PEAK_PROBE_ITERS;

    double best = 0.0;
    int32_t sink = 0;
    for (int r = 0; r < reps; r++) {
        t0 = clock_now_s();
        threadpool_run(pool, peak_task, &j, n_threads);
        dt = clock_now_s() - t0;
        for (int t = 0; t < n_threads; t++)
            sink ^= j.sink[t];
        if (dt > 0.0 && (double)j.iters * macs * n_threads / dt > best)
            best = (double)j.iters * macs * n_threads / dt;
    }
    static _Atomic int32_t peak_sink;
    atomic_store_explicit(&peak_sink, sink, memory_order_relaxed);
    threadpool_destroy(&pool);
    return best / 1e9;
}
