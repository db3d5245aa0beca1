/* A small reader and writer for the safetensors format.
 *
 * A file is an 8-byte little-endian header length N, N bytes of JSON, then the data area.
 * The JSON object maps each tensor name to {"dtype", "shape", "data_offsets": [begin, end]}
 * (offsets relative to the data area) and may hold a "__metadata__" object of strings.
 *
 * The reader maps the file read-only and validates the whole header before handing out
 * anything: the header lies within the file, every tensor's byte range lies within the data
 * area, matches its shape times its element size (for dtypes whose size is known), and
 * overlaps no other tensor. Tensor data pointers point into the mapping and stay valid until
 * safetensors_destroy. Errors name the file.
 *
 * The writer streams: declare every tensor first (name, dtype, shape), then write their
 * bytes in the order declared. The file is written under "<path>.part" and renamed to
 * `path` only when complete, so an interrupted writer never leaves a loadable half file. */
#ifndef RIVER_MODEL_SAFETENSORS_H
#define RIVER_MODEL_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/ops.h"

typedef enum {
    SAFETENSORS_F64 = 0,
    SAFETENSORS_F32,
    SAFETENSORS_F16,
    SAFETENSORS_BF16,
    SAFETENSORS_F8_E4M3,
    SAFETENSORS_F8_E5M2,
    SAFETENSORS_I64,
    SAFETENSORS_I32,
    SAFETENSORS_I16,
    SAFETENSORS_I8,
    SAFETENSORS_U64,
    SAFETENSORS_U32,
    SAFETENSORS_U16,
    SAFETENSORS_U8,
    SAFETENSORS_BOOL,
    SAFETENSORS_UNKNOWN, /* a dtype string this reader does not know; size unchecked */
} safetensors_dtype_t;

#define SAFETENSORS_MAX_DIMS 8

typedef struct safetensors_tensor {
    const char *name;
    safetensors_dtype_t dtype;
    const char *dtype_str;              /* as written in the header */
    int n_dims;
    int64_t shape[SAFETENSORS_MAX_DIMS]; /* (n_dims) */
    int64_t numel;                      /* product of the shape (1 for a scalar) */
    const void *data;                   /* nbytes bytes inside the mapping */
    size_t nbytes;
    uint64_t file_offset;               /* where data starts in the file */
} safetensors_tensor_t;

typedef struct safetensors safetensors_t;

/* Maps and validates `path`. Errors: RIVER_ENOTFOUND (no such file), RIVER_ETRUNC (shorter
 * than its header says), RIVER_EFORMAT (bad header or byte ranges), RIVER_ESYS. */
int safetensors_open(safetensors_t **out, const char *path);
void safetensors_destroy(safetensors_t **f);

const char *safetensors_path(const safetensors_t *f);
/* Tensors, sorted by name. */
size_t safetensors_count(const safetensors_t *f);
const safetensors_tensor_t *safetensors_tensor_at(const safetensors_t *f, size_t i);
/* The tensor called `name`, or NULL. */
const safetensors_tensor_t *safetensors_find(const safetensors_t *f, const char *name);
/* A string value of "__metadata__", or NULL. */
const char *safetensors_metadata(const safetensors_t *f, const char *key);

/* The header's spelling of a dtype ("BF16"), its element size (0 when unknown), and the
 * inverse of the spelling (SAFETENSORS_UNKNOWN when not recognised). */
const char *safetensors_dtype_name(safetensors_dtype_t dt);
size_t safetensors_dtype_size(safetensors_dtype_t dt);
safetensors_dtype_t safetensors_dtype_parse(const char *s);
/* The weight dtype of a float tensor: 0 and *out set for F32/F16/BF16, -1 otherwise. */
int safetensors_dtype_to_weight(safetensors_dtype_t dt, dtype_t *out);
/* The safetensors dtype that stores a weight dtype (F32/F16/BF16), else SAFETENSORS_UNKNOWN. */
safetensors_dtype_t safetensors_dtype_from_weight(dtype_t dt);

typedef struct safetensors_writer safetensors_writer_t;

int safetensors_writer_new(safetensors_writer_t **out, const char *path);
/* Declares the next tensor; only before safetensors_writer_begin. */
int safetensors_writer_add(safetensors_writer_t *w, const char *name, safetensors_dtype_t dt,
                           int n_dims, const int64_t *shape);
/* Adds a "__metadata__" string entry; only before safetensors_writer_begin. */
int safetensors_writer_set_metadata(safetensors_writer_t *w, const char *key,
                                    const char *value);
/* Writes the header (padded so that the data area starts 8-byte aligned). */
int safetensors_writer_begin(safetensors_writer_t *w);
/* Appends raw tensor bytes, in declaration order; writing past the declared total fails. */
int safetensors_writer_write(safetensors_writer_t *w, const void *data, size_t n);
/* Checks that every declared byte was written, closes the file and renames it into place. */
int safetensors_writer_finish(safetensors_writer_t *w);
/* Frees the writer; an unfinished file is removed. */
void safetensors_writer_destroy(safetensors_writer_t **w);
/* Bytes of tensor data declared so far. */
uint64_t safetensors_writer_data_size(const safetensors_writer_t *w);

#endif
