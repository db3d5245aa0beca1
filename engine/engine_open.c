#include "engine/engine_open.h"

#include <dirent.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "common/err.h"
#include "common/gguf.h"
#include "kernels/backend.h"

int engine_find_tokenizer(const char *model_path, char *buf, size_t cap)
{
    struct stat st;
    if (stat(model_path, &st) != 0)
        return river_err_set(RIVER_ENOTFOUND, "%s: no such file or directory", model_path);
    /* A GGUF file carries its tokenizer (text/tokenizer_gguf.c reads it). */
    if (!S_ISDIR(st.st_mode) && gguf_path_is_gguf(model_path)) {
        snprintf(buf, cap, "%s", model_path);
        return 0;
    }
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", model_path);
    if (!S_ISDIR(st.st_mode)) {
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

int engine_open(engine_env_t *env, const engine_opts_t *o)
{
    memset(env, 0, sizeof *env);
    int e = model_load(&env->model, o->model);
    if (e)
        return e;
    if (o->want_tokenizer) {
        char found[PATH_MAX];
        const char *tok_path = o->tokenizer;
        if (!tok_path) {
            if ((e = engine_find_tokenizer(o->model, found, sizeof found)))
                goto fail;
            tok_path = found;
        }
        if ((e = tokenizer_load(&env->tok, tok_path, env->model->cfg.vocab_size)))
            goto fail;
    }
    /* A model whose weights fit the caches gains nothing from a second thread but the
     * cost of waking it every op; only larger models get every core by default. */
    int threads = o->threads;
    if (threads == 0 && model_bytes_per_token(env->model) < (64 << 20))
        threads = 1;
    if ((e = backend_open(&env->be, o->device, threads, o->weights)))
        goto fail;
    int begin = o->place_begin, end = o->place_end;
    if (!begin && !end)
        end = env->model->cfg.n_layers;
    if ((e = model_place_layers(env->model, env->be, begin, end, !o->place_no_ends)))
        goto fail;
    return 0;
fail:
    engine_close(env);
    return e;
}

void engine_close(engine_env_t *env)
{
    backend_destroy(&env->be);
    tokenizer_destroy(&env->tok);
    model_destroy(&env->model);
}
