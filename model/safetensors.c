/* Safetensors reader (mmap + header validation) and streaming writer. */
#include "model/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/err.h"

/* The reference implementation refuses headers above 100 MB; a larger one is corrupt. */
#define ST_MAX_HEADER (100u * 1024u * 1024u)
/* Writes go out in blocks this large: big enough that the system-call cost vanishes. */
#define ST_WRITE_BUF (8u * 1024u * 1024u)

static const struct {
    const char *name;
    size_t size;
} st_dtypes[] = {
    [SAFETENSORS_F64] = {"F64", 8},     [SAFETENSORS_F32] = {"F32", 4},
    [SAFETENSORS_F16] = {"F16", 2},     [SAFETENSORS_BF16] = {"BF16", 2},
    [SAFETENSORS_F8_E4M3] = {"F8_E4M3", 1}, [SAFETENSORS_F8_E5M2] = {"F8_E5M2", 1},
    [SAFETENSORS_I64] = {"I64", 8},     [SAFETENSORS_I32] = {"I32", 4},
    [SAFETENSORS_I16] = {"I16", 2},     [SAFETENSORS_I8] = {"I8", 1},
    [SAFETENSORS_U64] = {"U64", 8},     [SAFETENSORS_U32] = {"U32", 4},
    [SAFETENSORS_U16] = {"U16", 2},     [SAFETENSORS_U8] = {"U8", 1},
    [SAFETENSORS_BOOL] = {"BOOL", 1},   [SAFETENSORS_UNKNOWN] = {"unknown", 0},
};

const char *safetensors_dtype_name(safetensors_dtype_t dt)
{
    if ((unsigned)dt > SAFETENSORS_UNKNOWN)
        dt = SAFETENSORS_UNKNOWN;
    return st_dtypes[dt].name;
}

size_t safetensors_dtype_size(safetensors_dtype_t dt)
{
    if ((unsigned)dt > SAFETENSORS_UNKNOWN)
        return 0;
    return st_dtypes[dt].size;
}

safetensors_dtype_t safetensors_dtype_parse(const char *s)
{
    for (int i = 0; i < SAFETENSORS_UNKNOWN; i++)
        if (!strcmp(s, st_dtypes[i].name))
            return (safetensors_dtype_t)i;
    return SAFETENSORS_UNKNOWN;
}

int safetensors_dtype_to_weight(safetensors_dtype_t dt, dtype_t *out)
{
    switch (dt) {
    case SAFETENSORS_F32:
        *out = DTYPE_F32;
        return 0;
    case SAFETENSORS_F16:
        *out = DTYPE_F16;
        return 0;
    case SAFETENSORS_BF16:
        *out = DTYPE_BF16;
        return 0;
    default:
        return -1;
    }
}

safetensors_dtype_t safetensors_dtype_from_weight(dtype_t dt)
{
    switch (dt) {
    case DTYPE_F32:
        return SAFETENSORS_F32;
    case DTYPE_F16:
        return SAFETENSORS_F16;
    case DTYPE_BF16:
        return SAFETENSORS_BF16;
    default:
        return SAFETENSORS_UNKNOWN;
    }
}

/* ---- reader ---- */

struct safetensors {
    char *path;
    void *map;                     /* the whole file, read-only */
    size_t size;
    json_t *root;                  /* the header; tensor names point into it */
    json_t *metadata;              /* borrowed from root, or NULL */
    safetensors_tensor_t *tensors; /* (n) sorted by name */
    size_t n;
};

static uint64_t st_le64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static int st_cmp_name(const void *a, const void *b)
{
    const safetensors_tensor_t *x = a, *y = b;
    return strcmp(x->name, y->name);
}

/* Orders tensors by where their data starts, to find overlaps and gaps. */
static int st_cmp_offset(const void *a, const void *b)
{
    const safetensors_tensor_t *x = *(const safetensors_tensor_t *const *)a;
    const safetensors_tensor_t *y = *(const safetensors_tensor_t *const *)b;
    if (x->file_offset != y->file_offset)
        return x->file_offset < y->file_offset ? -1 : 1;
    if (x->nbytes != y->nbytes)
        return x->nbytes < y->nbytes ? -1 : 1;
    return 0;
}

