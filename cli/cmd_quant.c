/* `river quant`: builds a model's Exit River (its quantized copy of the layers from the
 * river start on) and writes it beside the model. */
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "cli/cli.h"
#include "common/clock.h"
#include "common/err.h"
#include "model/model.h"
#include "offline/backbone_quant.h"
#include "offline/exitriver_build.h"
#include "offline/quant.h"
#include "engine/exitriver.h"
#include "model/safetensors.h"

static void quant_usage(FILE *f)
{
    fprintf(f,
            "usage: river quant --model PATH [--bits 2|3|4|8] [--group N] [--start LS]\n"
            "                   [--method hqq|rtn|sym] [--head-bits 0|2|3|4|8] [--out FILE]\n"
            "                   [--threads N]\n"
            "       river quant --backbone q8|q4 --model DIR --out DIR2 [--group N]\n"
            "                   [--method hqq|rtn|sym] [--head-bits 0|4|8] [--threads N]\n\n"
            "--backbone writes a quantized copy of the whole checkpoint into DIR2\n"
            "(docs/FORMATS.md): q8 is 8-bit symmetric in blocks of 32 (llama.cpp's Q8_0),\n"
            "q4 4-bit HQQ (--method rtn: plain rounding) in groups of 64 (the largest\n"
            "multiple of 32 up to 64 dividing every matrix); the LM head (and a tied\n"
            "embedding, which is the head) at --head-bits, default 8; norms and biases F32.\n"
            "DIR2 loads like any checkpoint; an Exit River built from it (river quant\n"
            "--model DIR2) quantizes the backbone's dequantized weights.\n\n"
            "Quantizes the attention and FFN matrices of layers LS..L-1 to 2, 3, 4 or 8 bits\n"
            "with one fp16 scale and zero per group of N inputs (default 4 bits, group 64, HQQ:\n"
            "p 0.7, beta 10 x 1.01, up to 20 iterations) and writes the Exit River file,\n"
            "by default river-q<bits>-g<group>-<method>.safetensors in the model's directory\n"
            "(<stem>-river-... beside a llama2.c .bin, <stem>.river-... beside <stem>.gguf; a\n"
            "quantized GGUF backbone is quantized from f32 copies). LS defaults to %d, so\n"
            "that a token can leave the backbone after any layer. N must divide the columns\n"
            "of every matrix (and be a multiple of 16 for 2 and 3 bits, codes or head).\n"
            "Progress and the per-layer error (mean absolute and relative Frobenius, with\n"
            "plain RTN for reference) go to stderr; the written path goes to stdout.\n"
            "--head-bits (default 8) also stores a quantized copy of the LM head, used for\n"
            "the logits of tokens that exited; 0 keeps the backbone's head for them.\n"
            "--threads defaults to one per core.\n",
            EXITRIVER_DEFAULT_START_LAYER);
}

/* `river quant --backbone`: the whole checkpoint, into a directory. */
static int quant_backbone(const char *format, const char *model_path, const char *out,
                          int group, int method, int head_bits, int n_threads);

typedef struct quant_progress {
    int n_layers;
    quant_method_t method;
} quant_progress_t;

static void quant_report(void *arg, int layer, const quant_stats_t *st, double seconds)
{
    const quant_progress_t *p = arg;
    if (p->method == QUANT_HQQ)
        fprintf(stderr,
                "layer %3d/%d: mae %.4e (rtn %.4e, %+.1f%%)  rel-fro %.5f (rtn %.5f)  "
                "%.1f iters/group  %.2f s\n",
                layer, p->n_layers - 1, quant_stats_mae(st), quant_stats_rtn_mae(st),
                quant_stats_rtn_mae(st) > 0
                    ? 100.0 * (quant_stats_mae(st) / quant_stats_rtn_mae(st) - 1.0)
                    : 0.0,
                quant_stats_rel_fro(st), quant_stats_rtn_rel_fro(st),
                st->groups ? (double)st->iters / (double)st->groups : 0.0, seconds);
    else
        fprintf(stderr, "layer %3d/%d: mae %.4e  rel-fro %.5f  %.2f s\n", layer,
                p->n_layers - 1, quant_stats_mae(st), quant_stats_rel_fro(st), seconds);
    fflush(stderr);
}

