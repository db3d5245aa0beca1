/* The CPU backend's machinery around its ops, at every SIMD level this processor has: the
 * levels themselves (detection, names, RIVER_SIMD), the read-bandwidth sweep, and the Q4X8
 * layout (the repacking, which weights it takes, RIVER_Q4X8), and the two levels' integer
 * kernels at the AVX-512 level (RIVER_X8_LEVEL). The ops themselves, against
 * plain reference loops at every level and thread count, are cases of
 * tests/test_backend_ops.c's one list. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/err.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/q4x8.h"
#include "kernels/cpu/simd.h"
#include "kernels/cpu/x8_pick.h"
#include "kernels/half.h"
#include "kernels/kv_row.h"
#include "tests/testutil.h"

/* A Q4 weight of random codes, scales and zeros (the caller frees data, scales, zeros). */
static weight_t q4_rand(int64_t rows, int64_t cols, int group)
{
    size_t bytes = (size_t)rows * dtype_row_bytes(DTYPE_Q4, cols);
    size_t ng = (size_t)(rows * (cols / group));
    uint8_t *d = malloc(bytes);
    uint16_t *s = malloc(ng * sizeof *s), *z = malloc(ng * sizeof *z);
    ck_assert(d && s && z);
    for (size_t i = 0; i < bytes; i++)
        d[i] = (uint8_t)test_rand_u32();
    for (size_t i = 0; i < ng; i++) {
        s[i] = f32_to_f16(test_rand(0.001f, 0.05f));
        z[i] = f32_to_f16(test_rand(0.0f, 15.0f));
    }
    return (weight_t){.dtype = DTYPE_Q4, .rows = rows, .cols = cols, .data = d, .scales = s,
                      .zeros = z, .group = group};
}

static void q4_free(weight_t *w)
{
    free((void *)w->data);
    free((void *)w->scales);
    free((void *)w->zeros);
}

/* Q4X8, the CPU backend's repacked Q4 (kernels/cpu/q4x8.h), at level _i / 2 with 1 + _i % 2
 * threads: every column lands
 * where cpu_q4x8_byte says, the SIMD levels repack eligible weights when they are placed
 * (the scalar one keeps Q4), and ineligible ones stay Q4. Its matmul is checked by
 * tests/test_backend_ops.c's Q4X8 cases. */
START_TEST(test_q4x8_layout)
{
    int level = _i / 2;
    if (level > (int)cpu_simd_detect())
        return;
    backend_t *be = NULL;
    ck_assert_int_eq(cpu_backend_new(&be, 1 + _i % 2, (cpu_simd_t)level), 0);
    static const int64_t shapes[][3] = { { 8, 256, 32 },  { 37, 512, 64 }, { 13, 768, 128 },
                                         { 9, 1024, 256 }, { 5, 2048, 512 }, { 19, 256, 64 },
                                         { 1, 512, 32 } };
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        weight_t w = q4_rand(shapes[s][0], shapes[s][1], (int)shapes[s][2]);
        ck_assert(cpu_q4x8_eligible(&w));
        size_t rb = dtype_row_bytes(DTYPE_Q4, w.cols), bytes = rb * (size_t)w.rows;
        uint8_t *packed = malloc(bytes);
        ck_assert_ptr_nonnull(packed);
        cpu_q4x8_repack(&w, packed);
        for (int64_t r = 0; r < w.rows; r++)
            for (int64_t k = 0; k < w.cols; k++) {
                const uint8_t *src = (const uint8_t *)w.data + r * (int64_t)rb;
                unsigned q = (k & 1) ? src[k / 2] >> 4 : src[k / 2] & 15;
                int high;
                uint8_t b = packed[r * (int64_t)rb + cpu_q4x8_byte(k, &high)];
                ck_assert_uint_eq(high ? b >> 4 : b & 15, q);
            }
        weight_t up = w;
        ck_assert_int_eq(be->ops->weight_upload(be->ctx, &up), 0);
        ck_assert_int_eq(up.dtype, level >= CPU_SIMD_AVX2 ? DTYPE_Q4X8 : DTYPE_Q4);
        if (up.dtype == DTYPE_Q4X8)
            ck_assert_mem_eq(up.data, packed, bytes);
        free(packed);
        q4_free(&w);
    }
    /* Not eligible: columns that are no multiple of 256, or a group of 96. */
    weight_t w = q4_rand(4, 384, 64);
    ck_assert(!cpu_q4x8_eligible(&w));
    weight_t up = w;
    ck_assert_int_eq(be->ops->weight_upload(be->ctx, &up), 0);
    ck_assert_int_eq(up.dtype, DTYPE_Q4);
    q4_free(&w);
    w = q4_rand(4, 768, 96);
    ck_assert(!cpu_q4x8_eligible(&w));
    q4_free(&w);
    cpu_backend_destroy(&be);
}
END_TEST

