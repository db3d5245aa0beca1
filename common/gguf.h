/* GGUF (llama.cpp's model container, versions 2 and 3) read from a mapped file or a buffer:
 * the header, every metadata key/value (the twelve scalar types, strings and arrays of
 * them), the tensor infos, general.alignment and the data section.
 *
 * Every length and count is checked against the bytes that are left before it is used, so
 * a hostile file cannot make the reader allocate or read past the end. Failures return a
 * river_err code with a detail naming the file and the key or tensor at fault:
 *   RIVER_ETRUNC   the file ends inside the header, a key, a value, a tensor info, or a
 *                  tensor's data runs past the end of the file
 *   RIVER_EFORMAT  bad magic, duplicate key or tensor name, a count or size that overflows,
 *                  a misaligned tensor offset, a bad dimension
 *   RIVER_EDTYPE   an unknown metadata value type or tensor type, or general.alignment that
 *                  is not a uint32
 *   RIVER_EUNSUPPORTED  a version other than 2 or 3, or an array of arrays
 * On failure nothing stays allocated or mapped. The gateway links this (common/) to read a
 * GGUF's chat template without the engine. */
#ifndef RIVER_COMMON_GGUF_H
#define RIVER_COMMON_GGUF_H

#include <stddef.h>
#include <stdint.h>

#define GGUF_MAGIC "GGUF"
#define GGUF_DEFAULT_ALIGNMENT 32
#define GGUF_MAX_DIMS 4

/* Metadata value types, numbered as the file stores them. */
typedef enum {
    GGUF_TYPE_UINT8 = 0,
    GGUF_TYPE_INT8 = 1,
    GGUF_TYPE_UINT16 = 2,
    GGUF_TYPE_INT16 = 3,
    GGUF_TYPE_UINT32 = 4,
    GGUF_TYPE_INT32 = 5,
    GGUF_TYPE_FLOAT32 = 6,
    GGUF_TYPE_BOOL = 7,
    GGUF_TYPE_STRING = 8,
    GGUF_TYPE_ARRAY = 9,
    GGUF_TYPE_UINT64 = 10,
    GGUF_TYPE_INT64 = 11,
    GGUF_TYPE_FLOAT64 = 12,
    GGUF_TYPE_COUNT
} gguf_type_t;

/* Tensor types (ggml_type), numbered as the file stores them. The reader knows the block
 * size of each listed here; any other number is RIVER_EDTYPE. */
typedef enum {
    GGML_TYPE_F32 = 0,
    GGML_TYPE_F16 = 1,
    GGML_TYPE_Q4_0 = 2,
    GGML_TYPE_Q4_1 = 3,
    GGML_TYPE_Q5_0 = 6,
    GGML_TYPE_Q5_1 = 7,
    GGML_TYPE_Q8_0 = 8,
    GGML_TYPE_Q8_1 = 9,
    GGML_TYPE_Q2_K = 10,
    GGML_TYPE_Q3_K = 11,
    GGML_TYPE_Q4_K = 12,
    GGML_TYPE_Q5_K = 13,
    GGML_TYPE_Q6_K = 14,
    GGML_TYPE_Q8_K = 15,
    GGML_TYPE_I8 = 24,
    GGML_TYPE_I16 = 25,
    GGML_TYPE_I32 = 26,
    GGML_TYPE_I64 = 27,
    GGML_TYPE_F64 = 28,
    GGML_TYPE_BF16 = 30,
} ggml_type_t;

/* Elements per block and bytes per block of a tensor type; 0 for an unknown type. */
int ggml_type_block(int type);
size_t ggml_type_block_bytes(int type);
/* "Q4_K"; "?" for an unknown type. */
const char *ggml_type_name(int type);
/* The type of that name (case-insensitive), or -1. */
int ggml_type_from_name(const char *name);
const char *gguf_type_name(int type);

