//! Where every answered or failed request lands. Shared by all request tasks:
//! counters are atomics, histograms are sharded behind short `std` mutexes
//! (no `.await` while held), so tasks on different threads rarely meet.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

use super::api::Tally;

const SHARDS: usize = 16;
/// Latencies are recorded in µs up to an hour (higher values saturate).
const MAX_LATENCY_US: u64 = 3_600_000_000;

/// One finished request.
pub struct Sample {
    /// Spreads recording over the shards (a stream or request number).
    pub shard: usize,
    /// Sent after warm-up: counts towards the summary.
    pub measured: bool,
    pub checks: usize,
    /// From the scheduled (open loop) or actual (closed loop) send time.
    pub latency: Duration,
    /// Open loop: actual minus scheduled send time.
    pub lag: Option<Duration>,
    pub done: Instant,
    pub result: Result<Tally, String>,
}

/// Running totals of requests and their answers; atomics, added to by every
/// sending task without a lock.
#[derive(Default)]
struct Counts {
    requests: AtomicU64,
    checks: AtomicU64,
    allowed: AtomicU64,
    denied: AtomicU64,
    errors: AtomicU64,
    unmatched: AtomicU64,
}

/// Plain copy of [`Counts`].
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct Totals {
    pub requests: u64,
    pub checks: u64,
    pub allowed: u64,
    pub denied: u64,
    pub errors: u64,
    pub unmatched: u64,
}

impl Counts {
    fn add(&self, checks: usize, tally: &Tally) {
        self.requests.fetch_add(1, Relaxed);
        self.checks.fetch_add(checks as u64, Relaxed);
        self.allowed.fetch_add(tally.allowed, Relaxed);
        self.denied.fetch_add(tally.denied, Relaxed);
        self.errors.fetch_add(tally.errors, Relaxed);
        self.unmatched.fetch_add(tally.unmatched, Relaxed);
    }

    fn totals(&self) -> Totals {
        Totals {
            requests: self.requests.load(Relaxed),
            checks: self.checks.load(Relaxed),
            allowed: self.allowed.load(Relaxed),
            denied: self.denied.load(Relaxed),
            errors: self.errors.load(Relaxed),
            unmatched: self.unmatched.load(Relaxed),
        }
    }
}

/// Latency histograms of the streams whose `shard` maps here; one lock each so
/// that streams rarely contend.
struct Shard {
    /// Measured, successful requests' latency (`Sample::latency`), µs.
    latency: Histogram<u64>,
    /// Open loop: how late each request was sent after its due time, µs.
    lag: Histogram<u64>,
}

/// A bench run's measurements, shared by every sending task: counts, latency
/// and lag histograms, decision reasons and the first error.
pub struct Recorder {
    /// The run's start; `last_done_ns` counts from it.
    start: Instant,
    /// Every request, warm-up included: feeds the progress line.
    all: Counts,
    /// Sum of latencies (µs) of `all`, for the progress line's mean.
    all_latency_us: AtomicU64,
    /// Requests sent after warm-up: the summary.
    measured: Counts,
    /// Sharded by stream so sending tasks rarely wait on one another.
    shards: Vec<Mutex<Shard>>,
    /// Kept for the summary: one error explains most failed runs.
    first_error: Mutex<Option<String>>,
    /// Measured checks per decision reason; locked only for requests that have any.
    reasons: Mutex<BTreeMap<String, u64>>,
    /// Nanoseconds from `start` to the last measured answer.
    last_done_ns: AtomicU64,
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, MAX_LATENCY_US, 3).expect("static histogram bounds are valid")
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

impl Recorder {
    pub fn new(start: Instant) -> Recorder {
        Recorder {
            start,
            all: Counts::default(),
            all_latency_us: AtomicU64::new(0),
            measured: Counts::default(),
            shards: (0..SHARDS)
                .map(|_| {
                    Mutex::new(Shard {
                        latency: histogram(),
                        lag: histogram(),
                    })
                })
                .collect(),
            first_error: Mutex::new(None),
            reasons: Mutex::new(BTreeMap::new()),
            last_done_ns: AtomicU64::new(0),
        }
    }

