/* The fuzz entry points (fuzz/targets.h). File parsers take a path, so their targets write
 * the input to a file in a per-process temporary directory and open that, as the engine
 * would open a downloaded checkpoint. Handlers of a peer's frames are driven through their
 * real sockets: the target plays the peer (riverd for the client library, the other half
 * for the split pair) over ipc:// in the same directory. */
#include "fuzz/targets.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include <zmq.h>

#include "client/river_client.h"
#include "daemon/config.h"
#include "common/clock.h"
#include "common/err.h"
#include "common/frame.h"
#include "common/gguf.h"
#include "common/log.h"
#include "model/fingerprint.h"
#include "text/chat_template.h"
#include "engine/kv_pool.h"
#include "model/model.h"
#include "model/model_internal.h"
#include "offline/quant.h"
#include "engine/exitriver.h"
#include "engine/router.h"
#include "model/safetensors.h"
#include "text/grammar.h"
#include "text/tokenizer.h"
#include "gateway/gateway.h"
#include "kernels/cpu/cpu.h"
#include "proto/river_pair.pb-c.h"
#include "workers/config.h"
#include "workers/link.h"
#include "workers/pair.h"

/* A per-process directory, created on first use and removed at exit with what is in it;
 * NULL when it cannot be made (the file targets then do nothing: no input can be blamed). */
static char fuzz_dir[64];

static void fuzz_dir_remove(void)
{
    static const char *names[] = {"model.gguf",         "model.bin",         "config.json",
                                  "model.safetensors",  "tokenizer.json",    "river.safetensors",
                                  "routers.safetensors", "tiny/model.bin",   "clients.sock",
                                  "admin.sock",         "backbone.sock",     "river.sock",
                                  "api-keys"};
    char p[128];
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        snprintf(p, sizeof p, "%s/%s", fuzz_dir, names[i]);
        unlink(p);
    }
    snprintf(p, sizeof p, "%s/tiny", fuzz_dir);
    rmdir(p);
    rmdir(fuzz_dir);
}

static const char *fuzz_dir_get(void)
{
    if (!fuzz_dir[0]) {
        const char *tmp = getenv("TMPDIR");
        snprintf(fuzz_dir, sizeof fuzz_dir, "%.40s/river-fuzz-XXXXXX", tmp && *tmp ? tmp : "/tmp");
        if (!mkdtemp(fuzz_dir)) {
            fuzz_dir[0] = 0;
            return NULL;
        }
        atexit(fuzz_dir_remove);
    }
    return fuzz_dir;
}

static const char *fuzz_write(const char *name, const uint8_t *data, size_t size)
{
    static char path[128];
    if (!fuzz_dir_get())
        return NULL;
    snprintf(path, sizeof path, "%s/%s", fuzz_dir, name);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0)
        return NULL;
    size_t off = 0;
    while (off < size) {
        ssize_t w = write(fd, data + off, size - off);
        if (w <= 0) {
            close(fd);
            return NULL;
        }
        off += (size_t)w;
    }
    close(fd);
    return path;
}

/* ---- Frames: what a peer can send each daemon ---- */

static void fuzz_frame(frame_kind_t kind, const uint8_t *data, size_t size)
{
    ProtobufCMessage *m = NULL;
    if (frame_decode(kind, data, size, 0, &m) == 0) {
        /* What the daemons do next with a decoded frame: log its name, re-encode replies. */
        (void)frame_case_name(m);
        uint8_t *buf;
        size_t len;
        if (frame_encode_buf(m, &buf, &len) == 0)
            free(buf);
    }
    frame_free(&m);
}

static void fuzz_frame_client_request(const uint8_t *d, size_t n)
{
    fuzz_frame(FRAME_CLIENT_REQUEST, d, n);
}
static void fuzz_frame_worker_message(const uint8_t *d, size_t n)
{
    fuzz_frame(FRAME_WORKER_MESSAGE, d, n);
}
static void fuzz_frame_daemon_message(const uint8_t *d, size_t n)
{
    fuzz_frame(FRAME_DAEMON_MESSAGE, d, n);
}
static void fuzz_frame_admin_request(const uint8_t *d, size_t n)
{
    fuzz_frame(FRAME_ADMIN_REQUEST, d, n);
}

/* ---- Model files ---- */

static void fuzz_safetensors(const uint8_t *d, size_t n)
{
    const char *p = fuzz_write("model.safetensors", d, n);
    safetensors_t *f = NULL;
    if (p && safetensors_open(&f, p) == 0) {
        /* Touch what the loader reads: every tensor's bytes and the metadata. */
        volatile unsigned char sink = 0;
        for (size_t i = 0; i < safetensors_count(f); i++) {
            const safetensors_tensor_t *t = safetensors_tensor_at(f, i);
            if (t->nbytes)
                sink ^= ((const unsigned char *)t->data)[0] ^
                        ((const unsigned char *)t->data)[t->nbytes - 1];
        }
        (void)safetensors_metadata(f, "format");
        (void)sink;
        safetensors_destroy(&f);
    }
}

/* GGUF: the container parsed in memory with every key, array element and tensor touched
 * through the accessors, then the same bytes as a model file and as a tokenizer. */
static void fuzz_gguf(const uint8_t *d, size_t n)
{
    gguf_t *g = NULL;
    if (gguf_open_mem(&g, d, n, "fuzz.gguf") == 0) {
        volatile uint64_t sink = 0;
        for (uint64_t i = 0; i < g->n_kv; i++) {
            const gguf_kv_t *kv = &g->kv[i];
            int64_t v;
            float f;
            const char *s;
            size_t len;
            if (gguf_get_i64(g, kv->key, &v) == 0)
                sink += (uint64_t)v;
            if (gguf_get_f32(g, kv->key, &f) == 0)
                sink += (uint64_t)(f == f);
            if (gguf_get_str(g, kv->key, &s, &len) == 0 && len)
                sink += (unsigned char)s[len - 1];
            for (uint64_t k = 0; kv->type == GGUF_TYPE_ARRAY && k < kv->n && k < 4096; k++) {
                if (kv->arr_type == GGUF_TYPE_STRING) {
                    s = gguf_arr_str(kv, k, &len);
                    sink += len ? (unsigned char)s[len - 1] : 0;
                } else if (kv->arr_type == GGUF_TYPE_FLOAT32 || kv->arr_type == GGUF_TYPE_FLOAT64) {
                    sink += (uint64_t)(gguf_arr_float(kv, k) == 0);
                } else {
                    sink += (uint64_t)gguf_arr_int(kv, k);
                }
            }
        }
        for (uint64_t i = 0; i < g->n_tensors; i++) {
            const gguf_tensor_t *t = &g->tensors[i];
            if (t->size)
                sink += ((const unsigned char *)t->data)[0] ^
                        ((const unsigned char *)t->data)[t->size - 1];
            sink += gguf_find_tensor(g, t->name) == t;
        }
        (void)sink;
        gguf_destroy(&g);
    }
    const char *p = fuzz_write("model.gguf", d, n);
    model_t *m = NULL;
    if (p && model_load(&m, p) == 0)
        model_destroy(&m);
    tokenizer_t *t = NULL;
    if (p && tokenizer_load(&t, p, 0) == 0) {
        int32_t *ids = NULL;
        size_t n_ids = 0;
        static const char text[] = "<s>Hello, w\xc3\xb6rld 12 \xe2\x96\x81</s>";
        if (tokenizer_encode(t, text, sizeof text - 1, 1, &ids, &n_ids) == 0)
            free(ids);
        tokenizer_destroy(&t);
    }
}

static void fuzz_llama2c(const uint8_t *d, size_t n)
{
    const char *p = fuzz_write("model.bin", d, n);
    model_t *m = NULL;
    if (p && model_load(&m, p) == 0)
        model_destroy(&m);
}

static void fuzz_hfconfig(const uint8_t *d, size_t n)
{
    const char *p = fuzz_write("config.json", d, n);
    model_config_t cfg;
    memset(&cfg, 0, sizeof cfg);
    if (p && hfconfig_load(&cfg, p) == 0)
        hfconfig_free(&cfg);
}

