//! The rebalancer: one pure function from (state, demand, acknowledgements,
//! time) to the next state. The coordinator's leader and the simulator call
//! the same [`rebalance`].
//!
//! Per global rule, every round:
//! 1. leases: regions heard from within `suspect_after` are renewed to
//!    `now + lease` by the first round after half their lease, at the
//!    latest with a third left ([`renew_at`]); acknowledgements release the old values of shrinks
//!    (`bound` falls to `granted`);
//! 2. lapsed regions (strict: lease expired plus the skew margin; available:
//!    silent longer than `suspect_after`) are capped at their fallback share,
//!    which stays reserved for the rule's `fallback_hold` after the lease
//!    (plus the skew margin) — the time the region itself keeps it — and is
//!    re-granted after that;
//! 3. targets (full rounds only): above per-region floors, smoothed demand
//!    first, then headroom, each divided over the capacity left — everything
//!    asked when it fits, else in proportion to weight × claim (the split an
//!    exact global counter makes; see [`targets`]); what is left goes by
//!    weight; draining regions keep their floor, failed ones get nothing new;
//!    hysteresis ignores small moves; `max_shift` optionally caps a move.
//!    The rule-level split follows the aggregate regional mix; the top keys
//!    whose own mix differs get entries;
//! 4. transition: shrinks are published at once, grows only out of
//!    `L − Σ bound`, i.e. capacity whose release the shrinking regions have
//!    acknowledged. Σ `bound` ≤ L therefore holds in every epoch.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};

use super::demand::DemandTracker;
use super::transition::Moves;
pub use super::transition::{transition, transition_tracked};
pub use super::water_fill::{Fill, water_fill, water_fill_into};
use super::{
    Allocations, Config, Epoch, InWindow, KeyAllocation, Millis, RegionInput, RegionLease,
    RegionStatus, RuleAllocation, RulePolicy, Shares, Slot, fallback_share, static_shares,
};
use crate::rules::Partition;

/// The inputs of one round. `regions` and `rules` list everything that
/// exists; rules missing from `rules` are dropped from the state.
pub struct Round<'a> {
    /// The round's instant (leases are renewed from it).
    pub now_ms: Millis,
    /// Every registered region.
    pub regions: &'a [RegionInput],
    /// Every global rule; a rule missing here is dropped.
    pub rules: &'a [RulePolicy],
    /// `Some`: a full round that recomputes targets from this demand.
    /// `None`: a transition round (acknowledgements arrived): targets stay,
    /// released capacity is granted.
    pub demand: Option<&'a DemandTracker>,
    /// Rules whose current window's use is known in every region: their
    /// split may shrink and grow within the window (see [`InWindow`]).
    pub in_window: Option<&'a BTreeMap<String, InWindow>>,
}

/// The next state. Its epoch is one more than `state`'s; commit
/// `state.diff(&next)` unless it changes nothing (see [`is_noop`]).
pub fn rebalance(state: &Allocations, round: &Round<'_>, config: &Config) -> Allocations {
    let mut next = state.clone();
    next.epoch = state.epoch + 1;
    next.at_ms = round.now_ms;
    let epoch = next.epoch;
    let now = round.now_ms;

    // Leases and acknowledgements.
    let mut acked: BTreeMap<&str, Epoch> = BTreeMap::new();
    next.regions
        .retain(|name, _| round.regions.iter().any(|r| &r.name == name));
    for region in round.regions {
        let lease = next.regions.entry(region.name.clone()).or_default();
        if let Some(heard) = region.last_heard_ms {
            lease.last_heard_ms = lease.last_heard_ms.max(heard);
        }
        if let Some(a) = region.acked {
            lease.acked = lease.acked.max(a.min(state.epoch));
        }
        let live =
            region.last_heard_ms.is_some() && lease.last_heard_ms >= now - config.suspect_after_ms;
        // Renewed by the first round after half of it, or at the latest
        // with a third left (a round runs then: see `renew_at`), so quiet
        // rounds commit nothing.
        let due = lease.valid_until_ms - now < config.lease_ms / 2;
        if live && round.demand.is_some() && due {
            lease.valid_until_ms = lease.valid_until_ms.max(now + config.lease_ms);
        }
        acked.insert(region.name.as_str(), lease.acked);
    }

    next.rules
        .retain(|id, _| round.rules.iter().any(|p| &p.rule == id));
    let mut scratch = Scratch::default();
    for policy in round.rules {
        let view = RegionsView::new(round.regions, &next.regions, policy, now, config);
        let rule = next.rules.entry(policy.rule.clone()).or_default();
        rule.limit = policy.limit;
        rule.fallback = round
            .regions
            .iter()
            .zip(&view.fallback)
            .map(|(r, f)| (r.name.clone(), *f))
            .collect();
        step_rule(
            rule,
            policy,
            &view,
            round,
            &acked,
            epoch,
            config,
            &mut scratch,
        );
    }
    next
}

