//! HTTP serving within stated bounds, for the coordinator's admin API and
//! the limiter's HTTP port: a cap on connections, a deadline for each
//! request's head and body, an idle timeout, and probes that a flood cannot
//! starve.
//!
//! `axum::serve` keeps a connection as long as the client does: a socket
//! that sends nothing, or half a request head, holds its connection (and a
//! slot of a capped listener) until the client closes it. Here every
//! connection holds a [`Slot`] and is driven by [`connection`]:
//!
//! - its first request head (after the TLS handshake, if any) must arrive
//!   within `header_timeout` of the accept, or the connection is closed;
//! - with no request in flight for `idle_timeout` it is closed (a
//!   keep-alive connection, or one sending its next head slowly);
//! - a request body must arrive within `body_timeout` of its head;
//! - while it has no request in flight it may give its slot to a newcomer
//!   (`crate::slots`: the address holding the most slots gives way first);
//! - when every slot is busy, [`PROBE_RESERVE`] more connections are
//!   admitted that answer only the probe paths (503 for the rest), so
//!   `/healthz` and `/readyz` answer under any flood of the API.
//!
//! The probes are served from reserve slots rather than a port of their
//! own: a liveness probe that hits the port clients use proves that port
//! serves, and the manifests need no second port.

mod conn;
mod tracked;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use futures::{Stream, StreamExt};
use hyper_util::rt::{TokioExecutor, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::slots::{Slot, Slots};

/// Connections admitted past the cap while every slot is busy, to answer
/// probes: a kubelet probes each port a few times a minute, one connection
/// at a time.
pub const PROBE_RESERVE: usize = 8;

/// Largest request head read (HTTP/1 buffer, HTTP/2 header list); a larger
/// one is refused (431). hyper's default buffer is ~400 KiB a connection.
pub const MAX_HEAD_BYTES: usize = 64 * 1024;

/// HTTP/2 pings on a connection this long silent, and the connection closes
/// when one is not answered within [`H2_PING_TIMEOUT`]: a peer gone without
/// a FIN does not hold a stream open (an event stream) for ever.
const H2_PING_INTERVAL: Duration = Duration::from_secs(20);
const H2_PING_TIMEOUT: Duration = Duration::from_secs(10);

/// The time bounds of one listener's connections.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// From accept to the first whole request head, TLS handshake included.
    pub header_timeout: Duration,
    /// With no request in flight, how long a connection stays open.
    pub idle_timeout: Duration,
    /// From a request's head to the end of its body.
    pub body_timeout: Duration,
}

/// One HTTP listener's service and bounds.
pub struct Server {
    /// `listener` label of the metrics.
    name: &'static str,
    router: Router,
    limits: Limits,
    /// Paths a reserve connection answers.
    probes: &'static [&'static str],
    /// The flag that sets the cap, named by the 503 of a reserve connection.
    cap_flag: &'static str,
    max_connections: usize,
    tls: Option<tokio_rustls::TlsAcceptor>,
    builder: auto::Builder<TokioExecutor>,
}

/// An accepted connection and the slot it holds.
pub struct Admitted {
    pub tcp: TcpStream,
    pub peer: SocketAddr,
    pub slot: Slot,
}

impl Server {
    /// `router` served with `limits`; `max_connections` and `cap_flag`
    /// only name the cap in the reserve's 503.
    pub fn new(
        name: &'static str,
        router: Router,
        limits: Limits,
        probes: &'static [&'static str],
        (cap_flag, max_connections): (&'static str, usize),
    ) -> Server {
        let mut builder = auto::Builder::new(TokioExecutor::new());
        // No HTTP/1 timer: hyper's own header timeout would also close
        // keep-alive connections at the head deadline; `connection` times
        // heads and idleness itself.
        builder.http1().max_buf_size(MAX_HEAD_BYTES);
        builder
            .http2()
            .timer(TokioTimer::new())
            .keep_alive_interval(H2_PING_INTERVAL)
            .keep_alive_timeout(H2_PING_TIMEOUT)
            .max_header_list_size(MAX_HEAD_BYTES as u32);
        Server {
            name,
            router,
            limits,
            probes,
            cap_flag,
            max_connections,
            tls: None,
            builder,
        }
    }

    /// Serves HTTPS with `config` (the handshake counts against the head
    /// deadline).
    pub fn with_tls(mut self, config: Option<Arc<rustls::ServerConfig>>) -> Server {
        self.tls = config.map(tokio_rustls::TlsAcceptor::from);
        self
    }

    /// Serves the connections of `incoming` until `stop`; then lets each
    /// finish the requests it has (graceful shutdown) and returns once all
    /// are closed.
    pub async fn serve(
        self: Arc<Self>,
        incoming: impl Stream<Item = Admitted>,
        stop: impl Future<Output = ()>,
    ) {
        let (closing, closed) = watch::channel(false);
        let mut connections = JoinSet::new();
        tokio::pin!(incoming, stop);
        let mut accepting = true;
        loop {
            tokio::select! {
                () = &mut stop => break,
                next = incoming.next(), if accepting => match next {
                    Some(admitted) => {
                        let server = Arc::clone(&self);
                        connections.spawn(conn::connection(server, admitted, closed.clone()));
                    }
                    None => accepting = false,
                },
                Some(_) = connections.join_next(), if !connections.is_empty() => {}
            }
        }
        closing.send_replace(true);
        while connections.join_next().await.is_some() {}
    }
}

/// Accepts the next connection on `listener` that `slots` admits (a
/// connection refused for want of a slot is closed at once).
pub async fn accept(listener: &TcpListener, slots: &Slots) -> Admitted {
    loop {
        let (tcp, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                // EMFILE and the like: wait instead of spinning.
                tracing::warn!(error = %e, "accept failed; retrying in 100 ms");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Some(slot) = slots.admit(peer.ip()) else {
            continue;
        };
        // Small responses must not wait for the client's delayed ACK.
        let _ = tcp.set_nodelay(true);
        return Admitted { tcp, peer, slot };
    }
}

/// [`accept`] as a stream, for [`Server::serve`] on the listener's own runtime.
pub fn incoming(listener: TcpListener, slots: Slots) -> impl Stream<Item = Admitted> {
    futures::stream::unfold((listener, slots), |(listener, slots)| async move {
        let admitted = accept(&listener, &slots).await;
        Some((admitted, (listener, slots)))
    })
}
