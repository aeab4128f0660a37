//! What mutual TLS costs the control plane (issue 15, "Measure"): in one run,
//! a plaintext cluster (`--insecure`) and a TLS cluster (every process with
//! its own certificate from one CA, made by `meridian certs`) take turns,
//! [`ROUNDS`] of each, so the shared machine's noise falls on both modes
//! alike. Each is 3 coordinators on loopback with the tests' Raft timings.
//! Per cluster:
//! 1. **rule propagation** — a `PUT /api/v1/rules` to the leader; how long
//!    until a limiter following a *follower* enforces the new limit (its
//!    check API polled every [`POLL`]), from the PUT's 200 and from sending it;
//! 2. **report to epoch** — a top-up `Report` from region mumbai's pod to that
//!    follower; how long until mumbai's `Watch` stream (open on the same
//!    connection beforehand) delivers the epoch that raises the key;
//! 3. **connection setup** — a new limiter process, from spawn until it
//!    enforces the rules it was sent on its first stream.
//!
//! Run: `cargo build --release --bin meridian && cargo run --release
//! --example control_plane_latency` (the `meridian` beside the example in
//! the target dir; `MERIDIAN=path` measures another binary). Prints a
//! Markdown table and the command.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use meridian::proto::envoy::extensions::common::ratelimit::v3::{
    RateLimitDescriptor, rate_limit_descriptor::Entry,
};
use meridian::proto::envoy::service::ratelimit::v3::RateLimitRequest;
use meridian::proto::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use meridian::proto::meridian::v1::coordinator_client::CoordinatorClient;
use meridian::proto::meridian::v1::{AllocationUpdate, DemandReport, TopUp, WatchRequest};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use serde_json::{Value, json};
use tempfile::TempDir;
use tokio::sync::mpsc;
use tonic::transport::{Channel, Endpoint};

/// Plaintext and TLS clusters each start this many times, alternating.
const ROUNDS: usize = 3;
/// Per cluster; × ROUNDS per mode.
const PROPAGATION_SAMPLES: usize = 11;
const EPOCH_SAMPLES: usize = 11;
const SETUP_SAMPLES: usize = 4;
/// How often a limiter's check API is asked for the limit it enforces.
const POLL: Duration = Duration::from_millis(2);
/// A (2) sample that takes longer is counted as stuck and left out.
const RAISE_WITHIN: Duration = Duration::from_secs(5);
/// The world-wide limit of each global rule (per minute).
const GLOBAL_LIMIT: u64 = 1_000;
/// A scheduled round would reset the top-up gap (delaying the next top-up by
/// up to a second) and roll the demand the top-ups raised; with an hour's
/// interval none runs in a cluster's life (the first after a leader starts
/// skips itself until half an interval passed). Leases come from the round
/// that first hears a region and outlive the cluster.
const COORDINATOR_TIMINGS: [&str; 6] = [
    "--rebalance-interval",
    "3600s",
    "--lease",
    "7200s",
    "--suspect-after",
    "3600s",
];
const TOKEN: &str = "measure-admin-token";
/// The region whose pod this program plays, and the region of the limiters.
const REPORTER: &str = "mumbai";
const FOLLOWER: &str = "hyderabad";

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    Plain,
    Tls,
}

