/* RTN and HQQ weight quantization of whole matrices (see quant.h), over the group kernels
 * of kernels/cpu/quant_groups.h, and reading weights back for error measurements. */
#include "offline/quant.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/quant_groups.h"
#include "kernels/half.h"

/* Elements one task quantizes: a few rows, about 256 KB of float32, so that a row's
 * converted values stay in cache through all of its groups' iterations. */
#define QUANT_TASK_ELEMS (64 * 1024)

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
    return (size_t)rows * dtype_row_bytes(dtype_quant_of_bits(bits), cols);
}

int quant_matrix_new(quant_matrix_t **out, int64_t rows, int64_t cols, int bits, int group)
{
    /* The bound keeps every size product far inside size_t and int64. */
    if (rows <= 0 || cols <= 0 || rows > (INT64_C(1) << 31) || cols > (INT64_C(1) << 31))
        return river_err_set(RIVER_ESHAPE, "quant: matrix of %lld x %lld", (long long)rows,
                             (long long)cols);
    quant_params_t p = quant_params_default();
    p.bits = bits;
    p.group = group;
    int err = quant_params_check(&p, 0, "quant");
    if (err)
        return err;
    if (cols % group != 0)
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
        .dtype = dtype_quant_of_bits(q->bits),
        .rows = q->rows,
        .cols = q->cols,
        .data = q->codes,
        .scales = q->scales,
        .zeros = q->zeros,
        .group = q->group,
    };
}

/* ---- one matrix ---- */

typedef struct quant_task_ctx {
    const weight_t *w;
    quant_matrix_t *out;
    quant_job_t job;
    cpu_simd_t level; /* the kernel: scalar (portable), AVX2 or AVX-512 */
    int sym;          /* 1: the symmetric grid (QUANT_SYM), one portable loop */
    int64_t rows_per_task;
    float **row_f32;        /* (threads) cols floats each */
    uint8_t **row_codes;    /* (threads) cols bytes each */
    quant_stats_t *stats;   /* (tasks) */
    int *err;               /* (tasks) 0, or a river_err code */
    int64_t *bad_row;       /* (tasks) where err happened */
    int64_t *bad_col;
} quant_task_ctx_t;

/* Row r of a Q4/Q8 weight, dequantized as the CPU kernels do: (code - zero) * scale. */
static void quant_dequant_row(const weight_t *w, int64_t r, float *dst)
{
    int64_t cols = w->cols, ng = cols / w->group;
    const uint8_t *row = (const uint8_t *)w->data + (size_t)r * dtype_row_bytes(w->dtype, cols);
    for (int64_t g = 0; g < ng; g++) {
        float s = f16_to_f32(w->scales[r * ng + g]);
        float z = f16_to_f32(w->zeros[r * ng + g]);
        for (int64_t k = g * w->group; k < (g + 1) * w->group; k++) {
            unsigned q;
            if (w->dtype == DTYPE_Q8)
                q = row[k];
            else if (w->dtype == DTYPE_Q4)
                q = (k & 1) ? (unsigned)(row[k >> 1] >> 4) : (unsigned)(row[k >> 1] & 0x0f);
            else /* the planes of docs/FORMATS.md, read here from their definition */
                q = ((unsigned)(row[k >> 2] >> (2 * (k & 3))) & 3u) |
                    (w->dtype == DTYPE_Q3
                         ? (((unsigned)(row[(cols + 3) / 4 + (k >> 3)] >> (k & 7)) & 1u) << 2)
                         : 0u);
            dst[k] = ((float)q - z) * s;
        }
    }
}

/* Converts row r of a weight (F32, F16, BF16, or Q2/Q3/Q4/Q8 dequantized) to float32; returns the
 * first non-finite column or -1. */
