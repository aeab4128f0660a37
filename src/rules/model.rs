//! The validated rule model the limiter and the coordinator consume.

use std::sync::Arc;
use std::time::Duration;

use crate::algorithm::Params;

/// One rule file handed to the parser: its name (used in every error
/// message, usually the path) and its YAML text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleFile {
    /// Cited by every error in the file; usually its path.
    pub name: String,
    /// The YAML document: one domain and its descriptor tree.
    pub text: String,
}

/// Envoy's rate limit units, plus `Custom` for Meridian's `period` field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// 1 s.
    Second,
    /// 60 s.
    Minute,
    /// 3 600 s.
    Hour,
    /// 86 400 s.
    Day,
    /// 7 days.
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
    /// Each region counts against the full limit in its own store (the default).
    #[default]
    Region,
    /// The limit holds across all regions; each region enforces the allocation
    /// the coordinator grants it.
    Global,
}

/// Exact: one atomic script per check. Approximate (fixed_window,
/// sliding_window_counter, token_bucket): decided in process from the last
/// global count + local hits, flushed every `sync_interval` or `max_batch`
/// hits. Bound: admitted ≤ L + pods × max_batch per window (token bucket:
/// ≤ B + R·T + pods × max_batch); see `limiter::batcher`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Accuracy {
    /// Every check runs the algorithm's script in the store (the default).
    #[default]
    Exact,
    /// Checks are decided in process and flushed in batches; see the enum's doc
    /// for the bound.
    Approximate {
        /// Longest a local hit waits before it is flushed (default 50 ms).
        sync_interval: Duration,
        /// Local hits per key that force a flush, and the most a pod may hold
        /// unseen by others. `None`: limit / 100, at least 1.
        max_batch: Option<u64>,
    },
}

/// When a rule's cost is charged (`settle:`). Envoy's rate limit filter can
/// send a second request when a stream ends (`apply_on_stream_done`), with
/// the real cost (an LLM call's tokens) as `hits_addend`; see
/// `limiter::stream_done` and docs/cost-quotas.md.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SettleMode {
    /// `at_check` (the default): every check charges its cost when it is
    /// admitted.
    #[default]
    AtCheck,
    /// `on_stream_done`: a request of cost 0 (an explicit `hits_addend: 0`,
    /// or none at all) is the request-time check: admitted while at least
    /// one hit remains, charging nothing. A request of cost `n > 0` is the
    /// stream-done settlement: `n` charged, never denied, at most
    /// `max_overdraft` past each limit (the rest dropped and counted).
    OnStreamDone,
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

/// What separates a rule's id from the number of one of its `limits:`
/// ([`Rule::limit_id`]).
pub const LIMIT_ID_MARK: &str = "%limit";

/// The rule id and limit index (0-based) of an id from [`Rule::limit_id`].
pub fn split_limit_id(id: &str) -> (&str, usize) {
    match id.rsplit_once(LIMIT_ID_MARK) {
        Some((rule, n)) => match n.parse::<usize>() {
            Ok(n) if n >= 2 => (rule, n - 1),
            _ => (id, 0),
        },
        None => (id, 0),
    }
}

