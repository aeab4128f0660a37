//! `meridian limiter`: the regional limiter service.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, ValueEnum};
use tokio::net::TcpListener;

use super::engine::{Engine, EngineConfig};
use super::global::Global;
use super::grpc::{NativeService, RlsService};
use super::health::Health;
use super::http::{self, HttpState};
use super::overrides::{HeldOverrides, cache as overrides_cache};
use super::reset_feed::ResetFeed;
use super::rule_feed;
use super::rule_source::RuleSource;
use super::service::Service;
use super::workers::{Worker, Workers};
use crate::cluster_id::ClusterId;
use crate::proto::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer;
use crate::proto::meridian::v1::limiter_server::LimiterServer;
use crate::serve::{self, Server};
use crate::slots::Slots;
use crate::store::{AnyStore, MemoryStore, RedisConfig, RedisStore};
use crate::tasks::Tasks;

/// After the drain, how long the control tasks get to finish: the demand
/// reporter's last report (a 200 ms wait for checks in flight, then a call
/// with a 3 s timeout). Tasks still running then are aborted.
/// Environment variable read when `--redis-password-file` is not given.
pub const REDIS_PASSWORD_ENV: &str = "MERIDIAN_REDIS_PASSWORD";

const CONTROL_DEADLINE: Duration = Duration::from_secs(4);
/// How long the acceptors get to close their listeners after SIGTERM (they
/// stop at their next `.await`; this bound is never expected to be reached).
const ACCEPTORS_DEADLINE: Duration = Duration::from_secs(1);

