#!/usr/bin/env bash
# Pipelined throughput of each Meridian Lua script on a local redis-server,
# with the Redis commands and Redis CPU each check costs, beside plain INCR
# and a bare `EVALSHA return 1` on the same server: the floor a script can
# reach and the ceiling a regional limiter pod is measured against. Starts
# its own redis-server on a free port and stops it.
#
# Usage: benches/lua_scripts.sh [requests=200000] [pipeline=32] [clients=8]
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-200000}; pipeline=${2:-32}; clients=${3:-8}
scripts=src/store/redis/scripts

for bin in redis-server redis-cli redis-benchmark; do
  command -v "$bin" >/dev/null || { echo "$bin not found: apt-get install -y redis-server redis-tools" >&2; exit 1; }
done

source benches/scratch_redis.sh

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

# One redis-benchmark run of a command; prints "checks/s commands/check
# Redis-CPU-µs/check", the last two from INFO deltas around the run (the
# server's own user+system CPU; commands include those a script calls).
measure() {
  redis-cli -p "$port" config resetstat >/dev/null
  local before after rate
  before=$(redis-cli -p "$port" info cpu | tr -d '\r' | awk -F: '/^used_cpu_(user|sys):/ {s += $2} END {printf "%.6f", s}')
  rate=$(redis-benchmark -p "$port" -n "$n" -P "$pipeline" -c "$clients" -q "$@" 2>/dev/null \
    | tr '\r' '\n' | awk '/requests per second/ {for (i=1;i<=NF;i++) if ($(i+1)=="requests") print $i}' | tail -1)
  after=$(redis-cli -p "$port" info cpu | tr -d '\r' | awk -F: '/^used_cpu_(user|sys):/ {s += $2} END {printf "%.6f", s}')
  # Every command but the INFO, CONFIG and SCRIPT calls of this script itself.
  local calls
  calls=$(redis-cli -p "$port" info commandstats | tr -d '\r' \
    | awk -F'[:=,]' '/^cmdstat_/ && $1 !~ /cmdstat_(info|config|script)$/ {s += $3} END {print s}')
  python3 -c 'import sys; r, c, b, a, n = map(float, sys.argv[1:]); print(f"{r:.0f} {c / n:.2f} {(a - b) * 1e6 / n:.2f}")' \
    "$rate" "$calls" "$before" "$after" "$n"
}

row() { # name keys measured... → one table row, ratios to INCR's rate
  local name=$1 keys=$2 rate=$3 cmds=$4 cpu=$5 incr_rate=$6
  printf '| %s | %s | %s | %s | %s | %s |\n' "$name" "$keys" \
    "$(printf "%'.0f" "$rate")" "$(python3 -c "print(f'{$rate / $incr_rate:.2f}')")" "$cmds" "$cpu"
}

echo "| command | keys | checks/s | vs INCR | Redis commands/check | Redis CPU µs/check |"
echo "|---|---|---:|---:|---:|---:|"
read -r incr_one incr_one_c incr_one_cpu <<<"$(measure INCR "bench-incr")"
read -r incr_many incr_many_c incr_many_cpu <<<"$(measure -r 1000000 INCR "bench-incr:__rand_int__")"
row INCR one "$incr_one" "$incr_one_c" "$incr_one_cpu" "$incr_one"
row INCR 1M "$incr_many" "$incr_many_c" "$incr_many_cpu" "$incr_many"
# The floor of any script: entering Lua with one key and the nine arguments
# of one check, and returning.
noop=$(redis-cli -p "$port" script load 'return 1')
read -r r c u <<<"$(measure EVALSHA "$noop" 1 "mr:{bench:one}" "" 1000000 60000000 1 1 1 0 1000000 1)"
row '`EVALSHA return 1` (nine arguments)' one "$r" "$c" "$u" "$incr_one"
for name in fixed_window sliding_log sliding_counter token_bucket leaky_bucket; do
  # Assembled as src/store/redis/mod.rs's script_source does.
  parts=("$scripts/prelude.lua" "$scripts/$name.lua" "$scripts/epilogue.lua")
  case $name in token_bucket | leaky_bucket) parts=("$scripts/bucket_rescale.lua" "${parts[@]}") ;; esac
  sha=$(cat "${parts[@]}" | redis-cli -p "$port" -x script load)
  eval "args=(${argv[$name]})"
  read -r r c u <<<"$(measure EVALSHA "$sha" 1 "mr:{bench:one}" "${args[@]}")"
  row "$name" one "$r" "$c" "$u" "$incr_one"
  read -r r c u <<<"$(measure -r 1000000 EVALSHA "$sha" 1 "mr:{bench:__rand_int__}" "${args[@]}")"
  row "$name" 1M "$r" "$c" "$u" "$incr_many"
done
