/* matmul: y (n, rows) = x (n, cols) W^T.
 *
 * Two paths. Decode (small n) is bound by memory bandwidth: the weight rows are split into
 * a few balanced contiguous chunks per thread and streamed once, each block of rows applied
 * to every row of x while it is in cache (kernel `gemv`). Prefill (large n) is bound by
 * arithmetic: each thread converts blocks of its weight rows to f32 panels (or, where a
 * level's panels are the row-blocked layout itself, reads them in place) and runs blocks of
 * x against them with a register-tiled kernel (`gemm_dot`, below).
 *
 * Every row of y has the bits it would have alone, whatever n: lossless mode compares a
 * verify batch with single-row decode, the prefix cache's KV must not depend on how a prompt
 * was cut into chunks, and a greedy reply must not depend on what else the worker is
 * serving. So the prefill path of float weights adds in the decode kernels' order, and
 * weights whose decode kernels take x in 8 bits (Q8, Q4: gemv_x8_block), whose integer dot
 * products cannot be matched by a prefill path with f32 x, use the decode path at every n.
 * (The decode path is also the faster one for Q4X8 at every batch measured; for Q8 it is up
 * to a third slower from 32 rows on.) Only Q4/Q8 weights whose groups do not hold whole
 * vectors, whose decode path is scalar, take a prefill path of other bits (`gemm_block`)
 * above CPU_DECODE_MAX_ROWS rows. */
#include "common/err.h"
#include "kernels/cpu/cpu_internal.h"
#include "kernels/cpu/lowbit.h"
#include "kernels/cpu/rowblock.h"

/* Up to this many rows of x the decode path is used: it reads the weights once and wastes
 * no arithmetic, where the prefill path converts every weight to f32 and computes whole
 * tiles. Measured on 2048 x 2048 (bf16, f32, q4) with the weights in cache, the prefill
 * path catches up between 16 and 24 rows. */
#define MM_GEMV_MAX_N CPU_DECODE_MAX_ROWS
/* Work (multiply-adds) below which a matmul runs on the calling thread alone. */
#define MM_PAR_MACS 16384
/* Weight rows are handed out in multiples of this (decode blocks are 8 rows). */
#define MM_ROW_UNIT 16
/* Decode chunks per thread, and the fewest weight bytes worth a chunk of their own. */
#define MM_CHUNKS_PER_THREAD 4
#define MM_MIN_CHUNK_BYTES (512 * 1024)
/* Bytes of f32 weights gemm_block's path converts at once: about a fifth of L2, so that the
 * block and the x panel it meets stay there. */
#define MM_BLOCK_BYTES (384 * 1024)

typedef struct mm_job {
    ops_ctx_t *ctx;
    const cpu_kernels_t *k; /* the level's kernels for w (cpu_kernels_for) */
    float *y;
    const float *x;
    const weight_t *w;
    int n;
    int n_tasks;
    int threads; /* the float prefill path's: threads taking part */
    int64_t units; /* MM_ROW_UNIT-row units of w */
    const float *xq; /* decode: x as gemv_prep leaves it, or NULL */
    int64_t ldq;
    /* decode: the weights of one call (w and y alone, or cpu_matmul_multi's), their units
     * laid end to end, weight i's from first[i] to first[i + 1] */
    int count;
    const weight_t *const *ws;
    void *const *ys;
    int64_t first[OPS_MATMULS_MAX + 1];
    /* prefill */
    const float *xp;
    int n_panels;
    int64_t block_rows;
} mm_job_t;

static void mm_task_rows(const mm_job_t *j, int task, int64_t *r0, int64_t *r1)
{
    int64_t u0 = j->units * task / j->n_tasks, u1 = j->units * (task + 1) / j->n_tasks;
    *r0 = u0 * MM_ROW_UNIT;
    *r1 = u1 * MM_ROW_UNIT < j->w->rows ? u1 * MM_ROW_UNIT : j->w->rows;
}

/* The task's share of the units of all the call's weights, weight by weight. */
static void mm_gemv_task(void *arg, int task, int thread)
{
    (void)thread;
    const mm_job_t *j = arg;
    int64_t total = j->first[j->count];
    int64_t u0 = total * task / j->n_tasks, u1 = total * (task + 1) / j->n_tasks;
    for (int i = 0; i < j->count && u0 < u1; i++) {
        if (u0 >= j->first[i + 1])
            continue;
        const weight_t *w = j->ws[i];
        int64_t e = u1 < j->first[i + 1] ? u1 : j->first[i + 1];
        int64_t r0 = (u0 - j->first[i]) * MM_ROW_UNIT;
        int64_t r1 = (e - j->first[i]) * MM_ROW_UNIT < w->rows ? (e - j->first[i]) * MM_ROW_UNIT
                                                               : w->rows;
        j->k->gemv(j->ys[i], w->rows, j->x, w->cols, j->xq, j->ldq, j->n, w, r0, r1);
        u0 = e;
    }
}