/* Refuses to replace an existing file that is not a river (a typo in --out could otherwise
 * replace the model's own checkpoint). */
static int quant_check_target(const char *path)
{
    struct stat st;
    if (stat(path, &st) != 0)
        return 0;
    safetensors_t *f = NULL;
    int is_river = 0;
    if (S_ISREG(st.st_mode) && safetensors_open(&f, path) == 0) {
        const char *format = safetensors_metadata(f, "format");
        is_river = format && !strcmp(format, "river");
        safetensors_destroy(&f);
    }
    if (!is_river)
        return river_err_set(RIVER_EINVAL, "%s exists and is not a river file; remove it or "
                             "choose another --out", path);
    return 0;
}

/* The value of option argv[*i] ("--x V" or "--x=V"), or NULL when argv[*i] is not it. */
static const char *quant_optval(int argc, char **argv, int *i, const char *opt, int *missing)
{
    size_t n = strlen(opt);
    if (strncmp(argv[*i], opt, n) != 0)
        return NULL;
    if (argv[*i][n] == '=')
        return argv[*i] + n + 1;
    if (argv[*i][n] != '\0')
        return NULL;
    if (*i + 1 >= argc) {
        *missing = 1;
        return NULL;
    }
    return argv[++*i];
}

int cmd_quant(int argc, char **argv)
{
    exitriver_build_opts_t o = exitriver_build_opts_default();
    const char *model_path = NULL, *out = NULL, *backbone = NULL;
    long start = -1;
    int group_set = 0, method_set = -1, head_set = -1;
    for (int i = 1; i < argc; i++) {
        const char *v;
        long n;
        int missing = 0;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            quant_usage(stdout);
            return 0;
        } else if ((v = quant_optval(argc, argv, &i, "--model", &missing))) {
            model_path = v;
        } else if ((v = quant_optval(argc, argv, &i, "--out", &missing))) {
            out = v;
        } else if ((v = quant_optval(argc, argv, &i, "--backbone", &missing))) {
            if (strcmp(v, "q8") != 0 && strcmp(v, "q4") != 0) {
                fprintf(stderr, "river quant: --backbone must be q8 or q4, not '%s'\n", v);
                return 2;
            }
            backbone = v;
        } else if ((v = quant_optval(argc, argv, &i, "--bits", &missing))) {
            if (cli_parse_int(v, 2, 8, &n) != 0 || dtype_quant_of_bits((int)n) == DTYPE_COUNT) {
                fprintf(stderr, "river quant: --bits must be 2, 3, 4 or 8, not '%s'\n", v);
                return 2;
            }
            o.quant.bits = (int)n;
        } else if ((v = quant_optval(argc, argv, &i, "--group", &missing))) {
            if (cli_parse_int(v, 1, 1 << 20, &n) != 0) {
                fprintf(stderr, "river quant: --group needs a positive integer, not '%s'\n", v);
                return 2;
            }
            o.quant.group = (int)n;
            group_set = 1;
        } else if ((v = quant_optval(argc, argv, &i, "--start", &missing))) {
            if (cli_parse_int(v, 0, INT_MAX, &start) != 0) {
                fprintf(stderr, "river quant: --start needs a layer number, not '%s'\n", v);
                return 2;
            }
        } else if ((v = quant_optval(argc, argv, &i, "--head-bits", &missing))) {
            long hb;
            if (cli_parse_int(v, 0, 8, &hb) != 0 ||
                (hb != 0 && dtype_quant_of_bits((int)hb) == DTYPE_COUNT)) {
                fprintf(stderr, "river quant: --head-bits must be 0, 2, 3, 4 or 8, not '%s'\n",
                        v);
                return 2;
            }
            o.head_bits = (int)hb;
            head_set = (int)hb;
        } else if ((v = quant_optval(argc, argv, &i, "--method", &missing))) {
            if (quant_method_parse(v, &o.quant.method) != 0) {
                fprintf(stderr, "river quant: --method must be hqq, rtn or sym, not '%s'\n",
                        v);
                return 2;
            }
            method_set = (int)o.quant.method;
        } else if ((v = quant_optval(argc, argv, &i, "--threads", &missing))) {
            if (cli_parse_int(v, 1, 1024, &n) != 0) {
                fprintf(stderr, "river quant: --threads needs 1..1024, not '%s'\n", v);
                return 2;
            }
            o.n_threads = (int)n;
        } else {
            fprintf(stderr, "river quant: %s option '%s'\n",
                    missing ? "missing value for" : "unknown", argv[i]);
            quant_usage(stderr);
            return 2;
        }
    }
    if (!model_path) {
        fprintf(stderr, "river quant: --model is required\n");
        quant_usage(stderr);
        return 2;
    }

    if (backbone) {
        if (!out) {
            fprintf(stderr, "river quant: --backbone needs --out DIR2 (the new checkpoint's "
                    "directory)\n");
            return 2;
        }
        if (start >= 0) {
            fprintf(stderr, "river quant: --start is the river's; --backbone quantizes every "
                    "layer\n");
            return 2;
        }
        return quant_backbone(backbone, model_path, out, group_set ? o.quant.group : 0,
                              method_set, head_set, o.n_threads);
    }

    double t0 = clock_now_s();
    model_t *m = NULL;
    int err = model_load(&m, model_path);
    if (err)
        return cli_fail("quant", err);
    int rc = 1;
    /* A quantized backbone (a GGUF of Q8_0, Q4_K, ...) is built from as floats; the river
     * keeps the fingerprint of the model as loaded. */
    if ((m->cfg.dtype == DTYPE_Q4 || m->cfg.dtype == DTYPE_Q8) && (err = model_dequantize(m))) {
        cli_fail("quant", err);
        goto done;
    }
    if (start >= 0)
        o.start_layer = (int)start;
    /* A one-layer model has no layer after the first; its river can only start at 0. */
    if (start < 0 && o.start_layer >= m->cfg.n_layers)
        o.start_layer = 0;
    if (o.start_layer >= m->cfg.n_layers) {
        fprintf(stderr, "river quant: --start %d: %s has layers 0..%d\n", o.start_layer,
                m->path, m->cfg.n_layers - 1);
        rc = 2;
        goto done;
    }
    /* The default group size gives way to the largest one that divides every matrix (a
     * group named with --group is kept, and refused if it does not fit). */
    if (!group_set) {
        int fit = exitriver_group_fit(m, &o, o.quant.group);
        if (fit > 0 && fit != o.quant.group) {
            fprintf(stderr, "river quant: no group of %d divides every matrix of %s; using "
                    "the largest that does, %d\n", o.quant.group, m->path, fit);
            o.quant.group = fit;
        }
    }
    char path[PATH_MAX];
    if (out) {
        snprintf(path, sizeof path, "%s", out);
    } else if ((err = exitriver_default_path(m, &o.quant, path, sizeof path))) {
        cli_fail("quant", err);
        goto done;
    }
    if ((err = quant_check_target(path))) {
        cli_fail("quant", err);
        goto done;
    }
    quant_progress_t prog = {.n_layers = m->cfg.n_layers, .method = o.quant.method};
    o.progress = quant_report;
    o.progress_arg = &prog;
    fprintf(stderr, "river quant: %s (%s, %d layers, %s) -> %s\n", m->path,
            arch_name(m->cfg.arch), m->cfg.n_layers, dtype_name(m->cfg.dtype), path);
    fprintf(stderr, "river quant: %d-bit, groups of %d, %s, layers %d..%d\n", o.quant.bits,
            o.quant.group, quant_method_name(o.quant.method), o.start_layer,
            m->cfg.n_layers - 1);
    double t1 = clock_now_s();
    quant_stats_t total;
    if ((err = exitriver_build(m, path, &o, &total))) {
        cli_fail("quant", err);
        goto done;
    }
    double t2 = clock_now_s();
    struct stat st;
    double mb = stat(path, &st) == 0 ? (double)st.st_size / 1e6 : 0;
    if (o.quant.method == QUANT_HQQ)
        fprintf(stderr, "river quant: all layers: mae %.4e (rtn %.4e), rel-fro %.5f (rtn %.5f)\n",
                quant_stats_mae(&total), quant_stats_rtn_mae(&total),
                quant_stats_rel_fro(&total), quant_stats_rtn_rel_fro(&total));
    else
        fprintf(stderr, "river quant: all layers: mae %.4e, rel-fro %.5f\n",
                quant_stats_mae(&total), quant_stats_rel_fro(&total));
    fprintf(stderr, "river quant: %.2f M weights -> %.1f MB in %.1f s (model load %.1f s, "
            "total %.1f s)\n", (double)total.n / 1e6, mb, t2 - t1, t1 - t0, t2 - t0);
    printf("%s\n", path);
    rc = 0;
