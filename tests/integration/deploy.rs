//! The files in `deploy/` as an operator uses them: every Kubernetes overlay
//! renders with `kubectl kustomize` and validates against the Kubernetes
//! schemas, the compose file has the services and ports its header promises,
//! every flag the files pass exists in the binary, Prometheus's config and
//! the alert rules pass `promtool` (their unit tests included), and a real
//! Prometheus scraping `meridian demo` finds at least one series for every
//! Grafana panel query and every alert expression. Where Docker runs, the
//! image builds and the compose stack starts; where it does not, the test
//! says so on stderr.

use crate::common;
use crate::docs_links::heading_anchors;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use marked_yaml::Node;

/// How to get each external tool, for the failure message.
const KUBECTL_HINT: &str = "install kubectl (Debian: `sudo apt-get install -y kubernetes-client`), \
     or run scripts/test.sh, which installs it";
const KUBERNETES_VALIDATE_HINT: &str = "install it with `python3 -m pip install kubernetes-validate==1.37.0`, \
     or run scripts/test.sh, which installs it";
const PROMETHEUS_HINT: &str = "install Prometheus and promtool (Debian: `sudo apt-get install -y prometheus`), \
     or run scripts/test.sh, which installs them";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Fails (never skips) when `tool` cannot run, naming how to install it.
fn require(tool: &str, probe: &[&str], hint: &str) {
    let ran = Command::new(tool)
        .args(probe)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    assert!(
        ran.is_ok_and(|s| s.success()),
        "`{tool}` is needed by this test and was not found on PATH: {hint}"
    );
}

/// Runs `cmd` and returns its output; fails with its stderr when it fails.
fn run(cmd: &mut Command) -> Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{cmd:?} did not start: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn yaml(path: &Path) -> Node {
    marked_yaml::parse_yaml(0, read(path))
        .unwrap_or_else(|e| panic!("{}: not YAML: {e}", path.display()))
}

/// The `--flags` named in `text` (a command line, a script, a manifest).
fn flags_in(text: &str) -> BTreeSet<String> {
    let mut flags = BTreeSet::new();
    let bytes = text.as_bytes();
    let mut i = 0;
    while let Some(at) = text[i..].find("--") {
        let start = i + at;
        let before_ok =
            start == 0 || matches!(bytes[start - 1], b' ' | b'\n' | b'"' | b'\'' | b'[' | b'(');
        let name: String = text[start + 2..]
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-')
            .collect();
        if before_ok && name.starts_with(|c: char| c.is_ascii_lowercase()) {
            flags.insert(format!("--{name}"));
        }
        i = start + 2 + name.len();
    }
    flags
}

/// The flags `meridian ARGS --help` lists.
fn help_flags(args: &[&str]) -> BTreeSet<String> {
    let out = run(Command::new(common::meridian_bin())
        .args(args)
        .arg("--help"));
    flags_in(&String::from_utf8_lossy(&out.stdout))
}

fn assert_flags_exist(what: &str, used: &BTreeSet<String>, command: &[&str]) {
    let known = help_flags(command);
    let unknown: Vec<&String> = used.difference(&known).collect();
    assert!(
        unknown.is_empty(),
        "{what} passes {unknown:?}, which `meridian {} --help` does not list",
        command.join(" ")
    );
}