/// Serve rate limit checks for one region: Envoy RLS v3 and Meridian's native
/// API on the gRPC address, JSON checks, metrics and health on the HTTP one.
#[derive(Debug, Args)]
pub struct LimiterArgs {
    /// Rule file(s) in envoyproxy/ratelimit's YAML format plus Meridian's fields.
    /// Watched: a valid edit applies within --reload-interval, a broken one is
    /// rejected and logged while the last good rules stay in force.
    #[arg(
        long = "config",
        value_name = "RULES.yaml",
        required_unless_present = "coordinator",
        conflicts_with = "coordinator"
    )]
    pub config: Vec<PathBuf>,

    /// Take rules from the coordinator cluster instead of files: the gRPC
    /// address of any node (repeat for several; the next is tried when one
    /// fails), e.g. https://10.0.0.5:7001. Rollout stages are honoured for
    /// --region. Needs --tls-cert/--tls-key/--tls-ca with a certificate for
    /// meridian://region/REGION (https://), or --insecure on loopback (http://).
    /// All must be nodes of one cluster: see --cluster-id.
    #[arg(long, value_name = "URL")]
    pub coordinator: Vec<String>,

    /// `--tls-cert`, `--tls-key`, `--tls-ca`, `--insecure`.
    #[command(flatten)]
    pub tls: crate::tls::TlsArgs,

    /// With --coordinator: where the last rules received are kept (0600), so a
    /// restart while no coordinator answers still enforces them, together
    /// with the id of the cluster they came from. Default:
    /// `<--state-dir>/rules-cache-<region>[-<pod-id>].json`, one per region
    /// (and per --pod-id), so two limiters started from one directory never
    /// share one.
    #[arg(long, value_name = "FILE")]
    pub rules_cache: Option<PathBuf>,

    /// Where a limiter keeps its state (the rules cache) unless --rules-cache
    /// names a file; created 0700 if missing.
    #[arg(long, value_name = "DIR", default_value = "meridian-state")]
    pub state_dir: PathBuf,

    /// With --coordinator: take rules only from the cluster with this id (32
    /// hex digits; GET /api/v1/cluster on a coordinator shows it). Without
    /// it, the first cluster followed is pinned in --rules-cache. An update
    /// from any other cluster is refused whatever its version: the limiter
    /// keeps its rules and its cache, logs an error naming both ids, counts
    /// it in meridian_rule_updates_refused_total and tries the next
    /// --coordinator.
    #[arg(long, value_name = "ID")]
    pub cluster_id: Option<ClusterId>,

    /// Redis for this region: redis://[user:pass@]host:port[/db], or rediss:// for
    /// TLS. Repeat it, or use redis+cluster://h1:p1,h2:p2, for a Redis Cluster.
    /// Redis Sentinel: redis+sentinel://s1:26379,s2:26379/MASTER-NAME[/db]
    /// (rediss+sentinel:// for TLS) checks on the master the sentinels name and
    /// follows it after a failover; the password authenticates to the master
    /// and to the sentinels.
    #[arg(long = "redis", value_name = "URL")]
    pub redis: Vec<String>,

    /// File holding the Redis password (AUTH), for --redis URLs that carry
    /// none [env: MERIDIAN_REDIS_PASSWORD]. URLs are logged with passwords
    /// replaced by ***.
    #[arg(long, value_name = "PATH")]
    pub redis_password_file: Option<PathBuf>,

    /// PEM file with the CA that signed the Redis servers' TLS certificates
    /// (for rediss:// URLs; default: the system's trust store).
    #[arg(long, value_name = "FILE")]
    pub redis_ca: Option<PathBuf>,

    /// Where counters live: redis (needs --redis) or memory (embedded, this pod only).
    #[arg(long, value_enum, default_value_t = StoreKind::Redis)]
    pub store: StoreKind,

    /// This region's name: in logs, in demand reports, and as the `region`
    /// label on every series of /metrics.
    #[arg(long, default_value = "local")]
    pub region: String,

    /// gRPC listener (Envoy RLS v3 and meridian.v1.Limiter). Port 0 picks a free port.
    #[arg(long, default_value = "127.0.0.1:8081")]
    pub grpc_addr: SocketAddr,

    /// HTTP listener (POST /v1/check, envoyproxy/ratelimit's POST /json, /metrics,
    /// /healthz, /readyz). Port 0 picks a free port.
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub http_addr: SocketAddr,

    /// `--http-max-connections`, `--http-header-timeout`,
    /// `--http-idle-timeout`, `--http-body-timeout`.
    #[command(flatten)]
    pub http_listener: http::HttpListenerArgs,

    /// Longest a Redis call may take before the rule's fail mode decides.
    #[arg(long, default_value = "20ms", value_parser = parse_duration)]
    pub redis_deadline: Duration,

    /// Limiter pods in this region: fail_mode: local enforces limit ÷ pods.
    #[arg(long, default_value_t = 1)]
    pub pods_in_region: u64,

    /// Add RateLimit-Limit/-Remaining/-Reset to Envoy RLS responses (gRPC and POST /json).
    #[arg(long)]
    pub response_headers: bool,

    /// How often rule files are checked for changes.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub reload_interval: Duration,

    /// After SIGTERM, how long in-flight requests may take to finish before
    /// connections still open (gateways keep theirs forever) are closed.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub drain_timeout: Duration,

    /// Checks waiting on Redis at most per limiter; further checks wait their
    /// turn (before the Redis deadline starts) instead of all timing out
    /// together. Concurrent checks share script calls (up to 64 a call).
    #[arg(long, default_value_t = 128)]
    pub max_redis_in_flight: usize,

    /// With --coordinator: report demand for global rules at least this
    /// often. Unset, the limiter follows the coordinators, which give an
    /// interval that fits their --rebalance-interval (half of it, at most
    /// 10s, at least 500ms: 10s at the default 60s rounds, 1s at 2s rounds;
    /// 10s until the first coordinator answers). Set, it may only shorten
    /// that interval, never lengthen it. /readyz says which is in force.
    #[arg(long, value_parser = parse_duration)]
    pub report_interval: Option<Duration>,

    /// This pod's id in demand reports and acknowledgements (unique within
    /// the region) [default: host name and process id].
    #[arg(long)]
    pub pod_id: Option<String>,

    /// Keys the local over-limit cache holds at most.
    #[arg(long, default_value_t = 100_000)]
    pub cache_capacity: usize,

    /// Keys the `fail_mode: local` store holds at most (while Redis is
    /// failing, rules with that fail mode are counted in this process). Once
    /// full, and nothing in it has expired, a key it does not hold yet is
    /// denied (reason `store_full`); keys it holds are decided as usual.
    #[arg(long, default_value_t = 100_000)]
    pub fail_local_capacity: usize,

    /// Counters the approximate path (accuracy: approximate) keeps in memory
    /// at most: one per key (and window) checked recently, each holding the
    /// pod's unflushed hits. Checks of further keys, while the map is full,
    /// take the exact path (one Redis script per check, nothing lost; counted
    /// in meridian_approx_untracked_checks_total). Memory: up to this many ×
    /// (3 copies of the key + about 460 bytes), about 60 MB at the default
    /// for 40-byte keys, under 1 GB even if every rule and key were 512
    /// bytes. A counter leaves the map when flushed and idle for its rule's
    /// period.
    #[arg(long, default_value_t = 100_000)]
    pub approximate_max_keys: usize,

    /// Per-value metric series (rules with detailed_metric or
    /// value_to_metric: meridian_descriptor_checks_total) at most, over all
    /// rules. Values past it are counted under descriptor="_other" of their
    /// rule and in meridian_value_metrics_overflow_total, so a flood of
    /// random values cannot blow up /metrics.
    #[arg(long, default_value_t = 1_000)]
    pub max_value_metrics: usize,

    /// envoyproxy/ratelimit's STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT: when
    /// one descriptor of an Envoy request is over its limit, the request
    /// charges none of its descriptors (each is asked first without a
    /// charge: two store calls for such requests). A rule file's top-level
    /// `stop_increment_when_over_limit:` overrides it for its domain.
    #[arg(long)]
    pub stop_increment_when_over_limit: bool,

    /// Serving threads [default: one per core but one, at least one]. Each
    /// is a worker with its own event loop and Redis connection; connections
    /// are handed to them round robin and a check stays on its connection's
    /// thread, so no check pays for wake-ups across threads. The core left
    /// over does the kernel's loopback and network work, and serves a Redis
    /// or a gateway on the same machine (on 2 cores one worker took 0.73–0.78× the
    /// CPU per check of two, at a lower p99).
    #[arg(long)]
    pub threads: Option<std::num::NonZeroUsize>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum StoreKind {
    Redis,
    Memory,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    crate::rules::parse_duration(s)
}

