#!/usr/bin/env bash
#! Resident memory per tracked quota (RLQS) bucket, each its own counter: a server's growth in
#! resident set while streams of `sluice load --rlqs` keep their buckets reported, over the
#! buckets it tracks.
#
# Usage: benches/rlqs_memory.sh [CASE...]   (default: realistic largest hostile)
#   env: SERVER=path LOAD=path (default: target/release/sluice, built once with the tools),
#        INTERVAL=5s (Envoy's report interval), REPORTS=3 (reports taken before the reading)
#
# Cases (each on a fresh server, so none reuses memory another freed):
#   realistic  20 streams x 5,000 buckets {name: chat-api, route: /v1/chat, method: POST,
#              tenant: t-<stream>-<bucket>}: 4 short entries, about 50 bytes of keys and values;
#   largest    20 streams x 3,000 buckets of the same shape, the tenant padded so that each id
#              is just under RLQS_MAX_BUCKET_ID_BYTES' default (1,024 bytes): the largest
#              accepted, 60,000 of them inside RLQS_MAX_TRACKED_ID_BYTES' default (64 MiB);
#   hostile    100 streams x 10 buckets of 32 entries, each key and value about 4 KB (256 KB
#              an id; ten to a report, under gRPC's 4 MiB message): refused by the default
#              RLQS_MAX_BUCKET_ID_BYTES, so the reading is what the refused streams leave.
# The rules give every (stream, bucket) a counter of its own: the tenant is a key-only rule.
# Each case: the server's VmRSS once started (idle), then the load; once
# `sluice_rlqs_buckets` holds still at its count and REPORTS more reports went by, VmRSS
# again. Per bucket = (VmRSS - idle) / buckets tracked; read buffers, counters, shares and the
# buckets' ids are all in it, as a user sees it. VmHWM is the peak.
set -euo pipefail
cd "$(dirname "$0")/.."

INTERVAL=${INTERVAL:-5s}
REPORTS=${REPORTS:-3}
GRPC_PORT=${GRPC_PORT:-18095}
HTTP_PORT=${HTTP_PORT:-18094}
if [ -z "${SERVER:-}" ] || [ -z "${LOAD:-}" ]; then
  cargo build --release --locked --quiet --features tools --bin sluice
fi
SERVER=${SERVER:-target/release/sluice}
LOAD=${LOAD:-target/release/sluice}
interval_s=${INTERVAL%s}

tmp=$(mktemp -d)
server=""
client=""
cleanup() {
  [ -z "$client" ] || kill "$client" 2>/dev/null || true
  [ -z "$server" ] || kill "$server" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT

cat >"$tmp/mem.yaml" <<'EOF'
domain: mem
descriptors:
  - key: name
    descriptors:
      - key: route
        descriptors:
          - key: method
            descriptors:
              - key: tenant
                rate_limit: {unit: minute, requests_per_unit: 1000000}
EOF

kb() { awk -v f="$1" '$1 == f":" {print $2}' "/proc/$server/status"; }

buckets() {
  curl -fsS "http://127.0.0.1:$HTTP_PORT/metrics" | awk '$1 == "sluice_rlqs_buckets" {print $2}'
}

measure() { # case streams buckets template
  local case=$1 streams=$2 per=$3 template=$4
  "$SERVER" serve --config "$tmp" --log-level error \
    --grpc-addr "127.0.0.1:$GRPC_PORT" --http-addr "127.0.0.1:$HTTP_PORT" &
  server=$!
  until curl -fsS "http://127.0.0.1:$HTTP_PORT/healthcheck" >/dev/null 2>&1; do sleep 0.1; done
  local idle
  idle=$(kb VmRSS)
  "$LOAD" load --rlqs --addr "http://127.0.0.1:$GRPC_PORT" --domain mem \
    --streams "$streams" --buckets "$per" --bucket-id "$template" \
    --report-interval "$INTERVAL" --rate 1000 --duration 600s >"$tmp/load.out" 2>&1 &
  client=$!
  # Every stream's first report is in once the count holds still over an interval.
  local n=-1 now
  while sleep "$interval_s"; now=$(buckets); [ "$now" != "$n" ]; do n=$now; done
  sleep $((interval_s * REPORTS))
  n=$(buckets)
  local rss hwm
  rss=$(kb VmRSS) hwm=$(kb VmHWM)
  kill "$client" 2>/dev/null || true
  wait "$client" 2>/dev/null || true
  client=""
  kill "$server"
  wait "$server" 2>/dev/null || true
  server=""
  awk -v c="$case" -v s="$streams" -v p="$per" -v n="$n" -v i="$idle" -v r="$rss" -v h="$hwm" \
    'BEGIN {
      per = n > 0 ? sprintf("%.0f", (r - i) * 1024 / n) : "-"
      printf "%-10s %4d x %-5d tracked %6d  idle %6.1f MB  with them %7.1f MB  peak %7.1f MB  per bucket %s bytes\n",
        c, s, p, n, i / 1024, r / 1024, h / 1024, per }'
}

# Each 32-entry key and value: 4,096 bytes, less the digits the stream and bucket add.
hostile=$(for k in $(seq 10 41); do printf 'k%s{x:4093}={s}-{i}-{x:4088},' "$k"; done)
cases=("$@")
[ ${#cases[@]} -gt 0 ] || cases=(realistic largest hostile)
echo "server $SERVER, reports every $INTERVAL"
for c in "${cases[@]}"; do
  case $c in
    realistic) measure realistic 20 5000 'name=chat-api,route=/v1/chat,method=POST,tenant=t-{s}-{i}' ;;
    largest) measure largest 20 3000 'name=chat-api,route=/v1/chat,method=POST,tenant=t-{s}-{i}-{x:973}' ;;
    hostile) measure hostile 100 10 "${hostile%,}" ;;
    *) echo "unknown case $c" >&2; exit 64 ;;
  esac
done
