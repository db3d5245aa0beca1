/* RTN and HQQ weight quantization (see quant.h), with the portable kernel. The AVX-512 and
 * AVX2 kernels are in quant_avx512.c and quant_avx2.c; quant_internal.h holds what they
 * share. */
#include "engine/quant.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "engine/quant_internal.h"
#include "kernels/cpu/cpu.h"
#include "kernels/half.h"

/* Elements one task quantizes: a few rows, about 256 KB of float32, so that a row's
 * converted values stay in cache through all of its groups' iterations. */
#define QUANT_TASK_ELEMS (64 * 1024)

const char *quant_method_name(quant_method_t m)
{
    switch (m) {
    case QUANT_RTN:
        return "rtn";
    case QUANT_HQQ:
        return "hqq";
    case QUANT_METHOD_COUNT:
        break;
    }
    return "unknown";
}

int quant_method_parse(const char *s, quant_method_t *out)
{
    for (int m = 0; m < QUANT_METHOD_COUNT; m++)
        if (!strcmp(s, quant_method_name((quant_method_t)m))) {
            *out = (quant_method_t)m;
            return 0;
        }
    return -1;
}

quant_params_t quant_params_default(void)
{
    return (quant_params_t){
        .bits = 4,
        .group = 64,
        .method = QUANT_HQQ,
        .hqq_p = 0.7f,
        .hqq_beta = 10.0f,
        .hqq_kappa = 1.01f,
        .hqq_iters = 20,
        .portable = 0,
    };
}

int quant_params_check(const quant_params_t *p, int64_t cols, const char *what)
{
    if (p->bits != 4 && p->bits != 8)
        return river_err_set(RIVER_EINVAL, "%s: %d bits; only 4 and 8 are supported", what,
                             p->bits);
    if (p->group <= 0)
        return river_err_set(RIVER_EINVAL, "%s: group size %d must be positive", what,
                             p->group);
    if ((unsigned)p->method >= QUANT_METHOD_COUNT)
        return river_err_set(RIVER_EINVAL, "%s: unknown quantization method %d", what,
                             (int)p->method);
    if (p->method == QUANT_HQQ &&
        (!(p->hqq_p > 0 && p->hqq_p < 1) || !(p->hqq_beta > 0) || !(p->hqq_kappa >= 1) ||
         !isfinite(p->hqq_beta) || !isfinite(p->hqq_kappa) || p->hqq_iters < 1 ||
         p->hqq_iters > 1000))
        return river_err_set(RIVER_EINVAL, "%s: HQQ needs 0 < p < 1, beta > 0, kappa >= 1 "
                             "and 1..1000 iterations (got p %g, beta %g, kappa %g, %d)",
                             what, (double)p->hqq_p, (double)p->hqq_beta,
                             (double)p->hqq_kappa, p->hqq_iters);
    if (cols > 0 && cols % p->group != 0)
        return river_err_set(RIVER_ESHAPE, "%s: %lld columns are not a multiple of the group "
                             "size %d", what, (long long)cols, p->group);
    return 0;
}

/* ---- statistics ---- */

void quant_stats_add(quant_stats_t *into, const quant_stats_t *s)
{
    into->n += s->n;
    into->groups += s->groups;
    into->iters += s->iters;
    into->abs_err += s->abs_err;
    into->sq_err += s->sq_err;
    into->sq_ref += s->sq_ref;
    into->rtn_abs_err += s->rtn_abs_err;
    into->rtn_sq_err += s->rtn_sq_err;
}

double quant_stats_mae(const quant_stats_t *s)
{
    return s->n ? s->abs_err / (double)s->n : 0;
}

double quant_stats_rel_fro(const quant_stats_t *s)
{
    return s->sq_ref > 0 ? sqrt(s->sq_err / s->sq_ref) : 0;
}

double quant_stats_rtn_mae(const quant_stats_t *s)
{
    return s->n ? s->rtn_abs_err / (double)s->n : 0;
}

