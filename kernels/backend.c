/* The backend registry (kernels/backend.h): the one table of device names, each with the
 * driver of its backend (kernels/backend_driver.h), and what every caller asks of an open
 * backend. */
#include "kernels/backend.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "kernels/backend_driver.h"

/* Indexed names take "name:N" with N below this. */
#define BACKEND_MAX_INDEX 255

typedef struct backend_device {
    const char *name;
    backend_kind_t kind;
    const char *index_of; /* what N counts in "name:N" ("a GPU"); NULL: no index */
    const char *test;     /* a test backend: how the error messages call it; NULL otherwise */
    const backend_driver_t *driver; /* NULL: not in this build */
    const char *unbuilt;  /* why driver is NULL, and how to build it */
} backend_device_t;

#ifdef RIVER_CUDA
#define BACKEND_CUDA_DRIVER (&cuda_backend_driver)
#else
#define BACKEND_CUDA_DRIVER NULL
#endif

static const backend_device_t backend__devices[] = {
    {"cpu", BACKEND_KIND_CPU, NULL, NULL, &cpu_backend_driver, NULL},
    {"cuda", BACKEND_KIND_CUDA, "a GPU", NULL, BACKEND_CUDA_DRIVER,
     "built without the CUDA backend (make CUDA=1)"},
    {"opaque", BACKEND_KIND_OPAQUE, NULL, "the test backend", &opaque_backend_driver, NULL},
};
#define BACKEND_N_DEVICES (sizeof backend__devices / sizeof backend__devices[0])

/* The accepted forms as a list ("cpu, cuda or cuda:N"): every device, or (with_test 0)
 * those that are no test backend. */
static void backend__forms(char *buf, size_t cap, int with_test)
{
    const char *forms[2 * BACKEND_N_DEVICES];
    int indexed[2 * BACKEND_N_DEVICES];
    int n = 0;
    for (size_t i = 0; i < BACKEND_N_DEVICES; i++) {
        const backend_device_t *d = &backend__devices[i];
        if (d->test && !with_test)
            continue;
        forms[n] = d->name;
        indexed[n++] = 0;
        if (d->index_of) {
            forms[n] = d->name;
            indexed[n++] = 1;
        }
    }
    size_t at = 0;
    buf[0] = '\0';
    for (int i = 0; i < n && at < cap; i++) {
        const char *sep = i == 0 ? "" : i == n - 1 ? " or " : ", ";
        int w = snprintf(buf + at, cap - at, "%s%s%s", sep, forms[i], indexed[i] ? ":N" : "");
        at += w > 0 ? (size_t)w : 0;
    }
}

static char backend__all_forms[128];
static pthread_once_t backend__forms_once = PTHREAD_ONCE_INIT;

static void backend__forms_init(void)
{
    backend__forms(backend__all_forms, sizeof backend__all_forms, 1);
}

const char *backend_device_forms(void)
{
    pthread_once(&backend__forms_once, backend__forms_init);
    return backend__all_forms;
}

/* RIVER_EINVAL for a name no entry accepts; `why` is what the detail adds in parentheses
 * (NULL: the test backends). */
static int backend__bad_name(const char *device, const char *why)
{
    char forms[128], tests[128] = "";
    backend__forms(forms, sizeof forms, 0);
    for (size_t i = 0; i < BACKEND_N_DEVICES && !why; i++) {
        const backend_device_t *d = &backend__devices[i];
        if (d->test) {
            size_t at = strlen(tests);
            snprintf(tests + at, sizeof tests - at, "%sor %s, %s", at ? "; " : "", d->name,
                     d->test);
        }
    }
    return river_err_set(RIVER_EINVAL, "device '%s': use %s (%s)", device, forms,
                         why ? why : tests);
}

