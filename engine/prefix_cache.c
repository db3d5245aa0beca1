#include "engine/prefix_cache.h"

#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/prefix_hash.h"

/* Bucket keys of the two provenances of one name differ by this. */
#define PREFIX_LOSSY_KEY 0xA5A5A5A55A5A5A5Aull

/* One entry per page of the pool, by page id; only cached ones are in the table. */
typedef struct pc_entry {
    prefix_name_t name;   /* prefix_hash_page chain */
    prefix_name_t parent; /* name of the page before it, the root for a first page */
    int32_t parent_page;  /* the cached page before it, -1 for a first page */
    uint64_t parent_serial; /* that page's serial when this one was cached */
    uint64_t serial;      /* unique per insertion, so a reused slot is not its old page */
    int32_t next;     /* next entry of its bucket, -1 at the end */
    int32_t prev_lru, next_lru; /* LRU list, while refs == 0 */
    int refs;         /* page tables holding it */
    uint8_t cached;
    uint8_t lossy;
} pc_entry_t;

struct prefix_cache {
    kv_pool_t *kv;
    uint64_t seed;
    prefix_key_t key;
    prefix_name_fn name_page;
    uint64_t next_serial;
    int page_size;
    int n_pages;       /* of the pool */
    int max_pages;
    int n_cached;
    int n_evictable;
    int64_t evictions;
    pc_entry_t *e;     /* (n_pages) */
    int32_t *tokens;   /* (n_pages, page_size) ids of each cached page */
    int32_t *buckets;  /* (n_buckets) first entry, -1: none */
    uint64_t mask;     /* n_buckets - 1 */
    int32_t lru_head, lru_tail; /* head: least recently used */
    float *copy;       /* (copy_n) host buffer for copying a page (kv_pool_copy_page) */
    size_t copy_n;
};

static uint64_t pc__key(prefix_name_t name, int lossy)
{
    return name.lo ^ (lossy ? PREFIX_LOSSY_KEY : 0);
}

int prefix_cache_new(prefix_cache_t **out, kv_pool_t *kv, const prefix_cache_config_t *cfg)
{
    if (kv_pool_is_attached(kv))
        return river_err_set(RIVER_EINVAL, "prefix cache: an attached pool hands out no pages");
    if (cfg->max_pages < 0)
        return river_err_set(RIVER_EINVAL, "prefix cache: max_pages %d must be >= 0",
                             cfg->max_pages);
    prefix_cache_t *pc = calloc(1, sizeof *pc);
    if (!pc)
        return river_err_set(RIVER_ENOMEM, "prefix cache: state");
    pc->kv = kv;
    pc->seed = cfg->seed ? cfg->seed : 1;
    pc->key = cfg->key;
    pc->name_page = cfg->name_page ? cfg->name_page : prefix_hash_page;
    pc->next_serial = 1;
    pc->page_size = kv_pool_page_size(kv);
    pc->n_pages = kv_pool_total_pages(kv);
    pc->max_pages = cfg->max_pages && cfg->max_pages < pc->n_pages ? cfg->max_pages
                                                                     : pc->n_pages;
    size_t nb = 16;
    while (nb < 2 * (size_t)pc->n_pages)
        nb *= 2;
    pc->mask = nb - 1;
    pc->copy_n = kv_pool_page_floats(kv);
    pc->e = calloc((size_t)pc->n_pages, sizeof *pc->e);
    pc->tokens = malloc((size_t)pc->n_pages * (size_t)pc->page_size * sizeof *pc->tokens);
    pc->buckets = malloc(nb * sizeof *pc->buckets);
    pc->copy = malloc(pc->copy_n * sizeof *pc->copy);
    if (!pc->e || !pc->tokens || !pc->buckets || !pc->copy) {
        prefix_cache_destroy(&pc);
        return river_err_set(RIVER_ENOMEM, "prefix cache: tables for %d pages of %d",
                             kv_pool_total_pages(kv), kv_pool_page_size(kv));
    }
    for (size_t i = 0; i < nb; i++)
        pc->buckets[i] = -1;
    pc->lru_head = pc->lru_tail = -1;
    *out = pc;
    return 0;
}

