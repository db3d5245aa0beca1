/* Model loading: the three real checkpoints (configuration, parameter counts, weights equal
 * to the file bytes), synthetic checkpoints of every architecture and dtype, sharding, the
 * safetensors reader/writer, fp16/bf16 conversions, and every malformed-input error. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ftw.h>
#include <sys/stat.h>

#include "common/err.h"
#include "model/model.h"
#include "model/model_internal.h"
#include "model/safetensors.h"
#include "offline/synth.h"
#include "kernels/half.h"
#include "tests/testutil.h"

#define S260K TEST_DATA "/stories260K/stories260K.bin"
#define TS656K TEST_DATA "/tinystories-656k"
#define TS656K_BIN TEST_DATA "/tinystories-656k/llama2c/tinystories656k.bin"
#define KJV TEST_DATA "/kjv-12l"

static model_t *load_ok(const char *path)
{
    model_t *m = NULL;
    int err = model_load(&m, path);
    ck_assert_msg(err == 0, "loading %s: %s: %s", path, river_err_name(err),
                  river_err_detail());
    ck_assert_ptr_nonnull(m);
    return m;
}

/* Loading must fail with `code`, leave *out NULL, and say which file (and what) failed. */
static void expect_err(const char *path, int code, const char *needle1, const char *needle2)
{
    model_t *m = NULL;
    river_err_clear();
    int err = model_load(&m, path);
    ck_assert_msg(err == code, "loading %s: got %s (%s), want %s", path, river_err_name(err),
                  river_err_detail(), river_err_name(code));
    ck_assert_ptr_null(m);
    const char *d = river_err_detail();
    ck_assert_msg(strstr(d, needle1), "detail '%s' lacks '%s'", d, needle1);
    if (needle2)
        ck_assert_msg(strstr(d, needle2), "detail '%s' lacks '%s'", d, needle2);
}

static const unsigned char *file_bytes(const char *path, size_t *len)
{
    const unsigned char *b = test_read_file(path, len);
    ck_assert_msg(b != NULL, "cannot read %s", path);
    return b;
}

static size_t wbytes(const weight_t *w)
{
    return (size_t)w->rows * dtype_row_bytes(w->dtype, w->cols);
}

/* ---- real models ---- */

START_TEST(test_stories260k)
{
    model_t *m = load_ok(S260K);
    const model_config_t *c = &m->cfg;
    ck_assert_int_eq(m->is_llama2c, 1);
    ck_assert_str_eq(m->dir, TEST_DATA "/stories260K");
    ck_assert_int_eq(c->arch, ARCH_LLAMA);
    ck_assert_int_eq(c->dim, 64);
    ck_assert_int_eq(c->n_layers, 5);
    ck_assert_int_eq(c->n_heads, 8);
    ck_assert_int_eq(c->n_kv_heads, 4);
    ck_assert_int_eq(c->head_dim, 8);
    ck_assert_int_eq(c->hidden_dim, 172);
    ck_assert_int_eq(c->vocab_size, 512);
    ck_assert_int_eq(c->max_seq_len, 512);
    ck_assert_int_eq(c->tied_embeddings, 1);
    ck_assert_int_eq(c->rope_layout, ROPE_INTERLEAVED);
    ck_assert_float_eq(c->norm_eps, 1e-5f);
    ck_assert_float_eq(c->rope_theta, 10000.0f);
    ck_assert_int_eq(c->bos_id, 1);
    ck_assert_int_eq(c->n_eos, 1);
    ck_assert_int_eq(c->eos_ids[0], 2);
    ck_assert_int_eq(c->dtype, DTYPE_F32);
    ck_assert_int_eq(model_param_count(m), 260032);
    /* Everything but the embedding (227,264 floats incl. the final norm), the tied LM head
     * (512 x 64) and one embedding row, in f32. */
    ck_assert_int_eq(model_bytes_per_token(m), (227264 + 32768 + 64) * 4);

    /* Offsets from PROVENANCE.md: every weight points at its slice of the file. */
    size_t len;
    const unsigned char *f = file_bytes(S260K, &len);
    ck_assert_uint_eq(len, 1056540);
    const char *base = (const char *)m->embed.data - 28;
    const struct {
        const weight_t *w;
        long off;
    } at[] = {
        {&m->embed, 28},
        {&m->layers[0].attn_norm, 131100},
        {&m->layers[2].wq, 132380 + 2 * 64 * 64 * 4},
        {&m->layers[4].wk, 214300 + 4 * 32 * 64 * 4},
        {&m->layers[1].wv, 255260 + 1 * 32 * 64 * 4},
        {&m->layers[3].wo, 296220 + 3 * 64 * 64 * 4},
        {&m->layers[4].ffn_norm, 378140 + 4 * 64 * 4},
        {&m->layers[0].w_gate, 379420},
        {&m->layers[4].w_down, 599580 + 4 * 64 * 172 * 4},
        {&m->layers[2].w_up, 819740 + 2 * 172 * 64 * 4},
        {&m->final_norm, 1039900},
    };
    for (size_t i = 0; i < sizeof at / sizeof at[0]; i++) {
        ck_assert_int_eq((const char *)at[i].w->data - base, at[i].off);
        ck_assert_int_eq(at[i].w->dtype, DTYPE_F32);
        ck_assert_int_eq(memcmp(at[i].w->data, f + at[i].off, wbytes(at[i].w)), 0);
    }
    ck_assert_int_eq(m->layers[4].w_down.rows, 64);
    ck_assert_int_eq(m->layers[4].w_down.cols, 172);
    ck_assert_int_eq(m->final_norm.rows, 1);
    ck_assert_ptr_eq(m->lm_head.data, m->embed.data);
    ck_assert_ptr_null(m->layers[0].bq.data);
    ck_assert_ptr_null(m->layers[0].q_norm.data);
    free((void *)f);
    model_destroy(&m);
    ck_assert_ptr_null(m);
}
END_TEST

START_TEST(test_tinystories_hf)
{
    model_t *m = load_ok(TS656K);
    const model_config_t *c = &m->cfg;
    ck_assert_int_eq(m->is_llama2c, 0);
    ck_assert_int_eq(c->arch, ARCH_LLAMA);
    ck_assert_int_eq(c->dim, 128);
    ck_assert_int_eq(c->n_layers, 2);
    ck_assert_int_eq(c->n_heads, 8);
    ck_assert_int_eq(c->n_kv_heads, 4);
    ck_assert_int_eq(c->head_dim, 16);
    ck_assert_int_eq(c->hidden_dim, 384);
    ck_assert_int_eq(c->vocab_size, 2048);
    ck_assert_int_eq(c->max_seq_len, 512);
    ck_assert_float_eq(c->norm_eps, 1e-6f);
    ck_assert_int_eq(c->rope_layout, ROPE_HALF);
    ck_assert_int_eq(c->rope_scaling, ROPE_SCALING_NONE);
    ck_assert_int_eq(c->tied_embeddings, 1);
    ck_assert_int_eq(c->bos_id, 1);
    ck_assert_int_eq(c->eos_ids[0], 2);
    ck_assert_int_eq(c->dtype, DTYPE_F32);
    ck_assert_int_eq(model_param_count(m), 656000);
    /* All but the 2048 x 128 table, then the table as LM head, plus one row, in f32. */
    ck_assert_int_eq(model_bytes_per_token(m), (656000 - 262144 + 262144 + 128) * 4);

    /* The tied table exists only as lm_head.weight (data_offsets [0, 1048576]). */
    size_t len;
    const unsigned char *f = file_bytes(TS656K "/model.safetensors", &len);
    const size_t data = 8 + 2160;
    ck_assert_ptr_eq(m->lm_head.data, m->embed.data);
    ck_assert_int_eq(memcmp(m->embed.data, f + data, 1048576), 0);
    /* down_proj of layer 0 is used in place: data_offsets [1049088, 1245696]. */
    ck_assert_int_eq((const char *)m->layers[0].w_down.data - (const char *)m->embed.data,
                     1049088);
    ck_assert_int_eq(memcmp(m->layers[0].w_down.data, f + data + 1049088, 1245696 - 1049088),
                     0);
    /* Norms are owned f32 copies with the file's values: input_layernorm [1048576, +512]. */
    const weight_t *n = &m->layers[0].attn_norm;
    ck_assert_int_eq(n->dtype, DTYPE_F32);
    ck_assert_int_eq(n->rows, 1);
    ck_assert_int_eq(n->cols, 128);
    ck_assert_int_eq(memcmp(n->data, f + data + 1048576, 512), 0);
    ck_assert_ptr_null(n->scales);
    free((void *)f);
    model_destroy(&m);
}
END_TEST

