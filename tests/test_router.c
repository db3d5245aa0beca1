/* TIDE routers: backpropagation against finite differences, checkpoint placement, the
 * post-hoc exit helper, calibration and training on real kjv-12l hidden states (the loss
 * falls, held-out accuracy beats the majority class), save/load round trips, and loading
 * files that are corrupt, truncated or made for another model. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "common/clock.h"
#include "common/err.h"
#include "engine/router.h"
#include "model/fingerprint.h"
#include "model/safetensors.h"
#include "kernels/cpu/cpu.h"
#include "offline/router_train.h"
#include "tests/testutil.h"

#define KJV TEST_DATA "/kjv-12l"
#define CAL_TEXT "data/calibration/kjv-heldout.txt"

static model_t *load_model(const char *path)
{
    model_t *m = NULL;
    ck_assert_msg(model_load(&m, path) == 0, "%s", river_err_detail());
    return m;
}

/* Deterministic test values. */
static float rnd(uint64_t *s)
{
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)((*s >> 40) & 0xffffff) / 16777216.0f * 2.0f - 1.0f;
}

/* ---- Gradient check ------------------------------------------------------------------- */

static double loss_at(const router_t *r, const float *h, float y, float w_pos, float *scratch,
                      float *grad)
{
    memset(grad, 0, sizeof *grad * (size_t)r->n_params);
    return router_loss_grad(r, h, y, w_pos, grad, scratch);
}

/* Every analytic derivative (sampled for W_down) against a central difference. The check
 * covers the RMSNorm weight, W_down and w_up, for both labels and a positive weight != 1,
 * on inputs far from unit scale (the RMSNorm must absorb that). */
START_TEST(test_gradient_check)
{
    const int dim = 44; /* not a multiple of 8: the dot product's tail runs too */
    router_t r;
    ck_assert_int_eq(router_init(&r, 3, dim, 1e-5f), 0);
    router_init_params(&r, 7);
    uint64_t s = 99;
    /* A norm weight away from 1 so that its gradient path is not trivial, and a larger
     * w_up so that the logit is not near 0 for every sample. */
    for (int i = 0; i < dim; i++)
        r.norm[i] = 1.0f + 0.5f * rnd(&s);
    for (int j = 0; j < ROUTER_HIDDEN; j++)
        r.w_up[j] *= 4.0f;
    float *h = malloc(sizeof *h * (size_t)dim);
    float *grad = malloc(sizeof *grad * (size_t)r.n_params);
    float *g2 = malloc(sizeof *g2 * (size_t)r.n_params);
    float *scratch = malloc(sizeof *scratch * router_scratch_floats(&r));
    ck_assert(h && grad && g2 && scratch);
    int checked = 0, nonzero = 0;
    double worst = 0;
    for (int sample = 0; sample < 4; sample++) {
        for (int i = 0; i < dim; i++)
            h[i] = 30.0f * rnd(&s);
        float y = (float)(sample & 1);
        float w_pos = sample < 2 ? 1.0f : 2.5f;
        loss_at(&r, h, y, w_pos, scratch, grad);
        for (int64_t p = 0; p < r.n_params; p++) {
            int in_down = p >= dim && p < dim + (int64_t)ROUTER_HIDDEN * dim;
            if (in_down && (p * 7919) % 13 != 0)
                continue; /* a deterministic sample of about 1 in 13 W_down entries */
            float keep = r.params[p];
            float step = 1e-2f * fmaxf(1.0f, fabsf(keep));
            r.params[p] = keep + step;
            double lp = loss_at(&r, h, y, w_pos, scratch, g2);
            r.params[p] = keep - step;
            double lm = loss_at(&r, h, y, w_pos, scratch, g2);
            r.params[p] = keep;
            double num = (lp - lm) / (2.0 * (double)step);
            double ana = grad[p];
            double err = fabs(num - ana);
            double tol = 2e-3 + 3e-2 * fmax(fabs(num), fabs(ana));
            if (err / tol > worst)
                worst = err / tol;
            ck_assert_msg(err <= tol, "param %lld (sample %d): analytic %.6g, numeric %.6g",
                          (long long)p, sample, ana, num);
            checked++;
            nonzero += fabs(ana) > 1e-4;
        }
    }
    /* The check must have compared real derivatives, not zeros against zeros. */
    ck_assert_int_gt(checked, 4 * (dim + ROUTER_HIDDEN));
    ck_assert_int_gt(nonzero, checked / 2);
    fprintf(stderr, "gradient check: %d derivatives, %d nonzero, worst error %.2f of "
            "tolerance\n", checked, nonzero, worst);

    /* A deliberately wrong gradient would have failed: scaling one w_up entry changes the
     * loss by what the analytic derivative predicts, and by nothing like twice it. */
    loss_at(&r, h, 1.0f, 1.0f, scratch, grad);
    int big = 0;
    for (int j = 1; j < ROUTER_HIDDEN; j++)
        if (fabsf(grad[dim + ROUTER_HIDDEN * dim + j]) >
            fabsf(grad[dim + ROUTER_HIDDEN * dim + big]))
            big = j;
    int64_t p = dim + (int64_t)ROUTER_HIDDEN * dim + big;
    float keep = r.params[p];
    r.params[p] = keep + 1e-2f;
    double lp = loss_at(&r, h, 1.0f, 1.0f, scratch, g2);
    r.params[p] = keep - 1e-2f;
    double lm = loss_at(&r, h, 1.0f, 1.0f, scratch, g2);
    r.params[p] = keep;
    double num = (lp - lm) / 2e-2;
    ck_assert(fabs(num - 2.0 * grad[p]) > 0.25 * fabs(num));

    free(h);
    free(grad);
    free(g2);
    free(scratch);
    router_release(&r);
}
END_TEST

