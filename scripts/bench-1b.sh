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
#                              llama.cpp runs its CPU build of River's vector level LEVEL,
#                              and keep to those builds' names ("" for any; node-env.sh)
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

# The level's llama.cpp (scripts/node-env.sh: node_env_llamacpp_at), or the benchmark stops.
llamacpp_at() {
    node_env_llamacpp_at "$1" ||
        die "node-llama-cpp has no llama.cpp build for $1 ($keep) in $npm_dir"
}

llamacpp_check() {
    node_env_llamacpp_keep "$1"
    v=$(node_env_cpu_variant "$2")
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
