//! The leader's world ledger as JSON, for `GET /api/v1/ledger` and the
//! history's `world_periods`; the ledger itself is
//! [`allocation::ledger`](crate::allocation::ledger), and its gauges and the
//! figures drills record are [`coordinator::ledger`](crate::coordinator::ledger).

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::allocation::Millis;
use crate::allocation::ledger::{HOUR_MS, PeriodFigure, RuleLedger};

/// How every ledger figure is measured, for the API and the docs.
pub const HOW: &str = "world-wide admitted hits per clock-aligned rule period \
     (floor(t / period) × period, Unix time), for every algorithm: the sum over every pod of \
     every region of the latest count it reported of what it admitted in that period (counts \
     are cumulative, so a repeated or late report replaces a pod's count, never adds). For a \
     sliding window or a bucket this is the clock-aligned period, not a rolling window. `L` is \
     per key, so `admitted` is the busiest tracked key's count (`all_keys`: every key \
     together); the bound is the rule's stated bound for one period: L for fixed window, \
     sliding log and sliding counter, burst + L for token bucket and GCRA, + pods × max_batch \
     on the approximate path. A period is final one period (at most 60 s) after it ends; it is \
     `complete` when every pod counted was heard after it ended (else a lower bound). Counted \
     by the leader from the reports that reach it: a new leader starts empty";

/// One period as JSON.
pub fn figure_json(f: &PeriodFigure) -> Value {
    let per = |regions: &[(std::sync::Arc<str>, u64)]| -> BTreeMap<String, u64> {
        regions.iter().map(|(r, n)| (r.to_string(), *n)).collect()
    };
    json!({
        "start_unix_ms": f.start_ms,
        "period_ms": f.period_ms,
        "admitted": f.admitted,
        "key": f.key.as_deref(),
        "regions": per(&f.regions),
        "all_keys": f.all_keys,
        "all_keys_regions": per(&f.all_keys_regions),
        "limit": f.limit,
        "bound": f.bound,
        "over_bound": f.over_bound(),
        "pods": f.pods,
        "tracked_keys": f.keys,
        "complete": f.complete,
    })
}

/// Keys of the current period shown per rule (the busiest).
pub const TOP_KEYS: usize = 10;

/// One rule's ledger as JSON: its terms, the current period (with its
/// busiest keys), those that ended but are not final yet, the newest
/// `periods` finished ones and the worst of the last hour.
pub fn rule_json(rule: &RuleLedger, now: Millis, periods: usize) -> Value {
    let terms = rule.terms();
    let finished = rule.finished();
    let recent: Vec<Value> = finished
        .iter()
        .skip(finished.len().saturating_sub(periods))
        .map(figure_json)
        .collect();
    let top: Vec<Value> = rule
        .top_keys(now, TOP_KEYS)
        .iter()
        .map(|(k, n)| json!({ "key": &**k, "admitted": n }))
        .collect();
    let current = rule.current(now);
    // Ended, but not final yet (pods may still report them).
    let ending: Vec<Value> = rule
        .open()
        .iter()
        .filter(|f| f.start_ms < current.start_ms)
        .map(figure_json)
        .collect();
    json!({
        "limit": terms.limit,
        "period_ms": terms.period_ms,
        "algorithm": terms.algorithm.name(),
        "accuracy": if terms.per_pod_slack.is_some() { "approximate" } else { "exact" },
        "bound_is": terms.bound_is(),
        "current": figure_json(&current),
        "ending": ending,
        "current_top_keys": top,
        "periods": recent,
        "worst_last_hour": rule.worst_within(now, HOUR_MS).map(figure_json),
        "periods_over_bound_last_hour": rule.over_bound_within(now, HOUR_MS),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coordinator::ledger::tests::{T0, ledger};

    #[test]
    fn the_json_states_the_bound_the_worst_period_and_how_many_periods() {
        let ledger = ledger();
        let rule = ledger.rule("api|sw").expect("rule");
        let json = rule_json(rule, T0 + 10_000, 1);
        assert_eq!(json["limit"], 100);
        assert_eq!(json["algorithm"], "sliding_window_counter");
        assert_eq!(json["periods"].as_array().map(Vec::len), Some(1));
        assert_eq!(json["periods"][0]["admitted"], 90);
        assert_eq!(json["worst_last_hour"]["start_unix_ms"], T0 + 2_000);
        assert_eq!(json["periods_over_bound_last_hour"], 0);
        assert_eq!(json["current"]["admitted"], 0);
    }
}
