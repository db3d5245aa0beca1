/* Random-weight checkpoints with the exact shapes of real models, for benchmarks and for
 * cross-checking architectures without downloading anything.
 *
 * synth_write puts a Hugging Face directory (config.json + model.safetensors, or shards
 * model-0000i-of-0000n.safetensors + model.safetensors.index.json) in out_dir. Matrices and
 * biases are approximately normal with std 0.02 (a sum of four uniforms: exact mean and
 * variance, tails cut at 3.5 std), norm weights are 1 + the same noise, so activations stay
 * in a sane range. Every tensor's values depend only on the seed and the tensor's name, so
 * sharded and unsharded outputs of one seed hold identical tensors. Generation streams: the
 * memory used is a few buffers, whatever the model size. */
#ifndef RIVER_OFFLINE_SYNTH_H
#define RIVER_OFFLINE_SYNTH_H

#include <stdint.h>

#include "kernels/ops.h"

typedef struct synth_opts {
    const char *shape;    /* one of synth_shape_name() */
    dtype_t dtype;        /* DTYPE_F32, DTYPE_F16 or DTYPE_BF16 */
    const char *out_dir;  /* created if missing (its parent must exist) */
    uint64_t seed;
    uint64_t shard_bytes; /* largest shard's tensor data; 0: SYNTH_DEFAULT_SHARD_BYTES */
    int progress;         /* print progress lines to stderr */
} synth_opts_t;

#define SYNTH_DEFAULT_SHARD_BYTES (UINT64_C(4) << 30)

/* The i-th known shape name, NULL past the last. */
const char *synth_shape_name(int i);

/* Writes the checkpoint. Errors: RIVER_ENOTFOUND (unknown shape), RIVER_EDTYPE,
 * RIVER_EIO / RIVER_ESYS (writing failed; no half-written .safetensors is left). */
int synth_write(const synth_opts_t *o);

/* Bytes of tensor data the shape takes in dtype (for progress and tests); -1 if unknown. */
int64_t synth_data_bytes(const char *shape, dtype_t dtype);

#endif
