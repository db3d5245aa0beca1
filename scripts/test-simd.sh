#!/bin/sh
# The kernel suites at every SIMD level this processor has: test_backend_ops (the op cases,
# each level against the scalar one and against the reference loops), test_ops and
# test_quant loop over the levels by themselves; test_golden and test_exit run once per
# level with RIVER_SIMD forcing it (the CPU backend reads the variable when it is asked for
# the best level).
set -u
B=${BUILD:-build}
levels="scalar avx2"
grep -qw avx512bw /proc/cpuinfo 2>/dev/null && levels="$levels avx512"
grep -qw avx512_bf16 /proc/cpuinfo 2>/dev/null && levels="$levels avx512bf16"
rc=0
scripts/run-tests.sh "$B/tests/test_backend_ops" "$B/tests/test_ops" "$B/tests/test_quant" || rc=1
for l in $levels; do
    echo "==== RIVER_SIMD=$l"
    RIVER_SIMD=$l scripts/run-tests.sh "$B/tests/test_golden" "$B/tests/test_exit" || rc=1
done
exit $rc
