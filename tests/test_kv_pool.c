/* The paged KV pool: page accounting, exhaustion, sequences growing and freeing; its
 * element types (kv.dtype: f32, f16, bf16, q8), their bytes, fill, page copies and
 * rounding, and attention over them against an f32 pool at every SIMD level.
 *
 * Tolerances of a 16-bit or 8-bit pool against f32 (stated here, checked below):
 * - a stored value: f16 within 2^-11 of |x| (half an ulp of its 11-bit significand; 2^-25,
 *   half its subnormal step, below 2^-14), bf16
 *   within 2^-8 of |x|, q8 within max|block| / 254 (half a step of its scale);
 * - an attention output, max |out - out_f32| over max |out_f32| on random q, K, V in
 *   [-1, 1]: ATTN_TOL_F16, ATTN_TOL_BF16, ATTN_TOL_Q8. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "engine/kv_pool.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu.h"
#include "kernels/kv_row.h"
#include "kernels/profile.h"
#include "tests/testutil.h"

#define ATTN_TOL_F16 5e-4
#define ATTN_TOL_BF16 5e-3
#define ATTN_TOL_Q8 1e-2

static const dtype_t kv_types[] = {DTYPE_F32, DTYPE_F16, DTYPE_BF16, DTYPE_Q8};
#define N_KV_TYPES ((int)(sizeof kv_types / sizeof kv_types[0]))

static backend_t *be;

static void setup(void) { ck_assert_int_eq(cpu_backend_new(&be, 1, CPU_SIMD_COUNT), 0); }
static void teardown(void) { cpu_backend_destroy(&be); }

START_TEST(test_geometry_and_accounting)
{
    kv_pool_t *p;
    ck_assert_int_eq(kv_pool_new(&p, be, 3, 8, DTYPE_F32, 4, 5), 0);
    const kv_view_t *v = kv_pool_view(p);
    ck_assert_int_eq(v->layer_stride, 4 * 8);
    ck_assert_int_eq(v->page_stride, 3 * 4 * 8);
    ck_assert_int_eq(kv_pool_free_pages(p), 5);
    int32_t pages[5];
    for (int i = 0; i < 5; i++)
        ck_assert_int_eq(kv_pool_alloc_page(p, &pages[i]), 0);
    int32_t extra;
    ck_assert_int_eq(kv_pool_alloc_page(p, &extra), RIVER_EFULL);
    for (int i = 0; i < 5; i++)
        for (int j = i + 1; j < 5; j++)
            ck_assert_int_ne(pages[i], pages[j]);
    kv_pool_free_page(p, pages[2]);
    ck_assert_int_eq(kv_pool_free_pages(p), 1);
    ck_assert_int_eq(kv_pool_alloc_page(p, &extra), 0);
    ck_assert_int_eq(extra, pages[2]);
    kv_pool_destroy(&p);
    ck_assert_ptr_null(p);
}
END_TEST

START_TEST(test_seq_reserve_and_free)
{
    kv_pool_t *p;
    ck_assert_int_eq(kv_pool_new(&p, be, 2, 4, DTYPE_F32, 4, 6), 0);
    kv_seq_t a, b;
    kv_seq_init(&a);
    kv_seq_init(&b);
    ck_assert_int_eq(kv_seq_reserve(&a, p, 1), 0);
    ck_assert_int_eq(a.n_pages, 1);
    ck_assert_int_eq(kv_seq_reserve(&a, p, 4), 0);
    ck_assert_int_eq(a.n_pages, 1);
    ck_assert_int_eq(kv_seq_reserve(&a, p, 9), 0);
    ck_assert_int_eq(a.n_pages, 3);
    ck_assert_int_eq(kv_seq_reserve(&b, p, 12), 0);
    ck_assert_int_eq(kv_pool_free_pages(p), 0);
    /* A failed reservation keeps what the sequence had. */
    ck_assert_int_eq(kv_seq_reserve(&a, p, 13), RIVER_EFULL);
    ck_assert_int_eq(a.n_pages, 3);
    kv_seq_free(&b, p);
    ck_assert_int_eq(kv_pool_free_pages(p), 3);
    ck_assert_int_eq(kv_seq_reserve(&a, p, 13), 0);
    ck_assert_int_eq(a.n_pages, 4);
    kv_seq_free(&a, p);
    ck_assert_int_eq(kv_pool_free_pages(p), 6);
    kv_pool_destroy(&p);
}
END_TEST