/* The llama2.c copy of TinyStories-656K: same tensors, with q/k rows permuted from
 * rotate_half pairs (i, i + hs/2) to interleaved pairs (2i, 2i + 1). */
START_TEST(test_tinystories_llama2c)
{
    model_t *b = load_ok(TS656K_BIN);
    model_t *h = load_ok(TS656K);
    ck_assert_int_eq(b->is_llama2c, 1);
    ck_assert_float_eq(b->cfg.norm_eps, 1e-5f); /* the format cannot say otherwise */
    model_set_norm_eps(b, 1e-6f);
    ck_assert_float_eq(b->cfg.norm_eps, 1e-6f);
    ck_assert_int_eq(b->cfg.rope_layout, ROPE_INTERLEAVED);
    ck_assert_int_eq(model_param_count(b), 656000);
    ck_assert_int_eq(model_bytes_per_token(b), model_bytes_per_token(h));
    ck_assert_int_eq(memcmp(b->embed.data, h->embed.data, wbytes(&h->embed)), 0);
    ck_assert_int_eq(memcmp(b->final_norm.data, h->final_norm.data, 128 * 4), 0);
    for (int l = 0; l < 2; l++) {
        const layer_weights_t *x = &b->layers[l], *y = &h->layers[l];
        ck_assert_int_eq(memcmp(x->attn_norm.data, y->attn_norm.data, 128 * 4), 0);
        ck_assert_int_eq(memcmp(x->ffn_norm.data, y->ffn_norm.data, 128 * 4), 0);
        ck_assert_int_eq(memcmp(x->wv.data, y->wv.data, wbytes(&y->wv)), 0);
        ck_assert_int_eq(memcmp(x->wo.data, y->wo.data, wbytes(&y->wo)), 0);
        ck_assert_int_eq(memcmp(x->w_gate.data, y->w_gate.data, wbytes(&y->w_gate)), 0);
        ck_assert_int_eq(memcmp(x->w_up.data, y->w_up.data, wbytes(&y->w_up)), 0);
        ck_assert_int_eq(memcmp(x->w_down.data, y->w_down.data, wbytes(&y->w_down)), 0);
        ck_assert_int_ne(memcmp(x->wq.data, y->wq.data, wbytes(&y->wq)), 0);
        const weight_t *pairs[2][2] = {{&x->wq, &y->wq}, {&x->wk, &y->wk}};
        for (int t = 0; t < 2; t++) {
            const float *bw = pairs[t][0]->data, *hw = pairs[t][1]->data;
            int heads = (int)pairs[t][0]->rows / 16, hs = 16;
            for (int hd = 0; hd < heads; hd++)
                for (int i = 0; i < hs / 2; i++)
                    for (int p = 0; p < 2; p++)
                        ck_assert_int_eq(memcmp(bw + (size_t)(hd * hs + 2 * i + p) * 128,
                                                hw + (size_t)(hd * hs + p * hs / 2 + i) * 128,
                                                128 * 4),
                                         0);
        }
    }
    model_destroy(&b);
    model_destroy(&h);
}
END_TEST

START_TEST(test_kjv)
{
    model_t *m = load_ok(KJV "/config.json"); /* a config.json path works as well */
    const model_config_t *c = &m->cfg;
    ck_assert_str_eq(m->dir, KJV);
    ck_assert_int_eq(c->n_layers, 12);
    ck_assert_int_eq(c->dim, 192);
    ck_assert_int_eq(c->n_heads, 6);
    ck_assert_int_eq(c->n_kv_heads, 3);
    ck_assert_int_eq(c->head_dim, 32);
    ck_assert_int_eq(c->hidden_dim, 512);
    ck_assert_int_eq(c->vocab_size, 2048);
    ck_assert_int_eq(c->max_seq_len, 256);
    ck_assert_float_eq(c->norm_eps, 1e-5f);
    ck_assert_int_eq(c->tied_embeddings, 1);
    ck_assert_int_eq(model_param_count(m), 5264064);
    ck_assert_int_eq(model_bytes_per_token(m), (5264064 + 192) * 4);
    ck_assert_ptr_eq(m->lm_head.data, m->embed.data);

    size_t len;
    const unsigned char *f = file_bytes(KJV "/model.safetensors", &len);
    ck_assert_uint_eq(len, 21068104);
    const size_t data = 8 + 11840;
    ck_assert_int_eq(memcmp(m->embed.data, f + data, 1572864), 0);
    ck_assert_int_eq(memcmp(m->layers[0].wq.data, f + data + 1572864, 1720320 - 1572864), 0);
    ck_assert_int_eq(memcmp(m->layers[0].wk.data, f + data + 1720320, 1794048 - 1720320), 0);

    /* Every weight of every layer equals the tensor the reader finds under its name. */
    safetensors_t *st = NULL;
    ck_assert_int_eq(safetensors_open(&st, KJV "/model.safetensors"), 0);
    ck_assert_uint_eq(safetensors_count(st), 12 * 9 + 2);
    ck_assert_str_eq(safetensors_metadata(st, "format"), "pt");
    for (int l = 0; l < 12; l++) {
        const layer_weights_t *L = &m->layers[l];
        const struct {
            const char *n;
            const weight_t *w;
        } ws[] = {{"self_attn.q_proj.weight", &L->wq},  {"self_attn.k_proj.weight", &L->wk},
                  {"self_attn.v_proj.weight", &L->wv},  {"self_attn.o_proj.weight", &L->wo},
                  {"mlp.gate_proj.weight", &L->w_gate}, {"mlp.up_proj.weight", &L->w_up},
                  {"mlp.down_proj.weight", &L->w_down}, {"input_layernorm.weight", &L->attn_norm},
                  {"post_attention_layernorm.weight", &L->ffn_norm}};
        for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++) {
            char name[128];
            snprintf(name, sizeof name, "model.layers.%d.%s", l, ws[i].n);
            const safetensors_tensor_t *t = safetensors_find(st, name);
            ck_assert_ptr_nonnull(t);
            ck_assert_uint_eq(t->nbytes, wbytes(ws[i].w));
            ck_assert_int_eq(memcmp(t->data, ws[i].w->data, t->nbytes), 0);
            ck_assert_uint_eq(t->file_offset,
                              (const unsigned char *)t->data - (const unsigned char *)
                              safetensors_find(st, "model.embed_tokens.weight")->data + data);
        }
    }
    ck_assert_ptr_null(safetensors_find(st, "lm_head.weight"));
    safetensors_destroy(&st);
    ck_assert_ptr_null(st);
    free((void *)f);
    model_destroy(&m);
}
END_TEST

