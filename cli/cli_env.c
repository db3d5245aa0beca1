/* What the commands share: options into an engine (engine/engine_open.h) on the device a
 * command's --device named, and strict number parsing. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "cli/cli.h"
#include "engine/generate.h"
#include "common/err.h"
#include "kernels/backend.h"

/* Set once from a command's options before cli_env_open; commands run one per process. */
static char cli_device[32] = "cpu";
static backend_weights_t cli_weights = BACKEND_WEIGHTS_COPY;
static int cli_kv_dtype = GEN_KV_AUTO;

int cli_env_set_device(const char *name)
{
    backend_kind_t kind;
    int index;
    int e = backend_parse_device(name, &kind, &index);
    if (e)
        return e;
    snprintf(cli_device, sizeof cli_device, "%s", name);
    return 0;
}

int cli_env_set_kv_dtype(const char *name)
{
    return gen_kv_dtype_parse(name, &cli_kv_dtype);
}

int cli_env_kv_dtype(void) { return cli_kv_dtype; }

int cli_env_set_weights(const char *mode)
{
    if (!strcmp(mode, "copy") || !strcmp(mode, "mapped")) {
        cli_weights = mode[0] == 'm' ? BACKEND_WEIGHTS_MAPPED : BACKEND_WEIGHTS_COPY;
        return 0;
    }
    return river_err_set(RIVER_EINVAL, "weights '%s': use copy (large matrices in huge "
                         "pages, the default) or mapped (read in the mapped checkpoint)", mode);
}

int cli_env_is_cpu(const cli_env_t *env)
{
    return env->be && backend_is_host(env->be);
}

/* The CPU kernels' level, as the backend names its variant; a GPU runs none. */
const char *cli_env_simd_name(const cli_env_t *env)
{
    static backend_info_t bi;
    if (!env->be)
        return "none";
    backend_get_info(env->be, &bi);
    return bi.threads > 0 ? bi.variant : "none";
}

int cli_parse_int(const char *s, long min, long max, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < min || v > max)
        return -1;
    *out = v;
    return 0;
}

int cli_parse_float(const char *s, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v))
        return -1;
    *out = v;
    return 0;
}

int cli_find_tokenizer(const char *model_path, char *buf, size_t cap)
{
    return engine_find_tokenizer(model_path, buf, cap);
}

int cli_env_open(cli_env_t *env, const char *model_path, const char *tok_path, int n_threads,
                 int want_tok)
{
    engine_opts_t o = {.model = model_path, .tokenizer = tok_path, .want_tokenizer = want_tok,
                       .device = cli_device, .threads = n_threads,
                       .weights = cli_weights};
    return engine_open(env, &o);
}

void cli_env_close(cli_env_t *env)
{
    engine_close(env);
}

void cli_json_print(json_t *o)
{
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    if (s)
        printf("%s\n", s);
    free(s);
    json_decref(o);
}
