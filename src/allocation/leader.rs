//! The allocation leader: reports in, rounds and epochs out.
//!
//! One pure type that the coordinator's Raft leader wraps (a lock, a tokio
//! loop, the Raft commit) and that the simulator drives in virtual time, so a
//! simulated bound is a statement about the real coordinator. It owns
//! everything the leader decides from:
//! - the smoothed demand ([`DemandTracker`]) and which epoch every pod holds
//!   (`AckTracker`), both fed by [`Leader::ingest`];
//! - the global rules of the enforced rule-set version ([`GlobalRule`]);
//! - when the next round is due and of which kind ([`Leader::due`]).
//!
//! No I/O, no clock: every operation takes the time, the committed
//! [`Allocations`] and the registered regions as arguments.
//!
//! ## Rounds
//! - **full** — at scheduled instants ([`next_round_at`]): the interval's
//!   reports roll into the EWMA, targets are recomputed, leases renewed;
//! - **top-up** — out of cycle, at most every [`TOP_UP_GAP_MS`]: a region
//!   asked for an early top-up, a report showed a step in demand, or a region
//!   was heard without a valid lease; targets from the current demand, no
//!   roll;
//! - **transition** — a region acknowledged an epoch while a shrink awaited
//!   its acknowledgement or a grow its capacity: targets stay, what the
//!   acknowledgement released is granted.

use super::reserved::ReservedBook;
use std::collections::{BTreeMap, BTreeSet};

use super::cadence::{ReportCadence, report_interval_for};
use super::demand::{AckTracker, DemandTracker, Pace};
// Defined apart so that the ledger reads them without importing the leader.
pub use super::global_rule::GlobalRule;
use super::ledger::Ledger;
use super::override_scale::OverrideScale;
pub use super::pod_report::{PodReport, RuleDemand, RuleUse, TopUp};
use super::rebalance::{Round, is_noop, rebalance};
use super::returns::{Returns, Schedule, lease_steps};
use super::{
    Allocations, Config, Epoch, EpochDelta, InWindow, Millis, RegionInput, RegionStatus,
    RulePolicy, Shares, next_round_at,
};

/// Out-of-cycle rounds (top-ups, demand steps, new regions) run at most this
/// often: each commits an epoch that every pod must receive and acknowledge.
pub const TOP_UP_GAP_MS: i64 = 1_000;

/// Acknowledgements arriving together (the pods of a region answer one
/// epoch within milliseconds) are handled in one transition round.
pub const ACK_DEBOUNCE_MS: i64 = 20;

/// How the leader schedules rounds.
#[derive(Debug, Clone, PartialEq)]
pub struct LeaderConfig {
    /// The rebalancer's knobs (leases, EWMA, floors, …).
    pub rebalancer: Config,
    /// Scheduled (full) rounds run every this long…
    pub rebalance_interval_ms: i64,
    /// …ending this long before each multiple of the interval in Unix time
    /// (see [`next_round_at`]).
    pub round_lead_ms: i64,
    /// Whether top-up requests and demand steps start out-of-cycle rounds
    /// (on in the coordinator; a simulator scenario may turn it off).
    pub top_up: bool,
}

/// A registered region, as the operator set it.
#[derive(Debug, Clone, PartialEq)]
pub struct RegionDef {
    /// The region's registered name, as its pods report it.
    pub name: String,
    /// Relative static share (> 0).
    pub weight: f64,
    /// The operator's status for the region.
    pub status: RegionStatus,
}

/// What one report changed, for the caller's metrics and wake-ups.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Heard {
    /// A round is due sooner than the next scheduled one: ask [`Leader::due`]
    /// at [`Leader::next_due`].
    pub wake: bool,
    /// Demand steps followed at once.
    pub steps: u32,
    /// Top-up requests that raised demand.
    pub top_ups: u32,
}

/// What kind of round is due (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RoundKind {
    /// A scheduled round: the EWMA rolls, targets are recomputed, leases renewed.
    Full,
    /// An out-of-cycle round from the current demand, without a roll.
    TopUp,
    /// Acknowledgements arrived: targets stay, released capacity is granted.
    Transition,
}

