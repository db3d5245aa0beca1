/* Sampling: greedy ties, top-k / top-p filtering, seeds, temperature, bad parameters. */
#include <math.h>
#include <stdlib.h>

#include "common/err.h"
#include "engine/sampler.h"
#include "tests/testutil.h"

START_TEST(test_argmax_ties_lowest)
{
    float l[6] = {0.5f, 2.0f, -1.0f, 2.0f, 2.0f, 1.0f};
    ck_assert_int_eq(sampler_argmax(l, 6), 1);
    sampler_t *s;
    sampler_params_t p = {0};
    ck_assert_int_eq(sampler_new(&s, &p, 6), 0);
    ck_assert_int_eq(sampler_sample(s, l), 1);
    sampler_destroy(&s);
    ck_assert_ptr_null(s);
}
END_TEST

START_TEST(test_top_k_one_is_greedy)
{
    float l[100];
    for (int i = 0; i < 100; i++)
        l[i] = sinf((float)i * 0.37f) * 3;
    int best = sampler_argmax(l, 100);
    sampler_t *s;
    sampler_params_t p = {.temperature = 1.5f, .top_k = 1, .seed = 7};
    ck_assert_int_eq(sampler_new(&s, &p, 100), 0);
    for (int i = 0; i < 200; i++)
        ck_assert_int_eq(sampler_sample(s, l), best);
    sampler_destroy(&s);
}
END_TEST

START_TEST(test_top_k_restricts)
{
    float l[10] = {5, 4, 3, 2, 1, 0, -1, -2, -3, -4};
    sampler_t *s;
    sampler_params_t p = {.temperature = 100.0f, .top_k = 3, .seed = 3};
    ck_assert_int_eq(sampler_new(&s, &p, 10), 0);
    int seen[10] = {0};
    for (int i = 0; i < 3000; i++)
        seen[sampler_sample(s, l)]++;
    for (int i = 3; i < 10; i++)
        ck_assert_int_eq(seen[i], 0);
    for (int i = 0; i < 3; i++)
        ck_assert_int_gt(seen[i], 800); /* nearly uniform at this temperature */
    sampler_destroy(&s);
}
END_TEST

START_TEST(test_top_p_nucleus)
{
    /* Probabilities 0.5, 0.3, 0.15, 0.05: top-p 0.75 keeps the first two only. */
    float l[4] = {logf(0.5f), logf(0.3f), logf(0.15f), logf(0.05f)};
    sampler_t *s;
    sampler_params_t p = {.temperature = 1.0f, .top_p = 0.75f, .seed = 11};
    ck_assert_int_eq(sampler_new(&s, &p, 4), 0);
    int seen[4] = {0};
    for (int i = 0; i < 8000; i++)
        seen[sampler_sample(s, l)]++;
    ck_assert_int_eq(seen[2] + seen[3], 0);
    double frac0 = seen[0] / 8000.0;
    ck_assert_msg(fabs(frac0 - 0.5 / 0.8) < 0.03, "token 0 drawn %.3f", frac0);
    sampler_destroy(&s);
}
END_TEST

START_TEST(test_temperature_distribution)
{
    float l[3] = {1.0f, 0.0f, -1.0f};
    double z = exp(1) + 1 + exp(-1);
    sampler_t *s;
    sampler_params_t p = {.temperature = 1.0f, .seed = 99};
    ck_assert_int_eq(sampler_new(&s, &p, 3), 0);
    int seen[3] = {0};
    int n = 30000;
    for (int i = 0; i < n; i++)
        seen[sampler_sample(s, l)]++;
    for (int i = 0; i < 3; i++) {
        double want = exp(l[i]) / z;
        ck_assert_msg(fabs(seen[i] / (double)n - want) < 0.015, "token %d: %.3f vs %.3f", i,
                      seen[i] / (double)n, want);
    }
    sampler_destroy(&s);
}
END_TEST

START_TEST(test_seed_reproducible)
{
    float l[50];
    for (int i = 0; i < 50; i++)
        l[i] = cosf((float)i);
    sampler_params_t p = {.temperature = 1.0f, .top_p = 0.9f, .seed = 1234};
    sampler_t *a, *b, *c;
    ck_assert_int_eq(sampler_new(&a, &p, 50), 0);
    ck_assert_int_eq(sampler_new(&b, &p, 50), 0);
    p.seed = 4321;
    ck_assert_int_eq(sampler_new(&c, &p, 50), 0);
    int differ = 0;
    for (int i = 0; i < 100; i++) {
        int x = sampler_sample(a, l), y = sampler_sample(b, l), z = sampler_sample(c, l);
        ck_assert_int_eq(x, y);
        differ += x != z;
    }
    ck_assert_int_gt(differ, 0);
    sampler_destroy(&a);
    sampler_destroy(&b);
    sampler_destroy(&c);
}
END_TEST

START_TEST(test_bad_params)
{
    sampler_t *s = NULL;
    sampler_params_t p = {.temperature = -1};
    ck_assert_int_eq(sampler_new(&s, &p, 10), RIVER_EINVAL);
    p = (sampler_params_t){.top_k = -2};
    ck_assert_int_eq(sampler_new(&s, &p, 10), RIVER_EINVAL);
    p = (sampler_params_t){.top_p = 1.5f};
    ck_assert_int_eq(sampler_new(&s, &p, 10), RIVER_EINVAL);
    p = (sampler_params_t){.temperature = NAN};
    ck_assert_int_eq(sampler_new(&s, &p, 10), RIVER_EINVAL);
    p = (sampler_params_t){0};
    ck_assert_int_eq(sampler_new(&s, &p, 0), RIVER_EINVAL);
    ck_assert_ptr_null(s);
}
END_TEST

static Suite *sampler_suite(void)
{
    Suite *s = suite_create("sampler");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_argmax_ties_lowest);
    tcase_add_test(tc, test_top_k_one_is_greedy);
    tcase_add_test(tc, test_top_k_restricts);
    tcase_add_test(tc, test_top_p_nucleus);
    tcase_add_test(tc, test_temperature_distribution);
    tcase_add_test(tc, test_seed_reproducible);
    tcase_add_test(tc, test_bad_params);
    suite_add_tcase(s, tc);
    return s;
}

RIVER_TEST_MAIN(sampler_suite)