START_TEST(test_levels)
{
    cpu_simd_t best = cpu_simd_detect();
    ck_assert_int_lt(best, CPU_SIMD_COUNT);
    ck_assert_str_eq(cpu_simd_name(CPU_SIMD_SCALAR), "scalar");
    ck_assert_str_eq(cpu_simd_name(CPU_SIMD_AVX2), "avx2");
    ck_assert_str_eq(cpu_simd_name(CPU_SIMD_AVX512), "avx512");
    backend_t *be = NULL;
    ck_assert_int_eq(cpu_backend_new(&be, 0, CPU_SIMD_COUNT), 0);
    ck_assert_int_ge(cpu_backend_threads(be), 1);
    ck_assert_str_eq(be->ops->name, "cpu");
    cpu_backend_destroy(&be);
    ck_assert_ptr_null(be);
    cpu_backend_destroy(&be);
    ck_assert_int_eq(cpu_backend_new(&be, -1, CPU_SIMD_COUNT), RIVER_EINVAL);
    ck_assert_ptr_null(be);
    for (int l = 0; l <= CPU_SIMD_COUNT; l++) {
        double bw = cpu_read_bandwidth_gbs(2, (size_t)32 << 20, 2, (cpu_simd_t)l);
        ck_assert_msg(bw > 0.1, "read bandwidth at level %d: %g GB/s", l, bw);
    }
    ck_assert(cpu_read_bandwidth_gbs(0, 1 << 20, 1, CPU_SIMD_COUNT) < 0);
    ck_assert(cpu_read_bandwidth_gbs(2, 1 << 20, 1, (cpu_simd_t)(CPU_SIMD_COUNT + 1)) < 0);
    ck_assert(cpu_read_bandwidth_gbs(2, 1 << 20, 0, CPU_SIMD_COUNT) < 0);
    /* The sweep as an object (river bench pairs its passes with decode steps): each pass
     * times the whole buffer; a refusal allocates nothing and leaves the handle NULL. */
    cpu_sweep_t *sw = (cpu_sweep_t *)&be;
    ck_assert_int_eq(cpu_sweep_new(&sw, 0, 1 << 20, CPU_SIMD_COUNT), RIVER_EINVAL);
    ck_assert_ptr_null(sw);
    ck_assert_int_eq(cpu_sweep_new(&sw, 2, 1024, CPU_SIMD_COUNT), RIVER_EINVAL);
    ck_assert_ptr_null(sw);
    ck_assert_int_eq(cpu_sweep_new(&sw, 2, (size_t)16 << 20, CPU_SIMD_COUNT), 0);
    for (int p = 0; p < 3; p++) {
        double bw = cpu_sweep_pass_gbs(sw);
        ck_assert_msg(bw > 0.1, "sweep pass %d: %g GB/s", p, bw);
    }
    cpu_sweep_destroy(&sw);
    ck_assert_ptr_null(sw);
    cpu_sweep_destroy(&sw);
}
END_TEST

/* cpu_backend_set_simd: a backend placed at the best level and switched to level l gives
 * the bits of a backend made at l (bf16 and Q4X8 weights, one row of x and five), and a
 * level that is not one, or that the processor lacks, is refused with the level left. */
START_TEST(test_set_simd)
{
    cpu_simd_t best = cpu_simd_detect();
    enum { ROWS = 64, COLS = 256, N = 5 };
    test_rand_seed(11);
    uint16_t *codes = malloc(sizeof *codes * ROWS * COLS);
    float *x = malloc(sizeof *x * N * COLS);
    ck_assert(codes && x);
    for (int i = 0; i < ROWS * COLS; i++)
        codes[i] = f32_to_bf16(test_rand(-0.1f, 0.1f));
    for (int i = 0; i < N * COLS; i++)
        x[i] = test_rand(-1.0f, 1.0f);
    weight_t q4 = q4_rand(ROWS, COLS, 32);
    backend_t *top = NULL;
    ck_assert_int_eq(cpu_backend_new(&top, 2, best), 0);
    weight_t wt[2] = {{.dtype = DTYPE_BF16, .rows = ROWS, .cols = COLS, .data = codes}, q4};
    for (int t = 0; t < 2; t++)
        ck_assert_int_eq(top->ops->weight_upload(top->ctx, &wt[t]), 0);
    for (int l = 0; l <= (int)best; l++) {
        backend_t *at = NULL;
        ck_assert_int_eq(cpu_backend_new(&at, 2, (cpu_simd_t)l), 0);
        ck_assert_int_eq(cpu_backend_set_simd(top, (cpu_simd_t)l), 0);
        ck_assert_int_eq(cpu_backend_simd(top), l);
        for (int t = 0; t < 2; t++) {
            weight_t wl = t ? q4 : (weight_t){.dtype = DTYPE_BF16, .rows = ROWS, .cols = COLS,
                                              .data = codes};
            ck_assert_int_eq(at->ops->weight_upload(at->ctx, &wl), 0);
            for (int n = 1; n <= N; n += N - 1) {
                float y[2][N * ROWS];
                backend_t *b[2] = {top, at};
                const weight_t *w[2] = {&wt[t], &wl};
                for (int k = 0; k < 2; k++) {
                    const ops_t *op = b[k]->ops;
                    ops_ctx_t *c = b[k]->ctx;
                    void *xb = op->buf_alloc(c, (size_t)(n * COLS));
                    void *yb = op->buf_alloc(c, (size_t)(n * ROWS));
                    ck_assert(xb && yb);
                    ck_assert_int_eq(op->from_host(c, xb, 0, x, (size_t)(n * COLS)), 0);
                    ck_assert_int_eq(op->matmul(c, yb, xb, w[k], n), 0);
                    ck_assert_int_eq(op->to_host(c, y[k], yb, 0, (size_t)(n * ROWS)), 0);
                    op->buf_free(c, xb);
                    op->buf_free(c, yb);
                }
                ck_assert_msg(memcmp(y[0], y[1], sizeof(float) * (size_t)(n * ROWS)) == 0,
                              "%s switched to %s, n %d: not the bits of a backend made there",
                              t ? "q4" : "bf16", cpu_simd_name((cpu_simd_t)l), n);
            }
        }
        cpu_backend_destroy(&at);
    }
    ck_assert_int_eq(cpu_backend_set_simd(top, CPU_SIMD_COUNT), RIVER_EINVAL);
    ck_assert_int_eq(cpu_backend_simd(top), best);
    ck_assert_int_eq(cpu_backend_set_simd(NULL, CPU_SIMD_SCALAR), RIVER_EINVAL);
    if (best + 1 < CPU_SIMD_COUNT) {
        ck_assert_int_eq(cpu_backend_set_simd(top, (cpu_simd_t)(best + 1)), RIVER_EUNSUPPORTED);
        ck_assert_int_eq(cpu_backend_simd(top), best);
    }
    cpu_backend_destroy(&top);
    q4_free(&q4);
    free(codes);
    free(x);
}
END_TEST

