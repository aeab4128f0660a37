//! The approximate path under a random-key flood and across a flush whose
//! answer the client missed (issue 16): real redis-server processes, real
//! `meridian limiter` processes for the flood, `meridian::Limiter` where the
//! test needs to time a flush against a stalled Redis.

use crate::common;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::RedisServer;
use common::limiter::LimiterProcess;
use meridian::proto::meridian::v1::limiter_client::LimiterClient;
use meridian::proto::meridian::v1::{Check, CheckRequest};
use meridian::store::{RedisConfig, RedisStore};
use meridian::{EngineConfig, Limiter, Source};

/// Values of every key matching `pattern` (SCAN, then GET in batches).
fn counters(conn: &mut redis::Connection, pattern: &str) -> HashMap<String, u64> {
    let keys: Vec<String> = redis::cmd("SCAN")
        .cursor_arg(0)
        .arg("MATCH")
        .arg(pattern)
        .arg("COUNT")
        .arg(10_000)
        .clone()
        .iter(conn)
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let mut out = HashMap::with_capacity(keys.len());
    for batch in keys.chunks(1_000) {
        let values: Vec<u64> = redis::cmd("MGET").arg(batch).query(conn).unwrap();
        out.extend(batch.iter().cloned().zip(values));
    }
    out
}

/// `n` of a counter `mr:{api|customer:c<n>}:…`.
fn key_number(key: &str) -> u32 {
    let tag = key.split('}').next().unwrap();
    tag.rsplit('c').next().unwrap().parse().unwrap()
}

/// The limiter's VmRSS from /proc, in kB.
fn rss_kb(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no VmRSS in /proc/{pid}/status"))
}

