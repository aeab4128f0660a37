//! `GET /api/v1/usage`, `/api/v1/usage/top` and `meridian ctl usage`
//! against a live world: 3 coordinators, two regions each with its own
//! redis-server and limiter, descriptor checks (`customer=42`) on a global
//! rule. What the answer says a key used, per region and world-wide, agrees
//! with what the test counted itself within the stated staleness (the
//! region's last report, at most the report interval old); top keys lists
//! the busiest key first; an override is read in the key's own units; a
//! follower relays to the leader; a region-scope rule is answered without
//! figures; a descriptor that matches nothing is refused naming the field.

use crate::common;

use std::process::Stdio;
use std::time::{Duration, Instant};

use common::coordinator::TOKEN;
use common::global::{Load, Record, World, now_us};
use serde_json::{Value, json};

const L: u64 = 1000;
const PERIOD: Duration = Duration::from_secs(4);
const RULE: &str = "api|customer";
/// The limiters' `--report-interval` (`World::start`): the stated
/// staleness of every figure.
const REPORT_INTERVAL_MS: i64 = 1000;
/// The longest a pod's report takes from its count to the leader.
const DELIVERY_MS: i64 = 500;

fn rules() -> String {
    format!(
        "domain: api
descriptors:
  - key: customer
    scope: global
    fail_mode: closed
    algorithm: fixed_window
    period: 4s
    rate_limit:
      name: per_customer
      requests_per_unit: {L}
  - key: ip
    rate_limit:
      unit: second
      requests_per_unit: 10
"
    )
}

/// The start (Unix ms) of the fixed window an admitted decision counted
/// in: the window ends at its reset time.
fn window_of(r: &Record) -> i64 {
    let period_us = PERIOD.as_micros() as u64;
    let end = r.recv_us + r.reset_after_us;
    let window = ((end + period_us / 2) / period_us).saturating_sub(1);
    (window * period_us / 1000) as i64
}

/// What the test counted for `region` in the window starting at `start`:
/// (admitted with an answer by `lower_ms`, admitted asked by `upper_ms`).
/// A pod's count taken at its report lies between the two.
fn counted(
    records: &[Record],
    region: usize,
    start: i64,
    lower_ms: i64,
    upper_ms: i64,
) -> (u64, u64) {
    let mine = records
        .iter()
        .filter(|r| r.allowed && r.region == region && window_of(r) == start);
    let (mut lower, mut upper) = (0, 0);
    for r in mine {
        if (r.recv_us / 1000) as i64 <= lower_ms {
            lower += 1;
        }
        if (r.sent_us / 1000) as i64 <= upper_ms {
            upper += 1;
        }
    }
    (lower, upper)
}

async fn get(world: &World, node: u64, path: &str) -> (u16, Value) {
    world
        .cluster
        .get(node, path)
        .await
        .unwrap_or_else(|| panic!("GET {path}: no answer from node {node}"))
}

/// Waits until the middle of a rule period (at least 1.5 s in, at most
/// 2.5 s), so the current period holds reports with counts.
async fn mid_period() {
    let p = PERIOD.as_millis() as u64;
    let into = (now_us() / 1000) % p;
    let target = 2_000;
    let wait = if into <= target {
        target - into
    } else {
        p - into + target
    };
    tokio::time::sleep(Duration::from_millis(wait)).await;
}