/* A non-negative JSON integer, or -1. */
static int64_t st_json_uint(const json_t *v)
{
    if (!json_is_integer(v))
        return -1;
    json_int_t x = json_integer_value(v);
    return x < 0 ? -1 : (int64_t)x;
}

/* Parses one header entry into t (data offsets still relative to the data area, kept in
 * file_offset until the caller checks bounds). */
static int st_parse_entry(safetensors_t *f, const char *name, json_t *val,
                          safetensors_tensor_t *t, uint64_t *begin, uint64_t *end)
{
    if (!json_is_object(val))
        return river_err_set(RIVER_EFORMAT, "%s: header entry '%s' is not an object", f->path,
                             name);
    json_t *dt = json_object_get(val, "dtype");
    json_t *shape = json_object_get(val, "shape");
    json_t *offs = json_object_get(val, "data_offsets");
    if (!json_is_string(dt) || !json_is_array(shape) || !json_is_array(offs))
        return river_err_set(RIVER_EFORMAT,
                             "%s: tensor '%s' lacks a string dtype, a shape array or a "
                             "data_offsets array",
                             f->path, name);
    t->name = name;
    t->dtype_str = json_string_value(dt);
    t->dtype = safetensors_dtype_parse(t->dtype_str);
    size_t nd = json_array_size(shape);
    if (nd > SAFETENSORS_MAX_DIMS)
        return river_err_set(RIVER_EFORMAT, "%s: tensor '%s' has %zu dimensions (at most %d)",
                             f->path, name, nd, SAFETENSORS_MAX_DIMS);
    t->n_dims = (int)nd;
    int64_t numel = 1;
    for (size_t i = 0; i < nd; i++) {
        int64_t d = st_json_uint(json_array_get(shape, i));
        if (d < 0)
            return river_err_set(RIVER_EFORMAT,
                                 "%s: tensor '%s' has a shape entry that is not a "
                                 "non-negative integer",
                                 f->path, name);
        t->shape[i] = d;
        /* Any tensor beyond 2^62 elements cannot fit a file, so stop there. */
        if (d != 0 && numel > (INT64_C(1) << 62) / d)
            return river_err_set(RIVER_EFORMAT, "%s: tensor '%s' has an absurd shape",
                                 f->path, name);
        numel *= d;
    }
    t->numel = numel;
    int64_t b = json_array_size(offs) == 2 ? st_json_uint(json_array_get(offs, 0)) : -1;
    int64_t e = json_array_size(offs) == 2 ? st_json_uint(json_array_get(offs, 1)) : -1;
    if (b < 0 || e < 0 || e < b)
        return river_err_set(RIVER_EFORMAT,
                             "%s: tensor '%s' data_offsets must be two integers "
                             "0 <= begin <= end",
                             f->path, name);
    size_t es = safetensors_dtype_size(t->dtype);
    if (es) {
        /* Checked apart from the size match: the message below multiplies them. */
        if (numel > (INT64_C(1) << 62) / (int64_t)es)
            return river_err_set(RIVER_EFORMAT, "%s: tensor '%s' has an absurd shape",
                                 f->path, name);
        if (numel * (int64_t)es != e - b)
            return river_err_set(RIVER_EFORMAT,
                                 "%s: tensor '%s' data_offsets [%lld, %lld] hold %lld bytes "
                                 "but %lld elements of %s need %lld",
                                 f->path, name, (long long)b, (long long)e,
                                 (long long)(e - b), (long long)numel, t->dtype_str,
                                 (long long)(numel * (int64_t)es));
    }
    t->nbytes = (size_t)(e - b);
    *begin = (uint64_t)b;
    *end = (uint64_t)e;
    return 0;
}

/* Checks that the tensors' byte ranges lie inside the data area and do not overlap. A
 * header whose tensors tile the data area without gaps but run past the end of the file
 * describes a file that was cut short (RIVER_ETRUNC); any other range outside it is a
 * corrupt header (RIVER_EFORMAT). */