/* The loss and the probability agree: BCE of the logit equals -log of router_sigmoid. */
START_TEST(test_loss_matches_prob)
{
    router_t r;
    ck_assert_int_eq(router_init(&r, 0, 16, 1e-6f), 0);
    router_init_params(&r, 3);
    for (int j = 0; j < ROUTER_HIDDEN; j++)
        r.w_up[j] *= 10.0f;
    float h[16], grad[16 + ROUTER_HIDDEN * 16 + ROUTER_HIDDEN];
    float *scratch = malloc(sizeof *scratch * router_scratch_floats(&r));
    uint64_t s = 5;
    for (int t = 0; t < 8; t++) {
        for (int i = 0; i < 16; i++)
            h[i] = rnd(&s);
        float p = router_sigmoid(router_logit(&r, h, NULL, NULL));
        memset(grad, 0, sizeof grad);
        float l1 = router_loss_grad(&r, h, 1.0f, 1.0f, grad, scratch);
        float l0 = router_loss_grad(&r, h, 0.0f, 1.0f, grad, scratch);
        ck_assert_float_eq_tol(l1, -logf(p), 1e-4f);
        ck_assert_float_eq_tol(l0, -logf(1.0f - p), 1e-4f);
    }
    /* A huge logit must not overflow the loss. */
    for (int i = 0; i < 16; i++)
        h[i] = 1.0f;
    for (int j = 0; j < ROUTER_HIDDEN; j++)
        r.w_up[j] = 1e4f;
    for (int i = 0; i < ROUTER_HIDDEN * 16; i++)
        r.w_down[i] = 1.0f;
    float l = router_loss_grad(&r, h, 0.0f, 1.0f, grad, scratch);
    ck_assert(isfinite(l) && l > 1e5f);
    ck_assert_float_eq(router_sigmoid(router_logit(&r, h, NULL, NULL)), 1.0f);
    free(scratch);
    router_release(&r);
}
END_TEST

