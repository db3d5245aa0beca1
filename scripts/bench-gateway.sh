#!/bin/sh
# Gateway overhead: one greedy stream of the same prompt and length through river-gateway +
# riverd + river-worker (HTTP, SSE, timed by the client: scripts/bench-gateway.mjs), through
# riverd alone (riverctl), and in-process (`river run`); decode tokens/s and time to first
# token of each, RUNS times (the median is printed). river run's time to first token is its
# prefill (the first token comes out of it). Each request's prompt starts with its own tag
# (path and run), so that none finds another's prompt in the worker's prefix cache: every
# first token is cold. Plain ZMQ on ipc:// in a private directory.
# Usage: scripts/bench-gateway.sh [MODEL [TOKENS [THREADS [RUNS]]]]; PROMPT (default "In the
# beginning") sets the prompt, a long one the time to first token of a long prompt.
set -eu
cd "$(dirname "$0")/.."
bin=${BUILD:-build}/bin
model=${1:-tests/data/kjv-12l}
n=${2:-200}
threads=${3:-1}
runs=${4:-5}
prompt=${PROMPT:-"In the beginning"}
command -v node >/dev/null 2>&1 || { echo "bench-gateway: needs node" >&2; exit 1; }
tmp=$(mktemp -d /tmp/river-bench-gw.XXXXXX)
pids=""
cleanup() {
    for p in $pids; do kill -TERM "$p" 2>/dev/null || true; done
    for p in $pids; do wait "$p" 2>/dev/null || true; done
    rm -rf "$tmp"
}
trap cleanup EXIT INT TERM
cat > "$tmp/riverd.yaml" <<YAML
endpoints:
  clients: ["ipc://$tmp/clients"]
  workers: ["ipc://$tmp/workers"]
  admin: "ipc://$tmp/admin"
  metrics_port: 0
# A shared, busy machine may stall a process for seconds: do not call the worker dead.
heartbeat: {interval: 1s, liveness: 30}
log_level: warn
auth: {mode: plain}
YAML
cat > "$tmp/worker.yaml" <<YAML
riverd: "ipc://$tmp/workers"
id: bench-worker
model: "$(pwd)/$model"
threads: $threads
max_seqs: 1
log_level: warn
auth: {mode: plain}
YAML
cat > "$tmp/gateway.yaml" <<YAML
listen: {port: 0}
riverd: {endpoint: "ipc://$tmp/clients", auth_mode: plain}
models: [{name: bench}]
YAML
"$bin/riverd" --config "$tmp/riverd.yaml" & pids="$pids $!"
"$bin/river-worker" --config "$tmp/worker.yaml" & pids="$pids $!"
"$bin/river-gateway" --config "$tmp/gateway.yaml" 2> "$tmp/gateway.log" & pids="$pids $!"
export RIVER_ENDPOINT="ipc://$tmp/clients" RIVER_ADMIN="ipc://$tmp/admin"
i=0
until "$bin/riverctl" workers 2>/dev/null | grep -q bench-worker; do
    i=$((i + 1))
    [ $i -le 600 ] || { echo "bench-gateway: the worker did not register" >&2; exit 1; }
    sleep 0.1
done
port=$(sed -n 's/.*listening on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$tmp/gateway.log")
[ -n "$port" ] || { echo "bench-gateway: the gateway did not start" >&2; exit 1; }
url="http://127.0.0.1:$port"
# A field of a JSON line; a line without it (a failed run) stops the benchmark, shown.
field() {
    v=$(sed -nE "s/.*\"$1\":([0-9.e+-]+).*/\1/p")
    [ -n "$v" ] || { echo "bench-gateway: no $1 in: $out" >&2; exit 1; }
    echo "$v"
}
# Warm-up, then RUNS of each, interleaved so that a busy spell hits all three alike.
"$bin/river" run --model "$model" --prompt "$prompt" --max-tokens 8 --ignore-eos \
    --threads "$threads" --output json > /dev/null
node scripts/bench-gateway.mjs "$url" bench "$prompt" 8 > /dev/null
: > "$tmp/local"; : > "$tmp/served"; : > "$tmp/gw"
r=0
while [ $r -lt "$runs" ]; do
    out=$("$bin/river" run --model "$model" --prompt "(local $r) $prompt" --max-tokens "$n" \
        --ignore-eos --threads "$threads" --output json)
    pre=$(echo "$out" | field prefill_tok_s)
    np=$(echo "$out" | sed -E 's/.*"prompt_ids":\[([0-9, ]*)\].*/\1/' | tr ',' '\n' | wc -l)
    echo "$(echo "$out" | field decode_tok_s) $(awk -v p="$pre" -v n="$np" 'BEGIN{print n/p}')" \
        >> "$tmp/local"
    out=$("$bin/riverctl" --output json generate "(riverd $r) $prompt" --max-tokens "$n" \
        --ignore-eos)
    echo "$(echo "$out" | field decode_tok_s) $(echo "$out" | field first_token_s)" >> "$tmp/served"
    out=$(node scripts/bench-gateway.mjs "$url" bench "(gateway $r) $prompt" "$n")
    echo "$(echo "$out" | field decode_tok_s) $(echo "$out" | field first_token_s)" >> "$tmp/gw"
    r=$((r + 1))
done
med() { cut -d' ' -f"$2" "$1" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
echo "model $model, $n tokens, $threads thread(s), greedy, one stream, median of $runs"
printf '%-28s %10s %14s\n' "" "decode tok/s" "first token ms"
for k in local served gw; do
    case $k in local) name="river run (in-process)" ;; served) name="riverd (riverctl)" ;;
        gw) name="river-gateway + riverd" ;; esac
    printf '%-28s %10.1f %14.2f\n' "$name" "$(med "$tmp/$k" 1)" \
        "$(awk -v s="$(med "$tmp/$k" 2)" 'BEGIN{print s*1000}')"
done
awk -v a="$(med "$tmp/local" 1)" -v b="$(med "$tmp/gw" 1)" -v c="$(med "$tmp/served" 1)" \
    'BEGIN { printf "decode loss: gateway vs river run %.2f%%, gateway vs riverd %.2f%%\n",
             100 * (1 - b / a), 100 * (1 - b / c) }'
