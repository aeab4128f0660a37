//! A whole Meridian world for global-limit tests: 3 coordinators, and per
//! region its own `redis-server` and limiter, the limiter reaching every
//! coordinator through a [`Proxy`] the test can cut. Traffic generators
//! record every decision; the helpers below group them into clock-aligned
//! windows.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use meridian::proto::meridian::v1::limiter_client::LimiterClient;
use meridian::proto::meridian::v1::{Check, CheckRequest, Entry};
use serde_json::Value;
use tempfile::TempDir;

use super::RedisServer;
use super::coordinator::{Cluster, Options};
use super::limiter::LimiterProcess;
use super::proxy::Proxy;

/// Coordinator timings for tests: rebalance every 2 s, leases of 6 s.
pub const REBALANCE: Duration = Duration::from_secs(2);
pub const LEASE: Duration = Duration::from_secs(6);
/// The coordinators' timings [`World::start`] gives, as flags: rebalance
/// interval, lease, suspect-after.
const TIMINGS: [&str; 3] = ["2s", "6s", "2s"];
/// The limiters' `--report-interval` unless a test says otherwise.
const REPORT_INTERVAL: &str = "1s";

pub struct Region {
    pub name: String,
    /// Kept for its lifetime: the region's Redis stops when the world drops.
    _redis: RedisServer,
    pub limiter: LimiterProcess,
    /// One per coordinator node, in node order.
    pub proxies: Vec<Proxy>,
    /// The limiter's flags (coordinators through the proxies, Redis, rules
    /// cache): another pod, or the same one again, starts with them.
    pub args: Vec<String>,
    /// Holds the rules caches.
    dir: TempDir,
}

impl Region {
    /// Starts the region's limiter again with the same flags and rules
    /// cache (after [`LimiterProcess::kill`], as a restarted pod).
    pub fn start_again(&mut self) {
        let args: Vec<&str> = self.args.iter().map(String::as_str).collect();
        self.limiter = LimiterProcess::start_without_rules(&args);
    }

