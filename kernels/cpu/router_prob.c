/* The router op on the CPU (ops->router_prob, kernels/ops.h): the reference every other
 * backend is checked against. Its arithmetic is engine/router.c's router_logit step for
 * step (a double sum of squares; per hidden unit an 8-lane dot product of W_down's row,
 * the norm weight and h, scaled after the sum; silu; a float sum over units), so that a
 * forward pass that decides through the op exits exactly where the host routers say. The
 * compiler may not fuse these multiply-adds (-std=c11 leaves contraction off), which keeps
 * the clones of router.c and this file on the same floats. */
#include <math.h>
#include <string.h>

#include "common/err.h"
#include "kernels/cpu/cpu_internal.h"

typedef float cpu_router_vf __attribute__((vector_size(32)));

/* sum a[i]*b[i]*c[i], in router.c's order. */
static float cpu__router_dot3(const float *restrict a, const float *restrict b,
                              const float *restrict c, int n)
{
    cpu_router_vf acc = {0}, va, vb, vc;
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        memcpy(&va, a + i, sizeof va);
        memcpy(&vb, b + i, sizeof vb);
        memcpy(&vc, c + i, sizeof vc);
        acc += va * (vb * vc);
    }
    float s = 0;
    for (; i < n; i++)
        s += a[i] * b[i] * c[i];
    for (int k = 0; k < 8; k++)
        s += acc[k];
    return s;
}

static float cpu__router_sigmoid(float z)
{
    if (z >= 0)
        return 1.0f / (1.0f + expf(-z));
    float e = expf(z);
    return e / (1.0f + e);
}

static int cpu__router_check(const router_weights_t *w, const char *op)
{
    const weight_t *t[3] = {&w->norm, &w->down, &w->up};
    for (int i = 0; i < 3; i++)
        if (t[i]->dtype != DTYPE_F32 || !t[i]->data)
            return river_err_set(RIVER_EINVAL, "%s: router weights must be F32", op);
    int64_t d = w->down.cols, hid = w->down.rows;
    if (d <= 0 || hid <= 0 || w->norm.rows * w->norm.cols != d ||
        w->up.rows * w->up.cols != hid)
        return river_err_set(RIVER_ESHAPE, "%s: router of norm %lldx%lld, down %lldx%lld, up "
                             "%lldx%lld", op, (long long)w->norm.rows, (long long)w->norm.cols,
                             (long long)hid, (long long)d, (long long)w->up.rows,
                             (long long)w->up.cols);
    return 0;
}

int cpu_router_prob(ops_ctx_t *ctx, float *out, const void *x, const router_weights_t *w,
                    const int32_t *rows, int n)
{
    if (n < 0 || !w || (n > 0 && (!out || !x)))
        return river_err_set(RIVER_EINVAL, "cpu router_prob: n %d", n);
    int e = cpu__router_check(w, "cpu router_prob");
    if (e)
        return e;
    int d = (int)w->down.cols, hid = (int)w->down.rows;
    const float *norm = w->norm.data, *down = w->down.data, *up = w->up.data;
    for (int i = 0; i < n; i++) {
        int64_t r = rows ? rows[i] : i;
        if (r < 0)
            return river_err_set(RIVER_ERANGE, "cpu router_prob: row %lld", (long long)r);
        const float *h = (const float *)x + r * d;
        double ss = 0;
        for (int k = 0; k < d; k++)
            ss += (double)h[k] * (double)h[k];
        float inv = (float)(1.0 / sqrt(ss / d + (double)w->eps));
        float z = 0;
        for (int j = 0; j < hid; j++) {
            float a = cpu__router_dot3(down + (size_t)j * (size_t)d, norm, h, d) * inv;
            z += up[j] * (a * cpu__router_sigmoid(a));
        }
        out[i] = cpu__router_sigmoid(z);
    }
    return 0;
}