static void mm_pack_task(void *arg, int task, int thread)
{
    (void)thread;
    const mm_job_t *j = arg;
    const cpu_kernels_t *k = j->k;
    int P = k->gemm_panel;
    int64_t cols = j->w->cols;
    int i0 = task * P;
    int m = j->n - i0 < P ? j->n - i0 : P;
    k->gemm_pack((float *)j->xp + (int64_t)task * P * cols, j->x + (int64_t)i0 * cols, cols, m,
                 cols);
}

static void mm_gemm_task(void *arg, int task, int thread)
{
    const mm_job_t *j = arg;
    const cpu_kernels_t *k = j->k;
    const weight_t *w = j->w;
    int P = k->gemm_panel;
    int64_t cols = w->cols, rows = w->rows;
    float *wbuf = j->ctx->thread_scratch[thread].s.p;
    int64_t r0, r1;
    mm_task_rows(j, task, &r0, &r1);
    for (int64_t b0 = r0; b0 < r1; b0 += j->block_rows) {
        int64_t b1 = b0 + j->block_rows < r1 ? b0 + j->block_rows : r1;
        const float *wf;
        if (w->dtype == DTYPE_F32) {
            wf = (const float *)w->data + b0 * cols;
        } else {
            k->rows_to_f32(wbuf, w, b0, b1);
            wf = wbuf;
        }
        for (int p = 0; p < j->n_panels; p++) {
            int m = j->n - p * P < P ? j->n - p * P : P;
            k->gemm_block(j->y + (int64_t)p * P * rows + b0, rows, j->xp + (int64_t)p * P * cols,
                          m, wf, cols, b1 - b0, cols);
        }
    }
}

/* The prefill path of float weights (simd.h: gemm_wpack, gemm_dot). Each thread takes its
 * weight rows MM_MC at a time and converts them to f32 panels (gemm_nr rows each) over
 * all columns in one pass. Then for each block of MM_MB rows of x it goes over the blocks
 * of columns (MM_KC floats of x, or the level's gemm_kc), every panel against the
 * block's rows: a panel's part (a few KiB) stays in L1 while the rows of x pass over it
 * from L2. The tiles' vectors of partial sums are
 * carried from one block of columns to the next in the thread's scratch (MM_MB x MM_MC
 * vectors, which stay in L2 with the block of x), and summed at the last: a value has the
 * bits gemv gives it, whatever n (tests/test_backend_ops.c: check_rows_alone).
 *
 * The price of those bits, measured on an AVX2-only AMD EPYC (2 threads, river bench
 * --kernels, bf16 at 512 rows, Llama 3.2 1B's shapes, alternating runs): 80-82 G
 * multiply-adds/s, where an outer-product kernel, which adds in column order per output and
 * so gives other bits than decode, ran 89-91 (the peak: 102). Each output carries a vector
 * of partial sums, not one float, which bounds the blocks that fit in L2; the kernel alone,
 * from L1 and L2, runs at 0.85-0.9 of the peak. Converting the weights again for each block
 * of x (the block's panels only) was 2-4 % slower, and carrying the sums of all rows of x
 * (from L3) 15 % slower at 2048 columns. */
/* Floats of x a block of columns, where the level does not say (simd.h: gemm_kc). */
#define MM_KC 256
#define MM_MC 48
_Static_assert(MM_MC % CPU_ROWBLOCK_ROWS == 0, "tasks of whole row blocks");
#define MM_MB 96

/* The float prefill path's tasks, which the threads claim in turn (threadpool.h), are runs
 * of whole blocks of MM_MC rows, each 1 / MM_DOT_SHARE of a thread's share of the blocks
 * left, so they shrink to single blocks at the end and whichever thread finishes first
 * waits a block or two for the other, however the host shares the cores meanwhile. Within
 * a task the blocks run in order, each one's rows asked for while the one before runs
 * (mm_dot_task); a task's first block comes cold from memory, hence not single blocks
 * throughout. Two halves, one a thread, left the caller waiting 2.0 s of a thread's 4.4 s
 * in these matmuls in one run of river bench --prompt-len 512 (avx512bf16, 2 threads, Zen 5
 * VM) and 0.05 s in the next; four equal tasks a thread still left up to a quarter of a
 * thread's share to wait for. */
