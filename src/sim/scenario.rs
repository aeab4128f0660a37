//! Scenario files: what the world looks like (regions, pods, network,
//! failures), which rule is simulated and the traffic it sees.
//!
//! Parsed from TOML into raw structs that reject unknown fields, then
//! validated into [`Scenario`], so a typo or an impossible value fails with
//! the file, the field and the reason — never with a panic.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

use crate::algorithm::{Algorithm, Params};
use crate::allocation::cadence::report_interval_for;
use crate::allocation::leader::LeaderConfig;
use crate::allocation::{Config, ROUND_LEAD_MS};
use crate::rules::Partition;

/// A scenario file that cannot be used.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{file}: {field}: {reason}")]
pub struct ScenarioError {
    /// The scenario file's path as given, cited first in the message.
    pub file: String,
    /// Dotted path of the offending field (`region[1].latency_ms`), or
    /// `toml` for a syntax error.
    pub field: String,
    /// What is wrong with the value, and what is accepted.
    pub reason: String,
}

/// A validated scenario. Times are milliseconds from the simulation start.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// Short name, used for the results folder and the report headings.
    pub name: String,
    /// What the scenario shows, in prose, for the report (may be empty).
    pub description: String,
    /// How long the simulated run lasts.
    pub duration_ms: i64,
    /// Traffic is generated and checked once per step.
    pub step_ms: i64,
    /// The one global rule simulated.
    pub rule: RuleSpec,
    /// How the coordinator (or its stand-in, for other strategies) behaves.
    pub coordinator: CoordinatorSpec,
    /// The regions, in file order: every per-region vector follows this order.
    pub regions: Vec<RegionSpec>,
    /// Who asks for how much, where and when.
    pub traffic: TrafficSpec,
}

/// The simulated global rule: one world-wide limit, divided between regions.
#[derive(Debug, Clone)]
pub struct RuleSpec {
    /// The algorithm each region's counters run (not leaky_bucket: not simulated yet).
    pub algorithm: Algorithm,
    /// The world-wide limit per period (the refill per period for buckets).
    pub limit: u64,
    /// The rule's period; windows of the report are this long.
    pub period_ms: i64,
    /// Token bucket only: world-wide burst, split between regions like the rate.
    pub burst: Option<u64>,
    /// Whether a silent region's share may be re-granted before its lease ends.
    pub partition: Partition,
    /// Share of the static allocation a region keeps once its lease lapses
    /// (0.0–1.0, default 0.5), as `Rule::fallback`.
    pub fallback: f64,
    /// How long a region keeps `fallback` after its lease lapsed (default
    /// 60 s), as `Rule::fallback_hold`.
    pub fallback_hold_ms: i64,
}

impl RuleSpec {
    /// Parameters enforcing `allocation` of the limit; `None` admits nothing.
    pub fn params(&self, allocation: u64) -> Option<Params> {
        if allocation == 0 {
            return None;
        }
        let burst = self.burst.map(|b| {
            // The burst is split in the same proportion as the rate, so the
            // regions' bursts never sum above the world-wide one.
            (u128::from(b) * u128::from(allocation) / u128::from(self.limit.max(1))) as i64
        });
        if burst == Some(0) {
            return None;
        }
        let period = Duration::from_millis(self.period_ms as u64);
        Params::new(self.algorithm, allocation as i64, period, burst).ok()
    }

    pub(crate) fn windowed(&self) -> bool {
        !self.algorithm.has_burst()
    }
}