/// The leader's memory. Lives only on the Raft leader (and in the
/// simulator); a new leader starts from the committed state with
/// [`Leader::seed`], so nothing here needs replicating.
#[derive(Debug)]
pub struct Leader {
    config: LeaderConfig,
    /// Smoothed demand per rule, region and tracked key.
    demand: DemandTracker,
    /// The epoch each pod holds and its window use, from its reports.
    acks: AckTracker,
    /// The enforced rule-set version the rules below come from (`None`:
    /// none yet, or set directly by the simulator).
    rules_version: Option<u64>,
    rules: Vec<GlobalRule>,
    /// When demand last rolled into the EWMA.
    last_roll_ms: Millis,
    /// When the next scheduled round is due.
    next_round_ms: Millis,
    /// A top-up or a demand step asks for an out-of-cycle round.
    top_up: bool,
    /// When the last full or top-up round ran ([`TOP_UP_GAP_MS`]).
    last_top_up_ms: Option<Millis>,
    /// A region was heard without a valid lease (new, or back from a
    /// partition): it gets one in the next round, whatever the gap says.
    regions_changed: bool,
    /// A region's acknowledged epoch advanced while something was moving:
    /// a transition round is due [`ACK_DEBOUNCE_MS`] after this.
    acked_at: Option<Millis>,
    /// The newest epoch a pod acknowledged before this leader had applied
    /// it (a follower and its limiter can be ahead of the leader's own state
    /// machine by a moment): that acknowledgement is counted again once the
    /// state holds the epoch, or the transition it releases would wait for
    /// a scheduled round.
    ack_ahead: Option<Epoch>,
    /// Regions that reported but are not registered.
    unknown_regions: BTreeSet<String>,
    /// World-wide admitted per rule period, from the pods' reports.
    ledger: Ledger,
    /// Open reservations per key and region, from the pods' reports.
    reserved: ReservedBook,
    /// Pods whose reports cover longer spans than the interval given.
    cadence: ReportCadence,
    /// The next instant a lease schedule moves on its own (see
    /// [`lease_steps`]): a round then renews or re-grants at once instead
    /// of at the next scheduled round.
    step_at: Option<Millis>,
    /// Regions back after stepping down to nothing (see [`Returns`]).
    returns: Returns,
    /// Keys with an override: their reports are read in their rules' units.
    overrides: OverrideScale,
}

impl Leader {
    /// A leader that has not led yet; call [`Leader::seed`] when it starts.
    pub fn new(config: LeaderConfig) -> Leader {
        let cadence = ReportCadence::new(report_interval_for(config.rebalance_interval_ms));
        Leader {
            demand: DemandTracker::new(config.rebalancer.ewma_alpha),
            acks: AckTracker::new(config.rebalancer.suspect_after_ms),
            config,
            rules_version: None,
            rules: Vec::new(),
            last_roll_ms: 0,
            next_round_ms: 0,
            top_up: false,
            last_top_up_ms: None,
            regions_changed: false,
            acked_at: None,
            ack_ahead: None,
            unknown_regions: BTreeSet::new(),
            ledger: Ledger::default(),
            reserved: ReservedBook::default(),
            cadence,
            step_at: None,
            returns: Returns::default(),
            overrides: OverrideScale::default(),
        }
    }

    /// The overridden keys, whose reports are scaled to their rules' units.
    pub fn overrides_mut(&mut self) -> &mut OverrideScale {
        &mut self.overrides
    }

    /// The configuration the leader schedules with.
    pub fn config(&self) -> &LeaderConfig {
        &self.config
    }

    /// Starts leading at `now`: demand continues from what the last epoch
    /// committed (no learning period); acknowledgements start empty, which
    /// only delays grows until pods report again.
    pub fn seed(&mut self, state: &Allocations, now: Millis) {
        self.demand = DemandTracker::new(self.config.rebalancer.ewma_alpha);
        self.demand.seed(state);
        self.last_roll_ms = now;
        self.next_round_ms = self.scheduled_after(now);
        self.top_up = false;
        self.acked_at = None;
        self.step_at = lease_steps(state, &self.schedules(), &self.config.rebalancer, now);
    }

    /// The rule-set version the rules come from.
    pub fn rules_version(&self) -> Option<u64> {
        self.rules_version
    }

