//! Starts `meridian limiter` as a real process on free ports and kills it on
//! drop (also when a test panics).

use std::io::Read;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStderr, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use tempfile::TempDir;

pub struct LimiterProcess {
    child: Child,
    /// The limiter's stderr when started with [`LimiterProcess::start_logging`];
    /// otherwise it goes to the test's own.
    logs: Option<ChildStderr>,
    pub grpc: SocketAddr,
    pub http: SocketAddr,
    pub rules: PathBuf,
    _dir: TempDir,
}

impl LimiterProcess {
    /// Writes `rules` to a temp file and starts a limiter on it with `args`
    /// (e.g. `["--redis", url]` or `["--store", "memory"]`).
    pub fn start(rules: &str, args: &[&str]) -> LimiterProcess {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("rules.yaml");
        std::fs::write(&path, rules).expect("write rules");
        let config = ["--config", path.to_str().expect("utf-8 temp path")];
        let all: Vec<&str> = config.iter().chain(args).copied().collect();
        LimiterProcess::spawn(&all, path.clone(), dir, false, &[])
    }

    /// [`LimiterProcess::start`] with extra environment variables.
    pub fn start_with_env(rules: &str, args: &[&str], env: &[(&str, &str)]) -> LimiterProcess {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("rules.yaml");
        std::fs::write(&path, rules).expect("write rules");
        let config = ["--config", path.to_str().expect("utf-8 temp path")];
        let all: Vec<&str> = config.iter().chain(args).copied().collect();
        LimiterProcess::spawn(&all, path.clone(), dir, false, env)
    }

    /// [`LimiterProcess::start`] with its info logs on a pipe (not a
    /// terminal), read by [`LimiterProcess::terminate_reading_logs`].
    pub fn start_logging(rules: &str, args: &[&str]) -> LimiterProcess {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("rules.yaml");
        std::fs::write(&path, rules).expect("write rules");
        let config = ["--config", path.to_str().expect("utf-8 temp path")];
        let all: Vec<&str> = config.iter().chain(args).copied().collect();
        LimiterProcess::spawn(&all, path.clone(), dir, true, &[])
    }

    /// Starts a limiter with exactly `args` (e.g. `--coordinator …` instead of
    /// `--config`); `dir` is a temp dir the test may use for caches.
    pub fn start_without_rules(args: &[&str]) -> LimiterProcess {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("rules.yaml");
        LimiterProcess::spawn(args, path, dir, false, &[])
    }

    /// [`LimiterProcess::start_without_rules`] with its info logs on a pipe,
    /// read by [`LimiterProcess::terminate_reading_logs`].
    pub fn start_without_rules_logging(args: &[&str]) -> LimiterProcess {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("rules.yaml");
        LimiterProcess::spawn(args, path, dir, true, &[])
    }

