//! The control plane's transport: mutual TLS between coordinators (Raft,
//! forwarded writes and reports) and from limiters to coordinators (Watch,
//! Report), or plaintext with `--insecure` on loopback only.
//!
//! Every process holds one certificate from the operator's CA, naming it
//! with a SAN URI ([`Identity`]): `meridian://node/ID` for a coordinator,
//! `meridian://region/NAME` for a region's limiters. A server takes the
//! caller's identity from the certificate the handshake verified
//! ([`PeerInfo`]), never from the message. The files are polled and
//! reloaded when they change ([`Tls::watch`]); connections already open keep
//! the certificate they were made with, new ones get the new one, so a
//! rotation drops no stream and no Raft leader.

pub mod certs;
pub mod identity;
mod incoming;
mod reload;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::ServerName;
use tonic::transport::{Channel, Endpoint, Uri};

pub use self::identity::Identity;
pub use self::incoming::{MaybeTls, incoming, peer};
pub use self::reload::Tls;

/// How long a TLS handshake may take before the connection is dropped, so
/// a client that opens a socket and says nothing holds no slot for long.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Handshakes in progress at once on one listener; the next connection then
/// takes the place of the oldest pending handshake of the address with the
/// most of them. Only holders of a certificate from the CA get past a
/// handshake, so this bounds what anyone else can make a node hold.
pub const MAX_HANDSHAKES: usize = 256;
/// How often the certificate, key and CA files are checked for changes.
pub const RELOAD_POLL: Duration = Duration::from_secs(1);

/// Makes ring the process's rustls crypto provider. Every config built
/// here names its provider, but reqwest's plain-HTTP clients ask rustls
/// for the process default; without one they panic on build.
pub fn install_crypto_provider() {
    // Err only when one is installed already, which is as good.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// `--tls-*` / `--insecure`, shared by `meridian coordinator` and
/// `meridian limiter`.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct TlsArgs {
    /// PEM certificate (chain, leaf first) naming this process by a SAN URI:
    /// meridian://node/ID for a coordinator, meridian://region/NAME for a
    /// limiter (`meridian certs issue` makes one). Reloaded when it changes.
    #[arg(long, value_name = "PATH", requires_all = ["tls_key", "tls_ca"])]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert (chmod 600). Reloaded when it changes.
    #[arg(long, value_name = "PATH", requires_all = ["tls_cert", "tls_ca"])]
    pub tls_key: Option<PathBuf>,
    /// PEM CA certificate(s) peers' certificates must chain to. Reloaded
    /// when it changes (put old and new CA in it while rotating the CA).
    #[arg(long, value_name = "PATH", requires_all = ["tls_cert", "tls_key"])]
    pub tls_ca: Option<PathBuf>,
    /// Plaintext control plane with no peer authentication: anyone who
    /// reaches the port can speak as any node or region. Refused unless
    /// every address involved is loopback; for development only.
    #[arg(long, conflicts_with_all = ["tls_cert", "tls_key", "tls_ca"])]
    pub insecure: bool,
}

/// What a client expects the server's certificate to name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// Any coordinator node (a limiter dialling `--coordinator`).
    AnyNode,
    /// This node: a Raft peer or the leader a write is forwarded to.
    Node(u64),
}

impl Expect {
    fn admits(self, identity: &Identity) -> bool {
        match (self, identity) {
            (Expect::AnyNode, Identity::Node(_)) => true,
            (Expect::Node(want), Identity::Node(got)) => want == *got,
            _ => false,
        }
    }
}

/// The control plane's transport, chosen once from [`TlsArgs`].
#[derive(Clone)]
pub enum Transport {
    /// `--insecure`: plaintext, loopback only.
    Plain,
    /// Mutual TLS with reloadable files.
    Tls(Arc<Tls>),
}

impl std::fmt::Debug for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Transport::Plain => "Transport::Plain",
            Transport::Tls(_) => "Transport::Tls",
        })
    }
}

