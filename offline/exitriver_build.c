/* Building an Exit River file from a model: every matrix of layers start_layer.. quantized
 * (offline/quant.h) and written as exitriver.h describes. */
#include "offline/exitriver_build.h"

#include <stdio.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/err.h"
#include "kernels/backend.h"
#include "kernels/cpu/threadpool.h"
#include "model/fingerprint.h"
#include "model/safetensors.h"

exitriver_build_opts_t exitriver_build_opts_default(void)
{
    return (exitriver_build_opts_t){
        .quant = quant_params_default(),
        .start_layer = EXITRIVER_DEFAULT_START_LAYER,
        .head_bits = 8,
        .n_threads = 0,
    };
}

/* ---- building ---- */

int exitriver_group_fit(const model_t *m, const exitriver_build_opts_t *o, int most)
{
    int n_layers = m->cfg.n_layers;
    int64_t common = o->head_bits ? m->lm_head.cols : 0;
    for (int l = o->start_layer < 0 ? 0 : o->start_layer; l < n_layers; l++)
        for (int i = 0; i < EXITRIVER_N_MATRICES; i++) {
            int64_t a = exitriver_matrix(&m->layers[l], i)->cols, b = common;
            while (b) {
                int64_t t = a % b;
                a = b;
                b = t;
            }
            common = a;
        }
    /* Two 4-bit codes share a byte; 2- and 3-bit groups are whole runs of 16 codes. */
    int bits[2] = {o->quant.bits, o->head_bits};
    int unit = 1;
    for (int i = 0; i < 2; i++) {
        int u = bits[i] == 4 ? 2 : bits[i] == 2 || bits[i] == 3 ? QUANT_LOWBIT_GROUP_UNIT : 1;
        unit = u > unit ? u : unit;
    }
    for (int g = most; g >= 1; g--)
        if (common % g == 0 && g % unit == 0)
            return g;
    return 0;
}

/* Everything is checked before the file is created, so a bad group size fails at once
 * instead of after minutes of work. */
static int exitriver_build_check(const model_t *m, const exitriver_build_opts_t *o)
{
    int n_layers = m->cfg.n_layers;
    if (o->start_layer < 0 || o->start_layer >= n_layers)
        return river_err_set(RIVER_EINVAL, "%s: river start layer %d outside 0..%d", m->path,
                             o->start_layer, n_layers - 1);
    if (o->n_threads < 0 || o->n_threads > 1024)
        return river_err_set(RIVER_EINVAL, "river: %d threads", o->n_threads);
    int err = quant_params_check(&o->quant, 0, m->path);
    if (err)
        return err;
    if (o->head_bits != 0) {
        quant_params_t hp = o->quant;
        hp.bits = o->head_bits;
        if (quant_params_check(&hp, 0, "river: LM head") != 0)
            return river_err_set(RIVER_EINVAL, "river: LM head bits %d with group %d; 0, or 2 "
                                 "or 3 (groups of a multiple of %d), 4 or 8", o->head_bits,
                                 o->quant.group, QUANT_LOWBIT_GROUP_UNIT);
    }
    if (o->head_bits && m->lm_head.cols % o->quant.group != 0)
        return river_err_set(RIVER_EINVAL, "%s: group %d does not divide the LM head's %lld "
                             "columns", m->path, o->quant.group, (long long)m->lm_head.cols);
    /* The largest group up to 128 that divides every matrix, to suggest one on failure. */
    int suggest = exitriver_group_fit(m, o, 128);
    for (int l = o->start_layer; l < n_layers; l++)
        for (int i = 0; i < EXITRIVER_N_MATRICES; i++) {
            const weight_t *w = exitriver_matrix(&m->layers[l], i);
            /* A quantized backbone's Q4/Q8 matrices are read dequantized (quant_weight), so
             * the river approximates the weights that actually run. */
            if (w->dtype != DTYPE_F32 && w->dtype != DTYPE_F16 && w->dtype != DTYPE_BF16 &&
                w->dtype != DTYPE_Q4 && w->dtype != DTYPE_Q8)
                return river_err_set(RIVER_EDTYPE, "%s: layer %d %s is %s; the river "
                                     "quantizes F32, F16, BF16, Q4 or Q8 weights", m->path, l,
                                     exitriver_matrix_name(i), dtype_name(w->dtype));
            if (w->cols % o->quant.group != 0 && suggest == 0)
                return river_err_set(RIVER_ESHAPE, "%s: layer %d %s has %lld columns, not a "
                                     "multiple of the group size %d, and no group these "
                                     "bits allow (2 and 3 bits: a multiple of %d) divides "
                                     "every matrix; use --bits 4 or 8", m->path, l,
                                     exitriver_matrix_name(i), (long long)w->cols,
                                     o->quant.group, QUANT_LOWBIT_GROUP_UNIT);
            if (w->cols % o->quant.group != 0)
                return river_err_set(RIVER_ESHAPE, "%s: layer %d %s has %lld columns, not a "
                                     "multiple of the group size %d; the largest group up "
                                     "to 128 that divides every matrix is %d", m->path, l,
                                     exitriver_matrix_name(i), (long long)w->cols,
                                     o->quant.group, suggest);
        }
    return 0;
}

