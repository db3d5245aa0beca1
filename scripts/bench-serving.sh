#!/bin/sh
# Serving overhead: decode tokens/s of one greedy stream through riverd + river-worker
# (riverctl, ipc:// sockets) against in-process `river run`, same model, prompt, threads
# and length. Usage: scripts/bench-serving.sh [MODEL [TOKENIZER [TOKENS [THREADS]]]]
set -eu
cd "$(dirname "$0")/.."
bin=${BUILD:-build}/bin
model=${1:-tests/data/kjv-12l}
tok=${2:-}
n=${3:-256}
threads=${4:-1}
prompt="In the beginning"
tmp=$(mktemp -d /tmp/river-bench.XXXXXX)
rd_pid=""
wk_pid=""
cleanup() {
    for p in $wk_pid $rd_pid; do kill -TERM "$p" 2>/dev/null || true; done
    for p in $wk_pid $rd_pid; do wait "$p" 2>/dev/null || true; done
    rm -rf "$tmp"
}
trap cleanup EXIT INT TERM
tokarg=""
tokyaml=""
if [ -n "$tok" ]; then
    tokarg="--tokenizer $tok"
    tokyaml="tokenizer: \"$tok\""
fi
cat > "$tmp/riverd.yaml" <<YAML
endpoints:
  clients: ["ipc://$tmp/clients"]
  workers: ["ipc://$tmp/workers"]
  admin: "ipc://$tmp/admin"
  metrics_port: 0
log_level: warn
auth: {mode: plain}         # the measurement is of the engine, on a private directory
YAML
cat > "$tmp/worker.yaml" <<YAML
riverd: "ipc://$tmp/workers"
id: bench-worker
model: "$model"
$tokyaml
threads: $threads
max_seqs: 1
log_level: warn
auth: {mode: plain}
YAML
"$bin/riverd" --config "$tmp/riverd.yaml" &
rd_pid=$!
"$bin/river-worker" --config "$tmp/worker.yaml" &
wk_pid=$!
export RIVER_ENDPOINT="ipc://$tmp/clients" RIVER_ADMIN="ipc://$tmp/admin"
i=0
until "$bin/riverctl" workers 2>/dev/null | grep -q bench-worker; do
    i=$((i + 1))
    [ $i -le 600 ] || { echo "bench-serving: the worker did not register" >&2; exit 1; }
    sleep 0.1
done
# One warm-up request each, then the measured ones.
# shellcheck disable=SC2086
"$bin/river" run --model "$model" $tokarg --prompt "$prompt" --max-tokens 8 --ignore-eos \
    --threads "$threads" --output json > /dev/null
"$bin/riverctl" --output json generate "$prompt" --max-tokens 8 --ignore-eos > /dev/null
# shellcheck disable=SC2086
local_tps=$("$bin/river" run --model "$model" $tokarg --prompt "$prompt" --max-tokens "$n" \
    --ignore-eos --threads "$threads" --output json | sed -E 's/.*"decode_tok_s":([0-9.e+-]+).*/\1/')
served_tps=$("$bin/riverctl" --output json generate "$prompt" --max-tokens "$n" --ignore-eos |
    sed -E 's/.*"decode_tok_s":([0-9.e+-]+).*/\1/')
echo "model $model, $n tokens, $threads thread(s), greedy, one stream"
echo "in-process river run: $local_tps tok/s"
echo "through riverd:       $served_tps tok/s"
awk -v a="$local_tps" -v b="$served_tps" 'BEGIN { printf "loss: %.2f%%\n", 100 * (1 - b / a) }'
