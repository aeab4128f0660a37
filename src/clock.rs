//! The wall clock: every "what time is it, in Unix time" read in Meridian.
//!
//! One home so that the coordinator (lease deadlines, rule-set timestamps),
//! the limiter (window boundaries, allocation table) and the embedded store
//! agree on the same clock and the same rounding, and so a reader finds every
//! wall-clock dependency with one grep. The pure core (`algorithm`,
//! `allocation`) never calls this: it is handed the time as a plain value.
//!
//! A clock set before 1970 reads as 0 rather than failing: callers compare
//! and subtract these values, and a zero merely makes leases look lapsed.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::algorithm::Micros;

#[cfg(test)]
thread_local! {
    /// A test's stopped clock (`freeze`): every read on this thread answers it.
    static FROZEN: std::cell::Cell<Option<Duration>> = const { std::cell::Cell::new(None) };
}

/// Stops this thread's clock at `at` since the epoch (`None`: runs again), so
/// that a test can drive two paths at the very same instant.
#[cfg(test)]
pub(crate) fn freeze(at: Option<Duration>) {
    FROZEN.set(at);
}

fn since_epoch() -> Duration {
    #[cfg(test)]
    if let Some(at) = FROZEN.get() {
        return at;
    }
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
}

/// Now, in Unix milliseconds: the unit of leases, epochs and rule-set
/// timestamps (`allocation::Millis`).
pub fn now_unix_ms() -> i64 {
    i64::try_from(since_epoch().as_millis()).unwrap_or(i64::MAX)
}

/// Now, in Unix microseconds: the unit of the rate-limit algorithms and of
/// stores that are not told the time.
pub fn now_unix_us() -> Micros {
    // `as_micros` in u64 arithmetic: the same value, saturating where the
    // u128 one would not fit, without a 128-bit multiply per check.
    let since = since_epoch();
    since
        .as_secs()
        .saturating_mul(1_000_000)
        .saturating_add(u64::from(since.subsec_micros()))
}

/// [`now_unix_us`] for decisions made in this process (the embedded store):
/// read from the CPU's time-stamp counter through `quanta` (about 12 ns
/// here) instead of the system clock (about 43 ns with its conversion; a
/// fifth of a whole decision on one key). Kept on the system clock's time:
/// the counter gives the time elapsed since a shared start, and the offset
/// to Unix time is read again from the system clock every
/// [`REANCHOR_US`], so an NTP slew (at most 500 ppm) moves it by at most
/// 50 µs and a stepped clock is followed within that period. Where the
/// counter is not reliable, `quanta` reads the OS's monotonic clock instead.
/// The first read in a process calibrates the counter (about 0.6 ms here,
/// once). Two threads may see the offset change in between their reads: a decision
/// already takes `now` from before its shard lock, so the algorithms see
/// times slightly out of order across threads either way.
pub fn now_unix_us_fast() -> Micros {
    #[cfg(test)]
    if FROZEN.get().is_some() {
        return now_unix_us();
    }
    let fast = FAST.get_or_init(Fast::new);
    let elapsed = fast.elapsed_us();
    if elapsed >= fast.reanchor_at.load(Ordering::Relaxed) {
        return fast.reanchor(elapsed);
    }
    elapsed.wrapping_add(fast.offset.load(Ordering::Relaxed))
}

/// How often [`now_unix_us_fast`] reads the system clock again.
pub const REANCHOR_US: Micros = 100_000;

static FAST: std::sync::OnceLock<Fast> = std::sync::OnceLock::new();

struct Fast {
    clock: quanta::Clock,
    /// The counter at the start: every reading is µs since then.
    start: u64,
    /// Unix µs minus µs since `start`, as of the last reading of the system
    /// clock (wrapping: Unix time is ahead of the elapsed time).
    offset: AtomicU64,
    /// Elapsed µs at which the system clock is read again.
    reanchor_at: AtomicU64,
}

impl Fast {
    fn new() -> Fast {
        let clock = quanta::Clock::new();
        let start = clock.raw();
        Fast {
            clock,
            start,
            offset: AtomicU64::new(0),
            // The first reading anchors.
            reanchor_at: AtomicU64::new(0),
        }
    }

    fn elapsed_us(&self) -> Micros {
        self.clock.delta_as_nanos(self.start, self.clock.raw()) / 1_000
    }

    /// Reads the system clock, keeps its offset to `elapsed`, and answers it.
    fn reanchor(&self, elapsed: Micros) -> Micros {
        let unix = now_unix_us();
        self.offset
            .store(unix.wrapping_sub(elapsed), Ordering::Relaxed);
        self.reanchor_at
            .store(elapsed.saturating_add(REANCHOR_US), Ordering::Relaxed);
        unix
    }
}

/// Now, in Unix nanoseconds: only for stamps that must differ between two
/// reads in quick succession (snapshot ids), never for arithmetic.
pub fn now_unix_ns() -> u128 {
    since_epoch().as_nanos()
}

/// Unix milliseconds as `YYYY-MM-DD HH:MM:SSZ` (UTC), for people: ctl's
/// tables and drill reports.
pub fn utc_text(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The counter's time stays on the system clock's: read side by side
    /// for longer than several re-anchoring periods, the two never differ by
    /// more than the time between the reads plus a slew's worth.
    #[test]
    fn the_fast_clock_keeps_the_system_clocks_time() {
        let until = std::time::Instant::now() + Duration::from_micros(4 * REANCHOR_US);
        let mut reads = 0;
        while std::time::Instant::now() < until {
            let before = now_unix_us();
            let fast = now_unix_us_fast();
            let after = now_unix_us();
            assert!(
                fast + 100 >= before && fast <= after + 100,
                "fast {fast} outside [{before}, {after}] by more than 100 µs"
            );
            reads += 1;
        }
        assert!(reads > 1_000, "{reads} reads");
    }

    #[test]
    fn a_frozen_clock_stops_the_fast_one_too() {
        let at = Duration::from_secs(1_000);
        freeze(Some(at));
        let fast = now_unix_us_fast();
        freeze(None);
        assert_eq!(fast, 1_000_000_000);
    }
}
