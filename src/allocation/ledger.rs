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

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

use super::Millis;
use super::leader::{GlobalRule, PeriodAdmitted};
use crate::algorithm::Algorithm;
use crate::rules::{Accuracy, Partition, RuleSet, Scope};

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
/// `coordinator::report::MAX_POD_NAME`), for the stated bytes.
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

/// What the ledger needs of a global rule (limit index) to state its bound.
#[derive(Debug, Clone, PartialEq)]
pub struct Terms {
    /// The rule's id (`Rule::limit_id`).
    pub rule: String,
    /// The world-wide limit `L` per period, per key.
    pub limit: u64,
    /// The rule's period: the ledger's periods are aligned to it.
    pub period_ms: u64,
    /// Decides the bound: windowed `L`, buckets `burst + L`.
    pub algorithm: Algorithm,
    /// The buckets' burst (ignored for windowed algorithms).
    pub burst: u64,
    /// Approximate path: what each pod may hold unseen by others
    /// (`max_batch × split`); `None` on the exact path.
    pub per_pod_slack: Option<u64>,
    /// `available` may go above the bound while a region is cut off (said
    /// in [`Terms::bound_is`], not added).
    pub partition: Partition,
    /// Derived from the leader's [`GlobalRule`] alone (the algorithm's
    /// exact kind, a bucket's burst and the accuracy were not given): a
    /// bucket's burst is taken as `L` (its default).
    pub assumed: bool,
}

impl Terms {
    /// The terms of every limit of every `scope: global` rule of `set`.
    pub fn of_rule_set(set: &RuleSet) -> Vec<Terms> {
        set.rules()
            .filter(|r| r.scope == Scope::Global)
            .flat_map(|r| r.limits().enumerate().map(move |(i, p)| (r, i, p)))
            .map(|(r, i, params)| Terms {
                rule: r.limit_id(i).into_owned(),
                limit: params.limit(),
                period_ms: u64::try_from(params.period().as_millis()).unwrap_or(u64::MAX),
                algorithm: params.algorithm(),
                burst: params.burst(),
                per_pod_slack: match r.accuracy {
                    Accuracy::Exact => None,
                    Accuracy::Approximate { max_batch, .. } => Some(
                        max_batch
                            .unwrap_or((params.limit() / 100).max(1))
                            .saturating_mul(u64::from(r.split.max(1))),
                    ),
                },
                partition: r.partition,
                assumed: false,
            })
            .collect()
    }

    /// What the leader's own view of a rule tells (the simulator gives no
    /// more): windowed or bucket, exact, a bucket's burst = `L`.
    pub fn of_global_rule(rule: &GlobalRule) -> Terms {
        let algorithm = match (rule.counted, rule.policy.window_ms) {
            (true, _) => Algorithm::FixedWindow,
            (false, Some(_)) => Algorithm::SlidingWindowCounter,
            (false, None) => Algorithm::TokenBucket,
        };
        Terms {
            rule: rule.policy.rule.clone(),
            limit: rule.policy.limit,
            period_ms: rule.period_ms,
            algorithm,
            burst: rule.policy.limit,
            per_pod_slack: None,
            partition: rule.policy.partition,
            assumed: true,
        }
    }

    /// The most the world may admit of one key in one clock-aligned period
    /// with `pods` pods reporting (see the module docs).
    pub fn bound(&self, pods: u64) -> u64 {
        let base = if self.algorithm.has_burst() {
            self.burst.saturating_add(self.limit)
        } else {
            self.limit
        };
        base.saturating_add(self.per_pod_slack.unwrap_or(0).saturating_mul(pods))
    }

    /// The bound in words, for the API and reports.
    pub fn bound_is(&self) -> String {
        let mut s = if self.algorithm.has_burst() {
            format!(
                "burst + L = {} + {} ({}: B + R·T with T one period)",
                self.burst,
                self.limit,
                self.algorithm.name()
            )
        } else {
            format!(
                "L = {} ({}: every clock-aligned period ≤ L)",
                self.limit,
                self.algorithm.name()
            )
        };
        if let Some(slack) = self.per_pod_slack {
            s.push_str(&format!(
                "; approximate: + {slack} (max_batch × split) per pod that reported the period"
            ));
        }
        if self.assumed {
            s.push_str("; assumed from the leader's view (a bucket's burst taken as L)");
        }
        if self.partition == Partition::Available {
            s.push_str(
                "; partition: available may add a silent region's allocation for at most one \
                 lease (not included)",
            );
        }
        s
    }
}

