#!/usr/bin/env bash
# End-to-end cost of a check: one release `meridian limiter` on one local
# redis-server, driven by `meridian bench` closed loop (10,000 keys, uniform,
# 4 connections) over Envoy RLS, native gRPC and HTTP with 16 streams of single
# checks, and native gRPC with 4 streams of batches of 100, for fixed_window and
# sliding_window_counter; the RLS row once more on a limiter with
# `--store memory` (no Redis: the transport's floor); then, on the same Redis,
# the pipelined redis-benchmark EVALSHA rate of the same two scripts (the
# ceiling). Prints the table in docs/performance.md. Starts its own servers on
# free ports and stops them.
#
# Usage: benches/limiter.sh [duration=10s] [limiter flags...]
# MERIDIAN=path/to/meridian measures that binary (say, a saved build of the
# previous commit) as the limiter instead of building this tree's; the load
# generator is always this tree's.
set -euo pipefail
cd "$(dirname "$0")/.."
duration=${1:-10s}
shift || true
scripts=src/store/redis/scripts

for bin in redis-server redis-cli redis-benchmark python3; do
  command -v "$bin" >/dev/null || { echo "$bin not found: apt-get install -y redis-server redis-tools python3" >&2; exit 1; }
done
cargo build --profile dist --quiet --bin meridian
meridian=target/dist/meridian
limiter_bin=${MERIDIAN:-$meridian}

on_exit() { [ -z "${limiter_pid:-}" ] || kill "$limiter_pid" 2>/dev/null; }
source benches/scratch_redis.sh
source benches/scratch_limiter.sh

# Limits high enough that every check reaches Redis (no over-limit cache hits),
# and the same as benches/lua_scripts.sh uses, so the ceiling below is comparable.
cat > "$dir/rules.yaml" <<'YAML'
domain: bench
descriptors:
  - key: fixed
    algorithm: fixed_window
    rate_limit: {name: fixed, unit: minute, requests_per_unit: 1000000}
  - key: sliding
    algorithm: sliding_window_counter
    rate_limit: {name: sliding, unit: minute, requests_per_unit: 1000000}
YAML

start_limiter "$limiter_bin" --redis "$redis" "$@"

run() { # label algorithm streams api target args... → one JSON line in $dir/results
  local label=$1 algorithm=$2 streams=$3 api=$4 target=$5; shift 5
  echo "==> $label $algorithm" >&2
  "$meridian" bench --api "$api" --target "$target" --domain bench --keys 10000 \
    --concurrency "$streams" --connections 4 --duration "$duration" --warmup 2s \
    --redis "$redis" --server-pid "$limiter_pid" --json "$@" 2>/dev/null \
    | python3 -c 'import json,sys; d=json.load(sys.stdin); d["label"]=sys.argv[1]; d["algorithm"]=sys.argv[2]; print(json.dumps(d))' "$label" "$algorithm" \
    >> "$dir/results"
}

for algorithm in fixed sliding; do
  run "Envoy RLS" "$algorithm" 16 rls "$grpc" --descriptor "$algorithm={key}"
  run "native gRPC" "$algorithm" 16 grpc "$grpc" --rule "$algorithm"
  run "native gRPC, batches of 100" "$algorithm" 4 grpc "$grpc" --rule "$algorithm" --batch 100
  run "HTTP JSON" "$algorithm" 16 http "http://$http" --rule "$algorithm"
done

# The transport's floor: the same RLS row on a limiter with no store I/O at
# all (`--store memory`), so what Redis adds to a check is the difference.
start_limiter "$limiter_bin" --store memory "$@"
run "Envoy RLS, --store memory (no Redis)" fixed 16 rls "$grpc" --descriptor "fixed={key}"

# The ceiling: the same scripts with the same arguments, pipelined straight into Redis.
ceiling() { # script-file → checks/s
  local sha
  sha=$(cat "$scripts/prelude.lua" "$scripts/$1.lua" "$scripts/epilogue.lua" | redis-cli -p "$port" -x script load)
  redis-benchmark -p "$port" -n 300000 -P 32 -c 8 -r 10000 -q \
    EVALSHA "$sha" 1 "mr:{ceiling:__rand_int__}" "" 1000000 60000000 1 1 1 0 1000000 1 2>/dev/null \
    | tr '\r' '\n' | awk '/requests per second/ {for (i=1;i<=NF;i++) if ($(i+1)=="requests") print $i}' | tail -1
}
fixed_ceiling=$(ceiling fixed_window)
sliding_ceiling=$(ceiling sliding_counter)

python3 - "$dir/results" "$fixed_ceiling" "$sliding_ceiling" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
ceiling = {"fixed": float(sys.argv[2]), "sliding": float(sys.argv[3])}
names = {"fixed": "fixed_window", "sliding": "sliding_window_counter"}
f = lambda v, d=1: "-" if v is None else f"{v:,.{d}f}"
# Checks the limiter decided without Redis: its fail mode (Redis deadline or
# circuit breaker) or its over-limit cache. Only the native APIs say so.
skipped = ("fail_open", "fail_closed", "fail_local", "cached_over_limit")
print("| API | algorithm | streams | checks/s | p50 ms | p99 ms | limiter CPU µs/check | Redis scripts/check | Redis cmds/check (in scripts too) | Redis CPU µs/check | bench CPU µs/check | not from Redis | errors |")
print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for r in rows:
    red = r["redis"] or {}
    if r["api"] == "rls":
        not_from_redis = "-"
    else:
        n = sum(v for k, v in r["reasons"].items() if k in skipped)
        not_from_redis = f"{100 * n / max(1, r['checks']):.1f} %"
    print(f"| {r['label']} | {names[r['algorithm']]} | {r['concurrency']} | {f(r['throughput_checks_per_s'], 0)} "
          f"| {r['latency']['p50_us']/1000:.2f} | {r['latency']['p99_us']/1000:.2f} "
          f"| {f((r['server'] or {}).get('cpu_us_per_check'))} | {f(red.get('scripts_per_check'), 2)} "
          f"| {f(red.get('commands_per_check'), 2)} | {f(red.get('cpu_us_per_check'))} "
          f"| {f(r['client']['cpu_us_per_check'])} | {not_from_redis} | {r['errors']} |")
print()
for k, v in ceiling.items():
    print(f"Ceiling, redis-benchmark EVALSHA {names[k]} (10,000 keys, pipeline 32, 8 clients): {v:,.0f} checks/s")
PY