/// One sample of a metric from the limiter's /metrics (0 when absent).
async fn metric(limiter: &LimiterProcess, name: &str) -> f64 {
    let text = common::http_get(limiter.http_url("/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{']))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

const FLOODED: &str = r#"
domain: api
descriptors:
  - key: visitor
    accuracy: approximate
    rate_limit:
      name: flood
      unit: hour
      requests_per_unit: 1000000
"#;

const FAIL_CLOSED: &str = r#"
domain: api
descriptors:
  - key: account
    fail_mode: closed
    rate_limit:
      name: guarded
      unit: hour
      requests_per_unit: 1000000
"#;

/// Tracked keys in the flooded limiter: small, so the flood outgrows it.
const MAX_KEYS: u64 = 10_000;
/// The flooded limiter's VmRSS after the flood, at most (a debug build; the
/// audit's release build reached 334 MB).
const RSS_CAP_KB: u64 = 120_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_key_flood_keeps_redis_fast_and_a_second_limiter_decides_from_redis() {
    let redis = RedisServer::start_with(&[
        "--slowlog-log-slower-than",
        "2000",
        "--slowlog-max-len",
        "1024",
    ]);
    let url = redis.url();
    let max_keys = MAX_KEYS.to_string();
    let flooded = LimiterProcess::start(
        FLOODED,
        &[
            "--redis",
            &url,
            "--approximate-max-keys",
            &max_keys,
            // The exact checks of untracked keys go to fail_mode (open, not
            // counted in Redis) past the deadline; the 2-core test box needs room.
            "--redis-deadline",
            "200ms",
        ],
    );
    let guarded =
        LimiterProcess::start(FAIL_CLOSED, &["--redis", &url, "--redis-deadline", "100ms"]);
    let mut conn = redis.connection();
    redis::cmd("SLOWLOG")
        .arg("RESET")
        .query::<()>(&mut conn)
        .unwrap();

    // The second limiter's fail_mode: closed rule, checked every 10 ms.
    let flooding = Arc::new(AtomicBool::new(true));
    let probe = {
        let (flooding, url) = (flooding.clone(), guarded.grpc_url());
        tokio::spawn(async move {
            let mut client = LimiterClient::connect(url).await.unwrap();
            let mut reasons: HashMap<String, u64> = HashMap::new();
            while flooding.load(Ordering::Relaxed) {
                let check = Check {
                    domain: "api".into(),
                    rule: "guarded".into(),
                    key: "acct-1".into(),
                    cost: 1,
                    ..Default::default()
                };
                let r = client
                    .check(CheckRequest {
                        checks: vec![check],
                    })
                    .await;
                let reason = match r {
                    Ok(r) => r.into_inner().decisions[0].reason.clone(),
                    Err(status) => format!("grpc error {}", status.code()),
                };
                *reasons.entry(reason).or_default() += 1;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            reasons
        })
    };

    // The flood: 4 connections, batches of 200 never-repeated keys, 6 s.
    let counted = Arc::new(AtomicU64::new(0));
    let sent = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let flood = Duration::from_secs(6);
    let floods: Vec<_> = (0..4)
        .map(|task| {
            let (counted, sent, url) = (counted.clone(), sent.clone(), flooded.grpc_url());
            tokio::spawn(async move {
                let mut client = LimiterClient::connect(url).await.unwrap();
                let mut n = 0u64;
                while started.elapsed() < flood {
                    let checks = (0..200)
                        .map(|_| {
                            n += 1;
                            Check {
                                domain: "api".into(),
                                rule: "flood".into(),
                                key: format!("v{task}-{n}"),
                                cost: 1,
                                ..Default::default()
                            }
                        })
                        .collect();
                    let decisions = client
                        .check(CheckRequest { checks })
                        .await
                        .unwrap()
                        .into_inner()
                        .decisions;
                    sent.fetch_add(decisions.len() as u64, Ordering::Relaxed);
                    // Admitted by Redis or by the local view: counted in
                    // Redis once flushed. fail_open answers are not counted.
                    let stored = decisions
                        .iter()
                        .filter(|d| d.allowed && d.reason.is_empty())
                        .count();
                    counted.fetch_add(stored as u64, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for f in floods {
        f.await.unwrap();
    }
    let flooded_for = started.elapsed();
    let sent = sent.load(Ordering::Relaxed);
    let counted = counted.load(Ordering::Relaxed);
    let rss = rss_kb(flooded.pid());
    let slowlog: Vec<(u64, u64, u64, Vec<String>)> = redis::cmd("SLOWLOG")
        .arg("GET")
        .arg(1024)
        .query::<Vec<redis::Value>>(&mut conn)
        .unwrap()
        .into_iter()
        .map(|entry| {
            let redis::Value::Array(fields) = entry else {
                panic!("slowlog entry {entry:?}")
            };
            let int = |v: &redis::Value| match v {
                redis::Value::Int(i) => *i as u64,
                other => panic!("slowlog field {other:?}"),
            };
            let args: Vec<String> = redis::from_redis_value(fields[3].clone()).unwrap();
            (int(&fields[0]), int(&fields[1]), int(&fields[2]), args)
        })
        .collect();
    let (slowest_us, slowest) = slowlog
        .iter()
        .max_by_key(|e| e.2)
        .map(|e| {
            (
                e.2,
                e.3.iter().take(3).cloned().collect::<Vec<_>>().join(" "),
            )
        })
        .unwrap_or_default();
    let largest_flush = slowlog
        .iter()
        .filter(|e| {
            e.3.first()
                .is_some_and(|c| c.eq_ignore_ascii_case("evalsha"))
        })
        .filter_map(|e| e.3.get(2)?.parse::<u64>().ok())
        .max()
        .unwrap_or(0);
    // The last deltas reach Redis within about sync_interval (50 ms). (After
    // the slowlog is read: the SCANs below are slow commands of the test's own.)
    let mut stored = HashMap::new();
    let settle = Instant::now() + Duration::from_secs(5);
    while Instant::now() < settle {
        stored = counters(&mut conn, "mr:{api|visitor:*}:fw:*");
        if stored.values().sum::<u64>() >= counted {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    flooding.store(false, Ordering::Relaxed);
    let reasons = probe.await.unwrap();

    let untracked = metric(&flooded, "meridian_approx_untracked_checks_total").await;
    let tracked = metric(&flooded, "meridian_approx_tracked_keys").await;
    let max_counter = stored.values().copied().max().unwrap_or(0);
    println!(
        "flood: {sent} checks of never-repeated keys in {flooded_for:?}; {counted} counted, {} in Redis \
         over {} keys (max {max_counter}); {untracked} took the exact path, {tracked} tracked; \
         RSS {rss} kB; slowest Redis command {slowest_us} µs ({slowest} …); largest flush in the slowlog \
         {largest_flush} keys; second limiter's reasons {reasons:?}",
        stored.values().sum::<u64>(),
        stored.len(),
    );

    assert!(
        sent > 2 * MAX_KEYS,
        "the flood outgrew the map: {sent} keys"
    );
    assert!(untracked > 0.0, "keys beyond the map took the exact path");
    assert!(tracked <= MAX_KEYS as f64, "tracked {tracked} > {MAX_KEYS}");
    assert!(rss < RSS_CAP_KB, "limiter RSS {rss} kB after the flood");
    assert!(slowest_us < 50_000, "slowest Redis command {slowest_us} µs");
    assert!(largest_flush <= 129, "a flush of {largest_flush} keys");
    assert!(max_counter <= 1, "a key sent once counts {max_counter}");
    assert_eq!(
        stored.values().sum::<u64>(),
        counted,
        "every admitted hit counted once"
    );
    let probes: u64 = reasons.values().sum();
    assert!(probes >= 100, "second limiter probed {probes} times");
    assert_eq!(
        reasons.keys().collect::<Vec<_>>(),
        [""],
        "the fail_mode: closed rule was decided from Redis every time"
    );
}

/// One pod on `url` with Redis deadline `deadline` and at most `max_keys`
/// tracked counters.
async fn pod(url: &str, rules: &str, deadline: Duration, max_keys: usize) -> Limiter {
    let mut config = RedisConfig::new(url);
    config.deadline = deadline;
    let store = RedisStore::connect(&config).await.expect("connect");
    Limiter::builder()
        .rules_yaml("rules.yaml", rules)
        .store(store)
        .engine_config(EngineConfig {
            approximate_max_keys: max_keys,
            ..EngineConfig::default()
        })
        .build()
        .expect("rules")
}

/// Flushes only when asked (sync_interval an hour, max_batch far away).
const ON_DEMAND: &str = r#"
domain: api
descriptors:
  - key: customer
    accuracy: approximate
    sync_interval: 1h
    max_batch: 1000
    rate_limit:
      name: per_customer
      unit: hour
      requests_per_unit: 100000
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_beyond_max_keys_take_the_exact_path_and_lose_nothing() {
    let redis = RedisServer::start();
    let mut conn = redis.connection();
    let pod = pod(&redis.url(), ON_DEMAND, Duration::from_secs(2), 100).await;
    for n in 0..300 {
        let key = format!("c{n}");
        let v = pod
            .check("api", &[("customer", &key)], 1)
            .await
            .unwrap()
            .unwrap();
        assert_eq!((v.source, v.decision.allowed), (Source::Store, true));
    }
    // The first 100 keys are tracked (their hits wait for a flush); the
    // other 200 went to Redis one script each.
    let before = counters(&mut conn, "mr:{api|customer:*}:fw:*");
    assert_eq!(before.len(), 200, "exact-path keys in Redis before a flush");
    assert!(
        before.keys().all(|k| key_number(k) >= 100),
        "the untracked keys are the ones that came after the map was full"
    );
    pod.flush().await.unwrap();
    let after = counters(&mut conn, "mr:{api|customer:*}:fw:*");
    assert_eq!(after.len(), 300);
    assert!(after.values().all(|&v| v == 1), "each key counted once");
    // A tracked key stays on the approximate path: its second hit waits locally.
    pod.check("api", &[("customer", "c7")], 1)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        counters(&mut conn, "mr:{api|customer:*c7}:fw:*")
            .values()
            .sum::<u64>(),
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flush_that_timed_out_after_redis_ran_it_is_not_counted_twice() {
    let redis = RedisServer::start_with(&["--enable-debug-command", "yes"]);
    let mut conn = redis.connection();
    let pod = pod(&redis.url(), ON_DEMAND, Duration::from_millis(100), 1_000).await;
    let check = || pod.check("api", &[("customer", "42")], 1);
    for _ in 0..7 {
        assert!(check().await.unwrap().unwrap().decision.allowed);
    }
    let count = |conn: &mut redis::Connection| -> u64 {
        counters(conn, "mr:{api|customer:*42}:fw:*").values().sum()
    };
    let flush_ids = |conn: &mut redis::Connection| -> usize {
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg("mr:{api|customer:*42}:f:*")
            .query(conn)
            .unwrap();
        keys.len()
    };
    assert_eq!(count(&mut conn), 0, "nothing flushed yet");

    // Redis sleeps 600 ms; the flush sent meanwhile runs when it wakes,
    // long after the pod's 100 ms deadline.
    let sleeper = {
        let mut sleeping = redis.connection();
        std::thread::spawn(move || {
            redis::cmd("DEBUG")
                .arg("SLEEP")
                .arg("0.6")
                .query::<()>(&mut sleeping)
                .unwrap()
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let sent = Instant::now();
    let first = pod.flush().await;
    assert!(
        first.is_err(),
        "the flush timed out: {first:?} after {:?}",
        sent.elapsed()
    );
    // Admitted while the 7 are in flight: a later delta, not that call's.
    for _ in 0..3 {
        let v = check().await.unwrap().unwrap();
        assert_eq!((v.source, v.decision.allowed), (Source::Store, true));
    }
    sleeper.join().unwrap();

    // Redis ran the timed-out call: the 7 are in, once.
    let ran_within = Instant::now() + Duration::from_secs(2);
    while count(&mut conn) < 7 {
        assert!(Instant::now() < ran_within, "the stalled call never ran");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The flusher's retries (same id) and this one apply nothing more; the
    // 3 later hits go in a call of their own.
    pod.flush().await.unwrap();
    assert_eq!(count(&mut conn), 10, "7 + 3 admitted, each counted once");
    assert_eq!(
        flush_ids(&mut conn),
        2,
        "every send of the 7 carried one id; the 3 another"
    );
    // The pod's view agrees: the global read back is 10.
    let v = pod
        .check("api", &[("customer", "42")], 0)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(v.decision.remaining, 100_000 - 10);
}
