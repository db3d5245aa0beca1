/* The portable kernels: plain C loops, compiled for baseline x86-64. They are the fallback
 * on processors without AVX2 and serve the SIMD levels for the layouts those do not
 * vectorise. */
#include <math.h>
#include <string.h>

#include "kernels/cpu/lowbit.h"
#include "kernels/cpu/q4x8.h"
#include "kernels/cpu/rowblock.h"
#include "kernels/cpu/peak_rounds.h"
#include "kernels/cpu/simd.h"
#include "kernels/half.h"
#include "kernels/kv_row.h"

/* Element k of row r of a row-blocked weight (rowblock.h), as f32. */
static inline float scalar_rowblock(const weight_t *w, size_t rb, int64_t r, int64_t k)
{
    uint16_t h;
    memcpy(&h, cpu_rowblock_at(w->data, rb, r, (size_t)k * sizeof h), sizeof h);
    return w->dtype == DTYPE_BF16X8 ? bf16_to_f32(h) : f16_to_f32(h);
}

/* One weight value of a grouped row: code k of a row of `cols` codes starting at q. */
static inline unsigned scalar_code(dtype_t dt, const uint8_t *q, int64_t cols, int64_t k)
{
    if (dt == DTYPE_Q2 || dt == DTYPE_Q3)
        return cpu_lowbit_code(dt, q, cols, k);
    if (dt == DTYPE_Q8)
        return q[k];
    if (dt == DTYPE_Q8X8)
        return q[cpu_q8x8_byte(k)];
    if (dt == DTYPE_Q4X8) {
        int high;
        uint8_t b = q[cpu_q4x8_byte(k, &high)];
        return high ? (unsigned)(b >> 4) : (unsigned)(b & 0x0f);
    }
    uint8_t b = q[k >> 1];
    return (k & 1) ? (unsigned)(b >> 4) : (unsigned)(b & 0x0f);
}

void cpu_scalar_rows_to_f32(float *dst, const weight_t *w, int64_t r0, int64_t r1)
{
    int64_t cols = w->cols;
    size_t rb = dtype_row_bytes(w->dtype, cols);
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *row = (const uint8_t *)w->data + (size_t)r * rb;
        float *d = dst + (r - r0) * cols;
        switch (w->dtype) {
        case DTYPE_F32:
            memcpy(d, row, (size_t)cols * sizeof(float));
            break;
        case DTYPE_F16: {
            const uint16_t *h = (const uint16_t *)row;
            for (int64_t k = 0; k < cols; k++)
                d[k] = f16_to_f32(h[k]);
            break;
        }
        case DTYPE_BF16: {
            const uint16_t *h = (const uint16_t *)row;
            for (int64_t k = 0; k < cols; k++)
                d[k] = bf16_to_f32(h[k]);
            break;
        }
        case DTYPE_BF16X8:
        case DTYPE_F16X8:
            for (int64_t k = 0; k < cols; k++)
                d[k] = scalar_rowblock(w, rb, r, k);
            break;
        case DTYPE_Q2:
        case DTYPE_Q3:
        case DTYPE_Q4:
        case DTYPE_Q8:
        case DTYPE_Q4X8:
        case DTYPE_Q8X8: {
            int64_t ng = cols / w->group;
            const uint16_t *sc = w->scales + r * ng;
            const uint16_t *ze = w->zeros + r * ng;
            for (int64_t g = 0; g < ng; g++) {
                float s = f16_to_f32(sc[g]), z = f16_to_f32(ze[g]);
                for (int64_t k = g * w->group; k < (g + 1) * w->group; k++)
                    d[k] = ((float)scalar_code(w->dtype, row, cols, k) - z) * s;
            }
            break;
        }
        case DTYPE_COUNT:
            break;
        }
    }
}

/* Rows are converted into a small stack buffer a slice at a time, so that every weight
 * byte is read once however many rows x has, and the inner loop is a plain f32 dot. */
#define SCALAR_SLICE 256

void cpu_scalar_gemv(float *y, int64_t ldy, const float *x, int64_t ldx, const float *xq,
                     int64_t ldq, int n, const weight_t *w, int64_t r0, int64_t r1)
{
    (void)xq;
    (void)ldq;
    int64_t cols = w->cols;
    size_t rb = dtype_row_bytes(w->dtype, cols);
    float buf[SCALAR_SLICE];
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *row = (const uint8_t *)w->data + (size_t)r * rb;
        for (int i = 0; i < n; i++)
            y[i * ldy + r] = 0.0f;
        for (int64_t k0 = 0; k0 < cols; k0 += SCALAR_SLICE) {
            int64_t len = cols - k0 < SCALAR_SLICE ? cols - k0 : SCALAR_SLICE;
            const float *wf;
            switch (w->dtype) {
            case DTYPE_F32:
                wf = (const float *)row + k0;
                break;
            case DTYPE_F16:
                for (int64_t k = 0; k < len; k++)
                    buf[k] = f16_to_f32(((const uint16_t *)row)[k0 + k]);
                wf = buf;
                break;
            case DTYPE_BF16:
                for (int64_t k = 0; k < len; k++)
                    buf[k] = bf16_to_f32(((const uint16_t *)row)[k0 + k]);
                wf = buf;
                break;
            case DTYPE_BF16X8:
            case DTYPE_F16X8:
                for (int64_t k = 0; k < len; k++)
                    buf[k] = scalar_rowblock(w, rb, r, k0 + k);
                wf = buf;
                break;
            default: {
                int64_t ng = cols / w->group;
                for (int64_t k = 0; k < len; k++) {
                    int64_t kk = k0 + k, g = kk / w->group;
                    float s = f16_to_f32(w->scales[r * ng + g]);
                    float z = f16_to_f32(w->zeros[r * ng + g]);
                    buf[k] = ((float)scalar_code(w->dtype, row, cols, kk) - z) * s;
                }
                wf = buf;
                break;
            }
            }
            /* One running sum per output, continued across slices: the additions happen
             * in plain column order, as in llama2.c's matmul, so this level reproduces it
             * bit for bit. */
            for (int i = 0; i < n; i++) {
                const float *xi = x + i * ldx + k0;
                float acc = y[i * ldy + r];
                for (int64_t k = 0; k < len; k++)
                    acc += wf[k] * xi[k];
                y[i * ldy + r] = acc;
            }
        }
    }
}

