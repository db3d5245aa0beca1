#!/bin/sh
# Runs every Check test binary given, from the repository root, and ends with one summary
# line "N passed, N failed" counting individual checks across all suites.
set -u
pass=0
fail=0
failed_bins=""
for t in "$@"; do
    echo "== $t"
    out=$(CK_DEFAULT_TIMEOUT=${CK_DEFAULT_TIMEOUT:-600} "$t" 2>&1)
    rc=$?
    printf '%s\n' "$out"
    line=$(printf '%s\n' "$out" | grep -E '^[0-9]+%: Checks: ' | tail -n 1)
    if [ -n "$line" ]; then
        c=$(echo "$line" | sed -E 's/.*Checks: ([0-9]+).*/\1/')
        f=$(echo "$line" | sed -E 's/.*Failures: ([0-9]+).*/\1/')
        e=$(echo "$line" | sed -E 's/.*Errors: ([0-9]+).*/\1/')
        pass=$((pass + c - f - e))
        fail=$((fail + f + e))
    fi
    if [ $rc -ne 0 ] || [ -z "$line" ]; then
        failed_bins="$failed_bins $t"
        [ -z "$line" ] && fail=$((fail + 1))
    fi
done
echo
[ -n "$failed_bins" ] && echo "failing suites:$failed_bins"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ] && [ -z "$failed_bins" ]
