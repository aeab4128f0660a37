//! Shared test harness: real `redis-server` processes on free ports, each in
//! its own temp dir, killed when the handle drops (also when a test panics).
//! Tests never touch a Redis they did not start.

pub mod coordinator;
pub mod global;
pub mod proxy;
pub mod sentinel;
pub mod tls;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::thread::sleep;
use std::time::{Duration, Instant};

use tempfile::TempDir;

const INSTALL_HINT: &str = "Meridian's tests start their own redis-server processes. \
     Install Redis (Debian/Ubuntu: `sudo apt-get install -y redis-server`, which also \
     brings redis-cli), or run the README's test command, which installs it.";

/// The `meridian` binary under test: `MERIDIAN_BIN` when set, else the one
/// cargo built for this run. Checkouts that share one target dir overwrite
/// each other's `target/debug/meridian` while tests run; MERIDIAN_BIN set to
/// this checkout's own `target/debug/deps/meridian-<hash>` keeps the test
/// on the code it was built from.
pub fn meridian_bin() -> std::path::PathBuf {
    std::env::var_os("MERIDIAN_BIN")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| env!("CARGO_BIN_EXE_meridian").into())
}

std::thread_local! {
    static LAST_PANIC: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
}

/// Keeps each thread's last panic message (then prints it as the default
/// hook does) so a harness that dumps logs while unwinding can say the
/// failure again below them: CI keeps only the head and tail of a failed
/// run's output, and a cluster's log tails pushed the message out of both.
pub fn remember_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let place = info
                .location()
                .map(|l| format!("{}:{}", l.file(), l.line()))
                .unwrap_or_default();
            let message = info
                .payload()
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| info.payload().downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            LAST_PANIC.with(|p| *p.borrow_mut() = Some(format!("{place}: {message}")));
            default(info);
        }));
    });
}

/// This thread's last panic message, as [`remember_panics`] kept it.
pub fn last_panic() -> Option<String> {
    LAST_PANIC.with(|p| p.borrow().clone())
}

/// An HTTP client builder. reqwest is built with rustls but no crypto
/// provider of its own (the binary installs ring at start); tests do the same.
pub fn http_client() -> reqwest::ClientBuilder {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
}

/// `reqwest::get` through [`http_client`].
pub async fn http_get(url: impl reqwest::IntoUrl) -> reqwest::Result<reqwest::Response> {
    http_client().build()?.get(url).send().await
}

/// Fails (never skips) when redis-server is missing, saying how to install it.
pub fn require_redis() {
    require("redis-server");
}

fn require(binary: &str) {
    let probe = if binary == "openssl" {
        "version"
    } else {
        "--version"
    };
    let hint = if binary == "openssl" {
        "The TLS tests make their certificates with it: `sudo apt-get install -y openssl`, \
         or run the README's test command, which installs it."
    } else {
        INSTALL_HINT
    };
    let found = Command::new(binary)
        .arg(probe)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(found, "`{binary}` not found on PATH. {hint}");
}

/// Ports are handed out in turn from 10000–22767, starting at an offset
/// per test process, and checked free. The range stays below the kernel's
/// ephemeral ports (32768 and up, here and on most Linux machines) even for
/// a Cluster node's bus (port + 10000): a port the kernel picks for an
/// outgoing connection or a `:0` listener elsewhere in the suite can then
/// never be the one a server here is about to bind.
fn free_port() -> u16 {
    const FIRST: u32 = 10_000;
    const SPAN: u32 = 12_768;
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let offset = std::process::id() % 127 * 100;
    loop {
        let port = FIRST + (offset + NEXT.fetch_add(1, Ordering::Relaxed)) % SPAN;
        let port = u16::try_from(port).expect("ports stay below 22768");
        let free = |p: u16| TcpListener::bind(("127.0.0.1", p)).is_ok();
        if free(port) && free(port + 10_000) {
            return port;
        }
    }
}

/// The eviction settings the deploy files ship, as `redis-server` flags: every
/// directive of `deploy/k8s/base/region/redis.conf` but the size
/// (`maxmemory`, which a test picks small), persistence (`save`,
/// `appendonly`, which [`RedisServer`] sets) and the password `include`. Tests
/// of a full Redis run with these, so they follow the shipped config.
pub fn shipped_redis_policy() -> Vec<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/k8s/base/region/redis.conf");
    let text =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    let flags: Vec<String> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter_map(|l| l.split_once(char::is_whitespace))
        .filter(|(name, _)| !["maxmemory", "save", "appendonly", "include"].contains(name))
        .flat_map(|(name, value)| [format!("--{name}"), value.trim().to_string()])
        .collect();
    assert!(
        flags.iter().any(|f| f == "--maxmemory-policy"),
        "{} sets no maxmemory-policy: {flags:?}",
        path.display()
    );
    flags
}

