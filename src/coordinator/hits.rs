//! Hits the regions' pods reported, asked and allowed, summed per global
//! rule and region on the leader: what `meridian ctl top` shows as
//! rejections. The rebalancer keeps only smoothed demand; this keeps the
//! plain counts, apart from it.
//!
//! Bound: one entry per (rule with an allocation, registered region), both
//! set by operators, and one per (key with an entry of its own, region) —
//! the rebalancer caps key entries per rule (`max_key_entries`). Entries of
//! any other rule, key or region are dropped at each report, so a report
//! naming made-up rules or keys adds nothing.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::proto::meridian::v1 as pb;

/// A region's hits for one global rule, as its pods reported them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Hits {
    /// Allowed + denied.
    pub asked: u64,
    /// Admitted of `asked`.
    pub allowed: u64,
}

impl Hits {
    fn add(&mut self, asked: u64, allowed: u64) {
        self.asked = self.asked.saturating_add(asked);
        self.allowed = self.allowed.saturating_add(allowed.min(asked));
    }
}

/// Region → hits.
pub type PerRegion = BTreeMap<String, Hits>;

/// Rule id → region → hits, and the same per key that has an allocation
/// entry of its own (rule id → key → region → hits).
#[derive(Debug, Default)]
pub struct ReportedHits {
    totals: BTreeMap<String, PerRegion>,
    keys: BTreeMap<String, BTreeMap<String, PerRegion>>,
}

impl ReportedHits {
    /// Adds `report`'s hits for the rules `is_rule` accepts, if
    /// `is_region(report.region)`, and per key for the keys `is_key(rule,
    /// key)` accepts; first drops what they no longer accept.
    pub fn record(
        &mut self,
        report: &pb::DemandReport,
        is_rule: impl Fn(&str) -> bool,
        is_key: impl Fn(&str, &str) -> bool,
        is_region: impl Fn(&str) -> bool,
    ) {
        self.totals.retain(|rule, per_region| {
            per_region.retain(|region, _| is_region(region));
            is_rule(rule)
        });
        self.keys.retain(|rule, keys| {
            keys.retain(|key, per_region| {
                per_region.retain(|region, _| is_region(region));
                is_key(rule, key)
            });
            !keys.is_empty()
        });
        if !is_region(&report.region) {
            return;
        }
        for rd in report.rules.iter().filter(|rd| is_rule(&rd.rule)) {
            let entry = self
                .totals
                .entry(rd.rule.clone())
                .or_default()
                .entry(report.region.clone())
                .or_default();
            for k in &rd.keys {
                entry.add(k.asked, k.allowed);
            }
            entry.add(rd.remainder_asked, rd.remainder_allowed);
            for k in rd.keys.iter().filter(|k| is_key(&rd.rule, &k.key)) {
                self.keys
                    .entry(rd.rule.clone())
                    .or_default()
                    .entry(k.key.clone())
                    .or_default()
                    .entry(report.region.clone())
                    .or_default()
                    .add(k.asked, k.allowed);
            }
        }
    }

    /// The hits of one rule, per region.
    pub fn rule(&self, rule: &str) -> PerRegion {
        self.totals.get(rule).cloned().unwrap_or_default()
    }

    /// The hits of one key of `rule` with an entry of its own, per region.
    pub fn key(&self, rule: &str, key: &str) -> PerRegion {
        self.keys
            .get(rule)
            .and_then(|keys| keys.get(key))
            .cloned()
            .unwrap_or_default()
    }

    /// Entries held, over all rules, keys and regions (the bound's test
    /// counts them).
    #[cfg(test)]
    pub fn entries(&self) -> usize {
        let keys: usize = self
            .keys
            .values()
            .flat_map(BTreeMap::values)
            .map(BTreeMap::len)
            .sum();
        self.totals.values().map(BTreeMap::len).sum::<usize>() + keys
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(region: &str, rules: &[&str], asked: u64, allowed: u64) -> pb::DemandReport {
        pb::DemandReport {
            region: region.into(),
            pod: "p".into(),
            rules: rules
                .iter()
                .map(|r| pb::RuleDemand {
                    rule: (*r).into(),
                    keys: vec![pb::KeyDemand {
                        key: "k".into(),
                        asked,
                        allowed,
                    }],
                    remainder_asked: 1,
                    remainder_allowed: 5,
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn reports_naming_made_up_rules_and_regions_add_no_entries() {
        let mut hits = ReportedHits::default();
        let is_rule = |r: &str| r == "api|fw";
        let no_key = |_: &str, _: &str| false;
        let is_region = |r: &str| r == "mumbai" || r == "hyderabad";
        let flood: Vec<String> = (0..1_000).map(|i| format!("rule-{i}")).collect();
        let mut names: Vec<&str> = flood.iter().map(String::as_str).collect();
        names.push("api|fw");
        for i in 0..1_000 {
            hits.record(
                &report(&format!("region-{i}"), &names, 10, 4),
                is_rule,
                no_key,
                is_region,
            );
            hits.record(&report("mumbai", &names, 10, 4), is_rule, no_key, is_region);
        }
        assert_eq!(hits.entries(), 1);
        // Allowed never exceeds asked, the remainder's included.
        let mumbai = hits.rule("api|fw")["mumbai"];
        assert_eq!(
            mumbai,
            Hits {
                asked: 11_000,
                allowed: 5_000
            }
        );
        // A rule that loses its allocation is dropped at the next report.
        hits.record(&report("mumbai", &[], 0, 0), |_| false, no_key, is_region);
        assert_eq!(hits.entries(), 0);
    }

    #[test]
    fn only_keys_with_an_entry_are_counted_and_a_key_flood_adds_none() {
        let mut hits = ReportedHits::default();
        let is_rule = |r: &str| r == "api|fw";
        let is_region = |r: &str| r == "mumbai";
        let mut flood = report("mumbai", &["api|fw"], 10, 4);
        flood.rules[0].keys = (0..10_000)
            .map(|i| pb::KeyDemand {
                key: format!("random-{i}"),
                asked: 1,
                allowed: 1,
            })
            .collect();
        let is_key = |r: &str, k: &str| r == "api|fw" && k == "random-7";
        hits.record(&flood, is_rule, is_key, is_region);
        // The rule's entry and one key's.
        assert_eq!(hits.entries(), 2);
        assert_eq!(
            hits.key("api|fw", "random-7")["mumbai"],
            Hits {
                asked: 1,
                allowed: 1
            }
        );
        assert_eq!(hits.rule("api|fw")["mumbai"].asked, 10_001);
        // The key loses its entry: dropped at the next report.
        hits.record(&flood, is_rule, |_, _| false, is_region);
        assert_eq!(hits.entries(), 1);
    }
}
