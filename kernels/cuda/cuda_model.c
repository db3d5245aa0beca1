/* Uploading a whole model to a CUDA backend. It lives beside the backend rather than in
 * engine/ because it is built only with the toolkit (engine/ builds everywhere) and because
 * it is the backend, not the engine, that decides where weights must live; the engine only
 * sees weight_t pointers either way. */
#include "common/err.h"
#include "engine/model.h"
#include "kernels/cuda/cuda.h"

int cuda_model_upload(backend_t *b, struct model *m)
{
    if (!b || !m)
        return river_err_set(RIVER_EINVAL, "cuda model upload: NULL argument");
    /* Decided before the embedding moves: a tied head shares the table's device copy
     * instead of taking a second one (525 MB for Llama 3.2 1B in bf16). */
    int tied = m->lm_head.data == m->embed.data;
    int e = cuda_backend_upload(b, &m->embed);
    if (e)
        return e;
    if (tied)
        m->lm_head = m->embed;
    else if ((e = cuda_backend_upload(b, &m->lm_head)))
        return e;
    if ((e = cuda_backend_upload(b, &m->final_norm)))
        return e;
    for (int l = 0; l < m->cfg.n_layers; l++) {
        layer_weights_t *lw = &m->layers[l];
        /* Views of one fused tensor (Phi-3 qkv_proj) are uploaded one by one: each gets its
         * own copy of its rows, which costs nothing extra since the views do not overlap. */
        weight_t *all[] = { &lw->attn_norm, &lw->wq, &lw->wk, &lw->wv, &lw->wo, &lw->bq,
                            &lw->bk, &lw->bv, &lw->q_norm, &lw->k_norm, &lw->ffn_norm,
                            &lw->w_gate, &lw->w_up, &lw->w_down };
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
            if ((e = cuda_backend_upload(b, all[i])))
                return e;
    }
    return 0;
}
