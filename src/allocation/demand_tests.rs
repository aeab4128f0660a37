//! The demand estimator through the [`Leader`], with pods that report on
//! their own timers: reports missing, doubled, late and jittered must move a
//! region's demand by no more than its traffic moved, and the split must not
//! flap (issue: rounds every 2 s, reports every 10 s, a third of real runs
//! used 60–79 % of capacity).

use super::global_rule::GlobalRule;
use super::leader::{Leader, LeaderConfig, PodReport, RegionDef, RuleDemand};
use super::{Allocations, Config, Millis, RegionStatus, demand::KeyDemand};
use crate::algorithm::Algorithm;
use crate::rules::{Accuracy, Partition};

const RULE: &str = "api|k";
const L: u64 = 200;
const PERIOD: u64 = 10_000;
const ROUNDS: i64 = 2_000;
const T0: Millis = 1_700_000_000_000;

fn leader() -> Leader {
    let mut leader = Leader::new(LeaderConfig {
        rebalancer: Config::default(),
        rebalance_interval_ms: ROUNDS,
        round_lead_ms: ROUNDS / 4,
        top_up: true,
    });
    let rule = GlobalRule::new(
        RULE,
        L,
        Algorithm::FixedWindow,
        Accuracy::Exact,
        PERIOD,
        Partition::Strict,
        0.5,
    );
    leader.set_rules(None, vec![rule]);
    leader
}

fn regions() -> Vec<RegionDef> {
    ["a", "b"]
        .iter()
        .map(|name| RegionDef {
            name: (*name).into(),
            weight: 1.0,
            status: RegionStatus::Active,
        })
        .collect()
}

/// How a pod's reports reach the leader.
#[derive(Clone, Copy, Default)]
struct Delivery {
    /// Every report is delivered twice.
    doubled: bool,
    /// Every other report is lost.
    lossy: bool,
    /// Added to every delivery.
    late_ms: i64,
    /// Intervals alternate between 0.8 and 1.2 times the nominal one.
    jitter: bool,
}

/// One pod per region, reporting every `interval_ms` (out of phase) the
/// hits its region asked at `rate(region, t)` per period; rounds run as
/// the leader asks. Returns the demand of each region after every full
/// round, and the split's grants after every round, from `from_ms` on.
fn run(
    interval_ms: i64,
    delivery: Delivery,
    until_ms: i64,
    rate: impl Fn(usize, i64) -> f64,
) -> (Vec<[f64; 2]>, Vec<[u64; 2]>) {
    let regions = regions();
    let mut leader = leader();
    let mut state = Allocations::default();
    leader.seed(&state, T0);
    let mut next_report = [T0 + 100, T0 + 100 + interval_ms / 2];
    let mut last_report = [T0 - interval_ms; 2];
    let mut sent = [0u32; 2];
    // Reports in flight: (deliver at, report).
    let mut wire: Vec<(Millis, PodReport)> = Vec::new();
    let (mut demand, mut grants) = (Vec::new(), Vec::new());
    let mut t = T0;
    while t < T0 + until_ms {
        for r in 0..2 {
            if t < next_report[r] {
                continue;
            }
            let span = t - last_report[r];
            // The hits asked over the span, at the region's pace then.
            let asked = (rate(r, t) * span as f64 / PERIOD as f64).round() as u64;
            last_report[r] = t;
            sent[r] += 1;
            let nominal = interval_ms as f64;
            let factor = match (delivery.jitter, sent[r] % 2) {
                (true, 0) => 0.8,
                (true, _) => 1.2,
                _ => 1.0,
            };
            next_report[r] = t + (nominal * factor) as i64;
            if delivery.lossy && sent[r] % 2 == 0 {
                continue;
            }
            let report = PodReport {
                region: regions[r].name.clone(),
                pod: format!("{}-0", regions[r].name),
                epoch: state.epoch,
                interval_ms: span as u64,
                rules: vec![RuleDemand {
                    rule: RULE.into(),
                    keys: vec![KeyDemand {
                        key: "c42".into(),
                        asked,
                        allowed: asked,
                    }],
                    ..RuleDemand::default()
                }],
                ..PodReport::default()
            };
            let at = t + delivery.late_ms;
            if delivery.doubled {
                wire.push((at, report.clone()));
            }
            wire.push((at, report));
        }
        let (now, later): (Vec<_>, Vec<_>) = wire.drain(..).partition(|(at, _)| *at <= t);
        wire = later;
        for (_, report) in now {
            leader.ingest(&report, &state, &regions, t);
        }
        while let Some(kind) = leader.due(t) {
            if let Some(delta) = leader.round(kind, t, &state, &regions) {
                state.apply(&delta);
            }
            if kind == super::leader::RoundKind::Full {
                let mut d = Vec::new();
                leader.demand().rule_totals(RULE, &["a", "b"], &mut d);
                demand.push([d[0], d[1]]);
            }
            if let Some(rule) = state.rules.get(RULE) {
                let g = |n: &str| rule.split.get(n).map_or(0, |s| s.granted);
                grants.push([g("a"), g("b")]);
            }
        }
        t += 100;
    }
    (demand, grants)
}