/// True when `next` changes nothing a limiter enforces — no allocation, no
/// lease — so it need not be committed. Acknowledgements alone do not make an
/// epoch: each epoch is acknowledged, and committing the acknowledgement
/// would start the next round of acknowledgements.
pub fn is_noop(state: &Allocations, next: &Allocations) -> bool {
    let d = state.diff(next);
    d.rules.is_empty()
        && d.regions
            .iter()
            .all(|(name, lease)| match (lease, state.regions.get(name)) {
                (Some(new), Some(old)) => new.valid_until_ms == old.valid_until_ms,
                _ => false,
            })
}

/// Per-region facts for one rule this round, indexed like `Round::regions`.
struct RegionsView<'a> {
    regions: &'a [RegionInput],
    statics: Vec<u64>,
    fallback: Vec<u64>,
    floors: Vec<u64>,
    lapsed: Vec<bool>,
    /// What stays reserved for a lapsed region: its fallback while the
    /// region may still enforce it (the rule's hold after the lease, plus
    /// the skew margin), then nothing — it has stepped down on its own.
    reserve: Vec<u64>,
}

impl<'a> RegionsView<'a> {
    fn new(
        regions: &'a [RegionInput],
        leases: &BTreeMap<String, RegionLease>,
        policy: &RulePolicy,
        now: Millis,
        config: &Config,
    ) -> Self {
        let statics = static_shares(policy.limit, regions);
        let fallback: Vec<u64> = statics
            .iter()
            .map(|s| fallback_share(*s, policy.fallback))
            .collect();
        let floors = regions
            .iter()
            .zip(&statics)
            .map(|(r, s)| match r.status {
                RegionStatus::Failed => 0,
                _ => (*s as f64 * config.floor.clamp(0.0, 1.0)).floor() as u64,
            })
            .collect();
        let mut reserve = Vec::with_capacity(regions.len());
        let lapsed = regions
            .iter()
            .zip(&fallback)
            .map(|(r, f)| {
                let lease = leases.get(&r.name).copied().unwrap_or_default();
                // The region's own schedule, seen `skew_margin` late.
                reserve.push(super::lapsed_value(
                    *f,
                    *f,
                    lease.valid_until_ms,
                    policy.fallback_hold_ms,
                    now - config.skew_margin_ms,
                ));
                let expired = now > lease.valid_until_ms + config.skew_margin_ms;
                let silent = r.last_heard_ms.is_none()
                    || lease.last_heard_ms < now - config.suspect_after_ms;
                match policy.partition {
                    Partition::Strict => expired,
                    Partition::Available => expired || silent,
                }
            })
            .collect();
        RegionsView {
            regions,
            statics,
            fallback,
            floors,
            lapsed,
            reserve,
        }
    }

    fn len(&self) -> usize {
        self.regions.len()
    }
}

#[derive(Default)]
struct Scratch {
    demand: Vec<f64>,
    target: Vec<u64>,
    slots: Vec<Slot>,
    /// `granted` before a transition.
    old: Vec<u64>,
    fill: Fill,
}

/// A key that earned an entry, ordered by demand (ties: the smaller key
/// ranks higher, for determinism).
struct Candidate {
    score: f64,
    key: String,
    target: Vec<u64>,
    demand: Vec<f64>,
}

impl Candidate {
    fn beaten_by(&self, score: f64, key: &str) -> bool {
        match score.total_cmp(&self.score) {
            std::cmp::Ordering::Greater => true,
            std::cmp::Ordering::Less => false,
            std::cmp::Ordering::Equal => key < self.key.as_str(),
        }
    }
}

