//! The dashboard's memory: for every global rule and every key with an
//! allocation entry of its own, each region's grant and demand at each
//! sampled epoch, and the hits its pods reported (on the leader).
//!
//! Pure: [`History::record`] takes the applied allocations and the hits
//! counted so far; `cockpit::live` calls it as epochs are applied. Grants
//! and demand come from the replicated state, so every node records the same
//! values for the same epoch; hits are counted only where reports arrive (the
//! leader), so elsewhere they are `None`.
//!
//! Admitted per period here ([`Series::use_per_period`]) is over the rolling
//! period before each sample, all keys together: what a region used of its
//! grant. The world-wide figure per clock-aligned period, against `L` and
//! the stated bound for every algorithm, is the leader's world ledger
//! (`allocation::ledger`), which `GET /api/v1/history` serves beside these
//! samples (`world_periods`).
//!
//! Bounds: `capacity` samples per series (oldest dropped first), one series
//! per global rule (operators set those) and per key entry, at most
//! [`MAX_KEY_SERIES`] per rule. A sample holds one [`Point`] per region:
//! [`History::bytes`] states the memory, and the flood test holds it.

use std::collections::{BTreeMap, VecDeque};

use serde::Serialize;

use crate::allocation::{Allocations, Shares};
use crate::coordinator::hits::{Hits, PerRegion};

/// Samples kept per series by default: 24 h at the default rebalance
/// interval of 60 s.
pub const DEFAULT_SAMPLES: usize = 1_440;

/// Key series kept per rule at most; key entries beyond (the rebalancer's
/// `max_key_entries` may allow more) are served by the rule's series only.
pub const MAX_KEY_SERIES: usize = 100;

/// One region at one sample.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Point {
    /// What the region was granted (the allocation it enforces).
    pub granted: u64,
    /// Its smoothed demand, hits per rule period.
    pub demand: f64,
    /// Hits its pods reported since this node started leading, asked and
    /// allowed (cumulative); `None` where reports do not arrive.
    pub hits: Option<Hits>,
}

/// One sampled epoch of a series.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Sample {
    pub epoch: u64,
    /// When the leader computed the epoch.
    pub at_unix_ms: i64,
    /// The world-wide limit then.
    pub limit: u64,
    /// Aligned with [`Series::regions`]; `None`: the region had no slot then.
    pub points: Vec<Option<Point>>,
}

/// Hits in one period per region, aligned with [`Series::regions`].
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct PeriodUse {
    pub allowed: Vec<u64>,
    pub rejected: Vec<u64>,
}

/// The samples of one rule's split or of one key entry.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Series {
    /// Every region that has had a point, in the order first seen.
    pub regions: Vec<String>,
    pub samples: VecDeque<Sample>,
}

impl Series {
    fn push(
        &mut self,
        sample: (u64, i64, u64),
        shares: &Shares,
        demand: &BTreeMap<String, f64>,
        hits: Option<&PerRegion>,
        capacity: usize,
    ) {
        let (epoch, at_unix_ms, limit) = sample;
        if self.samples.back().is_some_and(|s| s.epoch >= epoch) {
            return;
        }
        for region in shares.keys().chain(demand.keys()) {
            if !self.regions.contains(region) {
                self.regions.push(region.clone());
            }
        }
        let points = self
            .regions
            .iter()
            .map(|region| {
                let slot = shares.get(region)?;
                Some(Point {
                    granted: slot.granted,
                    demand: demand.get(region).copied().unwrap_or(0.0),
                    hits: hits.map(|h| h.get(region).copied().unwrap_or_default()),
                })
            })
            .collect();
        self.samples.push_back(Sample {
            epoch,
            at_unix_ms,
            limit,
            points,
        });
        while self.samples.len() > capacity {
            self.samples.pop_front();
        }
    }

    /// Each region's hits admitted and rejected in the `period_ms` before
    /// each sample, from the cumulative counts: `None` where the sample or
    /// the newest one a period before it has no counts, or the counts
    /// restarted in between (a new leader counts from zero).
    pub fn use_per_period(&self, period_ms: u64) -> Vec<Option<PeriodUse>> {
        let period = i64::try_from(period_ms).unwrap_or(i64::MAX);
        let counts = |s: &Sample, r: usize| -> Option<Hits> {
            match s.points.get(r) {
                Some(Some(p)) => p.hits,
                // No slot then: nothing counted for it, but counted.
                _ => s
                    .points
                    .iter()
                    .flatten()
                    .next()?
                    .hits
                    .map(|_| Hits::default()),
            }
        };
        let mut start = 0;
        self.samples
            .iter()
            .map(|now| {
                let from = now.at_unix_ms.saturating_sub(period);
                // The newest sample at or before the period's start.
                while start + 1 < self.samples.len() && self.samples[start + 1].at_unix_ms <= from {
                    start += 1;
                }
                let before = self.samples.get(start).filter(|b| b.at_unix_ms <= from)?;
                let mut used = PeriodUse::default();
                for r in 0..self.regions.len() {
                    let (a, b) = (counts(now, r)?, counts(before, r)?);
                    let allowed = a.allowed.checked_sub(b.allowed)?;
                    let asked = a.asked.checked_sub(b.asked)?;
                    used.allowed.push(allowed);
                    used.rejected.push(asked.saturating_sub(allowed));
                }
                Some(used)
            })
            .collect()
    }

