/* Quantized backbones (offline/backbone_quant.h, docs/FORMATS.md): q8 and q4 checkpoints of
 * the bundled models load as Q8/Q4 weights close to their source; bad companions are
 * errors naming the tensor; q8 greedy ids follow the source's wherever its top-2 margin is
 * clear; a river built on a quantized backbone quantizes the dequantized weights; the bytes
 * model sees that a river of the backbone's own bits saves only through its head; exit rules
 * and offloading run on a quantized backbone. Lossless mode, the prefix cache and the split
 * pair run on these checkpoints in their own suites (test_spec, test_prefix_cache,
 * test_split). */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/err.h"
#include "engine/exit_setup.h"
#include "engine/exitriver.h"
#include "engine/forward.h"
#include "engine/kv_pool.h"
#include "engine/offload.h"
#include "engine/sampler.h"
#include "engine/spec_cost.h"
#include "kernels/cpu/cpu.h"
#include "model/fingerprint.h"
#include "model/safetensors.h"
#include "offline/backbone_quant.h"
#include "offline/exitriver_build.h"
#include "offline/quant.h"
#include "tests/testutil.h"

#define KJV TEST_DATA "/kjv-12l"
#define TINY TEST_DATA "/tinystories-656k"

static const struct {
    const char *src;
    const char *fmt;
    double max_rel_fro; /* of every matrix against its source */
} ckpts[] = {
    {KJV, "q8", 0.01}, {KJV, "q4", 0.12}, {TINY, "q8", 0.01}, {TINY, "q4", 0.12},
};

/* ||A - B||_F / ||A||_F of two weights read through quant_row_f32. */
static double rel_fro(const weight_t *a, const weight_t *b)
{
    ck_assert_int_eq(a->rows, b->rows);
    ck_assert_int_eq(a->cols, b->cols);
    float *x = malloc(sizeof *x * (size_t)a->cols), *y = malloc(sizeof *y * (size_t)a->cols);
    double se = 0, sr = 0;
    for (int64_t r = 0; r < a->rows; r++) {
        ck_assert_int_eq(quant_row_f32(a, r, x), 0);
        ck_assert_int_eq(quant_row_f32(b, r, y), 0);
        for (int64_t c = 0; c < a->cols; c++) {
            se += ((double)x[c] - y[c]) * ((double)x[c] - y[c]);
            sr += (double)x[c] * x[c];
        }
    }
    free(x);
    free(y);
    return sr > 0 ? sqrt(se / sr) : 0;
}

/* Each checkpoint loads with Q8 (group 32, zero 128) or Q4 (group 64) matrices and head, a
 * tied embedding that is the head itself, norms as in the source, every matrix close to the
 * source's, fewer bytes a token, another fingerprint, and the quantization section in its
 * config.json. */
