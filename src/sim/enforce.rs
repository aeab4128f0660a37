//! One region's counters — the simulated Redis — decided by the real
//! algorithm state machines (`crate::algorithm`), with the allocation passed
//! as the limit exactly as the limiter passes it to its Lua script.
//!
//! Pods share their region's counters, so a key's count is one number per
//! region even while its pods enforce different epochs.

use std::collections::HashMap;

use crate::algorithm::{Algorithm, KeyState, Micros, Params};

use super::scenario::RuleSpec;

/// Counters of one region (or of the ideal global counter), by customer.
pub struct Counters {
    algorithm: Algorithm,
    keys: Vec<Option<KeyState>>,
}

impl Counters {
    pub fn new(algorithm: Algorithm, customers: usize) -> Counters {
        Counters {
            algorithm,
            keys: vec![None; customers],
        }
    }

    /// Asks for `hits` of `key` at `now` under `params` (`None`: an
    /// allocation of 0, which admits nothing). Returns (admitted, remaining).
    ///
    /// The hits arrive together, so admitting as many as fit equals deciding
    /// them one by one: a peek says how many fit, one check takes them.
    pub fn admit(
        &mut self,
        key: u32,
        hits: u64,
        params: Option<&Params>,
        now: Micros,
    ) -> (u64, u64) {
        let Some(params) = params else {
            return (0, 0);
        };
        let algorithm = self.algorithm;
        let counter = self.keys[key as usize].get_or_insert_with(|| KeyState::fresh(algorithm));
        let decide = |counter: &mut KeyState, cost: u64| counter.decide(now, cost, params).decision;
        let room = decide(counter, 0).remaining;
        let take = hits.min(room);
        if take == 0 {
            return (0, room);
        }
        let d = decide(counter, take);
        debug_assert!(d.allowed, "a peek said {take} fit");
        if d.allowed {
            (take, d.remaining)
        } else {
            (0, 0)
        }
    }
}

impl Counters {
    /// `key`'s state (fresh if never checked), for a decision of one call
    /// or a settlement (`sim::cost`).
    pub fn state(&mut self, key: u32) -> &mut KeyState {
        let algorithm = self.algorithm;
        self.keys[key as usize].get_or_insert_with(|| KeyState::fresh(algorithm))
    }
}

/// Parameters per allocation value, built once each.
pub struct ParamsCache {
    rule: RuleSpec,
    cache: HashMap<u64, Option<Params>>,
}

impl ParamsCache {
    pub fn new(rule: &RuleSpec) -> ParamsCache {
        ParamsCache {
            rule: rule.clone(),
            cache: HashMap::new(),
        }
    }

    pub fn get(&mut self, allocation: u64) -> Option<&Params> {
        if self.cache.len() > 100_000 {
            // Proportional share mints a value per key per interval.
            self.cache.clear();
        }
        let rule = &self.rule;
        self.cache
            .entry(allocation)
            .or_insert_with(|| rule.params(allocation))
            .as_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::Partition;

    fn rule(algorithm: Algorithm) -> RuleSpec {
        RuleSpec {
            algorithm,
            limit: 1000,
            period_ms: 1000,
            burst: algorithm.has_burst().then_some(1000),
            partition: Partition::Strict,
            fallback: 0.5,
            fallback_hold_ms: crate::allocation::DEFAULT_FALLBACK_HOLD_MS,
        }
    }

    #[test]
    fn admits_what_fits_of_a_batch() {
        let mut p = ParamsCache::new(&rule(Algorithm::FixedWindow));
        let mut c = Counters::new(Algorithm::FixedWindow, 1);
        let t = 1_700_006_400_000_000;
        assert_eq!(c.admit(0, 70, p.get(100), t), (70, 30));
        assert_eq!(c.admit(0, 70, p.get(100), t + 1), (30, 0));
        assert_eq!(c.admit(0, 70, p.get(0), t + 2), (0, 0));
        assert_eq!(c.admit(0, 70, p.get(100), t + 1_000_000).0, 70);
    }

    #[test]
    fn a_bucket_shrinking_keeps_no_more_than_its_new_burst() {
        let mut p = ParamsCache::new(&rule(Algorithm::TokenBucket));
        let mut c = Counters::new(Algorithm::TokenBucket, 1);
        let t = 1_700_006_400_000_000;
        assert_eq!(c.admit(0, 10, p.get(600), t).0, 10);
        // Burst 600 → 300 (allocation 600 → 300 of 1000 with burst 1000).
        assert_eq!(c.admit(0, 1000, p.get(300), t + 1).0, 300);
        // Growing again refills at the rate, not at once.
        assert_eq!(c.admit(0, 1000, p.get(600), t + 2).0, 0);
        let (got, _) = c.admit(0, 1000, p.get(600), t + 100_002);
        assert!((59..=61).contains(&got), "100 ms at 600/s: {got}");
    }
}