impl Transport {
    /// Loads the files for `me`, or checks that plaintext is allowed: with
    /// `--insecure` and every address in `addrs` loopback. Errors name the
    /// flag and the value at fault.
    pub fn from_args(
        args: &TlsArgs,
        me: Identity,
        addrs: &[(&str, String)],
    ) -> Result<Transport, String> {
        match (&args.tls_cert, &args.tls_key, &args.tls_ca) {
            (Some(cert), Some(key), Some(ca)) => {
                let tls = Tls::load(
                    reload::Files {
                        cert: cert.clone(),
                        key: key.clone(),
                        ca: ca.clone(),
                    },
                    me,
                )?;
                for (flag, url) in addrs {
                    if url.starts_with("http://") {
                        return Err(format!(
                            "{flag} {url}: http:// is plaintext, but TLS is configured; use https://"
                        ));
                    }
                }
                Ok(Transport::Tls(tls))
            }
            _ if args.insecure => {
                for (flag, addr) in addrs {
                    if addr.starts_with("https://") {
                        return Err(format!(
                            "{flag} {addr}: https:// needs TLS, but --insecure is given; \
                             give --tls-cert, --tls-key and --tls-ca, or use http://"
                        ));
                    }
                    if !is_loopback(addr) {
                        return Err(format!(
                            "{flag} {addr}: --insecure sends the control plane in plaintext and \
                             lets anyone speak as any node or region, so it is allowed on \
                             loopback only; give --tls-cert, --tls-key and --tls-ca \
                             (`meridian certs --help` makes them)"
                        ));
                    }
                }
                Ok(Transport::Plain)
            }
            _ => Err(
                "the control plane needs TLS: give --tls-cert, --tls-key and --tls-ca \
                      (`meridian certs --help` makes a CA and certificates), or --insecure \
                      for a development setup on loopback"
                    .to_string(),
            ),
        }
    }

    /// `http` or `https`, for the URLs this process builds from addresses.
    pub fn scheme(&self) -> &'static str {
        match self {
            Transport::Plain => "http",
            Transport::Tls(_) => "https",
        }
    }

    /// `scheme://addr`.
    pub fn url(&self, addr: &str) -> String {
        format!("{}://{addr}", self.scheme())
    }

    /// The reloadable TLS state, when there is one.
    pub fn tls(&self) -> Option<&Arc<Tls>> {
        match self {
            Transport::Plain => None,
            Transport::Tls(tls) => Some(tls),
        }
    }

    /// A lazily connecting gRPC channel to `url`, whose server must be
    /// `expect`. The endpoint's settings (timeouts) come from `configure`.
    pub fn channel(
        &self,
        url: &str,
        expect: Expect,
        configure: impl FnOnce(Endpoint) -> Endpoint,
    ) -> Result<Channel, String> {
        let endpoint = Endpoint::from_shared(url.to_string())
            .map_err(|e| format!("{url}: not a URL ({e})"))?;
        let endpoint = configure(endpoint.tcp_nodelay(true));
        match self {
            Transport::Plain => {
                if url.starts_with("https://") {
                    return Err(format!(
                        "{url}: https:// needs TLS, but --insecure is given"
                    ));
                }
                Ok(endpoint.connect_lazy())
            }
            Transport::Tls(tls) => {
                if !url.starts_with("https://") {
                    return Err(format!(
                        "{url}: TLS is configured, so the URL must be https://"
                    ));
                }
                let config = tls.client_config(expect)?;
                Ok(endpoint.connect_with_connector_lazy(connector(config)))
            }
        }
    }

    /// The HTTP client nodes use between them (forwarded writes and reads,
    /// joins): it trusts the CA and presents this node's certificate.
    pub fn http_client(
        &self,
        builder: reqwest::ClientBuilder,
    ) -> Result<reqwest::ClientBuilder, String> {
        match self {
            Transport::Plain => Ok(builder),
            Transport::Tls(tls) => {
                let mut config = (*tls.client_config(Expect::AnyNode)?).clone();
                config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
                Ok(builder.use_preconfigured_tls(config))
            }
        }
    }
}

