#!/bin/sh
# Installs the Debian packages River builds and tests with, when any is missing. Runs apt-get as root
# without prompting; prints nothing with --quiet when everything is already there.
set -eu
PKGS="build-essential pkg-config check libjansson-dev libpcre2-dev libutf8proc-dev \
libzmq3-dev libczmq-dev libprotobuf-c-dev protobuf-c-compiler libyaml-dev \
libmicrohttpd-dev libsystemd-dev nettle-dev curl iproute2 iptables nftables gdb"
# iproute2, iptables and nftables: the namespaces, links, packet loss and firewall of
# `make test-multihost`. gdb: the stacks of a program a test finds hung (tests/proc.h:
# test_capture_within), so that a hang on a CI machine says where it waited.
# --fuzz adds what `make fuzz` needs (clang and its libFuzzer runtime); `make test` does not.
quiet=""
for a in "$@"; do
    case "$a" in
    --quiet) quiet=1 ;;
    --fuzz) PKGS="$PKGS clang libclang-rt-14-dev" ;;
    esac
done
# Node.js and npm run the outside clients of the test suites (the official `openai` package,
# node-llama-cpp), which npm installs at test time (scripts/node-env.sh fetches a newer
# Node.js from npm where a package needs one). Debian's nodejs and npm come in only when
# there is no node at all: a machine with its own Node.js (NodeSource's, say, which brings
# its own npm) keeps it, and a nodejs package that is installed but not on PATH is left as
# it is rather than replaced.
if ! command -v node >/dev/null 2>&1; then
    if dpkg-query -W -f='${Status}' nodejs 2>/dev/null | grep -q "install ok installed"; then
        [ -n "$quiet" ] || echo "install-deps: nodejs is installed but node is not on PATH"
    else
        PKGS="$PKGS nodejs npm"
    fi
fi
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
