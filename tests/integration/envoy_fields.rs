//! envoyproxy/ratelimit's rule fields as that project documents them:
//! the repository's own conformance cases (`tests/conformance/`, run
//! through `meridian rules check|explain` as the shared corpus is), and the
//! behaviour behind them on a real limiter and Redis: `requests_per_unit: 0`
//! bans, `share_threshold` shares one counter, per-value metrics with their
//! cap under a flood of values, and duplicate names.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::RedisServer;
use common::limiter::LimiterProcess;
use meridian::proto::envoy::extensions::common::ratelimit::v3::{
    RateLimitDescriptor, rate_limit_descriptor::Entry,
};
use meridian::proto::envoy::service::ratelimit::v3::rate_limit_response::Code;
use meridian::proto::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use meridian::proto::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use meridian::proto::meridian::v1::limiter_client::LimiterClient;
use meridian::proto::meridian::v1::{Check, CheckRequest, Entry as NativeEntry};
use serde_json::Value;
use tonic::transport::Channel;

fn corpus() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/conformance")
}

fn config(name: &str) -> String {
    std::fs::read_to_string(corpus().join("configs").join(name)).expect("read a corpus config")
}

/// What `explain --json` says, in the corpus's notation.
fn outcome(d: &Value) -> String {
    if !d["matched"].as_bool().unwrap_or(false) {
        return "none".into();
    }
    if d["unlimited"].as_bool().unwrap_or(false) {
        return "unlimited".into();
    }
    let mut s = format!(
        "{}/{}",
        d["requests_per_unit"],
        d["unit"].as_str().unwrap_or("")
    );
    let (name, shadow) = (
        d["name"].as_str(),
        d["shadow_mode"].as_bool().unwrap_or(false),
    );
    if name.is_some() || shadow {
        s.push('/');
        s.push_str(name.unwrap_or("-"));
    }
    if shadow {
        s.push_str("/shadow");
    }
    s
}

#[test]
fn repository_conformance_cases_pass() {
    let cases = std::fs::read_to_string(corpus().join("cases.tsv")).expect("cases.tsv");
    let (mut passed, mut failed) = (0, Vec::new());
    for line in cases
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        let cols: Vec<&str> = line.split('\t').collect();
        let (files, domain, entries, expect) = (cols[0], cols[1], cols[2], cols[3]);
        let paths: Vec<PathBuf> = files
            .split(',')
            .map(|f| corpus().join("configs").join(f))
            .collect();
        let ok = if expect == "valid" || expect.starts_with("reject:") {
            let out = Command::new(common::meridian_bin())
                .args(["rules", "check"])
                .args(&paths)
                .output()
                .expect("run meridian rules check");
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            match expect.strip_prefix("reject:") {
                None => out.status.success(),
                Some(words) => {
                    out.status.code() == Some(2)
                        && words
                            .split_whitespace()
                            .all(|w| text.to_lowercase().contains(&w.to_lowercase()))
                }
            }
        } else {
            let out = Command::new(common::meridian_bin())
                .args(["rules", "explain"])
                .args(&paths)
                .args(["--domain", domain, "--json"])
                .args(entries.split(','))
                .output()
                .expect("run meridian rules explain");
            let d: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
            let extra_ok = cols[4..].iter().all(|check| {
                let (field, want) = check.split_once('=').expect("field=value");
                match &d[field] {
                    Value::Null => want == "null",
                    Value::String(s) => s == want,
                    other => serde_json::from_str::<Value>(want).ok().as_ref() == Some(other),
                }
            });
            outcome(&d) == expect && extra_ok
        };
        if ok {
            passed += 1;
        } else {
            failed.push(line.to_owned());
        }
    }
    assert!(
        failed.is_empty(),
        "{passed} passed; failed:\n{}",
        failed.join("\n")
    );
    assert!(passed >= 17, "only {passed} cases ran");
}

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
    domain: &str,
    descriptors: Vec<RateLimitDescriptor>,
) -> RateLimitResponse {
    client
        .should_rate_limit(RateLimitRequest {
            domain: domain.into(),
            descriptors,
            hits_addend: 0,
        })
        .await
        .expect("ShouldRateLimit")
        .into_inner()
}

