#!/usr/bin/env bash
# The cost of several limits on one descriptor: a `limits:` descriptor of two
# (token bucket + sliding window counter, the pairing of a burst and a quota)
# against a one-limit descriptor of each of its two algorithms, on one release
# `meridian limiter` and one local redis-server, driven by `meridian bench`
# closed loop over Envoy RLS (10,000 keys, 16 streams on 4 connections),
# alternating the three rounds `rounds` times in one run. Prints limiter CPU
# and Redis commands per check and the two-limit / one-limit ratios.
#
# Usage: benches/limits.sh [duration=5s] [rounds=2] [limiter flags...]
set -euo pipefail
cd "$(dirname "$0")/.."
duration=${1:-5s}
rounds=${2:-2}
shift 2 || shift $# || true

for bin in redis-server redis-cli python3; do
  command -v "$bin" >/dev/null || { echo "$bin not found: apt-get install -y redis-server python3" >&2; exit 1; }
done
cargo build --profile dist --quiet --bin meridian
meridian=${CARGO_TARGET_DIR:-target}/dist/meridian

on_exit() { [ -z "${limiter_pid:-}" ] || kill "$limiter_pid" 2>/dev/null; }
source benches/scratch_redis.sh
source benches/scratch_limiter.sh

# Limits high enough that every check reaches Redis and is admitted.
cat > "$dir/rules.yaml" <<'YAML'
domain: bench
descriptors:
  - key: bucket
    algorithm: token_bucket
    burst: 100000000
    rate_limit: {unit: second, requests_per_unit: 1000000}
  - key: sliding
    algorithm: sliding_window_counter
    rate_limit: {unit: minute, requests_per_unit: 100000000}
  - key: two
    limits:
      - {algorithm: token_bucket, burst: 100000000, rate_limit: {unit: second, requests_per_unit: 1000000}}
      - {algorithm: sliding_window_counter, rate_limit: {unit: minute, requests_per_unit: 100000000}}
YAML

start_limiter "$meridian" --redis "$redis" "$@"

for round in $(seq "$rounds"); do
  for key in bucket sliding two; do
    echo "==> round $round: $key" >&2
    "$meridian" bench --api rls --target "$grpc" --domain bench --keys 10000 \
      --concurrency 16 --connections 4 --duration "$duration" --warmup 2s \
      --redis "$redis" --server-pid "$limiter_pid" --json --descriptor "$key={key}" 2>/dev/null \
      | python3 -c 'import json,sys; d=json.load(sys.stdin); d["key"]=sys.argv[1]; print(json.dumps(d))' "$key" \
      >> "$dir/results"
  done
done

python3 - "$dir/results" <<'PY'
import json, sys
from statistics import mean
rows = [json.loads(line) for line in open(sys.argv[1])]
label = {"bucket": "one limit: token_bucket", "sliding": "one limit: sliding_window_counter",
         "two": "limits: token_bucket + sliding_window_counter"}
def figures(key):
    rs = [r for r in rows if r["key"] == key]
    return {
        "checks_s": mean(r["throughput_checks_per_s"] for r in rs),
        "p99": mean(r["latency"]["p99_us"] for r in rs) / 1000,
        "cpu": mean((r["server"] or {})["cpu_us_per_check"] for r in rs),
        "scripts": mean((r["redis"] or {})["scripts_per_check"] for r in rs),
        "cmds": mean((r["redis"] or {})["commands_per_check"] for r in rs),
        "redis_cpu": mean((r["redis"] or {})["cpu_us_per_check"] for r in rs),
        "errors": sum(r["errors"] for r in rs),
    }
f = {k: figures(k) for k in label}
print("| descriptor | checks/s | p99 ms | limiter CPU µs/check | Redis scripts/check | Redis cmds/check (in scripts too) | Redis CPU µs/check | errors |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
for k, v in f.items():
    print(f"| {label[k]} | {v['checks_s']:,.0f} | {v['p99']:.2f} | {v['cpu']:.1f} | {v['scripts']:.2f} | {v['cmds']:.2f} | {v['redis_cpu']:.1f} | {v['errors']} |")
print()
for one in ("bucket", "sliding"):
    t, o = f["two"], f[one]
    print(f"two limits / {label[one]}: limiter CPU {t['cpu']/o['cpu']:.2f}x, "
          f"Redis commands {t['cmds']/o['cmds']:.2f}x, Redis CPU {t['redis_cpu']/o['redis_cpu']:.2f}x")
PY
