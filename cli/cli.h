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

/* Prints "river <cmd>: <message>: <detail>" for a river_err code to stderr; returns 1. */
int cli_fail(const char *cmd, int err);

#endif
