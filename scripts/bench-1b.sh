# shellcheck shell=sh
# Sourced by the benchmarks that measure River against llama.cpp on Llama 3.2 1B's shape
# (scripts/bench-quant.sh, scripts/bench-serving.sh), so that both write the same files once
# and reuse them: a random-weight checkpoint of that shape (`river synth --shape
# llama-3.2-1b`, bf16, with the Llama 3 tokenizer beside it) and its GGUF files, under
# $BUILD/bench-quant; and node-llama-cpp (llama.cpp's prebuilt CPU libraries) under
# $BUILD/npm/llama.cpp.
#
# The caller sets BENCH (its name, for messages) and cds to the repository root. Sourcing
# sets build ($BUILD, absolute), river (the tool), dir (the shared directory, made) and m
# (the checkpoint's directory in it).
#
#   bench_model                writes the checkpoint unless it is there
#   bench_llamacpp             installs node-llama-cpp and its CPU package unless there; sets
#                              NODE, version and exports RIVER_NPM_DIR; no llama.cpp exits 1
#   llamacpp_at LEVEL          after bench_llamacpp: sets npm_at to an npm prefix whose
#                              llama.cpp runs its CPU build of River's vector level LEVEL
#                              (below), and keep to those builds' names ("" for any)
#   llamacpp_check LEVEL JSON  stops unless ref.mjs's JSON says one of LEVEL's builds ran
#   bench_gguf TYPE            writes $dir/1b-TYPE.gguf unless there (bf16, q8_0, q4_0, ...)
#   once FILE LOG CMD...       runs CMD unless FILE exists (a step done by an earlier run),
#                              its output in LOG; a failure removes FILE and stops, showing LOG
#   die MESSAGE [LOG]          stops with MESSAGE and LOG's last lines
#   bench_backbones            writes River's q8 and q4 backbones ($dir/1b-q8, 1b-q4) unless there
#   backbone NAME              the directory of backbone bf16, q8 or q4
#   num KEY FILE               the number under KEY in the JSON line of FILE
#   ratio A B                  A / B to two places, n/a unless both are positive

die() {
    echo "$BENCH: $1" >&2
    [ -n "${2:-}" ] && [ -f "$2" ] && tail -n 20 "$2" >&2
    exit 1
}

once() {
    f=$1 log=$2
    shift 2
    [ -e "$f" ] && return 0
    echo "$BENCH: writing $f" >&2
    "$@" >"$log" 2>&1 || { rm -rf "$f"; die "failed: $*" "$log"; }
}

build=${BUILD:-build}
case $build in
/*) ;;
*) build=$(pwd)/$build ;;
esac
river=$build/bin/river
dir=$build/bench-quant
mkdir -p "$dir"
m=$dir/llama-3.2-1b

bench_model() {
    once "$m/model.safetensors" "$dir/synth.log" "$river" synth --shape llama-3.2-1b --dtype bf16 \
        --out "$m" --quiet
    cp tests/data/tokenizers/llama3/tokenizer.json tests/data/tokenizers/llama3/tokenizer_config.json "$m/"
}

bench_gguf() {
    once "$dir/1b-$1.gguf" "$dir/export-$1.log" "$river" export --gguf "$dir/1b-$1.gguf" --model "$m" \
        --type "$1"
}

# node_env_init and node_env_install call skip when something is missing: for a benchmark
# that is a failure, since its whole point is the comparison.
skip() {
    echo "$BENCH: llama.cpp is not available: $1"
    exit 1
}

bench_llamacpp() {
    npm_dir=$build/npm/llama.cpp
    . scripts/node-env.sh
    node_env_llamacpp "$npm_dir"
}

# node-llama-cpp's prebuilt CPU libraries hold one llama.cpp build a set of instruction sets
# (libggml-cpu-haswell.so, -skylakex.so, -icelake.so, -zen4.so, ...), and ggml loads the best
# one the processor runs from that directory. So on a processor with AVX-512 llama.cpp never
# runs its AVX2 build, the one an AVX2-only processor (AMD Zen 3, say) gets, unless a copy
# of the directory holds that build alone. River's levels take the builds of the same
# instruction sets: avx2 haswell's (AVX2, FMA, F16C), avx512 skylakex's or icelake's
# (AVX-512 F/BW/DQ/VL; icelake's adds VNNI, which River's level uses where the processor has
# it), and avx512bf16, or any other, llama.cpp's own pick (zen4's, cooperlake's or
# sapphirerapids's, whose AMX River has no level for). The copies are hard links, made
# again each run so that they follow the package.
llamacpp_keep() {
    case $1 in
    avx2) keep=haswell ;;
    avx512) keep="skylakex icelake" ;;
    *) keep= ;;
    esac
}

llamacpp_at() {
    llamacpp_keep "$1"
    npm_at=$npm_dir
    [ -n "$keep" ] || return 0
    npm_at=$build/npm/llama.cpp-$1
    rm -rf "$npm_at"
    cp -al "$npm_dir" "$npm_at" 2>/dev/null || cp -a "$npm_dir" "$npm_at" ||
        die "cannot copy $npm_dir to $npm_at"
    n=0
    for f in "$npm_at"/node_modules/@node-llama-cpp/*/bins/*/libggml-cpu-*.so; do
        [ -e "$f" ] || continue
        v=${f##*/libggml-cpu-}
        v=${v%.so}
        case " $keep " in
        *" $v "*) n=$((n + 1)) ;;
        *) rm -f "$f" ;;
        esac
    done
    [ "$n" -gt 0 ] || die "node-llama-cpp has no llama.cpp build for $1 ($keep) in $npm_dir"
}

llamacpp_check() {
    llamacpp_keep "$1"
    v=$(sed -n 's/.*"cpu_variant":"\([a-z0-9_,]*\)".*/\1/p' "$2")
    [ -n "$v" ] || die "llama.cpp did not say which CPU build ran ($2)"
    [ -z "$keep" ] && return 0
    case " $keep " in
    *" $v "*) ;;
    *) die "llama.cpp ran its $v build at River's $1 level, not one of $keep" ;;
    esac
}

bench_backbones() {
    for b in q8 q4; do
        once "$dir/1b-$b/config.json" "$dir/quant-$b.log" "$river" quant --backbone "$b" \
            --model "$m" --out "$dir/1b-$b" --threads "${THREADS:-2}"
    done
}

backbone() {
    case $1 in
    bf16) echo "$m" ;;
    *) echo "$dir/1b-$1" ;;
    esac
}

num() { sed -n "s/.*\"$1\":\([0-9.eE+-]*\).*/\1/p" "$2" | head -n 1; }

ratio() { awk -v a="$1" -v b="$2" 'BEGIN {if (a > 0 && b > 0) printf "%.2f", a / b; else print "n/a"}'; }
