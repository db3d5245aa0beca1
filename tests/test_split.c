/* The split pair as processes (workers/pair.h): a real backbone worker and a
 * real river worker on kjv-12l (12 layers) with the boundary at layer 6, sharing one KV
 * pool, against one role-full worker with the same configuration. This test plays riverd
 * with a ZMQ ROUTER as tests/test_worker.c does (both use tests/fakerd.h), and plays a
 * river worker itself to check the backbone's side of the protocol: refused hellos,
 * layers computed bit for bit as in this process, round-trip times, liveness.
 * The engine's seams (a shared pool mapped twice, a remote for the deep layers) are
 * checked in this process first. The engine seam and the pair against one full worker run
 * on kjv-12l as shipped and on its q8 and q4 quantized backbones (tests/testutil.h). */
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <zmq.h>

#include "common/clock.h"
#include "common/err.h"
#include "common/frame.h"
#include "engine/forward.h"
#include "engine/generate.h"
#include "engine/kv_pool.h"
#include "engine/exitriver.h"
#include "kernels/cpu/cpu.h"
#include "model/fingerprint.h"
#include "offline/exitriver_build.h"
#include "proto/river_pair.pb-c.h"
#include "tests/fakerd.h"
#include "tests/proc.h"
#include "tests/testutil.h"
#include "workers/pair_transport.h"

#define KJV_SOURCE TEST_DATA "/kjv-12l"
/* The model of the current test: kjv-12l as shipped, or a quantized copy of it (the loop
 * tests set it from their index, split_model). */
static const char *kjv_model = KJV_SOURCE;
#define KJV kjv_model

/* Index 0: kjv-12l; 1: its q8 backbone; 2: its q4 backbone (built in the test's temp dir). */
static void split_model(int i)
{
    kjv_model = i == 0 ? KJV_SOURCE : test_quant_backbone(KJV_SOURCE, i == 1 ? "q8" : "q4");
}
#define BOUNDARY 6
#define MAX_IDS 400
/* Cosine threshold that, on kjv-12l with an 8-bit river and min aggregation over three
 * decoding rows, exits tokens both before and after layer 6. */
#define TAU "0.95"

/* A backbone worker at endpoint with `threads` threads and split.transport `transport`
 * (NULL: the default). */
static pid_t start_backbone_on(const char *endpoint, int threads, const char *transport)
{
    static int n;
    char cfg[1024], name[64], tr[64] = "";
    if (transport)
        snprintf(tr, sizeof tr, "  transport: %s\n", transport);
    snprintf(cfg, sizeof cfg,
             "model: %s\nrole: backbone\nthreads: %d\nlog_level: %s\n%s"
             "split:\n  boundary: %d\n  peer: \"%s\"\n%s",
             KJV, threads, getenv("WORKER_LOG") ? getenv("WORKER_LOG") : "warn",
             test_device_yaml(), BOUNDARY, endpoint, tr);
    snprintf(name, sizeof name, "backbone-%d.yaml", n++);
    return wk_spawn(name, cfg, "bb", NULL, NULL);
}

static pid_t start_backbone(const char *endpoint, int threads)
{
    return start_backbone_on(endpoint, threads, NULL);
}

/* Bytes of kjv-12l's checkpoint resident in process pid (its smaps). */
static long model_rss_kb(pid_t pid)
{
    char path[64], line[1024];
    snprintf(path, sizeof path, "/proc/%d/smaps", (int)pid);
    FILE *f = fopen(path, "r");
    ck_assert_ptr_nonnull(f);
    long total = 0, kb;
    int in = 0;
    unsigned long lo, hi;
    /* The mapping of the current model's checkpoint file: "<its directory>/model.safetensors". */
    char file[300];
    const char *base = strrchr(KJV, '/');
    snprintf(file, sizeof file, "%s/model.safetensors", base ? base + 1 : KJV);
    while (fgets(line, sizeof line, f)) {
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' '))
            in = strstr(line, file) != NULL;
        else if (in && sscanf(line, "Rss: %ld kB", &kb) == 1)
            total += kb;
    }
    fclose(f);
    return total;
}

/* ---- riverd's end of a worker link (tests/fakerd.h) ---- */

/* Starts a worker on the base configuration plus `extra`, waits for its Ready (of `role`)
 * and welcomes it. */
static void wk_start(wk_t *w, const char *extra, River__Worker__Role role)
{
    River__Worker__WorkerMessage *m = wk_launch(w, KJV, 4, extra, 0);
    ck_assert_int_eq(m->ready->role, role);
    frame_free((ProtobufCMessage **)&m);
    wk_welcome(w, 100, 50);
}

/* A text prompt of max_tokens, ignoring EOS. */
static void wk_submit_text(wk_t *w, uint64_t id, const char *text, uint32_t max_tokens)
{
    wk_submit(w, &(req_t){.id = id, .text = text, .max_tokens = max_tokens, .ignore_eos = 1});
}

typedef struct stream {
    uint64_t id;
    int32_t ids[MAX_IDS];
    int32_t layers[MAX_IDS];
    size_t n;
    int ended; /* 1: Done, 2: Failed */
    int code;
    char message[512];
} stream_t;

static int stream_take(stream_t *streams, int n_streams, const River__Worker__WorkerMessage *m)
{
    for (int i = 0; i < n_streams; i++) {
        stream_t *st = &streams[i];
        if (m->kind_case == RIVER__WORKER__WORKER_MESSAGE__KIND_TOKENS &&
            m->tokens->request_id == st->id) {
            ck_assert_int_eq(st->ended, 0);
            ck_assert_uint_eq(m->tokens->n_exit_layers, m->tokens->n_ids);
            for (size_t k = 0; k < m->tokens->n_ids && st->n < MAX_IDS; k++) {
                st->layers[st->n] = m->tokens->exit_layers[k];
                st->ids[st->n++] = m->tokens->ids[k];
            }
            return 1;
        }
        if (m->kind_case == RIVER__WORKER__WORKER_MESSAGE__KIND_DONE &&
            m->done->request_id == st->id) {
            ck_assert_int_eq(st->ended, 0);
            st->ended = 1;
            return 1;
        }
        if (m->kind_case == RIVER__WORKER__WORKER_MESSAGE__KIND_FAILED &&
            m->failed->request_id == st->id) {
            ck_assert_int_eq(st->ended, 0);
            st->ended = 2;
            st->code = m->failed->error->code;
            snprintf(st->message, sizeof st->message, "%s", m->failed->error->message);
            return 1;
        }
    }
    return 0;
}

/* Receives until every stream ended (or, with until_tokens > 0, until the first stream
 * has that many tokens). */
static void streams_collect(wk_t *w, stream_t *streams, int n_streams, int timeout_ms,
                            size_t until_tokens)
{
    int64_t end = clock_now_ms() + timeout_ms;
    for (;;) {
        int open = 0;
        for (int i = 0; i < n_streams; i++)
            open += !streams[i].ended;
        if (!open || (until_tokens && streams[0].n >= until_tokens))
            return;
        int left = (int)(end - clock_now_ms());
        River__Worker__WorkerMessage *m = wk_recv(w, left > 0 ? left : 0);
        ck_assert_msg(m != NULL, "streams not ended within %d ms", timeout_ms);
        if (m->kind_case != RIVER__WORKER__WORKER_MESSAGE__KIND_HEARTBEAT)
            ck_assert_msg(stream_take(streams, n_streams, m), "unexpected %s",
                          frame_case_name(&m->base));
        frame_free((ProtobufCMessage **)&m);
    }
}

static const char *prompts[] = {
    "And the LORD spake unto Moses, saying,",
    "In the beginning God created",
    "Blessed are the",
};
#define N_PROMPTS 3
#define N_TOKENS 40

/* Runs the prompts one after another, each alone in its batches: under min aggregation a
 * batch's rows exit together, so the tokens depend on which requests share a batch, and
 * requests sent together may or may not be admitted together (a worker resumed after
 * SIGSTOP can start a step before ZMQ has delivered all of them). One at a time, the
 * batches are the same in every run; the prompt's prefill still sends the backbone many
 * rows per layer. */