#define MM_DOT_SHARE 2

/* Where task `task` of the float prefill path starts (*b0, in blocks of MM_MC rows) and
 * how many blocks it has: 0 past the last task, so that the count of tasks is the first
 * task with none. */
static int64_t mm_dot_task_blocks(int64_t blocks, int threads, int task, int64_t *b0)
{
    int64_t b = 0, d = (int64_t)MM_DOT_SHARE * threads;
    for (int t = 0;; t++) {
        int64_t size = threads > 1 ? (blocks - b + d - 1) / d : blocks - b;
        if (t == task || size == 0) {
            *b0 = b;
            return size;
        }
        b += size;
    }
}

/* Task `task` of the float prefill path: its weight rows, whole blocks. */
static void mm_dot_task_rows(const mm_job_t *j, int task, int64_t *r0, int64_t *r1)
{
    int64_t blocks = (j->w->rows + MM_MC - 1) / MM_MC, b0;
    int64_t size = mm_dot_task_blocks(blocks, j->threads, task, &b0), b1 = b0 + size;
    *r0 = b0 * MM_MC;
    *r1 = b1 * MM_MC < j->w->rows ? b1 * MM_MC : j->w->rows;
}

/* Whether the level reads w's row-blocked rows as panels where they are (simd.h:
 * gemm_w_in_place); the path hands out rows by MM_MC, which whole blocks divide. */
static bool mm_dot_in_place(const cpu_kernels_t *k, const weight_t *w)
{
    return k->gemm_w_in_place && cpu_rowblock_is(w->dtype);
}

/* A thread's scratch for that path, in floats: the panels of MM_MC weight rows over all
 * columns (none where they are read in place), then the carry (MM_MB / gemm_mr tiles of x
 * against MM_MC / gemm_nr panels, gemm_mr * gemm_nr vectors each). */
static int64_t mm_dot_panel_floats(const cpu_kernels_t *k, const weight_t *w)
{
    return mm_dot_in_place(k, w) ? 0 : (MM_MC + k->gemm_nr - 1) / k->gemm_nr * k->gemm_nr * w->cols;
}

static int64_t mm_dot_scratch_floats(const cpu_kernels_t *k, const weight_t *w)
{
    int64_t tiles = (MM_MB + k->gemm_mr - 1) / k->gemm_mr;
    int64_t panels = (MM_MC + k->gemm_nr - 1) / k->gemm_nr;
    return mm_dot_panel_floats(k, w) + tiles * panels * k->gemm_mr * k->gemm_nr * k->gemm_lanes;
}

/* Asks for slice i of n of the bytes from p, whole lines, into L2. */
static void mm_prefetch_slice(const uint8_t *p, size_t bytes, size_t i, size_t n)
{
    for (size_t o = bytes * i / n / 64 * 64; o < bytes * (i + 1) / n; o += 64)
        __builtin_prefetch(p + o, 0, 2);
}

