//! The options that apply to a whole rule, whether it holds one limit
//! (`rate_limit`) or several (`limits`): `fail_mode`, `confirm_ban`, where it
//! is enforced (`scope`, and a global rule's `partition`, `fallback` and
//! `fallback_hold`), how exactly (`accuracy`, `sync_interval`,
//! `max_batch`), and how its cost quotas settle (`max_cost`,
//! `max_overdraft`, `settle`).

use std::time::Duration;

use marked_yaml::types::MarkedMappingNode;

use super::Cx;
use super::values::{is_null, line};
use crate::algorithm::{Algorithm, MAX_LIMIT, settle};
use crate::rules::{Accuracy, FailMode, Partition, Rule, Scope, SettleMode};

const DEFAULT_SYNC_INTERVAL: Duration = Duration::from_millis(50);
/// The longest `fallback_hold`: a week of a dead region's share held back
/// is already more than any operator means.
const MAX_FALLBACK_HOLD: Duration = Duration::from_secs(7 * 24 * 3_600);

impl Cx<'_> {
    /// `fail_mode` of a descriptor.
    pub(super) fn fail_mode(&mut self, map: &MarkedMappingNode, rule: &mut Rule) {
        if let Some(n) = map.get_node("fail_mode").filter(|n| !is_null(n)) {
            let choices = [
                ("open", FailMode::Open),
                ("closed", FailMode::Closed),
                ("local", FailMode::Local),
            ];
            rule.fail_mode = self.choice(n, "fail_mode", &choices).unwrap_or_default();
        }
    }

    /// `confirm_ban` of a descriptor (beside `rate_limit` or `limits`).
    pub(super) fn confirm_ban(&mut self, map: &MarkedMappingNode, rule: &mut Rule) {
        if let Some(n) = map.get_node("confirm_ban").filter(|n| !is_null(n)) {
            rule.confirm_ban = self.boolean(n, "confirm_ban").unwrap_or(false);
        }
    }

    /// Where a limit is enforced: `scope`, and a global rule's `partition`
    /// and `fallback`.
    pub(super) fn placement(&mut self, map: &MarkedMappingNode, rule: &mut Rule) {
        let get = |f: &str| map.get_node(f).filter(|n| !is_null(n));
        if let Some(n) = get("scope") {
            let choices = [("region", Scope::Region), ("global", Scope::Global)];
            rule.scope = self.choice(n, "scope", &choices).unwrap_or_default();
        }
        for field in ["partition", "fallback", "fallback_hold"] {
            if let Some(n) = get(field)
                && rule.scope != Scope::Global
            {
                self.err(line(n), field, "only allowed with scope: global");
            }
        }
        if let Some(n) = get("partition") {
            let choices = [
                ("strict", Partition::Strict),
                ("available", Partition::Available),
            ];
            rule.partition = self.choice(n, "partition", &choices).unwrap_or_default();
        }
        if let Some(n) = get("fallback")
            && let Some(text) = self.string(n, "fallback")
        {
            match text.trim().parse::<f64>() {
                Ok(f) if (0.0..=1.0).contains(&f) => rule.fallback = f,
                _ => self.err(
                    line(n),
                    "fallback",
                    format!("must be a number from 0.0 to 1.0, found {text:?}"),
                ),
            }
        }
        if let Some(n) = get("fallback_hold")
            && let Some(hold) = self.duration(n, "fallback_hold")
        {
            if hold > MAX_FALLBACK_HOLD {
                self.err(
                    line(n),
                    "fallback_hold",
                    format!(
                        "{hold:?} is longer than the most allowed, 7d (a longer hold strands \
                         a dead region's share for that long)"
                    ),
                );
            } else {
                rule.fallback_hold = hold;
            }
        }
    }

    pub(super) fn accuracy(
        &mut self,
        map: &MarkedMappingNode,
        rule: &mut Rule,
        algorithm: Option<Algorithm>,
    ) {
        let get = |f: &str| map.get_node(f).filter(|n| !is_null(n));
        let approximate = match get("accuracy") {
            None => false,
            Some(n) => {
                let choices = [("exact", false), ("approximate", true)];
                let approximate = self.choice(n, "accuracy", &choices).unwrap_or(false);
                if let Some(a) = algorithm.filter(|_| approximate)
                    && !a.has_approximate_path()
                {
                    self.err(
                        line(n),
                        "accuracy",
                        format!(
                            "approximate is only available for fixed_window, \
                                 sliding_window_counter and token_bucket, not {a}"
                        ),
                    );
                }
                approximate
            }
        };
        if !approximate {
            for field in ["sync_interval", "max_batch"] {
                if let Some(n) = get(field) {
                    self.err(line(n), field, "only allowed with accuracy: approximate");
                }
            }
            return;
        }
        let sync_interval = get("sync_interval")
            .and_then(|n| self.duration(n, "sync_interval"))
            .unwrap_or(DEFAULT_SYNC_INTERVAL);
        let max_batch = get("max_batch").and_then(|n| match self.integer(n, "max_batch") {
            Some(b) if b >= 1 => Some(b as u64),
            Some(b) => {
                self.err(
                    line(n),
                    "max_batch",
                    format!("must be at least 1, found {b}"),
                );
                None
            }
            None => None,
        });
        rule.accuracy = Accuracy::Approximate {
            sync_interval,
            max_batch,
        };
    }

    /// `max_cost`, `max_overdraft` and `settle` of a rule whose limits,
    /// accuracy and split are parsed (reservations and Envoy's stream-done
    /// settlement: see `algorithm::settle`). `max_overdraft` must keep every
    /// limit's arithmetic exact (below 2^53 scaled units).
    pub(super) fn cost_quota(&mut self, map: &MarkedMappingNode, rule: &mut Rule) {
        let get = |f: &str| map.get_node(f).filter(|n| !is_null(n));
        if let Some(n) = get("settle") {
            self.settle(n, rule);
        }
        if let Some(n) = get("max_cost") {
            match self.integer(n, "max_cost") {
                Some(c) if (1..=MAX_LIMIT as i64).contains(&c) => rule.max_cost = Some(c as u64),
                Some(c) => self.err(
                    line(n),
                    "max_cost",
                    format!("must be 1 to 10^15 (the most one reservation may cost), found {c}"),
                ),
                None => {}
            }
        }
        if let Some(n) = get("max_overdraft") {
            match self.integer(n, "max_overdraft") {
                Some(o) if o >= 0 => {
                    let o = o as u64;
                    let fits = rule
                        .limits()
                        .map(settle::max_exact_overdraft)
                        .min()
                        .unwrap_or(u64::MAX);
                    if o > fits {
                        self.err(
                            line(n),
                            "max_overdraft",
                            format!(
                                "{o} is more debt than this rule's limits count exactly; at \
                                 most {fits}"
                            ),
                        );
                    } else {
                        rule.max_overdraft = Some(o);
                    }
                }
                Some(o) => self.err(
                    line(n),
                    "max_overdraft",
                    format!("must be 0 (never past the limit) or more hits of debt, found {o}"),
                ),
                None => {}
            }
        }
    }
}

