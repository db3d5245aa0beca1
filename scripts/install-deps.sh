#!/bin/sh
# Installs the Debian packages River builds with, when any is missing. Runs apt-get as root
# without prompting; prints nothing with --quiet when everything is already there.
set -eu
PKGS="build-essential pkg-config check libjansson-dev libpcre2-dev libutf8proc-dev \
libzmq3-dev libczmq-dev libprotobuf-c-dev protobuf-c-compiler libyaml-dev \
libmicrohttpd-dev libsystemd-dev nettle-dev curl iproute2 iptables nftables"
# iproute2, iptables and nftables: the namespaces, links, packet loss and firewall of
# `make test-multihost`.
# --fuzz adds what `make fuzz` needs (clang and its libFuzzer runtime); `make test` does not.
quiet=""
for a in "$@"; do
    case "$a" in
    --quiet) quiet=1 ;;
    --fuzz) PKGS="$PKGS clang libclang-rt-14-dev" ;;
    esac
done
missing=""
for p in $PKGS; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
        missing="$missing $p"
done
if [ -z "$missing" ]; then
    [ -n "$quiet" ] || echo "install-deps: all packages present"
    exit 0
fi
echo "install-deps: installing:$missing"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 || { echo "install-deps: need root to install:$missing" >&2; exit 1; }
    SUDO="sudo -n"
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# shellcheck disable=SC2086
$SUDO apt-get install -y -qq --no-install-recommends $missing
