//! The coordinator: a Raft cluster (openraft, redb on disk, tonic between
//! nodes) holding versioned rule sets and the regions registry, and the
//! `Coordinator` gRPC service limiters watch: the replicated core. The admin
//! HTTP API, the dashboard and its live stream read and drive it from
//! [`cockpit`](crate::cockpit), which imports this core and is never imported
//! by it, but for [`run`].
//!
//! Listeners: `--raft-addr` serves gRPC (the `Raft` service for peers and the
//! `Coordinator` service for limiters); `--http-addr` serves the admin API,
//! `/healthz` and `/metrics`.
//!
//! [`run`] starts a node in named steps, below, and is the one place the core
//! and the cockpit are wired together; the flags and their checks are in
//! [`args`].

pub mod allocator;
pub mod args;
pub mod drill;
pub mod freshness;
pub mod grpc;
pub mod hits;
pub mod ledger;
pub mod node;
pub mod raft;
pub mod report_bounds;
pub mod resets;
pub mod state;
pub mod validation;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use metrics_exporter_prometheus::PrometheusHandle;
use openraft::{Config, ServerState};
use tokio::net::TcpListener;

use self::allocator::Allocator;
pub use self::args::CoordinatorArgs;
use self::grpc::CoordinatorService;
use self::node::Node;
use self::raft::client::Network;
use self::raft::contact::LeaderContact;
use self::raft::service::RaftService;
use self::raft::{Member, NodeId, Raft};
use crate::allocation::leader::LeaderConfig;
use crate::cockpit::api::{self, Api};
use crate::cockpit::live::Live;
use crate::tasks::Tasks;
use crate::tls::Transport;

/// How long the servers get after SIGTERM to finish what they have in
/// flight; tasks still running then are aborted.
const SHUTDOWN_DEADLINE: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("configuration: {0}")]
    Config(String),
    /// The source is printed as the cause (`main` prints the chain), so the
    /// message names it once.
    #[error("data dir {dir}")]
    Storage {
        dir: PathBuf,
        source: raft::storage::DiskError,
    },
    #[error("listening on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("raft: {0}")]
    Raft(String),
}

/// What the flags say, checked before anything starts: a wrong flag stops
/// the node before it opens its data dir or binds a port.
struct Settings {
    admin_token: String,
    read_token: Option<String>,
    /// The members `--init` bootstraps.
    init: Option<BTreeMap<NodeId, Member>>,
    transport: Transport,
    raft: Arc<Config>,
    allocator: LeaderConfig,
    /// The report interval limiters are told on the watch stream.
    report_interval_ms: u64,
}

/// Runs a coordinator node until SIGTERM / Ctrl-C.
pub async fn run(args: CoordinatorArgs) -> Result<(), RunError> {
    // Registered now: a SIGTERM during start-up must stop the node cleanly
    // once it is up, not kill it.
    let terminated = crate::shutdown::signal();
    let mut settings = check_flags(&args)?;
    let prometheus = crate::telemetry::metrics_for("coordinator", &[]);
    let node = start_node(&args, &settings).await?;
    let allocator = Allocator::new(
        Arc::clone(&node),
        settings.allocator.clone(),
        args.auto_register_regions,
    );
    let grpc_listener = bind(args.raft_addr).await?;
    let http_listener = bind(args.http_addr).await?;
    let mut tasks = Tasks::new();
    let (grpc_tls, http_tls) = server_tls(&settings.transport)?;
    if let Some(tls) = settings.transport.tls() {
        tasks.spawn("TLS reload", Arc::clone(tls).watch());
    }
    serve_grpc(
        &mut tasks,
        &args,
        &settings,
        &node,
        &allocator,
        grpc_listener,
        grpc_tls,
    );
    let live = Live::new(args.history_samples);
    let api = Api {
        node: Arc::clone(&node),
        allocator: Arc::clone(&allocator),
        live: Arc::clone(&live),
        prometheus: prometheus.clone(),
        shared_rule_floor: args.shared_rule_floor,
        read_token: settings.read_token.clone(),
        diffs: Arc::default(),
    };
    serve_admin(&mut tasks, &args, api, http_listener, http_tls);
    tracing::info!(
        id = args.id,
        raft = %args.raft_addr,
        http = %args.http_addr,
        tls = settings.transport.tls().is_some(),
        "coordinator listening"
    );
    if let Some(peers) = settings.init.take() {
        bootstrap(&node.raft, peers).await?;
    }
    spawn_loops(
        &mut tasks, &args, &settings, &node, &allocator, &live, prometheus,
    );
    run_until_stopped(tasks, node.raft.clone(), terminated).await
}

