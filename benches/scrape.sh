#!/usr/bin/env bash
#! What a `/metrics` scrape at the rules files' bound of 200,000 overrides costs the requests
#! served meanwhile: ShouldRateLimit latency with no scrape, and with a scrape every 2 s.
#
# Usage: benches/scrape.sh   (env: DURATION=20s RATE=500 EVERY=2 BIN=target/release/sluice)
#
# Builds once (release) unless BIN names another binary (to compare two builds). Rules: one
# domain with two rules of 100,000 overrides each, and a plain rule the load hits. Per case, a
# fresh server pinned to core 1 (one core: the render competes with the requests, as in a pod
# of one CPU), `sluice load` and curl pinned to core 0, the load open loop at RATE requests a
# second. Cases: no scrape; a scrape every EVERY seconds (one at a time); the same with
# METRICS_OVERRIDE_SERIES=false.
# Prints per case the load's latency percentiles, the scrapes' count, mean time and size, and
# the server's resident memory once ready and at the end.
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${DURATION:-20s}
RATE=${RATE:-500}
EVERY=${EVERY:-2}
GRPC_PORT=${GRPC_PORT:-18191}
HTTP_PORT=${HTTP_PORT:-18190}

if [ -z "${BIN:-}" ]; then
  cargo build --release --locked --quiet --features tools --bin sluice
  BIN=target/release/sluice
fi

tmp=$(mktemp -d)
server=""
scraper=""
cleanup() {
  [ -z "$scraper" ] || kill "$scraper" 2>/dev/null || true
  [ -z "$server" ] || kill "$server" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT

{
  printf 'domain: scrape\ndescriptors:\n'
  printf '  - key: user\n    rate_limit: {unit: second, requests_per_unit: 1000000000}\n'
  for key in tenant team; do
    printf '  - key: %s\n    rate_limit: {unit: minute, requests_per_unit: 100}\n    overrides:\n' "$key"
    for ((i = 0; i < 100000; i++)); do printf '      o%d: %d\n' "$i" $((200 + i % 7)); done
  done
} >"$tmp/scrape.yaml"

start_server() { # extra env assignments
  env "$@" taskset -c 1 "$BIN" serve --config "$tmp/scrape.yaml" --log-level warn \
    --grpc-addr "127.0.0.1:$GRPC_PORT" --http-addr "127.0.0.1:$HTTP_PORT" &
  server=$!
  for _ in $(seq 1200); do
    curl -sf "http://127.0.0.1:$HTTP_PORT/readyz" >/dev/null 2>&1 && return
    sleep 0.1
  done
  echo "server did not start" >&2
  exit 1
}

stop_server() {
  kill "$server"
  wait "$server" 2>/dev/null || true
  server=""
}

scrape_loop() { # writes one "seconds bytes" line per scrape
  while true; do
    taskset -c 0 curl -s -o /dev/null -w '%{time_total} %{size_download}\n' \
      "http://127.0.0.1:$HTTP_PORT/metrics"
    sleep "$EVERY"
  done >"$tmp/scrapes"
}

run_case() { # name scrape(yes|no) env...
  local name=$1 scrape=$2
  shift 2
  start_server "$@"
  local ready
  ready=$(awk '/VmRSS/ {print $2 / 1024 " MB"}' "/proc/$server/status")
  taskset -c 0 "$BIN" load --addr "http://127.0.0.1:$GRPC_PORT" --domain scrape --key user \
    --values 1000 --concurrency 8 --connections 1 --duration 2s --rate "$RATE" >/dev/null
  : >"$tmp/scrapes"
  if [ "$scrape" = yes ]; then
    scrape_loop &
    scraper=$!
  fi
  local out
  out=$(taskset -c 0 "$BIN" load --addr "http://127.0.0.1:$GRPC_PORT" --domain scrape \
    --key user --values 1000 --concurrency 8 --connections 1 --duration "$DURATION" --rate "$RATE")
  if [ -n "$scraper" ]; then
    kill "$scraper" 2>/dev/null || true
    wait "$scraper" 2>/dev/null || true
    scraper=""
  fi
  local rss
  rss=$(awk '/VmRSS/ {print $2 / 1024 " MB"}' "/proc/$server/status")
  stop_server
  echo "== $name"
  grep '^latency' <<<"$out"
  awk 'NF == 2 {n++; t += $1; b += $2}
       END {if (n) printf "scrapes %d, mean %.3f s, %.1f MB\n", n, t / n, b / n / 1e6}' "$tmp/scrapes"
  echo "resident when ready $ready, at the end $rss"
}

run_case "no scrape" no
run_case "a scrape every ${EVERY} s" yes
run_case "a scrape every ${EVERY} s, METRICS_OVERRIDE_SERIES=false" yes METRICS_OVERRIDE_SERIES=false
