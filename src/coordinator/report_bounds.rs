//! A limiter's report as the coordinator takes it: every size and value
//! checked before any of it is stored, then turned into the leader's
//! [`PodReport`]. A report that breaks a bound is refused whole, with the
//! field and the bound in the status, so a misbehaving or hostile client
//! cannot grow the leader's memory or move shares with absurd numbers.

use tonic::Status;

use crate::allocation::demand::{KeyDemand, REPORT_TOP_KEYS};
use crate::allocation::leader::{PodReport, RuleDemand, RuleUse, TopUp};
use crate::allocation::ledger::PeriodAdmitted;
use crate::allocation::reserved::{KeyReserved, REPORT_RESERVED_KEYS};
use crate::allocation::{WindowUse, valid_region_name};
use crate::proto::meridian::v1 as pb;
use crate::store::key::MAX_KEY_LEN;

/// Global rules one report may carry demand, window use or top-ups for.
pub const MAX_REPORT_RULES: usize = 1_000;
/// Keys per rule and period a report may give admitted counts for (the
/// ledger follows the busiest keys; the whole rule is one more entry).
pub const MAX_ADMITTED_KEYS: usize = crate::allocation::pod::ADMITTED_TOP_KEYS;
/// Top-up requests in one report (a pod asks at most once a second per key).
pub use crate::allocation::demand::MAX_REPORT_TOP_UPS;
/// Hits one pod may report for one key or remainder in one interval: far
/// above any real pod (10⁶ checks a second for a day), low enough that sums
/// over a million keys and regions stay exact in the f64 the EWMA uses.
pub const MAX_HITS: u64 = 1 << 40;
/// The longest interval a report may cover.
pub const MAX_INTERVAL_MS: u64 = 24 * 3_600_000;
/// A pod's name: a Kubernetes pod name fits.
pub const MAX_POD_NAME: usize = 253;

fn refuse(field: &str, why: String) -> Status {
    metrics::counter!("meridian_coordinator_reports_refused_total", "field" => field.to_string())
        .increment(1);
    Status::invalid_argument(format!("report {field}: {why}"))
}

fn hits(field: &str, n: u64) -> Result<u64, Status> {
    if n > MAX_HITS {
        return Err(refuse(
            field,
            format!("{n} hits is above the bound {MAX_HITS}"),
        ));
    }
    Ok(n)
}

fn name(field: &str, text: &str, max: usize) -> Result<String, Status> {
    if text.is_empty() || text.len() > max {
        return Err(refuse(
            field,
            format!("must be 1–{max} bytes, found {}", text.len()),
        ));
    }
    Ok(text.to_string())
}

/// Longest answer to a reset (what was cleared, or why not), in bytes.
pub const MAX_RESET_DETAIL: usize = 512;

