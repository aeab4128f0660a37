//! Envoy's stream-done settlement (`settle: on_stream_done`, issue 31 part
//! 2) through a third-party Envoy RLS client: Python grpcio with stubs that
//! grpcio-tools generates from our trimmed `proto/envoy`, two requests per
//! call, against a real `meridian limiter` on a real redis-server.
//! `tests/clients/envoy_rls.py` is the client; this file drives it and
//! reads the counters in Redis.

use crate::common;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Duration;

use common::RedisServer;
use common::limiter::LimiterProcess;
use serde_json::{Value, json};

const PYTHON_HINT: &str = "install them with `python3 -m pip install grpcio==1.85.1 \
     grpcio-tools==1.85.1 protobuf==7.36.2`, or run scripts/test.sh, which installs them";

/// 10,000 tokens an hour per customer and per team; a customer may go
/// 20,000 into debt (more than 16 calls of at most 1,000 can take), a team
/// only 500.
const RULES: &str = r#"
domain: llm
descriptors:
  - key: customer
    algorithm: fixed_window
    settle: on_stream_done
    max_overdraft: 20000
    rate_limit: {name: tokens, unit: hour, requests_per_unit: 10000}
  - key: team
    algorithm: fixed_window
    settle: on_stream_done
    max_overdraft: 500
    rate_limit: {name: team_tokens, unit: hour, requests_per_unit: 10000}
