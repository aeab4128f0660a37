import json, os, subprocess, sys, time, urllib.request
redis_port, http = sys.argv[1], sys.argv[2]
pid = int(sys.argv[3]); n = int(sys.argv[4])
def cpu():
    f = open(f"/proc/{pid}/stat").read().split(")")[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
def stats():
    out = subprocess.run(["redis-cli", "-p", redis_port, "INFO", "commandstats"], capture_output=True, text=True).stdout
    calls = {}
    for line in out.splitlines():
        if line.startswith("cmdstat_"):
            name, rest = line[8:].split(":", 1)
            calls[name] = int(rest.split(",")[0].split("=")[1])
    return calls
def post(path, body):
    req = urllib.request.Request(f"http://{http}{path}", data=json.dumps(body).encode(), headers={"content-type": "application/json"})
    try:
        return json.load(urllib.request.urlopen(req))
    except urllib.error.HTTPError as e:
        return json.load(e)
def run(label, one):
    for i in range(100): one(i)
    s0, c0 = stats(), cpu()
    for i in range(n): one(i)
    s1, c1 = stats(), cpu()
    delta = {k: s1.get(k, 0) - s0.get(k, 0) for k in s1 if s1.get(k, 0) - s0.get(k, 0) > 0}
    delta.pop("info", None)
    total = sum(delta.values())
    print(f"| {label} | {total / n:.2f} | " + ", ".join(f"{k} {v / n:.2f}" for k, v in sorted(delta.items())) + f" | {(c1 - c0) / n * 1e6:.0f} µs |")
run("check (cost 100)", lambda i: post("/v1/check", {"domain": "llm", "rule": "tokens", "key": str(i % 50), "cost": 100}))
def pair(i):
    r = post("/v1/reserve", {"domain": "llm", "rule": "tokens", "key": str(i % 50), "estimate": 100, "ttl_ms": 60000})
    post("/v1/commit", {"id": r["id"], "actual": 40})
run("reserve + commit", pair)
