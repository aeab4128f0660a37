//! The control plane in virtual time: the coordinator hears the pods'
//! reports, runs the leader's rounds (Meridian) or Doorman's proportional
//! re-division, and streams each pod its region's update over the
//! simulated network.

use std::rc::Rc;

use rand::Rng;

use super::{Event, RULE, SimWorld, Strategy, T0_MS, abs};
use crate::algorithm::Algorithm;
use crate::allocation::demand::DemandTracker;
use crate::allocation::global_rule::GlobalRule;
use crate::allocation::leader::{Leader, PodReport, RegionDef};
use crate::allocation::pod::{CountedRule, Holding};
use crate::allocation::table::{RegionUpdate, RuleUpdate, region_update};
use crate::allocation::{Allocations, EpochDelta, fallback_share};
use crate::rules::Accuracy;
use crate::sim::scenario::Scenario;

/// The simulated coordinator's memory.
pub(super) struct SimCoordinator {
    /// The committed allocation state (Meridian); Proportional uses only its
    /// epoch number.
    pub(super) state: Allocations,
    /// Meridian: the coordinator's own leader, in virtual time.
    pub(super) leader: Leader,
    /// The earliest pending [`Event::Lead`] (relative ms).
    pub(super) lead_at: Option<i64>,
    /// Proportional share: Doorman's latest wants (unsmoothed), and when
    /// they were last rolled.
    pub(super) wants: DemandTracker,
    pub(super) last_roll: i64,
    /// The epoch each pod's stream has carried; `None` after the stream
    /// broke (a snapshot follows when the link is back).
    pub(super) sent: Vec<Vec<Option<u64>>>,
    /// Proportional share: the last update per region, resent on reconnect.
    pub(super) latest: Vec<Option<Rc<RegionUpdate>>>,
    pub(super) regions: Vec<RegionDef>,
}

impl SimWorld {
    /// The coordinator hears a pod's report.
    pub(super) fn ingest(&mut self, at: i64, report: &PodReport) {
        let meridian = self.strategy == Strategy::Meridian;
        let Some(c) = self.coordinator.as_mut() else {
            return;
        };
        if !meridian {
            if report.interval_ms > 0 {
                c.wants.count_report(&report.region);
            }
            for rd in &report.rules {
                let period = self.scenario.rule.period_ms as u64;
                c.wants.record(
                    &report.region,
                    RULE,
                    period,
                    &rd.keys,
                    rd.remainder_asked,
                    report.interval_ms,
                );
            }
            return;
        }
        let heard = c.leader.ingest(report, &c.state, &c.regions, abs(at));
        if heard.wake {
            self.schedule_lead(at);
        }
    }

    /// Makes sure an [`Event::Lead`] is pending for the leader's next due
    /// time (never before `now`).
    pub(super) fn schedule_lead(&mut self, now: i64) {
        let Some(c) = self.coordinator.as_mut() else {
            return;
        };
        let at = (c.leader.next_due().saturating_sub(T0_MS)).max(now);
        if c.lead_at.is_some_and(|pending| pending <= at) {
            return;
        }
        c.lead_at = Some(at);
        self.schedule(at, Event::Lead);
    }

    /// Runs every round the leader has due at `now` and publishes its epochs.
    pub(super) fn lead(&mut self, now: i64) {
        if let Some(end) = self.outage_end(now) {
            // No coordinator is reachable: nothing runs until it is back.
            self.schedule(end, Event::Lead);
            return;
        }
        loop {
            let Some(c) = self.coordinator.as_mut() else {
                return;
            };
            let Some(kind) = c.leader.due(abs(now)) else {
                break;
            };
            if let Some(delta) = c.leader.round(kind, abs(now), &c.state, &c.regions) {
                self.publish(now, delta);
            }
        }
        self.schedule_lead(now + 1);
    }

    /// When the coordinator outage covering `t` ends.
    pub(super) fn outage_end(&self, t: i64) -> Option<i64> {
        self.scenario
            .coordinator
            .outages
            .iter()
            .find(|o| o.contains(t))
            .map(|o| o.to_ms)
    }

    /// Pod `p` of region `r`'s report at `t`, cut by its [`PodAccount`] as
    /// a limiter cuts it: the epoch it holds, its window use, what it
    /// admitted per period, pending top-ups and — `with_demand` — its
    /// demand since its last demand report.
    pub(super) fn pod_report(
        &mut self,
        r: usize,
        p: usize,
        t: i64,
        with_demand: bool,
    ) -> PodReport {
        let rule = &self.scenario.rule;
        let pod = &mut self.regions[r].pods[p];
        let counted = (rule.algorithm == Algorithm::FixedWindow)
            .then(|| pod.table.window_cap(RULE, abs(t)))
            .flatten()
            .map(|cap| CountedRule {
                rule: RULE.into(),
                period_ms: rule.period_ms as u64,
                cap,
            });
        let holding = Holding {
            epoch: pod.table.epoch(),
            counted: counted.into_iter().collect(),
        };
        pod.account.report(&holding, with_demand, abs(t))
    }

