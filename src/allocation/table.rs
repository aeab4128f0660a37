//! The limiter's side: the allocation one region enforces.
//!
//! - **Fencing**: an update older than the epoch held is ignored.
//! - **Window boundaries**: for windowed algorithms a new value takes effect
//!   at the first window boundary after it arrives, so a window is counted
//!   against one value. A region's grow is published only after the
//!   shrinking region acknowledged (held) its shrink, so the grow's boundary is
//!   never before the shrink's.
//! - **Leases**: after `valid_until` the region enforces the smaller of its
//!   value and the rule's fallback share for the rule's `fallback_hold`,
//!   then nothing ([`super::lapsed_value`]) — the same schedule by which the
//!   coordinator keeps that share reserved and then re-grants it.
//! - Before any allocation arrives a global rule allows nothing; a limiter
//!   without a coordinator enforces the whole limit instead (one region).
//! - A table can be kept and restored whole ([`SavedTable`]), so a pod that
//!   starts while no coordinator answers enforces its region's last one.

mod saved;

use std::collections::HashMap;

use super::{Allocations, Epoch, EpochDelta, Millis};

pub use saved::{SAVED_TABLE_VERSION, SavedRule, SavedTable, SavedValue};

/// What one region is sent for one epoch (a whole snapshot or the changes).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RegionUpdate {
    /// The epoch the update brings; the table refuses one not newer than its own.
    pub epoch: Epoch,
    /// The region's lease.
    pub valid_until_ms: Millis,
    /// A snapshot: rules and keys not listed are gone.
    pub full: bool,
    /// Rules whose values changed (every rule, in a snapshot).
    pub rules: Vec<RuleUpdate>,
    /// Rules that are no longer global (or gone).
    pub removed_rules: Vec<String>,
}

/// One rule's values for the region in an update.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RuleUpdate {
    /// The rule's id.
    pub rule: String,
    /// The world-wide limit.
    pub limit: u64,
    /// What the region enforces once its lease lapses.
    pub fallback: u64,
    /// The region's value for keys without an entry; `None`: unchanged.
    pub split: Option<u64>,
    /// The split's new value may apply at once (capacity never issued
    /// before), not only at the next window boundary.
    pub split_now: Now,
    /// Changed key entries; `None` = the entry is gone (the key uses the split).
    pub keys: Vec<(String, Option<u64>)>,
    /// Key entries among `keys` whose new value applies before the boundary.
    pub keys_now: Vec<(String, Now)>,
}

impl RuleUpdate {
    /// `keys_now` by key, looked up once per key (a snapshot lists up to
    /// `max_key_entries` of both).
    pub fn key_now(&self) -> impl Fn(&str) -> Now + '_ {
        let by_key: HashMap<&str, Now> = self
            .keys_now
            .iter()
            .map(|(k, n)| (k.as_str(), *n))
            .collect();
        move |key| by_key.get(key).copied().unwrap_or_default()
    }
}

/// When a new value applies: at the next window boundary (the default), or
/// at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Now {
    /// A grow that may apply at once: capacity never issued to any region,
    /// or no other region can use it in the current window any more.
    pub immediate: bool,
    /// A shrink to apply at once (it never raises a value): the region had
    /// not used it this window, and the centre grants it within the window.
    pub shrink_now: bool,
    /// When non-zero, both hold only before this instant (the end of the
    /// window they were decided for): a pod that gets the update later — a
    /// snapshot after a reconnect — switches at a boundary.
    pub until_ms: Millis,
    /// For a pod that holds no value yet (it just started): the value to
    /// enforce until the given boundary, the region's when the window began.
    pub starting: Option<(u64, Millis)>,
}

impl Now {
    fn of(slot: &super::Slot) -> Now {
        Now {
            immediate: slot.immediate,
            shrink_now: slot.shrink_now,
            until_ms: slot.now_until_ms,
            starting: (slot.before_until_ms > 0).then_some((slot.before, slot.before_until_ms)),
        }
    }

    fn is_set(&self) -> bool {
        self.immediate || self.shrink_now || self.starting.is_some()
    }

    /// The value of a pod that held none before.
    fn fresh(&self, v: u64, now_ms: Millis) -> Value {
        match self.starting {
            Some((before, until)) if now_ms < until && before < v => Value {
                active: before,
                next: Some((v, until)),
            },
            _ => Value::fresh(v),
        }
    }

    fn holds(&self, now_ms: Millis) -> bool {
        self.until_ms == 0 || now_ms < self.until_ms
    }
}