/* The entry that accepts `device`, with its index; NULL (and the error in *err) if none. */
static const backend_device_t *backend__lookup(const char *device, int *index, int *err)
{
    *err = 0;
    for (size_t i = 0; i < BACKEND_N_DEVICES; i++) {
        const backend_device_t *d = &backend__devices[i];
        size_t len = strlen(d->name);
        if (!strcmp(device, d->name)) {
            *index = 0;
            return d;
        }
        if (!d->index_of || strncmp(device, d->name, len) != 0 || device[len] != ':')
            continue;
        const char *num = device + len + 1;
        if (*num < '0' || *num > '9')
            break;
        char *end;
        long v = strtol(num, &end, 10);
        if (*end || v > BACKEND_MAX_INDEX) {
            char why[64];
            snprintf(why, sizeof why, "N %s index below %d", d->index_of,
                     BACKEND_MAX_INDEX + 1);
            *err = backend__bad_name(device, why);
            return NULL;
        }
        *index = (int)v;
        return d;
    }
    *err = backend__bad_name(device, NULL);
    return NULL;
}

/* The parsed device, or NULL with the error in *err (RIVER_EUNSUPPORTED for a kind this
 * build lacks). */
static const backend_device_t *backend__parse(const char *device, int *index, int *err)
{
    if (!device) { /* the default: the first entry, the CPU */
        *index = 0;
        *err = 0;
        return &backend__devices[0];
    }
    const backend_device_t *d = backend__lookup(device, index, err);
    if (d && !d->driver) {
        *err = river_err_set(RIVER_EUNSUPPORTED, "device %s: %s", device, d->unbuilt);
        return NULL;
    }
    return d;
}

int backend_parse_device(const char *device, backend_kind_t *kind, int *index)
{
    int e, at;
    const backend_device_t *d = backend__parse(device, &at, &e);
    if (!d)
        return e;
    *kind = d->kind;
    *index = at;
    return 0;
}

int backend_open(backend_t **out, const char *device, int n_threads,
                 backend_weights_t weights)
{
    int e, index;
    const backend_device_t *d = backend__parse(device, &index, &e);
    return d ? d->driver->open(out, index, n_threads, weights) : e;
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

int backend_is_lost(const backend_t *be)
{
    backend_info_t bi;
    backend_get_info(be, &bi);
    return bi.lost;
}

int64_t backend_mem_free(const backend_t *be)
{
    return be->ops->mem_free ? be->ops->mem_free(be->ctx) : 0;
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

/* ---- the peer link ---------------------------------------------------------------------- */

/* RIVER_EUNSUPPORTED for a backend whose ops have no peer link. */
static int backend__no_peer(const backend_t *be)
{
    return river_err_set(RIVER_EUNSUPPORTED, "the %s backend has no peer link between devices "
                         "(NCCL): its buffers go through the host or shared memory",
                         be->ops->name);
}

int backend_peer_id(backend_t *be, unsigned char id[OPS_PEER_ID_BYTES])
{
    return be->ops->peer_id ? be->ops->peer_id(be->ctx, id) : backend__no_peer(be);
}

int backend_peer_open(backend_t *be, ops_peer_t **out,
                      const unsigned char id[OPS_PEER_ID_BYTES], int rank)
{
    if (!be->ops->peer_open)
        return backend__no_peer(be);
    if (rank != 0 && rank != 1)
        return river_err_set(RIVER_EINVAL, "peer link: rank %d of 2", rank);
    return be->ops->peer_open(be->ctx, out, id, rank);
}

void backend_peer_close(backend_t *be, ops_peer_t **peer)
{
    if (!peer || !*peer)
        return;
    be->ops->peer_close(be->ctx, *peer);
    *peer = NULL;
}

int backend_peer_send(backend_t *be, ops_peer_t *peer, const void *buf, size_t n)
{
    return be->ops->peer_send ? be->ops->peer_send(be->ctx, peer, buf, n)
                              : backend__no_peer(be);
}

int backend_peer_recv(backend_t *be, ops_peer_t *peer, void *buf, size_t n)
{
    return be->ops->peer_recv ? be->ops->peer_recv(be->ctx, peer, buf, n)
                              : backend__no_peer(be);
}
