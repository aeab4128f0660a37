//! RedisStore against real redis-server processes: atomicity under
//! concurrency, boundary behaviour, TTLs, the server clock, script reloads,
//! faults, and key isolation.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::RedisServer;
use meridian::algorithm::{Algorithm, DenyReason, Params};
use meridian::store::{Limit, MemoryStore, RedisConfig, RedisStore, Store, StoreError};
use redis::Commands;

/// A window boundary for every period these tests use.
const EDGE: u64 = 1_800_000_000_000_000;

fn limit(rule: &str, algorithm: Algorithm, n: i64, period: Duration) -> Limit {
    Limit {
        rule: rule.into(),
        params: Params::new(algorithm, n, period, None).expect("valid params"),
    }
}

async fn connect(server: &RedisServer) -> RedisStore {
    RedisStore::connect(&RedisConfig::new(server.url()))
        .await
        .expect("connect to test redis")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_checks_admit_exactly_the_limit() {
    let server = RedisServer::start();
    let mut stores = Vec::new();
    for _ in 0..8 {
        stores.push(Arc::new(connect(&server).await));
    }
    for algorithm in Algorithm::ALL {
        let l = Arc::new(limit("hammer", algorithm, 1000, Duration::from_secs(3600)));
        let admitted = Arc::new(AtomicU64::new(0));
        let tasks: Vec<_> = (0..64)
            .map(|i| {
                let (store, l, admitted) = (stores[i % 8].clone(), l.clone(), admitted.clone());
                tokio::spawn(async move {
                    for _ in 0..25 {
                        let d = store
                            .check(&l, "one-key", 1, Some(EDGE))
                            .await
                            .expect("check");
                        if d.allowed {
                            admitted.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.expect("task");
        }
        assert_eq!(admitted.load(Ordering::Relaxed), 1000, "{algorithm}");
    }
}

/// Admitted hits in the 2 ms around a window edge, L before and L after.
async fn admitted_across_edge(store: &impl Store, algorithm: Algorithm) -> usize {
    let l = limit("edge", algorithm, 100, Duration::from_secs(10));
    let mut admitted = 0;
    for now in [EDGE - 1_000, EDGE + 1_000] {
        for _ in 0..100 {
            if store
                .check(&l, "k", 1, Some(now))
                .await
                .expect("check")
                .allowed
            {
                admitted += 1;
            }
        }
    }
    admitted
}

#[tokio::test]
async fn fixed_window_bursts_across_an_edge_sliding_windows_do_not() {
    let server = RedisServer::start();
    let redis = connect(&server).await;
    let memory = MemoryStore::new();
    for (name, admitted) in [
        (
            "redis",
            admitted_across_edge(&redis, Algorithm::FixedWindow).await,
        ),
        (
            "memory",
            admitted_across_edge(&memory, Algorithm::FixedWindow).await,
        ),
    ] {
        assert_eq!(
            admitted, 200,
            "fixed window on {name} admits 2 × L at the edge"
        );
    }
    for algorithm in [Algorithm::SlidingWindowLog, Algorithm::SlidingWindowCounter] {
        let on_redis = admitted_across_edge(&redis, algorithm).await;
        let in_memory = admitted_across_edge(&memory, algorithm).await;
        assert_eq!(on_redis, in_memory, "{algorithm}");
        // The counter weighs the previous window at 99.98 %: at most one extra hit.
        assert!(
            on_redis <= 101,
            "{algorithm} admitted {on_redis} of 200 at the edge"
        );
    }
}

#[tokio::test]
async fn every_key_expires_no_later_than_its_algorithm_needs() {
    let server = RedisServer::start();
    let store = connect(&server).await;
    let mut conn = server.connection();
    let period = Duration::from_secs(60);
    for algorithm in Algorithm::ALL {
        let l = Limit {
            rule: format!("ttl-{algorithm}"),
            params: Params::new(algorithm, 10, period, algorithm.has_burst().then_some(5))
                .expect("params"),
        };
        let d = store.check(&l, "k", 1, None).await.expect("check");
        assert!(d.allowed);
        let keys: Vec<String> = conn
            .keys(format!("mr:{{ttl-{algorithm}:k}}*"))
            .expect("KEYS");
        assert!(!keys.is_empty(), "{algorithm} wrote no key");
        for key in keys {
            let pttl: i64 = conn.pttl(&key).expect("PTTL");
            let bound = match algorithm {
                // Read as "previous" through the next window.
                Algorithm::SlidingWindowCounter => 2 * period.as_millis() as i64,
                // Until the bucket is full again: one token at 10/min is 6 s.
                Algorithm::TokenBucket | Algorithm::LeakyBucket => {
                    d.reset_after().as_millis() as i64 + 1
                }
                _ => period.as_millis() as i64,
            };
            assert!(
                pttl > 0 && pttl <= bound,
                "{key}: PTTL {pttl} ms, bound {bound} ms"
            );
        }
    }
}

#[tokio::test]
async fn windows_follow_the_redis_clock_without_a_timestamp() {
    let server = RedisServer::start();
    let store = connect(&server).await;
    let mut conn = server.connection();
    let server_us = |conn: &mut redis::Connection| -> u64 {
        let (s, us): (u64, u64) = redis::cmd("TIME").query(conn).expect("TIME");
        s * 1_000_000 + us
    };
    let l = limit(
        "clock",
        Algorithm::FixedWindow,
        5,
        Duration::from_millis(250),
    );
    let before = server_us(&mut conn) / 250_000;
    store.check(&l, "k", 1, None).await.expect("check");
    let after = server_us(&mut conn) / 250_000;
    let keys: Vec<String> = conn.keys("mr:{clock:k}:fw:*").expect("KEYS");
    let window: u64 = keys[0]
        .rsplit(':')
        .next()
        .and_then(|w| w.parse().ok())
        .expect("index");
    assert!(
        (before..=after).contains(&window),
        "{window} not in {before}..={after}"
    );
    // A caller's timestamp names its own window instead.
    store.check(&l, "k", 1, Some(EDGE)).await.expect("check");
    let own: bool = conn
        .exists(format!("mr:{{clock:k}}:fw:{}", EDGE / 250_000))
        .expect("EXISTS");
    assert!(own);
}

#[tokio::test]
async fn peeks_consume_nothing_and_see_a_shrunk_limit() {
    let server = RedisServer::start();
    let store = connect(&server).await;
    for algorithm in Algorithm::ALL {
        let rule = format!("peek-{algorithm}");
        let l = Limit {
            rule: rule.clone(),
            params: Params::new(algorithm, 3, Duration::from_secs(60), None).expect("params"),
        };
        for _ in 0..5 {
            let d = store.peek(&l, "k", Some(EDGE)).await.expect("peek");
            assert!(d.allowed && d.remaining == 3, "{algorithm}: {d:?}");
        }
        for _ in 0..3 {
            assert!(
                store
                    .check(&l, "k", 1, Some(EDGE))
                    .await
                    .expect("check")
                    .allowed
            );
        }
        let d = store.peek(&l, "k", Some(EDGE)).await.expect("peek");
        assert!(
            d.allowed && d.remaining == 0,
            "{algorithm} at the limit: {d:?}"
        );
        if algorithm.has_burst() {
            continue; // an empty bucket is not "over"; it just has no tokens
        }
        // The limit shrinks under the key (a smaller allocation): now it is over.
        let shrunk = Limit {
            rule,
            params: Params::new(algorithm, 2, Duration::from_secs(60), None).expect("params"),
        };
        let d = store.peek(&shrunk, "k", Some(EDGE)).await.expect("peek");
        assert!(!d.allowed, "{algorithm} over a shrunk limit: {d:?}");
    }
}

#[tokio::test]
async fn flushed_script_cache_is_reloaded() {
    let server = RedisServer::start();
    let store = connect(&server).await;
    let l = limit("flush", Algorithm::TokenBucket, 3, Duration::from_secs(60));
    assert!(store.check(&l, "k", 1, None).await.expect("check").allowed);
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query(&mut server.connection())
        .expect("flush");
    let d = store
        .check(&l, "k", 1, None)
        .await
        .expect("check after SCRIPT FLUSH");
    assert_eq!(d.remaining, 1, "state survived, script reloaded");
}

#[tokio::test]
async fn frozen_redis_fails_within_the_deadline_then_recovers() {
    let server = RedisServer::start();
    let mut config = RedisConfig::new(server.url());
    config.deadline = Duration::from_millis(200);
    let store = RedisStore::connect(&config).await.expect("connect");
    let l = limit(
        "freeze",
        Algorithm::FixedWindow,
        100,
        Duration::from_secs(60),
    );
    store.check(&l, "k", 1, None).await.expect("check");

    server.pause();
    let started = Instant::now();
    let err = store
        .check(&l, "k", 1, None)
        .await
        .expect_err("frozen redis must not answer");
    assert!(matches!(err, StoreError::Timeout(_)), "{err:?}");
    assert!(err.is_transient());
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );

    server.resume();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match store.check(&l, "k", 1, None).await {
            Ok(d) => break assert!(d.allowed),
            Err(e) if Instant::now() < deadline => {
                assert!(e.is_transient(), "{e:?}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("no recovery after resume: {e:?}"),
        }
    }
}

#[tokio::test]
async fn killed_redis_is_a_transient_error() {
    let mut server = RedisServer::start();
    let store = connect(&server).await;
    let l = limit(
        "kill",
        Algorithm::SlidingWindowCounter,
        100,
        Duration::from_secs(60),
    );
    store.check(&l, "k", 1, None).await.expect("check");
    server.kill();
    let err = store
        .check(&l, "k", 1, None)
        .await
        .expect_err("dead redis must not answer");
    assert!(err.is_transient(), "{err:?}");
}

#[tokio::test]
async fn bad_input_is_typed_and_names_the_field() {
    let server = RedisServer::start();
    let store = connect(&server).await;
    let l = limit("bad", Algorithm::FixedWindow, 10, Duration::from_secs(60));
    match store.check(&l, "k", 0, None).await {
        Err(StoreError::InvalidInput(e)) => assert_eq!((e.field, e.value.as_str()), ("cost", "0")),
        other => panic!("cost 0: {other:?}"),
    }
    match store.check(&l, &"x".repeat(513), 1, None).await {
        Err(StoreError::InvalidInput(e)) => assert_eq!(e.field, "key"),
        other => panic!("long key: {other:?}"),
    }
    let d = store
        .check(&l, "k", 11, None)
        .await
        .expect("over-capacity cost is a decision");
    assert!(!d.allowed);
    assert_eq!(
        d.reason,
        Some(DenyReason::CostExceedsCapacity {
            cost: 11,
            capacity: 10
        })
    );
    let keys: Vec<String> = server.connection().keys("mr:*").expect("KEYS");
    assert!(keys.is_empty(), "rejected checks wrote {keys:?}");
}

/// (rule, key) pairs built to collide if escaping or the hash tag were wrong.
pub const CRAFTED: [(&str, &str); 9] = [
    ("r", "a}{b"),
    ("r", "a"),
    ("r", "b"),
    ("r", "{a}"),
    ("r", "a:b"),
    ("r:a", "b"),
    ("r", "%7D"),
    ("r", "}"),
    ("r}", ""),
];

#[tokio::test]
async fn crafted_keys_never_share_state() {
    let server = RedisServer::start();
    let store = connect(&server).await;
    for algorithm in Algorithm::ALL {
        for (rule, key) in CRAFTED {
            let l = limit(rule, algorithm, 1, Duration::from_secs(60));
            let d = store.check(&l, key, 1, None).await.expect("check");
            assert!(
                d.allowed,
                "{algorithm} ({rule:?}, {key:?}) saw another key's hit"
            );
        }
    }
    let keys: Vec<String> = server.connection().keys("mr:*").expect("KEYS");
    // Every (rule, key, algorithm) has its own state (the sliding log has two keys).
    assert_eq!(
        keys.len(),
        CRAFTED.len() * (Algorithm::ALL.len() + 1),
        "{keys:#?}"
    );
}

#[tokio::test]
async fn tls_redis_is_reached_with_the_given_ca_and_refused_without_it() {
    let certs = tempfile::tempdir().expect("temp dir");
    let (ca, cert, key) = common::make_tls_certs(certs.path());
    // A TLS-only server: the plain port is closed, the TLS port is `--port`'s value.
    let plain = RedisServer::start();
    let tls_port = plain.port() + 1;
    drop(plain);
    let server = RedisServer::start_with(&[
        "--tls-port",
        &tls_port.to_string(),
        "--tls-cert-file",
        cert.to_str().expect("utf-8 path"),
        "--tls-key-file",
        key.to_str().expect("utf-8 path"),
        "--tls-ca-cert-file",
        ca.to_str().expect("utf-8 path"),
        "--tls-auth-clients",
        "no",
    ]);
    let url = format!("rediss://127.0.0.1:{tls_port}");
    let mut config = RedisConfig::new(&url);
    config.ca_cert = Some(std::fs::read(&ca).expect("read ca"));
    let store = RedisStore::connect(&config)
        .await
        .expect("TLS connect with the CA");
    let l = limit("tls", Algorithm::FixedWindow, 1, Duration::from_secs(60));
    assert!(
        store
            .check(&l, "k", 1, None)
            .await
            .expect("check over TLS")
            .allowed
    );
    assert!(
        !store
            .check(&l, "k", 1, None)
            .await
            .expect("check over TLS")
            .allowed
    );
    let keys: Vec<String> = server.connection().keys("mr:{tls:k}*").expect("KEYS");
    assert_eq!(keys.len(), 1, "the check reached the TLS server");

    // Without our CA the server's certificate is not trusted.
    let untrusted = RedisStore::connect(&RedisConfig::new(&url)).await;
    assert!(
        untrusted.is_err(),
        "connected to a server signed by an unknown CA"
    );
}

#[tokio::test]
async fn credentials_in_the_url_authenticate() {
    let server = RedisServer::start_with(&["--requirepass", "s3cret"]);
    let port = server.port();
    let with = RedisConfig::new(format!("redis://:s3cret@127.0.0.1:{port}"));
    let store = RedisStore::connect(&with)
        .await
        .expect("connect with password");
    let l = limit("auth", Algorithm::FixedWindow, 1, Duration::from_secs(60));
    assert!(
        store
            .check(&l, "k", 1, None)
            .await
            .expect("authenticated check")
            .allowed
    );

    let without = RedisConfig::new(format!("redis://127.0.0.1:{port}"));
    let denied = match RedisStore::connect(&without).await {
        Err(e) => Some(e),
        Ok(store) => store.check(&l, "k", 1, None).await.err(),
    };
    let e = denied.expect("a server with requirepass must refuse an unauthenticated client");
    assert!(e.to_string().to_lowercase().contains("auth"), "{e}");
}

/// Evaluated calls of each script so far, from `INFO commandstats`.
fn evalsha_calls(server: &RedisServer) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut server.connection())
        .expect("INFO commandstats");
    info.lines()
        .find_map(|l| l.strip_prefix("cmdstat_evalsha:calls="))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().expect("a call count"))
}

#[tokio::test]
async fn concurrent_checks_share_script_calls_and_decide_as_if_alone() {
    let server = RedisServer::start();
    let store = connect(&server).await;
    let memory = MemoryStore::new();
    // Several algorithms, keys and costs (0 = peek) in one burst: the store
    // groups them into calls, which must decide each in arrival order exactly
    // as the embedded store does one at a time.
    let limits: Vec<Limit> = Algorithm::ALL
        .iter()
        .map(|&a| limit(&format!("burst-{a:?}"), a, 7, Duration::from_secs(60)))
        .collect();
    let checks: Vec<(usize, String, u64)> = (0..300)
        .map(|i| (i % limits.len(), format!("k{}", i % 3), [1, 1, 2, 0][i % 4]))
        .collect();
    let before = evalsha_calls(&server);
    let from_redis = futures::future::join_all(checks.iter().map(|(l, key, cost)| {
        let (l, store) = (&limits[*l], &store);
        async move {
            if *cost == 0 {
                store.peek(l, key, Some(EDGE)).await
            } else {
                store.check(l, key, *cost, Some(EDGE)).await
            }
        }
    }))
    .await;
    let calls = evalsha_calls(&server) - before;
    for ((l, key, cost), redis) in checks.iter().zip(from_redis) {
        let l = &limits[*l];
        let memory = if *cost == 0 {
            memory.peek(l, key, Some(EDGE)).await
        } else {
            memory.check(l, key, *cost, Some(EDGE)).await
        };
        assert_eq!(
            redis.expect("redis decides"),
            memory.expect("memory decides"),
            "{:?} key {key} cost {cost}",
            l.params.algorithm()
        );
    }
    // 300 checks of 5 algorithms: at most 64 per call, so at least 5 calls;
    // one call per check would be 300.
    assert!(
        (5..=30).contains(&calls),
        "300 concurrent checks took {calls} script calls"
    );
}

#[tokio::test]
async fn fixed_window_denials_leave_the_counter_and_its_ttl_as_they_were() {
    let server = RedisServer::start();
    let store = connect(&server).await;
    let l = limit("undo", Algorithm::FixedWindow, 3, Duration::from_secs(60));
    for _ in 0..3 {
        assert!(store.check(&l, "k", 1, None).await.expect("check").allowed);
    }
    // The script counts first and takes a denied hit back: the count stays
    // at what was admitted and the window keeps its expiry.
    for cost in [1, 2, 3] {
        let d = store.check(&l, "k", cost, None).await.expect("check");
        assert!(!d.allowed && d.remaining == 0, "cost {cost}: {d:?}");
    }
    let mut conn = server.connection();
    let keys: Vec<String> = conn.keys("mr:{undo:k}:fw:*").expect("KEYS");
    assert_eq!(keys.len(), 1, "{keys:?}");
    let count: u64 = conn.get(&keys[0]).expect("GET");
    let ttl_ms: i64 = conn.pttl(&keys[0]).expect("PTTL");
    assert_eq!(count, 3);
    assert!(ttl_ms > 0 && ttl_ms <= 60_000, "PTTL {ttl_ms}");
}

#[tokio::test]
async fn checks_one_at_a_time_each_send_their_own_call() {
    let server = RedisServer::start();
    let store = connect(&server).await;
    let l = limit(
        "alone",
        Algorithm::SlidingWindowCounter,
        5,
        Duration::from_secs(60),
    );
    let before = evalsha_calls(&server);
    let mut allowed = 0;
    for _ in 0..8 {
        allowed += usize::from(store.check(&l, "k", 1, None).await.expect("check").allowed);
    }
    // Nothing else in flight: each check goes straight out, still one
    // script call (and one atomic decision) each.
    assert_eq!(evalsha_calls(&server) - before, 8);
    assert_eq!(allowed, 5);
}

/// A global allocation moves under a bucket: its level is converted to the
/// new limit's scale, and no time is credited. Read in the old scale, a grow
/// refilled the whole burst at once (the token bucket over B + R·T in
/// tests/integration/global_shift.rs).
#[tokio::test]
async fn a_bucket_whose_limit_changes_gets_no_tokens_from_the_change() {
    let server = RedisServer::start();
    let store = connect(&server).await;
    let bucket = |algorithm, n| Limit {
        rule: "moving".into(),
        params: Params::new(algorithm, n, Duration::from_secs(60), Some(10)).expect("params"),
    };
    for algorithm in [Algorithm::TokenBucket, Algorithm::LeakyBucket] {
        let key = format!("k-{algorithm}");
        // 7 a minute, burst 10: empty it.
        let small = bucket(algorithm, 7);
        let mut admitted = 0;
        for _ in 0..10 {
            if store
                .check(&small, &key, 1, Some(EDGE))
                .await
                .expect("check")
                .allowed
            {
                admitted += 1;
            }
        }
        assert_eq!(admitted, 10, "{algorithm}: the burst");
        // The allocation grows to 600 a minute, burst still 10, 1 ms later:
        // at most the new rate's refill of 1 ms (0.01 of a hit) is due.
        let big = bucket(algorithm, 600);
        let d = store
            .check(&big, &key, 1, Some(EDGE + 1_000))
            .await
            .expect("check");
        assert!(!d.allowed, "{algorithm}: a grow refilled the bucket: {d:?}");
        // Refill goes on at the new rate: 10 hits a second.
        let d = store
            .check(&big, &key, 1, Some(EDGE + 201_000))
            .await
            .expect("check");
        assert!(d.allowed, "{algorithm}: no refill at the new rate: {d:?}");
    }
}

/// The region's allocation table (`mr:allocation:{<region>}`) is written
/// compare-and-set by epoch: an older epoch of the same cluster never
/// replaces a newer one, another cluster's table is replaced, and the key
/// expires when the caller says. Run on a standalone server here and on a
/// Cluster in `cluster.rs`.
pub(crate) async fn the_allocation_table_is_kept_compare_and_set_by_epoch(store: &RedisStore) {
    use meridian::store::redis::StoredTable;
    let table = |cluster: &str, epoch: u64, text: &str| StoredTable {
        cluster: cluster.into(),
        epoch,
        table: text.as_bytes().to_vec(),
    };
    let expire = |s: i64| now_ms() + s * 1_000;
    assert_eq!(store.load_table("mumbai").await.expect("load"), None);
    assert_eq!(
        store
            .save_table("mumbai", &table("c1", 7, "seven"), expire(60))
            .await
            .expect("save"),
        7
    );
    // A pod that applies an older epoch late keeps the newer table.
    assert_eq!(
        store
            .save_table("mumbai", &table("c1", 6, "six"), expire(60))
            .await
            .expect("save"),
        7
    );
    assert_eq!(
        store
            .save_table("mumbai", &table("c1", 7, "seven again"), expire(60))
            .await
            .expect("save"),
        7
    );
    assert_eq!(
        store.load_table("mumbai").await.expect("load"),
        Some(table("c1", 7, "seven"))
    );
    assert_eq!(
        store.saved_table_epoch("mumbai").await.expect("epoch"),
        Some(("c1".into(), 7))
    );
    assert_eq!(
        store
            .save_table("mumbai", &table("c1", 8, "eight"), expire(60))
            .await
            .expect("save"),
        8
    );
    // Another cluster's epochs say nothing about this one's.
    assert_eq!(
        store
            .save_table("mumbai", &table("c2", 1, "one"), expire(60))
            .await
            .expect("save"),
        1
    );
    assert_eq!(
        store.load_table("mumbai").await.expect("load"),
        Some(table("c2", 1, "one"))
    );
    // Regions apart; a table too large to keep leaves its epoch and no table.
    assert_eq!(store.load_table("hyderabad").await.expect("load"), None);
    let none = table("c2", 2, "");
    assert_eq!(
        store
            .save_table("mumbai", &none, expire(60))
            .await
            .expect("save"),
        2
    );
    assert_eq!(store.load_table("mumbai").await.expect("load"), Some(none));
    // Expired when the table can admit nothing any more.
    let gone = table("c2", 3, "three");
    let saved = store.save_table("mumbai", &gone, expire(-1)).await;
    assert_eq!(saved.expect("save"), 3);
    assert_eq!(store.load_table("mumbai").await.expect("load"), None);
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_allocation_table_is_kept_compare_and_set_by_epoch_on_a_server() {
    let server = RedisServer::start();
    let store = connect(&server).await;
    the_allocation_table_is_kept_compare_and_set_by_epoch(&store).await;
    let ttl: i64 = server
        .connection()
        .pttl("mr:allocation:{mumbai}")
        .expect("PTTL");
    assert_eq!(ttl, -2, "the expired table is gone");
}