    fn bytes(&self) -> usize {
        let names: usize = self.regions.iter().map(|r| r.capacity() + 24).sum();
        let points: usize = self
            .samples
            .iter()
            .map(|s| {
                std::mem::size_of::<Sample>()
                    + s.points.capacity() * std::mem::size_of::<Option<Point>>()
            })
            .sum();
        names + points
    }
}

/// One global rule's series: its split and its key entries.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct RuleHistory {
    pub split: Series,
    pub keys: BTreeMap<String, Series>,
}

/// Every global rule's history on this node.
#[derive(Debug, Clone)]
pub struct History {
    capacity: usize,
    rules: BTreeMap<String, RuleHistory>,
}

/// What [`History::record`] reads the hits from (the allocator's counts on
/// the leader; nothing elsewhere).
pub trait HitsSource {
    /// The rule's hits per region, or `None` where none are counted.
    fn rule(&self, rule: &str) -> Option<PerRegion>;
    /// The key's hits per region, or `None` where none are counted.
    fn key(&self, rule: &str, key: &str) -> Option<PerRegion>;
}

/// No hits: a node that does not lead.
pub struct NoHits;

impl HitsSource for NoHits {
    fn rule(&self, _: &str) -> Option<PerRegion> {
        None
    }
    fn key(&self, _: &str, _: &str) -> Option<PerRegion> {
        None
    }
}

impl History {
    /// An empty history keeping `capacity` samples per series (at least 2,
    /// so a period's use can be told).
    pub fn new(capacity: usize) -> History {
        History {
            capacity: capacity.max(2),
            rules: BTreeMap::new(),
        }
    }

    /// Samples `allocations` at its epoch (once per epoch: a repeat is
    /// ignored). Rules and key entries gone from it lose their series.
    pub fn record(&mut self, allocations: &Allocations, hits: &dyn HitsSource) {
        self.rules
            .retain(|rule, _| allocations.rules.contains_key(rule));
        for (id, rule) in &allocations.rules {
            let history = self.rules.entry(id.clone()).or_default();
            let at = (allocations.epoch, allocations.at_ms, rule.limit);
            let rule_hits = hits.rule(id);
            history.split.push(
                at,
                &rule.split,
                &rule.demand,
                rule_hits.as_ref(),
                self.capacity,
            );
            history.keys.retain(|key, _| rule.keys.contains_key(key));
            // The keys with the most demand get a series when there are
            // more entries than series.
            let mut keys: Vec<(&String, f64)> = rule
                .keys
                .iter()
                .map(|(k, e)| (k, e.demand.values().sum::<f64>()))
                .collect();
            keys.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(b.0)));
            for (key, _) in keys.into_iter().take(MAX_KEY_SERIES) {
                if !history.keys.contains_key(key) && history.keys.len() >= MAX_KEY_SERIES {
                    continue;
                }
                let entry = &rule.keys[key];
                let key_hits = hits.key(id, key);
                history.keys.entry(key.clone()).or_default().push(
                    at,
                    &entry.shares,
                    &entry.demand,
                    key_hits.as_ref(),
                    self.capacity,
                );
            }
        }
    }

    /// A rule's history.
    pub fn rule(&self, rule: &str) -> Option<&RuleHistory> {
        self.rules.get(rule)
    }

    /// Samples kept per series.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Memory the samples take, in bytes (the region names, samples and
    /// points; not the maps' own nodes).
    pub fn bytes(&self) -> usize {
        self.rules
            .values()
            .map(|r| r.split.bytes() + r.keys.values().map(Series::bytes).sum::<usize>())
            .sum()
    }

    /// Series held, over all rules and keys.
    pub fn series(&self) -> usize {
        self.rules.values().map(|r| 1 + r.keys.len()).sum()
    }
}

