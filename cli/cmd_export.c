/* `river export --gguf`: writes any model River loads as a GGUF file for llama.cpp. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "common/err.h"
#include "model/model.h"
#include "offline/gguf_export.h"

static void export_usage(FILE *f)
{
    fprintf(f,
            "usage: river export --gguf OUT.gguf --model PATH [--type T] [--tokenizer FILE]\n"
            "                    [--name NAME]\n\n"
            "Writes the model at PATH (a checkpoint directory, llama.2c .bin or .gguf) as a\n"
            "GGUF v3 file llama.cpp loads: llama.cpp's tensor names, q/k rows in its llama\n"
            "rope layout, its converter's metadata and tokenizer.ggml.* from the tokenizer\n"
            "beside the model (or --tokenizer). T: f32, f16 (default), bf16, q8_0, q4_0, q4_1,\n"
            "q4_k_m, q5_k_m (llama.cpp's mixes: Q6_K for the output and for attn_v/ffn_down\n"
            "of a share of the layers; rows not a multiple of 256 fall back to Q5_0/Q5_1/Q8_0).\n");
}

static const char *export_optval(int argc, char **argv, int *i, const char *opt)
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

int cmd_export(int argc, char **argv)
{
    gguf_export_opts_t o = {.type = "f16"};
    const char *out = NULL, *model = NULL;
    for (int i = 1; i < argc; i++) {
        const char *v;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            export_usage(stdout);
            return 0;
        } else if ((v = export_optval(argc, argv, &i, "--gguf"))) {
            out = v;
        } else if ((v = export_optval(argc, argv, &i, "--model"))) {
            model = v;
        } else if ((v = export_optval(argc, argv, &i, "--type"))) {
            o.type = v;
        } else if ((v = export_optval(argc, argv, &i, "--tokenizer"))) {
            o.tokenizer = v;
        } else if ((v = export_optval(argc, argv, &i, "--name"))) {
            o.name = v;
        } else {
            fprintf(stderr, "river export: unknown or incomplete option '%s'\n", argv[i]);
            export_usage(stderr);
            return 2;
        }
    }
    if (!out || !model) {
        fprintf(stderr, "river export: --gguf and --model are required\n");
        export_usage(stderr);
        return 2;
    }
    model_t *m = NULL;
    int err = model_load(&m, model);
    if (!err)
        err = gguf_export_model(m, out, &o);
    model_destroy(&m);
    if (err) {
        fprintf(stderr, "river export: %s\n", river_err_detail());
        return 1;
    }
    printf("wrote %s (%s)\n", out, o.type);
    return 0;
}