impl Ord for Candidate {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.score
            .total_cmp(&other.score)
            .then_with(|| other.key.cmp(&self.key))
    }
}

impl PartialOrd for Candidate {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Candidate {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == std::cmp::Ordering::Equal
    }
}

impl Eq for Candidate {}

/// Each region's pace for a within-window step down
/// ([`transition_tracked`]), with headroom: what it admitted since its
/// pods' previous report of this window (`in_window`'s recent pace), where
/// one was measured — the smoothed estimate trails a swing by rounds (a
/// real 80 read 322, 140, 98, 85), so a swing early in a window was stepped
/// too late to hand the window over. Else the larger of its demand this
/// round and the last (`before`, by region name): one round's low estimate
/// is not enough — lumpy costs (LLM tokens) make estimates swing round to
/// round, and stepping on every low one cut regions that were still asking
/// (llm-tokens scenario: false rejections 11.9 → 15.2 %).
pub(super) fn paces(
    before: &BTreeMap<String, f64>,
    now: &[f64],
    names: &[&str],
    in_window: Option<&InWindow>,
    config: &Config,
) -> Vec<f64> {
    let window_ms = in_window.map_or(0, |w| (w.until_ms - w.start_ms).max(0) as u64);
    names
        .iter()
        .zip(now)
        .enumerate()
        .map(|(i, (n, d))| {
            let recent = in_window
                .filter(|w| w.regions.len() == names.len())
                .and_then(|w| w.regions[i].recent)
                .map(|r| r.per_window(window_ms));
            let pace = recent.unwrap_or_else(|| d.max(before.get(*n).copied().unwrap_or(0.0)));
            pace * (1.0 + config.headroom)
        })
        .collect()
}