static void fuzz_tokenizer(const uint8_t *d, size_t n)
{
    const char *p = fuzz_write("tokenizer.json", d, n);
    tokenizer_t *t = NULL;
    if (!p || tokenizer_load(&t, p, 0) != 0)
        return;
    /* Added tokens, spaces, digits, bytes outside ASCII and a lone continuation byte. */
    static const char text[] = "<s>Hello, world! 12345  \xc3\xa9t\xc3\xa9 \xe2\x9c\x93\n\t</s>"
                               "\x80 end";
    int32_t *ids = NULL;
    size_t n_ids = 0;
    if (tokenizer_encode(t, text, sizeof text - 1, 1, &ids, &n_ids) == 0) {
        char *out = NULL;
        size_t len = 0;
        if (tokenizer_decode(t, ids, n_ids, 0, &out, &len) == 0)
            free(out);
        free(ids);
    }
    tokenizer_destroy(&t);
}

/* ---- Chat templates: the input is template source, rendered with a small fixed
 * conversation (system, user, an assistant tool call, a tool result) and one tool ---- */

static const char fuzz_ct_context[] =
    "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"},"
    " {\"role\": \"user\", \"content\": \"Weather in Paris? \\u00e9\\u4e2d\"},"
    " {\"role\": \"assistant\", \"content\": null, \"tool_calls\": [{\"id\": \"call12345\","
    " \"type\": \"function\", \"function\": {\"name\": \"get_weather\","
    " \"arguments\": {\"city\": \"Paris\"}}}]},"
    " {\"role\": \"tool\", \"tool_call_id\": \"call12345\", \"content\": \"22C\"},"
    " {\"role\": \"assistant\", \"content\": \"<think>ok</think>It is 22C.\"}],"
    " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\","
    " \"description\": \"Weather now\", \"parameters\": {\"type\": \"object\","
    " \"properties\": {\"city\": {\"type\": \"string\", \"description\": \"City\"}},"
    " \"required\": [\"city\"]}}}],"
    " \"add_generation_prompt\": true, \"bos_token\": \"<s>\", \"eos_token\": \"</s>\","
    " \"n\": 3, \"f\": 2.5, \"flag\": false}";

static void fuzz_chat_template(const uint8_t *d, size_t n)
{
    static json_t *ctx;
    if (!ctx) {
        ctx = json_loads(fuzz_ct_context, 0, NULL);
        if (!ctx)
            return;
        setenv("RIVER_NOW", "2024-07-26T10:30:00", 1);
    }
    /* The source is a C string: it ends at the first NUL. */
    char *src = malloc(n + 1);
    if (!src)
        return;
    memcpy(src, d, n);
    src[n] = 0;
    chat_template_t *t = NULL;
    if (chat_template_new(&t, "fuzz", src) == 0) {
        char *out = NULL;
        size_t len = 0, n_spans = 0;
        text_span_t *spans = NULL;
        if (chat_template_render_spans(t, ctx, 0, &out, &len, &spans, &n_spans) == 0) {
            /* The template's bytes: in order, disjoint, inside the output. */
            size_t end = 0;
            for (size_t i = 0; i < n_spans; i++) {
                if (spans[i].off < end || spans[i].len == 0 || spans[i].off > len ||
                    spans[i].len > len - spans[i].off)
                    abort();
                end = spans[i].off + spans[i].len;
            }
            free(out);
            free(spans);
        }
        chat_template_destroy(&t);
    }
    free(src);
}

/* ---- YAML configuration: each input as both schemas ---- */

static void fuzz_config_yaml(const uint8_t *d, size_t n)
{
    config_riverd_t rd;
    config_worker_t wk;
    if (config_load_string(&config_schema_riverd, "fuzz.yaml", (const char *)d, n, &rd) == 0)
        config_free(&config_schema_riverd, &rd);
    if (config_load_string(&config_schema_worker, "fuzz.yaml", (const char *)d, n, &wk) == 0)
        config_free(&config_schema_worker, &wk);
}

/* ---- Shared by the targets below ---- */

/* A target that cannot set itself up (no temporary directory, no socket) would pass every
 * input without running it; it stops the run instead, saying why. */
static void fuzz_fail(const char *what)
{
    fprintf(stderr, "fuzz: %s: %s (errno: %s)\n", what, river_err_detail(), strerror(errno));
    abort();
}

/* A message packed into a fresh malloc'd buffer. */
static uint8_t *fuzz_pack(const ProtobufCMessage *m, size_t *len)
{
    *len = protobuf_c_message_get_packed_size(m);
    uint8_t *buf = malloc(*len ? *len : 1);
    if (!buf)
        fuzz_fail("out of memory");
    protobuf_c_message_pack(m, buf);
    return buf;
}

/* The tiny model (llama2.c header order): dim 8, hidden 16, 2 layers, 2 heads sharing 1 KV
 * head, 16 tokens with an untied classifier (the negative size), 8 positions. */
static const int32_t fuzz_tiny_header[7] = {8, 16, 2, 2, 1, -16, 8};

int fuzz_tiny_model_write(const char *path)
{
    const int32_t *h = fuzz_tiny_header;
    int64_t D = h[0], H = h[1], NL = h[2], hs = D / h[3], kv = hs * h[4], V = -h[5];
    int64_t per_layer = D + D * D + 2 * kv * D + D * D + D + 3 * H * D;
    int64_t floats = V * D + NL * per_layer + D + h[6] * hs + V * D;
    FILE *f = fopen(path, "wb");
    if (!f)
        return river_err_set(RIVER_ESYS, "%s: %s", path, strerror(errno));
    bool ok = fwrite(h, sizeof *h, 7, f) == 7;
    /* xorshift32 from a fixed state: the same bytes on every run, so that the fingerprint
     * of the model matches the one in the river and router seeds. */
    uint32_t s = 0x9e3779b9u;
    for (int64_t i = 0; ok && i < floats; i++) {
        s ^= s << 13;
        s ^= s >> 17;
        s ^= s << 5;
        float v = (float)(s >> 8) / (float)(1u << 24) - 0.5f;
        ok = fwrite(&v, sizeof v, 1, f) == 1;
    }
    if (fclose(f) != 0)
        ok = false;
    return ok ? 0 : river_err_set(RIVER_EIO, "%s: short write", path);
}

static model_t *fuzz_tiny_model;

static void fuzz_tiny_free(void)
{
    model_destroy(&fuzz_tiny_model);
}

/* The tiny model, written and loaded on first use. It lives in a directory of its own:
 * a llama2.c loader reads config.json beside the file, which the hfconfig target writes. */
const model_t *fuzz_tiny(void)
{
    if (fuzz_tiny_model)
        return fuzz_tiny_model;
    char p[128];
    if (!fuzz_dir_get())
        fuzz_fail("temporary directory");
    snprintf(p, sizeof p, "%s/tiny", fuzz_dir);
    if (mkdir(p, 0700) != 0 && errno != EEXIST)
        fuzz_fail(p);
    snprintf(p, sizeof p, "%s/tiny/model.bin", fuzz_dir);
    if (fuzz_tiny_model_write(p) < 0 || model_load(&fuzz_tiny_model, p) < 0)
        fuzz_fail("tiny model");
    atexit(fuzz_tiny_free);
    return fuzz_tiny_model;
}

/* ---- Exit River and router files, checked against the tiny model ---- */

/* Every row of a loaded weight, dequantized as the kernels read it. */
static void fuzz_weight_rows(const weight_t *w)
{
    if (!w->data || w->cols <= 0 || w->rows <= 0)
        return;
    float *row = malloc((size_t)w->cols * sizeof *row);
    if (!row)
        fuzz_fail("out of memory");
    for (int64_t i = 0; i < w->rows; i++)
        (void)quant_row_f32(w, i, row);
    free(row);
}

