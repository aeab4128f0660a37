//! `meridian ctl` against a live world: 3 coordinator processes, two regions
//! each with its own redis-server and limiter, and traffic above the limit,
//! so allocations, leases and rejections are real. Every subcommand runs as
//! the `meridian` binary, as an operator runs it.

use crate::common;

use std::process::Stdio;
use std::time::{Duration, Instant};

use common::coordinator::TOKEN;
use common::global::{Load, World, fixed_window_rule};
use serde_json::Value;

/// One `meridian ctl` run: exit code and output.
struct Ran {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Ran {
    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}\nstderr: {}", self.stdout, self.stderr))
    }

    fn ok(self) -> Ran {
        assert_eq!(
            self.code, 0,
            "stdout: {}\nstderr: {}",
            self.stdout, self.stderr
        );
        self
    }
}

/// Runs `meridian ctl` with `--coordinator` for each of `urls`, the token
/// in MERIDIAN_ADMIN_TOKEN when given, and `args`.
async fn ctl_with(
    urls: &[String],
    token: Option<&str>,
    env_urls: Option<&str>,
    args: &[&str],
) -> Ran {
    let mut command = tokio::process::Command::new(common::meridian_bin());
    command.arg("ctl");
    for url in urls {
        command.args(["--coordinator", url]);
    }
    command
        .args(args)
        .env_remove("MERIDIAN_COORDINATOR")
        .env_remove("MERIDIAN_ADMIN_TOKEN")
        .stdin(Stdio::null());
    if let Some(token) = token {
        command.env("MERIDIAN_ADMIN_TOKEN", token);
    }
    if let Some(env_urls) = env_urls {
        command.env("MERIDIAN_COORDINATOR", env_urls);
    }
    let out = command.output().await.expect("run meridian ctl");
    let ran = Ran {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    assert!(
        !ran.stdout.contains(TOKEN) && !ran.stderr.contains(TOKEN),
        "ctl printed the token: {} {}",
        ran.stdout,
        ran.stderr
    );
    ran
}

async fn ctl(urls: &[String], args: &[&str]) -> Ran {
    ctl_with(urls, Some(TOKEN), None, args).await
}

/// What `ctl top` writes before each frame of its live view: the cursor
/// home, then the screen cleared (`src/ctl/top.rs`).
const REDRAW: &str = "\x1b[H\x1b[2J";

/// `ctl top` without `--once`, run for about 3.5 s under traffic, then
/// killed: its output is frames, each after the redraw sequence (so the view
/// refreshes in place, not scrolls), at least two of them, and a frame after
/// the first gives rates (ASKED/S a number, not "-": the growth since an
/// earlier frame).
async fn top_refreshes_in_place(urls: &[String]) {
    use tokio::io::AsyncReadExt as _;
    let started = Instant::now();
    let mut command = tokio::process::Command::new(common::meridian_bin());
    command.arg("ctl");
    for url in urls {
        command.args(["--coordinator", url]);
    }
    let mut child = command
        .args(["top", "--interval", "1s", "--window", "2s"])
        .env_remove("MERIDIAN_COORDINATOR")
        .env("MERIDIAN_ADMIN_TOKEN", TOKEN)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start meridian ctl top");
    let mut stdout = child.stdout.take().expect("stdout");
    let mut stderr = child.stderr.take().expect("stderr");
    let read = tokio::spawn(async move {
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let _ = tokio::join!(stdout.read_to_end(&mut out), stderr.read_to_end(&mut err));
        (out, err)
    });
    tokio::time::sleep(Duration::from_millis(3500)).await;
    assert!(
        child.try_wait().expect("poll ctl top").is_none(),
        "ctl top exited by itself"
    );
    child.start_kill().expect("kill ctl top");
    child.wait().await.expect("reap ctl top");
    let (out, err) = read.await.expect("read ctl top's output");
    let (out, err) = (String::from_utf8_lossy(&out), String::from_utf8_lossy(&err));
    let shown = || format!("stdout: {out:?}\nstderr: {err}");
    assert!(
        out.starts_with(REDRAW),
        "the first frame clears: {}",
        shown()
    );
    // Every frame starts with the redraw sequence: nothing is written
    // between one frame's table and the next redraw.
    let frames: Vec<&str> = out.split(REDRAW).skip(1).collect();
    assert!(frames.len() >= 2, "{} frames: {}", frames.len(), shown());
    for frame in &frames {
        assert!(
            frame.starts_with("meridian top · "),
            "a frame is the title, then the table: {frame:?}"
        );
    }
    // ASKED/S of each region, frame by frame. The columns before it are
    // single words, so its place among the header's words is its place in
    // a row.
    let rates: Vec<Vec<(String, String)>> = frames
        .iter()
        .map(|frame| {
            let mut lines = frame.lines().skip_while(|l| !l.starts_with("RULE"));
            let column = lines
                .next()
                .and_then(|h| h.split_whitespace().position(|w| w == "ASKED/S"));
            let Some(column) = column else {
                return Vec::new();
            };
            lines
                .filter(|l| l.starts_with("api|fw"))
                .filter_map(|l| {
                    let words: Vec<&str> = l.split_whitespace().collect();
                    Some((words.get(1)?.to_string(), words.get(column)?.to_string()))
                })
                .collect()
        })
        .collect();
    assert!(
        rates[0].len() == 2,
        "the first frame lists both regions: {rates:?}\n{}",
        shown()
    );
    let live = rates.iter().skip(1).any(|frame| {
        frame.len() == 2
            && frame
                .iter()
                .all(|(_, r)| r.parse::<f64>().is_ok_and(|r| r >= 0.0))
            && frame
                .iter()
                .any(|(region, r)| region == "mumbai" && r.parse::<f64>().is_ok_and(|r| r > 0.0))
    });
    assert!(
        live,
        "no later frame gives rates (mumbai asks 60/s): {rates:?}\n{}",
        shown()
    );
    eprintln!(
        "ctl top: {} frames in {:?}, ASKED/S per frame {rates:?}",
        frames.len(),
        started.elapsed()
    );
}

/// An address nothing listens on.
fn dead_url() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    drop(listener);
    format!("http://127.0.0.1:{port}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctl_operates_a_live_cluster() {
    let started = Instant::now();
    let mut world = World::start(&fixed_window_rule(100), &["mumbai", "hyderabad"]).await;
    let urls: Vec<String> = world
        .cluster
        .running()
        .iter()
        .map(|id| world.cluster.node(*id).url())
        .collect();
    world
        .wait_allocated("api|fw", Duration::from_secs(20))
        .await;
    // 100 per 4 s world-wide, 80/s asked: most checks are refused.
    let load = Load::start(&world, "api", "fw", "acme", &[60, 20]);

    let status = ctl(&urls, &["--output", "json", "cluster", "status"])
        .await
        .ok()
        .json();
    assert_eq!(
        status["nodes"].as_array().map(Vec::len),
        Some(3),
        "{status}"
    );
    assert!(status["leader"].as_u64().is_some(), "{status}");
    let table = ctl(&urls, &["cluster", "status"]).await.ok();
    assert!(table.stdout.contains("leader"), "{}", table.stdout);

    // top: the leader's counts of what the regions asked and were refused.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let frame = ctl(&urls, &["--output", "json", "top", "--once"])
            .await
            .ok()
            .json();
        let mumbai = frame["rows"]
            .as_array()
            .and_then(|rows| rows.iter().find(|r| r["region"] == "mumbai"))
            .cloned()
            .unwrap_or(Value::Null);
        if mumbai["asked"].as_u64() > Some(0) && mumbai["rejected"].as_u64() > Some(0) {
            assert_eq!(mumbai["rule"], "api|fw", "{frame}");
            assert!(mumbai["granted"].as_f64().is_some(), "{frame}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no rejections counted for mumbai: {frame}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let top = ctl(&urls, &["top", "--once"]).await.ok();
    assert!(
        top.stdout.contains("REJECTED") && top.stdout.contains("hyderabad"),
        "{}",
        top.stdout
    );
    top_refreshes_in_place(&urls).await;

    let all = ctl(&urls, &["--output", "json", "allocations"])
        .await
        .ok()
        .json();
    let split = &all["rules"]["api|fw"]["split"];
    assert!(split["mumbai"]["granted"].as_u64().is_some(), "{all}");
    assert!(split["hyderabad"]["granted"].as_u64().is_some(), "{all}");
    let table = ctl(&urls, &["allocations"]).await.ok();
    assert!(table.stdout.contains("api|fw"), "{}", table.stdout);
    let key = ctl(
        &urls,
        &[
            "--output",
            "json",
            "allocations",
            "--rule",
            "api|fw",
            "--key",
            "acme",
        ],
    )
    .await
    .ok()
    .json();
    assert_eq!(key["key"], "acme", "{key}");
    assert!(key["shares"]["mumbai"].is_object(), "{key}");
    let usage = ctl(&urls, &["allocations", "--key", "acme"]).await;
    assert_eq!(
        usage.code, 2,
        "--key without --rule is a usage error: {}",
        usage.stderr
    );
    let unknown = ctl(&urls, &["allocations", "--rule", "nope"]).await;
    assert_eq!(unknown.code, 3, "{}", unknown.stderr);
    assert!(
        unknown.stderr.contains("has no allocation"),
        "{}",
        unknown.stderr
    );

    let leases = ctl(&urls, &["--output", "json", "leases"])
        .await
        .ok()
        .json();
    assert_eq!(
        leases["regions"].as_array().map(Vec::len),
        Some(2),
        "{leases}"
    );
    assert!(
        ctl(&urls, &["leases"])
            .await
            .ok()
            .stdout
            .contains("EXPIRES IN")
    );

    // Regions: set keeps what is not given; drain keeps the weight.
    ctl(&urls, &["regions", "set", "hyderabad", "--weight", "3"])
        .await
        .ok();
    ctl(&urls, &["regions", "drain", "mumbai"]).await.ok();
    let regions = ctl(&urls, &["--output", "json", "regions", "list"])
        .await
        .ok()
        .json();
    let find = |name: &str| {
        regions["regions"]
            .as_array()
            .and_then(|r| r.iter().find(|r| r["name"] == name))
            .cloned()
            .unwrap_or(Value::Null)
    };
    assert_eq!(find("hyderabad")["weight"], 3.0, "{regions}");
    assert_eq!(find("hyderabad")["state"], "active", "{regions}");
    assert_eq!(find("mumbai")["state"], "draining", "{regions}");
    assert_eq!(find("mumbai")["weight"], 1.0, "{regions}");
    ctl(&urls, &["regions", "set", "mumbai", "--state", "active"])
        .await
        .ok();
    let table = ctl(&urls, &["regions", "list"]).await.ok();
    assert!(!table.stdout.contains("draining"), "{}", table.stdout);

    // Rules: diff before apply, staged rollout, rollback.
    let dir = tempfile::tempdir().expect("temp dir");
    let new = dir.path().join("rules.yaml");
    std::fs::write(&new, fixed_window_rule(200)).expect("write rules");
    let new = new.to_str().expect("utf-8 path");
    let diff = ctl(&urls, &["rules", "diff", "current", new]).await.ok();
    assert!(
        diff.stdout.contains("-      requests_per_unit: 100\n")
            && diff.stdout.contains("+      requests_per_unit: 200\n"),
        "{}",
        diff.stdout
    );
    let applied = ctl(&urls, &["rules", "apply", new, "--stage", "shadow"])
        .await
        .ok();
    assert!(
        applied.stdout.contains("rule set version 2"),
        "{}",
        applied.stdout
    );
    let current = ctl(&urls, &["--output", "json", "rules", "get"])
        .await
        .ok()
        .json();
    assert_eq!(current["current"]["stage"], "shadow", "{current}");
    assert_eq!(current["stable"]["number"], 1, "{current}");
    ctl(&urls, &["rules", "rollout", "--stage", "all"])
        .await
        .ok();
    let current = ctl(&urls, &["--output", "json", "rules", "get"])
        .await
        .ok()
        .json();
    assert_eq!(current["current"]["stage"], "all", "{current}");
    let rolled = ctl(&urls, &["rules", "rollback"]).await.ok();
    assert!(rolled.stdout.contains("version 3"), "{}", rolled.stdout);
    let versions = ctl(&urls, &["--output", "json", "rules", "versions"])
        .await
        .ok()
        .json();
    let v3 = &versions["versions"][2];
    assert_eq!(
        (v3["number"].as_u64(), &v3["origin"]["of"]),
        (Some(3), &Value::from(1)),
        "{versions}"
    );
    let same = ctl(&urls, &["rules", "diff", "1", "3"]).await.ok();
    assert_eq!(same.stdout, "", "version 3 is version 1 again");
    let got = ctl(&urls, &["rules", "get", "--version", "2"]).await.ok();
    assert!(
        got.stdout.contains("requests_per_unit: 200"),
        "{}",
        got.stdout
    );
    let bad = dir.path().join("bad.yaml");
    std::fs::write(
        &bad,
        "domain: api\ndescriptors:\n  - key: fw\n    rate_limit: {unit: fortnight}\n",
    )
    .expect("write");
    let refused = ctl(&urls, &["rules", "apply", bad.to_str().expect("path")]).await;
    assert_eq!(refused.code, 3, "{}", refused.stderr);
    assert!(
        refused.stderr.contains("invalid rules"),
        "{}",
        refused.stderr
    );

    // Tokens: a wrong one is refused with the server's reason and a hint;
    // --token-file works without the environment.
    let wrong = ctl_with(
        &urls,
        Some("not-the-token"),
        None,
        &["regions", "set", "mumbai"],
    )
    .await;
    assert_eq!(wrong.code, 3, "{}", wrong.stderr);
    assert!(
        wrong.stderr.contains("wrong admin token") && wrong.stderr.contains("MERIDIAN_ADMIN_TOKEN"),
        "{}",
        wrong.stderr
    );
    let missing = ctl_with(&urls, None, None, &["regions", "set", "mumbai"]).await;
    assert_eq!(missing.code, 3, "{}", missing.stderr);
    assert!(missing.stderr.contains("writes need"), "{}", missing.stderr);
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, format!("{TOKEN}\n")).expect("write token");
    let token_file = token_file.to_str().expect("path");
    ctl_with(
        &urls,
        None,
        None,
        &["--token-file", token_file, "regions", "set", "mumbai"],
    )
    .await
    .ok();

    // Fall-through: a dead first coordinator, by flag and by environment.
    let dead = dead_url();
    let through = [dead.clone(), urls[0].clone()];
    ctl(&through, &["cluster", "status"]).await.ok();
    let env = format!("{dead},{}", urls[1]);
    ctl_with(&[], Some(TOKEN), Some(&env), &["regions", "list"])
        .await
        .ok();
    let none = ctl(std::slice::from_ref(&dead), &["cluster", "status"]).await;
    assert_eq!(none.code, 1, "{}", none.stderr);
    assert!(
        none.stderr.contains("no coordinator could be reached"),
        "{}",
        none.stderr
    );

    // Membership: a node started unjoined is added, then removed.
    world.cluster.start_unjoined(4);
    let (raft, http) = {
        let n = world.cluster.node(4);
        (n.raft_addr.clone(), n.http_addr.clone())
    };
    ctl(
        &urls,
        &[
            "cluster",
            "add",
            "--id",
            "4",
            "--raft-addr",
            &raft,
            "--http-addr",
            &http,
        ],
    )
    .await
    .ok();
    let status = ctl(
        &urls,
        &["--output", "json", "cluster", "status", "--timeout", "5s"],
    )
    .await
    .ok()
    .json();
    let roles: Vec<(u64, String)> = status["nodes"]
        .as_array()
        .map(|n| {
            n.iter()
                .map(|n| {
                    (
                        n["id"].as_u64().unwrap_or(0),
                        n["role"].as_str().unwrap_or("").to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    assert!(
        roles
            .iter()
            .any(|(id, role)| *id == 4 && role == "follower"),
        "{status}"
    );
    ctl(&urls, &["cluster", "remove", "4"]).await.ok();
    world.cluster.kill(4);
    let status = ctl(&urls, &["--output", "json", "cluster", "status"])
        .await
        .ok()
        .json();
    assert_eq!(
        status["nodes"].as_array().map(Vec::len),
        Some(3),
        "{status}"
    );

    load.stop().await;
    eprintln!("ctl_operates_a_live_cluster: {:?}", started.elapsed());
}

#[tokio::test]
async fn completions_produce_a_script_for_each_shell() {
    for (shell, marker) in [
        ("bash", "complete -F"),
        ("zsh", "#compdef meridian"),
        ("fish", "complete -c meridian"),
    ] {
        let ran = ctl_with(&[], None, None, &["completions", shell])
            .await
            .ok();
        assert!(ran.stdout.contains(marker), "{shell}: {}", ran.stdout);
        assert!(
            ran.stdout.contains("allocations"),
            "{shell} script lacks ctl's subcommands"
        );
    }
}