#[allow(clippy::too_many_arguments)]
fn step_rule(
    rule: &mut RuleAllocation,
    policy: &RulePolicy,
    view: &RegionsView<'_>,
    round: &Round<'_>,
    acked: &BTreeMap<&str, Epoch>,
    epoch: Epoch,
    config: &Config,
    scratch: &mut Scratch,
) {
    let limit = rule.limit;
    let names: Vec<&str> = view.regions.iter().map(|r| r.name.as_str()).collect();

    // Never while a region is lapsed: what it enforces then is decided by
    // its own clock, not by anything it reported.
    let in_window = round
        .in_window
        .and_then(|w| w.get(&policy.rule))
        .filter(|_| !view.lapsed.iter().any(|l| *l));

    // The split.
    load(&rule.split, &names, &mut scratch.slots);
    settle(&mut scratch.slots, view, &names, acked);
    let mut split_paces = None;
    if let Some(demand) = round.demand {
        demand.rule_totals(&policy.rule, &names, &mut scratch.demand);
        split_paces = Some(paces(
            &rule.demand,
            &scratch.demand,
            &names,
            in_window,
            config,
        ));
        rule.demand = names
            .iter()
            .zip(&scratch.demand)
            .map(|(n, d)| (n.to_string(), *d))
            .collect();
        let total: f64 = scratch.demand.iter().sum();
        if total > 0.0 {
            // The split serves every key: follow the regional mix of a key
            // that uses the whole limit.
            for d in scratch.demand.iter_mut() {
                *d = limit as f64 * *d / total;
            }
            targets(
                limit,
                &scratch.demand,
                view,
                config,
                &mut scratch.target,
                &mut scratch.fill,
            );
        } else if scratch
            .slots
            .iter()
            .all(|s| s.target == 0 && s.granted == 0)
            || below_floor(&scratch.slots, view)
        {
            // A new rule with no demand yet — or a region lapsed when the
            // targets were set (new, not heard yet) and live now, which would
            // sit below its floor until demand arrives: the static split.
            targets_static(view, &mut scratch.target);
        } else {
            scratch.target.clear();
            scratch
                .target
                .extend(scratch.slots.iter().map(|s| s.target));
        }
        retarget(&mut scratch.slots, &scratch.target, view, limit, config);
    }
    let moves = Moves {
        limit,
        epoch,
        in_window,
        now_ms: round.now_ms,
        window_ms: policy.window_ms,
    };
    moves.apply(
        &mut scratch.slots,
        &mut scratch.old,
        Some(&mut rule.high_water),
        split_paces.as_deref(),
    );
    store(&mut rule.split, &names, &scratch.slots);

    // Key entries.
    let mut keys = std::mem::take(&mut rule.keys);
    if let Some(demand) = round.demand {
        let split_targets: Vec<u64> = names
            .iter()
            .map(|n| rule.split.get(*n).map_or(0, |s| s.target))
            .collect();
        let id = &policy.rule;
        // Keys that earn an entry: under the split they would be throttled
        // somewhere, and their own targets differ from the split's by more
        // than the hysteresis. The top `max_key_entries` by demand are kept
        // in a bounded heap, so a million keys cost no million clones.
        let mut wanted: BinaryHeap<Reverse<Candidate>> = BinaryHeap::new();
        let threshold = hysteresis_units(limit, config);
        let cap = config.max_key_entries;
        demand.for_each_key(id, &names, &mut |key, d| {
            let pinched = d.iter().zip(&split_targets).any(|(d, s)| *d > *s as f64);
            if !pinched || cap == 0 {
                return;
            }
            let score: f64 = d.iter().sum();
            if wanted.len() >= cap
                && wanted
                    .peek()
                    .is_some_and(|Reverse(min)| !min.beaten_by(score, key))
            {
                return;
            }
            targets(
                limit,
                d,
                view,
                config,
                &mut scratch.target,
                &mut scratch.fill,
            );
            let differs = scratch
                .target
                .iter()
                .zip(&split_targets)
                .any(|(t, s)| t.abs_diff(*s) > threshold);
            if differs {
                wanted.push(Reverse(Candidate {
                    score,
                    key: key.to_string(),
                    target: scratch.target.clone(),
                    demand: d.to_vec(),
                }));
                if wanted.len() > cap {
                    wanted.pop();
                }
            }
        });
        let wanted: Vec<(f64, String, Vec<u64>, Vec<f64>)> = wanted
            .into_iter()
            .map(|Reverse(c)| (c.score, c.key, c.target, c.demand))
            .collect();
        let mut fresh: BTreeMap<String, (Vec<u64>, Vec<f64>)> =
            wanted.into_iter().map(|(_, k, t, d)| (k, (t, d))).collect();
        // Entries that lost their place head back to the split and are
        // removed once they match it (see below).
        for (key, entry) in keys.iter_mut() {
            let (target, demand, paces) = match fresh.remove(key) {
                Some((t, d)) => {
                    let p = paces(&entry.demand, &d, &names, in_window, config);
                    (t, d, Some(p))
                }
                // Heading back to the split: its own demand is not
                // measured, so no step.
                None => (split_targets.clone(), vec![0.0; names.len()], None),
            };
            entry.demand = names
                .iter()
                .zip(&demand)
                .map(|(n, d)| (n.to_string(), *d))
                .collect();
            load(&entry.shares, &names, &mut scratch.slots);
            settle(&mut scratch.slots, view, &names, acked);
            retarget(&mut scratch.slots, &target, view, limit, config);
            moves.apply(&mut scratch.slots, &mut scratch.old, None, paces.as_deref());
            store(&mut entry.shares, &names, &scratch.slots);
        }
        for (key, (target, demand)) in fresh {
            // A new entry starts where the key is: at the split, with the
            // split's unacknowledged values still counted.
            let mut entry = KeyAllocation {
                shares: rule.split.clone(),
                demand: names
                    .iter()
                    .zip(&demand)
                    .map(|(n, d)| (n.to_string(), *d))
                    .collect(),
            };
            load(&entry.shares, &names, &mut scratch.slots);
            for slot in scratch.slots.iter_mut() {
                // Flags describe the split's last change, not this entry's.
                slot.immediate = false;
                slot.shrink_now = false;
                slot.now_until_ms = 0;
            }
            retarget(&mut scratch.slots, &target, view, limit, config);
            // A new entry: no earlier round to confirm its demand, no step.
            moves.apply(&mut scratch.slots, &mut scratch.old, None, None);
            store(&mut entry.shares, &names, &scratch.slots);
            keys.insert(key, entry);
        }
    } else {
        for entry in keys.values_mut() {
            load(&entry.shares, &names, &mut scratch.slots);
            settle(&mut scratch.slots, view, &names, acked);
            moves.apply(&mut scratch.slots, &mut scratch.old, None, None);
            store(&mut entry.shares, &names, &scratch.slots);
        }
    }
    // An entry equal to the split in every region, with nothing
    // unacknowledged, is the split: drop it.
    keys.retain(|_, entry| {
        let matches_split = names.iter().enumerate().all(|(i, n)| {
            let e = entry.shares.get(*n).copied().unwrap_or_default();
            let s = rule.split.get(*n).copied().unwrap_or_default();
            // Neither grew this window: a pod that starts now and has only
            // the split to go by must not take more than the key had when
            // the window began (see `Slot::before`).
            let settled = e.before_until_ms <= round.now_ms && s.before_until_ms <= round.now_ms;
            // The region holds the entry's last value: dropped in the round
            // that changed it, the pods would keep the value before (a grow
            // granted in-window would wait for the boundary there while the
            // centre counts it in force) — a live region's pods first apply
            // it, then the entry goes. A lapsed region holds nothing to match.
            let held = view.lapsed[i] || acked.get(n).is_some_and(|a| *a >= e.since);
            e.granted == s.granted
                && e.target == s.target
                && e.bound == e.granted
                && settled
                && held
        });
        let demanded = entry.demand.values().any(|d| *d > 0.0);
        demanded || !matches_split
    });
    rule.keys = keys;
}