/// A client configuration trusting the CA certificates in `ca_pem` and
/// presenting none: for clients of the admin API (the demo, `curl`-like
/// tools), which authenticate with the admin token.
pub fn trusting(ca_pem: &[u8]) -> Result<rustls::ClientConfig, String> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem) {
        roots
            .add(cert.map_err(|e| format!("CA PEM: {e}"))?)
            .map_err(|e| format!("CA certificate: {e}"))?;
    }
    let mut config = rustls::ClientConfig::builder_with_provider(reload::provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS client settings: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}

/// Whether `addr` (`host:port` or a URL) names a loopback host.
pub fn is_loopback(addr: &str) -> bool {
    let rest = addr.split_once("://").map_or(addr, |(_, r)| r);
    let authority = rest.split('/').next().unwrap_or(rest);
    if let Ok(sock) = authority.parse::<SocketAddr>() {
        return sock.ip().is_loopback();
    }
    let host = match authority.rsplit_once(':') {
        Some((h, port)) if port.chars().all(|c| c.is_ascii_digit()) => h,
        _ => authority,
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Dials TCP and runs the TLS handshake, for tonic's channel.
fn connector(
    config: Arc<rustls::ClientConfig>,
) -> impl tower::Service<
    Uri,
    Response = hyper_util::rt::TokioIo<tokio_rustls::client::TlsStream<tokio::net::TcpStream>>,
    Error = std::io::Error,
    Future = impl Send,
> + Clone
+ Send
+ 'static {
    tower::service_fn(move |uri: Uri| {
        let connector = tokio_rustls::TlsConnector::from(Arc::clone(&config));
        async move {
            let invalid = |why: String| std::io::Error::new(std::io::ErrorKind::InvalidInput, why);
            let host = uri
                .host()
                .ok_or_else(|| invalid(format!("{uri}: no host")))?
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_string();
            let port = uri.port_u16().unwrap_or(443);
            let name = ServerName::try_from(host.clone())
                .map_err(|e| invalid(format!("{host}: not a server name ({e})")))?;
            let tcp = tokio::net::TcpStream::connect((host.as_str(), port)).await?;
            tcp.set_nodelay(true)?;
            let tls = connector.connect(name, tcp).await?;
            Ok(hyper_util::rt::TokioIo::new(tls))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_addresses_and_urls() {
        for yes in [
            "127.0.0.1:7000",
            "http://127.0.0.1:7000",
            "http://localhost:7000/x",
            "[::1]:7000",
            "http://[::1]:80",
            "127.0.0.2:1",
        ] {
            assert!(is_loopback(yes), "{yes}");
        }
        for no in [
            "10.0.0.1:7000",
            "http://0.0.0.0:7000",
            "http://example.com:7000",
            "http://localhost.example.com",
            "[::]:1",
        ] {
            assert!(!is_loopback(no), "{no}");
        }
    }

    #[test]
    fn plaintext_needs_insecure_and_loopback() {
        let none = TlsArgs::default();
        let me = || Identity::Node(1);
        let local = [("--raft-addr", "127.0.0.1:7000".to_string())];
        assert!(Transport::from_args(&none, me(), &local).is_err());
        let insecure = TlsArgs {
            insecure: true,
            ..TlsArgs::default()
        };
        assert!(matches!(
            Transport::from_args(&insecure, me(), &local),
            Ok(Transport::Plain)
        ));
        let remote = [("--raft-addr", "0.0.0.0:7000".to_string())];
        let err = Transport::from_args(&insecure, me(), &remote).unwrap_err();
        assert!(err.contains("--raft-addr 0.0.0.0:7000"), "{err}");
        let https = [("--coordinator", "https://127.0.0.1:7000".to_string())];
        assert!(Transport::from_args(&insecure, me(), &https).is_err());
    }
}