static void run_prompts(wk_t *w, stream_t *st, uint64_t first_id)
{
    memset(st, 0, sizeof *st * N_PROMPTS);
    for (int i = 0; i < N_PROMPTS; i++) {
        st[i].id = first_id + (uint64_t)i;
        wk_submit_text(w, st[i].id, prompts[i], N_TOKENS);
        streams_collect(w, &st[i], 1, 30000, 0);
        ck_assert_msg(st[i].ended == 1, "request %d failed: %s", i, st[i].message);
        ck_assert_uint_eq(st[i].n, N_TOKENS);
    }
}

static void build_river(char *path, size_t cap)
{
    snprintf(path, cap, "%s/kjv-river-q8-rtn.safetensors", test_tmpdir());
    model_t *m;
    ck_assert_msg(model_load(&m, KJV) == 0, "%s", river_err_detail());
    exitriver_build_opts_t o = exitriver_build_opts_default();
    o.quant.bits = 8;
    o.quant.method = QUANT_RTN;
    o.start_layer = 1;
    o.n_threads = 1;
    ck_assert_msg(exitriver_build(m, path, &o, NULL) == 0, "%s", river_err_detail());
    model_destroy(&m);
}

/* ---- Playing the river worker against a backbone ---- */

typedef struct fake_river {
    void *ctx, *sock;
    model_t *m;
    backend_t *be;
    kv_pool_t *kv;   /* the shared pool this process offers */
    int memfd;
    void *stage;     /* a p2p staging buffer for 64 rows, as a river makes it; NULL: none */
    shared_handle_t stage_h;
    char fingerprint[MODEL_FINGERPRINT_LEN];
    char backend[64];
} fake_river_t;

typedef struct hello_opts {
    uint32_t protocol, boundary, threads, kv_dim, n_pages, heartbeat_ms, liveness;
    const char *fingerprint;
    const char *kv_dtype; /* the pool's element type the hello claims */
    /* The transport offered (0: zmq) and beside it (0: none; p2p: with the staging buffer
     * the fake river made), and the device named ("": the backend's). */
    pair_transport_kind_t transport, transport_alt;
    const char *device_uuid;
} hello_opts_t;

static hello_opts_t hello_default(const fake_river_t *r)
{
    return (hello_opts_t){.protocol = 1, .boundary = BOUNDARY,
                          .threads = (uint32_t)backend_threads(r->be),
                          .kv_dim = (uint32_t)kv_pool_view(r->kv)->kv_dim,
                          .n_pages = (uint32_t)kv_pool_total_pages(r->kv),
                          .heartbeat_ms = 1000, .liveness = 3, .fingerprint = r->fingerprint,
                          .kv_dtype = dtype_name(kv_pool_dtype(r->kv))};
}

static void *fr_socket(fake_river_t *r, const char *endpoint)
{
    void *s = zmq_socket(r->ctx, ZMQ_DEALER);
    ck_assert_ptr_nonnull(s);
    int zero = 0;
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
    ck_assert_int_eq(zmq_connect(s, endpoint), 0);
    return s;
}

static void fr_send(void *sock, River__Pair__RiverMessage *env)
{
    size_t n = river__pair__river_message__get_packed_size(env);
    uint8_t *buf = malloc(n ? n : 1);
    ck_assert_ptr_nonnull(buf);
    river__pair__river_message__pack(env, buf);
    ck_assert_int_eq(zmq_send(sock, buf, n, 0), (int)n);
    free(buf);
}

static River__Pair__BackboneMessage *fr_recv(void *sock, int timeout_ms)
{
    zmq_pollitem_t it = {.socket = sock, .events = ZMQ_POLLIN};
    int rc = zmq_poll(&it, 1, timeout_ms);
    ck_assert_int_ge(rc, 0);
    if (rc == 0)
        return NULL;
    zmq_msg_t m;
    zmq_msg_init(&m);
    ck_assert_int_ge(zmq_msg_recv(&m, sock, 0), 0);
    River__Pair__BackboneMessage *bm =
        river__pair__backbone_message__unpack(NULL, zmq_msg_size(&m), zmq_msg_data(&m));
    zmq_msg_close(&m);
    ck_assert_ptr_nonnull(bm);
    return bm;
}

static void fr_hello(fake_river_t *r, void *sock, const hello_opts_t *o)
{
    River__Pair__KvGeometry kv = RIVER__PAIR__KV_GEOMETRY__INIT;
    const kv_view_t *v = kv_pool_view(r->kv);
    kv.n_layers = 12;
    kv.kv_dim = o->kv_dim;
    kv.page_size = (uint32_t)v->page_size;
    kv.n_pages = o->n_pages;
    kv.dtype = (char *)o->kv_dtype;
    kv.bytes = kv_pool_shared_bytes(12, (int)o->kv_dim, kv_pool_dtype(r->kv), v->page_size,
                                    (int)o->n_pages);
    River__Pair__PairHello h = RIVER__PAIR__PAIR_HELLO__INIT;
    h.protocol = o->protocol;
    h.river_id = "test";
    h.river_pid = (uint32_t)getpid();
    h.memfd = r->memfd;
    h.kv = &kv;
    h.fingerprint = (char *)o->fingerprint;
    h.boundary = o->boundary;
    h.backend = r->backend;
    h.threads = o->threads;
    h.max_rows = 64;
    h.heartbeat_ms = o->heartbeat_ms;
    h.liveness = o->liveness;
    /* The pool as the backend shares it: a memfd on the host, an IPC handle on a GPU. */
    const shared_handle_t *sh = kv_pool_shared_handle(r->kv);
    h.kv_kind = (uint32_t)sh->kind;
    if (sh->kind == SHARED_CUDA_IPC) {
        h.kv_ipc.data = (uint8_t *)sh->ipc;
        h.kv_ipc.len = sizeof sh->ipc;
    }
    backend_info_t bi;
    backend_get_info(r->be, &bi);
    h.device_uuid = (char *)(o->device_uuid ? o->device_uuid : bi.uuid);
    h.transport = (uint32_t)o->transport;
    h.transport_alt = (uint32_t)o->transport_alt;
    if (o->transport == PAIR_TRANSPORT_P2P || o->transport_alt == PAIR_TRANSPORT_P2P) {
        ck_assert_ptr_nonnull(r->stage);
        h.stage_kind = (uint32_t)r->stage_h.kind;
        h.stage_bytes = r->stage_h.bytes;
        h.stage_fd = r->stage_h.fd;
        if (r->stage_h.kind == SHARED_CUDA_IPC) {
            h.stage_ipc.data = r->stage_h.ipc;
            h.stage_ipc.len = sizeof r->stage_h.ipc;
        }
    }
    if (o->transport == PAIR_TRANSPORT_NCCL) {
        static uint8_t id[OPS_PEER_ID_BYTES]; /* never joined: the test only pairs */
        h.nccl_id.data = id;
        h.nccl_id.len = sizeof id;
    }
    River__Pair__RiverMessage env = RIVER__PAIR__RIVER_MESSAGE__INIT;
    env.kind_case = RIVER__PAIR__RIVER_MESSAGE__KIND_HELLO;
    env.hello = &h;
    fr_send(sock, &env);
}

/* The backbone's answer must be PairError whose message contains `want`. */
static void expect_error(void *sock, const char *want)
{
    River__Pair__BackboneMessage *bm = fr_recv(sock, 5000);
    ck_assert_msg(bm != NULL, "no answer (want an error about '%s')", want);
    ck_assert_msg(bm->kind_case == RIVER__PAIR__BACKBONE_MESSAGE__KIND_ERROR,
                  "got message kind %d, want an error about '%s'", bm->kind_case, want);
    ck_assert_msg(strstr(bm->error->message, want), "error '%s' does not mention '%s'",
                  bm->error->message, want);
    river__pair__backbone_message__free_unpacked(bm, NULL);
}

