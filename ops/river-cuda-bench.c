/* river-cuda-bench: the memory-bound CUDA kernels of a decode step at Llama 3.2 1B shapes,
 * each as GB/s and as a fraction of a device-to-device copy measured in the same run (the
 * bandwidth a kernel that only streams its bytes can reach). Prints one line per kernel:
 *
 *   kernel  bytes  us  GB/s  of_copy
 *
 * Each matmul cycles through enough copies of its weight to defeat the L2 (see
 * BENCH_ROTATE_BYTES), as a decode step reads every weight from memory.
 * GB/s counts the bytes a kernel must move at least (weights, K/V, activations read and
 * written once); the copy counts its bytes read plus written. Times are host wall clock
 * over --reps back-to-back launches ended by one sync, so launch overhead is included:
 * small kernels show it.
 *
 * usage: river-cuda-bench [--device N] [--reps R]
 * Exits 0 after printing, 2 without a GPU ("no CUDA device: ..."), 1 on any error. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "common/err.h"
#include "kernels/cuda/cuda.h"
#include "kernels/half.h"

static uint64_t bench_rng = 0x2545f4914f6cdd1dull;

static float bench_rnd(void)
{
    bench_rng ^= bench_rng << 13;
    bench_rng ^= bench_rng >> 7;
    bench_rng ^= bench_rng << 17;
    return (float)(bench_rng >> 40) / (float)(1u << 24) * 2.0f - 1.0f;
}

/* A random weight of dtype dt (BF16 or Q4 with group 64) placed on the backend. The host
 * copies are freed once uploaded (the backend owns its device copies). */
static int bench_weight(backend_t *be, dtype_t dt, int64_t rows, int64_t cols, weight_t *w)
{
    memset(w, 0, sizeof *w);
    w->dtype = dt;
    w->rows = rows;
    w->cols = cols;
    size_t bytes = (size_t)rows * dtype_row_bytes(dt, cols);
    uint8_t *data = malloc(bytes);
    uint16_t *sc = NULL, *zr = NULL;
    if (!data)
        return river_err_set(RIVER_ENOMEM, "bench: %zu bytes", bytes);
    if (dt == DTYPE_BF16) {
        uint16_t *d = (uint16_t *)data;
        for (size_t i = 0; i < bytes / 2; i++)
            d[i] = f32_to_bf16(bench_rnd() * 0.05f);
    } else {
        w->group = 64;
        size_t ng = (size_t)rows * (size_t)(cols / 64);
        sc = malloc(ng * sizeof *sc);
        zr = malloc(ng * sizeof *zr);
        if (!sc || !zr) {
            free(data);
            free(sc);
            free(zr);
            return river_err_set(RIVER_ENOMEM, "bench: Q4 groups");
        }
        for (size_t i = 0; i < bytes; i++)
            data[i] = (uint8_t)((bench_rnd() + 1.0f) * 127.5f);
        for (size_t i = 0; i < ng; i++) {
            sc[i] = f32_to_f16(0.01f);
            zr[i] = f32_to_f16(7.5f);
        }
    }
    w->data = data;
    w->scales = sc;
    w->zeros = zr;
    int e = cuda_backend_upload(be, w);
    free(data);
    free(sc);
    free(zr);
    if (e)
        memset(w, 0, sizeof *w);
    return e;
}

static void bench_line(const char *name, double bytes, double secs, double copy_gbs)
{
    double gbs = bytes / secs / 1e9;
    printf("%-28s %12.0f %9.2f %8.1f %7.3f\n", name, bytes, secs * 1e6, gbs, gbs / copy_gbs);
}

typedef struct mm_shape {
    const char *name;
    dtype_t dt;
    int64_t rows, cols;
    int n;
} mm_shape_t;

