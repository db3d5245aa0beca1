#include <stdio.h>

#include "cli/cli.h"

int cmd_run(int argc, char **argv)
{
    fprintf(stderr, "river run: not built yet\n");
    return 1;
}