/* Returns the transport the backbone took (PairHelloOk.transport). */
static uint32_t expect_hello_ok(void *sock)
{
    River__Pair__BackboneMessage *bm = fr_recv(sock, 5000);
    ck_assert_ptr_nonnull(bm);
    ck_assert_msg(bm->kind_case == RIVER__PAIR__BACKBONE_MESSAGE__KIND_HELLO_OK, "%s",
                  bm->kind_case == RIVER__PAIR__BACKBONE_MESSAGE__KIND_ERROR
                      ? bm->error->message : "not HelloOk");
    ck_assert_uint_eq(bm->hello_ok->layer_begin, BOUNDARY);
    ck_assert_uint_eq(bm->hello_ok->layer_end, 12);
    ck_assert_uint_gt(bm->hello_ok->backbone_pid, 0);
    uint32_t kind = bm->hello_ok->transport;
    river__pair__backbone_message__free_unpacked(bm, NULL);
    return kind;
}

/* Sends one layer request and waits for its reply into out; returns the PairError message
 * (static) or NULL on success. */
static const char *fr_layer(void *sock, uint64_t seq, int layer, int n, const int32_t *pos,
                            const int32_t *table, uint32_t table_len, const float *x, float *out,
                            int dim)
{
    static char err[512];
    uint32_t row_table[64] = {0};
    River__Pair__LayerRequest q = RIVER__PAIR__LAYER_REQUEST__INIT;
    q.seq = seq;
    q.layer = (uint32_t)layer;
    q.n = (uint32_t)n;
    q.n_pos = (size_t)n;
    q.pos = (int32_t *)pos;
    q.n_row_table = (size_t)n;
    q.row_table = row_table;
    q.n_table_len = 1;
    q.table_len = &table_len;
    q.n_pages = table_len;
    q.pages = (int32_t *)table;
    q.hidden.len = (size_t)n * (size_t)dim * sizeof(float);
    q.hidden.data = (uint8_t *)x;
    River__Pair__RiverMessage env = RIVER__PAIR__RIVER_MESSAGE__INIT;
    env.kind_case = RIVER__PAIR__RIVER_MESSAGE__KIND_LAYER;
    env.layer = &q;
    fr_send(sock, &env);
    River__Pair__BackboneMessage *bm = fr_recv(sock, 5000);
    ck_assert_ptr_nonnull(bm);
    const char *ret = NULL;
    if (bm->kind_case == RIVER__PAIR__BACKBONE_MESSAGE__KIND_ERROR) {
        /* 0: the error is about the pairing, not this request. */
        ck_assert(bm->error->seq == seq || bm->error->seq == 0);
        snprintf(err, sizeof err, "%s", bm->error->message);
        ret = err;
    } else {
        ck_assert_int_eq(bm->kind_case, RIVER__PAIR__BACKBONE_MESSAGE__KIND_LAYER);
        ck_assert_uint_eq(bm->layer->seq, seq);
        ck_assert_uint_eq(bm->layer->hidden.len, q.hidden.len);
        memcpy(out, bm->layer->hidden.data, q.hidden.len);
    }
    river__pair__backbone_message__free_unpacked(bm, NULL);
    return ret;
}

static void fr_open(fake_river_t *r, int n_pages)
{
    memset(r, 0, sizeof *r);
    ck_assert_msg(model_load(&r->m, KJV) == 0, "%s", river_err_detail());
    test_backend_open(&r->be, 1, CPU_SIMD_COUNT, r->m);
    ck_assert_int_eq(model_fingerprint(r->m, r->fingerprint), 0);
    backend_describe(r->be, r->backend, sizeof r->backend);
    const model_config_t *c = &r->m->cfg;
    /* Of kv.dtype auto, as the backbone worker's default. */
    ck_assert_msg(kv_pool_new_shared(&r->kv, r->be, c->n_layers, c->n_kv_heads * c->head_dim,
                                     gen_kv_dtype(r->m, GEN_KV_AUTO), 16, n_pages,
                                     &r->memfd) == 0, "%s", river_err_detail());
    r->ctx = zmq_ctx_new();
    ck_assert_ptr_nonnull(r->ctx);
}

/* The staging buffer a river side of the p2p transport makes, for the hello's 64 rows. */
static void fr_stage(fake_river_t *r)
{
    size_t bytes = (size_t)64 * (size_t)r->m->cfg.dim * sizeof(float);
    r->stage = r->be->ops->shared_alloc(r->be->ctx, bytes, &r->stage_h);
    ck_assert_msg(r->stage != NULL, "%s", river_err_detail());
}

static void fr_close(fake_river_t *r)
{
    if (r->stage)
        r->be->ops->shared_free(r->be->ctx, r->stage, &r->stage_h, 1);
    zmq_ctx_term(r->ctx);
    kv_pool_destroy(&r->kv);
    backend_destroy(&r->be);
    model_destroy(&r->m);
}

/* ---- The engine's seams, in this process ---- */

/* The remote of the in-process seam test: a second forward on a second mapping of the
 * same shared pool, as the backbone worker has. */
typedef struct seam {
    forward_t *f;
    kv_pool_t *kv;
    int calls, rows, min_layer;
} seam_t;

static int seam_run(void *user, int layer, int n, const int32_t *pos,
                    const int32_t *const *page_table, float *x)
{
    seam_t *sm = user;
    sm->calls++;
    sm->rows += n;
    if (layer < sm->min_layer)
        sm->min_layer = layer;
    return forward_layer_rows(sm->f, sm->kv, layer, n, pos, page_table, x);
}

typedef struct seq_out {
    int32_t ids[64], depth[64];
    int n;
} seq_out_t;

static void seam_on_token(void *user, const gen_event_t *ev)
{
    seq_out_t *o = user;
    if (ev->id >= 0 && o->n < 64) {
        o->depth[o->n] = ev->depth;
        o->ids[o->n++] = ev->id;
    }
}

/* Three sequences at once through gen_t, with or without the remote; returns the step
 * error. */
static int seam_generate(model_t *m, backend_t *be, kv_pool_t *pool, const fwd_remote_t *r,
                         const exit_config_t *ex, seq_out_t out[3])
{
    gen_config_t c = {.max_rows = 256, .prefill_chunk = 8, .page_size = 16, .max_seqs = 3,
                      .n_pages = 16, .kv_pool = pool};
    gen_t *g;
    ck_assert_msg(gen_new(&g, m, NULL, be, &c) == 0, "%s", river_err_detail());
    ck_assert_msg(gen_set_exit(g, ex) == 0, "%s", river_err_detail());
    if (r)
        ck_assert_int_eq(forward_set_remote(gen_forward(g), r), 0);
    static const int32_t prompts_ids[3][12] = {
        {1, 400, 52, 9, 77, 310, 45, 1200, 8, 19, 600, 33},
        {1, 90, 91, 92},
        {1, 1500, 7, 7, 7, 250, 13},
    };
    static const size_t lens[3] = {12, 4, 7};
    memset(out, 0, sizeof *out * 3);
    for (int i = 0; i < 3; i++) {
        gen_request_t q = {.prompt = prompts_ids[i], .n_prompt = lens[i], .max_tokens = 30,
                           .ignore_eos = 1, .on_token = seam_on_token, .user = &out[i]};
        int seq;
        ck_assert_int_eq(gen_submit(g, &q, &seq), 0);
    }
    int e = gen_run_all(g);
    gen_destroy(&g);
    return e;
}

/* The engine's seams without processes: a pool in shared memory mapped twice in one
 * process, and a remote that runs the backbone layers past the boundary on its own
 * forward over the second mapping, give the tokens and exit layers of the plain engine bit
 * for bit, under per-row exits (batches split into backbone and river groups, so rows are
 * gathered and scattered around the remote) and the strategies the remote supports. */
