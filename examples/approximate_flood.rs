//! A random-key flood on an `accuracy: approximate` rule (issue 16,
//! "Measure"): one local redis-server, the flooded limiter and a second
//! limiter on the same Redis whose rule is exact with `fail_mode: closed`.
//! For [`FLOOD`], 4 gRPC connections send native batches of 100 keys never
//! sent before; the second limiter is checked every 20 ms during the flood
//! and for [`AFTER`] after it. Then:
//! - the flooded limiter's VmRSS and its CPU over [`AFTER`] of idleness;
//! - Redis's slowest command (SLOWLOG, commands over 1 ms) and the largest
//!   flush call (keys of the biggest `EVALSHA` in the slowlog), and the
//!   limiter's mean keys per flush call (`meridian_approx_flush_keys`);
//! - the largest counter in Redis (every key was sent once) and the sum of
//!   counters against the checks admitted from the store;
//! - the second limiter's answers by reason (`fail_closed` = Redis did not
//!   answer it in time).
//!
//! Run: `cargo build --release --bin meridian && cargo run --release
//! --example approximate_flood` (the `meridian` beside the example in the
//! target dir; `MERIDIAN=path` measures another binary, e.g. an older
//! build). Needs `redis-server` on PATH. Prints one Markdown table row.

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use meridian::proto::meridian::v1::limiter_client::LimiterClient;
use meridian::proto::meridian::v1::{Check, CheckRequest};
use tempfile::TempDir;

/// How long the flood lasts (the audit's run).
const FLOOD: Duration = Duration::from_secs(10);
/// Idle time after the flood: CPU measured, second limiter still probed.
const AFTER: Duration = Duration::from_secs(5);
const CONNECTIONS: usize = 4;
const BATCH: usize = 100;

const FLOODED: &str = "domain: api\ndescriptors:\n  - key: visitor\n    accuracy: approximate\n    \
    rate_limit:\n      name: flood\n      unit: hour\n      requests_per_unit: 1000000\n";
