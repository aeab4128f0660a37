#!/usr/bin/env bash
# Pipelined throughput of each Meridian Lua script on a local redis-server,
# beside plain INCR on the same server: the ceiling a regional limiter pod is
# measured against. Starts its own redis-server on a free port and stops it.
#
# Usage: benches/lua_scripts.sh [requests=200000] [pipeline=32] [clients=8]
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-200000}; pipeline=${2:-32}; clients=${3:-8}
scripts=src/store/redis/scripts

for bin in redis-server redis-cli redis-benchmark; do
  command -v "$bin" >/dev/null || { echo "$bin not found: apt-get install -y redis-server redis-tools" >&2; exit 1; }
done

dir=$(mktemp -d)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$dir" --daemonize yes \
  --pidfile "$dir/redis.pid" --logfile "$dir/redis.log" >/dev/null
trap 'kill "$(cat "$dir/redis.pid")" 2>/dev/null; rm -rf "$dir"' EXIT
until redis-cli -p "$port" ping >/dev/null 2>&1; do sleep 0.05; done

# ARGV as RedisStore sends it for one check (see scripts/prelude.lua): "" = use
# the server clock, limit 1,000,000 per 60 s (the log: 100,000), then tick, unit,
# refill, capacity and TTL floor as Params computes them for those limits, then
# the check's cost, 1.
declare -A argv=(
  [fixed_window]='"" 1000000 60000000 1 1 1 0 1000000 1'
  [sliding_log]='"" 100000 60000000 1 1 1 0 1000000 1'
  [sliding_counter]='"" 1000000 60000000 1 1 1 0 1000000 1'
  [token_bucket]='"" 1000000 60000000 1 60 1 60000000 1000000 1'
  [leaky_bucket]='"" 1000000 60000000 1 60 1 60000000 1000000 1'
)

rate() { # prints requests per second of one redis-benchmark command
  redis-benchmark -p "$port" -n "$n" -P "$pipeline" -c "$clients" -q "$@" 2>/dev/null \
    | tr '\r' '\n' | awk '/requests per second/ {for (i=1;i<=NF;i++) if ($(i+1)=="requests") print $i}' | tail -1
}

printf '%-18s %-9s %14s %10s\n' script keys "checks/s" "vs INCR"
incr_one=$(rate INCR "bench-incr")
incr_many=$(rate -r 1000000 INCR "bench-incr:__rand_int__")
printf '%-18s %-9s %14.0f %10s\n' INCR one "$incr_one" 1.00 INCR 1M "$incr_many" 1.00
for name in fixed_window sliding_log sliding_counter token_bucket leaky_bucket; do
  sha=$(cat "$scripts/prelude.lua" "$scripts/$name.lua" "$scripts/epilogue.lua" | redis-cli -p "$port" -x script load)
  eval "args=(${argv[$name]})"
  one=$(rate EVALSHA "$sha" 1 "mr:{bench:one}" "${args[@]}")
  many=$(rate -r 1000000 EVALSHA "$sha" 1 "mr:{bench:__rand_int__}" "${args[@]}")
  printf '%-18s %-9s %14.0f %10.2f\n' "$name" one "$one" "$(echo "$one / $incr_one" | bc -l)"
  printf '%-18s %-9s %14.0f %10.2f\n' "$name" 1M "$many" "$(echo "$many / $incr_many" | bc -l)"
done
