/* `river synth`: writes a random-weight checkpoint with the shape of a real model. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/cli.h"
#include "common/clock.h"
#include "common/err.h"
#include "offline/synth.h"

static void synth_usage(FILE *f)
{
    fprintf(f,
            "usage: river synth --shape NAME --out DIR [--dtype f32|f16|bf16] [--seed S]\n"
            "                   [--shard-size MB] [--quiet]\n\n"
            "Writes config.json and model.safetensors (or shards plus\n"
            "model.safetensors.index.json when the weights exceed --shard-size, default\n"
            "4096 MB) of random weights with the shape of a real model. The same seed gives\n"
            "the same weights. Default dtype bf16, seed 1.\n\nshapes:");
    for (int i = 0; synth_shape_name(i); i++)
        fprintf(f, " %s", synth_shape_name(i));
    fprintf(f, "\n");
}

/* The value of option argv[*i] ("--x V" or "--x=V"); NULL when absent. */
static const char *synth_optval(int argc, char **argv, int *i, const char *opt)
{
    size_t n = strlen(opt);
    if (strncmp(argv[*i], opt, n) != 0)
        return NULL;
    if (argv[*i][n] == '=')
        return argv[*i] + n + 1;
    if (argv[*i][n] != '\0' || *i + 1 >= argc)
        return NULL;
    return argv[++*i];
}

static int synth_parse_u64(const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 0);
    if (errno || end == s || *end || s[0] == '-')
        return -1;
    *out = v;
    return 0;
}

int cmd_synth(int argc, char **argv)
{
    synth_opts_t o = {.dtype = DTYPE_BF16, .seed = 1, .progress = 1};
    const char *dtype = "bf16";
    uint64_t shard_mb = 0;
    for (int i = 1; i < argc; i++) {
        const char *v;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            synth_usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--quiet")) {
            o.progress = 0;
        } else if ((v = synth_optval(argc, argv, &i, "--shape"))) {
            o.shape = v;
        } else if ((v = synth_optval(argc, argv, &i, "--out"))) {
            o.out_dir = v;
        } else if ((v = synth_optval(argc, argv, &i, "--dtype"))) {
            dtype = v;
        } else if ((v = synth_optval(argc, argv, &i, "--seed"))) {
            if (synth_parse_u64(v, &o.seed) != 0) {
                fprintf(stderr, "river synth: --seed needs a non-negative integer\n");
                return 2;
            }
        } else if ((v = synth_optval(argc, argv, &i, "--shard-size"))) {
            if (synth_parse_u64(v, &shard_mb) != 0 || shard_mb == 0 ||
                shard_mb > (UINT64_C(1) << 40)) {
                fprintf(stderr, "river synth: --shard-size needs a positive size in MB\n");
                return 2;
            }
        } else {
            fprintf(stderr, "river synth: unknown or incomplete option '%s'\n", argv[i]);
            synth_usage(stderr);
            return 2;
        }
    }
    if (!o.shape || !o.out_dir) {
        fprintf(stderr, "river synth: --shape and --out are required\n");
        synth_usage(stderr);
        return 2;
    }
    if (!strcmp(dtype, "f32"))
        o.dtype = DTYPE_F32;
    else if (!strcmp(dtype, "f16"))
        o.dtype = DTYPE_F16;
    else if (!strcmp(dtype, "bf16"))
        o.dtype = DTYPE_BF16;
    else {
        fprintf(stderr, "river synth: --dtype must be f32, f16 or bf16, not '%s'\n", dtype);
        return 2;
    }
    o.shard_bytes = shard_mb << 20;

    double t0 = clock_now_s();
    int err = synth_write(&o);
    if (err)
        return cli_fail("synth", err);
    double secs = clock_now_s() - t0;
    if (o.progress)
        fprintf(stderr, "synth: wrote %s (%s, %s, %.2f GB of weights) in %.1f s\n", o.out_dir,
                o.shape, dtype, (double)synth_data_bytes(o.shape, o.dtype) / 1e9, secs);
    return 0;
}
