/* Placing a loaded model on its backend (model.h, model_place).
 *
 * The loader maps the checkpoint; where the weights must live is the backend's decision,
 * asked through ops->weight_upload, so this file walks the model and the kernels never see
 * a model_t. The fingerprint that ties a river and a router set to their model hashes weight
 * bytes, so it is taken here, from the mapped file, before anything moves. */
#include "common/err.h"
#include "model/fingerprint.h"
#include "model/model.h"

int model_place(model_t *m, backend_t *be)
{
    return model_place_layers(m, be, 0, m ? m->cfg.n_layers : 0, 1);
}

int model_place_layers(model_t *m, backend_t *be, int begin, int end, int ends)
{
    if (!m || !be)
        return river_err_set(RIVER_EINVAL, "model place: NULL argument");
    if (m->backend)
        return river_err_set(RIVER_ESTATE, "%s: the model is placed on a backend already",
                             m->path);
    int e = model_fingerprint(m, m->fingerprint);
    if (e)
        return e;

    /* Decided before the embedding moves: a tied head shares the table's copy instead of
     * taking a second one (525 MB for Llama 3.2 1B in bf16). */
    int tied = m->lm_head.data == m->embed.data;
    ops_ctx_t *ctx = be->ctx;
    if (ends) {
        if ((e = be->ops->weight_upload(ctx, &m->embed)))
            return e;
        if (tied)
            m->lm_head = m->embed;
        else if ((e = be->ops->weight_upload(ctx, &m->lm_head)))
            return e;
        if ((e = be->ops->weight_upload(ctx, &m->final_norm)))
            return e;
    }
    for (int l = 0; l < m->cfg.n_layers; l++) {
        layer_weights_t *lw = &m->layers[l];
        /* Norms and biases go everywhere: the Exit River shares them with the backbone, so a
         * river half computes with those of the layers it leaves to its peer. They are
         * vectors, a few KiB a layer. */
        weight_t *vecs[] = {&lw->attn_norm, &lw->bq,     &lw->bk,      &lw->bv,
                            &lw->q_norm,    &lw->k_norm, &lw->ffn_norm};
        for (size_t i = 0; i < sizeof vecs / sizeof vecs[0]; i++)
            if ((e = be->ops->weight_upload(ctx, vecs[i])))
                return e;
        if (l < begin || l >= end)
            continue;
        /* Views of one fused tensor (Phi-3 qkv_proj) are placed one by one: on a device each
         * gets its own copy of its rows, which costs nothing extra since the views do not
         * overlap. */
        weight_t *mats[] = {&lw->wq, &lw->wk, &lw->wv, &lw->wo, &lw->w_gate, &lw->w_up,
                            &lw->w_down};
        for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++)
            if ((e = be->ops->weight_upload(ctx, mats[i])))
                return e;
    }
    m->backend = be;
    return 0;
}
