/* Writes the seed corpora of the fuzz targets whose inputs only a real encoder makes:
 * river and router files built from the tiny model the targets load (exitriver_build,
 * router_set_save), and the frames riverd, the split pair's halves and riverd's admin
 * endpoint send (packed by protobuf-c from the messages those processes fill). Run from the
 * repository root, `make fuzz-seeds`; it rewrites fuzz/corpus/{river,router,client_reply,
 * admin_reply,pair,gguf}/. */
#include "fuzz/targets.c"
#include "model/fingerprint.h"
#include "offline/exitriver_build.h"
#include "common/file.h"
#include "offline/gguf_export.h"
#include "offline/gguf_write.h"
#include "offline/router_train.h"

/* Writes data to fuzz/corpus/<target>/<name>; exits on failure (this is main's helper). */
static void seed_write(const char *target, const char *name, const void *data, size_t len)
{
    char path[256];
    snprintf(path, sizeof path, "fuzz/corpus/%s", target);
    if (mkdir(path, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "seeds: %s: %s\n", path, strerror(errno));
        exit(1);
    }
    snprintf(path, sizeof path, "fuzz/corpus/%s/%s", target, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, len, f) != len || fclose(f) != 0) {
        fprintf(stderr, "seeds: %s: %s\n", path, strerror(errno));
        exit(1);
    }
    printf("%-44s %6zu bytes\n", path, len);
}

/* A message packed behind an optional selector byte (the admin and pair targets' first
 * byte). */
static void seed_msg(const char *target, const char *name, int selector,
                     const ProtobufCMessage *m)
{
    size_t len;
    uint8_t *buf = fuzz_pack(m, &len);
    uint8_t *out = malloc(len + 1);
    if (!out) {
        fprintf(stderr, "seeds: out of memory\n");
        exit(1);
    }
    size_t off = 0;
    if (selector >= 0)
        out[off++] = (uint8_t)selector;
    memcpy(out + off, buf, len);
    seed_write(target, name, out, len + off);
    free(out);
    free(buf);
}

/* Copies a built file into the corpus. */
static void seed_copy(const char *target, const char *name, const char *src)
{
    size_t len = 0;
    FILE *f = fopen(src, "rb");
    static uint8_t buf[1 << 16];
    if (!f || (len = fread(buf, 1, sizeof buf, f)) == 0 || !feof(f) || fclose(f) != 0) {
        fprintf(stderr, "seeds: %s: cannot read it whole\n", src);
        exit(1);
    }
    seed_write(target, name, buf, len);
}

static void seeds_river(const model_t *m)
{
    char path[160];
    snprintf(path, sizeof path, "%s/seed-river.safetensors", fuzz_dir);
    exitriver_build_opts_t o = exitriver_build_opts_default();
    o.n_threads = 1;
    o.quant.group = 8;
    if (exitriver_build(m, path, &o, NULL) < 0) {
        fprintf(stderr, "seeds: exitriver_build: %s\n", river_err_detail());
        exit(1);
    }
    seed_copy("river", "q4-g8-hqq", path);
    o.quant.bits = 8;
    o.quant.method = QUANT_RTN;
    o.head_bits = 4;
    if (exitriver_build(m, path, &o, NULL) < 0) {
        fprintf(stderr, "seeds: exitriver_build: %s\n", river_err_detail());
        exit(1);
    }
    seed_copy("river", "q8-g8-rtn-head4", path);
    unlink(path);
}

static void seeds_router(const model_t *m)
{
    char path[160];
    snprintf(path, sizeof path, "%s/seed-routers.safetensors", fuzz_dir);
    router_set_t *s = NULL;
    if (router_set_new(&s, m, 1, 0.9f, 1) < 0 || router_set_save(s, path) < 0) {
        fprintf(stderr, "seeds: routers: %s\n", river_err_detail());
        exit(1);
    }
    router_set_destroy(&s);
    seed_copy("router", "interval1", path);
    unlink(path);
}