    /// The global rules to divide from now on (those of `version`).
    pub fn set_rules(&mut self, version: Option<u64>, rules: Vec<GlobalRule>) {
        self.rules_version = version;
        self.rules = rules;
        let rules = &self.rules;
        self.demand
            .retain_rules(|id| rules.iter().any(|r| r.policy.rule == id));
    }

    fn rule(&self, id: &str) -> Option<&GlobalRule> {
        self.rules.iter().find(|r| r.policy.rule == id)
    }

    fn scheduled_after(&self, now: Millis) -> Millis {
        next_round_at(
            now,
            self.config.rebalance_interval_ms,
            self.config.round_lead_ms,
        )
    }

    /// Whether a report from `pod` of `region` may be taken: the pod is
    /// known, or its region tracks fewer than
    /// [`MAX_PODS_PER_REGION`](super::demand::MAX_PODS_PER_REGION) pods.
    pub fn admits_pod(&self, region: &str, pod: &str) -> bool {
        self.acks.admits(region, pod)
    }

    /// Takes one pod's report. `state` is the committed allocation state and
    /// `regions` the registered regions; reports for unregistered regions
    /// are remembered ([`Leader::take_unknown_regions`]) and otherwise
    /// counted like any other.
    pub fn ingest(
        &mut self,
        report: &PodReport,
        state: &Allocations,
        regions: &[RegionDef],
        now: Millis,
    ) -> Heard {
        let rules = &self.rules;
        let normalized = self.overrides.normalize(report, |rule| {
            rules
                .iter()
                .find(|r| r.policy.rule == rule)
                .map(|r| r.policy.limit)
        });
        let report = normalized.as_ref();
        let mut heard = Heard::default();
        let lease_ms = self.config.rebalancer.lease_ms;
        let recent = self.config.rebalancer.suspect_after_ms;
        if !regions.iter().any(|r| r.name == report.region) {
            self.unknown_regions.insert(report.region.clone());
        }
        let leased = state
            .regions
            .get(&report.region)
            .is_some_and(|l| l.valid_until_ms > now);
        if !leased {
            self.regions_changed = true;
            heard.wake = true;
        }
        self.ledger.record(
            &report.region,
            &report.pod,
            &report.admitted,
            &self.rules,
            now,
        );
        self.reserved
            .record(&report.region, &report.pod, &report.reserved, now);
        self.cadence
            .observe(&report.region, &report.pod, report.interval_ms, now);
        let before = self.acks.region(&report.region, now, lease_ms).0;
        self.acks
            .record(&report.pod, &report.region, report.epoch, now);
        for u in &report.used {
            self.acks.record_use(
                &report.pod,
                &report.region,
                &u.rule,
                u.window_start_ms,
                u.used,
            );
        }
        let after = self.acks.region(&report.region, now, lease_ms).0;
        if report.epoch > state.epoch {
            self.ack_ahead = self.ack_ahead.max(Some(report.epoch));
        }
        let caught_up = self.ack_ahead.is_some_and(|e| e <= state.epoch);
        if caught_up {
            self.ack_ahead = None;
        }
        if (after > before || caught_up) && transition_pending(state) {
            self.acked_at.get_or_insert(now);
            heard.wake = true;
        }
        if report.interval_ms > 0 {
            self.demand.count_report(&report.region);
        }
        for rd in &report.rules {
            let Some(period) = self.rule(&rd.rule).map(|r| r.period_ms) else {
                continue;
            };
            self.demand.record(
                &report.region,
                &rd.rule,
                period,
                &rd.keys,
                rd.remainder_asked,
                report.interval_ms,
            );
            let pods = self.acks.live_pods(&report.region, now, recent);
            if self.config.top_up
                && self.demand.follow_steps(
                    &report.region,
                    &rd.rule,
                    period,
                    &rd.keys,
                    rd.remainder_asked,
                    report.interval_ms,
                    pods,
                )
            {
                heard.steps += 1;
                self.top_up = true;
                heard.wake = true;
            }
        }
        for t in &report.top_ups {
            let Some(period) = self.rule(&t.rule).map(|r| r.period_ms) else {
                continue;
            };
            if !(self.config.top_up && t.per_period.is_finite() && t.per_period >= 0.0) {
                continue;
            }
            let pace = Pace {
                pod_per_period: t.per_period,
                interval_ms: t.interval_ms,
                pods: self.acks.live_pods(&report.region, now, recent),
            };
            if self
                .demand
                .bump(&report.region, &t.rule, period, &t.key, pace)
            {
                heard.top_ups += 1;
                self.top_up = true;
                heard.wake = true;
            }
        }
        heard
    }

