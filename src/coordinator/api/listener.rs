//! The admin API's listener: at most `--admin-max-connections` connections
//! open at once. A connection holds a permit from accept until it closes;
//! with none left, the next accept waits, so further clients queue in the
//! kernel's backlog instead of each costing a task and buffers here.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::extract::connect_info::Connected;
use axum::serve::{IncomingStream, Listener};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// A TCP listener that caps open connections.
pub struct CappedListener {
    inner: TcpListener,
    /// One permit per connection that may be open.
    permits: Arc<Semaphore>,
}

impl CappedListener {
    /// `max_connections` at once (at least 1).
    pub fn new(inner: TcpListener, max_connections: usize) -> CappedListener {
        let permits = max_connections.clamp(1, Semaphore::MAX_PERMITS);
        CappedListener {
            inner,
            permits: Arc::new(Semaphore::new(permits)),
        }
    }
}

impl Listener for CappedListener {
    type Io = CappedStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (CappedStream, SocketAddr) {
        // The semaphore is never closed, so acquiring cannot fail; should it,
        // serving uncapped beats refusing every client.
        let permit = self.permits.clone().acquire_owned().await.ok();
        loop {
            match self.inner.accept().await {
                Ok((stream, peer)) => {
                    let _ = stream.set_nodelay(true);
                    return (
                        CappedStream {
                            stream,
                            _permit: permit,
                        },
                        peer,
                    );
                }
                Err(e) => {
                    // EMFILE and the like: wait instead of spinning.
                    tracing::warn!(error = %e, "admin API: accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
            }
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }
}

/// A connection and the permit it holds until it is dropped.
pub struct CappedStream {
    stream: TcpStream,
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
