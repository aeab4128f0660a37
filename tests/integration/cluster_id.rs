//! The cluster id: set once by a cluster's first leader, the same on every
//! node, kept across leader changes, restarts and snapshots, and set in a
//! data dir written by the version-1 build; a limiter takes rules from one
//! cluster only — the first it followed, or its `--cluster-id` — and keeps
//! its rules and cache when pointed at another cluster, whatever its
//! version numbers.

use crate::common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::RedisServer;
use common::coordinator::{Cluster, Options};
use common::limiter::{
    LimiterProcess, probe_user, user_rules as rules, wait_for_user_limit as wait_for_limit,
};

const REFUSED: &str = "meridian_rule_updates_refused_total";

/// The limit the limiter enforces for `user=<key>`; `None` when no rule
/// matched (or the limiter did not answer).
async fn limit(limiter: &LimiterProcess, key: &str) -> Option<u32> {
    probe_user(limiter, key).await.map(|p| p.0)
}

/// The limiter's count of refused rule updates.
async fn refused(limiter: &LimiterProcess) -> f64 {
    let client = common::http_client().build().expect("HTTP client");
    let Ok(r) = client.get(limiter.http_url("/metrics")).send().await else {
        return 0.0;
    };
    let text = r.text().await.unwrap_or_default();
    text.lines()
        .filter(|l| l.starts_with(REFUSED))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

async fn wait_refused(limiter: &LimiterProcess, within: Duration) {
    let deadline = Instant::now() + within;
    while refused(limiter).await < 1.0 {
        assert!(
            Instant::now() < deadline,
            "no refused rule update counted within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The rules cache's bytes once it is written (just after the rules it
/// holds are applied).
async fn wait_cached(cache: &Path) -> Vec<u8> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if let Ok(bytes) = std::fs::read(cache) {
            return bytes;
        }
        assert!(Instant::now() < deadline, "the rules cache was not written");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Node `id`'s cluster id, once it has one.
async fn cluster_id(cluster: &Cluster, id: u64, within: Duration) -> String {
    let deadline = Instant::now() + within;
    loop {
        if let Some((200, body)) = cluster.get(id, "/api/v1/cluster").await
            && let Some(cid) = body["cluster_id"].as_str()
        {
            return cid.to_string();
        }
        assert!(
            Instant::now() < deadline,
            "node {id} has no cluster id within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A limiter of region mumbai with `--rules-cache cache`, `extra` flags and
/// these coordinators.
fn limiter_args(
    redis: &RedisServer,
    cache: &Path,
    coordinators: &[&str],
    extra: &[&str],
) -> Vec<String> {
    let mut args = vec![
        "--redis".to_string(),
        redis.url(),
        "--region".into(),
        "mumbai".into(),
        "--rules-cache".into(),
        cache.display().to_string(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    for url in coordinators {
        args.extend(["--coordinator".to_string(), url.to_string()]);
    }
    args
}

fn start(args: &[String]) -> LimiterProcess {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    LimiterProcess::start_without_rules(&args)
}

fn start_logging(args: &[String]) -> LimiterProcess {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    LimiterProcess::start_without_rules_logging(&args)
}

async fn put(cluster: &Cluster, text: &str) {
    let (status, body) = cluster.put_text(1, text).await;
    assert_eq!(status, 200, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limiter_of_cluster_a_pointed_at_cluster_b_keeps_a_rules_and_cache() {
    let redis = RedisServer::start();
    let cache_dir = tempfile::tempdir().expect("temp dir");
    let cache = cache_dir.path().join("rules-cache.json");
    let a = Cluster::start(1, Options::default()).await;
    put(&a, &rules(3)).await;
    // Cluster B (staging, say) is further along: higher versions, a later
    // log index, so only the cluster id tells its rules from A's.
    let b = Cluster::start(1, Options::default()).await;
    for limit in [50, 60, 70] {
        put(&b, &rules(limit)).await;
    }
    let (a_url, b_url) = (a.node(1).grpc_url(), b.node(1).grpc_url());

    let limiter = start(&limiter_args(&redis, &cache, &[a_url.as_str()], &[]));
    wait_for_limit(&limiter, 3, Duration::from_secs(10)).await;
    let cached = wait_cached(&cache).await;
    drop(limiter);

    // Restarted pointed at B only.
    let mut limiter = start_logging(&limiter_args(&redis, &cache, &[b_url.as_str()], &[]));
    wait_for_limit(&limiter, 3, Duration::from_secs(5)).await;
    // Until B's first update was refused, or taken.
    let deadline = Instant::now() + Duration::from_secs(10);
    while refused(&limiter).await < 1.0
        && limit(&limiter, "during").await == Some(3)
        && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        limit(&limiter, "after-b").await,
        Some(3),
        "the limiter took the rules of another cluster"
    );
    assert!(
        refused(&limiter).await >= 1.0,
        "the refusal was not counted"
    );
    assert_eq!(
        std::fs::read(&cache).expect("cache"),
        cached,
        "the other cluster's state overwrote the rules cache"
    );
    let (_, logs) = limiter.terminate_reading_logs();
    let (a_id, b_id) = (
        cluster_id(&a, 1, Duration::from_secs(1)).await,
        cluster_id(&b, 1, Duration::from_secs(1)).await,
    );
    assert_ne!(a_id, b_id);
    assert!(
        logs.lines()
            .any(|l| l.contains("ERROR") && l.contains(&a_id) && l.contains(&b_id)),
        "no error naming both cluster ids:\n{logs}"
    );

    // With B first and A second, it refuses B and follows A.
    let limiter = start(&limiter_args(
        &redis,
        &cache,
        &[b_url.as_str(), a_url.as_str()],
        &[],
    ));
    wait_refused(&limiter, Duration::from_secs(10)).await;
    put(&a, &rules(4)).await;
    wait_for_limit(&limiter, 4, Duration::from_secs(10)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limiter_given_another_clusters_id_applies_nothing_from_the_start() {
    let redis = RedisServer::start();
    let cache_dir = tempfile::tempdir().expect("temp dir");
    let cache = cache_dir.path().join("rules-cache.json");
    let a = Cluster::start(1, Options::default()).await;
    put(&a, &rules(3)).await;
    let a_url = a.node(1).grpc_url();
    let other = format!("{:032x}", rand::random::<u128>());

    let limiter = start(&limiter_args(
        &redis,
        &cache,
        &[a_url.as_str()],
        &["--cluster-id", &other],
    ));
    wait_refused(&limiter, Duration::from_secs(10)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        limit(&limiter, "pinned-elsewhere").await,
        None,
        "rules of another cluster than --cluster-id were applied"
    );
    assert!(!cache.exists(), "a refused update wrote the rules cache");
    drop(limiter);

    // With A's own id it follows A, and the cache records the id.
    let a_id = cluster_id(&a, 1, Duration::from_secs(1)).await;
    let limiter = start(&limiter_args(
        &redis,
        &cache,
        &[a_url.as_str()],
        &["--cluster-id", &a_id],
    ));
    wait_for_limit(&limiter, 3, Duration::from_secs(10)).await;
    let cached: serde_json::Value =
        serde_json::from_slice(&wait_cached(&cache).await).expect("cache is JSON");
    drop(limiter);
    assert_eq!(cached["cluster_id"], a_id.as_str());

    // A cache of cluster A and a --cluster-id of another: refused at start.
    let args = limiter_args(&redis, &cache, &[a_url.as_str()], &["--cluster-id", &other]);
    let out = std::process::Command::new(common::meridian_bin())
        .arg("limiter")
        .args(["--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"])
        .arg("--insecure")
        .args(&args)
        .output()
        .expect("run the limiter");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "it started: {stderr}");
    assert!(
        stderr.contains(&a_id) && stderr.contains(&other),
        "the error names both ids: {stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cluster_id_is_one_on_every_node_through_leader_changes_restarts_and_snapshots() {
    let options = Options {
        snapshot_logs: 10,
        snapshot_keep_logs: 0,
        ..Options::default()
    };
    let mut cluster = Cluster::start(3, options).await;
    let within = Duration::from_secs(10);
    let id = cluster_id(&cluster, 1, within).await;
    for node in [2, 3] {
        assert_eq!(cluster_id(&cluster, node, within).await, id, "node {node}");
    }

    let leader = cluster.wait_leader(within).await;
    cluster.kill(leader);
    let next = cluster.wait_leader(Duration::from_secs(20)).await;
    assert_ne!(next, leader);
    for node in cluster.running() {
        assert_eq!(cluster_id(&cluster, node, within).await, id, "node {node}");
    }
    // Enough writes for a snapshot and a compacted log.
    for i in 0..12 {
        let (status, body) = cluster.put_text(next, &rules(100 + i)).await;
        assert_eq!(status, 200, "{body}");
    }
    cluster.restart(leader);

    for node in cluster.running() {
        cluster.kill(node);
    }
    for node in [1, 2, 3] {
        cluster.restart(node);
    }
    cluster.wait_leader(Duration::from_secs(20)).await;
    for node in [1, 2, 3] {
        assert_eq!(
            cluster_id(&cluster, node, within).await,
            id,
            "node {node} after a restart"
        );
    }

    // A new node learns it from a snapshot: the log before it is purged.
    let leader = cluster.wait_leader(within).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut i = 0;
    loop {
        let (_, status) = cluster
            .get(leader, "/api/v1/cluster")
            .await
            .expect("leader answers");
        if status["purged_index"].as_u64().unwrap_or(0) > 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the leader did not compact its log: {status}"
        );
        i += 1;
        let (status, body) = cluster.put_text(leader, &rules(200 + i)).await;
        assert_eq!(status, 200, "{body}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    cluster.join(4, leader);
    assert_eq!(
        cluster_id(&cluster, 4, Duration::from_secs(20)).await,
        id,
        "node 4"
    );
    let installed = cluster
        .metric(4, "meridian_coordinator_snapshots_installed_total")
        .await;
    assert!(installed >= 1.0, "node 4 caught up without a snapshot");
}

/// `tests/fixtures/raft/coordinator-v1.redb`: the data dir of a one-node
/// cluster (node 1, listed at 127.0.0.1:39701 / :39702), written by the
/// last build in storage format 1 (commit 9df8d5c), holding rule-set
/// version 1 (`domain: api`, user 5 per hour) and region mumbai, stopped
/// with SIGTERM.
const DATA_DIR_V1: &[u8] = include_bytes!("../fixtures/raft/coordinator-v1.redb");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_dir_of_format_1_is_migrated_and_its_leader_sets_a_cluster_id() {
    let dir = tempfile::tempdir().expect("temp dir");
    let data = dir.path().join("data");
    std::fs::create_dir(&data).expect("data dir");
    std::fs::write(data.join("coordinator.redb"), DATA_DIR_V1).expect("copy the fixture");
    std::fs::write(dir.path().join("token"), common::coordinator::TOKEN).expect("token");
    let free = || {
        std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free port")
    };
    let http = format!("127.0.0.1:{}", free());
    let spawn = || {
        std::process::Command::new(common::meridian_bin())
            .arg("coordinator")
            .args(["--id", "1", "--raft-addr", &format!("127.0.0.1:{}", free())])
            .args(["--http-addr", &http])
            .args(["--heartbeat-ms", "100", "--election-timeout-ms", "500"])
            .arg("--insecure")
            .arg("--data-dir")
            .arg(&data)
            .arg("--admin-token-file")
            .arg(dir.path().join("token"))
            .stderr(std::process::Stdio::null())
            .spawn()
            .map(Killed)
            .expect("spawn the coordinator")
    };
    let client = common::http_client().build().expect("HTTP client");
    let get = |path: &str| {
        let request = client
            .get(format!("http://{http}{path}"))
            .bearer_auth(common::coordinator::TOKEN);
        async move {
            let r = request.send().await.ok()?;
            r.json::<serde_json::Value>().await.ok()
        }
    };
    let wait_id = || async {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(body) = get("/api/v1/cluster").await
                && let Some(id) = body["cluster_id"].as_str()
            {
                return id.to_string();
            }
            assert!(Instant::now() < deadline, "no cluster id was set");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };

    let node = spawn();
    let id = wait_id().await;
    let rules = get("/api/v1/rules").await.expect("rules");
    assert_eq!(rules["current"]["number"], 1, "{rules}");
    let regions = get("/api/v1/regions").await.expect("regions");
    assert!(regions.to_string().contains("mumbai"), "{regions}");
    drop(node);
    // Migrated to this build's format (4 since overrides and resets).
    assert_eq!(format_version(&data.join("coordinator.redb")), 4);

    let _node = spawn();
    assert_eq!(wait_id().await, id, "the id changed across a restart");
}

/// A child process killed when dropped, also when the test panics.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The storage format a data dir records (`raft_meta.format_version`).
fn format_version(db: &Path) -> u32 {
    use redb::ReadableDatabase;
    let meta: redb::TableDefinition<&str, &[u8]> = redb::TableDefinition::new("raft_meta");
    let db = redb::Database::open(db).expect("open the data dir");
    let txn = db.begin_read().expect("read");
    let table = txn.open_table(meta).expect("raft_meta");
    let value = table.get("format_version").expect("get").expect("recorded");
    let bytes: [u8; 4] = value.value().try_into().expect("4 bytes");
    u32::from_le_bytes(bytes)
}