async fn rls(limiter: &LimiterProcess) -> RateLimitServiceClient<Channel> {
    RateLimitServiceClient::connect(limiter.grpc_url())
        .await
        .expect("connect RLS")
}

#[tokio::test]
async fn requests_per_unit_zero_bans_a_value_without_touching_redis() {
    let redis = RedisServer::start();
    let limiter = LimiterProcess::start(&config("ban.yaml"), &["--redis", &redis.url()]);
    let mut client = rls(&limiter).await;
    for _ in 0..3 {
        let r = ask(
            &mut client,
            "edge_proxy_per_ip",
            vec![
                descriptor(&[("remote_address", "50.0.0.5")]),
                descriptor(&[("remote_address", "50.0.0.1")]),
                descriptor(&[("shadow_ban", "x")]),
            ],
        )
        .await;
        assert_eq!(r.overall_code, Code::OverLimit as i32);
        let banned = &r.statuses[0];
        assert_eq!(banned.code, Code::OverLimit as i32);
        assert_eq!(
            banned.current_limit.as_ref().map(|l| l.requests_per_unit),
            Some(0)
        );
        assert_eq!(banned.limit_remaining, 0);
        let reset = banned.duration_until_reset.expect("reset");
        assert!(
            reset.seconds == 0 || (reset.seconds == 1 && reset.nanos == 0),
            "{reset:?}"
        );
        assert_eq!(
            r.statuses[1].code,
            Code::Ok as i32,
            "the generic limit still applies"
        );
        assert_eq!(
            r.statuses[2].code,
            Code::Ok as i32,
            "a shadow-mode ban only counts"
        );
    }
    // Nothing of the ban is stored: only the generic limit's counter exists.
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query(&mut redis.connection())
        .expect("KEYS");
    assert!(keys.iter().all(|k| !k.contains("50.0.0.5")), "{keys:?}");
    // An override from the gateway does not lift a ban.
    let mut banned = descriptor(&[("remote_address", "50.0.0.5")]);
    banned.limit = Some(
        meridian::proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride {
            requests_per_unit: 1000,
            unit: 1,
        },
    );
    let r = ask(&mut client, "edge_proxy_per_ip", vec![banned]).await;
    assert_eq!(r.overall_code, Code::OverLimit as i32);
}

#[tokio::test]
async fn share_threshold_makes_every_matching_value_share_one_counter() {
    let redis = RedisServer::start();
    let limiter =
        LimiterProcess::start(&config("share_threshold.yaml"), &["--redis", &redis.url()]);
    let mut client = rls(&limiter).await;
    common::clear_of_window_boundary(Duration::from_secs(60), Duration::from_secs(10)).await;
    let admitted = |code: i32| code == Code::Ok as i32;
    // Five /api/* paths, each different, use up the one shared counter of 5.
    for i in 0..5 {
        let r = ask(
            &mut client,
            "shared",
            vec![descriptor(&[("path", &format!("/api/{i}"))])],
        )
        .await;
        assert!(admitted(r.overall_code), "request {i}");
    }
    let r = ask(
        &mut client,
        "shared",
        vec![descriptor(&[("path", "/api/new")])],
    )
    .await;
    assert_eq!(
        r.overall_code,
        Code::OverLimit as i32,
        "a sixth value is over the shared limit"
    );
    // Without share_threshold, every value has its own counter of 5.
    for i in 0..10 {
        let r = ask(
            &mut client,
            "shared",
            vec![descriptor(&[("path", &format!("/img/{i}"))])],
        )
        .await;
        assert!(admitted(r.overall_code), "image {i}");
    }
    // A shared level above a key-only one: one counter per user across teams.
    for team in ["team-a", "team-b", "team-c"] {
        let r = ask(
            &mut client,
            "shared",
            vec![descriptor(&[("team", team), ("user", "u1")])],
        )
        .await;
        assert!(admitted(r.overall_code), "{team}");
    }
    let r = ask(
        &mut client,
        "shared",
        vec![descriptor(&[("team", "team-d"), ("user", "u1")])],
    )
    .await;
    assert_eq!(r.overall_code, Code::OverLimit as i32);
    let r = ask(
        &mut client,
        "shared",
        vec![descriptor(&[("team", "team-d"), ("user", "u2")])],
    )
    .await;
    assert!(admitted(r.overall_code));
}

