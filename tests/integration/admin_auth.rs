//! The admin API's credentials: tokens from files, checked from the headers
//! before a body is read, refusals slowed and counted, reads closed by a read
//! token; the Redis password from a file and never in an error. (The
//! connection cap and its deadlines: `connection_floods.rs`.)

use crate::common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::coordinator::{Cluster, Options, TOKEN};
use common::limiter::LimiterProcess;
use common::{RedisServer, meridian_bin};

/// Sends `request` on a fresh connection and returns what comes back within
/// `within` (empty when nothing does).
fn raw(addr: &str, request: &str, within: Duration) -> (String, Duration) {
    let mut stream = TcpStream::connect(addr).expect("connect to the admin API");
    stream.set_read_timeout(Some(within)).expect("read timeout");
    let start = Instant::now();
    stream.write_all(request.as_bytes()).expect("send");
    let mut buf = [0u8; 4096];
    let n = stream.read(&mut buf).unwrap_or(0);
    (
        String::from_utf8_lossy(&buf[..n]).into_owned(),
        start.elapsed(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_token_is_refused_from_the_headers_before_any_body_slowly_and_counted() {
    let cluster = Cluster::start(1, Options::default()).await;
    let addr = cluster.node(1).http_addr.clone();
    // A megabyte announced, not one byte of it sent: the answer must come
    // from the headers alone.
    let request = format!(
        "PUT /api/v1/rules HTTP/1.1\r\nhost: {addr}\r\nauthorization: Bearer wrong-token-of-16\r\n\
         content-type: application/x-yaml\r\ncontent-length: 1000000\r\n\r\n"
    );
    let (answer, took) = raw(&addr, &request, Duration::from_secs(5));
    assert!(
        answer.starts_with("HTTP/1.1 401"),
        "no 401 before the body arrived (after {took:?}): {answer:?}"
    );
    assert!(answer.contains("wrong admin token"), "{answer}");
    assert!(
        took >= Duration::from_millis(450),
        "a refused token was answered in {took:?}, not slowed down"
    );
    let missing = format!(
        "POST /api/v1/rules/rollback HTTP/1.1\r\nhost: {addr}\r\ncontent-length: 0\r\n\r\n"
    );
    let (answer, _) = raw(&addr, &missing, Duration::from_secs(5));
    assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
    let wrong = cluster
        .metric(
            1,
            "meridian_coordinator_auth_failures_total{kind=\"admin\",reason=\"wrong\"}",
        )
        .await;
    let none = cluster
        .metric(
            1,
            "meridian_coordinator_auth_failures_total{kind=\"admin\",reason=\"missing\"}",
        )
        .await;
    assert_eq!((wrong, none), (1.0, 1.0), "refusals not counted");
    // The right token still writes.
    let (status, body) = cluster.put_rules(1, "api").await;
    assert_eq!(status, 200, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_read_token_reads_need_it_and_probes_stay_open() {
    let dir = tempfile::tempdir().expect("temp dir");
    let read_token = dir.path().join("read-token");
    std::fs::write(&read_token, "read-token-0123456789\n").expect("write");
    let options = Options {
        extra_args: vec![
            "--read-token-file".into(),
            read_token.to_string_lossy().into_owned(),
        ],
        ..Options::default()
    };
    let cluster = Cluster::start(1, options).await;
    let url = cluster.node(1).url();
    let get = |path: &str, token: Option<&str>| {
        let mut req = cluster.http.get(format!("{url}{path}"));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        req.send()
    };
    for path in [
        "/api/v1/leases",
        "/api/v1/cluster",
        "/api/v1/rules",
        "/api/v1/regions",
    ] {
        let status = get(path, None).await.map(|r| r.status().as_u16());
        assert_eq!(
            status.ok(),
            Some(401),
            "{path} answered without the read token"
        );
        let status = get(path, Some("read-token-0123456789"))
            .await
            .map(|r| r.status().as_u16());
        assert_ne!(status.ok(), Some(401), "{path} refused the read token");
        let status = get(path, Some(TOKEN)).await.map(|r| r.status().as_u16());
        assert_ne!(status.ok(), Some(401), "{path} refused the admin token");
    }
    for path in ["/healthz", "/metrics"] {
        let status = get(path, None).await.map(|r| r.status().as_u16());
        assert_eq!(status.ok(), Some(200), "{path} needs no token");
    }
}

#[test]
fn a_missing_or_short_admin_token_stops_the_coordinator_with_the_reason() {
    let dir = tempfile::tempdir().expect("temp dir");
    let short = dir.path().join("short");
    std::fs::write(&short, "s3cret").expect("write");
    let run = |token_args: &[&str]| {
        let out = Command::new(meridian_bin())
            .arg("coordinator")
            .args([
                "--id",
                "1",
                "--raft-addr",
                "127.0.0.1:1",
                "--http-addr",
                "127.0.0.1:2",
            ])
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .args(token_args)
            .env_remove("MERIDIAN_ADMIN_TOKEN")
            .stdin(Stdio::null())
            .output()
            .expect("run meridian coordinator");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, stderr) = run(&["--admin-token-file", &short.to_string_lossy()]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("at least 16"), "{stderr}");
    assert!(
        !stderr.contains("s3cret"),
        "the token was printed: {stderr}"
    );
    let (code, stderr) = run(&[]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("--admin-token-file"), "{stderr}");
}

#[tokio::test]
async fn the_redis_password_comes_from_a_file_and_never_appears_in_an_error() {
    let redis = RedisServer::start_with(&["--requirepass", "pa55-w0rd-in-a-file"]);
    let dir = tempfile::tempdir().expect("temp dir");
    let password = dir.path().join("redis-password");
    std::fs::write(&password, "pa55-w0rd-in-a-file\n").expect("write");
    let rules = "domain: api\ndescriptors:\n  - key: k\n    rate_limit: {name: r, unit: minute, requests_per_unit: 5}\n";
    let url = format!("redis://127.0.0.1:{}", redis.port());
    let limiter = LimiterProcess::start(
        rules,
        &[
            "--redis",
            &url,
            "--redis-password-file",
            &password.to_string_lossy(),
        ],
    );
    let answer: serde_json::Value = common::http_client()
        .build()
        .expect("HTTP client")
        .post(limiter.http_url("/v1/check"))
        .json(&serde_json::json!({"domain": "api", "rule": "r", "key": "a"}))
        .send()
        .await
        .expect("POST /v1/check")
        .json()
        .await
        .expect("JSON answer");
    assert_eq!(
        answer["remaining"], 4,
        "not counted in the authenticated Redis: {answer}"
    );
    drop(limiter);

    let wrong = format!("redis://:wrong-s3cret-pass@127.0.0.1:{}", redis.port());
    let rules_file = dir.path().join("rules.yaml");
    std::fs::write(&rules_file, rules).expect("write rules");
    let out = Command::new(meridian_bin())
        .arg("limiter")
        .arg("--config")
        .arg(&rules_file)
        .args([
            "--redis",
            &wrong,
            "--grpc-addr",
            "127.0.0.1:0",
            "--http-addr",
            "127.0.0.1:0",
        ])
        .stdin(Stdio::null())
        .output()
        .expect("run meridian limiter");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "started with a wrong password: {stderr}"
    );
    assert!(stderr.contains("redis://:***@127.0.0.1"), "{stderr}");
    assert!(
        !stderr.contains("wrong-s3cret-pass"),
        "the password was printed: {stderr}"
    );
}

/// Issue 28, item 8: refusals were slowed per request only, so concurrent
/// requests from one address guessed ~560 tokens a second. Now an address
/// has its tokens compared at most 20 times a second (burst 20); past that
/// it is answered 429 without a comparison, then served again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_address_gets_at_most_twenty_refused_tokens_a_second() {
    let cluster = Cluster::start(1, Options::default()).await;
    cluster.wait_leader(Duration::from_secs(20)).await;
    let url = format!("{}/api/v1/regions/guess", cluster.node(1).url());
    let started = Instant::now();
    let run_for = Duration::from_secs(2);
    let mut guessers = Vec::new();
    for i in 0..64 {
        let (http, url) = (cluster.http.clone(), url.clone());
        guessers.push(tokio::spawn(async move {
            let (mut compared, mut throttled) = (0u32, 0u32);
            while started.elapsed() < run_for {
                let r = http
                    .put(&url)
                    .bearer_auth(format!("guess-{i:04}-{:012}", compared + throttled))
                    .json(&serde_json::json!({"weight": 1}))
                    .send()
                    .await;
                let r = r.map(|r| {
                    let retry = r.headers().get("retry-after").cloned();
                    (r.status().as_u16(), retry)
                });
                match r.as_ref().map(|(status, _)| *status) {
                    Ok(401) => compared += 1,
                    Ok(429) => {
                        // Not compared, whatever the token: try again in 1 s.
                        let retry = r.as_ref().ok().and_then(|(_, h)| h.clone());
                        assert_eq!(retry.as_ref().and_then(|h| h.to_str().ok()), Some("1"));
                        throttled += 1;
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    Ok(other) => panic!("a wrong token got {other}"),
                    Err(e) => panic!("request failed: {e}"),
                }
            }
            (compared, throttled)
        }));
    }
    let (mut compared, mut throttled) = (0, 0);
    for g in guessers {
        let (c, t) = g.await.expect("guesser");
        compared += c;
        throttled += t;
    }
    let seconds = started.elapsed().as_secs_f64();
    eprintln!("{compared} tokens compared, {throttled} throttled in {seconds:.1} s");
    // Burst 20, then 20 a second (the last requests may finish late).
    let most = 20.0 + 20.0 * (seconds + 0.5);
    assert!(
        f64::from(compared) <= most,
        "{compared} tokens compared in {seconds:.1} s from one address (at most {most:.0})"
    );
    assert!(throttled > 0, "no request was throttled");
    // A second later the budget has refilled: the admin is served.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let r = cluster
        .http
        .put(&url)
        .bearer_auth(TOKEN)
        .json(&serde_json::json!({"weight": 1}))
        .send()
        .await
        .expect("request");
    assert_eq!(r.status().as_u16(), 200, "{:?}", r.text().await);
}