static void fuzz_river(const uint8_t *d, size_t n)
{
    const model_t *m = fuzz_tiny();
    const char *p = fuzz_write("river.safetensors", d, n);
    if (!p)
        return;
    exitriver_t *r = NULL;
    int e = exitriver_load(&r, m, p);
    /* A bad file is an error code with its detail, never anything else. */
    if (e > 0 || (e < 0 && (r || !river_err_detail()[0])))
        abort();
    if (e)
        return;
    for (int l = 0; l < m->cfg.n_layers; l++) {
        const layer_weights_t *L = exitriver_layer(r, l);
        if (!L)
            continue;
        const weight_t *mats[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up,
                                  &L->w_down};
        for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++)
            fuzz_weight_rows(mats[i]);
    }
    if (exitriver_head(r))
        fuzz_weight_rows(exitriver_head(r));
    (void)exitriver_fingerprint_of(r);
    exitriver_destroy(&r);
}

static void fuzz_router(const uint8_t *d, size_t n)
{
    const model_t *m = fuzz_tiny();
    const char *p = fuzz_write("routers.safetensors", d, n);
    if (!p)
        return;
    router_set_t *s = NULL;
    int e = router_set_load(&s, m, p);
    if (e > 0 || (e < 0 && (s || !river_err_detail()[0])))
        abort();
    if (e)
        return;
    /* What the exit rule does with a set: a probability at every checkpoint, and the
     * post-hoc search over all layers. */
    int dim = m->cfg.dim, nl = m->cfg.n_layers;
    float *h = malloc((size_t)dim * sizeof *h);
    const float **by_layer = calloc((size_t)nl, sizeof *by_layer);
    if (!h || !by_layer)
        fuzz_fail("out of memory");
    for (int i = 0; i < dim; i++)
        h[i] = (float)(i + 1) / (float)dim;
    for (int l = 0; l < nl; l++) {
        (void)router_prob(s, l, h);
        by_layer[l] = h;
    }
    (void)router_set_first_exit(s, by_layer, 0.5f);
    free(by_layer);
    free(h);
    router_set_destroy(&s);
}

/* ---- Replies riverd sends to the client library (and so to riverctl) ---- */

/* Sends [route][body] from a ROUTER. */
static int fuzz_route_send(void *sock, const uint8_t *route, size_t route_len, const void *body,
                           size_t len)
{
    if (zmq_send(sock, route, route_len, ZMQ_SNDMORE) < 0)
        return -1;
    return zmq_send(sock, body, len, 0) < 0 ? -1 : 0;
}

/* Receives one message on a ROUTER (flags 0: within the socket's receive timeout): the
 * sender's routing id into route (when not NULL) and the first part after it into *body
 * (malloc'd; when body is not NULL). */
static int fuzz_route_recv(void *sock, int flags, uint8_t route[256], size_t *route_len,
                           uint8_t **body, size_t *len)
{
    zmq_msg_t m;
    zmq_msg_init(&m);
    if (zmq_msg_recv(&m, sock, flags) < 0) {
        zmq_msg_close(&m);
        return -1;
    }
    if (route) {
        *route_len = zmq_msg_size(&m) < 256 ? zmq_msg_size(&m) : 256;
        memcpy(route, zmq_msg_data(&m), *route_len);
    }
    int more = zmq_msg_more(&m), part = 0;
    zmq_msg_close(&m);
    if (body)
        *body = NULL;
    while (more) {
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, sock, 0) < 0) {
            zmq_msg_close(&m);
            return -1;
        }
        if (part++ == 0 && body) {
            *len = zmq_msg_size(&m);
            *body = malloc(*len ? *len : 1);
            if (!*body)
                fuzz_fail("out of memory");
            memcpy(*body, zmq_msg_data(&m), *len);
        }
        more = zmq_msg_more(&m);
        zmq_msg_close(&m);
    }
    return 0;
}

/* A ROUTER bound at dir/name that never waits long and never lingers. */
static void *fuzz_router_bind(void *zctx, const char *name, char *endpoint, size_t cap)
{
    if (!fuzz_dir_get())
        fuzz_fail("temporary directory");
    snprintf(endpoint, cap, "ipc://%s/%s", fuzz_dir, name);
    void *s = zmq_socket(zctx, ZMQ_ROUTER);
    int zero = 0, wait = 5000;
    if (!s || zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero) ||
        zmq_setsockopt(s, ZMQ_RCVTIMEO, &wait, sizeof wait) || zmq_bind(s, endpoint))
        fuzz_fail(endpoint);
    return s;
}

/* The client side: one client with two requests in flight, fed by a fake riverd. */
static const char *const fuzz_client_ids[2] = {"fuzz-0", "fuzz-1"};

static struct {
    void *zctx, *router;
    river_client_t *c;
    uint8_t route[256];
    size_t route_len;
    bool live[2];
} fz_client;

static void fuzz_client_close(void)
{
    river_client_destroy(&fz_client.c);
    zmq_close(fz_client.router);
    zmq_ctx_term(fz_client.zctx);
}

/* What riverctl reads of an event: the text (into JSON), the ids and exit layers, the
 * finish reason or the error's code and message. */
static void fuzz_client_event(void *user, const river_event_t *ev)
{
    bool *live = user;
    volatile unsigned sink = 0;
    json_t *t = json_stringn(ev->text ? ev->text : "", ev->text ? ev->text_len : 0);
    json_decref(t);
    for (size_t i = 0; i < ev->text_len; i++)
        sink += (unsigned char)ev->text[i];
    for (size_t i = 0; i < ev->n_ids; i++)
        sink += (unsigned)ev->ids[i];
    for (size_t i = 0; i < ev->n_exit_layers; i++)
        sink += (unsigned)ev->exit_layers[i];
    sink += (unsigned)strlen(ev->request_id);
    if (ev->kind == RIVER_EVENT_CHUNK)
        return;
    sink += (unsigned)strlen(river_finish_name(ev->finish));
    sink += (unsigned)strlen(river_code_name(ev->code));
    if (ev->message)
        sink += (unsigned)strlen(ev->message);
    (void)sink;
    *live = false;
}

/* Puts both requests in flight again; the fake riverd reads each Generate, which also
 * tells it where the client is. */
static void fuzz_client_submit(void)
{
    for (int i = 0; i < 2; i++) {
        if (fz_client.live[i])
            continue;
        river_generate_opts_t o = RIVER_GENERATE_OPTS_INIT;
        o.prompt = "Once upon a time";
        o.max_tokens = 8;
        if (river_client_submit(fz_client.c, &o, fuzz_client_ids[i], fuzz_client_event,
                                &fz_client.live[i], NULL) < 0)
            fuzz_fail("client: submit");
        fz_client.live[i] = true;
        if (fuzz_route_recv(fz_client.router, 0, fz_client.route, &fz_client.route_len, NULL,
                            NULL))
            fuzz_fail("client: the Generate did not arrive");
    }
}

static void fuzz_client_reply(const uint8_t *d, size_t n)
{
    if (!fz_client.c) {
        char ep[160];
        if (!(fz_client.zctx = zmq_ctx_new()))
            fuzz_fail("zmq_ctx_new");
        fz_client.router = fuzz_router_bind(fz_client.zctx, "clients.sock", ep, sizeof ep);
        if (river_client_new(&fz_client.c, ep) < 0)
            fuzz_fail("river_client_new");
        atexit(fuzz_client_close);
    }
    fuzz_client_submit();
    if (fuzz_route_send(fz_client.router, fz_client.route, fz_client.route_len, d, n) ||
        river_client_poll(fz_client.c, 5000) < 0)
        fuzz_fail("client: reply");
    /* Ends what is still in flight, so that every input meets the same two fresh
     * requests. */
    for (int i = 0; i < 2; i++) {
        if (!fz_client.live[i])
            continue;
        River__Client__Final f = RIVER__CLIENT__FINAL__INIT;
        f.request_id = (char *)fuzz_client_ids[i];
        f.reason = RIVER__CLIENT__FINAL__REASON__LENGTH;
        River__Client__ClientReply env = RIVER__CLIENT__CLIENT_REPLY__INIT;
        env.kind_case = RIVER__CLIENT__CLIENT_REPLY__KIND_FINAL;
        env.final = &f;
        size_t len;
        uint8_t *buf = fuzz_pack(&env.base, &len);
        int rc = fuzz_route_send(fz_client.router, fz_client.route, fz_client.route_len, buf,
                                 len);
        free(buf);
        if (rc)
            fuzz_fail("client: final");
    }
    for (int tries = 0; river_client_in_flight(fz_client.c) > 0; tries++)
        if (tries == 50 || river_client_poll(fz_client.c, 100) < 0)
            fuzz_fail("client: the requests did not end");
}

