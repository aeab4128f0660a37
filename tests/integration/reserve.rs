//! Cost quotas that settle later (issue 31), in one region, on a real
//! redis-server: reserve → commit / release over HTTP and gRPC against a
//! real `meridian limiter` process and through the library; excess charged
//! up to `max_overdraft`; bad input refused naming the field; a limiter
//! killed with open reservations leaves each settled at its estimate.

use crate::common;

use std::time::Duration;

use common::limiter::LimiterProcess;
use common::{RedisServer, clear_of_window_boundary};
use meridian::Limiter;
use meridian::proto::meridian::v1 as native;
use meridian::proto::meridian::v1::limiter_client::LimiterClient;
use meridian::store::{RedisConfig, RedisStore};
use serde_json::{Value, json};

/// A budget of 10,000 tokens an hour per customer (fixed window: what a
/// window counts is exact to read back), at most 2,000 of debt past it.
const RULES: &str = r#"
domain: llm
descriptors:
  - key: customer
    period: 1h
    max_cost: 50000
    max_overdraft: 2000
    rate_limit:
      name: tokens
      unit: hour
      requests_per_unit: 10000
"#;

const HOUR: Duration = Duration::from_secs(3600);

fn reserve_body(customer: &str, estimate: u64, ttl_ms: u64) -> Value {
    json!({"domain": "llm", "rule": "tokens", "key": customer, "estimate": estimate, "ttl_ms": ttl_ms})
}

/// Remaining of `customer`'s budget, by a check-only check.
async fn remaining(client: &reqwest::Client, limiter: &LimiterProcess, customer: &str) -> u64 {
    let (_, d) = limiter
        .post_json(
            client,
            "/v1/check",
            json!({"domain": "llm", "rule": "tokens", "key": customer, "check_only": true}),
        )
        .await;
    d["remaining"].as_u64().expect("remaining")
}

