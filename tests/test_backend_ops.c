/* One list of op cases run over every backend pair, as llama.cpp's test-backend-ops does:
 * each case runs an op of kernels/ops.h on the CPU backend (the reference) and on backend
 * X with the same inputs, and compares the outputs. X is the opaque backend everywhere
 * (the same CPU kernels behind memory the caller cannot touch: its results must equal the
 * reference bit for bit, so any difference is a wrong argument translation or a missing
 * upload) and the CUDA backend where a GPU exists (within each case's tolerance; without
 * one a single line says it is skipped). The CPU's SIMD levels are pairs too: AVX2 and
 * AVX-512 against the scalar level, each where the processor has it (a line says a level it
 * lacks is skipped), within each case's tolerance or the level's floor (simd_floor).
 *
 * The cases cover every op, including the router, the cosine, gather/scatter, kv_write and
 * attention, at head dims 64, 96 and 128, GQA groups 1 and 8, contexts above 1k positions,
 * row counts that are not a multiple of 8, a batched prompt (prefill rows of two sequences
 * with decode rows of others in one call), and Q4, Q8, F16 and BF16 weights.
 *
 * The real model shapes that tests/test_cuda_ops.c used to check op by op (Llama 3.2 1B's
 * projections, LM head and embedding) are cases here too, the largest on the GPU only.
 *
 * Tolerances (CUDA): max |x - ref| over max |ref| of the output, as tests/test_cuda_ops.c
 * explains them. The CUDA reference is the CPU at AVX-512 or the portable level (the AVX2
 * level quantizes x for Q4/Q8 weights); the opaque reference is the CPU at the level the
 * opaque backend runs, so that the two run the very same kernels. */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu.h"
#include "kernels/half.h"
#include "tests/testutil.h"

#ifdef RIVER_CUDA
#include "kernels/cuda/cuda.h"
#endif

#define CUDA_SKIP_LINE "no CUDA device: the CUDA column of the op tests is skipped"
#define THREADS 2

static float *rand_host(size_t n, float lo, float hi)
{
    float *p = malloc(n * sizeof *p);
    ck_assert_ptr_nonnull(p);
    for (size_t i = 0; i < n; i++)
        p[i] = test_rand(lo, hi);
    return p;
}

/* ---- a reference and a backend under test ---------------------------------------------- */

typedef struct bpair {
    backend_t *ref, *x;
    const char *name; /* of x */
    double scale;     /* multiplies a case's tolerance: 0 for the opaque backend (exact) */
    double floor;     /* the least tolerance (a SIMD level's summation order); 0: none */
    int level;        /* a SIMD pair's level (cpu_simd_t), -1 for the others */
} bpair_t;

#define N_PAIRS 4 /* opaque, cuda, and the CPU at AVX2 and at AVX-512 against its scalar level */

/* The SIMD level of pair k, or -1 when k is not a SIMD pair. */
static int bpair_level(int k)
{
    return k == 2 ? CPU_SIMD_AVX2 : k == 3 ? CPU_SIMD_AVX512 : -1;
}

/* Opens pair k (0: opaque, 1: cuda, 2: avx2, 3: avx512); false when that backend or level
 * is not there. */
static bool bpair_open(bpair_t *p, int k)
{
    memset(p, 0, sizeof *p);
    p->level = bpair_level(k);
    if (p->level >= 0) {
        if ((int)cpu_simd_detect() < p->level)
            return false;
        int e = cpu_backend_new(&p->ref, THREADS, CPU_SIMD_SCALAR);
        ck_assert_msg(e == 0, "%s", river_err_detail());
        e = cpu_backend_new(&p->x, THREADS, (cpu_simd_t)p->level);
        ck_assert_msg(e == 0, "%s", river_err_detail());
        p->name = cpu_simd_name((cpu_simd_t)p->level);
        p->scale = 1;
        return true;
    }
    if (k == 0) {
        ck_assert_msg(backend_open(&p->x, "opaque", THREADS, BACKEND_WEIGHTS_COPY) == 0, "%s", river_err_detail());
        ck_assert_msg(backend_open(&p->ref, "cpu", THREADS, BACKEND_WEIGHTS_COPY) == 0, "%s", river_err_detail());
        p->name = "opaque";
        p->scale = 0;
        return true;
    }
#ifdef RIVER_CUDA
    if (cuda_device_count() <= 0)
        return false;
    ck_assert_msg(cuda_backend_new(&p->x, 0) == 0, "%s", river_err_detail());
    int e = cpu_backend_new(&p->ref, THREADS, cpu_simd_detect() >= CPU_SIMD_AVX512
                                                  ? CPU_SIMD_AVX512
                                                  : CPU_SIMD_SCALAR);
    ck_assert_msg(e == 0, "%s", river_err_detail());
    p->name = "cuda";
    p->scale = 1;
    return true;
#else
    return false;
#endif
}

static void bpair_close(bpair_t *p)
{
    backend_destroy(&p->x);
    backend_destroy(&p->ref);
}

