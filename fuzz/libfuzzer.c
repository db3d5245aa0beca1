/* One libFuzzer binary per target: built with -DFUZZ_TARGET=name (Makefile, `make fuzz`). */
#include <stdio.h>
#include <stdlib.h>

#include "fuzz/targets.h"

#ifndef FUZZ_TARGET
#error "build with -DFUZZ_TARGET=<name from fuzz/targets.c>"
#endif
#define FUZZ_STR2(x) #x
#define FUZZ_STR(x) FUZZ_STR2(x)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const fuzz_target_t *t;
    if (!t) {
        t = fuzz_target_find(FUZZ_STR(FUZZ_TARGET));
        if (!t) {
            fprintf(stderr, "fuzz: no target %s\n", FUZZ_STR(FUZZ_TARGET));
            abort();
        }
    }
    t->fn(data, size);
    return 0;
}
