/* The GGUF writer (offline/gguf_write.h). Key/values are serialized as they are set, so
 * the file's metadata section is one buffer; tensors keep their data until the write. */
#include "offline/gguf_write.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/err.h"

typedef struct wtensor {
    char *name;
    int type;
    int n_dims;
    int64_t ne[GGUF_MAX_DIMS];
    void *data; /* owned */
    size_t size;
} wtensor_t;

struct gguf_writer {
    unsigned char *kv;  /* serialized key/values */
    size_t kv_len, kv_cap;
    char **keys;        /* (n_kv) for the duplicate check */
    uint64_t n_kv;
    wtensor_t *t;       /* (n_t) */
    uint64_t n_t, cap_t;
};

int gguf_writer_new(gguf_writer_t **out)
{
    *out = calloc(1, sizeof **out);
    return *out ? 0 : river_err_set(RIVER_ENOMEM, "gguf writer");
}

void gguf_writer_destroy(gguf_writer_t **pw)
{
    gguf_writer_t *w = *pw;
    if (!w)
        return;
    free(w->kv);
    for (uint64_t i = 0; i < w->n_kv; i++)
        free(w->keys[i]);
    free(w->keys);
    for (uint64_t i = 0; i < w->n_t; i++) {
        free(w->t[i].name);
        free(w->t[i].data);
    }
    free(w->t);
    free(w);
    *pw = NULL;
}

static int put(gguf_writer_t *w, const void *p, size_t n)
{
    if (w->kv_len + n > w->kv_cap) {
        size_t cap = w->kv_cap ? w->kv_cap : 4096;
        while (cap < w->kv_len + n)
            cap *= 2;
        unsigned char *q = realloc(w->kv, cap);
        if (!q)
            return river_err_set(RIVER_ENOMEM, "gguf writer: %zu bytes of metadata", cap);
        w->kv = q;
        w->kv_cap = cap;
    }
    if (n) /* an empty string or array passes no bytes, and may pass no pointer */
        memcpy(w->kv + w->kv_len, p, n);
    w->kv_len += n;
    return 0;
}

static int put_le(gguf_writer_t *w, uint64_t v, int n)
{
    unsigned char b[8];
    for (int i = 0; i < n; i++)
        b[i] = (unsigned char)(v >> (8 * i));
    return put(w, b, (size_t)n);
}

static int put_str(gguf_writer_t *w, const char *s, size_t len)
{
    int e = put_le(w, len, 8);
    return e ? e : put(w, s, len);
}

/* Starts key/value `key` of type t; on a later failure the caller rolls back to *mark. */
static int begin_kv(gguf_writer_t *w, const char *key, gguf_type_t t, size_t *mark)
{
    for (uint64_t i = 0; i < w->n_kv; i++)
        if (!strcmp(w->keys[i], key))
            return river_err_set(RIVER_EINVAL, "gguf writer: duplicate key '%s'", key);
    char **k = realloc(w->keys, sizeof *k * (size_t)(w->n_kv + 1));
    if (!k)
        return river_err_set(RIVER_ENOMEM, "gguf writer: key '%s'", key);
    w->keys = k;
    *mark = w->kv_len;
    int e = put_str(w, key, strlen(key));
    if (!e)
        e = put_le(w, (uint64_t)t, 4);
    if (e)
        w->kv_len = *mark;
    return e;
}

static int end_kv(gguf_writer_t *w, const char *key, size_t mark, int e)
{
    if (!e && !(w->keys[w->n_kv] = strdup(key)))
        e = river_err_set(RIVER_ENOMEM, "gguf writer: key '%s'", key);
    if (e) {
        w->kv_len = mark;
        return e;
    }
    w->n_kv++;
    return 0;
}

static int set_scalar(gguf_writer_t *w, const char *key, gguf_type_t t, uint64_t bits, int n)
{
    size_t mark;
    int e = begin_kv(w, key, t, &mark);
    if (e)
        return e;
    return end_kv(w, key, mark, put_le(w, bits, n));
}

int gguf_writer_set_u32(gguf_writer_t *w, const char *key, uint32_t v)
{
    return set_scalar(w, key, GGUF_TYPE_UINT32, v, 4);
}

int gguf_writer_set_i32(gguf_writer_t *w, const char *key, int32_t v)
{
    return set_scalar(w, key, GGUF_TYPE_INT32, (uint32_t)v, 4);
}

