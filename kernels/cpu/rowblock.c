/* The row-blocked layout of float weights (rowblock.h). */
#include "kernels/cpu/rowblock.h"

#include <string.h>

int cpu_rowblock_eligible(const weight_t *w)
{
    return (w->dtype == DTYPE_BF16 || w->dtype == DTYPE_F16) && w->rows > 0 &&
           w->rows % CPU_ROWBLOCK_ROWS == 0 && w->cols > 0 &&
           dtype_row_bytes(w->dtype, w->cols) % CPU_ROWBLOCK_CHUNK == 0;
}

void cpu_rowblock_repack(const weight_t *w, uint8_t *dst)
{
    size_t rb = dtype_row_bytes(w->dtype, w->cols);
    const uint8_t *src = w->data;
    for (int64_t r = 0; r < w->rows; r++)
        for (size_t b = 0; b < rb; b += CPU_ROWBLOCK_CHUNK)
            memcpy((uint8_t *)cpu_rowblock_at(dst, rb, r, b),
                   src + (size_t)r * rb + b, CPU_ROWBLOCK_CHUNK);
}
