/* Writing a quantized backbone checkpoint (backbone_quant.h): the tensor list from the
 * loaded model, then one streaming pass that quantizes each matrix and writes it. */
#include "offline/backbone_quant.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/err.h"
#include "common/file.h"
#include "kernels/backend.h"
#include "kernels/cpu/threadpool.h"
#include "model/safetensors.h"

/* What becomes of one tensor of the output. */
typedef enum {
    BQ_VECTOR = 0, /* a norm or bias: written as F32 */
    BQ_LAYER,      /* a decoder matrix: quantized with the layers' parameters */
    BQ_HEAD,       /* the LM head or the embedding: quantized with the head's parameters */
    BQ_KEEP,       /* the head or embedding kept as it is (head_bits 0) */
} bq_kind_t;

typedef struct bq_tensor {
    char name[96];    /* the Hugging Face name the loader looks up */
    weight_t w;       /* the source (a fused Phi-3 matrix spans its views' rows) */
    bq_kind_t kind;
    int layer;        /* decoder layer, or n_layers for the head and embedding */
} bq_tensor_t;

typedef struct bq_list {
    bq_tensor_t *t;   /* (n) in the order written */
    int n, cap;
} bq_list_t;

static int bq_add(bq_list_t *l, const char *name, const weight_t *w, bq_kind_t kind, int layer)
{
    if (!w->data)
        return 0;
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 64;
        bq_tensor_t *t = realloc(l->t, sizeof *t * (size_t)cap);
        if (!t)
            return river_err_set(RIVER_ENOMEM, "backbone quant: tensor list");
        l->t = t;
        l->cap = cap;
    }
    bq_tensor_t *t = &l->t[l->n++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->w = *w;
    t->kind = kind;
    t->layer = layer;
    return 0;
}

/* A fused matrix (Phi-3) from its first view and the rows of all views: the views are
 * consecutive row ranges of one tensor, so the first one's data starts the whole. */
static weight_t bq_fused(const weight_t *first, int64_t rows)
{
    weight_t w = *first;
    w.rows = rows;
    return w;
}

/* Every output tensor: vectors first (their F32 sizes keep 4-byte alignment), then the
 * head, then the layers' matrices in order. */
static int bq_list_build(const model_t *m, const backbone_quant_opts_t *o, bq_list_t *l)
{
    const model_config_t *cfg = &m->cfg;
    char n[96];
    int err = 0;
#define LNAME(lay, suffix) (snprintf(n, sizeof n, "model.layers.%d.%s", lay, suffix), n)
    for (int i = 0; i < cfg->n_layers && !err; i++) {
        const layer_weights_t *L = &m->layers[i];
        const struct {
            const char *name;
            const weight_t *w;
        } vs[] = {{"input_layernorm.weight", &L->attn_norm},
                  {"post_attention_layernorm.weight", &L->ffn_norm},
                  {"self_attn.q_proj.bias", &L->bq},
                  {"self_attn.k_proj.bias", &L->bk},
                  {"self_attn.v_proj.bias", &L->bv},
                  {"self_attn.q_norm.weight", &L->q_norm},
                  {"self_attn.k_norm.weight", &L->k_norm}};
        for (size_t k = 0; k < sizeof vs / sizeof vs[0] && !err; k++)
            err = bq_add(l, LNAME(i, vs[k].name), vs[k].w, BQ_VECTOR, i);
    }
    if (err || (err = bq_add(l, "model.norm.weight", &m->final_norm, BQ_VECTOR, cfg->n_layers)))
        return err;
    bq_kind_t hk = o->head_bits ? BQ_HEAD : BQ_KEEP;
    /* A tied table is written once, under the embedding's name, which the loader tries
     * first. */
    if ((err = bq_add(l, "model.embed_tokens.weight", &m->embed, hk, cfg->n_layers)))
        return err;
    if (m->lm_head.data != m->embed.data &&
        (err = bq_add(l, "lm_head.weight", &m->lm_head, hk, cfg->n_layers)))
        return err;
    for (int i = 0; i < cfg->n_layers && !err; i++) {
        const layer_weights_t *L = &m->layers[i];
        if (cfg->arch == ARCH_PHI3) {
            weight_t qkv = bq_fused(&L->wq, L->wq.rows + L->wk.rows + L->wv.rows);
            weight_t gu = bq_fused(&L->w_gate, L->w_gate.rows + L->w_up.rows);
            if ((err = bq_add(l, LNAME(i, "self_attn.qkv_proj.weight"), &qkv, BQ_LAYER, i)) ||
                (err = bq_add(l, LNAME(i, "mlp.gate_up_proj.weight"), &gu, BQ_LAYER, i)))
                return err;
        } else {
            const struct {
                const char *name;
                const weight_t *w;
            } ms[] = {{"self_attn.q_proj.weight", &L->wq},
                      {"self_attn.k_proj.weight", &L->wk},
                      {"self_attn.v_proj.weight", &L->wv},
                      {"mlp.gate_proj.weight", &L->w_gate},
                      {"mlp.up_proj.weight", &L->w_up}};
            for (size_t k = 0; k < sizeof ms / sizeof ms[0] && !err; k++)
                err = bq_add(l, LNAME(i, ms[k].name), ms[k].w, BQ_LAYER, i);
        }
        if (err || (err = bq_add(l, LNAME(i, "self_attn.o_proj.weight"), &L->wo, BQ_LAYER, i)) ||
            (err = bq_add(l, LNAME(i, "mlp.down_proj.weight"), &L->w_down, BQ_LAYER, i)))
            return err;
    }
#undef LNAME
    return err;
}