    fn spawn(
        args: &[&str],
        path: PathBuf,
        dir: TempDir,
        capture_logs: bool,
        env: &[(&str, &str)],
    ) -> LimiterProcess {
        let log = if capture_logs {
            "meridian=info".to_string()
        } else {
            std::env::var("MERIDIAN_TEST_LOG").unwrap_or_else(|_| "meridian=warn".into())
        };
        // A limiter following coordinators needs TLS flags or --insecure;
        // tests that do not give TLS flags run plaintext on loopback.
        let follows = args.contains(&"--coordinator");
        let tls_given = args
            .iter()
            .any(|a| a.starts_with("--tls-") || *a == "--insecure");
        let insecure: &[&str] = if follows && !tls_given {
            &["--insecure"]
        } else {
            &[]
        };
        let mut child = Command::new(super::meridian_bin())
            .arg("limiter")
            .args(["--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"])
            .args(["--reload-interval", "100ms"])
            .args(insecure)
            .args(args)
            .env("RUST_LOG", log)
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(if capture_logs {
                Stdio::piped()
            } else {
                Stdio::inherit()
            })
            .spawn()
            .expect("spawn meridian limiter");
        let logs = child.stderr.take();
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let line = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("limiter did not print its listening line within 20 s");
        let addr = |name: &str| -> SocketAddr {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(name))
                .and_then(|a| a.parse().ok())
                .unwrap_or_else(|| panic!("no {name} in {line:?}"))
        };
        LimiterProcess {
            grpc: addr("grpc="),
            http: addr("http="),
            child,
            logs,
            rules: path,
            _dir: dir,
        }
    }

    pub fn grpc_url(&self) -> String {
        format!("http://{}", self.grpc)
    }

    pub fn http_url(&self, path: &str) -> String {
        format!("http://{}{path}", self.http)
    }

    /// POSTs `body` as JSON to `path` on the HTTP port: the status and the
    /// JSON answer.
    pub async fn post_json(
        &self,
        client: &reqwest::Client,
        path: &str,
        body: serde_json::Value,
    ) -> (u16, serde_json::Value) {
        let response = client
            .post(self.http_url(path))
            .json(&body)
            .send()
            .await
            .expect("limiter answers");
        let status = response.status().as_u16();
        (status, response.json().await.expect("a JSON body"))
    }

    pub fn rules_path(&self) -> &Path {
        &self.rules
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends SIGTERM and waits for the exit status.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        self.child.wait().expect("wait for limiter")
    }

    /// SIGTERM, then everything the limiter logged (started with
    /// [`LimiterProcess::start_logging`]) and its exit status.
    pub fn terminate_reading_logs(&mut self) -> (std::process::ExitStatus, String) {
        let mut logs = self.logs.take().expect("started with start_logging");
        let status = self.terminate();
        let mut text = String::new();
        logs.read_to_string(&mut text)
            .expect("read the limiter's stderr");
        (status, text)
    }

    /// SIGKILL, as a crashed or OOM-killed pod dies: no shutdown path runs,
    /// nothing is flushed or said goodbye to. Waits for the exit.
    pub fn kill(&mut self) -> std::process::ExitStatus {
        let _ = self.child.kill();
        self.child.wait().expect("wait for limiter")
    }

    /// The exit status once the process has exited on its own.
    pub fn exit_status(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for LimiterProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Domain `api`, one rule on `user`: `limit` per hour (the rules the
/// coordinator-fed tests put and probe).
pub fn user_rules(limit: u32) -> String {
    format!(
        "domain: api\ndescriptors:\n  - key: user\n    rate_limit:\n      unit: hour\n      requests_per_unit: {limit}\n"
    )
}

/// The limit the limiter reports for `user=<key>` in domain `api` (None: no
/// rule matched, or no answer), and whether the check was admitted.
pub async fn probe_user(limiter: &LimiterProcess, key: &str) -> Option<(u32, bool)> {
    use meridian::proto::envoy::extensions::common::ratelimit::v3::{
        RateLimitDescriptor, rate_limit_descriptor::Entry,
    };
    use meridian::proto::envoy::service::ratelimit::v3::RateLimitRequest;
    use meridian::proto::envoy::service::ratelimit::v3::rate_limit_response::Code;
    use meridian::proto::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
    let mut client = RateLimitServiceClient::connect(limiter.grpc_url())
        .await
        .ok()?;
    let r = client
        .should_rate_limit(RateLimitRequest {
            domain: "api".into(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry {
                    key: "user".into(),
                    value: key.into(),
                }],
                ..Default::default()
            }],
            hits_addend: 0,
        })
        .await
        .ok()?
        .into_inner();
    let status = r.statuses.first()?;
    let limit = status.current_limit.as_ref()?.requests_per_unit;
    Some((limit, status.code == Code::Ok as i32))
}

/// Waits until the limiter enforces `limit` for `user`; how long it took.
pub async fn wait_for_user_limit(
    limiter: &LimiterProcess,
    limit: u32,
    within: Duration,
) -> Duration {
    let started = std::time::Instant::now();
    let mut n = 0;
    loop {
        n += 1;
        let key = format!("probe-{limit}-{n}");
        if probe_user(limiter, &key).await.map(|p| p.0) == Some(limit) {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < within,
            "limit {limit} not enforced within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
