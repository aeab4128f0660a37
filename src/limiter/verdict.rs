//! What a check answers: the [`Verdict`] and the path that reached it
//! ([`Source`]), and the decisions the engine builds without a counter —
//! unlimited, a cached denial, a fail mode's guess, shadow mode's allow, the
//! tightest of several limits.

use std::time::Duration;

use crate::algorithm::{Decision, DenyReason, Params};
use crate::rules::Rule;

/// How a verdict was reached; reported to clients and counted in metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// Decided by the store (Redis, or the embedded store): the normal path.
    Store,
    /// Denied from the local over-limit cache, without a store call.
    Cache,
    /// The rule is `unlimited`.
    Unlimited,
    /// Store failed (or breaker open): allowed by `fail_mode: open`.
    FailOpen,
    /// Store failed: denied by `fail_mode: closed`.
    FailClosed,
    /// Store failed: decided in memory at limit ÷ pods by `fail_mode: local`.
    FailLocal,
    /// A global rule whose allocation in this region is 0 (or not received
    /// yet): denied without a store call.
    NoAllocation,
    /// `requests_per_unit: 0`: every request denied, without a store call.
    ZeroLimit,
}

/// The engine's answer for one check.
#[derive(Debug, Clone)]
pub struct Verdict {
    /// What the caller is told (a shadow rule's denial is already turned into an allow).
    pub decision: Decision,
    /// Which path decided, so a client or a metric can tell a store's answer from
    /// a cached or fail-mode one.
    pub source: Source,
    /// The rule is in shadow mode and would have denied.
    pub shadow_denied: bool,
    /// Which of a `limits:` rule's limits the decision is (0 = the first,
    /// and for every single-limit rule): its unit is `Rule::unit_of`.
    pub limit_index: usize,
}

impl Verdict {
    /// A short machine-readable reason: `over_limit`, `cost_exceeds_capacity`,
    /// `cached_over_limit`, `fail_open`, `fail_closed`, `fail_local`, or empty.
    pub fn reason(&self) -> &'static str {
        match self.source {
            Source::FailOpen => "fail_open",
            Source::FailClosed => "fail_closed",
            Source::FailLocal => "fail_local",
            Source::Cache => "cached_over_limit",
            Source::NoAllocation => "no_allocation",
            Source::ZeroLimit => "over_limit",
            Source::Store | Source::Unlimited => match self.decision.reason {
                Some(DenyReason::OverLimit) => "over_limit",
                Some(DenyReason::CostExceedsCapacity { .. }) => "cost_exceeds_capacity",
                Some(DenyReason::StoreFull) => "store_full",
                None if self.shadow_denied => "over_limit",
                None => "",
            },
        }
    }
}

/// The tightest of several limits' decisions, and its index: among denials
/// the one to wait longest for, else the one with least remaining.
pub(super) fn tightest(decisions: &[Decision]) -> (usize, Decision) {
    let denied = decisions
        .iter()
        .enumerate()
        .filter(|(_, d)| !d.allowed)
        .max_by_key(|(_, d)| d.retry_after_us);
    let pick = denied.or_else(|| {
        decisions
            .iter()
            .enumerate()
            .min_by_key(|(_, d)| d.remaining)
    });
    pick.map_or_else(|| (0, unlimited()), |(i, d)| (i, d.clone()))
}

/// The verdict for a decision: a shadow rule's denial is logged and let
/// through, and the verdict says it would have denied.
pub(super) fn shadow(rule: &Rule, mut decision: Decision, source: Source) -> Verdict {
    let shadow_denied = rule.shadow_mode && !decision.allowed;
    if shadow_denied {
        tracing::info!(rule = %rule.id, "shadow mode: would have denied");
        decision.allowed = true;
        decision.reason = None;
        decision.retry_after_us = 0;
    }
    Verdict {
        decision,
        source,
        shadow_denied,
        limit_index: 0,
    }
}

/// An allow that no limit counted (`unlimited`, or no limit to check).
pub(super) fn unlimited() -> Decision {
    Decision {
        allowed: true,
        limit: 0,
        remaining: 0,
        reset_after_us: 0,
        retry_after_us: 0,
        delay_us: 0,
        reason: None,
    }
}

/// A denial from the over-limit cache, `left` before the store's denial it
/// remembers runs out.
pub(super) fn cached_denial(params: &Params, left: Duration) -> Decision {
    let left = left.as_micros() as u64;
    Decision {
        allowed: false,
        limit: params.limit(),
        remaining: 0,
        reset_after_us: left,
        retry_after_us: left,
        // Only leaky_bucket reports a delay; for a denial it equals retry-after.
        delay_us: if params.algorithm() == crate::algorithm::Algorithm::LeakyBucket {
            left
        } else {
            0
        },
        reason: Some(DenyReason::OverLimit),
    }
}

/// A decision made without the store: nothing is known about the counter.
pub(super) fn fail_decision(params: &Params, allowed: bool) -> Decision {
    Decision {
        allowed,
        limit: params.limit(),
        remaining: 0,
        reset_after_us: 0,
        retry_after_us: 0,
        delay_us: 0,
        reason: (!allowed).then_some(DenyReason::OverLimit),
    }
}
