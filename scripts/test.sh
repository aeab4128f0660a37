#!/usr/bin/env bash
# Meridian's test command: installs what the tests need when it is missing,
# then runs the formatting check, clippy and the whole test suite, and builds
# and tests the library-only configuration (default-features = false).
# Usage: scripts/test.sh   (from any directory; needs Rust, and root or sudo
# on a machine without redis-server)
set -euo pipefail
cd "$(dirname "$0")/.."
# One pass from a clean clone gains nothing from incremental state, which
# cost 2.8 GB of disk across the test binaries (set it to 1 to keep it).
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"

apt_install() {
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "==> installing $* (apt-get)"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$@" >/dev/null
}

# The tests start their own redis-server processes (never the one on 6379)
# and build a Redis Cluster with redis-cli.
if ! command -v redis-server >/dev/null || ! command -v redis-cli >/dev/null; then
  apt_install redis-server redis-tools
fi
# The TLS tests make their own CA and certificates with openssl.
command -v openssl >/dev/null || apt_install openssl
# The dashboard test drives a headless Chromium through chromedriver.
if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
  apt_install chromium chromium-driver
fi
# tests/integration/deploy.rs: promtool and a real Prometheus (alerts, dashboard
# queries against the demo), kubectl kustomize, and the Kubernetes schemas.
if ! command -v promtool >/dev/null || ! command -v prometheus >/dev/null; then
  apt_install prometheus
fi
command -v kubectl >/dev/null || apt_install kubernetes-client
if [ "$(kubernetes-validate --version 2>/dev/null)" != "1.37.0" ]; then
  echo "==> installing kubernetes-validate 1.37.0 (pip)"
  python3 -m pip install -q kubernetes-validate==1.37.0
fi
if ! cargo fmt --version >/dev/null 2>&1 || ! cargo clippy --version >/dev/null 2>&1; then
  rustup component add rustfmt clippy
fi

echo "==> cargo fmt --check"
cargo fmt --all -- --check
# Every test binary starts real servers, so each one names the feature it
# needs (one left out breaks the library-only build below), and every file
# in tests/integration/ must be a `mod` of its main.rs or it never runs.
declared=$(awk '/^\[/ { in_test = ($0 == "[[test]]") } in_test && /^name = / { gsub(/"/, "", $3); print $3 }' Cargo.toml)
missing=""
for t in tests/*.rs; do
  name=$(basename "$t" .rs)
  grep -qx "$name" <<<"$declared" || missing="$missing $name"
done
if [ -n "$missing" ]; then
  echo "tests without a [[test]] entry (required-features = [\"server\"]) in Cargo.toml:$missing" >&2
  exit 1
fi
missing=""
for t in tests/integration/*.rs; do
  name=$(basename "$t" .rs)
  [ "$name" = main ] && continue
  grep -qx "mod $name;" tests/integration/main.rs || missing="$missing $name"
done
if [ -n "$missing" ]; then
  echo "files in tests/integration/ that main.rs does not declare (add \`mod NAME;\`):$missing" >&2
  exit 1
fi
echo "==> cargo clippy"
cargo clippy --all-targets --locked -- -D warnings
# What a gateway embedding `meridian::Limiter` compiles: no server parts.
# Clippy over every target also proves each one either builds without the
# server or says it needs it (`required-features` in Cargo.toml).
echo "==> library only: --no-default-features --features redis"
cargo clippy --all-targets --locked --no-default-features --features redis -- -D warnings
cargo build --locked --no-default-features --features redis --lib
cargo test --locked --no-default-features --features redis --lib
cargo test --locked --no-default-features --features redis --doc
echo "==> library only, memory store: --no-default-features"
cargo clippy --locked --no-default-features --lib -- -D warnings
cargo test --locked --no-default-features --doc

echo "==> cargo test"
cargo test --all-targets --locked
cargo test --doc --locked

