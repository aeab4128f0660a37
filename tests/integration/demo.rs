//! `meridian demo` as a user runs it (with a short run time): it starts the
//! coordinators, one Redis and one limiter per region, prints where things
//! are and a summary line every two seconds, keeps every customer within the
//! global limit, and removes its temp dir when it stops.

use crate::common;

use std::process::Command;

#[test]
fn demo_runs_the_whole_system_and_cleans_up() {
    common::require_redis();
    let out = Command::new(env!("CARGO_BIN_EXE_meridian"))
        .args([
            "demo",
            "--for",
            "24s",
            "--rebalance-interval",
            "1s",
            "--shift-every",
            "8s",
        ])
        .env("RUST_LOG", "warn")
        .output()
        .expect("run meridian demo");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "demo failed: {stdout}\n{stderr}");
    assert!(
        stdout.contains("/api/v1/allocations"),
        "no admin API line: {stdout}"
    );
    assert!(
        stdout.contains("store redis://"),
        "regions should run on Redis: {stdout}"
    );
    let summaries: Vec<&str> = stdout.lines().filter(|l| l.starts_with('[')).collect();
    assert!(
        summaries.len() >= 8,
        "expected a summary every 2 s: {stdout}"
    );
    // Allocations reach both regions and move with the traffic.
    let allocated: Vec<(u64, u64)> = summaries
        .iter()
        .filter_map(|l| {
            let after = l.split("allocation mumbai").nth(1)?;
            let mut nums = after
                .split(|c: char| !c.is_ascii_digit())
                .filter(|s| !s.is_empty())
                .map(|s| s.parse::<u64>().ok());
            Some((nums.next()??, nums.next()??))
        })
        .collect();
    assert!(
        allocated
            .iter()
            .any(|(m, h)| *m > 0 && *h > 0 && m + h <= 1000),
        "no allocation for both regions: {stdout}"
    );
    let distinct: std::collections::BTreeSet<_> = allocated.iter().collect();
    assert!(distinct.len() > 2, "allocations never moved: {stdout}");
    // The busiest customer in any minute stays within 1,000.
    for line in &summaries {
        if let Some(b) = line.split("busiest cust-").nth(1) {
            let admitted: u64 = b
                .split_whitespace()
                .nth(1)
                .and_then(|s| s.split('/').next())
                .and_then(|s| s.parse().ok())
                .expect("busiest N/1000");
            assert!(
                admitted <= 1000,
                "a customer exceeded the global limit: {line}"
            );
        }
    }
    let logs = stdout
        .split("logs: ")
        .nth(1)
        .and_then(|s| s.lines().next())
        .expect("the demo prints its temp dir");
    assert!(
        !std::path::Path::new(logs.trim()).exists(),
        "the demo left {logs} behind"
    );
}
