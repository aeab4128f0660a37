//! One strategy's world: regions with pods and counters, the network between
//! them and the coordinator, and the coordinator itself — advanced in virtual
//! time, one step at a time, with control-plane messages as timed events.
//!
//! Meridian's coordinator is the real one minus Raft: the coordinator's own
//! [`Leader`] decides every round (demand, acknowledgements, top-ups, in-window
//! re-grants), its deltas are applied with `Allocations::apply`, and every pod
//! enforces through the real `Table`. A committed epoch is what the leader
//! would commit; replication delay is folded into the network latency.

use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::algorithm::Algorithm;
use crate::algorithm::Micros;
use crate::allocation::demand::DemandTracker;
use crate::allocation::global_rule::GlobalRule;
use crate::allocation::leader::{Leader, PodReport, RegionDef};
use crate::allocation::pod::{CountedRule, Decided, Holding, PodAccount};
use crate::allocation::table::{RegionUpdate, RuleUpdate, Table, region_update};
use crate::allocation::{
    Allocations, EpochDelta, Millis, RegionInput, RegionStatus, fallback_share, next_round_at,
    static_shares,
};
use crate::rules::{Accuracy, Partition};

use super::enforce::{Counters, ParamsCache};
use super::scenario::Scenario;
use super::traffic::Batch;

/// The simulated global rule's id.
pub const RULE: &str = "global";
/// Virtual Unix time of the simulation start: a midnight UTC, so clock-aligned
/// windows and follow-the-sun hours line up with the scenario's seconds.
pub const T0_MS: Millis = 1_700_006_400_000;

/// How allocations are decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Strategy {
    /// One exact world-wide counter: the reference every strategy is judged
    /// against; each check pays the round trip to it.
    Ideal,
    /// Each region enforces its static share by weight, forever.
    Static,
    /// Doorman-style proportional share: every interval each region gets
    /// `L × its demand / total demand` (spare capacity by weight), applied
    /// as soon as it arrives — no shrink-before-grow, no window boundary.
    Proportional,
    /// The real rebalancer: EWMA, floors/demand/headroom division, shrink before grow,
    /// window-boundary switching, leases, early top-up.
    Meridian,
}

impl Strategy {
    /// Every strategy, in the order runs and reports list them.
    pub const ALL: [Strategy; 4] = [
        Strategy::Ideal,
        Strategy::Static,
        Strategy::Proportional,
        Strategy::Meridian,
    ];

    /// The name used in reports and file names (`ideal`, `static`, …).
    pub fn name(self) -> &'static str {
        match self {
            Strategy::Ideal => "ideal",
            Strategy::Static => "static",
            Strategy::Proportional => "proportional",
            Strategy::Meridian => "meridian",
        }
    }
}

enum Event {
    /// Coordinator → pod.
    Deliver {
        region: usize,
        pod: usize,
        update: Rc<RegionUpdate>,
    },
    /// Pod → coordinator: demand, the epoch it holds (an acknowledgement
    /// alone has no demand) and top-up requests, as a limiter reports them.
    Report { region: usize, report: PodReport },
    /// Meridian: the leader may have a round due.
    Lead,
    /// Proportional share: a scheduled re-division.
    Round,
}

struct Pod {
    table: Table,
    /// What the pod counted and reports: the limiter's own [`PodAccount`].
    account: PodAccount,
    /// When its next demand report is due (relative ms): its own timer,
    /// out of phase with the other pods' and with the rounds.
    next_report: i64,
}

struct Region {
    counters: Counters,
    pods: Vec<Pod>,
    static_share: u64,
}