/* The compute peaks prefill is judged against: positive at every level, below what any
 * core could retire (a chain the compiler dropped would time as nearly free), the vector
 * levels well above the portable one, and bad arguments refused. */
START_TEST(test_compute_peak)
{
    cpu_simd_t best = cpu_simd_detect();
    double f32[CPU_SIMD_COUNT] = {0}, i8[CPU_SIMD_COUNT] = {0};
    /* Best of three passes a level, the levels taken in turn each round, so that a busy
     * second on a shared host (another program on one of the two cores reads a pass at
     * 0.55-0.7 of a quiet one) falls on one pass of several levels, not on all of one's. */
    for (int r = 0; r < 3; r++)
        for (int l = 0; l <= (int)best; l++) {
            f32[l] = fmax(f32[l], cpu_peak_gmacs(2, (cpu_simd_t)l, CPU_PEAK_F32, 1));
            i8[l] = fmax(i8[l], cpu_peak_gmacs(2, (cpu_simd_t)l, CPU_PEAK_I8, 1));
        }
    for (int l = 0; l <= (int)best; l++) {
        printf("compute peak, 2 threads, %s: f32 %.1f G multiply-adds/s, int8 %.1f\n",
               cpu_simd_name((cpu_simd_t)l), f32[l], i8[l]);
        ck_assert_msg(f32[l] > 0.1 && f32[l] < 2 * 500.0, "f32 peak at %d: %g", l, f32[l]);
        ck_assert_msg(i8[l] > 0.1 && i8[l] < 2 * 2000.0, "int8 peak at %d: %g", l, i8[l]);
    }
    /* Eight lanes against one: a vector level is far ahead (about 9x here, the sanitizer
     * build included, since the peak's chains are built without it: peak_rounds.h). */
    const double lead = 2.0;
    for (int l = CPU_SIMD_AVX2; l <= (int)best; l++)
        ck_assert_msg(f32[l] > lead * f32[CPU_SIMD_SCALAR], "%s f32 peak %g against scalar %g",
                      cpu_simd_name((cpu_simd_t)l), f32[l], f32[CPU_SIMD_SCALAR]);
    /* The Q8 tile's ceiling: the int8 peak's products plus each block's conversion and
     * scaling, so below that peak (0.35 at AVX2, 0.59-0.78 at AVX-512 with VNNI on the Zen 5
     * VM, by how much of the core the host left it: README, "The Q8 tile's ceiling"); a tile
     * the compiler had emptied would time far above it. None at the portable level. One
     * thread, the two taken in turn as above. */
    for (int l = CPU_SIMD_AVX2; l <= (int)best; l++) {
        double pk = 0.0, tile = 0.0;
        for (int r = 0; r < 3; r++) {
            pk = fmax(pk, cpu_peak_gmacs(1, (cpu_simd_t)l, CPU_PEAK_I8, 1));
            tile = fmax(tile, cpu_peak_gmacs(1, (cpu_simd_t)l, CPU_PEAK_Q8_TILE, 1));
        }
        printf("q8 tile ceiling, 1 thread, %s: %.1f G multiply-adds/s, %.2f of the int8 peak\n",
               cpu_simd_name((cpu_simd_t)l), tile, tile / pk);
        ck_assert_msg(tile > 0.1 && tile < pk, "%s q8 tile %g against int8 peak %g",
                      cpu_simd_name((cpu_simd_t)l), tile, pk);
    }
    ck_assert_int_eq(cpu_peak_gmacs(2, CPU_SIMD_SCALAR, CPU_PEAK_Q8_TILE, 1), RIVER_EUNSUPPORTED);
    ck_assert(cpu_peak_gmacs(0, CPU_SIMD_COUNT, CPU_PEAK_F32, 1) < 0);
    ck_assert(cpu_peak_gmacs(2, (cpu_simd_t)(CPU_SIMD_COUNT + 1), CPU_PEAK_F32, 1) < 0);
    ck_assert(cpu_peak_gmacs(2, CPU_SIMD_COUNT, (cpu_peak_t)7, 1) < 0);
    ck_assert(cpu_peak_gmacs(2, CPU_SIMD_COUNT, CPU_PEAK_I8, 0) < 0);
}
END_TEST

/* The exit code of body(value) run in a child process after setting the environment
 * variable `name` to value: the variables the backend reads once per process are tested
 * each in a fresh one. */
static int env_child(const char *name, const char *value, int (*body)(const char *value))
{
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        setenv(name, value, 1);
        _exit(body(value));
    }
    int st;
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    ck_assert(WIFEXITED(st));
    return WEXITSTATUS(st);
}