/* ---- parameters ---- */

int backbone_quant_group_fit(const model_t *m, int bits, int head_bits, int most)
{
    int64_t common = head_bits ? m->lm_head.cols : 0;
    for (int l = 0; l < m->cfg.n_layers; l++) {
        const layer_weights_t *L = &m->layers[l];
        const weight_t *ws[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up,
                                &L->w_down};
        for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++) {
            int64_t a = ws[i]->cols, b = common;
            while (b) {
                int64_t t = a % b;
                a = b;
                b = t;
            }
            common = a;
        }
    }
    /* Multiples of 32 first: the AVX-512 integer kernels (and Q4X8) need them. */
    for (int g = most - most % 32; g >= 32; g -= 32)
        if (common % g == 0)
            return g;
    for (int g = most; g >= 1; g--)
        if (common % g == 0 && (bits != 4 || g % 2 == 0))
            return g;
    return 0;
}

int backbone_quant_opts_for(const char *format, const model_t *m, backbone_quant_opts_t *o)
{
    backbone_quant_opts_t d = {.quant = quant_params_default(), .head_bits = 8};
    if (!strcmp(format, "q8")) {
        d.quant.bits = 8;
        d.quant.method = QUANT_SYM;
        d.quant.group = 32;
    } else if (!strcmp(format, "q4")) {
        d.quant.bits = 4;
        d.quant.method = QUANT_HQQ;
        d.quant.group = 64;
    } else {
        return -1;
    }
    if (m) {
        int fit = backbone_quant_group_fit(m, d.quant.bits, d.head_bits, d.quant.group);
        if (fit > 0)
            d.quant.group = fit;
    }
    *o = d;
    return 0;
}

/* The head's parameters: 8 bits symmetric in blocks of 32 (Q8_0) where 32 divides its
 * columns, else in the layers' group; or the layers' own 4-bit ones (HQQ where the layers
 * are symmetric 8-bit). */
static quant_params_t bq_head_params(const model_t *m, const backbone_quant_opts_t *o)
{
    quant_params_t p = o->quant;
    p.bits = o->head_bits;
    if (p.bits == 8) {
        p.method = QUANT_SYM;
        if (m->lm_head.cols % 32 == 0)
            p.group = 32;
    } else if (p.method == QUANT_SYM) {
        p.method = QUANT_HQQ;
    }
    return p;
}

static int bq_check(const model_t *m, const backbone_quant_opts_t *o, const bq_list_t *l)
{
    if (m->is_llama2c)
        return river_err_set(RIVER_EUNSUPPORTED, "%s: backbone quantization reads Hugging "
                             "Face checkpoints (config.json + safetensors), not llama2.c "
                             "files", m->path);
    if (m->backend && !backend_is_host(m->backend))
        return river_err_set(RIVER_EUNSUPPORTED, "%s: quantize the model before placing it on "
                             "a device backend (river quant runs on the host)", m->path);
    if (o->n_threads < 0 || o->n_threads > 1024)
        return river_err_set(RIVER_EINVAL, "backbone quant: %d threads", o->n_threads);
    if (o->head_bits != 0 && o->head_bits != 4 && o->head_bits != 8)
        return river_err_set(RIVER_EINVAL, "backbone quant: LM head bits %d; 0, 4 or 8",
                             o->head_bits);
    int err = quant_params_check(&o->quant, 0, m->path);
    if (err)
        return err;
    quant_params_t hp = bq_head_params(m, o);
    int suggest = backbone_quant_group_fit(m, o->quant.bits, o->head_bits, 128);
    for (int i = 0; i < l->n; i++) {
        const bq_tensor_t *t = &l->t[i];
        if (t->kind != BQ_LAYER && t->kind != BQ_HEAD)
            continue;
        const quant_params_t *p = t->kind == BQ_LAYER ? &o->quant : &hp;
        if (t->w.dtype == DTYPE_Q4X8)
            return river_err_set(RIVER_EDTYPE, "%s: '%s' is the CPU backend's repacked layout; "
                                 "quantize the checkpoint as loaded", m->path, t->name);
        if (t->w.cols % p->group != 0)
            return river_err_set(RIVER_ESHAPE, "%s: '%s' has %lld columns, not a multiple of "
                                 "the group size %d; the largest group up to 128 that divides "
                                 "every matrix is %d", m->path, t->name, (long long)t->w.cols,
                                 p->group, suggest);
    }
    return 0;
}