/// The coordinator's memory.
struct Coordinator {
    /// The committed allocation state (Meridian); Proportional uses only its
    /// epoch number.
    state: Allocations,
    /// Meridian: the coordinator's own leader, in virtual time.
    leader: Leader,
    /// The earliest pending [`Event::Lead`] (relative ms).
    lead_at: Option<i64>,
    /// Proportional share: Doorman's latest wants (unsmoothed), and when
    /// they were last rolled.
    wants: DemandTracker,
    last_roll: i64,
    /// The epoch each pod's stream has carried; `None` after the stream
    /// broke (a snapshot follows when the link is back).
    sent: Vec<Vec<Option<u64>>>,
    /// Proportional share: the last update per region, resent on reconnect.
    latest: Vec<Option<Rc<RegionUpdate>>>,
    regions: Vec<RegionDef>,
}

/// A region cut off from the coordinator under `partition: available`.
struct Cut {
    /// When the cut began (relative ms).
    from_ms: i64,
    /// Its pods' allocation tables at that instant: what the region may keep
    /// enforcing for one lease.
    tables: Vec<Table>,
}

/// What one strategy admitted in the current window (closed by the runner).
#[derive(Default)]
pub struct WindowAcc {
    /// Per key: (asked, admitted) world-wide.
    pub keys: HashMap<u32, (u64, u64)>,
    pub region_admitted: Vec<u64>,
    /// The most any of key 0's pods enforced per region during the window.
    pub key0_alloc: Vec<u64>,
    /// Round trips to the global counter paid (Ideal), in ms, and checks.
    pub rtt_ms: u128,
    pub checks: u64,
    /// Token bucket: the largest excess over `B + R·T` seen this window.
    pub bucket_excess: f64,
}

pub struct Engine {
    pub strategy: Strategy,
    scenario: Rc<Scenario>,
    keys: Rc<[String]>,
    regions: Vec<Region>,
    ideal: Option<Counters>,
    coordinator: Option<Coordinator>,
    params: ParamsCache,
    events: BTreeMap<(i64, u64), Event>,
    seq: u64,
    rng: StdRng,
    pub acc: WindowAcc,
    /// Token bucket check per key: (admitted so far, min over past steps of
    /// admitted − R·t).
    bucket: HashMap<u32, (u64, f64)>,
    /// Token bucket: admitted world-wide per key in the current step.
    step_hits: HashMap<u32, u64>,
    /// `partition: available`: what each cut-off region held when its cut
    /// began (the allowance the stated bounds give).
    cuts: Vec<Cut>,
    failed_before: Vec<bool>,
    partitioned_before: Vec<bool>,
}

fn abs(t: i64) -> Millis {
    T0_MS + t
}

fn abs_us(t: i64) -> Micros {
    (abs(t) as u64) * 1000
}

impl Engine {
    pub fn new(
        scenario: Rc<Scenario>,
        strategy: Strategy,
        seed: u64,
        keys: Rc<[String]>,
    ) -> Engine {
        let s = &scenario;
        let inputs: Vec<RegionInput> = s
            .regions
            .iter()
            .map(|r| RegionInput {
                name: r.name.clone(),
                weight: r.weight,
                status: RegionStatus::Active,
                last_heard_ms: Some(abs(0)),
                acked: None,
            })
            .collect();
        let statics = static_shares(s.rule.limit, &inputs);
        let regions = s
            .regions
            .iter()
            .zip(&statics)
            .enumerate()
            .map(|(i, (r, share))| Region {
                counters: Counters::new(s.rule.algorithm, s.traffic.customers),
                pods: (0..r.pods)
                    .map(|p| Pod {
                        table: pod_table(s),
                        account: pod_account(s, &r.name, p),
                        next_report: first_report(s, i, p),
                    })
                    .collect(),
                static_share: *share,
            })
            .collect();
        let coordinator =
            matches!(strategy, Strategy::Proportional | Strategy::Meridian).then(|| {
                Coordinator {
                    state: Allocations::default(),
                    leader: new_leader(s),
                    lead_at: None,
                    // Doorman acts on the latest wants, unsmoothed.
                    wants: DemandTracker::new(1.0),
                    last_roll: 0,
                    sent: s.regions.iter().map(|r| vec![None; r.pods]).collect(),
                    latest: vec![None; s.regions.len()],
                    regions: s
                        .regions
                        .iter()
                        .map(|r| RegionDef {
                            name: r.name.clone(),
                            weight: r.weight,
                            status: RegionStatus::Active,
                        })
                        .collect(),
                }
            });
        let n = s.regions.len();
        let mut engine = Engine {
            strategy,
            keys,
            regions,
            ideal: (strategy == Strategy::Ideal)
                .then(|| Counters::new(s.rule.algorithm, s.traffic.customers)),
            coordinator,
            params: ParamsCache::new(&s.rule),
            events: BTreeMap::new(),
            seq: 0,
            rng: StdRng::seed_from_u64(seed.wrapping_mul(31).wrapping_add(strategy as u64 + 1)),
            acc: WindowAcc {
                region_admitted: vec![0; n],
                key0_alloc: vec![0; n],
                ..Default::default()
            },
            bucket: HashMap::new(),
            step_hits: HashMap::new(),
            cuts: Vec::new(),
            failed_before: vec![false; n],
            partitioned_before: vec![false; n],
            scenario,
        };
        engine.bootstrap();
        engine
    }

