/* Shared helpers for the Check suites. Every test binary runs from the repository root and
 * finds its data under tests/data/. */
#ifndef RIVER_TESTS_TESTUTIL_H
#define RIVER_TESTS_TESTUTIL_H

#include <check.h>
#include <stddef.h>
#include <stdio.h>
#include <stdint.h>

#include "model/model.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu.h"

#define TEST_DATA "tests/data"

/* One main per test binary: runs the suite built by `suite_fn` and fails the process when
 * any check fails. */
#define RIVER_TEST_MAIN(suite_fn)                                      \
    int main(void)                                                     \
    {                                                                  \
        SRunner *sr = srunner_create(suite_fn());                      \
        srunner_run_all(sr, CK_NORMAL);                                \
        int failed = srunner_ntests_failed(sr);                        \
        srunner_free(sr);                                              \
        return failed == 0 ? 0 : 1;                                    \
    }

/* A suite, or a column of one, that cannot run here says so in one line that
 * scripts/run-tests.sh collects into the list that ends `make test`:
 *     SKIP (<reason>): <what is missing, and what was found>
 * Under CI=true a skip fails the run unless its reason is one of the three a machine may
 * lack without the suite being broken: no GPU, no CUDA toolkit (or CUDA=0), and a SIMD level
 * the processor lacks. Any other reason is TEST_SKIP_MISSING, which CI does not accept. */
#define TEST_SKIP_NO_GPU "no-gpu"
#define TEST_SKIP_NO_CUDA "no-cuda"
#define TEST_SKIP_NO_SIMD "no-simd"
#define TEST_SKIP_MISSING "missing"
#define TEST_SKIP(reason, ...)                                                               \
    do {                                                                                     \
        printf("SKIP (%s): ", reason);                                                       \
        printf(__VA_ARGS__);                                                                 \
        printf("\n");                                                                        \
        fflush(stdout);                                                                      \
    } while (0)

/* A reproducible xorshift stream for test data, one per test binary, starting from a fixed
 * seed; test_rand_seed restarts it (a case that wants the same data on every backend). */
void test_rand_seed(uint64_t seed);
uint32_t test_rand_u32(void);
float test_rand(float lo, float hi); /* uniform in [lo, hi), 24 bits */
#define TEST_RAND_SEED 0x9e3779b97f4a7c15ull

/* Reads a whole file; NULL (and *len untouched) when it cannot. Caller frees. */
void *test_read_file(const char *path, size_t *len);
/* Writes len bytes to a fresh file under a per-process temp directory and returns its
 * path (static storage, overwritten by the next call with the same name). */
const char *test_write_tmp(const char *name, const void *data, size_t len);
/* The built binary `name` (river-worker, riverd, ...): <builddir>/bin/<name>, where the
 * test binary itself is <builddir>/tests/<test>. Fails the test when it is not built.
 * Returns one of a few rotating static buffers. */
const char *test_bin(const char *name);
/* A per-process temporary directory, created on first use with a unique name and removed
 * with its contents when the process that created it exits with status 0 (a failing test
 * keeps it, as does RIVER_TEST_KEEP=1). */
const char *test_tmpdir(void);

/* A quantized copy of the checkpoint directory `model` (offline/backbone_quant.h, with the
 * format's defaults: "q8" or "q4", head at 8 bits, one thread) under test_tmpdir(), built on
 * the first call of a process and reused after. Fails the test on error. Returns one of a
 * few rotating static buffers. */
const char *test_quant_backbone(const char *model, const char *format);
/* A model named in a suite's case list: "q8:PATH" and "q4:PATH" are test_quant_backbone of
 * PATH, anything else the path itself. */
const char *test_model_path(const char *spec);

/* The device the engine suites run on: "cpu", or "opaque" when RIVER_TEST_DEVICE=opaque
 * (make test-opaque), the backend whose memory nothing above the op interface may touch,
 * or "cuda" (GPU 0) when RIVER_TEST_DEVICE=cuda (scripts/gpu-check.sh). */
const char *test_device(void);
/* A backend on test_device() (threads and simd apply to the CPU; the opaque backend takes
 * threads and the best level), with m placed on it when m is not NULL. Fails the test on
 * error. Free it with backend_destroy. */
void test_backend_open(backend_t **be, int threads, cpu_simd_t simd, model_t *m);
/* The worker YAML line that puts a river-worker on test_device() ("" on the CPU). */
const char *test_device_yaml(void);

#endif
