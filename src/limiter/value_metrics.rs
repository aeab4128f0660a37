//! Per-value metrics, envoyproxy/ratelimit's `detailed_metric` and
//! `value_to_metric`: checks of such a rule are also counted under the
//! descriptor's values (`meridian_descriptor_checks_total{rule, descriptor,
//! outcome}`, `descriptor` in envoyproxy/ratelimit's `key_value.subkey…`
//! form), beside the rule's own `meridian_checks_total`.
//!
//! Values come from clients, so the series are capped: at most `capacity`
//! (rule, descriptor) pairs are ever registered (`--max-value-metrics`,
//! default 1,000). Further values are counted under `descriptor="_other"`
//! of their rule, and each such check in
//! `meridian_value_metrics_overflow_total{rule}`: a flood of random values
//! adds one series per rule, not one per value. Memory: per pair its rule id
//! and descriptor (each at most the 512-byte key bound, checked before the
//! engine) and three counter handles; about 2 MB at the default cap.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use metrics::{Counter, counter};

/// What the series of values past the cap are counted under.
pub const OTHER: &str = "_other";

/// The registered per-value series, bounded by `capacity`.
pub struct ValueMetrics {
    /// Pairs registered at most (the `_other` series are not counted in it).
    capacity: usize,
    /// A std `RwLock`: no `.await` while held; reads (a known value) are
    /// the common case.
    series: RwLock<Series>,
}

#[derive(Default)]
struct Series {
    /// `rule id` + `\n` + descriptor → its counters.
    by_value: HashMap<String, Arc<Outcomes>, foldhash::fast::RandomState>,
    /// Rule id → its `_other` series, once the cap turned a value away.
    other: HashMap<String, Arc<Outcomes>, foldhash::fast::RandomState>,
}

/// One series' counters by outcome.
struct Outcomes {
    allowed: Counter,
    denied: Counter,
    shadow_denied: Counter,
}

/// A check's outcome as the metrics name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Allowed,
    Denied,
    ShadowDenied,
}

impl Outcomes {
    fn new(rule: &str, descriptor: &str) -> Outcomes {
        let c = |outcome: &'static str| {
            counter!("meridian_descriptor_checks_total", "rule" => rule.to_owned(),
                "descriptor" => descriptor.to_owned(), "outcome" => outcome)
        };
        Outcomes {
            allowed: c("allowed"),
            denied: c("denied"),
            shadow_denied: c("shadow_denied"),
        }
    }

    fn get(&self, outcome: Outcome) -> &Counter {
        match outcome {
            Outcome::Allowed => &self.allowed,
            Outcome::Denied => &self.denied,
            Outcome::ShadowDenied => &self.shadow_denied,
        }
    }
}

impl ValueMetrics {
    pub fn new(capacity: usize) -> ValueMetrics {
        ValueMetrics {
            capacity,
            series: RwLock::default(),
        }
    }

    /// Counts one check of `rule` under `descriptor`, or under `_other` once
    /// the cap is reached.
    pub fn record(&self, rule: &str, descriptor: &str, outcome: Outcome) {
        let id = format!("{rule}\n{descriptor}");
        // A poisoned lock only means another check panicked mid-insert.
        let known = self
            .series
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .by_value
            .get(&id)
            .cloned();
        let series = match known {
            Some(series) => series,
            None => {
                let mut series = self.series.write().unwrap_or_else(|e| e.into_inner());
                if series.by_value.len() < self.capacity || series.by_value.contains_key(&id) {
                    series
                        .by_value
                        .entry(id)
                        .or_insert_with(|| Arc::new(Outcomes::new(rule, descriptor)))
                        .clone()
                } else {
                    counter!("meridian_value_metrics_overflow_total", "rule" => rule.to_owned())
                        .increment(1);
                    series
                        .other
                        .entry(rule.to_owned())
                        .or_insert_with(|| Arc::new(Outcomes::new(rule, OTHER)))
                        .clone()
                }
            }
        };
        series.get(outcome).increment(1);
    }

    /// Series registered, `_other` ones included.
    #[cfg(test)]
    fn len(&self) -> usize {
        let series = self.series.read().unwrap_or_else(|e| e.into_inner());
        series.by_value.len() + series.other.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_of_values_registers_at_most_the_cap_plus_one_other_per_rule() {
        let metrics = ValueMetrics::new(100);
        for i in 0..20_000 {
            metrics.record("api|user", &format!("user_{i}"), Outcome::Allowed);
        }
        for i in 0..1_000 {
            metrics.record("api|ip", &format!("ip_{i}"), Outcome::Denied);
        }
        assert_eq!(metrics.len(), 100 + 2);
        // Known values keep their own series after the cap is reached.
        metrics.record("api|user", "user_7", Outcome::Denied);
        assert_eq!(metrics.len(), 102);
    }
}
