//! A scenario's checks: every field in range and consistent with the
//! others, defaults filled in, errors naming the file, the field and why.

use std::collections::BTreeMap;
use std::time::Duration;

use super::raw::{RawCost, RawScenario, RawSpan};
use super::{
    CoordinatorSpec, CostSpec, RegionSpec, RuleSpec, Scenario, ScenarioError, Shape, Shift, Span,
    Surge, TrafficSpec,
};
use crate::algorithm::{Algorithm, Params};
use crate::allocation::cadence::report_interval_for;
use crate::allocation::{Config, ROUND_LEAD_MS};
use crate::rules::Partition;

/// Collects the first error with the file name attached.
struct Check<'a> {
    file: &'a str,
}

impl Check<'_> {
    fn fail<T>(
        &self,
        field: impl Into<String>,
        reason: impl Into<String>,
    ) -> Result<T, ScenarioError> {
        Err(ScenarioError {
            file: self.file.to_string(),
            field: field.into(),
            reason: reason.into(),
        })
    }

    fn ensure(
        &self,
        ok: bool,
        field: impl Into<String>,
        reason: impl Into<String>,
    ) -> Result<(), ScenarioError> {
        if ok { Ok(()) } else { self.fail(field, reason) }
    }

    fn fraction(&self, v: Option<f64>, default: f64, field: &str) -> Result<f64, ScenarioError> {
        let v = v.unwrap_or(default);
        self.ensure(
            v.is_finite() && (0.0..=1.0).contains(&v),
            field,
            format!("{v} must be between 0 and 1"),
        )?;
        Ok(v)
    }

    fn seconds(&self, v: Option<i64>, default: i64, field: &str) -> Result<i64, ScenarioError> {
        let v = v.unwrap_or(default);
        self.ensure(v > 0, field, format!("{v} must be at least 1 second"))?;
        Ok(v * 1000)
    }

    fn span(&self, s: RawSpan, duration_s: i64, field: &str) -> Result<Span, ScenarioError> {
        self.ensure(
            0 <= s.from_s && s.from_s < s.to_s,
            field,
            format!("from_s {} must be ≥ 0 and before to_s {}", s.from_s, s.to_s),
        )?;
        self.ensure(
            s.from_s < duration_s,
            field,
            format!("from_s {} is after the end ({duration_s} s)", s.from_s),
        )?;
        Ok(Span {
            from_ms: s.from_s * 1000,
            to_ms: s.to_s * 1000,
        })
    }

    fn mix(
        &self,
        mix: &BTreeMap<String, f64>,
        regions: &[RegionSpec],
        field: &str,
    ) -> Result<Vec<f64>, ScenarioError> {
        for (name, share) in mix {
            if !regions.iter().any(|r| &r.name == name) {
                return self.fail(
                    format!("{field}.{name}"),
                    format!("no region named {name:?}"),
                );
            }
            self.ensure(
                share.is_finite() && *share >= 0.0,
                format!("{field}.{name}"),
                format!("{share} must be a share ≥ 0"),
            )?;
        }
        let out: Vec<f64> = regions
            .iter()
            .map(|r| mix.get(&r.name).copied().unwrap_or(0.0))
            .collect();
        self.ensure(
            out.iter().sum::<f64>() > 0.0,
            field,
            "at least one region needs a share above 0",
        )?;
        Ok(out)
    }
}

