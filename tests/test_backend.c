/* The backend boundary as the engine uses it: device names, what a backend says about
 * itself, and placing a model and its river through ops->weight_upload, so that nothing
 * after placement reads the weights where the loader mapped them. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/err.h"
#include "common/meminfo.h"
#include "engine/engine_open.h"
#include "engine/generate.h"
#include "engine/offload.h"
#include "engine/exitriver.h"
#include "engine/router.h"
#include "model/fingerprint.h"
#include "offline/exitriver_build.h"
#include "offline/synth.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cpu/rowblock.h"
#include "kernels/half.h"
#include "kernels/opaque/opaque.h"
#include "kernels/profile.h"
#include "tests/testutil.h"

#define KJV TEST_DATA "/kjv-12l"
#define STORIES TEST_DATA "/stories260K/stories260K.bin"

START_TEST(test_device_names)
{
    backend_kind_t kind;
    int index = -1;
    ck_assert_int_eq(backend_parse_device("cpu", &kind, &index), 0);
    ck_assert_int_eq(kind, BACKEND_KIND_CPU);
    ck_assert_int_eq(index, 0);
    const char *bad[] = {"gpu", "cuda:", "cuda:x", "cuda:1a", "cuda:-1", "cuda:999", "CPU", ""};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ck_assert_msg(backend_parse_device(bad[i], &kind, &index) == RIVER_EINVAL, "%s", bad[i]);
        ck_assert_msg(strstr(river_err_detail(), "use cpu, cuda or cuda:N"), "%s: %s", bad[i],
                      river_err_detail());
    }
    /* cuda:N parses in a CUDA build and is refused, naming the build, in one without; with
     * no GPU, opening it is an error that says so, never a crash. */
    int e = backend_parse_device("cuda:3", &kind, &index);
#ifdef RIVER_CUDA
    ck_assert_int_eq(e, 0);
    ck_assert_int_eq(kind, BACKEND_KIND_CUDA);
    ck_assert_int_eq(index, 3);
    backend_t *be = NULL;
    e = backend_open(&be, "cuda:0", 0, BACKEND_WEIGHTS_COPY);
    if (e) {
        ck_assert_int_eq(e, RIVER_EDEVICE);
        ck_assert_ptr_null(be);
    } else {
        backend_info_t bi;
        backend_get_info(be, &bi);
        ck_assert_int_eq(bi.host_memory, 0);
        ck_assert_int_eq(bi.device, 0);
        ck_assert(backend_mem_free(be) > 0);
        backend_destroy(&be);
    }
#else
    ck_assert_int_eq(e, RIVER_EUNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(river_err_detail(), "CUDA"));
#endif
    /* The list the configuration's messages name comes from the same table. */
    ck_assert_str_eq(backend_device_forms(), "cpu, cuda, cuda:N or opaque");
    ck_assert_int_eq(backend_parse_device("opaque", &kind, &index), 0);
    ck_assert_int_eq(kind, BACKEND_KIND_OPAQUE);
    ck_assert_int_eq(backend_parse_device(NULL, &kind, &index), 0);
    ck_assert_int_eq(kind, BACKEND_KIND_CPU);
}
END_TEST

/* Host backends have no peer link between devices: each entry says so and changes
 * nothing. */
START_TEST(test_host_peer_unsupported)
{
    const char *devices[] = {"cpu", "opaque"};
    for (size_t i = 0; i < sizeof devices / sizeof devices[0]; i++) {
        backend_t *be = NULL;
        ck_assert_int_eq(backend_open(&be, devices[i], 1, BACKEND_WEIGHTS_COPY), 0);
        unsigned char id[OPS_PEER_ID_BYTES] = {0};
        ops_peer_t *peer = NULL;
        float buf[4] = {0};
        ck_assert_int_eq(backend_peer_id(be, id), RIVER_EUNSUPPORTED);
        ck_assert_msg(strstr(river_err_detail(), devices[i]) &&
                      strstr(river_err_detail(), "no peer link"), "%s", river_err_detail());
        ck_assert_int_eq(backend_peer_open(be, &peer, id, 0), RIVER_EUNSUPPORTED);
        ck_assert_ptr_null(peer);
        ck_assert_int_eq(backend_peer_send(be, peer, buf, 4), RIVER_EUNSUPPORTED);
        ck_assert_int_eq(backend_peer_recv(be, peer, buf, 4), RIVER_EUNSUPPORTED);
        backend_peer_close(be, &peer);
        backend_destroy(&be);
    }
}
END_TEST