/* A page freed twice goes on the free list once and is counted; a page pushed onto a
 * table is the caller's (the prefix cache's shared pages). */
START_TEST(test_double_free_and_push)
{
    kv_pool_t *p;
    ck_assert_int_eq(kv_pool_new(&p, be, 2, 4, DTYPE_F32, 4, 3), 0);
    int32_t a;
    ck_assert_int_eq(kv_pool_alloc_page(p, &a), 0);
    ck_assert(!kv_pool_page_is_free(p, a));
    kv_pool_free_page(p, a);
    ck_assert(kv_pool_page_is_free(p, a));
    kv_pool_free_page(p, a);
    ck_assert_int_eq(kv_pool_free_pages(p), 3);
    ck_assert_int_eq((int)kv_pool_double_frees(p), 1);
    kv_seq_t s;
    kv_seq_init(&s);
    ck_assert_int_eq(kv_pool_alloc_page(p, &a), 0);
    for (int i = 0; i < 20; i++)
        ck_assert_int_eq(kv_seq_push(&s, a), 0);
    ck_assert_int_eq(s.n_pages, 20);
    ck_assert_int_ge(s.cap, 20);
    free(s.pages);
    kv_pool_free_page(p, a);
    ck_assert_int_eq((int)kv_pool_double_frees(p), 1);
    kv_pool_destroy(&p);
}
END_TEST

START_TEST(test_fill)
{
    kv_pool_t *p;
    ck_assert_int_eq(kv_pool_new(&p, be, 2, 3, DTYPE_F32, 2, 3), 0);
    ck_assert_int_eq(kv_pool_fill(p, NAN), 0);
    const kv_view_t *v = kv_pool_view(p);
    size_t n = (size_t)v->page_stride * (size_t)v->n_pages;
    float *h = malloc(n * sizeof *h);
    ck_assert_int_eq(be->ops->to_host(be->ctx, h, v->k, 0, n), 0);
    for (size_t i = 0; i < n; i++)
        ck_assert(isnan(h[i]));
    ck_assert_int_eq(be->ops->to_host(be->ctx, h, v->v, 0, n), 0);
    for (size_t i = 0; i < n; i++)
        ck_assert(isnan(h[i]));
    free(h);
    kv_pool_destroy(&p);
}
END_TEST

START_TEST(test_bad_geometry)
{
    kv_pool_t *p = NULL;
    ck_assert_int_eq(kv_pool_new(&p, be, 0, 4, DTYPE_F32, 4, 4), RIVER_EINVAL);
    ck_assert_int_eq(kv_pool_new(&p, be, 2, 4, DTYPE_F32, 0, 4), RIVER_EINVAL);
    ck_assert_ptr_null(p);
}
END_TEST

/* Bytes per dtype: f16 and bf16 half of f32, q8 a quarter plus one f32 scale per 32
 * values; q8 needs rows of whole blocks and says so naming kv.dtype. */
START_TEST(test_dtype_bytes)
{
    size_t f32 = kv_pool_shared_bytes(3, 64, DTYPE_F32, 16, 10);
    ck_assert_uint_eq(f32, 2u * 3 * 64 * 16 * 10 * 4);
    ck_assert_uint_eq(kv_pool_shared_bytes(3, 64, DTYPE_F16, 16, 10), f32 / 2);
    ck_assert_uint_eq(kv_pool_shared_bytes(3, 64, DTYPE_BF16, 16, 10), f32 / 2);
    ck_assert_uint_eq(kv_pool_shared_bytes(3, 64, DTYPE_Q8, 16, 10), f32 / 4 + f32 / 32);
    ck_assert_uint_eq(kv_pool_shared_bytes(3, 48, DTYPE_Q8, 16, 10), 0);
    ck_assert_uint_eq(kv_pool_shared_bytes(3, 64, DTYPE_Q4, 16, 10), 0);
    kv_pool_t *p = NULL;
    ck_assert_int_eq(kv_pool_new(&p, be, 2, 48, DTYPE_Q8, 4, 4), RIVER_EINVAL);
    ck_assert_ptr_nonnull(strstr(river_err_detail(), "kv.dtype q8"));
    ck_assert_ptr_null(p);
    ck_assert_int_eq(kv_dtype_check(DTYPE_Q8, 16), RIVER_EINVAL);
    ck_assert_ptr_nonnull(strstr(river_err_detail(), "kv.dtype q8"));
    ck_assert_ptr_nonnull(strstr(river_err_detail(), "head_dim is 16"));
    ck_assert_int_eq(kv_dtype_check(DTYPE_Q8, 64), 0);
    ck_assert_int_eq(kv_dtype_check(DTYPE_F16, 8), 0);
    for (int i = 0; i < N_KV_TYPES; i++) {
        ck_assert_int_eq(kv_pool_new(&p, be, 2, 32, kv_types[i], 4, 3), 0);
        ck_assert_int_eq(kv_pool_dtype(p), kv_types[i]);
        ck_assert_int_eq(kv_pool_view(p)->dtype, kv_types[i]);
        ck_assert(kv_types[i] == DTYPE_Q8 ? kv_pool_view(p)->k_scale != NULL
                                          : kv_pool_view(p)->k_scale == NULL);
        kv_pool_destroy(&p);
    }
}
END_TEST