/// `/api/v1/usage` for customer `id` from `node`, checked against the
/// test's own count of the period it reports; `key_limit` is the key's
/// limit the answer must state. Returns the answer.
async fn usage_agrees(
    world: &World,
    node: u64,
    traffic: &Load,
    id: &str,
    key_limit: u64,
    slack: u64,
) -> Value {
    let path = format!("/api/v1/usage?domain=api&descriptor=customer%3D{id}");
    let (status, body) = get(world, node, &path).await;
    assert_eq!(status, 200, "{path}: {body}");
    let records = traffic.records();
    assert_eq!(body["rule"], RULE, "{body}");
    assert_eq!(body["key"], format!("customer={id}"), "{body}");
    assert_eq!(body["report_interval_ms"], REPORT_INTERVAL_MS, "{body}");
    let limit = &body["limits"][0];
    assert_eq!(limit["scope"], "global", "{body}");
    assert_eq!(limit["status"], "tracked", "{body}");
    assert_eq!(limit["limit"], L, "{body}");
    assert_eq!(limit["key_limit"], key_limit, "{body}");
    let start = limit["period"]["start_unix_ms"]
        .as_i64()
        .expect("period start");
    let mut world_used = 0;
    for (i, region) in world.regions.iter().enumerate() {
        let r = limit["regions"]
            .as_array()
            .and_then(|rs| rs.iter().find(|r| r["region"] == region.name.as_str()))
            .unwrap_or_else(|| panic!("no row for {}: {body}", region.name));
        let used = r["used"]
            .as_u64()
            .unwrap_or_else(|| panic!("{} used: {body}", region.name));
        assert_eq!(
            r["figure"], "counted",
            "every pod of {} reported the key: {body}",
            region.name
        );
        let heard = r["last_report_unix_ms"].as_i64().expect("last report");
        let age = r["age_ms"].as_i64().expect("age");
        // The stated staleness: a region's figure is its last report, at
        // most the report interval old (plus delivery).
        assert!(
            age <= REPORT_INTERVAL_MS + DELIVERY_MS,
            "{}: a figure {age} ms old, reports every {REPORT_INTERVAL_MS} ms: {body}",
            region.name
        );
        // The pod's count, taken before the leader heard it (a report's
        // delivery, through a follower and the test's proxy, well under
        // DELIVERY), holds every hit answered before then and none asked
        // after.
        let (lower, upper) = counted(&records, i, start, heard - DELIVERY_MS, heard);
        eprintln!(
            "usage of customer={id} in {}: {used} (test counted {lower}..{upper} by its report, {age} ms ago)",
            region.name
        );
        assert!(
            lower.saturating_sub(slack) <= used && used <= upper + slack,
            "{}: usage says {used}, the test counted {lower}..{upper} by the region's last report: {body}",
            region.name
        );
        assert!(
            r["allocation"].as_u64().is_some_and(|a| a > 0),
            "{}'s allocation: {body}",
            region.name
        );
        world_used += used;
    }
    let world_figure = limit["world"]["used"].as_u64().expect("world used");
    assert!(
        world_figure.abs_diff(world_used) <= slack,
        "the world is the regions' sum: {world_figure} vs {world_used}: {body}"
    );
    let ratio = limit["world"]["ratio"].as_f64().expect("ratio");
    assert!(
        (ratio - world_figure as f64 / key_limit as f64).abs() < 1e-9,
        "ratio to the key's limit: {body}"
    );
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn usage_agrees_with_what_the_test_counted_and_top_keys_lists_the_busiest_first() {
    let world = World::start(&rules(), &["mumbai", "hyderabad"]).await;
    // customer 42: 80 checks a second (mumbai 60, hyderabad 20), 320 a
    // period, all admitted under L 1,000; customer 7: 10 a second.
    let busy = Load::start_descriptor(&world, "api", &[("customer", "42")], &[60, 20]);
    let quiet = Load::start_descriptor(&world, "api", &[("customer", "7")], &[10, 0]);
    world.wait_allocated(RULE, Duration::from_secs(20)).await;
    let leader = world.cluster.wait_leader(Duration::from_secs(10)).await;
    let follower = world
        .cluster
        .running()
        .into_iter()
        .find(|&id| id != leader)
        .expect("a follower");

    // Two periods after traffic began, the ledger holds the key; then two
    // checks in the middle of periods, from the leader and a follower.
    tokio::time::sleep(PERIOD * 2).await;
    for node in [leader, follower] {
        mid_period().await;
        let body = usage_agrees(&world, node, &busy, "42", L, 0).await;
        assert_eq!(
            body["node_id"], leader,
            "a follower relays to the leader: {body}"
        );
        assert!(body["limits"][0]["override"].is_null(), "{body}");
    }

    // Top keys: customer 42 first, then customer 7, against L.
    let (status, top) = get(
        &world,
        follower,
        "/api/v1/usage/top?rule=api%7Ccustomer&n=5",
    )
    .await;
    assert_eq!(status, 200, "{top}");
    let keys: Vec<&str> = top["rules"][RULE]["keys"]
        .as_array()
        .map(|k| k.iter().filter_map(|k| k["key"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(
        keys.first(),
        Some(&"customer=42"),
        "the busiest key first: {top}"
    );
    assert!(keys.contains(&"customer=7"), "{top}");
    let first = &top["rules"][RULE]["keys"][0];
    assert_eq!(first["key_limit"], L, "{top}");
    assert!(
        first["ratio"].as_f64().is_some_and(|r| r > 0.05 && r < 1.0),
        "{top}"
    );
    // n is bounded.
    let (status, body) = get(&world, leader, "/api/v1/usage/top?n=101").await;
    assert_eq!((status, body["field"].as_str()), (400, Some("n")), "{body}");

    // An override of 2,000: the leader reads the key's reports at L / O,
    // usage shows them in the key's own units against O.
    let (status, body) = world
        .cluster
        .send(
            leader,
            reqwest::Method::PUT,
            "/api/v1/overrides",
            Some(
                json!({ "domain": "api", "descriptor": ["customer=42"], "limit": 2000,
                         "reason": "usage test" }),
            ),
        )
        .await;
    assert_eq!(status, 200, "set the override: {body}");
    // Every pod's counts of the period read in the new units after its
    // next report: wait for a period that began after that.
    tokio::time::sleep(Duration::from_millis(REPORT_INTERVAL_MS as u64 * 2)).await;
    tokio::time::sleep(PERIOD).await;
    mid_period().await;
    // Scaled by 1/2 per pod report and back by 2: one hit of rounding.
    let body = usage_agrees(&world, leader, &busy, "42", 2000, 1).await;
    let o = &body["limits"][0]["override"];
    assert_eq!(
        (o["limit"].as_u64(), o["reason"].as_str()),
        (Some(2000), Some("usage test")),
        "{body}"
    );

    // meridian ctl usage: a row per region and the world's.
    let url = world.cluster.node(follower).url();
    let out = tokio::process::Command::new(common::meridian_bin())
        .args([
            "ctl",
            "--coordinator",
            &url,
            "usage",
            "--domain",
            "api",
            "customer=42",
        ])
        .env_remove("MERIDIAN_COORDINATOR")
        .env("MERIDIAN_ADMIN_TOKEN", TOKEN)
        .stdin(Stdio::null())
        .output()
        .await
        .expect("run meridian ctl usage");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "ctl usage: {text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.lines()
            .nth(1)
            .is_some_and(|h| h.starts_with("RULE") && h.contains("AGE")),
        "{text}"
    );
    for row in ["mumbai", "hyderabad", "world"] {
        assert!(
            text.lines()
                .any(|l| l.starts_with(RULE) && l.contains(row) && l.contains("2000")),
            "a {row} row with the override's limit: {text}"
        );
    }
    let out = tokio::process::Command::new(common::meridian_bin())
        .args(["ctl", "--coordinator", &url, "usage", "top", "-n", "3"])
        .env_remove("MERIDIAN_COORDINATOR")
        .env("MERIDIAN_ADMIN_TOKEN", TOKEN)
        .stdin(Stdio::null())
        .output()
        .await
        .expect("run meridian ctl usage top");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "ctl usage top: {text}");
    assert!(
        text.lines()
            .nth(1)
            .is_some_and(|l| l.contains("customer=42")),
        "{text}"
    );

    // A region-scope rule: answered, without figures.
    let (status, body) = get(
        &world,
        leader,
        "/api/v1/usage?domain=api&descriptor=ip%3D10.0.0.1",
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["limits"][0]["scope"], "region", "{body}");
    assert!(body["limits"][0]["regions"].is_null(), "no figures: {body}");
    // A descriptor that matches nothing: refused, naming the field.
    let (status, body) = get(
        &world,
        follower,
        "/api/v1/usage?domain=api&descriptor=plan%3Dgold",
    )
    .await;
    assert_eq!(
        (status, body["field"].as_str()),
        (422, Some("descriptor")),
        "{body}"
    );
    let (status, body) = get(
        &world,
        follower,
        "/api/v1/usage?domain=web&descriptor=customer%3D42",
    )
    .await;
    assert_eq!(
        (status, body["field"].as_str()),
        (422, Some("domain")),
        "{body}"
    );

    let started = Instant::now();
    quiet.stop().await;
    busy.stop().await;
    eprintln!("traffic stopped in {:?}", started.elapsed());
}