impl Cx<'_> {
    /// `settle: at_check | on_stream_done`. A stream-done charge settles
    /// with `algorithm::settle::charge` on the exact path, like a
    /// reservation's excess, so it needs what a reservation needs.
    fn settle(&mut self, n: &marked_yaml::Node, rule: &mut Rule) {
        let choices = [
            ("at_check", SettleMode::AtCheck),
            ("on_stream_done", SettleMode::OnStreamDone),
        ];
        let Some(mode) = self.choice(n, "settle", &choices) else {
            return;
        };
        if mode == SettleMode::OnStreamDone {
            let why = if matches!(rule.accuracy, Accuracy::Approximate { .. }) {
                Some("accuracy: approximate counts sit in each pod until a flush".to_owned())
            } else if rule.split > 1 {
                Some("split rules spread a key over sub-counters".to_owned())
            } else {
                rule.limits()
                    .find(|p| !settle::reservable(p.algorithm()))
                    .map(|p| format!("{} keeps one entry per hit", p.algorithm()))
            };
            if let Some(why) = why {
                self.err(
                    line(n),
                    "settle",
                    format!(
                        "on_stream_done needs an exact, unsplit fixed_window, \
                         sliding_window_counter, token_bucket or leaky_bucket rule: {why}"
                    ),
                );
                return;
            }
        }
        rule.settle = mode;
    }
}

#[cfg(test)]
mod tests {
    use crate::rules::{RuleFile, RuleSet};

    fn parse(fields: &str) -> Result<RuleSet, String> {
        let text = format!(
            "domain: llm\ndescriptors:\n  - key: customer\n{fields}    rate_limit: {{unit: hour, requests_per_unit: 1000}}\n"
        );
        RuleSet::parse(&[RuleFile {
            name: "rules.yaml".into(),
            text,
        }])
        .map_err(|e| e.to_string())
    }

    #[test]
    fn cost_quota_fields_default_and_are_validated_naming_the_field() {
        let rules = parse("").expect("valid");
        let rule = rules.rules().next().expect("a rule");
        let params = rule.params.as_ref().expect("params");
        assert_eq!((rule.max_cost, rule.overdraft(params)), (None, 1000));
        let rules = parse("    max_cost: 500\n    max_overdraft: 0\n").expect("valid");
        let rule = rules.rules().next().expect("a rule");
        assert_eq!((rule.max_cost, rule.max_overdraft), (Some(500), Some(0)));
        for (fields, field) in [
            ("    max_cost: 0\n", "max_cost"),
            ("    max_cost: -3\n", "max_cost"),
            ("    max_overdraft: -1\n", "max_overdraft"),
            ("    max_overdraft: 99999999999999999\n", "max_overdraft"),
        ] {
            let e = parse(fields).expect_err(fields);
            assert!(
                e.contains(&format!("rules.yaml:4: {field}")),
                "{fields}: {e}"
            );
        }
    }

    #[test]
    fn settle_defaults_to_at_check_and_is_validated_naming_the_field() {
        use crate::rules::SettleMode;
        let mode = |fields: &str| {
            parse(fields)
                .map(|rules| rules.rules().next().expect("a rule").settle)
                .map_err(|e| {
                    assert!(e.contains("rules.yaml:4: settle"), "{fields}: {e}");
                    e
                })
        };
        assert_eq!(mode(""), Ok(SettleMode::AtCheck));
        assert_eq!(mode("    settle: at_check\n"), Ok(SettleMode::AtCheck));
        assert_eq!(
            mode("    settle: on_stream_done\n"),
            Ok(SettleMode::OnStreamDone)
        );
        for (fields, says) in [
            ("    settle: later\n", "later"),
            (
                "    settle: on_stream_done\n    algorithm: sliding_window_log\n",
                "sliding_window_log keeps one entry",
            ),
            (
                "    settle: on_stream_done\n    accuracy: approximate\n",
                "approximate",
            ),
            ("    settle: on_stream_done\n    split: 4\n", "split rules"),
        ] {
            let e = mode(fields).expect_err(fields);
            assert!(e.contains(says), "{fields}: {e}");
        }
    }
}
