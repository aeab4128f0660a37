//! Raft RPCs that no member could have sent are refused, and the cluster is
//! unchanged afterwards: a vote at a term no election reaches (near 2^64 it
//! used to stop the Raft core for good, also after a restart), and
//! AppendEntries / Vote / InstallSnapshot claiming a node id outside the
//! membership. (Proving *which* member sent an RPC needs its certificate.)

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use meridian::proto::meridian::v1::RaftPayload;
use meridian::proto::meridian::v1::raft_client::RaftClient;
use openraft::{LogId, Vote};
use serde_json::Value;

use common::coordinator::{Cluster, Options};

/// What a node shows of itself: (term, leader, rules version, health).
async fn state(cluster: &Cluster, id: u64) -> (u64, u64, u64, u16) {
    let cluster_view = cluster
        .get(id, "/api/v1/cluster")
        .await
        .unwrap_or_default()
        .1;
    let rules = cluster.get(id, "/api/v1/rules").await.unwrap_or_default().1;
    let health = cluster.get(id, "/healthz").await.map_or(0, |(s, _)| s);
    let n = |v: &Value, f: &str| v[f].as_u64().unwrap_or(0);
    (
        n(&cluster_view, "term"),
        n(&cluster_view, "leader"),
        rules["current"]["number"].as_u64().unwrap_or(0),
        health,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raft_rpcs_from_outside_the_cluster_or_at_absurd_terms_are_refused() {
    let cluster = Cluster::start(3, Options::default()).await;
    let leader = cluster.wait_leader(Duration::from_secs(20)).await;
    let (status, body) = cluster.put_rules(leader, "api").await;
    assert_eq!(status, 200, "{body}");
    cluster
        .wait_version(leader, 1, Duration::from_secs(10))
        .await;
    let target = (1..=3).find(|id| *id != leader).unwrap_or(1);
    // The follower applies version 1 a moment after the leader: read its
    // state once it has, or the forged RPCs get the blame for that moment.
    cluster
        .wait_version(target, 1, Duration::from_secs(10))
        .await;
    let before = state(&cluster, target).await;
    let mut client = RaftClient::new(cluster.channel(target));
    let payload = |data: Vec<u8>| tonic::Request::new(RaftPayload { data });

    // A member's id at a term near 2^64.
    let vote = (Vote::new(u64::MAX - 1, leader), None::<LogId<u64>>);
    let refused = client.vote(payload(bin(&vote))).await;
    assert_eq!(
        refused.as_ref().map_err(|s| s.code()).err(),
        Some(tonic::Code::PermissionDenied),
        "a vote at term 2^64 - 2 was taken: {refused:?}"
    );
    // A leader that is not a member, a term ahead: AppendEntries with no
    // entries (the layout of openraft's request: vote, prev log id,
    // entries, leader commit).
    let term = before.0 + 100;
    let append = (
        Vote::new_committed(term, 99u64),
        None::<LogId<u64>>,
        Vec::<()>::new(),
        None::<LogId<u64>>,
    );
    let refused = client.append_entries(payload(bin(&append))).await;
    assert_eq!(
        refused.as_ref().map_err(|s| s.code()).err(),
        Some(tonic::Code::PermissionDenied),
        "AppendEntries from node 99 was taken: {refused:?}"
    );
    let vote = (Vote::new(term, 99u64), None::<LogId<u64>>);
    let refused = client.vote(payload(bin(&vote))).await;
    assert_eq!(
        refused.as_ref().map_err(|s| s.code()).err(),
        Some(tonic::Code::PermissionDenied),
        "a vote from node 99 was taken: {refused:?}"
    );
    // InstallSnapshot: vote, meta (last log id, membership with no
    // configs and no nodes, snapshot id), offset, data, done.
    let membership = (
        None::<LogId<u64>>,
        (Vec::<BTreeSet<u64>>::new(), BTreeMap::<u64, ()>::new()),
    );
    let meta = (None::<LogId<u64>>, membership, "forged".to_string());
    let snapshot = (
        Vote::new_committed(term, 99u64),
        meta,
        0u64,
        vec![0u8; 16],
        true,
    );
    let refused = client.install_snapshot(payload(bin(&snapshot))).await;
    assert_eq!(
        refused.as_ref().map_err(|s| s.code()).err(),
        Some(tonic::Code::PermissionDenied),
        "InstallSnapshot from node 99 was taken: {refused:?}"
    );

    // Elections may come and go meanwhile; nothing the RPCs claimed stuck.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = state(&cluster, target).await;
    assert!(
        after.0 < before.0 + 100,
        "the forged term stuck: {before:?} → {after:?}"
    );
    assert_eq!(
        (after.2, after.3),
        (before.2, 200),
        "rules or health changed: {before:?} → {after:?}"
    );
    let (status, body) = cluster
        .put_rules(cluster.wait_leader(Duration::from_secs(20)).await, "api")
        .await;
    assert_eq!(status, 200, "the cluster no longer takes writes: {body}");
    assert!(
        cluster
            .metric(
                target,
                "meridian_coordinator_raft_rpcs_refused_total{rpc=\"vote\"}"
            )
            .await
            >= 2.0,
        "refusals not counted"
    );
}

/// The bincode encoding openraft's requests travel in (structs encode as
/// the tuple of their fields).
fn bin<T: serde::Serialize>(value: &T) -> Vec<u8> {
    match bincode::serialize(value) {
        Ok(bytes) => bytes,
        Err(e) => panic!("bincode: {e}"),
    }
}
