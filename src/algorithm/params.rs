//! Validated parameters of one limit, and the integer scaling the bucket and
//! sliding-counter algorithms use.
//!
//! Every algorithm runs twice — here in Rust and in a Redis Lua script — and both
//! must reach the same decision. Lua numbers are IEEE doubles, exact only for
//! integers below 2^53, so all arithmetic is done on integers kept below that
//! bound. Where a product could exceed it (limit × period for the sliding
//! counter, burst × period for the buckets) time is counted in coarser *ticks*
//! (1 µs, 10 µs, … 1 s), the finest that keeps every intermediate exact.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use super::{InvalidInput, Micros};

/// Largest integer every intermediate value must stay below (Lua's doubles are
/// exact up to 2^53).
pub(crate) const EXACT: u64 = 1 << 53;

/// Largest accepted limit or burst; far above any real quota, and low enough
/// that `count + cost` stays exact.
pub const MAX_LIMIT: u64 = 1_000_000_000_000_000;

/// A sliding log keeps one sorted-set member per admitted hit, so its limit is
/// capped to keep a key's memory bounded (sliding_window_counter has no cap).
pub const MAX_LOG_LIMIT: u64 = 100_000;

/// Shortest period [`Params::new`] accepts.
pub const MIN_PERIOD: Duration = Duration::from_millis(1);
/// Longest period [`Params::new`] accepts: 366 days, so that a rule file's
/// `year` (365 days) fits.
pub const MAX_PERIOD: Duration = Duration::from_secs(366 * 24 * 3600);

/// The five algorithms a rule can choose from (docs/architecture.md). The
/// discriminants index per-algorithm tables (`Algorithm::ALL` order).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// A counter per clock-aligned window (`fixed_window`).
    FixedWindow = 0,
    /// One timestamp per admitted hit over the last period (`sliding_log`); exact.
    SlidingWindowLog,
    /// The current window plus the previous one, weighted (`sliding_counter`).
    SlidingWindowCounter,
    /// `burst` tokens refilled at limit per period (`token_bucket`).
    TokenBucket,
    /// GCRA: a leaky bucket used as a meter, or as a queue via `Decision::delay`.
    LeakyBucket,
}

impl Algorithm {
    /// Every algorithm, in discriminant order.
    pub const ALL: [Algorithm; 5] = [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindowLog,
        Algorithm::SlidingWindowCounter,
        Algorithm::TokenBucket,
        Algorithm::LeakyBucket,
    ];

    /// The name used in rule files.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::FixedWindow => "fixed_window",
            Algorithm::SlidingWindowLog => "sliding_window_log",
            Algorithm::SlidingWindowCounter => "sliding_window_counter",
            Algorithm::TokenBucket => "token_bucket",
            Algorithm::LeakyBucket => "leaky_bucket",
        }
    }

    /// Short tag in storage keys. Distinct per algorithm so that a rule switched
    /// to another algorithm never reads state of the wrong shape.
    pub fn key_tag(self) -> &'static str {
        match self {
            Algorithm::FixedWindow => "fw",
            Algorithm::SlidingWindowLog => "sl",
            Algorithm::SlidingWindowCounter => "sc",
            Algorithm::TokenBucket => "tb",
            Algorithm::LeakyBucket => "lb",
        }
    }

    /// Token bucket and GCRA have a burst; the windowed algorithms do not.
    pub fn has_burst(self) -> bool {
        matches!(self, Algorithm::TokenBucket | Algorithm::LeakyBucket)
    }

    /// The algorithms with an approximate path (`accuracy: approximate`).
    /// Sliding log keeps one entry per hit (nothing to batch into a count)
    /// and GCRA's state is a timestamp that every hit moves by an amount
    /// depending on the previous one, so neither can be summed from deltas.
    pub fn has_approximate_path(self) -> bool {
        matches!(
            self,
            Algorithm::FixedWindow | Algorithm::SlidingWindowCounter | Algorithm::TokenBucket
        )
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Algorithm {
    type Err = InvalidInput;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Algorithm::ALL
            .into_iter()
            .find(|a| a.name() == s)
            .ok_or_else(|| {
                InvalidInput::new(
                    "algorithm",
                    s,
                    "expected one of fixed_window, sliding_window_log, \
                     sliding_window_counter, token_bucket, leaky_bucket",
                )
            })
    }
}