/// One `redis-server` process.
pub struct RedisServer {
    child: Child,
    port: u16,
    dir: TempDir,
}

impl RedisServer {
    pub fn start() -> RedisServer {
        RedisServer::start_with(&[])
    }

    /// Starts a server with extra `redis-server` arguments; retries on another
    /// port if the chosen one was taken meanwhile.
    pub fn start_with(extra: &[&str]) -> RedisServer {
        require("redis-server");
        for _ in 0..5 {
            let dir = tempfile::tempdir().expect("temp dir for redis-server");
            let port = free_port();
            let child = Command::new("redis-server")
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
                .arg("--dir")
                .arg(dir.path())
                .arg("--logfile")
                .arg(dir.path().join("redis.log"))
                .args(extra)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("spawn redis-server");
            let mut server = RedisServer { child, port, dir };
            if server.wait_ready(Duration::from_secs(10)) {
                return server;
            }
        }
        panic!("redis-server did not start on 5 different ports");
    }

    fn wait_ready(&mut self, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return false; // exited: port taken, most likely
            }
            if ping(self.port) {
                return true;
            }
            sleep(Duration::from_millis(20));
        }
        false
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// A plain synchronous connection for inspecting state from a test.
    pub fn connection(&self) -> redis::Connection {
        redis::Client::open(self.url())
            .and_then(|c| c.get_connection())
            .expect("connect to test redis")
    }

    /// Freezes the process (SIGSTOP): connections stay open, nothing answers.
    pub fn pause(&self) {
        signal(self.child.id(), "-STOP");
    }

    pub fn resume(&self) {
        signal(self.child.id(), "-CONT");
    }

    /// Starts a fresh server on the port this one used (after `kill`), so clients
    /// configured with the old address find Redis again.
    pub fn restart(&mut self) {
        self.kill();
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .arg("--dir")
            .arg(self.dir.path())
            .arg("--logfile")
            .arg(self.dir.path().join("redis.log"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("respawn redis-server");
        self.child = child;
        assert!(
            self.wait_ready(Duration::from_secs(10)),
            "redis-server did not restart"
        );
    }

    /// kill -9, as a crash would.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.resume(); // a stopped process ignores nothing but SIGKILL; be tidy anyway
        self.kill();
    }
}

fn signal(pid: u32, sig: &str) {
    let _ = Command::new("kill").args([sig, &pid.to_string()]).status();
}

/// A CA and a server certificate for 127.0.0.1/localhost, made with openssl
/// in `dir`: returns (ca.pem, server.pem, server.key).
pub fn make_tls_certs(dir: &Path) -> (std::path::PathBuf, std::path::PathBuf, std::path::PathBuf) {
    require("openssl");
    let run = |args: &[&str]| {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .expect("run openssl");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    run(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "2",
        "-subj",
        "/CN=meridian-test-ca",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
    ]);
    run(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        "/CN=localhost",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
    ]);
    std::fs::write(
        dir.join("san.ext"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n",
    )
    .expect("san");
    run(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        "san.ext",
        "-out",
        "server.pem",
    ]);
    (
        dir.join("ca.pem"),
        dir.join("server.pem"),
        dir.join("server.key"),
    )
}

/// Sends PING over a raw socket, so readiness does not depend on any client.
fn ping(port: u16) -> bool {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
    let mut buf = [0u8; 64];
    // A server with requirepass answers -NOAUTH: up, just locked.
    s.write_all(b"PING\r\n").is_ok()
        && s.read(&mut buf)
            .is_ok_and(|n| buf[..n].starts_with(b"+PONG") || buf[..n].starts_with(b"-NOAUTH"))
}

