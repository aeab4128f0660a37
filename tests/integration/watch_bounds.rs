//! Watch streams within bounds. A region's allocation snapshot larger than
//! the per-message budget arrives in parts, none over the budget, and a
//! limiter enforces it whole. A node that is not caught up with the leader's
//! commit (stopped, then replaying) refuses watches and ends the ones it
//! had open, so it never serves an old version as current.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use meridian::proto::meridian::v1 as pb;
use meridian::proto::meridian::v1::coordinator_client::CoordinatorClient;
use meridian::proto::meridian::v1::limiter_client::LimiterClient;
use tokio_stream::StreamExt;

use common::RedisServer;
use common::coordinator::{Cluster, Options};
use common::limiter::LimiterProcess;

/// The coordinator's per-message budget in the split test: small, so a few
/// thousand key entries make a snapshot of many parts.
const BUDGET: usize = 16 * 1024;
const RULES: usize = 3;
const KEYS: usize = 1_000;

fn global_rules() -> String {
    let mut text = String::from("domain: api\ndescriptors:\n");
    for r in 0..RULES {
        text.push_str(&format!(
            "  - key: c{r}
    scope: global
    algorithm: fixed_window
    period: 4s
    rate_limit:
      name: c{r}
      requests_per_unit: 100000
"
        ));
    }
    text
}

fn key(k: usize) -> String {
    format!("customer-{k:04}-with-a-long-enough-name")
}

/// Demand that gives every key of every rule its own entry: mumbai asks far
/// more than its half for each key, hyderabad as much in all, on no key.
/// `epoch`: the acknowledgement (the epoch the last reply named), so grows
/// that wait for the other region's shrink go ahead.
fn report(region: &str, epoch: u64) -> pb::DemandReport {
    let rules = (0..RULES)
        .map(|r| pb::RuleDemand {
            rule: format!("api|c{r}"),
            keys: if region == "mumbai" {
                (0..KEYS)
                    .map(|k| pb::KeyDemand {
                        key: key(k),
                        asked: 100_000,
                        allowed: 50_000,
                    })
                    .collect()
            } else {
                Vec::new()
            },
            remainder_asked: if region == "mumbai" { 0 } else { 100_000_000 },
            remainder_allowed: if region == "mumbai" { 0 } else { 50_000_000 },
        })
        .collect();
    pb::DemandReport {
        region: region.into(),
        pod: format!("{region}-load"),
        epoch,
        interval_ms: 1_000,
        rules,
        ..Default::default()
    }
}