/// Checks `report` against every bound and converts it.
pub fn accept(report: &pb::DemandReport) -> Result<PodReport, Status> {
    if !valid_region_name(&report.region) {
        return Err(refuse(
            "region",
            format!(
                "{:?} is not a region name (1–64 characters of a-z, 0-9, '-' or '_')",
                truncated(&report.region)
            ),
        ));
    }
    let pod = name("pod", &report.pod, MAX_POD_NAME)?;
    if report.pod.chars().any(char::is_control) {
        return Err(refuse("pod", "holds control characters".into()));
    }
    if report.interval_ms > MAX_INTERVAL_MS {
        return Err(refuse(
            "interval_ms",
            format!(
                "{} is above the bound {MAX_INTERVAL_MS}",
                report.interval_ms
            ),
        ));
    }
    for (field, n) in [
        ("rules", report.rules.len()),
        ("used", report.used.len()),
        ("top_ups", report.top_ups.len()),
        ("admitted", report.admitted.len()),
        ("resets_applied", report.resets_applied.len()),
        ("reserved", report.reserved.len()),
    ] {
        let max = match field {
            "top_ups" => MAX_REPORT_TOP_UPS,
            // Two periods of each rule: the whole rule and its top keys.
            "admitted" => 2 * (MAX_ADMITTED_KEYS + 1) * MAX_REPORT_RULES,
            // The current window of each counted rule and the one just ended.
            "used" => 2 * MAX_REPORT_RULES,
            // Every order a region can have pending.
            "resets_applied" => crate::coordinator::resets::MAX_RESETS,
            "reserved" => REPORT_RESERVED_KEYS,
            _ => MAX_REPORT_RULES,
        };
        if n > max {
            return Err(refuse(field, format!("{n} entries, at most {max}")));
        }
    }
    for r in &report.resets_applied {
        name("resets_applied.detail", &r.detail, MAX_RESET_DETAIL)?;
    }
    let mut rules = Vec::with_capacity(report.rules.len());
    for rd in &report.rules {
        if rd.keys.len() > REPORT_TOP_KEYS {
            return Err(refuse(
                "rules.keys",
                format!(
                    "{} keys for one rule, at most {REPORT_TOP_KEYS}",
                    rd.keys.len()
                ),
            ));
        }
        let mut keys = Vec::with_capacity(rd.keys.len());
        for k in &rd.keys {
            let asked = hits("rules.keys.asked", k.asked)?;
            keys.push(KeyDemand {
                key: name("rules.keys.key", &k.key, MAX_KEY_LEN)?,
                asked,
                allowed: hits("rules.keys.allowed", k.allowed)?.min(asked),
            });
        }
        rules.push(RuleDemand {
            rule: name("rules.rule", &rd.rule, MAX_KEY_LEN)?,
            keys,
            remainder_asked: hits("rules.remainder_asked", rd.remainder_asked)?,
            remainder_allowed: hits("rules.remainder_allowed", rd.remainder_allowed)?,
        });
    }
    let mut used = Vec::with_capacity(report.used.len());
    for u in &report.used {
        used.push(RuleUse {
            rule: name("used.rule", &u.rule, MAX_KEY_LEN)?,
            window_start_ms: u.window_start_unix_ms,
            used: WindowUse {
                count: hits("used.count", u.count)?,
                cap: hits("used.cap", u.cap)?,
            },
        });
    }
    let mut top_ups = Vec::with_capacity(report.top_ups.len());
    for t in &report.top_ups {
        if !(t.per_period.is_finite() && (0.0..=MAX_HITS as f64).contains(&t.per_period)) {
            return Err(refuse(
                "top_ups.per_period",
                format!("{} is not a pace between 0 and {MAX_HITS}", t.per_period),
            ));
        }
        if t.interval_ms > MAX_INTERVAL_MS {
            return Err(refuse(
                "top_ups.interval_ms",
                format!("{} is above the bound {MAX_INTERVAL_MS}", t.interval_ms),
            ));
        }
        top_ups.push(TopUp {
            rule: name("top_ups.rule", &t.rule, MAX_KEY_LEN)?,
            key: name("top_ups.key", &t.key, MAX_KEY_LEN)?,
            per_period: t.per_period,
            interval_ms: t.interval_ms,
        });
    }
    let mut admitted = Vec::with_capacity(report.admitted.len());
    for a in &report.admitted {
        admitted.push(PeriodAdmitted {
            rule: name("admitted.rule", &a.rule, MAX_KEY_LEN)?,
            key: match a.key.as_str() {
                "" => None,
                k => Some(name("admitted.key", k, MAX_KEY_LEN)?),
            },
            period_start_ms: a.period_start_unix_ms,
            admitted: hits("admitted.admitted", a.admitted)?,
        });
    }
    let mut reserved = Vec::with_capacity(report.reserved.len());
    for r in &report.reserved {
        if r.outstanding.unsigned_abs() > MAX_HITS {
            return Err(refuse(
                "reserved.outstanding",
                format!("{} is beyond ±{MAX_HITS}", r.outstanding),
            ));
        }
        reserved.push(KeyReserved {
            rule: name("reserved.rule", &r.rule, MAX_KEY_LEN)?,
            key: name("reserved.key", &r.key, MAX_KEY_LEN)?,
            outstanding: r.outstanding,
        });
    }
    Ok(PodReport {
        reserved,
        region: report.region.clone(),
        pod,
        epoch: report.epoch,
        interval_ms: report.interval_ms,
        rules,
        used,
        top_ups,
        admitted,
    })
}

