#include <stdio.h>

#include "cli/cli.h"

int cmd_bench(int argc, char **argv)
{
    fprintf(stderr, "river bench: not built yet\n");
    return 1;
}