/* What a backend asking for the best level gets with RIVER_SIMD=value: the level's
 * number, or 100 + the error's distance from RIVER_EINVAL when creation fails with that
 * detail naming `value`. */
static int simd_env_body(const char *value)
{
    backend_t *be = NULL;
    int e = cpu_backend_new(&be, 1, CPU_SIMD_COUNT);
    if (e) {
        /* The message names what was asked for and what the processor has. */
        const char *d = river_err_detail();
        int named = strstr(d, value) && strstr(d, cpu_simd_name(cpu_simd_detect()));
        return named ? 100 + (RIVER_EINVAL - e) : 99;
    }
    int code = (int)cpu_backend_simd(be);
    cpu_backend_destroy(&be);
    return code;
}

static int simd_env_child(const char *value)
{
    return env_child("RIVER_SIMD", value, simd_env_body);
}

/* What placing an eligible Q4 weight gives with RIVER_Q4X8=value: 0 kept as Q4, 1
 * repacked to Q4X8, 2 refused with RIVER_EINVAL and a detail naming the value, 3 anything
 * else. */
static int q4x8_env_body(const char *value)
{
    backend_t *be = NULL;
    int code = 3;
    if (cpu_backend_new(&be, 1, CPU_SIMD_AVX2) == 0) {
        weight_t w = q4_rand(8, 256, 32), up = w;
        int e = be->ops->weight_upload(be->ctx, &up);
        if (e == RIVER_EINVAL && strstr(river_err_detail(), value))
            code = 2;
        else if (e == 0)
            code = up.dtype == DTYPE_Q4X8 ? 1 : up.dtype == DTYPE_Q4 ? 0 : 3;
        q4_free(&w);
        cpu_backend_destroy(&be);
    }
    return code;
}

static int q4x8_env_child(const char *value)
{
    return env_child("RIVER_Q4X8", value, q4x8_env_body);
}

START_TEST(test_q4x8_env)
{
    if (cpu_simd_detect() < CPU_SIMD_AVX2)
        return; /* no level here repacks */
    ck_assert_int_eq(q4x8_env_child("0"), 0);
    ck_assert_int_eq(q4x8_env_child("1"), 1);
    ck_assert_int_eq(q4x8_env_child("yes"), 2);
    ck_assert_int_eq(q4x8_env_child("00"), 2);
}
END_TEST

START_TEST(test_simd_env)
{
    for (int l = 0; l < CPU_SIMD_COUNT; l++) {
        const char *name = cpu_simd_name((cpu_simd_t)l);
        ck_assert_int_eq(cpu_simd_parse(name), l);
        int got = simd_env_child(name);
        if (l <= (int)cpu_simd_detect())
            ck_assert_msg(got == l, "RIVER_SIMD=%s gave %d", name, got);
        else /* a level this processor lacks */
            ck_assert_msg(got == 100 + (RIVER_EINVAL - RIVER_EUNSUPPORTED),
                          "RIVER_SIMD=%s gave %d", name, got);
    }
    ck_assert_int_eq(cpu_simd_parse("avx9"), CPU_SIMD_COUNT);
    ck_assert_int_eq(cpu_simd_parse(NULL), CPU_SIMD_COUNT);
    ck_assert_int_eq(simd_env_child("avx9"), 100);
    /* An explicit level is the caller's choice and ignores the variable. */
    backend_t *be = NULL;
    ck_assert_int_eq(cpu_backend_new(&be, 1, CPU_SIMD_SCALAR), 0);
    ck_assert_int_eq(cpu_backend_simd(be), CPU_SIMD_SCALAR);
    cpu_backend_destroy(&be);
}
END_TEST

/* The AVX2 and AVX-512 levels' Q4X8 kernels give the same bits (x8_pick.h: the AVX-512
 * level may run either; both multiply the unsigned codes): prepared x, gemv at 1..12 rows
 * of x, and rows_to_f32. Their Q8X8 kernels agree to rounding (without VNNI the codes are
 * taken as q - 128, with the zero terms to match), and dequantize the same bits; where
 * every zero is one integer (weight_t.zero_int) both fold it into exact integer sums, and
 * their Q8X8 sums are the same bits too. */
