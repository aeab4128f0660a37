//! What a pod tells the leader (`PodReport`): demand since its last report,
//! the epoch it holds, its use of the current window, top-up requests and
//! what it admitted per period. The leader takes it in (`Leader::ingest`);
//! the limiter builds it (`pod.rs`); the coordinator bounds it
//! (`coordinator/report_bounds.rs`).

use super::demand::KeyDemand;
use super::ledger::PeriodAdmitted;
use super::reserved::KeyReserved;
use super::{Epoch, Millis, TOP_UP_AT, WindowUse};

/// One pod's report: demand since its last report, the epoch it holds (its
/// acknowledgement), its use of the current window, and top-up requests.
/// An acknowledgement alone is a report with no demand.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PodReport {
    /// The reporting pod's region.
    pub region: String,
    /// The reporting pod, unique within its region.
    pub pod: String,
    /// The allocation epoch the pod holds.
    pub epoch: Epoch,
    /// The span the demand covers; 0 for an acknowledgement or a top-up alone.
    pub interval_ms: u64,
    /// Demand per global rule, over `interval_ms`.
    pub rules: Vec<RuleDemand>,
    /// The pod's use of each counted rule's current window.
    pub used: Vec<RuleUse>,
    /// Keys the pod asks an early top-up for.
    pub top_ups: Vec<TopUp>,
    /// What the pod admitted per clock-aligned period of each global rule
    /// (the ledger's input): cumulative counts, so a repeated report
    /// replaces instead of adding.
    pub admitted: Vec<PeriodAdmitted>,
    /// The pod's net open reservations per key of each global rule
    /// (`reserved.rs`): every key it holds any of, so a report replaces
    /// the last.
    pub reserved: Vec<KeyReserved>,
}

/// Demand for one global rule in a report: the top keys and the rest.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RuleDemand {
    /// The rule's id.
    pub rule: String,
    /// The pod's top keys by hits asked; the rest is in `remainder_asked`.
    pub keys: Vec<KeyDemand>,
    /// Hits asked for every key not listed, summed.
    pub remainder_asked: u64,
    /// Hits admitted of `remainder_asked` (the coordinator's hit counts for
    /// `ctl top`; demand is what was asked).
    pub remainder_allowed: u64,
}

/// What a pod saw of a counted rule's current window.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RuleUse {
    /// The rule's id.
    pub rule: String,
    /// The start of the window `used` was counted in.
    pub window_start_ms: Millis,
    /// The most a key reached and the largest value enforced, in that window.
    pub used: WindowUse,
}

/// A pod used most of a key's allocation mid-window and asks for more.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TopUp {
    /// The rule's id.
    pub rule: String,
    /// The key asking (`Resolved::counter_key`).
    pub key: String,
    /// The pod's pace for the key since its last report, hits per period.
    pub per_period: f64,
    /// The span that pace was measured over.
    pub interval_ms: u64,
}

impl TopUp {
    /// Whether a pod that has used `used` of a key's `limit` this window
    /// asks for a top-up ([`TOP_UP_AT`]); how often it may ask is the pod's
    /// own business.
    pub fn wanted(used: u64, limit: u64) -> bool {
        limit > 0 && used as f64 >= TOP_UP_AT * limit as f64
    }

    /// The request for a key `asked` hits at this pod over the `since_ms`
    /// since its last report. (A decision's count is no measure of pace: a
    /// sliding counter's includes the previous window's hits.)
    pub fn measured(rule: &str, key: &str, asked: u64, since_ms: u64, period_ms: u64) -> TopUp {
        TopUp {
            rule: rule.to_string(),
            key: key.to_string(),
            per_period: asked as f64 * period_ms as f64 / since_ms.max(1) as f64,
            interval_ms: since_ms,
        }
    }
}
