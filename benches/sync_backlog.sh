#!/usr/bin/env bash
#! Global mode's sync under a flood of new values: one million values no replica has seen,
#! sent over about 15 s to one replica on one Redis (as a scan of unique client addresses
#! looks), and how long the backlog of entities waiting to sync takes to drain after it.
#
# Usage: benches/sync_backlog.sh   (env: VALUES=1000000 RATE=66000 BIN=target/release/sluice
#                                   REDIS_TIMEOUT=100ms)
#
# Builds once (release) unless BIN names another binary. Starts redis-server on a free port,
# the server pinned to core 1 in global mode (defaults but the Redis URL), `sluice load`
# pinned to core 0, open loop at RATE requests a second, each a new value `user=v<n>`. While
# the load runs and for 10 s after, reads /metrics every half second and prints, per line:
# seconds since the load started, entities pending (`sluice_sync_pending_entities`), sync
# calls ok, failed and resized so far, the current call size (`sluice_sync_batch_items`) and
# whether the shard is degraded; then how long after the load nothing was pending.
set -euo pipefail
cd "$(dirname "$0")/.."

VALUES=${VALUES:-1000000}
RATE=${RATE:-66000}
GRPC_PORT=${GRPC_PORT:-18291}
HTTP_PORT=${HTTP_PORT:-18290}
REDIS_PORT=${REDIS_PORT:-18279}
export REDIS_TIMEOUT=${REDIS_TIMEOUT:-100ms}

if [ -z "${BIN:-}" ]; then
  cargo build --release --locked --quiet --features tools --bin sluice
  BIN=target/release/sluice
fi
command -v redis-server >/dev/null || {
  echo "redis-server is not installed (apt-get install redis-server)" >&2
  exit 1
}

tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT

redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no \
  --dir "$tmp" >"$tmp/redis.log" 2>&1 &
pids+=($!)
printf 'domain: backlog\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 100}\n' \
  >"$tmp/backlog.yaml"
taskset -c 1 "$BIN" serve --config "$tmp/backlog.yaml" --log-level warn \
  --redis-url "127.0.0.1:$REDIS_PORT" \
  --grpc-addr "127.0.0.1:$GRPC_PORT" --http-addr "127.0.0.1:$HTTP_PORT" 2>"$tmp/server.log" &
pids+=($!)
for _ in $(seq 600); do
  curl -sf "http://127.0.0.1:$HTTP_PORT/readyz" >/dev/null 2>&1 && break
  sleep 0.1
done

seconds=$(((VALUES + RATE - 1) / RATE))
taskset -c 0 "$BIN" load --addr "http://127.0.0.1:$GRPC_PORT" --domain backlog --key user \
  --values "$VALUES" --rate "$RATE" --duration "${seconds}s" >"$tmp/load.txt" &
load=$!
pids+=($load)

metric() { # name [label filter]: the sum of its samples
  awk -v n="$1" -v f="${2:-}" '$1 ~ "^"n"({|$)" && index($1, f) { s += $2 } END { print s + 0 }' "$tmp/m"
}
printf '%6s %10s %8s %8s %8s %8s %8s\n' seconds pending ok failed resized batch degraded
start=$(date +%s.%N)
end_at=""
while true; do
  now=$(date +%s.%N)
  t=$(echo "$now - $start" | bc)
  curl -sf "http://127.0.0.1:$HTTP_PORT/metrics" >"$tmp/m" || true
  pending=$(metric sluice_sync_pending_entities)
  printf '%6.1f %10s %8s %8s %8s %8s %8s\n' "$t" "$pending" \
    "$(metric sluice_sync_calls_total 'result="ok"')" \
    "$(metric sluice_sync_calls_total 'result="error"')" \
    "$(metric sluice_sync_calls_total 'result="resized"')" \
    "$(metric sluice_sync_batch_items)" "$(metric sluice_redis_shard_degraded)"
  if [ -z "$end_at" ] && ! kill -0 "$load" 2>/dev/null; then
    end_at=$(echo "$t + 10" | bc)
    load_end=$t
    echo "# load done"
  fi
  if [ -n "$end_at" ] && [ -z "${drained:-}" ] && [ "$pending" = 0 ]; then
    drained=$(echo "$t - $load_end" | bc)
  fi
  if [ -n "$end_at" ] && [ "$(echo "$t > $end_at" | bc)" = 1 ]; then break; fi
  sleep 0.5
done
echo "# load"
cat "$tmp/load.txt"
echo "# nothing pending ${drained:-(never)} s after the load's end"
echo "degraded log lines: $(grep -c degraded "$tmp/server.log" || true)"