    /// The system has been running before t = 0: every pod holds the first
    /// epoch (the static split) and the coordinator knows it.
    fn bootstrap(&mut self) {
        match self.strategy {
            Strategy::Meridian => {
                // Every pod says it is there; the leader grants the regions
                // their leases and static shares in one round, which every
                // pod holds and acknowledges at t = 0.
                for r in 0..self.regions.len() {
                    for p in 0..self.regions[r].pods.len() {
                        let report = self.pod_report(r, p, 0, false);
                        self.ingest(0, &report);
                    }
                }
                let Some(c) = self.coordinator.as_mut() else {
                    return;
                };
                if let Some(kind) = c.leader.due(abs(0))
                    && let Some(delta) = c.leader.round(kind, abs(0), &c.state, &c.regions)
                {
                    c.state.apply(&delta);
                }
                for (r, region) in self.regions.iter_mut().enumerate() {
                    let name = &self.scenario.regions[r].name;
                    if let Some(update) = region_update(&c.state, name, None) {
                        for (p, pod) in region.pods.iter_mut().enumerate() {
                            let _ = pod.table.apply(&update, abs(0), |_| None);
                            c.sent[r][p] = Some(c.state.epoch);
                        }
                    }
                }
                for r in 0..self.regions.len() {
                    for p in 0..self.regions[r].pods.len() {
                        let report = self.pod_report(r, p, 0, false);
                        self.ingest(0, &report);
                    }
                }
                self.schedule_lead(0);
            }
            Strategy::Proportional => {
                let demand = vec![0.0; self.regions.len()];
                self.publish_proportional(0, &demand, &[], true);
                // Scheduled re-divisions end just before window boundaries,
                // as the coordinator's rounds do.
                let first = next_round_at(
                    abs(0),
                    self.scenario.coordinator.rebalance_interval_ms,
                    self.scenario.coordinator.round_lead_ms,
                );
                self.schedule(first - abs(0), Event::Round);
            }
            _ => {}
        }
    }

    fn schedule(&mut self, at: i64, event: Event) {
        self.seq += 1;
        self.events.insert((at, self.seq), event);
    }

    fn failed(&self, r: usize, t: i64) -> bool {
        self.scenario.regions[r]
            .failures
            .iter()
            .any(|f| f.contains(t))
    }

    fn coordinator_up(&self, t: i64) -> bool {
        !self
            .scenario
            .coordinator
            .outages
            .iter()
            .any(|o| o.contains(t))
    }

    /// Region `r` and the coordinator can talk at `t`.
    fn link(&self, r: usize, t: i64) -> bool {
        self.coordinator_up(t)
            && !self.failed(r, t)
            && !self.scenario.regions[r]
                .partitions
                .iter()
                .any(|p| p.contains(t))
    }