/// One worker per core but one, at least one (see `--threads`).
fn default_workers() -> usize {
    std::thread::available_parallelism().map_or(1, |cores| cores.get().saturating_sub(1).max(1))
}

/// Serves checks until SIGTERM / Ctrl-C, then drains the workers and stops
/// the control tasks before returning.
pub async fn run(args: LimiterArgs) -> anyhow::Result<()> {
    let metrics = crate::telemetry::metrics_for("limiter", &[("region", &args.region)]);
    let worker_count = args
        .threads
        .map_or_else(default_workers, std::num::NonZeroUsize::get);
    anyhow::ensure!(
        args.cluster_id.is_none() || !args.coordinator.is_empty(),
        "--cluster-id pins the coordinator cluster: it needs --coordinator"
    );
    // The control plane's transport, checked before anything starts: a
    // limiter that cannot reach its coordinators securely should say so now.
    let transport = if args.coordinator.is_empty() {
        None
    } else {
        let urls: Vec<(&str, String)> = args
            .coordinator
            .iter()
            .map(|u| ("--coordinator", u.clone()))
            .collect();
        let me = crate::tls::Identity::Region(args.region.clone());
        Some(crate::tls::Transport::from_args(&args.tls, me, &urls).map_err(anyhow::Error::msg)?)
    };
    // What the coordinator feed starts from: the cached rules, if any.
    let mut held = rule_feed::Selection {
        enforce: None,
        shadow: None,
        applied_index: 0,
        cluster_id: args.cluster_id,
    };
    // Rules from files keep no cache (and create no state dir).
    let rules_cache = if args.coordinator.is_empty() {
        PathBuf::new()
    } else {
        rules_cache_path(&args)?
    };
    let rules = if args.coordinator.is_empty() {
        Arc::new(RuleSource::from_files(args.config.clone())?)
    } else {
        let source = Arc::new(RuleSource::awaiting());
        if let Some(mut cached) = rule_feed::load_cache(&rules_cache) {
            match (cached.cluster_id, args.cluster_id) {
                (Some(cached_id), Some(flag)) if cached_id != flag => anyhow::bail!(
                    "rules cache {} holds the rules of cluster {cached_id}, but --cluster-id is \
                     {flag}: fix --cluster-id, or remove the cache to start without rules",
                    rules_cache.display()
                ),
                (None, flag) => cached.cluster_id = flag,
                _ => {}
            }
            rule_feed::apply(&source, &cached).with_context(|| {
                format!("rules cache {} holds invalid rules", rules_cache.display())
            })?;
            tracing::info!(
                version = cached.enforce.as_ref().map(|v| v.number),
                cluster_id = cached.cluster_id.map(|id| id.to_string()),
                "enforcing cached rules until a coordinator answers"
            );
            held = cached;
        }
        source
    };
    let store = match args.store {
        StoreKind::Memory => AnyStore::Memory(MemoryStore::new()),
        StoreKind::Redis => {
            anyhow::ensure!(
                !args.redis.is_empty(),
                "--redis URL is required with --store redis (or use --store memory)"
            );
            let password = crate::secret::credential(
                "redis-password",
                args.redis_password_file.as_deref(),
                REDIS_PASSWORD_ENV,
                None,
            )
            .map_err(anyhow::Error::msg)?;
            let urls: Vec<String> = match &password {
                Some(p) => args
                    .redis
                    .iter()
                    .map(|u| crate::secret::with_password(u, p))
                    .collect(),
                None => args.redis.clone(),
            };
            let mut config = RedisConfig::new(urls[0].clone());
            config.urls = urls.clone();
            config.deadline = args.redis_deadline;
            config.lanes = worker_count;
            if let Some(ca) = &args.redis_ca {
                config.ca_cert = Some(
                    std::fs::read(ca)
                        .with_context(|| format!("reading --redis-ca {}", ca.display()))?,
                );
            }
            let store = RedisStore::connect(&config).await.map_err(|e| {
                // The redis crate may echo the URL it was given, password and all.
                let shown: Vec<String> =
                    urls.iter().map(|u| crate::secret::redact_url(u)).collect();
                anyhow::anyhow!(
                    "connecting to Redis at {}: {}",
                    shown.join(","),
                    crate::secret::redact_urls_in(&e.to_string(), &urls)
                )
            })?;
            AnyStore::Redis(Box::new(store))
        }
    };
    let engine = Engine::new(
        store,
        &EngineConfig {
            pods_in_region: args.pods_in_region,
            cache_capacity: args.cache_capacity,
            local_capacity: args.fail_local_capacity,
            max_in_flight: args.max_redis_in_flight,
            approximate_max_keys: args.approximate_max_keys,
            max_value_metrics: args.max_value_metrics,
            ..EngineConfig::default()
        },
    );
    if let Some(interval) = args.report_interval {
        anyhow::ensure!(
            interval >= MIN_REPORT_INTERVAL,
            "--report-interval {interval:?}: at least {MIN_REPORT_INTERVAL:?} (every report is a call to the coordinators)"
        );
    }
    let pod = args.pod_id.clone().unwrap_or_else(default_pod_id);
    let mut global = Global::new(&args.region, &pod, !args.coordinator.is_empty())
        .with_report_interval(args.report_interval);
    if !args.coordinator.is_empty() {
        match engine.store() {
            AnyStore::Redis(store) => {
                global = global.keeping_table_in(store.as_ref().clone(), &args.region);
            }
            AnyStore::Memory(_) => tracing::info!(
                "--store memory: the allocation table is not kept; a restart while no \
                 coordinator answers enforces no global rule until one does"
            ),
        }
    }
    let global = Arc::new(global);
    // Before the coordinator stream: until a coordinator answers, the
    // region's last table (lapsing on its lease) rather than nothing.
    if let Some(cluster) = held.cluster_id
        && held.enforce.is_some()
    {
        global.restore(cluster, &rules.current()).await;
    }
    // The overrides kept with the rules cache, enforced until a coordinator
    // sends the set again.
    let overrides = Arc::new(HeldOverrides::default());
    let overrides_cache = overrides_cache::path_for(&rules_cache);
    if !args.coordinator.is_empty()
        && let Some(cached) = overrides_cache::load(&overrides_cache)
    {
        tracing::info!(
            version = cached.version,
            overrides = cached.len(),
            "enforcing cached overrides until a coordinator answers"
        );
        overrides.replace(cached);
    }
    let limiter = Arc::new(Service {
        engine,
        rules: rules.clone(),
        global: global.clone(),
        stop_increment: args.stop_increment_when_over_limit,
        overrides: overrides.clone(),
        region: args.region.clone(),
    });

    let grpc = TcpListener::bind(args.grpc_addr)
        .await
        .with_context(|| format!("binding gRPC on {}", args.grpc_addr))?;
    let http_listener = TcpListener::bind(args.http_addr)
        .await
        .with_context(|| format!("binding HTTP on {}", args.http_addr))?;
    let (grpc_addr, http_addr) = (grpc.local_addr()?, http_listener.local_addr()?);

    // Rules, allocations and demand: stopped after the workers drained, so
    // the last demand report counts every check they finished.
    let mut control = Tasks::new();
    control.spawn("metrics upkeep", crate::telemetry::upkeep(metrics.clone()));
    if let Some(tls) = transport.as_ref().and_then(|t| t.tls()) {
        control.spawn("TLS reload", Arc::clone(tls).watch());
    }
    {
        let service = limiter.clone();
        let on_change = move || service.engine.rules_changed();
        if args.coordinator.is_empty() {
            let watch = rules.clone().watch(args.reload_interval, on_change);
            control.spawn("rule file watch", watch);
        } else {
            let feed = rule_feed::Feed {
                coordinators: args.coordinator.clone(),
                region: args.region.clone(),
                pod: pod.clone(),
                cache: rules_cache.clone(),
                global: global.clone(),
                held: std::sync::Mutex::new(held),
                transport: transport.clone().unwrap_or(crate::tls::Transport::Plain),
                overrides: overrides.clone(),
                overrides_cache: overrides_cache.clone(),
                resets: Arc::new(ResetFeed::new(limiter.clone(), global.clone())),
            };
            control.spawn("coordinator feed", feed.run(rules.clone(), on_change));
        }
    }
    if !args.coordinator.is_empty() {
        let (global, coordinators) = (global.clone(), args.coordinator.clone());
        let transport = transport.clone().unwrap_or(crate::tls::Transport::Plain);
        control.spawn_with_stop("demand reporter", move |stop| {
            global.report_until(coordinators, transport, stop)
        });
    }
    let health = Health::new().await;
    control.spawn(
        "gRPC health probe",
        health.clone().probe(limiter.clone(), rules.clone()),
    );
    // The acceptors; their stop signal is also the workers' cue to drain.
    let mut serving = Tasks::new();
    let drain = serving.stop_signal();
    let http_max = args.http_listener.http_max_connections.max(1);
    let http_slots = Slots::new("http", http_max, serve::PROBE_RESERVE);
    let workers = Workers::start(worker_count, {
        let limiter = limiter.clone();
        let drain = drain.clone();
        let response_headers = args.response_headers;
        let health = health.clone();
        let http_limits = args.http_listener.limits();
        move |worker: Worker| {
            let (limiter, metrics, drain) = (limiter.clone(), metrics.clone(), drain.clone());
            let health = health.server();
            async move {
                crate::store::redis::bind_thread(worker.index);
                if let Err(e) = limiter.engine.open_lane(worker.index).await {
                    // Its checks still go out, through the shared connection,
                    // until the lane opens.
                    tracing::warn!(worker = worker.index, error = %e, retry = ?LANE_RETRY,
                        "cannot open this worker's own Redis connection yet; using the shared one");
                    tokio::spawn(open_lane_later(limiter.clone(), worker.index));
                }
                let grpc = tonic::transport::Server::builder()
                    .add_service(health)
                    .add_service(RateLimitServiceServer::new(RlsService {
                        limiter: limiter.clone(),
                        response_headers,
                    }))
                    .add_service(LimiterServer::new(NativeService {
                        limiter: limiter.clone(),
                    }))
                    .serve_with_incoming_shutdown(worker.grpc.into_stream(), drain.clone().wait());
                let router = http::router(HttpState {
                    limiter,
                    metrics,
                    response_headers,
                });
                let cap = ("--http-max-connections", http_max);
                let http = Arc::new(Server::new("http", router, http_limits, http::PROBES, cap))
                    .serve(worker.http.into_stream(), drain.wait());
                let (grpc, ()) = tokio::join!(grpc, http);
                grpc.context("gRPC server")?;
                Ok(())
            }
        }
    })?;
    let (accept_grpc, accept_http) = workers.acceptors(grpc, http_listener, http_slots);
    serving.spawn("gRPC acceptor", accept_grpc);
    serving.spawn("HTTP acceptor", accept_http);

    let shutdown = crate::shutdown::signal();
    // Tests and scripts read this line to learn the ports.
    println!(
        "meridian limiter: region={} store={:?} grpc={grpc_addr} http={http_addr}",
        args.region, args.store
    );
    tracing::info!(region = %args.region, %grpc_addr, %http_addr, "limiter serving");

    let finished = workers.finished();
    tokio::pin!(finished);
    tokio::select! {
        // Before the drain a worker stops only when it failed (or
        // panicked): so does the service, and dropping the task sets stops
        // the rest.
        result = &mut finished => return result,
        () = shutdown => {}
    }
    tracing::info!("shutting down: draining in-flight requests");
    // Before the listeners close: a gateway watching the health status
    // hears NOT_SERVING on its open stream while requests still drain.
    health.drain().await;
    // New connections are refused (the listeners close) while the workers
    // finish the requests they have.
    serving.shutdown(ACCEPTORS_DEADLINE).await;
    tokio::select! {
        result = finished => result?,
        () = tokio::time::sleep(args.drain_timeout) => {
            tracing::info!(timeout = ?args.drain_timeout, "drain timeout: closing idle connections");
        }
    }
    control.shutdown(CONTROL_DEADLINE).await;
    // Hits admitted on the approximate path and not yet in Redis: hand them
    // over, or the other pods under-count this pod's last batch.
    if let Err(e) = limiter.engine.flush_approximate().await {
        tracing::warn!(error = %e, "approximate path: final flush failed; its hits are lost");
    }
    Ok(())
}

