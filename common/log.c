/* The serving processes' log: the line forms of common/log.h. */
#include "common/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static int log__level = CONFIG_LOG_INFO;
static bool log__journal;
static bool log__utc;
static const char *log__name = "river";
static char log__tag[128];
static bool log__tagged;

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

void log_init(const log_opts_t *opts)
{
    if (opts->name)
        log__name = opts->name;
    log__tagged = opts->tag != NULL;
    if (opts->tag)
        snprintf(log__tag, sizeof log__tag, "%s", opts->tag);
    log__utc = opts->utc;
    log__journal = opts->journal && getenv("JOURNAL_STREAM") != NULL;
}

void log_set_level(int level)
{
    if (level >= LOG_NONE && level <= CONFIG_LOG_DEBUG)
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
    if (log__journal) {
        fprintf(stderr, "<%d>%s\n", log__levels[level].priority, line);
        return;
    }
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (log__utc)
        gmtime_r(&ts.tv_sec, &tm);
    else
        localtime_r(&ts.tv_sec, &tm);
    char when[32];
    strftime(when, sizeof when, "%H:%M:%S", &tm);
    char pid[16];
    if (!log__tagged)
        snprintf(pid, sizeof pid, "%d", (int)getpid());
    fprintf(stderr, "%s.%03ld %s[%s] %s: %s\n", when, ts.tv_nsec / 1000000L, log__name,
            log__tagged ? log__tag : pid, log__levels[level].name, line);
}