/* Writes text to dir/name, making dir (and its parents, one level at a time) first. */
static void mi_put(const char *dir, const char *name, const char *text)
{
    char path[700];
    snprintf(path, sizeof path, "%s", dir);
    for (char *p = path + strlen(test_tmpdir()) + 1; (p = strchr(p, '/')); *p++ = '/') {
        *p = '\0';
        mkdir(path, 0755);
    }
    mkdir(path, 0755);
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    ck_assert_int_eq(fclose(f), 0);
}

/* A cgroup level dir under fs with its limit and usage files. */
static void mi_level(const char *fs, const char *dir, const char *limit_file, const char *limit,
                     const char *usage_file, const char *usage)
{
    char d[700];
    snprintf(d, sizeof d, "%s%s", fs, dir);
    mi_put(d, limit_file, limit);
    mi_put(d, usage_file, usage);
}

/* The memory a process can take: MemAvailable, bounded by the least headroom of the cgroups
 * it is in, at every level, for cgroup v2 and v1. */
START_TEST(test_meminfo_cgroups)
{
    char root[600], fs[620], mi[620], cg[620];
    snprintf(root, sizeof root, "%s/meminfo", test_tmpdir());
    snprintf(fs, sizeof fs, "%s/fs", root);
    snprintf(mi, sizeof mi, "%s/meminfo", root);
    snprintf(cg, sizeof cg, "%s/cgroup", root);
    mi_put(root, "meminfo", "MemTotal: 16777216 kB\nMemAvailable: 8388608 kB\n");
    /* No limits anywhere: MemAvailable. */
    mi_put(root, "cgroup", "0::/\n");
    ck_assert_int_eq(meminfo_available_from(mi, cg, fs), (int64_t)8 << 30);
    /* v2: /a allows 3 GiB and uses 1; /a/b has no limit of its own. */
    mi_level(fs, "/a", "memory.max", "3221225472\n", "memory.current", "1073741824\n");
    mi_level(fs, "/a/b", "memory.max", "max\n", "memory.current", "536870912\n");
    mi_put(root, "cgroup", "0::/a/b\n");
    ck_assert_int_eq(meminfo_available_from(mi, cg, fs), (int64_t)2 << 30);
    /* A limit below the available memory but above it at another level: the least. */
    mi_level(fs, "/a/b", "memory.max", "1610612736\n", "memory.current", "536870912\n");
    ck_assert_int_eq(meminfo_available_from(mi, cg, fs), (int64_t)1 << 30);
    /* v1: the memory controller's mount; a child without a limit under a parent of 1 GiB
     * that uses 256 MiB. */
    mi_level(fs, "/memory", "memory.limit_in_bytes", "1073741824\n", "memory.usage_in_bytes",
             "268435456\n");
    mi_level(fs, "/memory/x", "memory.limit_in_bytes", "9223372036854771712\n",
             "memory.usage_in_bytes", "1048576\n");
    mi_put(root, "cgroup", "4:memory:/x\n1:cpu:/x\n");
    ck_assert_int_eq(meminfo_available_from(mi, cg, fs), (int64_t)768 << 20);
    /* Nothing readable: 0 (unknown). */
    ck_assert_int_eq(meminfo_available_from("/nonexistent", "/nonexistent", fs), 0);
    /* This process: something, no more than the machine has. */
    double phys = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
    ck_assert(meminfo_available() > 0 && (double)meminfo_available() <= phys);
}
END_TEST

START_TEST(test_cpu_info)
{
    backend_t *be = NULL;
    ck_assert_int_eq(backend_open(&be, NULL, 2, BACKEND_WEIGHTS_COPY), 0);
    backend_info_t bi;
    backend_get_info(be, &bi);
    ck_assert_str_eq(bi.name, "cpu");
    ck_assert_str_eq(bi.variant, cpu_simd_name(cpu_simd_detect()));
    ck_assert_int_eq(bi.threads, 2);
    ck_assert_int_eq(bi.device, -1);
    ck_assert_int_eq(bi.host_memory, 1);
    /* The host's available memory: more than nothing, no more than it has. */
    double phys = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
    int64_t mem_free = backend_mem_free(be);
    ck_assert(mem_free > 0 && (double)mem_free <= phys);
    ck_assert_int_eq(backend_is_host(be), 1);
    ck_assert_int_eq(backend_threads(be), 2);
    char buf[64];
    char want[64];
    snprintf(want, sizeof want, "cpu-%s", cpu_simd_name(cpu_simd_detect()));
    ck_assert_str_eq(backend_describe(be, buf, sizeof buf), want);
    backend_destroy(&be);
    ck_assert_ptr_null(be);
    backend_destroy(&be); /* NULL is fine */

    /* A backend at a lower SIMD level says so: the split pair compares these. */
    ck_assert_int_eq(cpu_backend_new(&be, 1, CPU_SIMD_SCALAR), 0);
    backend_get_info(be, &bi);
    ck_assert_str_eq(bi.variant, cpu_simd_name(CPU_SIMD_SCALAR));
    backend_destroy(&be);
}
END_TEST

