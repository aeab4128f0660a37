//! One key's counters as a rule keeps them: their names (a split rule's
//! sub-counters too) and the periods a windowed one may be counted in, and
//! what clearing them removed. The engine clears (`Engine::reset`);
//! `reset.rs` decides which key.

use crate::algorithm::Params;
use crate::rules::{Rule, Unit};
use crate::store::key;

/// What one reset cleared in this process and its store.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Cleared {
    /// Stored keys that held state and were deleted (Redis keys, or the
    /// embedded store's entries; a bucket or a window is one, a sliding log
    /// two: its set and its sequence).
    pub store_keys: u64,
    /// Entries of the `fail_mode: local` store deleted.
    pub local_keys: u64,
    /// Hits the approximate path admitted in this process and had not sent
    /// to Redis yet, dropped (so they do not come back after the delete).
    pub pending_hits: u64,
    /// Denials the over-limit cache held for the key, dropped.
    pub cached_denials: usize,
}

/// The counter keys a rule keeps for `counter_key`: the key itself and, for
/// a split rule, every sub-counter it may use (`<key>#0 … #<split - 1>`;
/// fewer are used when the limit is below `split`, and the key alone if the
/// rule was split later). A sub-counter whose key would pass the length
/// limit was never stored (its check was refused), so it is not named.
pub fn counter_keys(rule: &Rule, counter_key: &str) -> Vec<String> {
    let mut keys = vec![counter_key.to_owned()];
    if rule.split > 1 {
        keys.extend(
            (0..rule.split)
                .map(|i| format!("{counter_key}#{i}"))
                .filter(|k| k.len() <= key::MAX_KEY_LEN),
        );
    }
    keys
}

/// The periods (µs) a windowed counter of the rule may be counted in: each
/// limit's, and each Envoy unit, which a descriptor's `limit` override
/// brings to the same counter (`service::override_params`).
pub fn periods(rule: &Rule) -> Vec<u64> {
    let mut periods: Vec<u64> = rule
        .limits()
        .map(Params::period_us)
        .chain(
            Unit::STANDARD
                .iter()
                .map(|u| u.duration().as_micros() as u64),
        )
        .collect();
    periods.sort_unstable();
    periods.dedup();
    periods
}
