/* One list of op cases run over every backend pair, as llama.cpp's test-backend-ops does:
 * each case runs an op of kernels/ops.h on the CPU backend (the reference) and on backend
 * X with the same inputs, and compares the outputs. X is the opaque backend everywhere
 * (the same CPU kernels behind memory the caller cannot touch: its results must equal the
 * reference bit for bit, so any difference is a wrong argument translation or a missing
 * upload) and the CUDA backend where a GPU exists (within each case's tolerance; without
 * one a single line says it is skipped). The CPU's SIMD levels are pairs too: AVX2 and
 * AVX-512 against the scalar level, each where the processor has it (a line says a level it
 * lacks is skipped), within each case's tolerance or the level's floor (simd_floor).
 *
 * The reference pairs hold the reference itself to account: the CPU at each level it has,
 * with one and with two threads, against plain loops written here (double-precision sums
 * for matmul and attention, exact results where the op is exact), on random inputs whose
 * odd sizes exercise vector tails, tile remainders and the split of work between threads.
 * A case with a check runs it there; its run covers the other pairs.
 *
 * The cases cover every op, including the router, the cosine, gather/scatter, kv_write,
 * attention and the buffers, at head dims 8 to 128, GQA groups 1 to 16, contexts above 1k
 * positions, row counts that are not a multiple of 8, a batched prompt (prefill rows of two
 * sequences with decode rows of others in one call), masked and NaN KV slots, Q4, Q8, Q4X8,
 * F16 and BF16 weights, and the real model shapes of Llama 3.2 1B (projections, LM head,
 * embedding; the largest on the GPU only).
 *
 * Tolerances (CUDA): max |x - ref| over max |ref| of the output, so a tolerance is a
 * fraction of the output's scale. Both backends accumulate in f32 in different orders,
 * hence 1e-4 for f32 math; the cuBLAS path for 16-bit weights (more than 8 rows) rounds x
 * to the weight's type first (GemmEx needs A and B of one type), hence 2e-3 (f16) and 1e-2
 * (bf16). Every case prints its error so a GPU run shows the margins. The CUDA reference is
 * the CPU at AVX-512 or the portable level (the AVX2 level quantizes x for Q4/Q8 weights);
 * the opaque reference is the CPU at the level the opaque backend runs, so that the two run
 * the very same kernels. */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/q4x8.h"
#include "kernels/cpu/rowblock.h"
#include "kernels/half.h"
#include "kernels/kv_row.h"
#include "tests/testutil.h"

#ifdef RIVER_CUDA
#include "kernels/cuda/cuda.h"
#endif

#define CUDA_SKIP_LINE "no CUDA device: the CUDA column of the op tests is skipped"
#define THREADS 2

static float *rand_host(size_t n, float lo, float hi)
{
    float *p = malloc(n * sizeof *p);
    ck_assert_ptr_nonnull(p);
    for (size_t i = 0; i < n; i++)
        p[i] = test_rand(lo, hi);
    return p;
}

/* ---- a reference and a backend under test ---------------------------------------------- */

typedef struct bpair {
    backend_t *ref, *x; /* ref is NULL on a reference pair: x meets the case's own check */
    const char *name;   /* of x */
    double scale;       /* multiplies a case's tolerance: 0 for the opaque backend (exact) */
    double floor;       /* the least tolerance (a SIMD level's summation order); 0: none */
    int level;          /* a SIMD or reference pair's level (cpu_simd_t), -1 for the others */
    int threads;        /* a reference pair's CPU threads; 0 for the others */
} bpair_t;

/* Pairs 0-4: opaque, cuda, and the CPU at AVX2, AVX-512 and AVX512-BF16 against its scalar
 * level. Pairs 5-12, the reference pairs: the CPU at each level (scalar, AVX2, AVX-512,
 * AVX512-BF16) with one and with two threads, against the double-precision reference of the
 * case's check (the scalar level's own reference, and each level's bound: the AVX2 8-bit x
 * and the bf16 x of bf16 weights at AVX512-BF16, for two). */
#define N_PAIRS 13
#define FIRST_REF_PAIR 5

/* The SIMD level of pair k, or -1 when k is neither a SIMD nor a reference pair. */
static int bpair_level(int k)
{
    if (k >= FIRST_REF_PAIR)
        return (k - FIRST_REF_PAIR) / 2;
    return k == 2 ? CPU_SIMD_AVX2 : k == 3 ? CPU_SIMD_AVX512 : k == 4 ? CPU_SIMD_AVX512BF16 : -1;
}

/* Opens pair k (0: opaque, 1: cuda, 2: avx2, 3: avx512, 4: avx512bf16, 5-12: the reference
 * pairs); false when that backend or level is not there. */
static bool bpair_open(bpair_t *p, int k)
{
    memset(p, 0, sizeof *p);
    p->level = bpair_level(k);
    if (k >= FIRST_REF_PAIR) {
        if ((int)cpu_simd_detect() < p->level)
            return false;
        p->threads = 1 + (k - FIRST_REF_PAIR) % 2;
        int e = cpu_backend_new(&p->x, p->threads, (cpu_simd_t)p->level);
        ck_assert_msg(e == 0, "%s", river_err_detail());
        ck_assert_int_eq(cpu_backend_threads(p->x), p->threads);
        p->name = cpu_simd_name((cpu_simd_t)p->level);
        return true;
    }
    if (p->level >= 0) {
        if ((int)cpu_simd_detect() < p->level)
            return false;
        int e = cpu_backend_new(&p->ref, THREADS, CPU_SIMD_SCALAR);
        ck_assert_msg(e == 0, "%s", river_err_detail());
        e = cpu_backend_new(&p->x, THREADS, (cpu_simd_t)p->level);
        ck_assert_msg(e == 0, "%s", river_err_detail());
        p->name = cpu_simd_name((cpu_simd_t)p->level);
        p->scale = 1;
        return true;
    }
    if (k == 0) {
        ck_assert_msg(backend_open(&p->x, "opaque", THREADS, BACKEND_WEIGHTS_COPY) == 0, "%s", river_err_detail());
        ck_assert_msg(backend_open(&p->ref, "cpu", THREADS, BACKEND_WEIGHTS_COPY) == 0, "%s", river_err_detail());
        p->name = "opaque";
        p->scale = 0;
        return true;
    }
#ifdef RIVER_CUDA
    if (cuda_device_count() <= 0)
        return false;
    ck_assert_msg(cuda_backend_new(&p->x, 0) == 0, "%s", river_err_detail());
    /* The scalar level: the SIMD levels multiply Q4/Q8 weights by x rounded to 8 bits, and
     * CUDA's kernels (W4A16) take x as it is. */
    int e = cpu_backend_new(&p->ref, THREADS, CPU_SIMD_SCALAR);
    ck_assert_msg(e == 0, "%s", river_err_detail());
    p->name = "cuda";
    p->scale = 1;
    return true;
#else
    return false;
#endif
}

static void bpair_close(bpair_t *p)
{
    backend_destroy(&p->x);
    backend_destroy(&p->ref);
}

/* One buffer on each backend holding the same floats. */
typedef struct twin {
    void *r, *x;
    size_t n;
} twin_t;

static twin_t twin_new(bpair_t *p, const float *h, size_t n)
{
    twin_t t = {p->ref->ops->buf_alloc(p->ref->ctx, n), p->x->ops->buf_alloc(p->x->ctx, n), n};
    ck_assert_msg(t.r && t.x, "buffers of %zu floats: %s", n, river_err_detail());
    if (h) {
        ck_assert_int_eq(p->ref->ops->from_host(p->ref->ctx, t.r, 0, h, n), 0);
        ck_assert_int_eq(p->x->ops->from_host(p->x->ctx, t.x, 0, h, n), 0);
    }
    return t;
}

static twin_t twin_rand(bpair_t *p, size_t n, float lo, float hi)
{
    float *h = rand_host(n, lo, hi);
    twin_t t = twin_new(p, h, n);
    free(h);
    return t;
}

static void twin_free(bpair_t *p, twin_t *t)
{
    p->ref->ops->buf_free(p->ref->ctx, t->r);
    p->x->ops->buf_free(p->x->ctx, t->x);
}

/* max |x - ref| / max |ref| (NaN counts as the worst). */
static double rel_err(const float *a, const float *b, size_t n)
{
    double m = 0, d = 0;
    for (size_t i = 0; i < n; i++) {
        m = fabs(a[i]) > m ? fabs(a[i]) : m;
        double e = fabs((double)a[i] - b[i]);
        if (!(e <= d))
            d = e;
    }
    return m > 0 ? d / m : d;
}

static void check_host(bpair_t *p, const float *a, const float *b, size_t n, double tol,
                       const char *what)
{
    double lim = fmax(tol * p->scale, p->floor);
    if (p->scale == 0) {
        for (size_t i = 0; i < n; i++)
            ck_assert_msg(memcmp(&a[i], &b[i], sizeof a[i]) == 0, "%s on %s: element %zu is "
                          "%.9g, the CPU's %.9g", what, p->name, i, b[i], a[i]);
        return;
    }
    double e = rel_err(a, b, n);
    printf("%-6s %-52s rel err %.3g (tol %.1g)\n", p->name, what, e, lim);
    ck_assert_msg(e <= lim, "%s on %s: rel err %g above %g", what, p->name, e, lim);
}

static void check_twin(bpair_t *p, const twin_t *t, double tol, const char *what)
{
    float *a = malloc(t->n * sizeof *a), *b = malloc(t->n * sizeof *b);
    ck_assert_int_eq(p->ref->ops->to_host(p->ref->ctx, a, t->r, 0, t->n), 0);
    int e = p->x->ops->to_host(p->x->ctx, b, t->x, 0, t->n);
    ck_assert_msg(e == 0, "to_host on %s: %s", p->name, river_err_detail());
    check_host(p, a, b, t->n, tol, what);
    free(a);
    free(b);
}

/* A host weight of random values (Q4/Q8: random codes, scales and zeros). */
static weight_t weight_rand(dtype_t dt, int64_t rows, int64_t cols, int group, float amp)
{
    weight_t w = {.dtype = dt, .rows = rows, .cols = cols};
    size_t n = (size_t)rows * (size_t)cols;
    if (dt == DTYPE_F32) {
        w.data = rand_host(n, -amp, amp);
    } else if (dt == DTYPE_F16 || dt == DTYPE_BF16) {
        uint16_t *d = malloc(n * sizeof *d);
        for (size_t i = 0; i < n; i++) {
            float v = test_rand(-amp, amp);
            d[i] = dt == DTYPE_F16 ? f32_to_f16(v) : f32_to_bf16(v);
        }
        w.data = d;
    } else {
        size_t bytes = (size_t)rows * dtype_row_bytes(dt, cols);
        uint8_t *d = malloc(bytes);
        for (size_t i = 0; i < bytes; i++)
            d[i] = (uint8_t)test_rand_u32();
        size_t ng = (size_t)rows * (size_t)(cols / group);
        uint16_t *s = malloc(ng * sizeof *s), *z = malloc(ng * sizeof *z);
        float qmax = (float)((1 << dtype_quant_bits(dt)) - 1);
        for (size_t i = 0; i < ng; i++) {
            s[i] = f32_to_f16(amp * 0.1f * test_rand(0.2f, 1.0f) * 128.0f / (qmax + 1.0f));
            z[i] = f32_to_f16(test_rand(0.3f * qmax, 0.7f * qmax));
        }
        w.data = d;
        w.scales = s;
        w.zeros = z;
        w.group = group;
    }
    return w;
}

static void weight_host_free(weight_t *w)
{
    free((void *)w->data);
    free((void *)w->scales);
    free((void *)w->zeros);
}

/* The weight as each backend reads it: placed with weight_upload (in place on the CPU). */
typedef struct wtwin {
    weight_t host, r, x;
} wtwin_t;

static wtwin_t wtwin_new(bpair_t *p, weight_t host)
{
    wtwin_t w = {host, host, host};
    ck_assert_int_eq(p->ref->ops->weight_upload(p->ref->ctx, &w.r), 0);
    int e = p->x->ops->weight_upload(p->x->ctx, &w.x);
    ck_assert_msg(e == 0, "weight_upload on %s: %s", p->name, river_err_detail());
    return w;
}

#define BOTH(p, call_r, call_x)                                                              \
    do {                                                                                     \
        int er_ = (call_r);                                                                  \
        ck_assert_msg(er_ == 0, "reference: %s", river_err_detail());                        \
        int ex_ = (call_x);                                                                  \
        ck_assert_msg(ex_ == 0, "%s: %s", (p)->name, river_err_detail());                    \
    } while (0)

#define OR(p) (p)->ref->ops, (p)->ref->ctx
#define OX(p) (p)->x->ops, (p)->x->ctx

/* ---- the cases ------------------------------------------------------------------------- */

typedef struct op_case op_case_t;
struct op_case {
    const char *name;
    void (*run)(bpair_t *p, const op_case_t *c);   /* on pairs 0-3; NULL: none */
    void (*check)(bpair_t *p, const op_case_t *c); /* on the reference pairs; NULL: none */
    dtype_t dt;
    int a, b, c, d, e, f; /* the case's shape; each run and check says what they are */
    double tol;           /* CUDA; 0 on a matmul over mm_ns: the path's (mm_tol) */
    int gpu_only;         /* real model shapes too large to be worth the CPU's time twice */
    const char *env;      /* "NAME=VALUE" the case sets, RIVER_Q4X8=0 or RIVER_ROWBLOCK=0
                             (NULL: none, the SIMD levels repack) */
};

/* The row counts a matmul case of c = 0 runs: GEMV sizes, the 8-row passes and their
 * remainders, and batches. */
static const int mm_ns[] = {1, 2, 3, 4, 5, 8, 9, 16, 17, 40, 70};
#define N_MM_NS ((int)(sizeof mm_ns / sizeof mm_ns[0]))

/* The CUDA tolerance of a matmul of n rows: the cuBLAS path (n > 8) rounds x to a 16-bit
 * weight's type first. */
static double mm_tol(dtype_t dt, int n)
{
    if (n > 8 && dt == DTYPE_F16)
        return 2e-3;
    if (n > 8 && dt == DTYPE_BF16)
        return 1e-2;
    return 1e-4;
}

/* On a CPU backend at `level`: where cpu_matmul_rows_alone says so, each row of the n-row
 * product y = x W^T (already computed) has the same bits as that row's product alone. It
 * must say so for float weights at every level and for Q8X8 and Q4X8 from AVX2 on: lossless
 * mode and the prefix cache rest on it. */
static void check_rows_alone(backend_t *b, cpu_simd_t level, const weight_t *w, void *x,
                             void *y, int n, const char *what)
{
    dtype_t et = cpu_rowblock_elem(w->dtype);
    bool flt = et == DTYPE_F32 || et == DTYPE_BF16 || et == DTYPE_F16;
    /* Q8 on the integer kernels (whole 32-column blocks, or groups of 16 as llama.cpp's Q6_K
     * has them) never takes the prefill GEMM either. */
    if (flt || (level >= CPU_SIMD_AVX2 && (w->dtype == DTYPE_Q8X8 || w->dtype == DTYPE_Q4X8 ||
                                           cpu_q8_int_eligible(w))))
        ck_assert_msg(cpu_matmul_rows_alone(level, w, n), "%s: %s at %d rows", what,
                      cpu_simd_name(level), n);
    if (!cpu_matmul_rows_alone(level, w, n))
        return;
    const ops_t *o = b->ops;
    size_t cols = (size_t)w->cols, rows = (size_t)w->rows;
    float *xh = malloc(sizeof *xh * cols * (size_t)n), *yh = malloc(sizeof *yh * rows * (size_t)n);
    float *y1 = malloc(sizeof *y1 * rows);
    ck_assert(xh && yh && y1);
    ck_assert_int_eq(o->to_host(b->ctx, xh, x, 0, cols * (size_t)n), 0);
    ck_assert_int_eq(o->to_host(b->ctx, yh, y, 0, rows * (size_t)n), 0);
    void *xb = o->buf_alloc(b->ctx, cols), *yb = o->buf_alloc(b->ctx, rows);
    ck_assert(xb && yb);
    for (int i = 0; i < n; i++) {
        ck_assert_int_eq(o->from_host(b->ctx, xb, 0, xh + (size_t)i * cols, cols), 0);
        ck_assert_int_eq(o->matmul(b->ctx, yb, xb, w, 1), 0);
        ck_assert_int_eq(o->to_host(b->ctx, y1, yb, 0, rows), 0);
        for (size_t r = 0; r < rows; r++)
            ck_assert_msg(memcmp(&y1[r], &yh[(size_t)i * rows + r], sizeof *y1) == 0,
                          "%s at %s: row %d of %d, output %zu is %.9g alone, %.9g in the batch",
                          what, cpu_simd_name(level), i, n, r, y1[r], yh[(size_t)i * rows + r]);
    }
    o->buf_free(b->ctx, xb);
    o->buf_free(b->ctx, yb);
    free(xh);
    free(yh);
    free(y1);
}

/* Q2/Q3 have CPU kernels only: on the CUDA pair the upload of such a weight must fail with
 * RIVER_EDTYPE naming the type and leave the weight as it was, which is all a case of those
 * types checks there (true: done). */
static bool lowbit_refused(bpair_t *p, dtype_t dt, int64_t rows, int64_t cols, int group)
{
    if ((dt != DTYPE_Q2 && dt != DTYPE_Q3) || strcmp(p->name, "cuda") != 0)
        return false;
    weight_t h = weight_rand(dt, rows, cols, group, 0.05f), x = h;
    ck_assert_int_eq(p->x->ops->weight_upload(p->x->ctx, &x), RIVER_EDTYPE);
    ck_assert_msg(strstr(river_err_detail(), dtype_name(dt)), "%s", river_err_detail());
    ck_assert_ptr_eq(x.data, h.data);
    weight_host_free(&h);
    return true;
}

/* Whether the case sets `setting` ("RIVER_Q4X8=0", say). */
static bool case_env(const op_case_t *c, const char *setting)
{
    return c->env && strcmp(c->env, setting) == 0;
}

/* The dtype a case places: the file's type of the CPU's own layouts (Q4X8, Q8X8, BF16X8,
 * F16X8), which the SIMD levels repack it into. */
static dtype_t case_file_dtype(dtype_t dt)
{
    switch (dt) {
    case DTYPE_Q4X8:
        return DTYPE_Q4;
    case DTYPE_Q8X8:
        return DTYPE_Q8;
    case DTYPE_BF16X8:
        return DTYPE_BF16;
    case DTYPE_F16X8:
        return DTYPE_F16;
    default:
        return dt;
    }
}

/* matmul: a outputs, b inputs, c rows (0: each count of mm_ns), d group. A Q4X8 case places
 * Q4 codes, which the SIMD levels repack unless RIVER_Q4X8=0 (the case's env) says not; bf16
 * and f16 weights of whole 8-row blocks of 32-column chunks are repacked into the row-blocked
 * layout unless RIVER_ROWBLOCK=0, and others stay row-major. */
