#!/bin/sh
# llama.cpp (the node-llama-cpp npm package's prebuilt CPU libraries) as the outside
# reference for River's GGUF files. River's writer (`river export --gguf`) writes each
# bundled model in F32, Q8_0, Q4_0 and q4_k_m (Q4_K with Q6_K where llama.cpp's mix puts it;
# rows whose width is not a multiple of 256 fall back to other blocks) into a temporary
# directory: tinystories-656k (tokenizer.json, SentencePiece-style "llama" vocab),
# stories260K (llama2.c .bin and tok512.bin, "llama" vocab) and llama3-tiny (`river synth`,
# random weights, with the Llama 3 byte-level BPE tokenizer: a "gpt2" vocab with merges;
# every matrix 256-wide, so its q4_k_m file is all K-quant blocks). For each file llama.cpp
# (tests/llamacpp/ref.mjs) tokenizes the prompts and decodes greedily from its raw logits,
# and River (`river tokenize`, `river run --output json` on the .gguf) does the same;
# tests/llamacpp/compare.mjs checks that the tokenizations are identical and that the
# greedy ids agree wherever llama.cpp's top-1 minus top-2 logit margin exceeds a tolerance:
# 1e-4 for F32 (both compute in fp32; only summation order differs), 0.1 for Q8_0 and 0.25
# for the 4-bit files (llama.cpp quantizes the activations to 8 bits for its quantized dot
# products, and River converts the K-quant blocks to its own groups; see Q8_TOL below). Comparing stops at the
# first step whose margin is at or below it, because from there the histories may diverge
# legitimately. A last check runs River on a copy of the F32 tinystories file with one
# tensor negated and requires a mismatch, so the suite is shown to be able to fail.
#
# node-llama-cpp 3 is installed under $BUILD/npm/llama.cpp at test time (never vendored),
# without its optional CUDA/Vulkan packages and without its install script (which would
# try to build llama.cpp), plus the prebuilt @node-llama-cpp/linux-x64 of the same version.
# A machine without node or npm, or without the registry, skips in one SKIP line
# (scripts/node-env.sh). Prints a Check-style summary for scripts/run-tests.sh.
set -u
cd "$(dirname "$0")/.."
build=${BUILD:-build}
river=$build/bin/river
case $build in
/*) npm_dir=$build/npm/llama.cpp ;;
*) npm_dir=$(pwd)/$build/npm/llama.cpp ;;
esac
# The margins (logits) above which llama.cpp and River must pick the same token. With every
# tolerance at 0 (the first mismatch ends a prompt), no Q8_0 step of these files disagreed
# and the 4-bit ones disagreed only where the margin was at most 0.053; the tolerances leave
# about five times that, since llama.cpp's CPU variant (AVX2, AVX-512 VNNI...) changes its
# rounding of the activations.
F32_TOL=${F32_TOL:-1e-4}
Q8_TOL=${Q8_TOL:-0.1}
Q4_TOL=${Q4_TOL:-0.25}
STEPS=${STEPS:-16}
skip() {
    echo "SKIP (missing): llama.cpp reference: $1"
    echo "100%: Checks: 0, Failures: 0, Errors: 0"
    exit 0
}
. scripts/node-env.sh
node_env_llamacpp "$npm_dir"
echo "llama.cpp reference: node-llama-cpp $version (@node-llama-cpp/$plat) on Node.js $("$NODE" -p process.versions.node)"

checks=0
failures=0
errors=0
tmp=$(mktemp -d /tmp/river-llamacpp.XXXXXX)
trap 'rm -rf "$tmp"' EXIT INT TERM
summary() {
    passed=$((checks - failures - errors))
    pct=100
    [ "$checks" -gt 0 ] && pct=$((passed * 100 / checks))
    echo "$pct%: Checks: $checks, Failures: $failures, Errors: $errors"
}
# error WHAT LOG: a program failed where a check was due; counts one error.
error() {
    echo "ERROR $1"
    [ -f "$2" ] && tail -n 15 "$2"
    checks=$((checks + 1))
    errors=$((errors + 1))
}
# count FILE: adds compare.mjs's PASS/FAIL lines in FILE to the totals.
count() {
    cat "$1"
    n_pass=$(grep -c '^PASS ' "$1")
    n_fail=$(grep -c '^FAIL ' "$1")
    checks=$((checks + n_pass + n_fail))
    failures=$((failures + n_fail))
}

"$river" export --help >/dev/null 2>&1 || {
    error "$river has no export command (river export --gguf writes the files under test)" /dev/null
    summary
    exit 1
}

l3=$tmp/llama3-tiny
if "$river" synth --shape llama3-tiny --dtype bf16 --out "$l3" --quiet >"$tmp/synth.log" 2>&1; then
    cp tests/data/tokenizers/llama3/tokenizer.json tests/data/tokenizers/llama3/tokenizer_config.json "$l3/"
else
    error "river synth --shape llama3-tiny" "$tmp/synth.log"
fi
# The models: label, what --model takes, prompts file, the types written. llama3-tiny skips
# Q4_0 (the other two cover it) for time: its 128256-token vocabulary is slow to load.
models="tinystories-656k|tests/data/tinystories-656k|tests/llamacpp/prompts-sp.txt|f32 q8_0 q4_0 q4_k_m
stories260K|tests/data/stories260K/stories260K.bin|tests/llamacpp/prompts-sp.txt|f32 q8_0 q4_0 q4_k_m
llama3-tiny|$l3|tests/llamacpp/prompts-bpe.txt|f32 q8_0 q4_k_m"

# check_builds FILE.gguf VARIANT: ref.mjs says which of llama.cpp's CPU builds ran
# (VARIANT, from its run on FILE), and the benchmarks' copy of the package for River's avx2
# level (node_env_llamacpp_at) makes it run the AVX2 build on a processor that has AVX2.
check_builds() {
    if [ -z "$2" ]; then
        verdict FAIL "ref.mjs did not report cpu_variant"
        return
    fi
    verdict PASS "ref.mjs reports $2"
    grep -qw avx2 /proc/cpuinfo 2>/dev/null || return 0
    if ! node_env_llamacpp_at avx2; then
        verdict FAIL "node-llama-cpp $version has no AVX2 build (haswell)"
    elif ! RIVER_NPM_DIR=$npm_at "$NODE" tests/llamacpp/ref.mjs ref --model "$1" \
        --prompts tests/llamacpp/prompts-sp.txt --steps 1 --threads 1 >"$tmp/avx2.json" \
        2>"$tmp/avx2.log"; then
        error "llama.cpp CPU build: ref.mjs on the AVX2-only copy $npm_at" "$tmp/avx2.log"
    elif [ "$(node_env_cpu_variant "$tmp/avx2.json")" = haswell ]; then
        verdict PASS "the avx2 level's copy of the package runs haswell"
    else
        verdict FAIL "the avx2 level's copy runs '$(node_env_cpu_variant "$tmp/avx2.json")', not haswell"
    fi
}
# verdict PASS|FAIL TEXT: one check of check_builds, counted.
verdict() {
    echo "$1 llama.cpp CPU build: $2"
    checks=$((checks + 1))
    [ "$1" = FAIL ] && failures=$((failures + 1))
    return 0
}

# river_answers FILE.gguf PROMPTS OUT.jsonl [tok]: River's greedy run per prompt and, with
# tok, its tokenizations with and without specials. The vocabulary is the same in every type
# a model is written in, so `river tokenize` runs on the F32 file only (it costs a second
# per prompt with the Llama 3 vocabulary); every file's `river run` prompt_ids is checked.
river_answers() {
    : >"$3"
    while IFS= read -r p; do
        [ -n "$p" ] || continue # p: the prompt
        ra='' rb=''
        if [ "${4:-}" = tok ]; then
            ra=$(printf '%s' "$p" | "$river" tokenize --tokenizer "$1") || return 1
            rb=$(printf '%s' "$p" | "$river" tokenize --tokenizer "$1" --special) || return 1
            ra="\"tok\":$ra,\"tok_special\":$rb,"
        fi
        rc=$("$river" run --model "$1" --prompt "$p" --max-tokens "$STEPS" --ignore-eos \
            --threads 1 --output json) || return 1
        printf '{%s"run":%s}\n' "$ra" "$rc" >>"$3"
    done <"$2"
}

echo "$models" | while IFS='|' read -r label src prompts types; do
    [ -e "$src" ] || continue
    for type in $types; do
        f=$tmp/$label-$type.gguf
        name="$label $type"
        case $type in
        f32) tol=$F32_TOL ;;
        q8_0) tol=$Q8_TOL ;;
        *) tol=$Q4_TOL ;;
        esac
        if ! "$river" export --gguf "$f" --model "$src" --type "$type" >"$tmp/export.log" 2>&1; then
            error "$name: river export --gguf --type $type" "$tmp/export.log"
            continue
        fi
        if ! "$NODE" tests/llamacpp/ref.mjs ref --model "$f" --prompts "$prompts" \
            --steps "$STEPS" --threads 1 >"$tmp/llama.json" 2>"$tmp/llama.log"; then
            error "$name: llama.cpp could not load or run the file" "$tmp/llama.log"
            continue
        fi
        if [ ! -e "$tmp/variant" ]; then
            node_env_cpu_variant "$tmp/llama.json" >"$tmp/variant"
            echo "llama.cpp CPU build: $(cat "$tmp/variant")"
            check_builds "$f" "$(cat "$tmp/variant")"
        fi
        tok=
        [ "$type" = f32 ] && tok=tok
        if ! river_answers "$f" "$prompts" "$tmp/river.jsonl" $tok 2>"$tmp/river.log"; then
            error "$name: river tokenize/run failed on the file" "$tmp/river.log"
            continue
        fi
        "$NODE" tests/llamacpp/compare.mjs "$tmp/llama.json" "$tmp/river.jsonl" \
            --label "$name" --tol "$tol" >"$tmp/compare.out" 2>"$tmp/compare.log"
        [ $? -le 1 ] || { error "$name: compare.mjs" "$tmp/compare.log"; continue; }
        count "$tmp/compare.out"
        # The suite must be able to fail: River on a copy of the F32 file with the last
        # layer's FFN down projection negated has to disagree with llama.cpp on the original.
        if [ "$label" = tinystories-656k ] && [ "$type" = f32 ]; then
            bad=$tmp/$label-corrupt.gguf
            if "$NODE" tests/llamacpp/ref.mjs corrupt --model "$f" --out "$bad" \
                --tensor blk.1.ffn_down.weight 2>"$tmp/corrupt.log" &&
                river_answers "$bad" "$prompts" "$tmp/river-bad.jsonl" 2>>"$tmp/corrupt.log"; then
                "$NODE" tests/llamacpp/compare.mjs "$tmp/llama.json" "$tmp/river-bad.jsonl" \
                    --label "$name" --tol "$tol" --expect-mismatch >"$tmp/compare.out" 2>&1
                count "$tmp/compare.out"
            else
                error "$name: the corrupted copy" "$tmp/corrupt.log"
            fi
        fi
    done
    echo "$checks $failures $errors" >"$tmp/totals"
done
# The loop ran in a pipeline's subshell; its totals come back through a file.
[ -f "$tmp/totals" ] && read -r checks failures errors <"$tmp/totals"
summary
[ "$failures" -eq 0 ] && [ "$errors" -eq 0 ]
