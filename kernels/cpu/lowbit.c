/* The gemv the vector levels share for the 2- and 3-bit weight types, and the kernel tables
 * that route Q2/Q3 weights to each level's kernels (lowbit.h). */
#include "kernels/cpu/lowbit.h"
#include "kernels/cpu/rowblock.h"
#include "kernels/cpu/x8_pick.h"

#include <pthread.h>


static void lowbit_gemv_dequant(const cpu_lowbit_level_t *l, float *y, int64_t ldy,
                                const float *x, int64_t ldx, int n, const weight_t *w,
                                int64_t r0, int64_t r1)
{
    float buf[LOWBIT_DEQ_FLOATS] __attribute__((aligned(64)));
    int64_t block = LOWBIT_DEQ_FLOATS / w->cols;
    for (int64_t b0 = r0; b0 < r1; b0 += block) {
        int64_t b1 = b0 + block < r1 ? b0 + block : r1;
        l->rows_to_f32(buf, w, b0, b1);
        weight_t f = {.dtype = DTYPE_F32, .rows = b1 - b0, .cols = w->cols, .data = buf};
        l->base->gemv(y + b0, ldy, x, ldx, NULL, 0, n, &f, 0, b1 - b0);
    }
}

void cpu_lowbit_gemv_level(const cpu_lowbit_level_t *l, float *y, int64_t ldy, const float *x,
                           int64_t ldx, int n, const weight_t *w, int64_t r0, int64_t r1)
{
    if (w->group % LOWBIT_GROUP_UNIT != 0) {
        cpu_scalar_gemv(y, ldy, x, ldx, NULL, 0, n, w, r0, r1);
        return;
    }
    if (n > l->direct_n && w->cols <= LOWBIT_DEQ_FLOATS) {
        lowbit_gemv_dequant(l, y, ldy, x, ldx, n, w, r0, r1);
        return;
    }
    const cpu_lowbit_rows_fn *fns = l->fns[w->dtype == DTYPE_Q3];
    int64_t rb = (int64_t)dtype_row_bytes(w->dtype, w->cols);
    int64_t block = rb > 0 ? (16 * 1024) / rb : 2;
    block = block < 2 ? 2 : block & ~(int64_t)1;
    for (int64_t b0 = r0; b0 < r1; b0 += block) {
        int64_t b1 = b0 + block < r1 ? b0 + block : r1;
        for (int i0 = 0; i0 < n; i0 += l->nb) {
            int nb = n - i0 < l->nb ? n - i0 : l->nb;
            fns[nb - 1](y, ldy, x, ldx, i0, w, b0, b1);
        }
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
        [CPU_SIMD_SCALAR] = {&cpu_kernels_scalar, cpu_scalar_gemv, cpu_scalar_rows_to_f32},
        [CPU_SIMD_AVX2] = {&cpu_kernels_avx2, cpu_lowbit_gemv_avx2, cpu_lowbit_rows_to_f32_avx2},
        [CPU_SIMD_AVX512] = {&cpu_kernels_avx512, cpu_lowbit_gemv_avx512,
                             cpu_lowbit_rows_to_f32_avx512},
        [CPU_SIMD_AVX512BF16] = {&cpu_kernels_avx512, cpu_lowbit_gemv_avx512,
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

const cpu_kernels_t *cpu_kernels_for(const cpu_kernels_t *k, const weight_t *w, int n)
{
    /* The avx512bf16 level differs from avx512 only in bf16 weights' matmuls. */
    if (k->level == CPU_SIMD_AVX512BF16 && cpu_rowblock_elem(w->dtype) != DTYPE_BF16)
        k = &cpu_kernels_avx512;
    /* bf16 weights in even/odd order (kernels_avx2.c) where the columns are whole blocks. */
    if (k->level == CPU_SIMD_AVX2 && cpu_rowblock_elem(w->dtype) == DTYPE_BF16 &&
        w->cols % 16 == 0)
        return &cpu_kernels_avx2_bf16;
    if (k->level == CPU_SIMD_AVX512 && cpu_rowblock_elem(w->dtype) == DTYPE_BF16 &&
        w->cols % 32 == 0)
        return &cpu_kernels_avx512_bf16;
    if (w->dtype == DTYPE_Q4X8 || w->dtype == DTYPE_Q8X8)
        return cpu_x8_kernels(k, w, n);
    if (w->dtype != DTYPE_Q2 && w->dtype != DTYPE_Q3)
        return k;
    /* pthread_once fails only on misuse; the tables are then still built by this thread. */
    if (pthread_once(&lowbit_once, lowbit_tables_build) != 0)
        lowbit_tables_build();
    return &lowbit_tables[k->level];
}
