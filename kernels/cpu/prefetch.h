/* Internal to the CPU backend: the software prefetches its kernels share.
 *
 * Why a header of its own: GCC (12.2) counts __builtin_prefetch as free of effects and
 * drops one under a condition, and with it at times the unconditional ones beside it (a
 * small file reproduces it at -O2: a loop of prefetches followed by one more, conditional
 * or not, compiles to no prefetch at all). In the FMA levels' decode tiles the page touch
 * below was compiled to nothing where the same source kept it in the avx512bf16 tile. The
 * touches go through cpu_prefetch_line, which the compiler keeps as written. */
#ifndef RIVER_KERNELS_CPU_PREFETCH_H
#define RIVER_KERNELS_CPU_PREFETCH_H

#include <stdint.h>

/* Prefetches the line at address a into every cache level. An integer, not a pointer:
 * callers ask for lines past the end of their arrays, where a prefetch is harmless but a
 * pointer may not point. */
static inline void cpu_prefetch_line(uintptr_t a)
{
#if defined(__x86_64__) || defined(__i386__)
    __asm__ volatile("prefetcht0 (%0)" : : "r"(a));
#else
    __builtin_prefetch((const void *)a, 0, 3);
#endif
}

/* How far ahead of a decode kernel each 4 KiB page of its weights gets one prefetched
 * line, in bytes. The processor's prefetchers appear to stop at every 4 KiB boundary, even
 * in the 2 MiB pages the backend places weights in, so a stream they follow starts cold on
 * each page; one line of each page from 64 KiB ahead sets them to work on it long before
 * the kernel comes to it (in a standalone loop of the AVX2 tile on one thread, a line for
 * every 2 KiB read a little slower than one for every 4 KiB and one for every 8 KiB far
 * slower, from 32 to 512 KiB ahead alike; README, "Every 4 KiB page touched 64 KiB
 * ahead"). */
#define CPU_PF_PAGE_BYTES 65536

/* Touches the page CPU_PF_PAGE_BYTES past a when a is the first byte of a 4 KiB page. A
 * kernel calls it for each place it starts to read, in step with its reading. */
static inline void cpu_prefetch_page_ahead(uintptr_t a)
{
    if ((a & 4095) == 0)
        cpu_prefetch_line(a + CPU_PF_PAGE_BYTES);
}

#endif