int gguf_writer_set_f32(gguf_writer_t *w, const char *key, float v)
{
    uint32_t u;
    memcpy(&u, &v, 4);
    return set_scalar(w, key, GGUF_TYPE_FLOAT32, u, 4);
}

int gguf_writer_set_bool(gguf_writer_t *w, const char *key, int v)
{
    return set_scalar(w, key, GGUF_TYPE_BOOL, v != 0, 1);
}

int gguf_writer_set_strn(gguf_writer_t *w, const char *key, const char *s, size_t len)
{
    size_t mark;
    int e = begin_kv(w, key, GGUF_TYPE_STRING, &mark);
    if (e)
        return e;
    return end_kv(w, key, mark, put_str(w, s, len));
}

int gguf_writer_set_str(gguf_writer_t *w, const char *key, const char *s)
{
    return gguf_writer_set_strn(w, key, s, strlen(s));
}

static const size_t elem_bytes[GGUF_TYPE_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};

int gguf_writer_set_scalar(gguf_writer_t *w, const char *key, gguf_type_t type, const void *v)
{
    if ((unsigned)type >= GGUF_TYPE_COUNT || !elem_bytes[type])
        return river_err_set(RIVER_EINVAL, "gguf writer: key '%s': %s is no fixed-size scalar",
                             key, gguf_type_name(type));
    size_t mark;
    int e = begin_kv(w, key, type, &mark);
    if (e)
        return e;
    return end_kv(w, key, mark, put(w, v, elem_bytes[type]));
}

int gguf_writer_set_arr(gguf_writer_t *w, const char *key, gguf_type_t elem_type,
                        const void *elems, uint64_t n)
{
    if ((unsigned)elem_type >= GGUF_TYPE_COUNT || !elem_bytes[elem_type])
        return river_err_set(RIVER_EINVAL, "gguf writer: key '%s': arrays of %s go through "
                             "their own call", key, gguf_type_name(elem_type));
    size_t mark;
    int e = begin_kv(w, key, GGUF_TYPE_ARRAY, &mark);
    if (e)
        return e;
    /* Elements are written little-endian from the host's (x86) representation. */
    if (!(e = put_le(w, (uint64_t)elem_type, 4)) && !(e = put_le(w, n, 8)))
        e = put(w, elems, (size_t)n * elem_bytes[elem_type]);
    return end_kv(w, key, mark, e);
}

int gguf_writer_set_arr_str(gguf_writer_t *w, const char *key, const char *const *strs,
                            const size_t *lens, uint64_t n)
{
    size_t mark;
    int e = begin_kv(w, key, GGUF_TYPE_ARRAY, &mark);
    if (e)
        return e;
    if (!(e = put_le(w, GGUF_TYPE_STRING, 4)) && !(e = put_le(w, n, 8)))
        for (uint64_t i = 0; i < n && !e; i++)
            e = put_str(w, strs[i], lens ? lens[i] : strlen(strs[i]));
    return end_kv(w, key, mark, e);
}

int gguf_writer_add_tensor(gguf_writer_t *w, const char *name, int type, int n_dims,
                           const int64_t *ne, void *data, size_t size)
{
    int e = 0;
    int block = ggml_type_block(type);
    uint64_t numel = 1;
    if (!block) {
        e = river_err_set(RIVER_EDTYPE, "gguf writer: tensor '%s': unknown type %d", name, type);
        goto fail;
    }
    if (n_dims < 1 || n_dims > GGUF_MAX_DIMS) {
        e = river_err_set(RIVER_EINVAL, "gguf writer: tensor '%s': %d dimensions", name, n_dims);
        goto fail;
    }
    for (int d = 0; d < n_dims; d++) {
        if (ne[d] < 1) {
            e = river_err_set(RIVER_EINVAL, "gguf writer: tensor '%s': dimension %d is %lld",
                              name, d, (long long)ne[d]);
            goto fail;
        }
        numel *= (uint64_t)ne[d];
    }
    if (ne[0] % block != 0 ||
        size != numel / (uint64_t)block * ggml_type_block_bytes(type)) {
        e = river_err_set(RIVER_EINVAL, "gguf writer: tensor '%s' (%s): %lld elements a row "
                          "or %zu bytes do not make whole blocks", name, ggml_type_name(type),
                          (long long)ne[0], size);
        goto fail;
    }
    for (uint64_t i = 0; i < w->n_t; i++)
        if (!strcmp(w->t[i].name, name)) {
            e = river_err_set(RIVER_EINVAL, "gguf writer: duplicate tensor '%s'", name);
            goto fail;
        }
    if (w->n_t == w->cap_t) {
        uint64_t cap = w->cap_t ? 2 * w->cap_t : 64;
        wtensor_t *t = realloc(w->t, sizeof *t * (size_t)cap);
        if (!t) {
            e = river_err_set(RIVER_ENOMEM, "gguf writer: tensor '%s'", name);
            goto fail;
        }
        w->t = t;
        w->cap_t = cap;
    }
    wtensor_t *t = &w->t[w->n_t];
    *t = (wtensor_t){.type = type, .n_dims = n_dims, .data = data, .size = size};
    for (int d = 0; d < GGUF_MAX_DIMS; d++)
        t->ne[d] = d < n_dims ? ne[d] : 1;
    if (!(t->name = strdup(name))) {
        e = river_err_set(RIVER_ENOMEM, "gguf writer: tensor '%s'", name);
        goto fail;
    }
    w->n_t++;
    return 0;
fail:
    free(data);
    return e;
}