async fn metrics(limiter: &LimiterProcess) -> String {
    common::http_get(limiter.http_url("/metrics"))
        .await
        .expect("GET /metrics")
        .text()
        .await
        .expect("body")
}

fn series<'m>(text: &'m str, name: &str) -> Vec<&'m str> {
    text.lines().filter(|l| l.starts_with(name)).collect()
}

#[tokio::test]
async fn detailed_metrics_name_values_and_a_flood_of_values_stays_within_the_cap() {
    let redis = RedisServer::start();
    let limiter = LimiterProcess::start(
        &config("detailed_metric.yaml"),
        &["--redis", &redis.url(), "--max-value-metrics", "50"],
    );
    let mut client = rls(&limiter).await;
    let r = ask(
        &mut client,
        "example8",
        vec![
            descriptor(&[("key1", "unspecified_value")]),
            descriptor(&[("key1", "value1")]),
            descriptor(&[("route", "api"), ("method", "GET")]),
        ],
    )
    .await;
    assert_eq!(r.overall_code, Code::Ok as i32);
    let text = metrics(&limiter).await;
    let named = series(&text, "meridian_descriptor_checks_total");
    for want in ["key1_unspecified_value", "route_api.method_GET"] {
        assert!(
            named
                .iter()
                .any(|l| l.contains(&format!("descriptor=\"{want}\""))),
            "{want} not in {named:#?}"
        );
    }
    assert!(
        !named.iter().any(|l| l.contains("key1_value1")),
        "no detail for the exact node"
    );

    // 2,000 random values in batches of 500 through the native API.
    let mut native = LimiterClient::connect(limiter.grpc_url())
        .await
        .expect("connect");
    for batch in 0..4 {
        let checks = (0..500)
            .map(|i| Check {
                domain: "example8".into(),
                descriptor: vec![NativeEntry {
                    key: "key1".into(),
                    value: format!("flood-{batch}-{i}"),
                }],
                ..Default::default()
            })
            .collect();
        native.check(CheckRequest { checks }).await.expect("batch");
    }
    let text = metrics(&limiter).await;
    let named = series(&text, "meridian_descriptor_checks_total");
    let values: std::collections::BTreeSet<&str> = named
        .iter()
        .filter_map(|l| l.split("descriptor=\"").nth(1)?.split('"').next())
        .collect();
    assert!(values.len() <= 50 + 1, "{} values exported", values.len());
    assert!(values.contains("_other"), "{values:?}");
    let overflow: f64 = series(&text, "meridian_value_metrics_overflow_total")
        .iter()
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert!(overflow >= 2_000.0 - 50.0, "overflow {overflow}");
    eprintln!(
        "{} value series after 2,003 distinct values, {overflow} checks past the cap",
        values.len()
    );
}

