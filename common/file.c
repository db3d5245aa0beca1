#include "common/file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/err.h"

int river_read_file(const char *path, char **data, size_t *len)
{
    *data = NULL;
    *len = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return river_err_set(errno == ENOENT ? RIVER_ENOTFOUND : RIVER_EIO, "%s: cannot open: %s",
                             path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return river_err_set(RIVER_EIO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return river_err_set(RIVER_EINVAL, "%s: not a regular file", path);
    }
    size_t cap = st.st_size > 0 ? (size_t)st.st_size : 0;
    char *buf = malloc(cap + 1);
    if (!buf) {
        close(fd);
        return river_err_set(RIVER_ENOMEM, "%s: no memory for %zu bytes", path, cap);
    }
    size_t n = 0;
    for (;;) {
        if (n == cap) {
            /* The file grew, or it is a special file that reports size 0. */
            size_t ncap = cap ? cap * 2 : 4096;
            char *nb = realloc(buf, ncap + 1);
            if (!nb) {
                free(buf);
                close(fd);
                return river_err_set(RIVER_ENOMEM, "%s: no memory", path);
            }
            buf = nb;
            cap = ncap;
        }
        ssize_t r = read(fd, buf + n, cap - n);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            int e = errno;
            free(buf);
            close(fd);
            return river_err_set(RIVER_EIO, "%s: read failed: %s", path, strerror(e));
        }
        if (r == 0)
            break;
        n += (size_t)r;
    }
    if (close(fd) != 0) {
        int e = errno;
        free(buf);
        return river_err_set(RIVER_EIO, "%s: close failed: %s", path, strerror(e));
    }
    buf[n] = '\0';
    *data = buf;
    *len = n;
    return 0;
}