/// Checks every flag and reads the tokens.
fn check_flags(args: &CoordinatorArgs) -> Result<Settings, RunError> {
    let admin_token = args.admin_token().map_err(RunError::Config)?;
    let read_token = args.read_token().map_err(RunError::Config)?;
    let init = args.init_peers().map_err(RunError::Config)?;
    let transport = args.transport(init.as_ref()).map_err(RunError::Config)?;
    let raft = Arc::new(args.raft_config().map_err(RunError::Config)?);
    let allocator = args.allocator_config().map_err(RunError::Config)?;
    let report_interval_ms =
        crate::allocation::cadence::report_interval_for(allocator.rebalance_interval_ms);
    Ok(Settings {
        admin_token,
        read_token,
        init,
        transport,
        raft,
        allocator,
        report_interval_ms,
    })
}

/// Opens the data dir's store, starts Raft on it and returns the node the
/// servers and loops share.
async fn start_node(args: &CoordinatorArgs, settings: &Settings) -> Result<Arc<Node>, RunError> {
    std::fs::create_dir_all(&args.data_dir).map_err(|e| RunError::Storage {
        dir: args.data_dir.clone(),
        source: raft::storage::DiskError::Redb(redb::Error::Io(e)),
    })?;
    let (log_store, state_machine) =
        raft::storage::open(&args.data_dir).map_err(|source| RunError::Storage {
            dir: args.data_dir.clone(),
            source,
        })?;
    let applied = state_machine.subscribe();
    let committed = log_store.committed_index();
    let network = Network::new(settings.transport.clone());
    let contacts = network.contacts.clone();
    let raft = Raft::new(
        args.id,
        settings.raft.clone(),
        network,
        log_store,
        state_machine,
    )
    .await
    .map_err(|e| RunError::Raft(e.to_string()))?;

    let member = args.advertised().map_err(RunError::Config)?;
    let http = settings
        .transport
        .http_client(reqwest::Client::builder())
        .map_err(RunError::Config)?
        .connect_timeout(Duration::from_secs(1))
        .timeout(Duration::from_secs(90))
        // Drop a pooled connection to a peer before that peer's idle timeout
        // (the same flag, most likely) closes it under a forwarded write.
        .pool_idle_timeout(args.admin_listener.admin_idle_timeout / 2)
        .build()
        .map_err(|e| RunError::Config(format!("HTTP client: {e}")))?;
    Ok(Arc::new(Node {
        id: args.id,
        member,
        raft,
        applied,
        contacts,
        committed,
        admin_token: settings.admin_token.clone(),
        http,
        transport: settings.transport.clone(),
    }))
}

async fn bind(addr: SocketAddr) -> Result<TcpListener, RunError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| RunError::Listen { addr, source })
}

/// A listener's TLS config; `None`: plaintext.
type ServerTls = Option<Arc<rustls::ServerConfig>>;

/// The TLS server configs of the gRPC listener (peers and limiters present
/// certificates) and of the admin listener (browsers and `ctl` need not);
/// `None` without TLS.
fn server_tls(transport: &Transport) -> Result<(ServerTls, ServerTls), RunError> {
    Ok(match transport.tls() {
        Some(tls) => (
            Some(tls.server_config(&[b"h2"]).map_err(RunError::Config)?),
            Some(
                tls.server_config_without_client_auth(&[b"h2", b"http/1.1"])
                    .map_err(RunError::Config)?,
            ),
        ),
        None => (None, None),
    })
}