static uint64_t align_up(uint64_t v)
{
    return (v + GGUF_DEFAULT_ALIGNMENT - 1) / GGUF_DEFAULT_ALIGNMENT * GGUF_DEFAULT_ALIGNMENT;
}

static int fput_le(FILE *f, uint64_t v, int n)
{
    unsigned char b[8];
    for (int i = 0; i < n; i++)
        b[i] = (unsigned char)(v >> (8 * i));
    return fwrite(b, 1, (size_t)n, f) == (size_t)n ? 0 : -1;
}

int gguf_writer_write(gguf_writer_t *w, const char *path)
{
    size_t n = strlen(path);
    char *tmp = malloc(n + 5);
    if (!tmp)
        return river_err_set(RIVER_ENOMEM, "%s: path", path);
    memcpy(tmp, path, n);
    memcpy(tmp + n, ".tmp", 5);
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        int e = river_err_set(errno == ENOENT ? RIVER_ENOTFOUND : RIVER_ESYS, "%s: %s", tmp,
                              strerror(errno));
        free(tmp);
        return e;
    }
    static const unsigned char zeros[GGUF_DEFAULT_ALIGNMENT];
    int bad = fwrite(GGUF_MAGIC, 1, 4, f) != 4 || fput_le(f, 3, 4) || fput_le(f, w->n_t, 8) ||
              fput_le(f, w->n_kv, 8) || (w->kv_len && fwrite(w->kv, 1, w->kv_len, f) != w->kv_len);
    uint64_t pos = 24 + w->kv_len, off = 0;
    for (uint64_t i = 0; i < w->n_t && !bad; i++) {
        const wtensor_t *t = &w->t[i];
        size_t nl = strlen(t->name);
        bad = fput_le(f, nl, 8) || fwrite(t->name, 1, nl, f) != nl ||
              fput_le(f, (uint64_t)t->n_dims, 4);
        for (int d = 0; d < t->n_dims && !bad; d++)
            bad = fput_le(f, (uint64_t)t->ne[d], 8);
        bad = bad || fput_le(f, (uint64_t)t->type, 4) || fput_le(f, off, 8);
        pos += 8 + nl + 4 + 8 * (uint64_t)t->n_dims + 4 + 8;
        off = align_up(off + t->size);
    }
    if (!bad && w->n_t)
        bad = fwrite(zeros, 1, (size_t)(align_up(pos) - pos), f) != align_up(pos) - pos;
    off = 0;
    for (uint64_t i = 0; i < w->n_t && !bad; i++) {
        const wtensor_t *t = &w->t[i];
        size_t pad = (size_t)(align_up(off + t->size) - (off + t->size));
        bad = fwrite(t->data, 1, t->size, f) != t->size ||
              fwrite(zeros, 1, pad, f) != pad; /* llama.cpp reads whole padded tensors */
        off += t->size + pad;
    }
    if (fclose(f) != 0)
        bad = 1;
    if (bad || rename(tmp, path) != 0) {
        int e = river_err_set(RIVER_EIO, "%s: writing failed: %s", path, strerror(errno));
        unlink(tmp);
        free(tmp);
        return e;
    }
    free(tmp);
    return 0;
}
