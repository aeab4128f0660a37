//! The coordinator's admin API and rule watch against a real 3-node cluster:
//! bad input gets the right status and a clear message, rollout and rollback
//! create versions, followers forward writes, and limiters' WatchRules streams
//! see every change.

use crate::common;

use std::time::Duration;

use common::coordinator::{Cluster, Options, TOKEN, rules_yaml};
use meridian::proto::meridian::v1::coordinator_client::CoordinatorClient;
use meridian::proto::meridian::v1::{RolloutStage, WatchRulesRequest};
use reqwest::Method;
use serde_json::json;

/// A follower of the current leader.
async fn follower(cluster: &Cluster) -> u64 {
    let leader = cluster.wait_leader(Duration::from_secs(10)).await;
    *cluster
        .running()
        .iter()
        .find(|id| **id != leader)
        .expect("a follower")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_clear_errors_and_cluster_keeps_working() {
    let cluster = Cluster::start(3, Options::default()).await;
    let via = follower(&cluster).await;
    let url = format!("{}/api/v1/rules", cluster.node(via).url());
    let good = json!({ "files": { "a.yaml": rules_yaml("api") } });

    // No token, wrong token.
    let r = cluster
        .http
        .put(&url)
        .json(&good)
        .send()
        .await
        .expect("answer");
    assert_eq!(r.status(), 401);
    let body: serde_json::Value = r.json().await.expect("JSON error");
    assert!(
        body["error"].as_str().is_some_and(|e| e.contains("Bearer")),
        "{body}"
    );
    let r = cluster
        .http
        .put(&url)
        .bearer_auth("not-the-token")
        .json(&good)
        .send()
        .await
        .expect("answer");
    assert_eq!(r.status(), 401);

    // A limit below the floor on a counter every caller shares: 422 naming the
    // field and line (the harness runs nodes with --shared-rule-floor 60).
    let below = "domain: api\ndescriptors:\n  - key: path\n    value: /login\n    rate_limit: {unit: minute, requests_per_unit: 5}\n";
    let (status, body) = cluster
        .send(
            via,
            Method::PUT,
            "/api/v1/rules",
            Some(json!({ "files": { "floor.yaml": below } })),
        )
        .await;
    assert_eq!(status, 422, "{body}");
    let issue = &body["issues"][0];
    assert_eq!(
        (issue["file"].as_str(), issue["line"].as_u64()),
        (Some("floor.yaml"), Some(5)),
        "{body}"
    );
    assert_eq!(issue["field"], "requests_per_unit");
    assert!(
        issue["reason"]
            .as_str()
            .is_some_and(|r| r.contains("floor")),
        "{body}"
    );

    // Invalid YAML: 422 naming the file and line.
    let (status, body) = cluster
        .send(
            via,
            Method::PUT,
            "/api/v1/rules",
            Some(
                json!({ "files": { "broken.yaml": "domain: api\ndescriptors: [\n  - key: a\n" } }),
            ),
        )
        .await;
    assert_eq!(status, 422, "{body}");
    let issue = &body["issues"][0];
    assert_eq!(issue["file"], "broken.yaml");
    assert!(issue["line"].as_u64().is_some_and(|l| l >= 2), "{body}");
    assert!(
        issue["reason"].as_str().is_some_and(|r| r.contains("YAML")),
        "{body}"
    );

    // Unknown field and missing domain: each reported with file, line, field.
    let (status, body) = cluster
        .send(
            via,
            Method::PUT,
            "/api/v1/rules",
            Some(json!({ "files": { "typo.yaml": "domian: api\ndescriptors: []\n" } })),
        )
        .await;
    assert_eq!(status, 422, "{body}");
    let issues = body["issues"].as_array().expect("issues");
    assert!(
        issues
            .iter()
            .any(|i| i["field"] == "domian" && i["line"] == 1 && i["file"] == "typo.yaml"),
        "{body}"
    );
    assert!(issues.iter().any(|i| i["field"] == "domain"), "{body}");

    // Unknown JSON field in the request itself.
    let (status, body) = cluster
        .send(
            via,
            Method::PUT,
            "/api/v1/rules",
            Some(json!({ "files": {}, "stgae": "all" })),
        )
        .await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"].as_str().is_some_and(|e| e.contains("stgae")),
        "{body}"
    );

    // A 10 MB body.
    let huge = "#".repeat(10 * 1024 * 1024);
    let r = cluster
        .http
        .put(&url)
        .bearer_auth(TOKEN)
        .header("content-type", "application/yaml")
        .body(huge)
        .send()
        .await
        .expect("answer to a 10 MB body");
    assert_eq!(r.status(), 413);
    let body: serde_json::Value = r.json().await.expect("JSON error");
    assert!(
        body["error"].as_str().is_some_and(|e| e.contains("larger")),
        "{body}"
    );

    // Unknown route, wrong method: JSON too.
    let (status, body) = cluster.get(via, "/api/v1/nope").await.expect("answer");
    assert_eq!(status, 404);
    assert!(body["error"].is_string());
    let (status, body) = cluster
        .send(via, Method::DELETE, "/api/v1/rules", None)
        .await;
    assert_eq!(status, 405, "{body}");

    // Nothing was created; a good write through the follower still works,
    // also as a raw YAML body.
    let (status, _) = cluster.get(via, "/api/v1/rules").await.expect("answer");
    assert_eq!(status, 404);
    let (status, body) = cluster
        .send(via, Method::PUT, "/api/v1/rules", Some(good))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["version"], 1);
    let r = cluster
        .http
        .put(&url)
        .bearer_auth(TOKEN)
        .header("content-type", "application/yaml")
        .body(rules_yaml("raw"))
        .send()
        .await
        .expect("answer");
    assert_eq!(r.status(), 200);
    for id in cluster.running() {
        cluster.wait_version(id, 2, Duration::from_secs(10)).await;
    }
    let (_, body) = cluster
        .get(via, "/api/v1/rules/versions/2")
        .await
        .expect("answer");
    assert_eq!(body["files"]["rules.yaml"], rules_yaml("raw"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollout_and_rollback_create_versions_and_stream_to_limiters() {
    let cluster = Cluster::start(3, Options::default()).await;
    let via = follower(&cluster).await;
    let watcher = *cluster
        .running()
        .iter()
        .find(|id| **id != via)
        .expect("another node");

    // A limiter watching rules on some node.
    let mut client = CoordinatorClient::connect(cluster.node(watcher).grpc_url())
        .await
        .expect("connect to the coordinator's gRPC");
    // A node refuses watches until it has applied the cluster id its
    // leader sets after the first election; a limiter tries again.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut stream = loop {
        match client
            .watch_rules(WatchRulesRequest {
                region: "eu".into(),
            })
            .await
        {
            Ok(stream) => break stream.into_inner(),
            Err(status) if status.code() == tonic::Code::Unavailable => {
                assert!(
                    std::time::Instant::now() < deadline,
                    "watch rules still refused: {status}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(status) => panic!("watch rules: {status}"),
        }
    };
    let first = stream
        .message()
        .await
        .expect("stream")
        .expect("first update");
    assert_eq!(first.current, None, "no version exists yet");

    for (region, body) in [("eu", json!({})), ("us", json!({ "weight": 2.0 }))] {
        let (status, reply) = cluster
            .send(
                via,
                Method::PUT,
                &format!("/api/v1/regions/{region}"),
                Some(body),
            )
            .await;
        assert_eq!(status, 200, "{reply}");
    }
    let (status, body) = cluster
        .send(
            via,
            Method::PUT,
            "/api/v1/regions/Bad Name",
            Some(json!({})),
        )
        .await;
    assert_eq!(status, 422, "{body}");

    let (status, _) = cluster.put_rules(via, "v1").await;
    assert_eq!(status, 200);
    let update = tokio::time::timeout(Duration::from_secs(1), stream.message())
        .await
        .expect("update within 1 s of commit")
        .expect("stream open")
        .expect("an update");
    let current = update.current.expect("current version");
    assert_eq!(current.number, 1);
    assert_eq!(current.stage, RolloutStage::All as i32);
    assert_eq!(current.files[0].text, rules_yaml("v1"));

    // Version 2 in shadow: limiters still enforce version 1 as stable.
    let (status, body) = cluster
        .send(
            via,
            Method::PUT,
            "/api/v1/rules",
            Some(json!({ "files": { "rules.yaml": rules_yaml("v2") }, "stage": "shadow" })),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let update = tokio::time::timeout(Duration::from_secs(1), stream.message())
        .await
        .expect("update within 1 s")
        .expect("stream open")
        .expect("an update");
    assert_eq!(update.current.as_ref().map(|c| c.number), Some(2));
    assert_eq!(
        update.current.as_ref().map(|c| c.stage),
        Some(RolloutStage::Shadow as i32)
    );
    assert_eq!(update.stable.as_ref().map(|s| s.number), Some(1));

    // Canary in an unknown region is refused; in "eu" it is applied.
    let (status, body) = cluster
        .send(
            via,
            Method::POST,
            "/api/v1/rules/rollout",
            Some(json!({ "stage": "canary", "canary_regions": ["mars"] })),
        )
        .await;
    assert_eq!(status, 409, "{body}");
    assert!(
        body["error"].as_str().is_some_and(|e| e.contains("mars")),
        "{body}"
    );
    let (status, body) = cluster
        .send(
            via,
            Method::POST,
            "/api/v1/rules/rollout",
            Some(json!({ "stage": "canary", "canary_regions": ["eu"] })),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let update = stream.message().await.expect("stream").expect("update");
    let current = update.current.expect("current");
    assert_eq!(current.stage, RolloutStage::Canary as i32);
    assert_eq!(current.canary_regions, vec!["eu".to_string()]);

    // Go to all, then roll back: version 3 carries version 1's files.
    let (status, _) = cluster
        .send(
            via,
            Method::POST,
            "/api/v1/rules/rollout",
            Some(json!({ "stage": "all" })),
        )
        .await;
    assert_eq!(status, 200);
    let (status, body) = cluster
        .send(via, Method::POST, "/api/v1/rules/rollback", None)
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["version"], 3);
    let (status, body) = cluster
        .get(via, "/api/v1/rules?consistent=true")
        .await
        .expect("answer");
    assert_eq!(status, 200);
    assert_eq!(body["consistency"], "linearizable");
    assert_eq!(body["current"]["number"], 3);
    assert_eq!(body["current"]["origin"]["of"], 1);
    assert_eq!(body["current"]["files"]["rules.yaml"], rules_yaml("v1"));
    let (status, body) = cluster
        .send(
            via,
            Method::POST,
            "/api/v1/rules/rollback",
            Some(json!({ "to": 42 })),
        )
        .await;
    assert_eq!(status, 404, "{body}");

    // The stream skips nothing that matters: it ends on version 3.
    let mut last = 0;
    while last != 3 {
        let update = tokio::time::timeout(Duration::from_secs(2), stream.message())
            .await
            .expect("update within 2 s")
            .expect("stream")
            .expect("update");
        last = update.current.map_or(0, |c| c.number);
    }

    let (status, body) = cluster
        .get(via, "/api/v1/rules/versions?consistent=true")
        .await
        .expect("answer");
    assert_eq!(status, 200);
    assert_eq!(body["versions"].as_array().map(Vec::len), Some(3));
    let (status, body) = cluster
        .send(via, Method::DELETE, "/api/v1/regions/us", None)
        .await;
    assert_eq!(status, 200, "{body}");
    let (status, _) = cluster
        .get(via, "/api/v1/regions/us?consistent=true")
        .await
        .expect("answer");
    assert_eq!(status, 404);

    let (status, body) = cluster.get(via, "/api/v1/cluster").await.expect("answer");
    assert_eq!(status, 200);
    assert_eq!(body["nodes"].as_array().map(Vec::len), Some(3));
    assert!(
        body["commit_index"].as_u64().is_some_and(|c| c > 0),
        "{body}"
    );
    let (status, body) = cluster.get(via, "/healthz").await.expect("answer");
    assert_eq!(status, 200);
    assert_eq!(body["status"], "ok");
    assert!(cluster.metric(via, "meridian_coordinator_raft_term").await >= 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deeply_nested_yaml_is_refused_with_its_depth_and_the_node_stays_up() {
    let cluster = Cluster::start(1, Options::default()).await;
    for (style, text) in common::deeply_nested_rules() {
        let (status, body) = cluster.put_text(1, &text).await;
        assert_eq!(status, 400, "{style}: {body}");
        let error = body["error"].as_str().unwrap_or_default();
        assert!(
            error.starts_with("rules.yaml:") && error.contains("at most 64"),
            "{style}: {body}"
        );
        assert_eq!(body["max_depth"], 64, "{style}: {body}");
        assert!(body["depth"].as_u64().is_some_and(|d| d > 64), "{body}");
        assert!(body["line"].as_u64().is_some_and(|l| l >= 2), "{body}");
        // The bare-YAML form of the PUT takes the same path.
        let r = cluster
            .http
            .put(format!("{}/api/v1/rules", cluster.node(1).url()))
            .bearer_auth(TOKEN)
            .header("content-type", "application/yaml")
            .body(text)
            .send()
            .await
            .expect("the node answers");
        assert_eq!(r.status(), 400, "{style}, bare YAML");
    }
    let (status, body) = cluster.put_rules(1, "api").await;
    assert_eq!(status, 200, "the node still takes writes: {body}");
    assert_eq!(body["version"], 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollback_to_a_version_below_todays_floor_is_refused() {
    // Version 1 was accepted while the floor was off.
    let mut cluster = Cluster::start(
        1,
        Options {
            shared_rule_floor: 0.0,
            ..Options::default()
        },
    )
    .await;
    let below = "domain: api\ndescriptors:\n  - key: path\n    value: /login\n    rate_limit: {unit: minute, requests_per_unit: 5}\n";
    assert_eq!(cluster.put_text(1, below).await.0, 200);
    assert_eq!(cluster.put_rules(1, "api").await.0, 200);

    cluster.kill(1);
    // 120 a minute: 2 a second, so a bucket needs a burst of at least 2.
    cluster.set_shared_rule_floor(120.0);
    cluster.restart(1);
    cluster.wait_leader(Duration::from_secs(20)).await;

    for body in [Some(json!({ "to": 1 })), None] {
        let (status, answer) = cluster
            .send(1, Method::POST, "/api/v1/rules/rollback", body.clone())
            .await;
        assert_eq!(status, 422, "{body:?}: {answer}");
        let error = answer["error"].as_str().unwrap_or_default();
        for words in [
            "version 1",
            "rule api|path=/login",
            "floor of 120 per minute",
        ] {
            assert!(error.contains(words), "{words:?} missing: {answer}");
        }
        assert_eq!(answer["version"], 1);
        assert_eq!(answer["issues"][0]["field"], "requests_per_unit");
    }
    let (_, versions) = cluster
        .get(1, "/api/v1/rules/versions")
        .await
        .expect("answer");
    assert_eq!(
        versions["versions"].as_array().map(Vec::len),
        Some(2),
        "a refused rollback commits nothing: {versions}"
    );
    // A target that passes today's checks still rolls back.
    let (status, answer) = cluster
        .send(
            1,
            Method::POST,
            "/api/v1/rules/rollback",
            Some(json!({ "to": 2 })),
        )
        .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["version"], 3);

    // The floor counts a bucket's burst: 6,000 a minute, but one at a time.
    let one_at_a_time = "domain: api\ndescriptors:\n  - key: path\n    value: /login\n    algorithm: token_bucket\n    burst: 1\n    rate_limit: {unit: minute, requests_per_unit: 6000}\n";
    let (status, answer) = cluster.put_text(1, one_at_a_time).await;
    assert_eq!(status, 422, "{answer}");
    assert_eq!(answer["issues"][0]["field"], "burst", "{answer}");
    let reason = answer["issues"][0]["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("burst 1") && reason.contains("at least 2"),
        "{answer}"
    );
}

/// The audit's three rules (issue 28), with `extra` beside each rate_limit:
/// a ban of the shared `/login` counter, a ban of every customer, and every
/// path allowed once a year.
fn key_space_bans(extra: &str) -> [(&'static str, String); 3] {
    [
        (
            "shared /login at 0",
            format!(
                "domain: api\ndescriptors:\n  - key: path\n    value: /login\n{extra}    rate_limit: {{unit: minute, requests_per_unit: 0}}\n"
            ),
        ),
        (
            "every customer at 0",
            format!(
                "domain: api\ndescriptors:\n  - key: customer\n{extra}    rate_limit: {{unit: minute, requests_per_unit: 0}}\n"
            ),
        ),
        (
            "every path once a year",
            format!(
                "domain: api\ndescriptors:\n  - key: path\n{extra}    rate_limit: {{unit: year, requests_per_unit: 1}}\n"
            ),
        ),
    ]
}

/// With `--shared-rule-floor 600` each of the audit's rules was accepted (a
/// limit of 0 has no params, so the floor skipped it; key-only rules were
/// never held to anything). Now each is refused naming its field and the
/// confirmation, passes with `confirm_ban: true`, and a rollback to a
/// version with an unconfirmed ban is refused as a put is; one whose ban
/// was confirmed rolls back, the confirmation being part of the version.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bans_of_a_key_space_need_confirm_ban_on_put_and_rollback() {
    // Version 1, an unconfirmed ban, was accepted while the floor was off.
    let mut cluster = Cluster::start(
        1,
        Options {
            shared_rule_floor: 0.0,
            ..Options::default()
        },
    )
    .await;
    let unconfirmed = key_space_bans("")[1].1.clone();
    assert_eq!(cluster.put_text(1, &unconfirmed).await.0, 200);
    cluster.kill(1);
    cluster.set_shared_rule_floor(600.0);
    cluster.restart(1);
    cluster.wait_leader(Duration::from_secs(20)).await;

    for (case, text) in key_space_bans("") {
        let (status, body) = cluster.put_text(1, &text).await;
        assert_eq!(status, 422, "{case}: {body}");
        let issue = &body["issues"][0];
        assert_eq!(issue["field"], "requests_per_unit", "{case}: {body}");
        assert_eq!(issue["file"], "rules.yaml", "{case}: {body}");
        let reason = issue["reason"].as_str().unwrap_or_default();
        assert!(
            reason.contains("confirm_ban: true") && reason.contains("rule api|"),
            "{case}: {body}"
        );
    }
    let mut confirmed = Vec::new();
    for (case, text) in key_space_bans("    confirm_ban: true\n") {
        let (status, body) = cluster.put_text(1, &text).await;
        assert_eq!(status, 200, "{case}: {body}");
        confirmed.push(body["version"].as_u64().expect("version"));
    }

    let (status, answer) = cluster
        .send(
            1,
            Method::POST,
            "/api/v1/rules/rollback",
            Some(json!({ "to": 1 })),
        )
        .await;
    assert_eq!(status, 422, "{answer}");
    let error = answer["error"].as_str().unwrap_or_default();
    for words in [
        "rollback to version 1 refused",
        "requests_per_unit",
        "confirm_ban: true",
    ] {
        assert!(error.contains(words), "{words:?} missing: {answer}");
    }
    assert_eq!(answer["issues"][0]["field"], "requests_per_unit");
    let (status, answer) = cluster
        .send(
            1,
            Method::POST,
            "/api/v1/rules/rollback",
            Some(json!({ "to": confirmed[0] })),
        )
        .await;
    assert_eq!(status, 200, "a confirmed ban rolls back: {answer}");
}

/// Issue 28, item 9: `--insecure` was checked against loopback only at
/// start, so a member on another host was accepted and replicated to in
/// plaintext.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_insecure_cluster_refuses_a_member_off_loopback_naming_the_field() {
    let cluster = Cluster::start(1, Options::default()).await;
    let leader = cluster.wait_leader(Duration::from_secs(20)).await;
    for (field, body) in [
        (
            "raft_addr",
            json!({"id": 7, "raft_addr": "10.20.30.40:7001", "http_addr": "127.0.0.1:7002"}),
        ),
        (
            "http_addr",
            json!({"id": 7, "raft_addr": "127.0.0.1:7001", "http_addr": "node-7.example:7002"}),
        ),
    ] {
        let (status, reply) = cluster
            .send(leader, Method::POST, "/api/v1/cluster/nodes", Some(body))
            .await;
        assert_eq!(status, 400, "{field}: {reply}");
        let error = reply["error"].as_str().unwrap_or_default();
        assert!(
            error.starts_with(field) && error.contains("--insecure"),
            "{field}: {reply}"
        );
    }
    let (_, state) = cluster
        .get(leader, "/api/v1/cluster")
        .await
        .expect("the node answers");
    assert_eq!(
        state["nodes"].as_array().map(Vec::len),
        Some(1),
        "membership unchanged: {state}"
    );
}
