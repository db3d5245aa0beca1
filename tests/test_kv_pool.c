/* The paged KV pool: page accounting, exhaustion, sequences growing and freeing. */
#include <math.h>
#include <stdlib.h>

#include "common/err.h"
#include "engine/kv_pool.h"
#include "kernels/cpu/cpu.h"
#include "tests/testutil.h"

static backend_t *be;

static void setup(void) { ck_assert_int_eq(cpu_backend_new(&be, 1, CPU_SIMD_COUNT), 0); }
static void teardown(void) { cpu_backend_destroy(&be); }

START_TEST(test_geometry_and_accounting)
{
    kv_pool_t *p;
    ck_assert_int_eq(kv_pool_new(&p, be, 3, 8, 4, 5), 0);
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
    ck_assert_int_eq(kv_pool_new(&p, be, 2, 4, 4, 6), 0);
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
    ck_assert_int_eq(kv_pool_new(&p, be, 2, 4, 4, 3), 0);
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
    ck_assert_int_eq(kv_pool_new(&p, be, 2, 3, 2, 3), 0);
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
    ck_assert_int_eq(kv_pool_new(&p, be, 0, 4, 4, 4), RIVER_EINVAL);
    ck_assert_int_eq(kv_pool_new(&p, be, 2, 4, 0, 4), RIVER_EINVAL);
    ck_assert_ptr_null(p);
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
    suite_add_tcase(s, tc);
    return s;
}

RIVER_TEST_MAIN(kv_suite)
