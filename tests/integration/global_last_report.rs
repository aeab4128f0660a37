//! A limiter told to stop (SIGTERM) reports the demand it counted since its
//! last report before it exits: the coordinator hears hits a pod admitted in
//! its last seconds instead of losing them with the process.

use crate::common;

use std::time::{Duration, Instant};

use common::coordinator::{Cluster, Options};
use common::global::fixed_window_rule_per;
use common::limiter::LimiterProcess;
use meridian::proto::meridian::v1::limiter_client::LimiterClient;
use meridian::proto::meridian::v1::{Check, CheckRequest};

const RULE: &str = "api|fw";

/// Checks `fw=acme` once; whether the rule admitted it against an
/// allocation (false when the limiter does not answer or has no rules yet:
/// a check no rule matches is admitted with limit 0).
async fn admitted(limiter: &LimiterProcess) -> bool {
    let Ok(mut client) = LimiterClient::connect(limiter.grpc_url()).await else {
        return false;
    };
    let check = Check {
        domain: "api".into(),
        rule: "fw".into(),
        key: "acme".into(),
        cost: 1,
        ..Default::default()
    };
    client
        .check(CheckRequest {
            checks: vec![check],
        })
        .await
        .is_ok_and(|r| {
            r.into_inner()
                .decisions
                .first()
                .is_some_and(|d| d.allowed && d.limit > 0)
        })
}

/// The demand the leader last committed for `region` of [`RULE`].
async fn committed_demand(cluster: &Cluster, region: &str) -> f64 {
    let leader = cluster.wait_leader(Duration::from_secs(20)).await;
    match cluster.get(leader, "/api/v1/allocations").await {
        Some((200, body)) => body["rules"][RULE]["demand"][region]
            .as_f64()
            .unwrap_or(0.0),
        _ => 0.0,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_sends_the_hits_counted_since_the_last_report() {
    let options = Options {
        extra_args: [
            "--rebalance-interval",
            "1s",
            "--lease",
            "6s",
            "--suspect-after",
            "2s",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect(),
        ..Options::default()
    };
    let cluster = Cluster::start(1, options).await;
    let leader = cluster.wait_leader(Duration::from_secs(20)).await;
    cluster.register_region(leader, "mumbai").await;
    let (status, body) = cluster
        .put_text(leader, &fixed_window_rule_per(1000, "60s"))
        .await;
    assert!((200..300).contains(&status), "PUT rules: {status} {body}");

    // Demand is due only every minute: the report this test waits for can
    // only be the one sent on SIGTERM.
    let cache = tempfile::tempdir().expect("temp dir");
    let cache = cache.path().join("rules-cache.json");
    let coordinator = cluster.node(leader).grpc_url();
    let mut limiter = LimiterProcess::start_without_rules(&[
        "--coordinator",
        &coordinator,
        "--region",
        "mumbai",
        "--store",
        "memory",
        "--report-interval",
        "60s",
        "--rules-cache",
        cache.to_str().expect("utf-8 path"),
    ]);
    let started = Instant::now();
    while !admitted(&limiter).await {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the limiter admitted nothing within 20 s: no allocation"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Far below the allocation: no top-up request carries them early.
    for _ in 0..20 {
        assert!(admitted(&limiter).await);
    }
    assert_eq!(
        committed_demand(&cluster, "mumbai").await,
        0.0,
        "demand reached the coordinator before SIGTERM"
    );

    let status = limiter.terminate();
    assert!(status.success(), "{status:?}");
    let stopped = Instant::now();
    loop {
        let demand = committed_demand(&cluster, "mumbai").await;
        if demand > 0.0 {
            eprintln!("demand committed after SIGTERM: {demand:.0} per minute");
            break;
        }
        assert!(
            stopped.elapsed() < Duration::from_secs(10),
            "no demand from mumbai 10 s after its limiter stopped: its last hits were lost"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
