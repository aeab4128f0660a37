//! Leaky bucket as GCRA (generic cell rate algorithm). The state is the
//! theoretical arrival time (TAT): when the bucket would be empty if nothing
//! more arrived. A check of `cost` moves the TAT `cost × period / limit` later
//! and is admitted if the TAT stays within `burst × period / limit` of now.
//!
//! The TAT is stored as a tick plus a `backlog` ahead of it, in the scaled units
//! of [`BucketScale`] (one hit = `unit`, one tick drains `refill`): an absolute
//! TAT in those units would exceed the 2^53 range Lua's doubles hold exactly.
//!
//! Used as a meter, callers ignore `delay`. Used as a queue (smoothing to a
//! constant rate), an admitted caller waits `delay` — the time for the hits
//! ahead of it to drain — before going on.

use super::{
    BucketScale, CountedIn, Decision, Micros, Outcome, Params, div_ceil, drain, rescaled_level,
    until_tick,
};

/// `None` when the bucket is empty (TAT in the past).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct State {
    /// The bucket's TAT, if it is still ahead of `now`.
    pub tat: Option<Tat>,
}

/// A theoretical arrival time, split so that each part stays below 2^53.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tat {
    /// Scaled units still to drain after `tick`: TAT = tick + backlog / refill.
    pub backlog: u64,
    /// The tick (of `Params::tick_us`) the backlog is counted from.
    pub tick: u64,
    /// The scale `backlog` and `tick` are counted in; `None`: not recorded.
    pub scale: Option<CountedIn>,
}

/// Decides one check of `cost` hits at `now`, moving the TAT if admitted; an
/// admitted check's `delay` is the time for the backlog ahead of it to drain.
pub fn decide(state: &mut State, now: Micros, cost: u64, params: &Params) -> Outcome {
    let BucketScale {
        unit,
        refill,
        capacity,
    } = params.scale();
    let tick_us = params.tick_us();
    let now_tick = now / tick_us;
    let scale = CountedIn::of(params);
    // Counted in another scale (the limit changed): converted first. The
    // backlog is not capped: what the old limit admitted still drains.
    let mut rescaled = false;
    if let Some(t) = state.tat.as_mut()
        && let Some(level) = rescaled_level(t.scale, t.backlog, t.tick, now, scale, -1.0)
    {
        t.backlog = (level * unit as f64).ceil() as u64;
        t.tick = now_tick;
        t.scale = Some(scale);
        rescaled = true;
    }
    let (backlog, tick) = match state.tat {
        None => (0, now_tick),
        Some(t) => {
            let tick = now_tick.max(t.tick);
            (drain(t.backlog, tick - t.tick, refill), tick)
        }
    };
    let after = backlog + cost * unit;
    let allowed = after <= capacity;
    let (level, retry, delay);
    if allowed {
        state.tat = Some(Tat {
            backlog: after,
            tick,
            scale: Some(scale),
        });
        level = after;
        retry = 0;
        delay = until_tick(now, tick + div_ceil(backlog, refill), tick_us);
    } else {
        level = backlog;
        retry = until_tick(now, tick + div_ceil(after - capacity, refill), tick_us);
        delay = retry;
        // A converted backlog is kept even when denied: it drains at the
        // new rate from here.
        if rescaled {
            state.tat = Some(Tat {
                backlog,
                tick,
                scale: Some(scale),
            });
        }
    }
    let reset = until_tick(now, tick + div_ceil(level, refill), tick_us);
    let mut decision = Decision::new(
        allowed,
        params.limit(),
        // A backlog from a larger old burst may exceed the new one.
        capacity.saturating_sub(level) / unit,
        reset,
        retry,
    );
    decision.delay_us = delay;
    Outcome {
        decision,
        keep_for_us: reset.max(params.ttl_floor_us()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::Algorithm;
    use std::time::Duration;

    #[test]
    fn admits_the_burst_then_one_per_interval_with_queue_delay() {
        // 10 per second (one per 100 ms), burst 3.
        let p = Params::new(Algorithm::LeakyBucket, 10, Duration::from_secs(1), Some(3)).unwrap();
        let mut s = State::default();
        let t = 1_700_000_000_000_000;
        let delays: Vec<_> = (0..3)
            .map(|_| decide(&mut s, t, 1, &p).decision)
            .inspect(|d| assert!(d.allowed))
            .map(|d| d.delay_us)
            .collect();
        assert_eq!(delays, [0, 100_000, 200_000]);
        let d = decide(&mut s, t, 1, &p).decision;
        assert!(!d.allowed);
        assert_eq!(
            (d.retry_after_us, d.delay_us, d.remaining),
            (100_000, 100_000, 0)
        );
        assert!(decide(&mut s, t + 100_000, 1, &p).decision.allowed);
    }
}
