/* The error table: every code has a distinct message and name, details round-trip. */
#include <string.h>

#include "common/err.h"
#include "tests/testutil.h"

START_TEST(test_messages_distinct)
{
    static const int codes[] = {
#define X(name, value, msg) value,
        RIVER_ERR_TABLE(X)
#undef X
    };
    size_t n = sizeof codes / sizeof codes[0];
    for (size_t i = 0; i < n; i++) {
        ck_assert_int_le(codes[i], 0);
        for (size_t j = i + 1; j < n; j++) {
            ck_assert_int_ne(codes[i], codes[j]);
            ck_assert_str_ne(river_strerror(codes[i]), river_strerror(codes[j]));
        }
    }
    ck_assert_str_eq(river_strerror(-9999), "unknown error");
    ck_assert_str_eq(river_err_name(RIVER_EFORMAT), "RIVER_EFORMAT");
}
END_TEST

START_TEST(test_detail)
{
    river_err_clear();
    ck_assert_str_eq(river_err_detail(), "no detail");
    int e = river_err_set(RIVER_ETRUNC, "%s: %d bytes missing", "x.bin", 12);
    ck_assert_int_eq(e, RIVER_ETRUNC);
    ck_assert_str_eq(river_err_detail(), "x.bin: 12 bytes missing");
}
END_TEST

static Suite *err_suite(void)
{
    Suite *s = suite_create("err");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_messages_distinct);
    tcase_add_test(tc, test_detail);
    suite_add_tcase(s, tc);
    return s;
}

RIVER_TEST_MAIN(err_suite)