/* ---- conversions ---- */

START_TEST(test_half)
{
    /* bf16: round to nearest, ties to even. */
    ck_assert_uint_eq(f32_to_bf16(1.0f), 0x3f80);
    ck_assert_uint_eq(f32_to_bf16(half_bits_f32(0x3f808000)), 0x3f80); /* tie, even below */
    ck_assert_uint_eq(f32_to_bf16(half_bits_f32(0x3f818000)), 0x3f82); /* tie, even above */
    ck_assert_uint_eq(f32_to_bf16(half_bits_f32(0x3f808001)), 0x3f81);
    ck_assert_uint_eq(f32_to_bf16(-2.0f), 0xc000);
    ck_assert_uint_eq(f32_to_bf16(half_bits_f32(0x7f7fffff)), 0x7f80); /* rounds to inf */
    ck_assert(isnan(bf16_to_f32(f32_to_bf16(NAN))));
    ck_assert(isnan(bf16_to_f32(f32_to_bf16(half_bits_f32(0x7f800001)))));
    ck_assert_float_eq(bf16_to_f32(0x4049), 3.140625f);

    /* fp16 */
    ck_assert_uint_eq(f32_to_f16(1.0f), 0x3c00);
    ck_assert_uint_eq(f32_to_f16(-2.0f), 0xc000);
    ck_assert_uint_eq(f32_to_f16(65504.0f), 0x7bff);
    ck_assert_uint_eq(f32_to_f16(65519.0f), 0x7bff);
    ck_assert_uint_eq(f32_to_f16(65520.0f), 0x7c00);
    ck_assert_uint_eq(f32_to_f16(INFINITY), 0x7c00);
    ck_assert_uint_eq(f32_to_f16(-INFINITY), 0xfc00);
    ck_assert_uint_eq(f32_to_f16(0x1p-24f), 0x0001);
    ck_assert_uint_eq(f32_to_f16(0x1p-25f), 0x0000);       /* tie to even (0) */
    ck_assert_uint_eq(f32_to_f16(3 * 0x1p-25f), 0x0002);   /* tie to even (2) */
    ck_assert_uint_eq(f32_to_f16(0x1p-14f), 0x0400);       /* smallest normal */
    ck_assert_uint_eq(f32_to_f16(1.0f + 0x1p-11f), 0x3c00); /* tie to even */
    ck_assert_uint_eq(f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3c02);
    ck_assert_uint_eq(f32_to_f16(-0.0f), 0x8000);
    ck_assert(isnan(f16_to_f32(f32_to_f16(NAN))));
    ck_assert_float_eq(f16_to_f32(0x0001), 0x1p-24f);
    ck_assert_float_eq(f16_to_f32(0x3555), 0.333251953125f);
    /* Every non-NaN fp16 survives the round trip through f32. */
    for (uint32_t h = 0; h < 0x10000; h++) {
        if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff))
            continue;
        ck_assert_uint_eq(f32_to_f16(f16_to_f32((uint16_t)h)), h);
        ck_assert_uint_eq(f32_to_bf16(bf16_to_f32((uint16_t)h)),
                          ((h & 0x7f80) == 0x7f80 && (h & 0x7f)) ? (h | 0x40) : h);
    }
}
END_TEST

START_TEST(test_dtype)
{
    ck_assert_uint_eq(dtype_size(DTYPE_F32), 4);
    ck_assert_uint_eq(dtype_size(DTYPE_F16), 2);
    ck_assert_uint_eq(dtype_size(DTYPE_BF16), 2);
    ck_assert_uint_eq(dtype_size(DTYPE_Q4), 0);
    ck_assert_uint_eq(dtype_row_bytes(DTYPE_BF16, 2048), 4096);
    ck_assert_uint_eq(dtype_row_bytes(DTYPE_Q4, 64), 32);
    ck_assert_uint_eq(dtype_row_bytes(DTYPE_Q4, 65), 33);
    ck_assert_uint_eq(dtype_row_bytes(DTYPE_Q8, 64), 64);
    ck_assert_str_eq(dtype_name(DTYPE_BF16), "bf16");
    ck_assert_str_eq(dtype_name(DTYPE_F16), "f16");
    ck_assert_str_eq(arch_name(ARCH_PHI3), "phi3");
}
END_TEST

/* ---- synthetic checkpoints ---- */

typedef struct shape_spec {
    const char *name;
    arch_t arch;
    int layers, dim, heads, kv, hd, hidden, vocab, tied;
} shape_spec_t;

static const shape_spec_t tiny_shapes[] = {
    {"stories260K", ARCH_LLAMA, 5, 64, 8, 4, 8, 172, 512, 1},
    {"tinystories-656k", ARCH_LLAMA, 2, 128, 8, 4, 16, 384, 2048, 1},
    {"qwen2-tiny", ARCH_QWEN2, 2, 128, 4, 2, 32, 256, 512, 1},
    {"qwen3-tiny", ARCH_QWEN3, 2, 128, 4, 2, 48, 256, 512, 0},
    {"mistral-tiny", ARCH_MISTRAL, 2, 128, 4, 2, 32, 256, 512, 0},
    {"phi3-tiny", ARCH_PHI3, 2, 128, 4, 2, 32, 256, 512, 0},
};

static const char *synth_dir(const char *shape, dtype_t dt, uint64_t seed, uint64_t shard)
{
    static char dir[512];
    snprintf(dir, sizeof dir, "%s/synth-%s-%s-%llu-%llu", test_tmpdir(), shape,
             dtype_name(dt), (unsigned long long)seed, (unsigned long long)shard);
    synth_opts_t o = {.shape = shape, .dtype = dt, .out_dir = dir, .seed = seed,
                      .shard_bytes = shard};
    int err = synth_write(&o);
    ck_assert_msg(err == 0, "synth %s: %s", shape, river_err_detail());
    return dir;
}

/* Mean and standard deviation of a weight's values. */
static void weight_stats(const weight_t *w, double *mean, double *sd)
{
    int64_t n = w->rows * w->cols;
    double s = 0, s2 = 0;
    for (int64_t i = 0; i < n; i++) {
        float v;
        if (w->dtype == DTYPE_F32)
            v = ((const float *)w->data)[i];
        else if (w->dtype == DTYPE_F16)
            v = f16_to_f32(((const uint16_t *)w->data)[i]);
        else
            v = bf16_to_f32(((const uint16_t *)w->data)[i]);
        s += v;
        s2 += (double)v * v;
    }
    *mean = s / (double)n;
    *sd = sqrt(s2 / (double)n - *mean * *mean);
}

