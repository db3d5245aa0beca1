/* Internal to the CPU backend: the row-blocked layouts, DTYPE_BF16X8 and DTYPE_F16X8, that
 * the backend repacks bf16 and f16 matrices into at placement (cpu_weight_upload) for its
 * decode kernels.
 *
 * Why: a decode matmul applies a block of weight rows at once to x, so in row-major order
 * it reads one stream per row, the streams a row apart (4 KiB for 2048 bf16 columns), and
 * jumps to the next block at the end of a row: every 4 KiB page is a short stream of its
 * own, which the processor's prefetchers pick up late. Measured on this kind of machine (2
 * threads, AMD EPYC with AVX-512, 768 MiB of 8192 x 2048 bf16 matrices): the row-major
 * kernel reads 0.68-0.79 of a plain sweep's bandwidth, the same kernel on the row-blocked
 * layout 0.85-1.09 (median 0.94). In this layout the next chunk of every row of a block is
 * one contiguous run, so a block is read as one sequential stream.
 *
 * Layout: rows in blocks of CPU_ROWBLOCK_ROWS (8, the rows a decode tile covers); within a
 * block, each row's bytes in chunks of CPU_ROWBLOCK_CHUNK (64, a cache line), and chunk c of
 * the block's rows stored together, row by row. A row holds the bytes the row-major layout
 * holds, only elsewhere.
 *
 * Which weights: BF16 and F16 with rows a multiple of 8 and row bytes a multiple of 64.
 *
 * Q4X8 and Q8X8 (q4x8.h) stay row-major. The same layout for them, blocks of 4 rows (their
 * decode tiles at one row of x) and chunks of a 256-column set, was measured against it in
 * one run (river bench --kernels, alternating binaries, 3-4 rounds, 2 threads): at one row
 * of x 1.0-1.4x, but at 2 to 8 rows, where the tiles cover half a block each, 0.4-1.0x
 * whatever the prefetch distance, so it was not taken; blocks of 8 rows read by one-row
 * tiles of the whole block, measured again later, did no better (README, "bf16 and f16
 * rows in blocks of 8"). */
#ifndef RIVER_KERNELS_CPU_ROWBLOCK_H
#define RIVER_KERNELS_CPU_ROWBLOCK_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/cpu/prefetch.h"
#include "kernels/ops.h"

/* Rows a block and bytes a chunk. */
#define CPU_ROWBLOCK_ROWS 8
#define CPU_ROWBLOCK_CHUNK 64

/* Whether w (BF16 or F16, row-major) can take the layout. */
int cpu_rowblock_eligible(const weight_t *w);
/* Writes w's rows (eligible) in the layout to dst (rows * row bytes). */
void cpu_rowblock_repack(const weight_t *w, uint8_t *dst);

static inline int cpu_rowblock_is(dtype_t dt)
{
    return dt == DTYPE_BF16X8 || dt == DTYPE_F16X8;
}

/* The element type whose bytes a row-blocked type holds; dt for the others. */
static inline dtype_t cpu_rowblock_elem(dtype_t dt)
{
    return dt == DTYPE_BF16X8 ? DTYPE_BF16 : dt == DTYPE_F16X8 ? DTYPE_F16 : dt;
}

/* Bytes of one chunk of every row of a block, stored together. */
#define CPU_ROWBLOCK_SPAN (CPU_ROWBLOCK_ROWS * CPU_ROWBLOCK_CHUNK)

/* Where byte `byte` of row r lives in a row-blocked matrix at base, rb bytes a row. From
 * there, the same byte of the next rows of r's block is CPU_ROWBLOCK_CHUNK further each, and
 * the next chunk of row r CPU_ROWBLOCK_SPAN further. */
