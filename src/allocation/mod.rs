//! Global limits: how one limit `L` is divided between regions (docs/architecture.md).
//!
//! Pure — no I/O, no clock, no async — so the coordinator, the limiter and the
//! simulator run the same code:
//! - [`Allocations`] is the replicated state: per global rule a rule-level
//!   split and per-key entries, each a [`Slot`] per region, plus every
//!   region's lease. It changes only through [`Allocations::apply`] with an
//!   [`EpochDelta`], so a Raft log of deltas rebuilds it on every node.
//! - [`rebalance::rebalance`] computes the next state from the current one,
//!   smoothed demand and acknowledgements; [`Allocations::diff`] turns it into
//!   the delta that is committed.
//! - [`demand`] smooths reports (EWMA) and tracks which epoch each pod holds.
//! - [`table`] is the limiter's side: the allocation one region enforces, with
//!   epoch fencing, window-boundary switching and lease fallback.
//!
//! ## The invariant
//! A slot's `bound` is the most its region may still be enforcing: the
//! largest value published to it since the last epoch it acknowledged.
//! Grants come only out of `L − Σ bound`, so the values in force anywhere sum
//! to at most `L` in every transition (shrink before grow).

pub mod cadence;
pub mod demand;
pub mod global_rule;
pub mod leader;
pub mod ledger;
pub mod override_scale;
pub mod pod;
pub mod pod_report;
pub mod rebalance;
pub mod reserved;
pub mod returns;
pub mod settings;
pub mod table;
pub mod transition;
pub mod water_fill;

use std::collections::{BTreeMap, VecDeque};

use serde::{Deserialize, Serialize};

use crate::rules::Partition;

/// Allocation epoch number; every committed delta increments it.
pub type Epoch = u64;
/// Unix time in milliseconds (the coordinator leader's clock, carried in
/// commands so every node applies the same value).
pub type Millis = i64;

/// Whether `name` may name a region: 1–64 characters of a-z, 0-9, '-' or
/// '_' (the admin API's rule for `PUT /api/v1/regions/{name}`, and the
/// certificates' `meridian://region/NAME`).
pub fn valid_region_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
}

/// A region asks for an early top-up of a key once it has used this
/// fraction of its allocation in the current window.
pub const TOP_UP_AT: f64 = 0.9;

/// A top-up raises a key's demand only when the region's pace is at least
/// this multiple of the smoothed demand (see `DemandTracker::bump`).
pub const TOP_UP_JUMP: f64 = 1.25;

/// A rule's `fallback_hold` unless it says otherwise.
pub const DEFAULT_FALLBACK_HOLD_MS: i64 = crate::rules::DEFAULT_FALLBACK_HOLD.as_millis() as i64;

/// What a region whose lease ended at `valid_until_ms` may enforce at
/// `now_ms` on its own clock, given what it holds (`value`), its `fallback`
/// share and the rule's hold: `value` while the lease runs, then at most
/// `fallback` for `hold_ms`, then nothing. The limiter's table and the
/// centre's reserve ([`rebalance`], with the skew margin added) both read
/// this one schedule.
pub fn lapsed_value(
    value: u64,
    fallback: u64,
    valid_until_ms: Millis,
    hold_ms: i64,
    now_ms: Millis,
) -> u64 {
    if now_ms <= valid_until_ms {
        value
    } else if now_ms <= valid_until_ms.saturating_add(hold_ms.max(0)) {
        value.min(fallback)
    } else {
        0
    }
}

/// When a lease ending at `valid_until_ms` is renewed at the latest (to
/// `now + lease`): with a third of it left, a round runs then whatever the
/// rebalance interval. Any full or top-up round after half of it renews it
/// earlier. A third leaves the renewal seconds to commit and reach the
/// region (10 s of the default 30 s); renewing later, not at half, makes a
/// region cut off just after a renewal strand less on average.
pub fn renew_at(valid_until_ms: Millis, lease_ms: i64) -> Millis {
    valid_until_ms - lease_ms / 3
}

/// Scheduled rounds end this long before a multiple of the rebalance
/// interval in Unix time (see [`next_round_at`]).
pub const ROUND_LEAD_MS: i64 = 5_000;

