//! A limiter on Redis Sentinel (`redis+sentinel://`) follows a failover: the
//! master is killed (kill -9), the sentinels promote the replica, and the
//! limiter's checks are decided on the new master again.

use crate::common;

use std::time::{Duration, Instant};

use common::limiter::LimiterProcess;
use common::sentinel::{PASSWORD, RedisSentinels};
use serde_json::{Value, json};

/// fail_mode: open, so a denial can only come from Redis.
const RULES: &str = "domain: api\ndescriptors:\n  - key: user\n    fail_mode: open\n    rate_limit: {name: per-user, unit: hour, requests_per_unit: 3}\n";

async fn check(client: &reqwest::Client, limiter: &LimiterProcess, user: &str) -> Value {
    client
        .post(limiter.http_url("/v1/check"))
        .json(&json!({"domain": "api", "descriptor": [{"key": "user", "value": user}]}))
        .send()
        .await
        .expect("the limiter answers every check")
        .json()
        .await
        .expect("a JSON decision")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_master_is_replaced_and_the_limiter_follows_the_new_one() {
    let mut redis = RedisSentinels::start();
    let dir = tempfile::tempdir().expect("temp dir");
    let password = dir.path().join("redis-password");
    std::fs::write(&password, PASSWORD).expect("write the password file");
    std::fs::set_permissions(
        &password,
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .expect("chmod 600 the password file");
    let limiter = LimiterProcess::start(
        RULES,
        &[
            "--redis",
            &redis.url(),
            "--redis-password-file",
            &password.to_string_lossy(),
        ],
    );
    let client = common::http_client().build().expect("HTTP client");

    for hit in 1..=4 {
        let d = check(&client, &limiter, "before").await;
        assert_eq!(d["allowed"], hit <= 3, "hit {hit} before the failover: {d}");
    }
    let master = redis.data[0].port();
    let replica = redis.data[1].port();
    assert_eq!(redis.master_port(), Some(master));
    let counted: Option<String> = redis::cmd("GET")
        .arg("mr:{per-user:before}")
        .query(&mut redis.connection(0))
        .ok();
    let keys: usize = redis::cmd("DBSIZE")
        .query(&mut redis.connection(0))
        .expect("DBSIZE");
    assert!(
        keys > 0,
        "the checks were not counted on the master ({counted:?})"
    );

    redis.data[0].kill();
    let killed = Instant::now();
    redis.wait_for_master(replica, Duration::from_secs(20));
    let promoted = killed.elapsed();

    // Each round uses a fresh user, so a round that straddles the switch
    // (some hits failed open) does not spoil the next.
    let mut round = 0;
    let followed = loop {
        round += 1;
        let user = format!("after-{round}");
        let mut decided = Vec::new();
        for _ in 0..4 {
            decided.push(check(&client, &limiter, &user).await);
        }
        let allowed: Vec<bool> = decided.iter().map(|d| d["allowed"] == true).collect();
        if allowed == [true, true, true, false] {
            break killed.elapsed();
        }
        assert!(
            killed.elapsed() < Duration::from_secs(20),
            "the limiter did not follow the new master: {decided:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let on_new_master: usize = redis::cmd("DBSIZE")
        .query(&mut redis.connection(1))
        .expect("DBSIZE on the new master");
    assert!(on_new_master > 0, "nothing counted on the new master");
    eprintln!(
        "sentinel failover: replica promoted {promoted:?} after kill -9, \
         limiter deciding on it {followed:?} after"
    );
}