/* The profiling wrapper (kernels/profile.h) in place over a CPU backend: what was made before
 * it stays valid, every call is filed under its op, weight shape and rows, and detaching
 * gives back the backend as it was. */
START_TEST(test_profile)
{
    backend_t *be = NULL;
    ck_assert_int_eq(backend_open(&be, NULL, 1, BACKEND_WEIGHTS_COPY), 0);
    const ops_t *cpu_ops = be->ops;
    const profile_row_t *rows;
    int n_rows;
    double window;
    ck_assert_int_eq(profile_read(be, &rows, &n_rows, &window), RIVER_EINVAL);
    ck_assert_int_eq(profile_reset(be), RIVER_EINVAL);

    enum { R = 64, C = 32, N = 100 };
    uint16_t *wd = malloc(sizeof *wd * R * C);
    float norm[C], xh[N * C], yh[N * R];
    ck_assert_ptr_nonnull(wd);
    for (int i = 0; i < R * C; i++)
        wd[i] = f32_to_bf16((float)(i % C) / C);
    for (int i = 0; i < C; i++)
        norm[i] = 1.0f;
    for (int i = 0; i < N * C; i++)
        xh[i] = 1.0f;
    weight_t w = {.dtype = DTYPE_BF16, .rows = R, .cols = C, .data = wd};
    weight_t nw = {.dtype = DTYPE_F32, .rows = 1, .cols = C, .data = norm};
    ck_assert_int_eq(be->ops->weight_upload(be->ctx, &w), 0);
    float *x = be->ops->buf_alloc(be->ctx, N * C), *y = be->ops->buf_alloc(be->ctx, N * R);
    ck_assert(x && y);
    ck_assert_int_eq(be->ops->from_host(be->ctx, x, 0, xh, N * C), 0);

    ck_assert_int_eq(profile_attach(be), 0);
    ck_assert_ptr_ne(be->ops, cpu_ops);
    ck_assert_int_eq(profile_attach(be), RIVER_EINVAL);
    ck_assert_str_eq(be->ops->name, cpu_ops->name);
    ck_assert_ptr_null(be->ops->graph_begin); /* every op runs, one at a time */
    ck_assert_int_eq(backend_threads(be), 1);
    ck_assert_int_eq(profile_reset(be), 0);
    ck_assert_int_eq(be->ops->matmul(be->ctx, y, x, &w, 1), 0);
    ck_assert_int_eq(be->ops->matmul(be->ctx, y, x, &w, 1), 0);
    ck_assert_int_eq(be->ops->matmul(be->ctx, y, x, &w, 2), 0);
    ck_assert_int_eq(be->ops->rmsnorm(be->ctx, x, x, &nw, 1, C, 1e-5f), 0);
    ck_assert_int_eq(be->ops->to_host(be->ctx, yh, y, 0, 2 * R), 0);
    /* The wrapped op computed what the CPU's does: row r sums (k / C) over k. */
    ck_assert_float_eq_tol(yh[R + 5], (float)(C - 1) / 2.0f, 1e-4f);
    ck_assert_int_eq(profile_read(be, &rows, &n_rows, &window), 0);
    ck_assert_int_eq(n_rows, 4);
    double bytes = (double)R * C * 2, sum = 0;
    ck_assert_str_eq(rows[0].op, "matmul");
    ck_assert_int_eq(rows[0].dtype, w.dtype); /* as placed (bf16x8 on the SIMD levels) */
    ck_assert(rows[0].rows == R && rows[0].cols == C && rows[0].n == 1);
    ck_assert_int_eq(rows[0].calls, 2);
    ck_assert_double_eq(rows[0].bytes, 2 * bytes);
    ck_assert_str_eq(rows[1].op, "matmul");
    ck_assert(rows[1].n == 2 && rows[1].calls == 1 && rows[1].bytes == bytes);
    ck_assert_str_eq(rows[2].op, "rmsnorm");
    ck_assert(rows[2].dtype == DTYPE_COUNT && rows[2].calls == 1 && rows[2].bytes == 0);
    ck_assert_str_eq(rows[3].op, "to_host");
    for (int i = 0; i < n_rows; i++) {
        ck_assert(rows[i].seconds > 0);
        sum += rows[i].seconds;
    }
    ck_assert(window >= sum);

    /* Past PROFILE_MAX_ROWS groups the rest are summed in one row, "other". */
    ck_assert_int_eq(profile_reset(be), 0);
    ck_assert_int_eq(profile_read(be, &rows, &n_rows, &window), 0);
    ck_assert_int_eq(n_rows, 0);
    for (int n = 1; n <= N; n++)
        ck_assert_int_eq(be->ops->matmul(be->ctx, y, x, &w, n), 0);
    ck_assert_int_eq(profile_read(be, &rows, &n_rows, &window), 0);
    ck_assert_int_eq(n_rows, PROFILE_MAX_ROWS + 1);
    ck_assert_str_eq(rows[PROFILE_MAX_ROWS].op, "other");
    ck_assert_int_eq(rows[PROFILE_MAX_ROWS].calls, N - PROFILE_MAX_ROWS);

    profile_detach(be);
    ck_assert_ptr_eq(be->ops, cpu_ops);
    ck_assert_int_eq(profile_read(be, &rows, &n_rows, &window), RIVER_EINVAL);
    ck_assert_int_eq(be->ops->matmul(be->ctx, y, x, &w, 1), 0);
    /* A wrapped backend is destroyed with its wrapper (ASan sees any leak). */
    ck_assert_int_eq(profile_attach(be), 0);
    be->ops->buf_free(be->ctx, x);
    be->ops->buf_free(be->ctx, y);
    backend_destroy(&be);
    ck_assert_ptr_null(be);
    free(wd);
}
END_TEST

