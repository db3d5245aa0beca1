/* river bench --kernels: the CPU matmul kernels alone, on the matrix shapes of Llama 3.2 1B,
 * against the machine's read bandwidth measured in the same run.
 *
 * For every shape and weight format, a pool of distinct copies of the matrix (codes, scales
 * and zeros each their own) larger than the last-level cache is placed on a CPU backend of
 * each SIMD level in turn, and the matmul is called on the copies in rotation, so that
 * every call streams its weights from memory as a decode step does. A run is one pass over
 * the pool (at least 10 ms of calls, at most a quarter of a second); its time per call is the
 * figure, and the median over --runs runs is printed with the bytes of the weight's format
 * per second and their fraction of a read sweep with the same threads and the loads of
 * that level (cpu_read_bandwidth_gbs), taken right before that level's runs of the shape.
 *
 * The codes are arbitrary bytes (the kernels' speed does not depend on their values), so
 * 4-bit weights are placed as Q4X8 directly and q8x8 8-bit ones as Q8X8, the layouts the
 * backend repacks them into, and bf16x8 is bf16 in the row-blocked layout the backend
 * repacks bf16 into (rowblock.h), beside plain row-major bf16; f16x8 is f16 in that layout. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "cli/cli.h"
#include "common/clock.h"
#include "common/err.h"
#include "common/rng.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/huge_pages.h"
#include "kernels/half.h"

/* The formats measured, each as a dtype, a group and how its zeros are drawn. */
typedef enum {
    BK_ZERO_NONE = 0, /* float weights */
    BK_ZERO_INT,      /* every zero the format's integer: llama.cpp's q8_0 (128), Q4_0 (8) */
    BK_ZERO_ANY,      /* zeros drawn over the code range, as HQQ leaves them */
} bk_zero_t;

typedef struct bk_format {
    const char *name;
    dtype_t dtype;
    int group;
    bk_zero_t zero;
    int code_max; /* BK_ZERO_ANY: the zeros' range; BK_ZERO_INT: every zero */
} bk_format_t;

static const bk_format_t bk_formats[] = {
    {"bf16", DTYPE_BF16, 0, BK_ZERO_NONE, 0},
    {"bf16x8", DTYPE_BF16X8, 0, BK_ZERO_NONE, 0},
    {"f16x8", DTYPE_F16X8, 0, BK_ZERO_NONE, 0},
    {"q8-g32-z128", DTYPE_Q8, 32, BK_ZERO_INT, 128},
    {"q8-g32", DTYPE_Q8, 32, BK_ZERO_ANY, 255},
    {"q8-g16-z32", DTYPE_Q8, 16, BK_ZERO_INT, 32},
    {"q8x8-g32-z128", DTYPE_Q8X8, 32, BK_ZERO_INT, 128},
    {"q8x8-g32-z16", DTYPE_Q8X8, 32, BK_ZERO_INT, 16},
    {"q8x8-g16-z32", DTYPE_Q8X8, 16, BK_ZERO_INT, 32},
    {"q4x8-g32", DTYPE_Q4X8, 32, BK_ZERO_ANY, 15},
    {"q4x8-g32-z8", DTYPE_Q4X8, 32, BK_ZERO_INT, 8},
    {"q4x8-g64", DTYPE_Q4X8, 64, BK_ZERO_ANY, 15},
};
#define BK_N_FORMATS (int)(sizeof bk_formats / sizeof bk_formats[0])

/* Llama 3.2 1B: q and o (2048 x 2048), k and v (512 x 2048), gate and up (8192 x 2048),
 * down (2048 x 8192), the LM head (128256 x 2048). */
static const struct {
    const char *name;
    int64_t rows, cols;
} bk_shapes[] = {
    {"2048x2048", 2048, 2048}, {"512x2048", 512, 2048},       {"8192x2048", 8192, 2048},
    {"2048x8192", 2048, 8192}, {"128256x2048", 128256, 2048},
};
#define BK_N_SHAPES (int)(sizeof bk_shapes / sizeof bk_shapes[0])

#define BK_MAX_N 512
#define BK_MAX_BATCHES 16
#define BK_RUN_SECONDS 0.25
#define BK_RUN_MIN_SECONDS 0.01

