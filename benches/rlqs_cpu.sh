#!/usr/bin/env bash
#! Server CPU of the quota service (RLQS) against ShouldRateLimit for the same traffic: 10 Envoys
#! reporting 1,000 buckets every second, against one ShouldRateLimit call per Envoy request.
#
# Usage: benches/rlqs_cpu.sh   (env: RUNS=5 DURATION=10 RATE=12000 FLEET_RATE=100000
#                               STREAMS=10 BUCKETS=1000 INTERVAL=1s CONCURRENCY=64)
#
# Builds once (release), then per run and case starts a fresh server pinned to core 1 with one
# key-only rule (`cpu` domain, `user`, a billion a second: far above the load, so every answer
# is OK and both protocols do the same counting work), and drives it from core 0:
#   idle   nothing sent: the server's own background CPU, in µs a second;
#   rls    `sluice load`, open loop at RATE ShouldRateLimit a second over `user=v0`..`v999`:
#          µs of server CPU per request (what benches/cpu.sh measures);
#   rlqs   `sluice load --rlqs`: STREAMS streams, each reporting BUCKETS buckets `{user: v<i>}`
#          every INTERVAL, standing for FLEET_RATE requests a second across the fleet: µs of
#          server CPU per second;
#   rlqs@RATE  the same standing for RATE requests a second, the rls case's own traffic.
# CPU is the server's utime+stime (/proc/PID/stat, 10 ms ticks) over DURATION seconds after a
# warm-up (the RLQS streams are measured in mid-run, so their first reports — each bucket
# resolved and joined to its counter — are not in the figure).
#
# What "per Envoy request" means under RLQS: the server's work is per bucket report (STREAMS x
# BUCKETS / INTERVAL of them a second), whatever the requests behind each report, so its cost
# per request is its CPU a second divided by the fleet's traffic, and the ratio to
# ShouldRateLimit grows in proportion to that traffic. The script prints it at FLEET_RATE and at
# RATE, and the break-even traffic where it reaches 100x; ratios are taken within each run, and
# the median of RUNS is printed per column.
set -euo pipefail
cd "$(dirname "$0")/.."

RUNS=${RUNS:-5}
DURATION=${DURATION:-10}
WARMUP=${WARMUP:-2}
RATE=${RATE:-12000}
FLEET_RATE=${FLEET_RATE:-100000}
STREAMS=${STREAMS:-10}
BUCKETS=${BUCKETS:-1000}
INTERVAL=${INTERVAL:-1s}
CONCURRENCY=${CONCURRENCY:-64}
GRPC_PORT=${GRPC_PORT:-18093}
HTTP_PORT=${HTTP_PORT:-18092}

cargo build --release --locked --quiet --features tools --bin sluice
bin=target/release/sluice
tck=$(getconf CLK_TCK)