/// At most 64 characters of `text`, for an error that must not echo a
/// 200 KB name back.
fn truncated(text: &str) -> String {
    text.chars().take(64).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report() -> pb::DemandReport {
        pb::DemandReport {
            region: "mumbai".into(),
            pod: "m-0".into(),
            epoch: 3,
            interval_ms: 10_000,
            rules: vec![pb::RuleDemand {
                rule: "api|customer".into(),
                keys: vec![pb::KeyDemand {
                    key: "42".into(),
                    asked: 10,
                    allowed: 12,
                }],
                remainder_asked: 5,
                remainder_allowed: 0,
            }],
            ..Default::default()
        }
    }

    fn refused(r: &pb::DemandReport) -> String {
        match accept(r) {
            Ok(_) => panic!("accepted: {r:?}"),
            Err(s) => {
                assert_eq!(s.code(), tonic::Code::InvalidArgument);
                s.message().to_string()
            }
        }
    }

    #[test]
    fn a_sane_report_is_taken_with_allowed_capped_at_asked() {
        let got = accept(&report()).expect("accepted");
        assert_eq!(got.rules[0].keys[0].allowed, 10);
        assert_eq!((got.region.as_str(), got.pod.as_str()), ("mumbai", "m-0"));
    }

    #[test]
    fn open_reservations_are_bounded_in_count_size_and_value() {
        let key = |key: &str, outstanding| pb::KeyReserved {
            rule: "api|customer".into(),
            key: key.into(),
            outstanding,
        };
        let mut r = report();
        r.reserved = vec![key("42", -300)];
        let got = accept(&r).expect("a negative net is a pod's to report");
        assert_eq!(got.reserved[0].outstanding, -300);
        r.reserved = (0..=REPORT_RESERVED_KEYS)
            .map(|i| key(&i.to_string(), 1))
            .collect();
        assert!(refused(&r).contains("report reserved: 1001 entries"));
        r.reserved = vec![key(&"k".repeat(MAX_KEY_LEN + 1), 1)];
        assert!(refused(&r).contains("reserved.key"));
        r.reserved = vec![key("42", i64::MIN)];
        assert!(refused(&r).contains("reserved.outstanding"));
    }

    #[test]
    fn every_bound_is_enforced_and_named() {
        let mut r = report();
        r.region = format!("<script>{}\0", "x".repeat(200_000));
        let m = refused(&r);
        assert!(m.contains("report region") && m.len() < 300, "{m}");
        let mut r = report();
        r.pod = String::new();
        assert!(refused(&r).contains("report pod"));
        let mut r = report();
        r.rules[0].keys = (0..=REPORT_TOP_KEYS)
            .map(|i| pb::KeyDemand {
                key: i.to_string(),
                asked: 1,
                allowed: 1,
            })
            .collect();
        assert!(refused(&r).contains("rules.keys"));
        let mut r = report();
        r.rules[0].keys[0].key = "k".repeat(MAX_KEY_LEN + 1);
        assert!(refused(&r).contains("rules.keys.key"));
        let mut r = report();
        r.rules[0].keys[0].asked = u64::MAX;
        assert!(refused(&r).contains("rules.keys.asked"));
        let mut r = report();
        r.top_ups.push(pb::TopUp {
            rule: "api|customer".into(),
            key: "42".into(),
            per_period: f64::INFINITY,
            interval_ms: 1,
        });
        assert!(refused(&r).contains("top_ups.per_period"));
        let mut r = report();
        r.rules = (0..=MAX_REPORT_RULES)
            .map(|i| pb::RuleDemand {
                rule: i.to_string(),
                ..Default::default()
            })
            .collect();
        assert!(refused(&r).contains("report rules"));
    }
}