typedef struct bk_opts {
    int threads, runs, pool_mib, bw_mib, json;
    int peak;       /* --peak: the compute peaks instead of the matmuls */
    int interleave; /* --interleave: the levels call by call (bk_time_mixed) */
    int levels[CPU_SIMD_COUNT], n_levels;
    int batches[BK_MAX_BATCHES], n_batches;
    int formats[BK_N_FORMATS], n_formats; /* indices into bk_formats */
    int shapes[BK_N_SHAPES], n_shapes;    /* indices into bk_shapes */
    int scalar_max_n;                     /* batches above this skip the scalar level */
} bk_opts_t;

static size_t bk_align(size_t n)
{
    return (n + 63) / 64 * 64;
}

/* Bytes of one copy of the weight: codes, then scales and zeros (each 64-byte aligned). */
static size_t bk_copy_bytes(const bk_format_t *f, int64_t rows, int64_t cols, size_t *data,
                            size_t *meta)
{
    *data = bk_align(dtype_row_bytes(f->dtype, cols) * (size_t)rows);
    *meta = f->group ? bk_align((size_t)rows * (size_t)(cols / f->group) * 2) : 0;
    return *data + 2 * *meta;
}

/* Fills the pool: codes as random bytes (bf16 and f16 values with a bounded exponent, so
 * that no infinity, NaN or subnormal slows a float kernel), positive fp16 scales, zeros per
 * f. */
static void bk_fill(uint8_t *pool, int copies, size_t data, size_t meta, const bk_format_t *f)
{
    uint64_t s = 0x5eed;
    size_t each = data + 2 * meta;
    for (int c = 0; c < copies; c++) {
        uint8_t *p = pool + (size_t)c * each;
        for (size_t k = 0; k + 8 <= data; k += 8) {
            uint64_t v = rng_next(&s);
            if (f->dtype == DTYPE_BF16 || f->dtype == DTYPE_BF16X8)
                v = (v & UINT64_C(0x807f807f807f807f)) | UINT64_C(0x3c003c003c003c00);
            else if (f->dtype == DTYPE_F16X8)
                v = (v & UINT64_C(0x83ff83ff83ff83ff)) | UINT64_C(0x3c003c003c003c00);
            memcpy(p + k, &v, 8);
        }
        if (!meta)
            continue;
        uint16_t *sc = (uint16_t *)(p + data), *ze = (uint16_t *)(p + data + meta);
        size_t ng = meta / 2;
        for (size_t g = 0; g < ng; g++) {
            uint64_t v = rng_next(&s);
            sc[g] = f32_to_f16(0.001f + (float)(v & 1023) * 1e-5f);
            float z = f->zero == BK_ZERO_INT ? (float)f->code_max
                                             : (float)((v >> 10) % (uint64_t)(f->code_max + 1));
            ze[g] = f32_to_f16(z);
        }
    }
}

typedef struct bk_result {
    double ms, ms_min, gbs, frac, gmacs;
} bk_result_t;

/* The median time of one call of matmul at n rows, over the copies in rotation. */
static int bk_time(backend_t *be, weight_t *w, int copies, int *next, void *y, const void *x,
                   int n, int runs, double *ms, double *ms_min)
{
    double *t = calloc((size_t)runs, sizeof *t);
    if (!t)
        return river_err_set(RIVER_ENOMEM, "bench kernels: timings");
    int e = be->ops->matmul(be->ctx, y, x, &w[*next], n); /* warm the pool and scratch */
    *next = (*next + 1) % copies;
    for (int r = 0; r < runs && !e; r++) {
        double t0 = clock_now_s(), dt = 0.0;
        int calls = 0;
        /* A pass over the pool, and at least BK_RUN_MIN_SECONDS (a pool held in cache
         * takes many passes to time), at most BK_RUN_SECONDS. */
        while (calls < copies || dt < BK_RUN_MIN_SECONDS) {
            e = be->ops->matmul(be->ctx, y, x, &w[*next], n);
            if (e)
                break;
            *next = (*next + 1) % copies;
            calls++;
            dt = clock_now_s() - t0;
            if (dt > BK_RUN_SECONDS)
                break;
        }
        t[r] = calls ? dt / calls * 1e3 : 0.0;
    }
    if (!e) {
        *ms = cli_median(t, runs); /* sorts t */
        *ms_min = t[0];
    }
    free(t);
    return e;
}

