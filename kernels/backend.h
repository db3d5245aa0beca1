/* Opening a backend by device name, and what every caller asks of one without knowing
 * which it is.
 *
 * A device name is "cpu", "cuda" (GPU 0), "cuda:N", or "opaque": the test backend of
 * kernels/opaque/opaque.h, which proves on the CPU that nothing touches device memory. This
 * is the one place that turns a name into a backend (the table of kernels/backend.c): the
 * engine, the workers and the tools hold a backend_t and ask it (backend_info) whether its
 * memory is host memory, how many threads it runs, and so on; nothing compares backend
 * names. */
#ifndef RIVER_KERNELS_BACKEND_H
#define RIVER_KERNELS_BACKEND_H

#include "kernels/ops.h"

typedef enum {
    BACKEND_KIND_CPU = 0,
    BACKEND_KIND_CUDA,
    BACKEND_KIND_OPAQUE, /* the CPU behind addresses nobody may dereference (tests) */
} backend_kind_t;

/* Parses a device name. RIVER_EINVAL (with a detail naming the name and the accepted forms)
 * for anything else; RIVER_EUNSUPPORTED for "cuda" in a build without the CUDA backend.
 * index is the GPU for cuda, 0 for cpu. */
int backend_parse_device(const char *device, backend_kind_t *kind, int *index);

/* Every form a device name takes, as a list for messages: "cpu, cuda, cuda:N or opaque"
 * (the kinds a build lacks included, since backend_parse_device knows them). Static. */
const char *backend_device_forms(void);

/* What placement (ops->weight_upload) may do with a host backend's weights. */
typedef enum {
    BACKEND_WEIGHTS_COPY = 0, /* copy large matrices into memory read faster (huge pages) */
    BACKEND_WEIGHTS_MAPPED,   /* read them in the mapped checkpoint, whose pages
                                 weight_residency can release (backbone offloading) */
} backend_weights_t;

/* Opens the backend a device name names: the CPU with n_threads threads (0: one per core)
 * at the best SIMD level the processor has (or the one RIVER_SIMD asks for), or a GPU
 * (which copies every weight to the device whatever `weights` says). On failure *out is
 * untouched. */
int backend_open(backend_t **out, const char *device, int n_threads,
                 backend_weights_t weights);

/* Frees any backend (through its own destroy) and sets *be to NULL; NULL is fine. */
void backend_destroy(backend_t **be);

void backend_get_info(const backend_t *be, backend_info_t *out);
/* Whether the backend's buffers and weights are host memory (backend_info.host_memory). */
int backend_is_host(const backend_t *be);
/* Whether the device failed for good (backend_info.lost). */
int backend_is_lost(const backend_t *be);
/* Bytes its buffers can still take, read now (ops->mem_free); 0 where it cannot tell. */
int64_t backend_mem_free(const backend_t *be);
/* The host threads its ops run on. */
int backend_threads(const backend_t *be);
/* "name-variant", e.g. "cpu-avx512": two processes whose results must agree bit for bit
 * (the split pair) compare these. Written to buf (cap bytes); returns buf. */
const char *backend_describe(const backend_t *be, char *buf, size_t cap);

/* The peer hand-off of two processes of one host, each on its own device (the split pair's
 * hidden states, ops->peer_*): rank 0 makes an id (backend_peer_id) and sends it to rank 1
 * by its own means; both open the link with it. A backend without one (the CPU, the opaque
 * backend) answers RIVER_EUNSUPPORTED, naming itself, and nothing changes. */
int backend_peer_id(backend_t *be, unsigned char id[OPS_PEER_ID_BYTES]);
/* Joins the link of that id as `rank` (0 or 1) and waits until the other rank has joined
 * too. On failure *out is untouched. */
int backend_peer_open(backend_t *be, ops_peer_t **out,
                      const unsigned char id[OPS_PEER_ID_BYTES], int rank);
/* Closes *peer and sets it to NULL; NULL is fine. */
void backend_peer_close(backend_t *be, ops_peer_t **peer);
/* Sends n floats of backend buffer buf to the other rank, ordered after the backend's own
 * queued work only if the caller synced it (ops->sync); buf must stay unchanged until the
 * next backend_peer_recv. */
int backend_peer_send(backend_t *be, ops_peer_t *peer, const void *buf, size_t n);
/* Receives n floats from the other rank into backend buffer buf and waits for them. */
int backend_peer_recv(backend_t *be, ops_peer_t *peer, void *buf, size_t n);

#endif