static int64_t quant_load_row(const weight_t *w, int64_t r, float *dst)
{
    int64_t cols = w->cols;
    const uint8_t *row = (const uint8_t *)w->data + (size_t)r * dtype_row_bytes(w->dtype, cols);
    switch (w->dtype) {
    case DTYPE_Q2:
    case DTYPE_Q3:
    case DTYPE_Q4:
    case DTYPE_Q8:
        quant_dequant_row(w, r, dst);
        break;
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

/* Symmetric quantization of n_groups groups of x: scale = max|x| / (2^(b-1) - 1) rounded to
 * fp16, zero = 2^(b-1) exactly, code = clamp(round(x / scale) + zero, 0, 2^b - 1), ties
 * to even (as llama.cpp's SIMD Q8_0 quantizer; its reference one rounds ties away from
 * zero), the scale taken after its fp16 rounding so that the stored codes are the measured
 * ones. The error sums go to st (the RTN sums too: this is
 * round-to-nearest, on a symmetric grid). Returns 0, or -1 - (index of the first group whose
 * scale does not fit fp16). */
static int quant_sym_groups(const quant_job_t *j, const float *x, int64_t n_groups,
                            uint8_t *q, uint16_t *scales, uint16_t *zeros, quant_stats_t *st)
{
    int half = (j->qmax + 1) / 2;
    float zero = (float)half, qmax = (float)j->qmax;
    uint16_t zero16 = f32_to_f16(zero);
    /* Adding and taking away 1.5 * 2^23 rounds a float below 2^22 in magnitude to the
     * nearest integer, ties to even (the FPU's default mode), in plain arithmetic that the
     * compiler vectorises; |v / scale| is at most about 2^(b-1) here. */
    const float magic = 12582912.0f;
    double ae = 0, se = 0, sr = 0;
    for (int64_t g = 0; g < n_groups; g++) {
        const float *v = x + g * j->group;
        uint8_t *qg = q + g * j->group;
        float amax = 0;
        for (int k = 0; k < j->group; k++) {
            float a = fabsf(v[k]);
            amax = a > amax ? a : amax;
        }
        uint16_t d16 = f32_to_f16(amax / (float)(half - 1));
        float s = f16_to_f32(d16);
        if (!isfinite(s))
            return (int)(-1 - g);
        float inv = s > 0 ? 1.0f / s : 0.0f;
        /* A group's sums in float (a group is short), the matrix's in double. */
        float gae = 0, gse = 0, gsr = 0;
        for (int k = 0; k < j->group; k++) {
            float c = ((v[k] * inv + magic) - magic) + zero;
            c = c < 0 ? 0 : c > qmax ? qmax : c;
            qg[k] = (uint8_t)c;
            float err = v[k] - (c - zero) * s;
            gae += fabsf(err);
            gse += err * err;
            gsr += v[k] * v[k];
        }
        ae += gae;
        se += gse;
        sr += gsr;
        scales[g] = d16;
        zeros[g] = zero16;
    }
    st->n += n_groups * j->group;
    st->groups += n_groups;
    st->abs_err += ae;
    st->sq_err += se;
    st->sq_ref += sr;
    st->rtn_abs_err += ae;
    st->rtn_sq_err += se;
    return 0;
}

/* Packs one row of codes (one a byte) into the layout of dt (kernels/ops.h,
 * docs/FORMATS.md). */
static void quant_pack_row(dtype_t dt, uint8_t *dst, const uint8_t *codes, int64_t cols)
{
    switch (dt) {
    case DTYPE_Q8:
        memcpy(dst, codes, (size_t)cols);
        return;
    case DTYPE_Q4:
        for (int64_t k = 0; k + 1 < cols; k += 2)
            dst[k / 2] = (uint8_t)(codes[k] | (codes[k + 1] << 4));
        if (cols & 1)
            dst[cols / 2] = codes[cols - 1];
        return;
    case DTYPE_Q2:
    case DTYPE_Q3: {
        /* The low two bits of every code four to a byte; for Q3 bit 2 after them, eight to
         * a byte. */
        memset(dst, 0, dtype_row_bytes(dt, cols));
        uint8_t *hi = dst + (cols + 3) / 4;
        for (int64_t k = 0; k < cols; k++) {
            dst[k >> 2] |= (uint8_t)((codes[k] & 3u) << (2 * (k & 3)));
            if (dt == DTYPE_Q3)
                hi[k >> 3] |= (uint8_t)(((codes[k] >> 2) & 1u) << (k & 7));
        }
        return;
    }
    default:
        return;
    }
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
    dtype_t dt = dtype_quant_of_bits(out->bits);
    size_t row_bytes = dtype_row_bytes(dt, cols);
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
        int rc = c->sym ? quant_sym_groups(&c->job, x, ng, codes, sc, ze, st)
                        : quant_groups(c->level, &c->job, x, ng, codes, sc, ze, st);
        if (rc != 0) {
            c->err[task] = RIVER_ERANGE;
            c->bad_row[task] = r;
            c->bad_col[task] = (int64_t)(-1 - rc) * out->group;
            return;
        }
        quant_pack_row(dt, out->codes + (size_t)r * row_bytes, codes, cols);
    }
}

int quant_weight(quant_matrix_t *out, const weight_t *w, const quant_params_t *p,
                 threadpool_t *pool, quant_stats_t *stats)
{
    int err = quant_params_check(p, w->cols, "quant");
    if (err)
        return err;
    if (w->dtype != DTYPE_F32 && w->dtype != DTYPE_F16 && w->dtype != DTYPE_BF16 &&
        w->dtype != DTYPE_Q4 && w->dtype != DTYPE_Q8)
        return river_err_set(RIVER_EDTYPE, "quant: source weights are %s; expected F32, F16, "
                             "BF16, Q4 or Q8", dtype_name(w->dtype));
    if ((w->dtype == DTYPE_Q4 || w->dtype == DTYPE_Q8) &&
        (w->group <= 0 || w->cols % w->group != 0 || !w->scales || !w->zeros))
        return river_err_set(RIVER_EFORMAT, "quant: %s source without valid groups (group %d, "
                             "%lld columns)", dtype_name(w->dtype), w->group, (long long)w->cols);
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
        .sym = p->method == QUANT_SYM,
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
    switch (w->dtype) {
    case DTYPE_F32:
    case DTYPE_F16:
    case DTYPE_BF16:
        quant_load_row(w, row, out);
        return 0;
    case DTYPE_Q2:
    case DTYPE_Q3:
    case DTYPE_Q4:
    case DTYPE_Q8: {
        if (w->group <= 0 || cols % w->group != 0 || !w->scales || !w->zeros)
            return river_err_set(RIVER_EINVAL, "quant: quantized weight without valid "
                                 "groups (group %d, %lld columns)", w->group, (long long)cols);
        quant_dequant_row(w, row, out);
        return 0;
    }
    case DTYPE_Q4X8: /* the CPU backends' own layouts: placed weights are read by the ops */
    case DTYPE_Q8X8:
    case DTYPE_BF16X8:
    case DTYPE_F16X8:
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