double quant_stats_rtn_rel_fro(const quant_stats_t *s)
{
    return s->sq_ref > 0 ? sqrt(s->rtn_sq_err / s->sq_ref) : 0;
}

/* ---- quantized matrices ---- */

static size_t quant_code_bytes(int bits, int64_t rows, int64_t cols)
{
    return (size_t)rows * dtype_row_bytes(bits == 4 ? DTYPE_Q4 : DTYPE_Q8, cols);
}

int quant_matrix_new(quant_matrix_t **out, int64_t rows, int64_t cols, int bits, int group)
{
    /* The bound keeps every size product far inside size_t and int64. */
    if (rows <= 0 || cols <= 0 || rows > (INT64_C(1) << 31) || cols > (INT64_C(1) << 31))
        return river_err_set(RIVER_ESHAPE, "quant: matrix of %lld x %lld", (long long)rows,
                             (long long)cols);
    if ((bits != 4 && bits != 8) || group <= 0 || cols % group != 0)
        return river_err_set(RIVER_EINVAL, "quant: %d bits, group %d for %lld columns", bits,
                             group, (long long)cols);
    quant_matrix_t *q = calloc(1, sizeof *q);
    if (!q)
        return river_err_set(RIVER_ENOMEM, "quant: matrix");
    *q = (quant_matrix_t){.bits = bits, .group = group, .rows = rows, .cols = cols};
    size_t ng = (size_t)rows * (size_t)(cols / group);
    q->codes = malloc(quant_code_bytes(bits, rows, cols));
    q->scales = malloc(ng * sizeof *q->scales);
    q->zeros = malloc(ng * sizeof *q->zeros);
    if (!q->codes || !q->scales || !q->zeros) {
        quant_matrix_destroy(&q);
        return river_err_set(RIVER_ENOMEM, "quant: %lld x %lld matrix", (long long)rows,
                             (long long)cols);
    }
    *out = q;
    return 0;
}

void quant_matrix_destroy(quant_matrix_t **pq)
{
    quant_matrix_t *q = *pq;
    if (!q)
        return;
    free(q->codes);
    free(q->scales);
    free(q->zeros);
    free(q);
    *pq = NULL;
}

size_t quant_matrix_code_bytes(const quant_matrix_t *q)
{
    return quant_code_bytes(q->bits, q->rows, q->cols);
}

size_t quant_matrix_group_count(const quant_matrix_t *q)
{
    return (size_t)q->rows * (size_t)(q->cols / q->group);
}

weight_t quant_matrix_weight(const quant_matrix_t *q)
{
    return (weight_t){
        .dtype = q->bits == 4 ? DTYPE_Q4 : DTYPE_Q8,
        .rows = q->rows,
        .cols = q->cols,
        .data = q->codes,
        .scales = q->scales,
        .zeros = q->zeros,
        .group = q->group,
    };
}

/* ---- the portable kernel ---- */

/* |x|^e for x >= 1e-8, as described in quant_internal.h; the AVX-512 kernel does the same
 * operations lane by lane. */
static inline float quant_pow(float x, float e)
{
    uint32_t b = half_f32_bits(x);
    int32_t ex = (int32_t)(b >> 23) - 127;
    float m = half_bits_f32((b & 0x007fffffu) | 0x3f800000u) - 1.0f;
    float lg = (((QUANT_LOG2_C4 * m + QUANT_LOG2_C3) * m + QUANT_LOG2_C2) * m + QUANT_LOG2_C1) * m;
    float y = e * ((float)ex + lg);
    y = fminf(fmaxf(y, -126.0f), 126.0f);
    int32_t yi = (int32_t)y;
    if ((float)yi > y)
        yi--;
    float f = y - (float)yi;
    float p = (((QUANT_EXP2_D4 * f + QUANT_EXP2_D3) * f + QUANT_EXP2_D2) * f + QUANT_EXP2_D1) * f +
              1.0f;
    return half_bits_f32(half_f32_bits(p) + (uint32_t)((uint32_t)yi << 23));
}

