#!/bin/sh
# `make bench-prefill`: prefill speed on Llama 3.2 1B's shape (`river synth --shape
# llama-3.2-1b`, random weights, as bench-quant writes it) against llama.cpp (node-llama-cpp's
# prebuilt CPU libraries) and against the machine's compute peak, in one run:
#
#   peak       `river bench --kernels --peak` at every vector level the processor has: f32
#              FMA GFLOP/s (the float weights' yardstick; at avx512bf16, vdpbf16ps's, which
#              its bf16 matmuls run) and 8-bit integer GOP/s (the Q8/Q4 weights'), on
#              THREADS threads, at the start (for the record), with the ceiling of the
#              level's Q8 prefill tile (its products with each 32-column block's conversion
#              and scaling, on operands in L1) and its fraction of the int8 peak: the most
#              of that peak a q8 prefill of this design could show
#   River      `river bench --prompt-len P` on the bf16 checkpoint and River's own q8 and q4
#              backbones (`river quant --backbone`), or on llama.cpp's own q8_0, q4_0 and
#              q4_k_m files (those formats: the GGUF llama.cpp runs), at every vector
#              level: the median prefill tok/s of ROUNDS runs and its GFLOP/s (the
#              layers, attention over the mean causal context, the head once a prompt:
#              bench's prefill_gflop_per_token), and the median over the runs of that
#              run's GFLOP/s over the same peak taken right after it (bench's
#              prefill_peak_fraction: the host's speed drifts, and a peak taken minutes
#              away measures the drift)
#   llama.cpp  tests/llamacpp/ref.mjs prefill on the GGUF files of the same checkpoint
#              (bf16, q8_0, q4_0, q4_k_m): a P-token prompt evaluated in micro-batches of
#              512, the median of ROUNDS runs, at every one of River's levels with
#              llama.cpp's CPU build of the same instruction sets
#              (scripts/node-env.sh, node_env_llamacpp_at: haswell's at avx2, skylakex's
#              or icelake's at avx512, its own pick at avx512bf16), so that a level is
#              measured against what a processor of that level runs
#
# for each prompt length P in LENS (default 128 512 2048) and format in FORMATS (default
# bf16 q8 q4; also q8_0 q4_0 q4_k_m), llama.cpp and River alternating level by level. Then
# the ratios: River / llama.cpp per format and level, and River's fraction of the f32 peak
# (bf16) or the integer peak (the others; their integer kernels run 8-bit products), each
# run against its own.
set -u
cd "$(dirname "$0")/.." || exit 1
unset RIVER_SIMD
ROUNDS=${ROUNDS:-3}
THREADS=${THREADS:-2}
LENS=${LENS:-128 512 2048}
FORMATS=${FORMATS:-bf16 q8 q4}
BENCH=bench-prefill
. scripts/bench-1b.sh
bench_llamacpp
bench_model
gguf_of() {
    case $1 in
    bf16) echo bf16 ;;
    q8 | q8_0) echo q8_0 ;;
    q4 | q4_0) echo q4_0 ;;
    q4_k_m) echo q4_k_m ;;
    *) die "FORMATS: unknown format $1 (bf16, q8, q4, q8_0, q4_0, q4_k_m)" ;;
    esac
}
# What River runs for a format: its own checkpoint or backbone, or llama.cpp's file.
river_model() {
    case $1 in
    q8_0 | q4_0 | q4_k_m) echo "$dir/1b-$1.gguf" ;;
    *) backbone "$1" ;;
    esac
}
for b in $FORMATS; do
    bench_gguf "$(gguf_of "$b")"
done
bench_backbones

out=$dir/prefill
mkdir -p "$out"
"$river" bench --kernels --peak --threads "$THREADS" --runs 3 --output json >"$out/peak.json" ||
    die "river bench --kernels --peak failed"
# shellcheck disable=SC2046 # one line of the level names, a space apart
levels=$(echo $(sed -n 's/.*"level":"\([a-z0-9]*\)".*/\1/p' "$out/peak.json" | grep -v scalar))
[ -n "$levels" ] || die "no vector SIMD level on this processor"
for level in $levels; do
    llamacpp_at "$level"
    eval "npm_$level=\$npm_at"
done
echo "bench-prefill: node-llama-cpp $version (llama.cpp CPU, prebuilt), levels: $levels, $THREADS threads, prompts of $LENS tokens, $ROUNDS runs each; load: $(cut -d' ' -f1-3 /proc/loadavg)"