/// When the next scheduled round runs: the first instant after `now_ms`
/// that lies `lead_ms` (at most half the interval) before a multiple of
/// `interval_ms` in Unix time.
///
/// Windows are aligned to the clock, and a grow waits for the next window
/// boundary (shrink before grow): a round that ends just before the
/// boundary — with time for the shrink to be acknowledged — has what it
/// moves enforced within `lead_ms`, where a round just after the boundary
/// would wait a whole window (the simulated shift lost most of a window that
/// way).
pub fn next_round_at(now_ms: Millis, interval_ms: i64, lead_ms: i64) -> Millis {
    let interval = interval_ms.max(1);
    let lead = lead_ms.clamp(0, interval / 2);
    ((now_ms + lead).div_euclid(interval) + 1) * interval - lead
}

/// How many epochs [`Allocations::history`] keeps.
pub const HISTORY_EPOCHS: usize = 100;
/// Changed slots one history record keeps at most.
pub const HISTORY_CHANGES: usize = 200;

/// A region's state as the operator set it (mirrors the registry).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RegionStatus {
    /// Takes part in the division: floor, demand share and headroom.
    Active,
    /// Its share moves away: it keeps only its floor.
    Draining,
    /// It gets nothing new (what it may still enforce stays reserved).
    Failed,
}

/// Rebalancer knobs. Durations in milliseconds; fractions 0.0–1.0.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Config {
    /// How long an allocation stays valid without renewal.
    pub lease_ms: i64,
    /// `partition: available`: silence after which a region's share above its
    /// fallback is re-granted (shorter than the lease).
    pub suspect_after_ms: i64,
    /// Added to a lease before the centre treats it as lapsed (clock skew
    /// between the coordinator and regions).
    pub skew_margin_ms: i64,
    /// EWMA weight of the newest demand sample (1.0 = no smoothing).
    pub ewma_alpha: f64,
    /// Demand is inflated by this fraction before water-filling, so a region
    /// has room to grow before it is throttled.
    pub headroom: f64,
    /// Every active region keeps this fraction of its static (weight) share.
    pub floor: f64,
    /// Changes smaller than this fraction of `L` in every region are ignored.
    pub hysteresis: f64,
    /// Most of `L` moved into or out of one region per epoch; `None` = no cap.
    pub max_shift: Option<f64>,
    /// Keys with their own entry per rule, at most (the top keys by demand).
    pub max_key_entries: usize,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            lease_ms: 30_000,
            suspect_after_ms: 20_000,
            skew_margin_ms: 1_000,
            ewma_alpha: 0.5,
            headroom: 0.1,
            floor: 0.1,
            hysteresis: 0.01,
            max_shift: None,
            max_key_entries: 1_000,
        }
    }
}

/// What the rebalancer needs of a region this round.
#[derive(Debug, Clone, PartialEq)]
pub struct RegionInput {
    /// The region's registered name, as its pods report it.
    pub name: String,
    /// Relative static share (> 0).
    pub weight: f64,
    /// The operator's status for the region, which caps what it can be granted.
    pub status: RegionStatus,
    /// When any of its pods last reported or acknowledged.
    pub last_heard_ms: Option<Millis>,
    /// The newest epoch every recently heard pod of the region holds.
    pub acked: Option<Epoch>,
}

/// What the rebalancer needs of a global rule.
#[derive(Debug, Clone, PartialEq)]
pub struct RulePolicy {
    /// The rule's id (`Rule::id`).
    pub rule: String,
    /// The world-wide limit per period.
    pub limit: u64,
    /// Whether a silent region's share above its fallback may be re-granted.
    pub partition: Partition,
    /// Share of the static allocation a region keeps when its lease lapses.
    pub fallback: f64,
    /// How long after its lease lapsed a region keeps `fallback`; then it
    /// steps down to nothing on its own clock, and the centre re-grants the
    /// reserve at the same instant plus the skew margin, so a dead region's
    /// share returns to the living within lease + hold + a round.
    pub fallback_hold_ms: i64,
    /// The window of a windowed algorithm (values switch at its
    /// boundaries); `None` for buckets.
    pub window_ms: Option<u64>,
}

