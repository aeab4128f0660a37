//! Hot-key splitting (`split: K`): one key's counter spread over K
//! sub-counters `…#0 … #K-1`, each with limit / K (the remainder spread over
//! the first ones). The index sits inside the hash tag (`mr:{<rule>:<key>#i}`),
//! so the sub-counters hash to different Cluster slots and, with several
//! masters, to different shards: one customer at 50 k/s no longer loads one node.
//!
//! A check picks one sub-counter at random and, if it denies, one other before
//! denying. Accuracy trade-off:
//! - admitted ≤ L per window: the sub-limits sum to L, and each is exact (or
//!   within its own approximate bound: + pods × max_batch per sub-counter).
//! - admitted ≥ L − K × (cost − 1) once demand has reached every sub-counter
//!   (each can strand less than one check's cost). Before that, a single check
//!   may be denied while other sub-counters still have room: with `f` of the K
//!   exhausted, with probability f/K × (f − 1)/(K − 1).
//! - `remaining` in a decision is the chosen sub-counter's, not the key's.
//!
//! The appended `#i` keeps keys injective: a client key can contain `#`, but
//! the index after the last `#` is all digits, so (key, i) is recoverable.

use rand::Rng;

use crate::algorithm::{Decision, InvalidInput, Params};
use crate::store::Limit;

/// A key's sub-counters under one limit.
pub struct SubCounters<'a> {
    limit: &'a Limit,
    key: &'a str,
    /// Effective K: at most the limit (and burst), so every sub-limit is ≥ 1.
    count: u64,
}

impl<'a> SubCounters<'a> {
    pub fn new(limit: &'a Limit, key: &'a str, split: u32) -> SubCounters<'a> {
        let p = &limit.params;
        let mut count = u64::from(split).min(p.limit());
        if p.algorithm().has_burst() {
            count = count.min(p.burst());
        }
        SubCounters {
            limit,
            key,
            count: count.max(1),
        }
    }

    pub fn count(&self) -> u64 {
        self.count
    }

    /// Two distinct indices at random (the same one twice when K = 1).
    pub fn pick_two(&self, rng: &mut impl Rng) -> (u64, u64) {
        let first = rng.random_range(0..self.count);
        if self.count == 1 {
            return (first, first);
        }
        let other = rng.random_range(0..self.count - 1);
        (first, if other >= first { other + 1 } else { other })
    }

    /// Sub-counter `i`: its limit (limit / K, plus one for the first
    /// `limit mod K`) and its counter key.
    pub fn get(&self, i: u64) -> Result<(Limit, String), InvalidInput> {
        let p = &self.limit.params;
        let share = |total: u64| (total / self.count + u64::from(i < total % self.count)) as i64;
        let params = Params::new(
            p.algorithm(),
            share(p.limit()),
            p.period(),
            p.algorithm().has_burst().then(|| share(p.burst())),
        )?;
        let limit = Limit {
            rule: self.limit.rule.clone(),
            params,
        };
        Ok((limit, format!("{}#{i}", self.key)))
    }

    /// A sub-counter's decision, reported against the whole key's limit.
    pub fn whole(&self, mut decision: Decision) -> Decision {
        decision.limit = self.limit.params.limit();
        decision
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::Algorithm;
    use std::time::Duration;

    fn limit(n: i64) -> Limit {
        Limit {
            rule: "r".into(),
            params: Params::new(Algorithm::FixedWindow, n, Duration::from_secs(60), None).unwrap(),
        }
    }

    #[test]
    fn sub_limits_sum_to_the_limit() {
        for (n, k) in [(10_000, 8), (803, 8), (5, 8), (1, 3)] {
            let l = limit(n);
            let subs = SubCounters::new(&l, "k", k);
            let total: u64 = (0..subs.count())
                .map(|i| subs.get(i).unwrap().0.params.limit())
                .sum();
            assert_eq!(total, n as u64, "limit {n} split {k}");
        }
    }

    #[test]
    fn sub_keys_are_distinct_hash_tags() {
        let l = limit(100);
        let subs = SubCounters::new(&l, "hot", 8);
        let prefixes: std::collections::HashSet<String> = (0..8)
            .map(|i| crate::store::key::key_prefix("r", &subs.get(i).unwrap().1).unwrap())
            .collect();
        assert_eq!(prefixes.len(), 8);
        assert!(prefixes.contains("mr:{r:hot#7}"));
    }

    #[test]
    fn second_pick_differs_from_the_first() {
        let l = limit(100);
        let subs = SubCounters::new(&l, "k", 8);
        let mut rng = rand::rng();
        for _ in 0..1_000 {
            let (a, b) = subs.pick_two(&mut rng);
            assert!(a != b && a < 8 && b < 8);
        }
    }
}
