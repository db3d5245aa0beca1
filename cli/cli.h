/* The `river` command-line tool: one entry point per subcommand, each in its own file.
 * A command returns the process exit status (0 success, 1 failure, 2 usage error) and
 * prints its own errors to stderr. */
#ifndef RIVER_CLI_CLI_H
#define RIVER_CLI_CLI_H

int cmd_info(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_detokenize(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_synth(int argc, char **argv);
int cmd_quant(int argc, char **argv);
int cmd_calibrate(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_chat_template(int argc, char **argv);

/* Prints "river <cmd>: <message>: <detail>" for a river_err code to stderr; returns 1. */
int cli_fail(const char *cmd, int err);

#include "engine/model.h"
#include "engine/tokenizer.h"
#include "kernels/ops.h"

/* What most commands open: the model, its tokenizer (from tok_path, or found beside the
 * model: tokenizer.json in its directory, or the one tok*.bin beside a llama2.c file) and
 * a CPU backend with n_threads threads (0: all cores). want_tok 0 skips the tokenizer. */
typedef struct cli_env {
    model_t *model;
    tokenizer_t *tok;
    backend_t *be;
} cli_env_t;

int cli_env_open(cli_env_t *env, const char *model_path, const char *tok_path, int n_threads,
                 int want_tok);
void cli_env_close(cli_env_t *env);
/* The backend later cli_env_open calls create: "cpu" (the default) or "cuda" (GPU 0, the
 * model's weights uploaded to it; only in builds with the CUDA backend). RIVER_EINVAL for
 * an unknown name, RIVER_EUNSUPPORTED for "cuda" in a build without it. */
int cli_env_set_device(const char *name);
/* Whether env->be is the CPU backend (cpu_backend_* calls apply to it). */
int cli_env_is_cpu(const cli_env_t *env);

/* Finds the tokenizer file that belongs to a model path; writes it to buf. */
int cli_find_tokenizer(const char *model_path, char *buf, size_t cap);

/* Strict number parsing for options: fails (returns -1) on junk or out-of-range values. */
int cli_parse_int(const char *s, long min, long max, long *out);
int cli_parse_float(const char *s, double *out);
#endif
