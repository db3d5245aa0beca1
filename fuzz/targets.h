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

/* What fuzz/seeds.c shares with the targets, so that its seeds fit them. */
struct model;
/* Writes the tiny llama2.c model the river, router and pair targets load (always the same
 * bytes). */
int fuzz_tiny_model_write(const char *path);
/* That model, loaded from the per-process directory on first use. */
const struct model *fuzz_tiny(void);
/* The hello a river worker of the tiny model sends (malloc'd, *len bytes). */
uint8_t *fuzz_pair_hello(const struct model *m, int memfd, const char *fingerprint,
                         const char *backend, int threads, size_t *len);

#endif