/// One limit in a rule file, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    /// Stable, unique id: domain plus the (key, value pattern) path of the tree
    /// node, escaped. Part of every storage key, so it must not change when
    /// unrelated rules are edited.
    pub id: String,
    /// The file's `domain:`; a request names it to pick the tree it is matched in.
    pub domain: String,
    /// `rate_limit.name`, if given.
    pub name: Option<String>,
    /// `rate_limit.unlimited: true`: matched, never limited, nothing counted.
    pub unlimited: bool,
    /// `requests_per_unit` (0 when unlimited). 0 on a limited rule denies
    /// every request as over limit (envoyproxy/ratelimit's way to ban a
    /// value); such a rule has no `params` and never reaches the store.
    pub requests_per_unit: u64,
    /// The period as written (`unit:` or `period:`), kept for Envoy's response
    /// and the `rules` command; `params` holds the period the algorithm uses.
    pub unit: Unit,
    /// Algorithm, limit, period, burst. `None` when unlimited or when
    /// `requests_per_unit` is 0 (see [`Rule::denies_all`]). With `limits:`,
    /// the first entry's.
    pub params: Option<Params>,
    /// With `limits:`, every entry after the first (its unit as written and
    /// its params): a check passes only when every limit passes, all decided
    /// in one store call. Empty for a `rate_limit` rule.
    pub also: Vec<(Unit, Params)>,
    /// `shadow_mode: true`: decided and counted, but a denial is answered as an
    /// allow, with `Verdict::shadow_denied` set, to try a rule on live traffic.
    pub shadow_mode: bool,
    /// `detailed_metric: true` (Envoy's field): checks are also counted per
    /// descriptor value, every level of the path named by the request's
    /// value (`meridian_descriptor_checks_total`, capped; see
    /// `limiter::detailed_metrics`).
    pub detailed_metric: bool,
    /// `value_to_metric: true` on this node or one above it (Envoy's field):
    /// such levels are named by the request's value in the per-value metric.
    pub value_to_metric: bool,
    /// Names of rules this one replaces when both match one request.
    pub replaces: Vec<String>,
    /// What a check does when the store fails or misses its deadline.
    pub fail_mode: FailMode,
    /// Whether the limit is per region or one for the world.
    pub scope: Scope,
    /// Exact (a script per check) or approximate (batched); see [`Accuracy`].
    pub accuracy: Accuracy,
    /// Hot-key split into this many sub-counters (1 = no split), each with
    /// limit / K: admitted ≤ L, ≥ L − K × (cost − 1) once demand reaches every
    /// sub-counter; see `limiter::split`.
    pub split: u32,
    /// A global rule's behaviour when a region loses the coordinator.
    pub partition: Partition,
    /// Share of the static allocation kept when a global rule's lease lapses (0.0–1.0).
    pub fallback: f64,
    /// How long a region whose lease lapsed keeps `fallback` ([`DEFAULT_FALLBACK_HOLD`]) before it steps
    /// down to nothing (default 60 s); the coordinator re-grants the share
    /// then, so a dead region strands capacity for lease + hold, not for
    /// its whole outage.
    pub fallback_hold: std::time::Duration,
    /// `confirm_ban: true`: the operator states that this rule may ban or
    /// near-ban every caller or every value it matches (a limit of 0, a
    /// shared counter below the coordinator's `--shared-rule-floor`, or
    /// less than one request a day per value). The coordinator refuses such
    /// a rule without it; the limiter enforces the rule the same either way.
    pub confirm_ban: bool,
    /// `max_cost`: the most one reservation may be committed at (and
    /// reserved for); a larger `actual` or `estimate` is refused, naming
    /// the field. `None`: no cap but the store's (10^15).
    pub max_cost: Option<u64>,
    /// `max_overdraft`: how far past each of its limits a committed excess
    /// (`actual` above `estimate`) may take a key, in hits: debt later checks
    /// wait out. `None`: each limit's own capacity (its limit, or burst for
    /// the buckets), at most one period's worth of debt; see
    /// [`Rule::overdraft`].
    pub max_overdraft: Option<u64>,
    /// `settle`: when the cost is charged; see [`SettleMode`].
    pub settle: SettleMode,
    /// Where the rule was written: file name and 1-based line.
    pub file: String,
    /// Where the rule was written: 1-based line in `file`.
    pub line: usize,
}

/// The outcome of matching a descriptor.
#[derive(Debug, Clone)]
pub struct Resolved<'a> {
    /// `None` when the path ends at a node without `rate_limit` (an allow-list entry).
    pub rule: Option<&'a Arc<Rule>>,
    /// Identifies the counter within the rule: the descriptor's entries, escaped
    /// so that different entry lists never produce the same key. A level
    /// matched by a `share_threshold` glob contributes the pattern, not the
    /// value, so all its values share one counter.
    pub counter_key: String,
    /// The rule's per-value metric name, envoyproxy/ratelimit's
    /// `key_value.subkey…` form, when the rule counts values
    /// ([`Rule::counts_values`]); `None` otherwise (and no allocation).
    pub metric_key: Option<String>,
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
    /// The spelling in rule files (`open`, `closed`, `local`).
    pub fn name(self) -> &'static str {
        match self {
            FailMode::Open => "open",
            FailMode::Closed => "closed",
            FailMode::Local => "local",
        }
    }
}

