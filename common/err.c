#include "common/err.h"

#include <stdarg.h>
#include <stdio.h>

static _Thread_local char err__detail[1024];

const char *river_strerror(int err)
{
    switch (err) {
#define RIVER_ERR_MSG(name, value, msg) \
    case value:                         \
        return msg;
        RIVER_ERR_TABLE(RIVER_ERR_MSG)
#undef RIVER_ERR_MSG
    }
    return "unknown error";
}

const char *river_err_name(int err)
{
    switch (err) {
#define RIVER_ERR_NAME(name, value, msg) \
    case value:                          \
        return #name;
        RIVER_ERR_TABLE(RIVER_ERR_NAME)
#undef RIVER_ERR_NAME
    }
    return "RIVER_E?";
}

int river_err_set(int err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err__detail, sizeof err__detail, fmt, ap);
    va_end(ap);
    return err;
}

const char *river_err_detail(void)
{
    return err__detail[0] ? err__detail : "no detail";
}

void river_err_clear(void)
{
    err__detail[0] = '\0';
}