    /// Proportional share: re-divides by the wants of the last interval.
    pub(super) fn round_proportional(&mut self, now: i64) {
        let Some(c) = self.coordinator.as_mut() else {
            return;
        };
        let pods: Vec<(String, usize)> = self
            .scenario
            .regions
            .iter()
            .map(|r| (r.name.clone(), r.pods))
            .collect();
        c.wants.roll(&|region| {
            pods.iter()
                .find(|(name, _)| name == region)
                .map_or(1, |(_, n)| *n)
        });
        c.last_roll = now;
        let names: Vec<&str> = c.regions.iter().map(|r| r.name.as_str()).collect();
        let mut totals = Vec::new();
        c.wants.rule_totals(RULE, &names, &mut totals);
        let mut keys: Vec<(String, Vec<f64>)> = Vec::new();
        c.wants.for_each_key(RULE, &names, &mut |k, d| {
            keys.push((k.to_string(), d.to_vec()))
        });
        // The tracker iterates a hash map: sort so output is seeded only.
        keys.sort_by(|a, b| a.0.cmp(&b.0));
        self.publish_proportional(now, &totals, &keys, false);
    }

    /// Commits `delta` and streams each pod its update.
    pub(super) fn publish(&mut self, now: i64, delta: EpochDelta) {
        let links: Vec<bool> = (0..self.regions.len()).map(|r| self.link(r, now)).collect();
        let Some(c) = self.coordinator.as_mut() else {
            return;
        };
        let prev = c.state.epoch;
        c.state.apply(&delta);
        let mut out = Vec::new();
        for (r, spec) in self.scenario.regions.iter().enumerate() {
            if !links[r] {
                continue;
            }
            let incremental = region_update(&c.state, &spec.name, Some(&delta)).map(Rc::new);
            let mut snapshot = None;
            for p in 0..spec.pods {
                let update = if c.sent[r][p] == Some(prev) {
                    incremental.clone()
                } else {
                    snapshot
                        .get_or_insert_with(|| {
                            region_update(&c.state, &spec.name, None).map(Rc::new)
                        })
                        .clone()
                };
                c.sent[r][p] = Some(c.state.epoch);
                if let Some(update) = update {
                    out.push((now + spec.latency_ms, r, p, update));
                }
            }
        }
        for (at, region, pod, update) in out {
            self.schedule(
                at,
                Event::Deliver {
                    region,
                    pod,
                    update,
                },
            );
        }
    }

    /// Doorman-style: each region's share of `L` in proportion to its demand.
    pub(super) fn publish_proportional(
        &mut self,
        now: i64,
        totals: &[f64],
        keys: &[(String, Vec<f64>)],
        instant: bool,
    ) {
        let s = self.scenario.clone();
        let limit = s.rule.limit;
        let weights: Vec<f64> = s.regions.iter().map(|r| r.weight).collect();
        let split = proportional(limit, totals, &weights);
        let entries: Vec<(&String, Vec<u64>)> = keys
            .iter()
            .map(|(k, d)| (k, proportional(limit, d, &weights)))
            .collect();
        let links: Vec<bool> = (0..self.regions.len()).map(|r| self.link(r, now)).collect();
        let Some(c) = self.coordinator.as_mut() else {
            return;
        };
        c.state.epoch += 1;
        let epoch = c.state.epoch;
        // Renewed only by these scheduled rounds: a lease of three
        // intervals, as the coordinator's leases were before renewals ran at
        // their own instants, so the baseline never lapses between rounds.
        let lease_ms = (s.coordinator.config.lease_ms).max(3 * s.coordinator.rebalance_interval_ms);
        let mut out = Vec::new();
        for (r, spec) in s.regions.iter().enumerate() {
            let update = Rc::new(RegionUpdate {
                epoch,
                valid_until_ms: abs(now) + lease_ms,
                full: true,
                rules: vec![RuleUpdate {
                    rule: RULE.into(),
                    limit,
                    fallback: fallback_share(self.regions[r].static_share, s.rule.fallback),
                    split: Some(split[r]),
                    keys: entries
                        .iter()
                        .map(|(k, a)| ((*k).clone(), Some(a[r])))
                        .collect(),
                    ..Default::default()
                }],
                removed_rules: Vec::new(),
            });
            c.latest[r] = Some(update.clone());
            if instant {
                for (p, pod) in self.regions[r].pods.iter_mut().enumerate() {
                    let _ = pod.table.apply(&update, abs(now), |_| None);
                    c.sent[r][p] = Some(epoch);
                }
                continue;
            }
            if !links[r] {
                continue;
            }
            for p in 0..spec.pods {
                c.sent[r][p] = Some(epoch);
                out.push((now + spec.latency_ms, r, p, update.clone()));
            }
        }
        for (at, region, pod, update) in out {
            self.schedule(
                at,
                Event::Deliver {
                    region,
                    pod,
                    update,
                },
            );
        }
    }

