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

/// The pids whose parent is `parent`, from /proc.
fn children_of(parent: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            // `pid (comm) state ppid ...`; comm may hold spaces: read after ')'.
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|s| {
                    let rest = s.rsplit_once(')')?.1.split_whitespace().nth(1)?.to_string();
                    rest.parse::<u32>().ok()
                })
                == Some(parent)
        })
        .collect()
}

fn alive(pid: u32) -> bool {
    // A zombie has exited; only its parent's wait is missing.
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        s.rsplit_once(')')
            .is_some_and(|(_, r)| !r.trim_start().starts_with('Z'))
    })
}

/// Issue 28, item 12: `meridian demo` stopped with SIGTERM (a service
/// manager's, or `kill`) left its 7 children and its temp dir behind, and
/// the dir was 0755 with world-readable logs and stores.
#[test]
fn demo_stopped_with_sigterm_stops_its_children_and_removes_its_private_dir() {
    use std::io::BufRead;
    use std::os::unix::fs::PermissionsExt;
    use std::time::{Duration, Instant};

    common::require_redis();
    let mut demo = Command::new(env!("CARGO_BIN_EXE_meridian"))
        .args(["demo", "--rebalance-interval", "1s"])
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("run meridian demo");
    // Whatever the test finds, the demo is stopped when it ends.
    struct Term(u32);
    impl Drop for Term {
        fn drop(&mut self) {
            let _ = Command::new("kill")
                .args(["-TERM", &self.0.to_string()])
                .status();
        }
    }
    let _term = Term(demo.id());
    let stdout = demo.stdout.take().expect("piped stdout");
    let mut lines = std::io::BufReader::new(stdout).lines();
    let mut dir = None;
    // Up to the first summary line: everything is running.
    for line in lines.by_ref() {
        let line = line.expect("demo output");
        if let Some(d) = line.split("logs: ").nth(1) {
            dir = Some(std::path::PathBuf::from(d.trim()));
        }
        if line.starts_with('[') {
            break;
        }
    }
    let dir = dir.expect("the demo prints its temp dir");
    let mode = std::fs::metadata(&dir)
        .expect("demo dir")
        .permissions()
        .mode();
    assert_eq!(
        mode & 0o777,
        0o700,
        "{} is {:o}",
        dir.display(),
        mode & 0o777
    );
    let children = children_of(demo.id());
    assert!(
        children.len() >= 7,
        "coordinators, redis and limiters: {children:?}"
    );

    let killed = Command::new("kill")
        .args(["-TERM", &demo.id().to_string()])
        .status()
        .expect("kill");
    assert!(killed.success());
    // Drain stdout so the demo never blocks on a full pipe while stopping.
    std::thread::spawn(move || for _ in lines {});
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = demo.try_wait().expect("wait") {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "the demo did not stop within 30 s of SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(status.success(), "demo exited with {status}");
    let left: Vec<u32> = children.into_iter().filter(|p| alive(*p)).collect();
    assert!(left.is_empty(), "children left running: {left:?}");
    assert!(!dir.exists(), "the demo left {} behind", dir.display());
}
