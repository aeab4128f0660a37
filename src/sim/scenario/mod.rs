//! Scenario files: what the world looks like (regions, pods, network,
//! failures), which rule is simulated and the traffic it sees.
//!
//! Parsed from TOML into raw structs that reject unknown fields, then
//! validated into [`Scenario`], so a typo or an impossible value fails with
//! the file, the field and the reason — never with a panic.

mod raw;
mod validate;

use std::path::Path;
use std::time::Duration;

use crate::algorithm::{Algorithm, Params};
use crate::allocation::Config;
use crate::allocation::leader::LeaderConfig;
use crate::rules::Partition;

use self::raw::RawScenario;

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
    /// Calls whose cost settles later (`[cost]`): then every hit is a call
    /// of log-normal tokens, and the run compares ways of charging it
    /// (`sim::cost`) instead of ways of dividing the limit.
    pub cost: Option<CostSpec>,
}

/// Calls that cost tokens known only when they end (`[cost]`).
#[derive(Debug, Clone, PartialEq)]
pub struct CostSpec {
    /// What a call reserves (and what "charge the estimate" charges).
    pub estimate: u64,
    /// The median call's tokens (log-normal).
    pub median: f64,
    /// The log-normal's shape: the standard deviation of ln(tokens).
    pub sigma: f64,
    /// No call costs more (the rule's `max_cost`).
    pub max_cost: u64,
    /// A call's cost is known this long after its admission, uniform
    /// between the two.
    pub settle_min_ms: i64,
    pub settle_max_ms: i64,
    /// The rule's `max_overdraft` (`None`: each region's allocation).
    pub max_overdraft: Option<u64>,
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
