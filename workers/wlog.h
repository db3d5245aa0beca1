/* river-worker's log: one line per event on stderr, prefixed with the worker's id so that
 * the logs of several workers (and of riverd, which may start them) read apart. */
#ifndef RIVER_WORKERS_WLOG_H
#define RIVER_WORKERS_WLOG_H

/* Levels in the order of config_log_level_t (common/config.h). */
typedef enum {
    WLOG_ERROR = 0,
    WLOG_WARN,
    WLOG_INFO,
    WLOG_DEBUG,
} wlog_level_t;

/* Sets the prefix (copied) and the least severe level printed. */
void wlog_init(const char *worker_id, int level);

void wlog(wlog_level_t level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