START_TEST(test_checkpoint_loads)
{
    const char *dir = test_quant_backbone(ckpts[_i].src, ckpts[_i].fmt);
    int q8 = !strcmp(ckpts[_i].fmt, "q8");
    model_t *src, *m;
    ck_assert_msg(model_load(&src, ckpts[_i].src) == 0, "%s", river_err_detail());
    ck_assert_msg(model_load(&m, dir) == 0, "%s", river_err_detail());
    ck_assert_int_eq(m->cfg.n_layers, src->cfg.n_layers);
    ck_assert_int_eq(m->cfg.dtype, q8 ? DTYPE_Q8 : DTYPE_Q4);
    ck_assert_int_eq(m->cfg.tied_embeddings, src->cfg.tied_embeddings);
    /* The head is 8-bit symmetric in blocks of 32 for both formats. */
    ck_assert_int_eq(m->lm_head.dtype, DTYPE_Q8);
    ck_assert_int_eq(m->lm_head.group, 32);
    ck_assert_uint_eq(m->lm_head.zeros[0], 0x5800); /* fp16 128.0 */
    if (src->cfg.tied_embeddings)
        ck_assert_ptr_eq(m->lm_head.data, m->embed.data);
    ck_assert(rel_fro(&src->lm_head, &m->lm_head) < 0.01);
    for (int l = 0; l < m->cfg.n_layers; l++) {
        for (int i = 0; i < EXITRIVER_N_MATRICES; i++) {
            const weight_t *a = exitriver_matrix(&src->layers[l], i);
            const weight_t *b = exitriver_matrix(&m->layers[l], i);
            ck_assert_int_eq(b->dtype, q8 ? DTYPE_Q8 : DTYPE_Q4);
            int want_group = q8 ? 32 : backbone_quant_group_fit(src, 4, 8, 64);
            ck_assert_int_eq(b->group, want_group);
            if (q8)
                for (int64_t g = 0; g < b->rows * (b->cols / b->group); g += 97)
                    ck_assert_uint_eq(b->zeros[g], 0x5800);
            double e = rel_fro(a, b);
            ck_assert_msg(e < ckpts[_i].max_rel_fro && e > 0, "layer %d %s: rel-fro %g", l,
                          exitriver_matrix_name(i), e);
        }
        ck_assert_int_eq(m->layers[l].attn_norm.dtype, DTYPE_F32);
        ck_assert(!memcmp(m->layers[l].attn_norm.data, src->layers[l].attn_norm.data,
                          sizeof(float) * (size_t)m->cfg.dim));
    }
    /* Bytes a token: codes plus scales and zeros, counted by hand for one matrix. */
    const weight_t *wq = &m->layers[0].wq;
    int64_t want = wq->rows * (int64_t)dtype_row_bytes(wq->dtype, wq->cols) +
                   wq->rows * (wq->cols / wq->group) * 4;
    ck_assert_int_eq(model_weight_bytes(wq, wq->rows), want);
    ck_assert_int_lt(model_bytes_per_token(m), model_bytes_per_token(src) / (q8 ? 3 : 5));
    char fa[MODEL_FINGERPRINT_LEN], fb[MODEL_FINGERPRINT_LEN];
    ck_assert_int_eq(model_fingerprint(src, fa), 0);
    ck_assert_int_eq(model_fingerprint(m, fb), 0);
    ck_assert_str_ne(fa, fb);
    char path[600];
    snprintf(path, sizeof path, "%s/config.json", dir);
    json_t *j = json_load_file(path, 0, NULL);
    ck_assert_ptr_nonnull(j);
    json_t *q = json_object_get(j, "river_quantization");
    ck_assert_str_eq(json_string_value(json_object_get(q, "format")), ckpts[_i].fmt);
    ck_assert_int_eq(json_integer_value(json_object_get(q, "bits")), q8 ? 8 : 4);
    json_decref(j);
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    struct stat st;
    ck_assert_int_eq(stat(path, &st), 0);
    model_destroy(&m);
    model_destroy(&src);
}
END_TEST

/* A copy of the q8 checkpoint of kjv-12l in dir, with tensor `drop` left out and tensor
 * `reshape` (F16) given one column less. */
