//! One connection's life: the TLS handshake and the first request head
//! within the head deadline, closed once idle for the idle timeout or when
//! another connection takes its slot, gracefully when the server stops.

use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use tokio::sync::watch;
use tokio::time::Instant;

use super::tracked::Tracked;
use super::{Admitted, Server};
use crate::slots::Kind;
use crate::tls::MaybeTls;

/// After an idle connection is told to close, how long it may take to do
/// so (HTTP/2 sends GOAWAY; an HTTP/1 connection halfway through its next
/// head is cut).
const CLOSE_GRACE: Duration = Duration::from_secs(1);

/// Counts a connection closed by the server for `reason`.
fn closed(server: &Server, reason: &'static str) {
    metrics::counter!(
        "meridian_http_connections_closed_total",
        "listener" => server.name,
        "reason" => reason
    )
    .increment(1);
}

pub(super) async fn connection(
    server: Arc<Server>,
    admitted: Admitted,
    mut stopping: watch::Receiver<bool>,
) {
    let Admitted { tcp, peer, slot } = admitted;
    let head_deadline = Instant::now() + server.limits.header_timeout;
    let io = match &server.tls {
        None => MaybeTls::Plain(tcp),
        Some(acceptor) => {
            let handshake = tokio::time::timeout_at(head_deadline, acceptor.accept(tcp));
            tokio::select! {
                done = handshake => match done {
                    Ok(Ok(tls)) => MaybeTls::Tls(Box::new(tls)),
                    Ok(Err(e)) => {
                        metrics::counter!("meridian_tls_handshake_failures_total").increment(1);
                        tracing::debug!(%peer, error = %e, "TLS handshake failed");
                        return;
                    }
                    Err(_) => {
                        closed(&server, "header_timeout");
                        return;
                    }
                },
                () = slot.evicted() => {
                    closed(&server, "evicted");
                    return;
                }
                _ = stopping.wait_for(|s| *s) => return,
            }
        }
    };
    let service = Tracked {
        router: server.router.clone(),
        activity: slot.activity(),
        peer,
        probes_only: (slot.kind() == Kind::Reserve).then_some(super::tracked::ProbesOnly {
            probes: server.probes,
            cap_flag: server.cap_flag,
            max_connections: server.max_connections,
        }),
        body_timeout: server.limits.body_timeout,
    };
    let conn = server
        .builder
        .serve_connection(TokioIo::new(io), TowerToHyperService::new(service));
    tokio::pin!(conn);
    // Set once the connection was told to close: when it must be gone.
    let mut cut_at: Option<Instant> = None;
    let mut stopped = false;
    loop {
        let now = Instant::now();
        let wake = if let Some(cut) = cut_at {
            cut
        } else if slot.in_flight() > 0 {
            // Busy: woken by `went_idle` when it goes idle.
            now + server.limits.idle_timeout
        } else if !slot.has_begun() {
            head_deadline
        } else {
            now + server.limits.idle_timeout.saturating_sub(slot.idle_for())
        };
        tokio::select! {
            done = conn.as_mut() => {
                if let Err(e) = done {
                    tracing::debug!(%peer, error = %e, "connection ended");
                }
                return;
            }
            () = tokio::time::sleep_until(wake) => {
                if cut_at.is_some() {
                    return;
                }
                if slot.in_flight() > 0 {
                    continue;
                }
                if !slot.has_begun() {
                    if Instant::now() >= head_deadline {
                        closed(&server, "header_timeout");
                        return;
                    }
                } else if slot.idle_for() >= server.limits.idle_timeout {
                    closed(&server, "idle_timeout");
                    conn.as_mut().graceful_shutdown();
                    cut_at = Some(Instant::now() + CLOSE_GRACE);
                }
            }
            () = slot.went_idle() => {}
            () = slot.evicted(), if cut_at.is_none() => {
                closed(&server, "evicted");
                if slot.in_flight() == 0 {
                    return;
                }
                // Chosen while idle, busy since: its request may finish.
                conn.as_mut().graceful_shutdown();
                cut_at = Some(Instant::now() + server.limits.header_timeout);
            }
            _ = stopping.wait_for(|s| *s), if !stopped => {
                // The server's own deadline bounds this wait.
                stopped = true;
                conn.as_mut().graceful_shutdown();
            }
        }
    }
}