static void run_matmul(bpair_t *p, const op_case_t *c)
{
    dtype_t dt = case_file_dtype(c->dt);
    if (lowbit_refused(p, dt, c->a, c->b, c->d))
        return;
    weight_t host = weight_rand(dt, c->a, c->b, c->d, 0.05f);
    if (c->e) /* every zero the integer c->e */
        for (int64_t i = 0; i < c->a * (c->b / c->d); i++)
            ((uint16_t *)host.zeros)[i] = f32_to_f16((float)c->e);
    wtwin_t w = wtwin_new(p, host);
    if (p->level >= 0) /* the CPU's placement marks it */
        ck_assert_int_eq(w.x.zero_int, c->e);
    bool q4x8_off = case_env(c, "RIVER_Q4X8=0");
    if (p->level >= CPU_SIMD_AVX2 && dt == DTYPE_Q4 && (q4x8_off || c->dt == DTYPE_Q4X8))
        ck_assert_int_eq(w.x.dtype, q4x8_off ? DTYPE_Q4 : DTYPE_Q4X8);
    if (p->level >= CPU_SIMD_AVX2 && dt == DTYPE_Q8 && (q4x8_off || c->dt == DTYPE_Q8X8))
        ck_assert_int_eq(w.x.dtype, q4x8_off ? DTYPE_Q8 : DTYPE_Q8X8);
    if (p->level >= 0 && (dt == DTYPE_BF16 || dt == DTYPE_F16)) {
        bool blocked = p->level >= CPU_SIMD_AVX2 && !case_env(c, "RIVER_ROWBLOCK=0") &&
                       c->a % CPU_ROWBLOCK_ROWS == 0 && (c->b * 2) % CPU_ROWBLOCK_CHUNK == 0;
        ck_assert_int_eq(w.x.dtype, !blocked ? dt : dt == DTYPE_BF16 ? DTYPE_BF16X8
                                                                   : DTYPE_F16X8);
    }
    for (int k = 0; k < (c->c ? 1 : N_MM_NS); k++) {
        int n = c->c ? c->c : mm_ns[k];
        twin_t x = twin_rand(p, (size_t)n * c->b, -1, 1);
        twin_t y = twin_new(p, NULL, (size_t)n * c->a);
        BOTH(p, p->ref->ops->matmul(p->ref->ctx, y.r, x.r, &w.r, n),
             p->x->ops->matmul(p->x->ctx, y.x, x.x, &w.x, n));
        char what[96];
        if (c->c)
            snprintf(what, sizeof what, "%s", c->name);
        else
            snprintf(what, sizeof what, "%s n %d", c->name, n);
        check_twin(p, &y, c->tol ? c->tol : mm_tol(dt, n), what);
        if (p->level >= 0) { /* a SIMD pair: the level, and the scalar level its reference */
            check_rows_alone(p->x, (cpu_simd_t)p->level, &w.x, x.x, y.x, n, what);
            check_rows_alone(p->ref, CPU_SIMD_SCALAR, &w.r, x.r, y.r, n, what);
        }
        twin_free(p, &x);
        twin_free(p, &y);
    }
    weight_host_free(&w.host);
}

/* matmul_multi (ops_matmuls): f weights of b columns, the first of a rows and the others
 * of e (q, then k and v; or gate and up), over mm_ns, group d. The first weight is of the
 * case's type and the others too, except that where c is 1 they are F32, which a backend
 * must then run one by one. On every pair each output has the bits of x's own
 * matmul of its weight alone, and the x backend's outputs meet the reference's matmuls
 * within the matmul tolerance (exactly on the opaque pair). */
static void run_matmul_multi(bpair_t *p, const op_case_t *c)
{
    dtype_t dt = case_file_dtype(c->dt);
    int count = c->f;
    ck_assert(count >= 2 && count <= OPS_MATMULS_MAX);
    wtwin_t w[OPS_MATMULS_MAX];
    const weight_t *wr[OPS_MATMULS_MAX], *wx[OPS_MATMULS_MAX];
    for (int i = 0; i < count; i++) {
        dtype_t di = i > 0 && c->c == 1 ? DTYPE_F32 : dt;
        weight_t h = weight_rand(di, i ? c->e : c->a, c->b, di == DTYPE_F32 ? 0 : c->d, 0.05f);
        if (c->dt == DTYPE_Q8X8) /* every zero 128: the layout of llama.cpp's q8_0 */
            for (int64_t g = 0; g < h.rows * (h.cols / h.group); g++)
                ((uint16_t *)h.zeros)[g] = f32_to_f16(128.0f);
        w[i] = wtwin_new(p, h);
        wr[i] = &w[i].r;
        wx[i] = &w[i].x;
    }
    if (p->level >= CPU_SIMD_AVX2 && c->dt != dt) /* the repacked layout is the point */
        ck_assert_int_eq(w[0].x.dtype, c->dt);
    if (p->level >= 0) { /* weights of other widths are refused, naming the one at fault */
        float zeros[16] = {0};
        weight_t narrow = {.dtype = DTYPE_F32, .rows = 1, .cols = 16, .data = zeros};
        const weight_t *wb[2] = {wx[0], &narrow};
        void *yb[2] = {NULL, NULL};
        ck_assert_int_eq(p->x->ops->matmul_multi(p->x->ctx, yb, NULL, wb, 2, 1), RIVER_ESHAPE);
        ck_assert_msg(strstr(river_err_detail(), "weight 1"), "%s", river_err_detail());
        /* A missing output is refused too, naming its weight. */
        twin_t x1 = twin_rand(p, (size_t)c->b, -1, 1);
        twin_t y0 = twin_new(p, NULL, (size_t)wx[0]->rows);
        wb[1] = wx[1];
        yb[0] = y0.x;
        ck_assert_int_eq(p->x->ops->matmul_multi(p->x->ctx, yb, x1.x, wb, 2, 1), RIVER_EINVAL);
        ck_assert_msg(strstr(river_err_detail(), "weight 1"), "%s", river_err_detail());
        twin_free(p, &x1);
        twin_free(p, &y0);
    }
    for (int k = 0; k < N_MM_NS; k++) {
        int n = mm_ns[k];
        twin_t x = twin_rand(p, (size_t)n * c->b, -1, 1);
        twin_t y[OPS_MATMULS_MAX];
        void *yr[OPS_MATMULS_MAX], *yx[OPS_MATMULS_MAX];
        for (int i = 0; i < count; i++) {
            y[i] = twin_new(p, NULL, (size_t)n * wr[i]->rows);
            yr[i] = y[i].r;
            yx[i] = y[i].x;
        }
        BOTH(p, ops_matmuls(p->ref->ops, p->ref->ctx, yr, x.r, wr, count, n),
             ops_matmuls(p->x->ops, p->x->ctx, yx, x.x, wx, count, n));
        for (int i = 0; i < count; i++) {
            char what[96];
            snprintf(what, sizeof what, "%s w%d n %d", c->name, i, n);
            check_twin(p, &y[i], mm_tol(wr[i]->dtype, n), what);
            /* The one weight's matmul on x: the same bits. */
            size_t m = (size_t)n * (size_t)wx[i]->rows;
            twin_t one = twin_new(p, NULL, m);
            ck_assert_int_eq(p->x->ops->matmul(p->x->ctx, one.x, x.x, wx[i], n), 0);
            float *a = malloc(m * sizeof *a), *b = malloc(m * sizeof *b);
            ck_assert(a && b);
            ck_assert_int_eq(p->x->ops->to_host(p->x->ctx, a, one.x, 0, m), 0);
            ck_assert_int_eq(p->x->ops->to_host(p->x->ctx, b, y[i].x, 0, m), 0);
            for (size_t r = 0; r < m; r++)
                ck_assert_msg(memcmp(&a[r], &b[r], sizeof *a) == 0, "%s on %s: output %zu is "
                              "%.9g in one call, %.9g alone", what, p->name, r, b[r], a[r]);
            free(a);
            free(b);
            twin_free(p, &one);
            twin_free(p, &y[i]);
        }
        twin_free(p, &x);
    }
    for (int i = 0; i < count; i++)
        weight_host_free(&w[i].host);
}

/* embed: a vocab, b dim, c tokens, d group (0: 64). */
static void run_embed(bpair_t *p, const op_case_t *c)
{
    if (lowbit_refused(p, c->dt, c->a, c->b, c->d ? c->d : 64))
        return;
    wtwin_t w = wtwin_new(p, weight_rand(c->dt, c->a, c->b, c->d ? c->d : 64, 0.5f));
    int32_t *tok = malloc(sizeof *tok * (size_t)c->c);
    for (int i = 0; i < c->c; i++)
        tok[i] = (int32_t)(test_rand_u32() % (uint32_t)c->a);
    tok[0] = c->a - 1;
    twin_t out = twin_new(p, NULL, (size_t)c->c * c->b);
    BOTH(p, p->ref->ops->embed(p->ref->ctx, out.r, &w.r, tok, c->c),
         p->x->ops->embed(p->x->ctx, out.x, &w.x, tok, c->c));
    check_twin(p, &out, c->tol, c->name);
    int32_t bad = c->a;
    ck_assert_int_eq(p->x->ops->embed(p->x->ctx, out.x, &w.x, &bad, 1), RIVER_ERANGE);
    twin_free(p, &out);
    free(tok);
    weight_host_free(&w.host);
}

/* rmsnorm (in place too), add_bias, add: a rows, b width. */
static void run_norm_add(bpair_t *p, const op_case_t *c)
{
    int n = c->a, d = c->b;
    wtwin_t w = wtwin_new(p, weight_rand(c->dt, 1, d, 0, 1.0f));
    twin_t x = twin_rand(p, (size_t)n * d, -2, 2), out = twin_new(p, NULL, (size_t)n * d);
    char what[96];
    BOTH(p, p->ref->ops->rmsnorm(p->ref->ctx, out.r, x.r, &w.r, n, d, 1e-5f),
         p->x->ops->rmsnorm(p->x->ctx, out.x, x.x, &w.x, n, d, 1e-5f));
    snprintf(what, sizeof what, "%s rmsnorm", c->name);
    check_twin(p, &out, c->tol, what);
    BOTH(p, p->ref->ops->rmsnorm(p->ref->ctx, x.r, x.r, &w.r, n, d, 1e-5f),
         p->x->ops->rmsnorm(p->x->ctx, x.x, x.x, &w.x, n, d, 1e-5f));
    snprintf(what, sizeof what, "%s rmsnorm in place", c->name);
    check_twin(p, &x, c->tol, what);
    BOTH(p, p->ref->ops->add_bias(p->ref->ctx, out.r, &w.r, n, d),
         p->x->ops->add_bias(p->x->ctx, out.x, &w.x, n, d));
    snprintf(what, sizeof what, "%s add_bias", c->name);
    check_twin(p, &out, c->tol, what);
    BOTH(p, p->ref->ops->add(p->ref->ctx, out.r, x.r, (size_t)n * d),
         p->x->ops->add(p->x->ctx, out.x, x.x, (size_t)n * d));
    snprintf(what, sizeof what, "%s add", c->name);
    check_twin(p, &out, c->tol, what);
    twin_free(p, &x);
    twin_free(p, &out);
    weight_host_free(&w.host);
}

/* rope: a rows, b heads, c head_dim, d rot_dim; both layouts, positions past 1k. */
static void run_rope(bpair_t *p, const op_case_t *c)
{
    int n = c->a, heads = c->b, hd = c->c, rot = c->d;
    int32_t *pos = malloc(sizeof *pos * (size_t)n);
    for (int i = 0; i < n; i++)
        pos[i] = i * 397 % 4096;
    float *inv = malloc(sizeof *inv * (size_t)(rot / 2));
    for (int f = 0; f < rot / 2; f++)
        inv[f] = powf(500000.0f, -2.0f * (float)f / (float)rot);
    for (int layout = 0; layout < 2; layout++) {
        rope_t r = {.layout = (rope_layout_t)layout, .head_dim = hd, .rot_dim = rot,
                    .inv_freq = inv, .attn_factor = rot < hd ? 1.2f : 1.0f};
        twin_t x = twin_rand(p, (size_t)n * heads * hd, -1, 1);
        BOTH(p, p->ref->ops->rope(p->ref->ctx, x.r, pos, n, heads, &r),
             p->x->ops->rope(p->x->ctx, x.x, pos, n, heads, &r));
        char what[96];
        snprintf(what, sizeof what, "%s layout %d", c->name, layout);
        check_twin(p, &x, c->tol, what);
        twin_free(p, &x);
    }
    free(pos);
    free(inv);
}

/* swiglu: a rows, b width, c row stride (0: 2b). A stride of at least 2b is a fused
 * gate_up row (up at column b); a shorter one gives gate and up the same values. */
static void run_swiglu(bpair_t *p, const op_case_t *c)
{
    int n = c->a, d = c->b, stride = c->c ? c->c : 2 * d, up = stride >= 2 * d ? d : 0;
    twin_t gu = twin_rand(p, (size_t)n * stride, -4, 4), out = twin_new(p, NULL, (size_t)n * d);
    BOTH(p, p->ref->ops->swiglu(p->ref->ctx, out.r, gu.r, (float *)gu.r + up, n, d, stride),
         p->x->ops->swiglu(p->x->ctx, out.x, gu.x, (float *)gu.x + up, n, d, stride));
    check_twin(p, &out, c->tol, c->name);
    twin_free(p, &gu);
    twin_free(p, &out);
}

/* kv_write and attention: a head_dim, b KV heads, c GQA group (query heads per KV head),
 * d context of the long sequence. Sequence A (d positions) and B (40) are written in one
 * kv_write of every position; then one batched call: a prompt chunk of A's last 37
 * positions, B's last 3 and decode rows of both (42 rows, not a multiple of 8); then 5
 * decode rows with out aliasing q; then a kv_valid mask. */
/* The K and V bytes of two pools, which must be the same bits: kv_write rounds each value
 * one way on every backend (kernels/kv_row.h; CUDA's rounding to nearest even), and a
 * 16-bit or 8-bit pool read as floats would not compare by value. */
static void check_kv_bits(bpair_t *p, const twin_t *t, dtype_t dt, const char *what)
{
    if (dt == DTYPE_F32) {
        check_twin(p, t, 0, what);
        return;
    }
    uint32_t *a = malloc(t->n * sizeof *a), *b = malloc(t->n * sizeof *b);
    ck_assert_int_eq(p->ref->ops->to_host(p->ref->ctx, (float *)a, t->r, 0, t->n), 0);
    ck_assert_int_eq(p->x->ops->to_host(p->x->ctx, (float *)b, t->x, 0, t->n), 0);
    for (size_t i = 0; i < t->n; i++)
        ck_assert_msg(a[i] == b[i], "%s on %s: word %zu is %08x, the CPU's %08x", what,
                      p->name, i, b[i], a[i]);
    free(a);
    free(b);
}

/* attention and kv_write: a head_dim, b KV heads, c query heads per KV head, d positions of
 * sequence A; the case's dt is the pool's element type (kv_view_t.dtype). */
