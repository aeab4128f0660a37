//! Demand: what regions ask for, smoothed; and which epoch each pod holds.
//!
//! [`DemandTracker`] lives in the leader's memory (and the simulator's). It
//! holds an EWMA per (rule, region) and per (rule, key, region) for every key
//! reported, compactly enough for a million keys; the smoothed values the
//! rebalancer used are committed with each epoch, and a new leader
//! [`seed`s](DemandTracker::seed) from them instead of learning again.

use std::collections::HashMap;

use super::{Allocations, Epoch, Millis, TOP_UP_JUMP};

/// One report line: demand for a key (or the rest of a rule) over an interval.
#[derive(Debug, Clone, PartialEq)]
pub struct KeyDemand {
    pub key: String,
    /// Hits asked for: allowed + denied.
    pub asked: u64,
    pub allowed: u64,
}

/// Keeps the `top_n` keys with the most hits asked and folds the rest into
/// one remainder (asked, allowed), so a flood of distinct keys cannot make a
/// report grow. Ties go to the smaller key, for determinism.
pub fn bound_report(mut keys: Vec<KeyDemand>, top_n: usize) -> (Vec<KeyDemand>, u64, u64) {
    if keys.len() <= top_n {
        keys.sort_by(|a, b| b.asked.cmp(&a.asked).then_with(|| a.key.cmp(&b.key)));
        return (keys, 0, 0);
    }
    keys.select_nth_unstable_by(top_n, |a, b| {
        b.asked.cmp(&a.asked).then_with(|| a.key.cmp(&b.key))
    });
    let rest = keys.split_off(top_n);
    keys.sort_by(|a, b| b.asked.cmp(&a.asked).then_with(|| a.key.cmp(&b.key)));
    let asked = rest.iter().map(|k| k.asked).sum();
    let allowed = rest.iter().map(|k| k.allowed).sum();
    (keys, asked, allowed)
}

/// Smoothed demand in hits per rule period.
#[derive(Debug, Default)]
pub struct DemandTracker {
    alpha: f64,
    regions: Vec<String>,
    rules: HashMap<String, RuleDemand>,
}

#[derive(Debug, Default)]
struct RuleDemand {
    period_ms: u64,
    /// Per region index.
    total: Vec<Sample>,
    /// Per key: `[ewma; R]` then `[pending; R]`, f32 to keep a key small.
    keys: HashMap<Box<str>, Box<[f32]>>,
}

#[derive(Debug, Default, Clone, Copy)]
struct Sample {
    ewma: f64,
    pending: f64,
    seen: bool,
}

impl DemandTracker {
    pub fn new(alpha: f64) -> Self {
        DemandTracker {
            alpha: alpha.clamp(0.01, 1.0),
            ..Default::default()
        }
    }

    fn region_index(&mut self, region: &str) -> usize {
        match self.regions.iter().position(|r| r == region) {
            Some(i) => i,
            None => {
                self.regions.push(region.to_string());
                self.regions.len() - 1
            }
        }
    }

    /// Adds a pod's report for one rule: its keys and the remainder.
    pub fn record(
        &mut self,
        region: &str,
        rule: &str,
        period_ms: u64,
        keys: &[KeyDemand],
        remainder_asked: u64,
    ) {
        let r = self.region_index(region);
        let entry = self.rules.entry(rule.to_string()).or_default();
        entry.period_ms = period_ms.max(1);
        if entry.total.len() <= r {
            entry.total.resize(r + 1, Sample::default());
        }
        let total: u64 = keys.iter().map(|k| k.asked).sum::<u64>() + remainder_asked;
        entry.total[r].pending += total as f64;
        for k in keys {
            let slots = entry
                .keys
                .entry(k.key.as_str().into())
                .or_insert_with(|| vec![0.0; 2 * (r + 1)].into_boxed_slice());
            if slots.len() < 2 * (r + 1) {
                *slots = widen(slots, r + 1);
            }
            let half = slots.len() / 2;
            slots[half + r] += k.asked as f32;
        }
    }