void prefix_cache_destroy(prefix_cache_t **pp)
{
    prefix_cache_t *pc = *pp;
    if (!pc)
        return;
    if (pc->e)
        prefix_cache_evict(pc, pc->n_pages);
    free(pc->e);
    free(pc->tokens);
    free(pc->buckets);
    free(pc->copy);
    free(pc);
    *pp = NULL;
}

/* ---- LRU list of unreferenced pages ---- */

static void pc__lru_remove(prefix_cache_t *pc, int32_t p)
{
    pc_entry_t *e = &pc->e[p];
    if (e->prev_lru >= 0)
        pc->e[e->prev_lru].next_lru = e->next_lru;
    else
        pc->lru_head = e->next_lru;
    if (e->next_lru >= 0)
        pc->e[e->next_lru].prev_lru = e->prev_lru;
    else
        pc->lru_tail = e->prev_lru;
    e->prev_lru = e->next_lru = -1;
    pc->n_evictable--;
}

static void pc__lru_push(prefix_cache_t *pc, int32_t p)
{
    pc_entry_t *e = &pc->e[p];
    e->next_lru = -1;
    e->prev_lru = pc->lru_tail;
    if (pc->lru_tail >= 0)
        pc->e[pc->lru_tail].next_lru = p;
    else
        pc->lru_head = p;
    pc->lru_tail = p;
    pc->n_evictable++;
}

static void pc__ref(prefix_cache_t *pc, int32_t p)
{
    if (pc->e[p].refs++ == 0)
        pc__lru_remove(pc, p);
}

static void pc__unref(prefix_cache_t *pc, int32_t p)
{
    if (--pc->e[p].refs == 0)
        pc__lru_push(pc, p);
}

/* ---- The table ---- */

/* Whether e follows the prefix ps has named so far: the root for a first page, else the
 * very cached page that holds it (same slot, same serial). By induction over the pages a
 * hit then holds exactly the sequence's tokens from position 0, whatever the names. */
static int pc__follows(const pc_entry_t *e, const prefix_seq_t *ps)
{
    if (ps->chain_page == -1)
        return e->parent_page == -1 && prefix_name_eq(e->parent, ps->root);
    if (ps->chain_page < 0)
        return 0;
    return e->parent_page == ps->chain_page && e->parent_serial == ps->chain_serial &&
           prefix_name_eq(e->parent, ps->chain);
}

static int32_t pc__find(const prefix_cache_t *pc, prefix_name_t name, const prefix_seq_t *ps,
                        const int32_t *ids, int lossy)
{
    for (int32_t p = pc->buckets[pc__key(name, lossy) & pc->mask]; p >= 0; p = pc->e[p].next) {
        const pc_entry_t *e = &pc->e[p];
        /* The tokens and the page before are compared too: a name collision must not hand
         * out another prefix's K/V. */
        if (prefix_name_eq(e->name, name) && e->lossy == lossy && pc__follows(e, ps) &&
            !memcmp(pc->tokens + (size_t)p * (size_t)pc->page_size, ids,
                    (size_t)pc->page_size * sizeof *ids))
            return p;
    }
    return -1;
}

static void pc__unlink(prefix_cache_t *pc, int32_t p)
{
    pc_entry_t *e = &pc->e[p];
    int32_t *link = &pc->buckets[pc__key(e->name, e->lossy) & pc->mask];
    while (*link >= 0 && *link != p)
        link = &pc->e[*link].next;
    if (*link == p)
        *link = e->next;
    e->next = -1;
    e->cached = 0;
    pc->n_cached--;
}

int prefix_cache_evict(prefix_cache_t *pc, int n)
{
    int done = 0;
    while (done < n && pc->lru_head >= 0) {
        int32_t p = pc->lru_head;
        pc__lru_remove(pc, p);
        pc__unlink(pc, p);
        kv_pool_free_page(pc->kv, p);
        pc->evictions++;
        done++;
    }
    return done;
}