tmp=$(mktemp -d)
server=""
client=""
cleanup() {
  [ -z "$client" ] || kill "$client" 2>/dev/null || true
  [ -z "$server" ] || kill "$server" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT

printf 'domain: cpu\ndescriptors:\n  - key: user\n    %s\n' \
  'rate_limit: {unit: second, requests_per_unit: 1000000000}' >"$tmp/cpu.yaml"

start_server() {
  taskset -c 1 "$bin" serve --config "$tmp" --log-level warn \
    --grpc-addr "127.0.0.1:$GRPC_PORT" --http-addr "127.0.0.1:$HTTP_PORT" &
  server=$!
  for _ in $(seq 600); do
    (exec 3<>"/dev/tcp/127.0.0.1/$GRPC_PORT") 2>/dev/null && return
    sleep 0.1
  done
  echo "the server did not start" >&2
  exit 1
}

stop_server() {
  kill "$server"
  wait "$server" 2>/dev/null || true
  server=""
}

cpu_ticks() { # utime + stime, fields 14 and 15 (after the parenthesised name)
  sed 's/.*) //' "/proc/$server/stat" | awk '{print $12 + $13}'
}

now() { date +%s.%N; }

# µs of server CPU a second between two (ticks, time) samples.
per_second() { # ticks0 time0 ticks1 time1
  awk -v a="$1" -v s="$2" -v b="$3" -v e="$4" -v hz="$tck" \
    'BEGIN {printf "%.0f\n", (b - a) / hz * 1e6 / (e - s)}'
}

rls_load() { # duration
  taskset -c 0 "$bin" load --addr "http://127.0.0.1:$GRPC_PORT" --domain cpu --key user \
    --values "$BUCKETS" --concurrency "$CONCURRENCY" --duration "$1" --rate "$RATE"
}

measure_idle() {
  start_server
  sleep "$WARMUP"
  local c0 t0
  c0=$(cpu_ticks) t0=$(now)
  sleep "$DURATION"
  per_second "$c0" "$t0" "$(cpu_ticks)" "$(now)"
  stop_server
}

measure_rls() { # µs per request
  start_server
  rls_load "${WARMUP}s" >/dev/null
  local before after out requests
  before=$(cpu_ticks)
  out=$(rls_load "${DURATION}s")
  after=$(cpu_ticks)
  stop_server
  requests=$(awk '/^requests/ {print $2}' <<<"$out")
  awk -v t=$((after - before)) -v hz="$tck" -v n="$requests" \
    'BEGIN {printf "%.3f\n", t / hz * 1e6 / n}'
}

measure_rlqs() { # fleet rate → µs a second
  start_server
  taskset -c 0 "$bin" load --rlqs --addr "http://127.0.0.1:$GRPC_PORT" --domain cpu \
    --key user --streams "$STREAMS" --buckets "$BUCKETS" --report-interval "$INTERVAL" \
    --rate "$1" --duration "$((WARMUP + DURATION + 2))s" >"$tmp/rlqs.out" &
  client=$!
  sleep "$WARMUP"
  local c0 t0 c1 t1
  c0=$(cpu_ticks) t0=$(now)
  sleep "$DURATION"
  c1=$(cpu_ticks) t1=$(now)
  if ! wait "$client"; then
    client=""
    echo "sluice load --rlqs failed: $(cat "$tmp/rlqs.out")" >&2
    exit 1
  fi
  client=""
  stop_server
  echo "  $(cat "$tmp/rlqs.out")" >&2
  per_second "$c0" "$t0" "$c1" "$t1"
}

median() { sort -g | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}'; }

# Bucket reports a second (the RLQS cost's real unit): streams x buckets / interval.
interval_s=$(awk -v i="$INTERVAL" 'BEGIN {
  n = i + 0; u = i; sub(/^[0-9.]+/, "", u)
  print (u == "ms") ? n / 1000 : (u == "m" || u == "min") ? n * 60 : n }')
reports_s=$(awk -v s="$STREAMS" -v b="$BUCKETS" -v i="$interval_s" 'BEGIN {print s * b / i}')

cols=(idle rls rlqs rlqs_low per_report per_req ratio ratio_low break_even)
declare -A runs
for ((r = 1; r <= RUNS; r++)); do
  idle=$(measure_idle)
  rls=$(measure_rls)
  rlqs=$(measure_rlqs "$FLEET_RATE")
  rlqs_low=$(measure_rlqs "$RATE")
  # Per bucket report; per Envoy request at FLEET_RATE; ShouldRateLimit's cost over it at
  # FLEET_RATE and at RATE (the rls case's own traffic); the fleet traffic at which the
  # ratio is 100x. The idle server's CPU is in the RLQS figures, not taken out.
  read -r per_report per_req ratio ratio_low break_even < <(awk \
    -v q="$rls" -v g="$rlqs" -v l="$rlqs_low" -v f="$FLEET_RATE" -v rt="$RATE" \
    -v n="$reports_s" 'BEGIN {
      printf "%.3f %.4f %.0f %.0f %.0f\n", g / n, g / f, q * f / g, q * rt / l, 100 * g / q }')
  for c in "${cols[@]}"; do runs[$c]+="${!c} "; done
  echo "run $r: idle ${idle} µs/s, rls ${rls} µs/request, rlqs ${rlqs} µs/s" \
    "(${rlqs_low} µs/s at ${RATE}/s), ratio ${ratio}x at ${FLEET_RATE}/s," \
    "${ratio_low}x at ${RATE}/s" >&2
done

declare -A med
for c in "${cols[@]}"; do med[$c]=$(tr ' ' '\n' <<<"${runs[$c]}" | grep . | median); done
row() { printf '%-62s %12s   %s\n' "$1" "$2" "$3"; }
echo "RLQS: $STREAMS streams x $BUCKETS buckets, a report every $INTERVAL ($reports_s bucket" \
  "reports a second); median of $RUNS runs, server pinned to core 1, load to core 0"
row what median runs
row "idle server, µs CPU a second" "${med[idle]}" "${runs[idle]}"
row "ShouldRateLimit at ${RATE}/s, µs CPU per request" "${med[rls]}" "${runs[rls]}"
row "RLQS standing for ${FLEET_RATE}/s, µs CPU a second" "${med[rlqs]}" "${runs[rlqs]}"
row "RLQS standing for ${RATE}/s, µs CPU a second" "${med[rlqs_low]}" "${runs[rlqs_low]}"
row "RLQS, µs CPU per bucket report" "${med[per_report]}" "${runs[per_report]}"
row "RLQS at ${FLEET_RATE}/s, µs CPU per Envoy request" "${med[per_req]}" "${runs[per_req]}"
row "ShouldRateLimit / RLQS at ${FLEET_RATE}/s (x)" "${med[ratio]}" "${runs[ratio]}"
row "ShouldRateLimit / RLQS at ${RATE}/s (x)" "${med[ratio_low]}" "${runs[ratio_low]}"
row "fleet requests a second where the ratio is 100x" "${med[break_even]}" "${runs[break_even]}"
echo "The RLQS cost is per bucket report, not per request: at F requests a second across the" \
  "fleet its cost per request is (µs a second) / F, and the ratio to ShouldRateLimit is" \
  "proportional to F (${FLEET_RATE}/s = $(awk -v f="$FLEET_RATE" -v n="$reports_s" -v i="$interval_s" \
    'BEGIN {printf "%g", f * i / n}') requests per bucket per Envoy per report)."
