/* The model fingerprint (fingerprint.h): a fast, sampled hash over the configuration and
 * every tensor of a loaded model. */
#include "model/fingerprint.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "common/err.h"

/* Two 64-bit lanes, each a multiply-xorshift chain over 8-byte words with its own
 * constants; 128 bits make an accidental match between two models implausible. Not a
 * cryptographic hash: it guards against mistakes, not adversaries. */
typedef struct fp_state {
    uint64_t a, b;
} fp_state_t;

static uint64_t fp_mix(uint64_t x, uint64_t k)
{
    x ^= x >> 32;
    x *= k;
    x ^= x >> 29;
    x *= 0xbf58476d1ce4e5b9u;
    x ^= x >> 32;
    return x;
}

static void fp_word(fp_state_t *s, uint64_t w)
{
    s->a = fp_mix(s->a ^ w, 0x9e3779b97f4a7c15u);
    s->b = fp_mix(s->b + w + (s->b << 7), 0xd6e8feb86659fd93u);
}

static void fp_bytes(fp_state_t *s, const void *p, size_t n)
{
    const unsigned char *c = p;
    fp_word(s, (uint64_t)n);
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, c, 8);
        fp_word(s, w);
        c += 8;
        n -= 8;
    }
    if (n) {
        uint64_t w = 0;
        memcpy(&w, c, n);
        fp_word(s, w);
    }
}

static void fp_str(fp_state_t *s, const char *str)
{
    fp_bytes(s, str, strlen(str));
}

/* n bytes at d: all of them when few, else 32 windows of 64 bytes spread evenly from the
 * first byte to the last. */
static void fp_sample(fp_state_t *s, const void *p, size_t n)
{
    const unsigned char *d = p;
    if (n <= 4096) {
        fp_bytes(s, d, n);
        return;
    }
    enum { WINDOWS = 32, WINDOW = 64 };
    for (size_t i = 0; i < WINDOWS; i++)
        fp_bytes(s, d + i * (n - WINDOW) / (WINDOWS - 1), WINDOW);
}

/* A tensor's name, dtype, shape and bytes (fp_sample), and a quantized one's scales and
 * zeros. */
static void fp_weight(fp_state_t *s, const char *name, const weight_t *w)
{
    fp_str(s, name);
    if (!w->data) {
        fp_word(s, UINT64_MAX);
        return;
    }
    fp_word(s, (uint64_t)w->dtype);
    fp_word(s, (uint64_t)w->rows);
    fp_word(s, (uint64_t)w->cols);
    fp_word(s, (uint64_t)w->group);
    fp_sample(s, w->data, (size_t)w->rows * dtype_row_bytes(w->dtype, w->cols));
    /* A quantized weight's codes alone do not tell two quantizations apart (a q4 backbone
     * by HQQ and one by RTN share most codes), so its scales and zeros count too. */
    if (w->group > 0 && w->scales && w->zeros) {
        size_t ng = (size_t)w->rows * (size_t)(w->cols / w->group) * sizeof(uint16_t);
        fp_sample(s, w->scales, ng);
        fp_sample(s, w->zeros, ng);
    }
}

int model_fingerprint(const model_t *m, char out[MODEL_FINGERPRINT_LEN])
{
    /* A placed model's weights may be device memory; model_place kept the fingerprint. */
    if (m->fingerprint[0]) {
        memcpy(out, m->fingerprint, MODEL_FINGERPRINT_LEN);
        return 0;
    }
    if (m->backend)
        return river_err_set(RIVER_ESTATE, "%s: fingerprint of a placed model not taken",
                             m->path);
    const model_config_t *c = &m->cfg;
    fp_state_t s = {0x243f6a8885a308d3u, 0x13198a2e03707344u};
    fp_str(&s, "river-fingerprint-1");
    const int64_t cfg[] = {c->arch,      c->dim,        c->n_layers,       c->n_heads,
                           c->n_kv_heads, c->head_dim,  c->hidden_dim,     c->vocab_size,
                           c->tied_embeddings};
    for (size_t i = 0; i < sizeof cfg / sizeof cfg[0]; i++)
        fp_word(&s, (uint64_t)cfg[i]);
    fp_weight(&s, "embed", &m->embed);
    fp_weight(&s, "final_norm", &m->final_norm);
    fp_weight(&s, "lm_head", &m->lm_head);
    char name[64];
    for (int l = 0; l < c->n_layers; l++) {
        const layer_weights_t *L = &m->layers[l];
        const struct {
            const char *n;
            const weight_t *w;
        } ws[] = {{"attn_norm", &L->attn_norm}, {"wq", &L->wq},         {"wk", &L->wk},
                  {"wv", &L->wv},               {"wo", &L->wo},         {"bq", &L->bq},
                  {"bk", &L->bk},               {"bv", &L->bv},         {"q_norm", &L->q_norm},
                  {"k_norm", &L->k_norm},       {"ffn_norm", &L->ffn_norm},
                  {"w_gate", &L->w_gate},       {"w_up", &L->w_up},     {"w_down", &L->w_down}};
        for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++) {
            snprintf(name, sizeof name, "layers.%d.%s", l, ws[i].n);
            fp_weight(&s, name, ws[i].w);
        }
    }
    snprintf(out, MODEL_FINGERPRINT_LEN, "%016" PRIx64 "%016" PRIx64, s.a, s.b);
    return 0;
}