/* ---- the directory ---- */

static char *bq_join(const char *dir, const char *name)
{
    size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + b + 2);
    if (p)
        snprintf(p, a + b + 2, "%s/%s", dir, name);
    return p;
}

/* Copies dir_from/name to dir_to/name when it exists. */
static int bq_copy_file(const char *from_dir, const char *to_dir, const char *name)
{
    char *src = bq_join(from_dir, name), *dst = bq_join(to_dir, name);
    int err = 0;
    char *data = NULL;
    size_t len = 0;
    struct stat st;
    if (!src || !dst) {
        err = river_err_set(RIVER_ENOMEM, "%s: path", name);
        goto out;
    }
    if (stat(src, &st) != 0 || !S_ISREG(st.st_mode))
        goto out;
    if ((err = river_read_file(src, &data, &len)))
        goto out;
    FILE *f = fopen(dst, "wb");
    if (!f) {
        err = river_err_set(RIVER_EIO, "%s: %s", dst, strerror(errno));
        goto out;
    }
    size_t wrote = fwrite(data, 1, len, f);
    if (fclose(f) != 0 || wrote != len)
        err = river_err_set(RIVER_EIO, "%s: write failed", dst);
out:
    free(data);
    free(src);
    free(dst);
    return err;
}

/* config.json: the source's, with the "river_quantization" object that says what was done
 * (for people and tools; the loader reads each tensor's bits and group from its shapes). */
static int bq_write_config(const model_t *m, const char *dir, const backbone_quant_opts_t *o)
{
    char *src = bq_join(m->dir, "config.json"), *dst = bq_join(dir, "config.json");
    int err = 0;
    if (!src || !dst) {
        err = river_err_set(RIVER_ENOMEM, "config.json: path");
        goto out;
    }
    json_error_t jerr;
    json_t *cfg = json_load_file(src, 0, &jerr);
    if (!json_is_object(cfg)) {
        json_decref(cfg);
        err = river_err_set(RIVER_EFORMAT, "%s: %s (line %d)", src, jerr.text, jerr.line);
        goto out;
    }
    quant_params_t hp = bq_head_params(m, o);
    int tied = m->lm_head.data == m->embed.data;
    json_t *q = json_pack(
        "{s:s, s:s, s:i, s:i, s:s, s:i, s:i, s:s, s:s, s:s}", "format",
        o->quant.bits == 8 ? "q8" : "q4", "layout", BACKBONE_QUANT_FORMAT, "bits",
        o->quant.bits, "group", o->quant.group, "method", quant_method_name(o->quant.method),
        "head_bits", o->head_bits, "head_group", o->head_bits ? hp.group : 0, "head_method",
        o->head_bits ? quant_method_name(hp.method) : "none", "embedding",
        !o->head_bits ? "as in the source"
        : tied        ? "the quantized LM head (tied): one row dequantized per token"
                      : "quantized like the LM head",
        "source", m->path);
    if (!q || json_object_set_new(cfg, "river_quantization", q) != 0 ||
        json_dump_file(cfg, dst, JSON_INDENT(2) | JSON_REAL_PRECISION(15)) != 0)
        err = river_err_set(RIVER_EIO, "%s: cannot write", dst);
    json_decref(cfg);
out:
    free(src);
    free(dst);
    return err;
}

/* Refuses to write over the source, or over a model.safetensors that is not a quantized
 * backbone (a typo in --out could otherwise replace a real checkpoint). */