/// A real Redis Cluster of three masters, slots split evenly; with
/// [`RedisCluster::start_with_replicas`], each master has a replica.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    pub fn start() -> RedisCluster {
        RedisCluster::start_nodes(0, "5000")
    }

    /// Three masters and three replicas, a node failed after 500 ms without
    /// an answer, so a killed master's replica takes over within seconds.
    /// Replicas may take over however stale they are (validity factor 0):
    /// a test measures what a failover loses, it does not avoid it.
    pub fn start_with_replicas() -> RedisCluster {
        RedisCluster::start_nodes(1, "500")
    }

    fn start_nodes(replicas: usize, node_timeout_ms: &str) -> RedisCluster {
        require("redis-cli");
        let nodes: Vec<RedisServer> = (0..3 * (1 + replicas))
            .map(|_| {
                RedisServer::start_with(&[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    node_timeout_ms,
                    "--cluster-replica-validity-factor",
                    "0",
                ])
            })
            .collect();
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        let out = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .output()
            .expect("run redis-cli --cluster create");
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let cluster = RedisCluster { nodes };
        cluster.wait_ok(Duration::from_secs(20));
        if replicas > 0 {
            cluster.wait_replicas_synced(Duration::from_secs(20));
        }
        cluster
    }

    /// Indices of the nodes that answer as masters now (a killed node does not).
    pub fn masters(&self) -> Vec<usize> {
        (0..self.nodes.len())
            .filter(|&i| self.replication_info(i).contains("role:master"))
            .collect()
    }

    /// `INFO replication` of node `index`, empty when it does not answer.
    pub fn replication_info(&self, index: usize) -> String {
        redis::Client::open(self.nodes[index].url())
            .and_then(|c| c.get_connection_with_timeout(Duration::from_millis(500)))
            .and_then(|mut c| redis::cmd("INFO").arg("replication").query(&mut c))
            .unwrap_or_default()
    }

    /// Waits until every master has a replica whose link is up.
    fn wait_replicas_synced(&self, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let synced = self.masters().iter().all(|&i| {
                let info = self.replication_info(i);
                info.contains("connected_slaves:1") && info.contains("state=online")
            });
            if synced {
                return;
            }
            assert!(Instant::now() < deadline, "replicas did not sync");
            sleep(Duration::from_millis(100));
        }
    }

    /// Waits until every node reports the cluster healthy and agrees on all slots.
    fn wait_ok(&self, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let ok = self.nodes.iter().all(|n| {
                let info: String = redis::cmd("CLUSTER")
                    .arg("INFO")
                    .query(&mut n.connection())
                    .unwrap_or_default();
                info.contains("cluster_state:ok") && info.contains("cluster_slots_ok:16384")
            });
            if ok {
                return;
            }
            assert!(Instant::now() < deadline, "cluster did not become ready");
            sleep(Duration::from_millis(100));
        }
    }

    /// The `redis+cluster://` URL Meridian accepts for a Cluster.
    pub fn url(&self) -> String {
        let nodes: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        format!("redis+cluster://{}", nodes.join(","))
    }

    /// Number of keys each master holds.
    pub fn keys_per_node(&self) -> Vec<usize> {
        self.nodes
            .iter()
            .map(|n| {
                redis::cmd("DBSIZE")
                    .query(&mut n.connection())
                    .expect("DBSIZE")
            })
            .collect()
    }
}

pub mod limiter;

/// Waits, if need be, until at least `room` is left before the next boundary
/// of a wall-clock window of `period`, so a test that counts hits in one
/// fixed window never sees its counter reset half way (CI machines can be
/// slow enough for a few requests to straddle a minute boundary).
pub async fn clear_of_window_boundary(period: Duration, room: Duration) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970");
    let into = Duration::from_nanos((now.as_nanos() % period.as_nanos()) as u64);
    let left = period - into;
    if left < room {
        // A little past the boundary: Redis reads the same clock, but not at
        // the same instant.
        tokio::time::sleep(left + Duration::from_millis(50)).await;
    }
}

/// About 100 KB of nesting as an attacker or a broken generator writes it:
/// block lists (`- - - …`), flow lists (`[[[…`) and flow maps (`{a: {a: …`),
/// each named for failure messages.
pub fn deeply_nested_rules() -> Vec<(&'static str, String)> {
    vec![
        (
            "block",
            format!("domain: api\ndescriptors:\n{}x\n", "- ".repeat(50_000)),
        ),
        (
            "flow list",
            format!("domain: api\ndescriptors: {}\n", "[".repeat(100_000)),
        ),
        (
            "flow map",
            format!("domain: api\ndescriptors: {}\n", "{a: ".repeat(25_000)),
        ),
    ]
}