/// Bytes one sample of a series with `regions` regions takes: what the
/// memory per rule and per key in the docs is computed from.
#[cfg(test)]
fn bytes_per_sample(regions: usize) -> usize {
    std::mem::size_of::<Sample>() + regions * std::mem::size_of::<Option<Point>>()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::allocation::{KeyAllocation, RuleAllocation, Slot};

    fn slot(granted: u64) -> Slot {
        Slot {
            granted,
            bound: granted,
            target: granted,
            ..Slot::default()
        }
    }

    fn allocations(epoch: u64, keys: usize) -> Allocations {
        let mut a = Allocations {
            epoch,
            at_ms: epoch as i64 * 1_000,
            ..Allocations::default()
        };
        let mut rule = RuleAllocation {
            limit: 1_000,
            ..RuleAllocation::default()
        };
        rule.split.insert("mumbai".into(), slot(600 + epoch));
        rule.split.insert("hyderabad".into(), slot(400 - epoch));
        rule.demand.insert("mumbai".into(), 550.0);
        for k in 0..keys {
            let mut entry = KeyAllocation::default();
            entry.shares.insert("mumbai".into(), slot(10));
            entry.demand.insert("mumbai".into(), k as f64);
            rule.keys.insert(format!("key-{k}"), entry);
        }
        a.rules.insert("api|fw".into(), rule);
        a
    }

    struct Counted(u64);
    impl HitsSource for Counted {
        fn rule(&self, _: &str) -> Option<PerRegion> {
            let mut m = PerRegion::new();
            m.insert(
                "mumbai".into(),
                Hits {
                    asked: self.0 * 2,
                    allowed: self.0,
                },
            );
            Some(m)
        }
        fn key(&self, _: &str, _: &str) -> Option<PerRegion> {
            None
        }
    }

    #[test]
    fn each_epoch_is_sampled_once_and_the_oldest_go_first() {
        let mut h = History::new(10);
        for epoch in 1..=25 {
            h.record(&allocations(epoch, 0), &NoHits);
            h.record(&allocations(epoch, 0), &NoHits);
        }
        let split = &h.rule("api|fw").expect("rule").split;
        assert_eq!(split.samples.len(), 10);
        assert_eq!(split.samples.front().map(|s| s.epoch), Some(16));
        assert_eq!(split.regions, ["hyderabad", "mumbai"]);
        let last = split.samples.back().expect("sample");
        assert_eq!(last.points[1].map(|p| p.granted), Some(625));
        assert_eq!(last.points[0].map(|p| p.demand), Some(0.0));
        assert_eq!(last.points[1].and_then(|p| p.hits), None);
    }

    #[test]
    fn a_key_flood_keeps_at_most_the_series_bound_and_memory_is_as_stated() {
        let mut h = History::new(100);
        for epoch in 1..=100 {
            h.record(&allocations(epoch, 5 * MAX_KEY_SERIES), &NoHits);
        }
        assert_eq!(h.series(), 1 + MAX_KEY_SERIES);
        // The keys with the most demand have the series.
        let keys = &h.rule("api|fw").expect("rule").keys;
        assert!(keys.contains_key(&format!("key-{}", 5 * MAX_KEY_SERIES - 1)));
        assert!(!keys.contains_key("key-0"));
        // The split has 2 regions, each key 1: the stated per-sample sizes,
        // plus the region names.
        // What --history-samples' help states.
        assert_eq!(bytes_per_sample(3), 48 + 40 * 3);
        let stated = 100 * (bytes_per_sample(2) + MAX_KEY_SERIES * bytes_per_sample(1));
        let names = (2 + MAX_KEY_SERIES) * 64;
        assert!(
            h.bytes() >= stated && h.bytes() <= stated + names,
            "{} vs {stated}",
            h.bytes()
        );
        // Entries that go away take their series with them.
        h.record(&allocations(101, 3), &NoHits);
        assert_eq!(h.series(), 1 + 3);
        h.record(
            &Allocations {
                epoch: 102,
                ..Allocations::default()
            },
            &NoHits,
        );
        assert_eq!(h.series(), 0);
    }

    #[test]
    fn use_per_period_comes_from_the_cumulative_counts_and_a_restart_is_unknown() {
        let mut h = History::new(100);
        // 100 allowed per second (a sample each second), then the counts
        // restart (a new leader), then none are counted (a follower).
        for epoch in 1..=10 {
            h.record(&allocations(epoch, 0), &Counted(epoch * 100));
        }
        for epoch in 11..=13 {
            h.record(&allocations(epoch, 0), &Counted((epoch - 10) * 100));
        }
        h.record(&allocations(14, 0), &NoHits);
        let split = &h.rule("api|fw").expect("rule").split;
        assert_eq!(split.regions, ["hyderabad", "mumbai"]);
        let used = split.use_per_period(3_000);
        assert_eq!(&used[..3], &[None, None, None], "no sample a period before");
        let three_seconds = PeriodUse {
            allowed: vec![0, 300],
            rejected: vec![0, 300],
        };
        assert_eq!(used[3].as_ref(), Some(&three_seconds));
        assert_eq!(used[9].as_ref(), Some(&three_seconds));
        assert_eq!(used[10], None, "the counts restarted");
        assert_eq!(used[13], None, "not counted here");
    }
}