    /// Starts another pod of the region, `--pod-id pod`: the same Redis and
    /// coordinators (through the same proxies), a rules cache of its own.
    pub fn start_pod(&self, pod: &str) -> LimiterProcess {
        let cache = self.dir.path().join(format!("rules-cache-{pod}.json"));
        let mut args = self.args.clone();
        let at = args
            .iter()
            .position(|a| a == "--rules-cache")
            .expect("the region's flags name a rules cache");
        args[at + 1] = cache.to_str().expect("utf-8 path").to_string();
        args.extend(["--pod-id".to_string(), pod.to_string()]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        LimiterProcess::start_without_rules(&args)
    }
}

pub struct World {
    pub cluster: Cluster,
    pub regions: Vec<Region>,
    /// Declared last, so released after every process has stopped.
    _machine: Machine,
}

/// A world's hold on the test machine. Worlds measure timing (leases,
/// rounds, propagation) on 2 shared cores, so a world that loads the
/// machine for many seconds (a 100,000-row import) runs alone: it waits
/// for the worlds running beside it to end, and the next ones wait for it.
/// One world per test, so a test never waits on itself.
enum Machine {
    Shared(#[allow(dead_code)] tokio::sync::OwnedRwLockReadGuard<()>),
    Alone(#[allow(dead_code)] tokio::sync::OwnedRwLockWriteGuard<()>),
}

impl Machine {
    fn lock() -> Arc<tokio::sync::RwLock<()>> {
        static LOCK: std::sync::OnceLock<Arc<tokio::sync::RwLock<()>>> = std::sync::OnceLock::new();
        Arc::clone(LOCK.get_or_init(Default::default))
    }

    async fn shared() -> Machine {
        Machine::Shared(Machine::lock().read_owned().await)
    }

    async fn alone() -> Machine {
        Machine::Alone(Machine::lock().write_owned().await)
    }
}

/// Domain `api`, one global fixed-window rule `fw` of `limit` per 4 s,
/// failing closed (so a store error cannot admit outside the bound).
pub fn fixed_window_rule(limit: u64) -> String {
    fixed_window_rule_per(limit, "4s")
}

/// [`fixed_window_rule`] with another window, e.g. `"12s"`.
pub fn fixed_window_rule_per(limit: u64, period: &str) -> String {
    format!(
        "domain: api
descriptors:
  - key: fw
    scope: global
    fail_mode: closed
    algorithm: fixed_window
    period: {period}
    rate_limit:
      name: fw
      requests_per_unit: {limit}
"
    )
}

/// Domain `api`, two global fixed-window rules of `limit` per 4 s with a
/// fallback of half the static share, failing closed: `strict`
/// (`partition: strict`) and `avail` (`partition: available`).
pub fn strict_and_available(limit: u64) -> String {
    let rule = |name: &str, partition: &str| {
        format!(
            "  - key: {name}
    scope: global
    fail_mode: closed
    partition: {partition}
    fallback: 0.5
    algorithm: fixed_window
    period: 4s
    rate_limit:
      name: {name}
      requests_per_unit: {limit}
"
        )
    };
    format!(
        "domain: api\ndescriptors:\n{}{}",
        rule("strict", "strict"),
        rule("avail", "available")
    )
}

pub fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

impl World {
    /// Starts the coordinators, puts `rules`, then starts one Redis and one
    /// limiter per region.
    pub async fn start(rules: &str, regions: &[&str]) -> World {
        World::start_with(rules, regions, &TIMINGS).await
    }

    /// `timings`: rebalance interval, lease, suspect-after.
    pub async fn start_with(rules: &str, regions: &[&str], timings: &[&str; 3]) -> World {
        World::start_as(rules, regions, timings, false).await
    }

    /// [`World::start_with`], over mutual TLS when `tls` (every process
    /// with its own certificate from one CA), else `--insecure`.
    pub async fn start_as(rules: &str, regions: &[&str], timings: &[&str; 3], tls: bool) -> World {
        World::start_reporting(rules, regions, timings, tls, Some(REPORT_INTERVAL)).await
    }

    /// [`World::start_as`] with the limiters' `--report-interval` given as
    /// `report_interval`, or left unset (`None`): the limiter's own default,
    /// as a user who never read its `--help` would run it.
    pub async fn start_reporting(
        rules: &str,
        regions: &[&str],
        timings: &[&str; 3],
        tls: bool,
        report_interval: Option<&str>,
    ) -> World {
        let machine = Machine::shared().await;
        World::build(machine, rules, regions, timings, tls, report_interval).await
    }

    /// [`World::start`] for a test that loads the machine for many seconds:
    /// it runs with no other world beside it ([`Machine`]).
    pub async fn start_alone(rules: &str, regions: &[&str]) -> World {
        let machine = Machine::alone().await;
        World::build(
            machine,
            rules,
            regions,
            &TIMINGS,
            false,
            Some(REPORT_INTERVAL),
        )
        .await
    }

    async fn build(
        machine: Machine,
        rules: &str,
        regions: &[&str],
        timings: &[&str; 3],
        tls: bool,
        report_interval: Option<&str>,
    ) -> World {
        let options = Options {
            tls,
            extra_args: [
                "--rebalance-interval",
                timings[0],
                "--lease",
                timings[1],
                "--suspect-after",
                timings[2],
                "--skew-margin",
                "200ms",
                "--ewma-alpha",
                "0.7",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect(),
            ..Options::default()
        };
        let cluster = Cluster::start(3, options).await;
        let leader = cluster.wait_leader(Duration::from_secs(20)).await;
        // Regions registered before the rules, as an operator would: their
        // first shares then come from capacity never issued, and apply at once.
        for name in regions {
            let (status, body) = cluster
                .send(
                    leader,
                    reqwest::Method::PUT,
                    &format!("/api/v1/regions/{name}"),
                    Some(serde_json::json!({ "weight": 1.0 })),
                )
                .await;
            assert!(
                (200..300).contains(&status),
                "PUT region {name}: {status} {body}"
            );
        }
        let (status, body) = cluster.put_text(leader, rules).await;
        assert!((200..300).contains(&status), "PUT rules: {status} {body}");
        let mut world = World {
            cluster,
            regions: Vec::new(),
            _machine: machine,
        };
        for name in regions {
            let redis = RedisServer::start();
            let mut proxies = Vec::new();
            for id in world.cluster.running() {
                let target = world.cluster.node(id).raft_addr.parse().expect("raft addr");
                proxies.push(Proxy::start(target).await);
            }
            let dir = tempfile::tempdir().expect("temp dir");
            let cache = dir.path().join("rules-cache.json");
            let mut args: Vec<String> = world.cluster.limiter_flags(name);
            for p in &proxies {
                args.push("--coordinator".into());
                args.push(match world.cluster.pki {
                    // Node certificates name 127.0.0.1, the proxies' host too.
                    Some(_) => p.url().replacen("http://", "https://", 1),
                    None => p.url(),
                });
            }
            args.extend(
                [
                    "--region",
                    name,
                    "--redis",
                    &redis.url(),
                    "--rules-cache",
                    cache.to_str().expect("utf-8 path"),
                ]
                .iter()
                .map(|s| s.to_string()),
            );
            if let Some(interval) = report_interval {
                args.extend(["--report-interval".to_string(), interval.to_string()]);
            }
            let argv: Vec<&str> = args.iter().map(String::as_str).collect();
            let limiter = LimiterProcess::start_without_rules(&argv);
            world.regions.push(Region {
                name: name.to_string(),
                _redis: redis,
                limiter,
                proxies,
                args,
                dir,
            });
        }
        world
    }

    /// `GET /api/v1/allocations?…` from the leader.
    pub async fn allocations(&self, query: &str) -> Value {
        let leader = self.cluster.wait_leader(Duration::from_secs(20)).await;
        let path = if query.is_empty() {
            "/api/v1/allocations".to_string()
        } else {
            format!("/api/v1/allocations?{query}")
        };
        match self.cluster.get(leader, &path).await {
            Some((200, body)) => body,
            other => panic!("GET {path}: {other:?}"),
        }
    }

    /// `POST /api/v1/drills` with `body` through the leader: (status, answer).
    pub async fn start_drill(&self, body: Value) -> (u16, Value) {
        let leader = self.cluster.wait_leader(Duration::from_secs(20)).await;
        self.cluster
            .send(leader, reqwest::Method::POST, "/api/v1/drills", Some(body))
            .await
    }

    /// `POST /api/v1/drills/{id}/stop` through the leader: (status, answer).
    pub async fn stop_drill(&self, id: u64) -> (u16, Value) {
        let leader = self.cluster.wait_leader(Duration::from_secs(20)).await;
        let path = format!("/api/v1/drills/{id}/stop");
        let body = Some(serde_json::json!({}));
        self.cluster
            .send(leader, reqwest::Method::POST, &path, body)
            .await
    }

    /// The split's granted value per region for `rule`.
    pub async fn split(&self, rule: &str) -> BTreeMap<String, u64> {
        let body = self.allocations(&format!("rule={rule}")).await;
        granted(&body["split"])
    }

    /// Waits until every region holds a non-zero share of `rule`.
    pub async fn wait_allocated(&self, rule: &str, within: Duration) -> BTreeMap<String, u64> {
        let started = Instant::now();
        loop {
            let body = self.allocations("").await;
            let split = granted(&body["rules"][rule]["split"]);
            if self
                .regions
                .iter()
                .all(|r| split.get(&r.name).copied().unwrap_or(0) > 0)
            {
                return split;
            }
            assert!(
                started.elapsed() < within,
                "no allocation for every region of {rule} within {within:?}: {body}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// The allocation epoch a limiter holds, from its /metrics.
pub async fn limiter_epoch(limiter: &LimiterProcess) -> u64 {
    let Ok(r) = super::http_get(limiter.http_url("/metrics")).await else {
        return 0;
    };
    let text = r.text().await.unwrap_or_default();
    // The series carries the limiter's `region` label.
    text.lines()
        .find_map(|l| {
            let rest = l.strip_prefix("meridian_allocation_epoch")?;
            let value = match rest.strip_prefix('{') {
                Some(labelled) => labelled.split_once("} ")?.1,
                None => rest.strip_prefix(' ')?,
            };
            value.trim().parse::<f64>().ok()
        })
        .map_or(0, |v| v as u64)
}

/// The first sample of the unlabelled-or-labelled series `name` on a
/// limiter's /metrics (`None`: no answer, or no such series yet).
pub async fn limiter_gauge(limiter: &LimiterProcess, name: &str) -> Option<f64> {
    let r = super::http_get(limiter.http_url("/metrics")).await.ok()?;
    let text = r.text().await.ok()?;
    text.lines().find_map(|l| {
        let rest = l.strip_prefix(name)?;
        let value = match rest.strip_prefix('{') {
            Some(labelled) => labelled.split_once("} ")?.1,
            None => rest.strip_prefix(' ')?,
        };
        value.trim().parse::<f64>().ok()
    })
}

/// Commit-to-limiter times (ms) of the next `n` epochs region `region`
/// applies within `within`: when its /metrics first shows the epoch, minus
/// the epoch's timestamp (set by the leader before proposing, so Raft's
/// commit is included).
pub async fn propagation_ms(world: &World, region: usize, n: usize, within: Duration) -> Vec<u64> {
    let limiter = &world.regions[region].limiter;
    let mut lags = Vec::new();
    let deadline = Instant::now() + within;
    let mut seen = limiter_epoch(limiter).await;
    while Instant::now() < deadline && lags.len() < n {
        let e = limiter_epoch(limiter).await;
        if e > seen {
            let at_ms = now_us() / 1000;
            let body = world.allocations("").await;
            if body["epoch"].as_u64() == Some(e) {
                lags.push(at_ms.saturating_sub(body["at_unix_ms"].as_u64().unwrap_or(at_ms)));
            }
            seen = e;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    lags
}

pub fn granted(shares: &Value) -> BTreeMap<String, u64> {
    shares
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v["granted"].as_u64().unwrap_or(0)))
                .collect()
        })
        .unwrap_or_default()
}

/// One decision as a client saw it.
#[derive(Debug, Clone)]
pub struct Record {
    pub region: usize,
    pub sent_us: u64,
    pub recv_us: u64,
    pub allowed: bool,
    pub limit: u64,
    pub reset_after_us: u64,
    pub reason: String,
}

/// Open-loop traffic: per region a rate (checks per second) the test can
/// change while it runs.
pub struct Load {
    pub rates: Vec<Arc<AtomicU64>>,
    pub records: Arc<Mutex<Vec<Record>>>,
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    /// Checks of `key` under the rule named `rule` (native checks by name).
    pub fn start(world: &World, domain: &str, rule: &str, key: &str, rates: &[u64]) -> Load {
        let check = Check {
            domain: domain.to_string(),
            rule: rule.to_string(),
            key: key.to_string(),
            cost: 1,
            ..Default::default()
        };
        Load::start_checks(world, check, rates)
    }

    /// Descriptor checks (`entries` in `domain`), as Envoy sends them.
    pub fn start_descriptor(
        world: &World,
        domain: &str,
        entries: &[(&str, &str)],
        rates: &[u64],
    ) -> Load {
        let check = Check {
            domain: domain.to_string(),
            descriptor: entries
                .iter()
                .map(|(key, value)| Entry {
                    key: key.to_string(),
                    value: value.to_string(),
                })
                .collect(),
            cost: 1,
            ..Default::default()
        };
        Load::start_checks(world, check, rates)
    }

    /// `check`, at each region's rate (checks per second, in batches every
    /// 20 ms), every decision recorded.
    fn start_checks(world: &World, check: Check, rates: &[u64]) -> Load {
        let records = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let mut load_rates = Vec::new();
        let mut tasks = Vec::new();
        for (i, region) in world.regions.iter().enumerate() {
            let rate = Arc::new(AtomicU64::new(rates[i]));
            load_rates.push(rate.clone());
            let url = region.limiter.grpc_url();
            let (records, stop, check) = (records.clone(), stop.clone(), check.clone());
            tasks.push(tokio::spawn(async move {
                let mut client = LimiterClient::connect(url).await.expect("limiter gRPC");
                let mut tick = tokio::time::interval(Duration::from_millis(20));
                let mut owed = 0.0f64;
                while !stop.load(Ordering::Relaxed) {
                    tick.tick().await;
                    owed += rate.load(Ordering::Relaxed) as f64 / 50.0;
                    let n = owed.floor() as usize;
                    owed -= n as f64;
                    if n == 0 {
                        continue;
                    }
                    let checks = vec![check.clone(); n];
                    let sent_us = now_us();
                    let Ok(response) = client.check(CheckRequest { checks }).await else {
                        continue;
                    };
                    let recv_us = now_us();
                    let mut out = records.lock().expect("records");
                    for d in response.into_inner().decisions {
                        out.push(Record {
                            region: i,
                            sent_us,
                            recv_us,
                            allowed: d.allowed,
                            limit: d.limit,
                            reset_after_us: d.reset_after_us,
                            reason: d.reason,
                        });
                    }
                }
            }));
        }
        Load {
            rates: load_rates,
            records,
            stop,
            tasks,
        }
    }

    /// The decisions recorded so far.
    pub fn records(&self) -> Vec<Record> {
        self.records.lock().expect("records").clone()
    }

    pub fn set(&self, rates: &[u64]) {
        for (r, v) in self.rates.iter().zip(rates) {
            r.store(*v, Ordering::Relaxed);
        }
    }

    pub async fn stop(self) -> Vec<Record> {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.tasks {
            let _ = t.await;
        }
        self.records.lock().expect("records").clone()
    }
}

/// Admitted hits per clock-aligned window (index = start / period) and
/// region. The window of an admitted decision comes from its reset time:
/// fixed window resets at the window's end; a sliding counter's current
/// count expires one period after that.
pub fn admitted_per_window(
    records: &[Record],
    period: Duration,
    sliding: bool,
    regions: usize,
) -> BTreeMap<u64, Vec<u64>> {
    let period_us = period.as_micros() as u64;
    let mut windows: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    for r in records.iter().filter(|r| r.allowed) {
        let mut end = r.recv_us + r.reset_after_us;
        if sliding {
            end = end.saturating_sub(period_us);
        }
        let window = ((end + period_us / 2) / period_us).saturating_sub(1);
        windows.entry(window).or_insert_with(|| vec![0; regions])[r.region] += 1;
    }
    windows
}

/// Prints and returns (worst overshoot over L in any window, admitted share
/// of min(demand, L) over full windows).
pub fn summarize(
    label: &str,
    records: &[Record],
    windows: &BTreeMap<u64, Vec<u64>>,
    limit: u64,
    period: Duration,
) -> (i64, f64) {
    let period_us = period.as_micros() as u64;
    let mut asked: BTreeMap<u64, u64> = BTreeMap::new();
    for r in records {
        *asked.entry(r.recv_us / period_us).or_default() += 1;
    }
    let mut worst = i64::MIN;
    let (mut admitted, mut capacity) = (0u64, 0u64);
    let first = windows.keys().next().copied().unwrap_or(0);
    let last = windows.keys().next_back().copied().unwrap_or(0);
    for (w, per_region) in windows {
        let total: u64 = per_region.iter().sum();
        worst = worst.max(total as i64 - limit as i64);
        if *w != first && *w != last {
            admitted += total;
            capacity += asked.get(w).copied().unwrap_or(0).min(limit);
        }
    }
    let mut reasons: BTreeMap<&str, usize> = BTreeMap::new();
    for r in records.iter().filter(|r| !r.reason.is_empty()) {
        *reasons.entry(r.reason.as_str()).or_default() += 1;
    }
    eprintln!("{label}: decisions by reason {reasons:?}");
    let share = if capacity == 0 {
        0.0
    } else {
        admitted as f64 / capacity as f64
    };
    eprintln!(
        "{label}: {} windows, worst window {:+} vs L={limit} ({:+.1} %), admitted {:.1} % of min(demand, L)",
        windows.len(),
        worst,
        worst as f64 * 100.0 / limit as f64,
        share * 100.0
    );
    (worst, share)
}
