/* Repacking Q4 weights into Q4X8 (q4x8.h). */
#include "kernels/cpu/q4x8.h"

#include <string.h>

int cpu_q4x8_eligible(const weight_t *w)
{
    if (w->dtype != DTYPE_Q4 || !w->data || w->cols % Q4X8_SET != 0)
        return 0;
    return w->group == 32 || w->group == 64 || w->group == 128 ||
           (w->group > 0 && w->group % Q4X8_SET == 0);
}

void cpu_q4x8_repack(const weight_t *w, uint8_t *dst)
{
    size_t rb = dtype_row_bytes(DTYPE_Q4, w->cols);
    for (int64_t r = 0; r < w->rows; r++) {
        const uint8_t *src = (const uint8_t *)w->data + (size_t)r * rb;
        uint8_t *out = dst + (size_t)r * rb;
        memset(out, 0, rb);
        for (int64_t k = 0; k < w->cols; k++) {
            unsigned q = (k & 1) ? (unsigned)(src[k >> 1] >> 4) : (unsigned)(src[k >> 1] & 15);
            int high;
            int64_t b = cpu_q4x8_byte(k, &high);
            out[b] |= (uint8_t)(high ? q << 4 : q);
        }
    }
}
