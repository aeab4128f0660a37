//! How often limiters report demand, which pods report slower, and how long
//! a lease must be for the rounds that renew it.
//!
//! The report interval has one home: the coordinators, which know their
//! round interval, derive it with [`report_interval_for`] and give it to
//! limiters on the Watch stream (a limiter's `--report-interval` may only
//! shorten it). A pod whose reports still cover much longer spans — an old
//! limiter, an overloaded one — leaves rounds without news of its region;
//! [`ReportCadence`] finds such pods from the spans their reports cover, so
//! the leader can say so (a log line, a gauge, `/readyz`, the dashboard).

use std::collections::BTreeMap;

use super::Millis;
use super::demand::MAX_PODS_PER_REGION;

/// The report interval at long round intervals (the default 60 s rounds
/// get six reports each), and a limiter's until its first Watch message.
pub const DEFAULT_REPORT_INTERVAL_MS: u64 = 10_000;
/// The shortest interval given: every report is a gRPC call per pod, and
/// 100 pods at 2 a second is already 200 calls a second on the leader.
pub const MIN_REPORT_INTERVAL_MS: u64 = 500;

/// The report interval for rounds every `rebalance_interval_ms`: half a
/// round, so every round hears from every pod at least once whatever the
/// phase between the two timers, capped at [`DEFAULT_REPORT_INTERVAL_MS`]
/// and at least [`MIN_REPORT_INTERVAL_MS`].
pub fn report_interval_for(rebalance_interval_ms: i64) -> u64 {
    let half = rebalance_interval_ms.max(0) as u64 / 2;
    half.clamp(MIN_REPORT_INTERVAL_MS, DEFAULT_REPORT_INTERVAL_MS)
}

/// A report covering more than this multiple of the expected interval is a
/// mismatch: jitter, a slow call or a missed tick stay below it, a pod on
/// another interval (10 s against 1 s) does not.
pub const MISMATCH_FACTOR: f64 = 1.5;
/// A mismatched pod is logged at most this often.
pub const WARN_EVERY_MS: i64 = 300_000;
/// Pods a [`ReportCadence`] remembers at most: one region's worth of pods
/// (the leader admits at most [`MAX_PODS_PER_REGION`] per region, so one
/// region's mismatched pods always fit). A further pod is counted in
/// [`ReportCadence::untracked`] instead.
pub const MAX_TRACKED_PODS: usize = MAX_PODS_PER_REGION;

/// A pod whose reports cover longer spans than the interval it was given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlowPod {
    /// The pod's region.
    pub region: String,
    /// The pod, as it names itself in reports.
    pub pod: String,
    /// The span its latest mismatched report covered.
    pub interval_ms: u64,
    /// When that report was heard.
    pub heard_ms: Millis,
}

/// What is remembered of a pod that sent a mismatched report.
#[derive(Debug, Clone, Copy)]
struct Heard {
    /// The span of its latest mismatched report.
    interval_ms: u64,
    /// When that report was heard.
    slow_ms: Millis,
    /// Whether its latest demand report was mismatched (a pod that fixed
    /// its interval stays remembered, for the warning's rate limit only).
    slow: bool,
    /// When it was last logged.
    warned_ms: Option<Millis>,
}

/// The pods whose demand reports cover longer spans than
/// [`MISMATCH_FACTOR`] × the expected interval. Fed every report by the
/// leader; pure and bounded ([`MAX_TRACKED_PODS`]).
#[derive(Debug)]
pub struct ReportCadence {
    /// The interval the coordinators give limiters.
    expected_ms: u64,
    /// (region, pod) → what was heard of it; only pods that were mismatched.
    pods: BTreeMap<(String, String), Heard>,
    /// Pods due a warning line, taken by [`ReportCadence::take_warnings`].
    warnings: Vec<SlowPod>,
    /// Mismatched reports of pods not remembered because the map was full.
    untracked: u64,
}