/// One region's allocation within a rule or key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Slot {
    /// Published to the region: what it enforces once it holds the epoch.
    pub granted: u64,
    /// The most the region may still enforce (≥ `granted`): a shrink counts at
    /// the old value until the region acknowledges the epoch that carried it.
    pub bound: u64,
    /// Where the rebalancer wants `granted` to go.
    pub target: u64,
    /// The epoch that last changed `granted`.
    pub since: Epoch,
    /// The last change was a grow paid entirely from capacity never issued
    /// to any region: nobody can be using it in the current window, so the
    /// region may apply it at once instead of at the next window boundary.
    #[serde(default)]
    pub immediate: bool,
    /// The last change was a shrink that applies at once, so what it gives
    /// up can be granted within the window (see [`InWindow`]): to `granted`
    /// when the region had not used it yet this window, else to `before`
    /// until `before_until_ms` (a step, [`InWindow::shrink_step`]) and to
    /// `granted` from that boundary.
    #[serde(default)]
    pub shrink_now: bool,
    /// When `immediate` or `shrink_now` was decided for one window only,
    /// that window's end: a pod that gets the update later (a snapshot after
    /// a reconnect) applies it at a boundary like any other change. 0: no
    /// end (capacity never issued can be used at any time).
    #[serde(default)]
    pub now_until_ms: Millis,
    /// Until `before_until_ms` (the boundary after a grow that waits for it),
    /// what the region enforced when that window began: a pod that starts
    /// before the boundary (a restart, a new pod) holds no old value to keep
    /// and takes this one, so it never takes the grow early. After a step
    /// shrink (`shrink_now` with `before` above `granted`) or a step grow
    /// (`immediate` with `before` below `granted`), the step: what the
    /// region enforces until that boundary.
    #[serde(default)]
    pub before: u64,
    /// The end of the window `before` is enforced in; 0 when there is none.
    #[serde(default)]
    pub before_until_ms: Millis,
}

/// What one region may admit in the current window of a rule counted in
/// fixed windows on the exact path, from its pods' own reports.
///
/// The final count of a key in a window is at most the larger of what any
/// pod saw it reach before lowering its value and the value in force after:
/// every later admission needs `count + cost ≤ value`. So once every pod of a
/// region has applied a shrink and reported, the region cannot admit more
/// than `max(count, cap)` this window, and the rest of `L` can be granted at
/// once instead of at the next boundary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WindowUse {
    /// The most any key of the rule had been admitted this window, as seen
    /// by the pod's own checks (in-flight checks drained first).
    pub count: u64,
    /// The largest value the pod enforces for the rule now (any key).
    pub cap: u64,
}

/// What a region's live pods reported of the current window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RegionWindow {
    /// The largest count and cap among the pods that reported.
    pub used: WindowUse,
    /// Pods heard recently, and how many of them reported this window.
    pub live: usize,
    /// How many of the `live` pods reported this window.
    pub reported: usize,
    /// Since when every live pod has been heard without a long silence.
    pub settled_since: Millis,
    /// The region's pace since a pod's previous report of this window (the
    /// fastest of its pods), when one reported twice in it.
    pub recent: Option<Recent>,
}

/// What a region admitted between two reports of one pod within a window:
/// its pace now, where the smoothed demand estimate trails it by rounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Recent {
    /// Hits admitted between the reports (the count's rise).
    pub hits: u64,
    /// Time between the reports, as the leader heard them (> 0).
    pub over_ms: u64,
}

impl Recent {
    /// The pace as hits per `window_ms`.
    pub fn per_window(&self, window_ms: u64) -> f64 {
        self.hits as f64 * window_ms as f64 / self.over_ms as f64
    }

    /// Whether this pace is faster than `other`'s.
    fn faster_than(&self, other: &Recent) -> bool {
        u128::from(self.hits) * u128::from(other.over_ms)
            > u128::from(other.hits) * u128::from(self.over_ms)
    }
}

impl RegionWindow {
    /// Every live pod reported: the region cannot admit more than
    /// `max(count, cap)` this window. (A pod that has not may be enforcing
    /// anything it was ever sent.)
    pub fn known(&self) -> bool {
        self.live > 0 && self.reported == self.live
    }

    /// Keeps the faster of the recent pace held and `pace`.
    pub fn keep_faster(&mut self, pace: Recent) {
        if self.recent.is_none_or(|r| pace.faster_than(&r)) {
            self.recent = Some(pace);
        }
    }
}

/// A rule's in-window use in every region (indexed like `Round::regions`).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct InWindow {
    /// The window the uses were counted in.
    pub start_ms: Millis,
    /// The window's end.
    pub until_ms: Millis,
    /// The part of the window gone when they were read (0.0–1.0).
    pub elapsed: f64,
    /// One per region, indexed like `Round::regions`.
    pub regions: Vec<RegionWindow>,
}

