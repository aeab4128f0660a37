//! A lease schedule both sides follow: when it moves on its own, and what
//! it tells the centre about a region that comes back.
//!
//! A region's lease runs, then its fallback for each rule's hold, then
//! nothing — on the region's own clock (`lapsed_value`) and at the centre
//! `skew_margin` later. Two things follow from that schedule alone, with no
//! report needed:
//! - [`lease_steps`]: the instants it moves (a lease to renew, a lapse, a
//!   hold's end, an `available` region gone silent). The leader runs a round
//!   at each, so a dead region's share is re-granted when its schedule says,
//!   not at the next scheduled round, and leases are renewed whatever the
//!   rebalance interval;
//! - [`Returns`]: a region heard again after stepping down to nothing
//!   admitted nothing from then until it was re-leased, and since then at
//!   most what it was granted. Its pods, restarted within the window, report
//!   none of that window (a restarted pod cannot vouch for its
//!   predecessors), yet its use of it is known — so the capacity it comes
//!   back to can be granted within the window instead of at its end.

use std::collections::BTreeMap;

use super::{Allocations, Config, Millis, RegionInput, RegionWindow, RulePolicy};
use crate::rules::Partition;

/// The hold and partition of one rule, as the schedule needs them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Schedule {
    /// The rule's `fallback_hold` in milliseconds.
    pub hold_ms: i64,
    /// Whether a silent region's share moves before its lease ends.
    pub partition: Partition,
}

impl From<&RulePolicy> for Schedule {
    fn from(policy: &RulePolicy) -> Schedule {
        Schedule {
            hold_ms: policy.fallback_hold_ms,
            partition: policy.partition,
        }
    }
}

/// The first instant after `now` at which a lease schedule in `state` moves
/// without any report: a live region's lease has a third left (renewed then), a
/// region's lease has lapsed (its fallback is reserved from then), a rule's
/// hold has run out (nothing is reserved), or — under `partition:
/// available` — a region has been silent for `suspect_after`. Each is read
/// as the rebalancer reads it, the skew margin included, so the round at
/// that instant acts.
pub fn lease_steps(
    state: &Allocations,
    rules: &[Schedule],
    config: &Config,
    now: Millis,
) -> Option<Millis> {
    let available = rules.iter().any(|r| r.partition == Partition::Available);
    let mut first: Option<Millis> = None;
    let mut at = |t: Millis| {
        if t > now {
            first = Some(first.map_or(t, |f| f.min(t)));
        }
    };
    for lease in state.regions.values() {
        let until = lease.valid_until_ms;
        if until <= 0 {
            continue;
        }
        if lease.last_heard_ms >= now - config.suspect_after_ms {
            at(super::renew_at(until, config.lease_ms));
        }
        let lapsed = until.saturating_add(config.skew_margin_ms);
        at(lapsed + 1);
        for rule in rules {
            at(lapsed.saturating_add(rule.hold_ms.max(0)) + 1);
        }
        if available {
            at(lease.last_heard_ms.saturating_add(config.suspect_after_ms) + 1);
        }
    }
    first
}

/// A region heard again after its schedule had stepped it down to nothing.
#[derive(Debug, Clone, PartialEq, Default)]
struct Returned {
    /// The end of the lease it had before (its schedule started there).
    lease_until_ms: Millis,
    /// When it was heard again; it holds no value granted before this.
    back_ms: Millis,
    /// Per rule, the most it has been granted since `back_ms` (any key).
    high: BTreeMap<String, u64>,
}

/// The regions that came back recently (see the module docs). Lives in the
/// leader's memory: a new leader starts without it, which only means a
/// returning region's capacity waits for the window's end as before.
#[derive(Debug, Clone, Default)]
pub struct Returns {
    regions: BTreeMap<String, Returned>,
}

impl Returns {
    /// Notes every region heard at `now` whose lease in `state` (the state
    /// before this round re-leases it) had run out with every rule's hold,
    /// and forgets returns older than `forget_ms`.
    pub fn note(
        &mut self,
        state: &Allocations,
        inputs: &[RegionInput],
        rules: &[Schedule],
        config: &Config,
        now: Millis,
        forget_ms: i64,
    ) {
        self.regions.retain(|_, r| r.back_ms >= now - forget_ms);
        let longest = rules.iter().map(|r| r.hold_ms.max(0)).max().unwrap_or(0);
        for input in inputs {
            let heard = input
                .last_heard_ms
                .is_some_and(|h| h >= now - config.suspect_after_ms);
            let Some(lease) = state.regions.get(&input.name) else {
                continue;
            };
            let dark_from = lease
                .valid_until_ms
                .saturating_add(config.skew_margin_ms)
                .saturating_add(longest);
            if heard && lease.valid_until_ms > 0 && dark_from < now {
                self.regions.insert(
                    input.name.clone(),
                    Returned {
                        lease_until_ms: lease.valid_until_ms,
                        back_ms: now,
                        high: BTreeMap::new(),
                    },
                );
            }
        }
    }