    /// Ends a sampling interval of `elapsed_ms`: pending hits become a rate
    /// per period and enter the EWMA; keys that faded to nothing are dropped.
    pub fn roll(&mut self, elapsed_ms: u64) {
        let alpha = self.alpha;
        let elapsed = elapsed_ms.max(1) as f64;
        for rule in self.rules.values_mut() {
            let per_period = rule.period_ms as f64 / elapsed;
            for s in &mut rule.total {
                let rate = s.pending * per_period;
                s.ewma = if s.seen {
                    smooth(alpha, rate, s.ewma)
                } else {
                    rate
                };
                s.seen = true;
                s.pending = 0.0;
            }
            rule.keys.retain(|_, slots| {
                let half = slots.len() / 2;
                let mut alive = false;
                for i in 0..half {
                    let rate = slots[half + i] as f64 * per_period;
                    let e = smooth(alpha, rate, slots[i] as f64);
                    slots[i] = e as f32;
                    slots[half + i] = 0.0;
                    alive |= e >= 0.5;
                }
                alive
            });
        }
    }

    /// Early top-up: a region reports mid-window that `key` runs at
    /// `per_period` hits per period (the region's pace: a pod's pace times
    /// [`AckTracker::live_pods`]). If that is clearly above the key's
    /// smoothed demand there ([`TOP_UP_JUMP`]), the demand (and the rule's)
    /// is raised to it at once, so the next round — run out of cycle — acts
    /// on it instead of waiting for the EWMA. Returns whether it raised.
    ///
    /// A pace is a noisy sample, and every contended key asks for top-ups
    /// each window: raising to any sample above the average would ratchet
    /// demand up to the noisiest sample and hand capacity to regions that do
    /// not use it (the simulator measured ~2 % of L lost that way).
    pub fn bump(
        &mut self,
        region: &str,
        rule: &str,
        period_ms: u64,
        key: &str,
        per_period: f64,
    ) -> bool {
        let r = self.region_index(region);
        let entry = self.rules.entry(rule.to_string()).or_default();
        entry.period_ms = period_ms.max(1);
        if entry.total.len() <= r {
            entry.total.resize(r + 1, Sample::default());
        }
        let slots = entry
            .keys
            .entry(key.into())
            .or_insert_with(|| vec![0.0; 2 * (r + 1)].into_boxed_slice());
        if slots.len() < 2 * (r + 1) {
            *slots = widen(slots, r + 1);
        }
        let current = slots[r] as f64;
        if per_period <= current * TOP_UP_JUMP {
            return false;
        }
        let raise = per_period - current;
        slots[r] += raise as f32;
        let total = &mut entry.total[r];
        total.ewma += raise;
        total.seen = true;
        true
    }

    /// Forgets rules that are no longer global.
    pub fn retain_rules(&mut self, keep: impl Fn(&str) -> bool) {
        self.rules.retain(|id, _| keep(id));
    }

    /// Starts from the demand committed with the last epoch.
    pub fn seed(&mut self, state: &Allocations) {
        for (id, rule) in &state.rules {
            for (region, d) in &rule.demand {
                let r = self.region_index(region);
                let entry = self.rules.entry(id.clone()).or_default();
                if entry.total.len() <= r {
                    entry.total.resize(r + 1, Sample::default());
                }
                entry.total[r] = Sample {
                    ewma: *d,
                    pending: 0.0,
                    seen: true,
                };
            }
            for (key, entry) in &rule.keys {
                for (region, d) in &entry.demand {
                    let r = self.region_index(region);
                    let rd = self.rules.entry(id.clone()).or_default();
                    let slots = rd
                        .keys
                        .entry(key.as_str().into())
                        .or_insert_with(|| vec![0.0; 2 * (r + 1)].into_boxed_slice());
                    if slots.len() < 2 * (r + 1) {
                        *slots = widen(slots, r + 1);
                    }
                    slots[r] = *d as f32;
                }
            }
        }
    }

    /// Smoothed demand of the whole rule, per region in `names` order.
    pub fn rule_totals(&self, rule: &str, names: &[&str], out: &mut Vec<f64>) {
        out.clear();
        let entry = self.rules.get(rule);
        out.extend(names.iter().map(|n| {
            let Some(i) = self.regions.iter().position(|r| r == n) else {
                return 0.0;
            };
            entry.and_then(|e| e.total.get(i)).map_or(0.0, |s| s.ewma)
        }));
    }

