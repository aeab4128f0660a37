//! The world ledger: how much each global rule admitted world-wide in each
//! clock-aligned rule period, against `L` and the rule's stated bound.
//!
//! Pure, fed by [`Leader::ingest`](super::leader::Leader::ingest): every pod
//! reports, per global rule and period (`floor(t / period) × period`, Unix
//! ms), the hits it admitted for the whole rule and for its busiest keys, in
//! the current period and the one just ended ([`PeriodAdmitted`]). The counts
//! are cumulative within the period, so the ledger keeps each pod's **latest**
//! count (a repeated or late report replaces it, never adds) and the world
//! figure is the sum over pods and regions.
//!
//! ## What is measured
//! For every algorithm the figure is the world-wide admitted hits in each
//! clock-aligned rule period, as the pods counted their own decisions. For a
//! fixed window that is the window; for a sliding log or sliding counter and
//! for the buckets it is **not** a rolling window: it is the clock-aligned
//! period, which is what the stated bounds of DESIGN.md §4 speak of (a
//! sliding counter's count in an aligned window never exceeds its
//! allocation; a bucket admits at most B + R·T in any interval T, so in one
//! period at most burst + L).
//!
//! `L` is per key (each key of a global rule has its own world-wide limit),
//! so the figure that compares with `L` is the **busiest tracked key's**
//! ([`PeriodFigure::admitted`]); the whole rule's count over all keys is kept
//! beside it ([`PeriodFigure::all_keys`]). With no key reported the busiest
//! is the all-keys count, an upper bound of any one key's.
//!
//! ## Stated bound of each figure ([`Terms::bound`])
//! - exact, fixed window / sliding log / sliding counter: `L`;
//! - exact, token bucket / GCRA (`leaky_bucket`): `burst + L` (B + R·T with
//!   T one period);
//! - approximate: the above + pods × `max_batch` (× `split`) per region,
//!   with the pods that reported the period and `max_batch` from the rule
//!   (its default `L / 100`, at least 1, is an upper bound of each region's).
//!
//! Not included: `partition: available` adds a silent region's allocation
//! for at most one lease, clock skew ε adds ε × rate at a window edge, and a
//! Redis failover what its lost writes counted (docs/architecture.md,
//! "Bounds"). A figure above its bound in those situations may be within
//! the design's.
//!
//! A period during which the rule's limit changed is stated against the
//! widest terms in force while it was open: hits admitted under a limit
//! lowered later in the period were within their bound when admitted.
//!
//! ## When a period is final
//! Pods report a period until the next one ends. The ledger finishes a
//! period [`final_wait_ms`] after it ended (one period, at most a minute) and
//! moves its figure into the rule's history; a report for it after that is
//! dropped (`late`). A figure is `complete` when every pod that reported the
//! period was heard after it ended (its count is final) and no pod was
//! refused; otherwise it is a lower bound.
//!
//! ## Bounds (memory)
//! Per global rule of the leader (rules that leave the rule set leave the
//! ledger): at most [`OPEN_PERIODS`] open periods, each tracking at most
//! [`MAX_KEYS`] keys (the busiest: a new key takes the slot of the least
//! busy one only when its count is larger) and at most
//! [`MAX_PODS_PER_REGION`] pods in each of at most [`MAX_REGIONS`] regions;
//! and at most [`MAX_FINISHED`] finished periods, only those of the last
//! hour (and the newest two). [`Ledger::bytes`] measures it;
//! [`stated_bytes_per_rule`] is the bound the flood test holds it to.

mod figure;
mod period;
mod rule;
mod terms;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

pub use self::figure::{Dropped, KeyFigure, PeriodFigure, RegionKeyCount};
use self::period::{KeyCount, OpenPeriod, PodCounts, Tracked};
pub use self::rule::{KeyCounts, RuleLedger};
pub use self::terms::Terms;
use super::Millis;
use super::global_rule::GlobalRule;

