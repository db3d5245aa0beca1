/* The backend boundary as the engine uses it: device names, what a backend says about
 * itself, and placing a model and its river through ops->weight_upload, so that nothing
 * after placement reads the weights where the loader mapped them. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/err.h"
#include "engine/engine_open.h"
#include "engine/offload.h"
#include "engine/river.h"
#include "engine/router.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu.h"
#include "kernels/opaque/opaque.h"
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
    e = backend_open(&be, "cuda:0", 0);
    if (e) {
        ck_assert_int_eq(e, RIVER_EDEVICE);
        ck_assert_ptr_null(be);
    } else {
        backend_info_t bi;
        backend_get_info(be, &bi);
        ck_assert_int_eq(bi.host_memory, 0);
        ck_assert_int_eq(bi.device, 0);
        backend_destroy(&be);
    }
#else
    ck_assert_int_eq(e, RIVER_EUNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(river_err_detail(), "CUDA"));
#endif
}
END_TEST

START_TEST(test_cpu_info)
{
    backend_t *be = NULL;
    ck_assert_int_eq(backend_open(&be, NULL, 2), 0);
    backend_info_t bi;
    backend_get_info(be, &bi);
    ck_assert_str_eq(bi.name, "cpu");
    ck_assert_str_eq(bi.variant, cpu_simd_name(cpu_simd_detect()));
    ck_assert_int_eq(bi.threads, 2);
    ck_assert_int_eq(bi.device, -1);
    ck_assert_int_eq(bi.host_memory, 1);
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
    char want[RIVER_FINGERPRINT_LEN], got[RIVER_FINGERPRINT_LEN];
    ck_assert_int_eq(river_fingerprint(ref, want), 0);
    uint64_t want_router = router_model_fingerprint(ref);

    ck_assert_msg(model_place(m, &P.be) == 0, "%s", river_err_detail());
    ck_assert_ptr_eq(m->backend, &P.be);
    /* embed, final_norm and 14 weights a layer; the tied head shares the table's copy. */
    int per_model = 2 + (m->lm_head.data == m->embed.data ? 0 : 1) + 14 * m->cfg.n_layers;
    ck_assert_int_eq(P.uploads, per_model);
    ck_assert_int_eq(((const unsigned char *)m->embed.data)[0], 0x5a);
    ck_assert_int_eq(((const unsigned char *)m->layers[3].wq.data)[7], 0x5a);

    /* The fingerprints are the file's, taken before the weights moved. */
    ck_assert_int_eq(river_fingerprint(m, got), 0);
    ck_assert_str_eq(got, want);
    ck_assert_uint_eq(router_model_fingerprint(m), want_router);
    /* Placing twice is refused. */
    ck_assert_int_eq(model_place(m, &P.be), RIVER_ESTATE);

    /* A river built from the unplaced copy loads against the placed model (its fingerprint
     * matches) and lands on the same backend: seven matrices a layer and the head. */
    char path[512];
    snprintf(path, sizeof path, "%s/kjv-river.safetensors", test_tmpdir());
    river_build_opts_t o = river_build_opts_default();
    o.quant.method = QUANT_RTN;
    o.start_layer = 4;
    o.n_threads = 1;
    ck_assert_msg(river_build(ref, path, &o, NULL) == 0, "%s", river_err_detail());
    int before = P.uploads;
    river_t *r = NULL;
    ck_assert_msg(river_load(&r, m, path) == 0, "%s", river_err_detail());
    ck_assert_int_eq(P.uploads - before, 7 * (m->cfg.n_layers - 4) + 1);
    const layer_weights_t *rl = river_layer(r, 5);
    ck_assert_int_eq(((const unsigned char *)rl->wq.data)[0], 0x5a);
    /* Norms come from the placed model. */
    ck_assert_ptr_eq(rl->attn_norm.data, m->layers[5].attn_norm.data);
    ck_assert_ptr_eq(river_head(r)->data, P.owned[P.n_owned - 1]);
    river_destroy(&r);
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
    ck_assert_int_eq((int)strlen(env.model->fingerprint), RIVER_FINGERPRINT_LEN - 1);
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

static Suite *backend_suite(void)
{
    Suite *s = suite_create("backend");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_device_names);
    tcase_add_test(tc, test_cpu_info);
    tcase_add_test(tc, test_place_fingerprints);
    tcase_add_test(tc, test_place_layers);
    tcase_add_test(tc, test_engine_open);
    tcase_add_test(tc, test_opaque);
    suite_add_tcase(s, tc);
    return s;
}

RIVER_TEST_MAIN(backend_suite)
