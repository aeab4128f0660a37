//! A circuit breaker in front of the store: after `threshold` consecutive
//! failures it stops calling a dead Redis for `cool_down` (checks go straight
//! to the rule's fail mode), then lets one probe through; the probe's outcome
//! closes it or opens it again.

use std::sync::Mutex;
use std::time::{Duration, Instant};

pub struct Breaker {
    /// `std::sync::Mutex`: a few instructions under the lock, never an `.await`.
    state: Mutex<State>,
    threshold: u32,
    cool_down: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Closed {
        failures: u32,
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
            state: Mutex::new(State::Closed { failures: 0 }),
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
        *self.state() = State::Closed { failures: 0 };
    }

    pub fn failed(&self, now: Instant) {
        let mut state = self.state();
        *state = match *state {
            State::Closed { failures } if failures + 1 < self.threshold => State::Closed {
                failures: failures + 1,
            },
            _ => State::Open {
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
    fn opens_after_threshold_probes_after_cool_down_and_closes_on_success() {
        let b = Breaker::new(3, Duration::from_secs(1));
        let t = Instant::now();
        for _ in 0..2 {
            assert!(b.allow(t));
            b.failed(t);
        }
        assert!(!b.is_open());
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
