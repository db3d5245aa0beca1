/* Fuzz entry points, one per parser that reads bytes from outside: each takes an input,
 * runs it through the parser the way the engine or a daemon would, and frees everything.
 * They return normally on any input; a crash, a sanitizer report or a leak is the bug.
 * The libFuzzer binaries (fuzz/libfuzzer.c, `make fuzz`) and the regression suite
 * (tests/test_fuzz_regress.c, which replays fuzz/regress/<target>/) share them. */
#ifndef RIVER_FUZZ_TARGETS_H
#define RIVER_FUZZ_TARGETS_H

#include <stddef.h>
#include <stdint.h>

typedef void (*fuzz_fn_t)(const uint8_t *data, size_t size);

typedef struct {
    const char *name; /* the directory name under fuzz/corpus/ and fuzz/regress/ */
    fuzz_fn_t fn;
} fuzz_target_t;

extern const fuzz_target_t fuzz_targets[];
extern const size_t fuzz_n_targets;

/* The target of that name, or NULL. */
const fuzz_target_t *fuzz_target_find(const char *name);

#endif
