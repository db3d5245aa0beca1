/* Opening an engine: the model, its tokenizer and the backend it runs on, with every weight
 * placed where that backend reads it. The `river` tool's commands and river-worker open
 * theirs the same way; the Exit River and routers come after (engine/exit_setup.h), and
 * land on the same backend because the model is placed (model_place).
 *
 * Device names: "cpu" (the default), "cuda" or "cuda:N" (kernels/backend.h). */
#ifndef RIVER_ENGINE_ENGINE_OPEN_H
#define RIVER_ENGINE_ENGINE_OPEN_H

#include <stddef.h>

#include "model/model.h"
#include "text/tokenizer.h"
#include "kernels/backend.h"
#include "kernels/ops.h"

typedef struct engine_opts {
    const char *model;     /* checkpoint directory, its config.json, or a llama2.c .bin */
    const char *tokenizer; /* NULL: found beside the model (engine_find_tokenizer) */
    int want_tokenizer;    /* 0: no tokenizer is opened */
    const char *device;    /* NULL: "cpu" */
    int threads;           /* host threads; 0: one for a model that fits the caches, else
                              one per core */
    /* Layers to place on the backend (model_place_layers); both 0: the whole model. */
    int place_begin, place_end;
    int place_no_ends;     /* leave the embedding, final norm and heads unplaced */
    backend_weights_t weights; /* host weights: copied into huge pages (the default) or
                                  kept in the mapped checkpoint (kernels/backend.h) */
} engine_opts_t;

/* What an opened engine holds. The fields are the caller's to use, engine_close's to free. */
typedef struct engine_env {
    model_t *model;
    tokenizer_t *tok; /* NULL when not wanted */
    backend_t *be;
} engine_env_t;

/* Opens and places everything opts names. On failure nothing stays open and *env is
 * zeroed. Errors: those of model_load, tokenizer_load, backend_open and model_place. */
int engine_open(engine_env_t *env, const engine_opts_t *opts);
/* Closes what engine_open opened (the backend before the model: it owns the device copies
 * the model points at); safe on a zeroed or closed env. */
void engine_close(engine_env_t *env);

/* The tokenizer file of a model path: the GGUF file itself, tokenizer.json in its directory,
 * or the one tok*.bin beside a llama2.c file. Written to buf; RIVER_ENOTFOUND otherwise. */
int engine_find_tokenizer(const char *model_path, char *buf, size_t cap);

#endif
