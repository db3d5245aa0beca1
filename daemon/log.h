/* riverd's log: one line per event on stderr, which systemd sends to the journal.
 *
 * Under systemd (JOURNAL_STREAM set) each line starts with the syslog priority in the
 * sd-daemon form "<3>", so the journal files it at the right level and adds the time
 * itself; elsewhere lines carry a time stamp and the level by name. */
#ifndef RIVER_DAEMON_LOG_H
#define RIVER_DAEMON_LOG_H

#include "common/config.h"

/* Reads the environment once; call before the first message. */
void log_init(const char *name);
/* Least severe level written: a config_log_level_t. */
void log_set_level(int level);
int log_get_level(void);

void log_msg(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define log_error(...) log_msg(CONFIG_LOG_ERROR, __VA_ARGS__)
#define log_warn(...) log_msg(CONFIG_LOG_WARN, __VA_ARGS__)
#define log_info(...) log_msg(CONFIG_LOG_INFO, __VA_ARGS__)
#define log_debug(...) log_msg(CONFIG_LOG_DEBUG, __VA_ARGS__)

#endif
