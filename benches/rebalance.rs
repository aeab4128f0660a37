//! The rebalancer at scale: one full round over 1 M active keys reported by
//! 5 regions (every key's EWMA updated, its own water-filling computed, the
//! top keys given entries), and the memory the demand tracker holds per key.
//!
//! Run: `cargo bench --bench rebalance` (goal: < 1 s per round, < 200 B/key).

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use meridian::allocation::demand::{DemandTracker, KeyDemand};
use meridian::allocation::rebalance::{Round, rebalance};
use meridian::allocation::{Allocations, Config, RegionInput, RegionStatus, RulePolicy};
use meridian::rules::Partition;

/// Counts live heap bytes, to report the tracker's memory per key.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const KEYS: usize = 1_000_000;
const REGIONS: [&str; 5] = ["ap-south", "ap-east", "eu-west", "us-east", "us-west"];

fn tracker() -> DemandTracker {
    let mut t = DemandTracker::new(0.5);
    for (r, region) in REGIONS.iter().enumerate() {
        // Every region reports every key; the mix differs per key so that
        // some keys earn entries of their own.
        let keys: Vec<KeyDemand> = (0..KEYS)
            .map(|i| KeyDemand {
                key: format!("customer-{i}"),
                asked: 1 + ((i * 7 + r * 13) % 97) as u64 * if i % 1000 == r { 50 } else { 1 },
                allowed: 1,
            })
            .collect();
        t.count_report(region);
        t.record(region, "api|customer", 60_000, &keys, 0, 10_000);
    }
    t.roll(&|_| 1);
    t
}

fn rebalance_1m(c: &mut Criterion) {
    let before = LIVE.load(Ordering::Relaxed);
    let tracker = tracker();
    let bytes = LIVE.load(Ordering::Relaxed) - before;
    eprintln!(
        "demand tracker: {KEYS} keys × {} regions hold {:.1} MB = {:.0} B/key",
        REGIONS.len(),
        bytes as f64 / 1e6,
        bytes as f64 / KEYS as f64
    );
    let regions: Vec<RegionInput> = REGIONS
        .iter()
        .map(|name| RegionInput {
            name: name.to_string(),
            weight: 1.0,
            status: RegionStatus::Active,
            last_heard_ms: Some(1_000_000),
            acked: Some(0),
        })
        .collect();
    let rules = vec![RulePolicy {
        rule: "api|customer".into(),
        limit: 1_000,
        partition: Partition::Strict,
        fallback: 0.5,
        fallback_hold_ms: meridian::allocation::DEFAULT_FALLBACK_HOLD_MS,
        window_ms: Some(60_000),
    }];
    let config = Config::default();
    let state = Allocations::default();
    let mut group = c.benchmark_group("rebalance");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(10));
    group.bench_function("full_round/1M_keys_x_5_regions", |b| {
        b.iter(|| {
            let round = Round {
                now_ms: 1_000_000,
                regions: &regions,
                rules: &rules,
                demand: Some(&tracker),
                in_window: None,
            };
            black_box(rebalance(&state, &round, &config))
        })
    });
    group.finish();
    let next = rebalance(
        &state,
        &Round {
            now_ms: 1_000_000,
            regions: &regions,
            rules: &rules,
            demand: Some(&tracker),
            in_window: None,
        },
        &config,
    );
    let delta = state.diff(&next);
    eprintln!(
        "one epoch: {} key entries, delta {} bytes (bincode)",
        next.rules["api|customer"].keys.len(),
        bincode::serialized_size(&delta).unwrap_or(0)
    );
}

criterion_group!(benches, rebalance_1m);
criterion_main!(benches);