/* Every element of K (v 0) or V (v 1) of the pool, widened to f32 on the host. */
static float *pool_read(const kv_pool_t *p, int v)
{
    const kv_view_t *kv = kv_pool_view(p);
    int64_t n = kv->page_stride * kv->n_pages;
    size_t codes = kv_dtype_bytes(kv->dtype, n);
    size_t words = (codes + kv_dtype_scale_bytes(kv->dtype, n)) / sizeof(float);
    float *raw = malloc(words * sizeof *raw), *out = malloc((size_t)n * sizeof *out);
    ck_assert(raw && out);
    ck_assert_int_eq(be->ops->to_host(be->ctx, raw, v ? kv->v : kv->k, 0, words), 0);
    kv_row_to_f32(kv->dtype, raw, (const float *)((const char *)raw + codes), 0, out, n);
    free(raw);
    return out;
}

/* A fill reads back as the value in every dtype, NaN included (a q8 block of NaN has a
 * NaN scale). */
START_TEST(test_fill_dtypes)
{
    for (int i = 0; i < N_KV_TYPES; i++) {
        kv_pool_t *p;
        ck_assert_int_eq(kv_pool_new(&p, be, 2, 32, kv_types[i], 2, 3), 0);
        const kv_view_t *v = kv_pool_view(p);
        int64_t n = v->page_stride * v->n_pages;
        const float values[] = {NAN, 0.75f, 0.0f};
        for (int k = 0; k < 3; k++) {
            ck_assert_int_eq(kv_pool_fill(p, values[k]), 0);
            for (int a = 0; a < 2; a++) {
                float *h = pool_read(p, a);
                for (int64_t j = 0; j < n; j++)
                    ck_assert_msg(isnan(values[k]) ? isnan(h[j]) : fabsf(h[j] - values[k]) <= 1e-6f,
                                  "%s fill %g: element %lld reads %g", dtype_name(kv_types[i]),
                                  (double)values[k], (long long)j, (double)h[j]);
                free(h);
            }
        }
        kv_pool_destroy(&p);
    }
}
END_TEST

/* The pages of one sequence of n positions (page size ps) and a batch of its rows. */
typedef struct seq_rows {
    int32_t *table;
    int32_t *pos;
    const int32_t **pts;
} seq_rows_t;

static seq_rows_t seq_rows_new(int n, int ps)
{
    seq_rows_t r = {malloc(sizeof(int32_t) * (size_t)((n + ps - 1) / ps)),
                    malloc(sizeof(int32_t) * (size_t)n), malloc(sizeof(int32_t *) * (size_t)n)};
    /* Pages in reverse order, as a pool hands them out after some churn. */
    for (int i = 0; i < (n + ps - 1) / ps; i++)
        r.table[i] = (n + ps - 1) / ps - 1 - i;
    for (int i = 0; i < n; i++) {
        r.pos[i] = i;
        r.pts[i] = r.table;
    }
    return r;
}

static void seq_rows_free(seq_rows_t *r)
{
    free(r->table);
    free(r->pos);
    free(r->pts);
}

/* kv_write rounds each value to the dtype within the stated bound, and a page copy
 * carries codes and scales. */
