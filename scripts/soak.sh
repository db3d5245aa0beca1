#!/bin/sh
# Soak: riverd with two local workers (riverd starts and supervises them) on the bundled
# TinyStories model, SOAK_STREAMS concurrent streaming requests for SOAK_MINUTES
# (SOAK_SECONDS, when set, instead) through build/bin/river-soak, then everything is
# stopped and nothing is left running. The exit status is river-soak's: 1 when a request
# was lost. Everything listens on ipc:// sockets in a temporary directory.
#
# SOAK_WRAP names a command that runs riverd in its place and execs it, keeping its pid
# (a heap profiler's preload wrapper, for instance); the soak then measures that process.
#
# SOAK_AUTH=curve (the default, as riverd's own) runs with CurveZMQ keys riverctl keygen
# makes in that directory; SOAK_AUTH=plain without. SOAK_CLIENTS sets the number of client
# connections (river-soak's default: one per 50 streams).
#
# Each worker runs one thread (the machine's two cores, one each) and takes up to half
# the streams at once, so that all of them run in the engines rather than in riverd's
# queue; the queue still has room for all of them, for when a worker restarts.
set -eu
cd "$(dirname "$0")/.."
bin=${BUILD:-build}/bin
streams=${SOAK_STREAMS:-200}
minutes=${SOAK_MINUTES:-10}
seconds=${SOAK_SECONDS:-}
model=${SOAK_MODEL:-tests/data/tinystories-656k}
auth=${SOAK_AUTH:-curve}
clients=${SOAK_CLIENTS:-}
case "$auth" in
curve | plain) ;;
*) echo "soak: SOAK_AUTH must be curve or plain, not '$auth'" >&2; exit 2 ;;
esac
per_worker=$(( (streams + 1) / 2 ))
queue=$(( streams + 64 ))
tmp=$(mktemp -d /tmp/river-soak.XXXXXX)
rd_pid=""
workers=""

# Stops riverd (which stops its workers, SIGTERM then SIGKILL after its drain), then makes
# sure that none of the processes this script started outlives it.
cleanup() {
    if [ -n "$rd_pid" ]; then
        kill -TERM "$rd_pid" 2>/dev/null || true
        wait "$rd_pid" 2>/dev/null || true
    fi
    for p in $workers; do
        # Only a process that still runs this soak's worker configuration is ours.
        if grep -q "$tmp" "/proc/$p/cmdline" 2>/dev/null; then
            echo "soak: worker $p outlived riverd; killing it" >&2
            kill -KILL "$p" 2>/dev/null || true
        fi
    done
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if [ "$auth" = curve ]; then
    # riverd's pair, one key for both workers, one for the soak's clients and admin calls.
    "$bin/riverctl" keygen riverd --dir "$tmp/keys" > /dev/null
    "$bin/riverctl" keygen soak-worker --dir "$tmp/worker" > /dev/null
    "$bin/riverctl" keygen soak-client --dir "$tmp/client" > /dev/null
    mkdir "$tmp/keys/clients" "$tmp/keys/workers" "$tmp/keys/admin"
    cp "$tmp/worker/soak-worker.key" "$tmp/keys/workers/"
    cp "$tmp/client/soak-client.key" "$tmp/keys/clients/"
    cp "$tmp/client/soak-client.key" "$tmp/keys/admin/"
    riverd_auth="auth:
  mode: curve
  secret_key: keys/riverd.key_secret
  clients: keys/clients
  workers: keys/workers
  admin: keys/admin"
    worker_auth="auth:
  secret_key: worker/soak-worker.key_secret
  server_key: keys/riverd.key"
    export RIVER_KEY="$tmp/client/soak-client.key_secret" RIVER_SERVER_KEY="$tmp/keys/riverd.key"
else
    riverd_auth="auth:
  mode: plain"
    worker_auth="$riverd_auth"
fi

cat > "$tmp/riverd.yaml" <<YAML
endpoints:
  clients: ["ipc://$tmp/clients"]
  workers: ["ipc://$tmp/workers"]
  admin: "ipc://$tmp/admin"
  metrics_port: 0
queue_length: $queue
# The soak's clients share one key, which riverd counts as one client under CURVE.
limits:
  max_requests_per_client: $streams
drain_timeout: 10s
local_workers:
  - count: 2
    config: worker.yaml
log_level: warn
$riverd_auth
YAML
cat > "$tmp/worker.yaml" <<YAML
model: "$model"
threads: 1
max_seqs: $per_worker
max_batch_rows: $per_worker
prefill_chunk: $per_worker
log_level: warn
$worker_auth
YAML

# shellcheck disable=SC2086
${SOAK_WRAP:-} "$bin/riverd" --config "$tmp/riverd.yaml" &
rd_pid=$!
export RIVER_ENDPOINT="ipc://$tmp/clients" RIVER_ADMIN="ipc://$tmp/admin"
# The local workers are riverd's children; their pids let cleanup check that they ended.
i=0
until [ "$("$bin/riverctl" --output json status 2>/dev/null |
           sed -n 's/.*"workers_ready":\([0-9]*\).*/\1/p')" = 2 ]; do
    i=$((i + 1))
    if [ $i -gt 600 ] || ! kill -0 "$rd_pid" 2>/dev/null; then
        echo "soak: riverd did not get two ready workers within 60 s" >&2
        exit 1
    fi
    sleep 0.1
done
workers=$(for d in /proc/[0-9]*; do
              st=$(cat "$d/stat" 2>/dev/null) || continue
              # The command name may hold spaces and parentheses: the fields after its
              # closing parenthesis are the state, then the parent pid.
              # shellcheck disable=SC2086
              set -- ${st##*) }
              if [ "${2:-}" = "$rd_pid" ]; then echo "${d#/proc/}"; fi
          done)
# shellcheck disable=SC2086
printf 'soak: riverd pid %s, local workers:%s, auth %s\n' "$rd_pid" "$(printf ' %s' $workers)" \
    "$auth"
if [ -n "$seconds" ]; then
    duration="--seconds $seconds"
else
    duration="--minutes $minutes"
fi
rc=0
# shellcheck disable=SC2086
"$bin/river-soak" --streams "$streams" $duration --pid "$rd_pid" --workers 2 \
    ${clients:+--clients "$clients"} || rc=$?
exit $rc
