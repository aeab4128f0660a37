use std::time::Duration;

use super::Micros;

/// The answer to one check. Durations are kept in microseconds, the unit every
/// algorithm and Lua script computes in; the accessors return `Duration`s.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// Whether the hits were admitted; only admitted hits are counted.
    pub allowed: bool,
    /// The limit in force (the allocation, for global rules).
    pub limit: u64,
    /// Hits that could still be admitted now, after this check.
    pub remaining: u64,
    /// Until the state is back to untouched: window end, full bucket, empty log.
    pub reset_after_us: Micros,
    /// Until this same check would be admitted, if nothing else arrives.
    /// 0 when allowed, and when `reason` says retrying can never succeed.
    pub retry_after_us: Micros,
    /// leaky_bucket only: how long to hold an admitted request so that output
    /// leaves at a constant rate (queueing instead of bursting); for a denied
    /// request, equal to `retry_after`.
    pub delay_us: Micros,
    /// Why a denied check was denied; `None` exactly when `allowed`.
    pub reason: Option<DenyReason>,
}

/// Why a check was denied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DenyReason {
    /// The hits already counted leave no room for `cost` more; retrying after
    /// `retry_after` can succeed.
    OverLimit,
    /// The cost alone exceeds what the limit can ever admit at once.
    CostExceedsCapacity {
        /// The hits the check asked for.
        cost: u64,
        /// The most one check can ask for: the burst for the buckets, the limit otherwise.
        capacity: u64,
    },
    /// A bounded in-process store holds as many keys as it may and this key
    /// is new to it: refused rather than let through uncounted, or made room
    /// for by forgetting (and so resetting) another key's count.
    StoreFull,
}

impl Decision {
    /// `reset_after_us` as a `Duration` (the `X-RateLimit-Reset` header's source).
    pub fn reset_after(&self) -> Duration {
        Duration::from_micros(self.reset_after_us)
    }

    /// `retry_after_us` as a `Duration`: zero when allowed, and when retrying can never succeed.
    pub fn retry_after(&self) -> Duration {
        Duration::from_micros(self.retry_after_us)
    }

    /// `delay_us` as a `Duration`: how long a leaky-bucket caller queues before going on.
    pub fn delay(&self) -> Duration {
        Duration::from_micros(self.delay_us)
    }

    /// Builds the decision every algorithm returns: `retry_after_us` is only
    /// meaningful for denials.
    pub(crate) fn new(
        allowed: bool,
        limit: u64,
        remaining: u64,
        reset_after_us: Micros,
        retry_after_us: Micros,
    ) -> Decision {
        Decision {
            allowed,
            limit,
            remaining,
            reset_after_us,
            retry_after_us: if allowed { 0 } else { retry_after_us },
            delay_us: 0,
            reason: (!allowed).then_some(DenyReason::OverLimit),
        }
    }
}
