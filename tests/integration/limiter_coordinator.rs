//! A limiter fed by a real coordinator cluster: new versions are enforced
//! within a second of commit, rollout stages are honoured, and the last rules
//! keep being enforced when every coordinator is gone — also across a limiter
//! restart, from the on-disk cache.

use crate::common;

use std::time::Duration;

use common::RedisServer;
use common::coordinator::{Cluster, Options};
use common::limiter::{
    LimiterProcess, probe_user as probe, user_rules as rules, wait_for_user_limit as wait_for_limit,
};
use serde_json::json;

/// Checks `n` times on one key; how many were admitted.
async fn admitted(limiter: &LimiterProcess, key: &str, n: usize) -> usize {
    let mut ok = 0;
    for _ in 0..n {
        ok += usize::from(
            probe(limiter, key)
                .await
                .is_some_and(|(_, allowed)| allowed),
        );
    }
    ok
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limiter_enforces_new_versions_within_a_second_and_outlives_the_coordinators() {
    let redis = RedisServer::start();
    let mut cluster = Cluster::start(3, Options::default()).await;
    let leader = cluster.wait_leader(Duration::from_secs(30)).await;
    let (status, body) = cluster.put_text(leader, &rules(2)).await;
    assert_eq!(status, 200, "{body}");

    let cache_dir = tempfile::tempdir().expect("temp dir");
    let cache = cache_dir.path().join("rules-cache.json");
    let coordinators: Vec<String> = cluster
        .running()
        .iter()
        .map(|&id| cluster.node(id).grpc_url())
        .collect();
    let mut args = vec![
        "--redis".to_string(),
        redis.url(),
        "--region".into(),
        "mumbai".into(),
    ];
    args.extend(["--rules-cache".into(), cache.display().to_string()]);
    for url in &coordinators {
        args.extend(["--coordinator".to_string(), url.clone()]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let limiter = LimiterProcess::start_without_rules(&args);
    wait_for_limit(&limiter, 2, Duration::from_secs(10)).await;
    assert_eq!(admitted(&limiter, "alice", 4).await, 2);

    // A new version is enforced within a second of its commit.
    let (status, body) = cluster.put_text(leader, &rules(7)).await;
    assert_eq!(status, 200, "{body}");
    let took = wait_for_limit(&limiter, 7, Duration::from_secs(1)).await;
    println!("new rule version enforced {took:?} after commit");

    for region in ["mumbai", "hyderabad"] {
        let path = format!("/api/v1/regions/{region}");
        let (status, body) = cluster
            .send(leader, reqwest::Method::PUT, &path, Some(json!({})))
            .await;
        assert_eq!(status, 200, "{body}");
    }
    // A canary for another region does not reach this one…
    let (status, body) = cluster
        .send(
            leader,
            reqwest::Method::PUT,
            "/api/v1/rules",
            Some(json!({"files": {"rules.yaml": rules(11)}, "stage": "canary", "canary_regions": ["hyderabad"]})),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(probe(&limiter, "canary-check").await.map(|p| p.0), Some(7));
    // …but the same version rolled out to mumbai does.
    let (status, body) = cluster
        .send(
            leader,
            reqwest::Method::POST,
            "/api/v1/rules/rollout",
            Some(json!({"stage": "canary", "canary_regions": ["hyderabad", "mumbai"]})),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    wait_for_limit(&limiter, 11, Duration::from_secs(2)).await;
    let (status, body) = cluster
        .send(
            leader,
            reqwest::Method::POST,
            "/api/v1/rules/rollout",
            Some(json!({"stage": "all"})),
        )
        .await;
    assert_eq!(status, 200, "{body}");

    // Every coordinator dies: the limiter keeps enforcing the last rules.
    for id in cluster.running() {
        cluster.kill(id);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(admitted(&limiter, "bob", 13).await, 11);

    // And a restarted limiter, with no coordinator to ask, enforces them from its cache.
    drop(limiter);
    let limiter = LimiterProcess::start_without_rules(&args);
    wait_for_limit(&limiter, 11, Duration::from_secs(5)).await;
    assert_eq!(admitted(&limiter, "carol", 13).await, 11);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limiter_pointed_at_an_empty_node_keeps_its_rules_and_its_cache() {
    let redis = RedisServer::start();
    let cache_dir = tempfile::tempdir().expect("temp dir");
    let cache = cache_dir.path().join("rules-cache.json");
    let start = |coordinators: &[String]| {
        let mut args = vec![
            "--redis".to_string(),
            redis.url(),
            "--region".into(),
            "mumbai".into(),
            "--rules-cache".into(),
            cache.display().to_string(),
        ];
        for url in coordinators {
            args.extend(["--coordinator".to_string(), url.clone()]);
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        LimiterProcess::start_without_rules(&args)
    };
    // Rules from the real cluster, cached.
    {
        let cluster = Cluster::start(1, Options::default()).await;
        let (status, body) = cluster.put_text(1, &rules(3)).await;
        assert_eq!(status, 200, "{body}");
        let limiter = start(&[cluster.node(1).grpc_url()]);
        wait_for_limit(&limiter, 3, Duration::from_secs(10)).await;
        // The cache is written just after the rules apply: wait for it
        // before the limiter is killed.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !cache.exists() && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let cached = std::fs::read(&cache).expect("the rules cache was written");

    // Then only an empty cluster answers: a node initialised with no rule set.
    let empty = Cluster::start(1, Options::default()).await;
    let limiter = start(&[empty.node(1).grpc_url()]);
    wait_for_limit(&limiter, 3, Duration::from_secs(10)).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        probe(&limiter, "after").await.map(|p| p.0),
        Some(3),
        "the limiter dropped its rules for an empty node's \"no version\""
    );
    assert_eq!(
        std::fs::read(&cache).expect("cache"),
        cached,
        "the empty node's state overwrote the rules cache"
    );

    // A node in no cluster at all serves no watch.
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("token"), common::coordinator::TOKEN).expect("token");
    let port = |l: std::net::TcpListener| l.local_addr().map(|a| a.port()).unwrap_or(0);
    let raft = port(std::net::TcpListener::bind("127.0.0.1:0").expect("port"));
    let http = port(std::net::TcpListener::bind("127.0.0.1:0").expect("port"));
    let mut lone = std::process::Command::new(common::meridian_bin())
        .arg("coordinator")
        .args(["--id", "9", "--raft-addr", &format!("127.0.0.1:{raft}")])
        .args(["--http-addr", &format!("127.0.0.1:{http}")])
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .arg("--admin-token-file")
        .arg(dir.path().join("token"))
        .arg("--insecure")
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawn a lone coordinator");
    let url = format!("http://127.0.0.1:{raft}");
    let mut answer = None;
    for _ in 0..100 {
        if let Ok(mut client) =
            meridian::proto::meridian::v1::coordinator_client::CoordinatorClient::connect(
                url.clone(),
            )
            .await
        {
            let request = meridian::proto::meridian::v1::WatchRequest {
                region: "mumbai".into(),
                pod: "p".into(),
            };
            answer = Some(
                client
                    .watch(request)
                    .await
                    .map(|_| ())
                    .map_err(|s| s.code()),
            );
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = lone.kill();
    let _ = lone.wait();
    assert_eq!(
        answer,
        Some(Err(tonic::Code::Unavailable)),
        "a node in no cluster served a watch"
    );
}
