//! Several limits on one descriptor, decided in one call (the Redis multi
//! script; the embedded store's `check_all_at`): admitted only when every
//! limit admits, a denial charging none, on standalone Redis and on a
//! 3-master Cluster, and the same decisions as the pure algorithms.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use common::{RedisCluster, RedisServer};
use meridian::algorithm::{Algorithm, Params};
use meridian::store::{Limit, MemoryStore, RedisConfig, RedisStore, Store};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

const NOW: u64 = 1_800_000_000_000_000;

fn limit(rule: &str, algorithm: Algorithm, n: i64, period: Duration, burst: Option<i64>) -> Limit {
    Limit {
        rule: rule.into(),
        params: Params::new(algorithm, n, period, burst).expect("valid params"),
    }
}

/// A quota (fixed window, 1,000 an hour) and a burst (token bucket of 300,
/// refilling 1 an hour): the bucket is the tighter. `flip` puts it first.
fn pair(rule: &str, flip: bool) -> Vec<Limit> {
    let hour = Duration::from_secs(3600);
    let quota = limit(rule, Algorithm::FixedWindow, 1000, hour, None);
    let burst = limit(rule, Algorithm::TokenBucket, 1, hour, Some(300));
    if flip {
        vec![burst, quota]
    } else {
        vec![quota, burst]
    }
}

/// A deadline for a box that runs other builds while 64 tasks hammer it.
fn config(url: String) -> RedisConfig {
    let mut config = RedisConfig::new(url);
    config.deadline = Duration::from_secs(5);
    config
}

