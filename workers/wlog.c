#include "workers/wlog.h"

#include <stdarg.h>
#include <stdio.h>
#include <time.h>

static char wlog__id[128] = "?";
static int wlog__level = WLOG_INFO;

void wlog_init(const char *worker_id, int level)
{
    snprintf(wlog__id, sizeof wlog__id, "%s", worker_id);
    wlog__level = level;
}

void wlog(wlog_level_t level, const char *fmt, ...)
{
    static const char *names[] = {"error", "warn", "info", "debug"};
    if ((int)level > wlog__level)
        return;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    /* One fprintf per line keeps lines whole when several processes share stderr. */
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%02d:%02d:%02d.%03ld river-worker[%s] %s: %s\n", tm.tm_hour, tm.tm_min,
            tm.tm_sec, ts.tv_nsec / 1000000, wlog__id, names[level], msg);
}
