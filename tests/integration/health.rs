//! `grpc.health.v1.Health` on the limiter's gRPC port, asked by tonic's own
//! health client against real limiter processes and a real Redis.

use crate::common;

use std::time::{Duration, Instant};

use common::RedisServer;
use common::limiter::LimiterProcess;
use tokio_stream::StreamExt;
use tonic::transport::Channel;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

const RULES: &str = "domain: api\ndescriptors:\n  - key: customer\n    rate_limit:\n      unit: minute\n      requests_per_unit: 3\n";

const SERVICES: [&str; 3] = [
    "",
    "envoy.service.ratelimit.v3.RateLimitService",
    "meridian.v1.Limiter",
];

async fn client(limiter: &LimiterProcess) -> HealthClient<Channel> {
    let channel = Channel::from_shared(limiter.grpc_url())
        .expect("a valid URL")
        .connect()
        .await
        .expect("connect to the limiter's gRPC port");
    HealthClient::new(channel)
}

async fn status(client: &mut HealthClient<Channel>, service: &str) -> ServingStatus {
    let response = client
        .check(HealthCheckRequest {
            service: service.into(),
        })
        .await
        .unwrap_or_else(|e| panic!("health check of {service:?}: {e}"));
    response.into_inner().status()
}

/// Asks until `service` reports `want`; panics after `within`.
async fn wait_for(
    client: &mut HealthClient<Channel>,
    service: &str,
    want: ServingStatus,
    within: Duration,
) -> Duration {
    let started = Instant::now();
    loop {
        let got = status(client, service).await;
        if got == want {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < within,
            "{service:?} still {got:?} after {within:?}, want {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn sigterm(limiter: &LimiterProcess) {
    let status = std::process::Command::new("kill")
        .args(["-TERM", &limiter.pid().to_string()])
        .status()
        .expect("run kill");
    assert!(status.success());
}

#[tokio::test]
async fn serving_with_rules_and_redis_then_not_serving_from_the_start_of_the_drain() {
    let redis = RedisServer::start();
    let mut limiter =
        LimiterProcess::start(RULES, &["--redis", &redis.url(), "--drain-timeout", "2s"]);
    let mut health = client(&limiter).await;
    wait_for(
        &mut health,
        "",
        ServingStatus::Serving,
        Duration::from_secs(5),
    )
    .await;
    for service in SERVICES {
        assert_eq!(
            status(&mut health, service).await,
            ServingStatus::Serving,
            "{service:?}"
        );
    }
    let unknown = health
        .check(HealthCheckRequest {
            service: "no.such.Service".into(),
        })
        .await
        .expect_err("an unknown service is NOT_FOUND");
    assert_eq!(unknown.code(), tonic::Code::NotFound);

    // A gateway watching the status keeps its stream open through the drain.
    let mut watch = health
        .watch(HealthCheckRequest { service: "".into() })
        .await
        .expect("watch")
        .into_inner();
    let first = watch.next().await.expect("a first status").expect("ok");
    assert_eq!(first.status(), ServingStatus::Serving);

    let sent = Instant::now();
    sigterm(&limiter);
    let next = tokio::time::timeout(Duration::from_secs(1), watch.next())
        .await
        .expect("a status within 1 s of SIGTERM")
        .expect("the stream stays open during the drain")
        .expect("ok");
    assert_eq!(next.status(), ServingStatus::NotServing);
    assert!(
        sent.elapsed() < Duration::from_millis(500),
        "NOT_SERVING {:?} after SIGTERM",
        sent.elapsed()
    );
    // The process still drains and exits cleanly within its drain timeout.
    let started = Instant::now();
    let exit = loop {
        if let Some(exit) = limiter.exit_status() {
            break exit;
        }
        assert!(started.elapsed() < Duration::from_secs(8), "still running");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(exit.success(), "{exit:?}");
}

#[tokio::test]
async fn not_serving_while_redis_is_down_and_serving_again_when_it_is_back() {
    let mut redis = RedisServer::start();
    let limiter = LimiterProcess::start(RULES, &["--redis", &redis.url()]);
    let mut health = client(&limiter).await;
    wait_for(
        &mut health,
        "",
        ServingStatus::Serving,
        Duration::from_secs(5),
    )
    .await;

    redis.kill();
    let down = wait_for(
        &mut health,
        "",
        ServingStatus::NotServing,
        Duration::from_secs(5),
    )
    .await;
    for service in SERVICES {
        assert_eq!(
            status(&mut health, service).await,
            ServingStatus::NotServing
        );
    }
    redis.restart();
    let up = wait_for(
        &mut health,
        "",
        ServingStatus::Serving,
        Duration::from_secs(10),
    )
    .await;
    eprintln!("NOT_SERVING {down:?} after Redis died, SERVING {up:?} after it came back");
}

/// A limiter following a coordinator has no rules until the first version
/// (or its cache) arrives: it must not tell a gateway it is ready.
#[tokio::test]
async fn not_serving_before_the_first_rules_arrive() {
    let dir = tempfile::tempdir().expect("temp dir");
    let cache = dir.path().join("rules-cache.json");
    // Nothing listens on this port: the coordinator never answers.
    let free = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let nowhere = format!("http://{}", free.local_addr().expect("addr"));
    drop(free);
    let limiter = LimiterProcess::start_without_rules(&[
        "--store",
        "memory",
        "--coordinator",
        &nowhere,
        "--rules-cache",
        cache.to_str().expect("utf-8 path"),
    ]);
    let mut health = client(&limiter).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(status(&mut health, "").await, ServingStatus::NotServing);
}
