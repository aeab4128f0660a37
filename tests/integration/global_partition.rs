//! A region cut off from every coordinator (its connections to all of them
//! go through proxies the test cuts): it enforces its last allocation until
//! its lease runs out, then its fallback share. With `partition: strict` the
//! coordinator re-grants nothing of it before then and the world never
//! exceeds L; with `partition: available` the others may take it after
//! `suspect_after`, and the world exceeds L by at most the silent region's
//! allocation, for at most one lease. Every process speaks mutual TLS, as
//! deployed (the proxies forward the TLS bytes as they are).

use crate::common;

use std::time::{Duration, Instant};

use common::global::{
    LEASE, Load, World, admitted_per_window, now_us, strict_and_available, summarize,
};

const L: u64 = 200;
const PERIOD: Duration = Duration::from_secs(4);
/// fallback 0.5 × the static share (L / 2 regions).
const FALLBACK: u64 = 50;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cut_off_region_holds_its_allocation_until_the_lease_then_its_fallback() {
    let world = World::start_as(
        &strict_and_available(L),
        &["mumbai", "hyderabad"],
        &["2s", "6s", "2s"],
        true,
    )
    .await;
    let strict = Load::start(&world, "api", "strict", "acme", &[40, 40]);
    let avail = Load::start(&world, "api", "avail", "acme", &[40, 40]);
    world
        .wait_allocated("api|strict", Duration::from_secs(20))
        .await;
    world
        .wait_allocated("api|avail", Duration::from_secs(20))
        .await;
    tokio::time::sleep(Duration::from_secs(6)).await;

    let before = world.split("api|strict").await;
    let hyd_alloc = before["hyderabad"];
    eprintln!(
        "before the cut: strict {before:?}, avail {:?}",
        world.split("api|avail").await
    );
    for p in &world.regions[1].proxies {
        p.cut();
    }
    let cut_us = now_us();
    let cut = Instant::now();
    // The lease the coordinator last published to hyderabad bounds the one
    // it holds.
    let lease_until_us = {
        let body = world.allocations("").await;
        body["leases"]["hyderabad"]["valid_until_unix_ms"]
            .as_u64()
            .expect("hyderabad has a lease")
            * 1000
    };
    eprintln!(
        "cut hyderabad off; its lease ends {:.1} s after the cut",
        (lease_until_us as f64 - cut_us as f64) / 1e6
    );

    // Strict: mumbai's share must not grow before hyderabad's lease is over.
    let mut grew_at = None;
    let mut avail_grew_at = None;
    while cut.elapsed() < LEASE + Duration::from_secs(8) {
        let avail_split = world.split("api|avail").await;
        if avail_grew_at.is_none() && avail_split["mumbai"] > L - hyd_alloc {
            avail_grew_at = Some(now_us());
            eprintln!(
                "available: mumbai grew to {} {:.1} s after the cut",
                avail_split["mumbai"],
                cut.elapsed().as_secs_f64()
            );
        }
        let split = world.split("api|strict").await;
        let sum: u64 = split.values().sum();
        assert!(sum <= L, "strict allocations sum to {sum}: {split:?}");
        if grew_at.is_none() && split["mumbai"] > L - hyd_alloc {
            grew_at = Some(now_us());
            eprintln!(
                "strict: mumbai grew to {} {:.1} s after the cut",
                split["mumbai"],
                cut.elapsed().as_secs_f64()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let grew_at = grew_at.expect("strict: mumbai never took the lapsed region's share");
    assert!(
        grew_at >= lease_until_us,
        "strict: mumbai grew {:.1} s before hyderabad's lease ended",
        (lease_until_us - grew_at) as f64 / 1e6
    );
    assert!(
        avail_grew_at.is_some(),
        "available: mumbai never took the silent region's share"
    );
    let after = world.split("api|strict").await;
    assert!(
        after["mumbai"] >= L - FALLBACK - 10,
        "strict: after the lease mumbai may use all but hyderabad's fallback: {after:?}"
    );

    // Reconnect: hyderabad gets a renewed lease and a share again.
    for p in &world.regions[1].proxies {
        p.restore();
    }
    tokio::time::sleep(Duration::from_secs(8)).await;
    let strict_records = strict.stop().await;
    let avail_records = avail.stop().await;

    // What hyderabad enforced while cut off.
    for (name, records) in [("strict", &strict_records), ("avail", &avail_records)] {
        let hyd: Vec<_> = records.iter().filter(|r| r.region == 1).collect();
        let early: Vec<u64> = hyd
            .iter()
            .filter(|r| r.sent_us > cut_us && r.recv_us < cut_us + 1_000_000)
            .map(|r| r.limit)
            .collect();
        assert!(
            !early.is_empty() && early.iter().all(|l| *l > FALLBACK),
            "{name}: right after the cut hyderabad should still enforce its allocation: {early:?}"
        );
        let lapsed: Vec<u64> = hyd
            .iter()
            .filter(|r| {
                r.sent_us > lease_until_us + 500_000
                    && r.recv_us < cut_us + (LEASE.as_micros() as u64) + 6_000_000
            })
            .map(|r| r.limit)
            .collect();
        assert!(
            !lapsed.is_empty() && lapsed.iter().all(|l| *l <= FALLBACK),
            "{name}: after its lease hyderabad must fall to its fallback ({FALLBACK}): {lapsed:?}"
        );
    }

    // The world's admitted hits per window.
    let windows = admitted_per_window(&strict_records, PERIOD, false, 2);
    summarize("strict", &strict_records, &windows, L, PERIOD);
    for (w, per_region) in &windows {
        let start = (w * PERIOD.as_micros() as u64) as f64;
        let limits: std::collections::BTreeSet<(usize, u64)> = strict_records
            .iter()
            .filter(|r| r.recv_us / PERIOD.as_micros() as u64 == *w)
            .map(|r| (r.region, r.limit))
            .collect();
        eprintln!(
            "strict window at {:+.1} s from the cut: {per_region:?} limits {limits:?}",
            (start - cut_us as f64) / 1e6
        );
    }
    for (w, per_region) in &windows {
        let total: u64 = per_region.iter().sum();
        assert!(
            total <= L,
            "strict: window {w} admitted {total} > L ({per_region:?})"
        );
    }
    let windows = admitted_per_window(&avail_records, PERIOD, false, 2);
    let (worst, _) = summarize("available", &avail_records, &windows, L, PERIOD);
    let period_us = PERIOD.as_micros() as u64;
    for (w, per_region) in &windows {
        let total: u64 = per_region.iter().sum();
        let start = w * period_us;
        let bound = if start >= lease_until_us + period_us {
            L
        } else {
            L + hyd_alloc
        };
        assert!(
            total <= bound,
            "available: window {w} admitted {total} > {bound} ({per_region:?})"
        );
    }
    eprintln!(
        "available: worst overshoot {worst:+} ({:+.1} % of L); stated bound: the silent region's allocation ({hyd_alloc}) for one lease",
        worst as f64 * 100.0 / L as f64
    );
}
