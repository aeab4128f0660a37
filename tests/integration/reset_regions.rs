//! `meridian ctl reset` across regions, with real processes: 3 coordinators,
//! two regions each with its own Redis and limiter behind proxies the test
//! can cut.
//!
//! - a customer at its limit in both regions is admitted again right after
//!   the reset, in each region; another customer keeps its count;
//! - a region cut off during the reset is shown as pending, applies the
//!   reset when it reconnects, and then answers;
//! - `ctl reset` prints every region's answer and exits 0 once all applied.

use crate::common;

use std::time::{Duration, Instant};

use common::coordinator::TOKEN;
use common::global::World;
use meridian::proto::meridian::v1::limiter_client::LimiterClient;
use meridian::proto::meridian::v1::{Check, CheckRequest, Entry};
use serde_json::{Value, json};

/// Region-scope: each region counts apart, so each region's reset shows.
const RULES: &str = "domain: api
descriptors:
  - key: customer
    fail_mode: closed
    algorithm: fixed_window
    period: 10m
    rate_limit:
      name: per_customer
      requests_per_unit: 5
";

/// `n` checks of `customer` in `region`'s limiter, one at a time: how many
/// were admitted. A check its store did not answer in time (under a loaded
/// machine: `fail_closed`, not counted) is asked again, so the count is the
/// limiter's, not the machine's load.
async fn admitted(world: &World, region: usize, customer: &str, n: usize) -> usize {
    let url = world.regions[region].limiter.grpc_url();
    let mut client = LimiterClient::connect(url).await.expect("limiter gRPC");
    let mut allowed = 0;
    for _ in 0..n {
        let mut reasons = Vec::new();
        loop {
            let check = Check {
                domain: "api".into(),
                descriptor: vec![Entry {
                    key: "customer".into(),
                    value: customer.into(),
                }],
                cost: 1,
                ..Default::default()
            };
            let answer = client
                .check(CheckRequest {
                    checks: vec![check],
                })
                .await
                .expect("check")
                .into_inner();
            let d = answer.decisions.first().expect("one decision");
            if d.reason.starts_with("fail") && reasons.len() < 20 {
                reasons.push(d.reason.clone());
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
            allowed += usize::from(d.allowed);
            break;
        }
    }
    allowed
}

async fn reset(world: &World, id: u64) -> Value {
    let leader = world.cluster.wait_leader(Duration::from_secs(20)).await;
    match world
        .cluster
        .get(leader, &format!("/api/v1/resets/{id}"))
        .await
    {
        Some((200, body)) => body["reset"].clone(),
        other => panic!("GET reset {id}: {other:?}"),
    }
}

fn state(reset: &Value, region: &str) -> String {
    reset["regions"]
        .as_array()
        .and_then(|rs| rs.iter().find(|r| r["region"] == region))
        .map(|r| r["state"].as_str().unwrap_or_default().to_string())
        .unwrap_or_default()
}

/// Waits until `region` answered reset `id`.
async fn wait_applied(world: &World, id: u64, region: &str, within: Duration) -> Value {
    let started = Instant::now();
    loop {
        let r = reset(world, id).await;
        if state(&r, region) == "applied" {
            return r;
        }
        assert!(
            started.elapsed() < within,
            "{region} did not apply reset {id} within {within:?}: {r}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_reset_clears_one_key_everywhere_and_a_cut_off_region_applies_it_on_return() {
    common::require_redis();
    let world = World::start(RULES, &["east", "west"]).await;
    // Both regions follow the rules.
    let deadline = Instant::now() + Duration::from_secs(30);
    while admitted(&world, 0, "warmup", 1).await == 0 || admitted(&world, 1, "warmup", 1).await == 0
    {
        assert!(Instant::now() < deadline, "limiters never took the rules");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for region in 0..2 {
        assert_eq!(
            admitted(&world, region, "42", 8).await,
            5,
            "42 reaches its limit"
        );
        assert_eq!(admitted(&world, region, "42", 1).await, 0, "and is denied");
        assert_eq!(admitted(&world, region, "43", 3).await, 3);
    }

    // West is cut off from every coordinator while the reset is started.
    for p in &world.regions[1].proxies {
        p.cut();
    }
    let leader = world.cluster.wait_leader(Duration::from_secs(20)).await;
    let (status, started) = world
        .cluster
        .send(
            leader,
            reqwest::Method::POST,
            "/api/v1/resets",
            Some(json!({ "domain": "api", "descriptor": ["customer=42"] })),
        )
        .await;
    assert_eq!(status, 200, "{started}");
    let id = started["reset"].as_u64().expect("reset id");
    let answered = Instant::now();
    let r = wait_applied(&world, id, "east", Duration::from_secs(10)).await;
    eprintln!("east applied reset {id} in {:?}", answered.elapsed());
    assert_eq!(state(&r, "west"), "pending", "{r}");
    assert_eq!(r["done"], false);
    assert_eq!(
        r["by"]["credential"]
            .as_str()
            .map(|c| c.starts_with("admin token sha256:")),
        Some(true)
    );
    assert_eq!(
        admitted(&world, 0, "42", 8).await,
        5,
        "east: 42 admitted again"
    );
    assert_eq!(
        admitted(&world, 0, "43", 8).await,
        2,
        "east: 43 keeps its count"
    );
    assert_eq!(
        admitted(&world, 1, "42", 1).await,
        0,
        "west has not applied it"
    );

    // West comes back and applies it.
    for p in &world.regions[1].proxies {
        p.restore();
    }
    let r = wait_applied(&world, id, "west", Duration::from_secs(20)).await;
    assert_eq!(r["done"], true, "{r}");
    assert_eq!(
        admitted(&world, 1, "42", 8).await,
        5,
        "west: 42 admitted again"
    );
    assert_eq!(
        admitted(&world, 1, "43", 8).await,
        2,
        "west: 43 keeps its count"
    );

    // Bad input is refused naming the field; nothing is started.
    let (status, body) = world
        .cluster
        .send(
            leader,
            reqwest::Method::POST,
            "/api/v1/resets",
            Some(json!({ "domain": "api", "descriptor": ["nothing=1"] })),
        )
        .await;
    assert_eq!(
        (status, body["field"].as_str()),
        (422, Some("descriptor")),
        "{body}"
    );

    // ctl: waits for every region and prints each answer.
    let token = tempfile::NamedTempFile::new().expect("token file");
    std::fs::write(token.path(), TOKEN).expect("write token");
    let out = std::process::Command::new(common::meridian_bin())
        .args(["ctl", "--coordinator"])
        .arg(world.cluster.node(leader).url())
        .arg("--token-file")
        .arg(token.path())
        .args(["reset", "--domain", "api", "customer=42", "--wait", "20s"])
        .output()
        .expect("ctl runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "ctl reset: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for region in ["east", "west"] {
        assert!(
            stdout
                .lines()
                .any(|l| l.starts_with(region) && l.contains("applied")),
            "{region} applied: {stdout}"
        );
    }
    for region in 0..2 {
        assert_eq!(
            admitted(&world, region, "42", 8).await,
            5,
            "42 admitted again"
        );
    }
}