START_TEST(test_engine_seam)
{
    split_model(_i);
    char river_file[512];
    build_river(river_file, sizeof river_file);
    model_t *m;
    backend_t *be;
    exitriver_t *rv;
    ck_assert_msg(model_load(&m, KJV) == 0, "%s", river_err_detail());
    test_backend_open(&be, 1, CPU_SIMD_COUNT, m);
    ck_assert_msg(exitriver_load(&rv, m, river_file) == 0, "%s", river_err_detail());
    const layer_weights_t *layers[12];
    for (int l = 0; l < 12; l++)
        layers[l] = exitriver_layer(rv, l);
    int kvd = m->cfg.n_kv_heads * m->cfg.head_dim, fd;

    /* The shared pool and its second mapping. */
    kv_pool_t *shared, *attached;
    /* Of the element type the plain engine picks (kv.dtype auto: f16 for the quantized
     * backbones), so that both read the same K/V values. */
    dtype_t kvt = gen_kv_dtype(m, GEN_KV_AUTO);
    ck_assert_int_eq(kv_pool_new_shared(&shared, be, 12, kvd, kvt, 16, 16, &fd), 0);
    /* Through the handle the pool exports, as the backbone worker maps it: on a device
     * backend the process that exported it gets the same memory (CUDA IPC cannot open a
     * handle where it was made), on the CPU a second mapping of the memfd. */
    const shared_handle_t *sh = kv_pool_shared_handle(shared);
    ck_assert_ptr_nonnull(sh);
    ck_assert_msg(kv_pool_attach_handle(&attached, be, sh, 12, kvd, kvt, 16, 16) == 0, "%s",
                  river_err_detail());
    ck_assert_int_eq(kv_pool_is_attached(attached), 1);
    int32_t page;
    ck_assert_int_eq(kv_pool_alloc_page(attached, &page), RIVER_ESTATE);
    kv_seq_t sq;
    kv_seq_init(&sq);
    ck_assert_int_eq(kv_seq_reserve(&sq, attached, 4), RIVER_ESTATE);
    ck_assert_int_eq(kv_pool_alloc_page(shared, &page), 0);
    /* Through the backend: on a device the pool is not host memory. */
    float val = 42.0f, seen = 0;
    ck_assert_int_eq(be->ops->from_host(be->ctx, kv_pool_view(shared)->v, 5, &val, 1), 0);
    ck_assert_int_eq(be->ops->to_host(be->ctx, &seen, kv_pool_view(attached)->v, 5, 1), 0);
    ck_assert(memcmp(&seen, &val, sizeof val) == 0);
    kv_pool_free_page(shared, page);
    /* Another geometry than the memory's, or a descriptor that is no shared memory. */
    kv_pool_t *bad = NULL;
    ck_assert_int_eq(kv_pool_attach_handle(&bad, be, sh, 12, kvd, kvt, 16, 32), RIVER_EINVAL);
    int null_fd = open("/dev/null", O_RDWR);
    ck_assert_int_ge(null_fd, 0);
    ck_assert_int_eq(kv_pool_attach(&bad, be, null_fd, 12, kvd, kvt, 16, 16), RIVER_EINVAL);
    close(null_fd);
    ck_assert_ptr_null(bad);
    /* A pool that does not fit the model, or one that is attached, is not the engine's. */
    gen_config_t c = {.max_rows = 8, .prefill_chunk = 8, .page_size = 8, .max_seqs = 1,
                      .kv_pool = shared};
    gen_t *g = NULL;
    ck_assert_int_eq(gen_new(&g, m, NULL, be, &c), RIVER_EINVAL);
    c.page_size = 16;
    c.kv_pool = attached;
    ck_assert_int_eq(gen_new(&g, m, NULL, be, &c), RIVER_EINVAL);

    seam_t sm = {.kv = attached, .min_layer = 99};
    ck_assert_int_eq(forward_new(&sm.f, m, be, 256), 0);
    fwd_remote_t r = {.user = &sm, .boundary = BOUNDARY, .run = seam_run};
    fwd_remote_t bad_r = {.user = &sm, .boundary = 13, .run = seam_run};
    ck_assert_int_eq(forward_set_remote(sm.f, &bad_r), RIVER_EINVAL);

    /* Two thresholds: at 0.97 rows part ways past the boundary more often, so the remote
     * gets gathered subsets of the batch. */
    static const exit_kv_t kinds[] = {EXIT_KV_RIVER, EXIT_KV_RECOMPUTE, EXIT_KV_POSTHOC,
                                      EXIT_KV_MONO};
    static const float taus[] = {0.95f, 0.97f};
    int below = 0, above = 0;
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0] * 2; k++) {
        exit_kv_t kind = kinds[k / 2];
        exit_config_t ex = {.policy = {.rule = EXIT_RULE_COSINE, .tau = taus[k % 2],
                                       .agg = EXIT_AGG_ROW, .kv = kind},
                            .river = layers, .river_start = exitriver_start_layer(rv)};
        static seq_out_t plain[3], split[3];
        ck_assert_msg(seam_generate(m, be, NULL, NULL, &ex, plain) == 0, "%s",
                      river_err_detail());
        sm.calls = sm.rows = 0;
        sm.min_layer = 99;
        ck_assert_msg(seam_generate(m, be, shared, &r, &ex, split) == 0, "%s",
                      river_err_detail());
        ck_assert_int_gt(sm.calls, 0);
        ck_assert_int_eq(sm.min_layer, BOUNDARY);
        for (int i = 0; i < 3; i++) {
            ck_assert_int_eq(split[i].n, 30);
            for (int t = 0; t < 30; t++) {
                ck_assert_msg(split[i].ids[t] == plain[i].ids[t] &&
                                  split[i].depth[t] == plain[i].depth[t],
                              "%s, tau %.2f: sequence %d token %d: remote id %d depth %d, "
                              "plain id %d depth %d", exit_kv_name(kind), (double)taus[k % 2],
                              i, t, split[i].ids[t], split[i].depth[t], plain[i].ids[t],
                              plain[i].depth[t]);
                below += split[i].depth[t] <= BOUNDARY;
                above += split[i].depth[t] > BOUNDARY;
            }
        }
    }
    ck_assert_msg(below > 0 && above > 0, "%d exits below the boundary, %d above", below,
                  above);
    /* Without the K/V-only passes and validity maps, two baselines cannot cross. */
    static const exit_kv_t refused[] = {EXIT_KV_MASK, EXIT_KV_PROPAGATE};
    for (size_t k = 0; k < 2; k++) {
        exit_config_t ex = {.policy = {.rule = EXIT_RULE_COSINE, .tau = 0.95f,
                                       .agg = EXIT_AGG_ROW, .kv = refused[k]},
                            .river = layers, .river_start = exitriver_start_layer(rv)};
        static seq_out_t out[3];
        ck_assert_int_eq(seam_generate(m, be, shared, &r, &ex, out), RIVER_EUNSUPPORTED);
    }
    forward_destroy(&sm.f);
    /* Dropping the attached pool leaves the shared one's memory as it was: where the
     * attached pool is the exporter's own buffer, its detach neither frees nor unmaps it. */
    float mark = 7.5f, back = 0;
    ck_assert_int_eq(be->ops->from_host(be->ctx, kv_pool_view(shared)->k, 3, &mark, 1), 0);
    kv_pool_destroy(&attached);
    ck_assert_int_eq(be->ops->to_host(be->ctx, &back, kv_pool_view(shared)->k, 3, 1), 0);
    ck_assert(memcmp(&back, &mark, sizeof mark) == 0);
    kv_pool_destroy(&shared);
    exitriver_destroy(&rv);
    backend_destroy(&be);
    model_destroy(&m);
    remove(river_file);
}
END_TEST

/* ---- Tests ---- */

/* The backbone's side of the protocol: every mismatch in a hello is refused with a reason;
 * nothing runs before a pairing; a paired backbone computes each layer exactly as this
 * process does (same floats out, same K/V in the shared slots); the river process may
 * start over on a new socket; a silent river is dropped. Prints the round trip. */
