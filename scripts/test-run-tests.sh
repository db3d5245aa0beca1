#!/bin/sh
# The test runner's skip list as a suite of `make test`: scripts/run-tests.sh over small
# fake suites lists each skip with its reason before the closing line, accepts the three
# hardware reasons under CI=true, and under CI=true fails a run where a suite skipped for
# anything else, naming that suite; a failing suite's reason is repeated at the end.
set -u
here=$(cd "$(dirname "$0")" && pwd)
. "$here/suite-lib.sh"
has() { printf '%s\n' "$1" | grep -qF -- "$2"; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
suite() { # file, then the lines it prints before its count line
    f=$tmp/$1; shift
    { echo '#!/bin/sh'; for l in "$@"; do printf "echo '%s'\n" "$l"; done
      echo "echo '100%: Checks: 2, Failures: 0, Errors: 0'"; } > "$f"
    chmod +x "$f"
}
suite hw 'SKIP (no-gpu): no CUDA device (no GPU)' 'SKIP (no-gpu): no CUDA device (no GPU)' \
    'SKIP (no-cuda): built without the CUDA backend' 'SKIP (no-simd): no avx512 on this processor'
suite npmless 'SKIP (missing): client: node is not installed'
suite plain 'ok'

out=$(CI=true "$here/run-tests.sh" "$tmp/hw" "$tmp/plain" 2>&1)
rc=$?
check "hardware skips pass under CI=true" test "$rc" -eq 0
check "each skip is listed once with its reason" \
    test "$(printf '%s\n' "$out" | grep -c 'hw: no CUDA device (no GPU) \[no-gpu\]')" -eq 1
check "the list comes before the closing line" \
    sh -c 'printf "%s\n" "$1" | tail -n 1 | grep -qx "4 passed, 0 failed"' _ "$out"

out=$(CI= "$here/run-tests.sh" "$tmp/npmless" "$tmp/plain" 2>&1)
rc=$?
check "a missing program is listed but passes outside CI" test "$rc" -eq 0
check "the listed skip names what is missing" has "$out" "npmless: client: node is not installed [missing]"

out=$(CI=true "$here/run-tests.sh" "$tmp/hw" "$tmp/npmless" "$tmp/plain" 2>&1)
rc=$?
printf '%s\n' "$out" | grep -E '^(CI=true|failing suites|[0-9]+ passed)'
check "under CI=true a missing program fails the run" test "$rc" -ne 0
check "the failure names the suite" has "$out" "failing suites: $tmp/npmless"
check "the closing line counts it as a failure" has "$out" "6 passed, 1 failed"

# A Check suite that fails one test and prints pages after it: its failure line comes back
# in the summary, below everything the suite printed. One that dies without a word: its last
# lines do.
f=$tmp/failing
{ echo '#!/bin/sh'
  echo "echo 'tests/test_x.c:42:F:cpu:test_peak:0: avx2 f32 peak 3.1 against scalar 2.9'"
  echo 'i=0; while [ $i -lt 200 ]; do echo "noise $i"; i=$((i + 1)); done'
  echo "echo '50%: Checks: 2, Failures: 1, Errors: 0'"; echo 'exit 1'; } > "$f"
printf '#!/bin/sh\necho "loading weights"\nkill -SEGV $$\n' > "$tmp/crash"
chmod +x "$f" "$tmp/crash"
out=$(CI= "$here/run-tests.sh" "$tmp/failing" "$tmp/crash" "$tmp/plain" 2>&1)
rc=$?
tailout=$(printf '%s\n' "$out" | tail -n 8)
printf '%s\n' "$tailout"
check "a failing suite fails the run" test "$rc" -ne 0
check "its failure line is in the run's last lines" has "$tailout" \
    "tests/test_x.c:42:F:cpu:test_peak:0: avx2 f32 peak 3.1 against scalar 2.9"
check "a silent crash is shown by its last line" has "$tailout" "loading weights"
check "the closing line stays last" \
    sh -c 'printf "%s\n" "$1" | tail -n 1 | grep -qx "3 passed, 2 failed"' _ "$out"

suite_end
