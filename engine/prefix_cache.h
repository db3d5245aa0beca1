/* The prefix cache: full KV pages kept after their sequence ended, found again by the
 * token ids they hold, so that a conversation's earlier turns (or a system prompt many
 * sessions share) are prefilled once.
 *
 * A page is cached once all its page_size slots are written. It is named by the keyed hash
 * chain of common/prefix_hash.h: its tokens, the name of the page before it, and a root
 * carrying the model and Exit River fingerprints and the sequence's salt (its tenant, so
 * that two tenants' equal prompts never share pages). A name only finds candidates: a hit
 * also needs the page's own tokens and the very page before it (its slot in the pool and
 * the serial number that slot had when it was cached), so a hit is verified against the
 * whole prefix's tokens, page by page, and not against a name that could collide. Cached pages are shared read-only: every sequence
 * whose page table holds one holds a reference, and a sequence only ever writes to pages
 * past its cached prefix, which are its own. A page nobody references stays cached until
 * the pool needs it: eviction takes the least recently released page first, and the
 * generator evicts before it preempts, so the cache never starves a running sequence.
 *
 * A new sequence takes the longest run of cached pages that its ids begin with, capped at
 * n - 1 tokens: the last prompt token is always computed again, because its logits are
 * what the first generated token is sampled from and the cache keeps no logits. When the
 * cap (or the first missing page) falls inside a page, a cached page that continues the
 * prefix is copied into a page of the sequence's own and the copy's leading slots are
 * used: the copy, never the shared page, receives the sequence's later writes.
 *
 * Provenance. Under early exit with the river strategy a token that exits at depth
 * d < n_layers writes the K/V of layers d.. through the 4-bit Exit River, an approximation
 * of the backbone's. A page records whether any of its slots was so written, or any slot
 * of a page before it (every later token attended to those slots, so its K/V inherit the
 * approximation even when the token itself ran the whole backbone). A request that must be
 * exact (policy none) reuses only pages the backbone wrote entirely: reusing a river page
 * would make its completion depend on which earlier request happened to share its prefix,
 * and differ from the plain backbone's. A lossy request already accepts river K/V for its
 * own tokens, so it may reuse either kind. Both kinds of one prefix can be cached at once
 * (they are told apart by the flag), so exact traffic keeps its hits next to lossy traffic.
 *
 * Strategies other than river keep per-sequence exit state next to the K/V (mask bits,
 * pending recomputation) that a shared page does not carry; the generator turns the cache
 * off for them. */
#ifndef RIVER_ENGINE_PREFIX_CACHE_H
#define RIVER_ENGINE_PREFIX_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "common/prefix_hash.h"
#include "engine/kv_pool.h"

typedef struct prefix_cache prefix_cache_t;

/* How a page is named; prefix_hash_page unless a test needs names that collide. */
typedef prefix_name_t (*prefix_name_fn)(const prefix_key_t *key, prefix_name_t parent,
                                        const int32_t *ids, size_t n);

typedef struct prefix_cache_config {
    uint64_t seed;  /* prefix_hash_seed of the model and river fingerprints */
    prefix_key_t key; /* the secret of the names (prefix_key_random) */
    int max_pages;  /* pages the cache may hold (referenced ones included), 0: the pool */
    prefix_name_fn name_page; /* NULL: prefix_hash_page */
} prefix_cache_config_t;

/* A cache over pool kv, which must outlive it and be a pool that hands out pages. */
int prefix_cache_new(prefix_cache_t **out, kv_pool_t *kv, const prefix_cache_config_t *cfg);
/* Gives the unreferenced cached pages back to the pool. */
void prefix_cache_destroy(prefix_cache_t **pc);

/* What the cache knows of one sequence: provenance of its pages and how far its pages are
 * named. Embedded in the sequence's owner: prefix_seq_init / prefix_seq_free. */
