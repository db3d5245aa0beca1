/* cpu_read_bandwidth_gbs and cpu_sweep_t: the memory read bandwidth that the decode matmul
 * is judged against. Each thread sums its own contiguous slice of one large buffer with the
 * SIMD loads of a level (the one decode runs at, or the widest the processor has), as a
 * decode matmul streams its share of a weight matrix, touching its pages ahead as the
 * decode kernels do (simd.h: read_sum). */
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

struct cpu_sweep {
    uint8_t *buf; /* (bytes) in 2 MiB pages, every page touched */
    size_t len;   /* of the mapping, for munmap */
    threadpool_t *pool;
    bw_job_t job;
    uint64_t sink; /* the sums of every pass, published at the end */
};

int cpu_sweep_new(cpu_sweep_t **out, int n_threads, size_t bytes, cpu_simd_t simd)
{
    *out = NULL;
    if (n_threads < 1 || n_threads > 64 || bytes < 4096 || (unsigned)simd > CPU_SIMD_COUNT)
        return river_err_set(RIVER_EINVAL, "read sweep: %d threads, %zu bytes, level %d",
                             n_threads, bytes, (int)simd);
    cpu_simd_t has = cpu_simd_detect();
    if (simd > has)
        simd = has;
    bytes = bytes / 256 * 256;
    cpu_sweep_t *s = calloc(1, sizeof *s);
    if (!s)
        return river_err_set(RIVER_ENOMEM, "read sweep");
    int e;
    /* In 2 MiB pages, as the CPU backend places the weights decode streams: from small
     * pages the same sweep reads 3-10 % slower here, and the roofline would be a lower bar
     * than the weights' own pages. */
    s->buf = cpu_huge_map(bytes, &s->len);
    if (!s->buf) {
        e = river_err_set(RIVER_ENOMEM, "read sweep: mmap of %zu bytes", bytes);
        goto fail_map;
    }
    /* Touch every page so the timed passes measure reads, not page faults; non-zero so
     * that no zero-page sharing can make the reads cheaper than real ones. */
    memset(s->buf, 1, bytes);
    e = threadpool_new(&s->pool, n_threads);
    if (e)
        goto fail_pool;
    s->job.buf = s->buf;
    s->job.bytes = bytes;
    s->job.n_tasks = n_threads;
    s->job.k = cpu_kernels_get(simd);
    *out = s;
    return 0;
fail_pool:
    (void)munmap(s->buf, s->len);
fail_map:
    free(s);
    return e;
}

double cpu_sweep_pass_gbs(cpu_sweep_t *s)
{
    double t0 = clock_now_s();
    threadpool_run(s->pool, bw_task, &s->job, s->job.n_tasks);
    double dt = clock_now_s() - t0;
    for (int t = 0; t < s->job.n_tasks; t++)
        s->sink += s->job.sums[t];
    return dt > 0.0 ? (double)s->job.bytes / dt / 1e9 : 0.0;
}

void cpu_sweep_destroy(cpu_sweep_t **sp)
{
    cpu_sweep_t *s = *sp;
    if (!s)
        return;
    /* Publish the sums through an atomic so the compiler must compute them. */
    static _Atomic uint64_t bw_sink;
    atomic_store_explicit(&bw_sink, s->sink, memory_order_relaxed);
    threadpool_destroy(&s->pool);
    (void)munmap(s->buf, s->len);
    free(s);
    *sp = NULL;
}

double cpu_read_bandwidth_gbs(int n_threads, size_t bytes, int reps, cpu_simd_t simd)
{
    if (reps < 1)
        return river_err_set(RIVER_EINVAL, "read bandwidth: %d reps", reps);
    cpu_sweep_t *s;
    int e = cpu_sweep_new(&s, n_threads, bytes, simd);
    if (e)
        return e;
    double best = 0.0;
    for (int r = 0; r < reps; r++) {
        double gbs = cpu_sweep_pass_gbs(s);
        if (gbs > best)
            best = gbs;
    }
    cpu_sweep_destroy(&s);
    return best;
}
