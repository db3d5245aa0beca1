/* API keys: the key file holds SHA-256 digests (lower-case hex, one a line, each with the
 * name of its tenant or none), never the keys, so a copy of the file lets nobody in. The
 * digests sit in an open-addressing hash set indexed by their first bytes, so a request's
 * Bearer token costs one SHA-256 and one short probe whatever the number of keys. The
 * probe compares each digest it meets in full without an early exit; which slots it
 * meets depends on the digest of the key sent, which says nothing about any stored key
 * (that would take a SHA-256 preimage), so its time tells an attacker nothing. */
#include <ctype.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nettle/sha2.h>

#include "common/err.h"
#include "gateway/gateway.h"

#define GW_KEYS_MAX 100000
#define GW_DIGEST_LEN SHA256_DIGEST_SIZE

typedef struct gw_key_slot {
    uint8_t digest[GW_DIGEST_LEN];
    gw_tenant_t *tenant; /* NULL: an empty slot */
} gw_key_slot_t;

struct gw_apikeys {
    gw_key_slot_t *slots;  /* (mask + 1), at most half full */
    size_t mask;
    size_t n;
    gw_tenant_t **tenants; /* (n_tenants) owned */
    size_t n_tenants, cap_tenants;
    gw_tenant_t **by_name; /* (name_mask + 1) while loading: tenants by name */
    size_t name_mask;
};

static void gw_apikeys__digest(const char *key, size_t len, uint8_t d[GW_DIGEST_LEN])
{
    struct sha256_ctx ctx;
    sha256_init(&ctx);
    sha256_update(&ctx, len, (const uint8_t *)key);
    sha256_digest(&ctx, GW_DIGEST_LEN, d);
}

void gw_apikeys_hash(const char *key, size_t len, char hex[GW_KEY_HEX_LEN + 1])
{
    uint8_t d[GW_DIGEST_LEN];
    gw_apikeys__digest(key, len, d);
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < sizeof d; i++) {
        hex[2 * i] = digits[d[i] >> 4];
        hex[2 * i + 1] = digits[d[i] & 15];
    }
    hex[GW_KEY_HEX_LEN] = '\0';
}

/* A digest is uniformly distributed: its first 8 bytes are the hash. */
static size_t gw_apikeys__bucket(const gw_apikeys_t *k, const uint8_t d[GW_DIGEST_LEN])
{
    uint64_t h;
    memcpy(&h, d, sizeof h);
    return (size_t)h & k->mask;
}

static int gw_apikeys__same(const uint8_t *a, const uint8_t *b)
{
    unsigned diff = 0;
    for (size_t i = 0; i < GW_DIGEST_LEN; i++)
        diff |= (unsigned)(a[i] ^ b[i]);
    return diff == 0;
}

static size_t gw_apikeys__name_hash(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 0x100000001B3ull;
    return (size_t)(h ^ (h >> 29));
}

/* The tenant called name, made the first time a line names it. */
static gw_tenant_t *gw_apikeys__tenant(gw_apikeys_t *k, const char *name,
                                       const gw_config_t *cfg, int *fresh)
{
    *fresh = 0;
    size_t i = gw_apikeys__name_hash(name) & k->name_mask;
    for (; k->by_name[i]; i = (i + 1) & k->name_mask)
        if (!strcmp(gw_tenant_name(k->by_name[i]), name))
            return k->by_name[i];
    if (k->n_tenants == k->cap_tenants) {
        size_t cap = k->cap_tenants ? 2 * k->cap_tenants : 16;
        void *p = realloc(k->tenants, cap * sizeof *k->tenants);
        if (!p)
            return NULL;
        k->tenants = p;
        k->cap_tenants = cap;
    }
    gw_tenant_t *t = gw_tenant_new(name, cfg);
    if (!t)
        return NULL;
    k->tenants[k->n_tenants++] = t;
    k->by_name[i] = t;
    *fresh = 1;
    return t;
}

/* What one line says. */
typedef struct gw_key_line {
    uint8_t digest[GW_DIGEST_LEN];
    char name[GW_TENANT_NAME_MAX + 1];
    int rpm, tpm; /* the tenant's own rates, -1: not given */
} gw_key_line_t;