/// The figures of one mode, all rounds together.
#[derive(Default)]
struct Samples {
    /// From the PUT's 200, and from sending it (the Raft commit included).
    propagation: Vec<Duration>,
    propagation_sent: Vec<Duration>,
    epoch: Vec<Duration>,
    /// (2) samples whose raise did not come within [`RAISE_WITHIN`].
    epoch_stuck: usize,
    setup: Vec<Duration>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    meridian::commands::install_crypto_provider();
    // Beside the example's own directory: target/release/{examples/,}.
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
    let mut plain = Samples::default();
    let mut tls = Samples::default();
    for round in 1..=ROUNDS {
        for mode in [Mode::Plain, Mode::Tls] {
            eprintln!("round {round}/{ROUNDS}: {mode:?} cluster");
            let cluster = Cluster::start(&bin, mode).await?;
            let samples = if mode == Mode::Plain {
                &mut plain
            } else {
                &mut tls
            };
            // The limiter that follows a follower: it enforces the rules for
            // (1) and, as region hyderabad's pod, acknowledges the epochs
            // that (2) waits for.
            let limiter = Limiter::start(&cluster, FOLLOWER)?;
            for (sent, answered) in rule_propagation(&cluster, &limiter).await? {
                samples.propagation_sent.push(sent);
                samples.propagation.push(answered);
            }
            let (epochs, stuck) = report_to_epoch(&cluster).await?;
            samples.epoch.extend(epochs);
            samples.epoch_stuck += stuck;
            drop(limiter);
            samples.setup.extend(connection_setup(&cluster).await?);
            let last = |v: &[Duration], n: usize| -> Vec<u64> {
                v[v.len().saturating_sub(n)..]
                    .iter()
                    .map(|d| d.as_millis() as u64)
                    .collect()
            };
            eprintln!(
                "  ms: propagation from PUT {:?}, from 200 {:?}, report to epoch {:?}, setup {:?}",
                last(&samples.propagation_sent, PROPAGATION_SAMPLES),
                last(&samples.propagation, PROPAGATION_SAMPLES),
                last(&samples.epoch, EPOCH_SAMPLES),
                last(&samples.setup, SETUP_SAMPLES)
            );
        }
    }
    print_table(&plain, &tls);
    Ok(())
}

