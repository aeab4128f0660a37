//! Sliding window counter: the current and the previous clock-aligned window,
//! the previous one weighted by how much of it still overlaps the sliding
//! window: `count = current + floor(previous × (period − elapsed) / period)`.
//! Assumes the previous window's hits were spread evenly; no boundary burst.
//!
//! `elapsed` is counted in ticks of `Params::tick_us` so that
//! `previous × (period − elapsed)` stays exact in Lua (see `params`).

use super::{Decision, Micros, Outcome, Params, until_tick};

/// The counts of the window now being counted and the one before it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct State {
    /// Index of the current window: `floor(now / period)`.
    pub window: u64,
    /// Hits admitted in `window`.
    pub current: u64,
    /// Hits admitted in `window - 1`; zero if that window saw none or is older.
    pub previous: u64,
}

/// Decides one check of `cost` hits at `now`, counting it into the current
/// window if admitted.
pub fn decide(state: &mut State, now: Micros, cost: u64, params: &Params) -> Outcome {
    let (limit, period, tick) = (params.limit(), params.period_us(), params.tick_us());
    let window = now / period;
    let start = window * period;
    if state.window != window {
        let previous = if state.window + 1 == window {
            state.current
        } else {
            0
        };
        *state = State {
            window,
            current: 0,
            previous,
        };
    }
    let ticks = period / tick;
    let elapsed = (now - start) / tick;
    let weighted = state.previous * (ticks - elapsed) / ticks;
    let count = state.current + weighted;
    let allowed = count + cost <= limit;
    let mut retry = 0;
    if allowed {
        state.current += cost;
    } else {
        retry = retry_after(state, now, start, cost, params);
    }
    let remaining = limit.saturating_sub(count + if allowed { cost } else { 0 });
    let next = start + period;
    let reset = if state.current > 0 {
        next + period - now
    } else if state.previous > 0 {
        next - now
    } else {
        0
    };
    Outcome {
        decision: Decision::new(allowed, limit, remaining, reset, retry),
        // The current window's counter is read as "previous" through the next window.
        keep_for_us: (next + period - now).max(params.ttl_floor_us()),
    }
}

/// Exact time until `cost` fits, assuming no other hits: the weight of a window
/// falls one tick at a time, so solve `weight(x) ≤ room` for the largest number
/// of remaining ticks `x` with `w × x < (room + 1) × ticks`.
fn retry_after(state: &State, now: Micros, start: Micros, cost: u64, params: &Params) -> Micros {
    let (limit, period, tick) = (params.limit(), params.period_us(), params.tick_us());
    let ticks = period / tick;
    // Largest x with weight × x < (room + 1) × ticks; the first tick at which the
    // weighted window has shrunk to `room` is `ticks - x`.
    let first_fitting_tick =
        |weight: u64, room: u64| ticks.saturating_sub(((room + 1) * ticks - 1) / weight);
    let (window_start, weight, room) = if state.current + cost <= limit {
        // Fits in this window once the previous window's weight has decayed.
        (start, state.previous, limit - state.current - cost)
    } else {
        // Needs the next window, where this window's count is the decaying one.
        (start + period, state.current, limit - cost)
    };
    let tick_index = window_start / tick + first_fitting_tick(weight, room);
    until_tick(now, tick_index, tick)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::Algorithm;
    use proptest::prelude::*;
    use std::time::Duration;

    fn params(limit: i64, secs: u64) -> Params {
        Params::new(
            Algorithm::SlidingWindowCounter,
            limit,
            Duration::from_secs(secs),
            None,
        )
        .unwrap()
    }

    #[test]
    fn previous_window_decays_linearly() {
        let p = params(10, 10);
        let mut s = State::default();
        let t = 1_000_000_000_000; // a window boundary
        assert!(decide(&mut s, t + 9_000_000, 10, &p).decision.allowed);
        // Half-way through the next window the previous 10 still weigh 5.
        let d = decide(&mut s, t + 15_000_000, 6, &p).decision;
        assert!(!d.allowed);
        assert_eq!(d.remaining, 5);
        assert!(decide(&mut s, t + 15_000_000, 5, &p).decision.allowed);
    }

    proptest! {
        /// Retry-after is exact: the same check is admitted at now + retry and
        /// denied one tick before.
        #[test]
        fn retry_after_is_the_first_admitting_instant(
            limit in 1i64..50, secs in 1u64..5, prev_hits in 0u64..50, cur_hits in 0u64..50,
            offset in 0u64..5_000_000, cost in 1u64..50,
        ) {
            let p = params(limit, secs);
            let cost = cost.min(p.limit());
            let period = p.period_us();
            let start = 1_000_000_000 * period;
            let now = start + offset % period;
            let s = State { window: start / period, current: cur_hits, previous: prev_hits };
            let d = decide(&mut s.clone(), now, cost, &p).decision;
            prop_assume!(!d.allowed);
            prop_assert!(d.retry_after_us > 0);
            let at = now + d.retry_after_us;
            prop_assert!(decide(&mut s.clone(), at, cost, &p).decision.allowed);
            prop_assert!(!decide(&mut s.clone(), at - p.tick_us(), cost, &p).decision.allowed);
        }
    }
}
