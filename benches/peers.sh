#!/usr/bin/env bash
# Meridian beside limitador, one load generator, one run: the same Envoy RLS
# requests (descriptor customer=<key>, 10,000 keys, 16 streams over 4
# connections, closed loop), the same limit (1,000,000 a minute per customer,
# high enough that every check reaches Redis) and the same redis-server, the
# servers taking turns round after round so a change in the shared host's
# speed falls on all of them alike. Each server runs at its default flags:
#   meridian          the default algorithm (sliding_window_counter)
#   meridian fixed    fixed_window, limitador's own counting
#   limitador         limitador-server with Redis storage
# Prints checks/s, server CPU per check, Redis commands and Redis CPU per
# check, p50/p99 (medians over the rounds), with each ratio to limitador.
#
# Usage: LIMITADOR_SRC=path/to/limitador benches/peers.sh [duration=10s] [rounds=3]
#   LIMITADOR_SRC  a checkout of github.com/Kuadrant/limitador; its server is
#                  built there (cargo build --release -p limitador-server),
#                  which needs protobuf-compiler and libclang-dev
#   LIMITADOR      a limitador-server binary to use instead of building one
# Starts its own redis-server and servers on free ports and stops them.
set -euo pipefail
cd "$(dirname "$0")/.."
duration=${1:-10s}
rounds=${2:-3}

for bin in redis-server redis-cli python3; do
  command -v "$bin" >/dev/null || { echo "$bin not found: apt-get install -y redis-server redis-tools python3" >&2; exit 1; }
done
limitador=${LIMITADOR:-}
if [ -z "$limitador" ]; then
  if [ -z "${LIMITADOR_SRC:-}" ]; then
    echo "set LIMITADOR_SRC to a checkout of https://github.com/Kuadrant/limitador (or LIMITADOR to a built limitador-server)" >&2
    exit 1
  fi
  command -v protoc >/dev/null || { echo "protoc not found (limitador's build needs it): apt-get install -y protobuf-compiler" >&2; exit 1; }
  ls /usr/lib/llvm-*/lib/libclang*.so* >/dev/null 2>&1 || { echo "libclang not found (limitador's build needs it): apt-get install -y libclang-dev" >&2; exit 1; }
  echo "==> building limitador-server in $LIMITADOR_SRC (the first build takes a while)" >&2
  cargo build --release --quiet -p limitador-server --manifest-path "$LIMITADOR_SRC/Cargo.toml" >&2
  limitador="$LIMITADOR_SRC/target/release/limitador-server"
fi
[ -x "$limitador" ] || { echo "no limitador-server at $limitador" >&2; exit 1; }
echo "==> building meridian (dist profile)" >&2
cargo build --profile dist --quiet --bin meridian
meridian=target/dist/meridian

server_pid=""
stop_server() {
  if [ -n "$server_pid" ]; then
    kill "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
    server_pid=""
  fi
}
on_exit() { stop_server; }
source benches/scratch_redis.sh

cat > "$dir/meridian.yaml" <<'YAML'
domain: bench
descriptors:
  - key: customer
    rate_limit: {unit: minute, requests_per_unit: 1000000}
YAML
cat > "$dir/meridian-fixed.yaml" <<'YAML'
domain: bench
descriptors:
  - key: customer
    algorithm: fixed_window
    rate_limit: {unit: minute, requests_per_unit: 1000000}
YAML
cat > "$dir/limitador.yaml" <<'YAML'
- namespace: bench
  max_value: 1000000
  seconds: 60
  conditions: []
  variables:
    - descriptors[0]['customer']
YAML

wait_port() { # pid port → waits until the server listens on the port
  for _ in $(seq 1 300); do
    kill -0 "$1" 2>/dev/null || { echo "the server exited; its log:" >&2; cat "$dir/server.err" >&2; exit 1; }
    python3 -c 'import socket,sys; socket.create_connection(("127.0.0.1", int(sys.argv[1])), 0.2)' "$2" 2>/dev/null && return
    sleep 0.1
  done
  echo "the server did not listen on $2 within 30 s" >&2; exit 1
}