/* ---- Admin replies (riverctl's commands, through the client library) ---- */

static struct {
    void *zctx, *router;
    river_admin_t *a;
    uint8_t route[256];
    size_t route_len;
    uint64_t calls; /* admin calls made: the library numbers them 1, 2, ... */
} fz_admin;

static void fuzz_admin_close(void)
{
    river_admin_destroy(&fz_admin.a);
    zmq_close(fz_admin.router);
    zmq_ctx_term(fz_admin.zctx);
}

/* The fake riverd cannot answer a call before it knows where the caller is, and a call
 * blocks: the first one is answered from a thread, which learns the route. */
static void *fuzz_admin_first(void *arg)
{
    (void)arg;
    uint8_t *body = NULL;
    size_t len = 0;
    if (fuzz_route_recv(fz_admin.router, 0, fz_admin.route, &fz_admin.route_len, &body, &len))
        return NULL;
    River__Admin__AdminRequest *q = river__admin__admin_request__unpack(NULL, len, body);
    free(body);
    River__Admin__StatusReply st = RIVER__ADMIN__STATUS_REPLY__INIT;
    st.version = "fuzz";
    River__Admin__AdminReply r = RIVER__ADMIN__ADMIN_REPLY__INIT;
    r.id = q ? q->id : 0;
    r.kind_case = RIVER__ADMIN__ADMIN_REPLY__KIND_STATUS;
    r.status = &st;
    if (q)
        river__admin__admin_request__free_unpacked(q, NULL);
    uint8_t *buf = fuzz_pack(&r.base, &len);
    (void)fuzz_route_send(fz_admin.router, fz_admin.route, fz_admin.route_len, buf, len);
    free(buf);
    return NULL;
}

static void fuzz_admin_setup(void)
{
    char ep[160];
    if (!(fz_admin.zctx = zmq_ctx_new()))
        fuzz_fail("zmq_ctx_new");
    fz_admin.router = fuzz_router_bind(fz_admin.zctx, "admin.sock", ep, sizeof ep);
    if (river_admin_new(&fz_admin.a, ep, 5000) < 0)
        fuzz_fail("river_admin_new");
    pthread_t t;
    if (pthread_create(&t, NULL, fuzz_admin_first, NULL) != 0)
        fuzz_fail("pthread_create");
    river_status_t st;
    int rc = river_admin_status(fz_admin.a, &st);
    pthread_join(t, NULL);
    if (rc < 0 || !fz_admin.route_len)
        fuzz_fail("admin: first call");
    fz_admin.calls = 1;
    atexit(fuzz_admin_close);
}

/* Input: one byte choosing the call (status, workers, drain, scale, reload, metrics), then
 * the reply frame. A frame that decodes gets the call's id, as riverd's reply would (an id
 * the library cannot match is skipped, which would leave every input on the timeout); one
 * that does not goes as it is. A fallback error with the call's id follows it, so that a
 * reply the library skips still ends the call at once; a fallback left over is skipped by
 * the next call, whose id differs. */
static void fuzz_admin_reply(const uint8_t *d, size_t n)
{
    if (n < 1)
        return;
    if (!fz_admin.a)
        fuzz_admin_setup();
    uint64_t id = ++fz_admin.calls;
    const uint8_t *frame = d + 1;
    size_t len = n - 1, plen = 0;
    uint8_t *patched = NULL;
    River__Admin__AdminReply *r = river__admin__admin_reply__unpack(NULL, len, frame);
    if (r) {
        if (!(r->id == 0 && r->kind_case == RIVER__ADMIN__ADMIN_REPLY__KIND_ERROR))
            r->id = id;
        patched = fuzz_pack(&r->base, &plen);
        river__admin__admin_reply__free_unpacked(r, NULL);
    }
    River__Client__Error err = RIVER__CLIENT__ERROR__INIT;
    err.code = RIVER__CLIENT__ERROR__CODE__INTERNAL;
    err.message = "fuzz: no reply";
    River__Admin__AdminReply fb = RIVER__ADMIN__ADMIN_REPLY__INIT;
    fb.id = id;
    fb.kind_case = RIVER__ADMIN__ADMIN_REPLY__KIND_ERROR;
    fb.error = &err;
    size_t fblen;
    uint8_t *fbuf = fuzz_pack(&fb.base, &fblen);
    if (fuzz_route_send(fz_admin.router, fz_admin.route, fz_admin.route_len,
                        patched ? patched : frame, patched ? plen : len) ||
        fuzz_route_send(fz_admin.router, fz_admin.route, fz_admin.route_len, fbuf, fblen))
        fuzz_fail("admin: send");
    free(patched);
    free(fbuf);
    river_admin_t *a = fz_admin.a;
    uint32_t u = 0;
    switch (d[0] % 6) {
    case 0: {
        river_status_t st;
        (void)river_admin_status(a, &st);
        break;
    }
    case 1: {
        river_worker_info_t *w = NULL;
        size_t k = 0;
        if (river_admin_workers(a, &w, &k) == 0) {
            /* What riverctl prints of each. */
            volatile size_t sink = 0;
            for (size_t i = 0; i < k; i++)
                sink += strlen(w[i].id) + strlen(w[i].state) + strlen(w[i].role) +
                        strlen(w[i].model);
            (void)sink;
            free(w);
        }
        break;
    }
    case 2: (void)river_admin_drain(a, "fuzz", 0, &u); break;
    case 3: (void)river_admin_scale(a, 2, &u); break;
    case 4: {
        char *applied = NULL, *restart = NULL;
        if (river_admin_reload(a, &applied, &restart) == 0) {
            free(applied);
            free(restart);
        }
        break;
    }
    default: {
        char *text = NULL;
        if (river_admin_metrics(a, &text) == 0)
            free(text);
        break;
    }
    }
    /* The requests the calls sent, read so that they do not pile up. */
    while (fuzz_route_recv(fz_admin.router, ZMQ_DONTWAIT, NULL, NULL, NULL, NULL) == 0)
        ;
}

/* ---- The split pair: both halves' handlers of the other's frames (workers/pair.c) ---- */

#define FUZZ_PAIR_BOUNDARY 1
#define FUZZ_PAIR_ROWS 4
#define FUZZ_PAIR_PAGE 4
#define FUZZ_PAIR_PAGES 4
/* A frame over the river side's size limit makes ZMQ drop the connection (and the route
 * the fake backbone knows); inputs are kept below it. */
#define FUZZ_PAIR_MAX_RIVER_FRAME 4096
#define FUZZ_PAIR_NO_REPLY "fuzz: no reply"

static struct {
    const model_t *m;
    void *zctx;
    backend_t *be;
    kv_pool_t *kv;            /* the river side's shared pool */
    int memfd;
    char fingerprint[MODEL_FINGERPRINT_LEN];
    char backend[64];
    char bb_endpoint[160], rv_endpoint[160];
    pair_backbone_t *bb;      /* the backbone half under test */
    void *peer, *stranger;    /* DEALERs: the river paired with it, and another one */
    pair_river_t *rv;         /* the river half under test */
    void *fake;               /* ROUTER: the backbone rv talks to */
    uint8_t route[256];       /* rv's current socket at the fake */
    size_t route_len;
    uint64_t seq;             /* LayerRequests rv has sent */
    int64_t clock;            /* what rv's ticks are told the time is */
    int32_t table[FUZZ_PAIR_PAGES];
} fz_pair;

