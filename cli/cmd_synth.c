#include <stdio.h>

#include "cli/cli.h"

int cmd_synth(int argc, char **argv)
{
    fprintf(stderr, "river synth: not built yet\n");
    return 1;
}
