//! Starts `meridian limiter` as a real process on free ports and kills it on
//! drop (also when a test panics).

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use tempfile::TempDir;

pub struct LimiterProcess {
    child: Child,
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
        LimiterProcess::spawn(&all, path.clone(), dir)
    }

    /// Starts a limiter with exactly `args` (e.g. `--coordinator …` instead of
    /// `--config`); `dir` is a temp dir the test may use for caches.
    pub fn start_without_rules(args: &[&str]) -> LimiterProcess {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("rules.yaml");
        LimiterProcess::spawn(args, path, dir)
    }

    fn spawn(args: &[&str], path: PathBuf, dir: TempDir) -> LimiterProcess {
        let mut child = Command::new(env!("CARGO_BIN_EXE_meridian"))
            .arg("limiter")
            .args(["--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"])
            .args(["--reload-interval", "100ms"])
            .args(args)
            .env(
                "RUST_LOG",
                std::env::var("MERIDIAN_TEST_LOG").unwrap_or_else(|_| "meridian=warn".into()),
            )
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn meridian limiter");
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
