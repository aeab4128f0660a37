//! The approximate path and hot-key splitting against real Redis, with several
//! in-process limiters ("pods") sharing one Redis or one Cluster.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::{RedisCluster, RedisServer};
use meridian::Limiter;
use meridian::Source;
use meridian::store::{RedisConfig, RedisStore};

/// A pod. Tests that prove a bound (not a fail mode) give Redis a generous
/// deadline: the test machine's cores are shared and a flush that misses the
/// 100 ms default would hand the check to the fail mode.
async fn limiter_with(url: &str, rules: &str, deadline: Duration) -> Limiter {
    let mut config = RedisConfig::new(url);
    config.deadline = deadline;
    let store = RedisStore::connect(&config).await.expect("connect");
    Limiter::from_yaml(rules, store).expect("rules")
}

async fn limiter(url: &str, rules: &str) -> Limiter {
    limiter_with(url, rules, Duration::from_secs(2)).await
}

/// Sum of the Meridian counters matching `pattern` in one Redis (fixed-window
/// counters only; flush ids, `…:f:<id>`, are not counters).
fn sum_counters(conn: &mut redis::Connection, pattern: &str) -> u64 {
    let keys: Vec<String> = redis::cmd("KEYS").arg(pattern).query(conn).unwrap();
    keys.iter()
        .map(|k| redis::cmd("GET").arg(k).query::<u64>(conn).unwrap())
        .sum()
}

/// Sleeps until the Redis clock is early in a minute, so a test of a
/// per-minute limit cannot straddle a window edge.
fn wait_for_fresh_minute(conn: &mut redis::Connection, needed: Duration) {
    let (secs, _): (u64, u64) = redis::cmd("TIME").query(conn).unwrap();
    let into = secs % 60;
    if into + needed.as_secs() >= 59 {
        std::thread::sleep(Duration::from_secs(60 - into + 1));
    }
}

