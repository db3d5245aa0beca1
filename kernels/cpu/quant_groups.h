/* The quantization kernels: RTN and HQQ over runs of consecutive groups of float32 values,
 * to 4- or 8-bit codes with an fp16 scale and zero per group, in a portable, an AVX2 and an
 * AVX-512 variant that give identical bytes (they perform the same float operations in the
 * same order). The quantizer that drives them over a matrix is offline/quant.h, which also
 * documents the method. */
#ifndef RIVER_KERNELS_CPU_QUANT_GROUPS_H
#define RIVER_KERNELS_CPU_QUANT_GROUPS_H

#include <stdint.h>

#include "kernels/cpu/cpu.h"

/* Lanes of the fixed summation order every kernel follows; the SIMD kernels need groups
 * whose size is a multiple of it. */
#define QUANT_LANES 16

/* Error sums of one quantization, in double so that a billion elements add up exactly
 * enough. The rtn_* fields hold the same sums for plain RTN (equal to the others when the
 * method is RTN). */
typedef struct quant_stats {
    int64_t n;           /* elements */
    int64_t groups;
    int64_t iters;       /* HQQ iterations run, over all groups */
    double abs_err;      /* sum of |W - dequant| */
    double sq_err;       /* sum of (W - dequant)^2 */
    double sq_ref;       /* sum of W^2 */
    double rtn_abs_err;
    double rtn_sq_err;
} quant_stats_t;

/* The job of one kernel call: everything that does not change from group to group. */
typedef struct quant_job {
    int group;    /* values per group */
    int qmax;     /* 2^bits - 1 */
    int hqq;      /* 1: refine the zero with HQQ; 0: RTN */
    int iters;    /* HQQ iterations at most */
    float beta;   /* HQQ's initial beta */
    float kappa;  /* beta's growth per iteration */
    float expo;   /* HQQ's p - 1 */
} quant_job_t;

/* Quantizes n_groups consecutive groups of w (n_groups * j->group floats) with the kernel
 * of `level` (the portable one when the group size is not a multiple of QUANT_LANES): one
 * code per byte into q, the fp16 scales and zeros into scales and zeros (n_groups each),
 * and the error sums added to st. Returns 0, or -1 - (index of the first group whose range
 * does not fit an fp16 scale). */
int quant_groups(cpu_simd_t level, const quant_job_t *j, const float *w, int64_t n_groups,
                 uint8_t *q, uint16_t *scales, uint16_t *zeros, quant_stats_t *st);

#endif
