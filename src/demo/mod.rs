//! `meridian demo`: the whole system on one machine.
//!
//! Three coordinator nodes and two regions ("mumbai", "hyderabad"), each
//! region with its own `redis-server` (or the embedded store when Redis is
//! not installed) and one limiter — all real processes of this binary — plus
//! a traffic generator whose regional mix swings between the regions against
//! a global rule of 1,000 requests/min per customer. A summary line every two
//! seconds shows each region's allocation and what the world admitted in the
//! current minute. Ctrl-C (or `--for`) stops everything and removes the
//! temporary directory.

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::{Value, json};

use crate::clock::now_unix_ms;

mod traffic;
use traffic::{Stats, drive, mumbai_share};

const REGIONS: [&str; 2] = ["mumbai", "hyderabad"];
const RULE_ID: &str = "demo|customer";
const LIMIT_PER_MINUTE: u64 = 1_000;

/// `meridian demo` options: the traffic the local cluster is put under, how
/// often it rebalances, how long it runs and on which store.
#[derive(clap::Args, Debug, Clone)]
pub struct DemoArgs {
    /// Customers sharing the traffic; each has its own 1,000/min global limit.
    #[arg(long, default_value_t = 3)]
    pub customers: u32,
    /// Requests per minute each customer sends, all regions together (above
    /// 1,000 the limit bites).
    #[arg(long, default_value_t = 1_200)]
    pub demand: u64,
    /// How long the traffic takes to swing from mostly-mumbai to
    /// mostly-hyderabad (and as long to swing back).
    #[arg(long, default_value = "60s", value_parser = crate::rules::parse_duration)]
    pub shift_every: Duration,
    /// How often the coordinator re-divides the limit (default 5s; 1s with
    /// --drill, so leases of 6 intervals lapse within a drill).
    #[arg(long, value_parser = crate::rules::parse_duration)]
    pub rebalance_interval: Option<Duration>,
    /// Stop by itself after this long (default: run until Ctrl-C).
    #[arg(long = "for", value_parser = crate::rules::parse_duration)]
    pub run_for: Option<Duration>,
    /// Use the embedded store even when redis-server is installed.
    #[arg(long)]
    pub no_redis: bool,
    /// Run a scripted failover drill of hyderabad in each mode — drain,
    /// fail, partition — one after another, print each drill's report, then
    /// stop. The rule is then a fixed window of 10 s (1,000/min in
    /// 10-second parts), so the reports count the world's admissions per
    /// window. Takes about two minutes.
    #[arg(long)]
    pub drill: bool,
}

impl DemoArgs {
    fn rebalance_interval(&self) -> Duration {
        self.rebalance_interval.unwrap_or(if self.drill {
            Duration::from_secs(1)
        } else {
            Duration::from_secs(5)
        })
    }
}

fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// A child process stopped (SIGTERM, then SIGKILL after 5 s) when dropped.
struct Proc {
    name: String,
    child: Child,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        eprintln!("demo: {} did not stop within 5 s; killing it", self.name);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn log_file(dir: &Path, name: &str) -> anyhow::Result<std::fs::File> {
    std::fs::File::create(dir.join(format!("{name}.log")))
        .with_context(|| format!("creating {name}.log"))
}

fn redis_installed() -> bool {
    Command::new("redis-server")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Where one demo coordinator listens.
struct Coordinator {
    http: String,
    grpc: String,
}

/// Where one demo region's limiter (and its Redis, if any) listens.
struct Region {
    name: String,
    grpc: String,
    http: String,
    redis: Option<String>,
}

/// Starts three coordinators and two regions on this machine, drives traffic
/// through them and prints what each region admitted, until `--for` elapses
/// or Ctrl-C; the child processes are stopped on return.
pub async fn run(args: DemoArgs) -> anyhow::Result<()> {
    if args.customers == 0 {
        bail!("--customers must be at least 1");
    }
    let exe = std::env::current_exe().context("locating the meridian binary")?;
    let dir = tempfile::Builder::new()
        .prefix("meridian-demo-")
        .tempdir()
        .context("creating the demo's temp dir")?;
    // Its logs and stores are the demo's own: private, like the token.
    #[cfg(unix)]
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .context("making the demo's temp dir private")?;
    // Taken now, so a SIGTERM while the system starts is not the default
    // (die at once, leaving every child and the temp dir behind): it stops
    // the demo as Ctrl-C does, once the summary loop runs.
    #[cfg(unix)]
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("listening for SIGTERM")?;
    // 128 random bits, in a 0600 file the coordinators read: the token is
    // never on a command line, and the demo prints only where it is.
    let token = format!("{:032x}", rand::random::<u128>());
    let token_file = dir.path().join("admin-token");
    write_secret(&token_file, &token).context("writing the demo's admin token")?;
    let mut procs: Vec<Proc> = Vec::new();
    // The secure configuration, as docs/operations.md recommends it: a CA of the
    // demo's own and a certificate per node and per region (mutual TLS).
    let pki = Pki::make(&dir.path().join("pki")).context("making the demo's certificates")?;

    // Coordinators.
    let mut coordinators = Vec::new();
    for id in 1..=3u64 {
        coordinators.push((id, free_port()?, free_port()?));
    }
    let init: Vec<String> = coordinators
        .iter()
        .map(|(id, raft, http)| format!("{id}=127.0.0.1:{raft}@127.0.0.1:{http}"))
        .collect();
    let init = init.join(",");
    let every = args.rebalance_interval();
    let interval = format!("{}ms", every.as_millis());
    let lease = format!("{}ms", (every * 6).as_millis());
    let suspect = format!("{}ms", (every * 3).as_millis());
    for (id, raft, http) in &coordinators {
        let mut cmd = Command::new(&exe);
        cmd.arg("coordinator")
            .args(["--id", &id.to_string()])
            .arg("--data-dir")
            .arg(dir.path().join(format!("coordinator-{id}")))
            .args(["--raft-addr", &format!("127.0.0.1:{raft}")])
            .args(["--http-addr", &format!("127.0.0.1:{http}")])
            .arg("--admin-token-file")
            .arg(&token_file)
            .args(pki.flags(&crate::tls::Identity::Node(*id)))
            .args(["--rebalance-interval", &interval])
            .args(["--lease", &lease, "--suspect-after", &suspect]);
        if *id == 1 {
            cmd.args(["--init", &init]);
        }
        let log = log_file(dir.path(), &format!("coordinator-{id}"))?;
        let child = cmd
            .env("RUST_LOG", "info,openraft=warn")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting a coordinator")?;
        procs.push(Proc {
            name: format!("coordinator {id}"),
            child,
        });
    }
    let coordinators: Vec<Coordinator> = coordinators
        .iter()
        .map(|(_, raft, http)| Coordinator {
            http: format!("https://127.0.0.1:{http}"),
            grpc: format!("https://127.0.0.1:{raft}"),
        })
        .collect();
    let ca_pem = std::fs::read(&pki.ca).context("reading the demo's CA")?;
    let client = reqwest::Client::builder()
        .use_preconfigured_tls(crate::tls::trusting(&ca_pem).map_err(anyhow::Error::msg)?)
        .timeout(Duration::from_secs(10))
        .build()?;
    let admin = &coordinators[0].http;
    wait_for_leader(&client, admin).await?;
    for region in REGIONS {
        admin_write(
            &client,
            reqwest::Method::PUT,
            &format!("{admin}/api/v1/regions/{region}"),
            &token,
            json!({ "weight": 1.0 }),
        )
        .await?;
    }
    let rules = if args.drill {
        // Counted windows (fixed, exact) are what a drill report measures
        // per window; 10 s ones give it several per drill.
        format!(
            "# The demo's rule for drills: every customer may make {} calls per 10 s, worldwide.\n\
             domain: demo\n\
             descriptors:\n  \
               - key: customer\n    \
                 scope: global\n    \
                 algorithm: fixed_window\n    \
                 period: 10s\n    \
                 rate_limit:\n      \
                   name: per_customer\n      \
                   requests_per_unit: {}\n",
            LIMIT_PER_MINUTE / 6,
            LIMIT_PER_MINUTE / 6
        )
    } else {
        format!(
            "# The demo's rule: every customer may make {LIMIT_PER_MINUTE} calls a minute, worldwide.\n\
             domain: demo\n\
             descriptors:\n  \
               - key: customer\n    \
                 scope: global\n    \
                 algorithm: sliding_window_counter\n    \
                 rate_limit:\n      \
                   name: per_customer\n      \
                   unit: minute\n      \
                   requests_per_unit: {LIMIT_PER_MINUTE}\n"
        )
    };
    admin_write(
        &client,
        reqwest::Method::PUT,
        &format!("{admin}/api/v1/rules"),
        &token,
        json!({ "files": { "demo.yaml": rules } }),
    )
    .await?;

    // Regions.
    let use_redis = !args.no_redis && redis_installed();
    if !use_redis {
        eprintln!(
            "demo: redis-server not found on PATH (or --no-redis): each region uses the embedded store. \
             Install Redis (apt-get install redis-server) to run the regions on real Redis."
        );
    }
    let mut regions = Vec::new();
    for name in REGIONS {
        let redis = if use_redis {
            let port = free_port()?;
            let redis_dir = dir.path().join(format!("redis-{name}"));
            std::fs::create_dir_all(&redis_dir)?;
            let log = log_file(dir.path(), &format!("redis-{name}"))?;
            let child = Command::new("redis-server")
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                .args(["--save", "", "--appendonly", "no"])
                .arg("--dir")
                .arg(&redis_dir)
                .stdin(Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log)
                .spawn()
                .context("starting redis-server")?;
            procs.push(Proc {
                name: format!("redis ({name})"),
                child,
            });
            wait_for_port(port).await?;
            Some(format!("redis://127.0.0.1:{port}"))
        } else {
            None
        };
        let mut cmd = Command::new(&exe);
        cmd.arg("limiter")
            .args(["--region", name, "--pod-id", &format!("{name}-1")])
            .args(["--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"])
            .args(["--report-interval", &interval])
            .args(pki.flags(&crate::tls::Identity::Region(name.to_string())))
            .arg("--rules-cache")
            .arg(dir.path().join(format!("rules-cache-{name}.json")));
        for c in &coordinators {
            cmd.args(["--coordinator", &c.grpc]);
        }
        match &redis {
            Some(url) => cmd.args(["--redis", url]),
            None => cmd.args(["--store", "memory"]),
        };
        let log = log_file(dir.path(), &format!("limiter-{name}"))?;
        let mut child = cmd
            .env("RUST_LOG", "meridian=info")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .context("starting a limiter")?;
        let stdout = child.stdout.take().context("limiter stdout")?;
        procs.push(Proc {
            name: format!("limiter ({name})"),
            child,
        });
        let line = first_line(stdout).await?;
        let addr = |key: &str| {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(key))
                .map(str::to_string)
                .with_context(|| format!("limiter printed {line:?}"))
        };
        regions.push(Region {
            name: name.to_string(),
            grpc: format!("http://{}", addr("grpc=")?),
            http: format!("http://{}", addr("http=")?),
            redis,
        });
    }

    println!(
        "Meridian demo — 3 coordinators, 2 regions, a global limit of {LIMIT_PER_MINUTE}/min per customer"
    );
    if let Some(first) = coordinators.first() {
        println!(
            "  dashboard: {}/   (any coordinator serves it; the certificate is the demo's own CA, below)",
            first.http
        );
    }
    for (i, c) in coordinators.iter().enumerate() {
        println!(
            "  coordinator {}: admin API {}/api/v1/allocations   metrics {}/metrics   gRPC {}",
            i + 1,
            c.http,
            c.http,
            c.grpc
        );
    }
    for r in &regions {
        println!(
            "  region {:<10} limiter {} (gRPC) {}/v1/check (HTTP)   metrics {}/metrics   store {}",
            r.name,
            r.grpc,
            r.http,
            r.http,
            r.redis.as_deref().unwrap_or("embedded")
        );
    }
    println!(
        "  mutual TLS: CA {} (curl --cacert {0} …); node and region certificates beside it",
        pki.ca.display()
    );
    println!(
        "  admin token: in {} (export MERIDIAN_ADMIN_TOKEN=$(cat {0}))   logs: {}",
        token_file.display(),
        dir.path().display()
    );
    println!(
        "  traffic: {} customers × {}/min, swinging between the regions every {:?}; Ctrl-C stops\n",
        args.customers, args.demand, args.shift_every
    );

    let stats = Arc::new(Stats::default());
    let started = Instant::now();
    let mut traffic = Vec::new();
    for (i, r) in regions.iter().enumerate() {
        traffic.push(tokio::spawn(drive(
            r.grpc.clone(),
            i,
            args.clone(),
            started,
            stats.clone(),
        )));
    }

    let stop = async {
        let terminated = async {
            #[cfg(unix)]
            sigterm.recv().await;
            #[cfg(not(unix))]
            std::future::pending::<()>().await;
        };
        let interrupted = async {
            let _ = tokio::signal::ctrl_c().await;
        };
        let ran_for = async {
            match args.run_for {
                Some(d) => tokio::time::sleep(d).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = terminated => {}
            () = interrupted => {}
            () = ran_for => {}
        }
    };
    tokio::pin!(stop);
    let mut tick = tokio::time::interval(Duration::from_secs(2));
    let drills = async {
        if args.drill {
            drill_script(&client, admin, &token, every).await
        } else {
            std::future::pending().await
        }
    };
    tokio::pin!(drills);
    let mut failed = None;
    loop {
        tokio::select! {
            () = &mut stop => break,
            done = &mut drills => {
                failed = done.err();
                break;
            }
            _ = tick.tick() => {
                let line = summary(&client, &coordinators, &stats, started, &args).await;
                println!("{line}");
            }
        }
    }
    for t in traffic {
        t.abort();
    }
    println!(
        "\nstopping: limiters, Redis, coordinators; removing {}",
        dir.path().display()
    );
    // Limiters first (they report to the coordinators), then the rest.
    let (limiters, rest): (Vec<Proc>, Vec<Proc>) = procs
        .into_iter()
        .partition(|p| p.name.starts_with("limiter"));
    drop(limiters);
    drop(rest);
    drop(dir);
    match failed {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// `--drill`: a drain, a fail and a partition of hyderabad, one after the
/// other, each waited out and its report printed. The summary lines go on
/// meanwhile, so the split can be watched moving.
async fn drill_script(
    client: &reqwest::Client,
    admin: &str,
    token: &str,
    every: Duration,
) -> anyhow::Result<()> {
    // Let the allocation follow the traffic first.
    tokio::time::sleep((every * 8).max(Duration::from_secs(8))).await;
    // A drain needs no lease to lapse; fail and partition run past the
    // lease (6 intervals) so the report shows the fallback and re-grant.
    let lease = every * 6;
    for (mode, duration) in [
        ("drain", (every * 8).max(Duration::from_secs(8))),
        ("fail", lease + Duration::from_secs(6)),
        ("partition", lease + Duration::from_secs(6)),
    ] {
        let note = format!("meridian demo --drill: {mode} hyderabad");
        let body = json!({
            "region": "hyderabad",
            "mode": mode,
            "duration": format!("{}ms", duration.as_millis()),
            "note": note,
        });
        let answer = admin_send(
            client,
            reqwest::Method::POST,
            &format!("{admin}/api/v1/drills"),
            token,
            body,
        )
        .await?;
        let id = answer["drill"]
            .as_u64()
            .with_context(|| format!("the coordinator answered {answer} to a drill start"))?;
        println!("\n== drill {id}: {mode} hyderabad for {:?} ==", duration);
        let deadline = Instant::now() + duration + Duration::from_secs(150);
        let report = loop {
            let r = client
                .get(format!("{admin}/api/v1/drills/{id}"))
                .send()
                .await
                .context("reading the drill")?;
            let body: Value = r.json().await.context("the drill's answer")?;
            if body["report"]["complete"] == json!(true) {
                break body;
            }
            if Instant::now() > deadline {
                bail!("drill {id} did not finish: {}", body["markdown"]);
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        };
        println!("\n{}", report["markdown"].as_str().unwrap_or_default());
    }
    Ok(())
}

/// The demo's CA and the certificates of its nodes and regions.
struct Pki {
    dir: std::path::PathBuf,
    ca: std::path::PathBuf,
}

impl Pki {
    fn make(dir: &Path) -> anyhow::Result<Pki> {
        use crate::tls::Identity;
        use crate::tls::certs;
        let ca = certs::new_ca("Meridian demo CA", 30).map_err(anyhow::Error::msg)?;
        std::fs::create_dir_all(dir)?;
        let ca_path = dir.join(certs::CA_CERT);
        certs::write_atomic(&ca_path, &ca.cert_pem, false).map_err(anyhow::Error::msg)?;
        let hosts = ["127.0.0.1".to_string(), "localhost".to_string()];
        let nodes = (1..=3).map(Identity::Node);
        let regions = REGIONS.iter().map(|r| Identity::Region(r.to_string()));
        for identity in nodes.chain(regions) {
            let hosts: &[String] = match identity {
                Identity::Node(_) => &hosts,
                Identity::Region(_) => &[],
            };
            let issued = certs::issue(&ca.cert_pem, &ca.key_pem, &identity, hosts, 30)
                .map_err(anyhow::Error::msg)?;
            certs::write_pair(dir, &certs::stem(&identity), &issued).map_err(anyhow::Error::msg)?;
        }
        // The CA key is not kept: the demo issues everything it needs now.
        Ok(Pki {
            dir: dir.to_path_buf(),
            ca: ca_path,
        })
    }

    fn flags(&self, identity: &crate::tls::Identity) -> Vec<std::ffi::OsString> {
        let stem = crate::tls::certs::stem(identity);
        vec![
            "--tls-cert".into(),
            self.dir.join(format!("{stem}.pem")).into(),
            "--tls-key".into(),
            self.dir.join(format!("{stem}-key.pem")).into(),
            "--tls-ca".into(),
            self.ca.clone().into(),
        ]
    }
}

/// What the traffic generator saw, per clock-aligned minute.
async fn summary(
    client: &reqwest::Client,
    coordinators: &[Coordinator],
    stats: &Stats,
    started: Instant,
    args: &DemoArgs,
) -> String {
    let mut allocation = None;
    for c in coordinators {
        let url = format!("{}/api/v1/allocations?rule={RULE_ID}", c.http);
        if let Ok(r) = client.get(&url).send().await
            && r.status().is_success()
            && let Ok(body) = r.json::<Value>().await
        {
            allocation = Some(body);
            break;
        }
    }
    let split = match &allocation {
        Some(body) => {
            let share = |r: &str| body["split"][r]["granted"].as_u64().unwrap_or(0);
            format!(
                "epoch {:>3}  allocation mumbai {:>4} · hyderabad {:>4}",
                body["epoch"].as_u64().unwrap_or(0),
                share("mumbai"),
                share("hyderabad")
            )
        }
        None => "allocation: none yet".to_string(),
    };
    let window = now_unix_ms() / 60_000;
    let current = {
        let w = stats.windows.lock().unwrap_or_else(|p| p.into_inner());
        w.get(&window).cloned().unwrap_or_default()
    };
    let (asked, admitted) = (current.asked, current.admitted);
    let busiest = current
        .per_customer
        .iter()
        .max_by_key(|(_, n)| **n)
        .map(|(k, n)| format!("{k} {n}/{LIMIT_PER_MINUTE}"))
        .unwrap_or_else(|| "-".into());
    let share = mumbai_share(started.elapsed(), args.shift_every);
    let errors = stats.errors.load(Ordering::Relaxed);
    format!(
        "[{:>4}s] traffic {:>2.0}/{:<2.0} | {split} | this minute: admitted {:>5} of {:>5} (mumbai {}, hyderabad {}), busiest {busiest}{}",
        started.elapsed().as_secs(),
        share * 100.0,
        (1.0 - share) * 100.0,
        admitted[0] + admitted[1],
        asked[0] + asked[1],
        admitted[0],
        admitted[1],
        if errors > 0 {
            format!(" | {errors} failed calls")
        } else {
            String::new()
        }
    )
}

async fn first_line(stdout: std::process::ChildStdout) -> anyhow::Result<String> {
    let read = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).map(|_| line)
    });
    match tokio::time::timeout(Duration::from_secs(30), read).await {
        Ok(Ok(Ok(line))) if !line.is_empty() => Ok(line),
        _ => bail!("a limiter did not start within 30 s (see its log)"),
    }
}

async fn wait_for_port(port: u16) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
        {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    bail!("redis-server did not listen on {port} within 10 s")
}

async fn wait_for_leader(client: &reqwest::Client, admin: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if let Ok(r) = client.get(format!("{admin}/api/v1/cluster")).send().await
            && let Ok(body) = r.json::<Value>().await
            && !body["leader"].is_null()
        {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    bail!("the coordinators elected no leader within 30 s")
}

async fn admin_write(
    client: &reqwest::Client,
    method: reqwest::Method,
    url: &str,
    token: &str,
    body: Value,
) -> anyhow::Result<()> {
    admin_send(client, method, url, token, body).await.map(drop)
}

/// An admin write; its JSON answer.
async fn admin_send(
    client: &reqwest::Client,
    method: reqwest::Method,
    url: &str,
    token: &str,
    body: Value,
) -> anyhow::Result<Value> {
    let r = client
        .request(method, url)
        .bearer_auth(token)
        .header("x-meridian-operator", "meridian demo")
        .json(&body)
        .send()
        .await
        .with_context(|| format!("calling {url}"))?;
    let status = r.status();
    if !status.is_success() {
        let text = r.text().await.unwrap_or_default();
        bail!("{url}: {status} {text}");
    }
    r.json()
        .await
        .with_context(|| format!("{url}: the answer is not JSON"))
}

/// Writes `text` to a new file only this user can read.
fn write_secret(path: &std::path::Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    options.open(path)?.write_all(text.as_bytes())
}