static int st_check_ranges(safetensors_t *f, uint64_t data_len)
{
    int err = 0;
    safetensors_tensor_t **by_off = malloc(sizeof *by_off * (f->n ? f->n : 1));
    if (!by_off)
        return river_err_set(RIVER_ENOMEM, "%s: %zu tensors", f->path, f->n);
    for (size_t i = 0; i < f->n; i++)
        by_off[i] = &f->tensors[i];
    qsort(by_off, f->n, sizeof *by_off, st_cmp_offset);

    uint64_t max_end = 0, expect = 0;
    int gapless = 1;
    const safetensors_tensor_t *prev = NULL;
    for (size_t i = 0; i < f->n; i++) {
        const safetensors_tensor_t *t = by_off[i];
        uint64_t b = t->file_offset, e = b + t->nbytes;
        if (t->nbytes == 0) /* empty tensors occupy nothing and may sit anywhere */
            continue;
        if (prev && b < prev->file_offset + prev->nbytes) {
            err = river_err_set(RIVER_EFORMAT, "%s: tensors '%s' and '%s' overlap", f->path,
                                prev->name, t->name);
            goto out;
        }
        if (b != expect)
            gapless = 0;
        expect = e;
        if (e > max_end)
            max_end = e;
        prev = t;
    }
    if (max_end > data_len) {
        if (gapless) {
            err = river_err_set(RIVER_ETRUNC,
                                "%s: truncated: the header describes %llu bytes of tensor "
                                "data but only %llu follow it",
                                f->path, (unsigned long long)max_end,
                                (unsigned long long)data_len);
            goto out;
        }
        for (size_t i = 0; i < f->n; i++) {
            const safetensors_tensor_t *t = by_off[i];
            if (t->file_offset + t->nbytes > data_len) {
                err = river_err_set(RIVER_EFORMAT,
                                    "%s: tensor '%s' data_offsets [%llu, %llu] lie outside "
                                    "the %llu-byte data area",
                                    f->path, t->name, (unsigned long long)t->file_offset,
                                    (unsigned long long)(t->file_offset + t->nbytes),
                                    (unsigned long long)data_len);
                goto out;
            }
        }
    }
    /* Empty tensors still need a begin inside the data area. */
    for (size_t i = 0; i < f->n; i++)
        if (f->tensors[i].file_offset > data_len) {
            err = river_err_set(RIVER_EFORMAT, "%s: tensor '%s' starts past the data area",
                                f->path, f->tensors[i].name);
            goto out;
        }
out:
    free(by_off);
    return err;
}

static int st_parse_header(safetensors_t *f)
{
    const unsigned char *base = f->map;
    uint64_t hlen = st_le64(base);
    if (hlen > f->size - 8)
        return river_err_set(RIVER_EFORMAT,
                             "%s: header length %llu exceeds the %llu bytes that follow it",
                             f->path, (unsigned long long)hlen,
                             (unsigned long long)(f->size - 8));
    if (hlen > ST_MAX_HEADER)
        return river_err_set(RIVER_EFORMAT, "%s: header length %llu is over the 100 MB limit",
                             f->path, (unsigned long long)hlen);
    json_error_t jerr;
    f->root = json_loadb((const char *)base + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &jerr);
    if (!f->root)
        return river_err_set(RIVER_EFORMAT, "%s: header is not valid JSON: %s (byte %d)",
                             f->path, jerr.text, jerr.position);
    if (!json_is_object(f->root))
        return river_err_set(RIVER_EFORMAT, "%s: header is not a JSON object", f->path);

    size_t n = json_object_size(f->root);
    f->metadata = json_object_get(f->root, "__metadata__");
    if (f->metadata) {
        if (!json_is_object(f->metadata))
            return river_err_set(RIVER_EFORMAT, "%s: __metadata__ is not an object", f->path);
        n--;
    }
    f->tensors = calloc(n ? n : 1, sizeof *f->tensors);
    if (!f->tensors)
        return river_err_set(RIVER_ENOMEM, "%s: %zu tensors", f->path, n);

    uint64_t data_start = 8 + hlen, data_len = f->size - data_start;
    const char *key;
    json_t *val;
    size_t i = 0;
    json_object_foreach(f->root, key, val)
    {
        if (!strcmp(key, "__metadata__"))
            continue;
        uint64_t b = 0, e = 0;
        int err = st_parse_entry(f, key, val, &f->tensors[i], &b, &e);
        if (err)
            return err;
        /* Relative for now; made absolute once the ranges are known to be sane. */
        f->tensors[i].file_offset = b;
        i++;
    }
    f->n = i;
    int err = st_check_ranges(f, data_len);
    if (err)
        return err;
    for (i = 0; i < f->n; i++) {
        f->tensors[i].data = base + data_start + f->tensors[i].file_offset;
        f->tensors[i].file_offset += data_start;
    }
    qsort(f->tensors, f->n, sizeof *f->tensors, st_cmp_name);
    return 0;
}