static void fuzz_pair_close(void)
{
    pair_river_destroy(&fz_pair.rv);
    pair_backbone_destroy(&fz_pair.bb);
    zmq_close(fz_pair.peer);
    zmq_close(fz_pair.stranger);
    zmq_close(fz_pair.fake);
    zmq_ctx_term(fz_pair.zctx);
    kv_pool_destroy(&fz_pair.kv);
    cpu_backend_destroy(&fz_pair.be);
}

/* The hello a river worker of the tiny model sends: pool, fingerprint, kernels. */
uint8_t *fuzz_pair_hello(const model_t *m, int memfd, const char *fingerprint,
                         const char *backend, int threads, size_t *len)
{
    const model_config_t *c = &m->cfg;
    River__Pair__KvGeometry kv = RIVER__PAIR__KV_GEOMETRY__INIT;
    kv.n_layers = (uint32_t)c->n_layers;
    kv.kv_dim = (uint32_t)(c->n_kv_heads * c->head_dim);
    kv.page_size = FUZZ_PAIR_PAGE;
    kv.n_pages = FUZZ_PAIR_PAGES;
    kv.dtype = "f32";
    kv.bytes = kv_pool_shared_bytes(c->n_layers, c->n_kv_heads * c->head_dim, DTYPE_F32,
                                    FUZZ_PAIR_PAGE,
                                    FUZZ_PAIR_PAGES);
    River__Pair__PairHello h = RIVER__PAIR__PAIR_HELLO__INIT;
    h.protocol = PAIR_PROTOCOL;
    h.river_id = "fuzz-river";
    h.river_pid = (uint32_t)getpid();
    h.memfd = memfd;
    h.kv = &kv;
    h.fingerprint = (char *)fingerprint;
    h.boundary = FUZZ_PAIR_BOUNDARY;
    h.backend = (char *)backend;
    h.threads = (uint32_t)threads;
    h.max_rows = FUZZ_PAIR_ROWS;
    h.heartbeat_ms = 1000;
    h.liveness = 3;
    River__Pair__RiverMessage env = RIVER__PAIR__RIVER_MESSAGE__INIT;
    env.kind_case = RIVER__PAIR__RIVER_MESSAGE__KIND_HELLO;
    env.hello = &h;
    return fuzz_pack(&env.base, len);
}

static void *fuzz_pair_dealer(const char *endpoint)
{
    void *s = zmq_socket(fz_pair.zctx, ZMQ_DEALER);
    int zero = 0;
    if (!s || zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero) || zmq_connect(s, endpoint))
        fuzz_fail(endpoint);
    return s;
}

/* Sends a frame from sock (split: behind an empty part, two parts in all) and runs the
 * backbone's poll loop until sock has the answer, which is dropped. Every frame a river
 * sends gets exactly one. */
static int fuzz_pair_bb_exchange(void *sock, const void *data, size_t len, bool split)
{
    if (split && zmq_send(sock, "", 0, ZMQ_SNDMORE) < 0)
        return -1;
    if (zmq_send(sock, data, len, 0) < 0)
        return -1;
    for (int i = 0; i < 50; i++) {
        zmq_pollitem_t it[1 + PAIR_POLL_ITEMS] = {{.socket = sock, .events = ZMQ_POLLIN}};
        int k = pair_backbone_poll_items(fz_pair.bb, it + 1);
        if (zmq_poll(it, 1 + k, 100) < 0 && errno != EINTR)
            return -1;
        pair_backbone_on_poll(fz_pair.bb, it + 1, k, clock_now_ms());
        if (it[0].revents & ZMQ_POLLIN) {
            while (zmq_recv(sock, NULL, 0, ZMQ_DONTWAIT) >= 0)
                ;
            return 0;
        }
    }
    return -1;
}

/* Pairs the backbone with the peer, as a river worker's start does. */
static void fuzz_pair_pair(void)
{
    size_t len;
    uint8_t *hello = fuzz_pair_hello(fz_pair.m, fz_pair.memfd, fz_pair.fingerprint,
                                     fz_pair.backend, cpu_backend_threads(fz_pair.be), &len);
    int rc = fuzz_pair_bb_exchange(fz_pair.peer, hello, len, false);
    free(hello);
    if (rc || !pair_backbone_paired(fz_pair.bb))
        fuzz_fail("pair: the backbone did not pair");
}

static void fuzz_pair_river_new(void)
{
    pair_river_config_t c = {
        .endpoint = fz_pair.rv_endpoint,
        .river_id = "fuzz-river",
        .boundary = FUZZ_PAIR_BOUNDARY,
        .fingerprint = fz_pair.fingerprint,
        .backend = fz_pair.backend,
        .threads = cpu_backend_threads(fz_pair.be),
        .max_rows = FUZZ_PAIR_ROWS,
        .heartbeat_ms = 1000,
        .liveness = 3,
        .reply_timeout_ms = 5000,
        .backoff_max_ms = 1000,
        .be = fz_pair.be,
    };
    if (pair_river_new(&fz_pair.rv, fz_pair.zctx, &c, fz_pair.m, fz_pair.kv, fz_pair.memfd))
        fuzz_fail("pair_river_new");
    fz_pair.seq = 0;
}

static void fuzz_pair_setup(void)
{
    /* The pair logs every frame it refuses, and the fuzzer sends millions. */
    log_init(&(log_opts_t){.name = "river-worker", .tag = "fuzz", .utc = true});
    log_set_level(LOG_NONE);
    fz_pair.m = fuzz_tiny();
    const model_config_t *c = &fz_pair.m->cfg;
    if (cpu_backend_new(&fz_pair.be, 1, CPU_SIMD_COUNT) < 0 ||
        model_fingerprint(fz_pair.m, fz_pair.fingerprint) < 0 ||
        kv_pool_new_shared(&fz_pair.kv, fz_pair.be, c->n_layers, c->n_kv_heads * c->head_dim,
                           DTYPE_F32,
                           FUZZ_PAIR_PAGE, FUZZ_PAIR_PAGES, &fz_pair.memfd) < 0)
        fuzz_fail("pair: engine");
    snprintf(fz_pair.backend, sizeof fz_pair.backend, "%s", pair_backend_name(fz_pair.be));
    for (int i = 0; i < FUZZ_PAIR_PAGES; i++)
        fz_pair.table[i] = i;
    if (!(fz_pair.zctx = zmq_ctx_new()))
        fuzz_fail("zmq_ctx_new");
    snprintf(fz_pair.bb_endpoint, sizeof fz_pair.bb_endpoint, "ipc://%s/backbone.sock",
             fuzz_dir);
    pair_backbone_config_t bc = {
        .endpoint = fz_pair.bb_endpoint,
        .boundary = FUZZ_PAIR_BOUNDARY,
        .fingerprint = fz_pair.fingerprint,
        .backend = fz_pair.backend,
        .threads = cpu_backend_threads(fz_pair.be),
    };
    if (pair_backbone_new(&fz_pair.bb, fz_pair.zctx, &bc, fz_pair.m, fz_pair.be) < 0)
        fuzz_fail("pair_backbone_new");
    fz_pair.peer = fuzz_pair_dealer(fz_pair.bb_endpoint);
    fz_pair.stranger = fuzz_pair_dealer(fz_pair.bb_endpoint);
    fz_pair.fake = fuzz_router_bind(fz_pair.zctx, "river.sock", fz_pair.rv_endpoint,
                                    sizeof fz_pair.rv_endpoint);
    fz_pair.clock = clock_now_ms();
    atexit(fuzz_pair_close);
    fuzz_pair_pair();
    fuzz_pair_river_new();
}

/* Reads what rv sent the fake until its hello, whose sender is rv's socket now. */
static void fuzz_pair_learn(void)
{
    for (;;) {
        uint8_t *body = NULL;
        size_t len = 0;
        if (fuzz_route_recv(fz_pair.fake, 0, fz_pair.route, &fz_pair.route_len, &body, &len))
            fuzz_fail("pair: no hello from the river side");
        River__Pair__RiverMessage *m = river__pair__river_message__unpack(NULL, len, body);
        free(body);
        bool hello = m && m->kind_case == RIVER__PAIR__RIVER_MESSAGE__KIND_HELLO;
        if (m)
            river__pair__river_message__free_unpacked(m, NULL);
        if (hello)
            return;
    }
}