START_TEST(test_checkpoints)
{
    int l[16];
    ck_assert_int_eq(router_checkpoints(12, 4, l, 16), 2);
    ck_assert_int_eq(l[0], 3);
    ck_assert_int_eq(l[1], 7);
    ck_assert_int_eq(router_checkpoints(12, 2, l, 16), 5);
    ck_assert_int_eq(l[0], 1);
    ck_assert_int_eq(l[4], 9);
    ck_assert_int_eq(router_checkpoints(12, 11, l, 16), 1);
    ck_assert_int_eq(l[0], 10);
    ck_assert_int_eq(router_checkpoints(12, 12, l, 16), 0);
    ck_assert_int_eq(router_checkpoints(5, 4, l, 16), 1);
    ck_assert_int_eq(router_checkpoints(2, 4, l, 16), 0);
    ck_assert_int_eq(router_checkpoints(12, 1, l, 2), 11); /* counts past cap */
    ck_assert_int_eq(router_checkpoints(12, 0, l, 16), RIVER_EINVAL);

    model_t *m = load_model(TEST_DATA "/tinystories-656k");
    router_set_t *s = NULL;
    ck_assert_int_eq(router_set_new(&s, m, 4, 0.9f, 1), RIVER_EINVAL);
    ck_assert_ptr_null(s);
    ck_assert_int_eq(router_set_new(&s, m, 1, 0.9f, 1), 0);
    ck_assert_int_eq(router_set_count(s), 1);
    ck_assert(router_set_is_checkpoint(s, 0));
    ck_assert(!router_set_is_checkpoint(s, 1));
    ck_assert(!router_set_is_checkpoint(s, -1));
    ck_assert(!router_set_is_checkpoint(s, 99));
    router_set_destroy(&s);
    ck_assert_ptr_null(s);
    model_destroy(&m);
}
END_TEST

/* Makes router i of s answer p = sigmoid(c * silu(~1)) on an all-ones input. */
static void set_router_gain(router_set_t *s, int i, float c)
{
    router_t *r = router_set_at(s, i);
    memset(r->w_down, 0, sizeof *r->w_down * (size_t)ROUTER_HIDDEN * (size_t)r->dim);
    memset(r->w_up, 0, sizeof *r->w_up * ROUTER_HIDDEN);
    for (int k = 0; k < r->dim; k++) {
        r->norm[k] = 1.0f;
        r->w_down[k] = 1.0f / (float)r->dim;
    }
    r->w_up[0] = c;
}

START_TEST(test_first_exit)
{
    model_t *m = load_model(KJV);
    router_set_t *s;
    ck_assert_int_eq(router_set_new(&s, m, 2, 0.9f, 1), 0);
    ck_assert_int_eq(router_set_count(s), 5); /* after layers 1 3 5 7 9 */
    for (int i = 0; i < 5; i++)
        set_router_gain(s, i, 0.0f);
    set_router_gain(s, 2, 10.0f); /* layer 5: p ~ 0.9993 */
    int dim = m->cfg.dim;
    float *ones = malloc(sizeof *ones * (size_t)dim);
    float *nan = malloc(sizeof *nan * (size_t)dim);
    for (int i = 0; i < dim; i++) {
        ones[i] = 1.0f;
        nan[i] = NAN;
    }
    const float *hl[12];
    for (int l = 0; l < 12; l++)
        hl[l] = ones;
    ck_assert_float_eq_tol(router_prob(s, 1, ones), 0.5f, 1e-6f);
    ck_assert_float_gt(router_prob(s, 5, ones), 0.999f);
    ck_assert_float_eq(router_prob(s, 4, ones), 0.0f); /* no checkpoint there */
    ck_assert(isnan(router_prob(s, 5, nan)));
    float rows[2];
    float *two = malloc(sizeof *two * 2 * (size_t)dim);
    memcpy(two, nan, sizeof *two * (size_t)dim);
    memcpy(two + dim, ones, sizeof *two * (size_t)dim);
    router_prob_rows(s, 5, two, 2, rows);
    ck_assert(isnan(rows[0]));
    ck_assert_float_eq(rows[1], router_prob(s, 5, ones));

    ck_assert_int_eq(router_set_first_exit(s, hl, 0.9f), 5);
    ck_assert_int_eq(router_set_first_exit(s, hl, 0.4f), 1);
    ck_assert_int_eq(router_set_first_exit(s, hl, 0.9999f), -1);
    ck_assert_int_eq(router_set_first_exit_from(s, hl, 0.4f, 2), 3);
    ck_assert_int_eq(router_set_first_exit_from(s, hl, 0.4f, 10), -1);
    hl[5] = NULL; /* a layer whose state was not kept cannot be an exit */
    ck_assert_int_eq(router_set_first_exit(s, hl, 0.9f), -1);
    hl[5] = nan;  /* nor can a non-finite one */
    ck_assert_int_eq(router_set_first_exit(s, hl, 0.9f), -1);
    /* The callback shape the forward pass takes. */
    ck_assert(router_set_is_checkpoint_cb(s, 5));
    ck_assert_float_eq(router_prob_cb(s, 5, ones), router_prob(s, 5, ones));
    free(ones);
    free(nan);
    free(two);
    router_set_destroy(&s);
    model_destroy(&m);
}
END_TEST

