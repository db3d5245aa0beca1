/* `river tokenize` and `river detokenize`: text on stdin to token ids and back. */
#include <errno.h>
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "common/err.h"
#include "text/tokenizer.h"

static void tokenize_usage(FILE *f)
{
    fprintf(f, "usage: river tokenize --tokenizer PATH [--special] [--output json]\n\n"
               "Reads UTF-8 text from stdin (all of it, as is) and prints its token ids as\n"
               "{\"ids\":[...]}. --special applies the tokenizer's post-processor (BOS/EOS).\n"
               "PATH is a tokenizer.json, a model directory holding one, a GGUF file (its\n"
               "tokenizer.ggml.* metadata) or a llama2.c tok*.bin.\n");
}

static void detokenize_usage(FILE *f)
{
    fprintf(f, "usage: river detokenize --tokenizer PATH [--skip-special]\n\n"
               "Reads a JSON array of token ids (or {\"ids\":[...]}) from stdin and prints the\n"
               "decoded text, with no newline added. --skip-special drops special tokens.\n"
               "PATH is a tokenizer.json, a model directory holding one, a GGUF file (its\n"
               "tokenizer.ggml.* metadata) or a llama2.c tok*.bin.\n");
}

/* Reads all of stdin. */
static int tok_cli_read_stdin(const char *cmd, char **data, size_t *len)
{
    size_t cap = 65536, n = 0;
    char *buf = malloc(cap + 1);
    if (!buf) {
        fprintf(stderr, "river %s: out of memory\n", cmd);
        return 1;
    }
    for (;;) {
        if (n == cap) {
            char *nb = cap < SIZE_MAX / 4 ? realloc(buf, cap * 2 + 1) : NULL;
            if (!nb) {
                free(buf);
                fprintf(stderr, "river %s: out of memory reading stdin\n", cmd);
                return 1;
            }
            buf = nb;
            cap *= 2;
        }
        ssize_t r = read(STDIN_FILENO, buf + n, cap - n);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            fprintf(stderr, "river %s: reading stdin: %s\n", cmd, strerror(errno));
            free(buf);
            return 1;
        }
        if (r == 0)
            break;
        n += (size_t)r;
    }
    buf[n] = '\0';
    *data = buf;
    *len = n;
    return 0;
}

/* Parses the options common to both commands; returns -1 to go on, else an exit status. */
static int tok_cli_args(const char *cmd, int argc, char **argv, const char **path, const char *flag,
                        int *flag_set, void (*usage)(FILE *))
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--tokenizer")) {
            if (i + 1 >= argc) {
                fprintf(stderr, "river %s: --tokenizer needs a path\n", cmd);
                usage(stderr);
                return 2;
            }
            *path = argv[++i];
        } else if (!strncmp(a, "--tokenizer=", 12)) {
            *path = a + 12;
        } else if (!strcmp(a, flag)) {
            *flag_set = 1;
        } else if (!strcmp(cmd, "tokenize") &&
                   (!strcmp(a, "--output") || !strncmp(a, "--output=", 9))) {
            const char *v = a[8] == '=' ? a + 9 : (i + 1 < argc ? argv[++i] : NULL);
            if (!v || strcmp(v, "json") != 0) {
                fprintf(stderr, "river %s: --output supports only 'json'\n", cmd);
                usage(stderr);
                return 2;
            }
        } else {
            fprintf(stderr, "river %s: unknown option '%s'\n", cmd, a);
            usage(stderr);
            return 2;
        }
    }
    if (!*path || !**path) {
        fprintf(stderr, "river %s: --tokenizer PATH is required\n", cmd);
        usage(stderr);
        return 2;
    }
    return -1;
}

static int tok_cli_flush(const char *cmd)
{
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "river %s: writing stdout: %s\n", cmd, strerror(errno));
        return 1;
    }
    return 0;
}