typedef struct prefix_seq {
    uint8_t *lossy;  /* (cap) per page: a slot of it or of an earlier page is river K/V */
    int cap;
    int n_named;     /* leading pages named (reused or offered to the cache) */
    prefix_name_t root;  /* the name before page 0: seed and salt */
    prefix_name_t chain; /* name of page n_named - 1; the root when none */
    /* The cached page that holds page n_named - 1's prefix, -1 when n_named is 0, -2 when
     * none does (nothing after it can be cached); and the serial it was cached under. */
    int32_t chain_page;
    uint64_t chain_serial;
    int broken;      /* provenance could not be recorded: nothing more is offered */
} prefix_seq_t;

/* A sequence with the empty salt. */
void prefix_seq_init(prefix_seq_t *ps, const prefix_cache_t *pc);
/* Gives a sequence that has no pages yet the salt of its partition (n bytes): it finds
 * and offers pages only among sequences with the same salt. */
void prefix_seq_set_salt(prefix_seq_t *ps, const prefix_cache_t *pc, const void *salt,
                         size_t n);
void prefix_seq_free(prefix_seq_t *ps);

/* Fills the empty page table kv with the longest cached prefix of ids (n_ids of them), at
 * most max_tokens tokens: shared pages, then possibly one private copy of a page that
 * continues the prefix part way. exact: reuse only pages the backbone wrote. *hit gets the
 * tokens whose K/V are now in place (0 when nothing matched, or when the pool has no
 * page for the copy). RIVER_ENOMEM leaves kv empty. */
int prefix_cache_acquire(prefix_cache_t *pc, kv_seq_t *kv, prefix_seq_t *ps,
                         const int32_t *ids, size_t n_ids, size_t max_tokens, int exact,
                         size_t *hit);
/* Records that position pos of the sequence was written by the river. */
int prefix_seq_mark_lossy(prefix_seq_t *ps, const prefix_cache_t *pc, int pos);
/* Offers the sequence's pages that are full now (its first n_written positions hold the
 * K/V of ids) to the cache. A page whose name is cached already, or that does not fit the
 * budget once the unreferenced pages are gone, stays the sequence's own. */
void prefix_cache_publish(prefix_cache_t *pc, kv_seq_t *kv, prefix_seq_t *ps,
                          const int32_t *ids, size_t n_written);
/* Ends a sequence: its references are dropped (unreferenced pages stay cached, most
 * recently used), its own pages go back to the pool, kv and ps start over. */
void prefix_cache_release(prefix_cache_t *pc, kv_seq_t *kv, prefix_seq_t *ps);
/* Gives up to n unreferenced pages back to the pool, least recently used first; returns
 * how many. */
int prefix_cache_evict(prefix_cache_t *pc, int n);

int prefix_cache_pages(const prefix_cache_t *pc);     /* cached, referenced or not */
int prefix_cache_evictable(const prefix_cache_t *pc); /* cached and unreferenced */
int64_t prefix_cache_evictions(const prefix_cache_t *pc);
uint64_t prefix_cache_seed(const prefix_cache_t *pc);
const prefix_key_t *prefix_cache_key(const prefix_cache_t *pc);

/* Names of up to max cached pages, referenced ones first, then most recently used, each
 * as its low 64 bits: the summary a worker reports to riverd (each name stands for its
 * whole prefix; riverd only places by it, so a rare clash costs a hit, never K/V). */
size_t prefix_cache_summary(const prefix_cache_t *pc, uint64_t *out, size_t max);

/* Checks the accounting against the page tables of the live sequences: every cached page
 * has as many references as tables hold it and is not free, every table entry is cached
 * or held by that table alone and not free, and free + cached + private == the pool.
 * *n_private receives the private pages. RIVER_ESTATE names the first broken rule. */
int prefix_cache_check(const prefix_cache_t *pc, const kv_seq_t *const *seqs, int n_seqs,
                       int *n_private);

#endif