impl ReportCadence {
    /// A tracker for pods given `expected_ms`.
    pub fn new(expected_ms: u64) -> ReportCadence {
        ReportCadence {
            expected_ms,
            pods: BTreeMap::new(),
            warnings: Vec::new(),
            untracked: 0,
        }
    }

    /// The interval the coordinators give limiters.
    pub fn expected_ms(&self) -> u64 {
        self.expected_ms
    }

    /// Whether a report covering `interval_ms` is a mismatch.
    pub fn mismatched(&self, interval_ms: u64) -> bool {
        interval_ms as f64 > MISMATCH_FACTOR * self.expected_ms as f64
    }

    /// Takes a report of `pod` of `region` covering `interval_ms`, heard at
    /// `now`. Acknowledgements and top-ups alone (interval 0) say nothing
    /// about the interval.
    pub fn observe(&mut self, region: &str, pod: &str, interval_ms: u64, now: Millis) {
        if interval_ms == 0 {
            return;
        }
        let slow = self.mismatched(interval_ms);
        let id = (region.to_string(), pod.to_string());
        if !slow {
            if let Some(heard) = self.pods.get_mut(&id) {
                heard.slow = false;
            }
            return;
        }
        if !self.pods.contains_key(&id) && self.pods.len() >= MAX_TRACKED_PODS {
            self.forget(now);
            if self.pods.len() >= MAX_TRACKED_PODS {
                self.untracked += 1;
                return;
            }
        }
        let warned_ms = self.pods.get(&id).and_then(|h| h.warned_ms);
        let due = warned_ms.is_none_or(|w| now - w >= WARN_EVERY_MS);
        self.pods.insert(
            id,
            Heard {
                interval_ms,
                slow_ms: now,
                slow: true,
                warned_ms: if due { Some(now) } else { warned_ms },
            },
        );
        // Bounded like the map: a caller that never takes them loses lines,
        // not memory.
        if due && self.warnings.len() < MAX_TRACKED_PODS {
            self.warnings.push(SlowPod {
                region: region.to_string(),
                pod: pod.to_string(),
                interval_ms,
                heard_ms: now,
            });
        }
    }

    /// The pods due a warning line since the last call (each at most once
    /// per [`WARN_EVERY_MS`]).
    pub fn take_warnings(&mut self) -> Vec<SlowPod> {
        std::mem::take(&mut self.warnings)
    }

    /// The pods mismatched at `now`, by region and pod: those whose latest
    /// demand report was, unless they have been silent for two of their own
    /// intervals since (gone, or restarted under another name).
    pub fn slow_pods(&self, now: Millis) -> Vec<SlowPod> {
        self.pods
            .iter()
            .filter(|(_, h)| h.slow && !Self::silent(h, now))
            .map(|((region, pod), h)| SlowPod {
                region: region.clone(),
                pod: pod.clone(),
                interval_ms: h.interval_ms,
                heard_ms: h.slow_ms,
            })
            .collect()
    }

    /// Mismatched reports of pods that could not be remembered (the
    /// tracker was full): a count above 0 means [`ReportCadence::slow_pods`]
    /// lists only some.
    pub fn untracked(&self) -> u64 {
        self.untracked
    }

    /// Drops pods silent for two of their intervals whose warning's rate
    /// limit has run out too.
    pub fn forget(&mut self, now: Millis) {
        self.pods.retain(|_, h| {
            let warned_lately = h.warned_ms.is_some_and(|w| now - w < WARN_EVERY_MS);
            (h.slow && !Self::silent(h, now)) || warned_lately
        });
    }

