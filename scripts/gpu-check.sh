#!/bin/sh
# The checks that need a GPU, for the day one is lent. That machine has the CUDA driver
# (and CUDA's libraries inside its Python packages) but no Debian -dev packages and no
# network, so nothing is built there: `make gpu-bundle` builds here (CUDA=1, CUDA_ARCHS=90)
# and packs the binaries and the shared libraries they need into gpu-bundle/bundle.tar.xz
# (scripts/gpu-bundle.sh); this script, run there from the repository root, unpacks it,
# finds the machine's own cuBLAS, cuBLASLt and NCCL, and runs the steps below, each with a
# time limit and a log of its own:
#
#   probe      what the machine is: its C library, driver and GPUs, where the libraries the
#              bundle leaves out were found, and every bundled program's libraries (ldd)
#   ops        tests/test_cuda_ops: what is the CUDA backend's own (upload slots, the error
#              for a missing device, the stories260K goldens end to end with graphs)
#   backend_ops tests/test_backend_ops: the one op case list, the CPU backend against the
#              opaque one, its own SIMD levels and the CUDA backend, and each case's
#              double-precision reference
#   backend    the backend suite (test_backend) with RIVER_TEST_DEVICE=cuda
#   golden exit generate router worker split
#              the engine suites with RIVER_TEST_DEVICE=cuda (the same list as
#              make test-opaque): CUDA goldens, exit policies, the split pair
#   kernels    river-cuda-bench: per-kernel GB/s against a measured device-to-device copy
#   bench-bf16 river bench --device cuda on a synthesized Llama 3.2 1B bf16 checkpoint
#   graphs     bench-bf16 again with RIVER_CUDA_GRAPHS=1 (decode steps as CUDA graphs), and
#              its decode tokens/s over bench-bf16's
#   long-ctx   the same with a 2048-token prompt (decode at a 2k context)
#   river-q4   a 4-bit river of that checkpoint (river quant), then a river decode on it
#   exit-speed decode tokens/s of that checkpoint alone and leaving the backbone after 4 of
#              its 16 layers onto the 4-bit river (a fixed exit), and the ratio
#   split-costs river bench --split-costs: a river layer's time against a backbone layer's,
#              1 to 64 rows
#   profile    river bench --profile: one decode step op by op (each op synced)
#   profile-river the same with every token leaving after 4 layers onto the 4-bit river:
#              a river layer's ops against a backbone layer's
#   memcheck   compute-sanitizer memcheck of a few stories260K tokens (skipped where the
#              machine has no compute-sanitizer)
#
# usage: scripts/gpu-check.sh [--only STEP[,STEP...]] [--list]
#        (or STEPS="STEP ..." in the environment; --only wins)
#
# Output: summary.txt and logs.tar.gz (every step's NAME.log, archived again after every
# step) under $OUT when it is set, else the same and logs/ under build-gpu/gpu-check/. A
# failed step's last lines go into the summary too, which ends with the --only line that
# reruns just the failed steps.
#
# Exit status: 0 when every step that ran passed, 1 when one failed, 2 when no GPU is
# visible (every step then says "skip ... (no GPU)"; nothing is run), 3 for a missing
# bundle or a bad argument.
#
# Environment: BUNDLE (default gpu-bundle/bundle.tar.xz; a directory laid out like a build
# directory works too, e.g. BUNDLE=build-gpu), SYNTH_DIR (where the synthesized checkpoint
# is kept between runs on one machine, default /tmp/river-synth).
set -u

cd "$(dirname "$0")/.." || exit 3
# In the order that brings back the most if the run is cut short: what the machine is, the
# op tests of the backend itself, the speed figures, then the engine suites. All of it took
# 226 s on the H200 (the op list 116 s of them).
ALL_STEPS="probe ops kernels bench-bf16 exit-speed split-costs golden exit generate split \
profile profile-river graphs backend_ops worker router river-q4 backend long-ctx memcheck"

