/* Internal to the CPU backend: the backend state shared by cpu_backend.c (the ops table and
 * the simple ops), matmul.c, attention.c and simd_level.c. */
#ifndef RIVER_KERNELS_CPU_INTERNAL_H
#define RIVER_KERNELS_CPU_INTERNAL_H

#include <stddef.h>

#include "kernels/cpu/cpu.h"
#include "kernels/cpu/simd.h"
#include "kernels/cpu/threadpool.h"
#include "kernels/ops.h"

/* A growable, 64-byte aligned float buffer. */
typedef struct cpu_scratch {
    float *p;
    size_t cap; /* floats */
} cpu_scratch_t;

struct ops_ctx {
    const cpu_kernels_t *k;
    threadpool_t *pool;
    int n_threads;
    /* One scratch per thread, indexed by the thread number a task runs on; padded so two
     * threads never write the same cache line. */
    struct {
        cpu_scratch_t s;
        char pad[64 - sizeof(cpu_scratch_t)];
    } *thread_scratch;
    cpu_scratch_t shared; /* written by the calling thread before a run, read by the tasks */
    cpu_scratch_t shared2;
    int keep_mapped; /* 1: placement copies only what it repacks (cpu_backend_keep_mapped) */
    /* Weight copies the backend made at placement (matrices in huge pages, repacked Q4X8
     * codes), freed at destroy. */
    struct cpu_owned {
        void *p;
        size_t bytes;
        struct cpu_owned *next;
    } *owned;
};

/* Makes room for n floats (contents not kept); 0 or RIVER_ENOMEM. */
int cpu_scratch_reserve(cpu_scratch_t *s, size_t n);
/* Reserves n floats in every thread's scratch. */
int cpu_thread_scratch_reserve(ops_ctx_t *ctx, size_t n);

/* Validation of a weight for the ops, with a detail naming `what`. */
int cpu_weight_check(const weight_t *w, const char *what);

int cpu_matmul(ops_ctx_t *ctx, void *y, const void *x, const weight_t *w, int n);
int cpu_matmul_multi(ops_ctx_t *ctx, void *const *y, const void *x, const weight_t *const *w,
                     int count, int n);
/* ops->router_prob (kernels/cpu/router_prob.c). */
int cpu_router_prob(ops_ctx_t *ctx, float *out, const void *x, const router_weights_t *w,
                    const int32_t *rows, int n);
int cpu_attention(ops_ctx_t *ctx, void *out, const void *q, const kv_view_t *kv, int layer,
                  const attn_batch_t *b, int n_heads, int n_kv_heads, int head_dim,
                  float scale);

#endif