impl InWindow {
    /// Every region's use is known: only then can anything be granted within
    /// the window.
    pub fn complete(&self) -> bool {
        self.regions.iter().all(RegionWindow::known)
    }

    /// Whether region `i` shrinking to `to` may apply at once: its pace so
    /// far (what its pods reported) fits under `to` for the whole window,
    /// with room for noise. Lowering a value is always safe; this keeps a
    /// shrink from denying a region what it is still using — a target from
    /// stale demand (a region back from a partition) would cut it off for
    /// the rest of the window.
    ///
    /// Not for a region back from a partition or a restart this window: its
    /// demand, and so its target, may be stale.
    pub fn may_shrink_now(&self, i: usize, to: u64) -> bool {
        let r = self.regions[i];
        self.heard_all_window(i)
            && r.used.count as f64 <= SHRINK_NOW_SLACK * to as f64 * self.elapsed
    }

    /// What region `i`, shrinking to `to` at a pace that does not fit `to`
    /// ([`may_shrink_now`](Self::may_shrink_now) said no), may enforce for
    /// the rest of the window: what it counted so far plus `to`'s pace over
    /// what is left, as if the rest of the window were split anew. A swing
    /// early in a window comes from a region that ran at its old share's
    /// pace until then; holding that share to the boundary kept the region
    /// that gained from most of the window, and cutting the other to `to`
    /// at once would deny it the rest. `None` when its reports cannot tell
    /// (as for `may_shrink_now`).
    pub fn shrink_step(&self, i: usize, to: u64) -> Option<u64> {
        let left = (1.0 - self.elapsed).clamp(0.0, 1.0);
        self.heard_all_window(i)
            .then(|| self.regions[i].used.count + (to as f64 * left).ceil() as u64)
    }

    /// Region `i` reported this window and none of its pods started (or
    /// came back from a silence) within it: its count covers the window.
    fn heard_all_window(&self, i: usize) -> bool {
        let r = self.regions[i];
        r.reported > 0 && r.settled_since <= self.start_ms
    }

    /// No pod of any region started (or came back from a silence) within
    /// the window: every count reported covers the whole window.
    pub fn settled(&self) -> bool {
        self.regions
            .iter()
            .all(|r| r.settled_since <= self.start_ms)
    }
}

/// How far above its pro-rata share of a shrink's new value a region's count
/// may be for the shrink to apply at once (see [`InWindow::may_shrink_now`]).
pub const SHRINK_NOW_SLACK: f64 = 1.5;

/// Region name → slot.
pub type Shares = BTreeMap<String, Slot>;

/// A key whose regional mix differs enough from its rule's split to get its own.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct KeyAllocation {
    /// The key's own slot per region, used instead of the rule's split.
    pub shares: Shares,
    /// Smoothed demand per region, hits per period.
    pub demand: BTreeMap<String, f64>,
}

/// One global rule's division between regions: the split every key uses, the
/// keys with their own, and the demand both were computed from.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct RuleAllocation {
    /// The world-wide limit per period.
    pub limit: u64,
    /// What each region falls to when its lease lapses (and what the centre
    /// keeps reserved for it then).
    pub fallback: BTreeMap<String, u64>,
    /// Used by every key without an entry of its own.
    pub split: Shares,
    /// The most of the limit the split has ever had issued (Σ bound at its
    /// highest). What lies above it was never in force anywhere.
    #[serde(default)]
    pub high_water: u64,
    /// Smoothed demand per region (all keys), hits per period.
    pub demand: BTreeMap<String, f64>,
    /// Keys with their own allocation, at most `Config::max_key_entries`.
    pub keys: BTreeMap<String, KeyAllocation>,
}

/// A region's lease and what the centre knows of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct RegionLease {
    /// The latest `valid_until` published to the region.
    pub valid_until_ms: Millis,
    /// The newest epoch the whole region acknowledged.
    pub acked: Epoch,
    /// When any pod of the region was last heard (a report or an acknowledgement).
    pub last_heard_ms: Millis,
}

/// One epoch in the history the admin API shows (`GET /api/v1/allocations`),
/// built by [`Allocations::apply`] from the grants the epoch's delta changed.
/// Replicated with the rest of [`Allocations`], so every node shows the same
/// history; it is bounded by [`HISTORY_EPOCHS`] and [`HISTORY_CHANGES`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EpochRecord {
    /// The epoch whose delta made these changes.
    pub epoch: Epoch,
    /// When the leader computed it (the delta's `at_ms`).
    pub at_ms: Millis,
    /// The grants that changed, in the order the delta applied them; at most
    /// [`HISTORY_CHANGES`].
    pub changes: Vec<GrantChange>,
}

