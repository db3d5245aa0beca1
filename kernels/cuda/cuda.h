/* The CUDA backend: the ops of kernels/ops.h on one NVIDIA GPU, with the CPU backend as the
 * reference it must agree with (tests/test_backend_ops.c runs every op case on both).
 *
 * Notes on the ops as implemented here:
 * - Activations are f32 in device memory (parity with the CPU first; bf16 activations may
 *   come later). buf_alloc returns device pointers; the model code never dereferences them.
 * - Weights must be in device memory: cuda_backend_upload replaces the host pointers of a
 *   weight_t (the mmap'd checkpoint) with device copies (also ops->weight_upload, which
 *   engine/model_place.c calls for a whole model). The backend owns those copies and frees
 *   them in cuda_backend_destroy, so a model uploaded to a backend must not be used after
 *   the backend is destroyed, nor
 *   with another backend (its weight_t now point at this GPU's memory).
 * - All work is queued on one stream of the backend; ops that return host data (to_host,
 *   cosine) wait for it. Host inputs of an op (positions, page tables, indices, inv_freq)
 *   are packed and matched against a few upload slots (pinned staging, one asynchronous
 *   copy on a miss): the inputs of a step are uploaded once per step and row group, the
 *   RoPE frequencies once. The match is on content, so the caller may change or reuse its
 *   arrays at once. Scratch memory grows geometrically and is kept.
 * - With RIVER_CUDA_GRAPHS=1, ops->graph_begin/graph_end capture the backbone layers of a
 *   plain step (no exits, hooks or remote) into a CUDA graph that is updated in place and
 *   relaunched while the step's shape repeats, instantiated anew when it changes, and left
 *   off for a while when it keeps changing.
 * - matmul: for n <= 8 rows, BF16/F16 weights and Q4 in groups of 32k take a
 *   bandwidth-bound GEMV kernel of four output features a warp (all their 16-byte loads in
 *   flight before any is used; one instance for n = 1; split-K with a deterministic sum for
 *   short, wide matrices), F32 and other Q4/Q8 weights one of a feature a warp. Above 8
 *   rows F32/F16/BF16 weights go to cuBLAS (GemmEx, f32 compute; x converted to the
 *   weight's 16-bit type) and Q4/Q8 weights to a dequantize-in-register GEMV kernel, 8 rows
 *   per pass (Q4 with groups of 32k: 16 bytes per lane).
 * - attention: flash-decoding. One block per (KV head, context split, row) serves all the
 *   query heads of its KV head with an online softmax; a reduce kernel merges the splits
 *   where a decode batch needed several to fill the device. Any context length works
 *   without a scores buffer; head_dim at most 256. kv_valid is honoured.
 * - Every CUDA and cuBLAS failure becomes RIVER_EDEVICE with the CUDA error string; no op
 *   aborts the process.
 *
 * Without the toolkit (make CUDA=0, or no nvcc) none of this is built: RIVER_CUDA is then
 * undefined and code that uses this header must guard its calls with #ifdef RIVER_CUDA. */
#ifndef RIVER_KERNELS_CUDA_H
#define RIVER_KERNELS_CUDA_H

#include "kernels/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* GPUs the CUDA runtime sees; 0 when there is no driver or no GPU (never an error). */
int cuda_device_count(void);

/* Creates a backend on GPU `device` (0-based). Without a usable device: RIVER_EDEVICE with
 * "no CUDA device: <CUDA error string>". On failure *out is untouched. */
int cuda_backend_new(backend_t **out, int device);
/* Frees the backend, its scratch and every weight it uploaded; sets *b to NULL. */
void cuda_backend_destroy(backend_t **b);

/* Copies w's data (and Q4/Q8 scales and zeros) to the device and points w at the copies.
 * The backend owns them (freed at destroy). A weight whose data is NULL (an absent bias)
 * is left alone. On failure w is unchanged. */
int cuda_backend_upload(backend_t *b, weight_t *w);

/* Name of the GPU the backend runs on (for bench output); "" when unknown. */
const char *cuda_backend_device_name(const backend_t *b);

/* Seconds per device-to-device copy of `bytes` (two buffers of that size, reps copies
 * timed with CUDA events after one warm-up): the bandwidth every kernel's GB/s is held
 * against in river-cuda-bench. */
int cuda_backend_time_copy(backend_t *b, size_t bytes, int reps, double *secs);

/* Host inputs uploaded through the upload slots so far (misses; a hit uploads nothing). */
uint64_t cuda_backend_uploads(const backend_t *b);

/* Steps launched as CUDA graphs so far (RIVER_CUDA_GRAPHS=1: ops->graph_begin captures a
 * plain decode step's backbone layers; 0 when graphs are off). */
uint64_t cuda_backend_graph_launches(const backend_t *b);

#ifdef __cplusplus
}
#endif

#endif