static void pc__insert(prefix_cache_t *pc, int32_t p, prefix_name_t name,
                       const prefix_seq_t *ps, const int32_t *ids, int lossy)
{
    pc_entry_t *e = &pc->e[p];
    e->name = name;
    e->parent = ps->chain;
    e->parent_page = ps->chain_page;
    e->parent_serial = ps->chain_page >= 0 ? pc->e[ps->chain_page].serial : 0;
    e->serial = pc->next_serial++;
    e->lossy = (uint8_t)lossy;
    e->cached = 1;
    e->refs = 1; /* the sequence that wrote it */
    e->prev_lru = e->next_lru = -1;
    memcpy(pc->tokens + (size_t)p * (size_t)pc->page_size, ids,
           (size_t)pc->page_size * sizeof *ids);
    uint64_t b = pc__key(name, lossy) & pc->mask;
    e->next = pc->buckets[b];
    pc->buckets[b] = p;
    pc->n_cached++;
}

/* ---- Sequences ---- */

/* Back to no page named, under the sequence's root. */
static void pc__seq_rewind(prefix_seq_t *ps)
{
    ps->n_named = 0;
    ps->chain = ps->root;
    ps->chain_page = -1;
    ps->chain_serial = 0;
    ps->broken = 0;
    if (ps->lossy)
        memset(ps->lossy, 0, (size_t)ps->cap);
}

void prefix_seq_init(prefix_seq_t *ps, const prefix_cache_t *pc)
{
    memset(ps, 0, sizeof *ps);
    ps->chain_page = -1;
    if (pc)
        prefix_seq_set_salt(ps, pc, NULL, 0);
}

void prefix_seq_set_salt(prefix_seq_t *ps, const prefix_cache_t *pc, const void *salt,
                         size_t n)
{
    ps->root = prefix_hash_root(&pc->key, pc->seed, salt, n);
    pc__seq_rewind(ps);
}

/* Page p now holds the prefix ps has named (or nothing does, p -2). */
static void pc__seq_follow(const prefix_cache_t *pc, prefix_seq_t *ps, prefix_name_t name,
                           int32_t p)
{
    ps->chain = name;
    ps->chain_page = p;
    ps->chain_serial = p >= 0 ? pc->e[p].serial : 0;
    ps->n_named++;
}

void prefix_seq_free(prefix_seq_t *ps)
{
    free(ps->lossy);
    memset(ps, 0, sizeof *ps);
}

static int pc__seq_grow(prefix_seq_t *ps, int n)
{
    if (n <= ps->cap)
        return 0;
    int cap = ps->cap ? ps->cap : 16;
    while (cap < n)
        cap *= 2;
    uint8_t *l = realloc(ps->lossy, (size_t)cap);
    if (!l)
        return river_err_set(RIVER_ENOMEM, "prefix cache: provenance of %d pages", cap);
    memset(l + ps->cap, 0, (size_t)(cap - ps->cap));
    ps->lossy = l;
    ps->cap = cap;
    return 0;
}

int prefix_seq_mark_lossy(prefix_seq_t *ps, const prefix_cache_t *pc, int pos)
{
    int page = pos / pc->page_size;
    int e = pc__seq_grow(ps, page + 1);
    if (e) {
        ps->broken = 1; /* an unrecorded river slot must never be offered as exact */
        return e;
    }
    ps->lossy[page] = 1;
    return 0;
}

/* Copies every slot of page src into page dst (all layers, K and V, in the pool's dtype). */
static int pc__copy_page(prefix_cache_t *pc, int32_t src, int32_t dst)
{
    return kv_pool_copy_page(pc->kv, src, dst, pc->copy);
}

/* Looks for a cached page after `parent` whose leading ids match ids (at most n of them),
 * usable under `exact`; returns it and the matched length, or -1. */
static int32_t pc__find_partial(const prefix_cache_t *pc, const prefix_seq_t *ps,
                                const int32_t *ids, size_t n, int exact, size_t *matched)
{
    int32_t best = -1;
    size_t best_m = 0;
    for (int32_t p = 0; p < pc->n_pages; p++) {
        const pc_entry_t *e = &pc->e[p];
        if (!e->cached || !pc__follows(e, ps) || (exact && e->lossy))
            continue;
        const int32_t *t = pc->tokens + (size_t)p * (size_t)pc->page_size;
        size_t m = 0;
        while (m < n && t[m] == ids[m])
            m++;
        if (m > best_m || (m == best_m && m > 0 && best >= 0 && pc->e[best].lossy && !e->lossy)) {
            best = p;
            best_m = m;
        }
    }
    *matched = best_m;
    return best_m ? best : -1;
}

