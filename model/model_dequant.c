/* model_dequantize (model.h): f32 copies of a model's 4- and 8-bit matrices, for the
 * offline tools whose math reads float weights (the river's quantizer). */
#include <stdlib.h>

#include "common/err.h"
#include "kernels/half.h"
#include "model/fingerprint.h"
#include "model/model_internal.h"

static int dq_weight(model_t *m, weight_t *w)
{
    if (!w->data || (w->dtype != DTYPE_Q4 && w->dtype != DTYPE_Q8))
        return 0;
    float *out = malloc(sizeof *out * (size_t)(w->rows * w->cols));
    if (!out)
        return river_err_set(RIVER_ENOMEM, "%s: %lld x %lld floats", m->path,
                             (long long)w->rows, (long long)w->cols);
    const unsigned char *p = w->data;
    size_t rb = dtype_row_bytes(w->dtype, w->cols);
    int64_t ng = w->cols / w->group;
    for (int64_t r = 0; r < w->rows; r++)
        for (int64_t c = 0; c < w->cols; c++) {
            const unsigned char *row = p + (size_t)r * rb;
            int q = w->dtype == DTYPE_Q8 ? row[c] : (row[c / 2] >> (4 * (c & 1))) & 0xF;
            int64_t g = r * ng + c / w->group;
            out[r * w->cols + c] = ((float)q - f16_to_f32(w->zeros[g])) * f16_to_f32(w->scales[g]);
        }
    int e = model_mapping_own(m->map, out);
    if (e)
        return e;
    *w = (weight_t){.dtype = DTYPE_F32, .rows = w->rows, .cols = w->cols, .data = out};
    return 0;
}

int model_dequantize(model_t *m)
{
    if (m->backend)
        return river_err_set(RIVER_ESTATE, "%s: dequantizing a placed model", m->path);
    int e = model_fingerprint(m, m->fingerprint);
    int tied = m->lm_head.data == m->embed.data;
    for (int l = 0; !e && l < m->cfg.n_layers; l++) {
        layer_weights_t *L = &m->layers[l];
        weight_t *ws[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        for (size_t i = 0; !e && i < sizeof ws / sizeof ws[0]; i++)
            e = dq_weight(m, ws[i]);
    }
    if (!e)
        e = dq_weight(m, &m->embed);
    if (!e && tied)
        m->lm_head = m->embed;
    else if (!e)
        e = dq_weight(m, &m->lm_head);
    if (!e)
        m->cfg.dtype = m->layers[0].wq.dtype;
    return e;
}
