#include <stdlib.h>

#include "cli/cli.h"

static int cli__cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double cli_median(double *v, int n)
{
    if (n <= 0)
        return 0;
    qsort(v, (size_t)n, sizeof *v, cli__cmp);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int cli_repeats(long given, double first_s)
{
    if (given > 0)
        return (int)given;
    return first_s < CLI_REPEAT_SHORT_S ? CLI_REPEAT_DEFAULT : 1;
}
