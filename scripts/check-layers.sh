#!/bin/sh
# Fails on any #include "..." that crosses the folders' layers in a direction the matrix
# below does not allow, so the layering docs/ARCHITECTURE.md describes cannot erode silently.
#
# The matrix lists folders from the bottom up. Each line names a folder and the folders its
# files may include besides their own; a line may only name folders listed above it (the
# script checks that too), so no edge in it can point up and it can hold no cycle. "proto"
# is the protobuf-c code the Makefile generates from proto/*.proto. A folder of source files
# that the matrix does not list is an error, so a new folder gets a place before it lands.
#
# Usage: scripts/check-layers.sh [ROOT]   (default: the repository this script is in)
set -u

MATRIX='
proto
common          proto
kernels         common
kernels/cpu     kernels common
kernels/cuda    kernels common
kernels/opaque  kernels/cpu kernels common
text            common
model           kernels common
engine          model text kernels common
offline         engine model text kernels/cpu kernels common
client          common proto
workers         engine model text kernels common proto
daemon          common proto
gateway         client model text common proto
cli             offline engine model text kernels/cpu kernels common
ops             client kernels/cuda kernels common proto
fuzz            gateway daemon workers client offline engine model text kernels/opaque kernels/cuda kernels/cpu kernels common proto
tests           fuzz gateway daemon workers client offline engine model text kernels/opaque kernels/cuda kernels/cpu kernels common proto
'

root=${1:-$(cd "$(dirname "$0")/.." && pwd)}
cd "$root" || exit 2

# Every source file outside build trees, node_modules and the gitignored folders, as
# "path" lines; then every include of a project header in them, as "path:line:target".
files=$(find . \( -name 'build*' -o -name node_modules -o -name '.git' -o -name '.gl' \
                 -o -name '.whl' -o -name 'gpu-bundle' \) -prune -o \
              -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) -print |
        sed 's|^\./||' | sort)

printf '%s\n' "$files" | awk -v matrix="$MATRIX" '
BEGIN {
    n = split(matrix, lines, "\n")
    bad = 0
    for (i = 1; i <= n; i++) {
        m = split(lines[i], w, /[ \t]+/)
        if (m == 0 || w[1] == "") continue
        if (w[1] in listed) { printf "check-layers: the matrix lists %s twice\n", w[1]; bad = 1 }
        for (j = 2; j <= m; j++) {
            if (w[j] == "") continue
            if (!(w[j] in listed)) {
                printf "check-layers: the matrix lets %s include %s, which is not below it\n", w[1], w[j]
                bad = 1
            }
            allow[w[1] SUBSEP w[j]] = 1
            may[w[1]] = may[w[1]] " " w[j]
        }
        listed[w[1]] = 1
    }
    if (bad) exit 2
}
{
    file = $0
    dir = file; sub(/\/[^\/]*$/, "", dir)
    if (dir == file) dir = "."
    if (!(dir in listed)) {
        printf "check-layers: %s is in folder %s, which the matrix does not list\n", file, dir
        errs++
        next
    }
    ln = 0
    while ((getline line < file) > 0) {
        ln++
        if (line !~ /^[ \t]*#[ \t]*include[ \t]*"/) continue
        inc = line; sub(/^[^"]*"/, "", inc); sub(/".*$/, "", inc)
        to = inc; sub(/\/[^\/]*$/, "", to)
        if (to == inc) to = dir        # "x.h": beside the file
        if (to == dir) continue
        if (!(to in listed)) {
            printf "check-layers: %s:%d includes %s, in folder %s, which the matrix does not list\n", file, ln, inc, to
            errs++
        } else if (!((dir SUBSEP to) in allow)) {
            printf "check-layers: %s:%d includes %s: %s may include only%s\n", file, ln, inc, dir, (dir in may ? may[dir] : " its own folder")
            errs++
        }
        edges++
    }
    close(file)
    nfiles++
}
END {
    if (bad) exit 2
    if (errs) { printf "check-layers: %d include(s) against the matrix\n", errs; exit 1 }
    printf "check-layers: %d files, %d includes across folders, all allowed\n", nfiles, edges
}'