/// One clock-aligned period of one rule, world-wide.
#[derive(Debug, Clone, PartialEq)]
pub struct PeriodFigure {
    /// The period's start, Unix ms (a multiple of `period_ms`).
    pub start_ms: Millis,
    /// The rule's period when it was measured.
    pub period_ms: u64,
    /// `L` when the period was measured.
    pub limit: u64,
    /// The stated bound then ([`Terms::bound`]).
    pub bound: u64,
    /// The busiest tracked key; `None` when no key was reported (then
    /// `admitted` is the all-keys count).
    pub key: Option<Arc<str>>,
    /// That key's world-wide admitted hits: the figure to compare with `L`.
    pub admitted: u64,
    /// The same per region, by region name.
    pub regions: Vec<(Arc<str>, u64)>,
    /// Every key of the rule together.
    pub all_keys: u64,
    /// The same per region, by region name.
    pub all_keys_regions: Vec<(Arc<str>, u64)>,
    /// Pods whose counts are in the figure.
    pub pods: u32,
    /// Keys tracked in the period.
    pub keys: u32,
    /// Every pod counted was heard after the period ended and none was
    /// refused: the figure is final. Otherwise it is a lower bound.
    pub complete: bool,
}

impl PeriodFigure {
    /// Whether the world admitted more than the stated bound.
    pub fn over_bound(&self) -> bool {
        self.admitted > self.bound
    }

    /// `admitted / L` (0 when `L` is 0).
    pub fn ratio(&self) -> f64 {
        if self.limit == 0 {
            0.0
        } else {
            self.admitted as f64 / self.limit as f64
        }
    }

    /// When the period ends.
    pub fn end_ms(&self) -> Millis {
        self.start_ms
            .saturating_add(Millis::try_from(self.period_ms).unwrap_or(Millis::MAX))
    }
}

/// Reports (entries) the ledger did not take, by reason, since it started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Dropped {
    /// For a rule that is not a global rule of the leader.
    pub unknown_rule: u64,
    /// A period start that is not a multiple of the rule's period.
    pub misaligned: u64,
    /// A period more than one period ahead of the leader's clock.
    pub future: u64,
    /// A period already finished.
    pub late: u64,
    /// A pod beyond [`MAX_PODS_PER_REGION`] in a period, or a region beyond
    /// [`MAX_REGIONS`].
    pub pods: u64,
    /// A key less busy than every one of the [`MAX_KEYS`] tracked.
    pub keys: u64,
}

/// One pod's count of one tracked key.
#[derive(Debug, Clone, Copy)]
struct KeyCount {
    slot: u8,
    /// The slot's generation the count belongs to: a slot given to another
    /// key gets a new generation, which makes every pod's count of the old
    /// key stale at once (no scan of the pods).
    generation: u32,
    count: u64,
}

/// One pod's latest counts in one open period.
#[derive(Debug, Default)]
struct PodCounts {
    /// The whole rule (`key: None`).
    all: u64,
    /// At most one per slot, so at most [`MAX_KEYS`].
    keys: Vec<KeyCount>,
    /// Heard after the period ended: these counts are final.
    settled: bool,
}

impl PodCounts {
    /// The pod's count of the key now in `slot`.
    fn of(&self, slot: usize, generation: u32) -> u64 {
        self.keys
            .iter()
            .find(|k| usize::from(k.slot) == slot && k.generation == generation)
            .map_or(0, |k| k.count)
    }
}

/// A tracked key.
#[derive(Debug)]
struct Tracked {
    key: Arc<str>,
    generation: u32,
    /// The sum of every pod's latest count.
    total: u64,
}

/// A period still taking reports.
#[derive(Debug)]
struct OpenPeriod {
    /// Tracked keys by slot, at most [`MAX_KEYS`].
    keys: Vec<Tracked>,
    /// Generations given so far (a slot's next is this + 1).
    generations: u32,
    /// The sum of every pod's latest whole-rule count.
    all_total: u64,
    /// Per region, per pod: its latest counts (at most
    /// [`MAX_PODS_PER_REGION`] pods a region).
    pods: BTreeMap<Arc<str>, BTreeMap<Box<str>, PodCounts>>,
    /// Reports of pods beyond the bound were refused in this period.
    refused: bool,
    /// The terms with the widest bound in force while the period was open:
    /// hits admitted under a limit that was lowered within the period were
    /// within their bound when admitted.
    terms: Terms,
}

