//! A Redis Cluster master killed (kill -9) under load: its replica is
//! promoted, the limiter answers every check throughout (the rule's fail
//! mode during the gap), and the counts the dead master had not yet
//! replicated are measured.
//!
//! Counting: the rule is a fixed window with a limit no test reaches, so an
//! answer from Redis says exactly how many hits its counter holds
//! (`limit - remaining`). Before the kill each key's highest count seen is
//! what the old master acknowledged; the first count after it, less the hit
//! that made it, is what the new master held. The difference is lost.

use crate::common;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::RedisCluster;
use common::limiter::LimiterProcess;
use serde_json::{Value, json};

const LIMIT: u64 = 1_000_000_000;
const USERS: usize = 240;
const BATCH: usize = 60;
const WORKERS: usize = 4;
/// Load before the kill, and after every key is decided by Redis again.
const STEADY: Duration = Duration::from_millis(1500);
/// Longest the promotion may take before the test fails.
const RECOVERY: Duration = Duration::from_secs(20);

fn rules() -> String {
    format!(
        "domain: api\ndescriptors:\n  - key: user\n    fail_mode: open\n    algorithm: fixed_window\n    \
         rate_limit: {{name: per-user, unit: hour, requests_per_unit: {LIMIT}}}\n"
    )
}

/// What the load saw, per phase.
#[derive(Default)]
struct Tally {
    /// Highest count Redis reported per user, for checks sent before the kill.
    before: HashMap<String, u64>,
    /// First count Redis reported per user, for checks sent after the kill.
    after: HashMap<String, u64>,
    /// Checks answered by Redis / by the fail mode, sent after the kill.
    from_redis_after: u64,
    fail_mode_after: u64,
    /// Requests the limiter did not answer with a decision (must stay 0).
    errors: Vec<String>,
    /// When every user had a Redis answer again.
    recovered: Option<Instant>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_master_loses_only_unreplicated_counts_and_the_limiter_keeps_answering() {
    let mut cluster = RedisCluster::start_with_replicas();
    let limiter = LimiterProcess::start(&rules(), &["--redis", &cluster.url()]);
    common::clear_of_window_boundary(Duration::from_secs(3600), Duration::from_secs(60)).await;
    let users: Arc<Vec<String>> = Arc::new((0..USERS).map(|i| format!("u-{i}")).collect());
    let tally = Arc::new(Mutex::new(Tally::default()));
    let killed = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let client = common::http_client()
        .timeout(Duration::from_secs(5))
        .build()
        .expect("HTTP client");

    let workers: Vec<_> = (0..WORKERS)
        .map(|w| {
            let (users, tally, killed, stop, client) = (
                users.clone(),
                tally.clone(),
                killed.clone(),
                stop.clone(),
                client.clone(),
            );
            let url = limiter.http_url("/v1/check");
            tokio::spawn(async move {
                let mut next = w * BATCH;
                let started = Instant::now();
                // Bounded in time whatever happens to `stop`.
                while !stop.load(Ordering::Relaxed) && started.elapsed() < Duration::from_secs(60) {
                    let batch: Vec<&String> =
                        (0..BATCH).map(|i| &users[(next + i) % USERS]).collect();
                    next = (next + BATCH * WORKERS) % USERS;
                    let after = killed.load(Ordering::SeqCst);
                    let checks: Vec<Value> = batch
                        .iter()
                        .map(|u| json!({"domain": "api", "descriptor": [{"key": "user", "value": u}]}))
                        .collect();
                    let answer = client
                        .post(&url)
                        .json(&json!({ "checks": checks }))
                        .send()
                        .await;
                    let decisions = match answer {
                        Ok(r) if r.status() == 200 || r.status() == 429 => {
                            r.json::<Value>().await.ok().and_then(|v| {
                                v["decisions"].as_array().cloned()
                            })
                        }
                        Ok(r) => {
                            let status = r.status();
                            let text = r.text().await.unwrap_or_default();
                            tally.lock().expect("tally").errors.push(format!("{status} {text}"));
                            continue;
                        }
                        Err(e) => {
                            tally.lock().expect("tally").errors.push(e.to_string());
                            continue;
                        }
                    };
                    let Some(decisions) = decisions else {
                        tally.lock().expect("tally").errors.push("no decisions".into());
                        continue;
                    };
                    let mut t = tally.lock().expect("tally");
                    for (user, d) in batch.iter().zip(&decisions) {
                        let from_redis = d["reason"] == "";
                        let count = LIMIT - d["remaining"].as_u64().unwrap_or(LIMIT);
                        match (after, from_redis) {
                            (false, true) => {
                                let seen = t.before.entry(user.to_string()).or_default();
                                *seen = (*seen).max(count);
                            }
                            (false, false) => {}
                            (true, true) => {
                                t.from_redis_after += 1;
                                t.after.entry(user.to_string()).or_insert(count);
                            }
                            (true, false) => t.fail_mode_after += 1,
                        }
                    }
                    if after && t.recovered.is_none() && t.after.len() == USERS {
                        t.recovered = Some(Instant::now());
                    }
                }
            })
        })
        .collect();

    tokio::time::sleep(STEADY).await;
    let victim = cluster.masters()[0];
    let on_victim: Vec<String> = redis::cmd("KEYS")
        .arg("mr:*")
        .query(&mut cluster.nodes[victim].connection())
        .expect("KEYS on the master to kill");
    let victim_users: HashSet<String> = users
        .iter()
        .filter(|u| on_victim.iter().any(|k| k.contains(&format!("{u}}}"))))
        .cloned()
        .collect();
    let counted_before: u64 = tally.lock().expect("tally").before.values().sum();
    cluster.nodes[victim].kill();
    let killed_at = Instant::now();
    killed.store(true, Ordering::SeqCst);

    let recovered = loop {
        tokio::time::sleep(Duration::from_millis(50)).await;
        if let Some(at) = tally.lock().expect("tally").recovered {
            break at;
        }
        if killed_at.elapsed() > RECOVERY {
            let (decided, fail_mode) = {
                let t = tally.lock().expect("tally");
                (t.after.len(), t.fail_mode_after)
            };
            panic!(
                "not every user was decided by Redis again within {RECOVERY:?} of the kill: \
                 {decided} of {USERS} were, {fail_mode} fail-mode answers; masters now {:?} \
                 (killed {victim}); limiter metrics: {}",
                cluster.masters(),
                store_errors(&limiter).await,
            );
        }
    };
    tokio::time::sleep(STEADY).await;
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.await.expect("load worker");
    }