static void bk_print(const bk_opts_t *o, const char *level, const char *fmt, const char *shape,
                     int n, const bk_result_t *r, double bw)
{
    if (o->json)
        printf("{\"level\":\"%s\",\"format\":\"%s\",\"shape\":\"%s\",\"n\":%d,\"ms\":%.4f,"
               "\"ms_min\":%.4f,\"weight_gbs\":%.2f,\"bandwidth_gbs\":%.2f,\"fraction\":%.3f,"
               "\"gmacs\":%.1f}\n", level, fmt, shape, n, r->ms, r->ms_min, r->gbs, bw, r->frac,
               r->gmacs);
    else
        printf("%-10s %-12s %-12s %4d %10.4f %8.2f %8.2f %6.1f %%  %8.1f\n", level, fmt, shape,
               n, r->ms, r->gbs, bw, 100.0 * r->frac, r->gmacs);
    fflush(stdout);
}

/* One level's CPU backend with the pool's copies placed on it, x and y, and the read
 * sweep with that level's loads, taken as it opens: right before its runs. */
typedef struct bk_level {
    cpu_simd_t level;
    backend_t *be;
    weight_t *w; /* the copies, as placed */
    void *x, *y;
    double bw;
} bk_level_t;

static void bk_level_close(bk_level_t *L)
{
    if (L->x)
        L->be->ops->buf_free(L->be->ctx, L->x);
    if (L->y)
        L->be->ops->buf_free(L->be->ctx, L->y);
    backend_destroy(&L->be);
    free(L->w);
    L->w = NULL;
    L->x = L->y = NULL;
}

/* On failure nothing is left open. */
static int bk_level_open(const bk_opts_t *o, bk_level_t *L, cpu_simd_t level,
                         const bk_format_t *f, uint8_t *pool, int copies, size_t data,
                         size_t meta, int64_t rows, int64_t cols, const float *xh)
{
    size_t each = data + 2 * meta;
    *L = (bk_level_t){.level = level};
    L->w = calloc((size_t)copies, sizeof *L->w);
    if (!L->w)
        return river_err_set(RIVER_ENOMEM, "bench kernels: %d copies", copies);
    int e = cpu_backend_new(&L->be, o->threads, level);
    if (e)
        goto fail;
    /* The pool is in huge pages already: placement need not copy it again. */
    e = cpu_backend_keep_mapped(L->be);
    for (int c = 0; c < copies && !e; c++) {
        uint8_t *p = pool + (size_t)c * each;
        L->w[c] = (weight_t){.dtype = f->dtype, .rows = rows, .cols = cols, .data = p,
                             .group = f->group};
        if (f->group) {
            L->w[c].scales = (const uint16_t *)(p + data);
            L->w[c].zeros = (const uint16_t *)(p + data + meta);
        }
        e = L->be->ops->weight_upload(L->be->ctx, &L->w[c]);
    }
    if (!e) {
        L->x = L->be->ops->buf_alloc(L->be->ctx, (size_t)(BK_MAX_N * cols));
        L->y = L->be->ops->buf_alloc(L->be->ctx, (size_t)(BK_MAX_N * rows));
        if (!L->x || !L->y)
            e = river_err_set(RIVER_ENOMEM, "bench kernels: activations");
    }
    if (!e)
        e = L->be->ops->from_host(L->be->ctx, L->x, 0, xh, (size_t)(BK_MAX_N * cols));
    /* On a shared machine the bandwidth drifts by tens of percent within minutes. */
    if (!e) {
        L->bw = cpu_read_bandwidth_gbs(o->threads, (size_t)o->bw_mib << 20, 3, level);
        if (L->bw < 0)
            e = (int)L->bw;
    }
    if (!e)
        return 0;
fail:
    bk_level_close(L);
    return e;
}

/* --interleave: the levels' calls in turn on one backend (cpu_backend_set_simd: one thread
 * pool, the same placed copies), one call each, each call timed alone, every call on the
 * next copy; a run ends after a pass over the pool and at least BK_RUN_MIN_SECONDS of each
 * level's calls, or BK_RUN_SECONDS of them all. A level's figure for the run is its time per
 * call, ms[li] and ms_min[li] the median and the least over the runs. The host's drift,
 * which moves runs minutes apart by tens of percent, then falls on every level alike.
 * use[li] says which of the nl levels run at this n. */