/* ---- Files ---------------------------------------------------------------------------- */

static char *tmp_path(const char *name)
{
    static char buf[4][512];
    static int k;
    char *p = buf[k++ & 3];
    snprintf(p, 512, "%s/%s", test_tmpdir(), name);
    return p;
}

/* Loading fails with `want` (0: any error) and a detail naming the file. */
static void expect_load_fails(const model_t *m, const char *path, int want, const char *needle)
{
    router_set_t *s = NULL;
    river_err_clear();
    int e = router_set_load(&s, m, path);
    ck_assert_msg(e < 0, "%s loaded", path);
    if (want)
        ck_assert_msg(e == want, "%s: got %s (%s), want %s", path, river_err_name(e),
                      river_err_detail(), river_err_name(want));
    ck_assert_ptr_null(s);
    const char *d = river_err_detail();
    ck_assert_msg(strstr(d, path) != NULL, "detail does not name the file: %s", d);
    if (needle)
        ck_assert_msg(strstr(d, needle) != NULL, "detail lacks '%s': %s", needle, d);
}

/* A saved, untrained set round-trips bit for bit; broken copies of it fail cleanly. */
START_TEST(test_corrupt_files)
{
    model_t *m = load_model(KJV);
    router_set_t *s, *t;
    ck_assert_int_eq(router_set_new(&s, m, 4, 0.95f, 11), 0);
    char *good = tmp_path("good.safetensors");
    ck_assert_msg(router_set_save(s, good) == 0, "%s", river_err_detail());
    ck_assert_msg(router_set_load(&t, m, good) == 0, "%s", river_err_detail());
    ck_assert_int_eq(router_set_interval(t), 4);
    ck_assert_float_eq(router_set_label_tau(t), 0.95f);
    ck_assert_int_eq(router_set_count(t), 2);
    for (int i = 0; i < 2; i++) {
        const router_t *a = router_set_at_const(s, i), *b = router_set_at_const(t, i);
        ck_assert_int_eq(a->layer, b->layer);
        ck_assert_float_eq(a->eps, b->eps);
        ck_assert(memcmp(a->params, b->params, sizeof(float) * (size_t)a->n_params) == 0);
    }
    router_set_destroy(&t);

    size_t len;
    unsigned char *bytes = test_read_file(good, &len);
    ck_assert_ptr_nonnull(bytes);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = hlen << 8 | bytes[i];
    ck_assert(hlen + 8 < len);

    /* Truncations: inside the length prefix, inside the header, inside the data, and one
     * byte short. */
    size_t cuts[] = {0, 5, 8 + (size_t)hlen / 2, 8 + (size_t)hlen + 100, len - 1};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        char name[64];
        snprintf(name, sizeof name, "cut%zu.safetensors", i);
        const char *p = test_write_tmp(name, bytes, cuts[i]);
        ck_assert_ptr_nonnull(p);
        expect_load_fails(m, p, 0, NULL);
    }

    /* Not a router file: another format tag in the metadata (same length, so the header
     * stays valid JSON and only the meaning changes). */
    unsigned char *copy = malloc(len);
    ck_assert_ptr_nonnull(copy);
    ck_assert_uint_gt(len, 64);
    memcpy(copy, bytes, len);
    char *tag = memmem(copy, 8 + hlen, "river-router", 12);
    ck_assert_ptr_nonnull(tag);
    memcpy(tag, "river-rooter", 12);
    expect_load_fails(m, test_write_tmp("fmt.safetensors", copy, len), RIVER_EFORMAT,
                      "not a router file");

    /* A header that is not JSON at all. */
    memcpy(copy, bytes, len);
    for (int i = 0; i < 16; i++)
        copy[8 + i] = '#';
    expect_load_fails(m, test_write_tmp("json.safetensors", copy, len), 0, NULL);

    /* A NaN among the weights: the last four bytes belong to the last tensor. */
    memcpy(copy, bytes, len);
    float qnan = NAN;
    memcpy(copy + len - 4, &qnan, 4);
    expect_load_fails(m, test_write_tmp("nan.safetensors", copy, len), RIVER_EFORMAT,
                      "non-finite");

    /* Metadata that lies about the interval: the checkpoints no longer match the tensors. */
    memcpy(copy, bytes, len);
    char *iv = memmem(copy, 8 + hlen, "\"interval\":\"4\"", 14);
    ck_assert_msg(iv != NULL, "interval entry not found in the header");
    iv[12] = '2';
    expect_load_fails(m, test_write_tmp("interval.safetensors", copy, len), RIVER_EFORMAT,
                      NULL);

    expect_load_fails(m, tmp_path("missing.safetensors"), RIVER_ENOTFOUND, NULL);
    free(copy);
    free(bytes);
    router_set_destroy(&s);
    model_destroy(&m);
}
END_TEST

