/* river: the engine's command-line front end. Dispatches to one subcommand by name. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "common/err.h"

typedef struct command {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *summary;
} command_t;

static const command_t commands[] = {
    {"info", cmd_info, "print a model's architecture, parameters and bytes per token"},
    {"tokenize", cmd_tokenize, "encode UTF-8 text from stdin to token ids"},
    {"detokenize", cmd_detokenize, "decode a JSON id array from stdin to text"},
    {"run", cmd_run, "generate text from a prompt"},
    {"bench", cmd_bench, "measure prefill and decode speed against the memory roofline"},
    {"export", cmd_export, "write a model as a GGUF file for llama.cpp (--gguf)"},
    {"synth", cmd_synth, "write a random-weight checkpoint of a real model's shape"},
    {"quant", cmd_quant, "build the Exit River: a 4-bit copy of the later layers"},
    {"calibrate", cmd_calibrate, "train TIDE exit routers on calibration text"},
    {"eval", cmd_eval, "measure an exit policy against the full backbone"},
    {"chat-template", cmd_chat_template, "render a chat template with a context JSON from stdin"},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: river COMMAND [OPTIONS]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-13s %s\n", commands[i].name, commands[i].summary);
    fprintf(f, "\n`river COMMAND --help` describes a command's options.\n");
}

int cli_fail(const char *cmd, int err)
{
    fprintf(stderr, "river %s: %s: %s\n", cmd, river_strerror(err), river_err_detail());
    return 1;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name))
            return commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "river: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
