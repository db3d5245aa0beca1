/* Building the Exit River file (engine/exitriver.h describes it) from a model: `river quant`
 * quantizes the decoder layers from the start layer on and writes them in one pass. */
#ifndef RIVER_OFFLINE_EXITRIVER_BUILD_H
#define RIVER_OFFLINE_EXITRIVER_BUILD_H

#include "engine/exitriver.h"
#include "model/model.h"
#include "offline/quant.h"

/* Called after each layer is quantized and written: its error sums and the seconds it took. */
typedef void (*exitriver_progress_fn)(void *arg, int layer, const quant_stats_t *stats,
                                      double seconds);

typedef struct exitriver_build_opts {
    quant_params_t quant;
    int start_layer;             /* first layer of the river, 0..n_layers-1 */
    int head_bits;               /* 0: exited tokens use the backbone's LM head; 2, 3, 4 or 8: the
                                    river carries its own quantized copy of the head, so a
                                    token that exited reads no full-precision weight at all */
    int n_threads;               /* 0: one per online core */
    exitriver_progress_fn progress;  /* may be NULL */
    void *progress_arg;
} exitriver_build_opts_t;

/* Default quantization (quant_params_default), start EXITRIVER_DEFAULT_START_LAYER, all
 * cores. */
exitriver_build_opts_t exitriver_build_opts_default(void);

/* The largest group size up to `most` that divides the columns of every matrix the river
 * quantizes (layers o->start_layer.., the LM head too when o->head_bits), even for 4 bits
 * (two codes share a byte), a multiple of 16 for 2 and 3 bits; 0 when none does. */
int exitriver_group_fit(const model_t *m, const exitriver_build_opts_t *o, int most);

/* Quantizes layers start_layer.. of m and writes the river to path (through "<path>.part",
 * renamed when complete). total, when not NULL, receives the error sums of all layers.
 * Every matrix is checked (dtype, group divides its columns) before anything is written. */
int exitriver_build(const model_t *m, const char *path, const exitriver_build_opts_t *o,
                    quant_stats_t *total);

#endif