    pub fn record(&self, sample: Sample) {
        let failed = sample.result.is_err();
        let tally = match sample.result {
            Ok(tally) => tally,
            Err(error) => Tally {
                errors: sample.checks as u64,
                error: Some(error),
                ..Tally::default()
            },
        };
        if let Some(error) = &tally.error {
            let mut first = self.first_error.lock().unwrap_or_else(|e| e.into_inner());
            first.get_or_insert_with(|| error.clone());
        }
        let latency_us = micros(sample.latency).max(1);
        self.all.add(sample.checks, &tally);
        self.all_latency_us.fetch_add(latency_us, Relaxed);
        if !sample.measured {
            return;
        }
        self.measured.add(sample.checks, &tally);
        if !tally.reasons.is_empty() {
            let mut reasons = self.reasons.lock().unwrap_or_else(|e| e.into_inner());
            for (reason, n) in tally.reasons {
                *reasons.entry(reason).or_default() += n;
            }
        }
        let done_ns =
            u64::try_from(sample.done.duration_since(self.start).as_nanos()).unwrap_or(u64::MAX);
        self.last_done_ns.fetch_max(done_ns, Relaxed);
        // A failed request has no latency worth reporting (a refused
        // connection is fast); it shows in `errors`.
        if !failed {
            let mut shard = self.shards[sample.shard % SHARDS]
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            shard.latency.saturating_record(latency_us);
            if let Some(lag) = sample.lag {
                shard.lag.saturating_record(micros(lag).max(1));
            }
        }
    }

    /// Everything so far (warm-up included) and the latency sum, for progress.
    pub fn progress(&self) -> (Totals, u64) {
        (self.all.totals(), self.all_latency_us.load(Relaxed))
    }

    pub fn measured(&self) -> Totals {
        self.measured.totals()
    }

    /// The last measured answer, if any.
    pub fn last_done(&self) -> Option<Instant> {
        match self.last_done_ns.load(Relaxed) {
            0 => None,
            ns => Some(self.start + Duration::from_nanos(ns)),
        }
    }

    pub fn first_error(&self) -> Option<String> {
        self.first_error
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Measured checks per decision reason.
    pub fn reasons(&self) -> BTreeMap<String, u64> {
        self.reasons
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Merged (latency, send lag) histograms of the measured requests.
    pub fn histograms(&self) -> (Histogram<u64>, Histogram<u64>) {
        let (mut latency, mut lag) = (histogram(), histogram());
        for shard in &self.shards {
            let shard = shard.lock().unwrap_or_else(|e| e.into_inner());
            latency
                .add(&shard.latency)
                .expect("shards share the bounds");
            lag.add(&shard.lag).expect("shards share the bounds");
        }
        (latency, lag)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(
        measured: bool,
        checks: usize,
        latency_ms: u64,
        result: Result<Tally, String>,
    ) -> Sample {
        Sample {
            shard: 3,
            measured,
            checks,
            latency: Duration::from_millis(latency_ms),
            lag: None,
            done: Instant::now(),
            result,
        }
    }

    #[test]
    fn warm_up_shows_in_progress_but_not_in_the_summary() {
        let r = Recorder::new(Instant::now());
        let allowed = Tally {
            allowed: 2,
            reasons: [("fail_open".to_owned(), 1)].into_iter().collect(),
            ..Tally::default()
        };
        r.record(sample(false, 2, 5, Ok(allowed.clone())));
        r.record(sample(true, 2, 7, Ok(allowed)));
        assert_eq!(r.progress().0.allowed, 4);
        assert_eq!(r.progress().1, 12_000);
        assert_eq!(r.measured().allowed, 2);
        assert_eq!(r.reasons().get("fail_open"), Some(&1));
        assert_eq!(r.histograms().0.len(), 1);
        assert!(r.last_done().is_some());
    }

    #[test]
    fn a_failed_request_counts_all_its_checks_as_errors_and_no_latency() {
        let r = Recorder::new(Instant::now());
        r.record(sample(true, 10, 1, Err("connection refused".into())));
        let denied = Tally {
            denied: 10,
            ..Tally::default()
        };
        r.record(sample(true, 10, 1, Ok(denied)));
        let t = r.measured();
        assert_eq!((t.requests, t.checks, t.errors, t.denied), (2, 20, 10, 10));
        assert_eq!(r.histograms().0.len(), 1);
        assert_eq!(r.first_error().as_deref(), Some("connection refused"));
    }
}
