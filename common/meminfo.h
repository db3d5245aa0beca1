/* How much memory this process can still take: what the kernel reports available, bounded
 * by the memory limits of the cgroups the process is in (v2 memory.max, v1
 * memory.limit_in_bytes, at every level up to the root), so that a worker in a container
 * sizes its KV pool by the container's memory, not the host's. */
#ifndef RIVER_COMMON_MEMINFO_H
#define RIVER_COMMON_MEMINFO_H

#include <stdint.h>

/* Bytes, or 0 where nothing can be read. Reads /proc/meminfo, /proc/self/cgroup and the
 * files under /sys/fs/cgroup; changes nothing. */
int64_t meminfo_available(void);

/* The same from the given files: a meminfo (MemAvailable), a cgroup membership list as
 * /proc/self/cgroup writes it, and the directory the cgroup file systems are mounted under
 * (v2 at its root, v1's memory controller in memory/). For tests. */
int64_t meminfo_available_from(const char *meminfo, const char *cgroup, const char *fs);

#endif