/// Serves the `Raft` service to peers and the `Coordinator` service to
/// limiters on `--raft-addr`.
fn serve_grpc(
    tasks: &mut Tasks,
    args: &CoordinatorArgs,
    settings: &Settings,
    node: &Arc<Node>,
    allocator: &Arc<Allocator>,
    listener: TcpListener,
    tls: ServerTls,
) {
    // A follower is cut off once silent for the longest election timeout,
    // and behind once it has not applied in the shortest one a commit it was told.
    let leader_contact = LeaderContact::new(
        Duration::from_millis(settings.raft.election_timeout_max),
        Duration::from_millis(settings.raft.election_timeout_min),
    );
    let grpc = tonic::transport::Server::builder()
        .add_service(RaftService::server(
            node.raft.clone(),
            leader_contact.clone(),
        ))
        .add_service(CoordinatorService::server(
            node.applied.clone(),
            Arc::clone(allocator),
            freshness::Freshness {
                raft: node.raft.clone(),
                contact: leader_contact,
                peers: node.contacts.clone(),
            },
            grpc::StreamLimits {
                total: args.max_watch_streams,
                per_client: args.max_watch_streams_per_client,
                message_bytes: args.watch_message_bytes,
            },
            settings.report_interval_ms,
        ));
    tasks.spawn_with_stop("gRPC server", move |stop| async move {
        let incoming = crate::tls::incoming(listener, tls);
        if let Err(e) = grpc
            .serve_with_incoming_shutdown(incoming, stop.wait())
            .await
        {
            tracing::warn!(error = %e, "grpc server");
        }
    });
}

/// Serves the admin API, the dashboard, `/healthz` and `/metrics` on
/// `--http-addr`.
fn serve_admin(
    tasks: &mut Tasks,
    args: &CoordinatorArgs,
    api: Api,
    listener: TcpListener,
    tls: ServerTls,
) {
    let live_streams = Arc::clone(&api.live);
    let router = api::router(api);
    let admin_listener = args.admin_listener.clone();
    tasks.spawn_with_stop("admin HTTP server", move |stop| async move {
        // Event streams never end by themselves: end them first.
        let stopping = async move {
            stop.wait().await;
            live_streams.close();
        };
        api::serve_admin(listener, router, admin_listener, tls, stopping).await;
    });
}

/// `--init`: bootstraps the cluster, unless the data dir already holds one.
async fn bootstrap(raft: &Raft, peers: BTreeMap<NodeId, Member>) -> Result<(), RunError> {
    match raft.is_initialized().await {
        Ok(true) => tracing::info!("data dir holds a cluster; --init ignored"),
        Ok(false) => {
            if let Err(e) = raft.initialize(peers).await {
                tracing::warn!(error = %e, "initialize (another node may have done it)");
            }
        }
        Err(e) => return Err(RunError::Raft(e.to_string())),
    }
    Ok(())
}

/// Starts the node's loops: the `--join` request, the allocator, drills, the
/// dashboard's history, the cluster id, and metrics.
fn spawn_loops(
    tasks: &mut Tasks,
    args: &CoordinatorArgs,
    settings: &Settings,
    node: &Arc<Node>,
    allocator: &Arc<Allocator>,
    live: &Arc<Live>,
    prometheus: PrometheusHandle,
) {
    if let Some(url) = args.join.clone() {
        let join = join_cluster(
            node.http.clone(),
            url,
            settings.admin_token.clone(),
            args.id,
            node.member.clone(),
        );
        tasks.spawn("cluster join", join);
    }
    tasks.spawn("allocator", Arc::clone(allocator).run());
    tasks.spawn(
        "drills",
        drill::runner::DrillRunner::new(Arc::clone(node), Arc::clone(allocator)).run(),
    );
    tasks.spawn(
        "dashboard history",
        Arc::clone(live).run(Arc::clone(node), Arc::clone(allocator)),
    );
    tasks.spawn("cluster id", Arc::clone(node).set_cluster_id());
    tasks.spawn(
        "raft metrics",
        watch_metrics(node.raft.clone(), Arc::clone(node)),
    );
    tasks.spawn("metrics upkeep", crate::telemetry::upkeep(prometheus));
}