/// 2 L per period, 80 % from a.
fn steady(r: usize, _t: i64) -> f64 {
    [320.0, 80.0][r]
}

/// After the first 30 s (reports have arrived from every pod), each
/// region's smoothed demand is within 25 % of its real pace in every round.
fn assert_follows(demand: &[[f64; 2]], what: &str) {
    let settled = &demand[15..];
    assert!(!settled.is_empty(), "{what}: no rounds");
    for (i, d) in settled.iter().enumerate() {
        for (r, want) in [320.0, 80.0].iter().enumerate() {
            let off = (d[r] - want).abs() / want;
            assert!(
                off <= 0.25,
                "{what}: round {i}: region {r} reads {:.1} for a pace of {want} ({demand:?})",
                d[r]
            );
        }
    }
}

#[test]
fn rounds_faster_than_reports_hear_no_news_not_zero_demand() {
    let (demand, grants) = run(10_000, Delivery::default(), 120_000, steady);
    assert_follows(&demand, "reports every 10 s, rounds every 2 s");
    // The split does not swing: a holds most of L in every round once set.
    for g in &grants[grants.len() / 2..] {
        assert!(g[0] >= 120 && g[0] + g[1] <= L, "split swung: {g:?}");
    }
}

#[test]
fn doubled_late_lost_or_jittered_reports_move_demand_no_more_than_traffic() {
    for (what, delivery) in [
        (
            "doubled",
            Delivery {
                doubled: true,
                ..Delivery::default()
            },
        ),
        (
            "late by 3 s",
            Delivery {
                late_ms: 3_000,
                ..Delivery::default()
            },
        ),
        (
            "every other lost",
            Delivery {
                lossy: true,
                ..Delivery::default()
            },
        ),
        (
            "jittered ±20 %",
            Delivery {
                jitter: true,
                ..Delivery::default()
            },
        ),
    ] {
        let (demand, _) = run(10_000, delivery, 150_000, steady);
        assert_follows(&demand, what);
    }
}

#[test]
fn a_swing_is_followed_and_traffic_that_stops_brings_demand_down() {
    // 80/20 for 60 s, then 20/80; reports every 1 s.
    let swing = |r: usize, t: i64| {
        let shifted = t >= T0 + 60_000;
        match (r, shifted) {
            (0, false) | (1, true) => 320.0,
            _ => 80.0,
        }
    };
    let (demand, grants) = run(1_000, Delivery::default(), 120_000, swing);
    let last = demand.last().copied().unwrap_or_default();
    assert!(
        (last[0] - 80.0).abs() < 20.0 && (last[1] - 320.0).abs() < 60.0,
        "demand after the swing: {last:?}"
    );
    let g = grants.last().copied().unwrap_or_default();
    assert!(g[1] >= 120, "b holds most of L after the swing: {g:?}");
    // A region whose traffic stops (its pods still report, with no hits)
    // goes to no demand.
    let stops = |r: usize, t: i64| {
        if r == 0 && t >= T0 + 30_000 {
            0.0
        } else {
            80.0
        }
    };
    let (demand, _) = run(1_000, Delivery::default(), 60_000, stops);
    let last = demand.last().copied().unwrap_or_default();
    assert!(
        last[0] < 5.0,
        "a's demand after its traffic stopped: {last:?}"
    );
}

