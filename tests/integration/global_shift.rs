//! Global limits end to end: 3 coordinators, 2 regions each with its own
//! redis-server and limiter, rebalancing every 2 s. Traffic runs 80/20 between
//! the regions, then shifts to 20/80. The allocations must follow, and in
//! every clock-aligned window the world must admit at most L (fixed window,
//! sliding counter; strict partition), and at most B + R·T over any interval
//! for the token bucket. Every process speaks mutual TLS, as deployed.

use crate::common;

use std::time::{Duration, Instant};

use common::global::{Load, REBALANCE, World, admitted_per_window, summarize};

const L: u64 = 200;
const PERIOD: Duration = Duration::from_secs(4);

fn rules() -> String {
    format!(
        "domain: api
descriptors:
  - key: fw
    scope: global
    fail_mode: closed
    algorithm: fixed_window
    period: 4s
    rate_limit:
      name: fw
      requests_per_unit: {L}
  - key: sc
    scope: global
    fail_mode: closed
    algorithm: sliding_window_counter
    period: 4s
    rate_limit:
      name: sc
      requests_per_unit: {L}
  - key: tb
    scope: global
    fail_mode: closed
    algorithm: token_bucket
    period: 4s
    burst: 40
    rate_limit:
      name: tb
      requests_per_unit: {L}
"
    )
}

fn rule_id(world: &World, name: &str) -> String {
    let _ = world;
    format!("api|{name}")
}

/// Token bucket: admitted over any interval T ≤ B + R·T, checked over every
/// pair of admitted hits (client-side times, so each pair gets the two
/// round trips as slack).
fn worst_bucket_excess(records: &[common::global::Record], burst: f64, rate_per_us: f64) -> f64 {
    let mut times: Vec<(u64, u64)> = records
        .iter()
        .filter(|r| r.allowed)
        .map(|r| (r.sent_us, r.recv_us))
        .collect();
    times.sort();
    let mut worst = f64::MIN;
    for i in 0..times.len() {
        for j in i..times.len() {
            let count = (j - i + 1) as f64;
            // The first hit may have been decided as late as its receipt,
            // the last as early as its send.
            let span = times[j].1.saturating_sub(times[i].0) as f64;
            worst = worst.max(count - (burst + rate_per_us * span));
        }
    }
    worst
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn allocations_follow_a_shift_and_the_world_stays_within_its_limit() {
    let world = World::start_as(
        &rules(),
        &["mumbai", "hyderabad"],
        &["2s", "6s", "2s"],
        true,
    )
    .await;
    let loads: Vec<Load> = ["fw", "sc", "tb"]
        .iter()
        .map(|rule| Load::start(&world, "api", rule, "acme", &[60, 15]))
        .collect();
    let fw = rule_id(&world, "fw");
    let first = world.wait_allocated(&fw, Duration::from_secs(20)).await;
    eprintln!("first allocation: {first:?}");

    // Phase 1: 80/20. Mumbai must come to hold most of L.
    let started = Instant::now();
    loop {
        let split = world.split(&fw).await;
        if split["mumbai"] > split["hyderabad"] && split["mumbai"] >= L / 2 {
            eprintln!("80/20: {split:?} after {:?}", started.elapsed());
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "mumbai never got the larger share: {split:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    tokio::time::sleep(Duration::from_secs(8)).await;

    // Phase 2: 20/80. Hyderabad must overtake within two rebalance intervals
    // (plus one report interval for the new demand to be seen).
    for load in &loads {
        load.set(&[15, 60]);
    }
    let shifted = Instant::now();
    let follow = loop {
        let split = world.split(&fw).await;
        if split["hyderabad"] > split["mumbai"] {
            eprintln!("20/80: {split:?} after {:?}", shifted.elapsed());
            break shifted.elapsed();
        }
        assert!(
            shifted.elapsed() < 2 * REBALANCE + Duration::from_secs(2),
            "allocations did not follow the shift within two intervals: {split:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // Epochs keep coming while the split settles: how long each takes from
    // the leader to a limiter.
    let lags = common::global::propagation_ms(&world, 0, 4, Duration::from_secs(12)).await;
    eprintln!("commit-to-limiter propagation (ms): {lags:?}");
    assert!(!lags.is_empty(), "no epoch reached the limiter in 12 s");
    for lag in &lags {
        assert!(*lag < 1000, "an epoch took {lag} ms to reach the limiter");
    }
    let settled = world.split(&fw).await;
    assert!(
        settled["hyderabad"] >= L / 2,
        "after the shift hyderabad should hold most of L: {settled:?}"
    );
    let detail = world.allocations(&format!("rule={fw}&key=acme")).await;
    assert!(
        detail["history"].as_array().is_some_and(|h| !h.is_empty()),
        "the allocation history lists the epochs that moved the split: {detail}"
    );

    let mut all = Vec::new();
    for load in loads {
        all.push(load.stop().await);
    }
    eprintln!("allocations followed the shift in {follow:?}");
    for (records, (name, sliding)) in all[..2].iter().zip([("fw", false), ("sc", true)]) {
        let windows = admitted_per_window(records, PERIOD, sliding, 2);
        let (worst, share) = summarize(name, records, &windows, L, PERIOD);
        for (w, per_region) in &windows {
            let total: u64 = per_region.iter().sum();
            assert!(
                total <= L,
                "{name}: window {w} admitted {total} > L={L} ({per_region:?})"
            );
        }
        assert!(worst <= 0);
        assert!(
            share > 0.5,
            "{name}: the world admitted only {:.0} % of what it could",
            share * 100.0
        );
        let no_allocation = records
            .iter()
            .filter(|r| r.reason == "no_allocation")
            .count();
        eprintln!("{name}: {no_allocation} checks denied before an allocation arrived");
    }
    // Token bucket: R = L per period, B = 40.
    let rate_per_us = L as f64 / PERIOD.as_micros() as f64;
    let excess = worst_bucket_excess(&all[2], 40.0, rate_per_us);
    let admitted = all[2].iter().filter(|r| r.allowed).count();
    eprintln!("tb: {admitted} admitted; worst interval {excess:+.1} hits vs B + R·T");
    assert!(
        excess <= 1.0,
        "token bucket admitted {excess:.1} more than B + R·T over some interval"
    );
}