/// Sends both regions' demand every 500 ms, as one pod each that holds
/// what it was last told, until the flag drops.
fn keep_reporting(cluster: &Cluster, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<()> {
    let mut client = CoordinatorClient::new(cluster.channel(1));
    tokio::spawn(async move {
        let mut epoch = 0;
        while !stop.load(Ordering::Relaxed) {
            for region in ["mumbai", "hyderabad"] {
                match client.report(report(region, epoch)).await {
                    Ok(reply) => epoch = epoch.max(reply.into_inner().epoch),
                    Err(e) => eprintln!("report refused: {e}"),
                }
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    })
}

/// What the coordinator grants mumbai for `key` of `rule` (None: no entry).
async fn granted(cluster: &Cluster, rule: &str, key: &str) -> Option<u64> {
    let rule = rule.replace('|', "%7C");
    let path = format!("/api/v1/allocations?rule={rule}&key={key}");
    let (_, body) = cluster.get(1, &path).await?;
    if body["source"] != "key_entry" {
        return None;
    }
    body["shares"]["mumbai"]["granted"].as_u64()
}

/// The limit the limiter enforces for `key` of rule `c{r}` now.
async fn enforced(limiter: &LimiterProcess, rule: &str, key: &str) -> Option<u64> {
    let mut client = LimiterClient::connect(limiter.grpc_url()).await.ok()?;
    let reply = client
        .check(pb::CheckRequest {
            checks: vec![pb::Check {
                domain: "api".into(),
                rule: rule.into(),
                key: key.into(),
                check_only: true,
                ..Default::default()
            }],
        })
        .await
        .ok()?
        .into_inner();
    let decision = reply.decisions.first()?;
    decision.matched.then_some(decision.limit)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_over_the_message_budget_arrives_in_parts_and_is_enforced_whole() {
    let options = Options {
        extra_args: [
            "--watch-message-bytes",
            &BUDGET.to_string(),
            "--rebalance-interval",
            "1s",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect(),
        ..Options::default()
    };
    let cluster = Cluster::start(1, options).await;
    cluster.register_region(1, "mumbai").await;
    cluster.register_region(1, "hyderabad").await;
    let (status, body) = cluster.put_text(1, &global_rules()).await;
    assert!((200..300).contains(&status), "PUT rules: {status} {body}");
    let stop = Arc::new(AtomicBool::new(false));
    let reporter = keep_reporting(&cluster, Arc::clone(&stop));

    // Every key of every rule gets its own entry.
    let last_rule = format!("api|c{}", RULES - 1);
    let last_key = key(KEYS - 1);
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut entries = 0;
    while Instant::now() < deadline {
        let (_, body) = cluster
            .get(1, "/api/v1/allocations")
            .await
            .unwrap_or_default();
        entries = body["rules"].as_object().map_or(0, |rules| {
            rules
                .values()
                .map(|r| r["key_entries"].as_u64().unwrap_or(0) as usize)
                .sum::<usize>()
        });
        if entries == RULES * KEYS {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(entries, RULES * KEYS, "key entries allocated");

    // A client that decodes no message over the budget gets the snapshot,
    // in parts.
    let mut watch = CoordinatorClient::new(cluster.channel(1))
        .max_decoding_message_size(BUDGET)
        .watch(pb::WatchRequest {
            region: "mumbai".into(),
            pod: "probe".into(),
        })
        .await
        .expect("watch")
        .into_inner();
    let mut parts = Vec::new();
    loop {
        let message = tokio::time::timeout(Duration::from_secs(10), watch.next())
            .await
            .expect("a watch message within 10 s")
            .expect("the stream stays open")
            .expect("every message decodes within the budget");
        if let Some(part) = message.allocations {
            let more = part.more;
            parts.push(part);
            if !more {
                break;
            }
        }
    }
    assert!(
        parts.len() > 5,
        "a snapshot of {} keys in {BUDGET}-byte messages came in {} parts",
        RULES * KEYS,
        parts.len()
    );
    let numbers: Vec<u32> = parts.iter().map(|p| p.part).collect();
    assert_eq!(numbers, (0..parts.len() as u32).collect::<Vec<_>>());
    assert!(parts.iter().all(|p| p.full && p.epoch == parts[0].epoch));
    let keys: usize = parts
        .iter()
        .flat_map(|p| &p.rules)
        .map(|r| r.keys.len())
        .sum();
    assert_eq!(keys, RULES * KEYS, "key entries across the parts");

    // A limiter enforces the last key of the last rule at its allocation:
    // it took the whole snapshot, not its first part.
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().expect("temp dir");
    let cache = dir.path().join("rules-cache.json");
    let url = cluster.node(1).grpc_url();
    let limiter = LimiterProcess::start_without_rules(&[
        "--coordinator",
        &url,
        "--region",
        "mumbai",
        "--redis",
        &redis.url(),
        "--report-interval",
        "1s",
        "--rules-cache",
        cache.to_str().expect("utf-8 path"),
    ]);
    // Its entry differs from the split once the grows (which wait for
    // hyderabad's acknowledged shrink) are published.
    let deadline = Instant::now() + Duration::from_secs(30);
    let (mut want, mut got, mut split) = (None, None, None);
    while Instant::now() < deadline {
        want = granted(&cluster, &last_rule, &last_key).await;
        got = enforced(&limiter, "c2", &last_key).await;
        split = enforced(&limiter, "c2", "a-key-without-an-entry").await;
        if want.is_some() && want == got && got != split {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    stop.store(true, Ordering::Relaxed);
    let _ = reporter.await;
    assert!(
        want.is_some() && want == got && got != split,
        "{last_key} of {last_rule}: granted {want:?}, the limiter enforces {got:?} (the split: {split:?})"
    );
}

/// The rule set version a watch message names as current.
fn version(message: &pb::WatchUpdate) -> Option<u64> {
    message.rules.as_ref()?.current.as_ref().map(|v| v.number)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_follower_refuses_watches_until_it_caught_up_and_ends_open_streams() {
    let cluster = Cluster::start(3, Options::default()).await;
    let leader = cluster.wait_leader(Duration::from_secs(20)).await;
    let (status, body) = cluster.put_rules(leader, "v1").await;
    assert!((200..300).contains(&status), "PUT v1: {status} {body}");
    let old = body["version"].as_u64().expect("version number");
    let follower = *cluster
        .running()
        .iter()
        .find(|id| **id != leader)
        .expect("a follower");
    cluster
        .wait_version(follower, old, Duration::from_secs(10))
        .await;
    let watch = |client: &mut CoordinatorClient<tonic::transport::Channel>| {
        let mut client = client.clone();
        async move {
            client
                .watch(pb::WatchRequest {
                    region: "mumbai".into(),
                    pod: "probe".into(),
                })
                .await
        }
    };
    let mut client = CoordinatorClient::new(cluster.channel(follower));
    let mut open = watch(&mut client).await.expect("watch").into_inner();
    let first = open.next().await.expect("a first message").expect("ok");
    assert_eq!(version(&first), Some(old));

    cluster.node(follower).pause();
    let mut newest = old;
    for n in 2..=6 {
        let (status, body) = cluster.put_rules(leader, &format!("v{n}")).await;
        assert!((200..300).contains(&status), "PUT v{n}: {status} {body}");
        newest = body["version"].as_u64().expect("version number");
    }
    // Longer than the election timeout: the follower has been cut off.
    tokio::time::sleep(Duration::from_secs(3)).await;
    // Asked while it is stopped, answered when it resumes.
    let mut queued_client = CoordinatorClient::new(cluster.channel(follower));
    let queued = tokio::spawn(async move { watch(&mut queued_client).await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    cluster.node(follower).resume();

    // The stream it had open ends with UNAVAILABLE and sends no old version
    // after the resume.
    let ended = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(item) = open.next().await {
            match item {
                Ok(message) => {
                    let v = version(&message);
                    assert!(
                        v.is_none() || v == Some(newest),
                        "the resumed node streamed version {v:?} as current (newest {newest})"
                    );
                }
                Err(status) => return Some(status),
            }
        }
        None
    })
    .await
    .expect("the open stream ends within 10 s of the resume");
    let status = ended.expect("the stream ends with a status, not a clean close");
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    eprintln!("open stream ended: {}", status.message());

    // Every watch asked of it from the resume on is refused, or current.
    let mut answers = vec![queued.await.expect("queued watch task")];
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let answer = answers.pop().expect("an answer");
        match answer {
            Ok(response) => {
                let mut stream = response.into_inner();
                let message = stream.next().await.expect("a message").expect("ok");
                let v = version(&message);
                assert_eq!(
                    v,
                    Some(newest),
                    "the resumed node served version {v:?} as current (newest {newest})"
                );
                break;
            }
            Err(status) => {
                assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
                eprintln!("refused: {}", status.message());
            }
        }
        assert!(Instant::now() < deadline, "the follower never served again");
        tokio::time::sleep(Duration::from_millis(20)).await;
        answers.push(watch(&mut client).await);
    }
}

/// A process's resident set in kB, from /proc.
fn rss_kb(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// A coordinator's RSS before and after 2,000 watch streams (20 per
/// connection, as many pods share one) that each received their region's
/// snapshot of 3,000 key entries: the streams share the node's state, so
/// each costs well under the audit's 573 kB (54 MB → 1.2 GB for 2,000).
/// Also the figure in docs/performance.md:
/// `cargo test --test integration watch_bounds::two_thousand -- --nocapture`;
/// `WATCH_MESSAGE_BYTES=N` sets the node's per-message budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_thousand_watch_streams_cost_a_fraction_of_a_copy_each() {
    let options = Options {
        extra_args: [
            "--rebalance-interval",
            "1s",
            "--max-watch-streams-per-client",
            "2000",
            "--watch-message-bytes",
            &std::env::var("WATCH_MESSAGE_BYTES").unwrap_or_else(|_| "4128768".into()),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect(),
        ..Options::default()
    };
    let cluster = Cluster::start(1, options).await;
    cluster.register_region(1, "mumbai").await;
    cluster.register_region(1, "hyderabad").await;
    let (status, body) = cluster.put_text(1, &global_rules()).await;
    assert!((200..300).contains(&status), "PUT rules: {status} {body}");
    let stop = Arc::new(AtomicBool::new(false));
    let reporter = keep_reporting(&cluster, Arc::clone(&stop));
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        let (_, body) = cluster
            .get(1, "/api/v1/allocations")
            .await
            .unwrap_or_default();
        let entries: u64 = body["rules"].as_object().map_or(0, |rules| {
            rules
                .values()
                .map(|r| r["key_entries"].as_u64().unwrap_or(0))
                .sum()
        });
        if entries == (RULES * KEYS) as u64 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    stop.store(true, Ordering::Relaxed);
    let _ = reporter.await;
    let pid = cluster.node(1).pid().expect("running");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = rss_kb(pid);

    let mut streams = Vec::new();
    let mut snapshot_bytes = 0;
    for c in 0..100 {
        let client = CoordinatorClient::new(cluster.channel(1));
        for s in 0..20 {
            let region = if (c + s) % 2 == 0 {
                "mumbai"
            } else {
                "hyderabad"
            };
            let mut stream = client
                .clone()
                .watch(pb::WatchRequest {
                    region: region.into(),
                    pod: format!("pod-{c}-{s}"),
                })
                .await
                .expect("watch")
                .into_inner();
            loop {
                let message = stream.next().await.expect("open").expect("ok");
                if let Some(part) = message.allocations {
                    snapshot_bytes = snapshot_bytes.max(prost::Message::encoded_len(&part));
                    if !part.more {
                        break;
                    }
                }
            }
            streams.push(stream);
        }
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = rss_kb(pid);
    let open = cluster
        .metric(1, "meridian_coordinator_watch_streams")
        .await;
    eprintln!(
        "{} streams open ({open} by the node), snapshot {snapshot_bytes} bytes: RSS {} MB before, {} MB after (+{:.1} kB per stream)",
        streams.len(),
        before / 1024,
        after / 1024,
        (after.saturating_sub(before)) as f64 / streams.len() as f64
    );
    assert_eq!(
        (streams.len(), open),
        (2_000, 2_000.0),
        "streams not all open"
    );
    let per_stream_kb = after.saturating_sub(before) / 2_000;
    assert!(
        per_stream_kb < 400,
        "{per_stream_kb} kB per stream: the streams copy what they should share"
    );
}
