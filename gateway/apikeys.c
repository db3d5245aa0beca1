/* API keys: the key file holds SHA-256 digests (lower-case hex, one a line), never the
 * keys, so a copy of the file lets nobody in. A request's Bearer token is hashed and
 * compared with every digest without an early exit, so the time taken does not say how
 * much of a digest matched. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nettle/sha2.h>

#include "common/err.h"
#include "gateway/gateway.h"

#define GW_KEYS_MAX 100000

struct gw_apikeys {
    char (*hex)[GW_KEY_HEX_LEN + 1];
    size_t n;
};

void gw_apikeys_hash(const char *key, size_t len, char hex[GW_KEY_HEX_LEN + 1])
{
    struct sha256_ctx ctx;
    uint8_t d[SHA256_DIGEST_SIZE];
    sha256_init(&ctx);
    sha256_update(&ctx, len, (const uint8_t *)key);
    sha256_digest(&ctx, sizeof d, d);
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < sizeof d; i++) {
        hex[2 * i] = digits[d[i] >> 4];
        hex[2 * i + 1] = digits[d[i] & 15];
    }
    hex[GW_KEY_HEX_LEN] = '\0';
}

int gw_apikeys_load(gw_apikeys_t **out, const char *path)
{
    *out = NULL;
    FILE *f = fopen(path, "r");
    if (!f)
        return river_err_set(RIVER_EIO, "api_keys %s: cannot open it", path);
    gw_apikeys_t *k = calloc(1, sizeof *k);
    if (!k) {
        fclose(f);
        return river_err_set(RIVER_ENOMEM, "api_keys");
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
        int ok = n == GW_KEY_HEX_LEN;
        for (size_t i = 0; ok && i < n; i++)
            ok = isxdigit((unsigned char)s[i]);
        if (!ok) {
            rc = river_err_set(RIVER_EFORMAT, "api_keys %s:%d: expected a SHA-256 digest in "
                               "hex (64 characters; river-gateway --hash-key prints one)",
                               path, lineno);
            break;
        }
        if (k->n == GW_KEYS_MAX) {
            rc = river_err_set(RIVER_ERANGE, "api_keys %s: more than %d keys", path,
                               GW_KEYS_MAX);
            break;
        }
        void *p = realloc(k->hex, (k->n + 1) * sizeof *k->hex);
        if (!p) {
            rc = river_err_set(RIVER_ENOMEM, "api_keys");
            break;
        }
        k->hex = p;
        for (size_t i = 0; i <= n; i++)
            k->hex[k->n][i] = (char)tolower((unsigned char)s[i]);
        k->n++;
    }
    if (!rc && ferror(f))
        rc = river_err_set(RIVER_EIO, "api_keys %s: read error", path);
    fclose(f);
    if (!rc && k->n == 0)
        rc = river_err_set(RIVER_EFORMAT, "api_keys %s: no key in the file (leave api_keys "
                           "empty to ask for none)", path);
    if (rc) {
        gw_apikeys_destroy(&k);
        return rc;
    }
    *out = k;
    return 0;
}

void gw_apikeys_destroy(gw_apikeys_t **k)
{
    if (!*k)
        return;
    free((*k)->hex);
    free(*k);
    *k = NULL;
}

int gw_apikeys_check(const gw_apikeys_t *k, const char *key)
{
    char hex[GW_KEY_HEX_LEN + 1];
    gw_apikeys_hash(key, strlen(key), hex);
    int found = 0;
    for (size_t i = 0; i < k->n; i++) {
        unsigned diff = 0;
        for (size_t j = 0; j < GW_KEY_HEX_LEN; j++)
            diff |= (unsigned)(hex[j] ^ k->hex[i][j]);
        found |= diff == 0;
    }
    return found;
}