impl Check<'_> {
    /// `[cost]`: a fixed window or sliding counter (the algorithms whose
    /// per-window settled count the report measures), estimates and costs
    /// within the rule's limit and the stores' range.
    fn cost(&self, raw: &RawCost, rule: &RuleSpec) -> Result<CostSpec, ScenarioError> {
        self.ensure(
            matches!(
                rule.algorithm,
                Algorithm::FixedWindow | Algorithm::SlidingWindowCounter
            ),
            "cost",
            format!(
                "{} is not simulated with costs (fixed_window or sliding_window_counter)",
                rule.algorithm
            ),
        )?;
        self.ensure(
            raw.estimate >= 1 && raw.estimate as u64 <= rule.limit,
            "cost.estimate",
            format!(
                "{} must be 1 to the rule's limit {}",
                raw.estimate, rule.limit
            ),
        )?;
        self.ensure(
            raw.median.is_finite() && raw.median >= 1.0,
            "cost.median",
            format!("{} must be at least 1 token", raw.median),
        )?;
        self.ensure(
            raw.sigma.is_finite() && (0.0..=4.0).contains(&raw.sigma),
            "cost.sigma",
            format!("{} must be between 0 and 4", raw.sigma),
        )?;
        self.ensure(
            raw.max_cost >= raw.estimate && raw.max_cost <= 1_000_000_000,
            "cost.max_cost",
            format!("{} must be between the estimate and 10^9", raw.max_cost),
        )?;
        let ms = |s: f64| (s * 1000.0).round() as i64;
        self.ensure(
            raw.settle_min_s.is_finite()
                && raw.settle_max_s.is_finite()
                && 0.0 <= raw.settle_min_s
                && raw.settle_min_s <= raw.settle_max_s
                && raw.settle_max_s <= 3600.0,
            "cost.settle_min_s",
            format!(
                "{}..{} must be 0 ≤ settle_min_s ≤ settle_max_s ≤ 3600",
                raw.settle_min_s, raw.settle_max_s
            ),
        )?;
        if let Some(o) = raw.max_overdraft {
            self.ensure(
                (0..=1_000_000_000).contains(&o),
                "cost.max_overdraft",
                format!("{o} must be 0 to 10^9"),
            )?;
        }
        Ok(CostSpec {
            estimate: raw.estimate as u64,
            median: raw.median,
            sigma: raw.sigma,
            max_cost: raw.max_cost as u64,
            settle_min_ms: ms(raw.settle_min_s),
            settle_max_ms: ms(raw.settle_max_s),
            max_overdraft: raw.max_overdraft.map(|o| o as u64),
        })
    }
}