START_TEST(test_backbone_protocol)
{
    char endpoint[300];
    snprintf(endpoint, sizeof endpoint, "ipc://%s/pair-proto.sock", test_tmpdir());
    /* This river speaks the zmq transport (hidden states in the frames) on any device. */
    pid_t bb = start_backbone_on(endpoint, 1, "zmq");
    fake_river_t r;
    fr_open(&r, 8);
    void *s = fr_socket(&r, endpoint);
    int dim = r.m->cfg.dim;

    /* Not paired yet. */
    static float x[64 * 192], out[64 * 192], ref[64 * 192];
    int32_t pos[64], table[2] = {0, 1};
    for (int i = 0; i < 64; i++)
        pos[i] = i;
    const char *err = fr_layer(s, 1, 6, 1, pos, table, 1, x, out, dim);
    ck_assert_ptr_nonnull(err);
    ck_assert_msg(strstr(err, "not paired"), "%s", err);

    hello_opts_t o = hello_default(&r);
    o.fingerprint = "0123456789abcdef0123456789abcdef";
    fr_hello(&r, s, &o);
    expect_error(s, "fingerprint");
    o = hello_default(&r);
    o.kv_dim = 64;
    fr_hello(&r, s, &o);
    expect_error(s, "KV geometry");
    /* The backbone's kv.dtype is auto, as the fake river's pool: a pool of another type
     * is refused by name, before its bytes are looked at. */
    o = hello_default(&r);
    o.kv_dtype = strcmp(o.kv_dtype, "f32") == 0 ? "f16" : "f32";
    fr_hello(&r, s, &o);
    expect_error(s, "this backbone's kv.dtype is");
    o = hello_default(&r);
    o.boundary = 5;
    fr_hello(&r, s, &o);
    expect_error(s, "boundary 5");
    /* Kernels on host threads (the CPU's, the opaque backend's) may sum in another order
     * on another count; a GPU's count is 0 and not compared. */
    if (backend_threads(r.be) > 0) {
        o = hello_default(&r);
        o.threads = backend_threads(r.be) + 1;
        fr_hello(&r, s, &o);
        expect_error(s, "threads");
    }
    o = hello_default(&r);
    o.protocol = 9;
    fr_hello(&r, s, &o);
    expect_error(s, "protocol");
    /* The size of a memfd is checked where it is mapped; a CUDA IPC handle says nothing
     * of its size that the runtime could check. */
    if (kv_pool_shared_handle(r.kv)->kind == SHARED_MEMFD) {
        o = hello_default(&r);
        o.n_pages = 16; /* the memory holds 8 */
        fr_hello(&r, s, &o);
        expect_error(s, "shared memory has");
    }
    /* Not a frame of the protocol at all. */
    ck_assert_int_eq(zmq_send(s, "\xff\xff\xff", 3, 0), 3);
    expect_error(s, "malformed");

    o = hello_default(&r);
    fr_hello(&r, s, &o);
    expect_hello_ok(s);

    /* A layer below the boundary, a page outside the pool, a short table. */
    err = fr_layer(s, 2, 3, 1, pos, table, 1, x, out, dim);
    ck_assert_msg(err && strstr(err, "layer 3"), "%s", err ? err : "accepted");
    int32_t bad_table[1] = {99};
    err = fr_layer(s, 3, 6, 1, pos, bad_table, 1, x, out, dim);
    ck_assert_msg(err && strstr(err, "outside the pool"), "%s", err ? err : "accepted");
    int32_t far[1] = {40};
    err = fr_layer(s, 4, 6, 1, far, table, 2, x, out, dim);
    ck_assert_msg(err && strstr(err, "past its page table"), "%s", err ? err : "accepted");

    /* Real layers: a prompt of 20 rows, then one decode row, through every backbone layer,
     * against this process on a private pool. */
    kv_pool_t *local;
    const kv_view_t *sv = kv_pool_view(r.kv);
    ck_assert_int_eq(kv_pool_new(&local, r.be, 12, sv->kv_dim, DTYPE_F32, 16, 8), 0);
    forward_t *f;
    ck_assert_int_eq(forward_new(&f, r.m, r.be, 64), 0);
    const int32_t *tables[64];
    for (int i = 0; i < 64; i++)
        tables[i] = table;
    uint64_t seq = 10;
    for (int step = 0; step < 2; step++) {
        int n = step ? 1 : 20;
        int32_t *p = step ? &pos[20] : pos;
        for (int i = 0; i < n * dim; i++)
            x[i] = (float)((i * 37 + step * 11) % 101) / 50.0f - 1.0f;
        for (int l = BOUNDARY; l < 12; l++) {
            err = fr_layer(s, seq++, l, n, p, table, 2, x, out, dim);
            ck_assert_msg(err == NULL, "layer %d: %s", l, err);
            memcpy(ref, x, sizeof(float) * (size_t)(n * dim));
            ck_assert_int_eq(forward_layer_rows(f, local, l, n, p, tables, ref), 0);
            ck_assert_msg(memcmp(out, ref, sizeof(float) * (size_t)(n * dim)) == 0,
                          "layer %d, %d rows: the backbone's output differs from this "
                          "process's", l, n);
            memcpy(x, out, sizeof(float) * (size_t)(n * dim));
        }
    }
    /* The K/V the backbone wrote into the shared pool are this process's, bit for bit. */
    const kv_view_t *lv = kv_pool_view(local);
    for (int l = BOUNDARY; l < 12; l++)
        for (int q = 0; q <= 20; q++) {
            int64_t off = (int64_t)table[q / 16] * sv->page_stride + l * sv->layer_stride +
                          (int64_t)(q % 16) * sv->kv_dim;
            float a[1024], b[1024];
            ck_assert_int_le(sv->kv_dim, 1024);
            const ops_t *bo = r.be->ops;
            size_t kd = (size_t)sv->kv_dim;
            ck_assert_int_eq(bo->to_host(r.be->ctx, a, sv->k, (size_t)off, kd), 0);
            ck_assert_int_eq(bo->to_host(r.be->ctx, b, lv->k, (size_t)off, kd), 0);
            ck_assert_int_eq(memcmp(a, b, sizeof(float) * kd), 0);
            ck_assert_int_eq(bo->to_host(r.be->ctx, a, sv->v, (size_t)off, kd), 0);
            ck_assert_int_eq(bo->to_host(r.be->ctx, b, lv->v, (size_t)off, kd), 0);
            ck_assert_int_eq(memcmp(a, b, sizeof(float) * kd), 0);
        }

    /* Round trips: one decode row, and a prefill chunk of 32 rows. */
    for (int k = 0; k < 2; k++) {
        int n = k ? 32 : 1, reps = k ? 20 : 200;
        int64_t t0 = clock_now_ms();
        for (int i = 0; i < reps; i++)
            ck_assert_ptr_null(fr_layer(s, seq++, BOUNDARY, n, pos, table, 2, x, out, dim));
        double us = (double)(clock_now_ms() - t0) * 1000.0 / reps;
        int64_t t1 = clock_now_ms();
        for (int i = 0; i < reps; i++)
            ck_assert_int_eq(forward_layer_rows(f, local, BOUNDARY, n, pos, tables, ref), 0);
        double local_us = (double)(clock_now_ms() - t1) * 1000.0 / reps;
        printf("split pair, kjv-12l layer %d, %d row%s: %.0f us per round trip to the backbone "
               "worker (the layer alone in this process: %.0f us)\n", BOUNDARY, n,
               n > 1 ? "s" : "", us, local_us);
    }
    fflush(stdout);

    /* Pings are answered. */
    River__Pair__Ping ping = RIVER__PAIR__PING__INIT;
    River__Pair__RiverMessage env = RIVER__PAIR__RIVER_MESSAGE__INIT;
    env.kind_case = RIVER__PAIR__RIVER_MESSAGE__KIND_PING;
    env.ping = &ping;
    fr_send(s, &env);
    River__Pair__BackboneMessage *bm = fr_recv(s, 2000);
    ck_assert_ptr_nonnull(bm);
    ck_assert_int_eq(bm->kind_case, RIVER__PAIR__BACKBONE_MESSAGE__KIND_PONG);
    river__pair__backbone_message__free_unpacked(bm, NULL);

    /* The same river process starting over from a fresh socket (as a river worker does
     * after it timed its backbone out) takes the pairing over; the old socket is no longer
     * served. */
    void *s2 = fr_socket(&r, endpoint);
    o = hello_default(&r);
    o.heartbeat_ms = 20;
    o.liveness = 2;
    fr_hello(&r, s2, &o);
    expect_hello_ok(s2);
    err = fr_layer(s, seq++, BOUNDARY, 1, pos, table, 2, x, out, dim);
    ck_assert_msg(err && strstr(err, "not paired"), "%s", err ? err : "accepted");
    ck_assert_ptr_null(fr_layer(s2, seq++, BOUNDARY, 1, pos, table, 2, x, out, dim));
    /* A river silent for longer than its hello's liveness (20 ms x 2) is dropped. */
    test_sleep_ms(200);
    err = fr_layer(s2, seq++, BOUNDARY, 1, pos, table, 2, x, out, dim);
    ck_assert_msg(err && strstr(err, "not paired"), "%s", err ? err : "accepted");
    ck_assert_int_eq(test_wait_code(bb, 10), -1);

    forward_destroy(&f);
    kv_pool_destroy(&local);
    zmq_close(s);
    zmq_close(s2);
    fr_close(&r);
    test_kill(&bb, SIGKILL);
}
END_TEST