static void seeds_client_reply(void)
{
    const char *t = "client_reply";
    int32_t ids[] = {9, 3, 14};
    int32_t exits[] = {1, 2, 1};
    River__Client__TokenChunk ch = RIVER__CLIENT__TOKEN_CHUNK__INIT;
    ch.request_id = "fuzz-0";
    ch.text = " upon a";
    ch.n_ids = 3;
    ch.ids = ids;
    ch.n_exit_layers = 3;
    ch.exit_layers = exits;
    River__Client__ClientReply env = RIVER__CLIENT__CLIENT_REPLY__INIT;
    env.kind_case = RIVER__CLIENT__CLIENT_REPLY__KIND_CHUNK;
    env.chunk = &ch;
    seed_msg(t, "chunk", -1, &env.base);
    ch.request_id = "someone-else";
    ch.seq = 7;
    seed_msg(t, "chunk_unknown_id", -1, &env.base);

    River__Client__Usage u = RIVER__CLIENT__USAGE__INIT;
    u.prompt_tokens = 5;
    u.completion_tokens = 3;
    uint32_t hist[] = {0, 2, 1};
    River__Client__ExitStats xs = RIVER__CLIENT__EXIT_STATS__INIT;
    xs.mean_exit_layer = 1.33f;
    xs.n_histogram = 3;
    xs.histogram = hist;
    River__Client__Final fin = RIVER__CLIENT__FINAL__INIT;
    fin.request_id = "fuzz-1";
    fin.reason = RIVER__CLIENT__FINAL__REASON__EOS;
    fin.usage = &u;
    fin.exit_stats = &xs;
    env.kind_case = RIVER__CLIENT__CLIENT_REPLY__KIND_FINAL;
    env.final = &fin;
    seed_msg(t, "final", -1, &env.base);

    River__Client__Error err = RIVER__CLIENT__ERROR__INIT;
    err.request_id = "fuzz-0";
    err.code = RIVER__CLIENT__ERROR__CODE__RESOURCE_EXHAUSTED;
    err.message = "queue full (256 requests)";
    env.kind_case = RIVER__CLIENT__CLIENT_REPLY__KIND_ERROR;
    env.error = &err;
    seed_msg(t, "error", -1, &env.base);
    /* riverd's answer to a frame it could not read carries no id. */
    err.request_id = "";
    err.code = RIVER__CLIENT__ERROR__CODE__INVALID_ARGUMENT;
    err.message = "frame of 2000000 bytes over the limit of 1048576";
    seed_msg(t, "error_no_id", -1, &env.base);
}

