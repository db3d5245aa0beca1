/* Internal to the CPU backend: the kernels of one SIMD level, as a table of function
 * pointers. kernels_scalar.c, kernels_avx2.c and kernels_avx512.c each define one table;
 * the backend picks one at creation time (after run-time detection), so code compiled for
 * AVX2 or AVX-512 only ever runs on a processor that has it.
 *
 * Every kernel works on f32 activations. Weight-reading kernels take a weight_t and read its
 * memory in place, whatever its dtype. */
#ifndef RIVER_KERNELS_CPU_SIMD_H
#define RIVER_KERNELS_CPU_SIMD_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/cpu/cpu.h"
#include "kernels/ops.h"

typedef struct cpu_kernels {
    cpu_simd_t level;
    /* gemv has a Q4X8 kernel (kernels/cpu/q4x8.h): the backend repacks eligible Q4 weights
     * into that layout when they are placed. Every level's kernels read Q4X8 correctly. */
    int q4x8;
    /* The same for Q8 into Q8X8 (q4x8.h). */
    int q8x8;
    /* gemv reads the row-blocked layout faster than the row-major one (rowblock.h): the
     * backend repacks eligible BF16 and F16 weights into it when they are placed. Every
     * level's kernels read it correctly. */
    int rowblock;

    /* y[i*ldy + r] = sum_k x[i*ldx + k] * W[r][k] for i < n and r0 <= r < r1 (y points at
     * element (0, 0) of the output). Weights are read in place, once per call: each block of
     * weight rows is applied to all n rows of x before moving on. Any n works; it is the
     * decode path, meant for small n. xq is x prepared by gemv_prep (ldq floats a row),
     * NULL when gemv_prep_floats is absent or returned 0 for w. */
    void (*gemv)(float *y, int64_t ldy, const float *x, int64_t ldx, const float *xq,
                 int64_t ldq, int n, const weight_t *w, int64_t r0, int64_t r1);
    /* Optional (NULL: never). Some weights (Q4/Q8) want x rearranged once per call, with
     * extras such as per-group sums: the floats per row of x that takes (0: none), and the
     * preparation of n rows into xq, each row of xq from its row of x alone (matmul.c
     * splits the rows between threads). */
    int64_t (*gemv_prep_floats)(const weight_t *w);
    void (*gemv_prep)(float *xq, const float *x, int64_t ldx, int n, const weight_t *w);
    /* Optional (NULL: 0 for every w). Columns per block of the 8-bit x that gemv's integer
     * kernels take for w (d = max|x| / 127, x8 = round(x / d) per block, as gemv_prep
     * computes it), or 0 where gemv reads x in f32. The matmul takes gemv at every n for
     * such weights: its rows do not depend on how many rows share the call. */
    int (*gemv_x8_block)(const weight_t *w);

    /* The prefill path of Q4/Q8 weights whose groups do not hold whole vectors (NULL on the
     * scalar level, which uses gemv for every n). x is first packed into panels of
     * gemm_panel rows, transposed so that one column of a panel is a few vectors:
     * xp[k*gemm_panel + i] = x[(i0+i)*ldx + k], zero past the m valid rows. */
    int gemm_panel;
    void (*gemm_pack)(float *xp, const float *x, int64_t ldx, int m, int64_t cols);
    /* y[i*ldy + r] = sum_k xp[k*panel + i] * wf[r*ldw + k] for i < m, r < nr: one panel of x
     * against nr f32 weight rows (any nr; the kernel tiles them). */
    void (*gemm_block)(float *y, int64_t ldy, const float *xp, int m, const float *wf,
                       int64_t ldw, int64_t nr, int64_t cols);
    /* Optional (NULL: gemv at every n). The prefill path for float weights (F32, BF16, F16
     * and their row-blocked layouts) with columns a multiple of gemm_lanes, blocked over
     * weight rows, rows of x and columns (kernels/cpu/matmul.c says how), whose outputs have
     * the bits gemv gives them (gemm_dot_x86.h says why and how).
     * gemm_wpack writes the weight rows r0..r1 at columns k0..k1 (multiples of gemm_lanes)
     * as f32 panels of gemm_nr rows, aligned to a vector, one vector of each row in turn:
     * wp[((p*(k1-k0)/L + s)*gemm_nr + j)*L + l] = W[r0 + p*gemm_nr + j][k0 + s*L + l] (L:
     * gemm_lanes), zero past r1.
     * gemm_dot runs m rows of x (ldx apart, from the block's first column) against one
     * panel over kc columns, in tiles of gemm_mr rows: for i < m, j < gemm_nr, lane l of
     * the vector c[(t*gemm_mr*gemm_nr + (i%gemm_mr)*gemm_nr + j)*L ...] (t = i/gemm_mr;
     * the carry, aligned) adds x[i][k] * w[j][k] for the columns k = l, l + L, ... in
     * turn, starting from zero where `first`; where y is NULL the vectors go back to c,
     * else y[i*ldy + j] (j < nr) becomes their sum as gemv takes it. Split over calls at
     * any multiple of L, an output has the bits of one call, and those of gemv. */
    int gemm_mr, gemm_nr, gemm_lanes;
    /* 0: gemm_dot reads x in f32 as it is. Else it reads x as gemv_prep leaves it, this
     * many columns to a float: 1 where the table takes the columns in another order (bf16
     * weights in even/odd order, kernels_avx2.c), 2 for a pair of bf16 values (the
     * avx512bf16 level), and gemm_lanes counts columns. */
    int gemm_x_cols_per_float;
    void (*gemm_wpack)(float *wp, const weight_t *w, int64_t r0, int64_t r1, int64_t k0,
                       int64_t k1);
    /* Nonzero: row-blocked weights of this table's element type (rowblock.h) are gemm_wpack's
     * panels as they are stored (gemm_nr is CPU_ROWBLOCK_ROWS and a vector is one chunk), so
     * the panel of rows r0.. at columns k0.. is cpu_rowblock_at(w->data, row bytes, r0, byte
     * of column k0) and nothing is packed. */
    int gemm_w_in_place;
    /* Floats of x (columns, or pairs where gemm_x_cols_per_float is 2) in a block of columns
     * of matmul.c's loop; 0 takes its default. */
    int gemm_kc;
    void (*gemm_dot)(float *c, float *y, int64_t ldy, const float *x, int64_t ldx, int m,
                     const float *wp, int nr, int64_t kc, int first);

    /* dst[(r-r0)*cols + k] = W[r][k] as f32 for r0 <= r < r1 (dequantised for Q4/Q8). */
    void (*rows_to_f32)(float *dst, const weight_t *w, int64_t r0, int64_t r1);

    float (*dot)(const float *a, const float *b, int64_t n);
    float (*sumsq)(const float *x, int64_t n);
    /* out[k] = w[k] * (s * x[k]): the rmsnorm scaling, in that order. */
    void (*scale_mul)(float *out, const float *x, float s, const float *w, int64_t n);
    /* y[k] += x[k] */
    void (*add)(float *y, const float *x, int64_t n);
    /* out[k] = silu(g[k]) * u[k] */
    void (*swiglu)(float *out, const float *g, const float *u, int64_t n);

    /* Attention over T positions for G query heads (hd floats each, consecutive in q) that
     * share one KV head: that head's K (or V) slice at position t is rows[t] + off, and
     * rows[t] is NULL for a slot that must not be read.
     * s[g*sstride + t] = scale * dot(q + g*hd, rows[t] + off), or -infinity for NULL. */
    void (*attn_scores)(float *s, int64_t sstride, const float *q, int G, int hd,
                        const float *const *rows, int64_t off, int64_t T, float scale);
    /* Optional (NULL: attn_scores row by row). attn_scores for m query rows at once, every
     * one over the same T positions, row i's G heads at q + i*qstride: for i < m, g < G,
     * s[(i*G + g)*sstride + t] is the score attn_scores gives that head, with its bits. */
    void (*attn_scores_rows)(float *s, int64_t sstride, const float *q, int64_t qstride, int m,
                             int G, int hd, const float *const *rows, int64_t off, int64_t T,
                             float scale);
    /* o[g*hd + j] += sum over non-NULL rows of p[g*pstride + t] * (rows[t] + off)[j] */
    void (*attn_values)(float *o, const float *p, int64_t pstride, int G, int hd,
                        const float *const *rows, int64_t off, int64_t T);
    /* Optional (NULL: attn_values row by row). attn_values for m query rows at once, every
     * one over the same T positions: for i < m, g < G,
     * o[i*ostride + g*hd + j] += sum over non-NULL rows of p[(i*G + g)*pstride + t] *
     * (rows[t] + off)[j], each value the chain over t that attn_values runs, so the bits
     * are its bits. */
    void (*attn_values_rows)(float *o, int64_t ostride, const float *p, int64_t pstride,
                             int m, int G, int hd, const float *const *rows, int64_t off,
                             int64_t T);
    /* dst[j] = element off + j of a KV array of type dt (kv_view_t: base, and for Q8 its
     * scales), widened to f32, for j < n; the same floats as kv_row_to_f32
     * (kernels/kv_row.h) at every level. Attention reads F16, BF16 and Q8 pools through it,
     * a block of rows at a time, into rows that attn_scores and attn_values then read. */
    void (*kv_to_f32)(float *dst, dtype_t dt, const void *base, const float *scales,
                      int64_t off, int64_t n);
    /* The other way, kv_write's: src[0..n) into elements off..off+n-1 of a KV array of
     * type dt, with kv_row_from_f32's bits at every level (the x86 levels narrow F16 with
     * F16C's vcvtps2ph, which rounds to nearest even and keeps a NaN's high payload bits,
     * quieted, as kernels/half.h does; the other types go through kv_row_from_f32). */
    void (*kv_from_f32)(dtype_t dt, void *base, float *scales, int64_t off, const float *src,
                        int64_t n);
    /* x[t] = exp(x[t] - max) for t < n, returns the sum; max is given. */
    float (*exp_sum)(float *x, int64_t n, float max);
    float (*max)(const float *x, int64_t n);

    /* Sums `bytes` (a multiple of 256, 256-byte aligned) as integers: the memory sweep. The
     * SIMD levels touch each 4 KiB page CPU_PF_PAGE_BYTES ahead, as their decode kernels
     * do (prefetch.h), so that the sweep stays the fastest read a kernel could make:
     * the plain loop read 0.87-0.96 of it on the Zen 5 VM, below what the kernels read. */
    uint64_t (*read_sum)(const void *buf, size_t bytes);

    /* The compute peak (cpu_peak_gmacs): `iters` rounds of independent multiply-add chains
     * held in registers, enough chains to cover the instructions' latency, no memory
     * operands; the result depends on every chain so that none is dead. peak_f32 runs the
     * f32 FMA the float matmuls use (at avx512bf16, the vdpbf16ps its bf16 matmuls use),
     * peak_i8 the 8-bit integer multiply-add the Q8/Q4
     * kernels use; peak_macs_* are the multiply-adds of one round. peak_q8_tile runs the
     * level's Q8X8 prefill tile on operands in registers and L1: its 8-bit multiply-adds
     * together with the work each block of 32 columns adds to them (its integer sum
     * converted, scaled by its two scales and added in f32), which no exact Q8_0-style
     * kernel is without; its figure is what that tile could reach with memory out of the
     * way (CPU_PEAK_Q8_TILE). NULL at the portable level, whose loops are what the compiler
     * makes of them. */
    float (*peak_f32)(int64_t iters);
    int32_t (*peak_i8)(int64_t iters);
    int32_t (*peak_q8_tile)(int64_t iters);
    int peak_macs_f32, peak_macs_i8, peak_macs_q8_tile;
} cpu_kernels_t;

