#!/bin/sh
# The official `openai` npm package against river-gateway (tests/openai/client.mjs):
# installs it under $BUILD/npm at test time (never vendored into the repository), starts
# riverd, a worker on the bundled TinyStories model and the gateway (CurveZMQ keys, ipc://
# sockets and a free port, in a temporary directory), runs the client, stops them all.
# Then the same with a tiny random model of the Llama 3 vocabulary for tool calls,
# structured output and logprobs (tests/openai/tools.mjs, with ajv from npm checking the
# outputs against their schemas).
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

# start NAME MODEL_DIR TEMPLATE WORKER_YAML_EXTRA: riverd, a worker on MODEL_DIR and a
# gateway serving it as NAME with the chat template file TEMPLATE, each in its own files
# under $tmp/NAME; sets port to the gateway's.
start() {
    name=$1 model=$2 template=$3 extra=$4
    d=$tmp/$name
    mkdir "$d"
    cat >"$d/riverd.yaml" <<YAML
endpoints:
  clients: ["ipc://$d/clients"]
  workers: ["ipc://$d/workers"]
  admin: "ipc://$d/admin"
  metrics_port: 0
auth:
  secret_key: "$tmp/keys/riverd.key_secret"
  clients: "$tmp/keys/clients"
  workers: "$tmp/keys/workers"
  admin: "$tmp/keys/admin"
log_level: warn
YAML
    cat >"$d/worker.yaml" <<YAML
riverd: "ipc://$d/workers"
model: "$model"
threads: 1
log_level: warn
auth:
  secret_key: $tmp/own/worker.key_secret
  server_key: $tmp/keys/riverd.key
$extra
YAML
    cat >"$d/gateway.yaml" <<YAML
listen:
  port: 0
riverd:
  endpoint: "ipc://$d/clients"
  secret_key: $tmp/own/gateway.key_secret
  server_key: $tmp/keys/riverd.key
models:
  - name: $name
    dir: "$model"
    chat_template: "$template"
api_keys: $tmp/api-keys
YAML
    "$bin/riverd" --config "$d/riverd.yaml" 2>"$tmp/$name-riverd.log" &
    pids="$pids $!"
    "$bin/river-worker" --config "$d/worker.yaml" 2>"$tmp/$name-worker.log" &
    pids="$pids $!"
    "$bin/river-gateway" --config "$d/gateway.yaml" 2>"$tmp/$name-gateway.log" &
    pids="$pids $!"
    i=0
    port=""
    while [ -z "$port" ]; do
        i=$((i + 1))
        [ $i -le 100 ] || fail "the $name gateway did not start within 10 s"
        sleep 0.1
        port=$(sed -n 's/.*listening on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' \
            "$tmp/$name-gateway.log")
    done
    # The worker registers with riverd within a few heartbeats; a completion is the check.
    i=0
    until curl -sf -o /dev/null -H @"$tmp/auth-header" \
        -d "{\"model\":\"$name\",\"prompt\":\"Hi\",\"max_tokens\":1}" \
        "http://127.0.0.1:$port/v1/completions"; do
        i=$((i + 1))
        [ $i -le 300 ] || fail "no completion from $name within 30 s"
        sleep 0.1
    done
}

start stories "$(pwd)/tests/data/tinystories-656k" \
    "$(pwd)/tests/data/gateway/chatml-stories.jinja" ""
# run SCRIPT [ENV...]: one client script against the gateway on $port; its check lines
# are printed and its counts added up, so that one summary ends the suite.
checks=0
failures=0
run() {
    script=$1
    shift
    env RIVER_NPM_DIR="$npm_dir" RIVER_GATEWAY_URL="http://127.0.0.1:$port/v1" \
        RIVER_API_KEY="$key" "$@" "$NODE" "$script" >"$tmp/out.txt" 2>&1
    rc=$?
    grep -v '^[0-9]*%: Checks: ' "$tmp/out.txt"
    line=$(grep '^[0-9]*%: Checks: ' "$tmp/out.txt" | tail -n 1)
    [ -n "$line" ] || { rc=1; line="0%: Checks: 1, Failures: 1, Errors: 0"; }
    checks=$((checks + $(echo "$line" | sed -E 's/.*Checks: ([0-9]+).*/\1/')))
    failures=$((failures + $(echo "$line" | sed -E 's/.*Failures: ([0-9]+).*/\1/')))
    [ $rc -eq 0 ] || [ "$failures" -gt 0 ] || failures=$((failures + 1))
}
run tests/openai/client.mjs

# Tool calls, structured output and logprobs need a vocabulary with JSON's characters: a
# tiny random model with the Llama 3 tokenizer (`river synth --shape llama3-tiny`), its
# river, and the Llama 3.1 chat template, whose tool calls are JSON objects. ajv (npm, at
# test time) checks the outputs against their schemas.
node_env_install ajv ajv@8
tiny=$tmp/llama3-tiny
"$bin/river" synth --shape llama3-tiny --dtype bf16 --out "$tiny" --quiet \
    >"$tmp/synth.log" 2>&1 || fail "river synth --shape llama3-tiny failed"
cp tests/data/tokenizers/llama3/tokenizer.json tests/data/tokenizers/llama3/tokenizer_config.json \
    "$tiny/"
"$bin/river" quant --model "$tiny" --start 1 >"$tmp/quant.log" 2>&1 ||
    fail "river quant on llama3-tiny failed"
start tiny "$tiny" "$(pwd)/tests/data/chat-templates/meta-llama-Llama-3.1-8B-Instruct.jinja" \
    "river: \"$tiny/river-q4-g64-hqq.safetensors\"
max_seqs: 8
exit:
  rule: cosine
  tau: 0.95"
run tests/openai/tools.mjs RIVER_MODEL=tiny
pct=$((checks ? 100 * (checks - failures) / checks : 100))
echo "$pct%: Checks: $checks, Failures: $failures, Errors: 0"
[ "$failures" -eq 0 ]