    fn silent(h: &Heard, now: Millis) -> bool {
        now - h.slow_ms > 2 * h.interval_ms as Millis
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_report_interval_is_half_a_round_between_half_a_second_and_ten_seconds() {
        assert_eq!(report_interval_for(60_000), 10_000, "default rounds");
        assert_eq!(report_interval_for(20_000), 10_000);
        assert_eq!(report_interval_for(10_000), 5_000);
        assert_eq!(report_interval_for(2_000), 1_000, "2 s rounds");
        assert_eq!(report_interval_for(500), MIN_REPORT_INTERVAL_MS);
        assert_eq!(report_interval_for(0), MIN_REPORT_INTERVAL_MS);
        assert_eq!(report_interval_for(-5), MIN_REPORT_INTERVAL_MS);
        assert_eq!(report_interval_for(3_600_000), 10_000);
    }

    const T0: Millis = 1_700_000_000_000;

    #[test]
    fn a_pod_on_the_old_interval_is_listed_and_warned_once_per_five_minutes() {
        let mut cadence = ReportCadence::new(1_000);
        // Jitter and a slow call stay below 1.5 ×.
        cadence.observe("mumbai", "m-0", 1_400, T0);
        cadence.observe("mumbai", "m-0", 0, T0);
        assert!(cadence.slow_pods(T0).is_empty());
        assert!(cadence.take_warnings().is_empty());
        // An old limiter reporting every 10 s.
        for i in 0..40 {
            cadence.observe("hyderabad", "h-0", 10_000, T0 + i * 10_000);
        }
        let now = T0 + 39 * 10_000;
        let slow = cadence.slow_pods(now);
        assert_eq!(slow.len(), 1);
        assert_eq!(
            (
                slow[0].region.as_str(),
                slow[0].pod.as_str(),
                slow[0].interval_ms
            ),
            ("hyderabad", "h-0", 10_000)
        );
        // 390 s of reports: warned at 0 s and at 300 s.
        let warnings = cadence.take_warnings();
        assert_eq!(
            warnings.iter().map(|w| w.heard_ms - T0).collect::<Vec<_>>(),
            vec![0, 300_000]
        );
        assert!(cadence.take_warnings().is_empty(), "taken once");
    }

    #[test]
    fn a_pod_that_shortens_its_interval_or_goes_silent_is_no_longer_listed() {
        let mut cadence = ReportCadence::new(1_000);
        cadence.observe("mumbai", "m-0", 10_000, T0);
        cadence.observe("mumbai", "m-1", 10_000, T0);
        assert_eq!(cadence.slow_pods(T0).len(), 2);
        // m-0 restarted on the coordinator's interval.
        cadence.observe("mumbai", "m-0", 1_000, T0 + 1_000);
        let slow = cadence.slow_pods(T0 + 1_000);
        assert_eq!(slow.len(), 1);
        assert_eq!(slow[0].pod, "m-1");
        // m-1 silent for two of its intervals: gone.
        assert!(cadence.slow_pods(T0 + 20_001).is_empty());
        // Both are forgotten once their warning's rate limit ran out, and
        // m-0 slipping back within it is listed but not warned again.
        cadence.take_warnings();
        cadence.observe("mumbai", "m-0", 10_000, T0 + 60_000);
        assert!(cadence.take_warnings().is_empty());
        assert_eq!(cadence.slow_pods(T0 + 60_000).len(), 1);
        cadence.forget(T0 + WARN_EVERY_MS + 60_000);
        assert!(cadence.pods.is_empty());
    }

    #[test]
    fn the_tracker_stays_bounded_and_counts_what_it_could_not_keep() {
        let mut cadence = ReportCadence::new(1_000);
        for i in 0..MAX_TRACKED_PODS + 10 {
            cadence.observe("r", &format!("p{i}"), 5_000, T0);
        }
        assert_eq!(cadence.pods.len(), MAX_TRACKED_PODS);
        assert_eq!(cadence.untracked(), 10);
        assert!(cadence.take_warnings().len() <= MAX_TRACKED_PODS);
        // Once the remembered ones are silent and their warning is old,
        // a new one takes a place.
        let later = T0 + WARN_EVERY_MS + 1;
        cadence.observe("r", "new", 5_000, later);
        assert_eq!(cadence.slow_pods(later).len(), 1);
    }
}