done:
    model_destroy(&m);
    return rc;
}

typedef struct backbone_progress {
    int n_layers;
    quant_method_t method;
} backbone_progress_t;

static void backbone_report(void *arg, int layer, const quant_stats_t *st, double seconds)
{
    const backbone_progress_t *p = arg;
    quant_progress_t qp = {.n_layers = p->n_layers, .method = p->method};
    if (layer < p->n_layers) {
        quant_report(&qp, layer, st, seconds);
        return;
    }
    fprintf(stderr, "head:        mae %.4e  rel-fro %.5f  %.2f s\n", quant_stats_mae(st),
            quant_stats_rel_fro(st), seconds);
    fflush(stderr);
}

static int quant_backbone(const char *format, const char *model_path, const char *out,
                          int group, int method, int head_bits, int n_threads)
{
    double t0 = clock_now_s();
    model_t *m = NULL;
    int err = model_load(&m, model_path);
    if (err)
        return cli_fail("quant", err);
    int rc = 1;
    backbone_quant_opts_t o;
    backbone_quant_opts_for(format, m, &o);
    if (method >= 0)
        o.quant.method = (quant_method_t)method;
    if (head_bits >= 0)
        o.head_bits = head_bits;
    if (group > 0)
        o.quant.group = group;
    o.n_threads = n_threads;
    if (o.quant.method == QUANT_SYM && o.quant.bits == 4 && method < 0)
        o.quant.method = QUANT_HQQ;
    backbone_progress_t prog = {.n_layers = m->cfg.n_layers, .method = o.quant.method};
    o.progress = backbone_report;
    o.progress_arg = &prog;
    fprintf(stderr, "river quant: %s (%s, %d layers, %s) -> %s/ as %s: %d-bit, groups of %d, "
            "%s; head %d-bit\n", m->path, arch_name(m->cfg.arch), m->cfg.n_layers,
            dtype_name(m->cfg.dtype), out, format, o.quant.bits, o.quant.group,
            quant_method_name(o.quant.method), o.head_bits);
    double t1 = clock_now_s();
    quant_stats_t total, head;
    if ((err = backbone_quant_build(m, out, &o, &total, &head))) {
        cli_fail("quant", err);
        goto done;
    }
    double t2 = clock_now_s();
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/model.safetensors", out);
    struct stat st;
    double mb = stat(path, &st) == 0 ? (double)st.st_size / 1e6 : 0;
    fprintf(stderr, "river quant: all layers: mae %.4e, rel-fro %.5f",
            quant_stats_mae(&total), quant_stats_rel_fro(&total));
    if (o.quant.method == QUANT_HQQ)
        fprintf(stderr, " (rtn %.4e, %.5f)", quant_stats_rtn_mae(&total),
                quant_stats_rtn_rel_fro(&total));
    fprintf(stderr, "\nriver quant: %.2f M weights -> %.1f MB in %.1f s (model load %.1f s, "
            "total %.1f s)\n", (double)(total.n + head.n) / 1e6, mb, t2 - t1, t1 - t0, t2 - t0);
    printf("%s\n", out);
    rc = 0;
done:
    model_destroy(&m);
    return rc;
}
