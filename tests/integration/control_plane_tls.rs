//! The control plane over mutual TLS, attacked as the audit did: Raft RPCs
//! and reports from callers without a certificate, with a certificate of
//! the wrong kind (a region's on the Raft service), with another node's,
//! and a limiter with mumbai's certificate reporting and watching for
//! hyderabad. Each is refused, and afterwards the cluster's rules,
//! allocations and health are what they were. Then certificates are
//! rotated in place on every node and limiter without losing the leader.

use crate::common;

use std::time::{Duration, Instant};

use meridian::proto::meridian::v1 as pb;
use meridian::proto::meridian::v1::RaftPayload;
use meridian::proto::meridian::v1::coordinator_client::CoordinatorClient;
use meridian::proto::meridian::v1::raft_client::RaftClient;
use openraft::{LogId, Vote};
use serde_json::Value;

use common::coordinator::{Cluster, Options};
use common::global::fixed_window_rule;
use common::limiter::{LimiterProcess, user_rules, wait_for_user_limit};

fn bin<T: serde::Serialize>(value: &T) -> Vec<u8> {
    match bincode::serialize(value) {
        Ok(bytes) => bytes,
        Err(e) => panic!("bincode: {e}"),
    }
}

/// What must not change: (rules version, health, split of `api|fw`).
async fn state(cluster: &Cluster, id: u64) -> (u64, u16, Value) {
    let rules = cluster.get(id, "/api/v1/rules").await.unwrap_or_default().1;
    let health = cluster.get(id, "/healthz").await.map_or(0, |(s, _)| s);
    let allocations = cluster
        .get(id, "/api/v1/allocations?rule=api|fw")
        .await
        .unwrap_or_default()
        .1;
    let granted = |r: &str| allocations["split"][r]["granted"].clone();
    (
        rules["current"]["number"].as_u64().unwrap_or(0),
        health,
        serde_json::json!([granted("mumbai"), granted("hyderabad")]),
    )
}

fn code<T>(r: &Result<tonic::Response<T>, tonic::Status>) -> tonic::Code {
    match r {
        Ok(_) => tonic::Code::Ok,
        Err(s) => s.code(),
    }
}

