#!/bin/sh
# `make bench-quant`: decode speed of quantized Llama 3.2 1B-shaped models (`river synth
# --shape llama-3.2-1b`, random weights, with the Llama 3 tokenizer beside it) on 2 threads,
# River against llama.cpp (node-llama-cpp's prebuilt CPU libraries) in one run:
#
#   llama.cpp  the GGUF files River's writer makes of the model: bf16, q8_0, q4_0, q4_k_m
#   River      the same GGUF files; River's own checkpoints (the bf16 one, `river quant
#              --backbone q8|q4`); and on each of those three backbones a fixed exit after
#              4 of 16 layers onto a 4-bit Exit River with a 4-bit head (`river quant
#              --bits 4 --head-bits 4 --start 4`, HQQ, group 64)
#
# Everything is written once under $BUILD/bench-quant and reused. Each figure is the median
# over ROUNDS rounds (default 3); a round measures every configuration once, llama.cpp and
# River alternating, River at its native SIMD level and at RIVER_SIMD=avx2, and llama.cpp
# with its own pick of its CPU builds and with its AVX2 build (haswell's, the one an
# AVX2-only processor runs: scripts/node-env.sh, node_env_llamacpp_at). A River figure
# is `river run --output json`'s decode_tok_s for GEN tokens (default 64) after a short
# prompt, no stop on EOS; a llama.cpp figure is tests/llamacpp/ref.mjs bench (GEN tokens
# timed from the first generated one, after a 4-token warm-up in the same process).
#
# The ratios, River at each level over llama.cpp at the same: River q8 / llama.cpp q8_0,
# River q4 / llama.cpp q4_0, River on each GGUF / llama.cpp on it, River q8 + 4-bit river +
# 4-bit head exit 4/16 / llama.cpp q8_0; and each exit figure / its byte ideal (the same
# backbone's plain decode scaled by plain bytes per token / exit-path bytes per token, both
# from `river eval`'s bytes model).
set -u
cd "$(dirname "$0")/.."
unset RIVER_SIMD # River's native level, except where a figure forces avx2
ROUNDS=${ROUNDS:-3}
GEN=${GEN:-64}
THREADS=${THREADS:-2}
PROMPT="Once upon a time, in a small village by the sea,"
BENCH=bench-quant
. scripts/bench-1b.sh
bench_llamacpp
bench_model
for t in bf16 q8_0 q4_0 q4_k_m; do
    bench_gguf "$t"
done
bench_backbones
# The 4-bit river (4-bit head) of each backbone River runs itself.
for b in bf16 q8 q4; do
    once "$dir/river-$b.safetensors" "$dir/river-$b.log" "$river" quant --model "$(backbone $b)" \
        --bits 4 --head-bits 4 --start 4 --out "$dir/river-$b.safetensors" --threads "$THREADS"
done
# Bytes per token of the plain and the exit path, from river eval's bytes model (a few
# tokens: the bytes do not depend on the timing).
echo "$PROMPT" >"$dir/prompt.txt"
for b in bf16 q8 q4; do
    once "$dir/bytes-$b.json" "$dir/bytes-$b.log" sh -c "\"$river\" eval --model \"$(backbone $b)\" \
        --river \"$dir/river-$b.safetensors\" --prompts \"$dir/prompt.txt\" --policy fixed \
        --exit-layer 4 --max-tokens 2 --threads $THREADS --output json >\"$dir/bytes-$b.json\""
done

native=$(sed -n 's/.*"simd":"\([a-z0-9]*\)".*/\1/p' "$dir/bytes-bf16.json")
[ -n "$native" ] || native=native
echo "bench-quant: node-llama-cpp $version (llama.cpp CPU, prebuilt), River's native SIMD level $native, $THREADS threads, $GEN tokens, $ROUNDS rounds; load: $(cut -d' ' -f1-3 /proc/loadavg)"

# The forced AVX2 figures only where the native level is another one.
levels=native
[ "$native" = avx2 ] || levels="native avx2"
for level in $levels; do
    llamacpp_at "$level"
    eval "npm_$level=\$npm_at"
