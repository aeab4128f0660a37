//! The admin API's listener: at most `--admin-max-connections` connections,
//! each given `--admin-header-timeout` for its TLS handshake and first
//! request head and closed after `--admin-idle-timeout` without a request,
//! an idle one giving way to a newcomer when all are held, and the probes
//! (`/healthz`, `/readyz`) answered on reserve connections when every slot
//! is busy (`crate::serve`). So neither silent sockets nor a flood of slow
//! API requests keep the liveness probe of the StatefulSet, which uses this
//! port, from its answer.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use tokio::net::TcpListener;

use crate::serve::{self, Limits, Server};
use crate::slots::Slots;

/// What a reserve connection answers: the probes.
const PROBES: &[&str] = &["/healthz", "/readyz"];

/// `--admin-*` listener options of `meridian coordinator`.
#[derive(clap::Args, Debug, Clone)]
pub struct AdminListenerArgs {
    /// Most connections the admin API holds at once. When all are held, an
    /// idle one (no request in flight) is closed for the newcomer, from the
    /// address holding the most; when all are busy, /healthz and /readyz
    /// are still answered on a few reserve connections and other requests
    /// get 503.
    #[arg(long, default_value_t = 256)]
    pub admin_max_connections: usize,
    /// How long a connection gets for its TLS handshake and first request
    /// head; one that has not sent them is closed.
    #[arg(long, default_value = "5s", value_parser = crate::rules::parse_duration)]
    pub admin_header_timeout: Duration,
    /// How long a connection stays open with no request in flight.
    #[arg(long, default_value = "30s", value_parser = crate::rules::parse_duration)]
    pub admin_idle_timeout: Duration,
}

/// Serves `router` on `listener` (HTTPS with `tls`) until `stop`, then
/// closes every connection gracefully.
pub async fn serve_admin(
    listener: TcpListener,
    router: Router,
    args: AdminListenerArgs,
    tls: Option<Arc<rustls::ServerConfig>>,
    stop: impl Future<Output = ()>,
) {
    let max = args.admin_max_connections.max(1);
    let limits = Limits {
        header_timeout: args.admin_header_timeout,
        idle_timeout: args.admin_idle_timeout,
        body_timeout: super::auth::BODY_DEADLINE,
    };
    let server = Server::new(
        "admin",
        router,
        limits,
        PROBES,
        ("--admin-max-connections", max),
    )
    .with_tls(tls);
    let slots = Slots::new("admin", max, serve::PROBE_RESERVE);
    Arc::new(server)
        .serve(serve::incoming(listener, slots), stop)
        .await;
}