/// One region's grant of a rule's split or of one key entry, as an epoch
/// changed it.
///
/// In replicated state (Raft log and snapshots, as bincode): the field order
/// is the encoding — bincode writes a struct as its fields in order, exactly
/// as the `(rule, key, region, granted)` tuple this replaced — so do not
/// reorder or insert fields without a new storage format version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GrantChange {
    /// The global rule's id.
    pub rule: String,
    /// The key whose own entry changed; `None` for the rule's split (every
    /// key without an entry of its own).
    pub key: Option<String>,
    /// The region the grant is published to.
    pub region: String,
    /// The new [`Slot::granted`].
    pub granted: u64,
}

/// The replicated allocation state: what each region may enforce of every
/// global rule, and each region's lease. Held by the coordinator's Raft state
/// machine (inside `Registry`), changed only by [`Allocations::apply`] of a
/// committed [`EpochDelta`]; the simulator holds one per simulated centre.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Allocations {
    /// The last applied epoch (0 before the first).
    pub epoch: Epoch,
    /// When the leader computed that epoch.
    pub at_ms: Millis,
    /// Region name → its lease and what the centre knows of it.
    pub regions: BTreeMap<String, RegionLease>,
    /// Global rule id → how its limit is divided.
    pub rules: BTreeMap<String, RuleAllocation>,
    /// The newest epochs that changed a grant, oldest first, for operators.
    pub history: VecDeque<EpochRecord>,
}

/// What changed between two states: committed through Raft as one command
/// (`Command::Epoch`), so a log of deltas rebuilds [`Allocations`] on every
/// node. Made by [`Allocations::diff`], applied by [`Allocations::apply`].
///
/// Changes are maps keyed by what they change — as [`Allocations`] itself
/// is — so a delta holds at most one change per region, rule or key by
/// construction. In bincode a map encodes exactly as the `Vec<(name,
/// change)>` it replaced (a length, then key, value pairs), so log entries
/// written before decode unchanged.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct EpochDelta {
    /// The epoch this delta makes current; applied only right after `epoch - 1`.
    pub epoch: Epoch,
    /// When the leader computed it.
    pub at_ms: Millis,
    /// Region name → its new or changed lease; `None` removes the region.
    pub regions: BTreeMap<String, Option<RegionLease>>,
    /// Rule id → what changed in it; `None` removes the rule.
    pub rules: BTreeMap<String, Option<RuleDelta>>,
}

/// What changed in one rule's allocation. The scalars (`limit`, `fallback`,
/// `high_water`) are always carried whole; the split, the demand and key
/// entries only when they changed.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct RuleDelta {
    /// The rule's world-wide limit.
    pub limit: u64,
    /// Region name → what it falls to when its lease lapses.
    pub fallback: BTreeMap<String, u64>,
    /// See [`RuleAllocation::high_water`].
    pub high_water: u64,
    /// The whole split, when any slot of it changed.
    pub split: Option<Shares>,
    /// The whole demand map, when it changed.
    pub demand: Option<BTreeMap<String, f64>>,
    /// Key → its new or changed entry; `None` removes the entry (the key
    /// falls back to the split).
    pub keys: BTreeMap<String, Option<KeyAllocation>>,
}

impl Allocations {
    /// What `region` enforces for `key` of `rule`: the key's entry or the split.
    pub fn slot(&self, rule: &str, key: &str, region: &str) -> Option<&Slot> {
        let r = self.rules.get(rule)?;
        match r.keys.get(key) {
            Some(entry) => entry.shares.get(region),
            None => r.split.get(region),
        }
    }

