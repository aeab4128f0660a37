//! Redis under `maxmemory` with `volatile-ttl`: a flood of new keys fills it,
//! Redis evicts counters (every Meridian key has a TTL, so one is always
//! evictable), and the limiter keeps deciding from Redis — no errors, no
//! fail-mode answers. What degrades is the count of an evicted key: it
//! starts again from zero, so that key may be admitted up to its limit once
//! more in the same window. Redis counts those in `evicted_keys`.

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
    let redis = RedisServer::start_with(&[
        "--maxmemory",
        MAXMEMORY,
        "--maxmemory-policy",
        "volatile-ttl",
    ]);
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
        "maxmemory {MAXMEMORY} volatile-ttl: {from_redis} of {USERS} first hits decided by Redis, \
         {evicted} keys evicted, used_memory {used} of {max}, store errors {store_errors:?}"
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