/* Routers of one model refuse to load for another: a different shape, and the same shape
 * with different weights (a copy of kjv-12l with one final-norm value changed). */
START_TEST(test_other_model)
{
    model_t *kjv = load_model(KJV);
    router_set_t *s;
    ck_assert_int_eq(router_set_new(&s, kjv, 4, 0.98f, 1), 0);
    char *path = tmp_path("kjv-routers.safetensors");
    ck_assert_int_eq(router_set_save(s, path), 0);
    router_set_destroy(&s);

    model_t *tiny = load_model(TEST_DATA "/tinystories-656k");
    expect_load_fails(tiny, path, RIVER_ECONFIG, "another model");
    model_destroy(&tiny);
    model_t *l2c = load_model(TEST_DATA "/stories260K/stories260K.bin");
    expect_load_fails(l2c, path, RIVER_ECONFIG, "another model");
    model_destroy(&l2c);

    /* The twin: kjv-12l's files, one byte of model.norm.weight flipped. */
    char dir[512];
    snprintf(dir, sizeof dir, "%s/kjv-twin", test_tmpdir());
    ck_assert(mkdir(dir, 0700) == 0);
    const char *files[] = {"config.json", "model.safetensors"};
    for (int i = 0; i < 2; i++) {
        char src[512], dst[600];
        snprintf(src, sizeof src, KJV "/%s", files[i]);
        snprintf(dst, sizeof dst, "%s/%s", dir, files[i]);
        size_t len;
        unsigned char *b = test_read_file(src, &len);
        ck_assert_ptr_nonnull(b);
        if (i == 1) {
            safetensors_t *st;
            ck_assert_int_eq(safetensors_open(&st, src), 0);
            const safetensors_tensor_t *t = safetensors_find(st, "model.norm.weight");
            ck_assert_ptr_nonnull(t);
            b[t->file_offset + 1] ^= 0x01; /* a low mantissa bit: the model barely changes */
            safetensors_destroy(&st);
        }
        FILE *f = fopen(dst, "wb");
        ck_assert_ptr_nonnull(f);
        ck_assert_int_eq(fwrite(b, 1, len, f), len);
        ck_assert_int_eq(fclose(f), 0);
        free(b);
    }
    model_t *twin = load_model(dir);
    expect_load_fails(twin, path, RIVER_ECONFIG, "same shape");
    char fp_twin[MODEL_FINGERPRINT_LEN], fp_kjv[MODEL_FINGERPRINT_LEN];
    ck_assert_int_eq(model_fingerprint(twin, fp_twin), 0);
    ck_assert_int_eq(model_fingerprint(kjv, fp_kjv), 0);
    ck_assert_str_ne(fp_twin, fp_kjv);
    model_destroy(&twin);

    /* And the model it was made for still loads it. */
    ck_assert_msg(router_set_load(&s, kjv, path) == 0, "%s", river_err_detail());
    router_set_destroy(&s);
    model_destroy(&kjv);
}
END_TEST

