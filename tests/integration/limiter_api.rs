//! The limiter service over real sockets: Envoy RLS v3 and native gRPC with
//! tonic clients, HTTP with reqwest, against real Redis.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::RedisServer;
use common::limiter::LimiterProcess;
use meridian::proto::envoy::extensions::common::ratelimit::v3::{
    RateLimitDescriptor, rate_limit_descriptor::Entry, rate_limit_descriptor::RateLimitOverride,
};
use meridian::proto::envoy::service::ratelimit::v3::rate_limit_response::Code;
use meridian::proto::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use meridian::proto::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use meridian::proto::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use meridian::proto::meridian::v1::limiter_client::LimiterClient;
use meridian::proto::meridian::v1::{Check, CheckRequest};
use tonic::transport::Channel;

const RULES: &str = r#"
domain: api
descriptors:
  - key: customer
    rate_limit:
      name: per_customer
      unit: minute
      requests_per_unit: 3
  - key: tokens
    algorithm: token_bucket
    burst: 100
    rate_limit:
      name: llm_tokens
      unit: minute
      requests_per_unit: 100
  - key: smooth
    algorithm: leaky_bucket
    period: 1s
    burst: 3
    rate_limit:
      name: smooth
      requests_per_unit: 10
  - key: path
    value: /health
"#;

fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(k, v)| Entry {
                key: (*k).into(),
                value: (*v).into(),
            })
            .collect(),
        ..Default::default()
    }
}

async fn ask(
    client: &mut RateLimitServiceClient<Channel>,
    descriptors: Vec<RateLimitDescriptor>,
    hits: u32,
) -> RateLimitResponse {
    client
        .should_rate_limit(RateLimitRequest {
            domain: "api".into(),
            descriptors,
            hits_addend: hits,
        })
        .await
        .expect("ShouldRateLimit")
        .into_inner()
}

async fn rls_client(limiter: &LimiterProcess) -> RateLimitServiceClient<Channel> {
    RateLimitServiceClient::connect(limiter.grpc_url())
        .await
        .expect("connect RLS")
}

#[tokio::test]
async fn rls_enforces_per_descriptor_limits_with_filled_statuses() {
    let redis = RedisServer::start();
    let limiter = LimiterProcess::start(RULES, &["--redis", &redis.url(), "--response-headers"]);
    let mut client = rls_client(&limiter).await;
    common::clear_of_window_boundary(Duration::from_secs(60), Duration::from_secs(15)).await;

    for expected_remaining in [2, 1, 0] {
        let r = ask(&mut client, vec![descriptor(&[("customer", "a")])], 0).await;
        assert_eq!(r.overall_code, Code::Ok as i32);
        let s = &r.statuses[0];
        let limit = s.current_limit.as_ref().expect("current_limit filled");
        assert_eq!(
            (limit.requests_per_unit, limit.unit, limit.name.as_str()),
            (3, Unit::Minute as i32, "per_customer")
        );
        assert_eq!(s.limit_remaining, expected_remaining);
        let reset = s
            .duration_until_reset
            .as_ref()
            .expect("duration_until_reset filled");
        assert!(
            reset.seconds <= 60 && (reset.seconds > 0 || reset.nanos > 0),
            "{reset:?}"
        );
        let header = |k: &str| {
            r.response_headers_to_add
                .iter()
                .find(|h| h.key == k)
                .map(|h| h.value.clone())
        };
        assert_eq!(header("RateLimit-Limit").as_deref(), Some("3"));
        assert_eq!(
            header("RateLimit-Remaining"),
            Some(expected_remaining.to_string())
        );
    }
    // Fourth hit of customer a is over; customer b is separate; unmatched is OK.
    let r = ask(
        &mut client,
        vec![
            descriptor(&[("customer", "a")]),
            descriptor(&[("customer", "b")]),
            descriptor(&[("unknown", "x")]),
            descriptor(&[("path", "/health")]),
        ],
        0,
    )
    .await;
    assert_eq!(r.overall_code, Code::OverLimit as i32);
    let codes: Vec<i32> = r.statuses.iter().map(|s| s.code).collect();
    assert_eq!(
        codes,
        [
            Code::OverLimit as i32,
            Code::Ok as i32,
            Code::Ok as i32,
            Code::Ok as i32
        ]
    );
    assert!(r.statuses[2].current_limit.is_none() && r.statuses[3].current_limit.is_none());
    assert_eq!(r.statuses[1].limit_remaining, 2);
}

