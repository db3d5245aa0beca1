#!/bin/sh
# `make bench-serving`: serving throughput and time to first token at several concurrent
# clients, River against llama.cpp's batched decoding, on Llama 3.2 1B's shape (`river synth
# --shape llama-3.2-1b`, random weights, bf16) exported as one GGUF file that both load.
#
#   River      riverd + one river-worker (the GGUF, THREADS threads, max_seqs 8) behind
#              river-gateway; the clients stream OpenAI text completions over HTTP (SSE,
#              scripts/bench-serving.mjs). Twice: the plain backbone, and a second stack
#              whose worker exits every token after 4 of 16 layers onto a 4-bit Exit River
#              with a 4-bit head (`river quant --bits 4 --head-bits 4 --start 4`, HQQ,
#              group 64; worker keys river, exit.rule fixed, exit.exit_layer 4).
#   llama.cpp  node-llama-cpp (llama.cpp's prebuilt CPU libraries), one context with N
#              sequences and THREADS threads, the clients' evaluations batched together
#              in-process (tests/llamacpp/ref.mjs serve): no HTTP, so River alone pays for
#              a network hop, a daemon and a gateway.
#
# For each client count N of CLIENTS (default "1 4 8"), each system runs a warm-up round of
# short requests and then ROUNDS rounds (default 3); a round sends one request from each of
# N clients at once, each a distinct prompt (the same prompts for every system), streaming
# GEN greedy tokens (default 64) with no stop on EOS, and ends with the last stream. The
# systems take turns within each client count, in an order that reverses from one count to
# the next, so that a slow spell of the shared machine does not fall on one system only.
# Printed per N and system: aggregate tokens/s (every generated token of a round over the
# round's wall time, prefill included; the median over the rounds), the mean and p99 time
# to first token over every request of the rounds (from sending it to its first token),
# and the ratios to llama.cpp. Then the old single-stream figure: one greedy stream of GEN
# tokens through riverd (riverctl) against in-process `river run`, both decode tok/s.
#
# The model, its GGUF file and the river are written once under $BUILD/bench-quant (shared
# with scripts/bench-quant.sh) and reused; node-llama-cpp is installed under $BUILD/npm.
set -u
cd "$(dirname "$0")/.." || exit 1
unset RIVER_SIMD # River at its native SIMD level, as a deployment runs it
CLIENTS=${CLIENTS:-"1 4 8"}
GEN=${GEN:-64}
ROUNDS=${ROUNDS:-3}
THREADS=${THREADS:-2}
BENCH=bench-serving
. scripts/bench-1b.sh
bench_llamacpp
bench_model
bench_gguf bf16
gguf=$dir/1b-bf16.gguf
# The river beside the GGUF, by the name River looks for there (STEM.river-q4-g64-hqq);
# built from the GGUF itself, since a river refuses to load against another model.
riv=$dir/1b-bf16.river-q4-g64-hqq.safetensors
once "$riv" "$dir/river-gguf.log" "$river" quant --model "$gguf" --bits 4 --head-bits 4 --start 4 \
    --out "$riv" --threads "$THREADS"
bin=$build/bin

