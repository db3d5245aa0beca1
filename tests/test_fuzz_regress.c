/* Fuzz regressions: every input under fuzz/regress/<target>/ (each one crashed or tripped a
 * sanitizer once) and every seed under fuzz/corpus/<target>/ goes through the same entry
 * point the fuzzer drives. Passing means returning: a crash, a sanitizer report or a leak
 * (in the sanitizer build) fails the suite. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/testutil.h"

/* The targets themselves, compiled into this test rather than into libriver.a: they are
 * test code that happens to be shared with the fuzz binaries (fuzz/libfuzzer.c). */
#include "fuzz/targets.c"

/* Replays every regular file in dir through t; returns how many ran. */
static int replay_dir(const fuzz_target_t *t, const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        size_t len = 0;
        void *data = test_read_file(path, &len);
        if (!data)
            continue; /* a subdirectory */
        t->fn(data, len);
        free(data);
        n++;
    }
    closedir(d);
    return n;
}

START_TEST(test_replay)
{
    const fuzz_target_t *t = &fuzz_targets[_i];
    char dir[512];
    snprintf(dir, sizeof dir, "fuzz/corpus/%s", t->name);
    int seeds = replay_dir(t, dir);
    snprintf(dir, sizeof dir, "fuzz/regress/%s", t->name);
    int regress = replay_dir(t, dir);
    /* Every target has seeds: a missing corpus is a packaging mistake, not a pass. */
    ck_assert_msg(seeds > 0, "%s: no seeds under fuzz/corpus/%s", t->name, t->name);
    printf("fuzz %s: %d seeds, %d regressions replayed\n", t->name, seeds, regress);
}
END_TEST

static Suite *fuzz_regress_suite(void)
{
    Suite *s = suite_create("fuzz_regress");
    TCase *tc = tcase_create("replay");
    tcase_add_loop_test(tc, test_replay, 0, (int)fuzz_n_targets);
    suite_add_tcase(s, tc);
    return s;
}

RIVER_TEST_MAIN(fuzz_regress_suite)
