/* Anonymous memory in 2 MiB pages, for what decode streams: the CPU backend's copies of the
 * weights and the read sweep they are judged against. Read from 4 KiB pages, a stream takes
 * a TLB miss every 4 KiB of each row it reads, which on a virtual machine walks two sets of
 * page tables; transparent huge pages (madvise or always mode) take that away. */
#ifndef RIVER_KERNELS_CPU_HUGE_PAGES_H
#define RIVER_KERNELS_CPU_HUGE_PAGES_H

#include <stddef.h>

#define CPU_HUGE_BYTES ((size_t)2 << 20)

/* Zeroed memory for `bytes`, aligned to and rounded up to whole 2 MiB pages (*len receives
 * the length), advised MADV_HUGEPAGE: the kernel backs only aligned 2 MiB ranges with huge
 * pages, and without them (THP off) small pages serve. The caller frees it with
 * munmap(p, *len). NULL when the mapping fails; nothing is left mapped then. */
void *cpu_huge_map(size_t bytes, size_t *len);

#endif