static void seeds_admin_reply(void)
{
    const char *t = "admin_reply";
    River__Admin__AdminReply r = RIVER__ADMIN__ADMIN_REPLY__INIT;
    r.id = 1;

    River__Admin__StatusReply st = RIVER__ADMIN__STATUS_REPLY__INIT;
    st.version = "0.1.0";
    st.uptime_s = 3600;
    st.workers_ready = 2;
    st.workers_total = 3;
    st.queue_length = 4;
    st.queue_capacity = 256;
    st.running = 32;
    st.requests_total = 100000;
    st.requests_failed = 3;
    r.kind_case = RIVER__ADMIN__ADMIN_REPLY__KIND_STATUS;
    r.status = &st;
    seed_msg(t, "status", 0, &r.base);

    River__Worker__Capabilities cap = RIVER__WORKER__CAPABILITIES__INIT;
    cap.model = "tests/data/tinystories-656k";
    cap.max_batch = 64;
    cap.max_seqs = 16;
    cap.kv_page_size = 16;
    cap.kv_pages_total = 512;
    cap.n_layers = 8;
    cap.max_context = 512;
    River__Admin__WorkerInfo w0 = RIVER__ADMIN__WORKER_INFO__INIT, w1 = w0;
    w0.worker_id = "local-1";
    w0.role = RIVER__WORKER__ROLE__ROLE_FULL;
    w0.state = RIVER__ADMIN__WORKER_INFO__STATE__READY;
    w0.capabilities = &cap;
    w0.running = 12;
    w0.kv_pages_free = 300;
    w0.supervised = 1;
    w1.worker_id = "local-2";
    w1.state = RIVER__ADMIN__WORKER_INFO__STATE__STARTING;
    w1.supervised = 1;
    River__Admin__WorkerInfo *ws[] = {&w0, &w1};
    River__Admin__WorkersReply wr = RIVER__ADMIN__WORKERS_REPLY__INIT;
    wr.n_workers = 2;
    wr.workers = ws;
    r.kind_case = RIVER__ADMIN__ADMIN_REPLY__KIND_WORKERS;
    r.workers = &wr;
    seed_msg(t, "workers", 1, &r.base);

    River__Admin__DrainReply dr = RIVER__ADMIN__DRAIN_REPLY__INIT;
    dr.draining = 1;
    r.kind_case = RIVER__ADMIN__ADMIN_REPLY__KIND_DRAIN;
    r.drain = &dr;
    seed_msg(t, "drain", 2, &r.base);

    River__Admin__ScaleReply sr = RIVER__ADMIN__SCALE_REPLY__INIT;
    sr.previous = 1;
    sr.target = 2;
    r.kind_case = RIVER__ADMIN__ADMIN_REPLY__KIND_SCALE;
    r.scale = &sr;
    seed_msg(t, "scale", 3, &r.base);

    char *applied[] = {"limits.max_tokens", "queue_length"};
    char *restart[] = {"endpoints.clients"};
    River__Admin__ReloadReply rr = RIVER__ADMIN__RELOAD_REPLY__INIT;
    rr.n_applied = 2;
    rr.applied = applied;
    rr.n_needs_restart = 1;
    rr.needs_restart = restart;
    r.kind_case = RIVER__ADMIN__ADMIN_REPLY__KIND_RELOAD;
    r.reload = &rr;
    seed_msg(t, "reload", 4, &r.base);

    River__Admin__MetricsReply mr = RIVER__ADMIN__METRICS_REPLY__INIT;
    mr.text = "# TYPE river_requests_total counter\nriver_requests_total 42\n";
    r.kind_case = RIVER__ADMIN__ADMIN_REPLY__KIND_METRICS;
    r.metrics = &mr;
    seed_msg(t, "metrics", 5, &r.base);

    River__Client__Error err = RIVER__CLIENT__ERROR__INIT;
    err.code = RIVER__CLIENT__ERROR__CODE__INVALID_ARGUMENT;
    err.message = "no worker named w9";
    r.kind_case = RIVER__ADMIN__ADMIN_REPLY__KIND_ERROR;
    r.error = &err;
    seed_msg(t, "error", 2, &r.base);
    /* riverd's answer to a request it could not read has id 0. */
    r.id = 0;
    seed_msg(t, "error_id0", 0, &r.base);
    /* A reply of another kind than the call's. */
    r.id = 1;
    r.kind_case = RIVER__ADMIN__ADMIN_REPLY__KIND_SCALE;
    r.scale = &sr;
    seed_msg(t, "wrong_kind", 0, &r.base);
}

