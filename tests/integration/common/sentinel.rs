//! A real Redis Sentinel deployment: a master, one replica and three
//! sentinels (`redis-server --sentinel`, which is what Debian's
//! `redis-sentinel` runs), all with a password, timed for tests (a master is
//! down after 500 ms; a failover whose election split is retried after
//! 2 × failover-timeout, 3 s).

use std::process::{Child, Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use tempfile::TempDir;

use super::{RedisServer, free_port, ping, require};

/// The name the sentinels monitor the master under.
pub const MASTER_NAME: &str = "meridian";
/// The password of every node, sentinels included.
pub const PASSWORD: &str = "sentinel-test-pass";

pub struct RedisSentinels {
    /// `[master, replica]` as started; after a failover the roles swap.
    pub data: Vec<RedisServer>,
    sentinels: Vec<Sentinel>,
}

struct Sentinel {
    child: Child,
    port: u16,
    _dir: TempDir,
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl RedisSentinels {
    pub fn start() -> RedisSentinels {
        require("redis-server");
        let auth = ["--requirepass", PASSWORD, "--masterauth", PASSWORD];
        let master = RedisServer::start_with(&auth);
        let replicaof = format!("127.0.0.1 {}", master.port());
        let mut replica_args = auth.to_vec();
        replica_args.extend(["--replicaof", &replicaof]);
        let replica = RedisServer::start_with(&replica_args);
        wait_until(Duration::from_secs(10), "the replica to sync", || {
            info(master.port(), "replication").contains("connected_slaves:1")
        });
        let sentinels: Vec<Sentinel> = (0..3).map(|_| start_sentinel(master.port())).collect();
        let set = RedisSentinels {
            data: vec![master, replica],
            sentinels,
        };
        // A failover needs a majority of sentinels that know each other and
        // the replica (they meet through the master's hello channel).
        wait_until(Duration::from_secs(15), "the sentinels to meet", || {
            set.sentinels.iter().all(|s| {
                let master = sentinel_query(s.port, &["SENTINEL", "MASTER", MASTER_NAME]);
                field(&master, "num-other-sentinels") == Some("2")
                    && field(&master, "num-slaves") == Some("1")
            })
        });
        set
    }

    /// `redis+sentinel://` URL naming every sentinel and the master (no
    /// password: the limiter takes it from a file).
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .sentinels
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port))
            .collect();
        format!("redis+sentinel://{}/{MASTER_NAME}", hosts.join(","))
    }

    /// The master's port as the first sentinel reports it.
    pub fn master_port(&self) -> Option<u16> {
        let addr = sentinel_query(
            self.sentinels[0].port,
            &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER_NAME],
        );
        addr.get(1)?.parse().ok()
    }

    /// Waits until every sentinel names `port` as the master.
    pub fn wait_for_master(&self, port: u16, within: Duration) {
        wait_until(within, "the sentinels to promote the replica", || {
            self.sentinels.iter().all(|s| {
                let addr = sentinel_query(
                    s.port,
                    &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER_NAME],
                );
                addr.get(1).map(String::as_str) == Some(&port.to_string())
            })
        });
    }

    /// An authenticated connection to data node `index`.
    pub fn connection(&self, index: usize) -> redis::Connection {
        redis::Client::open(format!(
            "redis://:{PASSWORD}@127.0.0.1:{}",
            self.data[index].port()
        ))
        .and_then(|c| c.get_connection())
        .expect("connect to a sentinel-managed redis")
    }
}

fn start_sentinel(master_port: u16) -> Sentinel {
    for _ in 0..5 {
        let dir = tempfile::tempdir().expect("temp dir for a sentinel");
        let port = free_port();
        let config = dir.path().join("sentinel.conf");
        // Sentinel rewrites its config file, so it must be a writable file.
        std::fs::write(
            &config,
            format!(
                "port {port}\nbind 127.0.0.1\ndaemonize no\n\
                 dir {dir}\nlogfile {dir}/sentinel.log\n\
                 requirepass {PASSWORD}\nsentinel sentinel-pass {PASSWORD}\n\
                 sentinel monitor {MASTER_NAME} 127.0.0.1 {master_port} 2\n\
                 sentinel auth-pass {MASTER_NAME} {PASSWORD}\n\
                 sentinel down-after-milliseconds {MASTER_NAME} 500\n\
                 sentinel failover-timeout {MASTER_NAME} 1500\n",
                dir = dir.path().display()
            ),
        )
        .expect("write sentinel.conf");
        let child = Command::new("redis-server")
            .arg(&config)
            .arg("--sentinel")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn redis-server --sentinel");
        let mut sentinel = Sentinel {
            child,
            port,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = sentinel.child.try_wait() {
                break; // port taken meanwhile: try another
            }
            if ping(port) {
                return sentinel;
            }
            sleep(Duration::from_millis(20));
        }
        let _ = sentinel.child.kill();
    }
    panic!("redis-server --sentinel did not start on 5 different ports");
}

/// A sentinel command's reply as strings (flattened), empty on any error.
fn sentinel_query(port: u16, args: &[&str]) -> Vec<String> {
    let Ok(mut c) = redis::Client::open(format!("redis://:{PASSWORD}@127.0.0.1:{port}"))
        .and_then(|c| c.get_connection())
    else {
        return Vec::new();
    };
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    let value: redis::Value = cmd.query(&mut c).unwrap_or(redis::Value::Nil);
    flatten(value)
}

fn flatten(value: redis::Value) -> Vec<String> {
    match value {
        redis::Value::Array(items) => items.into_iter().flat_map(flatten).collect(),
        redis::Value::Map(pairs) => pairs
            .into_iter()
            .flat_map(|(k, v)| flatten(k).into_iter().chain(flatten(v)))
            .collect(),
        redis::Value::BulkString(b) => vec![String::from_utf8_lossy(&b).into_owned()],
        redis::Value::SimpleString(s) => vec![s],
        redis::Value::Int(i) => vec![i.to_string()],
        _ => Vec::new(),
    }
}

/// The value after `name` in a flattened field/value reply.
fn field<'a>(reply: &'a [String], name: &str) -> Option<&'a str> {
    let at = reply.iter().position(|f| f == name)?;
    reply.get(at + 1).map(String::as_str)
}

/// `INFO section` of an authenticated node, empty on any error.
fn info(port: u16, section: &str) -> String {
    redis::Client::open(format!("redis://:{PASSWORD}@127.0.0.1:{port}"))
        .and_then(|c| c.get_connection())
        .and_then(|mut c| redis::cmd("INFO").arg(section).query(&mut c))
        .unwrap_or_default()
}

fn wait_until(within: Duration, what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !done() {
        assert!(
            Instant::now() < deadline,
            "timed out after {within:?} waiting for {what}"
        );
        sleep(Duration::from_millis(50));
    }
}
