//! Redis under `maxmemory` with the eviction policy the deploy files ship
//! (`deploy/k8s/base/region/redis.conf`, read by
//! `common::shipped_redis_policy`). A flood of new keys fills it, Redis
//! evicts counters (every Meridian key has a TTL, so one is always
//! evictable), and the limiter keeps deciding from Redis — no errors, no
//! fail-mode answers. What degrades is the count of an evicted key: it
//! starts again from zero, so that key may be admitted up to its limit once
//! more in the same window. Redis counts those in `evicted_keys`. Which keys
//! go is the policy's choice: the least checked first, so a flood of
//! never-repeated keys (one check each) evicts its own kind and a counter at
//! its limit keeps denying (issue 28, item 3).

use std::time::Duration;

use crate::common;

use common::RedisServer;
use common::limiter::LimiterProcess;

use serde_json::{Value, json};

/// Redis 7 uses about 1 MB empty: this leaves room for a few thousand
/// counters, and the flood below needs several times that.
const MAXMEMORY: &str = "2mb";
const USERS: usize = 24_000;
const BATCH: usize = 50;
/// Users checked a second time after the flood.
const SAMPLE: usize = 50;

/// fail_mode: closed, so any store failure would show as a denial.
const RULES: &str = "domain: api\ndescriptors:\n  - key: user\n    fail_mode: closed\n    rate_limit: {name: per-user, unit: hour, requests_per_unit: 5}\n";

/// A Redis of [`MAXMEMORY`] with the shipped eviction settings.
fn full_redis() -> RedisServer {
    let mut args = vec!["--maxmemory".to_string(), MAXMEMORY.to_string()];
    args.extend(common::shipped_redis_policy());
    RedisServer::start_with(&args.iter().map(String::as_str).collect::<Vec<_>>())
}

fn info_field(redis: &RedisServer, section: &str, name: &str) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg(section)
        .query(&mut redis.connection())
        .expect("INFO");
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}:")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in INFO {section}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_redis_evicts_counters_and_the_limiter_keeps_deciding() {
    let redis = full_redis();
    // A deadline well above eviction's cost even on a loaded machine: this
    // test is about a full Redis, not a slow one (timeouts have fail modes).
    let limiter = LimiterProcess::start(
        RULES,
        &["--redis", &redis.url(), "--redis-deadline", "500ms"],
    );
    let client = common::http_client().build().expect("HTTP client");
    let mut from_redis = 0;
    let mut other: Vec<String> = Vec::new();
    for start in (0..USERS).step_by(BATCH) {
        let checks: Vec<Value> = (start..start + BATCH)
            .map(|i| json!({"domain": "api", "descriptor": [{"key": "user", "value": format!("flood-{i}")}]}))
            .collect();
        let response = client
            .post(limiter.http_url("/v1/check"))
            .json(&json!({ "checks": checks }))
            .send()
            .await
            .expect("the limiter answers");
        let body: Value = response.json().await.expect("JSON decisions");
        for d in body["decisions"].as_array().expect("decisions") {
            if d["reason"] == "" && d["allowed"] == true {
                from_redis += 1;
            } else if other.len() < 3 {
                other.push(d.to_string());
            }
        }
    }
    let evicted = info_field(&redis, "stats", "evicted_keys");
    let used = info_field(&redis, "memory", "used_memory");
    let max = info_field(&redis, "memory", "maxmemory");
    let metrics = common::http_get(limiter.http_url("/metrics"))
        .await
        .expect("GET /metrics")
        .text()
        .await
        .expect("metrics text");
    let store_errors: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("meridian_store_errors_total"))
        .collect();
    eprintln!(
        "maxmemory {MAXMEMORY} {:?}: {from_redis} of {USERS} first hits decided by Redis, \
         {evicted} keys evicted, used_memory {used} of {max}, store errors {store_errors:?}",
        common::shipped_redis_policy()
    );
    assert_eq!(
        from_redis, USERS,
        "checks not decided by Redis while it was full: {other:?}"
    );
    // The series are registered at 0 on a rule's first check; none moved.
    assert!(
        store_errors
            .iter()
            .all(|l| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()) == Some(0.0)),
        "store errors: {store_errors:?}"
    );
    assert!(
        evicted > 0,
        "the flood did not fill Redis ({used} of {max} bytes): the test proves nothing"
    );

    // Users evicted in the flood start again: the degradation, counted.
    // Eviction samples keys (maxmemory-samples), so which ones go varies.
    let again: Vec<Value> = (0..SAMPLE)
        .map(|i| json!({"domain": "api", "descriptor": [{"key": "user", "value": format!("flood-{i}")}]}))
        .collect();
    let body: Value = client
        .post(limiter.http_url("/v1/check"))
        .json(&json!({ "checks": again }))
        .send()
        .await
        .expect("the limiter answers")
        .json()
        .await
        .expect("JSON decisions");
    let decisions = body["decisions"].as_array().expect("decisions");
    assert!(
        decisions
            .iter()
            .all(|d| d["reason"] == "" && d["allowed"] == true),
        "second hits not all decided by Redis: {body}"
    );
    let restarted = decisions.iter().filter(|d| d["remaining"] == 4).count();
    eprintln!("{restarted} of the first {SAMPLE} users' counters were evicted and restarted");
    assert!(restarted > 0, "no evicted counter restarted: {body}");
}

