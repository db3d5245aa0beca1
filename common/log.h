/* The serving processes' log (riverd, river-worker, river-gateway): one line per event on
 * stderr, written with one fprintf so that lines stay whole when processes share stderr.
 *
 * Lines come in the form each process has always written, since operators' scripts and
 * journals read them as they are:
 *   - without a tag (riverd, river-gateway): "HH:MM:SS.mmm NAME[PID] LEVEL: message" in
 *     local time, or, with `journal` set and JOURNAL_STREAM in the environment (under
 *     systemd), "<P>message" with P the syslog priority in the sd-daemon form, so that the
 *     journal files the line at its level and adds the time itself;
 *   - with a tag (river-worker, whose tag is its worker id, so that the logs of several
 *     workers and of the riverd that may start them read apart): "HH:MM:SS.mmm
 *     NAME[TAG] LEVEL: message", in UTC when `utc` is set. */
#ifndef RIVER_COMMON_LOG_H
#define RIVER_COMMON_LOG_H

#include <stdbool.h>

#include "common/config.h"

typedef struct log_opts {
    const char *name; /* the process's name in each line: "riverd" */
    const char *tag;  /* in the brackets after the name (copied); NULL: the process id */
    bool utc;         /* time stamps in UTC rather than local time */
    bool journal;     /* the sd-daemon form when JOURNAL_STREAM is set */
} log_opts_t;

/* A level below every message: log_set_level(LOG_NONE) silences the log (the fuzz targets
 * drive the worker's code without its chatter). */
enum { LOG_NONE = -1 };

/* Sets the form of the lines and reads the environment once; call before the first
 * message. Until then lines read "river[PID]" in local time. */
void log_init(const log_opts_t *opts);
/* Least severe level written: a config_log_level_t, or LOG_NONE; other values leave the
 * level as it was. */
void log_set_level(int level);
int log_get_level(void);

void log_msg(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define log_error(...) log_msg(CONFIG_LOG_ERROR, __VA_ARGS__)
#define log_warn(...) log_msg(CONFIG_LOG_WARN, __VA_ARGS__)
#define log_info(...) log_msg(CONFIG_LOG_INFO, __VA_ARGS__)
#define log_debug(...) log_msg(CONFIG_LOG_DEBUG, __VA_ARGS__)

#endif