    /// Calls `f(key, demand per region in names order)` for every tracked key.
    pub fn for_each_key(&self, rule: &str, names: &[&str], f: &mut dyn FnMut(&str, &[f64])) {
        let Some(entry) = self.rules.get(rule) else {
            return;
        };
        let index: Vec<Option<usize>> = names
            .iter()
            .map(|n| self.regions.iter().position(|r| r == n))
            .collect();
        let mut buf = vec![0.0; names.len()];
        for (key, slots) in &entry.keys {
            let half = slots.len() / 2;
            for (b, i) in buf.iter_mut().zip(&index) {
                *b = match i {
                    Some(i) if *i < half => slots[*i] as f64,
                    _ => 0.0,
                };
            }
            f(key, &buf);
        }
    }

    /// Keys tracked for a rule.
    pub fn key_count(&self, rule: &str) -> usize {
        self.rules.get(rule).map_or(0, |e| e.keys.len())
    }
}

/// The EWMA step, except that a step change — the new rate at least twice or
/// at most half the average, by more than noise (10 hits per period) — is
/// followed at once: a regional shift is then acted on in one round instead
/// of several (the simulator measured 300 s to catch up with plain EWMA).
fn smooth(alpha: f64, rate: f64, ewma: f64) -> f64 {
    let step = (rate - ewma).abs() > 10.0 && (rate >= 2.0 * ewma || rate * 2.0 <= ewma);
    if step {
        rate
    } else {
        alpha * rate + (1.0 - alpha) * ewma
    }
}

fn widen(slots: &[f32], regions: usize) -> Box<[f32]> {
    let half = slots.len() / 2;
    let mut wide = vec![0.0; 2 * regions];
    wide[..half].copy_from_slice(&slots[..half]);
    wide[regions..regions + half].copy_from_slice(&slots[half..]);
    wide.into_boxed_slice()
}

/// Which epoch each pod holds, from its reports and acknowledgements.
#[derive(Debug, Default)]
pub struct AckTracker {
    pods: HashMap<String, PodAck>,
}

#[derive(Debug, Clone)]
struct PodAck {
    region: String,
    epoch: Epoch,
    at_ms: Millis,
}

impl AckTracker {
    pub fn record(&mut self, pod: &str, region: &str, epoch: Epoch, now_ms: Millis) {
        let entry = self.pods.entry(pod.to_string()).or_insert(PodAck {
            region: region.to_string(),
            epoch,
            at_ms: now_ms,
        });
        entry.region = region.to_string();
        entry.epoch = epoch;
        entry.at_ms = entry.at_ms.max(now_ms);
    }

    /// The region's acknowledged epoch — the oldest held by any pod heard
    /// within `window_ms` — and when it was last heard. Pods silent for
    /// longer do not hold the region back (their lease covers them).
    pub fn region(
        &self,
        region: &str,
        now_ms: Millis,
        window_ms: i64,
    ) -> (Option<Epoch>, Option<Millis>) {
        let mut acked: Option<Epoch> = None;
        let mut heard: Option<Millis> = None;
        for pod in self.pods.values().filter(|p| p.region == region) {
            heard = Some(heard.map_or(pod.at_ms, |h| h.max(pod.at_ms)));
            if pod.at_ms >= now_ms - window_ms {
                acked = Some(acked.map_or(pod.epoch, |a| a.min(pod.epoch)));
            }
        }
        (acked, heard)
    }

    /// Pods of `region` heard within `window_ms` (at least 1): a pod's pace
    /// times this is the region's, as a load balancer spreads a key's
    /// traffic over a region's pods.
    pub fn live_pods(&self, region: &str, now_ms: Millis, window_ms: i64) -> usize {
        self.pods
            .values()
            .filter(|p| p.region == region && p.at_ms >= now_ms - window_ms)
            .count()
            .max(1)
    }

    /// Drops pods silent for longer than `window_ms`.
    pub fn forget_before(&mut self, cutoff_ms: Millis) {
        self.pods.retain(|_, p| p.at_ms >= cutoff_ms);
    }

    /// Pods per region with the epoch each holds (admin API).
    pub fn pods(&self) -> Vec<(String, String, Epoch, Millis)> {
        let mut out: Vec<_> = self
            .pods
            .iter()
            .map(|(pod, p)| (p.region.clone(), pod.clone(), p.epoch, p.at_ms))
            .collect();
        out.sort();
        out
    }
}
