#include "engine/spec_cost.h"

#include <math.h>

#include "engine/exitriver.h"

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

int64_t spec_draft_bytes(const model_t *m, const exitriver_t *r, int exit_layer)
{
    int L = m->cfg.n_layers, start = exitriver_start_layer(r);
    int e = exit_layer < start ? start : exit_layer > L ? L : exit_layer;
    int64_t bytes = model_bytes_per_token(m);
    for (int l = e; l < L; l++)
        bytes -= model_layer_bytes(&m->layers[l]);
    bytes += exitriver_layer_bytes(r, e);
    const weight_t *head = exitriver_head(r);
    if (head)
        bytes += weight_bytes(head) - weight_bytes(&m->lm_head);
    return bytes;
}