/* A backend that "uploads" every weight into memory of its own filled with a poison byte
 * pattern, the way a device backend moves weights away from the mapped file. Anything that
 * read weights through the placed model_t afterwards (a fingerprint, a river check) would
 * see the poison, not the checkpoint. */
typedef struct {
    backend_t be;
    ops_t ops;
    backend_t *cpu;
    int uploads;
    int null_uploads;
    void *owned[4096];
    int n_owned;
} poison_be_t;

static poison_be_t P;

static int poison_upload(ops_ctx_t *ctx, weight_t *w)
{
    (void)ctx;
    P.uploads++;
    if (!w->data) {
        P.null_uploads++;
        return 0;
    }
    ck_assert_int_lt(P.n_owned, 4096);
    size_t bytes = dtype_row_bytes(w->dtype, w->cols) * (size_t)w->rows;
    void *copy = malloc(bytes);
    ck_assert_ptr_nonnull(copy);
    memset(copy, 0x5a, bytes);
    P.owned[P.n_owned++] = copy;
    w->data = copy;
    return 0;
}

static void poison_setup(void)
{
    memset(&P, 0, sizeof P);
    ck_assert_int_eq(cpu_backend_new(&P.cpu, 1, CPU_SIMD_COUNT), 0);
    P.ops = *P.cpu->ops;
    P.ops.weight_upload = poison_upload;
    P.be.ops = &P.ops;
    P.be.ctx = P.cpu->ctx;
}

static void poison_teardown(void)
{
    for (int i = 0; i < P.n_owned; i++)
        free(P.owned[i]);
    cpu_backend_destroy(&P.cpu);
}

START_TEST(test_place_fingerprints)
{
    poison_setup();
    model_t *m = NULL, *ref = NULL;
    ck_assert_msg(model_load(&m, KJV) == 0, "%s", river_err_detail());
    ck_assert_msg(model_load(&ref, KJV) == 0, "%s", river_err_detail());
    char want[MODEL_FINGERPRINT_LEN], got[MODEL_FINGERPRINT_LEN];
    ck_assert_int_eq(model_fingerprint(ref, want), 0);

    ck_assert_msg(model_place(m, &P.be) == 0, "%s", river_err_detail());
    ck_assert_ptr_eq(m->backend, &P.be);
    /* embed, final_norm and 14 weights a layer; the tied head shares the table's copy. */
    int per_model = 2 + (m->lm_head.data == m->embed.data ? 0 : 1) + 14 * m->cfg.n_layers;
    ck_assert_int_eq(P.uploads, per_model);
    ck_assert_int_eq(((const unsigned char *)m->embed.data)[0], 0x5a);
    ck_assert_int_eq(((const unsigned char *)m->layers[3].wq.data)[7], 0x5a);

    /* The fingerprint is the file's, taken before the weights moved, and the model keeps
     * it for the river and router checks. */
    ck_assert_int_eq(model_fingerprint(m, got), 0);
    ck_assert_str_eq(got, want);
    ck_assert_str_eq(m->fingerprint, want);
    /* Placing twice is refused. */
    ck_assert_int_eq(model_place(m, &P.be), RIVER_ESTATE);

    /* A river built from the unplaced copy loads against the placed model (its fingerprint
     * matches) and lands on the same backend: seven matrices a layer and the head. */
    char path[512];
    snprintf(path, sizeof path, "%s/kjv-river.safetensors", test_tmpdir());
    exitriver_build_opts_t o = exitriver_build_opts_default();
    o.quant.method = QUANT_RTN;
    o.start_layer = 4;
    o.n_threads = 1;
    ck_assert_msg(exitriver_build(ref, path, &o, NULL) == 0, "%s", river_err_detail());
    int before = P.uploads;
    exitriver_t *r = NULL;
    ck_assert_msg(exitriver_load(&r, m, path) == 0, "%s", river_err_detail());
    ck_assert_int_eq(P.uploads - before, 7 * (m->cfg.n_layers - 4) + 1);
    const layer_weights_t *rl = exitriver_layer(r, 5);
    ck_assert_int_eq(((const unsigned char *)rl->wq.data)[0], 0x5a);
    /* Norms come from the placed model. */
    ck_assert_ptr_eq(rl->attn_norm.data, m->layers[5].attn_norm.data);
    ck_assert_ptr_eq(exitriver_head(r)->data, P.owned[P.n_owned - 1]);
    exitriver_destroy(&r);
    model_destroy(&m);
    model_destroy(&ref);
    poison_teardown();
}
END_TEST

