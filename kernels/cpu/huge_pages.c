#include "kernels/cpu/huge_pages.h"

#include <stdint.h>
#include <sys/mman.h>

void *cpu_huge_map(size_t bytes, size_t *len)
{
    size_t n = (bytes + CPU_HUGE_BYTES - 1) / CPU_HUGE_BYTES * CPU_HUGE_BYTES;
    if (n == 0)
        n = CPU_HUGE_BYTES;
    /* One page of slack finds an aligned start; what lies either side goes back (munmap of
     * a range inside a mapping of ours only fails on bad arguments). */
    uint8_t *m = mmap(NULL, n + CPU_HUGE_BYTES, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED)
        return NULL;
    uint8_t *a = (uint8_t *)(((uintptr_t)m + CPU_HUGE_BYTES - 1) & ~(uintptr_t)(CPU_HUGE_BYTES - 1));
    if (a > m)
        (void)munmap(m, (size_t)(a - m));
    if (m + CPU_HUGE_BYTES > a)
        (void)munmap(a + n, (size_t)(m + CPU_HUGE_BYTES - a));
    /* Only advice: refused where transparent huge pages are off. */
    (void)madvise(a, n, MADV_HUGEPAGE);
    *len = n;
    return a;
}
