/* The early-exit rules' and aggregations' names (common/exit_names.h). */
#include "common/exit_names.h"

#include <stddef.h>
#include <string.h>

const char *const exit_names_rules[] = {"none", "cosine", "router", "fixed", NULL};
const char *const exit_names_aggs[] = {"min", "row", NULL};

int exit_names_find(const char *const *names, const char *s)
{
    for (int i = 0; names[i]; i++)
        if (!strcmp(s, names[i]))
            return i;
    return -1;
}
