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

/// Microseconds from `now` until the start of tick `tick` (ticks of `tick_us`).
pub(crate) fn until_tick(now: Micros, tick: u64, tick_us: Micros) -> Micros {
    (tick * tick_us).saturating_sub(now)
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
