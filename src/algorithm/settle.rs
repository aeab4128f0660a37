//! What settling a reservation does to a key's state: a reservation is an
//! ordinary admission of `estimate` hits (charged up front, by `decide`);
//! committing it at `actual` then either **refunds** `estimate − actual` or
//! **charges the excess** `actual − estimate`, and releasing it refunds all.
//!
//! - A refund goes back where the estimate was charged, and only while that
//!   charge still counts: fixed window, the same window; sliding window
//!   counter, the current or the previous window (whose weight still counts
//!   it); token bucket, tokens back (capped at the burst); leaky bucket
//!   (GCRA), the TAT moves back. A charge whose window has passed is already
//!   forgotten, so nothing is refunded then.
//! - An excess is charged now (the current window, the bucket's level) and
//!   may take the key past its limit, by at most `max_overdraft` hits: debt
//!   that later checks wait out. What the cap leaves over is not charged.
//! - sliding_window_log has no reservations: it keeps one entry per hit,
//!   capped at `MAX_LOG_LIMIT` (100,000), too few for cost budgets (tokens,
//!   cents), and a refund would have to find the reservation's own entries.
//!
//! A reservation never settled needs nothing: its estimate stays charged,
//! which is what "settles at its estimate" means.
//!
//! `src/store/redis/scripts/settle.lua` does the same arithmetic on the same
//! integers (kept below 2^53, see `params`); both stores call these or it.

use super::{Algorithm, KeyState, Micros, Outcome, Params, drain};

/// Whether `algorithm` takes reservations (see the module doc).
pub fn reservable(algorithm: Algorithm) -> bool {
    algorithm != Algorithm::SlidingWindowLog
}

/// Gives back up to `amount` hits charged at `charged_at` (µs), as far as that
/// charge still counts at `now`. Returns the hits given back.
pub fn refund(
    state: &mut KeyState,
    charged_at: Micros,
    now: Micros,
    amount: u64,
    params: &Params,
) -> u64 {
    // A peek first: it rolls windows forward and converts a bucket counted
    // under an older limit, so what follows reads the state at `now`.
    state.decide(now, 0, params);
    let period = params.period_us();
    match state {
        KeyState::FixedWindow(s) => {
            if s.window != charged_at / period {
                return 0;
            }
            let back = amount.min(s.count);
            s.count -= back;
            back
        }
        KeyState::SlidingCounter(s) => {
            let charged = charged_at / period;
            let count = if charged == s.window {
                &mut s.current
            } else if charged + 1 == s.window {
                &mut s.previous
            } else {
                return 0;
            };
            let back = amount.min(*count);
            *count -= back;
            back
        }
        KeyState::TokenBucket(_) => {
            let level = bucket_level(state, now, params);
            let Some(level) = level else { return 0 };
            let scale = params.scale();
            let capacity = i128::from(scale.capacity);
            let after = (level + i128::from(amount) * i128::from(scale.unit)).min(capacity);
            set_bucket_level(state, now, after, params);
            ((after - level).max(0) / i128::from(scale.unit)) as u64
        }
        KeyState::LeakyBucket(s) => {
            let Some(t) = s.tat.as_mut() else { return 0 };
            let unit = params.scale().unit;
            let (backlog, tick) = backlog_at(t, now, params);
            let back = (amount * unit).min(backlog);
            t.backlog = backlog - back;
            t.tick = tick;
            back / unit
        }
        KeyState::SlidingLog(_) => 0,
    }
}

/// Charges up to `amount` more hits now, letting the key go past its limit
/// by at most `max_overdraft` hits. Returns the hits charged.
pub fn charge(
    state: &mut KeyState,
    now: Micros,
    amount: u64,
    max_overdraft: u64,
    params: &Params,
) -> u64 {
    state.decide(now, 0, params);
    let ceiling = params.limit() + max_overdraft;
    match state {
        KeyState::FixedWindow(s) => {
            let charged = amount.min(ceiling.saturating_sub(s.count));
            s.count += charged;
            charged
        }
        KeyState::SlidingCounter(s) => {
            let (period, tick) = (params.period_us(), params.tick_us());
            let ticks = period / tick;
            let elapsed = (now - s.window * period) / tick;
            let count = s.current + s.previous * (ticks - elapsed) / ticks;
            let charged = amount.min(ceiling.saturating_sub(count));
            s.current += charged;
            charged
        }
        KeyState::TokenBucket(_) => {
            let scale = params.scale();
            let unit = i128::from(scale.unit);
            let level = bucket_level(state, now, params).unwrap_or(i128::from(scale.capacity));
            let floor = -i128::from(max_overdraft) * unit;
            let room = ((level - floor).max(0) / unit) as u64;
            let charged = amount.min(room);
            set_bucket_level(state, now, level - i128::from(charged) * unit, params);
            charged
        }
        KeyState::LeakyBucket(s) => {
            let scale = params.scale();
            let tat = s.tat.get_or_insert(super::leaky_bucket::Tat {
                backlog: 0,
                tick: now / params.tick_us(),
                scale: Some(super::CountedIn::of(params)),
            });
            let (backlog, tick) = backlog_at(tat, now, params);
            let cap = scale.capacity + max_overdraft * scale.unit;
            let charged = amount.min(cap.saturating_sub(backlog) / scale.unit);
            tat.backlog = backlog + charged * scale.unit;
            tat.tick = tick;
            charged
        }
        KeyState::SlidingLog(_) => 0,
    }
}

