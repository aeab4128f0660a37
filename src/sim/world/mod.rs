//! One strategy's world: regions with pods and counters, the network between
//! them and the coordinator, and the coordinator itself — advanced in virtual
//! time, one step at a time, with control-plane messages as timed events.
//!
//! Meridian's coordinator is the real one minus Raft: the coordinator's own
//! [`Leader`](crate::allocation::leader::Leader) decides every round
//! (demand, acknowledgements, top-ups, in-window re-grants), its deltas are
//! applied with `Allocations::apply`, and every pod enforces through the
//! real `Table`. A committed epoch is what the leader would commit;
//! replication delay is folded into the network latency.
//!
//! The world and its events here; the coordinator's side in `control`, the
//! pods serving requests in `serve`.

mod control;
mod costs;
mod serve;

use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;

use rand::SeedableRng;
use rand::rngs::StdRng;

use self::control::{SimCoordinator, new_leader};
use super::cost::{Calls, Charging, Pending};
use super::enforce::{Counters, ParamsCache};
use super::scenario::Scenario;
use super::traffic::Batch;
use crate::algorithm::Micros;
use crate::allocation::demand::DemandTracker;
use crate::allocation::leader::{PodReport, RegionDef};
use crate::allocation::pod::PodAccount;
use crate::allocation::table::{RegionUpdate, Table, region_update};
use crate::allocation::{
    Allocations, Millis, RegionInput, RegionStatus, next_round_at, static_shares,
};
use crate::rules::Partition;

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

/// A simulated limiter pod: its allocation table and its report account.
struct SimPod {
    table: Table,
    /// What the pod counted and reports: the limiter's own [`PodAccount`].
    account: PodAccount,
    /// When its next demand report is due (relative ms): its own timer,
    /// out of phase with the other pods' and with the rounds.
    next_report: i64,
}

/// A simulated region: its counters (its Redis), its pods, and its static
/// share (the `static` strategy's limit).
struct SimRegion {
    counters: Counters,
    pods: Vec<SimPod>,
    static_share: u64,
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
    /// Cost scenarios: tokens charged into the counters per key this
    /// window (estimates and excess, less refunds back into it) — what the
    /// stated bound is about, beside the tokens calls consumed.
    pub charged: HashMap<u32, i64>,
}

/// One strategy's world (see the module doc), stepped in virtual time.
pub struct SimWorld {
    pub strategy: Strategy,
    /// Cost scenarios: how calls are charged (`None`: hits, or the ideal
    /// counter, which knows each call's tokens when it admits it).
    pub charging: Option<Charging>,
    /// Cost scenarios: admitted calls waiting to settle, by (due, sequence).
    pending: BTreeMap<(i64, u64), Pending>,
    scenario: Rc<Scenario>,
    keys: Rc<[String]>,
    regions: Vec<SimRegion>,
    ideal: Option<Counters>,
    coordinator: Option<SimCoordinator>,
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

impl SimWorld {
    pub fn new(
        scenario: Rc<Scenario>,
        strategy: Strategy,
        seed: u64,
        keys: Rc<[String]>,
    ) -> SimWorld {
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
            .map(|(i, (r, share))| SimRegion {
                counters: Counters::new(s.rule.algorithm, s.traffic.customers),
                pods: (0..r.pods)
                    .map(|p| SimPod {
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
                SimCoordinator {
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
        let mut world = SimWorld {
            strategy,
            charging: None,
            pending: BTreeMap::new(),
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
        world.bootstrap();
        world
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

    /// The same world charging calls' costs by `charging` (cost scenarios).
    pub fn charging(mut self, charging: Charging) -> SimWorld {
        self.charging = Some(charging);
        self
    }

    /// Advances to `t` and serves the step's requests (`calls`: their costs,
    /// in a cost scenario).
    pub fn step(&mut self, t: i64, batches: &[Batch], calls: Option<&Calls>) {
        // What happened before `t` reached the pods before a failure that
        // starts at `t` restarts them.
        self.handle_until(t - 1);
        self.region_events(t);
        self.handle_until(t);
        if self.coordinator.is_some() {
            self.resync(t);
            self.send_reports(t);
        }
        match calls {
            Some(calls) => {
                self.settle_due(t);
                self.serve_calls(t, batches, calls);
            }
            None => self.serve(t, batches),
        }
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