/* One buffer on each backend holding the same floats. */
typedef struct twin {
    void *r, *x;
    size_t n;
} twin_t;

static twin_t twin_new(bpair_t *p, const float *h, size_t n)
{
    twin_t t = {p->ref->ops->buf_alloc(p->ref->ctx, n), p->x->ops->buf_alloc(p->x->ctx, n), n};
    ck_assert_msg(t.r && t.x, "buffers of %zu floats: %s", n, river_err_detail());
    if (h) {
        ck_assert_int_eq(p->ref->ops->from_host(p->ref->ctx, t.r, 0, h, n), 0);
        ck_assert_int_eq(p->x->ops->from_host(p->x->ctx, t.x, 0, h, n), 0);
    }
    return t;
}

static twin_t twin_rand(bpair_t *p, size_t n, float lo, float hi)
{
    float *h = rand_host(n, lo, hi);
    twin_t t = twin_new(p, h, n);
    free(h);
    return t;
}

static void twin_free(bpair_t *p, twin_t *t)
{
    p->ref->ops->buf_free(p->ref->ctx, t->r);
    p->x->ops->buf_free(p->x->ctx, t->x);
}

/* max |x - ref| / max |ref| (NaN counts as the worst). */
static double rel_err(const float *a, const float *b, size_t n)
{
    double m = 0, d = 0;
    for (size_t i = 0; i < n; i++) {
        m = fabs(a[i]) > m ? fabs(a[i]) : m;
        double e = fabs((double)a[i] - b[i]);
        if (!(e <= d))
            d = e;
    }
    return m > 0 ? d / m : d;
}

static void check_host(bpair_t *p, const float *a, const float *b, size_t n, double tol,
                       const char *what)
{
    double lim = fmax(tol * p->scale, p->floor);
    if (p->scale == 0) {
        for (size_t i = 0; i < n; i++)
            ck_assert_msg(memcmp(&a[i], &b[i], sizeof a[i]) == 0, "%s on %s: element %zu is "
                          "%.9g, the CPU's %.9g", what, p->name, i, b[i], a[i]);
        return;
    }
    double e = rel_err(a, b, n);
    printf("%-6s %-52s rel err %.3g (tol %.1g)\n", p->name, what, e, lim);
    ck_assert_msg(e <= lim, "%s on %s: rel err %g above %g", what, p->name, e, lim);
}

static void check_twin(bpair_t *p, const twin_t *t, double tol, const char *what)
{
    float *a = malloc(t->n * sizeof *a), *b = malloc(t->n * sizeof *b);
    ck_assert_int_eq(p->ref->ops->to_host(p->ref->ctx, a, t->r, 0, t->n), 0);
    int e = p->x->ops->to_host(p->x->ctx, b, t->x, 0, t->n);
    ck_assert_msg(e == 0, "to_host on %s: %s", p->name, river_err_detail());
    check_host(p, a, b, t->n, tol, what);
    free(a);
    free(b);
}

/* A host weight of random values (Q4/Q8: random codes, scales and zeros). */
static weight_t weight_rand(dtype_t dt, int64_t rows, int64_t cols, int group, float amp)
{
    weight_t w = {.dtype = dt, .rows = rows, .cols = cols};
    size_t n = (size_t)rows * (size_t)cols;
    if (dt == DTYPE_F32) {
        w.data = rand_host(n, -amp, amp);
    } else if (dt == DTYPE_F16 || dt == DTYPE_BF16) {
        uint16_t *d = malloc(n * sizeof *d);
        for (size_t i = 0; i < n; i++) {
            float v = test_rand(-amp, amp);
            d[i] = dt == DTYPE_F16 ? f32_to_f16(v) : f32_to_bf16(v);
        }
        w.data = d;
    } else {
        size_t bytes = (size_t)rows * dtype_row_bytes(dt, cols);
        uint8_t *d = malloc(bytes);
        for (size_t i = 0; i < bytes; i++)
            d[i] = (uint8_t)test_rand_u32();
        size_t ng = (size_t)rows * (size_t)(cols / group);
        uint16_t *s = malloc(ng * sizeof *s), *z = malloc(ng * sizeof *z);
        float qmax = dt == DTYPE_Q4 ? 15.0f : 255.0f;
        for (size_t i = 0; i < ng; i++) {
            s[i] = f32_to_f16(amp * 0.1f * test_rand(0.2f, 1.0f) * (dt == DTYPE_Q4 ? 8.0f : 0.5f));
            z[i] = f32_to_f16(test_rand(0.3f * qmax, 0.7f * qmax));
        }
        w.data = d;
        w.scales = s;
        w.zeros = z;
        w.group = group;
    }
    return w;
}

static void weight_host_free(weight_t *w)
{
    free((void *)w->data);
    free((void *)w->scales);
    free((void *)w->zeros);
}

/* The weight as each backend reads it: placed with weight_upload (in place on the CPU). */
typedef struct wtwin {
    weight_t host, r, x;
} wtwin_t;

