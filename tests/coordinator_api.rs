//! The coordinator's admin API and rule watch against a real 3-node cluster:
//! bad input gets the right status and a clear message, rollout and rollback
//! create versions, followers forward writes, and limiters' WatchRules streams
//! see every change.

mod common;

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
    let mut stream = client
        .watch_rules(WatchRulesRequest {
            region: "eu".into(),
        })
        .await
        .expect("watch rules")
        .into_inner();
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
