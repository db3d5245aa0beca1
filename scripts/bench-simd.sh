#!/bin/sh
# The speed figures of the CPU kernels, with the SIMD level forced (RIVER_SIMD) to AVX2 and,
# where the processor has it, AVX-512, side by side, on a random-weight checkpoint of
# Llama 3.2 1B's shape in bf16 and its 4-bit HQQ river (both written once under
# $BUILD/synth), THREADS threads (default 2), each figure REPS times (default 3; min and
# median are printed: on a shared machine single timings are noisy).
#
#   split    river layer / backbone layer at 1 row, and 8 rows / 1 row for each (bench
#            --split-costs), and the smallest batch at which the row split pays
#   eval     river eval --policy fixed --exit-layer 4: speed-up over the backbone (eval's own
#            median of paired rounds), the byte ideal (ideal_speedup_bytes: backbone bytes
#            per token over the exit path's, KV included; the same every run) and
#            realized/ideal against it
#   decode   bf16 decode roofline_fraction (bytes per token x tok/s / read bandwidth of the
#            same run, swept with the loads of the forced level), and the same against a
#            sweep with the widest loads the processor has, and each decode step against
#            a pass of the sweep right after it (roofline_fraction_paired)
#   prefill  prefill of 512 tokens, tok/s, and attention's share of prefill time
#   quant    river quant (HQQ) of the whole model, seconds
set -eu
B=${BUILD:-build}
RIVER=$B/bin/river
THREADS=${THREADS:-2}
REPS=${REPS:-3}
SYNTH=$B/synth/llama-3.2-1b-bf16
RIVERF=$SYNTH/river-q4-g64-hqq.safetensors
TOK=tests/data/tokenizers/llama3/tokenizer.json
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
test -f "$SYNTH/model.safetensors" || $RIVER synth --shape llama-3.2-1b --dtype bf16 --out "$SYNTH" >&2
test -f "$RIVERF" || $RIVER quant --model "$SYNTH" --threads "$THREADS" 2>/dev/null
head -n 4 data/prompts/kjv.txt > "$TMP/prompts.txt"

levels=avx2
grep -qw avx512bw /proc/cpuinfo 2>/dev/null && levels="avx2 avx512"
grep -qw avx512_bf16 /proc/cpuinfo 2>/dev/null && levels="$levels avx512bf16"

# min and median of numbers on stdin, one a line
stats() {
    sort -g | awk '{v[NR]=$1} END {if (NR == 0) {print "-"; exit}
        m = NR % 2 ? v[(NR+1)/2] : (v[NR/2] + v[NR/2+1]) / 2;
        printf "min %.3f median %.3f (n %d)\n", v[1], m, NR}'
}
# the number in field F of the compact JSON object on stdin (first line)
jget() { head -n 1 | sed -n "s/.*\"$1\":\([-+0-9.eE]*\).*/\1/p"; }

