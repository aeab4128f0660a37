//! Issue 27, "no capacity stranded", with real processes: 3 coordinators,
//! two regions each with its own redis-server and limiter, one global
//! fixed-window rule (`partition: strict`, failing closed).
//!
//! - The swing (demand 2 L, 80/20 between the regions, then 20/80)
//!   at half its time scale — L per 5 s with 1 s rounds, five rounds a window
//!   as L per 10 s with 2 s rounds — run ten times with the limiters on their
//!   defaults (no `--report-interval`), the swing at a different point of its
//!   window each time: the world never admits more than L in a window, and
//!   the goals hold — every run ≥ 95 % of its capacity, every window
//!   that asked for L ≥ 80 % of it (the swing window included) — in every run
//!   but at most one, which must still use 80 %. Before the estimator fix
//!   demand read 0 in rounds without a report and the split flapped (87.6 %
//!   on average, 72 % in the worst run); before the in-window re-grant
//!   reached the pods the swing window admitted 45 % of L when the swing came
//!   at its start; before the step shrink a swing early in a window left the
//!   shrinking region on its old share to the boundary (it had run at that
//!   share's pace until the swing) and the window admitted 76 % of L. The
//!   step was then floored at the smoothed demand estimate, which trails a
//!   swing by rounds, so a swing half a second into its window left 73 % of
//!   L in its swing window; it is floored at the pace between two reports
//!   now, and a shrink that waited is looked at again in later rounds. The
//!   last hole: a key entry made from a split that stepped down reached the
//!   pods as an immediate change below the step and cut the shrinking
//!   region off (68 % of L) — pods no longer lower a value on one.
//! - Every limiter of one region killed with SIGKILL under load: once the
//!   dead region's lease and its `fallback_hold` have run out, the other
//!   region is granted the capacity it freed, and the world still never
//!   admits more than L in a window — as the test counts it, and as the
//!   leader's ledger (`GET /api/v1/ledger`) counts it from the pods' reports.

use crate::common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::Value;

use common::global::{
    LEASE, Load, REBALANCE, Record, World, admitted_per_window, granted, limiter_gauge, now_us,
};

const L: u64 = 200;
/// The case at half its time scale: L per 10 s with 2 s rounds
/// there, L per 5 s with 1 s rounds here (five rounds a window either way),
/// so that ten runs fit the test's time.
const PERIOD: Duration = Duration::from_secs(5);
/// World-wide demand: 2 L per period.
const RATE: u64 = 2 * L / PERIOD.as_secs();
/// `--skew-margin` as [`World`] starts the coordinators.
const SKEW_MARGIN: Duration = Duration::from_millis(200);

fn period_us() -> u64 {
    PERIOD.as_micros() as u64
}

/// One global fixed-window rule `name` of L per [`PERIOD`], strict and
/// failing closed, with `extra` fields (indented as rule fields).
fn strict_rule(name: &str, extra: &str) -> String {
    format!(
        "domain: api
descriptors:
  - key: {name}
    scope: global
    partition: strict
    fail_mode: closed
{extra}    algorithm: fixed_window
    period: {}s
    rate_limit:
      name: {name}
      requests_per_unit: {L}
",
        PERIOD.as_secs()
    )
}

/// Sleeps until the wall clock reads `at_us` (Unix µs), which the regions'
/// Redis, on this machine, read too.
async fn until(at_us: u64) {
    let now = now_us();
    if at_us > now {
        tokio::time::sleep(Duration::from_micros(at_us - now)).await;
    }
}

/// The clock-aligned window a check was asked in.
fn asked_in(r: &Record) -> u64 {
    r.sent_us / period_us()
}

/// Checks asked per window, world-wide.
fn demand_per_window(records: &[Record]) -> BTreeMap<u64, u64> {
    let mut demand = BTreeMap::new();
    for r in records {
        *demand.entry(asked_in(r)).or_default() += 1;
    }
    demand
}

/// When each region's enforced limit changed, as its decisions said (µs
/// from `from_us`, the run's start).
fn limits_enforced(records: &[Record], from_us: u64) -> Vec<String> {
    let mut lines = Vec::new();
    for region in 0..2 {
        let mut last = None;
        let mut changes = Vec::new();
        for r in records.iter().filter(|r| r.region == region) {
            if last != Some(r.limit) {
                last = Some(r.limit);
                changes.push(format!(
                    "{:+.1} s: {}",
                    (r.recv_us as f64 - from_us as f64) / 1e6,
                    r.limit
                ));
            }
        }
        lines.push(format!("region {region} enforced {}", changes.join(", ")));
    }
    lines
}

