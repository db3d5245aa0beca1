#!/bin/sh
# Runs every Check test binary (or suite script) given, from the repository root, and ends
# with the list of what was skipped, why each failing suite failed, and one summary line
# "N passed, N failed" counting individual checks across all suites. The reasons are repeated
# at the end because a CI log is often read from its tail, far below the suite's own output.
#
# A suite that cannot run something here prints one line "SKIP (<reason>): <why>"
# (tests/testutil.h, scripts/node-env.sh). Three reasons are a fact of the machine: no-gpu,
# no-cuda (no CUDA toolkit, or CUDA=0) and no-simd (the processor lacks that level). Any other
# reason means a suite did not run that could have: under CI=true it fails the run, so CI
# cannot go green on a suite that silently did not run.
set -u
pass=0
fail=0
failed_bins=""
skips=""
whys=""
nl='
'
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
        # Check's failure and error lines (file:line:F: or :E:, a timeout included), the
        # shell and Node suites' FAIL lines and the sanitizers' reports; failing those, the
        # suite's last lines (a crash or an exit before any check said anything).
        why=$(printf '%s\n' "$out" | grep -E ':[0-9]+:[EF]:|^FAIL|runtime error:|ERROR: [A-Za-z]+Sanitizer|^SUMMARY: ' | head -n 12)
        [ -z "$why" ] && why=$(printf '%s\n' "$out" | tail -n 5)
        whys="$whys$t (exit $rc):$nl$(printf '%s\n' "$why" | sed 's/^/    /')$nl"
    fi
    # One entry per distinct line: a suite that skips the same thing in every test says so once.
    s=$(printf '%s\n' "$out" | sed -n 's/^SKIP (\([a-z-]*\)): \(.*\)$/\1\t\2/p' | awk '!seen[$0]++')
    [ -n "$s" ] && skips="$skips$(printf '%s\n' "$s" | sed "s|^|$t\t|")$nl"
done
echo
bad=""
if [ -n "$skips" ]; then
    echo "skipped:"
    printf '%s' "$skips" | while IFS='	' read -r suite reason why; do
        echo "  $suite: $why [$reason]"
    done
    bad=$(printf '%s' "$skips" | awk -F '\t' '$2 != "no-gpu" && $2 != "no-cuda" && $2 != "no-simd" {print $1}' |
        awk '!seen[$0]++' | tr '\n' ' ')
fi
if [ -n "$bad" ] && [ "${CI:-}" = "true" ]; then
    echo "CI=true: these suites skipped for a reason other than no GPU, no CUDA toolkit or a" \
        "SIMD level the processor lacks, so they did not run: $bad"
    failed_bins="$failed_bins $bad"
    fail=$((fail + $(echo $bad | wc -w)))
fi
if [ -n "$whys" ]; then
    echo "why they failed:"
    printf '%s' "$whys" | sed 's/^/  /'
fi
[ -n "$failed_bins" ] && echo "failing suites:$failed_bins"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ] && [ -z "$failed_bins" ]
