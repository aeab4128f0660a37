//! One home for the report interval: coordinators rebalancing every 2 s give
//! limiters 1 s on the Watch stream, so a limiter started without
//! `--report-interval` reports every ~1 s and says so on `/readyz`; a flag
//! may only shorten it. A pod whose reports still cover 10 s (an old
//! limiter) is listed on the coordinator's `/readyz` and counted in
//! `meridian_report_interval_mismatched_pods`.

use crate::common;

use std::time::{Duration, Instant};

use common::coordinator::{Cluster, Options};
use common::global::fixed_window_rule_per;
use common::limiter::LimiterProcess;
use meridian::proto::meridian::v1 as pb;
use meridian::proto::meridian::v1::coordinator_client::CoordinatorClient;
use serde_json::Value;

/// The limiter's `/readyz` body ("" when it does not answer).
async fn readyz(limiter: &LimiterProcess) -> String {
    let Ok(r) = common::http_client()
        .build()
        .expect("client")
        .get(limiter.http_url("/readyz"))
        .send()
        .await
    else {
        return String::new();
    };
    r.text().await.unwrap_or_default()
}

/// Demand reports the limiter delivered so far (its own counter).
async fn demand_reports(limiter: &LimiterProcess) -> f64 {
    let Ok(r) = common::http_client()
        .build()
        .expect("client")
        .get(limiter.http_url("/metrics"))
        .send()
        .await
    else {
        return 0.0;
    };
    r.text()
        .await
        .unwrap_or_default()
        .lines()
        .filter(|l| {
            l.starts_with("meridian_allocation_reports_total{") && l.contains("kind=\"demand\"")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Waits (up to `limit`) until the limiter's `/readyz` contains `line`.
async fn wait_readyz(limiter: &LimiterProcess, line: &str, limit: Duration) {
    let start = Instant::now();
    loop {
        let body = readyz(limiter).await;
        if body.contains(line) {
            return;
        }
        assert!(
            start.elapsed() < limit,
            "/readyz never said {line:?} within {limit:?}; last: {body:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limiter_without_the_flag_reports_at_the_interval_the_coordinators_give() {
    let options = Options {
        extra_args: vec!["--rebalance-interval".into(), "2s".into()],
        ..Options::default()
    };
    let cluster = Cluster::start(1, options).await;
    let leader = cluster.wait_leader(Duration::from_secs(20)).await;
    cluster.register_region(leader, "mumbai").await;
    let (status, body) = cluster
        .put_text(leader, &fixed_window_rule_per(1000, "10s"))
        .await;
    assert!((200..300).contains(&status), "PUT rules: {status} {body}");

    let cache = tempfile::tempdir().expect("temp dir");
    let coordinator = cluster.node(leader).grpc_url();
    let start = |cache: &str, extra: &[&str]| {
        let mut args = vec![
            "--coordinator",
            &coordinator,
            "--region",
            "mumbai",
            "--store",
            "memory",
            "--rules-cache",
            cache,
        ];
        args.extend_from_slice(extra);
        LimiterProcess::start_without_rules(&args)
    };
    let cache_a = cache.path().join("a.json");
    let follower = start(cache_a.to_str().expect("utf-8 path"), &[]);
    wait_readyz(
        &follower,
        "report interval: 1s (coordinator)",
        Duration::from_secs(20),
    )
    .await;

    // Five more demand reports take about five seconds (at the old 10 s
    // default they would take 50).
    let first = demand_reports(&follower).await;
    let counted_from = Instant::now();
    while demand_reports(&follower).await < first + 5.0 {
        assert!(
            counted_from.elapsed() < Duration::from_secs(9),
            "fewer than 5 demand reports in 9 s: not reporting every second"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let took = counted_from.elapsed();
    eprintln!("5 demand reports in {took:?}");
    assert!(
        took >= Duration::from_millis(3_500),
        "5 demand reports in {took:?}: faster than the 1 s given"
    );

    // A flag may shorten the interval, and /readyz says where it came from;
    // a longer one is not taken.
    let cache_b = cache.path().join("b.json");
    let shorter = start(
        cache_b.to_str().expect("utf-8 path"),
        &["--pod-id", "short", "--report-interval", "500ms"],
    );
    wait_readyz(
        &shorter,
        "report interval: 500ms (--report-interval)",
        Duration::from_secs(20),
    )
    .await;
    let cache_c = cache.path().join("c.json");
    let longer = start(
        cache_c.to_str().expect("utf-8 path"),
        &["--pod-id", "long", "--report-interval", "10s"],
    );
    wait_readyz(
        &longer,
        "report interval: 1s (coordinator)",
        Duration::from_secs(20),
    )
    .await;

    // The coordinator gives 1 s, and hears no pod reporting slower.
    let ready = |cluster: &Cluster| {
        let url = format!("{}/readyz", cluster.node(leader).url());
        async move {
            let r = common::http_client()
                .build()
                .expect("client")
                .get(url)
                .send()
                .await
                .expect("coordinator /readyz");
            assert_eq!(r.status(), 200);
            r.json::<Value>().await.expect("json")
        }
    };
    let body = ready(&cluster).await;
    assert_eq!(body["report_interval"]["expected_ms"], 1_000, "{body}");
    assert_eq!(
        body["report_interval"]["mismatched_pods"],
        serde_json::json!([]),
        "{body}"
    );

    // An old limiter: its reports cover 10 s.
    let mut client = CoordinatorClient::new(cluster.channel(leader));
    client
        .report(pb::DemandReport {
            region: "mumbai".into(),
            pod: "old-0".into(),
            interval_ms: 10_000,
            ..Default::default()
        })
        .await
        .expect("report taken");
    let body = ready(&cluster).await;
    let slow = &body["report_interval"]["mismatched_pods"];
    assert_eq!(slow.as_array().map(Vec::len), Some(1), "{body}");
    assert_eq!(
        (
            &slow[0]["pod"],
            &slow[0]["interval_ms"],
            &slow[0]["expected_ms"]
        ),
        (
            &Value::from("old-0"),
            &Value::from(10_000),
            &Value::from(1_000)
        ),
        "{body}"
    );
    assert_eq!(
        cluster
            .metric(leader, "meridian_report_interval_mismatched_pods")
            .await,
        1.0
    );
}
