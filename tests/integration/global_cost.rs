//! Cost quotas across regions with real processes (issue 31, part 3): 3
//! coordinators, 2 regions each with its own redis-server and limiter, one
//! world-wide token budget. Open reservations hold against the region's
//! allocation; calls reserving an estimate and committing a varying actual
//! 1–5 s later never take a window's settled tokens world-wide past the
//! budget plus each region's `max_overdraft` (the stated bound), and the
//! leader's demand counts settled tokens, not estimates.

use crate::common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::clear_of_window_boundary;
use common::global::{World, now_us};
use common::limiter::LimiterProcess;
use rand::Rng;
use serde_json::{Value, json};

/// Tokens per 6 s window, world-wide.
const L: u64 = 1_500;
const PERIOD: Duration = Duration::from_secs(6);
/// Each region's cap on excess past its allocation, per window.
const OVERDRAFT: u64 = 150;
const ESTIMATE: u64 = 100;
const RULE: &str = "llm|customer";

fn rules() -> String {
    format!(
        "domain: llm
descriptors:
  - key: customer
    scope: global
    fail_mode: closed
    algorithm: fixed_window
    period: 6s
    max_cost: 1000
    max_overdraft: {OVERDRAFT}
    rate_limit:
      name: tokens
      requests_per_unit: {L}
"
    )
}

fn reserve(customer: &str, ttl_ms: u64) -> Value {
    json!({"domain": "llm", "rule": "tokens", "key": customer, "estimate": ESTIMATE, "ttl_ms": ttl_ms})
}

/// The key's count in its window now (`limit − remaining` of a check-only
/// check).
async fn count(client: &reqwest::Client, limiter: &LimiterProcess, customer: &str) -> u64 {
    let (_, d) = limiter
        .post_json(
            client,
            "/v1/check",
            json!({"domain": "llm", "rule": "tokens", "key": customer, "check_only": true}),
        )
        .await;
    let n = |f: &str| d[f].as_u64().unwrap_or_else(|| panic!("{f} in {d}"));
    n("limit") - n("remaining")
}

/// One admitted call as its client saw it.
#[derive(Debug, Clone)]
struct Call {
    /// The clock-aligned window the estimate was charged in.
    window: u64,
    actual: u64,
    refunded: u64,
    charged: u64,
    /// The window the commit ran in (its excess is charged there).
    commit_window: u64,
}

/// The window a fixed-window answer was decided in, from its reset time.
fn window_of(recv_us: u64, reset_after_us: u64) -> u64 {
    let period = PERIOD.as_micros() as u64;
    ((recv_us + reset_after_us + period / 2) / period).saturating_sub(1)
}

