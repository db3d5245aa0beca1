/* CurveZMQ keys: the certificate files `riverctl keygen` writes (CZMQ's zcert format), read
 * by riverd, river-worker, the client library and riverctl.
 *
 * A key pair is two files. NAME.key is the public certificate: it may be copied anywhere
 * (into riverd's auth directories, or to the clients and workers of a riverd). NAME.key_secret
 * holds the secret key as well and never leaves its owner; it must be readable by its owner
 * only (mode 0600), which keys_load_secret checks the way ssh checks its keys. */
#ifndef RIVER_COMMON_KEYS_H
#define RIVER_COMMON_KEYS_H

#include <stddef.h>

/* A key as Z85 text, the form ZMQ's CURVE socket options take: 40 characters. */
#define KEYS_Z85_LEN 40

typedef struct keys_pair {
    char public_txt[KEYS_Z85_LEN + 1];
    char secret_txt[KEYS_Z85_LEN + 1];
} keys_pair_t;

/* Reads a secret certificate (NAME.key_secret). RIVER_EIO when it cannot be read,
 * RIVER_EINVAL when others may read it, RIVER_EFORMAT when it is no certificate, holds no
 * secret key (a public NAME.key) or its two keys do not belong together. */
int keys_load_secret(const char *path, keys_pair_t *out);

/* Reads the public key of a certificate (NAME.key, or the public half of a secret one).
 * RIVER_EIO when it cannot be read, RIVER_EFORMAT when it is no certificate. */
int keys_load_public(const char *path, char public_txt[KEYS_Z85_LEN + 1]);

/* Writes a new key pair: dir/name.key and dir/name.key_secret (mode 0600), creating dir
 * (mode 0700) when it does not exist. Never replaces a file: RIVER_EINVAL when either
 * exists, or when name is not a plain file name. public_txt (may be NULL) receives the
 * public key. */
int keys_generate(const char *dir, const char *name, char public_txt[KEYS_Z85_LEN + 1]);

/* Turns the last error's detail into a configuration error that names the configuration
 * file and its key: "riverd.yaml: key 'auth.secret_key': <detail>". Returns RIVER_ECONFIG. */
int keys_config_error(const char *config_path, const char *key);

/* Where `path`, named in the file `base` (a configuration), is: an absolute path as it is,
 * a relative one in base's directory. RIVER_ERANGE when the result does not fit in cap. */
int keys_resolve_path(const char *base, const char *path, char *out, size_t cap);

#endif