start() { # name → starts that server on a fresh port; sets server_pid and target
  local grpc http
  grpc=$(free_port); http=$(free_port)
  redis-cli -p "$port" flushall >/dev/null
  case $1 in
    meridian) RUST_LOG=warn "$meridian" limiter --config "$dir/meridian.yaml" --redis "$redis" \
        --grpc-addr "127.0.0.1:$grpc" --http-addr "127.0.0.1:$http" > "$dir/server.out" 2> "$dir/server.err" & ;;
    meridian-fixed) RUST_LOG=warn "$meridian" limiter --config "$dir/meridian-fixed.yaml" --redis "$redis" \
        --grpc-addr "127.0.0.1:$grpc" --http-addr "127.0.0.1:$http" > "$dir/server.out" 2> "$dir/server.err" & ;;
    limitador) RUST_LOG=error "$limitador" --rls-ip 127.0.0.1 --rls-port "$grpc" --http-ip 127.0.0.1 \
        --http-port "$http" "$dir/limitador.yaml" redis "$redis" > "$dir/server.out" 2> "$dir/server.err" & ;;
  esac
  server_pid=$!
  target="127.0.0.1:$grpc"
  wait_port "$server_pid" "$grpc"
}

servers="meridian meridian-fixed limitador"
for round in $(seq 1 "$rounds"); do
  for name in $servers; do
    echo "==> round $round/$rounds: $name" >&2
    start "$name"
    "$meridian" bench --api rls --target "$target" --domain bench --descriptor 'customer={key}' \
      --keys 10000 --concurrency 16 --connections 4 --duration "$duration" --warmup 2s \
      --redis "$redis" --server-pid "$server_pid" --json 2>/dev/null \
      | python3 -c 'import json,sys; d=json.load(sys.stdin); d["name"]=sys.argv[1]; print(json.dumps(d))' "$name" \
      >> "$dir/results"
    stop_server
  done
done

python3 - "$dir/results" "$duration" "$rounds" <<'PY'
import json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
def med(name, get):
    values = [get(r) for r in rows if r["name"] == name]
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None
figures = {
    "checks/s": (lambda r: r["throughput_checks_per_s"], 0, "higher"),
    "server CPU µs/check": (lambda r: (r["server"] or {}).get("cpu_us_per_check"), 1, "lower"),
    "Redis commands/check": (lambda r: (r["redis"] or {}).get("commands_per_check"), 2, "lower"),
    "Redis CPU µs/check": (lambda r: (r["redis"] or {}).get("cpu_us_per_check"), 1, "lower"),
    "p50 ms": (lambda r: r["latency"]["p50_us"] / 1000, 2, "lower"),
    "p99 ms": (lambda r: r["latency"]["p99_us"] / 1000, 2, "lower"),
    "errors": (lambda r: r["errors"], 0, "lower"),
}
names = [("meridian", "Meridian (sliding_window_counter, the default)"),
         ("meridian-fixed", "Meridian (fixed_window)"),
         ("limitador", "limitador (redis storage)")]
print(f"Envoy RLS, 16 streams over 4 connections, 10,000 keys, {sys.argv[2]} per run, "
      f"medians of {sys.argv[3]} alternating rounds; ratio = Meridian's advantage over limitador "
      "(its checks/s ÷ limitador's; limitador's cost ÷ its)")
print()
print("| figure | " + " | ".join(label for _, label in names) + " |")
print("|---|" + "---:|" * len(names))
for figure, (get, digits, better) in figures.items():
    base = med("limitador", get)
    cells = []
    for name, _ in names:
        v = med(name, get)
        if v is None:
            cells.append("-")
            continue
        cell = f"{v:,.{digits}f}"
        if name != "limitador" and base and v and figure != "errors":
            ratio = v / base if better == "higher" else base / v
            cell += f" ({ratio:.1f}×)"
        cells.append(cell)
    print(f"| {figure} | " + " | ".join(cells) + " |")
PY
