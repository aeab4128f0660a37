//! The limiter's view of the overrides: found by a check's rule and key in
//! two hash lookups, whatever their number, and skipped entirely while
//! there are none.

use std::collections::HashMap;

use super::{Override, check::params_for};
use crate::algorithm::Params;
use crate::rules::Rule;

/// One override as a limiter enforces it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    limit: u64,
    burst: Option<u64>,
    expires_at_unix_ms: Option<i64>,
}

/// The overrides a limiter holds, by rule id then key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OverrideIndex {
    /// The coordinator's version of the set (0: none received).
    pub version: u64,
    by_rule: HashMap<String, HashMap<String, Entry>>,
    len: usize,
}

impl OverrideIndex {
    /// The index of `overrides`, at the set's `version`.
    pub fn new<'a>(version: u64, overrides: impl IntoIterator<Item = &'a Override>) -> Self {
        let mut index = OverrideIndex {
            version,
            ..OverrideIndex::default()
        };
        for o in overrides {
            let entry = Entry {
                limit: o.limit,
                burst: o.burst,
                expires_at_unix_ms: o.expires_at_unix_ms,
            };
            let keys = index.by_rule.entry(o.rule.clone()).or_default();
            if keys.insert(o.key.clone(), entry).is_none() {
                index.len += 1;
            }
        }
        index
    }

    /// The overrides held, as much of them as a limiter keeps (rule, key,
    /// numbers, expiry), for its cache file.
    pub fn to_overrides(&self) -> Vec<Override> {
        let mut all: Vec<Override> = self
            .by_rule
            .iter()
            .flat_map(|(rule, keys)| {
                keys.iter().map(move |(key, e)| Override {
                    domain: String::new(),
                    entries: Vec::new(),
                    rule: rule.clone(),
                    key: key.clone(),
                    limit: e.limit,
                    burst: e.burst,
                    expires_at_unix_ms: e.expires_at_unix_ms,
                    reason: String::new(),
                    set_by: String::new(),
                    set_at_unix_ms: 0,
                    rule_name: None,
                })
            })
            .collect();
        all.sort_by(|a, b| (&a.rule, &a.key).cmp(&(&b.rule, &b.key)));
        all
    }

    /// Overrides held (expired ones included until the next set).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether none is held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether any override (in force or not) is held for the rule `rule_id`:
    /// a rule handle that finds none skips the per-key lookup.
    pub fn has_rule(&self, rule_id: &str) -> bool {
        self.by_rule
            .get(rule_id)
            .is_some_and(|keys| !keys.is_empty())
    }

    /// The params `key` of `rule` is held to at `now`, when an override in
    /// force says so: the rule's algorithm and period with the override's
    /// numbers. `None` for a rule the override no longer fits (its rule was
    /// changed to several limits or to unlimited since).
    pub fn params(&self, rule: &Rule, key: &str, now_unix_ms: i64) -> Option<Params> {
        if self.len == 0 {
            return None;
        }
        let entry = self.by_rule.get(rule.id.as_str())?.get(key)?;
        if entry.expires_at_unix_ms.is_some_and(|t| now_unix_ms >= t) {
            return None;
        }
        let params = rule.params.as_ref().filter(|_| rule.also.is_empty())?;
        params_for(params, entry.limit, entry.burst).ok()
    }
}
