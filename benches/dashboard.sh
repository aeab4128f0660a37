#!/usr/bin/env bash
# What the dashboard costs a coordinator: runs `meridian demo` (release build,
# rebalancing every 1 s so updates come often), then measures on coordinator 1
# (the dashboard's node):
#   - the bytes of each live update on /api/v1/events, and the bytes of the
#     requests a page makes for it (allocations, the history since the last
#     sample, the Raft view at most every 2 s), read with curl;
#   - its CPU over the same span with 0 dashboards open, then with 10 real
#     headless Chromium pages open (Debian's chromium).
# Prints one table for docs/performance.md.
#
# Usage: benches/dashboard.sh [seconds=30]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-30}
for bin in chromium curl python3 redis-server; do
  command -v "$bin" >/dev/null || { echo "$bin not found: apt-get install -y chromium curl python3 redis-server" >&2; exit 1; }
done
cargo build --profile dist --quiet --bin meridian
dir=$(mktemp -d)
browsers=()
cleanup() {
  for b in "${browsers[@]}"; do kill "$b" 2>/dev/null || true; done
  [ -n "${demo_pid:-}" ] && kill -INT "$demo_pid" 2>/dev/null && wait "$demo_pid" 2>/dev/null
  rm -rf "$dir"
}
trap cleanup EXIT
target/dist/meridian demo --rebalance-interval 1s --shift-every 20s --for $((seconds * 3 + 60))s >"$dir/demo.out" 2>&1 &
demo_pid=$!
until grep -q "dashboard:" "$dir/demo.out" 2>/dev/null; do sleep 0.2; done
url=$(awk '/dashboard:/ {print $2}' "$dir/demo.out")
ca=$(awk '/mutual TLS:/ {print $4}' "$dir/demo.out")
port=${url##*:}; port=${port%/}
pid=$(pgrep -f "coordinator --id 1 .*127.0.0.1:${port}" | head -1)
[ -n "$pid" ] || { echo "coordinator 1 not found" >&2; exit 1; }
sleep 10 # the first epochs

cpu_seconds() { # utime + stime of $pid in seconds
  awk -v hz="$(getconf CLK_TCK)" '{print ($14 + $15) / hz}' "/proc/$pid/stat"
}
measure_cpu() {
  local a b
  a=$(cpu_seconds); sleep "$seconds"; b=$(cpu_seconds)
  python3 -c "print(f'{100 * ($b - $a) / $seconds:.1f}')"
}

# Bytes of the live updates: the event stream for $seconds.
curl -sN --cacert "$ca" --max-time "$seconds" "${url}api/v1/events" >"$dir/events" || true
read -r events event_bytes < <(python3 - "$dir/events" <<'EOF'
import sys
text = open(sys.argv[1], encoding="utf-8").read()
blocks = [b for b in text.split("\n\n") if b.startswith("event: update")]
print(len(blocks), sum(len(b.encode()) + 2 for b in blocks))
EOF
)
rule=demo%7Ccustomer
since=$(($(date +%s%3N) - 1500))
alloc=$(curl -s --cacert "$ca" "${url}api/v1/allocations" | wc -c)
hist=$(curl -s --cacert "$ca" "${url}api/v1/history?rule=${rule}&since=${since}" | wc -c)
cluster=$(curl -s --cacert "$ca" "${url}api/v1/cluster" | wc -c)

idle=$(measure_cpu)
for i in $(seq 1 10); do
  chromium --headless=new --no-sandbox --disable-gpu --ignore-certificate-errors \
    --user-data-dir="$dir/chrome-$i" "$url" >/dev/null 2>&1 &
  browsers+=($!)
done
sleep 10 # pages loaded and following
open=$(measure_cpu)

per_event=$((event_bytes / (events > 0 ? events : 1)))
per_update=$((per_event + alloc + hist + cluster / 2))
echo
echo "| figure (coordinator 1, demo rebalancing every 1 s, ${seconds} s) | value |"
echo "|---|---|"
echo "| live updates received | ${events} in ${seconds} s |"
echo "| bytes per update on the event stream | ${per_event} |"
echo "| bytes a page fetches per update (allocations ${alloc} + history since the last sample ${hist} + Raft view ${cluster} every 2 s / 2) | $((alloc + hist + cluster / 2)) |"
echo "| bytes per update per dashboard, in all | ${per_update} |"
echo "| coordinator CPU, no dashboard | ${idle} % of a core |"
echo "| coordinator CPU, 10 headless Chromium dashboards | ${open} % of a core |"