static wtwin_t wtwin_new(bpair_t *p, weight_t host)
{
    wtwin_t w = {host, host, host};
    ck_assert_int_eq(p->ref->ops->weight_upload(p->ref->ctx, &w.r), 0);
    int e = p->x->ops->weight_upload(p->x->ctx, &w.x);
    ck_assert_msg(e == 0, "weight_upload on %s: %s", p->name, river_err_detail());
    return w;
}

#define BOTH(p, call_r, call_x)                                                              \
    do {                                                                                     \
        int er_ = (call_r);                                                                  \
        ck_assert_msg(er_ == 0, "reference: %s", river_err_detail());                        \
        int ex_ = (call_x);                                                                  \
        ck_assert_msg(ex_ == 0, "%s: %s", (p)->name, river_err_detail());                    \
    } while (0)

#define OR(p) (p)->ref->ops, (p)->ref->ctx
#define OX(p) (p)->x->ops, (p)->x->ctx

/* ---- the cases ------------------------------------------------------------------------- */

typedef struct op_case op_case_t;
struct op_case {
    const char *name;
    void (*run)(bpair_t *p, const op_case_t *c);
    dtype_t dt;
    int a, b, c, d; /* the case's shape; each run says what they are */
    double tol;     /* CUDA */
    int gpu_only;   /* real model shapes too large to be worth the CPU's time twice */
};

/* matmul: a outputs, b inputs, c rows, d group. */
static void run_matmul(bpair_t *p, const op_case_t *c)
{
    wtwin_t w = wtwin_new(p, weight_rand(c->dt, c->a, c->b, c->d, 0.05f));
    twin_t x = twin_rand(p, (size_t)c->c * c->b, -1, 1);
    twin_t y = twin_new(p, NULL, (size_t)c->c * c->a);
    BOTH(p, p->ref->ops->matmul(p->ref->ctx, y.r, x.r, &w.r, c->c),
         p->x->ops->matmul(p->x->ctx, y.x, x.x, &w.x, c->c));
    check_twin(p, &y, c->tol, c->name);
    twin_free(p, &x);
    twin_free(p, &y);
    weight_host_free(&w.host);
}

/* embed: a vocab, b dim, c tokens. */
static void run_embed(bpair_t *p, const op_case_t *c)
{
    wtwin_t w = wtwin_new(p, weight_rand(c->dt, c->a, c->b, 64, 0.5f));
    int32_t *tok = malloc(sizeof *tok * (size_t)c->c);
    for (int i = 0; i < c->c; i++)
        tok[i] = (int32_t)(test_rand_u32() % (uint32_t)c->a);
    tok[0] = c->a - 1;
    twin_t out = twin_new(p, NULL, (size_t)c->c * c->b);
    BOTH(p, p->ref->ops->embed(p->ref->ctx, out.r, &w.r, tok, c->c),
         p->x->ops->embed(p->x->ctx, out.x, &w.x, tok, c->c));
    check_twin(p, &out, c->tol, c->name);
    int32_t bad = c->a;
    ck_assert_int_eq(p->x->ops->embed(p->x->ctx, out.x, &w.x, &bad, 1), RIVER_ERANGE);
    twin_free(p, &out);
    free(tok);
    weight_host_free(&w.host);
}

/* rmsnorm (in place too), add_bias, add: a rows, b width. */
static void run_norm_add(bpair_t *p, const op_case_t *c)
{
    int n = c->a, d = c->b;
    wtwin_t w = wtwin_new(p, weight_rand(c->dt, 1, d, 0, 1.0f));
    twin_t x = twin_rand(p, (size_t)n * d, -2, 2), out = twin_new(p, NULL, (size_t)n * d);
    char what[96];
    BOTH(p, p->ref->ops->rmsnorm(p->ref->ctx, out.r, x.r, &w.r, n, d, 1e-5f),
         p->x->ops->rmsnorm(p->x->ctx, out.x, x.x, &w.x, n, d, 1e-5f));
    snprintf(what, sizeof what, "%s rmsnorm", c->name);
    check_twin(p, &out, c->tol, what);
    BOTH(p, p->ref->ops->rmsnorm(p->ref->ctx, x.r, x.r, &w.r, n, d, 1e-5f),
         p->x->ops->rmsnorm(p->x->ctx, x.x, x.x, &w.x, n, d, 1e-5f));
    snprintf(what, sizeof what, "%s rmsnorm in place", c->name);
    check_twin(p, &x, c->tol, what);
    BOTH(p, p->ref->ops->add_bias(p->ref->ctx, out.r, &w.r, n, d),
         p->x->ops->add_bias(p->x->ctx, out.x, &w.x, n, d));
    snprintf(what, sizeof what, "%s add_bias", c->name);
    check_twin(p, &out, c->tol, what);
    BOTH(p, p->ref->ops->add(p->ref->ctx, out.r, x.r, (size_t)n * d),
         p->x->ops->add(p->x->ctx, out.x, x.x, (size_t)n * d));
    snprintf(what, sizeof what, "%s add", c->name);
    check_twin(p, &out, c->tol, what);
    twin_free(p, &x);
    twin_free(p, &out);
    weight_host_free(&w.host);
}

