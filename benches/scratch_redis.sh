# Sourced by the bench scripts: a scratch directory `$dir` and a redis-server
# of their own on a free port (`$port`, `$redis` its URL), never the one on
# 6379, both gone when the script exits. A script that starts more processes
# stops them in its own `on_exit`, defined before it sources this file; it
# runs first.
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
declare -F on_exit >/dev/null || on_exit() { :; }
dir=$(mktemp -d)
port=$(free_port)
redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$dir" --daemonize yes \
  --pidfile "$dir/redis.pid" --logfile "$dir/redis.log" >/dev/null
scratch_cleanup() {
  on_exit || true
  kill "$(cat "$dir/redis.pid")" 2>/dev/null || true
  rm -rf "$dir"
}
trap scratch_cleanup EXIT
until redis-cli -p "$port" ping >/dev/null 2>&1; do sleep 0.05; done
redis="redis://127.0.0.1:$port"
