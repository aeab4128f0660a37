//! Open-loop send times. Request `i` is due at `i × batch / rate` seconds after
//! the start, computed from `i` each time (integer nanoseconds, no accumulated
//! float drift), and its latency counts from that due time — so a stalled
//! server delays the clock of every request queued behind it (no coordinated
//! omission).

use std::time::Duration;

const NANOS_PER_SEC: u128 = 1_000_000_000;

/// When each request of an open-loop run is due (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Schedule {
    /// Checks per second.
    rate: u64,
    /// Checks per request.
    batch: u64,
}

impl Schedule {
    /// `rate` checks per second in requests of `batch` checks; both ≥ 1.
    pub fn new(rate: u64, batch: u64) -> Option<Schedule> {
        (rate > 0 && batch > 0).then_some(Schedule { rate, batch })
    }

    /// When request `i` is due, from the start of the run.
    pub fn due(&self, i: u64) -> Duration {
        let nanos = i as u128 * self.batch as u128 * NANOS_PER_SEC / self.rate as u128;
        Duration::from_nanos(nanos as u64)
    }

    /// How many requests are due strictly before `t`.
    pub fn due_before(&self, t: Duration) -> u64 {
        // due(i) < t  ⇔  ⌊i·b·10⁹ / r⌋ < t  ⇔  i·b·10⁹ < t·r  (t is whole nanoseconds),
        // so the count is ⌈t·r / (b·10⁹)⌉.
        let numerator = t.as_nanos() * self.rate as u128;
        let per_request = self.batch as u128 * NANOS_PER_SEC;
        numerator.div_ceil(per_request) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spaces_requests_evenly_without_drift() {
        let s = Schedule::new(3, 1).unwrap();
        assert_eq!(s.due(0), Duration::ZERO);
        assert_eq!(s.due(1), Duration::from_nanos(333_333_333));
        assert_eq!(s.due(2), Duration::from_nanos(666_666_666));
        assert_eq!(s.due(3), Duration::from_secs(1));
        // A day later the schedule is still exact to the nanosecond.
        assert_eq!(s.due(3 * 86_400), Duration::from_secs(86_400));
    }

    #[test]
    fn batches_divide_the_request_rate() {
        // 1000 checks/s in batches of 4 = one request every 4 ms.
        let s = Schedule::new(1000, 4).unwrap();
        assert_eq!(s.due(1), Duration::from_millis(4));
        assert_eq!(s.due_before(Duration::from_secs(1)), 250);
    }

    #[test]
    fn counts_requests_due_before_a_time() {
        let s = Schedule::new(3, 1).unwrap();
        assert_eq!(s.due_before(Duration::ZERO), 0);
        assert_eq!(s.due_before(Duration::from_nanos(1)), 1);
        assert_eq!(s.due_before(Duration::from_nanos(333_333_333)), 1);
        assert_eq!(s.due_before(Duration::from_nanos(333_333_334)), 2);
        assert_eq!(s.due_before(Duration::from_secs(1)), 3);
        assert_eq!(s.due_before(Duration::from_secs(10)), 30);
    }

    #[test]
    fn due_before_agrees_with_due() {
        for (rate, batch) in [(7, 1), (100_000, 1), (1000, 3), (5, 10)] {
            let s = Schedule::new(rate, batch).unwrap();
            for i in 0..200 {
                let t = s.due(i);
                assert_eq!(s.due_before(t), i, "rate {rate} batch {batch} i {i}");
                assert_eq!(s.due_before(t + Duration::from_nanos(1)), i + 1);
            }
        }
    }

    #[test]
    fn rejects_zero_rate_or_batch() {
        assert!(Schedule::new(0, 1).is_none());
        assert!(Schedule::new(1, 0).is_none());
    }
}
