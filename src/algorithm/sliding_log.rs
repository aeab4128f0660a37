//! Sliding window log: one timestamp per admitted hit, kept for one period.
//! Exact — the hits in any `period` never exceed the limit — at the price of
//! one entry per hit (hence `MAX_LOG_LIMIT`).

use std::collections::VecDeque;

use super::{Decision, Micros, Outcome, Params};

/// Timestamps of admitted hits, oldest first (a cost of n adds n entries).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct State {
    /// One entry per admitted hit, sorted; entries a period old are dropped first.
    pub entries: VecDeque<Micros>,
}

/// Decides one check of `cost` hits at `now`, logging `cost` entries if admitted.
pub fn decide(state: &mut State, now: Micros, cost: u64, params: &Params) -> Outcome {
    let (limit, period) = (params.limit(), params.period_us());
    // An entry at t counts while t > now - period (Redis: ZREMRANGEBYSCORE -inf now-period).
    let cutoff = now as i64 - period as i64;
    while state.entries.front().is_some_and(|&t| t as i64 <= cutoff) {
        state.entries.pop_front();
    }
    let count = state.entries.len() as u64;
    let allowed = count + cost <= limit;
    let mut retry = 0;
    if allowed {
        // Caller timestamps may go backwards; keep the log sorted like a ZSET.
        let at = state.entries.partition_point(|&t| t <= now);
        for _ in 0..cost {
            state.entries.insert(at, now);
        }
    } else {
        // The (count + cost - limit)-th oldest entry must leave first.
        let oldest_needed = state.entries[(count + cost - limit - 1) as usize];
        retry = (oldest_needed + period).saturating_sub(now);
    }
    let remaining = limit.saturating_sub(state.entries.len() as u64);
    let reset = state
        .entries
        .back()
        .map_or(0, |&newest| (newest + period).saturating_sub(now));
    Outcome {
        decision: Decision::new(allowed, limit, remaining, reset, retry),
        keep_for_us: reset.max(params.ttl_floor_us()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::Algorithm;
    use std::time::Duration;

    #[test]
    fn admits_again_exactly_when_the_oldest_hit_leaves() {
        let p = Params::new(Algorithm::SlidingWindowLog, 2, Duration::from_secs(1), None).unwrap();
        let mut s = State::default();
        assert!(decide(&mut s, 100, 1, &p).decision.allowed);
        assert!(decide(&mut s, 500_000, 1, &p).decision.allowed);
        let d = decide(&mut s, 600_000, 1, &p).decision;
        assert!(!d.allowed);
        assert_eq!(d.retry_after_us, 100 + 1_000_000 - 600_000);
        assert!(!decide(&mut s, 1_000_099, 1, &p).decision.allowed);
        assert!(decide(&mut s, 1_000_100, 1, &p).decision.allowed);
    }
}
