#!/bin/sh
# Packs what scripts/gpu-check.sh runs on a lent GPU machine, which has the CUDA driver (and
# the CUDA libraries of its Python packages) but none of the Debian -dev packages and no
# network: the binaries of a CUDA=1 build (stripped), and every shared library they load
# that such a machine may lack, found with ldd. Left out: the C library and the toolchain's
# runtime (every machine has them, newer), the driver (libcuda: it must match the kernel),
# and cuBLAS, cuBLASLt and NCCL (about 800 MiB together, over the 64 MiB a run carries:
# gpu-check.sh finds the machine's own copies). Writes DEST/bundle.tar.xz and
# DEST/MANIFEST (every file with its size, and the libraries left to the machine).
#
# usage: scripts/gpu-bundle.sh BUILD DEST   (make gpu-bundle runs it)
set -eu

BUILD=${1:?usage: gpu-bundle.sh BUILD DEST}
DEST=${2:?usage: gpu-bundle.sh BUILD DEST}
# The serving binaries and the suites gpu-check.sh runs (the worker and split-pair suites
# start bin/river-worker and bin/riverd from beside their own directory).
BINS="bin/river bin/river-worker bin/riverd bin/river-cuda-bench"
TESTS="cuda_ops backend_ops backend golden exit generate router worker split"
# The machine's own copies of these are used (see above).
SKIP_RE='^(linux-vdso|ld-linux|libc\.|libm\.|libdl\.|libpthread\.|librt\.|libresolv\.|libutil\.|libstdc\+\+|libgcc_s|libcuda\.|libcublas|libcublasLt|libnccl)'

stage=$DEST/stage
rm -rf "$stage" "$DEST/bundle.tar.xz"
mkdir -p "$stage/bin" "$stage/tests" "$stage/lib"
files=""
for b in $BINS; do
    files="$files $b"
done
for t in $TESTS; do
    [ -x "$BUILD/tests/test_$t" ] && files="$files tests/test_$t"
done
for f in $files; do
    if [ ! -x "$BUILD/$f" ]; then
        echo "gpu-bundle: $BUILD/$f is not built" >&2
        exit 1
    fi
    cp "$BUILD/$f" "$stage/$f"
    # Debug info is most of a binary; the device code (.nv_fatbin) and the symbols that
    # backtraces need stay.
    strip --strip-debug "$stage/$f"
done

: >"$DEST/MANIFEST.libs"
left=""
for f in $files; do
    # "name => path (addr)" lines; a library ldd cannot find is an error here, not there.
    if ldd "$BUILD/$f" | grep -q 'not found'; then
        echo "gpu-bundle: $f needs a library that is not installed here:" >&2
        ldd "$BUILD/$f" | grep 'not found' >&2
        exit 1
    fi
    ldd "$BUILD/$f" | awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }' >>"$DEST/MANIFEST.libs"
done
sort -u "$DEST/MANIFEST.libs" -o "$DEST/MANIFEST.libs"
while read -r name path; do
    if echo "$name" | grep -Eq "$SKIP_RE"; then
        case "$name" in
        libcublas* | libnccl*) left="$left $name" ;;
        esac
        continue
    fi
    # The soname the binaries ask for, with the real file's bytes (ldd shows the link).
    cp -L "$path" "$stage/lib/$name"
    strip --strip-unneeded "$stage/lib/$name" 2>/dev/null || true
done <"$DEST/MANIFEST.libs"
rm -f "$DEST/MANIFEST.libs"

{
    echo "# river GPU bundle: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)," \
        "built $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(. /etc/os-release && echo "$PRETTY_NAME")"
    echo "# glibc needed: $(for f in $files; do objdump -T "$stage/$f"; done 2>/dev/null |
        grep -o 'GLIBC_[0-9.]*' | sort -t. -k2 -n -u | tail -n 1)"
    echo "# libraries gpu-check.sh takes from the machine:$(echo "$left" | tr ' ' '\n' |
        sort -u | tr '\n' ' ')"
    (cd "$stage" && find . -type f -printf '%s %p\n' | sort -k2)
} >"$DEST/MANIFEST"
cp "$DEST/MANIFEST" "$stage/MANIFEST"
tar -C "$stage" -cJf "$DEST/bundle.tar.xz" .
rm -rf "$stage"
raw=$(awk '$1 ~ /^[0-9]+$/ { s += $1 } END { print s }' "$DEST/MANIFEST")
packed=$(stat -c %s "$DEST/bundle.tar.xz")
echo "gpu-bundle: $DEST/bundle.tar.xz: $((packed / 1024)) KiB ($((raw / 1024)) KiB unpacked)"
# What a run on the lent machine carries, all of it, is capped at 64 MiB: the working tree
# (tracked files and untracked ones git does not ignore) and the bundle. Test data that
# other work adds counts against the same limit, so it is measured here, every time.
limit=$((64 * 1024 * 1024))
tree=$(git ls-files -z -co --exclude-standard | xargs -0 stat -c %s 2>/dev/null |
    awk '{ s += $1 } END { print s + 0 }')
total=$((tree + packed)) # the bundle is ignored (.gitignore) and carried beside the tree
echo "gpu-bundle: working tree $((tree / 1024)) KiB + bundle $((packed / 1024)) KiB =" \
    "$((total / 1024)) KiB of the $((limit / 1024)) KiB a GPU run carries"
if [ "$total" -gt "$limit" ]; then
    echo "gpu-bundle: over the limit by $(((total - limit) / 1024)) KiB: the run would not" \
        "reach the machine (move test data out of the tree, or shrink the bundle)" >&2
    exit 1
fi