fn load(shares: &Shares, names: &[&str], out: &mut Vec<Slot>) {
    out.clear();
    out.extend(
        names
            .iter()
            .map(|n| shares.get(*n).copied().unwrap_or_default()),
    );
}

fn store(shares: &mut Shares, names: &[&str], slots: &[Slot]) {
    shares.clear();
    for (n, s) in names.iter().zip(slots) {
        shares.insert(n.to_string(), *s);
    }
}

/// Releases acknowledged shrinks and caps lapsed regions at their fallback.
fn settle(
    slots: &mut [Slot],
    view: &RegionsView<'_>,
    names: &[&str],
    acked: &BTreeMap<&str, Epoch>,
) {
    for (i, slot) in slots.iter_mut().enumerate() {
        if acked.get(names[i]).is_some_and(|a| *a >= slot.since) {
            slot.bound = slot.granted;
        }
        if view.lapsed[i] {
            // The region enforces at most min(what it holds, fallback) now,
            // and nothing once its hold ran out; that much stays reserved.
            let kept = slot.bound.min(view.reserve[i]);
            *slot = Slot {
                granted: kept.min(slot.granted),
                bound: kept,
                target: kept.min(slot.granted),
                since: slot.since,
                ..Slot::default()
            };
        }
    }
}

fn hysteresis_units(limit: u64, config: &Config) -> u64 {
    (limit as f64 * config.hysteresis.clamp(0.0, 1.0)).floor() as u64
}

/// Sets new targets unless every move is within the hysteresis; applies
/// `max_shift`. Lapsed regions keep what `settle` left them.
fn retarget(
    slots: &mut [Slot],
    target: &[u64],
    view: &RegionsView<'_>,
    limit: u64,
    config: &Config,
) {
    let threshold = hysteresis_units(limit, config);
    let moves = slots
        .iter()
        .zip(target)
        .enumerate()
        .any(|(i, (s, t))| !view.lapsed[i] && s.target.abs_diff(*t) > threshold);
    if !moves {
        return;
    }
    let cap = config
        .max_shift
        .map(|f| (limit as f64 * f.clamp(0.0, 1.0)).floor() as u64);
    for (i, (slot, t)) in slots.iter_mut().zip(target).enumerate() {
        if view.lapsed[i] {
            continue;
        }
        slot.target = match cap {
            Some(cap) if *t > slot.granted => (*t).min(slot.granted.saturating_add(cap)),
            Some(cap) => (*t).max(slot.granted.saturating_sub(cap)),
            None => *t,
        };
    }
}