/* The line's options, name=N; 0, or -1 naming the bad one in why. */
static int gw_apikeys__options(char *s, gw_key_line_t *l, char *why, size_t cap)
{
    static const struct {
        const char *name;
        size_t offset;
    } opts[] = {
        {"requests_per_minute", offsetof(gw_key_line_t, rpm)},
        {"tokens_per_minute", offsetof(gw_key_line_t, tpm)},
    };
    char *save = NULL;
    for (char *tok = strtok_r(s, " \t", &save); tok; tok = strtok_r(NULL, " \t", &save)) {
        char *eq = strchr(tok, '=');
        size_t i = 0;
        for (; eq && i < sizeof opts / sizeof opts[0]; i++)
            if (strlen(opts[i].name) == (size_t)(eq - tok) &&
                !strncmp(tok, opts[i].name, (size_t)(eq - tok)))
                break;
        char *end;
        long v = eq ? strtol(eq + 1, &end, 10) : -1;
        if (!eq || i == sizeof opts / sizeof opts[0] || end == eq + 1 || *end || v < 0 ||
            v > 1000000000) {
            snprintf(why, cap, "'%s' is not requests_per_minute=N or tokens_per_minute=N "
                     "(0..1000000000)", tok);
            return -1;
        }
        *(int *)((char *)l + opts[i].offset) = (int)v;
    }
    return 0;
}

/* Reads a line's digest (64 hex digits), tenant name and options; 0, or -1 with why. */
static int gw_apikeys__parse(char *s, gw_key_line_t *l, char *why, size_t cap)
{
    uint8_t *d = l->digest;
    char *name = l->name;
    l->rpm = l->tpm = -1;
    snprintf(why, cap, "expected a SHA-256 digest in hex (64 characters; river-gateway "
             "--hash-key prints one), then optionally a tenant name ([A-Za-z0-9._-], at most "
             "%d) and its rates", GW_TENANT_NAME_MAX);
    if (strlen(s) < GW_KEY_HEX_LEN)
        return -1;
    for (size_t i = 0; i < GW_KEY_HEX_LEN; i++)
        if (!isxdigit((unsigned char)s[i]))
            return -1;
    if (s[GW_KEY_HEX_LEN] && !isspace((unsigned char)s[GW_KEY_HEX_LEN]))
        return -1;
    for (size_t i = 0; i < GW_DIGEST_LEN; i++) {
        char byte[3] = {s[2 * i], s[2 * i + 1], 0};
        d[i] = (uint8_t)strtoul(byte, NULL, 16);
    }
    char *t = s + GW_KEY_HEX_LEN;
    while (isspace((unsigned char)*t))
        t++;
    size_t n = strcspn(t, " \t");
    if (n == 0 || memchr(t, '=', n)) {
        snprintf(name, GW_TENANT_NAME_MAX + 1, "key-%.16s", s);
        for (char *p = name; *p; p++)
            *p = (char)tolower((unsigned char)*p);
    } else {
        if (n > GW_TENANT_NAME_MAX)
            return -1;
        for (size_t i = 0; i < n; i++)
            if (!isalnum((unsigned char)t[i]) && !strchr("._-", t[i]))
                return -1;
        memcpy(name, t, n);
        name[n] = '\0';
        t += n;
    }
    return gw_apikeys__options(t, l, why, cap);
}

/* Counts the lines that may hold a key, to size the tables once. */
static size_t gw_apikeys__lines(FILE *f)
{
    size_t n = 0;
    int c;
    while ((c = getc(f)) != EOF)
        n += c == '\n';
    rewind(f);
    return n + 1;
}