/// How a bucket algorithm counts in integers: one token is `unit` scaled units,
/// each tick refills (token bucket) or drains (GCRA) `refill` of them, and the
/// bucket holds `capacity` = burst × unit. `refill / unit` is exactly the rate
/// limit / period, reduced by their gcd.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BucketScale {
    /// Scaled units per token (one hit).
    pub unit: u64,
    /// Scaled units refilled (or drained) per tick.
    pub refill: u64,
    /// The bucket's size in scaled units: burst × `unit`.
    pub capacity: u64,
}

/// Parameters of one limit, validated: construct with [`Params::new`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Params {
    algorithm: Algorithm,
    limit: u64,
    period_us: Micros,
    burst: u64,
    tick_us: Micros,
    scale: BucketScale,
}

impl Params {
    /// Validates a limit. `limit` and `burst` are signed so that a negative value
    /// read from a file or a request is reported as such rather than wrapped.
    /// `burst` defaults to `limit` for the bucket algorithms and must be absent
    /// for the windowed ones.
    pub fn new(
        algorithm: Algorithm,
        limit: i64,
        period: Duration,
        burst: Option<i64>,
    ) -> Result<Params, InvalidInput> {
        let limit = positive("limit", limit)?;
        if period < MIN_PERIOD || period > MAX_PERIOD {
            return Err(InvalidInput::new(
                "period",
                format!("{period:?}"),
                "must be between 1ms and 366 days",
            ));
        }
        if !period.subsec_nanos().is_multiple_of(1_000_000) {
            return Err(InvalidInput::new(
                "period",
                format!("{period:?}"),
                "must be a whole number of milliseconds",
            ));
        }
        let period_us = period.as_micros() as u64;
        let burst = match (algorithm.has_burst(), burst) {
            (true, Some(b)) => positive("burst", b)?,
            (true, None) => limit,
            (false, Some(b)) => {
                return Err(InvalidInput::new(
                    "burst",
                    b,
                    format!("{algorithm} has no burst; only token_bucket and leaky_bucket do"),
                ));
            }
            (false, None) => limit,
        };
        if algorithm == Algorithm::SlidingWindowLog && limit > MAX_LOG_LIMIT {
            return Err(InvalidInput::new(
                "limit",
                limit,
                "sliding_window_log stores one entry per hit and accepts at most 100000; \
                 use sliding_window_counter for large limits",
            ));
        }
        let (tick_us, scale) = match algorithm {
            Algorithm::FixedWindow | Algorithm::SlidingWindowLog => (1, BucketScale::default()),
            Algorithm::SlidingWindowCounter => {
                let tick = finest_tick(period_us, |ticks| limit.checked_mul(ticks))
                    .ok_or_else(|| too_fine("limit", limit))?;
                (tick, BucketScale::default())
            }
            Algorithm::TokenBucket | Algorithm::LeakyBucket => {
                let tick = finest_tick(period_us, |ticks| {
                    burst.checked_mul(ticks / gcd(limit, ticks))
                })
                .ok_or_else(|| too_fine("burst", burst))?;
                let ticks = period_us / tick;
                let g = gcd(limit, ticks);
                let scale = BucketScale {
                    unit: ticks / g,
                    refill: limit / g,
                    capacity: burst * (ticks / g),
                };
                (tick, scale)
            }
        };
        Ok(Params {
            algorithm,
            limit,
            period_us,
            burst,
            tick_us,
            scale,
        })
    }

    /// The algorithm these parameters are for.
    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// Hits allowed per period (for the buckets: the refill rate per period).
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// The period the limit is counted over.
    pub fn period(&self) -> Duration {
        Duration::from_micros(self.period_us)
    }

    /// The period in microseconds, the unit the algorithms compute in.
    pub fn period_us(&self) -> Micros {
        self.period_us
    }

    /// Bucket size; equal to `limit` for the windowed algorithms.
    pub fn burst(&self) -> u64 {
        self.burst
    }

    /// The most a single check can ask for: `burst` for buckets, `limit` otherwise.
    pub fn capacity(&self) -> u64 {
        if self.algorithm.has_burst() {
            self.burst
        } else {
            self.limit
        }
    }

    /// Time resolution of the integer arithmetic (see the module comment).
    pub fn tick_us(&self) -> Micros {
        self.tick_us
    }

    /// The integer scaling of the bucket algorithms (see [`BucketScale`]).
    pub fn scale(&self) -> BucketScale {
        self.scale
    }

    /// How long a key's state may be kept at least, whatever the algorithm
    /// computes: a floor of min(period, 1 s) so that a caller-supplied timestamp a
    /// little behind the Redis clock never sees its window expire early.
    pub fn ttl_floor_us(&self) -> Micros {
        self.period_us.min(1_000_000)
    }
}

impl Default for BucketScale {
    fn default() -> Self {
        BucketScale {
            unit: 1,
            refill: 1,
            capacity: 0,
        }
    }
}

