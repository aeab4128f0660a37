//! Requests shaped to slip past a limit, against real limiter processes: an
//! over-long descriptor beside a limited one, overrides that would poison the
//! over-limit cache or skip a global allocation, huge keys a region would
//! have to remember, Envoy's WEEK unit.

use crate::common;

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::RedisServer;
use common::global::{World, fixed_window_rule};
use common::limiter::LimiterProcess;
use meridian::proto::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use meridian::proto::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use meridian::proto::envoy::service::ratelimit::v3::rate_limit_response::Code;
use meridian::proto::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use meridian::proto::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use meridian::proto::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use meridian::proto::envoy::r#type::v3::RateLimitUnit;
use tonic::transport::Channel;

const RULES: &str = r#"
domain: api
descriptors:
  - key: path
    value: /login
    rate_limit:
      name: login
      unit: minute
      requests_per_unit: 3
  - key: customer
    rate_limit:
      name: per_customer
      unit: minute
      requests_per_unit: 1000
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

fn overridden(entries: &[(&str, &str)], requests: u32, unit: RateLimitUnit) -> RateLimitDescriptor {
    RateLimitDescriptor {
        limit: Some(RateLimitOverride {
            requests_per_unit: requests,
            unit: unit as i32,
        }),
        ..descriptor(entries)
    }
}

async fn rls(url: String) -> RateLimitServiceClient<Channel> {
    RateLimitServiceClient::connect(url)
        .await
        .expect("connect RLS")
        .max_decoding_message_size(16 << 20)
        .max_encoding_message_size(16 << 20)
}

async fn ask(
    client: &mut RateLimitServiceClient<Channel>,
    descriptors: Vec<RateLimitDescriptor>,
) -> RateLimitResponse {
    client
        .should_rate_limit(RateLimitRequest {
            domain: "api".into(),
            descriptors,
            hits_addend: 0,
        })
        .await
        .expect("ShouldRateLimit answers")
        .into_inner()
}

fn rss_kb(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc status")
}

/// Sleeps past the next minute's start when fewer than `needed` are left of
/// this one, so per-minute counts in a test cannot straddle a window edge.
fn fresh_minute(needed: Duration) {
    let into = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() % 60);
    if into + needed.as_secs() >= 59 {
        std::thread::sleep(Duration::from_secs(60 - into + 1));
    }
}

