/* The op interface: every piece of model math the engine needs, as a table of function
 * pointers that a backend fills in. The model code in engine/ is written once against this
 * table; kernels/cpu/ is the reference backend and a CUDA backend fills the same table.
 *
 * Conventions
 * - Activation buffers are `void *` in the backend's activation type (f32 on the CPU) and
 *   are allocated with ops->buf_alloc, so the model code never dereferences them; results
 *   reach the host through ops->to_host.
 * - Matrices follow the PyTorch Linear layout: a weight of `rows` outputs and `cols` inputs
 *   is stored row-major (rows, cols); y = x W^T.
 * - A batch is n rows (tokens); row i of an (n, d) buffer starts at element i*d.
 * - Every op returns 0 or a negative river_err code; on failure the output buffers hold
 *   unspecified values and nothing else changes.
 */
#ifndef RIVER_KERNELS_OPS_H
#define RIVER_KERNELS_OPS_H

#include <stddef.h>
#include <stdint.h>

typedef enum {
    DTYPE_F32 = 0,
    DTYPE_F16,
    DTYPE_BF16,
    DTYPE_Q4, /* 4-bit affine groups: data is (rows, cols/2) bytes, low nibble first */
    DTYPE_Q8, /* 8-bit affine groups: data is (rows, cols) bytes */
    DTYPE_Q4X8, /* Q4 with its codes repacked by the CPU backend for its integer kernels
                   (kernels/cpu/q4x8.h); same size, scales and zeros as Q4; never in a file */
    DTYPE_Q8X8, /* Q8 with its codes repacked by the CPU backend for its integer kernels
                   (kernels/cpu/q4x8.h); same size, scales and zeros as Q8; never in a file */
    DTYPE_Q2, /* 2-bit affine groups: data is (rows, cols/4) bytes, code k of a row in bits
                 2*(k%4)..2*(k%4)+1 of byte k/4 (docs/FORMATS.md) */
    DTYPE_Q3, /* 3-bit affine groups: each row is a 2-bit plane of (cols/4) bytes holding the
                 low two bits of every code as Q2 does, then a 1-bit plane of (cols/8) bytes
                 holding bit 2 of code k in bit k%8 of byte k/8 (docs/FORMATS.md) */
    DTYPE_BF16X8, /* BF16 with its rows blocked by the CPU backend for its decode kernels
                     (kernels/cpu/rowblock.h); same bytes, elsewhere; never in a file */
    DTYPE_F16X8,  /* the same for F16 */
    DTYPE_COUNT
} dtype_t;

/* Bytes of one element; 0 for the packed types (use dtype_row_bytes). */
size_t dtype_size(dtype_t dt);
/* Bytes of one row of `cols` elements, packing included. */
size_t dtype_row_bytes(dtype_t dt, int64_t cols);
const char *dtype_name(dtype_t dt);
/* Whether dt is one of the affine-group types (Q2, Q3, Q4, Q4X8, Q8): scales, zeros and a
 * group. */
int dtype_is_quant(dtype_t dt);
/* Bits of one code of an affine-group type (2, 3, 4 or 8), 0 for the others. */
int dtype_quant_bits(dtype_t dt);
/* The file dtype of codes of `bits` bits (2: Q2, 3: Q3, 4: Q4, 8: Q8); DTYPE_COUNT for
 * other widths. */
dtype_t dtype_quant_of_bits(int bits);

/* A weight matrix or vector, resident where its backend can read it (on the CPU: the mmap'd
 * checkpoint, or the backend's copy in huge pages). A 1-D tensor has rows = 1. For Q2/Q3/Q4/Q8 a
 * value is (q - zero) * scale, one fp16 scale and zero per `group` consecutive inputs of a
 * row (Q2/Q3: a group is a multiple of 16 inputs). */
typedef struct weight {
    dtype_t dtype;
    int64_t rows;            /* output features */
    int64_t cols;            /* input features */
    const void *data;        /* (rows, cols) elements of dtype, or packed codes */
    const uint16_t *scales;  /* Q2/Q3/Q4/Q8: (rows, cols/group) fp16, else NULL */
    const uint16_t *zeros;   /* Q2/Q3/Q4/Q8: (rows, cols/group) fp16, in code units, else NULL */
    int group;               /* Q2/Q3/Q4/Q8: inputs per group, else 0 */
    int zero_int;            /* Q4/Q8: z when every zero is the integer z (128: int8
                              * symmetric, as llama.cpp's q8_0; 8: its Q4_0; 16: Q5_0), found
                              * by the CPU backend's weight_upload so that its integer kernels
                              * fold the zero terms into their integer sums; 0 claims nothing */
} weight_t;

