//! Fixed window: one counter per clock-aligned window `floor(now / period)`.
//! Every pod and every region derives the same window index from the time, so
//! they all count the same window. Cheapest algorithm; admits up to 2 × limit
//! across a window edge.

use super::{Decision, Micros, Outcome, Params};

/// The counter of the window now being counted; a later window finds it stale
/// and starts again from zero.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct State {
    /// Index of the window counted: `floor(now / period)`.
    pub window: u64,
    /// Hits admitted in `window`.
    pub count: u64,
}

/// Decides one check of `cost` hits at `now`, counting it into `state` if admitted.
pub fn decide(state: &mut State, now: Micros, cost: u64, params: &Params) -> Outcome {
    let (limit, period) = (params.limit(), params.period_us());
    let window = now / period;
    if state.window != window {
        *state = State { window, count: 0 };
    }
    let reset = (window + 1) * period - now;
    let allowed = state.count + cost <= limit;
    if allowed {
        state.count += cost;
    }
    let remaining = limit.saturating_sub(state.count);
    Outcome {
        // A denied cost ≤ limit always fits into the next window.
        decision: Decision::new(allowed, limit, remaining, reset, reset),
        keep_for_us: reset.max(params.ttl_floor_us()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::Algorithm;
    use std::time::Duration;

    #[test]
    fn counts_within_a_window_and_resets_at_the_edge() {
        let p = Params::new(Algorithm::FixedWindow, 3, Duration::from_secs(10), None).unwrap();
        let mut s = State::default();
        let t = 1_000_000_000_000; // a window boundary
        assert!(decide(&mut s, t, 2, &p).decision.allowed);
        let d = decide(&mut s, t + 1, 2, &p).decision;
        assert!(!d.allowed);
        assert_eq!(d.remaining, 1);
        assert_eq!(d.retry_after_us, 10_000_000 - 1);
        assert!(decide(&mut s, t + 2, 1, &p).decision.allowed);
        let d = decide(&mut s, t + 10_000_000, 3, &p).decision;
        assert!(d.allowed);
        assert_eq!((d.remaining, d.reset_after_us), (0, 10_000_000));
    }
}