/* rope: a rows, b heads, c head_dim, d rot_dim; both layouts, positions past 1k. */
static void run_rope(bpair_t *p, const op_case_t *c)
{
    int n = c->a, heads = c->b, hd = c->c, rot = c->d;
    int32_t *pos = malloc(sizeof *pos * (size_t)n);
    for (int i = 0; i < n; i++)
        pos[i] = i * 397 % 4096;
    float *inv = malloc(sizeof *inv * (size_t)(rot / 2));
    for (int f = 0; f < rot / 2; f++)
        inv[f] = powf(500000.0f, -2.0f * (float)f / (float)rot);
    for (int layout = 0; layout < 2; layout++) {
        rope_t r = {.layout = (rope_layout_t)layout, .head_dim = hd, .rot_dim = rot,
                    .inv_freq = inv, .attn_factor = rot < hd ? 1.2f : 1.0f};
        twin_t x = twin_rand(p, (size_t)n * heads * hd, -1, 1);
        BOTH(p, p->ref->ops->rope(p->ref->ctx, x.r, pos, n, heads, &r),
             p->x->ops->rope(p->x->ctx, x.x, pos, n, heads, &r));
        char what[96];
        snprintf(what, sizeof what, "%s layout %d", c->name, layout);
        check_twin(p, &x, c->tol, what);
        twin_free(p, &x);
    }
    free(pos);
    free(inv);
}

/* swiglu over a fused gate_up row: a rows, b width. */
static void run_swiglu(bpair_t *p, const op_case_t *c)
{
    int n = c->a, d = c->b;
    twin_t gu = twin_rand(p, (size_t)n * 2 * d, -4, 4), out = twin_new(p, NULL, (size_t)n * d);
    BOTH(p, p->ref->ops->swiglu(p->ref->ctx, out.r, gu.r, (float *)gu.r + d, n, d, 2 * d),
         p->x->ops->swiglu(p->x->ctx, out.x, gu.x, (float *)gu.x + d, n, d, 2 * d));
    check_twin(p, &out, c->tol, c->name);
    twin_free(p, &gu);
    twin_free(p, &out);
}

/* kv_write and attention: a head_dim, b KV heads, c GQA group (query heads per KV head),
 * d context of the long sequence. Sequence A (d positions) and B (40) are written in one
 * kv_write of every position; then one batched call: a prompt chunk of A's last 37
 * positions, B's last 3 and decode rows of both (42 rows, not a multiple of 8); then 5
 * decode rows with out aliasing q; then a kv_valid mask. */
