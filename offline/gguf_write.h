/* A GGUF v3 writer: metadata key/values and tensors gathered in memory, then written in one
 * pass (header, key/values, tensor infos, padding to the alignment of 32, the data section
 * with each tensor at a multiple of 32). The file is written to PATH.tmp and renamed, so a
 * failed write leaves no partial file behind.
 *
 * Failures return a river_err code with a detail naming the key or tensor: RIVER_EINVAL
 * (a duplicate key or tensor name, a bad shape, a row that is not whole blocks),
 * RIVER_EDTYPE (an unknown tensor type), RIVER_ENOMEM, RIVER_EIO / RIVER_ESYS (writing).
 * A failed call leaves the writer as it was. */
#ifndef RIVER_OFFLINE_GGUF_WRITE_H
#define RIVER_OFFLINE_GGUF_WRITE_H

#include <stddef.h>
#include <stdint.h>

#include "common/gguf.h"

typedef struct gguf_writer gguf_writer_t;

int gguf_writer_new(gguf_writer_t **out);
void gguf_writer_destroy(gguf_writer_t **w);

int gguf_writer_set_u32(gguf_writer_t *w, const char *key, uint32_t v);
int gguf_writer_set_i32(gguf_writer_t *w, const char *key, int32_t v);
int gguf_writer_set_f32(gguf_writer_t *w, const char *key, float v);
int gguf_writer_set_bool(gguf_writer_t *w, const char *key, int v);
int gguf_writer_set_str(gguf_writer_t *w, const char *key, const char *s);
/* A scalar of any fixed-size type (not string, not array) from its host bytes at v. */
int gguf_writer_set_scalar(gguf_writer_t *w, const char *key, gguf_type_t type, const void *v);
int gguf_writer_set_strn(gguf_writer_t *w, const char *key, const char *s, size_t len);
/* An array of n fixed-size elements of elem_type (not string, not array), copied. */
int gguf_writer_set_arr(gguf_writer_t *w, const char *key, gguf_type_t elem_type,
                        const void *elems, uint64_t n);
/* An array of n strings; lens may be NULL for NUL-terminated strings. Copied. */
int gguf_writer_set_arr_str(gguf_writer_t *w, const char *key, const char *const *strs,
                            const size_t *lens, uint64_t n);

/* A tensor of ggml type `type` with n_dims dimensions ne (ne[0] contiguous). data is a
 * malloc'd block of exactly the type's bytes for that shape, which the writer takes over
 * (and frees on failure too). */
int gguf_writer_add_tensor(gguf_writer_t *w, const char *name, int type, int n_dims,
                           const int64_t *ne, void *data, size_t size);

int gguf_writer_write(gguf_writer_t *w, const char *path);

#endif