START_TEST(test_write_rounding)
{
    enum { L = 2, KVD = 64, PS = 4, N = 10 };
    float *k = malloc(sizeof *k * N * KVD), *v = malloc(sizeof *v * N * KVD);
    for (int j = 0; j < N * KVD; j++) {
        /* Magnitudes from 1e-3 to 30: each block has a different scale. */
        k[j] = test_rand(-1, 1) * powf(10.0f, test_rand(-3, 1.5f));
        v[j] = test_rand(-1, 1);
    }
    seq_rows_t r = seq_rows_new(N, PS);
    attn_batch_t b = {.n = N, .pos = r.pos, .page_table = r.pts};
    for (int i = 0; i < N_KV_TYPES; i++) {
        dtype_t dt = kv_types[i];
        kv_pool_t *p;
        ck_assert_int_eq(kv_pool_new(&p, be, L, KVD, dt, PS, 6), 0);
        ck_assert_int_eq(kv_pool_fill(p, NAN), 0);
        const kv_view_t *kv = kv_pool_view(p);
        void *kb = be->ops->buf_alloc(be->ctx, N * KVD), *vb = be->ops->buf_alloc(be->ctx, N * KVD);
        ck_assert_int_eq(be->ops->from_host(be->ctx, kb, 0, k, N * KVD), 0);
        ck_assert_int_eq(be->ops->from_host(be->ctx, vb, 0, v, N * KVD), 0);
        ck_assert_int_eq(be->ops->kv_write(be->ctx, kv, 1, &b, kb, vb), 0);
        float *h = pool_read(p, 0);
        for (int t = 0; t < N; t++) {
            int64_t off = (int64_t)r.table[t / PS] * kv->page_stride + kv->layer_stride +
                          (t % PS) * KVD;
            for (int j = 0; j < KVD; j++) {
                float x = k[t * KVD + j], y = h[off + j];
                double bound = 0;
                if (dt == DTYPE_F16)
                    bound = fmax(fabs(x) * 0x1p-11, 0x1p-25);
                else if (dt == DTYPE_BF16)
                    bound = fabs(x) * 0x1p-8;
                else if (dt == DTYPE_Q8) {
                    float amax = 0;
                    for (int m = j / 32 * 32; m < j / 32 * 32 + 32; m++)
                        amax = fmaxf(amax, fabsf(k[t * KVD + m]));
                    bound = amax / 254.0 * (1 + 1e-5);
                }
                ck_assert_msg(fabs((double)x - y) <= bound, "%s: position %d, element %d: "
                              "%.9g stored as %.9g (bound %.3g)", dtype_name(dt), t, j,
                              (double)x, (double)y, bound);
            }
        }
        free(h);
        /* The copy of page table[0] over a free page (5) holds the same bits. */
        float *buf = malloc(kv_pool_page_floats(p) * sizeof *buf);
        ck_assert_int_eq(kv_pool_copy_page(p, r.table[0], 5, buf), 0);
        for (int a = 0; a < 2; a++) {
            h = pool_read(p, a);
            ck_assert_int_eq(memcmp(h + (int64_t)5 * kv->page_stride,
                                    h + (int64_t)r.table[0] * kv->page_stride,
                                    (size_t)kv->page_stride * sizeof *h), 0);
            free(h);
        }
        ck_assert_int_eq(kv_pool_copy_page(p, 0, 6, buf), RIVER_ERANGE);
        free(buf);
        be->ops->buf_free(be->ctx, kb);
        be->ops->buf_free(be->ctx, vb);
        kv_pool_destroy(&p);
    }
    seq_rows_free(&r);
    free(k);
    free(v);
}
END_TEST

/* The rows of a prefill of n positions through backend b with a pool of dtype dt: writes
 * K and V for every position, then runs attention for all rows in batches of `batch` rows
 * (the prefill tile path at 16, decode at 1) and returns the outputs, (n, H * HD). */