/// The step-down schedule through the Leader: region a is cut off; its
/// pods keep enforcing what they hold (their own clocks `skew` ahead of or
/// behind the leader's, at the margin both ways), then the fallback for the
/// hold, then nothing; the leader re-grants a's share to b at lease + hold +
/// skew margin. At every instant what a may enforce plus what b enforces
/// stays within L, and b ends up holding what a gave up.
#[test]
fn a_cut_off_region_steps_down_after_the_hold_and_the_survivor_gets_its_share() {
    use super::table::{Table, region_update};
    use std::collections::HashMap;

    const LEASE: i64 = 10_000;
    const HOLD: i64 = 3_000;
    const SKEW: i64 = 1_000;
    // Rounds far apart (60 s against a 10 s lease) must change nothing:
    // leases are renewed, and lapses acted on, at their own instants.
    for (skew, interval) in [
        (-SKEW, 1_000),
        (SKEW, 1_000),
        (-SKEW, 60_000),
        (SKEW, 60_000),
    ] {
        let regions = regions();
        let rebalancer = Config {
            lease_ms: LEASE,
            suspect_after_ms: 3_000,
            skew_margin_ms: SKEW,
            ..Config::default()
        };
        let mut leader = Leader::new(LeaderConfig {
            rebalancer,
            rebalance_interval_ms: interval,
            round_lead_ms: interval / 4,
            top_up: true,
        });
        let rule = GlobalRule::new(
            RULE,
            L,
            Algorithm::FixedWindow,
            Accuracy::Exact,
            1_000,
            Partition::Strict,
            0.5,
        )
        .with_fallback_hold(HOLD);
        leader.set_rules(None, vec![rule]);
        let mut state = Allocations::default();
        leader.seed(&state, T0);
        let holds = HashMap::from([(RULE.to_string(), HOLD)]);
        let mut tables = [Table::default(), Table::default()];
        for t in &mut tables {
            t.set_fallback_holds(holds.clone());
        }
        let window = |_: &str| Some(1_000);
        // After two scheduled rounds, so demand has rolled in.
        let cut_at = T0 + 5_000 + 2 * interval;
        let mut t = T0;
        let mut b_full_at = None;
        while t < cut_at + 35_000 {
            for (r, region) in ["a", "b"].iter().enumerate() {
                if r == 0 && t >= cut_at {
                    continue;
                }
                if (t - T0) % 500 == 0 {
                    let report = PodReport {
                        region: (*region).into(),
                        pod: format!("{region}-0"),
                        epoch: tables[r].epoch(),
                        interval_ms: 500,
                        rules: vec![RuleDemand {
                            rule: RULE.into(),
                            keys: vec![KeyDemand {
                                key: "c42".into(),
                                asked: 60,
                                allowed: 60,
                            }],
                            ..RuleDemand::default()
                        }],
                        ..PodReport::default()
                    };
                    leader.ingest(&report, &state, &regions, t);
                }
            }
            while let Some(kind) = leader.due(t) {
                if let Some(delta) = leader.round(kind, t, &state, &regions) {
                    state.apply(&delta);
                    for (r, region) in ["a", "b"].iter().enumerate() {
                        if r == 0 && t >= cut_at {
                            continue;
                        }
                        if let Some(u) = region_update(&state, region, Some(&delta)) {
                            // Each pod applies on its own clock.
                            let local = if r == 0 { t + skew } else { t };
                            let _ = tables[r].apply(&u, local, window);
                        }
                    }
                }
            }
            let a = tables[0].limit(RULE, "c42", t + skew).unwrap_or(0);
            let b = tables[1].limit(RULE, "c42", t).unwrap_or(0);
            assert!(
                a + b <= L,
                "skew {skew}, interval {interval}: at +{} ms a enforces {a} and b {b}, above L",
                t - T0
            );
            if b >= L - 1 && b_full_at.is_none() {
                b_full_at = Some(t);
            }
            t += 50;
        }
        // b holds all of L within a's lease — the last the centre
        // published, which a may or may not have received — + hold + skew
        // margin + the window boundary its grow waits for: the round runs
        // at the schedule's instant, not at the next scheduled one.
        let a_lease_end = state.regions["a"].valid_until_ms;
        let due = a_lease_end + HOLD + SKEW + 1_000 + 100;
        assert!(
            state.regions["b"].valid_until_ms > t,
            "interval {interval}: b's lease was renewed between rounds"
        );
        let full = b_full_at.unwrap_or(Millis::MAX);
        assert!(
            full <= due,
            "skew {skew}, interval {interval}: b held L at +{} ms, due by +{} ms",
            full - T0,
            due - T0
        );
    }
}