/// The coordinator's timing, report path and rebalancer tuning.
#[derive(Debug, Clone)]
pub struct CoordinatorSpec {
    /// A full round (EWMA roll) runs this often.
    pub rebalance_interval_ms: i64,
    /// Scheduled rounds end this long before a multiple of the interval
    /// (default as the coordinator's `--round-lead`: 5 s, or a quarter of a
    /// shorter interval).
    pub round_lead_ms: i64,
    /// Each pod reports its demand this often: by default what the
    /// coordinator gives limiters for `rebalance_interval_ms`
    /// (`allocation::cadence::report_interval_for`); `report_interval_s` or
    /// `report_interval_ms` set it, as a limiter's `--report-interval` would
    /// (there a flag may only shorten it; a scenario may set any value, to
    /// show what an old limiter does).
    pub report_interval_ms: i64,
    /// Each pod's next report is due `report_interval_ms × (1 ± jitter)`
    /// after its last (uniform, from the seed; 0–0.9, default 0): timers
    /// of real pods drift.
    pub report_jitter: f64,
    /// Probability that one pod report is lost on the way.
    pub report_loss: f64,
    /// A report's delivery takes up to this much longer than the region's
    /// latency (uniform 0..=late, from the seed; default 0): late reports
    /// arrive after later ones.
    pub report_late_ms: i64,
    /// Keys per report; the rest is folded into a remainder.
    pub top_n: usize,
    /// Early top-up (Meridian only).
    pub top_up: bool,
    /// The rebalancer's tuning (lease, suspect-after, EWMA, headroom, floor, …).
    pub config: Config,
    /// Spans during which no coordinator is reachable.
    pub outages: Vec<Span>,
}

impl CoordinatorSpec {
    /// The leader these settings run: the coordinator's own, configured as
    /// the coordinator's flags would configure it.
    pub fn leader_config(&self) -> LeaderConfig {
        LeaderConfig {
            rebalancer: self.config.clone(),
            rebalance_interval_ms: self.rebalance_interval_ms,
            round_lead_ms: self.round_lead_ms,
            top_up: self.top_up,
        }
    }
}

/// One region: its pods, its link to the coordinator and its outages.
#[derive(Debug, Clone)]
pub struct RegionSpec {
    /// The region's name, as the mixes and surges refer to it.
    pub name: String,
    /// Relative weight (> 0, default 1): the static split, the default mix, and
    /// the headroom's division when capacity is scarce.
    pub weight: f64,
    /// Limiter pods in the region; each keeps its own local view and reports.
    pub pods: usize,
    /// One way, region ↔ coordinator (and ↔ the ideal global counter).
    pub latency_ms: i64,
    /// Cut off from the coordinator; traffic is still served.
    pub partitions: Vec<Span>,
    /// Down: serves nothing, its traffic fails over to the other regions.
    pub failures: Vec<Span>,
    /// Hour (UTC) at which follow-the-sun demand peaks here.
    pub peak_hour: f64,
}

/// A half-open interval of simulated time, `[from_ms, to_ms)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    /// Start, included.
    pub from_ms: i64,
    /// End, excluded.
    pub to_ms: i64,
}

impl Span {
    pub(crate) fn contains(&self, t: i64) -> bool {
        self.from_ms <= t && t < self.to_ms
    }
}

/// How the regional mix of traffic evolves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// The regional mix changes only at `shift`s.
    Steady,
    /// Each region's share rises and falls with its local day.
    FollowTheSun,
}

/// The demand: customers with Zipf-distributed rates, split over regions by a mix.
#[derive(Debug, Clone)]
pub struct TrafficSpec {
    /// Customers (keys) asking; key k is customer k, key 0 the heaviest.
    pub customers: usize,
    /// Customer k (from 0) asks for `rate / (k + 1)^zipf` hits per second.
    pub zipf: f64,
    /// Hits per second customer 0 asks for (see `zipf`).
    pub rate: f64,
    /// Whether the mix follows only the shifts, or the sun.
    pub shape: Shape,
    /// Regional shares (in region order) before the first shift.
    pub mix: Vec<f64>,
    /// Mix changes, in time order.
    pub shifts: Vec<Shift>,
    /// Demand multipliers over spans of time.
    pub surges: Vec<Surge>,
}

/// A change of the regional mix at one instant.
#[derive(Debug, Clone)]
pub struct Shift {
    /// When the new mix applies.
    pub at_ms: i64,
    /// Regional shares from then on, in region order.
    pub mix: Vec<f64>,
}

