//! What the ledger states a rule's figures against: its limit, period and
//! algorithm, and the bound they give ([`Terms::bound`]; see the module doc
//! of `ledger`).

use crate::algorithm::Algorithm;
use crate::allocation::global_rule::GlobalRule;
use crate::rules::{Accuracy, Partition, RuleSet, Scope};

/// What the ledger needs of a global rule (limit index) to state its bound.
#[derive(Debug, Clone, PartialEq)]
pub struct Terms {
    /// The rule's id (`Rule::limit_id`).
    pub rule: String,
    /// The world-wide limit `L` per period, per key.
    pub limit: u64,
    /// The rule's period: the ledger's periods are aligned to it.
    pub period_ms: u64,
    /// Decides the bound: windowed `L`, buckets `burst + L`.
    pub algorithm: Algorithm,
    /// The buckets' burst (ignored for windowed algorithms).
    pub burst: u64,
    /// Approximate path: what each pod may hold unseen by others
    /// (`max_batch × split`); `None` on the exact path.
    pub per_pod_slack: Option<u64>,
    /// `available` may go above the bound while a region is cut off (said
    /// in [`Terms::bound_is`], not added).
    pub partition: Partition,
    /// Derived from the leader's [`GlobalRule`] alone (the algorithm's
    /// exact kind, a bucket's burst and the accuracy were not given): a
    /// bucket's burst is taken as `L` (its default).
    pub assumed: bool,
}

impl Terms {
    /// The terms of every limit of every `scope: global` rule of `set`.
    pub fn of_rule_set(set: &RuleSet) -> Vec<Terms> {
        set.rules()
            .filter(|r| r.scope == Scope::Global)
            .flat_map(|r| r.limits().enumerate().map(move |(i, p)| (r, i, p)))
            .map(|(r, i, params)| Terms {
                rule: r.limit_id(i).into_owned(),
                limit: params.limit(),
                period_ms: u64::try_from(params.period().as_millis()).unwrap_or(u64::MAX),
                algorithm: params.algorithm(),
                burst: params.burst(),
                per_pod_slack: match r.accuracy {
                    Accuracy::Exact => None,
                    Accuracy::Approximate { max_batch, .. } => Some(
                        max_batch
                            .unwrap_or((params.limit() / 100).max(1))
                            .saturating_mul(u64::from(r.split.max(1))),
                    ),
                },
                partition: r.partition,
                assumed: false,
            })
            .collect()
    }

    /// What the leader's own view of a rule tells (the simulator gives no
    /// more): windowed or bucket, exact, a bucket's burst = `L`.
    pub fn of_global_rule(rule: &GlobalRule) -> Terms {
        let algorithm = match (rule.counted, rule.policy.window_ms) {
            (true, _) => Algorithm::FixedWindow,
            (false, Some(_)) => Algorithm::SlidingWindowCounter,
            (false, None) => Algorithm::TokenBucket,
        };
        Terms {
            rule: rule.policy.rule.clone(),
            limit: rule.policy.limit,
            period_ms: rule.period_ms,
            algorithm,
            burst: rule.policy.limit,
            per_pod_slack: None,
            partition: rule.policy.partition,
            assumed: true,
        }
    }

    /// The most the world may admit of one key in one clock-aligned period
    /// with `pods` pods reporting (see the module docs).
    pub fn bound(&self, pods: u64) -> u64 {
        let base = if self.algorithm.has_burst() {
            self.burst.saturating_add(self.limit)
        } else {
            self.limit
        };
        base.saturating_add(self.per_pod_slack.unwrap_or(0).saturating_mul(pods))
    }

    /// The bound in words, for the API and reports.
    pub fn bound_is(&self) -> String {
        let mut s = if self.algorithm.has_burst() {
            format!(
                "burst + L = {} + {} ({}: B + R·T with T one period)",
                self.burst,
                self.limit,
                self.algorithm.name()
            )
        } else {
            format!(
                "L = {} ({}: every clock-aligned period ≤ L)",
                self.limit,
                self.algorithm.name()
            )
        };
        if let Some(slack) = self.per_pod_slack {
            s.push_str(&format!(
                "; approximate: + {slack} (max_batch × split) per pod that reported the period"
            ));
        }
        if self.assumed {
            s.push_str("; assumed from the leader's view (a bucket's burst taken as L)");
        }
        if self.partition == Partition::Available {
            s.push_str(
                "; partition: available may add a silent region's allocation for at most one \
                 lease (not included)",
            );
        }
        s
    }
}