only=${STEPS:-}
while [ $# -gt 0 ]; do
    case "$1" in
    --only)
        [ $# -ge 2 ] || { echo "gpu-check: --only needs a step list" >&2; exit 3; }
        only=$(echo "$2" | tr ',' ' ')
        shift 2
        ;;
    --only=*)
        only=$(echo "${1#--only=}" | tr ',' ' ')
        shift
        ;;
    --list)
        echo "$ALL_STEPS"
        exit 0
        ;;
    *)
        echo "usage: scripts/gpu-check.sh [--only STEP[,STEP...]] [--list]" >&2
        exit 3
        ;;
    esac
done
selected=${only:-$ALL_STEPS}
for s in $selected; do
    case " $ALL_STEPS " in
    *" $s "*) ;;
    *)
        echo "gpu-check: no step '$s' (steps: $ALL_STEPS)" >&2
        exit 3
        ;;
    esac
done

# The summary and the archive of the logs are written where they come back from ($OUT), the
# archive again after every step: a run cut short by the outer time limit still returns
# every step that finished. Under $OUT the logs themselves stay out of it, since a lent
# machine sends back at most 8 files and there are more steps than that.
DEST=${OUT:-build-gpu/gpu-check}
if [ -n "${OUT:-}" ]; then
    LOGS=$(mktemp -d "${TMPDIR:-/tmp}/gpu-check-logs.XXXXXX")/logs || exit 3
else
    LOGS=$DEST/logs
fi
rm -rf "$LOGS"
mkdir -p "$DEST" "$LOGS" || exit 3
SUMMARY=$DEST/summary.txt
: >"$SUMMARY"
failed=""

say() {
    echo "$*" | tee -a "$SUMMARY"
}

archive() {
    tar -C "$LOGS" -czf "$DEST/logs.tar.gz.part" . 2>/dev/null &&
        mv "$DEST/logs.tar.gz.part" "$DEST/logs.tar.gz" ||
        echo "gpu-check: could not write $DEST/logs.tar.gz" >&2
}

finish() {
    rc=$1
    if [ -n "$failed" ]; then
        say "gpu-check: FAILED:$failed"
        say "rerun them: scripts/gpu-check.sh --only $(echo $failed | tr ' ' ',')"
    elif [ "$rc" -eq 0 ]; then
        say "gpu-check: every step that ran passed"
    fi
    archive
    [ -n "${WORK:-}" ] && rm -rf "$WORK"
    exit "$rc"
}

say "gpu-check $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname 2>/dev/null || echo '?'): $selected"

# ---- the GPU -------------------------------------------------------------------------
gpu=0
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
    gpu=1
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 |
        tee -a "$SUMMARY"
fi
if [ "$gpu" -eq 0 ]; then
    for s in $selected; do
        say "skip  $s (no GPU)"
    done
    say "gpu-check: no GPU visible (nvidia-smi lists none): nothing was run"
    finish 2
fi