/* ---- Calibration on real hidden states ------------------------------------------------ */

/* kjv-12l over held-out KJV chapters, checkpoints every 2 layers. TIDE's tau of 0.98 is far
 * above cos(h_k, h_L) at every checkpoint of this small model (see the printed quantiles
 * and positive fractions), so nearly every label would be 0 and there would be nothing to
 * learn; the test therefore takes label tau from the data (router_calib_auto_tau: the
 * median cosine over all checkpoints), which leaves early checkpoints mostly negative, late
 * ones mostly positive, and the middle ones balanced. */
START_TEST(test_calibrate_kjv)
{
    double t0 = clock_now_s();
    model_t *m = load_model(KJV);
    tokenizer_t *tok = NULL;
    ck_assert_msg(tokenizer_load(&tok, KJV "/tokenizer.json", 0) == 0, "%s",
                  river_err_detail());
    backend_t *be = NULL;
    test_backend_open(&be, 2, CPU_SIMD_COUNT, m);
    size_t len;
    char *text = test_read_file(CAL_TEXT, &len);
    ck_assert_msg(text != NULL, "cannot read " CAL_TEXT);

    router_calib_t *c = NULL;
    router_calib_opts_t co = {.interval = 2, .max_tokens = 6000, .window = 256};
    ck_assert_msg(router_calib_collect(&c, m, tok, be, text, len, &co) == 0, "%s",
                  river_err_detail());
    double t1 = clock_now_s();
    ck_assert_int_eq(c->n, 6000);
    ck_assert_int_eq(c->n_ckpt, 5);
    ck_assert_int_gt(c->n_windows, 1);
    fprintf(stderr, "kjv-12l: %lld tokens, %lld documents, %lld windows collected in %.1f s\n",
            (long long)c->n, (long long)c->n_docs, (long long)c->n_windows, t1 - t0);
    fprintf(stderr, "cos(h_k, h_L):   p10     p50     p90    pos@0.98\n");
    for (int i = 0; i < c->n_ckpt; i++) {
        float p10 = router_calib_cos_quantile(c, i, 0.1);
        float p50 = router_calib_cos_quantile(c, i, 0.5);
        float p90 = router_calib_cos_quantile(c, i, 0.9);
        fprintf(stderr, "  layer %d      %.4f  %.4f  %.4f  %5.2f%%\n", c->layers[i],
                (double)p10, (double)p50, (double)p90,
                100 * router_calib_pos_frac(c, i, 0.98f));
        ck_assert(p10 <= p50 && p50 <= p90 && p90 <= 1.0001f && p10 >= -1.0001f);
        /* Later checkpoints are closer to the final state, on the whole. */
        if (i)
            ck_assert_float_gt(p50, router_calib_cos_quantile(c, i - 1, 0.5) - 0.05f);
    }
    float tau = router_calib_auto_tau(c);
    double mean_pos = 0;
    for (int i = 0; i < c->n_ckpt; i++)
        mean_pos += router_calib_pos_frac(c, i, tau) / c->n_ckpt;
    ck_assert_msg(fabs(mean_pos - 0.5) < 0.01, "auto tau %.4f: %.3f positive", (double)tau,
                  mean_pos);

    router_set_t *s = NULL;
    ck_assert_int_eq(router_set_new(&s, m, 2, tau, 1), 0);
    router_train_opts_t o = router_train_defaults();
    o.epochs = 12;
    o.n_threads = 2;
    router_train_report_t reps[5];
    ck_assert_msg(router_set_train(s, c, &o, reps) == 0, "%s", river_err_detail());
    double t2 = clock_now_s();
    fprintf(stderr, "trained 5 routers, %d epochs, label tau %.4f, in %.1f s\n", o.epochs,
            (double)tau, t2 - t1);
    fprintf(stderr, "layer  pos     majority  held-acc  loss first -> last\n");
    int beats = 0;
    for (int i = 0; i < 5; i++) {
        const router_train_report_t *r = &reps[i];
        fprintf(stderr, "%5d  %5.1f%%  %6.1f%%   %6.1f%%   %.4f -> %.4f\n", r->layer,
                100 * r->pos_frac, 100 * r->majority_acc, 100 * r->held_acc, r->loss_first,
                r->loss_last);
        ck_assert_int_eq(r->n_samples, 6000);
        ck_assert_int_eq(r->n_held, 600);
        ck_assert_int_eq(r->n_train, 5400);
        ck_assert_msg(r->loss_last < r->loss_first, "layer %d: loss %.4f -> %.4f", r->layer,
                      r->loss_first, r->loss_last);
        beats += r->held_acc > r->majority_acc + 0.01;
    }
    ck_assert_msg(beats >= 1, "no checkpoint beats the majority class on held-out tokens");
    /* The most balanced checkpoint learned something real: its loss fell well below where
     * it started. */
    int bal = 0;
    for (int i = 1; i < 5; i++)
        if (fabs(reps[i].pos_frac - 0.5) < fabs(reps[bal].pos_frac - 0.5))
            bal = i;
    ck_assert_float_lt(reps[bal].loss_last, 0.85 * reps[bal].loss_first);

    /* Training is deterministic: a second run with one thread gives the same parameters. */
    router_set_t *s1 = NULL;
    ck_assert_int_eq(router_set_new(&s1, m, 2, tau, 1), 0);
    o.n_threads = 1;
    o.epochs = 1;
    router_train_report_t r1[5];
    ck_assert_int_eq(router_set_train(s1, c, &o, r1), 0);
    router_set_t *s2 = NULL;
    ck_assert_int_eq(router_set_new(&s2, m, 2, tau, 1), 0);
    o.n_threads = 3;
    router_train_report_t r2[5];
    ck_assert_int_eq(router_set_train(s2, c, &o, r2), 0);
    for (int i = 0; i < 5; i++) {
        const router_t *a = router_set_at_const(s1, i), *b = router_set_at_const(s2, i);
        ck_assert(memcmp(a->params, b->params, sizeof(float) * (size_t)a->n_params) == 0);
        ck_assert(r1[i].loss_last == r2[i].loss_last);
        router_train_report_free(&r1[i]);
        router_train_report_free(&r2[i]);
    }
    router_set_destroy(&s1);
    router_set_destroy(&s2);

    /* Save and load: identical probabilities and identical post-hoc exits on every sample. */
    char *path = tmp_path("kjv-trained.safetensors");
    ck_assert_msg(router_set_save(s, path) == 0, "%s", river_err_detail());
    router_set_t *t = NULL;
    ck_assert_msg(router_set_load(&t, m, path) == 0, "%s", river_err_detail());
    ck_assert_float_eq(router_set_label_tau(t), tau);
    int64_t exits = 0;
    for (int64_t k = 0; k < c->n; k++) {
        const float *hl[12] = {0};
        for (int i = 0; i < c->n_ckpt; i++) {
            const float *h = c->h + ((size_t)i * (size_t)c->cap + (size_t)k) * (size_t)c->dim;
            float a = router_prob(s, c->layers[i], h), b = router_prob(t, c->layers[i], h);
            ck_assert(memcmp(&a, &b, sizeof a) == 0);
            ck_assert(a >= 0.0f && a <= 1.0f);
            hl[c->layers[i]] = h;
        }
        int ea = router_set_first_exit(s, hl, 0.5f);
        ck_assert_int_eq(ea, router_set_first_exit(t, hl, 0.5f));
        exits += ea >= 0;
    }
    fprintf(stderr, "post-hoc exit at theta 0.5: %lld of %lld tokens\n", (long long)exits,
            (long long)c->n);
    ck_assert_int_gt(exits, 0);
    router_set_destroy(&t);

    for (int i = 0; i < 5; i++)
        router_train_report_free(&reps[i]);
    router_set_destroy(&s);
    router_calib_destroy(&c);
    ck_assert_ptr_null(c);
    free(text);
    backend_destroy(&be);
    tokenizer_destroy(&tok);
    model_destroy(&m);
    fprintf(stderr, "calibration test: %.1f s\n", clock_now_s() - t0);
}
END_TEST