    fn latency(&self, r: usize) -> i64 {
        self.scenario.regions[r].latency_ms
    }

    /// Advances to `t` and serves the step's requests.
    pub fn step(&mut self, t: i64, batches: &[Batch]) {
        // What happened before `t` reached the pods before a failure that
        // starts at `t` restarts them.
        self.handle_until(t - 1);
        self.region_events(t);
        self.handle_until(t);
        if self.coordinator.is_some() {
            self.resync(t);
            self.send_reports(t);
        }
        self.serve(t, batches);
    }

    fn handle_until(&mut self, t: i64) {
        while let Some(entry) = self.events.first_entry() {
            if entry.key().0 > t {
                break;
            }
            let ((at, _), event) = entry.remove_entry();
            self.handle(at, event);
        }
    }

    /// Failures restart a region's pods (empty tables); available-mode cuts
    /// remember what the region held when it went silent.
    fn region_events(&mut self, t: i64) {
        for r in 0..self.regions.len() {
            let failed = self.failed(r, t);
            if failed && !self.failed_before[r] {
                let name = &self.scenario.regions[r].name;
                for (p, pod) in self.regions[r].pods.iter_mut().enumerate() {
                    pod.table = pod_table(&self.scenario);
                    pod.account = pod_account(&self.scenario, name, p);
                    if let Some(c) = self.coordinator.as_mut() {
                        c.sent[r][p] = None;
                    }
                }
            }
            self.failed_before[r] = failed;
            let cut = self.scenario.regions[r]
                .partitions
                .iter()
                .find(|p| p.contains(t))
                .copied();
            if let Some(span) = cut
                && !self.partitioned_before[r]
                && self.scenario.rule.partition == Partition::Available
            {
                let tables = self.regions[r]
                    .pods
                    .iter()
                    .map(|p| p.table.clone())
                    .collect();
                self.cuts.push(Cut {
                    from_ms: span.from_ms,
                    tables,
                });
            }
            self.partitioned_before[r] = cut.is_some();
        }
    }

    fn handle(&mut self, at: i64, event: Event) {
        match event {
            Event::Deliver {
                region,
                pod,
                update,
            } => {
                if !self.link(region, at) {
                    if let Some(c) = self.coordinator.as_mut() {
                        c.sent[region][pod] = None;
                    }
                    return;
                }
                let window = (self.strategy == Strategy::Meridian && self.scenario.rule.windowed())
                    .then_some(self.scenario.rule.period_ms as u64);
                let table = &mut self.regions[region].pods[pod].table;
                let _ = table.apply(&update, abs(at), |_| window);
                // The pod acknowledges the epoch it now holds.
                let report = self.pod_report(region, pod, at, false);
                let lat = self.latency(region);
                self.schedule(at + lat, Event::Report { region, report });
            }
            Event::Report { region, report } => {
                if self.link(region, at) {
                    self.ingest(at, &report);
                }
            }
            Event::Lead => {
                if let Some(c) = self.coordinator.as_mut()
                    && c.lead_at == Some(at)
                {
                    c.lead_at = None;
                }
                self.lead(at);
            }
            Event::Round => {
                let interval = self.scenario.coordinator.rebalance_interval_ms;
                self.schedule(at + interval, Event::Round);
                if self.coordinator_up(at) {
                    self.round_proportional(at);
                }
            }
        }
    }

