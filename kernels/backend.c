#include "kernels/backend.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "kernels/cpu/cpu.h"
#include "kernels/opaque/opaque.h"
#ifdef RIVER_CUDA
#include "kernels/cuda/cuda.h"
#endif

int backend_parse_device(const char *device, backend_kind_t *kind, int *index)
{
    if (!device || !strcmp(device, "cpu")) {
        *kind = BACKEND_KIND_CPU;
        *index = 0;
        return 0;
    }
    if (!strcmp(device, "opaque")) {
        *kind = BACKEND_KIND_OPAQUE;
        *index = 0;
        return 0;
    }
    int gpu = 0;
    if (strcmp(device, "cuda") != 0) {
        char *end;
        if (strncmp(device, "cuda:", 5) != 0 || device[5] < '0' || device[5] > '9')
            return river_err_set(RIVER_EINVAL, "device '%s': use cpu, cuda or cuda:N (or opaque, the test backend)", device);
        long v = strtol(device + 5, &end, 10);
        if (*end || v > 255)
            return river_err_set(RIVER_EINVAL, "device '%s': use cpu, cuda or cuda:N (N a GPU "
                                 "index below 256)", device);
        gpu = (int)v;
    }
#ifdef RIVER_CUDA
    *kind = BACKEND_KIND_CUDA;
    *index = gpu;
    return 0;
#else
    (void)gpu;
    return river_err_set(RIVER_EUNSUPPORTED, "device %s: built without the CUDA backend "
                         "(make CUDA=1)", device);
#endif
}

int backend_open(backend_t **out, const char *device, int n_threads,
                 backend_weights_t weights)
{
    backend_kind_t kind;
    int index;
    int e = backend_parse_device(device, &kind, &index);
    if (e)
        return e;
#ifdef RIVER_CUDA
    if (kind == BACKEND_KIND_CUDA)
        return cuda_backend_new(out, index);
#endif
    if (kind == BACKEND_KIND_OPAQUE)
        return opaque_backend_new(out, n_threads, CPU_SIMD_COUNT);
    if ((e = cpu_backend_new(out, n_threads, CPU_SIMD_COUNT)))
        return e;
    if (weights == BACKEND_WEIGHTS_MAPPED)
        (void)cpu_backend_keep_mapped(*out); /* a CPU backend: cannot fail */
    return 0;
}

void backend_destroy(backend_t **be)
{
    if (!be || !*be)
        return;
    (*be)->ops->destroy(*be);
    *be = NULL;
}

void backend_get_info(const backend_t *be, backend_info_t *out)
{
    memset(out, 0, sizeof *out);
    out->device = -1;
    be->ops->info(be->ctx, out);
}

int backend_is_host(const backend_t *be)
{
    backend_info_t bi;
    backend_get_info(be, &bi);
    return bi.host_memory;
}

int backend_threads(const backend_t *be)
{
    backend_info_t bi;
    backend_get_info(be, &bi);
    return bi.threads;
}

const char *backend_describe(const backend_t *be, char *buf, size_t cap)
{
    backend_info_t bi;
    backend_get_info(be, &bi);
    snprintf(buf, cap, "%s-%s", bi.name, bi.variant);
    return buf;
}