/* The code of value x: clamp(round(x * s + z), 0, qmax). Clamping to [-1, qmax + 1] first
 * keeps the magic-number rounding in its exact range without changing the result. */
static inline float quant_code(float x, const quant_gp_t *gp)
{
    float t = x * gp->inv + gp->zero;
    t = fminf(fmaxf(t, -1.0f), gp->qmax + 1.0f);
    float r = (t + QUANT_ROUND_MAGIC) - QUANT_ROUND_MAGIC;
    return fminf(fmaxf(r, 0.0f), gp->qmax);
}

static void scalar_iter(const float *w, int g, const quant_gp_t *gp, quant_sums_t *out)
{
    float sa[QUANT_LANES] = {0}, ss[QUANT_LANES] = {0}, sz[QUANT_LANES] = {0};
    for (int k = 0; k < g; k++) {
        float x = w[k];
        float q = quant_code(x, gp);
        float d = x - (q - gp->zero) * gp->scale;
        float a = fabsf(d);
        float pw = quant_pow(a + QUANT_POW_EPS, gp->expo);
        float m = fmaxf(a - pw * gp->ibeta, 0.0f);
        float we = copysignf(m, d);
        int l = k % QUANT_LANES;
        sa[l] += a;
        ss[l] += d * d;
        sz[l] += q - (x - we) * gp->inv;
    }
    out->abs = quant_lane_reduce(sa);
    out->sq = quant_lane_reduce(ss);
    out->zsum = quant_lane_reduce(sz);
}

static void scalar_final(const float *w, int g, const quant_gp_t *gp, uint8_t *qout,
                         quant_sums_t *out)
{
    float sa[QUANT_LANES] = {0}, ss[QUANT_LANES] = {0}, sr[QUANT_LANES] = {0};
    for (int k = 0; k < g; k++) {
        float x = w[k];
        float q = quant_code(x, gp);
        float d = x - (q - gp->zero) * gp->scale;
        int l = k % QUANT_LANES;
        sa[l] += fabsf(d);
        ss[l] += d * d;
        sr[l] += x * x;
        qout[k] = (uint8_t)q;
    }
    out->abs = quant_lane_reduce(sa);
    out->sq = quant_lane_reduce(ss);
    out->zsum = quant_lane_reduce(sr);
}

int quant_groups_scalar(const quant_job_t *j, const float *w, int64_t n_groups,
                               uint8_t *q, uint16_t *scales, uint16_t *zeros,
                               quant_stats_t *st)
{
    int g = j->group;
    for (int64_t i = 0; i < n_groups; i++) {
        const float *wg = w + i * g;
        float lo = wg[0], hi = wg[0];
        for (int k = 1; k < g; k++) {
            lo = fminf(lo, wg[k]);
            hi = fmaxf(hi, wg[k]);
        }
        if (quant_group_run(j, wg, lo, hi, q + i * g, &scales[i], &zeros[i], st, scalar_iter,
                            scalar_final) != 0)
            return (int)(-1 - i);
    }
    return 0;
}

/* ---- one matrix ---- */

typedef struct quant_task_ctx {
    const weight_t *w;
    quant_matrix_t *out;
    quant_job_t job;
    cpu_simd_t level; /* the kernel: scalar (portable), AVX2 or AVX-512 */
    int64_t rows_per_task;
    float **row_f32;        /* (threads) cols floats each */
    uint8_t **row_codes;    /* (threads) cols bytes each */
    quant_stats_t *stats;   /* (tasks) */
    int *err;               /* (tasks) 0, or a river_err code */
    int64_t *bad_row;       /* (tasks) where err happened */
    int64_t *bad_col;
} quant_task_ctx_t;