/// The shortest `--report-interval` taken.
const MIN_REPORT_INTERVAL: Duration = Duration::from_millis(100);

/// How often a worker whose Redis connection failed to open tries again.
const LANE_RETRY: Duration = Duration::from_secs(2);

/// Retries a worker's lane on the worker's own runtime until it opens.
async fn open_lane_later(limiter: Arc<Service>, index: usize) {
    loop {
        tokio::time::sleep(LANE_RETRY).await;
        match limiter.engine.open_lane(index).await {
            Ok(()) => {
                tracing::info!(worker = index, "worker's own Redis connection is open");
                return;
            }
            Err(e) => {
                tracing::debug!(worker = index, error = %e, "worker's Redis connection: still failing")
            }
        }
    }
}

/// `--rules-cache`, or one file per region (and `--pod-id`) under
/// `--state-dir`, created 0700: rules name customers and their limits.
fn rules_cache_path(args: &LimiterArgs) -> anyhow::Result<PathBuf> {
    if let Some(path) = &args.rules_cache {
        return Ok(path.clone());
    }
    let dir = &args.state_dir;
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder
        .create(dir)
        .with_context(|| format!("creating --state-dir {}", dir.display()))?;
    // A pod id is free text; the file name keeps what a path may hold.
    let pod = args.pod_id.as_deref().map(|p| {
        let safe: String = p
            .chars()
            .map(|c| match c {
                'a'..='z' | 'A'..='Z' | '0'..='9' | '-' | '_' | '.' => c,
                _ => '_',
            })
            .collect();
        format!("-{safe}")
    });
    Ok(dir.join(format!(
        "rules-cache-{}{}.json",
        args.region,
        pod.unwrap_or_default()
    )))
}