/* Each half of a split pair places what it computes with: its layers' matrices, every
 * layer's norms and biases (the river shares them), the ends only when asked. */
START_TEST(test_place_layers)
{
    poison_setup();
    model_t *m = NULL;
    ck_assert_msg(model_load(&m, KJV) == 0, "%s", river_err_detail());
    const void *embed = m->embed.data, *wq0 = m->layers[0].wq.data;
    ck_assert_int_eq(model_place_layers(m, &P.be, 4, 8, 0), 0);
    ck_assert_int_eq(P.uploads, 7 * m->cfg.n_layers + 7 * 4);
    ck_assert_ptr_eq(m->embed.data, embed);
    ck_assert_ptr_eq(m->layers[0].wq.data, wq0);
    ck_assert_int_eq(((const unsigned char *)m->layers[0].attn_norm.data)[0], 0x5a);
    ck_assert_int_eq(((const unsigned char *)m->layers[5].w_down.data)[0], 0x5a);
    ck_assert_int_eq(((const unsigned char *)m->layers[11].ffn_norm.data)[0], 0x5a);
    ck_assert_ptr_ne(m->layers[8].wq.data, NULL);
    ck_assert(((const unsigned char *)m->layers[8].wq.data)[0] != 0x5a ||
              ((const unsigned char *)m->layers[8].wq.data)[1] != 0x5a);
    model_destroy(&m);
    poison_teardown();
}
END_TEST

START_TEST(test_engine_open)
{
    engine_env_t env;
    engine_opts_t o = {.model = STORIES, .want_tokenizer = 1, .device = "cpu"};
    ck_assert_msg(engine_open(&env, &o) == 0, "%s", river_err_detail());
    ck_assert_ptr_nonnull(env.tok);
    ck_assert_ptr_eq(env.model->backend, env.be);
    ck_assert_int_eq((int)strlen(env.model->fingerprint), MODEL_FINGERPRINT_LEN - 1);
    /* A model that fits the caches gets one thread unless asked. */
    ck_assert_int_eq(backend_threads(env.be), 1);
    offload_t *off = NULL;
    ck_assert_int_eq(offload_new(&off, env.model, 0.5, 1), 0);
    offload_destroy(&off);
    engine_close(&env);
    ck_assert_ptr_null(env.model);
    ck_assert_ptr_null(env.be);
    engine_close(&env); /* twice is fine */

    /* Each failure names its cause and leaves nothing open. */
    o.device = "gpu";
    ck_assert_int_eq(engine_open(&env, &o), RIVER_EINVAL);
    ck_assert_ptr_nonnull(strstr(river_err_detail(), "gpu"));
    ck_assert_ptr_null(env.model);
    o.device = NULL;
    o.tokenizer = TEST_DATA "/no-such-tokenizer.json";
    ck_assert_int_ne(engine_open(&env, &o), 0);
    ck_assert_ptr_null(env.model);
    ck_assert_ptr_null(env.be);

    /* Offloading needs to know where the weights are. */
    model_t *m = NULL;
    ck_assert_int_eq(model_load(&m, STORIES), 0);
    ck_assert_int_eq(offload_new(&off, m, 0.5, 1), RIVER_ESTATE);
    model_destroy(&m);
}
END_TEST

/* What the opaque backend is for: the caller's view of its memory faults on the host, while
 * the ops compute with it, and the ops refuse memory that was never given to the backend. */