static void mm_dot_task(void *arg, int task, int thread)
{
    const mm_job_t *j = arg;
    const cpu_kernels_t *k = j->k;
    const weight_t *w = j->w;
    /* x as it is, or as gemv_prep leaves it (simd.h: gemm_x_cols_per_float); the panels
     * hold `per` columns a float too. */
    const int per = k->gemm_x_cols_per_float ? k->gemm_x_cols_per_float : 1;
    const int MR = k->gemm_mr, NR = k->gemm_nr, L = k->gemm_lanes / per; /* floats a vector */
    int64_t cols = w->cols, rows = w->rows;
    float *wp = j->ctx->thread_scratch[thread].s.p;
    float *carry = wp + mm_dot_panel_floats(k, w);
    const int tiles = (MM_MB + MR - 1) / MR;
    const float *xs = k->gemm_x_cols_per_float ? j->xq : j->x;
    int64_t ldxs = k->gemm_x_cols_per_float ? j->ldq : cols;
    /* Columns a block: the same bytes of x and of the panels whatever `per` (bf16 pairs in
     * blocks of 256 columns ran 0.8-0.9x as fast as in blocks of 512, river bench
     * --kernels at 512 rows, avx512bf16). */
    const int64_t KC = (int64_t)(k->gemm_kc ? k->gemm_kc : MM_KC) * per;
    const bool in_place = mm_dot_in_place(k, w);
    const size_t rb = dtype_row_bytes(w->dtype, cols);
    int64_t r0, r1;
    mm_dot_task_rows(j, task, &r0, &r1);
    for (int64_t b0 = r0; b0 < r1; b0 += MM_MC) {
        int64_t b1 = b0 + MM_MC < r1 ? b0 + MM_MC : r1;
        int panels = (int)((b1 - b0 + NR - 1) / NR);
        /* Every column at once: the rows are then read in the order they are stored, one
         * stream, where a block of columns at a time jumped from row to row (or block of
         * rows to block) every few KiB, each jump a page the prefetchers met cold. Panel p
         * holds all its columns, so the block of columns from k0 starts NR * k0 floats on. */
        if (!in_place)
            k->gemm_wpack(wp, w, b0, b1, 0, cols);
        /* The next block's rows are asked for a slice at each panel call of the last block
         * of x, so that packing them reads from cache, not from memory: packed straight
         * from memory, one read of each weight took 6-8 % of the time of the hundreds of
         * multiply-adds the GEMM does with it (perf, 512-token prefill of the 1B shape, 2
         * threads, AVX2 and AVX-512). Where the level reads the rows in place, the first
         * block of x is what would wait on memory instead: its tiles ask for the panel's
         * bytes at several times the rate the memory gives one core. */
        const uint8_t *nx = (const uint8_t *)w->data + (size_t)b1 * rb;
        size_t nx_bytes = (size_t)((b1 + MM_MC < r1 ? b1 + MM_MC : r1) - b1) * rb;
        size_t calls = (size_t)((cols + KC - 1) / KC) * (size_t)panels;
        for (int i0 = 0; i0 < j->n; i0 += MM_MB) {
            int i1 = i0 + MM_MB < j->n ? i0 + MM_MB : j->n;
            for (int64_t k0 = 0; k0 < cols; k0 += KC) {
                int64_t kc = cols - k0 < KC ? cols - k0 : KC;
                bool last = k0 + kc == cols;
                for (int p = 0; p < panels; p++) {
                    if (nx_bytes && i1 == j->n)
                        mm_prefetch_slice(nx, nx_bytes, (size_t)(k0 / KC) * panels + p, calls);
                    int64_t p0 = b0 + (int64_t)p * NR;
                    int nr = b1 - p0 < NR ? (int)(b1 - p0) : NR;
                    const float *pan =
                        in_place ? (const float *)cpu_rowblock_at(w->data, rb, p0,
                                                                  dtype_row_bytes(w->dtype, k0))
                                 : wp + ((int64_t)p * NR * cols + (int64_t)NR * k0) / per;
                    k->gemm_dot(carry + (int64_t)p * tiles * MR * NR * L,
                                last ? j->y + (int64_t)i0 * rows + p0 : NULL, rows,
                                xs + (int64_t)i0 * ldxs + k0 / per, ldxs, i1 - i0, pan, nr,
                                kc, k0 == 0);
                }
            }
        }
    }
}

/* Whether float weight w takes the gemm_dot path; float weights that cannot (columns not
 * a multiple of the lanes, or a level without it) take gemv at every n, for the same bits. */
static bool mm_dot(const cpu_kernels_t *k, const weight_t *w)
{
    return k->gemm_dot && w->cols % k->gemm_lanes == 0;
}

static bool mm_float(const weight_t *w)
{
    dtype_t et = cpu_rowblock_elem(w->dtype);
    return et == DTYPE_F32 || et == DTYPE_BF16 || et == DTYPE_F16;
}

/* Q8/Q4 groups that do not hold whole vectors have no fast decode kernel; the prefill path,
 * which converts a block of rows to f32 once, is far faster for them. */
static int mm_odd_groups(const weight_t *w)
{
    return (w->dtype == DTYPE_Q8 && w->group % 16 != 0) ||
           (w->dtype == DTYPE_Q4 && w->group % 32 != 0);
}

/* Whether a matmul of n rows takes the decode path. */
static bool mm_decode(const cpu_kernels_t *k, const weight_t *w, int n)
{
    if (!k->gemm_block)
        return true;
    if (mm_float(w))
        return n <= MM_GEMV_MAX_N || !mm_dot(k, w);
    if (mm_odd_groups(w))
        return false;
    return n <= MM_GEMV_MAX_N || (k->gemv_x8_block && k->gemv_x8_block(w) > 0);
}