/// The update for `region`: everything when `delta` is `None`, else what the
/// delta changed for it. `None` when the delta changes nothing it enforces
/// (its lease included).
pub fn region_update(
    state: &Allocations,
    region: &str,
    delta: Option<&EpochDelta>,
) -> Option<RegionUpdate> {
    let valid_until_ms = state.regions.get(region).map_or(0, |l| l.valid_until_ms);
    let mut update = RegionUpdate {
        epoch: state.epoch,
        valid_until_ms,
        full: delta.is_none(),
        ..Default::default()
    };
    let granted = |shares: &super::Shares| shares.get(region).map_or(0, |s| s.granted);
    let slot = |shares: &super::Shares| shares.get(region).copied().unwrap_or_default();
    match delta {
        None => {
            for (id, rule) in &state.rules {
                update.rules.push(RuleUpdate {
                    rule: id.clone(),
                    limit: rule.limit,
                    fallback: rule.fallback.get(region).copied().unwrap_or(0),
                    split: Some(granted(&rule.split)),
                    split_now: Now::of(&slot(&rule.split)),
                    keys: rule
                        .keys
                        .iter()
                        .map(|(k, e)| (k.clone(), Some(granted(&e.shares))))
                        .collect(),
                    keys_now: rule
                        .keys
                        .iter()
                        .map(|(k, e)| (k.clone(), Now::of(&slot(&e.shares))))
                        .filter(|(_, now)| now.is_set())
                        .collect(),
                });
            }
            Some(update)
        }
        Some(delta) => {
            let lease_changed = delta.regions.contains_key(region);
            for (id, rd) in &delta.rules {
                let Some(rd) = rd else {
                    update.removed_rules.push(id.clone());
                    continue;
                };
                let mut ru = RuleUpdate {
                    rule: id.clone(),
                    limit: rd.limit,
                    fallback: rd.fallback.get(region).copied().unwrap_or(0),
                    split: rd.split.as_ref().map(granted),
                    split_now: rd
                        .split
                        .as_ref()
                        .map(|s| Now::of(&slot(s)))
                        .unwrap_or_default(),
                    ..Default::default()
                };
                for (key, entry) in &rd.keys {
                    ru.keys
                        .push((key.clone(), entry.as_ref().map(|e| granted(&e.shares))));
                    if let Some(now) = entry.as_ref().map(|e| Now::of(&slot(&e.shares)))
                        && now.is_set()
                    {
                        ru.keys_now.push((key.clone(), now));
                    }
                }
                update.rules.push(ru);
            }
            (lease_changed || !update.rules.is_empty() || !update.removed_rules.is_empty())
                .then_some(update)
        }
    }
}

/// One enforced value with the one waiting for the next window boundary.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Value {
    active: u64,
    next: Option<(u64, Millis)>,
}

impl Value {
    fn at(&self, now_ms: Millis) -> u64 {
        match self.next {
            Some((v, from)) if now_ms >= from => v,
            _ => self.active,
        }
    }

    fn settle(&mut self, now_ms: Millis) {
        self.active = self.at(now_ms);
        if matches!(self.next, Some((_, from)) if now_ms >= from) {
            self.next = None;
        }
    }

    /// `period_ms`: the rule's window, or `None` for buckets (immediate).
    fn set(&mut self, v: u64, now_ms: Millis, period_ms: Option<u64>) {
        self.settle(now_ms);
        match period_ms {
            Some(p) if p > 0 && v != self.active => {
                let p = p as i64;
                let boundary = (now_ms.div_euclid(p) + 1) * p;
                self.next = Some((v, boundary));
            }
            _ => {
                self.active = v;
                self.next = None;
            }
        }
    }

    /// Takes a published value: at once when `now` says so and still
    /// holds, else at the next boundary. A shrink-now only ever lowers the
    /// value in force (what was admitted stays counted; nothing more above
    /// `v` from here on); a step shrink (`starting` above `v`) lowers it to
    /// the step until the step's boundary, and to `v` from there; a step
    /// grow (`immediate` with `starting` below `v`) raises it to the step
    /// until that boundary, and to `v` from there.
    fn take(&mut self, v: u64, now: Now, now_ms: Millis, period_ms: Option<u64>) {
        let holds = now.holds(now_ms);
        if holds && now.shrink_now && v <= self.at(now_ms) {
            self.settle(now_ms);
            match now.starting {
                Some((step, until)) if step > v && now_ms < until => {
                    self.active = self.active.min(step);
                    self.next = Some((v, until));
                }
                _ => {
                    self.active = v;
                    self.next = None;
                }
            }
        } else if let Some((step, until)) = now
            .starting
            .filter(|(step, until)| holds && now.immediate && *step < v && now_ms < *until)
        {
            // A step grow: the part that fits this window now, the whole
            // from its boundary. It never lowers the value in force.
            self.settle(now_ms);
            self.active = self.active.max(step);
            self.next = Some((v, until));
        } else {
            // An immediate change raises; one below the value in force (a
            // key entry made from a split that steps down) waits for the
            // boundary like any other, or it would cut off what the region
            // already counted.
            let immediate = holds && now.immediate && v >= self.at(now_ms);
            self.set(v, now_ms, if immediate { None } else { period_ms });
        }
    }

