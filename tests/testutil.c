#include "tests/testutil.h"
#include "common/err.h"
#include "kernels/backend.h"
#include "kernels/opaque/opaque.h"
#include "offline/backbone_quant.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <limits.h>
#include <ftw.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

void *test_read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    if (fseek(f, 0, SEEK_END) != 0) {
        fclose(f);
        return NULL;
    }
    long n = ftell(f);
    rewind(f);
    char *buf = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (!buf || fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        fclose(f);
        return NULL;
    }
    buf[n] = '\0';
    fclose(f);
    *len = (size_t)n;
    return buf;
}

/* The directory test_tmpdir() made, and the process that made it: only that process removes
 * it, so a forked test that inherited the name leaves its parent's files alone. */
static char testutil__dir[256];
static pid_t testutil__dir_owner;

static int testutil__rm(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    return remove(p);
}

/* A failing check ends the process with a non-zero status; its files (daemon logs, say)
 * stay for whoever reads the failure message that names them. */
static void testutil__rm_tmpdir(int status, void *arg)
{
    (void)arg;
    if (status == 0 && testutil__dir[0] && getpid() == testutil__dir_owner &&
        !getenv("RIVER_TEST_KEEP"))
        nftw(testutil__dir, testutil__rm, 16, FTW_DEPTH | FTW_PHYS);
}

/* mkdtemp rather than a name from the pid: pids repeat (pid_max is often 32768), and a
 * directory left by an earlier run under the same pid would hand its stale files, or an
 * EEXIST, to this one. */
const char *test_tmpdir(void)
{
    if (!testutil__dir[0]) {
        snprintf(testutil__dir, sizeof testutil__dir, "/tmp/river-test-%d-XXXXXX",
                 (int)getpid());
        ck_assert_msg(mkdtemp(testutil__dir) != NULL, "mkdtemp %s failed", testutil__dir);
        testutil__dir_owner = getpid();
        on_exit(testutil__rm_tmpdir, NULL);
    }
    return testutil__dir;
}

const char *test_write_tmp(const char *name, const void *data, size_t len)
{
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", test_tmpdir(), name);
    FILE *f = fopen(path, "wb");
    if (!f)
        return NULL;
    size_t w = fwrite(data, 1, len, f);
    fclose(f);
    return w == len ? path : NULL;
}

const char *test_bin(const char *name)
{
    static char out[8][PATH_MAX];
    static int k;
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    ck_assert_int_gt(n, 0);
    self[n] = '\0';
    for (int i = 0; i < 2; i++) {
        char *slash = strrchr(self, '/');
        ck_assert_ptr_nonnull(slash);
        *slash = '\0';
    }
    char *p = out[k++ % 8];
    snprintf(p, PATH_MAX, "%.3000s/bin/%s", self, name);
    ck_assert_msg(access(p, X_OK) == 0, "%s is not built", p);
    return p;
}

const char *test_device(void)
{
    const char *d = getenv("RIVER_TEST_DEVICE");
    if (d && !strcmp(d, "opaque"))
        return "opaque";
    /* GPU 0, for scripts/gpu-check.sh; a build without the backend fails to open it. */
    if (d && !strcmp(d, "cuda"))
        return "cuda";
    return "cpu";
}

void test_backend_open(backend_t **be, int threads, cpu_simd_t simd, model_t *m)
{
    const char *dev = test_device();
    int e = !strcmp(dev, "cuda")     ? backend_open(be, "cuda", threads, BACKEND_WEIGHTS_COPY)
            : !strcmp(dev, "opaque") ? opaque_backend_new(be, threads, simd)
                                     : cpu_backend_new(be, threads, simd);
    ck_assert_msg(e == 0, "backend %s: %s", test_device(), river_err_detail());
    if (m) {
        e = model_place(m, *be);
        ck_assert_msg(e == 0, "place %s: %s", m->path, river_err_detail());
    }
}

const char *test_device_yaml(void)
{
    return !strcmp(test_device(), "opaque") ? "device: opaque\n"
           : !strcmp(test_device(), "cuda") ? "device: cuda\n"
                                            : "";
}

static uint64_t test__rng = TEST_RAND_SEED;

void test_rand_seed(uint64_t seed)
{
    test__rng = seed;
}

uint32_t test_rand_u32(void)
{
    test__rng ^= test__rng << 13;
    test__rng ^= test__rng >> 7;
    test__rng ^= test__rng << 17;
    return (uint32_t)(test__rng >> 16);
}

float test_rand(float lo, float hi)
{
    return lo + (hi - lo) * (float)(test_rand_u32() & 0xffffff) / (float)0x1000000;
}

const char *test_quant_backbone(const char *model, const char *format)
{
    static char bufs[4][PATH_MAX];
    static int next;
    char *out = bufs[next++ % 4];
    const char *base = strrchr(model, '/');
    base = base ? base + 1 : model;
    snprintf(out, PATH_MAX, "%s/%s-%s", test_tmpdir(), base, format);
    char st_path[PATH_MAX + 32];
    snprintf(st_path, sizeof st_path, "%s/config.json", out);
    struct stat st;
    if (stat(st_path, &st) == 0)
        return out;
    model_t *m = NULL;
    ck_assert_msg(model_load(&m, model) == 0, "%s", river_err_detail());
    backbone_quant_opts_t o;
    ck_assert_int_eq(backbone_quant_opts_for(format, m, &o), 0);
    o.n_threads = 1;
    ck_assert_msg(backbone_quant_build(m, out, &o, NULL, NULL) == 0, "%s: %s", model,
                  river_err_detail());
    model_destroy(&m);
    return out;
}

const char *test_model_path(const char *spec)
{
    if (!strncmp(spec, "q8:", 3) || !strncmp(spec, "q4:", 3)) {
        char fmt[3] = {spec[0], spec[1], 0};
        return test_quant_backbone(spec + 3, fmt);
    }
    return spec;
}