int gw_apikeys_load(gw_apikeys_t **out, const char *path, const gw_config_t *cfg)
{
    *out = NULL;
    FILE *f = fopen(path, "r");
    if (!f)
        return river_err_set(RIVER_EIO, "api_keys %s: cannot open it", path);
    gw_apikeys_t *k = calloc(1, sizeof *k);
    size_t lines = gw_apikeys__lines(f), cap = 16;
    if (lines > GW_KEYS_MAX)
        lines = GW_KEYS_MAX + 1;
    while (cap < 2 * lines)
        cap *= 2;
    if (k) {
        k->mask = cap - 1;
        k->name_mask = cap - 1;
        k->slots = calloc(cap, sizeof *k->slots);
        k->by_name = calloc(cap, sizeof *k->by_name);
    }
    if (!k || !k->slots || !k->by_name) {
        fclose(f);
        gw_apikeys_destroy(&k);
        return river_err_set(RIVER_ENOMEM, "api_keys: tables for %zu lines", lines);
    }
    char line[512];
    int lineno = 0, rc = 0;
    while (fgets(line, sizeof line, f)) {
        lineno++;
        char *s = line;
        while (isspace((unsigned char)*s))
            s++;
        size_t n = strlen(s);
        while (n && isspace((unsigned char)s[n - 1]))
            s[--n] = '\0';
        if (n == 0 || s[0] == '#')
            continue;
        gw_key_line_t kl;
        char why[256];
        if (gw_apikeys__parse(s, &kl, why, sizeof why)) {
            rc = river_err_set(RIVER_EFORMAT, "api_keys %s:%d: %s", path, lineno, why);
            break;
        }
        const uint8_t *d = kl.digest;
        if (k->n == GW_KEYS_MAX) {
            rc = river_err_set(RIVER_ERANGE, "api_keys %s: more than %d keys", path,
                               GW_KEYS_MAX);
            break;
        }
        /* The tables were sized by the lines counted first; a file that grew since then
         * would fill them past half. */
        if (2 * (k->n + 1) > k->mask + 1) {
            rc = river_err_set(RIVER_EIO, "api_keys %s: the file changed while it was read",
                               path);
            break;
        }
        size_t i = gw_apikeys__bucket(k, d);
        for (; k->slots[i].tenant; i = (i + 1) & k->mask)
            if (!memcmp(k->slots[i].digest, d, GW_DIGEST_LEN))
                break;
        if (k->slots[i].tenant) {
            rc = river_err_set(RIVER_EFORMAT, "api_keys %s:%d: this digest is listed twice",
                               path, lineno);
            break;
        }
        int fresh = 0;
        gw_tenant_t *t = gw_apikeys__tenant(k, kl.name, cfg, &fresh);
        if (!t) {
            rc = river_err_set(RIVER_ENOMEM, "api_keys: tenant %s", kl.name);
            break;
        }
        if (kl.rpm >= 0 || kl.tpm >= 0) {
            if (!fresh) {
                rc = river_err_set(RIVER_EFORMAT, "api_keys %s:%d: tenant %s has its rates "
                                   "on its first line only", path, lineno, kl.name);
                break;
            }
            gw_tenant_set_limits(t, kl.rpm, kl.tpm);
        }
        memcpy(k->slots[i].digest, d, GW_DIGEST_LEN);
        k->slots[i].tenant = t;
        k->n++;
    }
    if (!rc && ferror(f))
        rc = river_err_set(RIVER_EIO, "api_keys %s: read error", path);
    fclose(f);
    if (!rc && k->n == 0)
        rc = river_err_set(RIVER_EFORMAT, "api_keys %s: no key in the file (leave api_keys "
                           "empty to ask for none)", path);
    free(k->by_name);
    k->by_name = NULL;
    if (rc) {
        gw_apikeys_destroy(&k);
        return rc;
    }
    *out = k;
    return 0;
}

void gw_apikeys_destroy(gw_apikeys_t **pk)
{
    gw_apikeys_t *k = *pk;
    if (!k)
        return;
    for (size_t i = 0; i < k->n_tenants; i++)
        gw_tenant_destroy(&k->tenants[i]);
    free(k->tenants);
    free(k->by_name);
    free(k->slots);
    free(k);
    *pk = NULL;
}

gw_tenant_t *gw_apikeys_find(const gw_apikeys_t *k, const char *key)
{
    uint8_t d[GW_DIGEST_LEN];
    gw_apikeys__digest(key, strlen(key), d);
    for (size_t i = gw_apikeys__bucket(k, d); k->slots[i].tenant; i = (i + 1) & k->mask)
        if (gw_apikeys__same(k->slots[i].digest, d))
            return k->slots[i].tenant;
    return NULL;
}

size_t gw_apikeys_count(const gw_apikeys_t *k)
{
    return k->n;
}
