#include "engine/exit.h"

#include <stdlib.h>
#include <string.h>

static const char *const exit__rules[] = {"none", "cosine", "router", "fixed"};
static const char *const exit__kvs[] = {"river", "mask", "propagate", "recompute", "mono",
                                        "posthoc"};

const char *exit_rule_name(exit_rule_t r)
{
    return (unsigned)r < sizeof exit__rules / sizeof exit__rules[0] ? exit__rules[r] : "?";
}

const char *exit_kv_name(exit_kv_t k)
{
    return (unsigned)k < sizeof exit__kvs / sizeof exit__kvs[0] ? exit__kvs[k] : "?";
}

int exit_rule_parse(const char *s)
{
    for (size_t i = 0; i < sizeof exit__rules / sizeof exit__rules[0]; i++)
        if (!strcmp(s, exit__rules[i]))
            return (int)i;
    return -1;
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
