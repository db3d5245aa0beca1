# Sourced by the suite scripts of `make test` (test-check-layers.sh, test-run-tests.sh):
# check NAME CMD... counts one check that passes when CMD succeeds; suite_end prints the
# Check-style summary line scripts/run-tests.sh reads and returns the suite's status.
checks=0
fails=0
check() {
    checks=$((checks + 1))
    name=$1; shift
    if "$@"; then echo "ok: $name"; else echo "FAILED: $name"; fails=$((fails + 1)); fi
}
suite_end() {
    echo "$(( (checks - fails) * 100 / checks ))%: Checks: $checks, Failures: $fails, Errors: 0"
    [ "$fails" -eq 0 ]
}