    /// Pods whose stream broke get a snapshot once the link is back.
    pub(super) fn resync(&mut self, t: i64) {
        let links: Vec<bool> = (0..self.regions.len()).map(|r| self.link(r, t)).collect();
        let strategy = self.strategy;
        let Some(c) = self.coordinator.as_mut() else {
            return;
        };
        let mut out = Vec::new();
        for (r, spec) in self.scenario.regions.iter().enumerate() {
            if !links[r] {
                continue;
            }
            for p in 0..spec.pods {
                if c.sent[r][p] == Some(c.state.epoch) {
                    continue;
                }
                let update = match strategy {
                    Strategy::Meridian => region_update(&c.state, &spec.name, None).map(Rc::new),
                    _ => c.latest[r].clone(),
                };
                c.sent[r][p] = Some(c.state.epoch);
                if let Some(update) = update {
                    out.push((t + spec.latency_ms, r, p, update));
                }
            }
        }
        for (at, region, pod, update) in out {
            self.schedule(
                at,
                Event::Deliver {
                    region,
                    pod,
                    update,
                },
            );
        }
    }

    /// Cuts the demand reports due at `t` and sends them, each pod on its
    /// own timer: due every report interval × (1 ± jitter) after its last,
    /// lost with `report_loss`, delivered after the region's latency plus
    /// up to `report_late_ms`.
    pub(super) fn send_reports(&mut self, t: i64) {
        let c = &self.scenario.coordinator;
        let (interval, jitter, loss, late) = (
            c.report_interval_ms,
            c.report_jitter,
            c.report_loss,
            c.report_late_ms,
        );
        let mut out = Vec::new();
        for r in 0..self.regions.len() {
            let failed = self.failed(r, t);
            let link = self.link(r, t);
            for p in 0..self.regions[r].pods.len() {
                let due = self.regions[r].pods[p].next_report;
                if t < due {
                    continue;
                }
                let gap = if jitter > 0.0 {
                    let f = 1.0 + jitter * self.rng.random_range(-1.0..=1.0);
                    ((interval as f64 * f).round() as i64).max(1)
                } else {
                    interval
                };
                // A timer that fell behind (a step longer than the
                // interval) fires once and starts again from now.
                let next = if due + gap > t { due + gap } else { t + gap };
                self.regions[r].pods[p].next_report = next;
                if failed {
                    continue;
                }
                let report = self.pod_report(r, p, t, true);
                let lost = self.rng.random::<f64>() < loss;
                if !link || lost {
                    continue;
                }
                let delay = if late > 0 {
                    self.rng.random_range(0..=late)
                } else {
                    0
                };
                out.push((
                    t + self.scenario.regions[r].latency_ms + delay,
                    Event::Report { region: r, report },
                ));
            }
        }
        for (at, event) in out {
            self.schedule(at, event);
        }
    }
}

/// Doorman's proportional share, plus spare capacity by weight (so a region
/// with no demand yet is not shut out for a whole interval).
fn proportional(limit: u64, demand: &[f64], weights: &[f64]) -> Vec<u64> {
    let total: f64 = demand.iter().sum();
    let w: f64 = weights.iter().sum();
    let l = limit as f64;
    demand
        .iter()
        .zip(weights)
        .map(|(d, wt)| {
            let share = if total <= 0.0 {
                l * wt / w
            } else if total <= l {
                d + (l - total) * wt / w
            } else {
                l * d / total
            };
            share.floor().max(0.0) as u64
        })
        .collect()
}

/// The coordinator's leader as the scenario configures it, dividing the
/// scenario's one global rule.
pub(super) fn new_leader(s: &Scenario) -> Leader {
    let mut leader = Leader::new(s.coordinator.leader_config());
    let rule = GlobalRule::new(
        RULE,
        s.rule.limit,
        s.rule.algorithm,
        Accuracy::Exact,
        s.rule.period_ms as u64,
        s.rule.partition,
        s.rule.fallback,
    )
    .with_fallback_hold(s.rule.fallback_hold_ms);
    leader.set_rules(None, vec![rule]);
    leader.seed(&Allocations::default(), abs(0));
    leader
}
