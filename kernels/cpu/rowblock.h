/* Internal to the CPU backend: the row-blocked layout of float weights (DTYPE_BF16X8,
 * DTYPE_F16X8), which the backend repacks bf16 and f16 matrices into at placement
 * (cpu_weight_upload) for its decode kernels.
 *
 * Why: a decode matmul applies a block of 8 weight rows at once to x, so in row-major order
 * it reads 8 streams 1 row apart (4 KiB for 2048 bf16 columns) and jumps to the next block
 * at the end of a row: every 4 KiB page is a short stream of its own, which the processor's
 * prefetchers pick up late. Measured on this kind of machine (2 threads, AMD EPYC with
 * AVX-512, 768 MiB of 8192 x 2048 bf16 matrices): the row-major kernel reads 0.68-0.79 of a
 * plain sweep's bandwidth, the same kernel on the row-blocked layout 0.85-1.09 (median 0.94).
 * In this layout the 8 rows' next 64 bytes each are one contiguous 512-byte run, so a block
 * is read as one sequential stream.
 *
 * Layout: rows in blocks of CPU_ROWBLOCK_ROWS; within a block, each row's bytes in chunks of
 * CPU_ROWBLOCK_CHUNK (one cache line, 32 bf16 or f16 columns), and chunk c of the block's
 * rows stored together, row by row. The bytes of a row are what the row-major layout holds,
 * only elsewhere: a block is (rows / 8, row bytes / 64, 8, 64) bytes.
 *
 * Which weights: BF16 and F16 with rows a multiple of 8 and columns a multiple of 32. */
#ifndef RIVER_KERNELS_CPU_ROWBLOCK_H
#define RIVER_KERNELS_CPU_ROWBLOCK_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/ops.h"

#define CPU_ROWBLOCK_ROWS 8
#define CPU_ROWBLOCK_CHUNK 64

/* Whether w (BF16 or F16, row-major) can take the layout. */
int cpu_rowblock_eligible(const weight_t *w);
/* Writes w's rows (eligible) in the layout to dst (rows * row bytes). */
void cpu_rowblock_repack(const weight_t *w, uint8_t *dst);

/* Whether dt is a row-blocked type, and the element type its bytes hold. */
static inline int cpu_rowblock_is(dtype_t dt)
{
    return dt == DTYPE_BF16X8 || dt == DTYPE_F16X8;
}

static inline dtype_t cpu_rowblock_elem(dtype_t dt)
{
    return dt == DTYPE_BF16X8 ? DTYPE_BF16 : dt == DTYPE_F16X8 ? DTYPE_F16 : dt;
}

/* Where byte `byte` of row r lives in a row-blocked matrix at base with rb bytes a row. */
static inline const uint8_t *cpu_rowblock_at(const uint8_t *base, size_t rb, int64_t r,
                                             size_t byte)
{
    return base + (size_t)(r / CPU_ROWBLOCK_ROWS) * CPU_ROWBLOCK_ROWS * rb +
           byte / CPU_ROWBLOCK_CHUNK * (CPU_ROWBLOCK_ROWS * CPU_ROWBLOCK_CHUNK) +
           (size_t)(r % CPU_ROWBLOCK_ROWS) * CPU_ROWBLOCK_CHUNK + byte % CPU_ROWBLOCK_CHUNK;
}

/* How a kernel walks rows of a weight of either layout: row r's chunk c (64 bytes) starts at
 * row_at(r) + c * chunk_stride, and rows within one block of 8 are row_stride apart. */
typedef struct cpu_rowwalk {
    size_t row_stride;
    size_t chunk_stride;
} cpu_rowwalk_t;

static inline cpu_rowwalk_t cpu_rowwalk(dtype_t dt, size_t rb)
{
    if (cpu_rowblock_is(dt))
        return (cpu_rowwalk_t){CPU_ROWBLOCK_CHUNK, CPU_ROWBLOCK_ROWS * CPU_ROWBLOCK_CHUNK};
    return (cpu_rowwalk_t){rb, CPU_ROWBLOCK_CHUNK};
}

/* The start of row r (its chunk 0). */
static inline const uint8_t *cpu_rowwalk_row(dtype_t dt, const uint8_t *base, size_t rb,
                                             int64_t r)
{
    return cpu_rowblock_is(dt) ? cpu_rowblock_at(base, rb, r, 0) : base + (size_t)r * rb;
}

#endif