enum { AT_HD = 64, AT_KVH = 2, AT_G = 3, AT_PS = 16 };
static float *attn_run(backend_t *b, dtype_t dt, const float *q, const float *k,
                       const float *v, int n, int batch)
{
    int H = AT_KVH * AT_G, kvd = AT_KVH * AT_HD, qd = H * AT_HD;
    kv_pool_t *p;
    ck_assert_int_eq(kv_pool_new(&p, b, 2, kvd, dt, AT_PS, (n + AT_PS - 1) / AT_PS + 1), 0);
    ck_assert_int_eq(kv_pool_fill(p, NAN), 0);
    const kv_view_t *kv = kv_pool_view(p);
    seq_rows_t r = seq_rows_new(n, AT_PS);
    attn_batch_t all = {.n = n, .pos = r.pos, .page_table = r.pts};
    const ops_t *o = b->ops;
    void *kb = o->buf_alloc(b->ctx, (size_t)n * kvd), *vb = o->buf_alloc(b->ctx, (size_t)n * kvd);
    void *qb = o->buf_alloc(b->ctx, (size_t)n * qd), *ob = o->buf_alloc(b->ctx, (size_t)n * qd);
    ck_assert(kb && vb && qb && ob);
    ck_assert_int_eq(o->from_host(b->ctx, kb, 0, k, (size_t)n * kvd), 0);
    ck_assert_int_eq(o->from_host(b->ctx, vb, 0, v, (size_t)n * kvd), 0);
    ck_assert_int_eq(o->from_host(b->ctx, qb, 0, q, (size_t)n * qd), 0);
    ck_assert_int_eq(o->kv_write(b->ctx, kv, 1, &all, kb, vb), 0);
    for (int i0 = 0; i0 < n; i0 += batch) {
        attn_batch_t part = {.n = n - i0 < batch ? n - i0 : batch, .pos = r.pos + i0,
                             .page_table = r.pts + i0};
        ck_assert_int_eq(o->attention(b->ctx, (float *)ob + (size_t)i0 * qd,
                                      (const float *)qb + (size_t)i0 * qd, kv, 1, &part, H,
                                      AT_KVH, AT_HD, 1.0f / sqrtf((float)AT_HD)), 0);
    }
    float *out = malloc(sizeof *out * (size_t)n * qd);
    ck_assert_int_eq(o->to_host(b->ctx, out, ob, 0, (size_t)n * qd), 0);
    void *bufs[] = {kb, vb, qb, ob};
    for (int i = 0; i < 4; i++)
        o->buf_free(b->ctx, bufs[i]);
    seq_rows_free(&r);
    kv_pool_destroy(&p);
    return out;
}

static float *rand_floats(size_t n)
{
    float *x = malloc(sizeof *x * n);
    for (size_t i = 0; i < n; i++)
        x[i] = test_rand(-1, 1);
    return x;
}

/* Attention over an f16, bf16 or q8 pool against the same rows over an f32 pool, at every
 * SIMD level this processor has: within ATTN_TOL_*; and every level reads a pool's
 * values the same (the f32 pool: the f32 results of the CPU levels agree to 1e-5). */
START_TEST(test_attention_dtypes)
{
    enum { N = 150 };
    int qd = AT_KVH * AT_G * AT_HD, kvd = AT_KVH * AT_HD;
    float *q = rand_floats((size_t)N * qd), *k = rand_floats((size_t)N * kvd);
    float *v = rand_floats((size_t)N * kvd);
    const double tol[] = {0, ATTN_TOL_F16, ATTN_TOL_BF16, ATTN_TOL_Q8};
    for (int lv = CPU_SIMD_SCALAR; lv < CPU_SIMD_COUNT; lv++) {
        if (lv > (int)cpu_simd_detect())
            continue;
        backend_t *b;
        ck_assert_int_eq(cpu_backend_new(&b, 2, (cpu_simd_t)lv), 0);
        float *ref = attn_run(b, DTYPE_F32, q, k, v, N, 16);
        for (int i = 1; i < N_KV_TYPES; i++) {
            float *out = attn_run(b, kv_types[i], q, k, v, N, 16);
            double m = 0, d = 0;
            for (size_t j = 0; j < (size_t)N * qd; j++) {
                m = fmax(m, fabs(ref[j]));
                double e = fabs((double)out[j] - ref[j]);
                d = e <= d ? d : e; /* NaN wins */
            }
            printf("kv %-5s at %-6s: attention rel err %.3g (tol %.1g)\n",
                   dtype_name(kv_types[i]), cpu_simd_name((cpu_simd_t)lv), d / m, tol[i]);
            ck_assert_msg(d / m <= tol[i], "kv %s at %s: rel err %g above %g",
                          dtype_name(kv_types[i]), cpu_simd_name((cpu_simd_t)lv), d / m,
                          tol[i]);
            free(out);
        }
        free(ref);
        cpu_backend_destroy(&b);
    }
    free(q);
    free(k);
    free(v);
}
END_TEST

/* The rule lossless mode and the prefix cache rest on: a position's output has the same
 * bits whether its row is prefilled in a tile of 16, decoded alone or verified in a batch
 * of 3, in every dtype and at every level. */