/// Keys tracked per rule and open period (the busiest).
pub const MAX_KEYS: usize = 64;
/// Pods counted per region and open period; a further pod's reports are
/// refused for that period and its figure is flagged incomplete.
pub const MAX_PODS_PER_REGION: usize = 256;
/// Regions the ledger knows; reports from further regions are dropped.
pub const MAX_REGIONS: usize = 64;
/// Open periods per rule: the current one, the one just ended, and one for
/// a pod whose clock runs a little ahead.
pub const OPEN_PERIODS: usize = 3;
/// Finished periods kept per rule (an hour of 5 s periods).
pub const MAX_FINISHED: usize = 720;
/// "The last hour" of [`RuleLedger::worst_within`].
pub const HOUR_MS: Millis = 3_600_000;
/// The longest a period waits after its end for the pods' final counts.
pub const FINAL_WAIT_MAX_MS: Millis = 60_000;
/// Longest key and pod name (`store::key::MAX_KEY_LEN`,
/// `coordinator::report_bounds::MAX_POD_NAME`), for the stated bytes.
const KEY_BYTES: usize = 512;
const POD_BYTES: usize = 253;
const REGION_BYTES: usize = 64;

/// How long after its end a period of `period_ms` is final: one period (a
/// pod reports a period until the next one ends), at most
/// [`FINAL_WAIT_MAX_MS`].
pub fn final_wait_ms(period_ms: u64) -> Millis {
    Millis::try_from(period_ms)
        .unwrap_or(Millis::MAX)
        .min(FINAL_WAIT_MAX_MS)
}

/// A pod's admitted hits of one key (or of the whole rule) in one
/// clock-aligned period of a global rule, counted since the period began.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PeriodAdmitted {
    /// The rule's id.
    pub rule: String,
    /// The key as the rule counts it; `None` for the whole rule.
    pub key: Option<String>,
    /// The start of the period, Unix ms (`floor(now / period) * period`).
    pub period_start_ms: Millis,
    /// Hits admitted in it at this pod so far.
    pub admitted: u64,
}

/// The most [`Ledger::bytes`] may give with `rules` global rules and
/// `regions` regions (every bound reached, the longest names).
pub fn stated_bytes(rules: usize, regions: usize) -> usize {
    rules * stated_bytes_per_rule(regions) + regions.min(MAX_REGIONS) * (REGION_BYTES + 32)
}

/// The most one rule's ledger may take with `regions` regions (every bound
/// reached, the longest names): what the docs state.
pub fn stated_bytes_per_rule(regions: usize) -> usize {
    let regions = regions.min(MAX_REGIONS);
    let pod = std::mem::size_of::<(Box<str>, PodCounts)>()
        + POD_BYTES
        + MAX_KEYS * std::mem::size_of::<KeyCount>();
    let open = std::mem::size_of::<OpenPeriod>()
        + KEY_BYTES
        + MAX_KEYS * (std::mem::size_of::<Tracked>() + KEY_BYTES + 16)
        + regions
            * (MAX_PODS_PER_REGION * pod
                + std::mem::size_of::<(Arc<str>, BTreeMap<Box<str>, PodCounts>)>());
    let finished = std::mem::size_of::<PeriodFigure>()
        + 2 * regions * std::mem::size_of::<(Arc<str>, u64)>()
        + KEY_BYTES
        + 16;
    std::mem::size_of::<RuleLedger>() + KEY_BYTES + OPEN_PERIODS * open + MAX_FINISHED * finished
}

/// Every global rule's ledger on the leader.
#[derive(Debug, Default)]
pub struct Ledger {
    rules: BTreeMap<String, RuleLedger>,
    /// Terms from the enforced rule set, when the caller has it (the
    /// coordinator); otherwise [`Terms::of_global_rule`].
    terms: BTreeMap<String, Terms>,
    /// Region names, shared by every period; at most [`MAX_REGIONS`].
    regions: BTreeSet<Arc<str>>,
    dropped: Dropped,
}

impl Ledger {
    /// The terms of the enforced rule set's global rules (the leader's own
    /// [`GlobalRule`]s lack a bucket's burst and the accuracy).
    pub fn set_terms(&mut self, terms: Vec<Terms>) {
        self.terms = terms.into_iter().map(|t| (t.rule.clone(), t)).collect();
        for (id, rule) in &mut self.rules {
            if let Some(t) = self.terms.get(id)
                && t.limit == rule.terms.limit
                && t.period_ms == rule.terms.period_ms
            {
                for period in rule.open.values_mut() {
                    if t.bound(0) > period.terms.bound(0) || period.terms.assumed {
                        period.terms = t.clone();
                    }
                }
                rule.terms = t.clone();
            }
        }
    }