int prefix_cache_acquire(prefix_cache_t *pc, kv_seq_t *kv, prefix_seq_t *ps,
                         const int32_t *ids, size_t n_ids, size_t max_tokens, int exact,
                         size_t *hit)
{
    *hit = 0;
    pc__seq_rewind(ps);
    if (max_tokens > n_ids)
        max_tokens = n_ids;
    size_t P = (size_t)pc->page_size;
    size_t k_max = max_tokens / P;
    int e;
    if ((e = pc__seq_grow(ps, (int)k_max + 1)))
        return e;
    size_t k = 0;
    for (; k < k_max; k++) {
        const int32_t *t = ids + k * P;
        prefix_name_t name = pc->name_page(&pc->key, ps->chain, t, P);
        int32_t p = pc__find(pc, name, ps, t, 0);
        if (p < 0 && !exact)
            p = pc__find(pc, name, ps, t, 1);
        if (p < 0)
            break;
        if ((e = kv_seq_push(kv, p)))
            goto fail;
        pc__ref(pc, p);
        ps->lossy[k] = pc->e[p].lossy;
        pc__seq_follow(pc, ps, name, p);
    }
    size_t got = k * P;
    size_t rest = max_tokens - got;
    if (rest > P - 1)
        rest = P - 1; /* a whole page would have been found above */
    if (rest > 0) {
        size_t m;
        int32_t src = pc__find_partial(pc, ps, ids + got, rest, exact, &m);
        if (src >= 0) {
            int32_t dst;
            /* Pinned, so that making room for the copy cannot evict the page copied. */
            pc__ref(pc, src);
            if (kv_pool_free_pages(pc->kv) == 0)
                prefix_cache_evict(pc, 1);
            if (kv_pool_alloc_page(pc->kv, &dst) == 0) {
                if (pc__copy_page(pc, src, dst) == 0 && kv_seq_push(kv, dst) == 0) {
                    ps->lossy[k] = pc->e[src].lossy;
                    got += m;
                } else {
                    kv_pool_free_page(pc->kv, dst);
                }
            }
            pc__unref(pc, src);
        }
    }
    *hit = got;
    return 0;

fail:
    prefix_cache_release(pc, kv, ps);
    return e;
}

void prefix_cache_publish(prefix_cache_t *pc, kv_seq_t *kv, prefix_seq_t *ps,
                          const int32_t *ids, size_t n_written)
{
    size_t P = (size_t)pc->page_size;
    while (!ps->broken && ps->n_named < kv->n_pages &&
           (size_t)(ps->n_named + 1) * P <= n_written) {
        int i = ps->n_named;
        if (pc__seq_grow(ps, i + 1)) {
            ps->broken = 1;
            return;
        }
        int lossy = ps->lossy[i] || (i > 0 && ps->lossy[i - 1]);
        ps->lossy[i] = (uint8_t)lossy;
        const int32_t *t = ids + (size_t)i * P;
        prefix_name_t name = pc->name_page(&pc->key, ps->chain, t, P);
        int32_t p = kv->pages[i];
        /* The page that holds this prefix from now on: the sequence's own once cached, an
         * equal cached one, or none (its followers cannot be cached either). */
        int32_t holder = -2;
        if (pc->e[p].cached) {
            holder = p;
        } else if (ps->chain_page != -2) {
            holder = pc__find(pc, name, ps, t, lossy);
            if (holder < 0) {
                /* Evicting may take the page before this one; it then holds nothing. */
                if (pc->n_cached >= pc->max_pages)
                    prefix_cache_evict(pc, 1);
                if (pc->n_cached < pc->max_pages &&
                    (ps->chain_page < 0 || (pc->e[ps->chain_page].cached &&
                                            pc->e[ps->chain_page].serial == ps->chain_serial))) {
                    pc__insert(pc, p, name, ps, t, lossy);
                    holder = p;
                } else {
                    holder = -2;
                }
            }
        }
        pc__seq_follow(pc, ps, name, holder);
    }
}

void prefix_cache_release(prefix_cache_t *pc, kv_seq_t *kv, prefix_seq_t *ps)
{
    /* Last page first: the pages of a prefix become most recently used in order, so the
     * deepest is evicted before the ones it needs. */
    for (int i = kv->n_pages - 1; i >= 0; i--) {
        int32_t p = kv->pages[i];
        if (pc->e[p].cached)
            pc__unref(pc, p);
        else
            kv_pool_free_page(pc->kv, p);
    }
    free(kv->pages);
    kv_seq_init(kv);
    pc__seq_rewind(ps);
}

