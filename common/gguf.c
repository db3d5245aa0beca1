/* The GGUF reader (common/gguf.h). The file is read through a cursor that checks every read
 * against the bytes left, so each failure can say what it was reading: the key, or the
 * tensor, whose bytes were cut off or wrong. Layout (all little-endian):
 *   "GGUF" u32 version, u64 n_tensors, u64 n_kv,
 *   n_kv x {string key, u32 type, value}     string = u64 len + bytes; array = u32 elem
 *                                             type + u64 count + elements
 *   n_tensors x {string name, u32 n_dims, n_dims x u64 ne, u32 type, u64 offset}
 *   padding to general.alignment, then the data section the offsets count from. */
#include "common/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/err.h"

/* ---- type tables ---- */

static const struct {
    int type;
    const char *name;
    int block;          /* elements a block */
    size_t block_bytes; /* bytes a block */
} ggml_types[] = {
    {GGML_TYPE_F32, "F32", 1, 4},       {GGML_TYPE_F16, "F16", 1, 2},
    {GGML_TYPE_Q4_0, "Q4_0", 32, 18},   {GGML_TYPE_Q4_1, "Q4_1", 32, 20},
    {GGML_TYPE_Q5_0, "Q5_0", 32, 22},   {GGML_TYPE_Q5_1, "Q5_1", 32, 24},
    {GGML_TYPE_Q8_0, "Q8_0", 32, 34},   {GGML_TYPE_Q8_1, "Q8_1", 32, 36},
    {GGML_TYPE_Q2_K, "Q2_K", 256, 84},  {GGML_TYPE_Q3_K, "Q3_K", 256, 110},
    {GGML_TYPE_Q4_K, "Q4_K", 256, 144}, {GGML_TYPE_Q5_K, "Q5_K", 256, 176},
    {GGML_TYPE_Q6_K, "Q6_K", 256, 210}, {GGML_TYPE_Q8_K, "Q8_K", 256, 292},
    {GGML_TYPE_I8, "I8", 1, 1},         {GGML_TYPE_I16, "I16", 1, 2},
    {GGML_TYPE_I32, "I32", 1, 4},       {GGML_TYPE_I64, "I64", 1, 8},
    {GGML_TYPE_F64, "F64", 1, 8},       {GGML_TYPE_BF16, "BF16", 1, 2},
};
#define N_GGML_TYPES (sizeof ggml_types / sizeof ggml_types[0])

static int ggml_type_index(int type)
{
    for (size_t i = 0; i < N_GGML_TYPES; i++)
        if (ggml_types[i].type == type)
            return (int)i;
    return -1;
}

int ggml_type_block(int type)
{
    int i = ggml_type_index(type);
    return i < 0 ? 0 : ggml_types[i].block;
}

size_t ggml_type_block_bytes(int type)
{
    int i = ggml_type_index(type);
    return i < 0 ? 0 : ggml_types[i].block_bytes;
}

const char *ggml_type_name(int type)
{
    int i = ggml_type_index(type);
    return i < 0 ? "?" : ggml_types[i].name;
}

int ggml_type_from_name(const char *name)
{
    for (size_t i = 0; i < N_GGML_TYPES; i++)
        if (!strcasecmp(ggml_types[i].name, name))
            return ggml_types[i].type;
    return -1;
}