typedef enum {
    ROPE_INTERLEAVED = 0, /* pairs (x[2i], x[2i+1]): llama2.c / Meta layout */
    ROPE_HALF,            /* pairs (x[i], x[i + rot/2]): Hugging Face rotate_half */
} rope_layout_t;

/* Rotary embedding of one model. inv_freq already includes theta and any scaling
 * (llama3, longrope), so the op only computes angle = pos * inv_freq[i]. */
typedef struct rope {
    rope_layout_t layout;
    int head_dim;          /* elements per head */
    int rot_dim;           /* rotated elements per head (partial rotary: < head_dim), even */
    const float *inv_freq; /* (rot_dim/2) host memory */
    float attn_factor;     /* multiplies cos and sin (longrope); 1 otherwise */
} rope_t;

/* Where the paged KV cache of one layer lives, in the backend's memory. A page holds
 * `page_size` consecutive positions of one sequence; element (page, pos_in_page, j) of
 * layer l has the element index page*page_stride + l*layer_stride + pos_in_page*kv_dim + j
 * in the K (and V) array. Strides count elements of `dtype`, never bytes.
 *
 * Element types (`dtype`, kv.dtype in a worker's file):
 * - DTYPE_F32: the index addresses a float at k.
 * - DTYPE_F16, DTYPE_BF16: a 16-bit float at k (IEEE half, bfloat16); kv_write rounds to
 *   nearest, ties to even (kernels/half.h).
 * - DTYPE_Q8: symmetric int8, NOT the affine Q8 of weights: the index addresses an int8_t
 *   code at k, and every block of KV_Q8_BLOCK consecutive elements of a position's row (a
 *   head_dim must be a multiple of it, so a block never straddles two heads or positions)
 *   has one f32 scale, k_scale[index / KV_Q8_BLOCK]; value = code * scale, scale =
 *   max|x| / 127 over the block (0 for a block of zeros), code = round-to-nearest-even of
 *   x / scale. The same for V with v_scale.
 * kv_write narrows each value one way (kernels/kv_row.h on the CPU; CUDA rounds f16 and
 * bf16 to nearest even too, and refuses Q8 with RIVER_EUNSUPPORTED) and attention widens
 * exactly, so a position's values do not depend on the batch it was written or read in. */
#define KV_Q8_BLOCK 32
typedef struct kv_view {
    void *k;                /* K base: (n_pages * page_stride) elements of dtype */
    void *v;                /* V base */
    float *k_scale;         /* DTYPE_Q8: (n_pages * page_stride / KV_Q8_BLOCK) scales of K;
                               NULL for the float types */
    float *v_scale;         /* DTYPE_Q8: the same for V */
    dtype_t dtype;          /* DTYPE_F32 (0, the zero-initialised view), F16, BF16 or Q8 */
    int64_t page_stride;    /* elements between pages */
    int64_t layer_stride;   /* elements between layers of one page */
    int page_size;          /* positions per page */
    int kv_dim;             /* n_kv_heads * head_dim */
    int n_pages;            /* pages in the pool; a page id must be below it */
} kv_view_t;

/* Whether dt is an element type of the KV cache (F32, F16, BF16, Q8). */
int kv_dtype_ok(dtype_t dt);
/* Bytes of n elements of the KV type dt (Q8: codes only; its scales are
 * kv_dtype_scale_bytes); 0 for a type that is not one. */
size_t kv_dtype_bytes(dtype_t dt, int64_t n);
/* Bytes of the scales of n elements (Q8: n / KV_Q8_BLOCK floats; 0 for the float types). */
size_t kv_dtype_scale_bytes(dtype_t dt, int64_t n);
/* RIVER_EINVAL naming kv.dtype and head_dim when the cache cannot hold heads of head_dim
 * elements in dt (Q8: head_dim not a multiple of KV_Q8_BLOCK; a type that is not a KV
 * type); 0 otherwise. */
int kv_dtype_check(dtype_t dt, int head_dim);

/* The rows of one batch as attention sees them: row i is position pos[i] of a sequence
 * whose page table is page_table[i] (page_table[i][p / page_size] holds position p). A
 * row attends to positions 0..pos[i] of its own sequence. Rows of one sequence in one
 * batch must have their K/V written (kv_write) before attention runs. */