static void run_attention(bpair_t *p, const op_case_t *c)
{
    enum { PS = 16, LAYERS = 2, LEN_B = 40, CHUNK = 37 };
    int hd = c->a, kvh = c->b, h = c->b * c->c, len_a = c->d, kv_dim = kvh * hd;
    int pages_a = (len_a + PS - 1) / PS, pages_b = (LEN_B + PS - 1) / PS;
    int n_pages = pages_a + pages_b + 3;
    kv_view_t vr = {.page_size = PS, .kv_dim = kv_dim, .n_pages = n_pages,
                    .layer_stride = (int64_t)PS * kv_dim};
    vr.page_stride = LAYERS * vr.layer_stride;
    size_t kv_elems = (size_t)n_pages * (size_t)vr.page_stride;
    twin_t K = twin_new(p, NULL, kv_elems), V = twin_new(p, NULL, kv_elems);
    kv_view_t vx = vr;
    vr.k = K.r;
    vr.v = V.r;
    vx.k = K.x;
    vx.v = V.x;
    /* Pages handed out in a shuffled order, as a pool does after some churn. */
    int32_t *perm = malloc(sizeof *perm * (size_t)n_pages);
    for (int i = 0; i < n_pages; i++)
        perm[i] = i;
    for (int i = n_pages - 1; i > 0; i--) {
        int j = (int)(test_rand_u32() % (uint32_t)(i + 1));
        int32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    const int32_t *pt_a = perm, *pt_b = perm + pages_a;
    const int layer = 1;
    float scale = 1.0f / sqrtf((float)hd);
    int n = len_a + LEN_B;
    int32_t *pos = malloc(sizeof *pos * (size_t)n);
    const int32_t **pts = malloc(sizeof *pts * (size_t)n);
    for (int i = 0; i < n; i++) {
        pos[i] = i < len_a ? i : i - len_a;
        pts[i] = i < len_a ? pt_a : pt_b;
    }
    attn_batch_t b = {.n = n, .pos = pos, .page_table = pts};
    twin_t k = twin_rand(p, (size_t)n * kv_dim, -1, 1);
    twin_t v = twin_rand(p, (size_t)n * kv_dim, -1, 1);
    BOTH(p, p->ref->ops->kv_write(p->ref->ctx, &vr, layer, &b, k.r, v.r),
         p->x->ops->kv_write(p->x->ctx, &vx, layer, &b, k.x, v.x));
    char what[96];
    snprintf(what, sizeof what, "%s kv_write K", c->name);
    check_twin(p, &K, 0, what);
    snprintf(what, sizeof what, "%s kv_write V", c->name);
    check_twin(p, &V, 0, what);

    /* The batched call: A's prompt chunk, B's last three, both of their last positions. */
    int nb = CHUNK + 3 + 2;
    int32_t *bpos = malloc(sizeof *bpos * (size_t)nb);
    const int32_t **bpt = malloc(sizeof *bpt * (size_t)nb);
    int r = 0;
    for (int i = 0; i < CHUNK; i++, r++) {
        bpos[r] = len_a - CHUNK - 1 + i;
        bpt[r] = pt_a;
    }
    for (int i = 0; i < 3; i++, r++) {
        bpos[r] = LEN_B - 4 + i;
        bpt[r] = pt_b;
    }
    bpos[r] = len_a - 1;
    bpt[r++] = pt_a;
    bpos[r] = LEN_B - 1;
    bpt[r++] = pt_b;
    attn_batch_t bb = {.n = nb, .pos = bpos, .page_table = bpt};
    twin_t q = twin_rand(p, (size_t)nb * h * hd, -3, 3);
    twin_t o = twin_new(p, NULL, (size_t)nb * h * hd);
    BOTH(p, p->ref->ops->attention(p->ref->ctx, o.r, q.r, &vr, layer, &bb, h, kvh, hd, scale),
         p->x->ops->attention(p->x->ctx, o.x, q.x, &vx, layer, &bb, h, kvh, hd, scale));
    snprintf(what, sizeof what, "%s batched %d rows", c->name, nb);
    check_twin(p, &o, c->tol, what);

    /* Five decode rows, out aliasing q. */
    int32_t dpos[5] = {len_a - 1, LEN_B - 1, len_a / 2, 0, len_a - 17};
    const int32_t *dpt[5] = {pt_a, pt_b, pt_a, pt_b, pt_a};
    attn_batch_t db = {.n = 5, .pos = dpos, .page_table = dpt};
    twin_t dq = twin_rand(p, (size_t)5 * h * hd, -3, 3);
    BOTH(p, p->ref->ops->attention(p->ref->ctx, dq.r, dq.r, &vr, layer, &db, h, kvh, hd, scale),
         p->x->ops->attention(p->x->ctx, dq.x, dq.x, &vx, layer, &db, h, kvh, hd, scale));
    snprintf(what, sizeof what, "%s decode 5 in place", c->name);
    check_twin(p, &dq, c->tol, what);

    /* kv_valid: A skips every third slot; B's row has every slot masked. */
    int stride = len_a + 16;
    uint8_t *va = calloc((size_t)LAYERS * stride, 1), *vb = calloc((size_t)LAYERS * stride, 1);
    for (int t = 0; t < stride; t++)
        va[layer * stride + t] = t % 3 != 1;
    const uint8_t *maps[5] = {va, vb, va, vb, va};
    db.kv_valid = maps;
    db.kv_valid_stride = stride;
    twin_t mq = twin_rand(p, (size_t)5 * h * hd, -3, 3);
    twin_t mo = twin_new(p, NULL, (size_t)5 * h * hd);
    BOTH(p, p->ref->ops->attention(p->ref->ctx, mo.r, mq.r, &vr, layer, &db, h, kvh, hd, scale),
         p->x->ops->attention(p->x->ctx, mo.x, mq.x, &vx, layer, &db, h, kvh, hd, scale));
    snprintf(what, sizeof what, "%s kv_valid", c->name);
    check_twin(p, &mo, c->tol, what);

    /* A page outside the pool is refused. */
    int32_t bad_pt[1] = {n_pages};
    const int32_t *badt[1] = {bad_pt};
    int32_t zero[1] = {0};
    attn_batch_t bad = {.n = 1, .pos = zero, .page_table = badt};
    ck_assert_int_eq(p->x->ops->attention(p->x->ctx, mo.x, mq.x, &vx, layer, &bad, h, kvh, hd,
                                          scale), RIVER_ERANGE);
    free(va);
    free(vb);
    free(pos);
    free(pts);
    free(bpos);
    free(bpt);
    free(perm);
    twin_t *all[] = {&K, &V, &k, &v, &q, &o, &dq, &mq, &mo};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        twin_free(p, all[i]);
}

/* cosine, gather_rows, scatter_rows: a rows, b width. */
static void run_rows(bpair_t *p, const op_case_t *c)
{
    int n = c->a, d = c->b;
    twin_t a = twin_rand(p, (size_t)n * d, -1, 1), b = twin_rand(p, (size_t)n * d, -1, 1);
    /* Row 1 of a is zero: cosine 0 on both. */
    float *zero = calloc((size_t)d, sizeof *zero);
    ck_assert_int_eq(p->ref->ops->from_host(p->ref->ctx, a.r, (size_t)d, zero, (size_t)d), 0);
    ck_assert_int_eq(p->x->ops->from_host(p->x->ctx, a.x, (size_t)d, zero, (size_t)d), 0);
    float *cr = malloc(sizeof *cr * (size_t)n), *cx = malloc(sizeof *cx * (size_t)n);
    BOTH(p, p->ref->ops->cosine(p->ref->ctx, cr, a.r, b.r, n, d),
         p->x->ops->cosine(p->x->ctx, cx, a.x, b.x, n, d));
    char what[96];
    snprintf(what, sizeof what, "%s cosine", c->name);
    /* Cosines are in [-1, 1]: an absolute tolerance. */
    check_host(p, cr, cx, (size_t)n, 1e-5, what);
    ck_assert(cx[1] == 0.0f);
    int m = n / 2 + 1;
    int32_t *idx = malloc(sizeof *idx * (size_t)m);
    for (int i = 0; i < m; i++)
        idx[i] = (int32_t)((i * 7 + 3) % n);
    twin_t g = twin_new(p, NULL, (size_t)m * d);
    BOTH(p, p->ref->ops->gather_rows(p->ref->ctx, g.r, a.r, idx, m, d),
         p->x->ops->gather_rows(p->x->ctx, g.x, a.x, idx, m, d));
    snprintf(what, sizeof what, "%s gather_rows", c->name);
    check_twin(p, &g, 0, what);
    BOTH(p, p->ref->ops->scatter_rows(p->ref->ctx, b.r, g.r, idx, m, d),
         p->x->ops->scatter_rows(p->x->ctx, b.x, g.x, idx, m, d));
    snprintf(what, sizeof what, "%s scatter_rows", c->name);
    check_twin(p, &b, 0, what);
    int32_t bad = -1;
    ck_assert_int_eq(p->x->ops->gather_rows(p->x->ctx, g.x, a.x, &bad, 1, d), RIVER_ERANGE);
    free(zero);
    free(cr);
    free(cx);
    free(idx);
    twin_free(p, &a);
    twin_free(p, &b);
    twin_free(p, &g);
}

/* router_prob: a rows in the buffer, b width, c hidden units; scored through a row list
 * (every other row, backwards: not a multiple of 8) and over all rows. */
static void run_router(bpair_t *p, const op_case_t *c)
{
    int n = c->a, d = c->b, hid = c->c;
    wtwin_t norm = wtwin_new(p, weight_rand(DTYPE_F32, 1, d, 0, 1.0f));
    wtwin_t down = wtwin_new(p, weight_rand(DTYPE_F32, hid, d, 0, 0.1f));
    wtwin_t up = wtwin_new(p, weight_rand(DTYPE_F32, 1, hid, 0, 1.0f));
    router_weights_t wr = {norm.r, down.r, up.r, 1e-5f}, wx = {norm.x, down.x, up.x, 1e-5f};
    twin_t x = twin_rand(p, (size_t)n * d, -2, 2);
    int m = (n + 1) / 2;
    int32_t *rows = malloc(sizeof *rows * (size_t)m);
    for (int i = 0; i < m; i++)
        rows[i] = n - 1 - 2 * i;
    float *pr = malloc(sizeof *pr * (size_t)n), *px = malloc(sizeof *px * (size_t)n);
    BOTH(p, p->ref->ops->router_prob(p->ref->ctx, pr, x.r, &wr, rows, m),
         p->x->ops->router_prob(p->x->ctx, px, x.x, &wx, rows, m));
    char what[96];
    snprintf(what, sizeof what, "%s %d listed rows", c->name, m);
    check_host(p, pr, px, (size_t)m, c->tol, what);
    BOTH(p, p->ref->ops->router_prob(p->ref->ctx, pr, x.r, &wr, NULL, n),
         p->x->ops->router_prob(p->x->ctx, px, x.x, &wx, NULL, n));
    snprintf(what, sizeof what, "%s all %d rows", c->name, n);
    check_host(p, pr, px, (size_t)n, c->tol, what);
    for (int i = 0; i < n; i++)
        ck_assert(px[i] >= 0.0f && px[i] <= 1.0f);
    /* A weight of the wrong type is refused. */
    router_weights_t bad = wx;
    bad.down.dtype = DTYPE_BF16;
    ck_assert_int_ne(p->x->ops->router_prob(p->x->ctx, px, x.x, &bad, NULL, 1), 0);
    free(rows);
    free(pr);
    free(px);
    twin_free(p, &x);
    weight_host_free(&norm.host);
    weight_host_free(&down.host);
    weight_host_free(&up.host);
}

#define CASE(name, run, dt, a, b, c, d, tol) {name, run, dt, a, b, c, d, tol, 0}
#define GPU_CASE(name, run, dt, a, b, c, d, tol) {name, run, dt, a, b, c, d, tol, 1}

static const op_case_t cases[] = {
    /* matmul: every weight type; GEMV-sized and batched row counts, none a multiple of 8
     * except where a kernel's 8-row pass is the point. */
    CASE("matmul f32 (96, 256) n 1", run_matmul, DTYPE_F32, 96, 256, 1, 0, 1e-4),
    CASE("matmul f32 (300, 512) n 13", run_matmul, DTYPE_F32, 300, 512, 13, 0, 1e-4),
    CASE("matmul f16 (256, 512) n 5", run_matmul, DTYPE_F16, 256, 512, 5, 0, 1e-4),
    CASE("matmul f16 (256, 512) n 9", run_matmul, DTYPE_F16, 256, 512, 9, 0, 2e-3),
    CASE("matmul bf16 (512, 384) n 3", run_matmul, DTYPE_BF16, 512, 384, 3, 0, 1e-4),
    CASE("matmul bf16 (384, 1024) n 8", run_matmul, DTYPE_BF16, 384, 1024, 8, 0, 1e-4),
    CASE("matmul bf16 (384, 1024) n 33", run_matmul, DTYPE_BF16, 384, 1024, 33, 0, 1e-2),
    CASE("matmul q8 g64 (256, 512) n 1", run_matmul, DTYPE_Q8, 256, 512, 1, 64, 1e-4),
    CASE("matmul q8 g32 (200, 384) n 11", run_matmul, DTYPE_Q8, 200, 384, 11, 32, 1e-4),
    CASE("matmul q4 g32 (256, 512) n 3", run_matmul, DTYPE_Q4, 256, 512, 3, 32, 1e-4),
    CASE("matmul q4 g128 (512, 1024) n 20", run_matmul, DTYPE_Q4, 512, 1024, 20, 128, 1e-4),
    CASE("matmul q4 g6 (33, 96) n 2", run_matmul, DTYPE_Q4, 33, 96, 2, 6, 1e-4),
    /* Llama 3.2 1B projection shapes (dim 2048, FFN 8192), GEMV and cuBLAS paths. */
    CASE("matmul f32 (2048, 2048) n 1", run_matmul, DTYPE_F32, 2048, 2048, 1, 0, 1e-4),
    GPU_CASE("matmul f32 (2048, 2048) n 64", run_matmul, DTYPE_F32, 2048, 2048, 64, 0, 1e-4),
    CASE("matmul f16 (2048, 2048) n 4", run_matmul, DTYPE_F16, 2048, 2048, 4, 0, 1e-4),
    GPU_CASE("matmul f16 (2048, 2048) n 9", run_matmul, DTYPE_F16, 2048, 2048, 9, 0, 2e-3),
    CASE("matmul bf16 (8192, 2048) n 1", run_matmul, DTYPE_BF16, 8192, 2048, 1, 0, 1e-4),
    CASE("matmul bf16 (2048, 8192) n 2", run_matmul, DTYPE_BF16, 2048, 8192, 2, 0, 1e-4),
    GPU_CASE("matmul bf16 (8192, 2048) n 33", run_matmul, DTYPE_BF16, 8192, 2048, 33, 0, 1e-2),
    CASE("matmul q8 g64 (2048, 2048) n 1", run_matmul, DTYPE_Q8, 2048, 2048, 1, 64, 1e-4),
    CASE("matmul q4 g128 (8192, 2048) n 8", run_matmul, DTYPE_Q4, 8192, 2048, 8, 128, 1e-4),
    GPU_CASE("matmul q4 g64 (2048, 2048) n 20", run_matmul, DTYPE_Q4, 2048, 2048, 20, 64, 1e-4),
    /* The LM head of Llama 3.2 1B. */
    GPU_CASE("matmul bf16 (128256, 2048) n 1", run_matmul, DTYPE_BF16, 128256, 2048, 1, 0,
             1e-4),
    GPU_CASE("matmul bf16 (128256, 2048) n 16", run_matmul, DTYPE_BF16, 128256, 2048, 16, 0,
             1e-2),
    /* embed */
    CASE("embed f32", run_embed, DTYPE_F32, 1000, 256, 7, 0, 0),
    CASE("embed bf16", run_embed, DTYPE_BF16, 1000, 256, 7, 0, 0),
    CASE("embed f16", run_embed, DTYPE_F16, 1000, 256, 7, 0, 0),
    CASE("embed q8", run_embed, DTYPE_Q8, 1000, 256, 7, 0, 0),
    CASE("embed q4", run_embed, DTYPE_Q4, 1000, 256, 7, 0, 0),
    GPU_CASE("embed bf16 32000x2048", run_embed, DTYPE_BF16, 32000, 2048, 5, 0, 0),
    GPU_CASE("embed q4 32000x2048", run_embed, DTYPE_Q4, 32000, 2048, 5, 0, 0),
    /* rmsnorm, add_bias, add */
    CASE("norm f32 5x2048", run_norm_add, DTYPE_F32, 5, 2048, 0, 0, 1e-5),
    CASE("norm bf16 13x768", run_norm_add, DTYPE_BF16, 13, 768, 0, 0, 1e-5),
    CASE("norm f16 3x96", run_norm_add, DTYPE_F16, 3, 96, 0, 0, 1e-5),
    /* rope: head dims 64, 96, 128; partial rotary */
    CASE("rope hd 64", run_rope, DTYPE_F32, 7, 8, 64, 64, 1e-5),
    CASE("rope hd 96", run_rope, DTYPE_F32, 5, 6, 96, 96, 1e-5),
    CASE("rope hd 128 rot 64", run_rope, DTYPE_F32, 3, 4, 128, 64, 1e-5),
    CASE("rope hd 128", run_rope, DTYPE_F32, 9, 4, 128, 128, 1e-5),
    /* swiglu */
    CASE("swiglu 5x1536", run_swiglu, DTYPE_F32, 5, 1536, 0, 0, 1e-5),
    CASE("swiglu 1x8192", run_swiglu, DTYPE_F32, 1, 8192, 0, 0, 1e-5),
    /* kv_write + attention: head dim, KV heads, GQA group, long context */
    CASE("attention hd 64 gqa 8 ctx 1100", run_attention, DTYPE_F32, 64, 2, 8, 1100, 1e-4),
    CASE("attention hd 64 gqa 1 ctx 300", run_attention, DTYPE_F32, 64, 4, 1, 300, 1e-4),
    CASE("attention hd 96 gqa 1 ctx 1030", run_attention, DTYPE_F32, 96, 3, 1, 1030, 1e-4),
    CASE("attention hd 128 gqa 8 ctx 1300", run_attention, DTYPE_F32, 128, 1, 8, 1300, 1e-4),
    CASE("attention hd 128 gqa 1 ctx 200", run_attention, DTYPE_F32, 128, 2, 1, 200, 1e-4),
    /* Llama 3.2 1B: 32 heads of 64 over 8 KV heads. */
    GPU_CASE("attention hd 64 gqa 4 ctx 1500", run_attention, DTYPE_F32, 64, 8, 4, 1500, 1e-4),
    /* cosine, gather, scatter */
    CASE("rows 13x2048", run_rows, DTYPE_F32, 13, 2048, 0, 0, 0),
    CASE("rows 6x96", run_rows, DTYPE_F32, 6, 96, 0, 0, 0),
    /* the router */
    CASE("router d 288 h 128", run_router, DTYPE_F32, 13, 288, 128, 0, 1e-5),
    CASE("router d 2048 h 128", run_router, DTYPE_F32, 9, 2048, 128, 0, 1e-5),
    CASE("router d 100 h 16", run_router, DTYPE_F32, 3, 100, 16, 0, 1e-5),
};
#define N_CASES ((int)(sizeof cases / sizeof cases[0]))

/* The least tolerance of case c on SIMD pair p: the levels sum in other orders than the
 * scalar one, and against Q4/Q8 weights they may take x as 8-bit blocks (the AVX2 decode
 * path; its bound is tests/test_ops.c's), which stays under 2e-2 relative here. */
static double simd_floor(const bpair_t *p, const op_case_t *c)
{
    if (p->level >= 0 && c->run == run_matmul &&
        (c->dt == DTYPE_Q4 || c->dt == DTYPE_Q8))
        return 2e-2;
    return 1e-4;
}

/* Case _i on every backend pair there is (the real model shapes on the GPU only). */
START_TEST(test_op_case)
{
    const op_case_t *c = &cases[_i];
    for (int k = 0; k < N_PAIRS; k++) {
        bpair_t p;
        if ((c->gpu_only && k != 1) || !bpair_open(&p, k))
            continue;
        if (p.level >= 0)
            p.floor = simd_floor(&p, c);
        test_rand_seed(TEST_RAND_SEED + (uint64_t)_i);
        c->run(&p, c);
        bpair_close(&p);
    }
}
END_TEST

/* The one line that says the CUDA column is not run here. */
START_TEST(test_backends_present)
{
    bpair_t p;
    ck_assert(bpair_open(&p, 0));
    bpair_close(&p);
    for (int k = 2; k < N_PAIRS; k++) {
        if (bpair_open(&p, k))
            bpair_close(&p);
        else
            printf("no %s on this processor: its column of the op tests is skipped\n",
                   cpu_simd_name((cpu_simd_t)bpair_level(k)));
    }
    if (bpair_open(&p, 1)) {
        printf("op tests run on: opaque, cuda (%d cases)\n", N_CASES);
        bpair_close(&p);
    } else {
#ifdef RIVER_CUDA
        printf("%s (no GPU)\n", CUDA_SKIP_LINE);
#else
        printf("%s (built without the CUDA backend)\n", CUDA_SKIP_LINE);
#endif
    }
}
END_TEST

static Suite *backend_ops_suite(void)
{
    Suite *s = suite_create("backend_ops");
    TCase *tc = tcase_create("ops");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_backends_present);
    tcase_add_loop_test(tc, test_op_case, 0, N_CASES);
    suite_add_tcase(s, tc);
    return s;
}

RIVER_TEST_MAIN(backend_ops_suite)