/// (1) PUT a new local limit to the leader; until the follower's limiter
/// enforces it, from sending the PUT and from its 200. The leader answers
/// once the version is committed, so the TLS hops of the Raft commit fall
/// before the 200: the first figure holds them, the second what is left
/// (the follower learning the commit, its Watch stream to the limiter).
async fn rule_propagation(
    cluster: &Cluster,
    limiter: &Limiter,
) -> anyhow::Result<Vec<(Duration, Duration)>> {
    let mut checks = limiter.client().await?;
    wait_for_limit(&mut checks, cluster.limit(), Duration::from_secs(20)).await?;
    // In its first second of contact with a leader (the shortest election
    // timeout) a follower serves Watch only while it has applied the last
    // commit it was told of, so each commit then ends the limiter's stream
    // and it reconnects: a start-up effect, left out.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let mut out = Vec::new();
    for _ in 0..PROPAGATION_SAMPLES {
        let limit = cluster.limit() + 1;
        let sent = Instant::now();
        cluster.put_rules(limit).await?;
        let answered = Instant::now();
        wait_for_limit(&mut checks, limit, Duration::from_secs(5)).await?;
        out.push((sent.elapsed(), answered.elapsed()));
        // Apart, so one sample's replication is not the next one's.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(out)
}

/// (2) Region mumbai's pod (this program) watches and reports through one
/// connection to a follower. Each sample asks a top-up for a key of a fresh
/// global rule (no demand yet, split 500/500): the leader's top-up round
/// shrinks hyderabad, whose limiter acknowledges at once, and the transition
/// round that acknowledgement starts raises mumbai — the epoch timed here.
async fn report_to_epoch(cluster: &Cluster) -> anyhow::Result<(Vec<Duration>, usize)> {
    let channel = cluster.channel(REPORTER)?;
    let mut client = CoordinatorClient::new(channel);
    let mut stream = client
        .watch(WatchRequest {
            region: REPORTER.into(),
            pod: "measure".into(),
        })
        .await?
        .into_inner();
    // Stamped on arrival, so the time does not include this task's turn.
    let (tx, mut updates) = mpsc::unbounded_channel();
    let reader = tokio::spawn(async move {
        while let Ok(Some(update)) = stream.message().await {
            if let Some(a) = update.allocations
                && tx.send((Instant::now(), a)).is_err()
            {
                break;
            }
        }
    });
    let mut held = Held::default();
    // Heard without a lease: the leader leases mumbai in a round at once.
    client.report(held.report(vec![])).await?;
    let deadline = Instant::now() + Duration::from_secs(20);
    while !(held.leased() && held.rules.len() == EPOCH_SAMPLES) {
        let (_, a) = next_update(&mut updates, deadline)
            .await?
            .context("mumbai was not leased its shares within 20 s")?;
        held.apply(&a);
    }
    // Quiet for longer than the top-up gap: the next round is the sample's.
    while let Ok(Some((_, a))) =
        tokio::time::timeout(Duration::from_millis(1_500), updates.recv()).await
    {
        held.apply(&a);
    }
    // Only global rules have allocations: `api|g00`, `api|g01`, …
    let mut rules: Vec<String> = held.rules.keys().cloned().collect();
    rules.sort();
    let (mut out, mut stuck) = (Vec::new(), 0);
    for rule in &rules {
        // The counter key of descriptor `g00=hot`.
        let key = format!("{}=hot", rule.rsplit('|').next().unwrap_or(rule));
        let before = held.value(rule, &key);
        let top_up = TopUp {
            rule: rule.clone(),
            key: key.clone(),
            per_period: GLOBAL_LIMIT as f64,
            interval_ms: 0,
        };
        let sent = Instant::now();
        client.report(held.report(vec![top_up])).await?;
        let arrived = loop {
            let Some((at, a)) = next_update(&mut updates, sent + RAISE_WITHIN).await? else {
                break None;
            };
            held.apply(&a);
            if held.value(rule, &key) > before {
                break Some(at);
            }
        };
        match arrived {
            Some(at) => out.push(at - sent),
            None => {
                // What the leader holds instead: the split, and the epoch
                // each pod acknowledged.
                stuck += 1;
                let split = cluster
                    .get(&format!("/api/v1/allocations?rule={rule}"))
                    .await;
                let leases = cluster.get("/api/v1/leases").await;
                eprintln!(
                    "  {rule}: not raised above {before} within {RAISE_WITHIN:?}; split {}, leases {leases}",
                    split["split"]
                );
            }
        }
        // Past the top-up gap (1 s from the last top-up round).
        tokio::time::sleep(Duration::from_millis(1_200)).await;
        while let Ok((_, a)) = updates.try_recv() {
            held.apply(&a);
        }
    }
    reader.abort();
    Ok((out, stuck))
}

/// (3) A new limiter process: from spawn until it enforces the rules its
/// first stream carried (process start, certificate load, TCP and — over
/// TLS — the handshake, the first message).
async fn connection_setup(cluster: &Cluster) -> anyhow::Result<Vec<Duration>> {
    let mut out = Vec::new();
    for _ in 0..SETUP_SAMPLES {
        let spawned = Instant::now();
        let limiter = Limiter::start(cluster, FOLLOWER)?;
        let mut checks = limiter.client().await?;
        wait_for_limit(&mut checks, cluster.limit(), Duration::from_secs(10)).await?;
        out.push(spawned.elapsed());
    }
    Ok(out)
}

/// What mumbai holds, mirrored from its Watch stream.
#[derive(Default)]
struct Held {
    epoch: u64,
    valid_until_ms: i64,
    /// Per rule: the split and the key entries.
    rules: HashMap<String, (u64, HashMap<String, u64>)>,
}

impl Held {
    fn apply(&mut self, a: &AllocationUpdate) {
        if a.full && a.part == 0 {
            self.rules.clear();
        }
        self.epoch = self.epoch.max(a.epoch);
        self.valid_until_ms = a.valid_until_unix_ms;
        for r in &a.rules {
            let entry = self.rules.entry(r.rule.clone()).or_default();
            if let Some(split) = r.split {
                entry.0 = split;
            }
            for k in &r.keys {
                match k.value {
                    Some(v) => entry.1.insert(k.key.clone(), v),
                    None => entry.1.remove(&k.key),
                };
            }
        }
        for r in &a.removed_rules {
            self.rules.remove(r);
        }
    }

    /// The key's entry, else the rule's split.
    fn value(&self, rule: &str, key: &str) -> u64 {
        self.rules
            .get(rule)
            .map_or(0, |(split, keys)| *keys.get(key).unwrap_or(split))
    }

    fn leased(&self) -> bool {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        self.valid_until_ms > now
    }

    /// A report acknowledging the epoch held, with `top_ups`.
    fn report(&self, top_ups: Vec<TopUp>) -> DemandReport {
        DemandReport {
            region: REPORTER.into(),
            pod: "measure".into(),
            epoch: self.epoch,
            top_ups,
            ..Default::default()
        }
    }
}

/// The next update with its arrival time; `None` once `deadline` passed.
async fn next_update(
    updates: &mut mpsc::UnboundedReceiver<(Instant, AllocationUpdate)>,
    deadline: Instant,
) -> anyhow::Result<Option<(Instant, AllocationUpdate)>> {
    let left = deadline.saturating_duration_since(Instant::now());
    match tokio::time::timeout(left, updates.recv()).await {
        Ok(Some(x)) => Ok(Some(x)),
        Ok(None) => bail!("the Watch stream ended"),
        Err(_) => Ok(None),
    }
}

/// The limit `user=<key>` gets from the limiter (None: no rule matched or
/// no answer). `hits_addend` 0 counts nothing.
async fn enforced_limit(checks: &mut RateLimitServiceClient<Channel>, key: &str) -> Option<u32> {
    let request = RateLimitRequest {
        domain: "api".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "user".into(),
                value: key.into(),
            }],
            ..Default::default()
        }],
        hits_addend: 0,
    };
    let answer = checks.should_rate_limit(request).await.ok()?.into_inner();
    Some(
        answer
            .statuses
            .first()?
            .current_limit
            .as_ref()?
            .requests_per_unit,
    )
}

