/* Opening what the commands share: a model, its tokenizer and a backend (the CPU, or with
 * --device cuda the CUDA backend when built in). */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/cli.h"
#include "common/err.h"
#include "kernels/cpu/cpu.h"
#ifdef RIVER_CUDA
#include "kernels/cuda/cuda.h"
#endif

/* Set once from a command's options before cli_env_open; commands run one per process. */
static int cli_use_cuda;

int cli_env_set_device(const char *name)
{
    if (!strcmp(name, "cpu")) {
        cli_use_cuda = 0;
        return 0;
    }
    if (strcmp(name, "cuda"))
        return river_err_set(RIVER_EINVAL, "device '%s': use cpu or cuda", name);
#ifdef RIVER_CUDA
    cli_use_cuda = 1;
    return 0;
#else
    return river_err_set(RIVER_EUNSUPPORTED, "device cuda: built without the CUDA backend "
                         "(make CUDA=1)");
#endif
}

int cli_env_is_cpu(const cli_env_t *env)
{
    return env->be && !strcmp(env->be->ops->name, "cpu");
}

const char *cli_env_simd_name(const cli_env_t *env)
{
    return cli_env_is_cpu(env) ? cpu_simd_name(cpu_backend_simd(env->be)) : "none";
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
    struct stat st;
    if (stat(model_path, &st) != 0)
        return river_err_set(RIVER_ENOTFOUND, "%s: no such file or directory", model_path);
    char dir[PATH_MAX];
    if (S_ISDIR(st.st_mode)) {
        snprintf(dir, sizeof dir, "%s", model_path);
    } else {
        snprintf(dir, sizeof dir, "%s", model_path);
        char *slash = strrchr(dir, '/');
        if (slash)
            *slash = '\0';
        else
            snprintf(dir, sizeof dir, ".");
    }
    snprintf(buf, cap, "%s/tokenizer.json", dir);
    if (stat(buf, &st) == 0)
        return 0;
    /* A llama2.c model keeps its tokenizer as tok<N>.bin beside it. */
    DIR *d = opendir(dir);
    if (!d)
        return river_err_set(RIVER_ENOTFOUND, "%s: cannot list directory", dir);
    int found = 0;
    struct dirent *ent;
    while ((ent = readdir(d))) {
        size_t len = strlen(ent->d_name);
        if (!strncmp(ent->d_name, "tok", 3) && len > 7 && !strcmp(ent->d_name + len - 4, ".bin")) {
            snprintf(buf, cap, "%s/%s", dir, ent->d_name);
            found++;
        }
    }
    closedir(d);
    if (found == 1)
        return 0;
    return river_err_set(RIVER_ENOTFOUND, "%s: no tokenizer.json or single tok*.bin beside the "
                         "model; pass --tokenizer", dir);
}

int cli_env_open(cli_env_t *env, const char *model_path, const char *tok_path, int n_threads,
                 int want_tok)
{
    memset(env, 0, sizeof *env);
    int e = model_load(&env->model, model_path);
    if (e)
        return e;
    if (want_tok) {
        char found[PATH_MAX];
        if (!tok_path) {
            e = cli_find_tokenizer(model_path, found, sizeof found);
            if (e)
                goto fail;
            tok_path = found;
        }
        e = tokenizer_load(&env->tok, tok_path, env->model->cfg.vocab_size);
        if (e)
            goto fail;
    }
    /* A model whose weights fit the caches gains nothing from a second thread but the
     * cost of waking it every op; only larger models get every core by default. */
    if (n_threads == 0 && model_bytes_per_token(env->model) < (64 << 20))
        n_threads = 1;
#ifdef RIVER_CUDA
    if (cli_use_cuda) {
        e = cuda_backend_new(&env->be, 0);
        if (!e)
            e = cuda_model_upload(env->be, env->model);
        if (e)
            goto fail;
        return 0;
    }
#endif
    e = cpu_backend_new(&env->be, n_threads, CPU_SIMD_COUNT);
    if (e)
        goto fail;
    return 0;
fail:
    cli_env_close(env);
    return e;
}

void cli_env_close(cli_env_t *env)
{
#ifdef RIVER_CUDA
    /* The backend goes before the model: it owns the device copies the model points at. */
    if (env->be && !cli_env_is_cpu(env))
        cuda_backend_destroy(&env->be);
#endif
    cpu_backend_destroy(&env->be);
    tokenizer_destroy(&env->tok);
    model_destroy(&env->model);
}