/* Converts row r of a float weight to float32; returns the first non-finite column or -1. */
static int64_t quant_load_row(const weight_t *w, int64_t r, float *dst)
{
    int64_t cols = w->cols;
    const uint8_t *row = (const uint8_t *)w->data + (size_t)r * dtype_row_bytes(w->dtype, cols);
    switch (w->dtype) {
    case DTYPE_F32:
        memcpy(dst, row, (size_t)cols * sizeof *dst);
        break;
    case DTYPE_F16:
        for (int64_t k = 0; k < cols; k++) {
            uint16_t h;
            memcpy(&h, row + 2 * k, sizeof h);
            dst[k] = f16_to_f32(h);
        }
        break;
    case DTYPE_BF16:
        for (int64_t k = 0; k < cols; k++) {
            uint16_t h;
            memcpy(&h, row + 2 * k, sizeof h);
            dst[k] = bf16_to_f32(h);
        }
        break;
    default:
        return 0;
    }
    /* An infinity or NaN has an all-ones exponent; testing the bits vectorises. */
    uint32_t bad = 0;
    for (int64_t k = 0; k < cols; k++) {
        uint32_t u = half_f32_bits(dst[k]);
        bad |= (uint32_t)((u & 0x7f800000u) == 0x7f800000u);
    }
    if (!bad)
        return -1;
    for (int64_t k = 0; k < cols; k++)
        if (!isfinite(dst[k]))
            return k;
    return -1;
}

static void quant_task(void *arg, int task, int thread)
{
    quant_task_ctx_t *c = arg;
    quant_matrix_t *out = c->out;
    int64_t cols = out->cols, ng = cols / out->group;
    int64_t r0 = (int64_t)task * c->rows_per_task;
    int64_t r1 = r0 + c->rows_per_task < out->rows ? r0 + c->rows_per_task : out->rows;
    float *x = c->row_f32[thread];
    uint8_t *codes = c->row_codes[thread];
    size_t row_bytes = dtype_row_bytes(out->bits == 4 ? DTYPE_Q4 : DTYPE_Q8, cols);
    quant_stats_t *st = &c->stats[task];
    for (int64_t r = r0; r < r1; r++) {
        int64_t bad = quant_load_row(c->w, r, x);
        if (bad >= 0) {
            c->err[task] = RIVER_ERANGE;
            c->bad_row[task] = r;
            c->bad_col[task] = bad;
            return;
        }
        uint16_t *sc = out->scales + r * ng, *ze = out->zeros + r * ng;
        int rc = c->level == CPU_SIMD_AVX512 ? quant_groups_avx512(&c->job, x, ng, codes, sc, ze, st)
                 : c->level == CPU_SIMD_AVX2 ? quant_groups_avx2(&c->job, x, ng, codes, sc, ze, st)
                                             : quant_groups_scalar(&c->job, x, ng, codes, sc, ze, st);
        if (rc != 0) {
            c->err[task] = RIVER_ERANGE;
            c->bad_row[task] = r;
            c->bad_col[task] = (int64_t)(-1 - rc) * out->group;
            return;
        }
        uint8_t *dst = out->codes + (size_t)r * row_bytes;
        if (out->bits == 8) {
            memcpy(dst, codes, (size_t)cols);
        } else {
            for (int64_t k = 0; k + 1 < cols; k += 2)
                dst[k / 2] = (uint8_t)(codes[k] | (codes[k + 1] << 4));
            if (cols & 1)
                dst[cols / 2] = codes[cols - 1];
        }
    }
}

