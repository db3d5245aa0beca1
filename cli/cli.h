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
int cmd_export(int argc, char **argv);
int cmd_quant(int argc, char **argv);
int cmd_calibrate(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_chat_template(int argc, char **argv);

/* Prints "river <cmd>: <message>: <detail>" for a river_err code to stderr; returns 1. */
int cli_fail(const char *cmd, int err);

#include "engine/engine_open.h"

/* What most commands open (engine_open): the model, its tokenizer (from tok_path, or found
 * beside the model: tokenizer.json in its directory, or the one tok*.bin beside a llama2.c
 * file) and the backend of cli_env_set_device with n_threads threads (0: all cores, one
 * for a model that fits the caches). want_tok 0 skips the tokenizer. */
typedef engine_env_t cli_env_t;

int cli_env_open(cli_env_t *env, const char *model_path, const char *tok_path, int n_threads,
                 int want_tok);
void cli_env_close(cli_env_t *env);
/* The device later cli_env_open calls open: "cpu" (the default), "cuda" or "cuda:N" (the
 * model's weights placed there; only in builds with the CUDA backend). RIVER_EINVAL for an
 * unknown name, RIVER_EUNSUPPORTED for cuda in a build without it. */
int cli_env_set_device(const char *name);
/* What later cli_env_open calls do with the CPU's weights: "copy" (the default: matrices
 * of 2 MiB or more into huge pages) or "mapped" (read in the mapped checkpoint, which
 * backbone offloading needs). RIVER_EINVAL naming anything else. */
int cli_env_set_weights(const char *mode);
/* kv.dtype of the engines later commands make (--kv-dtype): a name of gen_kv_dtype_names
 * ("auto", the default, "f32", "f16", "bf16", "q8"); RIVER_EINVAL naming kv.dtype for
 * anything else. cli_env_kv_dtype gives the gen_kv_dtype_t for gen_config_t.kv_dtype and
 * gen_kv_dtype. */
int cli_env_set_kv_dtype(const char *name);
int cli_env_kv_dtype(void);
/* Whether env->be keeps its buffers in host memory (the CPU backend). */
int cli_env_is_cpu(const cli_env_t *env);
/* The SIMD level of a CPU backend ("avx2"...), or "none" for another backend. */
const char *cli_env_simd_name(const cli_env_t *env);

/* Prints o (NULL: nothing) as one line of compact JSON on stdout and releases it. */
struct json_t;
void cli_json_print(struct json_t *o);

/* Finds the tokenizer file that belongs to a model path; writes it to buf. */
int cli_find_tokenizer(const char *model_path, char *buf, size_t cap);

/* Strict number parsing for options: fails (returns -1) on junk or out-of-range values. */
int cli_parse_int(const char *s, long min, long max, long *out);
int cli_parse_float(const char *s, double *out);
/* The median of v[0..n-1] (sorts v in place; 0 when n is 0): benchmarks report it, since
 * on a shared machine a single timing is noisy. */
double cli_median(double *v, int n);
/* Timed rounds of a measurement with --repeat `given`: given when positive, else (0: the
 * default) CLI_REPEAT_DEFAULT when the first round took less than CLI_REPEAT_SHORT_S
 * seconds and 1 when it took longer. */
#define CLI_REPEAT_DEFAULT 3
#define CLI_REPEAT_SHORT_S 2.0
#define CLI_REPEAT_MAX 64
int cli_repeats(long given, double first_s);
/* river bench --prefix-reuse (cli/bench_prefix.c): a chat of `turns` turns whose prompt
 * grows to `history` tokens (answers of gen_len, user messages of user_len), without and
 * with the prefix cache; prints the time to first token of both, whether every generated
 * id agrees, and the cache's hit rate. */
int bench_prefix_reuse(cli_env_t *env, int history, int turns, int gen_len, int user_len,
                       int json);

/* river bench --profile (cli/bench_profile.c): one run of gen_len decode steps after a
 * prompt of prompt_len, every op timed (kernels/profile.h), printed per op and weight shape
 * with its bytes and bandwidth, the time between ops and a read sweep of bw_mib MiB; with
 * river_path, the steps take a fixed exit after exit_layer layers (0: a quarter of them)
 * onto that river. With prefill, the prompt's steps instead, each matmul's GFLOP/s against
 * the compute peak. */
int bench_profile(cli_env_t *env, const char *river_path, int exit_layer, int prompt_len,
                  int gen_len, long bw_mib, int prefill, int json);

/* river bench --kernels (cli/bench_kernels.c): the CPU matmul kernels alone on Llama 3.2
 * 1B's shapes, per SIMD level, format and batch, against the read bandwidth; its own
 * options from argv. Returns the process exit status. */
int bench_kernels(int argc, char **argv);

#endif
