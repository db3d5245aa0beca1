/* The fuzz entry points (fuzz/targets.h). File parsers take a path, so their targets write
 * the input to a file in a per-process temporary directory and open that, as the engine
 * would open a downloaded checkpoint. */
#include "fuzz/targets.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/config.h"
#include "common/frame.h"
#include "engine/model.h"
#include "engine/model_internal.h"
#include "engine/safetensors.h"
#include "engine/tokenizer.h"

/* A per-process directory, created on first use and removed at exit with what is in it;
 * NULL when it cannot be made (the target then does nothing: no input can be blamed). */
static char fuzz_dir[64];

static void fuzz_dir_remove(void)
{
    static const char *names[] = {"model.bin", "config.json", "model.safetensors",
                                  "tokenizer.json"};
    char p[128];
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        snprintf(p, sizeof p, "%s/%s", fuzz_dir, names[i]);
        unlink(p);
    }
    rmdir(fuzz_dir);
}

static const char *fuzz_write(const char *name, const uint8_t *data, size_t size)
{
    static char path[128];
    if (!fuzz_dir[0]) {
        const char *tmp = getenv("TMPDIR");
        snprintf(fuzz_dir, sizeof fuzz_dir, "%.40s/river-fuzz-XXXXXX", tmp && *tmp ? tmp : "/tmp");
        if (!mkdtemp(fuzz_dir)) {
            fuzz_dir[0] = 0;
            return NULL;
        }
        atexit(fuzz_dir_remove);
    }
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

const fuzz_target_t fuzz_targets[] = {
    {"frame_client_request", fuzz_frame_client_request},
    {"frame_worker_message", fuzz_frame_worker_message},
    {"frame_daemon_message", fuzz_frame_daemon_message},
    {"frame_admin_request", fuzz_frame_admin_request},
    {"safetensors", fuzz_safetensors},
    {"llama2c", fuzz_llama2c},
    {"hfconfig", fuzz_hfconfig},
    {"tokenizer", fuzz_tokenizer},
    {"config_yaml", fuzz_config_yaml},
};
const size_t fuzz_n_targets = sizeof fuzz_targets / sizeof fuzz_targets[0];

const fuzz_target_t *fuzz_target_find(const char *name)
{
    for (size_t i = 0; i < fuzz_n_targets; i++)
        if (!strcmp(fuzz_targets[i].name, name))
            return &fuzz_targets[i];
    return NULL;
}