    /// When a round may next be due: the caller waits until then (or until
    /// [`Heard::wake`]) and asks [`Leader::due`].
    pub fn next_due(&self) -> Millis {
        let mut at = self.next_round_ms;
        if self.regions_changed {
            return Millis::MIN;
        }
        if self.top_up {
            let gap = self
                .last_top_up_ms
                .map_or(Millis::MIN, |t| t + TOP_UP_GAP_MS);
            at = at.min(gap);
        }
        if let Some(acked) = self.acked_at {
            at = at.min(acked + ACK_DEBOUNCE_MS);
        }
        if let Some(step) = self.step_at {
            at = at.min(step);
        }
        at
    }

    /// The round due at `now`, if any; asking consumes it (the caller then
    /// runs [`Leader::round`] with that kind).
    pub fn due(&mut self, now: Millis) -> Option<RoundKind> {
        let interval = self.config.rebalance_interval_ms;
        let mut kind = None;
        if now >= self.next_round_ms {
            self.next_round_ms = self.scheduled_after(now);
            // Right after seeding there is no interval's worth of reports
            // to roll yet: the round acts on the seeded demand.
            if now - self.last_roll_ms >= interval / 2 {
                kind = Some(RoundKind::Full);
            }
        }
        let gap_passed = self.last_top_up_ms.is_none_or(|t| now - t >= TOP_UP_GAP_MS);
        let stepped = self.step_at.is_some_and(|t| now >= t);
        if kind.is_none() && (self.regions_changed || stepped || self.top_up && gap_passed) {
            kind = Some(RoundKind::TopUp);
        }
        if kind.is_none() && self.acked_at.is_some_and(|t| now - t >= ACK_DEBOUNCE_MS) {
            kind = Some(RoundKind::Transition);
        }
        match kind {
            Some(RoundKind::Full) | Some(RoundKind::TopUp) => {
                self.regions_changed = false;
                self.top_up = false;
                self.last_top_up_ms = Some(now);
                self.acked_at = None;
            }
            Some(RoundKind::Transition) => self.acked_at = None,
            None => {}
        }
        kind
    }

    /// Runs a round of `kind` at `now` over the committed `state`: the delta
    /// to commit, or `None` when it would change nothing a limiter enforces.
    pub fn round(
        &mut self,
        kind: RoundKind,
        now: Millis,
        state: &Allocations,
        regions: &[RegionDef],
    ) -> Option<EpochDelta> {
        let cfg = &self.config.rebalancer;
        if kind == RoundKind::Full {
            let (acks, recent) = (&self.acks, cfg.suspect_after_ms);
            self.demand
                .roll(&|region| acks.live_pods(region, now, recent));
            self.last_roll_ms = now;
        }
        self.acks.forget_before(now - 2 * cfg.lease_ms);
        let inputs = self.region_inputs(regions, now);
        let schedules = self.schedules();
        let longest_period = self.rules.iter().map(|r| r.period_ms).max().unwrap_or(0);
        self.returns
            .note(state, &inputs, &schedules, cfg, now, longest_period as i64);
        let in_window = self.in_window(&inputs, now);
        let policies: Vec<RulePolicy> = self.rules.iter().map(|r| r.policy.clone()).collect();
        let round = Round {
            now_ms: now,
            regions: &inputs,
            rules: &policies,
            demand: (kind != RoundKind::Transition).then_some(&self.demand),
            in_window: Some(&in_window),
        };
        let next = rebalance(state, &round, cfg);
        self.returns.granted(&next);
        self.step_at = lease_steps(&next, &schedules, cfg, now);
        (!is_noop(state, &next)).then(|| state.diff(&next))
    }

    /// Each global rule's lease schedule, as [`lease_steps`] reads it.
    fn schedules(&self) -> Vec<Schedule> {
        self.rules
            .iter()
            .map(|r| Schedule::from(&r.policy))
            .collect()
    }