#[tokio::test]
async fn duplicate_names_load_and_the_native_api_needs_the_descriptor_for_them() {
    let redis = RedisServer::start();
    let limiter =
        LimiterProcess::start(&config("duplicate_names.yaml"), &["--redis", &redis.url()]);
    let mut native = LimiterClient::connect(limiter.grpc_url())
        .await
        .expect("connect");
    let by_name = |rule: &str| Check {
        domain: "dup".into(),
        rule: rule.into(),
        key: "k".into(),
        ..Default::default()
    };
    let by_path = |key: &str| Check {
        domain: "dup".into(),
        descriptor: vec![NativeEntry {
            key: key.into(),
            value: "k".into(),
        }],
        ..Default::default()
    };
    let r = native
        .check(CheckRequest {
            checks: vec![
                by_name("same"),
                by_name("override"),
                by_path("a"),
                by_path("b"),
            ],
        })
        .await
        .expect("check")
        .into_inner();
    let d = &r.decisions;
    assert!(
        !d[0].allowed && d[0].error.contains("ambiguous"),
        "{:?}",
        d[0]
    );
    assert!(
        d[0].error.contains("rules.yaml:6") && d[0].error.contains("rules.yaml:11"),
        "names both places: {}",
        d[0].error
    );
    assert!(d[0].error.contains("descriptor"), "{}", d[0].error);
    assert!(
        d[1].allowed && d[1].matched && d[1].limit == 3,
        "{:?}",
        d[1]
    );
    assert!(d[2].allowed && d[2].limit == 1, "{:?}", d[2]);
    assert!(d[3].allowed && d[3].limit == 2, "{:?}", d[3]);

    // Over Envoy's API both rules of the name count; `replaces` drops both.
    let mut client = rls(&limiter).await;
    let r = ask(
        &mut client,
        "dup",
        vec![descriptor(&[("a", "x")]), descriptor(&[("c", "x")])],
    )
    .await;
    assert!(
        r.statuses[0].current_limit.is_none(),
        "replaced: {:?}",
        r.statuses[0]
    );
    assert_eq!(
        r.statuses[1]
            .current_limit
            .as_ref()
            .map(|l| l.requests_per_unit),
        Some(3)
    );
}

fn stop_rules(field: Option<bool>) -> String {
    let top = field.map_or(String::new(), |b| {
        format!("stop_increment_when_over_limit: {b}\n")
    });
    format!(
        "domain: stop\n{top}descriptors:\n  - key: tight\n    rate_limit: {{unit: minute, requests_per_unit: 1}}\n  - key: loose\n    rate_limit: {{unit: minute, requests_per_unit: 10}}\n"
    )
}

/// Three requests, each with a tight (1/min) and a loose (10/min)
/// descriptor; what the loose one has left afterwards.
async fn loose_remaining_after_three(limiter: &LimiterProcess) -> u32 {
    let mut client = rls(limiter).await;
    let both = || vec![descriptor(&[("tight", "t")]), descriptor(&[("loose", "l")])];
    for i in 0..3 {
        let r = ask(&mut client, "stop", both()).await;
        let want = if i == 0 { Code::Ok } else { Code::OverLimit };
        assert_eq!(r.overall_code, want as i32, "request {i}");
        assert_eq!(
            r.statuses[1].code,
            Code::Ok as i32,
            "the loose one alone allows"
        );
    }
    let peek = RateLimitDescriptor {
        hits_addend: Some(0),
        ..descriptor(&[("loose", "l")])
    };
    ask(&mut client, "stop", vec![peek]).await.statuses[0].limit_remaining
}

#[tokio::test]
async fn stop_increment_when_over_limit_per_domain_or_by_flag_default_off() {
    let redis = RedisServer::start();
    common::clear_of_window_boundary(Duration::from_secs(60), Duration::from_secs(10)).await;
    let redis = &redis;
    let run = |field: Option<bool>, flag: bool| async move {
        let url = redis.url();
        let mut args = vec!["--redis", url.as_str()];
        if flag {
            args.push("--stop-increment-when-over-limit");
        }
        let limiter = LimiterProcess::start(&stop_rules(field), &args);
        let left = loose_remaining_after_three(&limiter).await;
        redis::cmd("FLUSHALL")
            .query::<()>(&mut redis.connection())
            .expect("FLUSHALL");
        left
    };
    // envoyproxy/ratelimit's default: every descriptor is charged.
    assert_eq!(run(None, false).await, 7);
    // A denied request charges nothing: only the first counted.
    assert_eq!(run(Some(true), false).await, 9);
    assert_eq!(run(None, true).await, 9);
    // The domain's own setting wins over the flag.
    assert_eq!(run(Some(false), true).await, 7);
}