    /// Raises each returned region's `high` to what `next` grants it.
    pub fn granted(&mut self, next: &Allocations) {
        for (region, ret) in self.regions.iter_mut() {
            for (rule, alloc) in &next.rules {
                let most = std::iter::once(&alloc.split)
                    .chain(alloc.keys.values().map(|k| &k.shares))
                    .filter_map(|shares| shares.get(region))
                    .map(|s| s.bound.max(s.granted))
                    .max()
                    .unwrap_or(0);
                let high = ret.high.entry(rule.clone()).or_default();
                *high = (*high).max(most);
            }
        }
    }

    /// `window` (region `region`'s use of `rule` in the window starting at
    /// `start_ms`) made known when the region was dark from before that
    /// start until it came back within the window: it admitted at most what
    /// it was granted since.
    pub fn complete(
        &self,
        region: &str,
        rule: &str,
        schedule: &Schedule,
        config: &Config,
        start_ms: Millis,
        window: &mut RegionWindow,
    ) {
        let Some(ret) = self.regions.get(region) else {
            return;
        };
        let dark_from = ret
            .lease_until_ms
            .saturating_add(config.skew_margin_ms)
            .saturating_add(schedule.hold_ms.max(0));
        if window.known() || dark_from >= start_ms || ret.back_ms < start_ms {
            return;
        }
        let live = window.live.max(1);
        window.live = live;
        window.reported = live;
        window.used.cap = window
            .used
            .cap
            .max(ret.high.get(rule).copied().unwrap_or(0));
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::algorithm::Algorithm;
    use crate::allocation::leader::{
        GlobalRule, Leader, LeaderConfig, PodReport, RegionDef, RuleDemand, RuleUse,
    };
    use crate::allocation::table::{Table, region_update};
    use crate::allocation::{RegionLease, RegionStatus, WindowUse, demand::KeyDemand};
    use crate::rules::Accuracy;

    const RULE: &str = "api|k";
    const L: u64 = 200;
    const PERIOD: i64 = 10_000;
    const T0: Millis = 1_700_000_000_000;

    #[test]
    fn the_schedule_moves_at_half_lease_lapse_and_each_hold_end() {
        let config = Config {
            lease_ms: 30_000,
            suspect_after_ms: 20_000,
            skew_margin_ms: 1_000,
            ..Config::default()
        };
        let mut state = Allocations::default();
        state.regions.insert(
            "a".into(),
            RegionLease {
                valid_until_ms: T0 + 30_000,
                last_heard_ms: T0,
                ..RegionLease::default()
            },
        );
        let rules = [
            Schedule {
                hold_ms: 60_000,
                partition: Partition::Strict,
            },
            Schedule {
                hold_ms: 5_000,
                partition: Partition::Strict,
            },
        ];
        let step = |now| lease_steps(&state, &rules, &config, now);
        assert_eq!(step(T0), Some(T0 + 20_000), "renewed with a third left");
        assert_eq!(step(T0 + 20_000), Some(T0 + 31_001), "lapsed, skew late");
        assert_eq!(step(T0 + 31_001), Some(T0 + 36_001), "the short hold ends");
        assert_eq!(step(T0 + 36_001), Some(T0 + 91_001), "the long hold ends");
        assert_eq!(step(T0 + 91_001), None, "nothing moves after that");
    }

    /// Region a goes silent and steps down to nothing; it comes back 2 s
    /// into a later window with a restarted pod, which reports none of that
    /// window. a admitted nothing in it before it came back, so the share it
    /// returns to is granted within the window — and only then: back within
    /// a window it may have admitted in, it waits for the boundary.
    #[test]
    fn a_region_back_from_nothing_is_granted_within_the_window_it_returns_in() {
        // (when a comes back, whether it may be granted before the boundary)
        for (back, in_window) in [(T0 + 12_000, true), (T0 + 7_600, false)] {
            let until = (back.div_euclid(PERIOD) + 1) * PERIOD;
            let first = run(back, until);
            if in_window {
                assert!(
                    first.is_some_and(|t| t < until - PERIOD / 2),
                    "back at +{} ms: a was granted at {:?}, due within its window",
                    back - T0,
                    first.map(|t| t - T0)
                );
            } else {
                assert!(
                    first.is_some_and(|t| t >= until),
                    "back at +{} ms: a was granted at {:?}, not before +{} ms",
                    back - T0,
                    first.map(|t| t - T0),
                    until - T0
                );
            }
        }
    }

    /// Runs the case above: when a first enforces more than nothing after
    /// `back`, asserting at every step that a and b together stay within L.
    fn run(back: Millis, end: Millis) -> Option<Millis> {
        let config = Config {
            lease_ms: 3_000,
            suspect_after_ms: 1_500,
            skew_margin_ms: 200,
            ..Config::default()
        };
        let mut leader = Leader::new(LeaderConfig {
            rebalancer: config,
            rebalance_interval_ms: 1_000,
            round_lead_ms: 250,
            top_up: true,
        });
        let rule = GlobalRule::new(
            RULE,
            L,
            Algorithm::FixedWindow,
            Accuracy::Exact,
            PERIOD as u64,
            Partition::Strict,
            0.5,
        )
        .with_fallback_hold(1_000);
        leader.set_rules(None, vec![rule]);
        let regions: Vec<RegionDef> = ["a", "b"]
            .iter()
            .map(|name| RegionDef {
                name: (*name).into(),
                weight: 1.0,
                status: RegionStatus::Active,
            })
            .collect();
        let mut state = Allocations::default();
        leader.seed(&state, T0);
        let holds = HashMap::from([(RULE.to_string(), 1_000)]);
        let mut tables = [Table::default(), Table::default()];
        for t in &mut tables {
            t.set_fallback_holds(holds.clone());
        }
        let window = |_: &str| Some(PERIOD as u64);
        let cut = T0 + 2_000;
        let mut first = None;
        let mut t = T0;
        while t < end + PERIOD {
            // a: pod a-0 until the cut; a-1, restarted empty, from `back`.
            let a_pod = if t < cut {
                Some("a-0")
            } else if t >= back {
                if t == back {
                    tables[0] = Table::default();
                    tables[0].set_fallback_holds(holds.clone());
                }
                Some("a-1")
            } else {
                None
            };
            if (t - T0) % 500 == 0 {
                let start = t.div_euclid(PERIOD) * PERIOD;
                for (r, pod) in [(0, a_pod), (1, Some("b-0"))] {
                    let Some(pod) = pod else { continue };
                    // b admits 10 a second; a-1 started within the window
                    // and reports none of it.
                    let used = (pod != "a-1" || start >= back).then(|| RuleUse {
                        rule: RULE.into(),
                        window_start_ms: start,
                        used: WindowUse {
                            count: if r == 1 {
                                ((t - start) / 100) as u64
                            } else {
                                0
                            },
                            cap: tables[r].window_cap(RULE, t).unwrap_or(0),
                        },
                    });
                    let report = PodReport {
                        region: ["a", "b"][r].into(),
                        pod: pod.into(),
                        epoch: tables[r].epoch(),
                        interval_ms: 500,
                        rules: vec![RuleDemand {
                            rule: RULE.into(),
                            keys: vec![KeyDemand {
                                key: "c42".into(),
                                asked: 50,
                                allowed: 50,
                            }],
                            ..RuleDemand::default()
                        }],
                        used: used.into_iter().collect(),
                        ..PodReport::default()
                    };
                    leader.ingest(&report, &state, &regions, t);
                }
            }
            while let Some(kind) = leader.due(t) {
                if let Some(delta) = leader.round(kind, t, &state, &regions) {
                    state.apply(&delta);
                    for (r, pod) in [(0, a_pod), (1, Some("b-0"))] {
                        if pod.is_some()
                            && let Some(u) = region_update(&state, ["a", "b"][r], Some(&delta))
                        {
                            let _ = tables[r].apply(&u, t, window);
                        }
                    }
                }
            }
            let a = tables[0].limit(RULE, "c42", t).unwrap_or(0);
            let b = tables[1].limit(RULE, "c42", t).unwrap_or(0);
            assert!(a + b <= L, "at +{} ms a enforces {a} and b {b}", t - T0);
            if t >= back && a > 0 && first.is_none() {
                first = Some(t);
            }
            t += 50;
        }
        first
    }
}