const FOUR_PODS: &str = r#"
domain: api
descriptors:
  - key: customer
    accuracy: approximate
    rate_limit:
      name: per_customer
      unit: minute
      requests_per_unit: 10000
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_pods_admit_within_limit_plus_pods_times_max_batch() {
    let redis = RedisServer::start();
    let mut conn = redis.connection();
    let url = redis.url();
    let pods = futures::future::join_all((0..4).map(|_| limiter(&url, FOUR_PODS))).await;
    let pods: Vec<Arc<Limiter>> = pods.into_iter().map(Arc::new).collect();
    wait_for_fresh_minute(&mut conn, Duration::from_secs(25));

    // 4 pods × 8 tasks, each checking as fast as it can: 30,000 asks for 10,000.
    let admitted = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..32)
        .map(|i| {
            let pod = pods[i % 4].clone();
            let admitted = admitted.clone();
            tokio::spawn(async move {
                for _ in 0..940 {
                    let v = pod
                        .check("api", &[("customer", "42")], 1)
                        .await
                        .unwrap()
                        .unwrap();
                    assert!(
                        matches!(v.source, Source::Store | Source::Cache),
                        "no fail mode while Redis is up: {:?}",
                        v.source
                    );
                    if v.decision.allowed {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    for pod in &pods {
        pod.flush().await.unwrap();
    }
    let admitted = admitted.load(Ordering::Relaxed);
    let max_batch = 10_000 / 100;
    println!("4 pods admitted {admitted} of 30,080 asks (L 10,000, bound 10,400)");
    assert!(admitted <= 10_000 + 4 * max_batch, "admitted {admitted}");
    assert!(admitted >= 9_900, "under-admitted: {admitted}");
    // Every locally admitted hit reached Redis, on the exact path's key.
    assert_eq!(sum_counters(&mut conn, "mr:{*customer*}:fw:*"), admitted);
}

const TWO_LIMITS: &str = r#"
domain: api
descriptors:
  - key: customer
    accuracy: approximate
    limits:
      - {rate_limit: {unit: minute, requests_per_unit: 2000, name: per_customer}}
      - {rate_limit: {unit: hour, requests_per_unit: 100000}}
"#;

/// `limits:` on the approximate path: each limit batched on its own counter
/// (the exact path's keys), a check admitted only when both admit and then
/// counted in both, so the looser limit ends holding exactly what was
/// admitted, and the tighter admits within its bound (L + pods × max_batch).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_limits_on_the_approximate_path_charge_both_or_neither() {
    let redis = RedisServer::start();
    let mut conn = redis.connection();
    let url = redis.url();
    let pods = futures::future::join_all((0..4).map(|_| limiter(&url, TWO_LIMITS))).await;
    let pods: Vec<Arc<Limiter>> = pods.into_iter().map(Arc::new).collect();
    wait_for_fresh_minute(&mut conn, Duration::from_secs(20));

    let admitted = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..32)
        .map(|i| {
            let pod = pods[i % 4].clone();
            let admitted = admitted.clone();
            tokio::spawn(async move {
                for _ in 0..200 {
                    let v = pod
                        .check("api", &[("customer", "42")], 1)
                        .await
                        .unwrap()
                        .unwrap();
                    assert_eq!(v.source, Source::Store, "no fail mode while Redis is up");
                    if v.decision.allowed {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    for pod in &pods {
        pod.flush().await.unwrap();
    }
    let admitted = admitted.load(Ordering::Relaxed);
    let max_batch = 2_000 / 100;
    println!("4 pods admitted {admitted} of 6,400 asks (tightest 2,000, bound 2,080)");
    assert!(admitted <= 2_000 + 4 * max_batch, "admitted {admitted}");
    assert!(admitted >= 1_980, "under-admitted: {admitted}");
    // Limit 1 under the single-limit key, limit 2 under `…:1:`; both got
    // every admitted hit and no denied one.
    assert_eq!(sum_counters(&mut conn, "mr:{*customer*}:fw:*"), admitted);
    assert_eq!(sum_counters(&mut conn, "mr:{*customer*}:1:fw:*"), admitted);
}

const FAIL_CLOSED: &str = r#"
domain: api
descriptors:
  - key: customer
    accuracy: approximate
    sync_interval: 20ms
    max_batch: 50
    fail_mode: closed
    rate_limit:
      name: per_customer
      unit: hour
      requests_per_unit: 10000
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_crash_keeps_deltas_until_it_is_back_and_fails_closed_meanwhile() {
    let mut redis = RedisServer::start();
    let pod = limiter_with(&redis.url(), FAIL_CLOSED, Duration::from_millis(100)).await;
    let check = || pod.check("api", &[("customer", "7")], 1);
    for _ in 0..30 {
        assert!(check().await.unwrap().unwrap().decision.allowed);
    }
    pod.flush().await.unwrap();
    assert_eq!(sum_counters(&mut redis.connection(), "mr:*:fw:*"), 30);

    redis.kill();
    // Below max_batch the pod keeps deciding locally; at max_batch it needs a
    // flush that cannot happen, so the rule's fail mode (closed) decides.
    let (mut local, mut fail_closed) = (0, 0);
    for _ in 0..100 {
        let v = check().await.unwrap().unwrap();
        match v.source {
            Source::Store => {
                assert!(v.decision.allowed);
                local += 1;
            }
            Source::FailClosed => {
                assert!(!v.decision.allowed);
                fail_closed += 1;
            }
            other => panic!("unexpected source {other:?}"),
        }
    }
    assert_eq!(local, 50, "admitted locally up to max_batch");
    assert_eq!(fail_closed, 50);
    assert!(pod.flush().await.is_err(), "Redis is down");

    // A fresh Redis (the crash lost its data): the 50 kept hits arrive there.
    redis.restart();
    let deadline = Instant::now() + Duration::from_secs(10);
    while pod.flush().await.is_err() {
        assert!(
            Instant::now() < deadline,
            "flush never succeeded after restart"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(sum_counters(&mut redis.connection(), "mr:*:fw:*"), 50);
    let v = check().await.unwrap().unwrap();
    assert_eq!((v.source, v.decision.allowed), (Source::Store, true));
}

const SPLIT: &str = r#"
domain: api
descriptors:
  - key: exact
    split: 8
    rate_limit:
      name: exact
      unit: hour
      requests_per_unit: 800
  - key: approx
    split: 8
    accuracy: approximate
    rate_limit:
      name: approx
      unit: hour
      requests_per_unit: 8000
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn split_8_spreads_a_hot_key_over_masters_within_its_bound() {
    let cluster = RedisCluster::start();
    let pod = Arc::new(limiter(&cluster.url(), SPLIT).await);

    let drive = |rule: &'static str, tasks: usize, each: usize| {
        let admitted = Arc::new(AtomicU64::new(0));
        let handles: Vec<_> = (0..tasks)
            .map(|_| {
                let (pod, admitted) = (pod.clone(), admitted.clone());
                tokio::spawn(async move {
                    for _ in 0..each {
                        let v = pod
                            .check("api", &[(rule, "hot")], 1)
                            .await
                            .unwrap()
                            .unwrap();
                        assert_eq!(v.source, Source::Store);
                        assert_eq!(v.decision.limit, if rule == "exact" { 800 } else { 8000 });
                        admitted.fetch_add(u64::from(v.decision.allowed), Ordering::Relaxed);
                    }
                })
            })
            .collect();
        async move {
            for h in handles {
                h.await.unwrap();
            }
            admitted.load(Ordering::Relaxed)
        }
    };

    // Exact sub-counters: never above L; with 2,000 asks every sub-counter fills.
    let exact = drive("exact", 8, 250).await;
    assert!((792..=800).contains(&exact), "exact split admitted {exact}");
    let per_node = cluster.keys_per_node();
    assert!(
        per_node.iter().filter(|&&n| n > 0).count() >= 2,
        "sub-counters on one master only: {per_node:?}"
    );
    assert_eq!(per_node.iter().sum::<usize>(), 8, "one key per sub-counter");

    // Approximate sub-counters, flushed per slot: L + pods × K × max_batch
    // (sub-limit 1,000, max_batch 10).
    let approx = drive("approx", 8, 1_500).await;
    pod.flush().await.unwrap();
    println!(
        "split 8: exact admitted {exact}/800, approximate {approx}/8,000; keys per master {per_node:?}"
    );
    assert!(
        approx <= 8_000 + 8 * 10,
        "approximate split admitted {approx}"
    );
    assert!(
        approx >= 7_900,
        "approximate split under-admitted: {approx}"
    );
    let stored: u64 = cluster
        .nodes
        .iter()
        .map(|n| sum_counters(&mut n.connection(), "mr:{*approx*}:fw:*"))
        .sum();
    assert_eq!(stored, approx);
}