for l in $levels; do
    export RIVER_SIMD=$l
    : > "$TMP/$l.r1"; : > "$TMP/$l.r8"; : > "$TMP/$l.b8"; : > "$TMP/$l.pays"
    : > "$TMP/$l.sp"; : > "$TMP/$l.ri"; : > "$TMP/$l.ib"; : > "$TMP/$l.roof"; : > "$TMP/$l.roofw"; : > "$TMP/$l.roofp"; : > "$TMP/$l.pre"; : > "$TMP/$l.att"
    : > "$TMP/$l.q"
    for k in $(seq "$REPS"); do
        $RIVER bench --model "$SYNTH" --threads "$THREADS" --split-costs "$RIVERF" --output json \
            > "$TMP/split.json"
        # One JSON line per batch size: rows, backbone_ms, river_ms, r, split_pays.
        sed 's/[{}"]//g; s/,/ /g; s/:/ /g' "$TMP/split.json" | awk -v p="$TMP/$l" '
            { for (i = 1; i < NF; i += 2) f[$i] = $(i + 1)
              n = f["rows"]; tb[n] = f["backbone_ms"]; tr[n] = f["river_ms"]; r[n] = f["r"]
              if (f["split_pays"] == "true" && (pays == 0 || n < pays)) pays = n }
            END { print r[1] >> (p ".r1"); print tr[8] / tr[1] >> (p ".r8")
                  print tb[8] / tb[1] >> (p ".b8"); print pays + 0 >> (p ".pays") }'
        $RIVER eval --model "$SYNTH" --tokenizer "$TOK" --river "$RIVERF" --prompts "$TMP/prompts.txt" \
            --policy fixed --exit-layer 4 --max-tokens 16 --threads "$THREADS" --output json \
            > "$TMP/eval.json"
        jget speedup < "$TMP/eval.json" >> "$TMP/$l.sp"
        jget realized_over_ideal < "$TMP/eval.json" >> "$TMP/$l.ri"
        jget ideal_speedup_bytes < "$TMP/eval.json" >> "$TMP/$l.ib"
        $RIVER bench --model "$SYNTH" --threads "$THREADS" --prompt-len 16 --gen-len 32 --runs 3 \
            --output json > "$TMP/dec.json"
        jget roofline_fraction < "$TMP/dec.json" >> "$TMP/$l.roof"
        jget roofline_fraction_widest < "$TMP/dec.json" >> "$TMP/$l.roofw"
        jget roofline_fraction_paired < "$TMP/dec.json" >> "$TMP/$l.roofp"
        $RIVER bench --model "$SYNTH" --threads "$THREADS" --prompt-len 512 --gen-len 1 --runs 1 \
            --output json > "$TMP/pre.json"
        jget prefill_tok_s < "$TMP/pre.json" >> "$TMP/$l.pre"
        jget prefill_attention_share < "$TMP/pre.json" >> "$TMP/$l.att"
    done
    # Quantization is long: timed once per level.
    t0=$(date +%s.%N)
    $RIVER quant --model "$SYNTH" --threads "$THREADS" --out "$TMP/q.safetensors" 2>/dev/null >/dev/null
    t1=$(date +%s.%N)
    awk -v a="$t0" -v b="$t1" "BEGIN { print b - a }" >> "$TMP/$l.q"
    rm -f "$TMP/q.safetensors"
done
unset RIVER_SIMD

echo "llama-3.2-1b shape, bf16 backbone, 4-bit HQQ river (g64), $THREADS threads, $REPS runs each"
for l in $levels; do
    echo "== RIVER_SIMD=$l"
    printf '  river/backbone layer, 1 row (<= 0.45)    '; stats < "$TMP/$l.r1"
    printf '  river 8 rows / 1 row (<= 2.5)            '; stats < "$TMP/$l.r8"
    printf '  backbone 8 rows / 1 row (<= 2.0)         '; stats < "$TMP/$l.b8"
    printf '  smallest batch the split pays at (0: none) '; stats < "$TMP/$l.pays"
    printf '  eval fixed exit 4: speed-up (>= 1.7)     '; stats < "$TMP/$l.sp"
    printf '  eval fixed exit 4: byte ideal            '; stats < "$TMP/$l.ib"
    printf '  eval fixed exit 4: realized/byte ideal (>= 0.9) '; stats < "$TMP/$l.ri"
    printf '  bf16 decode roofline_fraction (>= 0.90)  '; stats < "$TMP/$l.roof"
    printf '    same, against the widest-load sweep    '; stats < "$TMP/$l.roofw"
    printf '    same, each step against a sweep pass   '; stats < "$TMP/$l.roofp"
    printf '  prefill 512 tokens, tok/s                '; stats < "$TMP/$l.pre"
    printf '  prefill attention share                  '; stats < "$TMP/$l.att"
    printf '  river quant (HQQ), seconds (< 45)        '; stats < "$TMP/$l.q"
done