int prefix_cache_pages(const prefix_cache_t *pc) { return pc->n_cached; }
int prefix_cache_evictable(const prefix_cache_t *pc) { return pc->n_evictable; }
int64_t prefix_cache_evictions(const prefix_cache_t *pc) { return pc->evictions; }
uint64_t prefix_cache_seed(const prefix_cache_t *pc) { return pc->seed; }
const prefix_key_t *prefix_cache_key(const prefix_cache_t *pc) { return &pc->key; }

size_t prefix_cache_summary(const prefix_cache_t *pc, uint64_t *out, size_t max)
{
    size_t n = 0;
    for (int32_t p = 0; p < pc->n_pages && n < max; p++)
        if (pc->e[p].cached && pc->e[p].refs > 0)
            out[n++] = pc->e[p].name.lo;
    for (int32_t p = pc->lru_tail; p >= 0 && n < max; p = pc->e[p].prev_lru)
        out[n++] = pc->e[p].name.lo;
    return n;
}

int prefix_cache_check(const prefix_cache_t *pc, const kv_seq_t *const *seqs, int n_seqs,
                       int *n_private)
{
    int *seen = calloc((size_t)pc->n_pages, sizeof *seen);
    if (!seen)
        return river_err_set(RIVER_ENOMEM, "prefix cache: check");
    int e = 0, priv = 0, n_free = 0, n_cached = 0, n_lru = 0;
    for (int s = 0; s < n_seqs && !e; s++)
        for (int i = 0; i < seqs[s]->n_pages && !e; i++) {
            int32_t p = seqs[s]->pages[i];
            if (p < 0 || p >= pc->n_pages)
                e = river_err_set(RIVER_ESTATE, "prefix cache: page %d out of the pool", p);
            else if (kv_pool_page_is_free(pc->kv, p))
                e = river_err_set(RIVER_ESTATE, "prefix cache: page %d is free but sequence "
                                  "%d holds it", p, s);
            else if (!pc->e[p].cached && seen[p]++)
                e = river_err_set(RIVER_ESTATE, "prefix cache: private page %d held twice", p);
            else if (pc->e[p].cached)
                seen[p]++;
            else
                priv++;
        }
    for (int32_t p = 0; p < pc->n_pages && !e; p++) {
        n_free += kv_pool_page_is_free(pc->kv, p);
        if (!pc->e[p].cached)
            continue;
        n_cached++;
        if (kv_pool_page_is_free(pc->kv, p))
            e = river_err_set(RIVER_ESTATE, "prefix cache: cached page %d is free", p);
        else if (pc->e[p].refs != seen[p])
            e = river_err_set(RIVER_ESTATE, "prefix cache: page %d has %d references, %d "
                              "tables hold it", p, pc->e[p].refs, seen[p]);
    }
    for (int32_t p = pc->lru_head; p >= 0 && !e; p = pc->e[p].next_lru, n_lru++)
        if (!pc->e[p].cached || pc->e[p].refs)
            e = river_err_set(RIVER_ESTATE, "prefix cache: page %d on the LRU list is %s", p,
                              pc->e[p].cached ? "referenced" : "not cached");
    if (!e && (n_cached != pc->n_cached || n_lru != pc->n_evictable))
        e = river_err_set(RIVER_ESTATE, "prefix cache: counts %d cached / %d evictable, the "
                          "tables say %d / %d", pc->n_cached, pc->n_evictable, n_cached, n_lru);
    if (!e && n_free != kv_pool_free_pages(pc->kv))
        e = river_err_set(RIVER_ESTATE, "prefix cache: %d pages marked free, free list %d",
                          n_free, kv_pool_free_pages(pc->kv));
    if (!e && n_free + n_cached + priv != pc->n_pages)
        e = river_err_set(RIVER_ESTATE, "prefix cache: %d free + %d cached + %d in use != %d",
                          n_free, n_cached, priv, pc->n_pages);
    free(seen);
    if (n_private)
        *n_private = priv;
    return e;
}