bool cpu_matmul_rows_alone(cpu_simd_t level, const weight_t *w, int n)
{
    return mm_float(w) || mm_decode(cpu_kernels_for(cpu_kernels_get(level), w, n), w, n);
}

/* Rows of x from which gemv_prep runs on every thread: a prefill's prep (x in bf16 pairs
 * or in even/odd order, 512 x 2048 floats and more) on the calling thread alone kept the
 * other waiting, 0.9 % of a 512-token prefill's samples each (perf, AVX2). */
#define MM_PREP_PAR_ROWS 64

static void mm_prep_task(void *arg, int task, int thread)
{
    (void)thread;
    const mm_job_t *j = arg;
    int i0 = (int)((int64_t)j->n * task / j->n_tasks);
    int i1 = (int)((int64_t)j->n * (task + 1) / j->n_tasks);
    if (i1 > i0)
        j->k->gemv_prep((float *)j->xq + (int64_t)i0 * j->ldq, j->x + (int64_t)i0 * j->w->cols,
                        j->w->cols, i1 - i0, j->w);
}

/* x as the weight's kernels want it once per call (simd.h: gemv_prep), into the shared
 * scratch; nothing where they read x as it is. Each row is prepared alone, so the rows can
 * be split between threads. */
static int mm_prep(ops_ctx_t *ctx, mm_job_t *j)
{
    const cpu_kernels_t *k = j->k;
    int64_t ldq = k->gemv_prep_floats ? k->gemv_prep_floats(j->w) : 0;
    if (ldq <= 0)
        return 0;
    int e = cpu_scratch_reserve(&ctx->shared, (size_t)(j->n * ldq));
    if (e)
        return e;
    j->xq = ctx->shared.p;
    j->ldq = ldq;
    if (j->n < MM_PREP_PAR_ROWS || ctx->n_threads < 2) {
        k->gemv_prep(ctx->shared.p, j->x, j->w->cols, j->n, j->w);
        return 0;
    }
    int tasks = j->n_tasks;
    j->n_tasks = ctx->n_threads;
    threadpool_run(ctx->pool, mm_prep_task, j, j->n_tasks);
    j->n_tasks = tasks;
    return 0;
}

/* The decode path of count weights that share x (j: ctx, k, x, w = ws[0], n), as one run of
 * the pool. */
static int mm_gemv_run(ops_ctx_t *ctx, mm_job_t *j, const weight_t *const *ws, void *const *ys,
                       int count)
{
    j->count = count;
    j->ws = ws;
    j->ys = ys;
    int64_t bytes = 0, macs = 0;
    j->first[0] = 0;
    for (int i = 0; i < count; i++) {
        j->first[i + 1] = j->first[i] + (ws[i]->rows + MM_ROW_UNIT - 1) / MM_ROW_UNIT;
        bytes += ws[i]->rows * (int64_t)dtype_row_bytes(ws[i]->dtype, ws[i]->cols);
        macs += (int64_t)j->n * ws[i]->rows * ws[i]->cols;
    }
    int64_t units = j->first[count];
    int threads = macs < MM_PAR_MACS ? 1 : ctx->n_threads;
    if (threads > units)
        threads = (int)units;
    j->n_tasks = threads;
    if (threads > 1) {
        /* A few chunks per thread: a thread that loses its core for a while (other work on
         * the machine) leaves its later chunks to the others. */
        int64_t want = bytes / MM_MIN_CHUNK_BYTES;
        int64_t most = (int64_t)threads * MM_CHUNKS_PER_THREAD;
        want = want < most ? want : most;
        want = want < units ? want : units;
        if (want > threads)
            j->n_tasks = (int)want;
    }
    int e = mm_prep(ctx, j);
    if (e)
        return e;
    threadpool_run(ctx->pool, mm_gemv_task, j, j->n_tasks);
    return 0;
}

