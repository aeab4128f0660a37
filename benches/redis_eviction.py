#!/usr/bin/env python3
"""Which counters a full Redis evicts under an eviction policy (issue 28).

One `meridian limiter` on one local redis-server of MAXMEMORY with POLICY
(plus the redis-server flags in $EXTRA). 200 victims are brought to their
limit on a 5-per-hour /login rule (five allowed checks each, so the
limiter's own over-limit cache knows nothing), then FLOOD checks go to a
one-day rule with keys the client picks, each key repeated $REP times
(1: never repeated). Then each victim is checked once more: an admitted
victim was evicted. Prints one line; the table in docs/operations.md
("Redis full") is made of them. Starts its own servers on free ports.

Usage: benches/redis_eviction.py POLICY FAIL_MODE MAXMEMORY FLOOD
  e.g. EXTRA="--lfu-log-factor 0 --lfu-decay-time 0" \\
       benches/redis_eviction.py volatile-lfu open 8mb 250000
MERIDIAN=path/to/meridian measures that binary (default: target/release/meridian).
"""
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

VICTIMS = 200
BATCH = 1000


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def main():
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    policy, fail_mode, maxmemory, flood = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    repeat = int(os.environ.get("REP", "1"))
    extra = os.environ.get("EXTRA", "").split()
    binary = os.environ.get("MERIDIAN", "target/release/meridian")
    for tool in ("redis-server", "redis-cli", binary):
        if not (os.path.exists(tool) or subprocess.run(["which", tool], capture_output=True).returncode == 0):
            sys.exit(f"{tool} not found (apt-get install -y redis-server; cargo build --release)")
    redis_port, http_port, grpc_port = free_port(), free_port(), free_port()
    work = tempfile.mkdtemp()
    redis = subprocess.Popen(
        ["redis-server", "--port", str(redis_port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", work, "--maxmemory", maxmemory, "--maxmemory-policy", policy] + extra,
        stdout=subprocess.DEVNULL)
    with open(f"{work}/rules.yaml", "w") as f:
        f.write(f"""domain: api
descriptors:
  - key: path
    value: /login
    descriptors:
      - key: user
        fail_mode: {fail_mode}
        rate_limit: {{unit: hour, requests_per_unit: 5}}
  - key: api_key
    rate_limit: {{unit: day, requests_per_unit: 10000}}
""")
    time.sleep(0.3)
    limiter = subprocess.Popen(
        [binary, "limiter", "--config", f"{work}/rules.yaml", "--redis", f"redis://127.0.0.1:{redis_port}",
         "--http-addr", f"127.0.0.1:{http_port}", "--grpc-addr", f"127.0.0.1:{grpc_port}",
         "--redis-deadline", "500ms"],
        stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL)

    def check(descriptors):
        body = json.dumps({"checks": [{"domain": "api", "descriptor": d} for d in descriptors]}).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{http_port}/v1/check", data=body,
                                         headers={"content-type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=60) as r:
                return json.load(r)["decisions"]
        except urllib.error.HTTPError as e:  # 429 when any check is denied
            return json.load(e)["decisions"]

    def login(i):
        return [{"key": "path", "value": "/login"}, {"key": "user", "value": f"victim-{i}"}]

    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{http_port}/healthz", timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        hour = int(time.time() // 3600)
        admitted = sum(d["allowed"] for _ in range(5) for d in check([login(i) for i in range(VICTIMS)]))
        started, sent, fail_mode_answers = time.time(), 0, 0
        while sent < flood:
            decisions = check([[{"key": "api_key", "value": f"k{(sent + j) // repeat}"}] for j in range(BATCH)])
            sent += BATCH
            fail_mode_answers += sum(1 for d in decisions if d.get("reason", "").startswith("fail_"))
        took = time.time() - started
        info = subprocess.run(["redis-cli", "-p", str(redis_port), "info"], capture_output=True, text=True).stdout
        stats = dict(line.split(":", 1) for line in info.splitlines() if line.startswith(("evicted_keys", "used_memory:")))
        after = check([login(i) for i in range(VICTIMS)])
        print(f"{policy} {' '.join(extra)} fail_mode={fail_mode} maxmemory={maxmemory}: {flood} flood checks "
              f"({flood // repeat} keys x {repeat}) in {took:.0f} s, {fail_mode_answers} fail-mode answers, "
              f"evicted_keys {stats.get('evicted_keys')}; victims at 5 of 5: {admitted}/{5 * VICTIMS} admitted before, "
              f"{sum(d['allowed'] for d in after)}/{VICTIMS} admitted again after the flood "
              f"(reasons {sorted(set(d.get('reason') for d in after))})", flush=True)
        if int(time.time() // 3600) != hour:
            sys.exit("the victims' hour ended during the run (their counters reset): run it again")
    finally:
        limiter.kill()
        redis.kill()


if __name__ == "__main__":
    main()