/// Demand multiplied by `factor` for some customers in some regions.
#[derive(Debug, Clone)]
pub struct Surge {
    /// When the surge lasts.
    pub span: Span,
    /// Region index; `None` = every region.
    pub region: Option<usize>,
    /// `None` = every customer.
    pub customers: Option<Vec<usize>>,
    /// What demand is multiplied by during `span`.
    pub factor: f64,
}

impl Scenario {
    /// Reads and validates a scenario file; errors name the file, the field and why.
    pub fn load(path: &Path) -> Result<Scenario, ScenarioError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| ScenarioError {
            file: file.clone(),
            field: "file".into(),
            reason: format!("cannot read: {e}"),
        })?;
        Scenario::parse(&file, &text)
    }

    /// `file` names the source in errors.
    pub fn parse(file: &str, text: &str) -> Result<Scenario, ScenarioError> {
        let raw: RawScenario = toml::from_str(text).map_err(|e| ScenarioError {
            file: file.to_string(),
            field: "toml".into(),
            reason: e.to_string().trim_end().replace('\n', " "),
        })?;
        raw.validate(file)
    }

    /// Times at which demand moves between regions (catch-up is measured
    /// from each).
    pub fn shift_times(&self) -> Vec<i64> {
        let mut t: Vec<i64> = self.traffic.shifts.iter().map(|s| s.at_ms).collect();
        for s in &self.traffic.surges {
            t.extend([s.span.from_ms, s.span.to_ms]);
        }
        for r in &self.regions {
            for f in &r.failures {
                t.extend([f.from_ms, f.to_ms]);
            }
        }
        t.retain(|&x| x > 0 && x < self.duration_ms);
        t.sort_unstable();
        t.dedup();
        t
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawScenario {
    name: String,
    #[serde(default)]
    description: String,
    duration_s: i64,
    step_ms: Option<i64>,
    rule: RawRule,
    #[serde(default)]
    coordinator: RawCoordinator,
    region: Vec<RawRegion>,
    traffic: RawTraffic,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRule {
    algorithm: String,
    limit: i64,
    period_s: i64,
    burst: Option<i64>,
    partition: Option<String>,
    fallback: Option<f64>,
    fallback_hold_s: Option<i64>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawCoordinator {
    rebalance_interval_s: Option<i64>,
    round_lead_ms: Option<i64>,
    report_interval_s: Option<i64>,
    report_interval_ms: Option<i64>,
    report_jitter: Option<f64>,
    report_loss: Option<f64>,
    report_late_ms: Option<i64>,
    top_n: Option<usize>,
    top_up: Option<bool>,
    lease_s: Option<i64>,
    suspect_after_s: Option<i64>,
    skew_margin_ms: Option<i64>,
    ewma_alpha: Option<f64>,
    headroom: Option<f64>,
    floor: Option<f64>,
    hysteresis: Option<f64>,
    max_shift: Option<f64>,
    max_key_entries: Option<usize>,
    #[serde(default)]
    outages: Vec<RawSpan>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRegion {
    name: String,
    weight: Option<f64>,
    pods: Option<usize>,
    latency_ms: Option<i64>,
    #[serde(default)]
    partitions: Vec<RawSpan>,
    #[serde(default)]
    failures: Vec<RawSpan>,
    peak_hour: Option<f64>,
}

#[derive(Deserialize, Clone, Copy)]
#[serde(deny_unknown_fields)]
struct RawSpan {
    from_s: i64,
    to_s: i64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTraffic {
    customers: usize,
    zipf: Option<f64>,
    rate: f64,
    shape: Option<String>,
    mix: Option<BTreeMap<String, f64>>,
    #[serde(default)]
    shift: Vec<RawShift>,
    #[serde(default)]
    surge: Vec<RawSurge>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawShift {
    at_s: i64,
    mix: BTreeMap<String, f64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSurge {
    from_s: i64,
    to_s: i64,
    region: Option<String>,
    customers: Option<Vec<usize>>,
    factor: f64,
}

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

impl RawScenario {
    fn validate(self, file: &str) -> Result<Scenario, ScenarioError> {
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
        Ok(Scenario {
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
