# Sourced by the bench scripts after scratch_redis.sh: `start_limiter BIN
# flags...` starts `BIN limiter` on `$dir/rules.yaml` with free gRPC and HTTP
# ports (stopping the one it started before), waits until it listens, and
# sets `$limiter_pid`, `$grpc` and `$http`. The script's own `on_exit` stops
# `$limiter_pid`.
limiter_pid=""
start_limiter() {
  local bin=$1; shift
  [ -z "$limiter_pid" ] || { kill "$limiter_pid"; wait "$limiter_pid" 2>/dev/null || true; }
  : > "$dir/limiter.out"
  RUST_LOG=meridian=warn "$bin" limiter --config "$dir/rules.yaml" \
    --grpc-addr 127.0.0.1:0 --http-addr 127.0.0.1:0 "$@" > "$dir/limiter.out" 2> "$dir/limiter.err" &
  limiter_pid=$!
  until grep -q 'grpc=' "$dir/limiter.out" 2>/dev/null; do
    kill -0 "$limiter_pid" 2>/dev/null || { cat "$dir/limiter.err" >&2; exit 1; }
    sleep 0.1
  done
  grpc=$(grep -o 'grpc=[^ ]*' "$dir/limiter.out" | head -1 | cut -d= -f2)
  http=$(grep -o 'http=[^ ]*' "$dir/limiter.out" | head -1 | cut -d= -f2)
}
