#include "engine/spec_cost.h"

#include <math.h>

#include "model/model.h"

double spec_expected_tokens(double alpha, int k)
{
    if (alpha >= 1)
        return k + 1;
    return (1 - pow(alpha, k + 1)) / (1 - alpha);
}

double spec_speedup(double alpha, int k, double t_plain, double t_draft, double t_verify_k)
{
    double cost = k * t_draft + t_verify_k;
    return cost > 0 ? spec_expected_tokens(alpha, k) * t_plain / cost : 0;
}

int spec_pick_k(double alpha, int k_max, double t_plain, double t_draft,
                const double *t_verify, double *best)
{
    int k_best = 1;
    double s_best = -1;
    for (int k = 1; k <= k_max; k++) {
        double s = spec_speedup(alpha, k, t_plain, t_draft, t_verify[k]);
        if (s > s_best) {
            s_best = s;
            k_best = k;
        }
    }
    if (best)
        *best = s_best;
    return k_best;
}

double spec_kv_elem_bytes(dtype_t kv_dtype)
{
    size_t block = kv_dtype_bytes(kv_dtype, KV_Q8_BLOCK) +
                   kv_dtype_scale_bytes(kv_dtype, KV_Q8_BLOCK);
    return 2.0 * (double)block / KV_Q8_BLOCK;
}

void spec_path_bytes(const model_t *m, const exit_config_t *x, int exit_layer, double ctx,
                     dtype_t kv_dtype, spec_bytes_t *out)
{
    int L = m->cfg.n_layers;
    if (!x || x->policy.rule == EXIT_RULE_NONE || x->policy.kv == EXIT_KV_POSTHOC ||
        exit_layer < 0 || exit_layer > L)
        exit_layer = L;
    int river = x && x->policy.kv == EXIT_KV_RIVER;
    spec_bytes_t b = {0};
    int ran = 0;
    for (int l = 0; l < L; l++) {
        const layer_weights_t *rl = river && x->river ? x->river[l] : NULL;
        if (l < exit_layer || (river && !rl))
            b.backbone_layers += (double)model_layer_bytes(&m->layers[l]);
        else if (rl)
            b.river_layers += (double)model_layer_bytes(rl);
        else
            continue;
        ran++;
    }
    b.kv = (double)ran * ctx * (double)(m->cfg.n_kv_heads * m->cfg.head_dim) *
           spec_kv_elem_bytes(kv_dtype);
    const weight_t *head = river && exit_layer < L && x->river_head ? x->river_head : &m->lm_head;
    b.heads = (double)(model_weight_bytes(&m->embed, 1) + model_weight_bytes(&m->final_norm, 1) +
                       model_weight_bytes(head, head->rows));
    b.total = b.backbone_layers + b.river_layers + b.heads + b.kv;
    *out = b;
}

void spec_path_bytes_mean(const model_t *m, const exit_config_t *x, const int64_t *hist,
                          double ctx, dtype_t kv_dtype, spec_bytes_t *out)
{
    int L = m->cfg.n_layers;
    spec_bytes_t sum = {0};
    double n = 0;
    for (int d = 0; d <= L; d++) {
        if (!hist[d])
            continue;
        spec_bytes_t b;
        spec_path_bytes(m, x, d, ctx, kv_dtype, &b);
        double w = (double)hist[d];
        sum.backbone_layers += w * b.backbone_layers;
        sum.river_layers += w * b.river_layers;
        sum.heads += w * b.heads;
        sum.kv += w * b.kv;
        n += w;
    }
    if (n == 0) {
        spec_path_bytes(m, NULL, L, ctx, kv_dtype, out);
        return;
    }
    sum.backbone_layers /= n;
    sum.river_layers /= n;
    sum.heads /= n;
    sum.kv /= n;
    sum.total = sum.backbone_layers + sum.river_layers + sum.heads + sum.kv;
    *out = sum;
}