impl OpenPeriod {
    fn new(terms: &Terms) -> OpenPeriod {
        OpenPeriod {
            terms: terms.clone(),
            keys: Vec::new(),
            generations: 0,
            all_total: 0,
            pods: BTreeMap::new(),
            refused: false,
        }
    }

    /// The slot of `key`, taking a free one or the least busy one's when
    /// `count` is larger (its counts go: its figure is lost, the price of
    /// a bounded ledger under a flood of keys); `None`: not busy enough to
    /// track.
    fn slot(&mut self, key: &str, count: u64) -> Option<usize> {
        if let Some(i) = self.keys.iter().position(|k| &*k.key == key) {
            return Some(i);
        }
        self.generations = self.generations.wrapping_add(1);
        let tracked = Tracked {
            key: Arc::from(key),
            generation: self.generations,
            total: 0,
        };
        if self.keys.len() < MAX_KEYS {
            self.keys.push(tracked);
            return Some(self.keys.len() - 1);
        }
        let (least, _) = self
            .keys
            .iter()
            .enumerate()
            .min_by_key(|(_, k)| k.total)
            .filter(|(_, k)| k.total < count)?;
        self.keys[least] = tracked;
        Some(least)
    }

    fn pod_count(&self) -> usize {
        self.pods.values().map(BTreeMap::len).sum()
    }

    /// The busiest tracked key's slot.
    fn busiest(&self) -> Option<usize> {
        self.keys
            .iter()
            .enumerate()
            .max_by_key(|(i, k)| (k.total, std::cmp::Reverse(*i)))
            .map(|(i, _)| i)
    }

    fn figure(&self, start_ms: Millis) -> PeriodFigure {
        let terms = &self.terms;
        let busiest = self.busiest();
        let mut complete = !self.refused;
        let mut regions = Vec::new();
        let mut all_keys_regions = Vec::new();
        for (region, pods) in &self.pods {
            let (mut key, mut all) = (0u64, 0u64);
            for p in pods.values() {
                complete &= p.settled;
                key = key.saturating_add(match busiest {
                    Some(slot) => p.of(slot, self.keys[slot].generation),
                    None => p.all,
                });
                all = all.saturating_add(p.all);
            }
            regions.push((Arc::clone(region), key));
            all_keys_regions.push((Arc::clone(region), all));
        }
        let pods = self.pod_count() as u64;
        PeriodFigure {
            start_ms,
            period_ms: terms.period_ms,
            limit: terms.limit,
            bound: terms.bound(pods),
            key: busiest.map(|i| Arc::clone(&self.keys[i].key)),
            admitted: busiest.map_or(self.all_total, |i| self.keys[i].total),
            regions,
            all_keys: self.all_total,
            all_keys_regions,
            pods: u32::try_from(pods).unwrap_or(u32::MAX),
            keys: self.keys.len() as u32,
            complete,
        }
    }

    /// The tracked keys, busiest first, with their world-wide counts.
    fn top_keys(&self, n: usize) -> Vec<(Arc<str>, u64)> {
        let mut keys: Vec<(Arc<str>, u64)> = self
            .keys
            .iter()
            .map(|k| (Arc::clone(&k.key), k.total))
            .collect();
        keys.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        keys.truncate(n);
        keys
    }

    /// Takes one pod's count (`slot`: of a tracked key, else the whole
    /// rule's), replacing the pod's previous one.
    fn take(
        &mut self,
        counts_at: (&Arc<str>, &str),
        slot: Option<usize>,
        count: u64,
        settled: bool,
    ) {
        let (region, pod) = counts_at;
        let Some(counts) = self
            .pods
            .get_mut(&**region)
            .and_then(|pods| pods.get_mut(pod))
        else {
            return;
        };
        counts.settled |= settled;
        match slot {
            None => {
                self.all_total = self
                    .all_total
                    .saturating_sub(counts.all)
                    .saturating_add(count);
                counts.all = count;
            }
            Some(slot) => {
                let tracked = &mut self.keys[slot];
                let old = match counts.keys.iter_mut().find(|k| usize::from(k.slot) == slot) {
                    Some(k) => {
                        // Another generation: the count of a key that
                        // left the slot, not this one's.
                        let old = if k.generation == tracked.generation {
                            k.count
                        } else {
                            0
                        };
                        (k.generation, k.count) = (tracked.generation, count);
                        old
                    }
                    None => {
                        counts.keys.push(KeyCount {
                            slot: u8::try_from(slot).unwrap_or(u8::MAX),
                            generation: tracked.generation,
                            count,
                        });
                        0
                    }
                };
                tracked.total = tracked.total.saturating_sub(old).saturating_add(count);
            }
        }
    }

