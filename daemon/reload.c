/* SIGHUP and admin Reload: riverd reads its configuration file again and compares it,
 * key by key through the schema, with the one it runs.
 *
 * What changes live: the queue length, the per-request limits except the frame size,
 * the per-client request limit, the drain timeout and the log level. What needs a
 * restart, and why:
 *   endpoints.*             the sockets and the HTTP port are bound at start;
 *   limits.max_frame_bytes  ZMQ's own message limit is set on the sockets at start;
 *   limits.max_client_backlog  so is the client socket's send high-water mark;
 *   heartbeat.*             workers were told the interval in their Welcome;
 *   local_workers           the running processes were started from it (admin Scale
 *                           changes their number live);
 *   auth.*                  the mechanism is set on the sockets, and the keys are read,
 *                           at start (so adding or revoking a key takes a restart).
 * A file that does not load changes nothing; the error names file:line:column. */
#include <stdio.h>
#include <string.h>

#include "common/err.h"
#include "daemon/riverd.h"

static const char *const reload__live[] = {
    "queue_length",          "limits.max_prompt_tokens", "limits.max_tokens",
    "limits.max_stop_strings", "limits.max_prompt_bytes", "limits.max_stop_length",
    "limits.max_requests_per_client", "limits.max_requests_per_key", "drain_timeout",
    "log_level",
};

static bool reload__is_live(const char *name)
{
    for (size_t i = 0; i < sizeof reload__live / sizeof reload__live[0]; i++)
        if (!strcmp(reload__live[i], name))
            return true;
    return false;
}

static bool reload__strv_equal(const config_strv_t *a, const config_strv_t *b)
{
    if (a->n != b->n)
        return false;
    for (int i = 0; i < a->n; i++)
        if (strcmp(a->v[i], b->v[i]))
            return false;
    return true;
}

/* Whether the value of key k is the same in the structs a and b. */
static bool reload__equal(const config_key_t *k, const void *a, const void *b)
{
    const char *pa = (const char *)a + k->offset, *pb = (const char *)b + k->offset;
    switch (k->type) {
    case CONFIG_SECTION:
        return true;
    case CONFIG_INT:
    case CONFIG_ENUM:
        return *(const int *)pa == *(const int *)pb;
    case CONFIG_FLOAT:
        return *(const double *)pa == *(const double *)pb;
    case CONFIG_BOOL:
        return *(const bool *)pa == *(const bool *)pb;
    case CONFIG_DURATION:
        return *(const int64_t *)pa == *(const int64_t *)pb;
    case CONFIG_STRING:
        return !strcmp(*(char *const *)pa, *(char *const *)pb);
    case CONFIG_LIST:
        return reload__strv_equal((const config_strv_t *)pa, (const config_strv_t *)pb);
    case CONFIG_ITEMS: {
        const config_items_t *ia = (const config_items_t *)pa, *ib = (const config_items_t *)pb;
        if (ia->n != ib->n)
            return false;
        for (int i = 0; i < ia->n; i++) {
            const char *ea = (const char *)ia->v + (size_t)i * k->sub->size;
            const char *eb = (const char *)ib->v + (size_t)i * k->sub->size;
            for (size_t j = 0; j < k->sub->n_keys; j++)
                if (!reload__equal(&k->sub->keys[j], ea, eb))
                    return false;
        }
        return true;
    }
    }
    return false;
}

/* Size of a live key's value; live keys are all plain values. */
static size_t reload__size(config_type_t t)
{
    switch (t) {
    case CONFIG_INT:
    case CONFIG_ENUM:
        return sizeof(int);
    case CONFIG_FLOAT:
        return sizeof(double);
    case CONFIG_BOOL:
        return sizeof(bool);
    case CONFIG_DURATION:
        return sizeof(int64_t);
    default:
        return 0;
    }
}

int reload_config(riverd_t *rd, const char **applied, int *n_applied, const char **restart,
                  int *n_restart, int max)
{
    *n_applied = *n_restart = 0;
    if (!rd->config_path)
        return river_err_set(RIVER_ESTATE, "riverd was started without a configuration file");
    config_riverd_t nc;
    int rc = config_load(&config_schema_riverd, rd->config_path, &nc);
    if (rc < 0)
        return rc;
    const config_schema_t *s = &config_schema_riverd;
    for (size_t i = 0; i < s->n_keys; i++) {
        const config_key_t *k = &s->keys[i];
        if (k->type == CONFIG_SECTION || reload__equal(k, &rd->cfg, &nc))
            continue;
        size_t sz = reload__size(k->type);
        if (reload__is_live(k->name) && sz) {
            memcpy((char *)&rd->cfg + k->offset, (const char *)&nc + k->offset, sz);
            if (*n_applied < max)
                applied[(*n_applied)++] = k->name;
        } else if (*n_restart < max) {
            restart[(*n_restart)++] = k->name;
        }
    }
    config_free(&config_schema_riverd, &nc);
    log_set_level(rd->cfg.log_level);
    /* A longer queue or a new limit may let waiting requests through. */
    rd->pump = true;
    char a[512] = "", r[512] = "";
    for (int i = 0; i < *n_applied; i++)
        snprintf(a + strlen(a), sizeof a - strlen(a), "%s%s", i ? ", " : "", applied[i]);
    for (int i = 0; i < *n_restart; i++)
        snprintf(r + strlen(r), sizeof r - strlen(r), "%s%s", i ? ", " : "", restart[i]);
    log_info("reloaded %s: applied [%s], needs restart [%s]", rd->config_path, a, r);
    return 0;
}
