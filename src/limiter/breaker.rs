//! A circuit breaker in front of the store: after `threshold` consecutive
//! failures spread over at least `cool_down / 4` it stops calling a dead Redis
//! for `cool_down` (checks go straight to the rule's fail mode), then lets one
//! probe through; the probe's outcome closes it or opens it again.
//!
//! The time span matters: a single 20 ms stall of a busy Redis fails every call
//! in flight at once — a hundred "consecutive" failures in one instant — and
//! must not send every rule to its fail mode for a whole cool-down.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The store's circuit breaker (see the module doc), one per engine, updated
/// by every store call's outcome.
pub struct Breaker {
    /// `std::sync::Mutex`: a few instructions under the lock, never an `.await`.
    state: Mutex<State>,
    /// Consecutive failures that open it (`EngineConfig::breaker_threshold`).
    threshold: u32,
    /// How long it stays open before a probe (`EngineConfig::breaker_cool_down`).
    cool_down: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Closed {
        failures: u32,
        /// When the current run of failures began.
        since: Option<Instant>,
    },
    Open {
        until: Instant,
    },
    /// One probe is out; everyone else keeps using the fail mode.
    Probing,
}

impl Breaker {
    pub fn new(threshold: u32, cool_down: Duration) -> Breaker {
        Breaker {
            state: Mutex::new(State::Closed {
                failures: 0,
                since: None,
            }),
            threshold: threshold.max(1),
            cool_down,
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether this check may call the store.
    pub fn allow(&self, now: Instant) -> bool {
        let mut state = self.state();
        match *state {
            State::Closed { .. } => true,
            State::Open { until } if now >= until => {
                *state = State::Probing;
                true
            }
            State::Open { .. } | State::Probing => false,
        }
    }

    pub fn succeeded(&self) {
        *self.state() = State::Closed {
            failures: 0,
            since: None,
        };
    }

    pub fn failed(&self, now: Instant) {
        let mut state = self.state();
        *state = match *state {
            State::Closed { failures, since } => {
                let since = since.unwrap_or(now);
                let sustained = now.duration_since(since) >= self.cool_down / 4;
                if failures + 1 >= self.threshold && sustained {
                    State::Open {
                        until: now + self.cool_down,
                    }
                } else {
                    State::Closed {
                        failures: failures + 1,
                        since: Some(since),
                    }
                }
            }
            State::Open { .. } | State::Probing => State::Open {
                until: now + self.cool_down,
            },
        };
    }

    pub fn is_open(&self) -> bool {
        !matches!(*self.state(), State::Closed { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_of_failures_in_one_instant_does_not_open_it() {
        let b = Breaker::new(3, Duration::from_secs(1));
        let t = Instant::now();
        for _ in 0..100 {
            b.failed(t);
        }
        assert!(!b.is_open(), "one stall is not a dead Redis");
        b.succeeded();
        b.failed(t + Duration::from_millis(300));
        assert!(!b.is_open(), "a success ends the run of failures");
    }

    #[test]
    fn opens_after_threshold_probes_after_cool_down_and_closes_on_success() {
        let b = Breaker::new(3, Duration::from_secs(1));
        let start = Instant::now();
        for i in 0..2 {
            assert!(b.allow(start));
            b.failed(start + Duration::from_millis(100 * i));
        }
        assert!(!b.is_open());
        let t = start + Duration::from_millis(250);
        b.failed(t);
        assert!(b.is_open() && !b.allow(t));
        let later = t + Duration::from_secs(1);
        assert!(b.allow(later), "one probe after the cool-down");
        assert!(!b.allow(later), "only one");
        b.failed(later);
        assert!(!b.allow(later + Duration::from_millis(999)));
        assert!(b.allow(later + Duration::from_secs(1)));
        b.succeeded();
        assert!(b.allow(later + Duration::from_secs(1)) && !b.is_open());
    }
}