static float scalar_dot(const float *a, const float *b, int64_t n)
{
    float acc = 0.0f;
    for (int64_t k = 0; k < n; k++)
        acc += a[k] * b[k];
    return acc;
}

static float scalar_sumsq(const float *x, int64_t n)
{
    float acc = 0.0f;
    for (int64_t k = 0; k < n; k++)
        acc += x[k] * x[k];
    return acc;
}

static void scalar_scale_mul(float *out, const float *x, float s, const float *w, int64_t n)
{
    for (int64_t k = 0; k < n; k++)
        out[k] = w[k] * (s * x[k]);
}

static void scalar_add(float *y, const float *x, int64_t n)
{
    for (int64_t k = 0; k < n; k++)
        y[k] += x[k];
}

static void scalar_swiglu(float *out, const float *g, const float *u, int64_t n)
{
    for (int64_t k = 0; k < n; k++)
        out[k] = g[k] / (1.0f + expf(-g[k])) * u[k];
}

static void scalar_attn_scores(float *s, int64_t sstride, const float *q, int G, int hd,
                               const float *const *rows, int64_t off, int64_t T,
                        float scale)
{
    for (int64_t t = 0; t < T; t++)
        for (int g = 0; g < G; g++)
            s[g * sstride + t] = rows[t] ? scale * scalar_dot(q + g * hd, rows[t] + off, hd) : -INFINITY;
}

static void scalar_attn_values(float *o, const float *p, int64_t pstride, int G, int hd,
                               const float *const *rows, int64_t off, int64_t T)
{
    for (int64_t t = 0; t < T; t++) {
        if (!rows[t])
            continue;
        for (int g = 0; g < G; g++) {
            float pt = p[g * pstride + t];
            for (int j = 0; j < hd; j++)
                o[g * hd + j] += pt * rows[t][off + j];
        }
    }
}

static void scalar_kv_to_f32(float *dst, dtype_t dt, const void *base, const float *scales,
                             int64_t off, int64_t n)
{
    kv_row_to_f32(dt, base, scales, off, dst, n);
}

static float scalar_exp_sum(float *x, int64_t n, float max)
{
    float sum = 0.0f;
    for (int64_t t = 0; t < n; t++) {
        x[t] = expf(x[t] - max);
        sum += x[t];
    }
    return sum;
}

static float scalar_max(const float *x, int64_t n)
{
    float m = -INFINITY;
    for (int64_t t = 0; t < n; t++)
        m = x[t] > m ? x[t] : m;
    return m;
}

static uint64_t scalar_read_sum(const void *buf, size_t bytes)
{
    const uint64_t *p = buf;
    uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
    for (size_t i = 0; i < bytes / 8; i += 4) {
        a0 += p[i];
        a1 += p[i + 1];
        a2 += p[i + 2];
        a3 += p[i + 3];
    }
    return a0 + a1 + a2 + a3;
}

/* The compute peak of the portable build: the chains as the compiler schedules them. */
#define INIT(i) (i)
#define FSTEP(a) ((a) * 0.999999f + 1e-6f)
#define ISTEP(a) ((a) * 3u + 5u)
#define ADD(a, b) ((a) + (b))
#define XOR(a, b) ((a) ^ (b))
PEAK_FN static float scalar_peak_f32(int64_t iters)
{
    return PEAK_ROUNDS(float, iters, INIT, FSTEP, ADD);
}

PEAK_FN static int32_t scalar_peak_i8(int64_t iters)
{
    return (int32_t)PEAK_ROUNDS(uint32_t, iters, INIT, ISTEP, XOR);
}
#undef INIT
#undef FSTEP
#undef ISTEP
#undef ADD
#undef XOR

const cpu_kernels_t cpu_kernels_scalar = {
    .level = CPU_SIMD_SCALAR,
    .gemv = cpu_scalar_gemv,
    .gemm_panel = 0,
    .gemm_pack = NULL,
    .gemm_block = NULL,
    .rows_to_f32 = cpu_scalar_rows_to_f32,
    .dot = scalar_dot,
    .sumsq = scalar_sumsq,
    .scale_mul = scalar_scale_mul,
    .add = scalar_add,
    .swiglu = scalar_swiglu,
    .attn_scores = scalar_attn_scores,
    .attn_values = scalar_attn_values,
    .kv_to_f32 = scalar_kv_to_f32,
    .kv_from_f32 = kv_row_from_f32,
    .exp_sum = scalar_exp_sum,
    .max = scalar_max,
    .read_sum = scalar_read_sum,
    .peak_f32 = scalar_peak_f32,
    .peak_i8 = scalar_peak_i8,
    .peak_macs_f32 = PEAK_CHAINS,
    .peak_macs_i8 = PEAK_CHAINS,
};