    fn resume_after_lapse(&mut self, cap: u64, now_ms: Millis, period_ms: Option<u64>) {
        self.settle(now_ms);
        let granted = self.next.map_or(self.active, |(v, _)| v);
        self.active = self.active.min(cap);
        self.next = None;
        self.set(granted, now_ms, period_ms);
    }

    fn fresh(v: u64) -> Value {
        Value {
            active: v,
            next: None,
        }
    }
}

#[derive(Debug, Clone)]
struct RuleView {
    limit: u64,
    fallback: u64,
    split: Value,
    keys: HashMap<String, Value>,
    /// Entries the coordinator removed while their value differed from the
    /// split's: the old value holds until the window boundary, like any
    /// other change, or the key would jump to the split mid-window.
    retiring: HashMap<String, (Value, Millis)>,
    /// Created by this update: its keys start fresh too.
    fresh: bool,
}

impl RuleView {
    /// Drops a key's entry: the key follows the split from the next window
    /// boundary (at once for buckets, or when the values already agree).
    fn retire(&mut self, key: &str, now_ms: Millis, window: Option<u64>) {
        let Some(old) = self.keys.remove(key) else {
            return;
        };
        if let Some(p) = window.filter(|p| *p > 0)
            && old.at(now_ms) != self.split.at(now_ms)
        {
            let p = p as i64;
            let boundary = (now_ms.div_euclid(p) + 1) * p;
            self.retiring.insert(key.to_string(), (old, boundary));
        }
    }
}

/// The allocations a region enforces.
#[derive(Debug, Clone, Default)]
pub struct Table {
    epoch: Epoch,
    valid_until_ms: Millis,
    rules: HashMap<String, RuleView>,
    /// Each rule's `fallback_hold` (from the rules the region holds, not
    /// from the updates: it must hold when no update comes). A rule not
    /// listed holds [`super::DEFAULT_FALLBACK_HOLD_MS`].
    holds: HashMap<String, i64>,
}

/// Why an update was not applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// Its epoch is not newer than the one held (fencing).
    Stale {
        /// The epoch the table holds.
        held: Epoch,
        /// The update's epoch.
        got: Epoch,
    },
}

impl Table {
    /// The epoch of the last applied update (0 before any).
    pub fn epoch(&self) -> Epoch {
        self.epoch
    }

    /// When the region's lease ends; past it, the fallbacks are enforced.
    pub fn valid_until_ms(&self) -> Millis {
        self.valid_until_ms
    }

    /// Applies an update received at `now_ms`. `window_ms(rule)` is the rule's
    /// window for windowed algorithms, `None` for buckets.
    pub fn apply(
        &mut self,
        update: &RegionUpdate,
        now_ms: Millis,
        window_ms: impl Fn(&str) -> Option<u64>,
    ) -> Result<(), Refused> {
        if update.epoch <= self.epoch && !(update.full && update.epoch == self.epoch) {
            return Err(Refused::Stale {
                held: self.epoch,
                got: update.epoch,
            });
        }
        if now_ms > self.valid_until_ms {
            // The lease had lapsed: the region has been enforcing its
            // fallback (or nothing, past the hold). A renewal brings the
            // granted value back like any other change — at the next window
            // boundary — not for the rest of the window the fallback was
            // counted against.
            for (id, view) in self.rules.iter_mut() {
                let hold = self.holds.get(id).copied();
                let hold = hold.unwrap_or(super::DEFAULT_FALLBACK_HOLD_MS);
                let cap =
                    super::lapsed_value(u64::MAX, view.fallback, self.valid_until_ms, hold, now_ms);
                let window = window_ms(id);
                for value in std::iter::once(&mut view.split).chain(view.keys.values_mut()) {
                    value.resume_after_lapse(cap, now_ms, window);
                }
            }
        }
        self.epoch = update.epoch;
        self.valid_until_ms = update.valid_until_ms;
        if update.full {
            self.rules
                .retain(|id, _| update.rules.iter().any(|r| &r.rule == id));
        }
        for id in &update.removed_rules {
            self.rules.remove(id);
        }
        for ru in &update.rules {
            let window = window_ms(&ru.rule);
            let view = self
                .rules
                .entry(ru.rule.clone())
                .or_insert_with(|| RuleView {
                    limit: ru.limit,
                    fallback: ru.fallback,
                    split: ru.split_now.fresh(ru.split.unwrap_or(0), now_ms),
                    keys: HashMap::new(),
                    retiring: HashMap::new(),
                    fresh: true,
                });
            view.retiring.retain(|_, (_, until)| now_ms < *until);
            view.limit = ru.limit;
            view.fallback = ru.fallback;
            if let Some(v) = ru.split {
                view.split.take(v, ru.split_now, now_ms, window);
            }
            let key_now = ru.key_now();
            if update.full {
                let gone: Vec<String> = view
                    .keys
                    .keys()
                    .filter(|k| !ru.keys.iter().any(|(key, _)| key == *k))
                    .cloned()
                    .collect();
                for key in gone {
                    view.retire(&key, now_ms, window);
                }
            }
            let fresh = std::mem::take(&mut view.fresh);
            for (key, value) in &ru.keys {
                match value {
                    Some(v) if fresh => {
                        let val = key_now(key).fresh(*v, now_ms);
                        view.keys.insert(key.clone(), val);
                    }
                    Some(v) => match view.keys.get_mut(key) {
                        Some(existing) => existing.take(*v, key_now(key), now_ms, window),
                        None => {
                            // The key was enforced at the split (or a
                            // retiring entry) until now.
                            let mut val = view.retiring.remove(key).map_or(view.split, |r| r.0);
                            val.take(*v, key_now(key), now_ms, window);
                            view.keys.insert(key.clone(), val);
                        }
                    },
                    None => view.retire(key, now_ms, window),
                }
            }
        }
        Ok(())
    }

