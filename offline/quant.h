/* Weight quantizers for the Exit River: round-to-nearest (RTN) and HQQ, to 2, 3, 4 or 8 bits with
 * one fp16 scale and zero per group of consecutive inputs of a row.
 *
 * Conventions. The quantizer is written W_q = clamp(round(W*s + z), 0, 2^b - 1)
 * and the dequantization as (W_q - z) / s. A weight_t of dtype Q2/Q3/Q4/Q8 stores
 * value = (q - zero) * scale, so what is stored is scale = 1/s and zero = z (in code units).
 * Both are rounded to fp16, and every code is computed from the rounded values
 * (s = 1/scale16, z = zero16), so the stored weights are exactly the ones whose error was
 * measured and optimised, and dequantizing a stored matrix reproduces it bit for bit.
 *
 * RTN takes s from the group's min/max so that the codes span 0..2^b-1, and z = -min*s.
 * HQQ starts there and refines z alone with HQQ's half-quadratic solver (p = 0.7,
 * beta 10 growing by 1.01, at most 20 iterations). Every group is independent, so each group
 * stops on its own when its mean absolute error stops improving and keeps its best zero; the
 * first iterate is RTN's zero, so HQQ's error is never above RTN's.
 *
 * The work is deterministic: the same matrix and parameters give the same bytes for any
 * thread count, and the portable, AVX2 and AVX-512 kernels give identical results (they
 * perform the same float operations in the same order). The SIMD kernel is the one of the
 * level the CPU backend selects (RIVER_SIMD honoured). */
#ifndef RIVER_OFFLINE_QUANT_H
#define RIVER_OFFLINE_QUANT_H

#include <stddef.h>
#include <stdint.h>

#include "engine/quant_params.h"
#include "kernels/cpu/quant_groups.h"
#include "kernels/cpu/threadpool.h"
#include "kernels/ops.h"

/* The error sums (quant_stats_t) are those the kernels of kernels/cpu/quant_groups.h add
 * up. */
void quant_stats_add(quant_stats_t *into, const quant_stats_t *s);
/* Mean absolute error, and the relative Frobenius error ||W - dequant|| / ||W|| (0 for an
 * all-zero W), of the method used and of RTN. */
double quant_stats_mae(const quant_stats_t *s);
double quant_stats_rel_fro(const quant_stats_t *s);
double quant_stats_rtn_mae(const quant_stats_t *s);
double quant_stats_rtn_rel_fro(const quant_stats_t *s);

/* A quantized matrix in owned memory. */
typedef struct quant_matrix {
    int bits;
    int group;
    int64_t rows;
    int64_t cols;
    uint8_t *codes;    /* (rows, dtype_row_bytes(cols)) packed as the weight dtype of
                        * `bits` packs them (kernels/ops.h): Q2 (rows, cols/4), Q3 (rows,
                        * cols/4 + cols/8), Q4 (rows, (cols+1)/2) low nibble = even column,
                        * Q8 (rows, cols) */
    uint16_t *scales;  /* (rows, cols/group) fp16 */
    uint16_t *zeros;   /* (rows, cols/group) fp16, in code units */
} quant_matrix_t;

int quant_matrix_new(quant_matrix_t **out, int64_t rows, int64_t cols, int bits, int group);
void quant_matrix_destroy(quant_matrix_t **q);
/* Bytes of codes, and entries of scales (= of zeros). */
size_t quant_matrix_code_bytes(const quant_matrix_t *q);
size_t quant_matrix_group_count(const quant_matrix_t *q);
/* The matrix as a Q2/Q3/Q4/Q8 weight_t pointing into q. */
weight_t quant_matrix_weight(const quant_matrix_t *q);

/* Quantizes w (F32, F16, BF16, or Q4/Q8: a quantized backbone's matrix, read dequantized
 * through quant_row_f32, so that what is quantized is what the backbone runs) into out,
 * which must have w's shape and p's bits and group. QUANT_SYM takes one portable loop.
 * pool (NULL: the calling thread alone) spreads rows over its threads. stats, when not
 * NULL, receives the error sums. Errors: RIVER_EDTYPE, RIVER_ESHAPE, RIVER_EINVAL (bad
 * parameters), RIVER_EFORMAT (a Q4/Q8 source without valid groups), RIVER_ERANGE (a
 * non-finite weight, or a group too wide for an fp16 scale), RIVER_ENOMEM. */
int quant_weight(quant_matrix_t *out, const weight_t *w, const quant_params_t *p,
                 threadpool_t *pool, quant_stats_t *stats);

/* Row `row` of any weight_t (F32, F16, BF16, Q2, Q3, Q4, Q8) as cols floats, dequantizing exactly
 * as the CPU kernels do. */
int quant_row_f32(const weight_t *w, int64_t row, float *out);

/* How far a quantized matrix is from its source, both read through weight_t. */
typedef struct quant_error {
    double mae;      /* mean |W - Q| */
    double rel_fro;  /* ||W - Q||_F / ||W||_F */
    double lp;       /* mean |W - Q|^p: the objective HQQ minimises */
    double max_abs;  /* max |W - Q| */
} quant_error_t;

int quant_error(const weight_t *ref, const weight_t *q, double p, quant_error_t *out);

#endif
