#!/usr/bin/env bash
# Redis memory per counted key, per algorithm: one `meridian limiter` on one
# local redis-server; `meridian bench` sends checks over Envoy RLS for
# up to KEYS distinct keys (`key-N-padding`) of each rule in turn for 10 s,
# then Redis's `used_memory` growth is divided by the keys the rule left in
# Redis (each a counter in its first window). Prints the table in
# docs/operations.md ("Sizing"). Starts its own servers on free ports.
#
# Usage: benches/redis_memory.sh [keys=20000]
# MERIDIAN=path/to/meridian measures that binary instead of a release build.
set -euo pipefail
cd "$(dirname "$0")/.."
keys=${1:-20000}
for bin in redis-server redis-cli python3; do
  command -v "$bin" >/dev/null || { echo "$bin not found: apt-get install -y redis-server redis-tools python3" >&2; exit 1; }
done
if [ -z "${MERIDIAN:-}" ]; then
  cargo build --profile dist --quiet --bin meridian
fi
meridian=${MERIDIAN:-target/dist/meridian}

limiter_pid=""
on_exit() { [ -z "$limiter_pid" ] || kill "$limiter_pid" 2>/dev/null; }
source benches/scratch_redis.sh

# Limits far above what the run sends, so every check is counted in Redis
# (no over-limit cache); windows of an hour, so nothing expires meanwhile.
cat > "$dir/rules.yaml" <<RULES
domain: mem
descriptors:
RULES
for algorithm in fixed_window sliding_window_counter sliding_window_log token_bucket leaky_bucket; do
  burst="" limit=1000000
  # A sliding log keeps an entry per hit and accepts at most 100,000.
  [ "$algorithm" = sliding_window_log ] && limit=100000
  case $algorithm in token_bucket | leaky_bucket) burst="    burst: 1000000" ;; esac
  cat >> "$dir/rules.yaml" <<RULES
  - key: $algorithm
    algorithm: $algorithm
$burst
    rate_limit:
      unit: hour
      requests_per_unit: $limit
RULES
done
grpc=$(free_port)
http=$(free_port)
"$meridian" limiter --config "$dir/rules.yaml" --redis "redis://127.0.0.1:$port" \
  --grpc-addr "127.0.0.1:$grpc" --http-addr "127.0.0.1:$http" --threads 1 >"$dir/limiter.log" 2>&1 &
limiter_pid=$!
until python3 -c "import socket; socket.create_connection(('127.0.0.1',$grpc))" 2>/dev/null; do
  kill -0 "$limiter_pid" 2>/dev/null || { cat "$dir/limiter.log" >&2; exit 1; }
  sleep 0.1
done

used() { redis-cli -p "$port" info memory | awk -F: '/^used_memory:/ { print $2 }' | tr -d '\r'; }
echo "| algorithm | keys in Redis | bytes per key (used_memory growth ÷ keys) |"
echo "|---|---:|---:|"
for algorithm in fixed_window sliding_window_counter sliding_window_log token_bucket leaky_bucket; do
  redis-cli -p "$port" flushall >/dev/null
  before=$(used)
  before_keys=$(redis-cli -p "$port" dbsize)
  # Uniform over KEYS keys for 10 s: the keys touched are the ones counted.
  "$meridian" bench --api rls --target "127.0.0.1:$grpc" --domain mem \
    --descriptor "$algorithm=key-{key}-padding" --keys "$keys" \
    --concurrency 8 --duration 10s --warmup 0s >/dev/null 2>&1
  after=$(used)
  n=$(( $(redis-cli -p "$port" dbsize) - before_keys ))
  echo "| $algorithm | $n | $(( (after - before) / n )) |"
done