    /// Whether `pod` of `region` is counted, adding it when its region has
    /// room.
    fn admit(&mut self, region: &Arc<str>, pod: &str) -> bool {
        let pods = self.pods.entry(Arc::clone(region)).or_default();
        if pods.contains_key(pod) {
            return true;
        }
        if pods.len() >= MAX_PODS_PER_REGION {
            self.refused = true;
            return false;
        }
        pods.insert(Box::from(pod), PodCounts::default());
        true
    }

    fn bytes(&self) -> usize {
        let keys: usize = self
            .keys
            .iter()
            .map(|k| std::mem::size_of::<Tracked>() + k.key.len() + 16)
            .sum();
        let pods: usize = self
            .pods
            .values()
            .flat_map(|pods| pods.iter())
            .map(|(pod, p)| {
                // The map's key and value, the pod's name and its key counts
                // (the region's name is shared, counted once per ledger).
                std::mem::size_of::<(Box<str>, PodCounts)>()
                    + pod.len()
                    + p.keys.capacity() * std::mem::size_of::<KeyCount>()
            })
            .sum();
        let regions =
            self.pods.len() * std::mem::size_of::<(Arc<str>, BTreeMap<Box<str>, PodCounts>)>();
        std::mem::size_of::<OpenPeriod>() + self.terms.rule.capacity() + keys + pods + regions
    }
}

/// One rule's open periods and history.
#[derive(Debug)]
pub struct RuleLedger {
    terms: Terms,
    open: BTreeMap<Millis, OpenPeriod>,
    /// Finished periods, oldest first.
    finished: VecDeque<PeriodFigure>,
    /// The newest finished period's start: reports for it or older are late.
    finished_through: Option<Millis>,
}

impl RuleLedger {
    fn new(terms: Terms) -> RuleLedger {
        RuleLedger {
            terms,
            open: BTreeMap::new(),
            finished: VecDeque::new(),
            finished_through: None,
        }
    }

    /// The terms the figures are stated against.
    pub fn terms(&self) -> &Terms {
        &self.terms
    }

    fn period(&self) -> Millis {
        Millis::try_from(self.terms.period_ms).unwrap_or(Millis::MAX)
    }

    fn take(
        &mut self,
        region: &Arc<str>,
        pod: &str,
        a: &PeriodAdmitted,
        now: Millis,
        dropped: &mut Dropped,
    ) {
        let p = self.period();
        if p <= 0 || a.period_start_ms.rem_euclid(p) != 0 {
            dropped.misaligned += 1;
            return;
        }
        let start = a.period_start_ms;
        if start > now.saturating_add(p) {
            dropped.future += 1;
            return;
        }
        let finishable = start
            .saturating_add(p)
            .saturating_add(final_wait_ms(self.terms.period_ms))
            <= now;
        if finishable || self.finished_through.is_some_and(|f| start <= f) {
            dropped.late += 1;
            return;
        }
        if !self.open.contains_key(&start) && self.open.len() >= OPEN_PERIODS {
            match self.open.keys().next().copied() {
                Some(oldest) if oldest < start => self.finish(oldest),
                _ => {
                    dropped.late += 1;
                    return;
                }
            }
        }
        let terms = &self.terms;
        let period = self
            .open
            .entry(start)
            .or_insert_with(|| OpenPeriod::new(terms));
        if !period.admit(region, pod) {
            dropped.pods += 1;
            return;
        }
        let slot = match &a.key {
            None => None,
            Some(key) => match period.slot(key, a.admitted) {
                Some(slot) => Some(slot),
                None => {
                    dropped.keys += 1;
                    return;
                }
            },
        };
        period.take(
            (region, pod),
            slot,
            a.admitted,
            now >= start.saturating_add(p),
        );
    }

    fn finish(&mut self, start: Millis) {
        let Some(period) = self.open.remove(&start) else {
            return;
        };
        let figure = period.figure(start);
        self.finished_through = Some(self.finished_through.map_or(start, |f| f.max(start)));
        self.finished.push_back(figure);
        while self.finished.len() > MAX_FINISHED {
            self.finished.pop_front();
        }
    }

    fn advance(&mut self, now: Millis) {
        let p = self.period();
        let wait = final_wait_ms(self.terms.period_ms);
        let due: Vec<Millis> = self
            .open
            .keys()
            .copied()
            .filter(|s| s.saturating_add(p).saturating_add(wait) <= now)
            .collect();
        for start in due {
            self.finish(start);
        }
        // The last hour, and the newest two whatever their age (a period
        // longer than an hour still shows its last figures).
        while self.finished.len() > 2
            && self
                .finished
                .front()
                .is_some_and(|f| f.end_ms() < now.saturating_sub(HOUR_MS))
        {
            self.finished.pop_front();
        }
    }

