#include "daemon/log.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static int log__level = CONFIG_LOG_INFO;
static bool log__journal;
static const char *log__name = "riverd";

/* Indexed by config_log_level_t. */
static const struct {
    const char *name;
    int priority; /* syslog priority for the journal */
} log__levels[] = {
    [CONFIG_LOG_ERROR] = {"error", 3},
    [CONFIG_LOG_WARN] = {"warn", 4},
    [CONFIG_LOG_INFO] = {"info", 6},
    [CONFIG_LOG_DEBUG] = {"debug", 7},
};

void log_init(const char *name)
{
    log__journal = getenv("JOURNAL_STREAM") != NULL;
    if (name)
        log__name = name;
}

void log_set_level(int level)
{
    if (level >= CONFIG_LOG_ERROR && level <= CONFIG_LOG_DEBUG)
        log__level = level;
}

int log_get_level(void)
{
    return log__level;
}

void log_msg(int level, const char *fmt, ...)
{
    if (level > log__level || level < CONFIG_LOG_ERROR)
        return;
    char line[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    /* One fprintf per line keeps lines whole when workers share the same stderr. */
    if (log__journal) {
        fprintf(stderr, "<%d>%s\n", log__levels[level].priority, line);
        return;
    }
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    localtime_r(&ts.tv_sec, &tm);
    char when[32];
    strftime(when, sizeof when, "%H:%M:%S", &tm);
    fprintf(stderr, "%s.%03ld %s[%d] %s: %s\n", when, ts.tv_nsec / 1000000L, log__name,
            (int)getpid(), log__levels[level].name, line);
}