/* A second river process is refused while the first is alive; once the first process
 * ends it is forgotten at once (the backbone watches its pid), not after its heartbeat
 * liveness, and the second pairs right away. */
START_TEST(test_backbone_notices_river_exit)
{
    char endpoint[300];
    snprintf(endpoint, sizeof endpoint, "ipc://%s/pair-exit.sock", test_tmpdir());
    /* This river speaks the zmq transport (hidden states in the frames) on any device. */
    pid_t bb = start_backbone_on(endpoint, 1, "zmq");
    int ready[2];
    ck_assert_int_eq(pipe(ready), 0);
    pid_t child = fork();
    ck_assert_int_ge(child, 0);
    if (child == 0) {
        /* A river of its own: its pool, its ZMQ context, a hello with a liveness of ten
         * minutes, then it waits to be killed. */
        fake_river_t r;
        fr_open(&r, 8);
        void *s = fr_socket(&r, endpoint);
        hello_opts_t o = hello_default(&r);
        o.heartbeat_ms = 60000;
        o.liveness = 10;
        fr_hello(&r, s, &o);
        expect_hello_ok(s);
        if (write(ready[1], "y", 1) != 1)
            _exit(1);
        pause();
        _exit(0);
    }
    close(ready[1]);
    char c;
    ck_assert_int_eq(read(ready[0], &c, 1), 1);
    close(ready[0]);
    fake_river_t r;
    fr_open(&r, 8);
    void *s = fr_socket(&r, endpoint);
    hello_opts_t o = hello_default(&r);
    fr_hello(&r, s, &o);
    expect_error(s, "is paired");
    test_kill(&child, SIGKILL);
    int64_t t0 = clock_now_ms();
    fr_hello(&r, s, &o);
    expect_hello_ok(s);
    ck_assert_int_lt(clock_now_ms() - t0, 1000);
    zmq_close(s);
    fr_close(&r);
    test_kill(&bb, SIGKILL);
}
END_TEST

/* The pair gives the tokens and exit layers of one role-full worker with the same
 * configuration, bit for bit, with exits on both sides of the boundary; the backbone holds
 * only its half of the weights in memory. Killing the backbone mid-stream fails the
 * request with UNAVAILABLE at once, new requests too, and a new backbone is paired again
 * and serves the same tokens. */
START_TEST(test_pair_matches_full)
{
    split_model(_i);
    char river_file[512], extra[1400];
    build_river(river_file, sizeof river_file);
    snprintf(extra, sizeof extra, "river: %s\nexit:\n  rule: cosine\n  tau: %s\n", river_file,
             TAU);
    /* The reference: one full worker. Without its prefix cache, as the pair runs: under a
     * lossy rule a request that reuses a prefix prefills only its tail, so the prompt
     * chunk's sequence-level exit, and the exit layers, may differ from a whole prefill. */
    static stream_t full[N_PROMPTS], pair[N_PROMPTS], one_full, one_pair;
    char full_extra[1500];
    snprintf(full_extra, sizeof full_extra, "%sprefix_cache:\n  enabled: false\n", extra);
    wk_t w;
    wk_start(&w, full_extra, RIVER__WORKER__ROLE__ROLE_FULL);
    run_prompts(&w, full, 100);
    memset(&one_full, 0, sizeof one_full);
    one_full.id = 200;
    wk_submit_text(&w, 200, prompts[0], 20);
    streams_collect(&w, &one_full, 1, 20000, 0);
    ck_assert_int_eq(one_full.ended, 1);
    long rss_full = model_rss_kb(w.pid);
    wk_stop(&w);

    /* The pair. */
    char peer[300], pair_extra[2000];
    snprintf(peer, sizeof peer, "ipc://%s/pair.sock", test_tmpdir());
    snprintf(pair_extra, sizeof pair_extra,
             "%srole: river\nsplit:\n  boundary: %d\n  peer: \"%s\"\n", extra, BOUNDARY, peer);
    pid_t bb = start_backbone(peer, 1);
    wk_start(&w, pair_extra, RIVER__WORKER__ROLE__ROLE_RIVER);
    ck_assert_uint_eq(w.caps.layer_begin, 0);
    ck_assert_uint_eq(w.caps.layer_end, BOUNDARY);
    ck_assert(w.caps.has_river);
    run_prompts(&w, pair, 100);
    int below = 0, above = 0;
    for (int i = 0; i < N_PROMPTS; i++) {
        for (size_t t = 0; t < N_TOKENS; t++) {
            ck_assert_msg(pair[i].ids[t] == full[i].ids[t] &&
                              pair[i].layers[t] == full[i].layers[t],
                          "prompt %d token %zu: pair id %d at exit layer %d, full worker id "
                          "%d at exit layer %d", i, t, pair[i].ids[t], pair[i].layers[t],
                          full[i].ids[t], full[i].layers[t]);
            below += pair[i].layers[t] <= BOUNDARY;
            above += pair[i].layers[t] > BOUNDARY && pair[i].layers[t] < 12;
        }
    }
    printf("split pair: %d tokens exited at or before layer %d (river worker alone), %d after "
           "it (back from the backbone worker onto the river), of %d\n", below, BOUNDARY,
           above, N_PROMPTS * N_TOKENS);
    ck_assert_msg(below > 0 && above > 0, "exits below the boundary %d, above it %d: tau "
                  TAU " no longer exits on both sides", below, above);
    long rss_river = model_rss_kb(w.pid), rss_bb = model_rss_kb(bb);
    printf("%s weights resident: full worker %ld KiB, river worker %ld KiB, backbone "
           "worker %ld KiB\n", KJV, rss_full, rss_river, rss_bb);
    fflush(stdout);
    /* Resident pages of the mapped checkpoint: a host backend's measure (a device backend
     * reads its own copies, placed per half). The q8 checkpoint's small tensors leave more
     * of the released half resident (4.0 of 5.7 MiB in the backbone worker, against 2.6
     * MiB of its layers), so it gets a looser bound. */
    if (!strcmp(test_device(), "cpu")) {
        ck_assert_int_lt(rss_bb, rss_full * (_i == 1 ? 8 : 6) / 10);
        ck_assert_int_lt(rss_river, rss_full * (_i == 1 ? 8 : 7) / 10);
    }

    /* The backbone dies mid-stream: an explicit UNAVAILABLE, promptly. */
    stream_t st = {.id = 300};
    wk_submit_text(&w, 300, prompts[1], 300);
    streams_collect(&w, &st, 1, 20000, 5);
    ck_assert_int_eq(st.ended, 0);
    test_kill(&bb, SIGKILL);
    int64_t t0 = clock_now_ms();
    streams_collect(&w, &st, 1, 5000, 0);
    ck_assert_int_eq(st.ended, 2);
    ck_assert_int_eq(st.code, RIVER__CLIENT__ERROR__CODE__UNAVAILABLE);
    ck_assert_msg(strstr(st.message, "backbone"), "%s", st.message);
    ck_assert_int_lt(clock_now_ms() - t0, 3000);
    /* Nothing new is taken while the backbone is gone. */
    stream_t late = {.id = 301};
    wk_submit_text(&w, 301, prompts[2], 5);
    streams_collect(&w, &late, 1, 5000, 0);
    ck_assert_int_eq(late.ended, 2);
    ck_assert_int_eq(late.code, RIVER__CLIENT__ERROR__CODE__UNAVAILABLE);

    /* A new backbone: the river worker pairs again and serves the same tokens. */
    bb = start_backbone(peer, 1);
    int64_t end = clock_now_ms() + 15000;
    uint64_t id = 400;
    for (;;) {
        memset(&one_pair, 0, sizeof one_pair);
        one_pair.id = id;
        wk_submit_text(&w, id++, prompts[0], 20);
        streams_collect(&w, &one_pair, 1, 20000, 0);
        if (one_pair.ended == 1)
            break;
        ck_assert_int_eq(one_pair.code, RIVER__CLIENT__ERROR__CODE__UNAVAILABLE);
        ck_assert_msg(clock_now_ms() < end, "the river worker did not pair again: %s",
                      one_pair.message);
        test_sleep_ms(200);
    }
    ck_assert_uint_eq(one_pair.n, one_full.n);
    for (size_t t = 0; t < one_full.n; t++) {
        ck_assert_int_eq(one_pair.ids[t], one_full.ids[t]);
        ck_assert_int_eq(one_pair.layers[t], one_full.layers[t]);
    }
    ck_assert_int_eq(test_wait_code(w.pid, 10), -1);
    wk_stop(&w);
    test_kill(&bb, SIGKILL);
    remove(river_file);
}
END_TEST