int cmd_tokenize(int argc, char **argv)
{
    const char *path = NULL;
    int special = 0;
    int rc = tok_cli_args("tokenize", argc, argv, &path, "--special", &special, tokenize_usage);
    if (rc >= 0)
        return rc;

    tokenizer_t *t = NULL;
    int err = tokenizer_load(&t, path, 0);
    if (err)
        return cli_fail("tokenize", err);
    char *text = NULL;
    size_t len = 0;
    if (tok_cli_read_stdin("tokenize", &text, &len)) {
        tokenizer_destroy(&t);
        return 1;
    }
    int32_t *ids = NULL;
    size_t n = 0;
    err = tokenizer_encode(t, text, len, special, &ids, &n);
    free(text);
    if (err) {
        tokenizer_destroy(&t);
        return cli_fail("tokenize", err);
    }
    fputs("{\"ids\":[", stdout);
    for (size_t i = 0; i < n; i++)
        printf(i ? ",%d" : "%d", (int)ids[i]);
    fputs("]}\n", stdout);
    free(ids);
    tokenizer_destroy(&t);
    return tok_cli_flush("tokenize");
}

/* Reads the ids: a JSON array of integers, or an object whose "ids" is one (what `river
 * tokenize` prints). */
static int tok_cli_parse_ids(const char *data, size_t len, int32_t **ids, size_t *n)
{
    json_error_t je;
    json_t *root = json_loadb(data, len, JSON_DECODE_ANY, &je);
    if (!root) {
        fprintf(stderr, "river detokenize: stdin: invalid JSON at line %d, column %d: %s\n",
                je.line, je.column, je.text);
        return 1;
    }
    json_t *arr = json_is_object(root) ? json_object_get(root, "ids") : root;
    if (!json_is_array(arr)) {
        fprintf(stderr, "river detokenize: stdin: expected a JSON array of token ids\n");
        json_decref(root);
        return 1;
    }
    size_t count = json_array_size(arr);
    int32_t *v = malloc((count ? count : 1) * sizeof *v);
    if (!v) {
        fprintf(stderr, "river detokenize: out of memory\n");
        json_decref(root);
        return 1;
    }
    for (size_t i = 0; i < count; i++) {
        json_t *e = json_array_get(arr, i);
        if (!json_is_integer(e) || json_integer_value(e) < INT32_MIN ||
            json_integer_value(e) > INT32_MAX) {
            fprintf(stderr, "river detokenize: stdin: element %zu is not a token id\n", i);
            free(v);
            json_decref(root);
            return 1;
        }
        v[i] = (int32_t)json_integer_value(e);
    }
    json_decref(root);
    *ids = v;
    *n = count;
    return 0;
}

int cmd_detokenize(int argc, char **argv)
{
    const char *path = NULL;
    int skip = 0;
    int rc =
        tok_cli_args("detokenize", argc, argv, &path, "--skip-special", &skip, detokenize_usage);
    if (rc >= 0)
        return rc;

    tokenizer_t *t = NULL;
    int err = tokenizer_load(&t, path, 0);
    if (err)
        return cli_fail("detokenize", err);
    char *data = NULL;
    size_t len = 0;
    int32_t *ids = NULL;
    size_t n = 0;
    if (tok_cli_read_stdin("detokenize", &data, &len) || tok_cli_parse_ids(data, len, &ids, &n)) {
        free(data);
        tokenizer_destroy(&t);
        return 1;
    }
    free(data);
    char *text = NULL;
    size_t tlen = 0;
    err = tokenizer_decode(t, ids, n, skip, &text, &tlen);
    free(ids);
    tokenizer_destroy(&t);
    if (err)
        return cli_fail("detokenize", err);
    size_t w = fwrite(text, 1, tlen, stdout);
    free(text);
    if (w != tlen) {
        fprintf(stderr, "river detokenize: writing stdout: %s\n", strerror(errno));
        return 1;
    }
    return tok_cli_flush("detokenize");
}