# ---- the bundle ----------------------------------------------------------------------
BUNDLE=${BUNDLE:-gpu-bundle/bundle.tar.xz}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu-check.XXXXXX") || finish 3
if [ -f "$BUNDLE" ]; then
    B=$WORK/bundle
    # Python's tarfile where tar has no xz beside it.
    mkdir -p "$B" && { tar -C "$B" -xJf "$BUNDLE" 2>/dev/null ||
        python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' \
            "$BUNDLE" "$B"; } || { say "gpu-check: cannot unpack $BUNDLE"; finish 3; }
    head -n 3 "$B/MANIFEST" | tee -a "$SUMMARY"
elif [ -d "$BUNDLE" ] && [ -x "$BUNDLE/bin/river" ]; then
    B=$BUNDLE
else
    say "gpu-check: no bundle at $BUNDLE: run 'make gpu-bundle' where the build works and" \
        "carry gpu-bundle/"
    finish 3
fi
B=$(cd "$B" && pwd)

# The machine's own copy of a library the bundle leaves out: the CUDA toolkit's, else the
# one inside a Python package (nvidia-cublas, nvidia-nccl wheels), else anywhere on /.
find_lib() {
    for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
        /usr/local/cuda-*/lib64 /usr/lib/x86_64-linux-gnu \
        /opt/*/.venv/lib/python3*/site-packages/nvidia/*/lib \
        /opt/*/.venv/lib/python3*/site-packages/nvidia/*/*/lib \
        /usr/local/lib/python3*/dist-packages/nvidia/*/lib \
        /usr/local/lib/python3*/dist-packages/nvidia/*/*/lib; do
        if [ -e "$d/$1" ]; then
            echo "$d"
            return 0
        fi
    done
    f=$(timeout 60 find / -xdev -name "$1" -not -path '/proc/*' 2>/dev/null | head -n 1)
    [ -n "$f" ] && dirname "$f"
}

libpath=$B/lib
wanted=$(sed -n 's/^# libraries gpu-check.sh takes from the machine://p' "$B/MANIFEST" \
    2>/dev/null)
[ -n "$wanted" ] || wanted="libcublas.so.13 libcublasLt.so.13"
for lib in $wanted; do
    d=$(find_lib "$lib")
    if [ -n "$d" ]; then
        say "lib   $lib from $d"
        case ":$libpath:" in *":$d:"*) ;; *) libpath=$libpath:$d ;; esac
    else
        say "lib   $lib: NOT FOUND on this machine (the steps that load it will fail)"
    fi