static const mm_shape_t bench_mm[] = {
    {"gemv bf16 q_proj 2048x2048", DTYPE_BF16, 2048, 2048, 1},
    {"gemv bf16 kv_proj 512x2048", DTYPE_BF16, 512, 2048, 1},
    {"gemv bf16 gate 8192x2048", DTYPE_BF16, 8192, 2048, 1},
    {"gemv bf16 down 2048x8192", DTYPE_BF16, 2048, 8192, 1},
    {"gemv bf16 lm_head", DTYPE_BF16, 128256, 2048, 1},
    {"gemv bf16 gate n=8", DTYPE_BF16, 8192, 2048, 8},
    {"gemv q4g64 gate 8192x2048", DTYPE_Q4, 8192, 2048, 1},
    {"gemv q4g64 down 2048x8192", DTYPE_Q4, 2048, 8192, 1},
    {"gemv q4g64 kv_proj 512x2048", DTYPE_Q4, 512, 2048, 1},
};

/* Copies of a weight the timed launches cycle through, so that together they are at least
 * BENCH_ROTATE_BYTES: the H200's L2 holds 60 MB, and a decode step reads each matrix once,
 * from HBM. One copy of a matrix of 8 MB timed again and again is read from L2. */
#define BENCH_ROTATE_BYTES (512.0 * 1024 * 1024)
#define BENCH_MAX_COPIES 64

static int bench_matmuls(backend_t *be, int reps, double copy_gbs)
{
    const ops_t *o = be->ops;
    for (size_t k = 0; k < sizeof bench_mm / sizeof bench_mm[0]; k++) {
        const mm_shape_t *s = &bench_mm[k];
        double wbytes = (double)s->rows * (double)dtype_row_bytes(s->dt, s->cols);
        if (s->dt == DTYPE_Q4)
            wbytes += (double)s->rows * (double)(s->cols / 64) * 4.0;
        int copies = (int)ceil(BENCH_ROTATE_BYTES / wbytes);
        copies = copies < 1 ? 1 : copies > BENCH_MAX_COPIES ? BENCH_MAX_COPIES : copies;
        weight_t ws[BENCH_MAX_COPIES];
        int e = 0;
        for (int c = 0; c < copies && !e; c++)
            e = bench_weight(be, s->dt, s->rows, s->cols, &ws[c]);
        if (e)
            return e;
        weight_t w = ws[0];
        void *x = o->buf_alloc(be->ctx, (size_t)s->n * (size_t)s->cols);
        void *y = o->buf_alloc(be->ctx, (size_t)s->n * (size_t)s->rows);
        if (!x || !y) {
            o->buf_free(be->ctx, x);
            o->buf_free(be->ctx, y);
            return RIVER_EDEVICE;
        }
        e = o->matmul(be->ctx, y, x, &w, s->n); /* warm-up */
        if (!e)
            e = o->sync(be->ctx);
        double t0 = clock_now_s();
        for (int r = 0; r < reps && !e; r++)
            e = o->matmul(be->ctx, y, x, &ws[r % copies], s->n);
        if (!e)
            e = o->sync(be->ctx);
        double dt = (clock_now_s() - t0) / reps;
        o->buf_free(be->ctx, x);
        o->buf_free(be->ctx, y);
        if (e)
            return e;
        double bytes = wbytes + 4.0 * s->n * (double)(s->rows + s->cols);
        bench_line(s->name, bytes, dt, copy_gbs);
    }
    return 0;
}

/* Decode attention at Llama 3.2 1B's heads (32 of 64, 8 KV heads): rows at the end of
 * `len`-position sequences with shuffled pages. */
