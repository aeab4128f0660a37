//! The bench's result: counts, throughput, latency percentiles from an HDR
//! histogram, and the per-check cost ratios. Built from plain numbers, so it
//! is tested without a server.

use std::collections::BTreeMap;
use std::fmt;

use hdrhistogram::Histogram;
use serde::Serialize;

/// Latency percentiles of one histogram of microseconds.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LatencySummary {
    /// Recorded values (requests).
    pub count: u64,
    pub mean_us: f64,
    pub p50_us: u64,
    pub p90_us: u64,
    pub p99_us: u64,
    pub p999_us: u64,
    pub max_us: u64,
}

impl LatencySummary {
    pub fn from_histogram(h: &Histogram<u64>) -> LatencySummary {
        // An empty histogram reports max 0 and quantiles 0; keep that (count says so).
        LatencySummary {
            count: h.len(),
            mean_us: if h.is_empty() { 0.0 } else { h.mean() },
            p50_us: h.value_at_quantile(0.50),
            p90_us: h.value_at_quantile(0.90),
            p99_us: h.value_at_quantile(0.99),
            p999_us: h.value_at_quantile(0.999),
            max_us: h.max(),
        }
    }
}

/// `total` per check, or `None` when nothing was checked.
pub fn per_check(total: f64, checks: u64) -> Option<f64> {
    (checks > 0).then(|| total / checks as f64)
}

/// Commands that run a server-side script; what a script calls inside is
/// counted by Redis as commands of their own.
const SCRIPT_COMMANDS: [&str; 6] = [
    "eval",
    "evalsha",
    "eval_ro",
    "evalsha_ro",
    "fcall",
    "fcall_ro",
];

/// Redis work during the measured window.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RedisCost {
    /// Every command Redis executed, including those run inside Lua scripts
    /// (`INFO commandstats` counts both; Redis < 8 cannot tell them apart).
    pub commands: u64,
    pub commands_per_check: Option<f64>,
    /// Script invocations (EVAL, EVALSHA, FCALL and their _RO forms).
    pub scripts: u64,
    pub scripts_per_check: Option<f64>,
    pub cpu_us: u64,
    pub cpu_us_per_check: Option<f64>,
    /// Calls per check of each command Redis saw (`evalsha`, `incrby`, …).
    pub commands_per_check_by_name: BTreeMap<String, f64>,
}

impl RedisCost {
    pub fn new(calls: &BTreeMap<String, u64>, cpu_us: u64, checks: u64) -> RedisCost {
        let commands = calls.values().sum();
        let scripts = calls
            .iter()
            .filter(|(name, _)| SCRIPT_COMMANDS.contains(&name.as_str()))
            .map(|(_, n)| n)
            .sum();
        RedisCost {
            commands,
            commands_per_check: per_check(commands as f64, checks),
            scripts,
            scripts_per_check: per_check(scripts as f64, checks),
            cpu_us,
            cpu_us_per_check: per_check(cpu_us as f64, checks),
            commands_per_check_by_name: calls
                .iter()
                .filter_map(|(name, &n)| Some((name.clone(), per_check(n as f64, checks)?)))
                .collect(),
        }
    }
}

/// CPU time of one process during the measured window.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProcessCost {
    pub cpu_us: u64,
    pub cpu_us_per_check: Option<f64>,
}

impl ProcessCost {
    pub fn new(cpu_us: u64, checks: u64) -> ProcessCost {
        ProcessCost {
            cpu_us,
            cpu_us_per_check: per_check(cpu_us as f64, checks),
        }
    }
}

/// Everything `meridian bench` reports; `--json` prints it as one object.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Summary {
    pub api: String,
    pub target: String,
    /// `open` (fixed rate) or `closed` (fixed concurrency).
    pub mode: &'static str,
    pub rate: Option<u64>,
    pub concurrency: Option<usize>,
    pub connections: usize,
    pub batch: usize,
    pub keys: u64,
    pub dist: String,
    /// Seconds from the end of warm-up to the last measured response.
    pub elapsed_s: f64,
    pub requests: u64,
    pub checks: u64,
    pub throughput_checks_per_s: f64,
    pub allowed: u64,
    pub denied: u64,
    pub errors: u64,
    /// Checks no rule matched (allowed without counting): usually a wrong
    /// `--domain`, `--rule` or `--descriptor`. Native and HTTP APIs only.
    pub unmatched: u64,
    /// Checks per decision reason (native and HTTP APIs): `over_limit`,
    /// `cached_over_limit`, and `fail_open` / `fail_closed` / `fail_local` for
    /// checks decided without the store (its deadline or circuit breaker).
    pub reasons: BTreeMap<String, u64>,
    /// Per request; open loop: from the request's scheduled send time.
    pub latency: LatencySummary,
    /// Open loop only: how late the bench itself sent requests.
    pub send_lag: Option<LatencySummary>,
    pub first_error: Option<String>,
    pub redis: Option<RedisCost>,
    pub server: Option<ProcessCost>,
    /// The bench's own CPU (it competes with the server on a small machine).
    pub client: ProcessCost,
}

fn ms(us: u64) -> f64 {
    us as f64 / 1000.0
}

fn ratio(value: Option<f64>) -> String {
    value.map_or_else(|| "-".to_owned(), |v| format!("{v:.2}"))
}