static int bq_check_target(const model_t *m, const char *dir)
{
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return river_err_set(RIVER_EIO, "%s: mkdir: %s", dir, strerror(errno));
    char a[PATH_MAX], b[PATH_MAX];
    if (realpath(dir, a) && realpath(m->dir, b) && !strcmp(a, b))
        return river_err_set(RIVER_EINVAL, "%s: the output directory is the source model's "
                             "own; choose another --out", dir);
    char *p = bq_join(dir, "model.safetensors");
    if (!p)
        return river_err_set(RIVER_ENOMEM, "%s: path", dir);
    struct stat st;
    int err = 0;
    if (stat(p, &st) == 0) {
        safetensors_t *f = NULL;
        int ours = 0;
        if (S_ISREG(st.st_mode) && safetensors_open(&f, p) == 0) {
            const char *fmt = safetensors_metadata(f, "format");
            ours = fmt && !strcmp(fmt, BACKBONE_QUANT_FORMAT);
            safetensors_destroy(&f);
        }
        if (!ours)
            err = river_err_set(RIVER_EINVAL, "%s exists and is not a quantized backbone; "
                                "remove it or choose another --out", p);
    }
    free(p);
    return err;
}

/* ---- the tensors ---- */

static int bq_declare(safetensors_writer_t *wr, const model_t *m, const backbone_quant_opts_t *o,
                      const bq_list_t *l)
{
    quant_params_t hp = bq_head_params(m, o);
    char num[4][24];
    snprintf(num[0], sizeof num[0], "%d", o->quant.bits);
    snprintf(num[1], sizeof num[1], "%d", o->quant.group);
    snprintf(num[2], sizeof num[2], "%d", o->head_bits);
    snprintf(num[3], sizeof num[3], "%d", o->head_bits ? hp.group : 0);
    const char *meta[][2] = {
        {"format", BACKBONE_QUANT_FORMAT}, {"format_version", BACKBONE_QUANT_FORMAT_VERSION},
        {"bits", num[0]}, {"group", num[1]}, {"method", quant_method_name(o->quant.method)},
        {"head_bits", num[2]}, {"head_group", num[3]},
        {"head_method", o->head_bits ? quant_method_name(hp.method) : "none"},
        {"source", m->path},
    };
    int err;
    for (size_t i = 0; i < sizeof meta / sizeof meta[0]; i++)
        if ((err = safetensors_writer_set_metadata(wr, meta[i][0], meta[i][1])))
            return err;
    char name[128];
    for (int i = 0; i < l->n; i++) {
        const bq_tensor_t *t = &l->t[i];
        const weight_t *w = &t->w;
        if (t->kind == BQ_VECTOR) {
            int64_t shape[1] = {w->rows * w->cols};
            if ((err = safetensors_writer_add(wr, t->name, SAFETENSORS_F32, 1, shape)))
                return err;
            continue;
        }
        if (t->kind == BQ_KEEP) {
            safetensors_dtype_t dt = safetensors_dtype_from_weight(w->dtype);
            if (dt == SAFETENSORS_UNKNOWN)
                return river_err_set(RIVER_EUNSUPPORTED, "%s: '%s' is %s; with --head-bits 0 "
                                     "the head is copied, which a quantized source's cannot "
                                     "be", m->path, t->name, dtype_name(w->dtype));
            int64_t shape[2] = {w->rows, w->cols};
            if ((err = safetensors_writer_add(wr, t->name, dt, 2, shape)))
                return err;
            continue;
        }
        const quant_params_t *p = t->kind == BQ_LAYER ? &o->quant : &hp;
        int64_t gshape[2] = {w->rows, w->cols / p->group};
        int64_t cshape[2] = {w->rows, (int64_t)dtype_row_bytes(p->bits == 4 ? DTYPE_Q4 : DTYPE_Q8,
                                                               w->cols)};
        /* Scales and zeros first: their sizes are even, so they stay 2-byte aligned
         * whenever what precedes them is. */
        snprintf(name, sizeof name, "%s.qscales", t->name);
        if ((err = safetensors_writer_add(wr, name, SAFETENSORS_F16, 2, gshape)))
            return err;
        snprintf(name, sizeof name, "%s.qzeros", t->name);
        if ((err = safetensors_writer_add(wr, name, SAFETENSORS_F16, 2, gshape)) ||
            (err = safetensors_writer_add(wr, t->name, SAFETENSORS_U8, 2, cshape)))
            return err;
    }
    return 0;
}