START_TEST(test_synth_roundtrip)
{
    const shape_spec_t *sp = &tiny_shapes[_i / 3];
    dtype_t dt = (dtype_t[]){DTYPE_F32, DTYPE_F16, DTYPE_BF16}[_i % 3];
    const char *dir = synth_dir(sp->name, dt, 7, 0);
    char path[600];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    model_t *m = load_ok(dir);
    const model_config_t *c = &m->cfg;
    ck_assert_int_eq(c->arch, sp->arch);
    ck_assert_int_eq(c->n_layers, sp->layers);
    ck_assert_int_eq(c->dim, sp->dim);
    ck_assert_int_eq(c->n_heads, sp->heads);
    ck_assert_int_eq(c->n_kv_heads, sp->kv);
    ck_assert_int_eq(c->head_dim, sp->hd);
    ck_assert_int_eq(c->hidden_dim, sp->hidden);
    ck_assert_int_eq(c->vocab_size, sp->vocab);
    ck_assert_int_eq(c->tied_embeddings, sp->tied);
    ck_assert_int_eq(c->dtype, dt);
    ck_assert_int_eq(c->rope_layout, ROPE_HALF);
    ck_assert_int_eq(m->embed.dtype, dt);
    ck_assert_int_eq(m->final_norm.dtype, DTYPE_F32);

    int64_t D = sp->dim, q = (int64_t)sp->heads * sp->hd, kv = (int64_t)sp->kv * sp->hd;
    int64_t H = sp->hidden, V = sp->vocab;
    int64_t vec = 2 * D + (sp->arch == ARCH_QWEN2 ? q + 2 * kv : 0) +
                  (sp->arch == ARCH_QWEN3 ? 2 * sp->hd : 0);
    int64_t mat = 2 * q * D + 2 * kv * D + 3 * H * D;
    int64_t es = (int64_t)dtype_size(dt);
    ck_assert_int_eq(model_param_count(m), V * D * (sp->tied ? 1 : 2) + D + sp->layers * (vec + mat));
    ck_assert_int_eq(model_bytes_per_token(m),
                     sp->layers * (vec * 4 + mat * es) + D * 4 + V * D * es + D * es);
    ck_assert_int_eq(synth_data_bytes(sp->name, dt),
                     (V * D * (sp->tied ? 1 : 2) + sp->layers * mat) * es +
                         (sp->layers * vec + D) * es);

    const layer_weights_t *L = &m->layers[sp->layers - 1];
    ck_assert_int_eq(L->wq.rows, q);
    ck_assert_int_eq(L->wo.cols, q);
    ck_assert_int_eq(L->wk.rows, kv);
    ck_assert_int_eq(L->w_gate.rows, H);
    ck_assert_int_eq(L->w_down.cols, H);
    ck_assert(!!L->bq.data == (sp->arch == ARCH_QWEN2));
    ck_assert(!!L->bv.data == (sp->arch == ARCH_QWEN2));
    ck_assert(!!L->q_norm.data == (sp->arch == ARCH_QWEN3));
    if (sp->arch == ARCH_QWEN2)
        ck_assert_int_eq(L->bk.cols, kv);
    if (sp->arch == ARCH_QWEN3) {
        ck_assert_int_eq(L->k_norm.cols, 48);
        ck_assert_int_eq(c->n_eos, 2);
        ck_assert_int_eq(c->eos_ids[1], 3);
    }
    if (sp->arch == ARCH_PHI3) {
        /* Views into the fused tensors: consecutive row blocks. */
        size_t rb = dtype_row_bytes(dt, D);
        ck_assert_ptr_eq(L->wk.data, (const char *)L->wq.data + q * rb);
        ck_assert_ptr_eq(L->wv.data, (const char *)L->wk.data + kv * rb);
        ck_assert_ptr_eq(L->w_up.data, (const char *)L->w_gate.data + H * rb);
        ck_assert_float_eq(c->partial_rotary_factor, 0.75f);
        ck_assert_int_eq(c->rope_scaling, ROPE_SCALING_LONGROPE);
        ck_assert_int_eq(c->rope_orig_max_pos, 256);
        ck_assert_float_eq(c->rope_factor, 4.0f);
        ck_assert_float_eq(c->rope_short_factor[11], 1.11f);
        ck_assert_float_eq(c->rope_long_factor[2], 1.5f);
    }
    if (!strcmp(sp->name, "tinystories-656k"))
        ck_assert_float_eq(c->norm_eps, 1e-6f);

    /* Values: about N(0, 0.02) for matrices, 1 + N(0, 0.02) for norms. */
    double mean, sd;
    weight_stats(&L->w_down, &mean, &sd);
    ck_assert_double_lt(fabs(mean), 0.002);
    ck_assert_double_lt(fabs(sd - 0.02), 0.002);
    weight_stats(&m->final_norm, &mean, &sd);
    ck_assert_double_lt(fabs(mean - 1.0), 0.01);
    ck_assert_double_gt(sd, 0.01);

    /* The loaded weights are the file's bytes. */
    safetensors_t *st = NULL;
    ck_assert_int_eq(safetensors_open(&st, path), 0);
    const safetensors_tensor_t *t = safetensors_find(st, "model.layers.0.mlp.down_proj.weight");
    ck_assert_ptr_nonnull(t);
    ck_assert_int_eq(memcmp(t->data, m->layers[0].w_down.data, t->nbytes), 0);
    ck_assert_uint_eq(t->file_offset % 8, 0); /* the writer pads the header */
    safetensors_destroy(&st);
    model_destroy(&m);
}
END_TEST

START_TEST(test_synth_deterministic)
{
    size_t a_len, b_len, c_len;
    char pa[600], pc[600];
    snprintf(pa, sizeof pa, "%s/model.safetensors", synth_dir("qwen2-tiny", DTYPE_BF16, 3, 0));
    snprintf(pc, sizeof pc, "%s/model.safetensors", synth_dir("qwen2-tiny", DTYPE_BF16, 4, 0));
    const unsigned char *a = file_bytes(pa, &a_len);
    const unsigned char *c = file_bytes(pc, &c_len);
    ck_assert_uint_eq(a_len, c_len);
    ck_assert_int_ne(memcmp(a, c, a_len), 0); /* another seed, other values */
    synth_dir("qwen2-tiny", DTYPE_BF16, 3, 0); /* rewrite the first in place */
    const unsigned char *b = file_bytes(pa, &b_len);
    ck_assert_uint_eq(a_len, b_len);
    ck_assert_int_eq(memcmp(a, b, a_len), 0);
    free((void *)a);
    free((void *)b);
    free((void *)c);

    /* With a 1-byte shard limit every tensor gets a file of its own, and the values are
     * still those of the unsharded file. */
    const char *d = synth_dir("qwen2-tiny", DTYPE_BF16, 3, 1);
    char p[600];
    snprintf(p, sizeof p, "%s/model-00026-of-00026.safetensors", d);
    safetensors_t *st = NULL;
    ck_assert_int_eq(safetensors_open(&st, p), 0);
    ck_assert_uint_eq(safetensors_count(st), 1);
    ck_assert_str_eq(safetensors_tensor_at(st, 0)->name, "model.norm.weight");
    safetensors_destroy(&st);
    snprintf(p, sizeof p, "%s/model.safetensors", d);
    ck_assert_ptr_null(test_read_file(p, &b_len));
    model_t *m = load_ok(d);
    model_t *u = load_ok(synth_dir("qwen2-tiny", DTYPE_BF16, 3, 0));
    ck_assert_int_eq(memcmp(m->layers[1].bv.data, u->layers[1].bv.data, 64 * 4), 0);
    ck_assert_int_eq(memcmp(m->embed.data, u->embed.data, wbytes(&u->embed)), 0);
    model_destroy(&m);
    model_destroy(&u);
}
END_TEST