static int bk_time_mixed(const bk_level_t *L, const cpu_simd_t *levels, const int *use, int nl,
                         int copies, int *next, int n, int runs, double *ms, double *ms_min)
{
    double *t = calloc((size_t)runs * (size_t)nl, sizeof *t);
    double sum[CPU_SIMD_COUNT];
    int calls[CPU_SIMD_COUNT];
    const ops_t *op = L->be->ops;
    int e = t ? 0 : river_err_set(RIVER_ENOMEM, "bench kernels: timings");
    for (int li = 0; li < nl && !e; li++) /* warm each level's scratch */
        if (use[li] && !(e = cpu_backend_set_simd(L->be, levels[li]))) {
            e = op->matmul(L->be->ctx, L->y, L->x, &L->w[*next], n);
            *next = (*next + 1) % copies;
        }
    for (int r = 0; r < runs && !e; r++) {
        double t0 = clock_now_s();
        for (int li = 0; li < nl; li++) {
            sum[li] = 0.0;
            calls[li] = 0;
        }
        for (int done = 0; !done && !e;) {
            done = 1;
            for (int li = 0; li < nl && !e; li++) {
                if (!use[li] || (e = cpu_backend_set_simd(L->be, levels[li])) != 0)
                    continue;
                double c0 = clock_now_s();
                e = op->matmul(L->be->ctx, L->y, L->x, &L->w[*next], n);
                sum[li] += clock_now_s() - c0;
                calls[li]++;
                *next = (*next + 1) % copies;
                if (calls[li] < copies || sum[li] < BK_RUN_MIN_SECONDS)
                    done = 0;
            }
            if (clock_now_s() - t0 > BK_RUN_SECONDS * nl)
                done = 1;
        }
        for (int li = 0; li < nl; li++)
            t[li * runs + r] = calls[li] ? sum[li] / calls[li] * 1e3 : 0.0;
    }
    for (int li = 0; li < nl && !e; li++) {
        ms[li] = cli_median(t + li * runs, runs); /* sorts them */
        ms_min[li] = t[li * runs];
    }
    free(t);
    return e;
}

static void bk_report(const bk_opts_t *o, cpu_simd_t level, double bw, const bk_format_t *f,
                      int si, int n, double ms, double ms_min, size_t weight_bytes)
{
    int64_t rows = bk_shapes[si].rows, cols = bk_shapes[si].cols;
    bk_result_t r = {.ms = ms, .ms_min = ms_min};
    r.gbs = ms > 0.0 ? (double)weight_bytes / (ms * 1e-3) / 1e9 : 0.0;
    r.frac = bw > 0.0 ? r.gbs / bw : 0.0;
    r.gmacs = ms > 0.0 ? (double)n * (double)rows * (double)cols / (ms * 1e-3) / 1e9 : 0.0;
    bk_print(o, cpu_simd_name(level), f->name, bk_shapes[si].name, n, &r, bw);
}

/* One shape in one format at every level and batch: level after level, or with
 * --interleave all levels at once, call by call. */