const GUARDED: &str = "domain: api\ndescriptors:\n  - key: account\n    fail_mode: closed\n    \
    rate_limit:\n      name: guarded\n      unit: hour\n      requests_per_unit: 1000000000\n";

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    meridian::commands::install_crypto_provider();
    let beside = std::env::current_exe()?
        .parent()
        .and_then(Path::parent)
        .map(|dir| dir.join("meridian"))
        .unwrap_or_else(|| PathBuf::from("target/release/meridian"));
    let bin = std::env::var_os("MERIDIAN").map_or(beside, PathBuf::from);
    if !bin.exists() {
        bail!(
            "{}: no meridian binary; `cargo build --release --bin meridian` or set MERIDIAN",
            bin.display()
        );
    }
    let redis = Redis::start()?;
    let flooded = Limiter::start(&bin, FLOODED, &redis.url)?;
    let guarded = Limiter::start(&bin, GUARDED, &redis.url)?;
    let mut conn = redis::Client::open(redis.url.as_str())?.get_connection()?;
    redis::cmd("SLOWLOG").arg("RESET").query::<()>(&mut conn)?;

    let probing = Arc::new(AtomicBool::new(true));
    let probe = {
        let (probing, url) = (probing.clone(), format!("http://{}", guarded.grpc));
        tokio::spawn(async move {
            let mut client = LimiterClient::connect(url).await?;
            let mut reasons: BTreeMap<String, u64> = BTreeMap::new();
            while probing.load(Ordering::Relaxed) {
                let check = Check {
                    domain: "api".into(),
                    rule: "guarded".into(),
                    key: "acct-1".into(),
                    cost: 1,
                    ..Default::default()
                };
                let reason = match client
                    .check(CheckRequest {
                        checks: vec![check],
                    })
                    .await
                {
                    Ok(r) => r
                        .into_inner()
                        .decisions
                        .first()
                        .map_or("no decision".into(), |d| d.reason.clone()),
                    Err(status) => format!("grpc {}", status.code()),
                };
                *reasons.entry(reason).or_default() += 1;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            anyhow::Ok(reasons)
        })
    };

    let sent = Arc::new(AtomicU64::new(0));
    let counted = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let floods: Vec<_> = (0..CONNECTIONS)
        .map(|c| {
            let (sent, counted) = (sent.clone(), counted.clone());
            let url = format!("http://{}", flooded.grpc);
            tokio::spawn(async move {
                let mut client = LimiterClient::connect(url).await?;
                let mut n = 0u64;
                while started.elapsed() < FLOOD {
                    let checks = (0..BATCH)
                        .map(|_| {
                            n += 1;
                            Check {
                                domain: "api".into(),
                                rule: "flood".into(),
                                key: format!("v{c}-{n}"),
                                cost: 1,
                                ..Default::default()
                            }
                        })
                        .collect();
                    let decisions = client.check(CheckRequest { checks }).await?.into_inner();
                    sent.fetch_add(decisions.decisions.len() as u64, Ordering::Relaxed);
                    let stored = decisions
                        .decisions
                        .iter()
                        .filter(|d| d.allowed && d.reason.is_empty())
                        .count();
                    counted.fetch_add(stored as u64, Ordering::Relaxed);
                }
                anyhow::Ok(())
            })
        })
        .collect();
    for f in floods {
        f.await??;
    }
    let flood_took = started.elapsed();
    let cpu_before = cpu_ticks(flooded.child.id())?;
    tokio::time::sleep(AFTER).await;
    let idle_cpu = (cpu_ticks(flooded.child.id())? - cpu_before) as f64
        / ticks_per_second()
        / AFTER.as_secs_f64();
    probing.store(false, Ordering::Relaxed);
    let reasons = probe.await??;
    let rss_kb = rss_kb(flooded.child.id())?;

    // An old limiter's flush of every key may still be running (Redis
    // answers BUSY to everything then): wait for Redis before reading it.
    let busy_since = Instant::now();
    let slowlog = loop {
        match slowlog(&mut conn) {
            Err(e) if busy_since.elapsed() < Duration::from_secs(120) => {
                eprintln!("Redis not answering yet ({e}); waiting");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            other => break other?,
        }
    };
    let slowest_us = slowlog.iter().map(|e| e.0).max().unwrap_or(0);
    let largest_call = slowlog
        .iter()
        .filter(|e| {
            e.1.first()
                .is_some_and(|c| c.eq_ignore_ascii_case("evalsha"))
        })
        .filter_map(|e| e.1.get(2)?.parse::<u64>().ok())
        .max()
        .unwrap_or(0);
    let waited = busy_since.elapsed();
    let metrics = reqwest::get(format!("http://{}/metrics", flooded.http))
        .await?
        .text()
        .await?;
    let keys_sum = metric(&metrics, "meridian_approx_flush_keys_sum");
    let calls = metric(&metrics, "meridian_approx_flush_keys_count");
    let untracked = metric(&metrics, "meridian_approx_untracked_checks_total");
    let counters = loop {
        match counters(&mut conn, "mr:{api|visitor:*}:fw:*") {
            Err(e) if busy_since.elapsed() < Duration::from_secs(120) => {
                eprintln!("Redis not answering yet ({e}); waiting");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            other => break other?,
        }
    };
    let max_counter = counters.values().copied().max().unwrap_or(0);
    let in_redis: u64 = counters.values().sum();
    let (sent, counted) = (
        sent.load(Ordering::Relaxed),
        counted.load(Ordering::Relaxed),
    );
    let fail_closed = reasons.get("fail_closed").copied().unwrap_or(0);
    let probes: u64 = reasons.values().sum();

    println!(
        "binary {}: {sent} checks of never-repeated keys in {flood_took:.1?}; \
         {untracked} took the exact path; second limiter's answers by reason {reasons:?}; \
         Redis answered the reads after {waited:.1?}",
        bin.display()
    );
    println!(
        "| RSS after | idle CPU after | slowest Redis command | largest flush call | mean keys per flush call | max counter (each key sent once) | in Redis / admitted from the store | 2nd limiter fail_closed |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|");
    println!(
        "| {:.0} MB | {:.0} % | {:.1} ms | {largest_call} keys | {:.0} | {max_counter} | {in_redis} / {counted} | {fail_closed} of {probes} |",
        rss_kb as f64 / 1024.0,
        idle_cpu * 100.0,
        slowest_us as f64 / 1000.0,
        if calls > 0.0 { keys_sum / calls } else { 0.0 },
    );
    Ok(())
}

/// Sum of a metric's samples in a Prometheus text page (0 when absent).
fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{']))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .fold(0.0, |a, b| a + b)
}

/// (µs, arguments) of every slowlog entry.
fn slowlog(conn: &mut redis::Connection) -> anyhow::Result<Vec<(u64, Vec<String>)>> {
    let entries: Vec<redis::Value> = redis::cmd("SLOWLOG").arg("GET").arg(100_000).query(conn)?;
    entries
        .into_iter()
        .map(|entry| {
            let redis::Value::Array(fields) = entry else {
                bail!("slowlog entry {entry:?}");
            };
            let us: u64 = redis::from_redis_value(fields.get(2).context("no duration")?.clone())?;
            let args: Vec<String> =
                redis::from_redis_value(fields.get(3).context("no arguments")?.clone())?;
            Ok((us, args))
        })
        .collect()
}

/// Values of every key matching `pattern`.
fn counters(conn: &mut redis::Connection, pattern: &str) -> anyhow::Result<HashMap<String, u64>> {
    let keys: Vec<String> = redis::cmd("SCAN")
        .cursor_arg(0)
        .arg("MATCH")
        .arg(pattern)
        .arg("COUNT")
        .arg(10_000)
        .clone()
        .iter(conn)?
        .collect::<Result<_, _>>()?;
    let mut out = HashMap::with_capacity(keys.len());
    for batch in keys.chunks(1_000) {
        let values: Vec<u64> = redis::cmd("MGET").arg(batch).query(conn)?;
        out.extend(batch.iter().cloned().zip(values));
    }
    Ok(out)
}

fn rss_kb(pid: u32) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .with_context(|| format!("no VmRSS in /proc/{pid}/status"))
}

/// utime + stime of a process, in clock ticks.
fn cpu_ticks(pid: u32) -> anyhow::Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command name (which may hold spaces) in parentheses.
    let rest = stat.rsplit(')').next().context("no ) in /proc/PID/stat")?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |i: usize| -> anyhow::Result<u64> {
        Ok(fields.get(i).context("short /proc/PID/stat")?.parse()?)
    };
    // utime and stime are fields 14 and 15; `rest` starts at field 3.
    Ok(field(11)? + field(12)?)
}

