/* The opaque backend: the CPU kernels behind addresses that the code above the op interface
 * cannot dereference.
 *
 * A GPU backend hands the engine device pointers; code that reads or writes one on the host
 * (a missing upload, a host-side shortcut) crashes there or reads garbage, and nobody here
 * has a GPU to find out. This backend gives the same guarantee on the CPU: every buffer,
 * KV page and placed weight lives in an arena the backend maps twice, once readable (where
 * the kernels work) and once as a reserved range with no access at all, and the caller only
 * ever sees addresses in the second one. Dereferencing one is a segmentation fault at the
 * line that did it; pointer arithmetic on them works, since the two mappings are one
 * constant apart, which is also how each op turns its arguments back into memory the CPU
 * kernels can use.
 *
 * Each op also refuses what a device backend could not read: a weight that was not placed
 * (ops->weight_upload) or a buffer that it did not allocate is RIVER_EDEVICE, naming the op.
 * Host inputs by contract (positions, page tables, validity maps, RoPE frequencies, index
 * lists, to_host destinations, cosine results) stay host memory.
 *
 * Freed buffers are never reused and their pages are returned to the system, so a use after
 * free reads zeros in the kernels and crashes on the host. The arena is virtual address space
 * reserved at creation (OPAQUE_ARENA_BYTES, without committing memory); running out of it is
 * RIVER_ENOMEM. Device name: "opaque" (kernels/backend.h), for tests. */
#ifndef RIVER_KERNELS_OPAQUE_H
#define RIVER_KERNELS_OPAQUE_H

#include "kernels/cpu/cpu.h"
#include "kernels/ops.h"

/* Address space reserved for buffers and weights: room for test models and their KV. */
#define OPAQUE_ARENA_BYTES ((size_t)64 << 30)

/* backend_info.uuid of every opaque backend: all of them are one device. */
#define OPAQUE_DEVICE_UUID "opaque-0"

/* A backend over a CPU backend of n_threads threads (0: one per core) at SIMD level simd
 * (as cpu_backend_new takes it). On failure *out is untouched. */
int opaque_backend_new(backend_t **out, int n_threads, cpu_simd_t simd);
void opaque_backend_destroy(backend_t **b);

#endif