static int bk_case(const bk_opts_t *o, int si, const bk_format_t *f)
{
    int64_t rows = bk_shapes[si].rows, cols = bk_shapes[si].cols;
    size_t data, meta, each = bk_copy_bytes(f, rows, cols, &data, &meta);
    size_t weight_bytes = dtype_row_bytes(f->dtype, cols) * (size_t)rows +
                          (f->group ? 2 * (size_t)rows * (size_t)(cols / f->group) * 2 : 0);
    int copies = (int)(((size_t)o->pool_mib << 20) / each);
    if (copies < 2)
        copies = 2;
    size_t len = 0;
    uint8_t *pool = cpu_huge_map(each * (size_t)copies, &len);
    float *xh = malloc(sizeof *xh * (size_t)(BK_MAX_N * cols));
    bk_level_t L = {0};
    int e = 0, open = 0, next = 0; /* open: L holds a backend */
    if (!pool || !xh) {
        e = river_err_set(RIVER_ENOMEM, "bench kernels: a pool of %d copies of %s %s", copies,
                          f->name, bk_shapes[si].name);
        goto done;
    }
    bk_fill(pool, copies, data, meta, f);
    uint64_t s = 77;
    for (int64_t k = 0; k < BK_MAX_N * cols; k++)
        xh[k] = (float)((int64_t)(rng_next(&s) % 2001) - 1000) * 1e-3f;
    if (o->interleave) {
        /* One backend at the highest level asked for, which places the copies as that
         * level would (the pool's layouts are the format's: kept mapped, nothing is
         * repacked), then each level's sweep, one after another. */
        cpu_simd_t levels[CPU_SIMD_COUNT], top = CPU_SIMD_SCALAR;
        double bws[CPU_SIMD_COUNT];
        int nl = o->n_levels;
        for (int li = 0; li < nl; li++) {
            levels[li] = (cpu_simd_t)o->levels[li];
            top = levels[li] > top ? levels[li] : top;
        }
        e = bk_level_open(o, &L, top, f, pool, copies, data, meta, rows, cols, xh);
        if (e)
            goto done;
        open = 1;
        for (int li = 0; li < nl && !e; li++) {
            bws[li] = levels[li] == top ? L.bw
                                        : cpu_read_bandwidth_gbs(o->threads,
                                                                 (size_t)o->bw_mib << 20, 3,
                                                                 levels[li]);
            if (bws[li] < 0)
                e = (int)bws[li];
        }
        for (int bi = 0; bi < o->n_batches && !e; bi++) {
            int n = o->batches[bi], use[CPU_SIMD_COUNT];
            double ms[CPU_SIMD_COUNT], ms_min[CPU_SIMD_COUNT];
            for (int li = 0; li < nl; li++)
                use[li] = !(levels[li] == CPU_SIMD_SCALAR && n > o->scalar_max_n);
            e = bk_time_mixed(&L, levels, use, nl, copies, &next, n, o->runs, ms, ms_min);
            for (int li = 0; li < nl && !e; li++)
                if (use[li])
                    bk_report(o, levels[li], bws[li], f, si, n, ms[li], ms_min[li],
                              weight_bytes);
        }
        goto done;
    }
    for (int li = 0; li < o->n_levels && !e; li++) {
        e = bk_level_open(o, &L, (cpu_simd_t)o->levels[li], f, pool, copies, data, meta, rows,
                          cols, xh);
        if (e)
            break;
        open = 1;
        for (int bi = 0; bi < o->n_batches && !e; bi++) {
            int n = o->batches[bi];
            if (L.level == CPU_SIMD_SCALAR && n > o->scalar_max_n)
                continue;
            double ms = 0.0, ms_min = 0.0;
            e = bk_time(L.be, L.w, copies, &next, L.y, L.x, n, o->runs, &ms, &ms_min);
            if (!e)
                bk_report(o, L.level, L.bw, f, si, n, ms, ms_min, weight_bytes);
        }
        bk_level_close(&L);
        open = 0;
    }
done:
    if (open)
        bk_level_close(&L);
    free(xh);
    if (pool)
        (void)munmap(pool, len);
    return e;
}

/* Parses a comma list of names (levels, formats) or numbers (batches) into out. */
static int bk_parse_list(const char *arg, const char *what, int *out, int cap, int *count)
{
    char buf[256];
    if (strlen(arg) >= sizeof buf)
        return river_err_set(RIVER_EINVAL, "--%s: list too long", what);
    strcpy(buf, arg);
    *count = 0;
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (*count == cap)
            return river_err_set(RIVER_EINVAL, "--%s: more than %d entries", what, cap);
        int v = -1;
        if (!strcmp(what, "levels")) {
            cpu_simd_t l = cpu_simd_parse(t);
            v = l == CPU_SIMD_COUNT ? -1 : (int)l;
        } else if (!strcmp(what, "formats")) {
            for (int i = 0; i < BK_N_FORMATS; i++)
                if (!strcmp(t, bk_formats[i].name))
                    v = i;
        } else if (!strcmp(what, "shapes")) {
            for (int i = 0; i < BK_N_SHAPES; i++)
                if (!strcmp(t, bk_shapes[i].name))
                    v = i;
        } else {
            long n;
            v = cli_parse_int(t, 1, BK_MAX_N, &n) ? -1 : (int)n;
        }
        if (v < 0)
            return river_err_set(RIVER_EINVAL, "--%s: '%s' is not one", what, t);
        out[(*count)++] = v;
    }
    if (!*count)
        return river_err_set(RIVER_EINVAL, "--%s: empty list", what);
    return 0;
}

/* --peak: per level, the f32 FMA and 8-bit integer peaks (cpu_peak_gmacs), best of the
 * runs, as GFLOP/s and GOP/s (two operations a multiply-add): the yardsticks of prefill. The
 * float peak of avx512bf16 is vdpbf16ps's, which its bf16 matmuls run. Beside them the
 * ceiling of the level's Q8 prefill tile (CPU_PEAK_Q8_TILE, where the level has one) and
 * its fraction of the int8 peak: how much of that peak the work of Q8_0-style blocks leaves
 * to the tile. The kinds are measured in turn, a pass each a run, so that a slow second of
 * a shared host falls on all of them rather than on one's every pass. */
