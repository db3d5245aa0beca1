/* The CPU backend: the reference implementation of every op in kernels/ops.h, with SIMD
 * paths chosen at run time (AVX-512, AVX2/FMA, portable C) and a thread pool.
 *
 * Notes on the ops as implemented here:
 * - Weights are read where placement left them (the caller's memory, or for matrices of
 *   2 MiB or more the backend's copy in huge pages), in every dtype; Q4 and Q8 codes of
 *   whole 256-column sets are repacked at placement (Q4X8, Q8X8: q4x8.h). Q4/Q8 codes are
 *   unsigned (0..15, 0..255);
 *   a group must divide the columns, and Q4 groups must be even. Groups that are multiples
 *   of 16 (Q8) or 32 (Q4) take the fast paths; others work, more slowly.
 * - Accumulation is f32 throughout. The scalar level adds in plain index order (as
 *   llama2.c does), the SIMD levels in lanes, so results differ between levels by rounding.
 * - attention honours attn_batch_t.kv_valid (slots marked invalid are never read), and out
 *   may be the q buffer itself.
 * - cosine of a zero vector with anything is 0. */
#ifndef RIVER_KERNELS_CPU_H
#define RIVER_KERNELS_CPU_H

#include <stdbool.h>

#include "kernels/ops.h"

typedef enum {
    CPU_SIMD_SCALAR = 0,
    CPU_SIMD_AVX2,   /* AVX2 + FMA + F16C */
    CPU_SIMD_AVX512, /* AVX-512 F/BW/VL/DQ */
    /* AVX512 + AVX512-BF16: bf16 weights multiply x rounded to bf16 (vdpbf16ps); every
     * other kernel is the avx512 level's. */
    CPU_SIMD_AVX512BF16,
    CPU_SIMD_COUNT
} cpu_simd_t;

/* The best SIMD level this processor supports. */
cpu_simd_t cpu_simd_detect(void);
const char *cpu_simd_name(cpu_simd_t level);
/* The level named `name` ("scalar", "avx2", "avx512", "avx512bf16"); CPU_SIMD_COUNT if
 * none is. */
cpu_simd_t cpu_simd_parse(const char *name);

/* The level every component that asks for "the best" runs: the environment variable
 * RIVER_SIMD (scalar|avx2|avx512|avx512bf16) where set, else cpu_simd_detect(). The
 * variable is read once per process. A name that is no level, or a level this processor
 * lacks, is an error (RIVER_EINVAL / RIVER_EUNSUPPORTED) naming it and what the processor
 * has. */
int cpu_simd_selected(cpu_simd_t *out);

/* Creates a CPU backend with n_threads workers (0: one per online core) using SIMD level
 * `simd` (capped at what the processor supports); CPU_SIMD_COUNT takes
 * cpu_simd_selected(), whose error it returns. On failure *out is untouched. */
int cpu_backend_new(backend_t **out, int n_threads, cpu_simd_t simd);
void cpu_backend_destroy(backend_t **b);

/* Before placement: weight_upload leaves float, Q4 and Q8 matrices in the caller's memory
 * (the mapped checkpoint, whose pages weight_residency can release) instead of copying
 * those of 2 MiB or more into huge pages, which decode reads faster but which cannot be
 * released; Q4 codes are not repacked into Q4X8 then either (the repack is a copy), so that
 * a 4-bit backbone can be offloaded, at the Q4 kernels' speed. RIVER_EINVAL
 * if b is not a CPU backend; nothing changes then. */
int cpu_backend_keep_mapped(backend_t *b);

/* Rows of x up to which every matmul takes the decode path (kernels/cpu/matmul.c). */
#define CPU_DECODE_MAX_ROWS 16

