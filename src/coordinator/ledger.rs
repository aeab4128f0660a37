//! The world ledger on the coordinator: the pure
//! [`Ledger`](crate::allocation::ledger::Ledger) lives in the leader's
//! [`Leader`](crate::allocation::leader::Leader); this turns its figures
//! into Prometheus gauges and the per-period figures drills record. The
//! JSON for `GET /api/v1/ledger` and the history is the cockpit's
//! (`cockpit::ledger_json`).
//!
//! Gauges (label `rule` only: global rules are set by operators, so the
//! label stays bounded; no key is a label):
//! - `meridian_global_admitted` — the busiest key's world-wide admitted
//!   hits in the rule's current clock-aligned period, so far;
//! - `meridian_global_limit` — `L`;
//! - `meridian_global_bound` — the stated bound of the current period;
//! - `meridian_global_worst_period_ratio` — the finished period of the last
//!   hour with the most admitted, as admitted / `L`;
//! - `meridian_global_periods_over_bound` — finished periods of the last
//!   hour above their bound.
//!
//! Only the leader holds a ledger: a follower (or a node that stopped
//! leading) sets every one of these to 0, so take `max by (rule)` over the
//! coordinators.

use std::collections::{BTreeMap, BTreeSet};

use metrics::{counter, describe_gauge, gauge};

use super::drill::observe::{LedgerFigures, LedgerPeriod, LedgerRule};
use crate::allocation::Millis;
use crate::allocation::ledger::{HOUR_MS, Ledger, PeriodFigure};

/// Says what each gauge is, once per process.
pub fn describe() {
    describe_gauge!(
        "meridian_global_admitted",
        "Leader only (0 elsewhere): the busiest key's world-wide admitted hits in the global \
         rule's current clock-aligned period, summed over every pod's report"
    );
    describe_gauge!(
        "meridian_global_limit",
        "Leader only (0 elsewhere): the global rule's world-wide limit L per period and key"
    );
    describe_gauge!(
        "meridian_global_bound",
        "Leader only (0 elsewhere): the stated bound of the current period (L; burst + L for \
         buckets; + pods x max_batch approximate)"
    );
    describe_gauge!(
        "meridian_global_worst_period_ratio",
        "Leader only (0 elsewhere): admitted / L of the finished period of the last hour that \
         admitted the most (0: none finished)"
    );
    describe_gauge!(
        "meridian_global_periods_over_bound",
        "Leader only (0 elsewhere): finished periods of the last hour whose world-wide \
         admitted exceeded their stated bound"
    );
    describe_gauge!(
        "meridian_coordinator_ledger_bytes",
        "Memory the leader's world ledger holds"
    );
}

/// Sets the gauges from `ledger` (the leader's), or to 0 for every rule
/// set before when `ledger` is `None` (not leading). `exported` remembers
/// which rules have series, so a rule that left and a deposed leader's
/// values do not linger.
pub fn export(ledger: Option<&Ledger>, now: Millis, exported: &mut BTreeSet<String>) {
    let mut seen = BTreeSet::new();
    if let Some(ledger) = ledger {
        for (id, rule) in ledger.rules() {
            let current = rule.current(now);
            let worst = rule
                .worst_within(now, HOUR_MS)
                .map_or(0.0, PeriodFigure::ratio);
            let label = [("rule", id.clone())];
            gauge!("meridian_global_admitted", &label).set(current.admitted as f64);
            gauge!("meridian_global_limit", &label).set(current.limit as f64);
            gauge!("meridian_global_bound", &label).set(current.bound as f64);
            gauge!("meridian_global_worst_period_ratio", &label).set(worst);
            gauge!("meridian_global_periods_over_bound", &label)
                .set(rule.over_bound_within(now, HOUR_MS) as f64);
            seen.insert(id.clone());
        }
        gauge!("meridian_coordinator_ledger_bytes").set(ledger.bytes() as f64);
        let d = ledger.dropped();
        for (reason, n) in [
            ("unknown_rule", d.unknown_rule),
            ("misaligned", d.misaligned),
            ("future", d.future),
            ("late", d.late),
            ("pods", d.pods),
            ("keys", d.keys),
        ] {
            counter!("meridian_coordinator_ledger_dropped_total", "reason" => reason).absolute(n);
        }
    }
    for gone in exported.difference(&seen) {
        let label = [("rule", gone.clone())];
        for name in [
            "meridian_global_admitted",
            "meridian_global_limit",
            "meridian_global_bound",
            "meridian_global_worst_period_ratio",
            "meridian_global_periods_over_bound",
        ] {
            gauge!(name, &label).set(0.0);
        }
    }
    *exported = seen;
}

/// The finished periods of `rules` that end after each one's `from` (a
/// drill's start: the period it started in is its first), for drills.
pub fn drill_figures(ledger: &Ledger, rules: &BTreeMap<String, Millis>) -> LedgerFigures {
    rules
        .iter()
        .filter_map(|(id, from)| {
            let rule = ledger.rule(id)?;
            let periods = rule
                .finished()
                .iter()
                .filter(|f| f.end_ms() > *from)
                .map(|f| {
                    (
                        f.start_ms,
                        LedgerPeriod {
                            admitted: f.regions.iter().map(|(r, n)| (r.to_string(), *n)).collect(),
                            limit: f.limit,
                            bound: f.bound,
                            pods: f.pods,
                            complete: f.complete,
                        },
                    )
                })
                .collect();
            Some((
                id.clone(),
                LedgerRule {
                    period_ms: rule.terms().period_ms,
                    bound_is: rule.terms().bound_is(),
                    periods,
                },
            ))
        })
        .collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::algorithm::Algorithm;
    use crate::allocation::global_rule::GlobalRule;
    use crate::allocation::ledger::PeriodAdmitted;
    use crate::rules::{Accuracy, Partition};

    pub(crate) const T0: Millis = 1_700_000_040_000;

    /// A sliding counter of 100 per 2 s with periods at T0 and T0 + 2 s
    /// finished.
    pub(crate) fn ledger() -> Ledger {
        let rules = vec![GlobalRule::new(
            "api|sw",
            100,
            Algorithm::SlidingWindowCounter,
            Accuracy::Exact,
            2_000,
            Partition::Strict,
            0.5,
        )];
        let mut ledger = Ledger::default();
        for (start, n) in [(T0, 70), (T0 + 2_000, 90)] {
            ledger.record(
                "east",
                "e-0",
                &[PeriodAdmitted {
                    rule: "api|sw".into(),
                    key: Some("acme".into()),
                    period_start_ms: start,
                    admitted: n,
                }],
                &rules,
                start + 2_100,
            );
        }
        ledger.advance(T0 + 10_000);
        ledger
    }

    #[test]
    fn a_drill_gets_the_period_it_started_in_and_every_later_one() {
        let ledger = ledger();
        // Started mid-period at T0 + 1.5 s: that period is its first.
        let from = BTreeMap::from([("api|sw".to_string(), T0 + 1_500)]);
        let figures = drill_figures(&ledger, &from);
        let rule = &figures["api|sw"];
        assert_eq!(rule.period_ms, 2_000);
        let starts: Vec<Millis> = rule.periods.keys().copied().collect();
        assert_eq!(starts, [T0, T0 + 2_000]);
        assert_eq!(rule.periods[&T0].admitted["east"], 70);
        let later = BTreeMap::from([("api|sw".to_string(), T0 + 2_000)]);
        let figures = drill_figures(&ledger, &later);
        assert_eq!(figures["api|sw"].periods.len(), 1);
    }
}