START_TEST(test_opaque)
{
    backend_t *be = NULL;
    ck_assert_int_eq(opaque_backend_new(&be, 1, CPU_SIMD_COUNT), 0);
    backend_info_t bi;
    backend_get_info(be, &bi);
    ck_assert_str_eq(bi.name, "opaque");
    ck_assert_int_eq(bi.host_memory, 0);
    const ops_t *o = be->ops;
    float host[8] = {1, 2, 3, 4, 5, 6, 7, 8}, back[8] = {0};
    void *buf = o->buf_alloc(be->ctx, 8);
    ck_assert_ptr_nonnull(buf);
    ck_assert_int_eq(o->from_host(be->ctx, buf, 0, host, 8), 0);
    void *sum = o->buf_alloc(be->ctx, 8);
    ck_assert_int_eq(o->add(be->ctx, sum, buf, 8), 0);
    ck_assert_int_eq(o->add(be->ctx, sum, buf, 8), 0);
    ck_assert_int_eq(o->to_host(be->ctx, back, sum, 0, 8), 0);
    for (int i = 0; i < 8; i++)
        ck_assert(back[i] == 2 * host[i]);

    /* A host read of a buffer dies with SIGSEGV where it happens. */
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        /* The default action, so that a sanitizer's handler does not turn the fault into
         * an ordinary exit (where one insists, it still exits non-zero). */
        signal(SIGSEGV, SIG_DFL);
        volatile float x = ((volatile float *)buf)[1];
        (void)x;
        _exit(0);
    }
    int st = 0;
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    ck_assert_msg((WIFSIGNALED(st) && WTERMSIG(st) == SIGSEGV) ||
                  (WIFEXITED(st) && WEXITSTATUS(st) != 0), "a host read of an opaque buffer "
                  "did not fault (status %#x)", st);

    /* Host memory where the backend's is expected, and a weight never placed, are refused. */
    ck_assert_int_eq(o->add(be->ctx, host, buf, 8), RIVER_EDEVICE);
    ck_assert_ptr_nonnull(strstr(river_err_detail(), "add"));
    static const float wdata[8 * 8] = {0};
    weight_t w = {.dtype = DTYPE_F32, .rows = 8, .cols = 8, .data = wdata};
    ck_assert_int_eq(o->matmul(be->ctx, sum, buf, &w, 1), RIVER_EDEVICE);
    ck_assert_ptr_nonnull(strstr(river_err_detail(), "never placed"));
    /* Once placed, the same weight works, and its data is no longer the host copy. */
    ck_assert_int_eq(o->weight_upload(be->ctx, &w), 0);
    ck_assert_ptr_ne(w.data, wdata);
    ck_assert_int_eq(o->matmul(be->ctx, sum, buf, &w, 1), 0);
    ck_assert_int_eq(o->to_host(be->ctx, back, sum, 0, 8), 0);
    for (int i = 0; i < 8; i++)
        ck_assert(back[i] == 0.0f);
    o->buf_free(be->ctx, buf);
    o->buf_free(be->ctx, sum);
    backend_destroy(&be);
}
END_TEST

/* AnonHugePages (kB) of this process's mapping that holds p, from /proc/self/smaps (-1:
 * no such mapping); its file's path, "" for anonymous memory, goes to path. */
static long smaps_at(const void *p, char *path, size_t cap)
{
    FILE *f = fopen("/proc/self/smaps", "r");
    ck_assert_ptr_nonnull(f);
    char line[1024];
    unsigned long lo, hi;
    long kb, found = -1;
    int in = 0, name_at;
    path[0] = '\0';
    while (fgets(line, sizeof line, f)) {
        name_at = 0;
        if (sscanf(line, "%lx-%lx %*s %*s %*s %*s %n", &lo, &hi, &name_at) == 2 &&
            name_at > 0 && strchr(line, '-') < strchr(line, ' ')) {
            in = (uintptr_t)p >= lo && (uintptr_t)p < hi;
            if (in) {
                snprintf(path, cap, "%s", line + name_at);
                path[strcspn(path, "\n")] = '\0';
            }
        } else if (in && sscanf(line, "AnonHugePages: %ld kB", &kb) == 1) {
            found = kb;
        }
    }
    fclose(f);
    return found;
}

/* Whether transparent huge pages serve a region advised MADV_HUGEPAGE. */
static int thp_enabled(void)
{
    char buf[128] = "";
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    if (!f)
        return 0;
    if (!fgets(buf, sizeof buf, f))
        buf[0] = '\0';
    fclose(f);
    return strstr(buf, "[always]") || strstr(buf, "[madvise]");
}

/* y = W x on the backend for one row of x. */
static void matmul_host(backend_t *be, float *y, const float *x, const weight_t *w)
{
    const ops_t *o = be->ops;
    float *xd = o->buf_alloc(be->ctx, (size_t)w->cols), *yd = o->buf_alloc(be->ctx, (size_t)w->rows);
    ck_assert(xd && yd);
    ck_assert_int_eq(o->from_host(be->ctx, xd, 0, x, (size_t)w->cols), 0);
    ck_assert_int_eq(o->matmul(be->ctx, yd, xd, w, 1), 0);
    ck_assert_int_eq(o->to_host(be->ctx, y, yd, 0, (size_t)w->rows), 0);
    o->buf_free(be->ctx, xd);
    o->buf_free(be->ctx, yd);
}