static int exitriver_declare(safetensors_writer_t *wr, const model_t *m,
                             const exitriver_build_opts_t *o, const char *fingerprint)
{
    const quant_params_t *p = &o->quant;
    char num[4][24], hqq[128];
    snprintf(num[0], sizeof num[0], "%d", o->start_layer);
    snprintf(num[1], sizeof num[1], "%d", m->cfg.n_layers);
    snprintf(num[2], sizeof num[2], "%d", p->bits);
    snprintf(num[3], sizeof num[3], "%d", p->group);
    snprintf(hqq, sizeof hqq, "p=%g beta=%g kappa=%g iters=%d", (double)p->hqq_p,
             (double)p->hqq_beta, (double)p->hqq_kappa, p->hqq_iters);
    const char *meta[][2] = {
        {"format", EXITRIVER_FORMAT},   {"format_version", EXITRIVER_FORMAT_VERSION},
        {"fingerprint", fingerprint}, {"source", m->path},
        {"start_layer", num[0]},    {"n_layers", num[1]},
        {"bits", num[2]},           {"group", num[3]},
        {"method", quant_method_name(p->method)},
    };
    int err;
    for (size_t i = 0; i < sizeof meta / sizeof meta[0]; i++)
        if ((err = safetensors_writer_set_metadata(wr, meta[i][0], meta[i][1])))
            return err;
    if (p->method == QUANT_HQQ && (err = safetensors_writer_set_metadata(wr, "hqq", hqq)))
        return err;
    char name[96];
    if (o->head_bits) {
        char hb[8];
        snprintf(hb, sizeof hb, "%d", o->head_bits);
        const weight_t *w = &m->lm_head;
        int64_t gshape[2] = {w->rows, w->cols / p->group};
        int64_t cshape[2] = {
            w->rows, (int64_t)dtype_row_bytes(dtype_quant_of_bits(o->head_bits), w->cols)};
        if ((err = safetensors_writer_set_metadata(wr, "head_bits", hb)) ||
            (err = safetensors_writer_add(wr, "lm_head.scales", SAFETENSORS_F16, 2, gshape)) ||
            (err = safetensors_writer_add(wr, "lm_head.zeros", SAFETENSORS_F16, 2, gshape)) ||
            (err = safetensors_writer_add(wr, "lm_head.codes", SAFETENSORS_U8, 2, cshape)))
            return err;
    }
    for (int l = o->start_layer; l < m->cfg.n_layers; l++)
        for (int i = 0; i < EXITRIVER_N_MATRICES; i++) {
            const weight_t *w = exitriver_matrix(&m->layers[l], i);
            int64_t gshape[2] = {w->rows, w->cols / p->group};
            int64_t cshape[2] = {
                w->rows, (int64_t)dtype_row_bytes(dtype_quant_of_bits(p->bits), w->cols)};
            /* Scales and zeros come first: their sizes are even, so they stay 2-byte aligned
             * in the mapping whenever the codes before them are. */
            exitriver_tensor_name(name, sizeof name, l, i, "scales");
            if ((err = safetensors_writer_add(wr, name, SAFETENSORS_F16, 2, gshape)))
                return err;
            exitriver_tensor_name(name, sizeof name, l, i, "zeros");
            if ((err = safetensors_writer_add(wr, name, SAFETENSORS_F16, 2, gshape)))
                return err;
            exitriver_tensor_name(name, sizeof name, l, i, "codes");
            if ((err = safetensors_writer_add(wr, name, SAFETENSORS_U8, 2, cshape)))
                return err;
        }
    return 0;
}

