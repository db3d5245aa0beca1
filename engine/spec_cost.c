#include "engine/spec_cost.h"

#include <math.h>

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