int cpu_matmul(ops_ctx_t *ctx, void *y, const void *x, const weight_t *w, int n)
{
    int e = cpu_weight_check(w, "matmul");
    if (e)
        return e;
    if (n < 0 || (n > 0 && (!y || !x)))
        return river_err_set(RIVER_EINVAL, "cpu matmul: n %d", n);
    if (n == 0)
        return 0;
    const cpu_kernels_t *k = cpu_kernels_for(ctx->k, w, n);
    mm_job_t j = { .ctx = ctx, .k = k, .y = y, .x = x, .w = w, .n = n,
                   .units = (w->rows + MM_ROW_UNIT - 1) / MM_ROW_UNIT };
    if (mm_decode(k, w, n))
        return mm_gemv_run(ctx, &j, &w, &y, 1);

    /* The prefill paths. */
    int64_t macs = (int64_t)n * w->rows * w->cols;
    int threads = ctx->n_threads;
    if (macs < MM_PAR_MACS)
        threads = 1;
    if (threads > j.units)
        threads = (int)j.units;

    if (mm_float(w)) {
        e = cpu_thread_scratch_reserve(ctx, (size_t)mm_dot_scratch_floats(k, w));
        if (e)
            return e;
        if (k->gemm_x_cols_per_float && (e = mm_prep(ctx, &j)) != 0)
            return e;
        int64_t blocks = (w->rows + MM_MC - 1) / MM_MC, b0;
        j.threads = threads;
        j.n_tasks = 0;
        while (mm_dot_task_blocks(blocks, threads, j.n_tasks, &b0) > 0)
            j.n_tasks++;
        threadpool_run(ctx->pool, mm_dot_task, &j, j.n_tasks);
        return 0;
    }

    int P = k->gemm_panel;
    int64_t cols = w->cols;
    j.n_panels = (n + P - 1) / P;
    e = cpu_scratch_reserve(&ctx->shared, (size_t)j.n_panels * P * cols);
    if (e)
        return e;
    j.xp = ctx->shared.p;
    j.block_rows = MM_BLOCK_BYTES / (int64_t)(cols * sizeof(float));
    j.block_rows = j.block_rows / MM_ROW_UNIT * MM_ROW_UNIT;
    if (j.block_rows < MM_ROW_UNIT)
        j.block_rows = MM_ROW_UNIT;
    if (w->dtype != DTYPE_F32) {
        e = cpu_thread_scratch_reserve(ctx, (size_t)(j.block_rows * cols));
        if (e)
            return e;
    }
    if (threads > 1) {
        threadpool_run(ctx->pool, mm_pack_task, &j, j.n_panels);
    } else {
        for (int p = 0; p < j.n_panels; p++)
            mm_pack_task(&j, p, 0);
    }
    j.n_tasks = threads;
    threadpool_run(ctx->pool, mm_gemm_task, &j, j.n_tasks);
    return 0;
}

/* One run where every weight takes the same kernels on the same prepared x (the same type,
 * columns and groups, all on the decode path); else one matmul a weight, as ops_matmuls
 * would. Which task computes a row does not change its bits. */
int cpu_matmul_multi(ops_ctx_t *ctx, void *const *y, const void *x, const weight_t *const *w,
                     int count, int n)
{
    if (count < 1 || count > OPS_MATMULS_MAX || !w)
        return river_err_set(RIVER_EINVAL, "cpu matmul_multi: %d weights", count);
    for (int i = 0; i < count; i++) {
        int e = cpu_weight_check(w[i], "matmul_multi");
        if (e)
            return e;
        if (w[i]->cols != w[0]->cols)
            return river_err_set(RIVER_ESHAPE, "cpu matmul_multi: weight %d has %lld columns, "
                                 "weight 0 %lld", i, (long long)w[i]->cols,
                                 (long long)w[0]->cols);
    }
    if (n < 0 || (n > 0 && (!y || !x)))
        return river_err_set(RIVER_EINVAL, "cpu matmul_multi: n %d", n);
    for (int i = 0; i < count && n > 0; i++)
        if (!y[i])
            return river_err_set(RIVER_EINVAL, "cpu matmul_multi: no output for weight %d", i);
    if (n == 0)
        return 0;
    const cpu_kernels_t *k = cpu_kernels_for(ctx->k, w[0], n);
    bool one = mm_decode(k, w[0], n);
    for (int i = 1; i < count && one; i++)
        one = w[i]->dtype == w[0]->dtype && w[i]->group == w[0]->group &&
              w[i]->zero_int == w[0]->zero_int && cpu_kernels_for(ctx->k, w[i], n) == k &&
              mm_decode(k, w[i], n);
    if (!one) {
        for (int i = 0; i < count; i++) {
            int e = cpu_matmul(ctx, y[i], x, w[i], n);
            if (e)
                return e;
        }
        return 0;
    }
    mm_job_t j = { .ctx = ctx, .k = k, .x = x, .w = w[0], .n = n };
    return mm_gemv_run(ctx, &j, w, y, count);
}