"#;
const BUDGET: u64 = 10_000;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Generates the Python stubs of `proto/envoy` into `out`; fails (never
/// skips) with an install hint when grpcio or grpcio-tools is missing.
fn generate_stubs(out: &Path) {
    let found = Command::new("python3")
        .args(["-c", "import grpc, grpc_tools.protoc"])
        .stderr(Stdio::null())
        .status();
    assert!(
        found.is_ok_and(|s| s.success()),
        "python3 with grpcio and grpcio-tools is needed by this test: {PYTHON_HINT}"
    );
    // grpcio-tools ships google/protobuf/*.proto beside its module.
    let include = Command::new("python3")
        .args([
            "-c",
            "import grpc_tools, os; print(os.path.join(os.path.dirname(grpc_tools.__file__), '_proto'))",
        ])
        .output()
        .expect("run python3");
    let include = String::from_utf8_lossy(&include.stdout).trim().to_owned();
    let protos = [
        "envoy/service/ratelimit/v3/rls.proto",
        "envoy/extensions/common/ratelimit/v3/ratelimit.proto",
        "envoy/config/core/v3/base.proto",
        "envoy/type/v3/ratelimit_unit.proto",
    ];
    let out_dir = out.to_str().expect("utf-8 temp path");
    let generated = Command::new("python3")
        .args(["-m", "grpc_tools.protoc", "-Iproto"])
        .arg(format!("-I{include}"))
        .arg(format!("--python_out={out_dir}"))
        .arg(format!("--grpc_python_out={out_dir}"))
        .args(protos)
        .current_dir(repo())
        .output()
        .expect("run grpc_tools.protoc");
    assert!(
        generated.status.success(),
        "grpc_tools.protoc failed: {}",
        String::from_utf8_lossy(&generated.stderr)
    );
}

/// The Python client, one JSON command and answer a line.
struct Client {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Client {
    fn start(stubs: &Path, limiter: &LimiterProcess) -> Client {
        let mut child = Command::new("python3")
            .arg(repo().join("tests/clients/envoy_rls.py"))
            .arg(stubs)
            .arg(limiter.grpc.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn the Python RLS client");
        let stdin = child.stdin.take().expect("stdin");
        let stdout = BufReader::new(child.stdout.take().expect("stdout"));
        Client {
            child,
            stdin,
            stdout,
        }
    }

    fn send(&mut self, command: Value) -> Value {
        writeln!(self.stdin, "{command}").expect("write to the client");
        let mut line = String::new();
        self.stdout.read_line(&mut line).expect("read the client");
        assert!(!line.is_empty(), "the Python client exited on {command}");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"))
    }

    /// One ShouldRateLimit: `descriptor_hits` as the action's hits_addend
    /// (None: not set), `request_hits` as the request's.
    fn ask(&mut self, entries: Value, descriptor_hits: Option<u64>, request_hits: u32) -> Value {
        self.send(json!({
            "op": "ask", "domain": "llm", "entries": entries,
            "descriptor_hits": descriptor_hits, "request_hits": request_hits,
        }))
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The fixed window counter of the key whose descriptor value is `value`
/// (0 before anything was charged).
fn counter(redis: &RedisServer, value: &str) -> u64 {
    let mut conn = redis.connection();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("mr:*")
        .query(&mut conn)
        .expect("KEYS");
    let mut found = keys
        .iter()
        .filter(|k| k.contains(value) && k.contains(":fw:"));
    let Some(key) = found.next() else { return 0 };
    assert!(found.next().is_none(), "one window of {value}: {keys:?}");
    let count: Option<u64> = redis::cmd("GET").arg(key).query(&mut conn).expect("GET");
    count.unwrap_or(0)
}

/// One sample of a metric from the limiter's /metrics (0 when absent).
async fn metric(limiter: &LimiterProcess, name: &str, label: &str) -> f64 {
    let text = common::http_get(limiter.http_url("/metrics"))
        .await
        .expect("GET /metrics")
        .text()
        .await
        .expect("metrics text");
    text.lines()
        .filter(|l| l.starts_with(name) && l.contains(label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn code(answer: &Value) -> &str {
    answer["overall"].as_str().unwrap_or("")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_time_checks_charge_nothing_and_stream_done_charges_the_cost() {
    common::require_redis();
    let stubs = tempfile::tempdir().expect("temp dir");
    generate_stubs(stubs.path());
    let redis = RedisServer::start();
    let limiter = LimiterProcess::start(RULES, &["--redis", &redis.url()]);
    common::clear_of_window_boundary(Duration::from_secs(3600), Duration::from_secs(30)).await;
    let mut client = Client::start(stubs.path(), &limiter);
    let acme = json!([["customer", "acme"]]);

    // Request time, as Envoy Gateway writes it (`hits_addend: {number: 0}`)
    // and with no hits_addend at all: admitted, nothing charged.
    let a = client.ask(acme.clone(), Some(0), 0);
    assert_eq!(code(&a), "OK", "{a}");
    assert_eq!(a["statuses"][0]["remaining"], BUDGET, "{a}");
    let a = client.ask(acme.clone(), None, 0);
    assert_eq!(code(&a), "OK", "{a}");
    assert_eq!(counter(&redis, "acme"), 0);

    // Stream done: the descriptor's hits_addend (the action's format from
    // dynamic metadata), then the request's (the filter state).
    let a = client.ask(acme.clone(), Some(1_234), 0);
    assert_eq!(code(&a), "OK", "{a}");
    assert_eq!(counter(&redis, "acme"), 1_234);
    let a = client.ask(acme.clone(), None, 766);
    assert_eq!(code(&a), "OK", "{a}");
    assert_eq!(counter(&redis, "acme"), 2_000);
    assert_eq!(a["statuses"][0]["remaining"], BUDGET - 2_000, "{a}");
    assert_eq!(
        metric(
            &limiter,
            "meridian_stream_done_hits_total",
            "outcome=\"charged\""
        )
        .await,
        2_000.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_calls_stay_within_budget_plus_concurrency_times_largest_call() {
    common::require_redis();
    let stubs = tempfile::tempdir().expect("temp dir");
    generate_stubs(stubs.path());
    let redis = RedisServer::start();
    let limiter = LimiterProcess::start(RULES, &["--redis", &redis.url()]);
    common::clear_of_window_boundary(Duration::from_secs(3600), Duration::from_secs(60)).await;
    let mut client = Client::start(stubs.path(), &limiter);

    // 16 calls at once, each holding its stream 30 ms, costs 100 to 1,000:
    // far more than the budget asked.
    const CONCURRENCY: u64 = 16;
    const LARGEST: u64 = 1_000;
    let costs: Vec<u64> = (0..200)
        .map(|i| match i % 7 {
            0 => LARGEST,
            _ => 100 + (i * 397) % (LARGEST - 100),
        })
        .collect();
    assert_eq!(costs.iter().max(), Some(&LARGEST));
    let run = client.send(json!({
        "op": "calls", "domain": "llm", "entries": [["customer", "busy"]],
        "concurrency": CONCURRENCY, "costs": costs, "hold_ms": 30,
    }));
    let admitted = run["admitted"].as_array().expect("admitted");
    let denied = run["denied"].as_array().expect("denied");
    // Every thread stopped at a denial: the budget ran out.
    assert_eq!(denied.len() as u64, CONCURRENCY, "{run}");
    // A request-time check admits only while budget remains, and denies
    // only when none does.
    for a in admitted {
        assert!(a["remaining"].as_u64() >= Some(1), "admitted at {a}");
    }
    for d in denied {
        assert_eq!(d["remaining"], 0, "denied at {d}");
    }
    // Every stream-done request was answered OK (never denied), and each
    // charged exactly its call's cost.
    let codes = run["stream_done"].as_array().expect("stream_done");
    assert_eq!(codes.len(), admitted.len());
    assert!(codes.iter().all(|c| c == "OK"), "{run}");
    let asked: u64 = admitted.iter().filter_map(|a| a["cost"].as_u64()).sum();
    let charged = counter(&redis, "busy");
    assert_eq!(
        charged, asked,
        "the counter is the sum of the admitted calls' costs"
    );
    // The bound: the budget, plus what calls admitted before it ran out
    // could still charge — at most one largest call per concurrent caller.
    assert!(charged >= BUDGET, "{charged}");
    assert!(
        charged <= BUDGET + CONCURRENCY * LARGEST,
        "{charged} > {BUDGET} + {CONCURRENCY} × {LARGEST}"
    );
    eprintln!(
        "stream-done run: {} calls admitted, {charged} tokens charged, overshoot {} (bound {})",
        admitted.len(),
        charged - BUDGET,
        CONCURRENCY * LARGEST
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settlement_past_the_overdraft_is_capped_and_the_rest_counted() {
    common::require_redis();
    let stubs = tempfile::tempdir().expect("temp dir");
    generate_stubs(stubs.path());
    let redis = RedisServer::start();
    let limiter = LimiterProcess::start(RULES, &["--redis", &redis.url()]);
    common::clear_of_window_boundary(Duration::from_secs(3600), Duration::from_secs(30)).await;
    let mut client = Client::start(stubs.path(), &limiter);
    let team = json!([["team", "red"]]);

    let a = client.ask(team.clone(), Some(9_900), 0);
    assert_eq!(code(&a), "OK", "{a}");
    // 100 remain: the next call is admitted and costs 1,000; the team may
    // go 500 past its budget, so 400 are dropped.
    let a = client.ask(team.clone(), Some(0), 0);
    assert_eq!(
        (code(&a), &a["statuses"][0]["remaining"]),
        ("OK", &json!(100))
    );
    let a = client.ask(team.clone(), Some(1_000), 0);
    assert_eq!(code(&a), "OK", "a settlement is never denied: {a}");
    assert_eq!(counter(&redis, "red"), BUDGET + 500);
    // Nothing remains: the request-time check denies; a late settlement is
    // still answered OK and charges nothing past the cap.
    let a = client.ask(team.clone(), Some(0), 0);
    assert_eq!(code(&a), "OVER_LIMIT", "{a}");
    let a = client.ask(team.clone(), Some(50), 0);
    assert_eq!(code(&a), "OK", "{a}");
    assert_eq!(counter(&redis, "red"), BUDGET + 500);
    let dropped = "outcome=\"over_overdraft\"";
    assert_eq!(
        metric(&limiter, "meridian_stream_done_hits_total", dropped).await,
        450.0
    );
    // Input past what any call costs is refused naming the field, not
    // charged.
    let a = client.ask(team.clone(), Some(2_000_000_000_000_000), 0);
    assert_ne!(code(&a), "OK", "{a}");
    assert_eq!(counter(&redis, "red"), BUDGET + 500);
}
