//! Coordinator clusters for tests: real `meridian coordinator` processes on
//! loopback, each with its own data dir under one temp dir, killed with
//! SIGKILL when the cluster handle drops (also when a test panics).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tempfile::TempDir;

use super::tls::Pki;

pub const TOKEN: &str = "test-admin-token";

/// Raft timings and snapshot policy passed to every node.
#[derive(Clone, Debug)]
pub struct Options {
    pub heartbeat_ms: u64,
    pub election_timeout_ms: u64,
    pub snapshot_logs: u64,
    pub snapshot_keep_logs: u64,
    /// `--shared-rule-floor`, requests per minute (0 = off).
    pub shared_rule_floor: f64,
    /// More flags for every node (e.g. `--rebalance-interval 2s`).
    pub extra_args: Vec<String>,
    /// Mutual TLS with certificates from `meridian certs` (else `--insecure`).
    pub tls: bool,
    /// `--advertise-host` for every node: members are then named
    /// `HOST:PORT` (in `--init` too) instead of by their listen address.
    pub advertise_host: Option<String>,
    /// More environment variables for every node.
    pub env: Vec<(String, String)>,
}

impl Default for Options {
    /// Short timings for loopback, yet above a slow disk's fsync (a vote is
    /// fsynced before it is answered; a loaded CI disk can take 200+ ms).
    fn default() -> Self {
        Options {
            heartbeat_ms: 100,
            election_timeout_ms: 1000,
            snapshot_logs: 5000,
            snapshot_keep_logs: 1000,
            shared_rule_floor: 60.0,
            extra_args: Vec::new(),
            tls: false,
            advertise_host: None,
            env: Vec::new(),
        }
    }
}

/// One node: its ports stay fixed across restarts, its data dir persists.
pub struct Node {
    pub id: u64,
    pub raft_addr: String,
    pub http_addr: String,
    data_dir: PathBuf,
    log: PathBuf,
    child: Option<Child>,
    /// `http` or `https`.
    scheme: &'static str,
}

impl Node {
    pub fn url(&self) -> String {
        format!("{}://{}", self.scheme, self.http_addr)
    }

    pub fn grpc_url(&self) -> String {
        format!("{}://{}", self.scheme, self.raft_addr)
    }

    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// The process id while the node runs (for /proc and signals).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Freezes the node (SIGSTOP): its sockets stay open, nothing answers.
    pub fn pause(&self) {
        if let Some(pid) = self.pid() {
            super::signal(pid, "-STOP");
        }
    }

    /// Lets a paused node run again (SIGCONT).
    pub fn resume(&self) {
        if let Some(pid) = self.pid() {
            super::signal(pid, "-CONT");
        }
    }

    /// The last lines of the node's log, for failure messages.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }
}

pub struct Cluster {
    pub nodes: BTreeMap<u64, Node>,
    pub http: reqwest::Client,
    /// The CA and certificates, with `Options::tls`.
    pub pki: Option<Pki>,
    options: Options,
    dir: TempDir,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for node in self.nodes.values_mut() {
            node.kill();
        }
        if std::thread::panicking() {
            for node in self.nodes.values() {
                eprintln!("--- node {} log tail ---\n{}", node.id, node.log_tail());
            }
            if let Some(failure) = super::last_panic() {
                eprintln!("--- the failure (said again below the logs) ---\n{failure}");
            }
        }
    }
}