typedef struct attn_batch {
    int n;                             /* rows */
    const int32_t *pos;                /* (n) host memory */
    const int32_t *const *page_table;  /* (n) host pointers to page tables */
    /* Optional (NULL: every slot valid). Row i may read slot (layer, p) only where
     * kv_valid[i][layer * kv_valid_stride + p] is nonzero; the masking baseline of early
     * exit leaves slots unwritten and skips them this way. */
    const uint8_t *const *kv_valid;    /* (n) host pointers, or NULL */
    int kv_valid_stride;               /* positions per layer in a kv_valid map */
} attn_batch_t;

/* One TIDE router (engine/router.h): p = sigmoid(up . silu(down . rmsnorm(h))), with the
 * RMSNorm's weight and no biases. Each tensor is placed with weight_upload like a model's. */
typedef struct router_weights {
    weight_t norm;  /* (1, d) F32 RMSNorm weight */
    weight_t down;  /* (hidden, d) F32 */
    weight_t up;    /* (1, hidden) F32 */
    float eps;      /* RMSNorm epsilon */
} router_weights_t;

typedef struct ops_ctx ops_ctx_t; /* backend state (thread pool, streams, scratch) */
typedef struct backend backend_t;

/* What a backend says about itself (ops->info). Code decides on these fields, never on a
 * backend's name: the name is for logs and for handshakes between two processes that must
 * run the same kernels. */
/* How two processes of one host best hand activations to each other (the split pair's
 * hidden states), as a backend asks for it (backend_info.handoff). */
typedef enum {
    HANDOFF_DEFAULT = 0, /* decided by host_memory: through host memory there, device to
                            device (NCCL where built, else peer copies) otherwise */
    HANDOFF_HOST,        /* copied to the host and sent as bytes */
    HANDOFF_SHARED,      /* copied through a buffer both map (shared_alloc / shared_map) */
    HANDOFF_NCCL,        /* NCCL send/recv between the two devices */
} handoff_kind_t;

typedef struct backend_info {
    const char *name;  /* "cpu", "cuda", ... */
    char variant[48];  /* what distinguishes two instances of the kind: the CPU's SIMD level
                          ("avx512"), the GPU's model name */
    int threads;       /* host threads the ops run on (0 where not meaningful) */
    int device;        /* device index, -1 for host backends */
    char uuid[48];     /* what names the physical device on this host, the same in every
                          process that uses it whatever its index there (CUDA: "GPU-" and
                          the UUID nvidia-smi shows); "" for host backends. Two processes
                          compare it to learn that they share one device */
    int host_memory;   /* buffers, KV pages and weights are plain host memory: the caller may
                          map, share (memfd) or advise them */
    handoff_kind_t handoff; /* the split pair's hand-off this backend asks for */
    int lost;          /* the device failed for good (a sticky CUDA fault: every later op
                          fails too); only a new process can use it again */
} backend_info_t;

/* Memory two processes on one host map together (the split pair's KV pool), as the
 * exporting side describes it to the other. */
typedef enum {
    SHARED_NONE = 0,
    SHARED_MEMFD,    /* host memory: a sealed memfd; the peer opens /proc/<pid>/fd/<fd> */
    SHARED_CUDA_IPC, /* device memory: a cudaIpcMemHandle_t */
} shared_kind_t;

typedef struct shared_handle {
    shared_kind_t kind;
    size_t bytes;          /* of the whole shared buffer */
    int fd;                /* SHARED_MEMFD: the descriptor in the exporting process */
    unsigned char ipc[64]; /* SHARED_CUDA_IPC: the handle's bytes */
} shared_handle_t;

/* A link between two processes of one host, each on its own device, that moves backend
 * buffers directly (the CUDA backend: a two-rank NCCL communicator); each backend that has
 * one defines the struct. Rank 0 makes the id that both join with. */
typedef struct ops_peer ops_peer_t;
#define OPS_PEER_ID_BYTES 128

