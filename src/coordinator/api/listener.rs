//! The admin API's listener: at most `--admin-max-connections` connections
//! open at once, HTTPS with the node's certificate when TLS is on. A
//! connection holds a permit from accept until it closes; with none left,
//! the next accept waits, so further clients queue in the kernel's backlog
//! instead of each costing a task and buffers here.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::extract::connect_info::Connected;
use axum::serve::{IncomingStream, Listener};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};

use crate::tls::{Accepted, MaybeTls};

/// A TCP listener that caps open connections, serving HTTPS when given a
/// TLS configuration. Handshakes run off the accept path (see
/// `crate::tls::accept_loop`), so one stalled client delays nobody.
pub struct CappedListener {
    accepted: mpsc::Receiver<Accepted>,
    local: SocketAddr,
}

impl CappedListener {
    /// `max_connections` at once (at least 1).
    pub fn new(
        inner: TcpListener,
        max_connections: usize,
        tls: Option<Arc<rustls::ServerConfig>>,
    ) -> CappedListener {
        let permits = max_connections.clamp(1, Semaphore::MAX_PERMITS);
        let local = inner
            .local_addr()
            .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)));
        CappedListener {
            accepted: crate::tls::accept_loop(inner, tls, Some(Arc::new(Semaphore::new(permits)))),
            local,
        }
    }
}

impl Listener for CappedListener {
    type Io = CappedStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (CappedStream, SocketAddr) {
        match self.accepted.recv().await {
            Some(a) => (
                CappedStream {
                    stream: a.stream,
                    _permit: a.permit,
                },
                a.peer.addr,
            ),
            // The accept loop ends only when this receiver is dropped.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.local)
    }
}

/// A connection and the permit it holds until it is dropped.
pub struct CappedStream {
    stream: MaybeTls<TcpStream>,
    _permit: Option<OwnedSemaphorePermit>,
}

impl AsyncRead for CappedStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for CappedStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

/// The client's address, for logs of refused requests.
#[derive(Debug, Clone, Copy)]
pub struct Peer(pub SocketAddr);

impl Connected<IncomingStream<'_, CappedListener>> for Peer {
    fn connect_info(stream: IncomingStream<'_, CappedListener>) -> Peer {
        Peer(*stream.remote_addr())
    }
}