int safetensors_open(safetensors_t **out, const char *path)
{
    int err;
    safetensors_t *f = calloc(1, sizeof *f);
    if (!f)
        return river_err_set(RIVER_ENOMEM, "%s: reader", path);
    f->path = strdup(path);
    if (!f->path) {
        err = river_err_set(RIVER_ENOMEM, "%s: reader", path);
        goto fail;
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        err = river_err_set(errno == ENOENT ? RIVER_ENOTFOUND : RIVER_ESYS, "%s: open: %s",
                            path, strerror(errno));
        goto fail;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        err = river_err_set(RIVER_ESYS, "%s: fstat: %s", path, strerror(errno));
        goto fail_fd;
    }
    if (!S_ISREG(st.st_mode)) {
        err = river_err_set(RIVER_EFORMAT, "%s: not a regular file", path);
        goto fail_fd;
    }
    if (st.st_size < 8) {
        err = river_err_set(RIVER_ETRUNC, "%s: truncated: %lld bytes, shorter than the 8-byte "
                            "header length", path, (long long)st.st_size);
        goto fail_fd;
    }
    f->size = (size_t)st.st_size;
    f->map = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (f->map == MAP_FAILED) {
        f->map = NULL;
        err = river_err_set(RIVER_ESYS, "%s: mmap of %zu bytes: %s", path, f->size,
                            strerror(errno));
        goto fail_fd;
    }
    if (close(fd) != 0) {
        err = river_err_set(RIVER_ESYS, "%s: close: %s", path, strerror(errno));
        goto fail;
    }
    err = st_parse_header(f);
    if (err)
        goto fail;
    *out = f;
    return 0;

fail_fd:
    close(fd);
fail:
    safetensors_destroy(&f);
    return err;
}

void safetensors_destroy(safetensors_t **pf)
{
    safetensors_t *f = *pf;
    if (!f)
        return;
    if (f->map)
        munmap(f->map, f->size);
    free(f->tensors);
    json_decref(f->root);
    free(f->path);
    free(f);
    *pf = NULL;
}

const char *safetensors_path(const safetensors_t *f)
{
    return f->path;
}

size_t safetensors_count(const safetensors_t *f)
{
    return f->n;
}

const safetensors_tensor_t *safetensors_tensor_at(const safetensors_t *f, size_t i)
{
    return i < f->n ? &f->tensors[i] : NULL;
}

const safetensors_tensor_t *safetensors_find(const safetensors_t *f, const char *name)
{
    safetensors_tensor_t key = {.name = name};
    return bsearch(&key, f->tensors, f->n, sizeof *f->tensors, st_cmp_name);
}

const char *safetensors_metadata(const safetensors_t *f, const char *key)
{
    if (!f->metadata)
        return NULL;
    return json_string_value(json_object_get(f->metadata, key));
}

/* ---- writer ---- */

