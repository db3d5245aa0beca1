/* The portable kernels of the 2- and 3-bit weight types and the kernel tables that route
 * Q2/Q3 weights to each level's kernels (lowbit.h). */
#include "kernels/cpu/lowbit.h"

#include <pthread.h>

#include "kernels/half.h"

void cpu_lowbit_rows_to_f32_scalar(float *dst, const weight_t *w, int64_t r0, int64_t r1)
{
    int64_t cols = w->cols, ng = cols / w->group;
    size_t rb = dtype_row_bytes(w->dtype, cols);
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *row = (const uint8_t *)w->data + (size_t)r * rb;
        float *d = dst + (r - r0) * cols;
        for (int64_t g = 0; g < ng; g++) {
            float s = f16_to_f32(w->scales[r * ng + g]), z = f16_to_f32(w->zeros[r * ng + g]);
            for (int64_t k = g * w->group; k < (g + 1) * w->group; k++)
                d[k] = ((float)cpu_lowbit_code(w->dtype, row, cols, k) - z) * s;
        }
    }
}

/* As the portable kernels of the other types do (kernels_scalar.c): a row is dequantized
 * a slice at a time into a stack buffer, then every row of x meets it, one running sum per
 * output in plain column order. */
#define LOWBIT_SLICE 256

void cpu_lowbit_gemv_scalar(float *y, int64_t ldy, const float *x, int64_t ldx,
                            const float *xq, int64_t ldq, int n, const weight_t *w, int64_t r0,
                            int64_t r1)
{
    (void)xq;
    (void)ldq;
    int64_t cols = w->cols, ng = cols / w->group;
    size_t rb = dtype_row_bytes(w->dtype, cols);
    float buf[LOWBIT_SLICE];
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *row = (const uint8_t *)w->data + (size_t)r * rb;
        for (int i = 0; i < n; i++)
            y[i * ldy + r] = 0.0f;
        for (int64_t k0 = 0; k0 < cols; k0 += LOWBIT_SLICE) {
            int64_t len = cols - k0 < LOWBIT_SLICE ? cols - k0 : LOWBIT_SLICE;
            for (int64_t k = 0; k < len; k++) {
                int64_t kk = k0 + k, g = kk / w->group;
                float s = f16_to_f32(w->scales[r * ng + g]);
                float z = f16_to_f32(w->zeros[r * ng + g]);
                buf[k] = ((float)cpu_lowbit_code(w->dtype, row, cols, kk) - z) * s;
            }
            for (int i = 0; i < n; i++) {
                const float *xi = x + i * ldx + k0;
                float acc = y[i * ldy + r];
                for (int64_t k = 0; k < len; k++)
                    acc += buf[k] * xi[k];
                y[i * ldy + r] = acc;
            }
        }
    }
}

void cpu_lowbit_gemv_dequant(const cpu_kernels_t *base,
                             void (*to_f32)(float *, const weight_t *, int64_t, int64_t),
                             float *y, int64_t ldy, const float *x, int64_t ldx, int n,
                             const weight_t *w, int64_t r0, int64_t r1)
{
    float buf[LOWBIT_DEQ_FLOATS] __attribute__((aligned(64)));
    int64_t block = LOWBIT_DEQ_FLOATS / w->cols;
    for (int64_t b0 = r0; b0 < r1; b0 += block) {
        int64_t b1 = b0 + block < r1 ? b0 + block : r1;
        to_f32(buf, w, b0, b1);
        weight_t f = {.dtype = DTYPE_F32, .rows = b1 - b0, .cols = w->cols, .data = buf};
        base->gemv(y + b0, ldy, x, ldx, NULL, 0, n, &f, 0, b1 - b0);
    }
}

/* ---- the tables ------------------------------------------------------------------------ */

/* One table per level: the level's own with the Q2/Q3 kernels in place of its weight
 * readers. They are built once, from constant tables, so building the AVX-512 one on a
 * processor without AVX-512 runs none of its code. */
static cpu_kernels_t lowbit_tables[CPU_SIMD_COUNT];
static pthread_once_t lowbit_once = PTHREAD_ONCE_INIT;

static void lowbit_tables_build(void)
{
    static const struct {
        const cpu_kernels_t *base;
        void (*gemv)(float *, int64_t, const float *, int64_t, const float *, int64_t, int,
                     const weight_t *, int64_t, int64_t);
        void (*rows_to_f32)(float *, const weight_t *, int64_t, int64_t);
    } levels[CPU_SIMD_COUNT] = {
        [CPU_SIMD_SCALAR] = {&cpu_kernels_scalar, cpu_lowbit_gemv_scalar,
                             cpu_lowbit_rows_to_f32_scalar},
        [CPU_SIMD_AVX2] = {&cpu_kernels_avx2, cpu_lowbit_gemv_avx2, cpu_lowbit_rows_to_f32_avx2},
        [CPU_SIMD_AVX512] = {&cpu_kernels_avx512, cpu_lowbit_gemv_avx512,
                             cpu_lowbit_rows_to_f32_avx512},
    };
    for (int l = 0; l < CPU_SIMD_COUNT; l++) {
        cpu_kernels_t t = *levels[l].base;
        t.q4x8 = 0;
        t.gemv = levels[l].gemv;
        t.gemv_prep_floats = NULL;
        t.gemv_prep = NULL;
        t.rows_to_f32 = levels[l].rows_to_f32;
        lowbit_tables[l] = t;
    }
}

const cpu_kernels_t *cpu_kernels_for(const cpu_kernels_t *k, const weight_t *w)
{
    if (w->dtype != DTYPE_Q2 && w->dtype != DTYPE_Q3)
        return k;
    /* pthread_once fails only on misuse; the tables are then still built by this thread. */
    if (pthread_once(&lowbit_once, lowbit_tables_build) != 0)
        lowbit_tables_build();
    return &lowbit_tables[k->level];
}