    /// What the rebalancer needs of each registered region: its pods heard
    /// within the lease decide its acknowledged epoch (a silent pod may
    /// still enforce what it was last sent until its lease runs out).
    fn region_inputs(&self, regions: &[RegionDef], now: Millis) -> Vec<RegionInput> {
        let lease_ms = self.config.rebalancer.lease_ms;
        regions
            .iter()
            .map(|r| {
                let (acked, heard) = self.acks.region(&r.name, now, lease_ms);
                RegionInput {
                    name: r.name.clone(),
                    weight: r.weight,
                    status: r.status,
                    last_heard_ms: heard,
                    acked,
                }
            })
            .collect()
    }

    /// The current window's use of every counted rule in every region, from
    /// the reports of the pods heard within the lease.
    fn in_window(&self, regions: &[RegionInput], now: Millis) -> BTreeMap<String, InWindow> {
        let within = self.config.rebalancer.lease_ms;
        self.rules
            .iter()
            .filter(|r| r.counted && r.period_ms > 0)
            .map(|r| {
                let p = r.period_ms as Millis;
                let start = now.div_euclid(p) * p;
                let window = InWindow {
                    start_ms: start,
                    until_ms: start + p,
                    elapsed: (now - start) as f64 / p as f64,
                    regions: regions
                        .iter()
                        .map(|g| {
                            let mut used =
                                self.acks
                                    .region_use(&g.name, &r.policy.rule, start, now, within);
                            let schedule = Schedule::from(&r.policy);
                            self.returns.complete(
                                &g.name,
                                &r.policy.rule,
                                &schedule,
                                &self.config.rebalancer,
                                start,
                                &mut used,
                            );
                            used
                        })
                        .collect(),
                };
                (r.policy.rule.clone(), window)
            })
            .collect()
    }

    /// A region's part changed outside the reports (an operator drained it,
    /// a drill began or ended): the next round runs at once.
    pub fn regions_changed(&mut self) {
        self.regions_changed = true;
    }

    /// Regions that reported without being registered, since the last call.
    pub fn take_unknown_regions(&mut self) -> BTreeSet<String> {
        std::mem::take(&mut self.unknown_regions)
    }

    /// Every pod heard, with the epoch it holds (admin API).
    pub fn pods(&self) -> Vec<super::demand::PodEpoch> {
        self.acks.pods()
    }

    /// Keys with tracked demand for `rule`.
    pub fn tracked_keys(&self, rule: &str) -> usize {
        self.demand.key_count(rule)
    }

    /// The smoothed demand (the simulator's baseline strategies read it).
    pub fn demand(&self) -> &DemandTracker {
        &self.demand
    }

    /// World-wide admitted per rule period ([`Ledger`]).
    pub fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    /// Open reservations per key and region ([`ReservedBook`]).
    pub fn reserved(&self) -> &ReservedBook {
        &self.reserved
    }

    /// The ledger, to give it the rule set's terms or advance its clock.
    pub fn ledger_mut(&mut self) -> &mut Ledger {
        &mut self.ledger
    }

    /// The pods reporting slower than the interval given ([`ReportCadence`]).
    pub fn report_cadence(&self) -> &ReportCadence {
        &self.cadence
    }

    /// The same, to take its warnings or forget silent pods.
    pub fn report_cadence_mut(&mut self) -> &mut ReportCadence {
        &mut self.cadence
    }
}

