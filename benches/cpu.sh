#!/usr/bin/env bash
#! Server CPU per ShouldRateLimit: sluice against a tonic no-op RLS (examples/noop_rls.rs),
#! and sluice with a few rules against 1,000 exact-value and 1,000 wildcard rules in a domain,
#! in local mode and in global mode (the few rules, synced through a local redis-server).
#
# Usage: benches/cpu.sh   (env: RUNS=5 DURATION=5s RATE=12000 CONCURRENCY=64 VALUES=1000
#                          MODE=cpu|instructions CASES="noop few exact wildcard global"
#                          BEFORE=path/to/another/sluice)
#
# BEFORE: another build of sluice (say, the previous commit's, copied out of target/release)
# run as the cases `few-before` and `global-before` in the same runs, alternating with this
# build's, so a change is measured against what it changes on the same machine at the same
# time. `global` needs redis-server on the PATH; the script starts its own on REDIS_PORT.
#
# MODE=instructions counts the server's instructions per request under valgrind's callgrind
# instead of its CPU time: the same for the same binary and load whatever else the machine
# does, where CPU time moves by 10-20 % between runs on a 2-core VM. It misses what cache
# misses cost (1,000 rules' data cold in cache), so both are reported in docs/performance.md.
#
# Builds once (release), then per case and run: starts the server pinned to core 1, warms it
# up, drives it with `sluice load` pinned to core 0 (open loop at RATE requests a second, one
# descriptor `user=v<n>`, n < VALUES; RATE=0: closed loop), and divides the server's
# utime+stime (/proc/PID/stat) by the requests answered.
# Pinning keeps the client's CPU out of the server's and makes the figures comparable between
# cases; every case is a fresh process, so no case inherits another's warm tables. Prints the
# median of RUNS per case and its ratio to the no-op and to the few-rule case of the same run.
set -euo pipefail
cd "$(dirname "$0")/.."

RUNS=${RUNS:-5}
DURATION=${DURATION:-5s}
CONCURRENCY=${CONCURRENCY:-64}
VALUES=${VALUES:-1000}
RATE=${RATE:-12000}
MODE=${MODE:-cpu}
GRPC_PORT=${GRPC_PORT:-18091}
HTTP_PORT=${HTTP_PORT:-18090}
REDIS_PORT=${REDIS_PORT:-18092}
CASES=${CASES:-noop few exact wildcard global}
BEFORE=${BEFORE:-}

cargo build --release --locked --quiet --features tools --bin sluice --example noop_rls
bin=target/release/sluice
noop=target/release/examples/noop_rls
tck=$(getconf CLK_TCK)