/* The CPU copies a matrix of 2 MiB or more into huge pages at placement (decode streams
 * those faster than the file's small pages), bit for bit, its rows blocked where the SIMD
 * levels read that layout faster (rowblock.h), with the same products to the bit; smaller
 * ones, and every one of a backend told to keep weights mapped, are read in place. */
START_TEST(test_cpu_huge_copies)
{
    const int64_t R = 1024, C = 2048; /* 4 MiB of bf16 */
    size_t bytes = (size_t)(R * C) * sizeof(uint16_t);
    uint16_t *src = malloc(bytes), *keep = malloc(bytes);
    float *x = malloc(sizeof *x * (size_t)C), *y0 = malloc(sizeof *y0 * (size_t)R);
    float *y1 = malloc(sizeof *y1 * (size_t)R);
    ck_assert(src && keep && x && y0 && y1);
    test_rand_seed(11);
    for (int64_t i = 0; i < R * C; i++)
        src[i] = f32_to_bf16(test_rand(-1.0f, 1.0f));
    for (int64_t i = 0; i < C; i++)
        x[i] = test_rand(-1.0f, 1.0f);
    memcpy(keep, src, bytes);
    const weight_t w0 = {.dtype = DTYPE_BF16, .rows = R, .cols = C, .data = src};

    backend_t *be = NULL;
    ck_assert_int_eq(backend_open(&be, "cpu", 2, BACKEND_WEIGHTS_COPY), 0);
    const ops_t *o = be->ops;
    weight_t w = w0;
    ck_assert_int_eq(o->weight_upload(be->ctx, &w), 0);
    ck_assert_ptr_ne(w.data, src);
    ck_assert_uint_eq((uintptr_t)w.data % ((uintptr_t)2 << 20), 0);
    if (cpu_backend_simd(be) >= CPU_SIMD_AVX2) {
        ck_assert_int_eq(w.dtype, DTYPE_BF16X8);
        size_t rb = (size_t)C * sizeof(uint16_t);
        for (int64_t r = 0; r < R; r++)
            for (size_t b = 0; b < rb; b += CPU_ROWBLOCK_CHUNK)
                ck_assert(memcmp(cpu_rowblock_at(w.data, rb, r, b),
                                 (const uint8_t *)keep + (size_t)r * rb + b,
                                 CPU_ROWBLOCK_CHUNK) == 0);
    } else {
        ck_assert(memcmp(w.data, keep, bytes) == 0);
    }
    /* The source's pages were handed back: the caller's memory keeps its bytes. */
    ck_assert(memcmp(src, keep, bytes) == 0);
    char path[512];
    long huge = smaps_at(w.data, path, sizeof path);
    ck_assert_str_eq(path, "");
    printf("cpu copy of a 4 MiB bf16 matrix: %ld kB in huge pages\n", huge);
    if (thp_enabled())
        ck_assert_int_gt(huge, 0);
    matmul_host(be, y0, x, &w0);
    matmul_host(be, y1, x, &w);
    ck_assert(memcmp(y0, y1, sizeof *y0 * (size_t)R) == 0);
    /* The copy placed again (a tied head shares the table's): no second copy. */
    weight_t tied = w;
    ck_assert_int_eq(o->weight_upload(be->ctx, &tied), 0);
    ck_assert_ptr_eq(tied.data, w.data);
    /* Offloading cannot release a copy, and is told so. */
    ck_assert_int_eq(o->weight_residency(be->ctx, &w, 0), RIVER_EUNSUPPORTED);
    ck_assert_msg(strstr(river_err_detail(), "kept mapped"), "%s", river_err_detail());
    /* Under 2 MiB and of rows that make no whole 8-row blocks: read in place; whole
     * blocks are copied into the row-blocked layout at any size. */
    weight_t small = w0;
    small.rows = (int64_t)(((size_t)2 << 20) / ((size_t)C * sizeof(uint16_t))) - 1;
    ck_assert_int_eq(o->weight_upload(be->ctx, &small), 0);
    ck_assert_ptr_eq(small.data, src);
    small = w0;
    small.rows = 8;
    ck_assert_int_eq(o->weight_upload(be->ctx, &small), 0);
    if (cpu_backend_simd(be) >= CPU_SIMD_AVX2)
        ck_assert(small.data != src && small.dtype == DTYPE_BF16X8);
    backend_destroy(&be);

    ck_assert_int_eq(backend_open(&be, "cpu", 2, BACKEND_WEIGHTS_MAPPED), 0);
    w = w0;
    ck_assert_int_eq(be->ops->weight_upload(be->ctx, &w), 0);
    ck_assert_ptr_eq(w.data, src);
    ck_assert_int_eq(be->ops->weight_residency(be->ctx, &w, 1), 0);
    backend_destroy(&be);

    ck_assert_int_eq(opaque_backend_new(&be, 1, CPU_SIMD_COUNT), 0);
    ck_assert_int_eq(cpu_backend_keep_mapped(be), RIVER_EINVAL);
    backend_destroy(&be);
    free(src);
    free(keep);
    free(x);
    free(y0);
    free(y1);
}
END_TEST