fn latency_line(f: &mut fmt::Formatter<'_>, label: &str, l: &LatencySummary) -> fmt::Result {
    writeln!(
        f,
        "{label:<11}p50 {:.3} ms  p90 {:.3} ms  p99 {:.3} ms  p99.9 {:.3} ms  max {:.3} ms  (mean {:.3} ms, {} requests)",
        ms(l.p50_us),
        ms(l.p90_us),
        ms(l.p99_us),
        ms(l.p999_us),
        ms(l.max_us),
        l.mean_us / 1000.0,
        l.count
    )
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let load = match (self.rate, self.concurrency) {
            (Some(rate), _) => format!("open loop at {rate} checks/s"),
            (_, Some(c)) => format!("closed loop, {c} streams"),
            _ => self.mode.to_owned(),
        };
        writeln!(
            f,
            "{} {}: {load}, {} connection(s), batch {}, {} keys {}",
            self.api, self.target, self.connections, self.batch, self.keys, self.dist
        )?;
        writeln!(
            f,
            "checks     {} in {:.2} s = {:.0} checks/s ({} requests)",
            self.checks, self.elapsed_s, self.throughput_checks_per_s, self.requests
        )?;
        writeln!(
            f,
            "outcome    allowed {}  denied {}  errors {}{}",
            self.allowed,
            self.denied,
            self.errors,
            if self.unmatched > 0 {
                format!(
                    "  unmatched {} (no rule matched: check --domain/--rule/--descriptor)",
                    self.unmatched
                )
            } else {
                String::new()
            }
        )?;
        if !self.reasons.is_empty() {
            let reasons: Vec<String> = self
                .reasons
                .iter()
                .map(|(reason, n)| format!("{reason} {n}"))
                .collect();
            writeln!(f, "reasons    {}", reasons.join(", "))?;
        }
        latency_line(f, "latency", &self.latency)?;
        if let Some(lag) = &self.send_lag {
            latency_line(f, "send lag", lag)?;
        }
        if let Some(e) = &self.first_error {
            writeln!(f, "first error {e}")?;
        }
        if let Some(r) = &self.redis {
            let by_name: Vec<String> = r
                .commands_per_check_by_name
                .iter()
                .map(|(name, v)| format!("{name} {v:.3}"))
                .collect();
            writeln!(
                f,
                "redis      {} script calls/check, {} commands/check counting those inside scripts ({}), {} µs CPU/check",
                r.scripts_per_check
                    .map_or_else(|| "-".to_owned(), |v| format!("{v:.3}")),
                r.commands_per_check
                    .map_or_else(|| "-".to_owned(), |v| format!("{v:.3}")),
                by_name.join(", "),
                ratio(r.cpu_us_per_check)
            )?;
        }
        if let Some(s) = &self.server {
            writeln!(f, "server     {} µs CPU/check", ratio(s.cpu_us_per_check))?;
        }
        writeln!(
            f,
            "bench      {} µs CPU/check",
            ratio(self.client.cpu_us_per_check)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_of_a_known_histogram() {
        let mut h = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).unwrap();
        for us in 1..=1000 {
            h.record(us).unwrap();
        }
        h.record(50_000).unwrap();
        let s = LatencySummary::from_histogram(&h);
        assert_eq!(s.count, 1001);
        assert_eq!(s.p50_us, 501);
        assert_eq!(s.p90_us, 901);
        assert_eq!(s.p99_us, 991);
        assert_eq!(s.p999_us, 1000);
        // 3 significant digits: the max is exact to within 0.1 %.
        assert!(s.max_us.abs_diff(50_000) <= 50, "max {}", s.max_us);
        assert!((s.mean_us - (500_500.0 + 50_000.0) / 1001.0).abs() < 1.0);
    }

    #[test]
    fn empty_histogram_summarises_to_zeros() {
        let h = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).unwrap();
        let s = LatencySummary::from_histogram(&h);
        assert_eq!((s.count, s.p99_us, s.max_us), (0, 0, 0));
        assert_eq!(s.mean_us, 0.0);
    }

    #[test]
    fn per_check_ratios() {
        assert_eq!(per_check(250.0, 100), Some(2.5));
        assert_eq!(per_check(250.0, 0), None);
        // One EVALSHA per check whose script calls TIME and INCRBY, plus health pings.
        let calls: BTreeMap<String, u64> = [
            ("evalsha", 1000),
            ("time", 1000),
            ("incrby", 1000),
            ("ping", 10),
        ]
        .into_iter()
        .map(|(name, n)| (name.to_owned(), n))
        .collect();
        let r = RedisCost::new(&calls, 4_000, 1000);
        assert_eq!(r.commands, 3010);
        assert_eq!(r.commands_per_check, Some(3.01));
        assert_eq!((r.scripts, r.scripts_per_check), (1000, Some(1.0)));
        assert_eq!(r.cpu_us_per_check, Some(4.0));
        assert_eq!(r.commands_per_check_by_name["evalsha"], 1.0);
        assert_eq!(r.commands_per_check_by_name["ping"], 0.01);
        assert_eq!(ProcessCost::new(25_000, 1000).cpu_us_per_check, Some(25.0));
        assert!(
            RedisCost::new(&calls, 1, 0)
                .commands_per_check_by_name
                .is_empty()
        );
    }
}