static void seeds_pair(const model_t *m)
{
    const char *t = "pair";
    backend_t *be = NULL;
    kv_pool_t *kv = NULL;
    int memfd = -1;
    char fp[MODEL_FINGERPRINT_LEN];
    const model_config_t *c = &m->cfg;
    if (cpu_backend_new(&be, 1, CPU_SIMD_COUNT) < 0 || model_fingerprint(m, fp) < 0 ||
        kv_pool_new_shared(&kv, be, c->n_layers, c->n_kv_heads * c->head_dim, DTYPE_F32,
                           FUZZ_PAIR_PAGE,
                           FUZZ_PAIR_PAGES, &memfd) < 0) {
        fprintf(stderr, "seeds: pair: %s\n", river_err_detail());
        exit(1);
    }
    /* Backbone side (selector 0): what a river worker sends. */
    size_t len;
    uint8_t *hello = fuzz_pair_hello(m, memfd, fp, pair_backend_name(be),
                                     cpu_backend_threads(be), &len);
    uint8_t *buf = malloc(len + 1);
    if (!buf) {
        fprintf(stderr, "seeds: out of memory\n");
        exit(1);
    }
    buf[0] = 0;
    memcpy(buf + 1, hello, len);
    seed_write(t, "backbone_hello", buf, len + 1);
    free(buf);
    free(hello);

    /* Two rows of one sequence at positions 0 and 1, one page. */
    float hidden[2 * 8];
    for (int i = 0; i < 2 * c->dim && i < 16; i++)
        hidden[i] = (float)i / 16.0f;
    int32_t pos[] = {0, 1};
    uint32_t row_table[] = {0, 0};
    uint32_t table_len[] = {1};
    int32_t pages[] = {2};
    River__Pair__LayerRequest q = RIVER__PAIR__LAYER_REQUEST__INIT;
    q.seq = 1;
    q.layer = FUZZ_PAIR_BOUNDARY;
    q.n = 2;
    q.n_pos = 2;
    q.pos = pos;
    q.n_row_table = 2;
    q.row_table = row_table;
    q.n_table_len = 1;
    q.table_len = table_len;
    q.n_pages = 1;
    q.pages = pages;
    q.hidden.len = (size_t)2 * (size_t)c->dim * sizeof(float);
    q.hidden.data = (uint8_t *)hidden;
    River__Pair__RiverMessage rm = RIVER__PAIR__RIVER_MESSAGE__INIT;
    rm.kind_case = RIVER__PAIR__RIVER_MESSAGE__KIND_LAYER;
    rm.layer = &q;
    seed_msg(t, "backbone_layer", 0, &rm.base);
    seed_msg(t, "backbone_layer_stranger", 0x20, &rm.base);
    River__Pair__Ping ping = RIVER__PAIR__PING__INIT;
    rm.kind_case = RIVER__PAIR__RIVER_MESSAGE__KIND_PING;
    rm.ping = &ping;
    seed_msg(t, "backbone_ping", 0, &rm.base);
    seed_msg(t, "backbone_ping_two_parts", 0x10, &rm.base);

    /* River side, outside a round trip (selector 1): the answers to a hello. */
    River__Pair__PairHelloOk ok = RIVER__PAIR__PAIR_HELLO_OK__INIT;
    ok.backbone_pid = 0;
    ok.layer_begin = FUZZ_PAIR_BOUNDARY;
    ok.layer_end = (uint32_t)c->n_layers;
    River__Pair__BackboneMessage bm = RIVER__PAIR__BACKBONE_MESSAGE__INIT;
    bm.kind_case = RIVER__PAIR__BACKBONE_MESSAGE__KIND_HELLO_OK;
    bm.hello_ok = &ok;
    seed_msg(t, "river_hello_ok", 1, &bm.base);
    River__Pair__PairError pe = RIVER__PAIR__PAIR_ERROR__INIT;
    pe.message = "model fingerprint 0123 differs from this backbone's 4567";
    bm.kind_case = RIVER__PAIR__BACKBONE_MESSAGE__KIND_ERROR;
    bm.error = &pe;
    seed_msg(t, "river_refused", 1, &bm.base);
    River__Pair__Pong pong = RIVER__PAIR__PONG__INIT;
    bm.kind_case = RIVER__PAIR__BACKBONE_MESSAGE__KIND_PONG;
    bm.pong = &pong;
    seed_msg(t, "river_pong", 1, &bm.base);

    /* River side, inside a round trip (selector 2): the reply to one row's layer. */
    River__Pair__LayerReply lr = RIVER__PAIR__LAYER_REPLY__INIT;
    lr.seq = 1;
    lr.hidden.len = (size_t)c->dim * sizeof(float);
    lr.hidden.data = (uint8_t *)hidden;
    bm.kind_case = RIVER__PAIR__BACKBONE_MESSAGE__KIND_LAYER;
    bm.layer = &lr;
    seed_msg(t, "trip_reply", 2, &bm.base);
    pe.seq = 1;
    pe.message = "page 9 outside the pool of 4";
    bm.kind_case = RIVER__PAIR__BACKBONE_MESSAGE__KIND_ERROR;
    bm.error = &pe;
    seed_msg(t, "trip_error", 2, &bm.base);
    pe.seq = 0;
    pe.message = "not paired: send PairHello first";
    seed_msg(t, "trip_unpaired", 2, &bm.base);

    kv_pool_destroy(&kv);
    cpu_backend_destroy(&be);
}