    /// The delta that turns `self` into `next`; `next.epoch` must be newer.
    pub fn diff(&self, next: &Allocations) -> EpochDelta {
        let mut delta = EpochDelta {
            epoch: next.epoch,
            at_ms: next.at_ms,
            ..EpochDelta::default()
        };
        for (name, lease) in &next.regions {
            if self.regions.get(name) != Some(lease) {
                delta.regions.insert(name.clone(), Some(*lease));
            }
        }
        for name in self.regions.keys() {
            if !next.regions.contains_key(name) {
                delta.regions.insert(name.clone(), None);
            }
        }
        for (id, rule) in &next.rules {
            let old = self.rules.get(id);
            let mut rd = RuleDelta {
                limit: rule.limit,
                fallback: rule.fallback.clone(),
                high_water: rule.high_water,
                split: (old.map(|o| &o.split) != Some(&rule.split)).then(|| rule.split.clone()),
                demand: (old.map(|o| &o.demand) != Some(&rule.demand)).then(|| rule.demand.clone()),
                keys: BTreeMap::new(),
            };
            for (key, entry) in &rule.keys {
                if old.and_then(|o| o.keys.get(key)) != Some(entry) {
                    rd.keys.insert(key.clone(), Some(entry.clone()));
                }
            }
            if let Some(old) = old {
                for key in old.keys.keys() {
                    if !rule.keys.contains_key(key) {
                        rd.keys.insert(key.clone(), None);
                    }
                }
            }
            let unchanged = old
                .is_some_and(|o| o.limit == rule.limit && o.fallback == rule.fallback)
                && rd.split.is_none()
                && rd.demand.is_none()
                && rd.keys.is_empty();
            if !unchanged {
                delta.rules.insert(id.clone(), Some(rd));
            }
        }
        for id in self.rules.keys() {
            if !next.rules.contains_key(id) {
                delta.rules.insert(id.clone(), None);
            }
        }
        delta
    }

    /// Applies a committed delta. Deltas not newer than the state are ignored
    /// (a replayed log entry), so applying is idempotent.
    pub fn apply(&mut self, delta: &EpochDelta) {
        if delta.epoch <= self.epoch {
            return;
        }
        self.epoch = delta.epoch;
        self.at_ms = delta.at_ms;
        for (name, lease) in &delta.regions {
            match lease {
                Some(l) => {
                    self.regions.insert(name.clone(), *l);
                }
                None => {
                    self.regions.remove(name);
                }
            }
        }
        let mut record = EpochRecord {
            epoch: delta.epoch,
            at_ms: delta.at_ms,
            changes: Vec::new(),
        };
        for (id, rd) in &delta.rules {
            let Some(rd) = rd else {
                self.rules.remove(id);
                continue;
            };
            let rule = self.rules.entry(id.clone()).or_default();
            rule.limit = rd.limit;
            rule.fallback = rd.fallback.clone();
            rule.high_water = rd.high_water;
            if let Some(split) = &rd.split {
                note_changes(&mut record, id, None, &rule.split, split);
                rule.split = split.clone();
            }
            if let Some(demand) = &rd.demand {
                rule.demand = demand.clone();
            }
            for (key, entry) in &rd.keys {
                match entry {
                    Some(e) => {
                        let empty = Shares::new();
                        let old = rule.keys.get(key).map_or(&empty, |o| &o.shares);
                        note_changes(&mut record, id, Some(key), old, &e.shares);
                        rule.keys.insert(key.clone(), e.clone());
                    }
                    None => {
                        rule.keys.remove(key);
                    }
                }
            }
        }
        if !record.changes.is_empty() {
            self.history.push_back(record);
            while self.history.len() > HISTORY_EPOCHS {
                self.history.pop_front();
            }
        }
    }
}

fn note_changes(
    record: &mut EpochRecord,
    rule: &str,
    key: Option<&String>,
    old: &Shares,
    new: &Shares,
) {
    for (region, slot) in new {
        if record.changes.len() >= HISTORY_CHANGES {
            return;
        }
        if old.get(region).map(|s| s.granted) != Some(slot.granted) {
            record.changes.push(GrantChange {
                rule: rule.to_string(),
                key: key.cloned(),
                region: region.clone(),
                granted: slot.granted,
            });
        }
    }
}

/// Each region's static share of `limit` by weight (floor of the exact share).
pub fn static_shares(limit: u64, regions: &[RegionInput]) -> Vec<u64> {
    let total: f64 = regions.iter().map(|r| r.weight.max(0.0)).sum();
    regions
        .iter()
        .map(|r| {
            if total <= 0.0 {
                0
            } else {
                (limit as f64 * r.weight.max(0.0) / total).floor() as u64
            }
        })
        .collect()
}

/// What a region falls to when its lease lapses: `fallback` × its static share.
pub fn fallback_share(static_share: u64, fallback: f64) -> u64 {
    (static_share as f64 * fallback.clamp(0.0, 1.0)).floor() as u64
}

#[cfg(test)]
mod demand_tests;
#[cfg(test)]
mod tests;