/// 200 concurrent reservations of `estimate`, answering the admitted ids.
async fn reserve_concurrently(
    client: &reqwest::Client,
    limiter: &LimiterProcess,
    customer: &str,
    estimate: u64,
) -> Vec<String> {
    let calls = (0..200).map(|_| {
        limiter.post_json(
            client,
            "/v1/reserve",
            reserve_body(customer, estimate, 600_000),
        )
    });
    let mut ids = Vec::new();
    for (status, body) in futures::future::join_all(calls).await {
        match status {
            200 => ids.push(body["id"].as_str().expect("an id").to_owned()),
            429 => assert_eq!(body["admitted"], false, "{body}"),
            other => panic!("{other}: {body}"),
        }
    }
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn budget_of_10000_admits_100_reservations_of_100_then_150_of_40_after_commits_over_http() {
    common::require_redis();
    let redis = RedisServer::start();
    // The budget's arithmetic is under test, not the latency: 200 calls at
    // once on a loaded 2-core box can keep one past the 20 ms default
    // deadline, and its 503 (fail closed) is not what this test counts.
    let limiter =
        LimiterProcess::start(RULES, &["--redis", &redis.url(), "--redis-deadline", "2s"]);
    let client = common::http_client().build().expect("client");
    clear_of_window_boundary(HOUR, Duration::from_secs(60)).await;

    let ids = reserve_concurrently(&client, &limiter, "42", 100).await;
    assert_eq!(ids.len(), 100);
    let commits = ids
        .iter()
        .map(|id| limiter.post_json(&client, "/v1/commit", json!({"id": id, "actual": 40})));
    let mut refunded = 0;
    for (status, body) in futures::future::join_all(commits).await {
        assert_eq!(status, 200, "{body}");
        refunded += body["refunded"].as_u64().expect("refunded");
    }
    assert_eq!(refunded, 6_000);
    assert_eq!(remaining(&client, &limiter, "42").await, 6_000);
    let more = reserve_concurrently(&client, &limiter, "42", 40).await;
    assert_eq!(more.len(), 150);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn budget_of_10000_through_the_library_on_redis() {
    common::require_redis();
    let redis = RedisServer::start();
    let store = RedisStore::connect(&RedisConfig::new(redis.url()))
        .await
        .expect("redis");
    let limiter = std::sync::Arc::new(Limiter::from_yaml(RULES, store).expect("rules"));
    clear_of_window_boundary(HOUR, Duration::from_secs(60)).await;
    let ttl = Duration::from_secs(600);
    let reserve = |estimate| {
        let limiter = limiter.clone();
        tokio::spawn(async move {
            limiter
                .reserve_rule("llm", "tokens", "7", estimate, ttl)
                .await
                .expect("reserve")
        })
    };
    let answers = futures::future::join_all((0..200).map(|_| reserve(100))).await;
    let ids: Vec<String> = answers
        .into_iter()
        .map(|a| a.expect("task"))
        .filter(|a| a.admitted)
        .map(|a| a.id)
        .collect();
    assert_eq!(ids.len(), 100);
    assert_eq!(
        limiter
            .outstanding("llm", "tokens", "7")
            .await
            .expect("sum"),
        10_000
    );
    let mut refunded = 0;
    for id in &ids {
        refunded += limiter
            .commit(id, 40)
            .await
            .expect("commit")
            .first()
            .refunded;
    }
    assert_eq!(refunded, 6_000);
    assert_eq!(
        limiter
            .outstanding("llm", "tokens", "7")
            .await
            .expect("sum"),
        0
    );
    let answers = futures::future::join_all((0..200).map(|_| reserve(40))).await;
    let admitted = answers
        .into_iter()
        .filter(|a| a.as_ref().expect("task").admitted)
        .count();
    assert_eq!(admitted, 150);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn excess_is_charged_up_to_max_overdraft_and_bad_inputs_are_refused_naming_the_field() {
    common::require_redis();
    let redis = RedisServer::start();
    let limiter = LimiterProcess::start(RULES, &["--redis", &redis.url()]);
    let client = common::http_client().build().expect("client");
    clear_of_window_boundary(HOUR, Duration::from_secs(60)).await;

    let (status, r) = limiter
        .post_json(&client, "/v1/reserve", reserve_body("9", 9_000, 60_000))
        .await;
    assert_eq!(status, 200, "{r}");
    let id = r["id"].as_str().expect("id").to_owned();
    // Over max_cost: refused, the reservation stays open.
    let (status, e) = limiter
        .post_json(&client, "/v1/commit", json!({"id": id, "actual": 50_001}))
        .await;
    assert_eq!((status, e["field"].as_str()), (400, Some("actual")), "{e}");
    // 5,000 past the estimate: 1,000 up to the limit, 2,000 of debt, 2,000 not charged.
    let (status, s) = limiter
        .post_json(&client, "/v1/commit", json!({"id": id, "actual": 14_000}))
        .await;
    assert_eq!(status, 200, "{s}");
    assert_eq!(
        (s["charged"].as_u64(), s["uncharged"].as_u64()),
        (Some(3_000), Some(2_000)),
        "{s}"
    );
    // The debt denies even a cost of 1 until the window ends.
    let (status, _) = limiter
        .post_json(&client, "/v1/reserve", reserve_body("9", 1, 60_000))
        .await;
    assert_eq!(status, 429);
    // The same commit again changes nothing; a release now is refused.
    let (status, again) = limiter
        .post_json(&client, "/v1/commit", json!({"id": id, "actual": 14_000}))
        .await;
    assert_eq!(
        (status, again["replayed"].as_bool()),
        (200, Some(true)),
        "{again}"
    );
    assert_eq!(again["charged"], s["charged"]);
    let (status, e) = limiter
        .post_json(&client, "/v1/release", json!({"id": id}))
        .await;
    assert_eq!(status, 409, "{e}");

    // Bad numbers, each refused naming its field.
    for (body, field) in [
        (
            json!({"domain": "llm", "rule": "tokens", "key": "1", "estimate": 0, "ttl_ms": 1000}),
            "estimate",
        ),
        (
            json!({"domain": "llm", "rule": "tokens", "key": "1", "estimate": -1, "ttl_ms": 1000}),
            "estimate",
        ),
        (
            json!({"domain": "llm", "rule": "tokens", "key": "1", "estimate": "5", "ttl_ms": 1000}),
            "estimate",
        ),
        (
            json!({"domain": "llm", "rule": "tokens", "key": "1", "estimate": 1.5, "ttl_ms": 1000}),
            "estimate",
        ),
        (
            json!({"domain": "llm", "rule": "tokens", "key": "1", "estimate": 60_000, "ttl_ms": 1000}),
            "estimate",
        ),
        (
            json!({"domain": "llm", "rule": "tokens", "key": "1", "estimate": 5}),
            "ttl_ms",
        ),
        (
            json!({"domain": "llm", "rule": "tokens", "key": "1", "estimate": 5, "ttl_ms": 7_200_000}),
            "ttl_ms",
        ),
    ] {
        let (status, e) = limiter
            .post_json(&client, "/v1/reserve", body.clone())
            .await;
        assert_eq!(
            (status, e["field"].as_str()),
            (400, Some(field)),
            "{body}: {e}"
        );
    }
    // Texts serde_json would not turn into a u64 field on its own.
    for text in [
        r#"{"domain":"llm","rule":"tokens","key":"1","estimate":1e400,"ttl_ms":1000}"#,
        r#"{"domain":"llm","rule":"tokens","key":"1","estimate":18446744073709551616,"ttl_ms":1000}"#,
        r#"{"domain":"llm","rule":"tokens","key":"1","estimate":5,"ttl_ms":-0}"#,
    ] {
        let response = client
            .post(limiter.http_url("/v1/reserve"))
            .header("content-type", "application/json")
            .body(text)
            .send()
            .await
            .expect("answer");
        assert_eq!(response.status().as_u16(), 400, "{text}");
        let e: Value = response.json().await.expect("json");
        assert!(
            ["estimate", "ttl_ms"].contains(&e["field"].as_str().unwrap_or("")),
            "{text}: {e}"
        );
    }
    for id in ["", "r1.AAAA", "not-an-id"] {
        let (status, e) = limiter
            .post_json(&client, "/v1/commit", json!({"id": id, "actual": 1}))
            .await;
        assert_eq!(
            (status, e["field"].as_str()),
            (400, Some("id")),
            "{id}: {e}"
        );
    }
    // A well-formed id whose nonce was never reserved: unknown, nothing charged.
    let (_, fresh) = limiter
        .post_json(&client, "/v1/reserve", reserve_body("8", 10, 60_000))
        .await;
    let real = fresh["id"].as_str().expect("id");
    let mut forged = real.to_owned();
    let last = forged.pop().expect("non-empty");
    forged.push(if last == 'A' { 'Q' } else { 'A' });
    let (status, e) = limiter
        .post_json(&client, "/v1/commit", json!({"id": forged, "actual": 0}))
        .await;
    assert!(status == 404 || status == 400, "{status}: {e}");
    assert_eq!(remaining(&client, &limiter, "8").await, 9_990);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reserve_and_commit_over_grpc() {
    common::require_redis();
    let redis = RedisServer::start();
    let limiter = LimiterProcess::start(RULES, &["--redis", &redis.url()]);
    clear_of_window_boundary(HOUR, Duration::from_secs(60)).await;
    let mut client = LimiterClient::connect(limiter.grpc_url())
        .await
        .expect("grpc");
    let reserved = client
        .reserve(native::ReserveRequest {
            domain: "llm".into(),
            rule: "tokens".into(),
            key: "g".into(),
            estimate: 500,
            ttl_ms: 60_000,
            ..Default::default()
        })
        .await
        .expect("reserve")
        .into_inner();
    assert!(reserved.admitted);
    assert_eq!(reserved.limits[0].remaining, 9_500);
    let settled = client
        .commit(native::CommitRequest {
            id: reserved.id.clone(),
            actual: 120,
        })
        .await
        .expect("commit")
        .into_inner();
    assert_eq!(
        (settled.refunded, settled.limits[0].remaining),
        (380, 9_880)
    );
    let e = client
        .release(native::ReleaseRequest { id: reserved.id })
        .await
        .expect_err("settled already");
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e}");
    let e = client
        .reserve(native::ReserveRequest {
            domain: "llm".into(),
            rule: "tokens".into(),
            key: "g".into(),
            estimate: 0,
            ttl_ms: 60_000,
            ..Default::default()
        })
        .await
        .expect_err("zero estimate");
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(e.message().contains("estimate"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_with_50_open_reservations_leaves_each_settled_at_its_estimate() {
    common::require_redis();
    let redis = RedisServer::start();
    let mut limiter = LimiterProcess::start(RULES, &["--redis", &redis.url()]);
    let client = common::http_client().build().expect("client");
    clear_of_window_boundary(HOUR, Duration::from_secs(120)).await;

    // One committed before the kill (at 30 of 100) and 50 left open, ttl 2 s.
    let (_, done) = limiter
        .post_json(&client, "/v1/reserve", reserve_body("k", 100, 2_000))
        .await;
    let done = done["id"].as_str().expect("id").to_owned();
    let (status, _) = limiter
        .post_json(&client, "/v1/commit", json!({"id": done, "actual": 30}))
        .await;
    assert_eq!(status, 200);
    let mut open = Vec::new();
    for _ in 0..50 {
        let (status, r) = limiter
            .post_json(&client, "/v1/reserve", reserve_body("k", 100, 2_000))
            .await;
        assert_eq!(status, 200, "{r}");
        open.push(r["id"].as_str().expect("id").to_owned());
    }
    limiter.kill();

    // Past the ttl, with a new limiter on the same Redis.
    tokio::time::sleep(Duration::from_millis(2_100)).await;
    let limiter = LimiterProcess::start(RULES, &["--redis", &redis.url()]);
    // Exactly 50 × 100 + 30 charged: nothing refunded, nothing twice.
    assert_eq!(remaining(&client, &limiter, "k").await, 10_000 - 5_000 - 30);
    // The commit made before the kill, retried: a no-op answering the same.
    let (status, again) = limiter
        .post_json(&client, "/v1/commit", json!({"id": done, "actual": 30}))
        .await;
    assert_eq!(
        (status, again["replayed"].as_bool()),
        (200, Some(true)),
        "{again}"
    );
    assert_eq!(again["refunded"].as_u64(), Some(70));
    // An expired one: a clear error, and still nothing refunded.
    let (status, e) = limiter
        .post_json(&client, "/v1/commit", json!({"id": open[0], "actual": 1}))
        .await;
    assert_eq!(status, 410, "{e}");
    assert!(e["error"].as_str().unwrap_or("").contains("expired"), "{e}");
    assert_eq!(remaining(&client, &limiter, "k").await, 10_000 - 5_000 - 30);
}