async fn wait_for_limit(
    checks: &mut RateLimitServiceClient<Channel>,
    limit: u32,
    within: Duration,
) -> anyhow::Result<()> {
    let started = Instant::now();
    while enforced_limit(checks, "probe").await != Some(limit) {
        if started.elapsed() > within {
            bail!("limit {limit} not enforced within {within:?}");
        }
        tokio::time::sleep(POLL).await;
    }
    Ok(())
}

/// One rule file: the local limit `user` that (1) changes, and one fresh
/// global token bucket per (2) sample (`g00`, `g01`, …; token buckets have no
/// window, so a raise applies at once).
fn rules_yaml(local_limit: u32) -> String {
    let mut text = format!(
        "domain: api\ndescriptors:\n  - key: user\n    rate_limit:\n      unit: hour\n      requests_per_unit: {local_limit}\n"
    );
    for i in 0..EPOCH_SAMPLES {
        text.push_str(&format!(
            "  - key: g{i:02}\n    scope: global\n    algorithm: token_bucket\n    burst: 100\n    rate_limit:\n      unit: minute\n      requests_per_unit: {GLOBAL_LIMIT}\n"
        ));
    }
    text
}

/// Three `meridian coordinator` processes on loopback, killed on drop.
struct Cluster {
    bin: PathBuf,
    mode: Mode,
    dir: TempDir,
    nodes: Vec<Node>,
    http: reqwest::Client,
    leader: usize,
    /// The node the limiters and the reporting pod talk to.
    follower: usize,
    /// The local limit of the last rule set put; (1) raises it by one each
    /// time, so a limiter's answer tells which version it enforces.
    limit: std::sync::atomic::AtomicU32,
}

struct Node {
    id: u64,
    raft_addr: String,
    http_addr: String,
    child: Child,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            let _ = node.child.kill();
            let _ = node.child.wait();
        }
    }
}