START_TEST(test_x8_levels_agree)
{
    if (cpu_simd_detect() < CPU_SIMD_AVX512)
        return; /* one level only */
    static const int64_t shapes[][3] = {{37, 512, 64}, {8, 256, 32}, {13, 768, 128}};
    const cpu_kernels_t *k[2] = {&cpu_kernels_avx2, &cpu_kernels_avx512};
    test_rand_seed(5);
    /* Q4 weights with random zeros and with zeros of 8 (llama.cpp's Q4_0); Q8 weights with
     * random zeros, zeros of 128 (int8 symmetric: llama.cpp's Q8_0, River's q8 backbones)
     * and of 16 (its Q5_0); Q8 in groups of 16 with random zeros and zeros of 32 (its
     * Q6_K). */
    static const struct {
        int q8, zero; /* zero: every zero this integer, or 0 (random) */
        int group;    /* 0: the shape's */
    } modes[] = {{0, 0, 0}, {0, 8, 0}, {1, 0, 0}, {1, 128, 0}, {1, 16, 0}, {1, 0, 16},
                 {1, 32, 16}};
    for (size_t mi = 0; mi < sizeof modes / sizeof modes[0]; mi++)
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
            const int q8 = modes[mi].q8, zint = modes[mi].zero;
            const int group = modes[mi].group ? modes[mi].group : (int)shapes[si][2];
            int64_t rows = shapes[si][0], cols = shapes[si][1];
            weight_t w = q4_rand(rows, cols, group);
            if (zint) {
                for (int64_t g = 0; g < rows * (cols / group); g++)
                    ((uint16_t *)w.zeros)[g] = f32_to_f16((float)zint);
                w.zero_int = zint;
            }
            size_t bytes = dtype_row_bytes(q8 ? DTYPE_Q8 : DTYPE_Q4, cols) * (size_t)rows;
            uint8_t *codes = malloc(bytes), *packed = malloc(bytes);
            ck_assert(codes && packed);
            for (size_t i = 0; i < bytes; i++)
                codes[i] = q8 ? (uint8_t)test_rand_u32() : ((const uint8_t *)w.data)[i];
            weight_t src = w;
            src.dtype = q8 ? DTYPE_Q8 : DTYPE_Q4;
            src.data = codes;
            if (q8)
                cpu_q8x8_repack(&src, packed);
            else
                cpu_q4x8_repack(&src, packed);
            weight_t x8w = src;
            x8w.dtype = q8 ? DTYPE_Q8X8 : DTYPE_Q4X8;
            x8w.data = packed;
            enum { N = 12 }; /* past 8: the 512-bit tiles of the VNNI kernels */
            float *x = malloc(sizeof *x * (size_t)(N * cols));
            float *y[2], *xq[2], *f[2];
            ck_assert(x);
            for (int64_t i = 0; i < N * cols; i++)
                x[i] = test_rand(-1.0f, 1.0f);
            for (int n = 1; n <= N; n++) {
                for (int l = 0; l < 2; l++) {
                    int64_t ldq = k[l]->gemv_prep_floats(&x8w);
                    ck_assert_int_gt(ldq, 0);
                    ck_assert_int_eq(ldq, k[0]->gemv_prep_floats(&x8w));
                    xq[l] = aligned_alloc(64, sizeof(float) * (size_t)(n * ldq + 16));
                    y[l] = malloc(sizeof(float) * (size_t)(n * rows));
                    ck_assert(xq[l] && y[l]);
                    memset(xq[l], 0, sizeof(float) * (size_t)(n * ldq));
                    k[l]->gemv_prep(xq[l], x, cols, n, &x8w);
                    k[l]->gemv(y[l], rows, x, cols, xq[l], ldq, n, &x8w, 0, rows);
                }
                for (int64_t i = 0; i < n * rows; i++) {
                    float a = y[0][i], b = y[1][i];
                    /* Q8X8 with other zeros: the level without VNNI takes the codes as
                     * q - 128 and the zero terms in f32 in another order, differences up
                     * to 1.1e-5 at y near 0.07. With every zero the integer z both levels'
                     * integer sums are exactly those of q - z (each block's sum starts from
                     * its sum of x times -z, or 128 - z for codes taken as q - 128), so the
                     * bits are the same. */
                    bool exact = !q8 || zint;
                    ck_assert_msg(exact ? a == b : fabsf(a - b) <= 3e-5f * (fabsf(a) + 1.0f),
                                  "%s g%d zero %d (%lld, %lld) n %d: y[%lld] %.9g against %.9g",
                                  q8 ? "q8x8" : "q4x8", group, zint, (long long)rows,
                                  (long long)cols,
                                  n, (long long)i, a, b);
                    if (exact)
                        ck_assert(memcmp(&a, &b, sizeof a) == 0);
                }
                for (int l = 0; l < 2; l++) {
                    free(xq[l]);
                    free(y[l]);
                }
            }
            for (int l = 0; l < 2; l++) {
                f[l] = malloc(sizeof(float) * (size_t)(rows * cols));
                ck_assert_ptr_nonnull(f[l]);
                k[l]->rows_to_f32(f[l], &x8w, 0, rows);
            }
            ck_assert(memcmp(f[0], f[1], sizeof(float) * (size_t)(rows * cols)) == 0);
            free(f[0]);
            free(f[1]);
            free(x);
            free(codes);
            free(packed);
            q4_free(&w);
        }
}
END_TEST

/* Which level's kernels run Q4X8 at the AVX-512 level with RIVER_X8_LEVEL=value: the
 * level, or 100 when placement refuses the value, naming it, and 99 for anything else. */
static int x8_env_body(const char *value)
{
    backend_t *be = NULL;
    int code = 99;
    if (cpu_backend_new(&be, 1, CPU_SIMD_AVX512) == 0) {
        weight_t w = q4_rand(8, 256, 32), up = w;
        int e = be->ops->weight_upload(be->ctx, &up);
        if (e == RIVER_EINVAL && strstr(river_err_detail(), value))
            code = 100;
        else if (e == 0 && up.dtype == DTYPE_Q4X8)
            code = (int)cpu_x8_kernels(&cpu_kernels_avx512, &up, 1)->level;
        q4_free(&w);
        cpu_backend_destroy(&be);
    }
    return code;
}

/* The same past CPU_X8_WIDE_MIN_N rows of x. */
static const weight_t x8_q4x8 = {.dtype = DTYPE_Q4X8};
static int x8_env_wide_body(const char *value)
{
    (void)value;
    return (int)cpu_x8_kernels(&cpu_kernels_avx512, &x8_q4x8, CPU_X8_WIDE_MIN_N + 1)->level;
}

