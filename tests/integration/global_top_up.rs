//! Early top-up: with a long rebalance interval (30 s), a key whose traffic
//! moves to a region holding a small share asks for an out-of-cycle
//! rebalance once it used 90 % of its allocation; its share grows within
//! seconds instead of waiting for the next epoch.

use crate::common;

use std::time::{Duration, Instant};

use common::global::{Load, World, fixed_window_rule};

const L: u64 = 200;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_key_that_runs_out_mid_window_gets_topped_up_before_the_next_epoch() {
    let world = World::start_with(
        &fixed_window_rule(L),
        &["mumbai", "hyderabad"],
        &["30s", "90s", "30s"],
    )
    .await;
    let load = Load::start(&world, "api", "fw", "acme", &[40, 0]);
    world
        .wait_allocated("api|fw", Duration::from_secs(20))
        .await;
    // Mumbai's demand takes most of L (top-ups from mumbai itself).
    let started = Instant::now();
    let before = loop {
        let split = world.split("api|fw").await;
        if split["mumbai"] >= 150 {
            break split;
        }
        assert!(
            started.elapsed() < Duration::from_secs(25),
            "mumbai never grew: {split:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    eprintln!("before the move: {before:?}");

    // The traffic moves to hyderabad.
    load.set(&[0, 40]);
    let moved = Instant::now();
    let caught_up = loop {
        let split = world.split("api|fw").await;
        if split["hyderabad"] >= 90 {
            break moved.elapsed();
        }
        assert!(
            moved.elapsed() < Duration::from_secs(12),
            "no top-up: hyderabad still holds {split:?} after {:?} (the next scheduled epoch is up to 30 s away)",
            moved.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    eprintln!(
        "top-up: hyderabad reached 90 of L={L} {caught_up:?} after the move (rebalance interval 30 s)"
    );
    let metrics = common::http_get(world.regions[1].limiter.http_url("/metrics"))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    assert!(
        metrics.contains("meridian_allocation_top_ups_total"),
        "hyderabad's limiter counted no top-up request"
    );
    let records = load.stop().await;
    let topped = records
        .iter()
        .filter(|r| r.region == 1 && r.allowed)
        .count();
    eprintln!("hyderabad admitted {topped} checks after the move");
}
