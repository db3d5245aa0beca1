/* The quantization parameters as an Exit River file records them (bits, group, method and
 * HQQ's settings): what the runtime reads back from a river and names its default file
 * after. The quantizer that applies them is offline work (offline/quant.h).
 *
 * A weight_t of dtype Q2/Q3/Q4/Q8 stores value = (q - zero) * scale, with one fp16 scale and
 * zero (in code units) per group of consecutive inputs of a row. */
#ifndef RIVER_ENGINE_QUANT_PARAMS_H
#define RIVER_ENGINE_QUANT_PARAMS_H

#include <stdint.h>

/* 2- and 3-bit groups are a multiple of this many inputs (the run the CPU kernels unpack
 * at once, LOWBIT_GROUP_UNIT in kernels/cpu/lowbit.h). */
#define QUANT_LOWBIT_GROUP_UNIT 16

typedef enum {
    QUANT_RTN = 0,
    QUANT_HQQ,
    QUANT_SYM, /* symmetric: scale = max|w| / (2^(b-1) - 1) per group and zero = 2^(b-1)
                  exactly; at 8 bits with group 32 the affine spelling of llama.cpp's Q8_0
                  (int8 codes, one scale a block of 32) */
    QUANT_METHOD_COUNT
} quant_method_t;

/* "rtn", "hqq" or "sym". */
const char *quant_method_name(quant_method_t m);
/* The method named s; -1 when s names none. */
int quant_method_parse(const char *s, quant_method_t *out);

typedef struct quant_params {
    int bits;              /* 2, 3, 4 or 8 */
    int group;             /* inputs per group; must divide the columns of every matrix */
    quant_method_t method;
    float hqq_p;           /* the lp-norm HQQ minimises, 0.7 */
    float hqq_beta;        /* initial beta of the proximal solver, 10 */
    float hqq_kappa;       /* beta's growth per iteration, 1.01 */
    int hqq_iters;         /* iterations at most, 20 */
    int portable;          /* 1: use the portable kernel even where AVX2/AVX-512 is present */
} quant_params_t;

/* 4 bits, group 64, HQQ with p 0.7, beta 10, kappa 1.01 and 20 iterations. */
quant_params_t quant_params_default(void);

/* Checks the parameters for a matrix of `cols` inputs (cols <= 0: skips the divisibility
 * check). `what` names the matrix in the error detail. RIVER_EINVAL or RIVER_ESHAPE. */
int quant_params_check(const quant_params_t *p, int64_t cols, const char *what);

#endif