/* Q8X8 at one row of x: with every zero one integer (int8 symmetric, 128), and without. */
static const weight_t x8_q8x8_zint = {.dtype = DTYPE_Q8X8, .zero_int = 128};
static const weight_t x8_q8x8 = {.dtype = DTYPE_Q8X8};
static int x8_env_q8_body(const char *value)
{
    (void)value;
    return (int)cpu_x8_kernels(&cpu_kernels_avx512, &x8_q8x8_zint, 1)->level * 10 +
           (int)cpu_x8_kernels(&cpu_kernels_avx512, &x8_q8x8, 1)->level;
}

START_TEST(test_x8_env)
{
    if (cpu_simd_detect() < CPU_SIMD_AVX512)
        return; /* nothing to choose */
    ck_assert_int_eq(env_child("RIVER_X8_LEVEL", "avx2", x8_env_body), CPU_SIMD_AVX2);
    ck_assert_int_eq(env_child("RIVER_X8_LEVEL", "avx512", x8_env_body), CPU_SIMD_AVX512);
    ck_assert_int_eq(env_child("RIVER_X8_LEVEL", "sse", x8_env_body), 100);
    /* Past CPU_X8_WIDE_MIN_N rows Q4X8 takes the 512-bit VNNI tiles where the processor
     * has VNNI, unless the variable names a level; up to it, the choice for one row. */
    ck_assert_int_eq(env_child("RIVER_X8_LEVEL", "avx2", x8_env_wide_body), CPU_SIMD_AVX2);
    /* Q8X8 at one row takes Q4X8's level where every zero is one integer (the two levels'
     * bits are the same there), else the AVX-512 level's at every n, whose bits the AVX2
     * level's would not keep; the variable forces both. */
    const int avx2 = CPU_SIMD_AVX2, avx512 = CPU_SIMD_AVX512;
    ck_assert_int_eq(env_child("RIVER_X8_LEVEL", "avx2", x8_env_q8_body), avx2 * 10 + avx2);
    ck_assert_int_eq(env_child("RIVER_X8_LEVEL", "avx512", x8_env_q8_body),
                     avx512 * 10 + avx512);
    const cpu_kernels_t *avx512_k = &cpu_kernels_avx512;
    if (!getenv("RIVER_X8_LEVEL")) {
        ck_assert_ptr_eq(cpu_x8_kernels(avx512_k, &x8_q8x8_zint, 1),
                         cpu_x8_kernels(avx512_k, &x8_q4x8, 1));
        ck_assert_ptr_eq(cpu_x8_kernels(avx512_k, &x8_q8x8, 1), avx512_k);
        ck_assert_ptr_eq(cpu_x8_kernels(avx512_k, &x8_q8x8_zint, 2), avx512_k);
    }
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512vnni") && !getenv("RIVER_X8_LEVEL"))
        ck_assert_ptr_eq(cpu_x8_kernels(avx512_k, &x8_q4x8, CPU_X8_WIDE_MIN_N + 1), avx512_k);
    ck_assert_ptr_eq(cpu_x8_kernels(avx512_k, &x8_q4x8, CPU_X8_WIDE_MIN_N),
                     cpu_x8_kernels(avx512_k, &x8_q4x8, 1));
    /* Below the AVX-512 level nothing changes, and other types keep their level. */
    static const weight_t bf16 = {.dtype = DTYPE_BF16};
    ck_assert_ptr_eq(cpu_x8_kernels(&cpu_kernels_avx2, &x8_q4x8, 1), &cpu_kernels_avx2);
    ck_assert_ptr_eq(cpu_x8_kernels(avx512_k, &bf16, 1), avx512_k);
}
END_TEST

/* Two rules the prefill kernels keep at every level that has them. The attention scores of
 * a position have the same bits whether the kernel takes it with others (eight at a time
 * where all are there) or alone, as decode and the prefill tile cut positions differently;
 * and the blocked GEMM's values have the same bits whether their columns run in one call
 * of gemm_dot or are split over two, the carry taking them from one to the next (simd.h). */
/* A float slot holding two random bf16 values, as the avx512bf16 level's x and panels do. */
static float rand_bf16_pair(void)
{
    uint32_t b = (uint32_t)f32_to_bf16(test_rand(-1.0f, 1.0f)) |
                 (uint32_t)f32_to_bf16(test_rand(-1.0f, 1.0f)) << 16;
    float f;
    memcpy(&f, &b, sizeof f);
    return f;
}