/// The audit's flood (issue 28, item 3): a one-day rule whose values the
/// client picks, and short-window counters of every algorithm at their
/// limits. Under `volatile-ttl` the flood's day-long keys outlived the
/// hour's counters, Redis evicted those, and each victim was admitted five
/// times more in the same window.
const FLOOD_RULES: &str = "domain: api
descriptors:
  - key: api_key
    rate_limit: {unit: day, requests_per_unit: 10000}
  - key: login_fixed_window
    algorithm: fixed_window
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: login_sliding_window_counter
    algorithm: sliding_window_counter
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: login_sliding_window_log
    algorithm: sliding_window_log
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: login_token_bucket
    algorithm: token_bucket
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: login_leaky_bucket
    algorithm: leaky_bucket
    rate_limit: {unit: hour, requests_per_unit: 5}
";
/// Users brought to their limit on each login rule before the flood.
const VICTIMS: usize = 20;
/// The flood runs until Redis has evicted this many times the keys it holds:
/// every key it held at the start has been sampled for eviction many times.
const TURNOVER: u64 = 3;
/// Checks per flood request, and the most the flood may send.
const FLOOD_BATCH: usize = 500;
const FLOOD_LIMIT: usize = 400_000;

/// One check per descriptor, in one request; the decisions in order.
async fn check_all(
    client: &reqwest::Client,
    limiter: &LimiterProcess,
    descriptors: Vec<(String, String)>,
) -> Vec<Value> {
    let checks: Vec<Value> = descriptors
        .into_iter()
        .map(|(key, value)| json!({"domain": "api", "descriptor": [{"key": key, "value": value}]}))
        .collect();
    let body: Value = client
        .post(limiter.http_url("/v1/check"))
        .json(&json!({ "checks": checks }))
        .send()
        .await
        .expect("the limiter answers")
        .json()
        .await
        .expect("JSON decisions");
    body["decisions"].as_array().expect("decisions").clone()
}

fn login_checks() -> Vec<(String, String)> {
    [
        "fixed_window",
        "sliding_window_counter",
        "sliding_window_log",
        "token_bucket",
        "leaky_bucket",
    ]
    .iter()
    .flat_map(|a| (0..VICTIMS).map(move |i| (format!("login_{a}"), format!("victim-{i}"))))
    .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_counter_at_its_limit_survives_a_flood_of_never_repeated_keys() {
    let redis = full_redis();
    let limiter = LimiterProcess::start(
        FLOOD_RULES,
        &["--redis", &redis.url(), "--redis-deadline", "500ms"],
    );
    let client = common::http_client().build().expect("HTTP client");
    // The victims' counters live in one hour's window: leave the flood room.
    common::clear_of_window_boundary(Duration::from_secs(3600), Duration::from_secs(120)).await;

    // Five allowed checks each: at the limit, and never denied, so the
    // limiter's own over-limit cache knows nothing and Redis must answer.
    for round in 0..5 {
        let decisions = check_all(&client, &limiter, login_checks()).await;
        assert!(
            decisions
                .iter()
                .all(|d| d["allowed"] == true && d["reason"] == ""),
            "check {} of 5 not admitted by Redis: {decisions:?}",
            round + 1
        );
    }

    // Never-repeated keys on the day rule until Redis turned its memory
    // over TURNOVER times.
    let mut sent = 0usize;
    let mut not_from_redis = 0usize;
    let held_when_full = loop {
        let flood: Vec<(String, String)> = (sent..sent + FLOOD_BATCH)
            .map(|i| ("api_key".to_string(), format!("flood-{i}")))
            .collect();
        sent += FLOOD_BATCH;
        let decisions = check_all(&client, &limiter, flood).await;
        not_from_redis += decisions
            .iter()
            .filter(|d| !(d["allowed"] == true && d["reason"] == ""))
            .count();
        let keys: u64 = redis::cmd("DBSIZE")
            .query(&mut redis.connection())
            .expect("DBSIZE");
        if info_field(&redis, "stats", "evicted_keys") >= TURNOVER * keys {
            break keys;
        }
        assert!(
            sent < FLOOD_LIMIT,
            "{sent} new keys did not fill Redis {TURNOVER} times over ({keys} keys held): \
             the test proves nothing"
        );
    };
    let evicted = info_field(&redis, "stats", "evicted_keys");
    assert_eq!(not_from_redis, 0, "flood checks not decided by Redis");

    let decisions = check_all(&client, &limiter, login_checks()).await;
    let admitted: Vec<String> = login_checks()
        .iter()
        .zip(&decisions)
        .filter(|(_, d)| d["allowed"] == true)
        .map(|((rule, user), _)| format!("{rule}/{user}"))
        .collect();
    eprintln!(
        "{:?}: {sent} never-repeated keys, {evicted} evicted ({held_when_full} held); \
         {} of {} counters at their limit admitted again",
        common::shipped_redis_policy(),
        admitted.len(),
        decisions.len()
    );
    assert!(
        admitted.is_empty(),
        "{} of {} counters at their limit were evicted by the flood and admitted again: {:?}…",
        admitted.len(),
        decisions.len(),
        &admitted[..admitted.len().min(5)]
    );
    assert!(
        decisions.iter().all(|d| d["reason"] == "over_limit"),
        "denials not decided by Redis: {decisions:?}"
    );
}
