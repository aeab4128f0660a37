//! The validated rule model the limiter and the coordinator consume.

use std::sync::Arc;
use std::time::Duration;

use crate::algorithm::Params;

/// One rule file handed to the parser: its name (used in every error
/// message, usually the path) and its YAML text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleFile {
    pub name: String,
    pub text: String,
}

/// Envoy's rate limit units, plus `Custom` for Meridian's `period` field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    Second,
    Minute,
    Hour,
    Day,
    Week,
    /// 30 days, as envoyproxy/ratelimit counts it.
    Month,
    /// 365 days, as envoyproxy/ratelimit counts it.
    Year,
    /// A `period:` that is none of the above.
    Custom(Duration),
}

/// What the limiter does when the store errors or misses its deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FailMode {
    /// Allow (Envoy's own default when the limiter is unreachable).
    #[default]
    Open,
    /// Deny.
    Closed,
    /// Enforce limit ÷ pods-in-region in process memory.
    Local,
}

/// Region: each region enforces the limit on its own. Global: one limit for
/// the world, divided between regions by the coordinator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Scope {
    #[default]
    Region,
    Global,
}

/// Exact: one atomic script per check. Approximate (fixed_window,
/// sliding_window_counter, token_bucket): decided in process from the last
/// global count + local hits, flushed every `sync_interval` or `max_batch`
/// hits. Bound: admitted ≤ L + pods × max_batch per window (token bucket:
/// ≤ B + R·T + pods × max_batch); see `limiter::batcher`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Accuracy {
    #[default]
    Exact,
    Approximate {
        /// Longest a local hit waits before it is flushed (default 50 ms).
        sync_interval: Duration,
        /// Local hits per key that force a flush, and the most a pod may hold
        /// unseen by others. `None`: limit / 100, at least 1.
        max_batch: Option<u64>,
    },
}

/// How a global rule behaves when a region is cut off from the coordinator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Partition {
    /// Never re-grant a silent region's share before its lease expires.
    #[default]
    Strict,
    /// Re-grant after `suspect_after` (overshoot ≤ that region's allocation for one lease).
    Available,
}

/// One limit in a rule file, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    /// Stable, unique id: domain plus the (key, value pattern) path of the tree
    /// node, escaped. Part of every storage key, so it must not change when
    /// unrelated rules are edited.
    pub id: String,
    pub domain: String,
    /// `rate_limit.name`, if given.
    pub name: Option<String>,
    /// `rate_limit.unlimited: true`: matched, never limited, nothing counted.
    pub unlimited: bool,
    /// `requests_per_unit` (0 when unlimited).
    pub requests_per_unit: u64,
    pub unit: Unit,
    /// Algorithm, limit, period, burst. `None` when unlimited.
    pub params: Option<Params>,
    pub shadow_mode: bool,
    pub detailed_metric: bool,
    /// Names of rules this one replaces when both match one request.
    pub replaces: Vec<String>,
    pub fail_mode: FailMode,
    pub scope: Scope,
    pub accuracy: Accuracy,
    /// Hot-key split into this many sub-counters (1 = no split), each with
    /// limit / K: admitted ≤ L, ≥ L − K × (cost − 1) once demand reaches every
    /// sub-counter; see `limiter::split`.
    pub split: u32,
    pub partition: Partition,
    /// Share of the static allocation kept when a global rule's lease lapses (0.0–1.0).
    pub fallback: f64,
    /// Where the rule was written: file name and 1-based line.
    pub file: String,
    pub line: usize,
}

/// The outcome of matching a descriptor.
#[derive(Debug, Clone)]
pub struct Resolved<'a> {
    /// `None` when the path ends at a node without `rate_limit` (an allow-list entry).
    pub rule: Option<&'a Arc<Rule>>,
    /// Identifies the counter within the rule: the descriptor's entries, escaped
    /// so that different entry lists never produce the same key.
    pub counter_key: String,
}

impl Unit {
    /// The standard units, in the order error messages list them.
    pub const STANDARD: [Unit; 7] = [
        Unit::Second,
        Unit::Minute,
        Unit::Hour,
        Unit::Day,
        Unit::Week,
        Unit::Month,
        Unit::Year,
    ];

    /// How long one unit lasts (month = 30 days, year = 365 days, as in Envoy).
    pub fn duration(self) -> Duration {
        const DAY: u64 = 86_400;
        Duration::from_secs(match self {
            Unit::Second => 1,
            Unit::Minute => 60,
            Unit::Hour => 3_600,
            Unit::Day => DAY,
            Unit::Week => 7 * DAY,
            Unit::Month => 30 * DAY,
            Unit::Year => 365 * DAY,
            Unit::Custom(d) => return d,
        })
    }

    /// The Envoy RLS v3 spelling (`SECOND` … `YEAR`), `CUSTOM` for a `period:`.
    pub fn name(self) -> &'static str {
        match self {
            Unit::Second => "SECOND",
            Unit::Minute => "MINUTE",
            Unit::Hour => "HOUR",
            Unit::Day => "DAY",
            Unit::Week => "WEEK",
            Unit::Month => "MONTH",
            Unit::Year => "YEAR",
            Unit::Custom(_) => "CUSTOM",
        }
    }

    /// A standard unit by name, case-insensitive (`second`, `MINUTE`, …).
    pub fn from_name(name: &str) -> Option<Unit> {
        Unit::STANDARD
            .into_iter()
            .find(|u| u.name().eq_ignore_ascii_case(name))
    }

    /// The standard unit lasting exactly `period`, else `Custom(period)`, so
    /// `period: 1m` and `unit: minute` are the same rule.
    pub fn from_period(period: Duration) -> Unit {
        Unit::STANDARD
            .into_iter()
            .find(|u| u.duration() == period)
            .unwrap_or(Unit::Custom(period))
    }
}

impl FailMode {
    pub fn name(self) -> &'static str {
        match self {
            FailMode::Open => "open",
            FailMode::Closed => "closed",
            FailMode::Local => "local",
        }
    }
}

impl Scope {
    pub fn name(self) -> &'static str {
        match self {
            Scope::Region => "region",
            Scope::Global => "global",
        }
    }
}

impl Partition {
    pub fn name(self) -> &'static str {
        match self {
            Partition::Strict => "strict",
            Partition::Available => "available",
        }
    }
}

impl Accuracy {
    pub fn name(self) -> &'static str {
        match self {
            Accuracy::Exact => "exact",
            Accuracy::Approximate { .. } => "approximate",
        }
    }
}

impl Rule {
    /// Whether one counter serves every caller the rule matches: every level of
    /// its path names an exact value (no key-only or wildcard level, which count
    /// each value apart). Such a rule set too low throttles all traffic at once,
    /// so the coordinator can hold it to a floor. Reads the path from `id`,
    /// which `parse.rs` builds as `domain|key[=value]|…` with `|`, `=` and `%`
    /// escaped inside keys and values (and `*` only ever in a glob value).
    pub fn counts_all_callers_together(&self) -> bool {
        self.id
            .split('|')
            .skip(1)
            .all(|level| level.contains('=') && !level.contains('*'))
    }
}