fn positive(field: &'static str, value: i64) -> Result<u64, InvalidInput> {
    if value < 1 {
        return Err(InvalidInput::new(field, value, "must be at least 1"));
    }
    let value = value as u64;
    if value > MAX_LIMIT {
        return Err(InvalidInput::new(field, value, "must be at most 10^15"));
    }
    Ok(value)
}

fn too_fine(field: &'static str, value: u64) -> InvalidInput {
    InvalidInput::new(
        field,
        value,
        "too large for this period to count exactly; use a period that is a whole number of seconds",
    )
}

/// The finest tick (1 µs … 1 s, powers of ten dividing the period) for which
/// `product(period / tick)` stays below 2^53.
fn finest_tick(period_us: Micros, product: impl Fn(u64) -> Option<u64>) -> Option<Micros> {
    (0..=6)
        .map(|e| 10u64.pow(e))
        .filter(|&tick| period_us.is_multiple_of(tick))
        .find(|tick| product(period_us / tick).is_some_and(|p| p < EXACT))
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(r: Result<Params, InvalidInput>) -> InvalidInput {
        r.expect_err("expected invalid input")
    }

    #[test]
    fn rejects_bad_values_naming_the_field() {
        let s = Duration::from_secs(1);
        let e = err(Params::new(Algorithm::FixedWindow, 0, s, None));
        assert_eq!((e.field, e.value.as_str()), ("limit", "0"));
        let e = err(Params::new(Algorithm::FixedWindow, -5, s, None));
        assert_eq!((e.field, e.value.as_str()), ("limit", "-5"));
        let e = err(Params::new(Algorithm::FixedWindow, 5, Duration::ZERO, None));
        assert_eq!(e.field, "period");
        let e = err(Params::new(Algorithm::TokenBucket, 5, s, Some(0)));
        assert_eq!((e.field, e.value.as_str()), ("burst", "0"));
        let e = err(Params::new(Algorithm::FixedWindow, 5, s, Some(3)));
        assert_eq!(e.field, "burst");
        let e = err(Params::new(Algorithm::SlidingWindowLog, 1_000_000, s, None));
        assert_eq!(e.field, "limit");
        let e = err(Params::new(
            Algorithm::FixedWindow,
            5,
            Duration::from_micros(1500),
            None,
        ));
        assert_eq!(e.field, "period");
        assert!(e.to_string().contains("period"), "{e}");
    }

    #[test]
    fn unknown_algorithm_lists_the_known_ones() {
        let e = "gcra".parse::<Algorithm>().unwrap_err();
        assert_eq!(e.field, "algorithm");
        assert!(e.reason.contains("leaky_bucket"));
    }

    #[test]
    fn bucket_scale_is_the_reduced_rate() {
        // 10 per second: 100 000 µs per token, exact at 1 µs ticks.
        let p = Params::new(Algorithm::TokenBucket, 10, Duration::from_secs(1), Some(5)).unwrap();
        assert_eq!(p.tick_us(), 1);
        assert_eq!(
            p.scale(),
            BucketScale {
                unit: 100_000,
                refill: 1,
                capacity: 500_000
            }
        );
    }

    #[test]
    fn scale_matches_the_lua_benchmark_arguments() {
        // benches/lua_scripts.sh passes these numbers to the bucket scripts.
        let p = Params::new(
            Algorithm::LeakyBucket,
            1_000_000,
            Duration::from_secs(60),
            None,
        )
        .unwrap();
        assert_eq!(p.tick_us(), 1);
        assert_eq!(
            p.scale(),
            BucketScale {
                unit: 60,
                refill: 1,
                capacity: 60_000_000
            }
        );
        let p = Params::new(
            Algorithm::SlidingWindowCounter,
            1_000_000,
            Duration::from_secs(60),
            None,
        )
        .unwrap();
        assert_eq!(p.tick_us(), 1);
    }

    #[test]
    fn coarser_ticks_keep_large_limits_exact() {
        // 10^9 per day: limit × period in µs is ~8.6e19, past 2^53.
        let day = Duration::from_secs(86_400);
        let p = Params::new(Algorithm::SlidingWindowCounter, 1_000_000_000, day, None).unwrap();
        assert!(p.tick_us() > 1);
        assert!(p.limit() * (p.period_us() / p.tick_us()) < EXACT);
        let p = Params::new(
            Algorithm::TokenBucket,
            9_999_991,
            Duration::from_secs(3600),
            None,
        )
        .unwrap();
        assert!(p.scale().capacity < EXACT);
    }
}