/* One metadata key/value. Strings point into the file's bytes and are not NUL-terminated. */
typedef struct gguf_kv {
    char *key;               /* NUL-terminated copy */
    gguf_type_t type;        /* of the value */
    gguf_type_t arr_type;    /* of the elements when type is GGUF_TYPE_ARRAY */
    uint64_t n;              /* elements: 1 for a scalar or a string, the count of an array */
    const unsigned char *data; /* the value (a string's length prefix for strings, the first
                                  element of an array); elements are little-endian, unaligned */
    uint64_t *str_off;       /* (n) string arrays: offset of element i's record from data */
} gguf_kv_t;

typedef struct gguf_tensor {
    char *name;              /* NUL-terminated copy */
    int n_dims;              /* 1..GGUF_MAX_DIMS */
    int64_t ne[GGUF_MAX_DIMS]; /* elements per dimension, ne[0] the contiguous one; 1 past
                                  n_dims */
    int type;                /* ggml_type_t */
    uint64_t offset;         /* from the start of the data section, a multiple of alignment */
    uint64_t size;           /* bytes */
    const void *data;        /* the tensor's bytes in the mapping */
} gguf_tensor_t;

typedef struct gguf {
    char *path;              /* for messages: the file, or the name given to gguf_open_mem */
    uint32_t version;
    uint64_t n_kv;
    gguf_kv_t *kv;           /* (n_kv) in file order */
    uint64_t n_tensors;
    gguf_tensor_t *tensors;  /* (n_tensors) in file order */
    uint32_t alignment;      /* general.alignment, or 32 */
    uint64_t data_offset;    /* start of the data section, bytes from the start of the file */
    const unsigned char *base; /* the whole file */
    size_t size;             /* bytes */
    int mapped;              /* whether base is our mmap */
    uint64_t *by_name;       /* (n_tensors) tensor indices sorted by name */
} gguf_t;

/* Maps and parses the file at path. RIVER_ENOTFOUND when it does not exist. */
int gguf_open(gguf_t **out, const char *path);
/* Parses size bytes at data, which must outlive the result; name is for messages. */
int gguf_open_mem(gguf_t **out, const void *data, size_t size, const char *name);
void gguf_destroy(gguf_t **g);

/* Whether the first bytes (at least 4) are the GGUF magic. */
int gguf_is_magic(const void *head, size_t len);
/* Whether path names a GGUF file: ends in .gguf, or starts with the magic. Never fails. */
int gguf_path_is_gguf(const char *path);

/* Lookups; NULL when absent (no error detail). */
const gguf_kv_t *gguf_find_kv(const gguf_t *g, const char *key);
const gguf_tensor_t *gguf_find_tensor(const gguf_t *g, const char *name);

/* Typed reads of a key. Absent: RIVER_ENOTFOUND; a value of another type: RIVER_EDTYPE; an
 * integer out of the range asked for: RIVER_ERANGE. Each names the key. *out is untouched on
 * failure, so a caller can preset a default and ignore RIVER_ENOTFOUND. The integer reads
 * take any integer type (and bool), the float reads any float or integer type. */
int gguf_get_i64(const gguf_t *g, const char *key, int64_t *out);
int gguf_get_int(const gguf_t *g, const char *key, int *out);
int gguf_get_f32(const gguf_t *g, const char *key, float *out);
int gguf_get_bool(const gguf_t *g, const char *key, int *out);
/* A string value, not NUL-terminated, pointing into the file. */
int gguf_get_str(const gguf_t *g, const char *key, const char **s, size_t *len);
/* A malloc'd NUL-terminated copy of a string value. */
int gguf_get_strdup(const gguf_t *g, const char *key, char **out);
/* An array of elem_type (for integers: any integer element type is accepted by
 * gguf_arr_int): its count. */
int gguf_get_arr(const gguf_t *g, const char *key, gguf_type_t elem_type, const gguf_kv_t **kv);

/* Elements of an array kv (the index must be below kv->n). */
int64_t gguf_arr_int(const gguf_kv_t *kv, uint64_t i);
double gguf_arr_float(const gguf_kv_t *kv, uint64_t i);
const char *gguf_arr_str(const gguf_kv_t *kv, uint64_t i, size_t *len);

#endif