#[tokio::test]
async fn rls_hits_addend_check_only_and_limit_override() {
    let redis = RedisServer::start();
    let limiter = LimiterProcess::start(RULES, &["--redis", &redis.url()]);
    let mut client = rls_client(&limiter).await;

    // Request-level hits_addend: 2 of the 3 at once.
    let r = ask(&mut client, vec![descriptor(&[("customer", "h")])], 2).await;
    assert_eq!(r.statuses[0].limit_remaining, 1);
    // Descriptor-level hits_addend 0: check only, nothing consumed.
    let mut peek = descriptor(&[("customer", "h")]);
    peek.hits_addend = Some(0);
    for _ in 0..3 {
        let r = ask(&mut client, vec![peek.clone()], 0).await;
        assert_eq!(
            (r.overall_code, r.statuses[0].limit_remaining),
            (Code::Ok as i32, 1)
        );
    }
    // Cost larger than what is left is over the limit.
    let r = ask(&mut client, vec![descriptor(&[("customer", "h")])], 2).await;
    assert_eq!(r.overall_code, Code::OverLimit as i32);

    // A per-descriptor override replaces the rule's rate.
    let mut overridden = descriptor(&[("customer", "o")]);
    overridden.limit = Some(RateLimitOverride {
        requests_per_unit: 1,
        unit: meridian::proto::envoy::r#type::v3::RateLimitUnit::Hour as i32,
    });
    let r = ask(&mut client, vec![overridden.clone()], 0).await;
    let limit = r.statuses[0].current_limit.as_ref().expect("limit");
    assert_eq!(limit.requests_per_unit, 1);
    let r = ask(&mut client, vec![overridden], 0).await;
    assert_eq!(r.overall_code, Code::OverLimit as i32);
}

#[tokio::test]
async fn native_batches_report_cost_retry_and_queue_delay() {
    let redis = RedisServer::start();
    let limiter = LimiterProcess::start(RULES, &["--redis", &redis.url()]);
    let mut client = LimiterClient::connect(limiter.grpc_url())
        .await
        .expect("connect");
    let check = |rule: &str, key: &str, cost: u64| Check {
        domain: "api".into(),
        rule: rule.into(),
        key: key.into(),
        cost,
        ..Default::default()
    };
    let batch = vec![
        check("llm_tokens", "u1", 60),
        check("llm_tokens", "u1", 60),
        check("smooth", "s", 1),
        check("smooth", "s", 1),
        check("nope", "x", 1),
        Check {
            domain: String::new(),
            ..Default::default()
        },
    ];
    let d = client
        .check(CheckRequest { checks: batch })
        .await
        .expect("Check")
        .into_inner()
        .decisions;
    assert_eq!(d.len(), 6);
    // Token bucket: 60 of 100, then 60 more does not fit.
    let allowed: Vec<bool> = d[..2].iter().map(|x| x.allowed).collect();
    assert_eq!(allowed.iter().filter(|a| **a).count(), 1, "{d:?}");
    let denied = d[..2].iter().find(|x| !x.allowed).expect("one denied");
    assert_eq!(
        (denied.reason.as_str(), denied.rule.as_str()),
        ("over_limit", "llm_tokens")
    );
    assert!(denied.retry_after_us > 0);
    // Leaky bucket at 10/s: the second admitted request waits ~100 ms to keep the rate.
    let mut delays: Vec<u64> = d[2..4].iter().map(|x| x.delay_us).collect();
    delays.sort();
    assert_eq!(delays[0], 0);
    assert!((90_000..=100_000).contains(&delays[1]), "{delays:?}");
    assert!(d[4].allowed && !d[4].matched, "unknown rule is not limited");
    assert!(d[5].error.contains("domain"), "{:?}", d[5]);
}

