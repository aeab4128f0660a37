//! A limiter restarted while no coordinator answers (its connections to
//! every node go through proxies the test cuts) enforces its region's last
//! allocation, kept in the region's Redis, and lapses from it on the lease
//! schedule — the allocation until the lease ends, then min(allocation,
//! fallback) for `fallback_hold`, then nothing — as a pod that was cut off
//! while running would, instead of denying every check (`no_allocation`).
//! What it restores is the region's latest table, not the one it held
//! before it went down: a table the region shrank meanwhile is not the one
//! the centre reserves for it.

use crate::common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::global::{LEASE, Load, World, now_us};
use common::limiter::LimiterProcess;
use meridian::proto::meridian::v1::limiter_client::LimiterClient;
use meridian::proto::meridian::v1::{Check, CheckRequest};

const L: u64 = 200;
/// fallback 0.5 × the static share (L / 2 regions).
const FALLBACK: u64 = 50;
const RULE: &str = "api|fw";

/// Domain `api`, global fixed-window rule `fw` of [`L`] per 4 s, strict,
/// keeping half its static share for `hold` after the lease.
fn rule(hold: &str) -> String {
    format!(
        "domain: api
descriptors:
  - key: fw
    scope: global
    fail_mode: closed
    partition: strict
    fallback: 0.5
    fallback_hold: {hold}
    algorithm: fixed_window
    period: 4s
    rate_limit:
      name: fw
      requests_per_unit: {L}
"
    )
}

/// The limit the limiter enforces for key `acme` now and the reason of its
/// decision ("" when admitted), asked without a charge; `None`: no answer.
async fn enforced(limiter: &LimiterProcess) -> Option<(u64, String)> {
    let mut client = LimiterClient::connect(limiter.grpc_url()).await.ok()?;
    let check = Check {
        domain: "api".into(),
        rule: "fw".into(),
        key: "acme".into(),
        cost: 1,
        check_only: true,
        ..Default::default()
    };
    let response = client
        .check(CheckRequest {
            checks: vec![check],
        })
        .await
        .ok()?
        .into_inner();
    let d = response.decisions.first()?;
    Some((d.limit, d.reason.clone()))
}

/// The `allocation:` line of the limiter's `/readyz` as its fields, with
/// `status` (the HTTP status); empty when it does not answer.
async fn allocation(limiter: &LimiterProcess) -> HashMap<String, String> {
    let Ok(r) = common::http_get(limiter.http_url("/readyz")).await else {
        return HashMap::new();
    };
    let status = r.status().as_u16().to_string();
    let body = r.text().await.unwrap_or_default();
    let mut fields: HashMap<String, String> = body
        .lines()
        .find_map(|l| l.strip_prefix("allocation: "))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    fields.insert("status".into(), status);
    fields
}

fn number(fields: &HashMap<String, String>, name: &str) -> u64 {
    fields.get(name).and_then(|v| v.parse().ok()).unwrap_or(0)
}