/* Whether a matmul of n rows with w (as placed) at `level` gives each row of y the same
 * bits as a call with that row alone. It does up to CPU_DECODE_MAX_ROWS rows, where the
 * decode path runs; at any n for float weights (F32, BF16, F16 and their row-blocked
 * layouts), whose prefill path adds in the decode path's order; and at any n for weights
 * the level's decode kernels take x in 8 bits for (Q8 and Q4 with groups of whole 32-column
 * blocks, Q8X8, Q4X8), whose matmuls never leave that path. Lossless mode and the prefix
 * cache need it: a verify batch must give the backbone's single-row decode results, and a
 * prompt's KV must not depend on how it was cut into chunks. */
bool cpu_matmul_rows_alone(cpu_simd_t level, const weight_t *w, int n);

/* Threads the backend runs ops on. */
int cpu_backend_threads(const backend_t *b);
/* The SIMD level the backend's kernels use. */
cpu_simd_t cpu_backend_simd(const backend_t *b);
/* For benchmarks that compare levels call by call on one backend, one thread pool and the
 * same placed weights (river bench --kernels --interleave): later ops run level simd's
 * kernels. The weights stay as placed; every level reads every layout the backend places.
 * Not while an op runs. RIVER_EINVAL (the level unchanged) if b is not a CPU backend or
 * simd is not a level, RIVER_EUNSUPPORTED if the processor lacks it. */
int cpu_backend_set_simd(backend_t *b, cpu_simd_t simd);

/* Measures the read bandwidth of main memory in GB/s (1e9 bytes/s): a read-only SIMD sweep
 * with n_threads threads over a buffer of `bytes` (far larger than the caches), best of
 * `reps` passes, with the loads of level `simd` (capped at what the processor has;
 * CPU_SIMD_COUNT: the widest it has). Returns a negative river_err code on failure. */
double cpu_read_bandwidth_gbs(int n_threads, size_t bytes, int reps, cpu_simd_t simd);

/* The same sweep as an object, for measurements that pair its passes with something else
 * timed between them (river bench: decode steps): the buffer is mapped and touched once.
 * cpu_sweep_new leaves *out NULL and nothing allocated on failure (RIVER_EINVAL for the
 * arguments cpu_read_bandwidth_gbs refuses, RIVER_ENOMEM); cpu_sweep_pass_gbs times one
 * pass over the whole buffer. */
typedef struct cpu_sweep cpu_sweep_t;
int cpu_sweep_new(cpu_sweep_t **out, int n_threads, size_t bytes, cpu_simd_t simd);
double cpu_sweep_pass_gbs(cpu_sweep_t *s);
void cpu_sweep_destroy(cpu_sweep_t **s);

/* The compute peaks prefill is judged against. */
typedef enum cpu_peak {
    CPU_PEAK_F32, /* f32 fused multiply-adds, as the float weights' matmuls run (at
                   * avx512bf16, vdpbf16ps, as bf16 weights' do) */
    CPU_PEAK_I8,  /* 8-bit integer products (vpmaddubsw; vpdpbusd where the AVX-512 level
                   * has VNNI), as the Q8/Q4 matmuls run */
    CPU_PEAK_Q8_TILE, /* the same products inside the level's Q8X8 prefill tile, with the
                       * conversion and scaling of each block of 32 columns: the ceiling
                       * of that tile, below CPU_PEAK_I8 (simd.h: peak_q8_tile) */
} cpu_peak_t;

/* The peak a prefill on weights of dtype dt is judged against: the 8-bit one for quantized
 * weights, the float one for the others. */
static inline cpu_peak_t cpu_peak_for(dtype_t dt)
{
    return dtype_quant_bits(dt) > 0 ? CPU_PEAK_I8 : CPU_PEAK_F32;
}

/* Measures the compute peak in G multiply-adds/s (1e9/s; a multiply-add is two operations):
 * n_threads threads each running independent chains of the level's vector multiply-adds
 * from registers, best of `reps` passes of about 0.2 s, at level `simd` (capped at what the
 * processor has; CPU_SIMD_COUNT: the widest it has). Returns a negative river_err code on
 * failure: RIVER_EUNSUPPORTED for CPU_PEAK_Q8_TILE at the portable level. */
double cpu_peak_gmacs(int n_threads, cpu_simd_t simd, cpu_peak_t kind, int reps);

#endif
