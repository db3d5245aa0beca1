/* Shared between the loader's files (model.c, hfconfig.c, llama2c.c); not public. */
#ifndef RIVER_MODEL_MODEL_INTERNAL_H
#define RIVER_MODEL_MODEL_INTERNAL_H

#include "model/model.h"
#include "model/safetensors.h"

/* Everything the weights of a model point at: the mapped checkpoint files and the owned
 * float32 copies of its vectors. */
struct model_mapping {
    safetensors_t **files; /* (n_files) mapped safetensors shards */
    int n_files;
    void *bin;             /* a mapped llama2.c .bin, or NULL */
    struct gguf *gguf;     /* an opened GGUF file (common/gguf.h), or NULL */
    size_t bin_size;
    void **owned;          /* (n_owned) malloc'd blocks freed with the model */
    int n_owned;
    int cap_owned;
};

/* Reads a Hugging Face config.json into cfg (dtype left for the weights to decide), falling
 * back to generation_config.json in the same directory for missing bos/eos ids. On failure
 * cfg holds nothing that needs freeing. */
int hfconfig_load(model_config_t *cfg, const char *config_path);

/* Frees what a config owns (the longrope factor arrays). */
void hfconfig_free(model_config_t *cfg);

/* Loads a llama2.c v0 .bin into m (m->path and m->dir already set, m->map allocated). */
int llama2c_load(model_t *m, const char *path);

/* Loads a GGUF file into m (m->path and m->dir already set, m->map allocated); what it
 * maps or allocates hangs off m->map, so model_destroy frees it on failure too. */
int gguf_model_load(model_t *m, const char *path);

/* Hands a malloc'd block to the mapping, which frees it with the model. On failure the
 * block is freed at once. */
int model_mapping_own(model_mapping_t *map, void *p);

#endif