/// The state's decision for a check-only peek at `now`, and how long to
/// keep it: what a store answers (and expires by) after a settlement.
pub fn settled(state: &mut KeyState, now: Micros, params: &Params) -> Outcome {
    state.decide(now, 0, params)
}

/// How far past `params` a committed excess may take a key: `max_overdraft`
/// when set, else the limit's capacity (its limit; a bucket's burst),
/// clipped to [`max_exact_overdraft`]. The rules (`Rule::overdraft`) and the
/// simulator both ask here.
pub fn overdraft(max_overdraft: Option<u64>, params: &Params) -> u64 {
    max_overdraft
        .unwrap_or_else(|| params.capacity())
        .min(max_exact_overdraft(params))
}

/// The largest `max_overdraft` that keeps a bucket's arithmetic exact
/// (below 2^53 scaled units, as the Lua scripts need): a rule's default is
/// its capacity, clipped to this.
pub fn max_exact_overdraft(params: &Params) -> u64 {
    let scale = params.scale();
    if params.algorithm().has_burst() {
        (super::params::EXACT - 1 - scale.capacity) / scale.unit
    } else {
        super::params::EXACT - 1 - params.limit()
    }
}

/// A token bucket's level at `now` in signed scaled units (negative: debt),
/// `None` for a bucket never charged (full). Debt is kept as an empty bucket
/// whose refill starts at a later tick, which `decide` already reads
/// correctly ("a timestamp behind the last refill refills nothing").
fn bucket_level(state: &KeyState, now: Micros, params: &Params) -> Option<i128> {
    let KeyState::TokenBucket(s) = state else {
        return None;
    };
    let l = s.level?;
    let now_tick = now / params.tick_us();
    // After the peek, `tick >= now_tick`.
    let ahead = l.tick.saturating_sub(now_tick);
    Some(i128::from(l.tokens) - i128::from(ahead) * i128::from(params.scale().refill))
}

/// Stores a signed level (see [`bucket_level`]) at `now`.
fn set_bucket_level(state: &mut KeyState, now: Micros, level: i128, params: &Params) {
    let KeyState::TokenBucket(s) = state else {
        return;
    };
    let now_tick = now / params.tick_us();
    let refill = i128::from(params.scale().refill);
    let (tokens, tick) = if level >= 0 {
        (level, now_tick)
    } else {
        let ahead = (-level + refill - 1) / refill;
        (ahead * refill + level, now_tick + ahead as u64)
    };
    s.level = Some(super::token_bucket::Level {
        tokens: tokens as u64,
        tick,
        scale: Some(super::CountedIn::of(params)),
    });
}

