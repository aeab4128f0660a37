//! The five rate-limit algorithms as pure state machines.
//!
//! Each module has a `State` and a `decide(&mut State, now, cost, &Params)` that
//! updates the state and returns the [`Decision`] plus how long the state must
//! be kept. No I/O, no clock: the embedded store, the simulator and the tests
//! call these directly, and `src/store/redis/scripts/*.lua` implement the same
//! arithmetic step for step (property tests hold the two to the same answers).
//!
//! Time is in microseconds since the Unix epoch. Every algorithm treats state
//! that has expired exactly like absent state, so a store may drop a key any time
//! after `keep_for` without changing a decision.

mod decision;
pub mod fixed_window;
pub mod leaky_bucket;
mod params;
pub mod settle;
pub mod sliding_counter;
pub mod sliding_log;
pub mod token_bucket;

pub use decision::{Decision, DenyReason};
pub use params::{
    Algorithm, BucketScale, MAX_LIMIT, MAX_LOG_LIMIT, MAX_PERIOD, MIN_PERIOD, Params,
};

use std::fmt;

/// Microseconds since the Unix epoch (or a duration in microseconds).
pub type Micros = u64;

/// Bad input, naming the field, the value and why it was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {field} {value:?}: {reason}")]
pub struct InvalidInput {
    /// The input's name, as the caller spelled it (`cost`, `limit`, `key`, …).
    pub field: &'static str,
    /// The refused value, rendered for the message.
    pub value: String,
    /// What a valid value looks like.
    pub reason: String,
}

impl InvalidInput {
    /// The error for `field` = `value`, refused because of `reason`.
    pub fn new(field: &'static str, value: impl fmt::Display, reason: impl Into<String>) -> Self {
        InvalidInput {
            field,
            value: value.to_string(),
            reason: reason.into(),
        }
    }
}

/// The checks every store makes before touching state: a cost of 0 is bad
/// input, and a cost no bucket or window could ever hold is denied outright
/// (with a reason, so the caller knows retrying is pointless).
pub fn precheck(params: &Params, cost: u64) -> Result<Option<Decision>, InvalidInput> {
    if cost == 0 {
        return Err(InvalidInput::new("cost", cost, "must be at least 1"));
    }
    let capacity = params.capacity();
    if cost > capacity {
        return Ok(Some(Decision {
            allowed: false,
            limit: params.limit(),
            remaining: 0,
            reset_after_us: 0,
            retry_after_us: 0,
            delay_us: 0,
            reason: Some(DenyReason::CostExceedsCapacity { cost, capacity }),
        }));
    }
    Ok(None)
}

/// Integer ceiling division; both operands below 2^53 (see `params`).
pub(crate) fn div_ceil(a: u64, b: u64) -> u64 {
    a.div_ceil(b)
}

/// What is left of `amount` scaled units after `elapsed` ticks draining
/// `refill` each: a GCRA backlog draining, or a token bucket's missing tokens
/// refilling. Compares first so that `elapsed × refill` stays in exact range.
pub(crate) fn drain(amount: u64, elapsed: u64, refill: u64) -> u64 {
    if elapsed >= div_ceil(amount, refill) {
        0
    } else {
        amount - elapsed * refill
    }
}

/// The scale a bucket's level was counted in (see [`BucketScale`]): its
/// unit, tick and refill. A bucket decided under another scale — its limit
/// changed, as when a global allocation moves — converts its level first
/// ([`rescaled_level`]), as `bucket_rescale.lua` does in front of the Redis
/// scripts, so every store and the simulator rescale one way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CountedIn {
    /// Scaled units per hit.
    pub unit: u64,
    /// The tick, in µs.
    pub tick_us: Micros,
    /// Scaled units refilled (or drained) per tick.
    pub refill: u64,
}

impl CountedIn {
    /// The scale `params` count in.
    pub fn of(params: &Params) -> CountedIn {
        let scale = params.scale();
        CountedIn {
            unit: scale.unit,
            tick_us: params.tick_us(),
            refill: scale.refill,
        }
    }
}

/// A level counted in `was` (scaled units at `last_tick`), in hits at `now`
/// under `to`, refilled (`sign` 1: token bucket) or drained (-1: GCRA
/// backlog) since `last_tick` at the lower of the two rates — never more
/// than either limit allowed. `None` when the scale is unchanged or was not
/// recorded. The arithmetic is the Lua script's, in the same order on the
/// same doubles, so both stores decide alike.
pub(crate) fn rescaled_level(
    was: Option<CountedIn>,
    level: u64,
    last_tick: u64,
    now: Micros,
    to: CountedIn,
    sign: f64,
) -> Option<f64> {
    let was = was.filter(|was| *was != to)?;
    let f = |v: u64| v as f64;
    let elapsed_us = (f(now) - f(last_tick) * f(was.tick_us)).max(0.0);
    let rate = (f(was.refill) / (f(was.unit) * f(was.tick_us)))
        .min(f(to.refill) / (f(to.unit) * f(to.tick_us)));
    Some((f(level) / f(was.unit) + sign * elapsed_us * rate).max(0.0))
}

/// Microseconds from `now` until the start of tick `tick` (ticks of `tick_us`).
pub(crate) fn until_tick(now: Micros, tick: u64, tick_us: Micros) -> Micros {
    (tick * tick_us).saturating_sub(now)
}

/// One key's state under any algorithm: the memory store's entries and the
/// simulator's counters (the Redis scripts keep the same fields in hashes).
/// A key never changes variant: its algorithm is part of its state key.
#[derive(Debug, Clone)]
pub enum KeyState {
    /// [`fixed_window`].
    FixedWindow(fixed_window::State),
    /// [`sliding_log`].
    SlidingLog(sliding_log::State),
    /// [`sliding_counter`].
    SlidingCounter(sliding_counter::State),
    /// [`token_bucket`], rescaled by itself when its limit changes.
    TokenBucket(token_bucket::State),
    /// [`leaky_bucket`], rescaled by itself when its limit changes.
    LeakyBucket(leaky_bucket::State),
}

impl KeyState {
    /// A key never seen (or expired).
    pub fn fresh(algorithm: Algorithm) -> KeyState {
        match algorithm {
            Algorithm::FixedWindow => KeyState::FixedWindow(Default::default()),
            Algorithm::SlidingWindowLog => KeyState::SlidingLog(Default::default()),
            Algorithm::SlidingWindowCounter => KeyState::SlidingCounter(Default::default()),
            Algorithm::TokenBucket => KeyState::TokenBucket(Default::default()),
            Algorithm::LeakyBucket => KeyState::LeakyBucket(Default::default()),
        }
    }

    /// Decides `cost` hits at `now` under `params` (of this key's
    /// algorithm); a cost of 0 decides without consuming.
    pub fn decide(&mut self, now: Micros, cost: u64, params: &Params) -> Outcome {
        match self {
            KeyState::FixedWindow(s) => fixed_window::decide(s, now, cost, params),
            KeyState::SlidingLog(s) => sliding_log::decide(s, now, cost, params),
            KeyState::SlidingCounter(s) => sliding_counter::decide(s, now, cost, params),
            KeyState::TokenBucket(s) => token_bucket::decide(s, now, cost, params),
            KeyState::LeakyBucket(s) => leaky_bucket::decide(s, now, cost, params),
        }
    }
}

/// What `decide` returns: the decision, and how long from `now` the store must
/// keep the state (after that it is equivalent to absent state).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// The answer to the check.
    pub decision: Decision,
    /// From `now`, how long the store must keep the state; after that, dropping
    /// it decides nothing differently (a store's TTL).
    pub keep_for_us: Micros,
}
