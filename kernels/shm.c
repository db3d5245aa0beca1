#include "kernels/shm.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/err.h"

int shm_create(size_t bytes, int *fd_out)
{
    int fd = memfd_create("river-kv", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0)
        return river_err_set(RIVER_ESYS, "shared memory: memfd_create: %s", strerror(errno));
    int e = 0;
    if (ftruncate(fd, (off_t)bytes))
        e = river_err_set(RIVER_ESYS, "shared memory: %zu bytes: %s", bytes, strerror(errno));
    else if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL))
        e = river_err_set(RIVER_ESYS, "shared memory: sealing: %s", strerror(errno));
    if (e) {
        close(fd);
        return e;
    }
    *fd_out = fd;
    return 0;
}

int shm_check(int fd, size_t bytes)
{
    /* Only a memfd has seals; anything else is not such a buffer. */
    if (fcntl(fd, F_GET_SEALS) < 0)
        return river_err_set(RIVER_EINVAL, "descriptor %d is not shared memory (%s)", fd,
                             strerror(errno));
    struct stat st;
    if (fstat(fd, &st))
        return river_err_set(RIVER_ESYS, "shared memory: fstat of descriptor %d: %s", fd,
                             strerror(errno));
    if ((size_t)st.st_size != bytes)
        return river_err_set(RIVER_EINVAL, "descriptor %d: the shared memory has %lld bytes, "
                             "%zu expected", fd, (long long)st.st_size, bytes);
    return 0;
}
