#include "common/keys.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <czmq.h>

#include "common/err.h"

/* Checks that path is a regular file this process can read: the operator needs to know
 * which of these it was, not only that there is no key. */
static int keys__stat(const char *path, struct stat *st)
{
    if (stat(path, st) != 0)
        return river_err_set(RIVER_EIO, "%s: %s", path, strerror(errno));
    if (!S_ISREG(st->st_mode))
        return river_err_set(RIVER_EFORMAT, "%s: not a regular file", path);
    if (access(path, R_OK) != 0)
        return river_err_set(RIVER_EIO, "%s: %s", path, strerror(errno));
    return 0;
}

static bool keys__is_zero(const uint8_t *k)
{
    unsigned char any = 0;
    for (int i = 0; i < 32; i++)
        any |= k[i];
    return any == 0;
}

/* Key files are a few hundred bytes; anything much larger is not one. */
#define KEYS_FILE_MAX 65536

/* One Z85 key of a certificate: 40 characters that decode; "" when absent. */
static int keys__z85(zconfig_t *root, const char *what, const char *path,
                     char out[KEYS_Z85_LEN + 1])
{
    char name[64];
    snprintf(name, sizeof name, "/curve/%s", what);
    const char *v = zconfig_get(root, name, NULL);
    out[0] = '\0';
    if (!v || !v[0])
        return 0;
    uint8_t bin[32];
    if (strlen(v) != KEYS_Z85_LEN || !zmq_z85_decode(bin, v))
        return river_err_set(RIVER_EFORMAT, "%s: its %s is not 40 characters of Z85", path,
                             what);
    if (keys__is_zero(bin))
        return river_err_set(RIVER_EFORMAT, "%s: its %s is zero", path, what);
    memcpy(out, v, KEYS_Z85_LEN + 1);
    return 0;
}

/* Reads the keys of a certificate in CZMQ's zcert format (ZPL, through CZMQ's zconfig).
 * Not zcert_load: it reads NAME_secret instead of the file named when that exists, takes a
 * malformed key for zeros, and in CZMQ 4.2 leaks on a file that does not parse. */
static int keys__read(const char *path, char pub[KEYS_Z85_LEN + 1], char sec[KEYS_Z85_LEN + 1])
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return river_err_set(RIVER_EIO, "%s: %s", path, strerror(errno));
    char *text = malloc(KEYS_FILE_MAX + 1);
    if (!text) {
        fclose(f);
        return river_err_set(RIVER_ENOMEM, "%s: read buffer", path);
    }
    size_t n = fread(text, 1, KEYS_FILE_MAX + 1, f);
    int rc = ferror(f) ? river_err_set(RIVER_EIO, "%s: read failed", path) : 0;
    fclose(f);
    if (rc == 0 && (n > KEYS_FILE_MAX || memchr(text, '\0', n)))
        rc = river_err_set(RIVER_EFORMAT, "%s: not a key file (riverctl keygen writes them)",
                           path);
    zconfig_t *root = NULL;
    if (rc == 0) {
        text[n] = '\0';
        root = zconfig_str_load(text);
        if (!root)
            rc = river_err_set(RIVER_EFORMAT,
                               "%s: not a key file (riverctl keygen writes them)", path);
    }
    /* The secret key is wiped with the text it came in. */
    memset(text, 0, n < KEYS_FILE_MAX + 1 ? n : KEYS_FILE_MAX + 1);
    free(text);
    if (rc == 0 && (rc = keys__z85(root, "public-key", path, pub)) == 0 &&
        (rc = keys__z85(root, "secret-key", path, sec)) == 0 && !pub[0])
        rc = river_err_set(RIVER_EFORMAT, "%s: holds no public key (curve/public-key)", path);
    zconfig_destroy(&root);
    return rc;
}

int keys_load_secret(const char *path, keys_pair_t *out)
{
    memset(out, 0, sizeof *out);
    struct stat st;
    int rc = keys__stat(path, &st);
    if (rc < 0)
        return rc;
    /* A secret that others can read is no longer secret: refuse it rather than use it, as
     * ssh does, so that the mistake is fixed instead of lived with. */
    if (st.st_mode & (S_IRWXG | S_IRWXO))
        return river_err_set(RIVER_EINVAL,
                             "%s: a secret key must be readable by its owner only (mode %04o; "
                             "chmod 600 it)%s",
                             path, (unsigned)(st.st_mode & 07777),
                             strstr(path, "_secret") ? ""
                                                     : "; is this the public half? the secret "
                                                       "one is NAME.key_secret");
    if ((rc = keys__read(path, out->public_txt, out->secret_txt)) < 0) {
        memset(out, 0, sizeof *out);
        return rc;
    }
    if (!out->secret_txt[0])
        return river_err_set(RIVER_EFORMAT,
                             "%s: holds no secret key (a public NAME.key file? the secret one "
                             "is NAME.key_secret)",
                             path);
    /* The public key is derived from the secret one: a file whose two keys disagree was
     * edited or damaged, and peers would be told a key this process cannot prove. */
    char derived[KEYS_Z85_LEN + 1];
    if (zmq_curve_public(derived, out->secret_txt) != 0 || strcmp(derived, out->public_txt)) {
        memset(out, 0, sizeof *out);
        return river_err_set(RIVER_EFORMAT, "%s: its public and secret keys do not belong "
                             "together", path);
    }
    return 0;
}