static int bk_peaks(const bk_opts_t *o)
{
    if (!o->json)
        printf("%-10s %8s %12s %12s %14s %9s\n", "level", "threads", "f32 GFLOP/s",
               "int8 GOP/s", "q8 tile GOP/s", "of int8");
    for (int li = 0; li < o->n_levels; li++) {
        cpu_simd_t level = (cpu_simd_t)o->levels[li];
        static const cpu_peak_t kind[3] = {CPU_PEAK_F32, CPU_PEAK_I8, CPU_PEAK_Q8_TILE};
        int kinds = 3; /* 2 where the level has no Q8 tile ceiling (cpu.h) */
        double best[3] = {0}; /* G multiply-adds/s of each kind */
        for (int r = 0; r < o->runs; r++)
            for (int k = 0; k < kinds; k++) {
                double g = cpu_peak_gmacs(o->threads, level, kind[k], 1);
                if (g == RIVER_EUNSUPPORTED && kind[k] == CPU_PEAK_Q8_TILE) {
                    kinds = 2;
                    break;
                }
                if (g < 0)
                    return (int)g;
                best[k] = fmax(best[k], g);
            }
        const char *name = cpu_simd_name(level);
        if (o->json && kinds == 3)
            printf("{\"level\":\"%s\",\"threads\":%d,\"peak_f32_gflops\":%.1f,"
                   "\"peak_i8_gops\":%.1f,\"q8_tile_gops\":%.1f}\n", name, o->threads,
                   2.0 * best[0], 2.0 * best[1], 2.0 * best[2]);
        else if (o->json)
            printf("{\"level\":\"%s\",\"threads\":%d,\"peak_f32_gflops\":%.1f,"
                   "\"peak_i8_gops\":%.1f}\n", name, o->threads, 2.0 * best[0], 2.0 * best[1]);
        else if (kinds == 3)
            printf("%-10s %8d %12.1f %12.1f %14.1f %9.2f\n", name, o->threads, 2.0 * best[0],
                   2.0 * best[1], 2.0 * best[2], best[2] / best[1]);
        else
            printf("%-10s %8d %12.1f %12.1f %14s %9s\n", name, o->threads, 2.0 * best[0],
                   2.0 * best[1], "-", "-");
        fflush(stdout);
    }
    return 0;
}

static void bk_usage(FILE *f)
{
    fprintf(f, "usage: river bench --kernels [--threads N] [--runs R] [--pool-mib P]\n"
               "                   [--bandwidth-mib M] [--levels L,..] [--formats F,..]\n"
               "                   [--batches N,..] [--shapes S,..] [--output text|json]\n"
               "                   [--peak] [--interleave]\n"
               "Times the CPU matmul on Llama 3.2 1B's matrix shapes from memory: per SIMD\n"
               "level (default every one the processor has), format (bf16, bf16x8, f16x8,\n"
               "q8-g32-z128, q8-g32, q8-g16-z32, q8x8-g32-z128, q8x8-g32-z16, q8x8-g16-z32,\n"
               "q4x8-g32, q4x8-g32-z8, q4x8-g64; -zZ: every zero Z, as llama.cpp's q8_0,\n"
               "Q6_K, Q5_0 and Q4_0 have them; q8 in the file's layout, q8x8 and q4x8 as\n"
               "the backend repacks them) and batch (1 to 512, default 1,2,4,8,128; the\n"
               "scalar level stops at 8), the median ms per call over R runs (default 5),\n"
               "the weight bytes (codes, scales, zeros) per second and their fraction of a\n"
               "read sweep of M MiB (default 1024) with the same threads (default 2) and\n"
               "that level's loads, taken before each shape's runs at each level, and G\n"
               "multiply-adds per second. Each shape is placed as distinct copies filling\n"
               "P MiB (default 1024, past the last-level cache), called in rotation.\n"
               "Shapes: 2048x2048, 512x2048, 8192x2048, 2048x8192, 128256x2048 (default\n"
               "all).\n"
               "--interleave times the levels together instead, their calls in turn, each\n"
               "call timed alone (the drift of a shared host's speed falls on every level\n"
               "alike; each level's sweep is taken before the first call of the shape).\n"
               "--peak instead measures the compute peaks prefill is judged against, per\n"
               "level: f32 FMA GFLOP/s and 8-bit integer GOP/s (vpmaddubsw, or vpdpbusd\n"
               "with AVX-512 VNNI), register-only chains on every thread, best of R runs;\n"
               "then the Q8 prefill tile's ceiling: that tile's instructions on operands in\n"
               "L1, the 8-bit products with each 32-column block's conversion and scaling,\n"
               "as GOP/s and as a fraction of the int8 peak.\n");
}