/// Per-region rates of the world's demand with `share` % in mumbai and the
/// rest in hyderabad.
fn split(share: u64) -> [u64; 2] {
    [RATE * share / 100, RATE * (100 - share) / 100]
}

/// One run's figures, printed for the closing note.
struct Run {
    /// Σ admitted / Σ min(demand, L) over the run's counted windows.
    capacity: f64,
    /// The counted window that admitted least, as a share of L.
    worst_share: f64,
    /// The most any window of the run admitted world-wide.
    most: u64,
    /// Where the run fell short of the goals (≥ 95 % of capacity,
    /// ≥ 80 % of L in every window that asked for L).
    shortfalls: Vec<String>,
}

/// Demand 2 L per period, 80/20 between the regions for two windows, then
/// 20/80 for two more; ten runs, each on a fresh key so that no counter or
/// key entry carries over. Runs alternate the direction (80/20 → 20/80, then
/// 20/80 → 80/20), so a run begins with the mix the last one ended on: the
/// rule-level split (which serves a key without an entry of its own) then
/// follows one mix for about four windows before each swing, as it would
/// with one long-lived key. The swing lands at a different point of its
/// window in each run (0, 0.5, … 4.5 s in).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn swing_80_20_to_20_80_uses_most_capacity_with_limiters_on_defaults() {
    const RUNS: u64 = 10;
    const BEFORE: u64 = 2;
    const AFTER: u64 = 2;
    let rule = "api|swing";
    let world = World::start_reporting(
        &strict_rule("swing", ""),
        &["mumbai", "hyderabad"],
        &["1s", "3s", "1s"],
        false,
        None,
    )
    .await;
    world.wait_allocated(rule, Duration::from_secs(20)).await;
    // Left unset, each limiter's report interval is the coordinators': 0.5 s
    // for 1 s rounds (its own default, 10 s, is what made demand flap).
    for region in &world.regions {
        let asked = Instant::now();
        loop {
            let interval = limiter_gauge(&region.limiter, "meridian_report_interval_seconds").await;
            if interval == Some(0.5) {
                break;
            }
            assert!(
                asked.elapsed() < Duration::from_secs(10),
                "{}: report interval {interval:?} s, not the coordinators' 0.5 s for 1 s rounds",
                region.name
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    let started = Instant::now();

    // The split each second, to show how it moved when a run fails.
    let trace: std::sync::Arc<std::sync::Mutex<Vec<(u64, String)>>> = Default::default();
    let watcher = {
        let trace = trace.clone();
        let leader = world.cluster.wait_leader(Duration::from_secs(10)).await;
        let url = format!(
            "{}/api/v1/allocations?rule={rule}",
            world.cluster.node(leader).url()
        );
        let http = world.cluster.http.clone();
        tokio::spawn(async move {
            loop {
                if let Ok(r) = http
                    .get(&url)
                    .bearer_auth(common::coordinator::TOKEN)
                    .send()
                    .await
                    && let Ok(body) = r.json::<Value>().await
                {
                    let line = format!(
                        "split {:?} demand {}",
                        granted(&body["split"]),
                        body["demand"]
                    );
                    trace.lock().expect("trace").push((now_us(), line));
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        })
    };

    let mut next = now_us() / period_us() + 1;
    let mut runs = Vec::new();
    let mut failures = Vec::new();
    for run in 0..RUNS {
        let key = format!("run-{run}");
        let (from, to) = if run % 2 == 0 { (80, 20) } else { (20, 80) };
        let first = next;
        let swing_window = first + BEFORE;
        let swing_at_us = swing_window * period_us() + (run * 500_000) % period_us();
        let end = swing_window + AFTER;
        until(first * period_us()).await;
        let load = Load::start(&world, "api", "swing", &key, &split(from));
        until(swing_at_us).await;
        load.set(&split(to));
        until(end * period_us()).await;
        let records = load.stop().await;
        next = end;

        let admitted = admitted_per_window(&records, PERIOD, false, 2);
        let demand = demand_per_window(&records);
        // The first window is left out of the capacity figure and of the
        // 80 % floor (not of ≤ L): the key is new in it, and its traffic
        // starts when the load generator has connected, a moment into it.
        let counted = first + 1..end;
        let (mut used, mut capacity) = (0u64, 0u64);
        let mut worst_share = f64::MAX;
        let mut most = 0;
        let mut shortfalls = Vec::new();
        let mut lines = Vec::new();
        for w in first..end {
            let per_region = admitted.get(&w).cloned().unwrap_or_else(|| vec![0, 0]);
            let total: u64 = per_region.iter().sum();
            let asked = demand.get(&w).copied().unwrap_or(0);
            most = most.max(total);
            let tag = match w {
                w if w == first => " (new key, not counted)",
                w if w == swing_window => " (swing)",
                _ => "",
            };
            lines.push(format!(
                "  window {}: admitted {per_region:?} = {total} of {asked} asked{tag}",
                w - first
            ));
            if total > L {
                failures.push(format!(
                    "run {run}: window {} admitted {total} > L={L}",
                    w - first
                ));
            }
            if counted.contains(&w) {
                used += total;
                capacity += asked.min(L);
                worst_share = worst_share.min(total as f64 / L as f64);
                if asked >= L && total * 10 < L * 8 {
                    shortfalls.push(format!(
                        "run {run}: window {}{tag} asked {asked} and admitted only {total} (< 80 % of L={L})",
                        w - first
                    ));
                }
            }
        }
        // Anything admitted after the run's last window (a check in flight
        // when the load stopped) still counts against L.
        for (w, per_region) in admitted.range(end..) {
            let total: u64 = per_region.iter().sum();
            if total > L {
                failures.push(format!("run {run}: window {w} admitted {total} > L={L}"));
            }
        }
        let share = used as f64 / capacity.max(1) as f64;
        if share < 0.95 {
            shortfalls.push(format!(
                "run {run}: used {:.1} % of capacity (< 95 %)",
                share * 100.0
            ));
        }
        eprintln!(
            "run {run} ({from}/{} → {to}/{}, swing {:.1} s into its window): capacity used {:.1} %, worst window {:.0} % of L, most {most}\n{}",
            100 - from,
            100 - to,
            (swing_at_us % period_us()) as f64 / 1e6,
            share * 100.0,
            worst_share * 100.0,
            lines.join("\n")
        );
        if share < 0.95 || worst_share < 0.8 {
            let from_us = first * period_us();
            for (at, line) in trace.lock().expect("trace").iter() {
                if (from_us..end * period_us()).contains(at) {
                    eprintln!("    {:+.1} s {line}", (*at as f64 - from_us as f64) / 1e6);
                }
            }
            for line in limits_enforced(&records, from_us) {
                eprintln!("    {line}");
            }
        }
        runs.push(Run {
            capacity: share,
            worst_share,
            most,
            shortfalls,
        });
    }
    watcher.abort();
    let capacities: Vec<String> = runs
        .iter()
        .map(|r| format!("{:.1}", r.capacity * 100.0))
        .collect();
    let worst: Vec<String> = runs
        .iter()
        .map(|r| format!("{:.0}", r.worst_share * 100.0))
        .collect();
    eprintln!(
        "swing: {RUNS} runs in {:.0} s; capacity used % per run {capacities:?}; worst counted window % of L per run {worst:?}; most admitted in any window {} (L={L})",
        started.elapsed().as_secs_f64(),
        runs.iter().map(|r| r.most).max().unwrap_or(0)
    );
    // The goals hold in every run but at most one, which a loaded
    // machine may make miss a round (seen once under the full suite before
    // the step shrink, with runs on a quiet box all ≥ 99.5 %); that one must
    // still use 80 % of its capacity.
    let short: Vec<String> = runs
        .iter()
        .flat_map(|r| r.shortfalls.iter().cloned())
        .collect();
    eprintln!("short of the issue's goals:\n{}", short.join("\n"));
    let short_runs = runs.iter().filter(|r| !r.shortfalls.is_empty()).count();
    if short_runs > 1 {
        failures.push(format!(
            "{short_runs} runs fell short of the issue's goals:\n{}",
            short.join("\n")
        ));
    }
    for (run, r) in runs.iter().enumerate() {
        if r.capacity < 0.80 {
            failures.push(format!(
                "run {run}: used {:.1} % of capacity (< 80 %)",
                r.capacity * 100.0
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The dead region's fallback is held this long after its lease (the rule's
/// `fallback_hold`), then steps down.
const FALLBACK_HOLD: Duration = Duration::from_secs(2);

/// The key's shares per region, as the coordinator grants them.
async fn key_shares(world: &World, rule: &str, key: &str) -> BTreeMap<String, u64> {
    let body = world.allocations(&format!("rule={rule}&key={key}")).await;
    granted(&body["shares"])
}

/// When (Unix µs) the epoch that first granted `region` at least `least` of
/// `key` was committed, from the allocation history.
async fn granted_at_us(world: &World, rule: &str, key: &str, region: &str, least: u64) -> u64 {
    let body = world
        .allocations(&format!("rule={rule}&key={key}&history=50"))
        .await;
    // Newest first: of the epochs that changed the region's share, the last
    // of those granting at least `least` before one that granted less.
    let changed = |record: &Value| -> Option<(u64, u64)> {
        let change = record["changes"]
            .as_array()?
            .iter()
            .find(|c| c["region"] == region)?;
        Some((record["at_unix_ms"].as_u64()?, change["granted"].as_u64()?))
    };
    body["history"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(changed)
        .take_while(|(_, granted)| *granted >= least)
        .map(|(at_ms, _)| at_ms)
        .last()
        .map(|ms| ms * 1000)
        .unwrap_or_else(|| panic!("no epoch in the history grants {region} {least}: {body}"))
}

/// The epochs that changed `key`'s shares since `since_us`, oldest first,
/// with their commit times from `since_us`.
async fn history_since(world: &World, rule: &str, key: &str, since_us: u64) -> Vec<String> {
    let body = world
        .allocations(&format!("rule={rule}&key={key}&history=50"))
        .await;
    let mut lines: Vec<String> = body["history"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|record| {
            let at_us = record["at_unix_ms"].as_u64()? * 1000;
            (at_us >= since_us).then(|| {
                format!(
                    "epoch {} at {:+.1} s: {}",
                    record["epoch"],
                    (at_us - since_us) as f64 / 1e6,
                    record["changes"]
                )
            })
        })
        .collect();
    lines.reverse();
    lines
}

/// Hyderabad's only limiter is killed with SIGKILL while both regions ask
/// for more than their shares. Its fallback (half its static share) stays
/// reserved while it could still be using it — until its lease and then its
/// `fallback_hold` have run out on its own clock — and is then granted to
/// mumbai, within two rounds of that deadline plus the skew margin.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill_9_every_limiter_of_a_region_returns_its_share_after_the_fallback_hold() {
    let rule = "api|held";
    let mut world = World::start(
        &strict_rule(
            "held",
            &format!("    fallback_hold: {}s\n", FALLBACK_HOLD.as_secs()),
        ),
        &["mumbai", "hyderabad"],
    )
    .await;
    // 60/40 of 2 L per period: both regions want more than half of L.
    let load = Load::start(
        &world,
        "api",
        "held",
        "acme",
        &[RATE * 6 / 10, RATE * 4 / 10],
    );
    world.wait_allocated(rule, Duration::from_secs(20)).await;
    // Two whole windows under load for the split to settle; the kill comes
    // mid-window, when hyderabad has admitted most of its share of it.
    until((now_us() / period_us() + 3) * period_us() + period_us() * 5 / 8).await;
    let before = key_shares(&world, rule, "acme").await;
    eprintln!("before the kill: {before:?}");

    let killed_us = now_us();
    let killed = Instant::now();
    let status = world.regions[1].limiter.kill();
    eprintln!("hyderabad's limiter killed: {status}");
    // Mumbai must be granted ≥ 90 % of L within lease + hold + skew margin +
    // two rounds (+ 2 s for reports and Raft on a loaded machine), and not
    // before hyderabad's hold is over (until then hyderabad may still admit
    // its fallback, so strict leaves it reserved). The hold ends
    // `fallback_hold` after the last lease the coordinator gave hyderabad —
    // which may be one it published in the round after the kill: it cannot
    // know the lease never arrived.
    let within = LEASE + FALLBACK_HOLD + SKEW_MARGIN + 2 * REBALANCE + Duration::from_secs(2);
    let freed = L * 9 / 10;
    let mut lease_until_us = 0;
    let granted_us = loop {
        let leases = world.allocations("").await;
        let lease = leases["leases"]["hyderabad"]["valid_until_unix_ms"]
            .as_u64()
            .expect("hyderabad holds a lease")
            * 1000;
        if lease > lease_until_us {
            lease_until_us = lease;
            eprintln!(
                "hyderabad's lease ends {:.1} s after the kill",
                (lease as f64 - killed_us as f64) / 1e6,
            );
        }
        let hold_until_us = lease_until_us + FALLBACK_HOLD.as_micros() as u64;
        let shares = key_shares(&world, rule, "acme").await;
        let sum: u64 = shares.values().sum();
        assert!(sum <= L, "strict shares sum to {sum} > L={L}: {shares:?}");
        let mumbai = shares.get("mumbai").copied().unwrap_or(0);
        if mumbai >= freed {
            // When the leader committed the grant (not when this poll saw it).
            let at = granted_at_us(&world, rule, "acme", "mumbai", freed).await;
            eprintln!(
                "mumbai granted {mumbai} {:.1} s after the kill ({:+.1} s from the end of hyderabad's hold; seen {:.1} s after the kill): {shares:?}",
                (at as f64 - killed_us as f64) / 1e6,
                (at as f64 - hold_until_us as f64) / 1e6,
                killed.elapsed().as_secs_f64(),
            );
            for line in history_since(&world, rule, "acme", killed_us).await {
                eprintln!("  {line}");
            }
            assert!(
                at >= hold_until_us,
                "mumbai was granted {mumbai} {:.1} s before hyderabad's fallback hold ended",
                (hold_until_us - at) as f64 / 1e6
            );
            break at;
        }
        assert!(
            killed.elapsed() < within,
            "mumbai was not granted the dead region's share ({freed} of L={L}) within {within:?} of the kill: {shares:?}\n{}",
            world.allocations(&format!("rule={rule}")).await
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    // Two whole windows under the new grant (it applies from the next
    // window boundary at the latest).
    let first_full = granted_us / period_us() + 1;
    until((first_full + 2) * period_us()).await;
    let records = load.stop().await;

    let windows = admitted_per_window(&records, PERIOD, false, 2);
    let killed_in = killed_us / period_us();
    for (w, per_region) in &windows {
        let total: u64 = per_region.iter().sum();
        let start = (w * period_us()) as f64;
        let tag = match *w {
            w if w == killed_in => " (kill)",
            w if w >= first_full => " (after the grant)",
            _ => "",
        };
        eprintln!(
            "window at {:+.1} s from the kill: admitted {per_region:?} = {total}{tag}",
            (start - killed_us as f64) / 1e6
        );
    }
    for (w, per_region) in &windows {
        let total: u64 = per_region.iter().sum();
        assert!(
            total <= L,
            "window {w} admitted {total} > L={L} ({per_region:?})"
        );
    }
    let mumbai_before = windows.get(&(killed_in - 1)).map_or(0, |w| w[0]);
    for w in first_full..first_full + 2 {
        let mumbai = windows.get(&w).map_or(0, |w| w[0]);
        assert!(
            mumbai >= freed,
            "mumbai admitted {mumbai} in window {w}, after it was granted ≥ {freed} (it admitted {mumbai_before} before the kill)"
        );
    }

    // The leader's ledger, from the pods' reports, says the same: no period
    // of the rule above L, from before the kill to the end. A period is
    // final one period after it ends; wait for the last one the load filled.
    let last = first_full + 1;
    let ledger = world_ledger(&world, rule, last, PERIOD * 3).await;
    let figures: BTreeMap<u64, &Value> = ledger["periods"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| Some((p["start_unix_ms"].as_u64()? * 1000 / period_us(), p)))
        .collect();
    for w in killed_in - 1..=last {
        let figure = figures
            .get(&w)
            .unwrap_or_else(|| panic!("the ledger has no period for window {w}: {ledger}"));
        let admitted = figure["admitted"].as_u64().unwrap_or(u64::MAX);
        eprintln!(
            "ledger, window at {:+.1} s from the kill: admitted {admitted} {} (test counted {:?}), complete {}",
            ((w * period_us()) as f64 - killed_us as f64) / 1e6,
            figure["regions"],
            windows.get(&w),
            figure["complete"]
        );
    }
    for (w, figure) in &figures {
        let admitted = figure["admitted"].as_u64().unwrap_or(u64::MAX);
        assert!(
            admitted <= L && figure["over_bound"] == false,
            "the ledger shows window {w} at {admitted} > L={L}: {figure}"
        );
    }
    assert_eq!(
        ledger["periods_over_bound_last_hour"], 0,
        "the ledger counts periods over the bound: {ledger}"
    );
}

/// `GET /api/v1/ledger?rule=…` for `rule` once its finished periods reach
/// `window` (waits up to `within`).
async fn world_ledger(world: &World, rule: &str, window: u64, within: Duration) -> Value {
    let started = Instant::now();
    let path = format!("/api/v1/ledger?rule={rule}&periods=60");
    loop {
        let leader = world.cluster.wait_leader(Duration::from_secs(10)).await;
        let body = match world.cluster.get(leader, &path).await {
            Some((200, body)) => body,
            other => panic!("GET {path}: {other:?}"),
        };
        let ledger = body["rules"][rule].clone();
        let newest = ledger["periods"]
            .as_array()
            .and_then(|p| p.last())
            .and_then(|p| p["start_unix_ms"].as_u64())
            .map_or(0, |ms| ms * 1000 / period_us());
        if newest >= window {
            return ledger;
        }
        assert!(
            started.elapsed() < within,
            "the ledger finished no period for window {window} within {within:?}: {ledger}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