/* Brings rv to the state of a hello sent and not answered, from whatever state the last
 * input left: paired (its peer is then declared silent), idle (the next hello goes out)
 * or refused for good (a new river side). */
static void fuzz_pair_river_hello(void)
{
    if (pair_river_refused(fz_pair.rv)) {
        pair_river_destroy(&fz_pair.rv);
        fuzz_pair_river_new();
    }
    for (int i = 0; i < 3; i++) {
        zmq_pollitem_t it[PAIR_POLL_ITEMS];
        if (!pair_river_ready(fz_pair.rv) && pair_river_poll_items(fz_pair.rv, it) > 0)
            return;
        fz_pair.clock += 10000000;
        pair_river_tick(fz_pair.rv, fz_pair.clock);
        if (!pair_river_ready(fz_pair.rv) && pair_river_poll_items(fz_pair.rv, it) > 0) {
            fuzz_pair_learn();
            return;
        }
    }
    fuzz_fail("pair: the river side sends no hello");
}

/* Runs rv's poll loop until a frame reached it and was handled (within tries * 100 ms);
 * false when none came. */
static bool fuzz_pair_rv_receive(int tries)
{
    for (int i = 0; i < tries; i++) {
        zmq_pollitem_t it[PAIR_POLL_ITEMS];
        int k = pair_river_poll_items(fz_pair.rv, it);
        if (k == 0 || zmq_poll(it, k, 100) < 0)
            break;
        if (it[0].revents & ZMQ_POLLIN) {
            pair_river_on_poll(fz_pair.rv, it, k, fz_pair.clock);
            return true;
        }
    }
    return false;
}

/* Sends a frame from the fake backbone to rv and lets rv's poll loop handle it. */
static void fuzz_pair_rv_deliver(const void *data, size_t len)
{
    if (fuzz_route_send(fz_pair.fake, fz_pair.route, fz_pair.route_len, data, len))
        fuzz_fail("pair: send to the river side");
    if (!fuzz_pair_rv_receive(50))
        fuzz_fail("pair: the river side did not receive");
}

/* rv paired with the fake backbone. */
static void fuzz_pair_river_ready(void)
{
    if (pair_river_ready(fz_pair.rv))
        return;
    fuzz_pair_river_hello();
    River__Pair__PairHelloOk ok = RIVER__PAIR__PAIR_HELLO_OK__INIT;
    ok.layer_begin = FUZZ_PAIR_BOUNDARY;
    ok.layer_end = (uint32_t)fz_pair.m->cfg.n_layers;
    River__Pair__BackboneMessage env = RIVER__PAIR__BACKBONE_MESSAGE__INIT;
    env.kind_case = RIVER__PAIR__BACKBONE_MESSAGE__KIND_HELLO_OK;
    env.hello_ok = &ok;
    size_t len;
    uint8_t *buf = fuzz_pack(&env.base, &len);
    fuzz_pair_rv_deliver(buf, len);
    free(buf);
    if (!pair_river_ready(fz_pair.rv))
        fuzz_fail("pair: the river side did not pair");
}

/* The backbone half: a RiverMessage from the paired river (or, flag 0x20, from another
 * one; flag 0x10: in two parts). A hello must name this process: one naming another would
 * have the backbone map that process's memory, which a fuzzer on a shared host must not
 * do; the harness writes its pid in. After a hello the peer pairs again, so that the next
 * input meets the same session. */
static void fuzz_pair_backbone(uint8_t flags, const uint8_t *frame, size_t len)
{
    River__Pair__RiverMessage *rm = river__pair__river_message__unpack(NULL, len, frame);
    bool hello = rm && rm->kind_case == RIVER__PAIR__RIVER_MESSAGE__KIND_HELLO && rm->hello;
    uint8_t *buf = NULL;
    size_t blen = 0;
    if (hello && rm->hello->river_pid != (uint32_t)getpid()) {
        rm->hello->river_pid = (uint32_t)getpid();
        buf = fuzz_pack(&rm->base, &blen);
    }
    if (rm)
        river__pair__river_message__free_unpacked(rm, NULL);
    if (fuzz_pair_bb_exchange(flags & 0x20 ? fz_pair.stranger : fz_pair.peer,
                              buf ? buf : frame, buf ? blen : len, flags & 0x10))
        fuzz_fail("pair: no answer from the backbone");
    free(buf);
    if (hello || !pair_backbone_paired(fz_pair.bb))
        fuzz_pair_pair();
}

/* The river half outside a layer's round trip: the answer to its hello (or a pong, or a
 * stale reply). */
static void fuzz_pair_river_idle(const uint8_t *frame, size_t len)
{
    fuzz_pair_river_hello();
    fuzz_pair_rv_deliver(frame, len);
}

/* The river half inside a layer's round trip: rv sends layer 1 of one row and takes the
 * input as the backbone's answer. A LayerReply's or request error's seq is set to the
 * request's, which the fuzzer cannot know; a fallback error follows, so that an answer rv
 * skips still ends the wait at once. A fallback rv did not need is read while rv is
 * paired, which ignores it (a stale error); one that stays behind is harmless too: a
 * later round trip skips it, and a later hello starts from a new socket. */
static void fuzz_pair_river_trip(const uint8_t *frame, size_t len)
{
    fuzz_pair_river_ready();
    uint64_t seq = fz_pair.seq + 1;
    River__Pair__BackboneMessage *bm = river__pair__backbone_message__unpack(NULL, len, frame);
    uint8_t *buf = NULL;
    size_t blen = 0;
    if (bm) {
        if (bm->kind_case == RIVER__PAIR__BACKBONE_MESSAGE__KIND_LAYER && bm->layer)
            bm->layer->seq = seq;
        else if (bm->kind_case == RIVER__PAIR__BACKBONE_MESSAGE__KIND_ERROR && bm->error &&
                 bm->error->seq)
            bm->error->seq = seq;
        buf = fuzz_pack(&bm->base, &blen);
        river__pair__backbone_message__free_unpacked(bm, NULL);
    }
    River__Pair__PairError err = RIVER__PAIR__PAIR_ERROR__INIT;
    err.seq = seq;
    err.message = FUZZ_PAIR_NO_REPLY;
    River__Pair__BackboneMessage fb = RIVER__PAIR__BACKBONE_MESSAGE__INIT;
    fb.kind_case = RIVER__PAIR__BACKBONE_MESSAGE__KIND_ERROR;
    fb.error = &err;
    size_t fblen;
    uint8_t *fbuf = fuzz_pack(&fb.base, &fblen);
    if (fuzz_route_send(fz_pair.fake, fz_pair.route, fz_pair.route_len, buf ? buf : frame,
                        buf ? blen : len) ||
        fuzz_route_send(fz_pair.fake, fz_pair.route, fz_pair.route_len, fbuf, fblen))
        fuzz_fail("pair: send to the river side");
    free(buf);
    free(fbuf);
    fwd_remote_t r;
    pair_river_remote(fz_pair.rv, &r);
    int32_t pos[1] = {0};
    const int32_t *tables[1] = {fz_pair.table};
    float x[64];
    for (int i = 0; i < 64; i++)
        x[i] = (float)i / 64.0f;
    int e = r.run(r.user, FUZZ_PAIR_BOUNDARY, 1, pos, tables, x);
    fz_pair.seq = seq;
    if (pair_river_ready(fz_pair.rv) &&
        !(e < 0 && strstr(river_err_detail(), FUZZ_PAIR_NO_REPLY)))
        (void)fuzz_pair_rv_receive(10);
    /* The LayerRequest rv sent, read so that requests do not pile up at the fake. */
    while (fuzz_route_recv(fz_pair.fake, ZMQ_DONTWAIT, NULL, NULL, NULL, NULL) == 0)
        ;
}

/* Input: a byte whose low four bits choose the side (mod 3: backbone, river outside a
 * round trip, river inside one) and whose bits 0x10 and 0x20 are the backbone's flags,
 * then the frame. */