/* Every transport this build can run on the test device gives the pair the tokens and exit
 * layers of one full worker: p2p moves the hidden states as backend buffers through a
 * staging buffer both map (forward's run_dev and forward_layer_rows_dev, with no host copy:
 * on the opaque backend a host read of one would fault), zmq as bytes in the frames. A river
 * and a backbone configured for different transports do not pair: the river exits at its
 * first hello with the reason. */
START_TEST(test_pair_transports)
{
    char river_file[512], extra[1400];
    build_river(river_file, sizeof river_file);
    /* Row aggregation: each row decides alone, so the tokens do not depend on which
     * requests the worker happens to batch together, and the rows that cross to the
     * backbone are a subset of the batch (gathered, handed over, scattered back). */
    snprintf(extra, sizeof extra, "river: %s\nexit:\n  rule: cosine\n  tau: %s\n"
             "  aggregation: row\nprefix_cache:\n  enabled: false\n", river_file, TAU);
    static stream_t full[N_PROMPTS], pair[N_PROMPTS];
    wk_t w;
    wk_start(&w, extra, RIVER__WORKER__ROLE__ROLE_FULL);
    run_prompts(&w, full, 100);
    wk_stop(&w);
    static const char *const kinds[] = {"p2p", "zmq"};
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        char peer[300], pair_extra[2000];
        snprintf(peer, sizeof peer, "ipc://%s/pair-%s.sock", test_tmpdir(), kinds[k]);
        snprintf(pair_extra, sizeof pair_extra, "%srole: river\nsplit:\n  boundary: %d\n  "
                 "peer: \"%s\"\n  transport: %s\n", extra, BOUNDARY, peer, kinds[k]);
        pid_t bb = start_backbone_on(peer, 1, kinds[k]);
        wk_start(&w, pair_extra, RIVER__WORKER__ROLE__ROLE_RIVER);
        run_prompts(&w, pair, 100);
        int above = 0;
        for (int i = 0; i < N_PROMPTS; i++)
            for (size_t t = 0; t < N_TOKENS; t++) {
                ck_assert_msg(pair[i].ids[t] == full[i].ids[t] &&
                                  pair[i].layers[t] == full[i].layers[t],
                              "transport %s, prompt %d token %zu: pair id %d at layer %d, "
                              "full worker id %d at layer %d", kinds[k], i, t, pair[i].ids[t],
                              pair[i].layers[t], full[i].ids[t], full[i].layers[t]);
                above += pair[i].layers[t] > BOUNDARY;
            }
        ck_assert_msg(above > 0, "transport %s: no token crossed to the backbone", kinds[k]);
        wk_stop(&w);
        test_kill(&bb, SIGKILL);
    }

    /* Different transports on the two sides. */
    char peer[300], cfg[1400], err_path[512];
    snprintf(peer, sizeof peer, "ipc://%s/pair-mismatch.sock", test_tmpdir());
    pid_t bb = start_backbone_on(peer, 2, "zmq");
    snprintf(cfg, sizeof cfg,
             "riverd: \"ipc://%s/nobody.sock\"\nmodel: %s\nrole: river\nthreads: 2\n%s"
             "auth: {mode: plain}\nsplit:\n  boundary: %d\n  peer: \"%s\"\n  transport: p2p\n",
             test_tmpdir(), KJV, test_device_yaml(), BOUNDARY, peer);
    snprintf(err_path, sizeof err_path, "%s/river-transport.log", test_tmpdir());
    pid_t rv = wk_spawn("river-transport.yaml", cfg, "rv", err_path, NULL);
    ck_assert_int_eq(test_wait_code(rv, 10000), 1);
    size_t len;
    char *log = test_read_file(err_path, &len);
    ck_assert_ptr_nonnull(log);
    ck_assert_msg(strstr(log, "refused the pair") && strstr(log, "transport p2p"), "%s", log);
    free(log);
    test_kill(&bb, SIGKILL);

    /* nccl on a backend that does not hand off through NCCL (or a build without CUDA): a
     * configuration error at start-up that names the key. */
    if (!strcmp(test_device(), "cpu")) {
        snprintf(cfg, sizeof cfg,
                 "riverd: \"ipc://%s/nobody.sock\"\nmodel: %s\nrole: river\nthreads: 2\n"
                 "auth: {mode: plain}\nsplit:\n  boundary: %d\n  peer: \"%s\"\n"
                 "  transport: nccl\n", test_tmpdir(), KJV, BOUNDARY, peer);
        snprintf(err_path, sizeof err_path, "%s/river-nccl.log", test_tmpdir());
        rv = wk_spawn("river-nccl.yaml", cfg, "rv", err_path, NULL);
        ck_assert_int_eq(test_wait_code(rv, 10000), 1);
        log = test_read_file(err_path, &len);
        ck_assert_ptr_nonnull(log);
        ck_assert_msg(strstr(log, "split.transport nccl"), "%s", log);
        free(log);
    }
    remove(river_file);
}
END_TEST

/* A river worker configured unlike its backbone (another thread count, which would break
 * bit-exactness where the kernels run on host threads; on a GPU, which counts none, another
 * boundary) is refused at its first hello and exits with the reason. */