START_TEST(test_synth_sharded)
{
    const char *d = synth_dir("mistral-tiny", DTYPE_F32, 9, 300 * 1024);
    char dir[512], p[600];
    snprintf(dir, sizeof dir, "%s", d);
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    json_error_t jerr;
    json_t *idx = json_load_file(p, 0, &jerr);
    ck_assert_ptr_nonnull(idx);
    ck_assert_uint_eq(json_object_size(json_object_get(idx, "weight_map")), 2 * 9 + 3);
    const char *first =
        json_string_value(json_object_get(json_object_get(idx, "weight_map"), "lm_head.weight"));
    ck_assert_ptr_nonnull(first);
    ck_assert_int_eq(strncmp(first, "model-0000", 10), 0);
    json_decref(idx);
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    struct stat st;
    ck_assert_int_ne(stat(p, &st), 0);

    model_t *s = load_ok(dir);
    model_t *u = load_ok(synth_dir("mistral-tiny", DTYPE_F32, 9, 0));
    ck_assert_int_eq(model_param_count(s), model_param_count(u));
    ck_assert_int_eq(memcmp(s->embed.data, u->embed.data, wbytes(&u->embed)), 0);
    ck_assert_int_eq(memcmp(s->lm_head.data, u->lm_head.data, wbytes(&u->lm_head)), 0);
    ck_assert_int_eq(memcmp(s->final_norm.data, u->final_norm.data, 128 * 4), 0);
    for (int l = 0; l < 2; l++) {
        const weight_t *a[] = {&s->layers[l].wq, &s->layers[l].wk, &s->layers[l].wv,
                               &s->layers[l].wo, &s->layers[l].w_gate, &s->layers[l].w_up,
                               &s->layers[l].w_down, &s->layers[l].attn_norm};
        const weight_t *b[] = {&u->layers[l].wq, &u->layers[l].wk, &u->layers[l].wv,
                               &u->layers[l].wo, &u->layers[l].w_gate, &u->layers[l].w_up,
                               &u->layers[l].w_down, &u->layers[l].attn_norm};
        for (size_t i = 0; i < sizeof a / sizeof a[0]; i++)
            ck_assert_int_eq(memcmp(a[i]->data, b[i]->data, wbytes(b[i])), 0);
    }
    model_destroy(&s);
    model_destroy(&u);
}
END_TEST

/* ---- malformed inputs ---- */

static const char *tmp_dir(const char *name)
{
    static char dir[512];
    snprintf(dir, sizeof dir, "%s/%s", test_tmpdir(), name);
    mkdir(dir, 0700);
    return dir;
}

static void write_file(const char *dir, const char *name, const void *data, size_t len)
{
    char p[600];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite(data, 1, len, f), len);
    ck_assert_int_eq(fclose(f), 0);
}

/* Copies TinyStories-656K into tmp/<name>/ with its safetensors header passed through
 * `edit` and its file size changed by `resize` bytes (negative: cut). */
static const char *hf_copy(const char *name, void (*edit)(json_t *hdr), long resize)
{
    size_t len, clen;
    unsigned char *f = (unsigned char *)file_bytes(TS656K "/model.safetensors", &len);
    const char *cfg = (const char *)file_bytes(TS656K "/config.json", &clen);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = hlen << 8 | f[i];
    json_t *hdr = json_loadb((const char *)f + 8, hlen, 0, NULL);
    ck_assert_ptr_nonnull(hdr);
    if (edit)
        edit(hdr);
    char *js = json_dumps(hdr, JSON_COMPACT);
    size_t n = strlen(js), data = len - 8 - hlen;
    size_t out_len = 8 + n + data;
    if (resize < 0)
        out_len -= (size_t)-resize;
    unsigned char *out = calloc(1, 8 + n + data + (resize > 0 ? (size_t)resize : 0));
    for (int i = 0; i < 8; i++)
        out[i] = (unsigned char)((uint64_t)n >> (8 * i));
    memcpy(out + 8, js, n);
    memcpy(out + 8 + n, f + 8 + hlen, data);
    if (resize > 0)
        out_len += (size_t)resize;
    const char *dir = tmp_dir(name);
    write_file(dir, "model.safetensors", out, out_len);
    write_file(dir, "config.json", cfg, clen);
    free(out);
    free(js);
    json_decref(hdr);
    free(f);
    free((void *)cfg);
    return dir;
}

static void set_offsets(json_t *hdr, const char *name, long long b, long long e)
{
    json_object_set_new(json_object_get(hdr, name), "data_offsets", json_pack("[I, I]", b, e));
}

static void edit_oob(json_t *hdr)
{
    /* model.norm.weight moved from its slot to just past the end of the data area. */
    set_offsets(hdr, "model.norm.weight", 2624000, 2624000 + 512);
}

static void edit_overlap(json_t *hdr)
{
    set_offsets(hdr, "model.norm.weight", 0, 512);
}

static void edit_shape(json_t *hdr)
{
    json_object_set_new(json_object_get(hdr, "model.layers.1.mlp.up_proj.weight"), "shape",
                        json_pack("[i, i]", 128, 384));
}

static void edit_dtype(json_t *hdr)
{
    json_object_set_new(json_object_get(hdr, "model.layers.0.self_attn.q_proj.weight"),
                        "dtype", json_string("I32"));
}

static void edit_missing(json_t *hdr)
{
    json_object_del(hdr, "model.layers.1.self_attn.k_proj.weight");
}

static void edit_bad_size(json_t *hdr)
{
    json_object_set_new(json_object_get(hdr, "model.layers.0.mlp.up_proj.weight"), "shape",
                        json_pack("[i, i]", 384, 127));
}

static void edit_unknown_unused(json_t *hdr)
{
    /* Unknown dtypes are fine on tensors the model never reads. */
    json_object_set_new(hdr, "extra.rotary_emb.inv_freq",
                        json_pack("{s:s, s:[i], s:[i, i]}", "dtype", "F4_E9", "shape", 8,
                                  "data_offsets", 2624000, 2624000));
}

static void edit_unknown_used(json_t *hdr)
{
    json_object_set_new(json_object_get(hdr, "model.norm.weight"), "dtype",
                        json_string("F4_E9"));
}

START_TEST(test_err_safetensors)
{
    char p[600];
    const char *d;

    d = hf_copy("trunc", NULL, -1000);
    expect_err(d, RIVER_ETRUNC, "trunc/model.safetensors", "truncated");

    d = hf_copy("oob", edit_oob, 0);
    expect_err(d, RIVER_EFORMAT, "oob/model.safetensors", "model.norm.weight");

    d = hf_copy("overlap", edit_overlap, 0);
    expect_err(d, RIVER_EFORMAT, "overlap/model.safetensors", "overlap");

    d = hf_copy("shape", edit_shape, 0);
    expect_err(d, RIVER_ESHAPE, "shape/model.safetensors",
               "'model.layers.1.mlp.up_proj.weight' has shape [128, 384], expected [384, 128]");

    d = hf_copy("dtype", edit_dtype, 0);
    expect_err(d, RIVER_EDTYPE, "dtype/model.safetensors", "I32");

    d = hf_copy("missing", edit_missing, 0);
    expect_err(d, RIVER_ENOTFOUND, "missing/model.safetensors",
               "model.layers.1.self_attn.k_proj.weight");

    d = hf_copy("badsize", edit_bad_size, 0);
    expect_err(d, RIVER_EFORMAT, "badsize/model.safetensors", "up_proj");

    d = hf_copy("unknown_used", edit_unknown_used, 0);
    expect_err(d, RIVER_EDTYPE, "unknown_used/model.safetensors", "F4_E9");

    d = hf_copy("unknown_unused", edit_unknown_unused, 0);
    model_t *m = load_ok(d);
    ck_assert_int_eq(model_param_count(m), 656000);
    model_destroy(&m);

    /* Header length beyond the file. */
    d = hf_copy("hdrlen", NULL, 0);
    snprintf(p, sizeof p, "%s/model.safetensors", d);
    size_t len;
    unsigned char *f = (unsigned char *)file_bytes(p, &len);
    f[0] = 0xff;
    f[1] = 0xff;
    f[2] = 0xff;
    write_file(d, "model.safetensors", f, len);
    expect_err(d, RIVER_EFORMAT, "hdrlen/model.safetensors", "header length");
    /* Shorter than the length field itself. */
    write_file(d, "model.safetensors", f, 5);
    expect_err(d, RIVER_ETRUNC, "hdrlen/model.safetensors", NULL);
    /* A header that is not JSON. */
    memset(f + 8, 'x', 16);
    f[0] = 16, f[1] = 0, f[2] = 0;
    write_file(d, "model.safetensors", f, len);
    expect_err(d, RIVER_EFORMAT, "hdrlen/model.safetensors", "JSON");
    free(f);

    /* No weights at all. */
    snprintf(p, sizeof p, "%s/model.safetensors", d);
    ck_assert_int_eq(remove(p), 0);
    expect_err(d, RIVER_ENOTFOUND, "hdrlen", "model.safetensors");
}
END_TEST

