#!/bin/sh
# The main job, served: start riverd and one river-worker on the bundled real model
# (TinyStories-656K, from its Hugging Face safetensors and tokenizer.json), send a prompt
# with riverctl, show the streamed answer, then stop both daemons. Everything listens on
# ipc:// sockets in a temporary directory, so nothing is left behind. The three talk
# CurveZMQ, with keys riverctl keygen makes there, as they would on a real deployment.
set -eu
cd "$(dirname "$0")/.."
bin=${BUILD:-build}/bin
model=tests/data/tinystories-656k
prompt="Once upon a time"
tmp=$(mktemp -d /tmp/river-demo.XXXXXX)
rd_pid=""
wk_pid=""
gw_pid=""
cleanup() {
    for p in $gw_pid $wk_pid $rd_pid; do
        kill -TERM "$p" 2>/dev/null || true
    done
    for p in $gw_pid $wk_pid $rd_pid; do
        wait "$p" 2>/dev/null || true
    done
    rm -rf "$tmp"
}
trap cleanup EXIT INT TERM

echo "== keys: riverd's, the worker's and riverctl's (riverctl keygen)"
"$bin/riverctl" keygen riverd --dir "$tmp/keys" > /dev/null
"$bin/riverctl" keygen demo-worker --dir "$tmp/worker" > /dev/null
"$bin/riverctl" keygen demo-client --dir "$tmp/client" > /dev/null
"$bin/riverctl" keygen demo-gateway --dir "$tmp/gateway" > /dev/null
# riverd is given the public halves: the worker's key may join as a worker, the client's
# may generate and run the admin commands. The secret halves stay where they were made.
mkdir "$tmp/keys/clients" "$tmp/keys/workers" "$tmp/keys/admin"
cp "$tmp/worker/demo-worker.key" "$tmp/keys/workers/"
cp "$tmp/client/demo-client.key" "$tmp/keys/clients/"
cp "$tmp/gateway/demo-gateway.key" "$tmp/keys/clients/"     # the gateway is a client too
cp "$tmp/client/demo-client.key" "$tmp/keys/admin/"

cat > "$tmp/riverd.yaml" <<YAML
endpoints:
  clients: ["ipc://$tmp/clients"]
  workers: ["ipc://$tmp/workers"]
  admin: "ipc://$tmp/admin"
  metrics_port: 0
log_level: warn
auth:                       # paths relative to this file
  mode: curve
  secret_key: keys/riverd.key_secret
  clients: keys/clients
  workers: keys/workers
  admin: keys/admin
YAML
cat > "$tmp/worker.yaml" <<YAML
riverd: "ipc://$tmp/workers"
id: demo-worker
model: "$model"
threads: 1
log_level: warn
auth:
  secret_key: worker/demo-worker.key_secret
  server_key: keys/riverd.key
YAML

echo "== starting riverd and a river-worker on $model"
"$bin/riverd" --config "$tmp/riverd.yaml" &
rd_pid=$!
"$bin/river-worker" --config "$tmp/worker.yaml" &
wk_pid=$!
export RIVER_ENDPOINT="ipc://$tmp/clients" RIVER_ADMIN="ipc://$tmp/admin"
export RIVER_KEY="$tmp/client/demo-client.key_secret" RIVER_SERVER_KEY="$tmp/keys/riverd.key"
i=0
until "$bin/riverctl" workers 2>/dev/null | grep -q demo-worker; do
    i=$((i + 1))
    if [ $i -gt 100 ]; then
        echo "demo: the worker did not register with riverd within 10 s" >&2
        exit 1
    fi
    sleep 0.1
done
"$bin/riverctl" workers
echo "== riverctl generate \"$prompt\" --max-tokens 96"
printf '%s' "$prompt"
"$bin/riverctl" generate "$prompt" --max-tokens 96
echo

# The OpenAI-compatible gateway: a client of riverd with its own key, on a free port, with
# an API key of its own (stored hashed) and the ChatML template of tests/data/gateway
# (the story model has none). The key lives in files only (mode 600), never on a command
# line, where every user of the machine could read it in the process list: the gateway
# hashes it from stdin and curl reads its Authorization header from a file.
(
    umask 077
    printf 'sk-demo-%s\n' "$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')" > "$tmp/api-key"
    printf 'Authorization: Bearer %s\n' "$(cat "$tmp/api-key")" > "$tmp/auth-header"
)
"$bin/river-gateway" --hash-key < "$tmp/api-key" > "$tmp/api-keys"
cat > "$tmp/gateway.yaml" <<YAML
listen:
  port: 0
riverd:
  endpoint: "ipc://$tmp/clients"
  secret_key: gateway/demo-gateway.key_secret
  server_key: keys/riverd.key
models:
  - name: tinystories
    dir: "$(pwd)/$model"
    chat_template: "$(pwd)/tests/data/gateway/chatml-stories.jinja"
api_keys: api-keys
YAML
echo "== starting river-gateway"
"$bin/river-gateway" --config "$tmp/gateway.yaml" 2> "$tmp/gateway.log" &
gw_pid=$!
port=""
i=0
while [ -z "$port" ]; do
    i=$((i + 1))
    if [ $i -gt 100 ]; then
        echo "demo: the gateway did not start within 10 s" >&2
        cat "$tmp/gateway.log" >&2
        exit 1
    fi
    sleep 0.1
    port=$(sed -n 's/.*listening on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$tmp/gateway.log")
done
echo "== curl -N http://127.0.0.1:$port/v1/chat/completions (stream: true), the SSE as sent"
curl -sN "http://127.0.0.1:$port/v1/chat/completions" \
    -H @"$tmp/auth-header" -H "Content-Type: application/json" \
    -d '{"model": "tinystories", "stream": true, "max_tokens": 12, "temperature": 0,
         "stream_options": {"include_usage": true},
         "messages": [{"role": "user", "content": "Tell me a story about a cat."}]}'
echo "== stopping the gateway"
echo "== stopping riverd and the worker"
