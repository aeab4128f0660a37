//! Token bucket: `burst` tokens, refilled lazily at `limit` per `period` and
//! capped at `burst`; a check takes `cost` tokens. Suits per-second burst limits
//! and cost-based limits (LLM tokens).
//!
//! Tokens are counted in the scaled integer units of [`BucketScale`]: one token
//! is `unit` units and each tick adds `refill` units, so refills are exact.

use super::{
    BucketScale, CountedIn, Decision, Micros, Outcome, Params, div_ceil, drain, rescaled_level,
    until_tick,
};

/// `None` until the first admitted hit: an unused bucket is full.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct State {
    /// The bucket's level at its last refill, once a hit has taken from it.
    pub level: Option<Level>,
}

/// A bucket's tokens at a tick; later ticks refill it lazily, on the next check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Level {
    /// Tokens in scaled units at `tick`.
    pub tokens: u64,
    /// The tick of the last refill.
    pub tick: u64,
    /// The scale `tokens` and `tick` are counted in; `None`: not recorded
    /// (a level rebuilt from counts, already in the current scale).
    pub scale: Option<CountedIn>,
}

/// Decides one check of `cost` hits at `now`, refilling first and taking
/// `cost` tokens if admitted.
pub fn decide(state: &mut State, now: Micros, cost: u64, params: &Params) -> Outcome {
    let BucketScale {
        unit,
        refill,
        capacity,
    } = params.scale();
    let tick_us = params.tick_us();
    let now_tick = now / tick_us;
    let scale = CountedIn::of(params);
    // Counted in another scale (the limit changed): converted first.
    let mut rescaled = false;
    if let Some(l) = state.level.as_mut()
        && let Some(level) = rescaled_level(l.scale, l.tokens, l.tick, now, scale, 1.0)
    {
        l.tokens = ((level * unit as f64).floor() as u64).min(capacity);
        l.tick = now_tick;
        l.scale = Some(scale);
        rescaled = true;
    }
    // A timestamp behind the last refill refills nothing (and never un-refills).
    let (mut tokens, tick) = match state.level {
        None => (capacity, now_tick),
        Some(l) => {
            let tick = now_tick.max(l.tick);
            // Refilling the missing tokens is draining them. A level above
            // the capacity (the limit shrank: a new global allocation) is
            // read as a full bucket.
            let missing = drain(capacity.saturating_sub(l.tokens), tick - l.tick, refill);
            (capacity - missing, tick)
        }
    };
    let need = cost * unit;
    let allowed = tokens >= need;
    let mut retry = 0;
    if allowed {
        tokens -= need;
    }
    // A converted level is kept even when denied: refill goes on at the
    // new rate.
    if allowed || rescaled {
        state.level = Some(Level {
            tokens,
            tick,
            scale: Some(scale),
        });
    }
    if !allowed {
        retry = until_tick(now, tick + div_ceil(need - tokens, refill), tick_us);
    }
    let reset = until_tick(now, tick + div_ceil(capacity - tokens, refill), tick_us);
    Outcome {
        decision: Decision::new(allowed, params.limit(), tokens / unit, reset, retry),
        keep_for_us: reset.max(params.ttl_floor_us()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::Algorithm;
    use std::time::Duration;

    #[test]
    fn bursts_then_refills_at_the_rate() {
        // 10 per second, burst 5: one token every 100 ms.
        let p = Params::new(Algorithm::TokenBucket, 10, Duration::from_secs(1), Some(5)).unwrap();
        let mut s = State::default();
        let t = 1_700_000_000_000_000;
        let d = decide(&mut s, t, 5, &p).decision;
        assert!(d.allowed);
        assert_eq!((d.remaining, d.reset_after_us), (0, 500_000));
        let d = decide(&mut s, t + 50_000, 1, &p).decision;
        assert!(!d.allowed);
        assert_eq!(d.retry_after_us, 50_000);
        assert!(decide(&mut s, t + 100_000, 1, &p).decision.allowed);
        // Long idle: refilled to the burst, never beyond.
        let d = decide(&mut s, t + 3_600_000_000, 1, &p).decision;
        assert_eq!(d.remaining, 4);
    }
}