static int bench_attention(backend_t *be, int reps, double copy_gbs, int rows, int len)
{
    const ops_t *o = be->ops;
    enum { H = 32, KVH = 8, HD = 64, PS = 16 };
    int kv_dim = KVH * HD, per = (len + PS - 1) / PS;
    kv_view_t kv = {.page_size = PS, .kv_dim = kv_dim, .n_pages = per * rows,
                    .layer_stride = (int64_t)PS * kv_dim};
    kv.page_stride = kv.layer_stride;
    size_t kv_elems = (size_t)kv.n_pages * (size_t)kv.page_stride;
    int32_t *pt = malloc(sizeof *pt * (size_t)kv.n_pages);
    int32_t *pos = malloc(sizeof *pos * (size_t)rows);
    const int32_t **pts = malloc(sizeof *pts * (size_t)rows);
    kv.k = o->buf_alloc(be->ctx, kv_elems);
    kv.v = o->buf_alloc(be->ctx, kv_elems);
    void *q = o->buf_alloc(be->ctx, (size_t)rows * H * HD);
    void *out = o->buf_alloc(be->ctx, (size_t)rows * H * HD);
    int e = 0;
    if (!pt || !pos || !pts || !kv.k || !kv.v || !q || !out) {
        e = river_err_set(RIVER_ENOMEM, "bench attention: buffers");
        goto done;
    }
    for (int p = 0; p < kv.n_pages; p++)
        pt[p] = (int32_t)((p * 7919) % kv.n_pages);
    for (int r = 0; r < rows; r++) {
        pos[r] = len - 1;
        pts[r] = pt + (size_t)r * (size_t)per;
    }
    attn_batch_t b = {.n = rows, .pos = pos, .page_table = pts};
    float scale = 1.0f / sqrtf((float)HD);
    e = o->attention(be->ctx, out, q, &kv, 0, &b, H, KVH, HD, scale);
    if (!e)
        e = o->sync(be->ctx);
    double t0 = clock_now_s();
    for (int r = 0; r < reps && !e; r++)
        e = o->attention(be->ctx, out, q, &kv, 0, &b, H, KVH, HD, scale);
    if (!e)
        e = o->sync(be->ctx);
    if (!e) {
        double dt = (clock_now_s() - t0) / reps;
        double bytes = (double)rows * (2.0 * len * kv_dim * 4.0 + 2.0 * H * HD * 4.0);
        char name[64];
        snprintf(name, sizeof name, "attention %d rows ctx %d", rows, len);
        bench_line(name, bytes, dt, copy_gbs);
    }
done:
    o->buf_free(be->ctx, kv.k);
    o->buf_free(be->ctx, kv.v);
    o->buf_free(be->ctx, q);
    o->buf_free(be->ctx, out);
    free(pt);
    free(pos);
    free(pts);
    return e;
}

int main(int argc, char **argv)
{
    int device = 0, reps = 50;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--device") && i + 1 < argc) {
            device = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
            reps = atoi(argv[++i]);
        } else {
            fprintf(stderr, "usage: river-cuda-bench [--device N] [--reps R]\n");
            return 1;
        }
    }
    if (reps < 1 || device < 0) {
        fprintf(stderr, "river-cuda-bench: --reps and --device must be positive\n");
        return 1;
    }
    backend_t *be = NULL;
    int e = cuda_backend_new(&be, device);
    if (e) {
        printf("%s\n", river_err_detail());
        return 2;
    }
    double copy_s = 0;
    size_t copy_bytes = (size_t)256 << 20;
    e = cuda_backend_time_copy(be, copy_bytes, 20, &copy_s);
    if (e)
        goto fail;
    double copy_gbs = 2.0 * (double)copy_bytes / copy_s / 1e9;
    printf("device %s\n", cuda_backend_device_name(be));
    printf("d2d_copy_gbs %.1f (256 MiB, read + write)\n", copy_gbs);
    printf("%-28s %12s %9s %8s %7s\n", "kernel", "bytes", "us", "GB/s", "of_copy");
    if ((e = bench_matmuls(be, reps, copy_gbs)) ||
        (e = bench_attention(be, reps, copy_gbs, 1, 2048)) ||
        (e = bench_attention(be, reps, copy_gbs, 8, 2048)) ||
        (e = bench_attention(be, reps, copy_gbs, 1, 8192)))
        goto fail;
    printf("uploads %llu (host inputs copied; the rest came from the upload slots)\n",
           (unsigned long long)cuda_backend_uploads(be));
    cuda_backend_destroy(&be);
    return 0;
fail:
    fprintf(stderr, "river-cuda-bench: %s\n", river_err_detail());
    cuda_backend_destroy(&be);
    return 1;
}
