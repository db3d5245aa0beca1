# Sourced by the suites and benchmarks that run an outside program from npm (the official
# `openai` client, node-llama-cpp). They install their packages under $BUILD/npm at test
# time, never vendored, and run them with a Node.js that the package's own `engines` field
# accepts: the machine's `node` when it is new enough, else a Node.js binary of the major
# version asked for from npm's node-linux-<arch> package, installed beside the packages. So
# no suite depends on which Node.js a machine happened to have; Debian 12's is 18.
#
# The caller defines skip(WHY), which prints "SKIP (missing): WHY" (scripts/run-tests.sh)
# and exits. npm itself runs on the machine's node, so a machine without node or npm skips.
#
#   node_env_init NPM_DIR          checks for node and npm
#   node_env_install NAME SPEC [NPM_ARGS...]
#                                  installs SPEC (e.g. openai, node-llama-cpp@3) under NPM_DIR
#                                  unless NAME is there; NPM_ARGS go to npm install as they are
#   node_env_select NAME           sets NODE to a node that NAME's engines.node accepts
#   node_env_llamacpp NPM_DIR      node-llama-cpp and its prebuilt llama.cpp for this machine
#                                  under NPM_DIR: sets NODE, version (node-llama-cpp's) and
#                                  plat, and exports RIVER_NPM_DIR for tests/llamacpp/
#   node_env_llamacpp_at LEVEL     after node_env_llamacpp: sets keep to the names of
#                                  llama.cpp's CPU builds for River's SIMD level LEVEL
#                                  (below; "" for llama.cpp's own pick) and npm_at to an npm
#                                  prefix whose llama.cpp loads only those (NPM_DIR itself
#                                  for ""); returns 1 where the package holds none of them
#   node_env_cpu_variant JSON      prints the CPU build a ref.mjs JSON line says ran

node_env_init() {
    NPM_DIR=$1
    command -v node >/dev/null 2>&1 ||
        skip "node is not installed (scripts/install-deps.sh installs Debian's nodejs and npm)"
    command -v npm >/dev/null 2>&1 ||
        skip "npm is not installed, node $(node -p process.versions.node 2>/dev/null) is"
    mkdir -p "$NPM_DIR"
}

node_env_install() {
    [ -f "$NPM_DIR/node_modules/$1/package.json" ] && return 0
    name=$1 spec=$2
    shift 2
    log=$NPM_DIR/install-$(echo "$name" | tr / -).log
    timeout 600 npm install --prefix "$NPM_DIR" --no-audit --no-fund --silent "$spec" "$@" \
        >"$log" 2>&1 ||
        skip "npm install $spec failed (no registry?); see $log"
}

# The lowest version an engines range admits, as x.y.z: the first version it names, which
# for the ranges packages write (">=20.0.0", "^18.17.0 || >=20.5.0") is the minimum.
node_env__min_version() {
    node -e 'const e = (require(process.argv[1]).engines || {}).node || "";
const m = e.match(/(\d+)(?:\.(\d+))?(?:\.(\d+))?/);
console.log(m ? [m[1], m[2] || 0, m[3] || 0].join(".") : "0.0.0");' "$1"
}

# True when version $1 >= version $2.
node_env__ge() {
    [ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n 1)" = "$2" ]
}

node_env_select() {
    need=$(node_env__min_version "$NPM_DIR/node_modules/$1/package.json") ||
        skip "cannot read the engines field of $1's package.json"
    have=$(node -p process.versions.node)
    if node_env__ge "$have" "$need"; then
        NODE=$(command -v node)
        return 0
    fi
    case $(uname -m) in
    x86_64) arch=x64 ;;
    aarch64) arch=arm64 ;;
    *) skip "$1 needs Node.js $need or newer, node $have is installed, and npm has no Node.js for $(uname -m)" ;;
    esac
    major=${need%%.*}
    dir=$NPM_DIR/node-$major
    NODE=$dir/node_modules/node-linux-$arch/bin/node
    if [ ! -x "$NODE" ]; then
        timeout 600 npm install --prefix "$dir" --no-audit --no-fund --silent \
            "node-linux-$arch@$major" >"$NPM_DIR/install-node-$major.log" 2>&1 ||
            skip "$1 needs Node.js $need or newer, node $have is installed, and npm install node-linux-$arch@$major failed; see $NPM_DIR/install-node-$major.log"
    fi
    got=$("$NODE" -p process.versions.node 2>/dev/null) ||
        skip "$1 needs Node.js $need or newer, node $have is installed, and $NODE does not run"
    node_env__ge "$got" "$need" ||
        skip "$1 needs Node.js $need or newer, node $have is installed, and npm's node-linux-$arch@$major is $got"
    echo "node: $1 needs Node.js $need or newer; node $have is installed, so running Node.js $got from npm (node-linux-$arch)"
}

node_env_llamacpp() {
    node_env_init "$1"
    case $(uname -m) in
    x86_64) plat=linux-x64 ;;
    aarch64) plat=linux-arm64 ;;
    *) skip "node-llama-cpp has no prebuilt llama.cpp for $(uname -m)" ;;
    esac
    node_env_install node-llama-cpp node-llama-cpp@3 --omit=optional --ignore-scripts
    version=$(sed -n 's/^  "version": "\(.*\)",$/\1/p' "$1/node_modules/node-llama-cpp/package.json")
    node_env_install "@node-llama-cpp/$plat" "@node-llama-cpp/$plat@$version" --omit=optional \
        --ignore-scripts
    node_env_select node-llama-cpp
    export RIVER_NPM_DIR="$1"
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
# again each call so that they follow the package.
node_env_llamacpp_keep() {
    case $1 in
    avx2) keep=haswell ;;
    avx512) keep="skylakex icelake" ;;
    *) keep= ;;
    esac
}

node_env_llamacpp_at() {
    node_env_llamacpp_keep "$1"
    npm_at=$NPM_DIR
    [ -n "$keep" ] || return 0
    npm_at=$NPM_DIR-$1
    rm -rf "$npm_at"
    cp -al "$NPM_DIR" "$npm_at" 2>/dev/null || cp -a "$NPM_DIR" "$npm_at" || return 1
    # Names of their own: a sourced script's functions share the caller's variables.
    node_env_kept=0
    for node_env_lib in "$npm_at"/node_modules/@node-llama-cpp/*/bins/*/libggml-cpu-*.so; do
        [ -e "$node_env_lib" ] || continue
        node_env_name=${node_env_lib##*/libggml-cpu-}
        case " $keep " in
        *" ${node_env_name%.so} "*) node_env_kept=$((node_env_kept + 1)) ;;
        *) rm -f "$node_env_lib" ;;
        esac
    done
    [ "$node_env_kept" -gt 0 ]
}

node_env_cpu_variant() { sed -n 's/.*"cpu_variant":"\([a-z0-9_,]*\)".*/\1/p' "$1"; }
