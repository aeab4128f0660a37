//! The control plane's bounds. Reports that could grow the coordinator's
//! memory or make up regions are refused whole, and nothing of them is kept:
//! a region nobody registered, a 200 KB region name holding markup and a NUL,
//! a rule with more keys than a limiter ever sends. Watch streams beyond a
//! node's cap are refused, and a closed one frees its place.

use crate::common;

use std::time::Duration;

use meridian::proto::meridian::v1 as pb;
use meridian::proto::meridian::v1::coordinator_client::CoordinatorClient;

use common::coordinator::{Cluster, Options};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reports_from_unregistered_regions_or_beyond_their_bounds_are_refused() {
    let cluster = Cluster::start(1, Options::default()).await;
    cluster.register_region(1, "mumbai").await;
    let mut client = CoordinatorClient::new(cluster.channel(1));
    let report = |region: &str, keys: usize| pb::DemandReport {
        region: region.to_string(),
        pod: "p-0".into(),
        interval_ms: 10_000,
        rules: vec![pb::RuleDemand {
            rule: "api|customer".into(),
            keys: (0..keys)
                .map(|i| pb::KeyDemand {
                    key: i.to_string(),
                    asked: 1,
                    allowed: 1,
                })
                .collect(),
            ..Default::default()
        }],
        ..Default::default()
    };
    let code = |r: Result<tonic::Response<pb::ReportReply>, tonic::Status>| match r {
        Ok(_) => (tonic::Code::Ok, String::new()),
        Err(s) => (s.code(), s.message().to_string()),
    };

    let (c, m) = code(client.report(report("ghost", 1)).await);
    assert_eq!(c, tonic::Code::NotFound, "{m}");
    assert!(m.contains("PUT /api/v1/regions/ghost"), "{m}");
    let huge = format!("<script>{}\0", "x".repeat(200_000));
    let (c, m) = code(client.report(report(&huge, 1)).await);
    assert_eq!(c, tonic::Code::InvalidArgument, "{m}");
    assert!(
        m.len() < 300,
        "the error echoes the name: {} bytes",
        m.len()
    );
    let (c, m) = code(client.report(report("mumbai", 1_001)).await);
    assert_eq!(c, tonic::Code::InvalidArgument, "{m}");
    assert!(m.contains("rules.keys"), "{m}");
    // A sane report from the registered region is taken.
    let (c, m) = code(client.report(report("mumbai", 3)).await);
    assert_eq!(c, tonic::Code::Ok, "{m}");

    tokio::time::sleep(Duration::from_millis(500)).await;
    let regions = cluster
        .get(1, "/api/v1/regions")
        .await
        .unwrap_or_default()
        .1;
    let names: Vec<&str> = regions["regions"]
        .as_array()
        .map(|a| a.iter().filter_map(|r| r["name"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(
        names,
        ["mumbai"],
        "a refused report registered a region: {regions}"
    );
    assert!(
        cluster
            .metric(1, "meridian_coordinator_reports_refused_total")
            .await
            >= 3.0,
        "refusals not counted"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_streams_beyond_the_cap_are_refused_until_one_closes() {
    let options = Options {
        extra_args: vec!["--max-watch-streams".into(), "3".into()],
        ..Options::default()
    };
    let cluster = Cluster::start(1, options).await;
    cluster.register_region(1, "mumbai").await;
    let channel = cluster.channel(1);
    let watch = |pod: &str| {
        let mut client = CoordinatorClient::new(channel.clone());
        let request = pb::WatchRequest {
            region: "mumbai".into(),
            pod: pod.into(),
        };
        async move { client.watch(request).await.map(|r| r.into_inner()) }
    };
    let mut open = Vec::new();
    for i in 0..3 {
        match watch(&format!("p-{i}")).await {
            Ok(stream) => open.push(stream),
            Err(s) => panic!("stream {i} refused under the cap: {s}"),
        }
    }
    let refused = watch("p-3")
        .await
        .err()
        .map(|s| (s.code(), s.message().to_string()));
    assert!(
        matches!(&refused, Some((tonic::Code::ResourceExhausted, m)) if m.contains("at most 3")),
        "a fourth stream was served: {refused:?}"
    );
    drop(open.pop());
    // The node notices the closed stream when it next writes to it or the
    // connection resets; within a few seconds the place is free.
    let mut served = false;
    for _ in 0..50 {
        if watch("p-4").await.is_ok() {
            served = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(served, "a closed stream's place was never freed");
}