tmp=$(mktemp -d /tmp/river-bench-serving.XXXXXX)
pids=""
cleanup() {
    for p in $pids; do kill -TERM "$p" 2>/dev/null || true; done
    for p in $pids; do wait "$p" 2>/dev/null || true; done
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

# stack NAME [WORKER YAML...]: riverd, one worker and a gateway on ipc:// sockets of their own
# in $tmp/NAME, so that each worker gets only its own system's requests. The KV pool is
# sized for these requests (a short prompt and GEN tokens, max_seqs of them): by default a
# worker reserves at least one full 131072-position context of this model, 4 GiB of f16
# K/V, and two of those beside llama.cpp would crowd the machine for nothing.
stack() {
    name=$1 s=$tmp/$1
    shift
    mkdir -p "$s"
    cat >"$s/riverd.yaml" <<YAML
endpoints:
  clients: ["ipc://$s/clients"]
  workers: ["ipc://$s/workers"]
  admin: "ipc://$s/admin"
  metrics_port: 0
# A shared, busy machine may stall a process for seconds: do not call the worker dead.
heartbeat: {interval: 1s, liveness: 30}
log_level: warn
auth: {mode: plain}         # the measurement is of the engine, on a private directory
YAML
    {
        cat <<YAML
riverd: "ipc://$s/workers"
id: $name
model: "$gguf"
threads: $THREADS
max_seqs: 8
kv: {pages: 512}
log_level: warn
auth: {mode: plain}
YAML
        for line in "$@"; do echo "$line"; done
    } >"$s/worker.yaml"
    cat >"$s/gateway.yaml" <<YAML
listen: {port: 0}
riverd: {endpoint: "ipc://$s/clients", auth_mode: plain}
models: [{name: bench}]
log_level: info
YAML
    "$bin/riverd" --config "$s/riverd.yaml" 2>"$s/riverd.log" &
    pids="$pids $!"
    "$bin/river-worker" --config "$s/worker.yaml" 2>"$s/worker.log" &
    pids="$pids $!"
    "$bin/river-gateway" --config "$s/gateway.yaml" 2>"$s/gateway.log" &
    pids="$pids $!"
}
# ready NAME: waits for NAME's worker to register and its gateway to listen; prints the URL.
ready() {
    s=$tmp/$1
    i=0
    until RIVER_ADMIN="ipc://$s/admin" "$bin/riverctl" workers 2>/dev/null | grep -q "$1"; do
        i=$((i + 1))
        [ $i -le 3000 ] || die "the $1 worker did not register" "$s/worker.log"
        sleep 0.1
    done
    port=$(sed -n 's/.*listening on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$s/gateway.log")
    [ -n "$port" ] || die "the $1 gateway did not start" "$s/gateway.log"
    echo "http://127.0.0.1:$port"
}
echo "$BENCH: starting two River stacks (plain, exit 4/16) on $gguf" >&2
stack river
stack river-exit4 "river: \"$riv\"" "exit: {rule: fixed, exit_layer: 4}"
url_river=$(ready river) || exit 1
url_exit=$(ready river-exit4) || exit 1

echo "bench-serving: Llama 3.2 1B shape, bf16 GGUF, random weights; node-llama-cpp $version (llama.cpp CPU, prebuilt); $THREADS threads, $GEN tokens a request, greedy, no EOS stop; clients $CLIENTS; $ROUNDS rounds; load: $(cut -d' ' -f1-3 /proc/loadavg)"
results=$dir/serving-results.txt
: >"$results"
# measure SYSTEM N PROMPTS: one system's warm-up and rounds at N clients, appended to the
# results as "SYSTEM N round R WALL_S TOKENS" and "SYSTEM N ttft SECONDS".
measure() {
    echo "$BENCH: $1, $2 client(s)" >&2
    case $1 in
    llama.cpp)
        "$NODE" tests/llamacpp/ref.mjs serve --model "$gguf" --prompts "$3" --clients "$2" \
            --rounds "$ROUNDS" --tokens "$GEN" --threads "$THREADS"
        ;;
    river) "$NODE" scripts/bench-serving.mjs "$url_river" bench "$3" "$2" "$ROUNDS" "$GEN" ;;
    river-exit4) "$NODE" scripts/bench-serving.mjs "$url_exit" bench "$3" "$2" "$ROUNDS" "$GEN" ;;
    esac >"$tmp/out" 2>"$tmp/err" || die "$1 at $2 client(s) failed" "$tmp/err"
    sed "s/^/$1 $2 /" "$tmp/out" >>"$results"
}
order="river river-exit4 llama.cpp"
for n in $CLIENTS; do
    # Distinct prompts, which differ in their first tokens, so that River's prefix cache
    # never reuses one request's pages for another: a warm-up round (0), then ROUNDS.
    p=$tmp/prompts-$n.txt
    awk -v n="$n" -v r="$ROUNDS" 'BEGIN {
        for (i = 0; i <= r; i++)
            for (c = 1; c <= n; c++)
                printf "Story %d.%d.%d: once upon a time, in a small village by the sea, there lived\n", n, i, c
    }' >"$p"
    for sys in $order; do
        measure "$sys" "$n" "$p"
    done
    order=$(echo "$order" | awk '{for (i = NF; i > 0; i--) printf "%s%s", $i, (i > 1 ? " " : "\n")}')