struct safetensors_writer {
    char *path;
    char *tmp_path;       /* path + ".part" until finished */
    int fd;               /* -1 until begin */
    json_t *header;       /* tensor entries in declaration order */
    json_t *metadata;
    uint64_t total;       /* declared data bytes */
    uint64_t written;     /* data bytes accepted so far */
    unsigned char *buf;   /* (ST_WRITE_BUF) pending bytes */
    size_t buf_len;
    int begun;
    int finished;
};

static int st_write_all(const char *path, int fd, const void *p, size_t n)
{
    const unsigned char *c = p;
    while (n) {
        ssize_t w = write(fd, c, n);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return river_err_set(RIVER_EIO, "%s: write: %s", path, strerror(errno));
        }
        c += w;
        n -= (size_t)w;
    }
    return 0;
}

int safetensors_writer_new(safetensors_writer_t **out, const char *path)
{
    safetensors_writer_t *w = calloc(1, sizeof *w);
    if (!w)
        return river_err_set(RIVER_ENOMEM, "%s: writer", path);
    w->fd = -1;
    size_t n = strlen(path);
    w->path = strdup(path);
    w->tmp_path = malloc(n + sizeof ".part");
    w->header = json_object();
    w->metadata = json_object();
    w->buf = malloc(ST_WRITE_BUF);
    if (!w->path || !w->tmp_path || !w->header || !w->metadata || !w->buf) {
        safetensors_writer_destroy(&w);
        return river_err_set(RIVER_ENOMEM, "%s: writer", path);
    }
    memcpy(w->tmp_path, path, n);
    memcpy(w->tmp_path + n, ".part", sizeof ".part");
    *out = w;
    return 0;
}

int safetensors_writer_add(safetensors_writer_t *w, const char *name, safetensors_dtype_t dt,
                           int n_dims, const int64_t *shape)
{
    if (w->begun)
        return river_err_set(RIVER_ESTATE, "%s: tensor '%s' declared after the header",
                             w->path, name);
    size_t es = safetensors_dtype_size(dt);
    if (!es)
        return river_err_set(RIVER_EDTYPE, "%s: tensor '%s': no element size for dtype %s",
                             w->path, name, safetensors_dtype_name(dt));
    if (n_dims < 0 || n_dims > SAFETENSORS_MAX_DIMS)
        return river_err_set(RIVER_EINVAL, "%s: tensor '%s' has %d dimensions", w->path, name,
                             n_dims);
    if (!strcmp(name, "__metadata__") || json_object_get(w->header, name))
        return river_err_set(RIVER_EINVAL, "%s: tensor name '%s' is reserved or repeated",
                             w->path, name);
    json_t *jshape = json_array();
    int64_t numel = 1;
    for (int i = 0; i < n_dims; i++) {
        if (shape[i] < 0 || (shape[i] && numel > (INT64_C(1) << 60) / shape[i])) {
            json_decref(jshape);
            return river_err_set(RIVER_EINVAL, "%s: tensor '%s' has a bad shape", w->path,
                                 name);
        }
        numel *= shape[i];
        json_array_append_new(jshape, json_integer(shape[i]));
    }
    uint64_t bytes = (uint64_t)numel * es;
    json_t *entry = json_pack("{s:s, s:o, s:[I, I]}", "dtype", safetensors_dtype_name(dt),
                              "shape", jshape, "data_offsets", (json_int_t)w->total,
                              (json_int_t)(w->total + bytes));
    if (!entry || json_object_set_new(w->header, name, entry) != 0)
        return river_err_set(RIVER_ENOMEM, "%s: header entry '%s'", w->path, name);
    w->total += bytes;
    return 0;
}

int safetensors_writer_set_metadata(safetensors_writer_t *w, const char *key, const char *value)
{
    if (w->begun)
        return river_err_set(RIVER_ESTATE, "%s: metadata set after the header", w->path);
    if (json_object_set_new(w->metadata, key, json_string(value)) != 0)
        return river_err_set(RIVER_EINVAL, "%s: metadata '%s' is not valid UTF-8", w->path,
                             key);
    return 0;
}