/* GGUF files: the tiny model exported in two types with stories260K's tokenizer, that
 * tokenizer alone, and one key of every metadata type. */
static void seeds_gguf(const model_t *m)
{
    static const char *const types[] = {"q8_0", "q4_0"};
    char path[128];
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof path, "%s/seed.gguf", fuzz_dir_get());
        gguf_export_opts_t o = {.type = types[i], .tokenizer = "tests/data/stories260K/tok512.bin",
                                .name = "tiny"};
        if (gguf_export_model(m, path, &o) != 0) {
            fprintf(stderr, "seeds: gguf: %s\n", river_err_detail());
            exit(1);
        }
        size_t len;
        char *data = NULL;
        if (river_read_file(path, &data, &len) != 0) {
            fprintf(stderr, "seeds: %s\n", river_err_detail());
            exit(1);
        }
        char name[32];
        snprintf(name, sizeof name, "tiny-%s.gguf", types[i]);
        seed_write("gguf", name, data, len);
        free(data);
        unlink(path);
    }
    for (int k = 0; k < 2; k++) {
        gguf_writer_t *w;
        int e = gguf_writer_new(&w);
        if (!e && k == 0) {
            e = gguf_export_tokenizer(w, "tests/data/stories260K/tok512.bin", 512, -1, -1);
        } else if (!e) {
            uint8_t u8 = 1;
            int8_t i8 = -1;
            uint16_t u16 = 2;
            int16_t i16 = -2;
            uint64_t u64 = 3;
            int64_t i64 = -3;
            double f64 = 0.5;
            int32_t arr[3] = {1, 2, 3};
            const char *strs[2] = {"a", "bc"};
            const void *vals[] = {&u8, &i8, &u16, &i16, &u64, &i64, &f64};
            const gguf_type_t ts[] = {GGUF_TYPE_UINT8,  GGUF_TYPE_INT8,  GGUF_TYPE_UINT16,
                                      GGUF_TYPE_INT16,  GGUF_TYPE_UINT64, GGUF_TYPE_INT64,
                                      GGUF_TYPE_FLOAT64};
            for (int i = 0; i < 7 && !e; i++) {
                char key[16];
                snprintf(key, sizeof key, "k.%s", gguf_type_name(ts[i]));
                e = gguf_writer_set_scalar(w, key, ts[i], vals[i]);
            }
            if (!e)
                e = gguf_writer_set_u32(w, "general.alignment", 64);
            if (!e)
                e = gguf_writer_set_arr(w, "k.arr", GGUF_TYPE_INT32, arr, 3);
            if (!e)
                e = gguf_writer_set_arr_str(w, "k.strs", strs, NULL, 2);
        }
        snprintf(path, sizeof path, "%s/seed.gguf", fuzz_dir_get());
        if (!e)
            e = gguf_writer_write(w, path);
        gguf_writer_destroy(&w);
        size_t len;
        char *data = NULL;
        if (e || river_read_file(path, &data, &len) != 0) {
            fprintf(stderr, "seeds: gguf: %s\n", river_err_detail());
            exit(1);
        }
        seed_write("gguf", k == 0 ? "tok512.gguf" : "metadata.gguf", data, len);
        free(data);
        unlink(path);
    }
}

int main(void)
{
    const model_t *m = fuzz_tiny();
    seeds_river(m);
    seeds_router(m);
    seeds_client_reply();
    seeds_admin_reply();
    seeds_pair(m);
    seeds_gguf(m);
    return 0;
}