    /// The limit `key` of `rule` has in this region now: `None` when the rule
    /// has no allocation here (not global, or nothing received yet).
    pub fn limit(&self, rule: &str, key: &str, now_ms: Millis) -> Option<u64> {
        let view = self.rules.get(rule)?;
        let value = match view.keys.get(key) {
            Some(v) => v.at(now_ms),
            None => match view.retiring.get(key) {
                Some((v, until)) if now_ms < *until => v.at(now_ms),
                _ => view.split.at(now_ms),
            },
        };
        Some(self.within_lease(rule, view, value, now_ms))
    }

    /// `value` of `rule` as enforced at `now_ms`: past the lease, at most
    /// the rule's fallback, and nothing once its hold ran out.
    fn within_lease(&self, rule: &str, view: &RuleView, value: u64, now_ms: Millis) -> u64 {
        super::lapsed_value(
            value,
            view.fallback,
            self.valid_until_ms,
            self.fallback_hold_ms(rule),
            now_ms,
        )
    }

    /// Sets every global rule's `fallback_hold`, by rule id, replacing
    /// the last set (so it holds at most the rules of one rule set). The
    /// limiter calls it with each rule set it applies; the simulator once.
    pub fn set_fallback_holds(&mut self, holds: HashMap<String, i64>) {
        self.holds = holds;
    }

    /// `rule`'s `fallback_hold`.
    pub fn fallback_hold_ms(&self, rule: &str) -> i64 {
        self.holds
            .get(rule)
            .copied()
            .unwrap_or(super::DEFAULT_FALLBACK_HOLD_MS)
    }

    /// The largest value any key of `rule` has now (the `cap` of a
    /// [`super::WindowUse`]); the lease fallback is not applied, so it is
    /// never below what a key may be admitted.
    pub fn window_cap(&self, rule: &str, now_ms: Millis) -> Option<u64> {
        let view = self.rules.get(rule)?;
        let keys = view.keys.values().map(|v| v.at(now_ms));
        let retiring = view
            .retiring
            .values()
            .filter(|(_, until)| now_ms < *until)
            .map(|(v, _)| v.at(now_ms));
        Some(keys.chain(retiring).fold(view.split.at(now_ms), u64::max))
    }

    /// The rules this table holds allocations for.
    pub fn rules(&self) -> impl Iterator<Item = &str> {
        self.rules.keys().map(String::as_str)
    }

    /// The rule-level value in force for keys without an entry of their own
    /// (past the lease, the smaller of it and the fallback, as [`Table::limit`]).
    pub fn split_limit(&self, rule: &str, now_ms: Millis) -> Option<u64> {
        let view = self.rules.get(rule)?;
        Some(self.within_lease(rule, view, view.split.at(now_ms), now_ms))
    }

    /// The world-wide limit of a rule this table holds.
    pub fn global_limit(&self, rule: &str) -> Option<u64> {
        self.rules.get(rule).map(|v| v.limit)
    }

    /// Key entries held for a rule (metrics).
    pub fn key_entries(&self, rule: &str) -> usize {
        self.rules.get(rule).map_or(0, |v| v.keys.len())
    }
}
