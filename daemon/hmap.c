#include "daemon/hmap.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"

typedef struct hmap_entry {
    struct hmap_entry *next;
    void *val;
    uint64_t hash;
    size_t len;
    unsigned char key[]; /* len bytes */
} hmap_entry_t;

struct hmap {
    hmap_entry_t **buckets;
    size_t n_buckets; /* a power of two */
    size_t count;
};

#define HMAP_MIN_BUCKETS 16

static uint64_t hmap__hash(const void *key, size_t len)
{
    const unsigned char *p = key;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < len; i++) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

int hmap_new(hmap_t **out)
{
    *out = NULL;
    hmap_t *m = calloc(1, sizeof *m);
    if (!m)
        return river_err_set(RIVER_ENOMEM, "hash map");
    m->buckets = calloc(HMAP_MIN_BUCKETS, sizeof *m->buckets);
    if (!m->buckets) {
        free(m);
        return river_err_set(RIVER_ENOMEM, "hash map");
    }
    m->n_buckets = HMAP_MIN_BUCKETS;
    *out = m;
    return 0;
}

void hmap_destroy(hmap_t **pm)
{
    hmap_t *m = pm ? *pm : NULL;
    if (!m)
        return;
    for (size_t b = 0; b < m->n_buckets; b++) {
        hmap_entry_t *e = m->buckets[b];
        while (e) {
            hmap_entry_t *next = e->next;
            free(e);
            e = next;
        }
    }
    free(m->buckets);
    free(m);
    *pm = NULL;
}

static hmap_entry_t **hmap__slot(const hmap_t *m, const void *key, size_t len, uint64_t h)
{
    hmap_entry_t **pe = &m->buckets[h & (m->n_buckets - 1)];
    while (*pe && !((*pe)->hash == h && (*pe)->len == len && !memcmp((*pe)->key, key, len)))
        pe = &(*pe)->next;
    return pe;
}

void *hmap_get(const hmap_t *m, const void *key, size_t len)
{
    hmap_entry_t *e = *hmap__slot(m, key, len, hmap__hash(key, len));
    return e ? e->val : NULL;
}

/* Doubles the bucket array; when memory is short the map just stays denser. */
static void hmap__grow(hmap_t *m)
{
    size_t n = m->n_buckets * 2;
    hmap_entry_t **b = calloc(n, sizeof *b);
    if (!b)
        return;
    for (size_t i = 0; i < m->n_buckets; i++) {
        hmap_entry_t *e = m->buckets[i];
        while (e) {
            hmap_entry_t *next = e->next;
            e->next = b[e->hash & (n - 1)];
            b[e->hash & (n - 1)] = e;
            e = next;
        }
    }
    free(m->buckets);
    m->buckets = b;
    m->n_buckets = n;
}

int hmap_put(hmap_t *m, const void *key, size_t len, void *val)
{
    uint64_t h = hmap__hash(key, len);
    hmap_entry_t **pe = hmap__slot(m, key, len, h);
    if (*pe) {
        (*pe)->val = val;
        return 0;
    }
    hmap_entry_t *e = malloc(sizeof *e + len);
    if (!e)
        return river_err_set(RIVER_ENOMEM, "hash map entry");
    e->next = NULL;
    e->val = val;
    e->hash = h;
    e->len = len;
    memcpy(e->key, key, len);
    *pe = e;
    m->count++;
    if (m->count * 4 > m->n_buckets * 3)
        hmap__grow(m);
    return 0;
}

void *hmap_del(hmap_t *m, const void *key, size_t len)
{
    hmap_entry_t **pe = hmap__slot(m, key, len, hmap__hash(key, len));
    hmap_entry_t *e = *pe;
    if (!e)
        return NULL;
    void *val = e->val;
    *pe = e->next;
    free(e);
    m->count--;
    return val;
}

size_t hmap_count(const hmap_t *m)
{
    return m->count;
}

void hmap_sweep(hmap_t *m, hmap_visit_fn fn, void *user)
{
    for (size_t b = 0; b < m->n_buckets; b++) {
        hmap_entry_t **pe = &m->buckets[b];
        while (*pe) {
            hmap_entry_t *e = *pe;
            if (fn(user, e->key, e->len, e->val)) {
                *pe = e->next;
                free(e);
                m->count--;
            } else {
                pe = &e->next;
            }
        }
    }
}