    let t = tally.lock().expect("tally");
    assert!(
        t.errors.is_empty(),
        "the limiter failed requests: {:?}",
        &t.errors[..t.errors.len().min(5)]
    );
    let mut lost = 0;
    let mut lost_keys = 0;
    let mut on_victim_counted = 0;
    for (user, &before) in &t.before {
        let held = t.after.get(user).map_or(0, |first| first.saturating_sub(1));
        if victim_users.contains(user) {
            on_victim_counted += before;
        }
        if before > held {
            assert!(
                victim_users.contains(user),
                "{user} lost counts but lived on a surviving master"
            );
            lost += before - held;
            lost_keys += 1;
        }
    }
    assert!(!victim_users.is_empty(), "the killed master held no user");
    let mut limiter = limiter;
    assert!(limiter.is_running(), "the limiter exited");
    eprintln!(
        "cluster failover: {} hits counted in {STEADY:?} before the kill ({on_victim_counted} on the killed master, {} users); \
         every user decided by Redis again {:?} after kill -9; {} fail-mode answers, {} from Redis after the kill; \
         lost {lost} counts on {lost_keys} users ({:.3} % of the killed master's)",
        counted_before,
        victim_users.len(),
        recovered - killed_at,
        t.fail_mode_after,
        t.from_redis_after,
        100.0 * lost as f64 / on_victim_counted.max(1) as f64,
    );
}

/// The limiter's store error and breaker series, for a failure message.
async fn store_errors(limiter: &LimiterProcess) -> String {
    let text = match common::http_get(limiter.http_url("/metrics")).await {
        Ok(r) => r.text().await.unwrap_or_default(),
        Err(e) => return e.to_string(),
    };
    text.lines()
        .filter(|l| {
            l.starts_with("meridian_store_errors_total") || l.starts_with("meridian_store_breaker")
        })
        .collect::<Vec<_>>()
        .join("; ")
}
