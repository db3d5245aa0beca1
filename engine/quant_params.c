/* Quantization parameters: method names, defaults and their checks (quant_params.h). */
#include "engine/quant_params.h"

#include <math.h>
#include <string.h>

#include "common/err.h"

const char *quant_method_name(quant_method_t m)
{
    switch (m) {
    case QUANT_RTN:
        return "rtn";
    case QUANT_HQQ:
        return "hqq";
    case QUANT_SYM:
        return "sym";
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
    if (p->bits != 2 && p->bits != 3 && p->bits != 4 && p->bits != 8)
        return river_err_set(RIVER_EINVAL, "%s: %d bits; only 2, 3, 4 and 8 are supported",
                             what, p->bits);
    if (p->group <= 0)
        return river_err_set(RIVER_EINVAL, "%s: group size %d must be positive", what,
                             p->group);
    /* The 2- and 3-bit kernels unpack runs of 16 codes of one group (kernels/cpu/lowbit.h). */
    if (p->bits < 4 && p->group % QUANT_LOWBIT_GROUP_UNIT != 0)
        return river_err_set(RIVER_EINVAL, "%s: %d-bit groups must be a multiple of %d inputs, "
                             "not %d", what, p->bits, QUANT_LOWBIT_GROUP_UNIT, p->group);
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