/// envoyproxy/ratelimit's HTTP endpoint: a `RateLimitRequest` in proto3
/// JSON, the `RateLimitResponse` back, 200 or 429 as that project answers.
#[tokio::test]
async fn post_json_answers_envoy_responses_with_200_or_429_and_400_naming_the_field() {
    let redis = RedisServer::start();
    let limiter = LimiterProcess::start(RULES, &["--redis", &redis.url(), "--response-headers"]);
    let http = common::http_client().build().expect("HTTP client");
    let url = limiter.http_url("/json");
    let body = serde_json::json!({
        "domain": "api",
        "descriptors": [
            {"entries": [{"key": "customer", "value": "json"}]},
            {"entries": [{"key": "path", "value": "/health"}]},
        ],
    });
    common::clear_of_window_boundary(Duration::from_secs(60), Duration::from_secs(15)).await;
    for remaining in [Some(2), Some(1), None] {
        let r = http.post(&url).json(&body).send().await.expect("POST");
        assert_eq!(r.status(), 200);
        let d: serde_json::Value = r.json().await.expect("json");
        assert_eq!(d["overallCode"], "OK", "{d}");
        let first = &d["statuses"][0];
        assert_eq!(first["code"], "OK");
        assert_eq!(
            first["currentLimit"],
            serde_json::json!({"name": "per_customer", "requestsPerUnit": 3, "unit": "MINUTE"})
        );
        // proto3 JSON leaves a zero out.
        assert_eq!(first["limitRemaining"].as_u64(), remaining, "{d}");
        let reset = first["durationUntilReset"]
            .as_str()
            .expect("a Duration string");
        assert!(reset.ends_with('s'), "{reset}");
        assert_eq!(d["statuses"][1], serde_json::json!({"code": "OK"}));
        assert_eq!(d["responseHeadersToAdd"][0]["key"], "RateLimit-Limit");
    }
    let r = http.post(&url).json(&body).send().await.expect("POST");
    assert_eq!(r.status(), 429);
    let d: serde_json::Value = r.json().await.expect("json");
    assert_eq!(d["overallCode"], "OVER_LIMIT");
    assert_eq!(d["statuses"][0]["code"], "OVER_LIMIT");
    assert_eq!(d["statuses"][1]["code"], "OK");

    // snake_case names, a string uint64 and a check-only hits_addend of 0.
    let peek = r#"{"domain":"api","descriptors":[{"entries":[{"key":"customer","value":"other"}],"hits_addend":"0"}]}"#;
    for _ in 0..5 {
        let r = http.post(&url).body(peek).send().await.expect("POST");
        assert_eq!(r.status(), 200);
        let d: serde_json::Value = r.json().await.expect("json");
        assert_eq!(d["statuses"][0]["limitRemaining"], 3, "{d}");
    }

    for (bad, field) in [
        ("{not json", "body"),
        (
            r#"{"domain":"api","descriptors":[{"entries":[{"key":"customer","value":7}]}]}"#,
            "descriptors[0].entries[0].value",
        ),
        (
            r#"{"domain":"api","descriptors":[{"entries":[{"key":"customer","value":"a"}],"limit":{"requestsPerUnit":5,"unit":"FORTNIGHT"}}]}"#,
            "descriptors[0].limit.unit",
        ),
        (
            r#"{"domain":"api","descriptors":[],"colour":"red"}"#,
            "colour",
        ),
        (
            r#"{"domain":"","descriptors":[{"entries":[{"key":"customer","value":"a"}]}]}"#,
            "domain",
        ),
        (r#"{"domain":"api"}"#, "descriptors"),
    ] {
        let r = http.post(&url).body(bad).send().await.expect("POST");
        assert_eq!(r.status(), 400, "{bad}");
        let e: serde_json::Value = r.json().await.expect("error json");
        let msg = e["error"].as_str().unwrap_or_default();
        assert!(msg.contains(field), "{bad}: {msg}");
    }
    // The limiter answers 413 once the body passes its bound and closes: a
    // client still writing may see its write fail before it reads the
    // answer (a broken pipe under load), so the body is written over a raw
    // socket by one task while the answer is read by another.
    let addr = url
        .trim_start_matches("http://")
        .split('/')
        .next()
        .expect("host:port")
        .to_string();
    let conn = tokio::net::TcpStream::connect(&addr)
        .await
        .expect("connect");
    let (mut rx, mut tx) = conn.into_split();
    let head = format!(
        "POST /json HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        2 << 20
    );
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let writer = tokio::spawn(async move {
        tx.write_all(head.as_bytes()).await?;
        tx.write_all(&vec![b'a'; 2 << 20]).await
    });
    let mut answer = vec![0u8; 64];
    let n = tokio::time::timeout(Duration::from_secs(10), rx.read(&mut answer))
        .await
        .expect("an answer within 10 s")
        .expect("read");
    let status = String::from_utf8_lossy(&answer[..n]).to_string();
    assert!(
        status.starts_with("HTTP/1.1 413"),
        "bodies are bounded: {status}"
    );
    writer.abort();
}

#[tokio::test]
async fn http_checks_answer_200_or_429_with_headers_and_400_for_bad_input() {
    let redis = RedisServer::start();
    let limiter = LimiterProcess::start(RULES, &["--redis", &redis.url()]);
    let http = common::http_client().build().expect("HTTP client");
    let url = limiter.http_url("/v1/check");
    let body = serde_json::json!({"domain": "api", "rule": "per_customer", "key": "web"});
    common::clear_of_window_boundary(Duration::from_secs(60), Duration::from_secs(15)).await;
    for remaining in ["2", "1", "0"] {
        let r = http.post(&url).json(&body).send().await.expect("POST");
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers()["ratelimit-limit"], "3");
        assert_eq!(r.headers()["ratelimit-remaining"], remaining);
        assert!(r.headers().contains_key("ratelimit-reset"));
    }
    let r = http.post(&url).json(&body).send().await.expect("POST");
    assert_eq!(r.status(), 429);
    let retry: u64 = r.headers()["retry-after"]
        .to_str()
        .expect("ascii")
        .parse()
        .expect("seconds");
    assert!((1..=60).contains(&retry), "{retry}");
    let d: serde_json::Value = r.json().await.expect("json");
    assert_eq!(
        (d["allowed"].as_bool(), d["reason"].as_str()),
        (Some(false), Some("over_limit"))
    );

    // A batch: 429 because one is denied, one decision per check.
    let batch = serde_json::json!({"checks": [body, {"domain": "api", "descriptor": [{"key": "customer", "value": "z"}]}]});
    let r = http.post(&url).json(&batch).send().await.expect("POST");
    assert_eq!(r.status(), 429);
    let d: serde_json::Value = r.json().await.expect("json");
    assert_eq!(d["decisions"].as_array().map(Vec::len), Some(2));
    assert_eq!(d["decisions"][1]["allowed"], true);

    for (bad, needle) in [
        ("{not json", "invalid JSON"),
        (
            r#"{"domain": "api", "rule": "per_customer", "colour": 1}"#,
            "colour",
        ),
        (r#"{"rule": "per_customer"}"#, "domain"),
        (r#"{"domain": "", "rule": "per_customer"}"#, "domain"),
    ] {
        let r = http
            .post(&url)
            .header("content-type", "application/json")
            .body(bad)
            .send()
            .await
            .expect("POST");
        assert_eq!(r.status(), 400, "{bad}");
        let e: serde_json::Value = r.json().await.expect("error json");
        let msg = e["error"].as_str().unwrap_or_default();
        assert!(msg.contains(needle), "{bad}: {msg}");
    }
    let health = http
        .get(limiter.http_url("/healthz"))
        .send()
        .await
        .expect("healthz");
    assert_eq!(health.status(), 200);
    let ready = http
        .get(limiter.http_url("/readyz"))
        .send()
        .await
        .expect("readyz");
    assert_eq!(ready.status(), 200);
    let metrics = http
        .get(limiter.http_url("/metrics"))
        .send()
        .await
        .expect("metrics");
    let text = metrics.text().await.expect("text");
    assert!(text.contains("meridian_checks_total"), "{text}");
}

/// Issue 28, item 11: `/v1/check` took duplicate JSON keys (the last won)
/// and decided a batch holding a 65-entry descriptor instead of refusing it
/// whole, as the docs say.
#[tokio::test]
async fn http_checks_refuse_duplicate_keys_and_oversized_descriptors_whole() {
    let redis = RedisServer::start();
    let limiter = LimiterProcess::start(RULES, &["--redis", &redis.url()]);
    let http = common::http_client().build().expect("HTTP client");
    let url = limiter.http_url("/v1/check");
    let entries: Vec<String> = (0..65)
        .map(|i| format!(r#"{{"key": "k{i}", "value": "v"}}"#))
        .collect();
    let wide = format!(
        r#"{{"domain": "api", "descriptor": [{}]}}"#,
        entries.join(",")
    );
    let fine = r#"{"domain": "api", "descriptor": [{"key": "customer", "value": "z"}]}"#;
    for (bad, needle) in [
        (
            r#"{"domain": "api", "rule": "per_customer", "key": "a", "key": "b"}"#.to_string(),
            "duplicate field `key`",
        ),
        (
            r#"{"domain": "api", "descriptor": [{"key": "customer", "key": "x", "value": "z"}]}"#
                .to_string(),
            "duplicate field `key`",
        ),
        (wide.clone(), "at most 64"),
        (format!(r#"{{"checks": [{fine}, {wide}]}}"#), "at most 64"),
    ] {
        let r = http
            .post(&url)
            .header("content-type", "application/json")
            .body(bad.clone())
            .send()
            .await
            .expect("POST");
        let status = r.status();
        let e: serde_json::Value = r.json().await.expect("json");
        assert_eq!(status, 400, "{bad}: {e}");
        let msg = e["error"].as_str().unwrap_or_default();
        assert!(msg.contains(needle), "{bad}: {msg}");
    }
}

/// 100 checks an hour on `burst`.
const BURST_100: &str = "domain: api\ndescriptors:\n  - key: burst\n    rate_limit:\n      unit: hour\n      requests_per_unit: 100\n";

/// Sends `n` checks of `burst=k` at once, spread over `clients` (one
/// connection each); how many were allowed.
async fn admitted_at_once(clients: &[RateLimitServiceClient<Channel>], n: usize) -> usize {
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let mut client = clients[i % clients.len()].clone();
            tokio::spawn(async move {
                ask(&mut client, vec![descriptor(&[("burst", "k")])], 0)
                    .await
                    .overall_code
                    == Code::Ok as i32
            })
        })
        .collect();
    let mut ok = 0;
    for t in tasks {
        ok += usize::from(t.await.expect("task"));
    }
    ok
}

/// Redis clients other than `conn` itself (the one running CLIENT LIST).
fn other_redis_clients(conn: &mut redis::Connection) -> usize {
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query(conn)
        .expect("CLIENT LIST");
    list.lines().filter(|l| !l.contains("cmd=client")).count()
}

fn set_max_clients(conn: &mut redis::Connection, n: u32) {
    redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxclients")
        .arg(n)
        .query::<()>(conn)
        .expect("CONFIG SET maxclients");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_hundred_concurrent_requests_admit_exactly_one_hundred() {
    let redis = RedisServer::start();
    // A generous deadline: this test is about atomicity, not about fail modes
    // (on a loaded machine 200 requests at once can exceed the 20 ms default).
    let limiter = LimiterProcess::start(
        BURST_100,
        &["--redis", &redis.url(), "--redis-deadline", "5s"],
    );
    let client = rls_client(&limiter).await;
    assert_eq!(admitted_at_once(&[client], 200).await, 100);
}

/// Connections land on different workers (each its own event loop and Redis
/// connection); a limit is still one count across all of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn workers_keep_one_count_across_connections() {
    let redis = RedisServer::start();
    let limiter = LimiterProcess::start(
        BURST_100,
        &[
            "--redis",
            &redis.url(),
            "--redis-deadline",
            "5s",
            "--threads",
            "3",
        ],
    );
    // One client per connection: tonic's channels each dial their own.
    let mut clients = Vec::new();
    for _ in 0..6 {
        clients.push(rls_client(&limiter).await);
    }
    assert_eq!(admitted_at_once(&clients, 240).await, 100);

    // Every worker opened its own Redis connection beside the shared one.
    let limiter_connections = other_redis_clients(&mut redis.connection());
    assert!(
        limiter_connections >= 4,
        "expected the shared connection and 3 worker lanes, Redis sees {limiter_connections}"
    );

    // HTTP connections are handed to workers too (a new client, a new connection).
    for _ in 0..3 {
        let health = common::http_client()
            .build()
            .expect("HTTP client")
            .get(limiter.http_url("/healthz"))
            .send()
            .await
            .expect("healthz");
        assert_eq!(health.status(), 200);
    }
}

#[tokio::test]
async fn envoy_style_config_behaves_as_envoys_service() {
    let redis = RedisServer::start();
    let rules = r#"
domain: shop
descriptors:
  - key: remote_address
    rate_limit:
      unit: second
      requests_per_unit: 2
  - key: path
    value: /api/*
    rate_limit:
      unit: minute
      requests_per_unit: 1
  - key: tier
    value: free
    descriptors:
      - key: user
        shadow_mode: true
        rate_limit:
          unit: hour
          requests_per_unit: 1
  - key: plan
    rate_limit:
      name: plan_default
      unit: hour
      requests_per_unit: 5
  - key: vip
    rate_limit:
      name: vip
      replaces:
        - name: plan_default
      unit: hour
      requests_per_unit: 100
"#;
    let limiter = LimiterProcess::start(rules, &["--redis", &redis.url()]);
    let mut client = rls_client(&limiter).await;
    common::clear_of_window_boundary(Duration::from_secs(60), Duration::from_secs(15)).await;
    let shop = |d: Vec<RateLimitDescriptor>| {
        let mut client = client.clone();
        async move {
            client
                .should_rate_limit(RateLimitRequest {
                    domain: "shop".into(),
                    descriptors: d,
                    hits_addend: 0,
                })
                .await
                .expect("rls")
                .into_inner()
        }
    };
    // Glob value: /api/* matches both paths; as in Envoy's service each value
    // counts apart, so the second hit on the same path is over.
    let r = shop(vec![descriptor(&[("path", "/api/orders")])]).await;
    assert_eq!(
        r.statuses[0]
            .current_limit
            .as_ref()
            .map(|l| l.requests_per_unit),
        Some(1)
    );
    let r = shop(vec![descriptor(&[("path", "/api/users")])]).await;
    assert_eq!(r.overall_code, Code::Ok as i32);
    let r = shop(vec![descriptor(&[("path", "/api/orders")])]).await;
    assert_eq!(r.overall_code, Code::OverLimit as i32);
    let r = shop(vec![descriptor(&[("path", "/web/orders")])]).await;
    assert!(
        r.statuses[0].current_limit.is_none(),
        "no glob match: {r:?}"
    );
    // Nested path with shadow mode: over the limit, but allowed.
    for _ in 0..3 {
        let r = shop(vec![descriptor(&[("tier", "free"), ("user", "u1")])]).await;
        assert_eq!(r.overall_code, Code::Ok as i32);
    }
    // Replaces: with vip matched too, plan_default is not applied.
    for _ in 0..7 {
        let r = shop(vec![
            descriptor(&[("plan", "p")]),
            descriptor(&[("vip", "v")]),
        ])
        .await;
        assert_eq!(r.overall_code, Code::Ok as i32);
        assert!(
            r.statuses[0].current_limit.is_none(),
            "replaced rule reported: {r:?}"
        );
    }
    // Other domain entirely: nothing applies.
    let r = client
        .should_rate_limit(RateLimitRequest {
            domain: "elsewhere".into(),
            descriptors: vec![descriptor(&[("remote_address", "1.2.3.4")])],
            hits_addend: 0,
        })
        .await
        .expect("rls")
        .into_inner();
    assert_eq!(r.overall_code, Code::Ok as i32);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_mid_load_each_fail_mode_decides_then_recovers() {
    let mut redis = RedisServer::start();
    let rules = r#"
domain: api
descriptors:
  - key: open
    fail_mode: open
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: closed
    fail_mode: closed
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: local
    fail_mode: local
    rate_limit: {unit: hour, requests_per_unit: 10}
"#;
    let mut limiter =
        LimiterProcess::start(rules, &["--redis", &redis.url(), "--pods-in-region", "2"]);
    let mut client = rls_client(&limiter).await;
    let ok = |r: &RateLimitResponse| r.overall_code == Code::Ok as i32;
    assert!(ok(
        &ask(&mut client, vec![descriptor(&[("open", "k")])], 0).await
    ));

    redis.kill();
    let mut admitted = std::collections::HashMap::new();
    for mode in ["open", "closed", "local"] {
        for _ in 0..20 {
            let r = ask(&mut client, vec![descriptor(&[(mode, "k")])], 0).await;
            *admitted.entry(mode).or_insert(0) += usize::from(ok(&r));
        }
    }
    assert_eq!(admitted["open"], 20, "open allows everything");
    assert_eq!(admitted["closed"], 0, "closed denies everything");
    assert_eq!(admitted["local"], 5, "local enforces 10 / 2 pods");
    assert!(limiter.is_running());

    redis.restart();
    // Back on Redis (fresh, empty): closed rules admit again, up to the limit.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let r = ask(&mut client, vec![descriptor(&[("closed", "k2")])], 0).await;
        if ok(&r) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "limiter did not recover after Redis came back"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut closed_ok = 1;
    for _ in 0..15 {
        closed_ok += usize::from(ok(&ask(
            &mut client,
            vec![descriptor(&[("closed", "k2")])],
            0,
        )
        .await));
    }
    assert_eq!(closed_ok, 10, "Redis enforces the full limit again");
}

#[tokio::test]
async fn malformed_requests_get_clear_errors_and_the_server_keeps_serving() {
    let redis = RedisServer::start();
    let limiter = LimiterProcess::start(RULES, &["--redis", &redis.url()]);
    let mut client = rls_client(&limiter).await;
    let call = |domain: &str, descriptors: Vec<RateLimitDescriptor>| {
        let mut client = client.clone();
        let domain = domain.to_string();
        async move {
            client
                .should_rate_limit(RateLimitRequest {
                    domain,
                    descriptors,
                    hits_addend: 0,
                })
                .await
        }
    };
    let e = call("", vec![descriptor(&[("customer", "a")])])
        .await
        .expect_err("empty domain");
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(e.message().contains("domain"), "{}", e.message());
    let many = vec![descriptor(&[("customer", "a")]); 10_000];
    let e = call("api", many).await.expect_err("10,000 descriptors");
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(e.message().contains("descriptors"), "{}", e.message());
    // An over-long key is its descriptor's problem alone: refused (OVER_LIMIT),
    // the request still answered (tests/integration/hostile_requests.rs covers the rest).
    let huge = "k".repeat(1 << 20);
    let r = call("api", vec![descriptor(&[("customer", &huge)])])
        .await
        .expect("a 1 MB key is answered")
        .into_inner();
    assert_eq!(r.statuses[0].code, Code::OverLimit as i32);

    // Bytes that are not protobuf at all, in a valid gRPC frame: the caller's
    // fault, not the server's.
    let e = raw_grpc_call(&limiter, b"\xff\xff\xff\xff not protobuf")
        .await
        .expect_err("not protobuf");
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    assert!(
        e.message().contains("malformed protobuf"),
        "{}",
        e.message()
    );

    // Still serving.
    let r = ask(&mut client, vec![descriptor(&[("customer", "fine")])], 0).await;
    assert_eq!(r.overall_code, Code::Ok as i32);
}

/// Sends `body` as the request message of ShouldRateLimit without encoding it.
async fn raw_grpc_call(limiter: &LimiterProcess, body: &'static [u8]) -> Result<(), tonic::Status> {
    use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
    #[derive(Default)]
    struct Raw;
    struct RawEnc;
    struct RawDec;
    impl Encoder for RawEnc {
        type Item = &'static [u8];
        type Error = tonic::Status;
        fn encode(&mut self, item: Self::Item, dst: &mut EncodeBuf<'_>) -> Result<(), Self::Error> {
            use bytes::BufMut;
            dst.put_slice(item);
            Ok(())
        }
    }
    impl Decoder for RawDec {
        type Item = ();
        type Error = tonic::Status;
        fn decode(&mut self, _src: &mut DecodeBuf<'_>) -> Result<Option<Self::Item>, Self::Error> {
            Ok(Some(()))
        }
    }
    impl Codec for Raw {
        type Encode = &'static [u8];
        type Decode = ();
        type Encoder = RawEnc;
        type Decoder = RawDec;
        fn encoder(&mut self) -> Self::Encoder {
            RawEnc
        }
        fn decoder(&mut self) -> Self::Decoder {
            RawDec
        }
    }
    let channel = Channel::from_shared(limiter.grpc_url())
        .expect("url")
        .connect()
        .await
        .expect("connect");
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready()
        .await
        .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    let path = tonic::codegen::http::uri::PathAndQuery::from_static(
        "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
    );
    grpc.unary(tonic::Request::new(body), path, Raw)
        .await
        .map(|_| ())
}

#[tokio::test]
async fn rule_edits_apply_and_broken_edits_keep_the_last_good_rules() {
    let redis = RedisServer::start();
    let v1 = "domain: api\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1}\n";
    let limiter = LimiterProcess::start(v1, &["--redis", &redis.url()]);
    let mut client = rls_client(&limiter).await;
    let shared = client.clone();
    let hits = |n: usize, key: &'static str| {
        let mut client = shared.clone();
        async move {
            let mut ok = 0;
            for _ in 0..n {
                ok += usize::from(
                    ask(&mut client, vec![descriptor(&[("k", key)])], 0)
                        .await
                        .overall_code
                        == Code::Ok as i32,
                );
            }
            ok
        }
    };
    assert_eq!(hits(3, "a").await, 1);

    let v2 = v1.replace("requests_per_unit: 1}", "requests_per_unit: 5}");
    std::fs::write(limiter.rules_path(), v2).expect("edit");
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while ask(&mut client, vec![descriptor(&[("k", "probe")])], 0)
        .await
        .statuses[0]
        .current_limit
        .as_ref()
        .is_none_or(|l| l.requests_per_unit != 5)
    {
        assert!(std::time::Instant::now() < deadline, "edit not applied");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(hits(7, "b").await, 5);

    std::fs::write(limiter.rules_path(), "domain: api\ndescriptors: [ {key: }").expect("break");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(hits(7, "c").await, 5, "the last good rules stay in force");
}

#[tokio::test]
async fn sigterm_drains_and_exits_zero() {
    let redis = RedisServer::start();
    let mut limiter = LimiterProcess::start(
        RULES,
        &["--redis", &redis.url(), "--drain-timeout", "500ms"],
    );
    let client = Arc::new(tokio::sync::Mutex::new(rls_client(&limiter).await));
    let _ = ask(
        &mut *client.lock().await,
        vec![descriptor(&[("customer", "a")])],
        0,
    )
    .await;
    // The client keeps its connection open, as gateways do: the limiter must
    // still exit, cleanly, once the drain timeout has passed.
    let started = std::time::Instant::now();
    let status = limiter.terminate();
    assert!(status.success(), "{status:?}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    drop(client);
}

/// While it drains, the limiter refuses new connections (its listeners are
/// closed; a load balancer sends them to another pod at once) and finishes
/// the request it has in flight.
#[tokio::test]
async fn draining_refuses_new_connections_and_finishes_in_flight_requests() {
    let redis = RedisServer::start();
    let mut limiter = LimiterProcess::start(
        RULES,
        &[
            "--redis",
            &redis.url(),
            "--redis-deadline",
            "10s",
            "--drain-timeout",
            "10s",
        ],
    );
    let mut client = rls_client(&limiter).await;
    let _ = ask(&mut client, vec![descriptor(&[("customer", "a")])], 0).await;
    // A request held in flight: Redis is stopped until the end of the test.
    redis.pause();
    let in_flight =
        tokio::spawn(
            async move { ask(&mut client, vec![descriptor(&[("customer", "b")])], 0).await },
        );
    tokio::time::sleep(Duration::from_millis(200)).await;
    let sent = std::process::Command::new("kill")
        .args(["-TERM", &limiter.pid().to_string()])
        .status()
        .expect("kill -TERM");
    assert!(sent.success());
    let deadline = std::time::Instant::now() + Duration::from_secs(3);
    loop {
        match tokio::net::TcpStream::connect(limiter.grpc).await {
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => break,
            _ if std::time::Instant::now() > deadline => {
                panic!("new gRPC connections still accepted 3 s after SIGTERM")
            }
            _ => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
    assert!(
        limiter.is_running(),
        "the limiter exited with a request in flight"
    );
    redis.resume();
    let answer = in_flight.await.expect("in-flight request");
    assert_eq!(answer.overall_code, Code::Ok as i32);
    let status = limiter.terminate();
    assert!(status.success(), "{status:?}");
}

/// A worker that cannot open its own Redis connection at start serves through
/// the shared one meanwhile, and opens its lane once Redis lets it.
#[tokio::test]
async fn a_worker_opens_its_redis_lane_once_redis_lets_it() {
    let redis = RedisServer::start();
    let mut admin = redis.connection();
    // Room for this connection and the limiter's shared one, no more.
    set_max_clients(&mut admin, 2);
    let limiter = LimiterProcess::start(BURST_100, &["--redis", &redis.url(), "--threads", "2"]);
    let mut client = rls_client(&limiter).await;
    for _ in 0..3 {
        let answer = ask(&mut client, vec![descriptor(&[("burst", "k")])], 0).await;
        assert_eq!(answer.overall_code, Code::Ok as i32);
    }
    assert_eq!(
        other_redis_clients(&mut admin),
        1,
        "lanes opened past maxclients"
    );

    set_max_clients(&mut admin, 100);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while other_redis_clients(&mut admin) < 3 {
        assert!(
            std::time::Instant::now() < deadline,
            "the workers' lanes did not open within 10 s of Redis taking clients"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let answer = ask(&mut client, vec![descriptor(&[("burst", "k")])], 0).await;
    assert_eq!(answer.overall_code, Code::Ok as i32);
}

#[tokio::test]
async fn a_deeply_nested_edit_is_rejected_and_the_last_good_rules_stay() {
    let redis = RedisServer::start();
    let rules = "domain: api\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 2}\n";
    let mut limiter = LimiterProcess::start_logging(rules, &["--redis", &redis.url()]);
    let mut client = rls_client(&limiter).await;
    for (n, (style, text)) in common::deeply_nested_rules().into_iter().enumerate() {
        std::fs::write(limiter.rules_path(), &text).expect("edit");
        // The reload counter proves the edit was read, not merely not polled
        // yet. 15 s: on a loaded 2-core machine 5 s was seen to pass first.
        let deadline = std::time::Instant::now() + Duration::from_secs(15);
        while rejected_reloads(&limiter).await < n + 1 {
            assert!(limiter.is_running(), "{style}: the limiter died");
            assert!(
                std::time::Instant::now() < deadline,
                "{style}: edit not read"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(limiter.is_running(), "{style}: the limiter died");
        let key = format!("key-{n}");
        let mut codes = Vec::new();
        for _ in 0..3 {
            let r = ask(&mut client, vec![descriptor(&[("k", &key)])], 0).await;
            codes.push(r.overall_code == Code::Ok as i32);
        }
        assert_eq!(
            codes,
            [true, true, false],
            "{style}: the last good limit of 2 holds"
        );
    }
    let (_, logs) = limiter.terminate_reading_logs();
    assert!(logs.contains("at most 64"), "the log says why: {logs}");
}

/// `meridian_rule_reloads_total{result="rejected"}` from the limiter's /metrics.
async fn rejected_reloads(limiter: &LimiterProcess) -> usize {
    let Ok(r) = common::http_get(limiter.http_url("/metrics")).await else {
        return 0;
    };
    let text = r.text().await.unwrap_or_default();
    text.lines()
        .find(|l| {
            l.starts_with("meridian_rule_reloads_total{") && l.contains("result=\"rejected\"}")
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok())
        .map_or(0, |v| v as usize)
}
