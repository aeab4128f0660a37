//! An operator's reset of one key (`meridian ctl reset --domain api
//! customer=42 [--rule R]`): the descriptor is matched as a check of it
//! would be, and every counter the matched rule keeps for it is cleared —
//! each limit of a `limits:` rule, each sub-counter of a split one, in any
//! algorithm's layout — together with what this process holds of it: the
//! approximate path's unflushed hits, cached denials, the `fail_mode: local`
//! store's state. [`Engine::reset`](super::Engine::reset) clears; this
//! module decides what.
//!
//! One region: the store is this region's Redis, and the coordinator sends
//! a reset to every region. Left alone: a global rule's demand counts (what
//! the region reports of the key's use this window), which are history
//! for the allocator, not what admits or denies; they end with the window.

use std::sync::Arc;

pub use super::counters::Cleared;
use super::service::{MAX_ENTRIES, Service};
use crate::algorithm::InvalidInput;
use crate::rules::{Rule, RuleSet};
use crate::store::StoreError;

/// One rule's counter that a reset cleared.
#[derive(Debug, Clone)]
pub struct ResetRule {
    /// The matched rule (the enforced set's, or the shadow set's when it
    /// matched another rule: shadow rules count too).
    pub rule: Arc<Rule>,
    /// The counter within the rule (`Resolved::counter_key`).
    pub counter_key: String,
    /// What was cleared of it.
    pub cleared: Cleared,
}

/// What a reset did: one entry per matched rule; none when the descriptor
/// matches no rule (nothing is counted for it, so nothing was cleared).
#[derive(Debug, Clone, Default)]
pub struct ResetOutcome {
    /// The matched rules, the enforced set's first.
    pub rules: Vec<ResetRule>,
}

/// Why a reset did not happen (or not wholly).
#[derive(Debug, thiserror::Error)]
pub enum ResetError {
    /// The request itself: no domain, a bad descriptor, an over-long key,
    /// an unknown or ambiguous rule name, a descriptor that does not match
    /// the named rule. Nothing was cleared.
    #[error(transparent)]
    Invalid(#[from] InvalidInput),
    /// The store failed or missed its deadline: some counters may be cleared
    /// and others not. Clearing is idempotent, so sending the reset again
    /// finishes it.
    #[error("clearing the counters failed: {0}")]
    Store(#[source] StoreError),
}

impl From<StoreError> for ResetError {
    fn from(e: StoreError) -> ResetError {
        match e {
            StoreError::InvalidInput(e) => ResetError::Invalid(e),
            e => ResetError::Store(e),
        }
    }
}

impl Service {
    /// Resets the counter `entries` (a descriptor of `domain`) has under the
    /// rule it matches, in the enforced rule set and, when one is loaded,
    /// in the shadow set. With `rule`, only a rule of that name
    /// (`rate_limit.name`) is reset, and the descriptor must match it: a
    /// check that the operator resets what they meant. Rules are matched
    /// once, up front; a rule set swapped meanwhile is not looked at again.
    pub async fn reset(
        &self,
        domain: &str,
        entries: &[(String, String)],
        rule: Option<&str>,
    ) -> Result<ResetOutcome, ResetError> {
        let targets = self.reset_targets(domain, entries, rule)?;
        let mut rules = Vec::with_capacity(targets.len());
        for (rule, counter_key) in targets {
            let cleared = self.reset_counter(&rule, &counter_key).await?;
            rules.push(ResetRule {
                rule,
                counter_key,
                cleared,
            });
        }
        Ok(ResetOutcome { rules })
    }

    /// Resets one counter of `rule` as [`Service::reset`] does, for callers
    /// that name the counter themselves (a native check by rule name counts
    /// under the key as given, not under a descriptor's counter key).
    pub async fn reset_counter(
        &self,
        rule: &Rule,
        counter_key: &str,
    ) -> Result<Cleared, ResetError> {
        Ok(self.engine.reset(rule, counter_key).await?)
    }

    /// The (rule, counter key) pairs a reset clears, each once.
    fn reset_targets(
        &self,
        domain: &str,
        entries: &[(String, String)],
        name: Option<&str>,
    ) -> Result<Vec<(Arc<Rule>, String)>, InvalidInput> {
        if domain.is_empty() {
            return Err(InvalidInput::new("domain", "\"\"", "must not be empty"));
        }
        if entries.is_empty() || entries.len() > MAX_ENTRIES {
            return Err(InvalidInput::new(
                "descriptor",
                format!("{} entries", entries.len()),
                format!("a descriptor needs 1 to {MAX_ENTRIES} entries"),
            ));
        }
        let entries: Vec<(&str, &str)> = entries
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let sets: Vec<Arc<RuleSet>> = std::iter::once(self.rules.current())
            .chain(self.rules.shadow())
            .collect();
        if let Some(name) = name {
            let mut known = false;
            for set in &sets {
                match set.by_name(domain, name) {
                    Ok(found) => known |= found.is_some(),
                    Err(e) => return Err(InvalidInput::new("rule", name, e.to_string())),
                }
            }
            if !known {
                return Err(InvalidInput::new(
                    "rule",
                    name,
                    format!("no rule of domain {domain:?} has this name"),
                ));
            }
        }
        let mut targets: Vec<(Arc<Rule>, String)> = Vec::new();
        let mut others = Vec::new();
        for set in &sets {
            let Some(resolved) = set.resolve(domain, &entries) else {
                continue;
            };
            let Some(rule) = resolved.rule else {
                continue;
            };
            if name.is_some_and(|n| rule.name.as_deref() != Some(n)) {
                others.push(rule.id.clone());
                continue;
            }
            let seen = targets
                .iter()
                .any(|(r, k)| r.id == rule.id && *k == resolved.counter_key);
            if !seen {
                targets.push((rule.clone(), resolved.counter_key));
            }
        }
        if let Some(name) = name
            && targets.is_empty()
        {
            let matched = match others.as_slice() {
                [] => "no rule".to_owned(),
                ids => format!("rule {}", ids.join(" and ")),
            };
            return Err(InvalidInput::new(
                "rule",
                name,
                format!("the descriptor matches {matched}, not this one"),
            ));
        }
        Ok(targets)
    }
}
