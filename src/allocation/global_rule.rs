//! A global rule as the allocation leader (and the ledger it feeds) sees
//! it: what the rebalancer divides, its period, and whether its window use
//! is counted exactly.

use super::RulePolicy;
use crate::algorithm::Algorithm;
use crate::rules::{Accuracy, Partition, Rule, RuleSet, Scope};

/// A global rule as the leader sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct GlobalRule {
    /// What the rebalancer divides.
    pub policy: RulePolicy,
    /// The rule's period: demand is smoothed in hits per period.
    pub period_ms: u64,
    /// Counted exactly in fixed windows: regions report their window use
    /// for it, so it may be re-divided within a window ([`InWindow`](super::InWindow)).
    pub counted: bool,
}

impl GlobalRule {
    /// The one definition of how a rule's algorithm and accuracy decide its
    /// windows and whether its window use is exact.
    pub fn new(
        rule: &str,
        limit: u64,
        algorithm: Algorithm,
        accuracy: Accuracy,
        period_ms: u64,
        partition: Partition,
        fallback: f64,
    ) -> GlobalRule {
        GlobalRule {
            policy: RulePolicy {
                rule: rule.to_string(),
                limit,
                partition,
                fallback,
                fallback_hold_ms: super::DEFAULT_FALLBACK_HOLD_MS,
                window_ms: (!algorithm.has_burst()).then_some(period_ms),
            },
            period_ms,
            counted: algorithm == Algorithm::FixedWindow && accuracy == Accuracy::Exact,
        }
    }

    /// The same rule with a `fallback_hold` other than the default.
    pub fn with_fallback_hold(mut self, hold_ms: i64) -> GlobalRule {
        self.policy.fallback_hold_ms = hold_ms.max(0);
        self
    }

    /// The rule's first limit as a global rule, if it is `scope: global`
    /// with a limit.
    pub fn of_rule(rule: &Rule) -> Option<GlobalRule> {
        GlobalRule::of_limit(rule, 0)
    }

    /// Limit `index` of the rule as a global rule, under
    /// [`Rule::limit_id`]: each limit of a `limits:` rule is allocated on
    /// its own (the rule's partition and fallback apply to each).
    pub fn of_limit(rule: &Rule, index: usize) -> Option<GlobalRule> {
        let params = rule.limits().nth(index)?;
        (rule.scope == Scope::Global).then(|| {
            GlobalRule::new(
                &rule.limit_id(index),
                params.limit(),
                params.algorithm(),
                rule.accuracy,
                params.period().as_millis() as u64,
                rule.partition,
                rule.fallback,
            )
            .with_fallback_hold(rule.fallback_hold.as_millis() as i64)
        })
    }

    /// Every limit of every `scope: global` rule of a parsed rule set,
    /// sorted by id.
    pub fn of_rule_set(set: &RuleSet) -> Vec<GlobalRule> {
        let mut rules: Vec<GlobalRule> = set
            .rules()
            .flat_map(|r| (0..=r.also.len()).filter_map(|i| GlobalRule::of_limit(r, i)))
            .collect();
        rules.sort_by(|a, b| a.policy.rule.cmp(&b.policy.rule));
        rules
    }
}