extern const cpu_kernels_t cpu_kernels_scalar;
extern const cpu_kernels_t cpu_kernels_avx2;
extern const cpu_kernels_t cpu_kernels_avx512;
extern const cpu_kernels_t cpu_kernels_avx512bf16;
/* The AVX2 and AVX-512 levels' kernels for bf16 weights of whole blocks of 2 vectors of
 * columns, in even/odd order (kernels_avx2.c says why); cpu_kernels_for hands them out. */
extern const cpu_kernels_t cpu_kernels_avx2_bf16;
extern const cpu_kernels_t cpu_kernels_avx512_bf16;

/* The table of a level (which must be supported by the processor). */
const cpu_kernels_t *cpu_kernels_get(cpu_simd_t level);

/* Shared scalar pieces, defined in kernels_scalar.c, that the SIMD levels fall back on for
 * the cases they do not vectorise (odd group sizes of Q4/Q8, for one). */
void cpu_scalar_gemv(float *y, int64_t ldy, const float *x, int64_t ldx, const float *xq,
                     int64_t ldq, int n, const weight_t *w, int64_t r0, int64_t r1);
void cpu_scalar_rows_to_f32(float *dst, const weight_t *w, int64_t r0, int64_t r1);

/* Whether a Q4/Q8 weight has the layout the SIMD kernels handle: groups whose size is a
 * multiple of 16 (so a vector never straddles two groups). F32/F16/BF16 always qualify. */
static inline int cpu_weight_simd_ok(const weight_t *w)
{
    if (w->dtype == DTYPE_Q4 || w->dtype == DTYPE_Q8 || w->dtype == DTYPE_Q4X8 ||
        w->dtype == DTYPE_Q8X8)
        return w->group > 0 && w->group % 16 == 0;
    return 1;
}

#endif
