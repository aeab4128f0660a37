//! In-window re-grants with real processes: 3 coordinators, 2 regions each
//! with its own redis-server and limiter. Demand turns from 80/20 to 20/80 a
//! couple of seconds into a long fixed window. Mumbai has used little of its
//! share, so its shrink applies at once; once its pods have reported, the
//! coordinator grants hyderabad the freed capacity within the same window —
//! and no window admits more than L.

use crate::common;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::global::{Load, World, admitted_per_window, fixed_window_rule_per, summarize};

const L: u64 = 120;
const PERIOD: Duration = Duration::from_secs(12);

/// Sleeps until `offset` into the next clock-aligned window; returns that
/// window's index.
async fn into_next_window(offset: Duration) -> u64 {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970");
    let period = PERIOD.as_millis();
    let index = now.as_millis() / period + 1;
    let at = Duration::from_millis((index * period) as u64) + offset;
    tokio::time::sleep(at - now).await;
    index as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_shift_early_in_a_window_is_re_granted_within_it_and_no_window_exceeds_the_limit() {
    let world = World::start(&fixed_window_rule_per(L, "12s"), &["mumbai", "hyderabad"]).await;
    let load = Load::start(&world, "api", "fw", "acme", &[8, 2]);
    world
        .wait_allocated("api|fw", Duration::from_secs(20))
        .await;
    // Two whole windows at 80/20 for the split to settle.
    into_next_window(Duration::ZERO).await;
    into_next_window(Duration::ZERO).await;
    let shifted = into_next_window(Duration::from_secs(2)).await;
    let before = world.split("api|fw").await;
    load.set(&[2, 8]);
    eprintln!("shift 2 s into window {shifted}; split before: {before:?}");
    into_next_window(Duration::from_secs(1)).await;
    let after = world.split("api|fw").await;
    let records = load.stop().await;
    eprintln!("split one window later: {after:?}");

    let windows = admitted_per_window(&records, PERIOD, false, 2);
    let (worst, _) = summarize("fw", &records, &windows, L, PERIOD);
    for (w, per_region) in &windows {
        let total: u64 = per_region.iter().sum();
        assert!(
            total <= L,
            "window {w} admitted {total} > L={L} ({per_region:?})"
        );
    }
    assert!(worst <= 0);

    // In the window of the shift, hyderabad enforced more than it began it
    // with, and admitted more than that.
    let limits: Vec<u64> = records
        .iter()
        .filter(|r| r.region == 1)
        .filter(|r| (r.recv_us + r.reset_after_us) / PERIOD.as_micros() as u64 == shifted + 1)
        .map(|r| r.limit)
        .collect();
    let (first, most) = (
        limits.first().copied().unwrap_or(0),
        limits.iter().copied().max().unwrap_or(0),
    );
    let admitted = windows.get(&shifted).map_or(0, |w| w[1]);
    eprintln!(
        "hyderabad in the shift window: limit {first} → {most}, admitted {admitted} (window totals {:?})",
        windows.get(&shifted)
    );
    assert!(
        most > first,
        "hyderabad's value was not raised within the window: {first} → {most}"
    );
    assert!(
        admitted > first,
        "hyderabad admitted {admitted}, hardly more than the {first} it began the window with"
    );
    let steps = world.allocations("rule=api|fw&history=1").await;
    eprintln!("history: {}", steps["history"]);
}
