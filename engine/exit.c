#include "engine/exit.h"

#include <stdlib.h>
#include <string.h>

#include "common/exit_names.h"

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

const char *exit_rule_name(exit_rule_t r)
{
    return exit__name(exit_names_rules, (unsigned)r);
}

const char *exit_agg_name(exit_agg_t a)
{
    return exit__name(exit_names_aggs, (unsigned)a);
}

const char *exit_kv_name(exit_kv_t k)
{
    return (unsigned)k < sizeof exit__kvs / sizeof exit__kvs[0] ? exit__kvs[k] : "?";
}

int exit_rule_parse(const char *s)
{
    return exit_names_find(exit_names_rules, s);
}

int exit_agg_parse(const char *s)
{
    return exit_names_find(exit_names_aggs, s);
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
