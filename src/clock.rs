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
