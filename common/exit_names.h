/* The names of the early-exit rules and aggregations, spelled once for everything that
 * reads or writes them: the client protocol (Generate.exit.policy, which riverd checks,
 * and the gateway's river.policy), the worker's configuration, the command line and the
 * engine's reports. They sit below every process because riverd and the gateway check
 * requests without the engine; engine/exit.h orders exit_rule_t and exit_agg_t by them. */
#ifndef RIVER_COMMON_EXIT_NAMES_H
#define RIVER_COMMON_EXIT_NAMES_H

/* NULL-terminated, so that configuration schemas take them as an enum's choices. */
extern const char *const exit_names_rules[]; /* none, cosine, router, fixed: exit_rule_t */
extern const char *const exit_names_aggs[];  /* min, row: exit_agg_t */

/* The index of s in a NULL-terminated table of names, -1 when it is not there. */
int exit_names_find(const char *const *names, const char *s);

#endif