static void write_broken(const char *dir, const char *drop, const char *reshape)
{
    const char *good = test_quant_backbone(KJV, "q8");
    char path[600];
    mkdir(dir, 0755);
    snprintf(path, sizeof path, "%s/config.json", good);
    size_t len;
    void *cfg = test_read_file(path, &len);
    ck_assert_ptr_nonnull(cfg);
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite(cfg, 1, len, f), len);
    fclose(f);
    free(cfg);
    safetensors_t *in;
    snprintf(path, sizeof path, "%s/model.safetensors", good);
    ck_assert_int_eq(safetensors_open(&in, path), 0);
    safetensors_writer_t *w;
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    ck_assert_int_eq(safetensors_writer_new(&w, path), 0);
    size_t n = safetensors_count(in);
    for (size_t i = 0; i < n; i++) {
        const safetensors_tensor_t *t = safetensors_tensor_at(in, i);
        if (drop && !strcmp(t->name, drop))
            continue;
        int64_t shape[SAFETENSORS_MAX_DIMS];
        memcpy(shape, t->shape, sizeof shape);
        if (reshape && !strcmp(t->name, reshape))
            shape[1]--;
        ck_assert_int_eq(safetensors_writer_add(w, t->name, t->dtype, t->n_dims, shape), 0);
    }
    ck_assert_int_eq(safetensors_writer_begin(w), 0);
    for (size_t i = 0; i < n; i++) {
        const safetensors_tensor_t *t = safetensors_tensor_at(in, i);
        if (drop && !strcmp(t->name, drop))
            continue;
        size_t nb = t->nbytes;
        if (reshape && !strcmp(t->name, reshape))
            nb = nb / (size_t)t->shape[1] * (size_t)(t->shape[1] - 1);
        ck_assert_int_eq(safetensors_writer_write(w, t->data, nb), 0);
    }
    ck_assert_int_eq(safetensors_writer_finish(w), 0);
    safetensors_writer_destroy(&w);
    safetensors_destroy(&in);
}