static void fuzz_pair(const uint8_t *d, size_t n)
{
    if (n < 1)
        return;
    if (!fz_pair.bb)
        fuzz_pair_setup();
    const uint8_t *frame = d + 1;
    size_t len = n - 1;
    switch ((d[0] & 0x0f) % 3) {
    case 0: fuzz_pair_backbone(d[0], frame, len); break;
    case 1:
        if (len <= FUZZ_PAIR_MAX_RIVER_FRAME)
            fuzz_pair_river_idle(frame, len);
        break;
    default:
        if (len <= FUZZ_PAIR_MAX_RIVER_FRAME)
            fuzz_pair_river_trip(frame, len);
        break;
    }
}

/* ---- river-gateway's request parser ----
 * The first byte picks the endpoint (even: chat, odd: completions), the rest is the body;
 * a body that parses is also turned into every response and chunk the gateway builds from
 * it, and a refusal into its error object. */
static void fuzz_openai_request(const uint8_t *d, size_t n)
{
    if (n == 0)
        return;
    gw_request_t r;
    gw_error_t err;
    gw_api_t api = d[0] & 1 ? GW_API_COMPLETIONS : GW_API_CHAT;
    if (gw_request_parse(&r, api, (const char *)d + 1, n - 1, 1.0, &err)) {
        json_t *o = gw_error_json(&err);
        if (!o)
            fuzz_fail("openai_request: no error object");
        char *text = json_dumps(o, JSON_COMPACT);
        if (!text)
            fuzz_fail("openai_request: error object does not serialize");
        free(text);
        json_decref(o);
        gw_request_free(&r);
        return;
    }
    static const int32_t ids[] = {1, 2, 3};
    /* Log-probabilities of a whole token and of one that holds half a character. */
    river_token_logprob_t lp = {.id = 1, .logprob = -0.5f, .token = "\xc3", .token_len = 1,
                                .n_top = 1};
    lp.top[0] = (river_top_logprob_t){.id = 2, .logprob = -0.25f, .token = "te",
                                      .token_len = 2};
    json_t *lps = json_pack("[o,o,o]", gw_logprob_json(&lp), gw_logprob_json(&lp),
                            gw_logprob_json(&lp));
    gw_piece_t p = {"text \xc3\xa9", 7, ids, ids, 3, 3, lps, NULL};
    gw_usage_t u = {5, 3, 1.5f, 2};
    size_t offset = 0;
    /* The request's grammar in the format of the input's choice: a grammar built from a
     * schema the compiler took must compile. */
    toolcall_format_t tf = (toolcall_format_t)(d[0] >> 1) % TOOLCALL_N_FORMATS;
    gw_error_t cerr;
    if (gw_constrain(&r, tf, &cerr) == 0 && r.grammar) {
        grammar_t *g = NULL;
        if (grammar_parse(&g, r.grammar, strlen(r.grammar)))
            fuzz_fail("openai_request: the request's grammar does not compile");
        grammar_destroy(&g);
    }
    json_t *o[4] = {
        gw_chunk_json(&r, "cmpl-1", 1, &p, NULL, 0, &offset),
        gw_chunk_json(&r, "cmpl-1", 1, NULL, "stop", api == GW_API_CHAT, &offset),
        gw_usage_chunk_json(&r, "cmpl-1", 1, &u),
        gw_response_json(&r, "cmpl-1", 1, &p, "length", &u, "<s>prompt"),
    };
    for (int i = 0; i < 4; i++) {
        char *text = o[i] ? json_dumps(o[i], JSON_COMPACT) : NULL;
        if (!text)
            fuzz_fail("openai_request: a response does not serialize");
        free(text);
        json_decref(o[i]);
    }
    json_decref(lps);
    gw_request_free(&r);
}

/* ---- Grammars ----
 * A vocabulary of a few hundred short byte strings: every single byte, JSON's punctuation
 * and words, multi-byte characters and their halves, and one stop token. */
static grammar_vocab_t *fuzz_gvocab;
#define FUZZ_GVOCAB_STOP 0

static const grammar_vocab_t *fuzz_grammar_vocab(void)
{
    if (fuzz_gvocab)
        return fuzz_gvocab;
    static const char *const words[] = {
        "{", "}", "[", "]", "\"", ":", ",", " ", "\n", "true", "false", "null", "{\"", "\":",
        "\",\"", "\"}", "\":\"", "0", "1", "12", "-", ".", "e", "name", "arguments", "\\",
        "\\u", "\xc3", "\xa9", "\xc3\xa9", "\xe2\x82\xac", "\xf0\x9f", "abc", "a", "b"};
    enum { NW = sizeof words / sizeof words[0] };
    static char bytes[256];
    const char *v[1 + 256 + NW];
    size_t len[1 + 256 + NW];
    v[0] = NULL;
    len[0] = 0;
    for (int i = 0; i < 256; i++) {
        bytes[i] = (char)i;
        v[1 + i] = &bytes[i];
        len[1 + i] = 1;
    }
    for (int i = 0; i < NW; i++) {
        v[1 + 256 + i] = words[i];
        len[1 + 256 + i] = strlen(words[i]);
    }
    int32_t stop = FUZZ_GVOCAB_STOP;
    if (grammar_vocab_new(&fuzz_gvocab, v, len, 1 + 256 + NW, &stop, 1))
        fuzz_fail("grammar: the vocabulary");
    return fuzz_gvocab;
}

/* Walks a grammar: each byte of steps picks one of the allowed tokens, which must be
 * accepted; a token the mask refuses must be refused by accept as well. */
static void fuzz_grammar_walk(const grammar_t *g, const uint8_t *steps, size_t n)
{
    const grammar_vocab_t *v = fuzz_grammar_vocab();
    grammar_matcher_t *m = NULL;
    grammar_state_t *st = NULL;
    int nv = grammar_vocab_size(v);
    uint32_t *allowed = calloc(((size_t)nv + 31) / 32, sizeof *allowed);
    if (!allowed || grammar_matcher_new(&m, g, v) || grammar_state_new(&st, m))
        goto done;
    for (size_t i = 0; i < n && i < 64; i++) {
        if (grammar_state_mask(st, allowed))
            break;
        int n_ok = 0;
        for (int t = 0; t < nv; t++)
            n_ok += allowed[t / 32] >> (t % 32) & 1;
        if (n_ok == 0)
            break;
        int pick = steps[i] % n_ok, t = 0;
        for (;; t++)
            if ((allowed[t / 32] >> (t % 32) & 1) && pick-- == 0)
                break;
        int refused = (steps[i] * 7 + 3) % nv;
        if (!(allowed[refused / 32] >> (refused % 32) & 1) &&
            grammar_state_accept(st, refused) == 0)
            fuzz_fail("grammar: accept took a token the mask refused");
        if (grammar_state_accept(st, t))
            fuzz_fail("grammar: accept refused a token the mask allowed");
        if (t == FUZZ_GVOCAB_STOP)
            break;
    }
done:
    grammar_state_destroy(&st);
    grammar_matcher_destroy(&m);
    free(allowed);
}

/* GBNF text: the input up to its first NUL; what follows the NUL steers a walk. */
static void fuzz_grammar(const uint8_t *d, size_t n)
{
    const uint8_t *nul = memchr(d, 0, n);
    size_t len = nul ? (size_t)(nul - d) : n;
    grammar_t *g = NULL;
    if (grammar_parse(&g, (const char *)d, len) == 0)
        fuzz_grammar_walk(g, nul ? nul + 1 : d, nul ? n - len - 1 : 0);
    grammar_destroy(&g);
}

