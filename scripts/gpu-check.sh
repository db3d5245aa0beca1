#!/bin/sh
# The checks that need a GPU, in one run on the GPU machine (one H200, within 8 minutes:
# the step timeouts add up to 450 s): build with the CUDA backend required (CUDA=1), run
# the CUDA parity tests (every op against the CPU backend, the stories260K goldens on the
# GPU), then
# `river bench --device cuda` on a synthesized Llama 3.2 1B bf16 checkpoint, with the CPU
# bench of the same checkpoint beside it for scale.
#
# Writes summary.txt and one log per step under $OUT when it is set (else under
# $BUILD/gpu-check). Exits non-zero when any step fails; later steps still run so that one
# run shows everything.
#
# Environment: BUILD (build directory, default build-gpu), JOBS (make -j, default: cores),
# CUDA_ARCHS (default 90: only the H200's, to keep the build short).
set -u

cd "$(dirname "$0")/.." || exit 1
BUILD=${BUILD:-build-gpu}
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 4)}
CUDA_ARCHS=${CUDA_ARCHS:-90}
DEST=${OUT:-$BUILD/gpu-check}
mkdir -p "$DEST" || exit 1
SUMMARY=$DEST/summary.txt
: >"$SUMMARY"
status=0

say() {
    echo "$*" | tee -a "$SUMMARY"
}

# step NAME TIMEOUT_S COMMAND...: runs the command with its output in $DEST/NAME.log and
# one line in the summary.
step() {
    name=$1
    limit=$2
    shift 2
    t0=$(date +%s)
    timeout "$limit" "$@" >"$DEST/$name.log" 2>&1
    rc=$?
    t1=$(date +%s)
    if [ "$rc" -eq 0 ]; then
        say "ok    $name ($((t1 - t0)) s)"
    else
        say "FAIL  $name (exit $rc after $((t1 - t0)) s; see $name.log)"
        status=1
    fi
    return "$rc"
}

say "gpu-check $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname)"
if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader \
        2>&1 | tee -a "$SUMMARY"
else
    say "nvidia-smi: not found"
fi

# The build target without the package check (the GPU machine has no network).
if ! step build 150 make BUILD="$BUILD" CUDA=1 CUDA_ARCHS="$CUDA_ARCHS" -j"$JOBS" build-all; then
    say "build failed: nothing else to run"
    exit 1
fi

# The parity tests; their per-op error lines go to the summary too.
step cuda-tests 100 "$BUILD/tests/test_cuda_ops"
grep -E '^(cuda |[0-9]+%: Checks)' "$DEST/cuda-tests.log" >>"$SUMMARY"
# On this machine a skip is a failure: the point of the run is the GPU.
if grep -q '^no CUDA device' "$DEST/cuda-tests.log"; then
    say "FAIL  cuda-tests skipped: $(grep -m 1 '^no CUDA device' "$DEST/cuda-tests.log")"
    status=1
fi

RIVER=$BUILD/bin/river
SYNTH=$BUILD/synth/llama-3.2-1b-bf16
if [ ! -f "$SYNTH/model.safetensors" ]; then
    mkdir -p "$(dirname "$SYNTH")"
    step synth 60 "$RIVER" synth --shape llama-3.2-1b --dtype bf16 --out "$SYNTH"
fi

step bench-stories-cuda 20 "$RIVER" bench --model tests/data/stories260K/stories260K.bin \
    --device cuda --runs 3 --bandwidth-mib 256
# The bench's bandwidth sweep measures the host; keep it short. Its roofline_fraction is
# against host memory, so the GPU's is worked out here against the H200's 4.8 TB/s.
step bench-1b-cuda 60 "$RIVER" bench --model "$SYNTH" --device cuda --runs 3 \
    --prompt-len 128 --gen-len 64 --bandwidth-mib 256
tail -n 8 "$DEST/bench-1b-cuda.log" >>"$SUMMARY"
awk '$1 == "decode_tok_s" { t = $2 } $1 == "bytes_per_token" { b = $2 }
     END { if (t > 0 && b > 0)
               printf "h200_roofline_fraction %.3f (of 4.8 TB/s)\n", t * b / 4.8e12 }' \
    "$DEST/bench-1b-cuda.log" | tee -a "$SUMMARY"
step bench-1b-cpu 40 "$RIVER" bench --model "$SYNTH" --runs 1 --prompt-len 16 --gen-len 8 \
    --bandwidth-mib 256
tail -n 8 "$DEST/bench-1b-cpu.log" >>"$SUMMARY"
step run-stories-cuda 20 "$RIVER" run --model tests/data/stories260K/stories260K.bin \
    --device cuda --prompt "Once upon a time" --max-tokens 32
tail -n 3 "$DEST/run-stories-cuda.log" >>"$SUMMARY"

if [ "$status" -eq 0 ]; then
    say "gpu-check: all steps passed"
else
    say "gpu-check: some steps FAILED"
fi
exit "$status"