tmp=$(mktemp -d)
server=""
redis=""
cleanup() {
  [ -z "$server" ] || kill "$server" 2>/dev/null || true
  [ -z "$redis" ] || kill "$redis" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT

cases=($CASES)
if [ -n "$BEFORE" ]; then
  [ -x "$BEFORE" ] || { echo "BEFORE=$BEFORE is not an executable" >&2; exit 1; }
  for c in few global; do [[ " $CASES " == *" $c "* ]] && cases+=("$c-before"); done
fi
if [[ " ${cases[*]} " == *" global"* ]]; then
  command -v redis-server >/dev/null || {
    echo "the global case needs redis-server on the PATH (or leave it out: CASES=...)" >&2
    exit 1
  }
  # On core 0 with the client: the server's figure is its own process's CPU either way.
  taskset -c 0 redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no \
    >"$tmp/redis.log" 2>&1 &
  redis=$!
  for _ in $(seq 100); do
    (exec 3<>"/dev/tcp/127.0.0.1/$REDIS_PORT") 2>/dev/null && break
    sleep 0.1
  done
fi

# Rules: the repository's examples plus a `cpu` domain whose rules the load hits. Limits are
# far above the load's rate, so every answer is OK and each case does the same counting work.
limit='rate_limit: {unit: second, requests_per_unit: 1000000000}'
mkdir -p "$tmp/few" "$tmp/exact" "$tmp/wildcard"
for d in few exact wildcard; do cp config/rules/*.yaml "$tmp/$d/"; done
printf 'domain: cpu\ndescriptors:\n  - key: user\n    %s\n' "$limit" >"$tmp/few/cpu.yaml"
{
  printf 'domain: cpu\ndescriptors:\n'
  for ((i = 0; i < 1000; i++)); do
    printf '  - key: user\n    value: v%d\n    %s\n' "$i" "$limit"
  done
} >"$tmp/exact/cpu.yaml"
# Longest prefix first (v999* … v0*), so each value's first match in file order is its own
# pattern, halfway down the list on average: a scan in file order pays for the rules.
{
  printf 'domain: cpu\ndescriptors:\n'
  for ((i = 999; i >= 0; i--)); do
    printf '  - key: user\n    value: "v%d*"\n    %s\n' "$i" "$limit"
  done
} >"$tmp/wildcard/cpu.yaml"

start_server() { # case
  local wrap=()
  if [ "$MODE" = instructions ]; then
    # Uninstrumented (fast) until `callgrind_control -i on`, after the warm-up.
    wrap=(valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$tmp/callgrind.out")
  fi
  # `<case>-before`: the same case on the BEFORE build; `global`: the few rules, synced.
  local exe=$bin rules=${1%-before} extra=()
  [[ $1 == *-before ]] && exe=$BEFORE
  if [ "$rules" = global ]; then
    rules=few
    extra=(--redis-url "redis://127.0.0.1:$REDIS_PORT")
  fi
  if [ "$1" = noop ]; then
    taskset -c 1 "${wrap[@]}" "$noop" "127.0.0.1:$GRPC_PORT" &
  else
    taskset -c 1 "${wrap[@]}" "$exe" serve --config "$tmp/$rules" --log-level warn \
      --grpc-addr "127.0.0.1:$GRPC_PORT" --http-addr "127.0.0.1:$HTTP_PORT" "${extra[@]}" &
  fi
  server=$!
  for _ in $(seq 600); do
    (exec 3<>"/dev/tcp/127.0.0.1/$GRPC_PORT") 2>/dev/null && return
    sleep 0.1
  done
  echo "server ($1) did not start" >&2
  exit 1
}

cpu_ticks() { # utime + stime, fields 14 and 15 (after the parenthesised name)
  sed 's/.*) //' "/proc/$server/stat" | awk '{print $12 + $13}'
}

load() { # duration
  taskset -c 0 "$bin" load --addr "http://127.0.0.1:$GRPC_PORT" --domain cpu --key user \
    --values "$VALUES" --concurrency "$CONCURRENCY" --duration "$1" --rate "$RATE"
}

# One run of a case under callgrind: server instructions per request (closed loop: the
# instrumented server is some 50 times slower).
measure_instructions() { # case
  start_server "$1"
  RATE=0 load 2s >/dev/null # warmed up, uninstrumented
  callgrind_control -i on "$server" >/dev/null
  local out requests
  out=$(RATE=0 load "$DURATION")
  callgrind_control -d "$server" >/dev/null
  kill "$server"
  wait "$server" 2>/dev/null || true
  server=""
  requests=$(awk '/^requests/ {print $2}' <<<"$out")
  # The dump (callgrind.out.1) holds the instructions from instrumentation on to the dump;
  # the file written at exit (the shutdown's) is left out.
  awk -v n="$requests" '/^summary:/ {s += $2} END {printf "%.0f\n", s / n}' "$tmp"/callgrind.out.*
  rm -f "$tmp"/callgrind.out*
}

# One run of a case: µs of server CPU per request.
measure() { # case
  if [ "$MODE" = instructions ]; then
    measure_instructions "$1"
    return
  fi
  start_server "$1"
  load 1s >/dev/null # connections, the entity table and the allocator warmed up
  local before after out requests
  before=$(cpu_ticks)
  out=$(load "$DURATION")
  after=$(cpu_ticks)
  kill "$server"
  wait "$server" 2>/dev/null || true
  server=""
  requests=$(awk '/^requests/ {print $2}' <<<"$out")
  awk -v t=$((after - before)) -v hz="$tck" -v n="$requests" \
    'BEGIN {printf "%.3f\n", t / hz * 1e6 / n}'
}

median() { sort -g | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}'; }

unit='µs/req'
[ "$MODE" = instructions ] && unit='instr/req'
declare -A runs
for ((r = 1; r <= RUNS; r++)); do
  for c in "${cases[@]}"; do
    v=$(measure "$c")
    runs[$c]+="$v "
    echo "run $r $c: $v $unit" >&2
  done
done

printf '%-14s %10s %9s %9s   %s\n' case "$unit" '×no-op' '×few' 'runs'
declare -A med
for c in "${cases[@]}"; do med[$c]=$(tr ' ' '\n' <<<"${runs[$c]}" | grep . | median); done
for c in "${cases[@]}"; do
  awk -v c="$c" -v m="${med[$c]}" -v n="${med[noop]}" -v f="${med[few]}" -v r="${runs[$c]}" \
    'BEGIN {printf "%-14s %10.2f %9.2f %9.2f   %s\n", c, m, m / n, m / f, r}'
done