/// A GCRA backlog drained to `now` and the tick it is counted from.
fn backlog_at(t: &super::leaky_bucket::Tat, now: Micros, params: &Params) -> (u64, u64) {
    let tick = (now / params.tick_us()).max(t.tick);
    (drain(t.backlog, tick - t.tick, params.scale().refill), tick)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::time::Duration;

    const T: Micros = 1_080_000_000_000_000; // a window boundary of every period used

    fn params(algorithm: Algorithm, limit: i64, secs: u64) -> Params {
        Params::new(algorithm, limit, Duration::from_secs(secs), None).expect("valid params")
    }

    const RESERVABLE: [Algorithm; 4] = [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindowCounter,
        Algorithm::TokenBucket,
        Algorithm::LeakyBucket,
    ];

    #[test]
    fn refund_in_the_same_window_gives_the_room_back() {
        for algorithm in RESERVABLE {
            let p = params(algorithm, 10_000, 3600);
            let mut s = KeyState::fresh(algorithm);
            for _ in 0..100 {
                assert!(s.decide(T, 100, &p).decision.allowed, "{algorithm}");
            }
            assert!(!s.decide(T, 100, &p).decision.allowed, "{algorithm}");
            for _ in 0..100 {
                assert_eq!(refund(&mut s, T, T + 1, 60, &p), 60, "{algorithm}");
            }
            // 6,000 back: exactly 150 reservations of 40 fit, the 151st not.
            for _ in 0..150 {
                assert!(s.decide(T + 2, 40, &p).decision.allowed, "{algorithm}");
            }
            assert!(!s.decide(T + 2, 40, &p).decision.allowed, "{algorithm}");
        }
    }

    #[test]
    fn a_window_that_no_longer_counts_refunds_nothing() {
        let p = params(Algorithm::FixedWindow, 10, 60);
        let mut s = KeyState::fresh(Algorithm::FixedWindow);
        s.decide(T + 59_000_000, 10, &p);
        assert_eq!(refund(&mut s, T + 59_000_000, T + 60_000_000, 5, &p), 0);
        // The sliding counter still weighs the previous window: refunded
        // there; two windows on, nothing.
        let p = params(Algorithm::SlidingWindowCounter, 10, 60);
        let mut s = KeyState::fresh(Algorithm::SlidingWindowCounter);
        s.decide(T + 59_000_000, 10, &p);
        assert_eq!(refund(&mut s, T + 59_000_000, T + 60_000_000, 4, &p), 4);
        assert_eq!(s.decide(T + 60_000_000, 0, &p).decision.remaining, 4);
        assert_eq!(refund(&mut s, T + 59_000_000, T + 120_000_000, 4, &p), 0);
    }

    #[test]
    fn excess_is_debt_capped_by_the_overdraft_and_waited_out() {
        for algorithm in RESERVABLE {
            let p = params(algorithm, 100, 100); // one hit a second for the buckets
            let mut s = KeyState::fresh(algorithm);
            assert!(s.decide(T, 100, &p).decision.allowed);
            // 30 past the limit asked, 20 allowed.
            assert_eq!(charge(&mut s, T, 30, 20, &p), 20, "{algorithm}");
            assert_eq!(charge(&mut s, T, 1, 20, &p), 0, "{algorithm}");
            let d = s.decide(T, 1, &p).decision;
            assert!(!d.allowed, "{algorithm}");
            if algorithm.has_burst() {
                // 20 of debt and one hit: 21 s.
                assert_eq!(d.retry_after_us, 21_000_000, "{algorithm}");
                assert!(!s.decide(T + 20_999_999, 1, &p).decision.allowed);
                assert!(s.decide(T + 21_000_000, 1, &p).decision.allowed);
            }
        }
    }

    #[test]
    fn a_zero_overdraft_charges_up_to_the_limit_only() {
        for algorithm in RESERVABLE {
            let p = params(algorithm, 100, 100);
            let mut s = KeyState::fresh(algorithm);
            assert!(s.decide(T, 90, &p).decision.allowed);
            assert_eq!(charge(&mut s, T, 30, 0, &p), 10, "{algorithm}");
            assert_eq!(settled(&mut s, T, &p).decision.remaining, 0);
        }
    }

    #[test]
    fn the_default_overdraft_fits_exactly() {
        let p = Params::new(
            Algorithm::TokenBucket,
            9_999_991,
            Duration::from_secs(3600),
            None,
        )
        .expect("valid");
        let max = max_exact_overdraft(&p);
        assert!(max >= p.capacity(), "{max}");
        assert!(p.scale().capacity + max * p.scale().unit < super::super::params::EXACT);
    }

    proptest! {
        /// Reserving and settling never leaves more charged than admitted
        /// plus the excess charged, and a refund of everything after a
        /// reservation in the same instant restores the untouched state's
        /// answer.
        #[test]
        fn reserve_then_release_restores_the_room(
            a in 0usize..4, limit in 1i64..1000, secs in 1u64..100, used in 0u64..1000,
            estimate in 1u64..1000, offset in 0u64..1_000_000,
        ) {
            let algorithm = RESERVABLE[a];
            let p = params(algorithm, limit, secs);
            let used = used % p.limit();
            let estimate = 1 + estimate % (p.limit() - used);
            let now = T + offset;
            let mut s = KeyState::fresh(algorithm);
            if used > 0 {
                s.decide(now, used, &p);
            }
            let before = s.clone().decide(now, 0, &p).decision.remaining;
            prop_assume!(s.decide(now, estimate, &p).decision.allowed);
            prop_assert_eq!(refund(&mut s, now, now, estimate, &p), estimate);
            prop_assert_eq!(s.decide(now, 0, &p).decision.remaining, before);
        }

        /// Whatever the overdraft, the key never goes further past its
        /// limit than it, and what is charged is never more than asked.
        #[test]
        fn charges_respect_the_ceiling(
            a in 0usize..4, limit in 1i64..1000, amount in 0u64..5000, overdraft in 0u64..1000,
            offset in 0u64..1_000_000,
        ) {
            let algorithm = RESERVABLE[a];
            let p = params(algorithm, limit, 10);
            let now = T + offset;
            let mut s = KeyState::fresh(algorithm);
            let charged = charge(&mut s, now, amount, overdraft, &p);
            prop_assert!(charged <= amount);
            prop_assert_eq!(charged, amount.min(p.limit() + overdraft));
        }
    }
}