fn scalars(node: Option<&Node>) -> Vec<String> {
    node.and_then(Node::as_sequence)
        .map(|seq| {
            seq.iter()
                .filter_map(|n| n.as_scalar().map(|s| s.as_str().to_owned()))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn every_overlay_renders_and_validates_against_the_kubernetes_schemas() {
    require("kubectl", &["version", "--client"], KUBECTL_HINT);
    require(
        "kubernetes-validate",
        &["--version"],
        KUBERNETES_VALIDATE_HINT,
    );
    let overlays = repo().join("deploy/k8s/overlays");
    let dir = tempfile::tempdir().expect("temp dir");
    let mut rendered = Vec::new();
    for entry in std::fs::read_dir(&overlays).expect("deploy/k8s/overlays") {
        let overlay = entry.expect("overlay").path();
        let name = overlay
            .file_name()
            .expect("name")
            .to_string_lossy()
            .to_string();
        let out = run(Command::new("kubectl").arg("kustomize").arg(&overlay));
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        let file = dir.path().join(format!("{name}.yaml"));
        std::fs::write(&file, &text).expect("write the rendered overlay");
        // --strict: a misspelt field is an error, not a silently dropped key.
        run(Command::new("kubernetes-validate")
            .args(["--strict", "--quiet"])
            .arg(&file));
        rendered.push((name, text));
    }
    let names: Vec<&str> = rendered.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names.len(), 2, "two region overlays: {names:?}");
    for (name, text) in &rendered {
        for wanted in [
            "kind: Deployment\n",
            "kind: HorizontalPodAutoscaler",
            "kind: PodDisruptionBudget",
            "path: /readyz",
            "preStop:",
            "maxmemory-policy volatile-lfu",
            "lfu-log-factor 0",
            "lfu-decay-time 0",
            "secretName: meridian-region-tls",
            "secretName: meridian-redis-auth",
            &format!("REGION: {name}"),
        ] {
            assert!(text.contains(wanted), "overlay {name} lacks {wanted:?}");
        }
        // The grace period covers the preStop sleep, the drain and the last
        // report (4 s, the limiter's control deadline).
        let after = |marker: &str| -> String {
            text.split(marker)
                .nth(1)
                .and_then(|s| s.lines().next())
                .map(|l| {
                    l.trim()
                        .trim_start_matches("- ")
                        .trim_matches('"')
                        .to_owned()
                })
                .unwrap_or_else(|| panic!("{name}: no {marker:?}"))
        };
        let pre_stop: u64 = after("- /bin/sleep\n").parse().expect("preStop seconds");
        let drain = after("- --drain-timeout\n");
        let drain: u64 = drain
            .strip_suffix('s')
            .and_then(|d| d.parse().ok())
            .unwrap_or_else(|| panic!("{name}: --drain-timeout {drain}"));
        let grace: u64 = text
            .split("terminationGracePeriodSeconds: ")
            .nth(1)
            .and_then(|s| s.lines().next())
            .and_then(|s| s.trim().parse().ok())
            .expect("terminationGracePeriodSeconds");
        assert_eq!(
            pre_stop, drain,
            "{name}: the preStop matches --drain-timeout"
        );
        assert!(
            grace >= pre_stop + drain + 4,
            "{name}: grace {grace}s < preStop {pre_stop}s + drain {drain}s + report 4s"
        );
    }
    let mumbai = &rendered
        .iter()
        .find(|(n, _)| n == "mumbai")
        .expect("mumbai overlay")
        .1;
    for wanted in [
        "kind: StatefulSet",
        "volumeClaimTemplates:",
        "clusterIP: None",
        "podAntiAffinity:",
        "--init \"$(peer 0),$(peer 1),$(peer 2)\"",
        "--join \"https://meridian-coordinator-0.${domain}:7902\"",
        "secretName: meridian-coordinator-tls",
        "secretName: meridian-admin-token",
    ] {
        assert!(mumbai.contains(wanted), "the coordinators lack {wanted:?}");
    }
}

#[test]
fn the_deploy_files_pass_only_flags_the_binary_has() {
    let k8s = repo().join("deploy/k8s/base");
    assert_flags_exist(
        "deploy/k8s/base/coordinators/statefulset.yaml",
        &flags_in(&read(&k8s.join("coordinators/statefulset.yaml"))),
        &["coordinator"],
    );
    assert_flags_exist(
        "deploy/k8s/base/region/limiter.yaml",
        &flags_in(&read(&k8s.join("region/limiter.yaml"))),
        &["limiter"],
    );
    let compose = yaml(&repo().join("deploy/compose.yaml"));
    let services = compose
        .as_mapping()
        .and_then(|m| m.get_mapping("services"))
        .expect("services");
    let mut checked = 0;
    for (name, service) in services.iter() {
        let command = scalars(service.as_mapping().and_then(|m| m.get_node("command")));
        let Some(sub) = command
            .iter()
            .find(|a| *a == "coordinator" || *a == "limiter")
        else {
            continue;
        };
        let used: BTreeSet<String> = command
            .iter()
            .filter(|a| a.starts_with("--"))
            .cloned()
            .collect();
        assert_flags_exist(&format!("compose service {}", name.as_str()), &used, &[sub]);
        checked += 1;
    }
    assert_eq!(checked, 7, "3 coordinators and 4 limiters in compose");
    let compose_dir = repo().join("deploy/compose");
    assert_flags_exist(
        "deploy/compose/setup.sh (regions set)",
        &flags_in(&read(&compose_dir.join("setup.sh"))),
        &["ctl", "regions", "set"],
    );
    let pki = flags_in(&read(&compose_dir.join("init-pki.sh")));
    let certs: BTreeSet<String> = help_flags(&["certs", "ca"])
        .union(&help_flags(&["certs", "issue"]))
        .cloned()
        .collect();
    let unknown: Vec<&String> = pki.difference(&certs).collect();
    assert!(unknown.is_empty(), "init-pki.sh passes {unknown:?}");
}

#[test]
fn compose_has_three_coordinators_two_regions_prometheus_and_grafana() {
    let compose = yaml(&repo().join("deploy/compose.yaml"));
    let services = compose
        .as_mapping()
        .and_then(|m| m.get_mapping("services"))
        .expect("services");
    let published = |name: &str| -> Vec<String> {
        let service = services
            .get_mapping(name)
            .unwrap_or_else(|| panic!("compose has no service {name}"));
        scalars(service.get_node("ports"))
    };
    for (id, port) in [(1, "7902"), (2, "7912"), (3, "7922")] {
        assert_eq!(
            published(&format!("coordinator-{id}")),
            [format!("{port}:7902")]
        );
    }
    for (region, first) in [("mumbai", 8080), ("hyderabad", 8090)] {
        let redis = services
            .get_mapping(&format!("redis-{region}"))
            .unwrap_or_else(|| panic!("no redis-{region}"));
        let args = scalars(redis.get_node("command")).join(" ");
        // The same eviction settings as the Kubernetes Redis (the tests of a
        // full Redis run with those).
        let policy = common::shipped_redis_policy().join(" ");
        assert!(
            args.contains(&policy),
            "redis-{region}: {args} lacks {policy}"
        );
        for pod in 0..2u16 {
            let name = format!("limiter-{region}-{}", pod + 1);
            let port = first + 2 * pod;
            assert_eq!(
                published(&name),
                [format!("{port}:8080"), format!("{}:8081", port + 1)],
                "{name}"
            );
            let command = scalars(
                services
                    .get_mapping(&name)
                    .and_then(|m| m.get_node("command")),
            );
            let joined = command.join(" ");
            assert!(joined.contains(&format!("--region {region}")), "{joined}");
            assert!(
                joined.contains(&format!("--redis redis://redis-{region}:6379")),
                "{joined}"
            );
            assert_eq!(
                command.iter().filter(|a| *a == "--coordinator").count(),
                3,
                "{name} knows every coordinator"
            );
        }
    }
    assert_eq!(published("prometheus"), ["9090:9090"]);
    assert_eq!(published("grafana"), ["3000:3000"]);
    let grafana = scalars(
        services
            .get_mapping("grafana")
            .and_then(|m| m.get_node("volumes")),
    );
    assert!(
        grafana
            .iter()
            .any(|v| v.starts_with("./grafana/meridian.json:")),
        "the dashboard is provisioned: {grafana:?}"
    );
    let pki = services.get_mapping("pki").expect("the pki init step");
    assert!(
        scalars(pki.get_node("entrypoint"))
            .join(" ")
            .contains("init-pki.sh"),
        "certificates come from the init step"
    );
    // Prometheus scrapes every coordinator and every limiter.
    let prometheus = read(&repo().join("deploy/prometheus/prometheus.yml"));
    for name in services.keys() {
        let name = name.as_str();
        if name.starts_with("coordinator-") {
            assert!(
                prometheus.contains(&format!("{name}:7902")),
                "{name} is not scraped"
            );
        }
        if name.starts_with("limiter-") {
            assert!(
                prometheus.contains(&format!("{name}:8080")),
                "{name} is not scraped"
            );
        }
    }
}

#[test]
fn prometheus_config_and_alert_rules_pass_promtool() {
    require("promtool", &["--version"], PROMETHEUS_HINT);
    let prometheus = repo().join("deploy/prometheus");
    // The config names the paths the compose file mounts; point them here.
    let dir = tempfile::tempdir().expect("temp dir");
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, "").expect("ca");
    let config = read(&prometheus.join("prometheus.yml"))
        .replace(
            "/etc/prometheus/alerts.yaml",
            &prometheus.join("alerts.yaml").display().to_string(),
        )
        .replace("/etc/meridian/pki/ca.pem", &ca.display().to_string());
    let config_file = dir.path().join("prometheus.yml");
    std::fs::write(&config_file, config).expect("config");
    run(Command::new("promtool")
        .args(["check", "config"])
        .arg(&config_file));
    run(Command::new("promtool")
        .args(["check", "rules"])
        .arg(prometheus.join("alerts.yaml")));
    let tests = run(Command::new("promtool")
        .args(["test", "rules"])
        .arg(prometheus.join("alerts_test.yaml")));
    assert!(
        String::from_utf8_lossy(&tests.stdout).contains("SUCCESS"),
        "{}",
        String::from_utf8_lossy(&tests.stdout)
    );
}

/// A child process stopped when dropped: SIGINT, then SIGKILL after 10 s.
struct Stopped(Child);

impl Drop for Stopped {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-INT", &self.0.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `meridian demo` in a process group of its own, stopped with everything
/// it started when dropped: SIGTERM to the whole group at once (each
/// coordinator, limiter and Redis stops on its own, in parallel: the demo's
/// own Ctrl-C path stops them one after another, which takes most of a
/// minute), SIGKILL to what is left after 10 s, then its temp dir goes.
struct Demo {
    child: Child,
    dir: Option<PathBuf>,
}

impl Drop for Demo {
    fn drop(&mut self) {
        let group = format!("-{}", self.child.id());
        let _ = Command::new("kill").args(["-TERM", "--", &group]).status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            let _ = self.child.try_wait();
            let alive = Command::new("kill")
                .args(["-0", "--", &group])
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if !alive {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = Command::new("kill")
            .args(["-KILL", "--", &group])
            .stderr(Stdio::null())
            .status();
        let _ = self.child.wait();
        if let Some(dir) = &self.dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// Where the demo's processes are, from the lines it prints at start.
struct DemoLayout {
    coordinators: Vec<String>,
    limiters: Vec<String>,
    ca: String,
}

fn host_port(url: &str) -> String {
    url.split("://")
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .unwrap_or_else(|| panic!("no host:port in {url}"))
        .to_owned()
}

fn start_demo() -> (Demo, DemoLayout) {
    use std::os::unix::process::CommandExt;
    common::require_redis();
    let mut child = Command::new(common::meridian_bin())
        .args([
            "demo",
            "--for",
            "60s",
            "--rebalance-interval",
            "1s",
            "--shift-every",
            "4s",
        ])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .expect("start meridian demo");
    let stdout = child.stdout.take().expect("demo stdout");
    let mut demo = Demo { child, dir: None };
    let (tx, rx) = mpsc::channel();
    // Reads every line, so the demo never blocks on a full pipe.
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut layout = DemoLayout {
        coordinators: Vec::new(),
        limiters: Vec::new(),
        ca: String::new(),
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut seen = String::new();
    while layout.ca.is_empty() || layout.limiters.len() < 2 || demo.dir.is_none() {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = rx
            .recv_timeout(left)
            .unwrap_or_else(|_| panic!("the demo did not print its layout:\n{seen}"));
        seen.push_str(&line);
        seen.push('\n');
        let metrics = line
            .split("metrics ")
            .nth(1)
            .and_then(|s| s.split_whitespace().next());
        if line.trim_start().starts_with("coordinator ") {
            layout
                .coordinators
                .push(host_port(metrics.expect("coordinator metrics")));
        } else if line.trim_start().starts_with("region ") {
            layout
                .limiters
                .push(host_port(metrics.expect("limiter metrics")));
        } else if let Some(ca) = line.split("mutual TLS: CA ").nth(1) {
            layout.ca = ca.split_whitespace().next().expect("CA path").to_owned();
        }
        if let Some(logs) = line.split("logs: ").nth(1) {
            demo.dir = logs.split_whitespace().next().map(PathBuf::from);
        }
    }
    assert_eq!(layout.coordinators.len(), 3, "{seen}");
    (demo, layout)
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// `text` as a URL query value (RFC 3986: all but unreserved bytes escaped).
fn percent_encoded(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Every PromQL expression of the Grafana dashboard, with its variables set
/// as "All regions" and a one-minute rate window.
fn dashboard_queries() -> Vec<(String, String)> {
    let text = read(&repo().join("deploy/grafana/meridian.json"));
    let dashboard: serde_json::Value = serde_json::from_str(&text).expect("dashboard JSON");
    let mut queries = Vec::new();
    let panels = dashboard["panels"].as_array().expect("panels");
    for panel in panels {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().expect("expr");
            queries.push((
                format!("panel {:?}", panel["title"].as_str().unwrap_or("?")),
                expr.replace("$__rate_interval", "1m")
                    .replace("$region", ".*"),
            ));
        }
    }
    // The region variable's values come from this selector.
    for variable in dashboard["templating"]["list"]
        .as_array()
        .expect("templating")
    {
        if let Some(definition) = variable["definition"].as_str() {
            let inner = definition
                .strip_prefix("label_values(")
                .and_then(|s| s.rsplit_once(','))
                .map(|(selector, _)| selector.to_owned())
                .expect("label_values(SELECTOR, LABEL)");
            queries.push((format!("variable {}", variable["name"]), inner));
        }
    }
    queries
}

/// Every alert expression, its comparisons made `bool`: an alert that is
/// not firing still returns its series (0), so a series that does not exist
/// shows as no result.
fn alert_queries() -> Vec<(String, String)> {
    let rules = yaml(&repo().join("deploy/prometheus/alerts.yaml"));
    let mut queries = Vec::new();
    let groups = rules
        .as_mapping()
        .and_then(|m| m.get_sequence("groups"))
        .expect("groups");
    for group in groups.iter() {
        let group_rules = group
            .as_mapping()
            .and_then(|m| m.get_sequence("rules"))
            .expect("rules");
        for rule in group_rules.iter() {
            let rule = rule.as_mapping().expect("a rule");
            let name = rule.get_scalar("alert").expect("alert").as_str();
            let expr = rule.get_scalar("expr").expect("expr").as_str();
            let mut bool_expr = expr.to_owned();
            for op in [" >= ", " <= ", " == ", " != ", " > ", " < "] {
                bool_expr = bool_expr.replace(op, &format!("{}bool ", op));
            }
            queries.push((format!("alert {name}"), bool_expr));
        }
    }
    queries
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_scraping_the_demo_finds_a_series_for_every_panel_and_alert() {
    require("prometheus", &["--version"], PROMETHEUS_HINT);
    let (_demo, layout) = start_demo();
    let dir = tempfile::tempdir().expect("temp dir");
    let list = |targets: &[String]| {
        targets
            .iter()
            .map(|t| format!("'{t}'"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let config = format!(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
         rule_files:\n  - '{}'\n\
         scrape_configs:\n\
         \x20 - job_name: meridian-coordinator\n    scheme: https\n    tls_config:\n      ca_file: '{}'\n\
         \x20   static_configs:\n      - targets: [{}]\n\
         \x20 - job_name: meridian-limiter\n    static_configs:\n      - targets: [{}]\n",
        repo().join("deploy/prometheus/alerts.yaml").display(),
        layout.ca,
        list(&layout.coordinators),
        list(&layout.limiters),
    );
    let config_file = dir.path().join("prometheus.yml");
    std::fs::write(&config_file, config).expect("config");
    let port = free_port();
    let log = std::fs::File::create(dir.path().join("prometheus.log")).expect("log");
    let _prometheus = Stopped(
        Command::new("prometheus")
            .arg(format!("--config.file={}", config_file.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("start prometheus"),
    );
    let api = format!("http://127.0.0.1:{port}/api/v1");
    let http = common::http_client()
        .timeout(Duration::from_secs(5))
        .build()
        .expect("client");
    let get = |path: String, query: Option<String>| {
        let http = http.clone();
        let url = format!("{api}/{path}");
        async move {
            let url = match query {
                Some(q) => format!("{url}?query={}", percent_encoded(&q)),
                None => url,
            };
            let response = http.get(&url).send().await.ok()?;
            response.json::<serde_json::Value>().await.ok()
        }
    };

    // Every process scraped and up.
    let deadline = Instant::now() + Duration::from_secs(45);
    loop {
        let up = get("query".into(), Some("sum(up)".into())).await;
        let count = up.as_ref().and_then(|v| {
            v["data"]["result"][0]["value"][1]
                .as_str()
                .map(str::to_owned)
        });
        if count.as_deref() == Some("5") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "Prometheus never scraped all 5 processes (sum(up) = {count:?}); targets: {:?}\nlog: {}",
            get("targets".into(), None).await,
            read(&dir.path().join("prometheus.log"))
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // Enough samples for every rate() and for the rules to be evaluated.
    tokio::time::sleep(Duration::from_secs(6)).await;

    let rules = get("rules".into(), None).await.expect("rules API");
    let mut loaded = 0;
    for group in rules["data"]["groups"].as_array().expect("groups") {
        for rule in group["rules"].as_array().expect("rules") {
            assert_eq!(rule["health"], "ok", "rule fails to evaluate: {rule}");
            loaded += 1;
        }
    }
    assert_eq!(
        loaded,
        alert_queries().len(),
        "Prometheus loaded every alert"
    );

    let mut empty = Vec::new();
    let queries: Vec<(String, String)> = dashboard_queries()
        .into_iter()
        .chain(alert_queries())
        .collect();
    for (what, expr) in &queries {
        let answer = get("query".into(), Some(expr.clone())).await;
        let status = answer.as_ref().map(|a| a["status"].clone());
        assert_eq!(
            status,
            Some(serde_json::json!("success")),
            "{what}: {expr} failed: {answer:?}"
        );
        let series = answer
            .as_ref()
            .and_then(|a| a["data"]["result"].as_array().map(Vec::len))
            .unwrap_or(0);
        if series == 0 {
            empty.push(format!("{what}: {expr}"));
        }
    }
    assert!(
        empty.is_empty(),
        "no series for {} of {} queries:\n{}",
        empty.len(),
        queries.len(),
        empty.join("\n")
    );
}

/// Says, outside the test harness's capture, what this test did not do.
fn tell(message: &str) {
    let _ = std::io::stderr().write_all(format!("\n{message}\n").as_bytes());
}

#[test]
fn docker_image_builds_and_compose_starts_where_docker_runs() {
    let docker = Command::new("docker")
        .arg("info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output();
    let why_not = match &docker {
        Err(e) => Some(format!("the docker command is not installed ({e})")),
        Ok(out) if !out.status.success() => Some(format!(
            "the Docker daemon is not reachable: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )),
        Ok(_) => None,
    };
    if let Some(why) = why_not {
        tell(&format!(
            "docker_image_builds_and_compose_starts_where_docker_runs: NOT RUN — {why}. \
             deploy/docker/Dockerfile was not built and deploy/compose.yaml was not started \
             (its structure is checked by compose_has_three_coordinators_two_regions_prometheus_and_grafana)."
        ));
        return;
    }
    let root = repo();
    run(Command::new("docker").current_dir(&root).args([
        "build",
        "-f",
        "deploy/docker/Dockerfile",
        "-t",
        "meridian:dev",
        ".",
    ]));
    let compose = |args: &[&str]| {
        let mut cmd = Command::new("docker");
        cmd.current_dir(&root)
            .args([
                "compose",
                "-f",
                "deploy/compose.yaml",
                "-p",
                "meridian-test",
            ])
            .args(args);
        cmd
    };
    // Stopped and removed (with its volumes) however the test ends.
    struct Down<F: Fn(&[&str]) -> Command>(F);
    impl<F: Fn(&[&str]) -> Command> Drop for Down<F> {
        fn drop(&mut self) {
            let _ = (self.0)(&["down", "-v", "--remove-orphans"]).status();
        }
    }
    let down = Down(compose);
    run(&mut (down.0)(&["up", "-d"]));
    // mumbai's first limiter is ready once it reaches its Redis.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if readyz("127.0.0.1:8080") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "limiter-mumbai-1 never answered /readyz on port 8080"
        );
        std::thread::sleep(Duration::from_secs(2));
    }
}

/// `GET /readyz` answered 200.
fn readyz(addr: &str) -> bool {
    use std::io::Read;
    let Ok(mut stream) = std::net::TcpStream::connect(addr) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    if stream
        .write_all(b"GET /readyz HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    answer.starts_with("HTTP/1.0 200") || answer.starts_with("HTTP/1.1 200")
}

/// Relative links in the docs are checked by `docs_links`; this checks the
/// runbooks the alerts name, which live in YAML.
#[test]
fn every_alert_runbook_leads_to_a_heading_of_the_operations_docs() {
    let operations = read(&repo().join("docs/operations.md"));
    let anchors = heading_anchors(&operations);
    let alerts = read(&repo().join("deploy/prometheus/alerts.yaml"));
    let runbooks: Vec<&str> = alerts
        .lines()
        .filter_map(|l| l.trim().strip_prefix("runbook: docs/operations.md#"))
        .collect();
    assert_eq!(
        runbooks.len(),
        alert_queries().len(),
        "every alert has a runbook"
    );
    for runbook in runbooks {
        assert!(
            anchors.contains(runbook),
            "alerts.yaml points at docs/operations.md#{runbook}, which has no such heading: {anchors:?}"
        );
    }
}