done

# stat SYSTEM N: "TOK_S MEAN_TTFT_MS P99_TTFT_MS", the median over rounds of tokens / wall and
# the mean and p99 (nearest rank) of every request's time to first token.
stat() {
    tps=$(awk -v s="$1" -v n="$2" '$1 == s && $2 == n && $3 == "round" {print $6 / $5}' "$results" |
        sort -g | awk '{a[NR] = $1} END {if (NR) print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}')
    ttft=$(awk -v s="$1" -v n="$2" '$1 == s && $2 == n && $3 == "ttft" {print $4 * 1000}' "$results" |
        sort -g | awk '{a[NR] = $1; t += $1} END {
            if (NR) { k = int(0.99 * NR); if (k < 0.99 * NR) k++; printf "%.0f %.0f", t / NR, a[k] } }')
    echo "${tps:-0} ${ttft:-0 0}"
}
printf '\n%-8s %-26s %12s %14s %13s\n' clients system "tok/s" "mean TTFT ms" "p99 TTFT ms"
for n in $CLIENTS; do
    for sys in river river-exit4 llama.cpp; do
        case $sys in
        river) label="River" ;;
        river-exit4) label="River, exit 4/16" ;;
        *) label="llama.cpp (node-llama-cpp)" ;;
        esac
        # shellcheck disable=SC2046 # three numbers, split on purpose
        set -- $(stat "$sys" "$n")
        printf '%-8s %-26s %12.2f %14s %13s\n' "$n" "$label" "$1" "$2" "$3"
        eval "tps_$(echo "$sys" | tr -c 'a-z0-9\n' _)=\$1 ttft_$(echo "$sys" | tr -c 'a-z0-9\n' _)=\$2"
    done
    # shellcheck disable=SC2154 # assigned by the eval above
    printf '%-8s %-26s %12s %14s\n' "$n" "River / llama.cpp" "$(ratio "$tps_river" "$tps_llama_cpp")" \
        "$(ratio "$ttft_river" "$ttft_llama_cpp")"
    # shellcheck disable=SC2154
    printf '%-8s %-26s %12s %14s\n' "$n" "exit 4/16 / llama.cpp" "$(ratio "$tps_river_exit4" "$tps_llama_cpp")" \
        "$(ratio "$ttft_river_exit4" "$ttft_llama_cpp")"
done

# The serving overhead with one stream, as this benchmark measured it first: the plain
# stack's riverd (riverctl, no gateway) against the same model in-process, decode tok/s.
export RIVER_ENDPOINT="ipc://$tmp/river/clients"
prompt="Once upon a time, in a small village by the sea,"
"$river" run --model "$gguf" --prompt "$prompt" --max-tokens 8 --ignore-eos --threads "$THREADS" \
    --output json >/dev/null 2>"$tmp/err" || die "river run failed" "$tmp/err"
local_tps=$("$river" run --model "$gguf" --prompt "$prompt" --max-tokens "$GEN" --ignore-eos \
    --threads "$THREADS" --output json 2>"$tmp/err" | sed -E 's/.*"decode_tok_s":([0-9.e+-]+).*/\1/')
served_tps=$("$bin/riverctl" --output json generate "$prompt" --max-tokens "$GEN" --ignore-eos \
    2>"$tmp/err" | sed -E 's/.*"decode_tok_s":([0-9.e+-]+).*/\1/')
echo
awk -v n="$GEN" -v a="$local_tps" -v b="$served_tps" 'BEGIN {
    printf "one stream, %d tokens: in-process river run %.2f tok/s, through riverd %.2f tok/s (%.1f%% lost)\n",
           n, a, b, (a > 0 ? 100 * (1 - b / a) : 0) }'
echo "$BENCH: every figure in $results (TTFT columns of the ratio rows: River's mean / llama.cpp's); load at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