/// Reserve, wait 1–5 s, commit an actual of 10–250 (mean 130: some refund,
/// some excess), until `until`; a denied caller retries after 100–300 ms.
async fn caller(limiter: String, until: Instant, calls: Arc<Mutex<Vec<Call>>>) -> (u64, u64) {
    let client = reqwest::Client::new();
    let (mut admitted, mut denied) = (0, 0);
    while Instant::now() < until {
        let Ok(response) = client
            .post(format!("{limiter}/v1/reserve"))
            .json(&reserve("42", 30_000))
            .send()
            .await
        else {
            continue;
        };
        let recv = now_us();
        let status = response.status().as_u16();
        let body: Value = response.json().await.unwrap_or_default();
        if status != 200 {
            denied += 1;
            let pause = rand::rng().random_range(100..300);
            tokio::time::sleep(Duration::from_millis(pause)).await;
            continue;
        }
        admitted += 1;
        let window = window_of(
            recv,
            body["limits"][0]["reset_after_us"].as_u64().unwrap_or(0),
        );
        let id = body["id"]
            .as_str()
            .expect("an admitted reservation's id")
            .to_string();
        let (wait, actual) = {
            let mut rng = rand::rng();
            (
                rng.random_range(1_000..5_000),
                rng.random_range(10..=250u64),
            )
        };
        tokio::time::sleep(Duration::from_millis(wait)).await;
        let sent = now_us();
        let response = client
            .post(format!("{limiter}/v1/commit"))
            .json(&json!({"id": id, "actual": actual}))
            .send()
            .await
            .expect("commit answered");
        let recv = now_us();
        assert_eq!(response.status().as_u16(), 200, "commit of {id}");
        let settled: Value = response.json().await.expect("commit JSON");
        let field = |f: &str| settled["limits"][0][f].as_u64().unwrap_or(0);
        calls.lock().expect("calls").push(Call {
            window,
            actual,
            refunded: field("refunded"),
            charged: field("charged"),
            commit_window: (sent + recv) / 2 / PERIOD.as_micros() as u64,
        });
    }
    (admitted, denied)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_regions_settling_seconds_later_stay_within_the_budget_plus_each_regions_overdraft() {
    let world = World::start(&rules(), &["mumbai", "hyderabad"]).await;
    world.wait_allocated(RULE, Duration::from_secs(20)).await;
    let client = reqwest::Client::new();
    let mumbai = &world.regions[0].limiter;

    // Open reservations hold against the region's allocation: reserve
    // until denied and commit none; the window's count is their estimates,
    // and a reservation is denied once one more estimate would not fit.
    clear_of_window_boundary(PERIOD, Duration::from_secs(3)).await;
    let mut held = Vec::new();
    let denial = loop {
        let (status, body) = mumbai
            .post_json(&client, "/v1/reserve", reserve("probe", 60_000))
            .await;
        if status != 200 {
            break body;
        }
        held.push(body["id"].as_str().expect("id").to_string());
        assert!(held.len() < 100, "more reservations than L holds: {body}");
    };
    let open = held.len() as u64 * ESTIMATE;
    let limit = denial["limits"][0]["limit"].as_u64().expect("limit");
    let remaining = denial["limits"][0]["remaining"]
        .as_u64()
        .expect("remaining");
    eprintln!(
        "mumbai held {} open reservations ({open}) of its allocation {limit}",
        held.len()
    );
    assert!(
        open <= limit && limit < L,
        "open {open}, allocation {limit}, L {L}"
    );
    assert!(
        remaining < ESTIMATE,
        "denied with {remaining} left: {denial}"
    );
    assert_eq!(
        count(&client, mumbai, "probe").await,
        open,
        "the open estimates are the count"
    );
    for id in &held {
        let (status, body) = mumbai
            .post_json(&client, "/v1/release", json!({"id": id}))
            .await;
        assert_eq!(status, 200, "release: {body}");
    }
    assert_eq!(
        count(&client, mumbai, "probe").await,
        0,
        "released: nothing held"
    );

    // Six callers per region for 30 s, asking about twice what the budget
    // holds. (The probe's reports reach the leader first.)
    tokio::time::sleep(Duration::from_secs(2)).await;
    let hits_before = leader_hits(&world).await;
    let calls = Arc::new(Mutex::new(Vec::new()));
    let until = Instant::now() + Duration::from_secs(30);
    let mut tasks = Vec::new();
    for (region, r) in world.regions.iter().enumerate() {
        for _ in 0..6 {
            let url = r.limiter.http_url("").trim_end_matches('/').to_string();
            let calls = calls.clone();
            tasks.push((region, tokio::spawn(caller(url, until, calls))));
        }
    }
    let mut per_region = [(0u64, 0u64); 2];
    for (region, t) in tasks {
        let (a, d) = t.await.expect("caller");
        per_region[region].0 += a;
        per_region[region].1 += d;
    }
    let calls = calls.lock().expect("calls").clone();
    eprintln!("admitted, denied per region: {per_region:?}");

    // Settled per window: estimates admitted in it, less what came back
    // into it, plus the excess charged in it.
    let mut settled: BTreeMap<u64, i64> = BTreeMap::new();
    for c in &calls {
        *settled.entry(c.window).or_default() += ESTIMATE as i64 - c.refunded as i64;
        *settled.entry(c.commit_window).or_default() += c.charged as i64;
    }
    let bound = (L + 2 * OVERDRAFT) as i64;
    let worst = settled.values().copied().max().unwrap_or(0);
    eprintln!("settled per window: {settled:?}; worst {worst} vs L {L}, bound {bound}");
    for (w, n) in &settled {
        assert!(
            *n <= bound,
            "window {w} settled {n} > L + 2 × max_overdraft = {bound}"
        );
    }
    assert!(
        worst as f64 >= 0.8 * L as f64,
        "traffic never filled a window: {settled:?}"
    );
    assert!(
        calls.iter().any(|c| c.charged > 0),
        "no commit charged an excess"
    );
    assert!(calls.iter().any(|c| c.refunded > 0), "no commit refunded");
    let excess: u64 = calls.iter().map(|c| c.charged).sum();
    let actual: u64 = calls.iter().map(|c| c.actual).sum();
    eprintln!(
        "{} calls: actual {actual} tokens, excess charged {excess}",
        calls.len()
    );

    // The leader's demand is the settled tokens: what every commit
    // answered, not the estimates (once the last reports are in).
    let net: i64 = calls
        .iter()
        .map(|c| ESTIMATE as i64 - c.refunded as i64 + c.charged as i64)
        .sum();
    let estimates = calls.len() as i64 * ESTIMATE as i64;
    let started = Instant::now();
    loop {
        let reported = leader_hits(&world).await - hits_before;
        // Refunds of estimates a pod had already reported stay reported
        // (a pod reports every second; they settle 1–5 s later), so the
        // leader reads between the settled total and the estimates.
        if (reported - net).abs() <= net / 20 || started.elapsed() > Duration::from_secs(10) {
            eprintln!("leader: {reported} allowed; settled {net}, estimates {estimates}");
            assert!(
                (reported - net).abs() <= net / 10,
                "the leader counts {reported} allowed tokens; the commits settled {net} \
                 (estimates {estimates})"
            );
            break;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// Tokens the leader counts as allowed for the rule, over both regions.
async fn leader_hits(world: &World) -> i64 {
    let body = world.allocations("").await;
    ["mumbai", "hyderabad"]
        .iter()
        .map(|r| {
            body["rules"][RULE]["hits"][r]["allowed"]
                .as_i64()
                .unwrap_or(0)
        })
        .sum()
}
