/* Repacking Q4 weights into Q4X8, and Q8 weights into Q8X8 (q4x8.h). */
#include <string.h>

#include "kernels/cpu/q4x8.h"


/* Groups that a set of 256 columns spans in the same pattern every set. */
static int q4x8_group_ok(int group)
{
    return group == 32 || group == 64 || group == 128 || (group > 0 && group % Q4X8_SET == 0);
}

int cpu_q4x8_eligible(const weight_t *w)
{
    if (w->dtype != DTYPE_Q4 || !w->data || w->cols % Q4X8_SET != 0)
        return 0;
    return q4x8_group_ok(w->group);
}

int cpu_q8x8_eligible(const weight_t *w)
{
    if (w->dtype != DTYPE_Q8 || !w->data || w->cols % Q4X8_SET != 0)
        return 0;
    return w->group == 16 || q4x8_group_ok(w->group);
}

void cpu_q8x8_repack(const weight_t *w, uint8_t *dst)
{
    size_t rb = (size_t)w->cols;
    for (int64_t r = 0; r < w->rows; r++) {
        const uint8_t *src = (const uint8_t *)w->data + (size_t)r * rb;
        uint8_t *out = dst + (size_t)r * rb;
        for (int64_t s = 0; s < w->cols / Q4X8_SET; s++) {
            const uint8_t *in = src + s * Q4X8_SET;
            uint8_t *o = out + s * Q8X8_SET_BYTES;
            /* Four bytes at a time: column 32j + 4v + t goes to byte 32v + 4j + t. */
            for (int v = 0; v < 8; v++)
                for (int j = 0; j < 8; j++)
                    memcpy(o + 32 * v + 4 * j, in + 32 * j + 4 * v, 4);
        }
    }
}

void cpu_q4x8_repack(const weight_t *w, uint8_t *dst)
{
    size_t rb = dtype_row_bytes(DTYPE_Q4, w->cols);
    int64_t n_sets = w->cols / Q4X8_SET;
    for (int64_t r = 0; r < w->rows; r++) {
        const uint8_t *src = (const uint8_t *)w->data + (size_t)r * rb;
        uint8_t *out = dst + (size_t)r * rb;
        for (int64_t s = 0; s < n_sets; s++) {
            /* The set's 256 codes, one a byte, then the 128 bytes of q4x8.h's layout: byte
             * p*32 + j*4 + t holds columns 32j + 8p + t (low) and that + 4 (high). */
            uint8_t c[Q4X8_SET];
            const uint8_t *in = src + s * Q4X8_SET_BYTES;
            for (int k = 0; k < Q4X8_SET_BYTES; k++) {
                c[2 * k] = in[k] & 15;
                c[2 * k + 1] = in[k] >> 4;
            }
            uint8_t *o = out + s * Q4X8_SET_BYTES;
            for (int p = 0; p < 4; p++)
                for (int j = 0; j < 8; j++)
                    for (int t = 0; t < 4; t++) {
                        int col = 32 * j + 8 * p + t;
                        o[p * 32 + j * 4 + t] = (uint8_t)(c[col] | c[col + 4] << 4);
                    }
        }
    }
}
