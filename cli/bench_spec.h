/* river bench --spec-costs: the measured step times behind lossless mode's cost model. */
#ifndef RIVER_CLI_BENCH_SPEC_H
#define RIVER_CLI_BENCH_SPEC_H

#include "cli/cli.h"

/* Times, at a context of ctx positions: the plain decode step (one row, full backbone),
 * the draft step (one row that leaves the backbone after exit_layer layers and finishes
 * on the river: the fixed rule, since random weights never pass a similarity rule) and
 * verify passes of k+1 rows for k = 1..k_max; then prints the speed-up they predict at
 * acceptance rates 0.8, 0.9, 0.95, 0.98 and the best k for each. Median of runs. */
int bench_spec_costs(cli_env_t *env, const char *river_path, int exit_layer, int k_max,
                     int ctx, int runs, int json);

#endif