/* Bytes of a scalar of each metadata type; 0 for string and array. */
static const size_t gguf_type_bytes[GGUF_TYPE_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
static const char *const gguf_type_names[GGUF_TYPE_COUNT] = {
    "uint8", "int8", "uint16", "int16", "uint32", "int32", "float32",
    "bool", "string", "array", "uint64", "int64", "float64"};

const char *gguf_type_name(int type)
{
    return type >= 0 && type < GGUF_TYPE_COUNT ? gguf_type_names[type] : "?";
}

/* ---- cursor ---- */

typedef struct cur {
    const gguf_t *g;
    size_t pos;
} cur_t;

static uint64_t rd_le(const unsigned char *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

static size_t cur_left(const cur_t *c)
{
    return c->g->size - c->pos;
}

/* Reads an n-byte little-endian integer; what names the field for the message. */
static int cur_u(cur_t *c, int n, uint64_t *v, const char *what)
{
    *v = 0;
    if (cur_left(c) < (size_t)n)
        return river_err_set(RIVER_ETRUNC, "%s: truncated in %s at byte %zu (%d bytes needed, "
                             "%zu left)", c->g->path, what, c->pos, n, cur_left(c));
    *v = rd_le(c->g->base + c->pos, n);
    c->pos += (size_t)n;
    return 0;
}

/* A string: its bytes stay in the file; *p and *len point at them. */
static int cur_str(cur_t *c, const unsigned char **p, uint64_t *len, const char *what)
{
    int e = cur_u(c, 8, len, what);
    if (e)
        return e;
    if (*len > cur_left(c))
        return river_err_set(RIVER_ETRUNC, "%s: truncated in %s: a string of %llu bytes at "
                             "byte %zu, %zu left", c->g->path, what, (unsigned long long)*len,
                             c->pos, cur_left(c));
    *p = c->g->base + c->pos;
    c->pos += (size_t)*len;
    return 0;
}

/* ---- parsing ---- */

void gguf_destroy(gguf_t **pg)
{
    gguf_t *g = *pg;
    if (!g)
        return;
    for (uint64_t i = 0; g->kv && i < g->n_kv; i++) {
        free(g->kv[i].key);
        free(g->kv[i].str_off);
    }
    free(g->kv);
    for (uint64_t i = 0; g->tensors && i < g->n_tensors; i++)
        free(g->tensors[i].name);
    free(g->tensors);
    free(g->by_name);
    if (g->mapped && g->base)
        munmap((void *)g->base, g->size);
    free(g->path);
    free(g);
    *pg = NULL;
}

/* A NUL-terminated copy of a key or tensor name (the caller checks for embedded NULs). */
static char *name_copy(const unsigned char *p, uint64_t len)
{
    char *s = malloc((size_t)len + 1);
    if (!s)
        return NULL;
    memcpy(s, p, (size_t)len);
    s[len] = 0;
    return s;
}

static int kv_parse_value(cur_t *c, gguf_kv_t *kv)
{
    gguf_t *g = (gguf_t *)c->g;
    char what[200];
    snprintf(what, sizeof what, "the value of key '%.120s'", kv->key);
    uint64_t t = 0;
    int e = cur_u(c, 4, &t, what);
    if (e)
        return e;
    if (t >= GGUF_TYPE_COUNT)
        return river_err_set(RIVER_EDTYPE, "%s: key '%s' has unknown value type %llu", g->path,
                             kv->key, (unsigned long long)t);
    kv->type = (gguf_type_t)t;
    kv->n = 1;
    kv->data = g->base + c->pos;
    if (t == GGUF_TYPE_STRING) {
        const unsigned char *p;
        uint64_t len;
        return cur_str(c, &p, &len, what);
    }
    if (t != GGUF_TYPE_ARRAY) {
        if (cur_left(c) < gguf_type_bytes[t])
            return river_err_set(RIVER_ETRUNC, "%s: truncated in %s (%s, %zu bytes left)",
                                 g->path, what, gguf_type_names[t], cur_left(c));
        c->pos += gguf_type_bytes[t];
        return 0;
    }
    uint64_t et = 0, n = 0;
    if ((e = cur_u(c, 4, &et, what)) || (e = cur_u(c, 8, &n, what)))
        return e;
    if (et >= GGUF_TYPE_COUNT)
        return river_err_set(RIVER_EDTYPE, "%s: key '%s' is an array of unknown type %llu",
                             g->path, kv->key, (unsigned long long)et);
    if (et == GGUF_TYPE_ARRAY)
        return river_err_set(RIVER_EUNSUPPORTED, "%s: key '%s' is an array of arrays, which "
                             "this reader does not take", g->path, kv->key);
    kv->arr_type = (gguf_type_t)et;
    kv->n = n;
    kv->data = g->base + c->pos;
    if (et != GGUF_TYPE_STRING) {
        size_t eb = gguf_type_bytes[et];
        if (n > cur_left(c) / eb)
            return river_err_set(n > SIZE_MAX / eb ? RIVER_EFORMAT : RIVER_ETRUNC,
                                 "%s: key '%s': an array of %llu %s elements does not fit "
                                 "the %zu bytes left", g->path, kv->key,
                                 (unsigned long long)n, gguf_type_names[et], cur_left(c));
        c->pos += (size_t)n * eb;
        return 0;
    }
    /* Each string takes at least its 8-byte length, which bounds the count before the
     * offset table is allocated. */
    if (n > cur_left(c) / 8)
        return river_err_set(RIVER_ETRUNC, "%s: key '%s': an array of %llu strings does not "
                             "fit the %zu bytes left", g->path, kv->key, (unsigned long long)n,
                             cur_left(c));
    kv->str_off = malloc(sizeof *kv->str_off * (size_t)(n ? n : 1));
    if (!kv->str_off)
        return river_err_set(RIVER_ENOMEM, "%s: key '%s': %llu strings", g->path, kv->key,
                             (unsigned long long)n);
    for (uint64_t i = 0; i < n; i++) {
        kv->str_off[i] = (uint64_t)(g->base + c->pos - kv->data);
        const unsigned char *p;
        uint64_t len;
        char ew[240];
        snprintf(ew, sizeof ew, "element %llu of key '%.120s'", (unsigned long long)i, kv->key);
        if ((e = cur_str(c, &p, &len, ew)))
            return e;
    }
    return 0;
}

static int tensor_name_cmp(const gguf_t *g, uint64_t a, uint64_t b)
{
    return strcmp(g->tensors[a].name, g->tensors[b].name);
}

/* Sorts idx[0..n) by tensor name (bottom-up merge sort: stable, no global state). */
static int sort_by_name(const gguf_t *g, uint64_t *idx, uint64_t n)
{
    uint64_t *tmp = malloc(sizeof *tmp * (size_t)(n ? n : 1));
    if (!tmp)
        return RIVER_ENOMEM;
    for (uint64_t w = 1; w < n; w *= 2) {
        for (uint64_t lo = 0; lo < n; lo += 2 * w) {
            uint64_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
            uint64_t i = lo, j = mid, k = lo;
            while (i < mid && j < hi)
                tmp[k++] = tensor_name_cmp(g, idx[i], idx[j]) <= 0 ? idx[i++] : idx[j++];
            while (i < mid)
                tmp[k++] = idx[i++];
            while (j < hi)
                tmp[k++] = idx[j++];
        }
        memcpy(idx, tmp, sizeof *idx * (size_t)n);
    }
    free(tmp);
    return 0;
}

static int parse_tensor(cur_t *c, uint64_t i, gguf_tensor_t *t)
{
    gguf_t *g = (gguf_t *)c->g;
    char what[200];
    snprintf(what, sizeof what, "the name of tensor %llu", (unsigned long long)i);
    const unsigned char *p;
    uint64_t len = 0, v = 0;
    int e = cur_str(c, &p, &len, what);
    if (e)
        return e;
    if (!(t->name = name_copy(p, len)))
        return river_err_set(RIVER_ENOMEM, "%s: tensor name", g->path);
    if (strlen(t->name) != len)
        return river_err_set(RIVER_EFORMAT, "%s: tensor %llu's name holds a NUL byte",
                             g->path, (unsigned long long)i);
    snprintf(what, sizeof what, "the info of tensor '%.120s'", t->name);
    if ((e = cur_u(c, 4, &v, what)))
        return e;
    if (v < 1 || v > GGUF_MAX_DIMS)
        return river_err_set(RIVER_EFORMAT, "%s: tensor '%s' has %llu dimensions (1 to %d)",
                             g->path, t->name, (unsigned long long)v, GGUF_MAX_DIMS);
    t->n_dims = (int)v;
    uint64_t numel = 1;
    for (int d = 0; d < GGUF_MAX_DIMS; d++) {
        t->ne[d] = 1;
        if (d >= t->n_dims)
            continue;
        if ((e = cur_u(c, 8, &v, what)))
            return e;
        if (v < 1 || v > (uint64_t)INT64_MAX || numel > (uint64_t)INT64_MAX / v)
            return river_err_set(RIVER_EFORMAT, "%s: tensor '%s': dimension %d of %llu "
                                 "elements is zero or makes the element count overflow",
                                 g->path, t->name, d, (unsigned long long)v);
        t->ne[d] = (int64_t)v;
        numel *= v;
    }
    if ((e = cur_u(c, 4, &v, what)))
        return e;
    t->type = (int)v;
    int block = v > 1000 ? 0 : ggml_type_block((int)v);
    if (!block)
        return river_err_set(RIVER_EDTYPE, "%s: tensor '%s' has unknown tensor type %llu",
                             g->path, t->name, (unsigned long long)v);
    if (t->ne[0] % block != 0)
        return river_err_set(RIVER_EFORMAT, "%s: tensor '%s' (%s): %lld elements a row is not "
                             "a multiple of the type's %d-element blocks", g->path, t->name,
                             ggml_type_name(t->type), (long long)t->ne[0], block);
    uint64_t bb = ggml_type_block_bytes(t->type), blocks = numel / (uint64_t)block;
    if (blocks > (uint64_t)INT64_MAX / bb)
        return river_err_set(RIVER_EFORMAT, "%s: tensor '%s': its size overflows", g->path,
                             t->name);
    t->size = blocks * bb;
    if ((e = cur_u(c, 8, &t->offset, what)))
        return e;
    return 0;
}

static int parse(gguf_t *g)
{
    cur_t c = {.g = g};
    uint64_t v = 0, n_tensors = 0, n_kv = 0;
    int e;
    if (g->size < 4 || memcmp(g->base, GGUF_MAGIC, 4) != 0)
        return g->size < 4 ? river_err_set(RIVER_ETRUNC, "%s: truncated: %zu bytes, shorter "
                                           "than the GGUF magic", g->path, g->size)
                           : river_err_set(RIVER_EFORMAT, "%s: not a GGUF file (no 'GGUF' "
                                           "magic)", g->path);
    c.pos = 4;
    if ((e = cur_u(&c, 4, &v, "the header (version)")))
        return e;
    if (v != 2 && v != 3)
        return river_err_set(RIVER_EUNSUPPORTED, "%s: GGUF version %llu; this reader takes "
                             "versions 2 and 3", g->path, (unsigned long long)v);
    g->version = (uint32_t)v;
    if ((e = cur_u(&c, 8, &n_tensors, "the header (tensor count)")) ||
        (e = cur_u(&c, 8, &n_kv, "the header (metadata count)")))
        return e;
    /* A key/value takes at least 13 bytes (length, one byte, type) and a tensor info 25,
     * which bounds both counts by the file before anything is allocated for them. */
    if (n_kv > cur_left(&c) / 13)
        return river_err_set(RIVER_EFORMAT, "%s: header: %llu metadata keys cannot fit the "
                             "%zu bytes left", g->path, (unsigned long long)n_kv, cur_left(&c));
    if (n_tensors > cur_left(&c) / 25)
        return river_err_set(RIVER_EFORMAT, "%s: header: %llu tensors cannot fit the %zu "
                             "bytes left", g->path, (unsigned long long)n_tensors, cur_left(&c));
    g->kv = calloc((size_t)(n_kv ? n_kv : 1), sizeof *g->kv);
    g->tensors = calloc((size_t)(n_tensors ? n_tensors : 1), sizeof *g->tensors);
    g->by_name = calloc((size_t)(n_tensors ? n_tensors : 1), sizeof *g->by_name);
    if (!g->kv || !g->tensors || !g->by_name)
        return river_err_set(RIVER_ENOMEM, "%s: %llu keys, %llu tensors", g->path,
                             (unsigned long long)n_kv, (unsigned long long)n_tensors);
    g->alignment = GGUF_DEFAULT_ALIGNMENT;
    for (uint64_t i = 0; i < n_kv; i++) {
        gguf_kv_t *kv = &g->kv[i];
        const unsigned char *p;
        uint64_t len;
        char what[64];
        snprintf(what, sizeof what, "the name of key %llu", (unsigned long long)i);
        if ((e = cur_str(&c, &p, &len, what)))
            return e;
        if (!(kv->key = name_copy(p, len)))
            return river_err_set(RIVER_ENOMEM, "%s: key", g->path);
        g->n_kv = i + 1;
        if (strlen(kv->key) != len)
            return river_err_set(RIVER_EFORMAT, "%s: key %llu's name holds a NUL byte",
                                 g->path, (unsigned long long)i);
        if ((e = kv_parse_value(&c, kv)))
            return e;
        /* Keys are few (tens), so a linear check for duplicates costs nothing. */
        for (uint64_t j = 0; j < i; j++)
            if (!strcmp(g->kv[j].key, kv->key))
                return river_err_set(RIVER_EFORMAT, "%s: duplicate key '%s'", g->path,
                                     kv->key);
    }
    const gguf_kv_t *al = gguf_find_kv(g, "general.alignment");
    if (al) {
        if (al->type != GGUF_TYPE_UINT32)
            return river_err_set(RIVER_EDTYPE, "%s: key 'general.alignment' is a %s; it must "
                                 "be a uint32", g->path, gguf_type_name(al->type));
        uint32_t a = (uint32_t)rd_le(al->data, 4);
        if (a == 0 || (a & (a - 1)) != 0)
            return river_err_set(RIVER_EFORMAT, "%s: key 'general.alignment' is %u; it must be "
                                 "a power of two", g->path, a);
        g->alignment = a;
    }
    for (uint64_t i = 0; i < n_tensors; i++) {
        g->n_tensors = i + 1;
        if ((e = parse_tensor(&c, i, &g->tensors[i])))
            return e;
    }
    uint64_t data = ((uint64_t)c.pos + g->alignment - 1) / g->alignment * g->alignment;
    if (n_tensors > 0 && data > g->size)
        return river_err_set(RIVER_ETRUNC, "%s: truncated: the data section would start at "
                             "byte %llu of %zu", g->path, (unsigned long long)data, g->size);
    g->data_offset = data;
    uint64_t avail = data <= g->size ? g->size - data : 0;
    for (uint64_t i = 0; i < n_tensors; i++) {
        gguf_tensor_t *t = &g->tensors[i];
        if (t->offset % g->alignment != 0)
            return river_err_set(RIVER_EFORMAT, "%s: tensor '%s' is misaligned: offset %llu is "
                                 "not a multiple of the alignment %u", g->path, t->name,
                                 (unsigned long long)t->offset, g->alignment);
        if (t->offset > avail || t->size > avail - t->offset)
            return river_err_set(RIVER_ETRUNC, "%s: tensor '%s': its data (%llu bytes at "
                                 "offset %llu) runs past the end of the file (%llu bytes of "
                                 "data)", g->path, t->name, (unsigned long long)t->size,
                                 (unsigned long long)t->offset, (unsigned long long)avail);
        t->data = g->base + data + t->offset;
        g->by_name[i] = i;
    }
    if (sort_by_name(g, g->by_name, n_tensors))
        return river_err_set(RIVER_ENOMEM, "%s: tensor index", g->path);
    for (uint64_t i = 1; i < n_tensors; i++)
        if (!tensor_name_cmp(g, g->by_name[i - 1], g->by_name[i]))
            return river_err_set(RIVER_EFORMAT, "%s: duplicate tensor name '%s'", g->path,
                                 g->tensors[g->by_name[i]].name);
    return 0;
}

int gguf_open_mem(gguf_t **out, const void *data, size_t size, const char *name)
{
    *out = NULL;
    gguf_t *g = calloc(1, sizeof *g);
    if (!g || !(g->path = strdup(name ? name : "gguf"))) {
        free(g);
        return river_err_set(RIVER_ENOMEM, "%s: gguf", name ? name : "gguf");
    }
    g->base = data;
    g->size = size;
    int e = parse(g);
    if (e) {
        gguf_destroy(&g);
        return e;
    }
    *out = g;
    return 0;
}

int gguf_open(gguf_t **out, const char *path)
{
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return river_err_set(errno == ENOENT ? RIVER_ENOTFOUND : RIVER_ESYS, "%s: open: %s",
                             path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return river_err_set(RIVER_EINVAL, "%s: not a regular file", path);
    }
    size_t size = (size_t)st.st_size;
    void *map = NULL;
    if (size > 0) {
        map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) {
            int en = errno;
            close(fd);
            return river_err_set(RIVER_ESYS, "%s: mmap: %s", path, strerror(en));
        }
    }
    close(fd);
    static const unsigned char empty[1];
    int e = gguf_open_mem(out, map ? map : empty, size, path);
    if (e) {
        if (map)
            munmap(map, size);
        return e;
    }
    (*out)->mapped = map != NULL;
    return 0;
}

int gguf_is_magic(const void *head, size_t len)
{
    return len >= 4 && !memcmp(head, GGUF_MAGIC, 4);
}

int gguf_path_is_gguf(const char *path)
{
    size_t n = strlen(path);
    if (n >= 5 && !strcasecmp(path + n - 5, ".gguf"))
        return 1;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    unsigned char head[4];
    ssize_t got = read(fd, head, sizeof head);
    close(fd);
    return got == 4 && gguf_is_magic(head, 4);
}

/* ---- lookups ---- */

const gguf_kv_t *gguf_find_kv(const gguf_t *g, const char *key)
{
    for (uint64_t i = 0; i < g->n_kv; i++)
        if (g->kv[i].key && !strcmp(g->kv[i].key, key))
            return &g->kv[i];
    return NULL;
}

const gguf_tensor_t *gguf_find_tensor(const gguf_t *g, const char *name)
{
    uint64_t lo = 0, hi = g->n_tensors;
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2;
        int c = strcmp(g->tensors[g->by_name[mid]].name, name);
        if (!c)
            return &g->tensors[g->by_name[mid]];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

static int is_int_type(int t)
{
    return t == GGUF_TYPE_UINT8 || t == GGUF_TYPE_INT8 || t == GGUF_TYPE_UINT16 ||
           t == GGUF_TYPE_INT16 || t == GGUF_TYPE_UINT32 || t == GGUF_TYPE_INT32 ||
           t == GGUF_TYPE_UINT64 || t == GGUF_TYPE_INT64 || t == GGUF_TYPE_BOOL;
}

/* An integer element of type t at p; *ok cleared for a uint64 beyond INT64_MAX. */
static int64_t int_at(int t, const unsigned char *p, int *ok)
{
    uint64_t u = rd_le(p, (int)gguf_type_bytes[t]);
    switch (t) {
    case GGUF_TYPE_INT8:
        return (int8_t)u;
    case GGUF_TYPE_INT16:
        return (int16_t)u;
    case GGUF_TYPE_INT32:
        return (int32_t)u;
    case GGUF_TYPE_INT64:
        return (int64_t)u;
    case GGUF_TYPE_UINT64:
        if (u > (uint64_t)INT64_MAX)
            *ok = 0;
        return (int64_t)u;
    default:
        return (int64_t)u;
    }
}

static double float_at(int t, const unsigned char *p)
{
    if (t == GGUF_TYPE_FLOAT32) {
        uint32_t u = (uint32_t)rd_le(p, 4);
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    if (t == GGUF_TYPE_FLOAT64) {
        uint64_t u = rd_le(p, 8);
        double d;
        memcpy(&d, &u, 8);
        return d;
    }
    int ok = 1;
    return (double)int_at(t, p, &ok);
}

static int find_typed(const gguf_t *g, const char *key, const gguf_kv_t **kv)
{
    *kv = gguf_find_kv(g, key);
    if (!*kv)
        return river_err_set(RIVER_ENOTFOUND, "%s: no key '%s'", g->path, key);
    return 0;
}

static int wrong_type(const gguf_t *g, const gguf_kv_t *kv, const char *want)
{
    if (kv->type == GGUF_TYPE_ARRAY)
        return river_err_set(RIVER_EDTYPE, "%s: key '%s' is an array of %s; expected %s",
                             g->path, kv->key, gguf_type_name(kv->arr_type), want);
    return river_err_set(RIVER_EDTYPE, "%s: key '%s' is a %s; expected %s", g->path, kv->key,
                         gguf_type_name(kv->type), want);
}

int gguf_get_i64(const gguf_t *g, const char *key, int64_t *out)
{
    const gguf_kv_t *kv;
    int e = find_typed(g, key, &kv);
    if (e)
        return e;
    if (!is_int_type(kv->type))
        return wrong_type(g, kv, "an integer");
    int ok = 1;
    int64_t v = int_at(kv->type, kv->data, &ok);
    if (!ok)
        return river_err_set(RIVER_ERANGE, "%s: key '%s' is out of range", g->path, key);
    *out = v;
    return 0;
}

int gguf_get_int(const gguf_t *g, const char *key, int *out)
{
    int64_t v;
    int e = gguf_get_i64(g, key, &v);
    if (e)
        return e;
    if (v < -2147483647LL - 1 || v > 2147483647LL)
        return river_err_set(RIVER_ERANGE, "%s: key '%s' is %lld, out of range", g->path, key,
                             (long long)v);
    *out = (int)v;
    return 0;
}

int gguf_get_f32(const gguf_t *g, const char *key, float *out)
{
    const gguf_kv_t *kv;
    int e = find_typed(g, key, &kv);
    if (e)
        return e;
    if (kv->type != GGUF_TYPE_FLOAT32 && kv->type != GGUF_TYPE_FLOAT64 &&
        !is_int_type(kv->type))
        return wrong_type(g, kv, "a number");
    *out = (float)float_at(kv->type, kv->data);
    return 0;
}

int gguf_get_bool(const gguf_t *g, const char *key, int *out)
{
    const gguf_kv_t *kv;
    int e = find_typed(g, key, &kv);
    if (e)
        return e;
    if (kv->type != GGUF_TYPE_BOOL)
        return wrong_type(g, kv, "a bool");
    *out = kv->data[0] != 0;
    return 0;
}

int gguf_get_str(const gguf_t *g, const char *key, const char **s, size_t *len)
{
    const gguf_kv_t *kv;
    int e = find_typed(g, key, &kv);
    if (e)
        return e;
    if (kv->type != GGUF_TYPE_STRING)
        return wrong_type(g, kv, "a string");
    *len = (size_t)rd_le(kv->data, 8);
    *s = (const char *)kv->data + 8;
    return 0;
}

int gguf_get_strdup(const gguf_t *g, const char *key, char **out)
{
    const char *s;
    size_t len;
    int e = gguf_get_str(g, key, &s, &len);
    if (e)
        return e;
    char *p = malloc(len + 1);
    if (!p)
        return river_err_set(RIVER_ENOMEM, "%s: key '%s'", g->path, key);
    memcpy(p, s, len);
    p[len] = 0;
    *out = p;
    return 0;
}

int gguf_get_arr(const gguf_t *g, const char *key, gguf_type_t elem_type, const gguf_kv_t **out)
{
    const gguf_kv_t *kv;
    int e = find_typed(g, key, &kv);
    if (e)
        return e;
    int ok = kv->type == GGUF_TYPE_ARRAY &&
             (kv->arr_type == elem_type ||
              (is_int_type(elem_type) && is_int_type(kv->arr_type)) ||
              (elem_type == GGUF_TYPE_FLOAT32 &&
               (kv->arr_type == GGUF_TYPE_FLOAT64 || is_int_type(kv->arr_type))));
    if (!ok) {
        char want[48];
        snprintf(want, sizeof want, "an array of %s", gguf_type_name(elem_type));
        return wrong_type(g, kv, want);
    }
    *out = kv;
    return 0;
}

int64_t gguf_arr_int(const gguf_kv_t *kv, uint64_t i)
{
    int ok = 1;
    return int_at(kv->arr_type, kv->data + i * gguf_type_bytes[kv->arr_type], &ok);
}

double gguf_arr_float(const gguf_kv_t *kv, uint64_t i)
{
    return float_at(kv->arr_type, kv->data + i * gguf_type_bytes[kv->arr_type]);
}

const char *gguf_arr_str(const gguf_kv_t *kv, uint64_t i, size_t *len)
{
    const unsigned char *p = kv->data + kv->str_off[i];
    *len = (size_t)rd_le(p, 8);
    return (const char *)p + 8;
}