done
LIBPATH=$libpath${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

SANITIZER=$(command -v compute-sanitizer 2>/dev/null ||
    ls /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda*/compute-sanitizer/compute-sanitizer \
        2>/dev/null | head -n 1)

# ---- steps ---------------------------------------------------------------------------
# step NAME TIMEOUT_S COMMAND...: runs the command with the bundle's libraries, its output
# in NAME.log, and one line in the summary.
step() {
    name=$1
    limit=$2
    shift 2
    t0=$(date +%s)
    LD_LIBRARY_PATH=$LIBPATH timeout -k 10 "$limit" "$@" >"$LOGS/$name.log" 2>&1
    rc=$?
    t1=$(date +%s)
    if [ "$rc" -eq 0 ] && grep -q '^SKIP (no-gpu\|no-cuda)' "$LOGS/$name.log"; then
        say "FAIL  $name (skipped its GPU work: $(grep -m 1 '^SKIP (no-' "$LOGS/$name.log"))"
        failed="$failed $name"
        archive
        return 1
    fi
    if [ "$rc" -eq 0 ]; then
        say "ok    $name ($((t1 - t0)) s)"
    else
        [ "$rc" -ge 124 ] && [ "$rc" -le 137 ] && rc="$rc, time limit $limit s"
        say "FAIL  $name (exit $rc after $((t1 - t0)) s; see $name.log); its last lines:"
        tail -n 15 "$LOGS/$name.log" | sed 's/^/    | /' | tee -a "$SUMMARY"
        failed="$failed $name"
        archive
        return 1
    fi
    archive
    return 0
}

skip() {
    say "skip  $1 ($2)"
}

SYNTH=${SYNTH_DIR:-/tmp/river-synth}/llama-3.2-1b-bf16
LLAMA3_TOK=tests/data/tokenizers/llama3/tokenizer.json
# The synthesized checkpoint the bench steps share, made on first need (kept in /tmp for
# reruns on the same machine).
need_synth() {
    [ -f "$SYNTH/model.safetensors" ] && return 0
    mkdir -p "$(dirname "$SYNTH")"
    step synth 120 "$B/bin/river" synth --shape llama-3.2-1b --dtype bf16 --out "$SYNTH" --quiet
}

probe() {
    ldd --version 2>&1 | head -n 1
    uname -srm
    nvidia-smi --query-gpu=name,uuid,driver_version,memory.total,clocks.max.sm,clocks.max.mem \
        --format=csv 2>&1
    grep -m 1 'model name' /proc/cpuinfo
    echo "cores $(nproc), $(grep -o -w 'avx2\|avx512f\|avx512_bf16' /proc/cpuinfo | sort -u |
        tr '\n' ' ')"
    echo "LD_LIBRARY_PATH=$LIBPATH"
    bad=0
    for f in "$B"/bin/* "$B"/tests/*; do
        missing=$(LD_LIBRARY_PATH=$LIBPATH ldd "$f" 2>&1 | grep 'not found')
        if [ -n "$missing" ]; then
            echo "$f: $missing"
            bad=1
        fi
    done
    [ "$bad" -eq 0 ] && echo "every bundled program finds its libraries"
    return "$bad"
}

# The 4-bit river of that checkpoint (river quant), made on first need.
RIVERQ4=$(dirname "$SYNTH")/river-q4-g64-rtn.safetensors
need_river_q4() {
    [ -f "$RIVERQ4" ] && return 0
    step river-q4-quant 240 "$B/bin/river" quant --model "$SYNTH" --bits 4 --group 64 \
        --method rtn --out "$RIVERQ4"
}

run_step() {
    case "$1" in
    probe)
        # A function of this script, so not under timeout(1); ldd does not hang.
        if probe >"$LOGS/probe.log" 2>&1; then
            say "ok    probe"
        else
            say "FAIL  probe (a bundled program misses a library)"
            failed="$failed probe"
        fi
        cat "$LOGS/probe.log" >>"$SUMMARY"
        archive
        ;;
    ops)
        step ops 180 "$B/tests/test_cuda_ops"
        grep -E '^(cuda |[0-9]+%: Checks)' "$LOGS/ops.log" >>"$SUMMARY"
        ;;
    backend_ops | backend | golden | exit | generate | router | worker | split)
        if [ -x "$B/tests/test_$1" ]; then
            # The op case list runs its CUDA pair alone (RIVER_TEST_PAIRS): the CPU's pairs
            # are make test's, and they took most of this step's minutes on the H200.
            lim=150; [ "$1" = backend_ops ] && lim=300
            step "$1" "$lim" env RIVER_TEST_DEVICE=cuda RIVER_TEST_PAIRS=cuda \
                "$B/tests/test_$1"
            grep -E '^[0-9]+%: Checks' "$LOGS/$1.log" >>"$SUMMARY"
        else
            skip "$1" "test_$1 is not in the bundle"
        fi
        ;;
    kernels)
        step kernels 120 "$B/bin/river-cuda-bench" && cat "$LOGS/kernels.log" >>"$SUMMARY"
        ;;
    bench-bf16)
        need_synth || { skip bench-bf16 "no checkpoint"; return; }
        step bench-bf16 150 "$B/bin/river" bench --model "$SYNTH" --device cuda --runs 3 \
            --prompt-len 128 --gen-len 64 --bandwidth-mib 256
        tail -n 8 "$LOGS/bench-bf16.log" >>"$SUMMARY"
        # The bench's roofline is against host memory; against the H200's 4.8 TB/s here.
        awk '$1 == "decode_tok_s" { t = $2 } $1 == "bytes_per_token" { b = $2 }
             END { if (t > 0 && b > 0)
                       printf "h200_roofline_fraction %.3f (of 4.8 TB/s)\n", t * b / 4.8e12 }' \
            "$LOGS/bench-bf16.log" | tee -a "$SUMMARY"
        ;;
    graphs)
        need_synth || { skip graphs "no checkpoint"; return; }
        step graphs 150 env RIVER_CUDA_GRAPHS=1 "$B/bin/river" bench --model "$SYNTH" \
            --device cuda --runs 3 --prompt-len 128 --gen-len 64 --bandwidth-mib 256
        tail -n 8 "$LOGS/graphs.log" >>"$SUMMARY"
        if [ -f "$LOGS/bench-bf16.log" ]; then
            awk 'FNR == 1 { f++ } $1 == "decode_tok_s" { t[f] = $2 }
                 END { if (t[1] > 0 && t[2] > 0)
                           printf "graphs_decode_speedup %.3f (graphs %s over eager %s tok/s)\n",
                                  t[2] / t[1], t[2], t[1] }' \
                "$LOGS/bench-bf16.log" "$LOGS/graphs.log" | tee -a "$SUMMARY"
        fi
        ;;
    long-ctx)
        need_synth || { skip long-ctx "no checkpoint"; return; }
        step long-ctx 180 "$B/bin/river" bench --model "$SYNTH" --device cuda --runs 1 \
            --prompt-len 2048 --gen-len 32 --bandwidth-mib 256
        tail -n 8 "$LOGS/long-ctx.log" >>"$SUMMARY"
        ;;
    river-q4)
        need_synth || { skip river-q4 "no checkpoint"; return; }
        need_river_q4 || return
        step river-q4 120 "$B/bin/river" run --model "$SYNTH" --tokenizer "$LLAMA3_TOK" \
            --device cuda --river "$RIVERQ4" --policy cosine --strategy river --tau 0.9 \
            --prompt "Once upon a time" --max-tokens 64 --ignore-eos --output json
        tail -c 600 "$LOGS/river-q4.log" >>"$SUMMARY"
        echo >>"$SUMMARY"
        ;;
    exit-speed)
        need_synth || { skip exit-speed "no checkpoint"; return; }
        need_river_q4 || return
        for how in plain exit4; do
            args=""
            [ "$how" = exit4 ] && args="--river $RIVERQ4 --policy fixed --exit-layer 4"
            # shellcheck disable=SC2086
            step "exit-speed-$how" 120 "$B/bin/river" run --model "$SYNTH" \
                --tokenizer "$LLAMA3_TOK" --device cuda $args --prompt "Once upon a time" \
                --max-tokens 256 --ignore-eos --output json || return
        done
        for how in plain exit4; do
            sed -n 's/.*"decode_tok_s":\([0-9.]*\).*/\1/p' "$LOGS/exit-speed-$how.log" |
                tail -n 1 | sed "s/^/decode_tok_s_$how /"
        done | tee "$LOGS/exit-speed.txt" | tee -a "$SUMMARY"
        awk '{ t[$1] = $2 } END { if (t["decode_tok_s_plain"] > 0)
                 printf "exit_speedup_4_of_16 %.3f\n",
                        t["decode_tok_s_exit4"] / t["decode_tok_s_plain"] }' \
            "$LOGS/exit-speed.txt" | tee -a "$SUMMARY"
        ;;
    split-costs)
        need_synth || { skip split-costs "no checkpoint"; return; }
        need_river_q4 || return
        step split-costs 120 "$B/bin/river" bench --model "$SYNTH" --device cuda \
            --split-costs "$RIVERQ4"
        tail -n 9 "$LOGS/split-costs.log" >>"$SUMMARY"
        ;;
    profile)
        need_synth || { skip profile "no checkpoint"; return; }
        step profile 120 "$B/bin/river" bench --model "$SYNTH" --device cuda --profile \
            --prompt-len 128 --gen-len 16 --bandwidth-mib 256
        tail -n 45 "$LOGS/profile.log" >>"$SUMMARY"
        ;;
    profile-river)
        need_synth || { skip profile-river "no checkpoint"; return; }
        need_river_q4 || return
        step profile-river 120 "$B/bin/river" bench --model "$SYNTH" --device cuda --profile \
            --river "$RIVERQ4" --exit-layer 4 --prompt-len 128 --gen-len 16 --bandwidth-mib 256
        tail -n 45 "$LOGS/profile-river.log" >>"$SUMMARY"
        ;;
    memcheck)
        if [ -z "$SANITIZER" ]; then
            skip memcheck "no compute-sanitizer on this machine"
            return
        fi
        step memcheck 300 "$SANITIZER" --tool memcheck --error-exitcode 99 \
            "$B/bin/river" run --model tests/data/stories260K/stories260K.bin --device cuda \
            --prompt "Once upon a time" --max-tokens 4
        grep -E 'ERROR SUMMARY' "$LOGS/memcheck.log" >>"$SUMMARY"
        ;;
    esac
}

for s in $selected; do
    run_step "$s"
done
[ -n "$failed" ] && finish 1
finish 0