static void run_attention(bpair_t *p, const op_case_t *c)
{
    enum { PS = 16, LAYERS = 2, LEN_B = 40, CHUNK = 37 };
    int hd = c->a, kvh = c->b, h = c->b * c->c, len_a = c->d, kv_dim = kvh * hd;
    int pages_a = (len_a + PS - 1) / PS, pages_b = (LEN_B + PS - 1) / PS;
    int n_pages = pages_a + pages_b + 3;
    kv_view_t vr = {.page_size = PS, .kv_dim = kv_dim, .n_pages = n_pages,
                    .layer_stride = (int64_t)PS * kv_dim, .dtype = c->dt};
    vr.page_stride = LAYERS * vr.layer_stride;
    size_t kv_elems = (size_t)n_pages * (size_t)vr.page_stride;
    size_t codes = kv_dtype_bytes(c->dt, (int64_t)kv_elems);
    size_t kv_floats = (codes + kv_dtype_scale_bytes(c->dt, (int64_t)kv_elems)) / sizeof(float);
    twin_t K = twin_new(p, NULL, kv_floats), V = twin_new(p, NULL, kv_floats);
    kv_view_t vx = vr;
    vr.k = K.r;
    vr.v = V.r;
    vx.k = K.x;
    vx.v = V.x;
    if (c->dt == DTYPE_Q8) {
        /* The scales follow the codes, as in a pool (engine/kv_pool.c). */
        vr.k_scale = (float *)((char *)K.r + codes);
        vr.v_scale = (float *)((char *)V.r + codes);
        vx.k_scale = (float *)((char *)K.x + codes);
        vx.v_scale = (float *)((char *)V.x + codes);
    }
    /* Pages handed out in a shuffled order, as a pool does after some churn. */
    int32_t *perm = malloc(sizeof *perm * (size_t)n_pages);
    for (int i = 0; i < n_pages; i++)
        perm[i] = i;
    for (int i = n_pages - 1; i > 0; i--) {
        int j = (int)(test_rand_u32() % (uint32_t)(i + 1));
        int32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    const int32_t *pt_a = perm, *pt_b = perm + pages_a;
    const int layer = 1;
    float scale = 1.0f / sqrtf((float)hd);
    int n = len_a + LEN_B;
    int32_t *pos = malloc(sizeof *pos * (size_t)n);
    const int32_t **pts = malloc(sizeof *pts * (size_t)n);
    for (int i = 0; i < n; i++) {
        pos[i] = i < len_a ? i : i - len_a;
        pts[i] = i < len_a ? pt_a : pt_b;
    }
    attn_batch_t b = {.n = n, .pos = pos, .page_table = pts};
    twin_t k = twin_rand(p, (size_t)n * kv_dim, -1, 1);
    twin_t v = twin_rand(p, (size_t)n * kv_dim, -1, 1);
    char what[96];
    if (c->dt == DTYPE_Q8 && strcmp(p->name, "cuda") == 0) {
        /* Q8 pools are the CPU's only: CUDA refuses them by name. */
        ck_assert_int_eq(p->x->ops->kv_write(p->x->ctx, &vx, layer, &b, k.x, v.x),
                         RIVER_EUNSUPPORTED);
        ck_assert_msg(strstr(river_err_detail(), "kv.dtype q8"), "%s", river_err_detail());
        free(pos);
        free(pts);
        free(perm);
        twin_t *all[] = {&K, &V, &k, &v};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
            twin_free(p, all[i]);
        return;
    }
    BOTH(p, p->ref->ops->kv_write(p->ref->ctx, &vr, layer, &b, k.r, v.r),
         p->x->ops->kv_write(p->x->ctx, &vx, layer, &b, k.x, v.x));
    snprintf(what, sizeof what, "%s kv_write K", c->name);
    check_kv_bits(p, &K, c->dt, what);
    snprintf(what, sizeof what, "%s kv_write V", c->name);
    check_kv_bits(p, &V, c->dt, what);

    /* The batched call: A's prompt chunk, B's last three, both of their last positions. */
    int nb = CHUNK + 3 + 2;
    int32_t *bpos = malloc(sizeof *bpos * (size_t)nb);
    const int32_t **bpt = malloc(sizeof *bpt * (size_t)nb);
    int r = 0;
    for (int i = 0; i < CHUNK; i++, r++) {
        bpos[r] = len_a - CHUNK - 1 + i;
        bpt[r] = pt_a;
    }
    for (int i = 0; i < 3; i++, r++) {
        bpos[r] = LEN_B - 4 + i;
        bpt[r] = pt_b;
    }
    bpos[r] = len_a - 1;
    bpt[r++] = pt_a;
    bpos[r] = LEN_B - 1;
    bpt[r++] = pt_b;
    attn_batch_t bb = {.n = nb, .pos = bpos, .page_table = bpt};
    twin_t q = twin_rand(p, (size_t)nb * h * hd, -3, 3);
    twin_t o = twin_new(p, NULL, (size_t)nb * h * hd);
    BOTH(p, p->ref->ops->attention(p->ref->ctx, o.r, q.r, &vr, layer, &bb, h, kvh, hd, scale),
         p->x->ops->attention(p->x->ctx, o.x, q.x, &vx, layer, &bb, h, kvh, hd, scale));
    snprintf(what, sizeof what, "%s batched %d rows", c->name, nb);
    check_twin(p, &o, c->tol, what);

    /* Five decode rows, out aliasing q. */
    int32_t dpos[5] = {len_a - 1, LEN_B - 1, len_a / 2, 0, len_a - 17};
    const int32_t *dpt[5] = {pt_a, pt_b, pt_a, pt_b, pt_a};
    attn_batch_t db = {.n = 5, .pos = dpos, .page_table = dpt};
    twin_t dq = twin_rand(p, (size_t)5 * h * hd, -3, 3);
    BOTH(p, p->ref->ops->attention(p->ref->ctx, dq.r, dq.r, &vr, layer, &db, h, kvh, hd, scale),
         p->x->ops->attention(p->x->ctx, dq.x, dq.x, &vx, layer, &db, h, kvh, hd, scale));
    snprintf(what, sizeof what, "%s decode 5 in place", c->name);
    check_twin(p, &dq, c->tol, what);

    /* kv_valid: A skips every third slot; B's row has every slot masked. */
    int stride = len_a + 16;
    uint8_t *va = calloc((size_t)LAYERS * stride, 1), *vb = calloc((size_t)LAYERS * stride, 1);
    for (int t = 0; t < stride; t++)
        va[layer * stride + t] = t % 3 != 1;
    const uint8_t *maps[5] = {va, vb, va, vb, va};
    db.kv_valid = maps;
    db.kv_valid_stride = stride;
    twin_t mq = twin_rand(p, (size_t)5 * h * hd, -3, 3);
    twin_t mo = twin_new(p, NULL, (size_t)5 * h * hd);
    BOTH(p, p->ref->ops->attention(p->ref->ctx, mo.r, mq.r, &vr, layer, &db, h, kvh, hd, scale),
         p->x->ops->attention(p->x->ctx, mo.x, mq.x, &vx, layer, &db, h, kvh, hd, scale));
    snprintf(what, sizeof what, "%s kv_valid", c->name);
    check_twin(p, &mo, c->tol, what);

    /* A page outside the pool is refused. */
    int32_t bad_pt[1] = {n_pages};
    const int32_t *badt[1] = {bad_pt};
    int32_t zero[1] = {0};
    attn_batch_t bad = {.n = 1, .pos = zero, .page_table = badt};
    ck_assert_int_eq(p->x->ops->attention(p->x->ctx, mo.x, mq.x, &vx, layer, &bad, h, kvh, hd,
                                          scale), RIVER_ERANGE);
    ck_assert_int_eq(p->x->ops->kv_write(p->x->ctx, &vx, layer, &bad, k.x, v.x), RIVER_ERANGE);
    free(va);
    free(vb);
    free(pos);
    free(pts);
    free(bpos);
    free(bpt);
    free(perm);
    twin_t *all[] = {&K, &V, &k, &v, &q, &o, &dq, &mq, &mo};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        twin_free(p, all[i]);
}

/* cosine, gather_rows, scatter_rows: a rows, b width. */
static void run_rows(bpair_t *p, const op_case_t *c)
{
    int n = c->a, d = c->b;
    twin_t a = twin_rand(p, (size_t)n * d, -1, 1), b = twin_rand(p, (size_t)n * d, -1, 1);
    /* Row 1 of a is zero: cosine 0 on both. */
    float *zero = calloc((size_t)d, sizeof *zero);
    ck_assert_int_eq(p->ref->ops->from_host(p->ref->ctx, a.r, (size_t)d, zero, (size_t)d), 0);
    ck_assert_int_eq(p->x->ops->from_host(p->x->ctx, a.x, (size_t)d, zero, (size_t)d), 0);
    float *cr = malloc(sizeof *cr * (size_t)n), *cx = malloc(sizeof *cx * (size_t)n);
    BOTH(p, p->ref->ops->cosine(p->ref->ctx, cr, a.r, b.r, n, d),
         p->x->ops->cosine(p->x->ctx, cx, a.x, b.x, n, d));
    char what[96];
    snprintf(what, sizeof what, "%s cosine", c->name);
    /* Cosines are in [-1, 1]: an absolute tolerance. */
    check_host(p, cr, cx, (size_t)n, 1e-5, what);
    ck_assert(cx[1] == 0.0f);
    int m = n / 2 + 1;
    int32_t *idx = malloc(sizeof *idx * (size_t)m);
    for (int i = 0; i < m; i++)
        idx[i] = (int32_t)((i * 7 + 3) % n);
    twin_t g = twin_new(p, NULL, (size_t)m * d);
    BOTH(p, p->ref->ops->gather_rows(p->ref->ctx, g.r, a.r, idx, m, d),
         p->x->ops->gather_rows(p->x->ctx, g.x, a.x, idx, m, d));
    snprintf(what, sizeof what, "%s gather_rows", c->name);
    check_twin(p, &g, 0, what);
    BOTH(p, p->ref->ops->scatter_rows(p->ref->ctx, b.r, g.r, idx, m, d),
         p->x->ops->scatter_rows(p->x->ctx, b.x, g.x, idx, m, d));
    snprintf(what, sizeof what, "%s scatter_rows", c->name);
    check_twin(p, &b, 0, what);
    int32_t bad = -1;
    ck_assert_int_eq(p->x->ops->gather_rows(p->x->ctx, g.x, a.x, &bad, 1, d), RIVER_ERANGE);
    free(zero);
    free(cr);
    free(cx);
    free(idx);
    twin_free(p, &a);
    twin_free(p, &b);
    twin_free(p, &g);
}

/* router_prob: a rows in the buffer, b width, c hidden units; scored through a row list
 * (every other row, backwards: not a multiple of 8) and over all rows. */
static void run_router(bpair_t *p, const op_case_t *c)
{
    int n = c->a, d = c->b, hid = c->c;
    wtwin_t norm = wtwin_new(p, weight_rand(DTYPE_F32, 1, d, 0, 1.0f));
    wtwin_t down = wtwin_new(p, weight_rand(DTYPE_F32, hid, d, 0, 0.1f));
    wtwin_t up = wtwin_new(p, weight_rand(DTYPE_F32, 1, hid, 0, 1.0f));
    router_weights_t wr = {norm.r, down.r, up.r, 1e-5f}, wx = {norm.x, down.x, up.x, 1e-5f};
    twin_t x = twin_rand(p, (size_t)n * d, -2, 2);
    int m = (n + 1) / 2;
    int32_t *rows = malloc(sizeof *rows * (size_t)m);
    for (int i = 0; i < m; i++)
        rows[i] = n - 1 - 2 * i;
    float *pr = malloc(sizeof *pr * (size_t)n), *px = malloc(sizeof *px * (size_t)n);
    BOTH(p, p->ref->ops->router_prob(p->ref->ctx, pr, x.r, &wr, rows, m),
         p->x->ops->router_prob(p->x->ctx, px, x.x, &wx, rows, m));
    char what[96];
    snprintf(what, sizeof what, "%s %d listed rows", c->name, m);
    check_host(p, pr, px, (size_t)m, c->tol, what);
    BOTH(p, p->ref->ops->router_prob(p->ref->ctx, pr, x.r, &wr, NULL, n),
         p->x->ops->router_prob(p->x->ctx, px, x.x, &wx, NULL, n));
    snprintf(what, sizeof what, "%s all %d rows", c->name, n);
    check_host(p, pr, px, (size_t)n, c->tol, what);
    for (int i = 0; i < n; i++)
        ck_assert(px[i] >= 0.0f && px[i] <= 1.0f);
    /* A weight of the wrong type is refused. */
    router_weights_t bad = wx;
    bad.down.dtype = DTYPE_BF16;
    ck_assert_int_ne(p->x->ops->router_prob(p->x->ctx, px, x.x, &bad, NULL, 1), 0);
    free(rows);
    free(pr);
    free(px);
    twin_free(p, &x);
    weight_host_free(&norm.host);
    weight_host_free(&down.host);
    weight_host_free(&up.host);
}

/* Buffers: a sizes, from 1 float to past 3M. Each buffer starts zero-filled, and a span
 * written at an offset reads back the same on both backends. */
static void run_buffers(bpair_t *p, const op_case_t *c)
{
    size_t n = (size_t)c->a, off = n > 10 ? 10 : 0;
    twin_t t = twin_new(p, NULL, n);
    char what[96];
    snprintf(what, sizeof what, "%s zero-filled", c->name);
    check_twin(p, &t, 0, what);
    float *h = rand_host(n - off, -1, 1), *back = malloc((n - off) * sizeof *back);
    ck_assert_int_eq(p->ref->ops->from_host(p->ref->ctx, t.r, off, h, n - off), 0);
    ck_assert_int_eq(p->x->ops->from_host(p->x->ctx, t.x, off, h, n - off), 0);
    ck_assert_int_eq(p->x->ops->to_host(p->x->ctx, back, t.x, off, n - off), 0);
    ck_assert_int_eq(memcmp(h, back, (n - off) * sizeof *h), 0);
    snprintf(what, sizeof what, "%s round trip", c->name);
    check_twin(p, &t, 0, what);
    ck_assert_int_eq(p->x->ops->sync(p->x->ctx), 0);
    free(h);
    free(back);
    twin_free(p, &t);
}

/* Attention alone over a pool of random K/V: a head_dim, b query heads, c KV heads, d the
 * longest context, e sequences, f 1 when every position of each sequence is a row (a
 * batched prompt), 0 for its last one only (decode rows at the end of long sequences).
 * Sequence s has d - 13 s positions, on pages interleaved with the others' in reverse. */
static void run_attn_shape(bpair_t *p, const op_case_t *c)
{
    enum { PS = 16 };
    int hd = c->a, heads = c->b, kvh = c->c, len = c->d, n_seqs = c->e, prefill = c->f;
    int kv_dim = kvh * hd, pages_per = (len + PS - 1) / PS;
    int n_pages = pages_per * n_seqs + 3;
    kv_view_t vr = {.page_size = PS, .kv_dim = kv_dim, .n_pages = n_pages,
                    .layer_stride = (int64_t)PS * kv_dim};
    vr.page_stride = vr.layer_stride; /* one layer */
    size_t kv_elems = (size_t)n_pages * (size_t)vr.page_stride;
    twin_t K = twin_rand(p, kv_elems, -1, 1), V = twin_rand(p, kv_elems, -1, 1);
    kv_view_t vx = vr;
    vr.k = K.r;
    vr.v = V.r;
    vx.k = K.x;
    vx.v = V.x;
    int32_t *pt = malloc(sizeof *pt * (size_t)pages_per * (size_t)n_seqs);
    for (int s = 0; s < n_seqs; s++)
        for (int j = 0; j < pages_per; j++)
            pt[s * pages_per + j] = (int32_t)(n_pages - 1 - (j * n_seqs + s));
    int n = 0;
    for (int s = 0; s < n_seqs; s++)
        n += prefill ? len - 13 * s : 1;
    int32_t *pos = malloc(sizeof *pos * (size_t)n);
    const int32_t **pts = malloc(sizeof *pts * (size_t)n);
    int r = 0;
    for (int s = 0; s < n_seqs; s++) {
        int sl = len - 13 * s;
        for (int t = prefill ? 0 : sl - 1; t < sl; t++) {
            pos[r] = t;
            pts[r++] = pt + s * pages_per;
        }
    }
    attn_batch_t b = {.n = n, .pos = pos, .page_table = pts};
    size_t qn = (size_t)n * (size_t)heads * (size_t)hd;
    twin_t q = twin_rand(p, qn, -3, 3), o = twin_new(p, NULL, qn);
    float scale = 1.0f / sqrtf((float)hd);
    BOTH(p, p->ref->ops->attention(p->ref->ctx, o.r, q.r, &vr, 0, &b, heads, kvh, hd, scale),
         p->x->ops->attention(p->x->ctx, o.x, q.x, &vx, 0, &b, heads, kvh, hd, scale));
    char what[96];
    snprintf(what, sizeof what, "%s, %d rows", c->name, n);
    check_twin(p, &o, c->tol, what);
    /* In place (out = q), as the engine may call it. */
    BOTH(p, p->ref->ops->attention(p->ref->ctx, q.r, q.r, &vr, 0, &b, heads, kvh, hd, scale),
         p->x->ops->attention(p->x->ctx, q.x, q.x, &vx, 0, &b, heads, kvh, hd, scale));
    snprintf(what, sizeof what, "%s in place", c->name);
    check_twin(p, &q, c->tol, what);
    free(pos);
    free(pts);
    free(pt);
    twin_t *all[] = {&K, &V, &q, &o};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        twin_free(p, all[i]);
}

/* ---- the reference pairs: one CPU level against plain loops written here --------------- */

/* Checks inside long loops: Check records every passing ck_assert (a write to its log), so
 * hot loops only call into it on failure. */
#define EXPECT(cond, ...)                                                                    \
    do {                                                                                     \
        if (!(cond))                                                                         \
            ck_abort_msg(__VA_ARGS__);                                                       \
    } while (0)
#define EXPECT_TRUE(cond) EXPECT(cond, "assertion '%s' failed", #cond)

static void fill(float *p, size_t n, float lo, float hi)
{
    for (size_t i = 0; i < n; i++)
        p[i] = test_rand(lo, hi);
}

/* Widening written independently of kernels/half.h. */
static float ref_bf16(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static float ref_f16(uint16_t h)
{
    int e = (h >> 10) & 31, m = h & 1023;
    float v = e == 0 ? ldexpf((float)m, -24) : ldexpf((float)(m + 1024), e - 25);
    return (h & 0x8000) ? -v : v;
}

/* One backend of a pair as the checks call it; level -1 when it is not the CPU at a known
 * level. */
typedef struct env {
    const ops_t *o;
    ops_ctx_t *c;
    int level, threads;
} env_t;

static env_t env_of(const backend_t *be, int level, int threads)
{
    return (env_t){be->ops, be->ctx, level, threads};
}

/* The backend under test of a reference pair. */
static env_t env_ref(const bpair_t *p)
{
    return env_of(p->x, p->level, p->threads);
}

/* A buffer holding a copy of n host floats. */
static float *dev_copy(env_t *e, const float *src, size_t n)
{
    float *b = e->o->buf_alloc(e->c, n ? n : 1);
    ck_assert_ptr_nonnull(b);
    ck_assert_int_eq(e->o->from_host(e->c, b, 0, src, n), 0);
    return b;
}

static float *host_copy(env_t *e, const float *buf, size_t n)
{
    float *h = malloc((n ? n : 1) * sizeof(float));
    ck_assert_ptr_nonnull(h);
    ck_assert_int_eq(e->o->to_host(e->c, h, buf, 0, n), 0);
    return h;
}
/* Test weights with their dequantised reference values. */

typedef struct tw {
    weight_t w;
    void *data;
    uint16_t *scales, *zeros;
    float *ref; /* rows x cols */
} tw_t;

/* Code k of a Q2/Q3 row of `cols` codes, written and read here from the layout's
 * definition (kernels/ops.h, docs/FORMATS.md): the low two bits in bits 2*(k%4) of byte k/4;
 * for Q3, bit 2 in bit k%8 of byte cols/4 + k/8. The row starts zeroed. */
static void tw_lowbit_set(dtype_t dt, uint8_t *row, int64_t cols, int64_t k, unsigned q)
{
    row[k / 4] |= (uint8_t)((q & 3) << (2 * (k % 4)));
    if (dt == DTYPE_Q3)
        row[(cols + 3) / 4 + k / 8] |= (uint8_t)(((q >> 2) & 1) << (k % 8));
}

static unsigned tw_lowbit_get(dtype_t dt, const uint8_t *row, int64_t cols, int64_t k)
{
    unsigned q = (row[k / 4] >> (2 * (k % 4))) & 3;
    if (dt == DTYPE_Q3)
        q |= ((row[(cols + 3) / 4 + k / 8] >> (k % 8)) & 1u) << 2;
    return q;
}

static void tw_make(tw_t *t, dtype_t dt, int64_t rows, int64_t cols, int group)
{
    memset(t, 0, sizeof *t);
    size_t n = (size_t)(rows * cols);
    t->ref = malloc(n * sizeof(float));
    ck_assert_ptr_nonnull(t->ref);
    size_t rb = dtype_row_bytes(dt, cols);
    t->data = calloc((size_t)rows, rb);
    ck_assert_ptr_nonnull(t->data);
    t->w = (weight_t){ .dtype = dt, .rows = rows, .cols = cols, .data = t->data };
    for (int64_t r = 0; r < rows; r++) {
        uint8_t *row = (uint8_t *)t->data + r * rb;
        for (int64_t k = 0; k < cols; k++) {
            float v = test_rand(-1.0f, 1.0f);
            float *ref = &t->ref[r * cols + k];
            switch (dt) {
            case DTYPE_F32:
                ((float *)row)[k] = v;
                *ref = v;
                break;
            case DTYPE_F16:
                ((uint16_t *)row)[k] = f32_to_f16(v);
                *ref = ref_f16(((uint16_t *)row)[k]);
                break;
            case DTYPE_BF16:
                ((uint16_t *)row)[k] = f32_to_bf16(v);
                *ref = ref_bf16(((uint16_t *)row)[k]);
                break;
            case DTYPE_Q8:
                row[k] = (uint8_t)(test_rand_u32() & 0xff);
                break;
            case DTYPE_Q4: {
                unsigned q = test_rand_u32() & 0x0f;
                row[k / 2] |= (uint8_t)((k & 1) ? q << 4 : q);
                break;
            }
            case DTYPE_Q2:
            case DTYPE_Q3:
                tw_lowbit_set(dt, row, cols, k, test_rand_u32() & (dt == DTYPE_Q2 ? 3u : 7u));
                break;
            default:
                ck_abort_msg("bad dtype");
            }
        }
    }
    if (dtype_is_quant(dt)) {
        int64_t ng = cols / group;
        float qmax = (float)((1 << dtype_quant_bits(dt)) - 1);
        t->scales = malloc((size_t)(rows * ng) * sizeof(uint16_t));
        t->zeros = malloc((size_t)(rows * ng) * sizeof(uint16_t));
        ck_assert(t->scales && t->zeros);
        for (int64_t i = 0; i < rows * ng; i++) {
            t->scales[i] = f32_to_f16(test_rand(0.001f, 0.05f));
            t->zeros[i] = f32_to_f16(test_rand(0.0f, qmax));
        }
        for (int64_t r = 0; r < rows; r++) {
            const uint8_t *row = (const uint8_t *)t->data + r * rb;
            for (int64_t k = 0; k < cols; k++) {
                unsigned q = dt == DTYPE_Q8   ? row[k]
                             : dt == DTYPE_Q4 ? ((k & 1) ? row[k / 2] >> 4 : row[k / 2] & 15)
                                              : tw_lowbit_get(dt, row, cols, k);
                float s = ref_f16(t->scales[r * ng + k / group]);
                float z = ref_f16(t->zeros[r * ng + k / group]);
                t->ref[r * cols + k] = ((float)q - z) * s;
            }
        }
        t->w.scales = t->scales;
        t->w.zeros = t->zeros;
        t->w.group = group;
    }
}

/* Every zero of a Q8 or Q4 test weight set to the integer z (128: int8 symmetric, as
 * llama.cpp's q8_0 and river quant --backbone q8 write it; 8 its Q4_0, 16 its Q5_0), the
 * reference values with it. */
static void tw_zeros_int(tw_t *t, int z)
{
    dtype_t dt = t->w.dtype;
    int64_t rows = t->w.rows, cols = t->w.cols, ng = cols / t->w.group;
    size_t rb = dtype_row_bytes(dt, cols);
    ck_assert(dt == DTYPE_Q8 || dt == DTYPE_Q4);
    for (int64_t i = 0; i < rows * ng; i++)
        t->zeros[i] = f32_to_f16((float)z);
    for (int64_t r = 0; r < rows; r++) {
        const uint8_t *row = (const uint8_t *)t->data + r * rb;
        for (int64_t k = 0; k < cols; k++) {
            unsigned q = dt == DTYPE_Q8 ? row[k] : (k & 1) ? row[k / 2] >> 4 : row[k / 2] & 15;
            t->ref[r * cols + k] =
                ((float)q - (float)z) * ref_f16(t->scales[r * ng + k / t->w.group]);
        }
    }
}

static void tw_free(tw_t *t)
{
    free(t->data);
    free(t->scales);
    free(t->zeros);
    free(t->ref);
}

/* Whether a matmul at this level takes x as 8-bit blocks (at every n: those weights never
 * take the prefill path): Q4X8, Q8X8 and Q8 of whole 32-column groups or of halves of
 * them (groups of 16) at both SIMD levels (q4x8_x86.h, q8_x86.h), Q4 of whole groups at
 * the AVX2 level (kernels_avx2.c). */
static int mm_x8(const env_t *e, const weight_t *w)
{
    if (w->dtype == DTYPE_Q4X8 || w->dtype == DTYPE_Q8X8)
        return e->level >= CPU_SIMD_AVX2;
    if (w->dtype == DTYPE_Q8)
        return e->level >= CPU_SIMD_AVX2 && cpu_q8_int_eligible(w);
    return e->level == CPU_SIMD_AVX2 && w->dtype == DTYPE_Q4 && w->group % 32 == 0;
}

/* Whether a matmul at this level takes x in bf16: bf16 weights at AVX512-BF16. */
static int mm_xbf16(const env_t *e, const weight_t *w)
{
    return e->level == CPU_SIMD_AVX512BF16 &&
           (w->dtype == DTYPE_BF16 || w->dtype == DTYPE_BF16X8);
}

/* x rounded to bf16 as that level does (to nearest, ties to even: kernels/half.h, not the
 * kernels' vcvtne2ps2bf16); half_step gets each element's bound, half a unit in its last
 * place (|x| / 256). */
static void mm_round_x_bf16(const float *x, int64_t n, float *xd, float *half_step)
{
    for (int64_t k = 0; k < n; k++) {
        xd[k] = bf16_to_f32(f32_to_bf16(x[k]));
        half_step[k] = fabsf(x[k]) / 256.0f;
    }
}

/* x quantized as the 8-bit path does, written here from its definition: per block of xb
 * columns (64 for Q4 where the group allows, else 32) d = max|x| / 127 and
 * x8 = round-to-even(x * (127 / max|x|)); xd = d * x8. half_step gets each element's
 * bound max|x| / 254 (the caller weighs it with |w|). */
static void mm_quantize_x(const float *x, int64_t cols, int xb, float *xd, float *half_step)
{
    for (int64_t b = 0; b < cols; b += xb) {
        float amax = 0.0f;
        for (int k = 0; k < xb; k++)
            amax = fmaxf(amax, fabsf(x[b + k]));
        float id = amax > 0.0f ? 127.0f / amax : 0.0f, d = amax / 127.0f;
        for (int k = 0; k < xb; k++) {
            xd[b + k] = d * nearbyintf(x[b + k] * id);
            half_step[b + k] = amax / 254.0f;
        }
    }
}

/* Checks y (n, rows) = x W^T against a double-precision reference: the error may be 1e-5
 * of the sum of |w x| (a relative bound that stays meaningful under cancellation). */
static void check_matmul(env_t *e, const tw_t *t, int n)
{
    int64_t rows = t->w.rows, cols = t->w.cols;
    float *xh = malloc((size_t)(n * cols) * sizeof(float));
    float *xd = malloc((size_t)(n * cols) * sizeof(float));
    float *hs = malloc((size_t)(n * cols) * sizeof(float));
    ck_assert_ptr_nonnull(xh);
    ck_assert_ptr_nonnull(xd);
    ck_assert_ptr_nonnull(hs);
    fill(xh, (size_t)(n * cols), -1.0f, 1.0f);
    int x8 = mm_x8(e, &t->w), xb = mm_xbf16(e, &t->w);
    if (x8)
        for (int i = 0; i < n; i++)
            mm_quantize_x(xh + i * cols, cols,
                          t->w.dtype == DTYPE_Q4 && t->w.group % 64 == 0 ? 64 : 32,
                          xd + i * cols, hs + i * cols);
    if (xb)
        mm_round_x_bf16(xh, n * cols, xd, hs);
    x8 = x8 || xb; /* the same checks: exact against x as rounded, within its bound */
    float *x = dev_copy(e, xh, (size_t)(n * cols));
    float *y = e->o->buf_alloc(e->c, (size_t)(n * rows));
    ck_assert_ptr_nonnull(y);
    ck_assert_int_eq(e->o->matmul(e->c, y, x, &t->w, n), 0);
    float *yh = host_copy(e, y, (size_t)(n * rows));
    for (int i = 0; i < n; i++)
        for (int64_t r = 0; r < rows; r++) {
            double acc = 0.0, mag = 0.0, accq = 0.0, magq = 0.0, bound = 0.0;
            for (int64_t k = 0; k < cols; k++) {
                double wk = t->ref[r * cols + k];
                double p = wk * xh[i * cols + k];
                acc += p;
                mag += fabs(p);
                if (x8) {
                    accq += wk * xd[i * cols + k];
                    magq += fabs(wk * xd[i * cols + k]);
                    bound += fabs(wk) * hs[i * cols + k];
                }
            }
            double got = yh[i * rows + r];
            /* The 8-bit path: exact against x as it quantizes it (f32 rounding aside), and
             * within the stated bound of the exact result. */
            EXPECT(!x8 || fabs(got - accq) <= 1e-5 * (magq + mag) + 1e-30,
                   "matmul %s %s rounded x thr %d: (%lld x %lld) n %d: y[%d][%lld] = %.9g, want %.9g",
                   cpu_simd_name((cpu_simd_t)e->level), dtype_name(t->w.dtype), e->threads,
                   (long long)rows, (long long)cols, n, i, (long long)r, got, accq);
            double tol = x8 ? bound + 1e-5 * mag : 1e-5 * mag;
            double err = fabs(got - acc);
            EXPECT(err <= tol + 1e-30, "matmul %s %s thr %d: (%lld x %lld) n %d: y[%d][%lld] = "
                   "%.9g, want %.9g (tolerance %.3g)", cpu_simd_name((cpu_simd_t)e->level),
                   dtype_name(t->w.dtype), e->threads, (long long)rows, (long long)cols, n, i,
                   (long long)r, got, acc, tol);
        }
    e->o->buf_free(e->c, x);
    e->o->buf_free(e->c, y);
    free(xh);
    free(xd);
    free(hs);
    free(yh);
}


/* matmul: a outputs, b inputs, c rows (0: each count of mm_ns), d group. A Q4X8 case
 * checks Q4 codes repacked by cpu_q4x8_repack, which every level reads (the scalar one
 * through its generic path, which makes it the reference of the layout); the weights are
 * read in place, unplaced, so the SIMD levels run their Q4 kernels on Q4 cases. */
static void check_matmul_case(bpair_t *p, const op_case_t *c)
{
    env_t e = env_ref(p);
    tw_t t;
    tw_make(&t, case_file_dtype(c->dt), c->a, c->b, c->d);
    uint8_t *packed = NULL;
    if (c->e) {
        /* Every zero the integer c->e: placement finds it (and only it: with one zero off
         * by one it does not), and the weight is read as placement leaves it. */
        tw_zeros_int(&t, c->e);
        uint16_t keep = t.zeros[t.w.rows * (t.w.cols / t.w.group) - 1];
        t.zeros[t.w.rows * (t.w.cols / t.w.group) - 1] = f32_to_f16((float)(c->e - 1));
        weight_t off = t.w;
        ck_assert_int_eq(e.o->weight_upload(e.c, &off), 0);
        ck_assert_int_eq(off.zero_int, 0);
        t.zeros[t.w.rows * (t.w.cols / t.w.group) - 1] = keep;
        ck_assert_int_eq(e.o->weight_upload(e.c, &t.w), 0);
        ck_assert_int_eq(t.w.zero_int, c->e);
    }
    if (c->dt == DTYPE_Q4X8) {
        ck_assert(cpu_q4x8_eligible(&t.w));
        packed = malloc(dtype_row_bytes(DTYPE_Q4, t.w.cols) * (size_t)t.w.rows);
        ck_assert_ptr_nonnull(packed);
        cpu_q4x8_repack(&t.w, packed);
        t.w.data = packed;
        t.w.dtype = DTYPE_Q4X8;
    }
    if (c->dt == DTYPE_BF16X8 || c->dt == DTYPE_F16X8) {
        ck_assert(cpu_rowblock_eligible(&t.w));
        packed = malloc(dtype_row_bytes(t.w.dtype, t.w.cols) * (size_t)t.w.rows);
        ck_assert_ptr_nonnull(packed);
        cpu_rowblock_repack(&t.w, packed);
        t.w.data = packed;
        t.w.dtype = c->dt;
    }
    if (c->dt == DTYPE_Q8X8) {
        ck_assert(cpu_q8x8_eligible(&t.w));
        packed = malloc((size_t)(t.w.rows * t.w.cols));
        ck_assert_ptr_nonnull(packed);
        cpu_q8x8_repack(&t.w, packed);
        t.w.data = packed;
        t.w.dtype = DTYPE_Q8X8;
    }
    for (int k = 0; k < (c->c ? 1 : N_MM_NS); k++)
        check_matmul(&e, &t, c->c ? c->c : mm_ns[k]);
    free(packed);
    tw_free(&t);
}

/* The errors a matmul returns: a group that is odd for Q4 or does not divide the columns,
 * missing scales, a negative row count, an unknown type; no rows at all is no error. */
static void check_matmul_errors(bpair_t *p, const op_case_t *c)
{
    (void)c;
    env_t e = env_ref(p);
    tw_t t;
    tw_make(&t, DTYPE_Q4, 4, 32, 16);
    float *x = e.o->buf_alloc(e.c, 64), *y = e.o->buf_alloc(e.c, 64);
    t.w.group = 5;
    ck_assert_int_eq(e.o->matmul(e.c, y, x, &t.w, 1), RIVER_EFORMAT);
    t.w.group = 16;
    t.w.scales = NULL;
    ck_assert_int_eq(e.o->matmul(e.c, y, x, &t.w, 1), RIVER_EFORMAT);
    t.w.scales = t.scales;
    ck_assert_int_eq(e.o->matmul(e.c, y, x, &t.w, -1), RIVER_EINVAL);
    ck_assert_int_eq(e.o->matmul(e.c, y, x, &t.w, 0), 0);
    weight_t bad = t.w;
    bad.dtype = DTYPE_COUNT;
    ck_assert_int_eq(e.o->matmul(e.c, y, x, &bad, 1), RIVER_EDTYPE);
    e.o->buf_free(e.c, x);
    e.o->buf_free(e.c, y);
    tw_free(&t);
    /* Q2/Q3 groups are whole runs of 16 codes: 8 is refused, naming the type; so are
     * missing zeros. */
    for (dtype_t dt = DTYPE_Q2; dt <= DTYPE_Q3; dt++) {
        tw_make(&t, dt, 4, 64, 16);
        x = e.o->buf_alloc(e.c, 64);
        y = e.o->buf_alloc(e.c, 64);
        t.w.group = 8;
        ck_assert_int_eq(e.o->matmul(e.c, y, x, &t.w, 1), RIVER_EFORMAT);
        ck_assert_msg(strstr(river_err_detail(), dtype_name(dt)), "%s", river_err_detail());
        t.w.group = 24;
        ck_assert_int_eq(e.o->matmul(e.c, y, x, &t.w, 1), RIVER_EFORMAT);
        t.w.group = 16;
        t.w.zeros = NULL;
        ck_assert_int_eq(e.o->matmul(e.c, y, x, &t.w, 1), RIVER_EFORMAT);
        t.w.zeros = t.zeros;
        ck_assert_int_eq(e.o->matmul(e.c, y, x, &t.w, 1), 0);
        e.o->buf_free(e.c, x);
        e.o->buf_free(e.c, y);
        tw_free(&t);
    }
}

/* embed: a vocab, b dim, d group; six tokens, exact rows, tokens out of range refused. */
static void check_embed(bpair_t *p, const op_case_t *c)
{
    env_t e = env_ref(p);
    int64_t dim = c->b;
    tw_t t;
    tw_make(&t, c->dt, c->a, dim, c->d);
    int32_t tokens[6] = {3, 0, (int32_t)c->a - 1, 3, 17, 25};
    float *out = e.o->buf_alloc(e.c, (size_t)(6 * dim));
    ck_assert_int_eq(e.o->embed(e.c, out, &t.w, tokens, 6), 0);
    float *h = host_copy(&e, out, (size_t)(6 * dim));
    for (int i = 0; i < 6; i++)
        for (int64_t k = 0; k < dim; k++)
            EXPECT(h[i * dim + k] == t.ref[tokens[i] * dim + k], "embed %s: row %d col %lld",
                   dtype_name(c->dt), i, (long long)k);
    int32_t bad[2] = {1, c->a};
    ck_assert_int_eq(e.o->embed(e.c, out, &t.w, bad, 2), RIVER_ERANGE);
    bad[1] = -1;
    ck_assert_int_eq(e.o->embed(e.c, out, &t.w, bad, 2), RIVER_ERANGE);
    free(h);
    e.o->buf_free(e.c, out);
    tw_free(&t);
}

/* rmsnorm: a rows, b width, the weight of type dt; in place too, and a weight of the wrong
 * width refused. */
static void check_rmsnorm(bpair_t *p, const op_case_t *c)
{
    env_t e = env_ref(p);
    int n = c->a, d = c->b;
    tw_t t;
    tw_make(&t, c->dt, 1, d, 0);
    float *xh = malloc((size_t)n * d * sizeof(float));
    fill(xh, (size_t)n * d, -3.0f, 3.0f);
    float *x = dev_copy(&e, xh, (size_t)n * d);
    float *out = e.o->buf_alloc(e.c, (size_t)n * d);
    const float eps = 1e-5f;
    ck_assert_int_eq(e.o->rmsnorm(e.c, out, x, &t.w, n, d, eps), 0);
    float *h = host_copy(&e, out, (size_t)n * d);
    ck_assert_int_eq(e.o->rmsnorm(e.c, x, x, &t.w, n, d, eps), 0);
    float *h2 = host_copy(&e, x, (size_t)n * d);
    for (int i = 0; i < n; i++) {
        float ss = 0.0f;
        for (int k = 0; k < d; k++)
            ss += xh[i * d + k] * xh[i * d + k];
        ss /= (float)d;
        ss += eps;
        ss = 1.0f / sqrtf(ss);
        for (int k = 0; k < d; k++) {
            float want = t.ref[k] * (ss * xh[i * d + k]);
            EXPECT(fabsf(h[i * d + k] - want) <= 1e-5f * fabsf(want) + 1e-7f,
                   "rmsnorm (%d, %d): [%d][%d] = %g, want %g", n, d, i, k, h[i * d + k], want);
            EXPECT_TRUE(h2[i * d + k] == h[i * d + k]);
        }
    }
    weight_t wrong = t.w;
    wrong.cols = d + 1;
    ck_assert_int_eq(e.o->rmsnorm(e.c, out, x, &wrong, n, d, eps), RIVER_ESHAPE);
    free(xh);
    free(h);
    free(h2);
    e.o->buf_free(e.c, x);
    e.o->buf_free(e.c, out);
    tw_free(&t);
}

/* add_bias then add: a rows, b width, the bias of type dt; both exact. A single row wider
 * than 100k is a long flat add, which goes through the thread pool. */
static void check_add_bias_add(bpair_t *p, const op_case_t *c)
{
    env_t e = env_ref(p);
    int n = c->a, d = c->b;
    size_t ne = (size_t)n * d;
    float *yh = malloc(ne * sizeof(float)), *xh = malloc(ne * sizeof(float));
    fill(yh, ne, -2.0f, 2.0f);
    fill(xh, ne, -2.0f, 2.0f);
    float *y = dev_copy(&e, yh, ne), *x = dev_copy(&e, xh, ne);
    float *h = NULL;
    if (d <= 100000) {
        tw_t t;
        tw_make(&t, c->dt, 1, d, 0);
        ck_assert_int_eq(e.o->add_bias(e.c, y, &t.w, n, d), 0);
        h = host_copy(&e, y, ne);
        for (size_t k = 0; k < ne; k++)
            EXPECT_TRUE(h[k] == yh[k] + t.ref[k % (size_t)d]);
        tw_free(&t);
    } else {
        h = host_copy(&e, y, ne);
    }
    ck_assert_int_eq(e.o->add(e.c, y, x, ne), 0);
    float *h2 = host_copy(&e, y, ne);
    for (size_t k = 0; k < ne; k++)
        EXPECT_TRUE(h2[k] == h[k] + xh[k]);
    ck_assert_int_eq(e.o->add(e.c, y, x, 0), 0);
    free(yh);
    free(xh);
    free(h);
    free(h2);
    e.o->buf_free(e.c, y);
    e.o->buf_free(e.c, x);
}

/* rope: a rows, b heads, c head_dim, d rot_dim, e layout, f attn_factor in hundredths;
 * positions up to 9000, and rotary dims that are odd or above head_dim refused. */
static void check_rope(bpair_t *p, const op_case_t *c)
{
    env_t e = env_ref(p);
    int n = c->a, H = c->b, hd = c->c, rot = c->d;
    float inv_freq[64];
    for (int f = 0; f < rot / 2; f++)
        inv_freq[f] = 1.0f / powf(10000.0f, (float)(2 * f) / (float)rot);
    rope_t rp = {.layout = (rope_layout_t)c->e, .head_dim = hd, .rot_dim = rot,
                 .inv_freq = inv_freq, .attn_factor = (float)c->f / 100.0f};
    int32_t *pos = malloc((size_t)n * sizeof(int32_t));
    for (int i = 0; i < n; i++)
        pos[i] = i == 0 ? 0 : (int32_t)(test_rand_u32() % 9000);
    size_t ne = (size_t)n * H * hd;
    float *xh = malloc(ne * sizeof(float));
    fill(xh, ne, -1.0f, 1.0f);
    float *x = dev_copy(&e, xh, ne);
    ck_assert_int_eq(e.o->rope(e.c, x, pos, n, H, &rp), 0);
    float *h = host_copy(&e, x, ne);
    for (int i = 0; i < n; i++)
        for (int hh = 0; hh < H; hh++) {
            float want[128];
            const float *in = xh + ((size_t)i * H + hh) * hd;
            memcpy(want, in, (size_t)hd * sizeof(float));
            for (int f = 0; f < rot / 2; f++) {
                float ang = (float)pos[i] * inv_freq[f];
                float cs = cosf(ang) * rp.attn_factor, sn = sinf(ang) * rp.attn_factor;
                int a = rp.layout == ROPE_INTERLEAVED ? 2 * f : f;
                int b = rp.layout == ROPE_INTERLEAVED ? 2 * f + 1 : f + rot / 2;
                want[a] = in[a] * cs - in[b] * sn;
                want[b] = in[a] * sn + in[b] * cs;
            }
            for (int k = 0; k < hd; k++)
                EXPECT(fabsf(h[((size_t)i * H + hh) * hd + k] - want[k]) <= 1e-6f,
                       "rope %s row %d head %d elem %d", c->name, i, hh, k);
        }
    free(pos);
    free(xh);
    free(h);
    e.o->buf_free(e.c, x);
    float ones[4] = {1, 1, 1, 1};
    rope_t bad = {.layout = ROPE_HALF, .head_dim = 8, .rot_dim = 10, .inv_freq = ones,
                  .attn_factor = 1.0f};
    float *y = e.o->buf_alloc(e.c, 8);
    int32_t p0 = 0;
    ck_assert_int_eq(e.o->rope(e.c, y, &p0, 1, 1, &bad), RIVER_EINVAL);
    bad.rot_dim = 3;
    ck_assert_int_eq(e.o->rope(e.c, y, &p0, 1, 1, &bad), RIVER_EINVAL);
    e.o->buf_free(e.c, y);
}

/* swiglu: a rows, b width, c row stride (at least 2b: a fused gate_up row). */
static void check_swiglu(bpair_t *p, const op_case_t *c)
{
    env_t e = env_ref(p);
    int n = c->a, d = c->b, stride = c->c;
    size_t ni = (size_t)n * stride;
    float *gh = malloc(ni * sizeof(float));
    fill(gh, ni, -12.0f, 12.0f);
    float *g = dev_copy(&e, gh, ni);
    float *out = e.o->buf_alloc(e.c, (size_t)n * d);
    const float *up = stride >= 2 * d ? g + d : g;
    ck_assert_int_eq(e.o->swiglu(e.c, out, g, up, n, d, stride), 0);
    float *h = host_copy(&e, out, (size_t)n * d);
    for (int i = 0; i < n; i++)
        for (int k = 0; k < d; k++) {
            float gv = gh[(size_t)i * stride + k];
            float uv = gh[(size_t)i * stride + k + (stride >= 2 * d ? d : 0)];
            float want = gv / (1.0f + expf(-gv)) * uv;
            EXPECT(fabsf(h[(size_t)i * d + k] - want) <= 1e-5f * fabsf(want) + 1e-7f,
                   "swiglu (%d, %d): [%d][%d] = %g, want %g", n, d, i, k,
                   h[(size_t)i * d + k], want);
        }
    free(gh);
    free(h);
    e.o->buf_free(e.c, g);
    e.o->buf_free(e.c, out);
}

/* cosine (row 1 parallel, row 3 zero), gather_rows and scatter_rows of rows n-1, 0, 2:
 * a rows (at least 5), b width. */
static void check_rows(bpair_t *p, const op_case_t *c)
{
    env_t e = env_ref(p);
    int n = c->a, d = c->b;
    size_t ne = (size_t)n * d;
    float *ah = malloc(ne * sizeof(float)), *bh = malloc(ne * sizeof(float));
    fill(ah, ne, -1.0f, 1.0f);
    fill(bh, ne, -1.0f, 1.0f);
    for (int k = 0; k < d; k++)
        bh[d + k] = 2.0f * ah[d + k];
    for (int k = 0; k < d; k++)
        ah[3 * d + k] = 0.0f;
    float *a = dev_copy(&e, ah, ne), *b = dev_copy(&e, bh, ne);
    float *cs = malloc((size_t)n * sizeof *cs);
    ck_assert_int_eq(e.o->cosine(e.c, cs, a, b, n, d), 0);
    for (int i = 0; i < n; i++) {
        double ab = 0, aa = 0, bb = 0;
        for (int k = 0; k < d; k++) {
            ab += (double)ah[i * d + k] * bh[i * d + k];
            aa += (double)ah[i * d + k] * ah[i * d + k];
            bb += (double)bh[i * d + k] * bh[i * d + k];
        }
        double want = aa > 0 && bb > 0 ? ab / sqrt(aa * bb) : 0.0;
        ck_assert_msg(fabs(cs[i] - want) <= 1e-5, "cosine row %d: %g, want %g", i, cs[i], want);
    }
    ck_assert(fabsf(cs[1] - 1.0f) <= 1e-6f);
    int32_t idx[3] = {n - 1, 0, 2};
    float *g = e.o->buf_alloc(e.c, 3 * (size_t)d);
    ck_assert_int_eq(e.o->gather_rows(e.c, g, a, idx, 3, d), 0);
    float *gh = host_copy(&e, g, 3 * (size_t)d);
    for (int i = 0; i < 3; i++)
        ck_assert(memcmp(gh + i * d, ah + idx[i] * d, (size_t)d * sizeof(float)) == 0);
    ck_assert_int_eq(e.o->scatter_rows(e.c, b, g, idx, 3, d), 0);
    float *sh = host_copy(&e, b, ne);
    for (int i = 0; i < n; i++) {
        const float *want = (i == n - 1 || i == 0 || i == 2) ? ah + i * d : bh + i * d;
        ck_assert(memcmp(sh + i * d, want, (size_t)d * sizeof(float)) == 0);
    }
    int32_t neg[1] = {-1};
    ck_assert_int_eq(e.o->gather_rows(e.c, g, a, neg, 1, d), RIVER_ERANGE);
    ck_assert_int_eq(e.o->sync(e.c), 0);
    free(ah);
    free(bh);
    free(cs);
    free(gh);
    free(sh);
    e.o->buf_free(e.c, a);
    e.o->buf_free(e.c, b);
    e.o->buf_free(e.c, g);
}

/* Buffers: a floats, 64-byte aligned, zero-filled, and a round trip through the last five
 * (or all of them); freeing NULL is allowed. */
static void check_buffers(bpair_t *p, const op_case_t *c)
{
    env_t e = env_ref(p);
    size_t n = (size_t)c->a;
    float *b = e.o->buf_alloc(e.c, n);
    ck_assert_ptr_nonnull(b);
    ck_assert_int_eq((uintptr_t)b % 64, 0);
    for (size_t k = 0; k < n; k++)
        EXPECT_TRUE(b[k] == 0.0f);
    float src[5] = {1, 2, 3, 4, 5}, dst[5];
    size_t off = n >= 5 ? n - 5 : 0, m = n >= 5 ? 5 : n;
    ck_assert_int_eq(e.o->from_host(e.c, b, off, src, m), 0);
    ck_assert_int_eq(e.o->to_host(e.c, dst, b, off, m), 0);
    ck_assert(memcmp(src, dst, m * sizeof(float)) == 0);
    e.o->buf_free(e.c, b);
    e.o->buf_free(e.c, NULL);
}

typedef struct attn_case {
    int n_heads, n_kv, hd, page_size;
    int n_seqs;
    int lens[4];   /* final length of each sequence */
    int in_batch[4]; /* how many of its last positions are rows of the tested batch */
    int mask_every;  /* > 0: history positions p with p % mask_every == 1 are invalid slots */
    dtype_t dt;      /* the pool's element type (kv_view_t.dtype; F32 where not given) */
} attn_ref_t;

/* Whether slot p of sequence s is valid in a case (rows of the batch always are). */
static int slot_valid(const attn_ref_t *ac, int s, int p)
{
    if (ac->mask_every <= 0 || p >= ac->lens[s] - ac->in_batch[s])
        return 1;
    return p % ac->mask_every != 1;
}

/* Writes the case's history and batch with kv_write, runs attention over the batch, and
 * returns the number of output floats. With res NULL it checks the output against a
 * double-precision softmax and that out may alias q; otherwise *res gets the output (the
 * caller frees it) for a comparison with another backend. Either way pages no sequence
 * owns and layer 0 stay unwritten, and a page outside the pool is refused. */
static size_t run_attention_case(env_t *e, const attn_ref_t *ac, float **res)
{
    const int n_layers = 2, layer = 1;
    int kv_dim = ac->n_kv * ac->hd, ps = ac->page_size;
    int G = ac->n_heads / ac->n_kv;
    int n_pages = 0;
    for (int s = 0; s < ac->n_seqs; s++)
        n_pages += (ac->lens[s] + ps - 1) / ps;
    n_pages += 3; /* pages no sequence owns: they must stay untouched */
    kv_view_t kv = { .page_stride = (int64_t)n_layers * ps * kv_dim,
                     .layer_stride = (int64_t)ps * kv_dim, .page_size = ps, .kv_dim = kv_dim,
                     .n_pages = n_pages, .dtype = ac->dt };
    size_t elems = (size_t)n_pages * kv.page_stride;
    size_t es = kv_dtype_bytes(ac->dt, 1), codes = elems * es;
    size_t pool = (codes + kv_dtype_scale_bytes(ac->dt, (int64_t)elems) + 3) / sizeof(float);
    kv.k = e->o->buf_alloc(e->c, pool);
    kv.v = e->o->buf_alloc(e->c, pool);
    ck_assert(kv.k && kv.v);
    if (ac->dt == DTYPE_Q8) {
        /* The scales follow the codes, as in a pool (engine/kv_pool.c). */
        kv.k_scale = (float *)((char *)kv.k + codes);
        kv.v_scale = (float *)((char *)kv.v + codes);
    }

    /* Scattered page ids: a shuffled list handed out in order. */
    int32_t *perm = malloc((size_t)n_pages * sizeof(int32_t));
    for (int p = 0; p < n_pages; p++)
        perm[p] = p;
    for (int p = n_pages - 1; p > 0; p--) {
        int q = (int)(test_rand_u32() % (uint32_t)(p + 1));
        int32_t t = perm[p];
        perm[p] = perm[q];
        perm[q] = t;
    }
    int32_t *tables[4];
    float *kref[4], *vref[4];
    int next = 0;
    for (int s = 0; s < ac->n_seqs; s++) {
        int np = (ac->lens[s] + ps - 1) / ps;
        tables[s] = malloc((size_t)np * sizeof(int32_t));
        for (int p = 0; p < np; p++)
            tables[s][p] = perm[next++];
        kref[s] = malloc((size_t)ac->lens[s] * kv_dim * sizeof(float));
        vref[s] = malloc((size_t)ac->lens[s] * kv_dim * sizeof(float));
        fill(kref[s], (size_t)ac->lens[s] * kv_dim, -1.0f, 1.0f);
        fill(vref[s], (size_t)ac->lens[s] * kv_dim, -1.0f, 1.0f);
        /* The reference reads what the pool holds: each row as kv_write narrows it. */
        if (ac->dt != DTYPE_F32) {
            uint8_t row[4096];
            float rsc[64];
            ck_assert(kv_dim * es <= sizeof row && kv_dim / KV_Q8_BLOCK <= 64);
            for (int t = 0; t < 2 * ac->lens[s]; t++) {
                float *r = (t % 2 ? vref[s] : kref[s]) + (size_t)(t / 2) * kv_dim;
                kv_row_from_f32(ac->dt, row, rsc, 0, r, kv_dim);
                kv_row_to_f32(ac->dt, row, rsc, 0, r, kv_dim);
            }
        }
    }

    /* The history of every sequence, written in one batch per sequence. */
    for (int s = 0; s < ac->n_seqs; s++) {
        int hist = ac->lens[s] - ac->in_batch[s];
        if (hist == 0)
            continue;
        int32_t *pos = malloc((size_t)hist * sizeof(int32_t));
        const int32_t **pt = malloc((size_t)hist * sizeof(*pt));
        for (int i = 0; i < hist; i++) {
            pos[i] = i;
            pt[i] = tables[s];
        }
        attn_batch_t hb = { .n = hist, .pos = pos, .page_table = (const int32_t *const *)pt };
        float *k = dev_copy(e, kref[s], (size_t)hist * kv_dim);
        float *v = dev_copy(e, vref[s], (size_t)hist * kv_dim);
        ck_assert_int_eq(e->o->kv_write(e->c, &kv, layer, &hb, k, v), 0);
        e->o->buf_free(e->c, k);
        e->o->buf_free(e->c, v);
        /* Invalid slots hold NaN: reading one would poison the output. */
        int n_bad = 0;
        float *nan_rows = malloc((size_t)hist * kv_dim * sizeof(float));
        for (int p = 0; p < hist; p++)
            if (!slot_valid(ac, s, p))
                pos[n_bad++] = p;
        for (size_t z = 0; z < (size_t)hist * kv_dim; z++)
            nan_rows[z] = NAN;
        if (n_bad) {
            hb.n = n_bad;
            k = dev_copy(e, nan_rows, (size_t)n_bad * kv_dim);
            ck_assert_int_eq(e->o->kv_write(e->c, &kv, layer, &hb, k, k), 0);
            e->o->buf_free(e->c, k);
        }
        free(nan_rows);
        free(pos);
        free(pt);
    }
    /* The validity maps of the sequences: (n_layers, stride) bytes each. */
    int vstride = 0;
    for (int s = 0; s < ac->n_seqs; s++)
        vstride = ac->lens[s] > vstride ? ac->lens[s] : vstride;
    uint8_t *vmaps[4];
    for (int s = 0; s < ac->n_seqs; s++) {
        vmaps[s] = calloc((size_t)n_layers * vstride, 1);
        for (int p = 0; p < ac->lens[s]; p++)
            vmaps[s][layer * vstride + p] = (uint8_t)slot_valid(ac, s, p);
    }

    /* The batch: the last in_batch[s] positions of each sequence, interleaved. */
    int n = 0;
    int row_seq[64], row_pos[64];
    for (int s = 0; s < ac->n_seqs; s++)
        for (int j = 0; j < ac->in_batch[s]; j++) {
            row_seq[n] = s;
            row_pos[n] = ac->lens[s] - ac->in_batch[s] + j;
            n++;
        }
    int32_t pos[64];
    const int32_t *pt[64];
    const uint8_t *valid[64];
    float *kb = malloc((size_t)n * kv_dim * sizeof(float));
    float *vb = malloc((size_t)n * kv_dim * sizeof(float));
    for (int i = 0; i < n; i++) {
        pos[i] = row_pos[i];
        pt[i] = tables[row_seq[i]];
        valid[i] = vmaps[row_seq[i]];
        memcpy(kb + (size_t)i * kv_dim, kref[row_seq[i]] + (size_t)row_pos[i] * kv_dim,
               (size_t)kv_dim * sizeof(float));
        memcpy(vb + (size_t)i * kv_dim, vref[row_seq[i]] + (size_t)row_pos[i] * kv_dim,
               (size_t)kv_dim * sizeof(float));
    }
    attn_batch_t b = { .n = n, .pos = pos, .page_table = pt };
    if (ac->mask_every > 0) {
        b.kv_valid = valid;
        b.kv_valid_stride = vstride;
    }
    float *k = dev_copy(e, kb, (size_t)n * kv_dim), *v = dev_copy(e, vb, (size_t)n * kv_dim);
    ck_assert_int_eq(e->o->kv_write(e->c, &kv, layer, &b, k, v), 0);

    size_t qn = (size_t)n * ac->n_heads * ac->hd;
    float *qh = malloc(qn * sizeof(float));
    fill(qh, qn, -1.0f, 1.0f);
    float *q = dev_copy(e, qh, qn);
    float *out = e->o->buf_alloc(e->c, qn);
    float scale = 1.0f / sqrtf((float)ac->hd);
    ck_assert_int_eq(e->o->attention(e->c, out, q, &kv, layer, &b, ac->n_heads, ac->n_kv,
                                     ac->hd, scale), 0);
    float *oh = host_copy(e, out, qn);
    if (!res) {
        /* In place: out may be q itself, with the same result. */
        float *qo = dev_copy(e, qh, qn);
        ck_assert_int_eq(e->o->attention(e->c, qo, qo, &kv, layer, &b, ac->n_heads, ac->n_kv,
                                         ac->hd, scale), 0);
        float *qoh = host_copy(e, qo, qn);
        ck_assert(memcmp(qoh, oh, qn * sizeof(float)) == 0);
        free(qoh);
        e->o->buf_free(e->c, qo);

        /* At the SIMD levels each row alone (a decode step) has the bits it has in the
         * batch (a prefill tile, a verify pass), at any length: lossless mode and the
         * prefix cache rest on it. Where a row alone has a KV head for each thread, it is
         * cut by heads, never into chunks of positions (whose merge adds in another order). */
        if (e->level > CPU_SIMD_SCALAR && ac->mask_every == 0 &&
            (e->threads == 1 || ac->n_kv >= e->threads)) {
            size_t rn = (size_t)ac->n_heads * ac->hd;
            float *ro = e->o->buf_alloc(e->c, rn);
            for (int i = 0; i < n; i++) {
                float *rq = dev_copy(e, qh + (size_t)i * rn, rn);
                attn_batch_t one = {.n = 1, .pos = &pos[i], .page_table = &pt[i]};
                ck_assert_int_eq(e->o->attention(e->c, ro, rq, &kv, layer, &one, ac->n_heads,
                                                 ac->n_kv, ac->hd, scale), 0);
                float *roh = host_copy(e, ro, rn);
                for (size_t z = 0; z < rn; z++)
                    ck_assert_msg(memcmp(&roh[z], &oh[(size_t)i * rn + z], sizeof(float)) == 0,
                                  "attention %s thr %d (heads %d/%d, hd %d): row %d at %d "
                                  "alone, output %zu is %.9g, %.9g in the batch",
                                  cpu_simd_name((cpu_simd_t)e->level), e->threads, ac->n_heads,
                                  ac->n_kv, ac->hd, i, pos[i], z, roh[z],
                                  oh[(size_t)i * rn + z]);
                free(roh);
                e->o->buf_free(e->c, rq);
            }
            e->o->buf_free(e->c, ro);
        }

        double *sc = malloc((size_t)(ac->lens[0] + 4096) * sizeof(double));
        for (int i = 0; i < n; i++) {
            int s = row_seq[i], len = row_pos[i] + 1;
            for (int h = 0; h < ac->n_heads; h++) {
                int kvh = h / G;
                const float *qv = qh + ((size_t)i * ac->n_heads + h) * ac->hd;
                double mx = -INFINITY, sum = 0.0;
                for (int t = 0; t < len; t++) {
                    if (!slot_valid(ac, s, t)) {
                        sc[t] = -INFINITY;
                        continue;
                    }
                    double d = 0.0;
                    for (int j = 0; j < ac->hd; j++)
                        d += (double)qv[j] * kref[s][(size_t)t * kv_dim + kvh * ac->hd + j];
                    sc[t] = d * scale;
                    mx = sc[t] > mx ? sc[t] : mx;
                }
                for (int t = 0; t < len; t++) {
                    sc[t] = exp(sc[t] - mx);
                    sum += sc[t];
                }
                for (int j = 0; j < ac->hd; j++) {
                    double o = 0.0;
                    for (int t = 0; t < len; t++)
                        if (slot_valid(ac, s, t))
                            o += sc[t] * vref[s][(size_t)t * kv_dim + kvh * ac->hd + j];
                    o /= sum;
                    float got = oh[((size_t)i * ac->n_heads + h) * ac->hd + j];
                    EXPECT(fabs(got - o) <= 2e-5,
                                  "attention %s thr %d (heads %d/%d, hd %d): row %d head %d "
                                  "[%d] = %g, want %g", cpu_simd_name((cpu_simd_t)e->level),
                                  e->threads, ac->n_heads, ac->n_kv, ac->hd, i, h, j, got, o);
                }
            }
        }
        free(sc);
    }
    /* Pages nobody owns, and layer 0 of every page, were never written (their codes). */
    float *kh = host_copy(e, kv.k, pool);
    const uint8_t *kc = (const uint8_t *)kh;
    for (int p = next; p < n_pages; p++)
        for (size_t z = 0; z < kv.page_stride * es; z++)
            EXPECT_TRUE(kc[(size_t)perm[p] * kv.page_stride * es + z] == 0);
    for (int p = 0; p < n_pages; p++)
        for (size_t z = 0; z < kv.layer_stride * es; z++)
            EXPECT_TRUE(kc[(size_t)p * kv.page_stride * es + z] == 0);

    /* A page id outside the pool is refused. */
    int32_t bad_table[1] = { n_pages };
    const int32_t *bpt[1] = { bad_table };
    int32_t bpos[1] = { 0 };
    attn_batch_t bb = { .n = 1, .pos = bpos, .page_table = bpt };
    ck_assert_int_eq(e->o->kv_write(e->c, &kv, layer, &bb, k, v), RIVER_ERANGE);
    ck_assert_int_eq(e->o->attention(e->c, out, q, &kv, layer, &bb, ac->n_heads, ac->n_kv,
                                     ac->hd, scale), RIVER_ERANGE);

    free(kh);
    free(qh);
    if (res)
        *res = oh;
    else
        free(oh);
    free(kb);
    free(vb);
    e->o->buf_free(e->c, q);
    e->o->buf_free(e->c, out);
    e->o->buf_free(e->c, k);
    e->o->buf_free(e->c, v);
    for (int s = 0; s < ac->n_seqs; s++) {
        free(vmaps[s]);
        free(tables[s]);
        free(kref[s]);
        free(vref[s]);
    }
    free(perm);
    e->o->buf_free(e->c, kv.k);
    e->o->buf_free(e->c, kv.v);
    return qn;
}

static const attn_ref_t attn_refs[] = {
    /* GQA 2, three sequences, two rows of one sequence in the batch (causal within it). */
    {4, 2, 8, 4, 3, {1, 9, 14}, {1, 2, 1}, 0, DTYPE_F32},
    /* Plain multi-head attention, odd head size, a prefill-like batch. */
    {3, 3, 20, 4, 2, {6, 11}, {6, 3}, 0, DTYPE_F32},
    /* GQA 2 with llama-sized heads. */
    {8, 4, 64, 16, 3, {40, 1, 33}, {1, 1, 2}, 0, DTYPE_F32},
    /* GQA 4 and a long sequence decoding: with two threads, one KV head each. */
    {8, 2, 64, 16, 1, {700}, {1}, 0, DTYPE_F32},
    /* One KV head, a long and a short sequence: a tile each. */
    {2, 1, 32, 8, 2, {600, 5}, {1, 1}, 0, DTYPE_F32},
    /* Validity maps (masked early exit): every third history slot is NaN and skipped. */
    {4, 2, 8, 4, 3, {1, 9, 14}, {1, 2, 1}, 3, DTYPE_F32},
    {8, 2, 64, 16, 2, {700, 30}, {1, 2}, 2, DTYPE_F32},
    /* Masked slots covering whole pages. */
    {4, 4, 16, 1, 1, {9}, {2}, 2, DTYPE_F32},
    /* Prefill tiles (SIMD levels): 40 rows of one sequence after 110 positions of history,
     * so three tiles (the last partial) over three K/V blocks, GQA 4. */
    {8, 2, 64, 16, 1, {150}, {40}, 0, DTYPE_F32},
    /* Two sequences prefilled from position 0 (one of them entirely in the batch), an odd
     * head size and page size, plus a decode row of a third. */
    {6, 3, 20, 7, 3, {70, 33, 12}, {20, 33, 1}, 0, DTYPE_F32},
    /* A long sequence's last 16 positions as one prefill tile, each row also alone, in
     * pools of F16 and Q8 (a thread widens only its KV heads: Q8 in whole scale blocks). */
    {8, 2, 64, 16, 1, {600}, {16}, 0, DTYPE_F16},
    {4, 4, 16, 16, 1, {530}, {3}, 0, DTYPE_Q8},
    /* One KV head and one long sequence: with two threads, chunks of positions. */
    {2, 1, 32, 8, 1, {600}, {1}, 0, DTYPE_BF16},
};

/* Attention case attn_refs[a] against the double-precision softmax. */
static void check_attention_case(bpair_t *p, const op_case_t *c)
{
    env_t e = env_ref(p);
    run_attention_case(&e, &attn_refs[c->a], NULL);
}

/* Attention case attn_refs[a] on both backends of a pair, from the same random data. */
static void run_attention_hist(bpair_t *p, const op_case_t *c)
{
    env_t er = env_of(p->ref, -1, 0), ex = env_of(p->x, p->level, 0);
    float *r = NULL, *x = NULL;
    test_rand_seed(TEST_RAND_SEED ^ (uint64_t)(c->a + 1));
    size_t n = run_attention_case(&er, &attn_refs[c->a], &r);
    test_rand_seed(TEST_RAND_SEED ^ (uint64_t)(c->a + 1));
    ck_assert_uint_eq(run_attention_case(&ex, &attn_refs[c->a], &x), n);
    check_host(p, r, x, n, c->tol, c->name);
    free(r);
    free(x);
}


/* A case of pairs 0-3 only; one with the reference check too (check, shape a-f); one on the
 * GPU only. */
#define CASE(name, run, dt, a, b, c, d, tol) {name, run, NULL, dt, a, b, c, d, 0, 0, tol, 0, NULL}
#define RCASE(name, run, check, dt, a, b, c, d, e, f, tol)                                    \
    {name, run, check, dt, a, b, c, d, e, f, tol, 0, NULL}
#define GPU_CASE(name, run, dt, a, b, c, d, tol) {name, run, NULL, dt, a, b, c, d, 0, 0, tol, 1, NULL}
#define GPU_CASE6(name, run, a, b, c, d, e, f, tol)                                           \
    {name, run, NULL, DTYPE_F32, a, b, c, d, e, f, tol, 1, NULL}
/* A matmul over mm_ns with its reference check: rows, cols, group, the setting it makes. */
#define MM_CASE(name, dt, rows, cols, group, env)                                             \
    {name, run_matmul, check_matmul_case, dt, rows, cols, 0, group, 0, 0, 0, 0, env}
/* The same for Q8 or Q4 weights whose zeros are all the integer z (e), at n rows (0: over
 * mm_ns), placed first: placement marks them (weight_t.zero_int), and the CPU's integer
 * kernels fold the zero terms into their sums or take them without reading the zeros. */
#define MM_ZINT_CASE(name, dt, rows, cols, group, n, z)                                        \
    {name, run_matmul, check_matmul_case, dt, rows, cols, n, group, z, 0, 0, 0, NULL}

/* matmul_multi: count weights, the first of rows0 rows, the others of rows1 (F32 where
 * mixed is 1), over mm_ns. */
#define MM_MULTI_CASE(name, dt, rows0, rows1, cols, group, count, mixed)                       \
    {name, run_matmul_multi, NULL, dt, rows0, cols, mixed, group, rows1, count, 0, 0, NULL}

static const op_case_t cases[] = {
    /* matmul_multi: q, k and v, gate and up; rows that end inside a 16-row unit, so that
     * one thread's part of a call may end in one weight and go on in the next. */
    MM_MULTI_CASE("matmul_multi bf16 q k v (128, 32, 32) x 256", DTYPE_BF16X8, 128, 32, 256,
                  0, 3, 0),
    MM_MULTI_CASE("matmul_multi f32 (37, 21, 21) x 96", DTYPE_F32, 37, 21, 96, 0, 3, 0),
    MM_MULTI_CASE("matmul_multi f16 gate up (200, 200) x 64", DTYPE_F16X8, 200, 200, 64, 0, 2,
                  0),
    MM_MULTI_CASE("matmul_multi q4 g32 (72, 24, 24) x 256", DTYPE_Q4X8, 72, 24, 256, 32, 3,
                  0),
    MM_MULTI_CASE("matmul_multi q8 g32 (64, 64) x 256", DTYPE_Q8X8, 64, 64, 256, 32, 2, 0),
    MM_MULTI_CASE("matmul_multi bf16 then f32 (64, 24) x 128", DTYPE_BF16X8, 64, 24, 128, 0, 2,
                  1),
    /* matmul: every weight type; GEMV-sized and batched row counts, none a multiple of 8
     * except where a kernel's 8-row pass is the point. */
    CASE("matmul f32 (96, 256) n 1", run_matmul, DTYPE_F32, 96, 256, 1, 0, 1e-4),
    CASE("matmul f32 (300, 512) n 13", run_matmul, DTYPE_F32, 300, 512, 13, 0, 1e-4),
    CASE("matmul f16 (256, 512) n 5", run_matmul, DTYPE_F16, 256, 512, 5, 0, 1e-4),
    CASE("matmul f16 (256, 512) n 9", run_matmul, DTYPE_F16, 256, 512, 9, 0, 2e-3),
    CASE("matmul bf16 (512, 384) n 3", run_matmul, DTYPE_BF16, 512, 384, 3, 0, 1e-4),
    CASE("matmul bf16 (384, 1024) n 8", run_matmul, DTYPE_BF16, 384, 1024, 8, 0, 1e-4),
    CASE("matmul bf16 (384, 1024) n 33", run_matmul, DTYPE_BF16, 384, 1024, 33, 0, 1e-2),
    CASE("matmul f16 (300, 776) n 197", run_matmul, DTYPE_F16, 300, 776, 197, 0, 1e-2),
    CASE("matmul q8 g64 (256, 512) n 1", run_matmul, DTYPE_Q8, 256, 512, 1, 64, 1e-4),
    CASE("matmul q8 g32 (200, 384) n 11", run_matmul, DTYPE_Q8, 200, 384, 11, 32, 1e-4),
    CASE("matmul q4 g32 (256, 512) n 3", run_matmul, DTYPE_Q4, 256, 512, 3, 32, 1e-4),
    CASE("matmul q4 g128 (512, 1024) n 20", run_matmul, DTYPE_Q4, 512, 1024, 20, 128, 1e-4),
    CASE("matmul q4 g6 (33, 96) n 2", run_matmul, DTYPE_Q4, 33, 96, 2, 6, 1e-4),
    CASE("matmul q2 g64 (256, 512) n 1", run_matmul, DTYPE_Q2, 256, 512, 1, 64, 1e-4),
    CASE("matmul q2 g32 (200, 384) n 3", run_matmul, DTYPE_Q2, 200, 384, 3, 32, 1e-4),
    CASE("matmul q2 g16 (96, 256) n 17", run_matmul, DTYPE_Q2, 96, 256, 17, 16, 1e-4),
    CASE("matmul q2 g64 (300, 512) n 64", run_matmul, DTYPE_Q2, 300, 512, 64, 64, 1e-4),
    CASE("matmul q3 g64 (256, 512) n 1", run_matmul, DTYPE_Q3, 256, 512, 1, 64, 1e-4),
    CASE("matmul q3 g32 (200, 384) n 3", run_matmul, DTYPE_Q3, 200, 384, 3, 32, 1e-4),
    CASE("matmul q3 g16 (96, 256) n 17", run_matmul, DTYPE_Q3, 96, 256, 17, 16, 1e-4),
    CASE("matmul q3 g48 (300, 480) n 64", run_matmul, DTYPE_Q3, 300, 480, 64, 48, 1e-4),
    CASE("matmul q2 g64 (2048, 2048) n 1", run_matmul, DTYPE_Q2, 2048, 2048, 1, 64, 1e-4),
    CASE("matmul q3 g64 (8192, 2048) n 4", run_matmul, DTYPE_Q3, 8192, 2048, 4, 64, 1e-4),
    /* Llama 3.2 1B projection shapes (dim 2048, FFN 8192), GEMV and cuBLAS paths. */
    CASE("matmul f32 (2048, 2048) n 1", run_matmul, DTYPE_F32, 2048, 2048, 1, 0, 1e-4),
    GPU_CASE("matmul f32 (2048, 2048) n 64", run_matmul, DTYPE_F32, 2048, 2048, 64, 0, 1e-4),
    CASE("matmul f16 (2048, 2048) n 4", run_matmul, DTYPE_F16, 2048, 2048, 4, 0, 1e-4),
    GPU_CASE("matmul f16 (2048, 2048) n 9", run_matmul, DTYPE_F16, 2048, 2048, 9, 0, 2e-3),
    CASE("matmul bf16 (8192, 2048) n 1", run_matmul, DTYPE_BF16, 8192, 2048, 1, 0, 1e-4),
    CASE("matmul bf16 (2048, 8192) n 2", run_matmul, DTYPE_BF16, 2048, 8192, 2, 0, 1e-4),
    GPU_CASE("matmul bf16 (8192, 2048) n 33", run_matmul, DTYPE_BF16, 8192, 2048, 33, 0, 1e-2),
    CASE("matmul q8 g64 (2048, 2048) n 1", run_matmul, DTYPE_Q8, 2048, 2048, 1, 64, 1e-4),
    CASE("matmul q4 g128 (8192, 2048) n 8", run_matmul, DTYPE_Q4, 8192, 2048, 8, 128, 1e-4),
    GPU_CASE("matmul q4 g64 (2048, 2048) n 20", run_matmul, DTYPE_Q4, 2048, 2048, 20, 64, 1e-4),
    /* The LM head of Llama 3.2 1B. */
    GPU_CASE("matmul bf16 (128256, 2048) n 1", run_matmul, DTYPE_BF16, 128256, 2048, 1, 0,
             1e-4),
    GPU_CASE("matmul bf16 (128256, 2048) n 16", run_matmul, DTYPE_BF16, 128256, 2048, 16, 0,
             1e-2),
    /* embed */
    CASE("embed f32", run_embed, DTYPE_F32, 1000, 256, 7, 0, 0),
    CASE("embed bf16", run_embed, DTYPE_BF16, 1000, 256, 7, 0, 0),
    CASE("embed f16", run_embed, DTYPE_F16, 1000, 256, 7, 0, 0),
    CASE("embed q8", run_embed, DTYPE_Q8, 1000, 256, 7, 0, 0),
    CASE("embed q4", run_embed, DTYPE_Q4, 1000, 256, 7, 0, 0),
    GPU_CASE("embed bf16 32000x2048", run_embed, DTYPE_BF16, 32000, 2048, 5, 0, 0),
    GPU_CASE("embed q4 32000x2048", run_embed, DTYPE_Q4, 32000, 2048, 5, 0, 0),
    /* rmsnorm, add_bias, add */
    CASE("norm f32 5x2048", run_norm_add, DTYPE_F32, 5, 2048, 0, 0, 1e-5),
    CASE("norm bf16 13x768", run_norm_add, DTYPE_BF16, 13, 768, 0, 0, 1e-5),
    CASE("norm f16 3x96", run_norm_add, DTYPE_F16, 3, 96, 0, 0, 1e-5),
    /* rope: head dims 64, 96, 128; partial rotary */
    CASE("rope hd 64", run_rope, DTYPE_F32, 7, 8, 64, 64, 1e-5),
    CASE("rope hd 96", run_rope, DTYPE_F32, 5, 6, 96, 96, 1e-5),
    CASE("rope hd 128 rot 64", run_rope, DTYPE_F32, 3, 4, 128, 64, 1e-5),
    CASE("rope hd 128", run_rope, DTYPE_F32, 9, 4, 128, 128, 1e-5),
    /* swiglu */
    CASE("swiglu 5x1536", run_swiglu, DTYPE_F32, 5, 1536, 0, 0, 1e-5),
    CASE("swiglu 1x8192", run_swiglu, DTYPE_F32, 1, 8192, 0, 0, 1e-5),
    /* kv_write + attention: head dim, KV heads, GQA group, long context */
    CASE("attention hd 64 gqa 8 ctx 1100", run_attention, DTYPE_F32, 64, 2, 8, 1100, 1e-4),
    CASE("attention hd 64 gqa 1 ctx 300", run_attention, DTYPE_F32, 64, 4, 1, 300, 1e-4),
    CASE("attention hd 96 gqa 1 ctx 1030", run_attention, DTYPE_F32, 96, 3, 1, 1030, 1e-4),
    CASE("attention hd 128 gqa 8 ctx 1300", run_attention, DTYPE_F32, 128, 1, 8, 1300, 1e-4),
    CASE("attention hd 128 gqa 1 ctx 200", run_attention, DTYPE_F32, 128, 2, 1, 200, 1e-4),
    /* Llama 3.2 1B: 32 heads of 64 over 8 KV heads. */
    GPU_CASE("attention hd 64 gqa 4 ctx 1500", run_attention, DTYPE_F32, 64, 8, 4, 1500, 1e-4),
    /* The pool's other element types (kv.dtype): both sides read the same rounded values,
     * so the tolerances are f32's; the long contexts take the chunked decode path. */
    CASE("attention kv f16 hd 64 gqa 4 ctx 300", run_attention, DTYPE_F16, 64, 2, 4, 300, 1e-4),
    CASE("attention kv f16 hd 96 gqa 1 ctx 1030", run_attention, DTYPE_F16, 96, 3, 1, 1030,
         1e-4),
    CASE("attention kv bf16 hd 128 gqa 1 ctx 200", run_attention, DTYPE_BF16, 128, 2, 1, 200,
         1e-4),
    CASE("attention kv bf16 hd 8 gqa 2 ctx 90", run_attention, DTYPE_BF16, 8, 4, 2, 90, 1e-4),
    CASE("attention kv q8 hd 64 gqa 8 ctx 1100", run_attention, DTYPE_Q8, 64, 2, 8, 1100, 1e-4),
    CASE("attention kv q8 hd 32 gqa 2 ctx 150", run_attention, DTYPE_Q8, 32, 3, 2, 150, 1e-4),
    /* cosine, gather, scatter */
    CASE("rows 13x2048", run_rows, DTYPE_F32, 13, 2048, 0, 0, 0),
    CASE("rows 6x96", run_rows, DTYPE_F32, 6, 96, 0, 0, 0),
    /* the router */
    CASE("router d 288 h 128", run_router, DTYPE_F32, 13, 288, 128, 0, 1e-5),
    CASE("router d 2048 h 128", run_router, DTYPE_F32, 9, 2048, 128, 0, 1e-5),
    CASE("router d 100 h 16", run_router, DTYPE_F32, 3, 100, 16, 0, 1e-5),
    /* More real shapes on the CUDA backend's paths: batches of the
     * element-wise kernel, odd groups, and short-and-wide weights that the CUDA backend
     * splits along K, with a tail chunk (3000, 4104 and 4128 columns are no multiple of
     * the split step), W4A16 wide loads with power-of-two and other groups. */
    CASE("matmul bf16 (512, 2048) n 8", run_matmul, DTYPE_BF16, 512, 2048, 8, 0, 1e-4),
    CASE("matmul q4 g32 (2048, 2048) n 3", run_matmul, DTYPE_Q4, 2048, 2048, 3, 32, 1e-4),
    CASE("matmul f32 (37, 100) n 5", run_matmul, DTYPE_F32, 37, 100, 5, 0, 1e-4),
    CASE("matmul q8 g12 (33, 96) n 11", run_matmul, DTYPE_Q8, 33, 96, 11, 12, 1e-4),
    CASE("matmul bf16 (512, 8192) n 1", run_matmul, DTYPE_BF16, 512, 8192, 1, 0, 1e-4),
    CASE("matmul f16 (100, 3000) n 7", run_matmul, DTYPE_F16, 100, 3000, 7, 0, 1e-4),
    CASE("matmul f32 (64, 4104) n 3", run_matmul, DTYPE_F32, 64, 4104, 3, 0, 1e-4),
    CASE("matmul q8 g64 (256, 4096) n 5", run_matmul, DTYPE_Q8, 256, 4096, 5, 64, 1e-4),
    CASE("matmul q4 g128 (512, 8192) n 3", run_matmul, DTYPE_Q4, 512, 8192, 3, 128, 1e-4),
    CASE("matmul q4 g32 (64, 4128) n 2", run_matmul, DTYPE_Q4, 64, 4128, 2, 32, 1e-4),
    CASE("matmul q4 g96 (300, 2016) n 9", run_matmul, DTYPE_Q4, 300, 2016, 9, 96, 1e-4),
    /* Every row count of mm_ns, with the double-precision reference on the reference
     * pairs: 16-bit and f32 weights of odd sizes... */
    MM_CASE("matmul f32 (1, 1)", DTYPE_F32, 1, 1, 0, NULL),
    MM_CASE("matmul f32 (5, 3)", DTYPE_F32, 5, 3, 0, NULL),
    MM_CASE("matmul f32 (17, 172)", DTYPE_F32, 17, 172, 0, NULL),
    MM_CASE("matmul f32 (64, 64)", DTYPE_F32, 64, 64, 0, NULL),
    MM_CASE("matmul f32 (37, 384)", DTYPE_F32, 37, 384, 0, NULL),
    MM_CASE("matmul f32 (200, 384)", DTYPE_F32, 200, 384, 0, NULL),
    MM_CASE("matmul f32 (100, 2051)", DTYPE_F32, 100, 2051, 0, NULL),
    MM_CASE("matmul f16 (1, 1)", DTYPE_F16, 1, 1, 0, NULL),
    MM_CASE("matmul f16 (5, 3)", DTYPE_F16, 5, 3, 0, NULL),
    MM_CASE("matmul f16 (17, 172)", DTYPE_F16, 17, 172, 0, NULL),
    MM_CASE("matmul f16 (64, 64)", DTYPE_F16, 64, 64, 0, NULL),
    MM_CASE("matmul f16 (37, 384)", DTYPE_F16, 37, 384, 0, NULL),
    MM_CASE("matmul f16 (200, 384)", DTYPE_F16, 200, 384, 0, NULL),
    MM_CASE("matmul f16 (100, 2051)", DTYPE_F16, 100, 2051, 0, NULL),
    MM_CASE("matmul bf16 (1, 1)", DTYPE_BF16, 1, 1, 0, NULL),
    MM_CASE("matmul bf16 (5, 3)", DTYPE_BF16, 5, 3, 0, NULL),
    MM_CASE("matmul bf16 (17, 172)", DTYPE_BF16, 17, 172, 0, NULL),
    MM_CASE("matmul bf16 (64, 64)", DTYPE_BF16, 64, 64, 0, NULL),
    MM_CASE("matmul bf16 (37, 384)", DTYPE_BF16, 37, 384, 0, NULL),
    MM_CASE("matmul bf16 (200, 384)", DTYPE_BF16, 200, 384, 0, NULL),
    MM_CASE("matmul bf16 (100, 2051)", DTYPE_BF16, 100, 2051, 0, NULL),
    /* The prefill path's blocks of rows (256) and columns (256) with short last ones. */
    MM_CASE("matmul bf16 (300, 776)", DTYPE_BF16, 300, 776, 0, NULL),
    /* ...Q8 and Q4 with groups of 16/32/64/128 (the SIMD paths; whole 32-column blocks
     * take the AVX2 level's 8-bit x, within its bound) and of 6, 10, 48, 96, 160 (the
     * portable fallback)... */
    MM_CASE("matmul q8 g16 (1, 16)", DTYPE_Q8, 1, 16, 16, NULL),
    MM_CASE("matmul q8 g16 (7, 32)", DTYPE_Q8, 7, 32, 16, NULL),
    MM_CASE("matmul q8 g32 (20, 64)", DTYPE_Q8, 20, 64, 32, NULL),
    MM_CASE("matmul q8 g64 (37, 384)", DTYPE_Q8, 37, 384, 64, NULL),
    MM_CASE("matmul q8 g128 (200, 384)", DTYPE_Q8, 200, 384, 128, NULL),
    MM_CASE("matmul q8 g48 (13, 96)", DTYPE_Q8, 13, 96, 48, NULL),
    MM_CASE("matmul q8 g6 (9, 60)", DTYPE_Q8, 9, 60, 6, NULL),
    MM_CASE("matmul q8 g10 (5, 30)", DTYPE_Q8, 5, 30, 10, NULL),
    MM_CASE("matmul q8 g32 (11, 640)", DTYPE_Q8, 11, 640, 32, NULL),
    MM_CASE("matmul q8 g16 (5, 1024)", DTYPE_Q8, 5, 1024, 16, NULL),
    MM_CASE("matmul q8 g96 (19, 288)", DTYPE_Q8, 19, 288, 96, NULL),
    MM_CASE("matmul q8 g32 (23, 352)", DTYPE_Q8, 23, 352, 32, NULL),
    MM_CASE("matmul q8 g64 (3, 2304)", DTYPE_Q8, 3, 2304, 64, NULL),
    MM_CASE("matmul q8 g160 (9, 160)", DTYPE_Q8, 9, 160, 160, NULL),
    MM_CASE("matmul q4 g16 (1, 16)", DTYPE_Q4, 1, 16, 16, NULL),
    MM_CASE("matmul q4 g16 (7, 32)", DTYPE_Q4, 7, 32, 16, NULL),
    MM_CASE("matmul q4 g32 (20, 64)", DTYPE_Q4, 20, 64, 32, NULL),
    MM_CASE("matmul q4 g64 (37, 384)", DTYPE_Q4, 37, 384, 64, NULL),
    MM_CASE("matmul q4 g128 (200, 384)", DTYPE_Q4, 200, 384, 128, NULL),
    MM_CASE("matmul q4 g48 (13, 96)", DTYPE_Q4, 13, 96, 48, NULL),
    MM_CASE("matmul q4 g6 (9, 60)", DTYPE_Q4, 9, 60, 6, NULL),
    MM_CASE("matmul q4 g10 (5, 30)", DTYPE_Q4, 5, 30, 10, NULL),
    MM_CASE("matmul q4 g32 (11, 640)", DTYPE_Q4, 11, 640, 32, NULL),
    MM_CASE("matmul q4 g16 (5, 1024)", DTYPE_Q4, 5, 1024, 16, NULL),
    MM_CASE("matmul q4 g96 (19, 288)", DTYPE_Q4, 19, 288, 96, NULL),
    MM_CASE("matmul q4 g32 (23, 352)", DTYPE_Q4, 23, 352, 32, NULL),
    MM_CASE("matmul q4 g64 (3, 2304)", DTYPE_Q4, 3, 2304, 64, NULL),
    MM_CASE("matmul q4 g160 (9, 160)", DTYPE_Q4, 9, 160, 160, NULL),
    /* ...Q4X8, the CPU's repacked Q4: the reference pairs read the repacked codes at every
     * level; the other pairs place Q4 codes, which the SIMD levels repack (RIVER_Q4X8
     * unset) or keep in the file's layout (RIVER_Q4X8=0)... */
    MM_CASE("matmul q4x8 g32 (8, 256)", DTYPE_Q4X8, 8, 256, 32, NULL),
    MM_CASE("matmul q4x8 g64 (37, 512)", DTYPE_Q4X8, 37, 512, 64, NULL),
    MM_CASE("matmul q4x8 g128 (13, 768)", DTYPE_Q4X8, 13, 768, 128, NULL),
    MM_CASE("matmul q4x8 g256 (9, 1024)", DTYPE_Q4X8, 9, 1024, 256, NULL),
    MM_CASE("matmul q4x8 g512 (5, 2048)", DTYPE_Q4X8, 5, 2048, 512, NULL),
    MM_CASE("matmul q4x8 g64 (19, 256)", DTYPE_Q4X8, 19, 256, 64, NULL),
    MM_CASE("matmul q4x8 g32 (1, 512)", DTYPE_Q4X8, 1, 512, 32, NULL),
    MM_CASE("matmul q4 g32 (8, 256) RIVER_Q4X8=0", DTYPE_Q4, 8, 256, 32, "RIVER_Q4X8=0"),
    MM_CASE("matmul q4 g64 (37, 512) RIVER_Q4X8=0", DTYPE_Q4, 37, 512, 64, "RIVER_Q4X8=0"),
    MM_CASE("matmul q4 g128 (13, 768) RIVER_Q4X8=0", DTYPE_Q4, 13, 768, 128, "RIVER_Q4X8=0"),
    /* ...Q8 with every zero 128 (the symmetric path: n 1, 2, 5, 8 among mm_ns, and
     * prefill rows; after the others, whose seeds follow their place in the list)... */
    /* ...BF16X8 and F16X8, the CPU's row-blocked bf16 and f16: the reference pairs read the
     * blocked rows at every level; the other pairs place bf16 and f16, which the SIMD
     * levels block (RIVER_ROWBLOCK unset, whole 8-row blocks of 32-column chunks) or keep
     * row-major (RIVER_ROWBLOCK=0, or other shapes)... */
    MM_CASE("matmul bf16x8 (8, 32)", DTYPE_BF16X8, 8, 32, 0, NULL),
    MM_CASE("matmul bf16x8 (40, 512)", DTYPE_BF16X8, 40, 512, 0, NULL),
    MM_CASE("matmul bf16x8 (16, 2080)", DTYPE_BF16X8, 16, 2080, 0, NULL),
    MM_CASE("matmul f16x8 (24, 96)", DTYPE_F16X8, 24, 96, 0, NULL),
    MM_CASE("matmul f16x8 (64, 1024)", DTYPE_F16X8, 64, 1024, 0, NULL),
    MM_CASE("matmul bf16 (37, 384)", DTYPE_BF16, 37, 384, 0, NULL),
    MM_CASE("matmul bf16 (64, 200)", DTYPE_BF16, 64, 200, 0, NULL),
    MM_CASE("matmul f16 (21, 96)", DTYPE_F16, 21, 96, 0, NULL),
    MM_CASE("matmul bf16 (40, 512) RIVER_ROWBLOCK=0", DTYPE_BF16, 40, 512, 0,
            "RIVER_ROWBLOCK=0"),
    MM_CASE("matmul f16 (64, 1024) RIVER_ROWBLOCK=0", DTYPE_F16, 64, 1024, 0,
            "RIVER_ROWBLOCK=0"),
    MM_ZINT_CASE("matmul q8 z128 g32 (37, 384)", DTYPE_Q8, 37, 384, 32, 0, 128),
    MM_ZINT_CASE("matmul q8 z128 g64 (19, 256)", DTYPE_Q8, 19, 256, 64, 0, 128),
    MM_ZINT_CASE("matmul q8 z128 g128 (8, 4096)", DTYPE_Q8, 8, 4096, 128, 0, 128),
    MM_ZINT_CASE("matmul q8 z128 g32 (64, 2048) n 1", DTYPE_Q8, 64, 2048, 32, 1, 128),
    MM_ZINT_CASE("matmul q8 z128 g32 (96, 2048) n 33", DTYPE_Q8, 96, 2048, 32, 33, 128),
    MM_ZINT_CASE("matmul q8 z128 g32 (40, 1024) n 128", DTYPE_Q8, 40, 1024, 32, 128, 128),
    MM_ZINT_CASE("matmul q8 z128 g16 (13, 96)", DTYPE_Q8, 13, 96, 16, 0, 128),
    /* ...llama.cpp's Q6_K (Q8 in groups of 16, zeros of 32), on the integer kernels... */
    MM_ZINT_CASE("matmul q8 z32 g16 (37, 384)", DTYPE_Q8, 37, 384, 16, 0, 32),
    MM_ZINT_CASE("matmul q8 z32 g16 (64, 2048) n 1", DTYPE_Q8, 64, 2048, 16, 1, 32),
    MM_ZINT_CASE("matmul q8 z32 g16 (40, 1024) n 128", DTYPE_Q8, 40, 1024, 16, 128, 32),
    MM_CASE("matmul q8 g16 (21, 2080)", DTYPE_Q8, 21, 2080, 16, NULL),
    /* ...llama.cpp's Q5_0 (Q8, zeros of 16) and Q4_0 (Q4, zeros of 8), in the file's layout
     * (384 columns) and repacked (Q8X8, Q4X8), the prefill's 512-bit tiles included... */
    MM_ZINT_CASE("matmul q8 z16 g32 (37, 384)", DTYPE_Q8, 37, 384, 32, 0, 16),
    MM_ZINT_CASE("matmul q8 z16 g32 (19, 512)", DTYPE_Q8, 19, 512, 32, 0, 16),
    MM_ZINT_CASE("matmul q8 z16 g32 (96, 2048) n 33", DTYPE_Q8, 96, 2048, 32, 33, 16),
    MM_ZINT_CASE("matmul q8 z16 g32 (40, 1024) n 128", DTYPE_Q8, 40, 1024, 32, 128, 16),
    MM_ZINT_CASE("matmul q4 z8 g32 (37, 384)", DTYPE_Q4, 37, 384, 32, 0, 8),
    MM_ZINT_CASE("matmul q4 z8 g32 (19, 512)", DTYPE_Q4, 19, 512, 32, 0, 8),
    MM_ZINT_CASE("matmul q4 z8 g64 (13, 768)", DTYPE_Q4, 13, 768, 64, 0, 8),
    MM_ZINT_CASE("matmul q4 z8 g32 (64, 2048) n 1", DTYPE_Q4, 64, 2048, 32, 1, 8),
    MM_ZINT_CASE("matmul q4 z8 g32 (96, 2048) n 33", DTYPE_Q4, 96, 2048, 32, 33, 8),
    MM_ZINT_CASE("matmul q4 z8 g32 (40, 1024) n 128", DTYPE_Q4, 40, 1024, 32, 128, 8),
    /* ...Q8X8, the CPU's repacked Q8, read by every level as Q4X8 is (and Q8 of the same
     * shapes kept in the file's layout with RIVER_Q4X8=0)... */
    MM_CASE("matmul q8x8 g32 (8, 256)", DTYPE_Q8X8, 8, 256, 32, NULL),
    MM_CASE("matmul q8x8 g64 (37, 512)", DTYPE_Q8X8, 37, 512, 64, NULL),
    MM_CASE("matmul q8x8 g128 (13, 768)", DTYPE_Q8X8, 13, 768, 128, NULL),
    MM_CASE("matmul q8x8 g256 (9, 1024)", DTYPE_Q8X8, 9, 1024, 256, NULL),
    MM_CASE("matmul q8x8 g512 (5, 2048)", DTYPE_Q8X8, 5, 2048, 512, NULL),
    MM_CASE("matmul q8x8 g32 (19, 2048)", DTYPE_Q8X8, 19, 2048, 32, NULL),
    MM_CASE("matmul q8 g32 (37, 512) RIVER_Q4X8=0", DTYPE_Q8, 37, 512, 32, "RIVER_Q4X8=0"),
    MM_CASE("matmul q8 g64 (13, 768) RIVER_Q4X8=0", DTYPE_Q8, 13, 768, 64, "RIVER_Q4X8=0"),
    /* ...Q2 and Q3 (kernels/cpu/lowbit.h) in groups of 16, 32, 48 and 64, one group to
     * many per row, odd output counts... */
    MM_CASE("matmul q2 g16 (1, 16)", DTYPE_Q2, 1, 16, 16, NULL),
    MM_CASE("matmul q2 g16 (7, 48)", DTYPE_Q2, 7, 48, 16, NULL),
    MM_CASE("matmul q2 g32 (20, 64)", DTYPE_Q2, 20, 64, 32, NULL),
    MM_CASE("matmul q2 g48 (13, 96)", DTYPE_Q2, 13, 96, 48, NULL),
    MM_CASE("matmul q2 g64 (37, 384)", DTYPE_Q2, 37, 384, 64, NULL),
    MM_CASE("matmul q2 g64 (3, 2304)", DTYPE_Q2, 3, 2304, 64, NULL),
    MM_CASE("matmul q3 g16 (1, 16)", DTYPE_Q3, 1, 16, 16, NULL),
    MM_CASE("matmul q3 g16 (7, 48)", DTYPE_Q3, 7, 48, 16, NULL),
    MM_CASE("matmul q3 g32 (20, 64)", DTYPE_Q3, 20, 64, 32, NULL),
    MM_CASE("matmul q3 g48 (13, 96)", DTYPE_Q3, 13, 96, 48, NULL),
    MM_CASE("matmul q3 g64 (37, 384)", DTYPE_Q3, 37, 384, 64, NULL),
    MM_CASE("matmul q3 g64 (3, 2304)", DTYPE_Q3, 3, 2304, 64, NULL),
    /* ...and the errors a matmul returns (the CPU only: what it refuses is its own). */
    RCASE("matmul errors", NULL, check_matmul_errors, DTYPE_Q4, 0, 0, 0, 0, 0, 0, 0),
    /* embed: 50 rows of every type, exact; Q8/Q4 in groups of 8 and 16. */
    RCASE("embed f32 50x1", run_embed, check_embed, DTYPE_F32, 50, 1, 6, 0, 0, 0, 0),
    RCASE("embed f32 50x7", run_embed, check_embed, DTYPE_F32, 50, 7, 6, 0, 0, 0, 0),
    RCASE("embed f32 50x64", run_embed, check_embed, DTYPE_F32, 50, 64, 6, 0, 0, 0, 0),
    RCASE("embed f32 50x173", run_embed, check_embed, DTYPE_F32, 50, 173, 6, 0, 0, 0, 0),
    RCASE("embed f16 50x1", run_embed, check_embed, DTYPE_F16, 50, 1, 6, 0, 0, 0, 0),
    RCASE("embed f16 50x7", run_embed, check_embed, DTYPE_F16, 50, 7, 6, 0, 0, 0, 0),
    RCASE("embed f16 50x64", run_embed, check_embed, DTYPE_F16, 50, 64, 6, 0, 0, 0, 0),
    RCASE("embed f16 50x173", run_embed, check_embed, DTYPE_F16, 50, 173, 6, 0, 0, 0, 0),
    RCASE("embed bf16 50x1", run_embed, check_embed, DTYPE_BF16, 50, 1, 6, 0, 0, 0, 0),
    RCASE("embed bf16 50x7", run_embed, check_embed, DTYPE_BF16, 50, 7, 6, 0, 0, 0, 0),
    RCASE("embed bf16 50x64", run_embed, check_embed, DTYPE_BF16, 50, 64, 6, 0, 0, 0, 0),
    RCASE("embed bf16 50x173", run_embed, check_embed, DTYPE_BF16, 50, 173, 6, 0, 0, 0, 0),
    RCASE("embed q8 g8 50x16", run_embed, check_embed, DTYPE_Q8, 50, 16, 6, 8, 0, 0, 0),
    RCASE("embed q8 g16 50x32", run_embed, check_embed, DTYPE_Q8, 50, 32, 6, 16, 0, 0, 0),
    RCASE("embed q8 g16 50x48", run_embed, check_embed, DTYPE_Q8, 50, 48, 6, 16, 0, 0, 0),
    RCASE("embed q8 g16 50x96", run_embed, check_embed, DTYPE_Q8, 50, 96, 6, 16, 0, 0, 0),
    /* Whole sets of 256 columns: repacked to Q8X8 at placement where a level does. */
    RCASE("embed q8 g16 50x512", run_embed, check_embed, DTYPE_Q8, 50, 512, 6, 16, 0, 0, 0),
    RCASE("embed q4 g8 50x16", run_embed, check_embed, DTYPE_Q4, 50, 16, 6, 8, 0, 0, 0),
    RCASE("embed q4 g16 50x32", run_embed, check_embed, DTYPE_Q4, 50, 32, 6, 16, 0, 0, 0),
    RCASE("embed q4 g16 50x48", run_embed, check_embed, DTYPE_Q4, 50, 48, 6, 16, 0, 0, 0),
    RCASE("embed q4 g16 50x96", run_embed, check_embed, DTYPE_Q4, 50, 96, 6, 16, 0, 0, 0),
    RCASE("embed q2 g16 50x32", run_embed, check_embed, DTYPE_Q2, 50, 32, 6, 16, 0, 0, 0),
    RCASE("embed q3 g32 50x96", run_embed, check_embed, DTYPE_Q3, 50, 96, 6, 32, 0, 0, 0),
    GPU_CASE("embed f32 32000x2048", run_embed, DTYPE_F32, 32000, 2048, 5, 0, 0),
    GPU_CASE("embed f16 32000x2048", run_embed, DTYPE_F16, 32000, 2048, 5, 0, 0),
    GPU_CASE("embed q8 32000x2048", run_embed, DTYPE_Q8, 32000, 2048, 5, 0, 0),
    /* rmsnorm (f32 and bf16 weights), then add_bias and add (f32, f16, bf16 biases), with
     * the reference on the reference pairs; a flat add of 200003 through the pool. */
    CASE("norm bf16 5x2048", run_norm_add, DTYPE_BF16, 5, 2048, 0, 0, 1e-5),
    CASE("norm f16 5x2048", run_norm_add, DTYPE_F16, 5, 2048, 0, 0, 1e-5),
    RCASE("rmsnorm f32 1x1", run_norm_add, check_rmsnorm, DTYPE_F32, 1, 1, 0, 0, 0, 0, 1e-5),
    RCASE("rmsnorm f32 3x7", run_norm_add, check_rmsnorm, DTYPE_F32, 3, 7, 0, 0, 0, 0, 1e-5),
    RCASE("rmsnorm f32 5x64", run_norm_add, check_rmsnorm, DTYPE_F32, 5, 64, 0, 0, 0, 0, 1e-5),
    RCASE("rmsnorm f32 2x1000", run_norm_add, check_rmsnorm, DTYPE_F32, 2, 1000, 0, 0, 0, 0,
          1e-5),
    RCASE("rmsnorm f32 300x260", run_norm_add, check_rmsnorm, DTYPE_F32, 300, 260, 0, 0, 0, 0,
          1e-5),
    RCASE("rmsnorm bf16 1x1", run_norm_add, check_rmsnorm, DTYPE_BF16, 1, 1, 0, 0, 0, 0, 1e-5),
    RCASE("rmsnorm bf16 3x7", run_norm_add, check_rmsnorm, DTYPE_BF16, 3, 7, 0, 0, 0, 0, 1e-5),
    RCASE("rmsnorm bf16 5x64", run_norm_add, check_rmsnorm, DTYPE_BF16, 5, 64, 0, 0, 0, 0,
          1e-5),
    RCASE("rmsnorm bf16 2x1000", run_norm_add, check_rmsnorm, DTYPE_BF16, 2, 1000, 0, 0, 0, 0,
          1e-5),
    RCASE("rmsnorm bf16 300x260", run_norm_add, check_rmsnorm, DTYPE_BF16, 300, 260, 0, 0, 0,
          0, 1e-5),
    RCASE("add f32 1x1", run_norm_add, check_add_bias_add, DTYPE_F32, 1, 1, 0, 0, 0, 0, 1e-5),
    RCASE("add f32 3x17", run_norm_add, check_add_bias_add, DTYPE_F32, 3, 17, 0, 0, 0, 0, 1e-5),
    RCASE("add f32 4x64", run_norm_add, check_add_bias_add, DTYPE_F32, 4, 64, 0, 0, 0, 0, 1e-5),
    RCASE("add f32 300x300", run_norm_add, check_add_bias_add, DTYPE_F32, 300, 300, 0, 0, 0, 0,
          1e-5),
    RCASE("add f16 1x1", run_norm_add, check_add_bias_add, DTYPE_F16, 1, 1, 0, 0, 0, 0, 1e-5),
    RCASE("add f16 3x17", run_norm_add, check_add_bias_add, DTYPE_F16, 3, 17, 0, 0, 0, 0, 1e-5),
    RCASE("add f16 4x64", run_norm_add, check_add_bias_add, DTYPE_F16, 4, 64, 0, 0, 0, 0, 1e-5),
    RCASE("add f16 300x300", run_norm_add, check_add_bias_add, DTYPE_F16, 300, 300, 0, 0, 0, 0,
          1e-5),
    RCASE("add bf16 1x1", run_norm_add, check_add_bias_add, DTYPE_BF16, 1, 1, 0, 0, 0, 0, 1e-5),
    RCASE("add bf16 3x17", run_norm_add, check_add_bias_add, DTYPE_BF16, 3, 17, 0, 0, 0, 0,
          1e-5),
    RCASE("add bf16 4x64", run_norm_add, check_add_bias_add, DTYPE_BF16, 4, 64, 0, 0, 0, 0,
          1e-5),
    RCASE("add bf16 300x300", run_norm_add, check_add_bias_add, DTYPE_BF16, 300, 300, 0, 0, 0,
          0, 1e-5),
    /* Its rmsnorm sums 200003 squares: the scalar level, CUDA's reference, adds them one
     * after another in float, off by about sqrt(n) ulp (the H200 run: 1.45e-5). */
    RCASE("add flat 200003", run_norm_add, check_add_bias_add, DTYPE_F32, 1, 200003, 0, 0, 0,
          0, 5e-5),
    /* rope: Llama 3.2 1B's 32 heads of 64 (full and half rotary), and with the reference:
     * rows, heads, head_dim, rot_dim, layout, attn_factor in hundredths. */
    CASE("rope hd 64 rot 32 heads 32", run_rope, DTYPE_F32, 4, 32, 64, 32, 1e-5),
    CASE("rope hd 64 heads 32", run_rope, DTYPE_F32, 4, 32, 64, 64, 1e-5),
    RCASE("rope interleaved hd 8", run_rope, check_rope, DTYPE_F32, 3, 8, 8, 8,
          ROPE_INTERLEAVED, 100, 1e-5),
    RCASE("rope half hd 8", run_rope, check_rope, DTYPE_F32, 3, 8, 8, 8, ROPE_HALF, 100, 1e-5),
    RCASE("rope interleaved hd 64 rot 32", run_rope, check_rope, DTYPE_F32, 5, 3, 64, 32,
          ROPE_INTERLEAVED, 100, 1e-5),
    RCASE("rope half hd 96 rot 24 af 1.19", run_rope, check_rope, DTYPE_F32, 2, 4, 96, 24,
          ROPE_HALF, 119, 1e-5),
    RCASE("rope half hd 128 64 rows", run_rope, check_rope, DTYPE_F32, 64, 8, 128, 128,
          ROPE_HALF, 100, 1e-5),
    RCASE("rope interleaved hd 128 rot 64 af 0.9", run_rope, check_rope, DTYPE_F32, 64, 8, 128,
          64, ROPE_INTERLEAVED, 90, 1e-5),
    /* swiglu: rows, width, row stride (1: gate and up the same values; above 2 width: a
     * padded fused row). */
    CASE("swiglu 4x8192", run_swiglu, DTYPE_F32, 4, 8192, 0, 0, 1e-5),
    RCASE("swiglu 1x1 stride 1", run_swiglu, check_swiglu, DTYPE_F32, 1, 1, 1, 0, 0, 0, 1e-5),
    RCASE("swiglu 3x37", run_swiglu, check_swiglu, DTYPE_F32, 3, 37, 74, 0, 0, 0, 1e-5),
    RCASE("swiglu 2x172 stride 200", run_swiglu, check_swiglu, DTYPE_F32, 2, 172, 200, 0, 0, 0,
          1e-5),
    RCASE("swiglu 70x1000", run_swiglu, check_swiglu, DTYPE_F32, 70, 1000, 2000, 0, 0, 0,
          1e-5),
    /* kv_write and attention as Llama 3.2 1B runs them: 32 heads of 64 over 8 KV heads,
     * sequences of 150 and 40 positions. */
    CASE("attention hd 64 gqa 4 ctx 150", run_attention, DTYPE_F32, 64, 8, 4, 150, 1e-4),
    /* Attention alone: head_dim, query heads, KV heads, longest context, sequences, and
     * whether every position is a row (a batched prompt) or each sequence's last one. */
    RCASE("attention hd 128 32/8 heads ctx 1500 decode", run_attn_shape, NULL, DTYPE_F32, 128,
          32, 8, 1500, 3, 0, 1e-4),
    RCASE("attention hd 128 8/8 heads ctx 2048 decode", run_attn_shape, NULL, DTYPE_F32, 128, 8,
          8, 2048, 5, 0, 1e-4),
    RCASE("attention hd 96 32/4 heads ctx 1100 decode", run_attn_shape, NULL, DTYPE_F32, 96, 32,
          4, 1100, 7, 0, 1e-4),
    RCASE("attention hd 64 32/2 heads ctx 1030 decode", run_attn_shape, NULL, DTYPE_F32, 64, 32,
          2, 1030, 1, 0, 1e-4),
    RCASE("attention hd 128 16/2 heads ctx 77 prompt", run_attn_shape, NULL, DTYPE_F32, 128, 16,
          2, 77, 3, 1, 1e-4),
    GPU_CASE6("attention hd 96 12/12 heads ctx 1025 prompt", run_attn_shape, 96, 12, 12, 1025,
              1, 1, 1e-4),
    /* Attention over a written history with the double-precision softmax on the reference
     * pairs: the cases of attn_refs (GQA, odd head sizes and pages, NaN in masked slots). */
    RCASE("attention ref 0: gqa 2, 3 seqs", run_attention_hist, check_attention_case,
          DTYPE_F32, 0, 0, 0, 0, 0, 0, 1e-4),
    RCASE("attention ref 1: mha hd 20 prefill", run_attention_hist, check_attention_case,
          DTYPE_F32, 1, 0, 0, 0, 0, 0, 1e-4),
    RCASE("attention ref 2: gqa 2 hd 64", run_attention_hist, check_attention_case, DTYPE_F32,
          2, 0, 0, 0, 0, 0, 1e-4),
    RCASE("attention ref 3: gqa 4 ctx 700", run_attention_hist, check_attention_case,
          DTYPE_F32, 3, 0, 0, 0, 0, 0, 1e-4),
    RCASE("attention ref 4: 1 kv head, 600 and 5", run_attention_hist, check_attention_case,
          DTYPE_F32, 4, 0, 0, 0, 0, 0, 1e-4),
    RCASE("attention ref 5: masked every 3rd", run_attention_hist, check_attention_case,
          DTYPE_F32, 5, 0, 0, 0, 0, 0, 1e-4),
    RCASE("attention ref 6: masked, ctx 700", run_attention_hist, check_attention_case,
          DTYPE_F32, 6, 0, 0, 0, 0, 0, 1e-4),
    RCASE("attention ref 7: masked whole pages", run_attention_hist, check_attention_case,
          DTYPE_F32, 7, 0, 0, 0, 0, 0, 1e-4),
    RCASE("attention ref 8: prefill tiles", run_attention_hist, check_attention_case,
          DTYPE_F32, 8, 0, 0, 0, 0, 0, 1e-4),
    RCASE("attention ref 9: two prompts and a decode", run_attention_hist,
          check_attention_case, DTYPE_F32, 9, 0, 0, 0, 0, 0, 1e-4),
    RCASE("attention ref 10: f16 tile ctx 600, rows alone", run_attention_hist,
          check_attention_case, DTYPE_F16, 10, 0, 0, 0, 0, 0, 1e-4),
    RCASE("attention ref 11: q8 tile ctx 530, rows alone", run_attention_hist,
          check_attention_case, DTYPE_Q8, 11, 0, 0, 0, 0, 0, 1e-4),
    RCASE("attention ref 12: bf16 1 kv head ctx 600", run_attention_hist,
          check_attention_case, DTYPE_BF16, 12, 0, 0, 0, 0, 0, 1e-4),
    /* cosine, gather, scatter: 6 rows of Llama 3.2 1B's width, and with the reference. */
    CASE("rows 6x2048", run_rows, DTYPE_F32, 6, 2048, 0, 0, 0),
    RCASE("rows 5x37", run_rows, check_rows, DTYPE_F32, 5, 37, 0, 0, 0, 0, 0),
    /* buffers: zero-filled, round trips, 64-byte aligned on the CPU */
    RCASE("buffers 1", run_buffers, check_buffers, DTYPE_F32, 1, 0, 0, 0, 0, 0, 0),
    RCASE("buffers 3", run_buffers, check_buffers, DTYPE_F32, 3, 0, 0, 0, 0, 0, 0),
    RCASE("buffers 1000", run_buffers, check_buffers, DTYPE_F32, 1000, 0, 0, 0, 0, 0, 0),
    RCASE("buffers 1M", run_buffers, check_buffers, DTYPE_F32, 1 << 20, 0, 0, 0, 0, 0, 0),
    RCASE("buffers 3000001", run_buffers, check_buffers, DTYPE_F32, 3000001, 0, 0, 0, 0, 0, 0),
};
#define N_CASES ((int)(sizeof cases / sizeof cases[0]))

/* The least tolerance of case c on SIMD pair p: the levels sum in other orders than the
 * scalar one, against Q4/Q8 weights they may take x as 8-bit blocks (the AVX2 decode path,
 * the Q8 and the Q4X8/Q8X8 kernels), and AVX512-BF16 takes x in bf16 against bf16 weights
 * (check_matmul holds both to their bounds), which stays under 2e-2 relative here. */
static double simd_floor(const bpair_t *p, const op_case_t *c)
{
    bool mm = c->run == run_matmul || c->run == run_matmul_multi;
    if (p->level >= 0 && mm &&
        (c->dt == DTYPE_Q4 || c->dt == DTYPE_Q8 || c->dt == DTYPE_Q4X8 ||
         c->dt == DTYPE_Q8X8))
        return 2e-2;
    /* x in bf16 (8 bits of mantissa) against bf16 weights. */
    if (p->level == CPU_SIMD_AVX512BF16 && mm &&
        (c->dt == DTYPE_BF16 || c->dt == DTYPE_BF16X8))
        return 2e-2;
    return 1e-4;
}

/* Case _i on every backend pair there is (the real model shapes on the GPU only): its run
 * on pairs 0-3, its check on the reference pairs. A case's setting (RIVER_Q4X8,
 * RIVER_ROWBLOCK) is made before any weight is placed: the CPU backend reads it once per
 * process, and Check runs each case in a child process of its own. */
START_TEST(test_op_case)
{
    const op_case_t *c = &cases[_i];
    if (c->env)
        ck_assert_int_eq(putenv((char *)c->env), 0);
    /* RIVER_TEST_PAIRS=cuda runs the CUDA pair alone: a lent GPU's minutes are few, and
     * every other pair runs in make test anyway. */
    const char *only = getenv("RIVER_TEST_PAIRS");
    bool cuda_only = only && strcmp(only, "cuda") == 0;
    for (int k = 0; k < N_PAIRS; k++) {
        bpair_t p;
        void (*fn)(bpair_t *, const op_case_t *) = k >= FIRST_REF_PAIR ? c->check : c->run;
        if (!fn || ((c->gpu_only || cuda_only) && k != 1) || !bpair_open(&p, k))
            continue;
        if (p.ref && p.level >= 0)
            p.floor = simd_floor(&p, c);
        test_rand_seed(TEST_RAND_SEED + (uint64_t)_i);
        fn(&p, c);
        bpair_close(&p);
    }
}
END_TEST

/* The one line that says the CUDA column is not run here. */
START_TEST(test_backends_present)
{
    bpair_t p;
    ck_assert(bpair_open(&p, 0));
    bpair_close(&p);
    for (int k = 2; k < FIRST_REF_PAIR; k++) {
        if (bpair_open(&p, k))
            bpair_close(&p);
        else
            TEST_SKIP(TEST_SKIP_NO_SIMD,
                      "no %s on this processor: its column of the op tests is skipped",
                      cpu_simd_name((cpu_simd_t)bpair_level(k)));
    }
    if (bpair_open(&p, 1)) {
        printf("op tests run on: opaque, cuda (%d cases)\n", N_CASES);
        bpair_close(&p);
    } else {
#ifdef RIVER_CUDA
        TEST_SKIP(TEST_SKIP_NO_GPU, "%s (no GPU)", CUDA_SKIP_LINE);
#else
        TEST_SKIP(TEST_SKIP_NO_CUDA, "%s (built without the CUDA backend)", CUDA_SKIP_LINE);
#endif
    }
}
END_TEST

static Suite *backend_ops_suite(void)
{
    Suite *s = suite_create("backend_ops");
    TCase *tc = tcase_create("ops");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_backends_present);
    tcase_add_loop_test(tc, test_op_case, 0, N_CASES);
    suite_add_tcase(s, tc);
    return s;
}

RIVER_TEST_MAIN(backend_ops_suite)