impl Cluster {
    async fn start(bin: &Path, mode: Mode) -> anyhow::Result<Cluster> {
        let dir = tempfile::tempdir()?;
        let token = dir.path().join("admin-token");
        std::fs::write(&token, TOKEN)?;
        std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600))?;
        let ports = free_ports(6)?;
        let addr = |i: usize| format!("127.0.0.1:{}", ports[i]);
        let init: Vec<String> = (0..3)
            .map(|i| format!("{}={}@{}", i + 1, addr(2 * i), addr(2 * i + 1)))
            .collect();
        if mode == Mode::Tls {
            certs(bin, dir.path(), &["ca"])?;
            for id in ["1", "2", "3"] {
                certs(
                    bin,
                    dir.path(),
                    &["issue", "--node", id, "--host", "127.0.0.1"],
                )?;
            }
            for region in [REPORTER, FOLLOWER] {
                certs(bin, dir.path(), &["issue", "--region", region])?;
            }
        }
        let mut nodes = Vec::new();
        for i in 0..3 {
            let id = i as u64 + 1;
            let log = std::fs::File::create(dir.path().join(format!("node-{id}.log")))?;
            let mut cmd = Command::new(bin);
            cmd.arg("coordinator")
                .args(["--id", &id.to_string()])
                .arg("--data-dir")
                .arg(dir.path().join(format!("node-{id}")))
                .args(["--raft-addr", &addr(2 * i), "--http-addr", &addr(2 * i + 1)])
                .arg("--admin-token-file")
                .arg(&token)
                // The tests' timings: short heartbeats on loopback.
                .args(["--heartbeat-ms", "100", "--election-timeout-ms", "1000"])
                .args(COORDINATOR_TIMINGS)
                .args(transport_flags(dir.path(), mode, &format!("node-{id}")))
                .env("RUST_LOG", "warn")
                .stdin(Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log);
            if id == 1 {
                cmd.args(["--init", &init.join(",")]);
            }
            nodes.push(Node {
                id,
                raft_addr: addr(2 * i),
                http_addr: addr(2 * i + 1),
                child: cmd.spawn().context("spawn meridian coordinator")?,
            });
        }
        let http = match mode {
            Mode::Plain => reqwest::Client::builder(),
            Mode::Tls => reqwest::Client::builder().use_preconfigured_tls(client_tls(
                dir.path(),
                None,
                &[b"h2", b"http/1.1"],
            )?),
        }
        .timeout(Duration::from_secs(10))
        .build()?;
        let mut cluster = Cluster {
            bin: bin.to_path_buf(),
            mode,
            dir,
            nodes,
            http,
            leader: 0,
            follower: 0,
            limit: 0.into(),
        };
        cluster.leader = cluster.wait_leader().await?;
        cluster.follower = (cluster.leader + 1) % 3;
        // Regions before rules, as an operator would: their first shares
        // come from capacity never issued.
        for region in [REPORTER, FOLLOWER] {
            let path = format!("/api/v1/regions/{region}");
            cluster
                .send(reqwest::Method::PUT, &path, json!({ "weight": 1.0 }))
                .await?;
        }
        cluster.put_rules(100).await?;
        Ok(cluster)
    }

    fn url(&self, node: usize) -> String {
        let scheme = if self.mode == Mode::Tls {
            "https"
        } else {
            "http"
        };
        format!("{scheme}://{}", self.nodes[node].http_addr)
    }

    /// The index of the node every node names as leader.
    async fn wait_leader(&self) -> anyhow::Result<usize> {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            let mut named = Vec::new();
            for i in 0..self.nodes.len() {
                let url = format!("{}/api/v1/cluster", self.url(i));
                let body: Option<Value> = match self.http.get(url).bearer_auth(TOKEN).send().await {
                    Ok(r) => r.json().await.ok(),
                    Err(_) => None,
                };
                named.push(body.and_then(|b| b["leader"].as_u64()));
            }
            if let Some(Some(id)) = named.first()
                && named.iter().all(|n| *n == Some(*id))
                && let Some(i) = self.nodes.iter().position(|n| n.id == *id)
            {
                return Ok(i);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        bail!(
            "no agreed leader within 30 s; logs in {}",
            self.dir.path().display()
        )
    }

    /// A read from the leader (the body, or the error as a string).
    async fn get(&self, path: &str) -> Value {
        let url = format!("{}{path}", self.url(self.leader));
        match self.http.get(url).bearer_auth(TOKEN).send().await {
            Ok(r) => r.json().await.unwrap_or(Value::Null),
            Err(e) => json!(e.to_string()),
        }
    }

    /// An admin write to the leader; fails unless it answers 2xx.
    async fn send(&self, method: reqwest::Method, path: &str, body: Value) -> anyhow::Result<()> {
        let url = format!("{}{path}", self.url(self.leader));
        let r = self
            .http
            .request(method, url)
            .bearer_auth(TOKEN)
            .json(&body)
            .send()
            .await?;
        let status = r.status();
        if !status.is_success() {
            bail!("{path}: {status} {}", r.text().await.unwrap_or_default());
        }
        Ok(())
    }

    async fn put_rules(&self, local_limit: u32) -> anyhow::Result<()> {
        let files = json!({ "files": { "rules.yaml": rules_yaml(local_limit) } });
        self.send(reqwest::Method::PUT, "/api/v1/rules", files)
            .await?;
        self.limit
            .store(local_limit, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    fn limit(&self) -> u32 {
        self.limit.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The follower's gRPC URL.
    fn grpc_url(&self) -> String {
        let scheme = if self.mode == Mode::Tls {
            "https"
        } else {
            "http"
        };
        format!("{scheme}://{}", self.nodes[self.follower].raft_addr)
    }

    /// A gRPC channel to the follower as `region`'s pod: over TLS presenting
    /// the region's certificate, as its limiters do.
    fn channel(&self, region: &str) -> anyhow::Result<Channel> {
        let endpoint = Endpoint::from_shared(self.grpc_url())?.tcp_nodelay(true);
        if self.mode == Mode::Plain {
            return Ok(endpoint.connect_lazy());
        }
        let stem = format!("region-{region}");
        let config = Arc::new(client_tls(self.dir.path(), Some(&stem), &[b"h2"])?);
        let connector = tower::service_fn(move |uri: tonic::transport::Uri| {
            let connector = tokio_rustls::TlsConnector::from(Arc::clone(&config));
            async move {
                let host = uri.host().unwrap_or("127.0.0.1").to_string();
                let tcp =
                    tokio::net::TcpStream::connect((host.as_str(), uri.port_u16().unwrap_or(443)))
                        .await?;
                tcp.set_nodelay(true)?;
                let name = ServerName::try_from(host)
                    .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
                let tls = connector.connect(name, tcp).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(tls))
            }
        });
        Ok(endpoint.connect_with_connector_lazy(connector))
    }
}

/// `--insecure`, or the certificate `stem` (`node-1`, `region-mumbai`).
fn transport_flags(dir: &Path, mode: Mode, stem: &str) -> Vec<String> {
    match mode {
        Mode::Plain => vec!["--insecure".into()],
        Mode::Tls => {
            let path = |name: String| dir.join(name).display().to_string();
            vec![
                "--tls-cert".into(),
                path(format!("{stem}.pem")),
                "--tls-key".into(),
                path(format!("{stem}-key.pem")),
                "--tls-ca".into(),
                path("ca.pem".into()),
            ]
        }
    }
}

/// `meridian certs ARGS --dir DIR`, as an operator makes them.
fn certs(bin: &Path, dir: &Path, args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new(bin)
        .arg("certs")
        .args(args)
        .arg("--dir")
        .arg(dir)
        .output()?;
    if !out.status.success() {
        bail!(
            "meridian certs {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// A client config trusting the cluster's CA, presenting `stem`'s
/// certificate when given.
fn client_tls(
    dir: &Path,
    stem: Option<&str>,
    alpn: &[&[u8]],
) -> anyhow::Result<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(dir.join("ca.pem"))? {
        roots.add(cert?)?;
    }
    let builder = rustls::ClientConfig::builder().with_root_certificates(roots);
    let mut config = match stem {
        Some(stem) => {
            let chain = CertificateDer::pem_file_iter(dir.join(format!("{stem}.pem")))?
                .collect::<Result<Vec<_>, _>>()?;
            let key = PrivateKeyDer::from_pem_file(dir.join(format!("{stem}-key.pem")))?;
            builder.with_client_auth_cert(chain, key)?
        }
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(config)
}

/// Ports held open together, so no two of them are the same.
fn free_ports(n: usize) -> anyhow::Result<Vec<u16>> {
    let held: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0"))
        .collect::<Result<_, _>>()?;
    Ok(held
        .iter()
        .map(|l| l.local_addr().map(|a| a.port()))
        .collect::<Result<_, _>>()?)
}

/// A `meridian limiter --store memory` of `region` following the cluster's
/// follower, killed on drop.
struct Limiter {
    child: Child,
    grpc: SocketAddr,
    /// Kept open: a limiter that printed to a closed pipe would fail.
    _stdout: BufReader<ChildStdout>,
    _cache: TempDir,
}

impl Drop for Limiter {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Limiter {
    fn start(cluster: &Cluster, region: &str) -> anyhow::Result<Limiter> {
        let cache = tempfile::tempdir()?;
        let mut child = Command::new(&cluster.bin)
            .arg("limiter")
            .args(["--store", "memory", "--region", region])
            .args(["--coordinator", &cluster.grpc_url()])
            .arg("--rules-cache")
            .arg(cache.path().join("rules-cache.json"))
            .args(["--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"])
            .args(["--report-interval", "1s"])
            .args(transport_flags(
                cluster.dir.path(),
                cluster.mode,
                &format!("region-{region}"),
            ))
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .spawn()
            .context("spawn meridian limiter")?;
        // Its first line names the ports it bound.
        let stdout = child.stdout.take().context("limiter stdout")?;
        let mut stdout = BufReader::new(stdout);
        let mut line = String::new();
        stdout.read_line(&mut line)?;
        let grpc = line
            .split_whitespace()
            .find_map(|w| w.strip_prefix("grpc="))
            .and_then(|a| a.parse().ok())
            .with_context(|| format!("no grpc= in the limiter's first line {line:?}"))?;
        Ok(Limiter {
            child,
            grpc,
            _stdout: stdout,
            _cache: cache,
        })
    }

    /// A connection to its check API, kept for every poll.
    async fn client(&self) -> anyhow::Result<RateLimitServiceClient<Channel>> {
        Ok(RateLimitServiceClient::connect(format!("http://{}", self.grpc)).await?)
    }
}

/// Nearest-rank percentile, milliseconds.
fn percentile_ms(samples: &[Duration], p: f64) -> f64 {
    let mut v: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1e3).collect();
    v.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * (v.len().saturating_sub(1)) as f64).round() as usize;
    v.get(rank).copied().unwrap_or(f64::NAN)
}

fn print_table(plain: &Samples, tls: &Samples) {
    println!(
        "\n| figure (ms) | n per mode | plaintext p50 / p90 / max | TLS p50 / p90 / max | TLS / plaintext p50, p90 |"
    );
    println!("|---|---:|---:|---:|---:|");
    let rows = [
        (
            "rule propagation: PUT sent → follower's limiter enforces",
            &plain.propagation_sent,
            &tls.propagation_sent,
        ),
        (
            "rule propagation: PUT 200 → follower's limiter enforces",
            &plain.propagation,
            &tls.propagation,
        ),
        (
            "report to epoch: top-up Report to a follower → raising epoch on Watch",
            &plain.epoch,
            &tls.epoch,
        ),
        (
            "connection setup: new limiter spawned → enforces its first rules",
            &plain.setup,
            &tls.setup,
        ),
    ];
    for (name, p, t) in rows {
        let three = |s: &[Duration]| {
            format!(
                "{:.1} / {:.1} / {:.1}",
                percentile_ms(s, 50.0),
                percentile_ms(s, 90.0),
                percentile_ms(s, 100.0)
            )
        };
        let ratio = |q: f64| percentile_ms(t, q) / percentile_ms(p, q);
        println!(
            "| {name} | {} | {} | {} | {:.2}×, {:.2}× |",
            p.len().min(t.len()),
            three(p),
            three(t),
            ratio(50.0),
            ratio(90.0)
        );
    }
    println!(
        "\n(2) samples not raised within {RAISE_WITHIN:?}, left out: plaintext {}, TLS {}.",
        plain.epoch_stuck, tls.epoch_stuck
    );
    println!(
        "{ROUNDS} rounds of a plaintext then a TLS cluster (3 coordinators, heartbeat 100 ms), release build: \
         `cargo build --release --bin meridian && cargo run --release --example control_plane_latency`"
    );
}
