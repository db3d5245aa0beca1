#include <stdio.h>

#include "cli/cli.h"

int cmd_info(int argc, char **argv)
{
    fprintf(stderr, "river info: not built yet\n");
    return 1;
}