fn default_pod_id() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "pod".into());
    format!("{host}-{}", std::process::id())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: LimiterArgs,
    }

    fn args(flags: &[&str]) -> LimiterArgs {
        use clap::Parser;
        let argv = ["limiter", "--coordinator", "http://127.0.0.1:1"];
        match Cli::try_parse_from(argv.iter().chain(flags)) {
            Ok(cli) => cli.args,
            Err(e) => panic!("{e}"),
        }
    }

    #[test]
    fn two_limiters_started_from_one_directory_keep_one_rules_cache_each() {
        // The audit: two regions on one host shared (and overwrote) one
        // meridian-rules-cache.json in the working directory.
        let dir = tempfile::tempdir().expect("tempdir");
        let state = dir.path().join("state");
        let state = state.to_str().expect("utf-8 path");
        let path = |flags: &[&str]| {
            let mut all = vec!["--state-dir", state];
            all.extend_from_slice(flags);
            rules_cache_path(&args(&all)).expect("path")
        };
        let mumbai = path(&["--region", "mumbai"]);
        let hyderabad = path(&["--region", "hyderabad"]);
        assert_ne!(mumbai, hyderabad);
        assert_eq!(mumbai, dir.path().join("state/rules-cache-mumbai.json"));
        let pod = path(&["--region", "mumbai", "--pod-id", "web-0/x y"]);
        assert_eq!(
            pod,
            dir.path().join("state/rules-cache-mumbai-web-0_x_y.json")
        );
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(dir.path().join("state"))
                .expect("state dir")
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o700, "the state dir is private");
        }
        // A file named by the operator is used as given.
        let named = rules_cache_path(&args(&["--region", "a", "--rules-cache", "/x/c.json"]));
        assert_eq!(named.expect("path"), PathBuf::from("/x/c.json"));
    }
}
