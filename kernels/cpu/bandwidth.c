/* cpu_read_bandwidth_gbs: the memory read bandwidth that the decode matmul is judged
 * against. Each thread sums its own contiguous slice of one large buffer with the SIMD
 * loads of a level (the one decode runs at, or the widest the processor has), as a decode
 * matmul streams its share of a weight matrix, touching its pages ahead as the decode
 * kernels do (simd.h: read_sum). */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "common/clock.h"
#include "common/err.h"
#include "kernels/cpu/huge_pages.h"
#include "kernels/cpu/simd.h"
#include "kernels/cpu/threadpool.h"

typedef struct bw_job {
    const uint8_t *buf;
    size_t bytes;
    int n_tasks;
    const cpu_kernels_t *k;
    uint64_t sums[64]; /* one per task, read afterwards so the loads are not dead */
} bw_job_t;

static void bw_task(void *arg, int task, int thread)
{
    (void)thread;
    bw_job_t *j = arg;
    /* Slices are multiples of 256 bytes so every kernel sees whole unrolled iterations. */
    size_t units = j->bytes / 256;
    size_t u0 = units * (size_t)task / (size_t)j->n_tasks;
    size_t u1 = units * (size_t)(task + 1) / (size_t)j->n_tasks;
    j->sums[task] = j->k->read_sum(j->buf + u0 * 256, (u1 - u0) * 256);
}

double cpu_read_bandwidth_gbs(int n_threads, size_t bytes, int reps, cpu_simd_t simd)
{
    if (n_threads < 1 || n_threads > 64 || bytes < 4096 || reps < 1 ||
        (unsigned)simd > CPU_SIMD_COUNT)
        return river_err_set(RIVER_EINVAL, "read bandwidth: %d threads, %zu bytes, %d reps, "
                             "level %d", n_threads, bytes, reps, (int)simd);
    cpu_simd_t has = cpu_simd_detect();
    if (simd > has)
        simd = has;
    bytes = bytes / 256 * 256;
    /* In 2 MiB pages, as the CPU backend places the weights decode streams: from small
     * pages the same sweep reads 3-10 % slower here, and the roofline would be a lower bar
     * than the weights' own pages. */
    size_t len = 0;
    uint8_t *buf = cpu_huge_map(bytes, &len);
    if (!buf)
        return river_err_set(RIVER_ENOMEM, "read bandwidth: mmap of %zu bytes", bytes);
    /* Touch every page so the timed passes measure reads, not page faults; non-zero so
     * that no zero-page sharing can make the reads cheaper than real ones. */
    memset(buf, 1, bytes);

    threadpool_t *pool;
    int e = threadpool_new(&pool, n_threads);
    if (e) {
        (void)munmap(buf, len);
        return e;
    }
    bw_job_t *j = calloc(1, sizeof *j);
    if (!j) {
        threadpool_destroy(&pool);
        (void)munmap(buf, len);
        return river_err_set(RIVER_ENOMEM, "read bandwidth: job");
    }
    j->buf = buf;
    j->bytes = bytes;
    j->n_tasks = n_threads;
    j->k = cpu_kernels_get(simd);

    double best = 0.0;
    uint64_t sink = 0;
    for (int r = 0; r < reps; r++) {
        double t0 = clock_now_s();
        threadpool_run(pool, bw_task, j, j->n_tasks);
        double dt = clock_now_s() - t0;
        for (int t = 0; t < j->n_tasks; t++)
            sink += j->sums[t];
        if (dt > 0.0 && (double)bytes / dt > best)
            best = (double)bytes / dt;
    }
    /* Publish the sums through an atomic so the compiler must compute them. */
    static _Atomic uint64_t bw_sink;
    atomic_store_explicit(&bw_sink, sink, memory_order_relaxed);

    free(j);
    threadpool_destroy(&pool);
    (void)munmap(buf, len);
    return best / 1e9;
}
