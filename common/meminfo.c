#include "common/meminfo.h"

#include <stdio.h>
#include <string.h>

/* The first integer in the file at path, or -1 (also for v2's "max", no limit). */
static int64_t meminfo__read_int(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    long long v = -1;
    if (fscanf(f, "%lld", &v) != 1)
        v = -1;
    fclose(f);
    return v;
}

/* The least headroom (limit - usage) of the cgroup at dir and of every cgroup above it
 * up to root, with the limit and usage in the files named `limit` and `usage`; -1 where
 * none of them has a limit. A v1 "no limit" is a value near INT64_MAX. */
static int64_t meminfo__cgroup_room(char *dir, size_t root_len, const char *limit,
                                    const char *usage)
{
    int64_t room = -1;
    for (;;) {
        char path[4200];
        snprintf(path, sizeof path, "%s/%s", dir, limit);
        int64_t lim = meminfo__read_int(path);
        snprintf(path, sizeof path, "%s/%s", dir, usage);
        int64_t use = meminfo__read_int(path);
        if (lim >= 0 && lim < ((int64_t)1 << 62)) {
            int64_t r = use >= 0 && use < lim ? lim - use : 0;
            if (room < 0 || r < room)
                room = r;
        }
        char *slash = strrchr(dir, '/');
        if (strlen(dir) <= root_len || !slash || (size_t)(slash - dir) < root_len)
            break;
        *slash = '\0';
    }
    return room;
}

int64_t meminfo_available_from(const char *meminfo, const char *cgroup, const char *fs)
{
    int64_t avail = -1;
    char line[4096];
    FILE *f = fopen(meminfo, "r");
    while (f && fgets(line, sizeof line, f)) {
        long long kib;
        if (sscanf(line, "MemAvailable: %lld kB", &kib) == 1) {
            avail = (int64_t)kib * 1024;
            break;
        }
    }
    if (f)
        fclose(f);
    f = fopen(cgroup, "r");
    while (f && fgets(line, sizeof line, f)) {
        /* "id:controllers:path"; v2 is "0::path". */
        char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c2)
            continue;
        *c1 = '\0';
        *c2 = '\0';
        char *path = c2 + 1;
        path[strcspn(path, "\n")] = '\0';
        const char *controllers = c1 + 1;
        char dir[4096];
        int64_t room = -1;
        if (!strcmp(line, "0") && !*controllers) {
            size_t n = (size_t)snprintf(dir, sizeof dir, "%s", fs);
            snprintf(dir + n, sizeof dir - n, "%s", strcmp(path, "/") ? path : "");
            room = meminfo__cgroup_room(dir, n, "memory.max", "memory.current");
        } else if (strstr(controllers, "memory")) {
            size_t n = (size_t)snprintf(dir, sizeof dir, "%s/memory", fs);
            snprintf(dir + n, sizeof dir - n, "%s", strcmp(path, "/") ? path : "");
            room = meminfo__cgroup_room(dir, n, "memory.limit_in_bytes",
                                        "memory.usage_in_bytes");
        }
        if (room >= 0 && (avail < 0 || room < avail))
            avail = room;
    }
    if (f)
        fclose(f);
    return avail > 0 ? avail : 0;
}

int64_t meminfo_available(void)
{
    return meminfo_available_from("/proc/meminfo", "/proc/self/cgroup", "/sys/fs/cgroup");
}