/* One quantized matrix's data, in the order exitriver_declare added its tensors. */
static int exitriver_write(safetensors_writer_t *wr, const quant_matrix_t *q)
{
    size_t gbytes = quant_matrix_group_count(q) * sizeof(uint16_t);
    int err;
    if ((err = safetensors_writer_write(wr, q->scales, gbytes)) ||
        (err = safetensors_writer_write(wr, q->zeros, gbytes)) ||
        (err = safetensors_writer_write(wr, q->codes, quant_matrix_code_bytes(q))))
        return err;
    return 0;
}

int exitriver_build(const model_t *m, const char *path, const exitriver_build_opts_t *o,
                    quant_stats_t *total)
{
    int err = exitriver_build_check(m, o);
    if (err)
        return err;
    /* Quantizing is host work over the mapped checkpoint; a model placed on a device no
     * longer has its weights where the host can read them. */
    if (m->backend && !backend_is_host(m->backend))
        return river_err_set(RIVER_EUNSUPPORTED, "%s: quantize the model before placing it on "
                             "a device backend (river quant runs on the host)", m->path);
    char fingerprint[MODEL_FINGERPRINT_LEN];
    if ((err = model_fingerprint(m, fingerprint)))
        return err;
    int n_threads = o->n_threads;
    if (n_threads == 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = n < 1 ? 1 : n > 256 ? 256 : (int)n;
    }
    safetensors_writer_t *wr = NULL;
    threadpool_t *pool = NULL;
    quant_matrix_t *q = NULL;
    quant_stats_t sum = {0};
    if ((err = threadpool_new(&pool, n_threads)))
        goto fail;
    if ((err = safetensors_writer_new(&wr, path)) ||
        (err = exitriver_declare(wr, m, o, fingerprint)) || (err = safetensors_writer_begin(wr)))
        goto fail;
    if (o->head_bits) {
        const weight_t *w = &m->lm_head;
        quant_params_t hp = o->quant;
        hp.bits = o->head_bits;
        quant_stats_t st;
        if ((err = quant_matrix_new(&q, w->rows, w->cols, hp.bits, hp.group)) ||
            (err = quant_weight(q, w, &hp, pool, &st)))
            goto fail;
        if ((err = exitriver_write(wr, q)))
            goto fail;
        quant_matrix_destroy(&q);
    }
    for (int l = o->start_layer; l < m->cfg.n_layers; l++) {
        double t0 = clock_now_s();
        quant_stats_t layer = {0};
        for (int i = 0; i < EXITRIVER_N_MATRICES; i++) {
            const weight_t *w = exitriver_matrix(&m->layers[l], i);
            quant_stats_t st;
            if ((err = quant_matrix_new(&q, w->rows, w->cols, o->quant.bits, o->quant.group)))
                goto fail;
            if ((err = quant_weight(q, w, &o->quant, pool, &st))) {
                /* The detail lives in the buffer river_err_set writes, so copy it first. */
                char why[256];
                snprintf(why, sizeof why, "%s", river_err_detail());
                river_err_set(err, "%s: layer %d %s: %s", m->path, l, exitriver_matrix_name(i),
                              why);
                goto fail;
            }
            if ((err = exitriver_write(wr, q)))
                goto fail;
            quant_matrix_destroy(&q);
            quant_stats_add(&layer, &st);
        }
        quant_stats_add(&sum, &layer);
        if (o->progress)
            o->progress(o->progress_arg, l, &layer, clock_now_s() - t0);
    }
    if ((err = safetensors_writer_finish(wr)))
        goto fail;
    if (total)
        *total = sum;
fail:
    quant_matrix_destroy(&q);
    safetensors_writer_destroy(&wr);
    threadpool_destroy(&pool);
    return err;
}

