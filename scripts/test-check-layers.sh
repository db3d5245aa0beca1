#!/bin/sh
# The layer check as a suite of `make test`: the tree passes it, and a copy of a small tree
# with one include pointing up (engine/ reaching into workers/), one into a folder the matrix
# does not list and one sideways between backends fails it, naming each.
set -u
here=$(cd "$(dirname "$0")" && pwd)
. "$here/suite-lib.sh"

check "the tree keeps the matrix" "$here/check-layers.sh" "$here/.."

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/engine" "$tmp/workers" "$tmp/kernels/cpu" "$tmp/kernels/cuda" "$tmp/stray"
printf '#include "workers/link.h"\n#include "kernels/ops.h"\n' > "$tmp/engine/forward.c"
printf '/* link */\n' > "$tmp/workers/link.h"
printf '#include "kernels/cuda/cuda.h"\n' > "$tmp/kernels/cpu/cpu.c"
printf '#include "common/err.h"\n' > "$tmp/kernels/ops.h"
printf '/* cuda */\n' > "$tmp/kernels/cuda/cuda.h"
printf '#include "engine/forward.h"\n' > "$tmp/stray/x.c"
out=$("$here/check-layers.sh" "$tmp" 2>&1)
rc=$?
printf '%s\n' "$out"
check "an upward include fails the check" test "$rc" -eq 1
check "it names the file, the line and the edge" \
    sh -c 'printf "%s\n" "$1" | grep -q "engine/forward.c:1 includes workers/link.h: engine may include only"' _ "$out"
check "a sideways include between backends is refused" \
    sh -c 'printf "%s\n" "$1" | grep -q "kernels/cpu/cpu.c:1 includes kernels/cuda/cuda.h"' _ "$out"
check "a folder outside the matrix is refused" \
    sh -c 'printf "%s\n" "$1" | grep -q "stray/x.c is in folder stray, which the matrix does not list"' _ "$out"
check "downward includes pass" sh -c '! printf "%s\n" "$1" | grep -q "kernels/ops.h:"' _ "$out"

suite_end