int keys_load_public(const char *path, char public_txt[KEYS_Z85_LEN + 1])
{
    public_txt[0] = '\0';
    struct stat st;
    int rc = keys__stat(path, &st);
    if (rc < 0)
        return rc;
    char secret[KEYS_Z85_LEN + 1];
    rc = keys__read(path, public_txt, secret);
    memset(secret, 0, sizeof secret);
    return rc;
}

/* Creates path, empty, with that mode; EEXIST when it is there. */
static int keys__reserve(const char *path, mode_t mode)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
    if (fd < 0)
        return river_err_set(errno == EEXIST ? RIVER_EINVAL : RIVER_EIO, "%s: %s%s", path,
                             strerror(errno),
                             errno == EEXIST ? " (keygen never replaces a key)" : "");
    if (close(fd) != 0)
        return river_err_set(RIVER_EIO, "%s: %s", path, strerror(errno));
    return 0;
}

int keys_generate(const char *dir, const char *name, char public_txt[KEYS_Z85_LEN + 1])
{
    if (public_txt)
        public_txt[0] = '\0';
    if (!name[0] || name[0] == '.' || strchr(name, '/') || strlen(name) > 200)
        return river_err_set(RIVER_EINVAL, "key name '%s': expected a plain file name", name);
    if (mkdir(dir, 0700) != 0 && errno != EEXIST)
        return river_err_set(RIVER_EIO, "%s: %s", dir, strerror(errno));
    char pub[4096], sec[4096 + 8];
    int n = snprintf(pub, sizeof pub, "%s/%s.key", dir, name);
    if (n < 0 || (size_t)n + 8 >= sizeof pub)
        return river_err_set(RIVER_ERANGE, "%s: path too long", dir);
    snprintf(sec, sizeof sec, "%s_secret", pub);

    /* Both names are taken first, with their final modes, so that the secret file is never
     * readable by others, not even for a moment, and an existing key is never replaced. */
    int rc = keys__reserve(sec, 0600);
    if (rc < 0)
        return rc;
    if ((rc = keys__reserve(pub, 0644)) < 0)
        goto fail_secret;
    zcert_t *c = zcert_new();
    if (!c) {
        rc = river_err_set(RIVER_ESYS, "cannot generate a CURVE key pair");
        goto fail_public;
    }
    zcert_set_meta(c, "name", "%s", name);
    if (zcert_save_public(c, pub) != 0) {
        rc = river_err_set(RIVER_EIO, "%s: cannot write the public key", pub);
        goto fail_cert;
    }
    if (zcert_save_secret(c, sec) != 0) {
        rc = river_err_set(RIVER_EIO, "%s: cannot write the secret key", sec);
        goto fail_cert;
    }
    if (chmod(sec, 0600) != 0) {
        rc = river_err_set(RIVER_EIO, "%s: %s", sec, strerror(errno));
        goto fail_cert;
    }
    if (public_txt)
        snprintf(public_txt, KEYS_Z85_LEN + 1, "%s", zcert_public_txt(c));
    zcert_destroy(&c);
    return 0;
fail_cert:
    zcert_destroy(&c);
fail_public:
    unlink(pub);
fail_secret:
    unlink(sec);
    return rc;
}

int keys_config_error(const char *config_path, const char *key)
{
    /* A copy first: the detail is the buffer river_err_set writes. */
    char detail[1024];
    snprintf(detail, sizeof detail, "%s", river_err_detail());
    return river_err_set(RIVER_ECONFIG, "%s: key '%s': %s", config_path, key, detail);
}

int keys_resolve_path(const char *base, const char *path, char *out, size_t cap)
{
    const char *slash = base ? strrchr(base, '/') : NULL;
    int n = path[0] == '/' || !slash
                ? snprintf(out, cap, "%s", path)
                : snprintf(out, cap, "%.*s/%s", (int)(slash - base), base, path);
    if (n < 0 || (size_t)n >= cap)
        return river_err_set(RIVER_ERANGE, "%s: path too long", path);
    return 0;
}