/// 1,600 checks from 64 tasks on 8 connections; how many were admitted.
async fn hammer(stores: &[Arc<RedisStore>], limits: Arc<Vec<Limit>>, key: &'static str) -> u64 {
    let admitted = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..64)
        .map(|i| {
            let (store, limits, admitted) = (
                stores[i % stores.len()].clone(),
                limits.clone(),
                admitted.clone(),
            );
            tokio::spawn(async move {
                for _ in 0..25 {
                    let d = store
                        .check_all(&limits, key, 1, Some(NOW))
                        .await
                        .expect("check");
                    assert!(d.len() == limits.len() || !d[0].allowed);
                    if d.iter().all(|d| d.allowed) {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("task");
    }
    admitted.load(Ordering::Relaxed)
}

/// Exactly the tightest limit's worth is admitted, and the looser limit is
/// charged by the admitted checks only.
async fn admits_exactly_the_tightest(stores: &[Arc<RedisStore>]) {
    for flip in [false, true] {
        let rule = if flip { "multi-flipped" } else { "multi" };
        let limits = Arc::new(pair(rule, flip));
        let admitted = hammer(stores, limits.clone(), "one-key").await;
        assert_eq!(admitted, 300, "flip {flip}");
        // A check-only peek of both: the quota counted 300, the bucket is empty.
        let peek = stores[0]
            .check_all(&limits, "one-key", 0, Some(NOW))
            .await
            .expect("peek");
        let (quota, bucket) = (&peek[usize::from(flip)], &peek[usize::from(!flip)]);
        assert_eq!(
            quota.remaining, 700,
            "flip {flip}: denied checks charged the quota"
        );
        assert_eq!(bucket.remaining, 0, "flip {flip}");
        // A denied check reports the quota as it stands, untouched.
        let denied = stores[0]
            .check_all(&limits, "one-key", 1, Some(NOW))
            .await
            .expect("check");
        assert!(!denied[usize::from(!flip)].allowed);
        assert_eq!(denied[usize::from(flip)].remaining, 700);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_checks_admit_exactly_the_tightest_and_denials_charge_nothing() {
    let server = RedisServer::start();
    let mut stores = Vec::new();
    for _ in 0..8 {
        let store = RedisStore::connect(&config(server.url()))
            .await
            .expect("connect");
        stores.push(Arc::new(store));
    }
    admits_exactly_the_tightest(&stores).await;
    // One script call per check (the commands inside it are the algorithms').
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut server.connection())
        .expect("INFO");
    assert!(info.contains("cmdstat_evalsha"), "{info}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_a_cluster_every_limit_of_a_descriptor_is_in_one_slot() {
    let cluster = RedisCluster::start();
    let mut stores = Vec::new();
    for _ in 0..4 {
        let store = RedisStore::connect(&config(cluster.url()))
            .await
            .expect("connect");
        stores.push(Arc::new(store));
    }
    admits_exactly_the_tightest(&stores).await;
    // Keys on every master: many descriptors, each with its two limits.
    let limits = pair("spread", false);
    for i in 0..60 {
        let key = format!("customer-{i}");
        let d = stores[0]
            .check_all(&limits, &key, 1, Some(NOW))
            .await
            .expect("a call on one slot");
        assert!(d.iter().all(|d| d.allowed));
    }
    let per_node = cluster.keys_per_node();
    assert!(per_node.iter().all(|&n| n > 0), "{per_node:?}");
}

#[derive(Debug, Clone)]
struct Op {
    cost: u64,
    advance: u64,
}

fn params(algorithm: Algorithm) -> impl Strategy<Value = Params> {
    let periods = prop_oneof![Just(1_000u64), Just(1_500), Just(10_000)];
    (1..13i64, 1..13i64, periods).prop_map(move |(limit, burst, ms)| {
        let burst = algorithm.has_burst().then_some(burst);
        Params::new(algorithm, limit, Duration::from_millis(ms), burst).expect("valid")
    })
}

fn case() -> impl Strategy<Value = (Vec<Params>, Vec<Op>)> {
    let algorithm = prop::sample::select(Algorithm::ALL.to_vec());
    let limits = prop::collection::vec(algorithm.prop_flat_map(params), 2..4);
    let op = (
        prop_oneof![8 => 1..4u64, 1 => 4..13u64, 1 => Just(0u64)],
        prop_oneof![3 => Just(0u64), 3 => 0..2_000u64, 4 => 0..10_000_000u64],
    )
        .prop_map(|(cost, advance)| Op { cost, advance });
    (limits, prop::collection::vec(op, 1..50))
}

/// The Lua multi script and the embedded store (the pure algorithms, each
/// decided on a copy and kept only when all admit) agree on every decision.
#[test]
fn the_multi_script_decides_as_the_pure_algorithms_do() {
    let server = RedisServer::start();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let redis = rt
        .block_on(RedisStore::connect(&RedisConfig::new(server.url())))
        .expect("connect");
    let memory = MemoryStore::new();
    let cases = AtomicU64::new(0);
    let mut runner = TestRunner::new(Config {
        cases: 96,
        ..Config::default()
    });
    runner
        .run(&case(), |(params, ops)| {
            let rule = format!("eq{}", cases.fetch_add(1, Ordering::Relaxed));
            let limits: Vec<Limit> = params
                .into_iter()
                .map(|params| Limit {
                    rule: rule.clone(),
                    params,
                })
                .collect();
            let mut now = NOW;
            for (i, op) in ops.iter().enumerate() {
                now += op.advance;
                let m = memory
                    .check_all_at(&limits, "k", op.cost, now)
                    .expect("memory");
                let r = rt
                    .block_on(redis.check_all(&limits, "k", op.cost, Some(now)))
                    .expect("redis");
                prop_assert_eq!(&m, &r, "op {} {:?} at {}", i, op, now);
                // A single limit alone decides as the single-limit script.
                if i == 0 {
                    let single = rt
                        .block_on(redis.peek(&limits[0], "k", Some(now)))
                        .expect("peek");
                    let multi = rt
                        .block_on(redis.check_all(&limits[..1], "k", 0, Some(now)))
                        .expect("multi");
                    prop_assert_eq!(&single, &multi[0]);
                }
            }
            Ok(())
        })
        .unwrap_or_else(|e| panic!("memory and redis disagree: {e}"));
}

/// The example shape, end to end: a `limits:` descriptor over Envoy's
/// API on a real limiter, the tightest limit reported, the quota charged by
/// admitted checks only.
#[tokio::test]
async fn a_limits_descriptor_over_envoy_rls_reports_the_tightest_and_charges_no_denial() {
    use common::limiter::LimiterProcess;
    use meridian::proto::envoy::extensions::common::ratelimit::v3::{
        RateLimitDescriptor, rate_limit_descriptor::Entry,
    };
    use meridian::proto::envoy::service::ratelimit::v3::RateLimitRequest;
    use meridian::proto::envoy::service::ratelimit::v3::rate_limit_response::Code;
    use meridian::proto::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
    use meridian::proto::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;

    const RULES: &str = "domain: api
descriptors:
  - key: customer
    limits:
      - {algorithm: token_bucket, burst: 3, rate_limit: {unit: minute, requests_per_unit: 1, name: per_customer}}
      - {algorithm: fixed_window, rate_limit: {unit: hour, requests_per_unit: 5}}
";
    let redis = RedisServer::start();
    let limiter = LimiterProcess::start(RULES, &["--redis", &redis.url()]);
    let mut client = RateLimitServiceClient::connect(limiter.grpc_url())
        .await
        .expect("connect");
    common::clear_of_window_boundary(Duration::from_secs(3600), Duration::from_secs(30)).await;
    let ask = || RateLimitRequest {
        domain: "api".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "customer".into(),
                value: "a".into(),
            }],
            ..Default::default()
        }],
        hits_addend: 0,
    };
    let mut seen = Vec::new();
    for _ in 0..6 {
        let r = client
            .should_rate_limit(ask())
            .await
            .expect("RLS")
            .into_inner();
        let s = &r.statuses[0];
        let limit = s.current_limit.as_ref().expect("current_limit");
        seen.push((
            s.code,
            limit.unit,
            limit.requests_per_unit,
            s.limit_remaining,
        ));
    }
    let (ok, over) = (Code::Ok as i32, Code::OverLimit as i32);
    let minute = Unit::Minute as i32;
    // The bucket (3) is tighter than the hourly quota (5) throughout.
    assert_eq!(
        seen,
        [
            (ok, minute, 1, 2),
            (ok, minute, 1, 1),
            (ok, minute, 1, 0),
            (over, minute, 1, 0),
            (over, minute, 1, 0),
            (over, minute, 1, 0),
        ]
    );
    let mut conn = redis.connection();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*:1:fw:*")
        .query(&mut conn)
        .expect("KEYS");
    assert_eq!(keys.len(), 1, "{keys:?}");
    let counted: u64 = redis::cmd("GET")
        .arg(&keys[0])
        .query(&mut conn)
        .expect("GET");
    assert_eq!(counted, 3, "denied checks charged the quota");
}

/// `limits:` with `scope: global`: 3 coordinators, 2 regions. Each limit is
/// allocated on its own (the first under the rule's id, the second under
/// `<id>%limit2`), each region enforces its share of both in one call, and
/// the world admits within both: at most 60 per 2 s window and at most 100
/// per 4 s window, with traffic (90/s) above both.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_global_limits_rule_allocates_each_limit_and_the_world_keeps_both() {
    use common::global::{Load, World, granted};

    const RULES: &str = "domain: api
descriptors:
  - key: multi
    scope: global
    fail_mode: closed
    limits:
      - {algorithm: fixed_window, period: 2s, rate_limit: {requests_per_unit: 60, name: multi}}
      - {algorithm: fixed_window, period: 4s, rate_limit: {requests_per_unit: 100}}
";
    let world = World::start(RULES, &["mumbai", "hyderabad"]).await;
    let load = Load::start(&world, "api", "multi", "acme", &[60, 30]);
    let first = world
        .wait_allocated("api|multi", Duration::from_secs(20))
        .await;
    let second = world
        .wait_allocated("api|multi%limit2", Duration::from_secs(20))
        .await;
    eprintln!("allocated: limit 1 {first:?}, limit 2 {second:?}");
    // Both limits' demand reached the coordinator: each has its own
    // allocation, and the regions' shares add up to its limit.
    let body = world.allocations("").await;
    for (id, limit) in [("api|multi", 60), ("api|multi%limit2", 100)] {
        let split = granted(&body["rules"][id]["split"]);
        assert!(
            split.values().sum::<u64>() <= limit,
            "{id}: shares {split:?} exceed {limit}"
        );
    }
    tokio::time::sleep(Duration::from_secs(12)).await;
    let records = load.stop().await;

    // A decision was made between its send and its receipt: count it in a
    // window only when both fall inside it (a lower bound of the window's
    // admissions, which must be within the limit), and report how many
    // straddled an edge.
    let within = |period_us: u64, limit: u64| {
        let mut windows: std::collections::BTreeMap<u64, (u64, u64)> = Default::default();
        for r in records.iter().filter(|r| r.allowed) {
            let (a, b) = (r.sent_us / period_us, r.recv_us / period_us);
            let entry = windows.entry(a).or_default();
            if a == b {
                entry.0 += 1;
            } else {
                entry.1 += 1;
            }
        }
        for (w, (certain, straddling)) in &windows {
            assert!(
                *certain <= limit,
                "window {w} of {period_us} µs admitted {certain} (+{straddling} at its edge), \
                 above {limit}"
            );
        }
        windows
    };
    let two = within(2_000_000, 60);
    let four = within(4_000_000, 100);
    eprintln!("per 2 s window (admitted, at an edge): {two:?}");
    eprintln!("per 4 s window (admitted, at an edge): {four:?}");
    // The limits bind (not starved): full 4 s windows admit most of 100.
    let full: Vec<u64> = four.values().skip(1).map(|(c, s)| c + s).collect();
    let full = &full[..full.len().saturating_sub(1)];
    assert!(!full.is_empty(), "no full 4 s window: {four:?}");
    assert!(
        full.iter().all(|&n| n >= 70),
        "a full 4 s window admitted far below its 100: {full:?}"
    );
}