    /// The coordinator hears a pod's report.
    fn ingest(&mut self, at: i64, report: &PodReport) {
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
    fn schedule_lead(&mut self, now: i64) {
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
    fn lead(&mut self, now: i64) {
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
    fn outage_end(&self, t: i64) -> Option<i64> {
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
    fn pod_report(&mut self, r: usize, p: usize, t: i64, with_demand: bool) -> PodReport {
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
    fn round_proportional(&mut self, now: i64) {
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
    fn publish(&mut self, now: i64, delta: EpochDelta) {
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
    fn publish_proportional(
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
    fn resync(&mut self, t: i64) {
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
    fn send_reports(&mut self, t: i64) {
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

    fn serve(&mut self, t: i64, batches: &[Batch]) {
        let now_ms = abs(t);
        let now_us = abs_us(t);
        let s = self.scenario.clone();
        let period = s.rule.period_ms;
        let fixed_window = s.rule.algorithm == Algorithm::FixedWindow;
        // A step's checks are spread over it: the pods count them at its
        // last millisecond (still the same window and period, as steps
        // divide the period), so a top-up's pace since a report covers the
        // step's own span too.
        let counted_at = now_ms + s.step_ms - 1;
        let window_end = (now_ms.div_euclid(period) + 1) * period;
        // Pods that asked for a top-up: they report once the step's checks
        // are counted, as a limiter's reporter wakes for them.
        let mut asked_top_up = Vec::new();
        for (r, spec) in s.regions.iter().enumerate() {
            let pods = spec.pods;
            // Key 0's allocation here, for the plots.
            let alloc0 = match self.strategy {
                Strategy::Ideal => s.rule.limit,
                Strategy::Static => self.regions[r].static_share,
                _ if self.failed(r, t) => 0,
                _ => self.regions[r].pods[0]
                    .table
                    .limit(RULE, &self.keys[0], now_ms)
                    .unwrap_or(0),
            };
            self.acc.key0_alloc[r] = self.acc.key0_alloc[r].max(alloc0);
            for &(key, n) in &batches[r] {
                let n = u64::from(n);
                let mut admitted = 0;
                if let Some(ideal) = self.ideal.as_mut() {
                    let params = self.params.get(s.rule.limit);
                    admitted = ideal.admit(key, n, params, now_us).0;
                    self.acc.rtt_ms += u128::from(n) * 2 * spec.latency_ms as u128;
                } else {
                    let mut split = [0u64; 64];
                    if n >= pods as u64 {
                        let base = n / pods as u64;
                        let first = self.rng.random_range(0..pods);
                        for (p, slot) in split.iter_mut().take(pods).enumerate() {
                            let extra = ((p + pods - first) % pods) < (n % pods as u64) as usize;
                            *slot = base + u64::from(extra);
                        }
                    } else {
                        for _ in 0..n {
                            split[self.rng.random_range(0..pods)] += 1;
                        }
                    }
                    for (p, &k) in split.iter().take(pods).enumerate() {
                        if k == 0 {
                            continue;
                        }
                        let region = &mut self.regions[r];
                        let limit = match self.strategy {
                            Strategy::Static => region.static_share,
                            _ => region.pods[p]
                                .table
                                .limit(RULE, &self.keys[key as usize], now_ms)
                                .unwrap_or(0),
                        };
                        let (got, remaining) =
                            region
                                .counters
                                .admit(key, k, self.params.get(limit), now_us);
                        admitted += got;
                        if self.coordinator.is_none() {
                            continue;
                        }
                        let mut decided = Decided {
                            rule: RULE,
                            key: &self.keys[key as usize],
                            period_ms: period as u64,
                            cost: got,
                            allowed: true,
                            limit,
                            remaining,
                            reset_after_us: (window_end - counted_at).max(0) as u64 * 1_000,
                            window_use: true,
                            fixed_window,
                            counted: fixed_window,
                            windowed: s.rule.windowed(),
                        };
                        let account = &mut region.pods[p].account;
                        let mut topped = got > 0 && account.record(&decided, counted_at);
                        if k > got {
                            (decided.cost, decided.allowed) = (k - got, false);
                            topped |= account.record(&decided, counted_at);
                        }
                        if topped && self.strategy == Strategy::Meridian && s.coordinator.top_up {
                            asked_top_up.push((r, p));
                        }
                    }
                }
                if !s.rule.windowed() {
                    *self.step_hits.entry(key).or_default() += admitted;
                }
                self.acc.checks += n;
                self.acc.region_admitted[r] += admitted;
                let e = self.acc.keys.entry(key).or_default();
                e.0 += n;
                e.1 += admitted;
            }
        }
        asked_top_up.sort_unstable();
        asked_top_up.dedup();
        for (r, p) in asked_top_up {
            let report = self.pod_report(r, p, t, false);
            if self.link(r, t) {
                self.schedule(
                    t + s.regions[r].latency_ms,
                    Event::Report { region: r, report },
                );
            }
        }
        if !s.rule.windowed() {
            self.check_bucket(t);
        }
    }

    /// What the stated bounds (docs/architecture.md) let the world admit
    /// above `L` for `key` in the window `[from, to)`: with `partition: available`, the allocation a cut-off
    /// region held when it went silent, for at most one lease after.
    pub fn allowance(&self, key: u32, from: i64, to: i64) -> u64 {
        let c = &self.scenario.coordinator.config;
        self.cuts
            .iter()
            .filter(|cut| from < cut.from_ms + c.lease_ms + c.skew_margin_ms && to > cut.from_ms)
            .map(|cut| {
                cut.tables
                    .iter()
                    .filter_map(|t| t.limit(RULE, &self.keys[key as usize], abs(cut.from_ms)))
                    .max()
                    .unwrap_or(0)
            })
            .sum()
    }

    /// Token bucket bound: world-wide admitted over any interval T is at most
    /// `B + R·T`. Admissions happen at step instants, so for steps i < j the
    /// hits admitted in steps i+1..=j span T = t_j − t_{i+1}.
    fn check_bucket(&mut self, t: i64) {
        let s = &self.scenario;
        let rate = s.rule.limit as f64 / s.rule.period_ms as f64;
        let burst = s.rule.burst.unwrap_or(s.rule.limit) as f64;
        let step = s.step_ms as f64;
        for (&key, &this) in &self.step_hits {
            let (total, low) = self.bucket.entry(key).or_insert((0, f64::INFINITY));
            // Every step the key was idle lowers total − R·t; the lowest of
            // those is the one just before this step.
            let before = *total as f64 - rate * (t as f64 - step);
            *low = low.min(before);
            *total += this;
            let excess = (*total as f64 - rate * t as f64) - *low - (burst - rate * step);
            if excess > 1e-6 && excess > self.acc.bucket_excess {
                self.acc.bucket_excess = excess;
            }
        }
        self.step_hits.clear();
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

/// Pod `p` of `region`'s empty account: reports name it `region-p` and
/// list the scenario's `top_n` keys.
fn pod_account(s: &Scenario, region: &str, p: usize) -> PodAccount {
    PodAccount::new(region, &format!("{region}-{p}")).with_top_keys(s.coordinator.top_n)
}

/// When pod `p` of region `r` first reports: every pod of the world on
/// its own phase, spread evenly over the interval (on step boundaries), as
/// limiters started at different times are.
fn first_report(s: &Scenario, r: usize, p: usize) -> i64 {
    let (interval, step) = (s.coordinator.report_interval_ms, s.step_ms);
    let index = s.regions[..r].iter().map(|x| x.pods).sum::<usize>() + p;
    let pods = s.regions.iter().map(|x| x.pods).sum::<usize>().max(1);
    let offset = (index as i64 * interval / pods as i64) / step * step;
    (interval - offset % interval) % interval
}

/// A pod's empty allocation table, holding the rule's `fallback_hold`.
fn pod_table(s: &Scenario) -> Table {
    let mut table = Table::default();
    table.set_fallback_holds(HashMap::from([(RULE.to_string(), s.rule.fallback_hold_ms)]));
    table
}

/// The coordinator's leader as the scenario configures it, dividing the
/// scenario's one global rule.
fn new_leader(s: &Scenario) -> Leader {
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
