//! Per-key overrides: an operator's runtime limit for one key of one rule
//! ("customer 42 of `api|customer`: 5,000 a minute instead of 1,000").
//!
//! The coordinator holds them as their own versioned set beside the rule
//! versions ([`Overrides`], changed only by an [`OverrideChange`] through
//! Raft), so a rules rollback keeps them and an override is not a rule-set
//! push. Limiters receive the set on their Watch stream and enforce it
//! through an [`OverrideIndex`]. An override keeps its rule's algorithm and
//! period and replaces its limit (and a bucket's burst); on a `scope:
//! global` rule it is the key's world-wide limit, divided between regions in
//! the proportion of the key's allocation, as Envoy's per-descriptor limit
//! is. Everything here is pure: no I/O, no clock (times are given).

#[cfg(feature = "server")]
mod bulk;
mod check;
mod imports;
mod index;

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

#[cfg(feature = "server")]
pub use bulk::{BulkError, Row, parse_csv, parse_json, split_entries, to_csv};
pub use check::{Proposed, params_for, resolve};
pub use imports::{CHUNK_ROWS, IMPORT_TTL_MS, Import, Imports};
pub use index::OverrideIndex;

/// Most overrides a cluster holds; past the bound a change is refused
/// whole, naming it. Measured memory (`tests/integration/overrides.rs`,
/// RSS growth over an import of 100,000 with 7-byte keys, debug build):
/// 2.0–3.2 KB an override on the leader coordinator (the set, its Raft
/// log entries and their copies in the state machine, which the next
/// snapshot purges) and 0.55–1.1 KB on a limiter; see `docs/performance.md`.
pub const MAX_OVERRIDES: usize = 100_000;

/// Longest `reason`, in bytes.
pub const MAX_REASON_BYTES: usize = 256;

/// Longest `set_by`, in bytes.
pub const MAX_SET_BY_BYTES: usize = 128;

/// One override as the coordinator holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Override {
    /// The descriptor's domain.
    pub domain: String,
    /// The descriptor as it was set, outermost entry first.
    pub entries: Vec<(String, String)>,
    /// The rule it resolved to when set (`Rule::id`).
    pub rule: String,
    /// That rule's `name`, if it has one (checks by rule name use it).
    pub rule_name: Option<String>,
    /// The key as that rule counts it (`Resolved::counter_key`).
    pub key: String,
    /// Requests per the rule's period.
    pub limit: u64,
    /// A bucket's burst (`None`: the limit, as a rule's default).
    pub burst: Option<u64>,
    /// When it lapses by itself (`None`: never).
    pub expires_at_unix_ms: Option<i64>,
    /// Why, for the next operator.
    pub reason: String,
    /// Who set it: the credential's fingerprint (and operator name given).
    pub set_by: String,
    /// When it was set.
    pub set_at_unix_ms: i64,
}

impl Override {
    /// Whether it is in force at `now`.
    pub fn live_at(&self, now_unix_ms: i64) -> bool {
        self.expires_at_unix_ms.is_none_or(|t| now_unix_ms < t)
    }

    /// What identifies it: its rule and key.
    pub fn id(&self) -> (String, String) {
        (self.rule.clone(), self.key.clone())
    }
}

/// The cluster's overrides, by (rule, key).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Overrides {
    /// Bumped by every applied change; a limiter keeps the newest it saw.
    pub version: u64,
    /// Every override held, expired ones until the next change drops them.
    pub by_id: BTreeMap<(String, String), Override>,
}

/// A change to the set, applied whole or not at all.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OverrideChange {
    /// Overrides to set (each replaces one with its rule and key).
    pub set: Vec<Override>,
    /// (rule, key) of overrides to remove; one not held refuses the change.
    pub remove: Vec<(String, String)>,
    /// Drop every override first (a bulk import that replaces the set).
    pub replace_all: bool,
    /// A staged import whose rows are set too (see [`Imports`]).
    pub import: Option<u64>,
    /// The proposer's clock: expired overrides are dropped as of it, the
    /// same on every node.
    pub at_unix_ms: i64,
}

/// Why a change was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// An override to remove is not held.
    NotFound(String),
    /// The change would break a bound.
    Rejected(String),
}

/// What an applied change touched: (rule, key) of every entry written or
/// deleted, for storage that keeps one row per override.
pub type Touched = Vec<(String, String)>;

impl Overrides {
    /// The overrides in force at `now`.
    pub fn live_at(&self, now_unix_ms: i64) -> impl Iterator<Item = &Override> {
        self.by_id.values().filter(move |o| o.live_at(now_unix_ms))
    }

    /// Applies `change` whole, or refuses it and changes nothing. Every
    /// applied change first drops what expired as of its time.
    pub fn apply(&mut self, change: &OverrideChange) -> Result<Touched, Refused> {
        if !change.replace_all
            && let Some(missing) = change
                .remove
                .iter()
                .find(|id| !self.by_id.contains_key(*id))
        {
            return Err(Refused::NotFound(format!(
                "no override of rule {} for key {}",
                missing.0, missing.1
            )));
        }
        // The size after the change, counted before anything moves.
        let gone: BTreeSet<&(String, String)> = if change.replace_all {
            self.by_id.keys().collect()
        } else {
            self.by_id
                .iter()
                .filter(|(_, o)| !o.live_at(change.at_unix_ms))
                .map(|(id, _)| id)
                .chain(&change.remove)
                .collect()
        };
        let set: BTreeSet<(String, String)> = change.set.iter().map(Override::id).collect();
        let kept = self.by_id.len() - gone.len();
        let added = set
            .iter()
            .filter(|id| gone.contains(id) || !self.by_id.contains_key(*id))
            .count();
        if kept + added > MAX_OVERRIDES {
            return Err(Refused::Rejected(format!(
                "the change would hold {} overrides, over the bound of {MAX_OVERRIDES}; \
                 remove some first",
                kept + added
            )));
        }
        let mut touched: BTreeSet<(String, String)> = gone.into_iter().cloned().collect();
        for id in &touched {
            self.by_id.remove(id);
        }
        for o in &change.set {
            self.by_id.insert(o.id(), o.clone());
        }
        touched.extend(set);
        self.version += 1;
        Ok(touched.into_iter().collect())
    }
}

#[cfg(test)]
mod tests;
