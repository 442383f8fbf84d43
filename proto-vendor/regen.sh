#!/usr/bin/env bash
# Rebuilds rls_descriptor_set.bin (served by gRPC reflection) from the vendored protos.
# Needs grpcio-tools (scripts/test.sh installs it into target/venv).
set -euo pipefail
cd "$(dirname "$0")"
python3 -m grpc_tools.protoc -I. --include_imports \
  --descriptor_set_out=rls_descriptor_set.bin envoy/service/ratelimit/v3/rls.proto