impl RawScenario {
    pub(super) fn validate(self, file: &str) -> Result<Scenario, ScenarioError> {
        let c = Check { file };
        c.ensure(!self.name.trim().is_empty(), "name", "must not be empty")?;
        c.ensure(
            self.name
                .chars()
                .all(|ch| ch.is_ascii_alphanumeric() || ch == '-' || ch == '_'),
            "name",
            format!(
                "{:?} may hold only letters, digits, '-' and '_' (it names the output folder)",
                self.name
            ),
        )?;
        c.ensure(
            self.duration_s > 0,
            "duration_s",
            format!("{} must be at least 1", self.duration_s),
        )?;
        let step_ms = self.step_ms.unwrap_or(1000);
        c.ensure(
            step_ms > 0 && 1000 % step_ms == 0,
            "step_ms",
            format!("{step_ms} must divide 1000 (1, 2, 5, 10, … 1000)"),
        )?;

        let r = &self.rule;
        let algorithm: Algorithm = match r.algorithm.parse() {
            Ok(a) => a,
            Err(e) => return c.fail("rule.algorithm", e.reason),
        };
        c.ensure(
            algorithm != Algorithm::LeakyBucket,
            "rule.algorithm",
            "leaky_bucket is not simulated yet; use token_bucket for a rate with a burst",
        )?;
        c.ensure(
            r.limit >= 1,
            "rule.limit",
            format!("{} must be at least 1", r.limit),
        )?;
        c.ensure(
            r.period_s >= 1,
            "rule.period_s",
            format!("{} must be at least 1", r.period_s),
        )?;
        c.ensure(
            r.burst.is_none() || algorithm.has_burst(),
            "rule.burst",
            format!("{algorithm} has no burst"),
        )?;
        let partition = match r.partition.as_deref().unwrap_or("strict") {
            "strict" => Partition::Strict,
            "available" => Partition::Available,
            other => {
                return c.fail(
                    "rule.partition",
                    format!("{other:?}: expected \"strict\" or \"available\""),
                );
            }
        };
        let rule = RuleSpec {
            algorithm,
            limit: r.limit as u64,
            period_ms: r.period_s * 1000,
            burst: match (algorithm.has_burst(), r.burst) {
                (true, Some(b)) if b >= 1 => Some(b as u64),
                (true, Some(b)) => return c.fail("rule.burst", format!("{b} must be at least 1")),
                (true, None) => Some(r.limit as u64),
                (false, _) => None,
            },
            partition,
            fallback: c.fraction(r.fallback, 0.5, "rule.fallback")?,
            fallback_hold_ms: match r.fallback_hold_s {
                Some(s) if s < 0 => {
                    return c.fail("rule.fallback_hold_s", format!("{s} must be 0 or more"));
                }
                Some(s) => s * 1000,
                None => crate::allocation::DEFAULT_FALLBACK_HOLD_MS,
            },
        };
        if let Err(e) = Params::new(
            algorithm,
            r.limit,
            Duration::from_millis(rule.period_ms as u64),
            rule.burst.map(|b| b as i64),
        ) {
            return c.fail(format!("rule.{}", e.field), e.reason);
        }
        c.ensure(
            rule.period_ms % step_ms == 0,
            "step_ms",
            "must divide the rule's period",
        )?;

        let k = &self.coordinator;
        let defaults = Config::default();
        // Units here (whole seconds, fractions); ranges and consistency in
        // `LeaderConfig::check`, the coordinator's own check, below.
        let config = Config {
            lease_ms: c.seconds(k.lease_s, defaults.lease_ms / 1000, "coordinator.lease_s")?,
            suspect_after_ms: c.seconds(
                k.suspect_after_s,
                defaults.suspect_after_ms / 1000,
                "coordinator.suspect_after_s",
            )?,
            skew_margin_ms: k.skew_margin_ms.unwrap_or(defaults.skew_margin_ms),
            ewma_alpha: k.ewma_alpha.unwrap_or(defaults.ewma_alpha),
            headroom: k.headroom.unwrap_or(defaults.headroom),
            floor: k.floor.unwrap_or(defaults.floor),
            hysteresis: k.hysteresis.unwrap_or(defaults.hysteresis),
            max_shift: k.max_shift,
            max_key_entries: k.max_key_entries.unwrap_or(defaults.max_key_entries),
        };
        let mut outages = Vec::new();
        for (i, s) in k.outages.iter().enumerate() {
            outages.push(c.span(*s, self.duration_s, &format!("coordinator.outages[{i}]"))?);
        }
        let rebalance_interval_ms = c.seconds(
            k.rebalance_interval_s,
            60,
            "coordinator.rebalance_interval_s",
        )?;
        let coordinator = CoordinatorSpec {
            rebalance_interval_ms,
            // The coordinator's default: 5 s, or a quarter of a shorter interval.
            round_lead_ms: k
                .round_lead_ms
                .unwrap_or(ROUND_LEAD_MS.min(rebalance_interval_ms / 4)),
            report_interval_ms: match (k.report_interval_s, k.report_interval_ms) {
                (Some(_), Some(_)) => {
                    return c.fail(
                        "coordinator.report_interval_ms",
                        "give report_interval_s or report_interval_ms, not both",
                    );
                }
                (Some(s), None) => c.seconds(Some(s), 0, "coordinator.report_interval_s")?,
                (None, Some(ms)) => {
                    c.ensure(
                        ms >= 1,
                        "coordinator.report_interval_ms",
                        format!("{ms} must be at least 1"),
                    )?;
                    ms
                }
                (None, None) => report_interval_for(rebalance_interval_ms) as i64,
            },
            report_jitter: {
                let v = k.report_jitter.unwrap_or(0.0);
                c.ensure(
                    v.is_finite() && (0.0..=0.9).contains(&v),
                    "coordinator.report_jitter",
                    format!("{v} must be between 0 and 0.9 (a fraction of the interval)"),
                )?;
                v
            },
            report_late_ms: {
                let v = k.report_late_ms.unwrap_or(0);
                c.ensure(
                    (0..=600_000).contains(&v),
                    "coordinator.report_late_ms",
                    format!("{v} must be between 0 and 600000"),
                )?;
                v
            },
            report_loss: c.fraction(k.report_loss, 0.0, "coordinator.report_loss")?,
            top_n: {
                let v = k.top_n.unwrap_or(100);
                c.ensure(v >= 1, "coordinator.top_n", "must be at least 1")?;
                v
            },
            top_up: k.top_up.unwrap_or(true),
            config,
            outages,
        };
        if let Err(refused) = coordinator.leader_config().check() {
            return c.fail(refused.setting.field(), refused.reason);
        }

        c.ensure(
            !self.region.is_empty(),
            "region",
            "at least one [[region]] is needed",
        )?;
        let count = self.region.len();
        let mut regions = Vec::new();
        for (i, raw) in self.region.iter().enumerate() {
            let field = |f: &str| format!("region[{i}].{f}");
            c.ensure(!raw.name.is_empty(), field("name"), "must not be empty")?;
            c.ensure(
                !regions.iter().any(|r: &RegionSpec| r.name == raw.name),
                field("name"),
                format!("{:?} is listed twice", raw.name),
            )?;
            let weight = raw.weight.unwrap_or(1.0);
            c.ensure(
                weight.is_finite() && weight > 0.0,
                field("weight"),
                format!("{weight} must be above 0"),
            )?;
            let pods = raw.pods.unwrap_or(3);
            c.ensure(
                (1..=64).contains(&pods),
                field("pods"),
                format!("{pods} must be between 1 and 64"),
            )?;
            let latency_ms = raw.latency_ms.unwrap_or(30);
            c.ensure(
                (0..=10_000).contains(&latency_ms),
                field("latency_ms"),
                format!("{latency_ms} must be between 0 and 10000"),
            )?;
            let mut partitions = Vec::new();
            for (j, s) in raw.partitions.iter().enumerate() {
                partitions.push(c.span(
                    *s,
                    self.duration_s,
                    &field(&format!("partitions[{j}]")),
                )?);
            }
            let mut failures = Vec::new();
            for (j, s) in raw.failures.iter().enumerate() {
                failures.push(c.span(*s, self.duration_s, &field(&format!("failures[{j}]")))?);
            }
            let peak_hour = raw.peak_hour.unwrap_or(24.0 * i as f64 / count as f64);
            c.ensure(
                peak_hour.is_finite() && (0.0..24.0).contains(&peak_hour),
                field("peak_hour"),
                format!("{peak_hour} must be in [0, 24)"),
            )?;
            regions.push(RegionSpec {
                name: raw.name.clone(),
                weight,
                pods,
                latency_ms,
                partitions,
                failures,
                peak_hour,
            });
        }

        let t = &self.traffic;
        c.ensure(
            (1..=10_000_000).contains(&t.customers),
            "traffic.customers",
            format!("{} must be between 1 and 10000000", t.customers),
        )?;
        let zipf = t.zipf.unwrap_or(0.0);
        c.ensure(
            zipf.is_finite() && (0.0..=5.0).contains(&zipf),
            "traffic.zipf",
            format!("{zipf} must be between 0 and 5"),
        )?;
        c.ensure(
            t.rate.is_finite() && t.rate > 0.0 && t.rate <= 1e7,
            "traffic.rate",
            format!(
                "{} must be above 0 (hits per second) and at most 1e7",
                t.rate
            ),
        )?;
        let shape = match t.shape.as_deref().unwrap_or("steady") {
            "steady" => Shape::Steady,
            "follow_the_sun" => Shape::FollowTheSun,
            other => {
                return c.fail(
                    "traffic.shape",
                    format!("{other:?}: expected \"steady\" or \"follow_the_sun\""),
                );
            }
        };
        let mix = match &t.mix {
            Some(m) => c.mix(m, &regions, "traffic.mix")?,
            None => regions.iter().map(|r| r.weight).collect(),
        };
        let mut shifts = Vec::new();
        for (i, s) in t.shift.iter().enumerate() {
            let field = format!("traffic.shift[{i}]");
            c.ensure(
                (0..self.duration_s).contains(&s.at_s),
                format!("{field}.at_s"),
                format!("{} is outside the run (0..{} s)", s.at_s, self.duration_s),
            )?;
            shifts.push(Shift {
                at_ms: s.at_s * 1000,
                mix: c.mix(&s.mix, &regions, &format!("{field}.mix"))?,
            });
        }
        shifts.sort_by_key(|s| s.at_ms);
        let mut surges = Vec::new();
        for (i, s) in t.surge.iter().enumerate() {
            let field = format!("traffic.surge[{i}]");
            let span = c.span(
                RawSpan {
                    from_s: s.from_s,
                    to_s: s.to_s,
                },
                self.duration_s,
                &field,
            )?;
            let region = match &s.region {
                None => None,
                Some(name) => match regions.iter().position(|r| &r.name == name) {
                    Some(i) => Some(i),
                    None => {
                        return c.fail(
                            format!("{field}.region"),
                            format!("no region named {name:?}"),
                        );
                    }
                },
            };
            if let Some(list) = &s.customers
                && let Some(bad) = list.iter().find(|&&k| k >= t.customers)
            {
                return c.fail(
                    format!("{field}.customers"),
                    format!(
                        "customer {bad} does not exist (customers are 0..{})",
                        t.customers
                    ),
                );
            }
            c.ensure(
                s.factor.is_finite() && s.factor >= 0.0 && s.factor <= 1e4,
                format!("{field}.factor"),
                format!("{} must be between 0 and 10000", s.factor),
            )?;
            surges.push(Surge {
                span,
                region,
                customers: s.customers.clone(),
                factor: s.factor,
            });
        }
        let cost = match &self.cost {
            Some(raw) => Some(c.cost(raw, &rule)?),
            None => None,
        };
        Ok(Scenario {
            cost,
            name: self.name,
            description: self.description,
            duration_ms: self.duration_s * 1000,
            step_ms,
            rule,
            coordinator,
            regions,
            traffic: TrafficSpec {
                customers: t.customers,
                zipf,
                rate: t.rate,
                shape,
                mix,
                shifts,
                surges,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scenario(coordinator: &str) -> Result<Scenario, ScenarioError> {
        let text = format!(
            "name = \"t\"\nduration_s = 60\n\n[rule]\nalgorithm = \"fixed_window\"\nlimit = 200\nperiod_s = 10\n\n[coordinator]\n{coordinator}\n\n[[region]]\nname = \"a\"\n\n[traffic]\ncustomers = 1\nrate = 10.0\n"
        );
        Scenario::parse("t.toml", &text)
    }

    fn field(e: Result<Scenario, ScenarioError>) -> String {
        e.map(|_| "accepted".to_string())
            .unwrap_or_else(|e| e.field)
    }

    #[test]
    fn the_report_interval_is_the_coordinators_unless_a_scenario_sets_one() {
        let interval = |c: &str| scenario(c).map(|s| s.coordinator.report_interval_ms);
        // As the coordinator gives it: 10 s at 60 s rounds, 1 s at 2 s.
        assert_eq!(interval(""), Ok(10_000));
        assert_eq!(interval("rebalance_interval_s = 2"), Ok(1_000));
        // Set, as a limiter flag would (old files keep loading).
        assert_eq!(
            interval("rebalance_interval_s = 2\nreport_interval_s = 10"),
            Ok(10_000)
        );
        assert_eq!(interval("report_interval_ms = 250"), Ok(250));
        assert_eq!(
            field(scenario("report_interval_s = 1\nreport_interval_ms = 500")),
            "coordinator.report_interval_ms"
        );
        assert_eq!(
            field(scenario("report_interval_ms = 0")),
            "coordinator.report_interval_ms"
        );
    }

    #[test]
    fn a_cost_table_is_checked_naming_the_field() {
        let with = |cost: &str| {
            let text = format!(
                "name = \"t\"\nduration_s = 60\n\n[rule]\nalgorithm = \"fixed_window\"\nlimit = 2000\nperiod_s = 10\n\n[[region]]\nname = \"a\"\n\n[traffic]\ncustomers = 1\nrate = 1.0\n\n[cost]\n{cost}\n"
            );
            Scenario::parse("t.toml", &text)
        };
        let good = "estimate = 100\nmedian = 60.0\nsigma = 1.0\nmax_cost = 1000\nsettle_min_s = 1.0\nsettle_max_s = 5.0";
        let cost = with(good).expect("valid").cost.expect("a cost table");
        assert_eq!(
            (
                cost.estimate,
                cost.settle_min_ms,
                cost.settle_max_ms,
                cost.max_overdraft
            ),
            (100, 1_000, 5_000, None)
        );
        for (bad, what, field_name) in [
            ("estimate = 100", "estimate = 0", "cost.estimate"),
            ("estimate = 100", "estimate = 5000", "cost.estimate"),
            ("sigma = 1.0", "sigma = nan", "cost.sigma"),
            ("median = 60.0", "median = 0.5", "cost.median"),
            ("max_cost = 1000", "max_cost = 50", "cost.max_cost"),
            (
                "settle_max_s = 5.0",
                "settle_max_s = 0.5",
                "cost.settle_min_s",
            ),
        ] {
            assert_eq!(field(with(&good.replace(bad, what))), field_name, "{what}");
        }
        assert_eq!(
            field(with(&format!("{good}\nmax_overdraft = -1"))),
            "cost.max_overdraft"
        );
        assert_eq!(field(with(&format!("{good}\nunknown = 1"))), "toml");
    }

    #[test]
    fn a_lease_no_longer_than_suspect_after_is_refused_naming_the_field() {
        let refused = scenario("lease_s = 20").expect_err("20 s lease, suspect after 20 s");
        assert_eq!(refused.field, "coordinator.lease_s");
        assert!(
            refused
                .reason
                .contains("must be longer than the suspect-after time (20 s)"),
            "{}",
            refused.reason
        );
        assert!(scenario("lease_s = 180").is_ok());
        assert!(scenario("lease_s = 30").is_ok());
    }

    #[test]
    fn jitter_and_lateness_default_to_none_and_are_bounded() {
        let s = scenario("").expect("valid");
        assert_eq!(
            (s.coordinator.report_jitter, s.coordinator.report_late_ms),
            (0.0, 0)
        );
        let s = scenario("report_jitter = 0.2\nreport_late_ms = 3000").expect("valid");
        assert_eq!(
            (s.coordinator.report_jitter, s.coordinator.report_late_ms),
            (0.2, 3_000)
        );
        assert_eq!(
            field(scenario("report_jitter = 1.5")),
            "coordinator.report_jitter"
        );
        assert_eq!(
            field(scenario("report_late_ms = -1")),
            "coordinator.report_late_ms"
        );
    }
}