typedef struct {
    int32_t ids[16];
    int n;
} ids_t;

static void ids_collect(void *user, const gen_event_t *ev)
{
    ids_t *o = user;
    if (ev->id >= 0 && o->n < 16)
        o->ids[o->n++] = ev->id;
}

/* Greedy ids of a fixed prompt on a model opened with its weights copied or kept mapped. */
static void generate_opened(const char *dir, backend_weights_t weights, ids_t *out,
                            int *in_file, int *releasable)
{
    engine_env_t env;
    engine_opts_t eo = {.model = dir, .threads = 2, .weights = weights};
    ck_assert_msg(engine_open(&env, &eo) == 0, "%s", river_err_detail());
    /* The tied 32000 x 288 table (18 MiB): a copy in huge pages, or the file's. */
    ck_assert_ptr_eq(env.model->lm_head.data, env.model->embed.data);
    char path[512];
    (void)smaps_at(env.model->embed.data, path, sizeof path);
    *in_file = strstr(path, "model.safetensors") != NULL;
    if (!*in_file)
        ck_assert_uint_eq((uintptr_t)env.model->embed.data % ((uintptr_t)2 << 20), 0);
    *releasable = env.be->ops->weight_residency(env.be->ctx, &env.model->embed, 1) == 0;
    gen_t *g = NULL;
    gen_config_t gc = {.max_rows = 8, .prefill_chunk = 8, .page_size = 16, .max_seqs = 1};
    ck_assert_int_eq(gen_new(&g, env.model, NULL, env.be, &gc), 0);
    int32_t prompt[4] = {1, 400, 2000, 31000};
    memset(out, 0, sizeof *out);
    gen_request_t req = {.prompt = prompt, .n_prompt = 4, .max_tokens = 12, .ignore_eos = 1,
                         .on_token = ids_collect, .user = out};
    int seq;
    ck_assert_int_eq(gen_submit(g, &req, &seq), 0);
    ck_assert_int_eq(gen_run_all(g), 0);
    ck_assert_int_eq(out->n, 12);
    gen_destroy(&g);
    engine_close(&env);
}

/* A model whose embedding table is over 2 MiB (stories15M's shape in bf16) decodes the
 * same ids from the backend's huge-page copy as from the mapped file; only the mapped one
 * can be released. */
START_TEST(test_engine_weights_copied)
{
    char dir[512];
    snprintf(dir, sizeof dir, "%s/synth-stories15M", test_tmpdir());
    synth_opts_t so = {.shape = "stories15M", .dtype = DTYPE_BF16, .out_dir = dir, .seed = 3};
    ck_assert_msg(synth_write(&so) == 0, "%s", river_err_detail());
    ids_t copied, mapped;
    int file_c, file_m, rel_c, rel_m;
    generate_opened(dir, BACKEND_WEIGHTS_COPY, &copied, &file_c, &rel_c);
    generate_opened(dir, BACKEND_WEIGHTS_MAPPED, &mapped, &file_m, &rel_m);
    ck_assert_int_eq(file_c, 0);
    ck_assert_int_eq(rel_c, 0);
    ck_assert_int_eq(file_m, 1);
    ck_assert_int_eq(rel_m, 1);
    for (int i = 0; i < 12; i++)
        ck_assert_msg(copied.ids[i] == mapped.ids[i], "token %d: %d from the copy, %d mapped",
                      i, copied.ids[i], mapped.ids[i]);
}
END_TEST

static Suite *backend_suite(void)
{
    Suite *s = suite_create("backend");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_device_names);
    tcase_add_test(tc, test_cpu_info);
    tcase_add_test(tc, test_meminfo_cgroups);
    tcase_add_test(tc, test_profile);
    tcase_add_test(tc, test_host_peer_unsupported);
    tcase_add_test(tc, test_place_fingerprints);
    tcase_add_test(tc, test_place_layers);
    tcase_add_test(tc, test_engine_open);
    tcase_add_test(tc, test_opaque);
    tcase_add_test(tc, test_cpu_huge_copies);
    tcase_add_test(tc, test_engine_weights_copied);
    suite_add_tcase(s, tc);
    return s;
}

RIVER_TEST_MAIN(backend_suite)