/// Static targets by weight (a new rule before any demand is known).
/// Some live, active region's target is below its floor.
fn below_floor(slots: &[Slot], view: &RegionsView<'_>) -> bool {
    slots.iter().enumerate().any(|(i, s)| {
        !view.lapsed[i]
            && view.regions[i].status == RegionStatus::Active
            && s.target < view.floors[i]
    })
}

fn targets_static(view: &RegionsView<'_>, out: &mut Vec<u64>) {
    out.clear();
    out.extend(
        view.regions
            .iter()
            .enumerate()
            .map(|(i, r)| match (view.lapsed[i], r.status) {
                (true, _) => 0,
                (_, RegionStatus::Active) => view.statics[i],
                (_, RegionStatus::Draining) => view.floors[i],
                (_, RegionStatus::Failed) => 0,
            }),
    );
}

/// Targets from demand (hits per period, per region): reserved capacity of
/// lapsed regions first, then floors, then active regions' demand, then
/// their headroom — each claim in full when the capacity left covers it,
/// else in proportion to weight × claim; what is left over goes to active
/// regions by weight. (Weighted max-min is the textbook division; proportional
/// division of a scarce claim lost ~10× less capacity in the simulator.)
fn targets(
    limit: u64,
    demand: &[f64],
    view: &RegionsView<'_>,
    config: &Config,
    out: &mut Vec<u64>,
    fill: &mut Fill,
) {
    let n = view.len();
    out.clear();
    out.resize(n, 0);
    let mut capacity = limit;
    for i in 0..n {
        if view.lapsed[i] {
            // Reserved; `settle` keeps it.
            capacity = capacity.saturating_sub(view.reserve[i]);
        }
    }
    let active = |i: usize| !view.lapsed[i] && view.regions[i].status != RegionStatus::Failed;
    // Floors, scaled down if they do not fit.
    let floors: u64 = (0..n).filter(|&i| active(i)).map(|i| view.floors[i]).sum();
    let scale = if floors > capacity && floors > 0 {
        capacity as f64 / floors as f64
    } else {
        1.0
    };
    for i in (0..n).filter(|&i| active(i)) {
        out[i] = (view.floors[i] as f64 * scale).floor() as u64;
        capacity -= out[i];
    }
    let growing = |i: usize| active(i) && view.regions[i].status == RegionStatus::Active;
    let mut want = std::mem::take(&mut fill.want);
    let mut weights = std::mem::take(&mut fill.weights);
    let mut given = std::mem::take(&mut fill.given);
    let mut left = capacity;
    // Demand first, headroom only out of what demand leaves: headroom handed
    // to a region already served is taken from one that is throttled, and
    // goes unused (the simulator measured 3–5 % of L lost that way).
    for headroom in [0.0, config.headroom.max(0.0)] {
        want.clear();
        weights.clear();
        for i in (0..n).filter(|&i| growing(i)) {
            want.push((demand[i] * (1.0 + headroom) - out[i] as f64).max(0.0));
            weights.push(view.regions[i].weight.max(1e-9));
        }
        if want.iter().sum::<f64>() > left as f64 {
            // Scarce: every region gets the same fraction of its (weighted)
            // claim — for demand, the share an exact global counter gives
            // each region when arrivals are spread over the window. Max-min
            // would fill the lighter regions up to their claim exactly, and
            // a window in which one asks a little less than its average
            // then leaves capacity unused that a throttled region wanted
            // (the simulator measured ~1 % of L lost in steady state that
            // way, against ~0.1 % for proportional share).
            let weighted: f64 = want.iter().zip(&weights).map(|(x, w)| x * w).sum();
            let scale = left as f64 / weighted;
            for (x, w) in want.iter_mut().zip(&weights) {
                *x *= w * scale;
            }
        }
        water_fill_into(left, &want, &weights, &mut given, fill);
        for (k, i) in (0..n).filter(|&i| growing(i)).enumerate() {
            out[i] += given[k];
            left -= given[k];
        }
    }
    if left > 0 && !want.is_empty() {
        want.iter_mut().for_each(|w| *w = f64::INFINITY);
        water_fill_into(left, &want, &weights, &mut given, fill);
        for (k, i) in (0..n).filter(|&i| growing(i)).enumerate() {
            out[i] += given[k];
        }
    }
    fill.want = want;
    fill.weights = weights;
    fill.given = given;
}