int bench_kernels(int argc, char **argv)
{
    bk_opts_t o = {.threads = 2, .runs = 5, .pool_mib = 1024, .bw_mib = 1024,
                   .scalar_max_n = 8};
    cpu_simd_t best = cpu_simd_detect();
    for (int l = 0; l <= (int)best; l++)
        o.levels[o.n_levels++] = l;
    static const int batches[] = {1, 2, 4, 8, 128};
    for (int i = 0; i < 5; i++)
        o.batches[o.n_batches++] = batches[i];
    for (int i = 0; i < BK_N_FORMATS; i++)
        o.formats[o.n_formats++] = i;
    for (int i = 0; i < BK_N_SHAPES; i++)
        o.shapes[o.n_shapes++] = i;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        long n;
        int e = 0, *num = NULL;
        long lo = 1, hi = 1 << 20;
        if (!strcmp(a, "--kernels"))
            continue;
        if (!strcmp(a, "--peak")) {
            o.peak = 1;
            continue;
        }
        if (!strcmp(a, "--interleave")) {
            o.interleave = 1;
            continue;
        }
        if (!strcmp(a, "--help")) {
            bk_usage(stdout);
            return 0;
        }
        if (!v) {
            bk_usage(stderr);
            return 2;
        }
        i++;
        if (!strcmp(a, "--threads")) {
            num = &o.threads;
            hi = 64;
        } else if (!strcmp(a, "--runs")) {
            num = &o.runs;
            hi = 1000;
        } else if (!strcmp(a, "--pool-mib")) {
            num = &o.pool_mib;
        } else if (!strcmp(a, "--bandwidth-mib")) {
            num = &o.bw_mib;
        } else if (!strcmp(a, "--levels")) {
            e = bk_parse_list(v, "levels", o.levels, CPU_SIMD_COUNT, &o.n_levels);
            for (int l = 0; !e && l < o.n_levels; l++)
                if (o.levels[l] > (int)best)
                    e = river_err_set(RIVER_EUNSUPPORTED, "--levels: this processor has up "
                                      "to %s", cpu_simd_name(best));
        } else if (!strcmp(a, "--formats")) {
            e = bk_parse_list(v, "formats", o.formats, BK_N_FORMATS, &o.n_formats);
        } else if (!strcmp(a, "--shapes")) {
            e = bk_parse_list(v, "shapes", o.shapes, BK_N_SHAPES, &o.n_shapes);
        } else if (!strcmp(a, "--batches")) {
            e = bk_parse_list(v, "batches", o.batches, BK_MAX_BATCHES, &o.n_batches);
        } else if (!strcmp(a, "--output")) {
            if (!strcmp(v, "json"))
                o.json = 1;
            else if (strcmp(v, "text")) {
                fprintf(stderr, "river bench: bad value '%s' for --output\n", v);
                return 2;
            }
        } else {
            fprintf(stderr, "river bench: --kernels does not take %s\n", a);
            bk_usage(stderr);
            return 2;
        }
        if (e)
            return cli_fail("bench", e);
        if (num) {
            if (cli_parse_int(v, lo, hi, &n)) {
                fprintf(stderr, "river bench: bad value '%s' for %s\n", v, a);
                return 2;
            }
            *num = (int)n;
        }
    }
    if (o.peak) {
        int e = bk_peaks(&o);
        return e ? cli_fail("bench", e) : 0;
    }
    if (!o.json)
        printf("%-10s %-12s %-12s %4s %10s %8s %8s %8s  %8s\n", "level", "format", "shape",
               "n", "ms", "GB/s", "bw GB/s", "of bw", "GMAC/s");
    for (int si = 0; si < o.n_shapes; si++)
        for (int fi = 0; fi < o.n_formats; fi++) {
            int e = bk_case(&o, o.shapes[si], &bk_formats[o.formats[fi]]);
            if (e)
                return cli_fail("bench", e);
        }
    return 0;
}
