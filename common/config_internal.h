/* What the configuration files share between the files that read and write them
 * (common/config.h is the public side): the key lookup, value conversion and the
 * descriptions of what a key expects. */
#ifndef RIVER_COMMON_CONFIG_INTERNAL_H
#define RIVER_COMMON_CONFIG_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "common/config.h"

/* The longest key name, with its section and list index ("local_workers[1].name"). */
#define CONFIG_NAME_MAX 256

/* The index of key `name` in s, or -1. */
long config__find(const config_schema_t *s, const char *name);
void config__strv_free(config_strv_t *l);
/* Appends a copy of s[0..n): 0 or RIVER_ENOMEM (l unchanged). */
int config__strv_push(config_strv_t *l, const char *s, size_t n);
/* ms as the files write durations, in the largest unit that divides it. */
void config__fmt_duration(char *buf, size_t cap, int64_t ms);
/* What key k accepts, in words, for an error message. */
void config__expect(const config_key_t *k, char *buf, size_t cap);
/* Converts the text v to key k's type into dst: 0, 1 when v is not a value of k (wrong
 * type or out of range), RIVER_ENOMEM when a copy fails. */
int config__convert(const config_key_t *k, const char *v, void *dst);
/* Every key of s at its default in cfg (zeroed before). 0 or a negative river_err. */
int config__apply_defaults(const config_schema_t *s, void *cfg);

#endif
