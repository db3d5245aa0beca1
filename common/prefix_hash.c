#include "common/prefix_hash.h"
#include "common/err.h"
#include "common/rng.h"

#include <string.h>
#include <sys/random.h>

static uint64_t prefix__text(uint64_t h, const char *s)
{
    /* FNV-1a over the bytes, then mixed: fingerprints are short hex strings. */
    for (; s && *s; s++) {
        h ^= (unsigned char)*s;
        h *= 0x100000001B3ull;
    }
    return rng_mix(h);
}

uint64_t prefix_hash_seed(const char *model_fingerprint, const char *river_fingerprint)
{
    uint64_t h = prefix__text(0xcbf29ce484222325ull, model_fingerprint);
    h = prefix__text(h ^ 0x7269766572ull /* "river" */, river_fingerprint);
    return h ? h : 1;
}

int prefix_key_random(prefix_key_t *key)
{
    uint8_t b[PREFIX_KEY_BYTES];
    if (getrandom(b, sizeof b, 0) != (ssize_t)sizeof b)
        return river_err_set(RIVER_ESYS, "prefix cache key: getrandom failed");
    return prefix_key_from_bytes(key, b, sizeof b);
}

void prefix_key_to_bytes(const prefix_key_t *key, uint8_t out[PREFIX_KEY_BYTES])
{
    for (int i = 0; i < 8; i++) {
        out[i] = (uint8_t)(key->k0 >> (8 * i));
        out[8 + i] = (uint8_t)(key->k1 >> (8 * i));
    }
}

int prefix_key_from_bytes(prefix_key_t *key, const uint8_t *b, size_t n)
{
    if (n != PREFIX_KEY_BYTES)
        return river_err_set(RIVER_EFORMAT, "prefix cache key: %zu bytes, not %d", n,
                             PREFIX_KEY_BYTES);
    key->k0 = key->k1 = 0;
    for (int i = 0; i < 8; i++) {
        key->k0 |= (uint64_t)b[i] << (8 * i);
        key->k1 |= (uint64_t)b[8 + i] << (8 * i);
    }
    return 0;
}

/* ---- SipHash-2-4 with its 128-bit output, over a message of whole 64-bit words (the
 * little-endian bytes of the words, as the reference implementation reads them). ---- */

typedef struct prefix_sip {
    uint64_t v0, v1, v2, v3;
    uint64_t bytes;
} prefix_sip_t;

#define PREFIX_ROTL(x, b) (uint64_t)(((x) << (b)) | ((x) >> (64 - (b))))

static void prefix__round(prefix_sip_t *s)
{
    s->v0 += s->v1;
    s->v1 = PREFIX_ROTL(s->v1, 13);
    s->v1 ^= s->v0;
    s->v0 = PREFIX_ROTL(s->v0, 32);
    s->v2 += s->v3;
    s->v3 = PREFIX_ROTL(s->v3, 16);
    s->v3 ^= s->v2;
    s->v0 += s->v3;
    s->v3 = PREFIX_ROTL(s->v3, 21);
    s->v3 ^= s->v0;
    s->v2 += s->v1;
    s->v1 = PREFIX_ROTL(s->v1, 17);
    s->v1 ^= s->v2;
    s->v2 = PREFIX_ROTL(s->v2, 32);
}

static void prefix__sip_init(prefix_sip_t *s, const prefix_key_t *k)
{
    s->v0 = k->k0 ^ 0x736f6d6570736575ull;
    s->v1 = k->k1 ^ 0x646f72616e646f6dull ^ 0xee; /* 0xee: the 128-bit variant */
    s->v2 = k->k0 ^ 0x6c7967656e657261ull;
    s->v3 = k->k1 ^ 0x7465646279746573ull;
    s->bytes = 0;
}

static void prefix__sip_word(prefix_sip_t *s, uint64_t m)
{
    s->v3 ^= m;
    prefix__round(s);
    prefix__round(s);
    s->v0 ^= m;
    s->bytes += 8;
}

static prefix_name_t prefix__sip_end(prefix_sip_t *s)
{
    uint64_t b = s->bytes << 56;
    s->v3 ^= b;
    prefix__round(s);
    prefix__round(s);
    s->v0 ^= b;
    s->v2 ^= 0xee;
    for (int i = 0; i < 4; i++)
        prefix__round(s);
    prefix_name_t n;
    n.lo = s->v0 ^ s->v1 ^ s->v2 ^ s->v3;
    s->v1 ^= 0xdd;
    for (int i = 0; i < 4; i++)
        prefix__round(s);
    n.hi = s->v0 ^ s->v1 ^ s->v2 ^ s->v3;
    return n;
}

/* First words of the two kinds of message, so that no root is ever a page's name. */
#define PREFIX_TAG_ROOT 0x746f6f722d787066ull /* "fpx-root" */
#define PREFIX_TAG_PAGE 0x656761702d787066ull /* "fpx-page" */

prefix_name_t prefix_hash_root(const prefix_key_t *key, uint64_t seed, const void *salt,
                               size_t n)
{
    prefix_sip_t s;
    prefix__sip_init(&s, key);
    prefix__sip_word(&s, PREFIX_TAG_ROOT);
    prefix__sip_word(&s, seed);
    prefix__sip_word(&s, (uint64_t)n);
    const uint8_t *p = salt;
    for (size_t i = 0; i < n; i += 8) {
        uint64_t w = 0;
        for (size_t j = 0; j < 8 && i + j < n; j++)
            w |= (uint64_t)p[i + j] << (8 * j);
        prefix__sip_word(&s, w);
    }
    return prefix__sip_end(&s);
}

prefix_name_t prefix_hash_page(const prefix_key_t *key, prefix_name_t parent,
                               const int32_t *ids, size_t n)
{
    prefix_sip_t s;
    prefix__sip_init(&s, key);
    prefix__sip_word(&s, PREFIX_TAG_PAGE);
    prefix__sip_word(&s, parent.lo);
    prefix__sip_word(&s, parent.hi);
    prefix__sip_word(&s, (uint64_t)n);
    for (size_t i = 0; i < n; i += 2) {
        uint64_t w = (uint32_t)ids[i];
        if (i + 1 < n)
            w |= (uint64_t)(uint32_t)ids[i + 1] << 32;
        prefix__sip_word(&s, w);
    }
    return prefix__sip_end(&s);
}

size_t prefix_hash_chain(const prefix_key_t *key, prefix_name_t root, const int32_t *ids,
                         size_t n_ids, int page_size, prefix_name_t *out, size_t max_pages)
{
    if (page_size <= 0)
        return 0;
    size_t n = n_ids / (size_t)page_size;
    if (n > max_pages)
        n = max_pages;
    prefix_name_t h = root;
    for (size_t i = 0; i < n; i++) {
        h = prefix_hash_page(key, h, ids + i * (size_t)page_size, (size_t)page_size);
        out[i] = h;
    }
    return n;
}
