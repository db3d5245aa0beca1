#!/bin/sh
# The official `openai` npm package against river-gateway (tests/openai/client.mjs):
# installs it under $BUILD/npm at test time (never vendored into the repository), starts
# riverd, a worker on the bundled TinyStories model and the gateway (CurveZMQ keys, ipc://
# sockets and a free port, in a temporary directory), runs the client, stops them all.
# Prints the client's check lines and a Check-style summary for scripts/run-tests.sh. When
# node or npm is missing or the registry cannot be reached, it says so in one SKIP line and
# counts no check (scripts/node-env.sh; `make test` lists the skip, and CI=true fails on it).
# It runs on a Node.js that the installed openai's engines field accepts (node-env.sh).
set -u
cd "$(dirname "$0")/.."
build=${BUILD:-build}
bin=$build/bin
npm_dir=$(pwd)/$build/npm
skip() {
    echo "SKIP (missing): openai client: $1"
    echo "100%: Checks: 0, Failures: 0, Errors: 0"
    exit 0
}
. scripts/node-env.sh
node_env_init "$npm_dir"
node_env_install openai openai
node_env_select openai
echo "openai client: openai $(sed -n 's/^  "version": "\(.*\)",$/\1/p' \
    "$npm_dir/node_modules/openai/package.json") on Node.js $("$NODE" -p process.versions.node)"

tmp=$(mktemp -d /tmp/river-openai.XXXXXX)
pids=""
cleanup() {
    for p in $pids; do kill -TERM "$p" 2>/dev/null || true; done
    for p in $pids; do wait "$p" 2>/dev/null || true; done
    rm -rf "$tmp"
}
trap cleanup EXIT INT TERM
fail() {
    echo "openai client: $1"
    for f in "$tmp"/*.log; do echo "--- $f"; tail -n 20 "$f"; done
    echo "0%: Checks: 1, Failures: 1, Errors: 0"
    exit 1
}

"$bin/riverctl" keygen riverd --dir "$tmp/keys" >/dev/null
"$bin/riverctl" keygen worker --dir "$tmp/own" >/dev/null
"$bin/riverctl" keygen gateway --dir "$tmp/own" >/dev/null
mkdir "$tmp/keys/clients" "$tmp/keys/workers" "$tmp/keys/admin"
cp "$tmp/own/worker.key" "$tmp/keys/workers/"
cp "$tmp/own/gateway.key" "$tmp/keys/clients/"
# The API key stays off every command line (the process list shows those to every user):
# hashed from a file on stdin, curl's header read from a file, the client's key an
# environment variable.
key="sk-river-$$-$(date +%s)"
(
    umask 077
    printf '%s\n' "$key" >"$tmp/api-key"
    printf 'Authorization: Bearer %s\n' "$key" >"$tmp/auth-header"
)
"$bin/river-gateway" --hash-key <"$tmp/api-key" >"$tmp/api-keys"
model=$(pwd)/tests/data/tinystories-656k
cat >"$tmp/riverd.yaml" <<YAML
endpoints:
  clients: ["ipc://$tmp/clients"]
  workers: ["ipc://$tmp/workers"]
  admin: "ipc://$tmp/admin"
  metrics_port: 0
log_level: warn
YAML
cat >"$tmp/worker.yaml" <<YAML
riverd: "ipc://$tmp/workers"
model: "$model"
threads: 1
log_level: warn
auth:
  secret_key: own/worker.key_secret
  server_key: keys/riverd.key
YAML
cat >"$tmp/gateway.yaml" <<YAML
listen:
  port: 0
riverd:
  endpoint: "ipc://$tmp/clients"
  secret_key: own/gateway.key_secret
  server_key: keys/riverd.key
models:
  - name: stories
    dir: "$model"
    chat_template: "$(pwd)/tests/data/gateway/chatml-stories.jinja"
api_keys: api-keys
YAML
"$bin/riverd" --config "$tmp/riverd.yaml" 2>"$tmp/riverd.log" &
pids="$pids $!"
"$bin/river-worker" --config "$tmp/worker.yaml" 2>"$tmp/worker.log" &
pids="$pids $!"
"$bin/river-gateway" --config "$tmp/gateway.yaml" 2>"$tmp/gateway.log" &
pids="$pids $!"
i=0
port=""
while [ -z "$port" ]; do
    i=$((i + 1))
    [ $i -le 100 ] || fail "the gateway did not start within 10 s"
    sleep 0.1
    port=$(sed -n 's/.*listening on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$tmp/gateway.log")
done
# The worker registers with riverd within a few heartbeats; a completion is the check.
i=0
until curl -sf -o /dev/null -H @"$tmp/auth-header" \
    -d '{"model":"stories","prompt":"Hi","max_tokens":1}' \
    "http://127.0.0.1:$port/v1/completions"; do
    i=$((i + 1))
    [ $i -le 100 ] || fail "no completion within 10 s"
    sleep 0.1
done
RIVER_NPM_DIR=$npm_dir RIVER_GATEWAY_URL="http://127.0.0.1:$port/v1" RIVER_API_KEY=$key \
    "$NODE" tests/openai/client.mjs