START_TEST(test_river_refused_at_start)
{
    char peer[300], cfg[1024], err_path[512];
    snprintf(peer, sizeof peer, "ipc://%s/pair-refuse.sock", test_tmpdir());
    pid_t bb = start_backbone(peer, 1);
    bool gpu = !strcmp(test_device(), "cuda");
    snprintf(cfg, sizeof cfg,
             "riverd: \"ipc://%s/nobody.sock\"\nmodel: %s\nrole: river\nthreads: 2\n%s"
             "auth: {mode: plain}\nsplit:\n  boundary: %d\n  peer: \"%s\"\n", test_tmpdir(),
             KJV, test_device_yaml(), gpu ? BOUNDARY - 1 : BOUNDARY, peer);
    snprintf(err_path, sizeof err_path, "%s/river-refused.log", test_tmpdir());
    pid_t rv = wk_spawn("river-refused.yaml", cfg, "rv", err_path, NULL);
    ck_assert_int_eq(test_wait_code(rv, 10000), 1);
    size_t len;
    char *log = test_read_file(err_path, &len);
    ck_assert_ptr_nonnull(log);
    ck_assert_msg(strstr(log, "refused the pair") && strstr(log, gpu ? "boundary" : "threads"),
                  "%s", log);
    free(log);
    /* A boundary outside the model is a configuration error before any hello. */
    snprintf(cfg, sizeof cfg,
             "model: %s\nrole: backbone\nsplit:\n  boundary: 12\n  peer: \"%s\"\n", KJV, peer);
    snprintf(err_path, sizeof err_path, "%s/backbone-bad.log", test_tmpdir());
    pid_t bad = wk_spawn("backbone-bad.yaml", cfg, "bb2", err_path, NULL);
    ck_assert_int_eq(test_wait_code(bad, 10000), 1);
    log = test_read_file(err_path, &len);
    ck_assert_ptr_nonnull(log);
    ck_assert_msg(strstr(log, "split.boundary 12"), "%s", log);
    free(log);
    test_kill(&bb, SIGKILL);
}
END_TEST

/* A backend that only describes itself: a GPU that hands off through NCCL, named uuid. */
static void stub_info(ops_ctx_t *ctx, backend_info_t *out)
{
    (void)ctx;
    out->name = "stub";
    out->device = 0;
    out->handoff = HANDOFF_NCCL;
    snprintf(out->uuid, sizeof out->uuid, "GPU-stub");
}

/* Two workers on one device: split.transport auto offers p2p beside nccl and the backbone
 * takes p2p, since two NCCL ranks cannot share a GPU; nccl configured on either side is
 * refused at the hello, naming the key and the device. First the choice alone, on a
 * backend that asks for NCCL; then, on a device backend that names its device (the opaque
 * backend, every instance of which is one device, or a GPU), a backbone worker's answers
 * to hellos from this process on the same device. */
START_TEST(test_one_device_transport)
{
    static const ops_t stub_ops = {.name = "stub", .info = stub_info};
    backend_t stub = {.ops = &stub_ops};
    pair_transport_kind_t k = PAIR_TRANSPORT_AUTO;
    ck_assert_int_eq(pair_transport_resolve(PAIR_TRANSPORT_AUTO, &stub), PAIR_TRANSPORT_NCCL);
    ck_assert_int_eq(pair_transport_fallback(PAIR_TRANSPORT_AUTO, &stub), PAIR_TRANSPORT_P2P);
    ck_assert_int_eq(pair_transport_fallback(PAIR_TRANSPORT_NCCL, &stub), PAIR_TRANSPORT_AUTO);
    ck_assert_int_eq(pair_transport_fallback(PAIR_TRANSPORT_AUTO, NULL), PAIR_TRANSPORT_AUTO);
    /* The choice table: this backbone's split.transport, the river's first kind and its
     * alternative, the river's device; the kind both take, or the refusal's words. */
    static const struct {
        pair_transport_kind_t want, first, alt;
        const char *uuid;
        pair_transport_kind_t took; /* PAIR_TRANSPORT_AUTO: refused */
        const char *why[2];
    } rows[] = {
        /* Another GPU, or none named: nccl. */
        {PAIR_TRANSPORT_AUTO, PAIR_TRANSPORT_NCCL, PAIR_TRANSPORT_P2P, "GPU-other",
         PAIR_TRANSPORT_NCCL, {NULL, NULL}},
        {PAIR_TRANSPORT_AUTO, PAIR_TRANSPORT_NCCL, PAIR_TRANSPORT_AUTO, "",
         PAIR_TRANSPORT_NCCL, {NULL, NULL}},
        /* One GPU: p2p where both are auto, or the backbone's p2p. */
        {PAIR_TRANSPORT_AUTO, PAIR_TRANSPORT_NCCL, PAIR_TRANSPORT_P2P, "GPU-stub",
         PAIR_TRANSPORT_P2P, {NULL, NULL}},
        {PAIR_TRANSPORT_P2P, PAIR_TRANSPORT_NCCL, PAIR_TRANSPORT_P2P, "GPU-stub",
         PAIR_TRANSPORT_P2P, {NULL, NULL}},
        /* nccl configured on one GPU, on either side. */
        {PAIR_TRANSPORT_NCCL, PAIR_TRANSPORT_NCCL, PAIR_TRANSPORT_P2P, "GPU-stub",
         PAIR_TRANSPORT_AUTO, {"this backbone's split.transport is nccl", "one GPU (GPU-stub)"}},
        {PAIR_TRANSPORT_AUTO, PAIR_TRANSPORT_NCCL, PAIR_TRANSPORT_AUTO, "GPU-stub",
         PAIR_TRANSPORT_AUTO, {"the river's split.transport is nccl", "one GPU (GPU-stub)"}},
        /* Kinds that do not meet at all. */
        {PAIR_TRANSPORT_ZMQ, PAIR_TRANSPORT_NCCL, PAIR_TRANSPORT_P2P, "GPU-other",
         PAIR_TRANSPORT_AUTO, {"transport nccl differs", NULL}},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        k = PAIR_TRANSPORT_AUTO;
        int e = pair_transport_choose(rows[i].want, &stub, rows[i].first, rows[i].alt,
                                      rows[i].uuid, &k);
        if (rows[i].took != PAIR_TRANSPORT_AUTO) {
            ck_assert_msg(e == 0 && k == rows[i].took, "row %zu: %d, took %s", i, e,
                          pair_transport_name(k));
            continue;
        }
        ck_assert_msg(e == RIVER_EINVAL, "row %zu: %d", i, e);
        for (int w = 0; w < 2; w++)
            ck_assert_msg(!rows[i].why[w] || strstr(river_err_detail(), rows[i].why[w]),
                          "row %zu: %s", i, river_err_detail());
    }

    fake_river_t r;
    fr_open(&r, 8);
    backend_info_t bi;
    backend_get_info(r.be, &bi);
    if (bi.uuid[0]) {
        char endpoint[300];
        snprintf(endpoint, sizeof endpoint, "ipc://%s/pair-one-device.sock", test_tmpdir());
        pid_t bb = start_backbone_on(endpoint, 1, NULL);
        fr_stage(&r);
        void *s = fr_socket(&r, endpoint);
        /* A river whose split.transport is nccl, on the backbone's device. */
        hello_opts_t o = hello_default(&r);
        o.transport = PAIR_TRANSPORT_NCCL;
        fr_hello(&r, s, &o);
        expect_error(s, "the river's split.transport is nccl");
        /* A river of split.transport auto: nccl, and p2p beside it. */
        o.transport_alt = PAIR_TRANSPORT_P2P;
        fr_hello(&r, s, &o);
        ck_assert_uint_eq(expect_hello_ok(s), PAIR_TRANSPORT_P2P);
        zmq_close(s);
        test_kill(&bb, SIGKILL);
    }
    fr_close(&r);
}
END_TEST

static Suite *split_suite(void)
{
    Suite *s = suite_create("split");
    TCase *tc = tcase_create("pair");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, test_engine_seam, 0, 3);
    tcase_add_test(tc, test_backbone_protocol);
    tcase_add_test(tc, test_backbone_notices_river_exit);
    tcase_add_test(tc, test_one_device_transport);
    tcase_add_loop_test(tc, test_pair_matches_full, 0, 3);
    tcase_add_test(tc, test_river_refused_at_start);
    tcase_add_test(tc, test_pair_transports);
    suite_add_tcase(s, tc);
    return s;
}

RIVER_TEST_MAIN(split_suite)