/// Some slot is still moving: a shrink not yet acknowledged (`bound` above
/// `granted`) or a grow not yet granted. Only then can an acknowledgement
/// release anything — a round run on every acknowledgement would commit an
/// epoch whose acknowledgements start the next, forever.
pub fn transition_pending(state: &Allocations) -> bool {
    let moving = |shares: &Shares| {
        shares
            .values()
            .any(|s| s.bound > s.granted || s.target > s.granted)
    };
    state
        .rules
        .values()
        .any(|r| moving(&r.split) || r.keys.values().any(|k| moving(&k.shares)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::Algorithm;
    use crate::rules::{Accuracy, Partition};

    fn leader() -> Leader {
        let mut leader = Leader::new(LeaderConfig {
            rebalancer: Config::default(),
            rebalance_interval_ms: 3_600_000,
            round_lead_ms: 5_000,
            top_up: true,
        });
        let rule = GlobalRule::new(
            "api|customer",
            1_000,
            Algorithm::SlidingWindowCounter,
            Accuracy::Exact,
            60_000,
            Partition::Strict,
            0.5,
        );
        leader.set_rules(None, vec![rule]);
        leader
    }

    /// hyderabad and mumbai, weight 1, active.
    fn two_regions() -> Vec<RegionDef> {
        ["hyderabad", "mumbai"]
            .iter()
            .map(|name| RegionDef {
                name: (*name).into(),
                weight: 1.0,
                status: RegionStatus::Active,
            })
            .collect()
    }

    fn heard(
        leader: &mut Leader,
        state: &mut Allocations,
        regions: &[RegionDef],
        region: &str,
        now: Millis,
    ) {
        let report = PodReport {
            region: region.into(),
            pod: format!("{region}-0"),
            epoch: state.epoch,
            ..PodReport::default()
        };
        assert!(
            leader.ingest(&report, state, regions, now).wake,
            "{region} heard without a lease"
        );
        while let Some(kind) = leader.due(now + ACK_DEBOUNCE_MS) {
            if let Some(delta) = leader.round(kind, now + ACK_DEBOUNCE_MS, state, regions) {
                state.apply(&delta);
            }
        }
    }

    #[test]
    fn an_ack_that_outran_the_leaders_own_apply_still_starts_the_transition() {
        // A follower applies epoch E+1 and its limiter acknowledges it
        // before the leader's state machine has: the leader sees the ack
        // against E, where nothing is moving. The next report (same epoch)
        // must then start the transition round, not wait for a scheduled one.
        let regions = two_regions();
        let mut leader = leader();
        let mut state = Allocations::default();
        let t0 = 1_700_000_000_000;
        leader.seed(&state, t0);
        heard(&mut leader, &mut state, &regions, "mumbai", t0);
        heard(&mut leader, &mut state, &regions, "hyderabad", t0 + 2_000);
        assert!(!transition_pending(&state));
        // Epoch E+1 shrinks hyderabad 500 → 300 for mumbai's sake.
        let mut next = state.clone();
        next.epoch += 1;
        let split = &mut next.rules.get_mut("api|customer").expect("rule").split;
        let h = split.get_mut("hyderabad").expect("hyderabad");
        (h.granted, h.target) = (300, 300);
        split.get_mut("mumbai").expect("mumbai").target = 700;
        assert!(transition_pending(&next));
        let ack = |epoch| PodReport {
            region: "hyderabad".into(),
            pod: "hyderabad-0".into(),
            epoch,
            ..PodReport::default()
        };
        let t1 = t0 + 3_000;
        // The ack arrives while the leader still holds E.
        leader.ingest(&ack(next.epoch), &state, &regions, t1);
        assert_eq!(leader.due(t1 + ACK_DEBOUNCE_MS), None, "nothing moves at E");
        // The leader applies E+1; the pod's next report holds the same epoch.
        let heard = leader.ingest(&ack(next.epoch), &next, &regions, t1 + 1_000);
        assert!(heard.wake, "the transition waits for a scheduled round");
        assert_eq!(
            leader.due(t1 + 1_000 + ACK_DEBOUNCE_MS),
            Some(RoundKind::Transition)
        );
    }

    #[test]
    fn a_region_heard_after_the_first_round_gets_its_share_in_the_round_that_leases_it() {
        let regions = two_regions();
        let mut leader = leader();
        let mut state = Allocations::default();
        let t0 = 1_700_000_000_000;
        leader.seed(&state, t0);
        heard(&mut leader, &mut state, &regions, "mumbai", t0);
        assert_eq!(state.rules["api|customer"].split["mumbai"].granted, 500);
        heard(&mut leader, &mut state, &regions, "hyderabad", t0 + 2_000);
        let split = &state.rules["api|customer"].split;
        assert_eq!(
            (split["mumbai"].granted, split["hyderabad"].granted),
            (500, 500),
            "hyderabad waited for demand below its floor: {split:?}"
        );
    }
}
