//! One key's view in one window: the last global count read, this pod's
//! hits not yet sent, and the decision a check gets from them.

use std::time::Instant;

use crate::algorithm::{
    Algorithm, Decision, Micros, Params, fixed_window, sliding_counter, token_bucket,
};

use super::Batching;

/// One key's view in one window.
#[derive(Debug)]
pub(super) struct Counter {
    pub(super) params: Params,
    pub(super) batching: Batching,
    /// From the last flush answer: the window's count (fixed window, sliding
    /// counter) or the bucket's tokens in scaled units (token bucket).
    pub(super) global: u64,
    /// Sliding counter: the previous window's count. Token bucket: the tick of `global`.
    pub(super) previous: u64,
    /// Admitted here, not yet sent.
    pub(super) pending: u64,
    /// Sent in a call not answered yet (or waiting to be sent again).
    pub(super) in_flight: u64,
    /// When `pending` became non-zero: the flush is due `sync_interval` later.
    pub(super) pending_since: Option<Instant>,
    /// Last check or flush; idle counters are dropped.
    pub(super) touched: Instant,
}

impl Counter {
    /// Counts `cost` admitted hits; `newly_dirty` runs when the counter had
    /// nothing pending. True when it now holds `max_batch` (wake the flusher).
    pub(super) fn charge(&mut self, cost: u64, now: Instant, newly_dirty: impl FnOnce()) -> bool {
        self.pending += cost;
        if self.pending_since.is_none() {
            self.pending_since = Some(now);
            newly_dirty();
        }
        self.pending >= self.batching.max_batch
    }

    /// The check's decision from this pod's view: the last global value
    /// read plus the hits it has not seen yet. Changes nothing.
    pub(super) fn local_decision(
        &self,
        previous: Option<u64>,
        window: u64,
        now: Micros,
        cost: u64,
    ) -> Decision {
        let params = &self.params;
        let unflushed = self.pending + self.in_flight;
        let outcome = match params.algorithm() {
            Algorithm::FixedWindow => {
                let mut state = fixed_window::State {
                    window,
                    count: self.global + unflushed,
                };
                fixed_window::decide(&mut state, now, cost, params)
            }
            Algorithm::SlidingWindowCounter => {
                let mut state = sliding_counter::State {
                    window,
                    current: self.global + unflushed,
                    previous: previous.unwrap_or(self.previous).max(self.previous),
                };
                sliding_counter::decide(&mut state, now, cost, params)
            }
            _ => {
                let unit = params.scale().unit;
                // Rebuilt from counts in the current scale: nothing to convert.
                let level = (self.previous > 0).then(|| token_bucket::Level {
                    tokens: self.global.saturating_sub(unflushed * unit),
                    tick: self.previous,
                    scale: None,
                });
                let level = level.or_else(|| {
                    (unflushed > 0).then(|| token_bucket::Level {
                        tokens: params.scale().capacity.saturating_sub(unflushed * unit),
                        tick: now / params.tick_us(),
                        scale: None,
                    })
                });
                let mut state = token_bucket::State { level };
                token_bucket::decide(&mut state, now, cost, params)
            }
        };
        outcome.decision
    }

    pub(super) fn new(params: &Params, batching: Batching, now: Instant) -> Counter {
        Counter {
            params: params.clone(),
            batching,
            global: 0,
            previous: 0,
            pending: 0,
            in_flight: 0,
            pending_since: None,
            touched: now,
        }
    }

    pub(super) fn due(&self, now: Instant, everything: bool) -> bool {
        self.in_flight == 0
            && self.pending > 0
            && (everything
                || self.pending >= self.batching.max_batch
                || self
                    .pending_since
                    .is_some_and(|t| now >= t + self.batching.sync_interval))
    }

    /// Flush order when more keys are due than a round sends: keys at
    /// max_batch (their checks are waiting) first, then the oldest deltas.
    pub(super) fn urgency(&self) -> (bool, Option<Instant>) {
        (self.pending < self.batching.max_batch, self.pending_since)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_costs_at_most_400_bytes_besides_its_prefix() {
        let slot = std::mem::size_of::<((String, u64), Counter)>() + 1;
        // Up to 2× for the map's spare room (7/8 load, doubling on growth);
        // the module doc's byte bound counts 400 a key.
        assert!(2 * slot <= 400, "entry slot is {slot} bytes");
    }
}
