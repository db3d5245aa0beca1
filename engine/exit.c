#include "engine/exit.h"

#include <stdlib.h>
#include <string.h>

/* NULL-terminated, so that configuration schemas can take them as an enum's choices. */
const char *const exit_rule_names[] = {"none", "cosine", "router", "fixed", NULL};
const char *const exit_agg_names[] = {"min", "row", NULL};
static const char *const exit__kvs[] = {"river", "mask", "propagate", "recompute", "mono",
                                        "posthoc"};

/* The name at index i of a NULL-terminated table, "?" past its end. */
static const char *exit__name(const char *const *names, unsigned i)
{
    for (unsigned k = 0; names[k]; k++)
        if (k == i)
            return names[k];
    return "?";
}

static int exit__parse(const char *const *names, const char *s)
{
    for (int i = 0; names[i]; i++)
        if (!strcmp(s, names[i]))
            return i;
    return -1;
}

const char *exit_rule_name(exit_rule_t r)
{
    return exit__name(exit_rule_names, (unsigned)r);
}

const char *exit_agg_name(exit_agg_t a)
{
    return exit__name(exit_agg_names, (unsigned)a);
}

const char *exit_kv_name(exit_kv_t k)
{
    return (unsigned)k < sizeof exit__kvs / sizeof exit__kvs[0] ? exit__kvs[k] : "?";
}

int exit_rule_parse(const char *s)
{
    return exit__parse(exit_rule_names, s);
}

int exit_agg_parse(const char *s)
{
    return exit__parse(exit_agg_names, s);
}

int exit_kv_parse(const char *s)
{
    for (size_t i = 0; i < sizeof exit__kvs / sizeof exit__kvs[0]; i++)
        if (!strcmp(s, exit__kvs[i]))
            return (int)i;
    return -1;
}

void exit_seq_init(exit_seq_t *s) { memset(s, 0, sizeof *s); }

void exit_seq_free(exit_seq_t *s)
{
    free(s->kv_valid);
    free(s->pending_pos);
    free(s->pending_layer);
    free(s->pending_h);
    memset(s, 0, sizeof *s);
}
