/* Element sizes and names of the weight dtypes in kernels/ops.h. */
#include "kernels/ops.h"

#include "common/err.h"

size_t dtype_size(dtype_t dt)
{
    switch (dt) {
    case DTYPE_F32:
        return 4;
    case DTYPE_F16:
    case DTYPE_BF16:
    case DTYPE_BF16X8:
    case DTYPE_F16X8:
        return 2;
    case DTYPE_Q4:
    case DTYPE_Q8:
    case DTYPE_Q4X8:
    case DTYPE_Q8X8:
    case DTYPE_Q2:
    case DTYPE_Q3:
    case DTYPE_COUNT:
        break;
    }
    return 0;
}

size_t dtype_row_bytes(dtype_t dt, int64_t cols)
{
    if (cols <= 0)
        return 0;
    switch (dt) {
    case DTYPE_F32:
    case DTYPE_F16:
    case DTYPE_BF16:
    case DTYPE_BF16X8:
    case DTYPE_F16X8:
        return (size_t)cols * dtype_size(dt);
    case DTYPE_Q4:
    case DTYPE_Q4X8:
        /* Two codes per byte; an odd last code still takes a whole byte. */
        return (size_t)(cols + 1) / 2;
    case DTYPE_Q8:
    case DTYPE_Q8X8:
        return (size_t)cols;
    case DTYPE_Q2:
        /* Four codes per byte; a partial last byte still takes a whole one. */
        return (size_t)(cols + 3) / 4;
    case DTYPE_Q3:
        /* The 2-bit plane, then the 1-bit plane, each rounded up to whole bytes. */
        return (size_t)(cols + 3) / 4 + (size_t)(cols + 7) / 8;
    case DTYPE_COUNT:
        break;
    }
    return 0;
}

const char *dtype_name(dtype_t dt)
{
    switch (dt) {
    case DTYPE_F32:
        return "f32";
    case DTYPE_F16:
        return "f16";
    case DTYPE_BF16:
        return "bf16";
    case DTYPE_Q4:
        return "q4";
    case DTYPE_Q8:
        return "q8";
    case DTYPE_Q4X8:
        return "q4x8";
    case DTYPE_Q8X8:
        return "q8x8";
    case DTYPE_Q2:
        return "q2";
    case DTYPE_Q3:
        return "q3";
    case DTYPE_BF16X8:
        return "bf16x8";
    case DTYPE_F16X8:
        return "f16x8";
    case DTYPE_COUNT:
        break;
    }
    return "unknown";
}

int dtype_quant_bits(dtype_t dt)
{
    switch (dt) {
    case DTYPE_Q2:
        return 2;
    case DTYPE_Q3:
        return 3;
    case DTYPE_Q4:
    case DTYPE_Q4X8:
        return 4;
    case DTYPE_Q8:
    case DTYPE_Q8X8:
        return 8;
    case DTYPE_F32:
    case DTYPE_F16:
    case DTYPE_BF16:
    case DTYPE_BF16X8:
    case DTYPE_F16X8:
    case DTYPE_COUNT:
        break;
    }
    return 0;
}

int dtype_is_quant(dtype_t dt)
{
    return dtype_quant_bits(dt) != 0;
}

dtype_t dtype_quant_of_bits(int bits)
{
    static const dtype_t by_bits[9] = {DTYPE_COUNT, DTYPE_COUNT, DTYPE_Q2,    DTYPE_Q3,   DTYPE_Q4,
                                       DTYPE_COUNT, DTYPE_COUNT, DTYPE_COUNT, DTYPE_Q8};
    return bits >= 0 && bits <= 8 ? by_bits[bits] : DTYPE_COUNT;
}

int kv_dtype_ok(dtype_t dt)
{
    return dt == DTYPE_F32 || dt == DTYPE_F16 || dt == DTYPE_BF16 || dt == DTYPE_Q8;
}

size_t kv_dtype_bytes(dtype_t dt, int64_t n)
{
    if (!kv_dtype_ok(dt) || n <= 0)
        return 0;
    return (size_t)n * (dt == DTYPE_Q8 ? 1 : dtype_size(dt));
}

size_t kv_dtype_scale_bytes(dtype_t dt, int64_t n)
{
    if (dt != DTYPE_Q8 || n <= 0)
        return 0;
    return (size_t)(n / KV_Q8_BLOCK) * sizeof(float);
}

int kv_dtype_check(dtype_t dt, int head_dim)
{
    if (!kv_dtype_ok(dt))
        return river_err_set(RIVER_EINVAL, "kv.dtype %s is not a KV cache type (f32, f16, "
                             "bf16 or q8)", dtype_name(dt));
    if (head_dim <= 0 || (dt == DTYPE_Q8 && head_dim % KV_Q8_BLOCK != 0))
        return river_err_set(RIVER_EINVAL, "kv.dtype %s needs a head_dim that is a multiple "
                             "of %d (one scale per block of %d values of a head); this "
                             "model's head_dim is %d", dtype_name(dt), KV_Q8_BLOCK,
                             KV_Q8_BLOCK, head_dim);
    return 0;
}