fn report(region: &str) -> pb::DemandReport {
    pb::DemandReport {
        region: region.to_string(),
        pod: "p-0".into(),
        interval_ms: 1_000,
        rules: vec![pb::RuleDemand {
            rule: "api|fw".into(),
            keys: vec![pb::KeyDemand {
                key: "victim".into(),
                asked: 1_000_000,
                allowed: 0,
            }],
            ..Default::default()
        }],
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_rpcs_are_refused_by_certificate_and_the_cluster_is_unchanged() {
    let cluster = Cluster::start(
        3,
        Options {
            tls: true,
            extra_args: vec!["--rebalance-interval".into(), "1s".into()],
            ..Options::default()
        },
    )
    .await;
    let leader = cluster.wait_leader(Duration::from_secs(20)).await;
    cluster.register_region(leader, "mumbai").await;
    cluster.register_region(leader, "hyderabad").await;
    let (status, body) = cluster.put_text(leader, &fixed_window_rule(1_000)).await;
    assert_eq!(status, 200, "{body}");
    let target = (1..=3).find(|id| *id != leader).unwrap_or(1);
    cluster
        .wait_version(target, 1, Duration::from_secs(10))
        .await;
    // Both regions heard from, each with its own certificate, so both hold
    // their share and "unchanged" compares real shares.
    for region in ["mumbai", "hyderabad"] {
        let mut own = report(region);
        own.rules.clear();
        let mut client =
            CoordinatorClient::new(cluster.channel_as(target, &format!("region-{region}")));
        let taken = client.report(own).await;
        assert_eq!(
            code(&taken),
            tonic::Code::Ok,
            "{region}'s own report: {taken:?}"
        );
    }
    let deadline = Instant::now() + Duration::from_secs(15);
    let before = loop {
        let s = state(&cluster, target).await;
        let held = |i: usize| s.2[i].as_u64().unwrap_or(0);
        if held(0) > 0 && held(1) > 0 {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "no split for both regions: {s:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(before.0, 1, "rules version before the attack");
    assert_eq!(before.1, 200, "target unhealthy before the attack");
    let term = cluster
        .get(target, "/api/v1/cluster")
        .await
        .unwrap_or_default()
        .1["term"]
        .as_u64()
        .unwrap_or(0);
    let payload = |data: Vec<u8>| tonic::Request::new(RaftPayload { data });
    let forged_append = bin(&(
        Vote::new_committed(term + 100, leader),
        None::<LogId<u64>>,
        Vec::<()>::new(),
        None::<LogId<u64>>,
    ));

    // No certificate: the handshake fails, no RPC reaches a service.
    let mut anonymous = RaftClient::new(cluster.channel(target));
    let refused = anonymous
        .append_entries(payload(forged_append.clone()))
        .await;
    assert_ne!(
        code(&refused),
        tonic::Code::Ok,
        "AppendEntries without a certificate was taken: {refused:?}"
    );
    let refused = CoordinatorClient::new(cluster.channel(target))
        .report(report("hyderabad"))
        .await;
    assert_ne!(
        code(&refused),
        tonic::Code::Ok,
        "a report without a certificate was taken"
    );
    let refused = CoordinatorClient::new(cluster.channel(target))
        .watch(pb::WatchRequest {
            region: "hyderabad".into(),
            pod: "p-0".into(),
        })
        .await;
    assert_ne!(
        code(&refused),
        tonic::Code::Ok,
        "a watch without a certificate was served"
    );
    // Plaintext to a TLS port is no way around it.
    let plain = tonic::transport::Endpoint::from_shared(format!(
        "http://{}",
        cluster.node(target).raft_addr
    ))
    .expect("URL")
    .connect_lazy();
    let refused = CoordinatorClient::new(plain)
        .report(report("hyderabad"))
        .await;
    assert_ne!(
        code(&refused),
        tonic::Code::Ok,
        "a plaintext report was taken"
    );

    // A region's certificate on the Raft service: the wrong kind.
    let mut as_region = RaftClient::new(cluster.channel_as(target, "region-mumbai"));
    let refused = as_region
        .append_entries(payload(forged_append.clone()))
        .await;
    assert_eq!(
        code(&refused),
        tonic::Code::PermissionDenied,
        "AppendEntries with mumbai's certificate was taken: {refused:?}"
    );
    let vote = bin(&(Vote::new(term + 100, leader), None::<LogId<u64>>));
    let refused = as_region.vote(payload(vote)).await;
    assert_eq!(code(&refused), tonic::Code::PermissionDenied, "{refused:?}");
    // InstallSnapshot: vote, meta (last log id, an empty membership,
    // snapshot id), offset, data, done.
    let membership = (
        None::<LogId<u64>>,
        (
            Vec::<std::collections::BTreeSet<u64>>::new(),
            std::collections::BTreeMap::<u64, ()>::new(),
        ),
    );
    let snapshot = bin(&(
        Vote::new_committed(term + 100, leader),
        (None::<LogId<u64>>, membership, "forged".to_string()),
        0u64,
        vec![0u8; 16],
        true,
    ));
    let refused = as_region.install_snapshot(payload(snapshot)).await;
    assert_eq!(
        code(&refused),
        tonic::Code::PermissionDenied,
        "InstallSnapshot with mumbai's certificate was taken: {refused:?}"
    );

    // A member's certificate claiming to be the leader: the RPC names
    // node `leader`, the certificate another node.
    let other = (1..=3)
        .find(|id| *id != leader && *id != target)
        .unwrap_or(target);
    let mut as_other = RaftClient::new(cluster.channel_as(target, &format!("node-{other}")));
    let refused = as_other.append_entries(payload(forged_append)).await;
    assert_eq!(
        code(&refused),
        tonic::Code::PermissionDenied,
        "node {other}'s certificate sent AppendEntries as node {leader}: {refused:?}"
    );

    // mumbai's limiters report and watch for mumbai only.
    let mut mumbai = CoordinatorClient::new(cluster.channel_as(target, "region-mumbai"));
    for _ in 0..12 {
        let refused = mumbai.report(report("hyderabad")).await;
        assert_eq!(
            code(&refused),
            tonic::Code::PermissionDenied,
            "mumbai's certificate reported for hyderabad: {refused:?}"
        );
    }
    let refused = mumbai
        .watch(pb::WatchRequest {
            region: "hyderabad".into(),
            pod: "p-0".into(),
        })
        .await;
    assert_eq!(
        code(&refused),
        tonic::Code::PermissionDenied,
        "watch as hyderabad"
    );
    let mut own = report("mumbai");
    own.rules.clear();
    let taken = mumbai.report(own).await;
    assert_eq!(
        code(&taken),
        tonic::Code::Ok,
        "mumbai's own report refused: {taken:?}"
    );
    // A node's certificate does not stand in for a region either.
    let refused = CoordinatorClient::new(cluster.channel_as(target, &format!("node-{other}")))
        .report(report("hyderabad"))
        .await;
    assert_eq!(code(&refused), tonic::Code::PermissionDenied, "{refused:?}");

    // Two rebalance rounds' worth later, nothing the forgeries claimed stuck.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = state(&cluster, target).await;
    assert_eq!(after, before, "the cluster changed under forged RPCs");
    let now_term = cluster
        .get(target, "/api/v1/cluster")
        .await
        .unwrap_or_default()
        .1["term"]
        .as_u64()
        .unwrap_or(0);
    assert!(
        now_term < term + 100,
        "the forged term stuck: {term} → {now_term}"
    );
    assert!(
        cluster
            .metric(
                target,
                "meridian_coordinator_identity_refusals_total{caller=\"region\"}"
            )
            .await
            >= 13.0,
        "identity refusals not counted"
    );
    assert!(
        cluster
            .metric(
                target,
                "meridian_coordinator_raft_rpcs_refused_total{rpc=\"append_entries\"}"
            )
            .await
            >= 2.0,
        "Raft refusals not counted"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificates_rotate_in_place_without_losing_the_leader() {
    let cluster = Cluster::start(
        3,
        Options {
            tls: true,
            ..Options::default()
        },
    )
    .await;
    let leader = cluster.wait_leader(Duration::from_secs(20)).await;
    cluster.register_region(leader, "mumbai").await;
    let (status, body) = cluster.put_text(leader, &user_rules(100)).await;
    assert_eq!(status, 200, "{body}");
    let mut args = cluster.limiter_flags("mumbai");
    args.extend([
        "--region".into(),
        "mumbai".into(),
        "--store".into(),
        "memory".into(),
    ]);
    let cache = tempfile::tempdir().expect("temp dir");
    args.extend([
        "--rules-cache".into(),
        cache.path().join("cache.json").display().to_string(),
    ]);
    for id in cluster.running() {
        args.extend(["--coordinator".into(), cluster.node(id).grpc_url()]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let limiter = LimiterProcess::start_without_rules(&args);
    wait_for_user_limit(&limiter, 100, Duration::from_secs(10)).await;
    let cluster_view = cluster
        .get(leader, "/api/v1/cluster")
        .await
        .unwrap_or_default()
        .1;
    let term = cluster_view["term"].as_u64().unwrap_or(0);

    // A broken file first: the node keeps its certificate and says so.
    let pki = cluster.pki.as_ref().expect("TLS cluster");
    let cert = pki.dir.join(format!("node-{leader}.pem"));
    let good = std::fs::read(&cert).expect("read cert");
    std::fs::write(&cert, "not a certificate").expect("break the cert");
    let deadline = Instant::now() + Duration::from_secs(10);
    while cluster
        .metric(leader, "meridian_tls_reload_failures_total")
        .await
        < 1.0
    {
        assert!(
            Instant::now() < deadline,
            "a broken certificate file was not reported"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    std::fs::write(&cert, &good).expect("restore the cert");

    // New keys and certificates for every node and the region, in place.
    for id in cluster.running() {
        pki.issue_node(id);
    }
    pki.issue_region("mumbai");
    let deadline = Instant::now() + Duration::from_secs(15);
    for id in cluster.running() {
        while cluster.metric(id, "meridian_tls_reloads_total").await < 1.0 {
            assert!(
                Instant::now() < deadline,
                "node {id} did not reload its certificate"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    // The leader now presents the new certificate to a new connection.
    let presented = {
        let config = std::sync::Arc::new(pki.client_config(Some("region-mumbai")));
        let tcp = tokio::net::TcpStream::connect(&cluster.node(leader).raft_addr)
            .await
            .expect("dial the leader");
        let name = rustls::pki_types::ServerName::try_from("127.0.0.1").expect("name");
        let tls = tokio_rustls::TlsConnector::from(config)
            .connect(name, tcp)
            .await
            .expect("TLS handshake with the rotated certificates");
        tls.get_ref()
            .1
            .peer_certificates()
            .expect("server certificate")[0]
            .to_vec()
    };
    let issued: Vec<u8> = {
        use rustls::pki_types::pem::PemObject;
        let pem = std::fs::read(&cert).expect("read the new cert");
        rustls::pki_types::CertificateDer::from_pem_slice(&pem)
            .expect("PEM")
            .to_vec()
    };
    assert!(
        presented == issued,
        "the leader still presents its old certificate"
    );
    // New connections are made with the new certificates: a report signed
    // by the new region key, and a write that must replicate to a quorum
    // (peers dial each other anew after the rotation only if a connection
    // drops; the existing ones carry on, as they should).
    let mut fresh = CoordinatorClient::new(cluster.channel_as(leader, "region-mumbai"));
    let mut hello = report("mumbai");
    hello.rules.clear();
    let taken = fresh.report(hello).await;
    assert_eq!(
        code(&taken),
        tonic::Code::Ok,
        "the rotated region certificate: {taken:?}"
    );
    let (status, body) = cluster.put_text(leader, &user_rules(200)).await;
    assert_eq!(status, 200, "write after rotation: {body}");
    wait_for_user_limit(&limiter, 200, Duration::from_secs(10)).await;
    // A node restarted now dials its peers with the new certificate only.
    let follower = cluster
        .running()
        .into_iter()
        .find(|id| *id != leader)
        .unwrap_or(leader);
    let mut cluster = cluster;
    cluster.kill(follower);
    cluster.restart(follower);
    cluster
        .wait_version(follower, 2, Duration::from_secs(20))
        .await;

    let after = cluster
        .get(leader, "/api/v1/cluster")
        .await
        .unwrap_or_default()
        .1;
    assert_eq!(
        (after["leader"].as_u64(), after["term"].as_u64()),
        (Some(leader), Some(term)),
        "the rotation cost the leader: {cluster_view} → {after}"
    );
}
