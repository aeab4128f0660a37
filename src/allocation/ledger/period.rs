//! One open period of one rule: every pod's latest counts, by region, of
//! the whole rule and of at most [`MAX_KEYS`] tracked keys (the busiest),
//! summed as they are replaced.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::figure::{KeyFigure, PeriodFigure, RegionKeyCount};
use super::terms::Terms;
use super::{MAX_KEYS, MAX_PODS_PER_REGION};
use crate::allocation::Millis;

/// One pod's count of one tracked key.
#[derive(Debug, Clone, Copy)]
pub(super) struct KeyCount {
    pub(super) slot: u8,
    /// The slot's generation the count belongs to: a slot given to another
    /// key gets a new generation, which makes every pod's count of the old
    /// key stale at once (no scan of the pods).
    pub(super) generation: u32,
    pub(super) count: u64,
}

/// One pod's latest counts in one open period.
#[derive(Debug, Default)]
pub(super) struct PodCounts {
    /// The whole rule (`key: None`).
    pub(super) all: u64,
    /// At most one per slot, so at most [`MAX_KEYS`].
    pub(super) keys: Vec<KeyCount>,
    /// Heard after the period ended: these counts are final.
    pub(super) settled: bool,
    /// When the leader last took a count of this pod for the period (its
    /// clock, Unix ms): how old the pod's counts are.
    pub(super) heard_ms: Millis,
}

impl PodCounts {
    /// The pod's count of the key now in `slot`.
    pub(super) fn of(&self, slot: usize, generation: u32) -> u64 {
        self.keys
            .iter()
            .find(|k| usize::from(k.slot) == slot && k.generation == generation)
            .map_or(0, |k| k.count)
    }
}

/// A tracked key.
#[derive(Debug)]
pub(super) struct Tracked {
    pub(super) key: Arc<str>,
    pub(super) generation: u32,
    /// The sum of every pod's latest count.
    pub(super) total: u64,
}

/// A period still taking reports.
#[derive(Debug)]
pub(super) struct OpenPeriod {
    /// Tracked keys by slot, at most [`MAX_KEYS`].
    pub(super) keys: Vec<Tracked>,
    /// Generations given so far (a slot's next is this + 1).
    pub(super) generations: u32,
    /// The sum of every pod's latest whole-rule count.
    pub(super) all_total: u64,
    /// Per region, per pod: its latest counts (at most
    /// [`MAX_PODS_PER_REGION`] pods a region).
    pub(super) pods: BTreeMap<Arc<str>, BTreeMap<Box<str>, PodCounts>>,
    /// Reports of pods beyond the bound were refused in this period.
    pub(super) refused: bool,
    /// The terms with the widest bound in force while the period was open:
    /// hits admitted under a limit that was lowered within the period were
    /// within their bound when admitted.
    pub(super) terms: Terms,
}

impl OpenPeriod {
    pub(super) fn new(terms: &Terms) -> OpenPeriod {
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
    pub(super) fn slot(&mut self, key: &str, count: u64) -> Option<usize> {
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

    pub(super) fn pod_count(&self) -> usize {
        self.pods.values().map(BTreeMap::len).sum()
    }

    /// The busiest tracked key's slot.
    pub(super) fn busiest(&self) -> Option<usize> {
        self.keys
            .iter()
            .enumerate()
            .max_by_key(|(i, k)| (k.total, std::cmp::Reverse(*i)))
            .map(|(i, _)| i)
    }

    pub(super) fn figure(&self, start_ms: Millis) -> PeriodFigure {
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
    pub(super) fn top_keys(&self, n: usize) -> Vec<(Arc<str>, u64)> {
        let mut keys: Vec<(Arc<str>, u64)> = self
            .keys
            .iter()
            .map(|k| (Arc::clone(&k.key), k.total))
            .collect();
        keys.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        keys.truncate(n);
        keys
    }

    /// One key's counts, world-wide and per region, with how old each
    /// region's pods' counts are; every region that reported the period
    /// is listed, with `admitted: None` when the key is not tracked.
    pub(super) fn key_figure(&self, start_ms: Millis, key: &str) -> KeyFigure {
        let tracked = self
            .keys
            .iter()
            .enumerate()
            .find(|(_, k)| &*k.key == key)
            .map(|(slot, k)| (slot, k.generation, k.total));
        let regions = self
            .pods
            .iter()
            .map(|(region, pods)| {
                let mut out = RegionKeyCount {
                    region: Arc::clone(region),
                    admitted: tracked.map(|_| 0),
                    pods: u32::try_from(pods.len()).unwrap_or(u32::MAX),
                    pods_with_key: 0,
                    newest_report_ms: Millis::MIN,
                    oldest_report_ms: Millis::MAX,
                };
                for p in pods.values() {
                    out.newest_report_ms = out.newest_report_ms.max(p.heard_ms);
                    out.oldest_report_ms = out.oldest_report_ms.min(p.heard_ms);
                    if let Some((slot, generation, _)) = tracked
                        && let Some(k) = p
                            .keys
                            .iter()
                            .find(|k| usize::from(k.slot) == slot && k.generation == generation)
                    {
                        out.pods_with_key += 1;
                        out.admitted = out.admitted.map(|n| n.saturating_add(k.count));
                    }
                }
                out
            })
            .collect();
        KeyFigure {
            start_ms,
            period_ms: self.terms.period_ms,
            limit: self.terms.limit,
            admitted: tracked.map(|(_, _, total)| total),
            regions,
        }
    }

    /// Takes one pod's count (`slot`: of a tracked key, else the whole
    /// rule's), replacing the pod's previous one; `now` is when it was
    /// taken.
    pub(super) fn take(
        &mut self,
        counts_at: (&Arc<str>, &str),
        slot: Option<usize>,
        count: u64,
        settled: bool,
        now: Millis,
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
        counts.heard_ms = counts.heard_ms.max(now);
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
    pub(super) fn admit(&mut self, region: &Arc<str>, pod: &str) -> bool {
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

    pub(super) fn bytes(&self) -> usize {
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
