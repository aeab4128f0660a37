//! The same rule in exact and approximate mode, in one run, against one local
//! redis-server: Redis commands per 1,000 checks (from `INFO commandstats`),
//! throughput, and the overshoot of 4 pods against the stated bound.
//!
//! Run: `cargo run --release --example approximate_vs_exact`
//! (starts its own redis-server on a free port; or set `REDIS_URL`).

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use meridian::Limiter;
use meridian::store::{RedisConfig, RedisStore};

const TASKS: usize = 64;
const KEYS: usize = 1_000;
const RUN: Duration = Duration::from_secs(3);

fn rules(accuracy: &str, limit: u64, unit: &str) -> String {
    format!(
        "domain: api\ndescriptors:\n  - key: customer\n    accuracy: {accuracy}\n    \
         rate_limit:\n      name: per_customer\n      unit: {unit}\n      \
         requests_per_unit: {limit}\n"
    )
}

async fn pod(url: &str, rules: &str) -> anyhow::Result<Arc<Limiter>> {
    let mut config = RedisConfig::new(url);
    config.deadline = Duration::from_secs(1);
    let store = RedisStore::connect(&config).await?;
    Ok(Arc::new(Limiter::from_yaml(rules, store)?))
}

/// (top-level calls, all commands incl. those run inside scripts) since the last reset.
fn command_counts(conn: &mut redis::Connection) -> anyhow::Result<(u64, u64)> {
    let info: String = redis::cmd("INFO").arg("commandstats").query(conn)?;
    let (mut top, mut all) = (0, 0);
    for line in info.lines().filter(|l| l.starts_with("cmdstat_")) {
        let name = &line["cmdstat_".len()..line.find(':').unwrap_or(8)];
        let calls: u64 = line
            .split([':', ','])
            .find_map(|f| f.strip_prefix("calls="))
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        if matches!(name, "info" | "config") {
            continue;
        }
        all += calls;
        if matches!(name, "evalsha" | "eval" | "script|load" | "ping") {
            top += calls;
        }
    }
    Ok((top, all))
}

/// Throughput and commands per 1,000 checks: TASKS tasks over KEYS keys for RUN.
async fn throughput(url: &str, accuracy: &str) -> anyhow::Result<(f64, f64, f64)> {
    let limiter = pod(url, &rules(accuracy, 1_000_000, "minute")).await?;
    let mut conn = redis::Client::open(url)?.get_connection()?;
    let _: () = redis::cmd("FLUSHALL").query(&mut conn)?;
    let _: () = redis::cmd("CONFIG").arg("RESETSTAT").query(&mut conn)?;
    let checks = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let tasks: Vec<_> = (0..TASKS)
        .map(|t| {
            let (limiter, checks) = (limiter.clone(), checks.clone());
            tokio::spawn(async move {
                let mut i = t;
                while started.elapsed() < RUN {
                    i = (i * 7919 + 1) % KEYS;
                    let key = format!("c{i}");
                    limiter
                        .check("api", &[("customer", &key)], 1)
                        .await
                        .unwrap();
                    checks.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for t in tasks {
        t.await?;
    }
    limiter.flush().await?;
    let elapsed = started.elapsed().as_secs_f64();
    let n = checks.load(Ordering::Relaxed) as f64;
    let (top, all) = command_counts(&mut conn)?;
    Ok((
        n / elapsed,
        top as f64 * 1000.0 / n,
        all as f64 * 1000.0 / n,
    ))
}

/// 4 pods, one key, limit 10,000 per hour, 40,000 asks: admitted.
async fn overshoot(url: &str, accuracy: &str) -> anyhow::Result<u64> {
    let rules = rules(accuracy, 10_000, "hour");
    let mut pods = Vec::new();
    for _ in 0..4 {
        pods.push(pod(url, &rules).await?);
    }
    let mut conn = redis::Client::open(url)?.get_connection()?;
    let _: () = redis::cmd("FLUSHALL").query(&mut conn)?;
    let admitted = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..32)
        .map(|t| {
            let (pod, admitted) = (pods[t % 4].clone(), admitted.clone());
            tokio::spawn(async move {
                for _ in 0..1_250 {
                    let v = pod.check("api", &[("customer", "hot")], 1).await.unwrap();
                    admitted.fetch_add(u64::from(v.unwrap().decision.allowed), Ordering::Relaxed);
                }
            })
        })
        .collect();
    for t in tasks {
        t.await?;
    }
    Ok(admitted.load(Ordering::Relaxed))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let (url, _server) = match std::env::var("REDIS_URL") {
        Ok(url) => (url, None),
        Err(_) => {
            let (url, child) = start_redis()?;
            (url, Some(KillOnDrop(child)))
        }
    };
    println!("{TASKS} tasks over {KEYS} keys for {RUN:?}, fixed_window 1,000,000/min:");
    let mut rates = Vec::new();
    for accuracy in ["exact", "approximate"] {
        let (rate, top, all) = throughput(&url, accuracy).await?;
        println!(
            "  {accuracy:<11}  {rate:>10.0} checks/s  {top:>8.2} round trips (EVALSHA) \
             and {all:>8.2} Redis commands (incl. inside scripts) per 1,000 checks"
        );
        rates.push(rate);
    }
    println!(
        "  throughput approximate / exact: {:.1}×",
        rates[1] / rates[0]
    );
    println!("4 pods, one key, 10,000/hour, 40,000 asks (bound: approximate ≤ 10,000 + 4 × 100):");
    for accuracy in ["exact", "approximate"] {
        let admitted = overshoot(&url, accuracy).await?;
        println!(
            "  {accuracy:<11}  admitted {admitted}  overshoot {}",
            admitted as i64 - 10_000
        );
    }
    Ok(())
}

struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_redis() -> anyhow::Result<(String, Child)> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let child = Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
        ])
        .args(["--appendonly", "no"])
        .stdout(Stdio::null())
        .spawn()?;
    let url = format!("redis://127.0.0.1:{port}");
    for _ in 0..100 {
        if redis::Client::open(url.as_str())?.get_connection().is_ok() {
            return Ok((url, child));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    anyhow::bail!("redis-server did not start on port {port}")
}
