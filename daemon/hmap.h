/* A hash map from byte strings to pointers, for riverd's tables: workers by ZMQ routing
 * id, requests by number and by (client, request id), sessions by id.
 *
 * Keys are copied into the map; values are borrowed. Chained buckets, FNV-1a, the table
 * doubles past a load of 3/4 so that lookups stay O(1) however many requests are in
 * flight. */
#ifndef RIVER_DAEMON_HMAP_H
#define RIVER_DAEMON_HMAP_H

#include <stdbool.h>
#include <stddef.h>

typedef struct hmap hmap_t;

int hmap_new(hmap_t **out);
void hmap_destroy(hmap_t **m);

void *hmap_get(const hmap_t *m, const void *key, size_t len);
/* Sets key to val, replacing a value it had. RIVER_ENOMEM leaves the map as it was. */
int hmap_put(hmap_t *m, const void *key, size_t len, void *val);
/* Removes key; returns its value, NULL when it had none. */
void *hmap_del(hmap_t *m, const void *key, size_t len);
size_t hmap_count(const hmap_t *m);

/* Calls fn on every entry; an entry for which fn returns true is removed. fn must not
 * change the map otherwise. */
typedef bool (*hmap_visit_fn)(void *user, const void *key, size_t len, void *val);
void hmap_sweep(hmap_t *m, hmap_visit_fn fn, void *user);

#endif