int safetensors_writer_begin(safetensors_writer_t *w)
{
    if (w->begun)
        return river_err_set(RIVER_ESTATE, "%s: header written twice", w->path);
    if (json_object_size(w->metadata) &&
        json_object_set(w->header, "__metadata__", w->metadata) != 0)
        return river_err_set(RIVER_ENOMEM, "%s: header", w->path);
    char *js = json_dumps(w->header, JSON_COMPACT);
    if (!js)
        return river_err_set(RIVER_ENOMEM, "%s: header", w->path);
    size_t len = strlen(js);
    /* Pad with spaces (valid JSON whitespace) so the data area is 8-byte aligned and every
     * tensor of a reasonable dtype lands aligned in a mapping. */
    size_t padded = (len + 7) & ~(size_t)7;
    unsigned char *hdr = malloc(8 + padded);
    if (!hdr) {
        free(js);
        return river_err_set(RIVER_ENOMEM, "%s: header", w->path);
    }
    for (int i = 0; i < 8; i++)
        hdr[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    memcpy(hdr + 8, js, len);
    memset(hdr + 8 + len, ' ', padded - len);
    free(js);

    int err = 0;
    w->fd = open(w->tmp_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (w->fd < 0)
        err = river_err_set(RIVER_EIO, "%s: open: %s", w->tmp_path, strerror(errno));
    else
        err = st_write_all(w->tmp_path, w->fd, hdr, 8 + padded);
    free(hdr);
    w->begun = 1;
    return err;
}

static int st_flush(safetensors_writer_t *w)
{
    int err = st_write_all(w->tmp_path, w->fd, w->buf, w->buf_len);
    w->buf_len = 0;
    return err;
}

int safetensors_writer_write(safetensors_writer_t *w, const void *data, size_t n)
{
    if (!w->begun || w->fd < 0 || w->finished)
        return river_err_set(RIVER_ESTATE, "%s: data written outside begin..finish", w->path);
    if (n > w->total - w->written)
        return river_err_set(RIVER_EINVAL, "%s: %zu bytes written past the %llu declared",
                             w->path, n, (unsigned long long)w->total);
    w->written += n;
    if (w->buf_len + n <= ST_WRITE_BUF) {
        memcpy(w->buf + w->buf_len, data, n);
        w->buf_len += n;
        return w->buf_len == ST_WRITE_BUF ? st_flush(w) : 0;
    }
    int err = st_flush(w);
    if (err)
        return err;
    if (n >= ST_WRITE_BUF)
        return st_write_all(w->tmp_path, w->fd, data, n);
    memcpy(w->buf, data, n);
    w->buf_len = n;
    return 0;
}

int safetensors_writer_finish(safetensors_writer_t *w)
{
    if (!w->begun || w->fd < 0 || w->finished)
        return river_err_set(RIVER_ESTATE, "%s: finished before begin or twice", w->path);
    if (w->written != w->total)
        return river_err_set(RIVER_ESTATE, "%s: %llu of %llu declared bytes written", w->path,
                             (unsigned long long)w->written, (unsigned long long)w->total);
    int err = st_flush(w);
    if (err)
        return err;
    int fd = w->fd;
    w->fd = -1;
    if (close(fd) != 0)
        return river_err_set(RIVER_EIO, "%s: close: %s", w->tmp_path, strerror(errno));
    if (rename(w->tmp_path, w->path) != 0)
        return river_err_set(RIVER_EIO, "%s: rename to %s: %s", w->tmp_path, w->path,
                             strerror(errno));
    w->finished = 1;
    return 0;
}

void safetensors_writer_destroy(safetensors_writer_t **pw)
{
    safetensors_writer_t *w = *pw;
    if (!w)
        return;
    if (w->fd >= 0)
        close(w->fd);
    if (w->begun && !w->finished)
        unlink(w->tmp_path);
    json_decref(w->header);
    json_decref(w->metadata);
    free(w->buf);
    free(w->tmp_path);
    free(w->path);
    free(w);
    *pw = NULL;
}

uint64_t safetensors_writer_data_size(const safetensors_writer_t *w)
{
    return w->total;
}