/// Serves until SIGTERM / Ctrl-C or until Raft stops on its own, then stops
/// Raft and the tasks; `Err` with the reason in the second case.
async fn run_until_stopped(
    tasks: Tasks,
    raft: Raft,
    terminated: impl std::future::Future<Output = ()>,
) -> Result<(), RunError> {
    let failed = tokio::select! {
        () = terminated => None,
        reason = raft_failed(raft.clone()) => Some(reason),
    };
    match &failed {
        None => tracing::info!("shutting down"),
        Some(reason) => tracing::error!(%reason, "raft stopped; shutting down"),
    }
    // The servers stop accepting now, but the limiters' watch streams end
    // only when Raft's state machine does: stop Raft before waiting.
    tasks.signal_stop();
    if let Err(e) = raft.shutdown().await {
        tracing::warn!(error = %e, "raft shutdown");
    }
    tasks.shutdown(SHUTDOWN_DEADLINE).await;
    tracing::info!("stopped");
    match failed {
        None => Ok(()),
        Some(reason) => Err(RunError::Raft(reason)),
    }
}

/// Resolves when the Raft core stops on its own: a storage error, such as a
/// snapshot from a leader in a storage format this build does not know.
/// The node can neither apply nor vote then, so it exits with the reason
/// instead of serving a state that no longer advances.
async fn raft_failed(raft: Raft) -> String {
    let mut rx = raft.metrics();
    loop {
        if let Err(fatal) = &rx.borrow_and_update().running_state {
            return fatal.to_string();
        }
        if rx.changed().await.is_err() {
            return match &rx.borrow().running_state {
                Err(fatal) => fatal.to_string(),
                Ok(()) => "the raft core stopped".to_string(),
            };
        }
    }
}

/// Asks the cluster at `url` to add this node until it answers yes.
async fn join_cluster(http: reqwest::Client, url: String, token: String, id: NodeId, me: Member) {
    let endpoint = format!("{}/api/v1/cluster/nodes", url.trim_end_matches('/'));
    let body =
        serde_json::json!({ "id": id, "raft_addr": me.raft_addr, "http_addr": me.http_addr });
    loop {
        match http
            .post(&endpoint)
            .bearer_auth(&token)
            .json(&body)
            .send()
            .await
        {
            Ok(r) if r.status().is_success() => {
                tracing::info!(%url, "joined the cluster as a voter");
                return;
            }
            Ok(r) => {
                let status = r.status();
                let text = r.text().await.unwrap_or_default();
                tracing::warn!(%url, %status, answer = %text, "join refused; retrying");
            }
            Err(e) => tracing::warn!(%url, error = %e, "join request failed; retrying"),
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Mirrors Raft metrics into Prometheus.
async fn watch_metrics(raft: Raft, node: Arc<Node>) {
    let mut rx = raft.metrics();
    let mut leader = None;
    loop {
        {
            let m = rx.borrow_and_update();
            metrics::gauge!("meridian_coordinator_raft_term").set(m.current_term as f64);
            metrics::gauge!("meridian_coordinator_is_leader").set(
                if m.state == ServerState::Leader {
                    1.0
                } else {
                    0.0
                },
            );
            let last_log = m.last_log_index.unwrap_or(0);
            let applied = m.last_applied.map_or(0, |l| l.index);
            let committed = node.committed.load(std::sync::atomic::Ordering::Relaxed);
            metrics::gauge!("meridian_coordinator_last_log_index").set(last_log as f64);
            metrics::gauge!("meridian_coordinator_commit_index").set(committed as f64);
            metrics::gauge!("meridian_coordinator_applied_index").set(applied as f64);
            metrics::gauge!("meridian_coordinator_commit_apply_lag")
                .set(committed.saturating_sub(applied) as f64);
            if m.current_leader != leader {
                if let Some(new) = m.current_leader {
                    tracing::info!(leader = new, term = m.current_term, "leader changed");
                    metrics::counter!("meridian_coordinator_leader_changes_total").increment(1);
                }
                leader = m.current_leader;
            }
        }
        if rx.changed().await.is_err() {
            return;
        }
    }
}
