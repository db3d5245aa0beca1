#include <stdio.h>

#include "cli/cli.h"

int cmd_tokenize(int argc, char **argv)
{
    fprintf(stderr, "river tokenize: not built yet\n");
    return 1;
}

int cmd_detokenize(int argc, char **argv)
{
    fprintf(stderr, "river detokenize: not built yet\n");
    return 1;
}