typedef struct ops {
    const char *name;

    /* Fills *out; cannot fail. */
    void (*info)(ops_ctx_t *ctx, backend_info_t *out);
    /* Optional (NULL: unknown). Bytes its buffers can still take, read now: the host's
     * available memory within its cgroups' limits (common/meminfo.h), the GPU's free
     * memory; 0 where it cannot tell. A reading of the system, not a field of info, which
     * callers take often. */
    int64_t (*mem_free)(ops_ctx_t *ctx);
    /* Places a weight where the ops read it. A backend may read it where it is and leave w
     * alone, or copy data (and Q4/Q8 scales and zeros) into memory it owns until destroy
     * and point w at the copy: device backends always, the CPU for matrices of 2 MiB or
     * more (huge pages) and repacked codes (kernels/cpu/cpu.h). The caller's memory is
     * never written. A weight whose data is NULL (an absent bias) or is the backend's
     * copy already (a tied head) is left alone. On failure w is unchanged. */
    int (*weight_upload)(ops_ctx_t *ctx, weight_t *w);
    /* Residency of a placed weight, for backbone offloading: resident 0 releases the
     * memory behind w (it must stay readable: a later op may still use it, at the cost of
     * bringing it back), 1 asks for it back ahead of use. On host backends this is advice
     * on the mapped file's pages (madvise), which loses nothing; a backend that cannot
     * release memory, or this weight's (its own copy), returns RIVER_EUNSUPPORTED. A Q4/Q8
     * weight's scales and zeros are advised with its codes, so they too must be mapped file
     * memory where the caller releases them (the loader's quantized backbones are). */
    int (*weight_residency)(ops_ctx_t *ctx, const weight_t *w, int resident);
    /* Shared buffers. shared_alloc makes `bytes` of zero-filled memory that another process
     * can map, and describes it in *h (an fd it keeps open until shared_free); shared_map
     * maps a buffer another process exported (for SHARED_MEMFD h->fd is a descriptor of this
     * process, which the mapping does not need afterwards). Both return the buffer in the
     * backend's address space, NULL on failure with a detail (RIVER_EUNSUPPORTED for a kind
     * the backend cannot map, RIVER_EINVAL for a handle that does not describe `bytes`).
     * A handle this process exported itself maps too: device backends (whose IPC cannot
     * open a handle in the process that made it) give the exported buffer itself, an alias
     * that shared_free with owner 0 leaves alone; the CPU backend maps the memfd again. */
    void *(*shared_alloc)(ops_ctx_t *ctx, size_t bytes, shared_handle_t *h);
    void *(*shared_map)(ops_ctx_t *ctx, const shared_handle_t *h);
    /* Unmaps either kind (h as shared_alloc filled it, or as given to shared_map). */
    void (*shared_free)(ops_ctx_t *ctx, void *buf, const shared_handle_t *h, int owner);
    /* Frees the backend, its state and what it owns (uploaded weights included). */
    void (*destroy)(backend_t *be);

    /* Buffers in the backend's activation type; NULL on failure. Zero-filled. */
    void *(*buf_alloc)(ops_ctx_t *ctx, size_t n_elems);
    void (*buf_free)(ops_ctx_t *ctx, void *buf);
    /* Copies n f32 values between host memory and a buffer (offset in elements). */
    int (*to_host)(ops_ctx_t *ctx, float *dst, const void *src, size_t offset, size_t n);
    int (*from_host)(ops_ctx_t *ctx, void *dst, size_t offset, const float *src, size_t n);

    /* out[i,:] = row tokens[i] of table (rows = vocab, cols = d), converted. */
    int (*embed)(ops_ctx_t *ctx, void *out, const weight_t *table, const int32_t *tokens, int n);
    /* out[i,:] = x[i,:] / sqrt(mean(x[i,:]^2) + eps) * w; rows n of width d (w: 1 x d).
     * out may equal x. */
    int (*rmsnorm)(ops_ctx_t *ctx, void *out, const void *x, const weight_t *w, int n, int d,
                   float eps);
    /* y (n, w->rows) = x (n, w->cols) W^T; y must not alias x. */
    int (*matmul)(ops_ctx_t *ctx, void *y, const void *x, const weight_t *w, int n);
    /* Optional (NULL: matmul once per weight; ops_matmuls below picks). y[i] = x W[i]^T for
     * the count (2 to OPS_MATMULS_MAX) weights w[i], all of w[0]->cols columns, in one pass:
     * the projections that read the same x (q, k and v; gate and up) as one call, so a
     * decode step pays one call's start and end for them, not one each. Each y[i] has the
     * bits matmul gives it. On failure the y[i] are undefined. */
    int (*matmul_multi)(ops_ctx_t *ctx, void *const *y, const void *x,
                        const weight_t *const *w, int count, int n);
    /* y[i,:] += b for each of n rows (b: 1 x d). */
    int (*add_bias)(ops_ctx_t *ctx, void *y, const weight_t *b, int n, int d);
    /* y += x, n*d elements. */
    int (*add)(ops_ctx_t *ctx, void *y, const void *x, size_t n_elems);
    /* Rotates n_heads heads of each row in place (row stride = n_heads*head_dim). */
    int (*rope)(ops_ctx_t *ctx, void *x, const int32_t *pos, int n, int n_heads,
                const rope_t *rope);
    /* out[i,:] = silu(gate[i,:]) * up[i,:]; gate and up have row stride `stride`
     * (they may be two halves of one fused gate_up row), out has row stride d. */
    int (*swiglu)(ops_ctx_t *ctx, void *out, const void *gate, const void *up, int n, int d,
                  int stride);
    /* Writes k and v (n, kv_dim, f32) into the slots (layer, pos[i]) of each row's pages,
     * narrowed to kv->dtype (kv_view_t). The rows' slots must be distinct: a backend writes
     * rows in parallel (CUDA's threads, the CPU's pool), so two rows on one slot race. */
    int (*kv_write)(ops_ctx_t *ctx, const kv_view_t *kv, int layer, const attn_batch_t *b,
                    const void *k, const void *v);
    /* Causal grouped-query attention of q (n, n_heads*head_dim) over the pages of each
     * row's sequence in layer `layer`; out has the same shape as q. scale multiplies q.k. */
    int (*attention)(ops_ctx_t *ctx, void *out, const void *q, const kv_view_t *kv, int layer,
                     const attn_batch_t *b, int n_heads, int n_kv_heads, int head_dim,
                     float scale);
    /* out[i] = cos(a[i,:], b[i,:]) into host memory (n floats). */
    int (*cosine)(ops_ctx_t *ctx, float *out, const void *a, const void *b, int n, int d);
    /* out[i] = the router's probability for row rows[i] of x (row width d = w->down.cols;
     * rows NULL: row i) into host memory (n floats): only these bytes leave the device.
     * The rmsnorm's sum of squares is taken in double, as engine/router.c's router_logit
     * does, which the CPU backend matches bit for bit. Non-finite input gives NaN. */
    int (*router_prob)(ops_ctx_t *ctx, float *out, const void *x, const router_weights_t *w,
                       const int32_t *rows, int n);
    /* dst[i,:] = src[idx[i],:] for n rows of width d (gather for compaction). */
    int (*gather_rows)(ops_ctx_t *ctx, void *dst, const void *src, const int32_t *idx, int n,
                       int d);
    /* dst[idx[i],:] = src[i,:] (scatter back after compaction). */
    int (*scatter_rows)(ops_ctx_t *ctx, void *dst, const void *src, const int32_t *idx, int n,
                        int d);
    /* Waits until all queued work is done (no-op on the CPU). */
    int (*sync)(ops_ctx_t *ctx);
    /* Optional (NULL where a backend has nothing of the kind, as on the CPU): recording a
     * run of ops and launching it as one (CUDA graphs). graph_begin sets *active when the
     * ops that follow, until graph_end, are recorded rather than run; none of them may
     * return data to the host (to_host, cosine) or sync. graph_end(abort = 0) runs what was
     * recorded; abort discards it. Whenever *active stays 0, or graph_begin or graph_end
     * fails, nothing recorded has run, and the caller runs the same ops again unrecorded. */
    int (*graph_begin)(ops_ctx_t *ctx, int *active);
    int (*graph_end)(ops_ctx_t *ctx, int abort);
    /* Optional (NULL where a backend has none, as on the CPU): the peer link of
     * kernels/backend.h (backend_peer_open and the rest, which check the arguments and
     * say so for a backend without one). */
    int (*peer_id)(ops_ctx_t *ctx, unsigned char id[OPS_PEER_ID_BYTES]);
    int (*peer_open)(ops_ctx_t *ctx, ops_peer_t **out,
                     const unsigned char id[OPS_PEER_ID_BYTES], int rank);
    void (*peer_close)(ops_ctx_t *ctx, ops_peer_t *peer);
    int (*peer_send)(ops_ctx_t *ctx, ops_peer_t *peer, const void *buf, size_t n);
    int (*peer_recv)(ops_ctx_t *ctx, ops_peer_t *peer, void *buf, size_t n);
} ops_t;

/* A backend instance: the table plus its state. */
struct backend {
    const ops_t *ops;
    ops_ctx_t *ctx;
};

/* The most weights one matmul_multi takes. */
#define OPS_MATMULS_MAX 4

/* y[i] = x W[i]^T for count weights of the same columns: one matmul_multi where the backend
 * has it, else matmul once per weight. Either way each y[i] has matmul's bits. */
static inline int ops_matmuls(const ops_t *o, ops_ctx_t *ctx, void *const *y, const void *x,
                              const weight_t *const *w, int count, int n)
{
    if (o->matmul_multi && count > 1)
        return o->matmul_multi(ctx, y, x, w, count, n);
    for (int i = 0; i < count; i++) {
        int e = o->matmul(ctx, y[i], x, w[i], n);
        if (e)
            return e;
    }
    return 0;
}

#endif