results=$out/results.txt
: >"$results"
for p in $LENS; do
    for b in $FORMATS; do
        t=$(gguf_of $b)
        echo "bench-prefill: $p tokens, $b" >&2
        for level in $levels; do
            RIVER_NPM_DIR=$(eval echo "\$npm_$level") "$NODE" tests/llamacpp/ref.mjs prefill \
                --model "$dir/1b-$t.gguf" --tokens "$p" --threads "$THREADS" \
                --runs "$ROUNDS" >"$out/l.json" 2>"$out/l.log" ||
                die "llama.cpp prefill failed on $t at $level" "$out/l.log"
            llamacpp_check "$level" "$out/l.json"
            awk -v k="llama.cpp-$level $b $p" -v t="$(num prefill_tok_s "$out/l.json")" \
                -v v="$v" 'BEGIN {printf "%s %.1f %s\n", k, t, v}' >>"$results"
            RIVER_SIMD=$level "$river" bench --model "$(river_model $b)" --threads "$THREADS" \
                --prompt-len "$p" --gen-len 1 --runs "$ROUNDS" --bandwidth-mib 256 \
                --output json >"$out/r.json" 2>"$out/r.log" ||
                die "river bench failed: $b at $p tokens, $level" "$out/r.log"
            awk -v k="river-$level $b $p" -v t="$(num prefill_tok_s "$out/r.json")" \
                -v g="$(num prefill_gflops "$out/r.json")" \
                -v f="$(num prefill_peak_fraction "$out/r.json")" \
                'BEGIN {printf "%s %.1f %.1f %.2f\n", k, t, g, f}' >>"$results"
        done
    done
done

peak() { sed -n "s/.*\"level\":\"$1\".*\"$2\":\([0-9.]*\).*/\1/p" "$out/peak.json"; }
get() { awk -v k="$1" -v b="$2" -v p="$3" -v f="$4" '$1 == k && $2 == b && $3 == p {print $f}' "$results"; }
echo
for level in $levels; do
    # The float peak of avx512bf16 is vdpbf16ps's, which its bf16 matmuls run.
    f=f32
    [ "$level" = avx512bf16 ] && f="bf16 dot (vdpbf16ps)"
    i8=$(peak "$level" peak_i8_gops)
    t8=$(peak "$level" q8_tile_gops)
    echo "$level: $f peak $(peak "$level" peak_f32_gflops) GFLOP/s, int8 peak $i8 GOP/s, q8 tile ceiling $t8 GOP/s ($(ratio "$t8" "$i8") of int8) at the start"
done
# shellcheck disable=SC2046 # one line, a space apart
echo "llama.cpp's CPU build at each level:" $(for level in $levels; do
    echo "$level $(awk -v k="llama.cpp-$level" '$1 == k {print $5}' "$results" | sort -u)"
done)
printf '\n%-8s %6s' "format" "tokens"
for level in $levels; do
    printf ' %14s %14s %10s %8s %8s' "llama.cpp $level" "River $level" "GFLOP/s" "/llama" "/peak"
done
echo
for p in $LENS; do
    for b in $FORMATS; do
        printf '%-8s %6s' "$b" "$p"
        for level in $levels; do
            l=$(get "llama.cpp-$level" "$b" "$p" 4)
            r=$(get "river-$level" "$b" "$p" 4)
            g=$(get "river-$level" "$b" "$p" 5)
            printf ' %14s %14s %10s %8s %8s' "$l" "$r" "$g" "$(ratio "$r" "$l")" "$(get "river-$level" "$b" "$p" 6)"
        done
        echo
    done
done
# The 8-bit formats' share of what their tile could do (q4's tile unpacks nibbles besides,
# so its own ceiling differs): River's GFLOP/s over the Q8 tile's ceiling at the start.
for p in $LENS; do
    for b in $FORMATS; do
        case $b in q8 | q8_0) ;; *) continue ;; esac
        printf '%s at %s tokens, of the q8 tile ceiling at the start:' "$b" "$p"
        for level in $levels; do
            printf ' %s %s' "$level" "$(ratio "$(get "river-$level" "$b" "$p" 5)" "$(peak "$level" q8_tile_gops)")"
        done
        echo
    done
done
echo "bench-prefill: tok/s; /llama is River over llama.cpp at the same level on the same format (GGUF bf16, q8_0, q4_0 for River's bf16, q8, q4; the same file for q8_0, q4_0, q4_k_m), /peak the median over River's runs of its GFLOP/s over the f32 peak (bf16) or the int8 peak (the others) taken right after the run; every figure in $results; load at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