    /// The period containing `now`, as counted so far (zero when no pod
    /// reported it yet).
    pub fn current(&self, now: Millis) -> PeriodFigure {
        let p = self.period().max(1);
        let start = now.div_euclid(p) * p;
        match self.open.get(&start) {
            Some(period) => period.figure(start),
            None => OpenPeriod::new(&self.terms).figure(start),
        }
    }

    /// The periods still open (the current one, the one just ended, …),
    /// oldest first.
    pub fn open(&self) -> Vec<PeriodFigure> {
        self.open
            .iter()
            .map(|(start, period)| period.figure(*start))
            .collect()
    }

    /// The busiest tracked keys of the period containing `now`, at most `n`.
    pub fn top_keys(&self, now: Millis, n: usize) -> Vec<(Arc<str>, u64)> {
        let p = self.period().max(1);
        self.open
            .get(&(now.div_euclid(p) * p))
            .map(|period| period.top_keys(n))
            .unwrap_or_default()
    }

    /// Finished periods, oldest first.
    pub fn finished(&self) -> &VecDeque<PeriodFigure> {
        &self.finished
    }

    /// The finished period of the last `within_ms` (ended since) with the
    /// largest `admitted / L`; the newest of equals.
    pub fn worst_within(&self, now: Millis, within_ms: Millis) -> Option<&PeriodFigure> {
        self.finished
            .iter()
            .filter(|f| f.end_ms() >= now.saturating_sub(within_ms))
            .max_by(|a, b| {
                a.ratio()
                    .total_cmp(&b.ratio())
                    .then(a.start_ms.cmp(&b.start_ms))
            })
    }

    /// Finished periods of the last `within_ms` above their stated bound.
    pub fn over_bound_within(&self, now: Millis, within_ms: Millis) -> usize {
        self.finished
            .iter()
            .filter(|f| f.end_ms() >= now.saturating_sub(within_ms) && f.over_bound())
            .count()
    }