/* A JSON Schema: compiled, and its GBNF form compiles too. */
static void fuzz_json_schema(const uint8_t *d, size_t n)
{
    const uint8_t *nul = memchr(d, 0, n);
    size_t len = nul ? (size_t)(nul - d) : n;
    grammar_t *g = NULL;
    char *text = NULL;
    int e1 = grammar_from_json_schema(&g, (const char *)d, len);
    int e2 = grammar_json_schema_to_gbnf((const char *)d, len, "s", &text);
    if ((e1 == 0) != (e2 == 0) && e1 != RIVER_ENOMEM && e2 != RIVER_ENOMEM)
        fuzz_fail("json_schema: compiled one way and not the other");
    if (e1 == 0)
        fuzz_grammar_walk(g, nul ? nul + 1 : d, nul ? n - len - 1 : 0);
    grammar_destroy(&g);
    if (e2 == 0) {
        size_t tl = strlen(text);
        char *full = malloc(tl + 16);
        if (full) {
            memcpy(full, text, tl);
            memcpy(full + tl, "\nroot ::= s\n", 13);
            if (grammar_parse(&g, full, tl + 12))
                fuzz_fail("json_schema: its GBNF form does not compile");
            grammar_destroy(&g);
            free(full);
        }
    }
    free(text);
}

/* ---- Tool calls: the first byte picks the format, the second the split of the text;
 * the stream, fed in pieces, must give what the whole-text parse gives. ---- */

static void fuzz_toolcall(const uint8_t *d, size_t n)
{
    if (n < 2)
        return;
    toolcall_format_t f = (toolcall_format_t)(d[0] % TOOLCALL_N_FORMATS);
    size_t step = 1 + d[1] % 16;
    const char *text = (const char *)d + 2;
    size_t len = n - 2;
    toolcall_result_t whole;
    if (toolcall_parse(f, text, len, NULL, 0, &whole))
        return;
    toolcall_stream_t *s = NULL;
    if (toolcall_stream_new(&s, f, NULL, 0)) {
        toolcall_result_free(&whole);
        return;
    }
    char *content = malloc(len + 1), *args = malloc(len + 1);
    size_t nc = 0, na = 0, calls = 0;
    int bad = !content || !args;
    for (size_t off = 0; !bad && off <= len; off += step) {
        toolcall_event_t *ev;
        size_t nev;
        size_t piece = len - off < step ? len - off : step;
        int last = off + piece >= len;
        if (toolcall_stream_push(s, text + off, piece, &ev, &nev))
            bad = 1;
        for (int round = 0; !bad && round < 1 + last; round++) {
            if (round && toolcall_stream_finish(s, &ev, &nev)) {
                bad = 1;
                break;
            }
            for (size_t i = 0; i < nev; i++) {
                if (ev[i].kind == TOOLCALL_EV_CONTENT && nc + ev[i].len <= len) {
                    memcpy(content + nc, ev[i].text, ev[i].len);
                    nc += ev[i].len;
                } else if (ev[i].kind == TOOLCALL_EV_CALL_START) {
                    calls++;
                } else if (ev[i].kind == TOOLCALL_EV_ARGS && na + ev[i].len <= len) {
                    memcpy(args + na, ev[i].text, ev[i].len);
                    na += ev[i].len;
                }
            }
        }
        if (last)
            break;
    }
    if (!bad) {
        size_t want_args = 0;
        for (size_t i = 0; i < whole.n_calls; i++)
            want_args += whole.calls[i].arguments_len;
        if (calls != whole.n_calls || nc != whole.content_len ||
            memcmp(content, whole.content, nc) || na != want_args)
            fuzz_fail("toolcall: the stream and the whole text disagree");
    }
    free(content);
    free(args);
    toolcall_stream_destroy(&s);
    toolcall_result_free(&whole);
}

/* ---- river-gateway's HTTP front door ----
 * The input is what a client sends on one connection, byte for byte: the gateway's own HTTP
 * layer (libmicrohttpd's parser, the route table, the key check at the end of the headers,
 * the body limit, chunked bodies, then the request parser) runs in this process on a real
 * loopback socket, with an API key file and no model, so that nothing reaches riverd. The
 * client half-closes after its bytes; the gateway must answer HTTP or close, at the latest
 * at its header and body deadlines: a request cut short is only noticed there, as
 * libmicrohttpd's epoll may take its last bytes and the end in one read. They are 5 ms,
 * below what the configuration accepts (100 ms), since most inputs are cut short and the
 * wait, not the parsing, would otherwise set the rate (about 170 inputs a second at
 * 100 ms); a request sent whole is complete at its first read, long before either. */
#define FUZZ_HTTP_KEY "sk-fuzz"

static int fuzz_http_port(void)
{
    static int port = -1;
    static gw_config_t cfg;
    static gw_ctx_t ctx;
    static gw_http_t *http;
    if (port >= 0)
        return port;
    port = 0;
    char hex[GW_KEY_HEX_LEN + 2];
    gw_apikeys_hash(FUZZ_HTTP_KEY, strlen(FUZZ_HTTP_KEY), hex);
    hex[GW_KEY_HEX_LEN] = '\n';
    const char *path = fuzz_write("api-keys", (const uint8_t *)hex, GW_KEY_HEX_LEN + 1);
    if (!path || config_defaults(&gw_config_schema, &cfg))
        fuzz_fail("http_request: no key file or no configuration");
    cfg.listen_port = 0;
    cfg.max_body_bytes = 4096;
    cfg.max_connections_per_address = 100000;
    cfg.headers_timeout_ms = 5;
    cfg.body_timeout_ms = 5;
    /* Every refusal is logged, and the fuzzer sends millions. */
    log_set_level(LOG_NONE);
    ctx.cfg = &cfg;
    if (gw_apikeys_load(&ctx.keys, path, &cfg) || gw_models_new(&ctx.models, &cfg) ||
        gw_http_start(&http, &ctx))
        fuzz_fail("http_request: the gateway's HTTP layer does not start");
    port = gw_http_port(http);
    return port;
}

static void fuzz_http_request(const uint8_t *d, size_t n)
{
    int port = fuzz_http_port();
    if (!port)
        return;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return;
    struct timeval tv = {.tv_sec = 10};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa)) {
        close(fd);
        return;
    }
    for (size_t off = 0; off < n;) {
        ssize_t w = send(fd, d + off, n - off, MSG_NOSIGNAL);
        if (w <= 0)
            break; /* answered and closed before it took everything */
        off += (size_t)w;
    }
    shutdown(fd, SHUT_WR);
    char head[8], buf[4096];
    size_t got_head = 0;
    for (;;) {
        ssize_t got = recv(fd, buf, sizeof buf, 0);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            fuzz_fail("http_request: no answer and no close within 10 s");
        if (got <= 0)
            break;
        for (ssize_t i = 0; i < got && got_head < sizeof head; i++)
            head[got_head++] = buf[i];
    }
    close(fd);
    if (got_head && (got_head < 7 || memcmp(head, "HTTP/1.", 7)))
        fuzz_fail("http_request: the answer is not HTTP");
}

const fuzz_target_t fuzz_targets[] = {
    {"frame_client_request", fuzz_frame_client_request},
    {"frame_worker_message", fuzz_frame_worker_message},
    {"frame_daemon_message", fuzz_frame_daemon_message},
    {"frame_admin_request", fuzz_frame_admin_request},
    {"safetensors", fuzz_safetensors},
    {"llama2c", fuzz_llama2c},
    {"gguf", fuzz_gguf},
    {"hfconfig", fuzz_hfconfig},
    {"tokenizer", fuzz_tokenizer},
    {"chat_template", fuzz_chat_template},
    {"config_yaml", fuzz_config_yaml},
    {"river", fuzz_river},
    {"router", fuzz_router},
    {"client_reply", fuzz_client_reply},
    {"admin_reply", fuzz_admin_reply},
    {"pair", fuzz_pair},
    {"openai_request", fuzz_openai_request},
    {"grammar", fuzz_grammar},
    {"json_schema", fuzz_json_schema},
    {"toolcall", fuzz_toolcall},
    {"http_request", fuzz_http_request},
};
const size_t fuzz_n_targets = sizeof fuzz_targets / sizeof fuzz_targets[0];

const fuzz_target_t *fuzz_target_find(const char *name)
{
    for (size_t i = 0; i < fuzz_n_targets; i++)
        if (!strcmp(fuzz_targets[i].name, name))
            return &fuzz_targets[i];
    return NULL;
}
