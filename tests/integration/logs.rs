//! What the services write to stderr when it is a pipe or a file, as under
//! systemd, Kubernetes or a test harness: plain text without colour codes,
//! or with `--log-format json` one JSON object per line.

use crate::common;

use std::time::Duration;

use common::coordinator::{Cluster, Options};
use common::limiter::LimiterProcess;

const RULES: &str = "domain: api\ndescriptors:\n  - key: user\n    rate_limit:\n      unit: minute\n      requests_per_unit: 10\n";

/// The escape sequence that starts every ANSI colour code.
const ANSI: &str = "\x1b[";

#[test]
fn limiter_logs_to_a_pipe_carry_no_colour_codes() {
    let mut limiter = LimiterProcess::start_logging(RULES, &["--store", "memory"]);
    let (status, logs) = limiter.terminate_reading_logs();
    assert!(status.success(), "{status:?}");
    assert!(logs.contains("limiter serving"), "no start-up line: {logs}");
    assert!(!logs.contains(ANSI), "colour codes in piped logs: {logs:?}");
}

#[test]
fn limiter_log_format_json_writes_one_object_per_line() {
    let mut limiter =
        LimiterProcess::start_logging(RULES, &["--store", "memory", "--log-format", "json"]);
    let (status, logs) = limiter.terminate_reading_logs();
    assert!(status.success(), "{status:?}");
    let lines: Vec<&str> = logs.lines().collect();
    assert!(lines.len() >= 2, "expected start and stop lines: {logs}");
    for line in &lines {
        let object: serde_json::Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("not a JSON line ({e}): {line:?}"));
        assert!(object.is_object(), "{line}");
        assert!(object["level"].is_string(), "no level: {line}");
    }
    assert!(
        lines.iter().any(|l| l.contains("limiter serving")),
        "no start-up line: {logs}"
    );
}

#[tokio::test]
async fn coordinator_log_file_carries_no_colour_codes() {
    let mut cluster = Cluster::start(1, Options::default()).await;
    assert!(cluster.terminate(1, Duration::from_secs(10)), "SIGTERM");
    let logs = cluster.node(1).log_tail();
    assert!(logs.contains("coordinator listening"), "{logs}");
    assert!(
        !logs.contains(ANSI),
        "colour codes in the log file: {logs:?}"
    );
}