/* Bad calibration input is an error, not a crash. */
START_TEST(test_calibrate_bad_input)
{
    model_t *m = load_model(KJV);
    tokenizer_t *tok = NULL;
    ck_assert_int_eq(tokenizer_load(&tok, KJV "/tokenizer.json", 0), 0);
    backend_t *be = NULL;
    test_backend_open(&be, 1, CPU_SIMD_COUNT, m);
    router_calib_t *c = NULL;
    router_calib_opts_t co = {.interval = 4};
    ck_assert_int_eq(router_calib_collect(&c, m, tok, be, "\n\n  \n", 5, &co), RIVER_EINVAL);
    ck_assert_int_eq(router_calib_collect(&c, m, tok, be, "", 0, &co), RIVER_EINVAL);
    co.interval = 12;
    ck_assert_int_eq(router_calib_collect(&c, m, tok, be, "In the beginning", 16, &co),
                     RIVER_EINVAL);
    co.interval = 0;
    ck_assert_int_eq(router_calib_collect(&c, m, tok, be, "In the beginning", 16, &co),
                     RIVER_EINVAL);
    co.interval = 4;
    co.window = 100000;
    ck_assert_int_eq(router_calib_collect(&c, m, tok, be, "In the beginning", 16, &co),
                     RIVER_EINVAL);
    ck_assert_ptr_null(c);
    /* A text shorter than one window, several documents, a tiny window. */
    co.window = 3;
    const char *t = "In the beginning God created\n\n\nthe heaven and the earth.\n";
    ck_assert_int_eq(router_calib_collect(&c, m, tok, be, t, strlen(t), &co), 0);
    ck_assert_int_eq(c->n_docs, 2);
    ck_assert_int_gt(c->n, 4);
    ck_assert_int_ge(c->n_windows, (c->n + 1) / 2); /* at most 2 tokens after each BOS */
    for (int64_t k = 0; k < c->n; k++)
        ck_assert(c->cos[k] > -1.0001f && c->cos[k] < 1.0001f);
    /* Training on too little data is refused. */
    router_t r;
    ck_assert_int_eq(router_init(&r, 3, c->dim, 1e-5f), 0);
    uint8_t y = 1;
    router_train_opts_t o = router_train_defaults();
    ck_assert_int_eq(router_train(&r, c->h, &y, 1, &o, NULL), RIVER_EINVAL);
    o.holdout = 1.5f;
    uint8_t ys[4] = {0, 1, 0, 1};
    ck_assert_int_eq(router_train(&r, c->h, ys, 4, &o, NULL), RIVER_EINVAL);
    router_release(&r);
    router_calib_destroy(&c);
    backend_destroy(&be);
    tokenizer_destroy(&tok);
    model_destroy(&m);
}
END_TEST

static Suite *router_suite(void)
{
    Suite *s = suite_create("router");
    TCase *tc = tcase_create("router");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_gradient_check);
    tcase_add_test(tc, test_loss_matches_prob);
    tcase_add_test(tc, test_checkpoints);
    tcase_add_test(tc, test_first_exit);
    tcase_add_test(tc, test_corrupt_files);
    tcase_add_test(tc, test_other_model);
    tcase_add_test(tc, test_calibrate_bad_input);
    tcase_add_test(tc, test_calibrate_kjv);
    suite_add_tcase(s, tc);
    return s;
}

RIVER_TEST_MAIN(router_suite)
