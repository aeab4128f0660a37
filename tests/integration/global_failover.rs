//! The coordinator leader is killed (SIGKILL) mid-run: regions keep
//! enforcing their allocations throughout, the world stays within L, and the
//! new leader continues from the demand committed with the last epoch — no
//! learning period, no fall back to the static split.

use crate::common;

use std::time::{Duration, Instant};

use common::global::{Load, World, admitted_per_window, fixed_window_rule, now_us, summarize};

const L: u64 = 200;
const PERIOD: Duration = Duration::from_secs(4);
const RULE: &str = "api|fw";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killing_the_leader_keeps_allocations_enforced_and_demand_continues() {
    let mut world = World::start(&fixed_window_rule(L), &["mumbai", "hyderabad"]).await;
    let load = Load::start(&world, "api", "fw", "acme", &[60, 15]);
    world.wait_allocated(RULE, Duration::from_secs(20)).await;
    let started = Instant::now();
    loop {
        let split = world.split(RULE).await;
        if split["mumbai"] >= L / 2 + 20 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "mumbai never got most of L: {split:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    tokio::time::sleep(Duration::from_secs(4)).await;

    let leader = world.cluster.wait_leader(Duration::from_secs(10)).await;
    let before = world.allocations(&format!("rule={RULE}")).await;
    let epoch_before = before["epoch"].as_u64().expect("epoch");
    let demand_before = before["demand"]["mumbai"]
        .as_f64()
        .expect("committed demand");
    eprintln!(
        "killing leader {leader} at epoch {epoch_before}; committed demand {}",
        before["demand"]
    );
    let killed_us = now_us();
    world.cluster.kill(leader);

    // The new leader's first epochs.
    let new_leader = world.cluster.wait_leader(Duration::from_secs(20)).await;
    assert_ne!(new_leader, leader);
    let elected = Instant::now();
    let after = loop {
        let body = world.allocations(&format!("rule={RULE}")).await;
        if body["epoch"].as_u64().unwrap_or(0) > epoch_before {
            break body;
        }
        assert!(
            elected.elapsed() < Duration::from_secs(15),
            "the new leader committed no epoch: {body}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    eprintln!(
        "new leader {new_leader}: epoch {} {:.1} s after the kill; demand {} split {}",
        after["epoch"],
        (now_us() - killed_us) as f64 / 1e6,
        after["demand"],
        after["split"]
    );
    let demand_after = after["demand"]["mumbai"].as_f64().unwrap_or(0.0);
    assert!(
        demand_after >= demand_before * 0.5,
        "the new leader lost the smoothed demand: {demand_after} vs {demand_before} before"
    );
    let split = common::global::granted(&after["split"]);
    assert!(
        split["mumbai"] >= L / 2 + 20,
        "the new leader went back toward the static split: {split:?}"
    );
    tokio::time::sleep(Duration::from_secs(8)).await;
    let records = load.stop().await;

    // Enforcement never stopped: once a region held an allocation, none of
    // its checks was denied for lack of one (the kill included).
    for region in 0..2 {
        let first_allocated = records
            .iter()
            .filter(|r| r.region == region && r.limit > 0)
            .map(|r| r.recv_us)
            .min()
            .expect("some allocation");
        let gaps = records
            .iter()
            .filter(|r| {
                r.region == region && r.sent_us > first_allocated && r.reason == "no_allocation"
            })
            .count();
        assert_eq!(
            gaps, 0,
            "region {region}: checks denied for lack of an allocation after it held one"
        );
    }
    let windows = admitted_per_window(&records, PERIOD, false, 2);
    let (worst, _) = summarize("failover", &records, &windows, L, PERIOD);
    assert!(worst <= 0, "a window exceeded L by {worst}");
}