START_TEST(test_prefill_kernels_split)
{
    enum { G = 3, T = 37, HD = 64, K = 160, NR = 16, MR = 4, L = 32, SPLIT = 64 };
    float *q = malloc(sizeof(float) * G * HD), *kr = malloc(sizeof(float) * T * HD);
    float *s1 = malloc(sizeof(float) * G * T), *s2 = malloc(sizeof(float) * G * T);
    const float *rows[T];
    ck_assert(q && kr && s1 && s2);
    for (int i = 0; i < G * HD; i++)
        q[i] = test_rand(-1.0f, 1.0f);
    for (int i = 0; i < T * HD; i++)
        kr[i] = test_rand(-1.0f, 1.0f);
    for (int t = 0; t < T; t++)
        rows[t] = t == 29 ? NULL : kr + t * HD;
    _Alignas(64) float x[MR * K], wp[K * NR], c[MR * NR * L], y1[MR * NR], y2[MR * NR];
    for (int i = 0; i < MR * K; i++)
        x[i] = test_rand(-1.0f, 1.0f);
    for (int i = 0; i < K * NR; i++)
        wp[i] = test_rand(-1.0f, 1.0f);
    for (int l = CPU_SIMD_SCALAR; l <= (int)cpu_simd_detect(); l++) {
        const cpu_kernels_t *k = cpu_kernels_get((cpu_simd_t)l);
        k->attn_scores(s1, T, q, G, HD, rows, 0, T, 0.125f);
        for (int t = 0; t < T; t++)
            k->attn_scores(s2 + t, T, q, G, HD, rows + t, 0, 1, 0.125f);
        for (int i = 0; i < G * T; i++)
            ck_assert_msg(memcmp(&s1[i], &s2[i], sizeof(float)) == 0,
                          "%s attn_scores head %d position %d: %.9g alone, %.9g with others",
                          cpu_simd_name((cpu_simd_t)l), i / T, i % T, s2[i], s1[i]);
        if (!k->gemm_dot)
            continue;
        int mr = k->gemm_mr, nr = k->gemm_nr;
        ck_assert(mr <= MR && nr <= NR && k->gemm_lanes <= L && SPLIT % k->gemm_lanes == 0 &&
                  (K - SPLIT) % k->gemm_lanes == 0);
        /* Columns to a float: 2 where x and the panel hold bf16 pairs (avx512bf16), which
         * are then made of two random bf16 values each. */
        int per = k->gemm_x_cols_per_float ? k->gemm_x_cols_per_float : 1;
        if (per == 2) {
            for (int i = 0; i < MR * K; i++)
                x[i] = rand_bf16_pair();
            for (int i = 0; i < K * NR; i++)
                wp[i] = rand_bf16_pair();
        }
        for (int m = 1; m <= mr; m++) {
            /* wp is a panel of K columns; the second call starts at column SPLIT, from the
             * carry the first left. */
            k->gemm_dot(c, y1, NR, x, K / per, m, wp, nr, K, 1);
            k->gemm_dot(c, NULL, 0, x, K / per, m, wp, nr, SPLIT, 1);
            k->gemm_dot(c, y2, NR, x + SPLIT / per, K / per, m, wp + SPLIT / per * nr, nr,
                        K - SPLIT, 0);
            for (int i = 0; i < m; i++)
                ck_assert_msg(memcmp(y1 + i * NR, y2 + i * NR, sizeof(float) * nr) == 0,
                              "%s gemm_dot m %d: row %d differs split at column %d",
                              cpu_simd_name((cpu_simd_t)l), m, i, SPLIT);
        }
    }
    free(q);
    free(kr);
    free(s1);
    free(s2);
}
END_TEST

/* attn_scores_rows and attn_values_rows give every row the bits attn_scores and
 * attn_values give it alone: the prefill tiles and a decode row must agree (lossless mode,
 * the prefix cache). Head dims of the fast paths (64) and off them (48, 40), a NULL row,
 * rows of q and o further apart than their heads, position and head counts that leave
 * partial tiles. */
START_TEST(test_attn_rows_kernels)
{
    enum { G = 3, M = 5, T = 37, HDMAX = 64, QS = G * HDMAX + 16 };
    float *q = malloc(sizeof(float) * M * QS), *kr = malloc(sizeof(float) * T * HDMAX);
    float *s1 = malloc(sizeof(float) * M * G * T), *s2 = malloc(sizeof(float) * M * G * T);
    float *o1 = malloc(sizeof(float) * M * QS), *o2 = malloc(sizeof(float) * M * QS);
    const float *rows[T];
    ck_assert(q && kr && s1 && s2 && o1 && o2);
    for (int i = 0; i < M * QS; i++)
        q[i] = test_rand(-1.0f, 1.0f);
    for (int i = 0; i < T * HDMAX; i++)
        kr[i] = test_rand(-1.0f, 1.0f);
    const int hds[] = {64, 48, 40};
    int tried = 0;
    for (int l = CPU_SIMD_SCALAR; l <= (int)cpu_simd_detect(); l++) {
        const cpu_kernels_t *k = cpu_kernels_get((cpu_simd_t)l);
        for (int h = 0; h < 3; h++) {
            int hd = hds[h];
            for (int t = 0; t < T; t++)
                rows[t] = t == 29 ? NULL : kr + t * hd;
            if (k->attn_scores_rows) {
                tried++;
                k->attn_scores_rows(s1, T, q, QS, M, G, hd, rows, 0, T, 0.125f);
                for (int i = 0; i < M; i++)
                    k->attn_scores(s2 + i * G * T, T, q + i * QS, G, hd, rows, 0, T, 0.125f);
                for (int i = 0; i < M * G * T; i++)
                    ck_assert_msg(memcmp(&s1[i], &s2[i], sizeof(float)) == 0,
                                  "%s attn_scores_rows hd %d: row %d head %d position %d: "
                                  "%.9g, %.9g alone", cpu_simd_name((cpu_simd_t)l), hd,
                                  i / (G * T), i / T % G, i % T, s1[i], s2[i]);
            }
            if (k->attn_values_rows) {
                tried++;
                for (int i = 0; i < M * G * T; i++)
                    s1[i] = test_rand(0.0f, 1.0f);
                for (int i = 0; i < M * QS; i++)
                    o1[i] = o2[i] = test_rand(-1.0f, 1.0f);
                k->attn_values_rows(o1, QS, s1, T, M, G, hd, rows, 0, T);
                for (int i = 0; i < M; i++)
                    k->attn_values(o2 + i * QS, s1 + i * G * T, T, G, hd, rows, 0, T);
                ck_assert_msg(memcmp(o1, o2, sizeof(float) * M * QS) == 0,
                              "%s attn_values_rows hd %d differs from attn_values row by row",
                              cpu_simd_name((cpu_simd_t)l), hd);
            }
        }
    }
    /* Every level from AVX2 up has at least the values kernel. */
    if (cpu_simd_detect() >= CPU_SIMD_AVX2)
        ck_assert_int_gt(tried, 0);
    free(q);
    free(kr);
    free(s1);
    free(s2);
    free(o1);
    free(o2);
}
END_TEST

