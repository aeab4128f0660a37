//! What the engine counts per check: `meridian_checks_total` by rule,
//! outcome and reason, the checks near their limit, store errors by kind,
//! check and store-call latencies, and the per-value series of rules that
//! count values.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock, RwLock};
use std::time::Duration;

use metrics::{Counter, Histogram, counter, histogram};

use super::value_metrics::{Outcome, ValueMetrics};
use super::verdict::{Source, Verdict};
use crate::rules::Rule;
use crate::store::StoreError;

/// The engine's metric handles. Handles are registered on first use, not
/// when the engine is built: the metrics recorder may be installed after.
pub(super) struct CheckMetrics {
    /// Each rule's per-check metric handles, by rule id: looking a labelled
    /// metric up through the macros costs label allocations and a registry
    /// search on every check; a handle is one atomic add.
    rules: RwLock<HashMap<String, Arc<RuleMetrics>, foldhash::fast::RandomState>>,
    /// Per-value series of rules with `detailed_metric` / `value_to_metric`,
    /// capped (`EngineConfig::max_value_metrics`).
    values: ValueMetrics,
    /// The store-call latency histogram.
    store_duration: OnceLock<Histogram>,
}

/// The series of `meridian_checks_total` per rule: (outcome, reason), the
/// reason as [`Verdict::reason`] gives it (`ok` for a plain allow). Every
/// series is registered, at 0, with the rule's first check, so an alert on a
/// fail mode or a panel of denials by reason finds its series before the
/// first such decision (15 series per rule and pod; rules are the operator's,
/// never a client's).
pub(super) const CHECK_SERIES: [(&str, &str); 15] = [
    ("allowed", "ok"),
    ("allowed", "fail_open"),
    ("allowed", "fail_local"),
    ("denied", "over_limit"),
    ("denied", "cost_exceeds_capacity"),
    ("denied", "cached_over_limit"),
    ("denied", "fail_closed"),
    ("denied", "fail_local"),
    ("denied", "no_allocation"),
    ("denied", "store_full"),
    ("shadow_denied", "over_limit"),
    ("shadow_denied", "cached_over_limit"),
    ("shadow_denied", "fail_closed"),
    ("shadow_denied", "fail_local"),
    ("shadow_denied", "no_allocation"),
];

/// The kinds of store failure [`error_kind`] names (bad input is the
/// caller's error, not the store's, and sends nothing to the fail mode).
const STORE_ERROR_KINDS: [&str; 4] = ["timeout", "connection", "server", "reply"];

/// An allowed check is near its limit when it leaves less than this share
/// of the limit (Envoy's ratelimit service counts the same at 80 % used).
const NEAR_LIMIT_REMAINING: f64 = 0.2;

/// The metrics every check of one rule records.
pub(crate) struct RuleMetrics {
    /// `meridian_checks_total{outcome, reason}`, in [`CHECK_SERIES`] order.
    checks: [Counter; CHECK_SERIES.len()],
    /// Allowed checks that left less than [`NEAR_LIMIT_REMAINING`] of the limit.
    near_limit: Counter,
    /// `meridian_store_errors_total{kind}`, in [`STORE_ERROR_KINDS`] order:
    /// registered at 0 like `checks`, so a panel of store errors has series
    /// before the first error.
    store_errors: [Counter; STORE_ERROR_KINDS.len()],
    duration: Histogram,
    /// Whether a recorder was installed when these handles were registered:
    /// without one every handle above is a no-op, and a check skips the two
    /// clock reads its duration would cost (a quarter of an in-process
    /// check). A recorder of no size (like `metrics`' own no-op one) holds
    /// nothing to record into and counts as none.
    timed: bool,
}

impl RuleMetrics {
    fn new(rule: &str) -> RuleMetrics {
        RuleMetrics {
            timed: metrics::with_recorder(|r| std::mem::size_of_val(r) != 0),
            checks: CHECK_SERIES.map(|(outcome, reason)| {
                counter!("meridian_checks_total", "rule" => rule.to_owned(), "outcome" => outcome, "reason" => reason)
            }),
            near_limit: counter!("meridian_checks_near_limit_total", "rule" => rule.to_owned()),
            store_errors: STORE_ERROR_KINDS.map(|kind| {
                counter!("meridian_store_errors_total", "rule" => rule.to_owned(), "kind" => kind)
            }),
            duration: histogram!("meridian_check_duration_seconds", "rule" => rule.to_owned()),
        }
    }