/// Waits until `limiter` enforces `want` for `acme` from a table the
/// coordinator sent and its region's Redis keeps.
async fn wait_enforced_and_kept(limiter: &LimiterProcess, want: impl Fn(u64) -> bool) -> u64 {
    let started = Instant::now();
    loop {
        let status = allocation(limiter).await;
        if let Some((limit, _)) = enforced(limiter).await
            && want(limit)
            && status.get("source").map(String::as_str) == Some("coordinator")
            && number(&status, "saved_epoch") >= 1
        {
            return limit;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "never enforced the expected value from a kept table: {status:?}, {:?}",
            enforced(limiter).await
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_limiter_restarted_without_a_coordinator_enforces_its_last_allocation_then_lapses() {
    const HOLD_MS: u64 = 3_000;
    let mut world = World::start(&rule("3s"), &["mumbai", "hyderabad"]).await;
    world.wait_allocated(RULE, Duration::from_secs(20)).await;
    let held = wait_enforced_and_kept(&world.regions[0].limiter, |v| v > FALLBACK).await;
    eprintln!("mumbai enforces {held} of {L}");

    // Cut off from every coordinator, killed, started again.
    let mumbai = &mut world.regions[0];
    for p in &mumbai.proxies {
        p.cut();
    }
    mumbai.limiter.kill();
    mumbai.start_again();
    let restarted_us = now_us();

    let status = allocation(&mumbai.limiter).await;
    assert_eq!(status["status"], "200", "{status:?}");
    assert_eq!(status["source"], "restored", "{status:?}");
    let lease_ms = number(&status, "lease_valid_until_unix_ms");
    assert!(
        lease_ms * 1000 > restarted_us,
        "the restored lease should still run: {status:?}"
    );
    eprintln!(
        "restarted; restored epoch {} whose lease ends {:.1} s later",
        status["epoch"],
        (lease_ms as f64 * 1000.0 - restarted_us as f64) / 1e6
    );

    // Sample what it enforces through the lease, the hold and after.
    let end_ms = lease_ms + HOLD_MS + 1_500;
    let mut samples = Vec::new();
    while now_us() / 1000 < end_ms {
        let before = now_us() / 1000;
        let decision = enforced(&mumbai.limiter).await;
        let phase = allocation(&mumbai.limiter).await.get("phase").cloned();
        let after = now_us() / 1000;
        samples.push((before, after, decision, phase));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let margin = 150;
    let (mut lease, mut fallback, mut lapsed) = (0, 0, 0);
    for (before, after, decision, phase) in &samples {
        let (limit, reason) = decision.clone().expect("the limiter answers");
        let phase = phase.clone().unwrap_or_default();
        if *after + margin < lease_ms {
            lease += 1;
            assert_eq!(
                (limit, phase.as_str()),
                (held, "lease"),
                "within the lease: the allocation ({reason})"
            );
        } else if *before > lease_ms + margin && *after + margin < lease_ms + HOLD_MS {
            fallback += 1;
            assert_eq!(
                (limit, phase.as_str()),
                (held.min(FALLBACK), "fallback"),
                "past the lease, within the hold: min(allocation, fallback)"
            );
        } else if *before > lease_ms + HOLD_MS + margin {
            lapsed += 1;
            assert_eq!(
                (limit, reason.as_str(), phase.as_str()),
                (0, "no_allocation", "lapsed"),
                "past the hold: nothing"
            );
        }
    }
    eprintln!("{lease} samples in the lease, {fallback} in the hold, {lapsed} after");
    assert!(lease > 0 && fallback > 0 && lapsed > 0, "{samples:?}");

    // A coordinator answers again: its table replaces the restored one.
    for p in &mumbai.proxies {
        p.restore();
    }
    let started = Instant::now();
    loop {
        let status = allocation(&mumbai.limiter).await;
        let limit = enforced(&mumbai.limiter).await.map_or(0, |d| d.0);
        if status.get("source").map(String::as_str) == Some("coordinator") && limit > 0 {
            break;
        }
        assert!(
            started.elapsed() < LEASE * 2,
            "the coordinator's table never replaced the restored one: {status:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pod_restarted_after_its_region_shrank_restores_the_shrunk_table() {
    let mut world = World::start(&rule("60s"), &["mumbai", "hyderabad"]).await;
    world.wait_allocated(RULE, Duration::from_secs(20)).await;
    // Pod A (the region's limiter) and pod B, one Redis.
    let pod_b = world.regions[0].start_pod("mumbai-b");
    let before = wait_enforced_and_kept(&world.regions[0].limiter, |v| v > FALLBACK).await;
    wait_enforced_and_kept(&pod_b, |v| v == before).await;
    eprintln!("both mumbai pods enforce {before}");

    // A goes down; the traffic moves to hyderabad: mumbai shrinks to its
    // floor, B acknowledges, and the freed share goes to hyderabad.
    let load = Load::start(&world, "api", "fw", "acme", &[0, 0]);
    world.regions[0].limiter.kill();
    load.set(&[0, 80]);
    let started = Instant::now();
    let shrunk = loop {
        let split = world.split(RULE).await;
        let (m, h) = (split["mumbai"], split["hyderabad"]);
        // Hyderabad's grow comes only out of a shrink mumbai acknowledged.
        if m < before && h > L - before {
            break m;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "mumbai never shrank for hyderabad: {split:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(shrunk > 0, "a region keeps its floor");
    wait_enforced_and_kept(&pod_b, |v| v == shrunk).await;
    eprintln!("mumbai shrank to {shrunk}; pod B enforces it");

    // No coordinator answers any more; A starts again.
    for p in &world.regions[0].proxies {
        p.cut();
    }
    world.regions[0].start_again();
    let pod_a = &world.regions[0].limiter;
    let status = allocation(pod_a).await;
    assert_eq!(status["source"], "restored", "{status:?}");
    let (limit, reason) = enforced(pod_a).await.expect("pod A answers");
    load.stop().await;
    assert_eq!(
        limit, shrunk,
        "pod A must enforce its region's latest table ({shrunk}), not the one it held \
         before ({before}) nor nothing ({reason}): {status:?}"
    );
}
