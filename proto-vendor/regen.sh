#!/usr/bin/env bash
# Rebuilds descriptor_set.bin (served by gRPC reflection) from the vendored protos: the
# rate-limit service (RLS) and the rate limit quota service (RLQS), with everything they import.
# Usage: ./regen.sh [OUT] (default descriptor_set.bin; tests/processes/proto_vendor.rs builds
# to a temporary OUT and compares).
# Needs grpcio-tools: python3's, or else target/venv's (scripts/test.sh installs it there).
set -euo pipefail
out=$(realpath -m "${1:-descriptor_set.bin}")
cd "$(dirname "$0")"
py=python3
if ! "$py" -c 'import grpc_tools' 2>/dev/null && [ -x ../target/venv/bin/python ]; then
  py=../target/venv/bin/python
fi
"$py" -m grpc_tools.protoc -I. --include_imports --descriptor_set_out="$out" \
  envoy/service/ratelimit/v3/rls.proto \
  envoy/service/rate_limit_quota/v3/rlqs.proto