int quant_weight(quant_matrix_t *out, const weight_t *w, const quant_params_t *p,
                 threadpool_t *pool, quant_stats_t *stats)
{
    int err = quant_params_check(p, w->cols, "quant");
    if (err)
        return err;
    if (w->dtype != DTYPE_F32 && w->dtype != DTYPE_F16 && w->dtype != DTYPE_BF16)
        return river_err_set(RIVER_EDTYPE, "quant: source weights are %s; expected F32, F16 "
                             "or BF16", dtype_name(w->dtype));
    if (!w->data || w->rows <= 0 || w->cols <= 0 || w->rows != out->rows ||
        w->cols != out->cols)
        return river_err_set(RIVER_ESHAPE, "quant: source %lld x %lld, output %lld x %lld",
                             (long long)w->rows, (long long)w->cols, (long long)out->rows,
                             (long long)out->cols);
    if (out->bits != p->bits || out->group != p->group)
        return river_err_set(RIVER_EINVAL, "quant: output holds %d bits in groups of %d, "
                             "parameters ask for %d and %d", out->bits, out->group, p->bits,
                             p->group);
    int n_threads = pool ? threadpool_threads(pool) : 1;
    int64_t rpt = QUANT_TASK_ELEMS / w->cols;
    if (rpt < 1)
        rpt = 1;
    int64_t n_tasks64 = (w->rows + rpt - 1) / rpt;
    if (n_tasks64 > (1 << 30))
        return river_err_set(RIVER_ESHAPE, "quant: %lld rows", (long long)w->rows);
    int n_tasks = (int)n_tasks64;

    /* The fast kernels run at the level the CPU backend would (RIVER_SIMD honoured). */
    cpu_simd_t level = CPU_SIMD_SCALAR;
    if (!p->portable) {
        err = cpu_simd_selected(&level);
        if (err)
            return err;
    }
    quant_task_ctx_t c = {
        .w = w,
        .out = out,
        .job = {.group = p->group,
                .qmax = (1 << p->bits) - 1,
                .hqq = p->method == QUANT_HQQ,
                .iters = p->hqq_iters,
                .beta = p->hqq_beta,
                .kappa = p->hqq_kappa,
                .expo = p->hqq_p - 1.0f},
        .level = p->group % QUANT_LANES == 0 ? level : CPU_SIMD_SCALAR,
        .rows_per_task = rpt,
    };
    c.row_f32 = calloc((size_t)n_threads, sizeof *c.row_f32);
    c.row_codes = calloc((size_t)n_threads, sizeof *c.row_codes);
    c.stats = calloc((size_t)n_tasks, sizeof *c.stats);
    c.err = calloc((size_t)n_tasks, sizeof *c.err);
    c.bad_row = calloc((size_t)n_tasks, sizeof *c.bad_row);
    c.bad_col = calloc((size_t)n_tasks, sizeof *c.bad_col);
    if (!c.row_f32 || !c.row_codes || !c.stats || !c.err || !c.bad_row || !c.bad_col) {
        err = river_err_set(RIVER_ENOMEM, "quant: task state");
        goto out;
    }
    for (int t = 0; t < n_threads; t++) {
        c.row_f32[t] = malloc((size_t)w->cols * sizeof(float));
        c.row_codes[t] = malloc((size_t)w->cols);
        if (!c.row_f32[t] || !c.row_codes[t]) {
            err = river_err_set(RIVER_ENOMEM, "quant: row buffers");
            goto out;
        }
    }
    if (pool)
        threadpool_run(pool, quant_task, &c, n_tasks);
    else
        for (int t = 0; t < n_tasks; t++)
            quant_task(&c, t, 0);

    /* Tasks are summed in their own order, so the statistics do not depend on which thread
     * ran what; the first failing task (lowest rows) names the error. */
    quant_stats_t total = {0};
    for (int t = 0; t < n_tasks; t++) {
        if (c.err[t]) {
            err = river_err_set(c.err[t], "quant: weight at row %lld, column %lld is not "
                                "finite, or its group's range does not fit an fp16 scale",
                                (long long)c.bad_row[t], (long long)c.bad_col[t]);
            goto out;
        }
        quant_stats_add(&total, &c.stats[t]);
    }
    if (stats)
        *stats = total;
out:
    if (c.row_f32)
        for (int t = 0; t < n_threads; t++)
            free(c.row_f32[t]);
    if (c.row_codes)
        for (int t = 0; t < n_threads; t++)
            free(c.row_codes[t]);
    free(c.row_f32);
    free(c.row_codes);
    free(c.stats);
    free(c.err);
    free(c.bad_row);
    free(c.bad_col);
    return err;
}

