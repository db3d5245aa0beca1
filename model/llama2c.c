/* llama2.c legacy "version 0" checkpoints: a 7 x int32 header, then float32 tensors in a
 * fixed order (see tests/data/stories260K/PROVENANCE.md). Every weight points into the
 * read-only mapping of the file. */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/err.h"
#include "model/model_internal.h"

#define L2C_HEADER_BYTES 28
/* Header values beyond these are corrupt; they also keep the size arithmetic in int64. */
#define L2C_MAX_DIM (1 << 20)
#define L2C_MAX_LAYERS 4096
#define L2C_MAX_VOCAB (1 << 24)
#define L2C_MAX_SEQ (1 << 24)

typedef struct l2c_header {
    int32_t dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len;
} l2c_header_t;

static int l2c_check_header(const char *path, const l2c_header_t *h)
{
    const struct {
        const char *name;
        int32_t v;
        int32_t max;
    } f[] = {
        {"dim", h->dim, L2C_MAX_DIM},         {"hidden_dim", h->hidden_dim, 4 * L2C_MAX_DIM},
        {"n_layers", h->n_layers, L2C_MAX_LAYERS}, {"n_heads", h->n_heads, L2C_MAX_DIM},
        {"n_kv_heads", h->n_kv_heads, L2C_MAX_DIM}, {"seq_len", h->seq_len, L2C_MAX_SEQ},
    };
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
        if (f[i].v <= 0)
            return river_err_set(RIVER_EFORMAT, "%s: header field %s is %d; it must be "
                                 "positive", path, f[i].name, (int)f[i].v);
        if (f[i].v > f[i].max)
            return river_err_set(RIVER_EFORMAT, "%s: header field %s is %d, implausibly "
                                 "large (at most %d)", path, f[i].name, (int)f[i].v,
                                 (int)f[i].max);
    }
    /* A negative vocab_size only flags an untied classifier; its magnitude is the size. */
    if (h->vocab_size == 0 || h->vocab_size < -L2C_MAX_VOCAB || h->vocab_size > L2C_MAX_VOCAB)
        return river_err_set(RIVER_EFORMAT, "%s: header field vocab_size is %d", path,
                             (int)h->vocab_size);
    if (h->dim % h->n_heads != 0 || (h->dim / h->n_heads) % 2 != 0)
        return river_err_set(RIVER_EFORMAT, "%s: dim %d does not split into %d heads of an "
                             "even size", path, (int)h->dim, (int)h->n_heads);
    if (h->n_kv_heads > h->n_heads || h->n_heads % h->n_kv_heads != 0)
        return river_err_set(RIVER_EFORMAT, "%s: %d kv heads do not divide %d heads", path,
                             (int)h->n_kv_heads, (int)h->n_heads);
    return 0;
}

/* rms_norm_eps (or model.py's norm_eps) from a JSON file beside the .bin: "<stem>.json",
 * then "config.json". Absent files leave eps alone; a malformed one is an error. */
static int l2c_sidecar_eps(const char *path, const char *dir, float *eps)
{
    size_t n = strlen(path);
    const char *dot = strrchr(path, '.');
    const char *slash = strrchr(path, '/');
    size_t stem = dot && (!slash || dot > slash) ? (size_t)(dot - path) : n;
    size_t dn = strlen(dir);
    char *cands[2];
    cands[0] = malloc(stem + sizeof ".json");
    cands[1] = malloc(dn + sizeof "/config.json");
    int err = 0;
    if (!cands[0] || !cands[1]) {
        err = river_err_set(RIVER_ENOMEM, "%s: path", path);
        goto out;
    }
    memcpy(cands[0], path, stem);
    memcpy(cands[0] + stem, ".json", sizeof ".json");
    memcpy(cands[1], dir, dn);
    memcpy(cands[1] + dn, "/config.json", sizeof "/config.json");
    for (int i = 0; i < 2; i++) {
        struct stat st;
        if (stat(cands[i], &st) != 0)
            continue;
        json_error_t jerr;
        json_t *root = json_load_file(cands[i], 0, &jerr);
        if (!root) {
            err = river_err_set(RIVER_EFORMAT, "%s: invalid JSON: %s (line %d)", cands[i],
                                jerr.text, jerr.line);
            goto out;
        }
        json_t *v = json_object_get(root, "rms_norm_eps");
        if (!v)
            v = json_object_get(root, "norm_eps");
        if (v && (!json_is_number(v) || !(json_number_value(v) > 0))) {
            json_decref(root);
            err = river_err_set(RIVER_EFORMAT, "%s: rms_norm_eps is not a positive number",
                                cands[i]);
            goto out;
        }
        if (v)
            *eps = (float)json_number_value(v);
        json_decref(root);
        if (v)
            break;
    }
out:
    free(cands[0]);
    free(cands[1]);
    return err;
}

static weight_t l2c_weight(const float *p, int64_t rows, int64_t cols)
{
    return (weight_t){.dtype = DTYPE_F32, .rows = rows, .cols = cols, .data = p};
}