static int bq_write_one(safetensors_writer_t *wr, const model_t *m, const bq_tensor_t *t,
                        const quant_params_t *p, threadpool_t *pool, quant_stats_t *st)
{
    const weight_t *w = &t->w;
    if (t->kind == BQ_VECTOR || t->kind == BQ_KEEP) {
        size_t n = (size_t)w->rows * dtype_row_bytes(w->dtype, w->cols);
        return safetensors_writer_write(wr, w->data, n);
    }
    quant_matrix_t *q = NULL;
    int err = quant_matrix_new(&q, w->rows, w->cols, p->bits, p->group);
    if (!err && (err = quant_weight(q, w, p, pool, st))) {
        /* The detail lives in the buffer river_err_set writes, so copy it first. */
        char why[256];
        snprintf(why, sizeof why, "%s", river_err_detail());
        river_err_set(err, "%s: '%s': %s", m->path, t->name, why);
    }
    size_t gbytes = q ? quant_matrix_group_count(q) * sizeof(uint16_t) : 0;
    if (!err && !(err = safetensors_writer_write(wr, q->scales, gbytes)) &&
        !(err = safetensors_writer_write(wr, q->zeros, gbytes)))
        err = safetensors_writer_write(wr, q->codes, quant_matrix_code_bytes(q));
    quant_matrix_destroy(&q);
    return err;
}

int backbone_quant_build(const model_t *m, const char *dir, const backbone_quant_opts_t *o,
                         quant_stats_t *total, quant_stats_t *head)
{
    bq_list_t l = {0};
    safetensors_writer_t *wr = NULL;
    threadpool_t *pool = NULL;
    char *path = NULL;
    quant_stats_t sum = {0}, hsum = {0}, layer = {0};
    int err;
    if ((err = bq_list_build(m, o, &l)) || (err = bq_check(m, o, &l)) ||
        (err = bq_check_target(m, dir)))
        goto fail;
    int n_threads = o->n_threads;
    if (n_threads == 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = n < 1 ? 1 : n > 256 ? 256 : (int)n;
    }
    quant_params_t hp = bq_head_params(m, o);
    path = bq_join(dir, "model.safetensors");
    if (!path) {
        err = river_err_set(RIVER_ENOMEM, "%s: path", dir);
        goto fail;
    }
    if ((err = threadpool_new(&pool, n_threads)) || (err = safetensors_writer_new(&wr, path)) ||
        (err = bq_declare(wr, m, o, &l)) || (err = safetensors_writer_begin(wr)))
        goto fail;
    double t0 = clock_now_s();
    int cur = -1;
    for (int i = 0; i < l.n; i++) {
        const bq_tensor_t *t = &l.t[i];
        /* Vectors come first and belong to no reported step. */
        if (t->kind == BQ_LAYER && t->layer != cur) {
            if (cur >= 0 && o->progress)
                o->progress(o->progress_arg, cur, &layer, clock_now_s() - t0);
            quant_stats_add(&sum, &layer);
            layer = (quant_stats_t){0};
            cur = t->layer;
            t0 = clock_now_s();
        }
        quant_stats_t st = {0};
        if ((err = bq_write_one(wr, m, t, t->kind == BQ_LAYER ? &o->quant : &hp, pool, &st)))
            goto fail;
        if (t->kind == BQ_LAYER) {
            quant_stats_add(&layer, &st);
        } else if (t->kind == BQ_HEAD) {
            quant_stats_add(&hsum, &st);
            /* The head (and embedding) are written before the layers: report them once the
             * last of them is done. */
            if (o->progress && (i + 1 == l.n || l.t[i + 1].kind != BQ_HEAD))
                o->progress(o->progress_arg, m->cfg.n_layers, &hsum, clock_now_s() - t0);
            t0 = clock_now_s();
        }
    }
    if (cur >= 0) {
        if (o->progress)
            o->progress(o->progress_arg, cur, &layer, clock_now_s() - t0);
        quant_stats_add(&sum, &layer);
    }
    if ((err = safetensors_writer_finish(wr)))
        goto fail;
    if ((err = bq_write_config(m, dir, o)))
        goto fail;
    static const char *const copies[] = {"tokenizer.json", "tokenizer_config.json",
                                         "special_tokens_map.json", "generation_config.json",
                                         "tokenizer.model", "chat_template.jinja"};
    for (size_t i = 0; i < sizeof copies / sizeof copies[0]; i++)
        if ((err = bq_copy_file(m->dir, dir, copies[i])))
            goto fail;
    if (total)
        *total = sum;
    if (head)
        *head = hsum;
fail:
    safetensors_writer_destroy(&wr);
    threadpool_destroy(&pool);
    free(path);
    free(l.t);
    return err;
}