    /// Follows the leader's global rules: new rules start, gone ones go, a
    /// changed limit or period takes new terms (a new period drops the
    /// open periods: they were aligned to the old one).
    fn follow(&mut self, rules: &[GlobalRule]) {
        if self.rules.len() != rules.len()
            || rules
                .iter()
                .any(|r| !self.rules.contains_key(&r.policy.rule))
        {
            let ids: BTreeSet<&str> = rules.iter().map(|r| r.policy.rule.as_str()).collect();
            self.rules.retain(|id, _| ids.contains(id.as_str()));
        }
        for r in rules {
            let explicit = self
                .terms
                .get(&r.policy.rule)
                .filter(|t| t.limit == r.policy.limit && t.period_ms == r.period_ms);
            let held = self.rules.get(&r.policy.rule).map(|l| &l.terms);
            // The common case, every report: nothing changed.
            match (held, explicit) {
                (Some(h), Some(t)) if h == t => continue,
                (Some(h), None)
                    if h.assumed && h.limit == r.policy.limit && h.period_ms == r.period_ms =>
                {
                    continue;
                }
                _ => {}
            }
            let fallback;
            let terms = match explicit {
                Some(t) => t,
                None => {
                    fallback = Terms::of_global_rule(r);
                    &fallback
                }
            };
            match self.rules.get_mut(&r.policy.rule) {
                None => {
                    self.rules
                        .insert(r.policy.rule.clone(), RuleLedger::new(terms.clone()));
                }
                Some(rule) if rule.terms != *terms => {
                    if rule.terms.period_ms != terms.period_ms {
                        rule.open.clear();
                        rule.finished_through = None;
                    }
                    for period in rule.open.values_mut() {
                        if terms.bound(0) > period.terms.bound(0) {
                            period.terms = terms.clone();
                        }
                    }
                    rule.terms = terms.clone();
                }
                Some(_) => {}
            }
        }
    }

    /// Takes one pod's admitted counts. `rules` are the leader's global
    /// rules (counts for any other rule are dropped).
    pub fn record(
        &mut self,
        region: &str,
        pod: &str,
        admitted: &[PeriodAdmitted],
        rules: &[GlobalRule],
        now: Millis,
    ) {
        self.follow(rules);
        if !admitted.is_empty() {
            let region = match self.regions.get(region) {
                Some(r) => Some(Arc::clone(r)),
                None if self.regions.len() < MAX_REGIONS => {
                    let r: Arc<str> = Arc::from(region);
                    self.regions.insert(Arc::clone(&r));
                    Some(r)
                }
                None => None,
            };
            match region {
                None => self.dropped.pods += admitted.len() as u64,
                Some(region) => {
                    for a in admitted {
                        match self.rules.get_mut(&a.rule) {
                            Some(rule) => rule.take(&region, pod, a, now, &mut self.dropped),
                            None => self.dropped.unknown_rule += 1,
                        }
                    }
                }
            }
        }
        self.advance(now);
    }

    /// Finishes every period final by `now` (see the module docs); the
    /// caller runs it before reading figures when reports may be sparse.
    pub fn advance(&mut self, now: Millis) {
        for rule in self.rules.values_mut() {
            rule.advance(now);
        }
    }

    /// One rule's ledger.
    pub fn rule(&self, rule: &str) -> Option<&RuleLedger> {
        self.rules.get(rule)
    }

    /// Every rule's ledger, by id.
    pub fn rules(&self) -> impl Iterator<Item = (&String, &RuleLedger)> {
        self.rules.iter()
    }

    /// What was not taken, since the ledger started.
    pub fn dropped(&self) -> Dropped {
        self.dropped
    }

    /// Memory the ledger holds, in bytes (names, counts, figures; not the
    /// maps' own nodes).
    pub fn bytes(&self) -> usize {
        let regions: usize = self.regions.iter().map(|r| r.len() + 16 + 16).sum();
        regions + self.rules.values().map(RuleLedger::bytes).sum::<usize>()
    }
}