static inline const uint8_t *cpu_rowblock_at(const void *base, size_t rb, int64_t r,
                                             size_t byte)
{
    return (const uint8_t *)base + (size_t)(r / CPU_ROWBLOCK_ROWS) * CPU_ROWBLOCK_ROWS * rb +
           byte / CPU_ROWBLOCK_CHUNK * CPU_ROWBLOCK_SPAN +
           (size_t)(r % CPU_ROWBLOCK_ROWS) * CPU_ROWBLOCK_CHUNK + byte % CPU_ROWBLOCK_CHUNK;
}

/* How far ahead a tile of fewer rows than its block prefetches, in spans. The layout is one
 * stream a block, which the hardware prefetchers follow; but a tile of fewer rows reads only
 * its rows' lines of each span, and the next tile the others, so such a tile prefetches
 * whole spans for them all, 16 spans (8 KiB) ahead. Measured with river bench --kernels
 * (8192 x 2048, 2 threads): 0.86-0.99 of the read sweep at 1 row of x where the row-major
 * layout gave 0.72-0.80; without the prefetch, tiles of half a block (then at 4 and 8 rows
 * of x) fell to 0.36-0.48. */
#define CPU_ROWBLOCK_PF_SPANS 16

/* The prefetches of a tile that reads `rows` rows of p's block, called once for each span
 * it reads. Where p's span is the first of a 4 KiB page, one line CPU_PF_PAGE_BYTES past it
 * (prefetch.h's page touch); and where the tile reads fewer rows than the block, the span
 * CPU_ROWBLOCK_PF_SPANS spans past p's, a line at a time. The backend's copies start 2 MiB
 * aligned, so spans start at multiples of their size and these are the lines of every row
 * of p's block. In integers: the lines may lie past the end of the matrix, where a prefetch
 * is harmless but a pointer may not point.
 *
 * A tile of the whole block reads the one stream in order and gets the page touch alone:
 * without the lines, the AVX2 level's bf16 decode step read 0.95-1.02 of a sweep pass
 * right after it instead of 0.77-0.95, the avx512 level's 1.00-1.06 instead of 0.87-1.04,
 * and the avx512bf16 level's, already at the sweep, the same (README, "A tile of the
 * whole block reads without line prefetches"). 16 spans ahead is 128 lines, more than a
 * core keeps in flight, so those prefetches likely held the places the stream's own reads
 * needed.
 *
 * The tiles used to touch all of a block's pages at once before its tiles ran: an earlier
 * measurement had found the touch in step a fifth slower at the FMA levels, likely because
 * the compiler dropped it from those tiles (prefetch.h). Against the block at once, river
 * bench --kernels (2048 x 8192 and 8192 x 2048, 2 threads, Zen 5, three alternating
 * rounds) read bf16 at one row of x at 0.67-0.86 of the sweep before and 0.82-1.03 after
 * (1.12-1.35x; 0.95-1.28x at 2 and 8 rows), f16 1.11-2.12x. */
static inline void cpu_rowblock_prefetch(const void *p, int rows)
{
    uintptr_t s = (uintptr_t)p & ~(uintptr_t)(CPU_ROWBLOCK_SPAN - 1);
    if (rows < CPU_ROWBLOCK_ROWS) {
        uintptr_t c = s + (uintptr_t)CPU_ROWBLOCK_PF_SPANS * CPU_ROWBLOCK_SPAN;
        for (size_t l = 0; l < CPU_ROWBLOCK_SPAN; l += 64)
            cpu_prefetch_line(c + l);
    }
    cpu_prefetch_page_ahead(s);
}

/* Prefetches one line of each 4 KiB page of the `bytes` that start CPU_PF_PAGE_BYTES
 * past block (a block's rows: rows * row bytes), all at once: the prefill pack's way
 * (gemm_dot_x86.h), called before it reads a block. */
static inline void cpu_rowblock_prefetch_pages(const uint8_t *block, size_t bytes)
{
    uintptr_t a = (uintptr_t)block + CPU_PF_PAGE_BYTES;
    for (size_t o = 0; o < bytes; o += 4096)
        cpu_prefetch_line(a + o);
}

#endif