/* Writes a config.json into tmp/<name>/ and parses it. */
static int parse_config(const char *name, const char *json, model_config_t *cfg)
{
    const char *dir = tmp_dir(name);
    write_file(dir, "config.json", json, strlen(json));
    char p[600];
    snprintf(p, sizeof p, "%s/config.json", dir);
    return hfconfig_load(cfg, p);
}

/* The configuration fields of real published models, as their config.json files give
 * them (trimmed to what the parser reads, factor arrays generated). */
START_TEST(test_hfconfig_real)
{
    model_config_t c;
    int err = parse_config("cfg-llama32", "{\"architectures\":[\"LlamaForCausalLM\"],"
        "\"attention_bias\":false,\"bos_token_id\":128000,\"eos_token_id\":[128001,128008,128009],"
        "\"head_dim\":64,\"hidden_act\":\"silu\",\"hidden_size\":2048,\"intermediate_size\":8192,"
        "\"max_position_embeddings\":131072,\"mlp_bias\":false,\"model_type\":\"llama\","
        "\"num_attention_heads\":32,\"num_hidden_layers\":16,\"num_key_value_heads\":8,"
        "\"rms_norm_eps\":1e-05,\"rope_scaling\":{\"factor\":32.0,\"high_freq_factor\":4.0,"
        "\"low_freq_factor\":1.0,\"original_max_position_embeddings\":8192,\"rope_type\":\"llama3\"},"
        "\"rope_theta\":500000.0,\"tie_word_embeddings\":true,\"vocab_size\":128256}", &c);
    ck_assert_msg(err == 0, "%s", river_err_detail());
    ck_assert_int_eq(c.arch, ARCH_LLAMA);
    ck_assert_int_eq(c.head_dim, 64);
    ck_assert_int_eq(c.rope_scaling, ROPE_SCALING_LLAMA3);
    ck_assert_float_eq(c.rope_factor, 32.0f);
    ck_assert_float_eq(c.rope_low_freq_factor, 1.0f);
    ck_assert_float_eq(c.rope_high_freq_factor, 4.0f);
    ck_assert_int_eq(c.rope_orig_max_pos, 8192);
    ck_assert_float_eq(c.rope_theta, 500000.0f);
    ck_assert_int_eq(c.n_eos, 3);
    ck_assert_int_eq(c.eos_ids[2], 128009);
    ck_assert_int_eq(c.bos_id, 128000);
    ck_assert_int_eq(c.max_seq_len, 131072);
    hfconfig_free(&c);

    err = parse_config("cfg-qwen25", "{\"architectures\":[\"Qwen2ForCausalLM\"],"
        "\"bos_token_id\":151643,\"eos_token_id\":151643,\"hidden_act\":\"silu\","
        "\"hidden_size\":896,\"intermediate_size\":4864,\"max_position_embeddings\":32768,"
        "\"max_window_layers\":21,\"model_type\":\"qwen2\",\"num_attention_heads\":14,"
        "\"num_hidden_layers\":24,\"num_key_value_heads\":2,\"rms_norm_eps\":1e-06,"
        "\"rope_theta\":1000000.0,\"sliding_window\":32768,\"tie_word_embeddings\":true,"
        "\"use_sliding_window\":false,\"vocab_size\":151936}", &c);
    ck_assert_msg(err == 0, "%s", river_err_detail());
    ck_assert_int_eq(c.arch, ARCH_QWEN2);
    ck_assert_int_eq(c.head_dim, 64);
    ck_assert_int_eq(c.max_seq_len, 32768);
    ck_assert_float_eq(c.norm_eps, 1e-6f);
    hfconfig_free(&c);

    err = parse_config("cfg-qwen3", "{\"architectures\":[\"Qwen3ForCausalLM\"],"
        "\"attention_bias\":false,\"bos_token_id\":151643,\"eos_token_id\":151645,"
        "\"head_dim\":128,\"hidden_act\":\"silu\",\"hidden_size\":1024,"
        "\"intermediate_size\":3072,\"max_position_embeddings\":40960,\"model_type\":\"qwen3\","
        "\"num_attention_heads\":16,\"num_hidden_layers\":28,\"num_key_value_heads\":8,"
        "\"rms_norm_eps\":1e-06,\"rope_scaling\":null,\"rope_theta\":1000000,"
        "\"sliding_window\":null,\"tie_word_embeddings\":true,\"use_sliding_window\":false,"
        "\"vocab_size\":151936}", &c);
    ck_assert_msg(err == 0, "%s", river_err_detail());
    ck_assert_int_eq(c.arch, ARCH_QWEN3);
    ck_assert_int_eq(c.head_dim, 128); /* not 1024 / 16 */
    ck_assert_int_eq(c.eos_ids[0], 151645);
    hfconfig_free(&c);

    err = parse_config("cfg-mistral", "{\"architectures\":[\"MistralForCausalLM\"],"
        "\"bos_token_id\":1,\"eos_token_id\":2,\"hidden_act\":\"silu\",\"hidden_size\":4096,"
        "\"intermediate_size\":14336,\"max_position_embeddings\":32768,\"model_type\":\"mistral\","
        "\"num_attention_heads\":32,\"num_hidden_layers\":32,\"num_key_value_heads\":8,"
        "\"rms_norm_eps\":1e-05,\"rope_theta\":10000.0,\"sliding_window\":4096,"
        "\"tie_word_embeddings\":false,\"vocab_size\":32000}", &c);
    ck_assert_msg(err == 0, "%s", river_err_detail());
    ck_assert_int_eq(c.arch, ARCH_MISTRAL);
    ck_assert_int_eq(c.max_seq_len, 4096); /* capped at the sliding window */
    ck_assert_int_eq(c.tied_embeddings, 0);
    hfconfig_free(&c);

    /* Phi-3.5-mini: longrope with 48 factors per list (head_dim 96). */
    json_t *sf = json_array(), *lf = json_array();
    for (int i = 0; i < 48; i++) {
        json_array_append_new(sf, json_real(1.0 + i * 0.01));
        json_array_append_new(lf, json_real(1.0 + i));
    }
    json_t *phi = json_pack("{s:[s], s:i, s:i, s:s, s:i, s:i, s:i, s:i, s:s, s:i, s:i, s:i,"
                            " s:i, s:f, s:{s:o, s:o, s:s}, s:f, s:i, s:b, s:i}",
                            "architectures", "Phi3ForCausalLM", "bos_token_id", 1,
                            "eos_token_id", 32000, "hidden_act", "silu", "hidden_size", 3072,
                            "intermediate_size", 8192, "max_position_embeddings", 131072,
                            "original_max_position_embeddings", 4096, "model_type", "phi3",
                            "num_attention_heads", 32, "num_hidden_layers", 32,
                            "num_key_value_heads", 32, "pad_token_id", 32000, "rms_norm_eps",
                            1e-5, "rope_scaling", "long_factor", lf, "short_factor", sf, "type",
                            "longrope", "rope_theta", 10000.0, "sliding_window", 262144,
                            "tie_word_embeddings", 0, "vocab_size", 32064);
    char *js = json_dumps(phi, 0);
    err = parse_config("cfg-phi35", js, &c);
    ck_assert_msg(err == 0, "%s", river_err_detail());
    ck_assert_int_eq(c.arch, ARCH_PHI3);
    ck_assert_int_eq(c.head_dim, 96);
    ck_assert_int_eq(c.rope_scaling, ROPE_SCALING_LONGROPE);
    ck_assert_int_eq(c.rope_orig_max_pos, 4096);
    ck_assert_float_eq(c.rope_factor, 32.0f); /* 131072 / 4096 */
    ck_assert_float_eq(c.rope_long_factor[47], 48.0f);
    ck_assert_float_eq_tol(c.rope_short_factor[10], 1.1f, 1e-6f);
    ck_assert_int_eq(c.max_seq_len, 131072);
    hfconfig_free(&c);
    ck_assert_ptr_null(c.rope_short_factor);
    free(js);
    /* One factor too few. */
    json_array_remove(json_object_get(json_object_get(phi, "rope_scaling"), "long_factor"), 0);
    js = json_dumps(phi, 0);
    ck_assert_int_eq(parse_config("cfg-phi35", js, &c), RIVER_EFORMAT);
    ck_assert_ptr_nonnull(strstr(river_err_detail(), "long_factor"));
    ck_assert_ptr_null(c.rope_short_factor); /* nothing left allocated */
    free(js);
    json_decref(phi);

    /* Features that would compute the wrong thing are refused. */
    const char *base = "{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":64,"
                       "\"intermediate_size\":128,\"num_attention_heads\":4,"
                       "\"num_hidden_layers\":1,\"vocab_size\":32";
    const struct {
        const char *extra;
        int code;
        const char *needle;
    } bad[] = {
        {",\"hidden_act\":\"gelu\"}", RIVER_EUNSUPPORTED, "gelu"},
        {",\"attention_bias\":true}", RIVER_EUNSUPPORTED, "attention_bias"},
        {",\"rope_scaling\":{\"type\":\"dynamic\",\"factor\":2}}", RIVER_EUNSUPPORTED, "dynamic"},
        {",\"rope_scaling\":{\"rope_type\":\"llama3\",\"factor\":8}}", RIVER_EFORMAT,
         "low_freq_factor"},
        {",\"eos_token_id\":[1,2,3,4,5]}", RIVER_EUNSUPPORTED, "eos_token_id"},
        {",\"eos_token_id\":99}", RIVER_ECONFIG, "eos id 99"},
        {",\"hidden_size\":\"64\"}", RIVER_EFORMAT, "hidden_size"},
        {",\"head_dim\":0}", RIVER_ECONFIG, "head_dim"},
        {",\"partial_rotary_factor\":1.5}", RIVER_ECONFIG, "partial_rotary_factor"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char buf[1024];
        snprintf(buf, sizeof buf, "%s%s", base, bad[i].extra);
        err = parse_config("cfg-bad", buf, &c);
        ck_assert_msg(err == bad[i].code, "%s: got %s (%s)", bad[i].extra, river_err_name(err),
                      river_err_detail());
        ck_assert_msg(strstr(river_err_detail(), bad[i].needle) &&
                          strstr(river_err_detail(), "cfg-bad/config.json"),
                      "%s: detail '%s'", bad[i].extra, river_err_detail());
    }
    char buf[1024];
    snprintf(buf, sizeof buf, "%s,\"rope_scaling\":{\"rope_type\":\"linear\",\"factor\":4}}",
             base);
    ck_assert_int_eq(parse_config("cfg-bad", buf, &c), 0);
    ck_assert_int_eq(c.rope_scaling, ROPE_SCALING_LINEAR);
    ck_assert_float_eq(c.rope_factor, 4.0f);
    ck_assert_int_eq(c.head_dim, 16);
    ck_assert_int_eq(c.n_kv_heads, 4);
    ck_assert_float_eq(c.rope_theta, 10000.0f);
    ck_assert_int_eq(c.bos_id, -1);
    ck_assert_int_eq(c.n_eos, 0);
    hfconfig_free(&c);
}
END_TEST

START_TEST(test_err_config)
{
    char cfg[4096];
    const char *d = hf_copy("arch", NULL, 0);
    snprintf(cfg, sizeof cfg, "{\"architectures\": [\"GPT2LMHeadModel\"], \"hidden_size\": 128}");
    write_file(d, "config.json", cfg, strlen(cfg));
    expect_err(d, RIVER_EARCH, "arch/config.json", "GPT2LMHeadModel");

    snprintf(cfg, sizeof cfg, "{\"architectures\": [\"LlamaForCausalLM\", ");
    write_file(d, "config.json", cfg, strlen(cfg));
    expect_err(d, RIVER_EFORMAT, "arch/config.json", NULL);
    char p[600];
    snprintf(p, sizeof p, "%s/config.json", d);
    expect_err(p, RIVER_EFORMAT, "arch/config.json", NULL); /* named directly, too */

    snprintf(cfg, sizeof cfg,
             "{\"model_type\": \"llama\", \"num_hidden_layers\": 2, \"num_attention_heads\": 8,"
             " \"intermediate_size\": 384, \"vocab_size\": 2048}");
    write_file(d, "config.json", cfg, strlen(cfg));
    expect_err(d, RIVER_EFORMAT, "arch/config.json", "hidden_size");

    snprintf(cfg, sizeof cfg,
             "{\"model_type\": \"llama\", \"hidden_size\": 128, \"num_hidden_layers\": 2, "
             "\"num_attention_heads\": 8, \"num_key_value_heads\": 3, "
             "\"intermediate_size\": 384, \"vocab_size\": 2048}");
    write_file(d, "config.json", cfg, strlen(cfg));
    expect_err(d, RIVER_ECONFIG, "arch/config.json", "key/value heads");

    /* Untied: both tables must exist; this checkpoint only has lm_head.weight. */
    snprintf(cfg, sizeof cfg,
             "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 128, "
             "\"num_hidden_layers\": 2, \"num_attention_heads\": 8, "
             "\"num_key_value_heads\": 4, \"intermediate_size\": 384, \"vocab_size\": 2048, "
             "\"tie_word_embeddings\": false, \"eos_token_id\": [2, 5]}");
    write_file(d, "config.json", cfg, strlen(cfg));
    expect_err(d, RIVER_ENOTFOUND, "arch/model.safetensors", "model.embed_tokens.weight");

    /* bos comes from generation_config.json when config.json has none. */
    const char *gen = "{\"bos_token_id\": 7, \"eos_token_id\": 9}";
    write_file(d, "generation_config.json", gen, strlen(gen));
    json_t *j = json_loads(cfg, 0, NULL);
    json_object_set_new(j, "tie_word_embeddings", json_true());
    json_object_set_new(j, "sliding_window", json_integer(100));
    json_dump_file(j, p, 0);
    json_decref(j);
    model_t *m = load_ok(d);
    ck_assert_int_eq(m->cfg.bos_id, 7);
    ck_assert_int_eq(m->cfg.n_eos, 2); /* config.json's own eos list wins */
    ck_assert_int_eq(m->cfg.eos_ids[1], 5);
    ck_assert_float_eq(m->cfg.norm_eps, 1e-6f); /* transformers' default */
    ck_assert_int_eq(m->cfg.max_seq_len, 100);   /* 2048 by default, capped at the window */
    model_destroy(&m);

    expect_err(TEST_DATA "/no-such-model", RIVER_ENOTFOUND, "no-such-model", NULL);
    expect_err(tmp_dir("empty"), RIVER_ENOTFOUND, "empty", "config.json");
}
END_TEST

START_TEST(test_err_shards)
{
    const char *src = synth_dir("stories260K", DTYPE_F16, 5, 64 * 1024);
    char dir[512], p[600];
    snprintf(dir, sizeof dir, "%s", src);
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    json_t *idx = json_load_file(p, 0, NULL);
    ck_assert_ptr_nonnull(idx);
    json_t *wm = json_object_get(idx, "weight_map");

    json_object_set_new(wm, "model.norm.weight", json_string("model-99999-of-99999.safetensors"));
    json_dump_file(idx, p, 0);
    expect_err(dir, RIVER_ENOTFOUND, "model-99999-of-99999.safetensors", NULL);

    json_object_set_new(wm, "model.norm.weight", json_string("../x.safetensors"));
    json_dump_file(idx, p, 0);
    expect_err(dir, RIVER_EFORMAT, "model.safetensors.index.json", "../x.safetensors");

    /* A tensor the index does not list is missing, and the message names the index. */
    json_object_del(wm, "model.norm.weight");
    json_dump_file(idx, p, 0);
    expect_err(dir, RIVER_ENOTFOUND, "model.safetensors.index.json", "model.norm.weight");
    json_decref(idx);
}
END_TEST

START_TEST(test_err_llama2c)
{
    size_t len;
    unsigned char *f = (unsigned char *)file_bytes(S260K, &len);
    const char *dir = tmp_dir("l2c");
    char p[600];
    snprintf(p, sizeof p, "%s/bad.bin", dir);

    write_file(dir, "bad.bin", f, len - 100);
    expect_err(p, RIVER_ETRUNC, "l2c/bad.bin", "1056540");
    write_file(dir, "bad.bin", f, 20);
    expect_err(p, RIVER_ETRUNC, "l2c/bad.bin", "28-byte");

    unsigned char *g = malloc(len + 4);
    memcpy(g, f, len);
    memset(g + len, 0, 4);
    write_file(dir, "bad.bin", g, len + 4);
    expect_err(p, RIVER_EFORMAT, "l2c/bad.bin", "trailing");
    free(g);

    int32_t v = -5; /* n_layers */
    memcpy(f + 8, &v, 4);
    write_file(dir, "bad.bin", f, len);
    expect_err(p, RIVER_EFORMAT, "l2c/bad.bin", "n_layers");
    v = 5;
    memcpy(f + 8, &v, 4);
    v = 0; /* dim */
    memcpy(f, &v, 4);
    write_file(dir, "bad.bin", f, len);
    expect_err(p, RIVER_EFORMAT, "l2c/bad.bin", "dim");
    v = 64;
    memcpy(f, &v, 4);
    v = 3; /* n_kv_heads that does not divide 8 heads */
    memcpy(f + 16, &v, 4);
    write_file(dir, "bad.bin", f, len);
    expect_err(p, RIVER_EFORMAT, "l2c/bad.bin", "kv heads");
    v = 4;
    memcpy(f + 16, &v, 4);

    /* The intact copy loads, and a sidecar bad.json supplies eps. */
    write_file(dir, "bad.bin", f, len);
    write_file(dir, "bad.json", "{\"rms_norm_eps\": 1e-6}", 22);
    model_t *m = load_ok(p);
    ck_assert_float_eq(m->cfg.norm_eps, 1e-6f);
    model_destroy(&m);
    write_file(dir, "bad.json", "{\"rms_norm_eps\": ", 17);
    expect_err(p, RIVER_EFORMAT, "l2c/bad.json", NULL);

    /* Negative vocab_size: an untied classifier follows freq_cis. */
    v = -512;
    memcpy(f + 20, &v, 4);
    g = malloc(len + 512 * 64 * 4);
    memcpy(g, f, len);
    for (int i = 0; i < 512 * 64; i++) {
        float x = (float)i;
        memcpy(g + len + 4 * (size_t)i, &x, 4);
    }
    write_file(dir, "untied.bin", g, len + 512 * 64 * 4);
    snprintf(p, sizeof p, "%s/untied.bin", dir);
    m = load_ok(p);
    ck_assert_int_eq(m->cfg.tied_embeddings, 0);
    ck_assert_int_eq(m->cfg.vocab_size, 512);
    ck_assert_float_eq(((const float *)m->lm_head.data)[100], 100.0f);
    ck_assert_int_eq(model_param_count(m), 260032 + 512 * 64);
    model_destroy(&m);
    write_file(dir, "untied.bin", g, len);
    expect_err(p, RIVER_ETRUNC, "l2c/untied.bin", NULL);
    free(g);
    free(f);
}
END_TEST

/* Each test's scratch files (several MB of copies and synthetic checkpoints) go once it
 * passes; a failing test leaves them for inspection. */
static int rm_entry(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    return remove(p);
}

static void scratch_setup(void)
{
    mkdir(test_tmpdir(), 0700); /* again, after a previous teardown in no-fork mode */
}

static void scratch_teardown(void)
{
    nftw(test_tmpdir(), rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

static Suite *loader_suite(void)
{
    Suite *s = suite_create("loader");
    TCase *tc = tcase_create("real");
    tcase_add_test(tc, test_stories260k);
    tcase_add_test(tc, test_tinystories_hf);
    tcase_add_test(tc, test_tinystories_llama2c);
    tcase_add_test(tc, test_kjv);
    tcase_add_test(tc, test_half);
    tcase_add_test(tc, test_dtype);
    tcase_add_checked_fixture(tc, scratch_setup, scratch_teardown);
    suite_add_tcase(s, tc);

    tc = tcase_create("synth");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, test_synth_roundtrip, 0,
                        (int)(sizeof tiny_shapes / sizeof tiny_shapes[0]) * 3);
    tcase_add_test(tc, test_synth_deterministic);
    tcase_add_test(tc, test_synth_sharded);
    tcase_add_checked_fixture(tc, scratch_setup, scratch_teardown);
    suite_add_tcase(s, tc);

    tc = tcase_create("errors");
    tcase_add_test(tc, test_err_safetensors);
    tcase_add_test(tc, test_hfconfig_real);
    tcase_add_test(tc, test_err_config);
    tcase_add_test(tc, test_err_shards);
    tcase_add_test(tc, test_err_llama2c);
    tcase_add_checked_fixture(tc, scratch_setup, scratch_teardown);
    suite_add_tcase(s, tc);
    return s;
}

RIVER_TEST_MAIN(loader_suite)
