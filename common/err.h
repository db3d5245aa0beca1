/* River error codes: one X-macro table gives every code its name and message.
 *
 * Functions return 0 on success or a negative RIVER_E* code. The message for a code comes
 * from river_strerror(); details (which file, which tensor) go through river_err_set(),
 * which keeps one thread-local line that callers print with river_err_detail(). */
#ifndef RIVER_COMMON_ERR_H
#define RIVER_COMMON_ERR_H

#include <stddef.h>

#define RIVER_ERR_TABLE(X)                                                   \
    X(RIVER_OK, 0, "success")                                                \
    X(RIVER_ENOMEM, -1, "out of memory")                                     \
    X(RIVER_EIO, -2, "input/output error")                                   \
    X(RIVER_EINVAL, -3, "invalid argument")                                  \
    X(RIVER_EFORMAT, -4, "malformed file")                                   \
    X(RIVER_ETRUNC, -5, "truncated file")                                    \
    X(RIVER_ENOTFOUND, -6, "not found")                                      \
    X(RIVER_EUNSUPPORTED, -7, "unsupported")                                 \
    X(RIVER_ESHAPE, -8, "wrong tensor shape")                                \
    X(RIVER_EDTYPE, -9, "wrong or unknown dtype")                            \
    X(RIVER_ERANGE, -10, "value out of range")                               \
    X(RIVER_EFULL, -11, "resource exhausted")                                \
    X(RIVER_EARCH, -12, "unknown architecture")                              \
    X(RIVER_ETOKENIZER, -13, "tokenizer error")                              \
    X(RIVER_ESTATE, -14, "invalid state")                                    \
    X(RIVER_ESYS, -15, "system call failed")                                 \
    X(RIVER_EDEVICE, -16, "device error")                                    \
    X(RIVER_ETIMEOUT, -17, "timed out")                                      \
    X(RIVER_ECANCELED, -18, "canceled")                                      \
    X(RIVER_EPROTO, -19, "protocol error")                                   \
    X(RIVER_ECONFIG, -20, "configuration error")                             \
    X(RIVER_EUNAVAILABLE, -21, "peer unavailable")                           \
    X(RIVER_EAUTH, -22, "authentication refused")

enum river_err {
#define RIVER_ERR_ENUM(name, value, msg) name = (value),
    RIVER_ERR_TABLE(RIVER_ERR_ENUM)
#undef RIVER_ERR_ENUM
};

/* The fixed message of a code; "unknown error" for codes outside the table. */
const char *river_strerror(int err);

/* The symbolic name of a code ("RIVER_EFORMAT"). */
const char *river_err_name(int err);

/* Records a printf-style detail for the calling thread and returns err unchanged, so that
 * `return river_err_set(RIVER_EFORMAT, "%s: header too long", path);` reads naturally. */
int river_err_set(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The detail recorded last on this thread, or the code's message when none was recorded
 * since river_err_clear(). */
const char *river_err_detail(void);

void river_err_clear(void);

#endif