/* Missing or mis-shaped companions fail to load with an error naming the tensor. */
START_TEST(test_bad_companions)
{
    static const struct {
        const char *drop, *reshape;
        int err;
        const char *names;
    } cases[] = {
        {"model.layers.3.mlp.up_proj.weight.qscales", NULL, RIVER_ENOTFOUND,
         "'model.layers.3.mlp.up_proj.weight'"},
        {"model.layers.0.self_attn.k_proj.weight.qzeros", NULL, RIVER_ENOTFOUND,
         "model.layers.0.self_attn.k_proj.weight.qzeros"},
        {NULL, "model.layers.5.self_attn.o_proj.weight.qscales", RIVER_ESHAPE,
         "model.layers.5.self_attn.o_proj.weight.qscales"},
        {NULL, "model.layers.2.mlp.down_proj.weight.qzeros", RIVER_ESHAPE,
         "model.layers.2.mlp.down_proj.weight.qzeros"},
        {NULL, "model.embed_tokens.weight.qscales", RIVER_ESHAPE,
         "model.embed_tokens.weight.qscales"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char dir[600];
        snprintf(dir, sizeof dir, "%s/broken-%zu", test_tmpdir(), i);
        write_broken(dir, cases[i].drop, cases[i].reshape);
        model_t *m = NULL;
        int e = model_load(&m, dir);
        ck_assert_msg(e == cases[i].err, "case %zu: %d (%s)", i, e, river_err_detail());
        ck_assert_msg(strstr(river_err_detail(), cases[i].names), "case %zu: %s", i,
                      river_err_detail());
        ck_assert_ptr_null(m);
    }
    /* The same copy with nothing broken loads: the failures above are the edits'. */
    char dir[600];
    snprintf(dir, sizeof dir, "%s/unbroken", test_tmpdir());
    write_broken(dir, NULL, NULL);
    model_t *m = NULL;
    ck_assert_msg(model_load(&m, dir) == 0, "%s", river_err_detail());
    model_destroy(&m);
}
END_TEST

/* ---- teacher-forced logits ---- */

typedef struct lm {
    model_t *m;
    backend_t *be;
    forward_t *f;
    kv_pool_t *kv;
} lm_t;

static void lm_open(lm_t *x, const char *path)
{
    memset(x, 0, sizeof *x);
    ck_assert_msg(model_load(&x->m, path) == 0, "%s", river_err_detail());
    test_backend_open(&x->be, 1, CPU_SIMD_COUNT, x->m);
    const model_config_t *c = &x->m->cfg;
    ck_assert_int_eq(forward_new(&x->f, x->m, x->be, c->max_seq_len), 0);
    ck_assert_int_eq(kv_pool_new(&x->kv, x->be, c->n_layers, c->n_kv_heads * c->head_dim, DTYPE_F32,
                                 16,
                                 (c->max_seq_len + 15) / 16 + 1), 0);
}

static void lm_close(lm_t *x)
{
    kv_pool_destroy(&x->kv);
    forward_destroy(&x->f);
    backend_destroy(&x->be);
    model_destroy(&x->m);
}

/* Logits (n - first, vocab) of rows first..n-1 of ids run as one sequence. */
static void lm_logits(lm_t *x, const int32_t *ids, int n, int first, float *out)
{
    kv_seq_t seq;
    kv_seq_init(&seq);
    ck_assert_int_eq(kv_seq_reserve(&seq, x->kv, n), 0);
    int32_t *pos = malloc(sizeof *pos * (size_t)n), *rows = malloc(sizeof *rows * (size_t)n);
    const int32_t **tab = malloc(sizeof *tab * (size_t)n);
    for (int i = 0; i < n; i++) {
        pos[i] = i;
        rows[i] = first + i;
        tab[i] = seq.pages;
    }
    fwd_batch_t b = {.n = n, .tokens = ids, .pos = pos, .page_table = tab,
                     .n_logits = n - first, .logit_rows = rows};
    ck_assert_msg(forward_step(x->f, x->kv, &b, out) == 0, "%s", river_err_detail());
    kv_seq_free(&seq, x->kv);
    free(pos);
    free(rows);
    free(tab);
}

static int golden_prompt(const char *slug, int32_t *ids, int cap)
{
    char path[300];
    snprintf(path, sizeof path, "%s/golden/%s.json", KJV, slug);
    json_t *j = json_load_file(path, 0, NULL);
    ck_assert_ptr_nonnull(j);
    json_t *a = json_object_get(j, "prompt_ids");
    int n = 0;
    for (size_t i = 0; i < json_array_size(a) && n < cap; i++)
        ids[n++] = (int32_t)json_integer_value(json_array_get(a, i));
    json_decref(j);
    ck_assert_int_gt(n, 0);
    return n;
}

/* The logit margin (top-1 minus top-2, in logit units) above which the q8 backbone must
 * pick the source's token: q8's logits move by at most 0.053 on these prompts (printed), so
 * a margin of 0.15, about three times that, leaves room and still covers most positions. */
#define Q8_MARGIN 0.15f
#define GEN 96

/* kjv-12l: the source's greedy continuation of each golden prompt; the q8 (and q4)
 * backbone teacher-forced on it. Wherever the source's margin exceeds Q8_MARGIN the q8
 * argmax is the source's token; at least 75 % of positions have such a margin (84 % do). The q4
 * backbone agrees on at least 85 % of all positions. */
START_TEST(test_q8_follows_source)
{
    static const char *slugs[] = {"in_the_beginning", "and_the_lord_said_unto_moses",
                                  "blessed_are_the"};
    lm_t ref, q8, q4;
    lm_open(&ref, KJV);
    lm_open(&q8, test_quant_backbone(KJV, "q8"));
    lm_open(&q4, test_quant_backbone(KJV, "q4"));
    int V = ref.m->cfg.vocab_size;
    int compared = 0, total = 0, q4_match = 0;
    float max_delta = 0;
    for (size_t s = 0; s < sizeof slugs / sizeof slugs[0]; s++) {
        int32_t ids[64 + GEN];
        int np = golden_prompt(slugs[s], ids, 64);
        float *lg = malloc(sizeof *lg * (size_t)V * GEN);
        float *a = malloc(sizeof *a * (size_t)V * GEN), *b = malloc(sizeof *b * (size_t)V * GEN);
        /* Greedy on the source: each step reruns the sequence (tiny model, simple code). */
        for (int t = 0; t < GEN; t++) {
            lm_logits(&ref, ids, np + t, np + t - 1, lg);
            ids[np + t] = sampler_argmax(lg, V);
        }
        /* All positions at once: the logits after the prompt and after each generated id. */
        lm_logits(&ref, ids, np + GEN - 1, np - 1, lg);
        lm_logits(&q8, ids, np + GEN - 1, np - 1, a);
        lm_logits(&q4, ids, np + GEN - 1, np - 1, b);
        for (int t = 0; t < GEN; t++) {
            const float *r = lg + (size_t)t * V, *x = a + (size_t)t * V;
            int top = sampler_argmax(r, V);
            ck_assert_int_eq(top, ids[np + t]);
            float second = -INFINITY;
            for (int v = 0; v < V; v++) {
                if (v != top && r[v] > second)
                    second = r[v];
                float d = fabsf(r[v] - x[v]);
                max_delta = d > max_delta ? d : max_delta;
            }
            total++;
            q4_match += sampler_argmax(b + (size_t)t * V, V) == top;
            if (r[top] - second > Q8_MARGIN) {
                compared++;
                ck_assert_msg(sampler_argmax(x, V) == top, "%s token %d: q8 picks %d, source "
                              "%d with margin %.3f", slugs[s], t, sampler_argmax(x, V), top,
                              (double)(r[top] - second));
            }
        }
        free(lg);
        free(a);
        free(b);
    }
    printf("q8 vs source on kjv-12l: max |logit delta| %.4f, %d of %d positions with margin "
           "> %.2f, all matched; q4 matches %d of %d\n", (double)max_delta, compared, total,
           (double)Q8_MARGIN, q4_match, total);
    fflush(stdout);
    ck_assert_int_ge(compared * 100, total * 75);
    ck_assert_int_ge(q4_match * 100, total * 85);
    lm_close(&q4);
    lm_close(&q8);
    lm_close(&ref);
}
END_TEST

/* quant_weight reads a Q4 source as its dequantized values: quantizing the q4 backbone's
 * matrix gives the bytes that quantizing its float copy gives; and a 4-bit river built on
 * the q4 backbone loads against it and lies closer to it than to the float source. */
START_TEST(test_river_from_dequantized)
{
    model_t *m, *src;
    ck_assert_int_eq(model_load(&m, test_quant_backbone(KJV, "q4")), 0);
    ck_assert_int_eq(model_load(&src, KJV), 0);
    const weight_t *w = &m->layers[2].w_gate;
    ck_assert_int_eq(w->dtype, DTYPE_Q4);
    float *f = malloc(sizeof *f * (size_t)(w->rows * w->cols));
    for (int64_t r = 0; r < w->rows; r++)
        ck_assert_int_eq(quant_row_f32(w, r, f + r * w->cols), 0);
    weight_t wf = {.dtype = DTYPE_F32, .rows = w->rows, .cols = w->cols, .data = f};
    for (int bits = 4; bits <= 8; bits += 4) {
        quant_params_t p = quant_params_default();
        p.bits = bits;
        p.group = 32;
        quant_matrix_t *a, *b;
        quant_stats_t sa, sb;
        ck_assert_int_eq(quant_matrix_new(&a, w->rows, w->cols, bits, 32), 0);
        ck_assert_int_eq(quant_matrix_new(&b, w->rows, w->cols, bits, 32), 0);
        ck_assert_msg(quant_weight(a, w, &p, NULL, &sa) == 0, "%s", river_err_detail());
        ck_assert_int_eq(quant_weight(b, &wf, &p, NULL, &sb), 0);
        ck_assert(!memcmp(a->codes, b->codes, quant_matrix_code_bytes(a)));
        ck_assert(!memcmp(a->scales, b->scales, quant_matrix_group_count(a) * 2));
        ck_assert(!memcmp(a->zeros, b->zeros, quant_matrix_group_count(a) * 2));
        ck_assert(!memcmp(&sa, &sb, sizeof sa));
        quant_matrix_destroy(&a);
        quant_matrix_destroy(&b);
    }
    free(f);
    char path[600];
    snprintf(path, sizeof path, "%s/river-on-q4.safetensors", test_tmpdir());
    exitriver_build_opts_t o = exitriver_build_opts_default();
    o.n_threads = 1;
    ck_assert_msg(exitriver_build(m, path, &o, NULL) == 0, "%s", river_err_detail());
    exitriver_t *rv;
    ck_assert_msg(exitriver_load(&rv, m, path) == 0, "%s", river_err_detail());
    const weight_t *rw = &exitriver_layer(rv, 5)->w_down;
    double to_backbone = rel_fro(&m->layers[5].w_down, rw);
    double to_source = rel_fro(&src->layers[5].w_down, rw);
    ck_assert_msg(to_backbone < to_source / 10, "river vs q4 backbone %g, vs source %g",
                  to_backbone, to_source);
    exitriver_destroy(&rv);
    model_destroy(&src);
    model_destroy(&m);
}
END_TEST

static void river_for(const model_t *m, const char *name, int bits, int head_bits, char *path,
                      size_t cap)
{
    snprintf(path, cap, "%s/%s", test_tmpdir(), name);
    exitriver_build_opts_t o = exitriver_build_opts_default();
    o.quant.bits = bits;
    o.quant.method = QUANT_RTN;
    o.head_bits = head_bits;
    o.n_threads = 1;
    ck_assert_msg(exitriver_build(m, path, &o, NULL) == 0, "%s", river_err_detail());
}

/* The bytes model (spec_path_bytes): a 4-bit river over the q4 backbone (same group) reads
 * exactly the backbone's bytes when it shares the head, and saves exactly the difference of
 * the heads with a 4-bit head of its own; over the float source the same river's path is
 * far cheaper; the mean over a histogram weighs the paths. */
START_TEST(test_bytes_model)
{
    model_t *q4, *src;
    ck_assert_int_eq(model_load(&q4, test_quant_backbone(KJV, "q4")), 0);
    ck_assert_int_eq(model_load(&src, KJV), 0);
    int L = q4->cfg.n_layers;
    char p0[600], p4[600], ps[600];
    river_for(q4, "bytes-h0.safetensors", 4, 0, p0, sizeof p0);
    river_for(q4, "bytes-h4.safetensors", 4, 4, p4, sizeof p4);
    river_for(src, "bytes-src.safetensors", 4, 4, ps, sizeof ps);
    exit_policy_t pol = {.rule = EXIT_RULE_FIXED, .exit_layer = 4, .agg = EXIT_AGG_MIN,
                         .kv = EXIT_KV_RIVER};
    exit_setup_t x0, x4, xs;
    ck_assert_msg(exit_setup_open(&x0, &pol, p0, NULL, q4) == 0, "%s", river_err_detail());
    ck_assert_int_eq(exit_setup_open(&x4, &pol, p4, NULL, q4), 0);
    ck_assert_int_eq(exit_setup_open(&xs, &pol, ps, NULL, src), 0);
    spec_bytes_t plain, b0, b4, bsrc, psrc;
    spec_path_bytes(q4, NULL, L, 0, DTYPE_F32, &plain);
    ck_assert(plain.total == (double)model_bytes_per_token(q4));
    ck_assert(plain.river_layers == 0);
    spec_path_bytes(q4, &x0.cfg, 4, 0, DTYPE_F32, &b0);
    spec_path_bytes(q4, &x4.cfg, 4, 0, DTYPE_F32, &b4);
    ck_assert(b0.river_layers > 0);
    ck_assert(b0.total == plain.total);
    double head8 = (double)model_weight_bytes(&q4->lm_head, q4->lm_head.rows);
    const weight_t *rh = exitriver_head(x4.river);
    ck_assert_ptr_nonnull(rh);
    double head4 = (double)model_weight_bytes(rh, rh->rows);
    ck_assert(head4 < head8);
    ck_assert(b4.total == plain.total - head8 + head4);
    spec_path_bytes(src, NULL, L, 0, DTYPE_F32, &psrc);
    spec_path_bytes(src, &xs.cfg, 4, 0, DTYPE_F32, &bsrc);
    ck_assert(bsrc.total < psrc.total / 2);
    /* Half the tokens plain, half exiting at 4. */
    int64_t hist[13] = {0};
    hist[4] = 10;
    hist[L] = 10;
    spec_bytes_t mean;
    spec_path_bytes_mean(src, &xs.cfg, hist, 0, DTYPE_F32, &mean);
    ck_assert(fabs(mean.total - (psrc.total + bsrc.total) / 2) < 1e-6 * psrc.total);
    exit_setup_close(&xs);
    exit_setup_close(&x4);
    exit_setup_close(&x0);
    model_destroy(&src);
    model_destroy(&q4);
}
END_TEST

/* Exit rules on a quantized backbone with a river built on it: the fixed rule leaves every
 * decode row at its layer; cosine runs and exits some tokens early; the logits are finite. */
START_TEST(test_exit_rules_run)
{
    const char *dir = test_quant_backbone(KJV, _i ? "q4" : "q8");
    /* The river is built from the checkpoint as loaded, before placement repacks it. */
    model_t *um;
    ck_assert_int_eq(model_load(&um, dir), 0);
    char path[600];
    river_for(um, _i ? "rules-q4.safetensors" : "rules-q8.safetensors", 4, 8, path,
              sizeof path);
    model_destroy(&um);
    lm_t x;
    lm_open(&x, dir);
    int V = x.m->cfg.vocab_size, L = x.m->cfg.n_layers;
    static const exit_policy_t pols[] = {
        {.rule = EXIT_RULE_FIXED, .exit_layer = 4, .agg = EXIT_AGG_ROW, .kv = EXIT_KV_RIVER},
        {.rule = EXIT_RULE_COSINE, .tau = 0.9f, .agg = EXIT_AGG_ROW, .kv = EXIT_KV_RIVER},
    };
    for (size_t k = 0; k < 2; k++) {
        exit_setup_t xs;
        ck_assert_msg(exit_setup_open(&xs, &pols[k], path, NULL, x.m) == 0, "%s",
                      river_err_detail());
        ck_assert_int_eq(forward_set_exit(x.f, &xs.cfg), 0);
        int32_t ids[64];
        int n = golden_prompt("in_the_beginning", ids, 32);
        kv_seq_t seq;
        kv_seq_init(&seq);
        ck_assert_int_eq(kv_seq_reserve(&seq, x.kv, n + 40), 0);
        float *lg = malloc(sizeof *lg * (size_t)V);
        int early = 0;
        for (int t = 0; t < n + 40 - 1; t++) {
            int32_t tok = t < n ? ids[t] : sampler_argmax(lg, V), p = t, row = 0, dep = -1;
            const int32_t *tab = seq.pages;
            exit_seq_t es;
            exit_seq_init(&es);
            exit_seq_t *esp = &es;
            int32_t grp = 0;
            fwd_batch_t b = {.n = 1, .tokens = &tok, .pos = &p, .page_table = &tab,
                             .n_logits = 1, .logit_rows = &row, .group = &grp,
                             .exit_seq = &esp, .depth = &dep};
            ck_assert_msg(forward_step(x.f, x.kv, &b, lg) == 0, "%s", river_err_detail());
            exit_seq_free(&es);
            for (int v = 0; v < V; v += 31)
                ck_assert(isfinite(lg[v]));
            if (k == 0)
                ck_assert_int_eq(dep, 4);
            early += dep < L;
        }
        ck_assert_int_gt(early, 0);
        free(lg);
        kv_seq_free(&seq, x.kv);
        forward_set_exit(x.f, NULL);
        exit_setup_close(&xs);
    }
    lm_close(&x);
}
END_TEST

/* Offloading a quantized backbone: kept mapped (4-bit codes stay in the file's layout), its
 * deep layers are released once tokens stop reaching them, and the teacher-forced logits
 * afterwards are the same floats as before (the pages come back from the file). */
START_TEST(test_offload_quantized)
{
    model_t *m;
    ck_assert_int_eq(model_load(&m, test_quant_backbone(KJV, _i ? "q4" : "q8")), 0);
    backend_t *be;
    ck_assert_int_eq(backend_open(&be, "cpu", 1, BACKEND_WEIGHTS_MAPPED), 0);
    ck_assert_int_eq(model_place(m, be), 0);
    ck_assert_int_eq(m->layers[3].wq.dtype, _i ? DTYPE_Q4 : DTYPE_Q8);
    lm_t x = {.m = m, .be = be};
    const model_config_t *c = &m->cfg;
    ck_assert_int_eq(forward_new(&x.f, m, be, 64), 0);
    ck_assert_int_eq(kv_pool_new(&x.kv, be, c->n_layers, c->n_kv_heads * c->head_dim, DTYPE_F32,
                                 16, 8), 0);
    int32_t ids[64];
    int n = golden_prompt("blessed_are_the", ids, 64);
    int V = c->vocab_size;
    float *a = malloc(sizeof *a * (size_t)V * (size_t)n), *b = malloc(sizeof *b * (size_t)V * (size_t)n);
    lm_logits(&x, ids, n, 0, a);
    offload_t *off;
    ck_assert_msg(offload_new(&off, m, 0.5, 8) == 0, "%s", river_err_detail());
    for (int t = 0; t < 16; t++)
        offload_record(off, 4);
    int evicted = 0;
    ck_assert_int_eq(offload_update(off, &evicted), 0);
    ck_assert_int_eq(evicted, c->n_layers - 4);
    ck_assert_int_gt(offload_evicted_bytes(off), 0);
    lm_logits(&x, ids, n, 0, b);
    ck_assert(!memcmp(a, b, sizeof *a * (size_t)V * (size_t)n));
    offload_destroy(&off);
    free(a);
    free(b);
    lm_close(&x);
}
END_TEST

/* The writer refuses what it cannot do, naming it: a llama2.c source, the source's own
 * directory as output, a group that does not divide the matrices. */
START_TEST(test_writer_refuses)
{
    model_t *m;
    backbone_quant_opts_t o;
    ck_assert_int_eq(model_load(&m, TEST_DATA "/stories260K/stories260K.bin"), 0);
    ck_assert_int_eq(backbone_quant_opts_for("q8", m, &o), 0);
    char dir[600];
    snprintf(dir, sizeof dir, "%s/refused", test_tmpdir());
    ck_assert_int_eq(backbone_quant_build(m, dir, &o, NULL, NULL), RIVER_EUNSUPPORTED);
    ck_assert(strstr(river_err_detail(), "llama2.c"));
    model_destroy(&m);
    ck_assert_int_eq(model_load(&m, KJV), 0);
    ck_assert_int_eq(backbone_quant_opts_for("q4", m, &o), 0);
    ck_assert_int_eq(o.quant.group, 64);
    ck_assert_int_eq(backbone_quant_opts_for("q5", m, &o), -1);
    ck_assert_int_eq(backbone_quant_opts_for("q8", m, &o), 0);
    ck_assert_int_eq(backbone_quant_build(m, KJV, &o, NULL, NULL), RIVER_EINVAL);
    o.quant.group = 40;
    ck_assert_int_eq(backbone_quant_build(m, dir, &o, NULL, NULL), RIVER_ESHAPE);
    ck_assert(strstr(river_err_detail(), "group size 40"));
    model_destroy(&m);
}
END_TEST

static Suite *qbackbone_suite(void)
{
    Suite *s = suite_create("qbackbone");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, test_checkpoint_loads, 0, (int)(sizeof ckpts / sizeof ckpts[0]));
    tcase_add_test(tc, test_bad_companions);
    tcase_add_test(tc, test_q8_follows_source);
    tcase_add_test(tc, test_river_from_dequantized);
    tcase_add_test(tc, test_bytes_model);
    tcase_add_loop_test(tc, test_exit_rules_run, 0, 2);
    tcase_add_loop_test(tc, test_offload_quantized, 0, 2);
    tcase_add_test(tc, test_writer_refuses);
    suite_add_tcase(s, tc);
    return s;
}

RIVER_TEST_MAIN(qbackbone_suite)
