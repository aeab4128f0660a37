//! Accepting the control plane's connections, with or without TLS: the
//! handshakes run in their own tasks, each within [`HANDSHAKE_TIMEOUT`], so
//! a client that stalls its handshake delays nobody else's. At most
//! [`MAX_HANDSHAKES`] are pending at once; when that many are, the next
//! connection takes the place of the oldest pending handshake of the
//! address with the most of them (`crate::slots`), so sockets opened and
//! left silent from a few addresses cannot make a limiter's or a peer's
//! handshake wait for a place.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;

use super::{HANDSHAKE_TIMEOUT, Identity, MAX_HANDSHAKES};
use crate::slots::Slots;

/// Who is on the other end of a connection: its address and, over TLS, the
/// identity its verified certificate names.
#[derive(Debug, Clone)]
pub struct PeerInfo {
    pub addr: SocketAddr,
    /// `None` on a plaintext (`--insecure`) connection.
    pub identity: Option<Identity>,
}

/// A server-side stream, plaintext or TLS.
pub enum MaybeTls<S> {
    Plain(S),
    Tls(Box<tokio_rustls::server::TlsStream<S>>),
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for MaybeTls<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            MaybeTls::Plain(s) => Pin::new(s).poll_read(cx, buf),
            MaybeTls::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for MaybeTls<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            MaybeTls::Plain(s) => Pin::new(s).poll_write(cx, buf),
            MaybeTls::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            MaybeTls::Plain(s) => Pin::new(s).poll_flush(cx),
            MaybeTls::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            MaybeTls::Plain(s) => Pin::new(s).poll_shutdown(cx),
            MaybeTls::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            MaybeTls::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            MaybeTls::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            MaybeTls::Plain(s) => s.is_write_vectored(),
            MaybeTls::Tls(s) => s.is_write_vectored(),
        }
    }
}

/// One accepted connection and its peer.
pub struct Accepted {
    pub stream: MaybeTls<TcpStream>,
    pub peer: PeerInfo,
}

/// Accepts on `listener` until the receiver is dropped. With `tls`, each
/// connection's handshake runs in its own task, holding a place among the
/// [`MAX_HANDSHAKES`] pending ones until it ends.
fn accept_loop(
    listener: TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
) -> mpsc::Receiver<Accepted> {
    let (tx, rx) = mpsc::channel(64);
    let handshakes = Slots::new("raft_handshakes", MAX_HANDSHAKES, 0);
    let acceptor = tls.map(TlsAcceptor::from);
    tokio::spawn(async move {
        loop {
            let (tcp, addr) = tokio::select! {
                () = tx.closed() => return,
                accepted = listener.accept() => match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        // EMFILE and the like: wait instead of spinning.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                        continue;
                    }
                },
            };
            let _ = tcp.set_nodelay(true);
            let Some(acceptor) = acceptor.clone() else {
                let peer = PeerInfo {
                    addr,
                    identity: None,
                };
                let accepted = Accepted {
                    stream: MaybeTls::Plain(tcp),
                    peer,
                };
                if tx.send(accepted).await.is_err() {
                    return;
                }
                continue;
            };
            // Every pending handshake is idle to the table, so one always
            // gives way when all places are taken.
            let Some(slot) = handshakes.admit(addr.ip()) else {
                continue;
            };
            let tx = tx.clone();
            tokio::spawn(async move {
                let handshake = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp));
                let done = tokio::select! {
                    done = handshake => done,
                    () = slot.evicted() => {
                        tracing::debug!(%addr, "TLS handshake dropped for a newer connection");
                        return;
                    }
                };
                drop(slot);
                let tls = match done {
                    Ok(Ok(tls)) => tls,
                    Ok(Err(e)) => {
                        metrics::counter!("meridian_tls_handshake_failures_total").increment(1);
                        tracing::debug!(%addr, error = %e, "TLS handshake failed");
                        return;
                    }
                    Err(_) => {
                        metrics::counter!("meridian_tls_handshake_failures_total").increment(1);
                        tracing::debug!(%addr, "TLS handshake timed out");
                        return;
                    }
                };
                // The verifier already required a certificate naming a
                // holder when one is asked for; without client auth (the
                // admin API) there is none.
                let identity = tls
                    .get_ref()
                    .1
                    .peer_certificates()
                    .and_then(|certs| certs.first())
                    .and_then(|leaf| super::reload::describe(leaf).ok())
                    .map(|(identity, _)| identity);
                let peer = PeerInfo { addr, identity };
                let accepted = Accepted {
                    stream: MaybeTls::Tls(Box::new(tls)),
                    peer,
                };
                let _ = tx.send(accepted).await;
            });
        }
    });
    rx
}

/// A connection for tonic, which puts its [`PeerInfo`] in every request's
/// extensions.
pub struct Conn(Accepted);

impl tonic::transport::server::Connected for Conn {
    type ConnectInfo = PeerInfo;

    fn connect_info(&self) -> PeerInfo {
        self.0.peer.clone()
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().0.stream).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0.stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().0.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.stream.is_write_vectored()
    }
}

/// The gRPC server's connections on `listener`.
pub fn incoming(
    listener: TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
) -> impl Stream<Item = Result<Conn, io::Error>> {
    use tokio_stream::StreamExt;
    ReceiverStream::new(accept_loop(listener, tls)).map(|a| Ok(Conn(a)))
}

/// The peer of a gRPC request served from [`incoming`].
pub fn peer<T>(request: &tonic::Request<T>) -> Option<&PeerInfo> {
    request.extensions().get::<PeerInfo>()
}