/* kv_from_f32, kv_write's narrowing, writes the bits of kv_row_from_f32 at every level:
 * a position's K/V must not depend on the level or the batch that wrote it. F16 over a
 * sweep of f32 bit patterns with the edges among them (halves' subnormals and the ties
 * between them, the largest half and the midpoint above it, infinities, NaNs with
 * payloads, zeros of both signs), at offsets and lengths that leave vector tails; the
 * other types, which the levels hand to kv_row_from_f32, once each. */
START_TEST(test_kv_from_f32_levels)
{
    enum { N = 4096 + 7, OFF = 3 };
    static const uint32_t edges[] = {
        0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00001u,
        0x7f800001u, 0x7fbfffffu, 0xff812345u, 0x477fe000u, 0x477fefffu, 0x477ff000u,
        0x477ff001u, 0xc77ff000u, 0x38800000u, 0x387fffffu, 0x33800000u, 0x33000000u,
        0x33000001u, 0x337fffffu, 0x33c00000u, 0x34400000u, 0x00000001u, 0x00800000u,
        0x3f800fffu, 0x3f801000u, 0x3f801001u, 0x3f803000u, 0x387fe000u, 0x387ff000u};
    float *src = malloc(sizeof(float) * N);
    uint16_t *want = malloc(sizeof(uint16_t) * (N + OFF));
    uint16_t *got = malloc(sizeof(uint16_t) * (N + OFF));
    ck_assert(src && want && got);
    for (int i = 0; i < N; i++) {
        uint32_t u = i < (int)(sizeof edges / sizeof edges[0])
                         ? edges[i]
                         : (uint32_t)i * 1048573u + test_rand_u32() % 4096u;
        memcpy(&src[i], &u, sizeof u);
    }
    for (int l = CPU_SIMD_SCALAR; l <= (int)cpu_simd_detect(); l++) {
        const cpu_kernels_t *k = cpu_kernels_get((cpu_simd_t)l);
        ck_assert_ptr_nonnull(k->kv_from_f32);
        for (int n = N; n >= N - 9; n -= 3) {
            memset(want, 0x5a, sizeof(uint16_t) * (N + OFF));
            memset(got, 0x5a, sizeof(uint16_t) * (N + OFF));
            kv_row_from_f32(DTYPE_F16, want, NULL, OFF, src, n);
            k->kv_from_f32(DTYPE_F16, got, NULL, OFF, src, n);
            for (int i = 0; i < N + OFF; i++) {
                if (want[i] == got[i])
                    continue;
                uint32_t from = 0;
                if (i >= OFF && i < OFF + n)
                    memcpy(&from, &src[i - OFF], sizeof from);
                ck_abort_msg("%s kv_from_f32 f16 (n %d): element %d is %04x, kv_row_from_f32's "
                             "%04x (from %08x)", cpu_simd_name((cpu_simd_t)l), n, i, got[i],
                             want[i], from);
            }
        }
        /* The other types: a row of 64 random values (two Q8 blocks). */
        float row[64], sw[2], sg[2];
        for (int i = 0; i < 64; i++)
            row[i] = test_rand(-3.0f, 3.0f);
        uint8_t bw[256], bg[256];
        const dtype_t dts[] = {DTYPE_BF16, DTYPE_Q8, DTYPE_F32};
        for (int d = 0; d < 3; d++) {
            memset(bw, 0, sizeof bw);
            memset(bg, 0, sizeof bg);
            kv_row_from_f32(dts[d], bw, sw, 0, row, 64);
            k->kv_from_f32(dts[d], bg, sg, 0, row, 64);
            ck_assert_msg(memcmp(bw, bg, sizeof bw) == 0, "%s kv_from_f32 %s differs",
                          cpu_simd_name((cpu_simd_t)l), dtype_name(dts[d]));
            if (dts[d] == DTYPE_Q8)
                ck_assert(memcmp(sw, sg, sizeof sw) == 0);
        }
    }
    free(src);
    free(want);
    free(got);
}
END_TEST

static Suite *ops_suite(void)
{
    Suite *s = suite_create("ops");
    TCase *tc = tcase_create("cpu");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_levels);
    tcase_add_test(tc, test_set_simd);
    tcase_add_test(tc, test_compute_peak);
    tcase_add_test(tc, test_simd_env);
    tcase_add_test(tc, test_q4x8_env);
    tcase_add_test(tc, test_x8_levels_agree);
    tcase_add_test(tc, test_x8_env);
    tcase_add_test(tc, test_prefill_kernels_split);
    tcase_add_test(tc, test_attn_rows_kernels);
    tcase_add_test(tc, test_kv_from_f32_levels);
    tcase_add_loop_test(tc, test_q4x8_layout, 0, 2 * CPU_SIMD_COUNT);
    suite_add_tcase(s, tc);
    return s;
}

RIVER_TEST_MAIN(ops_suite)