    /// Whether checks of the rule time themselves (see the field).
    pub(crate) fn timed(&self) -> bool {
        self.timed
    }

    /// The counter a verdict is counted under.
    fn checks(&self, verdict: &Verdict) -> &Counter {
        if verdict.decision.allowed && !verdict.shadow_denied && verdict.source == Source::Store {
            // The common case, without the search below.
            return &self.checks[0];
        }
        let outcome = match (verdict.decision.allowed, verdict.shadow_denied) {
            (_, true) => "shadow_denied",
            (true, false) => "allowed",
            (false, false) => "denied",
        };
        let reason = match verdict.reason() {
            "" => "ok",
            reason => reason,
        };
        let at = CHECK_SERIES
            .iter()
            .position(|&(o, r)| o == outcome && r == reason)
            .unwrap_or(0);
        &self.checks[at]
    }
}

impl CheckMetrics {
    /// Tracks at most `max_value_metrics` (rule, value) series.
    pub(super) fn new(max_value_metrics: usize) -> CheckMetrics {
        CheckMetrics {
            rules: RwLock::default(),
            values: ValueMetrics::new(max_value_metrics),
            store_duration: OnceLock::new(),
        }
    }

    /// Counts a verdict and its latency under its rule (and its value, for
    /// rules that count values).
    pub(super) fn record(
        &self,
        rule: &Rule,
        verdict: &Verdict,
        value: Option<&str>,
        took: Duration,
    ) {
        let metrics = self.rule_metrics(&rule.id);
        self.record_for(&metrics, rule, verdict, value, Some(took));
    }

    /// [`CheckMetrics::record`] with the rule's handles at hand (a rule
    /// handle keeps them); `took` is `None` when the check was not timed.
    pub(crate) fn record_for(
        &self,
        metrics: &RuleMetrics,
        rule: &Rule,
        verdict: &Verdict,
        value: Option<&str>,
        took: Option<Duration>,
    ) {
        metrics.checks(verdict).increment(1);
        if let Some(value) = value {
            let outcome = match (verdict.decision.allowed, verdict.shadow_denied) {
                (_, true) => Outcome::ShadowDenied,
                (true, false) => Outcome::Allowed,
                (false, false) => Outcome::Denied,
            };
            self.values.record(&rule.id, value, outcome);
        }
        let decision = &verdict.decision;
        if decision.allowed
            && !verdict.shadow_denied
            && verdict.source == Source::Store
            && (decision.remaining as f64) < decision.limit as f64 * NEAR_LIMIT_REMAINING
        {
            metrics.near_limit.increment(1);
        }
        if let Some(took) = took.filter(|_| metrics.timed) {
            metrics.duration.record(took.as_secs_f64());
        }
    }

    /// The rule's metric handles, registered on its first check. Rule ids
    /// come from rule files, so the map holds one entry per rule ever loaded.
    pub(crate) fn rule_metrics(&self, rule: &str) -> Arc<RuleMetrics> {
        // A poisoned lock only means another check panicked mid-insert; the
        // map itself is still whole.
        let known = self
            .rules
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(rule)
            .cloned();
        known.unwrap_or_else(|| {
            self.rules
                .write()
                .unwrap_or_else(|e| e.into_inner())
                .entry(rule.to_owned())
                .or_insert_with(|| Arc::new(RuleMetrics::new(rule)))
                .clone()
        })
    }

    /// Counts a store failure under its rule and kind.
    pub(super) fn store_failed(&self, rule: &Rule, e: &StoreError) {
        let kind = error_kind(e);
        let metrics = self.rule_metrics(&rule.id);
        match STORE_ERROR_KINDS.iter().position(|k| *k == kind) {
            Some(at) => metrics.store_errors[at].increment(1),
            None => {
                counter!("meridian_store_errors_total", "rule" => rule.id.clone(), "kind" => kind)
                    .increment(1)
            }
        }
    }

    /// Records one store call's latency.
    pub(super) fn store_call_took(&self, took: Duration) {
        self.store_duration
            .get_or_init(|| histogram!("meridian_store_duration_seconds"))
            .record(took.as_secs_f64());
    }
}

/// A store error's `kind` label.
fn error_kind(e: &StoreError) -> &'static str {
    match e {
        StoreError::Timeout(_) => "timeout",
        #[cfg(feature = "redis")]
        StoreError::Connection(_) => "connection",
        #[cfg(feature = "redis")]
        StoreError::Server(_) => "server",
        StoreError::Reply(_) => "reply",
        StoreError::InvalidInput(_) => "invalid_input",
    }
}