impl Cluster {
    /// Starts `n` nodes; node 1 bootstraps the cluster with all of them.
    pub async fn start(n: u64, options: Options) -> Cluster {
        super::remember_panics();
        let dir = tempfile::tempdir().expect("temp dir for the cluster");
        let pki = options.tls.then(|| Pki::new(&dir.path().join("pki")));
        let http = match &pki {
            Some(pki) => pki.http(),
            None => super::http_client()
                .timeout(Duration::from_secs(30))
                .build()
                .expect("HTTP client"),
        };
        let mut cluster = Cluster {
            nodes: BTreeMap::new(),
            http,
            pki,
            options,
            dir,
        };
        let token = cluster.dir.path().join("admin-token");
        std::fs::write(&token, TOKEN).expect("write the admin token file");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let private = std::fs::Permissions::from_mode(0o600);
            std::fs::set_permissions(&token, private).expect("chmod the admin token file");
        }
        for id in 1..=n {
            cluster.define(id);
        }
        let init: Vec<String> = cluster
            .nodes
            .values()
            .map(|n| {
                let (raft, http) = cluster.advertised(n);
                format!("{}={raft}@{http}", n.id)
            })
            .collect();
        let init = init.join(",");
        for id in 1..=n {
            let extra = if id == 1 {
                vec!["--init".to_string(), init.clone()]
            } else {
                Vec::new()
            };
            cluster.spawn(id, &extra);
        }
        cluster.wait_leader(Duration::from_secs(20)).await;
        cluster
    }

    fn define(&mut self, id: u64) {
        let node = Node {
            id,
            raft_addr: format!("127.0.0.1:{}", super::free_port()),
            http_addr: format!("127.0.0.1:{}", super::free_port()),
            data_dir: self.dir.path().join(format!("node-{id}")),
            log: self.dir.path().join(format!("node-{id}.log")),
            child: None,
            scheme: if self.pki.is_some() { "https" } else { "http" },
        };
        if let Some(pki) = &self.pki {
            pki.issue_node(id);
        }
        self.nodes.insert(id, node);
    }

    /// The raft and HTTP addresses peers dial `node` by.
    fn advertised(&self, node: &Node) -> (String, String) {
        let Some(host) = &self.options.advertise_host else {
            return (node.raft_addr.clone(), node.http_addr.clone());
        };
        let port = |addr: &str| addr.rsplit(':').next().unwrap_or("").to_owned();
        (
            format!("{host}:{}", port(&node.raft_addr)),
            format!("{host}:{}", port(&node.http_addr)),
        )
    }

    fn spawn(&mut self, id: u64, extra: &[String]) {
        let o = self.options.clone();
        let advertise: Vec<String> = o
            .advertise_host
            .iter()
            .flat_map(|h| ["--advertise-host".to_string(), h.clone()])
            .collect();
        let transport = match &self.pki {
            Some(pki) => pki.flags(&format!("node-{id}")),
            None => vec!["--insecure".to_string()],
        };
        let node = self.nodes.get_mut(&id).expect("node defined");
        assert!(node.child.is_none(), "node {id} already running");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&node.log)
            .expect("node log file");
        let child = Command::new(super::meridian_bin())
            .arg("coordinator")
            .args(["--id", &id.to_string()])
            .arg("--data-dir")
            .arg(&node.data_dir)
            .args(["--raft-addr", &node.raft_addr])
            .args(["--http-addr", &node.http_addr])
            .arg("--admin-token-file")
            .arg(self.dir.path().join("admin-token"))
            .args(["--heartbeat-ms", &o.heartbeat_ms.to_string()])
            .args(["--election-timeout-ms", &o.election_timeout_ms.to_string()])
            .args(["--snapshot-logs", &o.snapshot_logs.to_string()])
            .args(["--snapshot-keep-logs", &o.snapshot_keep_logs.to_string()])
            .args(["--shared-rule-floor", &o.shared_rule_floor.to_string()])
            .args(&transport)
            .args(&advertise)
            .args(&o.extra_args)
            .args(extra)
            .env("RUST_LOG", "info,openraft=warn")
            .envs(o.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log handle"))
            .stderr(log)
            .spawn()
            .expect("spawn meridian coordinator");
        node.child = Some(child);
    }

    pub fn node(&self, id: u64) -> &Node {
        self.nodes.get(&id).expect("node exists")
    }

    pub fn running(&self) -> Vec<u64> {
        self.nodes
            .values()
            .filter(|n| n.is_running())
            .map(|n| n.id)
            .collect()
    }

    /// SIGKILL: no shutdown path runs, only what is on disk survives.
    pub fn kill(&mut self, id: u64) {
        self.nodes.get_mut(&id).expect("node exists").kill();
    }

    /// SIGTERM, then waits up to `timeout` for the process to exit; returns
    /// whether it exited successfully in time (it is SIGKILLed otherwise).
    pub fn terminate(&mut self, id: u64, timeout: Duration) -> bool {
        let node = self.nodes.get_mut(&id).expect("node exists");
        let Some(child) = node.child.as_mut() else {
            return false;
        };
        let sent = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .is_ok_and(|s| s.success());
        assert!(sent, "could not send SIGTERM to node {id}");
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = child.try_wait() {
                node.child = None;
                return status.success();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        node.kill();
        false
    }

    /// `--shared-rule-floor` for nodes started from now on (an operator
    /// raising the floor and restarting).
    pub fn set_shared_rule_floor(&mut self, per_minute: f64) {
        self.options.shared_rule_floor = per_minute;
    }

    /// Restarts a stopped node from its data dir (no --init, no --join).
    pub fn restart(&mut self, id: u64) {
        self.spawn(id, &[]);
    }

    /// Starts a new node that joins through node `via`.
    pub fn join(&mut self, id: u64, via: u64) {
        self.define(id);
        let url = self.node(via).url();
        self.spawn(id, &["--join".to_string(), url]);
    }

    /// Starts a new node that waits to be added (no --init, no --join), as
    /// an operator starts one before `meridian ctl cluster add`.
    pub fn start_unjoined(&mut self, id: u64) {
        self.define(id);
        self.spawn(id, &[]);
    }

    /// Removes the node from the Raft membership (through node `via`), then stops it.
    pub async fn remove(&mut self, id: u64, via: u64) {
        let (status, body) = self
            .send(
                via,
                reqwest::Method::DELETE,
                &format!("/api/v1/cluster/nodes/{id}"),
                None,
            )
            .await;
        assert_eq!(status, 200, "remove node {id}: {body}");
        self.kill(id);
    }

    /// Waits until node `id` has purged part of its log behind a snapshot
    /// (`purged_index` > 0), failing after `within`.
    pub async fn wait_purged(&self, id: u64, within: Duration) {
        let asked = Instant::now();
        loop {
            let (_, status) = self
                .get(id, "/api/v1/cluster")
                .await
                .unwrap_or((0, Value::Null));
            if status["purged_index"].as_u64().unwrap_or(0) > 0 {
                return;
            }
            assert!(
                asked.elapsed() < within,
                "node {id} did not compact its log within {within:?}: {status}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// GET a path on a node; `None` when the node does not answer.
    pub async fn get(&self, id: u64, path: &str) -> Option<(u16, Value)> {
        let url = format!("{}{path}", self.node(id).url());
        // The admin token also passes a `--read-token-file` check.
        let r = self.http.get(url).bearer_auth(TOKEN).send().await.ok()?;
        let status = r.status().as_u16();
        Some((status, r.json().await.unwrap_or(Value::Null)))
    }

    /// A write with the admin token.
    pub async fn send(
        &self,
        id: u64,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let url = format!("{}{path}", self.node(id).url());
        let mut req = self.http.request(method, url).bearer_auth(TOKEN);
        if let Some(b) = body {
            req = req.json(&b);
        }
        match req.send().await {
            Ok(r) => {
                let status = r.status().as_u16();
                (status, r.json().await.unwrap_or(Value::Null))
            }
            Err(e) => (0, json!({ "error": e.to_string() })),
        }
    }

    /// Registers `region` (weight 1) through node `id`, as an admin would;
    /// panics with the answer unless it is accepted.
    pub async fn register_region(&self, id: u64, region: &str) {
        let path = format!("/api/v1/regions/{region}");
        let weight = Some(json!({ "weight": 1.0 }));
        let (status, body) = self.send(id, reqwest::Method::PUT, &path, weight).await;
        assert!(
            (200..300).contains(&status),
            "PUT region {region}: {status} {body}"
        );
    }

    /// A lazily connected gRPC channel to node `id` (Raft and Coordinator).
    /// Over TLS it presents no certificate: see [`Cluster::channel_as`].
    pub fn channel(&self, id: u64) -> tonic::transport::Channel {
        match &self.pki {
            Some(pki) => pki.channel(&self.node(id).raft_addr, None),
            None => match tonic::transport::Endpoint::from_shared(self.node(id).grpc_url()) {
                Ok(endpoint) => endpoint.connect_lazy(),
                Err(e) => panic!("node {id}'s gRPC URL: {e}"),
            },
        }
    }

    /// A TLS channel to node `id` presenting the certificate `stem`
    /// (`node-2`, `region-mumbai`), issued first if it is a region's.
    pub fn channel_as(&self, id: u64, stem: &str) -> tonic::transport::Channel {
        let pki = self.pki.as_ref().expect("channel_as needs Options::tls");
        if let Some(region) = stem.strip_prefix("region-") {
            pki.issue_region(region);
        }
        pki.channel(&self.node(id).raft_addr, Some(stem))
    }

    /// Flags a limiter of `region` needs to reach this cluster: its
    /// certificate over TLS, else `--insecure`.
    pub fn limiter_flags(&self, region: &str) -> Vec<String> {
        match &self.pki {
            Some(pki) => pki.flags(&pki.issue_region(region)),
            None => vec!["--insecure".to_string()],
        }
    }

    /// PUT a one-file rule set for `domain`; (status, body).
    pub async fn put_rules(&self, id: u64, domain: &str) -> (u16, Value) {
        self.put_text(id, &rules_yaml(domain)).await
    }

    /// PUT `text` as the rule set's only file, `rules.yaml`; (status, body).
    pub async fn put_text(&self, id: u64, text: &str) -> (u16, Value) {
        self.send(
            id,
            reqwest::Method::PUT,
            "/api/v1/rules",
            Some(json!({ "files": { "rules.yaml": text } })),
        )
        .await
    }

    /// Waits until every running node names the same running leader, which
    /// itself reports being leader; returns its id.
    pub async fn wait_leader(&self, timeout: Duration) -> u64 {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(leader) = self.agreed_leader().await {
                return leader;
            }
            assert!(
                Instant::now() < deadline,
                "no agreed leader within {timeout:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn agreed_leader(&self) -> Option<u64> {
        let running = self.running();
        let mut leader = None;
        for id in &running {
            let (_, body) = self.get(*id, "/api/v1/cluster").await?;
            let l = body["leader"].as_u64()?;
            if leader.is_some_and(|x| x != l) {
                return None;
            }
            leader = Some(l);
        }
        let l = leader?;
        if !running.contains(&l) {
            return None;
        }
        let (_, body) = self.get(l, "/api/v1/cluster").await?;
        (body["state"] == "Leader").then_some(l)
    }

    /// Waits until node `id` has applied rule-set version `n` (local read).
    pub async fn wait_version(&self, id: u64, n: u64, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some((200, body)) = self.get(id, "/api/v1/rules").await
                && body["current"]["number"].as_u64() >= Some(n)
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "node {id} did not apply version {n} within {timeout:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Node `id`'s value of a Prometheus counter or gauge (0 when absent).
    pub async fn metric(&self, id: u64, name: &str) -> f64 {
        let url = format!("{}/metrics", self.node(id).url());
        let Ok(r) = self.http.get(url).send().await else {
            return 0.0;
        };
        let text = r.text().await.unwrap_or_default();
        text.lines()
            .filter(|l| l.starts_with(name))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }
}

/// A small valid rule file for `domain`.
pub fn rules_yaml(domain: &str) -> String {
    format!(
        "domain: {domain}\ndescriptors:\n  - key: user\n    rate_limit:\n      unit: minute\n      requests_per_unit: 100\n"
    )
}

/// p-th percentile (0–100) of durations, in milliseconds.
pub fn percentile_ms(samples: &[Duration], p: f64) -> f64 {
    let mut v: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1000.0).collect();
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * (v.len() - 1) as f64).round() as usize;
    v[rank.min(v.len() - 1)]
}