impl Scope {
    /// The spelling in rule files (`region`, `global`).
    pub fn name(self) -> &'static str {
        match self {
            Scope::Region => "region",
            Scope::Global => "global",
        }
    }
}

impl Partition {
    /// The spelling in rule files (`strict`, `available`).
    pub fn name(self) -> &'static str {
        match self {
            Partition::Strict => "strict",
            Partition::Available => "available",
        }
    }
}

impl Accuracy {
    /// The spelling in rule files (`exact`, `approximate`).
    pub fn name(self) -> &'static str {
        match self {
            Accuracy::Exact => "exact",
            Accuracy::Approximate { .. } => "approximate",
        }
    }
}

impl Rule {
    /// `requests_per_unit: 0`: every request is over the limit, decided
    /// without a store call.
    pub fn denies_all(&self) -> bool {
        !self.unlimited && self.requests_per_unit == 0
    }

    /// The unit limit `index` (0 = `params`, then [`Rule::also`]) was written in.
    pub fn unit_of(&self, index: usize) -> Unit {
        match index {
            0 => self.unit,
            i => self.also.get(i - 1).map_or(self.unit, |(unit, _)| *unit),
        }
    }

    /// Every limit of the rule with its params, in order (one for a
    /// `rate_limit` rule, the entries of `limits:` otherwise; none when the
    /// rule has no params).
    pub fn limits(&self) -> impl Iterator<Item = &Params> {
        self.params.iter().chain(self.also.iter().map(|(_, p)| p))
    }

    /// The id limit `index` is allocated and reported under: the rule's id
    /// for the first, `<id>%limit<n>` (n from 2) for the others of a
    /// `limits:` rule, which a `scope: global` rule allocates each on its
    /// own. `%` is always escaped (`%25`) inside a rule id, so `%limit`
    /// can name no other rule.
    pub fn limit_id(&self, index: usize) -> std::borrow::Cow<'_, str> {
        match index {
            0 => std::borrow::Cow::Borrowed(&self.id),
            i => std::borrow::Cow::Owned(format!("{}{LIMIT_ID_MARK}{}", self.id, i + 1)),
        }
    }

    /// How far past `params` a committed excess may take a key (see
    /// [`Rule::max_overdraft`]): the rule's `max_overdraft`, else the
    /// limit's capacity, clipped to what the stores count exactly.
    pub fn overdraft(&self, params: &Params) -> u64 {
        crate::algorithm::settle::overdraft(self.max_overdraft, params)
    }

    /// Whether checks of this rule are also counted per descriptor value.
    pub fn counts_values(&self) -> bool {
        self.detailed_metric || self.value_to_metric
    }

    /// Whether one counter serves every caller the rule matches: every level of
    /// its path names an exact value (no key-only or wildcard level, which count
    /// each value apart). Such a rule set too low throttles all traffic at once,
    /// so the coordinator can hold it to a floor. Reads the path from `id`,
    /// which `parse/descriptor.rs` builds as `domain|key[=value]|…` with `|`, `=` and `%`
    /// escaped inside keys and values (and `*` only ever in a glob value).
    pub fn counts_all_callers_together(&self) -> bool {
        self.id
            .split('|')
            .skip(1)
            .all(|level| level.contains('=') && !level.contains('*'))
    }
}

/// A global rule's `fallback_hold` unless it says otherwise: a dead
/// region's fallback returns to the living a minute after its lease.
pub const DEFAULT_FALLBACK_HOLD: std::time::Duration = std::time::Duration::from_secs(60);
