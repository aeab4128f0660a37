//! The local over-limit cache: keys known to be denied until some instant are
//! denied in process, with no store call, until then.
//!
//! Only denials of a single hit are cached: their retry-after is exactly when
//! the next hit could be admitted, and anything costing more is denied at
//! least as long. So the cache never denies what the store would admit.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::Mutex;
use std::time::Instant;

use foldhash::fast::RandomState;

const SHARDS: usize = 16;

/// Keys denied until an instant (the store's retry-after), so that a client
/// retrying a denied key is answered in process. Written by the engine on a
/// single-hit denial, read on every check; sharded to spread the lock.
pub struct OverLimitCache {
    /// `std::sync::Mutex`: held for one map operation, never across `.await`.
    shards: Box<[Mutex<HashMap<String, Instant>>]>,
    hasher: RandomState,
    /// Entries per shard at most; a full shard first drops what has expired,
    /// then refuses new entries (a missed cache entry only costs a store call).
    per_shard: usize,
}

impl OverLimitCache {
    pub fn new(capacity: usize) -> OverLimitCache {
        OverLimitCache {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            hasher: RandomState::default(),
            per_shard: capacity.div_ceil(SHARDS).max(1),
        }
    }

    fn shard(&self, key: &str) -> &Mutex<HashMap<String, Instant>> {
        &self.shards[self.hasher.hash_one(key) as usize % SHARDS]
    }

    /// The instant until which `key` is known to be denied, if it still lies ahead.
    pub fn denied_until(&self, key: &str, now: Instant) -> Option<Instant> {
        let mut shard = self.shard(key).lock().unwrap_or_else(|e| e.into_inner());
        match shard.get(key) {
            Some(&until) if until > now => Some(until),
            Some(_) => {
                shard.remove(key);
                None
            }
            None => None,
        }
    }

    pub fn deny_until(&self, key: &str, until: Instant, now: Instant) {
        let mut shard = self.shard(key).lock().unwrap_or_else(|e| e.into_inner());
        if shard.len() >= self.per_shard && !shard.contains_key(key) {
            shard.retain(|_, u| *u > now);
            if shard.len() >= self.per_shard {
                return;
            }
        }
        shard.insert(key.to_owned(), until);
    }

    /// Forgets the denials of one counter (a reset): the entry named `base`
    /// and every entry `base` + NUL + something (the same counter denied
    /// under another limit; see `engine::cache_key`). Entries of any shard,
    /// as the suffix changes the hash: a walk of the whole cache, for an
    /// operator's command, not a check. Returns how many went.
    pub fn forget(&self, base: &str) -> usize {
        let of_base = |k: &str| {
            k.strip_prefix(base)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with('\u{0}'))
        };
        let mut forgotten = 0;
        for shard in self.shards.iter() {
            let mut shard = shard.lock().unwrap_or_else(|e| e.into_inner());
            let before = shard.len();
            shard.retain(|k, _| !of_base(k));
            forgotten += before - shard.len();
        }
        forgotten
    }

    /// Forgets every entry (rules changed: cached denials may no longer hold).
    pub fn clear(&self) {
        for shard in self.shards.iter() {
            shard.lock().unwrap_or_else(|e| e.into_inner()).clear();
        }
    }

    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(|e| e.into_inner()).len())
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn entries_expire_and_capacity_is_bounded() {
        let cache = OverLimitCache::new(32);
        let now = Instant::now();
        let later = now + Duration::from_secs(1);
        cache.deny_until("a", later, now);
        assert_eq!(cache.denied_until("a", now), Some(later));
        assert_eq!(cache.denied_until("a", later), None);
        for i in 0..1000 {
            cache.deny_until(&format!("k{i}"), later, now);
        }
        assert!(cache.len() <= 32 + SHARDS, "{}", cache.len());
        // Once those expire, new entries find room again.
        let after = later + Duration::from_secs(1);
        cache.deny_until("fresh", after + Duration::from_secs(1), after);
        assert!(cache.denied_until("fresh", after).is_some());
    }

    #[test]
    fn forgetting_a_counter_drops_its_denials_under_every_limit_only() {
        let cache = OverLimitCache::new(100);
        let now = Instant::now();
        let later = now + Duration::from_secs(60);
        for key in ["r\0k", "r\0k\u{0}5/5/60", "r\0k2", "r\0other"] {
            cache.deny_until(key, later, now);
        }
        assert_eq!(cache.forget("r\0k"), 2);
        assert_eq!(cache.denied_until("r\0k", now), None);
        assert_eq!(cache.denied_until("r\0k\u{0}5/5/60", now), None);
        assert_eq!(cache.denied_until("r\0k2", now), Some(later));
        assert_eq!(cache.denied_until("r\0other", now), Some(later));
    }
}