START_TEST(test_batch_identity)
{
    enum { N = 70 };
    int qd = AT_KVH * AT_G * AT_HD, kvd = AT_KVH * AT_HD;
    float *q = rand_floats((size_t)N * qd), *k = rand_floats((size_t)N * kvd);
    float *v = rand_floats((size_t)N * kvd);
    for (int lv = CPU_SIMD_SCALAR; lv < CPU_SIMD_COUNT; lv++) {
        if (lv > (int)cpu_simd_detect())
            continue;
        backend_t *b;
        ck_assert_int_eq(cpu_backend_new(&b, 2, (cpu_simd_t)lv), 0);
        for (int i = 0; i < N_KV_TYPES; i++) {
            float *tile = attn_run(b, kv_types[i], q, k, v, N, 16);
            const int batches[] = {1, 3, N};
            for (int bi = 0; bi < 3; bi++) {
                float *other = attn_run(b, kv_types[i], q, k, v, N, batches[bi]);
                for (int r = 0; r < N; r++)
                    ck_assert_msg(memcmp(tile + (size_t)r * qd, other + (size_t)r * qd,
                                         sizeof *tile * (size_t)qd) == 0,
                                  "kv %s at %s: position %d differs in batches of %d and 16",
                                  dtype_name(kv_types[i]), cpu_simd_name((cpu_simd_t)lv), r,
                                  batches[bi]);
                free(other);
            }
            free(tile);
        }
        cpu_backend_destroy(&b);
    }
    free(q);
    free(k);
    free(v);
}
END_TEST

/* The profiler files kv_write and attention under the pool's type with its K and V bytes:
 * the rows written, every row's context read. */
START_TEST(test_profile_kv_bytes)
{
    enum { KVD = 64, N = 5 };
    backend_t *pb;
    ck_assert_int_eq(cpu_backend_new(&pb, 1, CPU_SIMD_COUNT), 0);
    ck_assert_int_eq(profile_attach(pb), 0);
    for (int i = 1; i < N_KV_TYPES; i++) {
        kv_pool_t *p;
        ck_assert_int_eq(kv_pool_new(&p, pb, 1, KVD, kv_types[i], 8, 2), 0);
        seq_rows_t r = seq_rows_new(N, 8);
        attn_batch_t b = {.n = N, .pos = r.pos, .page_table = r.pts};
        void *kb = pb->ops->buf_alloc(pb->ctx, N * KVD), *ob = pb->ops->buf_alloc(pb->ctx, N * KVD);
        ck_assert_int_eq(profile_reset(pb), 0);
        ck_assert_int_eq(pb->ops->kv_write(pb->ctx, kv_pool_view(p), 0, &b, kb, kb), 0);
        ck_assert_int_eq(pb->ops->attention(pb->ctx, ob, kb, kv_pool_view(p), 0, &b, 2, 2, 32,
                                            1.0f), 0);
        const profile_row_t *rows;
        int n_rows;
        double window;
        ck_assert_int_eq(profile_read(pb, &rows, &n_rows, &window), 0);
        ck_assert_int_eq(n_rows, 2);
        /* Bytes of one position's K and V in this type. */
        double pos_bytes = (double)kv_pool_shared_bytes(1, KVD, kv_types[i], 1, 1);
        ck_assert_str_eq(rows[0].op, "kv_write");
        ck_assert_int_eq(rows[0].dtype, kv_types[i]);
        ck_assert_double_eq(rows[0].bytes, N * pos_bytes);
        ck_assert_str_eq(rows[1].op, "attention");
        ck_assert_int_eq(rows[1].dtype, kv_types[i]);
        ck_assert_double_eq(rows[1].bytes, (1 + 2 + 3 + 4 + 5) * pos_bytes);
        pb->ops->buf_free(pb->ctx, kb);
        pb->ops->buf_free(pb->ctx, ob);
        seq_rows_free(&r);
        kv_pool_destroy(&p);
    }
    backend_destroy(&pb);
}
END_TEST

static Suite *kv_suite(void)
{
    Suite *s = suite_create("kv_pool");
    TCase *tc = tcase_create("core");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_geometry_and_accounting);
    tcase_add_test(tc, test_seq_reserve_and_free);
    tcase_add_test(tc, test_double_free_and_push);
    tcase_add_test(tc, test_fill);
    tcase_add_test(tc, test_bad_geometry);
    tcase_add_test(tc, test_dtype_bytes);
    tcase_add_test(tc, test_fill_dtypes);
    tcase_add_test(tc, test_write_rounding);
    tcase_add_test(tc, test_attention_dtypes);
    tcase_add_test(tc, test_batch_identity);
    tcase_add_test(tc, test_profile_kv_bytes);
    suite_add_tcase(s, tc);
    return s;
}

RIVER_TEST_MAIN(kv_suite)