    fn bytes(&self) -> usize {
        let open: usize = self.open.values().map(OpenPeriod::bytes).sum();
        let finished: usize = self
            .finished
            .iter()
            .map(|f| {
                std::mem::size_of::<PeriodFigure>()
                    + (f.regions.capacity() + f.all_keys_regions.capacity())
                        * std::mem::size_of::<(Arc<str>, u64)>()
                    + f.key.as_ref().map_or(0, |k| k.len() + 16)
            })
            .sum();
        std::mem::size_of::<RuleLedger>() + self.terms.rule.capacity() + open + finished
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::Partition;

    const T0: Millis = 1_700_000_040_000; // a multiple of 2 s and 60 s

    fn rule(id: &str, limit: u64, algorithm: Algorithm, period_ms: u64) -> GlobalRule {
        GlobalRule::new(
            id,
            limit,
            algorithm,
            Accuracy::Exact,
            period_ms,
            Partition::Strict,
            0.5,
        )
    }

    fn counted(rule: &str, key: Option<&str>, start: Millis, admitted: u64) -> PeriodAdmitted {
        PeriodAdmitted {
            rule: rule.into(),
            key: key.map(str::to_string),
            period_start_ms: start,
            admitted,
        }
    }

    /// A sliding-counter rule of 100 per 2 s, reported by two regions.
    fn sliding() -> (Ledger, Vec<GlobalRule>) {
        let rules = vec![rule("api|sw", 100, Algorithm::SlidingWindowCounter, 2_000)];
        (Ledger::default(), rules)
    }

    #[test]
    fn a_repeated_or_late_report_replaces_the_pods_count_and_the_world_sums_pods_and_regions() {
        let (mut ledger, rules) = sliding();
        let at = |ms| T0 + ms;
        let report = |ledger: &mut Ledger, region, pod, key, n, now| {
            ledger.record(
                region,
                pod,
                &[
                    counted("api|sw", None, T0, n),
                    counted("api|sw", Some(key), T0, n),
                ],
                &rules,
                now,
            );
        };
        report(&mut ledger, "east", "e-0", "acme", 10, at(500));
        report(&mut ledger, "east", "e-0", "acme", 30, at(1_000));
        // The same report again (a retry): no change.
        report(&mut ledger, "east", "e-0", "acme", 30, at(1_100));
        report(&mut ledger, "east", "e-1", "acme", 5, at(1_200));
        report(&mut ledger, "west", "w-0", "acme", 40, at(1_500));
        let now = ledger.rule("api|sw").expect("rule").current(at(1_600));
        assert_eq!((now.admitted, now.all_keys, now.pods), (75, 75, 3));
        assert_eq!(now.key.as_deref(), Some("acme"));
        let regions: Vec<(&str, u64)> = now.regions.iter().map(|(r, n)| (&**r, *n)).collect();
        assert_eq!(regions, [("east", 35), ("west", 40)]);
        assert!(!now.complete, "no pod was heard after the period ended");
        // The final counts arrive in the next period's reports; a late one
        // for the period before (already final) is dropped.
        report(&mut ledger, "east", "e-0", "acme", 50, at(2_100));
        report(&mut ledger, "east", "e-1", "acme", 5, at(2_200));
        report(&mut ledger, "west", "w-0", "acme", 45, at(2_300));
        ledger.advance(at(4_000));
        let rule = ledger.rule("api|sw").expect("rule");
        let done = rule.finished().back().expect("finished");
        assert_eq!((done.start_ms, done.admitted, done.bound), (T0, 100, 100));
        assert!(done.complete && !done.over_bound());
        report(&mut ledger, "west", "w-0", "acme", 99, at(4_100));
        assert_eq!(ledger.dropped().late, 2, "two entries of the late report");
        let rule = ledger.rule("api|sw").expect("rule");
        assert_eq!(rule.finished().back().map(|f| f.admitted), Some(100));
    }

    #[test]
    fn the_leader_feeds_its_ledger_from_every_pod_report() {
        use crate::allocation::leader::{Leader, LeaderConfig, PodReport};
        use crate::allocation::{Allocations, Config};
        let (_, rules) = sliding();
        let mut leader = Leader::new(LeaderConfig {
            rebalancer: Config::default(),
            rebalance_interval_ms: 2_000,
            round_lead_ms: 500,
            top_up: true,
        });
        leader.set_rules(None, rules);
        let state = Allocations::default();
        let report = |region: &str, n| PodReport {
            region: region.into(),
            pod: format!("{region}-0"),
            admitted: vec![
                counted("api|sw", None, T0, n),
                counted("api|sw", Some("acme"), T0, n),
            ],
            ..PodReport::default()
        };
        for (region, n, at) in [("east", 30, 900), ("west", 50, 1_000), ("east", 45, 2_100)] {
            leader.ingest(&report(region, n), &state, &[], T0 + at);
        }
        let figure = leader
            .ledger()
            .rule("api|sw")
            .expect("rule")
            .current(T0 + 1_500);
        assert_eq!((figure.admitted, figure.pods), (95, 2));
        leader.ledger_mut().advance(T0 + 4_000);
        let rule = leader.ledger().rule("api|sw").expect("rule");
        assert_eq!(rule.finished().back().map(|f| f.admitted), Some(95));
    }

    #[test]
    fn the_busiest_key_compares_with_l_and_all_keys_are_kept_beside_it() {
        let (mut ledger, rules) = sliding();
        ledger.record(
            "east",
            "e-0",
            &[
                counted("api|sw", None, T0, 150),
                counted("api|sw", Some("acme"), T0, 90),
                counted("api|sw", Some("globex"), T0, 60),
            ],
            &rules,
            T0 + 2_500,
        );
        ledger.record(
            "west",
            "w-0",
            &[
                counted("api|sw", None, T0, 20),
                counted("api|sw", Some("globex"), T0, 20),
            ],
            &rules,
            T0 + 2_500,
        );
        ledger.advance(T0 + 4_000);
        let rule = ledger.rule("api|sw").expect("rule");
        let f = rule.finished().back().expect("finished");
        // acme 90, globex 80: acme is the busiest; all keys 170 > L is no
        // overshoot (each key has its own L).
        assert_eq!(
            (f.key.as_deref(), f.admitted, f.all_keys),
            (Some("acme"), 90, 170)
        );
        assert!(!f.over_bound());
        assert_eq!(rule.over_bound_within(T0 + 4_000, HOUR_MS), 0);
    }

    #[test]
    fn each_algorithm_states_its_bound() {
        let set_terms = |algorithm, burst, slack| {
            let mut t = Terms::of_global_rule(&rule("r", 100, algorithm, 1_000));
            t.algorithm = algorithm;
            t.burst = burst;
            t.per_pod_slack = slack;
            t.assumed = false;
            t
        };
        assert_eq!(set_terms(Algorithm::FixedWindow, 0, None).bound(4), 100);
        assert_eq!(
            set_terms(Algorithm::SlidingWindowLog, 0, None).bound(4),
            100
        );
        assert_eq!(set_terms(Algorithm::TokenBucket, 20, None).bound(4), 120);
        assert_eq!(set_terms(Algorithm::LeakyBucket, 30, None).bound(4), 130);
        // Approximate: + max_batch per pod that reported.
        assert_eq!(set_terms(Algorithm::FixedWindow, 0, Some(5)).bound(4), 120);
        let bucket = set_terms(Algorithm::TokenBucket, 20, None);
        assert!(
            bucket.bound_is().contains("burst + L"),
            "{}",
            bucket.bound_is()
        );
        // Without the rule set, a bucket's burst is assumed to be L.
        let assumed = Terms::of_global_rule(&rule("r", 100, Algorithm::TokenBucket, 1_000));
        assert_eq!(assumed.bound(1), 200);
        assert!(assumed.bound_is().contains("assumed"));
    }

    #[test]
    fn terms_come_from_the_rule_set_with_burst_and_max_batch() {
        let yaml = "domain: api
descriptors:
  - key: tb
    scope: global
    algorithm: token_bucket
    burst: 30
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: ap
    scope: global
    accuracy: approximate
    max_batch: 7
    rate_limit: {unit: minute, requests_per_unit: 1000}
  - key: local
    rate_limit: {unit: minute, requests_per_unit: 5}
";
        let set = RuleSet::parse(&[crate::rules::RuleFile {
            name: "rules.yaml".into(),
            text: yaml.into(),
        }])
        .expect("rules");
        let terms = Terms::of_rule_set(&set);
        let tb = terms.iter().find(|t| t.rule == "api|tb").expect("tb");
        assert_eq!((tb.bound(2), tb.period_ms), (40, 1_000));
        let ap = terms.iter().find(|t| t.rule == "api|ap").expect("ap");
        assert_eq!(ap.bound(3), 1_000 + 3 * 7);
        assert_eq!(terms.len(), 2, "only global rules: {terms:?}");
    }

    #[test]
    fn a_period_in_which_the_limit_was_lowered_is_stated_against_the_higher() {
        let (mut ledger, rules) = sliding();
        let n = |k| [counted("api|sw", Some("acme"), T0, k)];
        let raised = vec![rule("api|sw", 300, Algorithm::SlidingWindowCounter, 2_000)];
        ledger.record("east", "e-0", &n(10), &rules, T0 + 100);
        // Raised to 300 mid-period, 250 admitted, then back to 100.
        ledger.record("east", "e-0", &n(250), &raised, T0 + 900);
        ledger.record("east", "e-0", &n(250), &rules, T0 + 2_100);
        ledger.advance(T0 + 4_000);
        let rule = ledger.rule("api|sw").expect("rule");
        let f = rule.finished().back().expect("finished");
        assert_eq!((f.admitted, f.limit, f.bound), (250, 300, 300));
        assert!(!f.over_bound());
        // The next period is stated against the limit then in force.
        assert_eq!(rule.current(T0 + 4_000).limit, 100);
    }

    #[test]
    fn reports_out_of_line_are_dropped_and_counted() {
        let (mut ledger, rules) = sliding();
        ledger.record(
            "east",
            "e-0",
            &[
                counted("api|other", None, T0, 5),
                counted("api|sw", None, T0 + 1, 5),
                counted("api|sw", None, T0 + 10_000, 5),
                counted("api|sw", None, T0 - 10_000, 5),
            ],
            &rules,
            T0,
        );
        let d = ledger.dropped();
        assert_eq!(
            (d.unknown_rule, d.misaligned, d.future, d.late),
            (1, 1, 1, 1)
        );
        // A rule that leaves the rule set leaves the ledger.
        ledger.record("east", "e-0", &[], &[], T0);
        assert!(ledger.rule("api|sw").is_none());
    }

    #[test]
    fn the_worst_period_of_the_last_hour_and_those_over_their_bound() {
        let (mut ledger, rules) = sliding();
        for (i, n) in [80u64, 120, 95].iter().enumerate() {
            let start = T0 + 2_000 * i as Millis;
            ledger.record(
                "east",
                "e-0",
                &[counted("api|sw", Some("acme"), start, *n)],
                &rules,
                start + 2_100,
            );
        }
        let now = T0 + 10_000;
        ledger.advance(now);
        let rule = ledger.rule("api|sw").expect("rule");
        assert_eq!(rule.finished().len(), 3);
        let worst = rule.worst_within(now, HOUR_MS).expect("worst");
        assert_eq!((worst.start_ms, worst.admitted), (T0 + 2_000, 120));
        assert!((worst.ratio() - 1.2).abs() < 1e-9);
        assert_eq!(rule.over_bound_within(now, HOUR_MS), 1);
        // An hour later they have aged out of the window; the newest two stay.
        let later = now + HOUR_MS + 10_000;
        ledger.advance(later);
        let rule = ledger.rule("api|sw").expect("rule");
        assert_eq!(rule.finished().len(), 2);
        assert!(rule.worst_within(later, HOUR_MS).is_none());
    }

    #[test]
    fn a_flood_of_keys_pods_and_periods_stays_within_the_stated_bytes() {
        let regions = 3;
        let rules = vec![rule(
            "api|sw",
            1_000,
            Algorithm::SlidingWindowCounter,
            1_000,
        )];
        let mut ledger = Ledger::default();
        let long = |prefix: &str, i: usize, len: usize| {
            let mut s = format!("{prefix}-{i}-");
            while s.len() < len {
                s.push('x');
            }
            s
        };
        // 800 one-second periods, each reported by more pods than the bound
        // allows, each pod with more keys than are tracked.
        for period in 0..800i64 {
            let start = T0 + period * 1_000;
            for region in 0..regions {
                for pod in 0..MAX_PODS_PER_REGION + 8 {
                    if period % 100 != 0 && pod > 2 {
                        // Most periods lightly: the flood of pods and keys
                        // in one of a hundred keeps the test quick.
                        continue;
                    }
                    let admitted: Vec<PeriodAdmitted> = (0..20)
                        .map(|k| {
                            let key = long("key", (pod * 20 + k) % 200, KEY_BYTES);
                            counted("api|sw", Some(&key), start, (k + pod) as u64)
                        })
                        .chain([counted("api|sw", None, start, 1)])
                        .collect();
                    ledger.record(
                        &format!("region-{region}"),
                        &long("pod", pod, POD_BYTES),
                        &admitted,
                        &rules,
                        start + 500,
                    );
                }
            }
        }
        let rule = ledger.rule("api|sw").expect("rule");
        assert!(rule.finished().len() <= MAX_FINISHED);
        assert!(rule.open.len() <= OPEN_PERIODS);
        for period in rule.open.values() {
            assert!(period.keys.len() <= MAX_KEYS);
            for pods in period.pods.values() {
                assert!(pods.len() <= MAX_PODS_PER_REGION);
                assert!(pods.values().all(|p| p.keys.len() <= MAX_KEYS));
            }
        }
        let d = ledger.dropped();
        assert!(d.pods > 0 && d.keys > 0, "{d:?}");
        let stated = stated_bytes(1, regions);
        assert!(
            ledger.bytes() <= stated,
            "{} bytes against the stated {stated}",
            ledger.bytes()
        );
        // The figure of a flooded period says it is incomplete.
        let flooded = rule
            .finished()
            .iter()
            .find(|f| f.pods as usize >= regions * MAX_PODS_PER_REGION)
            .expect("a flooded period");
        assert!(!flooded.complete);
        // What the docs state, with 3 regions.
        assert!(
            stated_bytes_per_rule(3) < 4 << 20,
            "{}",
            stated_bytes_per_rule(3)
        );
    }

    #[test]
    fn a_new_key_busier_than_the_least_tracked_takes_its_slot() {
        let (mut ledger, rules) = sliding();
        let keys: Vec<PeriodAdmitted> = (0..MAX_KEYS)
            .map(|k| counted("api|sw", Some(&format!("k{k}")), T0, 10 + k as u64))
            .collect();
        ledger.record("east", "e-0", &keys, &rules, T0 + 100);
        ledger.record(
            "east",
            "e-1",
            &[
                counted("api|sw", Some("quiet"), T0, 1),
                counted("api|sw", Some("hot"), T0, 500),
            ],
            &rules,
            T0 + 200,
        );
        let rule = ledger.rule("api|sw").expect("rule");
        let top = rule.top_keys(T0 + 300, 2);
        assert_eq!(top[0], (Arc::from("hot"), 500));
        assert_eq!(ledger.dropped().keys, 1, "quiet is not tracked");
        let f = rule.current(T0 + 300);
        assert_eq!((f.keys as usize, f.admitted), (MAX_KEYS, 500));
    }
}