done
results=$dir/results.txt
: >"$results"
# llama_run KEY LEVEL FILE and river_run KEY LEVEL MODEL [OPTIONS]: one figure, appended
# as "PROGRAM-LEVEL/KEY TOK_S" (LEVEL native: River's native level, llama.cpp's own pick).
llama_run() {
    RIVER_NPM_DIR=$(eval echo "\$npm_$2") "$NODE" tests/llamacpp/ref.mjs bench --model "$3" \
        --tokens "$GEN" --threads "$THREADS" --runs 1 --prompt "$PROMPT" >"$dir/out.json" \
        2>"$dir/out.log" || die "llama.cpp bench failed on $3 ($2)" "$dir/out.log"
    llamacpp_check "$2" "$dir/out.json"
    [ "$2" = native ] && llama_native=$v
    echo "llama.cpp-$(lvl "$2")/$1 $(num decode_tok_s "$dir/out.json")" >>"$results"
}
lvl() { if [ "$1" = native ]; then echo "$native"; else echo "$1"; fi; }
river_run() {
    key=$1 level=$2 model=$3
    shift 3
    [ "$level" = native ] && level=
    env ${level:+RIVER_SIMD=$level} "$river" run --model "$model" --prompt "$PROMPT" \
        --max-tokens "$GEN" --ignore-eos --threads "$THREADS" --output json "$@" \
        >"$dir/out.json" 2>"$dir/out.log" || die "river run failed: $key" "$dir/out.log"
    echo "river-${level:-$native}/$key $(num decode_tok_s "$dir/out.json")" >>"$results"
}
exit4() { echo --policy fixed --exit-layer 4 --river "$dir/river-$1.safetensors"; }
r=1
while [ $r -le "$ROUNDS" ]; do
    echo "bench-quant: round $r of $ROUNDS" >&2
    for t in bf16 q8_0 q4_0 q4_k_m; do
        for level in $levels; do
            llama_run "gguf-$t" "$level" "$dir/1b-$t.gguf"
            river_run "gguf-$t" "$level" "$dir/1b-$t.gguf"
        done
    done
    for level in $levels; do
        for b in bf16 q8 q4; do
            river_run "$b" "$level" "$(backbone $b)"
            # shellcheck disable=SC2046
            river_run "$b-exit4" "$level" "$(backbone $b)" $(exit4 $b)
        done
    done
    r=$((r + 1))
done

# Medians, then the table and the ratios.
awk '{v[$1] = v[$1] " " $2} END {for (k in v) print k, v[k]}' "$results" |
    while read -r key vals; do
        med=$(printf '%s\n' $vals | sort -g | awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}')
        printf "%s %.2f\n" "$key" "$med"
    done | sort >"$dir/medians.txt"
med() { awk -v k="$1" '$1 == k {print $2}' "$dir/medians.txt"; }
printf '\n%-44s %12s %12s %12s %12s\n' "decode tok/s (median of $ROUNDS)" "llama.cpp" "River $native" \
    "llama.cpp avx2" "River avx2"
for t in bf16 q8_0 q4_0 q4_k_m; do
    printf '%-44s %12s %12s %12s %12s\n' "GGUF $t" "$(med llama.cpp-$native/gguf-$t)" \
        "$(med river-$native/gguf-$t)" "$(med llama.cpp-avx2/gguf-$t)" "$(med river-avx2/gguf-$t)"
done
for b in bf16 q8 q4; do
    printf '%-44s %12s %12s %12s %12s\n' "River $b checkpoint" "" "$(med river-$native/$b)" "" \
        "$(med river-avx2/$b)"
    printf '%-44s %12s %12s %12s %12s\n' "River $b, exit 4/16, 4-bit river + 4-bit head" "" \
        "$(med river-$native/$b-exit4)" "" "$(med river-avx2/$b-exit4)"
done
if [ "$levels" = native ]; then
    echo "llama.cpp's CPU build: ${llama_native:-?} (its own pick)"
else
    echo "llama.cpp's CPU build: ${llama_native:-?} (its own pick) and haswell (avx2)"
fi
echo
printf '%-56s %10s %10s\n' "ratio (River / llama.cpp at the same level)" "$native" "avx2"
# row LABEL RIVER_KEY LLAMA_KEY
row() {
    printf '%-56s %10s %10s\n' "$1" "$(ratio "$(med river-$native/$2)" "$(med llama.cpp-$native/$3)")" \
        "$(ratio "$(med river-avx2/$2)" "$(med llama.cpp-avx2/$3)")"
}
row "River q8 / llama.cpp q8_0" q8 gguf-q8_0
row "River q4 / llama.cpp q4_0" q4 gguf-q4_0
for t in bf16 q8_0 q4_0 q4_k_m; do
    row "River on GGUF $t / llama.cpp on it" "gguf-$t" "gguf-$t"
done
row "River q8 + 4-bit river/head exit 4/16 / llama.cpp q8_0" q8-exit4 gguf-q8_0
for b in bf16 q8 q4; do
    pb=$(num plain_bytes_per_token "$dir/bytes-$b.json")
    eb=$(num bytes_per_token "$dir/bytes-$b.json")
    for level in $native avx2; do
        ideal=$(awk -v p="$(med river-$level/$b)" -v pb="$pb" -v eb="$eb" 'BEGIN {if (eb > 0) print p * pb / eb}')
        eval "ideal_$level=\$ideal"
    done
    printf '%-56s %10s %10s\n' "River $b exit 4/16 / byte ideal ($(awk -v a="$pb" -v b="$eb" 'BEGIN {printf "%.0f/%.0f MB", a / 1e6, b / 1e6}'))" \
        "$(ratio "$(med river-$native/$b-exit4)" "$(eval echo \$ideal_$native)")" \
        "$(ratio "$(med river-avx2/$b-exit4)" "$ideal_avx2")"
done
echo "bench-quant: every figure in $results; load at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
