//! Keys with an override, in the leader's units. An override `O` on a
//! `scope: global` rule of limit `L` is the key's world-wide limit, and each
//! region enforces the share `granted × O / L` of it (the limiter's
//! `Global::limit`). The leader divides `L` by demand, so it must see that
//! key's demand in the same units: hits × `L / O`. Without it a region
//! asking less than its share of `O` but more than its share of `L` would
//! hold capacity it cannot use while another region starves. The ledger
//! counts such a key's admitted hits in the same units, so its figure
//! against `L` reads as the key's use of its own limit.

use std::borrow::Cow;
use std::collections::HashMap;

use super::pod_report::PodReport;
use crate::overrides::Override;

/// The override of each overridden key of a global rule, by rule and key.
#[derive(Debug, Default)]
pub struct OverrideScale {
    version: Option<u64>,
    /// When the first override held lapses: the set must be taken again
    /// then, as limiters stop enforcing it by themselves.
    valid_until_ms: Option<i64>,
    by_rule: HashMap<String, HashMap<String, u64>>,
}

impl OverrideScale {
    /// Whether the overrides held are those of set `version` in force at `now`.
    pub fn is_current(&self, version: u64, now_ms: i64) -> bool {
        self.version == Some(version) && self.valid_until_ms.is_none_or(|t| now_ms < t)
    }

    /// Holds the overrides of set `version` in force at `now` from now on.
    pub fn set<'a>(
        &mut self,
        version: u64,
        overrides: impl IntoIterator<Item = &'a Override>,
        now_ms: i64,
    ) {
        self.version = Some(version);
        self.valid_until_ms = None;
        self.by_rule.clear();
        for o in overrides.into_iter().filter(|o| o.live_at(now_ms)) {
            if let Some(t) = o.expires_at_unix_ms {
                self.valid_until_ms = Some(self.valid_until_ms.map_or(t, |v| v.min(t)));
            }
            self.by_rule
                .entry(o.rule.clone())
                .or_default()
                .insert(o.key.clone(), o.limit.max(1));
        }
    }

    /// `report` with every overridden key's demand, top-up pace and admitted
    /// counts in its rule's units (`limit_of` gives a rule's `L`); borrowed
    /// as is when it names no overridden key.
    pub fn normalize<'a>(
        &self,
        report: &'a PodReport,
        limit_of: impl Fn(&str) -> Option<u64>,
    ) -> Cow<'a, PodReport> {
        if self.by_rule.is_empty() {
            return Cow::Borrowed(report);
        }
        let factor = |rule: &str, key: &str| -> Option<f64> {
            let o = *self.by_rule.get(rule)?.get(key)?;
            Some(limit_of(rule)? as f64 / o as f64)
        };
        let touches = report
            .rules
            .iter()
            .any(|r| r.keys.iter().any(|k| factor(&r.rule, &k.key).is_some()))
            || report
                .top_ups
                .iter()
                .any(|t| factor(&t.rule, &t.key).is_some())
            || report.admitted.iter().any(|a| {
                a.key
                    .as_deref()
                    .is_some_and(|k| factor(&a.rule, k).is_some())
            });
        if !touches {
            return Cow::Borrowed(report);
        }
        let scaled = |n: u64, f: f64| (n as f64 * f).round() as u64;
        let mut out = report.clone();
        for r in &mut out.rules {
            for k in &mut r.keys {
                if let Some(f) = factor(&r.rule, &k.key) {
                    k.asked = scaled(k.asked, f);
                    k.allowed = scaled(k.allowed, f);
                }
            }
        }
        for t in &mut out.top_ups {
            if let Some(f) = factor(&t.rule, &t.key) {
                t.per_period *= f;
            }
        }
        for a in &mut out.admitted {
            if let Some(f) = a.key.as_deref().and_then(|k| factor(&a.rule, k)) {
                a.admitted = scaled(a.admitted, f);
            }
        }
        Cow::Owned(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::allocation::demand::KeyDemand;
    use crate::allocation::ledger::PeriodAdmitted;
    use crate::allocation::pod_report::RuleDemand;

    #[test]
    fn an_overridden_keys_demand_and_admitted_hits_are_in_its_rules_units() {
        let mut scale = OverrideScale::default();
        let report = PodReport {
            rules: vec![RuleDemand {
                rule: "api|customer".into(),
                keys: vec![
                    KeyDemand {
                        key: "customer=42".into(),
                        asked: 900,
                        allowed: 600,
                    },
                    KeyDemand {
                        key: "customer=43".into(),
                        asked: 90,
                        allowed: 90,
                    },
                ],
                ..RuleDemand::default()
            }],
            admitted: vec![PeriodAdmitted {
                rule: "api|customer".into(),
                key: Some("customer=42".into()),
                period_start_ms: 0,
                admitted: 300,
            }],
            ..PodReport::default()
        };
        let limit = |_: &str| Some(100);
        assert!(matches!(scale.normalize(&report, limit), Cow::Borrowed(_)));
        let o = |key: &str, expires| Override {
            domain: "api".into(),
            entries: Vec::new(),
            rule: "api|customer".into(),
            rule_name: None,
            key: key.into(),
            limit: 300,
            burst: None,
            expires_at_unix_ms: expires,
            reason: String::new(),
            set_by: String::new(),
            set_at_unix_ms: 0,
        };
        let held = [o("customer=42", Some(5_000)), o("customer=41", Some(1_000))];
        scale.set(3, &held, 2_000);
        assert!(scale.is_current(3, 4_999));
        assert!(!scale.is_current(3, 5_000), "42's expiry moves the set");
        assert!(!scale.is_current(4, 2_000));
        let n = scale.normalize(&report, limit);
        assert_eq!(n.rules[0].keys[0].asked, 300, "900 of 300 = 300 of 100");
        assert_eq!(n.rules[0].keys[1].asked, 90, "not overridden");
        assert_eq!(n.admitted[0].admitted, 100);
        // A rule the leader does not know (not global) is left as is.
        assert!(matches!(
            scale.normalize(&report, |_| None),
            Cow::Borrowed(_)
        ));
    }
}