fn ticks_per_second() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok()?.trim().parse().ok())
        .unwrap_or(100.0)
}

struct Redis {
    child: Child,
    url: String,
    _dir: TempDir,
}

impl Redis {
    fn start() -> anyhow::Result<Redis> {
        let dir = tempfile::tempdir()?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .args([
                "--slowlog-log-slower-than",
                "1000",
                "--slowlog-max-len",
                "100000",
            ])
            .arg("--dir")
            .arg(dir.path())
            .stdout(Stdio::null())
            .spawn()
            .context("spawn redis-server (Debian/Ubuntu: apt-get install redis-server)")?;
        let url = format!("redis://127.0.0.1:{port}");
        for _ in 0..100 {
            if redis::Client::open(url.as_str())?.get_connection().is_ok() {
                return Ok(Redis {
                    child,
                    url,
                    _dir: dir,
                });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        bail!("redis-server did not start on port {port}")
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct Limiter {
    child: Child,
    grpc: SocketAddr,
    http: SocketAddr,
    _stdout: BufReader<ChildStdout>,
    _dir: TempDir,
}

impl Limiter {
    /// A limiter with default flags on `rules`, on free ports.
    fn start(bin: &Path, rules: &str, redis: &str) -> anyhow::Result<Limiter> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("rules.yaml");
        std::fs::write(&path, rules)?;
        let mut child = Command::new(bin)
            .arg("limiter")
            .arg("--config")
            .arg(&path)
            .args(["--redis", redis])
            .args(["--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"])
            .env("RUST_LOG", "error")
            .stdout(Stdio::piped())
            .spawn()
            .context("spawn meridian limiter")?;
        let stdout = child.stdout.take().context("limiter stdout")?;
        let mut stdout = BufReader::new(stdout);
        let mut line = String::new();
        stdout.read_line(&mut line)?;
        let addr = |name: &str| -> anyhow::Result<SocketAddr> {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(name))
                .and_then(|a| a.parse().ok())
                .with_context(|| format!("no {name} in the limiter's first line {line:?}"))
        };
        Ok(Limiter {
            grpc: addr("grpc=")?,
            http: addr("http=")?,
            child,
            _stdout: stdout,
            _dir: dir,
        })
    }
}

impl Drop for Limiter {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
