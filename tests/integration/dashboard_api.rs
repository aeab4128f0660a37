//! What the dashboard reads, over HTTP against a real 3-node cluster: the
//! page and its headers, `/api/v1/history` (the same samples on every node,
//! errors that name the field), `/api/v1/ledger` (the leader's world figures
//! per period, relayed by a follower), `/api/v1/rules/diff`, and the cap on event
//! streams (a flood of dashboards gets 503, not unbounded memory).

use crate::common;

use std::time::{Duration, Instant};

use common::coordinator::{Cluster, Options, TOKEN};
use common::global::{Load, World, fixed_window_rule};
use serde_json::Value;

const RULE: &str = "api%7Cfw";

/// A cluster with two registered regions and a global rule (no limiters:
/// one epoch, nothing changes after).
async fn cluster() -> (Cluster, u64) {
    let options = Options {
        extra_args: [
            "--rebalance-interval",
            "500ms",
            "--lease",
            "3s",
            "--suspect-after",
            "1s",
            "--round-lead",
            "100ms",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect(),
        ..Options::default()
    };
    let cluster = Cluster::start(3, options).await;
    let leader = cluster.wait_leader(Duration::from_secs(20)).await;
    for region in ["mumbai", "hyderabad"] {
        cluster.register_region(leader, region).await;
    }
    let (status, body) = cluster.put_text(leader, &fixed_window_rule(200)).await;
    assert!((200..300).contains(&status), "PUT rules: {status} {body}");
    (cluster, leader)
}

async fn history(cluster: &Cluster, node: u64, query: &str) -> (u16, Value) {
    cluster
        .get(node, &format!("/api/v1/history?{query}"))
        .await
        .unwrap_or((0, Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_is_the_same_on_every_node_and_errors_name_the_field() {
    // Epochs are committed only when something changes: traffic makes them.
    let world = World::start(&fixed_window_rule(200), &["mumbai", "hyderabad"]).await;
    let load = Load::start(&world, "api", "fw", "acme", &[40, 10]);
    let cluster = &world.cluster;
    let leader = cluster.wait_leader(Duration::from_secs(20)).await;
    let follower = cluster
        .running()
        .into_iter()
        .find(|&id| id != leader)
        .expect("follower");

    // Samples accumulate at the leader's epochs.
    let deadline = Instant::now() + Duration::from_secs(20);
    let leaders = loop {
        let (status, body) = history(cluster, leader, &format!("rule={RULE}")).await;
        if status == 200 && body["samples"].as_array().is_some_and(|s| s.len() >= 3) {
            break body;
        }
        assert!(Instant::now() < deadline, "no 3 samples: {status} {body}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(
        leaders["regions"],
        serde_json::json!(["hyderabad", "mumbai"])
    );
    assert_eq!(leaders["use_counted"], true, "{leaders}");
    assert_eq!(leaders["algorithm"], "fixed_window");
    assert_eq!(leaders["period_ms"], 4_000);
    let sample = &leaders["samples"][0];
    assert_eq!(
        sample["granted"].as_array().map(Vec::len),
        Some(2),
        "{sample}"
    );
    assert_eq!(sample["limit"], 200);

    // A follower relays to the leader: the same samples, counted there.
    let since = sample["at_unix_ms"].as_i64().expect("at");
    let (status, theirs) = history(cluster, follower, &format!("rule={RULE}&since={since}")).await;
    assert_eq!(status, 200, "{theirs}");
    assert_eq!(theirs["node_id"], leader, "{theirs}");
    let first = theirs["samples"][0].clone();
    assert!(
        first["at_unix_ms"].as_i64() > Some(since),
        "since is exclusive: {first}"
    );
    assert_eq!(first, leaders["samples"][1], "the same sample on both");

    // The follower's own history, when no leader can be reached (the other
    // two nodes frozen, so no election can replace the leader), has the
    // same grants for the same epochs, and says why use is missing.
    let third = cluster
        .running()
        .into_iter()
        .find(|&id| id != leader && id != follower)
        .expect("third");
    cluster.node(leader).pause();
    cluster.node(third).pause();
    let deadline = Instant::now() + Duration::from_secs(20);
    let own = loop {
        let (status, body) = history(cluster, follower, &format!("rule={RULE}")).await;
        if status == 200 && body["use_counted"] == false {
            break body;
        }
        assert!(
            Instant::now() < deadline,
            "follower's own history: {status} {body}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    cluster.node(leader).resume();
    cluster.node(third).resume();
    assert!(
        own["use_note"].as_str().is_some_and(|n| !n.is_empty()),
        "{own}"
    );
    let by_epoch = |body: &Value| -> Vec<(u64, Value)> {
        body["samples"]
            .as_array()
            .map(|s| {
                s.iter()
                    .map(|x| (x["epoch"].as_u64().unwrap_or(0), x["granted"].clone()))
                    .collect()
            })
            .unwrap_or_default()
    };
    let ours = by_epoch(&leaders);
    let common_epochs: Vec<_> = by_epoch(&own)
        .into_iter()
        .filter(|e| ours.contains(e))
        .collect();
    assert!(!common_epochs.is_empty(), "leader {ours:?}, follower {own}");

    // Errors name what is wrong.
    let (status, body) = history(cluster, follower, "rule=nope").await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(
        body["global_rules"],
        serde_json::json!(["api|fw"]),
        "{body}"
    );
    let (status, body) = history(cluster, follower, &format!("rule={RULE}&bogus=1")).await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"].as_str().is_some_and(|e| e.contains("bogus")),
        "{body}"
    );
    let (status, body) = history(cluster, follower, "").await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"].as_str().is_some_and(|e| e.contains("rule")),
        "{body}"
    );
    let (status, body) = history(cluster, follower, &format!("rule={RULE}&since=yesterday")).await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"].as_str().is_some_and(|e| e.contains("since")),
        "{body}"
    );
    drop(load.stop().await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_keeps_to_itself_diffs_name_versions_and_event_streams_are_capped() {
    let (cluster, leader) = cluster().await;
    let (status, body) = cluster.put_text(leader, &fixed_window_rule(300)).await;
    assert!((200..300).contains(&status), "PUT rules: {status} {body}");

    // The page: a strict content security policy, no framing.
    let page = cluster
        .http
        .get(format!("{}/", cluster.node(leader).url()))
        .send()
        .await
        .expect("page");
    assert_eq!(page.status(), 200);
    let csp = page.headers()["content-security-policy"]
        .to_str()
        .unwrap_or("")
        .to_string();
    assert!(
        csp.contains("script-src 'self'") && csp.contains("frame-ancestors 'none'"),
        "{csp}"
    );
    assert_eq!(page.headers()["x-frame-options"], "DENY");
    let html = page.text().await.expect("html");
    assert!(!html.contains("<script>"), "no inline script");

    // Its scripts: each one the page names is served, under the same
    // policy; together they are the whole script (app.js starts it).
    let scripts: Vec<&str> = html
        .split("<script src=\"")
        .skip(1)
        .filter_map(|tag| tag.split('"').next())
        .collect();
    assert!(
        scripts.len() > 1 && scripts.last() == Some(&"/assets/app.js"),
        "{scripts:?}"
    );
    let mut code = String::new();
    for path in &scripts {
        let script = cluster
            .http
            .get(format!("{}{path}", cluster.node(leader).url()))
            .send()
            .await
            .expect("js");
        assert_eq!(script.status(), 200, "{path}");
        assert_eq!(
            script.headers()["content-type"],
            "text/javascript; charset=utf-8",
            "{path}"
        );
        assert_eq!(script.headers()["content-security-policy"], csp, "{path}");
        assert_eq!(script.headers()["x-content-type-options"], "nosniff");
        code += &script.text().await.expect("js");
    }
    assert!(code.contains("sessionStorage") && code.contains("init();"));
    // Only the embedded files: any other name under /assets/ is 404.
    for path in ["/assets/x.js", "/assets/..%2Fapp.js", "/assets/"] {
        let response = cluster
            .http
            .get(format!("{}{path}", cluster.node(leader).url()))
            .send()
            .await
            .expect("unknown asset");
        assert_eq!(response.status(), 404, "{path}");
    }

    // Diffs.
    let (status, body) = cluster
        .get(leader, "/api/v1/rules/diff?from=1&to=2")
        .await
        .expect("diff");
    assert_eq!(status, 200, "{body}");
    let diff = body["diff"].as_str().unwrap_or("");
    assert!(
        diff.contains("-      requests_per_unit: 200")
            && diff.contains("+      requests_per_unit: 300"),
        "{diff}"
    );
    let (status, body) = cluster
        .get(leader, "/api/v1/rules/diff?from=9&to=2")
        .await
        .expect("diff");
    assert_eq!(status, 404, "{body}");
    assert_eq!(body["field"], "from", "{body}");
    let (status, body) = cluster
        .get(leader, "/api/v1/rules/diff?from=1")
        .await
        .expect("diff");
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"].as_str().is_some_and(|e| e.contains("to")),
        "{body}"
    );

    // Event streams: the first gets an update at once; a flood past the cap
    // is refused with the cap, and a closed stream frees its place. With a
    // token, so that the anonymous bounds (connection_floods.rs) do not
    // stop the flood first.
    let url = format!("{}/api/v1/events", cluster.node(leader).url());
    let open_stream = || cluster.http.get(&url).bearer_auth(TOKEN).send();
    let mut first = open_stream().await.expect("stream");
    assert_eq!(first.status(), 200);
    let chunk = tokio::time::timeout(Duration::from_secs(5), first.chunk())
        .await
        .expect("an update within 5 s")
        .expect("read")
        .expect("a chunk");
    let text = String::from_utf8_lossy(&chunk).to_string();
    assert!(text.starts_with("event: update\ndata: {"), "{text}");
    let cap = meridian_max_streams();
    let mut open = vec![first];
    for _ in 1..cap {
        let r = open_stream().await.expect("stream");
        assert_eq!(r.status(), 200);
        open.push(r);
    }
    let refused = open_stream().await.expect("answer");
    assert_eq!(refused.status(), 503);
    let body: Value = refused.json().await.expect("json");
    assert_eq!(body["max_event_streams"], cap as u64, "{body}");
    drop(open.pop());
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let r = open_stream().await.expect("answer");
        if r.status() == 200 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "a closed stream never freed its place"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Domain `api`, one global sliding-window-counter rule `sw` of `limit`
/// per 2 s.
fn sliding_rule(limit: u64) -> String {
    format!(
        "domain: api
descriptors:
  - key: sw
    scope: global
    fail_mode: closed
    algorithm: sliding_window_counter
    period: 2s
    rate_limit:
      name: sw
      requests_per_unit: {limit}
"
    )
}

async fn ledger(cluster: &Cluster, node: u64, query: &str) -> (u16, Value) {
    cluster
        .get(node, &format!("/api/v1/ledger{query}"))
        .await
        .unwrap_or((0, Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ledger_counts_each_period_world_wide_on_the_leader_and_a_follower_relays() {
    let world = World::start(&sliding_rule(200), &["mumbai", "hyderabad"]).await;
    let load = Load::start(&world, "api", "sw", "acme", &[60, 60]);
    let cluster = &world.cluster;
    let leader = cluster.wait_leader(Duration::from_secs(20)).await;
    let follower = cluster
        .running()
        .into_iter()
        .find(|&id| id != leader)
        .expect("follower");

    // Finished periods, complete, with both regions' admissions in them.
    let deadline = Instant::now() + Duration::from_secs(30);
    let body = loop {
        let (status, body) = ledger(cluster, leader, "?rule=api%7Csw").await;
        let done = body["rules"]["api|sw"]["periods"]
            .as_array()
            .map(|p| {
                p.iter()
                    .filter(|f| {
                        f["complete"] == true
                            && f["regions"]["mumbai"].as_u64() > Some(0)
                            && f["regions"]["hyderabad"].as_u64() > Some(0)
                    })
                    .count()
            })
            .unwrap_or(0);
        if status == 200 && done >= 2 {
            break body;
        }
        assert!(
            Instant::now() < deadline,
            "no 2 complete periods: {status} {body}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let rule = &body["rules"]["api|sw"];
    assert_eq!(
        (rule["limit"].clone(), rule["period_ms"].clone()),
        (serde_json::json!(200), serde_json::json!(2_000)),
        "{rule}"
    );
    assert_eq!(rule["algorithm"], "sliding_window_counter");
    assert!(
        rule["bound_is"]
            .as_str()
            .is_some_and(|b| b.contains("L = 200")),
        "{rule}"
    );
    assert!(
        body["how"]
            .as_str()
            .is_some_and(|h| h.contains("clock-aligned")),
        "{body}"
    );
    for f in rule["periods"].as_array().expect("periods") {
        let admitted = f["admitted"].as_u64().expect("admitted");
        let regions: u64 = f["regions"]
            .as_object()
            .map(|r| r.values().filter_map(Value::as_u64).sum())
            .unwrap_or(0);
        assert_eq!(
            admitted, regions,
            "the world is the sum of its regions: {f}"
        );
        assert_eq!(f["bound"], 200, "{f}");
        // Whether it stayed within L is global_shift's and drills' to say
        // (against the test's own count); here the figure says it itself.
        assert_eq!(f["over_bound"], admitted > 200, "{f}");
        assert_eq!(f["key"], "acme", "{f}");
        assert_eq!(
            f["start_unix_ms"].as_i64().map(|s| s % 2_000),
            Some(0),
            "{f}"
        );
    }
    assert!(
        rule["current"]["start_unix_ms"].as_i64().is_some(),
        "{rule}"
    );

    // A follower relays to the leader.
    let (status, theirs) = ledger(cluster, follower, "").await;
    assert_eq!(status, 200, "{theirs}");
    assert_eq!(theirs["node_id"], leader, "{theirs}");
    assert!(theirs["rules"]["api|sw"].is_object(), "{theirs}");
    // The history carries the same periods, from the leader.
    let (status, history) = history(cluster, follower, "rule=api%7Csw").await;
    assert_eq!(status, 200, "{history}");
    assert!(
        history["world_periods"]
            .as_array()
            .is_some_and(|p| !p.is_empty()),
        "{history}"
    );

    // The gauges, on the leader only.
    let metrics = cluster
        .http
        .get(format!("{}/metrics", cluster.node(leader).url()))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    for name in [
        "meridian_global_admitted{rule=\"api|sw\"}",
        "meridian_global_limit{rule=\"api|sw\"} 200",
        "meridian_global_bound{rule=\"api|sw\"} 200",
        "meridian_global_worst_period_ratio{rule=\"api|sw\"}",
        "meridian_global_periods_over_bound{rule=\"api|sw\"} 0",
    ] {
        if !metrics.contains(name) {
            // Say which period, so a crossing can be traced.
            let (_, now) = ledger(cluster, leader, "?rule=api%7Csw").await;
            panic!("no {name} in:\n{metrics}\nledger: {now}");
        }
    }

    // Errors name what is wrong.
    let (status, body) = ledger(cluster, leader, "?rule=nope").await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(
        body["global_rules"],
        serde_json::json!(["api|sw"]),
        "{body}"
    );
    let (status, body) = ledger(cluster, follower, "?periods=100000").await;
    assert_eq!(
        (status, body["field"].clone()),
        (400, serde_json::json!("periods")),
        "{body}"
    );
    let (status, body) = ledger(cluster, follower, "?bogus=1").await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"].as_str().is_some_and(|e| e.contains("bogus")),
        "{body}"
    );
    drop(load.stop().await);
}

/// The cap the coordinator states (`viewers::MAX_EVENT_STREAMS`), as the 503
/// says it; kept here so a change of the constant shows in this test.
fn meridian_max_streams() -> usize {
    64
}
