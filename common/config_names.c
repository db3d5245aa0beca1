/* The enum names every program's configuration schema shares (common/config.h). */
#include "common/config.h"

#include <stddef.h>

const char *const config_log_level_names[] = {"error", "warn", "info", "debug", NULL};
const char *const config_auth_mode_names[] = {"curve", "plain", NULL};