int llama2c_load(model_t *m, const char *path)
{
    int err;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return river_err_set(errno == ENOENT ? RIVER_ENOTFOUND : RIVER_ESYS, "%s: open: %s",
                             path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        err = river_err_set(RIVER_ESYS, "%s: fstat: %s", path, strerror(errno));
        goto fail_fd;
    }
    if (st.st_size < L2C_HEADER_BYTES) {
        err = river_err_set(RIVER_ETRUNC, "%s: truncated: %lld bytes, shorter than the "
                            "28-byte llama2.c header", path, (long long)st.st_size);
        goto fail_fd;
    }
    l2c_header_t h;
    int32_t raw[7];
    ssize_t got = pread(fd, raw, sizeof raw, 0);
    if (got != (ssize_t)sizeof raw) {
        err = river_err_set(RIVER_EIO, "%s: reading the header: %s", path,
                            got < 0 ? strerror(errno) : "short read");
        goto fail_fd;
    }
    h = (l2c_header_t){raw[0], raw[1], raw[2], raw[3], raw[4], raw[5], raw[6]};
    if ((err = l2c_check_header(path, &h)))
        goto fail_fd;

    int tied = h.vocab_size > 0;
    int64_t V = tied ? h.vocab_size : -(int64_t)h.vocab_size;
    int64_t D = h.dim, H = h.hidden_dim, NL = h.n_layers, hs = D / h.n_heads;
    int64_t kv = hs * h.n_kv_heads;
    int64_t per_layer = D + D * D + 2 * kv * D + D * D + D + 3 * H * D;
    int64_t floats = V * D + NL * per_layer + D + (int64_t)h.seq_len * hs + (tied ? 0 : V * D);
    int64_t expect = L2C_HEADER_BYTES + 4 * floats;
    if (st.st_size < expect) {
        err = river_err_set(RIVER_ETRUNC, "%s: truncated: the header implies %lld bytes but "
                            "the file has %lld", path, (long long)expect,
                            (long long)st.st_size);
        goto fail_fd;
    }
    if (st.st_size > expect) {
        err = river_err_set(RIVER_EFORMAT, "%s: %lld bytes of trailing data after the %lld "
                            "bytes the header implies", path,
                            (long long)(st.st_size - expect), (long long)expect);
        goto fail_fd;
    }
    void *map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) {
        err = river_err_set(RIVER_ESYS, "%s: mmap: %s", path, strerror(errno));
        goto fail_fd;
    }
    m->map->bin = map;
    m->map->bin_size = (size_t)st.st_size;
    if (close(fd) != 0)
        return river_err_set(RIVER_ESYS, "%s: close: %s", path, strerror(errno));

    model_config_t *cfg = &m->cfg;
    *cfg = (model_config_t){
        .arch = ARCH_LLAMA,
        .dim = h.dim,
        .n_layers = h.n_layers,
        .n_heads = h.n_heads,
        .n_kv_heads = h.n_kv_heads,
        .head_dim = (int)hs,
        .hidden_dim = h.hidden_dim,
        .vocab_size = (int)V,
        .max_seq_len = h.seq_len,
        .norm_eps = 1e-5f, /* run.c's constant */
        .rope_theta = 10000.0f,
        .rope_layout = ROPE_INTERLEAVED,
        .partial_rotary_factor = 1.0f,
        .rope_scaling = ROPE_SCALING_NONE,
        .rope_factor = 1.0f,
        .tied_embeddings = tied,
        /* run.c stops on BOS; the engine ends on the tokenizer's EOS, which is 2. */
        .bos_id = V > 1 ? 1 : -1,
        .eos_ids = {2},
        .n_eos = V > 2 ? 1 : 0,
        .dtype = DTYPE_F32,
    };
    if ((err = l2c_sidecar_eps(path, m->dir, &cfg->norm_eps)) ||
        (err = model_config_validate(cfg, path)))
        return err;
    m->layers = calloc((size_t)NL, sizeof *m->layers);
    if (!m->layers)
        return river_err_set(RIVER_ENOMEM, "%s: %lld layers", path, (long long)NL);

    /* Each stacked tensor holds all layers: layer l's slice starts l * (slice size) in. */
    const float *p = (const float *)((const char *)map + L2C_HEADER_BYTES);
    m->embed = l2c_weight(p, V, D);
    p += V * D;
    for (int64_t l = 0; l < NL; l++)
        m->layers[l].attn_norm = l2c_weight(p + l * D, 1, D);
    p += NL * D;
    for (int64_t l = 0; l < NL; l++)
        m->layers[l].wq = l2c_weight(p + l * D * D, D, D);
    p += NL * D * D;
    for (int64_t l = 0; l < NL; l++)
        m->layers[l].wk = l2c_weight(p + l * kv * D, kv, D);
    p += NL * kv * D;
    for (int64_t l = 0; l < NL; l++)
        m->layers[l].wv = l2c_weight(p + l * kv * D, kv, D);
    p += NL * kv * D;
    for (int64_t l = 0; l < NL; l++)
        m->layers[l].wo = l2c_weight(p + l * D * D, D, D);
    p += NL * D * D;
    for (int64_t l = 0; l < NL; l++)
        m->layers[l].ffn_norm = l2c_weight(p + l * D, 1, D);
    p += NL * D;
    for (int64_t l = 0; l < NL; l++)
        m->layers[l].w_gate = l2c_weight(p + l * H * D, H, D);
    p += NL * H * D;
    for (int64_t l = 0; l < NL; l++)
        m->layers[l].w_down = l2c_weight(p + l * D * H, D, H);
    p += NL * D * H;
    for (int64_t l = 0; l < NL; l++)
        m->layers[l].w_up = l2c_weight(p + l * H * D, H, D);
    p += NL * H * D;
    m->final_norm = l2c_weight(p, 1, D);
    p += D;
    p += (int64_t)h.seq_len * hs; /* freq_cis_real and freq_cis_imag, unused */
    m->lm_head = tied ? m->embed : l2c_weight(p, V, D);
    return 0;

fail_fd:
    close(fd);
    return err;
}