#[tokio::test]
async fn an_over_long_descriptor_is_refused_alone_and_login_is_still_charged() {
    let redis = RedisServer::start();
    let limiter = LimiterProcess::start(RULES, &["--redis", &redis.url()]);
    let mut client = rls(limiter.grpc_url()).await;
    fresh_minute(Duration::from_secs(10));
    let long = "x".repeat(520);
    let mut login = Vec::new();
    for _ in 0..5 {
        let r = ask(
            &mut client,
            vec![
                descriptor(&[("customer", &long)]),
                descriptor(&[("path", "/login")]),
            ],
        )
        .await;
        assert_eq!(r.statuses.len(), 2, "one status per descriptor");
        assert_eq!(
            r.statuses[0].code,
            Code::OverLimit as i32,
            "a key that cannot be counted is refused, not let through"
        );
        assert_eq!(r.overall_code, Code::OverLimit as i32);
        login.push((r.statuses[1].code, r.statuses[1].limit_remaining));
    }
    let (ok, over) = (Code::Ok as i32, Code::OverLimit as i32);
    assert_eq!(
        login,
        [(ok, 2), (ok, 1), (ok, 0), (over, 0), (over, 0)],
        "/login is charged and denied at its limit of 3"
    );
    // The refusal is visible to operators.
    let metrics = common::http_get(limiter.http_url("/metrics"))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("metrics body");
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("meridian_invalid_descriptors_total{")
                && l.ends_with("field=\"key\"} 5")),
        "{}",
        metrics
            .lines()
            .filter(|l| l.contains("invalid"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[tokio::test]
async fn a_small_override_does_not_lock_out_the_rules_own_limit() {
    let redis = RedisServer::start();
    let limiter = LimiterProcess::start(RULES, &["--redis", &redis.url()]);
    let mut client = rls(limiter.grpc_url()).await;
    fresh_minute(Duration::from_secs(10));
    // An attacker's two calls with an override of 1 a minute on the victim's key.
    let poison = overridden(&[("customer", "victim")], 1, RateLimitUnit::Minute);
    let first = ask(&mut client, vec![poison.clone()]).await;
    assert_eq!(first.overall_code, Code::Ok as i32);
    let second = ask(&mut client, vec![poison.clone()]).await;
    assert_eq!(second.overall_code, Code::OverLimit as i32);
    // The denial is cached for the override's limit only: the victim, under
    // the rule's 1,000 a minute, is admitted (2 hits counted so far: 1 + itself).
    let victim = ask(&mut client, vec![descriptor(&[("customer", "victim")])]).await;
    assert_eq!(victim.overall_code, Code::Ok as i32);
    assert_eq!(victim.statuses[0].limit_remaining, 998);
    // And the attacker's own override stays denied from the cache.
    let third = ask(&mut client, vec![poison]).await;
    assert_eq!(third.overall_code, Code::OverLimit as i32);
}

#[tokio::test]
async fn a_week_override_is_enforced_and_reported_per_week() {
    let redis = RedisServer::start();
    let limiter = LimiterProcess::start(RULES, &["--redis", &redis.url()]);
    let mut client = rls(limiter.grpc_url()).await;
    let weekly = overridden(&[("customer", "w")], 2, RateLimitUnit::Week);
    let codes: Vec<i32> = {
        let mut codes = Vec::new();
        for _ in 0..3 {
            codes.push(ask(&mut client, vec![weekly.clone()]).await.overall_code);
        }
        codes
    };
    assert_eq!(
        codes,
        [Code::Ok as i32, Code::Ok as i32, Code::OverLimit as i32]
    );
    let r = ask(&mut client, vec![weekly]).await;
    let status = &r.statuses[0];
    let limit = status.current_limit.as_ref().expect("current_limit filled");
    assert_eq!(
        (limit.requests_per_unit, limit.unit),
        (2, Unit::Week as i32),
        "the override's limit, in its own unit"
    );
    let reset = status.duration_until_reset.as_ref().expect("reset filled");
    assert!(
        reset.seconds > 0 && reset.seconds <= 7 * 86_400,
        "a week's window: {reset:?}"
    );
}

#[tokio::test]
async fn a_global_override_takes_the_regions_share_is_demand_and_huge_keys_are_not_kept() {
    let world = World::start(&fixed_window_rule(100), &["east", "west"]).await;
    let rule = "api|fw";
    let t0 = Instant::now();
    let before = world.wait_allocated(rule, Duration::from_secs(20)).await;
    eprintln!("allocated after {:?}", t0.elapsed());
    let east = &world.regions[0];
    let mut client = rls(east.limiter.grpc_url()).await;
    // Wait until east applies its share (its first check is denied until then).
    let started = Instant::now();
    while ask(&mut client, vec![descriptor(&[("fw", "probe")])])
        .await
        .overall_code
        != Code::Ok as i32
    {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "east never admits"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Far from an hour's end, so the override's window holds the whole burst.
    let into_hour = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() % 3600);
    if into_hour > 3590 {
        tokio::time::sleep(Duration::from_secs(3600 - into_hour + 1)).await;
    }

    // The override says 500 an hour for this key, world-wide. East holds
    // its share of the rule's 100; it enforces the same share of 500. The
    // burst of 800 is more than any share east can hold (east is the only
    // region with demand, so its share grows while the burst runs, up to
    // 95 of 100: 475 of 500).
    let key = overridden(&[("fw", "acme")], 500, RateLimitUnit::Hour);
    // What east's pods had reported asking before the burst (the probe).
    let asked_before = world.allocations("").await["rules"][rule]["hits"]["east"]["asked"]
        .as_u64()
        .unwrap_or(0);
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let mut client = client.clone();
            let key = key.clone();
            tokio::spawn(async move {
                let mut admitted = 0u64;
                for _ in 0..100 {
                    if ask(&mut client, vec![key.clone()]).await.overall_code == Code::Ok as i32 {
                        admitted += 1;
                    }
                }
                admitted
            })
        })
        .collect();
    let mut admitted = 0;
    for t in tasks {
        admitted += t.await.expect("load task");
    }
    let after = world.split(rule).await;
    eprintln!("burst done after {:?}", t0.elapsed());
    let share = |split: &std::collections::BTreeMap<String, u64>| split["east"] * 500 / 100;
    eprintln!("east admitted {admitted} of 800; shares {before:?} → {after:?}");
    assert!(
        admitted < 800 && admitted <= share(&after).max(share(&before)),
        "east admitted {admitted}: more than its share of the override ({before:?} → {after:?})"
    );
    assert!(
        admitted + 20 >= share(&before).min(share(&after)),
        "east admitted {admitted}: it enforces a share, not nothing"
    );
    // The burst's 800 checks are east's demand at the coordinator: its
    // reported hits grow by all of them (admitted or not), and its smoothed
    // demand is above zero.
    let started = Instant::now();
    loop {
        let body = world.allocations("").await;
        let east = &body["rules"][rule];
        let asked = east["hits"]["east"]["asked"].as_u64().unwrap_or(0);
        let demand = east["demand"]["east"].as_f64().unwrap_or(0.0);
        if asked >= asked_before + 800 && demand > 0.0 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the override's 800 checks did not all reach the coordinator as east's demand \
             (asked {asked_before} before, {asked} now): {body}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Checks of a global rule with 3 MB keys: refused, and not kept in the
    // demand counts (before the fix, 150 such checks held 1 GB: ~7 MB each).
    let rss_before = rss_kb(east.limiter.pid());
    let huge = "k".repeat(3 << 20);
    for _ in 0..20 {
        let r = ask(&mut client, vec![descriptor(&[("fw", &huge)])]).await;
        assert_eq!(r.statuses[0].code, Code::OverLimit as i32);
    }
    let rss_after = rss_kb(east.limiter.pid());
    eprintln!("east RSS {rss_before} kB → {rss_after} kB after 20 × 3 MB keys");
    assert!(
        rss_after < rss_before + 40 * 1024,
        "RSS grew from {rss_before} kB to {rss_after} kB"
    );
}