/* ---- reading weights back ---- */

int quant_row_f32(const weight_t *w, int64_t row, float *out)
{
    if (!w->data || row < 0 || row >= w->rows || w->cols <= 0)
        return river_err_set(RIVER_EINVAL, "quant: row %lld of a %lld x %lld weight",
                             (long long)row, (long long)w->rows, (long long)w->cols);
    int64_t cols = w->cols;
    const uint8_t *r = (const uint8_t *)w->data + (size_t)row * dtype_row_bytes(w->dtype, cols);
    switch (w->dtype) {
    case DTYPE_F32:
    case DTYPE_F16:
    case DTYPE_BF16:
        quant_load_row(w, row, out);
        return 0;
    case DTYPE_Q4:
    case DTYPE_Q8: {
        if (w->group <= 0 || cols % w->group != 0 || !w->scales || !w->zeros)
            return river_err_set(RIVER_EINVAL, "quant: quantized weight without valid "
                                 "groups (group %d, %lld columns)", w->group, (long long)cols);
        int64_t ng = cols / w->group;
        for (int64_t g = 0; g < ng; g++) {
            float s = f16_to_f32(w->scales[row * ng + g]);
            float z = f16_to_f32(w->zeros[row * ng + g]);
            for (int64_t k = g * w->group; k < (g + 1) * w->group; k++) {
                unsigned q = w->dtype == DTYPE_Q8 ? r[k]
                             : (k & 1)            ? (unsigned)(r[k >> 1] >> 4)
                                                  : (unsigned)(r[k >> 1] & 0x0f);
                out[k] = ((float)q - z) * s;
            }
        }
        return 0;
    }
    case DTYPE_Q4X8: /* the CPU backend's own layout: placed weights are read by the ops */
    case DTYPE_COUNT:
        break;
    }
    return river_err_set(RIVER_EDTYPE, "quant: cannot read %s weights", dtype_name(w->dtype));
}

int quant_error(const weight_t *ref, const weight_t *q, double p, quant_error_t *out)
{
    if (ref->rows != q->rows || ref->cols != q->cols || ref->rows <= 0 || ref->cols <= 0)
        return river_err_set(RIVER_ESHAPE, "quant: comparing %lld x %lld with %lld x %lld",
                             (long long)ref->rows, (long long)ref->cols, (long long)q->rows,
                             (long long)q->cols);
    float *a = malloc((size_t)ref->cols * sizeof *a);
    float *b = malloc((size_t)ref->cols * sizeof *b);
    if (!a || !b) {
        free(a);
        free(b);
        return river_err_set(RIVER_ENOMEM, "quant: error rows");
    }
    double sa = 0, sq = 0, sr = 0, sp = 0, mx = 0;
    int err = 0;
    for (int64_t r = 0; r < ref->rows && !err; r++) {
        if ((err = quant_row_f32(ref, r, a)) || (err = quant_row_f32(q, r, b)))
            break;
        for (int64_t k = 0; k < ref->cols; k++) {
            double d = fabs((double)a[k] - (double)b[k]);
            sa += d;
            sq += d * d;
            sr += (double)a[k] * (double)a[k];
            sp += pow(d, p);
            if (d > mx)
                mx = d;
        }
    }
    free(a);
    free(b);
    if (err)
        return err;
    double n = (double)ref->rows * (double)ref->cols;
    *out = (quant_error_t){
        .mae = sa / n,
        .rel_fro = sr > 0 ? sqrt(sq / sr) : 0,
        .lp = sp / n,
        .max_abs = mx,
    };
    return 0;
}
