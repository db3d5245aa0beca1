/* Whole-file reads shared by the tools and loaders that parse text (tokenizer.json,
 * prompts, calibration text). Large binary files are mapped instead (model/safetensors.c). */
#ifndef RIVER_COMMON_FILE_H
#define RIVER_COMMON_FILE_H

#include <stddef.h>

/* Reads the regular file at path into a malloc'd buffer with a NUL after its len bytes.
 * Errors name the file: RIVER_ENOTFOUND, RIVER_EINVAL (not a regular file), RIVER_EIO,
 * RIVER_ENOMEM; *data is then NULL. */
int river_read_file(const char *path, char **data, size_t *len);

#endif
